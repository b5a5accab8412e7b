//! Micro-kernel lowering for the misc family (see `codegen/ukernels/misc.c`): recurrent cells,
//! quantization, signal processing and RoiAlign. Each function's comment gives the iattr/fattr
//! order the C kernel reads.

use super::codes::{QuantParamCode, RnnActCode, RnnCode, WindowCode};
use super::UkCall;
use crate::error::Result;
use crate::node::NodeInfo;
use kiln_ir::ops::{quant_promote as promote, unit_root};
use kiln_ir::{
    Activation, AutoPad, ConvAttrs, DType, Op, QuantOp, RnnAttrs, RnnDirection, RnnKind, RoiPoolMode,
    SignalOp, VisionOp,
};

pub fn lower(node: &NodeInfo) -> Result<Option<UkCall>> {
    match node.op() {
        Op::Rnn(a) => rnn(node, a).map(Some),
        Op::Quant(q) => quant(node, q),
        Op::Signal(x) => signal(node, x),
        // iattr: center_point_box. Scratch: candidates, merge buffer and kept boxes (3 × N i64).
        // Its output's size depends on the data (`crate::data_dependent`).
        Op::Vision(VisionOp::NonMaxSuppression { center_point_box }) => {
            let boxes = node.input_shape(0)?;
            let scores = node.input_shape(1)?;
            if boxes.len() != 3 || boxes[2] != 4 || scores.len() != 3 {
                return Err(node.unsupported(format!(
                    "boxes {boxes:?} and scores {scores:?} must be [B, N, 4] and [B, C, N]"
                )));
            }
            Ok(Some(
                UkCall::new("nms")
                    .iattr([*center_point_box as i64])
                    .scratch((3 * boxes[1].max(1) * 8) as u64),
            ))
        }
        Op::Vision(
            op @ VisionOp::DeformConv {
                group, offset_group, ..
            },
        ) => deform_conv(node, op, *group, *offset_group).map(Some),
        Op::Vision(VisionOp::RoiAlign {
            mode,
            output_height,
            output_width,
            sampling_ratio,
            spatial_scale,
            half_pixel,
        }) => {
            let x = node.input_shape(0)?;
            let rois = node.input_shape(1)?;
            let y = node.output_shape(0)?;
            if x.len() != 4 || rois.len() != 2 || rois[1] != 4 {
                return Err(node.unsupported(format!(
                    "X {x:?} and rois {rois:?} must be [N, C, H, W] and [R, 4]"
                )));
            }
            if (x[2] == 0 || x[3] == 0) && y.iter().product::<usize>() > 0 {
                return Err(node.unsupported(format!("X has an empty spatial extent {x:?}")));
            }
            Ok(Some(
                UkCall::new("roi_align")
                    .iattr([
                        x[0] as i64,
                        x[1] as i64,
                        x[2] as i64,
                        x[3] as i64,
                        rois[0] as i64,
                        *output_height as i64,
                        *output_width as i64,
                        *sampling_ratio as i64,
                        (*mode == RoiPoolMode::Max) as i64,
                        *half_pixel as i64,
                    ])
                    .fattr([f64::from(*spatial_scale)]),
            ))
        }
        _ => Ok(None),
    }
}

const F64: u64 = 8;

/// `(code, alpha, beta)` of an activation.
fn activation(f: Activation) -> (i64, f64, f64) {
    use RnnActCode as A;
    let (code, alpha, beta) = match f {
        Activation::Relu => (A::RA_RELU, 0.0, 0.0),
        Activation::Tanh => (A::RA_TANH, 0.0, 0.0),
        Activation::Sigmoid => (A::RA_SIGMOID, 0.0, 0.0),
        Activation::Affine { alpha, beta } => (A::RA_AFFINE, alpha.into(), beta.into()),
        Activation::LeakyRelu { alpha } => (A::RA_LEAKY_RELU, alpha.into(), 0.0),
        Activation::ThresholdedRelu { alpha } => (A::RA_THRESHOLDED_RELU, alpha.into(), 0.0),
        Activation::ScaledTanh { alpha, beta } => (A::RA_SCALED_TANH, alpha.into(), beta.into()),
        Activation::HardSigmoid { alpha, beta } => (A::RA_HARD_SIGMOID, alpha.into(), beta.into()),
        Activation::Elu { alpha } => (A::RA_ELU, alpha.into(), 0.0),
        Activation::Softsign => (A::RA_SOFTSIGN, 0.0, 0.0),
        Activation::Softplus => (A::RA_SOFTPLUS, 0.0, 0.0),
    };
    (code.code(), alpha, beta)
}

/// iattr: kind, dirs, reverse, hidden, layout, input_forget, linear_before_reset, has_clip,
/// seq, batch, input, n_act, act codes; fattr: clip, (alpha, beta) per activation.
fn rnn(node: &NodeInfo, a: &RnnAttrs) -> Result<UkCall> {
    let x = node.input_shape(0)?;
    if x.len() != 3 {
        return Err(node.unsupported(format!("X must have rank 3, got {x:?}")));
    }
    let (seq, batch) = if a.layout == 1 { (x[1], x[0]) } else { (x[0], x[1]) };
    let input = x[2];
    let (kind, gates) = match a.kind {
        RnnKind::Rnn => (RnnCode::RNN_RNN, 1),
        RnnKind::Gru => (RnnCode::RNN_GRU, 3),
        RnnKind::Lstm => (RnnCode::RNN_LSTM, 4),
    };
    let dirs = match a.direction {
        RnnDirection::Bidirectional => 2,
        _ => 1,
    };
    let per = match kind {
        RnnCode::RNN_RNN => 1,
        RnnCode::RNN_GRU => 2,
        RnnCode::RNN_LSTM => 3,
    };
    if a.activations.len() != per * dirs {
        return Err(node.unsupported(format!(
            "{} activations given, {} expected",
            a.activations.len(),
            per * dirs
        )));
    }
    if let Some(t) = node.input_dtype(4) {
        if t != kiln_ir::DType::I32 {
            return Err(node.unsupported(format!("sequence_lens must be i32, got {t}")));
        }
    }
    let hidden = a.hidden_size;
    let acts: Vec<(i64, f64, f64)> = a.activations.iter().map(|&f| activation(f)).collect();
    let task = input + 4 * hidden + gates * hidden;
    let scratch = (dirs * batch * task) as u64 * F64;
    Ok(UkCall::new("rnn")
        .iattr([
            kind.code(),
            dirs as i64,
            (a.direction == RnnDirection::Reverse) as i64,
            hidden as i64,
            a.layout as i64,
            a.input_forget as i64,
            a.linear_before_reset as i64,
            a.clip.is_some() as i64,
            seq as i64,
            batch as i64,
            input as i64,
            acts.len() as i64,
        ])
        .iattr(acts.iter().map(|a| a.0))
        .fattr([a.clip.map_or(0.0, f64::from)])
        .fattr(acts.iter().flat_map(|a| [a.1, a.2]))
        .scratch(scratch))
}

// ---------------------------------------------------------------------------------------------
// Quantization

fn quant(node: &NodeInfo, q: &QuantOp) -> Result<Option<UkCall>> {
    Ok(Some(match q {
        QuantOp::QuantizeLinear {
            axis,
            block_size,
            output_dtype,
            precision,
        } => {
            let x = node.input_shape(0)?;
            let xd = dtype(node, 0)?;
            let sd = dtype(node, 1)?;
            let prec = precision.unwrap_or(promote(xd, sd));
            let (lo, hi) = kiln_ir::ops::quant_range(*output_dtype)
                .map(|(lo, hi)| (lo as i64, hi as i64))
                .ok_or_else(|| node.unsupported(format!("cannot quantize to {output_dtype}")))?;
            UkCall::new("quantize_linear")
                .iattr([prec as i64, lo, hi])
                .iattr(param_layout(node, &x, 1, *axis, *block_size)?)
                .iattr(param_layout(node, &x, 2, *axis, *block_size)?)
        }
        QuantOp::DequantizeLinear { axis, block_size, .. } => {
            let x = node.input_shape(0)?;
            let work = if dtype(node, 1)? == DType::F64 {
                DType::F64
            } else {
                DType::F32
            };
            UkCall::new("dequantize_linear")
                .iattr([work as i64])
                .iattr(param_layout(node, &x, 1, *axis, *block_size)?)
                .iattr(param_layout(node, &x, 2, *axis, *block_size)?)
        }
        QuantOp::DynamicQuantizeLinear => {
            if node.input_shape(0)?.iter().product::<usize>() == 0 {
                return Err(node.unsupported("DynamicQuantizeLinear of an empty tensor has no range"));
            }
            UkCall::new("dynamic_quantize_linear")
        }
        QuantOp::MatMulInteger => matmul_integer(node, false)?,
        QuantOp::QLinearMatMul => matmul_integer(node, true)?,
        QuantOp::ConvInteger(a) => conv_integer(node, a, false)?,
        QuantOp::QLinearConv(a) => conv_integer(node, a, true)?,
        // The CPU GEMM's alone (`gen::gemm::nibbles`); other targets never see the operator
        // (`dequantize-weights` makes it a float product).
        QuantOp::BlockQuantizedMatMul { .. } => {
            return Err(node.unsupported(
                "block-quantized weights need the CPU GEMM kernel (f32 A of static shape, constant weights of at most 4 bits)",
            ))
        }
    }))
}

fn dtype(node: &NodeInfo, i: usize) -> Result<DType> {
    node.input_dtype(i)
        .ok_or_else(|| node.unsupported(format!("input {i} is missing")))
}

/// The layout `[kind, inner, dim, block, blocks]` (misc.c `param_index`) of input `i`, a scale
/// or zero point of the tensor of shape `x`; per tensor when the input is absent.
fn param_layout(node: &NodeInfo, x: &[usize], i: usize, axis: i64, block_size: usize) -> Result<[i64; 5]> {
    let per_tensor = [QuantParamCode::QP_TENSOR.code(), 0, 0, 0, 0];
    if !node.has_input(i) {
        return Ok(per_tensor);
    }
    let p = node.input_shape(i)?;
    if p.iter().product::<usize>() == 1 {
        return Ok(per_tensor);
    }
    let ax = norm_axis(node, axis, x.len())?;
    let inner: usize = x[ax + 1..].iter().product();
    let dim = x[ax];
    if block_size == 0 {
        if p.len() != 1 || p[0] != dim {
            return Err(node.unsupported(format!(
                "input {i} of shape {p:?} must be 1-D of length {dim} (axis {axis} of {x:?})"
            )));
        }
        return Ok([QuantParamCode::QP_AXIS.code(), inner as i64, dim as i64, 0, 0]);
    }
    let blocks = dim.div_ceil(block_size);
    let expected: Vec<usize> = x
        .iter()
        .enumerate()
        .map(|(k, &d)| if k == ax { blocks } else { d })
        .collect();
    if p != expected {
        return Err(node.unsupported(format!(
            "input {i} of shape {p:?} does not match blocked quantization of {x:?} with block_size {block_size} (expected {expected:?})"
        )));
    }
    Ok([
        QuantParamCode::QP_BLOCKED.code(),
        inner as i64,
        dim as i64,
        block_size as i64,
        blocks as i64,
    ])
}

fn norm_axis(node: &NodeInfo, axis: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    if axis < -r || axis >= r {
        return Err(node.unsupported(format!("axis {axis} is out of range for rank {rank}")));
    }
    Ok(if axis < 0 { axis + r } else { axis } as usize)
}

/// `[r, dims[r], strides[r]]` (misc.c `bcast_index`): where in parameter `p` each element of a
/// tensor of shape `target` reads, numpy broadcasting rules.
fn bcast(node: &NodeInfo, what: &str, p: &[usize], target: &[usize]) -> Result<Vec<i64>> {
    if p.iter().product::<usize>() <= 1 {
        return Ok(vec![0]);
    }
    if p.len() > target.len() {
        return Err(node.unsupported(format!("{what} of shape {p:?} does not broadcast to {target:?}")));
    }
    let r = target.len();
    let mut strides = vec![0i64; r];
    let mut stride = 1i64;
    for k in (0..p.len()).rev() {
        let t = r - p.len() + k;
        if p[k] == target[t] {
            strides[t] = stride;
        } else if p[k] != 1 {
            return Err(node.unsupported(format!("{what} of shape {p:?} does not broadcast to {target:?}")));
        }
        stride *= p[k] as i64;
    }
    let mut v = vec![r as i64];
    v.extend(target.iter().map(|&d| d as i64));
    v.extend(strides);
    Ok(v)
}

/// The broadcast of optional input `i` onto `target`, its 1-D form taken as one value per row
/// when `per_row` (the reference's `[M] -> [M, 1]` for a and y parameters).
fn bcast_input(
    node: &NodeInfo,
    i: usize,
    target: &[usize],
    per_row: bool,
    a_rank: usize,
) -> Result<Vec<i64>> {
    if !node.has_input(i) {
        return Ok(vec![0]);
    }
    let mut p = node.input_shape(i)?;
    if per_row && p.len() == 1 && p[0] != 1 && a_rank >= 2 {
        p = vec![p[0], 1];
    }
    bcast(node, &format!("input {i}"), &p, target)
}

/// Strides of a row-major shape, 0 on broadcast (extent-1) axes.
fn row_major_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![0; shape.len()];
    let mut acc = 1;
    for k in (0..shape.len()).rev() {
        s[k] = if shape[k] == 1 { 0 } else { acc };
        acc *= shape[k];
    }
    s
}

/// iattr: qlinear, M, K, N, nbatch, a_zp, b_zp bcasts, (qlinear: a_scale, b_scale, y_scale,
/// y_zero_point bcasts onto the output), (A offset, B offset) per batch.
fn matmul_integer(node: &NodeInfo, q: bool) -> Result<UkCall> {
    let (ib, iza, izb) = if q { (3, 2, 5) } else { (1, 2, 3) };
    let ash = node.input_shape(0)?;
    let bsh = node.input_shape(ib)?;
    let out = node.output_shape(0)?;
    if ash.is_empty() || bsh.is_empty() {
        return Err(node.unsupported("matmul operands must have rank >= 1"));
    }
    let a2 = if ash.len() == 1 {
        vec![1, ash[0]]
    } else {
        ash.clone()
    };
    let b2 = if bsh.len() == 1 {
        vec![bsh[0], 1]
    } else {
        bsh.clone()
    };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (kb, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k != kb {
        return Err(node.unsupported(format!("inner dimensions differ: {ash:?} vs {bsh:?}")));
    }
    let (ab, bb) = (&a2[..a2.len() - 2], &b2[..b2.len() - 2]);
    let r = ab.len().max(bb.len());
    let pad = |s: &[usize]| {
        let mut v = vec![1; r - s.len()];
        v.extend_from_slice(s);
        v
    };
    let (ab, bb) = (pad(ab), pad(bb));
    let batch: Vec<usize> = ab.iter().zip(&bb).map(|(&x, &y)| x.max(y)).collect();
    let nbatch: usize = batch.iter().product();
    if nbatch * m * n != out.iter().product::<usize>() {
        return Err(node.unsupported(format!("output shape {out:?} does not match {ash:?} x {bsh:?}")));
    }
    let (sa, sb) = (row_major_strides(&ab), row_major_strides(&bb));
    let mut offsets = Vec::with_capacity(2 * nbatch);
    for bi in 0..nbatch {
        let (mut rem, mut oa, mut ob) = (bi, 0, 0);
        for d in (0..r).rev() {
            let c = rem % batch[d];
            rem /= batch[d];
            oa += c * sa[d];
            ob += c * sb[d];
        }
        offsets.push((oa * m * k) as i64);
        offsets.push((ob * k * n) as i64);
    }
    let mut call = UkCall::new("matmul_integer")
        .iattr([q as i64, m as i64, k as i64, n as i64, nbatch as i64])
        .iattr(bcast_input(node, iza, &ash, true, ash.len())?)
        .iattr(bcast_input(node, izb, &bsh, false, ash.len())?);
    if q {
        let sdt = dtype(node, 1)?;
        for i in [4, 6] {
            if dtype(node, i)? != sdt {
                return Err(node.unsupported("scales must share one dtype"));
            }
        }
        call = call
            .iattr(bcast_input(node, 1, &out, true, ash.len())?)
            .iattr(bcast_input(node, 4, &out, false, ash.len())?)
            .iattr(bcast_input(node, 6, &out, true, ash.len())?)
            .iattr(bcast_input(node, 7, &out, true, ash.len())?);
    }
    let numel = |s: &[usize]| s.iter().product::<usize>() as u64;
    let scratch = 4 * (numel(&ash) + numel(&bsh) + (nbatch * m * n) as u64);
    Ok(call.iattr(offsets).scratch(scratch))
}

/// iattr: qlinear, nsp, N, C, M, group, in, out, kernel, stride, dilation, pad_begin (nsp each).
fn conv_integer(node: &NodeInfo, a: &ConvAttrs, q: bool) -> Result<UkCall> {
    let iw = if q { 3 } else { 1 };
    let x = node.input_shape(0)?;
    let w = node.input_shape(iw)?;
    let y = node.output_shape(0)?;
    if x.len() < 3 || w.len() != x.len() || y.len() != x.len() {
        return Err(node.unsupported(format!(
            "X {x:?} and W {w:?} must be [N, C, spatial...] and [M, C/group, k...]"
        )));
    }
    let nsp = x.len() - 2;
    if nsp > 8 {
        return Err(node.unsupported(format!("{nsp} spatial axes; at most 8 are compiled")));
    }
    let group = a.group.max(1);
    let (c, m) = (x[1], w[0]);
    if c % group != 0 || m % group != 0 || w[1] * group != c {
        return Err(node.unsupported(format!(
            "channels {c} and {m} do not split into {group} groups of W {w:?}"
        )));
    }
    let singles: &[(usize, &str)] = if q {
        &[
            (2, "x_zero_point"),
            (1, "x_scale"),
            (6, "y_scale"),
            (7, "y_zero_point"),
        ]
    } else {
        &[(2, "x_zero_point")]
    };
    for &(i, what) in singles {
        if node.has_input(i) && node.input_shape(i)?.iter().product::<usize>() != 1 {
            return Err(node.unsupported(format!("{what} must be a single value")));
        }
    }
    let izw = if q { 5 } else { 3 };
    let per_channel: &[usize] = if q { &[izw, 4] } else { &[izw] };
    for &i in per_channel {
        if node.has_input(i) {
            let n = node.input_shape(i)?.iter().product::<usize>();
            if n != 1 && n != m {
                return Err(node.unsupported(format!("input {i} must have 1 or {m} values, got {n}")));
            }
        }
    }
    if q {
        let sdt = dtype(node, 1)?;
        for i in [4, 6] {
            if dtype(node, i)? != sdt {
                return Err(node.unsupported("scales must share one dtype"));
            }
        }
    }
    let per = |v: &[usize], default: usize| -> Vec<usize> {
        if v.is_empty() {
            vec![default; nsp]
        } else {
            v.to_vec()
        }
    };
    let kernel = w[2..].to_vec();
    let strides = per(&a.strides, 1);
    let dil = per(&a.dilations, 1);
    if strides.len() != nsp || dil.len() != nsp {
        return Err(node.unsupported("strides and dilations must have one value per spatial axis"));
    }
    let mut pads = Vec::with_capacity(nsp);
    for d in 0..nsp {
        let extent = (kernel[d].max(1) - 1) * dil[d] + 1;
        let begin = match a.auto_pad {
            AutoPad::NotSet => a.pads.get(d).copied().unwrap_or(0),
            AutoPad::Valid => 0,
            AutoPad::SameUpper | AutoPad::SameLower => {
                let out = x[2 + d].div_ceil(strides[d]);
                let needed = out.saturating_sub(1) * strides[d] + extent;
                let total = if out == 0 {
                    0
                } else {
                    needed.saturating_sub(x[2 + d])
                };
                if a.auto_pad == AutoPad::SameUpper {
                    total / 2
                } else {
                    total.div_ceil(2)
                }
            }
        };
        pads.push(begin as i64);
    }
    let dims = |v: &[usize]| v.iter().map(|&d| d as i64).collect::<Vec<i64>>();
    let scratch = 4 * (x.iter().product::<usize>() + w.iter().product::<usize>()) as u64;
    Ok(UkCall::new("conv_integer")
        .iattr([
            q as i64,
            nsp as i64,
            x[0] as i64,
            c as i64,
            m as i64,
            group as i64,
        ])
        .iattr(dims(&x[2..]))
        .iattr(dims(&y[2..]))
        .iattr(dims(&kernel))
        .iattr(dims(&strides))
        .iattr(dims(&dil))
        .iattr(pads)
        .scratch(scratch))
}

// ---------------------------------------------------------------------------------------------
// Signal processing

/// The integer value of input `i`, which must be known at compile time.
fn known_int(node: &NodeInfo, i: usize, what: &str) -> Result<Option<i64>> {
    if !node.has_input(i) {
        return Ok(None);
    }
    let t = node
        .known(i)
        .ok_or_else(|| node.unsupported(format!("{what} must be known at compile time")))?;
    match t.to_i64_vec().as_slice() {
        [v] => Ok(Some(*v)),
        _ => Err(node.unsupported(format!("{what} must be a scalar"))),
    }
}

/// `exp(∓2πik/n)` for k in 0..n as (re, im) pairs.
fn twiddles(n: usize, inverse: bool) -> Vec<f64> {
    let sign = if inverse { 1.0 } else { -1.0 };
    (0..n)
        .flat_map(|k| {
            let (c, s) = unit_root(k as u128, n as u128);
            [c, sign * s]
        })
        .collect()
}

fn signal(node: &NodeInfo, op: &SignalOp) -> Result<Option<UkCall>> {
    Ok(Some(match *op {
        SignalOp::Dft { inverse, onesided } => {
            let x = node.input_shape(0)?;
            let y = node.output_shape(0)?;
            let rank = x.len();
            if rank < 2 {
                return Err(node.unsupported("input must have rank at least 2"));
            }
            let axis = known_int(node, 2, "axis")?.unwrap_or(-2);
            let r = rank as i64;
            let a = if axis < 0 { axis + r } else { axis };
            if a < 0 || a > r - 2 {
                return Err(node.unsupported(format!("axis {axis} is out of range for rank {rank}")));
            }
            let a = a as usize;
            let n_in = x[a];
            let irfft = inverse && onesided;
            let n = match known_int(node, 1, "dft_length")? {
                Some(v) if v < 1 => {
                    return Err(node.unsupported(format!("dft_length must be positive, got {v}")))
                }
                Some(v) => v as usize,
                None if irfft => 2 * n_in.saturating_sub(1),
                None => n_in,
            };
            if n == 0 {
                return Err(node.unsupported("the transform length is 0"));
            }
            let out_len = y[a];
            let outer: usize = x[..a].iter().product();
            let inner: usize = x[a + 1..rank - 1].iter().product();
            let take = if irfft { (n / 2 + 1).min(n_in) } else { n.min(n_in) };
            UkCall::new("dft")
                .iattr([
                    n as i64,
                    n_in as i64,
                    out_len as i64,
                    x[rank - 1] as i64,
                    y[rank - 1] as i64,
                    outer as i64,
                    inner as i64,
                    take as i64,
                    irfft as i64,
                    inverse as i64,
                ])
                .fattr(twiddles(n, inverse))
                .scratch((outer * inner * 4 * n) as u64 * F64)
        }
        SignalOp::Stft { .. } => {
            let x = node.input_shape(0)?;
            let y = node.output_shape(0)?;
            if x.len() != 3 || y.len() != 4 {
                return Err(node.unsupported(format!("signal {x:?} must be [batch, length, 1|2]")));
            }
            let step =
                known_int(node, 1, "frame_step")?.ok_or_else(|| node.unsupported("frame_step is missing"))?;
            if step < 1 {
                return Err(node.unsupported(format!("frame_step must be positive, got {step}")));
            }
            let fl = match known_int(node, 3, "frame_length")? {
                Some(v) => v as usize,
                None if node.has_input(2) => node.input_shape(2)?[0],
                None => x[1],
            };
            if fl == 0 || fl > x[1] {
                return Err(node.unsupported(format!(
                    "frame_length {fl} does not fit the signal of {} samples",
                    x[1]
                )));
            }
            let (frames, bins) = (y[1], y[2]);
            UkCall::new("stft")
                .iattr([
                    x[0] as i64,
                    x[1] as i64,
                    x[2] as i64,
                    fl as i64,
                    step,
                    frames as i64,
                    bins as i64,
                ])
                .fattr(twiddles(fl, false))
                .scratch((x[0] * frames * 4 * fl) as u64 * F64)
        }
        SignalOp::HannWindow { periodic, .. } => window(node, WindowCode::WIN_HANN, periodic)?,
        SignalOp::HammingWindow { periodic, .. } => window(node, WindowCode::WIN_HAMMING, periodic)?,
        SignalOp::BlackmanWindow { periodic, .. } => window(node, WindowCode::WIN_BLACKMAN, periodic)?,
        // Its inputs are scalars that fix the output shape, so it is always folded at compile
        // time; a kernel would never run.
        SignalOp::MelWeightMatrix { .. } => return Ok(None),
    }))
}

/// iattr: kind, size, periodic.
fn window(node: &NodeInfo, kind: WindowCode, periodic: bool) -> Result<UkCall> {
    let size = node.output_shape(0)?[0];
    Ok(UkCall::new("window").iattr([kind.code(), size as i64, periodic as i64]))
}

/// The deformable convolution's geometry (`kiln_uk_deform_conv` in misc.c). iattr: r (spatial
/// rank), N, C, M, group, offset_group, has_bias, has_mask, then per spatial axis the input
/// extent, kernel, output extent, stride, dilation and padding before.
pub(crate) fn deform_conv(
    node: &NodeInfo,
    op: &VisionOp,
    group: usize,
    offset_group: usize,
) -> Result<UkCall> {
    let (x, w) = (node.input_shape(0)?, node.input_shape(1)?);
    let r = x.len().saturating_sub(2);
    if r == 0 || w.len() != x.len() || r > 8 {
        return Err(node.unsupported(format!(
            "X {x:?} and W {w:?} must be [N, C, spatial...] of rank 3 to 10"
        )));
    }
    let axes =
        kiln_ir::ops::deform_conv_axes(op, &w[2..], &x[2..]).map_err(|e| node.unsupported(e.to_string()))?;
    let mut iattr = vec![
        r as i64,
        x[0] as i64,
        x[1] as i64,
        w[0] as i64,
        group as i64,
        offset_group as i64,
        node.has_input(3) as i64,
        node.has_input(4) as i64,
    ];
    for a in &axes {
        iattr.extend([
            a.input as i64,
            a.kernel as i64,
            a.output as i64,
            a.stride as i64,
            a.dilation as i64,
            a.pad_begin,
        ]);
    }
    Ok(UkCall::new("deform_conv").iattr(iattr))
}
