//! The `fuse` pass on the encoder fixtures: how many patterns it recognises, and that the
//! interpreter gives the same outputs before and after (the pass output is checked by `ir::eval`).

use kiln_frontend::ImportOptions;
use kiln_ir::{Graph, Op, Tensor};
use kiln_optimizer::passes::fuse::Fuse;
use kiln_optimizer::Pass;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn load(model_dir: &Path) -> (Graph, HashMap<String, Tensor>) {
    let model = kiln_frontend::load_model(&model_dir.join("model.onnx"), &ImportOptions::default()).unwrap();
    let mut inputs = HashMap::new();
    for (name, _) in model.graph.input_types() {
        let t = kiln_frontend::npy::read_npy(&model_dir.join("inputs").join(format!("{name}.npy"))).unwrap();
        inputs.insert(name.to_string(), t);
    }
    (model.graph, inputs)
}

fn count(g: &Graph, f: impl Fn(&Op) -> bool) -> usize {
    g.nodes().iter().filter(|n| f(&n.op)).count()
}

fn max_diff(a: &[Tensor], b: &[Tensor]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            assert_eq!(x.shape(), y.shape());
            x.to_f64_vec()
                .iter()
                .zip(y.to_f64_vec())
                .map(|(p, q)| (p - q).abs())
                .fold(0.0, f64::max)
        })
        .fold(0.0, f64::max)
}

/// Runs the pass and returns the fused graph after checking it against the original.
fn fuse_and_check(dir: &str) -> (Graph, usize) {
    let (mut g, inputs) = load(&repo().join(dir));
    let before = kiln_ir::eval::eval_graph_named(&g, inputs.clone()).unwrap();
    let n = Fuse.run(&mut g).unwrap();
    eprintln!("{dir}: {n} rewrites\n{g}");
    kiln_ir::verify(&g).unwrap();
    let after = kiln_ir::eval::eval_graph_named(&g, inputs).unwrap();
    let d = max_diff(&before, &after);
    assert!(d < 1e-4, "{dir}: outputs differ by {d}");
    (g, n)
}

#[test]
fn bert_tiny_attention_and_gelu() {
    let (g, n) = fuse_and_check("fixtures/models/bert_tiny");
    assert_eq!(
        count(&g, |o| matches!(o, Op::Attention(a) if a.q_num_heads == 4)),
        2
    );
    assert_eq!(
        count(&g, |o| matches!(
            o,
            Op::Unary(kiln_ir::Unary::Gelu { tanh: false })
        )),
        2
    );
    assert_eq!(
        count(&g, |o| matches!(o, Op::Softmax { .. } | Op::Transpose { .. })),
        0
    );
    assert_eq!(n, 4);
}

#[test]
fn bert_tiny_decomposed_layer_norm() {
    let (g, n) = fuse_and_check("fixtures/models/bert_tiny_decomposed_ln");
    assert_eq!(count(&g, |o| matches!(o, Op::LayerNorm { .. })), 4);
    assert_eq!(
        count(&g, |o| matches!(
            o,
            Op::Reduce { .. } | Op::Unary(kiln_ir::Unary::Sqrt)
        )),
        0
    );
    assert_eq!(count(&g, |o| matches!(o, Op::Attention(_))), 2);
    assert_eq!(n, 8);
}
