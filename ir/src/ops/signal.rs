//! The signal-processing operators.

use super::{EvalCtx, InferCtx};
use crate::{OpError, Tensor, TensorType};

/// The signal-processing operators.
#[derive(Clone, PartialEq, Debug)]
pub enum SignalOp {}

impl SignalOp {
    pub fn name(&self) -> &'static str {
        match *self {}
    }
}

pub(crate) fn infer(op: &SignalOp, _cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    match *op {}
}

pub(crate) fn eval(op: &SignalOp, _cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    match *op {}
}
