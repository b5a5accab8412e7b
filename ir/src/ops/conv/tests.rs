//! Unit tests of the conv family: the fast paths against straightforward definitions.

use super::*;
use crate::{PoolAttrs, PoolKind};

/// Deterministic pseudo-random values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}

fn tensor(dtype: DType, shape: &[usize], seed: u64) -> Tensor {
    let n = shape.iter().product();
    Tensor::new(shape.to_vec(), TensorData::from_f64s(dtype, values(n, seed))).expect("shape matches")
}

/// Infers, evaluates, and checks the evaluated shape against the inferred one.
fn run(op: &Op, inputs: &[Option<&Tensor>], n_out: usize) -> Result<Vec<Tensor>, OpError> {
    let types: Vec<Option<TensorType>> = inputs.iter().map(|t| t.map(|t| t.tensor_type())).collect();
    let icx = InferCtx {
        inputs: types.iter().map(|t| t.as_ref()).collect(),
        values: vec![None; inputs.len()],
        num_outputs: n_out,
    };
    let out_types = infer(op, &icx)?;
    let cx = EvalCtx {
        inputs: inputs.to_vec(),
        out_types: &out_types,
    };
    let out = eval(op, &cx)?;
    for (t, ty) in out.iter().zip(&out_types) {
        assert_eq!(
            t.tensor_type(),
            *ty,
            "evaluated type differs from the inferred one"
        );
    }
    Ok(out)
}

fn assert_close(actual: &Tensor, expected: &[f64], tol: f64) {
    let a = actual.to_f64_vec();
    assert_eq!(a.len(), expected.len());
    for (i, (x, y)) in a.iter().zip(expected).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "element {i}: {x} vs {y}");
    }
}

/// Conv by its definition, in f64.
fn naive_conv(x: &Tensor, w: &Tensor, b: Option<&Tensor>, axes: &[Axis], group: usize) -> Vec<f64> {
    let (xv, wv) = (x.to_f64_vec(), w.to_f64_vec());
    let (n, c, m) = (x.shape()[0], x.shape()[1], w.shape()[0]);
    let (cg, mg) = (c / group, m / group);
    let in_sp: Vec<usize> = axes.iter().map(|a| a.input).collect();
    let out_sp: Vec<usize> = axes.iter().map(|a| a.output).collect();
    let kern: Vec<usize> = axes.iter().map(|a| a.kernel).collect();
    let (in_n, out_n, k_n) = (
        in_sp.iter().product::<usize>(),
        out_sp.iter().product::<usize>(),
        kern.iter().product::<usize>(),
    );
    let mut y = vec![0.0; n * m * out_n];
    for b_ in 0..n {
        for mo in 0..m {
            let g = mo / mg;
            for o in 0..out_n {
                let op = util::unravel(o, &out_sp);
                let mut acc = b.map_or(0.0, |b| b.to_f64_vec()[mo]);
                for ci in 0..cg {
                    for t in 0..k_n {
                        let kp = util::unravel(t, &kern);
                        let mut off = 0;
                        let mut valid = true;
                        for (i, a) in axes.iter().enumerate() {
                            let s = a.source(op[i], kp[i]);
                            valid &= s >= 0 && (s as usize) < a.input;
                            off = off * a.input + s.max(0) as usize;
                        }
                        if valid {
                            let xi = (b_ * c + g * cg + ci) * in_n + off;
                            acc += xv[xi] * wv[(mo * cg + ci) * k_n + t];
                        }
                    }
                }
                y[(b_ * m + mo) * out_n + o] = acc;
            }
        }
    }
    y
}

fn conv_case(dtype: DType, x_shape: &[usize], w_shape: &[usize], attrs: ConvAttrs, bias: bool, tol: f64) {
    let x = tensor(dtype, x_shape, 1);
    let w = tensor(dtype, w_shape, 2);
    let b = bias.then(|| tensor(dtype, &[w_shape[0]], 3));
    let op = Op::Conv(attrs.clone());
    let y = run(&op, &[Some(&x), Some(&w), b.as_ref()], 1).expect("conv evaluates");
    let kernel = w_shape[2..].iter().map(|&k| Some(k)).collect();
    let win = WindowAttrs::new(
        kernel,
        &attrs.strides,
        &attrs.dilations,
        &attrs.pads,
        attrs.auto_pad,
        false,
    )
    .expect("valid attributes");
    let axes = win.axes(&x_shape[2..]).expect("valid geometry");
    let expected = naive_conv(&x, &w, b.as_ref(), &axes, attrs.group.max(1));
    assert_close(&y[0], &expected, tol);
}

fn attrs(
    strides: &[usize],
    pads: &[usize],
    dilations: &[usize],
    group: usize,
    auto_pad: AutoPad,
) -> ConvAttrs {
    ConvAttrs {
        kernel_shape: vec![],
        strides: strides.to_vec(),
        pads: pads.to_vec(),
        dilations: dilations.to_vec(),
        group,
        auto_pad,
        channels_last: false,
    }
}

#[test]
fn conv_matches_definition() {
    let f = DType::F32;
    let none = AutoPad::NotSet;
    // im2col + GEMM, 2-D with padding, strides, dilations, asymmetric pads.
    conv_case(
        f,
        &[2, 3, 7, 6],
        &[5, 3, 3, 3],
        attrs(&[], &[1, 1, 1, 1], &[], 1, none),
        true,
        1e-5,
    );
    conv_case(
        f,
        &[1, 4, 9, 8],
        &[6, 4, 3, 2],
        attrs(&[2, 3], &[1, 0, 2, 1], &[2, 1], 1, none),
        false,
        1e-5,
    );
    // Groups, 1-D, 3-D, pointwise.
    conv_case(
        f,
        &[2, 6, 5, 5],
        &[4, 3, 3, 3],
        attrs(&[], &[], &[], 2, none),
        true,
        1e-5,
    );
    conv_case(
        f,
        &[1, 3, 17],
        &[2, 3, 4],
        attrs(&[3], &[2, 1], &[2], 1, none),
        true,
        1e-5,
    );
    conv_case(
        f,
        &[1, 2, 4, 5, 6],
        &[3, 2, 2, 3, 2],
        attrs(&[1, 2, 1], &[1, 0, 1, 0, 1, 1], &[], 1, none),
        true,
        1e-5,
    );
    conv_case(
        f,
        &[2, 8, 3, 4],
        &[5, 8, 1, 1],
        attrs(&[], &[], &[], 1, none),
        true,
        1e-5,
    );
    // 1x1 kernel with end padding: not a plain matrix product of X.
    conv_case(
        f,
        &[1, 3, 3, 4],
        &[2, 3, 1, 1],
        attrs(&[], &[0, 0, 1, 2], &[], 1, none),
        true,
        1e-5,
    );
    // Depthwise, with a channel multiplier, and with a single input channel.
    conv_case(
        f,
        &[2, 4, 7, 7],
        &[4, 1, 3, 3],
        attrs(&[2, 2], &[1, 1, 1, 1], &[], 4, none),
        true,
        1e-5,
    );
    conv_case(
        f,
        &[1, 3, 6, 5],
        &[6, 1, 3, 2],
        attrs(&[], &[0, 1, 2, 0], &[2, 1], 3, none),
        false,
        1e-5,
    );
    conv_case(
        f,
        &[1, 1, 6, 5],
        &[4, 1, 3, 3],
        attrs(&[], &[], &[], 1, none),
        true,
        1e-5,
    );
    // auto_pad.
    conv_case(
        f,
        &[1, 2, 5, 6],
        &[3, 2, 3, 3],
        attrs(&[2, 2], &[], &[], 1, AutoPad::SameLower),
        false,
        1e-5,
    );
    conv_case(
        f,
        &[1, 2, 6, 5],
        &[3, 2, 2, 4],
        attrs(&[3, 1], &[], &[2, 1], 1, AutoPad::SameUpper),
        false,
        1e-5,
    );
    conv_case(
        f,
        &[1, 2, 6, 5],
        &[3, 2, 2, 3],
        attrs(&[2, 1], &[7, 7, 7, 7], &[], 1, AutoPad::Valid),
        false,
        1e-5,
    );
    // Other float types go through f32 (f16/bf16) or f64.
    conv_case(
        DType::F64,
        &[1, 3, 5, 5],
        &[2, 3, 3, 3],
        attrs(&[], &[1, 1, 1, 1], &[], 1, none),
        true,
        1e-12,
    );
    conv_case(
        DType::F16,
        &[1, 3, 5, 5],
        &[2, 3, 3, 3],
        attrs(&[], &[1, 1, 1, 1], &[], 1, none),
        true,
        2e-3,
    );
    conv_case(
        DType::BF16,
        &[1, 3, 5, 5],
        &[2, 3, 3, 3],
        attrs(&[], &[1, 1, 1, 1], &[], 1, none),
        true,
        2e-2,
    );
    // Large enough to use several threads in the product and in the depthwise loop.
    conv_case(
        f,
        &[1, 32, 20, 20],
        &[40, 32, 3, 3],
        attrs(&[], &[1, 1, 1, 1], &[], 1, none),
        true,
        1e-4,
    );
    conv_case(
        f,
        &[1, 64, 40, 40],
        &[64, 1, 3, 3],
        attrs(&[], &[1, 1, 1, 1], &[], 64, none),
        true,
        1e-5,
    );
}

#[test]
fn conv_rejects_inconsistent_inputs() {
    let x = tensor(DType::F32, &[1, 4, 5, 5], 1);
    let w = tensor(DType::F32, &[2, 3, 3, 3], 2);
    let err = run(
        &Op::Conv(attrs(&[], &[], &[], 1, AutoPad::NotSet)),
        &[Some(&x), Some(&w)],
        1,
    );
    assert!(err.is_err(), "channel mismatch accepted");
    let w = tensor(DType::F32, &[2, 4, 7, 7], 2);
    let err = run(
        &Op::Conv(attrs(&[], &[], &[], 1, AutoPad::NotSet)),
        &[Some(&x), Some(&w)],
        1,
    );
    assert!(err.unwrap_err().msg.contains("larger than the padded input"));
    let w = tensor(DType::F32, &[2, 4, 3, 3], 2);
    let err = run(
        &Op::Conv(attrs(&[0, 1], &[], &[], 1, AutoPad::NotSet)),
        &[Some(&x), Some(&w)],
        1,
    );
    assert!(err.is_err(), "zero stride accepted");
    let b = tensor(DType::F32, &[3], 3);
    let err = run(
        &Op::Conv(attrs(&[], &[], &[], 1, AutoPad::NotSet)),
        &[Some(&x), Some(&w), Some(&b)],
        1,
    );
    assert!(err.is_err(), "bias of the wrong length accepted");
}

#[test]
fn conv_with_empty_batch_gives_empty_output() {
    let x = tensor(DType::F32, &[0, 2, 5, 5], 1);
    let w = tensor(DType::F32, &[3, 2, 3, 3], 2);
    let y = run(
        &Op::Conv(attrs(&[], &[], &[], 1, AutoPad::NotSet)),
        &[Some(&x), Some(&w)],
        1,
    )
    .expect("evaluates");
    assert_eq!(y[0].shape(), &[0, 3, 3, 3]);
}

/// ConvTranspose by its definition: every input element scatters `x * w` into the output.
fn naive_conv_transpose(x: &Tensor, w: &Tensor, group: usize, axes: &[Axis]) -> Vec<f64> {
    let (xv, wv) = (x.to_f64_vec(), w.to_f64_vec());
    let (n, c) = (x.shape()[0], x.shape()[1]);
    let mg = w.shape()[1];
    let (cg, m) = (c / group, mg * group);
    let in_sp: Vec<usize> = axes.iter().map(|a| a.output).collect();
    let out_sp: Vec<usize> = axes.iter().map(|a| a.input).collect();
    let kern: Vec<usize> = axes.iter().map(|a| a.kernel).collect();
    let (in_n, out_n, k_n) = (
        in_sp.iter().product::<usize>(),
        out_sp.iter().product::<usize>(),
        kern.iter().product::<usize>(),
    );
    let mut y = vec![0.0; n * m * out_n];
    for b in 0..n {
        for ci in 0..c {
            let g = ci / cg;
            for i in 0..in_n {
                let ip = util::unravel(i, &in_sp);
                for mm in 0..mg {
                    for t in 0..k_n {
                        let kp = util::unravel(t, &kern);
                        let mut off = 0;
                        let mut valid = true;
                        for (d, a) in axes.iter().enumerate() {
                            let o = a.source(ip[d], kp[d]);
                            valid &= o >= 0 && (o as usize) < a.input;
                            off = off * a.input + o.max(0) as usize;
                        }
                        if valid {
                            let yi = (b * m + g * mg + mm) * out_n + off;
                            y[yi] += xv[(b * c + ci) * in_n + i] * wv[(ci * mg + mm) * k_n + t];
                        }
                    }
                }
            }
        }
    }
    y
}

fn conv_transpose_case(x_shape: &[usize], w_shape: &[usize], a: ConvTransposeAttrs, expected_out: &[usize]) {
    let x = tensor(DType::F32, x_shape, 4);
    let w = tensor(DType::F32, w_shape, 5);
    let y = run(&Op::ConvTranspose(a.clone()), &[Some(&x), Some(&w)], 1).expect("conv transpose evaluates");
    assert_eq!(&y[0].shape()[2..], expected_out);
    let xt = x.tensor_type();
    let (win, op, _) = check_conv_transpose(&a, &xt, &w.tensor_type(), None).expect("valid");
    let axes: Vec<Axis> = (0..x_shape.len() - 2)
        .map(|i| {
            transpose_axis(&a, &win, &op, i, Some(x_shape[i + 2]))
                .expect("valid")
                .expect("known")
        })
        .collect();
    assert_close(&y[0], &naive_conv_transpose(&x, &w, a.conv.group, &axes), 1e-5);
}

fn ct(conv: ConvAttrs, output_padding: &[usize], output_shape: &[usize]) -> ConvTransposeAttrs {
    ConvTransposeAttrs {
        conv,
        output_padding: output_padding.to_vec(),
        output_shape: output_shape.to_vec(),
    }
}

#[test]
fn conv_transpose_matches_definition() {
    let none = AutoPad::NotSet;
    conv_transpose_case(
        &[1, 1, 3, 3],
        &[1, 2, 3, 3],
        ct(attrs(&[], &[], &[], 1, none), &[], &[]),
        &[5, 5],
    );
    conv_transpose_case(
        &[2, 2, 3, 4],
        &[2, 3, 3, 2],
        ct(attrs(&[3, 2], &[1, 2, 0, 1], &[1, 2], 1, none), &[1, 1], &[]),
        &[9, 7],
    );
    conv_transpose_case(
        &[1, 4, 3],
        &[4, 2, 3],
        ct(attrs(&[2], &[], &[], 2, none), &[], &[]),
        &[7],
    );
    // output_shape larger than the natural extent: pads become negative at the end.
    conv_transpose_case(
        &[1, 1, 3, 3],
        &[1, 2, 3, 3],
        ct(attrs(&[3, 2], &[], &[], 1, none), &[], &[10, 8]),
        &[10, 8],
    );
    conv_transpose_case(
        &[1, 1, 3, 3],
        &[1, 2, 3, 3],
        ct(attrs(&[3, 2], &[], &[], 1, none), &[], &[8, 6]),
        &[8, 6],
    );
    conv_transpose_case(
        &[1, 1, 3, 3],
        &[1, 2, 3, 3],
        ct(attrs(&[2, 2], &[], &[], 1, AutoPad::SameUpper), &[], &[]),
        &[6, 6],
    );
    conv_transpose_case(
        &[1, 1, 3, 4],
        &[1, 2, 2, 3],
        ct(attrs(&[2, 3], &[], &[], 1, AutoPad::SameLower), &[], &[]),
        &[6, 12],
    );
    conv_transpose_case(
        &[1, 2, 2, 3, 2],
        &[2, 1, 2, 2, 2],
        ct(attrs(&[], &[], &[], 1, none), &[], &[]),
        &[3, 4, 3],
    );
}

fn pool(kind: PoolKind, kernel: &[usize], strides: &[usize], pads: &[usize], ceil_mode: bool) -> PoolAttrs {
    PoolAttrs {
        kind,
        kernel_shape: kernel.to_vec(),
        strides: strides.to_vec(),
        pads: pads.to_vec(),
        dilations: vec![],
        auto_pad: AutoPad::NotSet,
        ceil_mode,
        storage_order: 0,
        channels_last: false,
    }
}

#[test]
fn zero_stride_or_dilation_is_an_error_not_a_panic() {
    // Backends call resolve_axis directly (kiln_ir::ops::resolve_window_axis).
    assert!(resolve_axis(5, 2, 0, 1, (0, 0), AutoPad::SameUpper, false).is_err());
    assert!(resolve_axis(5, 2, 1, 0, (0, 0), AutoPad::NotSet, false).is_err());
    assert!(resolve_axis(5, 0, 1, 1, (0, 0), AutoPad::NotSet, false).is_err());
}

#[test]
fn ceil_mode_drops_a_window_starting_in_the_end_padding() {
    // in 5, kernel 2, stride 2, pads 0+1: ceil gives 3 windows, the last starting at 4 (inside).
    let a = resolve_axis(5, 2, 2, 1, (0, 1), AutoPad::NotSet, true).expect("valid");
    assert_eq!(a.output, 3);
    // in 4, kernel 1, stride 2, pads 0+1: ceil((4+1-1)/2)+1 = 3, but the third window would
    // start at 4, past the input: dropped.
    let a = resolve_axis(4, 1, 2, 1, (0, 1), AutoPad::NotSet, true).expect("valid");
    assert_eq!(a.output, 2);
}

#[test]
fn max_pool_indices_follow_storage_order() {
    let x = Tensor::from_vec(vec![1, 1, 2, 3], vec![1.0f32, 9.0, 2.0, 8.0, 3.0, 7.0]);
    let mut a = pool(PoolKind::Max, &[2, 2], &[1, 1], &[], false);
    let out = run(&Op::Pool(a.clone()), &[Some(&x)], 2).expect("evaluates");
    assert_eq!(out[0].to_f64_vec(), vec![9.0, 9.0]);
    assert_eq!(out[1].to_i64_vec(), vec![1, 1]);
    a.storage_order = 1;
    let out = run(&Op::Pool(a), &[Some(&x)], 2).expect("evaluates");
    // Column-major: (h=0, w=1) is 0 + 1 * 2.
    assert_eq!(out[1].to_i64_vec(), vec![2, 2]);
}

#[test]
fn average_pool_counts_padding_only_when_asked() {
    let x = Tensor::from_vec(vec![1, 1, 1, 2], vec![2.0f32, 4.0]);
    let avg = |count_include_pad| PoolKind::Average { count_include_pad };
    let out = run(
        &Op::Pool(pool(avg(false), &[1, 2], &[1, 1], &[0, 1, 0, 0], false)),
        &[Some(&x)],
        1,
    );
    assert_eq!(out.expect("evaluates")[0].to_f64_vec(), vec![2.0, 3.0]);
    let out = run(
        &Op::Pool(pool(avg(true), &[1, 2], &[1, 1], &[0, 1, 0, 0], false)),
        &[Some(&x)],
        1,
    );
    assert_eq!(out.expect("evaluates")[0].to_f64_vec(), vec![1.0, 3.0]);
}

#[test]
fn pools_reject_bad_attributes_without_panicking() {
    let x = tensor(DType::F32, &[1, 1, 4, 4], 1);
    let bad = [
        pool(PoolKind::Max, &[2], &[], &[], false),
        pool(PoolKind::Max, &[2, 2], &[], &[2, 0, 0, 0], false),
        pool(PoolKind::Max, &[5, 5], &[], &[], false),
        pool(PoolKind::Max, &[2, 2], &[1], &[], false),
    ];
    for a in bad {
        assert!(
            run(&Op::Pool(a.clone()), &[Some(&x)], 1).is_err(),
            "{a:?} accepted"
        );
    }
    let xi = Tensor::from_vec(vec![1, 1, 2], vec![1i32, 2]);
    assert!(run(
        &Op::Pool(pool(PoolKind::Max, &[1], &[], &[], false)),
        &[Some(&xi)],
        1
    )
    .is_err());
    let avg = PoolKind::Average {
        count_include_pad: false,
    };
    assert!(run(&Op::Pool(pool(avg, &[2, 2], &[], &[], false)), &[Some(&x)], 2).is_err());
}

#[test]
fn max_pool_is_exact_for_integers() {
    let x = Tensor::from_vec(vec![1, 1, 3], vec![-128i8, 127, 5]);
    let out = run(
        &Op::Pool(pool(PoolKind::Max, &[2], &[], &[1, 1], false)),
        &[Some(&x)],
        1,
    )
    .expect("evaluates");
    assert_eq!(out[0].as_slice::<i8>(), Some(&[-128i8, 127, 127, 5][..]));
}

#[test]
fn global_pools_reduce_every_spatial_axis() {
    let x = Tensor::from_vec(vec![1, 2, 2], vec![1.0f32, -3.0, 4.0, 0.0]);
    let avg = run(
        &Op::GlobalPool(PoolKind::Average {
            count_include_pad: false,
        }),
        &[Some(&x)],
        1,
    );
    assert_eq!(avg.expect("evaluates")[0].to_f64_vec(), vec![-1.0, 2.0]);
    let max = run(&Op::GlobalPool(PoolKind::Max), &[Some(&x)], 1).expect("evaluates");
    assert_eq!(max[0].shape(), &[1, 2, 1]);
    assert_eq!(max[0].to_f64_vec(), vec![1.0, 4.0]);
    let lp = run(&Op::GlobalPool(PoolKind::Lp { p: 2.0 }), &[Some(&x)], 1).expect("evaluates");
    assert_close(&lp[0], &[10f64.sqrt(), 4.0], 1e-6);
}

/// A tiny deterministic generator for the randomized tests.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % n.max(1)
    }
    fn list(&mut self, len: usize, below: usize) -> Vec<usize> {
        (0..len).map(|_| self.below(below)).collect()
    }
}

fn random_auto_pad(g: &mut Lcg) -> AutoPad {
    [
        AutoPad::NotSet,
        AutoPad::NotSet,
        AutoPad::SameUpper,
        AutoPad::SameLower,
        AutoPad::Valid,
    ][g.below(5)]
}

/// Random (often invalid) geometries: every one must either evaluate to the definition's
/// result or be rejected with an error, never panic; the inferred type must match.
#[test]
fn random_geometries_agree_with_definitions_or_are_rejected() {
    let mut g = Lcg(7);
    let (mut ok, mut rejected) = (0, 0);
    for _ in 0..1500 {
        let sp = 1 + g.below(3);
        let group = 1 + g.below(2);
        let c = group * (1 + g.below(2));
        let m = group * (1 + g.below(2));
        let mut x_shape = vec![g.below(3), c];
        x_shape.extend(g.list(sp, 6));
        let mut w_shape = vec![m, c / group];
        w_shape.extend((0..sp).map(|_| 1 + g.below(3)));
        let a = ConvAttrs {
            kernel_shape: vec![],
            strides: if g.below(2) == 0 { vec![] } else { g.list(sp, 3) },
            pads: if g.below(2) == 0 {
                vec![]
            } else {
                g.list(2 * sp, 3)
            },
            dilations: if g.below(2) == 0 { vec![] } else { g.list(sp, 3) },
            group,
            auto_pad: random_auto_pad(&mut g),
            channels_last: false,
        };
        let x = tensor(DType::F32, &x_shape, 1);
        let w = tensor(DType::F32, &w_shape, 2);
        match run(&Op::Conv(a.clone()), &[Some(&x), Some(&w)], 1) {
            Ok(y) => {
                ok += 1;
                let kernel = w_shape[2..].iter().map(|&k| Some(k)).collect();
                let win = WindowAttrs::new(kernel, &a.strides, &a.dilations, &a.pads, a.auto_pad, false)
                    .expect("accepted attributes");
                let axes = win.axes(&x_shape[2..]).expect("accepted geometry");
                assert_close(&y[0], &naive_conv(&x, &w, None, &axes, group), 1e-5);
            }
            Err(_) => rejected += 1,
        }
        // The same geometry as a ConvTranspose (W is [C, M/group, k...]) and as pools.
        let wt_shape: Vec<usize> = [c, m / group].iter().chain(&w_shape[2..]).copied().collect();
        let wt = tensor(DType::F32, &wt_shape, 3);
        let t = ConvTransposeAttrs {
            conv: a.clone(),
            output_padding: if g.below(3) == 0 { g.list(sp, 2) } else { vec![] },
            output_shape: if g.below(4) == 0 { g.list(sp, 8) } else { vec![] },
        };
        if let Ok(y) = run(&Op::ConvTranspose(t.clone()), &[Some(&x), Some(&wt)], 1) {
            let (win, op, _) =
                check_conv_transpose(&t, &x.tensor_type(), &wt.tensor_type(), None).expect("ok");
            let axes: Vec<Axis> = (0..sp)
                .map(|i| {
                    transpose_axis(&t, &win, &op, i, Some(x_shape[i + 2]))
                        .expect("ok")
                        .expect("known")
                })
                .collect();
            assert_close(&y[0], &naive_conv_transpose(&x, &wt, group, &axes), 1e-5);
        }
        for kind in [
            PoolKind::Max,
            PoolKind::Average {
                count_include_pad: g.below(2) == 1,
            },
            PoolKind::Lp { p: 2.0 },
        ] {
            let p = PoolAttrs {
                kind,
                kernel_shape: w_shape[2..].to_vec(),
                strides: a.strides.clone(),
                pads: a.pads.clone(),
                dilations: a.dilations.clone(),
                auto_pad: a.auto_pad,
                ceil_mode: g.below(2) == 1,
                storage_order: g.below(2) as u8,
                channels_last: false,
            };
            let n_out = if kind == PoolKind::Max { 1 + g.below(2) } else { 1 };
            let _ = run(&Op::Pool(p), &[Some(&x)], n_out);
        }
    }
    assert!(ok > 200 && rejected > 100, "{ok} evaluated, {rejected} rejected");
}

#[test]
fn absurd_attributes_are_errors() {
    let x = tensor(DType::F32, &[1, 1, 3], 1);
    let huge = usize::MAX / 2;
    let p = |kernel: usize, pads: Vec<usize>, strides: Vec<usize>| PoolAttrs {
        kind: PoolKind::Max,
        kernel_shape: vec![kernel],
        strides,
        pads,
        dilations: vec![],
        auto_pad: AutoPad::NotSet,
        ceil_mode: true,
        storage_order: 0,
        channels_last: false,
    };
    for a in [
        p(huge, vec![huge - 1, huge - 1], vec![]),
        p(1 << 30, vec![(1 << 30) - 1, (1 << 30) - 1], vec![]),
        p(2, vec![], vec![huge]),
    ] {
        // Either a small valid result or an error; never a panic or an endless loop.
        if let Ok(y) = run(&Op::Pool(a.clone()), &[Some(&x)], 1) {
            assert!(y[0].len() <= 3, "{a:?}");
        }
    }
    let w = tensor(DType::F32, &[1, 1, 2], 2);
    let t = ConvTransposeAttrs {
        conv: attrs(&[huge], &[huge, 0], &[huge], 1, AutoPad::NotSet),
        output_padding: vec![huge],
        output_shape: vec![],
    };
    assert!(run(&Op::ConvTranspose(t), &[Some(&x), Some(&w)], 1).is_err());
}

#[test]
fn symbolic_spatial_dims_survive_same_windows() {
    let sym = |s: &str| Dim::Sym(s.to_string());
    let x = TensorType::new(DType::F32, vec![sym("n"), Dim::Fixed(4), sym("h"), sym("w")]);
    let w = TensorType::fixed(DType::F32, &[8, 4, 3, 3]);
    let infer_conv = |a: ConvAttrs| {
        let cx = InferCtx {
            inputs: vec![Some(&x), Some(&w)],
            values: vec![None, None],
            num_outputs: 1,
        };
        infer(&Op::Conv(a), &cx).expect("infers")[0].shape.clone()
    };
    let same = infer_conv(attrs(&[], &[1, 1, 1, 1], &[], 1, AutoPad::NotSet));
    assert_eq!(same, vec![sym("n"), Dim::Fixed(8), sym("h"), sym("w")]);
    let upper = infer_conv(attrs(&[], &[], &[], 1, AutoPad::SameUpper));
    assert_eq!(upper, same);
    let strided = infer_conv(attrs(&[2, 1], &[1, 1, 1, 1], &[], 1, AutoPad::NotSet));
    assert_eq!(strided, vec![sym("n"), Dim::Fixed(8), Dim::unknown(), sym("w")]);
}
