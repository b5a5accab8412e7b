//! Import of Resize, Upsample, DepthToSpace and SpaceToDepth.
//!
//! Every Resize/Upsample version becomes one IR `Resize` with inputs `(X, roi?, scales?,
//! sizes?)`. Upsample (opsets 7-9) and Resize-10 had neither a coordinate mode nor a nearest
//! mode: they map source coordinates asymmetrically (`x / scale`) and pick the nearest pixel
//! onnxruntime's way (floor when enlarging, ceil when shrinking).

use super::NodeCtx;
use crate::error::Result;
use kiln_ir::{
    AspectRatioPolicy, CoordTransform, DType, NearestMode, Op, ResizeAttrs, ResizeMode, Tensor, ValueId,
};

pub(super) fn import(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    match cx.op_type() {
        "Resize" if cx.opset() < 10 => Err(cx.err(format!("Resize is not defined in opset {}", cx.opset()))),
        "Resize" if cx.opset() < 11 => import_legacy(cx, false),
        "Resize" => import_resize(cx),
        "Upsample" => import_legacy(cx, true),
        "DepthToSpace" => import_depth_to_space(cx),
        "SpaceToDepth" => import_space_to_depth(cx),
        other => Err(cx.err(format!("{other} is not a resize operator"))),
    }
}

fn mode_attr(cx: &NodeCtx, allow_cubic: bool) -> Result<ResizeMode> {
    match cx.attr_s("mode", "nearest").as_str() {
        "nearest" => Ok(ResizeMode::Nearest),
        // `bilinear` is the opset-1 spelling some exporters kept.
        "linear" | "bilinear" => Ok(ResizeMode::Linear),
        "cubic" if allow_cubic => Ok(ResizeMode::Cubic),
        m => Err(cx.err(format!("unsupported mode '{m}'"))),
    }
}

/// Upsample (scales as attribute in opset 7, as input from 9) and Resize-10 (X, scales).
fn import_legacy(cx: &mut NodeCtx, upsample: bool) -> Result<Vec<ValueId>> {
    let x = cx.input(0)?;
    let mode = mode_attr(cx, false)?;
    let scales = if upsample && cx.opset() < 9 {
        let s = cx
            .attr_floats("scales")
            .ok_or_else(|| cx.err("attribute 'scales' is required"))?;
        cx.constant(Tensor::from_vec(vec![s.len()], s))
    } else {
        cx.input(1)?
    };
    if upsample {
        if let Some(s) = cx.known(scales) {
            if s.to_f64_vec().iter().any(|&v| v.is_nan() || v < 1.0) {
                return Err(cx.err("Upsample scales must be >= 1"));
            }
        }
    }
    let attrs = ResizeAttrs {
        mode,
        coord: CoordTransform::Asymmetric,
        nearest_mode: NearestMode::Simple,
        cubic_coeff_a: -0.75,
        exclude_outside: false,
        extrapolation_value: 0.0,
        antialias: false,
        axes: vec![],
        keep_aspect_ratio_policy: AspectRatioPolicy::Stretch,
    };
    Ok(vec![cx.add1(
        Op::Resize(attrs),
        vec![Some(x), None, Some(scales), None],
    )?])
}

fn coord_attr(cx: &NodeCtx) -> Result<CoordTransform> {
    let opset = cx.opset();
    Ok(
        match cx.attr_s("coordinate_transformation_mode", "half_pixel").as_str() {
            "half_pixel" => CoordTransform::HalfPixel,
            "half_pixel_symmetric" if opset >= 18 => CoordTransform::HalfPixelSymmetric,
            "pytorch_half_pixel" => CoordTransform::PytorchHalfPixel,
            "align_corners" => CoordTransform::AlignCorners,
            "asymmetric" => CoordTransform::Asymmetric,
            "tf_crop_and_resize" => CoordTransform::TfCropAndResize,
            "tf_half_pixel_for_nn" if opset < 13 => CoordTransform::TfHalfPixelForNn,
            m => {
                return Err(cx.err(format!(
                    "coordinate_transformation_mode '{m}' is not defined in opset {opset}"
                )))
            }
        },
    )
}

fn nearest_attr(cx: &NodeCtx) -> Result<NearestMode> {
    Ok(match cx.attr_s("nearest_mode", "round_prefer_floor").as_str() {
        "round_prefer_floor" => NearestMode::RoundPreferFloor,
        "round_prefer_ceil" => NearestMode::RoundPreferCeil,
        "floor" => NearestMode::Floor,
        "ceil" => NearestMode::Ceil,
        m => return Err(cx.err(format!("unsupported nearest_mode '{m}'"))),
    })
}

fn policy_attr(cx: &NodeCtx) -> Result<AspectRatioPolicy> {
    Ok(match cx.attr_s("keep_aspect_ratio_policy", "stretch").as_str() {
        "stretch" => AspectRatioPolicy::Stretch,
        "not_larger" => AspectRatioPolicy::NotLarger,
        "not_smaller" => AspectRatioPolicy::NotSmaller,
        m => return Err(cx.err(format!("unsupported keep_aspect_ratio_policy '{m}'"))),
    })
}

/// Resize from opset 11: `(X, roi, scales, sizes)`; antialias, axes and the aspect-ratio
/// policy from opset 18.
fn import_resize(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let x = cx.input(0)?;
    let mode = mode_attr(cx, true)?;
    let opset18 = cx.opset() >= 18;
    let attrs = ResizeAttrs {
        mode,
        coord: coord_attr(cx)?,
        nearest_mode: nearest_attr(cx)?,
        cubic_coeff_a: cx.attr_f("cubic_coeff_a", -0.75),
        exclude_outside: cx.attr_flag("exclude_outside", false)?,
        extrapolation_value: cx.attr_f("extrapolation_value", 0.0),
        antialias: opset18 && cx.attr_flag("antialias", false)?,
        axes: if opset18 {
            cx.attr_ints("axes").unwrap_or_default()
        } else {
            vec![]
        },
        keep_aspect_ratio_policy: if opset18 {
            policy_attr(cx)?
        } else {
            AspectRatioPolicy::Stretch
        },
    };
    if attrs.antialias && mode == ResizeMode::Nearest {
        return Err(cx.err("antialias is not defined for nearest mode"));
    }
    let roi = cx.opt_input(1);
    let scales = nonempty(cx, cx.opt_input(2));
    let sizes = nonempty(cx, cx.opt_input(3));
    if let Some(s) = sizes {
        if cx.ty(s).dtype != DType::I64 {
            return Err(cx.err(format!("sizes must be i64, got {}", cx.ty(s).dtype)));
        }
    }
    Ok(vec![
        cx.add1(Op::Resize(attrs), vec![Some(x), roi, scales, sizes])?
    ])
}

/// Drops an input that is known to be empty (models before opset 13 pass an empty `scales`
/// when they give `sizes`).
fn nonempty(cx: &NodeCtx, v: Option<ValueId>) -> Option<ValueId> {
    v.filter(|&v| cx.ty(v).num_elements() != Some(0))
}

fn blocksize(cx: &NodeCtx) -> Result<usize> {
    let b = cx
        .attr_opt_i("blocksize")
        .ok_or_else(|| cx.err("attribute 'blocksize' is required"))?;
    usize::try_from(b)
        .ok()
        .filter(|&b| b > 0)
        .ok_or_else(|| cx.err(format!("blocksize must be positive, got {b}")))
}

/// `mode`: DCR (default) or CRD, for DepthToSpace from opset 11 and SpaceToDepth from 28.
fn crd_mode(cx: &NodeCtx, since: i64) -> Result<bool> {
    if cx.opset() < since {
        return Ok(false);
    }
    match cx.attr_s("mode", "DCR").as_str() {
        "DCR" => Ok(false),
        "CRD" => Ok(true),
        m => Err(cx.err(format!("mode must be DCR or CRD, got '{m}'"))),
    }
}

fn import_depth_to_space(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let x = cx.input(0)?;
    let op = Op::DepthToSpace {
        block_size: blocksize(cx)?,
        crd: crd_mode(cx, 11)?,
    };
    Ok(vec![cx.add1(op, vec![Some(x)])?])
}

fn import_space_to_depth(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let x = cx.input(0)?;
    let op = Op::SpaceToDepth {
        block_size: blocksize(cx)?,
        crd: crd_mode(cx, 28)?,
    };
    Ok(vec![cx.add1(op, vec![Some(x)])?])
}
