//! Reshape, Flatten, Squeeze and Unsqueeze: the same data under a new shape. `Reshape`'s
//! rules cancel symbolic dims that appear on both sides, so dynamic batch dims survive.

use super::{concrete, dim_product, expect_dtype, int_values, norm_axes, reshaped, vec_len, Res};
use crate::ops::util::{dims, fmt_dims, known_i64s};
use crate::ops::{EvalCtx, InferCtx};
use crate::{bail, DType, Dim, OpError, Tensor, TensorType};

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

pub(super) fn infer_reshape(cx: &InferCtx, allow_zero: bool) -> Res<TensorType> {
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

pub(super) fn eval_reshape(cx: &EvalCtx, allow_zero: bool) -> Res<Tensor> {
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

pub(super) fn infer_flatten(cx: &InferCtx, axis: i64) -> Res<TensorType> {
    let x = cx.ty(0)?;
    Ok(TensorType::new(x.dtype, flatten_dims(&x.shape, axis)?))
}

pub(super) fn eval_flatten(cx: &EvalCtx, axis: i64) -> Res<Tensor> {
    let x = cx.input(0)?;
    reshaped(x, concrete(flatten_dims(&dims(x.shape()), axis)?)?)
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

pub(super) fn infer_squeeze(cx: &InferCtx) -> Res<TensorType> {
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

pub(super) fn eval_squeeze(cx: &EvalCtx) -> Res<Tensor> {
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

pub(super) fn infer_unsqueeze(cx: &InferCtx) -> Res<TensorType> {
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

pub(super) fn eval_unsqueeze(cx: &EvalCtx) -> Res<Tensor> {
    let x = cx.input(0)?;
    let axes = int_values(cx.input(1)?, "axes")?;
    reshaped(x, concrete(unsqueeze_dims(&dims(x.shape()), &axes)?)?)
}
