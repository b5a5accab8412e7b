//! JIT tests of the integer products on `vpdpbusd` (`gemm::int8`): MatMulInteger with u8 A,
//! constant s8 B and A's zero point constant or given at run time, against `kiln_ir`'s
//! evaluator, exactly. Skipped (with a note) on a CPU without avx512_vnni.

use super::testing::run_kernel;
use crate::node::NodeInfo;
use crate::target::TargetDesc;
use crate::test_rng::TestRng as Rng;
use kiln_ir::{DType, Dim, Graph, Op, QuantOp, Tensor, TensorType};

/// A uniform byte.
fn byte(rng: &mut Rng) -> u8 {
    ((rng.next() + 1.0) * 128.0).min(255.0) as u8
}

/// Bytes in an f32 buffer, as `run_kernel` passes inputs.
fn as_words(bytes: &[u8]) -> Vec<f32> {
    let mut words = vec![0f32; bytes.len().div_ceil(4) + 1];
    for (i, chunk) in bytes.chunks(4).enumerate() {
        let mut w = [0u8; 4];
        w[..chunk.len()].copy_from_slice(chunk);
        words[i] = f32::from_le_bytes(w);
    }
    words
}

/// A's zero point: its value and whether it is a run-time input (else a constant).
type ZeroPoint = Option<(u8, bool)>;

/// Runs MatMulInteger of A `a_shape` (u8) by a constant s8 `[K, N]`, the zero point `za`
/// absent, constant or a run-time input; compares with the evaluator. Returns whether the
/// kernel took the node.
fn check(a_shape: &[usize], n: usize, za: ZeroPoint, b_zero: bool, seed: u64) -> bool {
    let host = TargetDesc::host().unwrap();
    let k = *a_shape.last().unwrap();
    let mut rng = Rng::new(seed);
    let a_len: usize = a_shape.iter().product();
    let a: Vec<u8> = (0..a_len).map(|_| byte(&mut rng)).collect();
    let b: Vec<i8> = (0..k * n).map(|_| byte(&mut rng) as i8).collect();
    let mut g = Graph::new("t");
    let shape = |s: &[usize]| s.iter().map(|&d| Dim::Fixed(d)).collect::<Vec<_>>();
    let av = g.add_input("a", TensorType::new(DType::U8, shape(a_shape)));
    let bv = g.add_const("b", Tensor::from_vec(vec![k, n], b.clone()));
    let mut inputs = vec![Tensor::from_vec(a_shape.to_vec(), a.clone())];
    // One entry per node input, absent ones included (the kernel's argument layout).
    let b_bytes: Vec<u8> = b.iter().map(|&v| v as u8).collect();
    let mut data = vec![
        Some(as_words(&a)),
        Some(as_words(&b_bytes)),
        None,
        Some(as_words(&[0])),
    ];
    let zv = match za {
        None => None,
        Some((z, false)) => {
            data[2] = Some(as_words(&[z]));
            Some(g.add_const("za", Tensor::scalar(z)))
        }
        Some((z, true)) => {
            inputs.push(Tensor::scalar(z));
            data[2] = Some(as_words(&[z]));
            Some(g.add_input("za", TensorType::new(DType::U8, vec![])))
        }
    };
    let bz = b_zero.then(|| g.add_const("zb", Tensor::scalar(0i8)));
    let y = g
        .add(
            "mm",
            Op::Quant(QuantOp::MatMulInteger),
            vec![Some(av), Some(bv), zv, bz],
            "y",
        )
        .unwrap();
    g.add_output("y", y);
    let want = kiln_ir::eval::eval_graph(&g, inputs).unwrap();
    let want = want[0].as_slice::<i32>().unwrap().to_vec();
    let node = NodeInfo::new(&g, y.node);
    data.truncate(node.n_inputs());
    let Some(kernel) = super::products::lower(&node, &host).unwrap() else {
        return false;
    };
    assert!(kernel.describe().contains("vpdpbusd"), "{}", kernel.describe());
    for threads in [1, 2] {
        let (out, _) = run_kernel(kernel.as_ref(), &node, &host, &data, want.len(), threads, 0);
        let got: Vec<i32> = out.iter().map(|f| f.to_bits() as i32).collect();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g, w,
                "A {a_shape:?} N={n} za={za:?}: element {i} ({threads} threads)"
            );
        }
    }
    true
}

#[test]
fn matmul_integer_is_exact() {
    if !TargetDesc::host().unwrap().has_int8_dot_kernels() {
        println!("skipped: this CPU has no avx512_vnni");
        return;
    }
    let cases: &[(&[usize], usize, ZeroPoint, bool)] = &[
        // One tile, no zero point.
        (&[12, 64], 32, None, false),
        // Row and column tails, a constant zero point and a zero weight zero point.
        (&[13, 36], 48, Some((128, false)), true),
        // Leading axes folded into M, a run-time zero point, several K blocks.
        (&[2, 7, 3072], 64, Some((3, true)), false),
        // BERT's shapes at sequence 8.
        (&[1, 8, 768], 768, Some((97, true)), false),
        (&[8, 768], 3072, Some((0, true)), false),
    ];
    for (i, &(a, n, za, bz)) in cases.iter().enumerate() {
        assert!(check(a, n, za, bz, i as u64 + 1), "case {i} was not lowered");
    }
}

#[test]
fn matmul_integer_declines_what_it_does_not_compute() {
    if !TargetDesc::host().unwrap().has_int8_dot_kernels() {
        println!("skipped: this CPU has no avx512_vnni");
        return;
    }
    // K not a multiple of 4, N not whole vectors: left to the kernel library.
    assert!(!check(&[4, 30], 32, None, false, 9));
    assert!(!check(&[4, 32], 20, None, false, 10));
}
