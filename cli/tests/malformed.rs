//! The malformed-model suite (tests/malformed/, written by tests/malformed/generate.py): `kiln
//! inspect` and `kiln compile` on every case give the expected exit status and a one-line error
//! naming the problem, never a panic or a hang.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Far above what any case needs (they fail before code generation); a hang fails the test.
const TIMEOUT: Duration = Duration::from_secs(60);

struct Expected {
    exit: i32,
    errors: Vec<String>,
}

fn suite_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/malformed")
}

fn cases() -> Vec<(String, PathBuf, Expected)> {
    let mut out = vec![];
    for entry in std::fs::read_dir(suite_dir()).expect("tests/malformed exists") {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "onnx") {
            continue;
        }
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let spec = std::fs::read_to_string(path.with_extension("expected"))
            .unwrap_or_else(|e| panic!("{name}: no .expected file: {e}"));
        let mut exit = None;
        let mut errors = vec![];
        for line in spec.lines() {
            match line.split_once(' ') {
                Some(("exit", n)) => exit = Some(n.trim().parse().expect("exit status")),
                Some(("error", text)) => errors.push(text.to_string()),
                _ if line.trim().is_empty() || line.starts_with('#') => {}
                _ => panic!("{name}.expected: cannot parse '{line}'"),
            }
        }
        let exit = exit.unwrap_or_else(|| panic!("{name}.expected has no 'exit' line"));
        out.push((name, path, Expected { exit, errors }));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Runs kiln with a time limit: (exit status, stdout, stderr).
fn kiln(args: &[&std::ffi::OsStr]) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kiln runs");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kiln {args:?} did not finish in {TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        status.code().unwrap_or(-1),
        out_reader.join().unwrap(),
        err_reader.join().unwrap(),
    )
}

/// Checks one failing run; returns what is wrong with it, if anything.
fn check_failure(what: &str, code: i32, stderr: &str, exp: &Expected) -> Option<String> {
    if code != exp.exit {
        return Some(format!("{what}: exit {code}, expected {}: {stderr}", exp.exit));
    }
    if stderr.lines().count() != 1 || !stderr.starts_with("error: ") {
        return Some(format!("{what}: expected a one-line error, got: {stderr:?}"));
    }
    let missing: Vec<&String> = exp
        .errors
        .iter()
        .filter(|e| !stderr.contains(e.as_str()))
        .collect();
    if !missing.is_empty() {
        return Some(format!(
            "{what}: the error does not mention {missing:?}: {stderr}"
        ));
    }
    None
}

#[test]
fn malformed_models() {
    let cases = cases();
    assert!(cases.len() >= 20, "the suite has only {} cases", cases.len());
    let tmp = tempfile::tempdir().unwrap();
    // Cases are independent: run them on a few threads to keep the test short.
    let problems = std::sync::Mutex::new(Vec::<String>::new());
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((name, path, exp)) = cases.get(i) else {
                    break;
                };
                let mut found = vec![];

                let out = tmp.path().join(name);
                let (code, _, err) = kiln(&[
                    "compile".as_ref(),
                    path.as_os_str(),
                    "-o".as_ref(),
                    out.as_os_str(),
                ]);
                found.extend(check_failure(&format!("{name}: kiln compile"), code, &err, exp));
                if out.exists() {
                    found.push(format!("{name}: kiln compile left an artifact behind"));
                }

                // inspect describes what it can: a model that decodes but does not import is
                // reported (exit 0) with the import error in the report.
                let (code, stdout, err) = kiln(&["inspect".as_ref(), "--json".as_ref(), path.as_os_str()]);
                if code == 0 {
                    let report: serde_json::Value = match serde_json::from_str(&stdout) {
                        Ok(r) => r,
                        Err(e) => {
                            found.push(format!("{name}: kiln inspect --json printed no JSON ({e})"));
                            serde_json::Value::Null
                        }
                    };
                    let import_error = report["import_error"].as_str().unwrap_or_default();
                    if import_error.is_empty() {
                        found.push(format!("{name}: kiln inspect reports no import error"));
                    }
                    for e in &exp.errors {
                        if !import_error.contains(e.as_str()) {
                            found.push(format!(
                                "{name}: kiln inspect's import error does not mention '{e}': {import_error}"
                            ));
                        }
                    }
                    if exp.exit == 4
                        && report["unsupported"].as_array().is_none_or(|a| a.is_empty())
                        && !import_error.contains("opset")
                    {
                        found.push(format!("{name}: kiln inspect lists no unsupported operator"));
                    }
                } else {
                    found.extend(check_failure(&format!("{name}: kiln inspect"), code, &err, exp));
                }
                problems.lock().unwrap().extend(found);
            });
        }
    });
    let problems = problems.into_inner().unwrap();
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The suite is what the generator writes: a case added to the generator without regenerating
/// (or a hand-edited .expected) shows up here.
#[test]
fn every_case_has_both_files() {
    let dir = suite_dir();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let p = entry.unwrap().path();
        match p.extension().and_then(|e| e.to_str()) {
            Some("onnx") => assert!(
                p.with_extension("expected").exists(),
                "{} has no .expected",
                p.display()
            ),
            Some("expected") => assert!(p.with_extension("onnx").exists(), "{} has no .onnx", p.display()),
            _ => {}
        }
    }
}
