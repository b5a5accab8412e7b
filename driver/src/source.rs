//! Where a model comes from: the model file and what binds its inputs and initializers.

use anyhow::{Context, Result};
use kiln_frontend::shapes::{batch_range, parse_input_shape, BatchRange, InputShape};
use kiln_frontend::{weights::read_safetensors, ImportOptions, Model};
use kiln_ir::Tensor;
use std::path::{Path, PathBuf};

/// A model file and what the import binds into it (`kiln <command> MODEL --weights ... --bind
/// ... --input-shape ... --max-memory ...`).
#[derive(Clone, Debug, Default)]
pub struct ModelSource {
    /// The model file (.onnx). External data files are read from its folder.
    pub path: PathBuf,
    /// Safetensors files whose tensors are bound to initializers or inputs by name.
    pub weights: Vec<PathBuf>,
    /// Input shapes, `NAME=D0,D1,...` (binding symbolic dims); the first dim may be a batch
    /// range `LO..HI`.
    pub input_shapes: Vec<String>,
    /// Inputs frozen to a value known at compile time, `NAME=FILE` (.npy or .pb).
    pub bind: Vec<String>,
    /// Memory the reference interpreter may use (reference runs, constant folding).
    pub max_memory: Option<u64>,
}

impl ModelSource {
    pub fn new(path: impl Into<PathBuf>) -> ModelSource {
        ModelSource {
            path: path.into(),
            ..ModelSource::default()
        }
    }

    fn parsed_shapes(&self) -> Result<Vec<InputShape>> {
        Ok(self
            .input_shapes
            .iter()
            .map(|s| parse_input_shape(s))
            .collect::<std::result::Result<_, _>>()?)
    }

    /// The batch range the input shapes give (`x=1..8,...`), if any.
    pub fn batch_range(&self) -> Result<Option<BatchRange>> {
        Ok(batch_range(&self.parsed_shapes()?)?)
    }

    /// The frontend's options: shapes parsed, weight and bind files read. Sets the
    /// interpreter's memory budget when `max_memory` is given (every command that loads a
    /// model may evaluate it). A batch range is bound to 1: the per-sample graph.
    pub fn import_options(&self) -> Result<ImportOptions> {
        self.import_options_at(1)
    }

    /// [`Self::import_options`] with a batch range's axis bound to `batch`.
    pub fn import_options_at(&self, batch: usize) -> Result<ImportOptions> {
        if let Some(bytes) = self.max_memory {
            kiln_ir::budget::set_memory_budget(bytes);
        }
        let mut opts = ImportOptions::default();
        for s in self.parsed_shapes()? {
            if s.batch.is_some() {
                opts.batch_inputs.push(s.name.clone());
            }
            opts.input_shapes.push(s.at_batch(batch));
        }
        for w in &self.weights {
            opts.weights.extend(read_safetensors(w)?);
        }
        for spec in &self.bind {
            let (name, file) = spec
                .split_once('=')
                .with_context(|| format!("--bind '{spec}': expected NAME=FILE"))?;
            let t = read_tensor_file(Path::new(file)).with_context(|| format!("--bind {name}: {file}"))?;
            opts.weights.push((name.to_string(), t));
        }
        Ok(opts)
    }

    /// Every file the import reads: the model, the weights and bind files.
    pub fn files_read(&self) -> Vec<&Path> {
        let mut files = vec![self.path.as_path()];
        files.extend(self.weights.iter().map(PathBuf::as_path));
        files.extend(
            self.bind
                .iter()
                .filter_map(|b| b.split_once('=').map(|(_, f)| Path::new(f))),
        );
        files
    }

    /// Imports the model (errors name the model file); with a batch range, its per-sample
    /// graph (the batch bound to 1).
    pub fn load(&self) -> Result<Model> {
        self.load_at(1)
    }

    /// Imports the model with a batch range's axis bound to `batch`.
    pub fn load_at(&self, batch: usize) -> Result<Model> {
        self.load_with(self.import_options_at(batch)?)
    }

    /// [`Self::load_at`] sharing the initializers of `earlier`, this model imported before
    /// (at another batch): its weights are not decoded, nor held, a second time.
    pub fn load_at_sharing(&self, batch: usize, earlier: &kiln_ir::Graph) -> Result<Model> {
        let mut opts = self.import_options_at(batch)?;
        opts.shared_initializers = kiln_frontend::onnx::import::leading_constants(earlier);
        self.load_with(opts)
    }

    fn load_with(&self, opts: ImportOptions) -> Result<Model> {
        kiln_frontend::load_model(&self.path, &opts)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("{}", self.path.display()))
    }

    /// The model's name when none is given: the file's stem, or for a file called
    /// `model.onnx` its folder's name.
    pub fn default_name(&self) -> String {
        let stem = self
            .path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".to_string());
        if stem != "model" {
            return stem;
        }
        self.path
            .canonicalize()
            .ok()
            .and_then(|p| {
                p.parent()
                    .and_then(|d| d.file_name())
                    .map(|d| d.to_string_lossy().into_owned())
            })
            .unwrap_or(stem)
    }
}

/// Reads a `.npy` file, or a `.pb` serialized ONNX `TensorProto`.
pub fn read_tensor_file(path: &Path) -> Result<Tensor> {
    let is_pb = path.extension().is_some_and(|e| e == "pb");
    if is_pb {
        Ok(kiln_frontend::onnx::read_tensor_pb(path)?.1)
    } else {
        Ok(kiln_frontend::npy::read_npy(path)?)
    }
}
