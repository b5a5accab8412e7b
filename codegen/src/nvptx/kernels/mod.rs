//! The GPU kernel generators, one module per operator family. `lower` picks the first that
//! handles a node; a node none handles runs as a library kernel on one block (`nvptx/device.rs`).

pub mod attention;
pub mod copy;
pub mod elementwise;
pub mod gemm;
pub mod pool;
pub mod rows;

use super::GpuKernel;
use crate::error::Result;
use crate::node::NodeInfo;
use crate::target::TargetDesc;

/// A generator: the kernel for a node, or None when it does not handle the node.
type Generator = fn(&NodeInfo, &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>>;

/// The generators in the order they are tried.
const GENERATORS: &[Generator] = &[
    gemm::lower,
    attention::lower,
    copy::lower,
    rows::lower,
    pool::lower,
    elementwise::lower,
];

/// The generated GPU kernel for `node`, or None.
pub fn lower(node: &NodeInfo, target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    for generator in GENERATORS {
        if let Some(k) = generator(node, target)? {
            return Ok(Some(k));
        }
    }
    Ok(None)
}
