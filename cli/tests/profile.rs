//! Per-kernel profiling of compiled models: the executable's `--profile` (Chrome trace and top-N
//! table) and a static library's profiling API (`kiln compile --profile`), checked against the
//! kernels `kiln explain --json` lists for the same model.

use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

const MODEL: &str = "resnet_basic_tiny";

fn kiln() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/models")
        .join(name)
}

fn tempdir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("profile_{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[track_caller]
fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `kiln explain --json`'s kernels: for each, its node names (anchor first) and operators.
fn explain_kernels(model: &Path) -> Vec<(Vec<String>, Vec<String>)> {
    let o = kiln().arg("explain").arg(model).arg("--json").output().unwrap();
    ok(&o);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    r["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            let nodes = k["nodes"].as_array().unwrap();
            let field = |f: &str| nodes.iter().map(|n| n[f].as_str().unwrap().to_string()).collect();
            (field("name"), field("op"))
        })
        .collect()
}

struct KernelEvent {
    name: String,
    run: u64,
    ts: f64,
    dur: f64,
    nodes: Vec<String>,
    op: String,
    gflop: f64,
}

/// The kernel events of a trace and the (ts, dur) of each run, checking the Chrome trace format
/// on the way: an object with traceEvents, complete ("X") or metadata ("M") events.
fn read_trace(path: &Path) -> (Vec<KernelEvent>, Vec<(f64, f64)>) {
    let v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).expect("the trace is JSON");
    assert_eq!(v["displayTimeUnit"], "ms");
    let (mut kernels, mut runs) = (vec![], vec![]);
    for e in v["traceEvents"].as_array().unwrap() {
        assert!(e["pid"].is_u64() && e["tid"].is_u64(), "{e}");
        if e["ph"] == "M" {
            continue;
        }
        assert_eq!(e["ph"], "X", "{e}");
        let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
        assert!(ts >= 0.0 && dur >= 0.0, "{e}");
        let args = &e["args"];
        if e["cat"] == "run" {
            assert_eq!(args["run"].as_u64().unwrap() as usize, runs.len());
            runs.push((ts, dur));
            continue;
        }
        assert_eq!(e["cat"], "kernel");
        kernels.push(KernelEvent {
            name: e["name"].as_str().unwrap().to_string(),
            run: args["run"].as_u64().unwrap(),
            ts,
            dur,
            nodes: args["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_str().unwrap().to_string())
                .collect(),
            op: args["op"].as_str().unwrap().to_string(),
            gflop: args["gflop"].as_f64().unwrap(),
        });
    }
    (kernels, runs)
}

/// Each run has one event per kernel, in run order, named and described as explain describes
/// the kernels, inside its run; the kernels' durations add up to no more than the run's.
fn check_runs(events: &[KernelEvent], runs: &[(f64, f64)], expected: &[(Vec<String>, Vec<String>)]) {
    let n = expected.len();
    assert_eq!(events.len(), runs.len() * n, "one event per kernel per run");
    for (r, (rts, rdur)) in runs.iter().enumerate() {
        let in_run = &events[r * n..(r + 1) * n];
        for (e, (nodes, ops)) in in_run.iter().zip(expected) {
            assert_eq!(e.run, r as u64);
            assert_eq!(&e.name, &nodes[0]);
            assert_eq!(&e.nodes, nodes);
            assert_eq!(e.op, ops.join("+"));
            assert!(
                e.ts >= *rts && e.ts + e.dur <= rts + rdur + 1e-3,
                "{} is outside run {r}",
                e.name
            );
        }
        let sum: f64 = in_run.iter().map(|e| e.dur).sum();
        assert!(sum <= *rdur + 1e-3, "kernels take {sum} µs of a {rdur} µs run");
    }
}

#[test]
fn executable_profile_trace_and_table() {
    let d = tempdir("exe");
    let model = fixture(MODEL).join("model.onnx");
    let exe = d.join("net");
    ok(&kiln()
        .arg("compile")
        .arg(&model)
        .arg("-o")
        .arg(&exe)
        .arg("-q")
        .output()
        .unwrap());
    let expected = explain_kernels(&model);
    assert!(
        expected.len() > 5,
        "the table test wants more kernels than it shows"
    );
    let input = fixture(MODEL).join("inputs/input.npy");
    let trace = d.join("trace.json");
    let start = Instant::now();
    let o = Command::new(&exe)
        .arg("--input")
        .arg(&input)
        .arg("--profile")
        .arg(&trace)
        .args(["--bench", "3", "--threads", "2", "--profile-top", "5"])
        .output()
        .unwrap();
    let wall_us = start.elapsed().as_secs_f64() * 1e6;
    let err = ok(&o);
    let (events, runs) = read_trace(&trace);
    assert_eq!(runs.len(), 3, "the timed runs, not the warm-up");
    check_runs(&events, &runs, &expected);
    let total: f64 = events.iter().map(|e| e.dur).sum();
    assert!(
        total <= wall_us,
        "kernels take {total} µs, the process {wall_us} µs"
    );
    // Every node a kernel implements is in the trace; convolutions have FLOPs.
    let traced: BTreeSet<&String> = events.iter().flat_map(|e| &e.nodes).collect();
    let planned: BTreeSet<&String> = expected.iter().flat_map(|k| &k.0).collect();
    assert_eq!(traced, planned);
    assert!(events
        .iter()
        .filter(|e| e.op.starts_with("Conv"))
        .all(|e| e.gflop > 0.0));

    // The table: the 5 kernels taking the most time, by decreasing time, with their shares.
    assert!(
        err.contains(&format!("profile: {} kernels over 3 runs", expected.len())),
        "{err}"
    );
    assert!(err.contains("top kernels by time"), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    let h = lines
        .iter()
        .position(|l| l.starts_with("rank"))
        .expect("a table header");
    for col in ["kernel", "nodes", "ms/run", "share", "GFLOP/s"] {
        assert!(lines[h].contains(col), "{}", lines[h]);
    }
    let rows = &lines[h + 1..h + 6];
    let mut last = f64::INFINITY;
    for (i, row) in rows.iter().enumerate() {
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols[0], (i + 1).to_string(), "{row}");
        let ms: f64 = cols[cols.len() - 3].parse().unwrap();
        assert!(ms <= last, "not sorted by time: {row}");
        last = ms;
        assert!(cols[cols.len() - 2].ends_with('%'), "{row}");
    }
    assert!(lines[h + 6].starts_with("profile written to"), "{err}");

    // One run without --bench; the default table lists up to 15 kernels.
    let o = Command::new(&exe)
        .arg("--input")
        .arg(&input)
        .arg("--profile")
        .arg(&trace)
        .output()
        .unwrap();
    let err = ok(&o);
    let (events, runs) = read_trace(&trace);
    assert_eq!(runs.len(), 1);
    check_runs(&events, &runs, &expected);
    let h = err.lines().position(|l| l.starts_with("rank")).unwrap();
    let rows = err
        .lines()
        .skip(h + 1)
        .take_while(|l| !l.starts_with("profile written"))
        .count();
    assert_eq!(rows, expected.len().min(15), "{err}");
}

#[test]
fn static_library_profile_api() {
    let d = tempdir("lib");
    let model = fixture(MODEL).join("model.onnx");
    let compile = |dir: &str, profile: bool| {
        let mut c = kiln();
        c.arg("compile")
            .arg(&model)
            .args(["--emit", "staticlib", "--name", "net", "-q", "-o"])
            .arg(d.join(dir).join("net"));
        if profile {
            c.arg("--profile");
        }
        ok(&c.output().unwrap());
        (
            std::fs::read_to_string(d.join(dir).join("net.h")).unwrap(),
            std::fs::read(d.join(dir).join("libnet.a")).unwrap(),
        )
    };
    let has = |bytes: &[u8], s: &str| bytes.windows(s.len()).any(|w| w == s.as_bytes());

    // Without --profile, neither the header nor the library has profiling functions.
    let (h, lib) = compile("plain", false);
    assert!(!h.contains("profile"), "{h}");
    assert!(!has(&lib, "net_profile_"));

    let (h, lib) = compile("prof", true);
    for f in [
        "net_profile_enable",
        "net_profile_kernels",
        "net_profile_write_trace",
    ] {
        assert!(h.contains(&format!("{f}(")), "{f} missing from the header");
        assert!(has(&lib, f), "{f} missing from the library");
    }
    let app = d.join("app.c");
    std::fs::write(&app, APP).unwrap();
    let bin = d.join("app");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    ok(&Command::new(cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(d.join("prof"))
        .arg(&app)
        .arg(d.join("prof/libnet.a"))
        .args(["-lpthread", "-lm", "-o"])
        .arg(&bin)
        .output()
        .unwrap());
    let trace = d.join("lib_trace.json");
    let o = Command::new(&bin)
        .arg(&trace)
        .arg(d.join("no/such/dir/t.json"))
        .output()
        .unwrap();
    ok(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    let expected = explain_kernels(&model);
    let rows: Vec<Vec<&str>> = out
        .lines()
        .filter_map(|l| l.strip_prefix("kernel\t"))
        .map(|l| l.split('\t').collect())
        .collect();
    assert_eq!(rows.len(), expected.len(), "{out}");
    let mut flops = 0u64;
    for (row, (nodes, ops)) in rows.iter().zip(&expected) {
        // name, op, nodes, calls, total_ns, flops
        assert_eq!(row[0], nodes[0]);
        assert_eq!(row[1], ops.join("+"));
        assert_eq!(row[2], nodes.join(","));
        assert_eq!(row[3], "2", "two runs were profiled");
        assert!(row[4].parse::<i64>().unwrap() >= 0);
        flops += row[5].parse::<u64>().unwrap();
    }
    assert!(flops > 0);
    assert!(out.contains("before enable: -1"), "{out}");
    assert!(out.contains("bad path: cannot write the profile to"), "{out}");
    assert!(out.contains("null ctx: -1"), "{out}");
    assert!(
        out.contains("null ctx error: profile_enable: ctx is NULL"),
        "{out}"
    );
    let (events, runs) = read_trace(&trace);
    assert_eq!(runs.len(), 2);
    check_runs(&events, &runs, &expected);
}

/// Enables profiling, runs twice on zeros, prints the kernel table and writes the trace to
/// argv[1]; also prints what the API answers for misuse.
const APP: &str = r#"#include "net.h"
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  if (argc < 3) return 2;
  net_ctx *ctx = net_create(2);
  if (!ctx) { fprintf(stderr, "%s\n", net_last_error(NULL)); return 1; }
  void *ins[NET_NUM_INPUTS + 1], *outs[NET_NUM_OUTPUTS + 1];
  for (int i = 0; i < NET_NUM_INPUTS; i++) ins[i] = calloc(1, 1 << 24);
  for (int i = 0; i < NET_NUM_OUTPUTS; i++) outs[i] = calloc(1, 1 << 24);
  printf("before enable: %d\n", net_profile_kernels(ctx, NULL, 0));
  printf("null ctx: %d\n", net_profile_enable(NULL, 1));
  printf("null ctx error: %s\n", net_last_error(NULL));
  if (net_run_generic(ctx, (const void *const *)ins, outs) != 0) return 1; /* not profiled */
  if (net_profile_enable(ctx, 1) != 0) return 1;
  for (int r = 0; r < 2; r++)
    if (net_run_generic(ctx, (const void *const *)ins, outs) != 0) return 1;
  net_profile_enable(ctx, 0);
  if (net_run_generic(ctx, (const void *const *)ins, outs) != 0) return 1; /* not profiled */
  int n = net_profile_kernels(ctx, NULL, 0);
  net_profile_kernel *k = calloc((size_t)n, sizeof *k);
  if (net_profile_kernels(ctx, k, n) != n) return 1;
  for (int i = 0; i < n; i++) {
    printf("kernel\t%s\t%s\t", k[i].name, k[i].op);
    for (int j = 0; j < k[i].n_nodes; j++) printf("%s%s", j ? "," : "", k[i].nodes[j]);
    printf("\t%lld\t%lld\t%lld\n", (long long)k[i].calls, (long long)k[i].total_ns, (long long)k[i].flops);
  }
  if (net_profile_write_trace(ctx, argv[1]) != 0) { fprintf(stderr, "%s\n", net_last_error(ctx)); return 1; }
  if (net_profile_write_trace(ctx, argv[2]) == 0) return 1;
  printf("bad path: %s\n", net_last_error(ctx));
  free(k);
  for (int i = 0; i < NET_NUM_INPUTS; i++) free(ins[i]);
  for (int i = 0; i < NET_NUM_OUTPUTS; i++) free(outs[i]);
  net_destroy(ctx);
  return 0;
}
"#;
