//! NonMaxSuppression on the GPU, with the library kernel's results (`kiln_uk_nms` in misc.c):
//! per batch entry and class, the boxes scoring above the threshold, highest score first and
//! the lower index on ties, each kept unless its IoU with a kept box exceeds the threshold, at
//! most `max_output_boxes_per_class`; rows `(batch, class, box)` in that order. The output's
//! extent is a count (`crate::data_dependent`): the rows come first in the bound's buffer,
//! zeros after them, and the count goes to the frame's count slots.
//!
//! A block per (batch entry, class), in rounds: the block picks the best box still alive (every
//! thread scans its share, a shared-memory tree reduces the candidates), keeps it, and every
//! thread clears the alive flag of its boxes that the kept box suppresses. That is the
//! library's greedy loop exactly: a box the pick has not suppressed is suppressed by no kept
//! box, and the pick is the first such box in score order. A class costs a round per kept box
//! (plus one) rather than a sort. Each block keeps its list in scratch; the last block to
//! finish (a ticket taken atomically after a device fence, as split-K's tile counters; reset
//! for the next run) writes every list's rows in order, their offsets a block scan of the
//! lists' counts. Coordinates compute in f32 (f64 for f64 boxes) with
//! the library's operations in its order, so the same boxes survive, boundary cases included.

use super::scalar::{load_int, load_real};
use super::select::scan;
use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::{KernelCommon, PackedConst};
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims, Sreg, EVALUE};
use crate::target::TargetDesc;
use inkwell::types::FloatType;
use inkwell::values::{BasicValue, FloatValue, IntValue, PointerValue};
use inkwell::{AtomicOrdering, AtomicRMWBinOp, FloatPredicate, IntPredicate};
use kiln_ir::{DType, Layout, Op, TensorType, VisionOp};

#[derive(Debug)]
struct NmsGpu {
    batches: i64,
    classes: i64,
    boxes: i64,
    box_dtype: DType,
    score_dtype: DType,
    center_point_box: bool,
    /// Rows the output holds (its bound).
    cap: i64,
    threads: i64,
    /// The blocks' finishing ticket: one u32, zero between runs.
    ticket: Vec<PackedConst>,
}

/// The kernel for a NonMaxSuppression of static row-major float boxes and scores, or None.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    let Op::Vision(VisionOp::NonMaxSuppression { center_point_box }) = node.op() else {
        return Ok(None);
    };
    let ok = |t: &TensorType| t.layout == Layout::RowMajor && t.is_static();
    let (Some(b), Some(s)) = (node.input_type(0), node.input_type(1)) else {
        return Ok(None);
    };
    let out = node.output_type(0);
    if !ok(b) || !ok(s) || !ok(out) || !b.dtype.is_float() || !s.dtype.is_float() || out.dtype != DType::I64 {
        return Ok(None);
    }
    let optional_ok = |i: usize, want: fn(DType) -> bool| match node.input_type(i) {
        Some(t) if node.has_input(i) => ok(t) && want(t.dtype),
        _ => true,
    };
    if !optional_ok(2, |d| matches!(d, DType::I64 | DType::I32))
        || !optional_ok(3, DType::is_float)
        || !optional_ok(4, DType::is_float)
    {
        return Ok(None);
    }
    let (bs, ss) = (node.input_shape(0)?, node.input_shape(1)?);
    if bs.len() != 3 || bs[2] != 4 || ss.len() != 3 || ss[0] != bs[0] || ss[2] != bs[1] {
        return Ok(None);
    }
    let out_len: usize = node.output_shape(0)?.iter().product();
    Ok(Some(Box::new(NmsGpu {
        batches: bs[0] as i64,
        classes: ss[1] as i64,
        boxes: bs[1] as i64,
        box_dtype: b.dtype,
        score_dtype: s.dtype,
        center_point_box: *center_point_box,
        cap: (out_len / 3) as i64,
        threads: (bs[1].next_power_of_two()).clamp(32, 256) as i64,
        ticket: vec![PackedConst { bytes: vec![0; 4] }],
    })))
}

impl KernelCommon for NmsGpu {
    fn packed_constants(&self) -> &[PackedConst] {
        &self.ticket
    }

    fn release_packed_constants(&mut self) {
        PackedConst::release_all(&mut self.ticket);
    }

    fn describe(&self) -> String {
        format!(
            "gpu nonmaxsuppression {} boxes × {} classes × {} batch (a block of {} per class)",
            self.boxes, self.classes, self.batches, self.threads
        )
    }
}

/// A box's corners along one axis, and the operations of the IoU, in the boxes' precision.
struct Geometry<'a, 'b, 'ctx> {
    e: &'a Emit<'b, 'ctx>,
    ty: FloatType<'ctx>,
    center: bool,
}

impl<'ctx> Geometry<'_, '_, 'ctx> {
    fn cmp(&self, p: FloatPredicate, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> Result<IntValue<'ctx>> {
        self.e.fcmp_scalar(p, a, b)
    }

    fn sub(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
        self.e.b.build_float_sub(a, b, "").map_err(llvm)
    }

    fn mul(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
        self.e.b.build_float_mul(a, b, "").map_err(llvm)
    }

    /// `a >= b ? a : b` and `a <= b ? a : b`, as the library writes them (NaN picks `b`).
    fn max(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
        self.e.select_float(self.cmp(FloatPredicate::OGE, a, b)?, a, b)
    }

    fn min(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
        self.e.select_float(self.cmp(FloatPredicate::OLE, a, b)?, a, b)
    }

    /// The low and high edge of box `b` (its 4 coordinates) along `axis` (0 or 1).
    fn extent(&self, b: &[FloatValue<'ctx>; 4], axis: usize) -> Result<(FloatValue<'ctx>, FloatValue<'ctx>)> {
        let (p, q) = (b[axis], b[axis + 2]);
        if self.center {
            let half = self
                .e
                .b
                .build_float_div(q, self.ty.const_float(2.0), "")
                .map_err(llvm)?;
            let lo = self.sub(p, half)?;
            let hi = self.e.b.build_float_add(p, half, "").map_err(llvm)?;
            return Ok((lo, hi));
        }
        let ordered = self.cmp(FloatPredicate::OLE, p, q)?;
        Ok((
            self.e.select_float(ordered, p, q)?,
            self.e.select_float(ordered, q, p)?,
        ))
    }

    /// Whether box `a` is suppressed by box `b`: their IoU exceeds `threshold`.
    fn suppresses(
        &self,
        a: &[FloatValue<'ctx>; 4],
        b: &[FloatValue<'ctx>; 4],
        threshold: FloatValue<'ctx>,
    ) -> Result<IntValue<'ctx>> {
        let e = self.e;
        let zero = self.ty.const_zero();
        let ((ay0, ay1), (ax0, ax1)) = (self.extent(a, 0)?, self.extent(a, 1)?);
        let ((by0, by1), (bx0, bx1)) = (self.extent(b, 0)?, self.extent(b, 1)?);
        let ix = self.sub(self.min(ax1, bx1)?, self.max(ax0, bx0)?)?;
        let iy = self.sub(self.min(ay1, by1)?, self.max(ay0, by0)?)?;
        let inter = self.mul(ix, iy)?;
        let area_a = self.mul(self.sub(ax1, ax0)?, self.sub(ay1, ay0)?)?;
        let area_b = self.mul(self.sub(bx1, bx0)?, self.sub(by1, by0)?)?;
        let sum = e.b.build_float_add(area_a, area_b, "").map_err(llvm)?;
        let union = self.sub(sum, inter)?;
        let mut none = self.cmp(FloatPredicate::OLE, ix, zero)?;
        for v in [iy, inter, area_a, area_b, union] {
            none =
                e.b.build_or(none, self.cmp(FloatPredicate::OLE, v, zero)?, "")
                    .map_err(llvm)?;
        }
        let iou = e.b.build_float_div(inter, union, "").map_err(llvm)?;
        let over = self.cmp(FloatPredicate::OGT, iou, threshold)?;
        e.b.build_and(e.b.build_not(none, "").map_err(llvm)?, over, "")
            .map_err(llvm)
    }
}

impl NmsGpu {
    fn wide(&self) -> bool {
        self.box_dtype == DType::F64
    }

    /// A value as the library holds it: f64 for f64 boxes, else rounded to f32.
    fn narrow<'ctx>(&self, e: &Emit<'_, 'ctx>, v: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
        match self.wide() {
            true => Ok(v),
            false => e.b.build_float_trunc(v, e.cx.f32_type(), "").map_err(llvm),
        }
    }

    /// Whether candidate (a, ai) comes before (b, bi): the higher score, then the lower index;
    /// an index of -1 is no candidate and comes after every one.
    fn before<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        (a, ai): (FloatValue<'ctx>, IntValue<'ctx>),
        (b, bi): (FloatValue<'ctx>, IntValue<'ctx>),
    ) -> Result<IntValue<'ctx>> {
        let higher = e.fcmp_scalar(FloatPredicate::OGT, a, b)?;
        let tie = e.b.build_and(
            e.fcmp_scalar(FloatPredicate::OEQ, a, b)?,
            e.icmp(IntPredicate::SLT, ai, bi)?,
            "",
        );
        let first = e.b.build_or(higher, tie.map_err(llvm)?, "").map_err(llvm)?;
        let a_some = e.icmp(IntPredicate::SGE, ai, e.i64c(0))?;
        let b_none = e.icmp(IntPredicate::SLT, bi, e.i64c(0))?;
        let first = e.b.build_or(first, b_none, "").map_err(llvm)?;
        e.b.build_and(a_some, first, "").map_err(llvm)
    }
}

impl GpuKernel for NmsGpu {
    fn launch(&self) -> LaunchDims {
        LaunchDims {
            grid: [self.lists() as u32, 1, 1],
            block: [self.threads as u32, 1, 1],
            // A candidate per thread, its score (f64) and index (i64); then the last-block flag.
            shared_bytes: (self.threads * 16 + 8) as u32,
        }
    }

    fn scratch_bytes(&self) -> u64 {
        // Per (batch entry, class): its kept count (i64), its kept boxes (i64 each, at most
        // every box), an alive flag per box (u8).
        let (lists, n) = (self.lists() as u64, self.boxes.max(1) as u64);
        lists * 8 + lists * n * 8 + lists * n
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        self.body(k)
    }
}

impl NmsGpu {
    /// The (batch entry, class) pairs: a block each.
    fn lists(&self) -> i64 {
        self.batches * self.classes
    }

    fn body<'ctx>(&self, k: &GpuBuilder<'_, 'ctx>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let (boxes, scores, out, scratch) = (k.input(0)?, k.input(1)?, k.output(0)?, k.scratch()?);
        let (i8t, i32t, i64t, f64t) = (k.cx.i8_type(), k.cx.i32_type(), k.cx.i64_type(), k.cx.f64_type());
        let ty = match self.wide() {
            true => f64t,
            false => k.cx.f32_type(),
        };
        let geometry = Geometry {
            e: &e,
            ty,
            center: self.center_point_box,
        };
        let (t, n, lists) = (self.threads, self.boxes, self.lists());
        let tid = k.sreg64(Sreg::TidX)?;
        let bc = k.sreg64(Sreg::CtaidX)?;
        let (b, base) = (e.udivc(bc, self.classes)?, e.mulc(bc, n)?);
        let load_i64 =
            |p| -> Result<IntValue<'ctx>> { Ok(e.b.build_load(i64t, p, "").map_err(llvm)?.into_int_value()) };
        // The scratch: kept counts, kept boxes, alive flags (see scratch_bytes).
        let kept_count = |list| -> Result<PointerValue<'ctx>> {
            // SAFETY (of the IR): list < lists.
            unsafe { e.b.build_in_bounds_gep(i64t, scratch, &[list], "") }.map_err(llvm)
        };
        let kept_box = |list, j| -> Result<PointerValue<'ctx>> {
            let at = e.add(e.i64c(lists), e.add(e.mulc(list, n)?, j)?)?;
            // SAFETY (of the IR): list < lists and j < n: inside the kept boxes.
            unsafe { e.b.build_in_bounds_gep(i64t, scratch, &[at], "") }.map_err(llvm)
        };
        let flags = e.gep_u8(scratch, e.i64c(8 * (lists + lists * n)))?;
        let flag = |i| -> Result<PointerValue<'ctx>> {
            // SAFETY (of the IR): i < n, inside this list's flags.
            unsafe { e.b.build_in_bounds_gep(i8t, flags, &[e.add(base, i)?], "") }.map_err(llvm)
        };
        // The optional scalars: absent (or empty) as the library reads them.
        let scalar_input = |i: usize| -> Result<Option<PointerValue<'ctx>>> {
            let present = k.node.has_input(i) && k.node.input_shape(i)?.iter().product::<usize>() > 0;
            present.then(|| k.input(i)).transpose()
        };
        let max_out = match scalar_input(2)? {
            Some(p) => {
                let v = load_int(&e, p, k.node.input_dtype(2).unwrap_or(DType::I64), e.i64c(0))?;
                e.select_int(e.icmp(IntPredicate::SLT, v, e.i64c(0))?, e.i64c(0), v)?
            }
            None => e.i64c(0),
        };
        let threshold = |i: usize| -> Result<Option<FloatValue<'ctx>>> {
            scalar_input(i)?
                .map(|p| {
                    let dtype = k.node.input_dtype(i).unwrap_or(DType::F32);
                    self.narrow(&e, load_real(&e, p, dtype, e.i64c(0))?)
                })
                .transpose()
        };
        let iou = threshold(3)?.unwrap_or(ty.const_zero());
        let score_threshold = threshold(4)?;
        // Scores compare as the library's: in the boxes' precision, held as f64.
        let widen = |v: FloatValue<'ctx>| -> Result<FloatValue<'ctx>> {
            match self.wide() {
                true => Ok(v),
                false => e.b.build_float_ext(v, f64t, "").map_err(llvm),
            }
        };
        let score = |i| -> Result<FloatValue<'ctx>> {
            widen(self.narrow(&e, load_real(&e, scores, self.score_dtype, e.add(base, i)?)?)?)
        };
        let corners = |i| -> Result<[FloatValue<'ctx>; 4]> {
            let at = e.mulc(e.add(e.mulc(b, n)?, i)?, 4)?;
            let mut c = [ty.const_zero(); 4];
            for (q, v) in c.iter_mut().enumerate() {
                *v = self.narrow(&e, load_real(&e, boxes, self.box_dtype, e.addc(at, q as i64)?)?)?;
            }
            Ok(c)
        };
        let is_alive = |i| -> Result<IntValue<'ctx>> {
            let v = e.b.build_load(i8t, flag(i)?, "").map_err(llvm)?.into_int_value();
            e.icmp(IntPredicate::NE, v, i8t.const_zero())
        };
        let smem = k.shared()?;
        let slot = |array: i64, ty: inkwell::types::BasicTypeEnum<'ctx>, j| -> Result<PointerValue<'ctx>> {
            // SAFETY (of the IR): j < threads, inside the shared score or index array.
            unsafe {
                e.b.build_in_bounds_gep(ty, smem, &[e.add(e.i64c(array * t), j)?], "")
            }
            .map_err(llvm)
        };
        let candidate = |j| -> Result<(FloatValue<'ctx>, IntValue<'ctx>)> {
            let s =
                e.b.build_load(f64t, slot(0, f64t.into(), j)?, "")
                    .map_err(llvm)?
                    .into_float_value();
            Ok((s, load_i64(slot(1, i64t.into(), j)?)?))
        };
        let put = |j, (s, i): (FloatValue<'ctx>, IntValue<'ctx>)| -> Result<()> {
            e.store(slot(0, f64t.into(), j)?, s)?;
            e.store(slot(1, i64t.into(), j)?, i)
        };
        let earlier =
            |a: (FloatValue<'ctx>, IntValue<'ctx>), b: (FloatValue<'ctx>, IntValue<'ctx>)| -> Result<_> {
                let take_b = self.before(&e, b, a)?;
                Ok((e.select_float(take_b, b.0, a.0)?, e.select_int(take_b, b.1, a.1)?))
            };
        let bool_t = k.cx.bool_type();
        let kept = e.entry_alloca(i64t, "kept")?;
        let done = e.entry_alloca(bool_t, "done")?;
        let best_s = e.entry_alloca(f64t, "best_score")?;
        let best_i = e.entry_alloca(i64t, "best_index")?;
        let lead = e.icmp(IntPredicate::EQ, tid, e.i64c(0))?;

        // This block's list: the candidates alive, then rounds.
        e.for_range(tid, e.i64c(n), t, |i| {
            let candidate = match score_threshold {
                Some(st) => e.fcmp_scalar(FloatPredicate::OGT, score(i)?, widen(st)?)?,
                None => bool_t.const_all_ones(),
            };
            e.store(
                flag(i)?,
                e.b.build_int_z_extend(candidate, i8t, "").map_err(llvm)?,
            )
        })?;
        k.barrier()?;
        e.store(kept, e.i64c(0))?;
        e.store(done, bool_t.const_zero())?;
        e.for_range(e.i64c(0), e.i64c(n), 1, |_| {
            let more = e.icmp(IntPredicate::SLT, load_i64(kept)?, max_out)?;
            let finished = e.b.build_load(bool_t, done, "").map_err(llvm)?.into_int_value();
            let active =
                e.b.build_and(more, e.b.build_not(finished, "").map_err(llvm)?, "")
                    .map_err(llvm)?;
            // Uniform: every thread holds the same `kept` and `done`.
            e.if_then(active, || {
                e.store(best_s, f64t.const_zero())?;
                e.store(best_i, e.i64c(-1))?;
                e.for_range(tid, e.i64c(n), t, |i| {
                    e.if_then(is_alive(i)?, || {
                        let best = e.b.build_load(f64t, best_s, "").map_err(llvm)?.into_float_value();
                        let (s, j) = earlier((best, load_i64(best_i)?), (score(i)?, i))?;
                        e.store(best_s, s)?;
                        e.store(best_i, j)
                    })
                })?;
                let best = e.b.build_load(f64t, best_s, "").map_err(llvm)?.into_float_value();
                put(tid, (best, load_i64(best_i)?))?;
                k.barrier()?;
                let mut half = t / 2;
                while half >= 1 {
                    e.if_then(e.icmp(IntPredicate::ULT, tid, e.i64c(half))?, || {
                        let other = e.addc(tid, half)?;
                        put(tid, earlier(candidate(tid)?, candidate(other)?)?)
                    })?;
                    k.barrier()?;
                    half /= 2;
                }
                let (_, pick) = candidate(e.i64c(0))?;
                let found = e.icmp(IntPredicate::SGE, pick, e.i64c(0))?;
                e.if_else(
                    found,
                    || {
                        let j = load_i64(kept)?;
                        e.if_then(lead, || e.store(kept_box(bc, j)?, pick))?;
                        e.store(kept, e.addc(j, 1)?)?;
                        let winner = corners(pick)?;
                        e.for_range(tid, e.i64c(n), t, |i| {
                            e.if_then(is_alive(i)?, || {
                                let same = e.icmp(IntPredicate::EQ, i, pick)?;
                                let gone = geometry.suppresses(&corners(i)?, &winner, iou)?;
                                e.if_then(e.b.build_or(same, gone, "").map_err(llvm)?, || {
                                    e.store(flag(i)?, i8t.const_zero())
                                })
                            })
                        })?;
                        // The flags are read, and the shared candidates written, next round.
                        k.barrier()
                    },
                    || e.store(done, bool_t.const_all_ones()),
                )
            })
        })?;
        e.if_then(lead, || e.store(kept_count(bc)?, load_i64(kept)?))?;

        // The last block to finish writes the rows of every list in order (the lists' counts
        // summed by a block scan): each block's stores fenced before its ticket, as split-K's.
        k.fence_device()?;
        k.barrier()?;
        let ticket = k.packed(0)?;
        let last_flag = e.gep_u8(smem, e.i64c(t * 16))?;
        e.if_then(lead, || {
            let before =
                e.b.build_atomicrmw(
                    AtomicRMWBinOp::Add,
                    ticket,
                    i32t.const_int(1, false),
                    AtomicOrdering::Monotonic,
                )
                .map_err(llvm)?;
            let last = e.icmp(IntPredicate::EQ, before, i32t.const_int(lists as u64 - 1, false))?;
            e.store(last_flag, e.b.build_int_z_extend(last, i64t, "").map_err(llvm)?)
        })?;
        k.barrier()?;
        let last = e.icmp(IntPredicate::NE, load_i64(last_flag)?, e.i64c(0))?;
        e.if_then(last, || {
            // The other blocks' lists: written on other SMs, so read past this SM's cache.
            k.fence_device()?;
            let volatile_i64 = |p| -> Result<IntValue<'ctx>> {
                let v = e.b.build_load(i64t, p, "").map_err(llvm)?;
                v.as_instruction_value()
                    .expect("a load")
                    .set_volatile(true)
                    .map_err(llvm)?;
                Ok(v.into_int_value())
            };
            let rows = scan(
                k,
                &e,
                t,
                lists,
                |list| volatile_i64(kept_count(list)?),
                |list, first_row, count| {
                    let (lb, lc) = (e.udivc(list, self.classes)?, e.uremc(list, self.classes)?);
                    e.for_range(e.i64c(0), count, 1, |j| {
                        let row = e.add(first_row, j)?;
                        e.if_else(
                            e.icmp(IntPredicate::SGE, row, e.i64c(self.cap))?,
                            || k.report_error(EVALUE),
                            || {
                                let picked = volatile_i64(kept_box(list, j)?)?;
                                for (q, v) in [lb, lc, picked].into_iter().enumerate() {
                                    let at = e.addc(e.mulc(row, 3)?, q as i64)?;
                                    // SAFETY (of the IR): row < cap, the output's rows.
                                    let p = unsafe { e.b.build_in_bounds_gep(i64t, out, &[at], "") }
                                        .map_err(llvm)?;
                                    e.store(p, v)?;
                                }
                                Ok(())
                            },
                        )
                    })
                },
            )?;
            // Past the count: zeros, which index the first box, class and batch entry.
            let rows = e.umin(rows, e.i64c(self.cap))?;
            e.for_range(e.add(e.mulc(rows, 3)?, tid)?, e.i64c(self.cap * 3), t, |f| {
                // SAFETY (of the IR): f < the output's length.
                let p = unsafe { e.b.build_in_bounds_gep(i64t, out, &[f], "") }.map_err(llvm)?;
                e.store(p, e.i64c(0))
            })?;
            e.if_then(lead, || {
                k.store_count(0, rows)?;
                // Ready for the next run.
                e.store(ticket, i32t.const_zero())
            })
        })?;
        k.ret()
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check};
    use kiln_ir::{DType, Graph, Op, Tensor, TensorType, VisionOp};

    /// NonMaxSuppression of run-time boxes and scores; `limits`: max boxes per class, IoU and
    /// score thresholds, each absent when None.
    fn graph(
        boxes: &Tensor,
        scores: &Tensor,
        center: bool,
        limits: (Option<i64>, Option<f32>, Option<f32>),
    ) -> Graph {
        let mut g = Graph::new("t");
        let b = g.add_input("boxes", TensorType::fixed(boxes.dtype(), boxes.shape()));
        let s = g.add_input("scores", TensorType::fixed(scores.dtype(), scores.shape()));
        let mut ins = vec![Some(b), Some(s)];
        let (max, iou, st) = limits;
        ins.push(max.map(|m| g.add_const("max", Tensor::from_vec(vec![1], vec![m]))));
        ins.push(iou.map(|v| g.add_const("iou", Tensor::from_vec(vec![1], vec![v]))));
        ins.push(st.map(|v| g.add_const("score", Tensor::from_vec(vec![1], vec![v]))));
        while ins.last() == Some(&None) {
            ins.pop();
        }
        let op = Op::Vision(VisionOp::NonMaxSuppression {
            center_point_box: center,
        });
        let y = g.add("nms", op, ins, "selected").unwrap();
        g.add_output("selected", y);
        g
    }

    /// `n` boxes per batch entry, many overlapping (clusters of near-duplicates), some
    /// with swapped corners, and scores with ties.
    fn inputs(batches: usize, classes: usize, n: usize) -> (Tensor, Tensor) {
        let mut boxes = vec![];
        for b in 0..batches {
            for i in 0..n {
                let cluster = (i % 9) as f32;
                let jitter = ((i * 7 + b * 3) % 5) as f32 * 0.02;
                let (y0, x0) = (cluster * 0.3 + jitter, (cluster * 0.7) % 2.0 + jitter);
                let (y1, x1) = (y0 + 0.5 + jitter, x0 + 0.4);
                match i % 11 {
                    4 => boxes.extend([y1, x1, y0, x0]),
                    _ => boxes.extend([y0, x0, y1, x1]),
                }
            }
        }
        let scores: Vec<f32> = (0..batches * classes * n)
            .map(|i| ((i * 37) % 23) as f32 / 23.0)
            .collect();
        (
            Tensor::from_vec(vec![batches, n, 4], boxes),
            Tensor::from_vec(vec![batches, classes, n], scores),
        )
    }

    #[test]
    fn suppresses_as_the_reference_in_both_box_formats() {
        // More boxes than the block's threads; limits that cut, thresholds that prune.
        let (boxes, scores) = inputs(2, 3, 70);
        for center in [false, true] {
            for limits in [
                (Some(5), Some(0.5), Some(0.3)),
                (Some(100), Some(0.2), None),
                (Some(3), None, Some(0.6)),
                (None, None, None),
            ] {
                let g = graph(&boxes, &scores, center, limits);
                let d = check_graph(&g, &[boxes.clone(), scores.clone()]);
                // Without a limit nothing is selected: an empty output, no kernel.
                let want = if limits.0.is_some() { 1 } else { 0 };
                assert_eq!(
                    d.iter()
                        .filter(|d| d.starts_with("gpu nonmaxsuppression"))
                        .count(),
                    want,
                    "{d:?}"
                );
            }
        }
        // f64 boxes compute in f64.
        let (b64, s64) = (boxes.cast(DType::F64), scores.cast(DType::F64));
        let g = graph(&b64, &s64, false, (Some(10), Some(0.4), Some(0.1)));
        check_graph(&g, &[b64, s64]);
        for sm in [80, 90] {
            ptxas_check(&graph(&boxes, &scores, true, (Some(5), Some(0.5), Some(0.3))), sm);
        }
    }
}
