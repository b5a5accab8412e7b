//! Import of Conv, ConvTranspose, MaxPool, AveragePool, LpPool and the global pools.
//!
//! Attribute forms are the same across opsets 7–28 except for additions with backward
//! compatible defaults (MaxPool `storage_order` 8, `ceil_mode`/`dilations` 10, AveragePool
//! `count_include_pad` 7 and `dilations` 19, LpPool `ceil_mode`/`dilations` 18), so one reader
//! with ONNX defaults covers them all.

use super::NodeCtx;
use crate::error::Result;
use kiln_ir::{AutoPad, ConvAttrs, ConvTransposeAttrs, Op, PoolAttrs, PoolKind, ValueId};

pub(super) fn import(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    match cx.op_type() {
        "Conv" => {
            let attrs = conv_attrs(cx)?;
            let inputs = vec![Some(cx.input(0)?), Some(cx.input(1)?), cx.opt_input(2)];
            Ok(vec![cx.add1(Op::Conv(attrs), inputs)?])
        }
        "ConvTranspose" => conv_transpose(cx),
        "MaxPool" | "AveragePool" | "LpPool" => pool(cx),
        "GlobalAveragePool" => global_pool(
            cx,
            PoolKind::Average {
                count_include_pad: false,
            },
        ),
        "GlobalMaxPool" => global_pool(cx, PoolKind::Max),
        "GlobalLpPool" => {
            let p = lp_order(cx)?;
            global_pool(cx, PoolKind::Lp { p })
        }
        other => Err(cx.err(format!("{other} is not a convolution or pooling operator"))),
    }
}

fn auto_pad(cx: &NodeCtx) -> Result<AutoPad> {
    Ok(match cx.attr_s("auto_pad", "NOTSET").as_str() {
        // Some exporters write an empty string for the default.
        "NOTSET" | "" => AutoPad::NotSet,
        "SAME_UPPER" => AutoPad::SameUpper,
        "SAME_LOWER" => AutoPad::SameLower,
        "VALID" => AutoPad::Valid,
        other => {
            return Err(cx.err(format!(
                "auto_pad '{other}' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID"
            )))
        }
    })
}

/// A non-negative list attribute (empty when absent); `positive` also rejects zeros.
fn list(cx: &NodeCtx, name: &str, positive: bool) -> Result<Vec<usize>> {
    let v = cx.attr_usizes(name)?.unwrap_or_default();
    if positive && v.contains(&0) {
        return Err(cx.err(format!("attribute '{name}' must be positive, got {v:?}")));
    }
    Ok(v)
}

pub(super) fn conv_attrs(cx: &NodeCtx) -> Result<ConvAttrs> {
    let group = cx.attr_i("group", 1);
    if group < 1 {
        return Err(cx.err(format!("group must be positive, got {group}")));
    }
    Ok(ConvAttrs {
        kernel_shape: list(cx, "kernel_shape", true)?,
        strides: list(cx, "strides", true)?,
        pads: list(cx, "pads", false)?,
        dilations: list(cx, "dilations", true)?,
        group: usize::try_from(group).map_err(|_| cx.err("group is too large"))?,
        auto_pad: auto_pad(cx)?,
        channels_last: false,
    })
}

fn conv_transpose(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let conv = conv_attrs(cx)?;
    let x = cx.input(0)?;
    let spatial = cx.ty(x).rank().saturating_sub(2);
    let mut output_shape = list(cx, "output_shape", false)?;
    // Some exporters give the full output shape [N, C, spatial...]; only the spatial part
    // determines the padding.
    if output_shape.len() == spatial + 2 {
        output_shape.drain(..2);
    }
    let attrs = ConvTransposeAttrs {
        conv,
        output_padding: list(cx, "output_padding", false)?,
        output_shape,
    };
    let inputs = vec![Some(x), Some(cx.input(1)?), cx.opt_input(2)];
    Ok(vec![cx.add1(Op::ConvTranspose(attrs), inputs)?])
}

/// LpPool's and GlobalLpPool's `p` (an int attribute since opset 2).
fn lp_order(cx: &NodeCtx) -> Result<f32> {
    let p = cx.attr_i("p", 2);
    if p < 1 {
        return Err(cx.err(format!("p must be positive, got {p}")));
    }
    Ok(p as f32)
}

fn pool(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let attrs = pool_attrs(cx)?;
    let x = cx.input(0)?;
    // MaxPool's optional Indices output is produced when the node declares it.
    cx.add(Op::Pool(attrs), vec![Some(x)])
}

/// The attributes of MaxPool, AveragePool (and the quantized contrib QLinearAveragePool, whose
/// attributes are AveragePool's) and LpPool.
pub(super) fn pool_attrs(cx: &NodeCtx) -> Result<PoolAttrs> {
    let kind = match cx.op_type() {
        "MaxPool" => PoolKind::Max,
        "AveragePool" | "QLinearAveragePool" => PoolKind::Average {
            count_include_pad: cx.attr_flag("count_include_pad", false)?,
        },
        _ => PoolKind::Lp { p: lp_order(cx)? },
    };
    let kernel_shape = list(cx, "kernel_shape", true)?;
    if kernel_shape.is_empty() {
        return Err(cx.err("attribute 'kernel_shape' is required"));
    }
    let storage_order = cx.attr_i("storage_order", 0);
    if !(0..=1).contains(&storage_order) {
        return Err(cx.err(format!("storage_order must be 0 or 1, got {storage_order}")));
    }
    if cx.num_outputs() > 1 && kind != PoolKind::Max {
        return Err(cx.err(format!(
            "{} has one output, {} declared",
            cx.op_type(),
            cx.num_outputs()
        )));
    }
    Ok(PoolAttrs {
        kind,
        kernel_shape,
        strides: list(cx, "strides", true)?,
        pads: list(cx, "pads", false)?,
        dilations: list(cx, "dilations", true)?,
        auto_pad: auto_pad(cx)?,
        ceil_mode: cx.attr_flag("ceil_mode", false)?,
        storage_order: storage_order as u8,
        channels_last: false,
    })
}

fn global_pool(cx: &mut NodeCtx, kind: PoolKind) -> Result<Vec<ValueId>> {
    let x = cx.input(0)?;
    Ok(vec![cx.add1(Op::GlobalPool(kind), vec![Some(x)])?])
}
