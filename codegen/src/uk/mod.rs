//! Operators compiled from the C micro-kernels in `codegen/ukernels/`.
//!
//! Each family file maps an operator to a `kiln_uk_<symbol>` function and packs its attributes
//! into integer and floating arrays in the order the C side documents. Codegen passes the input
//! and output tensors (static shapes as constant descriptors) and links the kernels' bitcode
//! into the model, where LLVM inlines and specialises them.

pub mod codes;
mod elementwise;
mod misc;
mod movement;
mod nn;
mod reduce;

use crate::error::Result;
use crate::node::NodeInfo;
use crate::target::{Isa, TargetDesc};

/// A call to `kiln_uk_<symbol>(const kiln_uk_args *)`.
#[derive(Clone, Debug, PartialEq)]
pub struct UkCall {
    /// The function name without the `kiln_uk_` prefix.
    pub symbol: &'static str,
    pub iattr: Vec<i64>,
    pub fattr: Vec<f64>,
    /// Bytes of scratch the call needs for the duration of the kernel (0 for none).
    pub scratch_bytes: u64,
    /// Bytes of scratch private to each worker thread (`kiln_rt_thread_scratch`), 0 for none.
    pub thread_scratch_bytes: u64,
}

impl UkCall {
    pub fn new(symbol: &'static str) -> UkCall {
        UkCall {
            symbol,
            iattr: vec![],
            fattr: vec![],
            scratch_bytes: 0,
            thread_scratch_bytes: 0,
        }
    }

    pub fn iattr(mut self, v: impl IntoIterator<Item = i64>) -> UkCall {
        self.iattr.extend(v);
        self
    }

    pub fn fattr(mut self, v: impl IntoIterator<Item = f64>) -> UkCall {
        self.fattr.extend(v);
        self
    }

    pub fn scratch(mut self, bytes: u64) -> UkCall {
        self.scratch_bytes = bytes;
        self
    }

    pub fn thread_scratch(mut self, bytes: u64) -> UkCall {
        self.thread_scratch_bytes = bytes;
        self
    }
}

/// The micro-kernel call for `node`, or None when no family handles its operator.
pub fn lower(node: &NodeInfo) -> Result<Option<UkCall>> {
    for family in [
        elementwise::lower,
        reduce::lower,
        movement::lower,
        nn::lower,
        misc::lower,
    ] {
        if let Some(call) = family(node)? {
            return Ok(Some(call));
        }
    }
    Ok(None)
}

/// `call` adjusted to a CPU target where its kernel has variants for vector widths.
pub fn for_cpu_target(mut call: UkCall, target: &TargetDesc) -> UkCall {
    if call.symbol == "attention_f32" && target.isa == Isa::Avx512 {
        nn::widen_attention(&mut call);
    }
    call
}
