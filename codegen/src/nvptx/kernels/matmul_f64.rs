//! MatMul of f64 tensors on the GPU, a thread per output element.
//!
//! The tiled kernel (`gemm`) accumulates in f32, which f64 models cannot afford; this kernel
//! sums each output's K products in f64, in K order. Its geometry is the library kernel's
//! (`uk::lower`'s `matmul` call): `M×K · K×N` products, a batch of them broadcast through
//! per-dimension strides counted in matrices (A's batch folded into M when B has none).
//! Each thread walks its A row and B column directly — a simple kernel for the f64 products
//! of einsum and attention tests and scientific models, not a fast one.

use super::scalar::{load_local, load_real, store_real};
use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims};
use crate::target::TargetDesc;
use inkwell::values::IntValue;
use kiln_ir::{DType, Layout, Op};

const THREADS: u64 = 256;

#[derive(Debug)]
struct MatMulF64 {
    m: usize,
    k: usize,
    n: usize,
    /// Broadcast batch dimensions and, per dimension, A's and B's stride in matrices.
    batch: Vec<usize>,
    a_strides: Vec<usize>,
    b_strides: Vec<usize>,
}

/// The kernel for a MatMul of static row-major f64 tensors, or None.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    if !matches!(node.op(), Op::MatMul) {
        return Ok(None);
    }
    let f64_tensor = |t: Option<&kiln_ir::TensorType>| {
        t.is_some_and(|t| t.dtype == DType::F64 && t.layout == Layout::RowMajor && t.is_static())
    };
    if !(f64_tensor(node.input_type(0))
        && f64_tensor(node.input_type(1))
        && f64_tensor(Some(node.output_type(0))))
    {
        return Ok(None);
    }
    let Some(call) = crate::uk::lower(node)? else {
        return Ok(None);
    };
    if call.symbol != "matmul" {
        return Ok(None);
    }
    let ia: Vec<usize> = call.iattr.iter().map(|&v| v as usize).collect();
    let r = ia[3];
    Ok(Some(Box::new(MatMulF64 {
        m: ia[0],
        k: ia[1],
        n: ia[2],
        batch: ia[4..4 + r].to_vec(),
        a_strides: ia[4 + r..4 + 2 * r].to_vec(),
        b_strides: ia[4 + 2 * r..4 + 3 * r].to_vec(),
    })))
}

impl MatMulF64 {
    fn outputs(&self) -> usize {
        self.batch.iter().product::<usize>() * self.m * self.n
    }

    /// A's and B's matrix index for batch entry `z`.
    fn matrices<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        z: IntValue<'ctx>,
    ) -> Result<(IntValue<'ctx>, IntValue<'ctx>)> {
        let (mut a, mut b, mut rest) = (e.i64c(0), e.i64c(0), z);
        for d in (0..self.batch.len()).rev() {
            let i = e.uremc(rest, self.batch[d] as i64)?;
            rest = e.udivc(rest, self.batch[d] as i64)?;
            a = e.add(a, e.mulc(i, self.a_strides[d] as i64)?)?;
            b = e.add(b, e.mulc(i, self.b_strides[d] as i64)?)?;
        }
        Ok((a, b))
    }
}

impl KernelCommon for MatMulF64 {
    fn describe(&self) -> String {
        format!(
            "gpu matmul f64 thread-per-output M={} N={} K={} batch={}",
            self.m,
            self.n,
            self.k,
            self.batch.iter().product::<usize>()
        )
    }
}

impl GpuKernel for MatMulF64 {
    fn launch(&self) -> LaunchDims {
        LaunchDims::per_item(self.outputs() as u64, THREADS)
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let f64t = e.cx.f64_type();
        let (a, b, y) = (k.input(0)?, k.input(1)?, k.output(0)?);
        let (m, kk, n) = (self.m as i64, self.k as i64, self.n as i64);
        let acc = e.entry_alloca(f64t, "acc")?;
        k.grid_stride_loop(self.outputs() as u64, THREADS, |idx| {
            let j = e.uremc(idx, n)?;
            let i = e.uremc(e.udivc(idx, n)?, m)?;
            let z = e.udivc(idx, m * n)?;
            let (am, bm) = self.matrices(&e, z)?;
            let a_row = e.add(e.mulc(am, m * kk)?, e.mulc(i, kk)?)?;
            let b_col = e.add(e.mulc(bm, kk * n)?, j)?;
            e.store(acc, f64t.const_zero())?;
            e.for_range(e.i64c(0), e.i64c(kk), 1, |p| {
                let x = load_real(&e, a, DType::F64, e.add(a_row, p)?)?;
                let w = load_real(&e, b, DType::F64, e.add(b_col, e.mulc(p, n)?)?)?;
                let prod = e.b.build_float_mul(x, w, "").map_err(llvm)?;
                e.store(
                    acc,
                    e.b.build_float_add(load_local(&e, acc)?, prod, "")
                        .map_err(llvm)?,
                )
            })?;
            store_real(&e, y, DType::F64, idx, load_local(&e, acc)?)
        })?;
        k.ret()
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check};
    use crate::test_rng::TestRng;
    use kiln_ir::{DType, Graph, Op, Tensor, TensorType};

    fn matmul(a: &[usize], b: &[usize]) -> (Graph, Vec<Tensor>) {
        let mut rng = TestRng::new((a.len() * 10 + b.len()) as u64);
        let mut g = Graph::new("t");
        let x = g.add_input("a", TensorType::fixed(DType::F64, a));
        let w = g.add_input("b", TensorType::fixed(DType::F64, b));
        let y = g.add("mm", Op::MatMul, vec![Some(x), Some(w)], "y").unwrap();
        g.add_output("y", y);
        let t = |s: &[usize], rng: &mut TestRng| {
            let v: Vec<f64> = rng
                .vec(s.iter().product())
                .iter()
                .map(|&x| f64::from(x) / 3.0)
                .collect();
            Tensor::from_vec(s.to_vec(), v)
        };
        let inputs = vec![t(a, &mut rng), t(b, &mut rng)];
        (g, inputs)
    }

    #[test]
    fn f64_products_with_batches_and_vectors() {
        for (a, b) in [
            (vec![7, 13], vec![13, 5]),
            (vec![2, 3, 4, 6], vec![6, 9]),
            (vec![2, 1, 4, 6], vec![3, 6, 2]),
            (vec![6], vec![4, 6, 3]),
            (vec![5, 6], vec![6]),
        ] {
            let (g, inputs) = matmul(&a, &b);
            let kernels = check_graph(&g, &inputs);
            assert!(
                kernels.iter().all(|k| k.starts_with("gpu matmul f64")),
                "{kernels:?}"
            );
        }
    }

    #[test]
    fn ptx_assembles() {
        ptxas_check(&matmul(&[2, 1, 4, 6], &[3, 6, 2]).0, 80);
    }
}
