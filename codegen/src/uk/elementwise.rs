//! Micro-kernel lowering for the elementwise family (see `codegen/ukernels/elementwise.c`).

use super::UkCall;
use crate::error::Result;
use crate::node::NodeInfo;

pub fn lower(node: &NodeInfo) -> Result<Option<UkCall>> {
    let _ = node;
    Ok(None)
}
