//! Import of the recurrent operators `RNN`, `GRU` and `LSTM` (opsets 7 and 14; 14 adds
//! `layout`, 22 only widens the types).
//!
//! The activation list is resolved here into [`Activation`]s with their parameters, one set
//! per direction, so that the IR carries no defaults.

use super::NodeCtx;
use crate::error::Result;
use kiln_ir::{Activation, Op, RnnAttrs, RnnDirection, RnnKind, ValueId};

/// Position of `R` among the inputs (its last extent is the hidden size).
const R_INPUT: usize = 2;

pub(super) fn import(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let kind = match cx.op_type() {
        "RNN" => RnnKind::Rnn,
        "GRU" => RnnKind::Gru,
        "LSTM" => RnnKind::Lstm,
        other => return Err(cx.err(format!("'{other}' is not a recurrent operator"))),
    };
    let max_inputs = if kind == RnnKind::Lstm { 8 } else { 6 };
    if cx.num_inputs() > max_inputs {
        return Err(cx.err(format!(
            "{} inputs given, at most {max_inputs} allowed",
            cx.num_inputs()
        )));
    }
    let direction = match cx.attr_s("direction", "forward").as_str() {
        "forward" => RnnDirection::Forward,
        "reverse" => RnnDirection::Reverse,
        "bidirectional" => RnnDirection::Bidirectional,
        other => {
            return Err(cx.err(format!(
                "direction must be forward, reverse or bidirectional, got '{other}'"
            )))
        }
    };
    let attrs = RnnAttrs {
        kind,
        direction,
        hidden_size: hidden_size(cx)?,
        activations: activations(cx, kind, direction)?,
        clip: clip(cx)?,
        input_forget: kind == RnnKind::Lstm && flag(cx, "input_forget")?,
        linear_before_reset: kind == RnnKind::Gru && flag(cx, "linear_before_reset")?,
        layout: layout(cx)?,
    };
    let inputs = cx.inputs().to_vec();
    cx.add(Op::Rnn(attrs), inputs)
}

/// `hidden_size`, or when absent the last extent of `R` (`[dirs, gates*hidden, hidden]`).
fn hidden_size(cx: &NodeCtx) -> Result<usize> {
    if let Some(h) = cx.attr_opt_i("hidden_size") {
        return match usize::try_from(h) {
            Ok(h) if h > 0 => Ok(h),
            _ => Err(cx.err(format!("hidden_size must be positive, got {h}"))),
        };
    }
    let r = cx.input(R_INPUT)?;
    match cx.ty(r).shape.get(2).and_then(|d| d.fixed()) {
        Some(h) if h > 0 => Ok(h),
        _ => Err(cx.err(format!(
            "hidden_size is not given and cannot be read from R of type {}",
            cx.ty(r)
        ))),
    }
}

/// A 0/1 integer attribute.
fn flag(cx: &NodeCtx, name: &str) -> Result<bool> {
    match cx.attr_i(name, 0) {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(cx.err(format!("{name} must be 0 or 1, got {v}"))),
    }
}

/// `layout` exists from opset 14 on; older models always use `[seq, batch, ...]`.
fn layout(cx: &NodeCtx) -> Result<u8> {
    if cx.opset() < 14 {
        return Ok(0);
    }
    match cx.attr_i("layout", 0) {
        0 => Ok(0),
        1 => Ok(1),
        v => Err(cx.err(format!("layout must be 0 or 1, got {v}"))),
    }
}

fn clip(cx: &NodeCtx) -> Result<Option<f32>> {
    match cx.attr_opt_f("clip") {
        Some(c) if c.is_nan() || c < 0.0 => {
            Err(cx.err(format!("clip must be a non-negative number, got {c}")))
        }
        c => Ok(c),
    }
}

/// The default activations of one direction.
fn default_activations(kind: RnnKind) -> &'static [&'static str] {
    match kind {
        RnnKind::Rnn => &["Tanh"],
        RnnKind::Gru => &["Sigmoid", "Tanh"],
        RnnKind::Lstm => &["Sigmoid", "Tanh", "Tanh"],
    }
}

/// The resolved activation list: one set per direction.
fn activations(cx: &NodeCtx, kind: RnnKind, direction: RnnDirection) -> Result<Vec<Activation>> {
    let per = default_activations(kind).len();
    let dirs = if direction == RnnDirection::Bidirectional {
        2
    } else {
        1
    };
    let names: Vec<String> = match cx.attr_strings("activations") {
        Some(v) => v,
        None => default_activations(kind)
            .iter()
            .cycle()
            .take(per * dirs)
            .map(|s| s.to_string())
            .collect(),
    };
    // RNN's schema default lists two functions even for one direction; onnxruntime accepts
    // that form and uses the first, so models written with the default spelled out exist.
    let schema_default_form = kind == RnnKind::Rnn && dirs == 1 && names.len() == 2;
    if names.len() != per * dirs && !schema_default_form {
        return Err(cx.err(format!(
            "activations lists {} functions, expected {} ({per} per direction)",
            names.len(),
            per * dirs
        )));
    }
    let mut params = Params {
        alpha: cx.attr_floats("activation_alpha").unwrap_or_default().into_iter(),
        beta: cx.attr_floats("activation_beta").unwrap_or_default().into_iter(),
    };
    let mut resolved = names
        .iter()
        .map(|n| resolve_activation(n, &mut params).map_err(|msg| cx.err(msg)))
        .collect::<Result<Vec<_>>>()?;
    resolved.truncate(per * dirs);
    Ok(resolved)
}

/// The unconsumed `activation_alpha`/`activation_beta` values. ONNX consumes them in the
/// order of the activation functions that take them (onnxruntime reads it the same way).
struct Params {
    alpha: std::vec::IntoIter<f32>,
    beta: std::vec::IntoIter<f32>,
}

/// One activation by name (case-insensitive), taking its parameters from `p` or the defaults
/// of the ONNX operator of the same name.
fn resolve_activation(name: &str, p: &mut Params) -> std::result::Result<Activation, String> {
    let alpha = |p: &mut Params, default: Option<f32>| take(&mut p.alpha, default, name, "activation_alpha");
    let beta = |p: &mut Params, default: Option<f32>| take(&mut p.beta, default, name, "activation_beta");
    Ok(match name.to_ascii_lowercase().as_str() {
        "relu" => Activation::Relu,
        "tanh" => Activation::Tanh,
        "sigmoid" => Activation::Sigmoid,
        "softsign" => Activation::Softsign,
        "softplus" => Activation::Softplus,
        "leakyrelu" => Activation::LeakyRelu {
            alpha: alpha(p, Some(0.01))?,
        },
        "thresholdedrelu" => Activation::ThresholdedRelu {
            alpha: alpha(p, Some(1.0))?,
        },
        "elu" => Activation::Elu {
            alpha: alpha(p, Some(1.0))?,
        },
        "affine" => Activation::Affine {
            alpha: alpha(p, Some(1.0))?,
            beta: beta(p, Some(0.0))?,
        },
        "hardsigmoid" => Activation::HardSigmoid {
            alpha: alpha(p, Some(0.2))?,
            beta: beta(p, Some(0.5))?,
        },
        // ScaledTanh never had defaults in ONNX.
        "scaledtanh" => Activation::ScaledTanh {
            alpha: alpha(p, None)?,
            beta: beta(p, None)?,
        },
        _ => {
            return Err(format!(
                "unknown activation function '{name}' (expected Relu, Tanh, Sigmoid, Affine, LeakyRelu, \
                 ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign or Softplus)"
            ))
        }
    })
}

/// The next value of a parameter list, or `default` once it is used up.
fn take(
    values: &mut std::vec::IntoIter<f32>,
    default: Option<f32>,
    name: &str,
    list: &str,
) -> std::result::Result<f32, String> {
    values
        .next()
        .or(default)
        .ok_or_else(|| format!("activation {name} needs a value in {list}"))
}
