//! Tests of the generated elementwise loops against the reference interpreter, single nodes
//! and the groups `fuse` forms.

use super::*;
use crate::node::NodeInfo;
use crate::test_rng::TestRng;
use kiln_ir::{Dim, Tensor, TensorType};

/// A graph under construction with its runtime inputs' data.
struct G {
    g: Graph,
    data: Vec<Tensor>,
    rng: TestRng,
}

impl G {
    fn new() -> G {
        G {
            g: Graph::new("ew"),
            data: vec![],
            rng: TestRng::new(7),
        }
    }

    fn rand(&mut self, n: usize) -> Vec<f32> {
        self.rng.vec_scaled(n, 4.0)
    }

    fn input(&mut self, dtype: DType, shape: &[usize]) -> ValueId {
        let n: usize = shape.iter().product();
        let r = self.rand(n);
        let s = shape.to_vec();
        let t = match dtype {
            DType::F32 => Tensor::from_vec(s, r),
            DType::I32 => Tensor::from_vec(s, r.iter().map(|x| (x * 1000.0) as i32).collect()),
            DType::I64 => Tensor::from_vec(s, r.iter().map(|x| (x * 1e6) as i64).collect()),
            _ => Tensor::from_vec(s, r.iter().map(|x| *x > 0.0).collect::<Vec<bool>>()),
        };
        self.data.push(t);
        let ty = TensorType::new(dtype, shape.iter().map(|&d| Dim::Fixed(d)).collect());
        self.g.add_input(format!("in{}", self.data.len()), ty)
    }

    /// A run-time input holding `t`.
    fn input_values(&mut self, t: Tensor) -> ValueId {
        let ty = TensorType::fixed(t.dtype(), t.shape());
        self.data.push(t);
        self.g.add_input(format!("in{}", self.data.len()), ty)
    }

    fn op(&mut self, op: Op, ins: &[ValueId]) -> ValueId {
        let n = self.g.len();
        self.g
            .add(
                format!("n{n}"),
                op,
                ins.iter().map(|v| Some(*v)).collect(),
                format!("v{n}"),
            )
            .unwrap()
    }

    fn konst(&mut self, t: Tensor) -> ValueId {
        let n = self.g.len();
        self.g.add_const(format!("c{n}"), t)
    }

    /// Groups the graph's elementwise nodes (as the planner does), generates the one group
    /// that must cover them all, runs it on 1 and 2 threads and compares with the evaluator.
    fn check(mut self, out: ValueId, expect_nodes: usize) {
        self.g.add_output("y", out);
        let want = kiln_ir::eval::eval_graph(&self.g, self.data.clone())
            .unwrap()
            .remove(0);
        let groups = crate::fuse::find_elementwise_groups(&self.g, &Default::default());
        assert_eq!(groups.len(), 1, "one group");
        assert_eq!(groups[0].len(), expect_nodes, "every node in the group");
        assert_eq!(*groups[0].last().unwrap(), out.node);
        let target = TargetDesc::host().unwrap();
        let (k, ext) = lower_group(&self.g, &groups[0], &target).expect("lowered");
        // The harness passes f32 buffers: carry every dtype's bytes in them.
        let words = |b: Vec<u8>| -> Vec<f32> {
            let mut b = b;
            b.resize(b.len().div_ceil(4) * 4 + 4, 0);
            b.chunks(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        let inputs: Vec<Option<Vec<f32>>> = ext
            .iter()
            .map(|v| {
                let t = match self.g.known_value(*v) {
                    Some(t) => t.clone(),
                    None => {
                        let i = self.g.inputs().iter().position(|n| n.out(0) == *v).unwrap();
                        self.data[i].clone()
                    }
                };
                Some(words(t.to_le_bytes()))
            })
            .collect();
        let want_bytes = want.to_le_bytes();
        let node = NodeInfo::new(&self.g, out.node);
        for threads in [1, 2] {
            let (got, _) = super::super::testing::run_kernel(
                k.as_ref(),
                &node,
                &target,
                &inputs,
                want_bytes.len().div_ceil(4) + 1,
                threads,
                0,
            );
            let got: Vec<u8> = got
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .take(want_bytes.len())
                .collect();
            if want.dtype() == DType::F32 {
                let w = want.as_slice::<f32>().unwrap();
                for (i, c) in got.chunks(4).enumerate() {
                    let g = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    assert!(
                        g == w[i]
                            || (g - w[i]).abs() <= 1e-6 + 2e-6 * w[i].abs()
                            || (g.is_nan() && w[i].is_nan()),
                        "{}: element {i}: got {g}, want {}",
                        k.describe(),
                        w[i]
                    );
                }
            } else {
                assert_eq!(got, want_bytes, "{}", k.describe());
            }
        }
    }
}

#[test]
fn f32_chain_with_broadcast_inputs() {
    let mut g = G::new();
    let x = g.input(DType::F32, &[2, 3, 4, 13]);
    let s = g.input(DType::F32, &[3, 1, 1]);
    let c = g.input(DType::F32, &[13]);
    let m = g.op(Op::Binary(Binary::Mul), &[x, s]);
    let a = g.op(Op::Binary(Binary::Add), &[m, c]);
    let t = g.op(Op::Unary(Unary::Sigmoid), &[a]);
    let u = g.op(Op::Binary(Binary::Mul), &[a, t]);
    let e = g.op(Op::Unary(Unary::Tanh), &[u]);
    let h = g.op(Op::Unary(Unary::HardSwish), &[e]);
    g.check(h, 6);
}

#[test]
fn f32_transcendentals_and_scalar_constants() {
    let mut g = G::new();
    let x = g.input(DType::F32, &[5, 37]);
    let k = g.konst(Tensor::scalar(0.25f32));
    let d = g.op(Op::Binary(Binary::Div), &[x, k]);
    let e = g.op(Op::Unary(Unary::Exp), &[d]);
    let ab = g.op(Op::Unary(Unary::Abs), &[x]);
    let sq = g.op(Op::Unary(Unary::Sqrt), &[ab]);
    let mx = g.op(Op::Binary(Binary::Max), &[e, sq]);
    let lo = g.konst(Tensor::scalar(-1.0f32));
    let hi = g.konst(Tensor::scalar(100.0f32));
    let cl = g.op(Op::Clip, &[mx, lo, hi]);
    let lr = g.op(Op::Unary(Unary::LeakyRelu { alpha: 0.1 }), &[cl]);
    g.check(lr, 7);
}

#[test]
fn integer_arithmetic_is_exact() {
    for dtype in [DType::I32, DType::I64] {
        let mut g = G::new();
        let a = g.input(dtype, &[3, 17]);
        let b = g.input(dtype, &[17]);
        let s = g.op(Op::Binary(Binary::Add), &[a, b]);
        let m = g.op(Op::Binary(Binary::Mul), &[s, a]);
        let n = g.op(Op::Unary(Unary::Neg), &[m]);
        let r = g.op(Op::Binary(Binary::Max), &[n, b]);
        let ab = g.op(Op::Unary(Unary::Abs), &[r]);
        g.check(ab, 5);
    }
}

#[test]
fn comparisons_produce_bool() {
    let mut g = G::new();
    let x = g.input(DType::F32, &[4, 19]);
    let y = g.input(DType::F32, &[19]);
    let f = g.input(DType::Bool, &[4, 1]);
    let lt = g.op(Op::Binary(Binary::Less), &[x, y]);
    let a = g.op(Op::Binary(Binary::And), &[lt, f]);
    let n = g.op(Op::Unary(Unary::Not), &[a]);
    let i = g.input(DType::I64, &[4, 19]);
    let z = g.konst(Tensor::scalar(0i64));
    let ge = g.op(Op::Binary(Binary::GreaterOrEqual), &[i, z]);
    let o = g.op(Op::Binary(Binary::Xor), &[n, ge]);
    g.check(o, 5);
}

#[test]
fn where_and_casts() {
    let mut g = G::new();
    let x = g.input(DType::F32, &[3, 2, 21]);
    let q = g.input(DType::I32, &[2, 21]);
    let z = g.konst(Tensor::scalar(0.0f32));
    let c = g.op(Op::Binary(Binary::Greater), &[x, z]);
    let qf = g.op(Op::Cast { to: DType::F32 }, &[q]);
    let w = g.op(Op::Where, &[c, x, qf]);
    let cb = g.op(Op::Cast { to: DType::I64 }, &[c]);
    let cf = g.op(Op::Cast { to: DType::F32 }, &[cb]);
    let y = g.op(Op::Binary(Binary::Sub), &[w, cf]);
    g.check(y, 6);
}

#[test]
fn large_rows_split_into_blocks() {
    let mut g = G::new();
    let x = g.input(DType::F32, &[3, 40003]);
    let b = g.input(DType::F32, &[3, 1]);
    let a = g.op(Op::Binary(Binary::Add), &[x, b]);
    let r = g.op(Op::Unary(Unary::Relu), &[a]);
    g.check(r, 2);
}

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
    // u8 in the middle of a group: values on both sides of each rounding tie, past both
    // saturation limits, and NaN (which quantizes to the range's low end).
    let mut g = G::new();
    let x = g.input(DType::F32, &[3, 37]);
    let mut vals = g.data[0].as_slice::<f32>().unwrap().to_vec();
    vals[..8].copy_from_slice(&[0.01, 0.03, -0.01, -2.0, 5.0, 1e30, f32::NAN, -1e30]);
    g.data[0] = Tensor::from_vec(vec![3, 37], vals);
    let (s, z) = (g.konst(Tensor::scalar(0.02f32)), g.konst(Tensor::scalar(100u8)));
    let q = g.op(quantize(DType::U8), &[x, s, z]);
    let (s2, z2) = (g.konst(Tensor::scalar(0.03f32)), g.konst(Tensor::scalar(90u8)));
    let d = g.op(dequantize.clone(), &[q, s2, z2]);
    let r = g.op(Op::Unary(Unary::Relu), &[d]);
    g.check(r, 3);
    // An i8 result stored by the loop, and i8 read back.
    let mut g = G::new();
    let x = g.input(DType::F32, &[2, 41]);
    let k = g.konst(Tensor::scalar(7.0f32));
    let m = g.op(Op::Binary(Binary::Mul), &[x, k]);
    let (s, z) = (g.konst(Tensor::scalar(0.05f32)), g.konst(Tensor::scalar(-3i8)));
    let q = g.op(quantize(DType::I8), &[m, s, z]);
    g.check(q, 2);
    let mut g = G::new();
    let x = g.input(DType::F32, &[2, 41]);
    let s = g.konst(Tensor::scalar(0.05f32));
    let q = g.op(quantize(DType::I8), &[x, s]);
    let d = g.op(dequantize, &[q, s]);
    g.check(d, 2);
}

/// Parameters computed at run time, as DynamicQuantizeLinear's scale and zero point are: read
/// as broadcast operands, with the same results as constants.
#[test]
fn quantize_and_dequantize_with_run_time_parameters() {
    use kiln_ir::QuantOp;
    let mut g = G::new();
    let x = g.input(DType::F32, &[3, 37]);
    let s = g.input_values(Tensor::scalar(0.02f32));
    let z = g.input_values(Tensor::scalar(100u8));
    let quantize = Op::Quant(QuantOp::QuantizeLinear {
        axis: 1,
        block_size: 0,
        output_dtype: DType::U8,
        precision: None,
    });
    let q = g.op(quantize, &[x, s, z]);
    let dequantize = Op::Quant(QuantOp::DequantizeLinear {
        axis: 1,
        block_size: 0,
        output_dtype: None,
    });
    let d = g.op(dequantize, &[q, s, z]);
    g.check(d, 2);
}

/// f32 values with NaN and both infinities among them.
fn with_specials(mut v: Vec<f32>) -> Vec<f32> {
    let special = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        f32::MAX,
        -f32::NAN,
    ];
    for (i, s) in special.iter().enumerate() {
        v[i * 7] = *s;
    }
    v
}

#[test]
fn nan_and_infinity_tests() {
    for (pos, neg) in [(true, true), (true, false), (false, true)] {
        let mut g = G::new();
        let x = g.input(DType::F32, &[5, 23]);
        g.data[0] = Tensor::from_vec(
            vec![5, 23],
            with_specials(g.data[0].to_f64_vec().iter().map(|v| *v as f32).collect()),
        );
        let nan = g.op(Op::Unary(Unary::IsNaN), &[x]);
        let inf = g.op(
            Op::Unary(Unary::IsInf {
                detect_positive: pos,
                detect_negative: neg,
            }),
            &[x],
        );
        let either = g.op(Op::Binary(Binary::Or), &[nan, inf]);
        let z = g.konst(Tensor::scalar(0.0f32));
        let y = g.op(Op::Where, &[either, z, x]);
        g.check(y, 4);
    }
}

/// Divisors of zero, -1 and both signs, the most negative dividend.
fn division_operands<T: Copy>(min: T, ints: impl Fn(i64) -> T) -> (Vec<T>, Vec<T>) {
    let mut x: Vec<T> = (0..60).map(|i| ints((i * 37) % 41 - 20)).collect();
    let mut y: Vec<T> = (0..60).map(|i| ints((i * 11) % 13 - 6)).collect();
    x[0] = min;
    y[0] = ints(-1);
    x[1] = min;
    y[1] = ints(3);
    y[2] = ints(0);
    (x, y)
}

#[test]
fn integer_division_and_remainders() {
    for op in [Binary::Div, Binary::Mod, Binary::FMod] {
        for wide in [false, true] {
            let mut g = G::new();
            let a = g.input(if wide { DType::I64 } else { DType::I32 }, &[60]);
            let b = g.input(if wide { DType::I64 } else { DType::I32 }, &[60]);
            let (x, y) = if wide {
                let (x, y) = division_operands(i64::MIN, |v| v);
                (Tensor::from_vec(vec![60], x), Tensor::from_vec(vec![60], y))
            } else {
                let (x, y) = division_operands(i32::MIN, |v| v as i32);
                (Tensor::from_vec(vec![60], x), Tensor::from_vec(vec![60], y))
            };
            g.data[0] = x;
            g.data[1] = y;
            let r = g.op(Op::Binary(op), &[a, b]);
            let s = g.op(Op::Binary(Binary::Add), &[r, a]);
            g.check(s, 2);
        }
    }
}

#[test]
fn float_remainders() {
    for op in [Binary::Mod, Binary::FMod] {
        let mut g = G::new();
        let a = g.input(DType::F32, &[40]);
        let b = g.input(DType::F32, &[40]);
        let mut y: Vec<f32> = (0..40).map(|i| ((i * 7) % 9) as f32 * 0.75 - 3.0).collect();
        y[..4].copy_from_slice(&[0.0, f32::INFINITY, f32::NEG_INFINITY, -0.0]);
        let mut x: Vec<f32> = (0..40).map(|i| ((i * 13) % 23) as f32 * 0.5 - 5.5).collect();
        x[4] = f32::INFINITY;
        x[5] = 6.0;
        y[5] = -3.0;
        g.data[1] = Tensor::from_vec(vec![40], y);
        g.data[0] = Tensor::from_vec(vec![40], x);
        let r = g.op(Op::Binary(op), &[a, b]);
        g.check(r, 1);
    }
}

/// On AVX-512, `vmath::exp` scales by 2^n with `vscalefps` instead of two exact products by
/// halves of 2^n: the values must be the same bit for bit, subnormal results, overflow, the
/// clamps and NaN included. Exp, and Sigmoid (exp of -|x|, then a quotient), over a sweep of
/// [-110, 95] in steps of 1/1024 plus the specials, on this host's AVX-512 target against the
/// x86-64-v3 one (8 lanes, the two halves).
#[test]
fn exp_by_vscalefps_is_the_two_halves_bit_for_bit() {
    let host = TargetDesc::host().unwrap();
    if host.isa != crate::target::Isa::Avx512 {
        eprintln!("this CPU has no AVX-512: nothing to compare");
        return;
    }
    let avx2 = TargetDesc::select(None, Some("x86-64-v3")).unwrap();
    assert_eq!(avx2.f32_lanes(), 8);
    let sweep: Vec<f32> = (0..205 * 1024).map(|i| -110.0 + i as f32 / 1024.0).collect();
    let x = with_specials(sweep);
    for op in [Unary::Exp, Unary::Sigmoid] {
        let mut g = Graph::new("exp");
        let shape = [x.len()];
        let xv = g.add_input("x", TensorType::fixed(DType::F32, &shape));
        let y = g.add("y", Op::Unary(op.clone()), vec![Some(xv)], "y").unwrap();
        g.add_output("y", y);
        let group = [y.node];
        let node = NodeInfo::new(&g, y.node);
        let run = |target: &TargetDesc| -> Vec<u32> {
            let (k, _) = lower_group(&g, &group, target).expect("lowered");
            let (out, _) = super::super::testing::run_kernel(
                k.as_ref(),
                &node,
                target,
                &[Some(x.clone())],
                x.len(),
                1,
                0,
            );
            out.iter().map(|v| v.to_bits()).collect()
        };
        let (scalef, halves) = (run(&host), run(&avx2));
        for (i, (a, b)) in scalef.iter().zip(&halves).enumerate() {
            assert_eq!(
                a,
                b,
                "{op:?}({}): {} with vscalefps, {} with the two halves",
                x[i],
                f32::from_bits(*a),
                f32::from_bits(*b)
            );
        }
    }
}
