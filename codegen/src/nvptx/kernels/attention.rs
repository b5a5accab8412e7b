//! Attention on the GPU (the opset-23 `Attention` operator and the attention the fusion pass
//! recognizes): `softmax(Q·Kᵀ·scale + mask) · V` per batch entry and head, never storing the
//! score matrix.
//!
//! One thread per query row, `ROWS` rows (of one batch entry and head) a block. The block
//! walks the keys in tiles of `TILE`: its threads stage the tile's K and V rows in shared memory
//! (consecutive threads load consecutive elements of a row), then each thread folds the tile
//! into its row with the online softmax — a running maximum `m`, a running sum `l` of
//! `exp(s - m)` and the output accumulator, both rescaled by `exp(m_old - m_new)` when the
//! maximum grows. Every thread of a warp reads the same shared word at a time (a broadcast), and
//! the query row and the accumulator stay in registers (head sizes up to `MAX_HEAD`).
//!
//! The cases this kernel takes are those of the CPU's f32 attention kernel (`kiln_uk_attention_f32`:
//! f32 operands, no KV cache, softcap or sliding window, mask absent, bool or f32, nonpad
//! lengths without the causal mask): its parameters come from that kernel's lowering, so both
//! backends accept the same models. With nonpad lengths a block walks only its batch entry's
//! first `nonpad[b]` keys (clamped to 0..T): the padded keys and values are never read.

use crate::error::Result;
use crate::gen::elementwise as ew;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims, Sreg};
use crate::target::TargetDesc;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::{FloatPredicate, IntPredicate};
use kiln_ir::Op;

/// Query rows (threads) per block.
const ROWS: usize = 64;
/// Keys per shared-memory tile.
pub(super) const TILE: usize = 32;
/// The largest head size (Dk or Dv) whose row and accumulator are kept in registers.
const MAX_HEAD: usize = 128;

#[derive(Debug, PartialEq)]
pub(super) enum Mask {
    None,
    Bool,
    F32,
}

#[derive(Debug)]
pub(super) struct AttentionGpu {
    pub(super) three_d: bool,
    pub(super) b: usize,
    pub(super) hq: usize,
    pub(super) hkv: usize,
    pub(super) sq: usize,
    pub(super) t: usize,
    pub(super) dk: usize,
    pub(super) dv: usize,
    pub(super) causal: bool,
    pub(super) mask: Mask,
    /// Element strides of the mask over [B, Hq, Sq, keys] (0 on broadcast axes) and the number
    /// of keys it covers (later keys are masked).
    pub(super) mask_strides: [usize; 4],
    pub(super) mask_len: usize,
    pub(super) scale: f32,
    /// Input 6, `nonpad_kv_seqlen` (i64 [B]), bounds each batch entry's keys.
    pub(super) nonpad: bool,
    /// Q, K and V hold bf16 values (bf16 autocast): the kernel rounds them to bf16 as it reads
    /// them, which keeps bf16 values as they are and lets it read the f32 value behind the
    /// autocast's `Cast<f32>(Cast<bf16>(x))` itself (`rounds_input_to_bf16`).
    pub(super) round_bf16: [bool; 3],
}

/// The attention kernel for `node`, or None when the CPU's f32 kernel would not take it.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    Ok(parse(node)?.map(|a| Box::new(a) as Box<dyn GpuKernel>))
}

/// The attention of `node` as the CPU's f32 kernel lowers it, or None when that kernel would
/// not take it (`attention_mma` starts from the same).
pub(super) fn parse(node: &NodeInfo) -> Result<Option<AttentionGpu>> {
    if !matches!(node.node.op, Op::Attention(_)) {
        return Ok(None);
    }
    let Some(call) = crate::uk::lower(node)? else {
        return Ok(None);
    };
    if call.symbol != "attention_f32" {
        return Ok(None);
    }
    let ia: Vec<usize> = call.iattr.iter().map(|&v| v as usize).collect();
    let (dk, dv) = (ia[6], ia[7]);
    let grid_y = ia[1] * ia[2];
    if dk == 0 || dv == 0 || dk > MAX_HEAD || dv > MAX_HEAD || grid_y == 0 || grid_y > 65535 {
        return Ok(None);
    }
    let mask = match call.iattr[9] {
        0 => Mask::None,
        1 => Mask::Bool,
        _ => Mask::F32,
    };
    // Strides as the C kernel derives them from the mask shape padded to 4-D.
    let shape = [ia[10], ia[11], ia[12], ia[13]];
    let mut mask_strides = [0usize; 4];
    let mut acc = 1;
    for ax in (0..4).rev() {
        mask_strides[ax] = if shape[ax] == 1 && ax < 3 { 0 } else { acc };
        acc *= shape[ax];
    }
    Ok(Some(AttentionGpu {
        three_d: ia[0] != 0,
        b: ia[1],
        hq: ia[2],
        hkv: ia[3],
        sq: ia[4],
        t: ia[5],
        dk,
        dv,
        causal: ia[8] != 0,
        mask,
        mask_strides,
        mask_len: shape[3],
        scale: call.fattr[0] as f32,
        nonpad: node.has_input(6),
        round_bf16: [0, 1, 2].map(|i| node.input_is_bf16_valued(i)),
    }))
}

pub(super) fn fma<'ctx>(
    e: &Emit<'_, 'ctx>,
    a: FloatValue<'ctx>,
    b: FloatValue<'ctx>,
    c: FloatValue<'ctx>,
) -> Result<FloatValue<'ctx>> {
    let f32t = e.cx.f32_type();
    Ok(
        e.intrinsic("llvm.fma", &[f32t.into()], &[a.into(), b.into(), c.into()])?
            .into_float_value(),
    )
}

/// e^x by the CPU kernels' polynomial, on a one-lane vector.
pub(super) fn exp<'ctx>(e: &Emit<'_, 'ctx>, x: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
    let v = crate::gen::vmath::exp(e, e.splat(x, 1)?)?;
    Ok(e.b
        .build_extract_element(v, e.i32c(0), "")
        .map_err(llvm)?
        .into_float_value())
}

impl AttentionGpu {
    /// Element strides of a row of Q, K, V and Y.
    pub(super) fn row_strides(&self) -> (usize, usize, usize, usize) {
        if self.three_d {
            (
                self.hq * self.dk,
                self.hkv * self.dk,
                self.hkv * self.dv,
                self.hq * self.dv,
            )
        } else {
            (self.dk, self.dk, self.dv, self.dv)
        }
    }

    /// Element offsets of the first row of Q, K, V and Y for batch entry `b`, query head `h`
    /// (`bh` = b·Hq + h) and its key/value head `hk`.
    pub(super) fn bases<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        b: IntValue<'ctx>,
        h: IntValue<'ctx>,
        hk: IntValue<'ctx>,
        bh: IntValue<'ctx>,
    ) -> Result<(IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>)> {
        let (dk, dv) = (self.dk, self.dv);
        let (qs, ks, vs, ys) = self.row_strides();
        let (sq, t) = (self.sq as i64, self.t as i64);
        Ok(if self.three_d {
            (
                e.add(e.mulc(b, sq * qs as i64)?, e.mulc(h, dk as i64)?)?,
                e.add(e.mulc(b, t * ks as i64)?, e.mulc(hk, dk as i64)?)?,
                e.add(e.mulc(b, t * vs as i64)?, e.mulc(hk, dv as i64)?)?,
                e.add(e.mulc(b, sq * ys as i64)?, e.mulc(h, dv as i64)?)?,
            )
        } else {
            let kv = e.add(e.mulc(b, self.hkv as i64)?, hk)?;
            (
                e.mulc(bh, sq * dk as i64)?,
                e.mulc(kv, t * dk as i64)?,
                e.mulc(kv, t * dv as i64)?,
                e.mulc(bh, sq * dv as i64)?,
            )
        })
    }

    /// The mask's element offset of query row `i` (None without a mask).
    pub(super) fn mask_row<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        b: IntValue<'ctx>,
        h: IntValue<'ctx>,
        i: IntValue<'ctx>,
    ) -> Result<Option<IntValue<'ctx>>> {
        Ok(match self.mask {
            Mask::None => None,
            _ => {
                let [s0, s1, s2, _] = self.mask_strides;
                Some(e.add(
                    e.add(e.mulc(b, s0 as i64)?, e.mulc(h, s1 as i64)?)?,
                    e.mulc(i, s2 as i64)?,
                )?)
            }
        })
    }

    /// The keys batch entry `b` sees: nonpad[b] clamped to 0..T (model data), or all. The
    /// same for a whole block, so every thread meets the same barriers.
    pub(super) fn key_count<'ctx>(
        &self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        b: IntValue<'ctx>,
    ) -> Result<IntValue<'ctx>> {
        let t = self.t as i64;
        Ok(if self.nonpad {
            let i64t = k.cx.i64_type();
            let at = unsafe { e.b.build_in_bounds_gep(i64t, k.input(6)?, &[b], "") }.map_err(llvm)?;
            let n = e.b.build_load(i64t, at, "").map_err(llvm)?.into_int_value();
            let negative = e.icmp(IntPredicate::SLT, n, e.i64c(0))?;
            let n =
                e.b.build_select(negative, e.i64c(0), n, "")
                    .map_err(llvm)?
                    .into_int_value();
            e.umin(n, e.i64c(t))?
        } else {
            e.i64c(t)
        })
    }

    /// Score `s` of key `key` for query row `i` with the mask applied, and whether the key
    /// counts: the row exists, the mask lets it through, the causal mask too, and the score is
    /// not -inf (an f32 mask's way to mask; NaN propagates).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn masked_score<'ctx>(
        &self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        s: FloatValue<'ctx>,
        key: IntValue<'ctx>,
        i: IntValue<'ctx>,
        row_valid: IntValue<'ctx>,
        mask_row: Option<IntValue<'ctx>>,
    ) -> Result<(FloatValue<'ctx>, IntValue<'ctx>)> {
        let mut s = s;
        let ninf = e.f32c(f32::NEG_INFINITY);
        let mut keep = row_valid;
        if let Some(mrow) = mask_row {
            let covered = e.icmp(IntPredicate::ULT, key, e.i64c(self.mask_len as i64))?;
            let mi = e.add(mrow, e.mulc(key, self.mask_strides[3] as i64)?)?;
            let mi =
                e.b.build_select(covered, mi, mrow, "")
                    .map_err(llvm)?
                    .into_int_value();
            let mptr = k.input(3)?;
            if self.mask == Mask::Bool {
                let byte =
                    unsafe { e.b.build_in_bounds_gep(k.cx.i8_type(), mptr, &[mi], "") }.map_err(llvm)?;
                let mb =
                    e.b.build_load(k.cx.i8_type(), byte, "")
                        .map_err(llvm)?
                        .into_int_value();
                let on =
                    e.b.build_int_compare(IntPredicate::NE, mb, k.cx.i8_type().const_zero(), "")
                        .map_err(llvm)?;
                keep =
                    e.b.build_and(keep, e.b.build_and(covered, on, "").map_err(llvm)?, "")
                        .map_err(llvm)?;
            } else {
                let mv = e.load_f32(e.gep_f32(mptr, mi)?)?;
                let mv = e.select_float(covered, mv, e.f32c(0.0))?;
                s = e.b.build_float_add(s, mv, "").map_err(llvm)?;
                keep = e.b.build_and(keep, covered, "").map_err(llvm)?;
            }
        }
        if self.causal {
            let past = e.icmp(IntPredicate::ULE, key, i)?;
            keep = e.b.build_and(keep, past, "").map_err(llvm)?;
        }
        // A score of -inf (an f32 mask's way to mask) adds nothing; NaN propagates.
        let is_ninf =
            e.b.build_float_compare(FloatPredicate::OEQ, s, ninf, "")
                .map_err(llvm)?;
        let finite = e.b.build_not(is_ninf, "").map_err(llvm)?;
        keep = e.b.build_and(keep, finite, "").map_err(llvm)?;
        Ok((s, keep))
    }

    /// Stages `TILE` rows of K or V (`width` elements each, row `t` at `base + t·stride`) from
    /// key `t0` in shared memory at `dst`; rows from key `keys` on are zeros, never read.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn stage<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        tid: IntValue<'ctx>,
        src: PointerValue<'ctx>,
        base: IntValue<'ctx>,
        stride: usize,
        width: usize,
        t0: IntValue<'ctx>,
        keys: IntValue<'ctx>,
        dst: PointerValue<'ctx>,
        round: bool,
        threads: usize,
    ) -> Result<()> {
        let total = TILE * width;
        for l in 0..total.div_ceil(threads) {
            let el = e.addc(tid, (l * threads) as i64)?;
            let store = |el: IntValue<'ctx>| -> Result<()> {
                let j = e.udivc(el, width as i64)?;
                let d = e.uremc(el, width as i64)?;
                let t = e.add(t0, j)?;
                let valid = e.icmp(IntPredicate::ULT, t, keys)?;
                let idx = e.add(base, e.add(e.mulc(t, stride as i64)?, d)?)?;
                let safe =
                    e.b.build_select(valid, idx, e.i64c(0), "")
                        .map_err(llvm)?
                        .into_int_value();
                let mut v = e.load_f32(e.gep_f32(src, safe)?)?;
                if round {
                    v = ew::round_bf16_one(e, v)?;
                }
                let v = e.select_float(valid, v, e.f32c(0.0))?;
                e.store(e.gep_f32(dst, el)?, v)
            };
            if (l + 1) * threads <= total {
                store(el)?;
            } else {
                let inside = e.icmp(IntPredicate::ULT, el, e.i64c(total as i64))?;
                e.if_then(inside, || store(el))?;
            }
        }
        Ok(())
    }
}

impl KernelCommon for AttentionGpu {
    fn describe(&self) -> String {
        format!(
            "gpu attention B={} H={}/{} Sq={} T={} Dk={} Dv={}{}{}{}{}",
            self.b,
            self.hq,
            self.hkv,
            self.sq,
            self.t,
            self.dk,
            self.dv,
            if self.causal { " causal" } else { "" },
            if self.nonpad { " nonpad" } else { "" },
            match self.mask {
                Mask::None => "",
                Mask::Bool => " +bool mask",
                Mask::F32 => " +mask",
            },
            if self.round_bf16.contains(&true) {
                " bf16-rounded operands"
            } else {
                ""
            }
        )
    }
}

impl GpuKernel for AttentionGpu {
    fn rounds_input_to_bf16(&self, i: usize) -> bool {
        self.round_bf16.get(i).copied().unwrap_or(false)
    }

    fn launch(&self) -> LaunchDims {
        LaunchDims {
            grid: [self.sq.div_ceil(ROWS).max(1) as u32, (self.b * self.hq) as u32, 1],
            block: [ROWS as u32, 1, 1],
            shared_bytes: (TILE * (self.dk + self.dv) * 4) as u32,
        }
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let f32t = k.cx.f32_type();
        let (dk, dv) = (self.dk, self.dv);
        let (qs, ks, vs, ys) = self.row_strides();
        let tid = k.sreg64(Sreg::TidX)?;
        let i = e.add(e.mulc(k.sreg64(Sreg::CtaidX)?, ROWS as i64)?, tid)?;
        let bh = k.sreg64(Sreg::CtaidY)?;
        let b = e.udivc(bh, self.hq as i64)?;
        let h = e.uremc(bh, self.hq as i64)?;
        let hk = e.udivc(h, (self.hq / self.hkv) as i64)?;
        let row_valid = e.icmp(IntPredicate::ULT, i, e.i64c(self.sq as i64))?;
        // Threads past the last row still stage tiles and meet the barriers; they read row 0.
        let ic =
            e.b.build_select(row_valid, i, e.i64c(0), "")
                .map_err(llvm)?
                .into_int_value();
        let (q0, k0, v0, y0) = self.bases(&e, b, h, hk, bh)?;
        let (q_ptr, k_ptr, v_ptr) = (k.input(0)?, k.input(1)?, k.input(2)?);
        let y_ptr = k.output(0)?;
        let smem = k.shared()?;
        let k_sh = smem;
        let v_sh = e.gep_f32c(smem, (TILE * dk) as i64)?;

        // The query row, pre-scaled, and the accumulator: fixed-size arrays indexed by
        // constants only, so they live in registers.
        let q = e.entry_alloca(f32t.array_type(dk as u32), "q")?;
        let acc = e.entry_alloca(f32t.array_type(dv as u32), "acc")?;
        let m = e.entry_alloca(f32t, "m")?;
        let l = e.entry_alloca(f32t, "l")?;
        let q_row = e.add(q0, e.mulc(ic, qs as i64)?)?;
        let scale = e.f32c(self.scale);
        for d in 0..dk {
            let mut v = e.load_f32(e.gep_f32(q_ptr, e.addc(q_row, d as i64)?)?)?;
            if self.round_bf16[0] {
                v = ew::round_bf16_one(&e, v)?;
            }
            let v = e.b.build_float_mul(v, scale, "").map_err(llvm)?;
            e.store(e.gep_f32c(q, d as i64)?, v)?;
        }
        for d in 0..dv {
            e.store(e.gep_f32c(acc, d as i64)?, f32t.const_zero())?;
        }
        let ninf = e.f32c(f32::NEG_INFINITY);
        e.store(m, ninf)?;
        e.store(l, f32t.const_zero())?;
        let mask_row = self.mask_row(&e, b, h, ic)?;
        // The keys this batch entry sees: nonpad[b] clamped to 0..T (model data), or all. The
        // same for the whole block, so every thread meets the same barriers.
        let keys = self.key_count(k, &e, b)?;
        e.for_range(e.i64c(0), keys, TILE as i64, |t0| {
            self.stage(
                &e,
                tid,
                k_ptr,
                k0,
                ks,
                dk,
                t0,
                keys,
                k_sh,
                self.round_bf16[1],
                ROWS,
            )?;
            self.stage(
                &e,
                tid,
                v_ptr,
                v0,
                vs,
                dv,
                t0,
                keys,
                v_sh,
                self.round_bf16[2],
                ROWS,
            )?;
            k.barrier()?;
            let left = e.sub(keys, t0)?;
            let n = e.umin(left, e.i64c(TILE as i64))?;
            e.for_range(e.i64c(0), n, 1, |j| {
                let key = e.add(t0, j)?;
                // s = q·k, four partial sums for instruction-level parallelism.
                let krow = e.mulc(j, dk as i64)?;
                let mut part = [f32t.const_zero(); 4];
                for d in 0..dk {
                    let kv = e.load_f32(e.gep_f32(k_sh, e.addc(krow, d as i64)?)?)?;
                    let qv = e.load_f32(e.gep_f32c(q, d as i64)?)?;
                    part[d % 4] = fma(&e, qv, kv, part[d % 4])?;
                }
                let s01 = e.b.build_float_add(part[0], part[1], "").map_err(llvm)?;
                let s23 = e.b.build_float_add(part[2], part[3], "").map_err(llvm)?;
                let s = e.b.build_float_add(s01, s23, "").map_err(llvm)?;
                let (s, keep) = self.masked_score(k, &e, s, key, i, row_valid, mask_row)?;
                e.if_then(keep, || {
                    let m_old = e.load_f32(m)?;
                    let grows =
                        e.b.build_float_compare(FloatPredicate::OGT, s, m_old, "")
                            .map_err(llvm)?;
                    let m_new = e.select_float(grows, s, m_old)?;
                    let corr = exp(&e, e.b.build_float_sub(m_old, m_new, "").map_err(llvm)?)?;
                    let p = exp(&e, e.b.build_float_sub(s, m_new, "").map_err(llvm)?)?;
                    let l_old = e.load_f32(l)?;
                    e.store(l, fma(&e, l_old, corr, p)?)?;
                    e.store(m, m_new)?;
                    let vrow = e.mulc(j, dv as i64)?;
                    for d in 0..dv {
                        let vv = e.load_f32(e.gep_f32(v_sh, e.addc(vrow, d as i64)?)?)?;
                        let a = e.gep_f32c(acc, d as i64)?;
                        let scaled = e.b.build_float_mul(e.load_f32(a)?, corr, "").map_err(llvm)?;
                        e.store(a, fma(&e, p, vv, scaled)?)?;
                    }
                    Ok(())
                })
            })?;
            k.barrier()
        })?;

        // y = acc / l; a row with every key masked is zeros, as the reference.
        e.if_then(row_valid, || {
            let lv = e.load_f32(l)?;
            let empty =
                e.b.build_float_compare(FloatPredicate::OEQ, lv, f32t.const_zero(), "")
                    .map_err(llvm)?;
            let inv = e.b.build_float_div(e.f32c(1.0), lv, "").map_err(llvm)?;
            let inv = e.select_float(empty, f32t.const_zero(), inv)?;
            let y_row = e.add(y0, e.mulc(i, ys as i64)?)?;
            for d in 0..dv {
                let a = e.load_f32(e.gep_f32c(acc, d as i64)?)?;
                let y = e.b.build_float_mul(a, inv, "").map_err(llvm)?;
                e.store(e.gep_f32(y_ptr, e.addc(y_row, d as i64)?)?, y)?;
            }
            Ok(())
        })?;
        k.ret()
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check};
    use kiln_ir::{AttentionAttrs, DType, Graph, Op, Tensor, TensorType};

    fn values(n: usize, seed: u64) -> Vec<f32> {
        crate::test_rng::TestRng::new(seed).vec(n)
    }

    enum MaskIn {
        None,
        Bool(Vec<usize>),
        F32(Vec<usize>),
    }

    /// Attention over Q [.., Sq, ..], K/V [.., T, ..] with `hq`/`hkv` heads, 4-D or 3-D.
    fn graph(
        three_d: bool,
        heads: (usize, usize, usize),
        lengths: (usize, usize),
        dims: (usize, usize),
        causal: bool,
        mask: MaskIn,
    ) -> (Graph, Vec<Tensor>) {
        graph_nonpad(three_d, heads, lengths, dims, causal, mask, None)
    }

    /// [`graph`] with `nonpad_kv_seqlen` given these lengths.
    #[allow(clippy::too_many_arguments)]
    fn graph_nonpad(
        three_d: bool,
        (b, hq, hkv): (usize, usize, usize),
        (sq, t): (usize, usize),
        (dk, dv): (usize, usize),
        causal: bool,
        mask: MaskIn,
        nonpad: Option<Vec<i64>>,
    ) -> (Graph, Vec<Tensor>) {
        let mut g = Graph::new("t");
        let shape = |h: usize, s: usize, d: usize| {
            if three_d {
                vec![b, s, h * d]
            } else {
                vec![b, h, s, d]
            }
        };
        let shapes = [shape(hq, sq, dk), shape(hkv, t, dk), shape(hkv, t, dv)];
        let mut inputs = vec![];
        let mut ids = vec![];
        for (n, s) in shapes.iter().enumerate() {
            ids.push(Some(
                g.add_input(format!("x{n}"), TensorType::fixed(DType::F32, s)),
            ));
            inputs.push(Tensor::from_vec(
                s.clone(),
                values(s.iter().product(), n as u64 + 1),
            ));
        }
        match mask {
            MaskIn::None => {}
            MaskIn::Bool(s) => {
                ids.push(Some(g.add_input("mask", TensorType::fixed(DType::Bool, &s))));
                let n: usize = s.iter().product();
                let v: Vec<bool> = (0..n).map(|i| (i * 7 + i / 3) % 5 != 0).collect();
                inputs.push(Tensor::from_vec(s, v));
            }
            MaskIn::F32(s) => {
                ids.push(Some(g.add_input("mask", TensorType::fixed(DType::F32, &s))));
                let n: usize = s.iter().product();
                let mut v = values(n, 9);
                // Some keys masked outright, as exporters write -inf.
                for x in v.iter_mut().step_by(7) {
                    *x = f32::NEG_INFINITY;
                }
                inputs.push(Tensor::from_vec(s, v));
            }
        }
        if let Some(lengths) = nonpad {
            ids.resize(6, None);
            ids.push(Some(g.add_input("nonpad", TensorType::fixed(DType::I64, &[b]))));
            inputs.push(Tensor::from_vec(vec![b], lengths));
        }
        let attrs = AttentionAttrs {
            is_causal: causal,
            q_num_heads: if three_d { hq } else { 0 },
            kv_num_heads: if three_d { hkv } else { 0 },
            ..AttentionAttrs::default()
        };
        let y = g.add("attn", Op::Attention(attrs), ids, "y").unwrap();
        g.add_output("y", y);
        (g, inputs)
    }

    fn check(g: (Graph, Vec<Tensor>)) {
        let kernels = check_graph(&g.0, &g.1);
        assert!(
            kernels.iter().all(|k| k.starts_with("gpu attention")),
            "not the GPU attention kernel: {kernels:?}"
        );
    }

    #[test]
    fn plain_4d_several_row_blocks_and_key_tiles() {
        // 70 rows: two blocks, the second mostly idle; 45 keys: a full and a partial tile.
        check(graph(false, (1, 2, 2), (70, 45), (16, 8), false, MaskIn::None));
    }

    #[test]
    fn grouped_heads_3d_causal() {
        check(graph(true, (2, 4, 2), (5, 5), (8, 12), true, MaskIn::None));
    }

    #[test]
    fn bool_mask_broadcast_and_short() {
        // [Sq, 20] broadcast over batch and heads, shorter than the 33 keys.
        check(graph(
            false,
            (2, 2, 1),
            (9, 33),
            (8, 8),
            false,
            MaskIn::Bool(vec![9, 20]),
        ));
    }

    #[test]
    fn f32_mask_with_minus_infinity_and_causal() {
        check(graph(
            false,
            (1, 2, 2),
            (6, 6),
            (4, 4),
            true,
            MaskIn::F32(vec![1, 2, 6, 6]),
        ));
    }

    #[test]
    fn fully_masked_rows_are_zero() {
        // Causal with a mask that hides key 0: row 0 sees no key at all.
        let (g, mut inputs) = graph(false, (1, 1, 1), (4, 4), (4, 4), true, MaskIn::Bool(vec![4, 4]));
        inputs[3] = Tensor::from_vec(vec![4, 4], (0..16).map(|i| i % 4 != 0).collect::<Vec<bool>>());
        check((g, inputs));
    }

    #[test]
    fn nonpad_lengths_bound_each_batch_entrys_keys() {
        // 45 keys in tiles of 32: lengths none, inside the second tile, beyond all, negative,
        // at the tile edge; with a mask shorter than the keys.
        for lengths in [vec![0, 40], vec![50, -3], vec![32, 1]] {
            check(graph_nonpad(
                false,
                (2, 2, 1),
                (9, 45),
                (8, 8),
                false,
                MaskIn::F32(vec![9, 38]),
                Some(lengths),
            ));
        }
    }

    /// `g` with bf16 autocast's `Cast<f32>(Cast<bf16>(x))` on Q, K and V (the graph's first three
    /// inputs; the others as they are).
    fn bf16_operands((g, inputs): (Graph, Vec<Tensor>)) -> (Graph, Vec<Tensor>) {
        let mut h = Graph::new("t");
        let mut ids = vec![];
        for (n, x) in inputs.iter().enumerate() {
            let v = h.add_input(format!("x{n}"), TensorType::fixed(x.dtype(), x.shape()));
            if n >= 3 {
                ids.push(Some(v));
                continue;
            }
            let v = h
                .add(
                    format!("n{n}"),
                    Op::Cast { to: DType::BF16 },
                    vec![Some(v)],
                    format!("b{n}"),
                )
                .unwrap();
            let v = h
                .add(
                    format!("w{n}"),
                    Op::Cast { to: DType::F32 },
                    vec![Some(v)],
                    format!("f{n}"),
                )
                .unwrap();
            ids.push(Some(v));
        }
        let attn = g
            .node_ids()
            .find(|&id| matches!(g.node(id).op, Op::Attention(_)))
            .unwrap();
        // Absent inputs between the mask and nonpad_kv_seqlen stay absent.
        let mut wired = vec![];
        let mut next = ids.into_iter();
        for v in &g.node(attn).inputs {
            wired.push(match v {
                Some(_) => next.next().unwrap(),
                None => None,
            });
        }
        let y = h.add("attn", g.node(attn).op.clone(), wired, "y").unwrap();
        h.add_output("y", y);
        (h, inputs)
    }

    /// bf16 autocast's `Cast<f32>(Cast<bf16>(x))` on Q, K and V is absorbed: the kernel rounds
    /// them as it reads them, the casts run in no kernel of their own, and the result is the
    /// casts' one. From sm_80 on it is the tensor-core kernel, whose split P keeps f32 accuracy.
    #[test]
    fn bf16_rounding_pairs_absorbed() {
        let (h, inputs) = bf16_operands(graph(false, (1, 2, 2), (40, 37), (16, 8), true, MaskIn::None));
        let kernels = check_graph(&h, &inputs);
        assert_eq!(kernels.len(), 1, "{kernels:?}");
        assert!(kernels[0].contains("bf16-rounded operands"), "{kernels:?}");
        assert!(kernels[0].ends_with("on tensor cores"), "{kernels:?}");
        // Before sm_80 (no bf16 mma) the CUDA-core kernel computes it.
        let kernels = crate::nvptx::emulate::check_graph_for(&h, &inputs, 75);
        let attention: Vec<_> = kernels
            .iter()
            .filter(|k| k.starts_with("gpu attention"))
            .collect();
        assert!(
            attention.len() == 1 && !attention[0].contains("tensor cores"),
            "{kernels:?}"
        );
    }

    /// The tensor-core kernel in every form the CUDA-core one takes: several row blocks and key
    /// tiles, head sizes up to 128, 3-D with grouped heads, causal, bool and f32 masks (short,
    /// broadcast, -inf), nonpad lengths, rows with no key.
    #[test]
    fn tensor_core_attention_in_every_form() {
        let cases = [
            graph(false, (1, 2, 2), (70, 45), (64, 64), false, MaskIn::None),
            graph(false, (1, 1, 1), (20, 40), (128, 128), true, MaskIn::None),
            graph(
                true,
                (2, 4, 2),
                (9, 33),
                (16, 24),
                true,
                MaskIn::Bool(vec![9, 20]),
            ),
            graph(
                false,
                (1, 2, 2),
                (6, 6),
                (32, 16),
                true,
                MaskIn::F32(vec![1, 2, 6, 6]),
            ),
            graph_nonpad(
                false,
                (2, 2, 1),
                (9, 45),
                (16, 8),
                false,
                MaskIn::F32(vec![9, 38]),
                Some(vec![0, 40]),
            ),
            graph_nonpad(
                false,
                (2, 2, 1),
                (9, 45),
                (16, 8),
                false,
                MaskIn::None,
                Some(vec![50, -3]),
            ),
        ];
        for case in cases {
            let (h, inputs) = bf16_operands(case);
            let kernels = check_graph(&h, &inputs);
            assert!(
                kernels.iter().any(|k| k.ends_with("on tensor cores")),
                "{kernels:?}"
            );
        }
        let (g, mut inputs) = graph(false, (1, 1, 1), (4, 4), (16, 8), true, MaskIn::Bool(vec![4, 4]));
        inputs[3] = Tensor::from_vec(vec![4, 4], (0..16).map(|i| i % 4 != 0).collect::<Vec<bool>>());
        let (h, inputs) = bf16_operands((g, inputs));
        check_graph(&h, &inputs);
    }

    #[test]
    fn ptx_assembles() {
        let (g, inputs) = graph(
            true,
            (1, 4, 2),
            (70, 45),
            (64, 64),
            true,
            MaskIn::F32(vec![70, 45]),
        );
        // The same attention on bf16 operands: the tensor-core kernel, both products on the
        // bf16 `mma`.
        let (h, _) = bf16_operands((g.clone(), inputs));
        for sm in [80, 90] {
            ptxas_check(&g, sm);
            ptxas_check(&h, sm);
            let target = crate::target::TargetDesc::cuda(sm).unwrap();
            let plan = crate::plan::build(&h, &target, true).unwrap();
            let ptx = crate::nvptx::device::build(&h, &plan, &target, "t").unwrap().ptx;
            assert!(
                ptx.contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"),
                "sm_{sm}"
            );
        }
        let (g, _) = graph_nonpad(
            true,
            (2, 4, 2),
            (7, 45),
            (16, 16),
            false,
            MaskIn::None,
            Some(vec![3, 45]),
        );
        ptxas_check(&g, 80);
    }
}
