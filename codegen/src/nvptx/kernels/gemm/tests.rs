//! Tests of the GPU product kernels, run under emulation on the host CPU.

use crate::nvptx::emulate::{check_graph_for, ptxas_check};
use crate::nvptx::MmaKind;
use kiln_ir::{AutoPad, Binary, ConvAttrs, DType, Dim, Graph, Op, Tensor, TensorType, Unary, ValueId};

use crate::test_rng::TestRng as Rng;

/// A graph under construction with its run-time inputs.
struct G {
    g: Graph,
    rng: Rng,
    inputs: Vec<Tensor>,
    names: usize,
    values: Values,
}

/// What a test graph's operands hold.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Values {
    F32,
    /// As bf16 autocast writes them: f32 constants rounded to bf16, run-time inputs through
    /// a `Cast<f32>(Cast<bf16>(x))` pair.
    Bf16,
    /// f16 tensors throughout.
    F16,
    /// bf16 tensors throughout (what a bf16 export holds).
    Bf16Tensors,
}

impl G {
    fn new(seed: u64) -> G {
        G {
            g: Graph::new("t"),
            rng: Rng::new(seed),
            inputs: vec![],
            names: 0,
            values: Values::F32,
        }
    }

    fn bf16(seed: u64) -> G {
        G {
            values: Values::Bf16,
            ..G::new(seed)
        }
    }

    fn f16(seed: u64) -> G {
        G {
            values: Values::F16,
            ..G::new(seed)
        }
    }

    fn bf16_tensors(seed: u64) -> G {
        G {
            values: Values::Bf16Tensors,
            ..G::new(seed)
        }
    }

    /// Random values as a tensor holding `values`.
    fn tensor(&mut self, values: Values, shape: &[usize]) -> Tensor {
        let v = self.rng.vec(shape.iter().product());
        let s = shape.to_vec();
        match values {
            Values::F32 => Tensor::from_vec(s, v),
            Values::Bf16 => Tensor::from_vec(
                s,
                v.iter()
                    .map(|&x| kiln_ir::tensor::bf16_from_f64(f64::from(x)).to_f32())
                    .collect(),
            ),
            Values::F16 => Tensor::from_vec(s, v.iter().map(|&x| half::f16::from_f32(x)).collect()),
            Values::Bf16Tensors => Tensor::from_vec(s, v.iter().map(|&x| half::bf16::from_f32(x)).collect()),
        }
    }

    fn input(&mut self, shape: &[usize]) -> ValueId {
        self.input_as(self.values, shape)
    }

    /// A run-time f32 input, whatever the operand mode.
    fn input_f32(&mut self, shape: &[usize]) -> ValueId {
        self.input_as(Values::F32, shape)
    }

    fn input_as(&mut self, values: Values, shape: &[usize]) -> ValueId {
        // Run-time bf16 values come from the Cast pair, not from the data.
        let data = if values == Values::Bf16 {
            Values::F32
        } else {
            values
        };
        let t = self.tensor(data, shape);
        let ty = TensorType::new(t.dtype(), shape.iter().map(|&d| Dim::Fixed(d)).collect());
        self.inputs.push(t);
        let x = self.g.add_input(format!("in{}", self.inputs.len()), ty);
        if values != Values::Bf16 {
            return x;
        }
        let narrow = self.node(Op::Cast { to: DType::BF16 }, vec![Some(x)]);
        self.node(Op::Cast { to: DType::F32 }, vec![Some(narrow)])
    }

    fn constant(&mut self, shape: &[usize]) -> ValueId {
        let t = self.tensor(self.values, shape);
        self.names += 1;
        self.g.add_const(format!("c{}", self.names), t)
    }

    fn operand(&mut self, shape: &[usize], constant: bool) -> ValueId {
        if constant {
            self.constant(shape)
        } else {
            self.input(shape)
        }
    }

    fn node(&mut self, op: Op, inputs: Vec<Option<ValueId>>) -> ValueId {
        self.names += 1;
        let n = self.names;
        self.g.add(format!("n{n}"), op, inputs, format!("v{n}")).unwrap()
    }

    /// Checks the graph (output `y`) in emulation; returns the kernel descriptions.
    fn check(self, y: ValueId) -> Vec<String> {
        self.check_for(y, crate::nvptx::emulate::SM)
    }

    /// [`G::check`] planned for compute capability `sm`.
    fn check_for(mut self, y: ValueId, sm: u32) -> Vec<String> {
        self.g.add_output("y", y);
        check_graph_for(&self.g, &self.inputs, sm)
    }
}

fn conv(kernel: [usize; 2], strides: [usize; 2], pads: [usize; 4], dil: [usize; 2], group: usize) -> Op {
    Op::Conv(ConvAttrs {
        kernel_shape: kernel.to_vec(),
        strides: strides.to_vec(),
        pads: pads.to_vec(),
        dilations: dil.to_vec(),
        group,
        auto_pad: AutoPad::NotSet,
        channels_last: false,
    })
}

fn assert_gpu(d: &[String], what: &str) {
    assert!(
        d.iter().all(|s| s.starts_with(what)),
        "kernels {d:?}, expected {what}"
    );
}

#[test]
fn matmul_shapes() {
    // Not multiples of the tile; more than one block along M, N and K; size-1 dims.
    let shapes = [
        (1, 1, 1),
        (5, 7, 3),
        (13, 17, 29),
        (70, 33, 130),
        (1, 40, 65),
        (65, 1, 2),
    ];
    for (i, &(m, k, n)) in shapes.iter().enumerate() {
        for (ca, cb) in [(false, true), (false, false), (true, false)] {
            let mut g = G::new(i as u64);
            let a = g.operand(&[m, k], ca);
            let b = g.operand(&[k, n], cb);
            let y = g.node(Op::MatMul, vec![Some(a), Some(b)]);
            assert_gpu(&g.check(y), "gpu matmul");
        }
    }
}

#[test]
fn matmul_batched_and_broadcast() {
    let cases: &[(&[usize], &[usize], bool)] = &[
        (&[2, 3, 5, 7], &[7, 9], true),
        (&[2, 3, 5, 7], &[7, 9], false),
        (&[2, 1, 5, 7], &[3, 7, 4], false),
        (&[3, 5, 7], &[3, 7, 20], true),
        (&[1, 70, 18], &[2, 18, 66], false),
        (&[7], &[7, 5], true),
        (&[3, 7], &[7], false),
        (&[4, 9, 19], &[19], false),
    ];
    for (i, (a, b, cb)) in cases.iter().enumerate() {
        let mut g = G::new(100 + i as u64);
        let a = g.input(a);
        let b = g.operand(b, *cb);
        let y = g.node(Op::MatMul, vec![Some(a), Some(b)]);
        assert_gpu(&g.check(y), "gpu matmul");
    }
}

#[test]
fn gemm_variants() {
    let (m, k, n) = (11, 23, 67);
    for trans_a in [false, true] {
        for trans_b in [false, true] {
            for (cshape, cconst) in [
                (None, false),
                (Some(vec![n]), true),
                (Some(vec![m, 1]), false),
                (Some(vec![m, n]), true),
                (Some(vec![]), true),
                (Some(vec![m, n]), false),
                (Some(vec![1, n]), false),
            ] {
                for (aconst, bconst) in [(false, true), (false, false), (true, false)] {
                    let mut g = G::new(7);
                    let a = g.operand(&if trans_a { [k, m] } else { [m, k] }, aconst);
                    let b = g.operand(&if trans_b { [n, k] } else { [k, n] }, bconst);
                    let c = cshape.as_ref().map(|s| g.operand(s, cconst));
                    let op = Op::Gemm {
                        alpha: 1.5,
                        beta: if cconst { 0.5 } else { -1.25 },
                        trans_a,
                        trans_b,
                    };
                    let y = g.node(op, vec![Some(a), Some(b), c]);
                    assert_gpu(&g.check(y), "gpu gemm");
                }
            }
        }
    }
}

#[test]
fn conv_shapes() {
    // (n, c, h, w, m, kernel, stride, pads, dilation, group)
    let cases = [
        (1, 3, 9, 11, 5, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
        (2, 4, 8, 8, 8, [1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1),
        (1, 16, 7, 7, 13, [1, 1], [2, 2], [0, 0, 0, 0], [1, 1], 1),
        (1, 3, 23, 23, 16, [7, 7], [2, 2], [3, 3, 3, 3], [1, 1], 1),
        (1, 5, 12, 10, 7, [3, 3], [1, 1], [2, 1, 0, 2], [2, 2], 1),
        (1, 6, 13, 9, 6, [3, 2], [2, 1], [1, 0, 1, 1], [1, 2], 2),
        (2, 8, 6, 6, 12, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 4),
        (1, 4, 6, 6, 8, [1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 2),
        (1, 20, 12, 12, 70, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
    ];
    for (i, &(n, c, h, w, m, k, s, p, d, grp)) in cases.iter().enumerate() {
        for bias in [true, false] {
            let mut g = G::new(200 + i as u64);
            let x = g.input(&[n, c, h, w]);
            let wt = g.constant(&[m, c / grp, k[0], k[1]]);
            let b = bias.then(|| g.constant(&[m]));
            let y = g.node(conv(k, s, p, d, grp), vec![Some(x), Some(wt), b]);
            assert_gpu(&g.check(y), "gpu conv");
        }
    }
    // A bias computed at run time.
    let mut g = G::new(250);
    let x = g.input(&[1, 3, 5, 5]);
    let wt = g.constant(&[4, 3, 3, 3]);
    let b = g.input(&[4]);
    let y = g.node(
        conv([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
        vec![Some(x), Some(wt), Some(b)],
    );
    assert_gpu(&g.check(y), "gpu conv");
}

#[test]
fn depthwise_shapes() {
    // (n, c, h, w, k, stride, pad, dilation)
    let cases = [
        (1, 8, 14, 14, 3, 1, 1, 1),
        (1, 5, 15, 13, 3, 2, 1, 1),
        (2, 3, 7, 7, 5, 1, 2, 1),
        (1, 6, 11, 12, 3, 3, 0, 2),
        (1, 3, 30, 31, 3, 1, 1, 1),
    ];
    for (i, &(n, c, h, w, k, s, p, d)) in cases.iter().enumerate() {
        let mut g = G::new(300 + i as u64);
        let x = g.input(&[n, c, h, w]);
        let wt = g.constant(&[c, 1, k, k]);
        let b = g.constant(&[c]);
        let y = g.node(
            conv([k, k], [s, s], [p, p, p, p], [d, d], c),
            vec![Some(x), Some(wt), Some(b)],
        );
        assert_gpu(&g.check(y), "gpu dwconv");
    }
}

#[test]
fn conv_1d_shapes() {
    // 1-D convolutions as 2-D ones of height 1. (n, c, l, m, k, stride, pads, dilation,
    // group): a speech front end's strided kernel, dilation, grouped, depthwise, pointwise.
    let cases = [
        (1, 1, 400, 8, 10, 5, [0, 0], 1, 1, "gpu conv"),
        (2, 6, 37, 10, 3, 1, [2, 2], 2, 1, "gpu conv"),
        (1, 8, 30, 12, 5, 2, [1, 3], 1, 4, "gpu conv"),
        (1, 7, 25, 7, 3, 1, [1, 1], 1, 7, "gpu dwconv"),
        (2, 16, 11, 9, 1, 1, [0, 0], 1, 1, "gpu conv"),
    ];
    for (i, &(n, c, l, m, k, s, p, d, grp, kind)) in cases.iter().enumerate() {
        let mut g = G::new(320 + i as u64);
        let x = g.input(&[n, c, l]);
        let wt = g.constant(&[m, c / grp, k]);
        let b = g.constant(&[m]);
        let op = Op::Conv(ConvAttrs {
            kernel_shape: vec![k],
            strides: vec![s],
            pads: p.to_vec(),
            dilations: vec![d],
            group: grp,
            auto_pad: AutoPad::NotSet,
            channels_last: false,
        });
        let y = g.node(op, vec![Some(x), Some(wt), Some(b)]);
        assert_gpu(&g.check(y), kind);
    }
}

/// The activations the epilogue fuses, as graph nodes after `v`.
fn activate(g: &mut G, v: ValueId, which: usize) -> ValueId {
    match which {
        0 => g.node(Op::Unary(Unary::Relu), vec![Some(v)]),
        1 => {
            g.names += 1;
            let lo = g.g.add_const(format!("lo{}", g.names), Tensor::scalar(-0.2f32));
            let hi = g.g.add_const(format!("hi{}", g.names), Tensor::scalar(0.3f32));
            g.node(Op::Clip, vec![Some(v), Some(lo), Some(hi)])
        }
        2 => g.node(Op::Unary(Unary::Sigmoid), vec![Some(v)]),
        3 => {
            let s = g.node(Op::Unary(Unary::Sigmoid), vec![Some(v)]);
            g.node(Op::Binary(Binary::Mul), vec![Some(v), Some(s)])
        }
        4 => g.node(Op::Unary(Unary::HardSwish), vec![Some(v)]),
        5 => g.node(Op::Unary(Unary::Gelu { tanh: false }), vec![Some(v)]),
        _ => g.node(Op::Unary(Unary::Gelu { tanh: true }), vec![Some(v)]),
    }
}

#[test]
fn fused_epilogues() {
    for act in 0..7 {
        for residual in [false, true] {
            // Conv: bias per row, residual, activation.
            let mut g = G::new(400 + act as u64);
            let x = g.input(&[2, 5, 9, 7]);
            let wt = g.constant(&[6, 5, 3, 3]);
            let b = g.constant(&[6]);
            let mut y = g.node(
                conv([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
                vec![Some(x), Some(wt), Some(b)],
            );
            if residual {
                let r = g.input(&[2, 6, 9, 7]);
                y = g.node(Op::Binary(Binary::Add), vec![Some(y), Some(r)]);
            }
            let y = activate(&mut g, y, act);
            let d = g.check(y);
            assert_eq!(d.len(), 1, "one fused kernel: {d:?}");
            assert_gpu(&d, "gpu conv");
            assert_eq!(d[0].contains("+residual"), residual, "{d:?}");

            // Depthwise.
            let mut g = G::new(450 + act as u64);
            let x = g.input(&[1, 4, 8, 9]);
            let wt = g.constant(&[4, 1, 3, 3]);
            let b = g.constant(&[4]);
            let mut y = g.node(
                conv([3, 3], [2, 2], [1, 1, 1, 1], [1, 1], 4),
                vec![Some(x), Some(wt), Some(b)],
            );
            if residual {
                let r = g.input(&[1, 4, 4, 5]);
                y = g.node(Op::Binary(Binary::Add), vec![Some(y), Some(r)]);
            }
            let y = activate(&mut g, y, act);
            let d = g.check(y);
            assert_eq!(d.len(), 1, "one fused kernel: {d:?}");
            assert_gpu(&d, "gpu dwconv");

            // MatMul: per-column bias, residual, activation (batched).
            let mut g = G::new(500 + act as u64);
            let a = g.input(&[2, 17, 24]);
            let w = g.constant(&[24, 70]);
            let mut y = g.node(Op::MatMul, vec![Some(a), Some(w)]);
            let bias = g.constant(&[70]);
            y = g.node(Op::Binary(Binary::Add), vec![Some(y), Some(bias)]);
            if residual {
                let r = g.input(&[2, 17, 70]);
                y = g.node(Op::Binary(Binary::Add), vec![Some(r), Some(y)]);
            }
            let y = activate(&mut g, y, act);
            let d = g.check(y);
            assert_eq!(d.len(), 1, "one fused kernel: {d:?}");
            assert_gpu(&d, "gpu matmul");
        }
    }
}

/// Asserts every GEMM-family kernel in `d` (not the bf16 autocast's Cast kernels) is
/// `what` on `kind` tensor cores — or, for a product with a side of at most 8 that cannot fill
/// the GPU, the matrix-vector kernel.
fn assert_mma_of(d: &[String], what: &str, kind: MmaKind) {
    let products: Vec<&String> = d.iter().filter(|s| !s.starts_with("gpu elementwise")).collect();
    let mark = format!("mma.{}", kind.name());
    assert!(
        !products.is_empty()
            && products
                .iter()
                .all(|s| s.starts_with(what) && (s.contains(&mark) || s.contains(" gemv "))),
        "kernels {d:?}, expected {what} on {} tensor cores",
        kind.name()
    );
}

fn assert_mma(d: &[String], what: &str) {
    assert_mma_of(d, what, MmaKind::Bf16)
}

fn assert_f16_mma(d: &[String], what: &str) {
    assert_mma_of(d, what, MmaKind::F16)
}

/// MatMuls of `new(seed)` graphs on `kind` tensor cores: tiles of 2 and 4 units (fewer
/// than the 8 warps) and of 8 to 32; edges along M, N and K; one and several K steps;
/// constant A or B; batched with broadcast.
fn matmuls_on_tensor_cores(new: fn(u64) -> G, seed: u64, kind: MmaKind) {
    let shapes = [
        (1, 1, 1),
        (5, 7, 3),
        (13, 17, 29),
        (30, 40, 20),
        (20, 16, 70),
        (64, 48, 64),
        (70, 33, 130),
        (1, 40, 65),
    ];
    // Five rows, but enough work and columns to fill the GPU with 16×16 tiles: tiles with a
    // ragged M edge.
    let mut g = new(seed + 30);
    let a = g.operand(&[5, 200], false);
    let b = g.operand(&[200, 4300], true);
    let y = g.node(Op::MatMul, vec![Some(a), Some(b)]);
    let d = g.check(y);
    assert!(
        d.iter().any(|s| s.contains(&format!("mma.{}", kind.name()))),
        "{d:?}"
    );
    for (i, &(m, k, n)) in shapes.iter().enumerate() {
        for (ca, cb) in [(false, true), (false, false), (true, false)] {
            let mut g = new(seed + i as u64);
            let a = g.operand(&[m, k], ca);
            let b = g.operand(&[k, n], cb);
            let y = g.node(Op::MatMul, vec![Some(a), Some(b)]);
            assert_mma_of(&g.check(y), "gpu matmul", kind);
        }
    }
    let mut g = new(seed + 20);
    let a = g.input(&[2, 1, 18, 24]);
    let b = g.input(&[3, 24, 20]);
    let y = g.node(Op::MatMul, vec![Some(a), Some(b)]);
    assert_mma_of(&g.check(y), "gpu matmul", kind);
}

#[test]
fn bf16_matmul_on_tensor_cores() {
    matmuls_on_tensor_cores(G::bf16, 700, MmaKind::Bf16);
}

#[test]
fn bf16_gemm_and_conv_on_tensor_cores() {
    for (trans_a, trans_b) in [(false, false), (true, true), (false, true)] {
        let (m, k, n) = (19, 37, 45);
        let mut g = G::bf16(730);
        let a = g.operand(&if trans_a { [k, m] } else { [m, k] }, false);
        let b = g.operand(&if trans_b { [n, k] } else { [k, n] }, true);
        let c = g.constant(&[n]);
        let op = Op::Gemm {
            alpha: 0.75,
            beta: 1.5,
            trans_a,
            trans_b,
        };
        let y = g.node(op, vec![Some(a), Some(b), Some(c)]);
        assert_mma(&g.check(y), "gpu gemm");
    }
    // (n, c, h, w, m, kernel, stride, pads, dilation, group): implicit GEMM, pointwise,
    // strided, grouped, 70 output channels (edge tiles).
    let cases = [
        (1, 3, 9, 11, 5, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
        (2, 16, 8, 8, 24, [1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1),
        (1, 5, 12, 10, 7, [3, 3], [2, 2], [2, 1, 0, 2], [2, 2], 1),
        (2, 8, 6, 6, 12, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 4),
        (1, 20, 12, 12, 70, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
    ];
    for (i, &(n, c, h, w, m, k, s, p, d, grp)) in cases.iter().enumerate() {
        let mut g = G::bf16(740 + i as u64);
        let x = g.input(&[n, c, h, w]);
        let wt = g.constant(&[m, c / grp, k[0], k[1]]);
        let b = g.constant(&[m]);
        let y = g.node(conv(k, s, p, d, grp), vec![Some(x), Some(wt), Some(b)]);
        assert_mma(&g.check(y), "gpu conv");
    }
}

#[test]
fn bf16_fused_epilogues_on_tensor_cores() {
    for act in [0, 3, 5] {
        // Conv + bias + residual (f32) + activation, then MatMul + bias + residual.
        let mut g = G::bf16(760 + act as u64);
        let x = g.input(&[1, 6, 9, 7]);
        let wt = g.constant(&[10, 6, 3, 3]);
        let b = g.constant(&[10]);
        let y = g.node(
            conv([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
            vec![Some(x), Some(wt), Some(b)],
        );
        let r = g.input_f32(&[1, 10, 9, 7]);
        let y = g.node(Op::Binary(Binary::Add), vec![Some(y), Some(r)]);
        let y = activate(&mut g, y, act);
        let d = g.check(y);
        assert_mma(&d, "gpu conv");
        assert!(d.iter().any(|s| s.contains("+residual")), "{d:?}");

        let mut g = G::bf16(770 + act as u64);
        let a = g.input(&[2, 17, 24]);
        let w = g.constant(&[24, 40]);
        let y = g.node(Op::MatMul, vec![Some(a), Some(w)]);
        let bias = g.constant(&[40]);
        let y = g.node(Op::Binary(Binary::Add), vec![Some(y), Some(bias)]);
        let r = g.input_f32(&[2, 17, 40]);
        let y = g.node(Op::Binary(Binary::Add), vec![Some(r), Some(y)]);
        let y = activate(&mut g, y, act);
        assert_mma(&g.check(y), "gpu matmul");
    }
}

#[test]
fn tensor_cores_only_for_bf16_values_from_sm_80() {
    use crate::plan;
    use crate::target::TargetDesc;
    let describe = |g: &Graph, sm: u32| -> Vec<String> {
        let plan = plan::build(g, &TargetDesc::cuda(sm).unwrap(), true).unwrap();
        plan.kernels.iter().map(|k| k.describe()).collect()
    };
    let mma = |d: &[String]| d.iter().any(|s| s.contains("mma.bf16"));
    // bf16 operands: tensor cores on sm_80 and sm_90, not on sm_75 (no bf16 mma).
    let mut g = G::bf16(780);
    let a = g.input(&[24, 32]);
    let b = g.constant(&[32, 16]);
    let y = g.node(Op::MatMul, vec![Some(a), Some(b)]);
    g.g.add_output("y", y);
    assert!(mma(&describe(&g.g, 80)) && mma(&describe(&g.g, 90)));
    assert!(!mma(&describe(&g.g, 75)));
    // One f32 operand (an input, or a weight that is not all bf16 values): f32 SIMT.
    let mut g = G::bf16(781);
    let a = g.input_f32(&[8, 32]);
    let b = g.constant(&[32, 16]);
    let y = g.node(Op::MatMul, vec![Some(a), Some(b)]);
    g.g.add_output("y", y);
    assert!(!mma(&describe(&g.g, 80)));
    let mut g = G::new(782);
    let a = g.input(&[8, 32]);
    let a = g.node(Op::Cast { to: DType::BF16 }, vec![Some(a)]);
    let a = g.node(Op::Cast { to: DType::F32 }, vec![Some(a)]);
    let b = g.constant(&[32, 16]);
    let y = g.node(Op::MatMul, vec![Some(a), Some(b)]);
    g.g.add_output("y", y);
    assert!(!mma(&describe(&g.g, 80)));
}

#[test]
fn f16_matmul_and_gemm_on_tensor_cores() {
    matmuls_on_tensor_cores(G::f16, 800, MmaKind::F16);
    for (trans_a, trans_b, cconst) in [(false, false, true), (true, true, false), (false, true, false)] {
        let (m, k, n) = (19, 37, 45);
        let mut g = G::f16(820);
        let a = g.operand(&if trans_a { [k, m] } else { [m, k] }, false);
        let b = g.operand(&if trans_b { [n, k] } else { [k, n] }, true);
        let c = g.operand(&[n], cconst);
        let op = Op::Gemm {
            alpha: 0.75,
            beta: -1.5,
            trans_a,
            trans_b,
        };
        let y = g.node(op, vec![Some(a), Some(b), Some(c)]);
        assert_f16_mma(&g.check(y), "gpu gemm");
    }
}

#[test]
fn f16_convolutions() {
    // (n, c, h, w, m, kernel, stride, pads, dilation, group, bias): implicit GEMM,
    // pointwise, strided and dilated, grouped, 70 output channels (edge tiles), a bias
    // computed at run time.
    let cases = [
        (
            1,
            3,
            9,
            11,
            5,
            [3, 3],
            [1, 1],
            [1, 1, 1, 1],
            [1, 1],
            1,
            Some(true),
        ),
        (2, 16, 8, 8, 24, [1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1, None),
        (
            1,
            5,
            12,
            10,
            7,
            [3, 3],
            [2, 2],
            [2, 1, 0, 2],
            [2, 2],
            1,
            Some(true),
        ),
        (
            2,
            8,
            6,
            6,
            12,
            [3, 3],
            [1, 1],
            [1, 1, 1, 1],
            [1, 1],
            4,
            Some(false),
        ),
        (
            1,
            20,
            12,
            12,
            70,
            [3, 3],
            [1, 1],
            [1, 1, 1, 1],
            [1, 1],
            1,
            Some(true),
        ),
    ];
    for (i, &(n, c, h, w, m, k, s, p, d, grp, bias)) in cases.iter().enumerate() {
        let mut g = G::f16(830 + i as u64);
        let x = g.input(&[n, c, h, w]);
        let wt = g.constant(&[m, c / grp, k[0], k[1]]);
        let b = bias.map(|constant| g.operand(&[m], constant));
        let y = g.node(conv(k, s, p, d, grp), vec![Some(x), Some(wt), b]);
        assert_f16_mma(&g.check(y), "gpu conv");
    }
    // Depthwise: the direct kernel, reading and writing f16.
    let mut g = G::f16(840);
    let x = g.input(&[2, 6, 9, 7]);
    let wt = g.constant(&[6, 1, 3, 3]);
    let b = g.constant(&[6]);
    let y = g.node(
        conv([3, 3], [2, 1], [1, 1, 1, 1], [1, 1], 6),
        vec![Some(x), Some(wt), Some(b)],
    );
    let d = g.check(y);
    assert!(d.iter().all(|s| s.starts_with("gpu dwconv3x3/2 f16")), "{d:?}");
}

#[test]
fn bf16_tensors_on_tensor_cores() {
    matmuls_on_tensor_cores(G::bf16_tensors, 900, MmaKind::Bf16);
    // A bf16 convolution with a run-time bias, and the same product before sm_80 (widened
    // values multiplied in f32, rounded once when stored).
    let mut g = G::bf16_tensors(920);
    let x = g.input(&[1, 6, 9, 9]);
    let w = g.constant(&[10, 6, 3, 3]);
    let b = g.input(&[10]);
    let y = g.node(
        conv([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
        vec![Some(x), Some(w), Some(b)],
    );
    assert_mma(&g.check(y), "gpu conv");
    let mut g = G::bf16_tensors(930);
    let a = g.input(&[21, 40]);
    let b = g.input(&[40, 33]);
    let y = g.node(Op::MatMul, vec![Some(a), Some(b)]);
    let d = g.check_for(y, 75);
    assert!(
        d.iter()
            .all(|s| s.starts_with("gpu matmul") && s.contains(" bf16 ")),
        "{d:?}"
    );
}

#[test]
fn f16_before_sm_80_runs_simt() {
    // sm_75 has no m16n8k16 f16 mma: the same kernel multiplies the widened values.
    let mut g = G::f16(850);
    let a = g.input(&[21, 40]);
    let b = g.constant(&[40, 33]);
    let y = g.node(Op::MatMul, vec![Some(a), Some(b)]);
    let d = g.check_for(y, 75);
    assert!(
        d.iter()
            .all(|s| s.starts_with("gpu matmul") && s.contains(" f16 ")),
        "{d:?}"
    );
    assert!(!d.iter().any(|s| s.contains("mma")), "{d:?}");
}

#[test]
fn ptx_assembles() {
    let mut graphs = vec![];
    // Conv + residual + GELU, then a depthwise conv without bias + SiLU.
    let mut g = G::new(600);
    let x = g.input(&[1, 5, 9, 7]);
    let wt = g.constant(&[6, 5, 3, 3]);
    let b = g.constant(&[6]);
    let y = g.node(
        conv([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
        vec![Some(x), Some(wt), Some(b)],
    );
    let r = g.input(&[1, 6, 9, 7]);
    let y = g.node(Op::Binary(Binary::Add), vec![Some(y), Some(r)]);
    let y = g.node(Op::Unary(Unary::Gelu { tanh: false }), vec![Some(y)]);
    let dw = g.constant(&[6, 1, 3, 3]);
    let y = g.node(
        conv([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 6),
        vec![Some(y), Some(dw), None],
    );
    let y = activate(&mut g, y, 3);
    g.g.add_output("y", y);
    graphs.push(g.g);
    // bf16 tensors: a MatMul of two run-time operands.
    let mut g = G::bf16_tensors(602);
    let a = g.input(&[19, 40]);
    let b = g.input(&[40, 24]);
    let y = g.node(Op::MatMul, vec![Some(a), Some(b)]);
    g.g.add_output("y", y);
    graphs.push(g.g);
    // Batched MatMul + GELU (tanh), Gemm with transposed B and a run-time C.
    let mut g = G::new(601);
    let a = g.input(&[3, 4, 10]);
    let w = g.constant(&[10, 7]);
    let z = g.node(Op::MatMul, vec![Some(a), Some(w)]);
    let z = activate(&mut g, z, 6);
    g.g.add_output("z", z);
    let a2 = g.input(&[5, 9]);
    let bt = g.input(&[7, 9]);
    let c = g.input(&[7]);
    let op = Op::Gemm {
        alpha: 1.0,
        beta: 1.0,
        trans_a: false,
        trans_b: true,
    };
    let z2 = g.node(op, vec![Some(a2), Some(bt), Some(c)]);
    g.g.add_output("z2", z2);
    graphs.push(g.g);
    // The same on tensor cores: bf16 conv + residual, bf16 batched MatMul.
    let mut g = G::bf16(602);
    let x = g.input(&[1, 6, 9, 7]);
    let wt = g.constant(&[20, 6, 3, 3]);
    let y = g.node(
        conv([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
        vec![Some(x), Some(wt), None],
    );
    let r = g.input_f32(&[1, 20, 9, 7]);
    let y = g.node(Op::Binary(Binary::Add), vec![Some(y), Some(r)]);
    g.g.add_output("y", y);
    let a = g.input(&[3, 40, 64]);
    let w = g.constant(&[64, 72]);
    let z = g.node(Op::MatMul, vec![Some(a), Some(w)]);
    g.g.add_output("z", z);
    graphs.push(g.g);
    // f16: conv with bias on tensor cores, depthwise conv, Gemm with a run-time C.
    let mut g = G::f16(603);
    let x = g.input(&[1, 6, 9, 7]);
    let wt = g.constant(&[20, 6, 3, 3]);
    let b = g.constant(&[20]);
    let y = g.node(
        conv([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
        vec![Some(x), Some(wt), Some(b)],
    );
    let dw = g.constant(&[20, 1, 3, 3]);
    let y = g.node(
        conv([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 20),
        vec![Some(y), Some(dw), None],
    );
    g.g.add_output("y", y);
    let a = g.input(&[5, 9]);
    let bt = g.constant(&[7, 9]);
    let c = g.input(&[5, 7]);
    let op = Op::Gemm {
        alpha: 1.0,
        beta: 1.0,
        trans_a: false,
        trans_b: true,
    };
    let z = g.node(op, vec![Some(a), Some(bt), Some(c)]);
    g.g.add_output("z", z);
    graphs.push(g.g);
    for graph in &graphs {
        for sm in [80, 90] {
            if !ptxas_check(graph, sm) {
                return;
            }
        }
    }
}

/// `[seq, 1, d] · [d, n]` (a seq-first export's projection) is one product of `seq` rows, with
/// its bias and residual; an epilogue that tells rows of an entry apart (a per-row bias, a
/// constant residual repeated per entry) keeps the batch, and every variant is correct.
#[test]
fn batch_of_rows_times_one_matrix_is_one_product() {
    let mut g = G::new(700);
    let a = g.input(&[12, 1, 40]);
    let w = g.constant(&[40, 24]);
    let mut y = g.node(Op::MatMul, vec![Some(a), Some(w)]);
    let bias = g.constant(&[24]);
    y = g.node(Op::Binary(Binary::Add), vec![Some(y), Some(bias)]);
    let r = g.input(&[12, 1, 24]);
    y = g.node(Op::Binary(Binary::Add), vec![Some(y), Some(r)]);
    let d = g.check(y);
    assert_eq!(d.len(), 1, "{d:?}");
    assert!(d[0].contains(" M=12 ") && d[0].contains(" batch=1"), "{d:?}");

    for per_row in [true, false] {
        let mut g = G::new(701);
        let a = g.input(&[3, 5, 40]);
        let w = g.constant(&[40, 24]);
        let mut y = g.node(Op::MatMul, vec![Some(a), Some(w)]);
        let e = g.constant(if per_row { &[5, 1] } else { &[5, 24] });
        y = g.node(Op::Binary(Binary::Add), vec![Some(y), Some(e)]);
        g.check(y);
    }
}

/// Products with few output tiles split K among blocks (the last block of a tile adds the
/// slices, applies the epilogue and resets its counter): f32 and on tensor cores, with bias,
/// residual and activation, a batched MatMul and a convolution (layer4 of ResNet-50 in
/// miniature: many input channels, few pixels). The emulator also checks that the counters
/// are back to zero after the run.
#[test]
fn split_k_for_few_tiles() {
    for new in [G::new as fn(u64) -> G, G::bf16] {
        let mut g = new(800);
        let a = g.input(&[2, 24, 700]);
        let w = g.constant(&[700, 40]);
        let mut y = g.node(Op::MatMul, vec![Some(a), Some(w)]);
        let bias = g.constant(&[40]);
        y = g.node(Op::Binary(Binary::Add), vec![Some(y), Some(bias)]);
        let r = g.input(&[2, 24, 40]);
        y = g.node(Op::Binary(Binary::Add), vec![Some(y), Some(r)]);
        let y = activate(&mut g, y, 1);
        let d = g.check(y);
        assert!(d.iter().any(|k| k.contains("split-k=")), "{d:?}");

        let mut g = new(801);
        let x = g.input(&[1, 96, 5, 5]);
        let wt = g.constant(&[20, 96, 3, 3]);
        let b = g.constant(&[20]);
        let y = g.node(
            conv([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
            vec![Some(x), Some(wt), Some(b)],
        );
        let y = activate(&mut g, y, 1);
        let d = g.check(y);
        assert!(d.iter().any(|k| k.contains("split-k=")), "{d:?}");
    }
    // K too short to share: no split.
    let mut g = G::new(802);
    let a = g.input(&[8, 40]);
    let w = g.constant(&[40, 8]);
    let y = g.node(Op::MatMul, vec![Some(a), Some(w)]);
    let d = g.check(y);
    assert!(!d[0].contains("split-k"), "{d:?}");
}

/// `x` rounded to TF32 on the host as `cvt.rna.tf32.f32` does (nearest, ties away from zero).
fn tf32(x: f32) -> f32 {
    f32::from_bits(x.to_bits().wrapping_add(0x1000) & 0xffff_e000)
}

/// `--precision tf32`: f32 products (a MatMul with odd edges, a padded convolution as implicit
/// GEMM, split-K included) on `mma.m16n8k8.tf32`, equal to the reference on the operands
/// rounded to TF32 — and not to the f32 result, so the rounding does happen.
#[test]
fn tf32_products_round_their_operands() {
    use crate::nvptx::emulate::{compare, run_plan};
    use crate::plan;
    use crate::target::TargetDesc;
    let mut rng = Rng::new(790);
    let mut data = |shape: &[usize]| Tensor::from_vec(shape.to_vec(), rng.vec(shape.iter().product()));
    let cases: Vec<(Op, Vec<usize>, Vec<usize>)> = vec![
        (Op::MatMul, vec![37, 72], vec![72, 45]),
        (
            conv([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
            vec![1, 8, 9, 9],
            vec![16, 8, 3, 3],
        ),
        // Few output tiles and a long K: split-K.
        (Op::MatMul, vec![16, 1024], vec![1024, 16]),
    ];
    for (op, xs, ws) in cases {
        let (x, w) = (data(&xs), data(&ws));
        let graph = |x_const: Option<&Tensor>, w: &Tensor| {
            let mut g = Graph::new("t");
            let xv = match x_const {
                Some(t) => g.add_const("x", t.clone()),
                None => g.add_input("x", TensorType::fixed(DType::F32, &xs)),
            };
            let wv = g.add_const("w", w.clone());
            let y = g.add("p", op.clone(), vec![Some(xv), Some(wv)], "y").unwrap();
            g.add_output("y", y);
            g
        };
        let g = graph(None, &w);
        let mut target = TargetDesc::cuda(80).unwrap();
        target.tf32 = true;
        let plan = plan::build(&g, &target, true).unwrap();
        let what: Vec<String> = plan.kernels.iter().map(|k| k.describe()).collect();
        assert!(what[0].contains("mma.tf32"), "{what:?}");
        let got = run_plan(&g, &plan, &target, std::slice::from_ref(&x)).unwrap();
        let round = |t: &Tensor| {
            let v: Vec<f32> = t.to_f64_vec().iter().map(|&v| tf32(v as f32)).collect();
            Tensor::from_vec(t.shape().to_vec(), v)
        };
        let rounded = graph(Some(&round(&x)), &round(&w));
        let want = kiln_ir::eval::eval_graph(&rounded, vec![]).unwrap();
        compare(&what.join("; "), &got[0], &want[0]);
        let exact = kiln_ir::eval::eval_graph(&g, vec![x]).unwrap();
        let moved = got[0]
            .to_f64_vec()
            .iter()
            .zip(exact[0].to_f64_vec())
            .any(|(a, b)| (a - b).abs() > 1e-4 * b.abs().max(1.0));
        assert!(moved, "{what:?}: the TF32 result equals the f32 one");
        for sm in [80, 90] {
            let target = TargetDesc {
                tf32: true,
                ..TargetDesc::cuda(sm).unwrap()
            };
            if crate::nvptx::emulate::ptxas_check_target(&g, &target) {
                let plan = plan::build(&g, &target, true).unwrap();
                let ptx = crate::nvptx::device::build(&g, &plan, &target, "t").unwrap().ptx;
                assert!(
                    ptx.contains("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),
                    "sm_{sm}"
                );
            }
        }
    }
}

/// The autocast's `Cast<f32>(Cast<bf16>(x))` before a product on bf16 tensor cores is
/// absorbed: the product reads `x` and rounds it as it stages it (a MatMul's A; a 3×3 and a
/// 1×1 convolution's input, gathered and read directly), so the plan is the product alone, and
/// the results are those of the unabsorbed casts.
#[test]
fn bf16_rounding_pairs_absorbed_by_tensor_core_products() {
    use crate::plan;
    use crate::target::TargetDesc;
    let cases: Vec<(Op, Vec<usize>, Vec<usize>)> = vec![
        (Op::MatMul, vec![24, 40], vec![40, 16]),
        (
            conv([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
            vec![1, 8, 7, 7],
            vec![16, 8, 3, 3],
        ),
        (
            conv([1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1),
            vec![1, 8, 7, 7],
            vec![16, 8, 1, 1],
        ),
    ];
    for (seed, (op, xs, ws)) in cases.into_iter().enumerate() {
        let mut g = G::bf16(800 + seed as u64);
        // A graph input, rounded for the product.
        let x = g.input_f32(&xs);
        let x = g.node(Op::Cast { to: DType::BF16 }, vec![Some(x)]);
        let x = g.node(Op::Cast { to: DType::F32 }, vec![Some(x)]);
        let w = g.constant(&ws);
        let y = g.node(op, vec![Some(x), Some(w)]);
        g.g.add_output("y", y);
        let plan = plan::build(&g.g, &TargetDesc::cuda(80).unwrap(), true).unwrap();
        let what: Vec<String> = plan.kernels.iter().map(|k| k.describe()).collect();
        assert_eq!(what.len(), 1, "{what:?}");
        assert!(what[0].contains("mma.bf16"), "{what:?}");
        assert_eq!(plan.kernels[0].fused.len(), 2, "the two casts: {what:?}");
        check_graph_for(&g.g, &g.inputs, 80);
    }
    // A product's (fused) result rounded for the next product, as in a bf16 CNN: two kernels.
    let mut g = G::bf16(810);
    let x = g.input(&[16, 32]);
    let w = g.constant(&[32, 24]);
    let h = g.node(Op::MatMul, vec![Some(x), Some(w)]);
    let h = g.node(Op::Unary(Unary::Relu), vec![Some(h)]);
    let h = g.node(Op::Cast { to: DType::BF16 }, vec![Some(h)]);
    let h = g.node(Op::Cast { to: DType::F32 }, vec![Some(h)]);
    let w2 = g.constant(&[24, 16]);
    let y = g.node(Op::MatMul, vec![Some(h), Some(w2)]);
    g.g.add_output("y", y);
    let plan = plan::build(&g.g, &TargetDesc::cuda(80).unwrap(), true).unwrap();
    let what: Vec<String> = plan.kernels.iter().map(|k| k.describe()).collect();
    assert!(
        what.len() == 2 && what.iter().all(|d| d.contains("mma.bf16")),
        "{what:?}"
    );
    check_graph_for(&g.g, &g.inputs, 80);
}

/// Products with a side of at most 8 that tiles cannot fill the GPU with run a warp per
/// output element: a classifier Gemm at batch 1 (bias, B transposed), a squeeze-and-excitation
/// 1×1 convolution of a pooled vector with bias and Sigmoid, a batched MatMul with three rows,
/// in f32, f16 and with bf16 autocast operands.
#[test]
fn gemv_shaped_products() {
    for (seed, new) in [(900, G::new as fn(u64) -> G), (910, G::f16), (920, G::bf16)] {
        let mut g = new(seed);
        let x = g.input(&[1, 300]);
        let w = g.constant(&[70, 300]);
        let c = g.constant(&[70]);
        let op = Op::Gemm {
            alpha: 1.0,
            beta: 1.0,
            trans_a: false,
            trans_b: true,
        };
        let y = g.node(op, vec![Some(x), Some(w), Some(c)]);
        let d = g.check(y);
        assert!(
            d.iter()
                .any(|s| s.starts_with("gpu gemm gemv") && s.contains("M=1 N=70 K=300")),
            "{d:?}"
        );

        let mut g = new(seed + 1);
        let x = g.input(&[1, 40, 1, 1]);
        let w = g.constant(&[96, 40, 1, 1]);
        let b = g.constant(&[96]);
        let y = g.node(
            conv([1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1),
            vec![Some(x), Some(w), Some(b)],
        );
        let y = activate(&mut g, y, 2);
        let d = g.check(y);
        assert!(
            d.iter()
                .any(|s| s.contains("gemv") && s.contains("M=96 N=1 K=40")),
            "{d:?}"
        );

        let mut g = new(seed + 2);
        let a = g.input(&[4, 3, 77]);
        let b = g.input(&[4, 77, 50]);
        let y = g.node(Op::MatMul, vec![Some(a), Some(b)]);
        let d = g.check(y);
        assert!(d.iter().any(|s| s.contains("gemv")), "{d:?}");
    }
    let mut g = G::new(930);
    let x = g.input(&[1, 300]);
    let w = g.constant(&[300, 70]);
    let y = g.node(Op::MatMul, vec![Some(x), Some(w)]);
    g.g.add_output("y", y);
    for sm in [80, 90] {
        ptxas_check(&g.g, sm);
    }
}

/// Exporters wrap a 2-D product in `[B·S, N] → [B, S, N]` reshapes before the residual Add
/// (GPT-2's projections, the torch encoder's out-projection): the bias, the reshape and the
/// residual still fuse into the product's epilogue on the GPU, one kernel, reading the
/// residual at the product's own positions.
#[test]
fn residual_after_a_reshape_fuses_into_the_epilogue() {
    let mut rng = Rng::new(31);
    let mut g = Graph::new("t");
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[40, 24]));
    let r = g.add_input("r", TensorType::fixed(DType::F32, &[2, 20, 16]));
    let w = g.add_const("w", Tensor::from_vec(vec![24, 16], rng.vec(24 * 16)));
    let b = g.add_const("b", Tensor::from_vec(vec![16], rng.vec(16)));
    let shape = g.add_const("shape", Tensor::from_vec(vec![3], vec![2i64, 20, 16]));
    let m = g.add("mm", Op::MatMul, vec![Some(x), Some(w)], "m").unwrap();
    let mb = g
        .add("bias", Op::Binary(Binary::Add), vec![Some(m), Some(b)], "mb")
        .unwrap();
    let v = g
        .add(
            "view",
            Op::Reshape { allow_zero: false },
            vec![Some(mb), Some(shape)],
            "v",
        )
        .unwrap();
    let y = g
        .add("res", Op::Binary(Binary::Add), vec![Some(v), Some(r)], "y")
        .unwrap();
    g.add_output("y", y);
    let inputs = [
        Tensor::from_vec(vec![40, 24], rng.vec(40 * 24)),
        Tensor::from_vec(vec![2, 20, 16], rng.vec(2 * 20 * 16)),
    ];
    let d = check_graph_for(&g, &inputs, 80);
    assert_eq!(d.len(), 1, "{d:?}");
    assert!(d[0].contains("+residual"), "{d:?}");
}
