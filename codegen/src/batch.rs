//! Batch ranges: `--input-shape x=1..8,3,224,224` compiles one artifact that runs any batch of
//! 1 to 8 samples.
//!
//! kiln compiles the *per-sample program* — the graph with the batch axis bound to 1 — and the
//! run calls it once per sample, each call reading and writing that sample's slice of the
//! batched inputs and outputs (`kiln_rt_run_shaped`). The kernels stay static-shaped (nothing is
//! slower than the fixed-shape build of one sample), the arena is planned for one sample, and
//! nothing is allocated per run.
//!
//! That is exact only when the model treats samples independently: the batch of `n` samples
//! gives the same values as `n` runs of one. This module proves it, or names the node where it
//! fails, by comparing the graph imported at batch 1 with the same graph imported at a larger
//! *probe* batch. Every value is
//!
//! - **batched** along an axis: that axis grows with the batch (`n·a` at batch `n`, `a` per
//!   sample) and sample `b`'s values sit at `b·a..(b+1)·a` along it. Graph inputs and outputs
//!   have it on axis 0, so that a sample is a contiguous slice; inside the graph it may move
//!   (the sequence-first layout `nn.MultiheadAttention` transposes to);
//! - **fixed**: the same type and the same values at every batch (weights, shape arithmetic on
//!   the other axes);
//! - **batch-sized**: the same type, values that depend on the batch size (a `Shape` that
//!   includes axis 0). Allowed only where it sets the shape of a batched value (Reshape,
//!   Expand, ConstantOfShape, Resize's sizes), whose type the probe checks.
//!
//! An operator with a batched input must act on each sample alone, and its output's batch axis
//! (which the probe's types show) must be where the operator puts the input's: elementwise
//! operators whose other operands do not vary along it, convolutions and pooling (batch on
//! axis 0), normalizations, softmax and reductions over other axes, products whose batched
//! operand keeps it out of the contraction, Transpose moving it where its permutation says,
//! reshapes that keep the same number of elements before it, and data movement that leaves it
//! whole. Anything else (a reduction or a Concat along the batch, MaxPool's flat Indices, a
//! recurrent cell, DynamicQuantizeLinear's whole-tensor range) is refused with the node's name.

use crate::error::{CodegenError, Result};
use kiln_ir::{Dim, Graph, Node, Op, QuantOp, TensorType, ValueId};
use std::collections::HashMap;

/// The batch a graph compiled for a range serves: which inputs and outputs are batched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// The batch sizes a run accepts, `lo..=hi`.
    pub lo: usize,
    pub hi: usize,
    /// Per graph input: whether its axis 0 is the batch.
    pub inputs: Vec<bool>,
    /// Per graph output: whether its axis 0 is the batch (the others are the same for every
    /// sample and written once per sample).
    pub outputs: Vec<bool>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// The samples stack along `axis`, in `outer` interleaved runs: at batch `n` the axis has
    /// `outer·n·a` entries and sample `b`'s `o`-th run of `a` starts at `(o·n + b)·a` (a
    /// sequence-first `[S·B, E]` has `outer` S). 0: the same values for every sample, which
    /// stack any way.
    Batched {
        axis: usize,
        outer: usize,
    },
    Fixed,
    BatchSized,
}

impl Kind {
    fn axis(self) -> Option<usize> {
        match self {
            Kind::Batched { axis, .. } => Some(axis),
            _ => None,
        }
    }

    fn outer(self) -> usize {
        match self {
            Kind::Batched { outer, .. } => outer,
            _ => 0,
        }
    }
}

/// Samples stacked whole along axis 0: what graph inputs and outputs need.
const STACKED: Kind = Kind::Batched { axis: 0, outer: 1 };

/// The common run count of batched values (0 for those that fit any), or None when two differ.
fn common_outer(kinds: impl IntoIterator<Item = Kind>) -> Option<usize> {
    let mut outer = 0;
    for k in kinds {
        match (outer, k.outer()) {
            (_, 0) => {}
            (0, o) => outer = o,
            (a, b) if a != b => return None,
            _ => {}
        }
    }
    Some(outer)
}

/// The output's run count (`Kind::Batched::outer`), or why the node does not act per sample.
type Outer = std::result::Result<usize, String>;

/// An output axis the probe could not tell: the rules check everything but where it goes.
const UNKNOWN: usize = usize::MAX;

/// Checks that `per_sample` (the graph at batch 1) may run a batch sample by sample, `probe`
/// being the same model imported at batch `probe_n` (> 1), and says which inputs and outputs
/// are batched. Errors name the node that mixes samples.
pub fn analyze(per_sample: &Graph, probe: &Graph, probe_n: usize, lo: usize, hi: usize) -> Result<Batch> {
    let refuse = |node: &Node, msg: String| CodegenError::unsupported(&node.name, node.op.name(), msg);
    if per_sample.len() != probe.len() {
        return Err(CodegenError::unsupported(
            &per_sample.name,
            "graph",
            format!(
                "the model's graph changes with the batch size ({} nodes at batch 1, {} at batch {probe_n}), so one compiled graph cannot serve a batch range",
                per_sample.len(),
                probe.len()
            ),
        ));
    }
    let live = live_nodes(per_sample);
    let shape_only = read_for_shape_only(per_sample, &live);
    let mut kinds: HashMap<ValueId, Kind> = HashMap::new();
    // Batched values holding sample positions: at sample b, the per-sample value plus
    // b·offset (see `indexed_rule`). Absent: offset 0.
    let mut offsets: HashMap<ValueId, i64> = HashMap::new();
    // Index tuples along the last axis whose components hold sample positions: per component,
    // the offset as in `offsets` (see `tuple_rule`).
    let mut tuples: HashMap<ValueId, Vec<i64>> = HashMap::new();
    for (id, (node, other)) in per_sample
        .node_ids()
        .zip(per_sample.nodes().iter().zip(probe.nodes()))
    {
        if std::mem::discriminant(&node.op) != std::mem::discriminant(&other.op)
            || node.inputs.len() != other.inputs.len()
            || node.outputs.len() != other.outputs.len()
        {
            return Err(refuse(
                node,
                format!("the model imports differently at batch {probe_n} than at batch 1 here"),
            ));
        }
        let out = |k: usize| ValueId {
            node: id,
            output: k as u32,
        };
        if !live[id.index()] {
            // Computes nothing the outputs read (the passes remove it).
            continue;
        }
        let ins: Vec<Option<Kind>> = node.inputs.iter().map(|v| v.map(|v| kinds[&v])).collect();
        let any_batched = ins.iter().flatten().any(|k| k.axis().is_some());
        let sized = ins.contains(&Some(Kind::BatchSized));
        let tups: Vec<Option<Vec<i64>>> = node
            .inputs
            .iter()
            .map(|v| v.and_then(|v| tuples.get(&v).cloned()))
            .collect();
        let offs: Vec<i64> = node
            .inputs
            .iter()
            .map(|v| v.and_then(|v| offsets.get(&v).copied()).unwrap_or(0))
            .collect();
        for (k, (o1, op)) in node.outputs.iter().zip(&other.outputs).enumerate() {
            let (t1, tp) = (&o1.ty, &op.ty);
            let axis = batch_axis(t1, tp, probe_n);
            let kind = if matches!(node.op, Op::Input) {
                match (axis, t1 == tp) {
                    (Some(0), _) => STACKED,
                    (None, true) => Kind::Fixed,
                    _ => {
                        return Err(refuse(
                            node,
                            format!("input is {t1} at batch 1 and {tp} at batch {probe_n}: a batched input needs the batch on axis 0"),
                        ))
                    }
                }
            } else if any_batched && !matches!(node.op, Op::Shape { .. } | Op::Size) {
                let Some(axis) = axis else {
                    // The operator's own reason first (a reduction over the batch, ...).
                    if offs.iter().all(|&o| o == 0) {
                        per_sample_rule(per_sample, node, &ins, UNKNOWN).map_err(|why| refuse(node, why))?;
                    }
                    return Err(refuse(
                        node,
                        format!(
                            "its output {} is {t1} at batch 1 and {tp} at batch {probe_n}: the samples do not stay on one axis",
                            o1.name
                        ),
                    ));
                };
                let positions = offs.iter().any(|&o| o != 0) || tups.iter().any(Option::is_some);
                let outer = if shape_only[id.index()] {
                    // Only its shape is read (a broadcast shape computed from positions).
                    0
                } else if positions && matches!(node.op, Op::Concat { .. } | Op::GatherND { .. }) {
                    let (tuple, outer) = tuple_rule(per_sample, node, &ins, &offs, &tups, axis)
                        .map_err(|why| refuse(node, why))?;
                    if let Some(t) = tuple {
                        tuples.insert(out(k), t);
                    }
                    outer
                } else if tups.iter().any(Option::is_some) {
                    return Err(refuse(
                        node,
                        "it computes with index tuples holding positions in the batch".into(),
                    ));
                } else if positions {
                    let (offset, outer) =
                        indexed_rule(per_sample, node, &ins, &offs, axis).map_err(|why| refuse(node, why))?;
                    if offset != 0 {
                        offsets.insert(out(k), offset);
                    }
                    outer
                } else {
                    per_sample_rule(per_sample, node, &ins, axis).map_err(|why| refuse(node, why))?
                };
                Kind::Batched { axis, outer }
            } else if let (true, Some(axis), Op::Expand | Op::ConstantOfShape { .. }) =
                (sized, axis, &node.op)
            {
                // Fixed values broadcast to a batch-sized shape: the same for every sample.
                Kind::Batched { axis, outer: 0 }
            } else if let (true, Op::Range) = (sized, &node.op) {
                // 0..n·a, what exporters gather a sample's rows with: at sample b, the per-sample
                // 0..a plus b·a.
                let a =
                    sample_range(per_sample, node, probe, other, probe_n).map_err(|why| refuse(node, why))?;
                offsets.insert(out(k), a);
                STACKED
            } else {
                // Shape arithmetic and constants: fixed where the probe shows the same values.
                match (per_sample.known_value(out(k)), probe.known_value(out(k))) {
                    (Some(a), Some(b)) if a == b && t1 == tp => Kind::Fixed,
                    (Some(_), Some(_)) => Kind::BatchSized,
                    _ if t1 != tp => {
                        return Err(refuse(
                            node,
                            format!(
                                "its output {} is {t1} at batch 1 and {tp} at batch {probe_n}: it depends on the batch size in a way kiln cannot run sample by sample",
                                o1.name
                            ),
                        ))
                    }
                    _ if sized || any_batched => Kind::BatchSized,
                    _ => Kind::Fixed,
                }
            };
            kinds.insert(out(k), kind);
        }
    }
    let inputs = per_sample
        .inputs()
        .iter()
        .map(|&id| kinds[&ValueId { node: id, output: 0 }] == STACKED)
        .collect::<Vec<_>>();
    if !inputs.contains(&true) {
        return Err(CodegenError::unsupported(
            &per_sample.name,
            "graph",
            "no input's axis 0 follows the batch range",
        ));
    }
    let mut outputs = vec![];
    for o in per_sample.outputs() {
        let refuse = |why: String| {
            CodegenError::unsupported(&o.name, "graph output", format!("output '{}' {why}", o.name))
        };
        if offsets.contains_key(&o.value) || tuples.contains_key(&o.value) {
            return Err(refuse("holds positions in the batch".into()));
        }
        match kinds[&o.value] {
            Kind::Batched {
                axis: 0,
                outer: 0 | 1,
            } => outputs.push(true),
            Kind::Batched { axis, outer } => {
                let at = match axis {
                    0 => format!("interleaves the samples in {outer} runs along axis 0"),
                    _ => format!("has the batch on axis {axis}"),
                };
                return Err(refuse(format!(
                    "{at}; the samples of a graph output must be whole, one after another on axis 0"
                )));
            }
            Kind::Fixed => outputs.push(false),
            Kind::BatchSized => return Err(refuse("holds values computed from the batch size".into())),
        }
    }
    Ok(Batch {
        lo,
        hi,
        inputs,
        outputs,
    })
}

/// Which nodes the graph outputs depend on.
fn live_nodes(g: &Graph) -> Vec<bool> {
    let mut live = vec![false; g.len()];
    let mut stack: Vec<kiln_ir::NodeId> = g.outputs().iter().map(|o| o.value.node).collect();
    while let Some(n) = stack.pop() {
        if std::mem::replace(&mut live[n.index()], true) {
            continue;
        }
        stack.extend(g.node(n).inputs.iter().flatten().map(|v| v.node));
    }
    live
}

/// Per node: whether every live reader of its outputs reads only their shape (`Shape`, `Size`),
/// so that their values never matter.
fn read_for_shape_only(g: &Graph, live: &[bool]) -> Vec<bool> {
    let mut only = vec![true; g.len()];
    for o in g.outputs() {
        only[o.value.node.index()] = false;
    }
    for (id, node) in g.node_ids().zip(g.nodes()) {
        if !live[id.index()] || matches!(node.op, Op::Shape { .. } | Op::Size) {
            continue;
        }
        for v in node.inputs.iter().flatten() {
            only[v.node.index()] = false;
        }
    }
    only
}

/// The one axis along which `probe` is `per_sample` scaled by `n`, if there is one.
fn batch_axis(per_sample: &TensorType, probe: &TensorType, n: usize) -> Option<usize> {
    if per_sample.dtype != probe.dtype || per_sample.rank() != probe.rank() {
        return None;
    }
    let mut axis = None;
    for (i, (a, b)) in per_sample.shape.iter().zip(&probe.shape).enumerate() {
        match (a, b) {
            _ if a == b => {}
            (Dim::Fixed(a), Dim::Fixed(b)) if *a > 0 && a * n == *b && axis.is_none() => axis = Some(i),
            _ => return None,
        }
    }
    axis
}

/// The dims of a node's input or output in the per-sample graph.
fn dims(g: &Graph, v: ValueId) -> Vec<usize> {
    g.value_type(v)
        .shape
        .iter()
        .map(|d| d.fixed().unwrap_or(0))
        .collect()
}

/// Why `node` (its inputs' kinds `ins`, its first output batched along `k` in the probe) would
/// not act on each sample alone, or put the samples elsewhere than on `k`; `Ok` when it does.
fn per_sample_rule(g: &Graph, node: &Node, ins: &[Option<Kind>], k: usize) -> Outer {
    use Kind::*;
    let rank = |i: usize| {
        node.inputs
            .get(i)
            .copied()
            .flatten()
            .map_or(0, |v| g.value_type(v).rank())
    };
    let out_rank = node.outputs[0].ty.rank();
    let axis_of = |i: usize| ins.get(i).copied().flatten().and_then(Kind::axis);
    // The first batched input and its batch axis.
    let (first, i, outer) = ins
        .iter()
        .enumerate()
        .find_map(|(n, k)| k.and_then(|k| k.axis().map(|a| (n, a, k.outer()))))
        .expect("a batched input");
    let expect = |want: usize| match k == want || k == UNKNOWN {
        true => Ok(outer),
        false => Err(format!(
            "its output has the samples on axis {k}, where it puts axis {want}"
        )),
    };
    let only_first_batched =
        || match first == 0 && ins.iter().skip(1).all(|k| k.and_then(Kind::axis).is_none()) {
            true => Ok(()),
            false => Err("only its first input may carry the batch".to_string()),
        };
    let no_sized = |from: usize| match ins.iter().skip(from).any(|k| *k == Some(BatchSized)) {
        true => Err("an operand is computed from the batch size".to_string()),
        false => Ok(()),
    };
    let along = |what: &str| Err(format!("it {what} along the batch (axis {i})"));
    let known_ints = |n: usize| known_ints(g, node, n);
    match &node.op {
        Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Clip | Op::Cast { .. } | Op::Identity => {
            no_sized(0)?;
            elementwise(g, node, ins, k)
        }
        Op::Quant(QuantOp::QuantizeLinear { axis, .. } | QuantOp::DequantizeLinear { axis, .. }) => {
            only_first_batched()?;
            no_sized(0)?;
            let vector_scale = node
                .inputs
                .get(1)
                .copied()
                .flatten()
                .is_some_and(|v| g.value_type(v).rank() > 0);
            if vector_scale && norm(*axis, rank(0)) == Some(i) {
                return along("scales its channels");
            }
            expect(i)
        }
        Op::Conv(_)
        | Op::ConvTranspose(_)
        | Op::BatchNorm { .. }
        | Op::InstanceNorm { .. }
        | Op::GroupNorm { .. }
        | Op::GlobalPool(_)
        | Op::Pool(_)
        | Op::Resize(_)
        | Op::DepthToSpace { .. }
        | Op::SpaceToDepth { .. }
        | Op::Quant(QuantOp::ConvInteger(_) | QuantOp::QLinearConv(_)) => {
            only_first_batched()?;
            // Resize's sizes may come from the batch size (the probe checks its output).
            if !matches!(node.op, Op::Resize(_)) {
                no_sized(1)?;
            }
            if node.outputs.len() > 1 && matches!(node.op, Op::Pool(_)) {
                return Err("MaxPool's Indices count across the whole batch".into());
            }
            match i {
                0 => expect(0),
                _ => Err(format!(
                    "its input has the samples on axis {i}, not on axis 0 (N)"
                )),
            }
        }
        Op::LayerNorm { axis, .. } | Op::Misc(kiln_ir::MiscOp::RmsNorm { axis, .. }) => {
            only_first_batched()?;
            no_sized(0)?;
            match norm(*axis, rank(0)) {
                Some(a) if i < a => expect(i),
                _ => along("normalizes"),
            }
        }
        Op::LpNorm { axis, .. } => match norm(*axis, rank(0)) {
            Some(a) if a != i => expect(i),
            _ => along("normalizes"),
        },
        Op::MeanVarianceNorm { axes } => match axes.iter().any(|&a| norm(a, rank(0)) == Some(i)) {
            true => along("normalizes"),
            false => expect(i),
        },
        Op::Softmax { axis, coerce_2d }
        | Op::LogSoftmax { axis, coerce_2d }
        | Op::Hardmax { axis, coerce_2d } => match (norm(*axis, rank(0)), coerce_2d) {
            (Some(a), true) if i < a => expect(i),
            (Some(a), false) if i != a => expect(i),
            _ => along("normalizes"),
        },
        Op::ArgMax { axis, keepdims, .. } | Op::ArgMin { axis, keepdims, .. } => match norm(*axis, rank(0)) {
            Some(a) if a != i => expect(if *keepdims || i < a { i } else { i - 1 }),
            _ => along("searches"),
        },
        Op::TopK { axis, .. } => {
            only_first_batched()?;
            no_sized(1)?;
            match norm(*axis, rank(0)) {
                Some(a) if a != i => expect(i),
                _ => along("searches"),
            }
        }
        Op::CumSum { .. } | Op::CumProd { .. } => {
            only_first_batched()?;
            match known_ints(1).as_deref() {
                Some([a]) if norm(*a, rank(0)) != Some(i) => expect(i),
                Some([_]) => along("accumulates"),
                _ => Err("its axis is not known at compile time".into()),
            }
        }
        Op::Reduce {
            keepdims,
            noop_with_empty_axes,
            ..
        } => {
            only_first_batched()?;
            let axes = match (node.inputs.get(1).copied().flatten(), known_ints(1)) {
                (None, _) if *noop_with_empty_axes => vec![],
                (Some(_), Some(axes)) if !axes.is_empty() || *noop_with_empty_axes => axes,
                (Some(_), None) => return Err("its axes are not known at compile time".into()),
                _ => return along("reduces"),
            };
            let axes: Vec<usize> = axes.iter().filter_map(|&a| norm(a, rank(0))).collect();
            if axes.contains(&i) {
                return along("reduces");
            }
            let before = if *keepdims {
                0
            } else {
                axes.iter().filter(|&&a| a < i).count()
            };
            expect(i - before)
        }
        Op::Transpose { perm } => match perm.iter().position(|&p| p == i) {
            Some(p) => expect(p),
            None => Err("a bad permutation".into()),
        },
        Op::Reshape { .. } | Op::Flatten { .. } | Op::Squeeze | Op::Unsqueeze => {
            only_first_batched()?;
            // Row-major order is kept, so the samples stay whole blocks along `k` exactly when
            // as many elements come before `k` in the output as before `i` in the input.
            let before = |d: &[usize], a: usize| d[..a].iter().product::<usize>();
            let (din, dout) = (dims(g, node.inputs[0].expect("data")), &node.outputs[0].ty);
            let dout: Vec<usize> = dout.shape.iter().map(|d| d.fixed().unwrap_or(0)).collect();
            // The runs of samples before the batch: prod(dims before i)·outer in the input; the
            // output splits them into its dims before k and its own runs.
            let mixes = || {
                Err(format!(
                    "it mixes the samples (axis {i}) with the dims around them"
                ))
            };
            if k == UNKNOWN {
                return mixes();
            }
            let (runs, before_k) = (before(&din, i) * outer.max(1), before(&dout, k));
            match (before_k > 0 && runs % before_k == 0, dout.get(k)) {
                (true, Some(&extent)) if extent % (runs / before_k) == 0 => Ok(runs / before_k),
                _ => mixes(),
            }
        }
        Op::Expand => {
            only_first_batched()?;
            expect(i + out_rank - rank(0))
        }
        Op::Concat { axis } => {
            if ins.iter().any(|kind| kind.and_then(Kind::axis) != Some(i)) {
                return Err("it joins batched values with values that are not".into());
            }
            let outer = common_outer(ins.iter().flatten().copied())
                .ok_or("its inputs interleave the samples differently")?;
            match norm(*axis, out_rank) {
                Some(a) if a != i => expect(i).map(|_| outer),
                _ => along("concatenates"),
            }
        }
        Op::Split { axis, .. } => {
            only_first_batched()?;
            no_sized(1)?;
            match norm(*axis, rank(0)) {
                Some(a) if a != i => expect(i),
                _ => along("splits"),
            }
        }
        Op::Slice => {
            only_first_batched()?;
            let starts = known_ints(1).ok_or("its starts are not known at compile time")?;
            let ends = known_ints(2).ok_or("its ends are not known at compile time")?;
            let axes = match node.inputs.get(3).copied().flatten() {
                Some(_) => known_ints(3).ok_or("its axes are not known at compile time")?,
                None => (0..starts.len() as i64).collect(),
            };
            let steps = match node.inputs.get(4).copied().flatten() {
                Some(_) => known_ints(4).ok_or("its steps are not known at compile time")?,
                None => vec![1; starts.len()],
            };
            for (n, &a) in axes.iter().enumerate() {
                let whole = starts.get(n) == Some(&0)
                    && ends.get(n).is_some_and(|&e| e >= i32::MAX as i64)
                    && steps.get(n) == Some(&1);
                if norm(a, rank(0)) == Some(i) && !whole {
                    return along("slices");
                }
            }
            expect(i)
        }
        Op::Gather { axis } => {
            let a = norm(*axis, rank(0)).ok_or("a bad axis")?;
            match (axis_of(0), axis_of(1), ins.get(1).copied().flatten()) {
                (Some(i), None, Some(Fixed)) if a != i => expect(if i < a { i } else { i + rank(1) - 1 }),
                (None, Some(j), _) if ins[0] == Some(Fixed) => {
                    expect(a + j).map(|_| ins[1].map_or(0, Kind::outer))
                }
                _ => Err("it gathers across samples".into()),
            }
        }
        Op::Tile => {
            only_first_batched()?;
            match known_ints(1) {
                Some(r) if r.get(i) == Some(&1) => expect(i),
                _ => along("repeats"),
            }
        }
        Op::Pad { .. } => {
            only_first_batched()?;
            let pads = known_ints(1).ok_or("its pads are not known at compile time")?;
            let r = rank(0);
            let axes = match node.inputs.get(3).copied().flatten() {
                Some(_) => known_ints(3).ok_or("its axes are not known at compile time")?,
                None => (0..r as i64).collect(),
            };
            let n = axes.len();
            for (p, &a) in axes.iter().enumerate() {
                if norm(a, r) == Some(i) && (pads.get(p) != Some(&0) || pads.get(p + n) != Some(&0)) {
                    return along("pads");
                }
            }
            expect(i)
        }
        Op::Trilu { .. } if i + 2 < rank(0) => {
            only_first_batched()?;
            expect(i)
        }
        Op::MatMul | Op::Quant(QuantOp::MatMulInteger) | Op::Quant(QuantOp::QLinearMatMul) => {
            no_sized(0)?;
            // Operands: A and B (QLinearMatMul: inputs 0 and 3). A batch axis must be a row of
            // A, a column of B or a batch dim, never K; both batched: the same batch dim.
            let b_at = if matches!(node.op, Op::Quant(QuantOp::QLinearMatMul)) {
                3
            } else {
                1
            };
            let (ra, rb) = (rank(0), rank(b_at));
            if ins
                .iter()
                .enumerate()
                .any(|(n, kind)| n != 0 && n != b_at && kind.and_then(Kind::axis).is_some())
            {
                return Err("a scale or zero point carries the batch".into());
            }
            let ka = axis_of(0).map(|a| (a, a + 1 != ra && ra >= 2, a + out_rank - ra));
            let kb = axis_of(b_at).map(|b| (b, b + 2 != rb && rb >= 2, b + out_rank - rb));
            let outer = common_outer([ins[0], ins[b_at]].into_iter().flatten())
                .ok_or("its operands interleave the samples differently")?;
            match (ka, kb) {
                (Some((_, true, ka)), None) | (None, Some((_, true, ka))) => expect(ka).map(|_| outer),
                (Some((a, true, ka)), Some((b, true, kb))) if a + 2 < ra && b + 2 < rb && ka == kb => {
                    expect(ka).map(|_| outer)
                }
                _ => along("contracts"),
            }
        }
        Op::Attention(_) | Op::Misc(kiln_ir::MiscOp::RotaryEmbedding { .. }) => {
            // Every operand is per sample along axis 0 (Q, K, V, caches, positions) or the
            // same for all samples: a mask or cache broadcast over axis 0, or indexed by
            // per-sample positions (RotaryEmbedding's 2-D caches).
            no_sized(0)?;
            let batch_dim_broadcasts = |n: usize| {
                let ty = g.value_type(node.inputs[n].expect("operand"));
                let full = if matches!(node.op, Op::Attention(_)) { 4 } else { 3 };
                ty.rank() < full || ty.shape.first() == Some(&Dim::Fixed(1))
            };
            for (n, kind) in ins.iter().enumerate() {
                match kind {
                    Some(Batched { axis: 0, .. }) | None => {}
                    Some(Fixed) if batch_dim_broadcasts(n) && n > 0 => {}
                    _ => return Err(format!("operand {n} is not per sample along axis 0")),
                }
            }
            if i != 0 {
                return Err(format!("its input has the samples on axis {i}, not on axis 0"));
            }
            let outer = common_outer(ins.iter().flatten().copied())
                .ok_or("its operands interleave the samples differently")?;
            expect(0).map(|_| outer)
        }
        Op::Gemm { trans_a, .. } => {
            only_first_batched()?;
            match (trans_a, i) {
                (false, 0) | (true, 1) => expect(0),
                _ => along("contracts"),
            }
        }
        _ => Err("kiln does not run it sample by sample yet; compile with a fixed batch".into()),
    }
}

/// A Range `0..n·a` at batch `n` (start 0, step 1, limit `a` at batch 1 and `probe_n·a` at the
/// probe batch): returns `a`.
fn sample_range(
    g: &Graph,
    node: &Node,
    probe: &Graph,
    other: &Node,
    probe_n: usize,
) -> std::result::Result<i64, String> {
    let (start, delta) = (value_of(g, node, 0), value_of(g, node, 2));
    let (a, limit_p) = (value_of(g, node, 1), value_of(probe, other, 1));
    match (start, delta, a, limit_p) {
        (Some(0), Some(1), Some(a), Some(p)) if a > 0 && p == a * probe_n as i64 => Ok(a),
        _ => Err("a Range over the batch size other than 0..n·a in steps of 1".into()),
    }
}

/// The values of `node`'s input `i` when it is a known integer tensor (shape arithmetic,
/// axes, positions).
fn known_ints(g: &Graph, node: &Node, i: usize) -> Option<Vec<i64>> {
    kiln_ir::ops::util::known_i64s(g.known_value(node.inputs.get(i).copied().flatten()?))
}

/// [`known_ints`] of a one-element input.
fn value_of(g: &Graph, node: &Node, i: usize) -> Option<i64> {
    match known_ints(g, node, i)?.as_slice() {
        [v] => Some(*v),
        _ => None,
    }
}

/// The offset of a node's output (batched along `k`) when an input holds sample positions
/// (`offs[i] != 0`): data movement keeps it, Add adds them, Mul by a constant scales it,
/// and a Gather along the data's batch axis whose indices are offset by the data's per-sample
/// extent there reads each sample's own rows (offset 0 again). Anything else would compute
/// with the position itself.
///
/// Positions are never negative: they start as `Range(0, n·a)`, and only Add of values that
/// are not negative and Mul by a constant that is not are allowed. A negative index would
/// wrap around the per-sample program's axis (to the sample's own last row) but around the
/// whole batch's in the model (to the previous sample's), so Sub is refused.
fn indexed_rule(
    g: &Graph,
    node: &Node,
    ins: &[Option<Kind>],
    offs: &[i64],
    k: usize,
) -> std::result::Result<(i64, usize), String> {
    use kiln_ir::Binary;
    // A known integer operand with one value everywhere.
    let constant = |i: usize| -> Option<i64> {
        let v = known_ints(g, node, i)?;
        let first = *v.first()?;
        v.iter().all(|&x| x == first).then_some(first)
    };
    let only_first = || match offs.iter().skip(1).all(|&o| o == 0) {
        true => Ok(offs[0]),
        false => Err("only its first input may hold positions in the batch".to_string()),
    };
    match &node.op {
        Op::Unsqueeze
        | Op::Squeeze
        | Op::Reshape { .. }
        | Op::Flatten { .. }
        | Op::Expand
        | Op::Transpose { .. }
        | Op::Identity => {
            let outer = per_sample_rule(g, node, ins, k)?;
            Ok((only_first()?, outer))
        }
        Op::Cast { to } if to.is_int() => {
            let outer = elementwise(g, node, ins, k)?;
            Ok((only_first()?, outer))
        }
        Op::Binary(Binary::Add) => {
            // Each operand holds positions (never negative) or is a fixed value that is not.
            if (0..2).any(|i| offs[i] == 0 && !(ins[i] == Some(Kind::Fixed) && nonnegative(g, node, i))) {
                return Err("it adds to positions in the batch something that may be negative".into());
            }
            let outer = elementwise(g, node, ins, k)?;
            Ok((offs[0] + offs[1], outer))
        }
        Op::Binary(Binary::Mul) => {
            let (o, c) = match (offs[0], offs[1]) {
                (o, 0) if ins[1] == Some(Kind::Fixed) => (o, constant(1)),
                (0, o) if ins[0] == Some(Kind::Fixed) => (o, constant(0)),
                _ => (0, None),
            };
            let outer = elementwise(g, node, ins, k)?;
            c.filter(|&c| c >= 0).map(|c| (o * c, outer)).ok_or_else(|| {
                "it multiplies positions in the batch by something other than a constant that is not negative".into()
            })
        }
        Op::Gather { axis } => {
            let data = node.inputs[0].expect("data");
            let a = norm(*axis, g.value_type(data).rank());
            let extent = a
                .and_then(|a| g.value_type(data).shape.get(a).and_then(|d| d.fixed()))
                .unwrap_or(0) as i64;
            match (
                ins[0].and_then(Kind::axis),
                ins[1].and_then(Kind::axis),
                offs[0],
                offs[1],
            ) {
                (Some(i), Some(j), 0, o)
                    if Some(i) == a && o == extent && k == i + j && ins[0].map(Kind::outer) == Some(1) =>
                {
                    Ok((0, ins[1].map_or(0, Kind::outer)))
                }
                _ => Err("it gathers rows of other samples".into()),
            }
        }
        _ => Err("it computes with positions in the batch (a Range over the batch size)".into()),
    }
}

/// Index tuples of sample positions, as the dynamo exporter writes GPT-2's causal-mask code:
/// `Concat([b, s], -1)` of a sample's position (a `Range` over the batch) and a position inside
/// it, then `GatherND`. A Concat along the last axis (not the batch's) of values holding
/// positions makes a tuple whose components keep their offsets; a GatherND whose first
/// component is offset by the data's per-sample extent on its axis 0 (the batch, whole, or
/// the same values for every sample) and whose other components are not offset reads each
/// sample's own elements. Returns the
/// output's tuple (None for GatherND's plain output) and run count.
fn tuple_rule(
    g: &Graph,
    node: &Node,
    ins: &[Option<Kind>],
    offs: &[i64],
    tups: &[Option<Vec<i64>>],
    k: usize,
) -> std::result::Result<(Option<Vec<i64>>, usize), String> {
    let rank = |v: Option<ValueId>| v.map_or(0, |v| g.value_type(v).rank());
    match &node.op {
        Op::Concat { axis } => {
            let out_rank = node.outputs[0].ty.rank();
            if norm(*axis, out_rank) != Some(out_rank - 1) || k + 1 == out_rank {
                return Err(
                    "it concatenates positions in the batch other than into index tuples on the last axis"
                        .into(),
                );
            }
            let outer = per_sample_rule(g, node, ins, k)?;
            let mut components = vec![];
            for (i, v) in node.inputs.iter().enumerate() {
                let last = v.map_or(0, |v| dims(g, v).last().copied().unwrap_or(0));
                match &tups[i] {
                    Some(t) => components.extend_from_slice(t),
                    None => components.extend(std::iter::repeat_n(offs[i], last)),
                }
            }
            Ok((Some(components), outer))
        }
        Op::GatherND { batch_dims: 0 } => {
            let (data, indices) = (node.inputs[0], node.inputs[1]);
            let extent = data.map_or(0, |v| dims(g, v).first().copied().unwrap_or(0)) as i64;
            let own_rows = match (&tups[1], offs[0], &tups[0]) {
                (Some(t), 0, None) => {
                    // Data the same for every sample (outer 0) reads alike from any sample's rows.
                    t.first() == Some(&extent)
                        && t[1..].iter().all(|&o| o == 0)
                        && matches!(
                            ins[0],
                            Some(Kind::Batched {
                                axis: 0,
                                outer: 0 | 1
                            })
                        )
                }
                _ => false,
            };
            let idx_axis = ins[1].and_then(Kind::axis);
            if own_rows && idx_axis == Some(k) && k + 1 < rank(indices) {
                Ok((None, ins[1].map_or(0, Kind::outer)))
            } else {
                Err("it gathers elements of other samples".into())
            }
        }
        _ => Err("it computes with positions in the batch".into()),
    }
}

/// Whether `node`'s input `i` is never negative: known integers that are not, or a `Range`
/// whose known start and step are not.
fn nonnegative(g: &Graph, node: &Node, i: usize) -> bool {
    if let Some(v) = known_ints(g, node, i) {
        return v.iter().all(|&x| x >= 0);
    }
    let Some(v) = node.inputs.get(i).copied().flatten() else {
        return false;
    };
    let range = g.node(v.node);
    matches!(range.op, Op::Range)
        && [0, 2]
            .into_iter()
            .all(|j| known_ints(g, range, j).is_some_and(|v| v.iter().all(|&x| x >= 0)))
}

/// Elementwise operators act on each sample when every batched operand's batch axis lands on
/// the output's `k`, interleaved alike, and no other operand varies along `k`.
fn elementwise(g: &Graph, node: &Node, ins: &[Option<Kind>], k: usize) -> Outer {
    let out_rank = node.outputs[0].ty.rank();
    for (v, kind) in node.inputs.iter().zip(ins) {
        let Some(v) = v else { continue };
        let ty = g.value_type(*v);
        // The operand's axis that broadcasts against the output's k, if any.
        let at = (k + ty.rank()).checked_sub(out_rank);
        let lines_up = match kind.and_then(Kind::axis) {
            Some(a) => at == Some(a),
            None => at.is_none_or(|p| ty.shape[p] == Dim::Fixed(1)),
        };
        if !lines_up {
            return Err(format!(
                "operand {} ({ty}) would broadcast across the batch",
                g.value_name(*v)
            ));
        }
    }
    common_outer(ins.iter().flatten().copied())
        .ok_or_else(|| "its operands interleave the samples differently".into())
}

fn norm(axis: i64, rank: usize) -> Option<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    (0..rank as i64).contains(&a).then_some(a as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{Binary, DType, ReduceKind, Tensor};

    /// The same graph built at batch 1 and at batch 3 by `build(graph, x)`, `x: f32[n, 4]`.
    fn at_batches(build: impl Fn(&mut Graph, ValueId)) -> (Graph, Graph) {
        let make = |n: usize| {
            let mut g = Graph::new("g");
            let x = g.add_input("x", TensorType::fixed(DType::F32, &[n, 4]));
            build(&mut g, x);
            g
        };
        (make(1), make(3))
    }

    fn check(build: impl Fn(&mut Graph, ValueId)) -> Result<Batch> {
        let (one, three) = at_batches(build);
        analyze(&one, &three, 3, 1, 8)
    }

    fn add(g: &mut Graph, name: &str, op: Op, inputs: &[ValueId]) -> ValueId {
        g.add(name, op, inputs.iter().map(|&v| Some(v)).collect(), name)
            .unwrap()
    }

    fn ints(g: &mut Graph, name: &str, v: &[i64]) -> ValueId {
        g.add_const(name, Tensor::from_vec(vec![v.len()], v.to_vec()))
    }

    /// `Gather(Shape(x), 0)`: the batch size, as exporters compute it.
    fn batch_size(g: &mut Graph, x: ValueId) -> ValueId {
        let shape = add(g, "shape", Op::Shape { start: 0, end: None }, &[x]);
        let zero = g.add_const("zero", Tensor::scalar(0i64));
        add(g, "bsz", Op::Gather { axis: 0 }, &[shape, zero])
    }

    /// `Range(0, n)`: each sample's position, as exporters compute it from the batch size.
    fn sample_positions(g: &mut Graph, x: ValueId) -> ValueId {
        let bsz = batch_size(g, x);
        let (zero, one) = (
            g.add_const("z", Tensor::scalar(0i64)),
            g.add_const("o", Tensor::scalar(1i64)),
        );
        add(g, "samples", Op::Range, &[zero, bsz, one])
    }

    /// `Range(0, 4)`: the positions of a sample's 4 columns.
    fn columns(g: &mut Graph) -> ValueId {
        let (zero, one, four) = (
            g.add_const("z0", Tensor::scalar(0i64)),
            g.add_const("o1", Tensor::scalar(1i64)),
            g.add_const("four", Tensor::scalar(4i64)),
        );
        add(g, "cols", Op::Range, &[zero, four, one])
    }

    /// `x` flattened to one axis.
    fn flat(g: &mut Graph, x: ValueId) -> ValueId {
        let flat_shape = ints(g, "flat_shape", &[-1]);
        add(g, "flat", Op::Reshape { allow_zero: false }, &[x, flat_shape])
    }

    fn reduce(kind: ReduceKind) -> Op {
        Op::Reduce {
            kind,
            keepdims: true,
            noop_with_empty_axes: false,
        }
    }

    #[test]
    fn products_reshapes_from_the_batch_size_and_row_reductions_are_per_sample() {
        let batch = check(|g, x| {
            let w = g.add_const("w", Tensor::from_vec(vec![4, 6], vec![0.5f32; 24]));
            let y = add(g, "proj", Op::MatMul, &[x, w]);
            // y.view(batch, 2, 3), the batch read from the shape.
            let bsz = batch_size(g, x);
            let axes = ints(g, "axes0", &[0]);
            let lead = add(g, "lead", Op::Unsqueeze, &[bsz, axes]);
            let rest = ints(g, "rest", &[2, 3]);
            let shape = add(g, "target", Op::Concat { axis: 0 }, &[lead, rest]);
            let v = add(g, "view", Op::Reshape { allow_zero: false }, &[y, shape]);
            let p = add(
                g,
                "softmax",
                Op::Softmax {
                    axis: -1,
                    coerce_2d: false,
                },
                &[v],
            );
            g.add_output("p", p);
            let axes = ints(g, "axes1", &[1]);
            let s = add(g, "sum", reduce(ReduceKind::Sum), &[x, axes]);
            g.add_output("s", s);
            g.add_output("w", w);
        })
        .unwrap();
        assert_eq!(batch.inputs, [true]);
        assert_eq!(batch.outputs, [true, true, false]);
    }

    /// Adds a node reading `x` and returns its output.
    type Build = dyn Fn(&mut Graph, ValueId) -> ValueId;

    #[test]
    fn operators_that_mix_samples_are_refused_by_name() {
        let cases: [(&str, &Build, &str); 4] = [
            (
                "mean",
                &|g, x| {
                    let axes = ints(g, "axes", &[0]);
                    add(g, "mean", reduce(ReduceKind::Mean), &[x, axes])
                },
                "reduces along the batch (axis 0)",
            ),
            (
                "join",
                &|g, x| add(g, "join", Op::Concat { axis: 0 }, &[x, x]),
                "concatenates along the batch",
            ),
            (
                "flip_softmax",
                &|g, x| {
                    let t = add(g, "flip", Op::Transpose { perm: vec![1, 0] }, &[x]);
                    add(
                        g,
                        "flip_softmax",
                        Op::Softmax {
                            axis: 1,
                            coerce_2d: false,
                        },
                        &[t],
                    )
                },
                "normalizes along the batch (axis 1)",
            ),
            (
                "softmax",
                &|g, x| {
                    add(
                        g,
                        "softmax",
                        Op::Softmax {
                            axis: 0,
                            coerce_2d: false,
                        },
                        &[x],
                    )
                },
                "normalizes along the batch",
            ),
        ];
        for (node, build, why) in cases {
            let err = check(|g, x| {
                let y = build(g, x);
                g.add_output("y", y);
            })
            .unwrap_err()
            .to_string();
            assert!(
                err.contains(&format!("'{node}'")) && err.contains(why),
                "{node}: {err}"
            );
        }
    }

    #[test]
    fn the_batch_may_move_inside_the_graph_but_not_in_its_outputs() {
        // Sequence-first internals, as nn.MultiheadAttention transposes to: per sample.
        let flip = |g: &mut Graph, x: ValueId, to: &[i64]| {
            let t = add(g, "flip", Op::Transpose { perm: vec![1, 0] }, &[x]);
            let r = add(g, "relu", Op::Unary(kiln_ir::Unary::Relu), &[t]);
            let y = if to.is_empty() {
                add(g, "back", Op::Transpose { perm: vec![1, 0] }, &[r])
            } else {
                let shape = ints(g, "to", to);
                add(g, "reshape", Op::Reshape { allow_zero: false }, &[r, shape])
            };
            g.add_output("y", y);
        };
        assert_eq!(check(|g, x| flip(g, x, &[])).unwrap().outputs, [true]);
        // [4, n] -> [2, 2n]: sample b's values at columns o·n + b, two runs: per sample, but
        // not whole on axis 0 for the output.
        let err = check(|g, x| flip(g, x, &[2, -1])).unwrap_err().to_string();
        assert!(err.contains("output 'y' has the batch on axis 1"), "{err}");
        // [4, n] -> [n, 4] by Reshape (a transpose written wrong): rows mix samples.
        let err = check(|g, x| flip(g, x, &[-1, 4])).unwrap_err().to_string();
        assert!(
            err.contains("'reshape'") && err.contains("mixes the samples"),
            "{err}"
        );
    }

    #[test]
    fn attention_is_per_sample_with_a_mask_shared_by_the_batch() {
        let attention = || -> Result<Batch> {
            let make = |n: usize| {
                let mut g = Graph::new("g");
                let q = g.add_input("q", TensorType::fixed(DType::F32, &[n, 2, 4, 8]));
                let mask = g.add_const("mask", Tensor::from_vec(vec![1, 1, 4, 4], vec![0f32; 16]));
                let attrs = kiln_ir::AttentionAttrs::default();
                let y = add(&mut g, "attn", Op::Attention(attrs), &[q, q, q, mask]);
                g.add_output("y", y);
                g
            };
            analyze(&make(1), &make(3), 3, 1, 4)
        };
        assert_eq!(attention().unwrap().outputs, [true]);
    }

    #[test]
    fn the_batch_size_used_as_a_value_is_refused() {
        let err = check(|g, x| {
            let bsz = batch_size(g, x);
            let f = add(g, "as_float", Op::Cast { to: DType::F32 }, &[bsz]);
            let y = add(g, "shift", Op::Binary(Binary::Add), &[x, f]);
            g.add_output("y", y);
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("'shift'") && err.contains("batch size"), "{err}");
    }

    /// `Gather(flat(x), Range(0, n)·stride + Range(0, 4))`: how Hugging Face exports index a
    /// padding mask by sample. Per sample only when the stride is a sample's rows.
    fn gather_by_position(stride: i64) -> Result<Batch> {
        check(|g, x| {
            let flat = flat(g, x);
            let samples = sample_positions(g, x);
            let cols = columns(g);
            let axes = ints(g, "axes", &[1]);
            let samples = add(g, "column", Op::Unsqueeze, &[samples, axes]);
            let stride = g.add_const("stride", Tensor::scalar(stride));
            let start = add(g, "start", Op::Binary(Binary::Mul), &[samples, stride]);
            let idx = add(g, "idx", Op::Binary(Binary::Add), &[start, cols]);
            let y = add(g, "pick", Op::Gather { axis: 0 }, &[flat, idx]);
            g.add_output("y", y);
        })
    }

    /// `GatherND(x, Concat([b, s], -1))` with `b` a sample's position and `s` a column, both
    /// broadcast to `[n, 4]` through a shape computed as `Shape(Max(b, s))`: GPT-2's causal
    /// mask code as the dynamo exporter writes it. `swap` puts the column first.
    fn gather_nd_by_position(swap: bool) -> Result<Batch> {
        check(|g, x| {
            let samples = sample_positions(g, x);
            let cols = columns(g);
            let (ax1, ax0, last) = (ints(g, "ax1", &[1]), ints(g, "ax0", &[0]), ints(g, "last", &[-1]));
            let b = add(g, "b", Op::Unsqueeze, &[samples, ax1]);
            let s = add(g, "s", Op::Unsqueeze, &[cols, ax0]);
            // Only its shape is read: the positions in it do not matter.
            let both = add(g, "both", Op::Binary(Binary::Max), &[b, s]);
            let shape = add(g, "bshape", Op::Shape { start: 0, end: None }, &[both]);
            let b = add(g, "b_full", Op::Expand, &[b, shape]);
            let s = add(g, "s_full", Op::Expand, &[s, shape]);
            let b = add(g, "b_comp", Op::Unsqueeze, &[b, last]);
            let s = add(g, "s_comp", Op::Unsqueeze, &[s, last]);
            let parts = if swap { [s, b] } else { [b, s] };
            let idx = add(g, "idx", Op::Concat { axis: -1 }, &parts);
            let y = add(g, "pick", Op::GatherND { batch_dims: 0 }, &[x, idx]);
            g.add_output("y", y);
        })
    }

    #[test]
    fn index_tuples_led_by_the_sample_position_read_each_samples_own_elements() {
        assert_eq!(gather_nd_by_position(false).unwrap().outputs, [true]);
        let err = gather_nd_by_position(true).unwrap_err().to_string();
        assert!(err.contains("'pick'") && err.contains("other samples"), "{err}");
    }

    #[test]
    fn positions_that_may_be_negative_are_refused() {
        let err = check(|g, x| {
            let flat = flat(g, x);
            let samples = sample_positions(g, x);
            let four = g.add_const("four", Tensor::scalar(4i64));
            let start = add(g, "start", Op::Binary(Binary::Mul), &[samples, four]);
            // -1 is the sample's own last element per sample, the previous sample's in the batch.
            let back = g.add_const("back", Tensor::scalar(-1i64));
            let idx = add(g, "shift", Op::Binary(Binary::Add), &[start, back]);
            let y = add(g, "pick", Op::Gather { axis: 0 }, &[flat, idx]);
            g.add_output("y", y);
        })
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("'shift'") && err.contains("may be negative"),
            "{err}"
        );
    }

    #[test]
    fn gathers_by_sample_position_read_each_samples_own_rows() {
        assert_eq!(gather_by_position(4).unwrap().outputs, [true]);
        let err = gather_by_position(2).unwrap_err().to_string();
        assert!(err.contains("'pick'") && err.contains("other samples"), "{err}");
    }
}
