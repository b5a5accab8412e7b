//! A model of many kernels runs them from parts of the run function (`kiln.run.part*`, 256
//! kernels each), so the run function stays a short list of calls however large the graph; the
//! parts keep the kernels' order, failure statuses and profiling hooks.

mod common;

use common::*;
use std::path::Path;

/// `x -> Relu -> ... -> y`, `n` nodes.
fn relu_chain(dir: &Path, n: usize) -> std::path::PathBuf {
    let mut m = one_node_model("Relu", "relu0");
    let g = m.graph.as_mut().unwrap();
    g.node = (0..n)
        .map(|i| {
            let input = if i == 0 {
                "x".to_string()
            } else {
                format!("t{}", i - 1)
            };
            let output = if i + 1 == n {
                "y".to_string()
            } else {
                format!("t{i}")
            };
            node("Relu", &format!("relu{i}"), &[&input], &[&output])
        })
        .collect();
    write_model(dir, "chain.onnx", &m)
}

/// The lines of the body of the function `name` in LLVM IR text.
fn body_lines(ir: &str, name: &str) -> usize {
    let start = ir
        .lines()
        .position(|l| l.starts_with("define") && l.contains(&format!("@{name}(")))
        .unwrap_or_else(|| panic!("no function {name}"));
    ir.lines().skip(start).take_while(|l| *l != "}").count()
}

#[test]
fn a_long_unfused_chain_runs_from_bounded_parts() {
    let dir = tempfile::tempdir().unwrap();
    let n = 600;
    let model = relu_chain(dir.path(), n);
    let ll = dir.path().join("chain.ll");
    let o = kiln()
        .args([
            "compile",
            "-q",
            "--disable-pass",
            "fuse-kernels",
            "--emit",
            "llvm-ir",
        ])
        .arg(&model)
        .arg("-o")
        .arg(&ll)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ir = std::fs::read_to_string(&ll).unwrap();
    let parts = ir
        .lines()
        .filter(|l| l.starts_with("define") && l.contains("@kiln.run.part"))
        .count();
    assert_eq!(parts, n.div_ceil(256), "parts of 256 kernels");
    // Three calls and their status checks, not 600 kernel calls.
    assert!(
        body_lines(&ir, "kiln.run") < 60,
        "kiln.run has {} lines",
        body_lines(&ir, "kiln.run")
    );

    // The executable: right values, and the profile sees every kernel.
    let exe = dir.path().join("chain");
    let o = kiln()
        .args(["compile", "-q", "--disable-pass", "fuse-kernels", "--profile"])
        .arg(&model)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let x = dir.path().join("x.npy");
    kiln_frontend::npy::write_npy(
        &x,
        &kiln_ir::Tensor::from_vec(vec![1, 4], vec![-1f32, 2.0, -3.0, 4.0]),
    )
    .unwrap();
    let trace = dir.path().join("trace.json");
    let o = std::process::Command::new(&exe)
        .arg("--input")
        .arg(format!("x={}", x.display()))
        .arg("--profile")
        .arg(&trace)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{stderr}");
    assert!(stdout.contains("[0, 2, 0, 4]"), "{stdout}");
    assert!(stderr.contains(&format!("profile: {n} kernels")), "{stderr}");
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let events = doc["traceEvents"]
        .as_array()
        .or(doc.as_array())
        .expect("trace events");
    let last = format!("relu{}", n - 1);
    assert!(
        events.iter().any(|e| e["name"].as_str() == Some(last.as_str())),
        "the last part's kernels are profiled"
    );
}
