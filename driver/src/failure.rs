//! What kind of failure an error from a compile is, and where in the model it points: the
//! one reading of every layer's error types, for the command line's exit statuses and failure
//! reports and for programs that embed the driver.

use crate::UsageError;

/// Why a compile (or a step of one) stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// The request is wrong: options that contradict each other, a missing or malformed input
    /// file, an `--input-shape` that does not fit.
    Usage,
    /// The model file is not a valid model: truncated, wrong field types, cyclic, dangling names.
    InvalidModel,
    /// A valid model kiln does not handle: an unsupported operator, dtype, dynamic dimension or
    /// control flow, or more memory than the limit allows.
    Unsupported,
    /// Writing, assembling or linking the artifact failed.
    CompileFailed,
    /// A bug in kiln: a pass produced an invalid graph, the planner reached an impossible state.
    Internal,
}

/// The kind of `e`, by the first error along its chain that says; `None` when no layer's
/// error type is in it (the caller's own errors, e.g. a command's argument checks).
pub fn failure_kind(e: &anyhow::Error) -> Option<FailureKind> {
    use FailureKind as K;
    if e.downcast_ref::<UsageError>().is_some() {
        return Some(K::Usage);
    }
    // Over the interpreter's memory budget: a limit of this run (--max-memory), wherever it
    // happened (a reference run, constant folding inside a pass, import).
    if e.chain().any(|c| {
        matches!(c.downcast_ref(), Some(kiln_ir::IrError::OverBudget(_)))
            || matches!(
                c.downcast_ref(),
                Some(kiln_frontend::FrontendError::Ir(kiln_ir::IrError::OverBudget(_)))
            )
    }) {
        return Some(K::Unsupported);
    }
    if let Some(fe) = e.downcast_ref::<kiln_frontend::FrontendError>() {
        use kiln_frontend::FrontendError as F;
        return Some(match fe {
            F::Unsupported(_) => K::Unsupported,
            F::InputShape(_) | F::Io { .. } => K::Usage,
            _ => K::InvalidModel,
        });
    }
    if let Some(p) = e.downcast_ref::<kiln_optimizer::PassError>() {
        use kiln_optimizer::PassFailure as P;
        return Some(match p.failure {
            // The model uses something a pass cannot handle (control flow it cannot lower).
            P::Unsupported => K::Unsupported,
            P::Run | P::Verify => K::Internal,
        });
    }
    if let Some(c) = e.downcast_ref::<kiln_codegen::CodegenError>() {
        use kiln_codegen::CodegenError as C;
        return Some(match c {
            C::Unsupported { .. } | C::UnsupportedNodes(_) | C::Target(_) => K::Unsupported,
            C::Internal(_) => K::Internal,
            C::Io(_) => K::CompileFailed,
        });
    }
    None
}

/// Where an error points in the model (every field `None` when the error does not say;
/// serialized into the CLI's failure report).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Location {
    pub node: Option<String>,
    pub op: Option<String>,
    pub pass: Option<String>,
}

/// The first node, operator and pass named along the error's chain of causes.
pub fn locate(e: &anyhow::Error) -> Location {
    let mut loc = Location::default();
    for cause in e.chain() {
        if let Some(p) = cause.downcast_ref::<kiln_optimizer::PassError>() {
            loc.pass.get_or_insert_with(|| p.pass.to_string());
            if loc.node.is_none() {
                loc.node = p.node.clone();
            }
        }
        let (node, op) = if let Some(f) = cause.downcast_ref::<kiln_frontend::FrontendError>() {
            use kiln_frontend::FrontendError as F;
            match f {
                F::Node { node, op_type, .. } => (Some(node), Some(op_type)),
                F::Unsupported(ops) => match ops.first() {
                    Some(u) => (Some(&u.node), Some(&u.op_type)),
                    None => (None, None),
                },
                _ => (None, None),
            }
        } else if let Some(c) = cause.downcast_ref::<kiln_codegen::CodegenError>() {
            use kiln_codegen::CodegenError as C;
            match c {
                C::Unsupported { node, op, .. } => (Some(node), Some(op)),
                C::UnsupportedNodes(all) => match all.first() {
                    Some(C::Unsupported { node, op, .. }) => (Some(node), Some(op)),
                    _ => (None, None),
                },
                _ => (None, None),
            }
        } else if let Some(kiln_ir::IrError::Node { node, op, .. }) = cause.downcast_ref() {
            (Some(node), Some(op))
        } else if let Some(kiln_ir::IrError::OverBudget(b)) = cause.downcast_ref() {
            (Some(&b.node), Some(&b.op))
        } else {
            (None, None)
        };
        if loc.node.is_none() {
            loc.node = node.cloned();
        }
        if loc.op.is_none() {
            loc.op = op.cloned();
        }
    }
    loc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frontend_node_error_is_an_invalid_model_at_its_node() {
        let e = anyhow::Error::new(kiln_frontend::FrontendError::Node {
            node: "conv1".into(),
            op_type: "Conv".into(),
            msg: "bad".into(),
        })
        .context("model.onnx");
        assert_eq!(failure_kind(&e), Some(FailureKind::InvalidModel));
        let loc = locate(&e);
        assert_eq!(loc.node.as_deref(), Some("conv1"));
        assert_eq!(loc.op.as_deref(), Some("Conv"));
    }

    #[test]
    fn an_unsupported_codegen_node_is_unsupported_at_its_node() {
        let e = anyhow::Error::new(kiln_codegen::CodegenError::unsupported("n", "Foo", "no"));
        assert_eq!(failure_kind(&e), Some(FailureKind::Unsupported));
        assert_eq!(locate(&e).node.as_deref(), Some("n"));
    }

    #[test]
    fn a_plain_error_has_no_kind() {
        assert_eq!(
            failure_kind(&anyhow::anyhow!("--input: expected NAME=FILE")),
            None
        );
    }
}
