//! Replays the saved inputs of the `compile_plan` fuzz target (fuzz/regressions/compile_plan/:
//! crashers found by fuzzing, once fixed, and a sample of its corpus): every model that
//! imports goes through the optimizer's passes and codegen's planner for the host CPU, as
//! `kiln explain` does, to an error or a plan, never a panic.

use kiln_driver::{Options, Session};
use kiln_frontend::onnx::import_model_bytes;
use kiln_frontend::ImportOptions;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

/// What the fuzz target does with one input: Ok(true) when it was planned, Ok(false) when an
/// error stopped it (import, verification, passes or plan), with the error's text.
fn compile_plan(bytes: &[u8], empty: &Path) -> Result<bool, String> {
    let Ok(model) = import_model_bytes(bytes, empty.to_path_buf(), &ImportOptions::default()) else {
        return Ok(false);
    };
    let mut graph = model.graph;
    if kiln_ir::verify(&graph).is_err() {
        return Ok(false);
    }
    let mut session = Session::new(Options::default());
    let planned = session
        .optimize(&mut graph)
        .and_then(|_| session.plan(&graph).map(|_| ()));
    match planned {
        Ok(()) => Ok(true),
        Err(e) => {
            let msg = format!("{e}");
            if msg.contains('\n') {
                return Err(format!("a multi-line error: {msg}"));
            }
            Ok(false)
        }
    }
}

#[test]
fn compile_plan_regressions() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions/compile_plan");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no regression inputs in {}", dir.display());
    let empty = std::env::temp_dir().join(format!("kiln-fuzz-compile-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let (mut planned, mut refused, mut failures) = (0, 0, vec![]);
    for p in &files {
        let bytes = std::fs::read(p).unwrap();
        match catch_unwind(AssertUnwindSafe(|| compile_plan(&bytes, &empty))) {
            Ok(Ok(true)) => planned += 1,
            Ok(Ok(false)) => refused += 1,
            Ok(Err(e)) => failures.push(format!("{}: {e}", p.display())),
            Err(_) => failures.push(format!("{}: panicked", p.display())),
        }
    }
    let _ = std::fs::remove_dir_all(&empty);
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(planned > 0, "no input reached the planner");
    eprintln!("{} inputs: {planned} planned, {refused} refused", files.len());
}
