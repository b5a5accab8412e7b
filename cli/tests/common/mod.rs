//! Helpers shared by the CLI tests: the built binary and small ONNX models made in the test.
#![allow(dead_code)]

use kiln_frontend::onnx::proto::*;
use prost::Message;
use std::path::{Path, PathBuf};
use std::process::Command;

pub fn kiln() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
}

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/models")
        .join(name)
}

pub fn tensor_type(dims: &[i64]) -> Option<TypeProto> {
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

pub fn value_info(name: &str, dims: &[i64]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: tensor_type(dims),
        doc_string: String::new(),
    }
}

pub fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        name: name.into(),
        op_type: op.into(),
        ..Default::default()
    }
}

/// `x: f32[1,4]` through one node of type `op` (named `name`) to `y`, at opset 17.
pub fn one_node_model(op: &str, name: &str) -> ModelProto {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(GraphProto {
            name: "g".into(),
            node: vec![node(op, name, &["x"], &["y"])],
            input: vec![value_info("x", &[1, 4])],
            output: vec![value_info("y", &[1, 4])],
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn write_model(dir: &Path, file: &str, model: &ModelProto) -> PathBuf {
    let p = dir.join(file);
    std::fs::write(&p, model.encode_to_vec()).unwrap();
    p
}
