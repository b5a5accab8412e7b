//! BatchNormalization (inference) on the GPU, for the normalizations the freeze pass cannot fold
//! into a preceding convolution (statistics given at run time, or no convolution before it).
//!
//! One thread per element of the f32 `[N, C, spatial...]` tensor, consecutive threads on
//! consecutive elements. A thread derives its channel's affine map as the library kernel does
//! — `a = scale / sqrt(var + ε)` in f64, then `mean`, `a` and `bias` rounded to f32 — and
//! computes `(x - mean)·a + bias` in f32.

use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims};
use crate::target::TargetDesc;
use inkwell::values::{FloatValue, IntValue};
use kiln_ir::{DType, Layout, Op};

const THREADS: u64 = 256;

#[derive(Debug)]
struct BatchNorm {
    total: u64,
    channels: u64,
    plane: u64,
    epsilon: f32,
}

/// The kernel for an inference BatchNormalization of f32 row-major tensors, or None.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    let Op::BatchNorm { epsilon } = node.op() else {
        return Ok(None);
    };
    let f32_static = |i: usize| {
        node.input_type(i)
            .is_some_and(|t| t.dtype == DType::F32 && t.layout == Layout::RowMajor && t.is_static())
    };
    if node.n_outputs() != 1 || !(0..5).all(f32_static) {
        return Ok(None);
    }
    let x = node.input_shape(0)?;
    if x.len() < 2 || x.iter().product::<usize>() >= 1 << 40 {
        return Ok(None);
    }
    let channels = x[1] as u64;
    for i in 1..5 {
        if node.input_shape(i)?.iter().product::<usize>() as u64 != channels {
            return Ok(None);
        }
    }
    Ok(Some(Box::new(BatchNorm {
        total: x.iter().product::<usize>() as u64,
        channels,
        plane: x[2..].iter().product::<usize>() as u64,
        epsilon: *epsilon,
    })))
}

impl KernelCommon for BatchNorm {
    fn describe(&self) -> String {
        format!(
            "gpu batchnorm elements={} channels={} plane={}",
            self.total, self.channels, self.plane
        )
    }
}

impl GpuKernel for BatchNorm {
    fn launch(&self) -> LaunchDims {
        LaunchDims::per_item(self.total, THREADS)
    }

    fn emit<'ctx>(&self, k: &GpuBuilder<'_, 'ctx>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let (f32t, f64t) = (k.cx.f32_type(), k.cx.f64_type());
        let (x, y) = (k.input(0)?, k.output(0)?);
        let param = |i: usize, ch: IntValue<'ctx>| -> Result<FloatValue<'ctx>> {
            let v = e.load_f32(e.gep_f32(k.input(i)?, ch)?)?;
            e.b.build_float_ext(v, f64t, "").map_err(llvm)
        };
        k.grid_stride_loop(self.total, THREADS, |i| {
            let ch = e.uremc(e.udivc(i, self.plane.max(1) as i64)?, self.channels as i64)?;
            let (scale, bias, mean, var) = (param(1, ch)?, param(2, ch)?, param(3, ch)?, param(4, ch)?);
            let eps = f64t.const_float(f64::from(self.epsilon));
            let d = e
                .intrinsic(
                    "llvm.sqrt",
                    &[f64t.into()],
                    &[e.b.build_float_add(var, eps, "").map_err(llvm)?.into()],
                )?
                .into_float_value();
            let a = e.b.build_float_div(scale, d, "").map_err(llvm)?;
            let narrow = |v: FloatValue<'ctx>| e.b.build_float_trunc(v, f32t, "").map_err(llvm);
            let (m, a, b) = (narrow(mean)?, narrow(a)?, narrow(bias)?);
            let v = e.load_f32(e.gep_f32(x, i)?)?;
            let centered = e.b.build_float_sub(v, m, "").map_err(llvm)?;
            let r =
                e.b.build_float_add(e.b.build_float_mul(centered, a, "").map_err(llvm)?, b, "")
                    .map_err(llvm)?;
            e.store(e.gep_f32(y, i)?, r)
        })?;
        k.ret()
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check};
    use crate::test_rng::TestRng;
    use kiln_ir::{DType, Graph, Op, Tensor, TensorType};

    /// Statistics as run-time inputs (nothing to fold), 4-D and 2-D inputs, against the
    /// reference; the PTX assembles.
    #[test]
    fn batch_norm_with_run_time_statistics() {
        for (seed, shape) in [vec![2usize, 3, 5, 7], vec![4, 300]].into_iter().enumerate() {
            let mut rng = TestRng::new(seed as u64 + 70);
            let c = shape[1];
            let mut g = Graph::new("t");
            let x = g.add_input("x", TensorType::fixed(DType::F32, &shape));
            let mut ins = vec![Some(x)];
            let mut values = vec![Tensor::from_vec(
                shape.clone(),
                rng.vec_scaled(shape.iter().product(), 3.0),
            )];
            for (i, name) in ["scale", "bias", "mean", "var"].iter().enumerate() {
                ins.push(Some(g.add_input(*name, TensorType::fixed(DType::F32, &[c]))));
                let v = rng.vec(c);
                let v = if i == 3 {
                    v.iter().map(|x| x.abs() + 0.1).collect()
                } else {
                    v
                };
                values.push(Tensor::from_vec(vec![c], v));
            }
            let y = g.add("bn", Op::BatchNorm { epsilon: 1e-5 }, ins, "y").unwrap();
            g.add_output("y", y);
            let kernels = check_graph(&g, &values);
            assert!(
                kernels.iter().all(|k| k.starts_with("gpu batchnorm")),
                "{kernels:?}"
            );
            ptxas_check(&g, 80);
        }
    }
}
