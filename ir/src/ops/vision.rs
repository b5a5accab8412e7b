//! The detection and vision operators.
//!
//! Evaluation converts inputs to `f64`, computes there and rounds once into the output dtype:
//! the reference interpreter favours one obviously correct code path over speed, and for
//! f16/bf16 this is the "compute wide, round at the end" behaviour of onnxruntime.

mod detect;
mod sample;
mod window;
pub use sample::deform_conv_axes;
pub use window::col2im_axes;

use super::{EvalCtx, InferCtx};
use crate::{DType, Dim, Op, OpError, Tensor, TensorData, TensorType};

/// How RoiAlign pools the samples of one output bin.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RoiPoolMode {
    Avg,
    Max,
}

/// GridSample interpolation (opset-20 names; the importer maps the opset-16 names).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum GridMode {
    Linear,
    Nearest,
    Cubic,
}

/// How GridSample reads locations outside the input.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum GridPadding {
    Zeros,
    Border,
    Reflection,
}

/// The detection and vision operators.
#[derive(Clone, PartialEq, Debug)]
pub enum VisionOp {
    /// Inputs: boxes `[B, N, 4]`, scores `[B, C, N]`, optional max_output_boxes_per_class
    /// (i64), iou_threshold, score_threshold (float, one element). Output: i64 `[selected, 3]`
    /// rows `(batch, class, box)`.
    NonMaxSuppression { center_point_box: bool },
    /// Inputs: X `[N, C, H, W]`, rois `[R, 4]` (x1, y1, x2, y2), batch_indices i64 `[R]`.
    /// Output `[R, C, output_height, output_width]`. `half_pixel` shifts pixel coordinates by
    /// -0.5 (opset 16 default); without it RoI extents are clamped to at least one pixel.
    RoiAlign {
        mode: RoiPoolMode,
        output_height: usize,
        output_width: usize,
        /// 0: adaptive (`ceil(roi extent / output extent)` samples per bin axis).
        sampling_ratio: usize,
        spatial_scale: f32,
        half_pixel: bool,
    },
    /// Inputs: X `[N, C, D1..Dr]`, grid `[N, O1..Or, r]` (normalized coordinates, innermost
    /// component is the last spatial axis). Output `[N, C, O1..Or]`.
    GridSample {
        mode: GridMode,
        padding: GridPadding,
        align_corners: bool,
    },
    /// Inputs: theta `[N, 2, 3]` or `[N, 3, 4]`, size i64 `[N, C, H, W]` or `[N, C, D, H, W]`.
    /// Output grid `[N, H, W, 2]` or `[N, D, H, W, 3]`.
    AffineGrid { align_corners: bool },
    /// Local response normalization across channels of X `[N, C, ...]`.
    Lrn {
        size: usize,
        alpha: f32,
        beta: f32,
        bias: f32,
    },
    /// Inputs: X `[N, C, spatial...]`, indices i64 (same shape, flat into the unpooled
    /// tensor), optional output_shape i64 `[rank]`.
    MaxUnpool {
        kernel_shape: Vec<usize>,
        /// Empty: 1 on every axis.
        strides: Vec<usize>,
        /// Empty: no padding; else begins then ends.
        pads: Vec<usize>,
    },
    /// Inputs: columns `[N, C * prod(block), L]`, image_shape i64 `[r]`, block_shape i64 `[r]`.
    /// Output `[N, C, image...]`. Empty attributes mean the defaults (1, 0, 1).
    Col2Im {
        dilations: Vec<usize>,
        pads: Vec<usize>,
        strides: Vec<usize>,
    },
    /// Inputs: data, shape i64 `[len(axes)]`. `axes: None` means every axis.
    CenterCropPad { axes: Option<Vec<i64>> },
    /// Inputs: X `[N, C, spatial...]`, W `[M, C/group, k...]`, offset
    /// `[N, offset_group * prod(k) * r, out...]`, optional B `[M]`, optional mask
    /// `[N, offset_group * prod(k), out...]`. Output `[N, M, out...]`.
    DeformConv {
        /// Empty: W's spatial dims.
        kernel_shape: Vec<usize>,
        strides: Vec<usize>,
        pads: Vec<usize>,
        dilations: Vec<usize>,
        group: usize,
        offset_group: usize,
    },
}

impl VisionOp {
    pub fn name(&self) -> &'static str {
        match self {
            VisionOp::NonMaxSuppression { .. } => "NonMaxSuppression",
            VisionOp::RoiAlign { .. } => "RoiAlign",
            VisionOp::GridSample { .. } => "GridSample",
            VisionOp::AffineGrid { .. } => "AffineGrid",
            VisionOp::Lrn { .. } => "LRN",
            VisionOp::MaxUnpool { .. } => "MaxUnpool",
            VisionOp::Col2Im { .. } => "Col2Im",
            VisionOp::CenterCropPad { .. } => "CenterCropPad",
            VisionOp::DeformConv { .. } => "DeformConv",
        }
    }
}

pub(crate) fn infer(op: &Op, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    let Op::Vision(op) = op else {
        crate::bail!("{} is not in the vision family", op.name())
    };
    let ty = match op {
        VisionOp::NonMaxSuppression { .. } => detect::infer_nms(cx)?,
        VisionOp::RoiAlign {
            output_height,
            output_width,
            ..
        } => detect::infer_roi_align(*output_height, *output_width, cx)?,
        VisionOp::GridSample { .. } => sample::infer_grid_sample(cx)?,
        VisionOp::AffineGrid { .. } => sample::infer_affine_grid(cx)?,
        VisionOp::DeformConv { .. } => sample::infer_deform_conv(op, cx)?,
        VisionOp::Lrn { .. } => window::infer_lrn(cx)?,
        VisionOp::MaxUnpool { .. } => window::infer_max_unpool(op, cx)?,
        VisionOp::Col2Im { .. } => window::infer_col2im(op, cx)?,
        VisionOp::CenterCropPad { axes } => window::infer_center_crop_pad(axes.as_deref(), cx)?,
    };
    Ok(vec![ty])
}

pub(crate) fn eval(op: &Op, cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let Op::Vision(op) = op else {
        crate::bail!("{} is not in the vision family", op.name())
    };
    let t = match op {
        VisionOp::NonMaxSuppression { center_point_box } => detect::eval_nms(*center_point_box, cx)?,
        VisionOp::RoiAlign { .. } => detect::eval_roi_align(op, cx)?,
        VisionOp::GridSample { .. } => sample::eval_grid_sample(op, cx)?,
        VisionOp::AffineGrid { align_corners } => sample::eval_affine_grid(*align_corners, cx)?,
        VisionOp::DeformConv { .. } => sample::eval_deform_conv(op, cx)?,
        VisionOp::Lrn { .. } => window::eval_lrn(op, cx)?,
        VisionOp::MaxUnpool { .. } => window::eval_max_unpool(op, cx)?,
        VisionOp::Col2Im { .. } => window::eval_col2im(op, cx)?,
        VisionOp::CenterCropPad { axes } => window::eval_center_crop_pad(axes.as_deref(), cx)?,
    };
    Ok(vec![t])
}

// ---------------------------------------------------------------------------------------------
// Helpers shared by the submodules
// ---------------------------------------------------------------------------------------------

fn check_float(t: &TensorType, what: &str) -> Result<(), OpError> {
    if !t.dtype.is_float() {
        crate::bail!("{what} must be a floating-point tensor, got {t}");
    }
    Ok(())
}

fn check_rank(t: &TensorType, rank: usize, what: &str) -> Result<(), OpError> {
    if t.rank() != rank {
        crate::bail!("{what} must have rank {rank}, got {t}");
    }
    Ok(())
}

fn check_int64(t: &TensorType, what: &str) -> Result<(), OpError> {
    if t.dtype != DType::I64 {
        crate::bail!("{what} must be an int64 tensor, got {t}");
    }
    Ok(())
}

/// Checks that a dim equals `want` where both are known.
fn check_dim(d: &Dim, want: Option<usize>, msg: impl FnOnce() -> String) -> Result<(), OpError> {
    match (d.fixed(), want) {
        (Some(a), Some(b)) if a != b => Err(OpError::new(msg())),
        _ => Ok(()),
    }
}

/// The first of `dims` that is fixed, else the first (so a symbol is kept).
fn pick_dim(dims: &[&Dim]) -> Dim {
    dims.iter()
        .find(|d| d.is_fixed())
        .or_else(|| dims.first())
        .map(|d| (*d).clone())
        .unwrap_or_else(Dim::unknown)
}

/// Builds an output tensor of `dtype` from `f64` values (cast semantics, one rounding).
fn from_f64s(dtype: DType, shape: Vec<usize>, vals: Vec<f64>) -> Result<Tensor, OpError> {
    Tensor::new(shape, TensorData::from_f64s(dtype, vals)).map_err(|e| {
        OpError::new(format!(
            "internal: output of {} values for shape {:?}",
            e.len, e.shape
        ))
    })
}

/// The values of a 1-D (or scalar) integer input as `i64`.
fn int_values(t: &Tensor, what: &str) -> Result<Vec<i64>, OpError> {
    if !t.dtype().is_int() || t.rank() > 1 {
        crate::bail!("{what} must be a 1-D integer tensor, got {}", t.tensor_type());
    }
    Ok(t.to_i64_vec())
}

/// Non-negative extents from `i64` values.
fn extents(v: &[i64], what: &str) -> Result<Vec<usize>, OpError> {
    v.iter()
        .map(|&x| usize::try_from(x).map_err(|_| OpError::new(format!("{what} has a negative value {x}"))))
        .collect()
}
