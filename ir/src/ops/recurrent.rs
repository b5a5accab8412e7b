//! recurrent operators.

use super::{EvalCtx, InferCtx};
use crate::{Op, OpError, Tensor, TensorType};

pub(crate) fn infer(op: &Op, _cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    crate::bail!("{} is not supported yet", op.name())
}

pub(crate) fn eval(op: &Op, _cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    crate::bail!("{} is not supported yet", op.name())
}
