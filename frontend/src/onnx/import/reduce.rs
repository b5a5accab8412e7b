//! Import of reductions (`Reduce*`), `ArgMax`/`ArgMin`, `TopK` and `CumSum`.

use super::NodeCtx;
use crate::error::Result;
use kiln_ir::{Op, ReduceKind, ValueId};

pub(super) fn import(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let op_type = cx.op_type().to_string();
    if let Some(kind) = reduce_kind(&op_type) {
        return Ok(vec![reduce(cx, kind)?]);
    }
    match op_type.as_str() {
        "ArgMax" | "ArgMin" => {
            let axis = cx.attr_i("axis", 0);
            let keepdims = cx.attr_flag("keepdims", true)?;
            let select_last_index = cx.attr_flag("select_last_index", false)?;
            let op = if op_type == "ArgMax" {
                Op::ArgMax {
                    axis,
                    keepdims,
                    select_last_index,
                }
            } else {
                Op::ArgMin {
                    axis,
                    keepdims,
                    select_last_index,
                }
            };
            let inputs = cx.inputs().to_vec();
            Ok(vec![cx.add1(op, inputs)?])
        }
        "TopK" => topk(cx),
        "CumSum" | "CumProd" => {
            let (exclusive, reverse) = (cx.attr_flag("exclusive", false)?, cx.attr_flag("reverse", false)?);
            let op = if op_type == "CumSum" {
                Op::CumSum { exclusive, reverse }
            } else {
                Op::CumProd { exclusive, reverse }
            };
            let inputs = cx.inputs().to_vec();
            Ok(vec![cx.add1(op, inputs)?])
        }
        other => Err(cx.err(format!("{other} is not a reduction"))),
    }
}

fn reduce_kind(op_type: &str) -> Option<ReduceKind> {
    Some(match op_type {
        "ReduceSum" => ReduceKind::Sum,
        "ReduceMean" => ReduceKind::Mean,
        "ReduceMax" => ReduceKind::Max,
        "ReduceMin" => ReduceKind::Min,
        "ReduceProd" => ReduceKind::Prod,
        "ReduceL1" => ReduceKind::L1,
        "ReduceL2" => ReduceKind::L2,
        "ReduceLogSum" => ReduceKind::LogSum,
        "ReduceLogSumExp" => ReduceKind::LogSumExp,
        "ReduceSumSquare" => ReduceKind::SumSquare,
        _ => return None,
    })
}

/// `Reduce*`: `axes` became an input in opset 13 (ReduceSum) or 18 (the others), together
/// with `noop_with_empty_axes`; the older attribute becomes a constant input.
fn reduce(cx: &mut NodeCtx, kind: ReduceKind) -> Result<ValueId> {
    let axes_input_since = if kind == ReduceKind::Sum { 13 } else { 18 };
    let keepdims = cx.attr_flag("keepdims", true)?;
    let data = cx.input(0)?;
    let (axes, noop_with_empty_axes) = if cx.opset() < axes_input_since {
        if cx.num_inputs() > 1 {
            return Err(cx.err(format!(
                "axes is an attribute before opset {axes_input_since}, not an input"
            )));
        }
        let axes = match cx.attr_ints("axes") {
            Some(axes) if !axes.is_empty() => Some(cx.const_i64s(&axes)),
            _ => None,
        };
        (axes, false)
    } else {
        if cx.has_attr("axes") {
            return Err(cx.err(format!(
                "axes is an input since opset {axes_input_since}, not an attribute"
            )));
        }
        (cx.opt_input(1), cx.attr_flag("noop_with_empty_axes", false)?)
    };
    if cx.num_inputs() > 2 {
        return Err(cx.err(format!("takes at most 2 inputs, got {}", cx.num_inputs())));
    }
    let op = Op::Reduce {
        kind,
        keepdims,
        noop_with_empty_axes,
    };
    cx.add1(op, vec![Some(data), axes])
}

/// `TopK`: before opset 10, `k` is an attribute (it becomes a constant input); `largest` and
/// `sorted` exist from opset 11 (both default to 1).
fn topk(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let x = cx.input(0)?;
    let k = if cx.opset() < 10 {
        let Some(k) = cx.attr_opt_i("k") else {
            return Err(cx.err("attribute 'k' is required before opset 10"));
        };
        if k < 0 {
            return Err(cx.err(format!("attribute 'k' must be non-negative, got {k}")));
        }
        cx.const_i64s(&[k])
    } else {
        cx.input(1)?
    };
    let op = Op::TopK {
        axis: cx.attr_i("axis", -1),
        largest: cx.attr_flag("largest", true)?,
        sorted: cx.attr_flag("sorted", true)?,
    };
    if cx.num_outputs() != 2 {
        return Err(cx.err(format!(
            "TopK has 2 outputs (values, indices), the node declares {}",
            cx.num_outputs()
        )));
    }
    cx.add(op, vec![Some(x), Some(k)])
}

#[cfg(test)]
mod tests {
    use super::super::elementwise::testing::*;
    use crate::onnx::proto::data_type as dt;
    use kiln_ir::{DType, Dim, Op, ReduceKind, Tensor, TensorType};

    fn output_type(g: &kiln_ir::Graph, i: usize) -> TensorType {
        g.value_type(g.outputs()[i].value).clone()
    }

    #[test]
    fn axes_attribute_becomes_a_constant_input() {
        let attrs = vec![attr_ints("axes", &[1, -1]), attr_i("keepdims", 0)];
        let g = import_one("ReduceSum", vec![input(0, dt::FLOAT, &[2, 3, 4])], attrs, 1, 11).unwrap();
        let node = g.nodes().last().unwrap();
        assert_eq!(
            node.op,
            Op::Reduce {
                kind: ReduceKind::Sum,
                keepdims: false,
                noop_with_empty_axes: false
            }
        );
        let axes = g.known_value(node.inputs[1].unwrap()).unwrap();
        assert_eq!(axes, &Tensor::from_vec(vec![2], vec![1i64, -1]));
        assert_eq!(output_type(&g, 0), TensorType::fixed(DType::F32, &[2]));
    }

    #[test]
    fn axes_form_follows_the_opset() {
        let x = || vec![input(0, dt::FLOAT, &[2, 3])];
        // ReduceMean took axes as an attribute until opset 18.
        assert!(import_one("ReduceMean", x(), vec![attr_ints("axes", &[0])], 1, 13).is_ok());
        assert!(import_one("ReduceMean", x(), vec![attr_ints("axes", &[0])], 1, 18).is_err());
        let with_axes_input = vec![input(0, dt::FLOAT, &[2, 3]), input(1, dt::INT64, &[1])];
        assert!(import_one("ReduceMean", with_axes_input.clone(), vec![], 1, 13).is_err());
        assert!(import_one("ReduceSum", with_axes_input, vec![], 1, 13).is_ok());
    }

    #[test]
    fn run_time_axes_leave_the_reduced_dims_unknown() {
        let ins = vec![input(0, dt::FLOAT, &[2, 1, 3]), input(1, dt::INT64, &[2])];
        let g = import_one("ReduceMax", ins.clone(), vec![], 1, 18).unwrap();
        let shape = output_type(&g, 0).shape;
        assert_eq!(shape, vec![Dim::unknown(), Dim::Fixed(1), Dim::unknown()]);
        let g = import_one("ReduceMax", ins, vec![attr_i("keepdims", 0)], 1, 18).unwrap();
        assert_eq!(output_type(&g, 0).rank(), 1);
    }

    #[test]
    fn topk_k_attribute_before_opset_10() {
        let g = import_one(
            "TopK",
            vec![input(0, dt::FLOAT, &[3, 5])],
            vec![attr_i("k", 2)],
            2,
            9,
        )
        .unwrap();
        assert_eq!(output_type(&g, 0), TensorType::fixed(DType::F32, &[3, 2]));
        assert_eq!(output_type(&g, 1), TensorType::fixed(DType::I64, &[3, 2]));
        let attrs = vec![attr_i("k", 6)];
        let err = import_one("TopK", vec![input(0, dt::FLOAT, &[3, 5])], attrs, 2, 9).unwrap_err();
        assert!(err.to_string().contains("exceeds"), "{err}");
    }

    #[test]
    fn flags_must_be_zero_or_one() {
        let x = || vec![input(0, dt::FLOAT, &[2, 3])];
        assert!(import_one("ArgMax", x(), vec![attr_i("keepdims", 2)], 1, 13).is_err());
        assert!(import_one("ArgMin", x(), vec![attr_i("select_last_index", 1)], 1, 13).is_ok());
    }
}
