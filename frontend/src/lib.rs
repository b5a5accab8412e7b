//! kiln's model frontends: ONNX import (inline, external-data and safetensors weights),
//! input-shape binding, and the tensor file formats kiln reads and writes (`.npy`, `.pb`).

pub mod error;
pub mod files;
pub mod npy;
pub mod onnx;
pub mod shapes;
pub mod weights;

pub use error::{FrontendError, UnsupportedOp};
pub use onnx::import::ImportOptions;
pub use onnx::{load_model, Model};
