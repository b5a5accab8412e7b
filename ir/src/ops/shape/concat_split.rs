//! Concat and Split: joining inputs along an axis and cutting one input into pieces.

use super::expand_tile::non_negative;
use super::{concrete, expect_dtype, fixed_dims, int_values, make, numel, typed, vec_len, Res};
use crate::ops::util::{check_alloc, dims, fmt_dims, known_i64s, norm_axis};
use crate::ops::{EvalCtx, InferCtx};
use crate::{bail, DType, Dim, Element, OpError, Tensor, TensorData, TensorType};

/// Merges two dims that must be equal: a fixed extent wins over a symbol.
pub(super) fn merge_dim(a: &Dim, b: &Dim) -> Res<Dim> {
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

pub(super) fn infer_concat(cx: &InferCtx, axis: i64) -> Res<TensorType> {
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

pub(super) fn eval_concat(cx: &EvalCtx, axis: i64) -> Res<Tensor> {
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
pub(super) fn split_sizes(
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

pub(super) fn infer_split(cx: &InferCtx, axis: i64, num_outputs: Option<usize>) -> Res<Vec<TensorType>> {
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

pub(super) fn eval_split(cx: &EvalCtx, axis: i64, num_outputs: Option<usize>) -> Res<Vec<Tensor>> {
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
