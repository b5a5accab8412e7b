//! Every fixture model, and every compiled-path ONNX node case, compiled for the CUDA target as
//! an executable and run on the GPU exactly like the CPU suites (same inputs, same per-dtype
//! tolerances). Whether there is a device is found by running one compiled CUDA executable:
//! "no CUDA device" from its runtime skips these tests (`KILN_REQUIRE_GPU=1` makes that a
//! failure); any other failure of that run fails them. `KILN_CUDA_SM` picks the compute
//! capability compiled for (default: codegen's; PTX runs on that SM and newer ones).

use kiln_codegen::Emit;
use kiln_tests::bf16::check_bf16_outputs;
use kiln_tests::compiled::{
    compile_graph_cuda, compile_graph_cuda_bf16, node_case_backend_cuda, run_executable, WorkDir,
};
use kiln_tests::cuda::{export_libdevice, gpu_required, no_device_reason};
use kiln_tests::fixtures::{check_fixtures, load_manifest, suite_threads, Fixture};

fn sm() -> u32 {
    match std::env::var("KILN_CUDA_SM") {
        Ok(s) => s
            .parse()
            .unwrap_or_else(|_| panic!("KILN_CUDA_SM must be a number like 80, got '{s}'")),
        Err(_) => kiln_codegen::nvptx::DEFAULT_SM,
    }
}

/// Compiles `f` for the GPU and runs it; its outputs in graph order.
fn run_fixture(f: &Fixture) -> Result<(kiln_ir::Graph, Vec<kiln_ir::Tensor>), String> {
    let (graph, inputs) = f.prepared().map_err(|e| format!("{e:#}"))?;
    let work = WorkDir::new(&format!("{}-cuda", f.name));
    let exe = work.0.join(&f.name);
    compile_graph_cuda(&graph, &f.name, sm(), Emit::Exe, &exe)?;
    let outputs = run_executable(&exe, &graph, &inputs, &work.0, 1)?;
    Ok((graph, outputs))
}

/// Compiles `f` with `--precision bf16` (tensor cores from sm_80) and runs it on the GPU;
/// returns the worst cosine and range-relative error against the f32 reference, judged by the
/// CPU bf16 suite's criteria (`tests/src/bf16.rs`).
fn run_fixture_bf16(f: &Fixture) -> Result<(usize, f64, f64), String> {
    let (graph, inputs) = f.prepared().map_err(|e| format!("{e:#}"))?;
    let work = WorkDir::new(&format!("{}-cuda-bf16", f.name));
    let exe = work.0.join(&f.name);
    compile_graph_cuda_bf16(&graph, &f.name, sm(), Emit::Exe, &exe)?;
    let outputs = run_executable(&exe, &graph, &inputs, &work.0, 1)?;
    // How many operators the autocast changed: none means the f32 tolerances apply.
    let mut optimized = graph.clone();
    // As `kiln compile --target cuda --precision bf16` optimizes it (the GPU kernels read the
    // narrowed operands; data movement runs in bf16).
    let mut session = kiln_driver::Session::new(kiln_driver::Options {
        target: kiln_driver::Target::Cuda,
        sm: Some(sm()),
        cpu: kiln_driver::Cpu::Native,
        precision: kiln_driver::Precision::Bf16,
        layout: Some(kiln_driver::Layout::Nchw),
        ..kiln_driver::Options::default()
    });
    session
        .optimize(&mut optimized)
        .map_err(|e| format!("optimize: {e}"))?;
    let bf16_ops = kiln_optimizer::passes::bf16_autocast::summary(&optimized).bf16_ops;
    let (cos, rel) = check_bf16_outputs(f, &graph, &outputs, bf16_ops).map_err(|e| format!("{e:#}"))?;
    Ok((bf16_ops, cos, rel))
}

/// The fixtures when a GPU runs the tests; None (after printing the skip line) when not.
fn fixtures_if_device() -> Option<Vec<Fixture>> {
    let fixtures = load_manifest().expect("fixtures/manifest.json");
    match device(&fixtures) {
        Ok(()) => Some(fixtures),
        Err(reason) => {
            println!("skipped: no CUDA device ({reason})");
            None
        }
    }
}

/// Whether a GPU runs the tests: compiles and runs the first fixture. `Err` is the skip
/// reason; a failure other than the runtime's "no CUDA device" panics.
fn device(fixtures: &[Fixture]) -> Result<(), String> {
    export_libdevice();
    let probe = fixtures.first().expect("no fixtures in the manifest");
    let reason = match run_fixture(probe) {
        Ok(_) => return Ok(()),
        Err(e) => match no_device_reason(&e) {
            Some(reason) => reason,
            None => panic!("probing for a CUDA device with fixture '{}': {e}", probe.name),
        },
    };
    assert!(
        !gpu_required(),
        "KILN_REQUIRE_GPU is set but the CUDA artifact found no device: {reason}"
    );
    Err(reason)
}

#[test]
fn fixtures_on_gpu_match_onnxruntime() {
    let Some(fixtures) = fixtures_if_device() else {
        return;
    };
    run_fixtures(&fixtures, "cuda fixtures", |f| {
        let (graph, outputs) = run_fixture(f)?;
        f.check_outputs(&graph, &outputs).map_err(|e| format!("{e:#}"))?;
        Ok(String::new())
    });
}

/// [`check_fixtures`] on one thread per core, the suite's line naming the GPU architecture.
fn run_fixtures(all: &[Fixture], what: &str, check: impl Fn(&Fixture) -> Result<String, String> + Sync) {
    check_fixtures(all, &format!("{what} (sm_{})", sm()), suite_threads(), check);
}

/// Every fixture in bf16 on the GPU: its products on tensor cores, judged like the CPU's bf16.
#[test]
fn fixtures_in_bf16_on_gpu_match_the_f32_reference() {
    let Some(fixtures) = fixtures_if_device() else {
        return;
    };
    run_fixtures(&fixtures, "cuda bf16 fixtures", |f| {
        let (ops, cos, rel) = run_fixture_bf16(f)?;
        Ok(format!(
            "{ops} ops in bf16, cosine {cos:.6}, max error {rel:.4} of the range"
        ))
    });
}

/// The node cases the compiled CPU path passes (`tests/conformance/compiled_manifest.txt`)
/// must pass on the GPU too.
#[test]
fn onnx_node_tests_on_gpu() {
    if fixtures_if_device().is_none() {
        return;
    }
    let backend = node_case_backend_cuda(sm());
    let suite = format!("cuda conformance (sm_{})", sm());
    kiln_tests::cuda::check_cuda_node_cases(&suite, &backend, &[], suite_threads());
}
