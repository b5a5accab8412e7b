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
//! - **batched**: its axis 0 grows with the batch (`n·a0` rows at batch `n`, `a0` per sample)
//!   and its buffer is the per-sample buffers one after another;
//! - **fixed**: the same type and the same values at every batch (weights, shape arithmetic on
//!   the other axes);
//! - **batch-sized**: the same type, values that depend on the batch size (a `Shape` that
//!   includes axis 0). Allowed only where it sets the shape of a batched value (Reshape,
//!   Expand, ConstantOfShape, Resize's sizes), whose type the probe checks.
//!
//! An operator with a batched input must act on each sample alone: elementwise operators where
//! the other operands do not vary along axis 0, convolutions, pooling, normalizations and
//! reductions over other axes, products whose batched operand keeps axis 0 out of the
//! contraction, data movement that keeps axis 0 first and whole. Anything else (a reduction or
//! a Concat along axis 0, BatchNormalization in training, MaxPool's flat Indices, a recurrent
//! cell whose batch is axis 1, DynamicQuantizeLinear's whole-tensor range) is refused with the
//! node's name.

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
    Batched,
    Fixed,
    BatchSized,
}

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
    let mut kinds: HashMap<ValueId, Kind> = HashMap::new();
    // Batched values holding sample positions: at sample b, the per-sample value plus
    // b·offset (see `indexed_rule`). Absent: offset 0.
    let mut offsets: HashMap<ValueId, i64> = HashMap::new();
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
        let ins: Vec<Option<Kind>> = node.inputs.iter().map(|v| v.map(|v| kinds[&v])).collect();
        let any_batched = ins.contains(&Some(Kind::Batched));
        let sized = ins.contains(&Some(Kind::BatchSized));
        for (k, (o1, op)) in node.outputs.iter().zip(&other.outputs).enumerate() {
            let (t1, tp) = (&o1.ty, &op.ty);
            let batched = batched_types(t1, tp, probe_n);
            let kind = if matches!(node.op, Op::Input) {
                match (batched, t1 == tp) {
                    (true, _) => Kind::Batched,
                    (false, true) => Kind::Fixed,
                    (false, false) => {
                        return Err(refuse(
                            node,
                            format!("input is {t1} at batch 1 and {tp} at batch {probe_n}"),
                        ))
                    }
                }
            } else if any_batched && !matches!(node.op, Op::Shape { .. } | Op::Size) {
                let offs: Vec<i64> = node
                    .inputs
                    .iter()
                    .map(|v| v.and_then(|v| offsets.get(&v).copied()).unwrap_or(0))
                    .collect();
                if offs.iter().any(|&o| o != 0) {
                    let offset =
                        indexed_rule(per_sample, node, &ins, &offs).map_err(|why| refuse(node, why))?;
                    if offset != 0 {
                        offsets.insert(out(k), offset);
                    }
                } else if k == 0 {
                    per_sample_rule(per_sample, node, &ins).map_err(|why| refuse(node, why))?;
                }
                if !batched {
                    return Err(refuse(
                        node,
                        format!(
                            "its output {} is {t1} at batch 1 and {tp} at batch {probe_n}: the batch does not stay on axis 0",
                            o1.name
                        ),
                    ));
                }
                Kind::Batched
            } else if sized && batched && matches!(node.op, Op::Expand | Op::ConstantOfShape { .. }) {
                // Fixed values broadcast to a batch-sized shape: the same for every sample.
                Kind::Batched
            } else if let (true, Op::Range) = (sized, &node.op) {
                // 0..n·a, what exporters gather a sample's rows with: at sample b, the per-sample
                // 0..a plus b·a.
                let a =
                    sample_range(per_sample, node, probe, other, probe_n).map_err(|why| refuse(node, why))?;
                offsets.insert(out(k), a);
                Kind::Batched
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
        .map(|&id| kinds[&ValueId { node: id, output: 0 }] == Kind::Batched)
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
        if offsets.contains_key(&o.value) {
            return Err(CodegenError::unsupported(
                &o.name,
                "graph output",
                format!("output '{}' holds positions in the batch", o.name),
            ));
        }
        match kinds[&o.value] {
            Kind::Batched => outputs.push(true),
            Kind::Fixed => outputs.push(false),
            Kind::BatchSized => {
                return Err(CodegenError::unsupported(
                    &o.name,
                    "graph output",
                    format!("output '{}' holds values computed from the batch size", o.name),
                ))
            }
        }
    }
    Ok(Batch {
        lo,
        hi,
        inputs,
        outputs,
    })
}

/// Whether `probe` is `per_sample` with axis 0 scaled by `n`.
fn batched_types(per_sample: &TensorType, probe: &TensorType, n: usize) -> bool {
    per_sample.dtype == probe.dtype
        && per_sample.rank() == probe.rank()
        && per_sample.rank() > 0
        && match (&per_sample.shape[0], &probe.shape[0]) {
            (Dim::Fixed(a), Dim::Fixed(b)) => a * n == *b,
            _ => false,
        }
        && per_sample.shape[1..] == probe.shape[1..]
}

/// Why `node`, with the batched inputs `ins` shows, would not act on each sample alone
/// (`Ok` when it does).
fn per_sample_rule(g: &Graph, node: &Node, ins: &[Option<Kind>]) -> std::result::Result<(), String> {
    use Kind::*;
    let rank = |i: usize| node.inputs[i].map_or(0, |v| g.value_type(v).rank());
    let out_rank = node.outputs[0].ty.rank();
    let is = |i: usize, k: Kind| ins.get(i).copied().flatten() == Some(k);
    let only_first_batched = || {
        if ins.iter().skip(1).any(|k| *k == Some(Batched)) {
            return Err("only its first input may carry the batch".to_string());
        }
        Ok(())
    };
    let no_sized = |from: usize| {
        if ins.iter().skip(from).any(|k| *k == Some(BatchSized)) {
            return Err("an operand is computed from the batch size".to_string());
        }
        Ok(())
    };
    let axis_not_0 = |axis: i64, r: usize| {
        if norm(axis, r) == Some(0) {
            return Err("it works along axis 0, the batch".to_string());
        }
        Ok(())
    };
    let known_ints = |i: usize| {
        node.inputs
            .get(i)
            .copied()
            .flatten()
            .and_then(|v| g.known_value(v))
            .map(|t| t.to_f64_vec().into_iter().map(|x| x as i64).collect::<Vec<i64>>())
    };
    match &node.op {
        Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Clip | Op::Cast { .. } | Op::Identity => {
            no_sized(0)?;
            elementwise(g, node, ins, out_rank)
        }
        Op::Quant(QuantOp::QuantizeLinear { axis, .. } | QuantOp::DequantizeLinear { axis, .. }) => {
            only_first_batched()?;
            no_sized(0)?;
            let scale_is_vector = node
                .inputs
                .get(1)
                .copied()
                .flatten()
                .is_some_and(|v| g.value_type(v).rank() > 0);
            if scale_is_vector && norm(*axis, rank(0)) == Some(0) {
                return Err("its scales run along axis 0, the batch".into());
            }
            Ok(())
        }
        Op::Conv(_)
        | Op::ConvTranspose(_)
        | Op::BatchNorm { .. }
        | Op::InstanceNorm { .. }
        | Op::GroupNorm { .. }
        | Op::GlobalPool(_)
        | Op::DepthToSpace { .. }
        | Op::SpaceToDepth { .. }
        | Op::Quant(QuantOp::ConvInteger(_) | QuantOp::QLinearConv(_)) => {
            only_first_batched()?;
            no_sized(0)
        }
        Op::Pool(_) => {
            only_first_batched()?;
            if node.outputs.len() > 1 {
                return Err("MaxPool's Indices count across the whole batch".into());
            }
            Ok(())
        }
        Op::LayerNorm { axis, .. } | Op::LpNorm { axis, .. } => {
            only_first_batched()?;
            no_sized(0)?;
            axis_not_0(*axis, rank(0))
        }
        Op::Misc(kiln_ir::MiscOp::RmsNorm { axis, .. }) => {
            only_first_batched()?;
            no_sized(0)?;
            axis_not_0(*axis, rank(0))
        }
        Op::MeanVarianceNorm { axes } => {
            only_first_batched()?;
            match axes.iter().any(|&a| norm(a, rank(0)) == Some(0)) {
                true => Err("it normalizes over axis 0, the batch".into()),
                false => Ok(()),
            }
        }
        Op::Softmax { axis, .. } | Op::LogSoftmax { axis, .. } | Op::Hardmax { axis, .. } => {
            axis_not_0(*axis, rank(0))
        }
        Op::ArgMax { axis, .. } | Op::ArgMin { axis, .. } => axis_not_0(*axis, rank(0)),
        Op::TopK { axis, .. } => {
            only_first_batched()?;
            no_sized(1)?;
            axis_not_0(*axis, rank(0))
        }
        Op::CumSum { .. } | Op::CumProd { .. } => {
            only_first_batched()?;
            match known_ints(1) {
                Some(a) if a.len() == 1 => axis_not_0(a[0], rank(0)),
                _ => Err("its axis is not known at compile time".into()),
            }
        }
        Op::Reduce {
            noop_with_empty_axes, ..
        } => {
            only_first_batched()?;
            match (node.inputs.get(1).copied().flatten(), known_ints(1)) {
                (None, _) if *noop_with_empty_axes => Ok(()),
                (Some(_), Some(axes)) if axes.is_empty() && *noop_with_empty_axes => Ok(()),
                (Some(_), Some(axes)) if !axes.is_empty() => {
                    match axes.iter().any(|&a| norm(a, rank(0)) == Some(0)) {
                        true => Err("it reduces over axis 0, the batch".into()),
                        false => Ok(()),
                    }
                }
                (Some(_), None) => Err("its axes are not known at compile time".into()),
                _ => Err("it reduces over every axis, the batch included".into()),
            }
        }
        Op::Transpose { perm } => match perm.first() {
            Some(0) => Ok(()),
            _ => Err("it moves the batch off axis 0".into()),
        },
        Op::Reshape { .. } | Op::Flatten { .. } | Op::Expand => only_first_batched(),
        Op::Squeeze | Op::Unsqueeze => {
            only_first_batched()?;
            match known_ints(1) {
                Some(axes) if axes.iter().all(|&a| norm(a, out_rank.max(rank(0))) != Some(0)) => Ok(()),
                Some(_) => Err("it adds or removes axis 0, the batch".into()),
                None => Err("its axes are not known at compile time".into()),
            }
        }
        Op::Concat { axis } => {
            if ins.iter().any(|k| *k != Some(Batched)) {
                return Err("it joins batched values with values that are not".into());
            }
            axis_not_0(*axis, out_rank)
        }
        Op::Split { axis, .. } => {
            only_first_batched()?;
            no_sized(1)?;
            axis_not_0(*axis, rank(0))
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
            for (k, &a) in axes.iter().enumerate() {
                if norm(a, rank(0)) == Some(0) {
                    let whole = starts.get(k) == Some(&0)
                        && ends.get(k).is_some_and(|&e| e >= i32::MAX as i64)
                        && steps.get(k) == Some(&1);
                    if !whole {
                        return Err("it slices axis 0, the batch".into());
                    }
                }
            }
            Ok(())
        }
        Op::Gather { axis } => match (ins.first().copied().flatten(), ins.get(1).copied().flatten()) {
            (Some(Batched), Some(Fixed)) => axis_not_0(*axis, rank(0)),
            (Some(Fixed), Some(Batched)) if norm(*axis, rank(0)) == Some(0) => Ok(()),
            _ => Err("it gathers across samples".into()),
        },
        Op::Tile => {
            only_first_batched()?;
            match known_ints(1) {
                Some(r) if r.first() == Some(&1) => Ok(()),
                _ => Err("it repeats axis 0, the batch".into()),
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
            let k = axes.len();
            for (i, &a) in axes.iter().enumerate() {
                if norm(a, r) == Some(0) && (pads.get(i) != Some(&0) || pads.get(i + k) != Some(&0)) {
                    return Err("it pads axis 0, the batch".into());
                }
            }
            Ok(())
        }
        Op::Resize(_) => only_first_batched(),
        Op::Trilu { .. } if rank(0) >= 3 => only_first_batched(),
        Op::MatMul | Op::Quant(QuantOp::MatMulInteger) => {
            no_sized(0)?;
            let (a, b) = (rank(0), rank(1));
            // Axis 0 of a batched operand must be a row of A or a batch dim, never the
            // contraction; the output's type check catches broadcasts that would mix samples.
            match (is(0, Batched), is(1, Batched)) {
                (true, false) if a >= 2 => Ok(()),
                (_, true) if b >= 3 && (!is(0, Batched) || a >= 3) => Ok(()),
                _ => Err("the batch is contracted".into()),
            }
        }
        Op::Quant(QuantOp::QLinearMatMul) => {
            if !is(0, Batched) || ins.iter().skip(1).any(|k| *k == Some(Batched)) || rank(0) < 2 {
                return Err("only a batched A of rank >= 2 is supported".into());
            }
            Ok(())
        }
        Op::Gemm { trans_a, .. } => {
            only_first_batched()?;
            match trans_a {
                false => Ok(()),
                true => Err("transA puts the batch in the contraction".into()),
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

fn value_of(g: &Graph, node: &Node, i: usize) -> Option<i64> {
    let t = g.known_value(node.inputs.get(i).copied().flatten()?)?;
    let v = t.to_f64_vec();
    (v.len() == 1).then(|| v[0] as i64)
}

/// The offset of a node's output when an input holds sample positions (`offs[i] != 0`): data
/// movement keeps it, Add and Sub add them, Mul by a constant scales it, and a Gather along
/// axis 0 whose indices are offset by the data's per-sample rows reads each sample's own rows
/// (offset 0 again). Anything else would compute with the position itself.
fn indexed_rule(
    g: &Graph,
    node: &Node,
    ins: &[Option<Kind>],
    offs: &[i64],
) -> std::result::Result<i64, String> {
    use kiln_ir::Binary;
    let out_rank = node.outputs[0].ty.rank();
    let constant = |i: usize| -> Option<i64> {
        let t = g.known_value(node.inputs.get(i).copied().flatten()?)?;
        let v = t.to_f64_vec();
        let first = *v.first()?;
        v.iter().all(|&x| x == first).then_some(first as i64)
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
            per_sample_rule(g, node, ins)?;
            only_first()
        }
        Op::Cast { to } if to.is_int() => only_first(),
        Op::Binary(op @ (Binary::Add | Binary::Sub)) => {
            elementwise(g, node, ins, out_rank)?;
            Ok(if *op == Binary::Add {
                offs[0] + offs[1]
            } else {
                offs[0] - offs[1]
            })
        }
        Op::Binary(Binary::Mul) => {
            let (o, c) = match (offs[0], offs[1]) {
                (o, 0) if ins[1] == Some(Kind::Fixed) => (o, constant(1)),
                (0, o) if ins[0] == Some(Kind::Fixed) => (o, constant(0)),
                _ => (0, None),
            };
            elementwise(g, node, ins, out_rank)?;
            c.map(|c| o * c).ok_or_else(|| {
                "it multiplies positions in the batch by something other than a constant".into()
            })
        }
        Op::Gather { axis } if norm(*axis, g.value_type(node.inputs[0].expect("data")).rank()) == Some(0) => {
            let data = g.value_type(node.inputs[0].expect("data"));
            let rows = data.shape.first().and_then(|d| d.fixed()).unwrap_or(0) as i64;
            match (ins[0], offs[0], offs[1]) {
                (Some(Kind::Batched), 0, o) if o == rows => Ok(0),
                _ => Err("it gathers rows of other samples".into()),
            }
        }
        _ => Err("it computes with positions in the batch (a Range over the batch size)".into()),
    }
}

/// Elementwise operators act on each sample when every batched operand lines up with the
/// output's axis 0 and no other operand varies along it.
fn elementwise(
    g: &Graph,
    node: &Node,
    ins: &[Option<Kind>],
    out_rank: usize,
) -> std::result::Result<(), String> {
    for (v, k) in node.inputs.iter().zip(ins) {
        let Some(v) = v else { continue };
        let ty = g.value_type(*v);
        let lines_up = match k {
            Some(Kind::Batched) => ty.rank() == out_rank,
            _ => ty.rank() < out_rank || ty.shape.first() == Some(&Dim::Fixed(1)),
        };
        if !lines_up {
            return Err(format!(
                "operand {} ({ty}) would broadcast across the batch",
                g.value_name(*v)
            ));
        }
    }
    Ok(())
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
                "reduces over axis 0",
            ),
            (
                "join",
                &|g, x| add(g, "join", Op::Concat { axis: 0 }, &[x, x]),
                "along axis 0",
            ),
            (
                "flip",
                &|g, x| add(g, "flip", Op::Transpose { perm: vec![1, 0] }, &[x]),
                "off axis 0",
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
                "along axis 0",
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
            let flat_shape = ints(g, "flat_shape", &[-1]);
            let flat = add(g, "flat", Op::Reshape { allow_zero: false }, &[x, flat_shape]);
            let bsz = batch_size(g, x);
            let (zero, one) = (
                g.add_const("z", Tensor::scalar(0i64)),
                g.add_const("o", Tensor::scalar(1i64)),
            );
            let samples = add(g, "samples", Op::Range, &[zero, bsz, one]);
            let four = g.add_const("four", Tensor::scalar(4i64));
            let cols = add(g, "cols", Op::Range, &[zero, four, one]);
            let axes = ints(g, "axes", &[1]);
            let samples = add(g, "column", Op::Unsqueeze, &[samples, axes]);
            let stride = g.add_const("stride", Tensor::scalar(stride));
            let start = add(g, "start", Op::Binary(Binary::Mul), &[samples, stride]);
            let idx = add(g, "idx", Op::Binary(Binary::Add), &[start, cols]);
            let y = add(g, "pick", Op::Gather { axis: 0 }, &[flat, idx]);
            g.add_output("y", y);
        })
    }

    #[test]
    fn gathers_by_sample_position_read_each_samples_own_rows() {
        assert_eq!(gather_by_position(4).unwrap().outputs, [true]);
        let err = gather_by_position(2).unwrap_err().to_string();
        assert!(err.contains("'pick'") && err.contains("other samples"), "{err}");
    }
}
