//! MaxUnpool on the GPU: every element of X written at its index into the unpooled tensor
//! (the indices address the natural unpooled shape, flat over N and C too; a larger
//! `output_shape` pads each axis at its end), everything else zero, as the library kernel
//! (`kiln_uk_max_unpool` in movement.c) and the reference.
//!
//! Indices may repeat (ONNX does not forbid it), and then the last element in X's order wins.
//! One block of `THREADS` threads in three phases between barriers: the output zeroed and a
//! winner slot per unpooled position set to -1; each element takes its slot with an atomic
//! max of its own position; each element that holds its slot stores its value. One block,
//! because only a block has a barrier (as the scatters in `gather`); unpooling is a
//! decoder's cheap step. An index outside the unpooled tensor reports `KILN_CUDA_EINDEX`.

use super::gather::move_unit;
use super::scalar::load_index;
use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims, Sreg, EINDEX};
use crate::target::TargetDesc;
use inkwell::values::IntValue;
use inkwell::{AtomicOrdering, AtomicRMWBinOp, IntPredicate};
use kiln_ir::{DType, Layout, Op, VisionOp};

const THREADS: u64 = 256;

#[derive(Debug)]
struct UnpoolGpu {
    /// The natural unpooled shape the indices address, and the output's.
    natural: Vec<usize>,
    out: Vec<usize>,
    elements: u64,
    esize: u64,
    index: DType,
}

/// The kernel for a MaxUnpool of static row-major tensors, or None.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    if !matches!(node.op(), Op::Vision(VisionOp::MaxUnpool { .. })) {
        return Ok(None);
    }
    let plain = |t: &kiln_ir::TensorType| t.layout == Layout::RowMajor && t.is_static();
    let (Some(x), Some(i)) = (node.input_type(0), node.input_type(1)) else {
        return Ok(None);
    };
    let esize = x.dtype.size_bytes() as u64;
    if !plain(x)
        || !plain(i)
        || !matches!(i.dtype, DType::I32 | DType::I64)
        || !plain(node.output_type(0))
        || ![1, 2, 4, 8].contains(&esize)
    {
        return Ok(None);
    }
    let Some(call) = crate::uk::lower(node)? else {
        return Ok(None);
    };
    let at = &call.iattr;
    let r = at[0] as usize;
    let natural: Vec<usize> = at[1..1 + r].iter().map(|&d| d as usize).collect();
    let out: Vec<usize> = at[1 + r..1 + 2 * r].iter().map(|&d| d as usize).collect();
    Ok(Some(Box::new(UnpoolGpu {
        natural,
        out,
        elements: node.input_shape(0)?.iter().product::<usize>() as u64,
        esize,
        index: i.dtype,
    })))
}

impl UnpoolGpu {
    fn natural_len(&self) -> u64 {
        self.natural.iter().product::<usize>() as u64
    }

    fn out_len(&self) -> u64 {
        self.out.iter().product::<usize>() as u64
    }

    /// The output position of unpooled position `i` (the same coordinates in the output's
    /// possibly larger shape).
    fn out_offset<'ctx>(&self, e: &Emit<'_, 'ctx>, i: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
        let (mut rest, mut off, mut mul) = (i, e.i64c(0), 1i64);
        for (&n, &o) in self.natural.iter().zip(&self.out).rev() {
            off = e.add(off, e.mulc(e.uremc(rest, n as i64)?, mul)?)?;
            rest = e.udivc(rest, n as i64)?;
            mul *= o as i64;
        }
        Ok(off)
    }
}

impl KernelCommon for UnpoolGpu {
    fn describe(&self) -> String {
        format!(
            "gpu maxunpool {} elements into {:?} (unpooled {:?})",
            self.elements, self.out, self.natural
        )
    }
}

impl GpuKernel for UnpoolGpu {
    fn launch(&self) -> LaunchDims {
        LaunchDims {
            grid: [1, 1, 1],
            block: [THREADS as u32, 1, 1],
            shared_bytes: 0,
        }
    }

    fn scratch_bytes(&self) -> u64 {
        // A winner (an element position, i64) per unpooled position.
        self.natural_len() * 8
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let (x, idx, y, winners) = (k.input(0)?, k.input(1)?, k.output(0)?, k.scratch()?);
        let i64t = k.cx.i64_type();
        let tid = k.sreg64(Sreg::TidX)?;
        let (t, es) = (THREADS as i64, self.esize as i64);
        let winner = |i| -> Result<_> {
            // SAFETY (of the IR): i < the unpooled length, the scratch's i64 count.
            unsafe { e.b.build_in_bounds_gep(i64t, winners, &[i], "") }.map_err(llvm)
        };
        let zero = super::gather::int_type(k, self.esize).const_zero();
        e.for_range(tid, e.i64c(self.out_len() as i64), t, |o| {
            e.store(e.gep_u8(y, e.mulc(o, es)?)?, zero)
        })?;
        e.for_range(tid, e.i64c(self.natural_len() as i64), t, |i| {
            e.store(winner(i)?, e.i64c(-1))
        })?;
        k.barrier()?;
        let nat = self.natural_len() as i64;
        // The index of element `j` and whether it lies in the unpooled tensor.
        let target = |j| -> Result<_> {
            let i = load_index(&e, idx, self.index, j)?;
            Ok((i, e.icmp(IntPredicate::ULT, i, e.i64c(nat))?))
        };
        let elements = e.i64c(self.elements as i64);
        e.for_range(tid, elements, t, |j| {
            let (i, inside) = target(j)?;
            e.if_else(
                inside,
                || {
                    e.b.build_atomicrmw(AtomicRMWBinOp::Max, winner(i)?, j, AtomicOrdering::Monotonic)
                        .map_err(llvm)?;
                    Ok(())
                },
                || k.report_error(EINDEX),
            )
        })?;
        k.barrier()?;
        e.for_range(tid, elements, t, |j| {
            let (i, inside) = target(j)?;
            e.if_then(inside, || {
                let w =
                    e.b.build_load(i64t, winner(i)?, "")
                        .map_err(llvm)?
                        .into_int_value();
                e.if_then(e.icmp(IntPredicate::EQ, w, j)?, || {
                    let to = e.mulc(self.out_offset(&e, i)?, es)?;
                    move_unit(k, &e, self.esize, (x, e.mulc(j, es)?), (y, to))
                })
            })
        })?;
        k.ret()
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check};
    use kiln_ir::{Graph, Op, Tensor, TensorType, VisionOp};

    fn graph(x: Tensor, idx: Tensor, output_shape: Option<Vec<i64>>) -> Graph {
        let mut g = Graph::new("t");
        let xv = g.add_input("x", TensorType::fixed(x.dtype(), x.shape()));
        let iv = g.add_const("i", idx);
        let mut ins = vec![Some(xv), Some(iv)];
        if let Some(s) = output_shape {
            ins.push(Some(g.add_const("s", Tensor::from_vec(vec![s.len()], s))));
        }
        let op = Op::Vision(VisionOp::MaxUnpool {
            kernel_shape: vec![2, 2],
            strides: vec![2, 2],
            pads: vec![],
        });
        let y = g.add("unpool", op, ins, "y").unwrap();
        g.add_output("y", y);
        g
    }

    #[test]
    fn unpools_with_duplicates_and_a_larger_output() {
        // X [2, 3, 3, 3] unpooled to [2, 3, 6, 6]; indices anywhere in the tensor (other
        // planes too), with repeats that the last element must win.
        let n = 2 * 3 * 3 * 3;
        let x: Vec<f32> = (0..n).map(|i| i as f32 + 0.5).collect();
        let idx: Vec<i64> = (0..n as i64).map(|i| (i * 13) % 40 * 5).collect();
        let (xt, it) = (
            Tensor::from_vec(vec![2, 3, 3, 3], x),
            Tensor::from_vec(vec![2, 3, 3, 3], idx),
        );
        for shape in [None, Some(vec![2, 3, 7, 8])] {
            let g = graph(xt.clone(), it.clone(), shape);
            let d = check_graph(&g, std::slice::from_ref(&xt));
            assert!(d[0].starts_with("gpu maxunpool"), "{d:?}");
        }
        let g = graph(xt, it, Some(vec![2, 3, 7, 8]));
        for sm in [80, 90] {
            ptxas_check(&g, sm);
        }
    }
}
