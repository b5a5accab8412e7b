//! Matrix-vector shaped products: a product with a side of at most [`GEMV_MAX_SIDE`] (M: a
//! classifier's rows at batch 1; N: a 1×1 convolution of a pooled vector, squeeze-and-
//! excitation) whose tiled launch would leave the GPU mostly idle even after split-K. A
//! thread per output element sums its K products in order and applies the epilogue: the
//! outputs are few (hundreds to a few thousand), so the tiled kernel's 16×16 minimum tile
//! would leave most of its threads without an element, and no thread waits for another. The
//! operands are read as the tiled kernel reads them (`a_element`, `b_element`: bf16 rounding
//! included; constant A packed k-major, so consecutive threads read consecutive rows'
//! elements), so everything the tiled kernel takes, this one takes.

use super::body::resolve;
use super::GemmGpu;
use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::nvptx::{GpuBuilder, LaunchDims};

/// The longest side of a product the GEMV kernel takes.
pub(super) const GEMV_MAX_SIDE: usize = 8;
/// Threads of a block: small, so that a few hundred outputs still spread over several SMs.
pub(super) const GEMV_THREADS: usize = 64;

/// The launch of a GEMV over `outputs` elements.
pub(super) fn launch(outputs: usize) -> LaunchDims {
    LaunchDims::per_item(outputs as u64, GEMV_THREADS as u64)
}

impl GemmGpu {
    /// The launch of this product as a GEMV.
    pub(super) fn gemv_launch(&self) -> LaunchDims {
        launch(self.entries() * self.m * self.n)
    }

    pub(super) fn emit_gemv<'ctx>(&self, k: &GpuBuilder<'_, 'ctx>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let (m, n, kk) = (self.m, self.n, self.k);
        let outputs = self.entries() * m * n;
        let a_ptr = resolve(k, self.a.slot)?;
        let acc = e.entry_alloca(k.cx.f32_type(), "acc")?;
        let yes = k.cx.bool_type().const_all_ones();
        k.grid_stride_loop(outputs as u64, GEMV_THREADS as u64, |o| {
            let z = e.udivc(o, (m * n) as i64)?;
            let at = e.uremc(o, (m * n) as i64)?;
            let (i, j) = (e.udivc(at, n as i64)?, e.uremc(at, n as i64)?);
            let (a_off, b_off) = self.batch_offsets(&e, z)?;
            e.store(acc, e.f32c(0.0))?;
            e.for_range(e.i64c(0), e.i64c(kk as i64), 1, |kq| {
                let a = self.a_element(k, &e, a_ptr, a_off, (i, kq), yes)?;
                let b = self.b_element(k, &e, b_off, (kq, j), yes)?;
                let p = e.b.build_float_mul(a, b, "").map_err(llvm)?;
                e.store(acc, e.b.build_float_add(e.load_f32(acc)?, p, "").map_err(llvm)?)
            })?;
            self.finish(k, &e, z, (i, j), e.load_f32(acc)?)
        })?;
        k.ret()
    }
}
