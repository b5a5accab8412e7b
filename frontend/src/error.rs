//! Frontend errors. Every variant about a model element names it.

use std::path::PathBuf;

/// One operator the importer does not support.
#[derive(Debug, Clone, PartialEq)]
pub struct UnsupportedOp {
    pub node: String,
    pub op_type: String,
    pub domain: String,
    pub opset: i64,
}

impl std::fmt::Display for UnsupportedOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let domain = if self.domain.is_empty() {
            "ai.onnx"
        } else {
            &self.domain
        };
        if self.opset > 0 {
            write!(
                f,
                "node '{}': {} ({} opset {})",
                self.node, self.op_type, domain, self.opset
            )
        } else {
            write!(
                f,
                "node '{}': {} (domain {}, which the model does not import)",
                self.node, self.op_type, domain
            )
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FrontendError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a valid ONNX model: {msg}")]
    Decode { path: PathBuf, msg: String },
    #[error("invalid model: {0}")]
    Model(String),
    #[error("{} unsupported operator{}: {}", .0.len(), if .0.len() == 1 { "" } else { "s" }, format_unsupported(.0))]
    Unsupported(Vec<UnsupportedOp>),
    #[error("node '{node}' ({op_type}): {msg}")]
    Node {
        node: String,
        op_type: String,
        msg: String,
    },
    #[error("tensor '{name}': {msg}")]
    Tensor { name: String, msg: String },
    #[error("weights: {0}")]
    Weights(String),
    #[error("--input-shape: {0}")]
    InputShape(String),
    #[error(transparent)]
    Ir(#[from] kiln_ir::IrError),
}

fn format_unsupported(ops: &[UnsupportedOp]) -> String {
    ops.iter().map(|o| o.to_string()).collect::<Vec<_>>().join("; ")
}

pub type Result<T, E = FrontendError> = std::result::Result<T, E>;
