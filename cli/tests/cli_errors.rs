//! Errors that must say the right thing: inputs checked before compiling and named by the
//! user's file, advice that fits the cause, each domain's own opset, `-1` dims read as dynamic,
//! and one exit status per kind of failure across commands and the compiled executable.

mod common;

use common::*;
use kiln_frontend::onnx::proto::*;
use kiln_ir::Tensor;
use std::path::{Path, PathBuf};
use std::process::Output;

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn one_line_error(o: &Output, code: i32) -> String {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    err
}

fn typed_value_info(name: &str, elem_type: i32, dims: &[i64]) -> ValueInfoProto {
    let mut v = value_info(name, dims);
    if let Some(TypeProto {
        value: Some(TypeValue::TensorType(t)),
        ..
    }) = v.r#type.as_mut()
    {
        t.elem_type = elem_type;
    }
    v
}

/// `y = Reshape(x: f32[2,6], s: i64[2])`: the input `s` decides the output's shape.
fn reshape_by_input(dir: &Path) -> PathBuf {
    let mut m = one_node_model("Reshape", "reshape");
    let g = m.graph.as_mut().unwrap();
    g.node[0].input.push("s".into());
    g.input = vec![
        value_info("x", &[2, 6]),
        typed_value_info("s", data_type::INT64, &[2]),
    ];
    g.output = vec![ValueInfoProto {
        name: "y".into(),
        r#type: None,
        doc_string: String::new(),
    }];
    write_model(dir, "reshape.onnx", &m)
}

fn npy(dir: &Path, name: &str, t: &Tensor) -> PathBuf {
    let p = dir.join(name);
    kiln_frontend::npy::write_npy(&p, t).unwrap();
    p
}

#[test]
fn kiln_run_checks_inputs_before_compiling_and_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_model(dir.path(), "relu.onnx", &one_node_model("Relu", "relu"));
    let wrong = npy(
        dir.path(),
        "wrong.npy",
        &Tensor::from_vec(vec![4, 1], vec![1f32; 4]),
    );
    for mode in [None, Some("--reference")] {
        let o = kiln()
            .arg("run")
            .arg(&model)
            .arg("--input")
            .arg(format!("x={}", wrong.display()))
            .args(mode)
            .output()
            .unwrap();
        let err = one_line_error(&o, 2);
        assert!(
            err.contains(&wrong.display().to_string()),
            "names the user's file: {err}"
        );
        assert!(err.contains("expected f32[1,4]"), "{err}");
    }
}

#[test]
fn an_input_that_decides_a_shape_is_bound_with_bind() {
    let dir = tempfile::tempdir().unwrap();
    let model = reshape_by_input(dir.path());
    let o = kiln()
        .args(["compile", "-q"])
        .arg(&model)
        .arg("-o")
        .arg(dir.path().join("r"))
        .output()
        .unwrap();
    let err = one_line_error(&o, 4);
    assert!(err.contains("--bind s=FILE"), "{err}");
    assert!(
        !err.contains("--input-shape"),
        "the shapes are fixed already: {err}"
    );

    // kiln run takes --bind like compile: the reshaped output comes out 3x4.
    let x = npy(
        dir.path(),
        "x.npy",
        &Tensor::from_vec(vec![2, 6], (0..12).map(|i| i as f32).collect()),
    );
    let s = npy(dir.path(), "s.npy", &Tensor::from_vec(vec![2], vec![3i64, 4]));
    let out = dir.path().join("out");
    let o = kiln()
        .arg("run")
        .arg(&model)
        .arg("--input")
        .arg(format!("x={}", x.display()))
        .arg("--bind")
        .arg(format!("s={}", s.display()))
        .arg("--output-dir")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let y = kiln_frontend::npy::read_npy(&out.join("y.npy")).unwrap();
    assert_eq!(y.shape(), &[3, 4]);
    assert_eq!(y.to_f64_vec()[11], 11.0);
}

#[test]
fn unsupported_nodes_report_their_own_domains_opset() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = one_node_model("Foo", "foo");
    m.graph.as_mut().unwrap().node[0].domain = "com.acme".into();
    m.opset_import.push(OperatorSetIdProto {
        domain: "com.acme".into(),
        version: 1,
    });
    let mut unimported = one_node_model("Bar", "bar");
    unimported.graph.as_mut().unwrap().node[0].domain = "org.other".into();
    let acme = write_model(dir.path(), "acme.onnx", &m);
    let other = write_model(dir.path(), "other.onnx", &unimported);
    let o = kiln().args(["run", "--reference"]).arg(&acme).output().unwrap();
    let err = one_line_error(&o, 4);
    assert!(err.contains("Foo (com.acme opset 1)"), "{err}");
    let o = kiln().args(["run", "--reference"]).arg(&other).output().unwrap();
    let err = one_line_error(&o, 4);
    assert!(
        err.contains("org.other, which the model does not import"),
        "{err}"
    );
    let o = kiln().arg("inspect").arg(&acme).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("Foo (com.acme opset 1)"));
}

#[test]
fn minus_one_dims_of_inputs_and_outputs_are_dynamic() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = one_node_model("Relu", "relu");
    let g = m.graph.as_mut().unwrap();
    g.input = vec![value_info("x", &[-1, 4])];
    g.output = vec![value_info("y", &[-1, 4])];
    let model = write_model(dir.path(), "paddle.onnx", &m);
    let o = kiln().arg("inspect").arg(&model).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("f32[?,4]"));
    let exe = dir.path().join("paddle");
    let o = kiln()
        .args(["compile", "-q"])
        .arg(&model)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    let err = one_line_error(&o, 4);
    assert!(err.contains("--input-shape x="), "{err}");
    let x = npy(
        dir.path(),
        "x.npy",
        &Tensor::from_vec(vec![3, 4], vec![-1f32; 12]),
    );
    let o = kiln()
        .args(["run", "--input-shape", "x=3,4", "-q"])
        .arg(&model)
        .arg("--input")
        .arg(format!("x={}", x.display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));

    // Initializers keep refusing negative dims: they hold data.
    let mut m = one_node_model("Add", "add");
    let g = m.graph.as_mut().unwrap();
    g.node[0].input.push("w".into());
    g.initializer.push(TensorProto {
        name: "w".into(),
        dims: vec![-1],
        data_type: data_type::FLOAT,
        ..Default::default()
    });
    let bad = write_model(dir.path(), "bad.onnx", &m);
    let o = kiln().args(["run", "--reference"]).arg(&bad).output().unwrap();
    let err = one_line_error(&o, 3);
    assert!(err.contains("negative dimension"), "{err}");
}

#[test]
fn an_unwritable_output_folder_is_a_usage_error_in_both_modes() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_model(dir.path(), "relu.onnx", &one_node_model("Relu", "relu"));
    let x = npy(dir.path(), "x.npy", &Tensor::from_vec(vec![1, 4], vec![1f32; 4]));
    // A regular file where the folder should be: it cannot be created, whoever runs the test.
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, b"").unwrap();
    let out_dir = blocker.join("out");
    for mode in [None, Some("--reference")] {
        let o = kiln()
            .arg("run")
            .arg(&model)
            .arg("--input")
            .arg(format!("x={}", x.display()))
            .arg("--output-dir")
            .arg(&out_dir)
            .args(mode)
            .output()
            .unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{mode:?}: {err}");
        assert!(!err.contains("internal"), "{err}");
    }
}
