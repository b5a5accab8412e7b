//! Depthwise channels-last (NHWC) convolution (group == C == M): one task per output row,
//! vectorized along the channels, whose taps' weights are laid out `[tap][C]`; the bias,
//! residual and activation are applied in registers.
//!
//! A depthwise convolution does one FMA per input element it loads, so a kernel that loads the
//! input and the weight for every FMA runs at the load ports' rate, half the FMA pipes'. The
//! window's **interior** columns (every tap column inside the image, known at compile time)
//! are therefore computed `PIXELS` output pixels at a time: each tap's weight vectors are
//! loaded once for the block and each input vector once per tap row (neighbouring pixels'
//! windows overlap), about 0.75 loads per FMA for a 3×3 window at stride 1. The border
//! columns, where taps fall outside the image, go one pixel at a time with a bounds check per
//! tap.

use super::activation::activation;
use super::emit::Emit;
use super::{llvm, GeneratedKernel, KernelBuilder};
use crate::error::Result;
use crate::kernel::epilogue::{Activation, Bias, Epilogue, Residual};
use crate::kernel::geometry::ConvWindow;
use crate::kernel::{KernelCommon, PackedConst, Scratch};
use crate::node::NodeInfo;
use crate::target::TargetDesc;
use inkwell::values::{IntValue, PointerValue, VectorValue};
use inkwell::IntPredicate;

/// Output pixels per register block in the interior columns.
const PIXELS: usize = 4;

/// Depthwise NHWC convolution (group == C == M).
#[derive(Debug)]
pub struct DwNhwcKernel {
    batch: usize,
    /// The window over all the channels.
    g: ConvWindow,
    lanes: u32,
    /// Vectors of channels per step (independent accumulators per pixel).
    unroll: usize,
    /// Channels padded to a multiple of `lanes` (the packed weight and bias rows).
    cpad: usize,
    activation: Activation,
    has_bias: bool,
    residual: Option<usize>,
    /// The output is stored as bf16 (`GeneratedKernel::store_bf16`).
    bf16_out: bool,
    packed: Vec<PackedConst>,
    n_inputs: usize,
}

pub(crate) fn lower_dw(
    node: &NodeInfo,
    target: &TargetDesc,
    epi: Epilogue,
    w: &[f32],
    batch: usize,
    g: ConvWindow,
) -> Result<Option<Box<dyn GeneratedKernel>>> {
    if epi.scale != 1.0 || epi.round_bf16 {
        return Ok(None);
    }
    let bias = match &epi.bias {
        Bias::None => None,
        Bias::PerRow(v) | Bias::PerCol(v) if v.len() == g.c => Some(v.clone()),
        Bias::PerRow(_) | Bias::PerCol(_) => return Ok(None),
    };
    let residual = match &epi.residual {
        None => None,
        Some(Residual::Input(i)) if node.input_shape(*i)? == node.output_shape(0)? => Some(*i),
        Some(_) => return Ok(None),
    };
    let total = (batch * g.h * g.w * g.c).max(batch * g.oh * g.ow * g.c);
    if total >= (1 << 31) {
        return Ok(None);
    }
    let lanes = target.f32_lanes();
    // A block holds PIXELS × unroll accumulators, the unroll weight vectors and a few inputs:
    // 16 + 4 + … of AVX-512's 32 registers, 8 + 2 + … of AVX2's 16.
    let unroll = if lanes >= 16 { 4 } else { 2 };
    let cpad = g.c.div_ceil(lanes as usize) * lanes as usize;
    let taps = g.kh * g.kw;
    let mut wt = vec![0f32; taps * cpad];
    for ch in 0..g.c {
        for t in 0..taps {
            wt[t * cpad + ch] = w[ch * taps + t];
        }
    }
    let bytes = |v: &[f32]| PackedConst {
        bytes: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    };
    let mut packed = vec![bytes(&wt)];
    if let Some(mut b) = bias.clone() {
        b.resize(cpad, 0.0);
        packed.push(bytes(&b));
    }
    Ok(Some(Box::new(DwNhwcKernel {
        batch,
        g,
        lanes,
        unroll,
        cpad,
        activation: epi.activation,
        has_bias: bias.is_some(),
        residual,
        bf16_out: false,
        packed,
        n_inputs: node.n_inputs(),
    })))
}

/// The output columns `[lo, hi)` whose every tap column lies inside the image.
fn interior_columns(g: &ConvWindow) -> (usize, usize) {
    let lo = g.pw.div_ceil(g.sw).min(g.ow);
    // ow·sw − pw + (kw − 1)·dw ≤ w − 1
    let reach = (g.w - 1 + g.pw).checked_sub((g.kw - 1) * g.dw);
    let hi = reach.map_or(0, |r| (r / g.sw + 1).min(g.ow));
    (lo, hi.max(lo))
}

impl KernelCommon for DwNhwcKernel {
    fn describe(&self) -> String {
        let g = &self.g;
        format!(
            "dwconv{}x{}/{} nhwc C={} {}x{} -> {}x{} lanes={}",
            g.kh, g.kw, g.sh, g.c, g.h, g.w, g.oh, g.ow, self.lanes
        )
    }

    fn packed_constants(&self) -> &[PackedConst] {
        &self.packed
    }

    fn release_packed_constants(&mut self) {
        PackedConst::release_all(&mut self.packed)
    }

    fn reads_input(&self, i: usize) -> bool {
        i == 0 || Some(i) == self.residual
    }
}

impl GeneratedKernel for DwNhwcKernel {
    fn can_store_bf16(&self) -> bool {
        true
    }

    fn store_bf16(&mut self) {
        self.bf16_out = true;
    }

    fn scratch(&self) -> Scratch {
        Scratch::default()
    }

    fn emit(&self, k: &KernelBuilder<'_, '_>) -> Result<()> {
        let task = k.new_task_function("task");
        let tb = k.cx.create_builder();
        let entry = k.cx.append_basic_block(task, "entry");
        tb.position_at_end(entry);
        let e = Emit::new(k.cx, k.module, &tb, task).with_target(k.target);
        self.emit_task(&e)?;
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
        k.parallel_for(task, data, me.i64c((self.batch * self.g.oh) as i64))?;
        k.ret_ok()
    }
}

/// One task's pointers and the accumulators its blocks share.
struct Row<'ctx> {
    /// The task's image.
    x: PointerValue<'ctx>,
    /// The task's output row (f32 or bf16 elements) and, with a residual, the residual's.
    y: PointerValue<'ctx>,
    r: Option<PointerValue<'ctx>>,
    wts: PointerValue<'ctx>,
    bias: Option<PointerValue<'ctx>>,
    /// The first input row of the window: oh·sh − ph.
    ihb: IntValue<'ctx>,
    /// `accs[p][j]`: pixel p of a block, channel vector j (full-width vectors); `acc1[p]` for
    /// the channels past the last whole vector.
    accs: Vec<Vec<PointerValue<'ctx>>>,
    acc1: Vec<PointerValue<'ctx>>,
}

impl DwNhwcKernel {
    fn emit_task<'ctx>(&self, e: &Emit<'_, 'ctx>) -> Result<()> {
        let g = self.g;
        let f = e.f;
        let data = f.get_nth_param(0).expect("task data").into_pointer_value();
        let t = f.get_nth_param(1).expect("task index").into_int_value();
        let args = e.load_ptr(e.gep_ptr(data, 1)?)?;
        let slot = |i: usize| -> Result<PointerValue<'ctx>> { e.load_ptr(e.gep_ptr(args, i as i64)?) };
        let c = g.c as i64;
        let n = e.udivc(t, g.oh as i64)?;
        let oh = e.uremc(t, g.oh as i64)?;
        // Accumulators live in allocas: a tap row outside the image is skipped by a branch.
        let accs = (0..PIXELS)
            .map(|p| {
                (0..self.unroll)
                    .map(|j| e.entry_alloca(e.vty(self.lanes), &format!("acc{p}_{j}")))
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<_>>()?;
        let acc1 = (0..PIXELS)
            .map(|p| e.entry_alloca(e.vty(1), &format!("acc{p}")))
            .collect::<Result<_>>()?;
        let row = Row {
            x: e.gep_f32(slot(0)?, e.mulc(n, (g.h * g.w) as i64 * c)?)?,
            y: {
                let (y, at) = (slot(self.n_inputs)?, e.mulc(t, g.ow as i64 * c)?);
                if self.bf16_out {
                    e.gep_bf16(y, at)?
                } else {
                    e.gep_f32(y, at)?
                }
            },
            r: match self.residual {
                Some(i) => Some(e.gep_f32(slot(i)?, e.mulc(t, g.ow as i64 * c)?)?),
                None => None,
            },
            wts: slot(self.n_inputs + 1)?,
            bias: if self.has_bias {
                Some(slot(self.n_inputs + 2)?)
            } else {
                None
            },
            ihb: e.addc(e.mulc(oh, g.sh as i64)?, -(g.ph as i64))?,
            accs,
            acc1,
        };

        let (lo, hi) = interior_columns(&g);
        let blocks = (hi - lo) / PIXELS;
        let blocked_end = lo + blocks * PIXELS;
        let border = |ow: IntValue<'ctx>| self.channels(e, &row, ow, 1, false);
        e.for_range(e.i64c(0), e.i64c(lo as i64), 1, border)?;
        e.for_range(
            e.i64c(lo as i64),
            e.i64c(blocked_end as i64),
            PIXELS as i64,
            |ow0| self.channels(e, &row, ow0, PIXELS, true),
        )?;
        e.for_range(e.i64c(blocked_end as i64), e.i64c(g.ow as i64), 1, border)
    }

    /// Every channel of `pixels` output pixels from column `ow0`: blocks of `unroll` vectors,
    /// then single vectors, then single channels.
    fn channels<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        row: &Row<'ctx>,
        ow0: IntValue<'ctx>,
        pixels: usize,
        interior: bool,
    ) -> Result<()> {
        let (c, l) = (self.g.c, self.lanes as usize);
        let after_blocks = c / (self.unroll * l) * self.unroll * l;
        let after_vecs = after_blocks + (c - after_blocks) / l * l;
        let block = |c0, lanes, u| self.block(e, row, ow0, pixels, interior, c0, lanes, u);
        e.for_range(
            e.i64c(0),
            e.i64c(after_blocks as i64),
            (self.unroll * l) as i64,
            |c0| block(c0, self.lanes, self.unroll),
        )?;
        e.for_range(
            e.i64c(after_blocks as i64),
            e.i64c(after_vecs as i64),
            l as i64,
            |c0| block(c0, self.lanes, 1),
        )?;
        e.for_range(e.i64c(after_vecs as i64), e.i64c(c as i64), 1, |c0| {
            block(c0, 1, 1)
        })
    }

    /// `u` vectors of `lanes` channels from channel `c0` for `pixels` output pixels from
    /// column `ow0`. In the interior only the tap rows are checked; on the border every tap.
    #[allow(clippy::too_many_arguments)]
    fn block<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        row: &Row<'ctx>,
        ow0: IntValue<'ctx>,
        pixels: usize,
        interior: bool,
        c0: IntValue<'ctx>,
        lanes: u32,
        u: usize,
    ) -> Result<()> {
        let g = &self.g;
        let c = g.c as i64;
        let width = lanes as i64;
        let accs: Vec<&[PointerValue]> = (0..pixels)
            .map(|p| {
                if lanes == 1 {
                    std::slice::from_ref(&row.acc1[p])
                } else {
                    &row.accs[p][..u]
                }
            })
            .collect();
        for acc in &accs {
            for (j, a) in acc.iter().enumerate() {
                let cj = e.addc(c0, j as i64 * width)?;
                let init = match row.bias {
                    Some(b) => e.load_vec(e.gep_f32(b, cj)?, lanes)?,
                    None => e.zero_vec(lanes),
                };
                e.store(*a, init)?;
            }
        }
        // The block's first window column.
        let iwb = e.addc(e.mulc(ow0, g.sw as i64)?, -(g.pw as i64))?;
        for ky in 0..g.kh {
            let ih = e.addc(row.ihb, (ky * g.dh) as i64)?;
            let okh = e.icmp(IntPredicate::ULT, ih, e.i64c(g.h as i64))?;
            let tap_row = || -> Result<()> {
                // The pixel (ih, iw) at channel c0; computed only where it is inside the image.
                let pixel = |iw: IntValue<'ctx>| -> Result<PointerValue<'ctx>> {
                    e.gep_f32(row.x, e.add(e.mulc(e.add(e.mulc(ih, g.w as i64)?, iw)?, c)?, c0)?)
                };
                let xrow = if interior { Some(pixel(iwb)?) } else { None };
                // Input vectors by (column offset from iwb, vector): neighbouring pixels'
                // windows share columns, each is loaded once.
                let mut inputs: Vec<Option<Vec<VectorValue<'ctx>>>> =
                    vec![None; (pixels - 1) * g.sw + (g.kw - 1) * g.dw + 1];
                for kx in 0..g.kw {
                    let tap = ky * g.kw + kx;
                    let wp = e.gep_f32(row.wts, e.addc(c0, (tap * self.cpad) as i64)?)?;
                    let wv = (0..u)
                        .map(|j| e.load_vec(e.gep_f32c(wp, j as i64 * width)?, lanes))
                        .collect::<Result<Vec<_>>>()?;
                    for (p, acc) in accs.iter().enumerate() {
                        let col = p * g.sw + kx * g.dw;
                        let fma_tap = |xv: &[VectorValue<'ctx>]| -> Result<()> {
                            for (j, a) in acc.iter().enumerate() {
                                let cur = e.load_vec(*a, lanes)?;
                                e.store(*a, e.fma(xv[j], wv[j], cur)?)?;
                            }
                            Ok(())
                        };
                        if interior {
                            if inputs[col].is_none() {
                                let xrow = xrow.expect("interior row");
                                let xp = e.gep_f32c(xrow, col as i64 * c)?;
                                inputs[col] = Some(
                                    (0..u)
                                        .map(|j| e.load_vec(e.gep_f32c(xp, j as i64 * width)?, lanes))
                                        .collect::<Result<_>>()?,
                                );
                            }
                            fma_tap(inputs[col].as_ref().expect("loaded above"))?;
                        } else {
                            let iw = e.addc(iwb, col as i64)?;
                            let okw = e.icmp(IntPredicate::ULT, iw, e.i64c(g.w as i64))?;
                            e.if_then(okw, || {
                                let xp = pixel(iw)?;
                                let xv = (0..u)
                                    .map(|j| e.load_vec(e.gep_f32c(xp, j as i64 * width)?, lanes))
                                    .collect::<Result<Vec<_>>>()?;
                                fma_tap(&xv)
                            })?;
                        }
                    }
                }
                Ok(())
            };
            e.if_then(okh, tap_row)?;
        }
        for (p, acc) in accs.iter().enumerate() {
            let pix = e.mulc(e.addc(ow0, p as i64)?, c)?;
            for (j, a) in acc.iter().enumerate() {
                let off = e.addc(e.add(pix, c0)?, j as i64 * width)?;
                let mut v: VectorValue = e.load_vec(*a, lanes)?;
                if let Some(r) = row.r {
                    v = e.fadd(v, e.load_vec(e.gep_f32(r, off)?, lanes)?)?;
                }
                v = activation(e, self.activation, v, lanes)?;
                if self.bf16_out {
                    e.store_as_bf16(e.gep_bf16(row.y, off)?, v.into())?;
                } else {
                    e.store(e.gep_f32(row.y, off)?, v)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(w: usize, kw: usize, sw: usize, dw: usize, pw: usize) -> ConvWindow {
        let ow = (w + 2 * pw - (kw - 1) * dw - 1) / sw + 1;
        ConvWindow {
            c: 1,
            h: 1,
            w,
            kh: 1,
            kw,
            sh: 1,
            sw,
            dh: 1,
            dw,
            ph: 0,
            pw,
            oh: 1,
            ow,
        }
    }

    #[test]
    fn interior_columns_are_those_whose_taps_are_all_inside() {
        for w in 1..20 {
            for kw in 1..6 {
                for sw in 1..4 {
                    for dw in 1..3 {
                        for pw in 0..kw {
                            if w + 2 * pw < (kw - 1) * dw + 1 {
                                continue;
                            }
                            let g = window(w, kw, sw, dw, pw);
                            let inside = |ow: usize| {
                                (0..kw).all(|kx| {
                                    let iw = (ow * sw + kx * dw) as i64 - pw as i64;
                                    (0..w as i64).contains(&iw)
                                })
                            };
                            let (lo, hi) = interior_columns(&g);
                            assert!(lo <= hi && hi <= g.ow, "{g:?}");
                            for ow in 0..g.ow {
                                assert_eq!(inside(ow), (lo..hi).contains(&ow), "{g:?} column {ow}");
                            }
                        }
                    }
                }
            }
        }
    }
}
