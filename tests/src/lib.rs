//! Shared test support: repository paths, per-dtype output comparison, and the ONNX
//! conformance case runner.

pub mod bf16;
pub mod compare;
pub mod compiled;
pub mod conformance;
pub mod cuda;
pub mod fixtures;
pub mod rng;
pub mod staticlib;

use std::path::PathBuf;

/// The repository root (the workspace folder).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}
