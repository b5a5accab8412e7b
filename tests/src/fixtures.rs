//! The fixture models of `fixtures/manifest.json`: small models with inputs and expected
//! outputs recorded from onnxruntime by `fixtures/generate.py`.

use anyhow::{Context, Result};
use kiln_frontend::ImportOptions;
use kiln_ir::Tensor;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Deserialize)]
pub struct Fixture {
    pub name: String,
    /// Paths are relative to `fixtures/`.
    pub model: PathBuf,
    pub inputs: BTreeMap<String, PathBuf>,
    pub outputs: BTreeMap<String, PathBuf>,
    #[serde(default)]
    pub weights: Option<PathBuf>,
    #[serde(default)]
    pub input_shapes: BTreeMap<String, Vec<usize>>,
    #[serde(default)]
    pub family: String,
}

pub fn fixtures_dir() -> PathBuf {
    crate::repo_root().join("fixtures")
}

pub fn load_manifest() -> Result<Vec<Fixture>> {
    let path = fixtures_dir().join("manifest.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is malformed", path.display()))
}

impl Fixture {
    pub fn path(&self, rel: &Path) -> PathBuf {
        fixtures_dir().join(rel)
    }

    /// Import options: bound weights and input shapes from the manifest.
    pub fn import_options(&self) -> Result<ImportOptions> {
        let mut opts = ImportOptions::default();
        if let Some(w) = &self.weights {
            opts.weights = kiln_frontend::weights::read_safetensors(&self.path(w))?;
        }
        opts.input_shapes = self
            .input_shapes
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Ok(opts)
    }

    pub fn load(&self) -> Result<kiln_frontend::Model> {
        Ok(kiln_frontend::load_model(
            &self.path(&self.model),
            &self.import_options()?,
        )?)
    }

    pub fn read_inputs(&self) -> Result<HashMap<String, Tensor>> {
        self.inputs
            .iter()
            .map(|(name, p)| Ok((name.clone(), kiln_frontend::npy::read_npy(&self.path(p))?)))
            .collect()
    }

    pub fn read_expected(&self) -> Result<BTreeMap<String, Tensor>> {
        self.outputs
            .iter()
            .map(|(name, p)| Ok((name.clone(), kiln_frontend::npy::read_npy(&self.path(p))?)))
            .collect()
    }

    /// The model as the compiled suites compile it and the inputs to run it with: small
    /// shape-determining inputs bound as constants (see
    /// [`bind_shape_inputs`](crate::compiled::bind_shape_inputs)), the rest in graph order.
    pub fn prepared(&self) -> Result<(kiln_ir::Graph, crate::compiled::NamedTensors)> {
        let model = self.load()?;
        let mut inputs = self.read_inputs()?;
        let ordered = model
            .graph
            .input_types()
            .map(|(n, _)| {
                let t = inputs
                    .remove(n)
                    .ok_or_else(|| anyhow::anyhow!("no input file for '{n}'"))?;
                Ok((n.to_string(), t))
            })
            .collect::<Result<Vec<_>>>()?;
        let (bound, runtime) = crate::compiled::bind_shape_inputs(
            &self.path(&self.model),
            &self.import_options()?,
            &model,
            ordered,
        )
        .map_err(anyhow::Error::msg)?;
        Ok((bound.unwrap_or(model).graph, runtime))
    }

    /// Checks `actual` (in graph output order) against the recorded outputs.
    pub fn check_outputs(&self, graph: &kiln_ir::Graph, actual: &[Tensor]) -> Result<()> {
        let expected = self.read_expected()?;
        anyhow::ensure!(
            actual.len() == graph.outputs().len(),
            "{} outputs expected, got {}",
            graph.outputs().len(),
            actual.len()
        );
        for (out, actual) in graph.outputs().iter().zip(actual) {
            let want = expected
                .get(&out.name)
                .ok_or_else(|| anyhow::anyhow!("no expected value for output '{}'", out.name))?;
            crate::compare::compare(want, actual)
                .map_err(|e| anyhow::anyhow!("output '{}': {e}", out.name))?;
        }
        Ok(())
    }

    /// The manifest's fixtures whose name contains `$KILN_FIXTURE_FILTER` (all without it).
    pub fn filtered(all: &[Fixture]) -> Vec<&Fixture> {
        let filter = std::env::var("KILN_FIXTURE_FILTER").ok();
        all.iter()
            .filter(|f| {
                filter
                    .as_ref()
                    .is_none_or(|s| s.split(',').any(|p| f.name.contains(p)))
            })
            .collect()
    }
}

/// Runs `check` on every fixture of `all` that `$KILN_FIXTURE_FILTER` selects, on `threads`
/// threads, printing `ok   NAME[: what it said]` or `FAIL NAME: why` for each, then
/// `WHAT: P passed, F failed`; panics naming the failures if any failed.
pub fn check_fixtures(
    all: &[Fixture],
    what: &str,
    threads: usize,
    check: impl Fn(&Fixture) -> std::result::Result<String, String> + Sync,
) {
    assert!(!all.is_empty(), "no fixtures in the manifest");
    let fixtures = Fixture::filtered(all);
    let results = crate::cuda::run_parallel(&fixtures, threads, |f| {
        let r = check(f);
        match &r {
            Ok(said) if said.is_empty() => println!("ok   {}", f.name),
            Ok(said) => println!("ok   {}: {said}", f.name),
            Err(e) => println!("FAIL {}: {e}", f.name),
        }
        r
    });
    let failed: Vec<&str> = fixtures
        .iter()
        .zip(&results)
        .filter(|(_, r)| r.is_err())
        .map(|(f, _)| f.name.as_str())
        .collect();
    println!(
        "{what}: {} passed, {} failed",
        fixtures.len() - failed.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "{what} failing: {}", failed.join(", "));
}

/// The threads a fixture suite checks fixtures on: one per core.
pub fn suite_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}
