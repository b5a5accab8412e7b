//! Resize (nearest / linear / cubic, every coordinate mode, antialiasing), DepthToSpace and
//! SpaceToDepth.
//!
//! Resize follows the ONNX reference implementation: interpolation is separable, so each
//! resized axis is processed in turn in f64 and the result is cast back once (saturating, as
//! the reference does). Nearest mode selects source elements directly, so it is exact for
//! every dtype.
//!
//! The coordinate and coefficient math ([`AxisPlan`], [`source_coord`], [`nearest_index`],
//! [`linear_coeffs`], [`cubic_coeffs`], [`interpolation_taps`], [`saturated`], ...) is public:
//! codegen precomputes a Resize's geometry at compile time with these same functions, so its
//! constants are the reference's bit for bit.

use super::util::{check_alloc, norm_axis, strides};
use super::{EvalCtx, InferCtx};
use crate::{
    AspectRatioPolicy, CoordTransform, DType, Dim, Element, NearestMode, Op, OpError, ResizeAttrs,
    ResizeMode, Tensor, TensorData, TensorType,
};

pub(crate) fn infer(op: &Op, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    match op {
        Op::Resize(a) => infer_resize(a, cx),
        Op::DepthToSpace { block_size, .. } => infer_depth_to_space(cx.ty(0)?, *block_size),
        Op::SpaceToDepth { block_size, .. } => infer_space_to_depth(cx.ty(0)?, *block_size),
        _ => crate::bail!("{} is not a resize operator", op.name()),
    }
}

pub(crate) fn eval(op: &Op, cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    match op {
        Op::Resize(a) => eval_resize(a, cx).map(|t| vec![t]),
        Op::DepthToSpace { block_size, crd } => {
            depth_to_space(cx.input(0)?, *block_size, *crd).map(|t| vec![t])
        }
        Op::SpaceToDepth { block_size, crd } => {
            space_to_depth(cx.input(0)?, *block_size, *crd).map(|t| vec![t])
        }
        _ => crate::bail!("{} is not a resize operator", op.name()),
    }
}

// ---------------------------------------------------------------------------------------------
// Resize: output geometry
// ---------------------------------------------------------------------------------------------

/// The target of a resize, as given: scales or sizes (for the resized axes, in `axes` order).
#[derive(Debug)]
pub enum Target<'a> {
    Scales(&'a [f64]),
    Sizes(&'a [i64]),
}

/// How one axis is resized.
#[derive(Clone, Debug, PartialEq)]
pub struct AxisPlan {
    /// The output extent.
    pub out: usize,
    /// The scale coordinates are computed with (`out / in` when sizes were given).
    pub scale: f64,
    /// `(start, end)` of the region of interest (tf_crop_and_resize), as given.
    pub roi: (f64, f64),
}

/// The resized axes, normalized, in the order the model lists them (all axes if none).
pub fn resize_axes(a: &ResizeAttrs, rank: usize) -> Result<Vec<usize>, OpError> {
    if a.axes.is_empty() {
        return Ok((0..rank).collect());
    }
    let mut out = Vec::with_capacity(a.axes.len());
    for &ax in &a.axes {
        let ax = norm_axis(ax, rank)?;
        if out.contains(&ax) {
            crate::bail!("axis {ax} is listed twice in axes");
        }
        out.push(ax);
    }
    Ok(out)
}

/// Per-axis output extent and scale for an input of shape `dims` (resized axes in `axes`).
pub fn plan_axes(
    a: &ResizeAttrs,
    dims: &[usize],
    axes: &[usize],
    target: &Target,
    roi: Option<&[f64]>,
) -> Result<Vec<AxisPlan>, OpError> {
    let mut plan: Vec<AxisPlan> = dims
        .iter()
        .map(|&d| AxisPlan {
            out: d,
            scale: 1.0,
            roi: (0.0, 1.0),
        })
        .collect();
    if let Some(roi) = roi {
        if roi.len() != 2 * axes.len() {
            crate::bail!("roi has {} values; 2 x {} axes expected", roi.len(), axes.len());
        }
        for (i, &ax) in axes.iter().enumerate() {
            plan[ax].roi = (roi[i], roi[axes.len() + i]);
        }
    }
    match target {
        Target::Scales(scales) => {
            if scales.len() != axes.len() {
                crate::bail!("scales has {} values for {} axes", scales.len(), axes.len());
            }
            for (&ax, &s) in axes.iter().zip(scales.iter()) {
                if !(s > 0.0 && s.is_finite()) {
                    crate::bail!("scale {s} is not a positive finite number");
                }
                let out = (s * dims[ax] as f64).floor();
                if out > (1u64 << 50) as f64 {
                    crate::bail!("scale {s} makes axis {ax} too large");
                }
                plan[ax].out = out as usize;
                plan[ax].scale = s;
            }
        }
        Target::Sizes(sizes) => {
            if sizes.len() != axes.len() {
                crate::bail!("sizes has {} values for {} axes", sizes.len(), axes.len());
            }
            for (&ax, &s) in axes.iter().zip(sizes.iter()) {
                let Ok(out) = usize::try_from(s) else {
                    crate::bail!("sizes has negative value {s}");
                };
                if dims[ax] == 0 && out != 0 {
                    crate::bail!("axis {ax} is empty and cannot be resized to {out}");
                }
                plan[ax].out = out;
                plan[ax].scale = out as f64 / dims[ax] as f64;
            }
            apply_aspect_policy(a.keep_aspect_ratio_policy, dims, axes, &mut plan);
        }
    }
    check_alloc(&plan.iter().map(|p| p.out).collect::<Vec<_>>())?;
    Ok(plan)
}

/// `not_larger` / `not_smaller`: one scale for every resized axis (the smallest or largest of
/// the requested ones), extents rounded half up.
pub fn apply_aspect_policy(policy: AspectRatioPolicy, dims: &[usize], axes: &[usize], plan: &mut [AxisPlan]) {
    let pick = |f: fn(f64, f64) -> f64| axes.iter().map(|&ax| plan[ax].scale).reduce(f);
    let scale = match policy {
        AspectRatioPolicy::Stretch => return,
        AspectRatioPolicy::NotLarger => pick(f64::min),
        AspectRatioPolicy::NotSmaller => pick(f64::max),
    };
    let Some(scale) = scale else { return };
    for &ax in axes {
        plan[ax].scale = scale;
        plan[ax].out = (scale * dims[ax] as f64 + 0.5) as usize;
    }
}

/// The scales/sizes input that is actually given (an empty tensor counts as absent).
fn present(t: Option<&Tensor>) -> Option<&Tensor> {
    t.filter(|t| !t.is_empty())
}

fn infer_resize(a: &ResizeAttrs, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    let x = cx.ty(0)?;
    let rank = x.rank();
    let axes = resize_axes(a, rank)?;
    // An empty tensor counts as absent; whether a computed input is empty may be unknown yet.
    let elements = |i: usize| cx.opt_ty(i).map(|t| t.num_elements());
    let has = |i: usize| matches!(elements(i), Some(n) if n != Some(0));
    let surely_has = |i: usize| matches!(elements(i), Some(Some(n)) if n > 0);
    for (i, what) in [(1, "roi"), (2, "scales")] {
        if let Some(t) = cx.opt_ty(i) {
            if !t.dtype.is_float() {
                crate::bail!("{what} must be a float tensor, got {}", t.dtype);
            }
        }
    }
    if let Some(t) = cx.opt_ty(3) {
        if !t.dtype.is_int() {
            crate::bail!("sizes must be an integer tensor, got {}", t.dtype);
        }
    }
    if surely_has(2) && surely_has(3) {
        crate::bail!("only one of scales and sizes may be given");
    }
    if !has(2) && !has(3) {
        crate::bail!("one of scales and sizes must be given");
    }
    if a.coord == CoordTransform::TfCropAndResize && !has(1) {
        crate::bail!("coordinate_transformation_mode tf_crop_and_resize needs the roi input");
    }
    let out = TensorType::new(x.dtype, output_dims(a, cx, &x.shape, &axes)?);
    Ok(vec![out])
}

/// The output shape as far as it is known: exact when the target values and the input
/// extents they apply to are known.
fn output_dims(a: &ResizeAttrs, cx: &InferCtx, shape: &[Dim], axes: &[usize]) -> Result<Vec<Dim>, OpError> {
    let scales = present(cx.value(2)).map(Tensor::to_f64_vec);
    let sizes = present(cx.value(3)).map(|t| t.to_i64_vec());
    let target = match (&scales, &sizes) {
        (Some(s), _) => Target::Scales(s),
        (None, Some(s)) => Target::Sizes(s),
        _ => {
            let mut out = shape.to_vec();
            for &ax in axes {
                out[ax] = Dim::unknown();
            }
            return Ok(out);
        }
    };
    let fixed: Option<Vec<usize>> = shape.iter().map(Dim::fixed).collect();
    if let Some(dims) = fixed {
        let plan = plan_axes(a, &dims, axes, &target, None)?;
        return Ok(plan.iter().map(|p| Dim::Fixed(p.out)).collect());
    }
    // Some input extents are symbolic: resolve the axes that do not depend on them.
    let mut out = shape.to_vec();
    let policy_couples_axes = a.keep_aspect_ratio_policy != AspectRatioPolicy::Stretch;
    for (i, &ax) in axes.iter().enumerate() {
        out[ax] = match (&target, &shape[ax]) {
            (Target::Sizes(s), _) if !policy_couples_axes => match usize::try_from(s[i]) {
                Ok(v) => Dim::Fixed(v),
                Err(_) => crate::bail!("sizes has negative value {}", s[i]),
            },
            (Target::Scales(s), d) if s[i] == 1.0 => d.clone(),
            (Target::Scales(s), Dim::Fixed(d)) => {
                let plan = plan_axes(a, &[*d], &[0], &Target::Scales(&s[i..i + 1]), None)?;
                Dim::Fixed(plan[0].out)
            }
            _ => Dim::unknown(),
        };
    }
    Ok(out)
}

/// `v` rounded to the float `dtype`: the reference does its roi arithmetic in the roi's own
/// type, and this reproduces that rounding from f64 results.
pub fn round_to(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F32 => v as f32 as f64,
        DType::F16 => crate::tensor::f16_from_f64(v).to_f64(),
        DType::BF16 => crate::tensor::bf16_from_f64(v).to_f64(),
        _ => v,
    }
}

fn eval_resize(a: &ResizeAttrs, cx: &EvalCtx) -> Result<Tensor, OpError> {
    let x = cx.input(0)?;
    let axes = resize_axes(a, x.rank())?;
    let roi_t = present(cx.opt_input(1));
    let roi = roi_t.map(Tensor::to_f64_vec);
    let scales = present(cx.opt_input(2)).map(Tensor::to_f64_vec);
    let sizes = present(cx.opt_input(3)).map(|t| t.to_i64_vec());
    let target = match (&scales, &sizes) {
        (Some(_), Some(_)) => crate::bail!("only one of scales and sizes may be given"),
        (Some(s), None) => Target::Scales(s),
        (None, Some(s)) => Target::Sizes(s),
        (None, None) => crate::bail!("one of scales and sizes must be given"),
    };
    let crop = a.coord == CoordTransform::TfCropAndResize;
    if crop && roi.is_none() {
        crate::bail!("coordinate_transformation_mode tf_crop_and_resize needs the roi input");
    }
    let roi = if crop { roi.as_deref() } else { None };
    let plan = plan_axes(a, x.shape(), &axes, &target, roi)?;
    let roi_dtype = roi_t.map_or(DType::F32, |t| t.dtype());
    let geo = Geometry { attrs: a, roi_dtype };
    if a.mode == ResizeMode::Nearest {
        if a.antialias {
            crate::bail!("antialias is not defined for nearest mode");
        }
        return resize_nearest(x, &geo, &plan, &axes);
    }
    resize_interpolate(x, &geo, &plan, &axes)
}

/// What the coordinate mapping needs besides one axis' plan.
struct Geometry<'a> {
    attrs: &'a ResizeAttrs,
    roi_dtype: DType,
}

/// Whether resizing this axis changes nothing (the reference skips such axes).
pub fn is_identity(p: &AxisPlan, input: usize, crop: bool) -> bool {
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs());
    close(p.scale, 1.0) && p.out == input && (!crop || (p.roi.0 == 0.0 && close(p.roi.1, 1.0)))
}

/// Source coordinate of output index `y` along an axis of `input` elements, and whether it
/// lies outside the crop region (tf_crop_and_resize extrapolates there). `roi_dtype` is the
/// dtype of the roi input (the reference rounds the crop arithmetic to it).
pub fn source_coord(a: &ResizeAttrs, roi_dtype: DType, p: &AxisPlan, input: usize, y: usize) -> (f64, bool) {
    let y = y as f64;
    let scale = p.scale;
    let in_w = input as f64;
    // The reference compares the float product, not the integer extent, with 1.
    let out_w = scale * in_w;
    let x = match a.coord {
        CoordTransform::AlignCorners if out_w == 1.0 => 0.0,
        CoordTransform::AlignCorners => y * (in_w - 1.0) / (out_w - 1.0),
        CoordTransform::Asymmetric => y / scale,
        CoordTransform::PytorchHalfPixel if out_w == 1.0 => -0.5,
        CoordTransform::PytorchHalfPixel | CoordTransform::HalfPixel => (y + 0.5) / scale - 0.5,
        CoordTransform::HalfPixelSymmetric => {
            let adjustment = p.out as f64 / out_w;
            let center = in_w / 2.0;
            let offset = center * (1.0 - adjustment);
            offset + (y + 0.5) / scale - 0.5
        }
        CoordTransform::TfHalfPixelForNn => (y + 0.5) / scale,
        CoordTransform::TfCropAndResize => {
            let r = |v: f64| round_to(roi_dtype, v);
            let (r0, r1) = p.roi;
            let span = r(r1 - r0);
            let x = if out_w == 1.0 {
                r(r(span * (in_w - 1.0)) / 2.0)
            } else {
                y * span * (in_w - 1.0) / (out_w - 1.0)
            };
            let x = x + r(r0 * (in_w - 1.0));
            return (x, x < 0.0 || x > in_w - 1.0);
        }
    };
    (x, false)
}

/// The source index nearest mode picks for coordinate `x`.
pub fn nearest_index(mode: NearestMode, x: f64, scale: f64, input: usize) -> usize {
    let fl = x.floor();
    let idx = if x == fl {
        fl
    } else {
        let ratio = x - fl;
        let up = match mode {
            NearestMode::RoundPreferFloor => ratio > 0.5,
            NearestMode::RoundPreferCeil => ratio >= 0.5,
            NearestMode::Floor => false,
            NearestMode::Ceil => true,
            NearestMode::Simple => scale < 1.0,
        };
        if up {
            fl + 1.0
        } else {
            fl
        }
    };
    idx.clamp(0.0, (input.max(1) - 1) as f64) as usize
}

/// The value of `v` in dtype `T` as the reference's `saturate_cast` computes it: integers
/// round half to even and clamp; floats clamp to the finite range (NaN stays NaN).
fn saturate<T: Element>(v: f64) -> T {
    T::from_f64(saturated(T::DTYPE, v))
}

/// `v` prepared for the reference's `saturate_cast` to `dtype`: integers round half to even,
/// floats clamp to the dtype's finite range (NaN stays NaN). Casting the result to `dtype` is
/// then exact or the dtype's own rounding.
pub fn saturated(dtype: DType, v: f64) -> f64 {
    if dtype.is_int() {
        return v.round_ties_even();
    }
    let max = match dtype {
        DType::F16 => 65504.0,
        DType::BF16 => 3.3895313892515355e38,
        DType::F32 => f32::MAX as f64,
        _ => f64::MAX,
    };
    if v.is_nan() {
        v
    } else {
        v.clamp(-max, max)
    }
}

fn resize_nearest(x: &Tensor, g: &Geometry, plan: &[AxisPlan], axes: &[usize]) -> Result<Tensor, OpError> {
    let crop = g.attrs.coord == CoordTransform::TfCropAndResize;
    // Per axis: for each output index the source index, or None to extrapolate.
    let maps: Vec<Vec<Option<usize>>> = plan
        .iter()
        .enumerate()
        .map(|(ax, p)| {
            let input = x.shape()[ax];
            if !axes.contains(&ax) || is_identity(p, input, crop) {
                return (0..p.out).map(Some).collect();
            }
            (0..p.out)
                .map(|y| {
                    let (c, outside) = source_coord(g.attrs, g.roi_dtype, p, input, y);
                    (!outside).then(|| nearest_index(g.attrs.nearest_mode, c, p.scale, input))
                })
                .collect()
        })
        .collect();
    let out_shape: Vec<usize> = plan.iter().map(|p| p.out).collect();
    let extrapolation = g.attrs.extrapolation_value as f64;
    let data =
        crate::with_data!(x.data(), v => gather_nearest(v, x.shape(), &out_shape, &maps, extrapolation));
    Tensor::new(out_shape, data).map_err(|e| OpError::new(e.to_string()))
}

fn gather_nearest<T: Element>(
    v: &[T],
    in_shape: &[usize],
    out_shape: &[usize],
    maps: &[Vec<Option<usize>>],
    extrapolation: f64,
) -> TensorData {
    let n: usize = out_shape.iter().product();
    let mut out = Vec::with_capacity(n);
    let st = strides(in_shape);
    let fill: T = saturate(extrapolation);
    let rank = out_shape.len();
    let mut idx = vec![0usize; rank];
    for _ in 0..n {
        let mut off = Some(0usize);
        for ax in 0..rank {
            off = match (off, maps[ax][idx[ax]]) {
                (Some(o), Some(i)) => Some(o + i * st[ax]),
                _ => None,
            };
        }
        out.push(off.map_or(fill, |o| v[o]));
        for ax in (0..rank).rev() {
            idx[ax] += 1;
            if idx[ax] < out_shape[ax] {
                break;
            }
            idx[ax] = 0;
        }
    }
    T::wrap(out)
}

// ---------------------------------------------------------------------------------------------
// Resize: linear and cubic interpolation
// ---------------------------------------------------------------------------------------------

/// Interpolation weights of one output position: source indices (already clamped to the
/// input, which is the reference's edge padding) and their coefficients.
struct Taps {
    idx: Vec<usize>,
    coeff: Vec<f64>,
    /// tf_crop_and_resize outside the region: the extrapolation value instead.
    outside: bool,
}

/// Linear interpolation weights for the fractional source position `ratio`: the two-tap
/// `[1 - ratio, ratio]`, or with antialiasing a triangle filter widened by `1 / scale` when
/// shrinking, normalized to sum 1.
pub fn linear_coeffs(ratio: f64, scale: f64, antialias: bool) -> Vec<f64> {
    if !antialias {
        return vec![1.0 - ratio, ratio];
    }
    // A triangle filter stretched by 1/scale when shrinking.
    let s = scale.min(1.0);
    let start = (-1.0 / s).floor() as i64 + 1;
    let footprint = 2 - 2 * start;
    let c: Vec<f64> = (start..start + footprint)
        .map(|i| (1.0 - ((i as f64 - ratio) * s).abs()).clamp(0.0, 1.0))
        .collect();
    normalized(c)
}

/// Cubic convolution weights. The coefficient `a` is an f32 attribute and, as in the reference
/// (and onnxruntime), the polynomials are evaluated in f32: every f64 subexpression (`ratio`,
/// `1 - ratio`, powers of the distance) is rounded to f32 where it meets `a`.
pub fn cubic_coeffs(ratio: f64, scale: f64, a: f32, antialias: bool) -> Vec<f64> {
    if !antialias {
        let t = (ratio + 1.0) as f32;
        let r = ratio as f32;
        let u = (1.0 - ratio) as f32;
        let v = ((1.0 - ratio) + 1.0) as f32;
        let c = [
            ((a * t - 5.0 * a) * t + 8.0 * a) * t - 4.0 * a,
            ((a + 2.0) * r - (a + 3.0)) * r * r + 1.0,
            ((a + 2.0) * u - (a + 3.0)) * u * u + 1.0,
            ((a * v - 5.0 * a) * v + 8.0 * a) * v - 4.0 * a,
        ];
        return c.iter().map(|&x| x as f64).collect();
    }
    let s = scale.min(1.0);
    // `None` marks taps beyond the kernel's support (an exact zero).
    let kernel = |x: f64| -> Option<f32> {
        let x = x.abs();
        let x2 = x * x;
        let x3 = x * x2;
        let (x, x2, x3) = (x as f32, x2 as f32, x3 as f32);
        if x <= 1.0 {
            Some((a + 2.0) * x3 - (a + 3.0) * x2 + 1.0)
        } else if x < 2.0 {
            Some(a * x3 - 5.0 * a * x2 + 8.0 * a * x - 4.0 * a)
        } else {
            None
        }
    };
    let i_start = (-2.0 / s).floor() as i64 + 1;
    let i_end = 2 - i_start;
    let c: Vec<Option<f32>> = (i_start..i_end).map(|i| kernel(s * (i as f64 - ratio))).collect();
    // The reference sums the taps in f32; it divides in f32 when every tap is an f32 value and
    // in f64 when an exact zero (a float64 literal there) made the tap array f64.
    let sum = c.iter().fold(0.0f32, |acc, x| acc + x.unwrap_or(0.0));
    let all_f32 = c.iter().all(Option::is_some);
    c.iter()
        .map(|x| {
            let x = x.unwrap_or(0.0);
            if all_f32 {
                (x / sum) as f64
            } else {
                x as f64 / sum as f64
            }
        })
        .collect()
}

fn normalized(c: Vec<f64>) -> Vec<f64> {
    let sum: f64 = c.iter().sum();
    c.into_iter().map(|v| v / sum).collect()
}

/// How many taps the kernel has at `scale`.
pub fn kernel_width(a: &ResizeAttrs, scale: f64) -> f64 {
    let support = match a.mode {
        ResizeMode::Cubic => 2.0,
        _ => 1.0,
    };
    if !a.antialias {
        return 2.0 * support;
    }
    2.0 - 2.0 * ((-support / scale.min(1.0)).floor() + 1.0)
}

/// The taps of every output position along one axis (the reference's window selection:
/// the `n` source positions nearest to the coordinate, ties to the left).
fn axis_taps(g: &Geometry, p: &AxisPlan, input: usize) -> Result<Vec<Taps>, OpError> {
    let a = g.attrs;
    // Antialiasing widens the kernel by 1/scale; when the output is not empty that is at most
    // about twice the input, but refuse absurd widths before building any kernel.
    let width = kernel_width(a, p.scale);
    if width.is_nan() || width > 4.0 * input as f64 + 16.0 {
        crate::bail!(
            "interpolation kernel of {width} taps (scale {}) is too wide",
            p.scale
        );
    }
    let mut taps = Vec::with_capacity(p.out);
    for y in 0..p.out {
        let (x, outside) = source_coord(a, g.roi_dtype, p, input, y);
        if !x.is_finite() {
            crate::bail!("resize coordinate is not finite (scale {})", p.scale);
        }
        let (idx, coeff) = interpolation_taps(a, x, p.scale, input)?;
        taps.push(Taps { idx, coeff, outside });
    }
    Ok(taps)
}

/// The taps that interpolate the finite source coordinate `x` along an axis of `input > 0`
/// elements resized by `scale`: source indices (clamped to the input, which is the reference's
/// edge padding) and their coefficients. The window is the reference's: the taps nearest to
/// `x`, ties to the left, renormalized without the out-of-range ones under `exclude_outside`.
pub fn interpolation_taps(
    a: &ResizeAttrs,
    x: f64,
    scale: f64,
    input: usize,
) -> Result<(Vec<usize>, Vec<f64>), OpError> {
    let x_int = x.floor();
    let ratio = if x == x_int { 1.0 } else { x - x_int };
    let mut coeff = match a.mode {
        ResizeMode::Linear => linear_coeffs(ratio, scale, a.antialias),
        ResizeMode::Cubic => cubic_coeffs(ratio, scale, a.cubic_coeff_a, a.antialias),
        ResizeMode::Nearest => crate::bail!("nearest mode has no interpolation taps"),
    };
    let n = coeff.len() as i64;
    let pad = (n + 1) / 2;
    let xp = x + pad as f64;
    let pf = xp.floor();
    let frac = xp - pf;
    let offset = if n % 2 == 0 {
        if frac == 0.0 {
            -(n / 2)
        } else {
            -(n / 2) + 1
        }
    } else {
        let base = -((n - 1) / 2);
        if frac <= 0.5 {
            base
        } else {
            base + 1
        }
    };
    // Saturating: a coordinate far outside the input only needs to clamp to its edge.
    let start = (pf as i64).saturating_add(offset).saturating_sub(pad);
    let raw: Vec<i64> = (0..n).map(|k| start.saturating_add(k)).collect();
    if a.exclude_outside {
        for (c, &i) in coeff.iter_mut().zip(&raw) {
            if i < 0 || i >= input as i64 {
                *c = 0.0;
            }
        }
        let sum: f64 = coeff.iter().sum();
        let sum = if sum == 0.0 { 1.0 } else { sum };
        coeff.iter_mut().for_each(|c| *c /= sum);
    }
    let idx = raw
        .iter()
        .map(|&i| i.clamp(0, input as i64 - 1) as usize)
        .collect();
    Ok((idx, coeff))
}

fn resize_interpolate(
    x: &Tensor,
    g: &Geometry,
    plan: &[AxisPlan],
    axes: &[usize],
) -> Result<Tensor, OpError> {
    let crop = g.attrs.coord == CoordTransform::TfCropAndResize;
    let mut shape = x.shape().to_vec();
    let mut data = x.to_f64_vec();
    let extrapolation = g.attrs.extrapolation_value as f64;
    for &ax in axes {
        let p = &plan[ax];
        let input = shape[ax];
        if is_identity(p, input, crop) {
            continue;
        }
        let outer: usize = shape[..ax].iter().product();
        let inner: usize = shape[ax + 1..].iter().product();
        let mut next = vec![0.0; outer * p.out * inner];
        if input > 0 && !next.is_empty() {
            let taps = axis_taps(g, p, input)?;
            for o in 0..outer {
                let src = &data[o * input * inner..(o + 1) * input * inner];
                for (y, t) in taps.iter().enumerate() {
                    let dst = &mut next[(o * p.out + y) * inner..(o * p.out + y + 1) * inner];
                    if t.outside {
                        dst.fill(extrapolation);
                        continue;
                    }
                    for (&i, &c) in t.idx.iter().zip(&t.coeff) {
                        let row = &src[i * inner..(i + 1) * inner];
                        for (d, &s) in dst.iter_mut().zip(row) {
                            *d += s * c;
                        }
                    }
                }
            }
        }
        shape[ax] = p.out;
        data = next;
    }
    fn cast<T: Element>(v: &[f64]) -> TensorData {
        T::wrap(v.iter().map(|&x| saturate::<T>(x)).collect())
    }
    let out = crate::dispatch_dtype!(x.dtype(), T => cast::<T>(&data));
    Tensor::new(shape, out).map_err(|e| OpError::new(e.to_string()))
}

// ---------------------------------------------------------------------------------------------
// DepthToSpace / SpaceToDepth
// ---------------------------------------------------------------------------------------------

/// `blocksize²`, checked.
fn block_area(block: usize) -> Result<usize, OpError> {
    match block.checked_mul(block) {
        Some(bb) if block > 0 => Ok(bb),
        _ => crate::bail!("blocksize {block} is out of range"),
    }
}

fn infer_depth_to_space(x: &TensorType, block: usize) -> Result<Vec<TensorType>, OpError> {
    let bb = block_area(block)?;
    if x.rank() != 4 {
        crate::bail!("DepthToSpace needs a 4-D input, got {x}");
    }
    let c = match &x.shape[1] {
        Dim::Fixed(c) if c % bb != 0 => {
            crate::bail!("channels {c} are not divisible by blocksize^2 = {bb}")
        }
        Dim::Fixed(c) => Dim::Fixed(c / bb),
        Dim::Sym(_) => Dim::unknown(),
    };
    let scaled = |d: &Dim| match d {
        Dim::Fixed(v) => v
            .checked_mul(block)
            .map(Dim::Fixed)
            .ok_or_else(|| OpError::new("output extent overflows")),
        Dim::Sym(_) => Ok(Dim::unknown()),
    };
    let shape = vec![x.shape[0].clone(), c, scaled(&x.shape[2])?, scaled(&x.shape[3])?];
    Ok(vec![TensorType::new(x.dtype, shape)])
}

fn infer_space_to_depth(x: &TensorType, block: usize) -> Result<Vec<TensorType>, OpError> {
    let bb = block_area(block)?;
    if x.rank() != 4 {
        crate::bail!("SpaceToDepth needs a 4-D input, got {x}");
    }
    let shrunk = |d: &Dim| match d {
        Dim::Fixed(v) if v % block != 0 => {
            crate::bail!("spatial extent {v} is not divisible by blocksize {block}")
        }
        Dim::Fixed(v) => Ok(Dim::Fixed(v / block)),
        Dim::Sym(_) => Ok(Dim::unknown()),
    };
    let c = match &x.shape[1] {
        Dim::Fixed(c) => Dim::Fixed(
            c.checked_mul(bb)
                .ok_or_else(|| OpError::new("channels overflow"))?,
        ),
        Dim::Sym(_) => Dim::unknown(),
    };
    let shape = vec![x.shape[0].clone(), c, shrunk(&x.shape[2])?, shrunk(&x.shape[3])?];
    Ok(vec![TensorType::new(x.dtype, shape)])
}

/// Views `x` with shape `view`, permutes its axes by `perm` and returns the result with shape
/// `out_shape` (a reshape-transpose-reshape).
fn permuted(x: &Tensor, view: &[usize], perm: &[usize], out_shape: Vec<usize>) -> Result<Tensor, OpError> {
    let st = strides(view);
    let shape: Vec<usize> = perm.iter().map(|&p| view[p]).collect();
    let src: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
    fn gather<T: Element>(v: &[T], shape: &[usize], src: &[usize]) -> TensorData {
        let n: usize = shape.iter().product();
        let mut out = Vec::with_capacity(n);
        let mut idx = vec![0usize; shape.len()];
        let mut off = 0usize;
        for _ in 0..n {
            out.push(v[off]);
            for ax in (0..shape.len()).rev() {
                idx[ax] += 1;
                off += src[ax];
                if idx[ax] < shape[ax] {
                    break;
                }
                off -= src[ax] * idx[ax];
                idx[ax] = 0;
            }
        }
        T::wrap(out)
    }
    let data = crate::with_data!(x.data(), v => gather(v, &shape, &src));
    Tensor::new(out_shape, data).map_err(|e| OpError::new(e.to_string()))
}

fn dims4(x: &Tensor, op: &str) -> Result<[usize; 4], OpError> {
    match x.shape() {
        &[n, c, h, w] => Ok([n, c, h, w]),
        s => crate::bail!("{op} needs a 4-D input, got shape {s:?}"),
    }
}

fn depth_to_space(x: &Tensor, block: usize, crd: bool) -> Result<Tensor, OpError> {
    let bb = block_area(block)?;
    let [n, c, h, w] = dims4(x, "DepthToSpace")?;
    if c % bb != 0 {
        crate::bail!("channels {c} are not divisible by blocksize^2 = {bb}");
    }
    let (c2, b) = (c / bb, block);
    let out = vec![n, c2, h * b, w * b];
    if crd {
        permuted(x, &[n, c2, b, b, h, w], &[0, 1, 4, 2, 5, 3], out)
    } else {
        permuted(x, &[n, b, b, c2, h, w], &[0, 3, 4, 1, 5, 2], out)
    }
}

fn space_to_depth(x: &Tensor, block: usize, crd: bool) -> Result<Tensor, OpError> {
    let bb = block_area(block)?;
    let [n, c, h, w] = dims4(x, "SpaceToDepth")?;
    let b = block;
    if h % b != 0 || w % b != 0 {
        crate::bail!("spatial extents {h}x{w} are not divisible by blocksize {b}");
    }
    let c_out = c
        .checked_mul(bb)
        .ok_or_else(|| OpError::new("channels overflow"))?;
    let view = [n, c, h / b, b, w / b, b];
    let out = vec![n, c_out, h / b, w / b];
    if crd {
        permuted(x, &view, &[0, 1, 3, 5, 2, 4], out)
    } else {
        permuted(x, &view, &[0, 3, 5, 1, 2, 4], out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(mode: ResizeMode, coord: CoordTransform) -> ResizeAttrs {
        ResizeAttrs {
            mode,
            coord,
            nearest_mode: NearestMode::RoundPreferFloor,
            cubic_coeff_a: -0.75,
            exclude_outside: false,
            extrapolation_value: 0.0,
            antialias: false,
            axes: vec![],
            keep_aspect_ratio_policy: AspectRatioPolicy::Stretch,
        }
    }

    fn run(a: &ResizeAttrs, x: &Tensor, scales: Option<&Tensor>, sizes: Option<&Tensor>) -> Tensor {
        let out_types = [x.tensor_type()];
        let cx = EvalCtx {
            inputs: vec![Some(x), None, scales, sizes],
            out_types: &out_types,
        };
        eval_resize(a, &cx).unwrap()
    }

    #[test]
    fn nearest_upsample_asymmetric_floor_repeats() {
        let mut a = attrs(ResizeMode::Nearest, CoordTransform::Asymmetric);
        a.nearest_mode = NearestMode::Floor;
        let x = Tensor::from_vec(vec![1, 2], vec![1i64, 2]);
        let s = Tensor::from_vec(vec![2], vec![1.0f32, 3.0]);
        let y = run(&a, &x, Some(&s), None);
        assert_eq!(y.shape(), &[1, 6]);
        assert_eq!(y.as_slice::<i64>().unwrap(), &[1, 1, 1, 2, 2, 2]);
    }

    #[test]
    fn opset10_nearest_ceils_when_shrinking() {
        // Resize-10: x_ori = y / 0.6 = 0, 1.67; shrinking rounds up → sources 0 and 2.
        let mut a = attrs(ResizeMode::Nearest, CoordTransform::Asymmetric);
        a.nearest_mode = NearestMode::Simple;
        let x = Tensor::from_vec(vec![4], vec![1.0f32, 2.0, 3.0, 4.0]);
        let s = Tensor::from_vec(vec![1], vec![0.6f32]);
        assert_eq!(run(&a, &x, Some(&s), None).to_f64_vec(), vec![1.0, 3.0]);
        // Enlarging rounds down: y / 2.5 = 0, 0.4, 0.8, 1.2, 1.6.
        let s = Tensor::from_vec(vec![1], vec![2.5f32]);
        let x = Tensor::from_vec(vec![2], vec![1.0f32, 2.0]);
        assert_eq!(
            run(&a, &x, Some(&s), None).to_f64_vec(),
            vec![1.0, 1.0, 1.0, 2.0, 2.0]
        );
    }

    #[test]
    fn linear_half_pixel_by_hand() {
        // in = [0, 10], scale 2: x_ori = (y + 0.5) / 2 - 0.5 = -0.25, 0.25, 0.75, 1.25; edge
        // clamping gives 0, 2.5, 7.5, 10.
        let a = attrs(ResizeMode::Linear, CoordTransform::HalfPixel);
        let x = Tensor::from_vec(vec![2], vec![0.0f32, 10.0]);
        let s = Tensor::from_vec(vec![1], vec![2.0f32]);
        assert_eq!(
            run(&a, &x, Some(&s), None).to_f64_vec(),
            vec![0.0, 2.5, 7.5, 10.0]
        );
    }

    #[test]
    fn integer_output_rounds_half_even_and_saturates() {
        let a = attrs(ResizeMode::Linear, CoordTransform::AlignCorners);
        // align_corners 2 → 3: the middle sample is the mean.
        let x = Tensor::from_vec(vec![2], vec![0u8, 5]);
        let sizes = Tensor::from_vec(vec![1], vec![3i64]);
        assert_eq!(
            run(&a, &x, None, Some(&sizes)).as_slice::<u8>().unwrap(),
            &[0, 2, 5]
        );
    }

    #[test]
    fn not_larger_policy_keeps_aspect() {
        let mut a = attrs(ResizeMode::Nearest, CoordTransform::HalfPixel);
        a.keep_aspect_ratio_policy = AspectRatioPolicy::NotLarger;
        let plan = plan_axes(&a, &[2, 4], &[0, 1], &Target::Sizes(&[7, 8]), None).unwrap();
        // min(7/2, 8/4) = 2 → [4, 8].
        assert_eq!(plan.iter().map(|p| p.out).collect::<Vec<_>>(), vec![4, 8]);
    }

    #[test]
    fn depth_space_round_trip() {
        let x = Tensor::from_vec(vec![1, 8, 2, 3], (0..48).collect::<Vec<i32>>());
        for crd in [false, true] {
            let y = depth_to_space(&x, 2, crd).unwrap();
            assert_eq!(y.shape(), &[1, 2, 4, 6]);
            let back = space_to_depth(&y, 2, crd).unwrap();
            assert_eq!(back, x);
        }
        assert!(depth_to_space(&Tensor::from_vec(vec![1, 3, 1, 1], vec![0i32; 3]), 2, false).is_err());
        assert!(space_to_depth(&x, 0, false).is_err());
    }

    #[test]
    fn bad_targets_are_errors() {
        let a = attrs(ResizeMode::Linear, CoordTransform::HalfPixel);
        assert!(plan_axes(&a, &[2], &[0], &Target::Scales(&[0.0]), None).is_err());
        assert!(plan_axes(&a, &[2], &[0], &Target::Scales(&[f64::NAN]), None).is_err());
        assert!(plan_axes(&a, &[2], &[0], &Target::Scales(&[1e30]), None).is_err());
        assert!(plan_axes(&a, &[2], &[0], &Target::Sizes(&[-1]), None).is_err());
        assert!(plan_axes(&a, &[2, 2], &[0, 1], &Target::Sizes(&[1]), None).is_err());
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use crate::ops::{self, InferCtx};

    use crate::ops::util::TestRng as Rng;

    /// Random attributes and targets (including invalid ones) never panic, and whenever both
    /// inference and evaluation succeed they agree on the output type.
    #[test]
    fn random_resizes_never_panic_and_infer_matches_eval() {
        let mut rng = Rng(0x9e3779b97f4a7c15);
        let mut agreed = 0;
        for _ in 0..3000 {
            let rank = rng.below(4) as usize + 1;
            let shape: Vec<usize> = (0..rank).map(|_| rng.below(5) as usize).collect();
            let n: usize = shape.iter().product();
            let x = Tensor::from_vec(shape.clone(), (0..n).map(|i| (i * 7 % 11) as f32).collect());
            let naxes = if rng.below(2) == 0 {
                0
            } else {
                rng.below(rank as u64) as usize + 1
            };
            let axes: Vec<i64> = (0..naxes)
                .map(|_| rng.below(2 * rank as u64) as i64 - rank as i64)
                .collect();
            let count = if axes.is_empty() { rank } else { axes.len() };
            let a = ResizeAttrs {
                mode: rng.pick(&[ResizeMode::Nearest, ResizeMode::Linear, ResizeMode::Cubic]),
                coord: rng.pick(&[
                    CoordTransform::HalfPixel,
                    CoordTransform::HalfPixelSymmetric,
                    CoordTransform::PytorchHalfPixel,
                    CoordTransform::AlignCorners,
                    CoordTransform::Asymmetric,
                    CoordTransform::TfCropAndResize,
                    CoordTransform::TfHalfPixelForNn,
                ]),
                nearest_mode: rng.pick(&[
                    NearestMode::RoundPreferFloor,
                    NearestMode::RoundPreferCeil,
                    NearestMode::Floor,
                    NearestMode::Ceil,
                    NearestMode::Simple,
                ]),
                cubic_coeff_a: -0.5,
                exclude_outside: rng.below(2) == 0,
                extrapolation_value: 3.0,
                antialias: rng.below(3) == 0,
                axes,
                keep_aspect_ratio_policy: rng.pick(&[
                    AspectRatioPolicy::Stretch,
                    AspectRatioPolicy::NotLarger,
                    AspectRatioPolicy::NotSmaller,
                ]),
            };
            let len = if rng.below(10) == 0 { count + 1 } else { count };
            let (scales, sizes) = if rng.below(2) == 0 {
                let vals = [0.5f32, 1.0, 1.5, 2.0, 0.3, 0.0, -1.0, f32::NAN, 1e-6, 3.7];
                let s: Vec<f32> = (0..len).map(|_| rng.pick(&vals)).collect();
                (Some(Tensor::from_vec(vec![len], s)), None)
            } else {
                let s: Vec<i64> = (0..len).map(|_| rng.below(8) as i64 - 1).collect();
                (None, Some(Tensor::from_vec(vec![len], s)))
            };
            let roi = (rng.below(4) != 0).then(|| {
                let r: Vec<f32> = (0..2 * count)
                    .map(|_| rng.pick(&[0.0f32, 0.2, 0.5, 0.8, 1.0, 1.3, -0.4]))
                    .collect();
                Tensor::from_vec(vec![2 * count], r)
            });
            let inputs = [Some(&x), roi.as_ref(), scales.as_ref(), sizes.as_ref()];
            let types: Vec<Option<TensorType>> = inputs.iter().map(|t| t.map(|t| t.tensor_type())).collect();
            let op = Op::Resize(a);
            let icx = InferCtx {
                inputs: types.iter().map(|t| t.as_ref()).collect(),
                values: vec![None, roi.as_ref(), scales.as_ref(), sizes.as_ref()],
                num_outputs: 1,
            };
            let inferred = ops::infer(&op, &icx);
            let out_types = [x.tensor_type()];
            let ecx = EvalCtx {
                inputs: inputs.to_vec(),
                out_types: &out_types,
            };
            let evaluated = ops::eval(&op, &ecx);
            if let (Ok(t), Ok(v)) = (&inferred, &evaluated) {
                assert_eq!(t[0], v[0].tensor_type(), "{op:?} on {shape:?}");
                agreed += 1;
            }
        }
        assert!(agreed > 500, "only {agreed} valid cases were generated");
    }

    #[test]
    fn absurd_blocksizes_are_errors() {
        let x = Tensor::from_vec(vec![1, 1, 0, 0], Vec::<f32>::new());
        assert!(space_to_depth(&x, usize::MAX / 2, false).is_err());
        assert!(depth_to_space(&x, 1 << 33, false).is_err());
        assert!(infer_depth_to_space(&TensorType::fixed(DType::F32, &[1, 4, 1 << 63, 1]), 2).is_err());
    }
}
