//! What an error is about, for machines: the node and operator it names, the pass it happened
//! in, and the document `--report FILE` receives when a command fails.

use crate::exit::{classify, Exit};
use serde::Serialize;
use std::path::Path;

pub use kiln_driver::{locate, Location};

fn exit_name(exit: Exit) -> &'static str {
    match exit {
        Exit::Success => "success",
        Exit::VerifyFailed => "verification-failed",
        Exit::Usage => "usage",
        Exit::InvalidModel => "invalid-model",
        Exit::Unsupported => "unsupported",
        Exit::CompileFailed => "compile-failed",
        Exit::RunFailed => "run-failed",
        Exit::Internal => "internal",
    }
}

/// The report of a command that failed (schema `kiln.failure/1`, docs/report.md).
#[derive(Serialize, Debug)]
pub struct FailureReport {
    pub schema: &'static str,
    pub kiln_version: &'static str,
    pub command: String,
    pub exit_code: u8,
    pub exit: &'static str,
    pub error: String,
    #[serde(flatten)]
    pub location: Location,
}

pub fn failure_report(command: &str, e: &anyhow::Error, message: &str) -> FailureReport {
    let exit = classify(e);
    FailureReport {
        schema: "kiln.failure/1",
        kiln_version: env!("CARGO_PKG_VERSION"),
        command: command.to_string(),
        exit_code: exit.code(),
        exit: exit_name(exit),
        error: message.to_string(),
        location: locate(e),
    }
}

/// Writes a JSON document to `path` (pretty-printed, newline-terminated).
pub fn write_json<T: Serialize>(value: &T, path: &Path) -> anyhow::Result<()> {
    let mut text = serde_json::to_string_pretty(value)?;
    text.push('\n');
    std::fs::write(path, text).map_err(|e| {
        anyhow::Error::new(crate::exit::Failure::new(
            Exit::Usage,
            format!("cannot write the report {}: {e}", path.display()),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locates_the_node_of_a_frontend_error() {
        let e = anyhow::Error::new(kiln_frontend::FrontendError::Node {
            node: "conv1".into(),
            op_type: "Conv".into(),
            msg: "bad".into(),
        })
        .context("model.onnx");
        let loc = locate(&e);
        assert_eq!(loc.node.as_deref(), Some("conv1"));
        assert_eq!(loc.op.as_deref(), Some("Conv"));
        let r = failure_report("compile", &e, "x");
        assert_eq!((r.exit_code, r.exit), (3, "invalid-model"));
    }

    #[test]
    fn unsupported_operator_is_exit_4() {
        let e = anyhow::Error::new(kiln_frontend::FrontendError::Unsupported(vec![
            kiln_frontend::UnsupportedOp {
                node: "n".into(),
                op_type: "Foo".into(),
                domain: String::new(),
                opset: 17,
            },
        ]));
        let r = failure_report("compile", &e, "x");
        assert_eq!((r.exit_code, r.location.node.as_deref()), (4, Some("n")));
    }
}
