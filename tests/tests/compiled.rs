//! ONNX backend node tests through the compiled path (kiln-codegen → executable), against the
//! manifest `tests/conformance/compiled_manifest.txt`. Only cases that pass on the reference
//! path (`eval_manifest.txt`) are run. `KILN_BLESS=1` rewrites the manifest,
//! `KILN_CONFORMANCE_FILTER=substr` runs a subset and reports without checking it.

use kiln_tests::compiled::node_case_backend;
use kiln_tests::conformance::*;

#[test]
fn onnx_node_tests_compiled() {
    let dir = cache_dir();
    let cases = list_cases(&dir).unwrap_or_default();
    assert!(
        !cases.is_empty(),
        "no ONNX node test cases in {}: generate them with `python3 scripts/gen_node_tests.py` (the README's test command does this)",
        dir.display()
    );
    let reference = read_manifest(&kiln_tests::repo_root().join("tests/conformance/eval_manifest.txt"));
    let cases: Vec<_> = cases
        .into_iter()
        .filter(|c| reference.contains(&*c.file_name().unwrap().to_string_lossy()))
        .collect();
    let (cases, filter) = filtered_cases(cases);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let results = run_all(&cases, &node_case_backend, threads);
    let passed = results.iter().filter(|r| r.outcome.is_ok()).count();
    println!(
        "compiled conformance: {passed} of {} reference-passing cases compile and match ({:.1}%)",
        results.len(),
        100.0 * passed as f64 / results.len().max(1) as f64
    );
    check_manifest(
        "compiled conformance",
        &results,
        &kiln_tests::repo_root().join("tests/conformance/compiled_manifest.txt"),
        "ONNX node test cases that compile (kiln-codegen, host CPU) and match their expected outputs.\n\
         Regenerate with: KILN_BLESS=1 cargo test -p kiln-tests --test compiled",
        filter.is_some(),
    );
}
