//! Strided copies on the GPU: Transpose, Slice, Concat, Split, Expand, Tile, DepthToSpace and
//! SpaceToDepth — whatever the CPU lowers to the library's copy kernel (`kiln_uk_copy`), whose
//! descriptors (byte offsets, dims and byte strides per copy) this kernel reads, so both
//! backends move the same bytes.
//!
//! One thread per element of all the node's copies together, in destination order within a
//! copy (the innermost axis on consecutive threads, so the stores coalesce; a transpose's loads
//! are strided). A copy's contiguous `block` is one more axis of `block / esize` elements. A
//! grid-stride loop covers any element count.

use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims};
use crate::target::TargetDesc;
use inkwell::values::{BasicValue, IntValue};
use inkwell::IntPredicate;
use kiln_ir::{Layout, Op};

const THREADS: u64 = 256;
/// Copies a node may have before the per-thread search through them gets long.
const MAX_COPIES: usize = 64;

#[derive(Debug)]
struct Copy {
    src_input: usize,
    dst_output: usize,
    src_off: i64,
    dst_off: i64,
    /// Element extents, outermost first, and the byte strides of source and destination.
    dims: Vec<u64>,
    src_strides: Vec<i64>,
    dst_strides: Vec<i64>,
}

impl Copy {
    fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

#[derive(Debug)]
struct CopyGpu {
    esize: u64,
    copies: Vec<Copy>,
    what: &'static str,
}

/// The copy kernel for `node`, or None when the CPU does not lower it to `kiln_uk_copy`.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    use kiln_ir::OpFamily;
    if let Some(k) = identity_reduce(node)? {
        return Ok(Some(k));
    }
    if !matches!(node.node.op.family(), OpFamily::DataMovement | OpFamily::Resize) {
        return Ok(None);
    }
    let Some(call) = crate::uk::lower(node)? else {
        return Ok(None);
    };
    if call.symbol != "copy" {
        return Ok(None);
    }
    let at = &call.iattr;
    let esize = at[0];
    if ![1, 2, 4, 8].contains(&esize) {
        return Ok(None);
    }
    let n_copies = at[1] as usize;
    if n_copies > MAX_COPIES {
        return Ok(None);
    }
    let mut copies = vec![];
    let mut p = 2;
    for _ in 0..n_copies {
        let (block, rank) = (at[p + 4], at[p + 5] as usize);
        let list = |from: usize| at[from..from + rank].to_vec();
        let mut dims: Vec<u64> = list(p + 6).iter().map(|&d| d as u64).collect();
        let mut src_strides = list(p + 6 + rank);
        let mut dst_strides = list(p + 6 + 2 * rank);
        if block % esize != 0 {
            return Ok(None);
        }
        if block > esize {
            dims.push((block / esize) as u64);
            src_strides.push(esize);
            dst_strides.push(esize);
        }
        copies.push(Copy {
            src_input: at[p] as usize,
            dst_output: at[p + 1] as usize,
            src_off: at[p + 2],
            dst_off: at[p + 3],
            dims,
            src_strides,
            dst_strides,
        });
        p += 6 + 3 * rank;
    }
    copies.retain(|c| c.elements() > 0);
    Ok(Some(Box::new(CopyGpu {
        esize: esize as u64,
        copies,
        what: node.node.op.name(),
    })))
}

/// A Reduce with `noop_with_empty_axes` and no axes is the identity: one copy of the whole
/// tensor.
fn identity_reduce(node: &NodeInfo) -> Result<Option<Box<dyn GpuKernel>>> {
    let Op::Reduce {
        noop_with_empty_axes: true,
        ..
    } = node.op()
    else {
        return Ok(None);
    };
    let no_axes = match node.input(1) {
        None => true,
        Some(_) => node.known(1).is_some_and(|t| t.is_empty()),
    };
    let (x, y) = (node.input_type(0), node.output_type(0));
    let same = x.is_some_and(|x| x.dtype == y.dtype && x.layout == Layout::RowMajor && x.is_static());
    if !no_axes || !same || y.layout != Layout::RowMajor || node.input_shape(0)? != node.output_shape(0)? {
        return Ok(None);
    }
    let esize = y.dtype.size_bytes() as i64;
    let n = node.output_shape(0)?.iter().product::<usize>() as u64;
    let copies = vec![Copy {
        src_input: 0,
        dst_output: 0,
        src_off: 0,
        dst_off: 0,
        dims: vec![n],
        src_strides: vec![esize],
        dst_strides: vec![esize],
    }];
    Ok(Some(Box::new(CopyGpu {
        esize: esize as u64,
        copies: copies.into_iter().filter(|c| c.elements() > 0).collect(),
        what: "Identity",
    })))
}

impl CopyGpu {
    fn total(&self) -> u64 {
        self.copies.iter().map(Copy::elements).sum()
    }

    /// Copies element `e` (an index into copy `c`'s elements) from source to destination.
    fn copy_element<'ctx>(
        &self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        c: &Copy,
        idx: IntValue<'ctx>,
    ) -> Result<()> {
        let (mut src, mut dst) = (e.i64c(c.src_off), e.i64c(c.dst_off));
        let mut rest = idx;
        for (d, &extent) in c.dims.iter().enumerate().rev() {
            let i = if d == 0 {
                rest
            } else {
                e.uremc(rest, extent as i64)?
            };
            if d > 0 {
                rest = e.udivc(rest, extent as i64)?;
            }
            src = e.add(src, e.mulc(i, c.src_strides[d])?)?;
            dst = e.add(dst, e.mulc(i, c.dst_strides[d])?)?;
        }
        let i8t = k.cx.i8_type();
        let ty = match self.esize {
            1 => k.cx.i8_type(),
            2 => k.cx.i16_type(),
            4 => k.cx.i32_type(),
            _ => k.cx.i64_type(),
        };
        // SAFETY (of the GEPs): offsets come from the planner's descriptors for these buffers.
        let from = unsafe { e.b.build_gep(i8t, k.input(c.src_input)?, &[src], "") }.map_err(llvm)?;
        let to = unsafe { e.b.build_gep(i8t, k.output(c.dst_output)?, &[dst], "") }.map_err(llvm)?;
        let v = e.b.build_load(ty, from, "").map_err(llvm)?;
        v.as_instruction_value()
            .expect("a load")
            .set_alignment(self.esize as u32)
            .map_err(llvm)?;
        let st = e.b.build_store(to, v).map_err(llvm)?;
        st.set_alignment(self.esize as u32).map_err(llvm)?;
        Ok(())
    }
}

impl KernelCommon for CopyGpu {
    fn describe(&self) -> String {
        format!(
            "gpu copy {} {} copies of {} elements ({} B each)",
            self.what,
            self.copies.len(),
            self.total(),
            self.esize
        )
    }
}

impl GpuKernel for CopyGpu {
    fn launch(&self) -> LaunchDims {
        LaunchDims::per_item(self.total(), THREADS)
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        k.grid_stride_loop(self.total(), THREADS, |i| {
            // Which copy element i belongs to: the copies' ranges follow one another.
            let mut start = 0u64;
            for c in &self.copies {
                let end = start + c.elements();
                let lo = e.icmp(IntPredicate::UGE, i, e.i64c(start as i64))?;
                let hi = e.icmp(IntPredicate::ULT, i, e.i64c(end as i64))?;
                let inside = e.b.build_and(lo, hi, "").map_err(llvm)?;
                e.if_then(inside, || {
                    self.copy_element(k, &e, c, e.addc(i, -(start as i64))?)
                })?;
                start = end;
            }
            Ok(())
        })?;
        k.ret()
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check};
    use kiln_ir::{DType, Graph, Op, Tensor, TensorType};

    fn input(g: &mut Graph, name: &str, shape: &[usize], dtype: DType) -> (kiln_ir::ValueId, Tensor) {
        let v = g.add_input(name, TensorType::fixed(dtype, shape));
        let n: usize = shape.iter().product();
        let t = match dtype {
            DType::F32 => Tensor::from_vec(
                shape.to_vec(),
                (0..n).map(|i| i as f32 * 0.5 - 3.0).collect::<Vec<f32>>(),
            ),
            DType::I64 => Tensor::from_vec(
                shape.to_vec(),
                (0..n as i64).map(|i| i * 7 - 11).collect::<Vec<i64>>(),
            ),
            _ => Tensor::from_vec(shape.to_vec(), (0..n).map(|i| i % 3 == 0).collect::<Vec<bool>>()),
        };
        (v, t)
    }

    fn i64s(g: &mut Graph, name: &str, v: &[i64]) -> kiln_ir::ValueId {
        g.add_const(name, Tensor::from_vec(vec![v.len()], v.to_vec()))
    }

    fn assert_copies(kernels: &[String]) {
        assert!(
            kernels.iter().all(|k| k.starts_with("gpu copy")),
            "not all GPU copies: {kernels:?}"
        );
    }

    #[test]
    fn transpose_concat_split() {
        let mut g = Graph::new("t");
        let (x, xt) = input(&mut g, "x", &[3, 17, 5], DType::F32);
        let tr = g
            .add("tr", Op::Transpose { perm: vec![2, 0, 1] }, vec![Some(x)], "tr")
            .unwrap();
        g.add_output("tr", tr);
        let (a, at) = input(&mut g, "a", &[2, 3, 4], DType::I64);
        let (b, bt) = input(&mut g, "b", &[2, 5, 4], DType::I64);
        let cat = g
            .add("cat", Op::Concat { axis: 1 }, vec![Some(a), Some(b)], "cat")
            .unwrap();
        g.add_output("cat", cat);
        let (s, st) = input(&mut g, "s", &[6, 9], DType::Bool);
        let sizes = i64s(&mut g, "sizes", &[2, 7]);
        let outs = g
            .add_node(
                "sp",
                Op::Split {
                    axis: 1,
                    num_outputs: None,
                },
                vec![Some(s), Some(sizes)],
                vec!["s0".into(), "s1".into()],
            )
            .unwrap();
        g.add_output("s0", outs[0]);
        g.add_output("s1", outs[1]);
        assert_copies(&check_graph(&g, &[xt, at, bt, st]));
    }

    #[test]
    fn reduce_without_axes_and_noop_is_a_copy() {
        let mut g = Graph::new("t");
        let (x, xt) = input(&mut g, "x", &[3, 4, 5], DType::F32);
        let op = Op::Reduce {
            kind: kiln_ir::ReduceKind::Sum,
            keepdims: true,
            noop_with_empty_axes: true,
        };
        let empty = i64s(&mut g, "axes", &[]);
        let y = g.add("r", op, vec![Some(x), Some(empty)], "y").unwrap();
        g.add_output("y", y);
        let (b, bt) = input(&mut g, "b", &[7, 2], DType::Bool);
        let any = Op::Reduce {
            kind: kiln_ir::ReduceKind::Max,
            keepdims: true,
            noop_with_empty_axes: true,
        };
        let z = g.add("rb", any, vec![Some(b), None], "z").unwrap();
        g.add_output("z", z);
        assert_copies(&check_graph(&g, &[xt, bt]));
    }

    #[test]
    fn reversed_slice_and_expand() {
        let mut g = Graph::new("t");
        let (x, xt) = input(&mut g, "x", &[7, 10], DType::F32);
        let starts = i64s(&mut g, "st", &[6, 1]);
        let ends = i64s(&mut g, "en", &[-100, 9]);
        let axes = i64s(&mut g, "ax", &[0, 1]);
        let steps = i64s(&mut g, "sp", &[-2, 3]);
        let sl = g
            .add(
                "sl",
                Op::Slice,
                vec![Some(x), Some(starts), Some(ends), Some(axes), Some(steps)],
                "sl",
            )
            .unwrap();
        g.add_output("sl", sl);
        let (y, yt) = input(&mut g, "y", &[3, 1, 5], DType::F32);
        let shape = i64s(&mut g, "shape", &[2, 3, 4, 5]);
        let ex = g.add("ex", Op::Expand, vec![Some(y), Some(shape)], "ex").unwrap();
        g.add_output("ex", ex);
        assert_copies(&check_graph(&g, &[xt, yt]));
    }

    #[test]
    fn many_blocks() {
        let mut g = Graph::new("t");
        let (x, xt) = input(&mut g, "x", &[33, 40, 7], DType::F32);
        let tr = g
            .add("tr", Op::Transpose { perm: vec![1, 2, 0] }, vec![Some(x)], "tr")
            .unwrap();
        g.add_output("tr", tr);
        assert_copies(&check_graph(&g, &[xt]));
    }

    #[test]
    fn ptx_assembles() {
        let mut g = Graph::new("t");
        let (x, _) = input(&mut g, "x", &[3, 17, 5], DType::F32);
        let tr = g
            .add("tr", Op::Transpose { perm: vec![2, 0, 1] }, vec![Some(x)], "tr")
            .unwrap();
        g.add_output("tr", tr);
        for sm in [80, 90] {
            ptxas_check(&g, sm);
        }
    }
}
