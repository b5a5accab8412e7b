//! CumSum and CumProd on the GPU (`kiln_uk_cumulative`'s descriptor), for an axis known at
//! compile time: one thread per position off the axis, running along it (threads of a warp
//! take consecutive inner positions, so each step's loads and stores coalesce). As in the
//! library kernel, floats accumulate in f64 and each output is rounded once; integers wrap in
//! their own type.

use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims};
use crate::target::TargetDesc;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, IntValue};
use kiln_ir::DType;

const THREADS: u64 = 256;

#[derive(Debug)]
struct CumulativeGpu {
    prod: bool,
    exclusive: bool,
    reverse: bool,
    outer: u64,
    n: u64,
    inner: u64,
    dtype: DType,
}

/// The kernel for a CumSum/CumProd of f32, i32 or i64 values along a constant axis.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    let Some(dtype) = node.input_dtype(0) else {
        return Ok(None);
    };
    if !matches!(dtype, DType::F32 | DType::I32 | DType::I64) {
        return Ok(None);
    }
    let Some(call) = crate::uk::lower(node)? else {
        return Ok(None);
    };
    let at = &call.iattr;
    // A run-time axis (-1) stays with the library kernel, which reads and checks it.
    if call.symbol != "cumulative" || at[3] < 0 {
        return Ok(None);
    }
    let (axis, dims) = (at[3] as usize, &at[5..5 + at[4] as usize]);
    let extent = |r: &[i64]| r.iter().product::<i64>() as u64;
    Ok(Some(Box::new(CumulativeGpu {
        prod: at[0] != 0,
        exclusive: at[1] != 0,
        reverse: at[2] != 0,
        outer: extent(&dims[..axis]),
        n: dims[axis] as u64,
        inner: extent(&dims[axis + 1..]),
        dtype,
    })))
}

impl KernelCommon for CumulativeGpu {
    fn describe(&self) -> String {
        format!(
            "gpu cum{} {}x[{}]x{}{}{}",
            if self.prod { "prod" } else { "sum" },
            self.outer,
            self.n,
            self.inner,
            if self.exclusive { " exclusive" } else { "" },
            if self.reverse { " reverse" } else { "" }
        )
    }
}

impl GpuKernel for CumulativeGpu {
    fn launch(&self) -> LaunchDims {
        LaunchDims::per_item(self.outer * self.inner, THREADS)
    }

    fn emit<'ctx>(&self, k: &GpuBuilder<'_, 'ctx>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let (x, y) = (k.input(0)?, k.output(0)?);
        let float = self.dtype == DType::F32;
        let (elem, acc_t): (BasicTypeEnum, BasicTypeEnum) = match self.dtype {
            DType::F32 => (k.cx.f32_type().into(), k.cx.f64_type().into()),
            DType::I32 => (k.cx.i32_type().into(), k.cx.i32_type().into()),
            _ => (k.cx.i64_type().into(), k.cx.i64_type().into()),
        };
        let esize = self.dtype.size_bytes() as i64;
        let acc = e.entry_alloca(acc_t, "acc")?;
        let identity: BasicValueEnum = match (float, self.prod) {
            (true, p) => k.cx.f64_type().const_float(if p { 1.0 } else { 0.0 }).into(),
            (false, p) => acc_t.into_int_type().const_int(p as u64, false).into(),
        };
        let (n, inner) = (self.n as i64, self.inner as i64);
        k.grid_stride_loop(self.outer * self.inner, THREADS, |i| {
            let o = e.udivc(i, inner)?;
            let r = e.uremc(i, inner)?;
            let base = e.add(e.mulc(o, n * inner)?, r)?;
            e.store(acc, identity)?;
            e.for_range(e.i64c(0), e.i64c(n), 1, |step| {
                let kk: IntValue<'ctx> = if self.reverse {
                    e.b.build_int_sub(e.i64c(n - 1), step, "").map_err(llvm)?
                } else {
                    step
                };
                let at = e.mulc(e.add(base, e.mulc(kk, inner)?)?, esize)?;
                let v = e.b.build_load(elem, e.gep_u8(x, at)?, "").map_err(llvm)?;
                let before = e.b.build_load(acc_t, acc, "").map_err(llvm)?;
                let store_out = |a: BasicValueEnum<'ctx>| -> Result<()> {
                    let out: BasicValueEnum = if float {
                        e.b.build_float_trunc(a.into_float_value(), k.cx.f32_type(), "")
                            .map_err(llvm)?
                            .into()
                    } else {
                        a
                    };
                    e.store(e.gep_u8(y, at)?, out)
                };
                if self.exclusive {
                    store_out(before)?;
                }
                let after: BasicValueEnum = if float {
                    let v =
                        e.b.build_float_ext(v.into_float_value(), k.cx.f64_type(), "")
                            .map_err(llvm)?;
                    let a = before.into_float_value();
                    if self.prod {
                        e.b.build_float_mul(a, v, "").map_err(llvm)?.into()
                    } else {
                        e.b.build_float_add(a, v, "").map_err(llvm)?.into()
                    }
                } else {
                    let (a, v) = (before.into_int_value(), v.into_int_value());
                    if self.prod {
                        e.b.build_int_mul(a, v, "").map_err(llvm)?.into()
                    } else {
                        e.b.build_int_add(a, v, "").map_err(llvm)?.into()
                    }
                };
                e.store(acc, after)?;
                if !self.exclusive {
                    store_out(after)?;
                }
                Ok(())
            })
        })?;
        k.ret()
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check};
    use kiln_ir::{DType, Graph, Op, Tensor, TensorType};

    /// CumSum and CumProd on each axis, exclusive and reversed, f32 and wrapping i32.
    #[test]
    fn cumulative_sums_and_products() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[3, 6, 4]));
        let q = g.add_input("q", TensorType::fixed(DType::I32, &[5, 7]));
        let mut n = 0;
        for (v, rank) in [(x, 3i64), (q, 2)] {
            for axis in 0..rank {
                for (exclusive, reverse) in [(false, false), (true, false), (false, true), (true, true)] {
                    n += 1;
                    let a = g.add_const(format!("axis{n}"), Tensor::scalar(axis - rank * (n % 2)));
                    let op = if n % 3 == 0 {
                        Op::CumProd { exclusive, reverse }
                    } else {
                        Op::CumSum { exclusive, reverse }
                    };
                    let y = g
                        .add(format!("c{n}"), op, vec![Some(v), Some(a)], format!("y{n}"))
                        .unwrap();
                    g.add_output(format!("y{n}"), y);
                }
            }
        }
        let xv: Vec<f32> = (0..72).map(|i| ((i * 29) % 17) as f32 * 0.25 - 2.0).collect();
        let qv: Vec<i32> = (0..35).map(|i| (i * 7919) % 2_000_003 - 1_000_000).collect();
        let kernels = check_graph(
            &g,
            &[
                Tensor::from_vec(vec![3, 6, 4], xv),
                Tensor::from_vec(vec![5, 7], qv),
            ],
        );
        assert!(kernels.iter().all(|k| k.starts_with("gpu cum")), "{kernels:?}");
        ptxas_check(&g, 90);
    }
}
