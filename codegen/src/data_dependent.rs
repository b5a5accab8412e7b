//! Graph outputs whose size depends on the data: NonZero, NonMaxSuppression, Unique and a
//! Compress by a run-time condition produce as many values as their inputs select, so type inference leaves
//! a dim of their output unknown.
//! Such an output compiles when it is a graph output that no node reads: its buffer gets the
//! static shape that bounds it (`upper_bound`), its kernel writes its values first, in
//! row-major order for the actual dims, and writes those dims into the context's shape of
//! the output (`kiln_rt_output_dims`, which the kernel's output descriptor points at); the
//! executable writes `.npy` files of the actual shape and `NAME_run_shaped` reports it.
//! A data-dependent value read by another node is still refused: later kernels would need the
//! count at run time.

use crate::error::{CodegenError, Result};
use kiln_ir::{Dim, Graph, MiscOp, Op, TensorType, ValueId, VisionOp};
use std::borrow::Cow;

/// The graph codegen plans (with bounded types where outputs are data-dependent) and which of
/// its outputs have a bound rather than a shape.
pub struct Bounded<'g> {
    pub graph: Cow<'g, Graph>,
    /// Indices of the graph outputs whose static shape is an upper bound.
    pub outputs: Vec<usize>,
}

/// The values from the operator to graph output value `v`: `v`, then back through Identity
/// nodes (freeze removes them; without it they stay), each value on the way read only by the
/// next and not itself a graph output. The last is the value whose kernel computes the dims.
pub fn chain_to(graph: &Graph, v: ValueId) -> Vec<ValueId> {
    let readers = |x: ValueId| {
        graph
            .nodes()
            .iter()
            .filter(|n| n.inputs.contains(&Some(x)))
            .count()
    };
    let mut chain = vec![v];
    let mut at = v;
    while let (Op::Identity, Some(Some(src))) = (&graph.node(at.node).op, graph.node(at.node).inputs.first())
    {
        if readers(*src) != 1 || graph.outputs().iter().any(|p| p.value == *src) {
            break;
        }
        at = *src;
        chain.push(at);
    }
    chain
}

/// `graph` with every data-dependent graph output bounded (see the module docs); `gpu`: a GPU
/// target, which refuses them (its kernels cannot report a shape yet).
pub fn bound_outputs(graph: &Graph, gpu: bool) -> Result<Bounded<'_>> {
    let mut bounded: Option<Graph> = None;
    let mut outputs = vec![];
    for (j, o) in graph.outputs().iter().enumerate() {
        let v = o.value;
        let ty = graph.value_type(v);
        if ty.is_static() {
            continue;
        }
        let chain = chain_to(graph, v);
        let root = *chain.last().expect("the chain starts at v");
        let node = graph.node(root.node);
        let Some(bound) = upper_bound(graph, root) else {
            continue;
        };
        let once = graph.outputs().iter().filter(|p| p.value == v).count() == 1;
        let read = graph.nodes().iter().any(|n| n.inputs.contains(&Some(v)));
        if !once || read {
            return Err(CodegenError::unsupported(
                &node.name,
                node.op.name(),
                format!(
                    "output '{}' has shape {ty}, which depends on the data; kiln compiles such a value only as a graph output that no other node reads (and listed once)",
                    o.name
                ),
            ));
        }
        if gpu {
            return Err(CodegenError::unsupported(
                &node.name,
                node.op.name(),
                format!(
                    "output '{}' has shape {ty}, which depends on the data: the CUDA target does not compile that yet (CPU targets do)",
                    o.name
                ),
            ));
        }
        let g = bounded.get_or_insert_with(|| graph.clone());
        for &x in &chain {
            let ty = TensorType::new(ty.dtype, bound.iter().map(|&d| Dim::Fixed(d)).collect());
            g.bound_value_type(x, ty)
                .map_err(|e| CodegenError::internal(format!("bounding output '{}': {e}", o.name)))?;
        }
        outputs.push(j);
    }
    Ok(Bounded {
        graph: bounded.map_or(Cow::Borrowed(graph), Cow::Owned),
        outputs,
    })
}

/// The static shape that bounds `v`, a data-dependent output, when its producer is an operator
/// this module handles and its inputs have static shapes.
fn upper_bound(graph: &Graph, v: ValueId) -> Option<Vec<usize>> {
    let node = graph.node(v.node);
    let input = |i: usize| -> Option<Vec<usize>> { graph.value_type((*node.inputs.get(i)?)?).fixed_shape() };
    match &node.op {
        // [rank, count]: at most every element.
        Op::NonZero => {
            let x = input(0)?;
            Some(vec![x.len(), x.iter().product()])
        }
        // [count, 3]: at most max_output_boxes_per_class boxes per batch entry and class.
        Op::Vision(VisionOp::NonMaxSuppression { .. }) => {
            let (boxes, scores) = (input(0)?, input(1)?);
            let (batch, n, classes) = (*boxes.first()?, *boxes.get(1)?, *scores.get(1)?);
            let per_class = match node.inputs.get(2).copied().flatten() {
                None => 0,
                Some(m) => match graph.known_value(m) {
                    Some(t) => t
                        .to_i64_vec()
                        .first()
                        .map_or(0, |&m| m.clamp(0, n as i64) as usize),
                    None => n,
                },
            };
            Some(vec![batch * classes * per_class, 3])
        }
        // The axis (or the flattened tensor) keeps at most as many slices as it has and as
        // the condition has entries.
        Op::Misc(MiscOp::Compress { axis }) => {
            let (x, cond) = (input(0)?, input(1)?);
            let len = *cond.first()?;
            match axis {
                None => Some(vec![x.iter().product::<usize>().min(len)]),
                Some(axis) => {
                    let a = kiln_ir::ops::util::norm_axis(*axis, x.len()).ok()?;
                    let mut s = x;
                    s[a] = s[a].min(len);
                    Some(s)
                }
            }
        }
        // The distinct slices (output 0), their first occurrences (1) and counts (3): at most
        // every slice. The inverse indices (2) have one per slice, a static shape.
        Op::Misc(MiscOp::Unique { axis, .. }) => {
            let x = input(0)?;
            let (n, a) = match axis {
                None => (x.iter().product::<usize>(), None),
                Some(axis) => {
                    let a = kiln_ir::ops::util::norm_axis(*axis, x.len()).ok()?;
                    (x[a], Some(a))
                }
            };
            match (v.output, a) {
                (0, None) | (1 | 3, _) => Some(vec![n]),
                (0, Some(_)) => Some(x),
                _ => None,
            }
        }
        _ => None,
    }
}
