//! Options shared by every command that loads a model.

use anyhow::{Context, Result};
use kiln_frontend::{shapes::parse_input_shape, weights::read_safetensors, ImportOptions, Model};
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// The model file (.onnx). External data files are read from its folder.
    pub model: PathBuf,

    /// Bind tensors of a .safetensors file to the model's initializers or inputs by name.
    /// May be given several times.
    #[arg(long = "weights", value_name = "FILE.safetensors")]
    pub weights: Vec<PathBuf>,

    /// Fix an input's shape, binding its symbolic dims (e.g. batch): NAME=D0,D1,...
    /// May be given several times.
    #[arg(long = "input-shape", value_name = "NAME=DIMS")]
    pub input_shapes: Vec<String>,

    /// Freeze a graph input to a value known at compile time: NAME=FILE (.npy or .pb). An
    /// input that decides a shape (a Reshape's target, a Resize's sizes) must be bound.
    /// May be given several times.
    #[arg(long = "bind", value_name = "NAME=FILE")]
    pub bind: Vec<String>,
}

impl ModelArgs {
    pub fn import_options(&self) -> Result<ImportOptions> {
        let mut opts = ImportOptions::default();
        for s in &self.input_shapes {
            opts.input_shapes.push(parse_input_shape(s)?);
        }
        for w in &self.weights {
            opts.weights.extend(read_safetensors(w)?);
        }
        for spec in &self.bind {
            let (name, file) = spec
                .split_once('=')
                .with_context(|| format!("--bind '{spec}': expected NAME=FILE"))?;
            let t = crate::tensors::read_tensor_file(Path::new(file))
                .with_context(|| format!("--bind {name}: {file}"))?;
            opts.weights.push((name.to_string(), t));
        }
        Ok(opts)
    }

    /// Every file these options make kiln read: the model, `--weights` and `--bind` files.
    pub fn files_read(&self) -> Vec<&Path> {
        let mut files = vec![self.model.as_path()];
        files.extend(self.weights.iter().map(PathBuf::as_path));
        files.extend(
            self.bind
                .iter()
                .filter_map(|b| b.split_once('=').map(|(_, f)| Path::new(f))),
        );
        files
    }

    pub fn load(&self) -> Result<Model> {
        let opts = self.import_options()?;
        kiln_frontend::load_model(&self.model, &opts)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("{}", self.model.display()))
    }
}
