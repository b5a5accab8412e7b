//! BF16 autocast (`bf16-autocast`): matrix products and convolutions read their multiplicands in
//! bf16 and accumulate in f32; everything numerically sensitive stays f32.
//!
//! Per-op policy (the operator table's [`kiln_ir::Autocast`], `Op::autocast`):
//! - *always* (MatMul, Gemm, Conv, ConvTranspose, Attention, Einsum): the multiplicand inputs
//!   (not biases, Gemm's C or attention masks) are rounded to bf16 (round to nearest even);
//! - *never* (Softmax, LogSoftmax, norms, reductions, Exp/Log/Erf/Pow/..., recurrent ops): f32;
//! - *follow* (other elementwise ops, data movement): keep the dtype of their inputs.
//!
//! Representation. A bf16 operand is written `Cast<f32>(Cast<bf16>(x))`: the narrowing Cast is
//! the rounding, the widening Cast is exact, and the matmul-like op keeps f32 inputs and an f32
//! output. That is exactly "bf16 inputs, f32 accumulation" — a product of two bf16 values is
//! exact in f32 — so `ir::eval` computes the same thing a `vdpbf16ps` kernel does, and the
//! interpreter, verifier and printer need nothing new. Outputs stay f32 on purpose: the blocked
//! GEMM/conv kernels keep partial sums over K blocks in their output, and rounding those to bf16
//! between blocks would no longer be f32 accumulation; the fused epilogues (bias, residual,
//! activation) also keep running in f32. So *follow* ops after a matmul see f32 and stay f32; the
//! narrowing Cast is hoisted above *follow* data movement (Reshape, Transpose, ...) when that
//! movement only feeds bf16 consumers, so the movement runs on half the bytes — unless the
//! target's product kernels round their operands themselves (`hoist_movement` off), where a
//! Cast pair left at the product costs nothing and a hoisted one costs two kernels. Codegen
//! recognizes a `Cast<f32>` of a bf16 value as a bf16 operand (and a weight whose values are all
//! bf16 as bf16 weights, `NodeInfo::input_is_bf16_valued`): the CUDA GEMM then runs on tensor
//! cores (`codegen/src/nvptx/kernels/gemm/`), and on CPUs with avx512_bf16 the GEMM and
//! convolution kernels run on bf16 pairs with `vdpbf16ps` (`codegen/src/gen/gemm/`), reading
//! `x` itself and rounding it as they pack it, so the pair's two casts disappear. The pass runs
//! after `fuse` (`pipelines`), so it rounds the fused Attention's inputs rather than cutting a
//! decomposed attention apart.
//!
//! Constants (weights, after `freeze`) are rounded once here, at compile time: the Cast pair of
//! a constant folds to an f32 constant holding bf16 values. Cast pairs cancel: the narrowing of
//! a value that is itself a widened bf16 value is that bf16 value, and one value used by several
//! products is narrowed once. Graph inputs and outputs keep their dtypes.

use crate::Pass;
use kiln_ir::rewrite::{rebuild, Rewrite};
use kiln_ir::{Autocast, DType, Graph, IrError, Motion, Node, NodeId, Op, Tensor, ValueId, ALL_INPUTS};
use std::collections::{HashMap, HashSet};

pub struct Bf16Autocast {
    /// Move the narrowing Cast above data movement that only feeds bf16 operands (the
    /// movement then runs in bf16 and its result is widened). Off where products absorb the
    /// Cast pair at their input (CPUs with avx512_bf16): there a hoisted Cast and its widening
    /// are two kernels (ResNet-50's input transpose, the Flatten before its classifier), while
    /// a pair left at the product is read through by the product's packing.
    pub hoist_movement: bool,
}

/// A depthwise convolution (one input channel per group): k×k multiply-adds per output, so it
/// is bound by memory, not arithmetic, and its few terms do not average rounding errors out.
fn is_depthwise(graph: &Graph, node: &Node) -> bool {
    let Op::Conv(a) = &node.op else { return false };
    let w = node.inputs.get(1).copied().flatten();
    a.group > 1 && w.is_some_and(|w| graph.value_type(w).shape.get(1).and_then(|d| d.fixed()) == Some(1))
}

/// The node inputs an *always* op computes in bf16. Depthwise convolutions stay f32 (see
/// [`is_depthwise`]; measured on the MobileNetV2 fixture: cosine 0.997 with them in bf16).
fn bf16_inputs(graph: &Graph, node: &Node) -> Vec<usize> {
    if is_depthwise(graph, node) {
        return vec![];
    }
    // The operator table says which inputs (`Op::autocast`).
    match node.op.autocast() {
        Autocast::Always(ALL_INPUTS) => (0..node.inputs.len()).collect(),
        Autocast::Always(list) => list.iter().copied().filter(|&i| i < node.inputs.len()).collect(),
        _ => vec![],
    }
}

/// Values rounded to bf16 and widened back: bf16 values held in f32.
fn round_bf16(t: &Tensor) -> Tensor {
    t.cast(DType::BF16).cast(DType::F32)
}

/// Which f32 values the pass narrows: the *always* operands, and (hoisting) the data input of a
/// movement node whose every use is a narrowed operand or another hoisted movement node.
fn plan(graph: &Graph, hoist_movement: bool) -> (Vec<Vec<usize>>, Vec<bool>) {
    let mut operands: Vec<Vec<usize>> = vec![vec![]; graph.len()];
    for (id, node) in graph.node_ids().zip(graph.nodes()) {
        operands[id.index()] = bf16_inputs(graph, node)
            .into_iter()
            .filter(|&i| node.inputs[i].is_some_and(|v| graph.value_type(v).dtype == DType::F32))
            .collect();
    }
    // Users of every value, to decide hoisting from the consumers backwards.
    let mut users: HashMap<ValueId, Vec<(NodeId, usize)>> = HashMap::new();
    for (id, node) in graph.node_ids().zip(graph.nodes()) {
        for (i, v) in node.inputs.iter().enumerate() {
            if let Some(v) = v {
                users.entry(*v).or_default().push((id, i));
            }
        }
    }
    let outputs: Vec<ValueId> = graph.outputs().iter().map(|o| o.value).collect();
    let mut hoist = vec![false; graph.len()];
    if !hoist_movement {
        return (operands, hoist);
    }
    for id in graph.node_ids().collect::<Vec<_>>().into_iter().rev() {
        let node = graph.node(id);
        // A narrowing Cast may move above views and rearrangements: they neither compute nor
        // depend on values.
        if !matches!(node.op.motion(), Motion::View | Motion::Rearrange)
            || node.outputs.len() != 1
            || outputs.contains(&id.out(0))
        {
            continue;
        }
        let Some(x) = node.inputs[0] else { continue };
        if graph.value_type(x).dtype != DType::F32 || graph.known_value(x).is_some() {
            continue;
        }
        let us = users.get(&id.out(0)).map(Vec::as_slice).unwrap_or(&[]);
        hoist[id.index()] = !us.is_empty()
            && us
                .iter()
                .all(|&(u, i)| hoist[u.index()] && i == 0 || operands[u.index()].contains(&i));
    }
    (operands, hoist)
}

impl Pass for Bf16Autocast {
    fn name(&self) -> &'static str {
        "bf16-autocast"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        let (operands, hoist) = plan(graph, self.hoist_movement);
        if operands.iter().all(Vec::is_empty) {
            return Ok(0);
        }
        let rounded = round_unshared_weights(graph, &operands);
        let mut rewrites = 0;
        // In the new graph: the bf16 form of an f32 value, and the widened form of a bf16 value.
        let mut narrowed: HashMap<ValueId, ValueId> = HashMap::new();
        let mut widened: HashMap<ValueId, ValueId> = HashMap::new();
        // For a widening Cast of the new graph, the bf16 value it widens (to cancel pairs).
        let mut widens: HashMap<ValueId, ValueId> = HashMap::new();
        let new = rebuild(graph, |dst, id, node, inputs| {
            if hoist[id.index()] {
                // The movement runs on the bf16 value; its users get the widened result.
                let x = inputs[0].expect("hoisted nodes have a data input");
                let xb = narrow(dst, &mut narrowed, &widens, x)?;
                let mut ins = inputs.to_vec();
                ins[0] = Some(xb);
                let out = dst.add(
                    node.name.clone(),
                    node.op.clone(),
                    ins,
                    format!("{}.bf16", node.outputs[0].name),
                )?;
                let w = widen(dst, &mut widened, &mut widens, out)?;
                rewrites += 1;
                return Ok(Rewrite::Replace(vec![w]));
            }
            let ops = &operands[id.index()];
            if ops.is_empty() {
                return Ok(Rewrite::Keep);
            }
            let mut ins = inputs.to_vec();
            for &i in ops {
                let v = ins[i].expect("planned operands are present");
                if node.inputs[i].is_some_and(|old| rounded.contains(&old)) {
                    continue;
                }
                if let Some(t) = dst.known_value(v) {
                    let t = round_bf16(t);
                    let name = format!("{}.bf16", dst.value_name(v));
                    ins[i] = Some(dst.add_const(name, t));
                    continue;
                }
                // A bf16 value widened once already (a hoisted movement) is used as it is.
                if widens.contains_key(&v) {
                    continue;
                }
                let b = narrow(dst, &mut narrowed, &widens, v)?;
                ins[i] = Some(widen(dst, &mut widened, &mut widens, b)?);
            }
            rewrites += 1;
            let outs = dst.add_node(
                node.name.clone(),
                node.op.clone(),
                ins,
                node.outputs.iter().map(|o| o.name.clone()).collect(),
            )?;
            Ok(Rewrite::Replace(outs))
        })?;
        // The f32 weights replaced by their bf16-rounded copies are dead now.
        *graph = kiln_ir::rewrite::remove_dead(&new)?;
        Ok(rewrites)
    }
}

/// Rounds, in place, the weights that only bf16 operands read, and returns them. The others
/// (a weight also read in f32: a tied embedding's table) get a rounded copy in the rebuild.
/// One weight at a time: rounding copies of all of them next to the originals would hold the
/// model's weights twice (GPT-2 small: 0.5 GB more peak memory).
fn round_unshared_weights(graph: &mut Graph, operands: &[Vec<usize>]) -> HashSet<ValueId> {
    let mut only_bf16: HashMap<ValueId, bool> = HashMap::new();
    for (id, node) in graph.node_ids().zip(graph.nodes()) {
        for (i, v) in node.inputs.iter().enumerate() {
            let Some(v) = *v else { continue };
            if graph.known_value(v).is_some() {
                let rounded_here = operands[id.index()].contains(&i);
                *only_bf16.entry(v).or_insert(true) &= rounded_here;
            }
        }
    }
    for o in graph.outputs() {
        only_bf16.insert(o.value, false);
    }
    let mut rounded = HashSet::new();
    for (v, only) in only_bf16 {
        if only && matches!(graph.node(v.node).op, Op::Constant(_)) {
            let t = round_bf16(graph.known_value(v).expect("a constant"));
            let name = format!("{}.bf16", graph.value_name(v));
            if graph.replace_constant(v, name, t) {
                rounded.insert(v);
            }
        }
    }
    rounded
}

/// The bf16 form of f32 value `v` (of the new graph): one narrowing Cast per value, or the bf16
/// value `v` was widened from.
fn narrow(
    dst: &mut Graph,
    narrowed: &mut HashMap<ValueId, ValueId>,
    widens: &HashMap<ValueId, ValueId>,
    v: ValueId,
) -> Result<ValueId, IrError> {
    if let Some(&b) = widens.get(&v).or_else(|| narrowed.get(&v)) {
        return Ok(b);
    }
    let name = dst.value_name(v).to_string();
    let b = dst.add(
        format!("{name}.to_bf16"),
        Op::Cast { to: DType::BF16 },
        vec![Some(v)],
        format!("{name}.bf16"),
    )?;
    narrowed.insert(v, b);
    Ok(b)
}

/// The f32 form of bf16 value `b`: one widening Cast per value.
fn widen(
    dst: &mut Graph,
    widened: &mut HashMap<ValueId, ValueId>,
    widens: &mut HashMap<ValueId, ValueId>,
    b: ValueId,
) -> Result<ValueId, IrError> {
    if let Some(&w) = widened.get(&b) {
        return Ok(w);
    }
    let name = dst.value_name(b).to_string();
    let w = dst.add(
        format!("{name}.to_f32"),
        Op::Cast { to: DType::F32 },
        vec![Some(b)],
        format!("{name}.f32"),
    )?;
    widened.insert(b, w);
    widens.insert(w, b);
    Ok(w)
}

/// How much of a graph computes in bf16: for `kiln compile`'s summary and reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bf16Summary {
    /// Matmul-like ops (the *always* policy) in the graph, and how many read bf16 operands.
    pub matmul_ops: usize,
    pub bf16_ops: usize,
    /// Estimated FLOPs of the whole graph and of the ops computing in bf16.
    pub total_flops: u64,
    pub bf16_flops: u64,
}

/// Whether value `v` holds bf16 numbers: a bf16 tensor, a widened bf16 value, or a constant
/// whose every value is a bf16 value (a weight rounded at compile time).
pub fn is_bf16_operand(graph: &Graph, v: ValueId) -> bool {
    let ty = graph.value_type(v);
    if ty.dtype == DType::BF16 {
        return true;
    }
    if ty.dtype != DType::F32 {
        return false;
    }
    let node = graph.node(v.node);
    if let Op::Cast { .. } = node.op {
        if let Some(x) = node.inputs[0] {
            if graph.value_type(x).dtype == DType::BF16 {
                return true;
            }
        }
    }
    graph
        .known_value(v)
        .and_then(|t| t.as_slice::<f32>())
        .is_some_and(|s| s.iter().all(|x| x.to_bits() & 0xffff == 0))
}

/// Counts the matmul-like ops whose multiplicands are all bf16, and their share of the FLOPs.
pub fn summary(graph: &Graph) -> Bf16Summary {
    let mut s = Bf16Summary::default();
    for node in graph.nodes() {
        let flops = kiln_ir::cost::node_flops(graph, node);
        s.total_flops += flops;
        let ins = bf16_inputs(graph, node);
        if ins.is_empty() {
            continue;
        }
        s.matmul_ops += 1;
        if ins
            .iter()
            .all(|&i| node.inputs[i].is_none_or(|v| is_bf16_operand(graph, v)))
        {
            s.bf16_ops += 1;
            s.bf16_flops += flops;
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{Dim, TensorType, Unary};

    fn f32_input(g: &mut Graph, name: &str, shape: &[usize]) -> ValueId {
        g.add_input(
            name,
            TensorType::new(DType::F32, shape.iter().map(|&d| Dim::from(d)).collect()),
        )
    }

    #[test]
    fn cast_to_bf16_rounds_to_nearest_even() {
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: even is 1. 1 + 3·2^-8 lies halfway
        // between 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6. Just above a tie rounds up.
        let x = Tensor::from_vec(
            vec![4],
            vec![
                1.0 + 2f32.powi(-8),
                1.0 + 3.0 * 2f32.powi(-8),
                1.0 + 2f32.powi(-8) + 2f32.powi(-20),
                -1.0 - 2f32.powi(-8),
            ],
        );
        let r = round_bf16(&x);
        assert_eq!(
            r.as_slice::<f32>().unwrap(),
            &[1.0, 1.0 + 2f32.powi(-6), 1.0 + 2f32.powi(-7), -1.0]
        );
    }

    #[test]
    fn policy_table() {
        assert_eq!(Op::MatMul.autocast(), Autocast::Always(&[0, 1]));
        assert_eq!(
            Op::Softmax {
                axis: -1,
                coerce_2d: false
            }
            .autocast(),
            Autocast::Never
        );
        assert_eq!(Op::Unary(Unary::Exp).autocast(), Autocast::Never);
        assert_eq!(Op::Unary(Unary::Relu).autocast(), Autocast::Follow);
        assert_eq!(Op::Binary(kiln_ir::Binary::Add).autocast(), Autocast::Follow);
        assert_eq!(Op::Transpose { perm: vec![1, 0] }.autocast(), Autocast::Follow);
    }

    /// x @ W with W constant: W is rounded at compile time, x gets one Cast pair, the output
    /// stays f32, and eval matches a computation on bf16-rounded operands.
    #[test]
    fn matmul_operands_are_rounded_and_output_stays_f32() {
        let mut g = Graph::new("t");
        let x = f32_input(&mut g, "x", &[2, 3]);
        let wv: Vec<f32> = (0..12).map(|i| 0.1 + i as f32 * 0.337).collect();
        let w = g.add_const("w", Tensor::from_vec(vec![3, 4], wv.clone()));
        let y = g.add("mm", Op::MatMul, vec![Some(x), Some(w)], "y").unwrap();
        let r = g.add("relu", Op::Unary(Unary::Relu), vec![Some(y)], "r").unwrap();
        g.add_output("r", r);
        let n = Bf16Autocast { hoist_movement: true }.run(&mut g).unwrap();
        assert_eq!(n, 1);
        kiln_ir::verify(&g).unwrap();
        let casts: Vec<DType> = g
            .nodes()
            .iter()
            .filter_map(|n| match n.op {
                Op::Cast { to } => Some(to),
                _ => None,
            })
            .collect();
        assert_eq!(casts, vec![DType::BF16, DType::F32]);
        assert_eq!(g.value_type(g.outputs()[0].value).dtype, DType::F32);
        let s = summary(&g);
        assert_eq!((s.matmul_ops, s.bf16_ops), (1, 1));
        assert_eq!(s.bf16_flops, 2 * 2 * 3 * 4);

        let xv: Vec<f32> = vec![0.3, -1.7, 2.9, 1.01, 0.5, -0.25];
        let out = kiln_ir::eval::eval_graph(&g, vec![Tensor::from_vec(vec![2, 3], xv.clone())]).unwrap();
        let rb = |v: f32| half::bf16::from_f32(v).to_f32();
        for i in 0..2 {
            for j in 0..4 {
                let want: f32 = (0..3).map(|k| rb(xv[i * 3 + k]) * rb(wv[k * 4 + j])).sum();
                let got = out[0].as_slice::<f32>().unwrap()[i * 4 + j];
                assert!(
                    (got - want.max(0.0)).abs() <= 1e-6 * want.abs().max(1.0),
                    "{got} vs {want}"
                );
            }
        }
    }

    /// Inputs `a` and `b` (f32[4,4]) and `bt`, b transposed by node "tr".
    fn input_and_transposed_input() -> (Graph, ValueId, ValueId) {
        let mut g = Graph::new("t");
        let a = f32_input(&mut g, "a", &[4, 4]);
        let b = f32_input(&mut g, "b", &[4, 4]);
        let bt = g
            .add("tr", Op::Transpose { perm: vec![1, 0] }, vec![Some(b)], "bt")
            .unwrap();
        (g, a, bt)
    }

    /// One activation feeding two products is narrowed once; a Transpose feeding only a
    /// product moves to bf16.
    #[test]
    fn shared_operand_narrowed_once_and_movement_hoisted() {
        let (mut g, a, bt) = input_and_transposed_input();
        let y1 = g.add("mm1", Op::MatMul, vec![Some(a), Some(bt)], "y1").unwrap();
        let y2 = g.add("mm2", Op::MatMul, vec![Some(a), Some(a)], "y2").unwrap();
        g.add_output("y1", y1);
        g.add_output("y2", y2);
        Bf16Autocast { hoist_movement: true }.run(&mut g).unwrap();
        kiln_ir::verify(&g).unwrap();
        let narrowing = g
            .nodes()
            .iter()
            .filter(|n| matches!(n.op, Op::Cast { to: DType::BF16 }))
            .count();
        // a once, b once (above the transpose).
        assert_eq!(narrowing, 2);
        let tr = g.nodes().iter().find(|n| n.name == "tr").unwrap();
        assert_eq!(tr.outputs[0].ty.dtype, DType::BF16);
        assert_eq!(summary(&g).bf16_ops, 2);
    }

    /// Without hoisting (products that round their own operands) the Transpose stays f32 and
    /// the Cast pair sits between it and the product.
    #[test]
    fn movement_stays_f32_without_hoisting() {
        let (mut g, a, bt) = input_and_transposed_input();
        let y = g.add("mm", Op::MatMul, vec![Some(a), Some(bt)], "y").unwrap();
        g.add_output("y", y);
        Bf16Autocast {
            hoist_movement: false,
        }
        .run(&mut g)
        .unwrap();
        kiln_ir::verify(&g).unwrap();
        let tr = g.nodes().iter().find(|n| n.name == "tr").unwrap();
        assert_eq!(tr.outputs[0].ty.dtype, DType::F32);
        let mm = g.nodes().iter().find(|n| n.name == "mm").unwrap();
        let narrowed = |v: Option<ValueId>| {
            let cast = g.node(v.unwrap().node);
            let inner = g.node(cast.inputs[0].unwrap().node);
            matches!(cast.op, Op::Cast { to: DType::F32 }) && matches!(inner.op, Op::Cast { to: DType::BF16 })
        };
        assert!(narrowed(mm.inputs[0]) && narrowed(mm.inputs[1]));
        assert_eq!(summary(&g).bf16_ops, 1);
    }

    #[test]
    fn integer_graph_is_unchanged() {
        let mut g = Graph::new("t");
        let a = g.add_input("a", TensorType::new(DType::I32, vec![Dim::from(2), Dim::from(2)]));
        let y = g.add("mm", Op::MatMul, vec![Some(a), Some(a)], "y").unwrap();
        g.add_output("y", y);
        let before = g.clone();
        assert_eq!(Bf16Autocast { hoist_movement: true }.run(&mut g).unwrap(), 0);
        assert_eq!(g, before);
    }
}
