//! The detection and vision operators.

use super::{EvalCtx, InferCtx};
use crate::{OpError, Tensor, TensorType};

/// The detection and vision operators.
#[derive(Clone, PartialEq, Debug)]
pub enum VisionOp {}

impl VisionOp {
    pub fn name(&self) -> &'static str {
        match *self {}
    }
}

pub(crate) fn infer(op: &VisionOp, _cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    match *op {}
}

pub(crate) fn eval(op: &VisionOp, _cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    match *op {}
}
