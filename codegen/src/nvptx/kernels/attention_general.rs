//! Attention in every form the operator allows, on the GPU: a KV cache (past keys and values
//! before the new ones, and the `present_key`/`present_value` outputs), softcap, sliding
//! windows, the `qk_matmul_output` modes, f16/bf16/f64 operands and the stage-wise rounding
//! `softmax_precision` asks for — the nodes the f32 kernel (`attention`) declines.
//!
//! A port of the library kernel (`kiln_uk_attention` in nn.c), with its parameters from the
//! same lowering (`uk::lower`) so that both take the same models and agree on every rounding:
//! values in f64, rounded to the operator's dtype (or the softcapped, biased or softmax
//! stage's) wherever the reference rounds. One thread per query row of one batch entry and
//! head; the row's scores, then its probabilities, live in the launch's scratch (`T` f64 per
//! row), and the output is accumulated a column at a time over them (the library kernel's
//! order of additions). Before its row, every thread copies its share of the present outputs
//! (past ++ new) in a grid-stride loop: nothing reads them in this launch.

use super::scalar::{load_index, load_local, load_real, round_to, store_real};
use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims};
use crate::target::TargetDesc;
use crate::uk::codes::MaskCode;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::{FloatPredicate, IntPredicate};
use kiln_ir::{DType, Op};

/// Threads per block.
const THREADS: u64 = 64;
/// The most scratch (every row's scores) the kernel asks of the arena; a larger node stays a
/// library kernel.
const MAX_SCRATCH_BYTES: u64 = 1 << 30;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mask {
    None,
    Bool,
    Float(DType),
}

#[derive(Debug)]
struct AttentionGeneral {
    three_d: bool,
    b: usize,
    hq: usize,
    hkv: usize,
    sq: usize,
    skv: usize,
    past: usize,
    dk: usize,
    dv: usize,
    causal: bool,
    qk_mode: i64,
    left: i64,
    right: i64,
    /// The rounding of the operator, the softcapped scores, the biased scores and the softmax.
    r: DType,
    rc: DType,
    rb: DType,
    rs: DType,
    mask: Mask,
    /// Element strides of the mask over [B, Hq, Sq, keys] (0 on broadcast axes) and the number
    /// of keys it covers (later keys are masked).
    mask_strides: [i64; 4],
    mask_len: i64,
    /// sqrt(scale), applied to Q and to K.
    sqrt_scale: f64,
    softcap: f64,
    /// Input 6, `nonpad_kv_seqlen` (i64 [B]).
    nonpad: bool,
    /// Dtypes of Q, K, V, past_key, past_value (inputs 0, 1, 2, 4, 5).
    q_dtype: DType,
    kv_dtypes: [DType; 2],
    past_dtypes: [DType; 2],
    /// Dtypes of the outputs Y, present_key, present_value, qk_matmul_output (those the node has).
    out_dtypes: Vec<DType>,
}

/// Which of the cached operands.
#[derive(Clone, Copy)]
enum Kv {
    Key,
    Value,
}

/// The general attention kernel for an `Attention` node the library's general kernel takes,
/// or None.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    if !matches!(node.op(), Op::Attention(_)) {
        return Ok(None);
    }
    let Some(call) = crate::uk::lower(node)? else {
        return Ok(None);
    };
    if call.symbol != "attention" {
        return Ok(None);
    }
    let float = |d: Option<DType>| d.filter(|d| d.is_float());
    let dtype_of = |code: i64| DType::ALL.get(code as usize).copied().filter(|d| d.is_float());
    let ia = &call.iattr;
    let (Some(q), Some(kd), Some(vd)) = (
        float(node.input_dtype(0)),
        float(node.input_dtype(1)),
        float(node.input_dtype(2)),
    ) else {
        return Ok(None);
    };
    let past_dtype = |i: usize| match node.has_input(i) {
        true => float(node.input_dtype(i)),
        false => Some(q),
    };
    let (Some(pk), Some(pv)) = (past_dtype(4), past_dtype(5)) else {
        return Ok(None);
    };
    let (Some(r), Some(rc), Some(rb), Some(rs)) = (
        dtype_of(ia[13]),
        dtype_of(ia[14]),
        dtype_of(ia[15]),
        dtype_of(ia[16]),
    ) else {
        return Ok(None);
    };
    let mask = match ia[17] {
        c if c == MaskCode::MASK_NONE.code() => Mask::None,
        c if c == MaskCode::MASK_BOOL.code() => Mask::Bool,
        _ => match float(node.input_dtype(3)) {
            Some(d) => Mask::Float(d),
            None => return Ok(None),
        },
    };
    let nonpad = node.has_input(6);
    if nonpad && node.input_dtype(6) != Some(DType::I64) {
        return Ok(None);
    }
    let out_dtypes: Vec<DType> = (0..node.n_outputs()).map(|i| node.output_type(i).dtype).collect();
    if out_dtypes.iter().any(|d| !d.is_float()) {
        return Ok(None);
    }
    let u = |i: usize| ia[i] as usize;
    let (b, hq, hkv, sq, skv, past) = (u(1), u(2), u(3), u(4), u(5), u(6));
    let rows = (b * hq * sq) as u64;
    if hkv == 0 || hq % hkv != 0 || rows * (past + skv) as u64 * 8 > MAX_SCRATCH_BYTES {
        return Ok(None);
    }
    // Strides as the library kernel derives them from the mask shape padded to 4-D.
    let mut mask_strides = [0i64; 4];
    let mut acc = 1;
    for ax in (0..4).rev() {
        mask_strides[ax] = if ia[18 + ax] == 1 && ax < 3 { 0 } else { acc };
        acc *= ia[18 + ax];
    }
    Ok(Some(Box::new(AttentionGeneral {
        three_d: ia[0] != 0,
        b,
        hq,
        hkv,
        sq,
        skv,
        past,
        dk: u(7),
        dv: u(8),
        causal: ia[9] != 0,
        qk_mode: ia[10],
        left: ia[11],
        right: ia[12],
        r,
        rc,
        rb,
        rs,
        mask,
        mask_strides,
        mask_len: ia[21],
        sqrt_scale: call.fattr[0],
        softcap: call.fattr[1],
        nonpad,
        q_dtype: q,
        kv_dtypes: [kd, vd],
        past_dtypes: [pk, pv],
        out_dtypes,
    })))
}

impl AttentionGeneral {
    fn t(&self) -> usize {
        self.past + self.skv
    }

    fn rows(&self) -> usize {
        self.b * self.hq * self.sq
    }

    fn width(&self, which: Kv) -> usize {
        match which {
            Kv::Key => self.dk,
            Kv::Value => self.dv,
        }
    }

    /// Elements of the present output of `which` ([B, Hkv, T, D]).
    fn present_len(&self, which: Kv) -> usize {
        self.b * self.hkv * self.t() * self.width(which)
    }

    /// Element `d` of key (or value) `s` of KV head `hk` of batch entry `b`, as f64: from the
    /// past for `s < past`, else from the node's new K (V), 3-D or 4-D.
    #[allow(clippy::too_many_arguments)]
    fn cached<'ctx>(
        &self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        which: Kv,
        b: IntValue<'ctx>,
        hk: IntValue<'ctx>,
        s: IntValue<'ctx>,
        d: IntValue<'ctx>,
    ) -> Result<FloatValue<'ctx>> {
        let (w, slot) = (self.width(which) as i64, which as usize);
        let bhk = e.add(e.mulc(b, self.hkv as i64)?, hk)?;
        let load_new = |s_new: IntValue<'ctx>| -> Result<FloatValue<'ctx>> {
            let off = if self.three_d {
                let row = e.add(e.mulc(b, self.skv as i64)?, s_new)?;
                e.add(e.mulc(row, self.hkv as i64 * w)?, e.add(e.mulc(hk, w)?, d)?)?
            } else {
                e.add(e.mulc(e.add(e.mulc(bhk, self.skv as i64)?, s_new)?, w)?, d)?
            };
            load_real(e, k.input(1 + slot)?, self.kv_dtypes[slot], off)
        };
        if self.past == 0 {
            return load_new(s);
        }
        let out = e.entry_alloca(e.cx.f64_type(), "kv")?;
        let in_past = e.icmp(IntPredicate::ULT, s, e.i64c(self.past as i64))?;
        e.if_else(
            in_past,
            || {
                let off = e.add(e.mulc(e.add(e.mulc(bhk, self.past as i64)?, s)?, w)?, d)?;
                e.store(
                    out,
                    load_real(e, k.input(4 + slot)?, self.past_dtypes[slot], off)?,
                )
            },
            || e.store(out, load_new(e.sub(s, e.i64c(self.past as i64))?)?),
        )?;
        load_local(e, out)
    }

    /// Copies past ++ new into the present output of `which`, a grid-stride loop.
    fn copy_present<'ctx>(&self, k: &GpuBuilder<'_, 'ctx>, e: &Emit<'_, 'ctx>, which: Kv) -> Result<()> {
        let out = 1 + which as usize;
        if self.out_dtypes.len() <= out {
            return Ok(());
        }
        let (w, t) = (self.width(which) as i64, self.t() as i64);
        k.grid_stride_loop(self.present_len(which) as u64, THREADS, |idx| {
            let bhk = e.udivc(idx, t * w)?;
            let s = e.uremc(e.udivc(idx, w)?, t)?;
            let d = e.uremc(idx, w)?;
            let b = e.udivc(bhk, self.hkv as i64)?;
            let hk = e.uremc(bhk, self.hkv as i64)?;
            let v = self.cached(k, e, which, b, hk, s, d)?;
            store_real(e, k.output(out)?, self.out_dtypes[out], idx, v)
        })
    }

    /// The additive bias of key `jj` for query `i` of head `h` of batch entry `b`: the mask
    /// (bool: 0 or -inf; float: its value; -inf past its last key), plus -inf for each of the
    /// causal, window and nonpad conditions that hides the key — added, as the reference does,
    /// so that a NaN or +inf in a float mask gives NaN.
    #[allow(clippy::too_many_arguments)]
    fn bias<'ctx>(
        &self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        b: IntValue<'ctx>,
        h: IntValue<'ctx>,
        i: IntValue<'ctx>,
        jj: IntValue<'ctx>,
        nonpad_len: Option<IntValue<'ctx>>,
    ) -> Result<FloatValue<'ctx>> {
        let f64t = e.cx.f64_type();
        let ninf = f64t.const_float(f64::NEG_INFINITY);
        let mut v = f64t.const_zero();
        if self.mask != Mask::None {
            let [s0, s1, s2, s3] = self.mask_strides;
            let idx = e.add(
                e.add(e.mulc(b, s0)?, e.mulc(h, s1)?)?,
                e.add(e.mulc(i, s2)?, e.mulc(jj, s3)?)?,
            )?;
            let inside = e.icmp(IntPredicate::ULT, jj, e.i64c(self.mask_len))?;
            let safe = e.select_int(inside, idx, e.i64c(0))?;
            let m = match self.mask {
                Mask::Float(d) => load_real(e, k.input(3)?, d, safe)?,
                _ => {
                    let keep = crate::gen::elementwise::load_one(e, k.input(3)?, DType::Bool, safe)?;
                    e.select_float(keep.into_int_value(), f64t.const_zero(), ninf)?
                }
            };
            v = e.select_float(inside, m, ninf)?;
        }
        let offset = match nonpad_len {
            Some(n) => e.sub(n, e.i64c(self.sq as i64))?,
            None => e.i64c(self.past as i64),
        };
        let pos = e.add(i, offset)?;
        let mut hidden = vec![];
        if self.causal {
            hidden.push(e.icmp(IntPredicate::SGT, jj, pos)?);
        }
        // The window's two sides are one condition in the reference: one -inf at most.
        let before = match self.left >= 0 {
            true => Some(e.icmp(IntPredicate::SGT, e.sub(pos, jj)?, e.i64c(self.left))?),
            false => None,
        };
        let after = match self.right >= 0 {
            true => Some(e.icmp(IntPredicate::SGT, e.sub(jj, pos)?, e.i64c(self.right))?),
            false => None,
        };
        match (before, after) {
            (Some(x), Some(y)) => hidden.push(e.b.build_or(x, y, "").map_err(llvm)?),
            (x, y) => hidden.extend(x.or(y)),
        }
        if let Some(n) = nonpad_len {
            hidden.push(e.icmp(IntPredicate::SGE, jj, n)?);
        }
        for c in hidden {
            let plus = e.b.build_float_add(v, ninf, "").map_err(llvm)?;
            v = e.select_float(c, plus, v)?;
        }
        Ok(v)
    }

    /// Query row `g` (of `B·Hq·Sq`, row-major): scores, softmax, output.
    fn row<'ctx>(&self, k: &GpuBuilder<'_, 'ctx>, e: &Emit<'_, 'ctx>, g: IntValue<'ctx>) -> Result<()> {
        let f64t = e.cx.f64_type();
        let (sq, t) = (self.sq as i64, self.t() as i64);
        let i = e.uremc(g, sq)?;
        let bh = e.udivc(g, sq)?;
        let b = e.udivc(bh, self.hq as i64)?;
        let h = e.uremc(bh, self.hq as i64)?;
        let hk = e.udivc(h, (self.hq / self.hkv) as i64)?;
        let (dk, dv, hq) = (self.dk as i64, self.dv as i64, self.hq as i64);
        let (q0, y0) = match self.three_d {
            true => {
                let row = e.add(e.mulc(b, sq)?, i)?;
                (
                    e.add(e.mulc(row, hq * dk)?, e.mulc(h, dk)?)?,
                    e.add(e.mulc(row, hq * dv)?, e.mulc(h, dv)?)?,
                )
            }
            false => (e.mulc(g, dk)?, e.mulc(g, dv)?),
        };
        let scratch = k.scratch()?;
        let score = |jj: IntValue<'ctx>| -> Result<PointerValue<'ctx>> {
            let at = e.add(e.mulc(g, t)?, jj)?;
            // SAFETY (of the IR): the scratch holds T f64 per row.
            unsafe { e.b.build_in_bounds_gep(f64t, scratch, &[at], "") }.map_err(llvm)
        };
        let qk_out = match self.out_dtypes.get(3) {
            Some(&d) => Some((k.output(3)?, d)),
            None => None,
        };
        let store_qk = |jj: IntValue<'ctx>, v: FloatValue<'ctx>| -> Result<()> {
            match qk_out {
                Some((p, d)) => store_real(e, p, d, e.add(e.mulc(g, t)?, jj)?, v),
                None => Ok(()),
            }
        };
        let nonpad_len = match self.nonpad {
            true => Some(load_index(e, k.input(6)?, DType::I64, b)?),
            false => None,
        };
        let fadd = |a: FloatValue<'ctx>, c: FloatValue<'ctx>| e.b.build_float_add(a, c, "").map_err(llvm);
        let fmul = |a: FloatValue<'ctx>, c: FloatValue<'ctx>| e.b.build_float_mul(a, c, "").map_err(llvm);
        let fdiv = |a: FloatValue<'ctx>, c: FloatValue<'ctx>| e.b.build_float_div(a, c, "").map_err(llvm);
        let scale = round_to(e, self.r, f64t.const_float(self.sqrt_scale))?;
        let ninf = f64t.const_float(f64::NEG_INFINITY);
        let acc = e.entry_alloca(f64t, "acc")?;
        let all_masked = e.entry_alloca(e.cx.bool_type(), "all_masked")?;
        e.store(all_masked, e.cx.bool_type().const_all_ones())?;

        // Scores: (Q·s)(K·s)ᵀ rounded, softcapped, biased.
        e.for_range(e.i64c(0), e.i64c(t), 1, |jj| {
            e.store(acc, f64t.const_zero())?;
            e.for_range(e.i64c(0), e.i64c(dk), 1, |d| {
                let q = load_real(e, k.input(0)?, self.q_dtype, e.add(q0, d)?)?;
                let q = round_to(e, self.r, fmul(q, scale)?)?;
                let kv = round_to(e, self.r, fmul(self.cached(k, e, Kv::Key, b, hk, jj, d)?, scale)?)?;
                e.store(acc, fadd(load_local(e, acc)?, fmul(q, kv)?)?)
            })?;
            let raw = round_to(e, self.r, load_local(e, acc)?)?;
            let mut capped = raw;
            if self.softcap > 0.0 {
                let c = f64t.const_float(self.softcap);
                let x = round_to(e, self.rc, fdiv(raw, c)?)?;
                let th = round_to(e, self.rc, e.call_libm("tanh", &[x])?)?;
                capped = round_to(e, self.rc, fmul(th, c)?)?;
            }
            let bias = self.bias(k, e, b, h, i, jj, nonpad_len)?;
            let masked = e.fcmp_scalar(FloatPredicate::OEQ, bias, ninf)?;
            let all = e.b.build_load(e.cx.bool_type(), all_masked, "").map_err(llvm)?;
            e.store(
                all_masked,
                e.b.build_and(all.into_int_value(), masked, "").map_err(llvm)?,
            )?;
            let biased = round_to(e, self.rb, fadd(capped, bias)?)?;
            match self.qk_mode {
                0 => store_qk(jj, raw)?,
                1 => store_qk(jj, round_to(e, self.r, capped)?)?,
                _ => store_qk(jj, round_to(e, self.r, biased)?)?,
            }
            e.store(score(jj)?, round_to(e, self.rs, biased)?)
        })?;

        // Softmax; a fully masked row gives zeros, a NaN anywhere NaN.
        e.store(acc, ninf)?;
        e.for_range(e.i64c(0), e.i64c(t), 1, |jj| {
            let (x, m) = (load_local(e, score(jj)?)?, load_local(e, acc)?);
            let nan = e.b.build_or(
                e.fcmp_scalar(FloatPredicate::UNO, x, x)?,
                e.fcmp_scalar(FloatPredicate::UNO, m, m)?,
                "",
            );
            let larger = e.select_float(e.fcmp_scalar(FloatPredicate::OGT, x, m)?, x, m)?;
            e.store(
                acc,
                e.select_float(nan.map_err(llvm)?, f64t.const_float(f64::NAN), larger)?,
            )
        })?;
        let max = load_local(e, acc)?;
        let safe = e.select_float(
            e.fcmp_scalar(FloatPredicate::OEQ, max, ninf)?,
            f64t.const_zero(),
            max,
        )?;
        e.store(acc, f64t.const_zero())?;
        e.for_range(e.i64c(0), e.i64c(t), 1, |jj| {
            let p = score(jj)?;
            let z = round_to(
                e,
                self.rs,
                e.b.build_float_sub(load_local(e, p)?, safe, "").map_err(llvm)?,
            )?;
            let x = round_to(e, self.rs, e.call_libm("exp", &[z])?)?;
            e.store(p, x)?;
            e.store(acc, fadd(load_local(e, acc)?, x)?)
        })?;
        let sum = round_to(e, self.rs, load_local(e, acc)?)?;
        let sum = e.select_float(
            e.fcmp_scalar(FloatPredicate::OEQ, sum, f64t.const_zero())?,
            f64t.const_float(1.0),
            sum,
        )?;
        let all =
            e.b.build_load(e.cx.bool_type(), all_masked, "")
                .map_err(llvm)?
                .into_int_value();
        e.for_range(e.i64c(0), e.i64c(t), 1, |jj| {
            let p = score(jj)?;
            let x = round_to(e, self.r, round_to(e, self.rs, fdiv(load_local(e, p)?, sum)?)?)?;
            let x = e.select_float(all, f64t.const_zero(), x)?;
            e.store(p, x)?;
            if self.qk_mode == 3 {
                store_qk(jj, x)?;
            }
            Ok(())
        })?;

        // Output: each column accumulated over the keys.
        let (y, y_dtype) = (k.output(0)?, self.out_dtypes[0]);
        e.for_range(e.i64c(0), e.i64c(dv), 1, |d| {
            e.store(acc, f64t.const_zero())?;
            e.for_range(e.i64c(0), e.i64c(t), 1, |jj| {
                let v = self.cached(k, e, Kv::Value, b, hk, jj, d)?;
                e.store(
                    acc,
                    fadd(load_local(e, acc)?, fmul(load_local(e, score(jj)?)?, v)?)?,
                )
            })?;
            store_real(
                e,
                y,
                y_dtype,
                e.add(y0, d)?,
                round_to(e, self.r, load_local(e, acc)?)?,
            )
        })
    }
}

impl KernelCommon for AttentionGeneral {
    fn describe(&self) -> String {
        let mut s = format!(
            "gpu attention general B={} H={}/{} Sq={} T={} Dk={} Dv={} {:?}",
            self.b,
            self.hq,
            self.hkv,
            self.sq,
            self.t(),
            self.dk,
            self.dv,
            self.r
        );
        let flags = [
            (self.past > 0, format!(" past={}", self.past)),
            (self.causal, " causal".into()),
            (self.softcap > 0.0, format!(" softcap={}", self.softcap)),
            (
                self.left >= 0 || self.right >= 0,
                format!(" window={}..{}", self.left, self.right),
            ),
            (self.out_dtypes.len() > 3, format!(" qk_out={}", self.qk_mode)),
            (self.nonpad, " nonpad".into()),
            (self.mask != Mask::None, " +mask".into()),
        ];
        for (on, text) in flags {
            if on {
                s.push_str(&text);
            }
        }
        s
    }
}

impl GpuKernel for AttentionGeneral {
    fn launch(&self) -> LaunchDims {
        let present = self.present_len(Kv::Key).max(self.present_len(Kv::Value));
        LaunchDims::per_item(self.rows().max(present) as u64, THREADS)
    }

    fn scratch_bytes(&self) -> u64 {
        (self.rows() * self.t() * 8) as u64
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        self.copy_present(k, &e, Kv::Key)?;
        self.copy_present(k, &e, Kv::Value)?;
        k.grid_stride_loop(self.rows() as u64, THREADS, |g| self.row(k, &e, g))?;
        k.ret()
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check};
    use crate::test_rng::TestRng;
    use kiln_ir::{AttentionAttrs, DType, Graph, Op, Tensor, TensorType};

    struct Case {
        dtype: DType,
        three_d: bool,
        /// Batch, query heads, KV heads.
        heads: (usize, usize, usize),
        /// Query rows, new keys, past keys.
        seq: (usize, usize, usize),
        dk: usize,
        dv: usize,
        mask: Option<(DType, Vec<usize>)>,
        nonpad: Option<Vec<i64>>,
        qk_output: bool,
        attrs: AttentionAttrs,
    }

    fn graph(c: &Case) -> (Graph, Vec<Tensor>) {
        let mut rng = TestRng::new(7);
        let (b, hq, hkv) = c.heads;
        let (sq, skv, past) = c.seq;
        let mut g = Graph::new("t");
        let mut ids = vec![];
        let mut inputs = vec![];
        // Input `slot` of the node (absent optional inputs before it stay None).
        let mut add = |g: &mut Graph, slot: usize, dtype: DType, shape: Vec<usize>, v: Tensor| {
            ids.resize(slot, None);
            ids.push(Some(
                g.add_input(format!("in{slot}"), TensorType::fixed(dtype, &shape)),
            ));
            inputs.push(v.cast(dtype));
        };
        let shapes = match c.three_d {
            true => [
                vec![b, sq, hq * c.dk],
                vec![b, skv, hkv * c.dk],
                vec![b, skv, hkv * c.dv],
            ],
            false => [
                vec![b, hq, sq, c.dk],
                vec![b, hkv, skv, c.dk],
                vec![b, hkv, skv, c.dv],
            ],
        };
        for (slot, s) in shapes.into_iter().enumerate() {
            let n = s.iter().product();
            add(
                &mut g,
                slot,
                c.dtype,
                s.clone(),
                Tensor::from_vec(s, rng.vec_scaled(n, 2.0)),
            );
        }
        match &c.mask {
            Some((DType::Bool, s)) => {
                let v: Vec<bool> = (0..s.iter().product())
                    .map(|i: usize| !(i * 7 + i / 3).is_multiple_of(5))
                    .collect();
                add(&mut g, 3, DType::Bool, s.clone(), Tensor::from_vec(s.clone(), v));
            }
            Some((d, s)) => {
                let mut v = rng.vec(s.iter().product());
                // Some keys masked outright, as exporters write -inf.
                v.iter_mut().step_by(7).for_each(|x| *x = f32::NEG_INFINITY);
                add(&mut g, 3, *d, s.clone(), Tensor::from_vec(s.clone(), v));
            }
            None => {}
        }
        if past > 0 {
            for (slot, d) in [(4, c.dk), (5, c.dv)] {
                let s = vec![b, hkv, past, d];
                let n = s.iter().product();
                add(
                    &mut g,
                    slot,
                    c.dtype,
                    s.clone(),
                    Tensor::from_vec(s, rng.vec_scaled(n, 2.0)),
                );
            }
        }
        if let Some(lengths) = &c.nonpad {
            add(
                &mut g,
                6,
                DType::I64,
                vec![b],
                Tensor::from_vec(vec![b], lengths.clone()),
            );
        }
        let mut names: Vec<String> = vec!["y".into()];
        if past > 0 || c.qk_output {
            names.extend(["present_k".into(), "present_v".into()]);
        }
        if c.qk_output {
            names.push("qk".into());
        }
        let mut attrs = c.attrs.clone();
        if c.three_d {
            (attrs.q_num_heads, attrs.kv_num_heads) = (hq, hkv);
        }
        let outs = g
            .add_node("attn", Op::Attention(attrs), ids, names.clone())
            .unwrap();
        for (o, name) in outs.iter().zip(&names) {
            g.add_output(name.as_str(), *o);
        }
        (g, inputs)
    }

    fn check(c: Case) {
        let (g, inputs) = graph(&c);
        let kernels = check_graph(&g, &inputs);
        assert!(
            kernels.iter().all(|k| k.starts_with("gpu attention general")),
            "not the general GPU attention kernel: {kernels:?}"
        );
    }

    #[test]
    fn f16_cache_softcap_causal_qk_output_grouped_heads() {
        check(Case {
            dtype: DType::F16,
            three_d: false,
            heads: (2, 4, 2),
            seq: (3, 3, 5),
            dk: 8,
            dv: 6,
            mask: Some((DType::F16, vec![2, 1, 3, 8])),
            nonpad: None,
            qk_output: true,
            attrs: AttentionAttrs {
                is_causal: true,
                softcap: 2.5,
                qk_matmul_output_mode: 2,
                ..AttentionAttrs::default()
            },
        });
    }

    #[test]
    fn f32_3d_windows_bool_mask_and_the_softmax_output() {
        // 70 query rows: more than one block; a bool mask shorter than the keys.
        check(Case {
            dtype: DType::F32,
            three_d: true,
            heads: (1, 2, 1),
            seq: (70, 40, 0),
            dk: 4,
            dv: 4,
            mask: Some((DType::Bool, vec![70, 30])),
            nonpad: None,
            qk_output: true,
            attrs: AttentionAttrs {
                left_window_size: 6,
                right_window_size: 3,
                qk_matmul_output_mode: 3,
                softmax_precision: Some(DType::F64),
                ..AttentionAttrs::default()
            },
        });
    }

    #[test]
    fn bf16_causal_with_nonpad_lengths() {
        // Lengths none, inside and beyond the keys: the causal diagonal moves with each.
        check(Case {
            dtype: DType::BF16,
            three_d: false,
            heads: (3, 2, 2),
            seq: (4, 9, 0),
            dk: 8,
            dv: 8,
            mask: None,
            nonpad: Some(vec![0, 6, 12]),
            qk_output: false,
            attrs: AttentionAttrs {
                is_causal: true,
                ..AttentionAttrs::default()
            },
        });
    }

    #[test]
    fn ptx_assembles() {
        let (g, _) = graph(&Case {
            dtype: DType::F16,
            three_d: true,
            heads: (1, 4, 2),
            seq: (5, 5, 3),
            dk: 8,
            dv: 8,
            mask: Some((DType::F32, vec![5, 8])),
            nonpad: None,
            qk_output: true,
            attrs: AttentionAttrs {
                softcap: 3.0,
                left_window_size: 2,
                ..AttentionAttrs::default()
            },
        });
        for sm in [80, 90] {
            ptxas_check(&g, sm);
        }
    }
}
