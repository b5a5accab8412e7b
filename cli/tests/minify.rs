//! `kiln minify`: reduces failing models to a few nodes, and refuses what it cannot minify.

use kiln_frontend::onnx::proto::ModelProto;
use kiln_frontend::onnx::read_model_proto;
use prost::Message;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn kiln() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/models")
        .join(name)
        .join("model.onnx")
}

fn python() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python")
}

fn nodes(m: &ModelProto) -> Vec<String> {
    m.graph
        .as_ref()
        .unwrap()
        .node
        .iter()
        .map(|n| n.op_type.clone())
        .collect()
}

/// A copy of a fixture in a temporary folder (minify writes next to its input).
fn copy_fixture(name: &str, dir: &Path) -> PathBuf {
    let p = dir.join(format!("{name}.onnx"));
    std::fs::copy(fixture(name), &p).unwrap();
    p
}

fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("kiln runs");
    assert!(
        out.status.success(),
        "failed with {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A check that fails (exits 1) exactly when the candidate is a valid model with nodes of all
/// of `ops` (in the name order of `kiln inspect --json`'s histogram).
fn contains_ops_check(ops: &[&str]) -> String {
    let pattern: String = ops.iter().map(|op| format!("*'\"{op}\":'")).collect();
    format!(
        "out=$('{}' inspect --json {{}}) || exit 0; \
         case \"$out\" in *'\"import_error\": \"'*) exit 0;; esac; \
         case \"$out\" in {pattern}*) exit 1;; esac; exit 0",
        env!("CARGO_BIN_EXE_kiln")
    )
}

#[test]
fn reduces_a_100_node_model_to_the_op_a_shell_check_looks_for() {
    let dir = tempfile::tempdir().unwrap();
    let model = copy_fixture("efficientnet_tiny", dir.path());
    let before = read_model_proto(&model).unwrap();
    assert!(
        nodes(&before).len() >= 100,
        "the fixture has {} nodes",
        nodes(&before).len()
    );

    let out = run_ok(kiln().arg("minify").arg(&model).args([
        "--check",
        &contains_ops_check(&["GlobalAveragePool"]),
        "--json",
    ]));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let reduced_path = dir.path().join("efficientnet_tiny.min.onnx");
    assert_eq!(summary["output"], reduced_path.display().to_string());
    assert_eq!(summary["nodes_before"], nodes(&before).len());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("minify: 112 nodes →"), "{stderr}");

    let reduced = read_model_proto(&reduced_path).unwrap();
    let ops = nodes(&reduced);
    assert!(ops.len() <= 5, "still {} nodes: {ops:?}", ops.len());
    assert!(ops.iter().any(|o| o == "GlobalAveragePool"), "{ops:?}");
    assert_eq!(summary["nodes_after"], ops.len());

    // A valid model for kiln and for onnx.
    run_ok(kiln().arg("inspect").arg(&reduced_path));
    run_ok(Command::new(python()).args([
        "-c",
        "import onnx, sys; onnx.checker.check_model(onnx.load(sys.argv[1]), full_check=True)",
        &reduced_path.display().to_string(),
    ]));
}

/// Two operators far apart: cutting the graph alone cannot isolate them, ddmin must; the
/// classifier weight then becomes an input.
#[test]
fn ddmin_keeps_two_distant_nodes_and_shrinks_constants() {
    let dir = tempfile::tempdir().unwrap();
    let model = copy_fixture("efficientnet_tiny", dir.path());
    let reduced_path = dir.path().join("two.onnx");
    let out = run_ok(
        kiln()
            .arg("minify")
            .arg(&model)
            .args([
                "--check",
                &contains_ops_check(&["Gemm", "Sigmoid"]),
                "--json",
                "-o",
            ])
            .arg(&reduced_path),
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut ops = nodes(&read_model_proto(&reduced_path).unwrap());
    ops.sort();
    assert_eq!(ops, ["Gemm", "Sigmoid"]);
    assert!(
        summary["constants_shrunk"]
            .as_object()
            .is_some_and(|c| !c.is_empty()),
        "{summary}"
    );
    run_ok(kiln().arg("inspect").arg(&reduced_path));
}

#[test]
fn compile_check_keeps_the_unsupported_node() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = read_model_proto(&fixture("resnet_basic_tiny")).unwrap();
    let g = m.graph.as_mut().unwrap();
    let n = g.node.iter_mut().find(|n| n.name == "Relu_3").unwrap();
    n.op_type = "Frobnicate".into();
    let model = dir.path().join("broken.onnx");
    std::fs::write(&model, m.encode_to_vec()).unwrap();
    let reduced_path = dir.path().join("small.onnx");

    run_ok(
        kiln()
            .arg("minify")
            .arg(&model)
            .args(["--check", "compile", "-o"])
            .arg(&reduced_path),
    );
    let reduced = read_model_proto(&reduced_path).unwrap();
    let ops = nodes(&reduced);
    assert!((1..=2).contains(&ops.len()), "{ops:?}");
    assert!(ops.iter().any(|o| o == "Frobnicate"), "{ops:?}");

    // It still fails to compile the same way.
    let out = kiln()
        .arg("compile")
        .arg(&reduced_path)
        .arg("-o")
        .arg(dir.path().join("a"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Frobnicate"));
}

#[test]
fn a_check_the_original_passes_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let model = copy_fixture("conv_basic", dir.path());
    let out = kiln()
        .arg("minify")
        .arg(&model)
        .args(["--check", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not fail the check"), "{err}");
    assert!(!dir.path().join("conv_basic.min.onnx").exists());

    // A model kiln compiles does not fail `--check compile` either.
    let out = kiln()
        .arg("minify")
        .arg(&model)
        .args(["--check", "compile"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_check_that_times_out_does_not_fail() {
    let dir = tempfile::tempdir().unwrap();
    let model = copy_fixture("conv_basic", dir.path());
    let start = std::time::Instant::now();
    let out = kiln()
        .arg("minify")
        .arg(&model)
        .args(["--check", "sleep 30; false", "--timeout", "0.5"])
        .output()
        .unwrap();
    assert!(
        start.elapsed().as_secs() < 20,
        "the timeout did not end the check"
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("timed out"), "{err}");
}

#[test]
fn expect_exit_and_max_checks() {
    let dir = tempfile::tempdir().unwrap();
    let model = copy_fixture("resnet_basic_tiny", dir.path());
    // Exit 3 means "still fails"; exit 1 (the model has no Gemm) does not.
    let check = format!(
        "'{}' inspect --json {{}} | grep -q '\"Gemm\":' && exit 3; exit 1",
        env!("CARGO_BIN_EXE_kiln")
    );
    let out = run_ok(kiln().arg("minify").arg(&model).args([
        "--check",
        &check,
        "--expect-exit",
        "3",
        "--max-checks",
        "3",
        "--json",
    ]));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["stopped_early"], true);
    assert!(summary["checks"].as_u64().unwrap() <= 3);
    let reduced = read_model_proto(&dir.path().join("resnet_basic_tiny.min.onnx")).unwrap();
    assert!(nodes(&reduced).iter().any(|o| o == "Gemm"));

    // Exit status 1 is "does not fail" here, so the original passes.
    let out = kiln()
        .arg("minify")
        .arg(&model)
        .args(["--check", &check, "--expect-exit", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// Reduced models stand alone: external data and `--weights` are inlined, so they load from
/// another folder and without model arguments.
#[test]
fn reduced_models_stand_alone() {
    let dir = tempfile::tempdir().unwrap();
    let kiln_exe = env!("CARGO_BIN_EXE_kiln");
    let with_params = format!(
        "out=$('{kiln_exe}' inspect --json {{}}) || exit 0; \
         case \"$out\" in *'\"import_error\": \"'*|*'\"parameters\": 0,'*) exit 0;; esac; \
         case \"$out\" in *'\"MatMul\":'*) exit 1;; esac; exit 0"
    );
    let reduced = dir.path().join("ext.onnx");
    run_ok(
        kiln()
            .arg("minify")
            .arg(fixture("external_data"))
            .args(["--check", &with_params, "-o"])
            .arg(&reduced),
    );
    let out = run_ok(kiln().args(["inspect", "--json"]).arg(&reduced));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["parameters"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(report["nodes"], 1);

    let weights_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models/weights_safetensors");
    let reduced = dir.path().join("w.onnx");
    let check = contains_ops_check(&["Gemm"]);
    run_ok(
        kiln()
            .arg("minify")
            .arg(weights_dir.join("model.onnx"))
            .arg("--weights")
            .arg(weights_dir.join("weights.safetensors"))
            .args(["--check", &check, "-o"])
            .arg(&reduced),
    );
    assert_eq!(nodes(&read_model_proto(&reduced).unwrap()), ["Gemm"]);
    run_ok(kiln().arg("inspect").arg(&reduced));
}

/// The whole chain a user follows when results are wrong: a fault injected into the fuse pass
/// makes `kiln verify` fail on a 105-node encoder; `--check verify` reduces it to the pattern
/// the broken rewrite produced, and verify still blames that pass on the reduced model.
#[test]
fn verify_check_isolates_a_broken_fusion() {
    let dir = tempfile::tempdir().unwrap();
    let model = copy_fixture("bert_tiny_decomposed_ln", dir.path());
    let before = nodes(&read_model_proto(&model).unwrap()).len();
    assert!(before >= 100, "{before} nodes");
    let out = run_ok(
        kiln()
            .arg("minify")
            .arg(&model)
            .args(["--check", "verify", "-q", "--json"])
            .env("KILN_INJECT_FAULT", "fuse"),
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let reduced = PathBuf::from(summary["output"].as_str().unwrap());
    let ops = nodes(&read_model_proto(&reduced).unwrap());
    assert!(ops.len() <= 5, "{ops:?}");
    let verify = kiln()
        .arg("verify")
        .arg(&reduced)
        .arg("--json")
        .env("KILN_INJECT_FAULT", "fuse")
        .output()
        .unwrap();
    assert_eq!(verify.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&verify.stdout).unwrap();
    assert_eq!(v["culprit"]["pass"], "fuse", "{v}");
    // Without the fault the reduced model is fine: what was isolated is the fault, not noise.
    let clean = kiln().arg("verify").arg(&reduced).output().unwrap();
    assert_eq!(
        clean.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&clean.stderr)
    );
}
