//! Comparing a computed tensor with its reference: the metrics `kiln verify` reports and the
//! tolerance test that decides pass/fail.

use kiln_ir::{DType, Tensor};
use serde::Serialize;

/// When a float value is within tolerance: cosine similarity with the reference at least
/// `min_cosine` (checked only when the reference is not within `atol` of zero everywhere: a
/// near-zero vector has no meaningful direction), and every element within
/// `atol + rtol * |ref| + range_tol * max|ref|`.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct Tolerance {
    pub min_cosine: f64,
    pub atol: f64,
    pub rtol: f64,
    pub range_tol: f64,
}

impl Tolerance {
    /// f32: tight. The compiled kernels reorder sums and use vectorized exp/tanh/erf, so a few
    /// ulps per element and a little cancellation are expected, no more. `range_tol` covers
    /// the cancellation: reordering a sum of `K` terms moves it by about `sqrt(K)` ulps of the
    /// terms' size, not of the result's, so an element near zero in a value whose others reach
    /// hundreds (deep ResNet-50 convolutions, K = 4608: 2.5e-6 of the range) is off by more
    /// than `atol`. 1e-5 of the range is about 80 ulps of the value's largest element; a wrong
    /// kernel (a lost or misplaced term) misses by orders of magnitude more.
    pub const F32: Tolerance = Tolerance {
        min_cosine: 0.9999,
        atol: 1e-4,
        rtol: 1e-3,
        range_tol: 1e-5,
    };
    /// bf16 autocast: matmul/conv operands rounded to 8 mantissa bits. As the bf16 fixture
    /// suite: cosine ≥ 0.999 and every error within 2% of the reference's range.
    pub const BF16: Tolerance = Tolerance {
        min_cosine: 0.999,
        atol: 0.0,
        rtol: 0.0,
        range_tol: 0.02,
    };
}

/// The worst element: the one furthest beyond its bound (or, when all are within, the one
/// with the largest absolute error).
#[derive(Clone, Debug, Serialize)]
pub struct Worst {
    pub index: usize,
    pub actual: f64,
    pub expected: f64,
}

/// How one computed value compares with its reference.
#[derive(Clone, Debug, Serialize)]
pub struct Metrics {
    pub cosine: f64,
    pub max_abs_err: f64,
    /// `max|actual - ref| / max|ref|` (the error relative to the reference's range; an
    /// elementwise relative error explodes where the reference crosses zero).
    pub max_rel_err: f64,
    /// Elements outside the bound.
    pub mismatches: usize,
    pub passed: bool,
    pub worst: Option<Worst>,
    /// Why the value fails when it is not a numeric difference (shape, dtype).
    pub problem: Option<String>,
}

impl Metrics {
    fn failed(problem: String) -> Metrics {
        Metrics {
            cosine: 0.0,
            max_abs_err: f64::INFINITY,
            max_rel_err: f64::INFINITY,
            mismatches: 0,
            passed: false,
            worst: None,
            problem: Some(problem),
        }
    }
}

fn both_nan_or_equal(a: f64, e: f64) -> Option<bool> {
    if a.is_nan() || e.is_nan() {
        Some(a.is_nan() && e.is_nan())
    } else if a.is_infinite() || e.is_infinite() {
        Some(a == e)
    } else {
        None
    }
}

/// Compares `actual` with `expected`. Integer and boolean values must match exactly; floats
/// use `tol`.
pub fn compare(actual: &Tensor, expected: &Tensor, tol: &Tolerance) -> Metrics {
    if actual.shape() != expected.shape() {
        return Metrics::failed(format!(
            "shape {:?}, expected {:?}",
            actual.shape(),
            expected.shape()
        ));
    }
    let exact = !expected.dtype().is_float();
    // Float values of one dtype may come back as another (bf16 is written as f32 .npy).
    if exact && actual.dtype() != expected.dtype() {
        return Metrics::failed(format!("dtype {}, expected {}", actual.dtype(), expected.dtype()));
    }
    compare_values(&actual.to_f64_vec(), &expected.to_f64_vec(), exact, tol)
}

/// [`compare`] on flat values of the same length.
pub fn compare_values(a: &[f64], e: &[f64], exact: bool, tol: &Tolerance) -> Metrics {
    let tol = if exact {
        Tolerance {
            min_cosine: -1.0,
            atol: 0.0,
            rtol: 0.0,
            range_tol: 0.0,
        }
    } else {
        *tol
    };
    let range = e
        .iter()
        .filter(|x| x.is_finite())
        .fold(0f64, |m, x| m.max(x.abs()));
    let (mut dot, mut na, mut ne) = (0f64, 0f64, 0f64);
    let mut max_abs = 0f64;
    let mut mismatches = 0;
    let mut worst: Option<(usize, f64)> = None; // index, excess over the bound
    for (i, (&x, &y)) in a.iter().zip(e).enumerate() {
        let bound = tol.atol + tol.rtol * y.abs() + tol.range_tol * range;
        let (ok, excess) = match both_nan_or_equal(x, y) {
            Some(ok) => (ok, if ok { 0.0 } else { f64::INFINITY }),
            None => {
                dot += x * y;
                na += x * x;
                ne += y * y;
                let d = (x - y).abs();
                max_abs = max_abs.max(d);
                (d <= bound, d - bound)
            }
        };
        if !ok {
            mismatches += 1;
            if !(x.is_finite() && y.is_finite()) {
                max_abs = f64::INFINITY;
            }
        }
        if worst.is_none_or(|(_, w)| excess > w) {
            worst = Some((i, excess));
        }
    }
    let cosine = match (na == 0.0, ne == 0.0) {
        (true, true) => 1.0,
        (true, false) | (false, true) => 0.0,
        _ => dot / (na.sqrt() * ne.sqrt()),
    };
    let max_rel = if range > 0.0 { max_abs / range } else { max_abs };
    let direction_matters = range > tol.atol;
    let passed = mismatches == 0 && (!direction_matters || cosine >= tol.min_cosine);
    Metrics {
        cosine,
        max_abs_err: max_abs,
        max_rel_err: max_rel,
        mismatches,
        passed,
        worst: worst.map(|(index, _)| Worst {
            index,
            actual: a[index],
            expected: e[index],
        }),
        problem: None,
    }
}

/// The tolerance for a value of dtype `d` computed at `precision` (bf16 values get the bf16
/// tolerance whatever the precision).
pub fn tolerance_for(d: DType, base: &Tolerance) -> Tolerance {
    if d == DType::BF16 || d == DType::F16 {
        Tolerance::BF16
    } else {
        *base
    }
}

/// Transposes a rank-4 NCHW tensor's values to NHWC (the layout channels-last gives a value).
pub fn nchw_to_nhwc(t: &Tensor) -> Option<(Vec<usize>, Vec<f64>)> {
    let &[n, c, h, w] = t.shape() else { return None };
    let v = t.to_f64_vec();
    let mut out = Vec::with_capacity(v.len());
    for ni in 0..n {
        for hi in 0..h {
            for wi in 0..w {
                for ci in 0..c {
                    out.push(v[((ni * c + ci) * h + hi) * w + wi]);
                }
            }
        }
    }
    Some((vec![n, h, w, c], out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_values_pass() {
        let m = compare_values(&[1.0, -2.0, 3.0], &[1.0, -2.0, 3.0], false, &Tolerance::F32);
        assert!(m.passed && m.max_abs_err == 0.0 && (m.cosine - 1.0).abs() < 1e-12);
    }

    #[test]
    fn a_scaled_value_fails_on_error_not_direction() {
        let e = [1.0, -2.0, 3.0];
        let a: Vec<f64> = e.iter().map(|x| x * 1.25).collect();
        let m = compare_values(&a, &e, false, &Tolerance::F32);
        assert!(!m.passed);
        assert!((m.cosine - 1.0).abs() < 1e-12, "scaling keeps the direction");
        assert!((m.max_abs_err - 0.75).abs() < 1e-12);
        assert!((m.max_rel_err - 0.25).abs() < 1e-12);
        assert_eq!(m.worst.unwrap().index, 2);
    }

    #[test]
    fn bf16_tolerance_is_relative_to_the_range() {
        let e = [100.0, 0.0, -50.0];
        let ok = compare_values(&[101.0, 1.9, -50.0], &e, false, &Tolerance::BF16);
        assert!(ok.passed, "{ok:?}");
        let bad = compare_values(&[100.0, 2.1, -50.0], &e, false, &Tolerance::BF16);
        assert!(!bad.passed);
    }

    #[test]
    fn integers_must_match_exactly_and_nan_matches_nan() {
        assert!(!compare_values(&[1.0, 2.0], &[1.0, 3.0], true, &Tolerance::F32).passed);
        assert!(compare_values(&[f64::NAN, 1.0], &[f64::NAN, 1.0], false, &Tolerance::F32).passed);
        assert!(!compare_values(&[f64::NAN, 1.0], &[0.0, 1.0], false, &Tolerance::F32).passed);
    }

    #[test]
    fn near_zero_references_are_judged_elementwise() {
        let m = compare_values(&[1e-6, -1e-6], &[0.0, 0.0], false, &Tolerance::F32);
        assert!(m.passed && m.cosine == 0.0, "{m:?}");
    }

    #[test]
    fn f32_allows_summation_order_near_zero_in_a_wide_value_but_not_a_wrong_term() {
        // A deep convolution's output: values up to 226, one element near zero off by the
        // reordering of a long sum (as ResNet-50's layer4: 5.6e-4), and the same element off
        // by one lost term of size ~1.
        let e = [226.0, -0.004, 13.5];
        let reordered = compare_values(&[226.0, -0.004 + 5.6e-4, 13.5], &e, false, &Tolerance::F32);
        assert!(reordered.passed, "{reordered:?}");
        let lost_term = compare_values(&[226.0, -0.004 + 0.9, 13.5], &e, false, &Tolerance::F32);
        assert!(!lost_term.passed, "{lost_term:?}");
    }

    #[test]
    fn transposes_to_channels_last() {
        let t = Tensor::from_vec(vec![1, 2, 1, 2], vec![1f32, 2.0, 3.0, 4.0]);
        let (shape, v) = nchw_to_nhwc(&t).unwrap();
        assert_eq!(shape, vec![1, 1, 2, 2]);
        assert_eq!(v, vec![1.0, 3.0, 2.0, 4.0]);
    }
}
