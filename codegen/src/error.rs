//! Codegen errors. User-facing problems (an operator kiln cannot compile yet, a shape that is not
//! static) are separate from compiler bugs (LLVM verifier failures) and tool failures (linking).

#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    /// The model uses something the backend does not compile; names the node and operator.
    #[error("node '{node}' ({op}): {msg}")]
    Unsupported { node: String, op: String, msg: String },
    /// Several nodes cannot be compiled; reported together so the user sees all of them.
    #[error("{} node(s) cannot be compiled: {}", .0.len(), .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    UnsupportedNodes(Vec<CodegenError>),
    /// The target triple or CPU is not one kiln can generate code for.
    #[error("target: {0}")]
    Target(String),
    /// A bug in kiln: generated IR failed LLVM's verifier, or an invariant broke.
    #[error("internal compiler error: {0} (please report this with the model)")]
    Internal(String),
    /// Writing the artifact or running the system linker failed.
    #[error("{0}")]
    Io(String),
}

impl CodegenError {
    pub fn unsupported(node: &str, op: &str, msg: impl Into<String>) -> CodegenError {
        CodegenError::Unsupported {
            node: node.to_string(),
            op: op.to_string(),
            msg: msg.into(),
        }
    }

    pub fn internal(msg: impl std::fmt::Display) -> CodegenError {
        CodegenError::Internal(msg.to_string())
    }

    /// True for errors caused by the model (as opposed to kiln or the system).
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self,
            CodegenError::Unsupported { .. } | CodegenError::UnsupportedNodes(_)
        )
    }
}

pub type Result<T, E = CodegenError> = std::result::Result<T, E>;

/// Graph-building errors while codegen rewrites a graph name the node: the model cannot be
/// compiled as it is.
impl From<kiln_ir::IrError> for CodegenError {
    fn from(e: kiln_ir::IrError) -> CodegenError {
        match e {
            kiln_ir::IrError::Node { node, op, msg } => CodegenError::Unsupported { node, op, msg },
            other => CodegenError::internal(other),
        }
    }
}
