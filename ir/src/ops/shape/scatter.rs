//! ScatterND and ScatterElements: writes at runtime indices, with the `none`/`add`/`mul`/`max`/
//! `min` reductions and their NaN semantics.

use super::concat_split::merge_dim;
use super::gather::{check_elements_shapes, element_offsets, nd_index_len, nd_offsets};
use super::{expect_index_dtype, expect_same_dtype, make, numel, typed, Res};
use crate::ops::util::{dims, fmt_dims, norm_axis};
use crate::ops::{EvalCtx, InferCtx};
use crate::{bail, Dim, Element, ScatterReduction, Tensor, TensorData, TensorType};
use half::{bf16, f16};

/// Element arithmetic for scatter reductions: integers wrap (as numpy does), f16/bf16 compute
/// in f32 and round each step, bool uses or/and.
pub(super) trait ScatterElem: Element {
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
pub(super) fn reduce<T: ScatterElem>(r: ScatterReduction, x: T, y: T, nan_propagating: bool) -> T {
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

pub(super) fn infer_scatter_nd(cx: &InferCtx) -> Res<TensorType> {
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

pub(super) fn eval_scatter_nd(cx: &EvalCtx, r: ScatterReduction) -> Res<Tensor> {
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

pub(super) fn infer_scatter_elements(cx: &InferCtx, axis: i64) -> Res<TensorType> {
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

pub(super) fn eval_scatter_elements(cx: &EvalCtx, axis: i64, r: ScatterReduction) -> Res<Tensor> {
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
