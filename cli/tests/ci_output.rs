//! What CI scripts rely on: distinct exit statuses, `--report FILE` on every command (also when
//! the command fails), and `--color`/`NO_COLOR`.

mod common;

use common::{fixture, kiln, one_node_model, write_model};
use serde_json::Value;
use std::process::Output;

fn status(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn read_json(path: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn exit_statuses_tell_failures_apart() {
    let dir = tempfile::tempdir().unwrap();
    let unknown_flag = kiln().args(["compile", "--no-such-flag"]).output().unwrap();
    assert_eq!(status(&unknown_flag), 2, "{}", stderr(&unknown_flag));

    let missing = kiln()
        .args(["compile", "/nonexistent/model.onnx"])
        .output()
        .unwrap();
    assert_eq!(status(&missing), 2, "{}", stderr(&missing));

    let garbage = dir.path().join("garbage.onnx");
    std::fs::write(&garbage, b"\xff\xff\xff\xff not a model").unwrap();
    let invalid = kiln().arg("compile").arg(&garbage).output().unwrap();
    assert_eq!(status(&invalid), 3, "{}", stderr(&invalid));

    let fancy = write_model(dir.path(), "fancy.onnx", &one_node_model("FancyOp", "fancy1"));
    let unsupported = kiln().arg("compile").arg(&fancy).output().unwrap();
    assert_eq!(status(&unsupported), 4, "{}", stderr(&unsupported));
    assert!(
        stderr(&unsupported).contains("fancy1"),
        "{}",
        stderr(&unsupported)
    );

    // A C compiler/linker that fails: the model is fine, producing the artifact is not.
    let relu = write_model(dir.path(), "relu.onnx", &one_node_model("Relu", "relu1"));
    let link = kiln()
        .arg("compile")
        .arg(&relu)
        .arg("-o")
        .arg(dir.path().join("relu"))
        .env("CC", "false")
        .output()
        .unwrap();
    assert_eq!(status(&link), 5, "{}", stderr(&link));

    let ok = kiln()
        .arg("compile")
        .arg(&relu)
        .arg("-q")
        .arg("-o")
        .arg(dir.path().join("relu"))
        .output()
        .unwrap();
    assert_eq!(status(&ok), 0, "{}", stderr(&ok));
}

#[test]
fn a_failed_command_still_writes_its_report() {
    let dir = tempfile::tempdir().unwrap();
    let fancy = write_model(dir.path(), "fancy.onnx", &one_node_model("FancyOp", "fancy1"));
    let report = dir.path().join("report.json");
    let out = kiln()
        .arg("compile")
        .arg(&fancy)
        .arg("--report")
        .arg(&report)
        .output()
        .unwrap();
    assert_eq!(status(&out), 4);
    let r = read_json(&report);
    assert_eq!(r["schema"], "kiln.failure/1");
    assert_eq!(r["command"], "compile");
    assert_eq!(r["exit_code"], 4);
    assert_eq!(r["exit"], "unsupported");
    assert_eq!(r["node"], "fancy1");
    assert_eq!(r["op"], "FancyOp");
    assert!(r["error"].as_str().unwrap().contains("FancyOp"));
    assert!(r["pass"].is_null());
}

#[test]
fn inspect_and_run_write_reports() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixture("softmax").join("model.onnx");
    let inspect = dir.path().join("inspect.json");
    let out = kiln()
        .arg("inspect")
        .arg(&model)
        .arg("--report")
        .arg(&inspect)
        .output()
        .unwrap();
    assert_eq!(status(&out), 0, "{}", stderr(&out));
    let r = read_json(&inspect);
    assert_eq!(r["schema"], "kiln.inspect/1");
    assert!(r["nodes"].as_u64().unwrap() >= 1);

    let inputs = std::fs::read_dir(fixture("softmax").join("inputs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect::<Vec<_>>();
    for mode in ["--reference", "--threads=1"] {
        let report = dir.path().join("run.json");
        let mut cmd = kiln();
        cmd.arg("run")
            .arg(&model)
            .arg(mode)
            .arg("-q")
            .arg("--report")
            .arg(&report);
        for i in &inputs {
            let name = i.file_stem().unwrap().to_string_lossy();
            cmd.arg("--input").arg(format!("{name}={}", i.display()));
        }
        let out = cmd.output().unwrap();
        assert_eq!(status(&out), 0, "{mode}: {}", stderr(&out));
        let r = read_json(&report);
        assert_eq!(r["schema"], "kiln.run/1");
        let expected_mode = if mode == "--reference" {
            "reference"
        } else {
            "compiled"
        };
        assert_eq!(r["mode"], expected_mode);
        let outputs = r["outputs"].as_array().unwrap();
        assert!(!outputs.is_empty());
        for o in outputs {
            assert!(o["min"].as_f64().unwrap() <= o["max"].as_f64().unwrap());
            assert_eq!(o["non_finite"], 0);
            assert!(o["file"].is_null(), "no --output-dir, so no file: {o}");
        }
    }
}

#[test]
fn color_follows_the_flag_and_no_color() {
    let args = ["compile", "/nonexistent/model.onnx"];
    let always = kiln().args(args).arg("--color=always").output().unwrap();
    assert!(
        stderr(&always).starts_with("\x1b[1;31merror:"),
        "{:?}",
        stderr(&always)
    );
    let never = kiln().args(args).args(["--color", "never"]).output().unwrap();
    assert!(stderr(&never).starts_with("error:"), "{:?}", stderr(&never));
    // Not a terminal: auto means no color; NO_COLOR keeps it off even for clap's messages.
    let auto = kiln().args(args).env("NO_COLOR", "1").output().unwrap();
    assert!(!stderr(&auto).contains('\x1b'), "{:?}", stderr(&auto));
    let usage = kiln()
        .args(["compile", "--bogus"])
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert!(!stderr(&usage).contains('\x1b'), "{:?}", stderr(&usage));
}
