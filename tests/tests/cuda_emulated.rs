//! Every fixture model compiled for the CUDA target and run without a GPU: the plan's kernels
//! (generated GPU kernels, and library kernels on a block) run on the host CPU under codegen's
//! emulator (`kiln_codegen::nvptx::emulate`), the grid's blocks one after another and a block's
//! threads on OS threads that meet at its barriers. Outputs are checked against the fixtures'
//! recorded outputs with the CPU suites' tolerances. The device suite (`cuda_gpu`) runs the same
//! fixtures as executables on a real GPU; this one checks the same kernels everywhere else.
//! `KILN_FIXTURE_FILTER=substr` runs a subset.

use kiln_codegen::Emit;
use kiln_driver::{Cpu, Options, Session, Target};
use kiln_tests::compiled::{compile_graph_cuda, WorkDir};
use kiln_tests::cuda::{expect_cuda_refusal, CUDA_REFUSED};
use kiln_tests::fixtures::{check_fixtures, load_manifest, suite_threads, Fixture};

/// The compute capability emulated (plans differ from sm_80 on: tensor cores in bf16).
const SM: u32 = 80;

/// Optimizes and plans `f` as `kiln compile --target cuda --sm 80` does, then runs the plan in
/// emulation; its outputs in graph order.
fn run_emulated(f: &Fixture) -> Result<(kiln_ir::Graph, Vec<kiln_ir::Tensor>), String> {
    let (graph, inputs) = f.prepared().map_err(|e| format!("{e:#}"))?;
    let mut session = Session::new(Options {
        name: Some(f.name.clone()),
        target: Target::Cuda,
        sm: Some(SM),
        cpu: Cpu::Native,
        ..Options::default()
    });
    let mut optimized = graph.clone();
    session
        .optimize(&mut optimized)
        .map_err(|e| format!("optimize: {e}"))?;
    let plan = session.plan(&optimized).map_err(|e| format!("compile: {e}"))?;
    let target = session.target().map_err(|e| format!("{e}"))?;
    let values: Vec<kiln_ir::Tensor> = inputs.into_iter().map(|(_, t)| t).collect();
    let outputs = kiln_codegen::nvptx::emulate::run_plan(&optimized, &plan, &target, &values)
        .map_err(|e| format!("emulation: {e}"))?;
    Ok((graph, outputs))
}

#[test]
fn fixtures_in_cuda_emulation_match_onnxruntime() {
    let fixtures = load_manifest().expect("fixtures/manifest.json");
    check_fixtures(
        &fixtures,
        &format!("cuda fixtures in emulation (sm_{SM})"),
        suite_threads(),
        |f| {
            if CUDA_REFUSED.contains(&f.name.as_str()) {
                // The refusal comes as the device code is built, after the plan.
                let (graph, _) = f.prepared().map_err(|e| format!("{e:#}"))?;
                let work = WorkDir::new(&format!("{}-emulated", f.name));
                let ptx = work.0.join(format!("{}.ptx", f.name));
                let compiled = compile_graph_cuda(&graph, &f.name, SM, Emit::Ptx, &ptx);
                return expect_cuda_refusal(&f.name, compiled).map(|()| "refused".into());
            }
            let (graph, outputs) = run_emulated(f)?;
            f.check_outputs(&graph, &outputs).map_err(|e| format!("{e:#}"))?;
            Ok(String::new())
        },
    );
}
