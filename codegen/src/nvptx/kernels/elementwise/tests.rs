//! Tests of the GPU elementwise kernels, run under emulation through the planner.

use super::*;
use crate::nvptx::emulate::{check_graph, compare, ptxas_check, run_plan, SM};
use crate::plan::kernel::KernelImpl;
use crate::test_rng::TestRng;
use kiln_ir::{Binary, DType, Dim, Op, Tensor, TensorType, Unary};

/// A graph under construction with its run-time inputs.
struct G {
    g: Graph,
    rng: TestRng,
    inputs: Vec<Tensor>,
    names: usize,
}

impl G {
    fn new(seed: u64) -> G {
        G {
            g: Graph::new("ew"),
            rng: TestRng::new(seed),
            inputs: vec![],
            names: 0,
        }
    }

    /// Values in [-4, 4).
    fn rand(&mut self, n: usize) -> Vec<f32> {
        self.rng.vec_scaled(n, 4.0)
    }

    fn tensor(&mut self, dtype: DType, shape: &[usize]) -> Tensor {
        let r = self.rand(shape.iter().product());
        let s = shape.to_vec();
        match dtype {
            DType::F32 => Tensor::from_vec(s, r),
            DType::I32 => Tensor::from_vec(s, r.iter().map(|x| (x * 1000.0) as i32).collect()),
            DType::I64 => Tensor::from_vec(s, r.iter().map(|x| (x * 1e6) as i64).collect()),
            DType::F16 => Tensor::from_vec(s, r.iter().map(|&x| half::f16::from_f32(x)).collect()),
            _ => Tensor::from_vec(s, r.iter().map(|x| *x > 0.0).collect::<Vec<bool>>()),
        }
    }

    fn input(&mut self, dtype: DType, shape: &[usize]) -> ValueId {
        let t = self.tensor(dtype, shape);
        self.input_tensor(t)
    }

    fn input_tensor(&mut self, t: Tensor) -> ValueId {
        let ty = TensorType::new(t.dtype(), t.shape().iter().map(|&d| Dim::Fixed(d)).collect());
        self.inputs.push(t);
        self.g.add_input(format!("in{}", self.inputs.len()), ty)
    }

    fn konst(&mut self, t: Tensor) -> ValueId {
        self.names += 1;
        self.g.add_const(format!("c{}", self.names), t)
    }

    fn op(&mut self, op: Op, ins: &[ValueId]) -> ValueId {
        self.names += 1;
        let n = self.names;
        self.g
            .add(
                format!("n{n}"),
                op,
                ins.iter().map(|v| Some(*v)).collect(),
                format!("v{n}"),
            )
            .unwrap()
    }

    fn un(&mut self, u: Unary, x: ValueId) -> ValueId {
        self.op(Op::Unary(u), &[x])
    }

    fn bin(&mut self, b: Binary, x: ValueId, y: ValueId) -> ValueId {
        self.op(Op::Binary(b), &[x, y])
    }

    /// Checks the graph (outputs `outs`) in emulation; returns the kernel descriptions.
    fn check(mut self, outs: &[ValueId]) -> Vec<String> {
        for (i, o) in outs.iter().enumerate() {
            self.g.add_output(format!("y{i}"), *o);
        }
        let d = check_graph(&self.g, &self.inputs);
        assert!(
            d.iter().all(|s| s.starts_with("gpu elementwise")),
            "kernels {d:?}"
        );
        d
    }
}

#[test]
fn f16_groups_round_after_every_operator() {
    // An f16 chain fused into one kernel (computed in f32 registers, rounded to f16 after each
    // operator, stored as half), with a broadcast input, a scalar constant, a comparison and a
    // Where, and conversions to and from f32 and i32.
    let mut g = G::new(21);
    let x = g.input(DType::F16, &[3, 70]);
    let c = g.input(DType::F16, &[1, 70]);
    let k = g.konst(Tensor::scalar(half::f16::from_f32(0.3)));
    let a = g.bin(Binary::Mul, x, c);
    let a = g.bin(Binary::Add, a, k);
    let t = g.un(Unary::Sigmoid, a);
    let e = g.un(Unary::Exp, t);
    let r = g.un(Unary::Relu, x);
    let gt = g.bin(Binary::Greater, e, r);
    let w = g.op(Op::Where, &[gt, e, r]);
    let d = g.check(&[w]);
    assert_eq!(d.len(), 1, "one fused kernel: {d:?}");
    // (x + 0.3) − x near 1000, where f16's step is 0.5: 0.5 or 0 after rounding the sum, as
    // the reference has it; 0.3 if the sum stayed in f32.
    let mut g = G::new(23);
    let big = Tensor::from_vec(
        vec![40],
        (0..40).map(|i| half::f16::from_f32(1000.0 + i as f32)).collect(),
    );
    let x = g.input_tensor(big);
    let k = g.konst(Tensor::scalar(half::f16::from_f32(0.3)));
    let a = g.bin(Binary::Add, x, k);
    let d = g.bin(Binary::Sub, a, x);
    g.check(&[d]);
    let mut g = G::new(22);
    let x = g.input(DType::F32, &[5, 33]);
    let h = g.op(Op::Cast { to: DType::F16 }, &[x]);
    let s = g.bin(Binary::Sub, h, h);
    let i = g.op(Op::Cast { to: DType::I32 }, &[h]);
    let back = g.op(Op::Cast { to: DType::F32 }, &[h]);
    let from_int = g.op(Op::Cast { to: DType::F16 }, &[i]);
    g.check(&[s, i, back, from_int]);
}

#[test]
fn chain_with_broadcasting_and_blocks() {
    // Size-1 dims, a scalar input, a constant scalar, sizes not multiples of 256 and
    // several blocks.
    for (seed, shape) in [
        (1, vec![2, 3, 1, 67]),
        (2, vec![1, 5, 300]),
        (3, vec![7]),
        (4, vec![3, 1, 1]),
    ] {
        let mut g = G::new(seed);
        let x = g.input(DType::F32, &shape);
        let rank = shape.len();
        let mut col = vec![1; rank];
        col[rank - 1] = shape[rank - 1];
        let mut row = vec![1; rank];
        row[0] = shape[0];
        let c = g.input(DType::F32, &col);
        let r = g.input(DType::F32, &row);
        let s = g.input(DType::F32, &[]);
        let k = g.konst(Tensor::scalar(0.75f32));
        let a = g.bin(Binary::Mul, x, c);
        let a = g.bin(Binary::Add, a, r);
        let a = g.bin(Binary::Sub, a, s);
        let a = g.bin(Binary::Div, a, k);
        let t = g.un(Unary::Tanh, a);
        let m = g.bin(Binary::Max, t, r);
        let n = g.un(Unary::Neg, m);
        let d = g.check(&[n]);
        assert_eq!(d.len(), 1, "one fused kernel: {d:?}");
    }
    // An output broadcast from every input: [5, 1, 130] and [1, 4, 1] to [5, 4, 130].
    let mut g = G::new(9);
    let a = g.input(DType::F32, &[5, 1, 130]);
    let b = g.input(DType::F32, &[1, 4, 1]);
    let y = g.bin(Binary::Add, a, b);
    let y = g.un(Unary::Exp, y);
    assert_eq!(g.check(&[y]).len(), 1);
}

#[test]
fn activations() {
    let acts = [
        Unary::Relu,
        Unary::Sigmoid,
        Unary::Tanh,
        Unary::Erf,
        Unary::Gelu { tanh: false },
        Unary::Gelu { tanh: true },
        Unary::Swish { alpha: 1.0 },
        Unary::HardSwish,
        Unary::HardSigmoid {
            alpha: 0.2,
            beta: 0.5,
        },
        Unary::LeakyRelu { alpha: 0.1 },
        Unary::Elu { alpha: 1.5 },
        Unary::Selu {
            alpha: 1.673_263_2,
            gamma: 1.050_701,
        },
        Unary::Celu { alpha: 0.7 },
        Unary::Softsign,
        Unary::Softplus,
        Unary::Mish,
        Unary::Sign,
        Unary::ThresholdedRelu { alpha: 1.0 },
        Unary::Exp,
        Unary::Abs,
        Unary::Floor,
        Unary::Ceil,
        Unary::Round,
        Unary::Reciprocal,
    ];
    for (i, act) in acts.into_iter().enumerate() {
        let mut g = G::new(100 + i as u64);
        let x = g.input(DType::F32, &[3, 301]);
        let y = g.un(act.clone(), x);
        let d = g.check(&[y]);
        assert_eq!(d.len(), 1, "{act:?}: {d:?}");
    }
    // Log, Sqrt and Pow on positive values (and a negative base with integer powers),
    // Clip with both bounds, PRelu with a per-channel slope.
    let mut g = G::new(200);
    let x = g.input(DType::F32, &[2, 3, 70]);
    let ax = g.un(Unary::Abs, x);
    let l = g.un(Unary::Log, ax);
    let q = g.un(Unary::Sqrt, ax);
    let lq = g.bin(Binary::Add, l, q);
    let p = g.input(DType::F32, &[70]);
    let pw = g.bin(Binary::Pow, ax, p);
    let two = g.konst(Tensor::scalar(3.0f32));
    let cube = g.bin(Binary::Pow, x, two);
    let lo = g.konst(Tensor::scalar(-2.0f32));
    let hi = g.konst(Tensor::scalar(2.5f32));
    let cl = g.op(Op::Clip, &[x, lo, hi]);
    let slope = g.input(DType::F32, &[3, 1]);
    let pr = g.bin(Binary::PRelu, x, slope);
    g.check(&[lq, pw, cube, cl, pr]);
}

#[test]
fn integers_comparisons_and_where() {
    for dtype in [DType::I32, DType::I64] {
        let mut g = G::new(300);
        let a = g.input(dtype, &[3, 1, 260]);
        let b = g.input(dtype, &[4, 1]);
        let s = g.bin(Binary::Add, a, b);
        let m = g.bin(Binary::Mul, s, a);
        let n = g.un(Unary::Neg, m);
        let r = g.bin(Binary::Max, n, b);
        let y = g.un(Unary::Abs, r);
        let lt = g.bin(Binary::Less, a, b);
        let w = g.op(Op::Where, &[lt, y, s]);
        g.check(&[w]);
    }
    let mut g = G::new(301);
    let x = g.input(DType::F32, &[4, 300]);
    let y = g.input(DType::F32, &[300]);
    let f = g.input(DType::Bool, &[4, 1]);
    let lt = g.bin(Binary::LessOrEqual, x, y);
    let a = g.bin(Binary::And, lt, f);
    let n = g.un(Unary::Not, a);
    let z = g.konst(Tensor::scalar(0.0f32));
    let w = g.op(Op::Where, &[n, x, z]);
    let q = g.input(DType::I32, &[300]);
    let qf = g.op(Op::Cast { to: DType::F32 }, &[q]);
    let y = g.bin(Binary::Sub, w, qf);
    g.check(&[y, n]);
}

#[test]
fn float_to_integer_casts_saturate() {
    let mut g = G::new(450);
    let mut v = g.rand(300);
    for x in v.iter_mut() {
        *x *= 1e9;
    }
    let special = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        3e9,
        -3e9,
        1e19,
        -1e19,
        -0.7,
        0.7,
        2.5,
    ];
    v[..special.len()].copy_from_slice(&special);
    let x = g.input_tensor(Tensor::from_vec(vec![3, 100], v));
    let a = g.op(Op::Cast { to: DType::I32 }, &[x]);
    let b = g.op(Op::Cast { to: DType::I64 }, &[x]);
    g.check(&[a, b]);
}

#[test]
fn bf16_round_trip() {
    let mut g = G::new(400);
    // Ties, values that round up into the next binade, NaN, infinities, subnormals.
    let special = [
        1.0f32,
        1.0 + 1.0 / 256.0,
        1.0 + 3.0 / 256.0,
        2.0 - 1.0 / 256.0,
        -(3.0 + 1.0 / 128.0),
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e-40,
        f32::MAX,
        0.0,
        -0.0,
    ];
    let mut v = g.rand(517);
    v[..special.len()].copy_from_slice(&special);
    let x = g.input_tensor(Tensor::from_vec(vec![11, 47], v));
    let b = g.op(Op::Cast { to: DType::BF16 }, &[x]);
    let y = g.op(Op::Cast { to: DType::F32 }, &[b]);
    let s = g.un(Unary::Sigmoid, y);
    let fused = G {
        g: g.g.clone(),
        rng: TestRng::new(0),
        inputs: g.inputs.clone(),
        names: g.names,
    };
    let d = fused.check(&[s]);
    assert_eq!(d.len(), 1, "{d:?}");
    // The rounded values themselves, bit for bit.
    for (i, o) in [y, b].iter().enumerate() {
        g.g.add_output(format!("y{i}"), *o);
    }
    let (got, _) = crate::nvptx::emulate::run_graph(&g.g, &g.inputs).unwrap();
    let want = kiln_ir::eval::eval_graph(&g.g, g.inputs.clone()).unwrap();
    for (a, b) in got.iter().zip(&want) {
        assert_eq!(a.dtype(), b.dtype());
        let (a, b) = (a.to_le_bytes(), b.to_le_bytes());
        for (i, (x, y)) in a.chunks(4).zip(b.chunks(4)).enumerate() {
            let nan = |c: &[u8]| c.len() == 4 && f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_nan();
            assert!(x == y || (nan(x) && nan(y)), "word {i}: {x:?} vs {y:?}");
        }
    }
}

#[test]
fn lone_nodes_go_through_the_generator() {
    // Without fusion every node is its own kernel, found through the generator list.
    let mut g = G::new(500);
    let a = g.input(DType::I64, &[5, 33]);
    let k = g.konst(Tensor::scalar(3i64));
    let m = g.bin(Binary::Mul, a, k);
    let c = g.bin(Binary::Greater, m, a);
    g.g.add_output("m", m);
    g.g.add_output("c", c);
    let (got, d) = crate::nvptx::emulate::run_graph_with(&g.g, &g.inputs, false).unwrap();
    assert!(d.iter().all(|s| s.starts_with("gpu elementwise")), "{d:?}");
    let want = kiln_ir::eval::eval_graph(&g.g, g.inputs.clone()).unwrap();
    for (a, b) in got.iter().zip(&want) {
        compare("lone nodes", a, b);
    }
}

#[test]
fn grid_stride_loop() {
    // A grid smaller than the output: each thread loops.
    let mut g = G::new(600);
    let x = g.input(DType::F32, &[3, 1000]);
    let b = g.input(DType::F32, &[3, 1]);
    let y = g.bin(Binary::Add, x, b);
    let y = g.un(Unary::Relu, y);
    g.g.add_output("y", y);
    let target = TargetDesc::cuda(SM).unwrap();
    let mut plan = crate::plan::build(&g.g, &target, true).unwrap();
    assert_eq!(plan.kernels.len(), 1);
    let mut nodes = plan.kernels[0].fused.clone();
    nodes.push(plan.kernels[0].node);
    let (k, _) = lower_group_with(&g.g, &nodes, &target, 3).unwrap();
    assert_eq!(k.launch().grid[0], 3);
    plan.kernels[0].imp = KernelImpl::Gpu(k);
    let got = run_plan(&g.g, &plan, &target, &g.inputs).unwrap();
    let want = kiln_ir::eval::eval_graph(&g.g, g.inputs.clone()).unwrap();
    compare("grid-stride", &got[0], &want[0]);
}

#[test]
fn wide_index_math_for_large_outputs() {
    let small = EwGpu::new(group_of_size(&[1 << 10, 1 << 15]), vec![], vec![], MAX_GRID);
    assert!(small.narrow());
    let big = EwGpu::new(group_of_size(&[1 << 16, 1 << 15]), vec![], vec![], MAX_GRID);
    assert!(!big.narrow(), "2^31 elements need 64-bit indices");
    assert_eq!(big.launch().grid[0] as usize, MAX_GRID);
}

/// A one-node group with an output of `shape`.
fn group_of_size(shape: &[usize]) -> EwGroup {
    let mut g = G::new(0);
    let ty = TensorType::new(DType::F32, shape.iter().map(|&d| Dim::Fixed(d)).collect());
    let x = g.g.add_input("x", ty);
    let y = g.un(Unary::Relu, x);
    ew::analyze(&g.g, &[y.node]).unwrap().0
}

#[test]
fn ptx_assembles() {
    let mut graphs = vec![];
    let mut g = G::new(700);
    let x = g.input(DType::F32, &[2, 3, 50]);
    let c = g.input(DType::F32, &[3, 1]);
    let a = g.bin(Binary::Mul, x, c);
    let e = g.un(Unary::Gelu { tanh: false }, a);
    let m = g.un(Unary::Mish, e);
    let l = g.un(Unary::Log, m);
    let p = g.bin(Binary::Pow, l, c);
    let s = g.un(Unary::Swish { alpha: 1.0 }, p);
    let b = g.op(Op::Cast { to: DType::BF16 }, &[s]);
    let f = g.op(Op::Cast { to: DType::F32 }, &[b]);
    let z = g.konst(Tensor::scalar(0.0f32));
    let gt = g.bin(Binary::Greater, f, z);
    let w = g.op(Op::Where, &[gt, f, x]);
    g.g.add_output("w", w);
    let i = g.input(DType::I64, &[2, 3, 50]);
    let j = g.input(DType::I64, &[50]);
    let s = g.bin(Binary::Add, i, j);
    let q = g.bin(Binary::Less, s, i);
    g.g.add_output("q", q);
    let t = g.op(Op::Cast { to: DType::I32 }, &[x]);
    g.g.add_output("t", t);
    graphs.push(g.g);
    // 64-bit indices.
    let mut g = G::new(701);
    let ty = TensorType::new(DType::F32, vec![Dim::Fixed(1 << 16), Dim::Fixed(1 << 15)]);
    let x = g.g.add_input("x", ty.clone());
    let r =
        g.g.add_input("r", TensorType::new(DType::F32, vec![Dim::Fixed(1 << 15)]));
    let y = g.bin(Binary::Add, x, r);
    let y = g.un(Unary::Tanh, y);
    g.g.add_output("y", y);
    graphs.push(g.g);
    for graph in &graphs {
        for sm in [80, 90] {
            if !ptxas_check(graph, sm) {
                return;
            }
        }
    }
}

/// The masked-softmax clean-up of exported attention (`Where(IsNaN(p), 0, p)`) and IsInf in
/// each of its modes, on NaN and both infinities.
#[test]
fn nan_and_infinity_tests() {
    let mut g = G::new(512);
    let mut v = g.rand(300);
    let special = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, f32::MAX];
    for (i, s) in special.iter().enumerate() {
        v[i * 11] = *s;
    }
    let x = g.input_tensor(Tensor::from_vec(vec![3, 100], v));
    let z = g.konst(Tensor::scalar(0.0f32));
    let nan = g.un(Unary::IsNaN, x);
    let cleaned = g.op(Op::Where, &[nan, z, x]);
    let mut outs = vec![cleaned];
    for (pos, neg) in [(true, true), (true, false), (false, true)] {
        outs.push(g.un(
            Unary::IsInf {
                detect_positive: pos,
                detect_negative: neg,
            },
            x,
        ));
    }
    let kernels = g.check(&outs);
    assert!(
        kernels.iter().all(|k| k.starts_with("gpu elementwise")),
        "{kernels:?}"
    );
}

/// Per-tensor QuantizeLinear and DequantizeLinear (u8 and i8, with and without zero points)
/// inside GPU elementwise kernels: rounding ties, saturation and NaN as the reference.
#[test]
fn quantize_and_dequantize_per_tensor() {
    use kiln_ir::QuantOp;
    let quantize = |to| {
        Op::Quant(QuantOp::QuantizeLinear {
            axis: 1,
            block_size: 0,
            output_dtype: to,
            precision: None,
        })
    };
    let dequantize = Op::Quant(QuantOp::DequantizeLinear {
        axis: 1,
        block_size: 0,
        output_dtype: None,
    });
    let mut g = G::new(600);
    let mut v = g.rand(3 * 37);
    v[..8].copy_from_slice(&[0.01, 0.03, -0.01, -2.0, 5.0, 1e30, f32::NAN, -1e30]);
    let x = g.input_tensor(Tensor::from_vec(vec![3, 37], v));
    let (s, z) = (g.konst(Tensor::scalar(0.02f32)), g.konst(Tensor::scalar(100u8)));
    let q = g.op(quantize(DType::U8), &[x, s, z]);
    let (s2, z2) = (g.konst(Tensor::scalar(0.03f32)), g.konst(Tensor::scalar(90u8)));
    let d = g.op(dequantize.clone(), &[q, s2, z2]);
    let r = g.un(Unary::Relu, d);
    let (s3, z3) = (g.konst(Tensor::scalar(0.05f32)), g.konst(Tensor::scalar(-3i8)));
    let qi = g.op(quantize(DType::I8), &[r, s3, z3]);
    let di = g.op(dequantize.clone(), &[qi, s3]);
    g.check(&[q, di]);
    // Parameters computed at run time (DynamicQuantizeLinear's scale and zero point).
    let mut g = G::new(601);
    let x = g.input(DType::F32, &[5, 19]);
    let s = g.input_tensor(Tensor::scalar(0.037f32));
    let z = g.input_tensor(Tensor::scalar(121u8));
    let q = g.op(quantize(DType::U8), &[x, s, z]);
    let d = g.op(dequantize, &[q, s, z]);
    g.check(&[d]);
}

/// Per-axis parameters (run-time and constant, the axis in the middle and last) and 16-bit
/// integers, in one group.
#[test]
fn quantize_and_dequantize_per_axis_and_16_bit() {
    use kiln_ir::QuantOp;
    let quantize = |axis, to| {
        Op::Quant(QuantOp::QuantizeLinear {
            axis,
            block_size: 0,
            output_dtype: to,
            precision: None,
        })
    };
    let dequantize = |axis| {
        Op::Quant(QuantOp::DequantizeLinear {
            axis,
            block_size: 0,
            output_dtype: None,
        })
    };
    let mut g = G::new(610);
    let x = g.input(DType::F32, &[2, 3, 4, 5]);
    let s = g.input_tensor(Tensor::from_vec(vec![3], vec![0.01f32, 0.02, 0.05]));
    let z = g.konst(Tensor::from_vec(vec![3], vec![100u8, 0, 255]));
    let q = g.op(quantize(1, DType::U8), &[x, s, z]);
    let d = g.op(dequantize(1), &[q, s, z]);
    let s16 = g.konst(Tensor::from_vec(vec![5], vec![1e-4f32, 2e-4, 3e-4, 5e-5, 1e-3]));
    let z16 = g.konst(Tensor::from_vec(vec![5], vec![-300i16, 0, 7, 32000, -32768]));
    let q16 = g.op(quantize(-1, DType::I16), &[d, s16, z16]);
    let d16 = g.op(dequantize(3), &[q16, s16, z16]);
    let (su, zu) = (
        g.konst(Tensor::scalar(3e-5f32)),
        g.konst(Tensor::scalar(40000u16)),
    );
    let qu = g.op(quantize(0, DType::U16), &[d16, su, zu]);
    let du = g.op(dequantize(0), &[qu, su, zu]);
    g.check(&[q, q16, du]);
}

/// Blocked parameters (opset 21's `block_size`): a block of the axis shares one scale and zero
/// point, on a middle axis (beside a per-axis parameter in the same group) and on the last,
/// and a block that does not divide its axis, which the generator declines.
#[test]
fn quantize_and_dequantize_blocked() {
    use kiln_ir::QuantOp;
    let quantize = |axis, block_size, to| {
        Op::Quant(QuantOp::QuantizeLinear {
            axis,
            block_size,
            output_dtype: to,
            precision: None,
        })
    };
    let dequantize = |axis, block_size| {
        Op::Quant(QuantOp::DequantizeLinear {
            axis,
            block_size,
            output_dtype: None,
        })
    };
    let mut g = G::new(620);
    let x = g.input(DType::F32, &[2, 6, 4]);
    // Axis 1 in blocks of 3: parameters [2, 2, 4], distinct along every axis.
    let s: Vec<f32> = (0..16).map(|i| 0.01 + 0.004 * i as f32).collect();
    let s = g.input_tensor(Tensor::from_vec(vec![2, 2, 4], s));
    let z: Vec<u8> = (0..16).map(|i| (i * 16 + 3) as u8).collect();
    let z = g.konst(Tensor::from_vec(vec![2, 2, 4], z));
    let q = g.op(quantize(1, 3, DType::U8), &[x, s, z]);
    let d = g.op(dequantize(1, 3), &[q, s, z]);
    // The last axis in blocks of 2, symmetric int8, then per-axis on axis 1 in the same group.
    let s2: Vec<f32> = (0..24).map(|i| 0.02 + 0.003 * i as f32).collect();
    let s2 = g.konst(Tensor::from_vec(vec![2, 6, 2], s2));
    let q2 = g.op(quantize(-1, 2, DType::I8), &[d, s2]);
    let d2 = g.op(dequantize(2, 2), &[q2, s2]);
    let sa = g.konst(Tensor::from_vec(
        vec![6],
        vec![0.05f32, 0.1, 0.02, 0.03, 0.07, 0.01],
    ));
    let qa = g.op(quantize(1, 0, DType::I8), &[d2, sa]);
    g.check(&[q, qa]);

    let mut g = G::new(621);
    let x = g.input(DType::F32, &[3, 5]);
    let s = g.konst(Tensor::from_vec(
        vec![3, 2],
        vec![0.01f32, 0.02, 0.03, 0.04, 0.05, 0.06],
    ));
    let q = g.op(quantize(1, 3, DType::I8), &[x, s]);
    g.g.add_output("y", q);
    let d = check_graph(&g.g, &g.inputs);
    assert!(
        d[0].starts_with("kiln_uk"),
        "a block of 3 does not divide 5: {d:?}"
    );
}

/// Integer Div/Mod/FMod (zero and -1 divisors, the most negative dividend) and float Mod/FMod
/// (zero and infinite divisors, an infinite dividend) in GPU kernels, as the reference.
#[test]
fn divisions_and_remainders() {
    let mut g = G::new(700);
    let mut x: Vec<i32> = (0..60).map(|i| (i * 37) % 41 - 20).collect();
    let mut y: Vec<i32> = (0..60).map(|i| (i * 11) % 13 - 6).collect();
    x[0] = i32::MIN;
    y[0] = -1;
    x[1] = i32::MIN;
    y[2] = 0;
    let a = g.input_tensor(Tensor::from_vec(vec![60], x.clone()));
    let b = g.input_tensor(Tensor::from_vec(vec![60], y.clone()));
    let xl = g.input_tensor(Tensor::from_vec(
        vec![60],
        x.iter().map(|&v| v as i64 * 3).collect::<Vec<i64>>(),
    ));
    let yl = g.input_tensor(Tensor::from_vec(
        vec![60],
        y.iter().map(|&v| v as i64).collect::<Vec<i64>>(),
    ));
    let mut outs = vec![];
    for op in [Binary::Div, Binary::Mod, Binary::FMod] {
        outs.push(g.bin(op, a, b));
        outs.push(g.bin(op, xl, yl));
    }
    let mut fy: Vec<f32> = (0..40).map(|i| ((i * 7) % 9) as f32 * 0.75 - 3.0).collect();
    fy[..4].copy_from_slice(&[0.0, f32::INFINITY, f32::NEG_INFINITY, -0.0]);
    let mut fx: Vec<f32> = (0..40).map(|i| ((i * 13) % 23) as f32 * 0.5 - 5.5).collect();
    fx[4] = f32::INFINITY;
    let fa = g.input_tensor(Tensor::from_vec(vec![40], fx));
    let fb = g.input_tensor(Tensor::from_vec(vec![40], fy));
    for op in [Binary::Mod, Binary::FMod] {
        outs.push(g.bin(op, fa, fb));
    }
    g.check(&outs);
}

impl G {
    /// Integers of `dtype` (wrapped from i64): a quarter small (-4..4, so that divisions meet 0
    /// and -1 and shifts stay in range), the rest random bits.
    fn int_tensor(&mut self, dtype: DType, shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        let v: Vec<i64> = (0..n)
            .map(|i| {
                let (a, b) = (self.rng.next(), self.rng.next());
                if i % 4 == 0 {
                    (a * 4.0).floor() as i64
                } else {
                    ((a.to_bits() as i64) << 32) ^ i64::from(b.to_bits())
                }
            })
            .collect();
        Tensor::from_vec(shape.to_vec(), v).cast(dtype)
    }

    /// Integers of `dtype` in `lo..hi`.
    fn int_range(&mut self, dtype: DType, shape: &[usize], lo: i64, hi: i64) -> ValueId {
        let n: usize = shape.iter().product();
        let v: Vec<i64> = (0..n)
            .map(|_| lo + ((self.rng.next() + 1.0) / 2.0 * (hi - lo) as f32) as i64)
            .collect();
        self.input_tensor(Tensor::from_vec(shape.to_vec(), v).cast(dtype))
    }
}

/// Every operator on 8-, 16- and unsigned 32- and 64-bit integers against the reference,
/// exactly: the wrap of fixed-width arithmetic, division and remainders by 0 and -1, unsigned
/// compares, ONNX's shifts (outside the width, negative amounts), integer powers (negative
/// exponents included), clips, conversions between widths and to and from floats; all in one
/// fused kernel per output, and the PTX assembles.
#[test]
fn integers_of_every_width() {
    for (seed, dtype) in [
        DType::I8,
        DType::U8,
        DType::I16,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::I32,
    ]
    .into_iter()
    .enumerate()
    {
        let mut g = G::new(900 + seed as u64);
        let at = g.int_tensor(dtype, &[3, 1, 70]);
        let a = g.input_tensor(at);
        let bt = g.int_tensor(dtype, &[4, 1]);
        let b = g.input_tensor(bt);
        let bits = dtype.size_bytes() as i64 * 8;
        let lo = if dtype.is_signed_int() { -3 } else { 0 };
        let amount = g.int_range(dtype, &[70], lo, bits + 3);
        let mut outs = vec![];
        for op in [
            Binary::Add,
            Binary::Sub,
            Binary::Mul,
            Binary::Div,
            Binary::Mod,
            Binary::FMod,
            Binary::Min,
            Binary::Max,
            Binary::BitwiseAnd,
            Binary::BitwiseOr,
            Binary::BitwiseXor,
        ] {
            outs.push(g.bin(op, a, b));
        }
        for op in [Binary::BitShiftLeft, Binary::BitShiftRight] {
            outs.push(g.bin(op, a, amount));
        }
        let lt = g.bin(Binary::Less, a, b);
        let ge = g.bin(Binary::GreaterOrEqual, a, b);
        let eq = g.bin(Binary::Equal, a, b);
        let either = g.bin(Binary::Or, lt, eq);
        outs.extend([ge, either]);
        let w = g.op(Op::Where, &[lt, a, b]);
        outs.push(g.un(Unary::BitwiseNot, w));
        outs.push(g.un(Unary::Abs, a));
        if dtype.is_signed_int() {
            outs.push(g.un(Unary::Neg, a));
            outs.push(g.un(Unary::Relu, a));
        }
        let base = g.int_range(dtype, &[70], lo, 5);
        let exponent = g.int_range(dtype, &[4, 1], lo, 12);
        outs.push(g.bin(Binary::Pow, base, exponent));
        let (cl, ch) = (g.int_tensor(dtype, &[]), g.int_tensor(dtype, &[]));
        let (cl, ch) = (g.konst(cl), g.konst(ch));
        outs.push(g.op(Op::Clip, &[a, cl, ch]));
        for to in [
            DType::I64,
            DType::U8,
            DType::I16,
            DType::U32,
            DType::F32,
            DType::F64,
            DType::Bool,
        ] {
            if to != dtype {
                outs.push(g.op(Op::Cast { to }, &[a]));
            }
        }
        let f = g.input(DType::F32, &[70]);
        let big = g.konst(Tensor::scalar(1e10f32));
        let f = g.bin(Binary::Mul, f, big);
        outs.push(g.op(Op::Cast { to: dtype }, &[f]));
        let graph = g.g.clone();
        g.check(&outs);
        let mut graph = graph;
        for (i, o) in outs.iter().enumerate() {
            graph.add_output(format!("y{i}"), *o);
        }
        if !ptxas_check(&graph, SM) {
            return;
        }
    }
}

/// f64 arithmetic, remainders, compares and conversions (f16 in one rounding), the
/// trigonometric and hyperbolic functions through the C library in f64 on f32, f64 and f16,
/// f64 exp, log, tanh and erf the same way, Shrink, floats to integer powers and integers to
/// float powers.
#[test]
fn f64_trigonometry_and_mixed_powers() {
    let mut g = G::new(950);
    let x32 = g.input(DType::F32, &[3, 1, 90]);
    let y32 = g.input(DType::F32, &[4, 1]);
    let x = g.op(Op::Cast { to: DType::F64 }, &[x32]);
    let y = g.op(Op::Cast { to: DType::F64 }, &[y32]);
    let mut outs = vec![];
    for op in [
        Binary::Add,
        Binary::Sub,
        Binary::Mul,
        Binary::Div,
        Binary::Min,
        Binary::Max,
        Binary::Mod,
        Binary::FMod,
        Binary::Less,
        Binary::Equal,
    ] {
        outs.push(g.bin(op, x, y));
    }
    for u in [
        Unary::Abs,
        Unary::Neg,
        Unary::Sqrt,
        Unary::Floor,
        Unary::Round,
        Unary::Reciprocal,
        Unary::Sign,
    ] {
        outs.push(g.un(u, x));
    }
    for to in [DType::F32, DType::F16, DType::I32, DType::U8, DType::Bool] {
        outs.push(g.op(Op::Cast { to }, &[x]));
    }
    let h = g.input(DType::F16, &[90]);
    for u in [
        Unary::Sin,
        Unary::Cos,
        Unary::Tan,
        Unary::Asin,
        Unary::Acos,
        Unary::Atan,
        Unary::Sinh,
        Unary::Cosh,
        Unary::Asinh,
        Unary::Acosh,
        Unary::Atanh,
    ] {
        outs.push(g.un(u.clone(), x32));
        outs.push(g.un(u.clone(), x));
        outs.push(g.un(u, h));
    }
    for u in [Unary::Exp, Unary::Log, Unary::Tanh, Unary::Erf] {
        outs.push(g.un(u, x));
    }
    outs.push(g.un(
        Unary::Shrink {
            bias: 0.5,
            lambd: 1.5,
        },
        x32,
    ));
    for dtype in [DType::I32, DType::I64, DType::U32] {
        let e = g.int_range(dtype, &[4, 1], 0, 6);
        outs.push(g.bin(Binary::Pow, x32, e));
        // An integer to a float power, converted back with saturation.
        let base = g.int_range(dtype, &[90], 0, 40);
        outs.push(g.bin(Binary::Pow, base, y32));
    }
    let graph = g.g.clone();
    g.check(&outs);
    let mut graph = graph;
    for (i, o) in outs.iter().enumerate() {
        graph.add_output(format!("y{i}"), *o);
    }
    ptxas_check(&graph, SM);
}

/// bf16 computed in f32 registers and rounded after every operator, as the reference rounds:
/// arithmetic, a comparison, Where, activations and the casts between bf16 and other types.
#[test]
fn bf16_groups_round_after_every_operator() {
    let mut g = G::new(970);
    let xf = g.input(DType::F32, &[3, 1, 90]);
    let yf = g.input(DType::F32, &[4, 1]);
    let x = g.op(Op::Cast { to: DType::BF16 }, &[xf]);
    let y = g.op(Op::Cast { to: DType::BF16 }, &[yf]);
    let s = g.bin(Binary::Add, x, y);
    let m = g.bin(Binary::Mul, s, x);
    let d = g.bin(Binary::Div, m, y);
    let c = g.un(Unary::Celu { alpha: 1.0 }, d);
    let e = g.un(Unary::Exp, y);
    let eq = g.bin(Binary::Equal, x, y);
    let w = g.op(Op::Where, &[eq, c, e]);
    let i = g.int_range(DType::I8, &[90], -100, 100);
    let ib = g.op(Op::Cast { to: DType::BF16 }, &[i]);
    let z = g.bin(Binary::Sub, w, ib);
    let back = g.op(Op::Cast { to: DType::I32 }, &[z]);
    let graph = g.g.clone();
    g.check(&[z, back]);
    let mut graph = graph;
    graph.add_output("z", z);
    graph.add_output("back", back);
    ptxas_check(&graph, SM);
}
