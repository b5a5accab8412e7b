//! CUDA artifacts on machines without a usable GPU: no driver, a driver that finds no device,
//! a device index out of range, a device older than the PTX, a driver failing after the device
//! check. Each is a one-line error and exit status 6 (run failed), never a crash. A fake driver
//! (runtime-stub/tests/fake_cuda.c, loaded through $KILN_CUDA_DRIVER) stands in for libcuda;
//! in its host-memory mode the host runtime's whole run path (copies, frame, launches, output
//! copies, the device error slot, profiling, the C API with device pointers) runs and every
//! driver resource is checked to be released.

mod common;

use common::{fixture, kiln, one_node_model, write_model};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn compile(out: &Path, extra: &[&str]) {
    let o = kiln()
        .arg("compile")
        .arg(fixture("conv_basic").join("model.onnx"))
        .arg("-o")
        .arg(out)
        .arg("--quiet")
        .args(extra)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "kiln compile {extra:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

/// Builds the fake driver into dir/libfake_cuda.so.
fn fake_driver(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../runtime-stub/tests/fake_cuda.c");
    let lib = dir.join("libfake_cuda.so");
    let o = Command::new(cc())
        .args(["-std=gnu11", "-Wall", "-Werror", "-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .unwrap();
    assert!(o.status.success(), "cc: {}", String::from_utf8_lossy(&o.stderr));
    lib
}

struct Artifacts {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    exe: PathBuf,
    fake: PathBuf,
}

fn artifacts() -> Artifacts {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let exe = dir.join("net");
    compile(&exe, &["--target", "cuda", "--sm", "80"]);
    let fake = fake_driver(&dir);
    Artifacts {
        _dir: tmp,
        dir,
        exe,
        fake,
    }
}

/// Runs the CUDA executable on conv_basic's input with the given environment.
fn run(a: &Artifacts, driver: &Path, env: &[(&str, &str)], extra: &[&str]) -> Output {
    let mut c = Command::new(&a.exe);
    c.env_remove("KILN_CUDA_DEVICE")
        .env_remove("FAKE_CUDA_DEVICES")
        .env_remove("FAKE_CUDA_HOST")
        .env_remove("FAKE_CUDA_SM")
        .env_remove("FAKE_CUDA_FAIL")
        .env_remove("FAKE_CUDA_JIT_FAIL")
        .env_remove("FAKE_CUDA_NO_GRAPHS")
        .env_remove("FAKE_CUDA_STATS")
        .env_remove("KILN_CUDA_GRAPH")
        .env("KILN_CUDA_DRIVER", driver)
        .arg("--input")
        .arg(fixture("conv_basic").join("inputs/x.npy"))
        .args(extra);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// Exit status 6 (the model cannot run here) and exactly one line on stderr, "error: " +
/// something containing `want`.
fn assert_one_line_error(o: &Output, want: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(6), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "not one line: {err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(want), "expected '{want}' in: {err}");
}

#[test]
fn no_driver_or_no_device_is_one_line_and_status_6() {
    let a = artifacts();
    let none = Path::new("/nonexistent/libcuda.so.1");
    assert_one_line_error(
        &run(&a, none, &[], &[]),
        "no CUDA device: cannot load the CUDA driver /nonexistent/libcuda.so.1",
    );
    // cuInit fails with CUDA_ERROR_NO_DEVICE, as on a machine without a GPU.
    assert_one_line_error(
        &run(&a, &a.fake, &[], &[]),
        "no CUDA device: the CUDA driver failed to initialize (no CUDA-capable device is detected)",
    );
    assert_one_line_error(
        &run(&a, &a.fake, &[("FAKE_CUDA_DEVICES", "0")], &[]),
        "no CUDA device: the CUDA driver reports no devices",
    );
    assert_one_line_error(
        &run(&a, &a.fake, &[("FAKE_CUDA_DEVICES", "2")], &["--device", "3"]),
        "no CUDA device: device 3 was asked for, the CUDA driver reports 2 devices",
    );
    assert_one_line_error(
        &run(
            &a,
            &a.fake,
            &[("FAKE_CUDA_DEVICES", "1"), ("KILN_CUDA_DEVICE", "1")],
            &[],
        ),
        "no CUDA device: device 1 was asked for, the CUDA driver reports 1 device",
    );
    assert_one_line_error(
        &run(
            &a,
            &a.fake,
            &[("FAKE_CUDA_DEVICES", "1"), ("KILN_CUDA_DEVICE", "x")],
            &[],
        ),
        "$KILN_CUDA_DEVICE must be a device number",
    );
    assert_one_line_error(
        &run(
            &a,
            &a.fake,
            &[("FAKE_CUDA_DEVICES", "1"), ("FAKE_CUDA_SM", "75")],
            &[],
        ),
        "CUDA device 0 (Fake GPU) is sm_75, older than the sm_80 this model was compiled for",
    );
    // The driver fails right after the device check: the context is not created.
    assert_one_line_error(
        &run(&a, &a.fake, &[("FAKE_CUDA_DEVICES", "1")], &[]),
        "cannot create a context on CUDA device 0 (Fake GPU): unknown error",
    );
    // A bad --device is a usage error before any driver is touched.
    let o = run(&a, none, &[], &["--device", "-1"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn host_runtime_runs_against_the_fake_driver() {
    let a = artifacts();
    let host = [("FAKE_CUDA_DEVICES", "1"), ("FAKE_CUDA_HOST", "1")];
    let o = run(&a, &a.fake, &host, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("on CUDA device 0 (Fake GPU)"), "{err}");
    // Both outputs are printed (their values are whatever the fake kernels left: zeros).
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("conv1x1: f32") && out.contains("conv3x3: f32"),
        "{out}"
    );

    // A kernel that records a failure in the error slot: named by node and operator.
    let mut env = host.to_vec();
    env.push(("FAKE_CUDA_FAIL", "0:1"));
    let o = run(&a, &a.fake, &env, &[]);
    assert_one_line_error(
        &o,
        "failed on the device: an index read from an input is out of range",
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("kernel 0 (node '"), "{err}");
    assert!(err.contains("op Conv"), "{err}");

    // The JIT's error log is part of the message, on the same line.
    let mut env = host.to_vec();
    env.push(("FAKE_CUDA_JIT_FAIL", "1"));
    assert_one_line_error(
        &run(&a, &a.fake, &env, &[]),
        "cannot load the model's PTX (sm_80) on CUDA device 0 (Fake GPU): a PTX JIT compilation failed: ptxas fatal   : fake failure second line",
    );

    // --profile times each kernel (synchronized around it).
    let trace = a.dir.join("trace.json");
    let o = run(
        &a,
        &a.fake,
        &host,
        &["--bench", "2", "--profile", trace.to_str().unwrap()],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("CUDA device 0 (Fake GPU)"));
    let t = std::fs::read_to_string(&trace).unwrap();
    assert!(t.contains("Conv"), "trace without the kernels: {t}");
}

/// The fake driver's launch counts of one process: (kernels launched on their own, graph
/// launches, captures, kernels recorded into graphs).
fn launch_counts(a: &Artifacts, env: &[(&str, &str)], extra: &[&str]) -> [u64; 4] {
    let stats = a.dir.join("stats.txt");
    let _ = std::fs::remove_file(&stats);
    let mut env = env.to_vec();
    let path = stats.to_str().unwrap().to_string();
    env.extend([("FAKE_CUDA_DEVICES", "1"), ("FAKE_CUDA_HOST", "1")]);
    env.push(("FAKE_CUDA_STATS", &path));
    let o = run(a, &a.fake, &env, extra);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let line = std::fs::read_to_string(&stats).unwrap();
    let n: Vec<u64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    assert_eq!(n.len(), 4, "{line}");
    [n[0], n[1], n[2], n[3]]
}

/// A run is one CUDA graph launch: the kernel table is captured once per context and replayed;
/// profiled runs (which time each kernel) and `KILN_CUDA_GRAPH=0` launch kernel by kernel, and a
/// driver whose capture fails falls back to the same launches.
#[test]
fn a_run_is_one_cuda_graph_launch() {
    let a = artifacts();
    let info = Command::new(&a.exe).arg("--info").output().unwrap();
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    let kernels = info["kernels"].as_u64().unwrap();
    assert!(kernels >= 2, "{info}");
    // One run; then --bench 5: a warm-up and five timed runs, one capture in all.
    assert_eq!(launch_counts(&a, &[], &["--quiet"]), [0, 1, 1, kernels]);
    assert_eq!(launch_counts(&a, &[], &["--bench", "5"]), [0, 6, 1, kernels]);
    // Failures reported from inside the graph still name their kernel.
    let o = run(
        &a,
        &a.fake,
        &[
            ("FAKE_CUDA_DEVICES", "1"),
            ("FAKE_CUDA_HOST", "1"),
            ("FAKE_CUDA_FAIL", "1:2"),
        ],
        &[],
    );
    assert_one_line_error(&o, "kernel 1 (node '");
    // Profiled runs: the unprofiled warm-up replays the graph, the 3 timed runs launch each kernel.
    let trace = a.dir.join("graph_trace.json");
    let profiled = ["--bench", "3", "--profile", trace.to_str().unwrap(), "--quiet"];
    assert_eq!(launch_counts(&a, &[], &profiled), [3 * kernels, 1, 1, kernels]);
    assert_eq!(
        launch_counts(&a, &[("KILN_CUDA_GRAPH", "0")], &["--bench", "2"]),
        [3 * kernels, 0, 0, 0]
    );
    assert_eq!(
        launch_counts(&a, &[("FAKE_CUDA_NO_GRAPHS", "1")], &["--bench", "2"]),
        [3 * kernels, 0, 0, 0]
    );
}

/// Compiles `model` for the CUDA target into an executable next to it (named after its stem).
fn compile_cuda(model: &Path, extra: &[&str]) -> PathBuf {
    let exe = model.with_extension("");
    let o = kiln()
        .arg("compile")
        .arg(model)
        .arg("-o")
        .arg(&exe)
        .args(["--quiet", "--target", "cuda"])
        .args(extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    exe
}

/// An output that is the input: the run copies the input to the device, into the output on the
/// device (the plan's output copy) and back, so the values must survive the round trip.
#[test]
fn identity_round_trips_through_device_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let model = write_model(d, "id.onnx", &one_node_model("Identity", "id1"));
    let exe = compile_cuda(&model, &[]);
    let x = kiln_ir::Tensor::from_vec(vec![1, 4], vec![1.5f32, -2.0, 3.25, 7.0]);
    kiln_frontend::npy::write_npy(&d.join("x.npy"), &x).unwrap();
    let o = Command::new(&exe)
        .env("KILN_CUDA_DRIVER", fake_driver(d))
        .env("FAKE_CUDA_DEVICES", "1")
        .env("FAKE_CUDA_HOST", "1")
        .env_remove("KILN_CUDA_DEVICE")
        .args(["--input", "x=x.npy", "--output-dir", "out", "--quiet"])
        .current_dir(d)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let y = kiln_frontend::npy::read_npy(&d.join("out/y.npy")).unwrap();
    assert_eq!(y.to_f64_vec(), vec![1.5, -2.0, 3.25, 7.0]);
}

/// Outputs whose size depends on the data (a detector's NonMaxSuppression and NonZero, and what
/// is gathered by their indices): the counts the kernels leave after the device's error slot
/// become the outputs' shapes, which the executable's `.npy` files take; a count above an
/// output's bound is an error, never a read past its buffer.
#[test]
fn data_dependent_outputs_take_their_shapes_from_the_device_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let src = fixture("detection_postprocess");
    let model = d.join("det.onnx");
    std::fs::copy(src.join("model.onnx"), &model).unwrap();
    let exe = compile_cuda(&model, &["--sm", "80"]);
    let fake = fake_driver(d);
    let run = |counts: &str| {
        Command::new(&exe)
            .env("KILN_CUDA_DRIVER", &fake)
            .env("FAKE_CUDA_DEVICES", "1")
            .env("FAKE_CUDA_HOST", "1")
            .env("FAKE_CUDA_COUNTS", counts)
            .env_remove("KILN_CUDA_DEVICE")
            .arg("--input")
            .arg(format!("boxes={}", src.join("inputs/boxes.npy").display()))
            .arg("--input")
            .arg(format!("scores={}", src.join("inputs/scores.npy").display()))
            .args(["--output-dir", "out", "--quiet"])
            .current_dir(d)
            .output()
            .unwrap()
    };
    // The outputs in order: selected [n, 3] and detections [n, 6] (NonMaxSuppression's
    // count), hot [n, 2] (NonZero's, transposed).
    let o = run("4,4,2");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for (name, shape) in [("selected", [4, 3]), ("detections", [4, 6]), ("hot", [2, 2])] {
        let t = kiln_frontend::npy::read_npy(&d.join(format!("out/{name}.npy"))).unwrap();
        assert_eq!(t.shape(), &shape, "{name}");
    }
    assert_one_line_error(&run("4,4,9999"), "bad count 9999 for output 2");
}

#[test]
fn info_names_the_device_target() {
    let a = artifacts();
    let o = Command::new(&a.exe)
        .env("KILN_CUDA_DRIVER", "/nonexistent/libcuda.so.1")
        .arg("--info")
        .output()
        .unwrap();
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["device"], "cuda sm_80");
}

#[test]
fn device_option_on_a_cpu_artifact_is_a_usage_error() {
    let tmp = tempfile::tempdir().unwrap();
    let exe = tmp.path().join("net");
    compile(&exe, &[]);
    let o = Command::new(&exe)
        .arg("--input")
        .arg(fixture("conv_basic").join("inputs/x.npy"))
        .args(["--device", "0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("--device applies to models compiled with --target cuda"),
        "{err}"
    );
}

const APP: &str = r#"
#include "net.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* argv[1]: "none" (expect no device) or "host" (the fake driver's host mode). */
int main(int argc, char **argv) {
  if (argc < 2) return 10;
  if (strcmp(argv[1], "none") == 0) {
    net_ctx *c = net_create(1);
    if (c) return 11;
    printf("%s\n", net_last_error(NULL));
    if (net_create_on_device(0)) return 12;
    if (strncmp(net_last_error(NULL), "no CUDA device: ", 16) != 0) return 13;
    if (net_run_device(NULL, NULL, NULL, NULL) != -1) return 14;
    return 0;
  }
  net_ctx *c = net_create_on_device(0);
  if (!c) {
    fprintf(stderr, "%s\n", net_last_error(NULL));
    return 15;
  }
  float *x = calloc(1 << 16, 1), *y1 = calloc(1 << 16, 1), *y2 = calloc(1 << 16, 1);
  /* In the fake driver's host mode device pointers are host pointers. */
  int rc = net_run_device(c, (const void *const[]){x}, (void *const[]){y1, y2}, NULL);
  if (rc == 0) rc = net_run_generic(c, (const void *const[]){x}, (void *const[]){y1, y2});
  if (rc != 0) fprintf(stderr, "%s\n", net_last_error(c));
  net_destroy(c);
  free(x);
  free(y1);
  free(y2);
  return rc == 0 ? 0 : 16;
}
"#;

#[test]
fn static_library_reports_no_device_and_runs_on_device_pointers() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    compile(
        &d.join("net"),
        &["--target", "cuda", "--emit", "staticlib", "--name", "net"],
    );
    let header = std::fs::read_to_string(d.join("net.h")).unwrap();
    assert!(header.contains("net_run_device(net_ctx *ctx, const void *const *d_inputs"));
    assert!(header.contains("-ldl"));
    std::fs::write(d.join("app.c"), APP).unwrap();
    let o = Command::new(cc())
        .current_dir(d)
        .args(["-std=c11", "-Wall", "-Werror", "app.c", "libnet.a", "-o", "app"])
        .args(["-lpthread", "-lm", "-ldl"])
        .output()
        .unwrap();
    assert!(o.status.success(), "cc: {}", String::from_utf8_lossy(&o.stderr));
    let fake = fake_driver(d);
    let o = Command::new(d.join("app"))
        .arg("none")
        .env("KILN_CUDA_DRIVER", "/nonexistent/libcuda.so.1")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("no CUDA device: "));
    let o = Command::new(d.join("app"))
        .arg("host")
        .env("KILN_CUDA_DRIVER", &fake)
        .env("FAKE_CUDA_DEVICES", "1")
        .env("FAKE_CUDA_HOST", "1")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
}

/// No invalid access and nothing left allocated on the failure paths and a fake-device run.
#[test]
fn no_device_paths_under_valgrind() {
    if Command::new("valgrind").arg("--version").output().is_err() {
        eprintln!("valgrind not installed: nothing to check");
        return;
    }
    let a = artifacts();
    let cases: [(&Path, Vec<(&str, &str)>); 3] = [
        (Path::new("/nonexistent/libcuda.so.1"), vec![]),
        (&a.fake, vec![("FAKE_CUDA_DEVICES", "1")]),
        (&a.fake, vec![("FAKE_CUDA_DEVICES", "1"), ("FAKE_CUDA_HOST", "1")]),
    ];
    for (driver, env) in cases {
        let mut c = Command::new("valgrind");
        c.args([
            "--quiet",
            "--error-exitcode=99",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite,indirect",
        ])
        .arg(&a.exe)
        .arg("--input")
        .arg(fixture("conv_basic").join("inputs/x.npy"))
        .arg("--quiet")
        .env("KILN_CUDA_DRIVER", driver);
        for (k, v) in &env {
            c.env(k, v);
        }
        let o = c.output().unwrap();
        assert_ne!(
            o.status.code(),
            Some(99),
            "valgrind found errors ({env:?}): {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// A batch range on the CUDA target: the executable runs each sample through the device (its
/// slice copied in, the kernels replayed as the context's one CUDA graph, its slice of the
/// outputs copied back), so a batch of 3 is three graph launches of one capture, and an
/// Identity model gives every sample back in its place.
#[test]
fn a_batch_range_runs_each_sample_through_the_device() {
    use kiln_frontend::onnx::proto::{DimValue, TypeValue};
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let mut m = one_node_model("Identity", "id1");
    let g = m.graph.as_mut().unwrap();
    for v in g.input.iter_mut().chain(g.output.iter_mut()) {
        let Some(TypeValue::TensorType(t)) = v.r#type.as_mut().and_then(|t| t.value.as_mut()) else {
            unreachable!()
        };
        t.shape.as_mut().unwrap().dim[0].value = Some(DimValue::DimParam("batch".into()));
    }
    let model = write_model(d, "id.onnx", &m);
    let exe = compile_cuda(&model, &["--input-shape", "x=1..4,4"]);
    let info = Command::new(&exe).arg("--info").output().unwrap();
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(info["batch"], serde_json::json!({"min": 1, "max": 4}), "{info}");

    let fake = fake_driver(d);
    let stats = d.join("stats.txt");
    let run = |n: usize| {
        let x = kiln_ir::Tensor::from_vec(vec![n, 4], (0..4 * n).map(|i| i as f32 * 1.5 - 2.0).collect());
        kiln_frontend::npy::write_npy(&d.join("x.npy"), &x).unwrap();
        let _ = std::fs::remove_file(&stats);
        let o = Command::new(&exe)
            .env("KILN_CUDA_DRIVER", &fake)
            .env("FAKE_CUDA_DEVICES", "1")
            .env("FAKE_CUDA_HOST", "1")
            .env("FAKE_CUDA_STATS", &stats)
            .env_remove("KILN_CUDA_DEVICE")
            .env_remove("KILN_CUDA_GRAPH")
            .args(["--input", "x=x.npy", "--output-dir", "out", "--quiet"])
            .current_dir(d)
            .output()
            .unwrap();
        (x, o)
    };
    let (x, o) = run(3);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let y = kiln_frontend::npy::read_npy(&d.join("out/y.npy")).unwrap();
    assert_eq!(y.shape(), &[3, 4]);
    assert_eq!(y.to_f64_vec(), x.to_f64_vec());
    let line = std::fs::read_to_string(&stats).unwrap();
    let counts: Vec<u64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    assert_eq!(counts[1..3], [3, 1], "graph launches and captures: {line}");

    // Outside the range: a usage error naming the input, before any device work.
    let (_, o) = run(5);
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("input 'x': expected f32[1..4,4], got f32[5,4]"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
