//! Operand panels of the GEMM kernel: constants packed at compile time (`pack_a`, `pack_b`,
//! their K-block-major and bf16-pair re-layouts), and the code that packs run-time operands
//! (rows of A, im2col matrices, bf16 pair rows) into per-thread scratch as a task runs.

use super::microkernel::{bf16_pair_row, PAIRS_PER_VECTOR};
use super::{GemmKernel, Operand};
use crate::error::Result;
use crate::gen::conv_nhwc::PackTo;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::geometry::ConvWindow;
use crate::kernel::PackedConst;
use crate::node::NodeInfo;
use inkwell::types::VectorType;
use inkwell::values::{IntValue, PointerValue, VectorValue};
use inkwell::IntPredicate;

pub(crate) fn f32s<'a>(node: &'a NodeInfo, i: usize) -> Option<&'a [f32]> {
    node.known(i).and_then(|t| t.as_slice::<f32>())
}

/// Packs an `m×k` matrix (element (i,kk) at `i*rs + kk*cs`) into MR-row panels over all of K,
/// zero-padded to a multiple of MR rows.
pub(crate) fn pack_a(
    src: &[f32],
    m: usize,
    k: usize,
    rs: usize,
    cs: usize,
    mr: usize,
    scale: f32,
) -> Vec<f32> {
    let panels = m.div_ceil(mr);
    let mut out = vec![0f32; panels * mr * k];
    for p in 0..panels {
        for kk in 0..k {
            for i in 0..mr {
                let row = p * mr + i;
                if row < m {
                    out[p * mr * k + kk * mr + i] = src[row * rs + kk * cs] * scale;
                }
            }
        }
    }
    out
}

/// Packs a `k×n` matrix (element (kk,j) at `kk*rs + j*cs`) into NR-column panels over all of K.
pub(crate) fn pack_b(
    src: &[f32],
    k: usize,
    n: usize,
    rs: usize,
    cs: usize,
    nr: usize,
    scale: f32,
) -> PackedConst {
    let mut bytes = vec![];
    pack_b_into(&mut bytes, src, k, n, rs, cs, nr, scale);
    PackedConst { bytes }
}

/// [`pack_b`], appended to `out` as the little-endian bytes the kernels read (a batch of
/// matrices packs into one constant without an f32 copy of it).
#[allow(clippy::too_many_arguments)]
pub(crate) fn pack_b_into(
    out: &mut Vec<u8>,
    src: &[f32],
    k: usize,
    n: usize,
    rs: usize,
    cs: usize,
    nr: usize,
    scale: f32,
) {
    let panels = n.div_ceil(nr);
    out.reserve(panels * nr * k * 4);
    for p in 0..panels {
        for kk in 0..k {
            for j in 0..nr {
                let col = p * nr + j;
                let v = if col < n {
                    src[kk * rs + col * cs] * scale
                } else {
                    0.0
                };
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
}

/// Re-lays packed B panels `[panel][K][NR]` (4-byte elements, one panel set per batch entry)
/// out K-block major, `[K block][panel][kc][NR]` with blocks of `kc` rows (the last one
/// shorter): a task walks its panels of one K block, then the next block, so it reads B
/// front to back. Weights larger than the caches stream from memory on every run, and with
/// panel-major B each panel's block was a separate stream the hardware prefetcher had to
/// find again.
///
/// In place, by following the permutation's cycles one NR-element row at a time: a copy of a
/// large matrix (GPT-2's 154 MB LM head) would be a second one in memory while it is packed.
pub(crate) fn block_major_panels(packed: &mut PackedConst, k: usize, nr: usize, kc: usize, n_panels: usize) {
    let row = nr * 4;
    let rows = n_panels * k;
    // Where row `kk` of panel `p` goes.
    let dest = |s: usize| {
        let (p, kk) = (s / k, s % k);
        let k0 = kk / kc * kc;
        k0 * n_panels + p * kc.min(k - k0) + (kk - k0)
    };
    let mut carry = vec![0u8; row];
    for matrix in packed.bytes.chunks_exact_mut(rows * row) {
        let mut placed = vec![false; rows];
        for start in 0..rows {
            if placed[start] {
                continue;
            }
            carry.copy_from_slice(&matrix[start * row..(start + 1) * row]);
            let mut at = start;
            loop {
                let to = dest(at);
                placed[to] = true;
                matrix[to * row..(to + 1) * row].swap_with_slice(&mut carry);
                if to == start {
                    break;
                }
                at = to;
            }
        }
    }
}

/// Re-packs f32 B panels `[panel][K][NR]` as bf16 pairs `[panel][ceil(K/2)][NR]`, the operand
/// layout of `vdpbf16ps`: the 32-bit word (kp, j) holds row 2kp in its low half and row 2kp+1
/// (zero past K) in its high half. None when some value is not exactly a bf16 value (a Gemm's
/// alpha folded into the weights, say), which the pairs could not represent.
pub(crate) fn pair_panels(packed: &PackedConst, k: usize, nr: usize) -> Option<PackedConst> {
    // Read in place: a copy of a large matrix's words would be a second one in memory.
    let word = |bytes: &[u8], i: usize| {
        u32::from_le_bytes([bytes[4 * i], bytes[4 * i + 1], bytes[4 * i + 2], bytes[4 * i + 3]])
    };
    let n_words = packed.bytes.len() / 4;
    if (0..n_words).any(|i| word(&packed.bytes, i) & 0xffff != 0) || !n_words.is_multiple_of(k * nr) {
        return None;
    }
    let k2 = k.div_ceil(2);
    let mut out = Vec::with_capacity(n_words / (k * nr) * k2 * nr * 4);
    for panel in packed.bytes.chunks_exact(k * nr * 4) {
        for kp in 0..k2 {
            for j in 0..nr {
                let lo = word(panel, 2 * kp * nr + j) >> 16;
                let hi = if 2 * kp + 1 < k {
                    word(panel, (2 * kp + 1) * nr + j) & 0xffff_0000
                } else {
                    0
                };
                out.extend_from_slice(&(lo | hi).to_le_bytes());
            }
        }
    }
    Some(PackedConst { bytes: out })
}

impl GemmKernel {
    /// Packs rows `[row, row+MR)` of a channels-last convolution's im2col A (u8) into `dst` as
    /// rows of quads for the K block of `kc` quads at quad `k0`, `a_row_stride()` words per
    /// row: taps outside the image hold `pad` (A's zero point, an integer zero), K past its
    /// last element zero (its weights are zero too).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn pack_a_quads<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        dst: PointerValue<'ctx>,
        src: PointerValue<'ctx>,
        row: IntValue<'ctx>,
        k0: IntValue<'ctx>,
        kc: IntValue<'ctx>,
        pad: IntValue<'ctx>,
    ) -> Result<()> {
        let Operand::Im2colNhwc { g, .. } = self.a else {
            return Err(crate::error::CodegenError::internal(
                "u8 quad rows from a non-im2col A",
            ));
        };
        let (mr, m) = (self.tile.mr as i64, self.m as i64);
        let row_bytes = 4 * self.a_row_stride().expect("integer A has rows");
        // The block's k range in bytes; the last block may end inside a quad.
        let k0e = e.mulc(k0, 4)?;
        let kcw = e.mulc(kc, 4)?;
        let kce = e.umin(kcw, e.sub(e.i64c(self.k_elems as i64), k0e)?)?;
        crate::gen::conv_nhwc::pack_a_im2col(
            e,
            dst,
            src,
            row,
            k0e,
            kce,
            mr,
            m,
            &g,
            row_bytes,
            PackTo::U8 { pad },
            self.tile.lanes,
        )?;
        for i in 0..mr {
            let at = e.gep_u8(dst, e.addc(kce, i * row_bytes)?)?;
            e.b.build_memset(at, 1, e.cx.i8_type().const_zero(), e.sub(kcw, kce)?)
                .map_err(llvm)?;
        }
        Ok(())
    }

    /// Packs rows `[row, row+MR)` × pairs `[k0, k0+kc)` of a run-time A into `dst` as bf16
    /// pair rows (row i at `dst[i*rs..]`, `rs = pair_row_stride`), rounding to nearest even;
    /// rows past M are zero. `scales`: the base of `Epilogue::input_scale`'s scales (K per
    /// image, `self.a_scale`), which multiply a row-major A before it is rounded.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn pack_a_pairs<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        dst: PointerValue<'ctx>,
        src: PointerValue<'ctx>,
        scales: Option<PointerValue<'ctx>>,
        row: IntValue<'ctx>,
        k0: IntValue<'ctx>,
        kc: IntValue<'ctx>,
    ) -> Result<()> {
        let (mr, m, rs) = (self.tile.mr as i64, self.m as i64, self.pair_row_stride());
        // The block's k range in elements; the last block of an odd K ends on half a pair,
        // whose high half the conversion fills with zero.
        let k0e = e.mulc(k0, 2)?;
        let kce = e.umin(e.mulc(kc, 2)?, e.sub(e.i64c(self.k_elems as i64), k0e)?)?;
        match self.a {
            Operand::Im2colNhwc { g, .. } => {
                // A row of bf16 elements is a row of pairs: pack straight into it, then give
                // an odd K's last pair its zero high half.
                crate::gen::conv_nhwc::pack_a_im2col(
                    e,
                    dst,
                    src,
                    row,
                    k0e,
                    kce,
                    mr,
                    m,
                    &g,
                    2 * rs,
                    if self.a_bf16 {
                        PackTo::Bf16FromBf16
                    } else {
                        PackTo::Bf16
                    },
                    self.tile.lanes,
                )?;
                let odd = e.b.build_int_truncate(kce, e.cx.bool_type(), "").map_err(llvm)?;
                e.if_then(odd, || {
                    for i in 0..mr {
                        let row_end = PackTo::Bf16.gep(e, dst, e.addc(kce, i * 2 * rs)?)?;
                        e.store(row_end, e.cx.bf16_type().const_zero())?;
                    }
                    Ok(())
                })
            }
            Operand::Strided {
                rs: src_rs, cs: 1, ..
            } => {
                for i in 0..mr {
                    let r = e.addc(row, i)?;
                    let to = e.gep_f32c(dst, i * rs)?;
                    let valid = e.icmp(IntPredicate::ULT, r, e.i64c(m))?;
                    e.if_else(
                        valid,
                        || {
                            let from = e.gep_f32(src, e.add(e.mulc(r, src_rs as i64)?, k0e)?)?;
                            let scale = match (scales, self.a_scale) {
                                (Some(base), Some(sc)) => {
                                    let image = e.udivc(r, sc.rows_per_image as i64)?;
                                    let at = e.add(e.mulc(image, self.k_elems as i64)?, k0e)?;
                                    Some(e.gep_f32(base, at)?)
                                }
                                _ => None,
                            };
                            bf16_pair_row(e, to, from, scale, kce)
                        },
                        || {
                            let per_vector = 2 * PAIRS_PER_VECTOR as i64;
                            let vectors = e.udivc(e.addc(kce, per_vector - 1)?, per_vector)?;
                            e.for_range(e.i64c(0), vectors, 1, |x| {
                                let at = e.gep_f32(to, e.mulc(x, PAIRS_PER_VECTOR as i64)?)?;
                                e.store(at, e.zero_vec(PAIRS_PER_VECTOR as u32))
                            })
                        },
                    )?;
                }
                Ok(())
            }
            _ => Err(crate::error::CodegenError::internal(
                "bf16 pair packing needs a row-major or NHWC im2col A",
            )),
        }
    }

    /// Packs rows `[row, row+MR)` × k `[k0, k0+kc)` of a run-time A into `dst`, interleaved
    /// (zero rows past M).
    pub(super) fn pack_a_panel<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        dst: PointerValue<'ctx>,
        src: PointerValue<'ctx>,
        row: IntValue<'ctx>,
        k0: IntValue<'ctx>,
        kc: IntValue<'ctx>,
    ) -> Result<()> {
        let Operand::Strided { rs, cs, .. } = self.a else {
            return Err(crate::error::CodegenError::internal(
                "A panel packing needs a strided A",
            ));
        };
        let mr = self.tile.mr as i64;
        for i in 0..mr {
            let r = e.addc(row, i)?;
            let valid = e.icmp(IntPredicate::ULT, r, e.i64c(self.m as i64))?;
            e.if_else(
                valid,
                || {
                    let base = e.gep_f32(src, e.add(e.mulc(r, rs as i64)?, e.mulc(k0, cs as i64)?)?)?;
                    e.for_range(e.i64c(0), kc, 1, |x| {
                        let v = e.load_f32(e.gep_f32(base, e.mulc(x, cs as i64)?)?)?;
                        e.store(e.gep_f32(dst, e.addc(e.mulc(x, mr)?, i)?)?, v)
                    })
                },
                || {
                    e.for_range(e.i64c(0), kc, 1, |x| {
                        e.store(e.gep_f32(dst, e.addc(e.mulc(x, mr)?, i)?)?, e.f32c(0.0))
                    })
                },
            )?;
        }
        Ok(())
    }

    /// The NR column indices of the panel starting at `col` (i32 lanes), and which of them
    /// lie inside the matrix (`< N`).
    fn panel_columns<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        col: IntValue<'ctx>,
    ) -> Result<(VectorValue<'ctx>, VectorValue<'ctx>)> {
        let nr = self.tile.nr() as u32;
        let col32 = e.b.build_int_truncate(col, e.cx.i32_type(), "").map_err(llvm)?;
        let cols =
            e.b.build_int_add(e.iota_i32(nr), e.splat_i32(col32, nr)?, "")
                .map_err(llvm)?;
        let in_n = e.splat_i32(e.i32c(self.n as i32), nr)?;
        let valid =
            e.b.build_int_compare(IntPredicate::SLT, cols, in_n, "")
                .map_err(llvm)?;
        Ok((cols, valid))
    }

    /// Packs columns `[col, col+NR)` × k `[k0, k0+kc)` of a run-time B (or the im2col matrix of
    /// the conv input) into `dst`; columns past N are zero.
    pub(super) fn pack_b_panel<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        dst: PointerValue<'ctx>,
        src: PointerValue<'ctx>,
        col: IntValue<'ctx>,
        k0: IntValue<'ctx>,
        kc: IntValue<'ctx>,
    ) -> Result<()> {
        let nr = self.tile.nr() as u32;
        let (cols, valid) = self.panel_columns(e, col)?;
        match self.b {
            Operand::Strided { rs, cs, .. } => {
                if cs == 1 {
                    e.for_range(e.i64c(0), kc, 1, |x| {
                        let off = e.add(e.mulc(e.add(k0, x)?, rs as i64)?, col)?;
                        let v = e.masked_load(e.gep_f32(src, off)?, valid, nr)?;
                        e.store(e.gep_f32(dst, e.mulc(x, nr as i64)?)?, v)
                    })
                } else {
                    let csv = e.splat_i32(e.i32c(cs as i32), nr)?;
                    let idx = e.b.build_int_mul(cols, csv, "").map_err(llvm)?;
                    e.for_range(e.i64c(0), kc, 1, |x| {
                        let base = e.gep_f32(src, e.mulc(e.add(k0, x)?, rs as i64)?)?;
                        let v = e.masked_gather(base, idx, valid, nr)?;
                        e.store(e.gep_f32(dst, e.mulc(x, nr as i64)?)?, v)
                    })
                }
            }
            Operand::Im2col { g, .. } => self.pack_im2col(e, dst, src, col, cols, valid, k0, kc, g),
            Operand::Nibbles { block, .. } => self.unpack_nibble_panel(e, dst, src, col, k0, kc, block),
            Operand::Packed { .. } | Operand::Im2colNhwc { .. } => Err(crate::error::CodegenError::internal(
                "packed B is not packed at run time",
            )),
        }
    }

    /// Packs columns `[col, col+NR)` × pairs `[k0, k0+kc)` of a run-time B into `dst` as the
    /// pair panels `pair_panels` makes of a constant one: word (x, j) holds row 2x of column j
    /// in its low half and row 2x+1 in its high half, rounded to nearest even (the rounding the
    /// autocast's cast pair does, so the kernel may absorb it); columns past N and the row past
    /// an odd K are zero.
    pub(super) fn pack_b_pair_panel<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        dst: PointerValue<'ctx>,
        src: PointerValue<'ctx>,
        col: IntValue<'ctx>,
        k0: IntValue<'ctx>,
        kc: IntValue<'ctx>,
    ) -> Result<()> {
        let Operand::Strided { rs, cs, .. } = self.b else {
            return Err(crate::error::CodegenError::internal(
                "bf16 pair packing of B needs a strided B",
            ));
        };
        let nr = self.tile.nr() as u32;
        let i32t = e.cx.i32_type();
        let (cols, valid) = self.panel_columns(e, col)?;
        let csv = e.splat_i32(e.i32c(cs as i32), nr)?;
        let idx = e.b.build_int_mul(cols, csv, "").map_err(llvm)?;
        let none = e.cx.bool_type().vec_type(nr).const_zero();
        // Row r of the block's columns (all zero when r is past K).
        let load_row = |r: IntValue<'ctx>| -> Result<VectorValue<'ctx>> {
            let in_k = e.icmp(IntPredicate::ULT, r, e.i64c(self.k_elems as i64))?;
            let mask =
                e.b.build_select(in_k, valid, none, "")
                    .map_err(llvm)?
                    .into_vector_value();
            let at = e.gep_f32(
                src,
                e.add(e.mulc(r, rs as i64)?, if cs == 1 { col } else { e.i64c(0) })?,
            )?;
            if cs == 1 {
                e.masked_load(at, mask, nr)
            } else {
                e.masked_gather(at, idx, mask, nr)
            }
        };
        let bf16s = e.cx.bf16_type().vec_type(nr);
        let interleave: Vec<_> = (0..nr)
            .flat_map(|j| [j, nr + j])
            .map(|j| i32t.const_int(j as u64, false))
            .collect();
        let interleave = VectorType::const_vector(&interleave);
        e.for_range(e.i64c(0), kc, 1, |x| {
            let lo_row = e.mulc(e.add(k0, x)?, 2)?;
            let lo =
                e.b.build_float_trunc(load_row(lo_row)?, bf16s, "")
                    .map_err(llvm)?;
            let hi =
                e.b.build_float_trunc(load_row(e.addc(lo_row, 1)?)?, bf16s, "")
                    .map_err(llvm)?;
            let pairs = e.b.build_shuffle_vector(lo, hi, interleave, "").map_err(llvm)?;
            e.store(e.gep_f32(dst, e.mulc(x, nr as i64)?)?, pairs)
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn pack_im2col<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        dst: PointerValue<'ctx>,
        src: PointerValue<'ctx>,
        col: IntValue<'ctx>,
        cols: VectorValue<'ctx>,
        valid: VectorValue<'ctx>,
        k0: IntValue<'ctx>,
        kc: IntValue<'ctx>,
        g: ConvWindow,
    ) -> Result<()> {
        let nr = self.tile.nr() as u32;
        let b = e.b;
        let i32t = e.cx.i32_type();
        let sv = |x: i64| e.splat_i32(e.i32c(x as i32), nr);
        let oh = b
            .build_int_unsigned_div(cols, sv(g.ow as i64)?, "")
            .map_err(llvm)?;
        let ow = b
            .build_int_unsigned_rem(cols, sv(g.ow as i64)?, "")
            .map_err(llvm)?;
        let ihb = b
            .build_int_sub(
                b.build_int_mul(oh, sv(g.sh as i64)?, "").map_err(llvm)?,
                sv(g.ph as i64)?,
                "",
            )
            .map_err(llvm)?;
        let iwb = b
            .build_int_sub(
                b.build_int_mul(ow, sv(g.sw as i64)?, "").map_err(llvm)?,
                sv(g.pw as i64)?,
                "",
            )
            .map_err(llvm)?;
        // Lanes of a panel that lie in one output row read consecutive inputs when the stride
        // is 1: one masked load instead of a gather.
        let ow0 = e.uremc(col, g.ow as i64)?;
        let one_row = if g.sw == 1 {
            e.icmp(IntPredicate::ULE, e.addc(ow0, nr as i64)?, e.i64c(g.ow as i64))?
        } else {
            e.cx.bool_type().const_zero()
        };
        let khw = (g.kh * g.kw) as i64;
        let hw = (g.h * g.w) as i64;
        let ch0 = e.udivc(k0, khw)?;
        let r0 = e.uremc(k0, khw)?;
        let kh0 = e.udivc(r0, g.kw as i64)?;
        let kw0 = e.uremc(r0, g.kw as i64)?;
        let st = |name: &str, v: IntValue<'ctx>| -> Result<PointerValue<'ctx>> {
            let p = e.entry_alloca(e.cx.i64_type(), name)?;
            e.store(p, v)?;
            Ok(p)
        };
        let (pc, ph, pw) = (st("ic", ch0)?, st("ikh", kh0)?, st("ikw", kw0)?);
        let ld = |p: PointerValue<'ctx>| -> Result<IntValue<'ctx>> {
            Ok(b.build_load(e.cx.i64_type(), p, "")
                .map_err(llvm)?
                .into_int_value())
        };
        let body = |contiguous: bool| -> Result<()> {
            e.for_range(e.i64c(0), kc, 1, |x| {
                let (c, kh, kw) = (ld(pc)?, ld(ph)?, ld(pw)?);
                let dh = b
                    .build_int_truncate(e.mulc(kh, g.dh as i64)?, i32t, "")
                    .map_err(llvm)?;
                let dw = b
                    .build_int_truncate(e.mulc(kw, g.dw as i64)?, i32t, "")
                    .map_err(llvm)?;
                let ih = b.build_int_add(ihb, e.splat_i32(dh, nr)?, "").map_err(llvm)?;
                let iw = b.build_int_add(iwb, e.splat_i32(dw, nr)?, "").map_err(llvm)?;
                let okh = b
                    .build_int_compare(IntPredicate::ULT, ih, sv(g.h as i64)?, "")
                    .map_err(llvm)?;
                let okw = b
                    .build_int_compare(IntPredicate::ULT, iw, sv(g.w as i64)?, "")
                    .map_err(llvm)?;
                let mask = b
                    .build_and(b.build_and(okh, okw, "").map_err(llvm)?, valid, "")
                    .map_err(llvm)?;
                let plane = e.gep_f32(src, e.mulc(c, hw)?)?;
                let v = if contiguous {
                    // Lane 0's (ih, iw) may be out of bounds; masked lanes are not accessed, so
                    // the address only has to be formed, not read (no inbounds here).
                    let ih0 = b
                        .build_extract_element(ih, e.i32c(0), "")
                        .map_err(llvm)?
                        .into_int_value();
                    let iw0 = b
                        .build_extract_element(iw, e.i32c(0), "")
                        .map_err(llvm)?
                        .into_int_value();
                    let ih0 = b.build_int_s_extend(ih0, e.cx.i64_type(), "").map_err(llvm)?;
                    let iw0 = b.build_int_s_extend(iw0, e.cx.i64_type(), "").map_err(llvm)?;
                    let off = e.add(e.mulc(ih0, g.w as i64)?, iw0)?;
                    // SAFETY (of the IR): plain GEP, no inbounds claim for a possibly
                    // out-of-range start address.
                    let p = unsafe { b.build_gep(e.cx.f32_type(), plane, &[off], "") }.map_err(llvm)?;
                    e.masked_load(p, mask, nr)?
                } else {
                    let idx = b
                        .build_int_add(b.build_int_mul(ih, sv(g.w as i64)?, "").map_err(llvm)?, iw, "")
                        .map_err(llvm)?;
                    e.masked_gather(plane, idx, mask, nr)?
                };
                e.store(e.gep_f32(dst, e.mulc(x, nr as i64)?)?, v)?;
                // Advance (c, kh, kw).
                let kw1 = e.addc(kw, 1)?;
                let wrap_w = e.icmp(IntPredicate::EQ, kw1, e.i64c(g.kw as i64))?;
                let kh1 = e.addc(kh, 1)?;
                let wrap_h = e.icmp(IntPredicate::EQ, kh1, e.i64c(g.kh as i64))?;
                let sel =
                    |c: IntValue<'ctx>, a: IntValue<'ctx>, bb: IntValue<'ctx>| -> Result<IntValue<'ctx>> {
                        Ok(b.build_select(c, a, bb, "").map_err(llvm)?.into_int_value())
                    };
                let nkw = sel(wrap_w, e.i64c(0), kw1)?;
                let nkh = sel(wrap_w, sel(wrap_h, e.i64c(0), kh1)?, kh)?;
                let both = b.build_and(wrap_w, wrap_h, "").map_err(llvm)?;
                let nc = sel(both, e.addc(c, 1)?, c)?;
                e.store(pw, nkw)?;
                e.store(ph, nkh)?;
                e.store(pc, nc)
            })
        };
        e.if_else(one_row, || body(true), || body(false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The in-place re-layout puts every row where the definition says, for K a multiple of
    /// the block and not, one matrix and a batch of them.
    #[test]
    fn block_major_panels_matches_its_definition() {
        for (k, kc, n_panels, matrices) in [(10, 4, 3, 1), (12, 4, 5, 2), (7, 7, 2, 1), (9, 2, 1, 3)] {
            let nr = 2;
            let words: Vec<u32> = (0..(matrices * n_panels * k * nr) as u32).collect();
            let mut packed = PackedConst {
                bytes: words.iter().flat_map(|w| w.to_le_bytes()).collect(),
            };
            block_major_panels(&mut packed, k, nr, kc, n_panels);
            let mut want = vec![];
            for m in 0..matrices {
                for k0 in (0..k).step_by(kc) {
                    for p in 0..n_panels {
                        for kk in k0..(k0 + kc).min(k) {
                            for j in 0..nr {
                                want.push(words[((m * n_panels + p) * k + kk) * nr + j]);
                            }
                        }
                    }
                }
            }
            let got: Vec<u32> = packed
                .bytes
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            assert_eq!(got, want, "k={k} kc={kc} panels={n_panels} matrices={matrices}");
        }
    }
}
