//! `kiln verify`: passes on healthy models (an encoder, a conv net, bf16, given inputs), and
//! with a fault injected after a pass (`KILN_INJECT_FAULT`) fails with status 1, naming the
//! perturbed node and the pass.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/models")
        .join(name)
}

fn fixture(name: &str) -> PathBuf {
    fixture_dir(name).join("model.onnx")
}

fn verify(model: &Path, extra: &[&str], fault: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
    cmd.arg("verify").arg(model).args(["--threads", "1"]).args(extra);
    cmd.env_remove("KILN_INJECT_FAULT");
    if let Some(f) = fault {
        cmd.env("KILN_INJECT_FAULT", f);
    }
    cmd.output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", text(o)))
}

fn assert_passes(o: &Output) {
    assert_eq!(o.status.code(), Some(0), "{}", text(o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("PASSED"), "{}", text(o));
}

/// The node the fault was injected into, from the warning on stderr.
fn injected_node(o: &Output) -> (String, String) {
    let err = String::from_utf8_lossy(&o.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("injected a fault"))
        .unwrap_or_else(|| panic!("no fault warning:\n{}", text(o)));
    let rest = &line[line.find("into node '").expect("names the node") + "into node '".len()..];
    let (node, rest) = rest.split_once("' (").unwrap();
    let op = rest.split_once(')').unwrap().0;
    (node.to_string(), op.to_string())
}

#[test]
fn passes_on_an_encoder_with_random_inputs() {
    assert_passes(&verify(&fixture("bert_tiny"), &[], None));
}

#[test]
fn passes_on_a_conv_net_with_given_inputs() {
    let input = fixture_dir("resnet_basic_tiny").join("inputs");
    let file = std::fs::read_dir(&input).unwrap().next().unwrap().unwrap().path();
    let name = file.file_stem().unwrap().to_string_lossy().into_owned();
    let spec = format!("{name}={}", file.display());
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("verify.json");
    let report_arg = report.display().to_string();
    let o = verify(
        &fixture("resnet_basic_tiny"),
        &["--input", &spec, "--json", "--report", &report_arg],
        None,
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let j = json(&o);
    let written: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(written, j, "--report writes what --json prints");
    assert_eq!(j["schema"], "kiln.verify/1");
    assert_eq!(j["passed"], true);
    assert!(j["culprit"].is_null() && j["passes"].is_null());
    for c in j["outputs"].as_array().unwrap() {
        for field in [
            "name",
            "dtype",
            "shape",
            "cosine",
            "max_abs_err",
            "max_rel_err",
            "mismatches",
            "passed",
        ] {
            assert!(!c[field].is_null(), "{field} in {c}");
        }
    }
    assert_eq!(j["inputs"][0]["file"], Value::String(file.display().to_string()));
    assert!(j["intermediates"]["checked"].as_bool().unwrap());
    assert!(j["intermediates"]["values"].as_array().unwrap().len() > 3);
}

#[test]
fn passes_in_bf16_and_fails_with_f32_bounds() {
    // A MatMul with a decomposed GELU: the bf16 autocast changes the results.
    let model = fixture("external_data");
    let o = verify(&model, &["--precision", "bf16", "--json"], None);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let j = json(&o);
    assert_eq!(j["options"]["precision"], "bf16");
    assert_eq!(j["tolerance"]["min_cosine"], 0.999);
    // bf16 is not bit-exact: forcing tight bounds must fail, or the comparison is vacuous.
    let o = verify(
        &model,
        &[
            "--precision",
            "bf16",
            "--range-tol",
            "0",
            "--atol",
            "1e-6",
            "--no-bisect",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
}

#[test]
fn a_fault_after_fuse_is_pinned_to_its_node_and_pass() {
    // MatMul + a GELU spelled out with Erf, which fuse turns into one Gelu node.
    let o = verify(&fixture("external_data"), &["--json"], Some("fuse"));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let (node, op) = injected_node(&o);
    let j = json(&o);
    assert_eq!(j["schema"], "kiln.verify/1");
    assert_eq!(j["passed"], false);
    let c = &j["culprit"];
    assert_eq!(c["kind"], "pass", "{c}");
    assert_eq!(c["pass"], "fuse", "{c}");
    assert_eq!(c["node"], Value::String(node.clone()), "{c}");
    assert_eq!(c["op"], Value::String(op.clone()), "{c}");
    assert!(c["kernel"]["index"].is_u64(), "{c}");
    let msg = c["message"].as_str().unwrap();
    assert!(
        msg.contains(&format!("node '{node}' ({op})")) && msg.contains("pass 'fuse'"),
        "{msg}"
    );
    // Passes before fuse keep the results; fuse (and the passes after it) do not.
    let checks = j["passes"].as_array().unwrap();
    let at = checks.iter().position(|c| c["pass"] == "fuse").unwrap();
    assert!(
        checks[..at].iter().all(|c| c["outputs_match"] == true),
        "{checks:?}"
    );
    assert!(
        checks[at..].iter().all(|c| c["outputs_match"] == false),
        "{checks:?}"
    );
    // Recompiling without fuse is the one run that matches.
    let runs = j["disabled_pass_runs"].as_array().unwrap();
    for r in runs {
        let matches = r["outputs_match"] == true;
        assert_eq!(matches, r["pass"] == "fuse", "{runs:?}");
    }
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("error: ") && err.contains("pass 'fuse'"), "{err}");
}

#[test]
fn a_fault_after_freeze_is_pinned_to_its_node_and_pass() {
    // Conv + BatchNormalization: freeze folds the normalization into the weights.
    let o = verify(&fixture("batchnorm_opset11"), &["--no-bisect"], Some("freeze"));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let (node, op) = injected_node(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(&format!("first divergence: node '{node}' ({op})"))
            && out.contains("introduced by pass 'freeze'"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_fault_after_channels_last_is_pinned_to_its_node_and_pass() {
    let o = verify(&fixture("conv_basic"), &["--no-bisect"], Some("channels-last"));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let (node, op) = injected_node(&o);
    assert_eq!(op, "Conv");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(&format!("first divergence: node '{node}' (Conv)"))
            && out.contains("introduced by pass 'channels-last'"),
        "{}",
        text(&o)
    );
}

#[test]
fn usage_errors_keep_their_status() {
    let o = verify(&fixture("conv_basic"), &["--disable-pass", "nope"], None);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = verify(&fixture("conv_basic"), &["--input", "nope=missing.npy"], None);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}
