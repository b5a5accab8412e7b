//! GridSample and AffineGrid on the GPU, a thread per output element.
//!
//! Ports of the library kernels (`kiln_uk_grid_sample`, `kiln_uk_affine_grid` in movement.c,
//! which follow the reference's `vision/sample.rs`), with the same arithmetic: GridSample
//! unnormalizes each grid coordinate in f32, applies the padding mode to the location, takes
//! its taps (nearest: 1, linear: 2, cubic: 4 per axis, with the cubic weights of A = -0.75)
//! and their weights in f64, maps each tap through the padding mode again, and sums
//! `weight · x` over every combination of taps in the library's order (first axis
//! outermost); a zero-padded tap contributes nothing. The spatial rank and tap count are
//! compile-time constants, so a thread's taps live in registers and the combinations are
//! unrolled (up to `MAX_COMBOS`; beyond, the library kernel runs). AffineGrid computes each
//! output coordinate as `θ[row] · (base coordinates, 1)`.

use super::scalar::{load_real, store_real};
use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims};
use crate::target::TargetDesc;
use inkwell::values::{FloatValue, IntValue};
use inkwell::{FloatPredicate, IntPredicate};
use kiln_ir::{DType, GridMode, GridPadding, Layout, Op, VisionOp};

const THREADS: u64 = 256;
/// The most tap combinations a thread unrolls (cubic in 3-D: 64).
const MAX_COMBOS: usize = 64;

#[derive(Debug)]
struct GridSampleGpu {
    mode: GridMode,
    padding: GridPadding,
    align_corners: bool,
    n: usize,
    c: usize,
    /// The input's spatial extents and the number of sampled points per image.
    len: Vec<usize>,
    points: usize,
    x_dtype: DType,
    grid_dtype: DType,
    y_dtype: DType,
}

#[derive(Debug)]
struct AffineGridGpu {
    align_corners: bool,
    n: usize,
    /// The output's spatial extents (2 or 3 of them).
    spatial: Vec<usize>,
    dtype: DType,
}

/// The kernel for a GridSample or AffineGrid node of static row-major float tensors, or None.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    let float = |t: Option<&kiln_ir::TensorType>| {
        t.filter(|t| t.dtype.is_float() && t.layout == Layout::RowMajor && t.is_static())
            .map(|t| t.dtype)
    };
    let y = float(Some(node.output_type(0)));
    match node.op() {
        Op::Vision(VisionOp::GridSample {
            mode,
            padding,
            align_corners,
        }) => {
            let (Some(x_dtype), Some(grid_dtype), Some(y_dtype)) =
                (float(node.input_type(0)), float(node.input_type(1)), y)
            else {
                return Ok(None);
            };
            let (xs, gs) = (node.input_shape(0)?, node.input_shape(1)?);
            let r = xs.len().saturating_sub(2);
            let taps = match mode {
                GridMode::Nearest => 1usize,
                GridMode::Linear => 2,
                GridMode::Cubic => 4,
            };
            if r == 0 || gs.len() != r + 2 || taps.pow(r as u32) > MAX_COMBOS || xs[2..].contains(&0) {
                return Ok(None);
            }
            Ok(Some(Box::new(GridSampleGpu {
                mode: *mode,
                padding: *padding,
                align_corners: *align_corners,
                n: xs[0],
                c: xs[1],
                len: xs[2..].to_vec(),
                points: gs[1..=r].iter().product(),
                x_dtype,
                grid_dtype,
                y_dtype,
            })))
        }
        Op::Vision(VisionOp::AffineGrid { align_corners }) => {
            let (Some(theta), Some(out)) = (float(node.input_type(0)), y) else {
                return Ok(None);
            };
            let os = node.output_shape(0)?;
            let r = os.len().saturating_sub(2);
            if !(2..=3).contains(&r) || theta != out {
                return Ok(None);
            }
            Ok(Some(Box::new(AffineGridGpu {
                align_corners: *align_corners,
                n: os[0],
                spatial: os[1..=r].to_vec(),
                dtype: out,
            })))
        }
        _ => Ok(None),
    }
}

fn f64c<'ctx>(e: &Emit<'_, 'ctx>, v: f64) -> FloatValue<'ctx> {
    e.cx.f64_type().const_float(v)
}

fn f64_intrinsic<'ctx>(e: &Emit<'_, 'ctx>, name: &str, x: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
    let t = e.cx.f64_type().into();
    Ok(e.intrinsic(name, &[t], &[x.into()])?.into_float_value())
}

/// Rust's saturating `as i64` of the library kernel (`mv_f2i`): NaN is 0, huge values ±2^62.
fn to_index<'ctx>(e: &Emit<'_, 'ctx>, v: FloatValue<'ctx>) -> Result<IntValue<'ctx>> {
    let i64t = e.cx.i64_type();
    let lo = e.fcmp_scalar(FloatPredicate::OLE, v, f64c(e, -9.2e18))?;
    let hi = e.fcmp_scalar(FloatPredicate::OGE, v, f64c(e, 9.2e18))?;
    let nan = e.fcmp_scalar(FloatPredicate::UNO, v, v)?;
    // Clamped first, so the conversion never sees a value it cannot represent.
    let clamped = e.select_float(lo, f64c(e, 0.0), e.select_float(hi, f64c(e, 0.0), v)?)?;
    let clamped = e.select_float(nan, f64c(e, 0.0), clamped)?;
    let i = e.b.build_float_to_signed_int(clamped, i64t, "").map_err(llvm)?;
    let i = e.select_int(lo, e.i64c(i64::MIN / 2), i)?;
    e.select_int(hi, e.i64c(i64::MAX / 2), i)
}

/// `x` reflected into `[lo, hi]` (`mv_gs_reflect`).
fn reflect<'ctx>(e: &Emit<'_, 'ctx>, x: FloatValue<'ctx>, lo: f64, hi: f64) -> Result<FloatValue<'ctx>> {
    let range = hi - lo;
    if range <= 0.0 {
        return Ok(f64c(e, lo));
    }
    let fsub = |a, b| e.b.build_float_sub(a, b, "").map_err(llvm);
    let fadd = |a, b| e.b.build_float_add(a, b, "").map_err(llvm);
    let fmul = |a, b| e.b.build_float_mul(a, b, "").map_err(llvm);
    let below = e.fcmp_scalar(FloatPredicate::OLT, x, f64c(e, lo))?;
    let above = e.fcmp_scalar(FloatPredicate::OGT, x, f64c(e, hi))?;
    let dx = e.select_float(below, fsub(f64c(e, lo), x)?, fsub(x, f64c(e, hi))?)?;
    let near = e.select_float(below, f64c(e, lo), f64c(e, hi))?;
    let far = e.select_float(below, f64c(e, hi), f64c(e, lo))?;
    let sign = e.select_float(below, f64c(e, 1.0), f64c(e, -1.0))?;
    let q = e.b.build_float_div(dx, f64c(e, range), "").map_err(llvm)?;
    let nf = f64_intrinsic(e, "llvm.trunc", q)?;
    let rr = fsub(dx, fmul(nf, f64c(e, range))?)?;
    // fmod(nf, 2) == 0 for the whole number nf: half of it is whole.
    let half = fmul(nf, f64c(e, 0.5))?;
    let even = e.fcmp_scalar(FloatPredicate::OEQ, f64_intrinsic(e, "llvm.floor", half)?, half)?;
    let signed = fmul(sign, rr)?;
    let out = e.select_float(even, fadd(near, signed)?, fsub(far, signed)?)?;
    let outside = e.b.build_or(below, above, "").map_err(llvm)?;
    e.select_float(outside, out, x)
}

impl GridSampleGpu {
    fn taps(&self) -> usize {
        match self.mode {
            GridMode::Nearest => 1,
            GridMode::Linear => 2,
            GridMode::Cubic => 4,
        }
    }

    fn bounds(&self, axis: usize) -> (f64, f64) {
        let len = self.len[axis] as f64;
        match self.align_corners {
            true => (0.0, len - 1.0),
            false => (-0.5, len - 0.5),
        }
    }

    /// The taps of spatial axis `axis` for the grid coordinate `gv` (f32): per tap its index
    /// (-1: a zero-padded read) and its weight.
    #[allow(clippy::type_complexity)]
    fn axis_taps<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        axis: usize,
        gv: FloatValue<'ctx>,
    ) -> Result<Vec<(IntValue<'ctx>, FloatValue<'ctx>)>> {
        let (f32t, f64t) = (e.cx.f32_type(), e.cx.f64_type());
        let fl = e.f32c(self.len[axis] as f32);
        let one = e.f32c(1.0);
        let (fadd32, fmul32) = (
            |a, b| e.b.build_float_add(a, b, "").map_err(llvm),
            |a, b| e.b.build_float_mul(a, b, "").map_err(llvm),
        );
        let fdiv32 = |a, b| e.b.build_float_div(a, b, "").map_err(llvm);
        let v32 = match self.align_corners {
            true => fmul32(
                fdiv32(fadd32(gv, one)?, e.f32c(2.0))?,
                e.b.build_float_sub(fl, one, "").map_err(llvm)?,
            )?,
            false => {
                let t =
                    e.b.build_float_sub(fmul32(fadd32(gv, one)?, fl)?, one, "")
                        .map_err(llvm)?;
                fdiv32(t, e.f32c(2.0))?
            }
        };
        let mut v = e.b.build_float_ext(v32, f64t, "").map_err(llvm)?;
        if self.mode == GridMode::Nearest {
            v = f64_intrinsic(e, "llvm.rint", v)?;
        }
        let (lo, hi) = self.bounds(axis);
        let last = self.len[axis] as i64 - 1;
        match self.padding {
            GridPadding::Zeros => {}
            GridPadding::Border => {
                // Outside [lo, hi]: clamped to [0, len - 1] (inside, the value is kept).
                let clamped = e.select_float(
                    e.fcmp_scalar(FloatPredicate::OLT, v, f64c(e, 0.0))?,
                    f64c(e, 0.0),
                    v,
                )?;
                let top = f64c(e, last as f64);
                let clamped =
                    e.select_float(e.fcmp_scalar(FloatPredicate::OGT, clamped, top)?, top, clamped)?;
                let outside = e.b.build_or(
                    e.fcmp_scalar(FloatPredicate::OLT, v, f64c(e, lo))?,
                    e.fcmp_scalar(FloatPredicate::OGT, v, f64c(e, hi))?,
                    "",
                );
                v = e.select_float(outside.map_err(llvm)?, clamped, v)?;
            }
            GridPadding::Reflection => v = reflect(e, v, lo, hi)?,
        }
        // Through f32, as the library kernel and the reference keep it.
        let v =
            e.b.build_float_ext(e.b.build_float_trunc(v, f32t, "").map_err(llvm)?, f64t, "")
                .map_err(llvm)?;
        let fsub = |a, b| e.b.build_float_sub(a, b, "").map_err(llvm);
        let fmul = |a, b| e.b.build_float_mul(a, b, "").map_err(llvm);
        let fadd = |a, b| e.b.build_float_add(a, b, "").map_err(llvm);
        let mut taps = vec![];
        match self.mode {
            GridMode::Nearest => taps.push((to_index(e, v)?, f64c(e, 1.0))),
            GridMode::Linear => {
                let x0 = f64_intrinsic(e, "llvm.floor", v)?;
                let t = fsub(v, x0)?;
                let base = to_index(e, x0)?;
                taps.push((base, fsub(f64c(e, 1.0), t)?));
                taps.push((e.addc(base, 1)?, t));
            }
            GridMode::Cubic => {
                const A: f64 = -0.75;
                let x0 = f64_intrinsic(e, "llvm.floor", v)?;
                let xx = f64_intrinsic(e, "llvm.fabs", fsub(v, x0)?)?;
                let base = to_index(e, x0)?;
                let c = |x: f64| f64c(e, x);
                // The outer taps: ((A·u - 5A)·u + 8A)·u - 4A at u = xx + 1 and u = 2 - xx.
                let outer = |u: FloatValue<'ctx>| -> Result<FloatValue<'ctx>> {
                    let p = fsub(fmul(c(A), u)?, c(5.0 * A))?;
                    let p = fadd(fmul(p, u)?, c(8.0 * A))?;
                    fsub(fmul(p, u)?, c(4.0 * A))
                };
                // The inner taps: ((A + 2)·u - (A + 3))·u·u + 1 at u = xx and u = 1 - xx.
                let inner = |u: FloatValue<'ctx>| -> Result<FloatValue<'ctx>> {
                    let p = fsub(fmul(c(A + 2.0), u)?, c(A + 3.0))?;
                    fadd(fmul(fmul(p, u)?, u)?, c(1.0))
                };
                let w = [
                    outer(fadd(xx, c(1.0))?)?,
                    inner(xx)?,
                    inner(fsub(c(1.0), xx)?)?,
                    outer(fsub(c(2.0), xx)?)?,
                ];
                for (k, wk) in w.into_iter().enumerate() {
                    taps.push((e.addc(base, k as i64 - 1)?, wk));
                }
            }
        }
        // Each tap's index through the padding mode.
        let mut out = vec![];
        for (t, w) in taps {
            let inside = e.b.build_and(
                e.icmp(IntPredicate::SGE, t, e.i64c(0))?,
                e.icmp(IntPredicate::SLE, t, e.i64c(last))?,
                "",
            );
            let t = match self.padding {
                GridPadding::Zeros => e.select_int(inside.map_err(llvm)?, t, e.i64c(-1))?,
                GridPadding::Border => e.clamp_int(t, 0, last)?,
                GridPadding::Reflection => {
                    let tf = e.b.build_signed_int_to_float(t, f64t, "").map_err(llvm)?;
                    e.clamp_int(to_index(e, reflect(e, tf, lo, hi)?)?, 0, last)?
                }
            };
            out.push((t, w));
        }
        Ok(out)
    }
}

impl KernelCommon for GridSampleGpu {
    fn describe(&self) -> String {
        format!(
            "gpu grid_sample {:?} {:?}{} N={} C={} in={:?} points={}",
            self.mode,
            self.padding,
            if self.align_corners { " align_corners" } else { "" },
            self.n,
            self.c,
            self.len,
            self.points
        )
    }
}

impl GpuKernel for GridSampleGpu {
    fn launch(&self) -> LaunchDims {
        LaunchDims::per_item((self.n * self.c * self.points) as u64, THREADS)
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let (x, grid, y) = (k.input(0)?, k.input(1)?, k.output(0)?);
        let r = self.len.len();
        let plane: usize = self.len.iter().product();
        let total = (self.n * self.c * self.points) as u64;
        k.grid_stride_loop(total, THREADS, |idx| {
            let p = e.uremc(idx, self.points as i64)?;
            let bc = e.udivc(idx, self.points as i64)?;
            let b = e.udivc(bc, self.c as i64)?;
            // Taps per spatial axis; grid component r-1-i is spatial axis i.
            let mut axes = vec![];
            for i in 0..r {
                let at = e.addc(
                    e.mulc(e.add(e.mulc(b, self.points as i64)?, p)?, r as i64)?,
                    (r - 1 - i) as i64,
                )?;
                let gv = load_real(&e, grid, self.grid_dtype, at)?;
                let gv = e.b.build_float_trunc(gv, e.cx.f32_type(), "").map_err(llvm)?;
                axes.push(self.axis_taps(&e, i, gv)?);
            }
            let pbase = e.mulc(bc, plane as i64)?;
            let mut sum = f64c(&e, 0.0);
            let combos = self.taps().pow(r as u32);
            for cb in 0..combos {
                // Tap k_i of every axis, the first axis outermost.
                let mut rem = cb;
                let mut div = combos;
                let mut flat = e.i64c(0);
                let mut w = f64c(&e, 1.0);
                let mut valid = e.cx.bool_type().const_all_ones();
                for (i, taps) in axes.iter().enumerate() {
                    div /= self.taps();
                    let (t, wk) = taps[rem / div];
                    rem %= div;
                    if self.padding == GridPadding::Zeros {
                        let ok = e.icmp(IntPredicate::SGE, t, e.i64c(0))?;
                        valid = e.b.build_and(valid, ok, "").map_err(llvm)?;
                    }
                    flat = e.add(e.mulc(flat, self.len[i] as i64)?, t)?;
                    w = e.b.build_float_mul(w, wk, "").map_err(llvm)?;
                }
                let safe = e.select_int(valid, e.add(pbase, flat)?, e.i64c(0))?;
                let xv = load_real(&e, x, self.x_dtype, safe)?;
                let term = e.b.build_float_mul(w, xv, "").map_err(llvm)?;
                let added = e.b.build_float_add(sum, term, "").map_err(llvm)?;
                sum = e.select_float(valid, added, sum)?;
            }
            store_real(&e, y, self.y_dtype, idx, sum)
        })?;
        k.ret()
    }
}

impl AffineGridGpu {
    /// The base coordinate of position `i` along an axis of `len` points (`mv_base_coord`).
    fn base_coord<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        len: usize,
        i: IntValue<'ctx>,
    ) -> Result<FloatValue<'ctx>> {
        let fi =
            e.b.build_unsigned_int_to_float(i, e.cx.f64_type(), "")
                .map_err(llvm)?;
        let (start, step) = match (self.align_corners, len) {
            (true, 1) => return Ok(f64c(e, -1.0)),
            (true, _) => (-1.0, 2.0 / (len - 1) as f64),
            (false, _) => (-1.0 + 2.0 / len as f64 / 2.0, 2.0 / len as f64),
        };
        let scaled = e.b.build_float_mul(fi, f64c(e, step), "").map_err(llvm)?;
        e.b.build_float_add(f64c(e, start), scaled, "").map_err(llvm)
    }
}

impl KernelCommon for AffineGridGpu {
    fn describe(&self) -> String {
        format!(
            "gpu affine_grid N={} out={:?}{}",
            self.n,
            self.spatial,
            if self.align_corners { " align_corners" } else { "" }
        )
    }
}

impl GpuKernel for AffineGridGpu {
    fn launch(&self) -> LaunchDims {
        let points: usize = self.spatial.iter().product();
        LaunchDims::per_item((self.n * points * self.spatial.len()) as u64, THREADS)
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let (theta, y) = (k.input(0)?, k.output(0)?);
        let r = self.spatial.len();
        let points: usize = self.spatial.iter().product();
        k.grid_stride_loop((self.n * points * r) as u64, THREADS, |idx| {
            let row = e.uremc(idx, r as i64)?;
            let p = e.uremc(e.udivc(idx, r as i64)?, points as i64)?;
            let b = e.udivc(idx, (r * points) as i64)?;
            // Coordinate component k varies along spatial axis r-1-k; the last is 1.
            let mut homo = vec![f64c(&e, 0.0); r + 1];
            let mut rem = p;
            for ax in (0..r).rev() {
                let len = self.spatial[ax];
                homo[r - 1 - ax] = self.base_coord(&e, len, e.uremc(rem, len as i64)?)?;
                rem = e.udivc(rem, len as i64)?;
            }
            homo[r] = f64c(&e, 1.0);
            let row_base = e.add(e.mulc(b, (r * (r + 1)) as i64)?, e.mulc(row, (r + 1) as i64)?)?;
            let mut s = f64c(&e, 0.0);
            for (kk, h) in homo.iter().enumerate() {
                let t = load_real(&e, theta, self.dtype, e.addc(row_base, kk as i64)?)?;
                let term = e.b.build_float_mul(t, *h, "").map_err(llvm)?;
                s = e.b.build_float_add(s, term, "").map_err(llvm)?;
            }
            store_real(&e, y, self.dtype, idx, s)
        })?;
        k.ret()
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check};
    use crate::test_rng::TestRng;
    use kiln_ir::{DType, Graph, GridMode, GridPadding, Op, Tensor, TensorType, VisionOp};

    /// GridSample of an `x_shape` input at `out` points per image, grid coordinates spread
    /// over [-2.5, 2.5] (outside the input too, some exactly on pixel centres and edges).
    fn grid_sample(
        x_shape: &[usize],
        out: &[usize],
        mode: GridMode,
        padding: GridPadding,
        align: bool,
        dtype: DType,
    ) -> (Graph, Vec<Tensor>) {
        let mut rng = TestRng::new(x_shape.iter().sum::<usize>() as u64);
        let r = x_shape.len() - 2;
        let mut gshape = vec![x_shape[0]];
        gshape.extend_from_slice(out);
        gshape.push(r);
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(dtype, x_shape));
        let grid = g.add_input("grid", TensorType::fixed(DType::F32, &gshape));
        let op = Op::Vision(VisionOp::GridSample {
            mode,
            padding,
            align_corners: align,
        });
        let y = g.add("gs", op, vec![Some(x), Some(grid)], "y").unwrap();
        g.add_output("y", y);
        let xv =
            Tensor::from_vec(x_shape.to_vec(), rng.vec_scaled(x_shape.iter().product(), 3.0)).cast(dtype);
        let n: usize = gshape.iter().product();
        let mut gv = rng.vec_scaled(n, 2.5);
        for (i, v) in gv.iter_mut().enumerate().step_by(5) {
            *v = [-1.0, 1.0, 0.0, 0.5, -2.0][i % 5];
        }
        (g, vec![xv, Tensor::from_vec(gshape, gv)])
    }

    fn check(case: (Graph, Vec<Tensor>), what: &str) {
        let kernels = check_graph(&case.0, &case.1);
        assert!(kernels.iter().all(|k| k.starts_with(what)), "{kernels:?}");
    }

    #[test]
    fn grid_sample_every_mode_and_padding() {
        for mode in [GridMode::Nearest, GridMode::Linear, GridMode::Cubic] {
            for padding in [GridPadding::Zeros, GridPadding::Border, GridPadding::Reflection] {
                for align in [false, true] {
                    check(
                        grid_sample(&[2, 3, 5, 7], &[4, 6], mode, padding, align, DType::F32),
                        "gpu grid_sample",
                    );
                }
            }
        }
    }

    #[test]
    fn grid_sample_1d_3d_and_16_bit() {
        check(
            grid_sample(
                &[1, 2, 9],
                &[11],
                GridMode::Cubic,
                GridPadding::Reflection,
                false,
                DType::F32,
            ),
            "gpu grid_sample",
        );
        check(
            grid_sample(
                &[1, 2, 3, 4, 5],
                &[2, 3, 4],
                GridMode::Linear,
                GridPadding::Zeros,
                true,
                DType::F64,
            ),
            "gpu grid_sample",
        );
        check(
            grid_sample(
                &[2, 2, 6, 6],
                &[3, 3],
                GridMode::Linear,
                GridPadding::Border,
                false,
                DType::F16,
            ),
            "gpu grid_sample",
        );
        // A one-pixel axis: reflection's range is empty.
        check(
            grid_sample(
                &[1, 1, 1, 4],
                &[2, 5],
                GridMode::Cubic,
                GridPadding::Reflection,
                true,
                DType::F32,
            ),
            "gpu grid_sample",
        );
    }

    fn affine_grid(r: usize, align: bool) -> (Graph, Vec<Tensor>) {
        let mut rng = TestRng::new(r as u64 + align as u64);
        let size: Vec<i64> = if r == 2 {
            vec![2, 3, 5, 7]
        } else {
            vec![2, 3, 4, 1, 6]
        };
        let mut g = Graph::new("t");
        let theta = g.add_input("theta", TensorType::fixed(DType::F32, &[2, r, r + 1]));
        let s = g.add_const("size", Tensor::from_vec(vec![r + 2], size));
        let y = g
            .add(
                "ag",
                Op::Vision(VisionOp::AffineGrid { align_corners: align }),
                vec![Some(theta), Some(s)],
                "y",
            )
            .unwrap();
        g.add_output("y", y);
        (
            g,
            vec![Tensor::from_vec(
                vec![2, r, r + 1],
                rng.vec_scaled(2 * r * (r + 1), 2.0),
            )],
        )
    }

    #[test]
    fn affine_grids() {
        for r in [2, 3] {
            for align in [false, true] {
                check(affine_grid(r, align), "gpu affine_grid");
            }
        }
    }

    #[test]
    fn ptx_assembles() {
        let (g, _) = grid_sample(
            &[1, 2, 4, 5, 6],
            &[2, 2, 2],
            GridMode::Cubic,
            GridPadding::Reflection,
            false,
            DType::F16,
        );
        ptxas_check(&g, 80);
        ptxas_check(&affine_grid(3, true).0, 90);
    }
}
