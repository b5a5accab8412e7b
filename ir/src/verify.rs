//! The graph verifier: structural invariants and type consistency.

use crate::{Graph, IrError, Op};

/// Checks that every node only uses earlier values, that stored types match what inference
/// gives today, that graph inputs are `Input` nodes and outputs exist. Passes run it after
/// every rewrite; a failure is a compiler bug, not a user error.
pub fn verify(graph: &Graph) -> Result<(), IrError> {
    let n = graph.len();
    for &id in graph.inputs() {
        if id.index() >= n || graph.node(id).op != Op::Input {
            return Err(IrError::Invalid(format!(
                "graph input {id:?} is not an Input node"
            )));
        }
    }
    let inputs_listed = graph.nodes().iter().filter(|nd| nd.op == Op::Input).count();
    if inputs_listed != graph.inputs().len() {
        return Err(IrError::Invalid(
            "an Input node is not listed as a graph input".into(),
        ));
    }
    for id in graph.node_ids() {
        let node = graph.node(id);
        let bad = |msg: String| IrError::node(&node.name, node.op.name(), msg);
        for v in node.inputs.iter().flatten() {
            if v.node >= id {
                return Err(bad(format!("uses value {v:?} that is not defined before it")));
            }
            if v.output as usize >= graph.node(v.node).outputs.len() {
                return Err(bad(format!(
                    "uses output {} of a node with fewer outputs",
                    v.output
                )));
            }
        }
        match &node.op {
            Op::Input => {}
            Op::Constant(c) => {
                if c.0 as usize >= graph.consts().len() {
                    return Err(bad(format!("constant {c:?} is not in the pool")));
                }
                if graph.constant(*c).tensor_type() != node.outputs[0].ty {
                    return Err(bad("constant type differs from its tensor".into()));
                }
            }
            op => {
                let (types, _) = graph
                    .infer_node(op, &node.inputs, node.outputs.len())
                    .map_err(|e| bad(e.to_string()))?;
                for (i, (got, out)) in types.iter().zip(&node.outputs).enumerate() {
                    if *got != out.ty {
                        return Err(bad(format!(
                            "output {i} is typed {} but inference gives {got}",
                            out.ty
                        )));
                    }
                }
                for sub in op.subgraphs() {
                    verify(sub)?;
                }
            }
        }
    }
    for o in graph.outputs() {
        if o.value.node.index() >= n || o.value.output as usize >= graph.node(o.value.node).outputs.len() {
            return Err(IrError::Invalid(format!(
                "graph output '{}' refers to a missing value",
                o.name
            )));
        }
    }
    Ok(())
}
