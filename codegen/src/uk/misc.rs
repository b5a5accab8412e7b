//! Micro-kernel lowering for the misc family (see `codegen/ukernels/misc.c`): recurrent cells,
//! quantization, signal processing and RoiAlign. Each function's comment gives the iattr/fattr
//! order the C kernel reads.

use super::UkCall;
use crate::error::Result;
use crate::node::NodeInfo;
use kiln_ir::{Activation, Op, RnnAttrs, RnnDirection, RnnKind};

pub fn lower(node: &NodeInfo) -> Result<Option<UkCall>> {
    match node.op() {
        Op::Rnn(a) => rnn(node, a).map(Some),
        _ => Ok(None),
    }
}

const F64: u64 = 8;

/// `(code, alpha, beta)` of an activation, codes as in misc.c.
fn activation(f: Activation) -> (i64, f64, f64) {
    match f {
        Activation::Relu => (0, 0.0, 0.0),
        Activation::Tanh => (1, 0.0, 0.0),
        Activation::Sigmoid => (2, 0.0, 0.0),
        Activation::Affine { alpha, beta } => (3, alpha.into(), beta.into()),
        Activation::LeakyRelu { alpha } => (4, alpha.into(), 0.0),
        Activation::ThresholdedRelu { alpha } => (5, alpha.into(), 0.0),
        Activation::ScaledTanh { alpha, beta } => (6, alpha.into(), beta.into()),
        Activation::HardSigmoid { alpha, beta } => (7, alpha.into(), beta.into()),
        Activation::Elu { alpha } => (8, alpha.into(), 0.0),
        Activation::Softsign => (9, 0.0, 0.0),
        Activation::Softplus => (10, 0.0, 0.0),
    }
}

/// iattr: kind, dirs, reverse, hidden, layout, input_forget, linear_before_reset, has_clip,
/// seq, batch, input, n_act, act codes; fattr: clip, (alpha, beta) per activation.
fn rnn(node: &NodeInfo, a: &RnnAttrs) -> Result<UkCall> {
    let x = node.input_shape(0)?;
    if x.len() != 3 {
        return Err(node.unsupported(format!("X must have rank 3, got {x:?}")));
    }
    let (seq, batch) = if a.layout == 1 { (x[1], x[0]) } else { (x[0], x[1]) };
    let input = x[2];
    let (kind, gates) = match a.kind {
        RnnKind::Rnn => (0, 1),
        RnnKind::Gru => (1, 3),
        RnnKind::Lstm => (2, 4),
    };
    let dirs = match a.direction {
        RnnDirection::Bidirectional => 2,
        _ => 1,
    };
    let per = [1, 2, 3][kind as usize];
    if a.activations.len() != per * dirs {
        return Err(node.unsupported(format!(
            "{} activations given, {} expected",
            a.activations.len(),
            per * dirs
        )));
    }
    if let Some(t) = node.input_dtype(4) {
        if t != kiln_ir::DType::I32 {
            return Err(node.unsupported(format!("sequence_lens must be i32, got {t}")));
        }
    }
    let hidden = a.hidden_size;
    let acts: Vec<(i64, f64, f64)> = a.activations.iter().map(|&f| activation(f)).collect();
    let task = input + 4 * hidden + gates * hidden;
    let scratch = (dirs * batch * task) as u64 * F64;
    Ok(UkCall::new("rnn")
        .iattr([
            kind,
            dirs as i64,
            (a.direction == RnnDirection::Reverse) as i64,
            hidden as i64,
            a.layout as i64,
            a.input_forget as i64,
            a.linear_before_reset as i64,
            a.clip.is_some() as i64,
            seq as i64,
            batch as i64,
            input as i64,
            acts.len() as i64,
        ])
        .iattr(acts.iter().map(|a| a.0))
        .fattr([a.clip.map_or(0.0, f64::from)])
        .fattr(acts.iter().flat_map(|a| [a.1, a.2]))
        .scratch(scratch))
}
