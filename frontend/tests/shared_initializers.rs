//! `ImportOptions::shared_initializers`: a second import of a model (the batch-range probe)
//! shares the first import's weights instead of decoding its own, and decodes any initializer
//! the shared list does not match (another type or another name).

use kiln_frontend::onnx::import::leading_constants;
use kiln_frontend::{load_model, ImportOptions};
use kiln_ir::{Op, Tensor};
use std::path::Path;
use std::sync::Arc;

fn model() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models/dynamic_batch/model.onnx")
}

fn at_batch(n: usize) -> ImportOptions {
    ImportOptions {
        input_shapes: vec![("input".into(), vec![n, 3, 16, 16])],
        batch_inputs: vec!["input".into()],
        ..ImportOptions::default()
    }
}

/// The constants of `g`'s leading Constant nodes (its initializers), by node name.
fn initializers(g: &kiln_ir::Graph) -> Vec<(String, Arc<Tensor>)> {
    g.nodes()
        .iter()
        .map_while(|n| match n.op {
            Op::Constant(c) => Some((n.name.clone(), g.consts()[c.0 as usize].clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_second_import_shares_the_first_imports_weights() {
    let first = load_model(&model(), &at_batch(1)).unwrap().graph;
    let shared = leading_constants(&first);
    assert!(shared.len() >= 2, "the fixture has weights");

    let mut opts = at_batch(3);
    opts.shared_initializers = shared.clone();
    let second = load_model(&model(), &opts).unwrap().graph;
    let (a, b) = (initializers(&first), initializers(&second));
    assert_eq!(a.len(), b.len());
    for ((name_a, ta), (name_b, tb)) in a.iter().zip(&b) {
        assert_eq!(name_a, name_b);
        assert!(Arc::ptr_eq(ta, tb), "'{name_a}' was decoded again");
    }

    // A shared tensor of another type is not taken: that initializer is decoded from the file.
    let mut opts = at_batch(3);
    opts.shared_initializers = shared.clone();
    opts.shared_initializers[0].1 = Arc::new(Tensor::scalar(0f32));
    let third = load_model(&model(), &opts).unwrap().graph;
    let c = initializers(&third);
    assert!(!Arc::ptr_eq(&a[0].1, &c[0].1));
    assert_eq!(*a[0].1, *c[0].1, "decoded to the same values");
    assert!(Arc::ptr_eq(&a[1].1, &c[1].1));

    // Nor one under another name, even of the right type.
    let mut opts = at_batch(3);
    opts.shared_initializers = shared;
    opts.shared_initializers[1].0 = "not_this_one".into();
    let fourth = load_model(&model(), &opts).unwrap().graph;
    let d = initializers(&fourth);
    assert!(!Arc::ptr_eq(&a[1].1, &d[1].1));
    assert_eq!(*a[1].1, *d[1].1, "decoded to the same values");
    assert!(Arc::ptr_eq(&a[0].1, &d[0].1));
}
