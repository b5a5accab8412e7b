//! Elementwise groups on the GPU: the same groups and per-element code as the CPU loop
//! (`gen::elementwise`: external inputs read through broadcast strides on the merged output
//! axes, intermediates in registers), with one thread per output element.
//!
//! Blocks of 256 threads; consecutive threads take consecutive output elements, so the output
//! and every input that is contiguous on the innermost axis are accessed coalesced, and an input
//! broadcast along it is one address per warp. The grid covers the output once, up to
//! `MAX_GRID` blocks; larger outputs loop with the grid's stride. Index arithmetic is 32-bit
//! (the divisions by the axis extents are constant divisions, cheap in 32 bits) unless the
//! element count needs 64.
//!
//! The math is the CPU's polynomial code at one lane (`gen::vmath`): portable IR, so the same
//! body runs in emulation.

use crate::error::Result;
use crate::gen::elementwise::{self as ew, EwGroup};
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims, Mode, Sreg};
use crate::target::TargetDesc;
use inkwell::types::IntType;
use inkwell::values::{IntValue, PointerValue};
use inkwell::AddressSpace;
use inkwell::IntPredicate;
use kiln_ir::{Graph, NodeId, ValueId};

const BLOCK: usize = 256;
/// The most blocks a launch has; beyond, each thread takes several elements.
const MAX_GRID: usize = 1 << 20;

pub struct EwGpu {
    g: EwGroup,
    /// The kernel input each external input of the group is read from.
    slots: Vec<usize>,
    /// Inputs of the node the kernel does not read (scalar constants folded into the code).
    unread: Vec<usize>,
    total: usize,
    grid: usize,
    what: String,
}

impl EwGpu {
    fn new(g: EwGroup, slots: Vec<usize>, unread: Vec<usize>, max_grid: usize) -> EwGpu {
        let total: usize = g.dims.iter().product();
        let grid = total.div_ceil(BLOCK).clamp(1, max_grid);
        let what = format!(
            "gpu elementwise[{}] {:?} grid={grid} block={BLOCK}",
            g.ops.join(","),
            g.dims
        );
        EwGpu {
            g,
            slots,
            unread,
            total,
            grid,
            what,
        }
    }

    /// Whether the element index and its loop stay below 2^31.
    fn narrow(&self) -> bool {
        self.total + self.grid * BLOCK <= i32::MAX as usize
    }
}

/// The generator for a node outside any group (a lone non-f32 node, or one the planner ran
/// without fusion): the group of that node alone.
pub fn lower(node: &NodeInfo, target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    if !target.is_gpu() || node.extra.is_some() || !ew::supports_on(node.graph, node.id, true) {
        return Ok(None);
    }
    let Some((g, ext)) = ew::analyze(node.graph, &[node.id]) else {
        return Ok(None);
    };
    let inputs = &node.node.inputs;
    let slots: Option<Vec<usize>> = ext
        .iter()
        .map(|v| inputs.iter().position(|i| *i == Some(*v)))
        .collect();
    let Some(slots) = slots else {
        return Ok(None);
    };
    let unread = (0..inputs.len()).filter(|i| !slots.contains(i)).collect();
    Ok(Some(Box::new(EwGpu::new(g, slots, unread, MAX_GRID))))
}

/// The kernel of an elementwise group (nodes in graph order, the last one's output being the
/// kernel's) and its inputs, or None when the group cannot be generated.
pub fn lower_group(
    graph: &Graph,
    nodes: &[NodeId],
    target: &TargetDesc,
) -> Option<(Box<dyn GpuKernel>, Vec<ValueId>)> {
    lower_group_with(graph, nodes, target, MAX_GRID)
}

fn lower_group_with(
    graph: &Graph,
    nodes: &[NodeId],
    target: &TargetDesc,
    max_grid: usize,
) -> Option<(Box<dyn GpuKernel>, Vec<ValueId>)> {
    if !target.is_gpu() || !nodes.iter().all(|n| ew::supports_on(graph, *n, true)) {
        return None;
    }
    let (g, ext) = ew::analyze(graph, nodes)?;
    let slots = (0..ext.len()).collect();
    Some((Box::new(EwGpu::new(g, slots, vec![], max_grid)), ext))
}

/// Integer helpers on the kernel's index type.
struct Ix<'a, 'b, 'ctx> {
    e: &'a Emit<'b, 'ctx>,
    t: IntType<'ctx>,
}

impl<'ctx> Ix<'_, '_, 'ctx> {
    fn c(&self, v: usize) -> IntValue<'ctx> {
        self.t.const_int(v as u64, false)
    }
    fn add(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
        self.e.b.build_int_nuw_add(a, b, "").map_err(llvm)
    }
    fn mulc(&self, a: IntValue<'ctx>, c: usize) -> Result<IntValue<'ctx>> {
        if c == 1 {
            return Ok(a);
        }
        self.e.b.build_int_nuw_mul(a, self.c(c), "").map_err(llvm)
    }
    fn divc(&self, a: IntValue<'ctx>, c: usize) -> Result<IntValue<'ctx>> {
        self.e.b.build_int_unsigned_div(a, self.c(c), "").map_err(llvm)
    }
    fn remc(&self, a: IntValue<'ctx>, c: usize) -> Result<IntValue<'ctx>> {
        self.e.b.build_int_unsigned_rem(a, self.c(c), "").map_err(llvm)
    }
    fn sreg(&self, k: &GpuBuilder<'_, 'ctx>, r: Sreg) -> Result<IntValue<'ctx>> {
        let v = k.sreg(r)?;
        if self.t.get_bit_width() == 32 {
            return Ok(v);
        }
        self.e.b.build_int_z_extend(v, self.t, "").map_err(llvm)
    }
}

impl KernelCommon for EwGpu {
    fn describe(&self) -> String {
        self.what.clone()
    }

    fn reads_input(&self, i: usize) -> bool {
        !self.unread.contains(&i)
    }
}

impl GpuKernel for EwGpu {
    fn launch(&self) -> LaunchDims {
        LaunchDims {
            grid: [self.grid as u32, 1, 1],
            block: [BLOCK as u32, 1, 1],
            shared_bytes: 0,
        }
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let ix = Ix {
            e: &e,
            t: if self.narrow() {
                k.cx.i32_type()
            } else {
                k.cx.i64_type()
            },
        };
        if self.total == 0 {
            return k.ret();
        }
        let tid = ix.sreg(k, Sreg::TidX)?;
        let cta = ix.sreg(k, Sreg::CtaidX)?;
        let start = ix.add(ix.mulc(cta, BLOCK)?, tid)?;
        let total = ix.c(self.total);
        let stride = self.grid * BLOCK;
        let b = k.builder;
        let pre = b.get_insert_block().expect("builder is positioned");
        let body = k.cx.append_basic_block(k.function, "elem");
        let exit = k.cx.append_basic_block(k.function, "done");
        let enter = b
            .build_int_compare(IntPredicate::ULT, start, total, "")
            .map_err(llvm)?;
        b.build_conditional_branch(enter, body, exit).map_err(llvm)?;
        b.position_at_end(body);
        let phi = if stride >= self.total {
            None
        } else {
            let phi = b.build_phi(ix.t, "idx").map_err(llvm)?;
            phi.add_incoming(&[(&start, pre)]);
            Some(phi)
        };
        let idx = phi.map_or(start, |p| p.as_basic_value().into_int_value());
        self.element(k, &ix, idx)?;
        if let Some(phi) = phi {
            let next = ix.add(idx, ix.c(stride))?;
            let latch = b.get_insert_block().expect("builder is positioned");
            phi.add_incoming(&[(&next, latch)]);
            let more = b
                .build_int_compare(IntPredicate::ULT, next, total, "")
                .map_err(llvm)?;
            b.build_conditional_branch(more, body, exit).map_err(llvm)?;
        } else {
            b.build_unconditional_branch(exit).map_err(llvm)?;
        }
        b.position_at_end(exit);
        k.ret()
    }
}

impl EwGpu {
    /// Computes and stores output element `idx` (a flat index of the merged axes).
    fn element<'ctx>(
        &self,
        k: &GpuBuilder<'_, 'ctx>,
        ix: &Ix<'_, '_, 'ctx>,
        idx: IntValue<'ctx>,
    ) -> Result<()> {
        let g = &self.g;
        let e = ix.e;
        // Element offsets of every input: the coordinates of idx, innermost axis first.
        let mut offs: Vec<Option<IntValue<'ctx>>> = vec![None; g.in_types.len()];
        let mut rem = idx;
        for ax in (0..g.dims.len()).rev() {
            let d = g.dims[ax];
            let coord = if ax == 0 { rem } else { ix.remc(rem, d)? };
            if ax > 0 {
                rem = ix.divc(rem, d)?;
            }
            for (i, o) in offs.iter_mut().enumerate() {
                let s = g.strides[i][ax];
                if s != 0 {
                    let t = ix.mulc(coord, s)?;
                    *o = Some(match *o {
                        Some(o) => ix.add(o, t)?,
                        None => t,
                    });
                }
            }
        }
        let out = g.compute(e, 1, |i| {
            let base = global(k, k.input(self.slots[i])?)?;
            let off = offs[i].unwrap_or_else(|| ix.c(0));
            ew::load(e, base, g.in_types[i], off, 1)
        })?;
        ew::store(e, global(k, k.output(0)?)?, g.out_dtype(), idx, out)
    }
}

/// The tensor's address as a global-memory pointer on the device, so that its loads and stores
/// are `ld.global`/`st.global` rather than generic ones (the tensors are in device memory; the
/// frame hands out generic addresses).
fn global<'ctx>(k: &GpuBuilder<'_, 'ctx>, p: PointerValue<'ctx>) -> Result<PointerValue<'ctx>> {
    if k.mode != Mode::Device {
        return Ok(p);
    }
    k.builder
        .build_address_space_cast(p, k.cx.ptr_type(AddressSpace::from(1u16)), "global")
        .map_err(llvm)
}

#[cfg(test)]
mod tests;
