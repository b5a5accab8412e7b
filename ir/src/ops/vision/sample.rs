//! Operators that sample an input at computed real-valued locations: GridSample, AffineGrid
//! (which builds GridSample's grids) and DeformConv.

use super::{
    check_dim, check_float, check_int64, check_rank, extents, from_f64s, int_values, pick_dim, GridMode,
    GridPadding, VisionOp,
};
use crate::ops::conv::{Axis, WindowAttrs};
use crate::ops::{util, EvalCtx, InferCtx};
use crate::{AutoPad, Dim, OpError, Tensor, TensorType};

// ---------------------------------------------------------------------------------------------
// GridSample
// ---------------------------------------------------------------------------------------------

pub(super) fn infer_grid_sample(cx: &InferCtx) -> Result<TensorType, OpError> {
    let x = cx.ty(0)?;
    let grid = cx.ty(1)?;
    check_float(grid, "grid")?;
    if x.dtype == crate::DType::Bool {
        crate::bail!("X must be numeric, got {x}");
    }
    if x.rank() < 3 {
        crate::bail!("X must be [N, C, spatial...], got {x}");
    }
    let r = x.rank() - 2;
    check_rank(grid, r + 2, "grid")?;
    check_dim(&grid.shape[r + 1], Some(r), || {
        format!("grid {grid} must end in {r} coordinates for X {x}")
    })?;
    check_dim(&grid.shape[0], x.shape[0].fixed(), || {
        format!("grid {grid} and X {x} disagree on the batch size")
    })?;
    let mut shape = vec![pick_dim(&[&x.shape[0], &grid.shape[0]]), x.shape[1].clone()];
    shape.extend(grid.shape[1..=r].iter().cloned());
    Ok(util::with_shape(x, shape))
}

/// Reflects `x` into `[lo, hi]` by folding at the borders (the reference's `_gs_reflect`).
fn reflect(x: f64, lo: f64, hi: f64) -> f64 {
    let range = hi - lo;
    if range <= 0.0 {
        return lo;
    }
    let fold = |dx: f64, near: f64, far: f64, sign: f64| {
        let n = (dx / range).trunc();
        let r = dx - n * range;
        if n % 2.0 == 0.0 {
            near + sign * r
        } else {
            far - sign * r
        }
    };
    if x < lo {
        fold(lo - x, lo, hi, 1.0)
    } else if x > hi {
        fold(x - hi, hi, lo, -1.0)
    } else {
        x
    }
}

/// One spatial axis of a GridSample input.
#[derive(Clone, Copy)]
struct SampleAxis {
    len: usize,
    /// The valid coordinate range: pixel centers `[0, len-1]` with aligned corners, pixel
    /// edges `[-0.5, len-0.5]` otherwise.
    lo: f64,
    hi: f64,
}

impl SampleAxis {
    fn new(len: usize, align_corners: bool) -> SampleAxis {
        if align_corners {
            SampleAxis {
                len,
                lo: 0.0,
                hi: len as f64 - 1.0,
            }
        } else {
            SampleAxis {
                len,
                lo: -0.5,
                hi: len as f64 - 0.5,
            }
        }
    }

    /// Pixel coordinate of normalized `v`, in f32 like the reference.
    fn denormalize(&self, v: f64, align_corners: bool) -> f64 {
        let (v, len) = (v as f32, self.len as f32);
        let x = if align_corners {
            (v + 1.0) / 2.0 * (len - 1.0)
        } else {
            ((v + 1.0) * len - 1.0) / 2.0
        };
        x as f64
    }

    /// The index an integer tap `i` reads, or `None` for a zero (padding) read.
    fn index(&self, i: i64, padding: GridPadding) -> Option<usize> {
        let last = self.len as i64 - 1;
        let i = match padding {
            GridPadding::Zeros => return usize::try_from(i).ok().filter(|&i| i < self.len),
            GridPadding::Border => i.clamp(0, last),
            // Truncation toward zero as in the reference; the clamp only guards NaN-free
            // rounding at the very edge.
            GridPadding::Reflection => (reflect(i as f64, self.lo, self.hi) as i64).clamp(0, last),
        };
        usize::try_from(i).ok()
    }
}

/// Keys cubic convolution coefficients (alpha -0.75) for fractional offset `t`.
fn cubic_coeffs(t: f64) -> [f64; 4] {
    const A: f64 = -0.75;
    let x = t.abs();
    [
        ((A * (x + 1.0) - 5.0 * A) * (x + 1.0) + 8.0 * A) * (x + 1.0) - 4.0 * A,
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0,
        ((A + 2.0) * (1.0 - x) - (A + 3.0)) * (1.0 - x) * (1.0 - x) + 1.0,
        ((A * (2.0 - x) - 5.0 * A) * (2.0 - x) + 8.0 * A) * (2.0 - x) - 4.0 * A,
    ]
}

/// The taps of one axis: `(integer index, weight)`.
fn axis_taps(x: f64, mode: GridMode) -> Vec<(i64, f64)> {
    match mode {
        GridMode::Nearest => vec![(x as i64, 1.0)],
        GridMode::Linear => {
            let x0 = x.floor();
            let t = x - x0;
            let i = x0 as i64;
            vec![(i, 1.0 - t), (i.saturating_add(1), t)]
        }
        GridMode::Cubic => {
            let x0 = x.floor();
            let c = cubic_coeffs(x - x0);
            let i = x0 as i64;
            (0..4).map(|k| (i.saturating_add(k - 1), c[k as usize])).collect()
        }
    }
}

/// The interpolated value at pixel coordinates `x` of one `[D1..Dr]` plane: a separable sum
/// over the taps of every axis (equal to the reference's axis-by-axis nesting).
fn interpolate(plane: &[f64], axes: &[SampleAxis], x: &[f64], mode: GridMode, padding: GridPadding) -> f64 {
    let taps: Vec<Vec<(i64, f64)>> = x.iter().map(|&v| axis_taps(v, mode)).collect();
    let counts: Vec<usize> = taps.iter().map(Vec::len).collect();
    let total: usize = counts.iter().product();
    let mut sum = 0.0;
    'combo: for combo in 0..total {
        let idx = util::unravel(combo, &counts);
        let (mut flat, mut weight) = (0usize, 1.0);
        for (d, &k) in idx.iter().enumerate() {
            let (i, w) = taps[d][k];
            let Some(i) = axes[d].index(i, padding) else {
                continue 'combo;
            };
            flat = flat * axes[d].len + i;
            weight *= w;
        }
        sum += weight * plane[flat];
    }
    sum
}

/// Pixel coordinates of one grid point (normalized, last spatial axis first), with the
/// reference's out-of-range handling for border and reflection padding.
fn grid_point(g: &[f64], axes: &[SampleAxis], mode: GridMode, padding: GridPadding, align: bool) -> Vec<f64> {
    let r = axes.len();
    (0..r)
        .map(|i| {
            let a = &axes[i];
            let mut v = a.denormalize(g[r - 1 - i], align);
            if mode == GridMode::Nearest {
                // numpy `rint`: halves go to the even neighbour.
                v = v.round_ties_even();
            }
            if v < a.lo || v > a.hi {
                v = match padding {
                    GridPadding::Border => v.clamp(0.0, a.len as f64 - 1.0),
                    GridPadding::Reflection => reflect(v, a.lo, a.hi),
                    GridPadding::Zeros => v,
                };
            }
            // The reference keeps coordinates in an f32 array.
            v as f32 as f64
        })
        .collect()
}

pub(super) fn eval_grid_sample(op: &VisionOp, cx: &EvalCtx) -> Result<Tensor, OpError> {
    let VisionOp::GridSample {
        mode,
        padding,
        align_corners,
    } = *op
    else {
        crate::bail!("not GridSample");
    };
    let x = cx.input(0)?;
    let grid = cx.input(1)?;
    let (xs, gs) = (x.shape(), grid.shape());
    if xs.len() < 3 || gs.len() != xs.len() || gs[0] != xs[0] || gs[xs.len() - 1] != xs.len() - 2 {
        crate::bail!("X {xs:?} and grid {gs:?} are inconsistent");
    }
    let r = xs.len() - 2;
    let (n, c) = (xs[0], xs[1]);
    let mut out_shape = vec![n, c];
    out_shape.extend_from_slice(&gs[1..=r]);
    let total = util::check_alloc(&out_shape)?;
    let points: usize = gs[1..=r].iter().product();
    let plane: usize = xs[2..].iter().product();
    if total > 0 && plane == 0 {
        crate::bail!("cannot sample from X {xs:?} with an empty spatial extent");
    }
    let axes: Vec<SampleAxis> = xs[2..]
        .iter()
        .map(|&d| SampleAxis::new(d, align_corners))
        .collect();
    let xd = x.to_f64_vec();
    let gd = grid.to_f64_vec();
    let mut y = vec![0.0; total];
    for b in 0..n {
        for p in 0..points {
            let g = &gd[(b * points + p) * r..(b * points + p + 1) * r];
            let px = grid_point(g, &axes, mode, padding, align_corners);
            for ch in 0..c {
                let src = &xd[(b * c + ch) * plane..(b * c + ch + 1) * plane];
                y[(b * c + ch) * points + p] = interpolate(src, &axes, &px, mode, padding);
            }
        }
    }
    from_f64s(x.dtype(), out_shape, y)
}

// ---------------------------------------------------------------------------------------------
// AffineGrid
// ---------------------------------------------------------------------------------------------

pub(super) fn infer_affine_grid(cx: &InferCtx) -> Result<TensorType, OpError> {
    let theta = cx.ty(0)?;
    let size = cx.ty(1)?;
    check_float(theta, "theta")?;
    check_rank(theta, 3, "theta")?;
    check_int64(size, "size")?;
    check_rank(size, 1, "size")?;
    // Spatial rank: from the size's length, else from theta's `[N, r, r+1]`.
    let r = match (size.shape[0].fixed(), theta.shape[1].fixed()) {
        (Some(len), _) => len
            .checked_sub(2)
            .filter(|r| (2..=3).contains(r))
            .ok_or_else(|| OpError::new(format!("size must have 4 or 5 elements, got {len}")))?,
        (None, Some(r)) => r,
        (None, None) => crate::bail!("cannot tell whether AffineGrid is 2-D or 3-D from {theta} and {size}"),
    };
    check_dim(&theta.shape[1], Some(r), || {
        format!("theta must be [N, {r}, {}], got {theta}", r + 1)
    })?;
    check_dim(&theta.shape[2], Some(r + 1), || {
        format!("theta must be [N, {r}, {}], got {theta}", r + 1)
    })?;
    let mut shape = vec![theta.shape[0].clone()];
    match cx.value(1) {
        Some(v) => {
            let s = extents(&int_values(v, "size")?, "size")?;
            if s.len() != r + 2 {
                crate::bail!("size {s:?} must have {} values for theta {theta}", r + 2);
            }
            check_dim(&theta.shape[0], s.first().copied(), || {
                format!("size {s:?} and theta {theta} disagree on the batch size")
            })?;
            shape.extend(s[2..].iter().map(|&d| Dim::Fixed(d)));
        }
        None => shape.extend((0..r).map(|_| Dim::unknown())),
    }
    shape.push(Dim::Fixed(r));
    Ok(util::with_shape(theta, shape))
}

/// Normalized coordinates of the pixel centers (or corners) of an axis of `len` pixels.
fn base_coords(len: usize, align_corners: bool) -> Vec<f64> {
    (0..len)
        .map(|i| {
            if align_corners {
                // A single pixel sits at -1 (the reference's `arange(-1, 1, inf)`).
                if len == 1 {
                    -1.0
                } else {
                    -1.0 + i as f64 * (2.0 / (len - 1) as f64)
                }
            } else {
                let step = 2.0 / len as f64;
                -1.0 + step / 2.0 + i as f64 * step
            }
        })
        .collect()
}

pub(super) fn eval_affine_grid(align_corners: bool, cx: &EvalCtx) -> Result<Tensor, OpError> {
    let theta = cx.input(0)?;
    let size = extents(&int_values(cx.input(1)?, "size")?, "size")?;
    let ts = theta.shape();
    let r = size.len().wrapping_sub(2);
    if !(2..=3).contains(&r) || ts.len() != 3 || ts[0] != size[0] || ts[1] != r || ts[2] != r + 1 {
        crate::bail!("theta {ts:?} and size {size:?} are inconsistent");
    }
    let n = size[0];
    let spatial = &size[2..];
    let mut out_shape = vec![n];
    out_shape.extend_from_slice(spatial);
    out_shape.push(r);
    let total = util::check_alloc(&out_shape)?;
    // Coordinate component k (x, y, z) varies along spatial axis r-1-k.
    let coords: Vec<Vec<f64>> = (0..r)
        .map(|k| base_coords(spatial[r - 1 - k], align_corners))
        .collect();
    let points: usize = spatial.iter().product();
    let td = theta.to_f64_vec();
    let mut y = Vec::with_capacity(total);
    for b in 0..n {
        let t = &td[b * r * (r + 1)..(b + 1) * r * (r + 1)];
        for p in 0..points {
            let idx = util::unravel(p, spatial);
            let mut homo: Vec<f64> = (0..r).map(|k| coords[k][idx[r - 1 - k]]).collect();
            homo.push(1.0);
            for row in t.chunks(r + 1) {
                y.push(row.iter().zip(&homo).map(|(a, b)| a * b).sum());
            }
        }
    }
    from_f64s(theta.dtype(), out_shape, y)
}

// ---------------------------------------------------------------------------------------------
// DeformConv
// ---------------------------------------------------------------------------------------------

struct DeformAttrs<'a> {
    kernel_shape: &'a [usize],
    strides: &'a [usize],
    pads: &'a [usize],
    dilations: &'a [usize],
    group: usize,
    offset_group: usize,
}

fn deform_attrs(op: &VisionOp) -> Result<DeformAttrs<'_>, OpError> {
    match op {
        VisionOp::DeformConv {
            kernel_shape,
            strides,
            pads,
            dilations,
            group,
            offset_group,
        } => Ok(DeformAttrs {
            kernel_shape,
            strides,
            pads,
            dilations,
            group: *group,
            offset_group: *offset_group,
        }),
        _ => crate::bail!("not DeformConv"),
    }
}

impl DeformAttrs<'_> {
    fn check_groups(&self) -> Result<(), OpError> {
        if self.group == 0 || self.offset_group == 0 {
            crate::bail!(
                "group {} and offset_group {} must be positive",
                self.group,
                self.offset_group
            );
        }
        Ok(())
    }

    /// The window geometry, with the kernel from the attribute or W's spatial dims.
    fn window(&self, w_spatial: &[Dim]) -> Result<WindowAttrs, OpError> {
        let kernel: Vec<Option<usize>> = if self.kernel_shape.is_empty() {
            w_spatial.iter().map(Dim::fixed).collect()
        } else {
            if self.kernel_shape.len() != w_spatial.len() {
                crate::bail!(
                    "kernel_shape {:?} does not match W's spatial rank",
                    self.kernel_shape
                );
            }
            for (k, w) in self.kernel_shape.iter().zip(w_spatial) {
                check_dim(w, Some(*k), || {
                    format!("kernel_shape {:?} does not match W", self.kernel_shape)
                })?;
            }
            self.kernel_shape.iter().map(|&k| Some(k)).collect()
        };
        WindowAttrs::new(
            kernel,
            self.strides,
            self.dilations,
            self.pads,
            AutoPad::NotSet,
            false,
        )
    }
}

pub(super) fn infer_deform_conv(op: &VisionOp, cx: &InferCtx) -> Result<TensorType, OpError> {
    let a = deform_attrs(op)?;
    a.check_groups()?;
    let x = cx.ty(0)?;
    let w = cx.ty(1)?;
    let offset = cx.ty(2)?;
    check_float(x, "X")?;
    if x.rank() < 3 {
        crate::bail!("X must be [N, C, spatial...], got {x}");
    }
    let rank = x.rank();
    for (t, what) in [(w, "W"), (offset, "offset")] {
        if t.dtype != x.dtype {
            crate::bail!("{what} has dtype {} but X has {}", t.dtype, x.dtype);
        }
        check_rank(t, rank, what)?;
    }
    if let Some(c) = x.shape[1].fixed() {
        check_dim(&w.shape[1], Some(c / a.group), || {
            format!("W {w} does not match X {x} with group {}", a.group)
        })?;
        if c % a.group != 0 || c % a.offset_group != 0 {
            crate::bail!(
                "X's {c} channels are not divisible by group {} and offset_group {}",
                a.group,
                a.offset_group
            );
        }
    }
    let m = w.shape[0].clone();
    if let Some(b) = cx.opt_ty(3) {
        if b.dtype != x.dtype {
            crate::bail!("B has dtype {} but X has {}", b.dtype, x.dtype);
        }
        check_rank(b, 1, "B")?;
        check_dim(&b.shape[0], m.fixed(), || format!("B {b} does not match W {w}"))?;
    }
    if let Some(mask) = cx.opt_ty(4) {
        if mask.dtype != x.dtype {
            crate::bail!("mask has dtype {} but X has {}", mask.dtype, x.dtype);
        }
        check_rank(mask, rank, "mask")?;
    }
    let window = a.window(&w.shape[2..])?;
    let mut shape = vec![pick_dim(&[&x.shape[0], &offset.shape[0]]), m];
    for i in 0..rank - 2 {
        let d = window.out_dim(i, &x.shape[i + 2])?;
        check_dim(&offset.shape[i + 2], d.fixed(), || {
            format!("offset {offset} does not match the output extent {d} on spatial axis {i}")
        })?;
        shape.push(pick_dim(&[&d, &offset.shape[i + 2]]));
    }
    Ok(util::with_shape(x, shape))
}

/// Bilinear sample of `plane` (extents `dims`) at real pixel coordinates `p`, zero outside.
fn bilinear(plane: &[f64], dims: &[usize], p: &[f64]) -> f64 {
    let r = dims.len();
    let mut sum = 0.0;
    'corner: for corner in 0..(1usize << r) {
        let (mut flat, mut weight) = (0usize, 1.0);
        for d in 0..r {
            let f = p[d].floor();
            let t = p[d] - f;
            let hi = (corner >> (r - 1 - d)) & 1 == 1;
            let i = if hi { f + 1.0 } else { f };
            if !(i >= 0.0 && i < dims[d] as f64) {
                continue 'corner;
            }
            flat = flat * dims[d] + i as usize;
            weight *= if hi { t } else { 1.0 - t };
        }
        sum += weight * plane[flat];
    }
    sum
}

/// DeformConv's window geometry: an axis per spatial dim of X (`x_spatial`), the kernel from
/// the attribute or W's spatial dims (`w_spatial`).
pub fn deform_conv_axes(
    op: &VisionOp,
    w_spatial: &[usize],
    x_spatial: &[usize],
) -> Result<Vec<Axis>, OpError> {
    let a = deform_attrs(op)?;
    a.check_groups()?;
    let w_dims: Vec<Dim> = w_spatial.iter().map(|&d| Dim::Fixed(d)).collect();
    a.window(&w_dims)?.axes(x_spatial)
}

pub(super) fn eval_deform_conv(op: &VisionOp, cx: &EvalCtx) -> Result<Tensor, OpError> {
    let a = deform_attrs(op)?;
    a.check_groups()?;
    let x = cx.input(0)?;
    let w = cx.input(1)?;
    let offset = cx.input(2)?;
    let (xs, ws, os) = (x.shape(), w.shape(), offset.shape());
    let rank = xs.len();
    if rank < 3 || ws.len() != rank || os.len() != rank {
        crate::bail!("X {xs:?}, W {ws:?} and offset {os:?} must have the same rank >= 3");
    }
    let r = rank - 2;
    let (n, c, m) = (xs[0], xs[1], ws[0]);
    let (g, og) = (a.group, a.offset_group);
    if c % g != 0 || m % g != 0 || ws[1] * g != c || c % og != 0 {
        crate::bail!("X {xs:?} and W {ws:?} do not fit group {g} and offset_group {og}");
    }
    let w_dims: Vec<Dim> = ws[2..].iter().map(|&d| Dim::Fixed(d)).collect();
    let axes = a.window(&w_dims)?.axes(&xs[2..])?;
    let kernel: Vec<usize> = axes.iter().map(|ax| ax.kernel).collect();
    let out_sp: Vec<usize> = axes.iter().map(|ax| ax.output).collect();
    let taps: usize = kernel.iter().product();
    let points: usize = out_sp.iter().product();
    if os[0] != n || os[1] != og * taps * r || os[2..] != out_sp[..] {
        crate::bail!("offset {os:?} must be [{n}, {}, {out_sp:?}]", og * taps * r);
    }
    let mask = cx.opt_input(4);
    if let Some(mk) = mask {
        let ms = mk.shape();
        if ms.len() != rank || ms[0] != n || ms[1] != og * taps || ms[2..] != out_sp[..] {
            crate::bail!("mask {ms:?} must be [{n}, {}, {out_sp:?}]", og * taps);
        }
    }
    let bias = cx.opt_input(3).map(Tensor::to_f64_vec);
    if bias.as_ref().is_some_and(|b| b.len() != m) {
        crate::bail!("B must have {m} values");
    }
    let mut out_shape = vec![n, m];
    out_shape.extend_from_slice(&out_sp);
    let total = util::check_alloc(&out_shape)?;
    util::check_alloc(&[c, taps, points])?;
    let (xd, wd, od) = (x.to_f64_vec(), w.to_f64_vec(), offset.to_f64_vec());
    let md = mask.map(Tensor::to_f64_vec);
    let plane: usize = xs[2..].iter().product();
    let (cg, mg, c_per_og) = (c / g, m / g, c / og);
    let mut y = vec![0.0; total];
    let mut col = vec![0.0; c * taps * points];
    for b in 0..n {
        // Sample every input channel at every deformed tap (the deformable im2col).
        for ch in 0..c {
            let o_grp = ch / c_per_og;
            let src = &xd[(b * c + ch) * plane..(b * c + ch + 1) * plane];
            for t in 0..taps {
                let tap = util::unravel(t, &kernel);
                for p in 0..points {
                    let o = util::unravel(p, &out_sp);
                    let pos: Vec<f64> = (0..r)
                        .map(|d| {
                            let base = (o[d] * axes[d].stride + tap[d] * axes[d].dilation) as f64
                                - axes[d].pad_begin as f64;
                            base + od[(((b * og + o_grp) * taps + t) * r + d) * points + p]
                        })
                        .collect();
                    let scale = md
                        .as_ref()
                        .map_or(1.0, |mk| mk[((b * og + o_grp) * taps + t) * points + p]);
                    col[(ch * taps + t) * points + p] = bilinear(src, &xs[2..], &pos) * scale;
                }
            }
        }
        for oc in 0..m {
            let grp = oc / mg;
            let out = &mut y[(b * m + oc) * points..(b * m + oc + 1) * points];
            out.fill(bias.as_ref().map_or(0.0, |bv| bv[oc]));
            for ic in 0..cg {
                let ch = grp * cg + ic;
                for t in 0..taps {
                    let wv = wd[(oc * cg + ic) * taps + t];
                    let src = &col[(ch * taps + t) * points..(ch * taps + t + 1) * points];
                    for (o, s) in out.iter_mut().zip(src) {
                        *o += wv * s;
                    }
                }
            }
        }
    }
    from_f64s(x.dtype(), out_shape, y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rounds_half_to_even() {
        let axes = [SampleAxis::new(4, true)];
        // Normalized 0 is pixel 1.5 with aligned corners: numpy's rint picks 2.
        let p = grid_point(&[0.0], &axes, GridMode::Nearest, GridPadding::Zeros, true);
        assert_eq!(p, vec![2.0]);
    }

    #[test]
    fn reflect_folds_at_borders() {
        assert_eq!(reflect(-1.0, -0.5, 3.5), 0.0);
        assert_eq!(reflect(4.0, -0.5, 3.5), 3.0);
        // Two folds: past the far border and back.
        assert_eq!(reflect(8.0, 0.0, 3.0), 2.0);
        assert_eq!(reflect(1.0, 0.0, 3.0), 1.0);
    }

    #[test]
    fn bilinear_zero_outside() {
        let plane = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(bilinear(&plane, &[2, 2], &[0.5, 0.5]), 2.5);
        assert_eq!(bilinear(&plane, &[2, 2], &[-0.5, 0.0]), 0.5);
    }
}

#[cfg(test)]
mod robustness {
    use super::*;

    /// Extreme and NaN grid coordinates give values (or errors), never a panic.
    #[test]
    fn grid_sample_extreme_coordinates() {
        let x = Tensor::from_vec(vec![1, 1, 2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let g = Tensor::from_vec(
            vec![1, 1, 3, 2],
            vec![f32::NAN, 1e30, -1e30, f32::INFINITY, 3.7, -2.2],
        );
        let ty = [x.tensor_type()];
        for mode in [GridMode::Linear, GridMode::Nearest, GridMode::Cubic] {
            for padding in [GridPadding::Zeros, GridPadding::Border, GridPadding::Reflection] {
                for align_corners in [false, true] {
                    let op = VisionOp::GridSample {
                        mode,
                        padding,
                        align_corners,
                    };
                    let cx = EvalCtx {
                        inputs: vec![Some(&x), Some(&g)],
                        out_types: &ty,
                    };
                    let y = eval_grid_sample(&op, &cx).unwrap();
                    assert_eq!(y.shape(), &[1, 1, 1, 3]);
                }
            }
        }
    }
}
