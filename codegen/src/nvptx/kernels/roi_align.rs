//! RoiAlign on the GPU, a thread per output bin `(roi, channel, y, x)`.
//!
//! A port of the library kernel (`kiln_uk_roi_align` in misc.c), itself the reference's
//! arithmetic in f64: the RoI scaled (shifted by half a pixel with `half_pixel`, else at
//! least one pixel a side), each bin sampled on a `gh×gw` grid (`sampling_ratio`, or
//! `ceil(extent / bins)` per RoI when it is 0), each sample bilinear with the reference's edge
//! rules; `avg` sums the weighted corners and divides by the sample count, `max` keeps the
//! largest weighted corner. A batch index outside the images is `KILN_CUDA_EINDEX` (the
//! library kernel's error), the bin then read from image 0.

use super::scalar::{load_index, load_local, load_real, store_real};
use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims, EINDEX};
use crate::target::TargetDesc;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::{FloatPredicate, IntPredicate};
use kiln_ir::{DType, Layout, Op, RoiPoolMode, VisionOp};

const THREADS: u64 = 128;

#[derive(Debug)]
struct RoiAlignGpu {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    rois: usize,
    ph: usize,
    pw: usize,
    /// Samples per bin axis; 0: `ceil(extent / bins)` per RoI.
    ratio: usize,
    max_mode: bool,
    half_pixel: bool,
    scale: f64,
    x_dtype: DType,
    roi_dtype: DType,
    index_dtype: DType,
}

/// The kernel for a RoiAlign node of static row-major tensors, or None.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    let Op::Vision(VisionOp::RoiAlign {
        mode,
        output_height,
        output_width,
        sampling_ratio,
        spatial_scale,
        half_pixel,
    }) = node.op()
    else {
        return Ok(None);
    };
    let typed = |i: usize| {
        node.input_type(i)
            .filter(|t| t.layout == Layout::RowMajor && t.is_static())
    };
    let (Some(x), Some(r), Some(bi)) = (typed(0), typed(1), typed(2)) else {
        return Ok(None);
    };
    let out = node.output_type(0);
    if !x.dtype.is_float()
        || !r.dtype.is_float()
        || out.dtype != x.dtype
        || !matches!(bi.dtype, DType::I32 | DType::I64)
    {
        return Ok(None);
    }
    let xs = node.input_shape(0)?;
    let rs = node.input_shape(1)?;
    if xs.len() != 4 || rs.len() != 2 || rs[1] != 4 || xs[2] == 0 || xs[3] == 0 {
        return Ok(None);
    }
    Ok(Some(Box::new(RoiAlignGpu {
        n: xs[0],
        c: xs[1],
        h: xs[2],
        w: xs[3],
        rois: rs[0],
        ph: *output_height,
        pw: *output_width,
        ratio: *sampling_ratio,
        max_mode: *mode == RoiPoolMode::Max,
        half_pixel: *half_pixel,
        scale: f64::from(*spatial_scale),
        x_dtype: x.dtype,
        roi_dtype: r.dtype,
        index_dtype: bi.dtype,
    })))
}

impl RoiAlignGpu {
    fn outputs(&self) -> usize {
        self.rois * self.c * self.ph * self.pw
    }

    /// Samples along a bin axis: the ratio, or `ceil(extent / bins)` saturated at 0 (the
    /// library's `roi_grid`).
    fn grid<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        extent: FloatValue<'ctx>,
        bins: usize,
    ) -> Result<IntValue<'ctx>> {
        if self.ratio > 0 {
            return Ok(e.i64c(self.ratio as i64));
        }
        let f64t = e.cx.f64_type();
        let q =
            e.b.build_float_div(extent, f64t.const_float(bins as f64), "")
                .map_err(llvm)?;
        let g = e
            .intrinsic("llvm.ceil", &[f64t.into()], &[q.into()])?
            .into_float_value();
        let positive = e.fcmp_scalar(FloatPredicate::OGT, g, f64t.const_zero())?;
        let huge = e.fcmp_scalar(FloatPredicate::OGE, g, f64t.const_float(9.2e18))?;
        let safe = e.select_float(
            e.b.build_and(positive, e.b.build_not(huge, "").map_err(llvm)?, "")
                .map_err(llvm)?,
            g,
            f64t.const_zero(),
        )?;
        let i =
            e.b.build_float_to_signed_int(safe, e.cx.i64_type(), "")
                .map_err(llvm)?;
        e.select_int(huge, e.i64c(i64::MAX), i)
    }

    /// The four weighted corners of the bilinear sample at `(y, x)` (`roi_sample`): plane
    /// offsets and weights, all weights 0 (offsets 0) outside `[-1, H] × [-1, W]`.
    #[allow(clippy::type_complexity)]
    fn sample<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        y: FloatValue<'ctx>,
        x: FloatValue<'ctx>,
    ) -> Result<[(IntValue<'ctx>, FloatValue<'ctx>); 4]> {
        let f64t = e.cx.f64_type();
        let c = |v: f64| f64t.const_float(v);
        let (h, w) = (self.h as f64, self.w as f64);
        let lt = |a, b| e.fcmp_scalar(FloatPredicate::OLT, a, c(b));
        let gt = |a, b| e.fcmp_scalar(FloatPredicate::OGT, a, c(b));
        let or = |a, b| e.b.build_or(a, b, "").map_err(llvm);
        let outside = or(or(lt(y, -1.0)?, gt(y, h)?)?, or(lt(x, -1.0)?, gt(x, w)?)?)?;
        // One axis: (low index, high index, fraction).
        let axis =
            |v: FloatValue<'ctx>, len: usize| -> Result<(IntValue<'ctx>, IntValue<'ctx>, FloatValue<'ctx>)> {
                let nonneg = e.fcmp_scalar(FloatPredicate::OGE, v, c(0.0))?;
                let v = e.select_float(nonneg, v, c(0.0))?;
                // Clamped before the conversion, which then never overflows.
                let top = e.fcmp_scalar(FloatPredicate::OGE, v, c((len - 1) as f64))?;
                let vc = e.select_float(top, c((len - 1) as f64), v)?;
                let lo =
                    e.b.build_float_to_signed_int(vc, e.cx.i64_type(), "")
                        .map_err(llvm)?;
                let hi = e.select_int(top, lo, e.addc(lo, 1)?)?;
                let lo_f = e.b.build_signed_int_to_float(lo, f64t, "").map_err(llvm)?;
                let frac = e.b.build_float_sub(vc, lo_f, "").map_err(llvm)?;
                Ok((lo, hi, frac))
            };
        let (yl, yh, ly) = axis(y, self.h)?;
        let (xl, xh, lx) = axis(x, self.w)?;
        let one_minus = |v| e.b.build_float_sub(c(1.0), v, "").map_err(llvm);
        let (hy, hx) = (one_minus(ly)?, one_minus(lx)?);
        let mul = |a, b| e.b.build_float_mul(a, b, "").map_err(llvm);
        let at = |yy: IntValue<'ctx>, xx: IntValue<'ctx>| e.add(e.mulc(yy, self.w as i64)?, xx);
        let corners = [
            (at(yl, xl)?, mul(hy, hx)?),
            (at(yl, xh)?, mul(hy, lx)?),
            (at(yh, xl)?, mul(ly, hx)?),
            (at(yh, xh)?, mul(ly, lx)?),
        ];
        let mut out = corners;
        for (pos, wt) in out.iter_mut() {
            *pos = e.select_int(outside, e.i64c(0), *pos)?;
            *wt = e.select_float(outside, c(0.0), *wt)?;
        }
        Ok(out)
    }

    /// The RoI `r` in input pixels: (x0, y0, width, height).
    fn roi<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        rois: PointerValue<'ctx>,
        r: IntValue<'ctx>,
    ) -> Result<[FloatValue<'ctx>; 4]> {
        let f64t = e.cx.f64_type();
        let off = f64t.const_float(if self.half_pixel { 0.5 } else { 0.0 });
        let coord = |k: i64| -> Result<FloatValue<'ctx>> {
            let v = load_real(e, rois, self.roi_dtype, e.addc(e.mulc(r, 4)?, k)?)?;
            let v =
                e.b.build_float_mul(v, f64t.const_float(self.scale), "")
                    .map_err(llvm)?;
            e.b.build_float_sub(v, off, "").map_err(llvm)
        };
        let (x0, y0) = (coord(0)?, coord(1)?);
        let mut rw = e.b.build_float_sub(coord(2)?, x0, "").map_err(llvm)?;
        let mut rh = e.b.build_float_sub(coord(3)?, y0, "").map_err(llvm)?;
        if !self.half_pixel {
            let one = f64t.const_float(1.0);
            rw = e.select_float(e.fcmp_scalar(FloatPredicate::OGE, rw, one)?, rw, one)?;
            rh = e.select_float(e.fcmp_scalar(FloatPredicate::OGE, rh, one)?, rh, one)?;
        }
        Ok([x0, y0, rw, rh])
    }
}

impl KernelCommon for RoiAlignGpu {
    fn describe(&self) -> String {
        format!(
            "gpu roi_align {} rois={} C={} out={}x{}",
            if self.max_mode { "max" } else { "avg" },
            self.rois,
            self.c,
            self.ph,
            self.pw
        )
    }
}

impl GpuKernel for RoiAlignGpu {
    fn launch(&self) -> LaunchDims {
        LaunchDims::per_item(self.outputs() as u64, THREADS)
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        self.emit_bins(k)?;
        k.ret()
    }
}

impl RoiAlignGpu {
    fn emit_bins<'ctx>(&self, k: &GpuBuilder<'_, 'ctx>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let f64t = e.cx.f64_type();
        let c = |v: f64| f64t.const_float(v);
        let (x, rois, batch, y) = (k.input(0)?, k.input(1)?, k.input(2)?, k.output(0)?);
        let (ph, pw) = (self.ph as i64, self.pw as i64);
        let acc = e.entry_alloca(f64t, "acc")?;
        let any = e.entry_alloca(e.cx.bool_type(), "any")?;
        let to_f = |i: IntValue<'ctx>| e.b.build_signed_int_to_float(i, f64t, "").map_err(llvm);
        let fadd = |a: FloatValue<'ctx>, b: FloatValue<'ctx>| e.b.build_float_add(a, b, "").map_err(llvm);
        let fmul = |a: FloatValue<'ctx>, b: FloatValue<'ctx>| e.b.build_float_mul(a, b, "").map_err(llvm);
        let fdiv = |a: FloatValue<'ctx>, b: FloatValue<'ctx>| e.b.build_float_div(a, b, "").map_err(llvm);
        k.grid_stride_loop(self.outputs() as u64, THREADS, |idx| {
            let px = e.uremc(idx, pw)?;
            let py = e.uremc(e.udivc(idx, pw)?, ph)?;
            let ch = e.uremc(e.udivc(idx, pw * ph)?, self.c as i64)?;
            let r = e.udivc(idx, pw * ph * self.c as i64)?;
            let b = load_index(&e, batch, self.index_dtype, r)?;
            let bad = e.b.build_or(
                e.icmp(IntPredicate::SLT, b, e.i64c(0))?,
                e.icmp(IntPredicate::SGE, b, e.i64c(self.n as i64))?,
                "",
            );
            let bad = bad.map_err(llvm)?;
            e.if_then(bad, || k.report_error(EINDEX))?;
            let b = e.select_int(bad, e.i64c(0), b)?;
            let [x0, y0, rw, rh] = self.roi(&e, rois, r)?;
            let (bin_h, bin_w) = (fdiv(rh, c(self.ph as f64))?, fdiv(rw, c(self.pw as f64))?);
            let (gh, gw) = (self.grid(&e, rh, self.ph)?, self.grid(&e, rw, self.pw)?);
            let plane = e.mulc(e.add(e.mulc(b, self.c as i64)?, ch)?, (self.h * self.w) as i64)?;
            // Bin start along each axis, and the step between its samples.
            let y_start = fadd(y0, fmul(to_f(py)?, bin_h)?)?;
            let x_start = fadd(x0, fmul(to_f(px)?, bin_w)?)?;
            let (y_step, x_step) = (fdiv(bin_h, to_f(gh)?)?, fdiv(bin_w, to_f(gw)?)?);
            e.store(acc, c(0.0))?;
            e.store(any, e.cx.bool_type().const_zero())?;
            e.for_range(e.i64c(0), gh, 1, |iy| {
                let half = |i| fadd(to_f(i)?, c(0.5));
                let yy = fadd(y_start, fmul(half(iy)?, y_step)?)?;
                e.for_range(e.i64c(0), gw, 1, |ix| {
                    let xx = fadd(x_start, fmul(half(ix)?, x_step)?)?;
                    let taps = self.sample(&e, yy, xx)?;
                    let weighted =
                        |(pos, wt): (IntValue<'ctx>, FloatValue<'ctx>)| -> Result<FloatValue<'ctx>> {
                            fmul(wt, load_real(&e, x, self.x_dtype, e.add(plane, pos)?)?)
                        };
                    if self.max_mode {
                        // The largest weighted corner (a NaN replaced by the next value).
                        let mut m = c(f64::NEG_INFINITY);
                        for t in taps {
                            let v = weighted(t)?;
                            let take = e.b.build_or(
                                e.fcmp_scalar(FloatPredicate::OGT, v, m)?,
                                e.fcmp_scalar(FloatPredicate::UNO, m, m)?,
                                "",
                            );
                            m = e.select_float(take.map_err(llvm)?, v, m)?;
                        }
                        let a = load_local(&e, acc)?;
                        let seen =
                            e.b.build_load(e.cx.bool_type(), any, "")
                                .map_err(llvm)?
                                .into_int_value();
                        let take = e.b.build_or(
                            e.b.build_not(seen, "").map_err(llvm)?,
                            e.b.build_or(
                                e.fcmp_scalar(FloatPredicate::OGT, m, a)?,
                                e.fcmp_scalar(FloatPredicate::UNO, a, a)?,
                                "",
                            )
                            .map_err(llvm)?,
                            "",
                        );
                        e.store(acc, e.select_float(take.map_err(llvm)?, m, a)?)?;
                        e.store(any, e.cx.bool_type().const_all_ones())
                    } else {
                        let mut a = load_local(&e, acc)?;
                        for t in taps {
                            a = fadd(a, weighted(t)?)?;
                        }
                        e.store(acc, a)
                    }
                })
            })?;
            let a = load_local(&e, acc)?;
            let v = if self.max_mode {
                let seen =
                    e.b.build_load(e.cx.bool_type(), any, "")
                        .map_err(llvm)?
                        .into_int_value();
                e.select_float(seen, a, c(0.0))?
            } else {
                let samples = e.mul(gh, gw)?;
                let positive = e.icmp(IntPredicate::SGT, samples, e.i64c(0))?;
                fdiv(a, to_f(e.select_int(positive, samples, e.i64c(1))?)?)?
            };
            store_real(&e, y, self.x_dtype, idx, v)
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check, run_graph};
    use crate::test_rng::TestRng;
    use kiln_ir::{DType, Graph, Op, RoiPoolMode, Tensor, TensorType, VisionOp};

    fn roi_align(mode: RoiPoolMode, ratio: usize, half_pixel: bool, batch: Vec<i64>) -> (Graph, Vec<Tensor>) {
        let r = batch.len();
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[2, 3, 10, 12]));
        let rois = g.add_input("rois", TensorType::fixed(DType::F32, &[r, 4]));
        let bi = g.add_input("bi", TensorType::fixed(DType::I64, &[r]));
        let op = Op::Vision(VisionOp::RoiAlign {
            mode,
            output_height: 3,
            output_width: 4,
            sampling_ratio: ratio,
            spatial_scale: 0.5,
            half_pixel,
        });
        let y = g
            .add("roi", op, vec![Some(x), Some(rois), Some(bi)], "y")
            .unwrap();
        g.add_output("y", y);
        let xv = TestRng::new(5).vec_scaled(2 * 3 * 10 * 12, 3.0);
        // RoIs inside, across the edge, beyond it, degenerate (x2 < x1) and tiny.
        let boxes = [
            [2.0f32, 3.0, 15.0, 17.0],
            [-4.0, -2.0, 8.0, 30.0],
            [30.0, 25.0, 40.0, 31.0],
            [10.0, 10.0, 4.0, 6.0],
            [5.0, 5.0, 5.5, 5.2],
        ];
        let rv: Vec<f32> = boxes.iter().cycle().take(r).flatten().copied().collect();
        (
            g,
            vec![
                Tensor::from_vec(vec![2, 3, 10, 12], xv),
                Tensor::from_vec(vec![r, 4], rv),
                Tensor::from_vec(vec![r], batch),
            ],
        )
    }

    #[test]
    fn avg_and_max_with_fixed_and_adaptive_grids() {
        for mode in [RoiPoolMode::Avg, RoiPoolMode::Max] {
            for (ratio, half_pixel) in [(0, true), (2, false), (0, false)] {
                let (g, inputs) = roi_align(mode, ratio, half_pixel, vec![0, 1, 1, 0, 1]);
                let kernels = check_graph(&g, &inputs);
                assert!(
                    kernels.iter().all(|k| k.starts_with("gpu roi_align")),
                    "{kernels:?}"
                );
            }
        }
    }

    #[test]
    fn a_batch_index_outside_the_images_is_an_index_error() {
        let (g, inputs) = roi_align(RoiPoolMode::Avg, 2, true, vec![0, 2]);
        let err = run_graph(&g, &inputs).unwrap_err();
        assert!(err.contains("failed with code 1"), "{err}");
    }

    #[test]
    fn ptx_assembles() {
        ptxas_check(&roi_align(RoiPoolMode::Max, 0, true, vec![0, 1]).0, 80);
    }
}
