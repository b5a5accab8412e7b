//! The CUDA target checked without a GPU: every fixture model and every compiled-path ONNX
//! node case planned for `--target cuda --sm 80` and run on the host CPU under codegen's
//! emulator (`kiln_tests::compiled::run_cuda_emulated`), the grid's blocks one after another
//! and a block's threads on OS threads that meet at its barriers. Outputs are checked like the
//! CPU suites (the fixtures' recorded outputs, the node cases' expected ones, same tolerances).
//! The device suite (`cuda_gpu`) runs the same models as executables on a real GPU; this one
//! checks the same kernels everywhere else. `KILN_FIXTURE_FILTER` and
//! `KILN_CONFORMANCE_FILTER` run subsets.

use kiln_tests::bf16::check_bf16_outputs;
use kiln_tests::compiled::{
    cuda_library_kernels_planned, node_case_backend_cuda_emulated, run_cuda_emulated, run_cuda_emulated_bf16,
    EMULATED_SM,
};
use kiln_tests::cuda::{check_cuda_library_manifest, check_cuda_node_cases};
use kiln_tests::fixtures::{check_fixtures, load_manifest, suite_threads};

#[test]
fn fixtures_in_cuda_emulation_match_onnxruntime() {
    let fixtures = load_manifest().expect("fixtures/manifest.json");
    let what = format!("cuda fixtures in emulation (sm_{EMULATED_SM})");
    check_fixtures(&fixtures, &what, suite_threads(), |f| {
        let (graph, inputs) = f.prepared().map_err(|e| format!("{e:#}"))?;
        let values: Vec<_> = inputs.into_iter().map(|(_, t)| t).collect();
        let outputs = run_cuda_emulated(&graph, &f.name, values)?;
        f.check_outputs(&graph, &outputs).map_err(|e| format!("{e:#}"))?;
        Ok(String::new())
    });
}

/// `--precision bf16` on the GPU: the autocast's operands on bf16 tensor cores, its rounding
/// absorbed by the products and the attention kernel that read them, judged against the f32
/// reference by the CPU bf16 suite's criteria (`tests/src/bf16.rs`).
#[test]
fn fixtures_in_bf16_cuda_emulation_match_the_f32_reference() {
    let fixtures = load_manifest().expect("fixtures/manifest.json");
    let what = format!("cuda bf16 fixtures in emulation (sm_{EMULATED_SM})");
    check_fixtures(&fixtures, &what, suite_threads(), |f| {
        let (graph, inputs) = f.prepared().map_err(|e| format!("{e:#}"))?;
        let values: Vec<_> = inputs.into_iter().map(|(_, t)| t).collect();
        let (outputs, bf16_ops) = run_cuda_emulated_bf16(&graph, &f.name, values)?;
        let (cos, rel) = check_bf16_outputs(f, &graph, &outputs, bf16_ops).map_err(|e| format!("{e:#}"))?;
        Ok(format!(
            "{bf16_ops} ops in bf16, cosine {cos:.6}, max error {rel:.4} of the range"
        ))
    });
}

/// Node cases left to the device suite: their plans take the emulator tens of seconds (a
/// 6480-row LogSoftmax: 810 blocks whose 256 threads meet at a barrier 20 times each, every
/// meeting a round of OS context switches).
const TOO_SLOW_TO_EMULATE: &[&str] = &["test_sce_NCd1d2d3d4d5_"];

/// The node cases the compiled CPU path passes (`tests/conformance/compiled_manifest.txt`)
/// pass in emulation too (those whose output sizes depend on the data with the counts their
/// kernels report), and their plans run C library kernels only where
/// `tests/conformance/cuda_library_manifest.txt` lists them.
#[test]
fn onnx_node_tests_in_cuda_emulation() {
    let suite = format!("cuda conformance in emulation (sm_{EMULATED_SM})");
    check_cuda_node_cases(
        &suite,
        &node_case_backend_cuda_emulated,
        TOO_SLOW_TO_EMULATE,
        suite_threads(),
    );
    let filtered = std::env::var_os("KILN_CONFORMANCE_FILTER").is_some();
    check_cuda_library_manifest(&cuda_library_kernels_planned(), filtered);
}
