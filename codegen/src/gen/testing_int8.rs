//! JIT tests of the integer products on `vpdpbusd` (`gemm::int8`): MatMulInteger with u8 A,
//! constant s8 B and A's zero point constant or given at run time, against `kiln_ir`'s
//! evaluator, exactly. Skipped (with a note) on a CPU without avx512_vnni.

use super::testing::{as_words, run_kernel};
use crate::node::NodeInfo;
use crate::target::TargetDesc;
use crate::test_rng::TestRng as Rng;
use kiln_ir::{DType, Dim, Graph, Op, QuantOp, Tensor, TensorType};

/// A uniform byte.
fn byte(rng: &mut Rng) -> u8 {
    ((rng.next() + 1.0) * 128.0).min(255.0) as u8
}

/// A's zero point: its value and whether it is a run-time input (else a constant).
type ZeroPoint = Option<(u8, bool)>;

/// Runs MatMulInteger of A `a_shape` (u8) by a constant s8 `[K, N]`, the zero point `za`
/// absent, constant or a run-time input; compares with the evaluator, bare and with a
/// dequantizing epilogue (`dequantized`). Returns whether the kernel took the node.
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
    dequantized(&node, &data, &want, n);
    true
}

/// Runs the integer product `node` (exact sums `want`, N columns) with the dequantizing
/// epilogue — scale, bias, Relu: the same f32 operations as the reference's Cast, Mul, Add,
/// Relu, so equal bits — and, where the kernel stores bytes, that result quantized to u8, on 1
/// and 2 threads.
fn dequantized(node: &NodeInfo, data: &[Option<Vec<f32>>], want: &[i32], n: usize) {
    use crate::kernel::epilogue::{Activation, Bias, Epilogue, Quantize};
    let host = TargetDesc::host().unwrap();
    let scales: Vec<f32> = (0..n).map(|j| 0.001 * (j + 1) as f32).collect();
    let bias: Vec<f32> = (0..n).map(|j| (j as f32 - 3.0) * 0.25).collect();
    let epi = || Epilogue {
        dequantize: Some(scales.clone()),
        ..Epilogue::new(Bias::PerCol(bias.clone()), None, Activation::Relu)
    };
    let fused = super::products::lower_fused(node, &host, epi())
        .unwrap()
        .expect("the integer kernel takes the dequantizing epilogue");
    let what = fused.describe();
    let want_f32: Vec<f32> = want
        .iter()
        .enumerate()
        .map(|(i, &v)| (v as f32 * scales[i % n] + bias[i % n]).max(0.0))
        .collect();
    let q = Quantize {
        scale: 0.05,
        zero_point: 7,
    };
    let quantized = super::products::lower_fused(
        node,
        &host,
        Epilogue {
            quantize: Some(q),
            ..epi()
        },
    )
    .unwrap();
    assert_eq!(quantized.is_some(), super::gemm::stores_u8(n), "{what}");
    let want_u8: Vec<u8> = want_f32
        .iter()
        .map(|&x| ((x / q.scale).round_ties_even() + f32::from(q.zero_point)).clamp(0.0, 255.0) as u8)
        .collect();
    for threads in [1, 2] {
        let (out, _) = run_kernel(fused.as_ref(), node, &host, data, want.len(), threads, 0);
        for (i, (g, w)) in out.iter().zip(&want_f32).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{what}: element {i} ({threads} threads)"
            );
        }
        if let Some(k) = &quantized {
            let (out, _) = run_kernel(k.as_ref(), node, &host, data, want.len(), threads, 0);
            let got: Vec<u8> = out
                .iter()
                .flat_map(|f| f.to_le_bytes())
                .take(want_u8.len())
                .collect();
            assert_eq!(got, want_u8, "{what}, quantized ({threads} threads)");
        }
    }
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
        // Columns that end in part of a vector (the last panel through the local tile, with
        // the rows of A that exist), and a classifier head (M = 1, N = 1000).
        (&[13, 32], 20, Some((7, false)), false),
        (&[1, 2048], 1000, Some((3, false)), false),
        // The 8×3 and 6×4 tiles (`Tile::for_product`): rows cut, columns in whole vectors.
        (&[21, 96], 80, Some((5, false)), false),
        (&[11, 64], 112, None, false),
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
    // K not a multiple of 4 (A's rows are read in place as quads): left to the kernel
    // library.
    assert!(!check(&[4, 30], 32, None, false, 9));
}

/// A channels-last ConvInteger case: X `[n, h, w, c]` u8, W `[m, c, k, k]` s8, and the rest.
struct ConvCase {
    n: usize,
    hw: (usize, usize),
    c: usize,
    m: usize,
    k: usize,
    stride: usize,
    pad: usize,
    x_zero: Option<u8>,
}

/// The graph of `case`, its inputs for the evaluator and for the kernel, and the node.
fn conv_graph(case: &ConvCase, seed: u64) -> (Graph, Vec<Tensor>, Vec<Option<Vec<f32>>>, kiln_ir::ValueId) {
    let mut rng = Rng::new(seed);
    let (h, w) = case.hw;
    let x_len = case.n * h * w * case.c;
    let x: Vec<u8> = (0..x_len).map(|_| byte(&mut rng)).collect();
    let wt: Vec<i8> = (0..case.m * case.c * case.k * case.k)
        .map(|_| byte(&mut rng) as i8)
        .collect();
    let mut g = Graph::new("t");
    let x_shape = vec![case.n, h, w, case.c];
    let xv = g.add_input(
        "x",
        TensorType::new(DType::U8, x_shape.iter().map(|&d| Dim::Fixed(d)).collect()),
    );
    let wv = g.add_const(
        "w",
        Tensor::from_vec(vec![case.m, case.c, case.k, case.k], wt.clone()),
    );
    let w_bytes: Vec<u8> = wt.iter().map(|&v| v as u8).collect();
    // One entry per node input, an absent zero point included (the kernel's argument layout).
    let data = vec![
        Some(as_words(&x)),
        Some(as_words(&w_bytes)),
        case.x_zero.map(|z| as_words(&[z])),
    ];
    let zv = case.x_zero.map(|z| g.add_const("xz", Tensor::scalar(z)));
    let attrs = kiln_ir::ConvAttrs {
        kernel_shape: vec![case.k, case.k],
        strides: vec![case.stride; 2],
        pads: vec![case.pad; 4],
        dilations: vec![1, 1],
        group: 1,
        channels_last: true,
        ..Default::default()
    };
    let y = g
        .add(
            "conv",
            Op::Quant(QuantOp::ConvInteger(attrs)),
            vec![Some(xv), Some(wv), zv],
            "y",
        )
        .unwrap();
    g.add_output("y", y);
    (g, vec![Tensor::from_vec(x_shape, x)], data, y)
}

/// Runs `case` bare (i32 sums, compared exactly) and with the dequantizing epilogues
/// (`dequantized`), on 1 and 2 threads. Returns the kernel's description.
fn check_conv(case: &ConvCase, seed: u64) -> String {
    let host = TargetDesc::host().unwrap();
    let (g, inputs, data, y) = conv_graph(case, seed);
    let want = kiln_ir::eval::eval_graph(&g, inputs).unwrap();
    let want = want[0].as_slice::<i32>().unwrap().to_vec();
    let node = NodeInfo::new(&g, y.node);
    let kernel = super::products::lower(&node, &host)
        .unwrap()
        .expect("the integer kernel takes the convolution");
    let what = kernel.describe();
    assert!(what.contains("vpdpbusd"), "{what}");
    for threads in [1, 2] {
        let (out, _) = run_kernel(kernel.as_ref(), &node, &host, &data, want.len(), threads, 0);
        let got: Vec<i32> = out.iter().map(|f| f.to_bits() as i32).collect();
        assert_eq!(got, want, "{what} ({threads} threads)");
    }
    dequantized(&node, &data, &want, case.m);
    what
}

#[test]
fn conv_integer_is_exact() {
    if !TargetDesc::host().unwrap().has_int8_dot_kernels() {
        println!("skipped: this CPU has no avx512_vnni");
        return;
    }
    let case = |n, hw, c, m, k, stride, pad, x_zero| ConvCase {
        n,
        hw,
        c,
        m,
        k,
        stride,
        pad,
        x_zero,
    };
    // Pointwise over whole quads: A read in place.
    let what = check_conv(&case(1, (5, 7), 8, 32, 1, 1, 0, Some(128)), 1);
    assert!(what.contains("conv-integer1x1/1"), "{what}");
    // A padded window whose taps outside the image hold the zero point; a 3-channel input
    // (K = 27, one quad short), output channels that cut a column panel.
    check_conv(&case(1, (6, 5), 3, 8, 3, 1, 1, Some(77)), 2);
    // Strided, two images (A's batch stride in bytes), no zero point.
    check_conv(&case(2, (9, 9), 4, 48, 3, 2, 1, None), 3);
    // Several K blocks (K = 9 * 256 = 2304 bytes, 576 quads) and a strided pointwise
    // convolution.
    let what = check_conv(&case(1, (7, 7), 256, 64, 3, 1, 1, Some(5)), 4);
    assert!(!what.contains("KC=2304"), "{what}");
    check_conv(&case(1, (8, 8), 12, 16, 1, 2, 0, Some(200)), 5);
}

/// A quantized residual block's tail on one kernel: the convolution's dequantized result,
/// fake-quantized, plus the skip connection (`Residual::Skip`: f32, or u8 bytes dequantized
/// with their own parameters), quantized to u8; against the same f32 operations in order, on 1
/// and 2 threads. The skip input sits after the absent weight zero point (slot 4).
#[test]
fn conv_integer_adds_the_skip_connection_after_its_fake_quantization() {
    use crate::kernel::epilogue::{Activation, Bias, Epilogue, Quantize, Residual};
    let host = TargetDesc::host().unwrap();
    if !host.has_int8_dot_kernels() {
        println!("skipped: this CPU has no avx512_vnni");
        return;
    }
    let case = ConvCase {
        n: 1,
        hw: (5, 7),
        c: 16,
        m: 48,
        k: 3,
        stride: 1,
        pad: 1,
        x_zero: Some(9),
    };
    let (mut g, inputs, mut data, y) = conv_graph(&case, 11);
    let sums = kiln_ir::eval::eval_graph(&g, inputs).unwrap();
    let sums = sums[0].as_slice::<i32>().unwrap().to_vec();
    let n = case.m;
    let out_shape: Vec<Dim> = g.value_type(y).shape.clone();
    let r8 = g.add_input("skip_u8", TensorType::new(DType::U8, out_shape.clone()));
    let r32 = g.add_input("skip_f32", TensorType::new(DType::F32, out_shape));
    let mut rng = Rng::new(12);
    let skip_bytes: Vec<u8> = (0..sums.len()).map(|_| byte(&mut rng)).collect();
    let skip_f32: Vec<f32> = (0..sums.len()).map(|_| rng.next() * 2.0).collect();
    let scales: Vec<f32> = (0..n).map(|j| 0.0007 * (j + 1) as f32).collect();
    let bias: Vec<f32> = (0..n).map(|j| (j as f32 - 20.0) * 0.125).collect();
    let (fq_scale, lo, hi) = (0.03f32, -120.0f32, 135.0f32);
    let skip_params = Quantize {
        scale: 0.02,
        zero_point: 100,
    };
    let out = Quantize {
        scale: 0.04,
        zero_point: 3,
    };
    data.resize(4, None);
    let fake_quant = |i: usize| {
        let x = sums[i] as f32 * scales[i % n] + bias[i % n];
        (x / fq_scale).round_ties_even().clamp(lo, hi) * fq_scale
    };
    let quantize =
        |x: f32| ((x / out.scale).round_ties_even() + f32::from(out.zero_point)).clamp(0.0, 255.0) as u8;
    for (skip, dequantize) in [(r8, Some(skip_params)), (r32, None)] {
        let node = NodeInfo::new(&g, y.node).with_extra(4, skip);
        let mut data = data.clone();
        data.push(Some(match dequantize {
            Some(_) => as_words(&skip_bytes),
            None => skip_f32.clone(),
        }));
        let epi = Epilogue {
            dequantize: Some(scales.clone()),
            quantize: Some(out),
            ..Epilogue::new(
                Bias::PerCol(bias.clone()),
                Some(Residual::Skip { input: 4, dequantize }),
                Activation::FakeQuant {
                    scale: fq_scale,
                    lo,
                    hi,
                },
            )
        };
        let kernel = super::products::lower_fused(&node, &host, epi)
            .unwrap()
            .expect("the integer kernel takes the skip connection");
        let what = kernel.describe();
        let want: Vec<u8> = (0..sums.len())
            .map(|i| {
                let skip = match dequantize {
                    Some(p) => (i32::from(skip_bytes[i]) - i32::from(p.zero_point)) as f32 * p.scale,
                    None => skip_f32[i],
                };
                quantize(fake_quant(i) + skip)
            })
            .collect();
        for threads in [1, 2] {
            let (got, _) = run_kernel(kernel.as_ref(), &node, &host, &data, sums.len(), threads, 0);
            let got: Vec<u8> = got
                .iter()
                .flat_map(|f| f.to_le_bytes())
                .take(want.len())
                .collect();
            assert_eq!(got, want, "{what}, skip {dequantize:?} ({threads} threads)");
        }
    }
}
