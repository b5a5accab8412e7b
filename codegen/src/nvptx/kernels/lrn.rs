//! LRN (local response normalization across channels) on the GPU, a thread per element:
//! `y = x / (bias + alpha/size · Σ x²)^beta`, the sum over the channel window
//! `[c - ⌊(size-1)/2⌋, c + ⌈(size-1)/2⌉]` clipped to the channels, in f64 with the math
//! library's `pow`, as the library kernel (`kiln_uk_lrn`) and the reference compute it.

use super::scalar::{load_local, load_real, store_real};
use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims};
use crate::target::TargetDesc;
use kiln_ir::{DType, Layout, Op, VisionOp};

const THREADS: u64 = 256;

#[derive(Debug)]
struct LrnGpu {
    n: usize,
    c: usize,
    inner: usize,
    size: usize,
    alpha: f64,
    beta: f64,
    bias: f64,
    dtype: DType,
}

/// The kernel for an LRN node of a static row-major float tensor `[N, C, ...]`, or None.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    let Op::Vision(VisionOp::Lrn {
        size,
        alpha,
        beta,
        bias,
    }) = node.op()
    else {
        return Ok(None);
    };
    let Some(x) = node
        .input_type(0)
        .filter(|t| t.dtype.is_float() && t.layout == Layout::RowMajor && t.is_static())
    else {
        return Ok(None);
    };
    let shape = node.input_shape(0)?;
    if shape.len() < 2 || *size == 0 || node.output_type(0).dtype != x.dtype {
        return Ok(None);
    }
    Ok(Some(Box::new(LrnGpu {
        n: shape[0],
        c: shape[1],
        inner: shape[2..].iter().product(),
        size: *size,
        alpha: f64::from(*alpha),
        beta: f64::from(*beta),
        bias: f64::from(*bias),
        dtype: x.dtype,
    })))
}

impl KernelCommon for LrnGpu {
    fn describe(&self) -> String {
        format!(
            "gpu lrn N={} C={} inner={} size={}",
            self.n, self.c, self.inner, self.size
        )
    }
}

impl GpuKernel for LrnGpu {
    fn launch(&self) -> LaunchDims {
        LaunchDims::per_item((self.n * self.c * self.inner) as u64, THREADS)
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let f64t = e.cx.f64_type();
        let (x, y) = (k.input(0)?, k.output(0)?);
        let (c, inner) = (self.c as i64, self.inner as i64);
        let (before, after) = ((self.size as i64 - 1) / 2, self.size as i64 / 2);
        let acc = e.entry_alloca(f64t, "sq")?;
        k.grid_stride_loop((self.n * self.c * self.inner) as u64, THREADS, |idx| {
            let i = e.uremc(idx, inner)?;
            let ch = e.uremc(e.udivc(idx, inner)?, c)?;
            let b = e.udivc(idx, c * inner)?;
            // The window [max(ch - before, 0), min(ch + after, c - 1)], as a half-open range.
            let lo = e.clamp_int(e.sub(ch, e.i64c(before))?, 0, c - 1)?;
            let hi = e.clamp_int(e.addc(ch, after + 1)?, 0, c)?;
            e.store(acc, f64t.const_zero())?;
            e.for_range(lo, hi, 1, |kk| {
                let v = load_real(
                    &e,
                    x,
                    self.dtype,
                    e.add(e.mulc(e.add(e.mulc(b, c)?, kk)?, inner)?, i)?,
                )?;
                let sq = e.b.build_float_mul(v, v, "").map_err(llvm)?;
                e.store(
                    acc,
                    e.b.build_float_add(load_local(&e, acc)?, sq, "").map_err(llvm)?,
                )
            })?;
            let sq = load_local(&e, acc)?;
            let scaled =
                e.b.build_float_mul(f64t.const_float(self.alpha / self.size as f64), sq, "");
            let base =
                e.b.build_float_add(f64t.const_float(self.bias), scaled.map_err(llvm)?, "");
            let den = e.call_libm("pow", &[base.map_err(llvm)?, f64t.const_float(self.beta)])?;
            let v = load_real(&e, x, self.dtype, idx)?;
            store_real(
                &e,
                y,
                self.dtype,
                idx,
                e.b.build_float_div(v, den, "").map_err(llvm)?,
            )
        })?;
        k.ret()
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check};
    use crate::test_rng::TestRng;
    use kiln_ir::{DType, Graph, Op, Tensor, TensorType, VisionOp};

    fn lrn(shape: &[usize], size: usize) -> (Graph, Vec<Tensor>) {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, shape));
        let op = Op::Vision(VisionOp::Lrn {
            size,
            alpha: 2e-3,
            beta: 0.75,
            bias: 1.5,
        });
        let y = g.add("lrn", op, vec![Some(x)], "y").unwrap();
        g.add_output("y", y);
        let n = shape.iter().product();
        (
            g,
            vec![Tensor::from_vec(
                shape.to_vec(),
                TestRng::new(n as u64).vec_scaled(n, 5.0),
            )],
        )
    }

    #[test]
    fn windows_odd_even_and_wider_than_the_channels() {
        for (shape, size) in [(vec![2, 7, 3, 4], 3), (vec![1, 5, 6], 4), (vec![2, 3], 9)] {
            let (g, inputs) = lrn(&shape, size);
            let kernels = check_graph(&g, &inputs);
            assert!(kernels.iter().all(|k| k.starts_with("gpu lrn")), "{kernels:?}");
        }
    }

    #[test]
    fn ptx_assembles() {
        ptxas_check(&lrn(&[1, 5, 6], 4).0, 80);
    }
}
