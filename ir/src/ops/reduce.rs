//! Reductions (`Reduce*`), `ArgMax`/`ArgMin`, `TopK` and `CumSum`.
//!
//! Conventions (those of the ONNX reference implementation unless noted):
//! - Float reductions and running sums accumulate in f64 and round once (the reference sums
//!   f16/bf16 in the element type, onnxruntime in f32; f64 is the most accurate of the three).
//! - Integer `Sum`/`Prod`/`L1`/`SumSquare` wrap in the element type; `Mean` divides the
//!   (wrapped) sum and truncates; `L2`/`LogSum`/`LogSumExp` are computed in f64 and cast.
//! - An empty reduction gives the identity: 0 for sums, 1 for `Prod`, -inf (floats) or the
//!   type's minimum for `Max` (and the opposite for `Min`), -inf for `LogSum`/`LogSumExp`,
//!   NaN for a float `Mean`.
//! - With `noop_with_empty_axes` and no axes, each element is reduced on its own: the
//!   aggregate is then a per-element function (`L2` gives `|x|`, `SumSquare` gives `x²`),
//!   which is identity for `Sum`/`Mean`/`Max`/`Min`/`Prod`. This is what the reference and
//!   the ONNX function definitions of these operators compute.
//! - NaN wins: `ReduceMax`/`ReduceMin` propagate it, `ArgMax`/`ArgMin` pick it, and `TopK`
//!   orders it above every number.

use super::elementwise::{row_len, with_int_data, Int, RowReader};
use super::util::{check_alloc, known_i64s, norm_axis};
use super::{EvalCtx, InferCtx};
use crate::{DType, Dim, Element, Op, OpError, ReduceKind, Tensor, TensorData, TensorType};
use std::cmp::Ordering;

pub(crate) fn infer(op: &Op, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    match *op {
        Op::Reduce {
            kind,
            keepdims,
            noop_with_empty_axes,
        } => infer_reduce(kind, keepdims, noop_with_empty_axes, cx),
        Op::ArgMax { axis, keepdims, .. } | Op::ArgMin { axis, keepdims, .. } => {
            infer_arg(axis, keepdims, cx)
        }
        Op::TopK { axis, .. } => infer_topk(axis, cx),
        Op::CumSum { .. } | Op::CumProd { .. } => infer_cumsum(cx),
        _ => crate::bail!("{} is not a reduction", op.name()),
    }
}

pub(crate) fn eval(op: &Op, cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    match *op {
        Op::Reduce {
            kind,
            keepdims,
            noop_with_empty_axes,
        } => {
            let axes = cx.opt_input(1).map(axes_values).transpose()?;
            let x = cx.input(0)?;
            let mask = reduced_axes(x.rank(), axes.as_deref(), noop_with_empty_axes)?;
            Ok(vec![eval_reduce(kind, x, &mask, keepdims)?])
        }
        Op::ArgMax {
            axis,
            keepdims,
            select_last_index,
        } => Ok(vec![eval_arg(
            cx.input(0)?,
            axis,
            keepdims,
            true,
            select_last_index,
        )?]),
        Op::ArgMin {
            axis,
            keepdims,
            select_last_index,
        } => Ok(vec![eval_arg(
            cx.input(0)?,
            axis,
            keepdims,
            false,
            select_last_index,
        )?]),
        Op::TopK { axis, largest, .. } => eval_topk(cx.input(0)?, cx.input(1)?, axis, largest),
        Op::CumSum { exclusive, reverse } => Ok(vec![eval_cumulative(
            cx.input(0)?,
            cx.input(1)?,
            exclusive,
            reverse,
            Cumulative::Sum,
        )?]),
        Op::CumProd { exclusive, reverse } => Ok(vec![eval_cumulative(
            cx.input(0)?,
            cx.input(1)?,
            exclusive,
            reverse,
            Cumulative::Prod,
        )?]),
        _ => crate::bail!("{} is not a reduction", op.name()),
    }
}

fn expect_inputs(cx: &InferCtx, min: usize, max: usize) -> Result<(), OpError> {
    let n = cx.num_inputs();
    if n < min || n > max {
        crate::bail!("expected {min} to {max} inputs, got {n}");
    }
    Ok(())
}

/// Product of extents, saturating: next to a zero extent, the others' product may overflow
/// (such a tensor is empty, and callers return before using the product).
fn product(dims: &[usize]) -> usize {
    dims.iter().fold(1usize, |acc, &d| acc.saturating_mul(d))
}

/// The extents `[outer, n, inner]` of `shape` around `axis`.
fn split_at_axis(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (product(&shape[..axis]), shape[axis], product(&shape[axis + 1..]))
}

// ---------------------------------------------------------------------------------------------
// Reduce*
// ---------------------------------------------------------------------------------------------

fn check_reduce_dtype(kind: ReduceKind, d: DType) -> Result<(), OpError> {
    if d == DType::Bool && !matches!(kind, ReduceKind::Max | ReduceKind::Min) {
        crate::bail!("{} does not accept bool input", kind.op_name());
    }
    Ok(())
}

/// The values of an `axes` input (1-D integers).
fn axes_values(t: &Tensor) -> Result<Vec<i64>, OpError> {
    if !t.dtype().is_int() || t.rank() > 1 {
        crate::bail!("axes must be a 1-D integer tensor, got {}", t.tensor_type());
    }
    Ok(t.to_i64_vec())
}

/// Which axes of a rank-`rank` input are reduced. `axes` absent or empty means all of them, or
/// none with `noop_with_empty_axes`. Out-of-range or repeated axes are errors.
fn reduced_axes(rank: usize, axes: Option<&[i64]>, noop_with_empty_axes: bool) -> Result<Vec<bool>, OpError> {
    let axes = axes.unwrap_or(&[]);
    if axes.is_empty() {
        return Ok(vec![!noop_with_empty_axes; rank]);
    }
    let mut mask = vec![false; rank];
    for &a in axes {
        let a = norm_axis(a, rank)?;
        if mask[a] {
            crate::bail!("axis {a} appears more than once in axes {axes:?}");
        }
        mask[a] = true;
    }
    Ok(mask)
}

fn infer_reduce(
    kind: ReduceKind,
    keepdims: bool,
    noop_with_empty_axes: bool,
    cx: &InferCtx,
) -> Result<Vec<TensorType>, OpError> {
    expect_inputs(cx, 1, 2)?;
    let x = cx.ty(0)?;
    check_reduce_dtype(kind, x.dtype)?;
    let rank = x.rank();
    let axes = match (cx.opt_ty(1), cx.value(1)) {
        (None, _) => Some(vec![]),
        (Some(_), Some(v)) => Some(axes_values(v)?),
        (Some(t), None) => {
            if !t.dtype.is_int() || t.rank() != 1 {
                crate::bail!("axes must be a 1-D integer tensor, got {t}");
            }
            // An axes input of static length 0 is known to be empty.
            (t.shape[0] == Dim::Fixed(0)).then(Vec::new)
        }
    };
    let shape = match axes {
        Some(axes) => {
            let mask = reduced_axes(rank, Some(&axes), noop_with_empty_axes)?;
            x.shape
                .iter()
                .zip(&mask)
                .filter_map(|(d, &reduced)| match (reduced, keepdims) {
                    (false, _) => Some(d.clone()),
                    (true, true) => Some(Dim::Fixed(1)),
                    (true, false) => None,
                })
                .collect()
        }
        // Axes computed at run time: which dims shrink is unknown, and without keepdims so is
        // the rank unless the axes' count is static.
        None if keepdims => x
            .shape
            .iter()
            .map(|d| {
                if *d == Dim::Fixed(1) {
                    d.clone()
                } else {
                    Dim::unknown()
                }
            })
            .collect(),
        None => match cx.opt_ty(1).and_then(|t| t.shape[0].fixed()) {
            Some(n) if n <= rank => vec![Dim::unknown(); rank - n],
            Some(n) => crate::bail!("{n} axes given for an input of rank {rank}"),
            None => crate::bail!(
                "the output rank depends on run-time axes (keepdims=0 and axes of unknown length)"
            ),
        },
    };
    Ok(vec![TensorType {
        dtype: x.dtype,
        shape,
        layout: x.layout,
    }])
}

fn eval_reduce(kind: ReduceKind, x: &Tensor, mask: &[bool], keepdims: bool) -> Result<Tensor, OpError> {
    check_reduce_dtype(kind, x.dtype())?;
    let kept: Vec<usize> = x
        .shape()
        .iter()
        .zip(mask)
        .map(|(&d, &r)| if r { 1 } else { d })
        .collect();
    let n_out = check_alloc(&kept)?;
    let reduced: Vec<usize> = x
        .shape()
        .iter()
        .zip(mask)
        .filter(|(_, &r)| r)
        .map(|(&d, _)| d)
        .collect();
    let count = product(&reduced);
    let r = Reduction {
        kind,
        // An empty input has no rows (and its shape may not have computable strides).
        rows: if x.is_empty() {
            RowReader {
                offsets: vec![],
                step: 0,
            }
        } else {
            RowReader::new(&kept, x.shape())
        },
        row_len: row_len(x.shape()),
        n_out,
        count,
    };
    let data = match x.data() {
        TensorData::Bool(v) => r.bools(v)?,
        TensorData::F16(v) => wrap(r.floats(v)),
        TensorData::BF16(v) => wrap(r.floats(v)),
        TensorData::F32(v) => wrap(r.floats(v)),
        TensorData::F64(v) => wrap(r.floats(v)),
        d => with_int_data!(d, v => wrap(r.ints(v)), else => crate::bail!("unsupported input type")),
    };
    let shape = if keepdims {
        kept
    } else {
        x.shape()
            .iter()
            .zip(mask)
            .filter(|(_, &r)| !r)
            .map(|(&d, _)| d)
            .collect()
    };
    Tensor::new(shape, data).map_err(|e| OpError::new(e.to_string()))
}

fn wrap<T: Element>(v: Vec<T>) -> TensorData {
    T::wrap(v)
}

/// One reduction, walking the input row by row (a row is a run along its innermost axis):
/// each row reduces either into one output element (`rows.step == 0`, the innermost axis is
/// reduced) or element-wise into a run of outputs. Each output reduces `count` elements.
struct Reduction {
    kind: ReduceKind,
    rows: RowReader,
    row_len: usize,
    n_out: usize,
    count: usize,
}

impl Reduction {
    /// Calls `g(output index, element)` for every input element.
    fn visit<T: Copy>(&self, v: &[T], mut g: impl FnMut(usize, T)) {
        if v.is_empty() {
            return;
        }
        for (row, &o) in v.chunks_exact(self.row_len).zip(&self.rows.offsets) {
            if self.rows.step == 0 {
                row.iter().for_each(|&e| g(o, e));
            } else {
                row.iter().enumerate().for_each(|(j, &e)| g(o + j, e));
            }
        }
    }

    fn fold<T: Copy, A: Copy>(&self, v: &[T], init: A, f: impl Fn(A, T) -> A) -> Vec<A> {
        let mut acc = vec![init; self.n_out];
        self.visit(v, |o, e| acc[o] = f(acc[o], e));
        acc
    }

    fn floats<T: Element>(&self, v: &[T]) -> Vec<T> {
        self.reals(v).into_iter().map(T::from_f64).collect()
    }

    /// The reduction of the elements as real numbers, in f64.
    fn reals<T: Element>(&self, x: &[T]) -> Vec<f64> {
        // NaN-propagating extremes: once the accumulator is NaN it stays NaN.
        let max = |a: f64, e: T| {
            let e = e.to_f64();
            if e.is_nan() || e > a {
                e
            } else {
                a
            }
        };
        let min = |a: f64, e: T| {
            let e = e.to_f64();
            if e.is_nan() || e < a {
                e
            } else {
                a
            }
        };
        let sum = |a: f64, e: T| a + e.to_f64();
        let sum_sq = |a: f64, e: T| a + e.to_f64() * e.to_f64();
        let n = self.count as f64;
        match self.kind {
            ReduceKind::Sum => self.fold(x, 0.0, sum),
            ReduceKind::Mean => self.fold(x, 0.0, sum).into_iter().map(|s| s / n).collect(),
            ReduceKind::Max => self.fold(x, f64::NEG_INFINITY, max),
            ReduceKind::Min => self.fold(x, f64::INFINITY, min),
            ReduceKind::Prod => self.fold(x, 1.0, |a, e| a * e.to_f64()),
            ReduceKind::L1 => self.fold(x, 0.0, |a, e| a + e.to_f64().abs()),
            ReduceKind::L2 => self.fold(x, 0.0, sum_sq).into_iter().map(f64::sqrt).collect(),
            ReduceKind::SumSquare => self.fold(x, 0.0, sum_sq),
            ReduceKind::LogSum => self.fold(x, 0.0, sum).into_iter().map(f64::ln).collect(),
            ReduceKind::LogSumExp => {
                // max + ln Σ exp(x - max); an infinite or NaN max is the result itself (and
                // keeps inf - inf out of the sum).
                let m = self.fold(x, f64::NEG_INFINITY, max);
                let mut s = vec![0.0; self.n_out];
                self.visit(x, |o, e| {
                    if m[o].is_finite() {
                        s[o] += (e.to_f64() - m[o]).exp();
                    }
                });
                m.iter()
                    .zip(s)
                    .map(|(&m, s)| if m.is_finite() { m + s.ln() } else { m })
                    .collect()
            }
        }
    }

    fn ints<T: Int>(&self, v: &[T]) -> Vec<T> {
        match self.kind {
            ReduceKind::Sum => self.fold(v, T::zero(), T::wadd),
            ReduceKind::Mean => {
                let n = self.count as f64;
                let sums = self.fold(v, T::zero(), T::wadd);
                // Truncating division of the sum (0 for an empty reduction).
                sums.into_iter()
                    .map(|s| {
                        if self.count == 0 {
                            T::zero()
                        } else {
                            T::from_f64(s.to_f64() / n)
                        }
                    })
                    .collect()
            }
            ReduceKind::Max => self.fold(v, T::MIN, |a, e| a.max(e)),
            ReduceKind::Min => self.fold(v, T::MAX, |a, e| a.min(e)),
            ReduceKind::Prod => self.fold(v, T::one(), T::wmul),
            ReduceKind::L1 => self.fold(v, T::zero(), |a, e| a.wadd(e.wabs())),
            ReduceKind::SumSquare => self.fold(v, T::zero(), |a, e| a.wadd(e.wmul(e))),
            ReduceKind::L2 | ReduceKind::LogSum | ReduceKind::LogSumExp => self.floats(v),
        }
    }

    fn bools(&self, v: &[bool]) -> Result<TensorData, OpError> {
        Ok(TensorData::Bool(match self.kind {
            ReduceKind::Max => self.fold(v, false, |a, e| a | e),
            ReduceKind::Min => self.fold(v, true, |a, e| a & e),
            k => crate::bail!("{} does not accept bool input", k.op_name()),
        }))
    }
}

// ---------------------------------------------------------------------------------------------
// ArgMax, ArgMin
// ---------------------------------------------------------------------------------------------

fn infer_arg(axis: i64, keepdims: bool, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    expect_inputs(cx, 1, 1)?;
    let x = cx.ty(0)?;
    if x.dtype == DType::Bool {
        crate::bail!("the input must be numeric, got bool");
    }
    let a = norm_axis(axis, x.rank())?;
    let mut shape = x.shape.clone();
    if keepdims {
        shape[a] = Dim::Fixed(1);
    } else {
        shape.remove(a);
    }
    Ok(vec![TensorType::new(DType::I64, shape)])
}

fn eval_arg(x: &Tensor, axis: i64, keepdims: bool, max: bool, last: bool) -> Result<Tensor, OpError> {
    let a = norm_axis(axis, x.rank())?;
    let mut shape = x.shape().to_vec();
    if keepdims {
        shape[a] = 1;
    } else {
        shape.remove(a);
    }
    if check_alloc(&shape)? == 0 {
        return Ok(Tensor::from_vec(shape, Vec::<i64>::new()));
    }
    let (outer, n, inner) = split_at_axis(x.shape(), a);
    if n == 0 {
        crate::bail!("cannot take the index of an extreme along an empty axis");
    }
    fn pick<T: Element>(
        v: &[T],
        (outer, n, inner): (usize, usize, usize),
        max: bool,
        last: bool,
    ) -> Vec<i64> {
        // Whether `c` replaces the current best `b`. NaN beats every number; among equals
        // the first (or, with `last`, the last) index wins.
        let better = |c: T, b: T| {
            if b.is_nan() {
                return last && c.is_nan();
            }
            if c.is_nan() {
                return true;
            }
            match c.partial_cmp(&b) {
                Some(Ordering::Equal) => last,
                Some(Ordering::Greater) => max,
                Some(Ordering::Less) => !max,
                None => false,
            }
        };
        let mut out = Vec::with_capacity(outer * inner);
        for o in 0..outer {
            for i in 0..inner {
                let at = |k: usize| v[(o * n + k) * inner + i];
                let mut best = 0;
                for k in 1..n {
                    if better(at(k), at(best)) {
                        best = k;
                    }
                }
                out.push(best as i64);
            }
        }
        out
    }
    let idx = crate::with_numeric_data!(x.data(), v => pick(v, (outer, n, inner), max, last),
        bool => crate::bail!("the input must be numeric, got bool"));
    Ok(Tensor::from_vec(shape, idx))
}

// ---------------------------------------------------------------------------------------------
// TopK
// ---------------------------------------------------------------------------------------------

/// The `K` input's value: a single non-negative integer.
fn k_value(t: &Tensor) -> Result<usize, OpError> {
    if !t.dtype().is_int() || t.len() != 1 || t.rank() > 1 {
        crate::bail!("K must be a 1-element integer tensor, got {}", t.tensor_type());
    }
    let k = t.to_i64_vec()[0];
    usize::try_from(k).map_err(|_| OpError::new(format!("K must be non-negative, got {k}")))
}

fn infer_topk(axis: i64, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    expect_inputs(cx, 2, 2)?;
    let (x, kt) = (cx.ty(0)?, cx.ty(1)?);
    if x.dtype == DType::Bool {
        crate::bail!("the input must be numeric, got bool");
    }
    if !kt.dtype.is_int() || kt.num_elements().is_some_and(|n| n != 1) {
        crate::bail!("K must be a 1-element integer tensor, got {kt}");
    }
    let a = norm_axis(axis, x.rank())?;
    let mut shape = x.shape.clone();
    shape[a] = match cx.value(1).map(k_value).transpose()? {
        Some(k) => {
            if let Dim::Fixed(n) = x.shape[a] {
                if k > n {
                    crate::bail!("K = {k} exceeds the axis extent {n}");
                }
            }
            Dim::Fixed(k)
        }
        None => Dim::unknown(),
    };
    Ok(vec![
        TensorType {
            dtype: x.dtype,
            shape: shape.clone(),
            layout: x.layout,
        },
        TensorType::new(DType::I64, shape),
    ])
}

/// Orders numbers ascending with NaN above everything (numpy's sort order).
fn nan_last<T: Element>(a: T, b: T) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

fn eval_topk(x: &Tensor, k: &Tensor, axis: i64, largest: bool) -> Result<Vec<Tensor>, OpError> {
    let k = k_value(k)?;
    let a = norm_axis(axis, x.rank())?;
    let (outer, n, inner) = split_at_axis(x.shape(), a);
    if k > n {
        crate::bail!("K = {k} exceeds the axis extent {n}");
    }
    let mut shape = x.shape().to_vec();
    shape[a] = k;
    if check_alloc(&shape)? == 0 {
        let values = Tensor::zeros(x.dtype(), shape.clone());
        return Ok(vec![values, Tensor::from_vec(shape, Vec::<i64>::new())]);
    }
    // Always sorted (allowed for `sorted=0`); ties keep the lower index first (stable sort).
    fn top<T: Element>(
        v: &[T],
        (outer, n, inner): (usize, usize, usize),
        k: usize,
        largest: bool,
    ) -> (Vec<T>, Vec<i64>) {
        let mut values = vec![T::zero(); outer * k * inner];
        let mut indices = vec![0i64; outer * k * inner];
        let mut order: Vec<usize> = Vec::with_capacity(n);
        for o in 0..outer {
            for i in 0..inner {
                let at = |j: usize| v[(o * n + j) * inner + i];
                order.clear();
                order.extend(0..n);
                if largest {
                    order.sort_by(|&p, &q| nan_last(at(q), at(p)));
                } else {
                    order.sort_by(|&p, &q| nan_last(at(p), at(q)));
                }
                for (r, &j) in order.iter().take(k).enumerate() {
                    let dst = (o * k + r) * inner + i;
                    values[dst] = at(j);
                    indices[dst] = j as i64;
                }
            }
        }
        (values, indices)
    }
    let (values, indices) = crate::with_numeric_data!(x.data(), v => {
            let (vals, idx) = top(v, (outer, n, inner), k, largest);
            (wrap(vals), idx)
        },
        bool => crate::bail!("the input must be numeric, got bool"));
    let values = Tensor::new(shape.clone(), values).map_err(|e| OpError::new(e.to_string()))?;
    Ok(vec![values, Tensor::from_vec(shape, indices)])
}

// ---------------------------------------------------------------------------------------------
// CumSum
// ---------------------------------------------------------------------------------------------

fn check_axis_input(t: &TensorType) -> Result<(), OpError> {
    if !t.dtype.is_int() || t.num_elements().is_some_and(|n| n != 1) || t.rank() > 1 {
        crate::bail!("axis must be an integer scalar, got {t}");
    }
    Ok(())
}

fn infer_cumsum(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    expect_inputs(cx, 2, 2)?;
    let x = cx.ty(0)?;
    if x.dtype == DType::Bool {
        crate::bail!("the input must be numeric, got bool");
    }
    check_axis_input(cx.ty(1)?)?;
    if let Some(axis) = known_i64s(cx.value(1)) {
        if let [axis] = axis[..] {
            norm_axis(axis, x.rank())?;
        }
    }
    Ok(vec![x.clone()])
}

/// The running aggregate of `CumSum` / `CumProd`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Cumulative {
    Sum,
    Prod,
}

fn eval_cumulative(
    x: &Tensor,
    axis: &Tensor,
    exclusive: bool,
    reverse: bool,
    agg: Cumulative,
) -> Result<Tensor, OpError> {
    check_axis_input(&axis.tensor_type())?;
    let a = norm_axis(axis.to_i64_vec()[0], x.rank())?;
    if x.dtype() == DType::Bool {
        crate::bail!("the input must be numeric, got bool");
    }
    if x.is_empty() {
        return Ok(x.clone());
    }
    let dims = split_at_axis(x.shape(), a);
    let data = match x.data() {
        TensorData::Bool(_) => crate::bail!("the input must be numeric, got bool"),
        TensorData::F16(v) => wrap(float_scan(v, dims, exclusive, reverse, agg)),
        TensorData::BF16(v) => wrap(float_scan(v, dims, exclusive, reverse, agg)),
        TensorData::F32(v) => wrap(float_scan(v, dims, exclusive, reverse, agg)),
        TensorData::F64(v) => wrap(float_scan(v, dims, exclusive, reverse, agg)),
        d => with_int_data!(d, v => wrap(int_scan(v, dims, exclusive, reverse, agg)),
            else => crate::bail!("unsupported input type")),
    };
    Tensor::new(x.shape().to_vec(), data).map_err(|e| OpError::new(e.to_string()))
}

/// Integer running sums and products wrap in the element type (numpy).
fn int_scan<T: Int>(
    v: &[T],
    dims: (usize, usize, usize),
    exclusive: bool,
    reverse: bool,
    agg: Cumulative,
) -> Vec<T> {
    match agg {
        Cumulative::Sum => scan(v, dims, exclusive, reverse, T::zero(), T::wadd, |a| a),
        Cumulative::Prod => scan(v, dims, exclusive, reverse, T::one(), T::wmul, |a| a),
    }
}

/// Float running sums and products accumulate in f64; each output is rounded once.
fn float_scan<T: Element>(
    v: &[T],
    dims: (usize, usize, usize),
    exclusive: bool,
    reverse: bool,
    agg: Cumulative,
) -> Vec<T> {
    match agg {
        Cumulative::Sum => scan(
            v,
            dims,
            exclusive,
            reverse,
            0.0,
            |a, e: T| a + e.to_f64(),
            T::from_f64,
        ),
        Cumulative::Prod => scan(
            v,
            dims,
            exclusive,
            reverse,
            1.0,
            |a, e: T| a * e.to_f64(),
            T::from_f64,
        ),
    }
}

/// Running totals along the middle axis of `[outer, n, inner]`, accumulated in `A`.
fn scan<T: Element, A: Copy>(
    v: &[T],
    (outer, n, inner): (usize, usize, usize),
    exclusive: bool,
    reverse: bool,
    zero: A,
    add: impl Fn(A, T) -> A,
    finish: impl Fn(A) -> T,
) -> Vec<T> {
    let mut out = vec![T::default(); v.len()];
    for o in 0..outer {
        for i in 0..inner {
            let mut acc = zero;
            for step in 0..n {
                let k = if reverse { n - 1 - step } else { step };
                let at = (o * n + k) * inner + i;
                if exclusive {
                    out[at] = finish(acc);
                    acc = add(acc, v[at]);
                } else {
                    acc = add(acc, v[at]);
                    out[at] = finish(acc);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t<T: Element>(shape: &[usize], v: Vec<T>) -> Tensor {
        Tensor::from_vec(shape.to_vec(), v)
    }

    fn reduce(kind: ReduceKind, x: &Tensor, axes: Option<&[i64]>, keepdims: bool, noop: bool) -> Tensor {
        let mask = reduced_axes(x.rank(), axes, noop).unwrap();
        eval_reduce(kind, x, &mask, keepdims).unwrap()
    }

    #[test]
    fn reduce_over_middle_axis() {
        let x = t(&[2, 3, 2], (0..12).map(|v| v as f32).collect());
        let r = reduce(ReduceKind::Sum, &x, Some(&[1]), false, false);
        assert_eq!(r, t(&[2, 2], vec![6.0f32, 9.0, 24.0, 27.0]));
        let r = reduce(ReduceKind::Max, &x, Some(&[-1, 0]), true, false);
        assert_eq!(r, t(&[1, 3, 1], vec![7.0f32, 9.0, 11.0]));
    }

    #[test]
    fn empty_reductions_give_identities() {
        let x = Tensor::zeros(DType::F32, vec![2, 0]);
        let r = reduce(ReduceKind::Max, &x, Some(&[1]), false, false);
        assert_eq!(r, t(&[2], vec![f32::NEG_INFINITY; 2]));
        let r = reduce(ReduceKind::Prod, &x, Some(&[1]), true, false);
        assert_eq!(r, t(&[2, 1], vec![1.0f32; 2]));
        let r = reduce(ReduceKind::LogSumExp, &x, None, false, false);
        assert_eq!(r, t(&[], vec![f32::NEG_INFINITY]));
        let xi = Tensor::zeros(DType::I8, vec![0]);
        assert_eq!(
            reduce(ReduceKind::Min, &xi, None, false, false),
            t(&[], vec![i8::MAX])
        );
    }

    #[test]
    fn noop_with_empty_axes_maps_elements() {
        let x = t(&[2], vec![-3.0f32, 2.0]);
        assert_eq!(reduce(ReduceKind::Sum, &x, Some(&[]), true, true), x);
        assert_eq!(
            reduce(ReduceKind::L2, &x, None, true, true),
            t(&[2], vec![3.0f32, 2.0])
        );
    }

    #[test]
    fn repeated_axes_are_an_error() {
        assert!(reduced_axes(3, Some(&[1, -2]), false).is_err());
        assert!(reduced_axes(3, Some(&[3]), false).is_err());
    }

    #[test]
    fn integer_mean_truncates() {
        let x = t(&[3], vec![-1i32, -1, 0]);
        assert_eq!(
            reduce(ReduceKind::Mean, &x, None, false, false),
            t(&[], vec![0i32])
        );
    }

    #[test]
    fn log_sum_exp_is_stable() {
        let x = t(&[2], vec![1000.0f64, 1000.0]);
        let r = reduce(ReduceKind::LogSumExp, &x, None, false, false);
        let v = r.as_slice::<f64>().unwrap()[0];
        assert!((v - (1000.0 + 2f64.ln())).abs() < 1e-12);
    }

    #[test]
    fn argmax_ties_and_nan() {
        let x = t(&[5], vec![1.0f32, 3.0, 3.0, f32::NAN, f32::NAN]);
        assert_eq!(eval_arg(&x, 0, false, true, false).unwrap(), t(&[], vec![3i64]));
        assert_eq!(eval_arg(&x, 0, false, true, true).unwrap(), t(&[], vec![4i64]));
        let y = t(&[4], vec![3i32, 1, 1, 2]);
        assert_eq!(eval_arg(&y, 0, true, false, false).unwrap(), t(&[1], vec![1i64]));
        assert_eq!(eval_arg(&y, 0, true, false, true).unwrap(), t(&[1], vec![2i64]));
    }

    #[test]
    fn topk_ties_keep_lower_index_first() {
        let x = t(&[5], vec![1i32, 3, 2, 3, 1]);
        let k = t(&[1], vec![3i64]);
        let r = eval_topk(&x, &k, 0, true).unwrap();
        assert_eq!(r[0], t(&[3], vec![3i32, 3, 2]));
        assert_eq!(r[1], t(&[3], vec![1i64, 3, 2]));
        let r = eval_topk(&x, &k, -1, false).unwrap();
        assert_eq!(r[1], t(&[3], vec![0i64, 4, 2]));
        assert!(eval_topk(&x, &t(&[1], vec![6i64]), 0, true).is_err());
    }

    #[test]
    fn cumsum_exclusive_reverse() {
        let x = t(&[2, 3], vec![1i64, 2, 3, 4, 5, 6]);
        let axis = t(&[], vec![1i32]);
        let r = eval_cumulative(&x, &axis, true, true, Cumulative::Sum).unwrap();
        assert_eq!(r, t(&[2, 3], vec![5i64, 3, 0, 11, 6, 0]));
        let r = eval_cumulative(&x, &t(&[1], vec![0i64]), false, false, Cumulative::Sum).unwrap();
        assert_eq!(r, t(&[2, 3], vec![1i64, 2, 3, 5, 7, 9]));
    }

    #[test]
    fn empty_tensors_with_huge_extents_do_not_overflow() {
        let x = Tensor::new(vec![0, 1 << 40, 1 << 40], TensorData::F32(vec![])).unwrap();
        for axis in 0..3 {
            let _ = eval_arg(&x, axis, true, true, false);
            let _ = eval_arg(&x, axis, false, false, true);
            let _ = eval_topk(&x, &t(&[1], vec![0i64]), axis, true);
            let r = eval_cumulative(&x, &t(&[], vec![axis]), false, true, Cumulative::Sum).unwrap();
            assert_eq!(r.shape(), x.shape());
        }
        for kind in [ReduceKind::Sum, ReduceKind::Mean, ReduceKind::LogSumExp] {
            for axes in [&[0i64][..], &[1, 2], &[]] {
                let mask = reduced_axes(3, Some(axes), true).unwrap();
                let _ = eval_reduce(kind, &x, &mask, false);
            }
        }
    }
}
