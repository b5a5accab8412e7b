//! Folds an inference BatchNormalization into the convolution before it: with
//! `k = scale / sqrt(var + eps)`, `W'[m] = W[m] * k[m]` and `b'[m] = (b[m] - mean[m]) * k[m] + B[m]`.
//! Applies when the Conv's weights (and bias) and all BN parameters are constants, the Conv's
//! output feeds only the BN, and the dtype is f32 or f64. The arithmetic is done in f64.

use crate::Pass;
use kiln_ir::rewrite::{rebuild, use_counts, Rewrite};
use kiln_ir::{DType, Graph, IrError, NodeId, Op, Tensor};
use std::collections::HashMap;

pub struct FoldBatchNorm;

/// New weights and bias for a Conv, keyed by the Conv's node, and the BN nodes it absorbs.
struct Folds {
    conv: HashMap<NodeId, (Tensor, Tensor)>,
    bn: HashMap<NodeId, NodeId>,
}

fn plan(graph: &Graph) -> Folds {
    let uses = use_counts(graph);
    let mut folds = Folds {
        conv: HashMap::new(),
        bn: HashMap::new(),
    };
    for (id, node) in graph.node_ids().zip(graph.nodes()) {
        let Op::BatchNorm { epsilon } = node.op else {
            continue;
        };
        let Some(x) = node.inputs[0] else { continue };
        let conv = graph.node(x.node);
        if !matches!(conv.op, Op::Conv(_))
            || uses.get(&x).copied() != Some(1)
            || folds.conv.contains_key(&x.node)
        {
            continue;
        }
        let known = |v: Option<kiln_ir::ValueId>| v.and_then(|v| graph.known_value(v));
        let (Some(w), bias) = (known(conv.inputs[1]), conv.inputs.get(2).copied().flatten()) else {
            continue;
        };
        if !matches!(w.dtype(), DType::F32 | DType::F64) {
            continue;
        }
        let b = match bias {
            Some(b) => match graph.known_value(b) {
                Some(t) => Some(t.to_f64_vec()),
                None => continue,
            },
            None => None,
        };
        let params: Option<Vec<Vec<f64>>> = (1..5)
            .map(|i| known(node.inputs[i]).map(|t| t.to_f64_vec()))
            .collect();
        let Some(p) = params else { continue };
        let m = w.shape()[0];
        if p.iter().any(|v| v.len() != m) || b.as_ref().is_some_and(|b| b.len() != m) {
            continue;
        }
        let k: Vec<f64> = (0..m)
            .map(|i| p[0][i] / (p[3][i] + f64::from(epsilon)).sqrt())
            .collect();
        let per = w.len() / m.max(1);
        let wv = w.to_f64_vec();
        let new_w: Vec<f64> = wv
            .iter()
            .enumerate()
            .map(|(i, &v)| v * k[i / per.max(1)])
            .collect();
        let new_b: Vec<f64> = (0..m)
            .map(|i| (b.as_ref().map_or(0.0, |b| b[i]) - p[2][i]) * k[i] + p[1][i])
            .collect();
        let dt = w.dtype();
        let (Ok(wt), Ok(bt)) = (
            Tensor::new(
                w.shape().to_vec(),
                kiln_ir::tensor::TensorData::from_f64s(dt, new_w),
            ),
            Tensor::new(vec![m], kiln_ir::tensor::TensorData::from_f64s(dt, new_b)),
        ) else {
            continue;
        };
        folds.conv.insert(x.node, (wt, bt));
        folds.bn.insert(id, x.node);
    }
    folds
}

impl Pass for FoldBatchNorm {
    fn name(&self) -> &'static str {
        "fold-batchnorm"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        let folds = plan(graph);
        if folds.bn.is_empty() {
            return Ok(0);
        }
        let mut conv_out = HashMap::new();
        let new = rebuild(graph, |dst, id, node, inputs| {
            if let Some((w, b)) = folds.conv.get(&id) {
                let wv = dst.add_const(format!("{}.folded_weight", node.name), w.clone());
                let bv = dst.add_const(format!("{}.folded_bias", node.name), b.clone());
                let out = dst.add(
                    node.name.clone(),
                    node.op.clone(),
                    vec![inputs[0], Some(wv), Some(bv)],
                    node.outputs[0].name.clone(),
                )?;
                conv_out.insert(id, out);
                return Ok(Rewrite::Replace(vec![out]));
            }
            if let Some(conv) = folds.bn.get(&id) {
                return Ok(Rewrite::Replace(vec![conv_out[conv]]));
            }
            Ok(Rewrite::Keep)
        })?;
        *graph = new;
        Ok(folds.bn.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{ConvAttrs, TensorType};

    fn conv_bn(with_bias: bool, extra_use: bool) -> Graph {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[1, 2, 5, 5]));
        let w: Vec<f32> = (0..3 * 2 * 9).map(|i| (i as f32 * 0.37).sin()).collect();
        let w = g.add_const("w", Tensor::from_vec(vec![3, 2, 3, 3], w));
        let mut ins = vec![Some(x), Some(w)];
        if with_bias {
            ins.push(Some(
                g.add_const("b", Tensor::from_vec(vec![3], vec![0.5f32, -1.0, 2.0])),
            ));
        }
        let attrs = ConvAttrs {
            kernel_shape: vec![3, 3],
            strides: vec![1, 1],
            pads: vec![1, 1, 1, 1],
            dilations: vec![1, 1],
            group: 1,
            ..ConvAttrs::default()
        };
        let c = g.add("conv", Op::Conv(attrs), ins, "c").unwrap();
        let p = |g: &mut Graph, n: &str, v: [f32; 3]| g.add_const(n, Tensor::from_vec(vec![3], v.to_vec()));
        let s = p(&mut g, "s", [1.5, 0.5, -2.0]);
        let bb = p(&mut g, "bb", [0.1, 0.2, 0.3]);
        let m = p(&mut g, "m", [0.3, -0.2, 1.0]);
        let v = p(&mut g, "v", [2.0, 0.5, 1.5]);
        let y = g
            .add(
                "bn",
                Op::BatchNorm { epsilon: 1e-5 },
                vec![Some(c), Some(s), Some(bb), Some(m), Some(v)],
                "y",
            )
            .unwrap();
        g.add_output("y", y);
        if extra_use {
            g.add_output("c", c);
        }
        g
    }

    fn eval(g: &Graph) -> Vec<Tensor> {
        let x: Vec<f32> = (0..50).map(|i| (i as f32 * 0.11).cos()).collect();
        kiln_ir::eval::eval_graph(g, vec![Tensor::from_vec(vec![1, 2, 5, 5], x)]).unwrap()
    }

    #[test]
    fn folds_into_conv_with_and_without_bias() {
        for bias in [true, false] {
            let mut g = conv_bn(bias, false);
            let want = eval(&g);
            assert_eq!(FoldBatchNorm.run(&mut g).unwrap(), 1);
            assert!(!g.nodes().iter().any(|n| matches!(n.op, Op::BatchNorm { .. })));
            let got = eval(&g);
            for (a, b) in want[0].to_f64_vec().iter().zip(got[0].to_f64_vec()) {
                assert!((a - b).abs() <= 1e-5 * (1.0 + a.abs()), "{a} vs {b}");
            }
        }
    }

    #[test]
    fn leaves_a_conv_whose_output_is_used_elsewhere() {
        let mut g = conv_bn(true, true);
        assert_eq!(FoldBatchNorm.run(&mut g).unwrap(), 0);
        assert!(g.nodes().iter().any(|n| matches!(n.op, Op::BatchNorm { .. })));
    }
}
