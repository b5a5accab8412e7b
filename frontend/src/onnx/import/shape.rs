//! Import of the data movement and shape operators.
//!
//! Older opsets gave some operands as attributes (Squeeze/Unsqueeze `axes` before 13, Split
//! `split` before 13, Slice `starts/ends/axes` before 10, Pad `pads/value` before 11); they
//! become constant inputs here, so the IR has one form. Dropout is an inference-time identity,
//! and Constant nodes become graph constants.

use super::NodeCtx;
use crate::error::Result;
use crate::onnx::tensor::dtype_from_onnx;
use kiln_ir::{Op, PadMode, ScatterReduction, Tensor, ValueId};

pub(super) fn import(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let node = cx.node;
    match node.op_type.as_str() {
        "Reshape" => {
            let allow_zero = cx.attr_flag("allowzero", false)?;
            single(cx, Op::Reshape { allow_zero }, 2, 2)
        }
        "Flatten" => {
            let axis = cx.attr_i("axis", 1);
            single(cx, Op::Flatten { axis }, 1, 1)
        }
        "Transpose" => transpose(cx),
        "Squeeze" => squeeze(cx, false),
        "Unsqueeze" => squeeze(cx, true),
        "Concat" => {
            let Some(axis) = cx.attr_opt_i("axis") else {
                return Err(cx.err("attribute 'axis' is required"));
            };
            single(cx, Op::Concat { axis }, 1, usize::MAX)
        }
        "Split" => split(cx),
        "Slice" => slice(cx),
        "Gather" => {
            let axis = cx.attr_i("axis", 0);
            single(cx, Op::Gather { axis }, 2, 2)
        }
        "GatherElements" => {
            let axis = cx.attr_i("axis", 0);
            single(cx, Op::GatherElements { axis }, 2, 2)
        }
        "GatherND" => {
            let b = cx.attr_i("batch_dims", 0);
            let batch_dims =
                usize::try_from(b).map_err(|_| cx.err(format!("batch_dims must be >= 0, got {b}")))?;
            single(cx, Op::GatherND { batch_dims }, 2, 2)
        }
        "ScatterND" => {
            let reduction = reduction(cx)?;
            single(cx, Op::ScatterND { reduction }, 3, 3)
        }
        // Scatter (opsets 9-10) is ScatterElements without a reduction.
        "ScatterElements" | "Scatter" => {
            let axis = cx.attr_i("axis", 0);
            let reduction = reduction(cx)?;
            single(cx, Op::ScatterElements { axis, reduction }, 3, 3)
        }
        "Expand" => single(cx, Op::Expand, 2, 2),
        "Tile" => single(cx, Op::Tile, 2, 2),
        "Pad" => pad(cx),
        "Shape" => {
            let start = cx.attr_i("start", 0);
            let end = cx.attr_opt_i("end");
            single(cx, Op::Shape { start, end }, 1, 1)
        }
        "Size" => single(cx, Op::Size, 1, 1),
        "Range" => range(cx),
        "ConstantOfShape" => constant_of_shape(cx),
        "Identity" => single(cx, Op::Identity, 1, 1),
        "Dropout" => dropout(cx),
        "Trilu" => {
            let upper = cx.attr_flag("upper", true)?;
            single(cx, Op::Trilu { upper }, 1, 2)
        }
        "NonZero" => single(cx, Op::NonZero, 1, 1),
        "OneHot" => {
            let axis = cx.attr_i("axis", -1);
            single(cx, Op::OneHot { axis }, 3, 3)
        }
        "EyeLike" => eye_like(cx),
        "Constant" => constant(cx),
        other => Err(cx.err(format!("{other} is not a data movement operator"))),
    }
}

/// Checks that the node has between `min` and `max` inputs, the first `min` present.
fn check_inputs(cx: &NodeCtx, min: usize, max: usize) -> Result<()> {
    let n = cx.num_inputs();
    if n < min || n > max {
        let expected = match (min, max) {
            (a, b) if a == b => format!("{a}"),
            (a, usize::MAX) => format!("at least {a}"),
            (a, b) => format!("{a} to {b}"),
        };
        return Err(cx.err(format!("expected {expected} inputs, got {n}")));
    }
    for i in 0..min {
        cx.input(i)?;
    }
    Ok(())
}

/// The common case: the IR node takes the ONNX node's inputs as they are.
fn single(cx: &mut NodeCtx, op: Op, min: usize, max: usize) -> Result<Vec<ValueId>> {
    check_inputs(cx, min, max)?;
    let inputs = cx.inputs().to_vec();
    Ok(vec![cx.add1(op, inputs)?])
}

fn reduction(cx: &NodeCtx) -> Result<ScatterReduction> {
    Ok(match cx.attr_s("reduction", "none").as_str() {
        "none" => ScatterReduction::None,
        "add" => ScatterReduction::Add,
        "mul" => ScatterReduction::Mul,
        "max" => ScatterReduction::Max,
        "min" => ScatterReduction::Min,
        r => {
            return Err(cx.err(format!(
                "unknown reduction '{r}' (expected none, add, mul, max or min)"
            )))
        }
    })
}

/// An attribute given as a list in older opsets, as a constant i64 input (`None` when absent).
fn attr_as_input(cx: &mut NodeCtx, name: &str) -> Option<ValueId> {
    let vals = cx.attr_ints(name)?;
    Some(cx.const_i64s(&vals))
}

fn required_attr_as_input(cx: &mut NodeCtx, name: &str) -> Result<ValueId> {
    attr_as_input(cx, name).ok_or_else(|| cx.err(format!("attribute '{name}' is required")))
}

/// The IR stores `perm` resolved: the default reverses the axes.
fn transpose(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    check_inputs(cx, 1, 1)?;
    let x = cx.input(0)?;
    let rank = cx.ty(x).rank();
    let perm = match cx.attr_ints("perm") {
        None => (0..rank).rev().collect(),
        Some(p) => {
            let mut seen = vec![false; rank];
            let mut perm = Vec::with_capacity(p.len());
            for &a in &p {
                match usize::try_from(a) {
                    Ok(a) if a < rank && !seen[a] => {
                        seen[a] = true;
                        perm.push(a);
                    }
                    _ => return Err(cx.err(format!("perm {p:?} is not a permutation of 0..{rank}"))),
                }
            }
            if perm.len() != rank {
                return Err(cx.err(format!(
                    "perm {p:?} has {} entries for an input of rank {rank}",
                    p.len()
                )));
            }
            perm
        }
    };
    Ok(vec![cx.add1(Op::Transpose { perm }, vec![Some(x)])?])
}

/// Squeeze/Unsqueeze: `axes` is an attribute before opset 13, an input from 13 on.
fn squeeze(cx: &mut NodeCtx, unsqueeze: bool) -> Result<Vec<ValueId>> {
    let op = if unsqueeze { Op::Unsqueeze } else { Op::Squeeze };
    if cx.opset() >= 13 {
        return single(cx, op, 1 + unsqueeze as usize, 2);
    }
    check_inputs(cx, 1, 1)?;
    let x = cx.input(0)?;
    // An empty attribute list means "not given" (squeeze every dim of extent 1).
    let axes = match cx.attr_ints("axes") {
        Some(a) if !a.is_empty() || unsqueeze => Some(cx.const_i64s(&a)),
        _ if unsqueeze => return Err(cx.err("attribute 'axes' is required")),
        _ => None,
    };
    Ok(vec![cx.add1(op, vec![Some(x), axes])?])
}

/// Split: `split` is an attribute before opset 13, an input from 13; `num_outputs` from 18.
fn split(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let axis = cx.attr_i("axis", 0);
    let n_out = cx.num_outputs();
    let num_outputs = match cx.attr_opt_i("num_outputs") {
        Some(k) if cx.opset() >= 18 => {
            if k < 1 || k as usize != n_out {
                return Err(cx.err(format!("num_outputs is {k} but the node has {n_out} outputs")));
            }
            Some(n_out)
        }
        _ => None,
    };
    let (x, split) = if cx.opset() >= 13 {
        check_inputs(cx, 1, 2)?;
        (cx.input(0)?, cx.opt_input(1))
    } else {
        check_inputs(cx, 1, 1)?;
        let split = match cx.attr_ints("split") {
            Some(s) if !s.is_empty() => Some(cx.const_i64s(&s)),
            _ => None,
        };
        (cx.input(0)?, split)
    };
    if split.is_some() && num_outputs.is_some() {
        return Err(cx.err("give either the 'split' input or the 'num_outputs' attribute, not both"));
    }
    cx.add(Op::Split { axis, num_outputs }, vec![Some(x), split])
}

/// Slice: `starts`, `ends` and `axes` are attributes before opset 10 (no steps).
fn slice(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    if cx.opset() >= 10 {
        return single(cx, Op::Slice, 3, 5);
    }
    check_inputs(cx, 1, 1)?;
    let x = cx.input(0)?;
    let starts = required_attr_as_input(cx, "starts")?;
    let ends = required_attr_as_input(cx, "ends")?;
    let axes = attr_as_input(cx, "axes");
    Ok(vec![cx.add1(
        Op::Slice,
        vec![Some(x), Some(starts), Some(ends), axes],
    )?])
}

fn pad_mode(cx: &NodeCtx) -> Result<PadMode> {
    Ok(match cx.attr_s("mode", "constant").as_str() {
        "constant" => PadMode::Constant,
        "reflect" => PadMode::Reflect,
        "edge" => PadMode::Edge,
        "wrap" => PadMode::Wrap,
        m => {
            return Err(cx.err(format!(
                "unknown pad mode '{m}' (expected constant, reflect, edge or wrap)"
            )))
        }
    })
}

/// Pad: `pads` and `value` are attributes before opset 11; `axes` is an input from 18.
fn pad(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let mode = pad_mode(cx)?;
    if cx.opset() >= 11 {
        let max = if cx.opset() >= 18 { 4 } else { 3 };
        return single(cx, Op::Pad { mode }, 2, max);
    }
    check_inputs(cx, 1, 1)?;
    let x = cx.input(0)?;
    let pads = required_attr_as_input(cx, "pads")?;
    let value = cx.attr_f("value", 0.0);
    let fill = if value != 0.0 {
        let dtype = cx.ty(x).dtype;
        Some(cx.constant(Tensor::scalar(value).cast(dtype)))
    } else {
        None
    };
    Ok(vec![cx.add1(Op::Pad { mode }, vec![Some(x), Some(pads), fill])?])
}

/// Range: `stash_type` (opset 27) picks f32 or f64 for f16/bf16 arithmetic; kiln computes in
/// f64 and rounds once, which is at least as precise as either.
fn range(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let stash = cx.attr_i("stash_type", 1);
    if stash != 1 && stash != 11 {
        return Err(cx.err(format!(
            "stash_type must be 1 (float) or 11 (double), got {stash}"
        )));
    }
    single(cx, Op::Range, 3, 3)
}

fn constant_of_shape(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let value = cx.attr_tensor("value")?.unwrap_or_else(|| Tensor::scalar(0f32));
    if value.len() != 1 {
        return Err(cx.err(format!(
            "attribute 'value' must hold exactly one element, got shape {:?}",
            value.shape()
        )));
    }
    single(cx, Op::ConstantOfShape { value }, 1, 1)
}

/// Dropout at inference is the identity; the optional mask is all true (nothing dropped). The
/// opset 7-9 schema ties the mask's type to the input's, but its documentation, the ONNX
/// reference and onnxruntime all produce bool, so kiln does too.
fn dropout(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    check_inputs(cx, 1, if cx.opset() >= 12 { 3 } else { 1 })?;
    if cx.num_outputs() > 2 {
        return Err(cx.err(format!("expected at most 2 outputs, got {}", cx.num_outputs())));
    }
    if let Some(tm) = cx.opt_input(2) {
        match cx.known(tm).map(|t| t.to_f64_vec()) {
            Some(v) if v.len() == 1 && v[0] == 0.0 => {}
            Some(_) => return Err(cx.err("training mode (training_mode = true) is not supported")),
            None => return Err(cx.err("training_mode must be a constant false: training is not supported")),
        }
    }
    let x = cx.input(0)?;
    let y = cx.add1(Op::Identity, vec![Some(x)])?;
    let mut outs = vec![y];
    if cx.num_outputs() == 2 {
        let mask = if cx.node.output[1].is_empty() {
            y
        } else {
            let value = Tensor::scalar(true);
            let shape = cx.add_aux1(Op::Shape { start: 0, end: None }, vec![Some(x)])?;
            cx.add_aux1(Op::ConstantOfShape { value }, vec![Some(shape)])?
        };
        outs.push(mask);
    }
    Ok(outs)
}

fn eye_like(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let dtype = match cx.attr_opt_i("dtype") {
        None => None,
        Some(code) => {
            let code = i32::try_from(code).map_err(|_| cx.err(format!("unknown dtype {code}")))?;
            Some(dtype_from_onnx(code).map_err(|e| cx.err(format!("dtype: {e}")))?)
        }
    };
    let k = cx.attr_i("k", 0);
    single(cx, Op::EyeLike { dtype, k }, 1, 1)
}

/// Constant: exactly one of the value attributes; the tensor becomes a graph constant named
/// after the node's output.
fn constant(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    const KINDS: [&str; 8] = [
        "value",
        "value_float",
        "value_floats",
        "value_int",
        "value_ints",
        "value_string",
        "value_strings",
        "sparse_value",
    ];
    check_inputs(cx, 0, 0)?;
    let given: Vec<&str> = KINDS.into_iter().filter(|k| cx.has_attr(k)).collect();
    let [kind] = given.as_slice() else {
        return Err(cx.err(format!("exactly one value attribute is required, got {given:?}")));
    };
    let t = match *kind {
        "value" => cx
            .attr_tensor("value")?
            .ok_or_else(|| cx.err("attribute 'value' holds no tensor"))?,
        "value_float" => Tensor::scalar(cx.attr_f("value_float", 0.0)),
        "value_floats" => {
            let v = cx.attr_floats("value_floats").unwrap_or_default();
            Tensor::from_vec(vec![v.len()], v)
        }
        "value_int" => Tensor::scalar(cx.attr_i("value_int", 0)),
        "value_ints" => {
            let v = cx.attr_ints("value_ints").unwrap_or_default();
            Tensor::from_vec(vec![v.len()], v)
        }
        "sparse_value" => return Err(cx.err("sparse constants ('sparse_value') are not supported")),
        k => {
            return Err(cx.err(format!(
                "string constants ('{k}') are not supported: kiln has no string tensors"
            )))
        }
    };
    let name = cx.node.output.first().cloned().unwrap_or_else(|| cx.name.clone());
    Ok(vec![cx.named_constant(name, t)])
}
