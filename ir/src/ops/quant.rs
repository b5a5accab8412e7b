//! The quantized and integer-arithmetic operators.

use super::{EvalCtx, InferCtx};
use crate::{OpError, Tensor, TensorType};

/// The quantized and integer-arithmetic operators.
#[derive(Clone, PartialEq, Debug)]
pub enum QuantOp {}

impl QuantOp {
    pub fn name(&self) -> &'static str {
        match *self {}
    }
}

pub(crate) fn infer(op: &QuantOp, _cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    match *op {}
}

pub(crate) fn eval(op: &QuantOp, _cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    match *op {}
}
