//! `fake-quantize`: a QuantizeLinear whose integer result is read by a DequantizeLinear with the
//! same per-tensor scale and zero point — the pair quantizers put around every activation of a
//! QDQ model — is computed in float as the rounding it stands for:
//!
//! ```text
//! DequantizeLinear(QuantizeLinear(x, s, zp), s, zp) = Clip(Round(x / s), lo - zp, hi - zp) · s
//! ```
//!
//! (`lo`, `hi`: the integer type's range). Both sides are the same float operations on the same
//! values: `Round(x / s)` is an integer-valued float, adding and subtracting the zero point is
//! exact for these magnitudes, and clipping the shifted value equals clipping before the shift.
//! The one difference is a NaN input, which the pair turns into `(lo - zp) · s` and the float
//! form keeps as NaN.
//!
//! Why: the four operators are elementwise, so codegen fuses them into one vector loop with
//! their neighbours, and the channels-last pass carries them (a QuantizeLinear is a layout
//! boundary, so every pair cost two transposes in an NHWC model). Weights' DequantizeLinear has
//! constant input and is folded by `freeze` before this runs. A pair whose integer value is
//! also read by something other than a DequantizeLinear (an integer convolution, from
//! `integer-products`; a graph output) is left alone: the QuantizeLinear runs anyway, and its
//! DequantizeLinears then read one byte per value instead of rounding the float again.

use crate::Pass;
use kiln_ir::ops::quant_range;
use kiln_ir::rewrite::{rebuild, remove_dead, Rewrite};
use kiln_ir::{Binary, DType, Graph, IrError, Node, Op, QuantOp, Tensor, Unary, ValueId};
use std::collections::HashSet;

pub struct FakeQuantize;

/// The pass's name (`--disable-pass`, `--print-after`).
pub const NAME: &str = "fake-quantize";

impl Pass for FakeQuantize {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        let kept = integers_read_elsewhere(graph);
        let mut rewrites = 0;
        let rebuilt = rebuild(graph, |dst, _, node, inputs| {
            let Some(pair) = quantize_pair(graph, node) else {
                return Ok(Rewrite::Keep);
            };
            if node.inputs[0].is_some_and(|q| kept.contains(&q)) {
                return Ok(Rewrite::Keep);
            }
            rewrites += 1;
            let q_out = inputs[0].ok_or_else(|| IrError::Invalid(format!("{}: no input", node.name)))?;
            Ok(Rewrite::Replace(vec![emit(dst, node, q_out, &pair)?]))
        })?;
        if rewrites > 0 {
            *graph = remove_dead(&rebuilt)?;
        }
        Ok(rewrites)
    }
}

/// The values that something other than a DequantizeLinear reads, or that are graph outputs.
fn integers_read_elsewhere(graph: &Graph) -> HashSet<ValueId> {
    let mut kept: HashSet<ValueId> = graph.outputs().iter().map(|o| o.value).collect();
    for node in graph.nodes() {
        if !matches!(node.op, Op::Quant(QuantOp::DequantizeLinear { .. })) {
            kept.extend(node.inputs.iter().flatten().copied());
        }
    }
    kept
}

/// The parameters of a fake-quantized value.
struct Pair {
    scale: f32,
    zero_point: f64,
    range: (f64, f64),
}

/// A per-tensor, constant scalar parameter of a node (input `i`), as f64.
fn scalar(graph: &Graph, node: &Node, i: usize) -> Option<(f64, DType)> {
    let v = (*node.inputs.get(i)?)?;
    let t = graph.known_value(v)?;
    (t.len() == 1).then(|| (t.to_f64_vec()[0], t.dtype()))
}

/// When `node` is a DequantizeLinear to f32 of a QuantizeLinear of an f32 value with the same
/// per-tensor constant scale and zero point: those parameters.
fn quantize_pair(graph: &Graph, node: &Node) -> Option<Pair> {
    let Op::Quant(QuantOp::DequantizeLinear {
        block_size: 0,
        output_dtype,
        ..
    }) = node.op
    else {
        return None;
    };
    if output_dtype.is_some_and(|d| d != DType::F32) {
        return None;
    }
    let q = graph.node(node.inputs[0]?.node);
    let Op::Quant(QuantOp::QuantizeLinear {
        block_size: 0,
        output_dtype: int_dtype,
        precision: None,
        ..
    }) = q.op
    else {
        return None;
    };
    let x = q.inputs[0]?;
    if graph.value_type(x).dtype != DType::F32 {
        return None;
    }
    let (scale, scale_dtype) = scalar(graph, q, 1)?;
    if scale_dtype != DType::F32 || scalar(graph, node, 1) != Some((scale, DType::F32)) || scale <= 0.0 {
        return None;
    }
    let zero = |n: &Node| match n.inputs.get(2).copied().flatten() {
        None => Some(0.0),
        Some(_) => scalar(graph, n, 2).map(|(z, _)| z),
    };
    let zero_point = zero(q)?;
    if zero(node)? != zero_point {
        return None;
    }
    Some(Pair {
        scale: scale as f32,
        zero_point,
        range: quant_range(int_dtype)?,
    })
}

/// `Clip(Round(x / s), lo - zp, hi - zp) · s` in `dst`, where `q_out` is the QuantizeLinear's
/// output there; named after the DequantizeLinear `dq`, whose output name the product keeps.
fn emit(dst: &mut Graph, dq: &Node, q_out: ValueId, p: &Pair) -> Result<ValueId, IrError> {
    let name = dq.name.as_str();
    let x = dst
        .node(q_out.node)
        .inputs
        .first()
        .copied()
        .flatten()
        .ok_or_else(|| IrError::Invalid(format!("{name}: QuantizeLinear without input")))?;
    let scale = dst.add_const(format!("{name}_scale"), Tensor::scalar(p.scale));
    let lo = dst.add_const(
        format!("{name}_lo"),
        Tensor::scalar((p.range.0 - p.zero_point) as f32),
    );
    let hi = dst.add_const(
        format!("{name}_hi"),
        Tensor::scalar((p.range.1 - p.zero_point) as f32),
    );
    let div = dst.add(
        format!("{name}_div"),
        Op::Binary(Binary::Div),
        vec![Some(x), Some(scale)],
        format!("{name}_div"),
    )?;
    let round = dst.add(
        format!("{name}_round"),
        Op::Unary(Unary::Round),
        vec![Some(div)],
        format!("{name}_round"),
    )?;
    let clip = dst.add(
        format!("{name}_clip"),
        Op::Clip,
        vec![Some(round), Some(lo), Some(hi)],
        format!("{name}_clip"),
    )?;
    let out = dq.outputs[0].name.clone();
    dst.add(name, Op::Binary(Binary::Mul), vec![Some(clip), Some(scale)], out)
}

#[cfg(test)]
mod tests {
    use super::FakeQuantize;
    use crate::Pass;
    use kiln_ir::{DType, Dim, Graph, Op, QuantOp, Tensor, TensorType, Unary};

    /// `x -> QuantizeLinear -> DequantizeLinear -> Relu` with the DequantizeLinear's scale and
    /// both zero points as given; with `keep_int` the quantized value is a second graph output.
    fn pair_graph(dq_scale: f32, zp: u8, keep_int: bool) -> Graph {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::new(DType::F32, vec![Dim::Fixed(7)]));
        let s = g.add_const("s", Tensor::scalar(0.05f32));
        let z = g.add_const("z", Tensor::scalar(zp));
        let q_op = Op::Quant(QuantOp::QuantizeLinear {
            axis: 1,
            block_size: 0,
            output_dtype: DType::U8,
            precision: None,
        });
        let q = g.add("q", q_op, vec![Some(x), Some(s), Some(z)], "xq").unwrap();
        let s2 = g.add_const("s2", Tensor::scalar(dq_scale));
        let dq_op = Op::Quant(QuantOp::DequantizeLinear {
            axis: 1,
            block_size: 0,
            output_dtype: None,
        });
        let dq = g
            .add("dq", dq_op, vec![Some(q), Some(s2), Some(z)], "xdq")
            .unwrap();
        let y = g
            .add("relu", Op::Unary(Unary::Relu), vec![Some(dq)], "y")
            .unwrap();
        g.add_output("y", y);
        if keep_int {
            g.add_output("xq", q);
        }
        g
    }

    fn run(g: &Graph) -> Vec<Tensor> {
        // Values around the rounding boundaries and past both saturation limits.
        let x = Tensor::from_vec(vec![7], vec![-9.0f32, -0.025, 0.025, 0.075, 1.2345, 6.35, 40.0]);
        kiln_ir::eval::eval_graph(g, vec![x]).unwrap()
    }

    fn count(g: &Graph, f: impl Fn(&Op) -> bool) -> usize {
        g.nodes().iter().filter(|n| f(&n.op)).count()
    }

    #[test]
    fn a_pair_becomes_float_rounding_with_the_same_values() {
        let before = pair_graph(0.05, 128, false);
        let mut after = before.clone();
        assert_eq!(FakeQuantize.run(&mut after).unwrap(), 1);
        assert_eq!(run(&before), run(&after));
        let quant = |g: &Graph| count(g, |op| matches!(op, Op::Quant(_)));
        assert_eq!(quant(&after), 0);
    }

    #[test]
    fn a_pair_whose_integers_are_read_elsewhere_is_left_alone() {
        // The QuantizeLinear runs anyway; its DequantizeLinear reads the integers.
        let mut g = pair_graph(0.05, 128, true);
        assert_eq!(FakeQuantize.run(&mut g).unwrap(), 0);
    }

    #[test]
    fn different_parameters_are_left_alone() {
        let mut g = pair_graph(0.1, 128, false);
        assert_eq!(FakeQuantize.run(&mut g).unwrap(), 0);
    }
}
