//! Malformed and hostile models: each gives a one-line error naming the problem and a non-zero
//! exit, never a panic or a hang.

use kiln_frontend::onnx::proto::*;
use prost::Message;
use std::path::{Path, PathBuf};
use std::process::Command;

fn kiln() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
}

fn tensor_type(dims: &[i64]) -> Option<TypeProto> {
    Some(TypeProto {
        value: Some(TypeValue::TensorType(TypeTensor {
            elem_type: data_type::FLOAT,
            shape: Some(TensorShapeProto {
                dim: dims
                    .iter()
                    .map(|&d| Dimension {
                        value: Some(DimValue::DimValue(d)),
                        denotation: String::new(),
                    })
                    .collect(),
            }),
        })),
        denotation: String::new(),
    })
}

fn value_info(name: &str, dims: &[i64]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: tensor_type(dims),
        doc_string: String::new(),
    }
}

fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        name: name.into(),
        op_type: op.into(),
        ..Default::default()
    }
}

/// `y = Relu(x)` with x: f32[1,4], at `opset`.
fn relu_model(opset: i64) -> ModelProto {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: opset,
        }],
        graph: Some(GraphProto {
            name: "g".into(),
            node: vec![node("Relu", "relu", &["x"], &["y"])],
            input: vec![value_info("x", &[1, 4])],
            output: vec![value_info("y", &[1, 4])],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Runs `kiln inspect`-free import through `kiln run --reference` (which needs the model to
/// import) and returns (exit code, stderr).
fn run_import(model: &Path) -> (i32, String) {
    let out = kiln()
        .args(["run", "--reference"])
        .arg(model)
        .output()
        .expect("kiln runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_one_line_error(model: &Path, needles: &[&str]) {
    let (code, err) = run_import(model);
    assert_ne!(code, 0, "expected failure, stderr: {err}");
    assert!(!err.contains("panicked"), "kiln panicked: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "expected a one-line error, got: {err}");
    for n in needles {
        assert!(err.contains(n), "error should mention '{n}': {err}");
    }
}

#[test]
fn truncated_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = relu_model(17);
    m.graph.as_mut().unwrap().initializer.push(TensorProto {
        name: "w".into(),
        dims: vec![64],
        data_type: data_type::FLOAT,
        raw_data: vec![0u8; 256].into(),
        ..Default::default()
    });
    let bytes = m.encode_to_vec();
    let p = write(dir.path(), "t.onnx", &bytes[..bytes.len() - 40]);
    assert_one_line_error(&p, &["not a valid ONNX model", "truncated"]);
}

#[test]
fn not_onnx() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "x.onnx",
        b"this is plainly a text file and not a protobuf\n",
    );
    assert_one_line_error(&p, &["not a valid ONNX model"]);
    let empty = write(dir.path(), "empty.onnx", b"");
    assert_one_line_error(&empty, &["empty"]);
}

#[test]
fn cycle() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = relu_model(17);
    let g = m.graph.as_mut().unwrap();
    g.node = vec![
        node("Add", "a", &["x", "c"], &["b"]),
        node("Relu", "r", &["b"], &["c"]),
        node("Relu", "out", &["c"], &["y"]),
    ];
    let p = write(dir.path(), "cycle.onnx", &m.encode_to_vec());
    assert_one_line_error(&p, &["cycle"]);
}

#[test]
fn missing_initializer() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = relu_model(17);
    m.graph.as_mut().unwrap().node = vec![node("Add", "add_w", &["x", "w"], &["y"])];
    let p = write(dir.path(), "missing.onnx", &m.encode_to_vec());
    assert_one_line_error(&p, &["add_w", "'w'", "not produced"]);
}

#[test]
fn negative_and_absurd_dims() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = relu_model(17);
    m.graph.as_mut().unwrap().input = vec![value_info("x", &[1, -4])];
    let p = write(dir.path(), "neg.onnx", &m.encode_to_vec());
    assert_one_line_error(&p, &["negative dimension -4"]);

    let mut m = relu_model(17);
    m.graph.as_mut().unwrap().input = vec![value_info("x", &[1 << 50, 1 << 50])];
    let p = write(dir.path(), "huge.onnx", &m.encode_to_vec());
    assert_one_line_error(&p, &["absurdly large"]);

    // An initializer claiming a huge shape with little data must not allocate.
    let mut m = relu_model(17);
    m.graph.as_mut().unwrap().initializer.push(TensorProto {
        name: "big".into(),
        dims: vec![1 << 20, 1 << 20],
        data_type: data_type::FLOAT,
        raw_data: vec![0u8; 16].into(),
        ..Default::default()
    });
    let p = write(dir.path(), "bigdata.onnx", &m.encode_to_vec());
    assert_one_line_error(&p, &["big"]);
}

#[test]
fn mismatched_initializer_size() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = relu_model(17);
    m.graph.as_mut().unwrap().initializer.push(TensorProto {
        name: "w".into(),
        dims: vec![2, 3],
        data_type: data_type::FLOAT,
        raw_data: vec![0u8; 20].into(),
        ..Default::default()
    });
    let p = write(dir.path(), "size.onnx", &m.encode_to_vec());
    assert_one_line_error(&p, &["'w'", "20 bytes", "needs 24"]);
}

#[test]
fn unsupported_ops_are_all_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = relu_model(17);
    let g = m.graph.as_mut().unwrap();
    g.node = vec![
        node("FancyOp", "first_bad", &["x"], &["a"]),
        node("Relu", "fine", &["a"], &["b"]),
        node("OtherOp", "second_bad", &["b"], &["y"]),
    ];
    let p = write(dir.path(), "unsupported.onnx", &m.encode_to_vec());
    assert_one_line_error(
        &p,
        &[
            "2 unsupported operators",
            "first_bad",
            "FancyOp",
            "second_bad",
            "OtherOp",
            "opset 17",
        ],
    );
}

#[test]
fn opset_too_new() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "new.onnx", &relu_model(99).encode_to_vec());
    assert_one_line_error(&p, &["opset 99", "newer"]);
}

#[test]
fn external_data_outside_model_folder() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = relu_model(17);
    m.graph.as_mut().unwrap().initializer.push(TensorProto {
        name: "w".into(),
        dims: vec![4],
        data_type: data_type::FLOAT,
        data_location: 1,
        external_data: vec![StringStringEntryProto {
            key: "location".into(),
            value: "../../etc/passwd".into(),
        }],
        ..Default::default()
    });
    let p = write(dir.path(), "ext.onnx", &m.encode_to_vec());
    assert_one_line_error(&p, &["'w'", "inside the model's folder"]);
}

#[test]
fn unknown_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = relu_model(17);
    m.graph.as_mut().unwrap().initializer.push(TensorProto {
        name: "w".into(),
        dims: vec![1],
        data_type: 77,
        raw_data: vec![0u8; 4].into(),
        ..Default::default()
    });
    let p = write(dir.path(), "dtype.onnx", &m.encode_to_vec());
    assert_one_line_error(&p, &["'w'", "unknown data type 77"]);
}

fn matmul_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models/matmul_2d")
}

/// `kiln run --reference` on the matmul_2d fixture with `data` as its `input:0`.
fn run_matmul_fixture(data: &Path, extra: &[&std::ffi::OsStr]) -> std::process::Output {
    let fx = matmul_fixture();
    kiln()
        .arg("run")
        .arg(fx.join("model.onnx"))
        .arg("--input")
        .arg(format!("input:0={}", data.display()))
        .arg("--input")
        .arg(format!("weights={}", fx.join("inputs/weights.npy").display()))
        .args(extra)
        .arg("--reference")
        .output()
        .expect("kiln runs")
}

/// `kiln run --output-dir` names each file after its output, with characters outside
/// `[A-Za-z0-9._-]` replaced, and writes what the reference interpreter computed.
#[test]
fn run_writes_sanitized_output_files() {
    let fx = matmul_fixture();
    let dir = tempfile::tempdir().unwrap();
    let out = run_matmul_fixture(
        &fx.join("inputs/input_0.npy"),
        &["--output-dir".as_ref(), dir.path().as_os_str()],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let written = kiln_frontend::npy::read_npy(&dir.path().join("MatMul_output_0.npy")).expect("output file");
    let expected = kiln_frontend::npy::read_npy(&fx.join("expected/MatMul_output_0.npy")).unwrap();
    assert_eq!(written.shape(), expected.shape());
    let (a, e) = (written.to_f64_vec(), expected.to_f64_vec());
    assert!(a
        .iter()
        .zip(&e)
        .all(|(x, y)| (x - y).abs() <= 1e-5 + 1e-4 * y.abs()));
}

#[test]
fn run_rejects_wrong_input_shape() {
    // The weights file where the data input belongs: wrong shape.
    let out = run_matmul_fixture(&matmul_fixture().join("inputs/weights.npy"), &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("'input:0'") && err.contains("weights.npy") && err.contains("expected f32[5,7]"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}
