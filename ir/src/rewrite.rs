//! Rebuilding a graph node by node with substitutions: the way passes rewrite the IR. The graph
//! is an append-only arena in topological order, so a rewrite copies it, letting a callback
//! replace any node with other nodes (or with values already in the new graph).

use crate::{Graph, IrError, Node, NodeId, Op, ValueId};
use std::collections::HashMap;

/// What the callback decides for one node.
pub enum Rewrite {
    /// Copy the node unchanged.
    Keep,
    /// The node's outputs are these values of the new graph.
    Replace(Vec<ValueId>),
}

/// Copies `src` into a new graph. For every node except inputs, `f(dst, id, node, inputs)` is
/// called with the node's inputs already mapped into `dst`; it may add nodes to `dst` and
/// return `Rewrite::Replace` with the values standing for the node's outputs.
pub fn rebuild(
    src: &Graph,
    f: impl FnMut(&mut Graph, NodeId, &Node, &[Option<ValueId>]) -> Result<Rewrite, IrError>,
) -> Result<Graph, IrError> {
    let mut dst = Graph::new(src.name.clone());
    let mut map: HashMap<ValueId, ValueId> = HashMap::new();
    for &id in src.inputs() {
        let out = &src.node(id).outputs[0];
        map.insert(id.out(0), dst.add_input(out.name.clone(), out.ty.clone()));
    }
    copy_into(&mut dst, src, &mut map, "", f)?;
    for o in src.outputs() {
        dst.add_output(o.name.clone(), map[&o.value]);
    }
    Ok(dst)
}

/// Copies the nodes of `src` (not its inputs, whose values `map` must already hold) into
/// `dst`, node and value names prefixed with `prefix` (for inlined subgraphs), through the
/// callback as in [`rebuild`]. `map` receives every copied value; `dst`'s outputs are untouched.
pub fn copy_into<E: From<IrError>>(
    dst: &mut Graph,
    src: &Graph,
    map: &mut HashMap<ValueId, ValueId>,
    prefix: &str,
    mut f: impl FnMut(&mut Graph, NodeId, &Node, &[Option<ValueId>]) -> Result<Rewrite, E>,
) -> Result<(), E> {
    for (id, node) in src.node_ids().zip(src.nodes()) {
        if let Op::Input = node.op {
            continue;
        }
        let inputs: Vec<Option<ValueId>> = node.inputs.iter().map(|v| v.map(|v| map[&v])).collect();
        let outs = match f(dst, id, node, &inputs)? {
            Rewrite::Replace(v) => v,
            Rewrite::Keep => copy_node(dst, src, node, inputs, prefix)?,
        };
        for (o, v) in outs.into_iter().enumerate() {
            map.insert(id.out(o as u32), v);
        }
    }
    Ok(())
}

/// Adds `node` of `src` to `dst` unchanged but for its (mapped) inputs and the name prefix.
fn copy_node(
    dst: &mut Graph,
    src: &Graph,
    node: &Node,
    inputs: Vec<Option<ValueId>>,
    prefix: &str,
) -> Result<Vec<ValueId>, IrError> {
    Ok(match &node.op {
        Op::Constant(c) => vec![dst.add_const(
            format!("{prefix}{}", node.outputs[0].name),
            src.consts()[c.0 as usize].clone(),
        )],
        op => dst.add_node(
            format!("{prefix}{}", node.name),
            op.clone(),
            inputs,
            node.outputs
                .iter()
                .map(|o| format!("{prefix}{}", o.name))
                .collect(),
        )?,
    })
}

/// How many times each value is used (as a node input or a graph output).
pub fn use_counts(graph: &Graph) -> HashMap<ValueId, usize> {
    let mut uses = HashMap::new();
    for n in graph.nodes() {
        for v in n.inputs.iter().flatten() {
            *uses.entry(*v).or_insert(0) += 1;
        }
    }
    for o in graph.outputs() {
        *uses.entry(o.value).or_insert(0) += 1;
    }
    uses
}

/// Nodes the graph outputs depend on, and the graph inputs (the model's API, even when unused).
pub fn live_nodes(g: &Graph) -> Vec<bool> {
    let mut live = vec![false; g.len()];
    for o in g.outputs() {
        live[o.value.node.index()] = true;
    }
    for &i in g.inputs() {
        live[i.index()] = true;
    }
    for id in g.node_ids().collect::<Vec<_>>().into_iter().rev() {
        if live[id.index()] {
            for v in g.node(id).inputs.iter().flatten() {
                live[v.node.index()] = true;
            }
        }
    }
    live
}

/// The graph without the nodes no output depends on (graph inputs stay). Dead nodes are
/// skipped before their inputs are looked at: a dead node may read another dead node's value.
pub fn remove_dead(g: &Graph) -> Result<Graph, IrError> {
    let live = live_nodes(g);
    let mut dst = Graph::new(g.name.clone());
    let mut map: HashMap<ValueId, ValueId> = HashMap::new();
    for &id in g.inputs() {
        let out = &g.node(id).outputs[0];
        map.insert(id.out(0), dst.add_input(out.name.clone(), out.ty.clone()));
    }
    for (id, node) in g.node_ids().zip(g.nodes()) {
        if !live[id.index()] || matches!(node.op, Op::Input) {
            continue;
        }
        let inputs = node.inputs.iter().map(|v| v.map(|v| map[&v])).collect();
        for (o, v) in copy_node(&mut dst, g, node, inputs, "")?.into_iter().enumerate() {
            map.insert(id.out(o as u32), v);
        }
    }
    for o in g.outputs() {
        dst.add_output(o.name.clone(), map[&o.value]);
    }
    Ok(dst)
}
