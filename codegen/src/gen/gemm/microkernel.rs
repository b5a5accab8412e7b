//! The GEMM kernel's register tile: a function that multiplies an MR×NR tile over one K block
//! with FMAs (or `vdpbf16ps` on bf16 pairs, `vpdpbusd`/`sdot` on integer quads) and applies the
//! epilogue on the last block.

use super::{GemmKernel, IntDot};
use crate::error::Result;
use crate::gen::activation::activation;
use crate::gen::emit::Emit;
use crate::gen::{llvm, KernelBuilder};
use crate::kernel::epilogue::Activation;
use inkwell::values::{FunctionValue, IntValue, PointerValue, VectorValue};
use kiln_ir::DType;

/// The tile functions of one kernel: the MR×NR tile, and exact tiles for the matrix's last
/// row panel (`M % MR` rows) and last column panel (`N % NR` columns, when that is whole
/// vectors). Running the full tile on a cut panel spends MR rows of FMAs on `M % MR` rows —
/// 10% of the work of a 7x7 stage (M = 49 = 8*6 + 1), 5/6 of a matrix-vector product (M = 1,
/// the classifier heads and squeeze-excitation layers) — and copies C through a local tile.
pub(super) struct TileFns<'ctx> {
    /// `[rows cut][columns cut]`.
    pub(super) fns: [[Option<FunctionValue<'ctx>>; 2]; 2],
}

impl<'ctx> TileFns<'ctx> {
    pub(super) fn cut_rows(&self) -> bool {
        self.fns[1][0].is_some()
    }

    pub(super) fn cut_cols(&self) -> bool {
        self.fns[0][1].is_some()
    }

    pub(super) fn get(&self, rows_cut: bool, cols_cut: bool) -> FunctionValue<'ctx> {
        self.fns[usize::from(rows_cut)][usize::from(cols_cut)].expect("tile variant was emitted")
    }
}

impl GemmKernel {
    /// `void tile(a, b, kc, c, ldc, first, last, brow, bcol, res, ldr)`: one `rows` × `vecs`
    /// vectors tile (at most MR × NR) over `kc` steps of k; adds to C unless `first`; applies
    /// the epilogue when `last`. It reads and writes only those rows and columns of C and of
    /// the residual.
    ///
    /// A is read from a panel of MR rows (of which the tile uses the first `rows`): with
    /// `a_rows`, element (i, kk) at `a[i*rs + kk]`, otherwise interleaved, at `a[kk*MR + i]`.
    pub(super) fn emit_tile_fn<'ctx>(
        &self,
        k: &KernelBuilder<'_, 'ctx>,
        a_rows: Option<i64>,
        rows: usize,
        vecs: usize,
    ) -> Result<FunctionValue<'ctx>> {
        let cx = k.cx;
        let ptr = k.ptr_type();
        let i64t = cx.i64_type();
        let i1 = cx.bool_type();
        let ty = cx.void_type().fn_type(
            &[
                ptr.into(),
                ptr.into(),
                i64t.into(),
                ptr.into(),
                i64t.into(),
                i1.into(),
                i1.into(),
                ptr.into(),
                ptr.into(),
                ptr.into(),
                i64t.into(),
            ],
            false,
        );
        let name = format!("{}.tile{rows}x{vecs}", k.function.get_name().to_string_lossy());
        let f = k
            .module
            .add_function(&name, ty, Some(inkwell::module::Linkage::Internal));
        crate::llvm::set_kernel_attributes(cx, f, k.target);
        for i in [0u32, 1, 3, 7, 8, 9] {
            let noalias = inkwell::attributes::Attribute::get_named_enum_kind_id("noalias");
            f.add_attribute(
                inkwell::attributes::AttributeLoc::Param(i),
                cx.create_enum_attribute(noalias, 0),
            );
        }
        let b = cx.create_builder();
        let entry = cx.append_basic_block(f, "entry");
        b.position_at_end(entry);
        let e = Emit::new(cx, k.module, &b, f).with_target(k.target);
        let p = |i: u32| f.get_nth_param(i).expect("tile param");
        let (ap, bp, kc) = (
            p(0).into_pointer_value(),
            p(1).into_pointer_value(),
            p(2).into_int_value(),
        );
        let (cp, ldc) = (p(3).into_pointer_value(), p(4).into_int_value());
        let (first, last) = (p(5).into_int_value(), p(6).into_int_value());
        let (brow, bcol) = (p(7).into_pointer_value(), p(8).into_pointer_value());
        let (rp, ldr) = (p(9).into_pointer_value(), p(10).into_int_value());
        let (mr, nv, lanes) = (rows, vecs, self.tile.lanes);
        let nr = self.tile.nr() as i64;
        let vt = e.vty(lanes);
        let acc: Vec<PointerValue> = (0..mr * nv)
            .map(|i| e.entry_alloca(vt, &format!("acc{i}")))
            .collect::<Result<_>>()?;
        let row_ptr = |base: PointerValue<'ctx>,
                       ld: IntValue<'ctx>,
                       i: usize,
                       v: usize|
         -> Result<PointerValue<'ctx>> {
            let off = e.addc(e.mulc(ld, i as i64)?, (v as u32 * lanes) as i64)?;
            e.gep_f32(base, off)
        };
        // C holds partial sums between K blocks, except bytes and bf16 (one block then:
        // always first).
        let first = if self.stores_u8() || self.tiles_store_bf16() {
            cx.bool_type().const_int(1, false)
        } else {
            first
        };
        e.if_else(
            first,
            || {
                for a in &acc {
                    e.store(*a, e.zero_vec(lanes))?;
                }
                Ok(())
            },
            || {
                for i in 0..mr {
                    for v in 0..nv {
                        let x = e.load_vec(row_ptr(cp, ldc, i, v)?, lanes)?;
                        e.store(acc[i * nv + v], x)?;
                    }
                }
                Ok(())
            },
        )?;
        e.for_range(e.i64c(0), kc, 1, |kk| {
            let boff = e.mulc(kk, nr)?;
            let bv: Vec<VectorValue> = (0..nv)
                .map(|v| e.load_vec(e.gep_f32(bp, e.addc(boff, (v as u32 * lanes) as i64)?)?, lanes))
                .collect::<Result<_>>()?;
            let (aoff, row_stride) = match a_rows {
                Some(rs) => (kk, rs),
                None => (e.mulc(kk, self.tile.mr as i64)?, 1),
            };
            for i in 0..mr {
                let s = e.load_f32(e.gep_f32(ap, e.addc(aoff, row_stride * i as i64)?)?)?;
                let sv = e.splat(s, lanes)?;
                for v in 0..nv {
                    let cur = b
                        .build_load(vt, acc[i * nv + v], "")
                        .map_err(llvm)?
                        .into_vector_value();
                    let nx = if self.bf16_pairs {
                        dot_bf16_pairs(&e, cur, sv, bv[v])?
                    } else if let Some(int8) = self.int8 {
                        match int8.dot {
                            IntDot::Vpdpbusd => dot_u8_s8_quads(&e, cur, sv, bv[v])?,
                            IntDot::Sdot => dot_u8_as_s8_quads(&e, cur, sv, bv[v])?,
                        }
                    } else {
                        e.fma(sv, bv[v], cur)?
                    };
                    b.build_store(acc[i * nv + v], nx).map_err(llvm)?;
                }
            }
            Ok(())
        })?;
        let n_padded = (self.n + self.tile.nr()) as i64;
        let (sums_at, scales_at, int8_bias_at) = match self.int8 {
            Some(int8) => int8.rows(n_padded),
            None => (None, None, None),
        };
        if let (Some(sums_at), Some(int8)) = (sums_at, self.int8) {
            // `- za · Σ_k b[k, j]` (see `int8`): za at `brow` (0 without one), the column sums
            // at `bcol`; `sdot` read A as `a - 128`, which `za - 128` takes back (`IntDot`).
            e.if_then(last, || {
                let mut za = match int8.a_zero {
                    Some(_) => e.load_u8_as_i32(brow)?,
                    None => e.i32c(0),
                };
                if int8.dot == IntDot::Sdot {
                    za = b.build_int_sub(za, e.i32c(128), "").map_err(llvm)?;
                }
                let za = e.splat_i32(za, lanes)?;
                for v in 0..nv {
                    let sums = e.load_vec(e.gep_f32c(bcol, sums_at + (v as u32 * lanes) as i64)?, lanes)?;
                    let corr = b.build_int_mul(za, e.to_i32s(sums)?, "").map_err(llvm)?;
                    for i in 0..mr {
                        let cur = b
                            .build_load(vt, acc[i * nv + v], "")
                            .map_err(llvm)?
                            .into_vector_value();
                        let x = b.build_int_sub(e.to_i32s(cur)?, corr, "").map_err(llvm)?;
                        b.build_store(acc[i * nv + v], e.to_f32s(x)?).map_err(llvm)?;
                    }
                }
                Ok(())
            })?;
        }
        if let Some(scales_at) = scales_at {
            // The exact integer sums to f32, times each column's scale.
            e.if_then(last, || {
                for v in 0..nv {
                    let scale =
                        e.load_vec(e.gep_f32c(bcol, scales_at + (v as u32 * lanes) as i64)?, lanes)?;
                    for i in 0..mr {
                        let cur = b
                            .build_load(vt, acc[i * nv + v], "")
                            .map_err(llvm)?
                            .into_vector_value();
                        let x = b
                            .build_signed_int_to_float(e.to_i32s(cur)?, vt, "")
                            .map_err(llvm)?;
                        b.build_store(acc[i * nv + v], e.fmul(x, scale)?).map_err(llvm)?;
                    }
                }
                Ok(())
            })?;
        }
        // The column bias: an f32 product's `bias_col`, an integer one's bias row. An integer
        // product has an f32 epilogue only once dequantized.
        let col_bias_at = match self.int8 {
            Some(_) => int8_bias_at,
            None => self.bias_col.map(|_| 0),
        };
        let has_epi = self.int8.is_none_or(|i| i.dequantize)
            && !(self.scale == 1.0
                && self.bias_row.is_none()
                && col_bias_at.is_none()
                && self.residual.is_none()
                && self.activation == Activation::None
                && !self.round_bf16);
        let skip = self.int8.and_then(|i| i.skip);
        if has_epi {
            e.if_then(last, || {
                let bcolv: Vec<VectorValue> = match col_bias_at {
                    Some(at) => (0..nv)
                        .map(|v| e.load_vec(e.gep_f32c(bcol, at + (v as u32 * lanes) as i64)?, lanes))
                        .collect::<Result<_>>()?,
                    None => vec![],
                };
                for i in 0..mr {
                    let br = if self.bias_row.is_some() {
                        Some(e.splat(e.load_f32(e.gep_f32c(brow, i as i64)?)?, lanes)?)
                    } else {
                        None
                    };
                    for v in 0..nv {
                        let mut x = b
                            .build_load(vt, acc[i * nv + v], "")
                            .map_err(llvm)?
                            .into_vector_value();
                        if self.scale != 1.0 {
                            x = e.fmul(x, e.splat(e.f32c(self.scale), lanes)?)?;
                        }
                        if let Some(br) = br {
                            x = e.fadd(x, br)?;
                        }
                        if col_bias_at.is_some() {
                            x = e.fadd(x, bcolv[v])?;
                        }
                        if self.residual.is_some() && skip.is_none() {
                            x = e.fadd(x, e.load_vec(row_ptr(rp, ldr, i, v)?, lanes)?)?;
                        }
                        x = activation(&e, self.activation, x, lanes)?;
                        match skip {
                            None => {}
                            Some(None) => x = e.fadd(x, e.load_vec(row_ptr(rp, ldr, i, v)?, lanes)?)?,
                            Some(Some(dq)) => {
                                // `(q - zero_point) · scale` in f32, as DequantizeLinear.
                                let off = e.addc(e.mulc(ldr, i as i64)?, (v as u32 * lanes) as i64)?;
                                let q = e.load_u8s_as_i32s(e.gep_u8(rp, off)?, lanes)?;
                                let zero = e.splat_i32(e.i32c(i32::from(dq.zero_point)), lanes)?;
                                let q = b.build_int_sub(q, zero, "").map_err(llvm)?;
                                let q = b.build_signed_int_to_float(q, vt, "").map_err(llvm)?;
                                x = e.fadd(x, e.fmul(q, e.splat(e.f32c(dq.scale), lanes)?)?)?;
                            }
                        }
                        if self.round_bf16 {
                            x = crate::gen::elementwise::round_bf16(&e, x, lanes)?;
                        }
                        b.build_store(acc[i * nv + v], x).map_err(llvm)?;
                    }
                }
                Ok(())
            })?;
        }
        let quantize = self.int8.and_then(|i| i.quantize);
        for i in 0..mr {
            for v in 0..nv {
                let x = b.build_load(vt, acc[i * nv + v], "").map_err(llvm)?;
                match quantize {
                    None if self.tiles_store_bf16() => {
                        let off = e.addc(e.mulc(ldc, i as i64)?, (v as u32 * lanes) as i64)?;
                        e.store_as_bf16(e.gep_bf16(cp, off)?, x)?;
                    }
                    None => e.store(row_ptr(cp, ldc, i, v)?, x)?,
                    Some(q) => {
                        // One K block (`int8`), so this is the result: its bytes.
                        let scale = e.splat(e.f32c(q.scale), lanes)?;
                        let zero = e.splat_i32(e.i32c(i32::from(q.zero_point)), lanes)?;
                        let x = crate::gen::elementwise::quantize(
                            &e,
                            x.into_vector_value(),
                            scale,
                            Some(zero),
                            DType::U8,
                            lanes,
                        )?;
                        let bytes = b
                            .build_int_truncate(x, cx.i8_type().vec_type(lanes), "")
                            .map_err(llvm)?;
                        let off = e.addc(e.mulc(ldc, i as i64)?, (v as u32 * lanes) as i64)?;
                        e.store(e.gep_u8(cp, off)?, bytes)?;
                    }
                }
            }
        }
        b.build_return(None).map_err(llvm)?;
        Ok(f)
    }
}

/// 32-bit words (bf16 pairs) in one 512-bit vector.
pub(super) const PAIRS_PER_VECTOR: usize = 16;

/// `acc + a·b` over bf16 pairs: each f32 lane j of `acc` adds `a.lo·b[j].lo + a.hi·b[j].hi`
/// (`vdpbf16ps`). `a_pair` is one pair splatted to every lane, `b_pairs` 16 pairs; both
/// arrive as `<16 x float>` holding the pairs' bits.
fn dot_bf16_pairs<'ctx>(
    e: &Emit<'_, 'ctx>,
    acc: VectorValue<'ctx>,
    a_pair: VectorValue<'ctx>,
    b_pairs: VectorValue<'ctx>,
) -> Result<VectorValue<'ctx>> {
    let pairs = e.cx.bf16_type().vec_type(2 * PAIRS_PER_VECTOR as u32);
    let a = e.b.build_bit_cast(a_pair, pairs, "").map_err(llvm)?;
    let b = e.b.build_bit_cast(b_pairs, pairs, "").map_err(llvm)?;
    Ok(e.intrinsic(
        "llvm.x86.avx512bf16.dpbf16ps.512",
        &[],
        &[acc.into(), a.into(), b.into()],
    )?
    .into_vector_value())
}

/// `acc + a·b` over u8×s8 quads: each i32 lane j of `acc` adds the four products of a's
/// bytes (unsigned) with b[j]'s bytes (signed) (`vpdpbusd`). `a_quad` is one quad splatted to
/// every lane, `b_quads` 16 quads; all three arrive as `<16 x float>` holding the bits.
fn dot_u8_s8_quads<'ctx>(
    e: &Emit<'_, 'ctx>,
    acc: VectorValue<'ctx>,
    a_quad: VectorValue<'ctx>,
    b_quads: VectorValue<'ctx>,
) -> Result<VectorValue<'ctx>> {
    let (acc, a, b) = (e.to_i32s(acc)?, e.to_i32s(a_quad)?, e.to_i32s(b_quads)?);
    let sum = e
        .intrinsic(
            "llvm.x86.avx512.vpdpbusd.512",
            &[],
            &[acc.into(), a.into(), b.into()],
        )?
        .into_vector_value();
    e.to_f32s(sum)
}

/// `acc + (a - 128)·b` over s8×s8 quads (`sdot`): `a_quad`, one quad of u8 splatted to every
/// lane, has its top bits flipped to read as `a - 128`; each i32 lane j of `acc` adds the four
/// products with b[j]'s bytes. All three arrive as `<lanes x float>` holding the bits.
fn dot_u8_as_s8_quads<'ctx>(
    e: &Emit<'_, 'ctx>,
    acc: VectorValue<'ctx>,
    a_quad: VectorValue<'ctx>,
    b_quads: VectorValue<'ctx>,
) -> Result<VectorValue<'ctx>> {
    let lanes = acc.get_type().get_size();
    let flip = e.splat_i32(e.i32c(0x8080_8080_u32 as i32), lanes)?;
    let a = e.b.build_xor(e.to_i32s(a_quad)?, flip, "").map_err(llvm)?;
    let bytes = e.cx.i8_type().vec_type(4 * lanes);
    let a = e.b.build_bit_cast(a, bytes, "").map_err(llvm)?;
    let b = e.b.build_bit_cast(e.to_i32s(b_quads)?, bytes, "").map_err(llvm)?;
    let acc = e.to_i32s(acc)?;
    let sum = e
        .intrinsic(
            "llvm.aarch64.neon.sdot",
            &[acc.get_type().into(), bytes.into()],
            &[acc.into(), a.into(), b.into()],
        )?
        .into_vector_value();
    e.to_f32s(sum)
}

/// Converts `n` f32 at `src` to bf16 (round to nearest even, as `vcvtneps2bf16`: exact for
/// the bf16 values the pair kernels take) at `dst`, 32 at a time; the last vector's lanes
/// past `n` are zero, so an odd `n` ends on a pair whose high half is zero. Writes whole
/// 64-byte vectors. With `scale`, each value is first multiplied by `scale[x]` (in f32, as
/// the Mul it stands for), then rounded.
pub(super) fn bf16_pair_row<'ctx>(
    e: &Emit<'_, 'ctx>,
    dst: PointerValue<'ctx>,
    src: PointerValue<'ctx>,
    scale: Option<PointerValue<'ctx>>,
    n: IntValue<'ctx>,
) -> Result<()> {
    let lanes = 2 * PAIRS_PER_VECTOR as u32;
    e.for_masked(n, lanes, |x0, mask| {
        let mut v = e.masked_load(e.gep_f32(src, x0)?, mask, lanes)?;
        if let Some(scale) = scale {
            let w = e.masked_load(e.gep_f32(scale, x0)?, mask, lanes)?;
            v = e.b.build_float_mul(v, w, "").map_err(llvm)?;
        }
        let bf =
            e.b.build_float_trunc(v, e.cx.bf16_type().vec_type(lanes), "")
                .map_err(llvm)?;
        // x0 elements are x0 / 2 pairs.
        e.store(e.gep_f32(dst, e.udivc(x0, 2)?)?, bf)
    })
}
