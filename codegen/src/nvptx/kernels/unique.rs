//! Unique on the GPU, with the library kernel's results (`kiln_uk_unique` in movement.c): the
//! distinct slices of X along an axis (or its elements), compared lexicographically in
//! (outer, inner) order with NaN after every number and equal to itself; sorted, or in the
//! order of their first occurrences. Outputs: the slices, the first occurrence of each, the
//! slice each input slice became, the count of each. The number of distinct slices depends on
//! the data (`crate::data_dependent`): outputs 0, 1 and 3 hold their bound, values first, zeros
//! after, and the count goes to the frame's count slots.
//!
//! One block (`select::THREADS` threads), in phases between barriers, all over `n` slices:
//! 1. each slice's place in the stable sorted order, by counting the slices before it — O(n²)
//!    comparisons, spread over the block (which is why a large `n` stays a library kernel);
//! 2. the sorted order (`order[place] = slice`);
//! 3. the groups: a sorted place starts one when its slice differs from the previous one,
//!    compacted in order (`select::compact`) into each group's start and first occurrence
//!    (the stable sort puts the lowest index first);
//! 4. each slice's group, and the output order of the groups: themselves when sorted, else the
//!    order of their first occurrences (a compaction over the slices that are the first of
//!    their group);
//! 5. the outputs.

use super::gather::{int_type, move_unit};
use super::scalar::{load_int, load_real};
use super::select::{compact, one_block, THREADS};
use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims, Sreg};
use crate::target::TargetDesc;
use inkwell::values::{IntValue, PointerValue};
use inkwell::{FloatPredicate, IntPredicate};
use kiln_ir::{DType, Layout, MiscOp, Op, TensorType};

/// The most slice comparisons (times the elements compared) the O(n²) ranking may take; larger
/// inputs stay with the library kernel's merge sort.
const MAX_COMPARED_ELEMENTS: usize = 1 << 26;

/// The scratch arrays, `n` i64 each.
const ARRAYS: u64 = 7;

#[derive(Debug)]
struct UniqueGpu {
    dtype: DType,
    outer: i64,
    n: i64,
    inner: i64,
    sorted: bool,
    outputs: usize,
}

/// The kernel for a Unique of a static row-major numeric tensor, or None.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    let Op::Misc(MiscOp::Unique { sorted, .. }) = node.op() else {
        return Ok(None);
    };
    let ok = |t: &TensorType| t.layout == Layout::RowMajor && t.is_static();
    let Some(x) = node.input_type(0).filter(|t| ok(t)) else {
        return Ok(None);
    };
    let esize = x.dtype.size_bytes();
    if !(x.dtype.is_float() || x.dtype.is_int() || x.dtype == DType::Bool)
        || ![1, 2, 4, 8].contains(&esize)
        || !(0..node.n_outputs()).all(|o| ok(node.output_type(o)))
    {
        return Ok(None);
    }
    let Some(call) = crate::uk::lower(node)? else {
        return Ok(None);
    };
    let (outer, n, inner) = (
        call.iattr[0] as usize,
        call.iattr[1] as usize,
        call.iattr[2] as usize,
    );
    if n.saturating_mul(n).saturating_mul(outer * inner) > MAX_COMPARED_ELEMENTS {
        return Ok(None);
    }
    Ok(Some(Box::new(UniqueGpu {
        dtype: x.dtype,
        outer: outer as i64,
        n: n as i64,
        inner: inner as i64,
        sorted: *sorted,
        outputs: node.n_outputs(),
    })))
}

impl KernelCommon for UniqueGpu {
    fn describe(&self) -> String {
        format!(
            "gpu unique of {} slices of {} × {} {} ({}, one block)",
            self.n,
            self.outer,
            self.inner,
            self.dtype.name(),
            if self.sorted {
                "sorted"
            } else {
                "first occurrences"
            }
        )
    }
}

impl GpuKernel for UniqueGpu {
    fn launch(&self) -> LaunchDims {
        one_block()
    }

    fn scratch_bytes(&self) -> u64 {
        ARRAYS * self.n.max(1) as u64 * 8
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        self.body(k)
    }
}

impl UniqueGpu {
    /// -1, 0 or 1 as slice `p` comes before, with or after slice `q`.
    fn compare<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        x: PointerValue<'ctx>,
        p: IntValue<'ctx>,
        q: IntValue<'ctx>,
    ) -> Result<IntValue<'ctx>> {
        let i64t = e.cx.i64_type();
        let result = e.entry_alloca(i64t, "cmp")?;
        e.store(result, e.i64c(0))?;
        let (n, inner) = (self.n, self.inner);
        e.for_range(e.i64c(0), e.i64c(self.outer * inner), 1, |f| {
            let (o, i) = (e.udivc(f, inner)?, e.uremc(f, inner)?);
            let at = |s| -> Result<IntValue<'ctx>> { e.add(e.mulc(e.add(e.mulc(o, n)?, s)?, inner)?, i) };
            let (ip, iq) = (at(p)?, at(q)?);
            let order = if self.dtype.is_float() {
                let (a, b) = (load_real(e, x, self.dtype, ip)?, load_real(e, x, self.dtype, iq)?);
                let (an, bn) = (
                    e.fcmp_scalar(FloatPredicate::UNO, a, a)?,
                    e.fcmp_scalar(FloatPredicate::UNO, b, b)?,
                );
                let numbers = e.select_int(
                    e.fcmp_scalar(FloatPredicate::OLT, a, b)?,
                    e.i64c(-1),
                    e.select_int(e.fcmp_scalar(FloatPredicate::OGT, a, b)?, e.i64c(1), e.i64c(0))?,
                )?;
                // NaN after every number, equal to NaN.
                let nan_order = e.select_int(
                    e.icmp(IntPredicate::EQ, an, bn)?,
                    e.i64c(0),
                    e.select_int(an, e.i64c(1), e.i64c(-1))?,
                )?;
                let any_nan = e.b.build_or(an, bn, "").map_err(llvm)?;
                e.select_int(any_nan, nan_order, numbers)?
            } else {
                // As the library's kiln_load_i64: compared as signed 64-bit values.
                let (a, b) = (load_int(e, x, self.dtype, ip)?, load_int(e, x, self.dtype, iq)?);
                e.select_int(
                    e.icmp(IntPredicate::SLT, a, b)?,
                    e.i64c(-1),
                    e.select_int(e.icmp(IntPredicate::SGT, a, b)?, e.i64c(1), e.i64c(0))?,
                )?
            };
            let so_far = e.b.build_load(i64t, result, "").map_err(llvm)?.into_int_value();
            let undecided = e.icmp(IntPredicate::EQ, so_far, e.i64c(0))?;
            e.store(result, e.select_int(undecided, order, so_far)?)
        })?;
        Ok(e.b.build_load(i64t, result, "").map_err(llvm)?.into_int_value())
    }

    fn body<'ctx>(&self, k: &GpuBuilder<'_, 'ctx>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let (x, scratch) = (k.input(0)?, k.scratch()?);
        let i64t = k.cx.i64_type();
        let tid = k.sreg64(Sreg::TidX)?;
        let (n, t) = (self.n, THREADS);
        let array = |a: i64, i: IntValue<'ctx>| -> Result<PointerValue<'ctx>> {
            // SAFETY (of the IR): i < n, inside scratch array a.
            unsafe {
                e.b.build_in_bounds_gep(i64t, scratch, &[e.add(e.i64c(a * n), i)?], "")
            }
            .map_err(llvm)
        };
        let get = |a, i| -> Result<IntValue<'ctx>> {
            Ok(e.b
                .build_load(i64t, array(a, i)?, "")
                .map_err(llvm)?
                .into_int_value())
        };
        let set = |a, i, v: IntValue<'ctx>| e.store(array(a, i)?, v);
        // The scratch arrays.
        let (place, order, first, start, group, perm, out_id) = (0, 1, 2, 3, 4, 5, 6);
        let all = e.i64c(n);
        // 1. Each slice's place in the stable sorted order.
        e.for_range(tid, all, t, |p| {
            let before = e.entry_alloca(i64t, "before")?;
            e.store(before, e.i64c(0))?;
            e.for_range(e.i64c(0), all, 1, |q| {
                let c = self.compare(&e, x, q, p)?;
                let tie_first = e.b.build_and(
                    e.icmp(IntPredicate::EQ, c, e.i64c(0))?,
                    e.icmp(IntPredicate::ULT, q, p)?,
                    "",
                );
                let earlier = e.b.build_or(
                    e.icmp(IntPredicate::SLT, c, e.i64c(0))?,
                    tie_first.map_err(llvm)?,
                    "",
                );
                let add =
                    e.b.build_int_z_extend(earlier.map_err(llvm)?, i64t, "")
                        .map_err(llvm)?;
                let so_far = e.b.build_load(i64t, before, "").map_err(llvm)?.into_int_value();
                e.store(before, e.add(so_far, add)?)
            })?;
            set(
                place,
                p,
                e.b.build_load(i64t, before, "").map_err(llvm)?.into_int_value(),
            )
        })?;
        k.barrier()?;
        // 2. The sorted order.
        e.for_range(tid, all, t, |p| set(order, get(place, p)?, p))?;
        k.barrier()?;
        // 3. The groups, in sorted order: where each starts, and its first occurrence.
        let starts = |r: IntValue<'ctx>| -> Result<IntValue<'ctx>> {
            let at_zero = e.icmp(IntPredicate::EQ, r, e.i64c(0))?;
            // Place 0 compares with itself (equal), so no place before 0 is read.
            let prev = e.select_int(at_zero, r, e.addc(r, -1)?)?;
            let differs = e.icmp(
                IntPredicate::NE,
                self.compare(&e, x, get(order, prev)?, get(order, r)?)?,
                e.i64c(0),
            )?;
            e.b.build_or(at_zero, differs, "").map_err(llvm)
        };
        let groups = compact(k, &e, n, starts, |r, g| {
            set(start, g, r)?;
            set(first, g, get(order, r)?)
        })?;
        k.barrier()?;
        // Where group g ends in sorted order: the next group's start, or n for the last.
        let group_end = |g: IntValue<'ctx>| -> Result<IntValue<'ctx>> {
            let next = e.addc(g, 1)?;
            e.select_int(
                e.icmp(IntPredicate::ULT, next, groups)?,
                get(start, e.umin(next, e.i64c(n - 1))?)?,
                all,
            )
        };
        // 4. Each slice's group; the groups' output order.
        e.for_range(tid, groups, t, |g| {
            e.for_range(get(start, g)?, group_end(g)?, 1, |r| {
                set(group, get(order, r)?, g)
            })
        })?;
        k.barrier()?;
        if self.sorted {
            e.for_range(tid, groups, t, |g| {
                set(perm, g, g)?;
                set(out_id, g, g)
            })?;
        } else {
            let first_of_group =
                |p| -> Result<IntValue<'ctx>> { e.icmp(IntPredicate::EQ, get(first, get(group, p)?)?, p) };
            compact(k, &e, n, first_of_group, |p, j| {
                let g = get(group, p)?;
                set(perm, j, g)?;
                set(out_id, g, j)
            })?;
        }
        k.barrier()?;
        // 5. The outputs.
        let ints =
            |o: usize, len: i64, value: &dyn Fn(IntValue<'ctx>) -> Result<IntValue<'ctx>>| -> Result<()> {
                let y = k.output(o)?;
                e.for_range(tid, e.i64c(len), t, |j| {
                    // SAFETY (of the IR): j < len, the output's length.
                    let p = unsafe { e.b.build_in_bounds_gep(i64t, y, &[j], "") }.map_err(llvm)?;
                    e.store(p, value(j)?)
                })
            };
        let past = |j| e.icmp(IntPredicate::UGE, j, groups);
        if self.outputs > 0 {
            let y = k.output(0)?;
            let (es, inner) = (self.dtype.size_bytes() as i64, self.inner);
            let total = e.mulc(groups, self.outer * inner)?;
            e.for_range(tid, total, t, |f| {
                let i = e.uremc(f, inner)?;
                let og = e.udivc(f, inner)?;
                let o = e.b.build_int_unsigned_div(og, groups, "").map_err(llvm)?;
                let j = e.b.build_int_unsigned_rem(og, groups, "").map_err(llvm)?;
                let slice = get(first, get(perm, j)?)?;
                let from = e.add(e.mulc(e.add(e.mulc(o, n)?, slice)?, inner)?, i)?;
                move_unit(k, &e, es as u64, (x, e.mulc(from, es)?), (y, e.mulc(f, es)?))
            })?;
            let zero = int_type(k, es as u64).const_zero();
            let bound = self.outer * n * inner;
            e.for_range(e.add(total, tid)?, e.i64c(bound), t, |f| {
                e.store(e.gep_u8(y, e.mulc(f, es)?)?, zero)
            })?;
        }
        if self.outputs > 1 {
            // A group's first occurrence, in output order; zeros past the count.
            ints(1, n, &|j| {
                let last = e.umin(j, e.addc(groups, -1)?)?;
                let v = get(first, get(perm, last)?)?;
                e.select_int(past(j)?, e.i64c(0), v)
            })?;
        }
        if self.outputs > 2 {
            ints(2, n, &|p| get(out_id, get(group, p)?))?;
        }
        if self.outputs > 3 {
            // A group's count: the distance to the next group's start.
            let count_of =
                |g: IntValue<'ctx>| -> Result<IntValue<'ctx>> { e.sub(group_end(g)?, get(start, g)?) };
            ints(3, n, &|j| {
                let last = e.umin(j, e.addc(groups, -1)?)?;
                let c = count_of(get(perm, last)?)?;
                e.select_int(past(j)?, e.i64c(0), c)
            })?;
        }
        e.if_then(e.icmp(IntPredicate::EQ, tid, e.i64c(0))?, || {
            for o in [0, 1, 3] {
                if o < self.outputs {
                    k.store_count(o, groups)?;
                }
            }
            Ok(())
        })?;
        k.ret()
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check};
    use kiln_ir::{Graph, MiscOp, Op, Tensor, TensorType};

    /// Unique of `x` (along `axis`), its first `outputs` outputs graph outputs.
    fn graph(x: &Tensor, sorted: bool, axis: Option<i64>, outputs: usize) -> Graph {
        let mut g = Graph::new("t");
        let xv = g.add_input("x", TensorType::fixed(x.dtype(), x.shape()));
        let names: Vec<String> = ["y", "indices", "inverse", "counts"][..outputs]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let outs = g
            .add_node(
                "unique",
                Op::Misc(MiscOp::Unique { sorted, axis }),
                vec![Some(xv)],
                names.clone(),
            )
            .unwrap();
        for (name, v) in names.iter().zip(outs) {
            g.add_output(name, v);
        }
        g
    }

    #[test]
    fn distinct_elements_and_slices_sorted_and_in_first_occurrence_order() {
        // More elements than the block's threads, repeats everywhere, NaN (equal to itself,
        // after every number), -0 equal to +0.
        let v: Vec<f32> = (0..600)
            .map(|i| match i % 41 {
                7 => f32::NAN,
                9 => -0.0,
                _ => ((i * 13) % 37) as f32 - 18.0,
            })
            .collect();
        let x = Tensor::from_vec(vec![20, 30], v);
        for sorted in [true, false] {
            for outputs in [1, 2, 4] {
                let d = check_graph(&graph(&x, sorted, None, outputs), std::slice::from_ref(&x));
                assert!(d[0].starts_with("gpu unique"), "{d:?}");
            }
            // Rows and columns: a slice is all of its elements.
            let rows = Tensor::from_vec(
                vec![6, 4],
                (0..24).map(|i| ((i / 4) % 3 * 10 + i % 4) as i64).collect(),
            );
            for axis in [0, 1, -1] {
                check_graph(&graph(&rows, sorted, Some(axis), 4), std::slice::from_ref(&rows));
            }
            let cube = Tensor::from_vec(vec![2, 5, 3], (0..30i32).map(|i| (i * 7) % 4 - 1).collect());
            check_graph(&graph(&cube, sorted, Some(1), 4), std::slice::from_ref(&cube));
        }
        for sm in [80, 90] {
            ptxas_check(&graph(&x, false, None, 4), sm);
        }
    }
}
