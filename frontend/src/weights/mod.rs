//! Weights that live outside the ONNX file: safetensors files bound by name.

mod safetensors_file;

pub use safetensors_file::read_safetensors;

use crate::error::{FrontendError, Result};
use crate::onnx::proto::GraphProto;
use kiln_ir::{Dim, Tensor, TensorType};
use std::collections::HashMap;

/// Every weight must name an initializer or a graph input of the model.
pub(crate) fn check_weight_names(g: &GraphProto, weights: &HashMap<&str, &Tensor>) -> Result<()> {
    let mut expected: Vec<&str> = g.initializer.iter().map(|t| t.name.as_str()).collect();
    expected.extend(g.input.iter().map(|v| v.name.as_str()));
    expected.sort_unstable();
    expected.dedup();
    let mut unknown: Vec<&str> = weights
        .keys()
        .copied()
        .filter(|n| expected.binary_search(n).is_err())
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    unknown.sort_unstable();
    let mut shown: Vec<&str> = expected.iter().copied().take(20).collect();
    if expected.len() > 20 {
        shown.push("...");
    }
    Err(FrontendError::Weights(format!(
        "{} tensor(s) match no initializer or input of the model: {}; expected names: {}",
        unknown.len(),
        unknown.join(", "),
        shown.join(", ")
    )))
}

/// A bound weight must have the declared dtype and shape.
pub(crate) fn check_weight(name: &str, declared: &TensorType, w: &Tensor) -> Result<()> {
    let shape_ok = declared.rank() == w.rank()
        && declared.shape.iter().zip(w.shape()).all(|(d, &n)| match d {
            Dim::Fixed(f) => *f == n,
            Dim::Sym(_) => true,
        });
    if declared.dtype != w.dtype() || !shape_ok {
        return Err(FrontendError::Weights(format!(
            "tensor '{name}' is {} but the model expects {declared}",
            w.tensor_type()
        )));
    }
    Ok(())
}
