//! One planned kernel: the implementation that runs a node (a generated CPU kernel, a kernel
//! library call or a generated GPU kernel) and the values, packed constants and scratch it uses.

use crate::gen::GeneratedKernel;
use crate::kernel::KernelCommon;
use crate::nvptx::GpuKernel;
use crate::uk::UkCall;
use kiln_ir::{NodeId, ValueId};

pub enum KernelImpl {
    Generated(Box<dyn GeneratedKernel>),
    Ukernel(UkCall),
    /// A kernel generated for the GPU (`--target cuda`).
    Gpu(Box<dyn GpuKernel>),
}

pub struct Kernel {
    pub node: NodeId,
    /// The node's name and operator, for messages and reports.
    pub node_name: String,
    pub op_name: &'static str,
    pub imp: KernelImpl,
    /// One entry per node input; None for absent optional inputs (and weights a generated
    /// kernel reads only in packed form).
    pub inputs: Vec<Option<ValueId>>,
    pub outputs: Vec<ValueId>,
    /// Offsets of packed constants in the weights blob.
    pub packed: Vec<u64>,
    /// Arena offset of the kernel's shared scratch, if any.
    pub scratch: Option<u64>,
    /// A fused kernel's extra input (input index, value): the residual of an epilogue.
    pub extra: Option<(usize, ValueId)>,
    /// Nodes fused into this kernel after `node`, for reports.
    pub fused: Vec<NodeId>,
}

impl Kernel {
    /// `node (Op + Fused...): implementation`, as `kiln compile --list-kernels` shows it.
    pub fn line(&self, graph: &kiln_ir::Graph) -> String {
        let fused: Vec<&str> = self.fused.iter().map(|n| graph.node(*n).op.name()).collect();
        let with = if fused.is_empty() {
            String::new()
        } else {
            format!(" + {}", fused.join(" + "))
        };
        format!("{} ({}{with}): {}", self.node_name, self.op_name, self.describe())
    }

    pub fn describe(&self) -> String {
        match &self.imp {
            KernelImpl::Generated(g) => g.describe(),
            KernelImpl::Ukernel(c) => c.describe(),
            KernelImpl::Gpu(g) => g.describe(),
        }
    }
}

impl KernelImpl {
    /// A generated kernel, CPU or GPU, as the planner sees it; None for a kernel-library call.
    pub fn generated(&self) -> Option<&dyn KernelCommon> {
        match self {
            KernelImpl::Generated(g) => Some(g.as_ref()),
            KernelImpl::Gpu(g) => Some(g.as_ref()),
            KernelImpl::Ukernel(_) => None,
        }
    }

    /// [`Self::generated`], mutable: the planner takes its packed constants.
    pub fn generated_mut(&mut self) -> Option<&mut dyn KernelCommon> {
        match self {
            KernelImpl::Generated(g) => Some(g.as_mut()),
            KernelImpl::Gpu(g) => Some(g.as_mut()),
            KernelImpl::Ukernel(_) => None,
        }
    }
}
