//! NonZero and Compress on the GPU: operators that select, so that their output's extent is a
//! count only the data decides (`crate::data_dependent`). The output buffer holds the bound;
//! the kernel writes the selected values first, zeros after them (what kernels computing on
//! the bound read there), and the count into the frame's count slots
//! ([`GpuBuilder::store_count`]), from where the host sets the graph outputs' shapes.
//!
//! One block: the selection's order is the input's, so each selected item's place is the
//! number of selected items before it. The block splits the items into one contiguous share
//! per thread; each thread counts its share's selected items, the counts meet in shared
//! memory, and each thread's place is the sum of the counts before its own — then it walks its
//! share again and writes each selected item at its place ([`compact`]). A block because only
//! a block has a barrier; selecting is post-processing, a small part of a model's time.
//! The results are the library kernels' (`kiln_uk_nonzero`, `kiln_uk_compress` in
//! movement.c), bit for bit.

use super::gather::{int_type, move_unit};
use super::scalar::{load_int, load_real};
use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims, Sreg, EINDEX};
use crate::target::TargetDesc;
use inkwell::values::IntValue;
use inkwell::{FloatPredicate, IntPredicate};
use kiln_ir::{DType, Layout, MiscOp, Op, TensorType};

pub(super) const THREADS: i64 = 256;

/// The block's shared memory: a count per thread (i64).
const SHARED_BYTES: u32 = (THREADS * 8) as u32;

/// Calls `write(item, place)` for every item in `0..len` that `selected` picks, `place` its
/// rank among the selected items in item order; returns how many were selected (the same
/// value in every thread). Every thread of a block of [`THREADS`] must call it; `selected`
/// is evaluated twice per item, so it must not write anything.
pub(super) fn compact<'ctx>(
    k: &GpuBuilder<'_, 'ctx>,
    e: &Emit<'_, 'ctx>,
    len: i64,
    selected: impl Fn(IntValue<'ctx>) -> Result<IntValue<'ctx>>,
    mut write: impl FnMut(IntValue<'ctx>, IntValue<'ctx>) -> Result<()>,
) -> Result<IntValue<'ctx>> {
    let i64t = k.cx.i64_type();
    let weight =
        |i| -> Result<IntValue<'ctx>> { e.b.build_int_z_extend(selected(i)?, i64t, "").map_err(llvm) };
    scan(k, e, THREADS, len, weight, |i, place, w| {
        e.if_then(e.icmp(IntPredicate::NE, w, e.i64c(0))?, || write(i, place))
    })
}

/// The exclusive prefix sum of `weight` over the items `0..len` in order: calls
/// `write(item, offset, weight)` for every item, `offset` the sum of the weights before it;
/// returns the sum of all (the same value in every thread). Every thread of the block
/// (`threads` of them, with `8 · threads` bytes of shared memory from its start) must call it;
/// `weight` is evaluated twice per item, so it must not write anything.
pub(super) fn scan<'ctx>(
    k: &GpuBuilder<'_, 'ctx>,
    e: &Emit<'_, 'ctx>,
    threads: i64,
    len: i64,
    weight: impl Fn(IntValue<'ctx>) -> Result<IntValue<'ctx>>,
    mut write: impl FnMut(IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>) -> Result<()>,
) -> Result<IntValue<'ctx>> {
    let i64t = k.cx.i64_type();
    let tid = k.sreg64(Sreg::TidX)?;
    let share = (len + threads - 1) / threads;
    let lo = e.umin(e.mulc(tid, share)?, e.i64c(len))?;
    let hi = e.umin(e.addc(lo, share)?, e.i64c(len))?;
    let sums = k.shared()?;
    let sum_of = |t| -> Result<_> {
        // SAFETY (of the IR): t < threads, inside the shared sums.
        unsafe { e.b.build_in_bounds_gep(i64t, sums, &[t], "") }.map_err(llvm)
    };
    let load =
        |p| -> Result<IntValue<'ctx>> { Ok(e.b.build_load(i64t, p, "").map_err(llvm)?.into_int_value()) };
    let mine = e.entry_alloca(i64t, "share_sum")?;
    e.store(mine, e.i64c(0))?;
    e.for_range(lo, hi, 1, |i| e.store(mine, e.add(load(mine)?, weight(i)?)?))?;
    e.store(sum_of(tid)?, load(mine)?)?;
    k.barrier()?;
    let (before, total) = (e.entry_alloca(i64t, "before")?, e.entry_alloca(i64t, "total")?);
    e.store(before, e.i64c(0))?;
    e.store(total, e.i64c(0))?;
    e.for_range(e.i64c(0), e.i64c(threads), 1, |t| {
        let c = load(sum_of(t)?)?;
        e.if_then(e.icmp(IntPredicate::ULT, t, tid)?, || {
            e.store(before, e.add(load(before)?, c)?)
        })?;
        e.store(total, e.add(load(total)?, c)?)
    })?;
    // The sums are read; a later scan may write them again.
    k.barrier()?;
    e.for_range(lo, hi, 1, |i| {
        let offset = load(before)?;
        let w = weight(i)?;
        write(i, offset, w)?;
        e.store(before, e.add(offset, w)?)
    })?;
    load(total)
}

/// Whether element `i` of `x` is not zero as the reference has it (NaN is, -0.0 is not).
fn non_zero<'ctx>(
    e: &Emit<'_, 'ctx>,
    x: inkwell::values::PointerValue<'ctx>,
    dtype: DType,
    i: IntValue<'ctx>,
) -> Result<IntValue<'ctx>> {
    if dtype.is_float() {
        let v = load_real(e, x, dtype, i)?;
        return e.fcmp_scalar(FloatPredicate::UNE, v, e.cx.f64_type().const_zero());
    }
    e.icmp(IntPredicate::NE, load_int(e, x, dtype, i)?, e.i64c(0))
}

fn row_major_static(t: &TensorType) -> bool {
    t.layout == Layout::RowMajor && t.is_static()
}

/// NonZero: the coordinates of the non-zero elements, `[rank, count]` i64.
#[derive(Debug)]
struct NonZeroGpu {
    dims: Vec<usize>,
    dtype: DType,
    /// The output in its bound's layout (`[rank, numel]`, read by kernels) rather than
    /// compacted (`[rank, count]`, a graph output).
    padded: bool,
}

/// Compress along an axis (or of the flattened tensor) by a run-time condition.
#[derive(Debug)]
struct CompressGpu {
    outer: i64,
    n: i64,
    inner: i64,
    /// The condition's length (shorter or longer than the axis).
    cond_len: i64,
    esize: u64,
    /// The output's elements: the bound (or, for a constant condition, the exact size).
    out_len: i64,
    /// Its output's extent is a count: the condition is not a constant.
    counted: bool,
}

/// The kernel for a NonZero or a Compress of static row-major tensors, or None.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    let Some(x) = node.input_type(0).filter(|t| row_major_static(t)) else {
        return Ok(None);
    };
    if !row_major_static(node.output_type(0)) {
        return Ok(None);
    }
    match node.op() {
        Op::NonZero if x.dtype.is_float() || x.dtype.is_int() || x.dtype == DType::Bool => {
            let Some(call) = crate::uk::lower(node)? else {
                return Ok(None);
            };
            Ok(Some(Box::new(NonZeroGpu {
                dims: node.input_shape(0)?,
                dtype: x.dtype,
                padded: call.iattr.first() == Some(&1),
            })))
        }
        Op::Misc(MiscOp::Compress { .. }) => {
            let esize = x.dtype.size_bytes() as u64;
            let Some(cond) = node.input_type(1).filter(|t| row_major_static(t)) else {
                return Ok(None);
            };
            if cond.dtype != DType::Bool || ![1, 2, 4, 8].contains(&esize) {
                return Ok(None);
            }
            let Some(call) = crate::uk::lower(node)? else {
                return Ok(None);
            };
            let at = &call.iattr;
            Ok(Some(Box::new(CompressGpu {
                outer: at[0],
                n: at[1],
                inner: at[2],
                cond_len: node.input_shape(1)?.iter().product::<usize>() as i64,
                esize,
                out_len: node.output_shape(0)?.iter().product::<usize>() as i64,
                counted: crate::data_dependent::root(node.graph, node.id.out(0))?.is_some(),
            })))
        }
        _ => Ok(None),
    }
}

pub(super) fn one_block() -> LaunchDims {
    LaunchDims {
        grid: [1, 1, 1],
        block: [THREADS as u32, 1, 1],
        shared_bytes: SHARED_BYTES,
    }
}

impl KernelCommon for NonZeroGpu {
    fn describe(&self) -> String {
        format!(
            "gpu nonzero of {:?} {} ({}, one block)",
            self.dims,
            self.dtype.name(),
            if self.padded { "bound layout" } else { "compacted" }
        )
    }
}

impl GpuKernel for NonZeroGpu {
    fn launch(&self) -> LaunchDims {
        one_block()
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let (x, y) = (k.input(0)?, k.output(0)?);
        let i64t = k.cx.i64_type();
        let tid = k.sreg64(Sreg::TidX)?;
        let numel: i64 = self.dims.iter().product::<usize>() as i64;
        let rank = self.dims.len() as i64;
        let at = |i| -> Result<_> {
            // SAFETY (of the IR): i < rank × numel, the bound's length.
            unsafe { e.b.build_in_bounds_gep(i64t, y, &[i], "") }.map_err(llvm)
        };
        // Zeros first: what the bound holds past the count.
        e.for_range(tid, e.i64c(rank * numel), THREADS, |i| e.store(at(i)?, e.i64c(0)))?;
        let selected = |i| non_zero(&e, x, self.dtype, i);
        // Counted first, written after: the compacted layout's stride is the count.
        let count = compact(k, &e, numel, selected, |_, _| Ok(()))?;
        let stride = match self.padded {
            true => e.i64c(numel),
            false => count,
        };
        compact(k, &e, numel, selected, |i, place| {
            for (d, coord) in e.unravel(i, &self.dims)?.into_iter().enumerate() {
                e.store(at(e.add(e.mul(e.i64c(d as i64), stride)?, place)?)?, coord)?;
            }
            Ok(())
        })?;
        e.if_then(e.icmp(IntPredicate::EQ, tid, e.i64c(0))?, || {
            k.store_count(0, count)
        })?;
        k.ret()
    }
}

impl KernelCommon for CompressGpu {
    fn describe(&self) -> String {
        format!(
            "gpu compress of {} slices of {} × {} (one block)",
            self.n, self.outer, self.inner
        )
    }
}

impl GpuKernel for CompressGpu {
    fn launch(&self) -> LaunchDims {
        one_block()
    }

    fn scratch_bytes(&self) -> u64 {
        // The selected slices' indices along the axis, in order.
        self.n.max(1) as u64 * 8
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let (x, cond, y, picks) = (k.input(0)?, k.input(1)?, k.output(0)?, k.scratch()?);
        let i64t = k.cx.i64_type();
        let tid = k.sreg64(Sreg::TidX)?;
        let pick = |j| -> Result<_> {
            // SAFETY (of the IR): j < count ≤ n, the scratch's length.
            unsafe { e.b.build_in_bounds_gep(i64t, picks, &[j], "") }.map_err(llvm)
        };
        let selected =
            |c| -> Result<_> { e.icmp(IntPredicate::NE, load_int(&e, cond, DType::Bool, c)?, e.i64c(0)) };
        // A condition longer than the axis may not select past it.
        e.for_range(e.addc(tid, self.n)?, e.i64c(self.cond_len), THREADS, |c| {
            e.if_then(selected(c)?, || k.report_error(EINDEX))
        })?;
        let considered = self.cond_len.min(self.n);
        let count = compact(k, &e, considered, selected, |c, place| e.store(pick(place)?, c))?;
        k.barrier()?;
        // Element (o, j, i) of the output, j < count, is element (o, picks[j], i) of X.
        let (es, inner) = (self.esize as i64, self.inner);
        let total = e.mulc(count, self.outer * inner)?;
        e.for_range(tid, total, THREADS, |f| {
            let i = e.uremc(f, inner)?;
            let oj = e.udivc(f, inner)?;
            let o = e.b.build_int_unsigned_div(oj, count, "").map_err(llvm)?;
            let j = e.b.build_int_unsigned_rem(oj, count, "").map_err(llvm)?;
            let slice = e.b.build_load(i64t, pick(j)?, "").map_err(llvm)?.into_int_value();
            let from = e.add(e.mulc(e.add(e.mulc(o, self.n)?, slice)?, inner)?, i)?;
            move_unit(k, &e, self.esize, (x, e.mulc(from, es)?), (y, e.mulc(f, es)?))
        })?;
        let zero = int_type(k, self.esize).const_zero();
        e.for_range(e.add(total, tid)?, e.i64c(self.out_len), THREADS, |f| {
            e.store(e.gep_u8(y, e.mulc(f, es)?)?, zero)
        })?;
        if self.counted {
            e.if_then(e.icmp(IntPredicate::EQ, tid, e.i64c(0))?, || {
                k.store_count(0, count)
            })?;
        }
        k.ret()
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check, run_graph};
    use kiln_ir::{DType, Graph, MiscOp, Op, Tensor, TensorType};

    /// NonZero of `x`, a graph output, or read by a Transpose (its bound's layout).
    fn nonzero(x: &Tensor, transposed: bool) -> Graph {
        let mut g = Graph::new("t");
        let xv = g.add_input("x", TensorType::fixed(x.dtype(), x.shape()));
        let nz = g.add("nz", Op::NonZero, vec![Some(xv)], "nz").unwrap();
        let out = match transposed {
            true => g
                .add("t", Op::Transpose { perm: vec![1, 0] }, vec![Some(nz)], "coords")
                .unwrap(),
            false => nz,
        };
        g.add_output("y", out);
        g
    }

    #[test]
    fn nonzero_compacted_and_in_its_bound_across_thread_shares() {
        // More elements than threads (several per share, shares that select nothing), NaN
        // counted and -0.0 not, integers and bool.
        let v: Vec<f32> = (0..1500)
            .map(|i| match i % 13 {
                0 => f32::NAN,
                3 => -0.0,
                5 | 7 => 1.5,
                _ if (600..900).contains(&i) => 2.0,
                _ => 0.0,
            })
            .collect();
        let f = Tensor::from_vec(vec![3, 20, 25], v);
        for transposed in [false, true] {
            let d = check_graph(&nonzero(&f, transposed), std::slice::from_ref(&f));
            assert!(d[0].starts_with("gpu nonzero"), "{d:?}");
        }
        let i = Tensor::from_vec(vec![7, 9], (0..63i32).map(|i| i % 4 - 1).collect());
        check_graph(&nonzero(&i, false), std::slice::from_ref(&i));
        let b = Tensor::new(
            vec![40],
            kiln_ir::TensorData::Bool((0..40).map(|i| i % 3 == 0).collect()),
        )
        .unwrap();
        check_graph(&nonzero(&b, true), std::slice::from_ref(&b));
        // Nothing selected: a zero count.
        let z = Tensor::from_vec(vec![5, 2], vec![0.0f32; 10]);
        let (out, _) = run_graph(&nonzero(&z, false), std::slice::from_ref(&z)).unwrap();
        assert_eq!(out[0].shape(), &[2, 0]);
        for sm in [80, 90] {
            ptxas_check(&nonzero(&f, true), sm);
        }
    }

    /// Compress of `x` along `axis` by the run-time condition `cond`.
    fn compress(x: &Tensor, cond_len: usize, axis: Option<i64>) -> Graph {
        let mut g = Graph::new("t");
        let xv = g.add_input("x", TensorType::fixed(x.dtype(), x.shape()));
        let cv = g.add_input("cond", TensorType::fixed(DType::Bool, &[cond_len]));
        let y = g
            .add(
                "compress",
                Op::Misc(MiscOp::Compress { axis }),
                vec![Some(xv), Some(cv)],
                "y",
            )
            .unwrap();
        g.add_output("y", y);
        g
    }

    fn mask(len: usize, pick: impl Fn(usize) -> bool) -> Tensor {
        Tensor::new(vec![len], kiln_ir::TensorData::Bool((0..len).map(pick).collect())).unwrap()
    }

    #[test]
    fn compress_along_axes_by_conditions_of_any_length() {
        let x = Tensor::from_vec(vec![4, 300, 3], (0..3600).map(|i| i as f32 * 0.5).collect());
        // The middle axis (outer 4, inner 3), a condition as long as the axis and a shorter one.
        for len in [300, 170] {
            let c = mask(len, |i| i % 7 == 2 || (100..130).contains(&i));
            let d = check_graph(&compress(&x, len, Some(1)), &[x.clone(), c]);
            assert!(d[0].starts_with("gpu compress"), "{d:?}");
        }
        // The flattened tensor; 2-byte elements; the first axis.
        let c = mask(3600, |i| i % 5 == 1);
        check_graph(&compress(&x, 3600, None), &[x.clone(), c]);
        let h = Tensor::from_vec(
            vec![50, 6],
            (0..300).map(|i| half::f16::from_f32(i as f32)).collect(),
        );
        let c = mask(50, |i| i % 2 == 0);
        check_graph(&compress(&h, 50, Some(0)), &[h.clone(), c]);
        // A longer condition may not select past the axis.
        let c = mask(60, |i| i < 10);
        check_graph(&compress(&h, 60, Some(0)), &[h.clone(), c]);
        let c = mask(60, |i| i == 55);
        let e = run_graph(&compress(&h, 60, Some(0)), &[h, c]).unwrap_err();
        assert!(e.contains("failed with code 1"), "{e}");
        for sm in [80, 90] {
            ptxas_check(&compress(&x, 170, Some(1)), sm);
        }
    }
}
