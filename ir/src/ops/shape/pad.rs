//! Pad: constant, reflect, edge and wrap padding, negative pads (cropping) included. The per-axis
//! index map [`pad_axis_map`] is the reference semantics codegen also uses.

use super::{
    concrete, expect_dtype, expect_index_dtype, expect_same_dtype, expect_scalar_like, gather_axes,
    int_values, make, norm_axes, typed, vec_len, Res,
};
use crate::ops::util::{check_alloc, known_i64s};
use crate::ops::{EvalCtx, InferCtx};
use crate::{bail, DType, Dim, Element, OpError, PadMode, Tensor, TensorData, TensorType};

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

pub(super) fn infer_pad(cx: &InferCtx) -> Res<TensorType> {
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
/// Reflect mirrors without repeating the edge, edge clamps, wrap repeats periodically.
pub fn pad_axis_map(d: usize, (b, e): (i64, i64), out: usize, mode: PadMode) -> Res<Vec<Option<usize>>> {
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

pub(super) fn eval_pad(cx: &EvalCtx, mode: PadMode) -> Res<Tensor> {
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
