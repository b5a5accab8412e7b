//! The quantized and integer-arithmetic operators.
//!
//! Semantics follow the ONNX reference implementation exactly, including its numpy dtype
//! promotions, because those decide the last bit of a requantized result: scale products are
//! computed in the scales' own dtype, and an `int32` accumulator times a float multiplier is a
//! `float64` product. Rounding is always half to even (`np.rint`), followed by saturation to
//! the target integer range.
//!
//! The integer convolutions reuse the float convolution of `conv.rs` on `f64` copies of the
//! zero-point-corrected operands: every product and partial sum of 8/16-bit integers is an
//! integer far below 2^53, so the `f64` computation is exact and the geometry (padding,
//! `auto_pad`, groups, dilations) is shared instead of duplicated.

use super::{util, EvalCtx, InferCtx};
use crate::{ConvAttrs, DType, Dim, Op, OpError, Tensor, TensorData, TensorType};

/// The quantized and integer-arithmetic operators.
#[derive(Clone, PartialEq, Debug)]
pub enum QuantOp {
    /// Inputs: x, y_scale, y_zero_point?. Outputs: y of `output_dtype` (the zero point's dtype
    /// when present, resolved by the importer). Scale and zero point are per tensor (one
    /// element), per axis (1-D along `axis`) or blocked (`block_size > 0`: same rank as x,
    /// `ceil(x[axis] / block_size)` along `axis`). `precision` is the dtype of the division
    /// (`None`: numpy promotion of x and the scale).
    QuantizeLinear {
        axis: i64,
        block_size: usize,
        output_dtype: DType,
        precision: Option<DType>,
    },
    /// Inputs: x, x_scale, x_zero_point?. Outputs: y of `output_dtype` (default: the scale's
    /// dtype). Scale layouts as for `QuantizeLinear`.
    DequantizeLinear {
        axis: i64,
        block_size: usize,
        output_dtype: Option<DType>,
    },
    /// Inputs: x (float). Outputs: y (u8), y_scale (scalar, x's dtype), y_zero_point (u8 scalar).
    DynamicQuantizeLinear,
    /// Inputs: a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point.
    /// numpy `matmul` shapes; output dtype is y_zero_point's.
    QLinearMatMul,
    /// Inputs: A, B, a_zero_point?, b_zero_point?. numpy `matmul` shapes; output i32.
    MatMulInteger,
    /// Inputs: x, w, x_zero_point?, w_zero_point? (scalar or per output channel). Output i32.
    ConvInteger(ConvAttrs),
    /// Inputs: x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B?
    /// (i32 bias). Output dtype is y_zero_point's.
    QLinearConv(ConvAttrs),
    /// A float product with block-quantized weights (onnxruntime's MatMulNBits, its integers
    /// unpacked one per byte): inputs A (f32 `[..., K]`), Q (u8 `[N, K]`, every value below
    /// `2^bits`), scales (f32 `[N, blocks]`), zero_points (u8 `[N, blocks]`), with `blocks =
    /// ceil(K / block_size)`. Output f32 `[..., N]`: `A · Wᵀ` where `W[n, k] = (Q[n, k] -
    /// zp[n, b]) · scale[n, b]` for `b = k / block_size`, computed in f32 like the
    /// DequantizeLinear it replaces. The weights stay integers in the IR so that a target
    /// can store and read `bits` bits per weight (codegen's GEMM on nibbles) instead of f32.
    BlockQuantizedMatMul { bits: u32, block_size: usize },
}

impl QuantOp {
    pub fn name(&self) -> &'static str {
        match self {
            QuantOp::QuantizeLinear { .. } => "QuantizeLinear",
            QuantOp::DequantizeLinear { .. } => "DequantizeLinear",
            QuantOp::DynamicQuantizeLinear => "DynamicQuantizeLinear",
            QuantOp::QLinearMatMul => "QLinearMatMul",
            QuantOp::MatMulInteger => "MatMulInteger",
            QuantOp::ConvInteger(_) => "ConvInteger",
            QuantOp::QLinearConv(_) => "QLinearConv",
            QuantOp::BlockQuantizedMatMul { .. } => "BlockQuantizedMatMul",
        }
    }
}

pub(crate) fn infer(op: &Op, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    let Op::Quant(op) = op else {
        crate::bail!("{} is not in the quant family", op.name())
    };
    match op {
        QuantOp::QuantizeLinear {
            axis,
            block_size,
            output_dtype,
            precision,
        } => infer_quantize(*axis, *block_size, *output_dtype, *precision, cx),
        QuantOp::DequantizeLinear {
            axis,
            block_size,
            output_dtype,
        } => infer_dequantize(*axis, *block_size, *output_dtype, cx),
        QuantOp::DynamicQuantizeLinear => infer_dynamic(cx),
        QuantOp::MatMulInteger => infer_matmul_integer(cx),
        QuantOp::QLinearMatMul => infer_qlinear_matmul(cx),
        QuantOp::ConvInteger(a) => infer_conv_integer(a, cx),
        QuantOp::QLinearConv(a) => infer_qlinear_conv(a, cx),
        QuantOp::BlockQuantizedMatMul { bits, block_size } => {
            infer_block_quantized_matmul(*bits, *block_size, cx)
        }
    }
}

pub(crate) fn eval(op: &Op, cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let Op::Quant(op) = op else {
        crate::bail!("{} is not in the quant family", op.name())
    };
    match op {
        QuantOp::QuantizeLinear {
            axis,
            block_size,
            output_dtype,
            precision,
        } => eval_quantize(*axis, *block_size, *output_dtype, *precision, cx),
        QuantOp::DequantizeLinear {
            axis,
            block_size,
            output_dtype,
        } => eval_dequantize(*axis, *block_size, *output_dtype, cx),
        QuantOp::DynamicQuantizeLinear => eval_dynamic(cx),
        QuantOp::MatMulInteger => eval_matmul_integer(cx),
        QuantOp::QLinearMatMul => eval_qlinear_matmul(cx),
        QuantOp::ConvInteger(a) => eval_conv_integer(a, cx),
        QuantOp::QLinearConv(a) => eval_qlinear_conv(a, cx),
        QuantOp::BlockQuantizedMatMul { bits, block_size } => {
            eval_block_quantized_matmul(*bits, *block_size, cx)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Numeric helpers
// ---------------------------------------------------------------------------------------------

/// The saturation range of a quantized integer dtype (None for a dtype QuantizeLinear does
/// not produce).
pub fn int_range(d: DType) -> Option<(f64, f64)> {
    Some(match d {
        DType::U8 => (0.0, 255.0),
        DType::I8 => (-128.0, 127.0),
        DType::U16 => (0.0, 65535.0),
        DType::I16 => (-32768.0, 32767.0),
        _ => return None,
    })
}

fn check_quant_dtype(d: DType, what: &str) -> Result<(f64, f64), OpError> {
    int_range(d).ok_or_else(|| OpError::new(format!("{what} must be u8, i8, u16 or i16, got {d}")))
}

fn check_8bit(d: DType, what: &str) -> Result<(), OpError> {
    if !matches!(d, DType::U8 | DType::I8) {
        crate::bail!("{what} must be u8 or i8, got {d}");
    }
    Ok(())
}

fn check_float(d: DType, what: &str) -> Result<(), OpError> {
    if !d.is_float() {
        crate::bail!("{what} must be a floating-point tensor, got {d}");
    }
    Ok(())
}

/// Rounds `v` to the precision of float dtype `d` (the result of one numpy operation in `d`).
fn round_to(d: DType, v: f64) -> f64 {
    match d {
        DType::F32 => v as f32 as f64,
        DType::F16 => crate::tensor::f16_from_f64(v).to_f64(),
        DType::BF16 => crate::tensor::bf16_from_f64(v).to_f64(),
        _ => v,
    }
}

/// numpy's result dtype of a binary operation on a float or i32 tensor and a float tensor
/// (bf16, which numpy lacks, pairs up as f32): the precision the quantize/dequantize
/// arithmetic runs in when the model does not set one.
pub fn promote(a: DType, b: DType) -> DType {
    if a == b {
        a
    } else if a == DType::F64 || b == DType::F64 || !a.is_float() || !b.is_float() {
        // i32 with any float promotes to f64 in numpy.
        DType::F64
    } else {
        DType::F32
    }
}

/// Rounds half to even and saturates to `[lo, hi]`; NaN becomes `lo`, as numpy's cast of NaN
/// to int32 gives INT_MIN before the clip.
fn saturate(v: f64, (lo, hi): (f64, f64)) -> f64 {
    if v.is_nan() {
        lo
    } else {
        v.round_ties_even().clamp(lo, hi)
    }
}

// ---------------------------------------------------------------------------------------------
// Scale / zero-point layouts
// ---------------------------------------------------------------------------------------------

/// How a scale or zero point maps onto the elements of the tensor it quantizes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum ParamLayout {
    /// One value for all elements.
    PerTensor,
    /// A 1-D parameter indexed by the coordinate along an axis of extent `dim` whose inner
    /// (faster) axes have `inner` elements.
    PerAxis { inner: usize, dim: usize },
    /// The tensor's shape with `blocks` values along the axis: one per `block` consecutive
    /// indices.
    Blocked {
        inner: usize,
        dim: usize,
        block: usize,
        blocks: usize,
    },
}

impl ParamLayout {
    /// Resolves the layout of a parameter of shape `p` for a tensor of shape `x` (the rules of
    /// the reference `reshape_input`: a single element is per tensor, whatever its rank).
    fn new(x: &[usize], p: &[usize], axis: i64, block_size: usize, what: &str) -> Result<Self, OpError> {
        if p.iter().product::<usize>() == 1 {
            return Ok(ParamLayout::PerTensor);
        }
        let ax = util::norm_axis(axis, x.len())
            .map_err(|e| OpError::new(format!("{what}: per-axis quantization: {}", e.msg)))?;
        let inner: usize = x[ax + 1..].iter().product();
        let dim = x[ax];
        if block_size == 0 {
            if p.len() != 1 || p[0] != dim {
                crate::bail!("{what} of shape {p:?} must be 1-D of length {dim} (axis {axis} of {x:?})");
            }
            return Ok(ParamLayout::PerAxis { inner, dim });
        }
        let blocks = dim.div_ceil(block_size);
        let expected: Vec<usize> = x
            .iter()
            .enumerate()
            .map(|(i, &d)| if i == ax { blocks } else { d })
            .collect();
        if p != expected.as_slice() {
            crate::bail!(
                "{what} of shape {p:?} does not match blocked quantization of {x:?} with block_size \
                 {block_size} on axis {axis} (expected {expected:?})"
            );
        }
        Ok(ParamLayout::Blocked {
            inner,
            dim,
            block: block_size,
            blocks,
        })
    }

    /// The parameter's flat index for the tensor's flat index `i` (only called with `i` inside
    /// a non-empty tensor, so `inner` and `dim` are non-zero).
    fn index(&self, i: usize) -> usize {
        match *self {
            ParamLayout::PerTensor => 0,
            ParamLayout::PerAxis { inner, dim } => (i / inner) % dim,
            ParamLayout::Blocked {
                inner,
                dim,
                block,
                blocks,
            } => {
                let a = (i / inner) % dim;
                let outer = i / (inner * dim);
                (outer * blocks + a / block) * inner + i % inner
            }
        }
    }
}

/// Checks a scale or zero point against x in inference, where shapes are known.
fn check_param_type(
    x: &TensorType,
    p: &TensorType,
    axis: i64,
    block_size: usize,
    what: &str,
) -> Result<(), OpError> {
    if let (Some(xs), Some(ps)) = (x.fixed_shape(), p.fixed_shape()) {
        ParamLayout::new(&xs, &ps, axis, block_size, what)?;
    } else if block_size == 0 && p.rank() > 1 {
        crate::bail!("{what} must be a scalar or 1-D without block_size, got {p}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// QuantizeLinear / DequantizeLinear
// ---------------------------------------------------------------------------------------------

fn infer_quantize(
    axis: i64,
    block_size: usize,
    out: DType,
    precision: Option<DType>,
    cx: &InferCtx,
) -> Result<Vec<TensorType>, OpError> {
    let (x, scale) = (cx.ty(0)?, cx.ty(1)?);
    if !x.dtype.is_float() && x.dtype != DType::I32 {
        crate::bail!("x must be a float or i32 tensor, got {}", x.dtype);
    }
    check_float(scale.dtype, "y_scale")?;
    check_quant_dtype(out, "the output dtype")?;
    if let Some(p) = precision {
        check_float(p, "precision")?;
    }
    check_param_type(x, scale, axis, block_size, "y_scale")?;
    if let Some(zp) = cx.opt_ty(2) {
        if zp.dtype != out {
            crate::bail!("y_zero_point has dtype {} but the output is {out}", zp.dtype);
        }
        check_param_type(x, zp, axis, block_size, "y_zero_point")?;
    }
    Ok(vec![retyped(x, out)])
}

fn eval_quantize(
    axis: i64,
    block_size: usize,
    out: DType,
    precision: Option<DType>,
    cx: &EvalCtx,
) -> Result<Vec<Tensor>, OpError> {
    let (x, scale, zp) = (cx.input(0)?, cx.input(1)?, cx.opt_input(2));
    let range = check_quant_dtype(out, "the output dtype")?;
    let prec = precision.unwrap_or_else(|| promote(x.dtype(), scale.dtype()));
    let s_layout = ParamLayout::new(x.shape(), scale.shape(), axis, block_size, "y_scale")?;
    let s = scale.to_f64_vec();
    let (z_layout, z) = match zp {
        Some(zp) => (
            ParamLayout::new(x.shape(), zp.shape(), axis, block_size, "y_zero_point")?,
            zp.to_f64_vec(),
        ),
        None => (ParamLayout::PerTensor, vec![0.0]),
    };
    let xv = x.to_f64_vec();
    let vals = xv.iter().enumerate().map(|(i, &v)| {
        let q = round_to(prec, round_to(prec, v) / round_to(prec, s[s_layout.index(i)]));
        let q = q.round_ties_even();
        if q.is_nan() {
            range.0
        } else {
            (q + z[z_layout.index(i)]).clamp(range.0, range.1)
        }
    });
    let data = TensorData::from_f64s(out, vals);
    Ok(vec![tensor(x.shape().to_vec(), data)?])
}

fn infer_dequantize(
    axis: i64,
    block_size: usize,
    out: Option<DType>,
    cx: &InferCtx,
) -> Result<Vec<TensorType>, OpError> {
    let (x, scale) = (cx.ty(0)?, cx.ty(1)?);
    if int_range(x.dtype).is_none() && x.dtype != DType::I32 {
        crate::bail!("x must be a u8, i8, u16, i16 or i32 tensor, got {}", x.dtype);
    }
    check_float(scale.dtype, "x_scale")?;
    let out = out.unwrap_or(scale.dtype);
    check_float(out, "the output dtype")?;
    check_param_type(x, scale, axis, block_size, "x_scale")?;
    if let Some(zp) = cx.opt_ty(2) {
        if zp.dtype != x.dtype {
            crate::bail!("x_zero_point has dtype {} but x has {}", zp.dtype, x.dtype);
        }
        check_param_type(x, zp, axis, block_size, "x_zero_point")?;
    }
    Ok(vec![retyped(x, out)])
}

fn eval_dequantize(
    axis: i64,
    block_size: usize,
    out: Option<DType>,
    cx: &EvalCtx,
) -> Result<Vec<Tensor>, OpError> {
    let (x, scale, zp) = (cx.input(0)?, cx.input(1)?, cx.opt_input(2));
    let out = out.unwrap_or(scale.dtype());
    // The reference computes `x.astype(float32) - zp` and then `* scale` in float32 (float64
    // only for a float64 scale), then casts to the output dtype.
    let work = if scale.dtype() == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let s_layout = ParamLayout::new(x.shape(), scale.shape(), axis, block_size, "x_scale")?;
    let s = scale.to_f64_vec();
    let (z_layout, z) = match zp {
        Some(zp) => (
            ParamLayout::new(x.shape(), zp.shape(), axis, block_size, "x_zero_point")?,
            zp.to_f64_vec(),
        ),
        None => (ParamLayout::PerTensor, vec![0.0]),
    };
    let xv = x.to_f64_vec();
    let vals = xv.iter().enumerate().map(|(i, &v)| {
        let d = round_to(work, round_to(work, v) - z[z_layout.index(i)]);
        round_to(work, d * round_to(work, s[s_layout.index(i)]))
    });
    let data = TensorData::from_f64s(out, vals);
    Ok(vec![tensor(x.shape().to_vec(), data)?])
}

/// `t` with another dtype.
fn retyped(t: &TensorType, dtype: DType) -> TensorType {
    TensorType { dtype, ..t.clone() }
}

fn tensor(shape: Vec<usize>, data: TensorData) -> Result<Tensor, OpError> {
    Tensor::new(shape, data).map_err(|e| OpError::new(e.to_string()))
}

// ---------------------------------------------------------------------------------------------
// DynamicQuantizeLinear
// ---------------------------------------------------------------------------------------------

fn infer_dynamic(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    let x = cx.ty(0)?;
    check_float(x.dtype, "x")?;
    let mut types = vec![
        retyped(x, DType::U8),
        TensorType::scalar(x.dtype),
        TensorType::scalar(DType::U8),
    ];
    types.truncate(cx.num_outputs.clamp(1, 3));
    Ok(types)
}

/// `(scale, zero_point)` from the data range extended to include 0, in float32 as the
/// reference computes them.
fn dynamic_params(x: &[f64]) -> (f32, f32) {
    let (mut lo, mut hi) = (0f32, 0f32);
    for &v in x {
        let v = v as f32;
        // NaN propagates like numpy's max/min.
        if v.is_nan() || lo.is_nan() {
            lo = f32::NAN;
            hi = f32::NAN;
            continue;
        }
        lo = lo.min(v);
        hi = hi.max(v);
    }
    let range = if hi == lo { 1.0 } else { hi - lo };
    let scale = range / 255.0;
    let initial = 0.0 - lo / scale;
    // Python's max(0, min(255, v)): a NaN compares false and yields the constant bound.
    let zp = if initial.is_nan() {
        255.0
    } else {
        initial.clamp(0.0, 255.0)
    };
    (scale, zp.round_ties_even())
}

fn eval_dynamic(cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let x = cx.input(0)?;
    if x.is_empty() {
        crate::bail!("DynamicQuantizeLinear of an empty tensor has no range");
    }
    let xv = x.to_f64_vec();
    let (scale, zp) = dynamic_params(&xv);
    let vals = xv.iter().map(|&v| {
        saturate(
            ((v as f32) / scale).round_ties_even() as f64 + zp as f64,
            (0.0, 255.0),
        )
    });
    let y = tensor(x.shape().to_vec(), TensorData::from_f64s(DType::U8, vals))?;
    let mut out = vec![
        y,
        tensor(vec![], TensorData::from_f64s(x.dtype(), [scale as f64]))?,
        Tensor::scalar(zp as u8),
    ];
    out.truncate(cx.num_outputs().clamp(1, 3));
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Block-quantized weights
// ---------------------------------------------------------------------------------------------

/// `(N, K, blocks)` of a BlockQuantizedMatMul's weights, checked against A's K.
fn block_quantized_dims(
    bits: u32,
    block_size: usize,
    a: &TensorType,
    q: &TensorType,
    scales: &TensorType,
    zero_points: &TensorType,
) -> Result<(Dim, Dim), OpError> {
    if !matches!(bits, 1..=8) || block_size == 0 {
        crate::bail!("bits must be 1 to 8 and block_size positive, got {bits} and {block_size}");
    }
    if a.dtype != DType::F32 || scales.dtype != DType::F32 {
        crate::bail!(
            "A and the scales must be f32, got {} and {}",
            a.dtype,
            scales.dtype
        );
    }
    if q.dtype != DType::U8 || zero_points.dtype != DType::U8 {
        crate::bail!(
            "Q and the zero points must be u8, got {} and {}",
            q.dtype,
            zero_points.dtype
        );
    }
    let [n, k] = q.shape.as_slice() else {
        crate::bail!("Q must be [N, K], got {}", util::fmt_dims(&q.shape));
    };
    let Some(k_a) = a.shape.last() else {
        crate::bail!("A must have rank >= 1");
    };
    if let (Some(ka), Some(kq)) = (k_a.fixed(), k.fixed()) {
        if ka != kq {
            crate::bail!("A has K = {ka} but Q is {}", util::fmt_dims(&q.shape));
        }
    }
    for (what, t) in [("scales", scales), ("zero_points", zero_points)] {
        let ok = match (t.fixed_shape(), n.fixed(), k.fixed()) {
            (Some(s), Some(n), Some(k)) => s == [n, k.div_ceil(block_size)],
            _ => t.rank() == 2,
        };
        if !ok {
            crate::bail!(
                "{what} must be [N, ceil(K / {block_size})] for Q {}, got {}",
                util::fmt_dims(&q.shape),
                util::fmt_dims(&t.shape)
            );
        }
    }
    Ok((n.clone(), k.clone()))
}

fn infer_block_quantized_matmul(
    bits: u32,
    block_size: usize,
    cx: &InferCtx,
) -> Result<Vec<TensorType>, OpError> {
    let a = cx.ty(0)?;
    let (n, _) = block_quantized_dims(bits, block_size, a, cx.ty(1)?, cx.ty(2)?, cx.ty(3)?)?;
    let mut shape = a.shape[..a.shape.len() - 1].to_vec();
    shape.push(n);
    Ok(vec![TensorType::new(DType::F32, shape)])
}

/// The weights `W` `[K, N]` of a BlockQuantizedMatMul, dequantized as DequantizeLinear does
/// (`(q - zp) · scale` in f32): the product is then the float MatMul's.
pub(crate) fn block_dequantized_weights(
    bits: u32,
    block_size: usize,
    q: &Tensor,
    scales: &Tensor,
    zero_points: &Tensor,
) -> Result<Tensor, OpError> {
    let (Some(qv), Some(sv), Some(zv)) = (
        q.as_slice::<u8>(),
        scales.as_slice::<f32>(),
        zero_points.as_slice::<u8>(),
    ) else {
        crate::bail!("Q and the zero points must be u8 and the scales f32");
    };
    let [n, k] = *q.shape() else {
        crate::bail!("Q must be [N, K], got {:?}", q.shape());
    };
    let blocks = k.div_ceil(block_size);
    if sv.len() != n * blocks || zv.len() != n * blocks {
        crate::bail!(
            "scales and zero points must have N x {blocks} = {} values",
            n * blocks
        );
    }
    let limit = 1u32 << bits;
    if let Some(v) = qv.iter().chain(zv).find(|&&v| u32::from(v) >= limit) {
        crate::bail!("value {v} does not fit in {bits} bits");
    }
    let mut w = vec![0f32; k * n];
    for (j, row) in qv.chunks_exact(k.max(1)).enumerate().take(n) {
        for (kk, &q) in row.iter().enumerate() {
            let b = j * blocks + kk / block_size;
            w[kk * n + j] = (f32::from(q) - f32::from(zv[b])) * sv[b];
        }
    }
    Ok(Tensor::from_vec(vec![k, n], w))
}

fn eval_block_quantized_matmul(bits: u32, block_size: usize, cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let w = block_dequantized_weights(bits, block_size, cx.input(1)?, cx.input(2)?, cx.input(3)?)?;
    Ok(vec![super::linalg::eval_matmul(cx.input(0)?, &w)?])
}

// ---------------------------------------------------------------------------------------------
// Integer matrix products
// ---------------------------------------------------------------------------------------------

/// Output dims of numpy `matmul` of `a` and `b` (1-D operands promoted and the promoted axis
/// dropped again).
fn matmul_dims(a: &[Dim], b: &[Dim]) -> Result<Vec<Dim>, OpError> {
    if a.is_empty() || b.is_empty() {
        crate::bail!("matmul operands must have rank >= 1");
    }
    let k_a = &a[a.len() - 1];
    let k_b = if b.len() == 1 { &b[0] } else { &b[b.len() - 2] };
    if let (Some(p), Some(q)) = (k_a.fixed(), k_b.fixed()) {
        if p != q {
            crate::bail!(
                "inner dimensions differ: {} vs {}",
                util::fmt_dims(a),
                util::fmt_dims(b)
            );
        }
    }
    let batch_a = &a[..a.len().saturating_sub(2)];
    let batch_b = &b[..b.len().saturating_sub(2)];
    let mut out = util::broadcast_dims(batch_a, batch_b)?;
    if a.len() >= 2 {
        out.push(a[a.len() - 2].clone());
    }
    if b.len() >= 2 {
        out.push(b[b.len() - 1].clone());
    }
    Ok(out)
}

/// numpy `matmul` of i32 tensors with int32 wraparound.
fn matmul_i32(a: &[i32], ash: &[usize], b: &[i32], bsh: &[usize]) -> Result<(Vec<i32>, Vec<usize>), OpError> {
    if ash.is_empty() || bsh.is_empty() {
        crate::bail!("matmul operands must have rank >= 1");
    }
    let a2: Vec<usize> = if ash.len() == 1 {
        vec![1, ash[0]]
    } else {
        ash.to_vec()
    };
    let b2: Vec<usize> = if bsh.len() == 1 {
        vec![bsh[0], 1]
    } else {
        bsh.to_vec()
    };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (kb, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k != kb {
        crate::bail!("inner dimensions differ: {ash:?} vs {bsh:?}");
    }
    let batch = util::broadcast_shapes(&a2[..a2.len() - 2], &b2[..b2.len() - 2])?;
    let mut out_shape = batch.clone();
    if ash.len() >= 2 {
        out_shape.push(m);
    }
    if bsh.len() >= 2 {
        out_shape.push(n);
    }
    let total = util::check_alloc(&out_shape)?;
    let mut out = vec![0i32; total];
    let a_batch = util::broadcast_index_map(&a2[..a2.len() - 2], &batch);
    let b_batch = util::broadcast_index_map(&b2[..b2.len() - 2], &batch);
    for (bi, (&ab, &bb)) in a_batch.iter().zip(&b_batch).enumerate() {
        let (a_off, b_off, o_off) = (ab * m * k, bb * k * n, bi * m * n);
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0i32;
                for t in 0..k {
                    acc = acc.wrapping_add(a[a_off + i * k + t].wrapping_mul(b[b_off + t * n + j]));
                }
                out[o_off + i * n + j] = acc;
            }
        }
    }
    Ok((out, out_shape))
}

/// The shape a parameter of an `A` operand broadcasts with: ONNX allows a 1-D per-row vector
/// `[M]` for `A` of shape `[..., M, K]`, which numpy would align with the last axis instead.
fn row_param_shape(p: &[usize], a_rank: usize) -> Vec<usize> {
    if p.len() == 1 && p[0] != 1 && a_rank >= 2 {
        vec![p[0], 1]
    } else {
        p.to_vec()
    }
}

/// `x - zero_point` as i32, the zero point broadcasting onto x (`per_row`: see
/// [`row_param_shape`]).
fn minus_zero_point(x: &Tensor, zp: Option<&Tensor>, per_row: bool, what: &str) -> Result<Vec<i32>, OpError> {
    let xv: Vec<i32> = x.to_i64_vec().into_iter().map(|v| v as i32).collect();
    let Some(zp) = zp else { return Ok(xv) };
    if zp.dtype() != x.dtype() {
        crate::bail!(
            "{what} has dtype {} but its operand has {}",
            zp.dtype(),
            x.dtype()
        );
    }
    let zshape = if per_row {
        row_param_shape(zp.shape(), x.rank())
    } else {
        zp.shape().to_vec()
    };
    let map = param_map(&zshape, x.shape(), what)?;
    let z = zp.to_i64_vec();
    Ok(xv
        .iter()
        .zip(map)
        .map(|(&v, zi)| v.wrapping_sub(z[zi] as i32))
        .collect())
}

/// For each element of a tensor of shape `target`, the flat index of a parameter of shape `p`
/// that broadcasts onto it (without enlarging it).
fn param_map(p: &[usize], target: &[usize], what: &str) -> Result<Vec<usize>, OpError> {
    let ok = p.len() <= target.len() && util::broadcast_shapes(target, p).is_ok_and(|s| s == target);
    if !ok {
        crate::bail!("{what} of shape {p:?} does not broadcast to {target:?}");
    }
    Ok(util::broadcast_index_map(p, target))
}

fn check_zero_point_type(zp: Option<&TensorType>, x: DType, what: &str) -> Result<(), OpError> {
    if let Some(zp) = zp {
        if zp.dtype != x {
            crate::bail!("{what} has dtype {} but its operand has {x}", zp.dtype);
        }
    }
    Ok(())
}

fn infer_matmul_integer(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    let (a, b) = (cx.ty(0)?, cx.ty(1)?);
    check_8bit(a.dtype, "A")?;
    check_8bit(b.dtype, "B")?;
    check_zero_point_type(cx.opt_ty(2), a.dtype, "a_zero_point")?;
    check_zero_point_type(cx.opt_ty(3), b.dtype, "b_zero_point")?;
    let shape = matmul_dims(&a.shape, &b.shape)?;
    Ok(vec![TensorType::new(DType::I32, shape)])
}

fn eval_matmul_integer(cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let (a, b) = (cx.input(0)?, cx.input(1)?);
    let av = minus_zero_point(a, cx.opt_input(2), true, "a_zero_point")?;
    let bv = minus_zero_point(b, cx.opt_input(3), false, "b_zero_point")?;
    let (out, shape) = matmul_i32(&av, a.shape(), &bv, b.shape())?;
    Ok(vec![Tensor::from_vec(shape, out)])
}

fn infer_qlinear_matmul(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    let (a, b) = (cx.ty(0)?, cx.ty(3)?);
    check_8bit(a.dtype, "a")?;
    check_8bit(b.dtype, "b")?;
    check_zero_point_type(cx.opt_ty(2), a.dtype, "a_zero_point")?;
    check_zero_point_type(cx.opt_ty(5), b.dtype, "b_zero_point")?;
    check_scales(&[cx.ty(1)?, cx.ty(4)?, cx.ty(6)?])?;
    let out = match cx.opt_ty(7) {
        Some(zp) => zp.dtype,
        None => a.dtype,
    };
    check_8bit(out, "y_zero_point")?;
    let shape = matmul_dims(&a.shape, &b.shape)?;
    Ok(vec![TensorType::new(out, shape)])
}

/// The scales of a requantizing operator share one float dtype.
fn check_scales(scales: &[&TensorType]) -> Result<(), OpError> {
    let d = scales[0].dtype;
    check_float(d, "scale")?;
    if let Some(s) = scales.iter().find(|s| s.dtype != d) {
        crate::bail!("scales must share one dtype, got {d} and {}", s.dtype);
    }
    Ok(())
}

/// Requantizes i32 accumulators: `rint(acc * (s_a * s_b / s_y) + zp_y)` saturated to `out`,
/// where the multiplier is computed in the scales' dtype and the product in f64 (numpy's
/// int32 × float promotion). The closures give each element's parameters.
fn requantize(
    acc: &[i32],
    scale_dtype: DType,
    scales: impl Fn(usize) -> (f64, f64, f64),
    zp: impl Fn(usize) -> f64,
    out: DType,
) -> Result<TensorData, OpError> {
    let range = check_quant_dtype(out, "the output dtype")?;
    let vals = acc.iter().enumerate().map(|(i, &c)| {
        let (sa, sb, sy) = scales(i);
        let mult = round_to(scale_dtype, round_to(scale_dtype, sa * sb) / sy);
        saturate(c as f64 * mult + zp(i), range)
    });
    Ok(TensorData::from_f64s(out, vals))
}

fn eval_qlinear_matmul(cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let (a, b) = (cx.input(0)?, cx.input(3)?);
    let (sa, sb, sy) = (cx.input(1)?, cx.input(4)?, cx.input(6)?);
    let yzp = cx.opt_input(7);
    let av = minus_zero_point(a, cx.opt_input(2), true, "a_zero_point")?;
    let bv = minus_zero_point(b, cx.opt_input(5), false, "b_zero_point")?;
    let (acc, shape) = matmul_i32(&av, a.shape(), &bv, b.shape())?;
    let out = yzp.map_or(a.dtype(), Tensor::dtype);
    let per_row = |t: &Tensor| row_param_shape(t.shape(), a.rank());
    let ma = param_map(&per_row(sa), &shape, "a_scale")?;
    let mb = param_map(sb.shape(), &shape, "b_scale")?;
    let my = param_map(&per_row(sy), &shape, "y_scale")?;
    let (va, vb, vy) = (sa.to_f64_vec(), sb.to_f64_vec(), sy.to_f64_vec());
    let (mz, vz) = match yzp {
        Some(z) => (param_map(&per_row(z), &shape, "y_zero_point")?, z.to_f64_vec()),
        None => (vec![0; acc.len()], vec![0.0]),
    };
    let data = requantize(
        &acc,
        sa.dtype(),
        |i| (va[ma[i]], vb[mb[i]], vy[my[i]]),
        |i| vz[mz[i]],
        out,
    )?;
    Ok(vec![tensor(shape, data)?])
}

// ---------------------------------------------------------------------------------------------
// Integer convolutions
// ---------------------------------------------------------------------------------------------

/// Infers the float convolution of the same geometry (on f64 stand-ins for the operands).
fn conv_shape(
    a: &ConvAttrs,
    x: &TensorType,
    w: &TensorType,
    bias: Option<&TensorType>,
) -> Result<Vec<Dim>, OpError> {
    let (xf, wf) = (retyped(x, DType::F64), retyped(w, DType::F64));
    let bf = bias.map(|b| retyped(b, DType::F64));
    let cx = InferCtx {
        inputs: vec![Some(&xf), Some(&wf), bf.as_ref()],
        values: vec![None, None, None],
        num_outputs: 1,
    };
    let mut types = super::conv::infer(&Op::Conv(a.clone()), &cx)?;
    Ok(types.remove(0).shape)
}

/// The exact integer convolution of `x - x_zp` and `w - w_zp` (+ bias), with int32
/// wraparound; `out` is the node's output type (for the symbolic shape only).
fn conv_i32(
    a: &ConvAttrs,
    x: &Tensor,
    x_zp: Option<&Tensor>,
    w: &Tensor,
    w_zp: Option<&Tensor>,
    bias: Option<&Tensor>,
    out: &TensorType,
) -> Result<Tensor, OpError> {
    if x.rank() < 3 || w.rank() < 1 {
        crate::bail!("X must have shape [N, C, spatial...] and W [M, C/group, k...]");
    }
    if let Some(zp) = x_zp {
        if zp.len() != 1 {
            crate::bail!("x_zero_point must be a scalar, got shape {:?}", zp.shape());
        }
    }
    let xv = minus_zero_point(x, x_zp, false, "x_zero_point")?;
    // A per-output-channel w zero point `[M]` applies along W's first axis.
    let wv = match w_zp {
        Some(zp) if zp.len() != 1 => {
            let layout = ParamLayout::new(w.shape(), zp.shape(), 0, 0, "w_zero_point")?;
            if zp.dtype() != w.dtype() {
                crate::bail!("w_zero_point has dtype {} but w has {}", zp.dtype(), w.dtype());
            }
            let z = zp.to_i64_vec();
            let wi = w.to_i64_vec();
            wi.iter()
                .enumerate()
                .map(|(i, &v)| (v - z[layout.index(i)]) as i32)
                .collect()
        }
        _ => minus_zero_point(w, w_zp, false, "w_zero_point")?,
    };
    let to_f64 = |v: &[i32], shape: &[usize]| {
        Tensor::from_vec(shape.to_vec(), v.iter().map(|&e| e as f64).collect::<Vec<f64>>())
    };
    let xf = to_f64(&xv, x.shape());
    let wf = to_f64(&wv, w.shape());
    let bf = bias.map(|b| b.cast(DType::F64));
    let out_types = [retyped(out, DType::F64)];
    let ecx = EvalCtx {
        inputs: vec![Some(&xf), Some(&wf), bf.as_ref()],
        out_types: &out_types,
    };
    let y = super::conv::eval(&Op::Conv(a.clone()), &ecx)?.remove(0);
    let shape = y.shape().to_vec();
    // Exact in f64; wrap like numpy's int32 result.
    let vals: Vec<i32> = y.to_f64_vec().iter().map(|&v| v as i64 as i32).collect();
    Ok(Tensor::from_vec(shape, vals))
}

fn infer_conv_integer(a: &ConvAttrs, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    let (x, w) = (cx.ty(0)?, cx.ty(1)?);
    check_8bit(x.dtype, "x")?;
    check_8bit(w.dtype, "w")?;
    check_zero_point_type(cx.opt_ty(2), x.dtype, "x_zero_point")?;
    check_zero_point_type(cx.opt_ty(3), w.dtype, "w_zero_point")?;
    let shape = conv_shape(a, x, w, None)?;
    Ok(vec![TensorType::new(DType::I32, shape)])
}

fn eval_conv_integer(a: &ConvAttrs, cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let (x, w) = (cx.input(0)?, cx.input(1)?);
    let y = conv_i32(a, x, cx.opt_input(2), w, cx.opt_input(3), None, &cx.out_types[0])?;
    Ok(vec![y])
}

fn infer_qlinear_conv(a: &ConvAttrs, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    let (x, w) = (cx.ty(0)?, cx.ty(3)?);
    check_8bit(x.dtype, "x")?;
    check_8bit(w.dtype, "w")?;
    check_zero_point_type(cx.opt_ty(2), x.dtype, "x_zero_point")?;
    check_zero_point_type(cx.opt_ty(5), w.dtype, "w_zero_point")?;
    check_scales(&[cx.ty(1)?, cx.ty(4)?, cx.ty(6)?])?;
    let bias = cx.opt_ty(8);
    if let Some(b) = bias {
        if b.dtype != DType::I32 {
            crate::bail!("B must be an i32 tensor, got {}", b.dtype);
        }
    }
    let out = cx.opt_ty(7).map_or(x.dtype, |z| z.dtype);
    check_8bit(out, "y_zero_point")?;
    let shape = conv_shape(a, x, w, bias)?;
    Ok(vec![TensorType::new(out, shape)])
}

fn eval_qlinear_conv(a: &ConvAttrs, cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let (x, w) = (cx.input(0)?, cx.input(3)?);
    let (sx, sw, sy) = (cx.input(1)?, cx.input(4)?, cx.input(6)?);
    let yzp = cx.opt_input(7);
    let acc = conv_i32(
        a,
        x,
        cx.opt_input(2),
        w,
        cx.opt_input(5),
        cx.opt_input(8),
        &cx.out_types[0],
    )?;
    let shape = acc.shape().to_vec();
    for (t, what) in [(sx, "x_scale"), (sy, "y_scale")] {
        if t.len() != 1 {
            crate::bail!("{what} must be a scalar, got shape {:?}", t.shape());
        }
    }
    if let Some(z) = yzp {
        if z.len() != 1 {
            crate::bail!("y_zero_point must be a scalar, got shape {:?}", z.shape());
        }
    }
    // w_scale is per tensor or per output channel (axis 1 of Y).
    let w_layout = ParamLayout::new(&shape, sw.shape(), 1, 0, "w_scale")?;
    let (vx, vw, vy) = (sx.to_f64_vec()[0], sw.to_f64_vec(), sy.to_f64_vec()[0]);
    let z = yzp.map_or(0.0, |z| z.to_f64_vec()[0]);
    let out = yzp.map_or(x.dtype(), Tensor::dtype);
    let Some(accv) = acc.as_slice::<i32>() else {
        crate::bail!("integer convolution produced a non-i32 tensor");
    };
    let data = requantize(accv, sx.dtype(), |i| (vx, vw[w_layout.index(i)], vy), |_| z, out)?;
    Ok(vec![tensor(shape, data)?])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(op: QuantOp, inputs: Vec<Option<Tensor>>) -> Vec<Tensor> {
        let op = Op::Quant(op);
        let refs: Vec<Option<&Tensor>> = inputs.iter().map(Option::as_ref).collect();
        let types: Vec<Option<TensorType>> = inputs
            .iter()
            .map(|t| t.as_ref().map(Tensor::tensor_type))
            .collect();
        let icx = InferCtx {
            inputs: types.iter().map(Option::as_ref).collect(),
            values: vec![None; inputs.len()],
            num_outputs: 1,
        };
        let out_types = infer(&op, &icx).expect("infer");
        let ecx = EvalCtx {
            inputs: refs,
            out_types: &out_types,
        };
        eval(&op, &ecx).expect("eval")
    }

    /// `A · Wᵀ` of 4-bit weights in blocks of 2 along K = 3 (the last block cut): each weight is
    /// `(q - zp) · scale` of its block; a value past 4 bits and scales of the wrong shape are
    /// refused.
    #[test]
    fn block_quantized_matmul_dequantizes_per_block() {
        let op = QuantOp::BlockQuantizedMatMul {
            bits: 4,
            block_size: 2,
        };
        let a = Tensor::from_vec(vec![1, 3], vec![1.0f32, 10.0, 100.0]);
        // W rows (n): [(3-1)·0.5, (5-1)·0.5, (15-0)·2] and [(0-8)·1, (8-8)·1, (9-8)·0.25].
        let q = Tensor::from_vec(vec![2, 3], vec![3u8, 5, 15, 0, 8, 9]);
        let s = Tensor::from_vec(vec![2, 2], vec![0.5f32, 2.0, 1.0, 0.25]);
        let z = Tensor::from_vec(vec![2, 2], vec![1u8, 0, 8, 8]);
        let y = run(
            op.clone(),
            vec![Some(a.clone()), Some(q), Some(s.clone()), Some(z.clone())],
        );
        assert_eq!(y[0].shape(), &[1, 2]);
        assert_eq!(
            y[0].as_slice::<f32>().unwrap(),
            &[1.0 + 20.0 + 3000.0, -8.0 + 0.0 + 25.0]
        );

        let wide = Tensor::from_vec(vec![2, 3], vec![16u8, 5, 15, 0, 8, 9]);
        let refs = [Some(&a), Some(&wide), Some(&s), Some(&z)];
        let out = [TensorType::new(DType::F32, vec![Dim::Fixed(1), Dim::Fixed(2)])];
        let cx = EvalCtx {
            inputs: refs.to_vec(),
            out_types: &out,
        };
        let err = eval(&Op::Quant(op.clone()), &cx).unwrap_err().to_string();
        assert!(err.contains("does not fit in 4 bits"), "{err}");

        let types = [
            a.tensor_type(),
            TensorType::new(DType::U8, vec![Dim::Fixed(2), Dim::Fixed(3)]),
            TensorType::new(DType::F32, vec![Dim::Fixed(2), Dim::Fixed(3)]),
            z.tensor_type(),
        ];
        let icx = InferCtx {
            inputs: types.iter().map(Some).collect(),
            values: vec![None; 4],
            num_outputs: 1,
        };
        let err = infer(&Op::Quant(op), &icx).unwrap_err().to_string();
        assert!(err.contains("scales must be [N, ceil(K / 2)]"), "{err}");
    }

    #[test]
    fn quantize_rounds_half_to_even_and_saturates() {
        let op = QuantOp::QuantizeLinear {
            axis: 1,
            block_size: 0,
            output_dtype: DType::U8,
            precision: None,
        };
        let x = Tensor::from_vec(vec![6], vec![0.5f32, 1.5, 2.5, -3.0, 300.0, f32::NAN]);
        let y = run(
            op,
            vec![Some(x), Some(Tensor::scalar(1.0f32)), Some(Tensor::scalar(1u8))],
        );
        assert_eq!(y[0].as_slice::<u8>().unwrap(), &[1, 3, 3, 0, 255, 0]);
    }

    #[test]
    fn blocked_dequantize_with_remainder_block() {
        let op = QuantOp::DequantizeLinear {
            axis: 1,
            block_size: 2,
            output_dtype: None,
        };
        let x = Tensor::from_vec(vec![1, 3], vec![1i8, 2, 3]);
        let s = Tensor::from_vec(vec![1, 2], vec![2.0f32, 10.0]);
        let z = Tensor::from_vec(vec![1, 2], vec![1i8, 0]);
        let y = run(op, vec![Some(x), Some(s), Some(z)]);
        assert_eq!(y[0].as_slice::<f32>().unwrap(), &[0.0, 2.0, 30.0]);
    }

    #[test]
    fn dynamic_quantize_includes_zero_in_range() {
        let (scale, zp) = dynamic_params(&[1.0, 2.0, 3.0]);
        assert_eq!(scale, 3.0 / 255.0);
        assert_eq!(zp, 0.0);
        // 1 / (2 / 255) is 127.49999 in f32, so the zero point rounds down, as in the reference.
        let (_, zp) = dynamic_params(&[-1.0, 1.0]);
        assert_eq!(zp, 127.0);
    }

    #[test]
    fn matmul_integer_per_row_zero_point() {
        let a = Tensor::from_vec(vec![2, 2], vec![3u8, 4, 5, 6]);
        let b = Tensor::from_vec(vec![2, 1], vec![1u8, 1]);
        let azp = Tensor::from_vec(vec![2], vec![1u8, 2]);
        let y = run(QuantOp::MatMulInteger, vec![Some(a), Some(b), Some(azp), None]);
        assert_eq!(y[0].shape(), &[2, 1]);
        assert_eq!(y[0].as_slice::<i32>().unwrap(), &[5, 7]);
    }

    #[test]
    fn mismatched_per_axis_scale_is_an_error() {
        let op = QuantOp::QuantizeLinear {
            axis: 0,
            block_size: 0,
            output_dtype: DType::U8,
            precision: None,
        };
        let x = TensorType::fixed(DType::F32, &[2, 3]);
        let s = TensorType::fixed(DType::F32, &[3]);
        let cx = InferCtx {
            inputs: vec![Some(&x), Some(&s)],
            values: vec![None, None],
            num_outputs: 1,
        };
        assert!(infer(&Op::Quant(op), &cx).is_err());
    }
}
