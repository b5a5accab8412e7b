//! TopK on the GPU, for every numeric dtype, in the library kernel's order (`kiln_uk_topk`):
//! always sorted, the largest (or smallest) first, NaN above every number, ties by the lower
//! index.
//!
//! Each element is compared through an order key, a u64 whose unsigned order is the value
//! order: integers with the sign bit flipped (signed) or as they are (unsigned), floats
//! (widened to f64) by the usual sign-magnitude flip, -0 as +0 and every NaN as the largest key
//! so that equal values tie. One kernel then serves every dtype.
//!
//! A block per row: K rounds, each finding the element that comes next in that order after
//! the previous round's pick — every thread scans its share of the row for the earliest
//! element strictly after it, and the block reduces the threads' candidates (key, index)
//! in shared memory. No element is marked or moved, so the input stays as it is; the cost is
//! K passes over the row, split over the block, which suits the K ≪ N of detection heads and
//! samplers. The picked value is copied from the input at the picked index.

use crate::error::Result;
use crate::gen::elementwise as ew;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims, Sreg};
use crate::target::TargetDesc;
use inkwell::values::{IntValue, PointerValue};
use inkwell::{FloatPredicate, IntPredicate};
use kiln_ir::{DType, Layout, Op};

#[derive(Debug)]
struct TopKGpu {
    dtype: DType,
    outer: usize,
    n: usize,
    inner: usize,
    k: usize,
    largest: bool,
    threads: usize,
}

/// The kernel for a TopK of a numeric tensor, or None.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    let Op::TopK { largest, .. } = node.op() else {
        return Ok(None);
    };
    let ok = |t: &kiln_ir::TensorType| t.layout == Layout::RowMajor && t.is_static();
    let Some(x) = node.input_type(0).filter(|t| ok(t)) else {
        return Ok(None);
    };
    let dtype = x.dtype;
    if node.n_outputs() != 2
        || !(dtype.is_float() || dtype.is_int())
        || !ok(node.output_type(0))
        || node.output_type(0).dtype != dtype
        || !ok(node.output_type(1))
        || node.output_type(1).dtype != DType::I64
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
        dtype,
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
            "gpu topk k={} of {} ({} rows, {}, {})",
            self.k,
            self.n,
            self.outer * self.inner,
            if self.largest { "largest" } else { "smallest" },
            self.dtype.name()
        )
    }
}

/// The order key of element `i` of `x` (see the module comment).
fn order_key<'ctx>(
    e: &Emit<'_, 'ctx>,
    x: PointerValue<'ctx>,
    dtype: DType,
    i: IntValue<'ctx>,
) -> Result<IntValue<'ctx>> {
    let i64t = e.cx.i64_type();
    let sign = e.i64c(i64::MIN);
    let xor = |a, b| e.b.build_xor(a, b, "").map_err(llvm);
    if dtype.is_float() {
        let v = super::scalar::load_real(e, x, dtype, i)?;
        // +0.0 turns -0 into +0, so that the two tie as the comparison of values does.
        let v =
            e.b.build_float_add(v, e.cx.f64_type().const_float(0.0), "")
                .map_err(llvm)?;
        let bits = e.b.build_bit_cast(v, i64t, "").map_err(llvm)?.into_int_value();
        let negative = e.icmp(IntPredicate::SLT, bits, e.i64c(0))?;
        let key = e.select_int(negative, e.b.build_not(bits, "").map_err(llvm)?, xor(bits, sign)?)?;
        let nan = e.fcmp_scalar(FloatPredicate::UNO, v, v)?;
        return e.select_int(nan, e.i64c(-1), key);
    }
    let wide = super::scalar::load_int(e, x, dtype, i)?;
    if dtype.is_signed_int() {
        xor(wide, sign)
    } else {
        Ok(wide)
    }
}

impl TopKGpu {
    /// Whether (a, ai) comes strictly before (b, bi) in the output order.
    fn before<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        (a, ai): (IntValue<'ctx>, IntValue<'ctx>),
        (b, bi): (IntValue<'ctx>, IntValue<'ctx>),
    ) -> Result<IntValue<'ctx>> {
        let wins = e.icmp(
            if self.largest {
                IntPredicate::UGT
            } else {
                IntPredicate::ULT
            },
            a,
            b,
        )?;
        let tie = e.b.build_and(
            e.icmp(IntPredicate::EQ, a, b)?,
            e.icmp(IntPredicate::SLT, ai, bi)?,
            "",
        );
        e.b.build_or(wins, tie.map_err(llvm)?, "").map_err(llvm)
    }

    /// The earlier of two candidates, an index of -1 meaning none.
    fn earlier<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        a: (IntValue<'ctx>, IntValue<'ctx>),
        b: (IntValue<'ctx>, IntValue<'ctx>),
    ) -> Result<(IntValue<'ctx>, IntValue<'ctx>)> {
        let a_none = e.icmp(IntPredicate::SLT, a.1, e.i64c(0))?;
        let b_none = e.icmp(IntPredicate::SLT, b.1, e.i64c(0))?;
        let b_first = e.b.build_and(
            e.b.build_not(b_none, "").map_err(llvm)?,
            self.before(e, b, a)?,
            "",
        );
        let take_b = e.b.build_or(a_none, b_first.map_err(llvm)?, "").map_err(llvm)?;
        Ok((e.select_int(take_b, b.0, a.0)?, e.select_int(take_b, b.1, a.1)?))
    }
}

impl GpuKernel for TopKGpu {
    fn launch(&self) -> LaunchDims {
        LaunchDims {
            grid: [(self.outer * self.inner) as u32, 1, 1],
            block: [self.threads as u32, 1, 1],
            // Candidates' keys and indices (both i64).
            shared_bytes: (self.threads * 16) as u32,
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
        let i64t = k.cx.i64_type();
        let smem = k.shared()?;
        let slot = |array: i64, j| -> Result<PointerValue<'_>> {
            // SAFETY (of the IR): j < threads, inside the shared key or index array.
            unsafe {
                e.b.build_in_bounds_gep(i64t, smem, &[e.add(e.i64c(array * t), j)?], "")
            }
            .map_err(llvm)
        };
        let load =
            |p| -> Result<IntValue<'_>> { Ok(e.b.build_load(i64t, p, "").map_err(llvm)?.into_int_value()) };
        let candidate = |kp, ip| -> Result<(IntValue<'_>, IntValue<'_>)> { Ok((load(kp)?, load(ip)?)) };
        let prev_k = e.entry_alloca(i64t, "prev_key")?;
        let prev_i = e.entry_alloca(i64t, "prev_i")?;
        let best_k = e.entry_alloca(i64t, "best_key")?;
        let best_i = e.entry_alloca(i64t, "best_i")?;
        e.store(prev_k, e.i64c(0))?;
        e.store(prev_i, e.i64c(-1))?;
        e.for_range(e.i64c(0), e.i64c(self.k as i64), 1, |r| {
            let prev = candidate(prev_k, prev_i)?;
            let first = e.icmp(IntPredicate::SLT, prev.1, e.i64c(0))?;
            e.store(best_k, e.i64c(0))?;
            e.store(best_i, e.i64c(-1))?;
            // This thread's earliest element after the previous pick.
            e.for_range(tid, e.i64c(n), t, |j| {
                let key = order_key(&e, x, self.dtype, e.add(base, e.mulc(j, inner)?)?)?;
                let after =
                    e.b.build_or(first, self.before(&e, prev, (key, j))?, "")
                        .map_err(llvm)?;
                e.if_then(after, || {
                    let (bk, bi) = self.earlier(&e, candidate(best_k, best_i)?, (key, j))?;
                    e.store(best_k, bk)?;
                    e.store(best_i, bi)
                })
            })?;
            // The block's earliest: a tree over the threads' candidates.
            e.store(slot(0, tid)?, load(best_k)?)?;
            e.store(slot(1, tid)?, load(best_i)?)?;
            k.barrier()?;
            let mut s = t / 2;
            while s >= 1 {
                let active = e.icmp(IntPredicate::ULT, tid, e.i64c(s))?;
                e.if_then(active, || {
                    let other = e.addc(tid, s)?;
                    let a = candidate(slot(0, tid)?, slot(1, tid)?)?;
                    let b = candidate(slot(0, other)?, slot(1, other)?)?;
                    let (key, idx) = self.earlier(&e, a, b)?;
                    e.store(slot(0, tid)?, key)?;
                    e.store(slot(1, tid)?, idx)
                })?;
                k.barrier()?;
                s /= 2;
            }
            let zero = e.i64c(0);
            let (key, idx) = candidate(slot(0, zero)?, slot(1, zero)?)?;
            e.store(prev_k, key)?;
            e.store(prev_i, idx)?;
            let lead = e.icmp(IntPredicate::EQ, tid, zero)?;
            e.if_then(lead, || {
                let at = e.add(e.mulc(e.add(e.mulc(o, self.k as i64)?, r)?, inner)?, i)?;
                let v = ew::load_one(&e, x, self.dtype, e.add(base, e.mulc(idx, inner)?)?)?;
                ew::store_one(&e, values, self.dtype, at, v)?;
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
    use half::f16;
    use kiln_ir::{Graph, Op, Tensor, TensorType};

    /// TopK of `x` along `axis`, both outputs.
    fn graph(x: Tensor, axis: i64, k: i64, largest: bool) -> (Graph, Vec<Tensor>) {
        let mut g = Graph::new("t");
        let xv = g.add_input("x", TensorType::fixed(x.dtype(), x.shape()));
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

    #[test]
    fn every_dtype_by_its_own_order() {
        // Keys must order each dtype as its values: u64 above 2^63 (wrong if compared signed),
        // i64 negatives and i64::MIN (wrong without the sign flip), f64 with -0 tying +0 and
        // NaN, f16 and i8 through their narrow loads; repeated values tie by index.
        let n = 40;
        let u: Vec<u64> = (0..2 * n as u64)
            .map(|i| (i % 7).wrapping_mul(0x9000_0000_0000_0000 / 3) ^ (i % 3))
            .collect();
        let s: Vec<i64> = (0..2 * n as i64)
            .map(|i| match i % 11 {
                4 => i64::MIN,
                5 => i64::MAX,
                _ => (i % 5 - 2).wrapping_mul(1 << 40),
            })
            .collect();
        let f: Vec<f64> = (0..2 * n)
            .map(|i| match i % 9 {
                2 => -0.0,
                3 => 0.0,
                6 => f64::NAN,
                _ => (i % 4) as f64 - 1.5,
            })
            .collect();
        let h: Vec<f16> = f.iter().map(|&v| f16::from_f64(v)).collect();
        let b: Vec<i8> = (0..2 * n).map(|i| ((i * 37) % 256) as u8 as i8).collect();
        let inputs = [
            Tensor::from_vec(vec![2, n], u),
            Tensor::from_vec(vec![2, n], s),
            Tensor::from_vec(vec![2, n], f),
            Tensor::from_vec(vec![2, n], h),
            Tensor::from_vec(vec![2, n], b),
        ];
        for x in inputs {
            for (largest, k) in [(true, 9), (false, 9), (true, n as i64)] {
                let (g, inputs) = graph(x.clone(), -1, k, largest);
                let d = check_graph(&g, &inputs);
                assert!(d[0].starts_with("gpu topk"), "{d:?}");
            }
        }
    }
}
