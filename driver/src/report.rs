//! The report of a compilation (schema `kiln.report/1`, docs/report.md): where every node of
//! a model went. `kiln explain` prints it as a table or JSON, `kiln compile --report` writes it.
//!
//! The report joins three views of the model: the imported graph (the model's own nodes), the
//! optimized graph (after the passes) and the codegen plan (kernels and memory). Nodes are
//! matched by name; what a pass removed is classified from the imported graph (constant,
//! dead, identity, CSE, BatchNorm folding), and a node that no longer exists under its name is
//! "rewritten", pointing at the node that now produces its output when there is one. The JSON
//! schema is documented in docs/report.md.

use kiln_codegen::report::{NodeFate, ValueInfo};
use kiln_codegen::Summary;
use kiln_ir::{Graph, NodeId, Op};
use kiln_optimizer::PassStats;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

pub const SCHEMA: &str = "kiln.report/1";

#[derive(Serialize, Debug)]
pub struct Report {
    pub schema: &'static str,
    pub kiln_version: &'static str,
    pub model: ModelInfo,
    pub options: OptionsInfo,
    pub target: TargetInfo,
    pub summary: SummaryInfo,
    pub passes: Vec<PassInfo>,
    pub kernels: Vec<KernelInfo>,
    pub fusion_groups: Vec<FusionGroup>,
    pub nodes: Vec<NodeInfo>,
    pub memory: MemoryInfo,
    /// With a batch range: the range and the batched inputs and outputs; null otherwise.
    pub batch: Option<BatchInfo>,
}

/// A batch range (`--input-shape x=LO..HI,...`): the artifact is the per-sample program, run
/// once per sample.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct BatchInfo {
    pub min: usize,
    pub max: usize,
    /// The graph inputs and outputs whose axis 0 is the batch.
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
}

impl BatchInfo {
    /// `batch` with the names of `graph`'s batched inputs and outputs.
    pub fn new(graph: &Graph, batch: &kiln_codegen::batch::Batch) -> BatchInfo {
        BatchInfo {
            min: batch.lo,
            max: batch.hi,
            inputs: (graph.input_types().map(|(n, _)| n.to_string()))
                .zip(&batch.inputs)
                .filter_map(|(n, &batched)| batched.then_some(n))
                .collect(),
            outputs: (graph.outputs().iter().map(|o| o.name.clone()))
                .zip(&batch.outputs)
                .filter_map(|(n, &batched)| batched.then_some(n))
                .collect(),
        }
    }
}

#[derive(Serialize, Debug)]
pub struct ModelInfo {
    pub path: String,
    pub name: String,
    pub graph_name: String,
}

#[derive(Serialize, Debug)]
pub struct OptionsInfo {
    pub layout: String,
    pub precision: String,
    pub disabled_passes: Vec<String>,
    pub fusion: bool,
    /// `auto` (Winograd allowed) or `direct` (`--conv-algorithm`).
    pub conv_algorithm: String,
    /// `default` or `max-autotune` (`--mode`).
    pub mode: String,
}

#[derive(Serialize, Debug)]
pub struct TargetInfo {
    pub triple: String,
    pub cpu: String,
    pub llvm_features: String,
    pub isa: &'static str,
    pub cpu_features: Vec<&'static str>,
    pub avx512_bf16: bool,
    /// A portable artifact's CPU variants, baseline first (the fields above are the last's).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub variants: Vec<String>,
}

#[derive(Serialize, Debug)]
pub struct SummaryInfo {
    pub nodes_before_passes: usize,
    pub nodes_after_passes: usize,
    pub kernels: usize,
    pub generated_kernels: usize,
    pub library_kernels: usize,
    pub fusion_groups: usize,
    pub node_status: BTreeMap<&'static str, usize>,
}

#[derive(Serialize, Debug)]
pub struct PassInfo {
    pub name: &'static str,
    pub nodes_before: usize,
    pub nodes_after: usize,
    pub rewrites: usize,
    /// What the pass did, in words (e.g. "folded 12 nodes, removed 3 Identity").
    pub summary: String,
    pub time_ms: f64,
}

#[derive(Serialize, Debug)]
pub struct Value {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<serde_json::Value>,
    pub layout: &'static str,
    pub stored_as: Option<String>,
}

impl From<&ValueInfo> for Value {
    fn from(v: &ValueInfo) -> Value {
        Value {
            name: v.name.clone(),
            dtype: v.dtype.clone(),
            shape: v
                .shape
                .iter()
                .map(|d| match d.parse::<u64>() {
                    Ok(n) => serde_json::Value::from(n),
                    Err(_) => serde_json::Value::from(d.as_str()),
                })
                .collect(),
            layout: v.layout,
            stored_as: v.stored_as.clone(),
        }
    }
}

#[derive(Serialize, Debug)]
pub struct KernelNode {
    pub name: String,
    pub op: &'static str,
    /// Whether the node is one of the imported model's (false: created by a pass).
    pub original: bool,
}

#[derive(Serialize, Debug)]
pub struct KernelInfo {
    pub index: usize,
    pub kind: &'static str,
    pub implementation: String,
    pub nodes: Vec<KernelNode>,
    pub layout: Option<&'static str>,
    pub dtype: Option<String>,
    pub inputs: Vec<Value>,
    pub outputs: Vec<Value>,
    pub scratch_offset: Option<u64>,
}

#[derive(Serialize, Debug)]
pub struct FusionGroup {
    pub kernel: usize,
    pub nodes: Vec<String>,
}

#[derive(Serialize, Debug)]
pub struct NodeInfo {
    pub name: String,
    pub op: &'static str,
    pub status: &'static str,
    pub kernel: Option<usize>,
    pub kernels: Vec<usize>,
    pub into: Option<String>,
    pub view_of: Option<String>,
    pub layout: Option<&'static str>,
    pub dtype: Option<String>,
    pub shape: Option<Vec<serde_json::Value>>,
}

#[derive(Serialize, Debug)]
pub struct MemoryInfo {
    pub arena_bytes: u64,
    pub weights_bytes: u64,
    pub thread_scratch_bytes: u64,
    pub buffers: Vec<BufferInfo>,
    pub outputs: Vec<OutputInfo>,
}

#[derive(Serialize, Debug)]
pub struct BufferInfo {
    pub value: Option<String>,
    pub scratch_of_kernel: Option<usize>,
    pub offset: u64,
    pub size: u64,
    pub first_kernel: usize,
    pub last_kernel: usize,
}

#[derive(Serialize, Debug)]
pub struct OutputInfo {
    pub name: String,
    pub written_by: &'static str,
}

/// What the report is built from.
pub struct Inputs<'a> {
    pub model_path: &'a Path,
    pub name: &'a str,
    pub options: OptionsInfo,
    /// The imported graph, before any pass.
    pub original: &'a Graph,
    /// The graph the passes produced (codegen may lower its control flow further).
    pub optimized: &'a Graph,
    pub passes: &'a [PassStats],
    pub summary: &'a Summary,
    pub batch: Option<&'a BatchInfo>,
}

fn is_source(op: &Op) -> bool {
    matches!(op, Op::Input | Op::Constant(_))
}

fn operator_nodes(g: &Graph) -> usize {
    g.nodes().iter().filter(|n| !is_source(&n.op)).count()
}

/// Facts about the imported graph that explain why a pass removed a node.
struct OriginalFacts {
    /// Every input comes (transitively) from constants: freezing computes it.
    constant: Vec<bool>,
    /// Some graph output depends on it.
    live: Vec<bool>,
    /// The first node computing the same operator on the same inputs (itself if none).
    cse_rep: Vec<NodeId>,
}

fn original_facts(g: &Graph) -> OriginalFacts {
    let n = g.len();
    let mut constant = vec![false; n];
    for id in g.node_ids() {
        let node = g.node(id);
        constant[id.index()] = match node.op {
            Op::Input => false,
            Op::Constant(_) => true,
            _ => node.inputs.iter().flatten().all(|v| constant[v.node.index()]),
        };
    }
    let mut live = vec![false; n];
    for o in g.outputs() {
        live[o.value.node.index()] = true;
    }
    for id in g.node_ids().collect::<Vec<_>>().into_iter().rev() {
        if live[id.index()] {
            for v in g.node(id).inputs.iter().flatten() {
                live[v.node.index()] = true;
            }
        }
    }
    // Same operator (attributes included) on the same (canonical) inputs. Operators with
    // subgraphs are left out: their debug text is large and CSE does not merge them.
    let mut cse_rep: Vec<NodeId> = g.node_ids().collect();
    let mut seen: HashMap<String, NodeId> = HashMap::new();
    for id in g.node_ids() {
        let node = g.node(id);
        if is_source(&node.op) || matches!(node.op, Op::If { .. } | Op::Loop { .. }) {
            continue;
        }
        let inputs: Vec<Option<(usize, u32)>> = node
            .inputs
            .iter()
            .map(|v| v.map(|v| (cse_rep[v.node.index()].index(), v.output)))
            .collect();
        let key = format!("{:?}|{:?}|{}", node.op, inputs, node.outputs.len());
        match seen.get(&key) {
            Some(&rep) => cse_rep[id.index()] = rep,
            None => {
                seen.insert(key, id);
            }
        }
    }
    OriginalFacts {
        constant,
        live,
        cse_rep,
    }
}

fn shape_json(v: &ValueInfo) -> Vec<serde_json::Value> {
    Value::from(v).shape
}

pub fn build_report(inp: &Inputs) -> Report {
    let plan = &inp.summary.report;
    let original_names: std::collections::HashSet<&str> = inp
        .original
        .nodes()
        .iter()
        .filter(|n| !is_source(&n.op))
        .map(|n| n.name.as_str())
        .collect();

    let kernels: Vec<KernelInfo> = plan
        .kernels
        .iter()
        .enumerate()
        .map(|(i, k)| KernelInfo {
            index: i,
            kind: if k.generated { "generated" } else { "library" },
            implementation: k.implementation.clone(),
            nodes: k
                .nodes
                .iter()
                .map(|(name, op)| KernelNode {
                    name: name.clone(),
                    op,
                    original: original_names.contains(name.as_str()),
                })
                .collect(),
            layout: k.outputs.first().map(|v| v.layout),
            dtype: k.outputs.first().map(|v| v.dtype.clone()),
            inputs: k.inputs.iter().map(Value::from).collect(),
            outputs: k.outputs.iter().map(Value::from).collect(),
            scratch_offset: k.scratch_offset,
        })
        .collect();
    let fusion_groups: Vec<FusionGroup> = kernels
        .iter()
        .filter(|k| k.nodes.len() > 1)
        .map(|k| FusionGroup {
            kernel: k.index,
            nodes: k.nodes.iter().map(|n| n.name.clone()).collect(),
        })
        .collect();

    // The planned graph, by node name, by name prefix (`N/...`: nodes a lowering or a pass
    // derived from N) and by output name.
    let mut by_name: HashMap<&str, usize> = HashMap::new();
    let mut by_prefix: HashMap<&str, Vec<usize>> = HashMap::new();
    let mut by_output: HashMap<&str, usize> = HashMap::new();
    for (i, n) in plan.nodes.iter().enumerate() {
        if matches!(n.fate, NodeFate::Input) {
            continue;
        }
        by_name.entry(n.name.as_str()).or_insert(i);
        for (pos, _) in n.name.match_indices('/') {
            by_prefix.entry(&n.name[..pos]).or_default().push(i);
        }
        if let Some(o) = &n.output {
            by_output.entry(o.name.as_str()).or_insert(i);
        }
    }
    let kernel_of = |i: usize| match plan.nodes[i].fate {
        NodeFate::Kernel { kernel, .. } => Some(kernel),
        _ => None,
    };

    let facts = original_facts(inp.original);
    let g0 = inp.original;
    let nodes: Vec<NodeInfo> = g0
        .node_ids()
        .filter(|&id| !is_source(&g0.node(id).op))
        .map(|id| {
            let node = g0.node(id);
            let mut info = NodeInfo {
                name: node.name.clone(),
                op: node.op.name(),
                status: "rewritten",
                kernel: None,
                kernels: vec![],
                into: None,
                view_of: None,
                layout: None,
                dtype: None,
                shape: None,
            };
            let set_target = |info: &mut NodeInfo, i: usize| {
                let p = &plan.nodes[i];
                if let Some(o) = &p.output {
                    info.layout = Some(o.layout);
                    info.dtype = Some(o.dtype.clone());
                    info.shape = Some(shape_json(o));
                }
                if let Some(k) = kernel_of(i) {
                    info.kernel = Some(k);
                    info.kernels = vec![k];
                }
            };
            if let Some(&i) = by_name.get(node.name.as_str()) {
                set_target(&mut info, i);
                info.status = match &plan.nodes[i].fate {
                    NodeFate::Kernel { fused: false, .. } => "kernel",
                    NodeFate::Kernel { fused: true, .. } => "fused",
                    NodeFate::Constant | NodeFate::Input => "constant",
                    NodeFate::View { of } => {
                        info.view_of = Some(of.clone());
                        "view"
                    }
                    NodeFate::Dead => "dead",
                };
                return info;
            }
            if let Some(derived) = by_prefix.get(node.name.as_str()) {
                info.status = "lowered";
                let mut ks: Vec<usize> = derived.iter().filter_map(|&i| kernel_of(i)).collect();
                ks.sort_unstable();
                ks.dedup();
                info.kernel = ks.first().copied();
                info.kernels = ks;
                return info;
            }
            let producer = |k: usize| node.inputs.get(k).copied().flatten().map(|v| g0.node(v.node));
            let first_output = node.outputs.first().map(|o| o.name.as_str());
            if facts.constant[id.index()] {
                info.status = "constant";
            } else if !facts.live[id.index()] {
                info.status = "dead";
            } else if matches!(node.op, Op::Identity) {
                info.status = "identity";
                info.into = producer(0).map(|p| p.name.clone());
            } else if matches!(node.op, Op::BatchNorm { .. })
                && producer(0).is_some_and(|p| {
                    matches!(
                        p.op,
                        Op::Conv(_) | Op::ConvTranspose(_) | Op::Gemm { .. } | Op::MatMul
                    )
                })
            {
                info.status = "batchnorm";
                info.into = producer(0).map(|p| p.name.clone());
            } else if facts.cse_rep[id.index()] != id {
                info.status = "cse";
                info.into = Some(g0.node(facts.cse_rep[id.index()]).name.clone());
            }
            // Whatever now produces the node's output (or the node it went into) says where
            // its work landed.
            let target = first_output
                .and_then(|o| by_output.get(o))
                .or_else(|| info.into.as_deref().and_then(|n| by_name.get(n)))
                .copied();
            if let Some(i) = target {
                set_target(&mut info, i);
                if info.status == "rewritten" {
                    info.into = Some(plan.nodes[i].name.clone());
                }
            }
            info
        })
        .collect();

    let mut node_status: BTreeMap<&'static str, usize> = BTreeMap::new();
    for n in &nodes {
        *node_status.entry(n.status).or_default() += 1;
    }
    let s = inp.summary;
    Report {
        schema: SCHEMA,
        kiln_version: env!("CARGO_PKG_VERSION"),
        model: ModelInfo {
            path: inp.model_path.display().to_string(),
            name: inp.name.to_string(),
            graph_name: g0.name.clone(),
        },
        options: OptionsInfo {
            layout: inp.options.layout.clone(),
            precision: inp.options.precision.clone(),
            disabled_passes: inp.options.disabled_passes.clone(),
            fusion: inp.options.fusion,
            conv_algorithm: inp.options.conv_algorithm.clone(),
            mode: inp.options.mode.clone(),
        },
        target: TargetInfo {
            triple: plan.target.triple.clone(),
            cpu: plan.target.cpu.clone(),
            llvm_features: plan.target.llvm_features.clone(),
            isa: plan.target.isa,
            cpu_features: plan.target.required_cpu_features.clone(),
            avx512_bf16: plan.target.avx512_bf16,
            variants: plan.target.variants.clone(),
        },
        summary: SummaryInfo {
            nodes_before_passes: operator_nodes(g0),
            nodes_after_passes: operator_nodes(inp.optimized),
            kernels: s.kernels,
            generated_kernels: s.generated_kernels,
            library_kernels: s.kernels - s.generated_kernels,
            fusion_groups: fusion_groups.len(),
            node_status,
        },
        passes: inp
            .passes
            .iter()
            .map(|p| PassInfo {
                name: p.pass,
                nodes_before: p.nodes_before,
                nodes_after: p.nodes_after,
                rewrites: p.rewrites,
                summary: p.summary.clone(),
                time_ms: (p.time.as_secs_f64() * 1e6).round() / 1e3,
            })
            .collect(),
        kernels,
        fusion_groups,
        nodes,
        memory: MemoryInfo {
            arena_bytes: s.arena_bytes,
            weights_bytes: s.weights_bytes,
            thread_scratch_bytes: s.thread_scratch_bytes,
            buffers: plan
                .buffers
                .iter()
                .map(|b| BufferInfo {
                    value: b.value.clone(),
                    scratch_of_kernel: b.scratch_of,
                    offset: b.offset,
                    size: b.size,
                    first_kernel: b.first,
                    last_kernel: b.last,
                })
                .collect(),
            outputs: plan
                .outputs
                .iter()
                .map(|o| OutputInfo {
                    name: o.name.clone(),
                    written_by: o.written_by,
                })
                .collect(),
        },
        batch: inp.batch.cloned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_codegen::{CompileOptions, Emit, TargetDesc};
    use kiln_ir::{Binary, DType, Tensor, TensorType, Unary};

    fn find<'a>(r: &'a Report, name: &str) -> &'a NodeInfo {
        r.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("node {name} not in the report"))
    }

    /// The optimized graph is written by hand as a pass would leave it, so each way a node can
    /// disappear is checked without depending on a pass implementation.
    #[test]
    fn classifies_what_the_passes_did() {
        let ty = TensorType::fixed(DType::F32, &[1, 4]);
        let c = || Tensor::from_vec(vec![1, 4], vec![1f32, 2., 3., 4.]);
        let add = |g: &mut Graph, n: &str, a, b, o: &str| {
            g.add(n, Op::Binary(Binary::Add), vec![Some(a), Some(b)], o)
                .unwrap()
        };

        let mut g0 = Graph::new("g");
        let x = g0.add_input("x", ty.clone());
        let c1 = g0.add_const("c1", c());
        let c2 = g0.add_const("c2", c());
        let k = add(&mut g0, "fold", c1, c2, "k");
        let a = add(&mut g0, "add", x, k, "a");
        let id = g0.add("id", Op::Identity, vec![Some(a)], "id_out").unwrap();
        let r1 = g0
            .add("relu1", Op::Unary(Unary::Relu), vec![Some(id)], "r1")
            .unwrap();
        let r2 = g0
            .add("relu2", Op::Unary(Unary::Relu), vec![Some(id)], "r2")
            .unwrap();
        let s = add(&mut g0, "sum", r1, r2, "s");
        g0.add("dead", Op::Unary(Unary::Neg), vec![Some(x)], "dead_out")
            .unwrap();
        let m = g0
            .add("mul", Op::Binary(Binary::Mul), vec![Some(s), Some(x)], "y_val")
            .unwrap();
        g0.add_output("y", m);

        let mut g1 = Graph::new("g");
        let x = g1.add_input("x", ty);
        let k = g1.add_const("k", Tensor::from_vec(vec![1, 4], vec![2f32, 4., 6., 8.]));
        let a = add(&mut g1, "add", x, k, "a");
        let r1 = g1
            .add("relu1", Op::Unary(Unary::Relu), vec![Some(a)], "r1")
            .unwrap();
        let s = add(&mut g1, "fused_sum", r1, r1, "s2");
        let m = g1
            .add(
                "mul_renamed",
                Op::Binary(Binary::Mul),
                vec![Some(s), Some(x)],
                "y_val",
            )
            .unwrap();
        g1.add_output("y", m);

        let target = TargetDesc::host().unwrap();
        let opts = CompileOptions {
            name: "g".into(),
            plan: kiln_codegen::plan::passes::PlanOptions::for_target(&target, false),
            target,
            emit: Emit::Obj,
            cc: None,
            profile: false,
            weights_out: None,
            cuda_sm: None,
            batch: None,
            gpu_library_kernels: false,
            gpu_tf32: false,
        };
        let summary = kiln_codegen::plan_only(&g1, &opts).unwrap();
        let r = build_report(&Inputs {
            model_path: Path::new("g.onnx"),
            name: "g",
            options: OptionsInfo {
                layout: "nchw".into(),
                precision: "f32".into(),
                disabled_passes: vec![],
                fusion: false,
                conv_algorithm: "auto".into(),
                mode: "default".into(),
            },
            original: &g0,
            optimized: &g1,
            passes: &[],
            summary: &summary,
            batch: None,
        });
        assert_eq!(r.schema, SCHEMA);
        assert_eq!(r.summary.nodes_before_passes, 8);
        assert_eq!(r.summary.nodes_after_passes, 4);
        assert_eq!(r.summary.kernels, 4);
        assert_eq!(find(&r, "fold").status, "constant");
        assert_eq!(find(&r, "add").status, "kernel");
        assert_eq!(find(&r, "add").kernel, Some(0));
        assert_eq!(find(&r, "id").status, "identity");
        assert_eq!(find(&r, "id").into.as_deref(), Some("add"));
        assert_eq!(find(&r, "relu2").status, "cse");
        assert_eq!(find(&r, "relu2").into.as_deref(), Some("relu1"));
        assert_eq!(find(&r, "relu2").kernel, Some(1));
        assert_eq!(find(&r, "dead").status, "dead");
        assert_eq!(find(&r, "sum").status, "rewritten");
        assert_eq!(find(&r, "sum").into, None);
        let mul = find(&r, "mul");
        assert_eq!(mul.status, "rewritten");
        assert_eq!(mul.into.as_deref(), Some("mul_renamed"));
        assert_eq!(mul.kernel, Some(3));
        assert_eq!(mul.dtype.as_deref(), Some("f32"));
        // The pass-created node is in a kernel but is not one of the model's.
        assert!(!r.kernels[2].nodes[0].original);
        assert!(r.kernels[0].nodes[0].original);
        assert_eq!(r.summary.node_status.values().sum::<usize>(), 8);
    }
}
