//! `kiln minify`: reduce a model that makes a check fail to a small model that still does.
//!
//! Delta debugging over the ONNX graph. Every candidate is a complete, valid ONNX model: the
//! nodes kept, the values they read but do not produce as graph inputs (typed by kiln's
//! importer) or initializers, the values they produce but do not read as graph outputs. The
//! search cuts the graph at a value (everything downstream, then everything upstream), runs
//! ddmin over the remaining nodes, and finally replaces large constants by inputs or by zeros
//! or ones.

mod candidate;
mod check;

use crate::exit::{Exit, Failure};
use crate::model_args::ModelArgs;
use anyhow::{Context, Result};
use candidate::{Base, Shrink};
use check::{Check, Checker};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Initializers with fewer elements are left as they are: they are readable already, and shape
/// operands among them rarely survive becoming inputs.
const SHRINK_MIN_ELEMENTS: u64 = 16;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,

    /// What "still fails" means: `compile` (kiln compile fails with the same exit status and the
    /// same kind of error as on the original), `verify` (kiln verify exits 1), or a shell
    /// command run with `sh -c`, the candidate model's path substituted for `{}` (appended if
    /// there is no `{}`), that fails when it exits non-zero. The original model must fail.
    #[arg(long, value_name = "CMD|compile|verify")]
    pub check: String,

    /// With a shell command: the candidate fails only when the command exits with exactly
    /// this status.
    #[arg(long, value_name = "N")]
    pub expect_exit: Option<i32>,

    /// Where to write the reduced model (default: MODEL.min.onnx next to the input).
    #[arg(long, short = 'o', value_name = "OUT.onnx")]
    pub output: Option<PathBuf>,

    /// Seconds one check may run; a check that runs longer counts as not failing.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    pub timeout: f64,

    /// Stop after this many checks and write the smallest failing model found so far.
    #[arg(long, value_name = "N")]
    pub max_checks: Option<usize>,

    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,

    /// Also write the JSON result to a file (schema kiln.minify/1, docs/report.md).
    #[arg(long, value_name = "FILE.json")]
    pub report: Option<PathBuf>,

    /// Print no progress, only the summary (and errors).
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

#[derive(Serialize)]
struct Summary {
    schema: &'static str,
    kiln_version: &'static str,
    model: String,
    output: String,
    nodes_before: usize,
    nodes_after: usize,
    /// Operator types of the reduced model, with counts.
    ops: BTreeMap<String, usize>,
    /// Initializers turned into inputs or replaced by zeros/ones.
    constants_shrunk: BTreeMap<String, String>,
    checks: usize,
    timeouts: usize,
    /// `--max-checks` ended the search before it was done.
    stopped_early: bool,
    seconds: f64,
}

pub fn run(args: Args) -> Result<()> {
    let start = Instant::now();
    let usage = |msg: String| anyhow::Error::new(Failure::new(Exit::Usage, msg));
    let timeout = match Duration::try_from_secs_f64(args.timeout) {
        Ok(t) if !t.is_zero() => t,
        _ => {
            return Err(usage(format!(
                "--timeout must be a positive number of seconds, not {}",
                args.timeout
            )))
        }
    };
    let check = match args.check.as_str() {
        "compile" | "verify" if args.expect_exit.is_some() => {
            return Err(usage(
                "--expect-exit applies to a shell command check only".into(),
            ))
        }
        "compile" => Check::Compile,
        "verify" => Check::Verify,
        "" => return Err(usage("--check needs a command, `compile` or `verify`".into())),
        cmd => Check::Shell {
            cmd: cmd.to_string(),
            expect: args.expect_exit,
        },
    };
    let opts = args.model.import_options()?;
    let base = Base::load(&args.model.model, &opts)?;
    let work = tempfile::Builder::new()
        .prefix("kiln-minify")
        .tempdir()
        .context("cannot create a temporary folder")?;
    let checker = Checker::new(check, timeout, work.path().to_path_buf());
    let mut m = Minifier {
        base: &base,
        checker,
        candidate: work.path().join("candidate.onnx"),
        memo: HashMap::new(),
        checks: 0,
        timeouts: 0,
        max_checks: args.max_checks,
        stopped: false,
        quiet: args.quiet,
    };

    if let Some(why) = m.checker.check_original(&args.model)? {
        return Err(usage(format!(
            "{}: the original model does not fail the check ({why}); nothing to minify",
            args.model.model.display()
        )));
    }
    let n = base.num_nodes();
    let all: Vec<usize> = (0..n).collect();
    let mut shrink: BTreeMap<String, Shrink> = BTreeMap::new();
    if !m.test(&all, &shrink)? {
        return Err(anyhow::Error::new(Failure::new(
            Exit::Internal,
            "the model as minify rewrites it (external data and --weights inlined, input shapes \
             bound, metadata, value infos and functions dropped) no longer fails the check",
        )));
    }
    m.progress(&format!("the original fails the check; {n} nodes"));

    let mut keep = all;
    keep = m.cut_downstream(keep, &shrink)?;
    keep = m.cut_upstream(keep, &shrink)?;
    keep = m.ddmin(keep, &shrink)?;
    for name in base.initializers_read(&keep) {
        if base.initializer_len(&name).unwrap_or(0) < SHRINK_MIN_ELEMENTS {
            continue;
        }
        for s in [Shrink::Input, Shrink::Zeros, Shrink::Ones] {
            let mut trial = shrink.clone();
            trial.insert(name.clone(), s);
            if m.test(&keep, &trial)? {
                m.progress(&format!("constant '{name}' → {}", shrink_word(s)));
                shrink = trial;
                break;
            }
        }
    }

    let model = base
        .build(&keep, &shrink)
        .context("internal error: the reduced model cannot be rebuilt")?;
    let out = args
        .output
        .clone()
        .unwrap_or_else(|| default_output(&args.model.model));
    std::fs::write(&out, kiln_frontend::onnx::encode_model(&model)).map_err(|e| {
        Failure::new(
            Exit::CompileFailed,
            format!("cannot write {}: {e}", out.display()),
        )
    })?;

    let mut ops = BTreeMap::new();
    for &i in &keep {
        *ops.entry(base.node(i).op_type.clone()).or_insert(0) += 1;
    }
    let summary = Summary {
        schema: "kiln.minify/1",
        kiln_version: env!("CARGO_PKG_VERSION"),
        model: args.model.model.display().to_string(),
        output: out.display().to_string(),
        nodes_before: n,
        nodes_after: keep.len(),
        ops,
        constants_shrunk: shrink
            .iter()
            .map(|(k, &s)| (k.clone(), shrink_word(s).to_string()))
            .collect(),
        checks: m.checks,
        timeouts: m.timeouts,
        stopped_early: m.stopped,
        seconds: start.elapsed().as_secs_f64(),
    };
    let mut line = format!(
        "minify: {} nodes → {} node{} ({} checks, {:.1} s); wrote {}",
        summary.nodes_before,
        summary.nodes_after,
        if summary.nodes_after == 1 { "" } else { "s" },
        summary.checks,
        summary.seconds,
        summary.output
    );
    if m.timeouts > 0 {
        line.push_str(&format!(
            " ({} check{} timed out after {} s and counted as not failing)",
            m.timeouts,
            if m.timeouts == 1 { "" } else { "s" },
            args.timeout
        ));
    }
    if m.stopped {
        line.push_str(" (stopped at --max-checks; a smaller model may exist)");
    }
    eprintln!("{}", kiln_ir::printable(&line));
    if let Some(path) = &args.report {
        crate::diagnostic::write_json(&summary, path)?;
    }
    if args.json {
        crate::emit(&format!("{}\n", serde_json::to_string_pretty(&summary)?));
    }
    Ok(())
}

fn shrink_word(s: Shrink) -> &'static str {
    match s {
        Shrink::Input => "input",
        Shrink::Zeros => "zeros",
        Shrink::Ones => "ones",
    }
}

/// `dir/model.onnx` → `dir/model.min.onnx`.
fn default_output(model: &Path) -> PathBuf {
    let stem = model
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    model.with_file_name(format!("{stem}.min.onnx"))
}

type Key = (Vec<usize>, Vec<(String, Shrink)>);

struct Minifier<'a> {
    base: &'a Base,
    checker: Checker,
    candidate: PathBuf,
    memo: HashMap<Key, bool>,
    checks: usize,
    timeouts: usize,
    max_checks: Option<usize>,
    stopped: bool,
    quiet: bool,
}

impl Minifier<'_> {
    fn progress(&self, msg: &str) {
        if !self.quiet {
            eprintln!("minify: {} ({} checks)", kiln_ir::printable(msg), self.checks);
        }
    }

    /// Does the model of nodes `keep` still fail? A candidate that is not a valid model, and
    /// every candidate after `--max-checks`, counts as not failing.
    fn test(&mut self, keep: &[usize], shrink: &BTreeMap<String, Shrink>) -> Result<bool> {
        let key: Key = (
            keep.to_vec(),
            shrink.iter().map(|(k, &v)| (k.clone(), v)).collect(),
        );
        if let Some(&r) = self.memo.get(&key) {
            return Ok(r);
        }
        let Some(model) = self.base.build(keep, shrink) else {
            self.memo.insert(key, false);
            return Ok(false);
        };
        if self.max_checks.is_some_and(|max| self.checks >= max) {
            self.stopped = true;
            return Ok(false);
        }
        std::fs::write(&self.candidate, kiln_frontend::onnx::encode_model(&model))
            .with_context(|| format!("cannot write {}", self.candidate.display()))?;
        self.checks += 1;
        let r = match self.checker.still_fails(&self.candidate)? {
            Some(r) => r,
            None => {
                self.timeouts += 1;
                eprintln!(
                    "minify: check {} timed out after {} s; counted as not failing",
                    self.checks,
                    self.checker.timeout.as_secs_f64()
                );
                false
            }
        };
        self.memo.insert(key, r);
        Ok(r)
    }

    /// The shortest prefix (in dependency order) that still fails: the graph cut after some
    /// value, everything downstream dropped. Binary search; only failing prefixes are kept.
    fn cut_downstream(&mut self, keep: Vec<usize>, shrink: &BTreeMap<String, Shrink>) -> Result<Vec<usize>> {
        let (mut lo, mut hi) = (0, keep.len());
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.test(&keep[..mid], shrink)? {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        if hi < keep.len() {
            self.progress(&format!("cut downstream: {hi} node(s) left"));
        }
        Ok(keep[..hi].to_vec())
    }

    /// The shortest suffix that still fails: everything upstream of a cut made graph inputs.
    fn cut_upstream(&mut self, keep: Vec<usize>, shrink: &BTreeMap<String, Shrink>) -> Result<Vec<usize>> {
        let (mut lo, mut hi) = (0, keep.len());
        // Invariant: keep[lo..] fails, keep[hi..] is not known to.
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.test(&keep[mid..], shrink)? {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        if lo > 0 {
            self.progress(&format!("cut upstream: {} node(s) left", keep.len() - lo));
        }
        Ok(keep[lo..].to_vec())
    }

    /// Zeller's ddmin over node sets: ends with a set from which no single node can be removed.
    fn ddmin(&mut self, mut c: Vec<usize>, shrink: &BTreeMap<String, Shrink>) -> Result<Vec<usize>> {
        let mut n = 2usize;
        while c.len() >= 2 && !self.stopped {
            let chunks: Vec<Vec<usize>> = split(&c, n);
            let mut reduced = false;
            for chunk in &chunks {
                if self.test(chunk, shrink)? {
                    c = chunk.clone();
                    n = 2;
                    reduced = true;
                    break;
                }
            }
            if !reduced && chunks.len() > 2 {
                for i in 0..chunks.len() {
                    let complement: Vec<usize> = chunks
                        .iter()
                        .enumerate()
                        .filter(|&(j, _)| j != i)
                        .flat_map(|(_, ch)| ch.iter().copied())
                        .collect();
                    if self.test(&complement, shrink)? {
                        c = complement;
                        n = (n - 1).max(2);
                        reduced = true;
                        break;
                    }
                }
            }
            if reduced {
                self.progress(&format!("ddmin: {} node(s) left", c.len()));
            } else {
                if n >= c.len() {
                    break;
                }
                n = (2 * n).min(c.len());
            }
        }
        Ok(c)
    }
}

/// `c` in `n` contiguous, nearly equal parts.
fn split(c: &[usize], n: usize) -> Vec<Vec<usize>> {
    let n = n.min(c.len()).max(1);
    (0..n)
        .map(|i| c[i * c.len() / n..(i + 1) * c.len() / n].to_vec())
        .filter(|ch| !ch.is_empty())
        .collect()
}
