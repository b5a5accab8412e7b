//! kiln's exit statuses. CI scripts branch on them, so the numbers are part of kiln's interface:
//! documented in the README ("Exit codes") and never renumbered.

use std::fmt;

/// Why kiln stopped. `code()` is the process exit status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Everything asked for was done (and `kiln verify` found the results within tolerance).
    Success,
    /// `kiln verify` (or a check it runs) found results outside tolerance.
    VerifyFailed,
    /// The command line is wrong: unknown flag, bad value, a missing or malformed input file.
    Usage,
    /// The model file is not a valid model: truncated, wrong field types, cyclic, dangling names.
    InvalidModel,
    /// A valid model kiln does not handle: unsupported operator, dtype or dynamic dimension.
    Unsupported,
    /// Generating, assembling or linking the artifact failed (LLVM, the C compiler, the linker,
    /// writing the output).
    CompileFailed,
    /// The compiled model could not run on this machine: out of memory for its arena, no CUDA
    /// device, a CPU without the features it was compiled for. The executable exits with the
    /// same status, and `kiln run` passes it on.
    RunFailed,
    /// A bug in kiln (a pass produced an invalid graph, LLVM rejected generated IR, a panic).
    Internal,
}

impl Exit {
    pub fn code(self) -> u8 {
        match self {
            Exit::Success => 0,
            Exit::VerifyFailed => 1,
            Exit::Usage => 2,
            Exit::InvalidModel => 3,
            Exit::Unsupported => 4,
            Exit::CompileFailed => 5,
            Exit::RunFailed => 6,
            Exit::Internal => 70,
        }
    }
}

/// An error that says which exit status it ends kiln with. Commands return it (through
/// `anyhow`) where the status is not implied by the error's type, e.g. a verification mismatch.
#[derive(Debug)]
pub struct Failure {
    pub exit: Exit,
    pub message: String,
}

impl Failure {
    pub fn new(exit: Exit, message: impl Into<String>) -> Failure {
        Failure {
            exit,
            message: message.into(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

/// The exit status for an error that reached `main`.
pub fn classify(e: &anyhow::Error) -> Exit {
    if let Some(f) = e.downcast_ref::<Failure>() {
        return f.exit;
    }
    // The layers' own errors, as the driver reads them.
    if let Some(kind) = kiln_driver::failure_kind(e) {
        use kiln_driver::FailureKind as K;
        return match kind {
            K::Usage => Exit::Usage,
            K::InvalidModel => Exit::InvalidModel,
            K::Unsupported => Exit::Unsupported,
            K::CompileFailed => Exit::CompileFailed,
            K::Internal => Exit::Internal,
        };
    }
    // Commands report problems with their own arguments and files through plain `anyhow`
    // errors (`--input` not NAME=FILE, an input file of the wrong shape, ...).
    Exit::Usage
}
