//! kiln-optimizer: graph passes and the pass manager that runs them.
//!
//! A pass rewrites a graph (by rebuilding it, `kiln_ir::rewrite`) and says whether it changed
//! anything. The manager verifies the graph after every pass and wraps errors with the pass
//! name. Pipelines are plain functions per target.

pub mod passes;
pub mod pipelines;

pub use pipelines::{Layout, PipelineOptions, Precision};

use kiln_ir::{Graph, IrError};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
#[error("pass '{pass}': {source}")]
pub struct PassError {
    pub pass: &'static str,
    #[source]
    pub source: IrError,
}

pub trait Pass {
    fn name(&self) -> &'static str;
    /// Rewrites `graph`; returns how many rewrites were applied (0: unchanged).
    fn run(&self, graph: &mut Graph) -> Result<usize, IrError>;
}

/// What one pass did.
#[derive(Clone, Debug)]
pub struct PassStats {
    pub pass: &'static str,
    pub nodes_before: usize,
    pub nodes_after: usize,
    pub rewrites: usize,
    pub time: Duration,
}

#[derive(Default)]
pub struct PassManager {
    passes: Vec<Box<dyn Pass>>,
    disabled: Vec<String>,
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

    pub fn pass_names(&self) -> Vec<&'static str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    /// Runs every enabled pass in order, verifying the graph after each.
    pub fn run(&self, graph: &mut Graph) -> Result<Vec<PassStats>, PassError> {
        let mut stats = vec![];
        for p in &self.passes {
            if self.disabled.iter().any(|d| d == p.name()) {
                continue;
            }
            let before = graph.len();
            let start = Instant::now();
            let rewrites = p.run(graph).map_err(|source| PassError {
                pass: p.name(),
                source,
            })?;
            kiln_ir::verify(graph).map_err(|source| PassError {
                pass: p.name(),
                source,
            })?;
            stats.push(PassStats {
                pass: p.name(),
                nodes_before: before,
                nodes_after: graph.len(),
                rewrites,
                time: start.elapsed(),
            });
        }
        Ok(stats)
    }
}

/// The CPU pipeline with default options.
pub fn cpu_pipeline() -> PassManager {
    pipelines::cpu(&PipelineOptions::default())
}
