//! Trilu (triangular masking) and NonZero (coordinates of the non-zero elements).

use super::{expect_dtype, expect_scalar_like, int_scalar, make, Res};
use crate::ops::util::strides;
use crate::ops::{EvalCtx, InferCtx};
use crate::{bail, DType, Element, Tensor, TensorData, TensorType};

pub(super) fn infer_trilu(cx: &InferCtx) -> Res<TensorType> {
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

pub(super) fn eval_trilu(cx: &EvalCtx, upper: bool) -> Res<Tensor> {
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
pub(super) fn eval_nonzero(x: &Tensor) -> Res<Tensor> {
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
