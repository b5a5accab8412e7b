//! The runtime stub, compiled natively with a hand-written fake model (tests/fake_model.c):
//! the thread pool, the executable's command line, and .npy files as kiln itself reads and
//! writes them.

use kiln_frontend::npy::{parse_npy, read_npy, to_npy_bytes, write_npy};
use kiln_ir::Tensor;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

fn clang() -> String {
    if let Ok(c) = std::env::var("KILN_CLANG") {
        return c;
    }
    for c in ["clang-19", "/usr/lib/llvm-19/bin/clang"] {
        if Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return c.to_string();
        }
    }
    panic!("clang 19 not found (apt install clang-19, or set KILN_CLANG)");
}

/// Builds the fake model executable once per test run.
fn fake() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln_rt_fake_model");
        let c = manifest.join("c");
        let out = Command::new(clang())
            .args(["-std=gnu11", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-I"])
            .arg(&c)
            .arg(c.join("runtime.c"))
            .arg(c.join("profile.c"))
            .arg(c.join("weights.c"))
            .arg(c.join("npy.c"))
            .arg(c.join("exe_main.c"))
            .arg(manifest.join("tests/fake_model.c"))
            .arg("-o")
            .arg(&exe)
            .args(["-lpthread", "-lm"])
            .output()
            .expect("running clang");
        assert!(
            out.status.success(),
            "compiling the runtime stub failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        exe
    })
}

fn run(model: &str, args: &[&str], dir: &Path) -> Output {
    Command::new(fake())
        .args(args)
        .current_dir(dir)
        .env("KILN_FAKE_MODEL", model)
        .output()
        .expect("running the fake model")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[track_caller]
fn assert_fails(o: &Output, code: i32, msg: &str) {
    assert_eq!(
        o.status.code(),
        Some(code),
        "stdout: {}\nstderr: {}",
        stdout(o),
        stderr(o)
    );
    assert!(
        stderr(o).contains(msg),
        "expected {msg:?} in stderr: {}",
        stderr(o)
    );
}

fn tempdir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("kiln_rt_{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn x34(offset: f32) -> Tensor {
    Tensor::from_vec(
        vec![3, 4],
        (0..12).map(|i| i as f32 + offset).collect::<Vec<f32>>(),
    )
}

#[test]
fn thread_pool_covers_every_index_once() {
    // 1, 2 and 7 threads; two contexts driven concurrently; default thread count; see
    // fake_model.c's selftest.
    let o = Command::new(fake()).arg("--selftest").output().unwrap();
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("selftest: ok"), "{}", stdout(&o));
}

#[test]
fn runs_and_writes_outputs_kiln_can_read() {
    let d = tempdir("roundtrip");
    write_npy(&d.join("x.npy"), &x34(0.0)).unwrap();
    for threads in ["1", "2", "7"] {
        let o = run(
            "add1",
            &[
                "--input",
                "x=x.npy",
                "--output-dir",
                "out/nested",
                "--threads",
                threads,
            ],
            &d,
        );
        assert!(o.status.success(), "{}", stderr(&o));
        // The output name "y/out" is sanitized as kiln run does.
        let y = read_npy(&d.join("out/nested/y_out.npy")).unwrap();
        assert_eq!(y, x34(1.0));
        assert!(
            stdout(&o).starts_with("y/out: f32[3,4] [1, 2, 3, 4, 5, 6, ...]  min 1 max 12 mean 6.500000"),
            "{}",
            stdout(&o)
        );
    }
    // A bare file is enough for a single-input model; no --output-dir writes nothing.
    let o = run("add1", &["-i", "x.npy"], &d);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!d.join("y_out.npy").exists());
}

#[test]
fn every_dtype_and_scalars() {
    let d = tempdir("multi");
    let a = Tensor::from_vec(vec![2, 2], vec![1i64 << 40, -5, 7, 0]);
    write_npy(&d.join("a.npy"), &a).unwrap();
    write_npy(&d.join("b.npy"), &Tensor::scalar(3u8)).unwrap();
    write_npy(
        &d.join("c.npy"),
        &Tensor::from_vec(vec![3], vec![true, false, true]),
    )
    .unwrap();
    let o = run(
        "multi",
        &["-i", "c=c.npy", "-i", "a=a.npy", "--input=b=b.npy", "-o", "."],
        &d,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let s = read_npy(&d.join("s.npy")).unwrap();
    assert_eq!(s, Tensor::from_vec(vec![2, 2], vec![(1i64 << 40) + 3, -2, 10, 3]));
    let flag = read_npy(&d.join("flag.npy")).unwrap();
    assert_eq!(flag, Tensor::from_vec(vec![3], vec![false, true, false]));
    assert!(stdout(&o).contains("flag: bool[3] [0, 1, 0]"), "{}", stdout(&o));

    // bf16 travels as float32 both ways, as kiln writes it.
    let x = Tensor::from_vec(vec![3], vec![1.5f32, -2.0, 96.0]);
    write_npy(&d.join("h.npy"), &x).unwrap();
    let o = run("bf16", &["-i", "x=h.npy", "-o", "."], &d);
    assert!(o.status.success(), "{}", stderr(&o));
    let y = read_npy(&d.join("y.npy")).unwrap();
    assert_eq!(y, Tensor::from_vec(vec![3], vec![2.5f32, -1.0, 97.0]));
}

/// A .npy file of another format version, written by hand (kiln writes 1.0 only).
fn npy_version(t: &Tensor, major: u8) -> Vec<u8> {
    let v1 = to_npy_bytes(t);
    let hlen = u16::from_le_bytes([v1[8], v1[9]]) as usize;
    let mut header = v1[10..10 + hlen].to_vec();
    // Keep the data 64-byte aligned: two more length bytes, two fewer padding spaces.
    header.drain(header.len() - 3..header.len() - 1);
    let mut out = b"\x93NUMPY".to_vec();
    out.extend_from_slice(&[major, 0]);
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(&v1[10 + hlen..]);
    out
}

#[test]
fn reads_format_versions_2_and_3() {
    let d = tempdir("versions");
    for major in [2u8, 3] {
        let bytes = npy_version(&x34(5.0), major);
        assert_eq!(
            parse_npy(&bytes, "v.npy").unwrap(),
            x34(5.0),
            "kiln's reader agrees"
        );
        std::fs::write(d.join("v.npy"), bytes).unwrap();
        let o = run("add1", &["-i", "x=v.npy", "-o", "."], &d);
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(read_npy(&d.join("y_out.npy")).unwrap(), x34(6.0));
    }
}

/// A version 1.0 .npy file with this header and no data.
fn npy_v1(header: &str) -> Vec<u8> {
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16 + 1).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.push(b'\n');
    out
}

/// `bytes` with the first `from` replaced by `to` (same length, so the header length holds).
fn replace_bytes(bytes: &[u8], from: &str, to: &str) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let i = bytes
        .windows(from.len())
        .position(|w| w == from.as_bytes())
        .unwrap_or_else(|| panic!("{from:?} not in the file"));
    [&bytes[..i], to.as_bytes(), &bytes[i + from.len()..]].concat()
}

#[test]
fn rejects_bad_inputs_with_clear_messages() {
    let d = tempdir("reject");
    let good = to_npy_bytes(&x34(0.0));
    std::fs::write(d.join("good.npy"), &good).unwrap();
    write_npy(
        &d.join("shape.npy"),
        &Tensor::from_vec(vec![4, 3], vec![0f32; 12]),
    )
    .unwrap();
    write_npy(
        &d.join("dtype.npy"),
        &Tensor::from_vec(vec![3, 4], vec![0f64; 12]),
    )
    .unwrap();
    std::fs::write(d.join("trunc.npy"), &good[..good.len() - 5]).unwrap();
    std::fs::write(d.join("trailing.npy"), [&good[..], b"xy"].concat()).unwrap();
    std::fs::write(d.join("magic.npy"), b"PK\x03\x04 this is a zip file").unwrap();
    std::fs::write(d.join("short.npy"), b"\x93NUM").unwrap();
    let fortran = replace_bytes(&good, "'fortran_order': False", "'fortran_order': True ");
    std::fs::write(d.join("fortran.npy"), fortran).unwrap();
    let mut huge = b"\x93NUMPY\x02\x00".to_vec();
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    std::fs::write(d.join("huge.npy"), huge).unwrap();
    let big_dim = npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 99999999999999999999), }");
    std::fs::write(d.join("bigdim.npy"), big_dim).unwrap();
    let structured = npy_v1("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3, 4), }");
    std::fs::write(d.join("structured.npy"), structured).unwrap();

    let cases: &[(&[&str], i32, &str)] = &[
        (
            &["-i", "x=shape.npy"],
            2,
            "input 'x': expected f32[3,4], got f32[4,3] in shape.npy",
        ),
        (
            &["-i", "x=dtype.npy"],
            2,
            "input 'x': expected f32[3,4], got f64[3,4] in dtype.npy",
        ),
        (
            &["-i", "x=trunc.npy"],
            2,
            "truncated data: f32 needs 48 bytes, the file has 43",
        ),
        (&["-i", "x=trailing.npy"], 2, "2 bytes of trailing data"),
        (
            &["-i", "x=magic.npy"],
            2,
            "magic.npy is not a valid .npy file: missing the \\x93NUMPY magic",
        ),
        (&["-i", "x=short.npy"], 2, "missing the \\x93NUMPY magic"),
        (
            &["-i", "x=fortran.npy"],
            2,
            "Fortran-order arrays are not supported",
        ),
        (&["-i", "x=huge.npy"], 2, "is too long"),
        (&["-i", "x=bigdim.npy"], 2, "too large"),
        (
            &["-i", "x=structured.npy"],
            2,
            "structured arrays are not supported",
        ),
        (&["-i", "x=missing.npy"], 2, "input 'x': cannot read missing.npy"),
        (&[], 2, "missing --input for x (the model's inputs: x: f32[3,4])"),
        (
            &["-i", "y=good.npy"],
            2,
            "the model has no input 'y' (the model's inputs: x: f32[3,4])",
        ),
        (
            &["-i", "x=good.npy", "-i", "good.npy"],
            2,
            "input 'x' is given twice",
        ),
        (
            &["-i", "x=good.npy", "--bench", "0"],
            2,
            "--bench expects a number of runs >= 1",
        ),
        (
            &["-i", "x=good.npy", "--threads"],
            2,
            "missing value after --threads",
        ),
        (
            &["-i", "x=good.npy", "--frobnicate"],
            2,
            "unexpected argument '--frobnicate'",
        ),
        (&["good.npy"], 2, "inputs are given as --input NAME=FILE.npy"),
    ];
    for (args, code, msg) in cases {
        let o = run("add1", args, &d);
        assert_fails(&o, *code, msg);
    }
    // Several inputs: a bare file is ambiguous, and every missing input is named.
    write_npy(&d.join("a.npy"), &Tensor::from_vec(vec![2, 2], vec![0i64; 4])).unwrap();
    let o = run("multi", &["-i", "a=a.npy"], &d);
    assert_fails(
        &o,
        2,
        "missing --input for b, c (the model's inputs: a: i64[2,2], b: u8[], c: bool[3])",
    );
    let o = run("multi", &["-i", "a.npy"], &d);
    assert_fails(&o, 2, "--input 'a.npy': expected NAME=FILE");
    // An error raised by the model's code.
    write_npy(&d.join("boom.npy"), &x34(-999.0)).unwrap();
    let o = run("add1", &["-i", "x=boom.npy"], &d);
    assert_fails(&o, 6, "error: node 'add' (Add): the input asked for an error");
}

#[test]
fn info_help_version() {
    let d = tempdir("info");
    let o = run("add1", &["--info"], &d);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("--info prints JSON");
    assert_eq!(v["name"], "add1");
    assert_eq!(v["inputs"][0]["shape"], serde_json::json!([3, 4]));
    let o = run("add1", &["--help"], &d);
    assert!(o.status.success());
    assert!(stdout(&o).contains("x: f32[3,4]") && stdout(&o).contains("y/out: f32[3,4]"));
    let o = run("add1", &["--version"], &d);
    assert!(o.status.success());
    assert!(stdout(&o).contains("kiln 0.1.0-test"));
}

#[test]
fn bench_output_format() {
    let d = tempdir("bench");
    write_npy(&d.join("x.npy"), &x34(0.0)).unwrap();
    let o = run(
        "add1",
        &["-i", "x=x.npy", "--bench", "3", "--threads", "2", "-q"],
        &d,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let line = out
        .lines()
        .find(|l| l.starts_with("latency: "))
        .expect("a latency line");
    // latency: median X.XXX ms, min Y.YYY ms over 3 runs, 2 threads
    let rest = line.strip_prefix("latency: median ").unwrap();
    let (median, rest) = rest.split_once(" ms, min ").unwrap();
    let (min, rest) = rest.split_once(" ms over ").unwrap();
    assert_eq!(rest, "3 runs, 2 threads");
    for v in [median, min] {
        assert_eq!(v.split_once('.').map(|(_, f)| f.len()), Some(3), "{line}");
        assert!(v.parse::<f64>().is_ok(), "{line}");
    }
    assert!(median.parse::<f64>().unwrap() >= min.parse::<f64>().unwrap());
}

#[test]
fn refuses_cpus_without_the_compiled_features() {
    let d = tempdir("cpu");
    write_npy(&d.join("x.npy"), &x34(0.0)).unwrap();
    // The "avx512" model needs +avx2,+fma,avx512f,avx512bw (unknown names are skipped).
    let o = run("avx512", &["-i", "x=x.npy"], &d);
    let flags = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags = flags.lines().find(|l| l.starts_with("flags")).unwrap_or("");
    let has = |f: &str| flags.split_whitespace().any(|x| x == f);
    if !cfg!(target_arch = "x86_64") || (has("avx2") && has("fma") && has("avx512f") && has("avx512bw")) {
        assert!(o.status.success(), "{}", stderr(&o));
    } else {
        let missing = ["avx2", "fma", "avx512f", "avx512bw"]
            .into_iter()
            .find(|f| !has(f))
            .unwrap();
        assert_fails(
            &o,
            1,
            &format!("this program was compiled for a CPU with {missing}, which this CPU lacks (compile with --cpu"),
        );
    }
    // --info still works, so a user can see what the program needs.
    assert!(run("avx512", &["--info"], &d).status.success());
}

/// The kernel events of a trace, (kernel name, run, ts, dur), and its run events (run, ts, dur).
type Events = (Vec<(String, u64, f64, f64)>, Vec<(u64, f64, f64)>);

fn trace_events(path: &Path) -> Events {
    let text = std::fs::read_to_string(path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).expect("the trace is JSON");
    assert_eq!(v["displayTimeUnit"], "ms");
    let (mut kernels, mut runs) = (vec![], vec![]);
    for e in v["traceEvents"].as_array().unwrap() {
        if e["ph"] == "M" {
            continue;
        }
        assert_eq!(e["ph"], "X", "{e}");
        assert!(e["pid"].is_u64() && e["tid"].is_u64(), "{e}");
        let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
        assert!(ts >= 0.0 && dur >= 0.0, "{e}");
        let run = e["args"]["run"].as_u64().unwrap();
        match e["cat"].as_str().unwrap() {
            "kernel" => kernels.push((e["name"].as_str().unwrap().to_string(), run, ts, dur)),
            "run" => runs.push((run, ts, dur)),
            other => panic!("unexpected category {other}"),
        }
    }
    (kernels, runs)
}

#[test]
fn profile_writes_a_chrome_trace_and_a_table() {
    let d = tempdir("profile");
    write_npy(&d.join("x.npy"), &x34(0.0)).unwrap();
    let o = run(
        "add1",
        &[
            "-i",
            "x.npy",
            "--profile",
            "p.json",
            "--bench",
            "4",
            "--threads",
            "2",
        ],
        &d,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let (kernels, runs) = trace_events(&d.join("p.json"));
    // The 4 timed runs (not the warm-up), each with both kernels, inside the run.
    assert_eq!(runs.iter().map(|r| r.0).collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert_eq!(kernels.len(), 8);
    for (i, (name, run, ts, dur)) in kernels.iter().enumerate() {
        assert_eq!(name, ["add", "check \"x\"\\1"][i % 2]);
        assert_eq!(*run, i as u64 / 2);
        let (_, rts, rdur) = runs[*run as usize];
        assert!(
            *ts >= rts && ts + dur <= rts + rdur,
            "kernel {i} is not inside its run"
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(d.join("p.json")).unwrap()).unwrap();
    let check = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "check \"x\"\\1")
        .unwrap();
    let args = &check["args"];
    assert_eq!(
        args["nodes"],
        serde_json::json!(["check \"x\"\\1", "check/étape"])
    );
    assert_eq!(args["op"], "Check+Check");
    assert_eq!(v["otherData"]["runs"], 4);

    let err = stderr(&o);
    assert!(err.contains("profile: 2 kernels over 4 runs"), "{err}");
    let header = err
        .lines()
        .position(|l| l.starts_with("rank"))
        .expect("a table header");
    let rows: Vec<&str> = err
        .lines()
        .skip(header + 1)
        .take_while(|l| !l.starts_with("profile written"))
        .collect();
    assert_eq!(rows.len(), 2, "{err}");
    assert!(
        rows.iter().any(|r| r.contains(" add ") && r.contains('%')),
        "{err}"
    );
    // The latency line is unchanged.
    assert!(stdout(&o).contains("latency: median"), "{}", stdout(&o));

    // One run without --bench; --profile-top limits the table; --quiet prints no table.
    let o = run(
        "add1",
        &["-i", "x.npy", "--profile=one.json", "--profile-top", "1"],
        &d,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let (kernels, runs) = trace_events(&d.join("one.json"));
    assert_eq!((kernels.len(), runs.len()), (2, 1));
    let err = stderr(&o);
    assert!(err.contains("top kernels by time"), "{err}");
    let header = err.lines().position(|l| l.starts_with("rank")).unwrap();
    assert!(
        err.lines()
            .nth(header + 2)
            .unwrap()
            .starts_with("profile written"),
        "{err}"
    );
    let o = run("add1", &["-i", "x.npy", "--profile", "q.json", "-q"], &d);
    assert!(
        o.status.success() && !stderr(&o).contains("rank"),
        "{}",
        stderr(&o)
    );
    assert!(d.join("q.json").exists());
}

#[test]
fn profile_errors() {
    let d = tempdir("profile_errors");
    write_npy(&d.join("x.npy"), &x34(0.0)).unwrap();
    let o = run("add1", &["-i", "x.npy", "--profile", "no/such/dir/p.json"], &d);
    assert_fails(
        &o,
        2,
        "error: cannot write the profile to no/such/dir/p.json: No such file",
    );
    let o = run("add1", &["-i", "x.npy", "--profile-top", "-1"], &d);
    assert_fails(&o, 2, "--profile-top expects a number of kernels >= 0");
    let o = run("add1", &["-i", "x.npy", "--profile"], &d);
    assert_fails(&o, 2, "missing value after --profile");
    // A failing run leaves no half-written trace behind it.
    write_npy(
        &d.join("bad.npy"),
        &Tensor::from_vec(vec![3, 4], vec![-999.0f32; 12]),
    )
    .unwrap();
    let o = run("add1", &["-i", "bad.npy", "--profile", "bad.json"], &d);
    assert_fails(&o, 6, "the input asked for an error");
    assert!(!d.join("bad.json").exists());
    let o = run("add1", &["--help"], &d);
    assert!(stdout(&o).contains("--profile FILE"), "{}", stdout(&o));
}
