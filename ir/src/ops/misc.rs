//! Inference operators of real models that fit no larger family: RMSNormalization,
//! Compress, ReverseSequence, Unique, RotaryEmbedding, TensorScatter, Det and the two
//! exportable losses.
//!
//! Floating-point arithmetic is done in f64 and rounded once to the element type; data
//! movement is generic over every dtype.

use super::util::{broadcast_index_map, broadcast_shapes, norm_axis, ravel, strides, unravel};
use super::{EvalCtx, InferCtx};
use crate::{DType, Dim, Element, Op, OpError, Tensor, TensorData, TensorType};
use std::cmp::Ordering;

/// How a loss is aggregated over its elements.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum LossReduction {
    None,
    Sum,
    Mean,
}

/// The operators of this module.
#[derive(Clone, PartialEq, Debug)]
pub enum MiscOp {
    /// Inputs: X, scale (broadcast to X). Normalizes over the axes `axis..rank`.
    RmsNorm {
        axis: i64,
        epsilon: f32,
        stash_type: DType,
    },
    /// Inputs: input, condition (bool 1-D). `axis` None: the input is flattened.
    Compress { axis: Option<i64> },
    /// Inputs: input, sequence_lens (i64 [batch]).
    ReverseSequence { batch_axis: usize, time_axis: usize },
    /// Inputs: X. Outputs: Y, indices?, inverse_indices?, counts? (i64).
    Unique { sorted: bool, axis: Option<i64> },
    /// Inputs: X (`[B,H,S,D]` or `[B,S,H*D]`), cos_cache, sin_cache, position_ids?.
    RotaryEmbedding {
        interleaved: bool,
        rotary_dim: usize,
        num_heads: usize,
    },
    /// Inputs: past_cache, update, write_indices? (i64 [batch]). Output: present_cache.
    TensorScatter { circular: bool, axis: i64 },
    /// Inputs: X `[*, M, M]`. Output `[*]`.
    Det,
    /// Inputs: input `[N, C, d...]`, target `[N, d...]`, weight? `[C]`.
    /// `log_softmax`: SoftmaxCrossEntropyLoss (second, optional output: log_prob).
    Loss {
        log_softmax: bool,
        reduction: LossReduction,
        ignore_index: Option<i64>,
    },
}

impl MiscOp {
    pub fn name(&self) -> &'static str {
        match self {
            MiscOp::RmsNorm { .. } => "RMSNormalization",
            MiscOp::Compress { .. } => "Compress",
            MiscOp::ReverseSequence { .. } => "ReverseSequence",
            MiscOp::Unique { .. } => "Unique",
            MiscOp::RotaryEmbedding { .. } => "RotaryEmbedding",
            MiscOp::TensorScatter { .. } => "TensorScatter",
            MiscOp::Det => "Det",
            MiscOp::Loss {
                log_softmax: false, ..
            } => "NegativeLogLikelihoodLoss",
            MiscOp::Loss {
                log_softmax: true, ..
            } => "SoftmaxCrossEntropyLoss",
        }
    }
}

pub(crate) fn infer(op: &Op, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    let Op::Misc(op) = op else {
        crate::bail!("{} is not in the misc family", op.name())
    };
    match op {
        MiscOp::RmsNorm { axis, .. } => {
            let x = float_input(cx, 0, "X")?;
            norm_axis(*axis, x.rank())?;
            let s = cx.ty(1)?;
            if s.dtype != x.dtype {
                crate::bail!("scale has dtype {} but X has {}", s.dtype, x.dtype);
            }
            if let (Some(xs), Some(ss)) = (x.fixed_shape(), s.fixed_shape()) {
                if broadcast_shapes(&xs, &ss)? != xs {
                    crate::bail!("scale {s} does not broadcast to X {x}");
                }
            }
            Ok(vec![x.clone()])
        }
        MiscOp::Compress { axis } => infer_compress(*axis, cx),
        MiscOp::ReverseSequence {
            batch_axis,
            time_axis,
        } => {
            let x = cx.ty(0)?;
            if x.rank() < 2 || *batch_axis.max(time_axis) > 1 || batch_axis == time_axis {
                crate::bail!("batch_axis/time_axis must be 0 and 1 (in some order) of a rank >= 2 input");
            }
            let l = cx.ty(1)?;
            if !l.dtype.is_int() || l.rank() != 1 {
                crate::bail!("sequence_lens must be a 1-D integer tensor, got {l}");
            }
            Ok(vec![x.clone()])
        }
        MiscOp::Unique { axis, .. } => infer_unique(*axis, cx),
        MiscOp::RotaryEmbedding { .. } => {
            let x = float_input(cx, 0, "X")?;
            if x.rank() != 3 && x.rank() != 4 {
                crate::bail!("X must be 3-D or 4-D, got {x}");
            }
            for i in 1..3 {
                if cx.ty(i)?.dtype != x.dtype {
                    crate::bail!("the cos/sin caches must have X's dtype {}", x.dtype);
                }
            }
            Ok(vec![x.clone()])
        }
        MiscOp::TensorScatter { axis, .. } => {
            let c = cx.ty(0)?;
            let u = cx.ty(1)?;
            let a = norm_axis(*axis, c.rank())?;
            if a == 0 || u.rank() != c.rank() || u.dtype != c.dtype {
                crate::bail!("update {u} does not match cache {c} (the axis may not be the batch axis)");
            }
            Ok(vec![c.clone()])
        }
        MiscOp::Det => {
            let x = float_input(cx, 0, "X")?;
            if x.rank() < 2 {
                crate::bail!("Det needs a [*, M, M] input, got {x}");
            }
            Ok(vec![TensorType::new(x.dtype, x.shape[..x.rank() - 2].to_vec())])
        }
        MiscOp::Loss { reduction, .. } => infer_loss(*reduction, cx),
    }
}

pub(crate) fn eval(op: &Op, cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let Op::Misc(op) = op else {
        crate::bail!("{} is not in the misc family", op.name())
    };
    match op {
        MiscOp::RmsNorm { axis, epsilon, .. } => rms_norm(cx.input(0)?, cx.input(1)?, *axis, *epsilon),
        MiscOp::Compress { axis } => compress(cx.input(0)?, cx.input(1)?, *axis),
        MiscOp::ReverseSequence {
            batch_axis,
            time_axis,
        } => reverse_sequence(cx.input(0)?, cx.input(1)?, *batch_axis, *time_axis),
        MiscOp::Unique { sorted, axis } => unique(cx.input(0)?, *sorted, *axis, cx.num_outputs()),
        MiscOp::RotaryEmbedding {
            interleaved,
            rotary_dim,
            num_heads,
        } => rotary(cx, *interleaved, *rotary_dim, *num_heads),
        MiscOp::TensorScatter { circular, axis } => {
            tensor_scatter(cx.input(0)?, cx.input(1)?, cx.opt_input(2), *circular, *axis)
        }
        MiscOp::Det => det(cx.input(0)?),
        MiscOp::Loss {
            log_softmax,
            reduction,
            ignore_index,
        } => loss(cx, *log_softmax, *reduction, *ignore_index),
    }
}

fn float_input<'a>(cx: &InferCtx<'a>, i: usize, what: &str) -> Result<&'a TensorType, OpError> {
    let t = cx.ty(i)?;
    if !t.dtype.is_float() {
        crate::bail!("{what} must be a floating-point tensor, got {t}");
    }
    Ok(t)
}

fn make(shape: Vec<usize>, data: TensorData) -> Result<Tensor, OpError> {
    Tensor::new(shape, data).map_err(|e| OpError::new(e.to_string()))
}

fn floats(dtype: DType, shape: Vec<usize>, v: Vec<f64>) -> Result<Tensor, OpError> {
    make(shape, TensorData::from_f64s(dtype, v))
}

/// The elements of `x` at the flat positions `idx`, as a tensor of `shape`.
fn take(x: &Tensor, idx: &[usize], shape: Vec<usize>) -> Result<Tensor, OpError> {
    fn pick<T: Element>(v: &[T], idx: &[usize]) -> TensorData {
        T::wrap(idx.iter().map(|&i| v[i]).collect())
    }
    make(shape, crate::with_data!(x.data(), v => pick(v, idx)))
}

fn product(d: &[usize]) -> usize {
    d.iter().product()
}

// ---------------------------------------------------------------------------------------------
// RMSNormalization
// ---------------------------------------------------------------------------------------------

fn rms_norm(x: &Tensor, scale: &Tensor, axis: i64, epsilon: f32) -> Result<Vec<Tensor>, OpError> {
    let a = norm_axis(axis, x.rank())?;
    if broadcast_shapes(x.shape(), scale.shape())? != x.shape() {
        crate::bail!(
            "scale {:?} does not broadcast to X {:?}",
            scale.shape(),
            x.shape()
        );
    }
    let xv = x.to_f64_vec();
    let sv = scale.to_f64_vec();
    let smap = broadcast_index_map(scale.shape(), x.shape());
    let inner = product(&x.shape()[a..]);
    let mut out = vec![0.0; xv.len()];
    if inner > 0 {
        for (r, row) in xv.chunks(inner).enumerate() {
            let ms = row.iter().map(|v| v * v).sum::<f64>() / inner as f64;
            let inv = 1.0 / (ms + f64::from(epsilon)).sqrt();
            for (j, v) in row.iter().enumerate() {
                let at = r * inner + j;
                out[at] = v * inv * sv[smap[at]];
            }
        }
    }
    Ok(vec![floats(x.dtype(), x.shape().to_vec(), out)?])
}

// ---------------------------------------------------------------------------------------------
// Compress
// ---------------------------------------------------------------------------------------------

fn infer_compress(axis: Option<i64>, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    let x = cx.ty(0)?;
    let c = cx.ty(1)?;
    if c.dtype != DType::Bool || c.rank() != 1 {
        crate::bail!("condition must be a 1-D bool tensor, got {c}");
    }
    let selected = cx
        .value(1)
        .and_then(|v| {
            v.as_slice::<bool>()
                .map(|b| Dim::Fixed(b.iter().filter(|&&t| t).count()))
        })
        .unwrap_or_else(Dim::unknown);
    let shape = match axis {
        None => vec![selected],
        Some(axis) => {
            let a = norm_axis(axis, x.rank())?;
            let mut s = x.shape.clone();
            s[a] = selected;
            s
        }
    };
    Ok(vec![TensorType::new(x.dtype, shape)])
}

fn compress(x: &Tensor, cond: &Tensor, axis: Option<i64>) -> Result<Vec<Tensor>, OpError> {
    let Some(c) = cond.as_slice::<bool>() else {
        crate::bail!("condition must be bool, got {}", cond.dtype());
    };
    let (outer, n, inner, a) = match axis {
        None => (1, x.len(), 1, None),
        Some(axis) => {
            let a = norm_axis(axis, x.rank())?;
            let s = x.shape();
            (product(&s[..a]), s[a], product(&s[a + 1..]), Some(a))
        }
    };
    // numpy: a shorter condition selects among the leading slices only; a longer one may
    // only select slices that exist.
    if let Some(k) = c.iter().skip(n).position(|&t| t) {
        crate::bail!("condition selects index {} of an axis of extent {n}", n + k);
    }
    let kept: Vec<usize> = (0..n.min(c.len())).filter(|&k| c[k]).collect();
    let mut idx = Vec::with_capacity(outer * kept.len() * inner);
    for o in 0..outer {
        for &k in &kept {
            idx.extend((0..inner).map(|i| (o * n + k) * inner + i));
        }
    }
    let shape = match a {
        None => vec![kept.len()],
        Some(a) => {
            let mut s = x.shape().to_vec();
            s[a] = kept.len();
            s
        }
    };
    Ok(vec![take(x, &idx, shape)?])
}

// ---------------------------------------------------------------------------------------------
// ReverseSequence
// ---------------------------------------------------------------------------------------------

fn reverse_sequence(
    x: &Tensor,
    lens: &Tensor,
    batch_axis: usize,
    time_axis: usize,
) -> Result<Vec<Tensor>, OpError> {
    let s = x.shape();
    if s.len() < 2 || batch_axis.max(time_axis) > 1 || batch_axis == time_axis {
        crate::bail!("batch_axis/time_axis must be 0 and 1 of a rank >= 2 input");
    }
    let (batch, time) = (s[batch_axis], s[time_axis]);
    let lens = lens.to_i64_vec();
    if lens.len() != batch {
        crate::bail!("sequence_lens has {} entries for a batch of {batch}", lens.len());
    }
    if let Some(l) = lens.iter().find(|&&l| l < 0 || l as usize > time) {
        crate::bail!("sequence length {l} is outside [0, {time}]");
    }
    let st = strides(s);
    let idx: Vec<usize> = (0..x.len())
        .map(|flat| {
            let b = flat / st[batch_axis] % batch;
            let t = flat / st[time_axis] % time;
            let l = lens[b] as usize;
            if t < l {
                flat - t * st[time_axis] + (l - 1 - t) * st[time_axis]
            } else {
                flat
            }
        })
        .collect();
    Ok(vec![take(x, &idx, s.to_vec())?])
}

// ---------------------------------------------------------------------------------------------
// Unique
// ---------------------------------------------------------------------------------------------

fn infer_unique(axis: Option<i64>, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    let x = cx.ty(0)?;
    if cx.num_outputs == 0 || cx.num_outputs > 4 {
        crate::bail!("Unique has 1 to 4 outputs, got {}", cx.num_outputs);
    }
    let (y, inverse_len) = match axis {
        None => (
            vec![Dim::unknown()],
            x.num_elements().map_or_else(Dim::unknown, Dim::Fixed),
        ),
        Some(axis) => {
            let a = norm_axis(axis, x.rank())?;
            let mut s = x.shape.clone();
            let d = std::mem::replace(&mut s[a], Dim::unknown());
            (s, d)
        }
    };
    let mut out = vec![TensorType::new(x.dtype, y)];
    let i64s = [vec![Dim::unknown()], vec![inverse_len], vec![Dim::unknown()]];
    out.extend(
        i64s.into_iter()
            .take(cx.num_outputs - 1)
            .map(|s| TensorType::new(DType::I64, s)),
    );
    Ok(out)
}

/// Total order of numpy's sort: NaN after every number.
fn cmp_elem<T: Element>(a: T, b: T) -> Ordering {
    match a.partial_cmp(&b) {
        Some(o) => o,
        #[allow(clippy::eq_op)] // NaN test that works for every element type
        None => (a != a).cmp(&(b != b)),
    }
}

fn unique(x: &Tensor, sorted: bool, axis: Option<i64>, n_out: usize) -> Result<Vec<Tensor>, OpError> {
    let (outer, n, inner, a) = match axis {
        None => (1, x.len(), 1, None),
        Some(axis) => {
            let a = norm_axis(axis, x.rank())?;
            let s = x.shape();
            (product(&s[..a]), s[a], product(&s[a + 1..]), Some(a))
        }
    };
    // Slice k of the axis, as flat positions in (outer, inner) order: numpy compares the
    // slices lexicographically in that order.
    let slice = |k: usize| (0..outer).flat_map(move |o| (0..inner).map(move |i| (o * n + k) * inner + i));
    let order: Vec<usize> = crate::with_data!(x.data(), v => {
        let cmp = |p: usize, q: usize| {
            slice(p)
                .zip(slice(q))
                .map(|(i, j)| cmp_elem(v[i], v[j]))
                .find(|o| o.is_ne())
                .unwrap_or(Ordering::Equal)
        };
        // A stable sort keeps first occurrences first within each group of equal slices.
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&p, &q| cmp(p, q));
        // Group runs of equal slices: (first occurrence, members).
        let mut groups: Vec<(usize, Vec<usize>)> = vec![];
        for &k in &order {
            match groups.last_mut() {
                Some((first, members)) if cmp(*first, k).is_eq() => members.push(k),
                _ => groups.push((k, vec![k])),
            }
        }
        if !sorted {
            groups.sort_by_key(|g| g.0);
        }
        let mut inverse = vec![0usize; n];
        let mut firsts = Vec::with_capacity(groups.len());
        let mut counts = Vec::with_capacity(groups.len());
        for (g, (first, members)) in groups.iter().enumerate() {
            for &m in members {
                inverse[m] = g;
            }
            firsts.push(*first);
            counts.push(members.len());
        }
        firsts.into_iter().chain(inverse).chain(counts).collect()
    });
    let groups = (order.len() - n) / 2;
    let (firsts, rest) = order.split_at(groups);
    let (inverse, counts) = rest.split_at(n);
    let idx: Vec<usize> = (0..outer)
        .flat_map(|o| {
            firsts
                .iter()
                .flat_map(move |&k| (0..inner).map(move |i| (o * n + k) * inner + i))
        })
        .collect();
    let y_shape = match a {
        None => vec![groups],
        Some(a) => {
            let mut s = x.shape().to_vec();
            s[a] = groups;
            s
        }
    };
    let ints = |v: &[usize]| Tensor::from_vec(vec![v.len()], v.iter().map(|&i| i as i64).collect());
    let mut out = vec![take(x, &idx, y_shape)?, ints(firsts), ints(inverse), ints(counts)];
    out.truncate(n_out);
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// RotaryEmbedding
// ---------------------------------------------------------------------------------------------

fn rotary(
    cx: &EvalCtx,
    interleaved: bool,
    rotary_dim: usize,
    num_heads: usize,
) -> Result<Vec<Tensor>, OpError> {
    let x = cx.input(0)?;
    let (cos, sin) = (cx.input(1)?, cx.input(2)?);
    let pos = cx.opt_input(3);
    let s = x.shape();
    // (batch, seq, heads, head_size) and the strides of X along them.
    let (b, q, h, d, xs) = match *s {
        [b, h, q, d] => (b, q, h, d, [h * q * d, d, q * d, 1]),
        [b, q, hidden] => {
            if num_heads == 0 || hidden % num_heads != 0 {
                crate::bail!("3-D input needs num_heads dividing the hidden size {hidden}, got {num_heads}");
            }
            let d = hidden / num_heads;
            (b, q, num_heads, d, [q * hidden, hidden, d, 1])
        }
        _ => crate::bail!("X must be 3-D or 4-D, got {s:?}"),
    };
    let rd = if rotary_dim == 0 { d } else { rotary_dim };
    if rd > d || rd % 2 != 0 {
        crate::bail!("rotary_embedding_dim {rd} must be even and at most the head size {d}");
    }
    let half = rd / 2;
    // Row of the caches for each (batch, position).
    let rows: Vec<usize> = match pos {
        Some(p) => {
            if p.shape() != [b, q] {
                crate::bail!("position_ids must be [{b}, {q}], got {:?}", p.shape());
            }
            let max = cos.shape().first().copied().unwrap_or(0);
            let ids = p.to_i64_vec();
            if cos.rank() != 2 || ids.iter().any(|&i| i < 0 || i as usize >= max) {
                crate::bail!("position_ids must index the rows of a 2-D cache of {max} rows");
            }
            ids.into_iter().map(|i| i as usize).collect()
        }
        None => {
            if cos.rank() != 3 || cos.shape()[..2] != [b, q] {
                crate::bail!(
                    "without position_ids the caches must be [{b}, {q}, {half}], got {:?}",
                    cos.shape()
                );
            }
            (0..b * q).collect()
        }
    };
    if cos.shape() != sin.shape() || cos.shape().last() != Some(&half) {
        crate::bail!(
            "cos/sin caches {:?}/{:?} must end in rotary_dim/2 = {half}",
            cos.shape(),
            sin.shape()
        );
    }
    let (xv, cv, sv) = (x.to_f64_vec(), cos.to_f64_vec(), sin.to_f64_vec());
    let mut out = xv.clone();
    for bi in 0..b {
        for qi in 0..q {
            let row = rows[bi * q + qi] * half;
            for hi in 0..h {
                let base = bi * xs[0] + qi * xs[1] + hi * xs[2];
                for j in 0..half {
                    let (i1, i2) = if interleaved {
                        (2 * j, 2 * j + 1)
                    } else {
                        (j, j + half)
                    };
                    let (x1, x2) = (xv[base + i1], xv[base + i2]);
                    let (c, sn) = (cv[row + j], sv[row + j]);
                    out[base + i1] = c * x1 - sn * x2;
                    out[base + i2] = sn * x1 + c * x2;
                }
            }
        }
    }
    Ok(vec![floats(x.dtype(), s.to_vec(), out)?])
}

// ---------------------------------------------------------------------------------------------
// TensorScatter
// ---------------------------------------------------------------------------------------------

fn tensor_scatter(
    cache: &Tensor,
    update: &Tensor,
    write: Option<&Tensor>,
    circular: bool,
    axis: i64,
) -> Result<Vec<Tensor>, OpError> {
    let cs = cache.shape();
    let us = update.shape();
    let a = norm_axis(axis, cs.len())?;
    if a == 0 || us.len() != cs.len() || update.dtype() != cache.dtype() {
        crate::bail!("update {us:?} does not match cache {cs:?} along axis {a}");
    }
    if (0..cs.len()).any(|i| if i == a { us[i] > cs[i] } else { us[i] != cs[i] }) {
        crate::bail!("update {us:?} does not fit cache {cs:?} along axis {a}");
    }
    let write = match write {
        Some(w) => w.to_i64_vec(),
        None => vec![0; cs[0]],
    };
    if write.len() != cs[0] {
        crate::bail!(
            "write_indices has {} entries for a batch of {}",
            write.len(),
            cs[0]
        );
    }
    let max = cs[a] as i64;
    // Source of every cache element: `None` keeps the cache's own value.
    let mut src: Vec<Option<usize>> = vec![None; cache.len()];
    for uf in 0..update.len() {
        let mut coord = unravel(uf, us);
        // Saturating: an absurd write index must fail the range check, not overflow.
        let mut at = write[coord[0]].saturating_add(coord[a] as i64);
        if circular && max > 0 {
            at = at.rem_euclid(max);
        }
        if at < 0 || at >= max {
            crate::bail!("write position {at} is outside the cache's {max} slots");
        }
        coord[a] = at as usize;
        src[ravel(&coord, cs)] = Some(uf);
    }
    fn merge<T: Element>(c: &[T], u: &Tensor, src: &[Option<usize>]) -> Result<TensorData, OpError> {
        let Some(u) = u.as_slice::<T>() else {
            crate::bail!("update has a different dtype from the cache");
        };
        Ok(T::wrap(
            src.iter().zip(c).map(|(s, &v)| s.map_or(v, |i| u[i])).collect(),
        ))
    }
    let data = crate::with_data!(cache.data(), v => merge(v, update, &src)?);
    Ok(vec![make(cs.to_vec(), data)?])
}

// ---------------------------------------------------------------------------------------------
// Det
// ---------------------------------------------------------------------------------------------

fn det(x: &Tensor) -> Result<Vec<Tensor>, OpError> {
    let s = x.shape();
    let r = s.len();
    if r < 2 || s[r - 1] != s[r - 2] {
        crate::bail!("Det needs a [*, M, M] input, got {s:?}");
    }
    let m = s[r - 1];
    let v = x.to_f64_vec();
    let batch = product(&s[..r - 2]);
    let out: Vec<f64> = (0..batch)
        .map(|i| lu_det(&v[i * m * m..(i + 1) * m * m], m))
        .collect();
    Ok(vec![floats(x.dtype(), s[..r - 2].to_vec(), out)?])
}

/// Determinant by LU decomposition with partial pivoting.
fn lu_det(a: &[f64], m: usize) -> f64 {
    let mut a = a.to_vec();
    let mut det = 1.0;
    for c in 0..m {
        let p = (c..m)
            .max_by(|&i, &j| a[i * m + c].abs().total_cmp(&a[j * m + c].abs()))
            .unwrap_or(c);
        if a[p * m + c] == 0.0 {
            return 0.0;
        }
        if p != c {
            for k in 0..m {
                a.swap(p * m + k, c * m + k);
            }
            det = -det;
        }
        let piv = a[c * m + c];
        det *= piv;
        for i in c + 1..m {
            let f = a[i * m + c] / piv;
            for k in c..m {
                a[i * m + k] -= f * a[c * m + k];
            }
        }
    }
    det
}

// ---------------------------------------------------------------------------------------------
// NegativeLogLikelihoodLoss / SoftmaxCrossEntropyLoss
// ---------------------------------------------------------------------------------------------

fn infer_loss(reduction: LossReduction, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    let x = float_input(cx, 0, "input")?;
    let t = cx.ty(1)?;
    if x.rank() < 2 || t.rank() + 1 != x.rank() || !t.dtype.is_int() {
        crate::bail!("input must be [N, C, d...] and target [N, d...] (integer), got {x} and {t}");
    }
    if let Some(w) = cx.opt_ty(2) {
        if w.rank() != 1 || w.dtype != x.dtype {
            crate::bail!("weight must be a 1-D tensor of the input's dtype, got {w}");
        }
    }
    let loss = match reduction {
        LossReduction::None => t.shape.clone(),
        _ => vec![],
    };
    let mut out = vec![TensorType::new(x.dtype, loss)];
    if cx.num_outputs > 1 {
        out.push(x.clone());
    }
    Ok(out)
}

fn loss(
    cx: &EvalCtx,
    log_softmax: bool,
    reduction: LossReduction,
    ignore_index: Option<i64>,
) -> Result<Vec<Tensor>, OpError> {
    let x = cx.input(0)?;
    let target = cx.input(1)?;
    let s = x.shape();
    if s.len() < 2
        || target.shape().len() + 1 != s.len()
        || target.shape()[0] != s[0]
        || target.shape()[1..] != s[2..]
    {
        crate::bail!(
            "input {s:?} and target {:?} must be [N, C, d...] and [N, d...]",
            target.shape()
        );
    }
    let (n, c, d) = (s[0], s[1], product(&s[2..]));
    let mut xv = x.to_f64_vec();
    if log_softmax {
        log_softmax_axis1(&mut xv, n, c, d);
    }
    let weight = cx.opt_input(2).map(|w| w.to_f64_vec());
    if weight.as_ref().is_some_and(|w| w.len() != c) {
        crate::bail!("weight must have {c} entries");
    }
    let tv = target.to_i64_vec();
    let mut losses = vec![0.0; n * d];
    let mut wsum = 0.0;
    for ni in 0..n {
        for di in 0..d {
            let t = tv[ni * d + di];
            if Some(t) == ignore_index {
                continue;
            }
            if t < 0 || t as usize >= c {
                crate::bail!("target {t} is outside the {c} classes");
            }
            let w = weight.as_ref().map_or(1.0, |w| w[t as usize]);
            losses[ni * d + di] = -xv[(ni * c + t as usize) * d + di] * w;
            wsum += w;
        }
    }
    let (shape, vals) = match reduction {
        LossReduction::None => (target.shape().to_vec(), losses),
        LossReduction::Sum => (vec![], vec![losses.iter().sum()]),
        LossReduction::Mean => (vec![], vec![losses.iter().sum::<f64>() / wsum]),
    };
    let mut out = vec![floats(x.dtype(), shape, vals)?];
    if cx.num_outputs() > 1 {
        out.push(floats(x.dtype(), s.to_vec(), xv)?);
    }
    Ok(out)
}

/// In-place log-softmax over the class axis of `[n, c, d]`.
fn log_softmax_axis1(v: &mut [f64], n: usize, c: usize, d: usize) {
    for ni in 0..n {
        for di in 0..d {
            let at = |k: usize| (ni * c + k) * d + di;
            let max = (0..c).map(|k| v[at(k)]).fold(f64::NEG_INFINITY, f64::max);
            let lse = max + (0..c).map(|k| (v[at(k)] - max).exp()).sum::<f64>().ln();
            for k in 0..c {
                v[at(k)] -= lse;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn det_of_a_permutation_has_its_sign() {
        assert_eq!(lu_det(&[0.0, 1.0, 1.0, 0.0], 2), -1.0);
        assert!((lu_det(&[2.0, 1.0, 1.0, 3.0], 2) - 5.0).abs() < 1e-12);
    }

    #[test]
    fn unique_unsorted_keeps_first_occurrence_order() {
        let x = Tensor::from_vec(vec![6], vec![2.0f32, 1.0, 1.0, 3.0, 4.0, 3.0]);
        let r = unique(&x, false, None, 4).unwrap();
        assert_eq!(r[0], Tensor::from_vec(vec![4], vec![2.0f32, 1.0, 3.0, 4.0]));
        assert_eq!(r[1], Tensor::from_vec(vec![4], vec![0i64, 1, 3, 4]));
        assert_eq!(r[2], Tensor::from_vec(vec![6], vec![0i64, 1, 1, 2, 3, 2]));
        assert_eq!(r[3], Tensor::from_vec(vec![4], vec![1i64, 2, 2, 1]));
    }

    #[test]
    fn tensor_scatter_wraps_in_circular_mode_only() {
        let cache = Tensor::from_vec(vec![1, 3, 1], vec![0i64, 0, 0]);
        let upd = Tensor::from_vec(vec![1, 2, 1], vec![7i64, 8]);
        let w = Tensor::from_vec(vec![1], vec![2i64]);
        let r = tensor_scatter(&cache, &upd, Some(&w), true, -2).unwrap();
        assert_eq!(r[0], Tensor::from_vec(vec![1, 3, 1], vec![8i64, 0, 7]));
        assert!(tensor_scatter(&cache, &upd, Some(&w), false, -2).is_err());
        let huge = Tensor::from_vec(vec![1], vec![i64::MAX]);
        assert!(tensor_scatter(&cache, &upd, Some(&huge), false, -2).is_err());
    }

    #[test]
    fn compress_with_a_short_condition_keeps_leading_slices() {
        let x = Tensor::from_vec(vec![3, 2], vec![1u8, 2, 3, 4, 5, 6]);
        let c = Tensor::from_vec(vec![2], vec![false, true]);
        let r = compress(&x, &c, Some(0)).unwrap();
        assert_eq!(r[0], Tensor::from_vec(vec![1, 2], vec![3u8, 4]));
        let long = Tensor::from_vec(vec![4], vec![false, false, false, true]);
        assert!(compress(&x, &long, Some(0)).is_err());
    }

    #[test]
    fn reverse_sequence_rejects_long_sequences() {
        let x = Tensor::from_vec(vec![2, 2], vec![1i32, 2, 3, 4]);
        let l = Tensor::from_vec(vec![2], vec![3i64, 1]);
        assert!(reverse_sequence(&x, &l, 1, 0).is_err());
    }
}
