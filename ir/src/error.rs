//! Error types of the IR.

/// A problem with one operation's inputs or attributes, without the node context; the graph
/// wraps it into [`IrError::Node`] (or [`IrError::OverBudget`]) with the node's name and
/// operator.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{msg}")]
pub struct OpError {
    pub msg: String,
    /// The operation is valid but would need more memory than the reference interpreter's
    /// budget ([`crate::eval::memory_budget`]): a limit of this run, not a fault of the model.
    pub over_budget: bool,
}

impl OpError {
    pub fn new(msg: impl Into<String>) -> OpError {
        OpError {
            msg: msg.into(),
            over_budget: false,
        }
    }

    pub fn over_budget(msg: impl Into<String>) -> OpError {
        OpError {
            msg: msg.into(),
            over_budget: true,
        }
    }
}

/// Returns early with an [`OpError`] built from a format string.
#[macro_export]
macro_rules! bail {
    ($($t:tt)*) => {
        return Err($crate::OpError::new(format!($($t)*)))
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
    /// Evaluating the node would exceed the reference interpreter's memory budget (boxed: the
    /// rare variant keeps every `Result<_, IrError>` small).
    #[error("node '{}' ({}): {}", .0.node, .0.op, .0.msg)]
    OverBudget(Box<OverBudget>),
}

/// The node whose evaluation would exceed the memory budget, and by how much.
#[derive(Debug, Clone, PartialEq)]
pub struct OverBudget {
    pub node: String,
    pub op: String,
    pub msg: String,
}

impl IrError {
    /// An operation's error in its node's context, keeping whether it was over budget.
    pub fn op(node: &str, op: &str, err: OpError) -> IrError {
        if err.over_budget {
            IrError::OverBudget(Box::new(OverBudget {
                node: node.to_string(),
                op: op.to_string(),
                msg: err.msg,
            }))
        } else {
            IrError::node(node, op, err)
        }
    }

    pub fn node(node: &str, op: &str, err: impl std::fmt::Display) -> IrError {
        IrError::Node {
            node: node.to_string(),
            op: op.to_string(),
            msg: err.to_string(),
        }
    }
}
