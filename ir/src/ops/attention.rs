//! ONNX Attention (opsets 23-25): scaled dot-product attention with grouped KV heads, masks,
//! causal and sliding-window masking, a KV cache, softcap and the optional QK output.
//!
//! Evaluation follows the ONNX reference implementation step by step. It computes in f64 and
//! rounds to the operator's dtype after every step the reference performs in that dtype
//! (scaling, QK product, softcap, bias, softmax, output product), so f16/bf16 results match the
//! reference's rounding and f32/f64 are unaffected.

use super::util::{check_alloc, fmt_dims};
use super::{EvalCtx, InferCtx};
use crate::{AttentionAttrs, DType, Dim, Element, Op, OpError, Tensor, TensorData, TensorType};

pub(crate) fn infer(op: &Op, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    let Op::Attention(a) = op else {
        crate::bail!("{} is not Attention", op.name());
    };
    let q = cx.ty(0)?;
    if !q.dtype.is_float() {
        crate::bail!("Q must be a float tensor, got {}", q.dtype);
    }
    for (i, name) in [(1, "K"), (2, "V"), (4, "past_key"), (5, "past_value")] {
        if let Some(t) = cx.opt_ty(i) {
            if t.dtype != q.dtype {
                crate::bail!("{name} has dtype {} but Q has {}", t.dtype, q.dtype);
            }
        }
    }
    if let Some(t) = cx.opt_ty(6) {
        if t.dtype != DType::I64 || t.rank() != 1 {
            crate::bail!("nonpad_kv_seqlen must be a 1-D i64 tensor, got {t}");
        }
    }
    let g = SymGeometry::new(a, cx)?;
    let mut out = vec![TensorType::new(q.dtype, g.y_shape())];
    let total = dim_add(&g.past, &g.skv);
    let four = |h: &Dim, s: &Dim, d: &Dim| vec![g.b.clone(), h.clone(), s.clone(), d.clone()];
    let extra = [
        four(&g.hkv, &total, &g.dk),
        four(&g.hkv, &total, &g.dv),
        four(&g.hq, &g.sq, &total),
    ];
    for shape in extra.into_iter().take(cx.num_outputs.saturating_sub(1)) {
        out.push(TensorType::new(q.dtype, shape));
    }
    if cx.num_outputs > 4 {
        crate::bail!(
            "Attention has at most 4 outputs, the node declares {}",
            cx.num_outputs
        );
    }
    Ok(out)
}

fn dim_add(a: &Dim, b: &Dim) -> Dim {
    match (a, b) {
        (Dim::Fixed(x), Dim::Fixed(y)) => Dim::Fixed(x + y),
        (Dim::Fixed(0), d) | (d, Dim::Fixed(0)) => d.clone(),
        _ => Dim::unknown(),
    }
}

fn dim_mul(a: &Dim, b: &Dim) -> Dim {
    match (a, b) {
        (Dim::Fixed(x), Dim::Fixed(y)) => Dim::Fixed(x * y),
        (Dim::Fixed(1), d) | (d, Dim::Fixed(1)) => d.clone(),
        _ => Dim::unknown(),
    }
}

/// `a / heads` for a 3-D hidden size; an error when it does not divide.
fn dim_div(a: &Dim, heads: usize, what: &str) -> Result<Dim, OpError> {
    match a {
        Dim::Fixed(x) if x % heads != 0 => {
            crate::bail!("{what} hidden size {x} is not divisible by {heads} heads")
        }
        Dim::Fixed(x) => Ok(Dim::Fixed(x / heads)),
        Dim::Sym(_) => Ok(Dim::unknown()),
    }
}

/// Two dims that must agree: the known one, or an error when both are known and differ.
fn unify(a: &Dim, b: &Dim, what: &str) -> Result<Dim, OpError> {
    match (a, b) {
        (Dim::Fixed(x), Dim::Fixed(y)) if x != y => crate::bail!("{what} differ: {x} and {y}"),
        (Dim::Fixed(_), _) => Ok(a.clone()),
        _ => Ok(b.clone()),
    }
}

/// The attention geometry from the input types.
struct SymGeometry {
    three_d: bool,
    b: Dim,
    hq: Dim,
    hkv: Dim,
    sq: Dim,
    skv: Dim,
    past: Dim,
    dk: Dim,
    dv: Dim,
}

impl SymGeometry {
    fn new(a: &AttentionAttrs, cx: &InferCtx) -> Result<SymGeometry, OpError> {
        let (q, k, v) = (cx.ty(0)?, cx.ty(1)?, cx.ty(2)?);
        if q.rank() != k.rank() || q.rank() != v.rank() || !(q.rank() == 3 || q.rank() == 4) {
            crate::bail!("Q, K and V must all be 3-D or all 4-D, got {q}, {k} and {v}");
        }
        let three_d = q.rank() == 3;
        let mut g = if three_d {
            if a.q_num_heads == 0 || a.kv_num_heads == 0 {
                crate::bail!("3-D inputs need the q_num_heads and kv_num_heads attributes");
            }
            let dk = dim_div(&q.shape[2], a.q_num_heads, "Q")?;
            let dkk = dim_div(&k.shape[2], a.kv_num_heads, "K")?;
            SymGeometry {
                three_d,
                b: q.shape[0].clone(),
                hq: Dim::Fixed(a.q_num_heads),
                hkv: Dim::Fixed(a.kv_num_heads),
                sq: q.shape[1].clone(),
                skv: unify(&k.shape[1], &v.shape[1], "K and V sequence lengths")?,
                past: Dim::Fixed(0),
                dk: unify(&dk, &dkk, "Q and K head sizes")?,
                dv: dim_div(&v.shape[2], a.kv_num_heads, "V")?,
            }
        } else {
            SymGeometry {
                three_d,
                b: q.shape[0].clone(),
                hq: q.shape[1].clone(),
                hkv: unify(&k.shape[1], &v.shape[1], "K and V head counts")?,
                sq: q.shape[2].clone(),
                skv: unify(&k.shape[2], &v.shape[2], "K and V sequence lengths")?,
                past: Dim::Fixed(0),
                dk: unify(&q.shape[3], &k.shape[3], "Q and K head sizes")?,
                dv: v.shape[3].clone(),
            }
        };
        g.b = unify(
            &g.b,
            &unify(&k.shape[0], &v.shape[0], "K and V batch sizes")?,
            "batch sizes",
        )?;
        if let (Dim::Fixed(hq), Dim::Fixed(hkv)) = (&g.hq, &g.hkv) {
            if *hkv == 0 || hq % hkv != 0 {
                crate::bail!("{hq} query heads cannot be grouped over {hkv} key/value heads");
            }
        }
        match (cx.opt_ty(4), cx.opt_ty(5)) {
            (None, None) => {}
            (Some(pk), Some(pv)) => {
                if cx.opt_ty(6).is_some() {
                    crate::bail!("nonpad_kv_seqlen cannot be combined with past_key/past_value");
                }
                if pk.rank() != 4 || pv.rank() != 4 {
                    crate::bail!("past_key and past_value must be 4-D, got {pk} and {pv}");
                }
                g.b = unify(
                    &g.b,
                    &unify(&pk.shape[0], &pv.shape[0], "past batch sizes")?,
                    "batch sizes",
                )?;
                g.hkv = unify(
                    &g.hkv,
                    &unify(&pk.shape[1], &pv.shape[1], "past head counts")?,
                    "KV heads",
                )?;
                g.past = unify(&pk.shape[2], &pv.shape[2], "past sequence lengths")?;
                g.dk = unify(&g.dk, &pk.shape[3], "past_key head size")?;
                g.dv = unify(&g.dv, &pv.shape[3], "past_value head size")?;
            }
            _ => crate::bail!("past_key and past_value must be given together"),
        }
        if let Some(m) = cx.opt_ty(3) {
            let total = dim_add(&g.past, &g.skv);
            check_mask_type(m, &[g.b.clone(), g.hq.clone(), g.sq.clone(), total])?;
        }
        Ok(g)
    }

    fn y_shape(&self) -> Vec<Dim> {
        if self.three_d {
            vec![self.b.clone(), self.sq.clone(), dim_mul(&self.hq, &self.dv)]
        } else {
            vec![self.b.clone(), self.hq.clone(), self.sq.clone(), self.dv.clone()]
        }
    }
}

/// The mask broadcasts (right-aligned) to `[B, Hq, Sq, total]`; its last axis may be shorter
/// than `total` (it is padded with "masked").
fn check_mask_type(m: &TensorType, full: &[Dim]) -> Result<(), OpError> {
    if m.rank() == 0 || m.rank() > 4 {
        crate::bail!("attn_mask must have rank 1 to 4, got {m}");
    }
    let off = 4 - m.rank();
    for (i, d) in m.shape.iter().enumerate() {
        let want = &full[off + i];
        let ok = match (d, want) {
            (Dim::Fixed(x), Dim::Fixed(y)) if off + i == 3 => x <= y,
            (Dim::Fixed(x), Dim::Fixed(y)) => *x == 1 || x == y,
            _ => true,
        };
        if !ok {
            crate::bail!("attn_mask {m} does not broadcast to {}", fmt_dims(full));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Evaluation
// ---------------------------------------------------------------------------------------------

/// Concrete geometry.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    b: usize,
    hq: usize,
    hkv: usize,
    sq: usize,
    skv: usize,
    past: usize,
    dk: usize,
    dv: usize,
}

impl Geometry {
    fn total(&self) -> usize {
        self.past + self.skv
    }
}

/// Rounding to a float dtype, as f64.
fn rounder(d: DType) -> fn(f64) -> f64 {
    match d {
        DType::F16 => |v| crate::tensor::f16_from_f64(v).to_f64(),
        DType::BF16 => |v| crate::tensor::bf16_from_f64(v).to_f64(),
        DType::F32 => |v| v as f32 as f64,
        _ => |v| v,
    }
}

/// Values laid out `[B, H, S, D]`, with that shape.
type Heads = (Vec<f64>, [usize; 4]);

/// A 3-D `[B, S, H*D]` tensor as 4-D `[B, H, S, D]` values (or a 4-D tensor as is).
fn heads_first(t: &Tensor, heads: usize) -> Result<Heads, OpError> {
    let v = t.to_f64_vec();
    match *t.shape() {
        [b, h, s, d] => Ok((v, [b, h, s, d])),
        [b, s, hd] => {
            if heads == 0 || hd % heads != 0 {
                crate::bail!("hidden size {hd} is not divisible by {heads} heads");
            }
            let d = hd / heads;
            let mut out = Vec::with_capacity(v.len());
            for bi in 0..b {
                for h in 0..heads {
                    for si in 0..s {
                        let base = (bi * s + si) * hd + h * d;
                        out.extend_from_slice(&v[base..base + d]);
                    }
                }
            }
            Ok((out, [b, heads, s, d]))
        }
        _ => crate::bail!("Q, K and V must be 3-D or 4-D, got shape {:?}", t.shape()),
    }
}

/// `past ++ new` along the sequence axis of `[B, H, S, D]` values.
fn concat_seq(
    past: Option<(&[f64], [usize; 4])>,
    new: &[f64],
    shape: [usize; 4],
) -> Result<Vec<f64>, OpError> {
    let Some((pv, ps)) = past else {
        return Ok(new.to_vec());
    };
    let [b, h, s, d] = shape;
    if ps[0] != b || ps[1] != h || ps[3] != d {
        crate::bail!("past shape {ps:?} does not fit the current shape {shape:?}");
    }
    let p = ps[2];
    let mut out = Vec::with_capacity(pv.len() + new.len());
    for bh in 0..b * h {
        out.extend_from_slice(&pv[bh * p * d..(bh + 1) * p * d]);
        out.extend_from_slice(&new[bh * s * d..(bh + 1) * s * d]);
    }
    Ok(out)
}

/// The additive mask term at `(b, h, i, j)`: a float mask's value, 0 / -inf for a bool mask
/// (and for the padding of a short last axis), 0 without a mask.
struct Mask {
    vals: Vec<f64>,
    /// Strides into `vals` for `[B, H, Sq, len]` (0 where broadcast).
    strides: [usize; 4],
    len: usize,
    is_bool: bool,
}

impl Mask {
    fn new(m: &Tensor, g: &Geometry) -> Result<Mask, OpError> {
        let rank = m.rank();
        if rank == 0 || rank > 4 {
            crate::bail!("attn_mask must have rank 1 to 4, got shape {:?}", m.shape());
        }
        let mut shape = [1usize; 4];
        shape[4 - rank..].copy_from_slice(m.shape());
        let full = [g.b, g.hq, g.sq, g.total()];
        if shape[3] > full[3] {
            crate::bail!(
                "attn_mask's last axis {} is longer than the key sequence {}",
                shape[3],
                full[3]
            );
        }
        let mut strides = [0usize; 4];
        let mut acc = 1;
        for ax in (0..4).rev() {
            if ax < 3 && shape[ax] != 1 && shape[ax] != full[ax] {
                crate::bail!("attn_mask {:?} does not broadcast to {full:?}", m.shape());
            }
            strides[ax] = if shape[ax] == 1 && ax < 3 { 0 } else { acc };
            acc *= shape[ax];
        }
        Ok(Mask {
            vals: m.to_f64_vec(),
            strides,
            len: shape[3],
            is_bool: m.dtype() == DType::Bool,
        })
    }

    fn at(&self, b: usize, h: usize, i: usize, j: usize) -> f64 {
        if j >= self.len {
            return f64::NEG_INFINITY;
        }
        let s = &self.strides;
        let v = self.vals[b * s[0] + h * s[1] + i * s[2] + j * s[3]];
        match (self.is_bool, v != 0.0) {
            (true, true) => 0.0,
            (true, false) => f64::NEG_INFINITY,
            (false, _) => v,
        }
    }
}

/// Everything that builds the additive bias of one score.
struct Bias<'a> {
    a: &'a AttentionAttrs,
    mask: Option<Mask>,
    nonpad: Option<Vec<i64>>,
    past: usize,
    has_past: bool,
    sq: usize,
}

impl Bias<'_> {
    /// Keys before the query block for batch `b` (the causal/window diagonal's offset).
    fn offset(&self, b: usize) -> i64 {
        match (&self.nonpad, self.has_past) {
            (Some(n), false) => n[b].saturating_sub(self.sq as i64),
            _ => self.past as i64,
        }
    }

    fn at(&self, b: usize, h: usize, i: usize, j: usize) -> f64 {
        let mut v = self.mask.as_ref().map_or(0.0, |m| m.at(b, h, i, j));
        let (i, j) = (i as i64, j as i64);
        // Saturating: nonpad_kv_seqlen is model data and may be absurd.
        let pos = i.saturating_add(self.offset(b));
        if self.a.is_causal && j > pos {
            v += f64::NEG_INFINITY;
        }
        let (left, right) = (self.a.left_window_size, self.a.right_window_size);
        if (left >= 0 && pos.saturating_sub(j) > left) || (right >= 0 && j.saturating_sub(pos) > right) {
            v += f64::NEG_INFINITY;
        }
        if let Some(n) = &self.nonpad {
            if j >= n[b] {
                v += f64::NEG_INFINITY;
            }
        }
        v
    }
}

pub(crate) fn eval(op: &Op, cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let Op::Attention(a) = op else {
        crate::bail!("{} is not Attention", op.name());
    };
    let (q, k, v) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
    let dtype = q.dtype();
    if !dtype.is_float() || k.dtype() != dtype || v.dtype() != dtype {
        crate::bail!("Q, K and V must share one float dtype");
    }
    if q.rank() != k.rank() || q.rank() != v.rank() {
        crate::bail!("Q, K and V must have the same rank");
    }
    let three_d = q.rank() == 3;
    let (qv, qs) = heads_first(q, a.q_num_heads)?;
    let (kv, ks) = heads_first(k, a.kv_num_heads)?;
    let (vv, vs) = heads_first(v, a.kv_num_heads)?;
    let (past_k, past_v) = (cx.opt_input(4), cx.opt_input(5));
    let nonpad = cx.opt_input(6);
    if past_k.is_some() != past_v.is_some() {
        crate::bail!("past_key and past_value must be given together");
    }
    if past_k.is_some() && nonpad.is_some() {
        crate::bail!("nonpad_kv_seqlen cannot be combined with past_key/past_value");
    }
    let load_past = |t: Option<&Tensor>| -> Result<Option<Heads>, OpError> {
        match t {
            None => Ok(None),
            Some(t) if t.rank() == 4 && t.dtype() == dtype => {
                let s = t.shape();
                Ok(Some((t.to_f64_vec(), [s[0], s[1], s[2], s[3]])))
            }
            Some(t) => crate::bail!("past key/value must be 4-D {dtype}, got {:?}", t.shape()),
        }
    };
    let (pk, pv) = (load_past(past_k)?, load_past(past_v)?);
    let past = pk.as_ref().map_or(0, |p| p.1[2]);
    if pv.as_ref().is_some_and(|p| p.1[2] != past) {
        crate::bail!("past_key and past_value have different sequence lengths");
    }
    let g = Geometry {
        b: qs[0],
        hq: qs[1],
        hkv: ks[1],
        sq: qs[2],
        skv: ks[2],
        past,
        dk: qs[3],
        dv: vs[3],
    };
    if ks[0] != g.b || vs[0] != g.b || vs[1] != g.hkv || vs[2] != g.skv || ks[3] != g.dk {
        crate::bail!("Q {qs:?}, K {ks:?} and V {vs:?} (as [batch, heads, seq, head size]) do not fit");
    }
    if g.hkv == 0 || !g.hq.is_multiple_of(g.hkv) {
        crate::bail!(
            "{} query heads cannot be grouped over {} key/value heads",
            g.hq,
            g.hkv
        );
    }
    check_alloc(&[g.b, g.hq, g.sq, g.total()])?;
    let present_k = concat_seq(pk.as_ref().map(|(v, s)| (&v[..], *s)), &kv, ks)?;
    let present_v = concat_seq(pv.as_ref().map(|(v, s)| (&v[..], *s)), &vv, vs)?;
    let nonpad = match nonpad {
        None => None,
        Some(t) if t.dtype() == DType::I64 && t.len() == g.b => Some(t.to_i64_vec()),
        Some(t) => crate::bail!("nonpad_kv_seqlen must be i64 [{}], got {:?}", g.b, t.shape()),
    };
    let bias = Bias {
        a,
        mask: cx.opt_input(3).map(|m| Mask::new(m, &g)).transpose()?,
        nonpad,
        past,
        has_past: pk.is_some(),
        sq: g.sq,
    };
    let bias_dtype = match cx.opt_input(3).map(|m| m.dtype()) {
        Some(m) if m.is_float() => promote(dtype, m),
        _ => dtype,
    };
    let (y, qk) = attend(a, &g, dtype, bias_dtype, &qv, &present_k, &present_v, &bias)?;

    let y = if three_d { heads_last(&y, &g) } else { y };
    let y_shape = if three_d {
        vec![g.b, g.sq, g.hq * g.dv]
    } else {
        vec![g.b, g.hq, g.sq, g.dv]
    };
    let mut outs = vec![to_tensor(dtype, y_shape, &y)?];
    let t = g.total();
    let extra = [
        (vec![g.b, g.hkv, t, g.dk], present_k),
        (vec![g.b, g.hkv, t, g.dv], present_v),
        (vec![g.b, g.hq, g.sq, t], qk),
    ];
    for (shape, vals) in extra.into_iter().take(cx.num_outputs().saturating_sub(1)) {
        outs.push(to_tensor(dtype, shape, &vals)?);
    }
    Ok(outs)
}

/// `[B, H, S, D]` back to `[B, S, H*D]`.
fn heads_last(y: &[f64], g: &Geometry) -> Vec<f64> {
    let mut out = Vec::with_capacity(y.len());
    for b in 0..g.b {
        for s in 0..g.sq {
            for h in 0..g.hq {
                let base = ((b * g.hq + h) * g.sq + s) * g.dv;
                out.extend_from_slice(&y[base..base + g.dv]);
            }
        }
    }
    out
}

fn to_tensor(dtype: DType, shape: Vec<usize>, vals: &[f64]) -> Result<Tensor, OpError> {
    fn conv<T: Element>(v: &[f64]) -> TensorData {
        T::wrap(v.iter().map(|&x| T::from_f64(x)).collect())
    }
    let data = crate::dispatch_dtype!(dtype, T => conv::<T>(vals));
    Tensor::new(shape, data).map_err(|e| OpError::new(e.to_string()))
}

/// The softmax of one row as the reference computes it: a row whose maximum is -inf (fully
/// masked) gives zeros instead of NaN. `r` rounds to the softmax precision.
fn softmax_row(row: &mut [f64], r: fn(f64) -> f64) {
    let max = row.iter().fold(f64::NEG_INFINITY, |m, &x| {
        if x.is_nan() || m.is_nan() {
            f64::NAN
        } else {
            m.max(x)
        }
    });
    let safe_max = if max == f64::NEG_INFINITY { 0.0 } else { max };
    for x in row.iter_mut() {
        *x = r(r(*x - safe_max).exp());
    }
    let sum = r(row.iter().sum::<f64>());
    let sum = if sum == 0.0 { 1.0 } else { sum };
    for x in row.iter_mut() {
        *x = r(*x / sum);
    }
}

/// The wider of two float dtypes, as numpy promotes them (f16 with bf16 gives f32): the dtype
/// Attention's softmax input and additive bias are built in.
pub fn promote(a: DType, b: DType) -> DType {
    match (a, b) {
        _ if a == b => a,
        (DType::F64, _) | (_, DType::F64) => DType::F64,
        _ => DType::F32,
    }
}

/// Returns `Y` as `[B, Hq, Sq, Dv]` and the requested QK output `[B, Hq, Sq, total]`.
/// `bias_dtype` is the dtype the additive bias is built in (the mask's when it is a wider
/// float than the operator's).
#[allow(clippy::too_many_arguments)]
fn attend(
    a: &AttentionAttrs,
    g: &Geometry,
    dtype: DType,
    bias_dtype: DType,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    bias: &Bias,
) -> Result<(Vec<f64>, Vec<f64>), OpError> {
    // The dtype each stage computes in, as the reference's numpy promotions give it: the QK
    // product in the operator's dtype, softcap against an f32 attribute (so at least f32),
    // the bias in the wider of that and the mask, softmax in `softmax_precision` if given.
    let r = rounder(dtype);
    let capped_dtype = if a.softcap > 0.0 {
        promote(dtype, DType::F32)
    } else {
        dtype
    };
    let rc = rounder(capped_dtype);
    let biased_dtype = promote(capped_dtype, bias_dtype);
    let rb = rounder(biased_dtype);
    let rs = rounder(a.softmax_precision.unwrap_or(biased_dtype));
    // Q and K are each scaled by sqrt(scale), rounded to the operator's dtype; the square root
    // of a given (f32) scale is taken in f32.
    let s = r(match a.scale {
        Some(s) => s.sqrt() as f64,
        None => (1.0 / (g.dk as f64).sqrt()).sqrt(),
    });
    let qs: Vec<f64> = q.iter().map(|&x| r(x * s)).collect();
    let ks: Vec<f64> = k.iter().map(|&x| r(x * s)).collect();
    let t = g.total();
    let reps = g.hq / g.hkv;
    let mut y = vec![0.0; g.b * g.hq * g.sq * g.dv];
    let mut qk_out = vec![0.0; g.b * g.hq * g.sq * t];
    let mut row = vec![0.0; t];
    for b in 0..g.b {
        for h in 0..g.hq {
            let kh = h / reps;
            let kbase = (b * g.hkv + kh) * t;
            for i in 0..g.sq {
                let qrow = &qs[((b * g.hq + h) * g.sq + i) * g.dk..][..g.dk];
                let out_row = ((b * g.hq + h) * g.sq + i) * t;
                let mut all_masked = true;
                for (j, score) in row.iter_mut().enumerate() {
                    let krow = &ks[(kbase + j) * g.dk..][..g.dk];
                    let raw = r(qrow.iter().zip(krow).map(|(x, y)| x * y).sum::<f64>());
                    let capped = softcap(raw, a.softcap, rc);
                    let bv = bias.at(b, h, i, j);
                    // The bias decides full masking, not the (possibly NaN) scores.
                    all_masked &= bv == f64::NEG_INFINITY;
                    let with_bias = rb(capped + bv);
                    qk_out[out_row + j] = match a.qk_matmul_output_mode {
                        0 => raw,
                        1 => r(capped),
                        _ => r(with_bias),
                    };
                    *score = rs(with_bias);
                }
                softmax_row(&mut row, rs);
                if all_masked {
                    row.fill(0.0);
                }
                for (j, p) in row.iter_mut().enumerate() {
                    *p = r(*p);
                    if a.qk_matmul_output_mode == 3 {
                        qk_out[out_row + j] = *p;
                    }
                }
                let yrow = &mut y[((b * g.hq + h) * g.sq + i) * g.dv..][..g.dv];
                for (j, &p) in row.iter().enumerate() {
                    let vrow = &v[(kbase + j) * g.dv..][..g.dv];
                    for (o, &x) in yrow.iter_mut().zip(vrow) {
                        *o += p * x;
                    }
                }
                yrow.iter_mut().for_each(|o| *o = r(*o));
            }
        }
    }
    Ok((y, qk_out))
}

/// `c * tanh(x / c)` in the operator's dtype; no capping when `c <= 0`.
fn softcap(x: f64, c: f32, r: fn(f64) -> f64) -> f64 {
    if c > 0.0 {
        let c = c as f64;
        r(r(r(x / c).tanh()) * c)
    } else {
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs() -> AttentionAttrs {
        AttentionAttrs::default()
    }

    fn run(a: AttentionAttrs, inputs: Vec<Option<&Tensor>>, outs: usize) -> Vec<Tensor> {
        let out_types = vec![TensorType::fixed(DType::F64, &[]); outs];
        let cx = EvalCtx {
            inputs,
            out_types: &out_types,
        };
        eval(&Op::Attention(a), &cx).unwrap()
    }

    #[test]
    fn causal_single_head_by_hand() {
        // One head, head size 1, Q = K = 0: uniform weights over the visible keys.
        let q = Tensor::from_vec(vec![1, 1, 2, 1], vec![0.0f64, 0.0]);
        let v = Tensor::from_vec(vec![1, 1, 2, 1], vec![2.0f64, 4.0]);
        let mut a = attrs();
        a.is_causal = true;
        let y = run(a, vec![Some(&q), Some(&q), Some(&v)], 1);
        assert_eq!(y[0].to_f64_vec(), vec![2.0, 3.0]);
    }

    #[test]
    fn fully_masked_rows_are_zero() {
        let q = Tensor::from_vec(vec![1, 1, 2, 1], vec![1.0f64, 1.0]);
        let v = Tensor::from_vec(vec![1, 1, 2, 1], vec![2.0f64, 4.0]);
        let mask = Tensor::from_vec(vec![2, 2], vec![false, false, true, false]);
        let mut a = attrs();
        a.qk_matmul_output_mode = 3;
        let y = run(a, vec![Some(&q), Some(&q), Some(&v), Some(&mask)], 4);
        assert_eq!(y[0].to_f64_vec(), vec![0.0, 2.0]);
        assert_eq!(y[3].to_f64_vec(), vec![0.0, 0.0, 1.0, 0.0]);
    }

    #[test]
    fn qk_output_modes_follow_the_pipeline() {
        // One query, two keys, head size 1, scale 1: logits q*k = [4, -4]; softcap 2 gives
        // 2*tanh(2) and -2*tanh(2); the float mask adds [0, -1].
        let q = Tensor::from_vec(vec![1, 1, 1, 1], vec![2.0f64]);
        let k = Tensor::from_vec(vec![1, 1, 2, 1], vec![2.0f64, -2.0]);
        let mask = Tensor::from_vec(vec![2], vec![0.0f64, -1.0]);
        let capped = 2.0 * 2.0f64.tanh();
        let expected = [
            vec![4.0, -4.0],
            vec![capped, -capped],
            vec![capped, -capped - 1.0],
        ];
        for (mode, want) in expected.iter().enumerate() {
            let mut a = attrs();
            a.scale = Some(1.0);
            a.softcap = 2.0;
            a.qk_matmul_output_mode = mode as i64;
            let y = run(a, vec![Some(&q), Some(&k), Some(&k), Some(&mask)], 4);
            let got = y[3].to_f64_vec();
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() < 1e-12, "mode {mode}: {got:?} vs {want:?}");
            }
        }
    }

    #[test]
    fn grouped_heads_share_kv() {
        // Two query heads over one KV head; Q = 0 so each head averages V.
        let q = Tensor::from_vec(vec![1, 2, 1, 1], vec![0.0f64, 0.0]);
        let k = Tensor::from_vec(vec![1, 1, 2, 1], vec![1.0f64, 2.0]);
        let v = Tensor::from_vec(vec![1, 1, 2, 1], vec![2.0f64, 4.0]);
        let y = run(attrs(), vec![Some(&q), Some(&k), Some(&v)], 1);
        assert_eq!(y[0].shape(), &[1, 2, 1, 1]);
        assert_eq!(y[0].to_f64_vec(), vec![3.0, 3.0]);
    }

    #[test]
    fn sliding_window_limits_keys() {
        let q = Tensor::from_vec(vec![1, 1, 3, 1], vec![0.0f64; 3]);
        let v = Tensor::from_vec(vec![1, 1, 3, 1], vec![1.0f64, 2.0, 6.0]);
        let mut a = attrs();
        a.left_window_size = 0;
        a.right_window_size = 0;
        let y = run(a, vec![Some(&q), Some(&q), Some(&v)], 1);
        assert_eq!(y[0].to_f64_vec(), vec![1.0, 2.0, 6.0]);
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use crate::ops::{self, InferCtx};

    use crate::ops::util::TestRng as Rng;

    fn tensor(shape: Vec<usize>, dtype: DType) -> Tensor {
        let n: usize = shape.iter().product();
        let vals = (0..n).map(|i| ((i * 7) % 5) as f64 * 0.25 - 0.5);
        Tensor::new(shape, TensorData::from_f64s(dtype, vals)).unwrap()
    }

    /// Random geometries, masks, caches and attributes (valid or not) never panic, and when
    /// inference and evaluation both succeed they agree on every output type.
    #[test]
    fn random_attention_never_panics_and_infer_matches_eval() {
        let mut rng = Rng(0xdeadbeefcafef00d);
        let mut agreed = 0;
        for _ in 0..3000 {
            let dtype = [DType::F32, DType::F16, DType::F64][rng.below(3) as usize];
            let b = rng.below(3) as usize;
            let hkv = rng.below(3) as usize + 1;
            let hq = hkv * (rng.below(3) as usize + 1) + (rng.below(8) == 0) as usize;
            let (sq, skv, dk, dv) = (
                rng.below(4) as usize,
                rng.below(4) as usize,
                rng.below(3) as usize + 1,
                rng.below(3) as usize + 1,
            );
            let three_d = rng.below(2) == 0;
            let mut a = AttentionAttrs {
                is_causal: rng.below(2) == 0,
                q_num_heads: 0,
                kv_num_heads: 0,
                qk_matmul_output_mode: rng.below(4) as i64,
                scale: (rng.below(2) == 0).then_some(0.3),
                softcap: [0.0, 0.5, 2.0][rng.below(3) as usize],
                softmax_precision: (rng.below(3) == 0).then_some(DType::F32),
                left_window_size: rng.below(4) as i64 - 1,
                right_window_size: rng.below(4) as i64 - 1,
            };
            let mut ins: Vec<Option<Tensor>> = if three_d {
                a.q_num_heads = hq;
                a.kv_num_heads = hkv;
                vec![
                    Some(tensor(vec![b, sq, hq * dk], dtype)),
                    Some(tensor(vec![b, skv, hkv * dk], dtype)),
                    Some(tensor(vec![b, skv, hkv * dv], dtype)),
                ]
            } else {
                vec![
                    Some(tensor(vec![b, hq, sq, dk], dtype)),
                    Some(tensor(vec![b, hkv, skv, dk], dtype)),
                    Some(tensor(vec![b, hkv, skv, dv], dtype)),
                ]
            };
            let past = if rng.below(3) == 0 {
                rng.below(3) as usize
            } else {
                0
            };
            let total = past + skv;
            ins.push((rng.below(2) == 0).then(|| {
                let rank = rng.below(4) as usize + 1;
                let full = [b, hq, sq, total];
                let shape = (4 - rank..4)
                    .map(|ax| match rng.below(4) {
                        0 => 1,
                        1 if ax == 3 => full[ax].saturating_sub(1),
                        3 => full[ax] + 1,
                        _ => full[ax],
                    })
                    .collect();
                tensor(shape, if rng.below(2) == 0 { DType::Bool } else { dtype })
            }));
            if past > 0 || rng.below(8) == 0 {
                ins.push(Some(tensor(vec![b, hkv, past, dk], dtype)));
                ins.push(Some(tensor(vec![b, hkv, past, dv], dtype)));
            } else {
                ins.push(None);
                ins.push(None);
            }
            if rng.below(3) == 0 {
                let lens: Vec<i64> = (0..b).map(|_| rng.below(6) as i64 - 2).collect();
                ins.push(Some(Tensor::from_vec(vec![lens.len()], lens)));
            }
            let outs = rng.below(4) as usize + 1;
            let op = Op::Attention(a);
            let types: Vec<Option<TensorType>> =
                ins.iter().map(|t| t.as_ref().map(|t| t.tensor_type())).collect();
            let icx = InferCtx {
                inputs: types.iter().map(|t| t.as_ref()).collect(),
                values: vec![None; ins.len()],
                num_outputs: outs,
            };
            let inferred = ops::infer(&op, &icx);
            let out_types = vec![TensorType::scalar(dtype); outs];
            let ecx = EvalCtx {
                inputs: ins.iter().map(|t| t.as_ref()).collect(),
                out_types: &out_types,
            };
            match (inferred, ops::eval(&op, &ecx)) {
                (Ok(t), Ok(v)) => {
                    let got: Vec<TensorType> = v.iter().map(|x| x.tensor_type()).collect();
                    assert_eq!(t, got, "{op:?} on {types:?}");
                    agreed += 1;
                }
                (Ok(t), Err(e)) => panic!("{op:?} on {types:?}: inferred {t:?} but evaluation failed: {e}"),
                _ => {}
            }
        }
        assert!(agreed > 500, "only {agreed} valid cases were generated");
    }
}
