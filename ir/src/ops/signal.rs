//! The signal-processing operators: DFT, STFT, window functions and the mel filter bank.
//!
//! Complex values are a trailing dimension of size 2 (real, imaginary), as in ONNX; a real
//! signal has a trailing dimension of size 1. All arithmetic is in f64 and rounded once to the
//! output dtype.

use super::util::check_alloc;
use super::{EvalCtx, InferCtx};
use crate::{DType, Dim, Op, OpError, Tensor, TensorData, TensorType};
use std::f64::consts::PI;
use std::ops::{Add, Mul};

/// The signal-processing operators.
#[derive(Clone, PartialEq, Debug)]
pub enum SignalOp {
    /// Inputs: input `[..., 1|2]` (float), dft_length? (int scalar), axis? (i64 scalar, default
    /// -2, range `[-r, -2] ∪ [0, r-2]`). Output: complex `[..., 2]` with the axis of extent
    /// dft_length (`dft_length/2 + 1` for the forward one-sided transform), or for the IRFFT
    /// (`inverse && onesided`) the real signal `[..., 1]` of extent dft_length, whose default
    /// is then `2 * (n - 1)`.
    Dft { inverse: bool, onesided: bool },
    /// Inputs: signal `[batch, length, 1|2]` (float), frame_step (int scalar), window?
    /// `[frame_length]` (float), frame_length? (int scalar). Output: `[batch, frames, bins, 2]`
    /// with `frames = (length - frame_length) / frame_step + 1` and `bins = frame_length / 2 + 1`
    /// when one-sided, else frame_length.
    Stft { onesided: bool },
    /// Inputs: size (int scalar). Output: `[size]` of `dtype`.
    HannWindow { periodic: bool, dtype: DType },
    /// Inputs: size (int scalar). Output: `[size]` of `dtype`.
    HammingWindow { periodic: bool, dtype: DType },
    /// Inputs: size (int scalar). Output: `[size]` of `dtype`.
    BlackmanWindow { periodic: bool, dtype: DType },
    /// Inputs: num_mel_bins, dft_length, sample_rate (int scalars), lower_edge_hertz,
    /// upper_edge_hertz (float scalars). Output: `[dft_length/2 + 1, num_mel_bins]` of `dtype`.
    MelWeightMatrix { dtype: DType },
}

impl SignalOp {
    pub fn name(&self) -> &'static str {
        match self {
            SignalOp::Dft { .. } => "DFT",
            SignalOp::Stft { .. } => "STFT",
            SignalOp::HannWindow { .. } => "HannWindow",
            SignalOp::HammingWindow { .. } => "HammingWindow",
            SignalOp::BlackmanWindow { .. } => "BlackmanWindow",
            SignalOp::MelWeightMatrix { .. } => "MelWeightMatrix",
        }
    }
}

pub(crate) fn infer(op: &Op, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    let Op::Signal(op) = op else {
        crate::bail!("{} is not in the signal family", op.name())
    };
    let ty = match *op {
        SignalOp::Dft { inverse, onesided } => infer_dft(cx, inverse, onesided)?,
        SignalOp::Stft { onesided } => infer_stft(cx, onesided)?,
        SignalOp::HannWindow { dtype, .. }
        | SignalOp::HammingWindow { dtype, .. }
        | SignalOp::BlackmanWindow { dtype, .. } => infer_window(cx, dtype)?,
        SignalOp::MelWeightMatrix { dtype } => infer_mel(cx, dtype)?,
    };
    Ok(vec![ty])
}

pub(crate) fn eval(op: &Op, cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let Op::Signal(op) = op else {
        crate::bail!("{} is not in the signal family", op.name())
    };
    let t = match *op {
        SignalOp::Dft { inverse, onesided } => eval_dft(cx, inverse, onesided)?,
        SignalOp::Stft { onesided } => eval_stft(cx, onesided)?,
        SignalOp::HannWindow { periodic, dtype } => eval_window(cx, periodic, dtype, hann)?,
        SignalOp::HammingWindow { periodic, dtype } => eval_window(cx, periodic, dtype, hamming)?,
        SignalOp::BlackmanWindow { periodic, dtype } => eval_window(cx, periodic, dtype, blackman)?,
        SignalOp::MelWeightMatrix { dtype } => eval_mel(cx, dtype)?,
    };
    Ok(vec![t])
}

// ---------------------------------------------------------------------------------------------
// Scalar inputs

/// Checks that input `i` is an int32/int64 scalar (a one-element 1-D tensor is accepted too).
fn check_int_scalar(cx: &InferCtx, i: usize, what: &str) -> Result<(), OpError> {
    if let Some(t) = cx.opt_ty(i) {
        check_scalar_type(t, what)?;
        if !matches!(t.dtype, DType::I32 | DType::I64) {
            crate::bail!("{what} must be int32 or int64, got {}", t.dtype);
        }
    }
    Ok(())
}

fn check_scalar_type(t: &TensorType, what: &str) -> Result<(), OpError> {
    let ok = match t.rank() {
        0 => true,
        1 => !matches!(t.shape[0], Dim::Fixed(n) if n != 1),
        _ => false,
    };
    if !ok {
        crate::bail!(
            "{what} must be a scalar, got shape {}",
            super::util::fmt_dims(&t.shape)
        );
    }
    Ok(())
}

/// The known value of the integer scalar input `i`, if any.
fn known_int(cx: &InferCtx, i: usize) -> Option<i64> {
    let t = cx.value(i)?;
    if t.len() != 1 || !t.dtype().is_int() {
        return None;
    }
    t.to_i64_vec().first().copied()
}

/// The value of a one-element integer input.
fn int_scalar(t: &Tensor, what: &str) -> Result<i64, OpError> {
    if !t.dtype().is_int() {
        crate::bail!("{what} must be an integer, got {}", t.dtype());
    }
    match t.to_i64_vec().as_slice() {
        [v] => Ok(*v),
        _ => crate::bail!("{what} must be a scalar, got shape {:?}", t.shape()),
    }
}

/// The value of a one-element float input, as f64.
fn float_scalar(t: &Tensor, what: &str) -> Result<f64, OpError> {
    if !t.dtype().is_float() {
        crate::bail!("{what} must be a float, got {}", t.dtype());
    }
    match t.to_f64_vec().as_slice() {
        [v] => Ok(*v),
        _ => crate::bail!("{what} must be a scalar, got shape {:?}", t.shape()),
    }
}

fn make(shape: Vec<usize>, data: TensorData) -> Result<Tensor, OpError> {
    Tensor::new(shape, data).map_err(|e| OpError::new(e.to_string()))
}

/// A non-negative length as `usize`.
fn to_len(v: i64, what: &str) -> Result<usize, OpError> {
    match usize::try_from(v) {
        Ok(n) => Ok(n),
        Err(_) => crate::bail!("{what} must not be negative, got {v}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Complex arithmetic and the FFT

#[derive(Clone, Copy, Default, PartialEq, Debug)]
struct C {
    re: f64,
    im: f64,
}

impl C {
    const ZERO: C = C { re: 0.0, im: 0.0 };

    fn new(re: f64, im: f64) -> C {
        C { re, im }
    }

    fn conj(self) -> C {
        C::new(self.re, -self.im)
    }
}

impl Add for C {
    type Output = C;
    fn add(self, o: C) -> C {
        C::new(self.re + o.re, self.im + o.im)
    }
}

impl Mul for C {
    type Output = C;
    fn mul(self, o: C) -> C {
        C::new(self.re * o.re - self.im * o.im, self.re * o.im + self.im * o.re)
    }
}

/// A discrete Fourier transform of one length, forward or inverse (scaled by `1/n`).
///
/// Lengths that factor are split recursively (mixed-radix Cooley-Tukey: a power of two runs
/// as radix-2); a prime length, at any level, is summed directly. Every twiddle factor comes
/// from one table of `exp(∓2πik/n)` computed with `sin`/`cos` directly, so the error does not
/// grow with recursion depth.
struct Fft {
    n: usize,
    inverse: bool,
    twiddles: Vec<C>,
}

impl Fft {
    fn new(n: usize, inverse: bool) -> Fft {
        let sign = if inverse { 1.0 } else { -1.0 };
        let twiddles = (0..n)
            .map(|k| {
                let (c, s) = unit_root(k as u128, n as u128);
                C::new(c, sign * s)
            })
            .collect();
        Fft { n, inverse, twiddles }
    }

    /// Transforms `x` (of length `n`) into `out`.
    fn run(&self, x: &[C], out: &mut [C]) {
        debug_assert!(x.len() == self.n && out.len() == self.n);
        if self.n == 0 {
            return;
        }
        self.rec(x, 1, self.n, 1, out);
        if self.inverse {
            let scale = 1.0 / self.n as f64;
            for v in out.iter_mut() {
                *v = C::new(v.re * scale, v.im * scale);
            }
        }
    }

    /// `out[0..n]` = DFT of the `n` points `x[0], x[s], x[2s], ...`; the twiddle for
    /// `exp(∓2πie/n)` is `twiddles[e * step]` (`n * step == self.n`).
    fn rec(&self, x: &[C], s: usize, n: usize, step: usize, out: &mut [C]) {
        if n == 1 {
            out[0] = x[0];
            return;
        }
        let p = smallest_factor(n);
        if p == n {
            self.direct(x, s, n, step, out);
            return;
        }
        let m = n / p;
        // The p decimated sub-sequences x[r], x[r+p], ... transform into out[r*m..(r+1)*m].
        for r in 0..p {
            self.rec(&x[r * s..], s * p, m, step * p, &mut out[r * m..(r + 1) * m]);
        }
        // y[k + m*q] = Σ_r w^(r*(k + m*q)) Y_r[k]. For one k the outputs occupy the same
        // slots as the inputs, so they are gathered first. p ≤ √n keeps r*(k+m*q) small.
        let mut tmp = vec![C::ZERO; p];
        for k in 0..m {
            for (q, t) in tmp.iter_mut().enumerate() {
                let idx = k + m * q;
                let mut acc = C::ZERO;
                for r in 0..p {
                    acc = acc + out[r * m + k] * self.twiddles[(r * idx) % n * step];
                }
                *t = acc;
            }
            for (q, t) in tmp.iter().enumerate() {
                out[k + m * q] = *t;
            }
        }
    }

    /// The O(n²) sum, for prime lengths.
    fn direct(&self, x: &[C], s: usize, n: usize, step: usize, out: &mut [C]) {
        for (k, o) in out.iter_mut().enumerate().take(n) {
            let mut acc = C::ZERO;
            let mut e = 0usize;
            for j in 0..n {
                acc = acc + x[j * s] * self.twiddles[e * step];
                // e = k*j mod n, kept reduced so that it never overflows.
                e += k;
                if e >= n {
                    e -= n;
                }
            }
            *o = acc;
        }
    }
}

/// `(cos θ, sin θ)` for `θ = 2πk/n`, `k < n`, reduced by symmetry to `θ ≤ π/4` before `sin`
/// and `cos` run, so that quarter turns are exact (a real input's DFT has exactly zero
/// imaginary parts where it should) and conjugate twiddles are exact conjugates. Backends that
/// precompute DFT twiddles call this, so their constants equal the reference's bit for bit.
pub fn unit_root(k: u128, n: u128) -> (f64, f64) {
    if 2 * k > n {
        // θ = 2π - θ'.
        let (c, s) = unit_root(n - k, n);
        return (c, -s);
    }
    if 4 * k > n {
        // θ = π - θ', θ' = 2π(n - 2k)/(2n).
        let (c, s) = unit_root(n - 2 * k, 2 * n);
        return (-c, s);
    }
    if 8 * k > n {
        // θ = π/2 - θ', θ' = 2π(n - 4k)/(4n).
        let (c, s) = unit_root(n - 4 * k, 4 * n);
        return (s, c);
    }
    let a = 2.0 * PI * (k as f64 / n as f64);
    (a.cos(), a.sin())
}

fn smallest_factor(n: usize) -> usize {
    if n.is_multiple_of(2) {
        return 2;
    }
    let mut p = 3;
    while p * p <= n {
        if n.is_multiple_of(p) {
            return p;
        }
        p += 2;
    }
    n
}

// ---------------------------------------------------------------------------------------------
// DFT

/// Normalizes a DFT axis: `[-r, -2] ∪ [0, r-2]` (the last axis holds the complex parts).
fn dft_axis(axis: i64, rank: usize) -> Result<usize, OpError> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a > r - 2 {
        crate::bail!(
            "axis {axis} is out of range for an input of rank {rank} (the last axis holds the complex parts)"
        );
    }
    Ok(a as usize)
}

/// The transform length and the output extent along the axis, from the input extent `n_in`.
fn dft_lengths(
    n_in: usize,
    dft_length: Option<i64>,
    inverse: bool,
    onesided: bool,
) -> Result<(usize, usize), OpError> {
    let n = match dft_length {
        Some(v) if v < 1 => crate::bail!("dft_length must be positive, got {v}"),
        Some(v) => to_len(v, "dft_length")?,
        // IRFFT: the input is one-sided, the default output length the even one.
        None if inverse && onesided => 2 * n_in.saturating_sub(1),
        None => n_in,
    };
    if n == 0 {
        crate::bail!("the transform length is 0 (the axis has {n_in} elements)");
    }
    let out = if onesided && !inverse { n / 2 + 1 } else { n };
    Ok((n, out))
}

fn check_signal_type(t: &TensorType, min_rank: usize, what: &str) -> Result<(), OpError> {
    if !t.dtype.is_float() {
        crate::bail!("{what} must be a float tensor, got {}", t.dtype);
    }
    if t.rank() < min_rank {
        crate::bail!("{what} must have rank at least {min_rank}, got {}", t.rank());
    }
    if let Some(Dim::Fixed(c)) = t.shape.last() {
        if !matches!(c, 1 | 2) {
            crate::bail!("the last dimension of {what} must be 1 (real) or 2 (complex), got {c}");
        }
    }
    Ok(())
}

fn infer_dft(cx: &InferCtx, inverse: bool, onesided: bool) -> Result<TensorType, OpError> {
    let x = cx.ty(0)?;
    check_signal_type(x, 2, "input")?;
    check_int_scalar(cx, 1, "dft_length")?;
    if let Some(t) = cx.opt_ty(2) {
        check_scalar_type(t, "axis")?;
        if t.dtype != DType::I64 {
            crate::bail!("axis must be int64, got {}", t.dtype);
        }
    }
    let rank = x.rank();
    let axis = match cx.opt_ty(2) {
        None => Some(-2),
        Some(_) => known_int(cx, 2),
    };
    let dft_length = match cx.opt_ty(1) {
        None => Some(None),
        Some(_) => known_int(cx, 1).map(Some),
    };
    let mut shape = x.shape.clone();
    shape[rank - 1] = Dim::Fixed(if inverse && onesided { 1 } else { 2 });
    match axis {
        Some(a) => {
            let a = dft_axis(a, rank)?;
            shape[a] = match (&x.shape[a], dft_length) {
                (Dim::Fixed(n_in), Some(len)) => Dim::Fixed(dft_lengths(*n_in, len, inverse, onesided)?.1),
                (_, Some(Some(len))) => Dim::Fixed(dft_lengths(0, Some(len), inverse, onesided)?.1),
                _ => Dim::unknown(),
            };
        }
        // Which axis changes is not known: none of the signal extents is.
        None => shape[..rank - 1].iter_mut().for_each(|d| *d = Dim::unknown()),
    }
    Ok(TensorType::new(x.dtype, shape))
}

/// The layout of one batched transform: `outer` blocks before the axis, `inner` elements
/// after it (not counting the complex dimension of `c` parts).
struct Lanes {
    outer: usize,
    inner: usize,
}

impl Lanes {
    fn new(shape: &[usize], axis: usize) -> Lanes {
        let rank = shape.len();
        Lanes {
            outer: shape[..axis].iter().product(),
            inner: shape[axis + 1..rank - 1].iter().product(),
        }
    }
}

fn eval_dft(cx: &EvalCtx, inverse: bool, onesided: bool) -> Result<Tensor, OpError> {
    let x = cx.input(0)?;
    check_signal_type(&x.tensor_type(), 2, "input")?;
    let shape = x.shape();
    let rank = shape.len();
    let dft_length = cx.opt_input(1).map(|t| int_scalar(t, "dft_length")).transpose()?;
    let axis = match cx.opt_input(2) {
        Some(t) => int_scalar(t, "axis")?,
        None => -2,
    };
    let axis = dft_axis(axis, rank)?;
    let n_in = shape[axis];
    let c_in = shape[rank - 1];
    let (n, out_len) = dft_lengths(n_in, dft_length, inverse, onesided)?;
    let irfft = inverse && onesided;
    let c_out = if irfft { 1 } else { 2 };
    let mut out_shape = shape.to_vec();
    out_shape[axis] = out_len;
    out_shape[rank - 1] = c_out;
    let total = check_alloc(&out_shape)?;
    if total == 0 {
        return Ok(Tensor::zeros(x.dtype(), out_shape));
    }

    let vals = x.to_f64_vec();
    let lanes = Lanes::new(shape, axis);
    let fft = Fft::new(n, inverse);
    let mut out = vec![0.0; total];
    let mut buf = vec![C::ZERO; n];
    let mut res = vec![C::ZERO; n];
    // The IRFFT reads the one-sided half and rebuilds the rest by conjugate symmetry.
    let take = if irfft { (n / 2 + 1).min(n_in) } else { n.min(n_in) };
    for o in 0..lanes.outer {
        for i in 0..lanes.inner {
            buf.fill(C::ZERO);
            for (k, b) in buf.iter_mut().enumerate().take(take) {
                let at = ((o * n_in + k) * lanes.inner + i) * c_in;
                *b = C::new(vals[at], if c_in == 2 { vals[at + 1] } else { 0.0 });
            }
            if irfft {
                hermitian_extend(&mut buf, take);
            }
            fft.run(&buf, &mut res);
            for (k, v) in res.iter().enumerate().take(out_len) {
                let at = ((o * out_len + k) * lanes.inner + i) * c_out;
                out[at] = v.re;
                if c_out == 2 {
                    out[at + 1] = v.im;
                }
            }
        }
    }
    let data = TensorData::from_f64s(x.dtype(), out);
    make(out_shape, data)
}

/// Fills `buf[n-k] = conj(buf[k])` for the one-sided half `buf[..take]`, so that the inverse
/// transform's real part is numpy's `irfft` (the imaginary parts of the DC and Nyquist bins
/// then only reach the discarded imaginary part of the result).
fn hermitian_extend(buf: &mut [C], take: usize) {
    let n = buf.len();
    for k in 1..take {
        let j = n - k;
        if j > n / 2 {
            buf[j] = buf[k].conj();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// STFT

/// STFT's frame length: the frame_length input, else the window's length, else the signal's.
fn stft_frame_length(
    frame_length: Option<Option<i64>>,
    window_len: Option<Option<usize>>,
    signal_len: Option<usize>,
) -> Result<Option<usize>, OpError> {
    let from_input = match frame_length {
        Some(Some(v)) => Some(Some(to_len(v, "frame_length")?)),
        Some(None) => Some(None),
        None => None,
    };
    if let (Some(Some(f)), Some(Some(w))) = (from_input, window_len) {
        if f != w {
            crate::bail!("frame_length {f} differs from the window length {w}");
        }
    }
    Ok(match (from_input, window_len) {
        (Some(f), _) => f,
        (None, Some(w)) => w,
        (None, None) => signal_len,
    })
}

/// The number of frames of an STFT.
fn stft_frames(signal_len: usize, frame_length: usize, step: i64) -> Result<usize, OpError> {
    if step < 1 {
        crate::bail!("frame_step must be positive, got {step}");
    }
    if frame_length == 0 {
        crate::bail!("frame_length must be positive");
    }
    if signal_len < frame_length {
        crate::bail!("the signal ({signal_len} samples) is shorter than one frame ({frame_length})");
    }
    Ok((signal_len - frame_length) / step as usize + 1)
}

fn infer_stft(cx: &InferCtx, onesided: bool) -> Result<TensorType, OpError> {
    let x = cx.ty(0)?;
    check_signal_type(x, 3, "signal")?;
    if x.rank() != 3 {
        crate::bail!("signal must have rank 3 [batch, length, 1|2], got {}", x.rank());
    }
    cx.ty(1)?;
    check_int_scalar(cx, 1, "frame_step")?;
    check_int_scalar(cx, 3, "frame_length")?;
    let window_len = match cx.opt_ty(2) {
        Some(w) => {
            if w.dtype != x.dtype || w.rank() != 1 {
                crate::bail!("window must be a 1-D {} tensor, got {w}", x.dtype);
            }
            Some(w.shape[0].fixed())
        }
        None => None,
    };
    let frame_length = cx.opt_ty(3).map(|_| known_int(cx, 3));
    let signal_len = x.shape[1].fixed();
    let fl = stft_frame_length(frame_length, window_len, signal_len)?;
    let frames = match (signal_len, fl, known_int(cx, 1)) {
        (Some(len), Some(fl), Some(step)) => Dim::Fixed(stft_frames(len, fl, step)?),
        _ => Dim::unknown(),
    };
    let bins = match fl {
        Some(f) if onesided => Dim::Fixed(f / 2 + 1),
        Some(f) => Dim::Fixed(f),
        None => Dim::unknown(),
    };
    Ok(TensorType::new(
        x.dtype,
        vec![x.shape[0].clone(), frames, bins, Dim::Fixed(2)],
    ))
}

fn eval_stft(cx: &EvalCtx, onesided: bool) -> Result<Tensor, OpError> {
    let x = cx.input(0)?;
    check_signal_type(&x.tensor_type(), 3, "signal")?;
    let &[batch, len, c] = x.shape() else {
        crate::bail!(
            "signal must have rank 3 [batch, length, 1|2], got shape {:?}",
            x.shape()
        );
    };
    let step = int_scalar(cx.input(1)?, "frame_step")?;
    let window = cx.opt_input(2);
    if let Some(w) = window {
        if w.rank() != 1 || !w.dtype().is_float() {
            crate::bail!("window must be a 1-D float tensor, got {}", w.tensor_type());
        }
    }
    let frame_length = cx
        .opt_input(3)
        .map(|t| int_scalar(t, "frame_length").map(Some))
        .transpose()?;
    let fl = stft_frame_length(frame_length, window.map(|w| Some(w.shape()[0])), Some(len))?.unwrap_or(len);
    let frames = stft_frames(len, fl, step)?;
    let step = step as usize;
    let bins = if onesided { fl / 2 + 1 } else { fl };
    let out_shape = vec![batch, frames, bins, 2];
    let total = check_alloc(&out_shape)?;
    let win = match window {
        Some(w) => w.to_f64_vec(),
        None => vec![1.0; fl],
    };

    let vals = x.to_f64_vec();
    let fft = Fft::new(fl, false);
    let mut out = vec![0.0; total];
    let mut buf = vec![C::ZERO; fl];
    let mut res = vec![C::ZERO; fl];
    for b in 0..batch {
        for f in 0..frames {
            for (t, v) in buf.iter_mut().enumerate() {
                let at = (b * len + f * step + t) * c;
                let im = if c == 2 { vals[at + 1] } else { 0.0 };
                *v = C::new(vals[at] * win[t], im * win[t]);
            }
            fft.run(&buf, &mut res);
            for (k, v) in res.iter().enumerate().take(bins) {
                let at = ((b * frames + f) * bins + k) * 2;
                out[at] = v.re;
                out[at + 1] = v.im;
            }
        }
    }
    let data = TensorData::from_f64s(x.dtype(), out);
    make(out_shape, data)
}

// ---------------------------------------------------------------------------------------------
// Windows

fn check_output_dtype(dtype: DType) -> Result<(), OpError> {
    if dtype == DType::Bool {
        crate::bail!("output_datatype must be numeric, got bool");
    }
    Ok(())
}

fn infer_window(cx: &InferCtx, dtype: DType) -> Result<TensorType, OpError> {
    check_output_dtype(dtype)?;
    cx.ty(0)?;
    check_int_scalar(cx, 0, "size")?;
    let len = match known_int(cx, 0) {
        Some(v) => Dim::Fixed(to_len(v, "size")?),
        None => Dim::unknown(),
    };
    Ok(TensorType::new(dtype, vec![len]))
}

/// `sin²(πn/N)`.
fn hann(n: f64, denom: f64) -> f64 {
    (PI * n / denom).sin().powi(2)
}

/// `α - β cos(2πn/N)` with the exact `α = 25/46` (not 0.54), as the ONNX reference.
fn hamming(n: f64, denom: f64) -> f64 {
    let alpha = 25.0 / 46.0;
    alpha - (1.0 - alpha) * (2.0 * PI * n / denom).cos()
}

/// `0.42 - 0.5 cos(2πn/N) + 0.08 cos(4πn/N)`.
fn blackman(n: f64, denom: f64) -> f64 {
    0.42 - 0.5 * (2.0 * PI * n / denom).cos() + 0.08 * (4.0 * PI * n / denom).cos()
}

fn eval_window(
    cx: &EvalCtx,
    periodic: bool,
    dtype: DType,
    f: fn(f64, f64) -> f64,
) -> Result<Tensor, OpError> {
    check_output_dtype(dtype)?;
    let size = to_len(int_scalar(cx.input(0)?, "size")?, "size")?;
    check_alloc(&[size])?;
    // A symmetric window of one point divides 0 by 0 (NaN), as the reference does.
    let denom = if periodic { size } else { size.saturating_sub(1) } as f64;
    let vals = (0..size).map(|i| f(i as f64, denom));
    make(vec![size], TensorData::from_f64s(dtype, vals))
}

// ---------------------------------------------------------------------------------------------
// MelWeightMatrix

fn infer_mel(cx: &InferCtx, dtype: DType) -> Result<TensorType, OpError> {
    check_output_dtype(dtype)?;
    for (i, what) in ["num_mel_bins", "dft_length", "sample_rate"].iter().enumerate() {
        cx.ty(i)?;
        check_int_scalar(cx, i, what)?;
    }
    for (i, what) in [(3, "lower_edge_hertz"), (4, "upper_edge_hertz")] {
        let t = cx.ty(i)?;
        check_scalar_type(t, what)?;
        if !t.dtype.is_float() {
            crate::bail!("{what} must be a float, got {}", t.dtype);
        }
    }
    let bins = match known_int(cx, 1) {
        Some(v) => Dim::Fixed(to_len(v, "dft_length")? / 2 + 1),
        None => Dim::unknown(),
    };
    let mels = match known_int(cx, 0) {
        Some(v) => Dim::Fixed(to_len(v, "num_mel_bins")?),
        None => Dim::unknown(),
    };
    Ok(TensorType::new(dtype, vec![bins, mels]))
}

/// Python's float floor division `a // b` (which is not always `floor(a / b)`).
fn py_floordiv(a: f64, b: f64) -> f64 {
    let m = a % b;
    let mut div = (a - m) / b;
    if m != 0.0 && ((b < 0.0) != (m < 0.0)) {
        div -= 1.0;
    }
    if div == 0.0 {
        return 0.0f64.copysign(a / b);
    }
    let fl = div.floor();
    if div - fl > 0.5 {
        fl + 1.0
    } else {
        fl
    }
}

/// The mel filter bank of the ONNX reference: triangles between `num_mel_bins + 2` points
/// evenly spaced on the mel scale, each rounded down to a spectrogram bin.
fn mel_matrix(
    num_mel_bins: usize,
    dft_length: usize,
    sample_rate: i64,
    lower: f64,
    upper: f64,
) -> Result<Vec<f64>, OpError> {
    let spec_bins = dft_length / 2 + 1;
    let points = num_mel_bins + 2;
    let to_mel = |hz: f64| 2595.0 * (hz / 700.0).ln_1p() / std::f64::consts::LN_10;
    let low = to_mel(lower);
    let mel_step = (to_mel(upper) - low) / points as f64;
    let bins: Vec<i64> = (0..points)
        .map(|i| {
            let mel = i as f64 * mel_step + low;
            let hz = 700.0 * (mel / 2595.0 * std::f64::consts::LN_10).exp_m1();
            let bin = py_floordiv((dft_length as f64 + 1.0) * hz, sample_rate as f64) as i64;
            // Bins outside the spectrogram are an error where a band touches them; clamping
            // keeps that outcome and the band arithmetic below from overflowing.
            bin.clamp(-1, spec_bins as i64 + 1)
        })
        .collect();
    let mut out = vec![0.0; check_alloc(&[spec_bins, num_mel_bins])?];
    let mut set = |j: i64, i: usize, v: f64| -> Result<(), OpError> {
        match usize::try_from(j) {
            Ok(j) if j < spec_bins => {
                out[j * num_mel_bins + i] = v;
                Ok(())
            }
            _ => crate::bail!("mel band {i} reaches spectrogram bin {j}, outside [0, {spec_bins})"),
        }
    };
    for i in 0..num_mel_bins {
        let (left, center, right) = (bins[i], bins[i + 1], bins[i + 2]);
        if center == left {
            set(center, i, 1.0)?;
        } else {
            for j in left..=center {
                set(j, i, (j - left) as f64 / (center - left) as f64)?;
            }
        }
        if right > center {
            for j in center..right {
                set(j, i, (right - j) as f64 / (right - center) as f64)?;
            }
        }
    }
    Ok(out)
}

fn eval_mel(cx: &EvalCtx, dtype: DType) -> Result<Tensor, OpError> {
    check_output_dtype(dtype)?;
    let num_mel_bins = to_len(int_scalar(cx.input(0)?, "num_mel_bins")?, "num_mel_bins")?;
    let dft_length = to_len(int_scalar(cx.input(1)?, "dft_length")?, "dft_length")?;
    let sample_rate = int_scalar(cx.input(2)?, "sample_rate")?;
    if sample_rate < 1 {
        crate::bail!("sample_rate must be positive, got {sample_rate}");
    }
    let lower = float_scalar(cx.input(3)?, "lower_edge_hertz")?;
    let upper = float_scalar(cx.input(4)?, "upper_edge_hertz")?;
    if !lower.is_finite() || !upper.is_finite() {
        crate::bail!("the edge frequencies must be finite, got {lower} and {upper}");
    }
    check_alloc(&[num_mel_bins, 2])?;
    let vals = mel_matrix(num_mel_bins, dft_length, sample_rate, lower, upper)?;
    let shape = vec![dft_length / 2 + 1, num_mel_bins];
    make(shape, TensorData::from_f64s(dtype, vals))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The textbook O(n²) sum, the oracle for the factored transform.
    fn naive(x: &[C], inverse: bool) -> Vec<C> {
        let n = x.len();
        let sign = if inverse { 1.0 } else { -1.0 };
        (0..n)
            .map(|k| {
                let mut acc = C::ZERO;
                for (j, v) in x.iter().enumerate() {
                    let a = 2.0 * PI * ((k * j) % n) as f64 / n as f64;
                    acc = acc + *v * C::new(a.cos(), sign * a.sin());
                }
                if inverse {
                    C::new(acc.re / n as f64, acc.im / n as f64)
                } else {
                    acc
                }
            })
            .collect()
    }

    fn signal(n: usize) -> Vec<C> {
        (0..n)
            .map(|i| C::new(((i * 7 + 3) % 11) as f64 - 5.0, ((i * 5 + 1) % 13) as f64 * 0.25))
            .collect()
    }

    fn max_err(a: &[C], b: &[C]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x.re - y.re).abs().max((x.im - y.im).abs()))
            .fold(0.0, f64::max)
    }

    #[test]
    fn fft_matches_direct_sum() {
        // Powers of two (radix-2), composites (mixed radix, 400 = the speech n_fft), primes.
        for n in [1, 2, 3, 4, 6, 7, 8, 12, 15, 16, 49, 64, 97, 100, 400, 512] {
            for inverse in [false, true] {
                let x = signal(n);
                let mut got = vec![C::ZERO; n];
                Fft::new(n, inverse).run(&x, &mut got);
                let err = max_err(&got, &naive(&x, inverse));
                assert!(err < 1e-9 * n as f64, "n={n} inverse={inverse}: error {err}");
            }
        }
    }

    #[test]
    fn fft_round_trip() {
        let x = signal(400);
        let mut y = vec![C::ZERO; 400];
        let mut z = vec![C::ZERO; 400];
        Fft::new(400, false).run(&x, &mut y);
        Fft::new(400, true).run(&y, &mut z);
        assert!(max_err(&x, &z) < 1e-12);
    }

    fn run_dft(
        x: Tensor,
        extra: Vec<Option<Tensor>>,
        inverse: bool,
        onesided: bool,
    ) -> Result<Tensor, OpError> {
        let mut inputs = vec![Some(&x)];
        inputs.extend(extra.iter().map(|t| t.as_ref()));
        let out_types = [TensorType::scalar(x.dtype())];
        let cx = EvalCtx {
            inputs,
            out_types: &out_types,
        };
        eval_dft(&cx, inverse, onesided)
    }

    #[test]
    fn dft_real_input_and_onesided() {
        // [1, 2, 3, 4]: X = [10, -2+2i, -2, -2-2i].
        let x = Tensor::from_vec(vec![1, 4, 1], vec![1.0f32, 2.0, 3.0, 4.0]);
        let full = run_dft(x.clone(), vec![], false, false).unwrap();
        assert_eq!(full.shape(), &[1, 4, 2]);
        assert_eq!(
            full.to_f64_vec(),
            vec![10.0, 0.0, -2.0, 2.0, -2.0, 0.0, -2.0, -2.0]
        );
        let half = run_dft(x, vec![], false, true).unwrap();
        assert_eq!(half.shape(), &[1, 3, 2]);
        assert_eq!(half.to_f64_vec(), vec![10.0, 0.0, -2.0, 2.0, -2.0, 0.0]);
    }

    #[test]
    fn dft_length_pads_and_truncates_along_axis() {
        // Axis 1 of [2, 3, 1]: each column is transformed separately.
        let x = Tensor::from_vec(vec![2, 3, 1], vec![1.0f64, 0.0, 0.0, 1.0, 1.0, 1.0]);
        let len = Tensor::scalar(2i64);
        let axis = Tensor::scalar(1i64);
        let y = run_dft(x.clone(), vec![Some(len), Some(axis)], false, false).unwrap();
        assert_eq!(y.shape(), &[2, 2, 2]);
        assert_eq!(y.to_f64_vec(), vec![1.0, 0.0, 1.0, 0.0, 2.0, 0.0, 0.0, 0.0]);
        // Axis 0 of the same input, padded to 4: [1, 1, 0, 0] and [0, 1, 0, 0] etc.
        let y = run_dft(
            x,
            vec![Some(Tensor::scalar(4i32)), Some(Tensor::scalar(0i64))],
            false,
            false,
        )
        .unwrap();
        assert_eq!(y.shape(), &[4, 3, 2]);
        let v = y.to_f64_vec();
        // Column 0 is [1, 1, 0, 0]: X = [2, 1-i, 0, 1+i].
        assert_eq!(
            [v[0], v[1], v[6], v[7], v[12], v[13], v[18], v[19]],
            [2.0, 0.0, 1.0, -1.0, 0.0, 0.0, 1.0, 1.0]
        );
    }

    #[test]
    fn irfft_matches_numpy() {
        // numpy.fft.irfft([1, 2-1j, 0.5+3j], n=5) and n=4 (DC/Nyquist imaginary parts ignored).
        let x = Tensor::from_vec(vec![3, 2], vec![1.0f64, 0.0, 2.0, -1.0, 0.5, 3.0]);
        let y = run_dft(
            x,
            vec![Some(Tensor::scalar(5i64)), Some(Tensor::scalar(0i64))],
            true,
            true,
        )
        .unwrap();
        assert_eq!(y.shape(), &[5, 1]);
        let expected = [1.2, -0.039509, 0.990972, -1.761792, 0.61033];
        for (a, b) in y.to_f64_vec().iter().zip(expected) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
        let x = Tensor::from_vec(vec![3, 2], vec![1.0f64, 2.0, 2.0, -1.0, 0.5, 3.0]);
        let y = run_dft(x, vec![None, Some(Tensor::scalar(0i64))], true, true).unwrap();
        assert_eq!(y.to_f64_vec(), vec![1.375, 0.625, -0.625, -0.375]);
    }

    #[test]
    fn dft_rejects_bad_inputs() {
        let x = Tensor::from_vec(vec![4, 3], vec![0.0f32; 12]);
        assert!(run_dft(x, vec![], false, false).is_err(), "last dimension 3");
        let x = Tensor::from_vec(vec![4, 1], vec![0.0f32; 4]);
        assert!(run_dft(x.clone(), vec![None, Some(Tensor::scalar(-1i64))], false, false).is_err());
        assert!(run_dft(x.clone(), vec![None, Some(Tensor::scalar(1i64))], false, false).is_err());
        assert!(run_dft(x.clone(), vec![Some(Tensor::scalar(0i64))], false, false).is_err());
        assert!(run_dft(x, vec![Some(Tensor::scalar(1.5f32))], false, false).is_err());
        let x = Tensor::from_vec(vec![1, 1], vec![0.0f32]);
        assert!(run_dft(x, vec![], true, true).is_err(), "IRFFT default length 0");
        let empty = Tensor::from_vec(vec![0, 4, 1], Vec::<f32>::new());
        assert_eq!(run_dft(empty, vec![], false, false).unwrap().shape(), &[0, 4, 2]);
    }

    #[test]
    fn dft_infers_data_dependent_shapes() {
        let x = TensorType::fixed(DType::F32, &[2, 10, 1]);
        let len = Tensor::scalar(16i64);
        let len_ty = len.tensor_type();
        let cx = InferCtx {
            inputs: vec![Some(&x), Some(&len_ty)],
            values: vec![None, Some(&len)],
            num_outputs: 1,
        };
        assert_eq!(
            infer_dft(&cx, false, true).unwrap(),
            TensorType::fixed(DType::F32, &[2, 9, 2])
        );
        let cx = InferCtx {
            inputs: vec![Some(&x), Some(&len_ty)],
            values: vec![None, None],
            num_outputs: 1,
        };
        let t = infer_dft(&cx, false, false).unwrap();
        assert_eq!(t.shape, vec![Dim::Fixed(2), Dim::unknown(), Dim::Fixed(2)]);
    }

    #[test]
    fn stft_frames_match_dft_of_windowed_slices() {
        let sig: Vec<f32> = (0..10).map(|i| (i as f32 * 0.7).sin()).collect();
        let x = Tensor::from_vec(vec![1, 10, 1], sig.clone());
        let step = Tensor::scalar(3i64);
        let window = Tensor::from_vec(vec![4], vec![0.5f32, 1.0, 1.0, 0.5]);
        let out_types = [TensorType::scalar(DType::F32)];
        let cx = EvalCtx {
            inputs: vec![Some(&x), Some(&step), Some(&window), None],
            out_types: &out_types,
        };
        let y = eval_stft(&cx, true).unwrap();
        assert_eq!(y.shape(), &[1, 3, 3, 2]);
        let v = y.to_f64_vec();
        let w = [0.5, 1.0, 1.0, 0.5];
        for f in 0..3 {
            let frame: Vec<C> = (0..4)
                .map(|t| C::new(sig[f * 3 + t] as f64 * w[t], 0.0))
                .collect();
            let want = naive(&frame, false);
            for (k, want) in want.iter().enumerate().take(3) {
                let at = (f * 3 + k) * 2;
                assert!((v[at] - want.re).abs() < 1e-5 && (v[at + 1] - want.im).abs() < 1e-5);
            }
        }
        // A frame longer than the signal and a zero step are errors, not panics.
        let long = Tensor::scalar(11i64);
        let cx = EvalCtx {
            inputs: vec![Some(&x), Some(&step), None, Some(&long)],
            out_types: &out_types,
        };
        assert!(eval_stft(&cx, true).is_err());
        let zero = Tensor::scalar(0i64);
        let cx = EvalCtx {
            inputs: vec![Some(&x), Some(&zero), Some(&window), None],
            out_types: &out_types,
        };
        assert!(eval_stft(&cx, false).is_err());
    }

    fn window(f: fn(f64, f64) -> f64, size: i64, periodic: bool, dtype: DType) -> Result<Vec<f64>, OpError> {
        let size = Tensor::scalar(size);
        let out_types = [TensorType::scalar(dtype)];
        let cx = EvalCtx {
            inputs: vec![Some(&size)],
            out_types: &out_types,
        };
        Ok(eval_window(&cx, periodic, dtype, f)?.to_f64_vec())
    }

    #[test]
    fn windows() {
        let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12);
        assert!(close(
            &window(hann, 4, true, DType::F64).unwrap(),
            &[0.0, 0.5, 1.0, 0.5]
        ));
        assert!(close(
            &window(hann, 5, false, DType::F64).unwrap(),
            &[0.0, 0.5, 1.0, 0.5, 0.0]
        ));
        let a = 25.0 / 46.0;
        assert!(close(
            &window(hamming, 2, true, DType::F64).unwrap(),
            &[a - (1.0 - a), 1.0]
        ));
        assert!(close(
            &window(blackman, 3, false, DType::F64).unwrap(),
            &[0.0, 1.0, 0.0]
        ));
        assert!(window(hann, 0, true, DType::F32).unwrap().is_empty());
        assert!(window(hann, -1, true, DType::F32).is_err());
        // Integer outputs truncate like a cast.
        assert_eq!(
            window(hann, 4, true, DType::I32).unwrap(),
            vec![0.0, 0.0, 1.0, 0.0]
        );
    }

    #[test]
    fn mel_matrix_matches_reference() {
        // onnx reference: MelWeightMatrix(3, 20, 1000, 0.0, 500.0).
        let m = mel_matrix(3, 20, 1000, 0.0, 500.0).unwrap();
        let mut expected = vec![0.0; 33];
        for (j, i, v) in [
            (1, 0, 1.0),
            (2, 0, 0.5),
            (2, 1, 0.5),
            (3, 1, 1.0),
            (4, 1, 0.5),
            (4, 2, 0.5),
        ] {
            expected[j * 3 + i] = v;
        }
        expected[5 * 3 + 2] = 1.0;
        expected[6 * 3 + 2] = 0.5;
        assert_eq!(m, expected);
        // Bands beyond the spectrogram are an error.
        assert!(mel_matrix(3, 20, 1000, 0.0, 5000.0).is_err());
    }

    #[test]
    fn python_floor_division() {
        assert_eq!(py_floordiv(7.0, 2.0), 3.0);
        assert_eq!(py_floordiv(-7.0, 2.0), -4.0);
        assert_eq!(py_floordiv(0.3, 0.1), 2.0);
    }
}
