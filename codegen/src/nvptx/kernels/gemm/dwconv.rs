//! The GPU depthwise convolution: a direct kernel, one thread per output element.

use super::body::{and, guarded_load, store_elem, ult};
use super::{Epi, Slot};
use crate::error::Result;
use crate::gen::emit::Emit;
use crate::kernel::epilogue::{Activation, Bias, Epilogue, Residual};
use crate::kernel::geometry::ConvWindow;
use crate::kernel::{KernelCommon, PackedConst};
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims, Sreg};
use kiln_ir::DType;

/// A depthwise convolution (groups == channels == output channels): one thread per output
/// element, consecutive threads along a row of the output.
pub struct DwConvGpu {
    what: String,
    /// The element type of the input, output and run-time bias/residual (f32, f16 or bf16).
    elem: DType,
    batch: usize,
    g: ConvWindow,
    epi: Epi,
    packed: Vec<PackedConst>,
    unread: Vec<usize>,
}

pub(super) const DW_BLOCK: usize = 256;

/// Threads per block for `total` output elements: 256, or fewer (down to 64) where that gives
/// the launch the blocks to fill the GPU (`FILL_BLOCKS`: late layers at batch 1 have tens of
/// thousands of outputs).
fn block_threads(total: usize) -> usize {
    [DW_BLOCK, 128, 64]
        .into_iter()
        .find(|&t| total.div_ceil(t) >= super::FILL_BLOCKS)
        .unwrap_or(64)
}

pub(super) fn lower(
    node: &NodeInfo,
    epi: Epilogue,
    w: &[f32],
    g: ConvWindow,
    batch: usize,
    elem: DType,
) -> Result<Option<Box<dyn GpuKernel>>> {
    let total = batch * g.c * g.oh * g.ow;
    if total.div_ceil(block_threads(total)) >= 1 << 31 {
        return Ok(None);
    }
    let mut packed = vec![PackedConst::from_f32s(w)];
    let mut unread = vec![1];
    if node.known(2).is_some() {
        unread.push(2);
    }
    let bias = match &epi.bias {
        Bias::PerRow(v) if v.len() == g.c => {
            packed.push(PackedConst::from_f32s(v));
            Some((Slot::Packed(1), true))
        }
        Bias::None if node.has_input(2) => {
            if node.known(2).is_some() {
                return Ok(None);
            }
            Some((Slot::Input(2), true))
        }
        Bias::None => None,
        _ => return Ok(None),
    };
    let residual = match &epi.residual {
        None => None,
        Some(Residual::Input(i)) => {
            if node.input_shape(*i)? != node.output_shape(0)? {
                return Err(node.unsupported(format!("residual input {i} does not have the output's shape")));
            }
            Some((Slot::Input(*i), 0, 0, 1, 1.0))
        }
        Some(Residual::Const(_) | Residual::Skip { .. }) => return Ok(None),
    };
    Ok(Some(Box::new(DwConvGpu {
        what: format!(
            "gpu dwconv{}x{}/{}{} C={} {}x{}{}{} grid={}x1x1 block={}",
            g.kh,
            g.kw,
            g.sh,
            if elem == DType::F16 { " f16" } else { "" },
            g.c,
            g.oh,
            g.ow,
            if residual.is_some() { " +residual" } else { "" },
            match epi.activation {
                Activation::None => String::new(),
                a => format!(" +{a:?}"),
            },
            total.div_ceil(block_threads(total)),
            block_threads(total),
        ),
        elem,
        batch,
        g,
        epi: Epi {
            alpha: epi.scale,
            bias,
            residual,
            activation: epi.activation,
        },
        packed,
        unread,
    })))
}

impl KernelCommon for DwConvGpu {
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

impl GpuKernel for DwConvGpu {
    fn launch(&self) -> LaunchDims {
        let total = self.batch * self.g.c * self.g.oh * self.g.ow;
        let threads = block_threads(total);
        LaunchDims {
            grid: [total.div_ceil(threads) as u32, 1, 1],
            block: [threads as u32, 1, 1],
            shared_bytes: 0,
        }
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let g = self.g;
        let f32t = k.cx.f32_type();
        let total = self.batch * g.c * g.oh * g.ow;
        let tid = k.sreg64(Sreg::TidX)?;
        let bx = k.sreg64(Sreg::CtaidX)?;
        let idx = e.add(e.mulc(bx, block_threads(total) as i64)?, tid)?;
        let x = k.input(0)?;
        let w = k.packed(0)?;
        let acc = e.entry_alloca(f32t, "acc")?;
        e.if_then(ult(&e, idx, total)?, || {
            let ow = e.uremc(idx, g.ow as i64)?;
            let t = e.udivc(idx, g.ow as i64)?;
            let oh = e.uremc(t, g.oh as i64)?;
            let plane = e.udivc(t, g.oh as i64)?;
            let ch = e.uremc(plane, g.c as i64)?;
            let x_base = e.mulc(plane, (g.h * g.w) as i64)?;
            let w_base = e.mulc(ch, (g.kh * g.kw) as i64)?;
            let ih0 = e.addc(e.mulc(oh, g.sh as i64)?, -(g.ph as i64))?;
            let iw0 = e.addc(e.mulc(ow, g.sw as i64)?, -(g.pw as i64))?;
            e.store(acc, f32t.const_zero())?;
            e.for_n(g.kh as i64, |khi| {
                let ih = e.add(ih0, e.mulc(khi, g.dh as i64)?)?;
                let row_ok = ult(&e, ih, g.h)?;
                e.for_n(g.kw as i64, |kwi| {
                    let iw = e.add(iw0, e.mulc(kwi, g.dw as i64)?)?;
                    let valid = and(&e, row_ok, ult(&e, iw, g.w)?)?;
                    let xi = e.add(x_base, e.add(e.mulc(ih, g.w as i64)?, iw)?)?;
                    let xv = guarded_load(k, &e, self.elem, x, xi, valid)?;
                    let wi = e.add(w_base, e.add(e.mulc(khi, g.kw as i64)?, kwi)?)?;
                    let wv = e.load_f32(e.gep_f32(w, wi)?)?;
                    let s = e.load_f32(acc)?;
                    let s = e
                        .intrinsic("llvm.fma", &[f32t.into()], &[xv.into(), wv.into(), s.into()])?
                        .into_float_value();
                    e.store(acc, s)
                })
            })?;
            let s = e.load_f32(acc)?;
            let v = self.epi.apply(k, &e, self.elem, s, (ch, ch), |_, _, _| Ok(idx))?;
            store_elem(k, &e, self.elem, k.output(0)?, idx, v)
        })?;
        k.ret()
    }
}
