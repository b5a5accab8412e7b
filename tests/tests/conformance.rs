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
    let filter = std::env::var("KILN_CONFORMANCE_FILTER").ok();
    let cases: Vec<_> = match &filter {
        Some(f) => cases
            .into_iter()
            .filter(|c| c.file_name().unwrap().to_string_lossy().contains(f.as_str()))
            .collect(),
        None => cases,
    };
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let results = run_all(&cases, &reference_backend, threads);
    let passed: BTreeSet<String> = results
        .iter()
        .filter(|r| r.outcome.is_ok())
        .map(|r| r.name.clone())
        .collect();
    let failed: Vec<&CaseResult> = results.iter().filter(|r| r.outcome.is_err()).collect();

    let in_scope: Vec<bool> = cases.iter().map(|c| case_in_scope(c)).collect();
    let scope_total = in_scope.iter().filter(|&&b| b).count();
    let scope_passed = results
        .iter()
        .zip(&in_scope)
        .filter(|(r, &s)| s && r.outcome.is_ok())
        .count();
    let verbose = std::env::var_os("KILN_VERBOSE").is_some() || filter.is_some();
    for r in &failed {
        if verbose {
            eprintln!("FAIL {}: {}", r.name, r.outcome.as_ref().unwrap_err());
        }
    }
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
    if filter.is_some() {
        println!("conformance: {} passed, {} failed", passed.len(), failed.len());
        return;
    }
    if std::env::var_os("KILN_BLESS").is_some() {
        write_manifest(
            &manifest_path,
            "ONNX node test cases that pass through ir::eval (reference interpreter).\n\
             Regenerate with: KILN_BLESS=1 cargo test -p kiln-tests --test conformance",
            &passed,
        )
        .expect("write manifest");
        println!("blessed {} cases into {}", passed.len(), manifest_path.display());
    }
    let expected = read_manifest(&manifest_path);
    let unexpected_fail: Vec<&CaseResult> = failed
        .iter()
        .copied()
        .filter(|r| expected.contains(&r.name))
        .collect();
    let all_names: BTreeSet<&String> = results.iter().map(|r| &r.name).collect();
    let unexpected_pass: Vec<&String> = passed.iter().filter(|n| !expected.contains(*n)).collect();
    let missing: Vec<&String> = expected.iter().filter(|n| !all_names.contains(n)).collect();
    for r in &unexpected_fail {
        eprintln!("UNEXPECTED FAIL {}: {}", r.name, r.outcome.as_ref().unwrap_err());
    }
    for n in &unexpected_pass {
        eprintln!("UNEXPECTED PASS {n} (add it to the manifest: KILN_BLESS=1)");
    }
    for n in &missing {
        eprintln!("MISSING CASE {n} (listed in the manifest but not generated)");
    }
    println!("conformance: {} passed, {} failed", passed.len(), failed.len());
    assert!(
        unexpected_fail.is_empty() && unexpected_pass.is_empty() && missing.is_empty(),
        "{} unexpected failures, {} unexpected passes, {} missing cases",
        unexpected_fail.len(),
        unexpected_pass.len(),
        missing.len()
    );
}
