//! Matrix-vector shaped products: a product with a side of at most [`GEMV_MAX_SIDE`] (M: a
//! classifier's rows at batch 1; N: a 1×1 convolution of a pooled vector, squeeze-and-
//! excitation) whose tiled launch would still leave the GPU mostly idle. A warp per output
//! element: its lanes stride over K (consecutive lanes on consecutive k, so a row-major A row
//! or a k-major B column is read coalesced), then the warp's first lane adds the 32 partial
//! sums in lane order (shared memory, between barriers) and applies the epilogue. The
//! operands are read as the tiled kernel reads them (`a_element`, `b_element`: bf16 rounding
//! included), so everything the tiled kernel takes, this one takes.

use super::body::{resolve, ult};
use super::{GemmGpu, THREADS};
use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::nvptx::{GpuBuilder, Sreg};
use inkwell::IntPredicate;

/// The longest side of a product the GEMV kernel takes.
pub(super) const GEMV_MAX_SIDE: usize = 8;
/// Warps of a block, each computing one output element per round.
const WARPS: usize = THREADS / 32;
/// The most blocks of a launch; more output elements take more rounds.
const MAX_BLOCKS: usize = 1 << 16;

/// The GEMV launch of a product of `outputs` elements: (blocks, rounds).
pub(super) fn launch(outputs: usize) -> (usize, usize) {
    let blocks = outputs.div_ceil(WARPS).clamp(1, MAX_BLOCKS);
    (blocks, outputs.div_ceil(blocks * WARPS))
}

impl GemmGpu {
    pub(super) fn emit_gemv<'ctx>(&self, k: &GpuBuilder<'_, 'ctx>, blocks: usize) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let (m, n, kk) = (self.m, self.n, self.k);
        let outputs = self.entries() * m * n;
        let rounds = launch(outputs).1;
        let tid = k.sreg64(Sreg::TidX)?;
        let (warp, lane) = (e.udivc(tid, 32)?, e.uremc(tid, 32)?);
        let block = k.sreg64(Sreg::CtaidX)?;
        let partials = k.shared()?;
        let a_ptr = resolve(k, self.a.slot)?;
        let acc = e.entry_alloca(k.cx.f32_type(), "acc")?;
        e.for_range(e.i64c(0), e.i64c(rounds as i64), 1, |r| {
            let o = e.add(
                e.mulc(e.add(e.mulc(r, blocks as i64)?, block)?, WARPS as i64)?,
                warp,
            )?;
            let live = ult(&e, o, outputs)?;
            // A warp past the end computes element 0 unstored, so every address stays inside.
            let o = e.select_int(live, o, e.i64c(0))?;
            let z = e.udivc(o, (m * n) as i64)?;
            let at = e.uremc(o, (m * n) as i64)?;
            let (i, j) = (e.udivc(at, n as i64)?, e.uremc(at, n as i64)?);
            let (a_off, b_off) = self.batch_offsets(&e, z)?;
            e.store(acc, e.f32c(0.0))?;
            let yes = k.cx.bool_type().const_all_ones();
            e.for_range(lane, e.i64c(kk as i64), 32, |kq| {
                let a = self.a_element(k, &e, a_ptr, a_off, (i, kq), yes)?;
                let b = self.b_element(k, &e, b_off, (kq, j), yes)?;
                let p = e.b.build_float_mul(a, b, "").map_err(llvm)?;
                e.store(acc, e.b.build_float_add(e.load_f32(acc)?, p, "").map_err(llvm)?)
            })?;
            e.store(e.gep_f32(partials, tid)?, e.load_f32(acc)?)?;
            k.barrier()?;
            let first = e.icmp(IntPredicate::EQ, lane, e.i64c(0))?;
            e.if_then(e.b.build_and(first, live, "").map_err(llvm)?, || {
                let mut sum = e.f32c(0.0);
                for l in 0..32 {
                    let v = e.load_f32(e.gep_f32(partials, e.addc(tid, l)?)?)?;
                    sum = e.b.build_float_add(sum, v, "").map_err(llvm)?;
                }
                self.finish(k, &e, z, (i, j), sum)
            })?;
            // The partials are written again next round.
            k.barrier()
        })?;
        k.ret()
    }
}
