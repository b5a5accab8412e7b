//! The interestingness test: does a model still fail the way the original does?

use crate::model_args::ModelArgs;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What "still fails" means.
pub enum Check {
    /// A shell command; fails when it exits non-zero (or with exactly `expect`).
    Shell { cmd: String, expect: Option<i32> },
    /// `kiln compile` fails with the same exit status and the same kind of error.
    Compile,
    /// `kiln verify` exits 1 (results outside tolerance).
    Verify,
}

/// How one run of a check ended.
pub enum Outcome {
    /// Exit status (`None`: killed by a signal) and the last lines of stderr.
    Exited {
        code: Option<i32>,
        stderr: String,
    },
    TimedOut,
}

/// A check with what the original model's failure looked like.
pub struct Checker {
    pub check: Check,
    pub timeout: Duration,
    work: PathBuf,
    /// For `compile`: the exit status and error signature the original failed with.
    expected: Option<(Option<i32>, String)>,
}

impl Checker {
    pub fn new(check: Check, timeout: Duration, work: PathBuf) -> Checker {
        Checker {
            check,
            timeout,
            work,
            expected: None,
        }
    }

    /// Runs the check on the original model (with the user's model arguments); `Ok(None)` when
    /// it fails as required, else what happened instead.
    pub fn check_original(&mut self, model: &ModelArgs) -> Result<Option<String>> {
        let mut extra = vec![];
        for w in &model.weights {
            extra.push("--weights".into());
            extra.push(w.display().to_string());
        }
        for s in &model.input_shapes {
            extra.push("--input-shape".into());
            extra.push(s.clone());
        }
        for s in &model.bind {
            extra.push("--bind".into());
            extra.push(s.clone());
        }
        if let Some(bytes) = model.max_memory {
            extra.push(format!("--max-memory={bytes}"));
        }
        let outcome = self.run(&model.model, &extra)?;
        if let (Check::Compile, Outcome::Exited { code, stderr }) = (&self.check, &outcome) {
            if *code != Some(0) {
                self.expected = Some((*code, signature(stderr, &model.model)));
                return Ok(None);
            }
        }
        if self.fails(&outcome, &model.model) {
            Ok(None)
        } else {
            Ok(Some(describe(&outcome)))
        }
    }

    /// Runs the check on a candidate model file: `Some(true)` if it still fails,
    /// `Some(false)` if not, `None` if it timed out (which counts as not failing).
    pub fn still_fails(&self, path: &Path) -> Result<Option<bool>> {
        let outcome = self.run(path, &[])?;
        if matches!(outcome, Outcome::TimedOut) {
            return Ok(None);
        }
        Ok(Some(self.fails(&outcome, path)))
    }

    fn fails(&self, outcome: &Outcome, path: &Path) -> bool {
        let Outcome::Exited { code, stderr } = outcome else {
            return false;
        };
        match &self.check {
            Check::Shell { expect: None, .. } => *code != Some(0),
            Check::Shell { expect: Some(e), .. } => *code == Some(*e),
            Check::Verify => *code == Some(1),
            Check::Compile => match &self.expected {
                Some((c, sig)) => code == c && signature(stderr, path) == *sig,
                None => false,
            },
        }
    }

    fn run(&self, model: &Path, extra: &[String]) -> Result<Outcome> {
        let exe = std::env::current_exe().context("cannot find the kiln executable")?;
        let mut cmd = match &self.check {
            Check::Shell { cmd, .. } => {
                let quoted = shell_quote(&model.display().to_string());
                let line = if cmd.contains("{}") {
                    cmd.replace("{}", &quoted)
                } else {
                    format!("{cmd} {quoted}")
                };
                let mut c = Command::new("sh");
                c.arg("-c").arg(line);
                c
            }
            Check::Compile => {
                let mut c = Command::new(exe);
                c.arg("compile")
                    .arg(model)
                    .arg("--quiet")
                    .arg("-o")
                    .arg(self.work.join("artifact"));
                c.args(extra);
                c
            }
            Check::Verify => {
                let mut c = Command::new(exe);
                // Whether it fails is all a candidate's check needs; finding the culprit
                // (recompiling without each pass) is left to the user's run on the result.
                c.arg("verify").arg(model).arg("--no-bisect").args(extra);
                c
            }
        };
        run_with_timeout(&mut cmd, self.timeout, &self.work.join("stderr.txt"))
    }
}

/// Runs `cmd` in its own process group (so a timeout ends everything it started), stdout
/// discarded and stderr kept in `stderr_file`.
fn run_with_timeout(cmd: &mut Command, timeout: Duration, stderr_file: &Path) -> Result<Outcome> {
    use std::os::unix::process::CommandExt;
    let err = std::fs::File::create(stderr_file)
        .with_context(|| format!("cannot create {}", stderr_file.display()))?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err)
        .process_group(0);
    let mut child = cmd.spawn().context("cannot start the check")?;
    let start = Instant::now();
    let mut pause = Duration::from_millis(2);
    loop {
        if let Some(status) = child.try_wait()? {
            let stderr = std::fs::read(stderr_file).unwrap_or_default();
            let stderr = String::from_utf8_lossy(&stderr);
            // The tail is enough to classify an error and to show it.
            let lines: Vec<&str> = stderr.lines().collect();
            let tail = lines[lines.len().saturating_sub(20)..].join("\n");
            return Ok(Outcome::Exited {
                code: status.code(),
                stderr: tail,
            });
        }
        if start.elapsed() >= timeout {
            let group = format!("-{}", child.id());
            let _ = Command::new("kill")
                .args(["-KILL", "--", &group])
                .stderr(Stdio::null())
                .status();
            let _ = child.kill();
            let _ = child.wait();
            return Ok(Outcome::TimedOut);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

fn describe(o: &Outcome) -> String {
    match o {
        Outcome::TimedOut => "it timed out".into(),
        Outcome::Exited { code: Some(c), .. } => format!("it exited with status {c}"),
        Outcome::Exited { code: None, .. } => "it was killed by a signal".into(),
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The kind of a `kiln compile` error, independent of the model's file name, node names and
/// sizes: the error text from its first `error:` line with the path, quoted names and numbers
/// blanked. Operator types (`(Conv)`) and the message's wording stay.
pub fn signature(stderr: &str, model: &Path) -> String {
    let from = stderr.find("error:").unwrap_or(0);
    let text = stderr[from..].replace(&model.display().to_string(), "MODEL");
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\'' {
            for q in chars.by_ref() {
                if q == '\'' {
                    break;
                }
            }
            out.push_str("'_'");
        } else if c.is_ascii_digit() {
            while chars.peek().is_some_and(|d| d.is_ascii_digit()) {
                chars.next();
            }
            out.push('N');
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_ignores_names_paths_and_sizes() {
        let a = signature(
            "error: /tmp/a.onnx: 1 unsupported operator: node 'n7': Frob (ai.onnx opset 17)",
            Path::new("/tmp/a.onnx"),
        );
        let b = signature(
            "error: /x/cand.onnx: 1 unsupported operator: node 'Frob_2': Frob (ai.onnx opset 17)",
            Path::new("/x/cand.onnx"),
        );
        assert_eq!(a, b);
        let c = signature(
            "error: /x/cand.onnx: 1 unsupported operator: node 'x': Blur (ai.onnx opset 17)",
            Path::new("/x/cand.onnx"),
        );
        assert_ne!(a, c);
    }
}
