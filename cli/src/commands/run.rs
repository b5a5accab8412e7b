//! `kiln run`: run a model on input files.

use crate::exit::{Exit, Failure};
use crate::model_args::ModelArgs;
use crate::tensors::{
    finite_stats, output_file_name, read_inputs, read_output_files, summarize, write_input_files,
};
use anyhow::{Context, Result};
use kiln_ir::Tensor;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,

    /// An input value: NAME=FILE (.npy, or .pb ONNX TensorProto). May be repeated; a bare FILE
    /// is enough for single-input models.
    #[arg(long = "input", short = 'i', value_name = "NAME=FILE")]
    pub inputs: Vec<String>,

    /// Write each output to DIR/<output name>.npy (created if missing).
    #[arg(long, short = 'o', value_name = "DIR")]
    pub output_dir: Option<PathBuf>,

    /// Run the reference interpreter (ir::eval) instead of compiling the model for this
    /// machine and running the compiled code.
    #[arg(long)]
    pub reference: bool,

    /// Threads for the compiled run (default: one per CPU).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,

    /// Print nothing but errors.
    #[arg(long, short = 'q')]
    pub quiet: bool,

    /// Write a JSON report (schema kiln.run/1, docs/report.md): each output's type and value
    /// statistics, where it was written, how long the run took.
    #[arg(long, value_name = "FILE.json")]
    pub report: Option<PathBuf>,
}

#[derive(Serialize)]
struct RunReport {
    schema: &'static str,
    kiln_version: &'static str,
    model: String,
    /// "compiled" or "reference".
    mode: &'static str,
    /// Wall time of the run (the compiled mode includes starting the executable).
    seconds: f64,
    outputs: Vec<OutputReport>,
}

#[derive(Serialize)]
struct OutputReport {
    name: String,
    dtype: String,
    shape: Vec<usize>,
    file: Option<String>,
    min: Option<f64>,
    max: Option<f64>,
    mean: Option<f64>,
    /// NaN and infinite elements.
    non_finite: usize,
}

fn output_report(name: &str, t: &Tensor, file: Option<&Path>) -> OutputReport {
    let v = t.to_f64_vec();
    let stats = finite_stats(&v);
    let non_finite = v.iter().filter(|x| !x.is_finite()).count();
    OutputReport {
        name: name.to_string(),
        dtype: t.dtype().to_string(),
        shape: t.shape().to_vec(),
        file: file.map(|f| f.display().to_string()),
        min: stats.map(|s| s.0),
        max: stats.map(|s| s.1),
        mean: stats.map(|s| s.2),
        non_finite,
    }
}

fn write_report(args: &Args, mode: &'static str, seconds: f64, outputs: Vec<OutputReport>) -> Result<()> {
    if let Some(path) = &args.report {
        let doc = RunReport {
            schema: "kiln.run/1",
            kiln_version: env!("CARGO_PKG_VERSION"),
            model: args.model.model.display().to_string(),
            mode,
            seconds,
            outputs,
        };
        crate::diagnostic::write_json(&doc, path)?;
    }
    Ok(())
}

pub fn run(args: Args) -> Result<()> {
    if let Some(range) = args.model.source().batch_range()? {
        return Err(Failure::new(
            Exit::Usage,
            format!("kiln run takes the inputs' own shapes: give the batch of these inputs (--input-shape NAME=4,...), not the range {range} (ranges are for compile, explain and verify)"),
        )
        .into());
    }
    let model = args.model.load()?;
    if !args.reference {
        return run_compiled(&args, model);
    }
    let inputs = read_inputs(&model.graph, &args.inputs)?;
    let start = Instant::now();
    let outputs = kiln_ir::eval::eval_graph_named(&model.graph, inputs)
        .with_context(|| format!("{}", args.model.model.display()))?;
    let elapsed = start.elapsed();
    if let Some(dir) = &args.output_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let mut reports = Vec::new();
    for (out, t) in model.graph.outputs().iter().zip(&outputs) {
        let mut file = None;
        if let Some(dir) = &args.output_dir {
            let path = dir.join(output_file_name(&out.name));
            kiln_frontend::npy::write_npy(&path, t)
                .with_context(|| format!("cannot write {}", path.display()))?;
            file = Some(path);
        }
        if !args.quiet {
            crate::emit(&format!("{}: {}\n", out.name, summarize(t)));
        }
        if args.report.is_some() {
            reports.push(output_report(&out.name, t, file.as_deref()));
        }
    }
    write_report(&args, "reference", elapsed.as_secs_f64(), reports)?;
    if !args.quiet {
        let written = match &args.output_dir {
            Some(d) => format!(", outputs written to {}", d.display()),
            None => String::new(),
        };
        eprintln!("reference run took {:.3} s{written}", elapsed.as_secs_f64());
    }
    Ok(())
}

/// Compiles the model for this machine into a temporary executable and runs it on the inputs:
/// the same code `kiln compile` would produce, without keeping the artifact.
fn run_compiled(args: &Args, model: kiln_frontend::Model) -> Result<()> {
    let inputs = read_inputs(&model.graph, &args.inputs)?;
    let mut graph = model.graph;
    let mut session = kiln_driver::Session::new(kiln_driver::Options::host_executable());
    session.optimize(&mut graph)?;
    let dir = tempfile::tempdir().context("cannot create a temporary folder")?;
    let exe = dir.path().join("model");
    session
        .emit(&graph, &exe)
        .with_context(|| format!("{}", args.model.model.display()))?;
    let mut cmd = std::process::Command::new(&exe);
    let values = graph.input_types().map(|(name, _)| &inputs[name]);
    for (name, path) in write_input_files(dir.path(), &graph, values)? {
        cmd.arg("--input").arg(format!("{name}={}", path.display()));
    }
    // The report needs the outputs' values: have them written (to a temporary folder when the
    // user asked for none).
    let out_dir = match (&args.output_dir, &args.report) {
        (Some(d), _) => Some(d.clone()),
        (None, Some(_)) => Some(dir.path().join("outputs")),
        (None, None) => None,
    };
    if let Some(d) = &out_dir {
        cmd.arg("--output-dir").arg(d);
    }
    if let Some(t) = args.threads {
        cmd.arg("--threads").arg(t.to_string());
    }
    if args.quiet {
        cmd.arg("--quiet");
    }
    let start = Instant::now();
    let status = cmd.status().context("cannot run the compiled model")?;
    let seconds = start.elapsed().as_secs_f64();
    if !status.success() {
        // The executable has said what was wrong, with the status kiln itself would give for
        // it (README, "Exit status"): pass usage errors and run failures on.
        let exit = match status.code() {
            Some(c) if c == i32::from(Exit::Usage.code()) => Exit::Usage,
            Some(c) if c == i32::from(Exit::RunFailed.code()) => Exit::RunFailed,
            _ => Exit::Internal,
        };
        return Err(Failure::new(exit, format!("the compiled model failed ({status})")).into());
    }
    if let (Some(d), Some(_)) = (&out_dir, &args.report) {
        let values = read_output_files(d, &graph)?;
        let mut reports = Vec::new();
        for (o, t) in graph.outputs().iter().zip(&values) {
            let path = d.join(output_file_name(&o.name));
            let shown = args.output_dir.is_some().then_some(path.as_path());
            reports.push(output_report(&o.name, t, shown));
        }
        write_report(args, "compiled", seconds, reports)?;
    }
    Ok(())
}
