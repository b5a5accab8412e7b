//! Values whose size depends on the data: NonZero, NonMaxSuppression, Unique and a Compress by
//! a run-time condition produce as many values as their inputs select, so type inference
//! leaves one axis of their output unknown — and of every value computed from it.
//!
//! Such a value (its *dynamic axis* aside, every dim is static) compiles with the static shape
//! that bounds it (`upper_bound`): its buffer has room for the bound, kernels compute on the
//! bound, and the operator that selects (the *root*) writes the actual count into its output's
//! dims. Later kernels see the bound; that is right for the operators this module lets through
//! (elementwise, Cast, Identity, Gather, Slice, Split, Concat, Reshape, Flatten, Squeeze, Unsqueeze,
//! Transpose, each keeping the dynamic axis apart from what it mixes), because each computes an
//! output row from the same input row alone. The rows past the count hold a known *fill*
//! (roots write zeros; elementwise operators map it), so a Gather whose indices come from such
//! a value reads in range there too — it is compiled only when the fill is a valid index.
//!
//! A graph output computed this way gets the root's count in its dims
//! (`kiln_rt_output_dims`): after the root's kernel, the run copies the count there. The
//! executable writes `.npy` files of the actual shape and `NAME_run_shaped` reports it. Its
//! values must come first, in row-major order for the actual dims: true when every dim before
//! the dynamic axis is 1, and for a root's own compacted output (NonZero's `[rank, count]`).

use crate::error::{CodegenError, Result};
use kiln_ir::ops::{EvalCtx, InferCtx};
use kiln_ir::{
    DType, Dim, Graph, MiscOp, Node, Op, OpFamily, Tensor, TensorData, TensorType, ValueId, VisionOp,
};
use std::borrow::Cow;
use std::collections::HashMap;

/// How a data-dependent value lies in its buffer, which the bound sizes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Placement {
    /// Row-major for the actual dims: the values first. What graph outputs need.
    Compact,
    /// Row-major for the bound: each value at its position in the bound shape, the rest
    /// filled. What kernels computing on the bound read.
    Padded,
    /// Both at once: every dim before the dynamic axis is 1.
    Both,
}

/// A value with a dynamic axis.
#[derive(Clone, Debug)]
pub struct Dynamic {
    /// The root: the operator output whose kernel computes the count.
    pub root: ValueId,
    /// The axis whose extent is that count.
    pub axis: usize,
    pub placement: Placement,
    /// What the positions past the count hold, where known.
    pub fill: Option<f64>,
}

/// A data-dependent operator output, and the graph outputs whose dims take its count.
#[derive(Clone, Debug)]
pub struct Root {
    pub value: ValueId,
    /// The index of its dims where its kernel writes the count.
    pub axis: usize,
    /// `(graph output index, axis)` for every graph output computed from it.
    pub outputs: Vec<(usize, usize)>,
}

/// The data-dependent values of a graph.
#[derive(Debug)]
pub struct Analysis {
    pub values: HashMap<ValueId, Dynamic>,
    pub roots: Vec<Root>,
}

/// The graph codegen plans (with bounded types where values are data-dependent) and which of
/// its outputs have a bound rather than a shape.
#[derive(Debug)]
pub struct Bounded<'g> {
    pub graph: Cow<'g, Graph>,
    /// Indices of the graph outputs whose static shape is an upper bound.
    pub outputs: Vec<usize>,
}

/// Whether `v` is a root: the output of a selecting operator that is not computed at compile
/// time, and its dynamic axis. Decided from the operator alone, so it holds before and after
/// bounding.
fn root_axis(graph: &Graph, v: ValueId) -> Option<usize> {
    let node = graph.node(v.node);
    if graph.known_value(v).is_some() {
        return None;
    }
    let rank = graph.value_type(v).rank();
    let axis = |a: Option<i64>| match a {
        None => Some(0),
        Some(a) => kiln_ir::ops::util::norm_axis(a, rank).ok(),
    };
    match &node.op {
        Op::NonZero => Some(1),
        Op::Vision(VisionOp::NonMaxSuppression { .. }) => Some(0),
        Op::Misc(MiscOp::Compress { axis: a }) => {
            let cond = node.inputs.get(1).copied().flatten()?;
            match graph.known_value(cond) {
                Some(_) => None,
                None => axis(*a),
            }
        }
        Op::Misc(MiscOp::Unique { axis: a, .. }) => match v.output {
            0 => axis(*a),
            1 | 3 => Some(0),
            _ => None,
        },
        _ => None,
    }
}

/// Whether NonZero's output `v` is written in its bound layout (`[rank, bound]`, zero-filled)
/// rather than compacted: when a node other than Identity reads it (through Identity nodes).
pub fn writes_padded(graph: &Graph, v: ValueId) -> bool {
    let mut stack = vec![v];
    while let Some(x) = stack.pop() {
        for id in graph.node_ids() {
            let n = graph.node(id);
            if !n.inputs.contains(&Some(x)) {
                continue;
            }
            match n.op {
                Op::Identity => stack.push(id.out(0)),
                _ => return true,
            }
        }
    }
    false
}

/// Every dim of `v` before `axis` is 1.
fn leading_ones(graph: &Graph, v: ValueId, axis: usize) -> bool {
    graph.value_type(v).shape[..axis]
        .iter()
        .all(|d| *d == Dim::Fixed(1))
}

/// Finds every data-dependent value of `graph` and checks that kiln can compile what reads
/// them (see the module docs); the error names the first node that cannot be.
pub fn analyze(graph: &Graph) -> Result<Analysis> {
    let mut values: HashMap<ValueId, Dynamic> = HashMap::new();
    let mut roots: Vec<Root> = vec![];
    for id in graph.node_ids() {
        let node = graph.node(id);
        let dynamic_inputs: Vec<(usize, Dynamic)> = node
            .inputs
            .iter()
            .enumerate()
            .filter_map(|(i, v)| Some((i, values.get(&(*v)?)?.clone())))
            .collect();
        if !dynamic_inputs.is_empty() {
            for (o, d) in propagate(graph, node, &dynamic_inputs)? {
                values.insert(id.out(o as u32), d);
            }
            continue;
        }
        for o in 0..node.outputs.len() {
            let v = id.out(o as u32);
            let Some(axis) = root_axis(graph, v) else {
                continue;
            };
            let placement = if leading_ones(graph, v, axis) {
                Placement::Both
            } else if matches!(node.op, Op::NonZero) && writes_padded(graph, v) {
                Placement::Padded
            } else {
                Placement::Compact
            };
            values.insert(
                v,
                Dynamic {
                    root: v,
                    axis,
                    placement,
                    fill: Some(0.0),
                },
            );
            roots.push(Root {
                value: v,
                axis,
                outputs: vec![],
            });
        }
    }
    for (j, o) in graph.outputs().iter().enumerate() {
        let Some(d) = values.get(&o.value) else {
            continue;
        };
        let root = graph.node(d.root.node);
        if d.placement == Placement::Padded {
            return Err(CodegenError::unsupported(
                &root.name,
                root.op.name(),
                format!(
                    "output '{}' has a dim that depends on the data (axis {}) after dims other than 1, so its values would not come first in its buffer; kiln compiles such an output only with that axis first (a Transpose can move it there)",
                    o.name, d.axis
                ),
            ));
        }
        let r = roots
            .iter_mut()
            .find(|r| r.value == d.root)
            .expect("every dynamic value has a root");
        r.outputs.push((j, d.axis));
    }
    Ok(Analysis { values, roots })
}

/// The data-dependent values that cannot be graph outputs: those in their bound's layout with
/// dims other than 1 before the dynamic axis (a tool that makes intermediate values outputs,
/// as `kiln verify` does, leaves them out).
pub fn padded_values(graph: &Graph) -> Vec<ValueId> {
    analyze(graph).map_or(vec![], |a| {
        a.values
            .into_iter()
            .filter(|(_, d)| d.placement == Placement::Padded)
            .map(|(v, _)| v)
            .collect()
    })
}

/// The root `v` is, with the graph outputs that take its count; None for any other value.
pub fn root(graph: &Graph, v: ValueId) -> Result<Option<Root>> {
    if root_axis(graph, v).is_none() {
        return Ok(None);
    }
    Ok(analyze(graph)?.roots.into_iter().find(|r| r.value == v))
}

/// Every graph output whose extent along an axis is a count, as `(output index, axis)` in
/// output order. On a GPU, where the host cannot see a kernel's dims, a root's kernel writes
/// its count into slot `c` of the counts that follow the frame's error slot, `c` this list's
/// index of the output; the host copies them into the outputs' dims after the run.
pub fn output_counts(graph: &Graph) -> Result<Vec<(usize, usize)>> {
    let mut counts: Vec<(usize, usize)> = analyze(graph)?
        .roots
        .into_iter()
        .flat_map(|r| r.outputs)
        .collect();
    counts.sort_unstable();
    Ok(counts)
}

/// The dynamic axis of `node`'s outputs, which reads the data-dependent values `inputs`
/// (input index and what is known of it), or an error naming the node when kiln cannot
/// compile it after them.
fn propagate(graph: &Graph, node: &Node, inputs: &[(usize, Dynamic)]) -> Result<Vec<(usize, Dynamic)>> {
    let (first_input, first) = &inputs[0];
    let refuse = |why: &str| {
        let v = node.inputs[*first_input].expect("a dynamic input is present");
        let root = graph.node(first.root.node);
        CodegenError::unsupported(
            &node.name,
            node.op.name(),
            format!(
                "reads '{}', whose extent along axis {} depends on the data ({} '{}'), {why}; after such a value kiln compiles elementwise operators, Cast, Identity, Gather, Slice, Split, Concat, Reshape, Flatten, Squeeze, Unsqueeze and Transpose that keep that axis apart",
                graph.value_name(v),
                first.axis,
                root.op.name(),
                root.name,
            ),
        )
    };
    if inputs.iter().any(|(_, d)| d.root != first.root) {
        return Err(refuse(
            "together with a value whose extent depends on another selection",
        ));
    }
    let out_ty = |o: usize| &node.outputs[o].ty;
    let out_rank = out_ty(0).rank();
    let in_ty = |i: usize| node.inputs.get(i).copied().flatten().map(|v| graph.value_type(v));
    // Every operator but Identity computes on the bound, so it needs the padded layout.
    if !matches!(node.op, Op::Identity) && inputs.iter().any(|(_, d)| d.placement == Placement::Compact) {
        return Err(refuse(
            "which its operator writes compacted (only a graph output can take it)",
        ));
    }
    let known_axes = |i: usize, rank: usize| -> Option<Vec<usize>> {
        let t = graph.known_value(node.inputs.get(i).copied().flatten()?)?;
        t.to_i64_vec()
            .iter()
            .map(|&a| kiln_ir::ops::util::norm_axis(a, rank).ok())
            .collect()
    };
    let same = |axis: usize, fill: Option<f64>| Dynamic {
        axis,
        fill,
        ..first.clone()
    };
    let (axis, fill) = match &node.op {
        Op::Identity => return Ok(vec![(0, first.clone())]),
        op if op.family() == OpFamily::Elementwise => {
            // Inputs broadcast from the right: each dynamic one must land on the same axis,
            // and every other input must be 1 (or absent) there.
            let axis = out_rank - in_ty(*first_input).map_or(0, |t| t.rank()) + first.axis;
            for (i, v) in node.inputs.iter().enumerate() {
                let Some(v) = v else { continue };
                let ty = graph.value_type(*v);
                let Some(at) = (axis + ty.rank()).checked_sub(out_rank) else {
                    continue;
                };
                match inputs.iter().find(|(k, _)| *k == i) {
                    Some((_, d)) if d.axis == at => {}
                    Some(_) => return Err(refuse("broadcast against itself on another axis")),
                    None if ty.shape[at] == Dim::Fixed(1) => {}
                    None => return Err(refuse("broadcast against a value that is not 1 along that axis")),
                }
            }
            (axis, elementwise_fill(graph, node, inputs))
        }
        Op::Transpose { perm } => match perm.iter().position(|&p| p == first.axis) {
            Some(a) => (a, first.fill),
            None => return Err(refuse("with a permutation that drops that axis")),
        },
        Op::Gather { axis } => {
            let data = in_ty(0).expect("Gather has data");
            let ga = kiln_ir::ops::util::norm_axis(*axis, data.rank()).map_err(|e| refuse(&e.to_string()))?;
            let idx_rank = in_ty(1).map_or(0, |t| t.rank());
            match (inputs.len(), *first_input) {
                (1, 0) if ga == first.axis => return Err(refuse("gathering along that axis")),
                (1, 0) if first.axis < ga => (first.axis, first.fill),
                (1, 0) => (first.axis - 1 + idx_rank, first.fill),
                (1, 1) => {
                    let n = data.shape[ga].fixed().unwrap_or(0) as f64;
                    match first.fill {
                        Some(p) if p.fract() == 0.0 && p >= -n && p < n => (ga + first.axis, None),
                        _ => {
                            return Err(refuse(
                                "as indices whose positions past the count are not known to be valid indices",
                            ))
                        }
                    }
                }
                _ => return Err(refuse("as both data and indices")),
            }
        }
        Op::Slice => {
            let rank = in_ty(0).map_or(0, |t| t.rank());
            let axes = match node.inputs.get(3).copied().flatten() {
                Some(_) => known_axes(3, rank),
                None => {
                    let starts = node
                        .inputs
                        .get(1)
                        .copied()
                        .flatten()
                        .and_then(|v| graph.known_value(v));
                    starts.map(|s| (0..s.len()).collect())
                }
            };
            match axes {
                Some(axes) if !axes.contains(&first.axis) => (first.axis, first.fill),
                Some(_) => return Err(refuse("slicing along that axis")),
                None => return Err(refuse("with slice axes that are not known at compile time")),
            }
        }
        Op::Concat { axis } => {
            let ca = kiln_ir::ops::util::norm_axis(*axis, out_rank).map_err(|e| refuse(&e.to_string()))?;
            let present = node.inputs.iter().flatten().count();
            if ca == first.axis {
                return Err(refuse("concatenating along that axis"));
            }
            if inputs.len() != present || inputs.iter().any(|(_, d)| d.axis != first.axis) {
                return Err(refuse("with values whose extent along that axis is static"));
            }
            let fill = first
                .fill
                .filter(|f| inputs.iter().all(|(_, d)| d.fill == Some(*f)));
            (first.axis, fill)
        }
        Op::Split { axis, .. } => {
            let rank = in_ty(0).map_or(0, |t| t.rank());
            match kiln_ir::ops::util::norm_axis(*axis, rank) {
                Ok(a) if a != first.axis => (first.axis, first.fill),
                Ok(_) => return Err(refuse("splitting along that axis")),
                Err(e) => return Err(refuse(&e.to_string())),
            }
        }
        Op::Squeeze => {
            let rank = in_ty(0).map_or(0, |t| t.rank());
            match known_axes(1, rank) {
                Some(axes) if !axes.contains(&first.axis) => (
                    first.axis - axes.iter().filter(|&&a| a < first.axis).count(),
                    first.fill,
                ),
                Some(_) => return Err(refuse("squeezing that axis")),
                None => return Err(refuse("without squeeze axes known at compile time")),
            }
        }
        Op::Unsqueeze => match known_axes(1, out_rank) {
            // The output positions that are not new take the input's axes in order.
            Some(axes) => {
                let kept: Vec<usize> = (0..out_rank).filter(|p| !axes.contains(p)).collect();
                match kept.get(first.axis) {
                    Some(&a) => (a, first.fill),
                    None => return Err(refuse("with invalid axes")),
                }
            }
            None => return Err(refuse("without unsqueeze axes known at compile time")),
        },
        Op::Reshape { .. } | Op::Flatten { .. } => {
            // The dims before the axis stay, and the rows after it keep their size.
            let (inp, out) = (&in_ty(0).expect("has data").shape, &out_ty(0).shape);
            let a = first.axis;
            let fixed = |ds: &[Dim]| ds.iter().map(|d| d.fixed()).collect::<Option<Vec<usize>>>();
            let keeps = out.len() > a
                && fixed(&inp[..a]).is_some()
                && fixed(&inp[..a]) == fixed(&out[..a])
                && matches!(
                    (fixed(&inp[a + 1..]), fixed(&out[a + 1..])),
                    (Some(x), Some(y)) if x.iter().product::<usize>() == y.iter().product::<usize>()
                );
            if !keeps {
                return Err(refuse(
                    "into a shape that does not keep that axis and the size of what follows it",
                ));
            }
            (a, first.fill)
        }
        _ => return Err(refuse("with an operator that would need the count")),
    };
    let placement = match node.outputs.first() {
        Some(o)
            if o.ty.shape[..axis.min(o.ty.rank())]
                .iter()
                .all(|d| *d == Dim::Fixed(1)) =>
        {
            Placement::Both
        }
        _ => Placement::Padded,
    };
    Ok((0..node.outputs.len())
        .map(|o| {
            (
                o,
                Dynamic {
                    placement,
                    ..same(axis, fill)
                },
            )
        })
        .collect())
}

/// What an elementwise node writes past the count: the operator applied to its dynamic inputs'
/// fills and its other inputs where these are one repeated value; None otherwise.
fn elementwise_fill(graph: &Graph, node: &Node, inputs: &[(usize, Dynamic)]) -> Option<f64> {
    let mut scalars: Vec<Option<Tensor>> = vec![];
    for (i, v) in node.inputs.iter().enumerate() {
        let Some(v) = v else {
            scalars.push(None);
            continue;
        };
        let dtype = graph.value_type(*v).dtype;
        let x = match inputs.iter().find(|(k, _)| *k == i) {
            Some((_, d)) => d.fill?,
            None => {
                let t = graph.known_value(*v)?;
                let vals = t.to_f64_vec();
                let first = *vals.first()?;
                if vals.iter().any(|x| x.to_bits() != first.to_bits()) {
                    return None;
                }
                first
            }
        };
        scalars.push(Some(scalar(dtype, x)?));
    }
    let out_types: Vec<TensorType> = node
        .outputs
        .iter()
        .map(|o| TensorType::fixed(o.ty.dtype, &[]))
        .collect();
    let cx = EvalCtx {
        inputs: scalars.iter().map(|t| t.as_ref()).collect(),
        out_types: &out_types,
    };
    let out = kiln_ir::ops::eval(&node.op, &cx).ok()?;
    out.first()?.to_f64_vec().first().copied()
}

fn scalar(dtype: DType, x: f64) -> Option<Tensor> {
    Tensor::new(vec![], TensorData::from_f64s(dtype, [x])).ok()
}

/// `graph` with every data-dependent value bounded (see the module docs).
pub fn bound_outputs(graph: &Graph) -> Result<Bounded<'_>> {
    let analysis = analyze(graph)?;
    if analysis.roots.is_empty() {
        return Ok(Bounded {
            graph: Cow::Borrowed(graph),
            outputs: vec![],
        });
    }
    let mut g = graph.clone();
    for id in graph.node_ids() {
        let node = graph.node(id);
        let outs: Vec<usize> = (0..node.outputs.len())
            .filter(|&o| analysis.values.contains_key(&id.out(o as u32)))
            .collect();
        if outs.is_empty() {
            continue;
        }
        let types: Vec<TensorType> = match root_axis(graph, id.out(outs[0] as u32)) {
            Some(_) => {
                let mut types: Vec<TensorType> = node.outputs.iter().map(|o| o.ty.clone()).collect();
                for &o in &outs {
                    // A root without a bound (its inputs are not static) stays as it is; planning
                    // reports its shape.
                    let Some(bound) = upper_bound(graph, id.out(o as u32)) else {
                        return Ok(Bounded {
                            graph: Cow::Borrowed(graph),
                            outputs: vec![],
                        });
                    };
                    types[o] = TensorType::fixed(types[o].dtype, &bound);
                }
                types
            }
            None => {
                let cx = InferCtx {
                    inputs: node.inputs.iter().map(|v| v.map(|v| g.value_type(v))).collect(),
                    values: node
                        .inputs
                        .iter()
                        .map(|v| v.and_then(|v| g.known_value(v)))
                        .collect(),
                    num_outputs: node.outputs.len(),
                };
                kiln_ir::ops::infer(&node.op, &cx)
                    .map_err(|e| CodegenError::unsupported(&node.name, node.op.name(), e.to_string()))?
            }
        };
        for o in outs {
            g.bound_value_type(id.out(o as u32), types[o].clone())
                .map_err(|e| {
                    CodegenError::unsupported(&node.name, node.op.name(), format!("bounding its output: {e}"))
                })?;
        }
    }
    let outputs = graph
        .outputs()
        .iter()
        .enumerate()
        .filter(|(_, o)| analysis.values.contains_key(&o.value))
        .map(|(j, _)| j)
        .collect();
    Ok(Bounded {
        graph: Cow::Owned(g),
        outputs,
    })
}

/// The static shape that bounds `v`, a root, when its operator's inputs have static shapes.
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

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{Binary, ReduceKind, Tensor, Unary};

    /// `NonMaxSuppression` of 8 boxes in 2 classes (at most 3 each), and the graph builder.
    fn nms(g: &mut Graph) -> ValueId {
        let boxes = g.add_input("boxes", TensorType::fixed(DType::F32, &[1, 8, 4]));
        let scores = g.add_input("scores", TensorType::fixed(DType::F32, &[1, 2, 8]));
        let max = g.add_const("max", Tensor::from_vec(vec![1], vec![3i64]));
        g.add(
            "nms",
            Op::Vision(VisionOp::NonMaxSuppression {
                center_point_box: false,
            }),
            vec![Some(boxes), Some(scores), Some(max)],
            "selected",
        )
        .unwrap()
    }

    /// Column `c` of the selected indices: `Gather(selected, c, axis=1)`, `[count]`.
    fn column(g: &mut Graph, sel: ValueId, c: i64) -> ValueId {
        let at = g.add_const(format!("col{c}"), Tensor::scalar(c));
        g.add(
            format!("gather{c}"),
            Op::Gather { axis: 1 },
            vec![Some(sel), Some(at)],
            format!("c{c}"),
        )
        .unwrap()
    }

    fn gather_boxes(g: &mut Graph, idx: ValueId) -> ValueId {
        let table = g.add_const("table", Tensor::from_vec(vec![8, 2], vec![0.5f32; 16]));
        g.add(
            "pick",
            Op::Gather { axis: 0 },
            vec![Some(table), Some(idx)],
            "picked",
        )
        .unwrap()
    }

    #[test]
    fn the_count_reaches_outputs_through_gathers_and_arithmetic() {
        let mut g = Graph::new("g");
        let sel = nms(&mut g);
        let (cls, bx) = (column(&mut g, sel, 1), column(&mut g, sel, 2));
        // Split into its three columns, as exporters also write it.
        let parts = g
            .add_node(
                "split",
                Op::Split {
                    axis: 1,
                    num_outputs: Some(3),
                },
                vec![Some(sel)],
                vec!["b".into(), "k".into(), "i".into()],
            )
            .unwrap();
        // A flat index, class * 8 + box: zero where both are, so a valid index past the count.
        let eight = g.add_const("eight", Tensor::scalar(8i64));
        let scaled = g
            .add("mul", Op::Binary(Binary::Mul), vec![Some(cls), Some(eight)], "m")
            .unwrap();
        let flat = g
            .add("add", Op::Binary(Binary::Add), vec![Some(scaled), Some(bx)], "f")
            .unwrap();
        let picked = gather_boxes(&mut g, flat);
        g.add_output("selected", sel);
        g.add_output("picked", picked);
        let a = analyze(&g).unwrap();
        assert_eq!(a.values[&flat].fill, Some(0.0));
        assert_eq!(a.values[&picked].axis, 0);
        assert!(parts
            .iter()
            .all(|v| a.values[v].axis == 0 && a.values[v].fill == Some(0.0)));
        assert_eq!(a.roots.len(), 1);
        assert_eq!(a.roots[0].outputs, vec![(0, 0), (1, 0)]);
        let b = bound_outputs(&g).unwrap();
        assert_eq!(b.outputs, vec![0, 1]);
        // 1 batch entry × 2 classes × 3 boxes.
        assert_eq!(
            b.graph.value_type(picked),
            &TensorType::fixed(DType::F32, &[6, 2])
        );
        assert_eq!(output_counts(&b.graph).unwrap(), vec![(0, 0), (1, 0)]);
    }

    #[test]
    fn indices_whose_fill_may_be_out_of_range_are_refused() {
        let mut g = Graph::new("g");
        let sel = nms(&mut g);
        let bx = column(&mut g, sel, 2);
        // Past the count, 0 + 9 indexes past the 8 rows.
        let nine = g.add_const("nine", Tensor::scalar(9i64));
        let far = g
            .add("add", Op::Binary(Binary::Add), vec![Some(bx), Some(nine)], "far")
            .unwrap();
        let picked = gather_boxes(&mut g, far);
        g.add_output("picked", picked);
        let err = analyze(&g).unwrap_err().to_string();
        assert!(
            err.contains("'pick'") && err.contains("not known to be valid indices"),
            "{err}"
        );
    }

    #[test]
    fn operators_that_need_the_count_are_refused_by_name() {
        let mut g = Graph::new("g");
        let sel = nms(&mut g);
        let f = g
            .add("cast", Op::Cast { to: DType::F32 }, vec![Some(sel)], "f")
            .unwrap();
        let e = g.add("exp", Op::Unary(Unary::Exp), vec![Some(f)], "e").unwrap();
        let axes = g.add_const("axes", Tensor::from_vec(vec![1], vec![0i64]));
        let r = g
            .add(
                "sum",
                Op::Reduce {
                    kind: ReduceKind::Sum,
                    keepdims: false,
                    noop_with_empty_axes: false,
                },
                vec![Some(e), Some(axes)],
                "sum",
            )
            .unwrap();
        g.add_output("sum", r);
        let err = analyze(&g).unwrap_err().to_string();
        assert!(
            err.contains("'sum'") && err.contains("would need the count"),
            "{err}"
        );
    }

    #[test]
    fn nonzero_read_by_a_kernel_writes_its_bound_layout_and_cannot_be_an_output() {
        let mut g = Graph::new("g");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[3, 4]));
        let nz = g.add("nz", Op::NonZero, vec![Some(x)], "nz").unwrap();
        assert!(!writes_padded(&g, nz));
        let t = g
            .add("t", Op::Transpose { perm: vec![1, 0] }, vec![Some(nz)], "t")
            .unwrap();
        g.add_output("coords", t);
        assert!(writes_padded(&g, nz));
        let a = analyze(&g).unwrap();
        assert_eq!(
            (a.values[&nz].placement, a.values[&t].placement),
            (Placement::Padded, Placement::Both)
        );
        assert_eq!(a.roots[0].outputs, vec![(0, 0)]);
        assert_eq!(padded_values(&g), vec![nz]);
        g.add_output("nz", nz);
        let err = analyze(&g).unwrap_err().to_string();
        assert!(
            err.contains("output 'nz'") && err.contains("would not come first"),
            "{err}"
        );
    }
}
