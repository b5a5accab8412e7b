//! Replays the saved inputs of the frontend's fuzz targets (fuzz/regressions/<target>/: crashers
//! found by fuzzing, once fixed, and a sample of each corpus): every file is imported (or read as
//! .npy) to an error or a value, never a panic.

use kiln_frontend::onnx::import_model_bytes;
use kiln_frontend::ImportOptions;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

#[path = "../../fuzz/hostile_folder.rs"]
mod hostile_folder;

fn regressions(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/regressions")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(
        files.len() >= 5,
        "only {} regression inputs in {}",
        files.len(),
        dir.display()
    );
    files
}

/// Runs `f` on every file; returns (accepted, rejected) counts, failing on any panic. Files
/// named `refuse_*` must be rejected: malformed in ways a reader could miss (the artifact's
/// reader replays the same files, fuzz/regressions/npy_reader/refuse_*, and must agree).
fn replay(target: &str, f: impl Fn(&[u8]) -> Result<(), String>) -> (usize, usize) {
    let (mut ok, mut err) = (0, 0);
    let mut panics = vec![];
    for p in regressions(target) {
        let bytes = std::fs::read(&p).unwrap();
        let must_refuse = p.file_name().unwrap().to_string_lossy().starts_with("refuse_");
        match catch_unwind(AssertUnwindSafe(|| f(&bytes))) {
            Ok(Ok(())) if must_refuse => panic!("{} was accepted", p.display()),
            Ok(Ok(())) => ok += 1,
            Ok(Err(e)) => {
                assert!(!e.contains('\n'), "{}: a multi-line error: {e}", p.display());
                err += 1
            }
            Err(_) => panics.push(p.display().to_string()),
        }
    }
    assert!(panics.is_empty(), "panicked on: {panics:?}");
    (ok, err)
}

#[test]
fn onnx_import_regressions() {
    // External data resolves into the fuzzers' folder: a data file, and links out of it, a FIFO
    // and a device that the saved inputs name and the importer must refuse without hanging.
    let base = std::env::temp_dir().join(format!("kiln-fuzz-regressions-{}", std::process::id()));
    std::fs::create_dir_all(&base).unwrap();
    hostile_folder::populate(&base);
    let (ok, err) = replay("onnx_import", |b| {
        import_model_bytes(b, base.clone(), &ImportOptions::default())
            .map(|m| {
                let _ = kiln_ir::verify(&m.graph);
            })
            .map_err(|e| e.to_string())
    });
    let _ = std::fs::remove_dir_all(&base);
    assert!(
        ok > 0 && err > 0,
        "the sample should hold models that import and ones that do not ({ok} ok, {err} rejected)"
    );
}

#[test]
fn npy_regressions() {
    let (ok, err) = replay("npy_rust", |b| {
        kiln_frontend::npy::parse_npy(b, "regression.npy")
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    assert!(
        ok > 0 && err > 0,
        "the sample should hold files that parse and ones that do not ({ok} ok, {err} rejected)"
    );
}

/// The seeds that name each entry of the fuzzers' folder: plain files and links that stay
/// inside import; links out of the folder, the FIFO, the device and the folder are refused.
#[test]
fn external_data_seeds_reach_only_the_models_folder() {
    let base = std::env::temp_dir().join(format!("kiln-fuzz-seeds-{}", std::process::id()));
    std::fs::create_dir_all(&base).unwrap();
    hostile_folder::populate(&base);
    let seeds: Vec<PathBuf> = regressions("onnx_import")
        .into_iter()
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("external_"))
        .collect();
    assert_eq!(seeds.len(), 8, "{seeds:?}");
    for p in seeds {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let r = import_model_bytes(
            &std::fs::read(&p).unwrap(),
            base.clone(),
            &ImportOptions::default(),
        );
        match (name.starts_with("external_read_"), r) {
            (true, Ok(_)) => {}
            (false, Err(e)) => {
                let e = e.to_string();
                assert!(e.contains("external data location"), "{name}: {e}");
            }
            (true, Err(e)) => panic!("{name} should import: {e}"),
            (false, Ok(_)) => panic!("{name} should be refused"),
        }
    }
    let _ = std::fs::remove_dir_all(&base);
}
