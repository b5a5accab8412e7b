//! `--precision bf16`: every fixture model optimized with the bf16 autocast, compiled to an
//! executable, and compared with the f32 reference outputs (onnxruntime, f32).
//!
//! The criteria (cosine similarity ≥ 0.999 and a range-relative error bound per float output,
//! documented exceptions per fixture) are in `tests/src/bf16.rs`; `cuda_gpu.rs` applies the
//! same ones to the GPU's tensor-core kernels.

use kiln_driver::{Cpu, Options, Precision, Session};
use kiln_optimizer::passes::bf16_autocast;
use kiln_tests::bf16::check_bf16_outputs;
use kiln_tests::compiled::{run_executable, WorkDir};
use kiln_tests::fixtures::{check_fixtures, load_manifest, suite_threads, Fixture};

/// What one fixture gave: whether the autocast changed it, and the worst cosine / error.
struct Outcome {
    bf16_ops: usize,
    worst_cos: f64,
    worst_rel: f64,
}

fn check(f: &Fixture) -> anyhow::Result<Outcome> {
    let (mut graph, ordered) = f.prepared()?;
    // As `kiln compile --precision bf16` for the host.
    let mut session = Session::new(Options {
        name: Some(f.name.clone()),
        precision: Precision::Bf16,
        cpu: Cpu::Native,
        ..Options::default()
    });
    session
        .optimize(&mut graph)
        .map_err(|e| anyhow::anyhow!("optimize: {e}"))?;
    let summary = bf16_autocast::summary(&graph);
    let work = WorkDir::new(&format!("bf16-{}", f.name));
    let exe = work.0.join(&f.name);
    let compiled = session
        .emit(&graph, &exe)
        .map_err(|e| anyhow::anyhow!("compile: {e}"))?;
    // On a CPU with avx512_bf16 the attention kernel's products run on vdpbf16ps too, when
    // the autocast rounded Q, K and V.
    let host = kiln_codegen::target::TargetDesc::select(None, None).map_err(anyhow::Error::msg)?;
    if host.has_bf16_pair_kernels() {
        for n in graph.nodes() {
            let rounded = matches!(n.op, kiln_ir::Op::Attention(_))
                && n.inputs[..3]
                    .iter()
                    .flatten()
                    .all(|&v| bf16_autocast::is_bf16_operand(&graph, v));
            let line = compiled
                .kernel_lines
                .iter()
                .find(|l| l.starts_with(&format!("{} (", n.name)) && l.contains("kiln_uk_attention_f32"));
            if let (true, Some(line)) = (rounded, line) {
                if !line.contains("bf16 tiles") {
                    anyhow::bail!("attention on bf16 operands without the bf16 tiles: {line}");
                }
            }
        }
    }
    let outputs = run_executable(&exe, &graph, &ordered, &work.0, 2).map_err(anyhow::Error::msg)?;
    let (worst_cos, worst_rel) = check_bf16_outputs(f, &graph, &outputs, summary.bf16_ops)?;
    let outcome = Outcome {
        bf16_ops: summary.bf16_ops,
        worst_cos,
        worst_rel,
    };
    Ok(outcome)
}

#[test]
fn fixtures_in_bf16_match_the_f32_reference() {
    let fixtures = load_manifest().expect("fixtures/manifest.json");
    check_fixtures(&fixtures, "bf16 fixtures", suite_threads(), |f| match check(f) {
        Ok(o) if o.bf16_ops == 0 => Ok("nothing in bf16".to_string()),
        Ok(o) => Ok(format!(
            "{} ops in bf16, cosine {:.6}, max error {:.4} of the range",
            o.bf16_ops, o.worst_cos, o.worst_rel
        )),
        Err(e) => Err(format!("{e:#}")),
    });
}
