//! Attention on tensor cores (sm_80 and later), for the attention `attention.rs` takes when
//! Q, K and V hold bf16 values (`--precision bf16`): the same operator, masks and results, with
//! both products on `mma.sync.m16n8k16` (bf16 operands, f32 accumulation) and the softmax in
//! f32, flash-attention style: the score matrix is never stored.
//!
//! A block of `WARPS` warps takes `ROWS` query rows of one batch entry and head, 16 per warp.
//! Q's fragments are loaded once, into registers. For each tile of `TILE` keys the block
//! stages K and V in shared memory (`AttentionGpu::stage`), then
//! 1. each warp computes its 16 × `TILE` scores `Q·Kᵀ` as `mma` fragments and stores them in its
//!    slice of shared memory;
//! 2. one lane per row folds them into the online softmax (running maximum `m` and sum `l`,
//!    the masks applied as `AttentionGpu::masked_score` does for the CUDA-core kernel), writing
//!    the probabilities `p` back in place and the factor `exp(m_old − m_new)` the row's
//!    accumulator is rescaled by;
//! 3. each warp rescales its accumulator fragments and adds `P·V` by `mma`. P is split into
//!    two bf16 parts, `hi = bf16(p)` and `lo = bf16(p − hi)`, each multiplied by V (exact in
//!    bf16): the product keeps 16 of p's bits, so the result matches the f32 kernel to f32
//!    rounding instead of bf16's, at the price of a second `mma` per step.
//!
//! Finally each row is divided by its `l` (a row with no key left is zeros, as the reference).

use super::attention::{exp, parse, AttentionGpu, TILE};
use crate::error::Result;
use crate::gen::elementwise as ew;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims, MmaKind, Sreg};
use crate::target::TargetDesc;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::{FloatPredicate, IntPredicate};

/// Warps per block, 16 query rows each.
const WARPS: usize = 4;
const ROWS: usize = 16 * WARPS;
const THREADS: usize = 32 * WARPS;

#[derive(Debug)]
struct AttentionMma {
    a: AttentionGpu,
}

/// The tensor-core attention for `node`: the attention `attention.rs` takes, on bf16-valued
/// Q, K and V, head sizes multiples of 16 (Dk) and 8 (Dv), on sm_80 or later; else None.
pub fn lower(node: &NodeInfo, target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    if target.cuda_sm().is_none_or(|sm| sm < 80) {
        return Ok(None);
    }
    let Some(a) = parse(node)? else {
        return Ok(None);
    };
    if a.round_bf16 != [true; 3] || a.dk % 16 != 0 || a.dv % 8 != 0 {
        return Ok(None);
    }
    Ok(Some(Box::new(AttentionMma { a })))
}

impl KernelCommon for AttentionMma {
    fn describe(&self) -> String {
        format!("{} on tensor cores", self.a.describe())
    }
}

/// Two f32 values rounded to bf16 and packed as an `mma` register holds them (the first in
/// the low half).
fn pack_bf16<'ctx>(e: &Emit<'_, 'ctx>, lo: FloatValue<'ctx>, hi: FloatValue<'ctx>) -> Result<IntValue<'ctx>> {
    let i32t = e.cx.i32_type();
    let bits = |v: FloatValue<'ctx>| -> Result<IntValue<'ctx>> {
        let v = ew::round_bf16_one(e, v)?;
        Ok(e.b.build_bit_cast(v, i32t, "").map_err(llvm)?.into_int_value())
    };
    let lo =
        e.b.build_right_shift(bits(lo)?, i32t.const_int(16, false), false, "")
            .map_err(llvm)?;
    let hi =
        e.b.build_and(bits(hi)?, i32t.const_int(0xffff_0000, false), "")
            .map_err(llvm)?;
    e.b.build_or(lo, hi, "").map_err(llvm)
}

impl GpuKernel for AttentionMma {
    fn rounds_input_to_bf16(&self, i: usize) -> bool {
        self.a.rounds_input_to_bf16(i)
    }

    fn launch(&self) -> LaunchDims {
        let a = &self.a;
        // K and V tiles, each warp's scores, and m, l and the rescale factor per row.
        let floats = TILE * (a.dk + a.dv) + WARPS * 16 * TILE + 3 * ROWS;
        LaunchDims {
            grid: [a.sq.div_ceil(ROWS).max(1) as u32, (a.b * a.hq) as u32, 1],
            block: [THREADS as u32, 1, 1],
            shared_bytes: (floats * 4) as u32,
        }
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        self.body(k)
    }
}

impl AttentionMma {
    fn body<'ctx>(&self, k: &GpuBuilder<'_, 'ctx>) -> Result<()> {
        let a = &self.a;
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let f32t = k.cx.f32_type();
        let (dk, dv) = (a.dk, a.dv);
        let (qs, ks, vs, ys) = a.row_strides();
        let tid = k.sreg64(Sreg::TidX)?;
        let (warp, lane) = (e.udivc(tid, 32)?, e.uremc(tid, 32)?);
        let (g, tq) = (e.udivc(lane, 4)?, e.uremc(lane, 4)?);
        let block_row = e.mulc(k.sreg64(Sreg::CtaidX)?, ROWS as i64)?;
        let warp_row = e.mulc(warp, 16)?;
        let bh = k.sreg64(Sreg::CtaidY)?;
        let b = e.udivc(bh, a.hq as i64)?;
        let h = e.uremc(bh, a.hq as i64)?;
        let hk = e.udivc(h, (a.hq / a.hkv) as i64)?;
        let (q0, k0, v0, y0) = a.bases(&e, b, h, hk, bh)?;
        let (q_ptr, k_ptr, v_ptr, y_ptr) = (k.input(0)?, k.input(1)?, k.input(2)?, k.output(0)?);
        let sq = a.sq as i64;
        let keys = a.key_count(k, &e, b)?;

        let smem = k.shared()?;
        let k_sh = smem;
        let v_sh = e.gep_f32c(smem, (TILE * dk) as i64)?;
        let s_all = e.gep_f32c(smem, (TILE * (dk + dv)) as i64)?;
        let scores = e.gep_f32(s_all, e.mulc(warp, (16 * TILE) as i64)?)?;
        let stats = e.gep_f32c(s_all, (WARPS * 16 * TILE) as i64)?;
        let (m_sh, l_sh, alpha_sh) = (
            stats,
            e.gep_f32c(stats, ROWS as i64)?,
            e.gep_f32c(stats, 2 * ROWS as i64)?,
        );
        let at = |p: PointerValue<'ctx>, i: IntValue<'ctx>| e.gep_f32(p, i);
        let load =
            |p: PointerValue<'ctx>, i: IntValue<'ctx>| -> Result<FloatValue<'ctx>> { e.load_f32(at(p, i)?) };
        // Score (row, key) of this warp's 16 × TILE slice.
        let score_at =
            |row: IntValue<'ctx>, key: IntValue<'ctx>| at(scores, e.add(e.mulc(row, TILE as i64)?, key)?);

        // Q's fragments, once: rows past Sq read row 0 and are never stored.
        let q_row = |r: IntValue<'ctx>| -> Result<IntValue<'ctx>> {
            let i = e.add(e.add(block_row, warp_row)?, r)?;
            let i = e.select_int(e.icmp(IntPredicate::ULT, i, e.i64c(sq))?, i, e.i64c(0))?;
            e.add(q0, e.mulc(i, qs as i64)?)
        };
        let (row_g, row_g8) = (q_row(g)?, q_row(e.addc(g, 8)?)?);
        let q_pair = |row: IntValue<'ctx>, d: IntValue<'ctx>| -> Result<IntValue<'ctx>> {
            let at = e.add(row, d)?;
            pack_bf16(&e, load(q_ptr, at)?, load(q_ptr, e.addc(at, 1)?)?)
        };
        let mut q_frags = vec![];
        for step in 0..dk / 16 {
            let d = e.addc(e.mulc(tq, 2)?, (step * 16) as i64)?;
            let d8 = e.addc(d, 8)?;
            q_frags.push([
                q_pair(row_g, d)?,
                q_pair(row_g8, d)?,
                q_pair(row_g, d8)?,
                q_pair(row_g8, d8)?,
            ]);
        }

        // The accumulator: Dv/8 fragments of 16×8 (registers: constant indices only).
        let units = dv / 8;
        let acc = e.entry_alloca(f32t.array_type((units * 4) as u32), "acc")?;
        for q in 0..units * 4 {
            e.store(e.gep_f32c(acc, q as i64)?, f32t.const_zero())?;
        }
        let ninf = e.f32c(f32::NEG_INFINITY);
        let softmax_lane = e.icmp(IntPredicate::ULT, lane, e.i64c(16))?;
        let my_row = e.add(warp_row, lane)?;
        e.if_then(softmax_lane, || {
            e.store(at(m_sh, my_row)?, ninf)?;
            e.store(at(l_sh, my_row)?, f32t.const_zero())
        })?;

        e.for_range(e.i64c(0), keys, TILE as i64, |t0| {
            a.stage(&e, tid, k_ptr, k0, ks, dk, t0, keys, k_sh, true, THREADS)?;
            a.stage(&e, tid, v_ptr, v0, vs, dv, t0, keys, v_sh, true, THREADS)?;
            k.barrier()?;
            // 1. Scores.
            for u in 0..TILE / 8 {
                let key = e.addc(g, (u * 8) as i64)?;
                let mut c = [f32t.const_zero(); 4];
                for (step, q_frag) in q_frags.iter().enumerate() {
                    let d = e.add(
                        e.mulc(key, dk as i64)?,
                        e.addc(e.mulc(tq, 2)?, (step * 16) as i64)?,
                    )?;
                    let k_pair =
                        |d: IntValue<'ctx>| pack_bf16(&e, load(k_sh, d)?, load(k_sh, e.addc(d, 1)?)?);
                    let kb = [k_pair(d)?, k_pair(e.addc(d, 8)?)?];
                    c = k.mma(MmaKind::Bf16, *q_frag, kb, c)?;
                }
                let col = e.addc(e.mulc(tq, 2)?, (u * 8) as i64)?;
                for (q, v) in c.iter().enumerate() {
                    let row = if q < 2 { g } else { e.addc(g, 8)? };
                    e.store(score_at(row, e.addc(col, (q & 1) as i64)?)?, *v)?;
                }
            }
            k.barrier()?;
            // 2. The online softmax, a lane per row.
            e.if_then(softmax_lane, || {
                let i = e.add(block_row, my_row)?;
                let row_valid = e.icmp(IntPredicate::ULT, i, e.i64c(sq))?;
                let ic = e.select_int(row_valid, i, e.i64c(0))?;
                let mask_row = a.mask_row(&e, b, h, ic)?;
                let n = e.umin(e.sub(keys, t0)?, e.i64c(TILE as i64))?;
                let m_old = load(m_sh, my_row)?;
                let m = e.entry_alloca(f32t, "m")?;
                e.store(m, m_old)?;
                // The masked scores, -inf where a key does not count (a score never is -inf
                // otherwise: masked_score drops those keys).
                e.for_range(e.i64c(0), e.i64c(TILE as i64), 1, |j| {
                    let p = score_at(lane, j)?;
                    let raw =
                        e.b.build_float_mul(e.load_f32(p)?, e.f32c(a.scale), "")
                            .map_err(llvm)?;
                    let (s, keep) = a.masked_score(k, &e, raw, e.add(t0, j)?, i, row_valid, mask_row)?;
                    let keep =
                        e.b.build_and(keep, e.icmp(IntPredicate::ULT, j, n)?, "")
                            .map_err(llvm)?;
                    let s = e.select_float(keep, s, ninf)?;
                    e.store(p, s)?;
                    let m_now = e.load_f32(m)?;
                    let grows = e.fcmp_scalar(FloatPredicate::OGT, s, m_now)?;
                    e.store(m, e.select_float(grows, s, m_now)?)
                })?;
                let m_new = e.load_f32(m)?;
                let none_yet = e.fcmp_scalar(FloatPredicate::OEQ, m_new, ninf)?;
                let corr = exp(&e, e.b.build_float_sub(m_old, m_new, "").map_err(llvm)?)?;
                let corr = e.select_float(none_yet, e.f32c(1.0), corr)?;
                let sum = e.entry_alloca(f32t, "sum")?;
                e.store(sum, f32t.const_zero())?;
                e.for_range(e.i64c(0), e.i64c(TILE as i64), 1, |j| {
                    let p = score_at(lane, j)?;
                    let s = e.load_f32(p)?;
                    let skipped = e.fcmp_scalar(FloatPredicate::OEQ, s, ninf)?;
                    let v = exp(&e, e.b.build_float_sub(s, m_new, "").map_err(llvm)?)?;
                    let v = e.select_float(skipped, f32t.const_zero(), v)?;
                    e.store(p, v)?;
                    e.store(sum, e.b.build_float_add(e.load_f32(sum)?, v, "").map_err(llvm)?)
                })?;
                let l_old = load(l_sh, my_row)?;
                let l_new =
                    e.b.build_float_add(
                        e.b.build_float_mul(l_old, corr, "").map_err(llvm)?,
                        e.load_f32(sum)?,
                        "",
                    )
                    .map_err(llvm)?;
                e.store(at(l_sh, my_row)?, l_new)?;
                e.store(at(m_sh, my_row)?, m_new)?;
                e.store(at(alpha_sh, my_row)?, corr)
            })?;
            k.barrier()?;
            // 3. acc = acc·alpha + P·V, P as bf16 hi + lo.
            let alpha = [
                load(alpha_sh, e.add(warp_row, g)?)?,
                load(alpha_sh, e.add(warp_row, e.addc(g, 8)?)?)?,
            ];
            for q in 0..units * 4 {
                let slot = e.gep_f32c(acc, q as i64)?;
                let scaled =
                    e.b.build_float_mul(e.load_f32(slot)?, alpha[(q % 4) / 2], "")
                        .map_err(llvm)?;
                e.store(slot, scaled)?;
            }
            for step in 0..TILE / 16 {
                let key = e.addc(e.mulc(tq, 2)?, (step * 16) as i64)?;
                let p = |row: IntValue<'ctx>, key: IntValue<'ctx>| -> Result<[FloatValue<'ctx>; 2]> {
                    Ok([
                        e.load_f32(score_at(row, key)?)?,
                        e.load_f32(score_at(row, e.addc(key, 1)?)?)?,
                    ])
                };
                let g8 = e.addc(g, 8)?;
                let key8 = e.addc(key, 8)?;
                let quads = [p(g, key)?, p(g8, key)?, p(g, key8)?, p(g8, key8)?];
                let hi: Vec<[FloatValue<'ctx>; 2]> = quads
                    .iter()
                    .map(|pair| -> Result<_> {
                        Ok([ew::round_bf16_one(&e, pair[0])?, ew::round_bf16_one(&e, pair[1])?])
                    })
                    .collect::<Result<_>>()?;
                let lo: Vec<[FloatValue<'ctx>; 2]> = quads
                    .iter()
                    .zip(&hi)
                    .map(|(pair, h)| -> Result<_> {
                        Ok([
                            e.b.build_float_sub(pair[0], h[0], "").map_err(llvm)?,
                            e.b.build_float_sub(pair[1], h[1], "").map_err(llvm)?,
                        ])
                    })
                    .collect::<Result<_>>()?;
                for part in [&hi, &lo] {
                    let frag = [
                        pack_bf16(&e, part[0][0], part[0][1])?,
                        pack_bf16(&e, part[1][0], part[1][1])?,
                        pack_bf16(&e, part[2][0], part[2][1])?,
                        pack_bf16(&e, part[3][0], part[3][1])?,
                    ];
                    for u in 0..units {
                        let col = e.addc(g, (u * 8) as i64)?;
                        let v_pair = |key: IntValue<'ctx>| -> Result<IntValue<'ctx>> {
                            let at0 = e.add(e.mulc(key, dv as i64)?, col)?;
                            pack_bf16(&e, load(v_sh, at0)?, load(v_sh, e.addc(at0, dv as i64)?)?)
                        };
                        let vb = [v_pair(key)?, v_pair(key8)?];
                        let slots: Vec<PointerValue<'ctx>> = (0..4)
                            .map(|q| e.gep_f32c(acc, (u * 4 + q) as i64))
                            .collect::<Result<_>>()?;
                        let c = [
                            e.load_f32(slots[0])?,
                            e.load_f32(slots[1])?,
                            e.load_f32(slots[2])?,
                            e.load_f32(slots[3])?,
                        ];
                        let d = k.mma(MmaKind::Bf16, frag, vb, c)?;
                        for (slot, v) in slots.iter().zip(d) {
                            e.store(*slot, v)?;
                        }
                    }
                }
            }
            // The tiles and scores are written again next round.
            k.barrier()
        })?;

        // y = acc / l, rows g and g + 8 of each fragment; a row with no key is zeros.
        for (half, row) in [g, e.addc(g, 8)?].into_iter().enumerate() {
            let i = e.add(e.add(block_row, warp_row)?, row)?;
            e.if_then(e.icmp(IntPredicate::ULT, i, e.i64c(sq))?, || {
                let l = load(l_sh, e.add(warp_row, row)?)?;
                let empty = e.fcmp_scalar(FloatPredicate::OEQ, l, f32t.const_zero())?;
                let inv = e.b.build_float_div(e.f32c(1.0), l, "").map_err(llvm)?;
                let inv = e.select_float(empty, f32t.const_zero(), inv)?;
                let y_row = e.add(y0, e.mulc(i, ys as i64)?)?;
                for u in 0..units {
                    for q in 0..2 {
                        let v = e.load_f32(e.gep_f32c(acc, (u * 4 + half * 2 + q) as i64)?)?;
                        let col = e.addc(e.mulc(tq, 2)?, (u * 8 + q) as i64)?;
                        let y = e.b.build_float_mul(v, inv, "").map_err(llvm)?;
                        e.store(at(y_ptr, e.add(y_row, col)?)?, y)?;
                    }
                }
                Ok(())
            })?;
        }
        k.ret()
    }
}
