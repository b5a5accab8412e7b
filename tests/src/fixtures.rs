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
}
