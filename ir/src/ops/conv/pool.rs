//! MaxPool, AveragePool, LpPool and the global pools.
//!
//! Every output element reduces the window's taps that fall inside the input (padding is
//! never a value: MaxPool ignores it, AveragePool counts it only with `count_include_pad`,
//! LpPool adds nothing for it). Sums are taken in f64 and rounded once; MaxPool returns the
//! input element itself, so it is exact for every dtype.

use super::{check_nc_spatial, span, Axis, WindowAttrs};
use crate::ops::{util, EvalCtx, InferCtx};
use crate::{DType, Dim, Element, OpError, PoolAttrs, PoolKind, Tensor, TensorType};

fn check_dtype(kind: PoolKind, d: DType, global: bool) -> Result<(), OpError> {
    // MaxPool also takes 8-bit integers (opset 12); the other pools are float-only.
    let ok = d.is_float() || (kind == PoolKind::Max && !global && matches!(d, DType::I8 | DType::U8));
    if !ok {
        crate::bail!(
            "input dtype {d} is not supported (floating-point types{} only)",
            if kind == PoolKind::Max && !global {
                ", i8 and u8"
            } else {
                ""
            }
        );
    }
    Ok(())
}

/// Window attributes of a pool over `n` spatial axes.
fn window(a: &PoolAttrs, n: usize) -> Result<WindowAttrs, OpError> {
    if a.kernel_shape.len() != n {
        crate::bail!(
            "kernel_shape has {} values for {n} spatial axes",
            a.kernel_shape.len()
        );
    }
    let kernel = a.kernel_shape.iter().map(|&k| Some(k)).collect();
    let win = WindowAttrs::new(kernel, &a.strides, &a.dilations, &a.pads, a.auto_pad, a.ceil_mode)?;
    // A window lying entirely in the padding would have no value to pool.
    for (i, &(b, e)) in win.pads.iter().enumerate() {
        let extent = span(a.kernel_shape[i], win.dilations[i])?;
        if b >= extent || e >= extent {
            crate::bail!(
                "pads {:?} must be smaller than the kernel extent {extent} on spatial axis {i}",
                a.pads
            );
        }
    }
    Ok(win)
}

fn check_outputs(a: &PoolAttrs, n: usize) -> Result<(), OpError> {
    match (a.kind, n) {
        (_, 1) | (PoolKind::Max, 2) => Ok(()),
        (PoolKind::Max, _) => crate::bail!("MaxPool has 1 or 2 outputs, {n} declared"),
        _ => crate::bail!("this pool has 1 output, {n} declared"),
    }
}

pub(super) fn infer(a: &PoolAttrs, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    let x = cx.ty(0)?;
    check_dtype(a.kind, x.dtype, false)?;
    let n = check_nc_spatial(x)?;
    check_outputs(a, cx.num_outputs)?;
    let win = window(a, n)?;
    let mut shape = x.shape[..2].to_vec();
    for (i, d) in x.shape[2..].iter().enumerate() {
        shape.push(win.out_dim(i, d)?);
    }
    let y = util::with_shape(x, shape.clone());
    let mut out = vec![y];
    if cx.num_outputs == 2 {
        out.push(TensorType::new(DType::I64, shape));
    }
    Ok(out)
}

pub(super) fn eval(a: &PoolAttrs, cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let x = cx.input(0)?;
    let xt = x.tensor_type();
    check_dtype(a.kind, x.dtype(), false)?;
    let n = check_nc_spatial(&xt)?;
    check_outputs(a, cx.num_outputs())?;
    let axes = window(a, n)?.axes(&x.shape()[2..])?;
    let mut shape = x.shape()[..2].to_vec();
    shape.extend(axes.iter().map(|a| a.output));
    util::check_alloc(&shape)?;
    check_work(&shape, &a.kernel_shape)?;
    let want_indices = cx.num_outputs() == 2;
    let (y, idx) = crate::dispatch_dtype!(x.dtype(), T => {
        let xs = x.as_slice::<T>().ok_or_else(|| OpError::new("input data does not match its dtype"))?;
        let (y, idx) = pool_typed(xs, x.shape(), &axes, a, want_indices);
        (Tensor::from_vec(shape.clone(), y), idx)
    });
    let mut out = vec![y];
    if let Some(idx) = idx {
        out.push(Tensor::from_vec(shape, idx));
    }
    Ok(out)
}

/// Rejects pools whose window visits would take hours: the kernel is an attribute, so a model
/// can ask for an enormous window over a modest output.
fn check_work(out_shape: &[usize], kernel: &[usize]) -> Result<(), OpError> {
    const MAX_TAPS: usize = 1 << 36;
    let taps = out_shape
        .iter()
        .chain(kernel)
        .try_fold(1usize, |acc, &d| acc.checked_mul(d));
    match taps {
        Some(t) if t <= MAX_TAPS => Ok(()),
        _ => crate::bail!("pool of output {out_shape:?} with kernel {kernel:?} is too large to evaluate"),
    }
}

/// Per axis and output position: the input indices of the taps inside the input, and how many
/// taps fall inside the input or its explicit padding (AveragePool's `count_include_pad`
/// divisor; `ceil_mode`'s extra positions past the end padding do not count).
struct AxisTaps {
    valid: Vec<Vec<usize>>,
    padded_count: Vec<usize>,
}

fn axis_taps(a: &Axis) -> AxisTaps {
    let mut valid = Vec::with_capacity(a.output);
    let mut padded_count = Vec::with_capacity(a.output);
    for o in 0..a.output {
        let mut v = vec![];
        let mut count = 0;
        for k in 0..a.kernel {
            let s = a.source(o, k);
            if s >= -a.pad_begin && s < a.input as i64 + a.pad_end {
                count += 1;
            }
            if s >= 0 && s < a.input as i64 {
                v.push(s as usize);
            }
        }
        valid.push(v);
        padded_count.push(count);
    }
    AxisTaps { valid, padded_count }
}

/// Pools every `[N, C]` plane. Returns the values and, if asked, MaxPool's flat indices.
fn pool_typed<T: Element>(
    x: &[T],
    x_shape: &[usize],
    axes: &[Axis],
    a: &PoolAttrs,
    want_indices: bool,
) -> (Vec<T>, Option<Vec<i64>>) {
    let planes = x_shape[0] * x_shape[1];
    let in_plane: usize = axes.iter().map(|a| a.input).product();
    let out_shape: Vec<usize> = axes.iter().map(|a| a.output).collect();
    let out_plane: usize = out_shape.iter().product();
    let taps: Vec<AxisTaps> = axes.iter().map(axis_taps).collect();
    let in_extent: Vec<usize> = axes.iter().map(|a| a.input).collect();
    let row_strides = util::strides(&in_extent);
    // Column-major strides of the spatial axes, for MaxPool's `storage_order = 1`.
    let col_strides: Vec<usize> = (0..axes.len()).map(|i| in_extent[..i].iter().product()).collect();
    let mut y = Vec::with_capacity(planes * out_plane);
    let mut indices = want_indices.then(|| Vec::with_capacity(planes * out_plane));
    let mut lists: Vec<&[usize]> = vec![&[]; axes.len()];
    for p in 0..planes {
        let xp = &x[p * in_plane..][..in_plane];
        for o in 0..out_plane {
            let pos = util::unravel(o, &out_shape);
            for (i, t) in taps.iter().enumerate() {
                lists[i] = &t.valid[pos[i]];
            }
            match a.kind {
                PoolKind::Max => {
                    let (v, row, col) = max_window(xp, &lists, &row_strides, &col_strides);
                    y.push(v);
                    if let Some(idx) = indices.as_mut() {
                        let off = if a.storage_order == 1 { col } else { row };
                        idx.push(off.map_or(-1, |off| (p * in_plane + off) as i64));
                    }
                }
                PoolKind::Average { count_include_pad } => {
                    let (sum, n) = sum_window(xp, &lists, &row_strides, |v| v);
                    let count = if count_include_pad {
                        pos.iter().zip(&taps).map(|(&o, t)| t.padded_count[o]).product()
                    } else {
                        n
                    };
                    y.push(T::from_f64(sum / count as f64));
                }
                PoolKind::Lp { p } => {
                    let p = f64::from(p);
                    let (sum, _) = sum_window(xp, &lists, &row_strides, |v| v.abs().powf(p));
                    y.push(T::from_f64(sum.powf(1.0 / p)));
                }
            }
        }
    }
    (y, indices)
}

/// Visits the cartesian product of per-axis input indices, calling `f` with the row-major and
/// column-major flat offsets of each tap, in row-major window order.
fn for_each_tap(lists: &[&[usize]], row: &[usize], col: &[usize], mut f: impl FnMut(usize, usize)) {
    if lists.iter().any(|l| l.is_empty()) {
        return;
    }
    let mut t = vec![0usize; lists.len()];
    loop {
        let (mut r, mut c) = (0, 0);
        for (i, l) in lists.iter().enumerate() {
            r += l[t[i]] * row[i];
            c += l[t[i]] * col[i];
        }
        f(r, c);
        let mut i = lists.len();
        loop {
            if i == 0 {
                return;
            }
            i -= 1;
            t[i] += 1;
            if t[i] < lists[i].len() {
                break;
            }
            t[i] = 0;
        }
    }
}

/// The window's maximum (first one on ties, NaN never replaces a value) with its row- and
/// column-major offsets; an empty window gives the dtype's lowest value and no offsets.
fn max_window<T: Element>(
    xp: &[T],
    lists: &[&[usize]],
    row: &[usize],
    col: &[usize],
) -> (T, Option<usize>, Option<usize>) {
    let mut best: Option<(T, usize, usize)> = None;
    for_each_tap(lists, row, col, |r, c| {
        let v = xp[r];
        let better = match best {
            None => true,
            Some((b, _, _)) => v > b,
        };
        if better {
            best = Some((v, r, c));
        }
    });
    match best {
        Some((v, r, c)) => (v, Some(r), Some(c)),
        None => (T::from_f64(f64::NEG_INFINITY), None, None),
    }
}

/// Sum of `f(x)` over the window in f64, and the number of taps.
fn sum_window<T: Element>(
    xp: &[T],
    lists: &[&[usize]],
    row: &[usize],
    f: impl Fn(f64) -> f64,
) -> (f64, usize) {
    let (mut sum, mut n) = (0.0, 0);
    for_each_tap(lists, row, row, |r, _| {
        sum += f(xp[r].to_f64());
        n += 1;
    });
    (sum, n)
}

// ---------------------------------------------------------------------------------------------
// Global pools
// ---------------------------------------------------------------------------------------------

pub(super) fn infer_global(kind: PoolKind, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    let x = cx.ty(0)?;
    check_dtype(kind, x.dtype, true)?;
    if x.rank() < 2 {
        crate::bail!("input must have shape [N, C, spatial...], got {x}");
    }
    let mut shape = x.shape[..2].to_vec();
    shape.resize(x.rank(), Dim::Fixed(1));
    Ok(vec![util::with_shape(x, shape)])
}

pub(super) fn eval_global(kind: PoolKind, cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let x = cx.input(0)?;
    check_dtype(kind, x.dtype(), true)?;
    if x.rank() < 2 {
        crate::bail!("input must have shape [N, C, spatial...], got {:?}", x.shape());
    }
    let planes = x.shape()[0] * x.shape()[1];
    let plane: usize = x.shape()[2..].iter().product();
    if plane == 0 && planes > 0 && kind == PoolKind::Max {
        crate::bail!("GlobalMaxPool of an empty spatial extent has no value");
    }
    let mut shape = x.shape()[..2].to_vec();
    shape.resize(x.rank(), 1);
    let y = crate::dispatch_dtype!(x.dtype(), T => {
        let xs = x.as_slice::<T>().ok_or_else(|| OpError::new("input data does not match its dtype"))?;
        let y: Vec<T> = (0..planes).map(|p| global_plane(&xs[p * plane..][..plane], kind)).collect();
        Tensor::from_vec(shape, y)
    });
    Ok(vec![y])
}

fn global_plane<T: Element>(xp: &[T], kind: PoolKind) -> T {
    match kind {
        PoolKind::Max => {
            let mut best = xp[0];
            for &v in &xp[1..] {
                if v > best {
                    best = v;
                }
            }
            best
        }
        PoolKind::Average { .. } => {
            let sum: f64 = xp.iter().map(|v| v.to_f64()).sum();
            T::from_f64(sum / xp.len() as f64)
        }
        PoolKind::Lp { p } => {
            let p = f64::from(p);
            let sum: f64 = xp.iter().map(|v| v.to_f64().abs().powf(p)).sum();
            T::from_f64(sum.powf(1.0 / p))
        }
    }
}
