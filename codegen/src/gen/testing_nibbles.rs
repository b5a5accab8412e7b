//! JIT tests of the products on block-quantized weights (`gemm::nibbles` and, for up to 4
//! rows, `gemm::nibble_gemv`): BlockQuantizedMatMul against an f64 product of the weights
//! `kiln_ir` dequantizes, with cut row and column panels, cut last blocks of odd and even
//! length, blocks across K-block boundaries, a fused bias and activation, on 1 and 2 threads; and the packed weights' size (half a byte per weight, then an f32 scale and a
//! byte zero point per block).

use super::testing::{as_words, run_kernel};
use crate::kernel::epilogue::{Activation, Bias, Epilogue};
use crate::node::NodeInfo;
use crate::target::TargetDesc;
use crate::test_rng::TestRng as Rng;
use kiln_ir::{DType, Dim, Graph, Op, QuantOp, Tensor, TensorType};

/// A value in `0..16`.
fn nibble(rng: &mut Rng) -> u8 {
    ((rng.next() + 1.0) * 8.0).clamp(0.0, 15.0) as u8
}

/// A BlockQuantizedMatMul of A `a_shape` by random 4-bit `Q [N, K]` in blocks of `block`:
/// the graph, its output, and the kernel's input data.
struct Case {
    g: Graph,
    y: kiln_ir::ValueId,
    a: Vec<f32>,
    q: Vec<u8>,
    scales: Vec<f32>,
    zeros: Vec<u8>,
    data: Vec<Option<Vec<f32>>>,
}

fn case(a_shape: &[usize], n: usize, block: usize, seed: u64) -> Case {
    let k = *a_shape.last().unwrap();
    let blocks = k.div_ceil(block);
    let mut rng = Rng::new(seed);
    let a_len: usize = a_shape.iter().product();
    let a = rng.vec(a_len);
    let q: Vec<u8> = (0..n * k).map(|_| nibble(&mut rng)).collect();
    let zeros: Vec<u8> = (0..n * blocks).map(|_| nibble(&mut rng)).collect();
    let scales: Vec<f32> = (0..n * blocks)
        .map(|_| 0.01 + 0.05 * (rng.next() + 1.0))
        .collect();
    let mut g = Graph::new("t");
    let dims = a_shape.iter().map(|&d| Dim::Fixed(d)).collect();
    let av = g.add_input("a", TensorType::new(DType::F32, dims));
    let qv = g.add_const("q", Tensor::from_vec(vec![n, k], q.clone()));
    let sv = g.add_const("s", Tensor::from_vec(vec![n, blocks], scales.clone()));
    let zv = g.add_const("z", Tensor::from_vec(vec![n, blocks], zeros.clone()));
    let op = Op::Quant(QuantOp::BlockQuantizedMatMul {
        bits: 4,
        block_size: block,
    });
    let y = g
        .add("mm", op, vec![Some(av), Some(qv), Some(sv), Some(zv)], "y")
        .unwrap();
    g.add_output("y", y);
    let scale_bytes: Vec<u8> = scales.iter().flat_map(|s| s.to_le_bytes()).collect();
    let data = vec![
        Some(a.clone()),
        Some(as_words(&q)),
        Some(as_words(&scale_bytes)),
        Some(as_words(&zeros)),
    ];
    Case {
        g,
        y,
        a,
        q,
        scales,
        zeros,
        data,
    }
}

/// The targets whose kernels run here: this machine's and, on x86-64, the AVX2 build (8-lane
/// vectors: other panels, another unpacking).
fn targets() -> Vec<TargetDesc> {
    let host = TargetDesc::host().unwrap();
    let mut v = vec![];
    if host.arch == crate::target::Arch::X86_64 {
        v.push(TargetDesc::select(None, Some("x86-64-v3")).unwrap());
    }
    v.push(host);
    v
}

/// Runs `A [a_shape] · Wᵀ` for 4-bit `Q [N, K]` in blocks of `block` along K, bare and with a
/// column bias and Relu, against the reference, for every target of `targets`.
fn check(a_shape: &[usize], n: usize, block: usize, seed: u64) {
    for host in targets() {
        check_on(&host, a_shape, n, block, seed);
    }
}

fn check_on(host: &TargetDesc, a_shape: &[usize], n: usize, block: usize, seed: u64) {
    let k = *a_shape.last().unwrap();
    let blocks = k.div_ceil(block);
    let a_len: usize = a_shape.iter().product();
    let Case {
        g,
        y,
        a,
        q,
        scales,
        zeros,
        data,
    } = case(a_shape, n, block, seed);

    // The reference: the weights as the evaluator dequantizes them, summed in f64, with the
    // bound of f32 summation error on each element.
    let w = kiln_ir::eval::eval_graph(&g, vec![Tensor::from_vec(a_shape.to_vec(), a.clone())]).unwrap();
    assert_eq!(w[0].len(), a_len / k * n);
    let wt = |col: usize, kk: usize| {
        let b = col * blocks + kk / block;
        (f32::from(q[col * k + kk]) - f32::from(zeros[b])) * scales[b]
    };
    let rows = a_len / k;
    let mut want = vec![0f64; rows * n];
    let mut bound = vec![0f64; rows * n];
    for r in 0..rows {
        for col in 0..n {
            for kk in 0..k {
                let p = f64::from(a[r * k + kk]) * f64::from(wt(col, kk));
                want[r * n + col] += p;
                bound[r * n + col] += p.abs();
            }
        }
    }

    let node = NodeInfo::new(&g, y.node);
    let bias: Vec<f32> = (0..n).map(|j| (j as f32 - 5.0) * 0.125).collect();
    let fused = Epilogue::new(Bias::PerCol(bias.clone()), None, Activation::Relu);
    for epi in [None, Some(fused)] {
        let kernel = match &epi {
            None => super::products::lower(&node, host),
            Some(e) => super::products::lower_fused(&node, host, e.clone()),
        }
        .unwrap()
        .expect("the GEMM takes block-quantized weights");
        let what = kernel.describe();
        let kind = if rows <= 4 { "gemv-4bit" } else { "matmul-4bit" };
        assert!(what.starts_with(kind), "{what}");
        // Half a byte per weight (panels padded to NR columns), then the parameters.
        let nr = super::gemm::Tile::for_target(host).nr();
        let n_padded = n.div_ceil(nr) * nr;
        let weights = kernel.packed_constants()[0].bytes.len();
        let nibble_bytes = (n_padded * k / 2).next_multiple_of(64);
        assert_eq!(weights, nibble_bytes + blocks * n_padded * 5, "{what}");
        for threads in [1, 2] {
            let (got, _) = run_kernel(kernel.as_ref(), &node, host, &data, rows * n, threads, 0);
            for (i, &gv) in got.iter().enumerate() {
                let col = i % n;
                let w = match epi {
                    None => want[i],
                    Some(_) => (want[i] + f64::from(bias[col])).max(0.0),
                };
                let tol = 1e-5 * bound[i] + 1e-6;
                assert!(
                    (f64::from(gv) - w).abs() <= tol,
                    "{what} A {a_shape:?} N={n} block={block} ({threads} threads, epilogue {}): element {i}: got {gv}, want {w}",
                    epi.is_some()
                );
            }
        }
    }
}

#[test]
fn matrix_vector_with_cut_panels_and_a_cut_last_block() {
    check(&[1, 50], 40, 16, 1);
}

#[test]
fn a_few_rows_and_an_odd_cut_last_block() {
    check(&[3, 37], 20, 16, 5);
    check(&[4, 100], 50, 32, 6);
}

#[test]
fn cut_row_panels_and_blocks_across_k_blocks() {
    check(&[13, 1000], 70, 32, 2);
}

#[test]
fn leading_axes_fold_into_rows() {
    check(&[2, 5, 48], 33, 16, 3);
}

#[test]
fn wide_blocks_of_a_long_k() {
    check(&[30, 2048], 96, 128, 4);
}

/// GFLOP/s and weight bytes per second of the 4-bit GEMM on language-model shapes, beside the
/// f32 kernel on the same shapes: `cargo test -p kiln-codegen --release nibble_gemm_speed --
/// --ignored --nocapture`.
#[test]
#[ignore]
fn nibble_gemm_speed() {
    let host = TargetDesc::host().unwrap();
    for (m, n, k) in [
        (1, 32000, 768),
        (1, 3072, 768),
        (1, 768, 3072),
        (16, 3072, 768),
        (128, 3072, 768),
    ] {
        let c = case(&[m, k], n, 32, 7);
        let node = NodeInfo::new(&c.g, c.y.node);
        let kernel = super::products::lower(&node, &host).unwrap().unwrap();
        let (_, secs) = run_kernel(kernel.as_ref(), &node, &host, &c.data, m * n, 2, 20);
        let bytes = kernel.packed_constants()[0].bytes.len() as f64;
        // The same product on f32 weights.
        let mut g = Graph::new("f");
        let av = g.add_input(
            "a",
            TensorType::new(DType::F32, vec![Dim::Fixed(m), Dim::Fixed(k)]),
        );
        let w: Vec<f32> = (0..k * n).map(|i| (i % 7) as f32 * 0.25).collect();
        let wv = g.add_const("w", Tensor::from_vec(vec![k, n], w.clone()));
        let y = g.add("mm", Op::MatMul, vec![Some(av), Some(wv)], "y").unwrap();
        let fnode = NodeInfo::new(&g, y.node);
        let fk = super::products::lower(&fnode, &host).unwrap().unwrap();
        let (_, fsecs) = run_kernel(
            fk.as_ref(),
            &fnode,
            &host,
            &[Some(c.a.clone()), Some(w)],
            m * n,
            2,
            20,
        );
        let flop = 2.0 * (m * n * k) as f64;
        println!(
            "M={m} N={n} K={k}: 4-bit {:.3} ms ({:.1} GFLOP/s, {:.1} GB/s of weights; {}), f32 {:.3} ms ({:.1} GB/s)",
            secs * 1e3,
            flop / secs / 1e9,
            bytes / secs / 1e9,
            kernel.describe(),
            fsecs * 1e3,
            (k * n * 4) as f64 / fsecs / 1e9
        );
    }
}
