//! Attention with `nonpad_kv_seqlen` (each batch entry sees only its first `nonpad[b]` keys)
//! compiled to the f32 attention kernel: against the reference interpreter for lengths of
//! none, some (inside and at the edge of a tile), all and more than all of the keys, and a
//! negative one; with an f32 mask shorter than the keys; on one and two threads. The keys and
//! values past each length hold NaN in the compiled run and zeros in the reference's: the
//! kernel must never read them.

use kiln_ir::{AttentionAttrs, DType, Graph, Op, Tensor, TensorType};
use kiln_tests::compiled::{compile_graph, run_executable, WorkDir};

const B: usize = 2;
const H: usize = 2;
const SQ: usize = 5;
const T: usize = 37;
const D: usize = 8;
/// The mask covers this many keys; later ones are masked.
const MASK_KEYS: usize = 30;

fn graph() -> Graph {
    let mut g = Graph::new("attention_nonpad");
    let q = g.add_input("q", TensorType::fixed(DType::F32, &[B, H, SQ, D]));
    let k = g.add_input("k", TensorType::fixed(DType::F32, &[B, H, T, D]));
    let v = g.add_input("v", TensorType::fixed(DType::F32, &[B, H, T, D]));
    let mask = g.add_input("mask", TensorType::fixed(DType::F32, &[1, 1, SQ, MASK_KEYS]));
    let nonpad = g.add_input("nonpad", TensorType::fixed(DType::I64, &[B]));
    let y = g
        .add(
            "attn",
            Op::Attention(AttentionAttrs::default()),
            vec![Some(q), Some(k), Some(v), Some(mask), None, None, Some(nonpad)],
            "y",
        )
        .unwrap();
    g.add_output("y", y);
    g
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.5 - 1.0)
        .collect()
}

/// K or V with the keys of batch `b` from `lens[b]` on set to `fill`.
fn keys(seed: usize, lens: &[i64; B], fill: f32) -> Tensor {
    let mut x = values(B * H * T * D, seed);
    for (b, &len) in lens.iter().enumerate() {
        let from = len.clamp(0, T as i64) as usize;
        for h in 0..H {
            for t in from..T {
                let at = ((b * H + h) * T + t) * D;
                x[at..at + D].fill(fill);
            }
        }
    }
    Tensor::from_vec(vec![B, H, T, D], x)
}

#[test]
fn nonpad_lengths_bound_the_keys_each_batch_entry_reads() {
    let g = graph();
    let work = WorkDir::new("attention_nonpad");
    let exe = work.0.join("model");
    let summary = compile_graph(&g, "attention_nonpad", kiln_codegen::Emit::Exe, &exe).unwrap();
    assert!(
        summary
            .kernel_lines
            .iter()
            .any(|l| l.contains("kiln_uk_attention_f32")),
        "the f32 kernel takes nonpad lengths: {:#?}",
        summary.kernel_lines
    );
    let q = Tensor::from_vec(vec![B, H, SQ, D], values(B * H * SQ * D, 1));
    let mask = Tensor::from_vec(vec![1, 1, SQ, MASK_KEYS], values(SQ * MASK_KEYS, 4));
    // 16 and 32 are tile edges (16- and 32-column tiles).
    for lens in [[0, 23], [T as i64, 50], [-3, 1], [16, 32]] {
        let nonpad = Tensor::from_vec(vec![B], lens.to_vec());
        let reference_inputs = vec![
            q.clone(),
            keys(2, &lens, 0.0),
            keys(3, &lens, 0.0),
            mask.clone(),
            nonpad.clone(),
        ];
        let want = kiln_ir::eval::eval_graph(&g, reference_inputs).unwrap();
        let feeds = [
            ("q".to_string(), q.clone()),
            ("k".to_string(), keys(2, &lens, f32::NAN)),
            ("v".to_string(), keys(3, &lens, f32::NAN)),
            ("mask".to_string(), mask.clone()),
            ("nonpad".to_string(), nonpad),
        ];
        for threads in [1, 2] {
            let got = run_executable(&exe, &g, &feeds, &work.0, threads).unwrap();
            let (got, want) = (
                got[0].as_slice::<f32>().unwrap(),
                want[0].as_slice::<f32>().unwrap(),
            );
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5 + 1e-4 * w.abs(),
                    "lengths {lens:?}, {threads} threads: element {i} is {g}, want {w}"
                );
            }
        }
    }
}
