//! TopK on the GPU (f32), in the library kernel's order (`kiln_uk_topk`): always sorted, the
//! largest (or smallest) first, NaN above every number, ties by the lower index.
//!
//! A block per row: K rounds, each finding the element that comes next in that order after
//! the previous round's pick — every thread scans its share of the row for the earliest
//! element strictly after it, and the block reduces the threads' candidates (value, index)
//! in shared memory. No element is marked or moved, so the input stays as it is; the cost is
//! K passes over the row, split over the block, which suits the K ≪ N of detection heads and
//! samplers.

use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims, Sreg};
use crate::target::TargetDesc;
use inkwell::values::{FloatValue, IntValue};
use inkwell::{FloatPredicate, IntPredicate};
use kiln_ir::{DType, Layout, Op};

#[derive(Debug)]
struct TopKGpu {
    outer: usize,
    n: usize,
    inner: usize,
    k: usize,
    largest: bool,
    threads: usize,
}

/// The kernel for an f32 TopK, or None.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    let Op::TopK { largest, .. } = node.op() else {
        return Ok(None);
    };
    let ok =
        |t: &kiln_ir::TensorType, d: DType| t.dtype == d && t.layout == Layout::RowMajor && t.is_static();
    if node.n_outputs() != 2
        || !node.input_type(0).is_some_and(|t| ok(t, DType::F32))
        || !ok(node.output_type(0), DType::F32)
        || !ok(node.output_type(1), DType::I64)
    {
        return Ok(None);
    }
    let Some(call) = crate::uk::lower(node)? else {
        return Ok(None);
    };
    let at = &call.iattr;
    let (outer, n, inner, k) = (at[0] as usize, at[1] as usize, at[2] as usize, at[3] as usize);
    if outer * inner == 0 || k == 0 || k > n || (outer * inner) as u64 >= 1 << 31 {
        return Ok(None);
    }
    Ok(Some(Box::new(TopKGpu {
        outer,
        n,
        inner,
        k,
        largest: *largest,
        threads: n.next_power_of_two().clamp(32, 256),
    })))
}

impl KernelCommon for TopKGpu {
    fn reads_input(&self, i: usize) -> bool {
        // K is compiled in.
        i == 0
    }

    fn describe(&self) -> String {
        format!(
            "gpu topk k={} of {} ({} rows, {})",
            self.k,
            self.n,
            self.outer * self.inner,
            if self.largest { "largest" } else { "smallest" }
        )
    }
}

impl TopKGpu {
    /// Whether (a, ai) comes strictly before (b, bi) in the output order.
    fn before<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        (a, ai): (FloatValue<'ctx>, IntValue<'ctx>),
        (b, bi): (FloatValue<'ctx>, IntValue<'ctx>),
    ) -> Result<IntValue<'ctx>> {
        let f = |p, x, y| e.b.build_float_compare(p, x, y, "").map_err(llvm);
        let or = |x, y| e.b.build_or(x, y, "").map_err(llvm);
        let and = |x, y| e.b.build_and(x, y, "").map_err(llvm);
        let (a_nan, b_nan) = (f(FloatPredicate::UNO, a, a)?, f(FloatPredicate::UNO, b, b)?);
        // NaN counts as above every number: first when taking the largest, last otherwise.
        let (wins, nan_wins) = if self.largest {
            (
                f(FloatPredicate::OGT, a, b)?,
                and(a_nan, e.b.build_not(b_nan, "").map_err(llvm)?)?,
            )
        } else {
            (
                f(FloatPredicate::OLT, a, b)?,
                and(b_nan, e.b.build_not(a_nan, "").map_err(llvm)?)?,
            )
        };
        let equal = or(f(FloatPredicate::OEQ, a, b)?, and(a_nan, b_nan)?)?;
        let tie = and(equal, e.icmp(IntPredicate::SLT, ai, bi)?)?;
        or(or(wins, nan_wins)?, tie)
    }

    /// The earlier of two candidates, an index of -1 meaning none.
    fn earlier<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        a: (FloatValue<'ctx>, IntValue<'ctx>),
        b: (FloatValue<'ctx>, IntValue<'ctx>),
    ) -> Result<(FloatValue<'ctx>, IntValue<'ctx>)> {
        let a_none = e.icmp(IntPredicate::SLT, a.1, e.i64c(0))?;
        let b_none = e.icmp(IntPredicate::SLT, b.1, e.i64c(0))?;
        let take_b =
            e.b.build_or(
                a_none,
                e.b.build_and(
                    e.b.build_not(b_none, "").map_err(llvm)?,
                    self.before(e, b, a)?,
                    "",
                )
                .map_err(llvm)?,
                "",
            )
            .map_err(llvm)?;
        let v =
            e.b.build_select(take_b, b.0, a.0, "")
                .map_err(llvm)?
                .into_float_value();
        let i =
            e.b.build_select(take_b, b.1, a.1, "")
                .map_err(llvm)?
                .into_int_value();
        Ok((v, i))
    }
}

impl GpuKernel for TopKGpu {
    fn launch(&self) -> LaunchDims {
        LaunchDims {
            grid: [(self.outer * self.inner) as u32, 1, 1],
            block: [self.threads as u32, 1, 1],
            // Candidates' values (f32) and indices (i64).
            shared_bytes: (self.threads * 12) as u32,
        }
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let (x, values, indices) = (k.input(0)?, k.output(0)?, k.output(1)?);
        let (t, n, inner) = (self.threads as i64, self.n as i64, self.inner as i64);
        let tid = k.sreg64(Sreg::TidX)?;
        let row = k.sreg64(Sreg::CtaidX)?;
        let (o, i) = (e.udivc(row, inner)?, e.uremc(row, inner)?);
        let base = e.add(e.mulc(o, n * inner)?, i)?;
        let smem = k.shared()?;
        let sv = smem;
        let si = e.gep_f32c(smem, t)?;
        let i64t = k.cx.i64_type();
        let slot_i = |j| -> Result<_> {
            // SAFETY (of the IR): j < threads, inside the shared index array.
            unsafe { e.b.build_in_bounds_gep(i64t, si, &[j], "") }.map_err(llvm)
        };
        let prev_v = e.entry_alloca(k.cx.f32_type(), "prev_v")?;
        let prev_i = e.entry_alloca(i64t, "prev_i")?;
        let best_v = e.entry_alloca(k.cx.f32_type(), "best_v")?;
        let best_i = e.entry_alloca(i64t, "best_i")?;
        e.store(prev_v, e.f32c(0.0))?;
        e.store(prev_i, e.i64c(-1))?;
        e.for_range(e.i64c(0), e.i64c(self.k as i64), 1, |r| {
            let prev = (
                e.load_f32(prev_v)?,
                e.b.build_load(i64t, prev_i, "").map_err(llvm)?.into_int_value(),
            );
            let first = e.icmp(IntPredicate::SLT, prev.1, e.i64c(0))?;
            e.store(best_v, e.f32c(0.0))?;
            e.store(best_i, e.i64c(-1))?;
            // This thread's earliest element after the previous pick.
            e.for_range(tid, e.i64c(n), t, |j| {
                let v = e.load_f32(e.gep_f32(x, e.add(base, e.mulc(j, inner)?)?)?)?;
                let after =
                    e.b.build_or(first, self.before(&e, prev, (v, j))?, "")
                        .map_err(llvm)?;
                e.if_then(after, || {
                    let cur = (
                        e.load_f32(best_v)?,
                        e.b.build_load(i64t, best_i, "").map_err(llvm)?.into_int_value(),
                    );
                    let (bv, bi) = self.earlier(&e, cur, (v, j))?;
                    e.store(best_v, bv)?;
                    e.store(best_i, bi)
                })
            })?;
            // The block's earliest: a tree over the threads' candidates.
            e.store(e.gep_f32(sv, tid)?, e.load_f32(best_v)?)?;
            e.store(slot_i(tid)?, e.b.build_load(i64t, best_i, "").map_err(llvm)?)?;
            k.barrier()?;
            let mut s = t / 2;
            while s >= 1 {
                let active = e.icmp(IntPredicate::ULT, tid, e.i64c(s))?;
                e.if_then(active, || {
                    let other = e.addc(tid, s)?;
                    let a = (
                        e.load_f32(e.gep_f32(sv, tid)?)?,
                        e.b.build_load(i64t, slot_i(tid)?, "")
                            .map_err(llvm)?
                            .into_int_value(),
                    );
                    let b = (
                        e.load_f32(e.gep_f32(sv, other)?)?,
                        e.b.build_load(i64t, slot_i(other)?, "")
                            .map_err(llvm)?
                            .into_int_value(),
                    );
                    let (v, idx) = self.earlier(&e, a, b)?;
                    e.store(e.gep_f32(sv, tid)?, v)?;
                    e.store(slot_i(tid)?, idx)
                })?;
                k.barrier()?;
                s /= 2;
            }
            let v = e.load_f32(sv)?;
            let idx =
                e.b.build_load(i64t, slot_i(e.i64c(0))?, "")
                    .map_err(llvm)?
                    .into_int_value();
            e.store(prev_v, v)?;
            e.store(prev_i, idx)?;
            let lead = e.icmp(IntPredicate::EQ, tid, e.i64c(0))?;
            e.if_then(lead, || {
                let at = e.add(e.mulc(e.add(e.mulc(o, self.k as i64)?, r)?, inner)?, i)?;
                e.store(e.gep_f32(values, at)?, v)?;
                // SAFETY (of the IR): at indexes the indices output.
                let p = unsafe { e.b.build_in_bounds_gep(i64t, indices, &[at], "") }.map_err(llvm)?;
                e.store(p, idx)
            })?;
            // The slots are written again next round.
            k.barrier()
        })?;
        k.ret()
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check};
    use kiln_ir::{DType, Graph, Op, Tensor, TensorType};

    /// TopK of `x` along `axis`, both outputs.
    fn graph(x: Tensor, axis: i64, k: i64, largest: bool) -> (Graph, Vec<Tensor>) {
        let mut g = Graph::new("t");
        let xv = g.add_input("x", TensorType::fixed(DType::F32, x.shape()));
        let kv = g.add_const("k", Tensor::from_vec(vec![1], vec![k]));
        let outs = g
            .add_node(
                "topk",
                Op::TopK {
                    axis,
                    largest,
                    sorted: true,
                },
                vec![Some(xv), Some(kv)],
                vec!["values".into(), "indices".into()],
            )
            .unwrap();
        g.add_output("values", outs[0]);
        g.add_output("indices", outs[1]);
        (g, vec![x])
    }

    #[test]
    fn largest_and_smallest_with_ties_and_nan() {
        // Few distinct values (many ties, resolved by the lower index) and NaNs, rows longer
        // than a block, the last axis and a middle one, K up to the whole row.
        let n = 300;
        let v: Vec<f32> = (0..2 * n)
            .map(|i| match i % 97 {
                13 => f32::NAN,
                _ => ((i * 31) % 17) as f32 - 8.0,
            })
            .collect();
        for largest in [true, false] {
            for k in [1, 7, 23] {
                let (g, inputs) = graph(Tensor::from_vec(vec![2, n], v.clone()), -1, k, largest);
                let d = check_graph(&g, &inputs);
                assert!(d[0].starts_with("gpu topk"), "{d:?}");
            }
            let (g, inputs) = graph(
                Tensor::from_vec(vec![2, 15, 20], v[..600].to_vec()),
                1,
                15,
                largest,
            );
            check_graph(&g, &inputs);
        }
        let (g, _) = graph(Tensor::from_vec(vec![2, n], v), -1, 5, true);
        for sm in [80, 90] {
            ptxas_check(&g, sm);
        }
    }
}
