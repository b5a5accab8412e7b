//! Scheduling and memory planning: which kernel runs each node, and where every value lives.
//!
//! Nodes run in the graph's (topological) order. Constants and values known at compile time go
//! into the weights blob; views (Reshape, Flatten, Squeeze, Unsqueeze, Identity) share their
//! input's storage; every other value gets an offset in one arena, assigned from lifetimes so
//! values that are never alive together share bytes. Nothing is allocated while the model runs.

use crate::error::{CodegenError, Result};
use crate::gen;
use crate::generators::Generated;
use crate::kernel::Storage;
use crate::node::NodeInfo;
use crate::target::TargetDesc;
use crate::uk;
use kiln_ir::{Graph, NodeId, Op, QuantOp, ValueId};
use std::collections::{HashMap, HashSet};

pub mod kernel;
pub mod passes;
pub mod weights;

use kernel::{Kernel, KernelImpl};
use passes::{PlanOptions, PlanPassStats, ABSORB_BF16_ROUNDING, FUSE_KERNELS, STORE_BF16};
use std::time::{Duration, Instant};
use weights::Weights;

pub const ALIGN: u64 = 64;

/// A copy into a graph output buffer at the end of a run (an output that is a graph input, a
/// constant, a view of another value, or listed twice).
pub struct OutputCopy {
    pub output: usize,
    pub from: Storage,
    pub bytes: u64,
}

pub struct Plan {
    pub kernels: Vec<Kernel>,
    pub storage: HashMap<ValueId, Storage>,
    pub output_copies: Vec<OutputCopy>,
    pub weights: Weights,
    pub arena_bytes: u64,
    pub thread_scratch_bytes: u64,
    /// Every arena buffer with its placement and lifetime, for reports.
    pub buffers: Vec<ArenaBuffer>,
    /// What each plan pass that ran did (`passes`).
    pub passes: Vec<PlanPassStats>,
    /// f32 values the kernels store as bf16 (`store-bf16`): half their graph type's bytes.
    pub bf16_values: HashSet<ValueId>,
}

/// What an arena buffer holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferOwner {
    /// A kernel output (views of it share the bytes).
    Value(ValueId),
    /// The shared scratch of kernel `k`.
    Scratch(usize),
}

/// One arena buffer: bytes [offset, offset + size), alive from kernel `first` to kernel `last`
/// (inclusive; `last == kernels.len()` means until the final copy into an output buffer).
#[derive(Clone, Debug)]
pub struct ArenaBuffer {
    pub owner: BufferOwner,
    pub offset: u64,
    pub size: u64,
    pub first: usize,
    pub last: usize,
}

impl Plan {
    pub fn storage_of(&self, v: ValueId) -> Result<Storage> {
        self.storage
            .get(&v)
            .copied()
            .ok_or_else(|| CodegenError::internal(format!("no storage planned for value {v:?}")))
    }

    /// The storage of every argument slot of kernel `k`, in the order every kernel reads
    /// them: inputs (None for an absent optional one), outputs, packed constants, scratch.
    /// The CPU run function passes them as the `args` array (`gen::KernelBuilder`), the GPU
    /// entries resolve them to frame addresses (`nvptx::device`).
    pub fn arg_slots(&self, k: &Kernel) -> Result<Vec<Option<Storage>>> {
        let mut slots = vec![];
        for v in &k.inputs {
            slots.push(match v {
                Some(v) => Some(self.storage_of(*v)?),
                None => None,
            });
        }
        for v in &k.outputs {
            slots.push(Some(self.storage_of(*v)?));
        }
        slots.extend(k.packed.iter().map(|off| Some(Storage::Weights(*off))));
        slots.push(k.scratch.map(Storage::Arena));
        Ok(slots)
    }
}

/// The value whose bytes `v` shares: itself, or for a view of a compile-time constant too big
/// to be propagated as a known value, the constant behind the chain of views.
fn known_root(graph: &Graph, mut v: ValueId) -> ValueId {
    while graph.known_value(v).is_none() {
        let node = graph.node(v.node);
        match node.inputs.first().copied().flatten() {
            Some(src) if node.op.is_view() => v = src,
            _ => break,
        }
    }
    v
}

fn align(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

/// How to fix a graph input's unknown dims, with the input's own dims: `--input-shape
/// input_ids=1,D1` (known dims as they are, a symbolic first axis as 1, others `Dk`), and the
/// batch-range form when the first axis is symbolic.
fn input_shape_hint(name: &str, ty: &kiln_ir::TensorType) -> String {
    let dims = |first: &str| -> String {
        ty.shape
            .iter()
            .enumerate()
            .map(|(k, d)| match (d.fixed(), k) {
                (Some(n), _) => n.to_string(),
                (None, 0) => first.to_string(),
                (None, k) => format!("D{k}"),
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    let fixed = format!("fix them with --input-shape {name}={}", dims("1"));
    match ty.shape.first().and_then(|d| d.fixed()) {
        None if !ty.shape.is_empty() => {
            format!(
                "{fixed}, or give the batch a range to serve several: --input-shape {name}={}",
                dims("1..8")
            )
        }
        _ => fixed,
    }
}

/// Which values the graph outputs depend on: nodes outside this set are dead.
pub(crate) fn live_nodes(graph: &Graph) -> Vec<bool> {
    let mut live = vec![false; graph.len()];
    for o in graph.outputs() {
        live[o.value.node.index()] = true;
    }
    for id in graph.node_ids().collect::<Vec<_>>().into_iter().rev() {
        if live[id.index()] {
            for v in graph.node(id).inputs.iter().flatten() {
                live[v.node.index()] = true;
            }
        }
    }
    live
}

fn value_bytes(graph: &Graph, v: ValueId) -> Result<u64> {
    let ty = graph.value_type(v);
    ty.size_bytes()
        .map(|b| b as u64)
        .ok_or_else(|| CodegenError::internal(format!("value '{}' has no static size", graph.value_name(v))))
}

/// [`build_with`] with the target's own needs and kernel grouping on or off.
pub fn build(graph: &Graph, target: &TargetDesc, fusion: bool) -> Result<Plan> {
    build_with(graph, target, &PlanOptions::for_target(target, fusion))
}

/// [`build_into`] with the weights kept in memory.
pub fn build_with(graph: &Graph, target: &TargetDesc, opts: &PlanOptions) -> Result<Plan> {
    build_into(graph, target, opts, Weights::in_memory())
}

/// Selects a kernel for every live node, runs the plan passes (`passes`) and plans memory,
/// storing constants and packed weights in `weights` as it goes. Reports every node that
/// cannot be compiled, not just the first. The graph has no control flow left: the
/// optimizer's `lower-control-flow` pass lowers it.
pub fn build_into(
    graph: &Graph,
    target: &TargetDesc,
    opts: &PlanOptions,
    mut weights: Weights,
) -> Result<Plan> {
    let fusion = !opts.is_disabled(FUSE_KERNELS);
    if let Some(node) = graph
        .nodes()
        .iter()
        .find(|n| matches!(n.op, Op::If { .. } | Op::Loop { .. }))
    {
        return Err(CodegenError::unsupported(
            &node.name,
            node.op.name(),
            "control flow reaches codegen unlowered: the lower-control-flow pass lowers If and Loop (is it disabled with --disable-pass?)",
        ));
    }
    let live = live_nodes(graph);
    let mut storage: HashMap<ValueId, Storage> = HashMap::new();
    let mut kernels = Vec::new();
    let mut unsupported = Vec::new();

    for (i, &id) in graph.inputs().iter().enumerate() {
        let out = &graph.node(id).outputs[0];
        if !out.ty.is_static() {
            return Err(CodegenError::unsupported(
                &out.name,
                "graph input",
                format!(
                    "input '{}' has shape {} with dimensions unknown at compile time; {}",
                    out.name,
                    out.ty,
                    input_shape_hint(&out.name, &out.ty)
                ),
            ));
        }
        storage.insert(id.out(0), Storage::Input(i));
    }
    let grouping_start = Instant::now();
    let mut chains = if fusion {
        crate::fuse::find_chains(graph, !target.is_gpu())
    } else {
        Vec::new()
    };
    // A scaled input's Mul and a skip connection's DequantizeLinear may come before their
    // anchor, so whether the anchor's kernel takes them is settled before the schedule
    // reaches them: without it they keep kernels of their own.
    let mut prebuilt: HashMap<usize, Kernel> = HashMap::new();
    for (c, chain) in chains.iter_mut().enumerate() {
        if (chain.input_scale.is_some() || chain.skip.is_some()) && live[chain.anchor.index()] {
            match fused_kernel(graph, chain.anchor, chain, target, &mut weights) {
                Some(k) => {
                    prebuilt.insert(c, k);
                }
                None => {
                    chain.input_scale = None;
                    chain.without_skip();
                }
            }
        }
    }
    let mut chain_of_anchor: HashMap<NodeId, usize> = HashMap::new();
    let mut chain_of_absorbed: HashMap<NodeId, usize> = HashMap::new();
    for (c, chain) in chains.iter().enumerate() {
        chain_of_anchor.insert(chain.anchor, c);
        for n in chain.fused_nodes() {
            chain_of_absorbed.insert(n, c);
        }
    }
    // Elementwise groups around the epilogue chains, lowered up front: a group's members
    // before its last node are skipped as the schedule reaches them.
    let mut ew_kernels: HashMap<NodeId, Kernel> = HashMap::new();
    let mut ew_member: std::collections::HashSet<NodeId> = std::collections::HashSet::new();
    if fusion {
        let mut claimed: std::collections::HashSet<NodeId> = std::collections::HashSet::new();
        for chain in &chains {
            claimed.insert(chain.anchor);
            claimed.extend(chain.fused_nodes());
        }
        for group in crate::fuse::find_elementwise_groups_on(graph, &claimed, target.is_gpu()) {
            let &root = group.last().expect("groups are not empty");
            if !live[root.index()] {
                continue;
            }
            let lowered = if target.is_gpu() {
                crate::nvptx::kernels::elementwise::lower_group(graph, &group, target)
                    .map(|(g, ext)| (KernelImpl::Gpu(g), ext))
            } else {
                gen::elementwise::lower_group(graph, &group, target)
                    .map(|(g, ext)| (KernelImpl::Generated(g), ext))
            };
            let Some((imp, ext)) = lowered else {
                continue;
            };
            let node = graph.node(root);
            ew_member.extend(group.iter().copied());
            ew_kernels.insert(
                root,
                Kernel {
                    node: root,
                    node_name: node.name.clone(),
                    op_name: node.op.name(),
                    imp,
                    inputs: ext.into_iter().map(Some).collect(),
                    outputs: vec![root.out(0)],
                    packed: vec![],
                    scratch: None,
                    extra: None,
                    fused: group[..group.len() - 1].to_vec(),
                },
            );
        }
    }
    let grouping_time = grouping_start.elapsed();
    let groups = (chains.len(), ew_kernels.len());
    // Fused kernels wait here until the last node of their chain is reached.
    let mut pending: HashMap<usize, Kernel> = HashMap::new();
    for id in graph.node_ids() {
        if !live[id.index()] {
            continue;
        }
        let node = graph.node(id);
        if matches!(node.op, Op::Input) {
            continue;
        }
        if ew_member.contains(&id) {
            if let Some(k) = ew_kernels.remove(&id) {
                kernels.push(k);
            }
            continue;
        }
        if let Some(&c) = chain_of_absorbed.get(&id) {
            if chains[c].absorbed.last() == Some(&id) {
                if let Some(k) = pending.remove(&c) {
                    kernels.push(k);
                }
            }
            continue;
        }
        if let Some(&c) = chain_of_anchor.get(&id) {
            let chain = &chains[c];
            let mut fused = match prebuilt.remove(&c) {
                Some(k) => Some(k),
                None => fused_kernel(graph, id, chain, target, &mut weights),
            };
            if let (None, Some(pool)) = (&fused, chain.pool) {
                // The pooling stays a kernel of its own; the epilogue may still fuse.
                chain_of_absorbed.remove(&pool);
                let plain = crate::fuse::Chain {
                    pool: None,
                    absorbed: chain.absorbed.clone(),
                    col_bias: chain.col_bias.clone(),
                    dequantize: chain.dequantize.clone(),
                    quantize: chain.quantize,
                    skip: chain.skip,
                    ..*chain
                };
                if !plain.absorbed.is_empty() {
                    fused = fused_kernel(graph, id, &plain, target, &mut weights);
                }
            }
            match fused {
                // Run at the chain's last node (every input ready), or now if it has none.
                Some(k) if chain.absorbed.is_empty() => {
                    kernels.push(k);
                    continue;
                }
                Some(k) => {
                    pending.insert(c, k);
                    continue;
                }
                None => {
                    // Not fusable after all: the chain's nodes get kernels of their own.
                    for n in chain.absorbed.iter().chain(&chain.pool) {
                        chain_of_absorbed.remove(n);
                    }
                }
            }
        }
        let n_out = node.outputs.len() as u32;
        let all_known = (0..n_out).all(|o| graph.known_value(id.out(o)).is_some());
        if all_known {
            // Stored in the weights blob only if a kernel or a graph output reads it (below).
            continue;
        }
        let info = NodeInfo::new(graph, id);
        if let Some(e) = (0..n_out as usize).find_map(|o| info.output_shape(o).err()) {
            unsupported.push(e);
            continue;
        }
        // A view shares its input's bytes; plan_arena gives it the input's storage.
        if node.op.is_view() && node.inputs.first().copied().flatten().is_some() {
            continue;
        }
        let mut imp = match select(&info, target) {
            Ok(imp) => imp,
            Err(e) => {
                unsupported.push(e);
                continue;
            }
        };
        let mut inputs = node.inputs.clone();
        let mut packed = vec![];
        if let Some(g) = imp.generated_mut() {
            for (i, inp) in inputs.iter_mut().enumerate() {
                if !g.reads_input(i) {
                    *inp = None;
                }
            }
            for p in g.packed_constants() {
                packed.push(weights.push(&p.bytes));
            }
            g.release_packed_constants();
        }
        kernels.push(Kernel {
            node: id,
            node_name: node.name.clone(),
            op_name: node.op.name(),
            imp,
            inputs,
            outputs: (0..n_out).map(|o| id.out(o)).collect(),
            packed,
            scratch: None,
            extra: None,
            fused: vec![],
        });
    }
    match unsupported.len() {
        0 => {}
        1 => return Err(unsupported.remove(0)),
        _ => return Err(CodegenError::UnsupportedNodes(unsupported)),
    }
    let mut pass_stats = vec![];
    // `fuse-kernels` decided the groups the schedule above emitted: its result is this list.
    let fused_nodes: usize = kernels.iter().map(|k| k.fused.len()).sum();
    let grouped = kernels.iter().filter(|k| !k.fused.is_empty()).count();
    after_plan_pass(
        opts,
        graph,
        &kernels,
        &mut pass_stats,
        PlanPassStats {
            pass: FUSE_KERNELS,
            kernels_before: kernels.len() + fused_nodes,
            kernels_after: kernels.len(),
            rewrites: grouped,
            summary: format!(
                "{} epilogue chains, {} elementwise groups: {fused_nodes} nodes fused into {grouped} kernels",
                groups.0, groups.1
            ),
            time: grouping_time,
        },
    )?;
    // Only targets whose products round their operands have pairs to absorb.
    if opts.needs.products_round_operands {
        let start = Instant::now();
        let before = kernels.len();
        if !opts.is_disabled(ABSORB_BF16_ROUNDING) {
            crate::bf16_rounding::absorb(graph, &mut kernels);
        }
        let absorbed = before - kernels.len();
        after_plan_pass(
            opts,
            graph,
            &kernels,
            &mut pass_stats,
            PlanPassStats {
                pass: ABSORB_BF16_ROUNDING,
                kernels_before: before,
                kernels_after: kernels.len(),
                rewrites: absorbed,
                summary: if absorbed == 0 {
                    "unchanged".to_string()
                } else {
                    format!("absorbed {absorbed} cast kernels")
                },
                time: start.elapsed(),
            },
        )?;
    }

    // Values that only bf16 readers read are stored as bf16.
    let mut bf16_values = HashSet::new();
    if opts.needs.products_round_operands {
        let start = Instant::now();
        if !opts.is_disabled(STORE_BF16) {
            bf16_values = crate::bf16_rounding::store_bf16(graph, &mut kernels);
        }
        let n = kernels.len();
        after_plan_pass(
            opts,
            graph,
            &kernels,
            &mut pass_stats,
            PlanPassStats {
                pass: STORE_BF16,
                kernels_before: n,
                kernels_after: n,
                rewrites: bf16_values.len(),
                summary: if bf16_values.is_empty() {
                    "unchanged".to_string()
                } else {
                    format!("{} values stored as bf16", bf16_values.len())
                },
                time: start.elapsed(),
            },
        )?;
    }

    // Constants read by kernels (weights, and known inputs of kernels) go into the blob.
    for k in &kernels {
        for v in k.inputs.iter().flatten() {
            let v = known_root(graph, *v);
            if storage.contains_key(&v) {
                continue;
            }
            let Some(t) = graph.known_value(v) else { continue };
            storage.insert(v, Storage::Weights(weights.push(&t.to_le_bytes())));
        }
    }

    // Graph outputs produced directly by a kernel are written into the caller's buffer.
    let mut output_copies = vec![];
    let kernel_outputs: HashMap<ValueId, usize> = kernels
        .iter()
        .enumerate()
        .flat_map(|(k, kern)| kern.outputs.iter().map(move |v| (*v, k)))
        .collect();
    let mut copy_later = vec![];
    for (j, o) in graph.outputs().iter().enumerate() {
        if kernel_outputs.contains_key(&o.value) && !storage.contains_key(&o.value) {
            storage.insert(o.value, Storage::Output(j));
        } else {
            copy_later.push((j, o.value));
        }
    }

    let (arena_bytes, thread_scratch_bytes, buffers) = plan_arena(
        graph,
        &mut kernels,
        &mut storage,
        &kernel_outputs,
        &copy_later,
        &bf16_values,
    )?;
    for &(_, v) in &copy_later {
        let v = known_root(graph, v);
        if let (std::collections::hash_map::Entry::Vacant(e), Some(t)) =
            (storage.entry(v), graph.known_value(v))
        {
            e.insert(Storage::Weights(weights.push(&t.to_le_bytes())));
        }
    }
    for (j, v) in copy_later {
        let from = *storage
            .get(&v)
            .ok_or_else(|| CodegenError::internal(format!("graph output {j} has no storage")))?;
        output_copies.push(OutputCopy {
            output: j,
            from,
            bytes: value_bytes(graph, v)?,
        });
    }
    weights.check()?;
    Ok(Plan {
        kernels,
        storage,
        output_copies,
        weights,
        arena_bytes,
        thread_scratch_bytes,
        buffers,
        passes: pass_stats,
        bf16_values,
    })
}

/// After a plan pass: checks the kernel list, prints it where asked and records what the pass
/// did (a disabled pass is printed, not checked or recorded, as the graph passes are).
fn after_plan_pass(
    opts: &PlanOptions,
    graph: &Graph,
    kernels: &[Kernel],
    stats: &mut Vec<PlanPassStats>,
    mut st: PlanPassStats,
) -> Result<()> {
    let disabled = opts.is_disabled(st.pass);
    if disabled {
        st.summary = "disabled".to_string();
        st.rewrites = 0;
        st.kernels_before = kernels.len();
        st.time = Duration::ZERO;
    } else {
        let start = Instant::now();
        passes::verify(graph, kernels, st.pass)?;
        st.time += start.elapsed();
    }
    passes::print(opts, graph, kernels, &st);
    if !disabled {
        stats.push(st);
    }
    Ok(())
}

/// The generated kernel for `chain` (anchor plus epilogue), or None if the generator declines.
fn fused_kernel(
    graph: &Graph,
    anchor: NodeId,
    chain: &crate::fuse::Chain,
    target: &TargetDesc,
    weights: &mut Weights,
) -> Option<Kernel> {
    let node = graph.node(anchor);
    let mut info = NodeInfo::new(graph, anchor);
    if info.output_shape(0).is_err() {
        return None;
    }
    // After every input the operator may have, given or not (an integer product's absent
    // zero points keep their slots).
    let slot = match node.op {
        Op::Conv(_) => 3,
        Op::Quant(QuantOp::ConvInteger(_) | QuantOp::MatMulInteger) => 4,
        _ => node.inputs.len(),
    }
    .max(node.inputs.len());
    if let Some(r) = chain.residual {
        info = info.with_extra(slot, r);
    }
    let epilogue = chain.epilogue(graph, slot);
    let epilogue_scale_slot = epilogue.input_scale;
    let mut imp = if target.is_gpu() {
        KernelImpl::Gpu(
            crate::nvptx::kernels::gemm::lower_fused(&info, target, epilogue)
                .ok()
                .flatten()?,
        )
    } else {
        KernelImpl::Generated(
            gen::products::lower_fused(&info, target, epilogue)
                .ok()
                .flatten()?,
        )
    };
    // A scale behind the bf16 rounding pair is rounded by the kernel's bf16 packing alone.
    if chain.input_scale.is_some_and(|s| s.rounding.is_some())
        && !matches!(&imp, KernelImpl::Generated(g) if g.bf16_dot_products())
    {
        return None;
    }
    let g = imp.generated_mut()?;
    let reads: Vec<bool> = (0..info.n_inputs()).map(|i| g.reads_input(i)).collect();
    let packed = g
        .packed_constants()
        .iter()
        .map(|p| weights.push(&p.bytes))
        .collect();
    g.release_packed_constants();
    let mut inputs: Vec<Option<ValueId>> = (0..info.n_inputs()).map(|i| info.input(i)).collect();
    for (inp, read) in inputs.iter_mut().zip(reads) {
        if !read {
            *inp = None;
        }
    }
    if let (Some(s), Some(slot)) = (chain.input_scale, epilogue_scale_slot) {
        // The kernel reads the unscaled input and the scales; the Mul's output never exists.
        inputs[0] = Some(s.input);
        inputs.resize(slot + 1, None);
        inputs[slot] = Some(s.scale);
    }
    Some(Kernel {
        node: anchor,
        node_name: node.name.clone(),
        op_name: node.op.name(),
        imp,
        inputs,
        outputs: std::iter::once(chain.output)
            .chain(chain.pool.map(|p| p.out(0)))
            .collect(),
        packed,
        scratch: None,
        extra: info.extra,
        fused: chain.fused_nodes().collect(),
    })
}

fn select(info: &NodeInfo, target: &TargetDesc) -> Result<KernelImpl> {
    match crate::generators::lower(info, target)? {
        Some(Generated::Gpu(g)) => return Ok(KernelImpl::Gpu(g)),
        Some(Generated::Cpu(g)) => return Ok(KernelImpl::Generated(g)),
        None => {}
    }
    if let Some(c) = uk::lower(info)? {
        return Ok(KernelImpl::Ukernel(uk::for_cpu_target(c, info, target)));
    }
    Err(info.unsupported("the CPU backend does not compile this operator yet"))
}

/// Assigns arena offsets to kernel outputs (and views of them) and kernel scratch by lifetime.
/// Returns the arena size, the per-thread scratch size and the placed buffers.
fn plan_arena(
    graph: &Graph,
    kernels: &mut [Kernel],
    storage: &mut HashMap<ValueId, Storage>,
    kernel_outputs: &HashMap<ValueId, usize>,
    copy_later: &[(usize, ValueId)],
    bf16_values: &HashSet<ValueId>,
) -> Result<(u64, u64, Vec<ArenaBuffer>)> {
    // Views alias their source: resolve every value to the kernel output that owns its bytes.
    let mut root: HashMap<ValueId, ValueId> = HashMap::new();
    for id in graph.node_ids() {
        let node = graph.node(id);
        if node.op.is_view() && !kernel_outputs.contains_key(&id.out(0)) {
            if let Some(src) = node.inputs.first().copied().flatten() {
                let r = root.get(&src).copied().unwrap_or(src);
                root.insert(id.out(0), r);
            }
        }
    }
    let root_of = |v: ValueId| root.get(&v).copied().unwrap_or(v);

    // Lifetime of each arena buffer, in kernel steps: [first, last].
    struct Buf {
        size: u64,
        first: usize,
        last: usize,
        owner: BufferOwner,
    }
    use BufferOwner as Owner;
    let mut bufs: Vec<Buf> = vec![];
    let mut index: HashMap<ValueId, usize> = HashMap::new();
    let mut thread_scratch = 0u64;
    for (k, kern) in kernels.iter().enumerate() {
        for &v in &kern.outputs {
            if storage.contains_key(&v) {
                continue; // a graph output buffer
            }
            index.insert(v, bufs.len());
            let bytes = match value_bytes(graph, v)? {
                b if bf16_values.contains(&v) => b / 2,
                b => b,
            };
            bufs.push(Buf {
                size: align(bytes.max(1)),
                first: k,
                last: k,
                owner: Owner::Value(v),
            });
        }
        if let KernelImpl::Generated(g) = &kern.imp {
            let s = g.scratch();
            thread_scratch = thread_scratch.max(align(s.per_thread_bytes));
            if s.shared_bytes > 0 {
                bufs.push(Buf {
                    size: align(s.shared_bytes),
                    first: k,
                    last: k,
                    owner: Owner::Scratch(k),
                });
            }
        }
        if let KernelImpl::Gpu(g) = &kern.imp {
            if g.scratch_bytes() > 0 {
                bufs.push(Buf {
                    size: align(g.scratch_bytes()),
                    first: k,
                    last: k,
                    owner: Owner::Scratch(k),
                });
            }
        }
        if let KernelImpl::Ukernel(c) = &kern.imp {
            thread_scratch = thread_scratch.max(align(c.thread_scratch_bytes));
            if c.scratch_bytes > 0 {
                bufs.push(Buf {
                    size: align(c.scratch_bytes),
                    first: k,
                    last: k,
                    owner: Owner::Scratch(k),
                });
            }
        }
    }
    for (k, kern) in kernels.iter().enumerate() {
        for v in kern.inputs.iter().flatten() {
            if let Some(&b) = index.get(&root_of(*v)) {
                bufs[b].last = bufs[b].last.max(k);
            }
        }
    }
    for (_, v) in copy_later {
        if let Some(&b) = index.get(&root_of(*v)) {
            bufs[b].last = kernels.len();
        }
    }

    // Greedy by size (largest first): the lowest offset that overlaps no placed buffer whose
    // lifetime intersects. Ties keep schedule order, so the plan is deterministic.
    let mut order: Vec<usize> = (0..bufs.len()).collect();
    order.sort_by(|&a, &b| bufs[b].size.cmp(&bufs[a].size).then(a.cmp(&b)));
    let mut placed: Vec<(u64, u64, usize, usize)> = vec![]; // offset, size, first, last
    let mut offsets = vec![0u64; bufs.len()];
    let mut arena = 0u64;
    for &b in &order {
        let buf = &bufs[b];
        let mut conflicts: Vec<(u64, u64)> = placed
            .iter()
            .filter(|p| p.2 <= buf.last && buf.first <= p.3)
            .map(|p| (p.0, p.1))
            .collect();
        conflicts.sort();
        let mut off = 0u64;
        for (o, s) in conflicts {
            if off + buf.size <= o {
                break;
            }
            off = off.max(o + s);
        }
        offsets[b] = off;
        placed.push((off, buf.size, buf.first, buf.last));
        arena = arena.max(off + buf.size);
    }
    let mut placed_bufs = Vec::with_capacity(bufs.len());
    for (b, buf) in bufs.iter().enumerate() {
        match buf.owner {
            Owner::Value(v) => {
                storage.insert(v, Storage::Arena(offsets[b]));
            }
            Owner::Scratch(k) => kernels[k].scratch = Some(offsets[b]),
        }
        placed_bufs.push(ArenaBuffer {
            owner: buf.owner,
            offset: offsets[b],
            size: buf.size,
            first: buf.first,
            last: buf.last,
        });
    }
    // Views take their root's storage.
    for (v, r) in &root {
        if let Some(&s) = storage.get(r) {
            storage.entry(*v).or_insert(s);
        }
    }
    Ok((arena, thread_scratch, placed_bufs))
}
