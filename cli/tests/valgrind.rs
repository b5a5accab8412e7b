//! A handful of diverse fixtures compiled to executables and run under valgrind memcheck by
//! scripts/valgrind.sh (which runs all of them when asked): no invalid access, no use of
//! uninitialised memory, no leak, in the generated code or the runtime stub.

use std::path::Path;
use std::process::Command;

/// Convolutions (grouped, depthwise, with batch norm), a recurrent cell, control flow with
/// captured values, gathers, top-k (two outputs, one integer), external weights.
const FIXTURES: &[&str] = &[
    "conv_grouped",
    "mobilenetv2_tiny",
    "lstm",
    "if_captured",
    "gather_nd",
    "topk",
    "external_data",
];

#[test]
fn fixtures_under_valgrind() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(root.join("scripts/valgrind.sh"))
        .args(FIXTURES)
        .env("KILN", env!("CARGO_BIN_EXE_kiln"))
        .output()
        .expect("running scripts/valgrind.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "scripts/valgrind.sh failed:\n{stdout}{stderr}"
    );
    let clean = stdout.lines().filter(|l| l.starts_with("ok ")).count();
    assert_eq!(
        clean,
        FIXTURES.len(),
        "not every fixture ran clean:\n{stdout}{stderr}"
    );
}
