//! Expand and Tile: broadcasting and repeating copies.

use super::{concrete, expect_dtype, gather_axes, int_values, make, strided_copy, vec_len, Res};
use crate::ops::util::{broadcast_dims, broadcast_shapes, check_alloc, dims, fmt_dims, known_i64s, strides};
use crate::ops::{EvalCtx, InferCtx};
use crate::{bail, DType, Dim, Element, OpError, Tensor, TensorData, TensorType};

pub(super) fn non_negative(v: &[i64], what: &str) -> Res<Vec<usize>> {
    v.iter()
        .map(|&x| usize::try_from(x).map_err(|_| OpError::new(format!("{what} {v:?} has a negative entry"))))
        .collect()
}

pub(super) fn infer_expand(cx: &InferCtx) -> Res<TensorType> {
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

pub(super) fn eval_expand(cx: &EvalCtx) -> Res<Tensor> {
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

pub(super) fn infer_tile(cx: &InferCtx) -> Res<TensorType> {
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

pub(super) fn eval_tile(cx: &EvalCtx) -> Res<Tensor> {
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
