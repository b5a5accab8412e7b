//! Shared test support: repository paths, per-dtype output comparison, and the ONNX
//! conformance case runner.

pub mod compare;
pub mod conformance;
pub mod fixtures;

use std::path::PathBuf;

/// The repository root (the workspace folder).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// Output file name of an output value: characters outside `[A-Za-z0-9._-]` become `_`.
pub fn sanitize_output_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}
