//! Fault injection, for testing the tools that check kiln's results (`kiln verify`, CI gates).
//!
//! With `KILN_INJECT_FAULT=<pass>` in the environment, the pass manager perturbs the graph right
//! after that pass runs: the first node (in graph order) that the pass created or changed, and
//! that can be perturbed, computes a wrong result (nodes whose output keeps a value name from
//! before the pass come first, so that a comparison by name can single them out). A node with a constant weight operand (Conv,
//! ConvTranspose, MatMul, Gemm, and the normalizations' scale) gets that constant scaled by
//! 1.25; any other node gets its first non-constant float operand scaled by 1.25 (a new `Mul`
//! in front of it). The node keeps its name, operator and output names, so a comparison by value
//! name finds the perturbed node itself. Scale-invariant nodes (normalizations without a
//! constant scale) are passed over, since scaling their operand would not change them.
//!
//! An injected fault is never silent: the manager prints a warning naming the node.

use kiln_ir::rewrite::{rebuild, remove_dead, Rewrite};
use kiln_ir::tensor::TensorData;
use kiln_ir::{Binary, Graph, IrError, Node, NodeId, Op, Tensor, ValueId};
use std::collections::{HashMap, HashSet};

/// The environment variable naming the pass after which a fault is injected.
pub const ENV: &str = "KILN_INJECT_FAULT";

/// The factor the perturbed operand is scaled by.
const FACTOR: f64 = 1.25;

/// Whether `KILN_INJECT_FAULT` names `pass`.
pub fn requested_for(pass: &str) -> bool {
    std::env::var(ENV).is_ok_and(|v| v == pass)
}

/// The perturbed node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Injected {
    pub node: String,
    pub op: &'static str,
    /// What was changed, e.g. `its input 1 ('w') scaled by 1.25`.
    pub how: String,
}

#[derive(Clone, Copy)]
enum Perturb {
    /// Scale the constant operand `i`.
    Constant(usize),
    /// Scale the variable operand `i` with a `Mul` in front of the node.
    Operand(usize),
}

/// Perturbs the first node of `after` that is not in `before` as it is there (same name,
/// operator, output names, input names and constant inputs). Returns which node, or None when
/// no node the pass created or changed can be perturbed.
pub fn inject(before: &Graph, after: &mut Graph) -> Result<Option<Injected>, IrError> {
    let old: HashMap<&str, &Node> = before.nodes().iter().map(|n| (n.name.as_str(), n)).collect();
    let old_values: HashSet<&str> = before
        .nodes()
        .iter()
        .flat_map(|n| n.outputs.iter().map(|o| o.name.as_str()))
        .collect();
    let candidates: Vec<(NodeId, Perturb, bool)> = after
        .node_ids()
        .zip(after.nodes())
        .filter(|(id, node)| {
            !matches!(node.op, Op::Input | Op::Constant(_))
                && after.value_type(id.out(0)).dtype.is_float()
                && !old
                    .get(node.name.as_str())
                    .is_some_and(|o| same_node(before, o, after, node))
        })
        .filter_map(|(id, node)| {
            let kept_name = node.outputs.iter().any(|o| old_values.contains(o.name.as_str()));
            perturbation(after, node).map(|p| (id, p, kept_name))
        })
        .collect();
    // A node whose output keeps a name from before the pass first: comparing values by name
    // (what `kiln verify` does) can then tell that node itself is wrong. Nodes with new value
    // names (an inserted Transpose) only when there is nothing else.
    let mut candidates = candidates.into_iter();
    let Some((target, perturb, _)) = candidates.clone().find(|c| c.2).or_else(|| candidates.next()) else {
        return Ok(None);
    };
    let node = after.node(target);
    let input_name = |i: usize| {
        node.inputs[i]
            .map(|v| after.value_name(v).to_string())
            .unwrap_or_default()
    };
    let injected = Injected {
        node: node.name.clone(),
        op: node.op.name(),
        how: match perturb {
            Perturb::Constant(i) => {
                format!("its constant input {i} ('{}') scaled by {FACTOR}", input_name(i))
            }
            Perturb::Operand(i) => format!("its input {i} ('{}') scaled by {FACTOR}", input_name(i)),
        },
    };
    let perturbed = rebuild(after, |dst, id, node, inputs| {
        if id != target {
            return Ok(Rewrite::Keep);
        }
        let mut inputs = inputs.to_vec();
        match perturb {
            Perturb::Constant(i) => {
                let v = inputs[i].expect("chosen input is present");
                let t = dst.known_value(v).expect("chosen input is constant");
                let scaled = scale(t, FACTOR)?;
                let name = format!("{}.fault", dst.value_name(v));
                inputs[i] = Some(dst.add_const(name, scaled));
            }
            Perturb::Operand(i) => {
                let v = inputs[i].expect("chosen input is present");
                let dtype = dst.value_type(v).dtype;
                let k = Tensor::new(vec![], TensorData::from_f64s(dtype, [FACTOR]))
                    .map_err(|e| IrError::node(&node.name, node.op.name(), e.to_string()))?;
                let k = dst.add_const(format!("{}.fault_factor", node.name), k);
                let name = dst.value_name(v).to_string();
                inputs[i] = Some(dst.add(
                    format!("{}.fault", node.name),
                    Op::Binary(Binary::Mul),
                    vec![Some(v), Some(k)],
                    format!("{name}.fault"),
                )?);
            }
        }
        let names = node.outputs.iter().map(|o| o.name.clone()).collect();
        Ok(Rewrite::Replace(dst.add_node(
            node.name.clone(),
            node.op.clone(),
            inputs,
            names,
        )?))
    })?;
    *after = remove_dead(&perturbed)?;
    Ok(Some(injected))
}

fn scale(t: &Tensor, k: f64) -> Result<Tensor, IrError> {
    let vals = t.to_f64_vec().into_iter().map(|x| x * k);
    Tensor::new(t.shape().to_vec(), TensorData::from_f64s(t.dtype(), vals))
        .map_err(|e| IrError::Invalid(format!("fault injection: {e}")))
}

/// Whether node `b` of `gb` is node `a` of `ga` unchanged.
fn same_node(ga: &Graph, a: &Node, gb: &Graph, b: &Node) -> bool {
    let names = |g: &Graph, n: &Node| -> Vec<Option<String>> {
        n.inputs
            .iter()
            .map(|v| v.map(|v| g.value_name(v).to_string()))
            .collect()
    };
    let consts_equal = a.inputs.iter().zip(&b.inputs).all(|(x, y)| match (x, y) {
        (Some(x), Some(y)) => match (ga.known_value(*x), gb.known_value(*y)) {
            (Some(s), Some(t)) => s == t,
            (None, None) => true,
            _ => false,
        },
        _ => true,
    });
    a.op == b.op
        && a.outputs
            .iter()
            .map(|o| &o.name)
            .eq(b.outputs.iter().map(|o| &o.name))
        && names(ga, a) == names(gb, b)
        && consts_equal
}

/// How to perturb `node`, if it can be.
fn perturbation(g: &Graph, node: &Node) -> Option<Perturb> {
    let weight = match node.op {
        Op::Conv(_)
        | Op::ConvTranspose(_)
        | Op::MatMul
        | Op::Gemm { .. }
        | Op::LayerNorm { .. }
        | Op::InstanceNorm { .. }
        | Op::GroupNorm { .. }
        | Op::BatchNorm { .. } => Some(1),
        _ => None,
    };
    let nonzero_float_const = |v: ValueId| {
        g.known_value(v)
            .is_some_and(|t| t.dtype().is_float() && t.to_f64_vec().iter().any(|x| *x != 0.0))
    };
    if let Some(i) = weight.filter(|&i| {
        node.inputs
            .get(i)
            .copied()
            .flatten()
            .is_some_and(nonzero_float_const)
    }) {
        return Some(Perturb::Constant(i));
    }
    let scale_invariant = matches!(
        node.op,
        Op::LayerNorm { .. }
            | Op::InstanceNorm { .. }
            | Op::GroupNorm { .. }
            | Op::LpNorm { .. }
            | Op::MeanVarianceNorm { .. }
            | Op::Hardmax { .. }
            | Op::ArgMax { .. }
            | Op::ArgMin { .. }
    );
    if scale_invariant {
        return None;
    }
    node.inputs
        .iter()
        .position(|v| v.is_some_and(|v| g.value_type(v).dtype.is_float() && g.known_value(v).is_none()))
        .map(Perturb::Operand)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{DType, TensorType, Unary};

    fn graph(op: Unary) -> Graph {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[4]));
        let w = g.add_const("w", Tensor::from_vec(vec![4, 4], vec![0.5f32; 16]));
        let m = g.add("mm", Op::MatMul, vec![Some(x), Some(w)], "m").unwrap();
        let y = g.add("act", Op::Unary(op), vec![Some(m)], "y").unwrap();
        g.add_output("y", y);
        g
    }

    fn run(g: &Graph) -> Vec<f64> {
        let x = Tensor::from_vec(vec![4], vec![0.1f32, -0.2, 0.3, 0.4]);
        kiln_ir::eval::eval_graph(g, vec![x]).unwrap()[0].to_f64_vec()
    }

    #[test]
    fn perturbs_the_changed_node_in_place() {
        let before = graph(Unary::Relu);
        let mut after = graph(Unary::Sigmoid);
        let clean = run(&after);
        let f = inject(&before, &mut after).unwrap().expect("a node changed");
        assert_eq!((f.node.as_str(), f.op), ("act", "Sigmoid"));
        kiln_ir::verify(&after).unwrap();
        assert_ne!(run(&after), clean);
        // The node keeps its name and output name, so a comparison by name finds it.
        let out = after.outputs()[0].value;
        assert_eq!(after.node(out.node).name, "act");
        assert_eq!(after.value_name(out), "y");
    }

    #[test]
    fn scales_a_changed_weight_and_leaves_unchanged_graphs_alone() {
        let before = graph(Unary::Relu);
        let mut same = before.clone();
        assert_eq!(inject(&before, &mut same).unwrap(), None);
        assert_eq!(same, before);
        // A pass that rewrote the MatMul's weights (as freeze does when folding).
        let mut after = Graph::new("t");
        let x = after.add_input("x", TensorType::fixed(DType::F32, &[4]));
        let w = after.add_const("w.folded", Tensor::from_vec(vec![4, 4], vec![0.25f32; 16]));
        let m = after.add("mm", Op::MatMul, vec![Some(x), Some(w)], "m").unwrap();
        let y = after
            .add("act", Op::Unary(Unary::Relu), vec![Some(m)], "y")
            .unwrap();
        after.add_output("y", y);
        let clean = run(&after);
        let f = inject(&before, &mut after).unwrap().expect("the MatMul changed");
        assert_eq!(f.node, "mm");
        assert!(f.how.contains("constant input 1"), "{}", f.how);
        for (got, clean) in run(&after).iter().zip(&clean) {
            assert!((got - clean * 1.25).abs() < 1e-6, "{got} vs {clean} * 1.25");
        }
    }
}
