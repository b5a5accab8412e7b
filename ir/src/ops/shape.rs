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

use super::util::{broadcast_dims, broadcast_shapes, check_alloc, dims, fmt_dims, known_i64s, strides};
use super::util::{norm_axis, norm_axis_inclusive};
use super::{EvalCtx, InferCtx};
use crate::{
    bail, DType, Dim, Element, Op, OpError, PadMode, ScatterReduction, Tensor, TensorData, TensorType,
};
use half::{bf16, f16};

type Res<T> = Result<T, OpError>;

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

// ---------------------------------------------------------------------------------------------
// Reshape, Flatten, Transpose, Squeeze, Unsqueeze.

/// Output dims of `Reshape(input, spec)`: 0 copies the input dim (unless `allow_zero`), one -1
/// is inferred from the element count. Symbolic dims that appear on both sides cancel, so
/// `[batch, 3, 4]` reshaped by `[0, -1]` gives `[batch, 12]`.
fn reshape_dims(input: &[Dim], spec: &[i64], allow_zero: bool) -> Res<Vec<Dim>> {
    let mut out = Vec::with_capacity(spec.len());
    let mut infer_at = None;
    for (i, &s) in spec.iter().enumerate() {
        match s {
            -1 if infer_at.is_some() => bail!("shape {spec:?} has more than one -1"),
            -1 => {
                infer_at = Some(i);
                out.push(Dim::Fixed(1));
            }
            0 if !allow_zero => match input.get(i) {
                Some(d) => out.push(d.clone()),
                None => bail!(
                    "shape {spec:?} copies dim {i} (0) but the input has rank {}",
                    input.len()
                ),
            },
            s if s < 0 => bail!("shape {spec:?} has invalid extent {s}"),
            s => out.push(Dim::Fixed(s as usize)),
        }
    }
    if let Some(k) = infer_at {
        if allow_zero && spec.contains(&0) {
            bail!("shape {spec:?} has both 0 and -1, which allowzero=1 forbids");
        }
        out[k] = infer_minus_one(input, &out, k, spec)?;
    } else if let (Some(a), Some(b)) = (fixed_numel(input)?, fixed_numel(&out)?) {
        if a != b {
            bail!(
                "cannot reshape {} ({a} elements) into {spec:?} ({b} elements)",
                fmt_dims(input)
            );
        }
    }
    Ok(out)
}

fn fixed_numel(ds: &[Dim]) -> Res<Option<usize>> {
    match dim_product(ds)? {
        Dim::Fixed(n) => Ok(Some(n)),
        Dim::Sym(_) => Ok(None),
    }
}

/// The extent of the `-1` at `k`: the input's element count over the other output dims, after
/// cancelling symbolic dims that appear on both sides.
fn infer_minus_one(input: &[Dim], out: &[Dim], k: usize, spec: &[i64]) -> Res<Dim> {
    let mut num: Vec<&Dim> = input.iter().collect();
    let mut den: Vec<&Dim> = out
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != k)
        .map(|(_, d)| d)
        .collect();
    // Cancel equal named symbols.
    let mut i = 0;
    while i < den.len() {
        let cancel = match den[i] {
            Dim::Sym(s) if s != "?" => num.iter().position(|d| *d == den[i]),
            _ => None,
        };
        match cancel {
            Some(j) => {
                num.remove(j);
                den.remove(i);
            }
            None => i += 1,
        }
    }
    let (nf, ns) = fixed_and_symbols(&num)?;
    let (df, ds) = fixed_and_symbols(&den)?;
    if df == 0 {
        bail!("cannot infer the -1 in shape {spec:?}: the other dims have no elements");
    }
    Ok(match (ns.as_slice(), ds.as_slice()) {
        ([], []) if nf % df != 0 => {
            bail!(
                "cannot reshape {} into {spec:?}: {nf} elements do not divide by {df}",
                fmt_dims(input)
            )
        }
        ([], []) => Dim::Fixed(nf / df),
        ([s], []) if nf == df => (*s).clone(),
        _ if nf == 0 => Dim::Fixed(0),
        _ => Dim::unknown(),
    })
}

/// The product of the fixed dims and the list of symbolic ones.
fn fixed_and_symbols<'a>(ds: &[&'a Dim]) -> Res<(usize, Vec<&'a Dim>)> {
    let mut fixed = 1usize;
    let mut syms = vec![];
    for d in ds {
        match d {
            Dim::Fixed(n) => {
                fixed = fixed
                    .checked_mul(*n)
                    .ok_or_else(|| OpError::new("shape has too many elements"))?
            }
            Dim::Sym(_) => syms.push(*d),
        }
    }
    Ok((fixed, syms))
}

fn infer_reshape(cx: &InferCtx, allow_zero: bool) -> Res<TensorType> {
    let data = cx.ty(0)?;
    let shape_ty = cx.ty(1)?;
    expect_dtype(shape_ty, DType::I64, "the shape input")?;
    let len = vec_len(shape_ty, "the shape input")?;
    let shape = match known_i64s(cx.value(1)) {
        Some(spec) => reshape_dims(&data.shape, &spec, allow_zero)?,
        None => match len {
            Some(n) => vec![Dim::unknown(); n],
            None => bail!("the output rank is unknown: the shape input has an unknown length"),
        },
    };
    Ok(TensorType::new(data.dtype, shape))
}

fn eval_reshape(cx: &EvalCtx, allow_zero: bool) -> Res<Tensor> {
    let data = cx.input(0)?;
    let spec = int_values(cx.input(1)?, "the shape input")?;
    let shape = concrete(reshape_dims(&dims(data.shape()), &spec, allow_zero)?)?;
    reshaped(data, shape)
}

/// Flatten's axis lies in `[-rank, rank]`; a negative one counts from the back (so unlike
/// Unsqueeze-style axes, -1 is `rank - 1`).
fn flatten_dims(input: &[Dim], axis: i64) -> Res<Vec<Dim>> {
    let r = input.len() as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if !(0..=r).contains(&a) {
        bail!("axis {axis} is out of range for rank {r}");
    }
    let a = a as usize;
    Ok(vec![dim_product(&input[..a])?, dim_product(&input[a..])?])
}

fn infer_flatten(cx: &InferCtx, axis: i64) -> Res<TensorType> {
    let x = cx.ty(0)?;
    Ok(TensorType::new(x.dtype, flatten_dims(&x.shape, axis)?))
}

fn eval_flatten(cx: &EvalCtx, axis: i64) -> Res<Tensor> {
    let x = cx.input(0)?;
    reshaped(x, concrete(flatten_dims(&dims(x.shape()), axis)?)?)
}

fn check_perm(perm: &[usize], rank: usize) -> Res<()> {
    if perm.len() != rank {
        bail!(
            "perm {perm:?} has {} entries for an input of rank {rank}",
            perm.len()
        );
    }
    let mut seen = vec![false; rank];
    for &p in perm {
        if p >= rank || seen[p] {
            bail!("perm {perm:?} is not a permutation of the {rank} axes");
        }
        seen[p] = true;
    }
    Ok(())
}

fn infer_transpose(cx: &InferCtx, perm: &[usize]) -> Res<TensorType> {
    let x = cx.ty(0)?;
    check_perm(perm, x.rank())?;
    Ok(TensorType::new(
        x.dtype,
        perm.iter().map(|&p| x.shape[p].clone()).collect(),
    ))
}

fn eval_transpose(x: &Tensor, perm: &[usize]) -> Res<Tensor> {
    check_perm(perm, x.rank())?;
    let out_shape: Vec<usize> = perm.iter().map(|&p| x.shape()[p]).collect();
    let (merged, mperm) = merge_transpose_axes(x.shape(), perm);
    let m = mperm.len();
    fn general<T: Element>(v: &[T], in_shape: &[usize], perm: &[usize]) -> TensorData {
        let in_strides = strides(in_shape);
        let st: Vec<isize> = perm.iter().map(|&p| in_strides[p] as isize).collect();
        let shape: Vec<usize> = perm.iter().map(|&p| in_shape[p]).collect();
        T::wrap(strided_copy(v, &shape, 0, &st))
    }
    let data = if mperm.iter().enumerate().all(|(i, &p)| i == p) {
        // Only unit axes move: the data order is unchanged.
        x.data().clone()
    } else if mperm[..m - 2].iter().enumerate().all(|(i, &p)| i == p) {
        let (rows, cols) = (merged[m - 2], merged[m - 1]);
        crate::with_data!(x.data(), v => T2d::wrap_batched(v, rows, cols))
    } else {
        crate::with_data!(x.data(), v => general(v, &merged, &mperm))
    };
    make(out_shape, data)
}

/// Simplifies a transpose: drops unit axes and merges runs of input axes that stay adjacent
/// and in order in the output. Returns the merged input shape and permutation, e.g.
/// NCHW→NHWC on `[n, c, h, w]` becomes `[n, c, h*w]` with perm `[0, 2, 1]`.
fn merge_transpose_axes(shape: &[usize], perm: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let kept: Vec<usize> = (0..shape.len()).filter(|&a| shape[a] != 1).collect();
    let renum = |a: usize| kept.iter().position(|&k| k == a);
    let p: Vec<usize> = perm.iter().filter_map(|&a| renum(a)).collect();
    // Runs of consecutive input axes, in output order.
    let mut groups: Vec<Vec<usize>> = vec![];
    for &a in &p {
        match groups.last_mut() {
            Some(g) if g.last().is_some_and(|&l| l + 1 == a) => g.push(a),
            _ => groups.push(vec![a]),
        }
    }
    let mut order: Vec<usize> = (0..groups.len()).collect();
    order.sort_by_key(|&g| groups[g][0]);
    let merged: Vec<usize> = order
        .iter()
        .map(|&g| groups[g].iter().map(|&a| shape[kept[a]]).product())
        .collect();
    let mperm: Vec<usize> = (0..groups.len())
        .map(|g| order.iter().position(|&o| o == g).unwrap_or(0))
        .collect();
    if merged.len() < 2 {
        return (vec![numel(shape)], vec![0]);
    }
    (merged, mperm)
}

/// Batched 2-D transposes `[b, rows, cols] → [b, cols, rows]` in cache-sized tiles, so that
/// neither the reads nor the writes stride through memory one element at a time.
struct T2d;

impl T2d {
    const TILE: usize = 32;

    fn wrap_batched<T: Element>(v: &[T], rows: usize, cols: usize) -> TensorData {
        let mat = rows * cols;
        let mut out = vec![T::default(); v.len()];
        if mat == 0 {
            return T::wrap(out);
        }
        for (src, dst) in v.chunks_exact(mat).zip(out.chunks_exact_mut(mat)) {
            for r0 in (0..rows).step_by(Self::TILE) {
                for c0 in (0..cols).step_by(Self::TILE) {
                    for c in c0..(c0 + Self::TILE).min(cols) {
                        for r in r0..(r0 + Self::TILE).min(rows) {
                            dst[c * rows + r] = src[r * cols + c];
                        }
                    }
                }
            }
        }
        T::wrap(out)
    }
}

/// Output dims of `Squeeze`: the listed axes (each of extent 1), or with no axes every dim of
/// extent 1, which needs every dim to be known.
fn squeeze_dims(input: &[Dim], axes: Option<&[i64]>) -> Res<Vec<Dim>> {
    let Some(axes) = axes else {
        if let Some(i) = input.iter().position(|d| !d.is_fixed()) {
            bail!(
                "without axes the output rank depends on dim {i} of {}, which is not known",
                fmt_dims(input)
            );
        }
        return Ok(input.iter().filter(|d| **d != Dim::Fixed(1)).cloned().collect());
    };
    let axes = norm_axes(axes, input.len())?;
    for &a in &axes {
        if let Dim::Fixed(n) = input[a] {
            if n != 1 {
                bail!(
                    "cannot squeeze axis {a} of {}: its extent is {n}, not 1",
                    fmt_dims(input)
                );
            }
        }
    }
    Ok(input
        .iter()
        .enumerate()
        .filter(|(i, _)| !axes.contains(i))
        .map(|(_, d)| d.clone())
        .collect())
}

fn infer_squeeze(cx: &InferCtx) -> Res<TensorType> {
    let x = cx.ty(0)?;
    let shape = match cx.opt_ty(1) {
        None => squeeze_dims(&x.shape, None)?,
        Some(axes_ty) => {
            expect_dtype(axes_ty, DType::I64, "axes")?;
            let len = vec_len(axes_ty, "axes")?;
            match (known_i64s(cx.value(1)), len) {
                (Some(axes), _) => squeeze_dims(&x.shape, Some(&axes))?,
                (None, Some(n)) if n <= x.rank() => vec![Dim::unknown(); x.rank() - n],
                (None, Some(n)) => bail!("{n} axes to squeeze from an input of rank {}", x.rank()),
                (None, None) => bail!("the output rank is unknown: the axes input has an unknown length"),
            }
        }
    };
    Ok(TensorType::new(x.dtype, shape))
}

fn eval_squeeze(cx: &EvalCtx) -> Res<Tensor> {
    let x = cx.input(0)?;
    let axes = cx.opt_input(1).map(|t| int_values(t, "axes")).transpose()?;
    let shape = squeeze_dims(&dims(x.shape()), axes.as_deref())?;
    reshaped(x, concrete(shape)?)
}

fn unsqueeze_dims(input: &[Dim], axes: &[i64]) -> Res<Vec<Dim>> {
    let out_rank = input.len() + axes.len();
    let axes = norm_axes(axes, out_rank)?;
    let mut rest = input.iter();
    Ok((0..out_rank)
        .map(|i| {
            if axes.contains(&i) {
                Dim::Fixed(1)
            } else {
                rest.next().cloned().unwrap_or(Dim::Fixed(1))
            }
        })
        .collect())
}

fn infer_unsqueeze(cx: &InferCtx) -> Res<TensorType> {
    let x = cx.ty(0)?;
    let axes_ty = cx.ty(1)?;
    expect_dtype(axes_ty, DType::I64, "axes")?;
    let len = vec_len(axes_ty, "axes")?;
    let shape = match (known_i64s(cx.value(1)), len) {
        (Some(axes), _) => unsqueeze_dims(&x.shape, &axes)?,
        (None, Some(n)) => vec![Dim::unknown(); x.rank() + n],
        (None, None) => bail!("the output rank is unknown: the axes input has an unknown length"),
    };
    Ok(TensorType::new(x.dtype, shape))
}

fn eval_unsqueeze(cx: &EvalCtx) -> Res<Tensor> {
    let x = cx.input(0)?;
    let axes = int_values(cx.input(1)?, "axes")?;
    reshaped(x, concrete(unsqueeze_dims(&dims(x.shape()), &axes)?)?)
}

// ---------------------------------------------------------------------------------------------
// Concat and Split.

/// Merges two dims that must be equal: a fixed extent wins over a symbol.
fn merge_dim(a: &Dim, b: &Dim) -> Res<Dim> {
    Ok(match (a, b) {
        (Dim::Fixed(x), Dim::Fixed(y)) if x != y => bail!("extents {x} and {y} differ"),
        (Dim::Fixed(_), _) => a.clone(),
        (_, Dim::Fixed(_)) => b.clone(),
        _ if a == b => a.clone(),
        _ => Dim::unknown(),
    })
}

fn sum_dims<'a>(ds: impl IntoIterator<Item = &'a Dim>) -> Res<Dim> {
    let mut total = 0usize;
    for d in ds {
        match d {
            Dim::Fixed(n) => {
                total = total
                    .checked_add(*n)
                    .ok_or_else(|| OpError::new("concatenated extent overflows"))?
            }
            Dim::Sym(_) => return Ok(Dim::unknown()),
        }
    }
    Ok(Dim::Fixed(total))
}

fn concat_dims(shapes: &[&[Dim]], axis: i64) -> Res<Vec<Dim>> {
    let first = shapes
        .first()
        .ok_or_else(|| OpError::new("Concat needs at least one input"))?;
    if first.is_empty() {
        bail!("cannot concatenate scalars");
    }
    let a = norm_axis(axis, first.len())?;
    let mut out = first.to_vec();
    for (i, s) in shapes.iter().enumerate().skip(1) {
        if s.len() != first.len() {
            bail!(
                "input {i} has rank {} but input 0 has rank {}",
                s.len(),
                first.len()
            );
        }
        for (d, (o, x)) in out.iter_mut().zip(s.iter()).enumerate() {
            if d != a {
                *o = merge_dim(o, x).map_err(|e| {
                    OpError::new(format!(
                        "input {i} {} does not match input 0 {} on axis {d}: {e}",
                        fmt_dims(s),
                        fmt_dims(first)
                    ))
                })?;
            }
        }
    }
    out[a] = sum_dims(shapes.iter().map(|s| &s[a]))?;
    Ok(out)
}

fn infer_concat(cx: &InferCtx, axis: i64) -> Res<TensorType> {
    let tys: Vec<&TensorType> = (0..cx.num_inputs()).map(|i| cx.ty(i)).collect::<Res<_>>()?;
    let first = tys
        .first()
        .ok_or_else(|| OpError::new("Concat needs at least one input"))?;
    for (i, t) in tys.iter().enumerate() {
        if t.dtype != first.dtype {
            bail!("input {i} is {} but input 0 is {}", t.dtype, first.dtype);
        }
    }
    let shapes: Vec<&[Dim]> = tys.iter().map(|t| t.shape.as_slice()).collect();
    Ok(TensorType::new(first.dtype, concat_dims(&shapes, axis)?))
}

fn eval_concat(cx: &EvalCtx, axis: i64) -> Res<Tensor> {
    let ts: Vec<&Tensor> = (0..cx.inputs.len()).map(|i| cx.input(i)).collect::<Res<_>>()?;
    let in_dims: Vec<Vec<Dim>> = ts.iter().map(|t| dims(t.shape())).collect();
    let shapes: Vec<&[Dim]> = in_dims.iter().map(Vec::as_slice).collect();
    let out_shape = concrete(concat_dims(&shapes, axis)?)?;
    check_alloc(&out_shape)?;
    let a = norm_axis(axis, out_shape.len())?;
    let inner: usize = numel(&out_shape[a + 1..]);
    let outer: usize = numel(&out_shape[..a]);
    fn go<T: Element>(ts: &[&Tensor], outer: usize, a: usize, inner: usize, n: usize) -> Res<TensorData> {
        let parts: Vec<(&[T], usize)> = ts
            .iter()
            .map(|t| Ok((typed::<T>(t, "every input")?, t.shape()[a] * inner)))
            .collect::<Res<_>>()?;
        let mut out = Vec::with_capacity(n);
        for o in 0..outer {
            for (src, chunk) in &parts {
                out.extend_from_slice(&src[o * chunk..(o + 1) * chunk]);
            }
        }
        Ok(T::wrap(out))
    }
    let n = numel(&out_shape);
    let first = ts[0];
    let data = crate::dispatch_dtype!(first.dtype(), T => go::<T>(&ts, outer, a, inner, n)?);
    make(out_shape, data)
}

/// Extents of the split outputs along a fixed axis extent `dim`.
fn split_sizes(
    dim: usize,
    split: Option<&[i64]>,
    n_out: usize,
    num_outputs: Option<usize>,
) -> Res<Vec<usize>> {
    if let Some(split) = split {
        if split.len() != n_out {
            bail!("split {split:?} has {} entries for {n_out} outputs", split.len());
        }
        let sizes: Vec<usize> = split
            .iter()
            .map(|&s| {
                usize::try_from(s).map_err(|_| OpError::new(format!("split {split:?} has a negative size")))
            })
            .collect::<Res<_>>()?;
        let total = sizes.iter().try_fold(0usize, |a, &b| a.checked_add(b));
        if total != Some(dim) {
            bail!("split {split:?} does not add up to the axis extent {dim}");
        }
        return Ok(sizes);
    }
    if n_out == 0 {
        bail!("Split needs at least one output");
    }
    // `num_outputs` (opset 18): chunks of ceil(dim / n), the last one smaller.
    let chunk = dim.div_ceil(n_out);
    if num_outputs.is_none() && chunk * n_out != dim {
        bail!("an axis of extent {dim} cannot be split into {n_out} equal parts");
    }
    let last = dim as i64 - (chunk * (n_out - 1)) as i64;
    if last < 0 {
        bail!("an axis of extent {dim} cannot be split into {n_out} chunks of {chunk}");
    }
    let mut sizes = vec![chunk; n_out];
    sizes[n_out - 1] = last as usize;
    Ok(sizes)
}

fn infer_split(cx: &InferCtx, axis: i64, num_outputs: Option<usize>) -> Res<Vec<TensorType>> {
    let x = cx.ty(0)?;
    let n = cx.num_outputs;
    if let Some(k) = num_outputs {
        if k != n {
            bail!("num_outputs is {k} but the node has {n} outputs");
        }
    }
    let a = norm_axis(axis, x.rank())?;
    let split = match cx.opt_ty(1) {
        Some(t) => {
            expect_dtype(t, DType::I64, "split")?;
            match vec_len(t, "split")? {
                Some(0) => None,
                _ => Some(known_i64s(cx.value(1))),
            }
        }
        None => None,
    };
    let sizes: Vec<Dim> = match (x.shape[a].fixed(), split) {
        (Some(d), Some(Some(s))) => fixed_dims(split_sizes(d, Some(&s), n, num_outputs)?),
        (None, Some(Some(s))) => {
            if s.len() != n {
                bail!("split {s:?} has {} entries for {n} outputs", s.len());
            }
            dims(&non_negative(&s, "split")?)
        }
        (Some(d), None) => fixed_dims(split_sizes(d, None, n, num_outputs)?),
        (None, None) if n == 1 => vec![x.shape[a].clone()],
        _ => vec![Dim::unknown(); n],
    };
    Ok(sizes
        .into_iter()
        .map(|d| {
            let mut shape = x.shape.clone();
            shape[a] = d;
            TensorType::new(x.dtype, shape)
        })
        .collect())
}

fn eval_split(cx: &EvalCtx, axis: i64, num_outputs: Option<usize>) -> Res<Vec<Tensor>> {
    let x = cx.input(0)?;
    let a = norm_axis(axis, x.rank())?;
    // An empty `split` input means "not given", as in onnxruntime.
    let split = cx.opt_input(1).map(|t| int_values(t, "split")).transpose()?;
    let split = split.filter(|s| !s.is_empty());
    let sizes = split_sizes(x.shape()[a], split.as_deref(), cx.num_outputs(), num_outputs)?;
    let inner = numel(&x.shape()[a + 1..]);
    let outer = numel(&x.shape()[..a]);
    let row = x.shape()[a] * inner;
    fn go<T: Element>(v: &[T], outer: usize, row: usize, begin: usize, len: usize) -> TensorData {
        let mut out = Vec::with_capacity(outer * len);
        for o in 0..outer {
            out.extend_from_slice(&v[o * row + begin..o * row + begin + len]);
        }
        T::wrap(out)
    }
    let mut begin = 0;
    let mut outs = Vec::with_capacity(sizes.len());
    for s in sizes {
        let mut shape = x.shape().to_vec();
        shape[a] = s;
        let data = crate::with_data!(x.data(), v => go(v, outer, row, begin * inner, s * inner));
        outs.push(make(shape, data)?);
        begin += s;
    }
    Ok(outs)
}

// ---------------------------------------------------------------------------------------------
// Slice.

/// Start and length of `Slice` along one axis of extent `dim` with ONNX clamping: negative
/// starts/ends count from the back, then starts clamp to `[0, dim]` (`[0, dim-1]` for negative
/// steps) and ends to `[0, dim]` (`[-1, dim-1]`).
fn slice_range(dim: usize, start: i64, end: i64, step: i64) -> Res<(usize, usize)> {
    if step == 0 {
        bail!("slice step cannot be 0");
    }
    let d = dim as i128;
    let wrap = |v: i64| if v < 0 { v as i128 + d } else { v as i128 };
    let (s, e, st) = (wrap(start), wrap(end), step as i128);
    if dim == 0 {
        return Ok((0, 0));
    }
    let (s, len) = if st > 0 {
        let (s, e) = (s.clamp(0, d), e.clamp(0, d));
        (s, if e > s { (e - s + st - 1) / st } else { 0 })
    } else {
        let (s, e) = (s.clamp(0, d - 1), e.clamp(-1, d - 1));
        (s, if s > e { (s - e - st - 1) / -st } else { 0 })
    };
    Ok((s as usize, len as usize))
}

/// Output extent of `Slice` along an axis with dim `d`. With a symbolic dim only the full-range
/// forms (`0..INT_MAX` step 1, `-1..INT_MIN` step -1) are known: they keep the dim.
fn slice_dim(d: &Dim, start: i64, end: i64, step: i64) -> Res<Dim> {
    match d {
        Dim::Fixed(n) => Ok(Dim::Fixed(slice_range(*n, start, end, step)?.1)),
        Dim::Sym(_) => {
            if step == 0 {
                bail!("slice step cannot be 0");
            }
            let to_end = step == 1 && start == 0 && end >= i32::MAX as i64;
            let reversed = step == -1 && start == -1 && end <= i32::MIN as i64;
            Ok(if to_end || reversed {
                d.clone()
            } else {
                Dim::unknown()
            })
        }
    }
}

/// `(start, end, step)` of one sliced axis.
type AxisSlice = (i64, i64, i64);

/// Per-axis slices from the `Slice` inputs, indexed by axis; `None` where an axis is not
/// sliced (it keeps its whole extent).
fn slice_spec(
    rank: usize,
    starts: &[i64],
    ends: &[i64],
    axes: Option<&[i64]>,
    steps: Option<&[i64]>,
) -> Res<Vec<Option<AxisSlice>>> {
    let n = starts.len();
    if ends.len() != n {
        bail!("starts has {n} entries but ends has {}", ends.len());
    }
    let axes: Vec<usize> = match axes {
        Some(a) if a.len() != n => bail!("starts has {n} entries but axes has {}", a.len()),
        Some(a) => norm_axes(a, rank)?,
        None if n > rank => bail!("starts has {n} entries for an input of rank {rank}"),
        None => (0..n).collect(),
    };
    if let Some(s) = steps {
        if s.len() != n {
            bail!("starts has {n} entries but steps has {}", s.len());
        }
    }
    let mut per_axis = vec![None; rank];
    for (i, &a) in axes.iter().enumerate() {
        let step = steps.map_or(1, |s| s[i]);
        if step == 0 {
            bail!("slice step cannot be 0");
        }
        per_axis[a] = Some((starts[i], ends[i], step));
    }
    Ok(per_axis)
}

fn check_slice_input(cx: &InferCtx, i: usize, what: &str, dtype: DType) -> Res<Option<usize>> {
    let t = cx.ty(i)?;
    expect_index_dtype(t.dtype, what)?;
    if t.dtype != dtype {
        bail!("{what} is {} but starts is {dtype}", t.dtype);
    }
    vec_len(t, what)
}

fn infer_slice(cx: &InferCtx) -> Res<TensorType> {
    let x = cx.ty(0)?;
    let dtype = cx.ty(1)?.dtype;
    let n_starts = check_slice_input(cx, 1, "starts", dtype)?;
    check_slice_input(cx, 2, "ends", dtype)?;
    for (i, what) in [(3, "axes"), (4, "steps")] {
        if cx.opt_ty(i).is_some() {
            check_slice_input(cx, i, what, dtype)?;
        }
    }
    let known = |i: usize| known_i64s(cx.value(i));
    let opt_known = |i: usize| match cx.opt_ty(i) {
        None => Some(None),
        Some(_) => known(i).map(Some),
    };
    let shape = match (known(1), known(2), opt_known(3), opt_known(4)) {
        (Some(s), Some(e), Some(a), Some(st)) => {
            let spec = slice_spec(x.rank(), &s, &e, a.as_deref(), st.as_deref())?;
            x.shape
                .iter()
                .zip(&spec)
                .map(|(d, p)| match p {
                    None => Ok(d.clone()),
                    Some((s, e, st)) => slice_dim(d, *s, *e, *st),
                })
                .collect::<Res<_>>()?
        }
        // Which axes are sliced is known, their bounds are not.
        (_, _, Some(a), _) => {
            let n = a.as_ref().map(Vec::len).or(n_starts);
            let sliced: Vec<usize> = match (a, n) {
                (Some(a), _) => norm_axes(&a, x.rank())?,
                (None, Some(n)) => (0..n.min(x.rank())).collect(),
                (None, None) => (0..x.rank()).collect(),
            };
            let mut shape = x.shape.clone();
            for a in sliced {
                shape[a] = Dim::unknown();
            }
            shape
        }
        _ => vec![Dim::unknown(); x.rank()],
    };
    Ok(TensorType::new(x.dtype, shape))
}

fn eval_slice(cx: &EvalCtx) -> Res<Tensor> {
    let x = cx.input(0)?;
    let starts = int_values(cx.input(1)?, "starts")?;
    let ends = int_values(cx.input(2)?, "ends")?;
    let axes = cx.opt_input(3).map(|t| int_values(t, "axes")).transpose()?;
    let steps = cx.opt_input(4).map(|t| int_values(t, "steps")).transpose()?;
    let spec = slice_spec(x.rank(), &starts, &ends, axes.as_deref(), steps.as_deref())?;
    let in_strides = strides(x.shape());
    let mut base = 0usize;
    let mut out_shape = Vec::with_capacity(x.rank());
    let mut st = Vec::with_capacity(x.rank());
    for ((&d, p), &stride) in x.shape().iter().zip(&spec).zip(&in_strides) {
        let ((begin, len), step) = match p {
            None => ((0, d), 1),
            Some((s, e, step)) => (slice_range(d, *s, *e, *step)?, *step),
        };
        out_shape.push(len);
        if len > 0 {
            base += begin * stride;
        }
        // |step| > extent reads at most one element: clamp so the stride cannot overflow.
        let step = step.clamp(-(d as i64).max(1), (d as i64).max(1)) as isize;
        st.push(step * stride as isize);
    }
    fn go<T: Element>(v: &[T], shape: &[usize], base: usize, st: &[isize]) -> TensorData {
        T::wrap(strided_copy(v, shape, base, st))
    }
    let data = crate::with_data!(x.data(), v => go(v, &out_shape, base, &st));
    make(out_shape, data)
}

// ---------------------------------------------------------------------------------------------
// Gather, GatherElements, GatherND.

fn infer_gather(cx: &InferCtx, axis: i64) -> Res<TensorType> {
    let data = cx.ty(0)?;
    let idx = cx.ty(1)?;
    expect_index_dtype(idx.dtype, "indices")?;
    if data.rank() == 0 {
        bail!("cannot gather from a scalar");
    }
    let a = norm_axis(axis, data.rank())?;
    let mut shape = data.shape[..a].to_vec();
    shape.extend(idx.shape.iter().cloned());
    shape.extend(data.shape[a + 1..].iter().cloned());
    Ok(TensorType::new(data.dtype, shape))
}

fn eval_gather(cx: &EvalCtx, axis: i64) -> Res<Tensor> {
    let data = cx.input(0)?;
    let idx_t = cx.input(1)?;
    expect_index_dtype(idx_t.dtype(), "indices")?;
    if data.rank() == 0 {
        bail!("cannot gather from a scalar");
    }
    let a = norm_axis(axis, data.rank())?;
    let dim = data.shape()[a];
    let idx: Vec<usize> = idx_t
        .to_i64_vec()
        .into_iter()
        .map(|i| norm_index(i, dim, "Gather"))
        .collect::<Res<_>>()?;
    let mut shape = data.shape()[..a].to_vec();
    shape.extend_from_slice(idx_t.shape());
    shape.extend_from_slice(&data.shape()[a + 1..]);
    check_alloc(&shape)?;
    let outer = numel(&data.shape()[..a]);
    let inner = numel(&data.shape()[a + 1..]);
    fn go<T: Element>(v: &[T], idx: &[usize], outer: usize, dim: usize, inner: usize) -> TensorData {
        let mut out = Vec::with_capacity(outer * idx.len() * inner);
        for o in 0..outer {
            for &i in idx {
                let s = (o * dim + i) * inner;
                out.extend_from_slice(&v[s..s + inner]);
            }
        }
        T::wrap(out)
    }
    let out = crate::with_data!(data.data(), v => go(v, &idx, outer, dim, inner));
    make(shape, out)
}

/// Checks the shapes of GatherElements/ScatterElements: `indices` has the data's rank and, off
/// the axis, extents no larger than the data's.
fn check_elements_shapes(data: &[Dim], idx: &[Dim], a: usize) -> Res<()> {
    if data.len() != idx.len() {
        bail!(
            "indices {} must have the rank of the data {}",
            fmt_dims(idx),
            fmt_dims(data)
        );
    }
    for (i, (d, x)) in data.iter().zip(idx).enumerate() {
        if let (Dim::Fixed(d), Dim::Fixed(x)) = (d, x) {
            if i != a && x > d {
                bail!(
                    "indices {} exceed the data {} on axis {i}",
                    fmt_dims(idx),
                    fmt_dims(data)
                );
            }
        }
    }
    Ok(())
}

fn infer_gather_elements(cx: &InferCtx, axis: i64) -> Res<TensorType> {
    let data = cx.ty(0)?;
    let idx = cx.ty(1)?;
    expect_index_dtype(idx.dtype, "indices")?;
    let a = norm_axis(axis, data.rank())?;
    check_elements_shapes(&data.shape, &idx.shape, a)?;
    Ok(TensorType::new(data.dtype, idx.shape.clone()))
}

/// For each element of `indices` (row-major), the flat offset into `data` it addresses along
/// axis `a` (GatherElements/ScatterElements).
fn element_offsets(data_shape: &[usize], idx: &Tensor, a: usize, what: &str) -> Res<Vec<usize>> {
    expect_index_dtype(idx.dtype(), "indices")?;
    check_elements_shapes(&dims(data_shape), &dims(idx.shape()), a)?;
    let ds = strides(data_shape);
    let vals = idx.to_i64_vec();
    let mut out = Vec::with_capacity(vals.len());
    let mut k = 0;
    for_each_index(idx.shape(), |pos| {
        let mut off = 0;
        for (ax, (&p, &s)) in pos.iter().zip(&ds).enumerate() {
            let c = if ax == a {
                norm_index(vals[k], data_shape[a], what)?
            } else {
                p
            };
            off += c * s;
        }
        out.push(off);
        k += 1;
        Ok(())
    })?;
    Ok(out)
}

fn eval_gather_elements(cx: &EvalCtx, axis: i64) -> Res<Tensor> {
    let data = cx.input(0)?;
    let idx = cx.input(1)?;
    let a = norm_axis(axis, data.rank())?;
    let offs = element_offsets(data.shape(), idx, a, "GatherElements")?;
    fn go<T: Element>(v: &[T], offs: &[usize]) -> TensorData {
        T::wrap(offs.iter().map(|&o| v[o]).collect())
    }
    let out = crate::with_data!(data.data(), v => go(v, &offs));
    make(idx.shape().to_vec(), out)
}

/// GatherND/ScatterND: `k`, the indices' last extent, must be known (it sets the output rank).
fn nd_index_len(idx: &TensorType, data_rank: usize, batch_dims: usize) -> Res<usize> {
    if idx.rank() == 0 {
        bail!("indices must have rank >= 1");
    }
    let Some(k) = idx.shape[idx.rank() - 1].fixed() else {
        bail!("the last dim of indices {idx} must be known: it decides the output rank");
    };
    if batch_dims + k > data_rank {
        bail!(
            "indices tuples of length {k} (after {batch_dims} batch dims) exceed the data rank {data_rank}"
        );
    }
    Ok(k)
}

fn gather_nd_dims(data: &[Dim], idx: &TensorType, b: usize) -> Res<Vec<Dim>> {
    let q = idx.rank();
    if b > 0 && (b >= q || b >= data.len()) {
        bail!("batch_dims {b} must be less than the ranks of data and indices");
    }
    let k = nd_index_len(idx, data.len(), b)?;
    for (i, (d, x)) in data.iter().zip(&idx.shape).take(b).enumerate() {
        merge_dim(d, x)
            .map_err(|e| OpError::new(format!("batch dim {i} of data and indices differ: {e}")))?;
    }
    let mut out = idx.shape[..q - 1].to_vec();
    out.extend(data[b + k..].iter().cloned());
    Ok(out)
}

fn infer_gather_nd(cx: &InferCtx, batch_dims: usize) -> Res<TensorType> {
    let data = cx.ty(0)?;
    let idx = cx.ty(1)?;
    expect_index_dtype(idx.dtype, "indices")?;
    Ok(TensorType::new(
        data.dtype,
        gather_nd_dims(&data.shape, idx, batch_dims)?,
    ))
}

/// Flat offsets (into the data) of the slices that GatherND/ScatterND index tuples address,
/// one per tuple, in row-major order of the tuples. `b` leading dims are batch dims.
fn nd_offsets(data_shape: &[usize], idx: &Tensor, b: usize, what: &str) -> Res<Vec<usize>> {
    let k = idx.shape().last().copied().unwrap_or(0);
    let vals = idx.to_i64_vec();
    let ds = strides(data_shape);
    let tuples = numel(&idx.shape()[..idx.rank() - 1]);
    let per_batch = numel(&idx.shape()[b..idx.rank() - 1]).max(1);
    let batch_stride = if b == 0 { 0 } else { ds[b - 1] };
    let mut out = Vec::with_capacity(tuples);
    for t in 0..tuples {
        let mut off = (t / per_batch) * batch_stride;
        for j in 0..k {
            let c = norm_index(vals[t * k + j], data_shape[b + j], what)?;
            off += c * ds[b + j];
        }
        out.push(off);
    }
    Ok(out)
}

fn eval_gather_nd(cx: &EvalCtx, b: usize) -> Res<Tensor> {
    let data = cx.input(0)?;
    let idx = cx.input(1)?;
    expect_index_dtype(idx.dtype(), "indices")?;
    let shape = concrete(gather_nd_dims(&dims(data.shape()), &idx.tensor_type(), b)?)?;
    check_alloc(&shape)?;
    let k = idx.shape()[idx.rank() - 1];
    let slice = numel(&data.shape()[b + k..]);
    let offs = nd_offsets(data.shape(), idx, b, "GatherND")?;
    fn go<T: Element>(v: &[T], offs: &[usize], slice: usize) -> TensorData {
        let mut out = Vec::with_capacity(offs.len() * slice);
        for &o in offs {
            out.extend_from_slice(&v[o..o + slice]);
        }
        T::wrap(out)
    }
    let out = crate::with_data!(data.data(), v => go(v, &offs, slice));
    make(shape, out)
}

// ---------------------------------------------------------------------------------------------
// ScatterND, ScatterElements.

/// Element arithmetic for scatter reductions: integers wrap (as numpy does), f16/bf16 compute
/// in f32 and round each step, bool uses or/and.
trait ScatterElem: Element {
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
}

macro_rules! scatter_int {
    ($($t:ty),*) => {$(
        impl ScatterElem for $t {
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
        }
    )*};
}
scatter_int!(u8, i8, u16, i16, u32, i32, u64, i64);

macro_rules! scatter_float {
    ($($t:ty),*) => {$(
        impl ScatterElem for $t {
            fn add(self, o: Self) -> Self {
                self + o
            }
            fn mul(self, o: Self) -> Self {
                self * o
            }
        }
    )*};
}
scatter_float!(f32, f64);

macro_rules! scatter_half {
    ($($t:ty),*) => {$(
        impl ScatterElem for $t {
            fn add(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() + o.to_f32())
            }
            fn mul(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() * o.to_f32())
            }
        }
    )*};
}
scatter_half!(f16, bf16);

impl ScatterElem for bool {
    fn add(self, o: Self) -> Self {
        self || o
    }
    fn mul(self, o: Self) -> Self {
        self && o
    }
}

/// Combines the current value `x` with an update `y`. ScatterND's max/min propagate NaN (numpy
/// `maximum`); ScatterElements' keep `x` unless `y` compares greater/less (`std::max`), as the
/// ONNX reference and onnxruntime do.
fn reduce<T: ScatterElem>(r: ScatterReduction, x: T, y: T, nan_propagating: bool) -> T {
    let nan = nan_propagating && (x.is_nan() || y.is_nan());
    match r {
        ScatterReduction::None => y,
        ScatterReduction::Add => x.add(y),
        ScatterReduction::Mul => x.mul(y),
        ScatterReduction::Max | ScatterReduction::Min if nan => {
            if x.is_nan() {
                x
            } else {
                y
            }
        }
        ScatterReduction::Max => {
            if y > x {
                y
            } else {
                x
            }
        }
        ScatterReduction::Min => {
            if y < x {
                y
            } else {
                x
            }
        }
    }
}

fn infer_scatter_nd(cx: &InferCtx) -> Res<TensorType> {
    let data = cx.ty(0)?;
    let idx = cx.ty(1)?;
    let upd = cx.ty(2)?;
    expect_index_dtype(idx.dtype, "indices")?;
    expect_same_dtype(data.dtype, upd.dtype, "updates")?;
    // The output is the data's type; the updates' shape can only be checked once the index
    // tuple length is known (evaluation always checks it).
    if idx.rank() == 0 {
        bail!("indices must have rank >= 1");
    }
    if idx.shape[idx.rank() - 1].is_fixed() {
        scatter_nd_check(&data.shape, idx, &upd.shape)?;
    }
    Ok(data.clone())
}

/// `updates` must have shape `indices.shape[:-1] + data.shape[k:]`.
fn scatter_nd_check(data: &[Dim], idx: &TensorType, upd: &[Dim]) -> Res<()> {
    let k = nd_index_len(idx, data.len(), 0)?;
    let mut expected = idx.shape[..idx.rank() - 1].to_vec();
    expected.extend(data[k..].iter().cloned());
    let ok = expected.len() == upd.len() && expected.iter().zip(upd).all(|(e, u)| merge_dim(e, u).is_ok());
    if !ok {
        bail!(
            "updates {} must have shape {} (indices {} into data {})",
            fmt_dims(upd),
            fmt_dims(&expected),
            fmt_dims(&idx.shape),
            fmt_dims(data)
        );
    }
    Ok(())
}

fn eval_scatter_nd(cx: &EvalCtx, r: ScatterReduction) -> Res<Tensor> {
    let data = cx.input(0)?;
    let idx = cx.input(1)?;
    let upd = cx.input(2)?;
    expect_index_dtype(idx.dtype(), "indices")?;
    scatter_nd_check(&dims(data.shape()), &idx.tensor_type(), &dims(upd.shape()))?;
    let k = idx.shape()[idx.rank() - 1];
    let slice = numel(&data.shape()[k..]);
    let offs = nd_offsets(data.shape(), idx, 0, "ScatterND")?;
    fn go<T: ScatterElem>(
        v: &[T],
        upd: &Tensor,
        offs: &[usize],
        slice: usize,
        r: ScatterReduction,
    ) -> Res<TensorData> {
        let u = typed::<T>(upd, "updates")?;
        let mut out = v.to_vec();
        for (t, &o) in offs.iter().enumerate() {
            for j in 0..slice {
                out[o + j] = reduce(r, out[o + j], u[t * slice + j], true);
            }
        }
        Ok(T::wrap(out))
    }
    let out = crate::with_data!(data.data(), v => go(v, upd, &offs, slice, r)?);
    make(data.shape().to_vec(), out)
}

fn infer_scatter_elements(cx: &InferCtx, axis: i64) -> Res<TensorType> {
    let data = cx.ty(0)?;
    let idx = cx.ty(1)?;
    let upd = cx.ty(2)?;
    expect_index_dtype(idx.dtype, "indices")?;
    expect_same_dtype(data.dtype, upd.dtype, "updates")?;
    let a = norm_axis(axis, data.rank())?;
    check_elements_shapes(&data.shape, &idx.shape, a)?;
    let same = idx.rank() == upd.rank()
        && idx
            .shape
            .iter()
            .zip(&upd.shape)
            .all(|(x, y)| merge_dim(x, y).is_ok());
    if !same {
        bail!("updates {upd} must have the shape of indices {idx}");
    }
    Ok(data.clone())
}

fn eval_scatter_elements(cx: &EvalCtx, axis: i64, r: ScatterReduction) -> Res<Tensor> {
    let data = cx.input(0)?;
    let idx = cx.input(1)?;
    let upd = cx.input(2)?;
    if idx.shape() != upd.shape() {
        bail!(
            "updates {:?} must have the shape of indices {:?}",
            upd.shape(),
            idx.shape()
        );
    }
    let a = norm_axis(axis, data.rank())?;
    let offs = element_offsets(data.shape(), idx, a, "ScatterElements")?;
    fn go<T: ScatterElem>(v: &[T], upd: &Tensor, offs: &[usize], r: ScatterReduction) -> Res<TensorData> {
        let u = typed::<T>(upd, "updates")?;
        let mut out = v.to_vec();
        for (&o, &y) in offs.iter().zip(u) {
            out[o] = reduce(r, out[o], y, false);
        }
        Ok(T::wrap(out))
    }
    let out = crate::with_data!(data.data(), v => go(v, upd, &offs, r)?);
    make(data.shape().to_vec(), out)
}

// ---------------------------------------------------------------------------------------------
// Expand, Tile, Pad.

fn non_negative(v: &[i64], what: &str) -> Res<Vec<usize>> {
    v.iter()
        .map(|&x| usize::try_from(x).map_err(|_| OpError::new(format!("{what} {v:?} has a negative entry"))))
        .collect()
}

fn infer_expand(cx: &InferCtx) -> Res<TensorType> {
    let x = cx.ty(0)?;
    let shape_ty = cx.ty(1)?;
    expect_dtype(shape_ty, DType::I64, "the shape input")?;
    let len = vec_len(shape_ty, "the shape input")?;
    let shape = match (known_i64s(cx.value(1)), len) {
        (Some(s), _) => broadcast_dims(&x.shape, &dims(&non_negative(&s, "shape")?))?,
        (None, Some(n)) => {
            // The rank is known; a dim is known where the input's is fixed and not 1.
            let rank = n.max(x.rank());
            (0..rank)
                .map(|i| match (i + x.rank()).checked_sub(rank).map(|j| &x.shape[j]) {
                    Some(Dim::Fixed(d)) if *d != 1 => Dim::Fixed(*d),
                    _ => Dim::unknown(),
                })
                .collect()
        }
        (None, None) => bail!("the output rank is unknown: the shape input has an unknown length"),
    };
    Ok(TensorType::new(x.dtype, shape))
}

/// Strides that read `in_shape` broadcast to `out_shape` (0 along broadcast axes).
fn broadcast_strides(in_shape: &[usize], out_shape: &[usize]) -> Vec<isize> {
    let off = out_shape.len() - in_shape.len();
    let s = strides(in_shape);
    (0..out_shape.len())
        .map(|i| {
            if i < off || in_shape[i - off] == 1 {
                0
            } else {
                s[i - off] as isize
            }
        })
        .collect()
}

fn eval_expand(cx: &EvalCtx) -> Res<Tensor> {
    let x = cx.input(0)?;
    let target = non_negative(&int_values(cx.input(1)?, "the shape input")?, "shape")?;
    let out_shape = broadcast_shapes(x.shape(), &target)?;
    check_alloc(&out_shape)?;
    let st = broadcast_strides(x.shape(), &out_shape);
    fn go<T: Element>(v: &[T], shape: &[usize], st: &[isize]) -> TensorData {
        T::wrap(strided_copy(v, shape, 0, st))
    }
    let data = crate::with_data!(x.data(), v => go(v, &out_shape, &st));
    make(out_shape, data)
}

fn tile_dims(input: &[Dim], repeats: &[i64]) -> Res<Vec<Dim>> {
    if repeats.len() != input.len() {
        bail!(
            "repeats {repeats:?} must have one entry per input axis ({})",
            input.len()
        );
    }
    let reps = non_negative(repeats, "repeats")?;
    input
        .iter()
        .zip(reps)
        .map(|(d, r)| match (d, r) {
            (_, 0) => Ok(Dim::Fixed(0)),
            (_, 1) => Ok(d.clone()),
            (Dim::Fixed(n), r) => n
                .checked_mul(r)
                .map(Dim::Fixed)
                .ok_or_else(|| OpError::new(format!("tiling {} by {repeats:?} overflows", fmt_dims(input)))),
            (Dim::Sym(_), _) => Ok(Dim::unknown()),
        })
        .collect()
}

fn infer_tile(cx: &InferCtx) -> Res<TensorType> {
    let x = cx.ty(0)?;
    let reps_ty = cx.ty(1)?;
    expect_dtype(reps_ty, DType::I64, "repeats")?;
    if let Some(n) = vec_len(reps_ty, "repeats")? {
        if n != x.rank() {
            bail!("repeats has {n} entries for an input of rank {}", x.rank());
        }
    }
    let shape = match known_i64s(cx.value(1)) {
        Some(r) => tile_dims(&x.shape, &r)?,
        None => vec![Dim::unknown(); x.rank()],
    };
    Ok(TensorType::new(x.dtype, shape))
}

fn eval_tile(cx: &EvalCtx) -> Res<Tensor> {
    let x = cx.input(0)?;
    let reps = int_values(cx.input(1)?, "repeats")?;
    let out_shape = concrete(tile_dims(&dims(x.shape()), &reps)?)?;
    check_alloc(&out_shape)?;
    let maps: Vec<Vec<Option<usize>>> = out_shape
        .iter()
        .zip(x.shape())
        .map(|(&o, &d)| (0..o).map(|i| Some(i % d.max(1))).collect())
        .collect();
    fn go<T: Element>(v: &[T], shape: &[usize], maps: &[Vec<Option<usize>>]) -> TensorData {
        T::wrap(gather_axes(v, shape, maps, T::zero()))
    }
    let data = crate::with_data!(x.data(), v => go(v, x.shape(), &maps));
    make(out_shape, data)
}

/// Per-axis `(begin, end)` pads of `Pad`, from `pads` and the optional `axes`.
fn pad_amounts(rank: usize, pads: &[i64], axes: Option<&[i64]>) -> Res<Vec<(i64, i64)>> {
    let axes: Vec<usize> = match axes {
        Some(a) => norm_axes(a, rank)?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        bail!(
            "pads {pads:?} must have 2 entries per padded axis ({} axes)",
            axes.len()
        );
    }
    let mut out = vec![(0, 0); rank];
    for (i, &a) in axes.iter().enumerate() {
        out[a] = (pads[i], pads[axes.len() + i]);
    }
    Ok(out)
}

fn padded_dim(d: &Dim, (b, e): (i64, i64)) -> Res<Dim> {
    match d {
        Dim::Fixed(n) => {
            let crop = (-(b as i128)).max(0) + (-(e as i128)).max(0);
            if crop > *n as i128 {
                bail!("pads ({b}, {e}) crop more than the extent {n}");
            }
            let total = *n as i128 + b as i128 + e as i128;
            usize::try_from(total)
                .map(Dim::Fixed)
                .map_err(|_| OpError::new(format!("pads ({b}, {e}) make the extent too large")))
        }
        Dim::Sym(_) if b == 0 && e == 0 => Ok(d.clone()),
        Dim::Sym(_) => Ok(Dim::unknown()),
    }
}

fn infer_pad(cx: &InferCtx) -> Res<TensorType> {
    let x = cx.ty(0)?;
    let pads_ty = cx.ty(1)?;
    expect_dtype(pads_ty, DType::I64, "pads")?;
    vec_len(pads_ty, "pads")?;
    if let Some(v) = cx.opt_ty(2) {
        expect_same_dtype(x.dtype, v.dtype, "constant_value")?;
        expect_scalar_like(v, "constant_value")?;
    }
    if let Some(a) = cx.opt_ty(3) {
        expect_index_dtype(a.dtype, "axes")?;
        vec_len(a, "axes")?;
    }
    let axes = match cx.opt_ty(3) {
        None => Some(None),
        Some(_) => known_i64s(cx.value(3)).map(Some),
    };
    let shape = match (known_i64s(cx.value(1)), axes) {
        (Some(p), Some(a)) => x
            .shape
            .iter()
            .zip(pad_amounts(x.rank(), &p, a.as_deref())?)
            .map(|(d, pe)| padded_dim(d, pe))
            .collect::<Res<_>>()?,
        _ => vec![Dim::unknown(); x.rank()],
    };
    Ok(TensorType::new(x.dtype, shape))
}

/// Source coordinate for each output coordinate along one axis of extent `d` padded by
/// `(b, e)` to `out` (= d + b + e, already checked). Negative pads first crop the input; the
/// padding then refers to the cropped extent (as onnxruntime does). `None` is the fill value.
fn pad_axis_map(d: usize, (b, e): (i64, i64), out: usize, mode: PadMode) -> Res<Vec<Option<usize>>> {
    let crop_b = (-(b as i128)).max(0);
    let crop_e = (-(e as i128)).max(0);
    let c = d as i128 - crop_b - crop_e;
    if c < 0 {
        bail!("pads ({b}, {e}) crop more than the extent {d}");
    }
    let pb = (b as i128).max(0);
    if c == 0 && out > 0 && mode != PadMode::Constant {
        bail!("{mode:?} padding needs a non-empty axis");
    }
    Ok((0..out as i128)
        .map(|o| {
            let i = o - pb;
            let src = if (0..c).contains(&i) {
                Some(i)
            } else {
                match mode {
                    PadMode::Constant => None,
                    PadMode::Edge => Some(i.clamp(0, c - 1)),
                    PadMode::Wrap => Some(i.rem_euclid(c)),
                    PadMode::Reflect if c == 1 => Some(0),
                    PadMode::Reflect => {
                        // Mirror without repeating the edge: a triangle wave of period 2(c-1),
                        // which is also what numpy gives for pads wider than the axis.
                        let period = 2 * (c - 1);
                        let m = i.rem_euclid(period);
                        Some(if m >= c { period - m } else { m })
                    }
                }
            };
            src.map(|s| (s + crop_b) as usize)
        })
        .collect())
}

fn eval_pad(cx: &EvalCtx, mode: PadMode) -> Res<Tensor> {
    let x = cx.input(0)?;
    let pads = int_values(cx.input(1)?, "pads")?;
    let axes = cx.opt_input(3).map(|t| int_values(t, "axes")).transpose()?;
    let amounts = pad_amounts(x.rank(), &pads, axes.as_deref())?;
    let out_dims = x
        .shape()
        .iter()
        .zip(&amounts)
        .map(|(&d, &p)| padded_dim(&Dim::Fixed(d), p))
        .collect::<Res<_>>()?;
    let out_shape = concrete(out_dims)?;
    check_alloc(&out_shape)?;
    let maps: Vec<Vec<Option<usize>>> = x
        .shape()
        .iter()
        .zip(&amounts)
        .zip(&out_shape)
        .map(|((&d, &p), &o)| pad_axis_map(d, p, o, mode))
        .collect::<Res<_>>()?;
    fn go<T: Element>(
        v: &[T],
        shape: &[usize],
        maps: &[Vec<Option<usize>>],
        fill: Option<&Tensor>,
    ) -> Res<TensorData> {
        let fill = match fill {
            Some(t) => typed::<T>(t, "constant_value")?
                .first()
                .copied()
                .unwrap_or_default(),
            None => T::zero(),
        };
        Ok(T::wrap(gather_axes(v, shape, maps, fill)))
    }
    let fill = cx.opt_input(2);
    let data = crate::with_data!(x.data(), v => go(v, x.shape(), &maps, fill)?);
    make(out_shape, data)
}

// ---------------------------------------------------------------------------------------------
// Range, ConstantOfShape.

fn infer_range(cx: &InferCtx) -> Res<TensorType> {
    let start = cx.ty(0)?;
    let ok = start.dtype.is_float() || start.dtype.is_signed_int();
    if !ok {
        bail!("Range needs a signed integer or float type, got {}", start.dtype);
    }
    for (i, what) in [(0, "start"), (1, "limit"), (2, "delta")] {
        let t = cx.ty(i)?;
        expect_scalar_like(t, what)?;
        if t.dtype != start.dtype {
            bail!("{what} is {} but start is {}", t.dtype, start.dtype);
        }
    }
    let len = match (cx.value(0), cx.value(1), cx.value(2)) {
        (Some(s), Some(l), Some(d)) => Dim::Fixed(range_len(s, l, d)?),
        _ => Dim::unknown(),
    };
    Ok(TensorType::new(start.dtype, vec![len]))
}

fn scalar_f64(t: &Tensor, what: &str) -> Res<f64> {
    match t.to_f64_vec().as_slice() {
        [x] => Ok(*x),
        _ => bail!("{what} must hold exactly one value, got shape {:?}", t.shape()),
    }
}

fn ceil_div(a: i128, b: i128) -> i128 {
    let q = a / b;
    if a % b != 0 && ((a < 0) == (b < 0)) {
        q + 1
    } else {
        q
    }
}

/// `max(ceil((limit - start) / delta), 0)`, exact for integers and in f64 for floats (as
/// numpy's `arange`, which the ONNX reference uses).
fn range_len(s: &Tensor, l: &Tensor, d: &Tensor) -> Res<usize> {
    let n = if s.dtype().is_float() {
        let (s, l, d) = (
            scalar_f64(s, "start")?,
            scalar_f64(l, "limit")?,
            scalar_f64(d, "delta")?,
        );
        if d == 0.0 {
            bail!("delta cannot be 0");
        }
        // NaN or infinite bounds have no length (NaN would otherwise clamp to 0).
        let n = ((l - s) / d).ceil();
        if !n.is_finite() {
            bail!("Range({s}, {l}, {d}) has no finite length");
        }
        n.max(0.0) as usize
    } else {
        let (s, l, d) = (
            int_scalar(s, "start")?,
            int_scalar(l, "limit")?,
            int_scalar(d, "delta")?,
        );
        if d == 0 {
            bail!("delta cannot be 0");
        }
        let n = ceil_div(l as i128 - s as i128, d as i128).max(0);
        usize::try_from(n).map_err(|_| OpError::new(format!("Range({s}, {l}, {d}) is too long")))?
    };
    check_alloc(&[n])?;
    Ok(n)
}

/// Elements `start + i * delta`: integers exact, floats computed in f64 and rounded once.
fn eval_range(cx: &EvalCtx) -> Res<Tensor> {
    let (s, l, d) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
    let dtype = s.dtype();
    if l.dtype() != dtype || d.dtype() != dtype {
        bail!("start, limit and delta must have one type");
    }
    let n = range_len(s, l, d)?;
    let data = if dtype.is_float() {
        let (s, d) = (scalar_f64(s, "start")?, scalar_f64(d, "delta")?);
        TensorData::from_f64s(dtype, (0..n).map(|i| s + i as f64 * d))
    } else {
        let (s, d) = (int_scalar(s, "start")? as i128, int_scalar(d, "delta")? as i128);
        fn go<T: Element>(s: i128, d: i128, n: usize) -> TensorData {
            // Every element lies between start and limit, so it fits the type.
            T::wrap((0..n).map(|i| T::from_i64((s + i as i128 * d) as i64)).collect())
        }
        crate::dispatch_dtype!(dtype, T => go::<T>(s, d, n))
    };
    make(vec![n], data)
}

fn infer_constant_of_shape(cx: &InferCtx, value: &Tensor) -> Res<TensorType> {
    if value.len() != 1 {
        bail!(
            "value must hold exactly one element, got shape {:?}",
            value.shape()
        );
    }
    let shape_ty = cx.ty(0)?;
    expect_dtype(shape_ty, DType::I64, "the shape input")?;
    let len = vec_len(shape_ty, "the shape input")?;
    let shape = match (known_i64s(cx.value(0)), len) {
        (Some(s), _) => dims(&non_negative(&s, "shape")?),
        (None, Some(n)) => vec![Dim::unknown(); n],
        (None, None) => bail!("the output rank is unknown: the shape input has an unknown length"),
    };
    Ok(TensorType::new(value.dtype(), shape))
}

fn eval_constant_of_shape(cx: &EvalCtx, value: &Tensor) -> Res<Tensor> {
    let shape = non_negative(&int_values(cx.input(0)?, "the shape input")?, "shape")?;
    let n = check_alloc(&shape)?;
    fn go<T: Element>(v: &[T], n: usize) -> Res<TensorData> {
        match v {
            [x] => Ok(T::wrap(vec![*x; n])),
            _ => bail!("value must hold exactly one element"),
        }
    }
    let data = crate::with_data!(value.data(), v => go(v, n)?);
    make(shape, data)
}

// ---------------------------------------------------------------------------------------------
// Trilu, NonZero, OneHot, EyeLike.

fn infer_trilu(cx: &InferCtx) -> Res<TensorType> {
    let x = cx.ty(0)?;
    if x.rank() < 2 {
        bail!("Trilu needs rank >= 2, got {x}");
    }
    if let Some(k) = cx.opt_ty(1) {
        expect_dtype(k, DType::I64, "k")?;
        expect_scalar_like(k, "k")?;
    }
    Ok(x.clone())
}

fn eval_trilu(cx: &EvalCtx, upper: bool) -> Res<Tensor> {
    let x = cx.input(0)?;
    if x.rank() < 2 {
        bail!("Trilu needs rank >= 2, got shape {:?}", x.shape());
    }
    let k = cx
        .opt_input(1)
        .map(|t| int_scalar(t, "k"))
        .transpose()?
        .unwrap_or(0);
    let (rows, cols) = (x.shape()[x.rank() - 2], x.shape()[x.rank() - 1]);
    fn go<T: Element>(v: &[T], rows: usize, cols: usize, k: i64, upper: bool) -> TensorData {
        let keep = |i: usize, j: usize| {
            let diff = j as i128 - i as i128;
            if upper {
                diff >= k as i128
            } else {
                diff <= k as i128
            }
        };
        let out = v
            .iter()
            .enumerate()
            .map(|(f, &x)| {
                let (i, j) = ((f / cols) % rows, f % cols);
                if keep(i, j) {
                    x
                } else {
                    T::zero()
                }
            })
            .collect();
        T::wrap(out)
    }
    if rows == 0 || cols == 0 {
        return Ok(x.clone());
    }
    let data = crate::with_data!(x.data(), v => go(v, rows, cols, k, upper));
    make(x.shape().to_vec(), data)
}

/// Coordinates of the non-zero elements, `[rank, nnz]` (for a scalar `[0, nnz]`, as the ONNX
/// reference gives).
fn eval_nonzero(x: &Tensor) -> Res<Tensor> {
    let shape = x.shape();
    fn go<T: Element>(v: &[T]) -> Vec<usize> {
        v.iter()
            .enumerate()
            .filter(|(_, &x)| x != T::zero())
            .map(|(i, _)| i)
            .collect()
    }
    let flat = crate::with_data!(x.data(), v => go(v));
    let nnz = flat.len();
    let st = strides(shape);
    let mut out = vec![0i64; shape.len() * nnz];
    for (n, &f) in flat.iter().enumerate() {
        for (a, (&s, &d)) in st.iter().zip(shape).enumerate() {
            out[a * nnz + n] = ((f / s) % d) as i64;
        }
    }
    make(vec![shape.len(), nnz], TensorData::I64(out))
}

fn infer_one_hot(cx: &InferCtx, axis: i64) -> Res<TensorType> {
    let idx = cx.ty(0)?;
    let depth = cx.ty(1)?;
    let values = cx.ty(2)?;
    if idx.dtype == DType::Bool || depth.dtype == DType::Bool {
        bail!("indices and depth must be numeric");
    }
    expect_scalar_like(depth, "depth")?;
    if values.rank() != 1 || matches!(values.shape[0], Dim::Fixed(n) if n != 2) {
        bail!("values must be [off_value, on_value], got {values}");
    }
    let a = norm_axis_inclusive(axis, idx.rank())?;
    let d = match cx.value(1) {
        Some(t) => Dim::Fixed(one_hot_depth(t)?),
        None => Dim::unknown(),
    };
    let mut shape = idx.shape.clone();
    shape.insert(a, d);
    Ok(TensorType::new(values.dtype, shape))
}

/// The depth as an extent; non-integer depths truncate, as the ONNX spec says.
fn one_hot_depth(t: &Tensor) -> Res<usize> {
    let d = scalar_f64(t, "depth")?.trunc();
    if !(0.0..=(1u64 << 40) as f64).contains(&d) {
        bail!("depth {d} is not a valid extent");
    }
    Ok(d as usize)
}

fn eval_one_hot(cx: &EvalCtx, axis: i64) -> Res<Tensor> {
    let idx = cx.input(0)?;
    let depth = one_hot_depth(cx.input(1)?)?;
    let values = cx.input(2)?;
    if values.len() != 2 {
        bail!(
            "values must be [off_value, on_value], got shape {:?}",
            values.shape()
        );
    }
    let a = norm_axis_inclusive(axis, idx.rank())?;
    let mut shape = idx.shape().to_vec();
    shape.insert(a, depth);
    check_alloc(&shape)?;
    let inner = numel(&idx.shape()[a..]);
    // Position of each index on the new axis; out-of-range (and non-integral) ones match no
    // position and leave the row all off_value.
    let pos: Vec<Option<usize>> = idx
        .to_f64_vec()
        .into_iter()
        .map(|v| {
            let v = if v < 0.0 { v + depth as f64 } else { v };
            (v >= 0.0 && v < depth as f64 && v.fract() == 0.0).then_some(v as usize)
        })
        .collect();
    fn go<T: Element>(vals: &[T], pos: &[Option<usize>], n: usize, depth: usize, inner: usize) -> TensorData {
        let (off, on) = (vals[0], vals[1]);
        let mut out = vec![off; n];
        for (f, p) in pos.iter().enumerate() {
            if let Some(p) = p {
                let (o, i) = (f / inner.max(1), f % inner.max(1));
                out[(o * depth + p) * inner + i] = on;
            }
        }
        T::wrap(out)
    }
    let n = numel(&shape);
    let data = crate::with_data!(values.data(), v => go(v, &pos, n, depth, inner));
    make(shape, data)
}

fn infer_eye_like(cx: &InferCtx, dtype: Option<DType>) -> Res<TensorType> {
    let x = cx.ty(0)?;
    if x.rank() != 2 {
        bail!("EyeLike needs a 2-D input, got {x}");
    }
    Ok(TensorType::new(dtype.unwrap_or(x.dtype), x.shape.clone()))
}

fn eval_eye_like(cx: &EvalCtx, dtype: Option<DType>, k: i64) -> Res<Tensor> {
    let x = cx.input(0)?;
    if x.rank() != 2 {
        bail!("EyeLike needs a 2-D input, got shape {:?}", x.shape());
    }
    let (rows, cols) = (x.shape()[0], x.shape()[1]);
    fn go<T: Element>(rows: usize, cols: usize, k: i64) -> TensorData {
        let mut out = vec![T::zero(); rows * cols];
        for i in 0..rows {
            let j = i as i128 + k as i128;
            if (0..cols as i128).contains(&j) {
                out[i * cols + j as usize] = T::one();
            }
        }
        T::wrap(out)
    }
    let data = crate::dispatch_dtype!(dtype.unwrap_or(x.dtype()), T => go::<T>(rows, cols, k));
    make(vec![rows, cols], data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::util::unravel;

    fn sym(s: &str) -> Dim {
        Dim::Sym(s.into())
    }

    fn i64s(v: &[i64]) -> Tensor {
        Tensor::from_vec(vec![v.len()], v.to_vec())
    }

    fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_vec(shape.to_vec(), v.to_vec())
    }

    fn iota(shape: &[usize]) -> Tensor {
        let n = numel(shape);
        Tensor::from_vec(shape.to_vec(), (0..n as i64).collect())
    }

    /// Infers with every input value known, evaluates, and checks that the evaluated shapes
    /// and dtypes agree with the inferred types.
    fn run_n(op: &Op, inputs: &[Option<&Tensor>], n_out: usize) -> Res<Vec<Tensor>> {
        let types: Vec<Option<TensorType>> = inputs.iter().map(|t| t.map(Tensor::tensor_type)).collect();
        let icx = InferCtx {
            inputs: types.iter().map(Option::as_ref).collect(),
            values: inputs.to_vec(),
            num_outputs: n_out,
        };
        let out_types = infer(op, &icx)?;
        let ecx = EvalCtx {
            inputs: inputs.to_vec(),
            out_types: &out_types,
        };
        let outs = eval(op, &ecx)?;
        for (t, ty) in outs.iter().zip(&out_types) {
            assert_eq!(t.dtype(), ty.dtype);
            assert_eq!(t.rank(), ty.rank(), "{op:?}: {ty} vs {:?}", t.shape());
            for (&d, td) in t.shape().iter().zip(&ty.shape) {
                if let Dim::Fixed(n) = td {
                    assert_eq!(d, *n, "{op:?}: inferred {ty}, evaluated {:?}", t.shape());
                }
            }
        }
        Ok(outs)
    }

    fn run(op: &Op, inputs: &[&Tensor]) -> Res<Tensor> {
        let ins: Vec<Option<&Tensor>> = inputs.iter().map(|t| Some(*t)).collect();
        Ok(run_n(op, &ins, 1)?.remove(0))
    }

    /// Infers with the given types and no known values beyond `values`.
    fn infer_types(op: &Op, types: &[TensorType], values: &[Option<&Tensor>]) -> Res<TensorType> {
        let icx = InferCtx {
            inputs: types.iter().map(Some).collect(),
            values: (0..types.len())
                .map(|i| values.get(i).copied().flatten())
                .collect(),
            num_outputs: 1,
        };
        Ok(infer(op, &icx)?.remove(0))
    }

    fn vals(t: &Tensor) -> Vec<i64> {
        t.to_i64_vec()
    }

    #[test]
    fn reshape_cancels_symbols_and_copies_zeros() {
        let x = TensorType::new(DType::F32, vec![sym("batch"), 3.into(), 4.into()]);
        let s = i64s(&[0, -1]);
        let t = infer_types(
            &Op::Reshape { allow_zero: false },
            &[x.clone(), s.tensor_type()],
            &[None, Some(&s)],
        );
        assert_eq!(t.unwrap().shape, vec![sym("batch"), 12.into()]);
        let s = i64s(&[-1, 12]);
        let t = infer_types(
            &Op::Reshape { allow_zero: false },
            &[x.clone(), s.tensor_type()],
            &[None, Some(&s)],
        );
        assert_eq!(t.unwrap().shape, vec![sym("batch"), 12.into()]);
        let s = i64s(&[-1, 5]);
        let t = infer_types(
            &Op::Reshape { allow_zero: false },
            &[x, s.tensor_type()],
            &[None, Some(&s)],
        );
        assert_eq!(t.unwrap().shape, vec![Dim::unknown(), 5.into()]);
    }

    #[test]
    fn reshape_rules() {
        let x = iota(&[2, 3, 4]);
        let r = |spec: &[i64], allow_zero| run(&Op::Reshape { allow_zero }, &[&x, &i64s(spec)]);
        assert_eq!(r(&[4, -1], false).unwrap().shape(), &[4, 6]);
        assert_eq!(r(&[0, 0, -1], false).unwrap().shape(), &[2, 3, 4]);
        assert!(r(&[-1, -1], false).is_err());
        assert!(r(&[5, -1], false).is_err());
        assert!(r(&[0, -1], true).is_err());
        assert!(r(&[7, 3], false).is_err());
        // allowzero: a 0 is a real zero extent.
        let e = Tensor::zeros(DType::F32, vec![0, 3]);
        let t = run(&Op::Reshape { allow_zero: true }, &[&e, &i64s(&[3, 0])]).unwrap();
        assert_eq!(t.shape(), &[3, 0]);
        assert!(run(&Op::Reshape { allow_zero: true }, &[&e, &i64s(&[0, -1])]).is_err());
    }

    #[test]
    fn transpose_matches_naive_for_every_permutation() {
        for shape in [[2, 3, 4, 5], [1, 3, 1, 5], [2, 1, 40, 33], [3, 37, 1, 1]] {
            check_transposes(shape);
        }
        let b = Tensor::from_vec(vec![2, 2], vec![true, false, false, false]);
        let t = run(&Op::Transpose { perm: vec![1, 0] }, &[&b]).unwrap();
        assert_eq!(t.as_slice::<bool>().unwrap(), &[true, false, false, false]);
        assert!(run(&Op::Transpose { perm: vec![0, 0] }, &[&b]).is_err());
        let e = Tensor::zeros(DType::F32, vec![0, 3]);
        assert_eq!(
            run(&Op::Transpose { perm: vec![1, 0] }, &[&e]).unwrap().shape(),
            &[3, 0]
        );
    }

    /// Every permutation of a 4-D iota against a naive index computation.
    fn check_transposes(shape: [usize; 4]) {
        let x = iota(&shape);
        let perms = (0..256usize)
            .map(|k| [k & 3, (k >> 2) & 3, (k >> 4) & 3, (k >> 6) & 3])
            .filter(|p| (0..4).all(|i| p.contains(&i)));
        for perm in perms {
            let t = run(&Op::Transpose { perm: perm.to_vec() }, &[&x]).unwrap();
            let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
            assert_eq!(t.shape(), out_shape.as_slice());
            for (f, &v) in vals(&t).iter().enumerate() {
                let o = unravel(f, &out_shape);
                let mut i = [0; 4];
                for (a, &p) in perm.iter().enumerate() {
                    i[p] = o[a];
                }
                assert_eq!(
                    v,
                    crate::ops::util::ravel(&i, &shape) as i64,
                    "{shape:?} {perm:?}"
                );
            }
        }
    }

    #[test]
    fn slice_clamping_and_negative_steps() {
        assert_eq!(slice_range(10, 2, 7, 2).unwrap(), (2, 3));
        assert_eq!(slice_range(10, -1, i64::MIN, -1).unwrap(), (9, 10));
        assert_eq!(slice_range(10, 20, 0, -3).unwrap(), (9, 3));
        assert_eq!(slice_range(10, 0, i64::MAX, 1).unwrap(), (0, 10));
        assert_eq!(slice_range(10, i64::MIN, i64::MAX, i64::MAX).unwrap(), (0, 1));
        assert_eq!(slice_range(10, 5, 5, 1).unwrap().1, 0);
        assert_eq!(slice_range(0, -1, i64::MIN, -1).unwrap().1, 0);
        assert!(slice_range(3, 0, 3, 0).is_err());

        let x = iota(&[3, 4]);
        let t = run(
            &Op::Slice,
            &[
                &x,
                &i64s(&[-1, 3]),
                &i64s(&[i64::MIN, 0]),
                &i64s(&[0, 1]),
                &i64s(&[-2, -2]),
            ],
        );
        let t = t.unwrap();
        assert_eq!(t.shape(), &[2, 2]);
        assert_eq!(vals(&t), vec![11, 9, 3, 1]);
        // Symbolic dims: the full range keeps the dim, anything else is unknown.
        let ty = TensorType::new(DType::F32, vec![sym("n"), sym("m")]);
        let (s, e, a) = (i64s(&[0, 1]), i64s(&[i64::MAX, 2]), i64s(&[0, 1]));
        let types = [ty, s.tensor_type(), e.tensor_type(), a.tensor_type()];
        let t = infer_types(&Op::Slice, &types, &[None, Some(&s), Some(&e), Some(&a)]).unwrap();
        assert_eq!(t.shape, vec![sym("n"), Dim::unknown()]);
        // Duplicate axes are rejected.
        assert!(run(&Op::Slice, &[&x, &i64s(&[0, 0]), &i64s(&[1, 1]), &i64s(&[1, -1])]).is_err());
    }

    #[test]
    fn pad_modes_match_numpy() {
        let x = i64s(&[1, 2, 3]);
        let pad = |mode, pads: &[i64]| vals(&run(&Op::Pad { mode }, &[&x, &i64s(pads)]).unwrap());
        // np.pad([1,2,3], (7,7), 'reflect') and 'wrap'.
        assert_eq!(
            pad(PadMode::Reflect, &[7, 7]),
            vec![2, 3, 2, 1, 2, 3, 2, 1, 2, 3, 2, 1, 2, 3, 2, 1, 2]
        );
        assert_eq!(
            pad(PadMode::Wrap, &[7, 7]),
            vec![3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1]
        );
        assert_eq!(pad(PadMode::Edge, &[2, 1]), vec![1, 1, 1, 2, 3, 3]);
        assert_eq!(pad(PadMode::Constant, &[1, -1]), vec![0, 1, 2]);
        // Negative pads crop first; reflection is then about the cropped extent.
        assert_eq!(pad(PadMode::Reflect, &[-1, 1]), vec![2, 3, 2]);
        let fill = Tensor::scalar(9i64);
        let t = run(
            &Op::Pad {
                mode: PadMode::Constant,
            },
            &[&x, &i64s(&[0, 2]), &fill],
        )
        .unwrap();
        assert_eq!(vals(&t), vec![1, 2, 3, 9, 9]);
        assert!(run(
            &Op::Pad {
                mode: PadMode::Constant
            },
            &[&x, &i64s(&[-2, -2])]
        )
        .is_err());
        // Cropping past the extent is an error even when the other side pads it back.
        assert!(run(
            &Op::Pad {
                mode: PadMode::Constant
            },
            &[&x, &i64s(&[-4, 5])]
        )
        .is_err());
        let e = Tensor::zeros(DType::I64, vec![0]);
        assert!(run(&Op::Pad { mode: PadMode::Edge }, &[&e, &i64s(&[1, 0])]).is_err());
        assert!(run(
            &Op::Pad {
                mode: PadMode::Constant
            },
            &[&x, &i64s(&[i64::MAX, i64::MAX])]
        )
        .is_err());
    }

    #[test]
    fn pad_with_axes() {
        let x = iota(&[2, 2]);
        let t = run(
            &Op::Pad {
                mode: PadMode::Constant,
            },
            &[&x, &i64s(&[1, 0]), &Tensor::scalar(7i64), &i64s(&[-1])],
        );
        assert_eq!(vals(&t.unwrap()), vec![7, 0, 1, 7, 2, 3]);
    }

    #[test]
    fn gather_wraps_negative_and_rejects_out_of_range() {
        let x = iota(&[3, 2]);
        let t = run(
            &Op::Gather { axis: 0 },
            &[&x, &Tensor::from_vec(vec![2], vec![-1i32, 0])],
        )
        .unwrap();
        assert_eq!(vals(&t), vec![4, 5, 0, 1]);
        let t = run(&Op::Gather { axis: 1 }, &[&x, &Tensor::scalar(1i64)]).unwrap();
        assert_eq!((t.shape(), vals(&t)), (&[3usize][..], vec![1, 3, 5]));
        assert!(run(&Op::Gather { axis: 0 }, &[&x, &i64s(&[3])]).is_err());
        assert!(run(&Op::Gather { axis: 0 }, &[&x, &i64s(&[-4])]).is_err());
        let idx = Tensor::from_vec(vec![3, 1], vec![1i32, 0, -1]);
        let t = run(&Op::GatherElements { axis: 1 }, &[&x, &idx]).unwrap();
        assert_eq!(vals(&t), vec![1, 2, 5]);
        assert!(run(
            &Op::GatherElements { axis: 1 },
            &[&x, &i64s(&[2]).reshaped(vec![1, 1]).unwrap()]
        )
        .is_err());
    }

    #[test]
    fn gather_nd_with_batch_dims() {
        // onnx example: data [2,2,2], indices [[1],[0]], batch_dims=1 -> [[2,3],[4,5]].
        let data = iota(&[2, 2, 2]);
        let idx = Tensor::from_vec(vec![2, 1], vec![1i64, 0]);
        let t = run(&Op::GatherND { batch_dims: 1 }, &[&data, &idx]).unwrap();
        assert_eq!((t.shape(), vals(&t)), (&[2usize, 2][..], vec![2, 3, 4, 5]));
        let idx = Tensor::from_vec(vec![2, 2], vec![0i64, 1, -1, 0]);
        let t = run(&Op::GatherND { batch_dims: 0 }, &[&data, &idx]).unwrap();
        assert_eq!(vals(&t), vec![2, 3, 4, 5]);
        let bad = Tensor::from_vec(vec![1, 2], vec![0i64, 2]);
        assert!(run(&Op::GatherND { batch_dims: 0 }, &[&data, &bad]).is_err());
    }

    #[test]
    fn scatter_reductions() {
        let data = f32s(&[4], &[1.0, 2.0, 3.0, 4.0]);
        let idx = Tensor::from_vec(vec![3, 1], vec![1i64, 1, -1]);
        let upd = f32s(&[3], &[10.0, 20.0, 0.5]);
        let nd = |reduction| {
            run(&Op::ScatterND { reduction }, &[&data, &idx, &upd])
                .unwrap()
                .to_f64_vec()
        };
        assert_eq!(nd(ScatterReduction::None), vec![1.0, 20.0, 3.0, 0.5]);
        assert_eq!(nd(ScatterReduction::Add), vec![1.0, 32.0, 3.0, 4.5]);
        assert_eq!(nd(ScatterReduction::Mul), vec![1.0, 400.0, 3.0, 2.0]);
        assert_eq!(nd(ScatterReduction::Max), vec![1.0, 20.0, 3.0, 4.0]);
        assert_eq!(nd(ScatterReduction::Min), vec![1.0, 2.0, 3.0, 0.5]);
        let bad = Tensor::from_vec(vec![1, 1], vec![4i64]);
        let one = f32s(&[1], &[0.0]);
        assert!(run(
            &Op::ScatterND {
                reduction: ScatterReduction::None
            },
            &[&data, &bad, &one]
        )
        .is_err());

        // Integers wrap like numpy.
        let d = Tensor::from_vec(vec![2], vec![250u8, 1]);
        let i = Tensor::from_vec(vec![2], vec![0i32, 0]);
        let u = Tensor::from_vec(vec![2], vec![3u8, 4]);
        let op = Op::ScatterElements {
            axis: 0,
            reduction: ScatterReduction::Add,
        };
        assert_eq!(
            run(&op, &[&d, &i, &u]).unwrap().as_slice::<u8>().unwrap(),
            &[1, 1]
        );
        let bad = Tensor::from_vec(vec![2], vec![0i32, -3]);
        assert!(run(&op, &[&d, &bad, &u]).is_err());
    }

    #[test]
    fn scatter_max_nan_semantics() {
        let nan = f32::NAN;
        assert!(reduce(ScatterReduction::Max, 1.0f32, nan, true).is_nan());
        assert_eq!(reduce(ScatterReduction::Max, 1.0f32, nan, false), 1.0);
        assert!(reduce(ScatterReduction::Min, nan, 1.0f32, false).is_nan());
    }

    #[test]
    fn split_sizes_rules() {
        assert_eq!(split_sizes(5, None, 3, Some(3)).unwrap(), vec![2, 2, 1]);
        assert_eq!(split_sizes(6, None, 3, None).unwrap(), vec![2, 2, 2]);
        assert!(split_sizes(5, None, 3, None).is_err());
        assert!(split_sizes(5, None, 4, Some(4)).is_err());
        assert_eq!(split_sizes(5, Some(&[0, 5]), 2, None).unwrap(), vec![0, 5]);
        assert!(split_sizes(5, Some(&[1, 5]), 2, None).is_err());
        assert!(split_sizes(5, Some(&[-1, 6]), 2, None).is_err());
        let x = iota(&[2, 5]);
        let outs = run_n(
            &Op::Split {
                axis: -1,
                num_outputs: None,
            },
            &[Some(&x), Some(&i64s(&[2, 3]))],
            2,
        )
        .unwrap();
        assert_eq!(vals(&outs[0]), vec![0, 1, 5, 6]);
        assert_eq!(vals(&outs[1]), vec![2, 3, 4, 7, 8, 9]);
    }

    #[test]
    fn expand_and_tile() {
        let x = TensorType::new(DType::F32, vec![sym("b"), 1.into()]);
        let s = i64s(&[1, 5]);
        let t = infer_types(&Op::Expand, &[x, s.tensor_type()], &[None, Some(&s)]).unwrap();
        assert_eq!(t.shape, vec![sym("b"), 5.into()]);
        let x = i64s(&[1, 2]).reshaped(vec![2, 1]).unwrap();
        let t = run(&Op::Expand, &[&x, &i64s(&[2, 1, 3])]).unwrap();
        assert_eq!(
            (t.shape(), vals(&t)),
            (&[2usize, 2, 3][..], vec![1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2])
        );
        assert!(run(&Op::Expand, &[&x, &i64s(&[3, 1])]).is_err());
        let t = run(&Op::Tile, &[&x, &i64s(&[2, 2])]).unwrap();
        assert_eq!(vals(&t), vec![1, 1, 2, 2, 1, 1, 2, 2]);
        assert!(run(&Op::Tile, &[&x, &i64s(&[1 << 40, 1 << 40])]).is_err());
    }

    #[test]
    fn squeeze_and_unsqueeze() {
        let x = iota(&[1, 3, 1]);
        assert_eq!(run(&Op::Squeeze, &[&x]).unwrap().shape(), &[3]);
        assert_eq!(run(&Op::Squeeze, &[&x, &i64s(&[-1])]).unwrap().shape(), &[1, 3]);
        assert!(run(&Op::Squeeze, &[&x, &i64s(&[1])]).is_err());
        let t = run(&Op::Unsqueeze, &[&x, &i64s(&[4, 0])]).unwrap();
        assert_eq!(t.shape(), &[1, 1, 3, 1, 1]);
        assert!(run(&Op::Unsqueeze, &[&x, &i64s(&[0, -5])]).is_err());
        let sx = TensorType::new(DType::F32, vec![sym("b"), 3.into()]);
        assert!(infer_types(&Op::Squeeze, &[sx], &[]).is_err());
    }

    #[test]
    fn range_lengths() {
        let r = |s: i64, l: i64, d: i64| {
            vals(
                &run(
                    &Op::Range,
                    &[&Tensor::scalar(s), &Tensor::scalar(l), &Tensor::scalar(d)],
                )
                .unwrap(),
            )
        };
        assert_eq!(r(10, 4, -2), vec![10, 8, 6]);
        assert_eq!(r(3, 9, 3), vec![3, 6]);
        assert_eq!(r(3, 3, 1), Vec::<i64>::new());
        assert_eq!(r(5, 0, 1), Vec::<i64>::new());
        assert_eq!(r(i64::MIN, i64::MAX, i64::MAX).len(), 3);
        let f = run(
            &Op::Range,
            &[
                &Tensor::scalar(1f32),
                &Tensor::scalar(2f32),
                &Tensor::scalar(0.3f32),
            ],
        )
        .unwrap();
        assert_eq!(f.len(), 4);
        assert!(run(
            &Op::Range,
            &[
                &Tensor::scalar(0i32),
                &Tensor::scalar(5i32),
                &Tensor::scalar(0i32)
            ]
        )
        .is_err());
        let inf = Tensor::scalar(f32::INFINITY);
        assert!(run(&Op::Range, &[&Tensor::scalar(0f32), &inf, &Tensor::scalar(1f32)]).is_err());
        assert!(run(
            &Op::Range,
            &[
                &Tensor::scalar(0i64),
                &Tensor::scalar(i64::MAX),
                &Tensor::scalar(1i64)
            ]
        )
        .is_err());
    }

    #[test]
    fn one_hot_wraps_and_ignores_out_of_range() {
        let idx = Tensor::from_vec(vec![4], vec![0i64, -1, 3, 7]);
        let depth = Tensor::scalar(3.0f32);
        let values = f32s(&[2], &[-1.0, 5.0]);
        let t = run(&Op::OneHot { axis: -1 }, &[&idx, &depth, &values]).unwrap();
        assert_eq!(t.shape(), &[4, 3]);
        let v: Vec<f64> = t.to_f64_vec();
        assert_eq!(
            v,
            vec![5.0, -1.0, -1.0, -1.0, -1.0, 5.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0]
        );
        let t = run(&Op::OneHot { axis: 0 }, &[&idx, &depth, &values]).unwrap();
        assert_eq!(t.shape(), &[3, 4]);
        assert_eq!(t.to_f64_vec()[..4], [5.0, -1.0, -1.0, -1.0]);
        assert!(run(&Op::OneHot { axis: 2 }, &[&idx, &depth, &values]).is_err());
    }

    #[test]
    fn trilu_nonzero_eyelike() {
        let x = iota(&[2, 3]);
        let k = Tensor::scalar(1i64);
        assert_eq!(
            vals(&run(&Op::Trilu { upper: true }, &[&x, &k]).unwrap()),
            vec![0, 1, 2, 0, 0, 5]
        );
        assert_eq!(
            vals(&run(&Op::Trilu { upper: false }, &[&x]).unwrap()),
            vec![0, 0, 0, 3, 4, 0]
        );
        let nz = run_n(&Op::NonZero, &[Some(&x)], 1).unwrap().remove(0);
        assert_eq!(
            (nz.shape(), vals(&nz)),
            (&[2usize, 5][..], vec![0, 0, 1, 1, 1, 1, 2, 0, 1, 2])
        );
        let e = run(
            &Op::EyeLike {
                dtype: Some(DType::Bool),
                k: -1,
            },
            &[&x],
        )
        .unwrap();
        assert_eq!(
            e.as_slice::<bool>().unwrap(),
            &[false, false, false, true, false, false]
        );
    }

    #[test]
    fn concat_and_shape_ops() {
        let a = iota(&[2, 1]);
        let b = iota(&[2, 2]);
        let t = run(&Op::Concat { axis: 1 }, &[&a, &b]).unwrap();
        assert_eq!(vals(&t), vec![0, 0, 1, 1, 2, 3]);
        assert!(run(&Op::Concat { axis: 0 }, &[&a, &b]).is_err());
        assert!(run(&Op::Concat { axis: 0 }, &[&a, &b.cast(DType::F32)]).is_err());
        let sa = TensorType::new(DType::I64, vec![sym("n"), 1.into()]);
        let sb = TensorType::new(DType::I64, vec![5.into(), 2.into()]);
        let t = infer_types(&Op::Concat { axis: 1 }, &[sa, sb], &[]).unwrap();
        assert_eq!(t.shape, vec![5.into(), 3.into()]);
        let s = run(&Op::Shape { start: -1, end: None }, &[&b]).unwrap();
        assert_eq!(vals(&s), vec![2]);
        let c = run(
            &Op::ConstantOfShape {
                value: Tensor::scalar(true),
            },
            &[&i64s(&[2, 0])],
        )
        .unwrap();
        assert_eq!(c.shape(), &[2, 0]);
        assert!(run(
            &Op::ConstantOfShape {
                value: Tensor::scalar(1f32)
            },
            &[&i64s(&[1 << 40, 1 << 40])]
        )
        .is_err());
        let f = run(&Op::Flatten { axis: -1 }, &[&iota(&[2, 3, 4])]).unwrap();
        assert_eq!(f.shape(), &[6, 4]);
    }

    #[test]
    fn half_types_move_exactly() {
        let x = Tensor::from_vec(
            vec![2, 2],
            [1.5f32, -2.25, 3.0, 256.0].map(f16::from_f32).to_vec(),
        );
        let t = run(&Op::Transpose { perm: vec![1, 0] }, &[&x]).unwrap();
        assert_eq!(t.to_f64_vec(), vec![1.5, 3.0, -2.25, 256.0]);
        let b = x.cast(DType::BF16);
        let t = run(&Op::Slice, &[&b, &i64s(&[1]), &i64s(&[2])]).unwrap();
        assert_eq!((t.dtype(), t.to_f64_vec()), (DType::BF16, vec![3.0, 256.0]));
    }

    #[test]
    fn symbolic_dims_flow_through_a_graph() {
        use crate::{eval::eval_graph, verify, Graph};
        let mut g = Graph::new("t");
        let xt = TensorType::new(DType::F32, vec![sym("batch"), sym("seq"), 24.into()]);
        let x = g.add_input("x", xt);
        let c = |g: &mut Graph, name: &str, v: &[i64]| g.add_const(name, i64s(v));
        let spec = c(&mut g, "spec", &[0, 0, 2, -1]);
        let r = g.add(
            "r",
            Op::Reshape { allow_zero: false },
            vec![Some(x), Some(spec)],
            "r",
        );
        let r = r.unwrap();
        assert_eq!(
            g.value_type(r).shape,
            vec![sym("batch"), sym("seq"), 2.into(), 12.into()]
        );
        let t = g
            .add(
                "t",
                Op::Transpose {
                    perm: vec![0, 2, 1, 3],
                },
                vec![Some(r)],
                "t",
            )
            .unwrap();
        assert_eq!(
            g.value_type(t).shape,
            vec![sym("batch"), 2.into(), sym("seq"), 12.into()]
        );
        let (s0, e0, a0) = (
            c(&mut g, "s0", &[0, 4]),
            c(&mut g, "e0", &[i64::MAX, 8]),
            c(&mut g, "a0", &[2, 3]),
        );
        let sl = g
            .add("sl", Op::Slice, vec![Some(t), Some(s0), Some(e0), Some(a0)], "sl")
            .unwrap();
        assert_eq!(
            g.value_type(sl).shape,
            vec![sym("batch"), 2.into(), sym("seq"), 4.into()]
        );
        let sh = g
            .add("sh", Op::Shape { start: 0, end: None }, vec![Some(sl)], "sh")
            .unwrap();
        let ax = c(&mut g, "ax", &[0]);
        let cs = g.add(
            "cs",
            Op::ConstantOfShape {
                value: Tensor::scalar(1f32),
            },
            vec![Some(sh)],
            "cs",
        );
        assert_eq!(g.value_type(cs.unwrap()).rank(), 4);
        let u = g.add("u", Op::Unsqueeze, vec![Some(sl), Some(ax)], "u").unwrap();
        assert_eq!(g.value_type(u).shape[0], Dim::Fixed(1));
        let f = g.add("f", Op::Flatten { axis: 2 }, vec![Some(sl)], "f").unwrap();
        assert_eq!(g.value_type(f).shape, vec![Dim::unknown(), Dim::unknown()]);
        let sz = g.add("sz", Op::Size, vec![Some(f)], "sz").unwrap();
        g.add_output("sl", sl);
        g.add_output("sz", sz);
        verify(&g).unwrap();
        let out = eval_graph(&g, vec![iota(&[3, 5, 24]).cast(DType::F32)]).unwrap();
        assert_eq!(out[0].shape(), &[3, 2, 5, 4]);
        // x[0, 0, 12 + 4] lands at sl[0, 1, 0, 0].
        assert_eq!(out[0].to_f64_vec()[20], 16.0);
        assert_eq!(vals(&out[1]), vec![120]);
    }
}
