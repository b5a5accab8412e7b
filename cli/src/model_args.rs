//! Options shared by every command that loads a model.

use anyhow::Result;
use kiln_driver::ModelSource;
use kiln_frontend::{ImportOptions, Model};
use std::path::PathBuf;

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
    /// The driver's description of the model and what binds into it.
    pub fn source(&self) -> ModelSource {
        ModelSource {
            path: self.model.clone(),
            weights: self.weights.clone(),
            input_shapes: self.input_shapes.clone(),
            bind: self.bind.clone(),
            max_memory: self.max_memory,
        }
    }

    pub fn import_options(&self) -> Result<ImportOptions> {
        self.source().import_options()
    }

    pub fn load(&self) -> Result<Model> {
        self.source().load()
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
