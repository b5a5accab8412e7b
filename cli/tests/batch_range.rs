//! Batch ranges (`--input-shape x=LO..HI,...`): one compiled artifact runs any batch in the
//! range and matches the reference interpreter at each; the C API runs batches through
//! `NAME_run_shaped` only; models that mix samples, and ranges kiln cannot serve, are refused
//! with messages that say why.

mod common;

use common::*;
use kiln_ir::Tensor;
use std::path::{Path, PathBuf};
use std::process::Output;

fn fixture_model(name: &str) -> PathBuf {
    fixture(name).join("model.onnx")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn compile(model: &Path, shapes: &[&str], extra: &[&str], out: &Path) {
    let mut cmd = kiln();
    cmd.args(["compile", "-q"]).arg(model);
    for s in shapes {
        cmd.args(["--input-shape", s]);
    }
    let o = cmd.args(extra).arg("-o").arg(out).output().unwrap();
    assert!(o.status.success(), "compile failed: {}", stderr(&o));
}

/// A deterministic batch of `n` samples for one input: f32 values, or token ids / a padding
/// mask (sample `s` keeps its first `16 - 3s` tokens) for the BERT export.
fn batch_input(name: &str, n: usize, sample_dims: &[usize]) -> Tensor {
    let per: usize = sample_dims.iter().product();
    let mut shape = vec![n];
    shape.extend_from_slice(sample_dims);
    match name {
        "input_ids" => Tensor::from_vec(
            shape,
            (0..n * per).map(|i| ((i * 37 + 11) % 1000) as i64).collect(),
        ),
        "attention_mask" => Tensor::from_vec(
            shape,
            (0..n * per)
                .map(|i| i64::from(i % per < per - 3 * (i / per)))
                .collect(),
        ),
        _ => Tensor::from_vec(
            shape,
            (0..n * per)
                .map(|i| ((i * 7919 % 2003) as f32 / 1001.5) - 1.0)
                .collect(),
        ),
    }
}

/// The reference interpreter's outputs for these inputs (the model imported at their batch).
fn reference(model: &Path, fixed_shapes: &[String], inputs: &[(String, PathBuf)], out: &Path) {
    let mut cmd = kiln();
    cmd.args(["run", "--reference", "-q"])
        .arg(model)
        .arg("-o")
        .arg(out);
    for s in fixed_shapes {
        cmd.args(["--input-shape", s]);
    }
    for (name, path) in inputs {
        cmd.arg("-i").arg(format!("{name}={}", path.display()));
    }
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "reference run failed: {}", stderr(&o));
}

fn read(path: &Path) -> Tensor {
    kiln_frontend::npy::read_npy(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `got` within 1e-4 + 1e-3·|want| of `want` everywhere, with the same shape.
fn assert_close(got: &Tensor, want: &Tensor, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    for (i, (g, w)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 + 1e-3 * w.abs(),
            "{what}: element {i} is {g}, want {w}"
        );
    }
}

/// An input's name and per-sample dims.
type Input<'a> = (&'a str, &'a [usize]);

/// Compiles fixture `fixture` for batches 1..4 of its inputs (the first input's range binds the
/// others' through their shared 'batch' dim).
fn compile_range(fixture: &str, inputs: &[Input], extra: &[&str], exe: &Path) {
    let (name0, dims0) = inputs[0];
    let rest: String = dims0.iter().map(|d| format!(",{d}")).collect();
    compile(
        &fixture_model(fixture),
        &[&format!("{name0}=1..4{rest}")],
        extra,
        exe,
    );
}

/// Runs `exe` on a batch of `n` samples and, when the run succeeds, checks each output against
/// the reference interpreter on the model imported at batch `n`. The run's output is returned.
fn run_batch(fixture: &str, inputs: &[Input], outputs: &[&str], n: usize, exe: &Path, dir: &Path) -> Output {
    let model = fixture_model(fixture);
    let at = dir.join(format!("{fixture}-{n}"));
    std::fs::create_dir_all(&at).unwrap();
    let mut files = vec![];
    let mut fixed = vec![];
    for &(name, dims) in inputs {
        let path = at.join(format!("{name}.npy"));
        kiln_frontend::npy::write_npy(&path, &batch_input(name, n, dims)).unwrap();
        files.push((name.to_string(), path));
        let rest: String = dims.iter().map(|d| format!(",{d}")).collect();
        fixed.push(format!("{name}={n}{rest}"));
    }
    let mut cmd = std::process::Command::new(exe);
    for (name, path) in &files {
        cmd.arg("-i").arg(format!("{name}={}", path.display()));
    }
    let o = cmd.arg("-q").arg("-o").arg(at.join("got")).output().unwrap();
    if o.status.success() {
        reference(&model, &fixed, &files, &at.join("want"));
        for out in outputs {
            let file = format!("{out}.npy");
            assert_close(
                &read(&at.join("got").join(&file)),
                &read(&at.join("want").join(&file)),
                &format!("{fixture} batch {n} {out}"),
            );
        }
    }
    o
}

/// The CUDA artifact of a batch range matches the reference at every batch on a GPU. Without
/// one the run's "no CUDA device" skips the comparison (`KILN_REQUIRE_GPU=1` makes it a
/// failure); the runtime path is covered without a GPU by `cuda_no_device.rs`'s fake driver.
#[test]
fn the_cuda_artifact_of_a_range_matches_the_reference_on_a_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let inputs: &[Input] = &[("input", &[3, 16, 16])];
    let exe = dir.path().join("dynamic_batch_cuda");
    compile_range("dynamic_batch", inputs, &["--target", "cuda"], &exe);
    for n in [1, 3, 4] {
        let o = run_batch("dynamic_batch", inputs, &["logits", "probs"], n, &exe, dir.path());
        let err = stderr(&o);
        // KILN_REQUIRE_GPU read as the GPU suites read it (tests/src/cuda.rs: set, not "0").
        let required = std::env::var("KILN_REQUIRE_GPU").is_ok_and(|v| !v.is_empty() && v != "0");
        if err.contains("error: no CUDA device") && !required {
            eprintln!("skipped: {}", err.trim());
            return;
        }
        assert!(o.status.success(), "batch {n}: {err}");
    }
}

#[test]
fn one_executable_serves_every_batch_of_a_cnn_and_transformer_exports() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &[Input], &[&str]); 4] = [
        ("dynamic_batch", &[("input", &[3, 16, 16])], &["logits", "probs"]),
        // Sequence-first attention inside: the batch moves to axis 1 and into Gemm rows.
        (
            "torch_transformer_encoder_dynamic_batch_export",
            &[("x", &[16, 64])],
            &["y"],
        ),
        (
            "hf_bert_dynamic_batch_export",
            &[("input_ids", &[16]), ("attention_mask", &[16])],
            &["y"],
        ),
        // The dynamo exporter's causal mask: GatherND by (sample, token) index tuples.
        ("hf_gpt2_dynamic_batch_export", &[("input_ids", &[16])], &["y"]),
    ];
    for (fixture, inputs, outputs) in cases {
        let exe = dir.path().join(fixture);
        compile_range(fixture, inputs, &[], &exe);
        for n in [1, 3, 4] {
            let run = run_batch(fixture, inputs, outputs, n, &exe, dir.path());
            assert!(run.status.success(), "{fixture} at batch {n}: {}", stderr(&run));
        }
    }

    // Outside the range, and batches that disagree: usage errors naming the input.
    let exe = dir.path().join("hf_bert_dynamic_batch_export");
    let write = |name: &str, n: usize| {
        let path = dir.path().join(format!("{name}-{n}.npy"));
        kiln_frontend::npy::write_npy(&path, &batch_input(name, n, &[16])).unwrap();
        path
    };
    let o = std::process::Command::new(&exe)
        .arg("-i")
        .arg(format!("input_ids={}", write("input_ids", 5).display()))
        .arg("-i")
        .arg(format!("attention_mask={}", write("attention_mask", 5).display()))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("input 'input_ids': expected i64[1..4,16], got i64[5,16]"),
        "{}",
        stderr(&o)
    );
    let o = std::process::Command::new(&exe)
        .arg("-i")
        .arg(format!("input_ids={}", write("input_ids", 2).display()))
        .arg("-i")
        .arg(format!("attention_mask={}", write("attention_mask", 3).display()))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("inputs 'input_ids' and 'attention_mask' have different batch sizes (2 and 3)"),
        "{}",
        stderr(&o)
    );
    // --help and --info state the range.
    let help = std::process::Command::new(&exe).arg("--help").output().unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains("input_ids: i64[1..4,16]"));
    let info = std::process::Command::new(&exe).arg("--info").output().unwrap();
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(info["batch"], serde_json::json!({"min": 1, "max": 4}));
    assert_eq!(info["inputs"][1]["batched"], true);
}

/// A C program driving the static library of `dynamic_batch` compiled for 1..4: the plain runs
/// refuse, `run_shaped` takes a batch, reports the outputs' shapes, and gives each sample what
/// a run of that sample alone gives.
const BATCH_C: &str = r#"
#include "dynamic_batch.h"
#include <stdio.h>
#include <string.h>
#define PER (3 * 16 * 16)
static float in[4 * PER], logits[4 * 10], probs[4 * 10], one[10], one_probs[10];
int main(void) {
  for (int i = 0; i < 4 * PER; i++) in[i] = (float)((i * 7919) % 2003) / 1001.5f - 1.0f;
  dynamic_batch_ctx *ctx = dynamic_batch_create(1);
  if (!ctx) return 10;
  const void *ins[1] = {in};
  void *outs[2] = {logits, probs};
  if (dynamic_batch_run_generic(ctx, ins, outs) == 0) return 11;
  if (!strstr(dynamic_batch_last_error(ctx), "takes a batch of 1..4 samples")) return 12;
  int64_t shape[4] = {3, 3, 16, 16}, lshape[2], pshape[2];
  const int64_t *in_shapes[1] = {shape};
  int64_t *out_shapes[2] = {lshape, pshape};
  if (dynamic_batch_run_shaped(ctx, ins, in_shapes, outs, out_shapes) != 0) return 13;
  if (lshape[0] != 3 || lshape[1] != 10 || pshape[0] != 3) return 14;
  for (int s = 0; s < 3; s++) {
    int64_t one_shape[4] = {1, 3, 16, 16};
    const int64_t *one_in_shapes[1] = {one_shape};
    const void *one_ins[1] = {in + s * PER};
    void *one_outs[2] = {one, one_probs};
    if (dynamic_batch_run_shaped(ctx, one_ins, one_in_shapes, one_outs, NULL) != 0) return 15;
    if (memcmp(one, logits + s * 10, sizeof one) != 0) return 16;
  }
  shape[0] = 5;
  if (dynamic_batch_run_shaped(ctx, ins, in_shapes, outs, out_shapes) == 0) return 17;
  if (!strstr(dynamic_batch_last_error(ctx), "not a batch of 1..4 samples")) return 18;
  printf("%s\n", dynamic_batch_last_error(ctx));
  dynamic_batch_destroy(ctx);
  return 0;
}
"#;

#[test]
fn the_static_library_runs_batches_through_run_shaped() {
    let dir = tempfile::tempdir().unwrap();
    compile(
        &fixture_model("dynamic_batch"),
        &["input=1..4,3,16,16"],
        &["--emit", "staticlib"],
        &dir.path().join("dynamic_batch"),
    );
    let lib = dir.path().join("libdynamic_batch.a");
    let src = dir.path().join("main.c");
    std::fs::write(&src, BATCH_C).unwrap();
    let exe = dir.path().join("main");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let o = std::process::Command::new(cc)
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg("-I")
        .arg(dir.path())
        .arg(&src)
        .arg(&lib)
        .args(["-lpthread", "-lm"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let o = std::process::Command::new(&exe).output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        stderr(&o)
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("input 'input' has 5 rows on axis 0"));
    let header = std::fs::read_to_string(dir.path().join("dynamic_batch.h")).unwrap();
    assert!(
        header.contains("f32[1..4,3,16,16]") && header.contains("Batch: this model runs any batch of 1..4")
    );
}

/// `x: f32[batch, 4]` → one `ReduceSum` over `axes` → `y`.
fn reduce_model(dir: &Path, axes: i64) -> PathBuf {
    let mut m = one_node_model("ReduceSum", "sum");
    let g = m.graph.as_mut().unwrap();
    g.node[0].input.push("axes".into());
    g.initializer.push(TensorProto {
        name: "axes".into(),
        dims: vec![1],
        data_type: data_type::INT64,
        int64_data: vec![axes],
        ..Default::default()
    });
    let batch = Dimension {
        value: Some(DimValue::DimParam("batch".into())),
        denotation: String::new(),
    };
    let Some(TypeValue::TensorType(t)) = g.input[0].r#type.as_mut().and_then(|t| t.value.as_mut()) else {
        unreachable!()
    };
    t.shape.as_mut().unwrap().dim[0] = batch;
    g.output.clear();
    g.output.push(ValueInfoProto {
        name: "y".into(),
        ..Default::default()
    });
    write_model(dir, &format!("reduce{axes}.onnx"), &m)
}

use kiln_frontend::onnx::proto::*;

#[test]
fn ranges_kiln_cannot_serve_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| kiln().args(args).output().unwrap();
    let per_row = reduce_model(dir.path(), 1);
    let across = reduce_model(dir.path(), 0);
    let out = dir.path().join("m");
    let out = out.to_str().unwrap();

    // Summing each sample's row is per sample; summing over the batch is not.
    let o = run(&[
        "compile",
        "-q",
        per_row.to_str().unwrap(),
        "--input-shape",
        "x=1..8,4",
        "-o",
        out,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&[
        "compile",
        across.to_str().unwrap(),
        "--input-shape",
        "x=1..8,4",
        "-o",
        out,
    ]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("batch range 1..8")
            && stderr(&o).contains("'sum'")
            && stderr(&o).contains("reduces along the batch (axis 0)"),
        "{}",
        stderr(&o)
    );

    // Without --input-shape the symbolic batch is named, with both ways to fix it.
    let o = run(&["compile", per_row.to_str().unwrap(), "-o", out]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("fix them with --input-shape x=1,4, or give the batch a range to serve several: --input-shape x=1..8,4"),
        "{}",
        stderr(&o)
    );

    let fixed = write_model(dir.path(), "fixed.onnx", &one_node_model("Relu", "relu"));
    for (args, code, msg) in [
        (
            vec![fixed.to_str().unwrap(), "--input-shape", "x=1..8,4"],
            2,
            "first axis is fixed at 1",
        ),
        (
            vec![per_row.to_str().unwrap(), "--input-shape", "x=1,1..4"],
            2,
            "only the first (batch) axis may be a range",
        ),
    ] {
        let mut all = vec!["compile"];
        all.extend(args);
        all.extend(["-o", out]);
        let o = run(&all);
        assert_eq!(o.status.code(), Some(code), "{all:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(msg), "{all:?}: {}", stderr(&o));
    }
    let o = run(&["run", per_row.to_str().unwrap(), "--input-shape", "x=1..8,4"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("give the batch of these inputs"),
        "{}",
        stderr(&o)
    );
}
