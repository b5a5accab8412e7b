//! Replays the saved inputs of the `npy_reader` fuzz target (fuzz/regressions/npy_reader/:
//! crashers found by fuzzing, once fixed, and a sample of the corpus) through the artifact's
//! .npy reader, built with AddressSanitizer and UBSan: each is accepted or rejected with an
//! error, never a crash or a sanitizer report.

use std::path::Path;
use std::process::Command;

#[test]
fn npy_reader_regressions() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = manifest.join("..");
    let dir = root.join("fuzz/regressions/npy_reader");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
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

    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln_npy_replay");
    let clang = std::env::var("KILN_CLANG").unwrap_or_else(|_| "clang-19".into());
    let out = Command::new(&clang)
        .args([
            "-std=gnu11",
            "-O1",
            "-g",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-DKILN_NPY_REPLAY",
        ])
        .args([
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer",
        ])
        .arg("-I")
        .arg(manifest.join("c"))
        .arg(manifest.join("c/npy.c"))
        .arg(root.join("fuzz/c/npy_harness.c"))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("running {clang}: {e}"));
    assert!(
        out.status.success(),
        "building the replay driver failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let run = Command::new(&exe)
        .args(&files)
        .env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "the .npy reader failed on a saved input:\n{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(stdout.lines().count(), files.len(), "{stdout}");
    // Files named refuse_* are malformed in ways a reader could miss (a repeated or unknown
    // header key, a header over 64 KiB); kiln's Rust reader replays the same files
    // (fuzz/regressions/npy_rust/) and must refuse them too.
    let refuse: Vec<&str> = stdout.lines().filter(|l| l.contains("/refuse_")).collect();
    assert!(refuse.len() >= 3, "{stdout}");
    for l in refuse {
        assert!(l.ends_with(": rejected"), "{l}");
    }
    // The sample covers both outcomes: files it must read and files it must refuse.
    assert!(stdout.contains(": accepted"), "{stdout}");
    assert!(stdout.contains(": rejected"), "{stdout}");
}
