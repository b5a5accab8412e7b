//! `kiln compile --report` and `kiln explain`: the JSON report accounts for every node of the
//! model, its memory plan is consistent, and explain prints the same report as a table.

use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const STATUSES: &[&str] = &[
    "kernel",
    "fused",
    "lowered",
    "view",
    "constant",
    "dead",
    "identity",
    "cse",
    "batchnorm",
    "rewritten",
];

fn kiln() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/models")
        .join(name)
        .join("model.onnx")
}

fn explain_json(model: &Path, extra: &[&str]) -> Value {
    let out = kiln()
        .arg("explain")
        .arg(model)
        .arg("--json")
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kiln explain failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("explain --json prints JSON")
}

/// The imported model's operator nodes (what the report must account for).
fn model_nodes(model: &Path) -> BTreeSet<String> {
    let m = kiln_frontend::load_model(model, &Default::default()).unwrap();
    m.graph
        .nodes()
        .iter()
        .filter(|n| !matches!(n.op, kiln_ir::Op::Input | kiln_ir::Op::Constant(_)))
        .map(|n| n.name.clone())
        .collect()
}

/// Every node listed once with a documented status; kernel references point at kernels that
/// list the node; memory buffers that are alive together never share bytes.
fn check_consistent(r: &Value, model: &Path) {
    assert_eq!(r["schema"], "kiln.report/1");
    let nodes = r["nodes"].as_array().unwrap();
    let kernels = r["kernels"].as_array().unwrap();
    let names: BTreeSet<String> = nodes
        .iter()
        .map(|n| n["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names.len(), nodes.len(), "a node is listed twice");
    assert_eq!(
        names,
        model_nodes(model),
        "the report's nodes are not the model's"
    );
    assert_eq!(
        r["summary"]["nodes_before_passes"].as_u64().unwrap() as usize,
        nodes.len()
    );
    assert_eq!(r["summary"]["kernels"].as_u64().unwrap() as usize, kernels.len());
    for n in nodes {
        let status = n["status"].as_str().unwrap();
        assert!(STATUSES.contains(&status), "undocumented status {status}");
        if status == "kernel" || status == "fused" {
            let k = n["kernel"].as_u64().unwrap() as usize;
            let listed: Vec<&str> = kernels[k]["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x["name"].as_str().unwrap())
                .collect();
            assert!(
                listed.contains(&n["name"].as_str().unwrap()),
                "{n} not in kernel {k}"
            );
            assert_eq!(listed[0] == n["name"], status == "kernel");
            assert!(n["layout"].is_string() && n["dtype"].is_string());
        }
    }
    for (i, k) in kernels.iter().enumerate() {
        assert_eq!(k["index"].as_u64().unwrap() as usize, i);
        assert!(!k["nodes"].as_array().unwrap().is_empty());
        let kind = k["kind"].as_str().unwrap();
        let imp = k["implementation"].as_str().unwrap();
        assert!(
            kind == "generated" || (kind == "library" && imp.starts_with("kiln_uk_")),
            "{k}"
        );
    }
    let mem = &r["memory"];
    let arena = mem["arena_bytes"].as_u64().unwrap();
    let bufs: Vec<(u64, u64, u64, u64)> = mem["buffers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            let f = |k: &str| b[k].as_u64().unwrap();
            (f("offset"), f("size"), f("first_kernel"), f("last_kernel"))
        })
        .collect();
    for (i, a) in bufs.iter().enumerate() {
        assert!(
            a.0 + a.1 <= arena && a.2 <= a.3,
            "buffer {i} outside the arena or its lifetime"
        );
        for b in &bufs[i + 1..] {
            let alive_together = a.2 <= b.3 && b.2 <= a.3;
            let overlap = a.0 < b.0 + b.1 && b.0 < a.0 + a.1;
            assert!(
                !(alive_together && overlap),
                "buffers {a:?} and {b:?} share bytes while alive"
            );
        }
    }
    assert!(r["target"]["triple"].is_string());
    assert!(r["target"]["cpu_features"].is_array());
}

#[test]
fn compile_report_accounts_for_every_node() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixture("resnet_basic_tiny");
    let json = dir.path().join("r.json");
    let out = kiln()
        .arg("compile")
        .arg(&model)
        .args(["--emit", "obj", "-q", "-o"])
        .arg(dir.path().join("r.o"))
        .arg("--report")
        .arg(&json)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    check_consistent(&r, &model);
    // An object is portable by default on x86-64: the report names the variants it carries.
    if cfg!(target_arch = "x86_64") {
        assert_eq!(
            r["target"]["variants"],
            serde_json::json!(["x86-64-v3", "x86-64-v4"])
        );
    }

    // A residual block's Conv with its Relu is one fusion group.
    let groups = r["fusion_groups"].as_array().unwrap();
    let ops = |k: usize| -> Vec<String> {
        r["kernels"][k]["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["op"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(
        groups.iter().any(|g| {
            let ops = ops(g["kernel"].as_u64().unwrap() as usize);
            ops[0] == "Conv" && ops.iter().any(|o| o == "Relu")
        }),
        "no Conv+Relu fusion group: {groups:?}"
    );
    // BatchNormalization is folded into the Conv before it and lands in its kernel.
    let bn = r["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["op"] == "BatchNormalization")
        .unwrap();
    assert_eq!(bn["status"], "batchnorm");
    assert!(bn["kernel"].is_u64());

    // explain --json of the same command line is the same document (pass timings aside);
    // --emit obj makes both a portable build.
    let mut e = explain_json(&model, &["--emit", "obj"]);
    let mut r = r;
    for doc in [&mut e, &mut r] {
        for p in doc["passes"].as_array_mut().unwrap() {
            p["time_ms"] = Value::Null;
        }
    }
    assert_eq!(e, r);
}

#[test]
fn fusion_off_gives_one_kernel_per_node() {
    let model = fixture("resnet_basic_tiny");
    let fused = explain_json(&model, &[]);
    let unfused = explain_json(
        &model,
        &["--disable-pass", "fuse", "--disable-pass", "fuse-kernels"],
    );
    check_consistent(&unfused, &model);
    assert_eq!(unfused["options"]["fusion"], false);
    assert_eq!(unfused["fusion_groups"].as_array().unwrap().len(), 0);
    assert!(unfused["summary"]["kernels"].as_u64().unwrap() > fused["summary"]["kernels"].as_u64().unwrap());
}

#[test]
fn kernel_grouping_is_a_pass_of_its_own() {
    let model = fixture("resnet_basic_tiny");
    let kernels = |r: &Value| r["summary"]["kernels"].as_u64().unwrap();
    let groups = |r: &Value| r["fusion_groups"].as_array().unwrap().len();
    let fused = explain_json(&model, &[]);
    let passes: Vec<&str> = fused["passes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    // The plan passes follow the graph passes (`absorb-bf16-rounding` only for CPUs whose
    // products round their operands).
    let at = |name: &str| passes.iter().position(|p| *p == name);
    assert_eq!(
        at("fuse-kernels"),
        at("lower-control-flow").map(|i| i + 1),
        "{passes:?}"
    );
    let ungrouped = explain_json(&model, &["--disable-pass", "fuse-kernels"]);
    check_consistent(&ungrouped, &model);
    assert_eq!(ungrouped["options"]["fusion"], false);
    assert_eq!(groups(&ungrouped), 0);
    assert!(kernels(&ungrouped) > kernels(&fused));
    // The graph pass alone leaves the grouping on.
    let no_fuse = explain_json(&model, &["--disable-pass", "fuse"]);
    assert_eq!(no_fuse["options"]["fusion"], true);
    assert!(groups(&no_fuse) > 0);

    // `--print-after` prints the kernel list after a plan pass.
    let out = kiln()
        .arg("explain")
        .arg(&model)
        .args(["--print-after", "fuse-kernels"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.starts_with("# after fuse-kernels: "), "{err}");
    assert_eq!(err.lines().count(), kernels(&fused) as usize + 1, "{err}");
    assert!(err.contains(" + Relu): "), "a fused Conv + Relu kernel: {err}");

    // Unknown names are refused with the list of graph and plan passes.
    for flag in ["--disable-pass", "--print-after"] {
        let out = kiln()
            .arg("explain")
            .arg(&model)
            .args([flag, "nope"])
            .output()
            .unwrap();
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("'nope'") || err.contains(" nope:"), "{err}");
        assert!(
            err.contains("lower-control-flow, fuse-kernels, absorb-bf16-rounding"),
            "{err}"
        );
    }
}

#[test]
fn conv_algorithm_direct_turns_winograd_off() {
    // Three stride-1 3x3 convolutions wide enough for Winograd: two F(4x4), one F(2x2).
    let model = fixture("conv_winograd");
    let winograd_kernels = |r: &Value| {
        r["kernels"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|k| k["implementation"].as_str().unwrap().starts_with("winograd"))
            .count()
    };
    let auto = explain_json(&model, &[]);
    check_consistent(&auto, &model);
    assert_eq!(auto["options"]["conv_algorithm"], "auto");
    assert_eq!(auto["options"]["mode"], "default");
    assert_eq!(winograd_kernels(&auto), 3, "{:#}", auto["kernels"]);
    let direct = explain_json(&model, &["--conv-algorithm", "direct"]);
    assert_eq!(direct["options"]["conv_algorithm"], "direct");
    assert_eq!(winograd_kernels(&direct), 0, "{:#}", direct["kernels"]);
    assert_eq!(auto["summary"]["kernels"], direct["summary"]["kernels"]);
}

#[test]
fn control_flow_and_views_are_accounted_for() {
    for m in [
        "if_captured",
        "loop_static",
        "constant_identity_dropout",
        "bert_tiny_decomposed_ln",
    ] {
        let model = fixture(m);
        let r = explain_json(&model, &[]);
        check_consistent(&r, &model);
    }
    let r = explain_json(&fixture("if_captured"), &[]);
    let lowered = r["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["op"] == "If")
        .unwrap();
    assert_eq!(lowered["status"], "lowered");
    assert!(!lowered["kernels"].as_array().unwrap().is_empty());
}

#[test]
fn explain_prints_a_table() {
    let out = kiln()
        .arg("explain")
        .arg(fixture("resnet_basic_tiny"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    for heading in [
        "CPU features assumed:",
        "\npasses\n",
        "\nkernels\n",
        "\nnodes\n",
        "\nmemory: arena ",
    ] {
        assert!(text.contains(heading), "no '{heading}' in:\n{text}");
    }
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("Relu ") && l.contains(" fused ")),
        "no row for the fused Relu:\n{text}"
    );
    // Explaining writes no artifact.
    let dir = tempfile::tempdir().unwrap();
    let out = kiln()
        .current_dir(dir.path())
        .arg("explain")
        .arg(fixture("conv_basic"))
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
