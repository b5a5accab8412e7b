//! The hostile-model suite: models built to make kiln read files outside the model's folder,
//! hang, print control sequences to the terminal, or allocate without bound. Each must give a
//! one-line error and its documented exit status, quickly.

mod common;

use common::*;
use kiln_frontend::onnx::proto::*;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `cmd`, killing it if it has not finished within `limit`: a hang fails the test instead
/// of the whole suite.
fn run_bounded(mut cmd: Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kiln starts");
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > limit {
            child.kill().ok();
            let out = child.wait_with_output().unwrap();
            panic!(
                "still running after {limit:?}; stderr so far: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn kiln_bounded(args: &[&std::ffi::OsStr]) -> Output {
    let mut cmd = kiln();
    cmd.args(args);
    run_bounded(cmd, Duration::from_secs(60))
}

/// Asserts a one-line error with exit status `code` that contains every needle; returns it.
fn one_line_error(out: &Output, code: i32, needles: &[&str]) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "stderr: {err}");
    assert!(!err.contains("panicked"), "kiln panicked: {err}");
    assert_eq!(err.lines().count(), 1, "expected a one-line error, got: {err}");
    for n in needles {
        assert!(err.contains(n), "error should mention '{n}': {err}");
    }
    err
}

/// `y = x + w` with `w: f32[4]` stored as external data at `location`.
fn external_data_model(location: &str) -> ModelProto {
    let mut m = one_node_model("Add", "add");
    let g = m.graph.as_mut().unwrap();
    g.node[0].input.push("w".into());
    g.initializer.push(TensorProto {
        name: "w".into(),
        dims: vec![4],
        data_type: data_type::FLOAT,
        data_location: 1,
        external_data: vec![StringStringEntryProto {
            key: "location".into(),
            value: location.into(),
        }],
        ..Default::default()
    });
    m
}

/// Every command that reads a model's weights refuses `location`, whatever it leads to.
fn assert_location_refused(dir: &Path, location: &str, needles: &[&str]) {
    let model = write_model(dir, "m.onnx", &external_data_model(location));
    let exe = dir.join("m.exe");
    for args in [
        vec!["inspect".as_ref(), model.as_os_str()],
        vec!["run".as_ref(), model.as_os_str(), "--reference".as_ref()],
        vec![
            "compile".as_ref(),
            model.as_os_str(),
            "-o".as_ref(),
            exe.as_os_str(),
        ],
    ] {
        let out = kiln_bounded(&args);
        if args[0] == "inspect" {
            // inspect reports what it could read; the weights' error still says why.
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            for n in needles {
                assert!(text.contains(n), "inspect should mention '{n}': {text}");
            }
            continue;
        }
        one_line_error(&out, 3, needles);
        assert!(!exe.exists(), "no artifact may be written");
    }
}

#[test]
fn external_data_through_a_symlink_is_refused() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("passwd"), [0u8; 16]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    symlink(outside.path().join("passwd"), dir.path().join("w.bin")).unwrap();
    assert_location_refused(dir.path(), "w.bin", &["'w.bin'", "outside the model's folder"]);
}

#[test]
fn external_data_through_a_linked_folder_is_refused() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("passwd"), [0u8; 16]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    symlink(outside.path(), dir.path().join("linkdir")).unwrap();
    assert_location_refused(
        dir.path(),
        "linkdir/passwd",
        &["'linkdir/passwd'", "outside the model's folder"],
    );
}

#[test]
fn external_data_in_a_fifo_is_refused_without_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("w.bin");
    let status = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo runs");
    assert!(status.success());
    assert_location_refused(dir.path(), "w.bin", &["'w.bin'", "FIFO"]);
}

#[test]
fn a_link_that_stays_inside_the_folder_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let w: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    std::fs::write(dir.path().join("data/w.bin"), w).unwrap();
    symlink("data/w.bin", dir.path().join("w.bin")).unwrap();
    let model = write_model(dir.path(), "m.onnx", &external_data_model("w.bin"));
    let x = dir.path().join("x.npy");
    kiln_frontend::npy::write_npy(&x, &kiln_ir::Tensor::from_vec(vec![1, 4], vec![0.5f32; 4])).unwrap();
    let out = kiln_bounded(&[
        "run".as_ref(),
        model.as_os_str(),
        "--reference".as_ref(),
        "--input".as_ref(),
        x.as_os_str(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("4.5"), "y = x + w: {stdout}");
}

/// A model whose names carry an ESC sequence (clear screen, set the window title), a NUL and a
/// newline.
fn model_with_control_characters() -> ModelProto {
    let evil = "re\u{1b}[2J\u{1b}]0;owned\u{7}lu\0\nforged";
    let mut m = one_node_model("Relu", evil);
    let g = m.graph.as_mut().unwrap();
    g.input[0].name = format!("x{evil}");
    g.node[0].input[0] = format!("x{evil}");
    m
}

fn assert_no_control_characters(what: &str, bytes: &[u8], keep_newlines: bool) {
    let text = String::from_utf8_lossy(bytes);
    let bad: Vec<char> = text
        .chars()
        .filter(|&c| c.is_control() && !(keep_newlines && c == '\n'))
        .collect();
    assert!(
        bad.is_empty(),
        "{what} prints control characters {bad:?}: {text:?}"
    );
}

#[test]
fn control_characters_in_names_are_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_model(dir.path(), "m.onnx", &model_with_control_characters());
    // The node's output is declared `y`, but the graph's one node writes `y` from an input that
    // exists: this model is valid. Make an error that quotes the node's name: a missing input.
    let mut broken = model_with_control_characters();
    broken.graph.as_mut().unwrap().node[0].input[0] = "missing\u{1b}[31m".into();
    let broken = write_model(dir.path(), "broken.onnx", &broken);

    for args in [
        vec!["inspect".as_ref(), model.as_os_str()],
        vec!["explain".as_ref(), model.as_os_str()],
    ] {
        let out = kiln_bounded(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_no_control_characters("stdout", &out.stdout, true);
        assert_no_control_characters("stderr", &out.stderr, true);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("\\u{1b}[2J"),
            "the escape is shown escaped: {stdout}"
        );
        assert!(
            !stdout.lines().any(|l| l.starts_with("forged")),
            "no forged line: {stdout}"
        );
    }
    let out = kiln_bounded(&["run".as_ref(), broken.as_os_str(), "--reference".as_ref()]);
    let err = one_line_error(&out, 3, &["missing\\u{1b}[31m"]);
    assert_no_control_characters("the error", err.trim_end().as_bytes(), false);
}
