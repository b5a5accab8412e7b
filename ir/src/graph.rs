//! The graph: an arena of nodes in topological order, a constant pool, inputs and outputs.

use crate::ops::{self, InferCtx};
use crate::{Dim, IrError, Op, OpError, Tensor, TensorType};
use std::fmt;
use std::sync::Arc;

/// Index of a node in its graph's arena.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct NodeId(pub u32);

/// Index of a tensor in the graph's constant pool.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct ConstId(pub u32);

/// One value: output `output` of node `node`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct ValueId {
    pub node: NodeId,
    pub output: u32,
}

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
    /// The node's first (often only) output.
    pub fn out(self, output: u32) -> ValueId {
        ValueId { node: self, output }
    }
}

/// An output of a node: its name (the ONNX value name), type, and — for small values that
/// type inference could compute from constants (shape arithmetic) — its value.
#[derive(Clone, PartialEq, Debug)]
pub struct NodeOutput {
    pub name: String,
    pub ty: TensorType,
    pub known: Option<Arc<Tensor>>,
}

#[derive(Clone, PartialEq, Debug)]
pub struct Node {
    /// The model's node name (or a generated one); used in every message about the node.
    pub name: String,
    pub op: Op,
    pub inputs: Vec<Option<ValueId>>,
    pub outputs: Vec<NodeOutput>,
}

#[derive(Clone, PartialEq, Debug)]
pub struct GraphOutput {
    pub name: String,
    pub value: ValueId,
}

/// A dataflow graph. Nodes are stored in topological order: a node may only use values of
/// nodes added before it, so the arena order is a valid schedule and cycles cannot exist.
#[derive(Clone, PartialEq, Debug, Default)]
pub struct Graph {
    pub name: String,
    nodes: Vec<Node>,
    consts: Vec<Arc<Tensor>>,
    inputs: Vec<NodeId>,
    outputs: Vec<GraphOutput>,
}

/// Largest value (in elements) that type inference evaluates eagerly to learn shapes.
/// Shape arithmetic is tiny; anything bigger is left to constant folding in the optimizer.
pub const KNOWN_VALUE_MAX_ELEMENTS: usize = 4096;

/// The largest value kiln accepts, in bytes (256 GiB): beyond any real model's activation or
/// weight, and far below where sizes overflow. Every node's outputs are checked against it as
/// their types are inferred, so an absurd size (a Conv with pads of 2^40) is an invalid model
/// at import, naming the node, instead of a 52 TB arena or an overflow in a later pass.
pub const MAX_VALUE_BYTES: u128 = 1 << 38;

/// Fails when the dims known of `ty` already make it larger than [`MAX_VALUE_BYTES`].
fn check_value_size(ty: &TensorType) -> Result<(), String> {
    let elements = ty
        .shape
        .iter()
        .filter_map(Dim::fixed)
        .fold(1u128, |n, d| n.saturating_mul(d as u128));
    let bytes = elements.saturating_mul(ty.dtype.size_bytes() as u128);
    if bytes > MAX_VALUE_BYTES {
        return Err(format!(
            "output type {ty} would be larger than {} GiB, the most kiln accepts for one value",
            MAX_VALUE_BYTES >> 30
        ));
    }
    Ok(())
}

impl Graph {
    pub fn new(name: impl Into<String>) -> Graph {
        Graph {
            name: name.into(),
            ..Graph::default()
        }
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> {
        (0..self.nodes.len() as u32).map(NodeId)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn inputs(&self) -> &[NodeId] {
        &self.inputs
    }

    pub fn outputs(&self) -> &[GraphOutput] {
        &self.outputs
    }

    pub fn consts(&self) -> &[Arc<Tensor>] {
        &self.consts
    }

    pub fn constant(&self, id: ConstId) -> &Tensor {
        &self.consts[id.0 as usize]
    }

    pub fn output(&self, v: ValueId) -> &NodeOutput {
        &self.nodes[v.node.index()].outputs[v.output as usize]
    }

    pub fn value_type(&self, v: ValueId) -> &TensorType {
        &self.output(v).ty
    }

    /// Gives `v`, whose type has dims unknown at compile time, static dims that bound its size:
    /// for codegen, which stores a data-dependent output (NonZero's, say) in a buffer of that
    /// size and reports its actual shape at run time. Fails when `ty` is not static, differs in
    /// dtype or rank, or contradicts a dim that is already fixed.
    pub fn bound_value_type(&mut self, v: ValueId, ty: TensorType) -> Result<(), String> {
        let old = self.value_type(v);
        let fits = ty.is_static()
            && ty.dtype == old.dtype
            && ty.rank() == old.rank()
            && old
                .shape
                .iter()
                .zip(&ty.shape)
                .all(|(a, b)| a.fixed().is_none() || a == b);
        if !fits {
            return Err(format!("{ty} cannot bound {old}"));
        }
        check_value_size(&ty)?;
        let out = &mut self.nodes[v.node.index()].outputs[v.output as usize];
        if out.known.is_none() {
            out.known = empty_value(&ty);
        }
        out.ty = ty;
        Ok(())
    }

    pub fn value_name(&self, v: ValueId) -> &str {
        &self.output(v).name
    }

    /// The value of `v` if it is known at compile time: a constant, or small shape arithmetic.
    pub fn known_value(&self, v: ValueId) -> Option<&Tensor> {
        let node = &self.nodes[v.node.index()];
        match &node.op {
            Op::Constant(c) => Some(self.constant(*c)),
            _ => node.outputs[v.output as usize].known.as_deref(),
        }
    }

    /// Name and type of each graph input, in order.
    pub fn input_types(&self) -> impl Iterator<Item = (&str, &TensorType)> {
        self.inputs.iter().map(|&id| {
            let out = &self.nodes[id.index()].outputs[0];
            (out.name.as_str(), &out.ty)
        })
    }

    pub fn add_input(&mut self, name: impl Into<String>, ty: TensorType) -> ValueId {
        let name = name.into();
        let id = self.push(Node {
            name: name.clone(),
            op: Op::Input,
            inputs: vec![],
            outputs: vec![NodeOutput {
                name,
                known: empty_value(&ty),
                ty,
            }],
        });
        self.inputs.push(id);
        id.out(0)
    }

    /// Adds `tensor` to the constant pool and a `Constant` node producing it.
    pub fn add_const(&mut self, name: impl Into<String>, tensor: impl Into<Arc<Tensor>>) -> ValueId {
        let tensor = tensor.into();
        let name = name.into();
        let ty = tensor.tensor_type();
        let cid = ConstId(self.consts.len() as u32);
        self.consts.push(tensor);
        self.push(Node {
            name: name.clone(),
            op: Op::Constant(cid),
            inputs: vec![],
            outputs: vec![NodeOutput {
                name,
                ty,
                known: None,
            }],
        })
        .out(0)
    }

    /// Replaces constant `v` by `tensor` of the same type, named `name`, in this graph only (a
    /// clone keeps its own): a pass that changes weights' values, such as bf16 rounding, then
    /// holds one weight's old and new data at a time instead of every weight's. False, and
    /// nothing changed, when `v` is not a constant or the types differ.
    pub fn replace_constant(&mut self, v: ValueId, name: impl Into<String>, tensor: Tensor) -> bool {
        let node = &mut self.nodes[v.node.index()];
        let Op::Constant(c) = node.op else {
            return false;
        };
        if tensor.tensor_type() != self.consts[c.0 as usize].tensor_type() {
            return false;
        }
        let name = name.into();
        node.name = name.clone();
        node.outputs[0].name = name;
        self.consts[c.0 as usize] = Arc::new(tensor);
        true
    }

    /// Adds a node, inferring its output types (and, for small constant inputs, its values).
    /// `output_names` sets the number of outputs. Fails, naming the node, when the inputs do
    /// not fit the operator.
    pub fn add_node(
        &mut self,
        name: impl Into<String>,
        op: Op,
        inputs: Vec<Option<ValueId>>,
        output_names: Vec<String>,
    ) -> Result<Vec<ValueId>, IrError> {
        let name = name.into();
        if let Op::Input | Op::Constant(_) = op {
            return Err(IrError::node(
                &name,
                op.name(),
                "use add_input/add_const for sources",
            ));
        }
        for v in inputs.iter().flatten() {
            if v.node.index() >= self.nodes.len()
                || v.output as usize >= self.nodes[v.node.index()].outputs.len()
            {
                return Err(IrError::node(
                    &name,
                    op.name(),
                    format!("input {v:?} does not exist"),
                ));
            }
        }
        let n_out = output_names.len();
        let (types, known) = self
            .infer_node(&op, &inputs, n_out)
            .map_err(|e| IrError::node(&name, op.name(), e))?;
        for ty in &types {
            check_value_size(ty).map_err(|e| IrError::node(&name, op.name(), e))?;
        }
        let outputs = output_names
            .into_iter()
            .zip(types)
            .zip(known)
            .map(|((name, ty), known)| NodeOutput { name, ty, known })
            .collect();
        let id = self.push(Node {
            name,
            op,
            inputs,
            outputs,
        });
        Ok((0..n_out as u32).map(|i| id.out(i)).collect())
    }

    /// Like [`Graph::add_node`] for a node with one output.
    pub fn add(
        &mut self,
        name: impl Into<String>,
        op: Op,
        inputs: Vec<Option<ValueId>>,
        output_name: impl Into<String>,
    ) -> Result<ValueId, IrError> {
        Ok(self.add_node(name, op, inputs, vec![output_name.into()])?[0])
    }

    pub fn add_output(&mut self, name: impl Into<String>, value: ValueId) {
        self.outputs.push(GraphOutput {
            name: name.into(),
            value,
        });
    }

    fn push(&mut self, node: Node) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        self.nodes.push(node);
        id
    }

    /// Infers output types for `op` applied to `inputs`, plus values where they are cheap to
    /// compute from known inputs.
    #[allow(clippy::type_complexity)]
    pub(crate) fn infer_node(
        &self,
        op: &Op,
        inputs: &[Option<ValueId>],
        n_out: usize,
    ) -> Result<(Vec<TensorType>, Vec<Option<Arc<Tensor>>>), OpError> {
        let in_types: Vec<Option<&TensorType>> =
            inputs.iter().map(|v| v.map(|v| self.value_type(v))).collect();
        let in_values: Vec<Option<&Tensor>> = inputs
            .iter()
            .map(|v| v.and_then(|v| self.known_value(v)))
            .collect();
        let cx = InferCtx {
            inputs: in_types,
            values: in_values.clone(),
            num_outputs: n_out,
        };
        let mut types = ops::infer(op, &cx)?;
        if types.len() != n_out {
            crate::bail!(
                "operator produces {} outputs but the node declares {}",
                types.len(),
                n_out
            );
        }
        let mut known = vec![None; n_out];
        if let Some(values) = self.propagate_values(op, inputs, &in_values, &types)? {
            for (i, v) in values.into_iter().enumerate().take(n_out) {
                // A computed value is exact: it can only make the inferred shape more precise.
                types[i].shape = v.shape().iter().map(|&d| d.into()).collect();
                known[i] = Some(Arc::new(v));
            }
        }
        Ok((types, known))
    }

    fn propagate_values(
        &self,
        op: &Op,
        inputs: &[Option<ValueId>],
        in_values: &[Option<&Tensor>],
        types: &[TensorType],
    ) -> Result<Option<Vec<Tensor>>, OpError> {
        // Small in every dim, not only in the product: an empty tensor may have huge other dims,
        // and evaluating an operator can cost per dim (Pad's and Resize's index maps).
        let small_dims = |dims: &[usize]| {
            dims.iter().all(|&d| d <= KNOWN_VALUE_MAX_ELEMENTS)
                && crate::tensor::checked_numel(dims).is_some_and(|n| n <= KNOWN_VALUE_MAX_ELEMENTS)
        };
        let small = |t: &TensorType| t.fixed_shape().is_some_and(|s| small_dims(&s));
        let shape_only = matches!(op, Op::Shape { .. } | Op::Size);
        if matches!(op, Op::If { .. } | Op::Loop { .. }) || !types.iter().all(small) {
            return Ok(None);
        }
        let computable = if shape_only {
            inputs[0].is_some_and(|v| self.value_type(v).is_static())
        } else {
            inputs.iter().zip(in_values).all(|(v, val)| match (v, val) {
                (None, _) => true,
                (Some(_), Some(t)) => small_dims(t.shape()),
                (Some(_), None) => false,
            })
        };
        if !computable {
            return Ok(None);
        }
        if shape_only {
            let shape = self
                .value_type(inputs[0].expect("checked above"))
                .fixed_shape()
                .expect("static");
            return Ok(Some(vec![shape_only_value(op, &shape)]));
        }
        let cx = ops::EvalCtx {
            inputs: in_values.to_vec(),
            out_types: types,
        };
        ops::eval(op, &cx).map(Some)
    }
}

/// The value of a tensor of type `ty` when the type alone decides it: a fixed shape with no
/// elements (an input such as an empty `axes` list has one possible value, known at compile
/// time).
fn empty_value(ty: &TensorType) -> Option<Arc<Tensor>> {
    let shape = ty.fixed_shape()?;
    (shape.iter().product::<usize>() == 0).then(|| Arc::new(Tensor::zeros(ty.dtype, shape)))
}

/// Shape/Size of a static tensor, computed from its type alone.
fn shape_only_value(op: &Op, shape: &[usize]) -> Tensor {
    match op {
        Op::Size => Tensor::scalar(shape.iter().product::<usize>() as i64),
        Op::Shape { start, end } => {
            let (s, e) = ops::shape_slice_bounds(shape.len(), *start, *end);
            let dims: Vec<i64> = shape[s..e].iter().map(|&d| d as i64).collect();
            Tensor::from_vec(vec![dims.len()], dims)
        }
        _ => unreachable!("only Shape and Size read shapes only"),
    }
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::print::write_graph(self, f, 0)
    }
}
