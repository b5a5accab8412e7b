//! `lower-control-flow`: the last pass, so that codegen receives a graph without control flow.
//!
//! An `If` whose condition is known at compile time becomes its branch; any other `If`
//! computes both branches and selects with `Where` (branches are side-effect free); a `Loop`
//! with a trip count known at compile time (and a condition that stays known) is unrolled, its
//! scan outputs stacked with `Concat`. What cannot be lowered statically is reported naming
//! the node, as a construct kiln does not compile ([`crate::PassFailure::Unsupported`]), not
//! as a compiler bug.
//!
//! It runs after the other passes, which see (and leave) `If` and `Loop` as single nodes.

use crate::{Pass, PassReport};
use kiln_ir::rewrite::{copy_into, Rewrite};
use kiln_ir::{Graph, IrError, Node, Op, Tensor, ValueId};
use std::collections::HashMap;

type Result<T> = std::result::Result<T, IrError>;

pub struct LowerControlFlow;

/// The pass's name (`--disable-pass`, `--print-after`).
pub const NAME: &str = "lower-control-flow";

impl Pass for LowerControlFlow {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, graph: &mut Graph) -> Result<usize> {
        Ok(self.run_with_report(graph)?.rewrites)
    }

    fn run_with_report(&self, graph: &mut Graph) -> Result<PassReport> {
        let count = |g: &Graph, f: fn(&Op) -> bool| g.nodes().iter().filter(|n| f(&n.op)).count();
        let ifs = count(graph, |op| matches!(op, Op::If { .. }));
        let loops = count(graph, |op| matches!(op, Op::Loop { .. }));
        let Some(lowered) = lower_control_flow(graph)? else {
            return Ok(PassReport {
                rewrites: 0,
                summary: "unchanged".to_string(),
            });
        };
        *graph = lowered;
        let lowered: Vec<String> = [(ifs, "If"), (loops, "Loop")]
            .iter()
            .filter(|(n, _)| *n > 0)
            .map(|(n, op)| format!("{n} {op}"))
            .collect();
        Ok(PassReport {
            rewrites: ifs + loops,
            summary: format!("lowered {}", lowered.join(", ")),
        })
    }

    /// A node it cannot lower is a construct kiln does not compile (a Loop whose trip count
    /// is only known at run time), reported as such.
    fn node_errors_are_unsupported(&self) -> bool {
        true
    }
}

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
        let v = *map
            .get(&o.value)
            .ok_or_else(|| IrError::Invalid(format!("output '{}' lost in control-flow lowering", o.name)))?;
        dst.add_output(o.name.clone(), v);
    }
    Ok(Some(dst))
}

fn ir_err(node: &Node, e: impl std::fmt::Display) -> IrError {
    IrError::node(&node.name, node.op.name(), e)
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
            .ok_or_else(|| IrError::Invalid(format!("subgraph {prefix} has more inputs than given")))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PassFailure, PassManager};
    use kiln_ir::{DType, TensorType, Unary};

    fn f32x2() -> TensorType {
        TensorType::fixed(DType::F32, &[2])
    }

    /// `relu(x)` (then) or `x` (else), of a captured `x`.
    fn branches() -> (Graph, Graph) {
        let mut then_g = Graph::new("then");
        let x = then_g.add_input("x", f32x2());
        let r = then_g
            .add("r", Op::Unary(Unary::Relu), vec![Some(x)], "r")
            .unwrap();
        then_g.add_output("r", r);
        let mut else_g = Graph::new("else");
        let x = else_g.add_input("x", f32x2());
        else_g.add_output("x", x);
        (then_g, else_g)
    }

    #[test]
    fn an_if_on_a_constant_becomes_its_branch() {
        let (then_g, else_g) = branches();
        let mut g = Graph::new("g");
        let x = g.add_input("x", f32x2());
        let cond = g.add_const("cond", Tensor::scalar(true));
        let y = g
            .add(
                "if",
                Op::If {
                    then_branch: Box::new(then_g),
                    else_branch: Box::new(else_g),
                },
                vec![Some(cond), Some(x)],
                "y",
            )
            .unwrap();
        g.add_output("y", y);
        let stats = PassManager::new().with(LowerControlFlow).run(&mut g).unwrap();
        assert_eq!(stats[0].rewrites, 1);
        assert_eq!(stats[0].summary, "lowered 1 If");
        assert!(g.nodes().iter().all(|n| !matches!(n.op, Op::If { .. })), "{g}");
        let relu = g
            .nodes()
            .iter()
            .find(|n| n.name == "if/r")
            .expect("the branch inlined");
        assert!(matches!(relu.op, Op::Unary(Unary::Relu)), "{g}");
        assert_eq!(g.outputs()[0].name, "y");
        // A graph without control flow is left alone.
        let before = g.to_string();
        let stats = PassManager::new().with(LowerControlFlow).run(&mut g).unwrap();
        assert_eq!((stats[0].rewrites, stats[0].summary.as_str()), (0, "unchanged"));
        assert_eq!(g.to_string(), before);
    }

    #[test]
    fn a_loop_with_a_run_time_trip_count_is_unsupported() {
        let mut body = Graph::new("body");
        let _iter = body.add_input("iter", TensorType::fixed(DType::I64, &[]));
        let cond = body.add_input("cond", TensorType::fixed(DType::Bool, &[]));
        let v = body.add_input("v", f32x2());
        let r = body.add("r", Op::Unary(Unary::Relu), vec![Some(v)], "r").unwrap();
        body.add_output("cond_out", cond);
        body.add_output("v_out", r);
        let mut g = Graph::new("g");
        let m = g.add_input("m", TensorType::fixed(DType::I64, &[]));
        let x = g.add_input("x", f32x2());
        let y = g
            .add(
                "loop",
                Op::Loop {
                    body: Box::new(body),
                    num_carried: 1,
                },
                vec![Some(m), None, Some(x)],
                "y",
            )
            .unwrap();
        g.add_output("y", y);
        let err = PassManager::new().with(LowerControlFlow).run(&mut g).unwrap_err();
        assert_eq!(err.failure, PassFailure::Unsupported);
        assert_eq!((err.pass, err.node.as_deref()), (NAME, Some("loop")));
        assert_eq!(
            err.to_string(),
            "node 'loop' (Loop): the trip count is not known at compile time (bind it with --bind)"
        );
    }
}
