//! Gathers on the GPU: the operators the CPU lowers to the library's `kiln_uk_gather` (Gather
//! with indices read at run time: embedding lookups, the Q/K/V split of a packed projection),
//! `kiln_uk_gather_elements` (GatherElements), `kiln_uk_gather_nd` (GatherND) and
//! `kiln_uk_gather_axes` (a source position per output position on every axis, decided at
//! compile time: Pad in every mode, Resize in nearest mode), `kiln_uk_trilu` (Trilu: an
//! element kept or zeroed by its row and column, the diagonal offset read at run time) and
//! `kiln_uk_tensor_scatter` (TensorScatter, a KV cache's update, as the gather of each cache
//! slot's new value). All read the same descriptors as the library kernels, so the backends
//! move the same bytes.
//!
//! One thread per output element (grid-stride, 256-thread blocks), the innermost axis on
//! consecutive threads so the stores coalesce. A run-time index outside `[-dim, dim)` stores nothing and reports
//! `KILN_CUDA_EINDEX` in the frame's error slot, as the library kernel does.

use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::{KernelCommon, PackedConst};
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims, EINDEX};
use crate::target::TargetDesc;
use inkwell::types::IntType;
use inkwell::values::{BasicValue, IntValue, PointerValue};
use inkwell::IntPredicate;
use kiln_ir::DType;

const THREADS: u64 = 256;
/// Ranks `kiln_uk_gather_axes` takes (the library's MV_MAX_RANK).
const MAX_RANK: usize = 8;

/// The kernel for `node`, or None when the CPU does not lower it to one of the two gathers.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    use kiln_ir::{MiscOp, Op, OpFamily, VisionOp};
    let cache_update = matches!(node.node.op, Op::Misc(MiscOp::TensorScatter { .. }));
    // CenterCropPad is a Pad by other means (a gather by axis maps).
    let crop_pad = matches!(node.node.op, Op::Vision(VisionOp::CenterCropPad { .. }));
    if !matches!(node.node.op.family(), OpFamily::DataMovement | OpFamily::Resize)
        && !cache_update
        && !crop_pad
    {
        return Ok(None);
    }
    let Some(call) = crate::uk::lower(node)? else {
        return Ok(None);
    };
    let at = &call.iattr;
    let what = node.node.op.name();
    Ok(match call.symbol {
        "gather" => {
            let Some(index) = index_bytes(node, 1) else {
                return Ok(None);
            };
            // Elements, not wider units: a graph input's device pointer is only known to be
            // aligned to its element.
            let unit = element_size(node);
            let inner_bytes = at[3] as u64;
            if ![1, 2, 4, 8].contains(&unit) || !inner_bytes.is_multiple_of(unit) {
                return Ok(None);
            }
            Some(Box::new(IndexGather {
                outer: at[0] as u64,
                dim: at[1] as u64,
                indices: at[2] as u64,
                unit,
                inner: inner_bytes / unit,
                index_bytes: index,
                what,
            }))
        }
        "gather_elements" | "gather_nd" => {
            let Some(index_bytes) = index_bytes(node, 1) else {
                return Ok(None);
            };
            let esize = element_size(node);
            if ![1, 2, 4, 8].contains(&esize) {
                return Ok(None);
            }
            let total = node.output_shape(0)?.iter().product::<usize>() as u64;
            let source = IndexSource::from_attrs(call.symbol == "gather_elements", at);
            Some(Box::new(ElementGather {
                source,
                total,
                esize,
                index_bytes,
                what,
            }))
        }
        "gather_axes" => AxisMapGather::from_attrs(at, node, what).map(|g| Box::new(g) as Box<dyn GpuKernel>),
        "trilu" => {
            let esize = element_size(node);
            let diagonal = if !node.has_input(1) || node.input_shape(1)?.iter().product::<usize>() == 0 {
                None
            } else {
                match index_bytes(node, 1) {
                    Some(bytes) => Some(bytes),
                    None => return Ok(None),
                }
            };
            if ![1, 2, 4, 8].contains(&esize) {
                return Ok(None);
            }
            Some(Box::new(TriluGpu {
                upper: at[0] != 0,
                rows: at[2] as u64,
                cols: at[3] as u64,
                total: node.output_shape(0)?.iter().product::<usize>() as u64,
                esize,
                diagonal,
            }))
        }
        "scatter_nd" | "scatter_elements" => {
            use kiln_ir::ScatterReduction as R;
            let (reduction, nan_first) = match node.node.op {
                Op::ScatterND { reduction } => (reduction, true),
                Op::ScatterElements { reduction, .. } => (reduction, false),
                _ => return Ok(None),
            };
            // A reduction folds each update into its element by compare-and-swap: elements of
            // a type the loop handles.
            let dtype = node.output_type(0).dtype;
            let reduce = match reduction {
                R::None => None,
                op if matches!(dtype, DType::F32 | DType::F64 | DType::I32 | DType::I64) => {
                    Some(Reduce { op, dtype, nan_first })
                }
                _ => return Ok(None),
            };
            let Some(index_bytes) = index_bytes(node, 1) else {
                return Ok(None);
            };
            let esize = element_size(node);
            if ![1, 2, 4, 8].contains(&esize) {
                return Ok(None);
            }
            // The descriptor after the reduction code: the gather's, over the updates.
            let target = IndexSource::from_attrs(call.symbol == "scatter_elements", &at[1..]);
            Some(Box::new(ScatterGpu {
                reduce,
                target,
                total: node.output_shape(0)?.iter().product::<usize>() as u64,
                updates: node.input_shape(2)?.iter().product::<usize>() as u64,
                esize,
                index_bytes,
                what,
            }))
        }
        "tensor_scatter" => {
            let esize = element_size(node);
            let inner_bytes = at[4] as u64;
            let write = node.has_input(2);
            if ![1, 2, 4, 8].contains(&esize)
                || !inner_bytes.is_multiple_of(esize)
                || (write && node.input_dtype(2) != Some(DType::I64))
            {
                return Ok(None);
            }
            Some(Box::new(CacheScatter {
                batch: at[0] as u64,
                outer: at[1] as u64,
                update_len: at[2] as u64,
                cache_len: at[3] as u64,
                inner: inner_bytes / esize,
                esize,
                circular: at[5] != 0,
                write,
            }))
        }
        _ => None,
    })
}

/// ScatterND and ScatterElements in one block of `THREADS` threads: the data copied into the
/// output, a barrier, then each update written where its indices (the gathers' descriptors
/// over the updates) point. One block, because the copy must finish before any update lands
/// and only a block has a barrier; the block runs on one SM (a cache or detection-sized
/// scatter takes microseconds). Without a reduction, duplicate indices (which ONNX leaves
/// undefined) race, where the library keeps the last. With one, each update is folded into
/// its element by a compare-and-swap loop with the library's rules (`mv_reduce`: wrapping
/// integer add and multiply; float max/min that keep a NaN met first for ScatterND): integer
/// results are the library's exactly; float sums and products of duplicate indices are summed
/// in the order the threads arrive. An index out of range reports `KILN_CUDA_EINDEX`.
#[derive(Debug)]
struct ScatterGpu {
    reduce: Option<Reduce>,
    target: IndexSource,
    total: u64,
    updates: u64,
    esize: u64,
    index_bytes: u64,
    what: &'static str,
}

impl KernelCommon for ScatterGpu {
    fn describe(&self) -> String {
        format!(
            "gpu scatter {} {} updates into {} elements ({} B) by {}-byte indices",
            self.what, self.updates, self.total, self.esize, self.index_bytes
        )
    }
}

impl GpuKernel for ScatterGpu {
    fn launch(&self) -> LaunchDims {
        LaunchDims {
            grid: [1, 1, 1],
            block: [THREADS as u32, 1, 1],
            shared_bytes: 0,
        }
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let (data, idx, updates, out) = (k.input(0)?, k.input(1)?, k.input(2)?, k.output(0)?);
        let tid = k.sreg64(crate::nvptx::Sreg::TidX)?;
        let es = self.esize as i64;
        e.for_range(tid, e.i64c(self.total as i64), THREADS as i64, |i| {
            let at = e.mulc(i, es)?;
            move_unit(k, &e, self.esize, (data, at), (out, at))
        })?;
        k.barrier()?;
        e.for_range(tid, e.i64c(self.updates as i64), THREADS as i64, |i| {
            let (to, inside) = self.target.offset(k, &e, idx, self.index_bytes, i)?;
            let (from, to) = (e.mulc(i, es)?, e.mulc(to, es)?);
            e.if_else(
                inside,
                || match self.reduce {
                    None => move_unit(k, &e, self.esize, (updates, from), (out, to)),
                    Some(r) => r.fold(k, &e, (updates, from), (out, to)),
                },
                || k.report_error(EINDEX),
            )
        })?;
        k.ret()
    }
}

/// A scatter's reduction on elements of `dtype` (f32, f64, i32 or i64).
#[derive(Clone, Copy, Debug)]
struct Reduce {
    op: kiln_ir::ScatterReduction,
    dtype: DType,
    /// Max and min keep a NaN of either side (ScatterND; the library's `nan_prop`).
    nan_first: bool,
}

impl Reduce {
    /// `out[to] = op(out[to], update[from])` (byte offsets), atomically: a compare-and-swap
    /// loop on the element's bits.
    fn fold<'ctx>(
        self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        (src, from): (PointerValue<'ctx>, IntValue<'ctx>),
        (dst, to): (PointerValue<'ctx>, IntValue<'ctx>),
    ) -> Result<()> {
        let b = e.b;
        let bits = int_type(k, self.dtype.size_bytes() as u64);
        let at = e.gep_u8(dst, to)?;
        let update = b
            .build_load(bits, e.gep_u8(src, from)?, "")
            .map_err(llvm)?
            .into_int_value();
        let first = b.build_load(bits, at, "").map_err(llvm)?.into_int_value();
        let pre = b.get_insert_block().expect("positioned");
        let retry = k.cx.append_basic_block(k.function, "cas");
        let done = k.cx.append_basic_block(k.function, "cas_done");
        b.build_unconditional_branch(retry).map_err(llvm)?;
        b.position_at_end(retry);
        let old = b.build_phi(bits, "old").map_err(llvm)?;
        old.add_incoming(&[(&first, pre)]);
        let old_bits = old.as_basic_value().into_int_value();
        let new_bits = self.combine(k, e, old_bits, update)?;
        let swap = b
            .build_cmpxchg(
                at,
                old_bits,
                new_bits,
                inkwell::AtomicOrdering::Monotonic,
                inkwell::AtomicOrdering::Monotonic,
            )
            .map_err(llvm)?;
        let seen = b
            .build_extract_value(swap, 0, "seen")
            .map_err(llvm)?
            .into_int_value();
        let won = b
            .build_extract_value(swap, 1, "won")
            .map_err(llvm)?
            .into_int_value();
        old.add_incoming(&[(&seen, b.get_insert_block().expect("positioned"))]);
        b.build_conditional_branch(won, done, retry).map_err(llvm)?;
        b.position_at_end(done);
        Ok(())
    }

    /// The reduction of element bits `x` (the output's) and `y` (the update's), as bits.
    fn combine<'ctx>(
        self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        x: IntValue<'ctx>,
        y: IntValue<'ctx>,
    ) -> Result<IntValue<'ctx>> {
        use inkwell::FloatPredicate as F;
        use kiln_ir::ScatterReduction as R;
        let b = e.b;
        let sel =
            |c: IntValue<'ctx>,
             p: inkwell::values::BasicValueEnum<'ctx>,
             q: inkwell::values::BasicValueEnum<'ctx>| b.build_select(c, p, q, "").map_err(llvm);
        if matches!(self.dtype, DType::I32 | DType::I64) {
            let z = match self.op {
                R::Add => b.build_int_add(x, y, "").map_err(llvm)?,
                R::Mul => b.build_int_mul(x, y, "").map_err(llvm)?,
                R::Max => sel(e.icmp(IntPredicate::SGT, y, x)?, y.into(), x.into())?.into_int_value(),
                R::Min => sel(e.icmp(IntPredicate::SLT, y, x)?, y.into(), x.into())?.into_int_value(),
                R::None => y,
            };
            return Ok(z);
        }
        let ft = match self.dtype {
            DType::F64 => k.cx.f64_type(),
            _ => k.cx.f32_type(),
        };
        let xf = b.build_bit_cast(x, ft, "").map_err(llvm)?.into_float_value();
        let yf = b.build_bit_cast(y, ft, "").map_err(llvm)?.into_float_value();
        let cmp = |p, l, r| b.build_float_compare(p, l, r, "").map_err(llvm);
        let pick = |better: IntValue<'ctx>| -> Result<inkwell::values::FloatValue<'ctx>> {
            let z = sel(better, yf.into(), xf.into())?.into_float_value();
            if !self.nan_first {
                return Ok(z);
            }
            // A NaN on either side wins, the output's first (`x != x ? x : y`).
            let x_nan = cmp(F::UNO, xf, xf)?;
            let any_nan = cmp(F::UNO, xf, yf)?;
            let nan = sel(x_nan, xf.into(), yf.into())?.into_float_value();
            Ok(sel(any_nan, nan.into(), z.into())?.into_float_value())
        };
        let z = match self.op {
            R::Add => b.build_float_add(xf, yf, "").map_err(llvm)?,
            R::Mul => b.build_float_mul(xf, yf, "").map_err(llvm)?,
            R::Max => pick(cmp(F::OGT, yf, xf)?)?,
            R::Min => pick(cmp(F::OLT, yf, xf)?)?,
            R::None => yf,
        };
        Ok(b.build_bit_cast(z, x.get_type(), "")
            .map_err(llvm)?
            .into_int_value())
    }
}

/// TensorScatter (`kiln_uk_tensor_scatter`'s `[batch, outer, update_len, cache_len, inner
/// bytes, circular]`; inputs cache `[batch, outer, cache_len, inner]`, update with
/// `update_len` positions, write_indices? i64 `[batch]`) as a gather: slot `s` of batch entry
/// `b` takes update position `u = s − write[b]` (modulo `cache_len` when circular) when that
/// lies in `0..update_len`, else keeps the cache's value. The written slots are distinct
/// (`update_len <= cache_len`), so no two updates meet and this is the library's result. A
/// non-circular run of writes that leaves the cache reports `KILN_CUDA_EINDEX`, as the library
/// fails; circular indices wrap exactly (the reference's saturating add, which only differs
/// for indices within `update_len` of `i64::MAX`, is not copied).
#[derive(Debug)]
struct CacheScatter {
    batch: u64,
    outer: u64,
    update_len: u64,
    cache_len: u64,
    /// Elements after the scattered axis.
    inner: u64,
    esize: u64,
    circular: bool,
    /// Whether write_indices (input 2) is given (else every batch entry writes at 0).
    write: bool,
}

impl CacheScatter {
    fn total(&self) -> u64 {
        self.batch * self.outer * self.cache_len * self.inner
    }
}

impl KernelCommon for CacheScatter {
    fn describe(&self) -> String {
        format!(
            "gpu cache scatter{} {} of {} slots, {} elements ({} B)",
            if self.circular { " circular" } else { "" },
            self.update_len,
            self.cache_len,
            self.total(),
            self.esize
        )
    }
}

impl GpuKernel for CacheScatter {
    fn launch(&self) -> LaunchDims {
        launch(self.total())
    }

    fn emit<'ctx>(&self, k: &GpuBuilder<'_, 'ctx>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let (cache, update, out) = (k.input(0)?, k.input(1)?, k.output(0)?);
        let (len, n) = (self.cache_len as i64, self.update_len as i64);
        k.grid_stride_loop(self.total(), THREADS, |i| {
            let r = e.uremc(i, self.inner as i64)?;
            let t = e.udivc(i, self.inner as i64)?;
            let slot = e.uremc(t, len)?;
            let row = e.udivc(t, len)?; // b·outer + o
            let b = e.udivc(row, self.outer as i64)?;
            let w = match self.write {
                true => e.load_i64(k.input(2)?, b)?,
                false => e.i64c(0),
            };
            let sge = |a, c| e.icmp(IntPredicate::SGE, a, c);
            let slt = |a, c| e.icmp(IntPredicate::SLT, a, c);
            let and = |a, c| e.b.build_and(a, c, "").map_err(llvm);
            // The update position this slot would take, and whether the writes are valid.
            let (u, valid) = if self.circular {
                // Both remainders made non-negative (w may be any i64).
                let wrap = |x: IntValue<'ctx>| -> Result<IntValue<'ctx>> {
                    let m =
                        e.b.build_int_signed_rem(x, e.i64c(len.max(1)), "")
                            .map_err(llvm)?;
                    let neg = slt(m, e.i64c(0))?;
                    Ok(e.b
                        .build_select(neg, e.addc(m, len)?, m, "")
                        .map_err(llvm)?
                        .into_int_value())
                };
                let u = wrap(e.b.build_int_sub(slot, wrap(w)?, "").map_err(llvm)?)?;
                (u, k.cx.bool_type().const_all_ones())
            } else {
                let valid = and(sge(w, e.i64c(0))?, e.icmp(IntPredicate::SLE, w, e.i64c(len - n))?)?;
                (e.b.build_int_sub(slot, w, "").map_err(llvm)?, valid)
            };
            let take = and(sge(u, e.i64c(0))?, slt(u, e.i64c(n))?)?;
            let to = e.mulc(i, self.esize as i64)?;
            e.if_else(
                valid,
                || {
                    e.if_else(
                        take,
                        || {
                            let from = e.add(e.mulc(e.add(e.mulc(row, n)?, u)?, self.inner as i64)?, r)?;
                            let from = e.mulc(from, self.esize as i64)?;
                            move_unit(k, &e, self.esize, (update, from), (out, to))
                        },
                        || move_unit(k, &e, self.esize, (cache, to), (out, to)),
                    )
                },
                || k.report_error(EINDEX),
            )
        })?;
        k.ret()
    }
}

/// Index `pos` of the index tensor (i32 or i64) checked against `dim` and made non-negative:
/// (the index, whether it lies in `[-dim, dim)`).
fn load_index<'ctx>(
    k: &GpuBuilder<'_, 'ctx>,
    e: &Emit<'_, 'ctx>,
    indices: PointerValue<'ctx>,
    index_bytes: u64,
    pos: IntValue<'ctx>,
    dim: u64,
) -> Result<(IntValue<'ctx>, IntValue<'ctx>)> {
    let ity = int_type(k, index_bytes);
    let at = e.gep_u8(indices, e.mulc(pos, index_bytes as i64)?)?;
    let v = e.b.build_load(ity, at, "idx").map_err(llvm)?.into_int_value();
    let v =
        e.b.build_int_s_extend_or_bit_cast(v, k.cx.i64_type(), "")
            .map_err(llvm)?;
    let negative = e.icmp(IntPredicate::SLT, v, e.i64c(0))?;
    let wrapped = e.addc(v, dim as i64)?;
    let w =
        e.b.build_select(negative, wrapped, v, "w")
            .map_err(llvm)?
            .into_int_value();
    // Unsigned: a still-negative index is huge, so one compare checks both ends.
    let inside = e.icmp(IntPredicate::ULT, w, e.i64c(dim as i64))?;
    Ok((w, inside))
}

/// Bytes of input `i`'s elements when it holds indices (i32 or i64), else None.
fn index_bytes(node: &NodeInfo, i: usize) -> Option<u64> {
    match node.input_dtype(i) {
        Some(DType::I64) => Some(8),
        Some(DType::I32) => Some(4),
        _ => None,
    }
}

fn element_size(node: &NodeInfo) -> u64 {
    node.output_type(0).dtype.size_bytes() as u64
}

pub(super) fn int_type<'ctx>(k: &GpuBuilder<'_, 'ctx>, bytes: u64) -> IntType<'ctx> {
    match bytes {
        1 => k.cx.i8_type(),
        2 => k.cx.i16_type(),
        4 => k.cx.i32_type(),
        _ => k.cx.i64_type(),
    }
}

/// Moves one `bytes`-wide unit from byte offset `from` of `src` to byte offset `to` of `dst`.
pub(super) fn move_unit<'ctx>(
    k: &GpuBuilder<'_, 'ctx>,
    e: &Emit<'_, 'ctx>,
    bytes: u64,
    (src, from): (PointerValue<'ctx>, IntValue<'ctx>),
    (dst, to): (PointerValue<'ctx>, IntValue<'ctx>),
) -> Result<()> {
    let ty = int_type(k, bytes);
    let v = e.b.build_load(ty, e.gep_u8(src, from)?, "").map_err(llvm)?;
    v.as_instruction_value()
        .expect("a load")
        .set_alignment(bytes as u32)
        .map_err(llvm)?;
    let st = e.b.build_store(e.gep_u8(dst, to)?, v).map_err(llvm)?;
    st.set_alignment(bytes as u32).map_err(llvm)
}

fn launch(total: u64) -> LaunchDims {
    LaunchDims::per_item(total, THREADS)
}

/// `out[o, j, r] = data[o, idx[j], r]` (`kiln_uk_gather`'s `[outer, dim, n_indices, inner]`),
/// with `r` counted in `unit`-byte elements.
#[derive(Debug)]
struct IndexGather {
    outer: u64,
    dim: u64,
    indices: u64,
    unit: u64,
    inner: u64,
    index_bytes: u64,
    what: &'static str,
}

impl IndexGather {
    fn total(&self) -> u64 {
        self.outer * self.indices * self.inner
    }
}

impl KernelCommon for IndexGather {
    fn describe(&self) -> String {
        format!(
            "gpu gather {} {}x[{} of {}]x{} ({} B units)",
            self.what, self.outer, self.indices, self.dim, self.inner, self.unit
        )
    }
}

impl GpuKernel for IndexGather {
    fn launch(&self) -> LaunchDims {
        launch(self.total())
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let (data, idx, out) = (k.input(0)?, k.input(1)?, k.output(0)?);
        k.grid_stride_loop(self.total(), THREADS, |i| {
            let r = e.uremc(i, self.inner as i64)?;
            let t = e.udivc(i, self.inner as i64)?;
            let j = e.uremc(t, self.indices as i64)?;
            let o = e.udivc(t, self.indices as i64)?;
            let (w, inside) = load_index(k, &e, idx, self.index_bytes, j, self.dim)?;
            e.if_else(
                inside,
                || {
                    let row = e.add(e.mulc(o, self.dim as i64)?, w)?;
                    let from = e.mulc(e.add(e.mulc(row, self.inner as i64)?, r)?, self.unit as i64)?;
                    let to = e.mulc(i, self.unit as i64)?;
                    move_unit(k, &e, self.unit, (data, from), (out, to))
                },
                || k.report_error(EINDEX),
            )
        })?;
        k.ret()
    }
}

/// Where output element `i` of a GatherElements or GatherND comes from.
#[derive(Debug)]
enum IndexSource {
    /// GatherElements (`kiln_uk_gather_elements`'s attributes): the output has the index
    /// tensor's shape; element `p` reads data at `p` with the axis coordinate replaced by
    /// `indices[p]`.
    Elements {
        axis: usize,
        index_dims: Vec<u64>,
        /// Data strides in elements.
        data_strides: Vec<u64>,
        axis_dim: u64,
    },
    /// GatherND (`kiln_uk_gather_nd`'s): output slice `t` (of `slice` elements) is the data slice
    /// at index tuple `t` (`dims.len()` indices), after the batch offset of `t / per_batch`.
    Tuples {
        slice: u64,
        per_batch: u64,
        batch_stride: u64,
        dims: Vec<u64>,
        strides: Vec<u64>,
    },
}

impl IndexSource {
    /// The library's descriptor: `kiln_uk_gather_elements`'s (`elements`) or
    /// `kiln_uk_gather_nd`'s attributes (the scatters' after their reduction code).
    fn from_attrs(elements: bool, at: &[i64]) -> IndexSource {
        let u = |v: &[i64]| v.iter().map(|&d| d as u64).collect::<Vec<u64>>();
        if elements {
            let (axis, rank) = (at[0] as usize, at[1] as usize);
            IndexSource::Elements {
                axis,
                index_dims: u(&at[2..2 + rank]),
                data_strides: u(&at[2 + rank..2 + 2 * rank]),
                axis_dim: at[2 + 2 * rank] as u64,
            }
        } else {
            let k = at[2] as usize;
            IndexSource::Tuples {
                slice: at[1] as u64,
                per_batch: at[3] as u64,
                batch_stride: at[4] as u64,
                dims: u(&at[5..5 + k]),
                strides: u(&at[5 + k..5 + 2 * k]),
            }
        }
    }

    /// For element `i` of the index tensor's iteration (a GatherElements output or
    /// ScatterElements update; a GatherND output or ScatterND update, slice by slice): the
    /// data element it addresses and whether every index read for it was in range.
    fn offset<'ctx>(
        &self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        idx: PointerValue<'ctx>,
        index_bytes: u64,
        i: IntValue<'ctx>,
    ) -> Result<(IntValue<'ctx>, IntValue<'ctx>)> {
        let bool_t = k.cx.bool_type();
        Ok(match self {
            IndexSource::Elements {
                axis,
                index_dims,
                data_strides,
                axis_dim,
            } => {
                let (w, inside) = load_index(k, e, idx, index_bytes, i, *axis_dim)?;
                let mut off = e.i64c(0);
                let mut rest = i;
                for d in (0..index_dims.len()).rev() {
                    let p = if d == 0 {
                        rest
                    } else {
                        e.uremc(rest, index_dims[d] as i64)?
                    };
                    if d > 0 {
                        rest = e.udivc(rest, index_dims[d] as i64)?;
                    }
                    let coord = if d == *axis { w } else { p };
                    off = e.add(off, e.mulc(coord, data_strides[d] as i64)?)?;
                }
                (off, inside)
            }
            IndexSource::Tuples {
                slice,
                per_batch,
                batch_stride,
                dims,
                strides,
            } => {
                let t = e.udivc(i, *slice as i64)?;
                let r = e.uremc(i, *slice as i64)?;
                let mut off = e.add(e.mulc(e.udivc(t, *per_batch as i64)?, *batch_stride as i64)?, r)?;
                let mut inside = bool_t.const_all_ones();
                for (j, (&dim, &stride)) in dims.iter().zip(strides).enumerate() {
                    let pos = e.addc(e.mulc(t, dims.len() as i64)?, j as i64)?;
                    let (w, ok) = load_index(k, e, idx, index_bytes, pos, dim)?;
                    inside = e.b.build_and(inside, ok, "").map_err(llvm)?;
                    off = e.add(off, e.mulc(w, stride as i64)?)?;
                }
                (off, inside)
            }
        })
    }
}

/// GatherElements and GatherND: one thread per output element, each reading its own indices.
#[derive(Debug)]
struct ElementGather {
    source: IndexSource,
    total: u64,
    esize: u64,
    index_bytes: u64,
    what: &'static str,
}

impl KernelCommon for ElementGather {
    fn describe(&self) -> String {
        format!(
            "gpu gather {} {} elements ({} B) by {}-byte indices",
            self.what, self.total, self.esize, self.index_bytes
        )
    }
}

impl GpuKernel for ElementGather {
    fn launch(&self) -> LaunchDims {
        launch(self.total)
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let (data, idx, out) = (k.input(0)?, k.input(1)?, k.output(0)?);
        k.grid_stride_loop(self.total, THREADS, |i| {
            // The source element and whether every index read for it was in range.
            let (from, inside) = self.source.offset(k, &e, idx, self.index_bytes, i)?;
            e.if_else(
                inside,
                || {
                    let from = e.mulc(from, self.esize as i64)?;
                    let to = e.mulc(i, self.esize as i64)?;
                    move_unit(k, &e, self.esize, (data, from), (out, to))
                },
                || k.report_error(EINDEX),
            )
        })?;
        k.ret()
    }
}

/// Trilu: element `(r, c)` of each `rows×cols` matrix is kept where `c >= r + k` (upper) or
/// `c <= r + k` (lower) and zeroed elsewhere; `k` is input 1's first element (i32 or i64) when
/// present, else 0.
#[derive(Debug)]
struct TriluGpu {
    upper: bool,
    rows: u64,
    cols: u64,
    total: u64,
    esize: u64,
    /// Bytes of the diagonal offset's element, None when there is no offset input.
    diagonal: Option<u64>,
}

impl KernelCommon for TriluGpu {
    fn describe(&self) -> String {
        format!(
            "gpu trilu {} {}x{} ({} elements)",
            if self.upper { "upper" } else { "lower" },
            self.rows,
            self.cols,
            self.total
        )
    }
}

impl GpuKernel for TriluGpu {
    fn launch(&self) -> LaunchDims {
        launch(self.total)
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let (x, out) = (k.input(0)?, k.output(0)?);
        let offset = match self.diagonal {
            Some(bytes) => {
                let v =
                    e.b.build_load(int_type(k, bytes), k.input(1)?, "k")
                        .map_err(llvm)?;
                e.b.build_int_s_extend_or_bit_cast(v.into_int_value(), k.cx.i64_type(), "")
                    .map_err(llvm)?
            }
            None => e.i64c(0),
        };
        let ty = int_type(k, self.esize);
        k.grid_stride_loop(self.total, THREADS, |i| {
            let c = e.uremc(i, self.cols as i64)?;
            let r = e.uremc(e.udivc(i, self.cols as i64)?, self.rows as i64)?;
            let limit = e.add(r, offset)?;
            let keep = if self.upper {
                e.icmp(IntPredicate::SGE, c, limit)?
            } else {
                e.icmp(IntPredicate::SLE, c, limit)?
            };
            let at = e.mulc(i, self.esize as i64)?;
            e.if_else(
                keep,
                || move_unit(k, &e, self.esize, (x, at), (out, at)),
                || {
                    let st =
                        e.b.build_store(e.gep_u8(out, at)?, ty.const_zero())
                            .map_err(llvm)?;
                    st.set_alignment(self.esize as u32).map_err(llvm)
                },
            )
        })?;
        k.ret()
    }
}

/// `kiln_uk_gather_axes`: output position `p` reads input position `map_k[p_k]` on every axis
/// `k`, or the fill value where any map says -1. The maps are a packed constant (i32).
#[derive(Debug)]
struct AxisMapGather {
    esize: u64,
    out_dims: Vec<u64>,
    in_strides: Vec<i64>,
    /// The axis maps (i32), as the kernel's one packed constant.
    maps: Vec<PackedConst>,
    /// The fill: `Some(bits)` fixed at compile time, None for Pad's `constant_value` input
    /// (read at run time when present, else zero).
    fill_bits: Option<u64>,
    what: &'static str,
}

impl AxisMapGather {
    fn from_attrs(at: &[i64], node: &NodeInfo, what: &'static str) -> Option<AxisMapGather> {
        let (esize, rank) = (at[0] as u64, at[1] as usize);
        if ![1, 2, 4, 8].contains(&esize) || rank == 0 || rank > MAX_RANK {
            return None;
        }
        let out_dims: Vec<u64> = at[2..2 + rank].iter().map(|&d| d as u64).collect();
        let in_strides = at[2 + rank..2 + 2 * rank].to_vec();
        let n_maps: u64 = out_dims.iter().sum();
        let m = 2 + 2 * rank;
        let maps = at[m..m + n_maps as usize]
            .iter()
            .map(|&v| i32::try_from(v).ok())
            .collect::<Option<Vec<i32>>>()?;
        let tail = &at[m + n_maps as usize..];
        let fill_bits = if tail[2] == 1 {
            Some(tail[3] as u64)
        } else if !node.has_input(2) || node.input_shape(2).ok()?.iter().product::<usize>() == 0 {
            Some(0)
        } else if let Some(t) = node.known(2) {
            let mut bits = [0u8; 8];
            let b = t.to_le_bytes();
            bits[..(esize as usize).min(b.len())].copy_from_slice(&b[..(esize as usize).min(b.len())]);
            Some(u64::from_le_bytes(bits))
        } else {
            None
        };
        let maps = vec![PackedConst {
            bytes: maps.iter().flat_map(|m| m.to_le_bytes()).collect(),
        }];
        Some(AxisMapGather {
            esize,
            out_dims,
            in_strides,
            maps,
            fill_bits,
            what,
        })
    }

    fn total(&self) -> u64 {
        self.out_dims.iter().product()
    }
}

impl KernelCommon for AxisMapGather {
    fn describe(&self) -> String {
        format!(
            "gpu gather {} {:?} by axis maps ({} B elements)",
            self.what, self.out_dims, self.esize
        )
    }

    fn packed_constants(&self) -> &[PackedConst] {
        &self.maps
    }

    fn release_packed_constants(&mut self) {
        PackedConst::release_all(&mut self.maps)
    }
}

impl GpuKernel for AxisMapGather {
    fn launch(&self) -> LaunchDims {
        launch(self.total())
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let (src, out, maps) = (k.input(0)?, k.output(0)?, k.packed(0)?);
        let ty = int_type(k, self.esize);
        k.grid_stride_loop(self.total(), THREADS, |i| {
            // Source byte offset, and whether any axis maps outside the input.
            let mut off = e.i64c(0);
            let mut outside = k.cx.bool_type().const_zero();
            let mut rest = i;
            let mut map_start: u64 = self.out_dims.iter().sum();
            for (d, &extent) in self.out_dims.iter().enumerate().rev() {
                map_start -= extent;
                let p = if d == 0 {
                    rest
                } else {
                    e.uremc(rest, extent as i64)?
                };
                if d > 0 {
                    rest = e.udivc(rest, extent as i64)?;
                }
                let at = e.gep_u8(maps, e.mulc(e.addc(p, map_start as i64)?, 4)?)?;
                let s =
                    e.b.build_load(k.cx.i32_type(), at, "map")
                        .map_err(llvm)?
                        .into_int_value();
                let s = e.b.build_int_s_extend(s, k.cx.i64_type(), "").map_err(llvm)?;
                let neg = e.icmp(IntPredicate::SLT, s, e.i64c(0))?;
                outside = e.b.build_or(outside, neg, "").map_err(llvm)?;
                off = e.add(off, e.mulc(s, self.in_strides[d])?)?;
            }
            let to = e.mulc(i, self.esize as i64)?;
            e.if_else(
                outside,
                || {
                    let fill = match self.fill_bits {
                        Some(bits) => ty.const_int(bits, false).as_basic_value_enum(),
                        None => e.b.build_load(ty, k.input(2)?, "fill").map_err(llvm)?,
                    };
                    let st = e.b.build_store(e.gep_u8(out, to)?, fill).map_err(llvm)?;
                    st.set_alignment(self.esize as u32).map_err(llvm)
                },
                || move_unit(k, &e, self.esize, (src, off), (out, to)),
            )
        })?;
        k.ret()
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check, run_graph};
    use kiln_ir::{
        AspectRatioPolicy, CoordTransform, DType, Graph, NearestMode, Op, PadMode, ResizeAttrs, ResizeMode,
        Tensor, TensorType, ValueId,
    };

    fn f32_input(g: &mut Graph, name: &str, shape: &[usize]) -> (ValueId, Tensor) {
        let v = g.add_input(name, TensorType::fixed(DType::F32, shape));
        let n: usize = shape.iter().product();
        let t = Tensor::from_vec(
            shape.to_vec(),
            (0..n).map(|i| i as f32 * 0.25 - 5.0).collect::<Vec<f32>>(),
        );
        (v, t)
    }

    fn assert_gathers(kernels: &[String]) {
        assert!(
            kernels.iter().all(|k| k.starts_with("gpu gather")),
            "not all GPU gathers: {kernels:?}"
        );
    }

    /// Gather with run-time indices on the first and a middle axis, i64 and i32 indices,
    /// negative ones counting from the end, an index tensor of rank 2.
    fn gather_graph() -> (Graph, Vec<Tensor>) {
        let mut g = Graph::new("t");
        let (table, tt) = f32_input(&mut g, "table", &[50, 24]);
        let ids = g.add_input("ids", TensorType::fixed(DType::I64, &[2, 7]));
        let rows = g
            .add(
                "rows",
                Op::Gather { axis: 0 },
                vec![Some(table), Some(ids)],
                "rows",
            )
            .unwrap();
        g.add_output("rows", rows);
        let (x, xt) = f32_input(&mut g, "x", &[3, 9, 5]);
        let cols = g.add_input("cols", TensorType::fixed(DType::I32, &[4]));
        let mid = g
            .add("mid", Op::Gather { axis: 1 }, vec![Some(x), Some(cols)], "mid")
            .unwrap();
        g.add_output("mid", mid);
        let ids_t = Tensor::from_vec(
            vec![2, 7],
            vec![0i64, 49, -1, -50, 7, 7, 23, 1, 2, 3, 4, 5, 6, -7],
        );
        let cols_t = Tensor::from_vec(vec![4], vec![8i32, -9, 4, 0]);
        (g, vec![tt, ids_t, xt, cols_t])
    }

    #[test]
    fn gather_by_runtime_indices() {
        let (g, inputs) = gather_graph();
        assert_gathers(&check_graph(&g, &inputs));
    }

    #[test]
    fn an_index_out_of_range_is_reported_by_its_kernel() {
        let (g, mut inputs) = gather_graph();
        inputs[3] = Tensor::from_vec(vec![4], vec![8i32, -10, 4, 0]);
        let err = run_graph(&g, &inputs).unwrap_err();
        assert_eq!(err, "kernel 1 failed with code 1");
        inputs[3] = Tensor::from_vec(vec![4], vec![8i32, 9, 4, 0]);
        assert_eq!(run_graph(&g, &inputs).unwrap_err(), "kernel 1 failed with code 1");
    }

    fn pad(g: &mut Graph, name: &str, x: ValueId, mode: PadMode, pads: &[i64], value: Option<ValueId>) {
        let p = g.add_const(
            format!("{name}_pads"),
            Tensor::from_vec(vec![pads.len()], pads.to_vec()),
        );
        let y = g
            .add(name, Op::Pad { mode }, vec![Some(x), Some(p), value], name)
            .unwrap();
        g.add_output(name, y);
    }

    #[test]
    fn pad_in_every_mode() {
        let mut g = Graph::new("t");
        let (x, xt) = f32_input(&mut g, "x", &[2, 3, 4, 5]);
        // The constant comes from a graph input: read on the device at run time.
        let value = g.add_input("value", TensorType::fixed(DType::F32, &[]));
        pad(
            &mut g,
            "constant",
            x,
            PadMode::Constant,
            &[0, 1, 2, -1, 0, 0, 1, 3],
            Some(value),
        );
        pad(
            &mut g,
            "zeros",
            x,
            PadMode::Constant,
            &[0, 0, 1, 1, 0, 0, 1, 1],
            None,
        );
        pad(
            &mut g,
            "reflect",
            x,
            PadMode::Reflect,
            &[0, 0, 2, 3, 0, 0, 1, 4],
            None,
        );
        pad(&mut g, "edge", x, PadMode::Edge, &[1, 0, 2, 3, 0, 2, 1, 4], None);
        pad(&mut g, "wrap", x, PadMode::Wrap, &[0, 1, 2, 3, 0, 0, 3, 2], None);
        let vt = Tensor::from_vec(vec![], vec![7.5f32]);
        assert_gathers(&check_graph(&g, &[xt, vt]));
    }

    #[test]
    fn resize_nearest() {
        let mut g = Graph::new("t");
        let (x, xt) = f32_input(&mut g, "x", &[1, 2, 5, 7]);
        let scales = g.add_const("scales", Tensor::from_vec(vec![4], vec![1.0f32, 1.0, 2.0, 0.6]));
        let attrs = ResizeAttrs {
            mode: ResizeMode::Nearest,
            coord: CoordTransform::HalfPixel,
            nearest_mode: NearestMode::RoundPreferFloor,
            cubic_coeff_a: -0.75,
            exclude_outside: false,
            extrapolation_value: 0.0,
            antialias: false,
            axes: vec![],
            keep_aspect_ratio_policy: AspectRatioPolicy::Stretch,
        };
        let y = g
            .add(
                "resize",
                Op::Resize(attrs),
                vec![Some(x), None, Some(scales)],
                "y",
            )
            .unwrap();
        g.add_output("y", y);
        assert_gathers(&check_graph(&g, &[xt]));
    }

    #[test]
    fn gather_elements_and_nd() {
        let mut g = Graph::new("t");
        let (x, xt) = f32_input(&mut g, "x", &[4, 6, 5]);
        let ei = g.add_input("ei", TensorType::fixed(DType::I64, &[4, 3, 5]));
        let ge = g
            .add(
                "ge",
                Op::GatherElements { axis: 1 },
                vec![Some(x), Some(ei)],
                "ge",
            )
            .unwrap();
        g.add_output("ge", ge);
        let ni = g.add_input("ni", TensorType::fixed(DType::I32, &[4, 2, 2]));
        let gn = g
            .add(
                "gn",
                Op::GatherND { batch_dims: 1 },
                vec![Some(x), Some(ni)],
                "gn",
            )
            .unwrap();
        g.add_output("gn", gn);
        let ei_t = Tensor::from_vec(
            vec![4, 3, 5],
            (0..60i64).map(|i| (i * 7) % 12 - 6).collect::<Vec<i64>>(),
        );
        let ni_t = Tensor::from_vec(
            vec![4, 2, 2],
            vec![0i32, 1, 5, -1, -6, 4, 2, 2, 3, 0, 1, 3, 4, 4, -1, -5],
        );
        let inputs = vec![xt, ei_t, ni_t];
        assert_gathers(&check_graph(&g, &inputs));
        // Out of range, in each kernel.
        let mut bad = inputs.clone();
        bad[1] = Tensor::from_vec(
            vec![4, 3, 5],
            (0..60i64)
                .map(|i| if i == 59 { 6 } else { 0 })
                .collect::<Vec<i64>>(),
        );
        assert_eq!(run_graph(&g, &bad).unwrap_err(), "kernel 0 failed with code 1");
        let mut bad = inputs;
        bad[2] = Tensor::from_vec(
            vec![4, 2, 2],
            vec![0i32, 1, 5, -7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        );
        assert_eq!(run_graph(&g, &bad).unwrap_err(), "kernel 1 failed with code 1");
    }

    #[test]
    fn trilu_both_ways_with_and_without_an_offset() {
        let mut g = Graph::new("t");
        let (x, xt) = f32_input(&mut g, "x", &[2, 5, 7]);
        let k = g.add_input("k", TensorType::fixed(DType::I64, &[]));
        for (name, upper, offset) in [("u", true, Some(k)), ("l", false, Some(k)), ("u0", true, None)] {
            let y = g
                .add(name, Op::Trilu { upper }, vec![Some(x), offset], name)
                .unwrap();
            g.add_output(name, y);
        }
        for kv in [-2i64, 0, 3, 9] {
            let inputs = vec![xt.clone(), Tensor::scalar(kv)];
            assert_gathers_or_trilu(&check_graph(&g, &inputs));
        }
    }

    fn assert_gathers_or_trilu(kernels: &[String]) {
        assert!(
            kernels.iter().all(|k| k.starts_with("gpu trilu")),
            "not all GPU kernels: {kernels:?}"
        );
    }

    #[test]
    fn ptx_assembles() {
        let (g, _) = gather_graph();
        for sm in [80, 90] {
            ptxas_check(&g, sm);
        }
        let mut g = Graph::new("t");
        let (x, _) = f32_input(&mut g, "x", &[2, 3, 4, 5]);
        let value = g.add_input("value", TensorType::fixed(DType::F32, &[]));
        pad(
            &mut g,
            "constant",
            x,
            PadMode::Constant,
            &[0, 1, 2, -1, 0, 0, 1, 3],
            Some(value),
        );
        ptxas_check(&g, 90);
    }

    /// TensorScatter: a KV cache `[batch, heads, slots, dim]` updated at each batch entry's
    /// write index, wrapping in circular mode, at 0 without write indices; a run of writes
    /// past the cache is an index error.
    #[test]
    fn tensor_scatter_updates_the_cache() {
        use kiln_ir::MiscOp;
        let graph = |circular: bool, write: bool, upd: usize| {
            let mut g = Graph::new("t");
            let (cache, ct) = f32_input(&mut g, "cache", &[3, 2, 6, 4]);
            let (update, ut) = f32_input(&mut g, "update", &[3, 2, upd, 4]);
            let mut args = vec![Some(cache), Some(update)];
            if write {
                args.push(Some(g.add_input("w", TensorType::fixed(DType::I64, &[3]))));
            }
            let op = Op::Misc(MiscOp::TensorScatter { circular, axis: 2 });
            let y = g.add("s", op, args, "y").unwrap();
            g.add_output("y", y);
            (g, vec![ct, ut])
        };
        for (circular, w) in [(false, vec![0i64, 3, 4]), (true, vec![5i64, -1, 13])] {
            let (g, mut inputs) = graph(circular, true, 2);
            inputs.push(Tensor::from_vec(vec![3], w));
            let k = check_graph(&g, &inputs);
            assert!(k[0].starts_with("gpu cache scatter"), "{k:?}");
            for sm in [80, 90] {
                ptxas_check(&g, sm);
            }
        }
        let (g, inputs) = graph(false, false, 3);
        check_graph(&g, &inputs);
        let (g, mut inputs) = graph(false, true, 2);
        inputs.push(Tensor::from_vec(vec![3], vec![0i64, 5, 1]));
        let err = run_graph(&g, &inputs).unwrap_err();
        assert!(err.contains("failed with code 1"), "{err}");
    }

    /// ScatterND (slices of a [4, 3, 5] tensor by 1-element tuples, elements by full tuples)
    /// and ScatterElements along a middle axis with negative indices; an out-of-range index
    /// is an index error.
    #[test]
    fn scatters_without_reduction() {
        use kiln_ir::ScatterReduction;
        let scatter = |op: Op, idx_shape: &[usize], ids: Vec<i64>, upd_shape: &[usize]| {
            let mut g = Graph::new("t");
            let (data, dt) = f32_input(&mut g, "data", &[4, 3, 5]);
            let idx = g.add_input("idx", TensorType::fixed(DType::I64, idx_shape));
            let (upd, ut) = f32_input(&mut g, "upd", upd_shape);
            let y = g
                .add("s", op, vec![Some(data), Some(idx), Some(upd)], "y")
                .unwrap();
            g.add_output("y", y);
            (g, vec![dt, Tensor::from_vec(idx_shape.to_vec(), ids), ut])
        };
        let nd = Op::ScatterND {
            reduction: ScatterReduction::None,
        };
        let elements = Op::ScatterElements {
            axis: 1,
            reduction: ScatterReduction::None,
        };
        let cases = [
            scatter(nd.clone(), &[2, 1], vec![3, -4], &[2, 3, 5]),
            scatter(nd.clone(), &[3, 3], vec![0, 1, 2, 3, -1, 4, 2, 0, 0], &[3]),
            // Distinct destinations along the axis: j = 0 writes row 1, j = 1 row -1 (2).
            scatter(
                elements.clone(),
                &[4, 2, 5],
                (0..40).map(|i| if (i / 5) % 2 == 0 { 1 } else { -1 }).collect(),
                &[4, 2, 5],
            ),
        ];
        for (g, inputs) in &cases {
            let k = check_graph(g, inputs);
            assert!(k[0].starts_with("gpu scatter"), "{k:?}");
        }
        for sm in [80, 90] {
            ptxas_check(&cases[0].0, sm);
        }
        let (g, inputs) = scatter(nd, &[2, 1], vec![1, 4], &[2, 3, 5]);
        let err = run_graph(&g, &inputs).unwrap_err();
        assert!(err.contains("failed with code 1"), "{err}");
    }

    /// Scatters with a reduction, duplicate indices included: ScatterND adding and taking
    /// the maximum of f32 slices (a NaN in the data and one in the updates, which ScatterND's
    /// max keeps), ScatterElements multiplying and taking the minimum of i64 elements (exact,
    /// wrapping) and the maximum of f32 ones.
    #[test]
    fn scatters_with_reduction() {
        use kiln_ir::ScatterReduction as R;
        let graph = |op: Op, dtype: DType, data: Tensor, idx_shape: &[usize], ids: Vec<i64>, upd: Tensor| {
            let mut g = Graph::new("t");
            let d = g.add_input("data", TensorType::fixed(dtype, data.shape()));
            let i = g.add_input("idx", TensorType::fixed(DType::I64, idx_shape));
            let u = g.add_input("upd", TensorType::fixed(dtype, upd.shape()));
            let y = g.add("s", op, vec![Some(d), Some(i), Some(u)], "y").unwrap();
            g.add_output("y", y);
            (g, vec![data, Tensor::from_vec(idx_shape.to_vec(), ids), upd])
        };
        let f32s = |shape: &[usize], f: fn(usize) -> f32| {
            let n: usize = shape.iter().product();
            Tensor::from_vec(shape.to_vec(), (0..n).map(f).collect::<Vec<f32>>())
        };
        let i64s = |shape: &[usize], f: fn(usize) -> i64| {
            let n: usize = shape.iter().product();
            Tensor::from_vec(shape.to_vec(), (0..n).map(f).collect::<Vec<i64>>())
        };
        let mut cases = vec![];
        for op in [R::Add, R::Max] {
            let mut data = f32s(&[4, 3], |i| i as f32 * 0.5 - 2.0);
            let mut upd = f32s(&[5, 3], |i| (i * 7 % 11) as f32 * 0.25 - 1.0);
            if op == R::Max {
                data = f32s(&[4, 3], |i| if i == 4 { f32::NAN } else { i as f32 * 0.5 - 2.0 });
                upd = f32s(&[5, 3], |i| {
                    if i == 8 {
                        f32::NAN
                    } else {
                        (i * 7 % 11) as f32 * 0.25 - 1.0
                    }
                });
            }
            let nd = Op::ScatterND { reduction: op };
            cases.push(graph(nd, DType::F32, data, &[5, 1], vec![1, 3, 1, -3, 2], upd));
        }
        for op in [R::Mul, R::Min] {
            let data = i64s(&[3, 4], |i| i as i64 * 3 - 7);
            let upd = i64s(&[3, 4], |i| {
                (i as i64 * 5) % 9 - 4 + if i == 5 { 1 << 40 } else { 0 }
            });
            let ids: Vec<i64> = (0..12).map(|i| [0, 2, 0, -1][i % 4]).collect();
            let el = Op::ScatterElements {
                axis: 1,
                reduction: op,
            };
            cases.push(graph(el, DType::I64, data, &[3, 4], ids, upd));
        }
        let data = f32s(&[2, 5], |i| i as f32 - 4.0);
        let upd = f32s(&[3, 5], |i| (i * 3 % 7) as f32 - 3.0);
        let el = Op::ScatterElements {
            axis: 0,
            reduction: R::Max,
        };
        cases.push(graph(
            el,
            DType::F32,
            data,
            &[3, 5],
            (0..15).map(|i| (i % 2) as i64).collect(),
            upd,
        ));
        for (g, inputs) in &cases {
            let k = check_graph(g, inputs);
            assert!(k[0].starts_with("gpu scatter"), "{k:?}");
        }
        for sm in [80, 90] {
            ptxas_check(&cases[0].0, sm);
            ptxas_check(&cases[2].0, sm);
        }
    }
}
