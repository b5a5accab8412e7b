//! ONNX graph → kiln IR.
//!
//! The importer walks the nodes in dependency order, resolves every input name in its scope
//! (node outputs, initializers, graph inputs, and for subgraphs the enclosing scopes), and hands
//! each node to the importer of its operator family. Family importers read attributes through
//! [`NodeCtx`], rewrite older opset forms into the IR's single form, and add IR nodes; type
//! inference runs as each node is added, so a malformed model fails here, naming the node.

mod attention;
mod contrib;
mod contrib_quant;
mod contrib_rotary;
mod control;
mod conv;
mod elementwise;
mod linalg;
mod misc;
mod norm;
mod quant;
mod recurrent;
mod reduce;
mod resize;
mod shape;
mod signal;
mod vision;

use super::proto::{attribute_type, AttributeProto, GraphProto, NodeProto, OperatorSetIdProto};
use super::tensor::{tensor_from_proto, tensor_type_from_proto, ExternalData};
use crate::error::{FrontendError, Result, UnsupportedOp};
use kiln_ir::{Dim, Graph, Op, OpFamily, Tensor, TensorType, ValueId};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

/// The newest default-domain opset kiln imports (that of the pinned onnx package).
pub const MAX_OPSET: i64 = 28;
/// The oldest default-domain opset kiln imports.
pub const MIN_OPSET: i64 = 7;

/// Imports one node; returns a value for each of the node's declared outputs.
type ImportFn = fn(&mut NodeCtx) -> Result<Vec<ValueId>>;

/// How a node's operator is imported.
enum Importer {
    /// An ONNX operator of the operator table (`kiln_ir::onnx_operator`).
    Standard(kiln_ir::OnnxOperator),
    /// An onnxruntime contrib operator (`contrib.rs`).
    Contrib,
}

/// The importer of operator `op_type` of `domain`, or None when kiln does not import it.
fn importer(domain: &str, op_type: &str) -> Option<Importer> {
    if is_default_domain(domain) {
        if let Some(op) = kiln_ir::onnx_operator(op_type) {
            return Some(Importer::Standard(op));
        }
        return contrib::DEFAULT_DOMAIN_EXTENSIONS
            .contains(&op_type)
            .then_some(Importer::Contrib);
    }
    (domain == MICROSOFT_DOMAIN && is_microsoft_operator(op_type)).then_some(Importer::Contrib)
}

/// onnxruntime's contrib operator domain.
pub(crate) const MICROSOFT_DOMAIN: &str = "com.microsoft";

/// Whether kiln imports `com.microsoft` operator `op_type`: a composition (`contrib`), a
/// quantized operator (`contrib_quant`) or a decoder attention operator (`contrib_rotary`).
fn is_microsoft_operator(op_type: &str) -> bool {
    [
        contrib::OPERATORS,
        contrib_quant::OPERATORS,
        contrib_rotary::OPERATORS,
    ]
    .iter()
    .any(|list| list.contains(&op_type))
}

/// Imports an onnxruntime contrib operator with the module that holds it.
fn import_contrib(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let op = cx.op_type();
    if contrib_quant::OPERATORS.contains(&op) {
        contrib_quant::import(cx)
    } else if contrib_rotary::OPERATORS.contains(&op) {
        contrib_rotary::import(cx)
    } else {
        contrib::import(cx)
    }
}

/// The importer of each operator family (the operator table, `kiln_ir::onnx_operator`, says
/// which family an ONNX operator belongs to).
fn family_importer(family: OpFamily) -> ImportFn {
    match family {
        OpFamily::Elementwise => elementwise::import,
        OpFamily::Linalg => linalg::import,
        OpFamily::Conv => conv::import,
        OpFamily::Norm => norm::import,
        OpFamily::Resize => resize::import,
        OpFamily::Attention => attention::import,
        OpFamily::Reduce => reduce::import,
        // Constant nodes are imported with the data-movement operators.
        OpFamily::DataMovement | OpFamily::Source => shape::import,
        OpFamily::Recurrent => recurrent::import,
        OpFamily::Control => control::import,
        OpFamily::Quant => quant::import,
        OpFamily::Vision => vision::import,
        OpFamily::Signal => signal::import,
        OpFamily::Misc => misc::import,
    }
}

/// Options that change how a model is imported.
#[derive(Clone, Debug, Default)]
pub struct ImportOptions {
    /// `name → dims` from `--input-shape`; a symbolic dimension bound here is bound in every
    /// input that uses the same symbol.
    pub input_shapes: Vec<(String, Vec<usize>)>,
    /// Inputs given a batch range (`--input-shape x=1..8,...`): their axis 0 must be symbolic
    /// in the model, since the compiled code runs it for any batch in the range.
    pub batch_inputs: Vec<String>,
    /// Tensors from `--weights` files, bound by name to initializers or graph inputs.
    pub weights: Vec<(String, Tensor)>,
    /// The initializers of an earlier import of the same model, by name, in the file's order
    /// (the leading constants of that graph, see [`leading_constants`]): each one of the same
    /// name, dtype and shape is shared instead of decoded again. A second import of a large
    /// model (the batch-range probe) then costs no second copy of its weights.
    pub shared_initializers: Vec<(String, Arc<Tensor>)>,
}

/// A graph's named constants in node order up to its first other node: for a graph this
/// module imported, its initializers in the file's order (then the graph inputs bound to
/// weights), what [`ImportOptions::shared_initializers`] takes.
pub fn leading_constants(graph: &Graph) -> Vec<(String, Arc<Tensor>)> {
    graph
        .nodes()
        .iter()
        .map_while(|n| match n.op {
            kiln_ir::Op::Constant(c) => Some((n.name.clone(), graph.consts()[c.0 as usize].clone())),
            _ => None,
        })
        .collect()
}

/// Something the enclosing scope of a subgraph gives for a name.
enum Resolved {
    Value(ValueId, TensorType),
    Const(Arc<Tensor>),
}

/// Name resolution across nested graphs.
trait Resolve {
    fn resolve(&mut self, name: &str) -> Option<Resolved>;
}

/// Imports one ONNX graph (the main graph or a subgraph) into one IR graph.
pub(crate) struct GraphImporter<'p> {
    pub(crate) graph: Graph,
    scope: HashMap<String, ValueId>,
    opset: i64,
    ext: Option<&'p mut ExternalData>,
    parent: Option<&'p mut dyn Resolve>,
    /// Outer values this subgraph uses, in the order of its capture inputs.
    captures: Vec<ValueId>,
    node_counter: usize,
}

impl Resolve for GraphImporter<'_> {
    fn resolve(&mut self, name: &str) -> Option<Resolved> {
        if let Some(&v) = self.scope.get(name) {
            if let Some(t) = self.graph_known_arc(v) {
                return Some(Resolved::Const(t));
            }
            return Some(Resolved::Value(v, self.graph.value_type(v).clone()));
        }
        self.capture(name)
            .map(|v| Resolved::Value(v, self.graph.value_type(v).clone()))
    }
}

impl<'p> GraphImporter<'p> {
    fn graph_known_arc(&self, v: ValueId) -> Option<Arc<Tensor>> {
        match self.graph.node(v.node).op {
            Op::Constant(c) => Some(self.graph.consts()[c.0 as usize].clone()),
            _ => self.graph.output(v).known.clone(),
        }
    }

    /// Looks `name` up in the enclosing scopes; a constant is copied in (sharing its data), a
    /// computed value becomes a capture input of this graph.
    fn capture(&mut self, name: &str) -> Option<ValueId> {
        let parent = self.parent.as_mut()?;
        let v = match parent.resolve(name)? {
            Resolved::Const(t) => self.graph.add_const(name, t),
            Resolved::Value(outer, ty) => match self.captures.iter().position(|&c| c == outer) {
                // Already captured (seeded by the caller, or under another name): one input.
                Some(i) => {
                    let first = self.graph.inputs().len() - self.captures.len();
                    self.graph.inputs()[first + i].out(0)
                }
                None => {
                    let inner = self.graph.add_input(name, ty);
                    self.captures.push(outer);
                    inner
                }
            },
        };
        self.scope.insert(name.to_string(), v);
        Some(v)
    }

    fn lookup(&mut self, name: &str) -> Option<ValueId> {
        match self.scope.get(name) {
            Some(&v) => Some(v),
            None => self.capture(name),
        }
    }

    /// Imports `g`'s nodes and outputs; inputs and initializers must already be in scope.
    fn import_body(&mut self, g: &GraphProto) -> Result<()> {
        self.import_nodes(g)?;
        for out in &g.output {
            let v = self.graph_output_value(&out.name)?;
            self.graph.add_output(out.name.clone(), v);
        }
        Ok(())
    }

    fn graph_output_value(&mut self, name: &str) -> Result<ValueId> {
        self.lookup(name).ok_or_else(|| {
            FrontendError::Model(format!(
                "graph output '{name}' is not produced by any node, initializer or input"
            ))
        })
    }

    /// Imports `g`'s initializers and nodes (not its outputs) into this graph.
    fn import_nodes(&mut self, g: &GraphProto) -> Result<()> {
        for init in &g.initializer {
            if !self.scope.contains_key(&init.name) {
                let t = tensor_from_proto(init, self.ext.as_deref_mut())?;
                let v = self.graph.add_const(init.name.clone(), t);
                self.scope.insert(init.name.clone(), v);
            }
        }
        if let Some(s) = g.sparse_initializer.first() {
            let name = s.values.as_ref().map(|v| v.name.as_str()).unwrap_or("");
            return Err(FrontendError::Model(format!(
                "sparse initializer '{name}' is not supported"
            )));
        }
        let outer_names: HashSet<&str> = self.scope.keys().map(|s| s.as_str()).collect();
        let order = topo_order(g, &outer_names)?;
        for i in order {
            self.import_node(&g.node[i])?;
        }
        Ok(())
    }

    fn import_node(&mut self, node: &NodeProto) -> Result<()> {
        self.node_counter += 1;
        let name = if node.name.is_empty() {
            format!("{}_{}", node.op_type, self.node_counter)
        } else {
            node.name.clone()
        };
        let mut inputs = Vec::with_capacity(node.input.len());
        for input in &node.input {
            if input.is_empty() {
                inputs.push(None);
                continue;
            }
            let v = self.lookup(input).ok_or_else(|| FrontendError::Node {
                node: name.clone(),
                op_type: node.op_type.clone(),
                msg: format!("input '{input}' is not produced by any node, initializer or graph input"),
            })?;
            inputs.push(Some(v));
        }
        let import = match importer(&node.domain, &node.op_type).expect("support checked before import") {
            Importer::Standard(op) => {
                let opset = self.opset;
                if opset < op.since {
                    return Err(FrontendError::Node {
                        node: name,
                        op_type: node.op_type.clone(),
                        msg: format!(
                            "{} is defined from opset {}; the model imports opset {opset}",
                            op.name, op.since
                        ),
                    });
                }
                family_importer(op.family)
            }
            Importer::Contrib => import_contrib as ImportFn,
        };
        let mut cx = NodeCtx {
            imp: self,
            node,
            name: name.clone(),
            inputs,
            bad_attr: std::cell::Cell::new(None),
        };
        let result = import(&mut cx);
        if let Some(msg) = cx.bad_attr.take() {
            return Err(FrontendError::Node {
                node: name,
                op_type: node.op_type.clone(),
                msg,
            });
        }
        let outs = result.map_err(|e| wrap_node_error(e, &name, &node.op_type))?;
        if outs.len() != node.output.len() {
            return Err(FrontendError::Node {
                node: name,
                op_type: node.op_type.clone(),
                msg: format!(
                    "importer produced {} outputs for {} declared",
                    outs.len(),
                    node.output.len()
                ),
            });
        }
        for (out_name, v) in node.output.iter().zip(outs) {
            if !out_name.is_empty() {
                self.scope.insert(out_name.clone(), v);
            }
        }
        Ok(())
    }
}

/// Gives IR errors the ONNX node's name and type when they lack them.
fn wrap_node_error(e: FrontendError, node: &str, op_type: &str) -> FrontendError {
    match e {
        FrontendError::Ir(kiln_ir::IrError::Node { msg, .. }) => FrontendError::Node {
            node: node.to_string(),
            op_type: op_type.to_string(),
            msg,
        },
        FrontendError::Ir(other) => FrontendError::Node {
            node: node.to_string(),
            op_type: op_type.to_string(),
            msg: other.to_string(),
        },
        other => other,
    }
}

/// Names a graph reads from its enclosing scopes (inputs of its nodes and its subgraphs that
/// it does not define itself).
fn free_names(g: &GraphProto) -> HashSet<String> {
    let mut defined: HashSet<&str> = HashSet::new();
    defined.extend(g.input.iter().map(|v| v.name.as_str()));
    defined.extend(g.initializer.iter().map(|t| t.name.as_str()));
    for n in &g.node {
        defined.extend(n.output.iter().map(|s| s.as_str()));
    }
    let mut free = HashSet::new();
    for n in &g.node {
        for i in node_reads(n) {
            if !i.is_empty() && !defined.contains(i.as_str()) {
                free.insert(i);
            }
        }
    }
    for o in &g.output {
        if !defined.contains(o.name.as_str()) {
            free.insert(o.name.clone());
        }
    }
    free
}

/// Every name a node reads: its inputs and the free names of its subgraphs.
pub fn node_reads(n: &NodeProto) -> Vec<String> {
    let mut names: Vec<String> = n.input.clone();
    for a in &n.attribute {
        for g in a.g.iter().chain(a.graphs.iter()) {
            names.extend(free_names(g));
        }
    }
    names
}

/// Node indices in dependency order (stable: model order where it is already valid). A cycle
/// is an error naming a node on it.
fn topo_order(g: &GraphProto, available: &HashSet<&str>) -> Result<Vec<usize>> {
    let mut producer: HashMap<&str, usize> = HashMap::new();
    let own: HashSet<&str> = g
        .input
        .iter()
        .map(|v| v.name.as_str())
        .chain(g.initializer.iter().map(|t| t.name.as_str()))
        .collect();
    for (i, n) in g.node.iter().enumerate() {
        for o in &n.output {
            if own.contains(o.as_str()) {
                return Err(FrontendError::Model(format!(
                    "value '{o}' is defined more than once: node '{}' produces it, and it is also a graph input or initializer",
                    display_name(n, i)
                )));
            }
            if !o.is_empty() {
                if let Some(prev) = producer.insert(o.as_str(), i) {
                    let _ = prev;
                    return Err(FrontendError::Model(format!(
                        "value '{o}' is produced by more than one node (the second is '{}')",
                        display_name(n, i)
                    )));
                }
            }
        }
    }
    let n = g.node.len();
    let mut indegree = vec![0usize; n];
    let mut users: Vec<Vec<usize>> = vec![vec![]; n];
    for (i, node) in g.node.iter().enumerate() {
        let mut deps: HashSet<usize> = HashSet::new();
        for name in node_reads(node) {
            if name.is_empty() || available.contains(name.as_str()) {
                continue;
            }
            if let Some(&p) = producer.get(name.as_str()) {
                if deps.insert(p) {
                    users[p].push(i);
                    indegree[i] += 1;
                }
            }
        }
    }
    let mut ready: VecDeque<usize> = (0..n).filter(|&i| indegree[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(i) = ready.pop_front() {
        order.push(i);
        for &u in &users[i] {
            indegree[u] -= 1;
            if indegree[u] == 0 {
                ready.push_back(u);
            }
        }
    }
    if order.len() < n {
        let stuck = (0..n)
            .find(|&i| indegree[i] > 0)
            .expect("some node is on a cycle");
        return Err(FrontendError::Model(format!(
            "the graph has a cycle through node '{}'",
            display_name(&g.node[stuck], stuck)
        )));
    }
    Ok(order)
}

fn display_name(n: &NodeProto, i: usize) -> String {
    if n.name.is_empty() {
        format!("{} #{i}", n.op_type)
    } else {
        n.name.clone()
    }
}

/// Every node of `g` (and its subgraphs) kiln cannot import. `imports` are the model's opset
/// imports: each unsupported node is reported with its own domain's version.
fn collect_unsupported(g: &GraphProto, imports: &[OperatorSetIdProto], out: &mut Vec<UnsupportedOp>) {
    for (i, n) in g.node.iter().enumerate() {
        collect_unsupported_node(n, i, imports, out);
    }
}

fn is_default_domain(domain: &str) -> bool {
    domain.is_empty() || domain == "ai.onnx"
}

/// The version the model imports `domain` at; 0 when it does not import that domain.
pub(crate) fn domain_opset(imports: &[OperatorSetIdProto], domain: &str) -> i64 {
    imports
        .iter()
        .find(|o| o.domain == domain || (is_default_domain(domain) && is_default_domain(&o.domain)))
        .map_or(0, |o| o.version)
}

fn collect_unsupported_node(
    n: &NodeProto,
    i: usize,
    imports: &[OperatorSetIdProto],
    out: &mut Vec<UnsupportedOp>,
) {
    if importer(&n.domain, &n.op_type).is_none() {
        out.push(UnsupportedOp {
            node: display_name(n, i),
            op_type: n.op_type.clone(),
            domain: n.domain.clone(),
            opset: domain_opset(imports, &n.domain),
        });
    }
    for a in &n.attribute {
        for sub in a.g.iter().chain(a.graphs.iter()) {
            collect_unsupported(sub, imports, out);
        }
    }
}

/// Imports the main graph of a model.
pub(crate) fn import_graph(
    g: &GraphProto,
    imports: &[OperatorSetIdProto],
    opset: i64,
    ext: &mut ExternalData,
    opts: &ImportOptions,
) -> Result<Graph> {
    if g.output.is_empty() {
        // Nothing to compute: an exporter bug, and an artifact with no results.
        return Err(FrontendError::Model("the graph has no outputs".into()));
    }
    let mut unsupported = vec![];
    collect_unsupported(g, imports, &mut unsupported);
    if !unsupported.is_empty() {
        return Err(FrontendError::Unsupported(unsupported));
    }
    let mut imp = main_importer(g, opset, ext, opts)?;
    imp.import_body(g)?;
    Ok(imp.graph)
}

/// An importer for the main graph with its inputs (`--input-shape` applied) and initializers
/// (`--weights` applied) in scope.
fn main_importer<'p>(
    g: &GraphProto,
    opset: i64,
    ext: &'p mut ExternalData,
    opts: &ImportOptions,
) -> Result<GraphImporter<'p>> {
    let name = if g.name.is_empty() {
        "main".to_string()
    } else {
        g.name.clone()
    };
    let mut imp = GraphImporter {
        graph: Graph::new(name),
        scope: HashMap::new(),
        opset,
        ext: Some(ext),
        parent: None,
        captures: vec![],
        node_counter: 0,
    };
    let initializers: HashSet<&str> = g.initializer.iter().map(|t| t.name.as_str()).collect();
    let mut weights: HashMap<&str, &Tensor> = HashMap::new();
    for (name, t) in &opts.weights {
        weights.insert(name.as_str(), t);
    }
    crate::weights::check_weight_names(g, &weights)?;

    // Declared input types, with --input-shape bindings applied.
    let mut inputs: Vec<(String, TensorType)> = vec![];
    for vi in &g.input {
        if initializers.contains(vi.name.as_str()) {
            continue;
        }
        let ty = tensor_type_from_proto(&vi.name, vi.r#type.as_ref())?
            .ok_or_else(|| FrontendError::Model(format!("graph input '{}' has no type", vi.name)))?;
        inputs.push((vi.name.clone(), ty));
    }
    crate::shapes::bind_input_shapes(&mut inputs, &opts.input_shapes, &opts.batch_inputs)?;

    for (i, init) in g.initializer.iter().enumerate() {
        let shared = opts
            .shared_initializers
            .get(i)
            .filter(|(name, t)| {
                *name == init.name && tensor_from_proto_type(init).is_ok_and(|ty| ty == t.tensor_type())
            })
            .map(|(_, t)| t);
        let t: Arc<Tensor> = match (weights.get(init.name.as_str()), shared) {
            (Some(w), _) => {
                let declared = tensor_from_proto_type(init)?;
                crate::weights::check_weight(&init.name, &declared, w)?;
                Arc::new((*w).clone())
            }
            (None, Some(t)) => Arc::clone(t),
            (None, None) => Arc::new(tensor_from_proto(init, imp.ext.as_deref_mut())?),
        };
        let v = imp.graph.add_const(init.name.clone(), t);
        imp.scope.insert(init.name.clone(), v);
    }
    for (name, ty) in inputs {
        let v = match weights.get(name.as_str()) {
            Some(w) => {
                crate::weights::check_weight(&name, &ty, w)?;
                imp.graph.add_const(name.clone(), (*w).clone())
            }
            None => imp.graph.add_input(name.clone(), ty),
        };
        imp.scope.insert(name, v);
    }
    Ok(imp)
}

/// The type of every value of the main graph that kiln can type, by ONNX name: inputs (with
/// `--input-shape` applied), initializers and node outputs. Unlike [`import_graph`] this does
/// not stop at the first node it cannot import: that node's outputs, and those of nodes that
/// depend on them, are left out, so tools that cut models apart can still type the rest.
pub(crate) fn value_types(
    g: &GraphProto,
    imports: &[OperatorSetIdProto],
    opset: i64,
    ext: &mut ExternalData,
    opts: &ImportOptions,
) -> Result<HashMap<String, TensorType>> {
    let mut imp = main_importer(g, opset, ext, opts)?;
    let outer_names: HashSet<&str> = imp.scope.keys().map(|s| s.as_str()).collect();
    let order = topo_order(g, &outer_names)?;
    for i in order {
        let node = &g.node[i];
        let mut unsupported = vec![];
        collect_unsupported_node(node, i, imports, &mut unsupported);
        let reads_known = node_reads(node)
            .iter()
            .all(|n| n.is_empty() || imp.scope.contains_key(n));
        if unsupported.is_empty() && reads_known {
            // A node that fails to import only loses its own outputs' types.
            let _ = imp.import_node(node);
        }
    }
    Ok(imp
        .scope
        .iter()
        .map(|(name, &v)| (name.clone(), imp.graph.value_type(v).clone()))
        .collect())
}

/// The declared type of an initializer (without reading its data).
fn tensor_from_proto_type(t: &super::proto::TensorProto) -> Result<TensorType> {
    let err = |msg: String| FrontendError::Tensor {
        name: t.name.clone(),
        msg,
    };
    let dtype = match super::tensor::nibble_dtype(t.data_type) {
        Some(d) => d,
        None => super::tensor::dtype_from_onnx(t.data_type).map_err(err)?,
    };
    let shape = super::tensor::checked_dims(&t.dims).map_err(err)?;
    Ok(TensorType::fixed(dtype, &shape))
}

/// The import context of one ONNX node: its attributes and resolved inputs, and the graph to
/// add IR nodes to.
pub(crate) struct NodeCtx<'a, 'p> {
    imp: &'a mut GraphImporter<'p>,
    pub node: &'a NodeProto,
    /// The node's name (the model's, or generated); used for every IR node it creates.
    pub name: String,
    inputs: Vec<Option<ValueId>>,
    /// The first attribute read as a type other than the one it declares. The getters cannot
    /// fail (most attributes have defaults), so import_node turns this into the node's error.
    bad_attr: std::cell::Cell<Option<String>>,
}

#[allow(dead_code)]
impl<'a, 'p> NodeCtx<'a, 'p> {
    pub fn op_type(&self) -> &str {
        &self.node.op_type
    }

    /// The model's default-domain opset version.
    pub fn opset(&self) -> i64 {
        self.imp.opset
    }

    pub fn err(&self, msg: impl Into<String>) -> FrontendError {
        FrontendError::Node {
            node: self.name.clone(),
            op_type: self.node.op_type.clone(),
            msg: msg.into(),
        }
    }

    /// All inputs as given (absent optional inputs are `None`).
    pub fn inputs(&self) -> &[Option<ValueId>] {
        &self.inputs
    }

    pub fn num_inputs(&self) -> usize {
        self.inputs.len()
    }

    pub fn num_outputs(&self) -> usize {
        self.node.output.len()
    }

    /// Whether the model reads output `i` (declared with a non-empty name).
    pub fn output_is_named(&self, i: usize) -> bool {
        self.node.output.get(i).is_some_and(|n| !n.is_empty())
    }

    /// Required input `i`.
    pub fn input(&self, i: usize) -> Result<ValueId> {
        self.inputs
            .get(i)
            .copied()
            .flatten()
            .ok_or_else(|| self.err(format!("required input {i} is missing")))
    }

    /// Optional input `i`.
    pub fn opt_input(&self, i: usize) -> Option<ValueId> {
        self.inputs.get(i).copied().flatten()
    }

    pub fn ty(&self, v: ValueId) -> &TensorType {
        self.imp.graph.value_type(v)
    }

    /// The value of `v` when known at import time (initializers, constants, shape arithmetic).
    pub fn known(&self, v: ValueId) -> Option<&Tensor> {
        self.imp.graph.known_value(v)
    }

    pub fn graph(&self) -> &Graph {
        &self.imp.graph
    }

    fn attr(&self, name: &str) -> Option<&'a AttributeProto> {
        self.node.attribute.iter().find(|a| a.name == name)
    }

    /// The attribute, if it is present and declares type `want` (or no type, as files from
    /// before IR version 2 do). One of another type is recorded as the node's error and read as
    /// absent.
    fn typed(&self, name: &str, want: i32) -> Option<&'a AttributeProto> {
        use attribute_type as at;
        let a = self.attr(name)?;
        if a.r#type == want || a.r#type == at::UNDEFINED {
            return Some(a);
        }
        let type_name = |t: i32| match t {
            at::FLOAT => "a float".to_string(),
            at::INT => "an int".to_string(),
            at::STRING => "a string".to_string(),
            at::TENSOR => "a tensor".to_string(),
            at::GRAPH => "a graph".to_string(),
            at::FLOATS => "a list of floats".to_string(),
            at::INTS => "a list of ints".to_string(),
            at::STRINGS => "a list of strings".to_string(),
            at::TENSORS => "a list of tensors".to_string(),
            at::GRAPHS => "a list of graphs".to_string(),
            t => format!("of attribute type {t}"),
        };
        let first = self.bad_attr.take();
        self.bad_attr.set(first.or_else(|| {
            Some(format!(
                "attribute '{name}' is {}, expected {}",
                type_name(a.r#type),
                type_name(want)
            ))
        }));
        None
    }

    pub fn has_attr(&self, name: &str) -> bool {
        self.attr(name).is_some()
    }

    pub fn attr_i(&self, name: &str, default: i64) -> i64 {
        self.typed(name, attribute_type::INT)
            .map(|a| a.i)
            .unwrap_or(default)
    }

    pub fn attr_opt_i(&self, name: &str) -> Option<i64> {
        self.typed(name, attribute_type::INT).map(|a| a.i)
    }

    /// A 0/1 attribute as a bool (`default` when absent); any other value is an error naming
    /// the attribute.
    pub fn attr_flag(&self, name: &str, default: bool) -> Result<bool> {
        match self.attr_i(name, i64::from(default)) {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(self.err(format!("attribute '{name}' must be 0 or 1, got {v}"))),
        }
    }

    /// A required integer attribute that must be positive (`num_heads`, say).
    pub fn attr_positive(&self, name: &str) -> Result<usize> {
        let n = self.attr_i(name, 0);
        match usize::try_from(n) {
            Ok(v) if v > 0 => Ok(v),
            _ => Err(self.err(format!("{name} must be positive, got {n}"))),
        }
    }

    pub fn attr_f(&self, name: &str, default: f32) -> f32 {
        self.typed(name, attribute_type::FLOAT)
            .map(|a| a.f)
            .unwrap_or(default)
    }

    pub fn attr_opt_f(&self, name: &str) -> Option<f32> {
        self.typed(name, attribute_type::FLOAT).map(|a| a.f)
    }

    /// A string attribute (lossy UTF-8).
    pub fn attr_s(&self, name: &str, default: &str) -> String {
        self.typed(name, attribute_type::STRING)
            .map(|a| String::from_utf8_lossy(&a.s).into_owned())
            .unwrap_or_else(|| default.to_string())
    }

    pub fn attr_ints(&self, name: &str) -> Option<Vec<i64>> {
        self.typed(name, attribute_type::INTS).map(|a| a.ints.clone())
    }

    pub fn attr_floats(&self, name: &str) -> Option<Vec<f32>> {
        self.typed(name, attribute_type::FLOATS).map(|a| a.floats.clone())
    }

    pub fn attr_strings(&self, name: &str) -> Option<Vec<String>> {
        self.typed(name, attribute_type::STRINGS).map(|a| {
            a.strings
                .iter()
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        })
    }

    /// A tensor attribute (e.g. `Constant.value`, `ConstantOfShape.value`).
    pub fn attr_tensor(&mut self, name: &str) -> Result<Option<Tensor>> {
        match self
            .typed(name, attribute_type::TENSOR)
            .and_then(|a| a.t.as_ref())
        {
            Some(t) => Ok(Some(tensor_from_proto(t, self.imp.ext.as_deref_mut())?)),
            None => Ok(None),
        }
    }

    pub fn attr_graph(&self, name: &str) -> Option<&'a GraphProto> {
        self.typed(name, attribute_type::GRAPH).and_then(|a| a.g.as_ref())
    }

    /// Non-negative integer list attribute as `usize`s (error on negatives).
    pub fn attr_usizes(&self, name: &str) -> Result<Option<Vec<usize>>> {
        match self.attr_ints(name) {
            None => Ok(None),
            Some(v) => v
                .iter()
                .map(|&x| {
                    usize::try_from(x)
                        .map_err(|_| self.err(format!("attribute '{name}' has negative value {x}")))
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
        }
    }

    /// Adds the node's main IR node: its outputs get the ONNX output names (one per declared
    /// output).
    pub fn add(&mut self, op: Op, inputs: Vec<Option<ValueId>>) -> Result<Vec<ValueId>> {
        let names = self.node.output.clone();
        Ok(self.imp.graph.add_node(self.name.clone(), op, inputs, names)?)
    }

    /// Adds a one-output IR node named after the ONNX node's first output (the usual case).
    pub fn add1(&mut self, op: Op, inputs: Vec<Option<ValueId>>) -> Result<ValueId> {
        let name = self.node.output.first().cloned().unwrap_or_default();
        Ok(self.imp.graph.add(self.name.clone(), op, inputs, name)?)
    }

    /// Adds a helper IR node (part of a decomposition) with `n_out` generated output names.
    pub fn add_aux(&mut self, op: Op, inputs: Vec<Option<ValueId>>, n_out: usize) -> Result<Vec<ValueId>> {
        let base = self
            .node
            .output
            .first()
            .cloned()
            .unwrap_or_else(|| self.name.clone());
        let k = self.imp.graph.len();
        let names = (0..n_out).map(|i| format!("{base}/{k}.{i}")).collect();
        Ok(self.imp.graph.add_node(self.name.clone(), op, inputs, names)?)
    }

    /// Like [`NodeCtx::add_aux`] for one output.
    pub fn add_aux1(&mut self, op: Op, inputs: Vec<Option<ValueId>>) -> Result<ValueId> {
        Ok(self.add_aux(op, inputs, 1)?[0])
    }

    /// A constant tensor in the graph.
    pub fn constant(&mut self, t: Tensor) -> ValueId {
        let base = self
            .node
            .output
            .first()
            .cloned()
            .unwrap_or_else(|| self.name.clone());
        let k = self.imp.graph.len();
        self.imp.graph.add_const(format!("{base}/const{k}"), t)
    }

    /// A constant tensor with a given value name (an ONNX `Constant` node's output), so that
    /// messages and the printer show the model's name for it.
    pub fn named_constant(&mut self, name: impl Into<String>, t: Tensor) -> ValueId {
        self.imp.graph.add_const(name, t)
    }

    /// A 1-D i64 constant (axes, shapes, pads given as attributes in older opsets).
    pub fn const_i64s(&mut self, vals: &[i64]) -> ValueId {
        self.constant(Tensor::from_vec(vec![vals.len()], vals.to_vec()))
    }

    /// Imports a subgraph attribute (If branches, Loop body). `formal_inputs` are the types of
    /// the subgraph's declared inputs (used where the model leaves them untyped). Returns the
    /// IR graph, whose inputs are the formal inputs followed by one input per captured outer
    /// value, and those outer values (to pass as the node's trailing inputs).
    pub fn import_subgraph(
        &mut self,
        g: &GraphProto,
        formal_inputs: &[TensorType],
    ) -> Result<(Graph, Vec<ValueId>)> {
        self.import_subgraph_with_captures(g, formal_inputs, &[])
    }

    /// Like [`NodeCtx::import_subgraph`], with capture inputs for `captures` (values of this
    /// graph) created first, in order; further captures follow them. Lets two subgraphs of one
    /// node (the branches of an `If`) share one capture list.
    pub fn import_subgraph_with_captures(
        &mut self,
        g: &GraphProto,
        formal_inputs: &[TensorType],
        captures: &[ValueId],
    ) -> Result<(Graph, Vec<ValueId>)> {
        if g.input.len() != formal_inputs.len() {
            return Err(self.err(format!(
                "subgraph '{}' declares {} inputs, {} expected",
                g.name,
                g.input.len(),
                formal_inputs.len()
            )));
        }
        let opset = self.imp.opset;
        let seeded: Vec<(ValueId, String, TensorType)> = captures
            .iter()
            .map(|&v| {
                (
                    v,
                    self.imp.graph.value_name(v).to_string(),
                    self.imp.graph.value_type(v).clone(),
                )
            })
            .collect();
        let mut sub = GraphImporter {
            graph: Graph::new(if g.name.is_empty() {
                format!("{}_body", self.name)
            } else {
                g.name.clone()
            }),
            scope: HashMap::new(),
            opset,
            ext: None,
            parent: Some(&mut *self.imp as &mut dyn Resolve),
            captures: vec![],
            node_counter: 0,
        };
        for (vi, formal) in g.input.iter().zip(formal_inputs) {
            let declared = tensor_type_from_proto(&vi.name, vi.r#type.as_ref())?;
            // Prefer the declared type only when it is at least as precise as what the node knows.
            let ty = match declared {
                Some(d) if d.rank() == formal.rank() && d.dtype == formal.dtype && d.is_static() => d,
                _ => formal.clone(),
            };
            let v = sub.graph.add_input(vi.name.clone(), ty);
            sub.scope.insert(vi.name.clone(), v);
        }
        for (outer, name, ty) in seeded {
            sub.graph.add_input(name, ty);
            sub.captures.push(outer);
        }
        sub.import_body(g)?;
        let GraphImporter { graph, captures, .. } = sub;
        Ok((graph, captures))
    }

    /// Imports the nodes of `g`, a subgraph without inputs, straight into this node's graph
    /// and returns the values of its outputs: for an `If` whose condition is known at import
    /// time. Names defined inside `g` do not stay visible after it.
    pub fn inline_subgraph(&mut self, g: &GraphProto) -> Result<Vec<ValueId>> {
        if !g.input.is_empty() {
            return Err(self.err(format!("subgraph '{}' to inline has inputs", g.name)));
        }
        let saved = self.imp.scope.clone();
        let result = self.imp.import_nodes(g).and_then(|()| {
            g.output
                .iter()
                .map(|o| self.imp.graph_output_value(&o.name))
                .collect::<Result<Vec<_>>>()
        });
        self.imp.scope = saved;
        result
    }
}

/// Symbolic dims of `ty` replaced by `?` where unknown; helper for family importers.
#[allow(dead_code)]
pub(crate) fn is_unknown(d: &Dim) -> bool {
    matches!(d, Dim::Sym(s) if s == "?")
}
