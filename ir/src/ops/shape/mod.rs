//! Data movement and shape operators: reshapes, transposition, concatenation and splitting,
//! slicing, gathers and scatters, broadcasting copies, padding, and the small shape-arithmetic
//! operators (`Shape`, `Size`, `Range`, `ConstantOfShape`) dynamic-shape models compute with.
//!
//! Inference is as precise as the known input values allow: a constant `Reshape` shape or
//! constant `Slice` bounds give static dims, and symbolic dims are carried through wherever an
//! operator copies them. The shape rules are written once over [`Dim`]s and reused by `eval`
//! with every dim fixed, so inference and evaluation cannot disagree.
//!
//! Evaluation is generic over every element type. The operators that run on real feature maps
//! and weights (Reshape, Transpose, Slice, Concat, Split, Gather) copy contiguous runs rather
//! than single elements.
//!
//! The operators live in one module per family (see the `mod` list below); this module holds
//! the infer/eval dispatch, the input checks they share and the generic copy kernels.

use super::util::{fmt_dims, norm_axis, strides};
use super::{EvalCtx, InferCtx};
use crate::{bail, DType, Dim, Element, Op, OpError, Tensor, TensorData, TensorType};

type Res<T> = Result<T, OpError>;

mod concat_split;
mod expand_tile;
mod gather;
mod generators;
mod pad;
mod reshape;
mod scatter;
mod slice;
#[cfg(test)]
mod tests;
mod transpose;
mod trilu_nonzero;

pub use pad::pad_axis_map;
pub use slice::slice_range;

use concat_split::{eval_concat, eval_split, infer_concat, infer_split};
use expand_tile::{eval_expand, eval_tile, infer_expand, infer_tile};
use gather::{
    eval_gather, eval_gather_elements, eval_gather_nd, infer_gather, infer_gather_elements, infer_gather_nd,
};
use generators::{
    eval_constant_of_shape, eval_eye_like, eval_one_hot, eval_range, infer_constant_of_shape, infer_eye_like,
    infer_one_hot, infer_range,
};
use pad::{eval_pad, infer_pad};
use reshape::{
    eval_flatten, eval_reshape, eval_squeeze, eval_unsqueeze, infer_flatten, infer_reshape, infer_squeeze,
    infer_unsqueeze,
};
use scatter::{eval_scatter_elements, eval_scatter_nd, infer_scatter_elements, infer_scatter_nd};
use slice::{eval_slice, infer_slice};
use transpose::{eval_transpose, infer_transpose};
use trilu_nonzero::{eval_nonzero, eval_trilu, infer_trilu};

pub(crate) fn infer(op: &Op, cx: &InferCtx) -> Res<Vec<TensorType>> {
    let types = infer_types(op, cx)?;
    for t in &types {
        check_type_size(t)?;
    }
    Ok(types)
}

/// Rejects an output type whose fixed dims alone hold more elements than evaluation could
/// ever allocate: a constant shape of `[2^40, 2^40]` fails at import, naming the node, instead
/// of overflowing size arithmetic later on.
fn check_type_size(t: &TensorType) -> Res<()> {
    let fixed: Vec<usize> = t.shape.iter().filter_map(Dim::fixed).collect();
    match super::util::check_numel(&fixed) {
        Ok(_) => Ok(()),
        Err(_) => bail!("the output {t} is too large"),
    }
}

fn infer_types(op: &Op, cx: &InferCtx) -> Res<Vec<TensorType>> {
    let ty = match op {
        Op::Reshape { allow_zero } => infer_reshape(cx, *allow_zero)?,
        Op::Flatten { axis } => infer_flatten(cx, *axis)?,
        Op::Transpose { perm } => infer_transpose(cx, perm)?,
        Op::Squeeze => infer_squeeze(cx)?,
        Op::Unsqueeze => infer_unsqueeze(cx)?,
        Op::Concat { axis } => infer_concat(cx, *axis)?,
        Op::Split { axis, num_outputs } => return infer_split(cx, *axis, *num_outputs),
        Op::Slice => infer_slice(cx)?,
        Op::Gather { axis } => infer_gather(cx, *axis)?,
        Op::GatherElements { axis } => infer_gather_elements(cx, *axis)?,
        Op::GatherND { batch_dims } => infer_gather_nd(cx, *batch_dims)?,
        Op::ScatterND { .. } => infer_scatter_nd(cx)?,
        Op::ScatterElements { axis, .. } => infer_scatter_elements(cx, *axis)?,
        Op::Expand => infer_expand(cx)?,
        Op::Tile => infer_tile(cx)?,
        Op::Pad { .. } => infer_pad(cx)?,
        Op::Shape { start, end } => {
            let (s, e) = super::shape_slice_bounds(cx.ty(0)?.rank(), *start, *end);
            TensorType::new(DType::I64, vec![Dim::Fixed(e - s)])
        }
        Op::Size => {
            cx.ty(0)?;
            TensorType::scalar(DType::I64)
        }
        Op::Range => infer_range(cx)?,
        Op::ConstantOfShape { value } => infer_constant_of_shape(cx, value)?,
        Op::Identity => cx.ty(0)?.clone(),
        Op::Trilu { .. } => infer_trilu(cx)?,
        Op::NonZero => {
            let rank = cx.ty(0)?.rank();
            TensorType::new(DType::I64, vec![Dim::Fixed(rank), Dim::unknown()])
        }
        Op::OneHot { axis } => infer_one_hot(cx, *axis)?,
        Op::EyeLike { dtype, .. } => infer_eye_like(cx, *dtype)?,
        _ => bail!("{} is not a data movement operator", op.name()),
    };
    Ok(vec![ty])
}

pub(crate) fn eval(op: &Op, cx: &EvalCtx) -> Res<Vec<Tensor>> {
    let t = match op {
        Op::Reshape { allow_zero } => eval_reshape(cx, *allow_zero)?,
        Op::Flatten { axis } => eval_flatten(cx, *axis)?,
        Op::Transpose { perm } => eval_transpose(cx.input(0)?, perm)?,
        Op::Squeeze => eval_squeeze(cx)?,
        Op::Unsqueeze => eval_unsqueeze(cx)?,
        Op::Concat { axis } => eval_concat(cx, *axis)?,
        Op::Split { axis, num_outputs } => return eval_split(cx, *axis, *num_outputs),
        Op::Slice => eval_slice(cx)?,
        Op::Gather { axis } => eval_gather(cx, *axis)?,
        Op::GatherElements { axis } => eval_gather_elements(cx, *axis)?,
        Op::GatherND { batch_dims } => eval_gather_nd(cx, *batch_dims)?,
        Op::ScatterND { reduction } => eval_scatter_nd(cx, *reduction)?,
        Op::ScatterElements { axis, reduction } => eval_scatter_elements(cx, *axis, *reduction)?,
        Op::Expand => eval_expand(cx)?,
        Op::Tile => eval_tile(cx)?,
        Op::Pad { mode } => eval_pad(cx, *mode)?,
        Op::Shape { start, end } => {
            let shape = cx.input(0)?.shape();
            let (s, e) = super::shape_slice_bounds(shape.len(), *start, *end);
            let v: Vec<i64> = shape[s..e].iter().map(|&d| d as i64).collect();
            Tensor::from_vec(vec![v.len()], v)
        }
        Op::Size => Tensor::scalar(cx.input(0)?.len() as i64),
        Op::Range => eval_range(cx)?,
        Op::ConstantOfShape { value } => eval_constant_of_shape(cx, value)?,
        Op::Identity => cx.input(0)?.clone(),
        Op::Trilu { upper } => eval_trilu(cx, *upper)?,
        Op::NonZero => eval_nonzero(cx.input(0)?)?,
        Op::OneHot { axis } => eval_one_hot(cx, *axis)?,
        Op::EyeLike { dtype, k } => eval_eye_like(cx, *dtype, *k)?,
        _ => bail!("{} is not a data movement operator", op.name()),
    };
    Ok(vec![t])
}

// ---------------------------------------------------------------------------------------------
// Input checks shared by inference and evaluation.

fn expect_dtype(t: &TensorType, dtype: DType, what: &str) -> Res<()> {
    if t.dtype != dtype {
        bail!("{what} must be {dtype}, got {}", t.dtype);
    }
    Ok(())
}

fn expect_index_dtype(dtype: DType, what: &str) -> Res<()> {
    if !matches!(dtype, DType::I32 | DType::I64) {
        bail!("{what} must be i32 or i64, got {dtype}");
    }
    Ok(())
}

fn expect_same_dtype(a: DType, b: DType, what: &str) -> Res<()> {
    if a != b {
        bail!("{what} must have the data's dtype {a}, got {b}");
    }
    Ok(())
}

/// The length of a 1-D input (a shape, axes, pads), when its type fixes it.
fn vec_len(t: &TensorType, what: &str) -> Res<Option<usize>> {
    if t.rank() != 1 {
        bail!("{what} must be 1-D, got {t}");
    }
    Ok(t.shape[0].fixed())
}

/// Checks that a scalar-like input (rank 0, or one element in 1-D) has that form.
fn expect_scalar_like(t: &TensorType, what: &str) -> Res<()> {
    let ok = t.rank() == 0 || (t.rank() == 1 && matches!(t.shape[0], Dim::Fixed(1) | Dim::Sym(_)));
    if !ok {
        bail!("{what} must be a scalar, got {t}");
    }
    Ok(())
}

/// The values of a 1-D integer input at evaluation time.
fn int_values(t: &Tensor, what: &str) -> Res<Vec<i64>> {
    if !t.dtype().is_int() {
        bail!("{what} must be an integer tensor, got {}", t.dtype());
    }
    if t.rank() > 1 {
        bail!("{what} must be 1-D, got shape {:?}", t.shape());
    }
    Ok(t.to_i64_vec())
}

/// The one integer of a scalar input (rank 0 or a single element).
fn int_scalar(t: &Tensor, what: &str) -> Res<i64> {
    let v = int_values(t, what)?;
    match v.as_slice() {
        [x] => Ok(*x),
        _ => bail!("{what} must hold exactly one value, got shape {:?}", t.shape()),
    }
}

/// The elements of `t` as `T`, or an error when the dtype differs.
fn typed<'a, T: Element>(t: &'a Tensor, what: &str) -> Res<&'a [T]> {
    t.as_slice::<T>()
        .ok_or_else(|| OpError::new(format!("{what} must be {}, got {}", T::DTYPE, t.dtype())))
}

fn make(shape: Vec<usize>, data: TensorData) -> Res<Tensor> {
    Tensor::new(shape, data).map_err(|e| OpError::new(e.to_string()))
}

/// Fixed extents of dims that the shape rules derived from a concrete shape.
fn concrete(d: Vec<Dim>) -> Res<Vec<usize>> {
    d.iter()
        .map(|x| {
            x.fixed()
                .ok_or_else(|| OpError::new(format!("internal: shape {} is not concrete", fmt_dims(&d))))
        })
        .collect()
}

/// Normalizes a possibly negative index against `dim`; out of range is an error.
fn norm_index(i: i64, dim: usize, what: &str) -> Res<usize> {
    let d = dim as i64;
    let j = if i < 0 { i + d } else { i };
    if j < 0 || j >= d {
        bail!("{what} index {i} is out of range for a dimension of extent {dim}");
    }
    Ok(j as usize)
}

/// Normalizes a list of axes, rejecting duplicates.
fn norm_axes(axes: &[i64], rank: usize) -> Res<Vec<usize>> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = norm_axis(a, rank)?;
        if out.contains(&n) {
            bail!("axis {a} appears more than once in {axes:?}");
        }
        out.push(n);
    }
    Ok(out)
}

/// The product of dims: fixed when all are, the one symbolic dim when the others are all 1,
/// zero when any is zero, else unknown.
fn dim_product(ds: &[Dim]) -> Res<Dim> {
    let mut fixed = 1usize;
    let mut syms = vec![];
    for d in ds {
        match d {
            Dim::Fixed(0) => return Ok(Dim::Fixed(0)),
            Dim::Fixed(n) => {
                fixed = fixed
                    .checked_mul(*n)
                    .ok_or_else(|| OpError::new(format!("shape {} has too many elements", fmt_dims(ds))))?;
            }
            Dim::Sym(_) => syms.push(d),
        }
    }
    Ok(match syms.as_slice() {
        [] => Dim::Fixed(fixed),
        [s] if fixed == 1 => (*s).clone(),
        _ => Dim::unknown(),
    })
}

fn fixed_dims(v: Vec<usize>) -> Vec<Dim> {
    v.into_iter().map(Dim::Fixed).collect()
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

// ---------------------------------------------------------------------------------------------
// Generic copy kernels.

/// Copies from `src` into a new row-major buffer of shape `out_shape`, where the output element
/// at multi-index `i` is `src[base + Σ i[a] * strides[a]]`. Strides may be zero (broadcast) or
/// negative (reversed slices); the caller guarantees every read is in bounds. Unit inner
/// strides copy whole rows at once.
fn strided_copy<T: Element>(src: &[T], out_shape: &[usize], base: usize, strides: &[isize]) -> Vec<T> {
    let n = numel(out_shape);
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let Some((&inner, outer_shape)) = out_shape.split_last() else {
        out.push(src[base]);
        return out;
    };
    let inner_stride = strides[outer_shape.len()];
    let mut idx = vec![0usize; outer_shape.len()];
    let mut off = base as isize;
    loop {
        let start = off as usize;
        match inner_stride {
            1 => out.extend_from_slice(&src[start..start + inner]),
            0 => out.extend(std::iter::repeat_n(src[start], inner)),
            s => out.extend((0..inner).map(|j| src[(off + j as isize * s) as usize])),
        }
        // Advance the outer multi-index, keeping the source offset in step.
        let mut ax = outer_shape.len();
        loop {
            if ax == 0 {
                return out;
            }
            ax -= 1;
            idx[ax] += 1;
            off += strides[ax];
            if idx[ax] < outer_shape[ax] {
                break;
            }
            off -= strides[ax] * idx[ax] as isize;
            idx[ax] = 0;
        }
    }
}

/// Copies with an independent source coordinate per output coordinate on each axis: the output
/// element at `i` reads the source element at coordinates `maps[a][i[a]]`, or is `fill` where
/// any axis maps to `None` (constant padding). Covers Pad, Tile and Slice-like selections.
fn gather_axes<T: Element>(src: &[T], in_shape: &[usize], maps: &[Vec<Option<usize>>], fill: T) -> Vec<T> {
    let out_shape: Vec<usize> = maps.iter().map(Vec::len).collect();
    let n = numel(&out_shape);
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let in_strides = strides(in_shape);
    // Source offsets per axis and output coordinate.
    let offs: Vec<Vec<Option<usize>>> = maps
        .iter()
        .zip(&in_strides)
        .map(|(m, &s)| m.iter().map(|c| c.map(|c| c * s)).collect())
        .collect();
    let Some((inner, outer)) = offs.split_last() else {
        out.push(src[0]);
        return out;
    };
    let contiguous =
        inner.iter().all(Option::is_some) && inner.windows(2).all(|w| w[0].map(|x| x + 1) == w[1]);
    let mut idx = vec![0usize; outer.len()];
    loop {
        let base: Option<usize> = outer
            .iter()
            .zip(&idx)
            .try_fold(0usize, |acc, (o, &i)| o[i].map(|v| acc + v));
        match (base, contiguous) {
            (None, _) => out.extend(std::iter::repeat_n(fill, inner.len())),
            (Some(b), true) => {
                let s = b + inner[0].unwrap_or(0);
                out.extend_from_slice(&src[s..s + inner.len()]);
            }
            (Some(b), false) => out.extend(inner.iter().map(|o| o.map_or(fill, |o| src[b + o]))),
        }
        let mut ax = outer.len();
        loop {
            if ax == 0 {
                return out;
            }
            ax -= 1;
            idx[ax] += 1;
            if idx[ax] < outer[ax].len() {
                break;
            }
            idx[ax] = 0;
        }
    }
}

/// Calls `f` with every multi-index of `shape` in row-major order.
fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize]) -> Res<()>) -> Res<()> {
    let n = numel(shape);
    let mut idx = vec![0usize; shape.len()];
    for _ in 0..n {
        f(&idx)?;
        for ax in (0..shape.len()).rev() {
            idx[ax] += 1;
            if idx[ax] < shape[ax] {
                break;
            }
            idx[ax] = 0;
        }
    }
    Ok(())
}

/// The same data under a new shape (Reshape, Flatten, Squeeze, Unsqueeze).
fn reshaped(t: &Tensor, shape: Vec<usize>) -> Res<Tensor> {
    make(shape, t.data().clone())
}
