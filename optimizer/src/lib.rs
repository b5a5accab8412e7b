//! kiln-optimizer: graph passes and the pass manager that runs them.
//!
//! A pass rewrites a graph (by rebuilding it, `kiln_ir::rewrite`) and says how many rewrites it
//! applied. The manager verifies the graph after every pass, wraps errors with the pass and node
//! name, records per-pass statistics and can print the graph after chosen passes. Pipelines are
//! plain functions per target (`pipelines::cpu`).

pub mod fault;
pub mod passes;
pub mod pipelines;

pub use pipelines::{Layout, PipelineOptions, Precision};

use kiln_ir::{Graph, IrError};
use std::fmt;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// What went wrong in a pass: the pass itself failed, the model uses something the pass cannot
/// handle (a valid model kiln does not compile, e.g. a Loop whose trip count is only known at
/// run time), or the graph it produced does not verify (a compiler bug, never the model's
/// fault).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PassFailure {
    Run,
    Unsupported,
    Verify,
}

#[derive(Debug, thiserror::Error)]
pub struct PassError {
    pub pass: &'static str,
    /// The node the error is about, when the IR error names one.
    pub node: Option<String>,
    pub failure: PassFailure,
    #[source]
    pub source: IrError,
}

impl PassError {
    fn new(pass: &'static str, failure: PassFailure, source: IrError) -> PassError {
        let node = match &source {
            IrError::Node { node, .. } => Some(node.clone()),
            IrError::OverBudget(b) => Some(b.node.clone()),
            _ => None,
        };
        PassError {
            pass,
            node,
            failure,
            source,
        }
    }
}

impl fmt::Display for PassError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The IR error already names the node ("node 'x' (Conv): ..."); say where it happened.
        match self.failure {
            PassFailure::Run => write!(f, "pass '{}': {}", self.pass, self.source),
            // About the model, not the pass: said as codegen says what it cannot compile.
            PassFailure::Unsupported => write!(f, "{}", self.source),
            PassFailure::Verify => write!(
                f,
                "pass '{}' produced an invalid graph (a compiler bug): {}",
                self.pass, self.source
            ),
        }
    }
}

/// What one run of a pass did, beyond the rewrite count: a short human summary such as
/// `folded 12 nodes, removed 3 Identity`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    pub rewrites: usize,
    pub summary: String,
}

pub trait Pass {
    fn name(&self) -> &'static str;
    /// Rewrites `graph`; returns how many rewrites were applied (0: unchanged).
    fn run(&self, graph: &mut Graph) -> Result<usize, IrError>;
    /// Like [`Pass::run`], with a summary of what was rewritten. Passes that can say more than
    /// a count override this (and implement `run` through it).
    fn run_with_report(&self, graph: &mut Graph) -> Result<PassReport, IrError> {
        let rewrites = self.run(graph)?;
        Ok(PassReport {
            rewrites,
            summary: if rewrites == 0 {
                "unchanged".to_string()
            } else {
                format!("{rewrites} rewrites")
            },
        })
    }
    /// Whether the pass's errors that name a node (`IrError::Node`) mean the model uses
    /// something kiln cannot compile ([`PassFailure::Unsupported`]) rather than a failure of
    /// the pass. Other errors are always [`PassFailure::Run`].
    fn node_errors_are_unsupported(&self) -> bool {
        false
    }
}

/// What one pass did.
#[derive(Clone, Debug)]
pub struct PassStats {
    pub pass: &'static str,
    pub nodes_before: usize,
    pub nodes_after: usize,
    pub rewrites: usize,
    /// What was rewritten, e.g. `folded 12 nodes, removed 3 Identity`.
    pub summary: String,
    /// The pass and the verification of its result.
    pub time: Duration,
}

impl fmt::Display for PassStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} → {} nodes, {} rewrites ({}), {:.1} ms",
            self.pass,
            self.nodes_before,
            self.nodes_after,
            self.rewrites,
            self.summary,
            self.time.as_secs_f64() * 1e3
        )
    }
}

/// Where `--print-after` writes a graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrintTarget {
    Stderr,
    File(PathBuf),
}

/// Which passes to print after: a pass name or `all`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrintAfter {
    pub pass: String,
    pub target: PrintTarget,
}

/// `--print-after` value: `PASS`, `PASS=FILE`, `all` or `all=FILE`.
impl std::str::FromStr for PrintAfter {
    type Err = String;
    fn from_str(s: &str) -> Result<PrintAfter, String> {
        let (pass, target) = match s.split_once('=') {
            Some((p, f)) if !f.is_empty() => (p, PrintTarget::File(PathBuf::from(f))),
            Some(_) => return Err(format!("'{s}': expected PASS or PASS=FILE")),
            None => (s, PrintTarget::Stderr),
        };
        if pass.is_empty() {
            return Err(format!("'{s}': expected PASS or PASS=FILE"));
        }
        Ok(PrintAfter {
            pass: pass.to_string(),
            target,
        })
    }
}

/// Name accepted by `--print-after` for every pass.
pub const ALL_PASSES: &str = "all";

#[derive(Default)]
pub struct PassManager {
    passes: Vec<Box<dyn Pass>>,
    disabled: Vec<String>,
    print_after: Vec<PrintAfter>,
}

impl PassManager {
    pub fn new() -> PassManager {
        PassManager::default()
    }

    pub fn with(mut self, pass: impl Pass + 'static) -> PassManager {
        self.passes.push(Box::new(pass));
        self
    }

    /// Skips the pass with this name.
    pub fn disable(&mut self, name: &str) {
        self.disabled.push(name.to_string());
    }

    pub fn is_disabled(&self, name: &str) -> bool {
        self.disabled.iter().any(|d| d == name)
    }

    pub fn pass_names(&self) -> Vec<&'static str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    /// Fails, listing the valid names, unless `name` is a pass of this pipeline.
    pub fn check_pass_name(&self, name: &str) -> Result<(), String> {
        if self.passes.iter().any(|p| p.name() == name) {
            Ok(())
        } else {
            Err(format!(
                "no such pass '{name}' (passes: {})",
                self.pass_names().join(", ")
            ))
        }
    }

    /// Prints the graph after a pass (or after every pass for `all`). The name must be a pass
    /// of this pipeline or `all`.
    pub fn print_after(&mut self, spec: PrintAfter) -> Result<(), String> {
        if spec.pass != ALL_PASSES {
            self.check_pass_name(&spec.pass)
                .map_err(|e| format!("{e}; or '{ALL_PASSES}'"))?;
        }
        // A file named for several passes collects them all, in order; start it empty.
        if let PrintTarget::File(path) = &spec.target {
            std::fs::write(path, "").map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
        self.print_after.push(spec);
        Ok(())
    }

    /// Runs every enabled pass in order, verifying the graph after each.
    pub fn run(&self, graph: &mut Graph) -> Result<Vec<PassStats>, PassError> {
        self.run_observed(graph, |_, _| {})
    }

    /// Like [`PassManager::run`], calling `after(pass, graph)` after each enabled pass (to
    /// check the passes one by one).
    pub fn run_observed(
        &self,
        graph: &mut Graph,
        mut after: impl FnMut(&'static str, &Graph),
    ) -> Result<Vec<PassStats>, PassError> {
        let mut stats = vec![];
        for p in &self.passes {
            let disabled = self.is_disabled(p.name());
            let before = graph.len();
            let start = Instant::now();
            let report = if disabled {
                PassReport {
                    rewrites: 0,
                    summary: "disabled".to_string(),
                }
            } else {
                let before = fault::requested_for(p.name()).then(|| graph.clone());
                let report = p.run_with_report(graph).map_err(|e| {
                    let failure = match e {
                        IrError::Node { .. } if p.node_errors_are_unsupported() => PassFailure::Unsupported,
                        _ => PassFailure::Run,
                    };
                    PassError::new(p.name(), failure, e)
                })?;
                if let Some(before) = before {
                    inject_fault(p.name(), &before, graph)?;
                }
                kiln_ir::verify(graph).map_err(|e| PassError::new(p.name(), PassFailure::Verify, e))?;
                after(p.name(), graph);
                report
            };
            let st = PassStats {
                pass: p.name(),
                nodes_before: before,
                nodes_after: graph.len(),
                rewrites: report.rewrites,
                summary: report.summary,
                time: start.elapsed(),
            };
            self.print(graph, &st);
            if !disabled {
                stats.push(st);
            }
        }
        Ok(stats)
    }

    fn print(&self, graph: &Graph, stats: &PassStats) {
        let mut text: Option<String> = None;
        for spec in &self.print_after {
            if spec.pass != ALL_PASSES && spec.pass != stats.pass {
                continue;
            }
            let text = text.get_or_insert_with(|| format!("# after {stats}\n{graph}"));
            // Printing is a debugging aid: a write failure must not fail the compilation, but
            // it is reported.
            let res = match &spec.target {
                PrintTarget::Stderr => std::io::stderr().write_all(text.as_bytes()),
                PrintTarget::File(path) => std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(path)
                    .and_then(|mut f| f.write_all(text.as_bytes())),
            };
            if let Err(e) = res {
                eprintln!("warning: --print-after {}: {e}", spec.pass);
            }
        }
    }
}

/// Applies `KILN_INJECT_FAULT` after `pass`, loudly: a wrong result must never look genuine.
fn inject_fault(pass: &'static str, before: &Graph, graph: &mut Graph) -> Result<(), PassError> {
    let env = fault::ENV;
    match fault::inject(before, graph).map_err(|e| PassError::new(pass, PassFailure::Run, e))? {
        Some(f) => eprintln!(
            "warning: {env}={pass}: injected a fault after pass '{pass}' into node '{}' ({}): {}",
            f.node, f.op, f.how
        ),
        None => eprintln!("warning: {env}={pass}: pass '{pass}' created or changed no node that can be perturbed; no fault injected"),
    }
    Ok(())
}

/// The CPU pipeline with default options.
pub fn cpu_pipeline() -> PassManager {
    pipelines::cpu(&PipelineOptions::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{DType, Op, TensorType, Unary};

    struct Breaks;
    impl Pass for Breaks {
        fn name(&self) -> &'static str {
            "breaks"
        }
        fn run(&self, _: &mut Graph) -> Result<usize, IrError> {
            Err(IrError::node("relu_7", "Relu", "something is off"))
        }
    }

    fn tiny() -> Graph {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[2]));
        let y = g
            .add("relu_7", Op::Unary(Unary::Relu), vec![Some(x)], "y")
            .unwrap();
        g.add_output("y", y);
        g
    }

    #[test]
    fn errors_name_the_pass_and_the_node() {
        let pm = PassManager::new().with(Breaks);
        let err = pm.run(&mut tiny()).unwrap_err();
        assert_eq!(err.pass, "breaks");
        assert_eq!(err.node.as_deref(), Some("relu_7"));
        let msg = err.to_string();
        assert!(msg.contains("pass 'breaks'") && msg.contains("relu_7"), "{msg}");
    }

    #[test]
    fn unknown_pass_names_list_the_valid_ones() {
        let mut pm = cpu_pipeline();
        let err = pm.print_after("nope".parse().unwrap()).unwrap_err();
        assert!(
            err.contains("nope") && err.contains("freeze") && err.contains("all"),
            "{err}"
        );
        assert!(pm.print_after("all".parse().unwrap()).is_ok());
        assert!(pm.print_after("freeze".parse().unwrap()).is_ok());
        assert!("x=".parse::<PrintAfter>().is_err());
    }

    #[test]
    fn print_after_writes_the_graph_to_a_file() {
        let path = std::env::temp_dir().join(format!("kiln-print-after-{}.txt", std::process::id()));
        let mut pm = cpu_pipeline();
        pm.print_after(format!("freeze={}", path.display()).parse().unwrap())
            .unwrap();
        let mut g = tiny();
        let stats = pm.run(&mut g).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(text.starts_with("# after freeze:"), "{text}");
        assert!(text.contains(&g.to_string()), "{text}");
        assert_eq!(stats.len(), pm.pass_names().len());
        let freeze = stats.iter().find(|s| s.pass == "freeze").unwrap();
        assert_eq!(freeze.nodes_before, 2);
    }
}
