//! NonMaxSuppression and RoiAlign.

use super::{check_dim, check_float, check_int64, check_rank, from_f64s, pick_dim, RoiPoolMode, VisionOp};
use crate::ops::{util, EvalCtx, InferCtx};
use crate::{DType, Dim, OpError, Tensor, TensorType};
use std::ops::{Add, Div, Mul, Sub};

// ---------------------------------------------------------------------------------------------
// NonMaxSuppression
// ---------------------------------------------------------------------------------------------

pub(super) fn infer_nms(cx: &InferCtx) -> Result<TensorType, OpError> {
    let boxes = cx.ty(0)?;
    let scores = cx.ty(1)?;
    check_float(boxes, "boxes")?;
    check_rank(boxes, 3, "boxes")?;
    check_rank(scores, 3, "scores")?;
    if scores.dtype != boxes.dtype {
        crate::bail!("scores has dtype {} but boxes has {}", scores.dtype, boxes.dtype);
    }
    check_dim(&boxes.shape[2], Some(4), || {
        format!("boxes must be [batch, boxes, 4], got {boxes}")
    })?;
    check_dim(&scores.shape[0], boxes.shape[0].fixed(), || {
        format!("scores {scores} and boxes {boxes} disagree on the batch size")
    })?;
    check_dim(&scores.shape[2], boxes.shape[1].fixed(), || {
        format!("scores {scores} and boxes {boxes} disagree on the number of boxes")
    })?;
    if let Some(m) = cx.opt_ty(2) {
        check_int64(m, "max_output_boxes_per_class")?;
    }
    for (i, what) in [(3, "iou_threshold"), (4, "score_threshold")] {
        if let Some(t) = cx.opt_ty(i) {
            check_float(t, what)?;
        }
    }
    Ok(TensorType::new(DType::I64, vec![Dim::unknown(), Dim::Fixed(3)]))
}

/// The first element of an optional scalar input; `None` when absent or empty.
fn first_f64(t: Option<&Tensor>) -> Option<f64> {
    t.and_then(|t| t.to_f64_vec().first().copied())
}

pub(super) fn eval_nms(center_point_box: bool, cx: &EvalCtx) -> Result<Tensor, OpError> {
    let boxes = cx.input(0)?;
    let scores = cx.input(1)?;
    let (bs, ss) = (boxes.shape(), scores.shape());
    if bs.len() != 3 || bs[2] != 4 || ss.len() != 3 || ss[0] != bs[0] || ss[2] != bs[1] {
        crate::bail!("boxes {bs:?} and scores {ss:?} must be [B, N, 4] and [B, C, N]");
    }
    let max_out = cx
        .opt_input(2)
        .and_then(|t| t.to_i64_vec().first().copied())
        .unwrap_or(0)
        .max(0) as usize;
    // Thresholds are compared in the boxes' precision, as the reference does (it matters at
    // the IoU boundary).
    match boxes.dtype() {
        DType::F64 => run_nms::<f64>(boxes, scores, cx, max_out, center_point_box),
        DType::F32 | DType::F16 | DType::BF16 => run_nms::<f32>(boxes, scores, cx, max_out, center_point_box),
        d => crate::bail!("boxes must be floating-point, got {d}"),
    }
}

/// The arithmetic NMS needs, in the precision of the boxes.
trait Real:
    Copy + PartialOrd + Add<Output = Self> + Sub<Output = Self> + Mul<Output = Self> + Div<Output = Self>
{
    fn of(v: f64) -> Self;
}

impl Real for f32 {
    fn of(v: f64) -> f32 {
        v as f32
    }
}

impl Real for f64 {
    fn of(v: f64) -> f64 {
        v
    }
}

fn run_nms<T: Real>(
    boxes: &Tensor,
    scores: &Tensor,
    cx: &EvalCtx,
    max_out: usize,
    center_point_box: bool,
) -> Result<Tensor, OpError> {
    let (nb, n) = (boxes.shape()[0], boxes.shape()[1]);
    let nc = scores.shape()[1];
    let bx: Vec<T> = boxes.to_f64_vec().into_iter().map(T::of).collect();
    let sc: Vec<T> = scores.to_f64_vec().into_iter().map(T::of).collect();
    let iou_threshold = T::of(first_f64(cx.opt_input(3)).unwrap_or(0.0));
    let score_threshold = first_f64(cx.opt_input(4)).map(T::of);
    let mut out: Vec<i64> = vec![];
    for b in 0..nb {
        let batch_boxes = &bx[b * n * 4..(b + 1) * n * 4];
        for c in 0..nc {
            let class_scores = &sc[(b * nc + c) * n..(b * nc + c + 1) * n];
            let mut cand: Vec<usize> = (0..n)
                .filter(|&i| score_threshold.is_none_or(|t| class_scores[i] > t))
                .collect();
            // Highest score first; ties go to the lower box index (the reference's order).
            cand.sort_by(|&i, &j| {
                class_scores[j]
                    .partial_cmp(&class_scores[i])
                    .unwrap_or(std::cmp::Ordering::Equal)
                    .then(i.cmp(&j))
            });
            let mut selected: Vec<usize> = vec![];
            for i in cand {
                if selected.len() >= max_out {
                    break;
                }
                let bi = &batch_boxes[i * 4..i * 4 + 4];
                if selected.iter().all(|&s| {
                    !suppresses(
                        bi,
                        &batch_boxes[s * 4..s * 4 + 4],
                        center_point_box,
                        iou_threshold,
                    )
                }) {
                    selected.push(i);
                    out.extend([b as i64, c as i64, i as i64]);
                }
            }
        }
    }
    Ok(Tensor::from_vec(vec![out.len() / 3, 3], out))
}

/// `(min, max)` along one axis of a box.
fn extent<T: Real>(b: &[T], axis: usize, center: bool) -> (T, T) {
    if center {
        let half = b[axis + 2] / T::of(2.0);
        (b[axis] - half, b[axis] + half)
    } else if b[axis] <= b[axis + 2] {
        (b[axis], b[axis + 2])
    } else {
        (b[axis + 2], b[axis])
    }
}

fn max<T: Real>(a: T, b: T) -> T {
    if a >= b {
        a
    } else {
        b
    }
}

fn min<T: Real>(a: T, b: T) -> T {
    if a <= b {
        a
    } else {
        b
    }
}

/// Whether the IoU of two boxes exceeds the threshold. Corner boxes are `[y1, x1, y2, x2]`
/// (either corner order), center boxes `[x, y, w, h]`.
fn suppresses<T: Real>(a: &[T], b: &[T], center: bool, threshold: T) -> bool {
    let zero = T::of(0.0);
    // Corner format stores y first, center format x first; IoU is symmetric in the axes.
    let (ay, ax) = (extent(a, 0, center), extent(a, 1, center));
    let (by, bx) = (extent(b, 0, center), extent(b, 1, center));
    let ix = min(ax.1, bx.1) - max(ax.0, bx.0);
    let iy = min(ay.1, by.1) - max(ay.0, by.0);
    if ix <= zero || iy <= zero {
        return false;
    }
    let inter = ix * iy;
    let area_a = (ax.1 - ax.0) * (ay.1 - ay.0);
    let area_b = (bx.1 - bx.0) * (by.1 - by.0);
    let union = area_a + area_b - inter;
    if inter <= zero || area_a <= zero || area_b <= zero || union <= zero {
        return false;
    }
    inter / union > threshold
}

// ---------------------------------------------------------------------------------------------
// RoiAlign
// ---------------------------------------------------------------------------------------------

pub(super) fn infer_roi_align(oh: usize, ow: usize, cx: &InferCtx) -> Result<TensorType, OpError> {
    let x = cx.ty(0)?;
    let rois = cx.ty(1)?;
    let bi = cx.ty(2)?;
    check_float(x, "X")?;
    check_rank(x, 4, "X")?;
    check_rank(rois, 2, "rois")?;
    check_rank(bi, 1, "batch_indices")?;
    if rois.dtype != x.dtype {
        crate::bail!("rois has dtype {} but X has {}", rois.dtype, x.dtype);
    }
    if !bi.dtype.is_int() {
        crate::bail!("batch_indices must be an integer tensor, got {bi}");
    }
    check_dim(&rois.shape[1], Some(4), || {
        format!("rois must be [num_rois, 4], got {rois}")
    })?;
    check_dim(&bi.shape[0], rois.shape[0].fixed(), || {
        format!("batch_indices {bi} and rois {rois} disagree on the number of RoIs")
    })?;
    let r = pick_dim(&[&rois.shape[0], &bi.shape[0]]);
    Ok(util::with_shape(
        x,
        vec![r, x.shape[1].clone(), Dim::Fixed(oh), Dim::Fixed(ow)],
    ))
}

/// One bilinear sample: four flat plane offsets and their weights (all zero outside).
#[derive(Clone, Copy, Default)]
struct Tap {
    pos: [usize; 4],
    w: [f64; 4],
}

/// The sample at `(y, x)` of an `h`×`w` plane, with the reference's edge rules.
fn roi_tap(y: f64, x: f64, h: usize, w: usize) -> Tap {
    if y < -1.0 || y > h as f64 || x < -1.0 || x > w as f64 {
        return Tap::default();
    }
    let (mut y, mut x) = (y.max(0.0), x.max(0.0));
    let (mut yl, mut xl) = (y as usize, x as usize);
    let (yh, xh);
    if yl >= h - 1 {
        yl = h - 1;
        yh = h - 1;
        y = yl as f64;
    } else {
        yh = yl + 1;
    }
    if xl >= w - 1 {
        xl = w - 1;
        xh = w - 1;
        x = xl as f64;
    } else {
        xh = xl + 1;
    }
    let (ly, lx) = (y - yl as f64, x - xl as f64);
    let (hy, hx) = (1.0 - ly, 1.0 - lx);
    Tap {
        pos: [yl * w + xl, yl * w + xh, yh * w + xl, yh * w + xh],
        w: [hy * hx, hy * lx, ly * hx, ly * lx],
    }
}

pub(super) fn eval_roi_align(op: &VisionOp, cx: &EvalCtx) -> Result<Tensor, OpError> {
    let VisionOp::RoiAlign {
        mode,
        output_height: ph,
        output_width: pw,
        sampling_ratio,
        spatial_scale,
        half_pixel,
    } = *op
    else {
        crate::bail!("not RoiAlign");
    };
    let x = cx.input(0)?;
    let rois = cx.input(1)?;
    let bi = cx.input(2)?.to_i64_vec();
    let xs = x.shape();
    if xs.len() != 4 || rois.shape().len() != 2 || rois.shape()[1] != 4 || rois.shape()[0] != bi.len() {
        crate::bail!(
            "X {xs:?}, rois {:?} and batch_indices [{}] are inconsistent",
            rois.shape(),
            bi.len()
        );
    }
    let (n, c, h, w) = (xs[0], xs[1], xs[2], xs[3]);
    let nr = bi.len();
    let out_shape = vec![nr, c, ph, pw];
    let total = util::check_alloc(&out_shape)?;
    let xd = x.to_f64_vec();
    let rd = rois.to_f64_vec();
    let mut y = vec![0.0; total];
    if h == 0 || w == 0 {
        if total > 0 {
            crate::bail!("X has an empty spatial extent {xs:?}");
        }
        return from_f64s(x.dtype(), out_shape, y);
    }
    let scale = spatial_scale as f64;
    let off = if half_pixel { 0.5 } else { 0.0 };
    for r in 0..nr {
        let b = usize::try_from(bi[r])
            .ok()
            .filter(|&b| b < n)
            .ok_or_else(|| OpError::new(format!("batch index {} is out of range for {n} images", bi[r])))?;
        let roi = &rd[r * 4..r * 4 + 4];
        let (x0, y0) = (roi[0] * scale - off, roi[1] * scale - off);
        let (mut rw, mut rh) = (roi[2] * scale - off - x0, roi[3] * scale - off - y0);
        if !half_pixel {
            rw = rw.max(1.0);
            rh = rh.max(1.0);
        }
        let (bin_h, bin_w) = (rh / ph as f64, rw / pw as f64);
        let grid = |extent: f64, bins: usize| -> usize {
            if sampling_ratio > 0 {
                return sampling_ratio;
            }
            // Saturating float-to-int: a huge RoI fails the allocation check below, a NaN or
            // negative one gives no samples.
            (extent / bins as f64).ceil() as usize
        };
        let (gh, gw) = (grid(rh, ph), grid(rw, pw));
        util::check_alloc(&[ph, pw, gh, gw])?;
        let count = (gh * gw).max(1) as f64;
        // Sample positions and weights are shared by every channel.
        let mut taps = Vec::with_capacity(ph * pw * gh * gw);
        for py in 0..ph {
            for px in 0..pw {
                for iy in 0..gh {
                    let yy = y0 + py as f64 * bin_h + (iy as f64 + 0.5) * bin_h / gh as f64;
                    for ix in 0..gw {
                        let xx = x0 + px as f64 * bin_w + (ix as f64 + 0.5) * bin_w / gw as f64;
                        taps.push(roi_tap(yy, xx, h, w));
                    }
                }
            }
        }
        let per_bin = gh * gw;
        for ch in 0..c {
            let plane = &xd[(b * c + ch) * h * w..(b * c + ch + 1) * h * w];
            let out = &mut y[(r * c + ch) * ph * pw..(r * c + ch + 1) * ph * pw];
            // With no samples per bin (`taps` empty) every output stays 0, as in the reference.
            for (o, bin) in out.iter_mut().zip(taps.chunks(per_bin.max(1))) {
                *o = pool_bin(bin, plane, mode, count);
            }
        }
    }
    from_f64s(x.dtype(), out_shape, y)
}

/// Pools one output bin. Max mode takes the largest weighted corner of each sample, as the
/// reference and onnxruntime do (not the maximum of the interpolated values).
fn pool_bin(bin: &[Tap], plane: &[f64], mode: RoiPoolMode, count: f64) -> f64 {
    match mode {
        RoiPoolMode::Avg => {
            let sum: f64 = bin
                .iter()
                .map(|t| (0..4).map(|k| t.w[k] * plane[t.pos[k]]).sum::<f64>())
                .sum();
            sum / count
        }
        RoiPoolMode::Max => bin
            .iter()
            .map(|t| {
                (0..4)
                    .map(|k| t.w[k] * plane[t.pos[k]])
                    .fold(f64::NEG_INFINITY, f64::max)
            })
            .fold(None, |acc: Option<f64>, v| Some(acc.map_or(v, |a| a.max(v))))
            .unwrap_or(0.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iou_boundary_is_strict() {
        let a = [0.0f32, 0.0, 1.0, 1.0];
        let b = [0.0f32, 0.0, 1.0, 1.0];
        assert!(suppresses(&a, &b, false, 0.5));
        assert!(!suppresses(&a, &b, false, 1.0));
        // Flipped corners describe the same box.
        let c = [1.0f32, 1.0, 0.0, 0.0];
        assert!(suppresses(&a, &c, false, 0.99));
    }

    #[test]
    fn center_boxes() {
        let a = [0.5f64, 0.5, 1.0, 1.0];
        let b = [1.0f64, 0.5, 1.0, 1.0];
        // Overlap 0.5, union 1.5.
        assert!(suppresses(&a, &b, true, 0.3));
        assert!(!suppresses(&a, &b, true, 0.34));
    }
}
