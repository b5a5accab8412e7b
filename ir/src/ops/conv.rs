//! Convolution and pooling: Conv, ConvTranspose, MaxPool / AveragePool / LpPool and the global
//! pools.
//!
//! All of them slide a window over the spatial axes of an `[N, C, spatial...]` tensor. The
//! window geometry of one axis (extent, kernel, stride, dilation, padding, output extent) is
//! resolved once into an [`Axis`], with the output-size rules of the ONNX reference
//! implementation (`auto_pad`, `ceil_mode`, ConvTranspose's `output_shape`); inference and
//! evaluation share that code, so the static type always matches the computed tensor.
//!
//! Conv runs as im2col + a packed matrix product (f32, or f64 for f64 inputs; f16/bf16 are
//! widened to f32 and rounded once at the end), depthwise-style convolutions (one input channel
//! per output channel) as direct loops. The reference interpreter runs whole CNNs, so this is
//! the one place in it where speed was designed in.

mod gemm;
mod pool;

use super::{util, EvalCtx, InferCtx};
use crate::{
    AutoPad, ConvAttrs, ConvTransposeAttrs, DType, Dim, Op, OpError, Tensor, TensorData, TensorType,
};
use gemm::{Float, Mat};
use std::borrow::Cow;

pub(crate) fn infer(op: &Op, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    if let Some(first) = channels_first(op) {
        // Channels-last: the same window over the NCHW view of X, outputs laid out back.
        let x = to_first_type(cx.ty(0)?)?;
        let mut inputs = cx.inputs.clone();
        inputs[0] = Some(&x);
        let mut values = cx.values.clone();
        if let Some(v) = values.first_mut() {
            *v = None;
        }
        let inner = InferCtx {
            inputs,
            values,
            num_outputs: cx.num_outputs,
        };
        return infer(&first, &inner)?.iter().map(to_last_type).collect();
    }
    match op {
        Op::Conv(a) => infer_conv(a, cx),
        Op::ConvTranspose(a) => infer_conv_transpose(a, cx),
        Op::Pool(a) => pool::infer(a, cx),
        Op::GlobalPool(kind) => pool::infer_global(*kind, cx),
        _ => crate::bail!("{} is not a convolution or pooling operator", op.name()),
    }
}

pub(crate) fn eval(op: &Op, cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    if let Some(first) = channels_first(op) {
        let x = permute(cx.input(0)?, false)?;
        let mut inputs = cx.inputs.clone();
        inputs[0] = Some(&x);
        let out_types: Vec<TensorType> = cx.out_types.iter().map(to_first_type).collect::<Result<_, _>>()?;
        let inner = EvalCtx {
            inputs,
            out_types: &out_types,
        };
        return eval(&first, &inner)?.iter().map(|t| permute(t, true)).collect();
    }
    match op {
        Op::Conv(a) => eval_conv(a, cx),
        Op::ConvTranspose(a) => eval_conv_transpose(a, cx),
        Op::Pool(a) => pool::eval(a, cx),
        Op::GlobalPool(kind) => pool::eval_global(*kind, cx),
        _ => crate::bail!("{} is not a convolution or pooling operator", op.name()),
    }
}

// ---------------------------------------------------------------------------------------------
// Channels-last (NHWC) variants
// ---------------------------------------------------------------------------------------------

/// The channels-first form of a channels-last Conv/Pool, or None for a channels-first op.
fn channels_first(op: &Op) -> Option<Op> {
    match op {
        Op::Conv(a) if a.channels_last => Some(Op::Conv(ConvAttrs {
            channels_last: false,
            ..a.clone()
        })),
        Op::Pool(a) if a.channels_last => Some(Op::Pool(crate::PoolAttrs {
            channels_last: false,
            ..a.clone()
        })),
        _ => None,
    }
}

/// `[N, spatial..., C]` → `[N, C, spatial...]` (or back with `to_last`).
fn perm(rank: usize, to_last: bool) -> Vec<usize> {
    let mut p = vec![0];
    if to_last {
        p.extend(2..rank);
        p.push(1);
    } else {
        p.push(rank - 1);
        p.extend(1..rank - 1);
    }
    p
}

fn check_rank(rank: usize) -> Result<(), OpError> {
    if rank < 3 {
        crate::bail!("a channels-last input needs rank 3 or more, got rank {rank}");
    }
    Ok(())
}

fn to_first_type(t: &TensorType) -> Result<TensorType, OpError> {
    check_rank(t.rank())?;
    let p = perm(t.rank(), false);
    Ok(util::with_shape(
        t,
        p.iter().map(|&i| t.shape[i].clone()).collect(),
    ))
}

fn to_last_type(t: &TensorType) -> Result<TensorType, OpError> {
    check_rank(t.rank())?;
    let p = perm(t.rank(), true);
    Ok(util::with_shape(
        t,
        p.iter().map(|&i| t.shape[i].clone()).collect(),
    ))
}

/// The tensor in the other layout (NCHW → NHWC when `to_last`), through the Transpose kernel.
fn permute(t: &Tensor, to_last: bool) -> Result<Tensor, OpError> {
    check_rank(t.shape().len())?;
    let op = Op::Transpose {
        perm: perm(t.shape().len(), to_last),
    };
    let ty = [t.tensor_type()];
    let cx = EvalCtx {
        inputs: vec![Some(t)],
        out_types: &ty,
    };
    super::eval(&op, &cx)?
        .pop()
        .ok_or_else(|| OpError::new("Transpose returned no tensor"))
}

// ---------------------------------------------------------------------------------------------
// Window geometry
// ---------------------------------------------------------------------------------------------

/// One spatial axis of a sliding window, resolved against a concrete input extent.
///
/// Output position `o` at kernel tap `k` reads input index `o * stride + k * dilation -
/// pad_begin`; indices outside `[0, input)` are padding. (ConvTranspose uses the same relation
/// with the roles of its input and output swapped.)
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Axis {
    pub input: usize,
    pub kernel: usize,
    pub stride: usize,
    pub dilation: usize,
    /// Padding before the first element; negative only for a ConvTranspose whose requested
    /// output is larger than its natural extent.
    pub pad_begin: i64,
    /// Padding after the last element (as given or computed, without `ceil_mode`'s extra).
    pub pad_end: i64,
    pub output: usize,
}

impl Axis {
    /// Input index read by output `o` at tap `k` (outside `[0, input)` when in the padding).
    fn source(&self, o: usize, k: usize) -> i64 {
        (o * self.stride + k * self.dilation) as i64 - self.pad_begin
    }

    /// The outputs `[lo, hi)` whose tap `k` reads inside the input.
    fn valid_outputs(&self, k: usize) -> (usize, usize) {
        let first = (k * self.dilation) as i64 - self.pad_begin;
        let stride = self.stride as i64;
        let lo = if first >= 0 {
            0
        } else {
            (-first + stride - 1) / stride
        };
        let limit = self.input as i64 - first;
        let hi = if limit <= 0 {
            0
        } else {
            (limit + stride - 1) / stride
        };
        let hi = (hi as usize).min(self.output);
        ((lo as usize).min(hi), hi)
    }
}

/// Extent covered by a kernel of `kernel` taps spaced `dilation` apart.
fn span(kernel: usize, dilation: usize) -> Result<usize, OpError> {
    kernel
        .checked_sub(1)
        .and_then(|k| k.checked_mul(dilation))
        .and_then(|s| s.checked_add(1))
        .ok_or_else(|| OpError::new(format!("kernel {kernel} with dilation {dilation} is invalid")))
}

/// A per-axis attribute (`strides`, `dilations`, `kernel_shape`, `output_padding`): empty means
/// `default` on every axis.
fn per_axis(
    v: &[usize],
    n: usize,
    default: usize,
    what: &str,
    allow_zero: bool,
) -> Result<Vec<usize>, OpError> {
    if v.is_empty() {
        return Ok(vec![default; n]);
    }
    if v.len() != n {
        crate::bail!("{what} has {} values for {n} spatial axes", v.len());
    }
    if !allow_zero && v.contains(&0) {
        crate::bail!("{what} must be positive, got {v:?}");
    }
    Ok(v.to_vec())
}

/// `pads` as `(begin, end)` per axis; empty means no padding.
fn split_pads(pads: &[usize], n: usize) -> Result<Vec<(usize, usize)>, OpError> {
    if pads.is_empty() {
        return Ok(vec![(0, 0); n]);
    }
    if pads.len() != 2 * n {
        crate::bail!(
            "pads has {} values for {n} spatial axes (2 per axis expected)",
            pads.len()
        );
    }
    Ok((0..n).map(|i| (pads[i], pads[n + i])).collect())
}

/// The attributes of a convolution or pooling window, checked against the spatial rank.
pub(crate) struct WindowAttrs {
    /// `None` on an axis where the kernel extent is not known statically (taken from a weight
    /// whose shape is symbolic).
    pub kernel: Vec<Option<usize>>,
    pub strides: Vec<usize>,
    pub dilations: Vec<usize>,
    pub pads: Vec<(usize, usize)>,
    pub auto_pad: AutoPad,
    pub ceil_mode: bool,
}

impl WindowAttrs {
    pub(crate) fn new(
        kernel: Vec<Option<usize>>,
        strides: &[usize],
        dilations: &[usize],
        pads: &[usize],
        auto_pad: AutoPad,
        ceil_mode: bool,
    ) -> Result<WindowAttrs, OpError> {
        let n = kernel.len();
        if kernel.contains(&Some(0)) {
            crate::bail!("kernel extents must be positive");
        }
        Ok(WindowAttrs {
            kernel,
            strides: per_axis(strides, n, 1, "strides", false)?,
            dilations: per_axis(dilations, n, 1, "dilations", false)?,
            pads: split_pads(pads, n)?,
            auto_pad,
            ceil_mode,
        })
    }

    /// Resolves axis `i` for an input of extent `input` (`None`: unknown extent or kernel).
    pub(crate) fn axis(&self, i: usize, input: Option<usize>) -> Result<Option<Axis>, OpError> {
        let (Some(input), Some(kernel)) = (input, self.kernel[i]) else {
            return Ok(None);
        };
        resolve_axis(
            input,
            kernel,
            self.strides[i],
            self.dilations[i],
            self.pads[i],
            self.auto_pad,
            self.ceil_mode,
        )
        .map(Some)
    }

    /// The output extent of axis `i` for input extent `input`: computed when the input is fixed;
    /// the input's own symbol when the window preserves the extent (stride 1 with `SAME`
    /// padding or with pads that add up to the kernel span minus one), so that a dynamic
    /// spatial size survives a chain of "same" convolutions; otherwise unknown.
    pub(crate) fn out_dim(&self, i: usize, input: &Dim) -> Result<Dim, OpError> {
        if let Some(axis) = self.axis(i, input.fixed())? {
            return Ok(Dim::Fixed(axis.output));
        }
        let (Some(kernel), Dim::Sym(_)) = (self.kernel[i], input) else {
            return Ok(Dim::unknown());
        };
        let extent = span(kernel, self.dilations[i])?;
        let (begin, end) = self.pads[i];
        let preserved = self.strides[i] == 1
            && match self.auto_pad {
                AutoPad::SameUpper | AutoPad::SameLower => true,
                AutoPad::Valid => extent == 1,
                AutoPad::NotSet => begin.checked_add(end).and_then(|p| p.checked_add(1)) == Some(extent),
            };
        Ok(if preserved { input.clone() } else { Dim::unknown() })
    }

    /// Resolves every axis of a concrete input.
    pub(crate) fn axes(&self, spatial: &[usize]) -> Result<Vec<Axis>, OpError> {
        spatial
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                self.axis(i, Some(d))?
                    .ok_or_else(|| OpError::new("kernel extent unknown at evaluation"))
            })
            .collect()
    }
}

/// Output extent and padding of one axis of a convolution or pooling window (ONNX reference
/// rules: `SAME_*` gives `ceil(input / stride)` outputs and puts the odd padding element at the
/// end (UPPER) or the beginning (LOWER); `ceil_mode` rounds up but drops a last window that
/// would start past the input and its leading padding).
pub fn resolve_axis(
    input: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
    pads: (usize, usize),
    auto_pad: AutoPad,
    ceil_mode: bool,
) -> Result<Axis, OpError> {
    if stride == 0 || dilation == 0 {
        crate::bail!("stride {stride} and dilation {dilation} must be positive");
    }
    let extent = span(kernel, dilation)?;
    let (pad_begin, pad_end) = match auto_pad {
        AutoPad::NotSet => pads,
        AutoPad::Valid => (0, 0),
        AutoPad::SameUpper | AutoPad::SameLower => {
            let out = input.div_ceil(stride);
            let needed = out
                .saturating_sub(1)
                .saturating_mul(stride)
                .saturating_add(extent);
            let total = if out == 0 { 0 } else { needed.saturating_sub(input) };
            let begin = if auto_pad == AutoPad::SameUpper {
                total / 2
            } else {
                total.div_ceil(2)
            };
            let axis = Axis {
                input,
                kernel,
                stride,
                dilation,
                pad_begin: begin as i64,
                pad_end: (total - begin) as i64,
                output: out,
            };
            return Ok(axis);
        }
    };
    let padded = input
        .checked_add(pad_begin)
        .and_then(|p| p.checked_add(pad_end))
        .ok_or_else(|| OpError::new("padding overflows"))?;
    if padded < extent {
        crate::bail!(
            "the kernel extent {extent} is larger than the padded input extent {padded} \
             (input {input}, pads {pad_begin}+{pad_end})"
        );
    }
    let room = padded - extent;
    let output = if ceil_mode {
        let out = room.div_ceil(stride) + 1;
        // The last window must start inside the input or its leading padding.
        let last_start = (out - 1).checked_mul(stride);
        if last_start.is_none_or(|start| start >= input + pad_begin) {
            out - 1
        } else {
            out
        }
    } else {
        room / stride + 1
    };
    Ok(Axis {
        input,
        kernel,
        stride,
        dilation,
        pad_begin: pad_begin as i64,
        pad_end: pad_end as i64,
        output,
    })
}

/// Kernel tap multi-indices in row-major order.
fn kernel_taps(axes: &[Axis]) -> Vec<Vec<usize>> {
    let kernel: Vec<usize> = axes.iter().map(|a| a.kernel).collect();
    let n: usize = kernel.iter().product();
    (0..n).map(|t| util::unravel(t, &kernel)).collect()
}

/// Calls `f(out_row, in_row)` for every output row of the window at kernel tap `tap` (a row:
/// all spatial axes but the last fixed). `out_row` is the row's flat offset in the output
/// plane, `in_row` the flat offset of the input row it reads, or `None` when that row lies in
/// the padding.
fn for_each_row(axes: &[Axis], tap: &[usize], mut f: impl FnMut(usize, Option<usize>)) {
    let (last, outer) = axes.split_last().expect("at least one spatial axis");
    let rows: usize = outer.iter().map(|a| a.output).product();
    let mut idx = vec![0usize; outer.len()];
    for r in 0..rows {
        let mut in_row = Some(0usize);
        for (i, a) in outer.iter().enumerate() {
            let s = a.source(idx[i], tap[i]);
            in_row = match in_row {
                Some(off) if s >= 0 && (s as usize) < a.input => Some(off * a.input + s as usize),
                _ => None,
            };
        }
        f(r * last.output, in_row.map(|off| off * last.input));
        for i in (0..outer.len()).rev() {
            idx[i] += 1;
            if idx[i] < outer[i].output {
                break;
            }
            idx[i] = 0;
        }
    }
}

/// The input index range `[first, ...)` (step `stride`) read by outputs `[lo, hi)` of the last
/// axis at tap `k`, with the valid output range.
fn last_axis_run(a: &Axis, k: usize) -> (usize, usize, usize) {
    let (lo, hi) = a.valid_outputs(k);
    let first = if lo < hi { a.source(lo, k) as usize } else { 0 };
    (lo, hi, first)
}

// ---------------------------------------------------------------------------------------------
// Shared type checks
// ---------------------------------------------------------------------------------------------

fn check_float(d: DType, what: &str) -> Result<(), OpError> {
    if !d.is_float() {
        crate::bail!("{what} must be a floating-point tensor, got {d}");
    }
    Ok(())
}

/// `X` of a windowed operator: `[N, C, spatial...]` with at least one spatial axis.
fn check_nc_spatial(x: &TensorType) -> Result<usize, OpError> {
    if x.rank() < 3 {
        crate::bail!("input must have shape [N, C, spatial...], got {x}");
    }
    Ok(x.rank() - 2)
}

/// Checks that equal-when-known dims agree.
fn check_dim(a: &Dim, b: usize, msg: impl FnOnce() -> String) -> Result<(), OpError> {
    match a.fixed() {
        Some(v) if v != b => Err(OpError::new(msg())),
        _ => Ok(()),
    }
}

/// The optional bias of Conv/ConvTranspose: 1-D of the output channel count.
fn check_bias(b: Option<&TensorType>, x: DType, m: Option<usize>) -> Result<(), OpError> {
    let Some(b) = b else { return Ok(()) };
    if b.dtype != x {
        crate::bail!("bias has dtype {} but X has {x}", b.dtype);
    }
    if b.rank() != 1 {
        crate::bail!("bias must be 1-D, got {b}");
    }
    if let Some(m) = m {
        check_dim(&b.shape[0], m, || {
            format!("bias has shape {b} but there are {m} output channels")
        })?;
    }
    Ok(())
}

/// Kernel extents: the `kernel_shape` attribute (checked against W where W's dims are known),
/// or W's spatial dims.
fn kernel_of(attr: &[usize], w: &TensorType, n: usize) -> Result<Vec<Option<usize>>, OpError> {
    let w_sp: Vec<Option<usize>> = w.shape[2..].iter().map(Dim::fixed).collect();
    if attr.is_empty() {
        return Ok(w_sp);
    }
    if attr.len() != n {
        crate::bail!("kernel_shape has {} values for {n} spatial axes", attr.len());
    }
    for (i, (&k, wk)) in attr.iter().zip(&w_sp).enumerate() {
        if let Some(wk) = wk {
            if k != *wk {
                crate::bail!("kernel_shape {attr:?} does not match W {w} on spatial axis {i}");
            }
        }
    }
    Ok(attr.iter().map(|&k| Some(k)).collect())
}

// ---------------------------------------------------------------------------------------------
// Conv
// ---------------------------------------------------------------------------------------------

/// Checks X/W/B of a Conv; returns the window attributes.
fn check_conv(
    a: &ConvAttrs,
    x: &TensorType,
    w: &TensorType,
    b: Option<&TensorType>,
) -> Result<WindowAttrs, OpError> {
    check_float(x.dtype, "X")?;
    if w.dtype != x.dtype {
        crate::bail!("W has dtype {} but X has {}", w.dtype, x.dtype);
    }
    let n = check_nc_spatial(x)?;
    if w.rank() != x.rank() {
        crate::bail!("W {w} must have the rank of X {x}");
    }
    let group = a.group;
    if group == 0 {
        crate::bail!("group must be positive");
    }
    if let Some(cg) = w.shape[1].fixed() {
        let c = cg
            .checked_mul(group)
            .ok_or_else(|| OpError::new("group is too large"))?;
        check_dim(&x.shape[1], c, || {
            format!("X {x} has a channel count different from W's {cg} per group × group {group}")
        })?;
    }
    if let Some(m) = w.shape[0].fixed() {
        if m % group != 0 {
            crate::bail!("W has {m} output channels, not divisible by group {group}");
        }
    }
    check_bias(b, x.dtype, w.shape[0].fixed())?;
    let kernel = kernel_of(&a.kernel_shape, w, n)?;
    WindowAttrs::new(kernel, &a.strides, &a.dilations, &a.pads, a.auto_pad, false)
}

fn infer_conv(a: &ConvAttrs, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    let (x, w) = (cx.ty(0)?, cx.ty(1)?);
    let win = check_conv(a, x, w, cx.opt_ty(2))?;
    let mut shape = vec![x.shape[0].clone(), w.shape[0].clone()];
    for (i, d) in x.shape[2..].iter().enumerate() {
        shape.push(win.out_dim(i, d)?);
    }
    Ok(vec![util::with_shape(x, shape)])
}

/// Concrete sizes of one Conv or ConvTranspose evaluation.
struct ConvShape {
    batch: usize,
    /// Input channels.
    c: usize,
    /// Output channels.
    m: usize,
    group: usize,
    /// Conv: the window over X. ConvTranspose: the window of the equivalent conv over Y.
    axes: Vec<Axis>,
    transposed: bool,
}

impl ConvShape {
    fn x_plane(&self) -> usize {
        self.axes.iter().map(|a| a.input).product()
    }
    fn y_plane(&self) -> usize {
        self.axes.iter().map(|a| a.output).product()
    }
    fn taps(&self) -> usize {
        self.axes.iter().map(|a| a.kernel).product()
    }

    /// Runs the convolution in the compute type of X's dtype (f64 for f64; f32 otherwise,
    /// f16/bf16 widened as onnxruntime does) and rounds the result once to that dtype.
    fn evaluate(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: Option<&Tensor>,
        out_shape: Vec<usize>,
    ) -> Result<Tensor, OpError> {
        let dtype = x.dtype();
        let data = if dtype == DType::F64 {
            let (x, w, b) = (as_f64(x), as_f64(w), b.map(as_f64));
            TensorData::F64(self.run(&x, &w, b.as_deref()))
        } else {
            let (x, w, b) = (as_f32(x), as_f32(w), b.map(as_f32));
            let y = self.run(&x, &w, b.as_deref());
            if dtype == DType::F32 {
                TensorData::F32(y)
            } else {
                TensorData::from_f64s(dtype, y.into_iter().map(f64::from))
            }
        };
        Tensor::new(out_shape, data).map_err(|e| OpError::new(e.to_string()))
    }

    fn run<F: Float>(&self, x: &[F], w: &[F], b: Option<&[F]>) -> Vec<F> {
        if self.transposed {
            conv_transpose_core(self, x, w, b)
        } else {
            conv_core(self, x, w, b)
        }
    }
}

fn eval_conv(a: &ConvAttrs, cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let (x, w, b) = (cx.input(0)?, cx.input(1)?, cx.opt_input(2));
    let win = check_conv(
        a,
        &x.tensor_type(),
        &w.tensor_type(),
        b.map(|b| b.tensor_type()).as_ref(),
    )?;
    let shape = ConvShape {
        batch: x.shape()[0],
        c: x.shape()[1],
        m: w.shape()[0],
        group: a.group,
        axes: win.axes(&x.shape()[2..])?,
        transposed: false,
    };
    let mut out_shape = vec![shape.batch, shape.m];
    out_shape.extend(shape.axes.iter().map(|a| a.output));
    util::check_alloc(&out_shape)?;
    // The im2col buffer is [C/group * taps, Y plane].
    util::check_alloc(&[shape.c / shape.group, shape.taps(), shape.y_plane()])?;
    Ok(vec![shape.evaluate(x, w, b, out_shape)?])
}

fn as_f32(t: &Tensor) -> Cow<'_, [f32]> {
    match t.as_slice::<f32>() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(t.to_f64_vec().into_iter().map(|v| v as f32).collect()),
    }
}

fn as_f64(t: &Tensor) -> Cow<'_, [f64]> {
    match t.as_slice::<f64>() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(t.to_f64_vec()),
    }
}

/// Threads to split one large kernel over (queried once: the query reads cgroup files).
fn threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(16)
    })
}

/// `Y = conv(X, W) + B` in the compute type. Shapes are already checked.
fn conv_core<F: Float>(s: &ConvShape, x: &[F], w: &[F], bias: Option<&[F]>) -> Vec<F> {
    let (x_plane, y_plane, taps) = (s.x_plane(), s.y_plane(), s.taps());
    let (cg, mg) = (s.c / s.group, s.m / s.group);
    let mut y = vec![F::zero(); s.batch * s.m * y_plane];
    if y.is_empty() {
        return y;
    }
    if cg == 1 {
        // Each output channel reads one input channel (depthwise and similar): a direct loop
        // per output plane avoids im2col's copy, which would cost as much as the arithmetic.
        parallel_planes(&mut y, y_plane, |plane, out| {
            let (n, m) = (plane / s.m, plane % s.m);
            let ci = m / mg;
            let xp = &x[(n * s.c + ci) * x_plane..][..x_plane];
            direct_plane(&s.axes, xp, &w[m * taps..][..taps], out);
        });
    } else {
        let k = cg * taps;
        let pointwise = s
            .axes
            .iter()
            .all(|a| a.kernel == 1 && a.stride == 1 && a.pad_begin == 0 && a.output == a.input);
        let mut col = if pointwise {
            vec![]
        } else {
            vec![F::zero(); k * y_plane]
        };
        for n in 0..s.batch {
            for g in 0..s.group {
                let xg = &x[(n * s.c + g * cg) * x_plane..][..cg * x_plane];
                let b = if pointwise {
                    xg
                } else {
                    im2col(&s.axes, xg, cg, &mut col);
                    &col
                };
                let a = Mat {
                    data: &w[g * mg * k..][..mg * k],
                    rows: mg,
                    cols: k,
                    ld: k,
                };
                let b = Mat {
                    data: b,
                    rows: k,
                    cols: y_plane,
                    ld: y_plane,
                };
                let yg = &mut y[(n * s.m + g * mg) * y_plane..][..mg * y_plane];
                gemm::gemm(a, b, yg, y_plane, threads());
            }
        }
    }
    if let Some(bias) = bias {
        add_bias(&mut y, bias, y_plane);
    }
    y
}

/// Adds `bias[c]` to every element of channel plane `c` of an `[N, C, plane]` buffer.
fn add_bias<F: Float>(y: &mut [F], bias: &[F], plane: usize) {
    for (i, p) in y.chunks_exact_mut(plane.max(1)).enumerate() {
        let b = bias[i % bias.len()];
        for v in p {
            *v = *v + b;
        }
    }
}

/// Splits `y` into planes of `plane` elements and runs `f(plane_index, plane)` on each, over
/// several threads when the buffer is large.
fn parallel_planes<F: Float>(y: &mut [F], plane: usize, f: impl Fn(usize, &mut [F]) + Sync) {
    let planes = y.len() / plane.max(1);
    let threads = if y.len() < 1 << 16 {
        1
    } else {
        threads().min(planes)
    };
    if threads <= 1 {
        for (i, p) in y.chunks_exact_mut(plane).enumerate() {
            f(i, p);
        }
        return;
    }
    let per = planes.div_ceil(threads);
    std::thread::scope(|sc| {
        for (t, chunk) in y.chunks_mut(per * plane).enumerate() {
            let f = &f;
            sc.spawn(move || {
                for (i, p) in chunk.chunks_exact_mut(plane).enumerate() {
                    f(t * per + i, p);
                }
            });
        }
    });
}

/// Fills `col` (`[cg * taps, out_plane]`) with the window contents of `x` (`[cg, in_plane]`),
/// zeros where a window reads padding.
fn im2col<F: Float>(axes: &[Axis], x: &[F], cg: usize, col: &mut [F]) {
    let in_plane: usize = axes.iter().map(|a| a.input).product();
    let out_plane: usize = axes.iter().map(|a| a.output).product();
    let taps = kernel_taps(axes);
    let last = axes[axes.len() - 1];
    for c in 0..cg {
        let xp = &x[c * in_plane..][..in_plane];
        for (t, tap) in taps.iter().enumerate() {
            let row = &mut col[(c * taps.len() + t) * out_plane..][..out_plane];
            let (lo, hi, first) = last_axis_run(&last, tap[axes.len() - 1]);
            for_each_row(axes, tap, |out_row, in_row| {
                let dst = &mut row[out_row..out_row + last.output];
                let Some(in_row) = in_row else {
                    dst.fill(F::zero());
                    return;
                };
                dst[..lo].fill(F::zero());
                dst[hi..].fill(F::zero());
                let src = &xp[in_row + first..];
                if last.stride == 1 {
                    dst[lo..hi].copy_from_slice(&src[..hi - lo]);
                } else {
                    for (d, &v) in dst[lo..hi].iter_mut().zip(src.iter().step_by(last.stride)) {
                        *d = v;
                    }
                }
            });
        }
    }
}

/// Accumulates the convolution of one input plane with one kernel (`w`, one weight per tap)
/// into `out`.
fn direct_plane<F: Float>(axes: &[Axis], x: &[F], w: &[F], out: &mut [F]) {
    let last = axes[axes.len() - 1];
    for (tap, &wv) in kernel_taps(axes).iter().zip(w) {
        let (lo, hi, first) = last_axis_run(&last, tap[axes.len() - 1]);
        if lo == hi {
            continue;
        }
        for_each_row(axes, tap, |out_row, in_row| {
            let Some(in_row) = in_row else { return };
            let dst = &mut out[out_row + lo..out_row + hi];
            let src = &x[in_row + first..];
            if last.stride == 1 {
                for (d, &v) in dst.iter_mut().zip(src) {
                    *d = *d + wv * v;
                }
            } else {
                for (d, &v) in dst.iter_mut().zip(src.iter().step_by(last.stride)) {
                    *d = *d + wv * v;
                }
            }
        });
    }
}

// ---------------------------------------------------------------------------------------------
// ConvTranspose
// ---------------------------------------------------------------------------------------------

/// Checks X/W/B of a ConvTranspose; returns the window attributes, per-axis output padding and
/// the output channel count (when known).
fn check_conv_transpose(
    a: &ConvTransposeAttrs,
    x: &TensorType,
    w: &TensorType,
    b: Option<&TensorType>,
) -> Result<(WindowAttrs, Vec<usize>, Option<usize>), OpError> {
    check_float(x.dtype, "X")?;
    if w.dtype != x.dtype {
        crate::bail!("W has dtype {} but X has {}", w.dtype, x.dtype);
    }
    let n = check_nc_spatial(x)?;
    if w.rank() != x.rank() {
        crate::bail!("W {w} must have the rank of X {x}");
    }
    let group = a.conv.group;
    if group == 0 {
        crate::bail!("group must be positive");
    }
    if let Some(c) = w.shape[0].fixed() {
        check_dim(&x.shape[1], c, || {
            format!("X {x} and W {w} disagree on the input channel count")
        })?;
        if c % group != 0 {
            crate::bail!("{c} input channels are not divisible by group {group}");
        }
    }
    let m = w.shape[1]
        .fixed()
        .map(|mg| {
            mg.checked_mul(group)
                .ok_or_else(|| OpError::new("group is too large"))
        })
        .transpose()?;
    check_bias(b, x.dtype, m)?;
    let kernel = kernel_of(&a.conv.kernel_shape, w, n)?;
    let c = &a.conv;
    let win = WindowAttrs::new(kernel, &c.strides, &c.dilations, &c.pads, c.auto_pad, false)?;
    let output_padding = per_axis(&a.output_padding, n, 0, "output_padding", true)?;
    if !a.output_shape.is_empty() && a.output_shape.len() != n {
        crate::bail!(
            "output_shape has {} values for {n} spatial axes",
            a.output_shape.len()
        );
    }
    Ok((win, output_padding, m))
}

/// Resolves axis `i` of a ConvTranspose with input extent `input` into the window of the
/// equivalent convolution over the output (`Axis::input` = the ConvTranspose output extent).
fn transpose_axis(
    a: &ConvTransposeAttrs,
    win: &WindowAttrs,
    output_padding: &[usize],
    i: usize,
    input: Option<usize>,
) -> Result<Option<Axis>, OpError> {
    let (Some(input), Some(kernel)) = (input, win.kernel[i]) else {
        return Ok(None);
    };
    let overflow = || OpError::new(format!("ConvTranspose geometry overflows on spatial axis {i}"));
    let int = |v: usize| i64::try_from(v).map_err(|_| overflow());
    let (stride, dilation) = (int(win.strides[i])?, int(win.dilations[i])?);
    let extent = int(span(kernel, win.dilations[i])?)?;
    let natural = (int(input)? - 1)
        .checked_mul(stride)
        .and_then(|v| v.checked_add(int(output_padding[i]).ok()?))
        .and_then(|v| v.checked_add(extent))
        .ok_or_else(overflow)?;
    // Total padding, split so that SAME_UPPER puts the odd element at the end and every other
    // mode at the beginning (ONNX spec; floor division, so a negative total grows the end).
    let split = |total: i64, upper: bool| {
        let half = total.div_euclid(2);
        if upper {
            (half, total - half)
        } else {
            (total - half, half)
        }
    };
    let upper = a.conv.auto_pad == AutoPad::SameUpper;
    let (pad_begin, pad_end) = if !a.output_shape.is_empty() {
        let total = natural
            .checked_sub(int(a.output_shape[i])?)
            .ok_or_else(overflow)?;
        split(total, upper)
    } else {
        match a.conv.auto_pad {
            AutoPad::SameUpper | AutoPad::SameLower => {
                let total = int(input)?
                    .checked_mul(stride)
                    .and_then(|full| natural.checked_sub(full))
                    .ok_or_else(overflow)?;
                split(total, upper)
            }
            AutoPad::Valid => (0, 0),
            AutoPad::NotSet => (int(win.pads[i].0)?, int(win.pads[i].1)?),
        }
    };
    let output = natural
        .checked_sub(pad_begin)
        .and_then(|v| v.checked_sub(pad_end))
        .ok_or_else(overflow)?;
    if output < 0 {
        crate::bail!("ConvTranspose output extent {output} on spatial axis {i} is negative");
    }
    Ok(Some(Axis {
        input: output as usize,
        kernel,
        stride: stride as usize,
        dilation: dilation as usize,
        pad_begin,
        pad_end,
        output: input,
    }))
}

fn infer_conv_transpose(a: &ConvTransposeAttrs, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    let (x, w) = (cx.ty(0)?, cx.ty(1)?);
    let (win, output_padding, m) = check_conv_transpose(a, x, w, cx.opt_ty(2))?;
    let mut shape = vec![x.shape[0].clone(), m.map_or_else(Dim::unknown, Dim::Fixed)];
    for (i, d) in x.shape[2..].iter().enumerate() {
        let axis = transpose_axis(a, &win, &output_padding, i, d.fixed())?;
        shape.push(axis.map_or_else(Dim::unknown, |ax| Dim::Fixed(ax.input)));
    }
    Ok(vec![util::with_shape(x, shape)])
}

fn eval_conv_transpose(a: &ConvTransposeAttrs, cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let (x, w, b) = (cx.input(0)?, cx.input(1)?, cx.opt_input(2));
    let (win, output_padding, _) = check_conv_transpose(
        a,
        &x.tensor_type(),
        &w.tensor_type(),
        b.map(|b| b.tensor_type()).as_ref(),
    )?;
    let axes = x.shape()[2..]
        .iter()
        .enumerate()
        .map(|(i, &d)| {
            transpose_axis(a, &win, &output_padding, i, Some(d))?
                .ok_or_else(|| OpError::new("kernel extent unknown at evaluation"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let shape = ConvShape {
        batch: x.shape()[0],
        c: x.shape()[1],
        m: w.shape()[1] * a.conv.group,
        group: a.conv.group,
        axes,
        transposed: true,
    };
    let mut out_shape = vec![shape.batch, shape.m];
    out_shape.extend(shape.axes.iter().map(|a| a.input));
    util::check_alloc(&out_shape)?;
    // The column buffer is [M/group * taps, X plane].
    let mg = shape.m / shape.group;
    util::check_alloc(&[mg, shape.taps(), shape.y_plane()])?;
    Ok(vec![shape.evaluate(x, w, b, out_shape)?])
}

/// `Y = conv_transpose(X, W) + B`: per image and group, `col = W_gᵀ · X_g` (one row per output
/// channel and tap), then each row is scattered into the output (col2im, the adjoint of im2col).
fn conv_transpose_core<F: Float>(s: &ConvShape, x: &[F], w: &[F], bias: Option<&[F]>) -> Vec<F> {
    // In `s.axes`, `input` is the Y extent and `output` the X extent (the equivalent conv).
    let x_plane = s.y_plane();
    let y_plane = s.x_plane();
    let taps = s.taps();
    let (cg, mg) = (s.c / s.group, s.m / s.group);
    let mut y = vec![F::zero(); s.batch * s.m * y_plane];
    if y.is_empty() {
        return y;
    }
    let rows = mg * taps;
    // W_gᵀ for each group: [mg * taps, cg].
    let wt: Vec<Vec<F>> = (0..s.group)
        .map(|g| {
            let wg = &w[g * cg * rows..][..cg * rows];
            let mut t = vec![F::zero(); rows * cg];
            for c in 0..cg {
                for r in 0..rows {
                    t[r * cg + c] = wg[c * rows + r];
                }
            }
            t
        })
        .collect();
    let mut col = vec![F::zero(); rows * x_plane];
    let tap_list = kernel_taps(&s.axes);
    let last = s.axes[s.axes.len() - 1];
    for n in 0..s.batch {
        for (g, wt) in wt.iter().enumerate() {
            col.fill(F::zero());
            let a = Mat {
                data: wt,
                rows,
                cols: cg,
                ld: cg,
            };
            let b = Mat {
                data: &x[(n * s.c + g * cg) * x_plane..][..cg * x_plane],
                rows: cg,
                cols: x_plane,
                ld: x_plane,
            };
            gemm::gemm(a, b, &mut col, x_plane, threads());
            for mm in 0..mg {
                let yp = &mut y[(n * s.m + g * mg + mm) * y_plane..][..y_plane];
                for (t, tap) in tap_list.iter().enumerate() {
                    let row = &col[(mm * taps + t) * x_plane..][..x_plane];
                    let (lo, hi, first) = last_axis_run(&last, tap[s.axes.len() - 1]);
                    if lo == hi {
                        continue;
                    }
                    for_each_row(&s.axes, tap, |x_row, y_row| {
                        let Some(y_row) = y_row else { return };
                        let src = &row[x_row + lo..x_row + hi];
                        let dst = &mut yp[y_row + first..];
                        for (d, &v) in dst.iter_mut().step_by(last.stride).zip(src) {
                            *d = *d + v;
                        }
                    });
                }
            }
        }
    }
    if let Some(bias) = bias {
        add_bias(&mut y, bias, y_plane);
    }
    y
}

#[cfg(test)]
mod tests;
