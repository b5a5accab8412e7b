//! Import of signal-processing operators: DFT, STFT, HannWindow, HammingWindow,
//! BlackmanWindow, MelWeightMatrix.

use super::NodeCtx;
use crate::error::Result;
use crate::onnx::tensor::dtype_from_onnx;
use kiln_ir::{DType, Op, SignalOp, Tensor, ValueId};

pub(super) fn import(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let (op, inputs) = match cx.op_type() {
        "DFT" => dft(cx)?,
        "STFT" => {
            check_inputs(cx, 2, 4)?;
            let onesided = cx.attr_flag("onesided", true)?;
            (SignalOp::Stft { onesided }, cx.inputs().to_vec())
        }
        "HannWindow" | "HammingWindow" | "BlackmanWindow" => {
            check_inputs(cx, 1, 1)?;
            let periodic = cx.attr_flag("periodic", true)?;
            let dtype = output_dtype(cx)?;
            let op = match cx.op_type() {
                "HannWindow" => SignalOp::HannWindow { periodic, dtype },
                "HammingWindow" => SignalOp::HammingWindow { periodic, dtype },
                _ => SignalOp::BlackmanWindow { periodic, dtype },
            };
            (op, cx.inputs().to_vec())
        }
        "MelWeightMatrix" => {
            check_inputs(cx, 5, 5)?;
            let dtype = output_dtype(cx)?;
            (SignalOp::MelWeightMatrix { dtype }, cx.inputs().to_vec())
        }
        other => return Err(cx.err(format!("{other} is not a signal-processing operator"))),
    };
    if cx.num_outputs() != 1 {
        return Err(cx.err(format!("expected 1 output, got {}", cx.num_outputs())));
    }
    cx.add(Op::Signal(op), inputs)
}

/// DFT. Opset 17 gives `axis` as an attribute (default 1); from opset 20 it is an optional
/// input (default -2), the IR form, so the attribute becomes a constant input.
fn dft(cx: &mut NodeCtx) -> Result<(SignalOp, Vec<Option<ValueId>>)> {
    let inverse = cx.attr_flag("inverse", false)?;
    let onesided = cx.attr_flag("onesided", false)?;
    let op = SignalOp::Dft { inverse, onesided };
    if cx.opset() >= 20 {
        check_inputs(cx, 1, 3)?;
        if cx.has_attr("axis") {
            return Err(cx.err("attribute 'axis' was replaced by an input in opset 20"));
        }
        return Ok((op, cx.inputs().to_vec()));
    }
    check_inputs(cx, 1, 2)?;
    let axis = cx.attr_i("axis", 1);
    let axis = cx.constant(Tensor::scalar(axis));
    Ok((op, vec![Some(cx.input(0)?), cx.opt_input(1), Some(axis)]))
}

/// Checks that the node has between `min` and `max` inputs, the first `min` present.
fn check_inputs(cx: &NodeCtx, min: usize, max: usize) -> Result<()> {
    let n = cx.num_inputs();
    if n < min || n > max {
        let expected = if min == max {
            format!("{min}")
        } else {
            format!("{min} to {max}")
        };
        return Err(cx.err(format!("expected {expected} inputs, got {n}")));
    }
    for i in 0..min {
        cx.input(i)?;
    }
    Ok(())
}

/// The `output_datatype` attribute (default FLOAT): any numeric type.
fn output_dtype(cx: &NodeCtx) -> Result<DType> {
    let code = cx.attr_i("output_datatype", 1);
    let dtype = i32::try_from(code)
        .map_err(|_| format!("unknown data type {code}"))
        .and_then(dtype_from_onnx)
        .map_err(|e| cx.err(format!("output_datatype: {e}")))?;
    if dtype == DType::Bool {
        return Err(cx.err("output_datatype must be a numeric type, not bool"));
    }
    Ok(dtype)
}
