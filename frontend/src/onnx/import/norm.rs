//! Import of the normalizations and the softmax family.
//!
//! Opset differences handled here: BatchNormalization's `spatial` (opset < 9) and
//! `training_mode` (14+), GroupNormalization's per-group (18) vs per-channel (21+) scale and
//! bias, and Softmax/LogSoftmax/Hardmax's flatten-to-2-D semantics before opset 13.

use super::NodeCtx;
use crate::error::Result;
use kiln_ir::{Binary, DType, Op, Tensor, TensorData, Unary, ValueId};

pub(super) fn import(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let x = cx.input(0)?;
    let op = match cx.op_type() {
        "BatchNormalization" => return batch_norm(cx),
        "LayerNormalization" => Op::LayerNorm {
            axis: cx.attr_i("axis", -1),
            epsilon: cx.attr_f("epsilon", 1e-5),
            stash_type: stash_type(cx)?,
        },
        "InstanceNormalization" => Op::InstanceNorm {
            epsilon: cx.attr_f("epsilon", 1e-5),
        },
        "GroupNormalization" => group_norm(cx)?,
        "LpNormalization" => {
            let p = cx.attr_i("p", 2);
            if !matches!(p, 1 | 2) {
                return Err(cx.err(format!("p must be 1 or 2, got {p}")));
            }
            Op::LpNorm {
                axis: cx.attr_i("axis", -1),
                p: p as u8,
            }
        }
        "MeanVarianceNormalization" => Op::MeanVarianceNorm {
            axes: cx.attr_ints("axes").unwrap_or_else(|| vec![0, 2, 3]),
        },
        "Softmax" | "LogSoftmax" | "Hardmax" => softmax(cx),
        other => return Err(cx.err(format!("{other} is not a normalization operator"))),
    };
    let inputs = match op {
        Op::LayerNorm { .. } => vec![Some(x), Some(cx.input(1)?), cx.opt_input(2)],
        Op::InstanceNorm { .. } | Op::GroupNorm { .. } => {
            vec![Some(x), Some(cx.input(1)?), Some(cx.input(2)?)]
        }
        _ => vec![Some(x)],
    };
    // LayerNormalization's optional Mean/InvStdDev outputs exist when the node declares them.
    cx.add(op, inputs)
}

/// `stash_type` (an ONNX dtype code, default float): the precision of the statistics, and the
/// dtype of LayerNormalization's Mean/InvStdDev outputs.
pub(super) fn stash_type(cx: &NodeCtx) -> Result<DType> {
    let code = cx.attr_i("stash_type", 1);
    let dtype = i32::try_from(code)
        .ok()
        .and_then(|c| crate::onnx::tensor::dtype_from_onnx(c).ok())
        .filter(|d| d.is_float())
        .ok_or_else(|| cx.err(format!("stash_type {code} is not a floating-point type")))?;
    Ok(dtype)
}

fn group_norm(cx: &NodeCtx) -> Result<Op> {
    let groups = cx
        .attr_opt_i("num_groups")
        .ok_or_else(|| cx.err("attribute 'num_groups' is required"))?;
    let num_groups = usize::try_from(groups)
        .ok()
        .filter(|&g| g > 0)
        .ok_or_else(|| cx.err(format!("num_groups must be positive, got {groups}")))?;
    Ok(Op::GroupNorm {
        num_groups,
        epsilon: cx.attr_f("epsilon", 1e-5),
        stash_type: stash_type(cx)?,
        // Opset 18 took scale and bias per group; opset 21 fixed them to per channel.
        per_channel_affine: cx.opset() >= 21,
    })
}

fn softmax(cx: &NodeCtx) -> Op {
    // Before opset 13 the input was flattened to 2-D at `axis` (default 1).
    let coerce_2d = cx.opset() < 13;
    let axis = cx.attr_i("axis", if coerce_2d { 1 } else { -1 });
    match cx.op_type() {
        "Softmax" => Op::Softmax { axis, coerce_2d },
        "LogSoftmax" => Op::LogSoftmax { axis, coerce_2d },
        _ => Op::Hardmax { axis, coerce_2d },
    }
}

fn batch_norm(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let training = cx.attr_i("training_mode", 0) != 0;
    // The running statistics outputs exist only in training mode.
    let stats_used = cx.node.output.iter().skip(1).any(|o| !o.is_empty());
    if training || stats_used {
        return Err(cx.err("training-mode BatchNormalization is not supported"));
    }
    let epsilon = cx.attr_f("epsilon", 1e-5);
    let inputs = (0..5)
        .map(|i| cx.input(i).map(Some))
        .collect::<Result<Vec<_>>>()?;
    let y = if cx.opset() < 9 && cx.attr_i("spatial", 1) == 0 {
        per_element_batch_norm(cx, &inputs, epsilon)?
    } else {
        cx.add1(Op::BatchNorm { epsilon }, inputs)?
    };
    // Declared but unnamed (unused) statistics outputs get the same value; nothing reads them.
    Ok(vec![y; cx.num_outputs().max(1)])
}

/// `spatial = 0` (opset < 9): statistics per element of `[C, D1, ...]` rather than per channel.
/// Written as broadcasting element-wise ops: `scale * (x - mean) / sqrt(var + eps) + B`.
fn per_element_batch_norm(cx: &mut NodeCtx, inputs: &[Option<ValueId>], epsilon: f32) -> Result<ValueId> {
    let ids: Vec<ValueId> = inputs.iter().flatten().copied().collect();
    let [x, scale, bias, mean, var] = ids[..] else {
        return Err(cx.err("BatchNormalization needs 5 inputs"));
    };
    let rank = cx.ty(x).rank();
    for &p in &ids[1..] {
        let pr = cx.ty(p).rank();
        if rank < 2 || pr != rank - 1 {
            return Err(cx.err(format!(
                "spatial=0 needs scale, B, mean and var of shape [C, D1, ...] (rank {}), got rank {pr}",
                rank.saturating_sub(1)
            )));
        }
    }
    let dtype = cx.ty(var).dtype;
    let eps = cx.constant(
        Tensor::new(vec![], TensorData::from_f64s(dtype, [f64::from(epsilon)]))
            .map_err(|e| cx.err(e.to_string()))?,
    );
    let centered = cx.add_aux1(Op::Binary(Binary::Sub), vec![Some(x), Some(mean)])?;
    let var_eps = cx.add_aux1(Op::Binary(Binary::Add), vec![Some(var), Some(eps)])?;
    let std = cx.add_aux1(Op::Unary(Unary::Sqrt), vec![Some(var_eps)])?;
    let scaled = cx.add_aux1(Op::Binary(Binary::Mul), vec![Some(scale), Some(centered)])?;
    let normed = cx.add_aux1(Op::Binary(Binary::Div), vec![Some(scaled), Some(std)])?;
    cx.add1(Op::Binary(Binary::Add), vec![Some(normed), Some(bias)])
}
