//! `--precision bf16`: every fixture model optimized with the bf16 autocast, compiled to an
//! executable, and compared with the f32 reference outputs (onnxruntime, f32).
//!
//! The criteria (cosine similarity ≥ 0.999 and a range-relative error bound per float output,
//! documented exceptions per fixture) are in `tests/src/bf16.rs`; `cuda_gpu.rs` applies the
//! same ones to the GPU's tensor-core kernels.

use kiln_driver::{Cpu, Options, Precision, Session};
use kiln_ir::Tensor;
use kiln_optimizer::passes::bf16_autocast;
use kiln_tests::bf16::check_bf16_outputs;
use kiln_tests::compiled::{bind_shape_inputs, run_executable, WorkDir};
use kiln_tests::fixtures::{load_manifest, Fixture};
use std::sync::Mutex;

/// What one fixture gave: whether the autocast changed it, and the worst cosine / error.
struct Outcome {
    bf16_ops: usize,
    worst_cos: f64,
    worst_rel: f64,
}

fn check(f: &Fixture) -> anyhow::Result<Outcome> {
    let model = f.load()?;
    let mut inputs = f.read_inputs()?;
    let names: Vec<String> = model.graph.input_types().map(|(n, _)| n.to_string()).collect();
    let ordered: Vec<(String, Tensor)> = names
        .iter()
        .map(|n| {
            let t = inputs
                .remove(n)
                .ok_or_else(|| anyhow::anyhow!("no input file for '{n}'"))?;
            Ok((n.clone(), t))
        })
        .collect::<anyhow::Result<_>>()?;
    let (bound, ordered) = bind_shape_inputs(&f.path(&f.model), &f.import_options()?, &model, ordered)
        .map_err(anyhow::Error::msg)?;
    let mut graph = bound.as_ref().unwrap_or(&model).graph.clone();
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
    session
        .emit(&graph, &exe)
        .map_err(|e| anyhow::anyhow!("compile: {e}"))?;
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
    assert!(!fixtures.is_empty(), "no fixtures in the manifest");
    let filter = std::env::var("KILN_FIXTURE_FILTER").ok();
    let fixtures: Vec<&Fixture> = fixtures
        .iter()
        .filter(|f| {
            filter
                .as_ref()
                .is_none_or(|s| s.split(',').any(|p| f.name.contains(p)))
        })
        .collect();
    let next = Mutex::new(0usize);
    let failed = Mutex::new(vec![]);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = {
                    let mut n = next.lock().unwrap();
                    *n += 1;
                    *n - 1
                };
                let Some(f) = fixtures.get(i) else { break };
                match check(f) {
                    Ok(o) if o.bf16_ops == 0 => println!("ok   {} (nothing in bf16)", f.name),
                    Ok(o) => println!(
                        "ok   {}: {} ops in bf16, cosine {:.6}, max error {:.4} of the range",
                        f.name, o.bf16_ops, o.worst_cos, o.worst_rel
                    ),
                    Err(e) => {
                        println!("FAIL {}: {e:#}", f.name);
                        failed.lock().unwrap().push(f.name.clone());
                    }
                }
            });
        }
    });
    let failed = failed.into_inner().unwrap();
    println!(
        "bf16 fixtures: {} passed, {} failed",
        fixtures.len() - failed.len(),
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "fixtures failing in bf16: {}",
        failed.join(", ")
    );
}
