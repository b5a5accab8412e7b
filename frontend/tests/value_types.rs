//! `onnx::value_types`: the type of every value kiln can import, up to the nodes it cannot.

use kiln_frontend::onnx::proto::*;
use kiln_frontend::{onnx::value_types, ImportOptions};
use kiln_ir::{DType, TensorType};

fn node(op: &str, input: &str, output: &str) -> NodeProto {
    NodeProto {
        input: vec![input.into()],
        output: vec![output.into()],
        name: output.into(),
        op_type: op.into(),
        ..Default::default()
    }
}

fn dim(v: DimValue) -> Dimension {
    Dimension {
        value: Some(v),
        denotation: String::new(),
    }
}

#[test]
fn types_values_up_to_an_unknown_operator() {
    let x = ValueInfoProto {
        name: "x".into(),
        r#type: Some(TypeProto {
            value: Some(TypeValue::TensorType(TypeTensor {
                elem_type: data_type::FLOAT,
                shape: Some(TensorShapeProto {
                    dim: vec![
                        dim(DimValue::DimParam("batch".into())),
                        dim(DimValue::DimValue(3)),
                    ],
                }),
            })),
            denotation: String::new(),
        }),
        doc_string: String::new(),
    };
    let model = ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(GraphProto {
            node: vec![
                node("Relu", "x", "r"),
                node("Frobnicate", "r", "f"),
                node("Relu", "f", "z"),
            ],
            input: vec![x],
            output: vec![ValueInfoProto {
                name: "z".into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let opts = ImportOptions {
        input_shapes: vec![("x".into(), vec![2, 3])],
        ..ImportOptions::default()
    };
    let types = value_types(&model, ".".into(), &opts).unwrap();
    let bound = TensorType::fixed(DType::F32, &[2, 3]);
    assert_eq!(types.get("x"), Some(&bound));
    assert_eq!(types.get("r"), Some(&bound));
    assert!(!types.contains_key("f"));
    assert!(!types.contains_key("z"));
    // Importing the same model fails, naming the operator.
    let err = kiln_frontend::onnx::import_model(&model, ".".into(), &opts).unwrap_err();
    assert!(err.to_string().contains("Frobnicate"), "{err}");
}
