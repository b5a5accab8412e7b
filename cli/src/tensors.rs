//! Reading input tensors named on the command line and writing outputs.

use anyhow::{bail, Context, Result};
use kiln_ir::{DType, Dim, Graph, Tensor, TensorType};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Parses `--input NAME=FILE` arguments (a bare `FILE` is accepted when the model has exactly
/// one input) and reads each file (`.npy`, or a serialized ONNX `TensorProto` `.pb`).
pub fn read_inputs(graph: &Graph, specs: &[String]) -> Result<HashMap<String, Tensor>> {
    let names: Vec<&str> = graph.input_types().map(|(n, _)| n).collect();
    let mut out = HashMap::new();
    for spec in specs {
        let (name, file) = match spec.split_once('=') {
            Some((n, f)) if names.contains(&n) => (n.to_string(), PathBuf::from(f)),
            _ if names.len() == 1 && !names.contains(&spec.as_str()) && Path::new(spec).exists() => {
                (names[0].to_string(), PathBuf::from(spec))
            }
            Some((n, _)) => bail!(
                "the model has no input '{n}' (its inputs: {})",
                describe_inputs(graph)
            ),
            None => bail!(
                "--input '{spec}': expected NAME=FILE (the model's inputs: {})",
                describe_inputs(graph)
            ),
        };
        if out.contains_key(&name) {
            bail!("input '{name}' is given twice");
        }
        let t = read_tensor_file(&file).with_context(|| format!("input '{name}'"))?;
        let ty = graph
            .input_types()
            .find(|(n, _)| *n == name)
            .map(|(_, ty)| ty)
            .expect("the name was matched against the graph's inputs");
        let t = check_input(&name, &file, t, ty)?;
        out.insert(name, t);
    }
    let missing: Vec<&str> = names.iter().copied().filter(|n| !out.contains_key(*n)).collect();
    if !missing.is_empty() {
        bail!(
            "missing --input for {} (the model's inputs: {})",
            missing.join(", "),
            describe_inputs(graph)
        );
    }
    Ok(out)
}

/// Checks a value read for input `name` against the model's declaration, before anything is
/// compiled or run, and names the user's file when it does not fit. A bf16 input also takes an
/// f32 file (the executable rounds it the same way), converted here.
fn check_input(name: &str, file: &Path, t: Tensor, ty: &TensorType) -> Result<Tensor> {
    let t = if ty.dtype == DType::BF16 && t.dtype() == DType::F32 {
        t.cast(DType::BF16)
    } else {
        t
    };
    let shape_fits = ty.rank() == t.rank()
        && ty.shape.iter().zip(t.shape()).all(|(d, &n)| match d {
            Dim::Fixed(f) => *f == n,
            Dim::Sym(_) => true,
        });
    if t.dtype() != ty.dtype || !shape_fits {
        bail!(
            "input '{name}' ({}): expected {ty}, got {}",
            file.display(),
            t.tensor_type()
        );
    }
    Ok(t)
}

fn describe_inputs(graph: &Graph) -> String {
    graph
        .input_types()
        .map(|(n, t)| format!("{n}: {t}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub use kiln_driver::read_tensor_file;

pub use kiln_frontend::npy::output_file_name;

/// Writes the graph inputs' values (in graph order) to `DIR/input<i>.npy` for a compiled
/// executable; returns each input's name and file, for `--input NAME=FILE`.
pub fn write_input_files<'a>(
    dir: &Path,
    graph: &Graph,
    values: impl IntoIterator<Item = &'a Tensor>,
) -> Result<Vec<(String, PathBuf)>> {
    graph
        .input_types()
        .zip(values)
        .enumerate()
        .map(|(i, ((name, _), t))| {
            let path = dir.join(format!("input{i}.npy"));
            kiln_frontend::npy::write_npy(&path, t)
                .with_context(|| format!("cannot write {}", path.display()))?;
            Ok((name.to_string(), path))
        })
        .collect()
}

/// Reads the outputs a compiled executable wrote to `DIR/<output name>.npy`, in graph order.
pub fn read_output_files(dir: &Path, graph: &Graph) -> Result<Vec<Tensor>> {
    graph
        .outputs()
        .iter()
        .map(|o| {
            let path = dir.join(output_file_name(&o.name));
            kiln_frontend::npy::read_npy(&path).with_context(|| format!("output '{}'", o.name))
        })
        .collect()
}

/// Minimum, maximum and mean of the finite values; None when there are none.
pub fn finite_stats(v: &[f64]) -> Option<(f64, f64, f64)> {
    let finite: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if finite.is_empty() {
        return None;
    }
    let min = finite.iter().copied().fold(f64::INFINITY, f64::min);
    let max = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((min, max, finite.iter().sum::<f64>() / finite.len() as f64))
}

/// A one-line summary of a tensor's values: type, a few leading values, min/max/mean.
pub fn summarize(t: &Tensor) -> String {
    let v = t.to_f64_vec();
    let shown: Vec<String> = v.iter().take(6).map(|x| format_value(*x)).collect();
    let more = if v.len() > 6 { ", ..." } else { "" };
    let mut s = format!("{} [{}{more}]", t.tensor_type(), shown.join(", "));
    if v.len() > 1 {
        if let Some((min, max, mean)) = finite_stats(&v) {
            s.push_str(&format!(
                "  min {} max {} mean {}",
                format_value(min),
                format_value(max),
                format_value(mean)
            ));
        }
    }
    s
}

fn format_value(x: f64) -> String {
    if x == x.trunc() && x.abs() < 1e15 {
        format!("{x}")
    } else {
        format!("{x:.6}")
    }
}
