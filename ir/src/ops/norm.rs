//! Normalizations and the softmax family: BatchNormalization (inference form),
//! LayerNormalization, InstanceNormalization, GroupNormalization, LpNormalization,
//! MeanVarianceNormalization, Softmax, LogSoftmax, Hardmax.
//!
//! Every operator here reads its elements as f64, computes statistics and results in f64 and
//! rounds once to the output dtype. That is at least as precise as the f32 (`stash_type`)
//! arithmetic ONNX prescribes, and makes f16/bf16 exactly "compute wide, round once".

use super::{util, EvalCtx, InferCtx};
use crate::{DType, Dim, Op, OpError, Tensor, TensorData, TensorType};

pub(crate) fn infer(op: &Op, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    let x = cx.ty(0)?;
    check_float(x.dtype, "input")?;
    match op {
        Op::BatchNorm { .. } => infer_batch_norm(x, cx),
        Op::LayerNorm { axis, stash_type, .. } => infer_layer_norm(x, *axis, *stash_type, cx),
        Op::InstanceNorm { .. } => {
            channel_input(x)?;
            for i in [1, 2] {
                per_channel_param(cx.ty(i)?, x, x.shape[1].fixed(), param_name(i))?;
            }
            single_output(x, cx)
        }
        Op::GroupNorm {
            num_groups,
            per_channel_affine,
            stash_type,
            ..
        } => {
            check_float(*stash_type, "stash_type")?;
            let c = channel_input(x)?;
            if *num_groups == 0 {
                crate::bail!("num_groups must be positive");
            }
            if let Some(c) = c {
                if c % num_groups != 0 {
                    crate::bail!("{c} channels are not divisible into {num_groups} groups");
                }
            }
            let len = if *per_channel_affine { c } else { Some(*num_groups) };
            for i in [1, 2] {
                per_channel_param(cx.ty(i)?, x, len, param_name(i))?;
            }
            single_output(x, cx)
        }
        Op::LpNorm { axis, p } => {
            if !matches!(p, 1 | 2) {
                crate::bail!("p must be 1 or 2, got {p}");
            }
            util::norm_axis(*axis, x.rank())?;
            single_output(x, cx)
        }
        Op::MeanVarianceNorm { axes } => {
            reduced_axes(axes, x.rank())?;
            single_output(x, cx)
        }
        Op::Softmax { axis, coerce_2d }
        | Op::LogSoftmax { axis, coerce_2d }
        | Op::Hardmax { axis, coerce_2d } => {
            softmax_axis(*axis, *coerce_2d, x.rank())?;
            single_output(x, cx)
        }
        _ => crate::bail!("{} is not a normalization operator", op.name()),
    }
}

pub(crate) fn eval(op: &Op, cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let x = cx.input(0)?;
    check_float(x.dtype(), "input")?;
    match op {
        Op::BatchNorm { epsilon } => batch_norm(x, cx, f64::from(*epsilon)),
        Op::LayerNorm {
            axis,
            epsilon,
            stash_type,
        } => layer_norm(x, cx, *axis, f64::from(*epsilon), *stash_type),
        Op::InstanceNorm { epsilon } => instance_norm(x, cx, f64::from(*epsilon)),
        Op::GroupNorm {
            num_groups,
            epsilon,
            per_channel_affine,
            ..
        } => group_norm(x, cx, *num_groups, f64::from(*epsilon), *per_channel_affine),
        Op::LpNorm { axis, p } => lp_norm(x, *axis, *p),
        Op::MeanVarianceNorm { axes } => mean_variance_norm(x, axes),
        Op::Softmax { axis, coerce_2d } => softmax(x, *axis, *coerce_2d, SoftmaxKind::Softmax),
        Op::LogSoftmax { axis, coerce_2d } => softmax(x, *axis, *coerce_2d, SoftmaxKind::LogSoftmax),
        Op::Hardmax { axis, coerce_2d } => softmax(x, *axis, *coerce_2d, SoftmaxKind::Hardmax),
        _ => crate::bail!("{} is not a normalization operator", op.name()),
    }
}

// ---------------------------------------------------------------------------------------------
// Shared checks and helpers
// ---------------------------------------------------------------------------------------------

fn check_float(d: DType, what: &str) -> Result<(), OpError> {
    if !d.is_float() {
        crate::bail!("{what} must be a floating-point tensor, got {d}");
    }
    Ok(())
}

fn param_name(i: usize) -> &'static str {
    match i {
        1 => "scale",
        2 => "bias",
        3 => "mean",
        _ => "var",
    }
}

/// `X` of a per-channel normalization: `[N, C, ...]`. Returns C when known.
fn channel_input(x: &TensorType) -> Result<Option<usize>, OpError> {
    if x.rank() < 2 {
        crate::bail!("input must have shape [N, C, ...], got {x}");
    }
    Ok(x.shape[1].fixed())
}

/// A 1-D parameter of `len` elements (when known) with X's dtype.
fn per_channel_param(p: &TensorType, x: &TensorType, len: Option<usize>, what: &str) -> Result<(), OpError> {
    if p.dtype != x.dtype {
        crate::bail!("{what} has dtype {} but the input has {}", p.dtype, x.dtype);
    }
    check_vector(p, len, what)
}

fn check_vector(p: &TensorType, len: Option<usize>, what: &str) -> Result<(), OpError> {
    if p.rank() != 1 {
        crate::bail!("{what} must be 1-D, got {p}");
    }
    if let (Some(n), Some(len)) = (p.shape[0].fixed(), len) {
        if n != len {
            crate::bail!("{what} has {n} elements, {len} expected");
        }
    }
    Ok(())
}

fn single_output(x: &TensorType, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    if cx.num_outputs != 1 {
        crate::bail!("this operator has 1 output, {} declared", cx.num_outputs);
    }
    Ok(vec![x.clone()])
}

/// `vals` rounded once to `dtype`, as a tensor of `shape`.
fn tensor(dtype: DType, shape: Vec<usize>, vals: Vec<f64>) -> Result<Tensor, OpError> {
    Tensor::new(shape, TensorData::from_f64s(dtype, vals)).map_err(|e| OpError::new(e.to_string()))
}

/// Mean and population variance of `vals` (two passes, so the variance is never negative).
fn mean_var(vals: impl Iterator<Item = f64> + Clone) -> (f64, f64) {
    let (sum, n) = vals.clone().fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    let mean = sum / n as f64;
    let var = vals.map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
    (mean, var)
}

// ---------------------------------------------------------------------------------------------
// BatchNormalization
// ---------------------------------------------------------------------------------------------

fn infer_batch_norm(x: &TensorType, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    let c = channel_input(x)?;
    // Since opset 15 the parameters may have their own float dtypes.
    for i in 1..5 {
        let p = cx.ty(i)?;
        check_float(p.dtype, param_name(i))?;
        check_vector(p, c, param_name(i))?;
    }
    if cx.num_outputs != 1 {
        crate::bail!("training-mode BatchNormalization is not supported");
    }
    Ok(vec![x.clone()])
}

fn batch_norm(x: &Tensor, cx: &EvalCtx, epsilon: f64) -> Result<Vec<Tensor>, OpError> {
    let xt = x.tensor_type();
    let c = channel_input(&xt)?.unwrap_or(0);
    let mut params = Vec::with_capacity(4);
    for i in 1..5 {
        let p = cx.input(i)?;
        check_float(p.dtype(), param_name(i))?;
        check_vector(&p.tensor_type(), Some(c), param_name(i))?;
        params.push(p.to_f64_vec());
    }
    let (scale, bias, mean, var) = (&params[0], &params[1], &params[2], &params[3]);
    let plane: usize = x.shape()[2..].iter().product();
    let xs = x.to_f64_vec();
    let mut y = Vec::with_capacity(xs.len());
    for (i, p) in xs.chunks(plane.max(1)).enumerate() {
        let ch = i % c;
        let (s, b, m) = (scale[ch], bias[ch], mean[ch]);
        let d = (var[ch] + epsilon).sqrt();
        y.extend(p.iter().map(|&v| s * (v - m) / d + b));
    }
    Ok(vec![tensor(x.dtype(), x.shape().to_vec(), y)?])
}

// ---------------------------------------------------------------------------------------------
// LayerNormalization
// ---------------------------------------------------------------------------------------------

/// Scale/bias of a LayerNormalization must broadcast (unidirectionally) to X.
fn check_broadcast_to(p: &TensorType, x: &TensorType, what: &str) -> Result<(), OpError> {
    if p.dtype != x.dtype {
        crate::bail!("{what} has dtype {} but X has {}", p.dtype, x.dtype);
    }
    let ok = p.rank() <= x.rank()
        && p.shape
            .iter()
            .rev()
            .zip(x.shape.iter().rev())
            .all(|(a, b)| match (a.fixed(), b.fixed()) {
                (Some(1), _) => true,
                (Some(a), Some(b)) => a == b,
                _ => true,
            });
    if !ok {
        crate::bail!("{what} {p} does not broadcast to X {x}");
    }
    Ok(())
}

fn infer_layer_norm(
    x: &TensorType,
    axis: i64,
    stash: DType,
    cx: &InferCtx,
) -> Result<Vec<TensorType>, OpError> {
    check_float(stash, "stash_type")?;
    let axis = util::norm_axis(axis, x.rank())?;
    check_broadcast_to(cx.ty(1)?, x, "Scale")?;
    if let Some(b) = cx.opt_ty(2) {
        check_broadcast_to(b, x, "B")?;
    }
    if !(1..=3).contains(&cx.num_outputs) {
        crate::bail!(
            "LayerNormalization has 1 to 3 outputs, {} declared",
            cx.num_outputs
        );
    }
    let mut stat_shape: Vec<Dim> = x.shape[..axis].to_vec();
    stat_shape.resize(x.rank(), Dim::Fixed(1));
    let mut out = vec![x.clone()];
    for _ in 1..cx.num_outputs {
        out.push(TensorType::new(stash, stat_shape.clone()));
    }
    Ok(out)
}

/// `p` (Scale or B) read at every element of X, or an error if it does not broadcast.
fn broadcast_param(p: &Tensor, x_shape: &[usize], what: &str) -> Result<Vec<f64>, OpError> {
    check_broadcast_to(&p.tensor_type(), &TensorType::fixed(p.dtype(), x_shape), what)?;
    let vals = p.to_f64_vec();
    Ok(util::broadcast_index_map(p.shape(), x_shape)
        .into_iter()
        .map(|i| vals[i])
        .collect())
}

fn layer_norm(
    x: &Tensor,
    cx: &EvalCtx,
    axis: i64,
    epsilon: f64,
    stash: DType,
) -> Result<Vec<Tensor>, OpError> {
    let axis = util::norm_axis(axis, x.rank())?;
    let scale = broadcast_param(cx.input(1)?, x.shape(), "Scale")?;
    let bias = cx
        .opt_input(2)
        .map(|b| broadcast_param(b, x.shape(), "B"))
        .transpose()?;
    let row: usize = x.shape()[axis..].iter().product();
    let rows: usize = x.shape()[..axis].iter().product();
    let xs = x.to_f64_vec();
    let mut y = vec![0.0; xs.len()];
    let (mut means, mut inv_stds) = (Vec::with_capacity(rows), Vec::with_capacity(rows));
    for r in 0..rows {
        let span = r * row..(r + 1) * row;
        let (mean, var) = mean_var(xs[span.clone()].iter().copied());
        let inv = 1.0 / (var + epsilon).sqrt();
        for i in span {
            let b = bias.as_ref().map_or(0.0, |b| b[i]);
            y[i] = (xs[i] - mean) * inv * scale[i] + b;
        }
        means.push(mean);
        inv_stds.push(inv);
    }
    let mut stat_shape = x.shape()[..axis].to_vec();
    stat_shape.resize(x.rank(), 1);
    let mut out = vec![tensor(x.dtype(), x.shape().to_vec(), y)?];
    for stat in [means, inv_stds]
        .into_iter()
        .take(cx.num_outputs().saturating_sub(1))
    {
        out.push(tensor(stash, stat_shape.clone(), stat)?);
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// InstanceNormalization, GroupNormalization
// ---------------------------------------------------------------------------------------------

/// The 1-D parameter `i` of a per-channel normalization, checked to have `len` elements.
fn param_vec(cx: &EvalCtx, x: &Tensor, i: usize, len: usize) -> Result<Vec<f64>, OpError> {
    let p = cx.input(i)?;
    per_channel_param(&p.tensor_type(), &x.tensor_type(), Some(len), param_name(i))?;
    Ok(p.to_f64_vec())
}

fn instance_norm(x: &Tensor, cx: &EvalCtx, epsilon: f64) -> Result<Vec<Tensor>, OpError> {
    let c = channel_input(&x.tensor_type())?.unwrap_or(0);
    let (scale, bias) = (param_vec(cx, x, 1, c)?, param_vec(cx, x, 2, c)?);
    let plane: usize = x.shape()[2..].iter().product();
    let y = normalize_blocks(&x.to_f64_vec(), plane, epsilon, |block, _| {
        let ch = block % c;
        (scale[ch], bias[ch])
    });
    Ok(vec![tensor(x.dtype(), x.shape().to_vec(), y)?])
}

fn group_norm(
    x: &Tensor,
    cx: &EvalCtx,
    groups: usize,
    epsilon: f64,
    per_channel: bool,
) -> Result<Vec<Tensor>, OpError> {
    let c = channel_input(&x.tensor_type())?.unwrap_or(0);
    if groups == 0 || c % groups != 0 {
        crate::bail!("{c} channels are not divisible into {groups} groups");
    }
    let len = if per_channel { c } else { groups };
    let (scale, bias) = (param_vec(cx, x, 1, len)?, param_vec(cx, x, 2, len)?);
    let plane: usize = x.shape()[2..].iter().product();
    let per_group = c / groups;
    let y = normalize_blocks(&x.to_f64_vec(), per_group * plane, epsilon, |block, offset| {
        let g = block % groups;
        let k = if per_channel {
            g * per_group + offset / plane.max(1)
        } else {
            g
        };
        (scale[k], bias[k])
    });
    Ok(vec![tensor(x.dtype(), x.shape().to_vec(), y)?])
}

/// Normalizes consecutive blocks of `block` elements to zero mean and unit variance, then
/// applies `affine(block_index, offset_in_block) -> (scale, bias)`.
fn normalize_blocks(
    xs: &[f64],
    block: usize,
    epsilon: f64,
    affine: impl Fn(usize, usize) -> (f64, f64),
) -> Vec<f64> {
    let mut y = Vec::with_capacity(xs.len());
    if block == 0 {
        return y;
    }
    for (b, vals) in xs.chunks(block).enumerate() {
        let (mean, var) = mean_var(vals.iter().copied());
        let inv = 1.0 / (var + epsilon).sqrt();
        y.extend(vals.iter().enumerate().map(|(i, &v)| {
            let (s, bias) = affine(b, i);
            (v - mean) * inv * s + bias
        }));
    }
    y
}

// ---------------------------------------------------------------------------------------------
// LpNormalization, MeanVarianceNormalization
// ---------------------------------------------------------------------------------------------

/// `(outer, len, inner)`: the tensor seen as `[outer, len, inner]` around `axis`.
fn split_at_axis(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (
        shape[..axis].iter().product(),
        shape[axis],
        shape[axis + 1..].iter().product(),
    )
}

fn lp_norm(x: &Tensor, axis: i64, p: u8) -> Result<Vec<Tensor>, OpError> {
    let axis = util::norm_axis(axis, x.rank())?;
    if !matches!(p, 1 | 2) {
        crate::bail!("p must be 1 or 2, got {p}");
    }
    let (outer, len, inner) = split_at_axis(x.shape(), axis);
    let xs = x.to_f64_vec();
    let mut y = vec![0.0; xs.len()];
    for o in 0..outer {
        for i in 0..inner {
            let idx = |k: usize| (o * len + k) * inner + i;
            let norm = if p == 1 {
                (0..len).map(|k| xs[idx(k)].abs()).sum::<f64>()
            } else {
                (0..len).map(|k| xs[idx(k)] * xs[idx(k)]).sum::<f64>().sqrt()
            };
            // A zero vector stays zero instead of becoming 0/0.
            if norm != 0.0 {
                for k in 0..len {
                    y[idx(k)] = xs[idx(k)] / norm;
                }
            }
        }
    }
    Ok(vec![tensor(x.dtype(), x.shape().to_vec(), y)?])
}

/// MVN's reduced axes, normalized and checked for duplicates.
fn reduced_axes(axes: &[i64], rank: usize) -> Result<Vec<usize>, OpError> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let a = util::norm_axis(a, rank)?;
        if out.contains(&a) {
            crate::bail!("axis {a} appears twice in axes {axes:?}");
        }
        out.push(a);
    }
    Ok(out)
}

/// `(x - mean) / (std + 1e-9)` over `axes` (the ONNX function body: the epsilon is added to the
/// standard deviation, not to the variance).
fn mean_variance_norm(x: &Tensor, axes: &[i64]) -> Result<Vec<Tensor>, OpError> {
    let axes = reduced_axes(axes, x.rank())?;
    let kept: Vec<usize> = x
        .shape()
        .iter()
        .enumerate()
        .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
        .collect();
    let groups: usize = kept.iter().product();
    let map = util::broadcast_index_map(&kept, x.shape());
    let xs = x.to_f64_vec();
    let (mut sum, mut count) = (vec![0.0; groups], vec![0usize; groups]);
    for (&g, &v) in map.iter().zip(&xs) {
        sum[g] += v;
        count[g] += 1;
    }
    let mean: Vec<f64> = sum.iter().zip(&count).map(|(s, &n)| s / n as f64).collect();
    let mut sq = vec![0.0; groups];
    for (&g, &v) in map.iter().zip(&xs) {
        sq[g] += (v - mean[g]) * (v - mean[g]);
    }
    let std: Vec<f64> = sq
        .iter()
        .zip(&count)
        .map(|(s, &n)| (s / n as f64).sqrt())
        .collect();
    let y = map
        .iter()
        .zip(&xs)
        .map(|(&g, &v)| (v - mean[g]) / (std[g] + 1e-9))
        .collect();
    Ok(vec![tensor(x.dtype(), x.shape().to_vec(), y)?])
}

// ---------------------------------------------------------------------------------------------
// Softmax, LogSoftmax, Hardmax
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq)]
enum SoftmaxKind {
    Softmax,
    LogSoftmax,
    Hardmax,
}

/// `(outer, len, inner)` of the normalized groups: opset ≥ 13 normalizes along one axis;
/// before (`coerce_2d`) the input is flattened to 2-D at `axis` and each row is normalized.
fn softmax_axis(axis: i64, coerce_2d: bool, rank: usize) -> Result<usize, OpError> {
    if coerce_2d && rank == 0 {
        crate::bail!("input must have rank >= 1");
    }
    util::norm_axis(axis, rank)
}

fn softmax(x: &Tensor, axis: i64, coerce_2d: bool, kind: SoftmaxKind) -> Result<Vec<Tensor>, OpError> {
    let axis = softmax_axis(axis, coerce_2d, x.rank())?;
    let (outer, len, inner) = if coerce_2d {
        (
            x.shape()[..axis].iter().product(),
            x.shape()[axis..].iter().product(),
            1,
        )
    } else {
        split_at_axis(x.shape(), axis)
    };
    let xs = x.to_f64_vec();
    let mut y = vec![0.0; xs.len()];
    let mut group = Vec::with_capacity(len);
    for o in 0..outer {
        for i in 0..inner {
            let idx = |k: usize| (o * len + k) * inner + i;
            group.clear();
            group.extend((0..len).map(|k| xs[idx(k)]));
            for (k, v) in normalize_group(&group, kind).enumerate() {
                y[idx(k)] = v;
            }
        }
    }
    Ok(vec![tensor(x.dtype(), x.shape().to_vec(), y)?])
}

/// One softmax group, numerically stable (the maximum is subtracted before `exp`).
fn normalize_group(g: &[f64], kind: SoftmaxKind) -> impl Iterator<Item = f64> + '_ {
    let max = g.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    // numpy's argmax: the first maximum, a NaN counting as the maximum.
    let first_max = g
        .iter()
        .position(|v| v.is_nan())
        .or_else(|| g.iter().position(|&v| v == max));
    let sum: f64 = if kind == SoftmaxKind::Hardmax {
        0.0
    } else {
        g.iter().map(|&v| (v - max).exp()).sum()
    };
    let log_sum = sum.ln();
    g.iter().enumerate().map(move |(k, &v)| match kind {
        SoftmaxKind::Softmax => (v - max).exp() / sum,
        SoftmaxKind::LogSoftmax => (v - max) - log_sum,
        SoftmaxKind::Hardmax => f64::from(u8::from(Some(k) == first_max)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval1(op: &Op, inputs: Vec<Tensor>) -> Vec<Tensor> {
        let types: Vec<TensorType> = vec![inputs[0].tensor_type()];
        let cx = EvalCtx {
            inputs: inputs.iter().map(Some).collect(),
            out_types: &types,
        };
        eval(op, &cx).expect("evaluates")
    }

    fn vals(t: &Tensor) -> Vec<f64> {
        t.to_f64_vec()
    }

    fn close(a: &[f64], b: &[f64]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-6, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn softmax_opset13_normalizes_one_axis_and_opset11_flattens() {
        let x = Tensor::from_vec(vec![2, 2], vec![0.0f32, 0.0, 0.0, 0.0]);
        let y = eval1(
            &Op::Softmax {
                axis: 0,
                coerce_2d: false,
            },
            vec![x.clone()],
        );
        close(&vals(&y[0]), &[0.5, 0.5, 0.5, 0.5]);
        // Flattened at axis 0: one row of four.
        let y = eval1(
            &Op::Softmax {
                axis: 0,
                coerce_2d: true,
            },
            vec![x],
        );
        close(&vals(&y[0]), &[0.25; 4]);
    }

    #[test]
    fn softmax_is_stable_for_large_inputs() {
        let x = Tensor::from_vec(vec![2], vec![1000.0f32, 1000.0]);
        let y = eval1(
            &Op::LogSoftmax {
                axis: -1,
                coerce_2d: false,
            },
            vec![x],
        );
        close(&vals(&y[0]), &[-std::f64::consts::LN_2; 2]);
    }

    #[test]
    fn hardmax_marks_the_first_maximum() {
        let x = Tensor::from_vec(vec![4], vec![1.0f32, 3.0, 3.0, 2.0]);
        let y = eval1(
            &Op::Hardmax {
                axis: 0,
                coerce_2d: false,
            },
            vec![x],
        );
        close(&vals(&y[0]), &[0.0, 1.0, 0.0, 0.0]);
    }

    #[test]
    fn mvn_adds_epsilon_to_the_standard_deviation() {
        // Mean 2, std 1 over the single axis.
        let x = Tensor::from_vec(vec![2], vec![1.0f64, 3.0]);
        let y = eval1(&Op::MeanVarianceNorm { axes: vec![0] }, vec![x]);
        close(&vals(&y[0]), &[-1.0 / (1.0 + 1e-9), 1.0 / (1.0 + 1e-9)]);
    }

    #[test]
    fn group_norm_opset18_scales_per_group() {
        // Two groups of one channel each; per-group scale 2 and 3.
        let x = Tensor::from_vec(vec![1, 2, 2], vec![0.0f32, 2.0, 5.0, 7.0]);
        let s = Tensor::from_vec(vec![2], vec![2.0f32, 3.0]);
        let b = Tensor::from_vec(vec![2], vec![0.0f32, 1.0]);
        let op = Op::GroupNorm {
            num_groups: 2,
            epsilon: 0.0,
            stash_type: DType::F32,
            per_channel_affine: false,
        };
        let y = eval1(&op, vec![x, s, b]);
        close(&vals(&y[0]), &[-2.0, 2.0, -2.0, 4.0]);
    }

    #[test]
    fn lp_norm_leaves_zero_vectors_zero() {
        let x = Tensor::from_vec(vec![2, 2], vec![0.0f32, 0.0, -3.0, 1.0]);
        let y = eval1(&Op::LpNorm { axis: 1, p: 1 }, vec![x]);
        close(&vals(&y[0]), &[0.0, 0.0, -0.75, 0.25]);
    }

    #[test]
    fn batch_norm_uses_per_channel_statistics() {
        let x = Tensor::from_vec(vec![1, 2, 1], vec![3.0f32, 3.0]);
        let p = |v: [f32; 2]| Tensor::from_vec(vec![2], v.to_vec());
        let y = eval1(
            &Op::BatchNorm { epsilon: 0.0 },
            vec![x, p([2.0, 1.0]), p([1.0, 0.0]), p([1.0, 3.0]), p([4.0, 1.0])],
        );
        close(&vals(&y[0]), &[3.0, 0.0]);
    }
}
