//! Models exported with dynamic shape arithmetic, compiled with their symbolic dimensions bound
//! (`kiln compile --input-shape`), must come out of the CPU pipeline with no shape arithmetic
//! left: `freeze` folds every `Shape → Gather → Unsqueeze → Concat` chain into constants.

use kiln_frontend::{load_model, ImportOptions};
use kiln_optimizer::cpu_pipeline;
use std::path::Path;

fn frozen_ops(model: &str, input: &str, shape: &[usize]) -> Vec<&'static str> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/models")
        .join(model)
        .join("model.onnx");
    let opts = ImportOptions {
        input_shapes: vec![(input.to_string(), shape.to_vec())],
        ..ImportOptions::default()
    };
    let mut graph = load_model(&path, &opts).expect("import").graph;
    let imported: Vec<&str> = graph.nodes().iter().map(|n| n.op.name()).collect();
    assert!(
        imported.contains(&"Shape"),
        "{model} no longer has shape arithmetic to fold"
    );
    cpu_pipeline().run(&mut graph).expect("passes");
    graph.nodes().iter().map(|n| n.op.name()).collect()
}

fn assert_no_shape_arithmetic(model: &str, input: &str, shape: &[usize]) {
    let ops = frozen_ops(model, input, shape);
    for op in [
        "Shape",
        "Size",
        "Gather",
        "Concat",
        "Unsqueeze",
        "Squeeze",
        "Slice",
        "Cast",
    ] {
        assert!(!ops.contains(&op), "{model}: {op} left after freeze: {ops:?}");
    }
}

#[test]
fn dynamic_shape_arith_leaves_no_shape_chains() {
    assert_no_shape_arithmetic("dynamic_shape_arith", "x", &[2, 3, 16]);
}

#[test]
fn dynamic_batch_leaves_no_shape_chains() {
    assert_no_shape_arithmetic("dynamic_batch", "input", &[2, 3, 16, 16]);
}
