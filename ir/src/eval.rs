//! The reference interpreter: runs a graph node by node on concrete tensors.
//!
//! This is the oracle every compiled result is compared against and the engine of constant
//! folding, so each operator is written to be obviously correct first. Values are freed after
//! their last use, so peak memory stays close to what the model needs.

use crate::ops::{self, EvalCtx};
use crate::{Dim, Graph, IrError, NodeId, Op, Tensor};
use std::collections::HashMap;
use std::sync::Arc;

/// Runs `graph` on `inputs` (in graph-input order) and returns its outputs in order.
pub fn eval_graph(graph: &Graph, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, IrError> {
    eval_graph_observed(graph, inputs, |_, _| {})
}

/// Runs `graph` with inputs given by name; every graph input must be present.
pub fn eval_graph_named(graph: &Graph, mut inputs: HashMap<String, Tensor>) -> Result<Vec<Tensor>, IrError> {
    let mut ordered = Vec::with_capacity(graph.inputs().len());
    for (name, _) in graph.input_types() {
        match inputs.remove(name) {
            Some(t) => ordered.push(t),
            None => {
                return Err(IrError::Input {
                    name: name.to_string(),
                    msg: "no value given for this input".into(),
                })
            }
        }
    }
    if let Some(name) = inputs.keys().next() {
        let known: Vec<&str> = graph.input_types().map(|(n, _)| n).collect();
        return Err(IrError::Input {
            name: name.clone(),
            msg: format!("the model has no such input (its inputs: {})", known.join(", ")),
        });
    }
    eval_graph(graph, ordered)
}

/// Like [`eval_graph`], calling `observe(node, outputs)` after each node is evaluated (for
/// comparing intermediate values).
pub fn eval_graph_observed(
    graph: &Graph,
    inputs: Vec<Tensor>,
    mut observe: impl FnMut(NodeId, &[Arc<Tensor>]),
) -> Result<Vec<Tensor>, IrError> {
    check_inputs(graph, &inputs)?;
    let n = graph.len();
    // Remaining uses of each node's outputs, to free values as soon as they are dead.
    let mut uses = vec![0usize; n];
    for node in graph.nodes() {
        for v in node.inputs.iter().flatten() {
            uses[v.node.index()] += 1;
        }
    }
    for o in graph.outputs() {
        uses[o.value.node.index()] += 1;
    }
    let mut values: Vec<Option<Vec<Arc<Tensor>>>> = vec![None; n];
    // Bytes of the values alive now (inputs and computed values; constants belong to the
    // graph), so that a node is refused before it would take the run over the memory budget.
    let mut held_bytes = vec![0u128; n];
    let mut held: u128 = 0;
    let mut inputs = inputs.into_iter();
    for id in graph.node_ids() {
        let node = graph.node(id);
        if !matches!(node.op, Op::Input | Op::Constant(_)) {
            let needed: u128 = node
                .outputs
                .iter()
                .filter_map(|o| o.ty.size_bytes())
                .map(|b| b as u128)
                .sum();
            crate::budget::check(needed, held, "its output")
                .map_err(|e| IrError::op(&node.name, node.op.name(), e))?;
        }
        let outs: Vec<Arc<Tensor>> = match &node.op {
            Op::Input => vec![Arc::new(inputs.next().expect("checked input count"))],
            Op::Constant(c) => vec![graph.consts()[c.0 as usize].clone()],
            op => {
                let args: Vec<Option<&Tensor>> = node
                    .inputs
                    .iter()
                    .map(|v| {
                        v.map(|v| {
                            let vals = values[v.node.index()]
                                .as_ref()
                                .expect("inputs evaluated before use");
                            &*vals[v.output as usize]
                        })
                    })
                    .collect();
                let types: Vec<_> = node.outputs.iter().map(|o| o.ty.clone()).collect();
                let cx = EvalCtx {
                    inputs: args,
                    out_types: &types,
                };
                let outs = ops::eval(op, &cx).map_err(|e| IrError::op(&node.name, op.name(), e))?;
                if outs.len() != node.outputs.len() {
                    return Err(IrError::node(
                        &node.name,
                        op.name(),
                        format!(
                            "evaluation produced {} outputs, expected {}",
                            outs.len(),
                            node.outputs.len()
                        ),
                    ));
                }
                outs.into_iter().map(Arc::new).collect()
            }
        };
        observe(id, &outs);
        if !matches!(node.op, Op::Constant(_)) {
            held_bytes[id.index()] = outs.iter().map(|t| t.size_bytes() as u128).sum();
            held += held_bytes[id.index()];
        }
        values[id.index()] = Some(outs);
        let mut release = |i: usize, values: &mut Vec<Option<Vec<Arc<Tensor>>>>| {
            values[i] = None;
            held -= std::mem::take(&mut held_bytes[i]);
        };
        for v in node.inputs.iter().flatten() {
            let u = &mut uses[v.node.index()];
            *u -= 1;
            if *u == 0 {
                release(v.node.index(), &mut values);
            }
        }
        if uses[id.index()] == 0 {
            release(id.index(), &mut values);
        }
    }
    graph
        .outputs()
        .iter()
        .map(|o| {
            let vals = values[o.value.node.index()].as_ref().expect("outputs kept alive");
            Ok(Tensor::clone(&vals[o.value.output as usize]))
        })
        .collect()
}

/// Checks count, dtype and shape of `inputs` against the graph's declared inputs; a symbolic
/// dimension must have the same extent everywhere it appears.
pub fn check_inputs(graph: &Graph, inputs: &[Tensor]) -> Result<(), IrError> {
    if inputs.len() != graph.inputs().len() {
        return Err(IrError::Invalid(format!(
            "the model takes {} inputs, {} were given",
            graph.inputs().len(),
            inputs.len()
        )));
    }
    let mut bound: HashMap<&str, usize> = HashMap::new();
    for ((name, ty), t) in graph.input_types().zip(inputs) {
        let err = |msg: String| IrError::Input {
            name: name.to_string(),
            msg,
        };
        if t.dtype() != ty.dtype {
            return Err(err(format!("expected dtype {} but got {}", ty.dtype, t.dtype())));
        }
        let expected = || format!("expected shape {ty} but got {:?}", t.shape());
        if t.rank() != ty.rank() {
            return Err(err(expected()));
        }
        for (d, &actual) in ty.shape.iter().zip(t.shape()) {
            match d {
                Dim::Fixed(n) if *n != actual => return Err(err(expected())),
                Dim::Sym(s) if s != "?" => {
                    if let Some(&prev) = bound.get(s.as_str()) {
                        if prev != actual {
                            return Err(err(format!(
                                "dimension '{s}' is {actual} here but {prev} in an earlier input"
                            )));
                        }
                    }
                    bound.insert(s, actual);
                }
                _ => {}
            }
        }
    }
    Ok(())
}
