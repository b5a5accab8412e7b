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
fn run_bounded(cmd: &mut Command, limit: Duration) -> Output {
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
    run_bounded(kiln().args(args), Duration::from_secs(60))
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

    // The compiled executable prints the names it was built with escaped too: in --help, and
    // in the one-line error that lists the model's inputs.
    let exe = dir.path().join("evil");
    let out = kiln_bounded(&[
        "compile".as_ref(),
        "-q".as_ref(),
        model.as_os_str(),
        "-o".as_ref(),
        exe.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let help = run_bounded(Command::new(&exe).arg("--help"), Duration::from_secs(30));
    assert_no_control_characters("--help", &help.stdout, true);
    assert!(String::from_utf8_lossy(&help.stdout).contains("\\u{1b}[2J"));
    let missing = run_bounded(&mut Command::new(&exe), Duration::from_secs(30));
    let err = one_line_error(&missing, 2, &["missing --input", "\\u{1b}]0;owned\\u{7}"]);
    assert_no_control_characters("the executable's error", err.trim_end().as_bytes(), false);
}

fn i64_initializer(name: &str, values: &[i64]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: vec![values.len() as i64],
        data_type: data_type::INT64,
        int64_data: values.to_vec(),
        ..Default::default()
    }
}

fn scalar_info(name: &str, elem_type: i32) -> ValueInfoProto {
    let mut v = value_info(name, &[]);
    if let Some(TypeProto {
        value: Some(TypeValue::TensorType(t)),
        ..
    }) = v.r#type.as_mut()
    {
        t.elem_type = elem_type;
    }
    v
}

/// A model of a few hundred bytes whose one node (`name`) produces `y` from initializers only.
fn sourceless_model(node: NodeProto, inits: Vec<TensorProto>) -> ModelProto {
    let mut m = one_node_model("Relu", "unused");
    let g = m.graph.as_mut().unwrap();
    g.node = vec![node];
    g.input.clear();
    g.output = vec![ValueInfoProto {
        name: "y".into(),
        r#type: None,
        doc_string: String::new(),
    }];
    g.initializer = inits;
    m
}

/// `y = Expand(c: i64[1], shape)`: 2^33 elements, 64 GiB, from a model of ~100 bytes (a size
/// import accepts: only evaluating it is too much for a machine of less than 85 GiB).
fn huge_expand() -> ModelProto {
    sourceless_model(
        node("Expand", "expand", &["c", "shape"], &["y"]),
        vec![i64_initializer("c", &[7]), i64_initializer("shape", &[1 << 33])],
    )
}

/// `y = Loop(M)` whose body stacks its iteration number: a scan output of M scalars.
fn long_loop(trip_count: i64) -> ModelProto {
    let body = GraphProto {
        name: "body".into(),
        node: vec![
            node("Identity", "keep_going", &["cond"], &["cond_out"]),
            node("Identity", "emit", &["iter"], &["scan"]),
        ],
        input: vec![
            scalar_info("iter", data_type::INT64),
            scalar_info("cond", data_type::BOOL),
        ],
        output: vec![
            scalar_info("cond_out", data_type::BOOL),
            scalar_info("scan", data_type::INT64),
        ],
        ..Default::default()
    };
    let mut lp = node("Loop", "loop", &["M", ""], &["y"]);
    lp.attribute.push(AttributeProto {
        name: "body".into(),
        r#type: attribute_type::GRAPH,
        g: Some(body),
        ..Default::default()
    });
    let m = TensorProto {
        name: "M".into(),
        dims: vec![],
        data_type: data_type::INT64,
        int64_data: vec![trip_count],
        ..Default::default()
    };
    sourceless_model(lp, vec![m])
}

#[test]
fn a_huge_allocation_is_refused_before_it_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_model(dir.path(), "expand.onnx", &huge_expand());
    assert!(std::fs::metadata(&model).unwrap().len() < 200, "a tiny model");
    // The default budget (a fraction of physical memory) and an explicit one.
    for extra in [None, Some("--max-memory=1G")] {
        let out = kiln_bounded(
            &[
                Some("run".as_ref()),
                Some(model.as_os_str()),
                Some("--reference".as_ref()),
                extra.map(AsRef::as_ref),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<&std::ffi::OsStr>>(),
        );
        one_line_error(&out, 4, &["node 'expand'", "memory budget", "--max-memory"]);
    }
}

#[test]
fn loop_scan_outputs_are_checked_against_the_budget_up_front() {
    let dir = tempfile::tempdir().unwrap();
    for m in [1_000_000_000i64, 1_000_000_000_000] {
        let model = write_model(dir.path(), &format!("loop{m}.onnx"), &long_loop(m));
        for cmd in ["run", "verify"] {
            let mut args: Vec<&std::ffi::OsStr> = vec![cmd.as_ref(), model.as_os_str()];
            if cmd == "run" {
                args.push("--reference".as_ref());
            }
            let out = kiln_bounded(&args);
            one_line_error(&out, 4, &["'loop'", "memory budget"]);
        }
    }
    // Within the budget the loop runs: 1000 iterations stack 0..999.
    let model = write_model(dir.path(), "loop1000.onnx", &long_loop(1000));
    let out = kiln_bounded(&["run".as_ref(), model.as_os_str(), "--reference".as_ref()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("i64[1000]"));
}

#[test]
fn control_flow_that_cannot_be_lowered_is_unsupported() {
    let dir = tempfile::tempdir().unwrap();
    // The trip count is a graph input: the loop cannot be unrolled at compile time.
    let mut m = long_loop(3);
    let g = m.graph.as_mut().unwrap();
    g.initializer.clear();
    g.input = vec![scalar_info("M", data_type::INT64)];
    let model = write_model(dir.path(), "loop.onnx", &m);
    let exe = dir.path().join("exe");
    let out = kiln_bounded(&[
        "compile".as_ref(),
        model.as_os_str(),
        "-o".as_ref(),
        exe.as_os_str(),
    ]);
    one_line_error(
        &out,
        4,
        &["loop.onnx: node 'loop' (Loop): the trip count is not known at compile time (bind it with --bind)"],
    );
    // With the lowering disabled, codegen says why it cannot compile the control flow.
    let out = kiln_bounded(&[
        "compile".as_ref(),
        fixture("if_captured").join("model.onnx").as_os_str(),
        "--disable-pass".as_ref(),
        "lower-control-flow".as_ref(),
        "-o".as_ref(),
        exe.as_os_str(),
    ]);
    one_line_error(&out, 4, &["node 'If' (If)", "lower-control-flow"]);
}

#[test]
fn absurd_output_sizes_are_invalid_at_import() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = one_node_model("Conv", "conv");
    let g = m.graph.as_mut().unwrap();
    g.input = vec![value_info("x", &[1, 1, 8, 8])];
    g.output = vec![ValueInfoProto {
        name: "y".into(),
        r#type: None,
        doc_string: String::new(),
    }];
    g.node[0].input.push("w".into());
    g.node[0].attribute.push(AttributeProto {
        name: "pads".into(),
        r#type: attribute_type::INTS,
        ints: vec![1 << 40; 4],
        ..Default::default()
    });
    g.initializer.push(TensorProto {
        name: "w".into(),
        dims: vec![2, 1, 3, 3],
        data_type: data_type::FLOAT,
        float_data: vec![1.0; 18],
        ..Default::default()
    });
    let model = write_model(dir.path(), "pads.onnx", &m);
    let exe = dir.path().join("pads");
    for layout in ["nchw", "nhwc"] {
        let out = kiln_bounded(&[
            "compile".as_ref(),
            model.as_os_str(),
            "--layout".as_ref(),
            layout.as_ref(),
            "-o".as_ref(),
            exe.as_os_str(),
        ]);
        one_line_error(&out, 3, &["node 'conv'", "larger than 256 GiB"]);
        assert!(!exe.exists());
    }
}

/// A model named by its bare file name, from its own folder (`kiln run m.onnx`): its folder
/// is the current one, and its external data is read from there (the file's parent is the
/// empty path, which is not a folder).
#[test]
fn external_data_of_a_model_named_from_its_own_folder_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let w: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    std::fs::write(dir.path().join("w.bin"), w).unwrap();
    write_model(dir.path(), "m.onnx", &external_data_model("w.bin"));
    kiln_frontend::npy::write_npy(
        &dir.path().join("x.npy"),
        &kiln_ir::Tensor::from_vec(vec![1, 4], vec![0.5f32; 4]),
    )
    .unwrap();
    for args in [
        &["run", "m.onnx", "--reference", "--input", "x.npy"][..],
        &["inspect", "m.onnx"],
    ] {
        let out = run_bounded(kiln().current_dir(dir.path()).args(args), Duration::from_secs(60));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "kiln {}: {stderr}", args.join(" "));
        assert!(!stderr.contains("cannot be resolved"), "{stderr}");
        if args[0] == "run" {
            assert!(stdout.contains("4.5"), "y = x + w: {stdout}");
        }
    }
}
