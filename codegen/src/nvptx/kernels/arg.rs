//! ArgMax and ArgMin on the GPU (`kiln_uk_arg`'s descriptor: `[outer, n, inner, max, last]`):
//! one thread per output element, walking its `n` values along the axis (threads of a warp take
//! consecutive `inner` positions, so each step's loads coalesce). The comparisons are the
//! library kernel's, so both backends pick the same index: a NaN beats every number (the first
//! NaN wins, or the last with `select_last_index`), ties go to the first index or the last.

use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims};
use crate::target::TargetDesc;
use inkwell::values::IntValue;
use inkwell::{FloatPredicate, IntPredicate};
use kiln_ir::{DType, Op};

const THREADS: u64 = 256;

#[derive(Debug)]
struct ArgGpu {
    outer: u64,
    n: u64,
    inner: u64,
    max: bool,
    last: bool,
    dtype: DType,
}

/// The kernel for an ArgMax/ArgMin of f32, i32 or i64 values; None for anything else.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    if !matches!(node.op(), Op::ArgMax { .. } | Op::ArgMin { .. }) {
        return Ok(None);
    }
    let Some(dtype) = node.input_dtype(0) else {
        return Ok(None);
    };
    if !matches!(dtype, DType::F32 | DType::I32 | DType::I64) {
        return Ok(None);
    }
    let Some(call) = crate::uk::lower(node)? else {
        return Ok(None);
    };
    if call.symbol != "arg" {
        return Ok(None);
    }
    let at = &call.iattr;
    Ok(Some(Box::new(ArgGpu {
        outer: at[0] as u64,
        n: at[1] as u64,
        inner: at[2] as u64,
        max: at[3] != 0,
        last: at[4] != 0,
        dtype,
    })))
}

impl ArgGpu {
    fn total(&self) -> u64 {
        self.outer * self.inner
    }

    /// Whether candidate `c` replaces the best so far `b` (the library's `arg_better_f` and its
    /// integer twin).
    fn better<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        c: inkwell::values::BasicValueEnum<'ctx>,
        b: inkwell::values::BasicValueEnum<'ctx>,
    ) -> Result<IntValue<'ctx>> {
        let bool_t = e.cx.bool_type();
        let flag = |v: bool| bool_t.const_int(v as u64, false);
        let pick = |cond: IntValue<'ctx>, t: IntValue<'ctx>, f: IntValue<'ctx>| -> Result<IntValue<'ctx>> {
            Ok(e.b.build_select(cond, t, f, "").map_err(llvm)?.into_int_value())
        };
        if self.dtype == DType::F32 {
            let (c, b) = (c.into_float_value(), b.into_float_value());
            let fcmp = |p, x, y| e.b.build_float_compare(p, x, y, "").map_err(llvm);
            let b_nan = fcmp(FloatPredicate::UNO, b, b)?;
            let c_nan = fcmp(FloatPredicate::UNO, c, c)?;
            let equal = fcmp(FloatPredicate::OEQ, c, b)?;
            let above = fcmp(FloatPredicate::OGT, c, b)?;
            let ordered = if self.max {
                above
            } else {
                e.b.build_not(above, "").map_err(llvm)?
            };
            let numbers = pick(equal, flag(self.last), ordered)?;
            let c_wins = pick(c_nan, flag(true), numbers)?;
            let b_nan_case = if self.last { c_nan } else { flag(false) };
            pick(b_nan, b_nan_case, c_wins)
        } else {
            let (c, b) = (c.into_int_value(), b.into_int_value());
            let equal = e.icmp(IntPredicate::EQ, c, b)?;
            let above = e.icmp(IntPredicate::SGT, c, b)?;
            let ordered = if self.max {
                above
            } else {
                e.b.build_not(above, "").map_err(llvm)?
            };
            pick(equal, flag(self.last), ordered)
        }
    }
}

impl KernelCommon for ArgGpu {
    fn describe(&self) -> String {
        format!(
            "gpu arg{} {}x[{}]x{}{}",
            if self.max { "max" } else { "min" },
            self.outer,
            self.n,
            self.inner,
            if self.last { " last" } else { "" }
        )
    }
}

impl GpuKernel for ArgGpu {
    fn launch(&self) -> LaunchDims {
        LaunchDims::per_item(self.total(), THREADS)
    }

    fn emit<'ctx>(&self, k: &GpuBuilder<'_, 'ctx>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let (x, y) = (k.input(0)?, k.output(0)?);
        let i64t = k.cx.i64_type();
        let vt: inkwell::types::BasicTypeEnum = match self.dtype {
            DType::F32 => k.cx.f32_type().into(),
            DType::I32 => k.cx.i32_type().into(),
            _ => i64t.into(),
        };
        let esize = self.dtype.size_bytes() as i64;
        let best_at = e.entry_alloca(i64t, "best")?;
        let best_value = e.entry_alloca(vt, "best_value")?;
        let (n, inner) = (self.n as i64, self.inner as i64);
        k.grid_stride_loop(self.total(), THREADS, |i| {
            let o = e.udivc(i, inner)?;
            let r = e.uremc(i, inner)?;
            let base = e.add(e.mulc(o, n * inner)?, r)?;
            let load = |kk: IntValue<'ctx>| -> Result<inkwell::values::BasicValueEnum<'ctx>> {
                let at = e.mulc(e.add(base, e.mulc(kk, inner)?)?, esize)?;
                e.b.build_load(vt, e.gep_u8(x, at)?, "").map_err(llvm)
            };
            e.store(best_at, i64t.const_zero())?;
            e.store(best_value, load(e.i64c(0))?)?;
            e.for_range(e.i64c(1), e.i64c(n), 1, |kk| {
                let c = load(kk)?;
                let b = e.b.build_load(vt, best_value, "").map_err(llvm)?;
                let better = self.better(&e, c, b)?;
                e.if_then(better, || {
                    e.store(best_at, kk)?;
                    e.store(best_value, c)
                })
            })?;
            let best = e.b.build_load(i64t, best_at, "").map_err(llvm)?;
            e.store(e.gep_u8(y, e.mulc(i, 8)?)?, best)
        })?;
        k.ret()
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check};
    use kiln_ir::{DType, Graph, Op, Tensor, TensorType};

    /// ArgMax/ArgMin over each axis, first and last index on ties, NaN, f32 and i64 values.
    #[test]
    fn arg_max_and_min() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[3, 7, 5]));
        let q = g.add_input("q", TensorType::fixed(DType::I64, &[4, 9]));
        let mut n = 0;
        for (v, axes) in [(x, 3i64), (q, 2)] {
            for axis in 0..axes {
                for last in [false, true] {
                    for max in [true, false] {
                        let op = if max {
                            Op::ArgMax {
                                axis,
                                keepdims: true,
                                select_last_index: last,
                            }
                        } else {
                            Op::ArgMin {
                                axis,
                                keepdims: false,
                                select_last_index: last,
                            }
                        };
                        n += 1;
                        let y = g
                            .add(format!("a{n}"), op, vec![Some(v)], format!("y{n}"))
                            .unwrap();
                        g.add_output(format!("y{n}"), y);
                    }
                }
            }
        }
        // Few distinct values (ties everywhere) and NaNs.
        let mut xv: Vec<f32> = (0..105).map(|i| ((i * 37) % 11) as f32 - 5.0).collect();
        for i in [3, 17, 18, 60, 104] {
            xv[i] = f32::NAN;
        }
        let qv: Vec<i64> = (0..36).map(|i| (i * 13) % 5 - 2).collect();
        let kernels = check_graph(
            &g,
            &[
                Tensor::from_vec(vec![3, 7, 5], xv),
                Tensor::from_vec(vec![4, 9], qv),
            ],
        );
        assert!(kernels.iter().all(|k| k.starts_with("gpu arg")), "{kernels:?}");
        ptxas_check(&g, 90);
    }
}
