//! Import of element-wise operators: unary functions and activations, binary arithmetic,
//! comparison and logic, the variadic `Sum`/`Mean`/`Min`/`Max`, `Where`, `Clip`, `Cast` and
//! `CastLike`.

use super::NodeCtx;
use crate::error::Result;
use crate::onnx::tensor::dtype_from_onnx;
use kiln_ir::{Binary, DType, Op, Tensor, TensorData, Unary, ValueId};

pub(super) fn import(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let op_type = cx.op_type().to_string();
    if let Some(u) = unary(cx, &op_type)? {
        let inputs = cx.inputs().to_vec();
        return Ok(vec![cx.add1(Op::Unary(u), inputs)?]);
    }
    if let Some(b) = binary(cx, &op_type)? {
        let inputs = cx.inputs().to_vec();
        return Ok(vec![cx.add1(Op::Binary(b), inputs)?]);
    }
    let out = match op_type.as_str() {
        "Sum" => variadic(cx, Binary::Add)?,
        "Min" => variadic(cx, Binary::Min)?,
        "Max" => variadic(cx, Binary::Max)?,
        "Mean" => mean(cx)?,
        "Where" => {
            let inputs = cx.inputs().to_vec();
            cx.add1(Op::Where, inputs)?
        }
        "Clip" => clip(cx)?,
        "Cast" => cast(cx)?,
        "CastLike" => {
            let (x, target) = (cx.input(0)?, cx.input(1)?);
            let to = cx.ty(target).dtype;
            cx.add1(Op::Cast { to }, vec![Some(x)])?
        }
        other => return Err(cx.err(format!("{other} is not an elementwise operator"))),
    };
    Ok(vec![out])
}

/// A 0/1 attribute as a bool; any other value is an error naming the attribute.
pub(super) fn flag(cx: &NodeCtx, name: &str, default: bool) -> Result<bool> {
    match cx.attr_i(name, i64::from(default)) {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(cx.err(format!("attribute '{name}' must be 0 or 1, got {v}"))),
    }
}

/// The unary operator `op_type` names, with its attributes (ONNX defaults filled in).
fn unary(cx: &NodeCtx, op_type: &str) -> Result<Option<Unary>> {
    Ok(Some(match op_type {
        "Abs" => Unary::Abs,
        "Neg" => Unary::Neg,
        "Floor" => Unary::Floor,
        "Ceil" => Unary::Ceil,
        "Round" => Unary::Round,
        "Reciprocal" => Unary::Reciprocal,
        "Sign" => Unary::Sign,
        "Sqrt" => Unary::Sqrt,
        "Exp" => Unary::Exp,
        "Log" => Unary::Log,
        "Erf" => Unary::Erf,
        "Tanh" => Unary::Tanh,
        "Sigmoid" => Unary::Sigmoid,
        "Relu" => Unary::Relu,
        "Sin" => Unary::Sin,
        "Cos" => Unary::Cos,
        "Tan" => Unary::Tan,
        "Asin" => Unary::Asin,
        "Acos" => Unary::Acos,
        "Atan" => Unary::Atan,
        "Sinh" => Unary::Sinh,
        "Cosh" => Unary::Cosh,
        "Asinh" => Unary::Asinh,
        "Acosh" => Unary::Acosh,
        "Atanh" => Unary::Atanh,
        "Not" => Unary::Not,
        "BitwiseNot" => Unary::BitwiseNot,
        "IsNaN" => Unary::IsNaN,
        "IsInf" => Unary::IsInf {
            detect_positive: flag(cx, "detect_positive", true)?,
            detect_negative: flag(cx, "detect_negative", true)?,
        },
        "Softplus" => Unary::Softplus,
        "Softsign" => Unary::Softsign,
        "Mish" => Unary::Mish,
        "HardSwish" => Unary::HardSwish,
        "LeakyRelu" => Unary::LeakyRelu {
            alpha: cx.attr_f("alpha", 0.01),
        },
        "Elu" => Unary::Elu {
            alpha: cx.attr_f("alpha", 1.0),
        },
        // Defaults of opset 6 and later (opset 1 had rounder constants).
        "Selu" => Unary::Selu {
            alpha: cx.attr_f("alpha", 1.673_263_2),
            gamma: cx.attr_f("gamma", 1.050_701),
        },
        "Celu" => {
            let alpha = cx.attr_f("alpha", 1.0);
            if alpha == 0.0 {
                return Err(cx.err("attribute 'alpha' must be nonzero"));
            }
            Unary::Celu { alpha }
        }
        "HardSigmoid" => Unary::HardSigmoid {
            alpha: cx.attr_f("alpha", 0.2),
            beta: cx.attr_f("beta", 0.5),
        },
        "ThresholdedRelu" => Unary::ThresholdedRelu {
            alpha: cx.attr_f("alpha", 1.0),
        },
        "Gelu" => match cx.attr_s("approximate", "none").as_str() {
            "none" => Unary::Gelu { tanh: false },
            "tanh" => Unary::Gelu { tanh: true },
            other => {
                return Err(cx.err(format!(
                    "attribute 'approximate' must be \"none\" or \"tanh\", got \"{other}\""
                )))
            }
        },
        "Shrink" => Unary::Shrink {
            bias: cx.attr_f("bias", 0.0),
            lambd: cx.attr_f("lambd", 0.5),
        },
        _ => return Ok(None),
    }))
}

/// The two-input operator `op_type` names.
fn binary(cx: &NodeCtx, op_type: &str) -> Result<Option<Binary>> {
    Ok(Some(match op_type {
        "Add" => Binary::Add,
        "Sub" => Binary::Sub,
        "Mul" => Binary::Mul,
        "Div" => Binary::Div,
        "Pow" => Binary::Pow,
        "Mod" => modulo(cx)?,
        "Equal" => Binary::Equal,
        "Less" => Binary::Less,
        "LessOrEqual" => Binary::LessOrEqual,
        "Greater" => Binary::Greater,
        "GreaterOrEqual" => Binary::GreaterOrEqual,
        "And" => Binary::And,
        "Or" => Binary::Or,
        "Xor" => Binary::Xor,
        "BitShift" => match cx.attr_s("direction", "").as_str() {
            "LEFT" => Binary::BitShiftLeft,
            "RIGHT" => Binary::BitShiftRight,
            "" => return Err(cx.err("attribute 'direction' is required")),
            other => {
                return Err(cx.err(format!(
                    "attribute 'direction' must be \"LEFT\" or \"RIGHT\", got \"{other}\""
                )))
            }
        },
        "BitwiseAnd" => Binary::BitwiseAnd,
        "BitwiseOr" => Binary::BitwiseOr,
        "BitwiseXor" => Binary::BitwiseXor,
        "PRelu" => Binary::PRelu,
        _ => return Ok(None),
    }))
}

/// `Mod`: `fmod=0` is the Python remainder, `fmod=1` C's `fmod`. Before opset 28, floats
/// required `fmod=1`.
fn modulo(cx: &NodeCtx) -> Result<Binary> {
    let fmod = flag(cx, "fmod", false)?;
    if !fmod && cx.opset() < 28 {
        let x = cx.input(0)?;
        if cx.ty(x).dtype.is_float() {
            return Err(cx.err("fmod must be 1 for floating-point inputs before opset 28"));
        }
    }
    Ok(if fmod { Binary::FMod } else { Binary::Mod })
}

/// Every input of a variadic operator; all must be present and there must be at least one.
fn variadic_inputs(cx: &NodeCtx) -> Result<Vec<ValueId>> {
    if cx.num_inputs() == 0 {
        return Err(cx.err("needs at least one input"));
    }
    (0..cx.num_inputs()).map(|i| cx.input(i)).collect()
}

/// `Sum`/`Min`/`Max` of N inputs as a left fold of binary nodes (broadcasting composes, so
/// the result is the same as broadcasting all inputs at once). One input is an identity.
fn variadic(cx: &mut NodeCtx, b: Binary) -> Result<ValueId> {
    let inputs = variadic_inputs(cx)?;
    fold(cx, b, &inputs, true)
}

/// Folds `inputs` with `b`; the last node carries the ONNX output name when `is_final`.
fn fold(cx: &mut NodeCtx, b: Binary, inputs: &[ValueId], is_final: bool) -> Result<ValueId> {
    let Some((&first, rest)) = inputs.split_first() else {
        return Err(cx.err("needs at least one input"));
    };
    if rest.is_empty() {
        return if is_final {
            cx.add1(Op::Identity, vec![Some(first)])
        } else {
            Ok(first)
        };
    }
    let mut acc = first;
    for (i, &v) in rest.iter().enumerate() {
        let args = vec![Some(acc), Some(v)];
        acc = if is_final && i + 1 == rest.len() {
            cx.add1(Op::Binary(b), args)?
        } else {
            cx.add_aux1(Op::Binary(b), args)?
        };
    }
    Ok(acc)
}

/// `Mean` = the sum of the inputs divided by their count (in the input type).
fn mean(cx: &mut NodeCtx) -> Result<ValueId> {
    let inputs = variadic_inputs(cx)?;
    if inputs.len() == 1 {
        return fold(cx, Binary::Add, &inputs, true);
    }
    let sum = fold(cx, Binary::Add, &inputs, false)?;
    let dtype = cx.ty(inputs[0]).dtype;
    let n = scalar(cx, dtype, inputs.len() as f64)?;
    cx.add1(Op::Binary(Binary::Div), vec![Some(sum), Some(n)])
}

/// A scalar constant of `dtype`.
fn scalar(cx: &mut NodeCtx, dtype: DType, v: f64) -> Result<ValueId> {
    let t = Tensor::new(vec![], TensorData::from_f64s(dtype, [v])).map_err(|e| cx.err(e.to_string()))?;
    Ok(cx.constant(t))
}

/// `Clip`: before opset 11 the bounds are float attributes, whose absent values default to
/// ±3.4028234663852886e38 (the schema's); they become scalar inputs of the input's type.
fn clip(cx: &mut NodeCtx) -> Result<ValueId> {
    let x = cx.input(0)?;
    if cx.opset() >= 11 {
        let inputs = cx.inputs().to_vec();
        return cx.add1(Op::Clip, inputs);
    }
    if cx.num_inputs() != 1 {
        return Err(cx.err(format!(
            "takes 1 input before opset 11 (bounds are attributes), got {}",
            cx.num_inputs()
        )));
    }
    let dtype = cx.ty(x).dtype;
    let lo = f64::from(cx.attr_f("min", f32::MIN));
    let hi = f64::from(cx.attr_f("max", f32::MAX));
    let lo = scalar(cx, dtype, lo)?;
    let hi = scalar(cx, dtype, hi)?;
    cx.add1(Op::Clip, vec![Some(x), Some(lo), Some(hi)])
}

/// `Cast` to the `to` attribute's type; `saturate` and `round_mode` only concern float8
/// targets, which kiln does not have.
fn cast(cx: &mut NodeCtx) -> Result<ValueId> {
    let Some(code) = cx.attr_opt_i("to") else {
        return Err(cx.err("attribute 'to' is required"));
    };
    let code = i32::try_from(code).map_err(|_| cx.err(format!("unknown data type {code} in 'to'")))?;
    let to = dtype_from_onnx(code).map_err(|msg| cx.err(format!("cannot cast: {msg}")))?;
    let inputs = cx.inputs().to_vec();
    cx.add1(Op::Cast { to }, inputs)
}
