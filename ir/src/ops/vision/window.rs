//! Operators over windows or regions of an `[N, C, spatial...]` tensor: LRN, MaxUnpool,
//! Col2Im and CenterCropPad.

use super::{check_dim, check_float, check_int64, check_rank, extents, from_f64s, int_values, VisionOp};
use crate::ops::conv::{Axis, WindowAttrs};
use crate::ops::{util, EvalCtx, InferCtx};
use crate::{AutoPad, DType, Dim, Element, OpError, Tensor, TensorData, TensorType};

// ---------------------------------------------------------------------------------------------
// LRN
// ---------------------------------------------------------------------------------------------

pub(super) fn infer_lrn(cx: &InferCtx) -> Result<TensorType, OpError> {
    let x = cx.ty(0)?;
    check_float(x, "X")?;
    if x.rank() < 2 {
        crate::bail!("X must be [N, C, ...], got {x}");
    }
    Ok(x.clone())
}

pub(super) fn eval_lrn(op: &VisionOp, cx: &EvalCtx) -> Result<Tensor, OpError> {
    let VisionOp::Lrn {
        size,
        alpha,
        beta,
        bias,
    } = *op
    else {
        crate::bail!("not LRN");
    };
    let x = cx.input(0)?;
    let xs = x.shape();
    if xs.len() < 2 {
        crate::bail!("X must be [N, C, ...], got {xs:?}");
    }
    if size == 0 {
        crate::bail!("size must be positive");
    }
    let (n, c) = (xs[0], xs[1]);
    let inner: usize = xs[2..].iter().product();
    let xd = x.to_f64_vec();
    // The window of channel `ch` is [ch - floor((size-1)/2), ch + ceil((size-1)/2)].
    let (before, after) = ((size - 1) / 2, size / 2);
    let scale = alpha as f64 / size as f64;
    let mut y = vec![0.0; xd.len()];
    for b in 0..n {
        for ch in 0..c {
            let lo = ch.saturating_sub(before);
            let hi = (ch + after).min(c - 1);
            for i in 0..inner {
                let at = |k: usize| (b * c + k) * inner + i;
                let sq: f64 = (lo..=hi).map(|k| xd[at(k)] * xd[at(k)]).sum();
                y[at(ch)] = xd[at(ch)] / (bias as f64 + scale * sq).powf(beta as f64);
            }
        }
    }
    from_f64s(x.dtype(), xs.to_vec(), y)
}

// ---------------------------------------------------------------------------------------------
// MaxUnpool
// ---------------------------------------------------------------------------------------------

struct UnpoolAttrs<'a> {
    kernel_shape: &'a [usize],
    strides: &'a [usize],
    pads: &'a [usize],
}

fn unpool_attrs(op: &VisionOp) -> Result<UnpoolAttrs<'_>, OpError> {
    match op {
        VisionOp::MaxUnpool {
            kernel_shape,
            strides,
            pads,
        } => Ok(UnpoolAttrs {
            kernel_shape,
            strides,
            pads,
        }),
        _ => crate::bail!("not MaxUnpool"),
    }
}

impl UnpoolAttrs<'_> {
    /// The unpooled extent of spatial axis `i` for pooled extent `d`: the input extent of a
    /// pooling window that gives `d` outputs, `(d - 1) * stride - pads + kernel`.
    fn extent(&self, i: usize, d: usize) -> Result<usize, OpError> {
        let n = self.kernel_shape.len();
        let stride = self.strides.get(i).copied().unwrap_or(1);
        let (pb, pe) = (
            self.pads.get(i).copied().unwrap_or(0),
            self.pads.get(n + i).copied().unwrap_or(0),
        );
        d.saturating_sub(1)
            .checked_mul(stride)
            .and_then(|v| v.checked_add(self.kernel_shape[i]))
            .and_then(|v| v.checked_sub(pb))
            .and_then(|v| v.checked_sub(pe))
            .ok_or_else(|| OpError::new(format!("MaxUnpool output extent of spatial axis {i} is invalid")))
    }

    fn check(&self, spatial: usize) -> Result<(), OpError> {
        let n = self.kernel_shape.len();
        if n != spatial
            || (!self.strides.is_empty() && self.strides.len() != n)
            || (!self.pads.is_empty() && self.pads.len() != 2 * n)
        {
            crate::bail!(
                "kernel_shape {:?}, strides {:?} and pads {:?} do not fit {spatial} spatial axes",
                self.kernel_shape,
                self.strides,
                self.pads
            );
        }
        Ok(())
    }
}

pub(super) fn infer_max_unpool(op: &VisionOp, cx: &InferCtx) -> Result<TensorType, OpError> {
    let a = unpool_attrs(op)?;
    let x = cx.ty(0)?;
    let idx = cx.ty(1)?;
    check_float(x, "X")?;
    check_int64(idx, "I")?;
    if x.rank() < 3 {
        crate::bail!("X must be [N, C, spatial...], got {x}");
    }
    check_rank(idx, x.rank(), "I")?;
    a.check(x.rank() - 2)?;
    if let Some(os) = cx.opt_ty(2) {
        check_int64(os, "output_shape")?;
        check_rank(os, 1, "output_shape")?;
        check_dim(&os.shape[0], Some(x.rank()), || {
            format!("output_shape must have {} values", x.rank())
        })?;
        let shape = match cx.value(2) {
            Some(v) => util::dims(&extents(&int_values(v, "output_shape")?, "output_shape")?),
            None => (0..x.rank()).map(|_| Dim::unknown()).collect(),
        };
        return Ok(util::with_shape(x, shape));
    }
    let mut shape = vec![x.shape[0].clone(), x.shape[1].clone()];
    for (i, d) in x.shape[2..].iter().enumerate() {
        shape.push(match d.fixed() {
            Some(d) => Dim::Fixed(a.extent(i, d)?),
            None => Dim::unknown(),
        });
    }
    Ok(util::with_shape(x, shape))
}

pub(super) fn eval_max_unpool(op: &VisionOp, cx: &EvalCtx) -> Result<Tensor, OpError> {
    let a = unpool_attrs(op)?;
    let x = cx.input(0)?;
    let idx = cx.input(1)?;
    let xs = x.shape();
    if xs.len() < 3 || idx.shape() != xs {
        crate::bail!(
            "X {xs:?} and I {:?} must have the same shape [N, C, spatial...]",
            idx.shape()
        );
    }
    a.check(xs.len() - 2)?;
    let mut natural = xs[..2].to_vec();
    for (i, &d) in xs[2..].iter().enumerate() {
        natural.push(a.extent(i, d)?);
    }
    let nat_len = util::check_alloc(&natural)?;
    // Indices address the natural unpooled tensor; a larger output_shape pads it at the end
    // of every axis (the reference implementation's rule).
    let out_shape = match cx.opt_input(2) {
        Some(t) => extents(&int_values(t, "output_shape")?, "output_shape")?,
        None => natural.clone(),
    };
    if out_shape.len() != natural.len() || out_shape.iter().zip(&natural).any(|(o, n)| o < n) {
        crate::bail!("output_shape {out_shape:?} is smaller than the unpooled shape {natural:?}");
    }
    let total = util::check_alloc(&out_shape)?;
    let mut nat = vec![0.0; nat_len];
    for (v, i) in x.to_f64_vec().into_iter().zip(idx.to_i64_vec()) {
        let slot = usize::try_from(i).ok().filter(|&i| i < nat_len).ok_or_else(|| {
            OpError::new(format!(
                "index {i} is out of range for the unpooled shape {natural:?}"
            ))
        })?;
        nat[slot] = v;
    }
    let mut y = vec![0.0; total];
    for (flat, v) in nat.into_iter().enumerate() {
        y[util::ravel(&util::unravel(flat, &natural), &out_shape)] = v;
    }
    from_f64s(x.dtype(), out_shape, y)
}

// ---------------------------------------------------------------------------------------------
// Col2Im
// ---------------------------------------------------------------------------------------------

fn col2im_window(op: &VisionOp, block: &[usize]) -> Result<WindowAttrs, OpError> {
    let VisionOp::Col2Im {
        dilations,
        pads,
        strides,
    } = op
    else {
        crate::bail!("not Col2Im");
    };
    let kernel = block.iter().map(|&k| Some(k)).collect();
    WindowAttrs::new(kernel, strides, dilations, pads, AutoPad::NotSet, false)
}

pub(super) fn infer_col2im(op: &VisionOp, cx: &InferCtx) -> Result<TensorType, OpError> {
    let x = cx.ty(0)?;
    let image = cx.ty(1)?;
    let block = cx.ty(2)?;
    check_rank(x, 3, "input")?;
    if x.dtype == DType::Bool {
        crate::bail!("input must be numeric, got {x}");
    }
    for (t, what) in [(image, "image_shape"), (block, "block_shape")] {
        check_int64(t, what)?;
        check_rank(t, 1, what)?;
    }
    let mut shape = vec![x.shape[0].clone()];
    let (Some(iv), Some(bv)) = (cx.value(1), cx.value(2)) else {
        let r = image.shape[0].fixed().or(block.shape[0].fixed());
        let Some(r) = r else {
            crate::bail!("cannot infer the rank of Col2Im's output without image_shape's length");
        };
        shape.extend((0..=r).map(|_| Dim::unknown()));
        return Ok(util::with_shape(x, shape));
    };
    let img = extents(&int_values(iv, "image_shape")?, "image_shape")?;
    let blk = extents(&int_values(bv, "block_shape")?, "block_shape")?;
    let axes = col2im_axes(op, &img, &blk)?;
    let k: usize = blk.iter().product();
    let l: usize = axes.iter().map(|a| a.output).product();
    check_dim(&x.shape[2], Some(l), || {
        format!("input {x} must have {l} blocks for image {img:?}")
    })?;
    shape.push(match x.shape[1].fixed() {
        Some(ck) if ck % k != 0 => {
            crate::bail!("input {x} channels are not a multiple of the block size {k}")
        }
        Some(ck) => Dim::Fixed(ck / k),
        None => Dim::unknown(),
    });
    shape.extend(img.iter().map(|&d| Dim::Fixed(d)));
    Ok(util::with_shape(x, shape))
}

/// The block geometry: one axis per image dim, with `output` = blocks along that axis.
pub fn col2im_axes(op: &VisionOp, img: &[usize], blk: &[usize]) -> Result<Vec<Axis>, OpError> {
    if img.len() != blk.len() || img.is_empty() {
        crate::bail!("image_shape {img:?} and block_shape {blk:?} must have the same non-zero length");
    }
    col2im_window(op, blk)?.axes(img)
}

pub(super) fn eval_col2im(op: &VisionOp, cx: &EvalCtx) -> Result<Tensor, OpError> {
    let x = cx.input(0)?;
    let img = extents(&int_values(cx.input(1)?, "image_shape")?, "image_shape")?;
    let blk = extents(&int_values(cx.input(2)?, "block_shape")?, "block_shape")?;
    let axes = col2im_axes(op, &img, &blk)?;
    let xs = x.shape();
    let k: usize = blk.iter().product();
    let blocks: Vec<usize> = axes.iter().map(|a| a.output).collect();
    let l: usize = blocks.iter().product();
    if xs.len() != 3 || k == 0 || xs[1] % k != 0 || xs[2] != l {
        crate::bail!("input {xs:?} does not fit block_shape {blk:?} ({l} blocks of {k} values)");
    }
    let (n, c) = (xs[0], xs[1] / k);
    let mut out_shape = vec![n, c];
    out_shape.extend_from_slice(&img);
    let total = util::check_alloc(&out_shape)?;
    let plane: usize = img.iter().product();
    let xd = x.to_f64_vec();
    let mut y = vec![0.0; total];
    for t in 0..k {
        let tap = util::unravel(t, &blk);
        for b in 0..l {
            let pos = util::unravel(b, &blocks);
            // The image position this block's tap covers, if not in the padding.
            let mut at = Some(0usize);
            for (d, a) in axes.iter().enumerate() {
                let s = (pos[d] * a.stride + tap[d] * a.dilation) as i64 - a.pad_begin;
                at = at
                    .filter(|_| s >= 0 && (s as usize) < a.input)
                    .map(|f| f * a.input + s as usize);
            }
            let Some(at) = at else { continue };
            for nc in 0..n * c {
                y[nc * plane + at] += xd[(nc * k + t) * l + b];
            }
        }
    }
    from_f64s(x.dtype(), out_shape, y)
}

// ---------------------------------------------------------------------------------------------
// CenterCropPad
// ---------------------------------------------------------------------------------------------

/// The normalized, distinct axes (all axes when `None`).
fn crop_axes(axes: Option<&[i64]>, rank: usize) -> Result<Vec<usize>, OpError> {
    let Some(axes) = axes else {
        return Ok((0..rank).collect());
    };
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let a = util::norm_axis(a, rank)?;
        if out.contains(&a) {
            crate::bail!("axis {a} is repeated in {axes:?}");
        }
        out.push(a);
    }
    Ok(out)
}

pub(super) fn infer_center_crop_pad(axes: Option<&[i64]>, cx: &InferCtx) -> Result<TensorType, OpError> {
    let x = cx.ty(0)?;
    let s = cx.ty(1)?;
    if !s.dtype.is_int() {
        crate::bail!("shape must be an integer tensor, got {s}");
    }
    check_rank(s, 1, "shape")?;
    let axes = crop_axes(axes, x.rank())?;
    check_dim(&s.shape[0], Some(axes.len()), || {
        format!("shape {s} must have one value per axis ({} axes)", axes.len())
    })?;
    let mut shape = x.shape.clone();
    match cx.value(1) {
        Some(v) => {
            let vals = extents(&int_values(v, "shape")?, "shape")?;
            if vals.len() != axes.len() {
                crate::bail!(
                    "shape {vals:?} must have one value per axis ({} axes)",
                    axes.len()
                );
            }
            for (&a, &d) in axes.iter().zip(&vals) {
                shape[a] = Dim::Fixed(d);
            }
        }
        None => axes.iter().for_each(|&a| shape[a] = Dim::unknown()),
    }
    Ok(util::with_shape(x, shape))
}

pub(super) fn eval_center_crop_pad(axes: Option<&[i64]>, cx: &EvalCtx) -> Result<Tensor, OpError> {
    let x = cx.input(0)?;
    let xs = x.shape();
    let axes = crop_axes(axes, xs.len())?;
    let vals = extents(&int_values(cx.input(1)?, "shape")?, "shape")?;
    if vals.len() != axes.len() {
        crate::bail!(
            "shape {vals:?} must have one value per axis ({} axes)",
            axes.len()
        );
    }
    let mut out_shape = xs.to_vec();
    // Per axis: output index o reads input index o + shift (crop: shift > 0, pad: < 0); the
    // odd element of a crop or pad goes to the end.
    let mut shift = vec![0i64; xs.len()];
    for (&a, &d) in axes.iter().zip(&vals) {
        out_shape[a] = d;
        shift[a] = if d <= xs[a] {
            ((xs[a] - d) / 2) as i64
        } else {
            -(((d - xs[a]) / 2) as i64)
        };
    }
    let total = util::check_alloc(&out_shape)?;
    let src: Vec<Option<usize>> = (0..total)
        .map(|flat| {
            let idx = util::unravel(flat, &out_shape);
            let mut at = 0usize;
            for (d, &o) in idx.iter().enumerate() {
                let s = o as i64 + shift[d];
                if s < 0 || s as usize >= xs[d] {
                    return None;
                }
                at = at * xs[d] + s as usize;
            }
            Some(at)
        })
        .collect();
    let data = crate::with_data!(x.data(), v => gather_or_zero(v, &src));
    Tensor::new(out_shape, data)
        .map_err(|e| OpError::new(format!("internal: {} values for {:?}", e.len, e.shape)))
}

/// `v[i]` for each `Some(i)`, zero for `None`.
fn gather_or_zero<T: Element>(v: &[T], src: &[Option<usize>]) -> TensorData {
    T::wrap(src.iter().map(|s| s.map_or(T::zero(), |i| v[i])).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lrn_window_is_asymmetric_for_even_size() {
        // size 2: channel c sums c and c+1 (floor(1/2) = 0 before, ceil(1/2) = 1 after).
        let op = VisionOp::Lrn {
            size: 2,
            alpha: 2.0,
            beta: 1.0,
            bias: 0.0,
        };
        let x = Tensor::from_vec(vec![1, 2, 1], vec![1.0f64, 2.0]);
        let ty = [x.tensor_type()];
        let cx = EvalCtx {
            inputs: vec![Some(&x)],
            out_types: &ty,
        };
        let y = eval_lrn(&op, &cx).unwrap();
        // c0: 1 / (1 * (1 + 4)) ; c1: 2 / (1 * 4).
        assert_eq!(y.to_f64_vec(), vec![0.2, 0.5]);
    }

    #[test]
    fn center_crop_pad_puts_odd_element_at_end() {
        let x = Tensor::from_vec(vec![4], vec![1i32, 2, 3, 4]);
        let s = Tensor::from_vec(vec![1], vec![1i64]);
        let ty = [x.tensor_type()];
        let cx = EvalCtx {
            inputs: vec![Some(&x), Some(&s)],
            out_types: &ty,
        };
        assert_eq!(eval_center_crop_pad(None, &cx).unwrap().to_i64_vec(), vec![2]);
        let s = Tensor::from_vec(vec![1], vec![7i64]);
        let cx = EvalCtx {
            inputs: vec![Some(&x), Some(&s)],
            out_types: &ty,
        };
        assert_eq!(
            eval_center_crop_pad(None, &cx).unwrap().to_i64_vec(),
            vec![0, 1, 2, 3, 4, 0, 0]
        );
    }
}
