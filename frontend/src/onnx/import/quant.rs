//! Import of quantized and integer-arithmetic operators.
//!
//! Opset history: QuantizeLinear/DequantizeLinear appeared in 10 (per tensor), gained `axis`
//! in 13, `saturate` (float8 only) in 19, `block_size` and QuantizeLinear's `output_dtype` in
//! 21, `precision` (QuantizeLinear) and DequantizeLinear's `output_dtype` in 23/25. Every later
//! attribute defaults to the earlier behaviour, so reading them all with ONNX defaults covers
//! every opset. The integer matmul and conv operators (10) never changed their signatures.

use super::conv::conv_attrs;
use super::NodeCtx;
use crate::error::Result;
use crate::onnx::tensor::dtype_from_onnx;
use kiln_ir::{DType, Op, QuantOp, ValueId};

pub(super) fn import(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let op = match cx.op_type() {
        "QuantizeLinear" => quantize(cx)?,
        "DequantizeLinear" => dequantize(cx)?,
        "DynamicQuantizeLinear" => QuantOp::DynamicQuantizeLinear,
        "QLinearMatMul" => QuantOp::QLinearMatMul,
        "MatMulInteger" => QuantOp::MatMulInteger,
        "ConvInteger" => QuantOp::ConvInteger(conv_attrs(cx)?),
        "QLinearConv" => QuantOp::QLinearConv(conv_attrs(cx)?),
        other => return Err(cx.err(format!("{other} is not a quantization operator"))),
    };
    let max_inputs = match op {
        QuantOp::QuantizeLinear { .. } | QuantOp::DequantizeLinear { .. } => 3,
        QuantOp::DynamicQuantizeLinear => 1,
        QuantOp::MatMulInteger | QuantOp::ConvInteger(_) => 4,
        QuantOp::QLinearMatMul => 8,
        QuantOp::QLinearConv(_) => 9,
        // Not an ONNX operator: com.microsoft MatMulNBits imports to it (`contrib_quant`).
        QuantOp::BlockQuantizedMatMul { .. } => 4,
    };
    if cx.num_inputs() > max_inputs {
        return Err(cx.err(format!(
            "{} takes at most {max_inputs} inputs, got {}",
            cx.op_type(),
            cx.num_inputs()
        )));
    }
    let inputs = cx.inputs().to_vec();
    cx.add(Op::Quant(op), inputs)
}

/// `axis` and `block_size`, shared by QuantizeLinear and DequantizeLinear.
fn axis_and_block(cx: &NodeCtx) -> Result<(i64, usize)> {
    let block = cx.attr_i("block_size", 0);
    let block =
        usize::try_from(block).map_err(|_| cx.err(format!("block_size must be >= 0, got {block}")))?;
    Ok((cx.attr_i("axis", 1), block))
}

/// An optional dtype attribute (0 or absent: not set).
fn dtype_attr(cx: &NodeCtx, name: &str) -> Result<Option<DType>> {
    match cx.attr_i(name, 0) {
        0 => Ok(None),
        code => {
            let code = i32::try_from(code).map_err(|_| cx.err(format!("{name} {code} is not a dtype")))?;
            dtype_from_onnx(code)
                .map(Some)
                .map_err(|msg| cx.err(format!("{name}: {msg}")))
        }
    }
}

fn quantize(cx: &NodeCtx) -> Result<QuantOp> {
    let (axis, block_size) = axis_and_block(cx)?;
    let saturate = cx.attr_i("saturate", 1);
    if !(0..=1).contains(&saturate) {
        return Err(cx.err(format!("saturate must be 0 or 1, got {saturate}")));
    }
    // `saturate` only concerns float8 outputs, which kiln has no dtype for; integer outputs
    // always saturate.
    let attr = dtype_attr(cx, "output_dtype")?;
    let output_dtype = match cx.opt_input(2) {
        Some(zp) => {
            let zd = cx.ty(zp).dtype;
            if attr.is_some_and(|d| d != zd) {
                return Err(cx.err(format!(
                    "output_dtype {} differs from the zero point's dtype {zd}",
                    attr.unwrap_or(zd)
                )));
            }
            zd
        }
        None => attr.unwrap_or(DType::U8),
    };
    Ok(QuantOp::QuantizeLinear {
        axis,
        block_size,
        output_dtype,
        precision: dtype_attr(cx, "precision")?,
    })
}

fn dequantize(cx: &NodeCtx) -> Result<QuantOp> {
    let (axis, block_size) = axis_and_block(cx)?;
    Ok(QuantOp::DequantizeLinear {
        axis,
        block_size,
        output_dtype: dtype_attr(cx, "output_dtype")?,
    })
}
