//! A node as kernel selection sees it: operator, static input/output shapes and the values of
//! inputs that are known at compile time (weights, folded shape arithmetic).

use crate::error::{CodegenError, Result};
use kiln_ir::{DType, Graph, Node, NodeId, Op, Tensor, TensorType, ValueId};

#[derive(Clone, Copy)]
pub struct NodeInfo<'g> {
    pub graph: &'g Graph,
    pub id: NodeId,
    pub node: &'g Node,
    /// An extra input a fused kernel reads (a residual), at input index `.0`; indices between
    /// the node's own inputs and it are absent.
    pub extra: Option<(usize, ValueId)>,
}

impl<'g> NodeInfo<'g> {
    pub fn new(graph: &'g Graph, id: NodeId) -> NodeInfo<'g> {
        NodeInfo {
            graph,
            id,
            node: graph.node(id),
            extra: None,
        }
    }

    /// The node with `value` as an extra input at index `slot` (at least its input count).
    pub fn with_extra(self, slot: usize, value: ValueId) -> NodeInfo<'g> {
        NodeInfo {
            extra: Some((slot.max(self.node.inputs.len()), value)),
            ..self
        }
    }

    pub fn op(&self) -> &'g Op {
        &self.node.op
    }

    pub fn name(&self) -> &'g str {
        &self.node.name
    }

    pub fn n_inputs(&self) -> usize {
        match self.extra {
            Some((slot, _)) => slot + 1,
            None => self.node.inputs.len(),
        }
    }

    pub fn n_outputs(&self) -> usize {
        self.node.outputs.len()
    }

    /// Input `i`, or None when it is absent (optional) or beyond the node's inputs.
    pub fn input(&self, i: usize) -> Option<ValueId> {
        match self.extra {
            Some((slot, v)) if i == slot => Some(v),
            _ => self.node.inputs.get(i).copied().flatten(),
        }
    }

    pub fn has_input(&self, i: usize) -> bool {
        self.input(i).is_some()
    }

    pub fn input_type(&self, i: usize) -> Option<&'g TensorType> {
        self.input(i).map(|v| self.graph.value_type(v))
    }

    pub fn input_dtype(&self, i: usize) -> Option<DType> {
        self.input_type(i).map(|t| t.dtype)
    }

    /// The static shape of input `i`; an error naming the node if it is absent or not static.
    pub fn input_shape(&self, i: usize) -> Result<Vec<usize>> {
        let ty = self
            .input_type(i)
            .ok_or_else(|| self.unsupported(format!("input {i} is missing")))?;
        ty.fixed_shape().ok_or_else(|| {
            let v = self.input(i).expect("typed above");
            self.unsupported(format!(
                "input {i} has shape {ty} that is not known at compile time ({})",
                shape_advice(self.graph, v)
            ))
        })
    }

    /// The value of input `i` when it is known at compile time.
    pub fn known(&self, i: usize) -> Option<&'g Tensor> {
        self.input(i).and_then(|v| self.graph.known_value(v))
    }

    /// Whether every value of f32 input `i` is a bf16 value: a constant whose values all are
    /// (bf16 autocast rounds weights at compile time), or the widening `Cast<f32>` of a bf16
    /// tensor (the autocast's operand pairs). A product of such operands can run on bf16
    /// hardware (tensor cores) with exactly the same result as in f32.
    pub fn input_is_bf16_valued(&self, i: usize) -> bool {
        let Some(v) = self.input(i) else {
            return false;
        };
        if self.graph.value_type(v).dtype != DType::F32 {
            return false;
        }
        if let Some(t) = self.graph.known_value(v) {
            return t
                .as_slice::<f32>()
                .is_some_and(|s| s.iter().all(|x| x.to_bits() & 0xffff == 0));
        }
        let producer = self.graph.node(v.node);
        matches!(producer.op, Op::Cast { to: DType::F32 })
            && producer
                .inputs
                .first()
                .copied()
                .flatten()
                .map(|x| self.graph.value_type(x).dtype)
                == Some(DType::BF16)
    }

    pub fn output_type(&self, i: usize) -> &'g TensorType {
        &self.node.outputs[i].ty
    }

    pub fn output_shape(&self, i: usize) -> Result<Vec<usize>> {
        let ty = self.output_type(i);
        ty.fixed_shape().ok_or_else(|| {
            self.unsupported(format!(
                "output {i} has shape {ty} that is not known at compile time ({})",
                shape_advice(self.graph, self.id.out(i as u32))
            ))
        })
    }

    /// An "unsupported" error naming this node and its operator.
    pub fn unsupported(&self, msg: impl Into<String>) -> CodegenError {
        CodegenError::unsupported(self.name(), self.op().name(), msg)
    }
}

/// What makes `v`'s shape static, as advice for an error: the graph inputs it depends on. Inputs
/// with symbolic dims need `--input-shape`; when all of them are fixed, the shape comes from an
/// input's *values* (a Reshape target, Resize sizes, a Range limit), which only `--bind` fixes.
pub fn shape_advice(graph: &Graph, v: ValueId) -> String {
    let inputs = inputs_reaching(graph, v.node);
    let names = |ids: &[NodeId]| {
        ids.iter()
            .map(|&n| format!("'{}'", graph.node(n).name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let ty = |n: NodeId| graph.value_type(n.out(0));
    let symbolic: Vec<NodeId> = inputs
        .iter()
        .copied()
        .filter(|&n| ty(n).fixed_shape().is_none())
        .collect();
    if let Some(&first) = symbolic.first() {
        return format!(
            "fix the shape of {} with --input-shape {}=D0,D1,...",
            names(&symbolic),
            graph.node(first).name
        );
    }
    // Shapes are decided by integer values; name those inputs when there are any.
    let integer: Vec<NodeId> = inputs.iter().copied().filter(|&n| ty(n).dtype.is_int()).collect();
    let deciding = if integer.is_empty() { inputs } else { integer };
    match deciding.first() {
        Some(&first) => format!(
            "it depends on the value of graph input {}: freeze it with --bind {}=FILE",
            names(&deciding),
            graph.node(first).name
        ),
        None => "it depends on values computed at run time".to_string(),
    }
}

/// The graph inputs that `node` depends on, in graph input order.
fn inputs_reaching(graph: &Graph, node: NodeId) -> Vec<NodeId> {
    let mut seen = vec![false; graph.len()];
    let mut stack = vec![node];
    while let Some(n) = stack.pop() {
        if std::mem::replace(&mut seen[n.index()], true) {
            continue;
        }
        stack.extend(graph.node(n).inputs.iter().flatten().map(|v| v.node));
    }
    graph
        .inputs()
        .iter()
        .copied()
        .filter(|n| seen[n.index()])
        .collect()
}
