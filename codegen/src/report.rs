//! What the planner decided, in plain data: kernels and the nodes each implements, what became
//! of every node of the planned graph, the arena buffers with their lifetimes, and what the
//! target is assumed to have. `kiln compile --report` and `kiln explain` are built from it.

use crate::kernel::Storage;
use crate::plan::kernel::KernelImpl;
use crate::plan::{self, BufferOwner, Plan};
use crate::target::{Isa, TargetDesc};
use kiln_ir::{Graph, Layout, NodeId, Op, QuantOp, TensorType, ValueId};
use std::collections::{HashMap, HashSet};

/// A value's type as reports show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValueInfo {
    pub name: String,
    pub dtype: String,
    /// Fixed extents; symbolic dimensions are shown by name.
    pub shape: Vec<String>,
    /// `row-major` or `channels-last`.
    pub layout: &'static str,
    /// The element type the artifact stores the value in where it is not `dtype`: `bf16` for
    /// an f32 value that only bf16 readers read (`store-bf16`).
    pub stored_as: Option<String>,
}

impl ValueInfo {
    pub fn new(name: &str, ty: &TensorType) -> ValueInfo {
        ValueInfo {
            name: name.to_string(),
            dtype: ty.dtype.to_string(),
            shape: ty.shape.iter().map(|d| d.to_string()).collect(),
            layout: layout_name(ty.layout),
            stored_as: None,
        }
    }
}

pub fn layout_name(l: Layout) -> &'static str {
    match l {
        Layout::RowMajor => "row-major",
        Layout::ChannelsLast => "channels-last",
    }
}

/// One kernel of the plan, in execution order.
#[derive(Clone, Debug)]
pub struct KernelReport {
    /// Generated kernel description, or the `kiln_uk_*` symbol of a kernel-library call.
    pub implementation: String,
    /// Generated (LLVM IR emitted for this model) or from the kernel library.
    pub generated: bool,
    /// The nodes it implements: the anchor first, then the nodes fused into it, as (name, op).
    pub nodes: Vec<(String, &'static str)>,
    pub inputs: Vec<ValueInfo>,
    pub outputs: Vec<ValueInfo>,
    /// Arena offset of the kernel's shared scratch.
    pub scratch_offset: Option<u64>,
}

/// What became of one node of the planned graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeFate {
    /// A graph input.
    Input,
    /// Implemented by kernel `kernel`; `fused` when it is not the kernel's anchor node.
    Kernel { kernel: usize, fused: bool },
    /// Its value is known at compile time (a constant, or folded shape arithmetic): stored in
    /// the weights blob when something reads it, no kernel runs.
    Constant,
    /// A view (Reshape, Flatten, Squeeze, Unsqueeze, Identity): shares the bytes of `of`.
    View { of: String },
    /// No graph output depends on it: not compiled.
    Dead,
}

/// One node of the planned graph (after optimizer passes and control-flow lowering).
#[derive(Clone, Debug)]
pub struct NodeReport {
    pub name: String,
    pub op: &'static str,
    pub fate: NodeFate,
    /// Type of the node's first output (None for nodes without outputs).
    pub output: Option<ValueInfo>,
}

/// Where an arena buffer's bytes are and when they are alive (kernel indices, inclusive).
#[derive(Clone, Debug)]
pub struct BufferReport {
    /// The value's name, or None for a kernel's scratch.
    pub value: Option<String>,
    /// For scratch: the kernel that uses it.
    pub scratch_of: Option<usize>,
    pub offset: u64,
    pub size: u64,
    pub first: usize,
    /// `kernels.len()` means alive until the final copies into output buffers.
    pub last: usize,
}

/// A graph output and where its bytes come from.
#[derive(Clone, Debug)]
pub struct OutputReport {
    pub name: String,
    /// `kernel` (written in place by the kernel producing it) or `copy` (copied at the end of a
    /// run from an input, a constant, a view or another output).
    pub written_by: &'static str,
}

#[derive(Clone, Debug)]
pub struct TargetReport {
    pub triple: String,
    pub cpu: String,
    /// The LLVM feature string given explicitly (empty: the CPU's defaults).
    pub llvm_features: String,
    /// The widest vector instruction set the kernels use: `portable`, `avx2`, `avx512`.
    pub isa: &'static str,
    /// CPU features the artifact checks for at start-up.
    pub required_cpu_features: Vec<&'static str>,
    pub avx512_bf16: bool,
    /// A portable artifact's CPU variants, baseline first (the fields above describe the
    /// last); empty for a single target.
    pub variants: Vec<String>,
}

/// The planner's decisions.
#[derive(Clone, Debug)]
pub struct PlanReport {
    pub kernels: Vec<KernelReport>,
    /// Every node of the planned graph, in graph order.
    pub nodes: Vec<NodeReport>,
    pub buffers: Vec<BufferReport>,
    pub outputs: Vec<OutputReport>,
    pub target: TargetReport,
}

pub fn target_report(t: &TargetDesc) -> TargetReport {
    TargetReport {
        triple: t.triple.clone(),
        cpu: t.cpu.clone(),
        llvm_features: t.features.clone(),
        isa: match t.isa {
            _ if t.is_gpu() => "ptx",
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        },
        required_cpu_features: t.required_cpu_features(),
        avx512_bf16: t.has_avx512_bf16,
        variants: vec![],
    }
}

fn value_info(graph: &Graph, plan: &Plan, nhwc: &HashSet<ValueId>, v: ValueId) -> ValueInfo {
    let mut info = ValueInfo::new(graph.value_name(v), graph.value_type(v));
    if nhwc.contains(&v) {
        info.layout = "channels-last";
    }
    if plan.bf16_values.contains(&v) {
        info.stored_as = Some("bf16".to_string());
    }
    info
}

/// Values stored NHWC: outputs of channels-last Conv/Pool and of NCHW→NHWC transposes, and what elementwise ops and
/// Concat compute from them (the channels-last pass carries the layout through those). The IR
/// type says row-major for all of them — an NHWC value simply has the NHWC shape — so the
/// report recovers the layout from the ops.
fn channels_last_values(graph: &Graph) -> HashSet<ValueId> {
    let mut nhwc = HashSet::new();
    for id in graph.node_ids() {
        let node = graph.node(id);
        let from_op = match &node.op {
            Op::Conv(a) | Op::Quant(QuantOp::ConvInteger(a)) => a.channels_last,
            Op::Pool(a) => a.channels_last,
            Op::Quant(QuantOp::QuantizeLinear { .. } | QuantOp::DequantizeLinear { .. }) => node
                .inputs
                .first()
                .copied()
                .flatten()
                .is_some_and(|v| nhwc.contains(&v)),
            Op::Transpose { perm } => perm == &[0, 2, 3, 1],
            Op::Unary(_) | Op::Binary(_) | Op::Clip | Op::Where | Op::Cast { .. } | Op::Concat { .. } => {
                node.inputs.iter().flatten().any(|v| nhwc.contains(v))
            }
            _ => false,
        };
        if from_op
            || node
                .outputs
                .first()
                .is_some_and(|o| o.ty.layout == Layout::ChannelsLast)
        {
            nhwc.insert(id.out(0));
        }
    }
    nhwc
}

pub fn build(graph: &Graph, plan: &Plan, target: &TargetDesc) -> PlanReport {
    let nhwc = channels_last_values(graph);
    let mut kernel_of: HashMap<NodeId, (usize, bool)> = HashMap::new();
    let kernels = plan
        .kernels
        .iter()
        .enumerate()
        .map(|(k, kern)| {
            kernel_of.insert(kern.node, (k, false));
            for &n in &kern.fused {
                kernel_of.insert(n, (k, true));
            }
            let mut nodes = vec![(kern.node_name.clone(), kern.op_name)];
            nodes.extend(kern.fused.iter().map(|&n| {
                let node = graph.node(n);
                (node.name.clone(), node.op.name())
            }));
            // A fused kernel's residual (`extra`) is already one of its inputs.
            let inputs: Vec<ValueInfo> = kern
                .inputs
                .iter()
                .flatten()
                .map(|&v| value_info(graph, plan, &nhwc, v))
                .collect();
            KernelReport {
                implementation: match &kern.imp {
                    // On a GPU a library kernel runs on one block: say how wide.
                    KernelImpl::Ukernel(c) if target.is_gpu() => {
                        match crate::nvptx::library_threads(c.symbol) {
                            1 => format!("{} on one GPU thread", kern.describe()),
                            n => format!("{} on a block of {n} threads", kern.describe()),
                        }
                    }
                    _ => kern.describe(),
                },
                generated: matches!(kern.imp, KernelImpl::Generated(_) | KernelImpl::Gpu(_)),
                nodes,
                inputs,
                outputs: kern
                    .outputs
                    .iter()
                    .map(|&v| value_info(graph, plan, &nhwc, v))
                    .collect(),
                scratch_offset: kern.scratch,
            }
        })
        .collect();

    let live = plan::live_nodes(graph);
    let nodes = graph
        .node_ids()
        .map(|id| {
            let node = graph.node(id);
            let n_out = node.outputs.len() as u32;
            let fate = if let Some(&(kernel, fused)) = kernel_of.get(&id) {
                NodeFate::Kernel { kernel, fused }
            } else if matches!(node.op, Op::Input) {
                NodeFate::Input
            } else if !live[id.index()] {
                NodeFate::Dead
            } else if (0..n_out).all(|o| graph.known_value(id.out(o)).is_some()) {
                NodeFate::Constant
            } else if let Some(src) = node
                .inputs
                .first()
                .copied()
                .flatten()
                .filter(|_| node.op.is_view())
            {
                NodeFate::View {
                    of: graph.value_name(src).to_string(),
                }
            } else {
                // The planner compiles every live node that is not known or a view; anything
                // else would have been an error. Constant sources end up here too.
                NodeFate::Constant
            };
            NodeReport {
                name: node.name.clone(),
                op: node.op.name(),
                fate,
                output: (n_out > 0).then(|| value_info(graph, plan, &nhwc, id.out(0))),
            }
        })
        .collect();

    let buffers = plan
        .buffers
        .iter()
        .map(|b| BufferReport {
            value: match b.owner {
                BufferOwner::Value(v) => Some(graph.value_name(v).to_string()),
                BufferOwner::Scratch(_) => None,
            },
            scratch_of: match b.owner {
                BufferOwner::Value(_) => None,
                BufferOwner::Scratch(k) => Some(k),
            },
            offset: b.offset,
            size: b.size,
            first: b.first,
            last: b.last,
        })
        .collect();

    let copied: Vec<usize> = plan.output_copies.iter().map(|c| c.output).collect();
    let outputs = graph
        .outputs()
        .iter()
        .enumerate()
        .map(|(j, o)| OutputReport {
            name: o.name.clone(),
            written_by: if !copied.contains(&j) && plan.storage.get(&o.value) == Some(&Storage::Output(j)) {
                "kernel"
            } else {
                "copy"
            },
        })
        .collect();

    PlanReport {
        kernels,
        nodes,
        buffers,
        outputs,
        target: target_report(target),
    }
}
