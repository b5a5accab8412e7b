//! `--mode max-autotune`: a tuned artifact computes what the model computes, the measurements
//! are cached and read back by the next compilation, and what the mode cannot do is a usage
//! error (exit status 2) that leaves a foreign cache file alone.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn kiln() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/models")
        .join(name)
}

fn compile_tuned(model: &Path, out: &Path, cache: &Path, extra: &[&str]) -> Output {
    kiln()
        .arg("compile")
        .arg(model)
        .arg("-o")
        .arg(out)
        .args(["--mode", "max-autotune", "--autotune-cache"])
        .arg(cache)
        .args(extra)
        .output()
        .expect("kiln runs")
}

/// "N product shapes timed, M read from FILE" from the compile summary.
fn tuning_counts(stderr: &str) -> (usize, usize) {
    let line = stderr
        .lines()
        .find(|l| l.contains("max-autotune:"))
        .unwrap_or_else(|| panic!("no max-autotune line in: {stderr}"));
    let nums: Vec<usize> = line
        .split_whitespace()
        .filter_map(|w| w.trim_end_matches(',').parse().ok())
        .collect();
    (nums[0], nums[1])
}

#[test]
fn a_tuned_artifact_is_correct_and_a_second_compile_reads_the_cache() {
    let fx = fixture("resnet_basic_tiny");
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache").join("autotune.json");
    let exe = dir.path().join("tuned");
    let out = compile_tuned(&fx.join("model.onnx"), &exe, &cache, &["--list-kernels"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let (timed, cached) = tuning_counts(&stderr);
    assert!(timed > 0 && cached == 0, "{stderr}");
    // Every product kernel says what tuning found.
    let kernels = String::from_utf8_lossy(&out.stdout);
    assert!(kernels.lines().any(|l| l.contains("(tuned: ")), "{kernels}");

    // The cache holds one entry per timed shape.
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cache).unwrap()).unwrap();
    assert_eq!(json["kiln_autotune"], 1);
    assert_eq!(json["entries"].as_object().unwrap().len(), timed);

    // The artifact computes the model.
    let run = Command::new(&exe)
        .arg("-i")
        .arg(fx.join("inputs/input.npy"))
        .arg("-o")
        .arg(dir.path().join("out"))
        .arg("-q")
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let got = kiln_frontend::npy::read_npy(&dir.path().join("out/logits.npy")).unwrap();
    let want = kiln_frontend::npy::read_npy(&fx.join("expected/logits.npy")).unwrap();
    assert_eq!(got.shape(), want.shape());
    for (g, w) in got.to_f64_vec().iter().zip(want.to_f64_vec()) {
        assert!((g - w).abs() <= 1e-4 + 1e-4 * w.abs(), "{g} vs {w}");
    }

    // Again: nothing is timed, every shape comes from the cache.
    let again = compile_tuned(&fx.join("model.onnx"), &dir.path().join("again"), &cache, &[]);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{stderr}");
    assert_eq!(tuning_counts(&stderr), (0, timed), "{stderr}");
}

#[test]
fn what_max_autotune_cannot_do_is_a_usage_error() {
    let model = fixture("matmul_2d").join("model.onnx");
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("autotune.json");
    let expect_usage = |out: Output, what: &str| {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(what), "expected '{what}' in: {stderr}");
    };
    let out = dir.path().join("m");
    expect_usage(
        compile_tuned(&model, &out, &cache, &["--cpu", "portable"]),
        "portable",
    );
    expect_usage(
        compile_tuned(
            &model,
            &out,
            &cache,
            &["--target-triple", "aarch64-linux-gnu", "--emit", "obj"],
        ),
        "is not this machine",
    );
    // A file that is not a kiln cache is refused and left as it was.
    let notes = dir.path().join("notes.json");
    std::fs::write(&notes, "{\"mine\": true}").unwrap();
    expect_usage(
        compile_tuned(&model, &out, &notes, &[]),
        "is not a kiln autotune cache",
    );
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "{\"mine\": true}");
}
