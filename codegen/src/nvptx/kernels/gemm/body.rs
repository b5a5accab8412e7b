//! The tiled GEMM kernel's body: staging A and B slices in shared memory, the FMA micro-tile
//! or the tensor-core `mma` fragments, and the epilogue as results are stored.

use super::{BSrc, Epi, GemmGpu, Slot, Tile, BK, THREADS, TX, TY};
use crate::error::Result;
use crate::gen::elementwise as ew;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::epilogue::Activation;
use crate::kernel::{KernelCommon, PackedConst};
use crate::nvptx::kernel::tf32_round;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims, MmaKind, Sreg};
use inkwell::values::{BasicValue, FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;
use kiln_ir::DType;

pub(super) fn resolve<'ctx>(k: &GpuBuilder<'_, 'ctx>, s: Slot) -> Result<PointerValue<'ctx>> {
    match s {
        Slot::Input(i) => k.input(i),
        Slot::Packed(i) => k.packed(i),
    }
}

pub(super) fn and<'ctx>(e: &Emit<'_, 'ctx>, a: IntValue<'ctx>, b: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
    e.b.build_and(a, b, "").map_err(llvm)
}

pub(super) fn ult<'ctx>(e: &Emit<'_, 'ctx>, a: IntValue<'ctx>, n: usize) -> Result<IntValue<'ctx>> {
    e.icmp(IntPredicate::ULT, a, e.i64c(n as i64))
}

/// Element `idx` of `p`, a tensor of `elem` (f32, f16 or bf16) values, as f32.
pub(super) fn load_elem<'ctx>(
    k: &GpuBuilder<'_, 'ctx>,
    e: &Emit<'_, 'ctx>,
    elem: DType,
    p: PointerValue<'ctx>,
    idx: IntValue<'ctx>,
) -> Result<FloatValue<'ctx>> {
    match elem {
        DType::F16 => {}
        DType::BF16 => return Ok(ew::load_one(e, p, elem, idx)?.into_float_value()),
        _ => return e.load_f32(e.gep_f32(p, idx)?),
    }
    let i16t = k.cx.i16_type();
    // SAFETY: the callers' indices lie inside the tensor.
    let at = unsafe { e.b.build_gep(i16t, p, &[idx], "") }.map_err(llvm)?;
    let bits = e.b.build_load(i16t, at, "").map_err(llvm)?.into_int_value();
    k.f16_to_f32(bits)
}

/// Stores `v` as element `idx` of `p`, a tensor of `elem` values (rounded to nearest even for
/// f16 and bf16).
pub(super) fn store_elem<'ctx>(
    k: &GpuBuilder<'_, 'ctx>,
    e: &Emit<'_, 'ctx>,
    elem: DType,
    p: PointerValue<'ctx>,
    idx: IntValue<'ctx>,
    v: FloatValue<'ctx>,
) -> Result<()> {
    match elem {
        DType::F16 => {}
        DType::BF16 => return ew::store_one(e, p, elem, idx, ew::round_bf16_one(e, v)?.into()),
        _ => return e.store(e.gep_f32(p, idx)?, v),
    }
    let i16t = k.cx.i16_type();
    // SAFETY: as for load_elem.
    let at = unsafe { e.b.build_gep(i16t, p, &[idx], "") }.map_err(llvm)?;
    e.store(at, k.f32_to_f16(v)?)
}

/// The element type `slot` holds in a kernel over `elem` tensors: packed constants are f32.
pub(super) fn slot_elem(slot: Slot, elem: DType) -> DType {
    match slot {
        Slot::Input(_) => elem,
        Slot::Packed(_) => DType::F32,
    }
}

/// `valid ? p[idx] : 0`, never reading outside the buffer (an invalid lane reads element 0).
pub(super) fn guarded_load<'ctx>(
    k: &GpuBuilder<'_, 'ctx>,
    e: &Emit<'_, 'ctx>,
    elem: DType,
    p: PointerValue<'ctx>,
    idx: IntValue<'ctx>,
    valid: IntValue<'ctx>,
) -> Result<FloatValue<'ctx>> {
    let safe = e.select_int(valid, idx, e.i64c(0))?;
    let v = load_elem(k, e, elem, p, safe)?;
    Ok(e.b
        .build_select(valid, v, e.f32c(0.0), "")
        .map_err(llvm)?
        .into_float_value())
}

/// Applies `act` to a scalar (the CPU kernels' polynomials on a one-lane vector).
pub(super) fn activate<'ctx>(
    e: &Emit<'_, 'ctx>,
    act: Activation,
    x: FloatValue<'ctx>,
) -> Result<FloatValue<'ctx>> {
    if act == Activation::None {
        return Ok(x);
    }
    let v = e.splat(x, 1)?;
    let y = crate::gen::activation::activation(e, act, v, 1)?;
    Ok(e.b
        .build_extract_element(y, e.i32c(0), "")
        .map_err(llvm)?
        .into_float_value())
}

impl Epi {
    /// `act(alpha·acc + bias[bias_idx] + scale·residual[res_idx])`, reading run-time tensors
    /// of `elem`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn apply<'ctx>(
        &self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        elem: DType,
        acc: FloatValue<'ctx>,
        bias_idx: (IntValue<'ctx>, IntValue<'ctx>),
        res_idx: impl FnOnce(usize, usize, usize) -> Result<IntValue<'ctx>>,
    ) -> Result<FloatValue<'ctx>> {
        let b = e.b;
        let mut v = acc;
        if self.alpha != 1.0 {
            v = b.build_float_mul(v, e.f32c(self.alpha), "").map_err(llvm)?;
        }
        if let Some((slot, per_row)) = self.bias {
            let idx = if per_row { bias_idx.0 } else { bias_idx.1 };
            let x = load_elem(k, e, slot_elem(slot, elem), resolve(k, slot)?, idx)?;
            v = b.build_float_add(v, x, "").map_err(llvm)?;
        }
        if let Some((slot, zs, rs, cs, scale)) = self.residual {
            let idx = res_idx(zs, rs, cs)?;
            let mut x = load_elem(k, e, slot_elem(slot, elem), resolve(k, slot)?, idx)?;
            if scale != 1.0 {
                x = b.build_float_mul(x, e.f32c(scale), "").map_err(llvm)?;
            }
            v = b.build_float_add(v, x, "").map_err(llvm)?;
        }
        activate(e, self.activation, v)
    }
}

/// How the block's 8 warps share a tile on tensor cores. The tile is a grid of 16×8 `mma`
/// units (`bm/16` by `bn/8`); with 8 or more units each warp takes `per_warp` consecutive units
/// of one unit row (so one A fragment serves them all), with fewer (16×16, 16×32, 32×16 tiles)
/// warp `w` computes unit `w mod units` and only the first `units` warps store.
pub(super) struct WarpTiles<'ctx> {
    tile: Tile,
    kind: MmaKind,
    per_warp: usize,
    /// Unit row and first unit column of this warp.
    unit_row: IntValue<'ctx>,
    unit_col: IntValue<'ctx>,
    /// `lane / 4` and `lane % 4`: the fragment coordinates of PTX's layout.
    group: IntValue<'ctx>,
    in_group: IntValue<'ctx>,
    /// Whether this warp's results are stored (false for a duplicate of another warp's unit).
    owner: IntValue<'ctx>,
}

impl<'ctx> WarpTiles<'ctx> {
    pub(super) fn new(
        e: &Emit<'_, 'ctx>,
        t: Tile,
        kind: MmaKind,
        tid: IntValue<'ctx>,
    ) -> Result<WarpTiles<'ctx>> {
        let (units_n, units) = (t.bn / 8, (t.bm / 16) * (t.bn / 8));
        let warp = e.udivc(tid, 32)?;
        let lane = e.uremc(tid, 32)?;
        let warps = THREADS / 32;
        let (per_warp, first, owner) = if units >= warps {
            (
                units / warps,
                e.mulc(warp, (units / warps) as i64)?,
                ult(e, warp, warps)?,
            )
        } else {
            (1, e.uremc(warp, units as i64)?, ult(e, warp, units)?)
        };
        Ok(WarpTiles {
            tile: t,
            kind,
            per_warp,
            unit_row: e.udivc(first, units_n as i64)?,
            unit_col: e.uremc(first, units_n as i64)?,
            group: e.udivc(lane, 4)?,
            in_group: e.uremc(lane, 4)?,
            owner,
        })
    }

    /// Two values as one 32-bit register of `self.kind`, `lo` in the low half. The values are
    /// of that type already (the kernel is chosen for such operands; f16 tensors are widened
    /// exactly as they are staged), so the narrowing is exact.
    pub(super) fn pack(
        &self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        lo: FloatValue<'ctx>,
        hi: FloatValue<'ctx>,
    ) -> Result<IntValue<'ctx>> {
        let i32t = e.cx.i32_type();
        let sixteen = i32t.const_int(16, false);
        match self.kind {
            MmaKind::Bf16 => {
                // A bf16 is the upper half of its f32.
                let bits = |v: FloatValue<'ctx>| -> Result<IntValue<'ctx>> {
                    Ok(e.b.build_bit_cast(v, i32t, "").map_err(llvm)?.into_int_value())
                };
                let lo =
                    e.b.build_right_shift(bits(lo)?, sixteen, false, "")
                        .map_err(llvm)?;
                let hi =
                    e.b.build_and(bits(hi)?, i32t.const_int(0xffff_0000, false), "")
                        .map_err(llvm)?;
                e.b.build_or(lo, hi, "").map_err(llvm)
            }
            MmaKind::F16 => {
                let bits = |v: FloatValue<'ctx>| -> Result<IntValue<'ctx>> {
                    e.b.build_int_z_extend(k.f32_to_f16(v)?, i32t, "").map_err(llvm)
                };
                let hi = e.b.build_left_shift(bits(hi)?, sixteen, "").map_err(llvm)?;
                e.b.build_or(bits(lo)?, hi, "").map_err(llvm)
            }
            MmaKind::Tf32 => unreachable!("a tf32 register holds one value (`single`)"),
        }
    }

    /// Element `(k, x)` of a k-major f32 shared slice with row stride `stride`, rounded to
    /// TF32 as one register.
    fn single(
        &self,
        e: &Emit<'_, 'ctx>,
        sh: PointerValue<'ctx>,
        stride: usize,
        k: IntValue<'ctx>,
        x: IntValue<'ctx>,
    ) -> Result<IntValue<'ctx>> {
        let at = e.add(e.mulc(k, stride as i64)?, x)?;
        tf32_round(e, e.load_f32(e.gep_f32(sh, at)?)?)
    }

    /// Reads two consecutive-k elements `(k, x)` and `(k + 1, x)` of a k-major shared slice
    /// with row stride `stride`, as one packed register.
    pub(super) fn pair(
        &self,
        kb: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        sh: PointerValue<'ctx>,
        stride: usize,
        k: IntValue<'ctx>,
        x: IntValue<'ctx>,
    ) -> Result<IntValue<'ctx>> {
        let at = e.add(e.mulc(k, stride as i64)?, x)?;
        let lo = e.load_f32(e.gep_f32(sh, at)?)?;
        let hi = e.load_f32(e.gep_f32(sh, e.addc(at, stride as i64)?)?)?;
        self.pack(kb, e, lo, hi)
    }

    /// One K step (BK = 16: one `mma` k16, or two tf32 k8) of this warp's units: A and B
    /// fragments from the shared slices (both k-major), then an `mma` per unit into the
    /// accumulators.
    pub(super) fn multiply(
        &self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        a_sh: PointerValue<'ctx>,
        b_sh: PointerValue<'ctx>,
        acc: PointerValue<'ctx>,
    ) -> Result<()> {
        if self.kind == MmaKind::Tf32 {
            return self.multiply_tf32(k, e, a_sh, b_sh, acc);
        }
        let (sa, sb) = (self.tile.sa(), self.tile.sb());
        let k_lo = e.mulc(self.in_group, 2)?;
        let k_hi = e.addc(k_lo, 8)?;
        let row = e.add(e.mulc(self.unit_row, 16)?, self.group)?;
        let row8 = e.addc(row, 8)?;
        // a0a1: (g, 2t), a2a3: (g + 8, 2t), a4a5: (g, 2t + 8), a6a7: (g + 8, 2t + 8).
        let a = [
            self.pair(k, e, a_sh, sa, k_lo, row)?,
            self.pair(k, e, a_sh, sa, k_lo, row8)?,
            self.pair(k, e, a_sh, sa, k_hi, row)?,
            self.pair(k, e, a_sh, sa, k_hi, row8)?,
        ];
        for u in 0..self.per_warp {
            // b0b1: (2t, g), b2b3: (2t + 8, g) of the unit's 16×8 B.
            let col = e.add(e.mulc(e.addc(self.unit_col, u as i64)?, 8)?, self.group)?;
            let b = [
                self.pair(k, e, b_sh, sb, k_lo, col)?,
                self.pair(k, e, b_sh, sb, k_hi, col)?,
            ];
            self.accumulate(k, e, acc, u, a, b)?;
        }
        Ok(())
    }

    /// [`Self::multiply`] on TF32: the K step as two `mma.m16n8k8`, each with the fragments
    /// a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4) of the unit row's 16×8 A and
    /// b0 (t, g), b1 (t + 4, g) of the unit's 8×8 B, every value rounded to TF32.
    fn multiply_tf32(
        &self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        a_sh: PointerValue<'ctx>,
        b_sh: PointerValue<'ctx>,
        acc: PointerValue<'ctx>,
    ) -> Result<()> {
        let (sa, sb) = (self.tile.sa(), self.tile.sb());
        let row = e.add(e.mulc(self.unit_row, 16)?, self.group)?;
        let row8 = e.addc(row, 8)?;
        for half in [0, 8] {
            let k_lo = e.addc(self.in_group, half)?;
            let k_hi = e.addc(k_lo, 4)?;
            let a = [
                self.single(e, a_sh, sa, k_lo, row)?,
                self.single(e, a_sh, sa, k_lo, row8)?,
                self.single(e, a_sh, sa, k_hi, row)?,
                self.single(e, a_sh, sa, k_hi, row8)?,
            ];
            for u in 0..self.per_warp {
                let col = e.add(e.mulc(e.addc(self.unit_col, u as i64)?, 8)?, self.group)?;
                let b = [
                    self.single(e, b_sh, sb, k_lo, col)?,
                    self.single(e, b_sh, sb, k_hi, col)?,
                ];
                self.accumulate(k, e, acc, u, a, b)?;
            }
        }
        Ok(())
    }

    /// `acc[u] += a·b` by one `mma` of this warp's kind for unit `u`.
    fn accumulate(
        &self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        acc: PointerValue<'ctx>,
        u: usize,
        a: [IntValue<'ctx>; 4],
        b: [IntValue<'ctx>; 2],
    ) -> Result<()> {
        let slot = |q: usize| e.gep_f32c(acc, (u * 4 + q) as i64);
        let c = [
            e.load_f32(slot(0)?)?,
            e.load_f32(slot(1)?)?,
            e.load_f32(slot(2)?)?,
            e.load_f32(slot(3)?)?,
        ];
        let d = k.mma(self.kind, a, b, c)?;
        for (q, v) in d.iter().enumerate() {
            e.store(slot(q)?, *v)?;
        }
        Ok(())
    }

    /// The tile coordinates (row, column) of accumulator `q` (0..4) of unit `u`: c0c1 at
    /// (g, 2t..2t+1), c2c3 at (g + 8, 2t..2t+1) of the unit.
    pub(super) fn element(
        &self,
        e: &Emit<'_, 'ctx>,
        u: usize,
        q: usize,
    ) -> Result<(IntValue<'ctx>, IntValue<'ctx>)> {
        let row = e.addc(
            e.add(e.mulc(self.unit_row, 16)?, self.group)?,
            if q >= 2 { 8 } else { 0 },
        )?;
        let col = e.addc(
            e.add(
                e.mulc(e.addc(self.unit_col, u as i64)?, 8)?,
                e.mulc(self.in_group, 2)?,
            )?,
            (q & 1) as i64,
        )?;
        Ok((row, col))
    }
}

impl KernelCommon for GemmGpu {
    fn describe(&self) -> String {
        self.what.clone()
    }

    fn packed_constants(&self) -> &[PackedConst] {
        &self.packed
    }

    fn release_packed_constants(&mut self) {
        PackedConst::release_all(&mut self.packed)
    }

    fn reads_input(&self, i: usize) -> bool {
        !self.unread.contains(&i)
    }
}

impl GemmGpu {
    /// Whether the kernel runs bf16 tensor cores on f32 tensors (bf16 autocast): it then
    /// rounds every operand to bf16 as it stages it, which leaves bf16 values (the autocast's
    /// pairs, the rounded weights) as they are and lets it read the f32 value behind a
    /// `Cast<f32>(Cast<bf16>(x))` itself (`rounds_input_to_bf16`).
    fn rounds_bf16(&self) -> bool {
        self.tile.mma == Some(MmaKind::Bf16) && self.elem == DType::F32
    }

    /// `v` as staged in shared memory: rounded to bf16 when [`Self::rounds_bf16`].
    fn staged<'ctx>(&self, e: &Emit<'_, 'ctx>, v: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
        match self.rounds_bf16() {
            true => ew::round_bf16_one(e, v),
            false => Ok(v),
        }
    }
}

impl GpuKernel for GemmGpu {
    fn launch(&self) -> LaunchDims {
        if self.gemv {
            return self.gemv_launch();
        }
        let split = self.split_k.map_or(1, |s| s.split);
        LaunchDims {
            grid: [
                self.n.div_ceil(self.tile.bn) as u32,
                self.m.div_ceil(self.tile.bm) as u32,
                (self.entries() * split) as u32,
            ],
            block: [THREADS as u32, 1, 1],
            // Split-K's "last block" flag after the slices.
            shared_bytes: (self.tile.shared_bytes() + if split > 1 { 16 } else { 0 }) as u32,
        }
    }

    fn rounds_input_to_bf16(&self, i: usize) -> bool {
        let operand = match self.b {
            BSrc::Mat(b) => b.slot == Slot::Input(i),
            BSrc::Im2col(ic) => ic.input == i,
        };
        self.rounds_bf16() && (self.a.slot == Slot::Input(i) || operand)
    }

    fn scratch_bytes(&self) -> u64 {
        // Split-K's partial tiles: slice-major, then batch entry, row, column.
        self.split_k
            .map_or(0, |s| (s.split * self.entries() * self.m * self.n * 4) as u64)
    }

    fn emit<'ctx>(&self, k: &GpuBuilder<'_, 'ctx>) -> Result<()> {
        if self.gemv {
            return self.emit_gemv(k);
        }
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let f32t = k.cx.f32_type();
        let t = self.tile;
        let (bm, bn, tm, tn, sa, sb) = (t.bm, t.bn, t.tm(), t.tn(), t.sa(), t.sb());
        let tid = k.sreg64(Sreg::TidX)?;
        let col0 = e.mulc(k.sreg64(Sreg::CtaidX)?, bn as i64)?;
        let row0 = e.mulc(k.sreg64(Sreg::CtaidY)?, bm as i64)?;
        // Batch entry z and, with split-K, K slice s: grid.z is entry·split + slice.
        let zs = k.sreg64(Sreg::CtaidZ)?;
        let split = self.split_k.map_or(1, |s| s.split);
        let (z, slice) = if split > 1 {
            (e.udivc(zs, split as i64)?, e.uremc(zs, split as i64)?)
        } else {
            (zs, e.i64c(0))
        };
        let (a_off, b_off) = self.batch_offsets(&e, z)?;
        let smem = k.shared()?;
        let a_sh = smem;
        let b_sh = e.gep_f32c(smem, (BK * sa) as i64)?;
        let tx = e.uremc(tid, TX as i64)?;
        let ty = e.udivc(tid, TX as i64)?;
        let warps = if let Some(kind) = t.mma {
            Some(WarpTiles::new(&e, t, kind, tid)?)
        } else {
            None
        };
        let n_acc = warps.as_ref().map_or(tm * tn, |w| w.per_warp * 4);
        let acc = e.entry_alloca(f32t.array_type(n_acc as u32), "acc")?;
        let acc_at = |r: usize, c: usize| e.gep_f32c(acc, (r * tn + c) as i64);
        for i in 0..n_acc {
            e.store(e.gep_f32c(acc, i as i64)?, f32t.const_zero())?;
        }
        let a_ptr = resolve(k, self.a.slot)?;
        let (m, n, kk) = (self.m, self.n, self.k);
        let (k_begin, k_end) = match self.split_k {
            Some(sk) => {
                let begin = e.mulc(slice, sk.slice as i64)?;
                (begin, e.umin(e.addc(begin, sk.slice as i64)?, e.i64c(kk as i64))?)
            }
            None => (e.i64c(0), e.i64c(kk as i64)),
        };
        e.for_range(k_begin, k_end, BK as i64, |k0| {
            // A slice: bm×BK elements, THREADS at a time, along A's contiguous axis.
            let a_k_fast = self.a.cs == 1 || self.a.rs != 1;
            for l in 0..(bm * BK) / THREADS {
                let el = e.addc(tid, (l * THREADS) as i64)?;
                let (ii, kq) = if a_k_fast {
                    (e.udivc(el, BK as i64)?, e.uremc(el, BK as i64)?)
                } else {
                    (e.uremc(el, bm as i64)?, e.udivc(el, bm as i64)?)
                };
                let gi = e.add(row0, ii)?;
                let gk = e.add(k0, kq)?;
                let valid = and(&e, ult(&e, gi, m)?, ult(&e, gk, kk)?)?;
                let v = self.a_element(k, &e, a_ptr, a_off, (gi, gk), valid)?;
                e.store(e.gep_f32(a_sh, e.add(e.mulc(kq, sa as i64)?, ii)?)?, v)?;
            }
            // B slice: BK×bn.
            let b_k_fast = matches!(self.b, BSrc::Mat(bm) if bm.cs != 1 && bm.rs == 1);
            for l in 0..(BK * bn) / THREADS {
                let el = e.addc(tid, (l * THREADS) as i64)?;
                let (kq, jj) = if b_k_fast {
                    (e.uremc(el, BK as i64)?, e.udivc(el, BK as i64)?)
                } else {
                    (e.udivc(el, bn as i64)?, e.uremc(el, bn as i64)?)
                };
                let gk = e.add(k0, kq)?;
                let gj = e.add(col0, jj)?;
                let valid = and(&e, ult(&e, gk, kk)?, ult(&e, gj, n)?)?;
                let v = self.b_element(k, &e, b_off, (gk, gj), valid)?;
                e.store(e.gep_f32(b_sh, e.add(e.mulc(kq, sb as i64)?, jj)?)?, v)?;
            }
            k.barrier()?;
            if let Some(warps) = &warps {
                warps.multiply(k, &e, a_sh, b_sh, acc)?;
                // The next slice overwrites what slower warps may still read.
                return k.barrier();
            }
            for q in 0..BK {
                let av: Vec<FloatValue> = (0..tm)
                    .map(|r| e.load_f32(e.gep_f32(a_sh, e.addc(ty, (q * sa + r * TY) as i64)?)?))
                    .collect::<Result<_>>()?;
                let bv: Vec<FloatValue> = (0..tn)
                    .map(|c| e.load_f32(e.gep_f32(b_sh, e.addc(tx, (q * sb + c * TX) as i64)?)?))
                    .collect::<Result<_>>()?;
                for (r, a) in av.iter().enumerate() {
                    for (c, bval) in bv.iter().enumerate() {
                        let p = acc_at(r, c)?;
                        let s = e.load_f32(p)?;
                        let s = e
                            .intrinsic(
                                "llvm.fma",
                                &[f32t.into()],
                                &[(*a).into(), (*bval).into(), s.into()],
                            )?
                            .into_float_value();
                        e.store(p, s)?;
                    }
                }
            }
            // The next slice overwrites what slower threads may still read.
            k.barrier()
        })?;
        let finish =
            |sum: FloatValue<'ctx>, i: IntValue<'ctx>, j: IntValue<'ctx>| self.finish(k, &e, z, (i, j), sum);
        // Whether element (i, j) is inside the output (and `also`, when given).
        let inside = |i, j, also: Option<IntValue<'ctx>>| -> Result<IntValue<'ctx>> {
            let inside = and(&e, ult(&e, i, m)?, ult(&e, j, n)?)?;
            match also {
                Some(c) => and(&e, inside, c),
                None => Ok(inside),
            }
        };
        // This thread's results: accumulator, output row and column, and whether it stores.
        let mut results = vec![];
        if let Some(warps) = &warps {
            for u in 0..warps.per_warp {
                for q in 0..4 {
                    let (i, j) = warps.element(&e, u, q)?;
                    results.push((u * 4 + q, e.add(row0, i)?, e.add(col0, j)?, Some(warps.owner)));
                }
            }
        } else {
            for r in 0..tm {
                for c in 0..tn {
                    let i = e.add(row0, e.addc(ty, (r * TY) as i64)?)?;
                    let j = e.add(col0, e.addc(tx, (c * TX) as i64)?)?;
                    results.push((r * tn + c, i, j, None));
                }
            }
        }
        let Some(sk) = self.split_k else {
            for (slot, i, j, also) in results {
                e.if_then(inside(i, j, also)?, || {
                    finish(e.load_f32(e.gep_f32c(acc, slot as i64)?)?, i, j)
                })?;
            }
            return k.ret();
        };
        // Split-K: this slice's partial tile into the scratch.
        let partials = k.scratch()?;
        let entries = self.entries();
        let partial_at =
            |s: IntValue<'ctx>, i: IntValue<'ctx>, j: IntValue<'ctx>| -> Result<PointerValue<'ctx>> {
                let plane = e.add(e.mulc(s, entries as i64)?, z)?;
                let row = e.add(e.mulc(plane, m as i64)?, i)?;
                e.gep_f32(partials, e.add(e.mulc(row, n as i64)?, j)?)
            };
        for &(slot, i, j, also) in &results {
            e.if_then(inside(i, j, also)?, || {
                let v = e.load_f32(e.gep_f32c(acc, slot as i64)?)?;
                e.store(partial_at(slice, i, j)?, v)
            })?;
        }
        // Publish the partial tile before counting this slice as done (the classic
        // threadfence reduction): every thread's stores, then one count per block.
        k.fence_device()?;
        k.barrier()?;
        let tiles_n = self.n.div_ceil(bn);
        let tiles_m = self.m.div_ceil(bm);
        let tile_index = e.add(
            e.mulc(
                e.add(e.mulc(z, tiles_m as i64)?, k.sreg64(Sreg::CtaidY)?)?,
                tiles_n as i64,
            )?,
            k.sreg64(Sreg::CtaidX)?,
        )?;
        let i32t = k.cx.i32_type();
        let counter = e.gep_u8(resolve(k, Slot::Packed(sk.counters))?, e.mulc(tile_index, 4)?)?;
        let flag = e.gep_u8(smem, e.i64c(t.shared_bytes() as i64))?;
        let first_thread = e.icmp(IntPredicate::EQ, tid, e.i64c(0))?;
        e.if_then(first_thread, || {
            let done =
                e.b.build_atomicrmw(
                    inkwell::AtomicRMWBinOp::Add,
                    counter,
                    i32t.const_int(1, false),
                    inkwell::AtomicOrdering::Monotonic,
                )
                .map_err(llvm)?;
            let last = e.b.build_int_compare(
                IntPredicate::EQ,
                done,
                i32t.const_int(split as u64 - 1, false),
                "last",
            );
            let last =
                e.b.build_int_z_extend(last.map_err(llvm)?, i32t, "")
                    .map_err(llvm)?;
            e.store(flag, last)
        })?;
        k.barrier()?;
        let last = e.b.build_load(i32t, flag, "last").map_err(llvm)?.into_int_value();
        let last = e.icmp(IntPredicate::NE, last, i32t.const_zero())?;
        e.if_then(last, || {
            // The other slices' partials: written by other SMs, so read past this SM's cache.
            k.fence_device()?;
            for &(_, i, j, also) in &results {
                e.if_then(inside(i, j, also)?, || {
                    let mut sum = e.f32c(0.0);
                    for s in 0..split {
                        let v =
                            e.b.build_load(f32t, partial_at(e.i64c(s as i64), i, j)?, "")
                                .map_err(llvm)?;
                        v.as_instruction_value()
                            .expect("a load")
                            .set_volatile(true)
                            .map_err(llvm)?;
                        sum = e.b.build_float_add(sum, v.into_float_value(), "").map_err(llvm)?;
                    }
                    finish(sum, i, j)
                })?;
            }
            // Ready for the next run.
            e.if_then(first_thread, || e.store(counter, i32t.const_zero()))
        })?;
        k.ret()
    }
}

impl GemmGpu {
    /// Batch entries (grid.z without split-K).
    pub(super) fn entries(&self) -> usize {
        self.batch.iter().map(|d| d.extent).product()
    }

    /// The A and B element offsets of batch entry `z` (last dimension fastest).
    pub(super) fn batch_offsets<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        z: IntValue<'ctx>,
    ) -> Result<(IntValue<'ctx>, IntValue<'ctx>)> {
        let (mut a_off, mut b_off) = (e.i64c(0), e.i64c(0));
        let mut rest = z;
        for d in self.batch.iter().rev() {
            let idx = e.uremc(rest, d.extent as i64)?;
            rest = e.udivc(rest, d.extent as i64)?;
            a_off = e.add(a_off, e.mulc(idx, d.a as i64)?)?;
            b_off = e.add(b_off, e.mulc(idx, d.b as i64)?)?;
        }
        Ok((a_off, b_off))
    }

    /// Element `(i, k)` of A (at `a_ptr`, batch offset `a_off`) as the products read it: 0
    /// where `valid` is false, rounded to bf16 when [`Self::rounds_bf16`].
    pub(super) fn a_element<'ctx>(
        &self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        a_ptr: PointerValue<'ctx>,
        a_off: IntValue<'ctx>,
        (i, kk): (IntValue<'ctx>, IntValue<'ctx>),
        valid: IntValue<'ctx>,
    ) -> Result<FloatValue<'ctx>> {
        let idx = e.add(
            a_off,
            e.add(e.mulc(i, self.a.rs as i64)?, e.mulc(kk, self.a.cs as i64)?)?,
        )?;
        let v = guarded_load(k, e, slot_elem(self.a.slot, self.elem), a_ptr, idx, valid)?;
        self.staged(e, v)
    }

    /// Element `(k, j)` of B (a matrix, or a convolution's implicit im2col matrix read from
    /// its input, the padding zero) at batch offset `b_off`, as [`Self::a_element`].
    pub(super) fn b_element<'ctx>(
        &self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        b_off: IntValue<'ctx>,
        (gk, gj): (IntValue<'ctx>, IntValue<'ctx>),
        valid: IntValue<'ctx>,
    ) -> Result<FloatValue<'ctx>> {
        let mut valid = valid;
        let (ptr, elem, idx) = match self.b {
            BSrc::Mat(bm) => (
                resolve(k, bm.slot)?,
                slot_elem(bm.slot, self.elem),
                e.add(
                    b_off,
                    e.add(e.mulc(gk, bm.rs as i64)?, e.mulc(gj, bm.cs as i64)?)?,
                )?,
            ),
            BSrc::Im2col(ic) => {
                let g = ic.g;
                let taps = (g.kh * g.kw) as i64;
                let ch = e.udivc(gk, taps)?;
                let t = e.uremc(gk, taps)?;
                let khi = e.udivc(t, g.kw as i64)?;
                let kwi = e.uremc(t, g.kw as i64)?;
                let oh = e.udivc(gj, g.ow as i64)?;
                let ow = e.uremc(gj, g.ow as i64)?;
                // Negative coordinates wrap to large unsigned values: one compare each.
                let ih = e.addc(
                    e.add(e.mulc(oh, g.sh as i64)?, e.mulc(khi, g.dh as i64)?)?,
                    -(g.ph as i64),
                )?;
                let iw = e.addc(
                    e.add(e.mulc(ow, g.sw as i64)?, e.mulc(kwi, g.dw as i64)?)?,
                    -(g.pw as i64),
                )?;
                valid = and(e, valid, and(e, ult(e, ih, g.h)?, ult(e, iw, g.w)?)?)?;
                let idx = e.add(
                    e.mulc(ch, (g.h * g.w) as i64)?,
                    e.add(e.mulc(ih, g.w as i64)?, iw)?,
                )?;
                (k.input(ic.input)?, self.elem, e.add(b_off, idx)?)
            }
        };
        let v = guarded_load(k, e, elem, ptr, idx, valid)?;
        self.staged(e, v)
    }

    /// The epilogue on output element `(i, j)` of batch entry `z`'s finished `sum`, and its
    /// store.
    pub(super) fn finish<'ctx>(
        &self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        z: IntValue<'ctx>,
        (i, j): (IntValue<'ctx>, IntValue<'ctx>),
        sum: FloatValue<'ctx>,
    ) -> Result<()> {
        let (m, n) = (self.m, self.n);
        let g_idx = e.uremc(z, self.groups as i64)?;
        let bias_row = e.add(e.mulc(g_idx, m as i64)?, i)?;
        let v = self
            .epi
            .apply(k, e, self.elem, sum, (bias_row, j), |zs, rs, cs| {
                e.add(
                    e.mulc(z, zs as i64)?,
                    e.add(e.mulc(i, rs as i64)?, e.mulc(j, cs as i64)?)?,
                )
            })?;
        let o = e.add(e.mulc(z, (m * n) as i64)?, e.add(e.mulc(i, n as i64)?, j)?)?;
        store_elem(k, e, self.elem, k.output(0)?, o, v)
    }
}
