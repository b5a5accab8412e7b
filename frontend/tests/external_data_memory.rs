//! Importing a model's external data keeps its weights resident once: the mapped file's pages
//! are handed back as each tensor is decoded, so the import's peak is the decoded weights, not
//! the decoded weights and the mapped file side by side. This test runs alone in its process
//! (its own test binary), so the process's peak resident size measures the import.

use kiln_frontend::onnx::proto::*;
use kiln_frontend::{load_model, ImportOptions};
use prost::Message;
use std::io::Write;

/// The process's peak resident set size in bytes (`VmHWM`).
fn peak_resident_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

fn value_info(name: &str, dims: &[i64]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
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
        }),
        doc_string: String::new(),
    }
}

#[test]
fn external_weights_are_resident_once_after_import() {
    // 16 weights of 8 MiB (f32) in one file, each added to the input in turn: a tensor's own
    // bytes are resident twice while it is decoded, the model's only once.
    const WEIGHTS: usize = 16;
    const ELEMENTS: usize = 2 << 20;
    let weight_bytes = WEIGHTS * ELEMENTS * 4;
    let dir = tempfile::tempdir().unwrap();

    // Written a MiB at a time, so that writing it does not raise the peak.
    let mut file = std::fs::File::create(dir.path().join("w.bin")).unwrap();
    let chunk: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    for _ in 0..weight_bytes / chunk.len() {
        file.write_all(&chunk).unwrap();
    }
    drop(file);

    let model = ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(GraphProto {
            name: "g".into(),
            node: (0..WEIGHTS)
                .map(|i| NodeProto {
                    input: vec![
                        if i == 0 { "x".into() } else { format!("y{}", i - 1) },
                        format!("w{i}"),
                    ],
                    output: vec![if i + 1 == WEIGHTS {
                        "y".into()
                    } else {
                        format!("y{i}")
                    }],
                    name: format!("add{i}"),
                    op_type: "Add".into(),
                    ..Default::default()
                })
                .collect(),
            initializer: (0..WEIGHTS)
                .map(|i| TensorProto {
                    name: format!("w{i}"),
                    dims: vec![ELEMENTS as i64],
                    data_type: data_type::FLOAT,
                    data_location: 1,
                    external_data: [
                        ("location", "w.bin".to_string()),
                        ("offset", (i * ELEMENTS * 4).to_string()),
                    ]
                    .into_iter()
                    .map(|(key, value)| StringStringEntryProto {
                        key: key.into(),
                        value,
                    })
                    .collect(),
                    ..Default::default()
                })
                .collect(),
            input: vec![value_info("x", &[ELEMENTS as i64])],
            output: vec![value_info("y", &[ELEMENTS as i64])],
            ..Default::default()
        }),
        ..Default::default()
    };
    let path = dir.path().join("m.onnx");
    std::fs::write(&path, model.encode_to_vec()).unwrap();

    let before = peak_resident_bytes();
    let graph = load_model(&path, &ImportOptions::default()).unwrap().graph;
    let grown = peak_resident_bytes().saturating_sub(before);

    // The decoded weights are the right bytes...
    let weights: Vec<_> = graph.consts().iter().filter(|t| t.len() == ELEMENTS).collect();
    assert_eq!(weights.len(), WEIGHTS, "every weight is decoded");
    for w in weights {
        let first = w.as_slice::<f32>().unwrap()[0];
        assert_eq!(first.to_le_bytes(), chunk[..4]);
    }
    // ...and the import's peak holds them once: with the mapped pages kept it is twice.
    assert!(
        grown < weight_bytes * 3 / 2,
        "the import grew the peak resident size by {} MiB for {} MiB of weights",
        grown >> 20,
        weight_bytes >> 20
    );
}
