//! Depthwise convolution (group == C == M, NCHW): a direct kernel, one task per (image,
//! channel). The channel's plane is copied into a zero-padded buffer in per-thread scratch, so
//! the inner loops need no bounds checks; outputs are computed a few vectors along the output
//! row at a time (independent FMA chains), with the bias and activation applied in registers.

use super::activation::activation;
use super::emit::Emit;
use super::{llvm, GeneratedKernel, KernelBuilder};
use crate::error::Result;
use crate::kernel::epilogue::{Activation, Bias, Epilogue};
use crate::kernel::geometry::ConvWindow;
use crate::kernel::{KernelCommon, PackedConst, Scratch};
use crate::node::NodeInfo;
use crate::target::TargetDesc;
use inkwell::values::{PointerValue, VectorValue};
use inkwell::IntPredicate;

#[derive(Debug)]
pub struct DwConvKernel {
    batch: usize,
    /// The window over all the channels.
    g: ConvWindow,
    lanes: u32,
    /// Vectors per chunk of an output row.
    unroll: usize,
    /// Output rows per block.
    rows: usize,
    /// Padded plane extents.
    plane_h: usize,
    plane_w: usize,
    activation: Activation,
    has_bias: bool,
    /// A second output: each channel's mean (a fused GlobalAveragePool).
    pool: bool,
    packed: Vec<PackedConst>,
    n_inputs: usize,
}

pub(crate) fn lower(
    node: &NodeInfo,
    target: &TargetDesc,
    epi: Epilogue,
    w: &[f32],
    batch: usize,
    g: ConvWindow,
) -> Result<Option<Box<dyn GeneratedKernel>>> {
    if epi.residual.is_some() || epi.scale != 1.0 || epi.round_bf16 {
        return Ok(None);
    }
    let bias = match &epi.bias {
        Bias::None => None,
        Bias::PerRow(v) if v.len() == g.c => Some(v.clone()),
        Bias::PerRow(_) | Bias::PerCol(_) => return Ok(None),
    };
    let lanes = target.f32_lanes();
    let l = lanes as usize;
    let unroll = g.ow.div_ceil(l).clamp(1, 4);
    // About 8 accumulators: two FMA pipes of latency 4.
    let rows = (8 / unroll).clamp(1, g.oh.max(1));
    let cw = unroll * l;
    let nchunks = g.ow.div_ceil(cw);
    // Furthest column read: the last chunk's last lane at the last tap, plus one for the
    // stride-2 double-width loads.
    let max_col = (nchunks * cw - 1) * g.sw + (g.kw - 1) * g.dw + g.sw;
    let plane_w = (g.w + 2 * g.pw).max(max_col + 1).max(g.w + g.pw);
    let plane_h = (g.h + g.ph).max((g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1);
    let total = batch * g.c * g.h * g.w;
    if total >= (1 << 31) || plane_h * plane_w >= (1 << 31) {
        return Ok(None);
    }
    let mut packed = vec![PackedConst {
        bytes: w.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }];
    if let Some(b) = &bias {
        packed.push(PackedConst {
            bytes: b.iter().flat_map(|x| x.to_le_bytes()).collect(),
        });
    }
    Ok(Some(Box::new(DwConvKernel {
        batch,
        g,
        lanes,
        unroll,
        rows,
        plane_h,
        plane_w,
        activation: epi.activation,
        has_bias: bias.is_some(),
        pool: epi.pool_mean,
        packed,
        n_inputs: node.n_inputs(),
    })))
}

impl KernelCommon for DwConvKernel {
    fn describe(&self) -> String {
        let g = &self.g;
        format!(
            "dwconv{}x{}/{} C={} {}x{} -> {}x{} lanes={} unroll={} rows={}{}",
            g.kh,
            g.kw,
            g.sh,
            g.c,
            g.h,
            g.w,
            g.oh,
            g.ow,
            self.lanes,
            self.unroll,
            self.rows,
            if self.pool { " + mean" } else { "" }
        )
    }

    fn packed_constants(&self) -> &[PackedConst] {
        &self.packed
    }

    fn release_packed_constants(&mut self) {
        PackedConst::release_all(&mut self.packed)
    }

    fn reads_input(&self, i: usize) -> bool {
        i == 0
    }
}

impl GeneratedKernel for DwConvKernel {
    fn scratch(&self) -> Scratch {
        Scratch {
            shared_bytes: 0,
            per_thread_bytes: ((self.plane_h * self.plane_w * 4) as u64).div_ceil(64) * 64,
        }
    }

    fn emit(&self, k: &KernelBuilder<'_, '_>) -> Result<()> {
        let task = k.new_task_function("task");
        let tb = k.cx.create_builder();
        let entry = k.cx.append_basic_block(task, "entry");
        tb.position_at_end(entry);
        let e = Emit::new(k.cx, k.module, &tb, task).with_target(k.target);
        self.emit_task(&e, k)?;
        tb.build_return(None).map_err(llvm)?;

        let me = Emit::new(k.cx, k.module, k.builder, k.function).with_target(k.target);
        let data = me.entry_alloca(me.ptr_ty().array_type(2), "taskdata")?;
        me.store(data, k.ctx())?;
        let args = k
            .function
            .get_nth_param(1)
            .expect("kernel has args")
            .into_pointer_value();
        me.store(me.gep_ptr(data, 1)?, args)?;
        k.parallel_for(task, data, me.i64c((self.batch * self.g.c) as i64))?;
        k.ret_ok()
    }
}

impl DwConvKernel {
    fn emit_task<'ctx>(&self, e: &Emit<'_, 'ctx>, k: &KernelBuilder<'_, 'ctx>) -> Result<()> {
        let g = self.g;
        let b = e.b;
        let f = e.f;
        let data = f.get_nth_param(0).expect("task data").into_pointer_value();
        let t = f.get_nth_param(1).expect("task index").into_int_value();
        let tid = f.get_nth_param(2).expect("task tid").into_int_value();
        let ctx = e.load_ptr(data)?;
        let args = e.load_ptr(e.gep_ptr(data, 1)?)?;
        let slot = |i: usize| -> Result<PointerValue<'ctx>> { e.load_ptr(e.gep_ptr(args, i as i64)?) };
        let lanes = self.lanes;
        let l = lanes as i64;
        let (pw_, ph_) = (self.plane_w as i64, self.plane_h as i64);
        let ch = e.uremc(t, g.c as i64)?;
        let x = e.gep_f32(slot(0)?, e.mulc(t, (g.h * g.w) as i64)?)?;
        let y = e.gep_f32(slot(self.n_inputs)?, e.mulc(t, (g.oh * g.ow) as i64)?)?;
        let n_out = 1 + usize::from(self.pool);
        let wts = e.gep_f32(slot(self.n_inputs + n_out)?, e.mulc(ch, (g.kh * g.kw) as i64)?)?;
        let plane = k.thread_scratch(b, ctx, tid)?;

        b.build_memset(plane, 64, e.cx.i8_type().const_zero(), e.i64c(ph_ * pw_ * 4))
            .map_err(llvm)?;
        e.for_n(g.h as i64, |ih| {
            let dst = e.gep_f32(
                plane,
                e.addc(e.mulc(e.addc(ih, g.ph as i64)?, pw_)?, g.pw as i64)?,
            )?;
            let src = e.gep_f32(x, e.mulc(ih, g.w as i64)?)?;
            b.build_memcpy(dst, 4, src, 4, e.i64c((g.w * 4) as i64))
                .map_err(llvm)?;
            Ok(())
        })?;

        let taps = g.kh * g.kw;
        let wv: Vec<VectorValue> = (0..taps)
            .map(|i| e.splat(e.load_f32(e.gep_f32c(wts, i as i64)?)?, lanes))
            .collect::<Result<_>>()?;
        let bias = if self.has_bias {
            e.splat(
                e.load_f32(e.gep_f32(slot(self.n_inputs + n_out + 1)?, ch)?)?,
                lanes,
            )?
        } else {
            e.zero_vec(lanes)
        };
        let u = self.unroll;
        let cw = u as i64 * l;
        let nchunks = super::cdiv(g.ow as i64, cw);
        let tmp = e.entry_alloca(e.cx.f32_type().array_type(cw as u32), "tmp")?;
        let i32t = e.cx.i32_type();
        let even: Vec<_> = (0..lanes).map(|i| i32t.const_int(2 * i as u64, false)).collect();
        let even = inkwell::types::VectorType::const_vector(&even);

        // Output rows are computed `rows` at a time: rows x unroll independent accumulators
        // hide the FMA latency even on 7- and 14-wide planes, and each loaded input vector
        // feeds every output row of the block whose window covers it.
        let rb = self.rows;
        let full_blocks = g.oh / rb;
        let row_block = |oh0: inkwell::values::IntValue<'ctx>, r: usize| -> Result<()> {
            let rowbase = e.gep_f32(plane, e.mulc(oh0, g.sh as i64 * pw_)?)?;
            let yrow = e.gep_f32(y, e.mulc(oh0, g.ow as i64)?)?;
            e.for_n(nchunks, |chunk| {
                let ow0 = e.mulc(chunk, cw)?;
                let mut acc = vec![vec![bias; u]; r];
                let in_rows = (r - 1) * g.sh + (g.kh - 1) * g.dh + 1;
                for ir in 0..in_rows {
                    // Output rows i of the block reading input row ir, with their tap row.
                    let users: Vec<(usize, usize)> = (0..r)
                        .filter_map(|i| {
                            let d = ir.checked_sub(i * g.sh)?;
                            (d % g.dh == 0 && d / g.dh < g.kh).then_some((i, d / g.dh))
                        })
                        .collect();
                    if users.is_empty() {
                        continue;
                    }
                    for kw in 0..g.kw {
                        let off = e.addc(e.mulc(ow0, g.sw as i64)?, ir as i64 * pw_ + (kw * g.dw) as i64)?;
                        let p = e.gep_f32(rowbase, off)?;
                        // `ui` indexes the second axis of the row-by-vector accumulator grid.
                        #[allow(clippy::needless_range_loop)]
                        for ui in 0..u {
                            let pu = e.gep_f32c(p, ui as i64 * l * g.sw as i64)?;
                            let v = match g.sw {
                                1 => e.load_vec(pu, lanes)?,
                                2 => {
                                    let wide = e.load_vec(pu, 2 * lanes)?;
                                    b.build_shuffle_vector(wide, wide, even, "").map_err(llvm)?
                                }
                                s => {
                                    let mut v = e.vty(lanes).get_poison();
                                    for j in 0..lanes {
                                        let s = e.load_f32(e.gep_f32c(pu, j as i64 * s as i64)?)?;
                                        v = b
                                            .build_insert_element(v, s, e.i32c(j as i32), "")
                                            .map_err(llvm)?;
                                    }
                                    v
                                }
                            };
                            for &(i, kh) in &users {
                                acc[i][ui] = e.fma(wv[kh * g.kw + kw], v, acc[i][ui])?;
                            }
                        }
                    }
                }
                let full = e.icmp(IntPredicate::ULE, e.addc(ow0, cw)?, e.i64c(g.ow as i64))?;
                for (i, acc) in acc.into_iter().enumerate() {
                    let acc: Vec<VectorValue> = acc
                        .into_iter()
                        .map(|a| activation(e, self.activation, a, lanes))
                        .collect::<Result<_>>()?;
                    let dst = e.gep_f32(yrow, e.addc(ow0, (i * g.ow) as i64)?)?;
                    e.if_else(
                        full,
                        || {
                            for (ui, a) in acc.iter().enumerate() {
                                e.store(e.gep_f32c(dst, ui as i64 * l)?, *a)?;
                            }
                            Ok(())
                        },
                        || {
                            for (ui, a) in acc.iter().enumerate() {
                                e.store(e.gep_f32c(tmp, ui as i64 * l)?, *a)?;
                            }
                            let rest = e.sub(e.i64c(g.ow as i64), ow0)?;
                            e.for_range(e.i64c(0), rest, 1, |j| {
                                let v = e.load_f32(e.gep_f32(tmp, j)?)?;
                                e.store(e.gep_f32(dst, j)?, v)
                            })
                        },
                    )?;
                }
                Ok(())
            })
        };
        e.for_n(full_blocks as i64, |blk| row_block(e.mulc(blk, rb as i64)?, rb))?;
        if !g.oh.is_multiple_of(rb) {
            row_block(e.i64c((full_blocks * rb) as i64), g.oh % rb)?;
        }
        if self.pool {
            // The channel's plane was just written and is still in cache: sum it in
            // `lanes`-wide partial sums, then the tail, in a fixed order (deterministic).
            let n = (g.oh * g.ow) as i64;
            let nv = n / l * l;
            let acc = e.entry_alloca(e.vty(lanes), "poolacc")?;
            e.store(acc, e.zero_vec(lanes))?;
            e.for_range(e.i64c(0), e.i64c(nv), l, |i| {
                let v = e.load_vec(e.gep_f32(y, i)?, lanes)?;
                let a = b
                    .build_load(e.vty(lanes), acc, "")
                    .map_err(llvm)?
                    .into_vector_value();
                e.store(acc, e.fadd(a, v)?)
            })?;
            let a = b
                .build_load(e.vty(lanes), acc, "")
                .map_err(llvm)?
                .into_vector_value();
            let mut sum = e.f32c(0.0);
            for j in 0..lanes {
                let x = b
                    .build_extract_element(a, e.i32c(j as i32), "")
                    .map_err(llvm)?
                    .into_float_value();
                sum = b.build_float_add(sum, x, "").map_err(llvm)?;
            }
            let sacc = e.entry_alloca(e.cx.f32_type(), "poolsum")?;
            e.store(sacc, sum)?;
            e.for_range(e.i64c(nv), e.i64c(n), 1, |i| {
                let s = e.load_f32(sacc)?;
                let x = e.load_f32(e.gep_f32(y, i)?)?;
                e.store(sacc, b.build_float_add(s, x, "").map_err(llvm)?)
            })?;
            let mean = b
                .build_float_mul(e.load_f32(sacc)?, e.f32c(1.0 / n as f32), "")
                .map_err(llvm)?;
            e.store(e.gep_f32(slot(self.n_inputs + 1)?, t)?, mean)?;
        }
        Ok(())
    }
}
