//! Error types of the IR.

/// A problem with one operation's inputs or attributes, without the node context; the graph
/// wraps it into [`IrError::Node`] with the node's name and operator.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct OpError(pub String);

impl OpError {
    pub fn new(msg: impl Into<String>) -> OpError {
        OpError(msg.into())
    }
}

/// Returns early with an [`OpError`] built from a format string.
#[macro_export]
macro_rules! bail {
    ($($t:tt)*) => {
        return Err($crate::OpError(format!($($t)*)))
    };
}

/// Errors from building, verifying or evaluating a graph. Every variant about one node names it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum IrError {
    #[error("node '{node}' ({op}): {msg}")]
    Node { node: String, op: String, msg: String },
    #[error("graph input '{name}': {msg}")]
    Input { name: String, msg: String },
    #[error("invalid graph: {0}")]
    Invalid(String),
}

impl IrError {
    pub fn node(node: &str, op: &str, err: impl std::fmt::Display) -> IrError {
        IrError::Node {
            node: node.to_string(),
            op: op.to_string(),
            msg: err.to_string(),
        }
    }
}
