//! Micro-kernel lowering for the nn family (see `codegen/ukernels/nn.c`).

use super::UkCall;
use crate::error::Result;
use crate::node::NodeInfo;

pub fn lower(node: &NodeInfo) -> Result<Option<UkCall>> {
    let _ = node;
    Ok(None)
}
