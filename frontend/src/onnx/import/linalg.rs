//! Import of MatMul, Gemm and Einsum.

use super::NodeCtx;
use crate::error::Result;
use kiln_ir::{Op, ValueId};

pub(super) fn import(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    match cx.op_type() {
        "MatMul" => {
            let (a, b) = (cx.input(0)?, cx.input(1)?);
            Ok(vec![cx.add1(Op::MatMul, vec![Some(a), Some(b)])?])
        }
        "Gemm" => import_gemm(cx),
        "Einsum" => import_einsum(cx),
        other => Err(cx.err(format!("{other} is not a linear algebra operator"))),
    }
}

/// Gemm from opset 7 on: C is optional from opset 11 (earlier models always give it) and is
/// broadcast unidirectionally; the pre-7 `broadcast` attribute does not exist any more.
fn import_gemm(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let (a, b) = (cx.input(0)?, cx.input(1)?);
    let c = cx.opt_input(2);
    if c.is_none() && cx.opset() < 11 {
        return Err(cx.err("input C is required before opset 11"));
    }
    let op = Op::Gemm {
        alpha: cx.attr_f("alpha", 1.0),
        beta: cx.attr_f("beta", 1.0),
        trans_a: cx.attr_flag("transA", false)?,
        trans_b: cx.attr_flag("transB", false)?,
    };
    Ok(vec![cx.add1(op, vec![Some(a), Some(b), c])?])
}

fn import_einsum(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    if cx.opset() < 12 {
        return Err(cx.err(format!("Einsum is not defined in opset {}", cx.opset())));
    }
    if !cx.has_attr("equation") {
        return Err(cx.err("attribute 'equation' is required"));
    }
    let equation = cx.attr_s("equation", "");
    if cx.num_inputs() == 0 {
        return Err(cx.err("Einsum needs at least one input"));
    }
    let inputs = (0..cx.num_inputs())
        .map(|i| cx.input(i).map(Some))
        .collect::<Result<Vec<_>>>()?;
    Ok(vec![cx.add1(Op::Einsum { equation }, inputs)?])
}
