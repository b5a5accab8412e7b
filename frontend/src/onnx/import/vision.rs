//! Import of detection and vision operators.

use super::NodeCtx;
use crate::error::Result;
use kiln_ir::ValueId;

pub(super) fn import(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    Err(cx.err("not supported yet"))
}
