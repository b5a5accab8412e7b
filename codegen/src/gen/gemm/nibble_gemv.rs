//! Matrix-vector products on block-quantized weights (BlockQuantizedMatMul with at most
//! `GEMV_MAX_ROWS` rows of A: a language model decoding a token), from the same packed nibbles
//! as the GEMM (`nibbles`), without its f32 panels.
//!
//! Where the GEMM dequantizes every weight to `(q - zp) · scale` into scratch and multiplies it
//! there, this kernel multiplies the integers as they are loaded and scales once per block:
//!
//! ```text
//! y[r, j] = Σ_b scale[j, b] · Σ_{k in block b} a[r, k] · (q[k, j] - zp[j, b])
//! ```
//!
//! Per 32 weights that is one byte load, `and`/`shift`, two integer subtractions, two
//! conversions and one FMA per row and vector: about half the GEMM path's instructions and no
//! f32 panel written and read back, which at one row is all of the work (the GEMM path ran at
//! half the f32 kernel's speed with the weights in cache). Each block sums in two accumulators
//! per vector (even and odd k) so that the FMAs of consecutive k do not wait on each other.
//! The sums round differently from the GEMM's (the scale applied to a block's sum, not to each
//! weight), within the same f32 error bounds.
//!
//! Tasks are runs of column panels (NR columns, the GEMM's panels); the epilogue (scale, column
//! bias, residual input, activation) runs on the accumulators and stores with a mask past N.

use super::Tile;
use crate::error::Result;
use crate::gen::activation::activation;
use crate::gen::emit::Emit;
use crate::gen::{llvm, GeneratedKernel, KernelBuilder};
use crate::kernel::epilogue::{Activation, Bias, Epilogue, Residual};
use crate::kernel::{KernelCommon, PackedConst};
use inkwell::values::{IntValue, PointerValue};
use inkwell::IntPredicate;

/// The most rows of A this kernel takes; more go to the GEMM, whose tiles share each unpacked
/// weight between 12 rows.
pub(super) const GEMV_MAX_ROWS: usize = 4;

/// Tasks per product at most (runs of panels), enough to keep every thread busy.
const MAX_TASKS: usize = 32;

#[derive(Debug)]
pub(crate) struct NibbleGemv {
    tile: Tile,
    m: usize,
    n: usize,
    k: usize,
    block: usize,
    /// The weights (slot 0) and the padded column bias (slot 1, when there is one).
    packed: Vec<PackedConst>,
    /// Byte offset of the scales in the weights (`nibbles::params_offset`).
    params_at: usize,
    n_inputs: usize,
    scale: f32,
    residual: Option<usize>,
    activation: Activation,
}

impl NibbleGemv {
    /// Whether this kernel computes `m` rows of `n` columns with epilogue `epi`: at most
    /// `GEMV_MAX_ROWS` rows, and an epilogue of a scale, a column bias, a residual input and an
    /// activation.
    pub(super) fn accepts(m: usize, n: usize, epi: &Epilogue) -> bool {
        let simple = !epi.pool_mean
            && !epi.round_bf16
            && epi.input_scale.is_none()
            && epi.dequantize.is_none()
            && epi.quantize.is_none()
            && !matches!(epi.residual, Some(Residual::Const(_) | Residual::Skip { .. }));
        let bias = match &epi.bias {
            Bias::None => true,
            Bias::PerCol(v) => v.len() == n,
            Bias::PerRow(_) => false,
        };
        (1..=GEMV_MAX_ROWS).contains(&m) && simple && bias
    }

    /// The kernel (see `accepts`) for `weights` packed by `nibbles::pack`, their scales from
    /// byte `params_at`.
    pub(super) fn new(
        tile: Tile,
        (m, n, k, block): (usize, usize, usize, usize),
        (weights, params_at): (PackedConst, usize),
        n_inputs: usize,
        epi: &Epilogue,
    ) -> NibbleGemv {
        let mut packed = vec![weights];
        if let Bias::PerCol(v) = &epi.bias {
            let mut p = v.clone();
            p.resize(n + tile.nr(), 0.0);
            packed.push(PackedConst::from_f32s(&p));
        }
        let residual = match &epi.residual {
            Some(Residual::Input(i)) => Some(*i),
            _ => None,
        };
        NibbleGemv {
            tile,
            m,
            n,
            k,
            block,
            packed,
            params_at,
            n_inputs: n_inputs.max(residual.map_or(0, |i| i + 1)),
            scale: epi.scale,
            residual,
            activation: epi.activation,
        }
    }

    fn panels(&self) -> usize {
        self.n.div_ceil(self.tile.nr())
    }

    fn panels_per_task(&self) -> usize {
        self.panels().div_ceil(MAX_TASKS)
    }

    fn tasks(&self) -> usize {
        self.panels().div_ceil(self.panels_per_task())
    }

    fn emit_task<'ctx>(&self, e: &Emit<'_, 'ctx>) -> Result<()> {
        let lanes = self.tile.lanes;
        let nr = self.tile.nr() as i64;
        let (m, n, k, block) = (self.m, self.n as i64, self.k as i64, self.block as i64);
        let n_padded = self.n.div_ceil(self.tile.nr()) * self.tile.nr();
        let blocks = self.k.div_ceil(self.block) as i64;
        let f = e.f;
        let data = f.get_nth_param(0).expect("task data").into_pointer_value();
        let t = f.get_nth_param(1).expect("task index").into_int_value();
        let args = e.load_ptr(e.gep_ptr(data, 1)?)?;
        let slot = |i: usize| -> Result<PointerValue<'ctx>> { e.load_ptr(e.gep_ptr(args, i as i64)?) };
        let a = slot(0)?;
        let y = slot(self.n_inputs)?;
        let blob = slot(self.n_inputs + 1)?;
        let bias = if self.packed.len() > 1 {
            Some(slot(self.n_inputs + 2)?)
        } else {
            None
        };
        let residual = match self.residual {
            Some(i) => Some(slot(i)?),
            None => None,
        };
        let params = e.gep_u8(blob, e.i64c(self.params_at as i64))?;
        let zero_points = e.gep_u8(params, e.i64c(blocks * n_padded as i64 * 4))?;
        let vty = e.vty(lanes);
        // Accumulators in stack slots (promoted to registers): per row and half of the panel,
        // the product so far and the current block's two partial sums.
        let mut total = vec![];
        let mut part = vec![];
        for r in 0..m {
            for h in 0..2 {
                total.push(e.entry_alloca(vty, &format!("acc{r}_{h}"))?);
                for u in 0..2 {
                    part.push(e.entry_alloca(vty, &format!("part{r}_{h}_{u}"))?);
                }
            }
        }
        let part_at = |r: usize, h: usize, u: usize| part[(r * 2 + h) * 2 + u];
        let low = e.splat_i32(e.i32c(15), lanes)?;
        let shift = e.splat_i32(e.i32c(4), lanes)?;
        let n_panels = e.i64c(self.panels() as i64);
        let p0 = e.mulc(t, self.panels_per_task() as i64)?;
        let p1 = e.umin(e.addc(p0, self.panels_per_task() as i64)?, n_panels)?;
        e.for_range(p0, p1, 1, |p| {
            let col = e.mulc(p, nr)?;
            let rows = e.gep_u8(blob, e.mulc(p, k * lanes as i64)?)?;
            for acc in &total {
                e.store(*acc, e.zero_vec(lanes))?;
            }
            e.for_range(e.i64c(0), e.i64c(blocks), 1, |b| {
                let k0 = e.mulc(b, block)?;
                let k1 = e.umin(e.addc(k0, block)?, e.i64c(k))?;
                let param_row = e.add(e.mulc(b, n_padded as i64)?, col)?;
                let mut zeros = vec![];
                let mut scales = vec![];
                for h in 0..2i64 {
                    let at = e.addc(param_row, h * lanes as i64)?;
                    scales.push(e.load_vec(e.gep_f32(params, at)?, lanes)?);
                    zeros.push(e.load_u8s_as_i32s(e.gep_u8(zero_points, at)?, lanes)?);
                }
                for slot in &part {
                    e.store(*slot, e.zero_vec(lanes))?;
                }
                // Row `kk` of the block into partial sum `u`.
                let step = |kk: IntValue<'ctx>, u: usize| -> Result<()> {
                    let wide = e.load_u8s_as_i32s(e.gep_u8(rows, e.mulc(kk, lanes as i64)?)?, lanes)?;
                    let halves = [
                        e.b.build_and(wide, low, "").map_err(llvm)?,
                        e.b.build_right_shift(wide, shift, false, "").map_err(llvm)?,
                    ];
                    for (h, q) in halves.into_iter().enumerate() {
                        let centred = e.b.build_int_sub(q, zeros[h], "").map_err(llvm)?;
                        let qf = e.b.build_signed_int_to_float(centred, vty, "").map_err(llvm)?;
                        for r in 0..m {
                            let x = e.load_f32(e.gep_f32(a, e.add(e.i64c((r * self.k) as i64), kk)?)?)?;
                            let s = part_at(r, h, u);
                            let sum = e.fma(qf, e.splat(x, lanes)?, e.load_vec(s, lanes)?)?;
                            e.store(s, sum)?;
                        }
                    }
                    Ok(())
                };
                // Pairs of rows, then the odd one out of a cut last block.
                let len = e.sub(k1, k0)?;
                let pairs_end = e.add(k0, e.mulc(e.udivc(len, 2)?, 2)?)?;
                e.for_range(k0, pairs_end, 2, |kk| {
                    step(kk, 0)?;
                    step(e.addc(kk, 1)?, 1)
                })?;
                e.if_then(e.icmp(IntPredicate::ULT, pairs_end, k1)?, || step(pairs_end, 0))?;
                for r in 0..m {
                    for h in 0..2 {
                        let sum = e.fadd(
                            e.load_vec(part_at(r, h, 0), lanes)?,
                            e.load_vec(part_at(r, h, 1), lanes)?,
                        )?;
                        let acc = total[r * 2 + h];
                        let scaled = e.fma(sum, scales[h], e.load_vec(acc, lanes)?)?;
                        e.store(acc, scaled)?;
                    }
                }
                Ok(())
            })?;
            // The epilogue, and the store of the columns below N.
            let i32t = e.cx.i32_type();
            for h in 0..2i64 {
                let first = e.addc(col, h * lanes as i64)?;
                let first32 = e.b.build_int_truncate(first, i32t, "").map_err(llvm)?;
                let cols =
                    e.b.build_int_add(e.iota_i32(lanes), e.splat_i32(first32, lanes)?, "")
                        .map_err(llvm)?;
                let valid =
                    e.b.build_int_compare(IntPredicate::SLT, cols, e.splat_i32(e.i32c(n as i32), lanes)?, "")
                        .map_err(llvm)?;
                for r in 0..m {
                    let mut v = e.load_vec(total[r * 2 + h as usize], lanes)?;
                    if self.scale != 1.0 {
                        v = e.fmul(v, e.splat(e.f32c(self.scale), lanes)?)?;
                    }
                    if let Some(bias) = bias {
                        v = e.fadd(v, e.load_vec(e.gep_f32(bias, first)?, lanes)?)?;
                    }
                    let at = e.add(e.i64c(r as i64 * n), first)?;
                    if let Some(res) = residual {
                        v = e.fadd(v, e.masked_load(e.gep_f32(res, at)?, valid, lanes)?)?;
                    }
                    v = activation(e, self.activation, v, lanes)?;
                    e.masked_store(e.gep_f32(y, at)?, v, valid, 4)?;
                }
            }
            Ok(())
        })
    }
}

impl KernelCommon for NibbleGemv {
    fn describe(&self) -> String {
        format!(
            "gemv-4bit {}-lane M={} N={} K={} block={} tasks={}",
            self.tile.lanes,
            self.m,
            self.n,
            self.k,
            self.block,
            self.tasks()
        )
    }

    fn packed_constants(&self) -> &[PackedConst] {
        &self.packed
    }

    fn release_packed_constants(&mut self) {
        PackedConst::release_all(&mut self.packed)
    }

    /// A, and the residual; the weights' integers, scales and zero points are packed.
    fn reads_input(&self, i: usize) -> bool {
        i == 0 || self.residual == Some(i)
    }
}

impl GeneratedKernel for NibbleGemv {
    fn emit(&self, k: &KernelBuilder<'_, '_>) -> Result<()> {
        let task = k.new_task_function("gemv");
        let tb = k.cx.create_builder();
        let entry = k.cx.append_basic_block(task, "entry");
        tb.position_at_end(entry);
        let e = Emit::new(k.cx, k.module, &tb, task).with_target(k.target);
        self.emit_task(&e)?;
        tb.build_return(None).map_err(llvm)?;

        let me = Emit::new(k.cx, k.module, k.builder, k.function).with_target(k.target);
        let data = me.entry_alloca(me.ptr_ty().array_type(2), "taskdata")?;
        me.store(data, k.ctx())?;
        me.store(me.gep_ptr(data, 1)?, k.args())?;
        k.parallel_for(task, data, me.i64c(self.tasks() as i64))?;
        k.ret_ok()
    }
}
