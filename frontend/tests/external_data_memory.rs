//! Importing a model's external data or a safetensors file keeps its weights resident once:
//! the mapped file's pages are handed back as each tensor is decoded, so the import's peak is
//! the decoded weights, not the decoded weights and the mapped file side by side. These tests
//! have their process (their own test binary) to themselves and take turns, so the process's
//! peak resident size measures one import.

use kiln_frontend::onnx::proto::*;
use kiln_frontend::weights::read_safetensors;
use kiln_frontend::{load_model, ImportOptions};
use prost::Message;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

// 16 weights of 8 MiB (f32) in one file: a tensor's own bytes are resident twice while it is
// decoded, the model's only once.
const WEIGHTS: usize = 16;
const ELEMENTS: usize = 2 << 20;
const WEIGHT_BYTES: usize = WEIGHTS * ELEMENTS * 4;

/// One measurement at a time.
static TURN: Mutex<()> = Mutex::new(());

/// A size field of /proc/self/status in bytes (`VmHWM`: the peak resident size, `VmRSS`: the
/// current one).
fn status_bytes(field: &str) -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    let kib: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// How much `f` raises the process's peak resident size above the resident size before it.
/// The peak is reset first (`clear_refs` 5) and the reset checked, so that an earlier test's
/// peak cannot hide this one's.
fn peak_growth<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    std::fs::write("/proc/self/clear_refs", "5").expect("resetting the peak resident size");
    let before = status_bytes("VmRSS:");
    assert!(
        status_bytes("VmHWM:") < before + (16 << 20),
        "the peak resident size was not reset"
    );
    let out = f();
    (out, status_bytes("VmHWM:").saturating_sub(before))
}

/// The bytes of the weights file, written a MiB at a time (after `header`) so that writing it
/// does not raise the peak. Returns the MiB pattern every weight starts with.
fn write_weights(path: &Path, header: &[u8]) -> Vec<u8> {
    let mut file = std::fs::File::create(path).unwrap();
    file.write_all(header).unwrap();
    let chunk: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    for _ in 0..WEIGHT_BYTES / chunk.len() {
        file.write_all(&chunk).unwrap();
    }
    chunk
}

/// Every weight decoded, with the file's bytes, and the import's peak within 1.5 times the
/// weights (twice them when the mapped pages stay).
fn assert_resident_once(weights: Vec<&kiln_ir::Tensor>, chunk: &[u8], grown: usize) {
    assert_eq!(weights.len(), WEIGHTS, "every weight is decoded");
    for w in weights {
        assert_eq!(w.len(), ELEMENTS);
        let first = w.as_slice::<f32>().unwrap()[0];
        assert_eq!(first.to_le_bytes(), chunk[..4]);
    }
    assert!(
        grown < WEIGHT_BYTES * 3 / 2,
        "the import grew the peak resident size by {} MiB for {} MiB of weights",
        grown >> 20,
        WEIGHT_BYTES >> 20
    );
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
    let dir = tempfile::tempdir().unwrap();
    let chunk = write_weights(&dir.path().join("w.bin"), &[]);
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

    let (graph, grown) = peak_growth(|| load_model(&path, &ImportOptions::default()).unwrap().graph);
    let weights = graph
        .consts()
        .iter()
        .filter(|t| t.len() == ELEMENTS)
        .map(|t| &**t)
        .collect();
    assert_resident_once(weights, &chunk, grown);
}

#[test]
fn safetensors_weights_are_resident_once_after_reading() {
    let dir = tempfile::tempdir().unwrap();
    let entries: Vec<String> = (0..WEIGHTS)
        .map(|i| {
            let (start, end) = (i * ELEMENTS * 4, (i + 1) * ELEMENTS * 4);
            format!(r#""w{i}":{{"dtype":"F32","shape":[{ELEMENTS}],"data_offsets":[{start},{end}]}}"#)
        })
        .collect();
    let mut json = format!("{{{}}}", entries.join(",")).into_bytes();
    while json.len() % 8 != 0 {
        json.push(b' ');
    }
    let mut header = (json.len() as u64).to_le_bytes().to_vec();
    header.extend(json);
    let path = dir.path().join("w.safetensors");
    let chunk = write_weights(&path, &header);

    let (tensors, grown) = peak_growth(|| read_safetensors(&path).unwrap());
    assert_resident_once(tensors.iter().map(|(_, t)| t).collect(), &chunk, grown);
}
