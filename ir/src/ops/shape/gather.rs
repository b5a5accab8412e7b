//! Gather, GatherElements and GatherND: reads at runtime indices (negative indices wrap,
//! out-of-range ones are errors).

use super::concat_split::merge_dim;
use super::{concrete, expect_index_dtype, for_each_index, make, norm_index, numel, Res};
use crate::ops::util::{check_alloc, dims, fmt_dims, norm_axis, strides};
use crate::ops::{EvalCtx, InferCtx};
use crate::{bail, Dim, Element, OpError, Tensor, TensorData, TensorType};

pub(super) fn infer_gather(cx: &InferCtx, axis: i64) -> Res<TensorType> {
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

pub(super) fn eval_gather(cx: &EvalCtx, axis: i64) -> Res<Tensor> {
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
pub(super) fn check_elements_shapes(data: &[Dim], idx: &[Dim], a: usize) -> Res<()> {
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

pub(super) fn infer_gather_elements(cx: &InferCtx, axis: i64) -> Res<TensorType> {
    let data = cx.ty(0)?;
    let idx = cx.ty(1)?;
    expect_index_dtype(idx.dtype, "indices")?;
    let a = norm_axis(axis, data.rank())?;
    check_elements_shapes(&data.shape, &idx.shape, a)?;
    Ok(TensorType::new(data.dtype, idx.shape.clone()))
}

/// For each element of `indices` (row-major), the flat offset into `data` it addresses along
/// axis `a` (GatherElements/ScatterElements).
pub(super) fn element_offsets(data_shape: &[usize], idx: &Tensor, a: usize, what: &str) -> Res<Vec<usize>> {
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

pub(super) fn eval_gather_elements(cx: &EvalCtx, axis: i64) -> Res<Tensor> {
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
pub(super) fn nd_index_len(idx: &TensorType, data_rank: usize, batch_dims: usize) -> Res<usize> {
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

pub(super) fn infer_gather_nd(cx: &InferCtx, batch_dims: usize) -> Res<TensorType> {
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
pub(super) fn nd_offsets(data_shape: &[usize], idx: &Tensor, b: usize, what: &str) -> Res<Vec<usize>> {
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

pub(super) fn eval_gather_nd(cx: &EvalCtx, b: usize) -> Res<Tensor> {
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
