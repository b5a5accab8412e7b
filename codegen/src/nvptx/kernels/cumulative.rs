//! CumSum and CumProd on the GPU (`kiln_uk_cumulative`'s descriptor): one thread per position
//! off the axis, running along it (threads of a warp take consecutive inner positions, so each
//! step's loads and stores coalesce). As in the library kernel, floats accumulate in f64 and
//! each output is rounded once; integers wrap in their own type. An axis given at run time is
//! read by every thread, checked (`KILN_CUDA_EVALUE` outside `-rank..rank`, the library's
//! error) and turned into the axis extent and inner stride by a select over the ranks' values;
//! the grid then covers the most positions any axis has and the surplus threads idle.

use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims, EVALUE};
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
    /// The tensor's dims and the axis, None when read at run time from input 1 (of
    /// `axis_dtype`).
    dims: Vec<u64>,
    axis: Option<usize>,
    axis_dtype: DType,
    dtype: DType,
}

/// The kernel for a CumSum/CumProd of f32, f64, i32 or i64 values.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    let Some(dtype) = node.input_dtype(0) else {
        return Ok(None);
    };
    if !matches!(dtype, DType::F32 | DType::F64 | DType::I32 | DType::I64) {
        return Ok(None);
    }
    let Some(call) = crate::uk::lower(node)? else {
        return Ok(None);
    };
    let at = &call.iattr;
    let axis_dtype = node.input_dtype(1).unwrap_or(DType::I64);
    if call.symbol != "cumulative" || !matches!(axis_dtype, DType::I32 | DType::I64) {
        return Ok(None);
    }
    let dims: Vec<u64> = at[5..5 + at[4] as usize].iter().map(|&d| d as u64).collect();
    if dims.is_empty() {
        return Ok(None);
    }
    Ok(Some(Box::new(CumulativeGpu {
        prod: at[0] != 0,
        exclusive: at[1] != 0,
        reverse: at[2] != 0,
        axis: (at[3] >= 0).then_some(at[3] as usize),
        dims,
        axis_dtype,
        dtype,
    })))
}

impl CumulativeGpu {
    fn total(&self) -> u64 {
        self.dims.iter().product()
    }

    /// The positions off the axis: for a run-time axis, the most of any axis.
    fn positions(&self) -> u64 {
        let off = |a: usize| self.total() / self.dims[a].max(1);
        match self.axis {
            Some(a) => off(a),
            None => (0..self.dims.len()).map(off).max().unwrap_or(0),
        }
    }

    /// The axis extent and the elements after it, for axis `a`.
    fn extent_and_inner(&self, a: usize) -> (u64, u64) {
        (self.dims[a], self.dims[a + 1..].iter().product())
    }
}

impl KernelCommon for CumulativeGpu {
    fn describe(&self) -> String {
        let shape = match self.axis {
            Some(a) => {
                let (n, inner) = self.extent_and_inner(a);
                format!("{}x[{n}]x{inner}", self.total() / (n * inner).max(1))
            }
            None => format!("{:?} run-time axis", self.dims),
        };
        format!(
            "gpu cum{} {shape}{}{}",
            if self.prod { "prod" } else { "sum" },
            if self.exclusive { " exclusive" } else { "" },
            if self.reverse { " reverse" } else { "" }
        )
    }
}

impl GpuKernel for CumulativeGpu {
    fn launch(&self) -> LaunchDims {
        LaunchDims::per_item(self.positions(), THREADS)
    }

    fn emit<'ctx>(&self, k: &GpuBuilder<'_, 'ctx>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let (x, y) = (k.input(0)?, k.output(0)?);
        let float = self.dtype.is_float();
        let (elem, acc_t): (BasicTypeEnum, BasicTypeEnum) = match self.dtype {
            DType::F32 => (k.cx.f32_type().into(), k.cx.f64_type().into()),
            DType::F64 => (k.cx.f64_type().into(), k.cx.f64_type().into()),
            DType::I32 => (k.cx.i32_type().into(), k.cx.i32_type().into()),
            _ => (k.cx.i64_type().into(), k.cx.i64_type().into()),
        };
        let esize = self.dtype.size_bytes() as i64;
        let acc = e.entry_alloca(acc_t, "acc")?;
        let identity: BasicValueEnum = match (float, self.prod) {
            (true, p) => k.cx.f64_type().const_float(if p { 1.0 } else { 0.0 }).into(),
            (false, p) => acc_t.into_int_type().const_int(p as u64, false).into(),
        };
        let (n, inner, valid) = self.geometry(k, &e)?;
        let positions =
            e.b.build_int_unsigned_div(e.i64c(self.total() as i64), n, "")
                .map_err(llvm)?;
        k.grid_stride_loop(self.positions(), THREADS, |i| {
            let mine = e.icmp(inkwell::IntPredicate::ULT, i, positions)?;
            let mine = e.b.build_and(mine, valid, "").map_err(llvm)?;
            e.if_then(mine, || {
                let o = e.b.build_int_unsigned_div(i, inner, "").map_err(llvm)?;
                let r = e.b.build_int_unsigned_rem(i, inner, "").map_err(llvm)?;
                let base = e.add(e.mul(o, e.mul(n, inner)?)?, r)?;
                e.store(acc, identity)?;
                e.for_range(e.i64c(0), n, 1, |step| {
                    let kk: IntValue<'ctx> = if self.reverse {
                        e.b.build_int_sub(e.addc(n, -1)?, step, "").map_err(llvm)?
                    } else {
                        step
                    };
                    let at = e.mulc(e.add(base, e.mul(kk, inner)?)?, esize)?;
                    let v = e.b.build_load(elem, e.gep_u8(x, at)?, "").map_err(llvm)?;
                    let before = e.b.build_load(acc_t, acc, "").map_err(llvm)?;
                    let store_out = |a: BasicValueEnum<'ctx>| -> Result<()> {
                        let out: BasicValueEnum = if self.dtype == DType::F32 {
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
                        let v = v.into_float_value();
                        let v = if self.dtype == DType::F32 {
                            e.b.build_float_ext(v, k.cx.f64_type(), "").map_err(llvm)?
                        } else {
                            v
                        };
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
            })
        })?;
        k.ret()
    }
}

impl CumulativeGpu {
    /// The axis extent, the inner stride (constants for a compile-time axis) and whether the
    /// axis is valid; a run-time axis out of range is reported and gives no positions.
    fn geometry<'ctx>(
        &self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
    ) -> Result<(IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>)> {
        let yes = k.cx.bool_type().const_all_ones();
        if let Some(a) = self.axis {
            // An empty tensor has no positions; 1s keep the divisions defined.
            let (n, inner) = self.extent_and_inner(a);
            return Ok((e.i64c(n.max(1) as i64), e.i64c(inner.max(1) as i64), yes));
        }
        let rank = self.dims.len() as i64;
        let axis = if self.axis_dtype == DType::I64 {
            e.load_i64(k.input(1)?, e.i64c(0))?
        } else {
            let raw =
                e.b.build_load(k.cx.i32_type(), k.input(1)?, "")
                    .map_err(llvm)?
                    .into_int_value();
            e.b.build_int_s_extend(raw, k.cx.i64_type(), "").map_err(llvm)?
        };
        let negative = e.icmp(inkwell::IntPredicate::SLT, axis, e.i64c(0))?;
        let axis = e.select_int(negative, e.addc(axis, rank)?, axis)?;
        let valid = e.icmp(inkwell::IntPredicate::ULT, axis, e.i64c(rank))?;
        let invalid = e.b.build_not(valid, "").map_err(llvm)?;
        e.if_then(invalid, || k.report_error(EVALUE))?;
        // Axis 0's values unless another axis matches (an invalid axis keeps them: no thread
        // runs).
        let (mut n, mut inner) = (
            e.i64c(self.dims[0] as i64),
            e.i64c(self.extent_and_inner(0).1 as i64),
        );
        for a in 1..self.dims.len() {
            let this = e.icmp(inkwell::IntPredicate::EQ, axis, e.i64c(a as i64))?;
            let (na, ia) = self.extent_and_inner(a);
            n = e.select_int(this, e.i64c(na as i64), n)?;
            inner = e.select_int(this, e.i64c(ia as i64), inner)?;
        }
        // An empty axis has nothing to scan (and must not divide by zero).
        let n = e.select_int(e.icmp(inkwell::IntPredicate::EQ, n, e.i64c(0))?, e.i64c(1), n)?;
        let inner = e.select_int(
            e.icmp(inkwell::IntPredicate::EQ, inner, e.i64c(0))?,
            e.i64c(1),
            inner,
        )?;
        Ok((n, inner, valid))
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

    /// The axis as a run-time input: every axis of a 3-D tensor, negative ones, an i32 axis,
    /// f32 and f64 values, against the reference; an axis outside the rank is the library's value error.
    #[test]
    fn run_time_axis() {
        use crate::nvptx::emulate::run_graph;
        for axis_dtype in [DType::I64, DType::I32] {
            let mut g = Graph::new("t");
            // f64 values with the i32 axis.
            let xdt = if axis_dtype == DType::I64 {
                DType::F32
            } else {
                DType::F64
            };
            let x = g.add_input("x", TensorType::fixed(xdt, &[3, 5, 4]));
            let a = g.add_input("axis", TensorType::fixed(axis_dtype, &[]));
            for (i, (exclusive, reverse)) in [(false, false), (true, true)].into_iter().enumerate() {
                let op = if i == 0 {
                    Op::CumSum { exclusive, reverse }
                } else {
                    Op::CumProd { exclusive, reverse }
                };
                let y = g
                    .add(format!("c{i}"), op, vec![Some(x), Some(a)], format!("y{i}"))
                    .unwrap();
                g.add_output(format!("y{i}"), y);
            }
            let xv: Vec<f32> = (0..60).map(|i| ((i * 13) % 11) as f32 * 0.3 - 1.4).collect();
            let x = Tensor::from_vec(vec![3, 5, 4], xv).cast(xdt);
            let axis = |v: i64| Tensor::from_vec(vec![], vec![v]).cast(axis_dtype);
            for v in [0, 1, 2, -1, -3] {
                let kernels = check_graph(&g, &[x.clone(), axis(v)]);
                assert!(kernels.iter().all(|k| k.contains("run-time axis")), "{kernels:?}");
            }
            for v in [3, -4] {
                let err = run_graph(&g, &[x.clone(), axis(v)]).unwrap_err();
                assert!(err.contains("failed with code 2"), "{err}");
            }
            ptxas_check(&g, 80);
        }
    }
}
