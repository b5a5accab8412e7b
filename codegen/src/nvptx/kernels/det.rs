//! Det on the GPU, a thread per matrix: the library kernel's (`kiln_uk_det` in nn.c) Gaussian
//! elimination with partial pivoting in f64 — the last row with the largest magnitude in the
//! column is the pivot, a zero pivot makes the determinant 0, each row swap flips its sign —
//! on a copy of the matrix in the launch's scratch.

use super::scalar::{load_local, load_real, store_real};
use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims};
use crate::target::TargetDesc;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::{FloatPredicate, IntPredicate};
use kiln_ir::{DType, Layout, MiscOp, Op};

const THREADS: u64 = 64;

#[derive(Debug)]
struct DetGpu {
    matrices: usize,
    m: usize,
    dtype: DType,
}

/// The kernel for a Det of a static row-major float tensor `[*, M, M]`, or None.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    if !matches!(node.op(), Op::Misc(MiscOp::Det)) {
        return Ok(None);
    }
    let Some(x) = node
        .input_type(0)
        .filter(|t| t.dtype.is_float() && t.layout == Layout::RowMajor && t.is_static())
    else {
        return Ok(None);
    };
    let shape = node.input_shape(0)?;
    let r = shape.len();
    if r < 2 || shape[r - 1] != shape[r - 2] || node.output_type(0).dtype != x.dtype {
        return Ok(None);
    }
    Ok(Some(Box::new(DetGpu {
        matrices: shape[..r - 2].iter().product(),
        m: shape[r - 1],
        dtype: x.dtype,
    })))
}

impl KernelCommon for DetGpu {
    fn describe(&self) -> String {
        format!("gpu det {} of {}x{}", self.matrices, self.m, self.m)
    }
}

impl GpuKernel for DetGpu {
    fn launch(&self) -> LaunchDims {
        LaunchDims::per_item(self.matrices as u64, THREADS)
    }

    fn scratch_bytes(&self) -> u64 {
        (self.matrices * self.m * self.m * 8) as u64
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        self.emit_matrices(k)?;
        k.ret()
    }
}

impl DetGpu {
    fn emit_matrices<'ctx>(&self, k: &GpuBuilder<'_, 'ctx>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let (f64t, i64t, boolt) = (e.cx.f64_type(), e.cx.i64_type(), e.cx.bool_type());
        let (x, y, scratch) = (k.input(0)?, k.output(0)?, k.scratch()?);
        let m = self.m as i64;
        let det = e.entry_alloca(f64t, "det")?;
        let pivot = e.entry_alloca(i64t, "pivot")?;
        let done = e.entry_alloca(boolt, "done")?;
        let fabs = |v: FloatValue<'ctx>| -> Result<FloatValue<'ctx>> {
            Ok(e.intrinsic("llvm.fabs", &[f64t.into()], &[v.into()])?
                .into_float_value())
        };
        k.grid_stride_loop(self.matrices as u64, THREADS, |mat| {
            let base = e.mulc(mat, m * m)?;
            // Element (i, j) of this thread's working copy.
            let at = |i: IntValue<'ctx>, j: IntValue<'ctx>| -> Result<PointerValue<'ctx>> {
                let idx = e.add(base, e.add(e.mulc(i, m)?, j)?)?;
                // SAFETY (of the IR): the scratch holds M·M f64 per matrix.
                unsafe { e.b.build_in_bounds_gep(f64t, scratch, &[idx], "") }.map_err(llvm)
            };
            let get = |i, j| load_local(&e, at(i, j)?);
            e.for_range(e.i64c(0), e.i64c(m * m), 1, |i| {
                let v = load_real(&e, x, self.dtype, e.add(base, i)?)?;
                // SAFETY (of the IR): as for `at`.
                let p = unsafe { e.b.build_in_bounds_gep(f64t, scratch, &[e.add(base, i)?], "") }
                    .map_err(llvm)?;
                e.store(p, v)
            })?;
            e.store(det, f64t.const_float(1.0))?;
            e.store(done, boolt.const_zero())?;
            e.for_range(e.i64c(0), e.i64c(m), 1, |c| {
                let live = e.b.build_load(boolt, done, "").map_err(llvm)?.into_int_value();
                let live = e.b.build_not(live, "").map_err(llvm)?;
                e.if_then(live, || {
                    // The pivot: the last row at or below c with the largest |w[i][c]|.
                    e.store(pivot, c)?;
                    e.for_range(e.addc(c, 1)?, e.i64c(m), 1, |i| {
                        let p = e.b.build_load(i64t, pivot, "").map_err(llvm)?.into_int_value();
                        let ge = e.fcmp_scalar(FloatPredicate::OGE, fabs(get(i, c)?)?, fabs(get(p, c)?)?)?;
                        e.store(pivot, e.select_int(ge, i, p)?)
                    })?;
                    let p = e.b.build_load(i64t, pivot, "").map_err(llvm)?.into_int_value();
                    let zero = e.fcmp_scalar(FloatPredicate::OEQ, get(p, c)?, f64t.const_zero())?;
                    e.if_else(
                        zero,
                        || {
                            e.store(det, f64t.const_zero())?;
                            e.store(done, boolt.const_all_ones())
                        },
                        || {
                            let swap = e.icmp(IntPredicate::NE, p, c)?;
                            e.if_then(swap, || {
                                e.for_range(e.i64c(0), e.i64c(m), 1, |kk| {
                                    let (a, b) = (get(p, kk)?, get(c, kk)?);
                                    e.store(at(p, kk)?, b)?;
                                    e.store(at(c, kk)?, a)
                                })?;
                                let d = load_local(&e, det)?;
                                e.store(det, e.b.build_float_neg(d, "").map_err(llvm)?)
                            })?;
                            let piv = get(c, c)?;
                            let d = load_local(&e, det)?;
                            e.store(det, e.b.build_float_mul(d, piv, "").map_err(llvm)?)?;
                            e.for_range(e.addc(c, 1)?, e.i64c(m), 1, |i| {
                                let f = e.b.build_float_div(get(i, c)?, piv, "").map_err(llvm)?;
                                e.for_range(c, e.i64c(m), 1, |kk| {
                                    let prod = e.b.build_float_mul(f, get(c, kk)?, "").map_err(llvm)?;
                                    let v = e.b.build_float_sub(get(i, kk)?, prod, "").map_err(llvm)?;
                                    e.store(at(i, kk)?, v)
                                })
                            })
                        },
                    )
                })
            })?;
            store_real(&e, y, self.dtype, mat, load_local(&e, det)?)
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check};
    use crate::test_rng::TestRng;
    use kiln_ir::{DType, Graph, MiscOp, Op, Tensor, TensorType};

    fn det(shape: &[usize], values: Vec<f32>) -> (Graph, Vec<Tensor>) {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, shape));
        let y = g.add("det", Op::Misc(MiscOp::Det), vec![Some(x)], "y").unwrap();
        g.add_output("y", y);
        (g, vec![Tensor::from_vec(shape.to_vec(), values)])
    }

    #[test]
    fn determinants_with_pivoting_and_singular_matrices() {
        let mut v = TestRng::new(3).vec_scaled(5 * 4 * 4, 2.0);
        // A singular matrix (two equal rows) and one needing a row swap (zero corner).
        v.copy_within(16..20, 20);
        v[32] = 0.0;
        let (g, inputs) = det(&[5, 4, 4], v);
        let kernels = check_graph(&g, &inputs);
        assert!(kernels.iter().all(|k| k.starts_with("gpu det")), "{kernels:?}");
        let (g, inputs) = det(&[1, 1], vec![-2.5]);
        check_graph(&g, &inputs);
    }

    #[test]
    fn ptx_assembles() {
        ptxas_check(&det(&[2, 3, 3], vec![0.0; 18]).0, 80);
    }
}
