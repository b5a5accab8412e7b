//! ONNX backend node tests through the reference interpreter, against the committed manifest
//! `tests/conformance/eval_manifest.txt`. Set `KILN_BLESS=1` to rewrite the manifest from the
//! current results, `KILN_CONFORMANCE_FILTER=substr` to run (and report) a subset without
//! checking the manifest.

use kiln_tests::conformance::*;
use std::collections::BTreeSet;

#[test]
fn onnx_node_tests_reference() {
    let dir = cache_dir();
    let cases = list_cases(&dir).unwrap_or_default();
    assert!(
        !cases.is_empty(),
        "no ONNX node test cases in {}: generate them with `python3 scripts/gen_node_tests.py` (the README's test command does this)",
        dir.display()
    );
    let (cases, filter) = filtered_cases(cases);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let results = run_all(&cases, &reference_backend, threads);
    let passed: BTreeSet<String> = results
        .iter()
        .filter(|r| r.outcome.is_ok())
        .map(|r| r.name.clone())
        .collect();
    let in_scope: Vec<bool> = cases.iter().map(|c| case_in_scope(c)).collect();
    let scope_total = in_scope.iter().filter(|&&b| b).count();
    let scope_passed = results
        .iter()
        .zip(&in_scope)
        .filter(|(r, &s)| s && r.outcome.is_ok())
        .count();
    println!(
        "reference conformance: {} of {} cases pass ({:.1}%); in scope: {} of {} ({:.1}%)",
        passed.len(),
        results.len(),
        100.0 * passed.len() as f64 / results.len().max(1) as f64,
        scope_passed,
        scope_total,
        100.0 * scope_passed as f64 / scope_total.max(1) as f64
    );

    let manifest_path = kiln_tests::repo_root().join("tests/conformance/eval_manifest.txt");
    check_manifest(
        "conformance",
        &results,
        &manifest_path,
        "ONNX node test cases that pass through ir::eval (reference interpreter).\n\
         Regenerate with: KILN_BLESS=1 cargo test -p kiln-tests --test conformance",
        filter.is_some(),
    );
}
