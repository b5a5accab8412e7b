//! The autocast's rounding casts, absorbed by the kernels that read them.
//!
//! `--precision bf16` writes a bf16 operand as `Cast<f32>(Cast<bf16>(x))`: two kernels that
//! read and write the whole activation. A bf16 pair kernel (`gen::gemm`, on CPUs with
//! avx512_bf16) converts its run-time operand to bf16 anyway, rounding to nearest even as the
//! `Cast<bf16>` does, so it can read `x` itself; so does the GPU product on bf16 tensor cores
//! (`nvptx::kernels::gemm`, sm_80 and later), which rounds its run-time operands as it stages
//! them in shared memory. Once no kernel reads a pair's result, its
//! casts are dropped and reported as part of the kernel that absorbed them.
//!
//! A pair whose result is a product's only use is rounded by that product's epilogue instead
//! (`fuse::Chain::round_bf16`): then the source is never stored and the consumers keep reading
//! the (rounded) result.
//!
//! The conversion (`vcvtneps2bf16`) treats f32 subnormals (below 1.2e-38) as zero where the
//! cast would keep a bf16 subnormal; the pair product (`vdpbf16ps`) does the same with bf16
//! subnormals, so the result is the one the unabsorbed casts give.

use crate::plan::kernel::{Kernel, KernelImpl};
use kiln_ir::{DType, Graph, NodeId, Op, ValueId};
use std::collections::{HashMap, HashSet};

/// A rounding pair's source: `x` and the two casts of `Cast<f32>(Cast<bf16>(x))`.
struct Rounding {
    source: ValueId,
    casts: [NodeId; 2],
}

/// Every `Cast<f32>(Cast<bf16>(x))` of an f32 `x`, by the pair's result.
fn rounding_pairs(graph: &Graph) -> HashMap<ValueId, Rounding> {
    let mut pairs = HashMap::new();
    for (id, node) in graph.node_ids().zip(graph.nodes()) {
        if !matches!(node.op, Op::Cast { to: DType::F32 }) {
            continue;
        }
        let Some(narrow) = node.inputs.first().copied().flatten() else {
            continue;
        };
        let inner = graph.node(narrow.node);
        if !matches!(inner.op, Op::Cast { to: DType::BF16 }) {
            continue;
        }
        let Some(source) = inner.inputs.first().copied().flatten() else {
            continue;
        };
        if graph.value_type(source).dtype == DType::F32 {
            pairs.insert(
                id.out(0),
                Rounding {
                    source,
                    casts: [narrow.node, id],
                },
            );
        }
    }
    pairs
}

/// The value whose bytes `v` shares through a chain of views.
fn view_root(graph: &Graph, mut v: ValueId) -> ValueId {
    loop {
        let node = graph.node(v.node);
        match node.inputs.first().copied().flatten() {
            Some(src) if node.op.is_view() => v = src,
            _ => return v,
        }
    }
}

/// Points kernels that round an input to bf16 at the rounding pair's source, then drops the
/// cast kernels whose results nothing reads any more.
pub(crate) fn absorb(graph: &Graph, kernels: &mut Vec<Kernel>) {
    let pairs = rounding_pairs(graph);
    if pairs.is_empty() {
        return;
    }
    // A source some kernel stores (or a graph input, or a view of one); a source inside a
    // fused kernel (a product whose epilogue already rounds, `fuse::Chain::round_bf16`) is
    // never stored, and its consumers read the rounded result as they are.
    let mut stored: HashSet<ValueId> = kernels.iter().flat_map(|k| k.outputs.iter().copied()).collect();
    stored.extend(graph.inputs().iter().map(|id| id.out(0)));
    // The first kernel that reads each pair's source instead of its result.
    let mut absorbed_by: HashMap<NodeId, usize> = HashMap::new();
    for (k, kernel) in kernels.iter_mut().enumerate() {
        let rounds: &dyn Fn(usize) -> bool = match &kernel.imp {
            KernelImpl::Generated(g) => &|i| g.rounds_input_to_bf16(i),
            KernelImpl::Gpu(g) => &|i| g.rounds_input_to_bf16(i),
            _ => continue,
        };
        for (i, input) in kernel.inputs.iter_mut().enumerate() {
            let Some(rounding) = input.and_then(|v| pairs.get(&v)) else {
                continue;
            };
            if rounds(i) && stored.contains(&view_root(graph, rounding.source)) {
                *input = Some(rounding.source);
                for cast in rounding.casts {
                    absorbed_by.entry(cast).or_insert(k);
                }
            }
        }
    }
    if absorbed_by.is_empty() {
        return;
    }
    // Kernels run in topological order: walking back, a cast kernel is dead when no later
    // kernel and no graph output reads (a view of) its result.
    let mut read: HashSet<ValueId> = graph
        .outputs()
        .iter()
        .map(|o| view_root(graph, o.value))
        .collect();
    // A cast kernel is one cast, or (on the GPU, where elementwise groups form first) the
    // pair in one group: every node it computes must be an absorbed cast.
    let only_casts = |kernel: &Kernel| {
        std::iter::once(&kernel.node)
            .chain(&kernel.fused)
            .all(|n| absorbed_by.contains_key(n))
    };
    let mut dropped = vec![false; kernels.len()];
    for (k, kernel) in kernels.iter().enumerate().rev() {
        let unread = kernel.outputs.iter().all(|v| !read.contains(v));
        if unread && only_casts(kernel) {
            dropped[k] = true;
            continue;
        }
        read.extend(kernel.inputs.iter().flatten().map(|&v| view_root(graph, v)));
    }
    let mut absorbed: Vec<(usize, NodeId)> = kernels
        .iter()
        .zip(&dropped)
        .filter(|(_, &d)| d)
        .flat_map(|(kernel, _)| kernel.fused.iter().chain(std::iter::once(&kernel.node)))
        .map(|&n| (absorbed_by[&n], n))
        .collect();
    absorbed.sort();
    for (k, cast) in absorbed {
        kernels[k].fused.push(cast);
    }
    let mut keep = dropped.iter().map(|d| !d);
    kernels.retain(|_| keep.next().unwrap_or(true));
}

/// Stores as bf16 every kernel output that only bf16 readers read: a value whose every
/// reader rounds it to bf16 as it reads it ([`GeneratedKernel::rounds_input_to_bf16`]) gives
/// them the same operands rounded once by its producer, in half the bytes — half the memory
/// traffic between, say, a depthwise convolution and the pointwise product after it, and a
/// product that reads its bf16 rows in place instead of packing them. Values that are graph
/// outputs or read through a view keep f32. Returns the values stored as bf16.
///
/// [`GeneratedKernel::rounds_input_to_bf16`]: crate::gen::GeneratedKernel::rounds_input_to_bf16
pub(crate) fn store_bf16(graph: &Graph, kernels: &mut [Kernel]) -> HashSet<ValueId> {
    let mut kept_f32: HashSet<ValueId> = graph
        .outputs()
        .iter()
        .map(|o| view_root(graph, o.value))
        .collect();
    // Every value's readers: (kernel, input).
    let mut readers: HashMap<ValueId, Vec<(usize, usize)>> = HashMap::new();
    for (k, kernel) in kernels.iter().enumerate() {
        for (i, v) in kernel.inputs.iter().enumerate() {
            let Some(v) = *v else { continue };
            let root = view_root(graph, v);
            if root != v {
                kept_f32.insert(root);
            }
            readers.entry(root).or_default().push((k, i));
        }
    }
    let bf16_reader = |k: usize, i: usize| match &kernels[k].imp {
        KernelImpl::Generated(g) => g.rounds_input_to_bf16(i) && g.can_read_bf16(i),
        _ => false,
    };
    let mut stored = HashSet::new();
    let mut producers = vec![];
    for (k, kernel) in kernels.iter().enumerate() {
        let (KernelImpl::Generated(g), [v]) = (&kernel.imp, kernel.outputs.as_slice()) else {
            continue;
        };
        let Some(reads) = readers.get(v) else { continue };
        if g.can_store_bf16()
            && graph.value_type(*v).dtype == DType::F32
            && !kept_f32.contains(v)
            && reads.iter().all(|&(r, i)| bf16_reader(r, i))
        {
            stored.insert(*v);
            producers.push(k);
        }
    }
    for k in producers {
        let v = kernels[k].outputs[0];
        if let KernelImpl::Generated(g) = &mut kernels[k].imp {
            g.store_bf16();
        }
        for &(r, i) in &readers[&v] {
            if let KernelImpl::Generated(g) = &mut kernels[r].imp {
                g.read_bf16(i);
            }
        }
    }
    stored
}
