//! Operators that build tensors from shapes and scalars: Range, ConstantOfShape, OneHot and
//! EyeLike. (`Shape` and `Size` are one-liners dispatched in `mod.rs`.)

use super::expand_tile::non_negative;
use super::{expect_dtype, expect_scalar_like, int_scalar, int_values, make, numel, vec_len, Res};
use crate::ops::util::{check_alloc, dims, known_i64s, norm_axis_inclusive};
use crate::ops::{EvalCtx, InferCtx};
use crate::{bail, DType, Dim, Element, OpError, Tensor, TensorData, TensorType};

pub(super) fn infer_range(cx: &InferCtx) -> Res<TensorType> {
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
pub(super) fn eval_range(cx: &EvalCtx) -> Res<Tensor> {
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

pub(super) fn infer_constant_of_shape(cx: &InferCtx, value: &Tensor) -> Res<TensorType> {
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

pub(super) fn eval_constant_of_shape(cx: &EvalCtx, value: &Tensor) -> Res<Tensor> {
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

pub(super) fn infer_one_hot(cx: &InferCtx, axis: i64) -> Res<TensorType> {
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

pub(super) fn eval_one_hot(cx: &EvalCtx, axis: i64) -> Res<Tensor> {
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

pub(super) fn infer_eye_like(cx: &InferCtx, dtype: Option<DType>) -> Res<TensorType> {
    let x = cx.ty(0)?;
    if x.rank() != 2 {
        bail!("EyeLike needs a 2-D input, got {x}");
    }
    Ok(TensorType::new(dtype.unwrap_or(x.dtype), x.shape.clone()))
}

pub(super) fn eval_eye_like(cx: &EvalCtx, dtype: Option<DType>, k: i64) -> Res<Tensor> {
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
