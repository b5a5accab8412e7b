//! The GEMM kernel's body: the task function `parallel_for` runs (one MB×NB output block of
//! one batch entry), which walks K blocks, packs run-time operands, prefetches the weights and
//! calls the register-tile functions.

use super::microkernel::TileFns;
use super::{GemmKernel, Operand};
use crate::error::Result;
use crate::gen::cdiv;
use crate::gen::conv_nhwc::PackTo;
use crate::gen::emit::Emit;
use crate::gen::{llvm, KernelBuilder};
use inkwell::values::{BasicValue, FunctionValue, IntValue, PointerValue};
use inkwell::IntPredicate;

impl GemmKernel {
    /// Emits the product at `k`'s builder position, reading its operands from `args` (laid out
    /// as a kernel's arguments: inputs, output, packed constants): a kernel's whole body, or
    /// one step of a kernel that runs a product on its own scratch buffers (`winograd`).
    pub(crate) fn emit_product<'ctx>(
        &self,
        k: &KernelBuilder<'_, 'ctx>,
        args: PointerValue<'ctx>,
    ) -> Result<()> {
        let _ = self.isa;
        let (mr, nv, lanes) = (self.tile.mr, self.tile.nv as usize, self.tile.lanes as usize);
        let row_variants = match self.m % mr {
            0 => vec![mr],
            rows => vec![mr, rows],
        };
        let col_variants = match self.n % self.tile.nr() {
            cols if cols > 0 && cols % lanes == 0 => vec![nv, cols / lanes],
            _ => vec![nv],
        };
        let mut tiles = TileFns { fns: [[None; 2]; 2] };
        for (r, &rows) in row_variants.iter().enumerate() {
            for (c, &vecs) in col_variants.iter().enumerate() {
                tiles.fns[r][c] = Some(self.emit_tile_fn(k, self.a_row_stride(), rows, vecs)?);
            }
        }
        let task = k.new_task_function("task");
        let tb = k.cx.create_builder();
        let entry = k.cx.append_basic_block(task, "entry");
        tb.position_at_end(entry);
        let e = Emit::new(k.cx, k.module, &tb, task).with_target(k.target);
        self.emit_task(&e, k, &tiles)?;
        tb.build_return(None).map_err(llvm)?;

        let me = Emit::new(k.cx, k.module, k.builder, k.function).with_target(k.target);
        let data = me.entry_alloca(me.ptr_ty().array_type(2), "taskdata")?;
        me.store(data, k.ctx())?;
        me.store(me.gep_ptr(data, 1)?, args)?;
        let batch: usize = self.batch.iter().map(|d| d.extent).product();
        let tasks = batch * self.m.div_ceil(self.mb) * self.n.div_ceil(self.nb);
        k.parallel_for(task, data, me.i64c(tasks as i64))
    }
}

/// Pointers a task reads, loaded once at its start.
pub(super) struct TaskPtrs<'ctx> {
    pub(super) a: PointerValue<'ctx>,
    pub(super) b: PointerValue<'ctx>,
    pub(super) c: PointerValue<'ctx>,
    pub(super) res: Option<PointerValue<'ctx>>,
    pub(super) brow: PointerValue<'ctx>,
    pub(super) bcol: PointerValue<'ctx>,
}

impl GemmKernel {
    fn emit_task<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        k: &KernelBuilder<'_, 'ctx>,
        tiles: &TileFns<'ctx>,
    ) -> Result<()> {
        let f = e.f;
        let data = f.get_nth_param(0).expect("task data").into_pointer_value();
        let t = f.get_nth_param(1).expect("task index").into_int_value();
        let tid = f.get_nth_param(2).expect("task tid").into_int_value();
        let ctx = e.load_ptr(data)?;
        let args = e.load_ptr(e.gep_ptr(data, 1)?)?;
        let slot = |i: usize| -> Result<PointerValue<'ctx>> { e.load_ptr(e.gep_ptr(args, i as i64)?) };
        let (m, n, kk) = (self.m as i64, self.n as i64, self.k as i64);
        let (mr, nr) = (self.tile.mr as i64, self.tile.nr() as i64);
        let (mb, nb, kc_max) = (self.mb as i64, self.nb as i64, self.kc as i64);
        let n_nb = cdiv(n, nb);
        let n_mb = cdiv(m, mb);
        let n_kb = cdiv(kk, kc_max);

        let nbi = e.uremc(t, n_nb)?;
        let t2 = e.udivc(t, n_nb)?;
        let mbi = e.uremc(t2, n_mb)?;
        let bi = e.udivc(t2, n_mb)?;
        // Batch offsets (elements) of each operand.
        let mut offs = [e.i64c(0); 4];
        let mut inner = 1i64;
        for d in self.batch.iter().rev() {
            let idx = e.uremc(e.udivc(bi, inner)?, d.extent as i64)?;
            for (o, s) in offs.iter_mut().zip([d.a, d.b, d.c, d.bias_row]) {
                if s != 0 {
                    *o = e.add(*o, e.mulc(idx, s as i64)?)?;
                }
            }
            inner *= d.extent as i64;
        }
        let [a_off, b_off, c_off, br_off] = offs;
        let null = e.ptr_ty().const_null();
        let ptrs = TaskPtrs {
            // An integer product's A is u8: its batch stride counts bytes.
            a: if self.int8.is_some() {
                e.gep_u8(slot(self.slot_of(&self.a))?, a_off)?
            } else if self.a_bf16 {
                e.gep_bf16(slot(self.slot_of(&self.a))?, a_off)?
            } else {
                e.gep_f32(slot(self.slot_of(&self.a))?, a_off)?
            },
            b: e.gep_f32(slot(self.slot_of(&self.b))?, b_off)?,
            c: if self.stores_u8() {
                e.gep_u8(slot(self.n_inputs + self.out)?, c_off)?
            } else if self.c_bf16 {
                e.gep_bf16(slot(self.n_inputs + self.out)?, c_off)?
            } else {
                e.gep_f32(slot(self.n_inputs + self.out)?, c_off)?
            },
            res: match &self.residual {
                None => None,
                Some(r @ Operand::Packed { .. }) => Some(slot(self.slot_of(r))?),
                // Bytes as C's, a dequantized skip connection's (`Residual::Skip`).
                Some(r) if self.residual_u8() => Some(e.gep_u8(slot(self.slot_of(r))?, c_off)?),
                Some(r) => Some(e.gep_f32(slot(self.slot_of(r))?, c_off)?),
            },
            brow: match (self.bias_row, self.int8) {
                (Some(s), _) => e.gep_f32(slot(self.n_inputs + 1 + s)?, br_off)?,
                // An integer product's A zero point rides in the row-bias pointer.
                (None, Some(super::Int8 { a_zero: Some(z), .. })) => slot(z)?,
                _ => null,
            },
            bcol: match self.bias_col {
                Some(s) => slot(self.n_inputs + 1 + s)?,
                None => null,
            },
        };
        let a_packed = matches!(self.a, Operand::Packed { .. });
        let b_packed = matches!(self.b, Operand::Packed { .. });
        let partials = self.c_partials_in_scratch();
        let scratch = if a_packed && b_packed && !partials {
            null
        } else {
            k.thread_scratch(e.b, ctx, tid)?
        };
        // [C partial sums] [B panels] [A panels], as `scratch()` sizes them.
        let cpart = scratch;
        let bpack = e.gep_f32c(cpart, self.c_partials_floats() as i64)?;
        let apack = if b_packed {
            bpack
        } else {
            e.gep_f32c(bpack, kc_max * cdiv(nb, nr) * nr)?
        };
        let tmp_c = e.entry_alloca(e.cx.f32_type().array_type((mr * nr) as u32), "tmpc")?;
        let tmp_r = e.entry_alloca(e.cx.f32_type().array_type((mr * nr) as u32), "tmpr")?;

        let m0 = e.mulc(mbi, mb)?;
        let n0 = e.mulc(nbi, nb)?;
        let mcnt = e.umin(e.i64c(mb), e.sub(e.i64c(m), m0)?)?;
        let ncnt = e.umin(e.i64c(nb), e.sub(e.i64c(n), n0)?)?;
        let n_mp = e.udivc(e.addc(mcnt, mr - 1)?, mr)?;
        let n_np = e.udivc(e.addc(ncnt, nr - 1)?, nr)?;

        e.for_n(n_kb, |kb| {
            let k0 = e.mulc(kb, kc_max)?;
            let kc = e.umin(e.i64c(kc_max), e.sub(e.i64c(kk), k0)?)?;
            let first = e.icmp(IntPredicate::EQ, kb, e.i64c(0))?;
            let last = e.icmp(IntPredicate::EQ, kb, e.i64c(n_kb - 1))?;
            let (a_base, a_ps) = if let (Some(int8), Operand::Im2colNhwc { .. }) = (self.int8, &self.a) {
                // u8 im2col rows of KC words; taps outside the image hold A's zero point.
                let rs = self.a_row_stride().expect("int8 rows");
                let pad = match int8.a_zero {
                    Some(z) => {
                        e.b.build_load(e.cx.i8_type(), slot(z)?, "")
                            .map_err(llvm)?
                            .into_int_value()
                    }
                    None => e.cx.i8_type().const_zero(),
                };
                e.for_range(e.i64c(0), n_mp, 1, |mp| {
                    let row = e.add(m0, e.mulc(mp, mr)?)?;
                    let dst = e.gep_f32(apack, e.mulc(mp, mr * rs)?)?;
                    self.pack_a_quads(e, dst, ptrs.a, row, k0, kc, pad)
                })?;
                (apack, e.i64c(mr * rs))
            } else if self.int8.is_some() {
                // u8 rows in place, K/4 words each; the tile reads word (i, kk) of the block.
                let off = e.add(e.mulc(m0, kk)?, k0)?;
                (e.gep_f32(ptrs.a, off)?, e.i64c(mr * kk))
            } else if let Some(rs) = self.a_in_place_bf16() {
                // bf16 rows in place, rs pairs each; the tile reads pair (i, kk) of the block.
                let off = e.add(e.mulc(m0, rs)?, k0)?;
                (e.gep_f32(ptrs.a, off)?, e.i64c(mr * rs))
            } else if self.bf16_pairs {
                let rs = self.pair_row_stride();
                let scales = match self.a_scale {
                    Some(sc) => Some(slot(sc.input)?),
                    None => None,
                };
                e.for_range(e.i64c(0), n_mp, 1, |mp| {
                    let row = e.add(m0, e.mulc(mp, mr)?)?;
                    let dst = e.gep_f32(apack, e.mulc(mp, mr * rs)?)?;
                    self.pack_a_pairs(e, dst, ptrs.a, scales, row, k0, kc)
                })?;
                (apack, e.i64c(mr * rs))
            } else if a_packed {
                let off = e.add(e.mulc(m0, kk)?, e.mulc(k0, mr)?)?;
                (e.gep_f32(ptrs.a, off)?, e.i64c(mr * kk))
            } else if let (Some(rs), Operand::Im2colNhwc { g, .. }) = (self.a_row_stride(), &self.a) {
                e.for_range(e.i64c(0), n_mp, 1, |mp| {
                    let row = e.add(m0, e.mulc(mp, mr)?)?;
                    let dst = e.gep_f32(apack, e.mulc(mp, mr * rs)?)?;
                    crate::gen::conv_nhwc::pack_a_im2col(
                        e,
                        dst,
                        ptrs.a,
                        row,
                        k0,
                        kc,
                        mr,
                        m,
                        g,
                        rs,
                        PackTo::F32,
                        self.tile.lanes,
                    )
                })?;
                (apack, e.i64c(mr * rs))
            } else if let (Some(rs), Operand::Strided { rs: a_rs, cs: 1, .. }) =
                (self.a_row_stride(), &self.a)
            {
                let rows = crate::gen::conv_nhwc::RowSource {
                    src: ptrs.a,
                    m,
                    row_stride: *a_rs as i64,
                    scale: match self.a_scale {
                        Some(sc) => Some((slot(sc.input)?, sc.rows_per_image as i64, self.k_elems as i64)),
                        None => None,
                    },
                };
                e.for_range(e.i64c(0), n_mp, 1, |mp| {
                    let row = e.add(m0, e.mulc(mp, mr)?)?;
                    let dst = e.gep_f32(apack, e.mulc(mp, mr * rs)?)?;
                    crate::gen::conv_nhwc::pack_a_rows(e, dst, &rows, row, k0, kc, mr, rs, self.tile.lanes)
                })?;
                (apack, e.i64c(mr * rs))
            } else {
                e.for_range(e.i64c(0), n_mp, 1, |mp| {
                    let row = e.add(m0, e.mulc(mp, mr)?)?;
                    let dst = e.gep_f32(apack, e.mul(e.mulc(mp, mr)?, kc)?)?;
                    self.pack_a_panel(e, dst, ptrs.a, row, k0, kc)
                })?;
                (apack, e.mulc(kc, mr)?)
            };
            let (b_base, b_ps) = if b_packed {
                // K-block major (`block_major_panels`): the block's panels are consecutive.
                let off = e.add(e.mulc(k0, self.n_padded() as i64)?, e.mul(n0, kc)?)?;
                (e.gep_f32(ptrs.b, off)?, e.mulc(kc, nr)?)
            } else {
                e.for_range(e.i64c(0), n_np, 1, |np| {
                    let col = e.add(n0, e.mulc(np, nr)?)?;
                    let dst = e.gep_f32(bpack, e.mul(e.mulc(np, nr)?, kc)?)?;
                    if self.bf16_pairs {
                        self.pack_b_pair_panel(e, dst, ptrs.b, col, k0, kc)
                    } else {
                        self.pack_b_panel(e, dst, ptrs.b, col, k0, kc)
                    }
                })?;
                (bpack, e.mulc(kc, nr)?)
            };
            e.for_range(e.i64c(0), n_np, 1, |np| {
                let bp = e.gep_f32(b_base, e.mul(np, b_ps)?)?;
                let col = e.add(n0, e.mulc(np, nr)?)?;
                let ncols = e.umin(e.i64c(nr), e.sub(e.i64c(n), col)?)?;
                let next_b = if b_packed {
                    let at = ChunkAt { np, n_np, n0, k0, kc };
                    Some(self.next_b_chunk(e, ptrs.b, bp, b_ps, &at, n_mp)?)
                } else {
                    None
                };
                e.for_range(e.i64c(0), n_mp, 1, |mp| {
                    if let Some(next) = &next_b {
                        next.prefetch_share(e, mp)?;
                    }
                    let ap = e.gep_f32(a_base, e.mul(mp, a_ps)?)?;
                    let row = e.add(m0, e.mulc(mp, mr)?)?;
                    let nrows = e.umin(e.i64c(mr), e.sub(e.i64c(m), row)?)?;
                    let coff = e.add(e.mulc(row, n)?, col)?;
                    // C's row stride where the tiles read and write it.
                    let ldc = if partials {
                        self.c_partials_stride() as i64
                    } else {
                        n
                    };
                    let cptr = if partials {
                        let at = e.add(e.mulc(e.sub(row, m0)?, ldc)?, e.sub(col, n0)?)?;
                        e.gep_f32(cpart, at)?
                    } else if self.stores_u8() {
                        e.gep_u8(ptrs.c, coff)?
                    } else if self.tiles_store_bf16() {
                        e.gep_bf16(ptrs.c, coff)?
                    } else {
                        e.gep_f32(ptrs.c, coff)?
                    };
                    let rptr = match ptrs.res {
                        Some(r) if self.residual_u8() => e.gep_u8(r, coff)?,
                        Some(r) => e.gep_f32(r, coff)?,
                        None => null,
                    };
                    let brow = if self.bias_row.is_some() {
                        e.gep_f32(ptrs.brow, row)?
                    } else {
                        ptrs.brow
                    };
                    let bcol = if self.bias_col.is_some() {
                        e.gep_f32(ptrs.bcol, col)?
                    } else {
                        null
                    };
                    let rows_full = e.icmp(IntPredicate::EQ, nrows, e.i64c(mr))?;
                    let cols_full = e.icmp(IntPredicate::EQ, ncols, e.i64c(nr))?;
                    // Only the matrix's last row panel and last column panel are cut (blocks
                    // are whole panels); a tile goes through the local copy only when its cut
                    // has no exact tile function.
                    let full = match (tiles.cut_rows(), tiles.cut_cols()) {
                        (true, true) => e.cx.bool_type().const_int(1, false),
                        (true, false) => cols_full,
                        (false, true) => rows_full,
                        (false, false) => e.b.build_and(rows_full, cols_full, "").map_err(llvm)?,
                    };
                    let call_tile = |tile_fn: FunctionValue<'ctx>,
                                     c: PointerValue<'ctx>,
                                     ldc: IntValue<'ctx>,
                                     r: PointerValue<'ctx>,
                                     ldr: IntValue<'ctx>|
                     -> Result<()> {
                        e.b.build_call(
                            tile_fn,
                            &[
                                ap.into(),
                                bp.into(),
                                kc.into(),
                                c.into(),
                                ldc.into(),
                                first.into(),
                                last.into(),
                                brow.into(),
                                bcol.into(),
                                r.into(),
                                ldr.into(),
                            ],
                            "",
                        )
                        .map_err(llvm)?;
                        Ok(())
                    };
                    // The exact tile for this panel's rows and columns, straight into C.
                    let call_exact = || -> Result<()> {
                        let by_cols = |rows_cut: bool| -> Result<()> {
                            let call = |cols_cut: bool| {
                                call_tile(tiles.get(rows_cut, cols_cut), cptr, e.i64c(ldc), rptr, e.i64c(n))
                            };
                            if tiles.cut_cols() {
                                e.if_else(cols_full, || call(false), || call(true))
                            } else {
                                call(false)
                            }
                        };
                        if tiles.cut_rows() {
                            e.if_else(rows_full, || by_cols(false), || by_cols(true))
                        } else {
                            by_cols(false)
                        }
                    };
                    e.if_else(full, call_exact, || {
                        // A column cut with no exact tile: run a tile with all columns on a
                        // local copy of the valid part.
                        // Between the local copy (row stride NR) and memory (row stride `ld`),
                        // f32 elements or bf16 ones (a C the tiles store as bf16, into the
                        // local copy too).
                        let copy = |to_tmp: bool,
                                    tmp: PointerValue<'ctx>,
                                    mem: PointerValue<'ctx>,
                                    ld: i64,
                                    bf16: bool|
                         -> Result<()> {
                            e.for_range(e.i64c(0), nrows, 1, |i| {
                                e.for_range(e.i64c(0), ncols, 1, |j| {
                                    let at_t = e.add(e.mulc(i, nr)?, j)?;
                                    let at_m = e.add(e.mulc(i, ld)?, j)?;
                                    if bf16 {
                                        let (pt, pm) = (e.gep_bf16(tmp, at_t)?, e.gep_bf16(mem, at_m)?);
                                        let (from, to) = if to_tmp { (pm, pt) } else { (pt, pm) };
                                        let v = e.b.build_load(e.cx.i16_type(), from, "").map_err(llvm)?;
                                        v.as_instruction_value()
                                            .expect("load is an instruction")
                                            .set_alignment(2)
                                            .map_err(llvm)?;
                                        let st = e.b.build_store(to, v).map_err(llvm)?;
                                        st.set_alignment(2).map_err(llvm)?;
                                        return Ok(());
                                    }
                                    let (pt, pm) = (e.gep_f32(tmp, at_t)?, e.gep_f32(mem, at_m)?);
                                    let (from, to) = if to_tmp { (pm, pt) } else { (pt, pm) };
                                    let v = e.load_f32(from)?;
                                    e.store(to, v)
                                })
                            })
                        };
                        let not_first = e.b.build_not(first, "").map_err(llvm)?;
                        e.if_then(not_first, || {
                            copy(true, tmp_c, cptr, ldc, self.tiles_store_bf16())
                        })?;
                        // A byte residual comes with byte C, whose columns always have an
                        // exact tile (`int8::stores_u8`): never here.
                        if ptrs.res.is_some() && !self.residual_u8() {
                            e.if_then(last, || copy(true, tmp_r, rptr, n, false))?;
                        }
                        // The exact rows where the row panel is cut: a full tile would read
                        // A's rows past M, which an in-place A (int8) does not have.
                        let run = |rows_cut: bool| {
                            call_tile(tiles.get(rows_cut, false), tmp_c, e.i64c(nr), tmp_r, e.i64c(nr))
                        };
                        if tiles.cut_rows() {
                            e.if_else(rows_full, || run(false), || run(true))?;
                        } else {
                            run(false)?;
                        }
                        copy(false, tmp_c, cptr, ldc, self.tiles_store_bf16())
                    })
                })
            })
        })?;
        if partials {
            // The block's results, rounded to bf16 into C.
            let stride = self.c_partials_stride() as i64;
            let lanes = self.tile.lanes;
            e.for_range(e.i64c(0), mcnt, 1, |i| {
                let from = e.gep_f32(cpart, e.mulc(i, stride)?)?;
                let to = e.gep_bf16(ptrs.c, e.add(e.mulc(e.add(m0, i)?, n)?, n0)?)?;
                e.for_masked(ncnt, lanes, |x0, mask| {
                    let v = e.masked_load(e.gep_f32(from, x0)?, mask, lanes)?;
                    let narrow = e.cx.bf16_type().vec_type(lanes);
                    let v = e.b.build_float_trunc(v, narrow, "").map_err(llvm)?;
                    e.masked_store(e.gep_bf16(to, x0)?, v, mask, 2)
                })
            })?;
        }
        Ok(())
    }

    /// The packed-B chunk this task reads `prefetch_ahead()` chunks after panel `np` of the K
    /// block at `k0`: a later panel's chunk of the same K block, or past the task's last
    /// panel, one of its chunks of the next K block. Constant weights come from memory the
    /// first time a row tile reads them; prefetching a chunk ahead (the next ones in memory,
    /// but for the jump to the next K block) while the current one serves every row panel
    /// keeps the weights ahead of the tiles, each row tile issuing an equal share of it.
    fn next_b_chunk<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        b_all: PointerValue<'ctx>,
        bp: PointerValue<'ctx>,
        b_ps: IntValue<'ctx>,
        at: &ChunkAt<'ctx>,
        n_mp: IntValue<'ctx>,
    ) -> Result<ChunkPrefetch<'ctx>> {
        let nr = self.tile.nr() as i64;
        let ahead = self.prefetch_ahead();
        let target = e.addc(at.np, ahead)?;
        let in_block = e.icmp(IntPredicate::ULT, target, at.n_np)?;
        let k_next = e.add(at.k0, at.kc)?;
        let kc_next = e.umin(e.i64c(self.kc as i64), e.sub(e.i64c(self.k as i64), k_next)?)?;
        // Plain GEPs: after the last K block the address lies past B (and is not read).
        let f32t = e.cx.f32_type();
        // SAFETY (of the IR): plain GEPs, only used as prefetch addresses.
        let same_block = unsafe { e.b.build_gep(f32t, bp, &[e.mulc(b_ps, ahead)?], "") }.map_err(llvm)?;
        // In the next K block: its panel `target - n_np` (the last one when the task has
        // fewer panels than the distance).
        let panel_next = e.umin(e.sub(target, at.n_np)?, e.addc(at.n_np, -1)?)?;
        let next_block_off = e.add(
            e.add(e.mulc(k_next, self.n_padded() as i64)?, e.mul(at.n0, kc_next)?)?,
            e.mul(e.mulc(panel_next, nr)?, kc_next)?,
        )?;
        let next_block = unsafe { e.b.build_gep(f32t, b_all, &[next_block_off], "") }.map_err(llvm)?;
        let base =
            e.b.build_select(in_block, same_block, next_block, "")
                .map_err(llvm)?
                .into_pointer_value();
        let rows =
            e.b.build_select(in_block, at.kc, kc_next, "")
                .map_err(llvm)?
                .into_int_value();
        let lines = e.udivc(e.addc(e.mulc(rows, nr * 4)?, LINE - 1)?, LINE)?;
        // A task has at least one row panel (n_mp ≥ 1).
        let share =
            e.b.build_int_unsigned_div(e.add(lines, e.addc(n_mp, -1)?)?, n_mp, "")
                .map_err(llvm)?;
        Ok(ChunkPrefetch { base, lines, share })
    }

    /// How many chunks of packed B ahead of the one in use a task prefetches: enough to cover
    /// `PREFETCH_AHEAD_BYTES` (at most 16 chunks).
    fn prefetch_ahead(&self) -> i64 {
        let chunk = self.kc * self.tile.nr() * 4;
        PREFETCH_AHEAD_BYTES.div_ceil(chunk).clamp(1, 16) as i64
    }
}

/// Cache line size in bytes.
const LINE: i64 = 64;

/// How far ahead (bytes of packed B) a task prefetches its weights into L2 (half of a 1 MiB
/// L2). The weights of ResNet-50 (49 MiB bf16, 98 MiB f32) and the encoder outgrow the L3, so
/// every run streams them from memory; one chunk ahead (48 KiB at KC = 384, the distance
/// before) left the tiles waiting on it. Measured on Zen 4, 2 threads, interleaved rounds,
/// one chunk → 512 KiB: ResNet-50 stage 4 -8 to -13% (whole model -4% bf16, -1.5 to -4.5%
/// f32), the encoder -4 to -12%, MobileNetV2 and EfficientNet-B0 -1.7% (f32); 128 and 256
/// KiB helped less, 1 MiB no more.
const PREFETCH_AHEAD_BYTES: usize = 512 << 10;

/// Where a task is in packed B: panel `np` of `n_np` from column `n0`, K block `[k0, k0+kc)`.
struct ChunkAt<'ctx> {
    np: IntValue<'ctx>,
    n_np: IntValue<'ctx>,
    n0: IntValue<'ctx>,
    k0: IntValue<'ctx>,
    kc: IntValue<'ctx>,
}

/// A chunk of packed B to prefetch, `share` lines per row tile.
struct ChunkPrefetch<'ctx> {
    base: PointerValue<'ctx>,
    lines: IntValue<'ctx>,
    share: IntValue<'ctx>,
}

impl<'ctx> ChunkPrefetch<'ctx> {
    /// Prefetches row tile `mp`'s share of the chunk.
    fn prefetch_share(&self, e: &Emit<'_, 'ctx>, mp: IntValue<'ctx>) -> Result<()> {
        let start = e.mul(mp, self.share)?;
        let end = e.umin(e.add(start, self.share)?, self.lines)?;
        e.for_range(start, end, 1, |l| e.prefetch_l2(self.base, e.mulc(l, LINE)?))
    }
}
