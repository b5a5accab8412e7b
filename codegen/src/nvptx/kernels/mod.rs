//! The GPU kernel generators, one module per operator family. `lower` picks the first that
//! handles a node; a node none handles runs as a library kernel on one GPU thread.

use super::GpuKernel;
use crate::error::Result;
use crate::node::NodeInfo;
use crate::target::TargetDesc;

/// The generated GPU kernel for `node`, or None.
pub fn lower(node: &NodeInfo, target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    let generators: [fn(&NodeInfo, &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>>; 0] = [];
    for generator in generators {
        if let Some(k) = generator(node, target)? {
            return Ok(Some(k));
        }
    }
    Ok(None)
}
