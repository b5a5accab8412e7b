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

    /// Memory the reference interpreter may use (reference runs, verify, constant folding),
    /// e.g. 8G, 512M, 1073741824. Work that needs more stops with exit status 4, naming the
    /// node. Default: three quarters of physical memory.
    #[arg(long = "max-memory", value_name = "SIZE", value_parser = parse_size)]
    pub max_memory: Option<u64>,
}

/// A byte count with an optional binary suffix: `1024`, `64K`, `512M`, `8G`, `1T` (`KiB`,
/// `MB`, ... are read the same way: powers of 1024).
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let shift = match unit
        .trim()
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(format!("'{s}': expected a size such as 512M or 8G")),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("'{s}': expected a size such as 512M or 8G"))?;
    let bytes = n * (1u64 << shift) as f64;
    if !(1.0..=u64::MAX as f64).contains(&bytes) {
        return Err(format!("'{s}': the size must be at least one byte"));
    }
    Ok(bytes as u64)
}

impl ModelArgs {
    pub fn import_options(&self) -> Result<ImportOptions> {
        // Every command that loads a model may evaluate it (folding, reference runs).
        if let Some(bytes) = self.max_memory {
            kiln_ir::budget::set_memory_budget(bytes);
        }
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

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1024"), Ok(1024));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("8G"), Ok(8 << 30));
        assert_eq!(parse_size("8GiB"), Ok(8 << 30));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("8X").is_err());
    }
}
