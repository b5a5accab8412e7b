//! Import of detection and vision operators.
//!
//! Opset differences folded here: RoiAlign before 16 has no `coordinate_transformation_mode`
//! and behaves as `output_half_pixel` (16 added the attribute with default `half_pixel`);
//! GridSample 16 names its modes bilinear/bicubic (20 renamed them linear/cubic and allowed
//! N-D inputs). The other operators have one form across opsets 7–28.

use super::NodeCtx;
use crate::error::Result;
use kiln_ir::{GridMode, GridPadding, Op, RoiPoolMode, ValueId, VisionOp};

pub(super) fn import(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let op = match cx.op_type() {
        "NonMaxSuppression" => VisionOp::NonMaxSuppression {
            center_point_box: cx.attr_flag("center_point_box", false)?,
        },
        "RoiAlign" => roi_align(cx)?,
        "GridSample" => grid_sample(cx)?,
        "AffineGrid" => VisionOp::AffineGrid {
            align_corners: cx.attr_flag("align_corners", false)?,
        },
        "LRN" => lrn(cx)?,
        "MaxUnpool" => max_unpool(cx)?,
        "Col2Im" => VisionOp::Col2Im {
            dilations: list(cx, "dilations", true)?,
            pads: list(cx, "pads", false)?,
            strides: list(cx, "strides", true)?,
        },
        "CenterCropPad" => VisionOp::CenterCropPad {
            axes: cx.attr_ints("axes"),
        },
        "DeformConv" => deform_conv(cx)?,
        other => return Err(cx.err(format!("{other} is not a detection or vision operator"))),
    };
    let inputs = cx.inputs().to_vec();
    Ok(vec![cx.add1(Op::Vision(op), inputs)?])
}

/// A non-negative list attribute (empty when absent); `positive` also rejects zeros.
fn list(cx: &NodeCtx, name: &str, positive: bool) -> Result<Vec<usize>> {
    let v = cx.attr_usizes(name)?.unwrap_or_default();
    if positive && v.contains(&0) {
        return Err(cx.err(format!("attribute '{name}' must be positive, got {v:?}")));
    }
    Ok(v)
}

/// A positive integer attribute.
fn positive(cx: &NodeCtx, name: &str, default: i64) -> Result<usize> {
    let v = cx.attr_i(name, default);
    usize::try_from(v)
        .ok()
        .filter(|&v| v > 0)
        .ok_or_else(|| cx.err(format!("attribute '{name}' must be positive, got {v}")))
}

fn roi_align(cx: &NodeCtx) -> Result<VisionOp> {
    let mode = match cx.attr_s("mode", "avg").as_str() {
        "avg" => RoiPoolMode::Avg,
        "max" => RoiPoolMode::Max,
        other => return Err(cx.err(format!("mode '{other}' is not avg or max"))),
    };
    let default_ctm = if cx.opset() < 16 {
        "output_half_pixel"
    } else {
        "half_pixel"
    };
    let half_pixel = match cx.attr_s("coordinate_transformation_mode", default_ctm).as_str() {
        "half_pixel" => true,
        "output_half_pixel" => false,
        other => {
            return Err(cx.err(format!(
                "coordinate_transformation_mode '{other}' is not half_pixel or output_half_pixel"
            )))
        }
    };
    let sampling_ratio = cx.attr_i("sampling_ratio", 0);
    let sampling_ratio = usize::try_from(sampling_ratio).map_err(|_| {
        cx.err(format!(
            "sampling_ratio must be non-negative, got {sampling_ratio}"
        ))
    })?;
    let spatial_scale = cx.attr_f("spatial_scale", 1.0);
    if !spatial_scale.is_finite() {
        return Err(cx.err(format!("spatial_scale must be finite, got {spatial_scale}")));
    }
    Ok(VisionOp::RoiAlign {
        mode,
        output_height: positive(cx, "output_height", 1)?,
        output_width: positive(cx, "output_width", 1)?,
        sampling_ratio,
        spatial_scale,
        half_pixel,
    })
}

fn grid_sample(cx: &NodeCtx) -> Result<VisionOp> {
    let default_mode = if cx.opset() < 20 { "bilinear" } else { "linear" };
    let mode = match cx.attr_s("mode", default_mode).as_str() {
        "linear" | "bilinear" => GridMode::Linear,
        "nearest" => GridMode::Nearest,
        "cubic" | "bicubic" => GridMode::Cubic,
        other => return Err(cx.err(format!("mode '{other}' is not linear, nearest or cubic"))),
    };
    let padding = match cx.attr_s("padding_mode", "zeros").as_str() {
        "zeros" => GridPadding::Zeros,
        "border" => GridPadding::Border,
        "reflection" => GridPadding::Reflection,
        other => {
            return Err(cx.err(format!(
                "padding_mode '{other}' is not zeros, border or reflection"
            )))
        }
    };
    let x = cx.input(0)?;
    if cx.opset() < 20 && cx.ty(x).rank() != 4 {
        return Err(cx.err(format!(
            "GridSample-{} takes a 4-D input, got {}",
            cx.opset(),
            cx.ty(x)
        )));
    }
    if mode == GridMode::Cubic && cx.ty(x).rank() != 4 {
        return Err(cx.err("cubic GridSample is defined for 4-D inputs only"));
    }
    Ok(VisionOp::GridSample {
        mode,
        padding,
        align_corners: cx.attr_flag("align_corners", false)?,
    })
}

fn lrn(cx: &NodeCtx) -> Result<VisionOp> {
    if !cx.has_attr("size") {
        return Err(cx.err("attribute 'size' is required"));
    }
    let size = positive(cx, "size", 1)?;
    let (alpha, beta, bias) = (
        cx.attr_f("alpha", 1e-4),
        cx.attr_f("beta", 0.75),
        cx.attr_f("bias", 1.0),
    );
    if ![alpha, beta, bias].iter().all(|v| v.is_finite()) {
        return Err(cx.err(format!(
            "alpha {alpha}, beta {beta} and bias {bias} must be finite"
        )));
    }
    Ok(VisionOp::Lrn {
        size,
        alpha,
        beta,
        bias,
    })
}

fn max_unpool(cx: &NodeCtx) -> Result<VisionOp> {
    let kernel_shape = list(cx, "kernel_shape", true)?;
    if kernel_shape.is_empty() {
        return Err(cx.err("attribute 'kernel_shape' is required"));
    }
    let strides = list(cx, "strides", true)?;
    let pads = list(cx, "pads", false)?;
    let n = kernel_shape.len();
    if (!strides.is_empty() && strides.len() != n) || (!pads.is_empty() && pads.len() != 2 * n) {
        return Err(cx.err(format!(
            "strides {strides:?} and pads {pads:?} do not fit kernel_shape {kernel_shape:?}"
        )));
    }
    Ok(VisionOp::MaxUnpool {
        kernel_shape,
        strides,
        pads,
    })
}

fn deform_conv(cx: &NodeCtx) -> Result<VisionOp> {
    Ok(VisionOp::DeformConv {
        kernel_shape: list(cx, "kernel_shape", true)?,
        strides: list(cx, "strides", true)?,
        pads: list(cx, "pads", false)?,
        dilations: list(cx, "dilations", true)?,
        group: positive(cx, "group", 1)?,
        offset_group: positive(cx, "offset_group", 1)?,
    })
}
