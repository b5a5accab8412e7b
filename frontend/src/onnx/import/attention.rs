//! Import of Attention (opsets 23-25).

use super::NodeCtx;
use crate::error::Result;
use crate::onnx::tensor::dtype_from_onnx;
use kiln_ir::{AttentionAttrs, DType, Op, ValueId};

pub(super) fn import(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    if cx.opset() < 23 {
        return Err(cx.err(format!("Attention is not defined in opset {}", cx.opset())));
    }
    if cx.num_inputs() > 7 || (cx.num_inputs() == 7 && cx.opset() < 24) {
        return Err(cx.err(format!(
            "Attention takes at most {} inputs in opset {}",
            if cx.opset() < 24 { 6 } else { 7 },
            cx.opset()
        )));
    }
    if cx.num_outputs() == 0 || cx.num_outputs() > 4 {
        return Err(cx.err("Attention has 1 to 4 outputs"));
    }
    let heads = |name: &str| -> Result<usize> {
        match cx.attr_opt_i(name) {
            None => Ok(0),
            Some(h) if h > 0 => Ok(h as usize),
            Some(h) => Err(cx.err(format!("{name} must be positive, got {h}"))),
        }
    };
    let q_num_heads = heads("q_num_heads")?;
    let kv_num_heads = heads("kv_num_heads")?;
    let q = cx.input(0)?;
    if cx.opset() >= 25 && cx.ty(q).rank() == 4 && (cx.has_attr("q_num_heads") || cx.has_attr("kv_num_heads"))
    {
        return Err(cx.err("q_num_heads and kv_num_heads must not be given for 4-D inputs"));
    }
    let mode = cx.attr_i("qk_matmul_output_mode", 0);
    if !(0..=3).contains(&mode) {
        return Err(cx.err(format!("qk_matmul_output_mode must be 0 to 3, got {mode}")));
    }
    let window = |name: &str| -> Result<i64> {
        match cx.attr_i(name, -1) {
            w if w >= -1 => Ok(w),
            w => Err(cx.err(format!("{name} must be -1 or nonnegative, got {w}"))),
        }
    };
    let attrs = AttentionAttrs {
        is_causal: match cx.attr_i("is_causal", 0) {
            0 => false,
            1 => true,
            v => return Err(cx.err(format!("is_causal must be 0 or 1, got {v}"))),
        },
        q_num_heads,
        kv_num_heads,
        qk_matmul_output_mode: mode,
        scale: cx.attr_opt_f("scale"),
        softcap: cx.attr_f("softcap", 0.0),
        softmax_precision: softmax_precision(cx)?,
        left_window_size: window("left_window_size")?,
        right_window_size: window("right_window_size")?,
    };
    let inputs = (0..cx.num_inputs()).map(|i| cx.opt_input(i)).collect();
    cx.add(Op::Attention(attrs), inputs)
}

fn softmax_precision(cx: &NodeCtx) -> Result<Option<DType>> {
    let Some(code) = cx.attr_opt_i("softmax_precision") else {
        return Ok(None);
    };
    let d = i32::try_from(code)
        .ok()
        .and_then(|c| dtype_from_onnx(c).ok())
        .filter(|d| d.is_float())
        .ok_or_else(|| cx.err(format!("softmax_precision {code} is not a float type")))?;
    Ok(Some(d))
}
