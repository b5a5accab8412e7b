//! Lowering of control flow before kernel selection: an `If` whose condition is known at
//! compile time becomes its branch; any other `If` computes both branches and selects with
//! `Where` (branches are side-effect free); a `Loop` with a trip count known at compile time
//! (and a condition that stays known) is unrolled, its scan outputs stacked with `Concat`.
//! What cannot be lowered statically is reported naming the node.

use crate::error::{CodegenError, Result};
use kiln_ir::rewrite::{copy_into, Rewrite};
use kiln_ir::{Graph, Node, Op, Tensor, ValueId};
use std::collections::HashMap;

/// Unrolling beyond this many body copies would blow up compile time and code size.
const MAX_UNROLLED_NODES: usize = 20_000;

/// The graph with If/Loop lowered, or None when it has no control flow.
pub fn lower_control_flow(graph: &Graph) -> Result<Option<Graph>> {
    if !graph
        .nodes()
        .iter()
        .any(|n| matches!(n.op, Op::If { .. } | Op::Loop { .. }))
    {
        return Ok(None);
    }
    let mut dst = Graph::new(graph.name.clone());
    let mut map = HashMap::new();
    for (id, node) in graph.node_ids().zip(graph.nodes()) {
        if let Op::Input = node.op {
            let out = &node.outputs[0];
            map.insert(id.out(0), dst.add_input(out.name.clone(), out.ty.clone()));
        }
    }
    let mut budget = MAX_UNROLLED_NODES;
    copy_nodes(graph, &mut dst, &mut map, "", &mut budget)?;
    for o in graph.outputs() {
        let v = *map.get(&o.value).ok_or_else(|| {
            CodegenError::internal(format!("output '{}' lost in control-flow lowering", o.name))
        })?;
        dst.add_output(o.name.clone(), v);
    }
    Ok(Some(dst))
}

fn ir_err(node: &Node, e: impl std::fmt::Display) -> CodegenError {
    CodegenError::unsupported(&node.name, node.op.name(), e.to_string())
}

/// Copies `src`'s nodes (except inputs, already in `map`) into `dst`, lowering control flow.
fn copy_nodes(
    src: &Graph,
    dst: &mut Graph,
    map: &mut HashMap<ValueId, ValueId>,
    prefix: &str,
    budget: &mut usize,
) -> Result<()> {
    copy_into(dst, src, map, prefix, |dst, _, node, inputs| {
        if *budget == 0 {
            return Err(ir_err(
                node,
                "unrolling control flow exceeds the size kiln compiles",
            ));
        }
        *budget -= 1;
        let name = format!("{prefix}{}", node.name);
        Ok(match &node.op {
            Op::If {
                then_branch,
                else_branch,
            } => Rewrite::Replace(lower_if(
                dst,
                node,
                &name,
                inputs,
                then_branch,
                else_branch,
                budget,
            )?),
            Op::Loop { body, num_carried } => {
                Rewrite::Replace(lower_loop(dst, node, &name, inputs, body, *num_carried, budget)?)
            }
            _ => Rewrite::Keep,
        })
    })
}

/// Inlines `body` with its inputs bound to `args`; returns its outputs.
fn inline(
    dst: &mut Graph,
    body: &Graph,
    args: &[ValueId],
    prefix: &str,
    budget: &mut usize,
) -> Result<Vec<ValueId>> {
    let mut map = HashMap::new();
    for (i, &id) in body.inputs().iter().enumerate() {
        let v = *args
            .get(i)
            .ok_or_else(|| CodegenError::internal(format!("subgraph {prefix} has more inputs than given")))?;
        map.insert(id.out(0), v);
    }
    copy_nodes(body, dst, &mut map, prefix, budget)?;
    Ok(body.outputs().iter().map(|o| map[&o.value]).collect())
}

fn known_bool(dst: &Graph, v: ValueId) -> Option<bool> {
    dst.known_value(v)
        .and_then(|t| t.to_f64_vec().first().map(|x| *x != 0.0))
}

fn lower_if(
    dst: &mut Graph,
    node: &Node,
    name: &str,
    inputs: &[Option<ValueId>],
    then_g: &Graph,
    else_g: &Graph,
    budget: &mut usize,
) -> Result<Vec<ValueId>> {
    let cond = inputs[0].ok_or_else(|| ir_err(node, "If without a condition"))?;
    let captured: Vec<ValueId> = inputs[1..]
        .iter()
        .map(|v| v.expect("If inputs are present"))
        .collect();
    if let Some(c) = known_bool(dst, cond) {
        let branch = if c { then_g } else { else_g };
        return inline(dst, branch, &captured, &format!("{name}/"), budget);
    }
    let t = inline(dst, then_g, &captured, &format!("{name}/then/"), budget)?;
    let e = inline(dst, else_g, &captured, &format!("{name}/else/"), budget)?;
    // A one-element condition of any rank selects whole tensors: make it a scalar first.
    let shape = dst.add_const(
        format!("{name}/scalar_shape"),
        Tensor::from_vec(vec![0], Vec::<i64>::new()),
    );
    let cond = dst
        .add(
            format!("{name}/cond"),
            Op::Reshape { allow_zero: false },
            vec![Some(cond), Some(shape)],
            format!("{name}/cond"),
        )
        .map_err(|e| ir_err(node, e))?;
    let mut outs = vec![];
    for (k, (tv, ev)) in t.into_iter().zip(e).enumerate() {
        let (tt, et) = (dst.value_type(tv).clone(), dst.value_type(ev).clone());
        if tt != et {
            return Err(ir_err(
                node,
                format!("the branches produce output {k} with different types ({tt} and {et}): kiln compiles an If with a run-time condition only when both branches agree"),
            ));
        }
        let out_name = node.outputs[k].name.clone();
        outs.push(
            dst.add(
                format!("{name}/select{k}"),
                Op::Where,
                vec![Some(cond), Some(tv), Some(ev)],
                out_name,
            )
            .map_err(|e| ir_err(node, e))?,
        );
    }
    Ok(outs)
}

fn lower_loop(
    dst: &mut Graph,
    node: &Node,
    name: &str,
    inputs: &[Option<ValueId>],
    body: &Graph,
    num_carried: usize,
    budget: &mut usize,
) -> Result<Vec<ValueId>> {
    let trip = match inputs.first().copied().flatten() {
        Some(m) => Some(
            dst.known_value(m)
                .and_then(|t| t.to_i64_vec().first().copied())
                .ok_or_else(|| {
                    ir_err(
                        node,
                        "the trip count is not known at compile time (bind it with --bind)",
                    )
                })?,
        ),
        None => None,
    };
    let cond_in = inputs.get(1).copied().flatten();
    let mut cond = match cond_in {
        Some(c) => Some(
            known_bool(dst, c)
                .ok_or_else(|| ir_err(node, "the loop condition is not known at compile time"))?,
        ),
        None => None,
    };
    let limit = match trip {
        Some(m) => m,
        None if cond.is_some() => i64::MAX,
        None => {
            return Err(ir_err(
                node,
                "a Loop with neither trip count nor condition never ends",
            ))
        }
    };
    let mut carried: Vec<ValueId> = inputs[2..2 + num_carried]
        .iter()
        .map(|v| v.expect("carried"))
        .collect();
    let captured: Vec<ValueId> = inputs[2 + num_carried..]
        .iter()
        .map(|v| v.expect("captured"))
        .collect();
    let n_scan = body.outputs().len() - 1 - num_carried;
    let mut scans: Vec<Vec<ValueId>> = vec![vec![]; n_scan];
    let mut i = 0i64;
    while i < limit && cond != Some(false) {
        let iter_v = dst.add_const(format!("{name}/iter{i}"), Tensor::scalar(i));
        let cond_v = dst.add_const(format!("{name}/cond{i}"), Tensor::scalar(true));
        let mut args = vec![iter_v, cond_v];
        args.extend(&carried);
        args.extend(&captured);
        let outs = inline(dst, body, &args, &format!("{name}/{i}/"), budget)?;
        if cond_in.is_some() {
            cond = Some(known_bool(dst, outs[0]).ok_or_else(|| {
                ir_err(node, "the loop condition depends on run-time values: kiln unrolls only loops whose iteration count is known at compile time")
            })?);
        }
        carried = outs[1..1 + num_carried].to_vec();
        for (k, v) in outs[1 + num_carried..].iter().enumerate() {
            scans[k].push(*v);
        }
        i += 1;
    }
    let mut result = carried;
    for (k, vals) in scans.into_iter().enumerate() {
        if vals.is_empty() {
            return Err(ir_err(
                node,
                "a Loop that runs zero times with scan outputs is not compiled",
            ));
        }
        let axes = dst.add_const(
            format!("{name}/scan_axes{k}"),
            Tensor::from_vec(vec![1], vec![0i64]),
        );
        let mut parts = vec![];
        for (j, v) in vals.into_iter().enumerate() {
            parts.push(Some(
                dst.add(
                    format!("{name}/scan{k}/{j}"),
                    Op::Unsqueeze,
                    vec![Some(v), Some(axes)],
                    format!("{name}/scan{k}/{j}"),
                )
                .map_err(|e| ir_err(node, e))?,
            ));
        }
        let out_name = node.outputs[num_carried + k].name.clone();
        result.push(
            dst.add(
                format!("{name}/stack{k}"),
                Op::Concat { axis: 0 },
                parts,
                out_name,
            )
            .map_err(|e| ir_err(node, e))?,
        );
    }
    Ok(result)
}
