//! Import of RMSNormalization, Compress, ReverseSequence, Unique, RotaryEmbedding,
//! TensorScatter, Det, NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.
//!
//! None of these changed its signature between the opsets kiln imports (later versions only
//! widened the type lists), so every version maps to one IR form.

use super::NodeCtx;
use crate::error::Result;
use kiln_ir::{LossReduction, MiscOp, Op, ValueId};

pub(super) fn import(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let op = match cx.op_type() {
        "RMSNormalization" => MiscOp::RmsNorm {
            axis: cx.attr_i("axis", -1),
            epsilon: cx.attr_f("epsilon", 1e-5),
            stash_type: super::norm::stash_type(cx)?,
        },
        "Compress" => MiscOp::Compress {
            axis: cx.attr_opt_i("axis"),
        },
        "ReverseSequence" => {
            let batch_axis = cx.attr_i("batch_axis", 1);
            let time_axis = cx.attr_i("time_axis", 0);
            match (batch_axis, time_axis) {
                (0, 1) => MiscOp::ReverseSequence {
                    batch_axis: 0,
                    time_axis: 1,
                },
                (1, 0) => MiscOp::ReverseSequence {
                    batch_axis: 1,
                    time_axis: 0,
                },
                _ => {
                    return Err(cx.err(format!(
                        "batch_axis and time_axis must be 0 and 1 in some order, got {batch_axis} and {time_axis}"
                    )))
                }
            }
        }
        "Unique" => MiscOp::Unique {
            sorted: cx.attr_flag("sorted", true)?,
            axis: cx.attr_opt_i("axis"),
        },
        "RotaryEmbedding" => rotary(cx)?,
        "TensorScatter" => MiscOp::TensorScatter {
            circular: match cx.attr_s("mode", "linear").as_str() {
                "linear" => false,
                "circular" => true,
                m => return Err(cx.err(format!("mode must be 'linear' or 'circular', got '{m}'"))),
            },
            axis: cx.attr_i("axis", -2),
        },
        "Det" => MiscOp::Det,
        "NegativeLogLikelihoodLoss" | "SoftmaxCrossEntropyLoss" => MiscOp::Loss {
            log_softmax: cx.op_type() == "SoftmaxCrossEntropyLoss",
            reduction: match cx.attr_s("reduction", "mean").as_str() {
                "none" => LossReduction::None,
                "sum" => LossReduction::Sum,
                "mean" => LossReduction::Mean,
                r => return Err(cx.err(format!("reduction must be none, sum or mean, got '{r}'"))),
            },
            ignore_index: cx.attr_opt_i("ignore_index"),
        },
        other => return Err(cx.err(format!("{other} is not handled by this importer"))),
    };
    let inputs = cx.inputs().to_vec();
    cx.add(Op::Misc(op), inputs)
}

fn rotary(cx: &NodeCtx) -> Result<MiscOp> {
    let rotary_dim = cx.attr_i("rotary_embedding_dim", 0);
    let num_heads = cx.attr_i("num_heads", 0);
    let (Ok(rotary_dim), Ok(num_heads)) = (usize::try_from(rotary_dim), usize::try_from(num_heads)) else {
        return Err(cx.err("rotary_embedding_dim and num_heads must be non-negative"));
    };
    Ok(MiscOp::RotaryEmbedding {
        interleaved: cx.attr_flag("interleaved", false)?,
        rotary_dim,
        num_heads,
    })
}
