//! Slice: per-axis start/end/step with ONNX clamping, negative steps included.

use super::{expect_index_dtype, int_values, make, norm_axes, strided_copy, vec_len, Res};
use crate::ops::util::{known_i64s, strides};
use crate::ops::{EvalCtx, InferCtx};
use crate::{bail, DType, Dim, Element, Tensor, TensorData, TensorType};

/// Start and length of `Slice` along one axis of extent `dim` with ONNX clamping: negative
/// starts/ends count from the back, then starts clamp to `[0, dim]` (`[0, dim-1]` for negative
/// steps) and ends to `[0, dim]` (`[-1, dim-1]`).
pub fn slice_range(dim: usize, start: i64, end: i64, step: i64) -> Res<(usize, usize)> {
    if step == 0 {
        bail!("slice step cannot be 0");
    }
    let d = dim as i128;
    let wrap = |v: i64| if v < 0 { v as i128 + d } else { v as i128 };
    let (s, e, st) = (wrap(start), wrap(end), step as i128);
    if dim == 0 {
        return Ok((0, 0));
    }
    let (s, len) = if st > 0 {
        let (s, e) = (s.clamp(0, d), e.clamp(0, d));
        (s, if e > s { (e - s + st - 1) / st } else { 0 })
    } else {
        let (s, e) = (s.clamp(0, d - 1), e.clamp(-1, d - 1));
        (s, if s > e { (s - e - st - 1) / -st } else { 0 })
    };
    Ok((s as usize, len as usize))
}

/// Output extent of `Slice` along an axis with dim `d`. With a symbolic dim only the full-range
/// forms (`0..INT_MAX` step 1, `-1..INT_MIN` step -1) are known: they keep the dim.
fn slice_dim(d: &Dim, start: i64, end: i64, step: i64) -> Res<Dim> {
    match d {
        Dim::Fixed(n) => Ok(Dim::Fixed(slice_range(*n, start, end, step)?.1)),
        Dim::Sym(_) => {
            if step == 0 {
                bail!("slice step cannot be 0");
            }
            let to_end = step == 1 && start == 0 && end >= i32::MAX as i64;
            let reversed = step == -1 && start == -1 && end <= i32::MIN as i64;
            Ok(if to_end || reversed {
                d.clone()
            } else {
                Dim::unknown()
            })
        }
    }
}

/// `(start, end, step)` of one sliced axis.
type AxisSlice = (i64, i64, i64);

/// Per-axis slices from the `Slice` inputs, indexed by axis; `None` where an axis is not
/// sliced (it keeps its whole extent).
fn slice_spec(
    rank: usize,
    starts: &[i64],
    ends: &[i64],
    axes: Option<&[i64]>,
    steps: Option<&[i64]>,
) -> Res<Vec<Option<AxisSlice>>> {
    let n = starts.len();
    if ends.len() != n {
        bail!("starts has {n} entries but ends has {}", ends.len());
    }
    let axes: Vec<usize> = match axes {
        Some(a) if a.len() != n => bail!("starts has {n} entries but axes has {}", a.len()),
        Some(a) => norm_axes(a, rank)?,
        None if n > rank => bail!("starts has {n} entries for an input of rank {rank}"),
        None => (0..n).collect(),
    };
    if let Some(s) = steps {
        if s.len() != n {
            bail!("starts has {n} entries but steps has {}", s.len());
        }
    }
    let mut per_axis = vec![None; rank];
    for (i, &a) in axes.iter().enumerate() {
        let step = steps.map_or(1, |s| s[i]);
        if step == 0 {
            bail!("slice step cannot be 0");
        }
        per_axis[a] = Some((starts[i], ends[i], step));
    }
    Ok(per_axis)
}

fn check_slice_input(cx: &InferCtx, i: usize, what: &str, dtype: DType) -> Res<Option<usize>> {
    let t = cx.ty(i)?;
    expect_index_dtype(t.dtype, what)?;
    if t.dtype != dtype {
        bail!("{what} is {} but starts is {dtype}", t.dtype);
    }
    vec_len(t, what)
}

pub(super) fn infer_slice(cx: &InferCtx) -> Res<TensorType> {
    let x = cx.ty(0)?;
    let dtype = cx.ty(1)?.dtype;
    let n_starts = check_slice_input(cx, 1, "starts", dtype)?;
    check_slice_input(cx, 2, "ends", dtype)?;
    for (i, what) in [(3, "axes"), (4, "steps")] {
        if cx.opt_ty(i).is_some() {
            check_slice_input(cx, i, what, dtype)?;
        }
    }
    let known = |i: usize| known_i64s(cx.value(i));
    let opt_known = |i: usize| match cx.opt_ty(i) {
        None => Some(None),
        Some(_) => known(i).map(Some),
    };
    let shape = match (known(1), known(2), opt_known(3), opt_known(4)) {
        (Some(s), Some(e), Some(a), Some(st)) => {
            let spec = slice_spec(x.rank(), &s, &e, a.as_deref(), st.as_deref())?;
            x.shape
                .iter()
                .zip(&spec)
                .map(|(d, p)| match p {
                    None => Ok(d.clone()),
                    Some((s, e, st)) => slice_dim(d, *s, *e, *st),
                })
                .collect::<Res<_>>()?
        }
        // Which axes are sliced is known, their bounds are not.
        (_, _, Some(a), _) => {
            let n = a.as_ref().map(Vec::len).or(n_starts);
            let sliced: Vec<usize> = match (a, n) {
                (Some(a), _) => norm_axes(&a, x.rank())?,
                (None, Some(n)) => (0..n.min(x.rank())).collect(),
                (None, None) => (0..x.rank()).collect(),
            };
            let mut shape = x.shape.clone();
            for a in sliced {
                shape[a] = Dim::unknown();
            }
            shape
        }
        _ => vec![Dim::unknown(); x.rank()],
    };
    Ok(TensorType::new(x.dtype, shape))
}

pub(super) fn eval_slice(cx: &EvalCtx) -> Res<Tensor> {
    let x = cx.input(0)?;
    let starts = int_values(cx.input(1)?, "starts")?;
    let ends = int_values(cx.input(2)?, "ends")?;
    let axes = cx.opt_input(3).map(|t| int_values(t, "axes")).transpose()?;
    let steps = cx.opt_input(4).map(|t| int_values(t, "steps")).transpose()?;
    let spec = slice_spec(x.rank(), &starts, &ends, axes.as_deref(), steps.as_deref())?;
    let in_strides = strides(x.shape());
    let mut base = 0usize;
    let mut out_shape = Vec::with_capacity(x.rank());
    let mut st = Vec::with_capacity(x.rank());
    for ((&d, p), &stride) in x.shape().iter().zip(&spec).zip(&in_strides) {
        let ((begin, len), step) = match p {
            None => ((0, d), 1),
            Some((s, e, step)) => (slice_range(d, *s, *e, *step)?, *step),
        };
        out_shape.push(len);
        if len > 0 {
            base += begin * stride;
        }
        // |step| > extent reads at most one element: clamp so the stride cannot overflow.
        let step = step.clamp(-(d as i64).max(1), (d as i64).max(1)) as isize;
        st.push(step * stride as isize);
    }
    fn go<T: Element>(v: &[T], shape: &[usize], base: usize, st: &[isize]) -> TensorData {
        T::wrap(strided_copy(v, shape, base, st))
    }
    let data = crate::with_data!(x.data(), v => go(v, &out_shape, base, &st));
    make(out_shape, data)
}
