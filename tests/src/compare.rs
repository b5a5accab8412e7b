//! Comparing computed tensors with expected ones.
//!
//! Tolerances depend on the dtype only (never on the test): integers and bools must match
//! exactly; floats must satisfy `|actual - expected| <= atol + rtol * |expected|` elementwise,
//! with NaN matching NaN and infinities matching exactly.

use kiln_ir::{DType, Tensor};

/// `(rtol, atol)` for a float dtype.
pub fn tolerance(d: DType) -> (f64, f64) {
    match d {
        DType::F64 => (1e-7, 1e-10),
        DType::F32 => (1e-4, 1e-5),
        DType::F16 => (2e-3, 1e-3),
        DType::BF16 => (1.6e-2, 1e-2),
        _ => (0.0, 0.0),
    }
}

/// Checks `actual` against `expected`; the error says where and by how much they differ.
pub fn compare(expected: &Tensor, actual: &Tensor) -> Result<(), String> {
    if expected.dtype() != actual.dtype() {
        return Err(format!(
            "dtype {} expected, got {}",
            expected.dtype(),
            actual.dtype()
        ));
    }
    if expected.shape() != actual.shape() {
        return Err(format!(
            "shape {:?} expected, got {:?}",
            expected.shape(),
            actual.shape()
        ));
    }
    let d = expected.dtype();
    if !d.is_float() {
        if expected.data() != actual.data() {
            let e = expected.to_f64_vec();
            let a = actual.to_f64_vec();
            let i = e.iter().zip(&a).position(|(x, y)| x != y).unwrap_or(0);
            return Err(format!(
                "element {i}: expected {}, got {} (exact match required)",
                e[i], a[i]
            ));
        }
        return Ok(());
    }
    let (rtol, atol) = tolerance(d);
    let e = expected.to_f64_vec();
    let a = actual.to_f64_vec();
    let mut worst: Option<(usize, f64)> = None;
    for (i, (&x, &y)) in e.iter().zip(&a).enumerate() {
        let ok = if x.is_nan() || y.is_nan() {
            x.is_nan() && y.is_nan()
        } else if x.is_infinite() || y.is_infinite() {
            x == y
        } else {
            (x - y).abs() <= atol + rtol * x.abs()
        };
        if !ok {
            let excess = if x.is_finite() && y.is_finite() {
                (x - y).abs() / (atol + rtol * x.abs())
            } else {
                f64::INFINITY
            };
            if worst.is_none_or(|(_, w)| excess > w) {
                worst = Some((i, excess));
            }
        }
    }
    match worst {
        None => Ok(()),
        Some((i, _)) => {
            let bad = e
                .iter()
                .zip(&a)
                .filter(|(x, y)| !close(**x, **y, rtol, atol))
                .count();
            Err(format!(
                "{bad} of {} elements differ; worst at {i}: expected {}, got {} (rtol {rtol}, atol {atol})",
                e.len(),
                e[i],
                a[i]
            ))
        }
    }
}

fn close(x: f64, y: f64, rtol: f64, atol: f64) -> bool {
    if x.is_nan() || y.is_nan() {
        x.is_nan() && y.is_nan()
    } else if x.is_infinite() || y.is_infinite() {
        x == y
    } else {
        (x - y).abs() <= atol + rtol * x.abs()
    }
}
