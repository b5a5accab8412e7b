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

/// Inputs with values in [-3, 3) from a fixed LCG, masks (named `mask`) in {0, -1e4}.
fn pseudo_random_inputs(g: &Graph) -> HashMap<String, Tensor> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 6.0 - 3.0
    };
    g.input_types()
        .map(|(name, ty)| {
            let shape = ty.fixed_shape().unwrap();
            let n = shape.iter().product();
            let data: Vec<f32> = (0..n)
                .map(|_| match name {
                    "mask" if next() < -1.0 => -1e4,
                    "mask" => 0.0,
                    _ => next(),
                })
                .collect();
            (name.to_string(), Tensor::from_vec(shape, data))
        })
        .collect()
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
    let (g, inputs) = load(&repo().join(dir));
    check(g, inputs, dir)
}

fn check(mut g: Graph, inputs: HashMap<String, Tensor>, dir: &str) -> (Graph, usize) {
    let before = kiln_ir::eval::eval_graph_named(&g, inputs.clone()).unwrap();
    let n = Fuse.run(&mut g).unwrap();
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

/// One golden case of `tests/golden/fuse`: the fused graph's operators (in order, sources
/// left out) and the rewrite count; the interpreter's outputs must not change.
fn golden(case: &str, want_ops: &[&str], want_rewrites: usize) {
    let path = repo()
        .join("optimizer/tests/golden/fuse")
        .join(format!("{case}.onnx"));
    let g = kiln_frontend::load_model(&path, &ImportOptions::default())
        .unwrap()
        .graph;
    let inputs = pseudo_random_inputs(&g);
    let (g, n) = check(g, inputs, case);
    let ops: Vec<&str> = g
        .nodes()
        .iter()
        .filter(|n| !matches!(n.op, Op::Input | Op::Constant(_)))
        .map(|n| n.op.name())
        .collect();
    assert_eq!(ops, want_ops, "{case}:\n{g}");
    assert_eq!(n, want_rewrites, "{case}");
}

#[test]
fn golden_layer_norm() {
    golden("layernorm_decomposed", &["LayerNormalization"], 1);
}

#[test]
fn golden_rms_norm() {
    golden("rmsnorm_t5", &["RMSNormalization"], 1);
    golden("rmsnorm_reciprocal", &["RMSNormalization"], 1);
}

#[test]
fn golden_softmax() {
    golden("softmax_stable", &["Softmax"], 1);
    golden("softmax_reciprocal", &["Softmax"], 1);
}

#[test]
fn golden_gelu() {
    golden("gelu_erf", &["Gelu"], 1);
    golden("gelu_tanh", &["Gelu"], 1);
}

#[test]
fn golden_attention() {
    golden("attention_heads", &["Attention"], 1);
    golden("attention_4d", &["Attention"], 1);
}

#[test]
fn golden_nothing_to_fuse() {
    // GELU with 0.6 for 0.5; a sum over two axes; a variance without its epsilon.
    let ops = [
        "Mul",
        "Mul",
        "Exp",
        "ReduceMean",
        "Erf",
        "ReduceSum",
        "Sub",
        "Add",
        "Div",
        "Mul",
        "Mul",
        "ReduceMean",
        "Sqrt",
        "Div",
    ];
    golden("unchanged", &ops, 0);
}

/// The attention of PyTorch's `scaled_dot_product_attention` exports (Q and Kᵀ each scaled,
/// the softmax guarded by `Where(IsNaN)`, heads split and merged through whatever reshapes
/// and transposes the exporter wrote) becomes one 3-D Attention per layer, run by
/// `pipelines` after `freeze` as the compiler does.
fn exported_attention(dir: &str) -> Graph {
    let (mut g, inputs) = load(&repo().join(dir));
    kiln_optimizer::passes::freeze::Freeze.run(&mut g).unwrap();
    let (g, _) = check(g, inputs, dir);
    assert_eq!(
        count(&g, |o| matches!(o, Op::Attention(a) if a.q_num_heads == 4)),
        2,
        "{dir}"
    );
    assert_eq!(
        count(&g, |o| matches!(
            o,
            Op::Softmax { .. } | Op::Unary(kiln_ir::Unary::IsNaN)
        )),
        0,
        "{dir}: every softmax and its guard is inside an Attention"
    );
    g
}

#[test]
fn hf_bert_export_attention_reads_the_projections() {
    let g = exported_attention("fixtures/models/hf_bert_export");
    // The head split (Reshape, Transpose; Kᵀ by a second Transpose) and merge are gone:
    // Attention reads the projections' outputs as they are.
    assert_eq!(count(&g, |o| matches!(o, Op::Transpose { .. })), 0);
}

#[test]
fn hf_gpt2_export_attention_reads_the_projections() {
    let g = exported_attention("fixtures/models/hf_gpt2_export");
    // Kᵀ went through a [B·H, S, D] reshape and a 3-D transpose; the merge ends in a 2-D
    // reshape for the next product; the packed QKV projection, split by Split, became three
    // products (2 layers: 6, beside the output projection, 2 MLP products and the LM head).
    assert_eq!(
        count(&g, |o| matches!(o, Op::Transpose { .. } | Op::Split { .. })),
        0
    );
    assert_eq!(count(&g, |o| matches!(o, Op::MatMul)), 2 * (3 + 1 + 2) + 1);
}

#[test]
fn torch_encoder_export_attention_reads_the_projections() {
    let g = exported_attention("fixtures/models/torch_transformer_encoder_export");
    // nn.MultiheadAttention's packed projection is reshaped to [S, 1, 3, D], transposed and
    // picked apart by Gathers: three products instead, and no copy left around attention.
    assert_eq!(
        count(&g, |o| matches!(o, Op::Transpose { .. } | Op::Gather { .. })),
        0
    );
}
