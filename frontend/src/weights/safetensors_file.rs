//! Reading `.safetensors` files.

use crate::error::{FrontendError, Result};
use kiln_ir::{DType, Tensor};
use safetensors::{Dtype, SafeTensors};
use std::path::Path;

fn dtype_from_safetensors(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::BOOL => DType::Bool,
        Dtype::U8 => DType::U8,
        Dtype::I8 => DType::I8,
        Dtype::U16 => DType::U16,
        Dtype::I16 => DType::I16,
        Dtype::U32 => DType::U32,
        Dtype::I32 => DType::I32,
        Dtype::U64 => DType::U64,
        Dtype::I64 => DType::I64,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        _ => return None,
    })
}

/// All tensors of a safetensors file, by name (sorted by name).
pub fn read_safetensors(path: &Path) -> Result<Vec<(String, Tensor)>> {
    let file = crate::files::open_regular(path).map_err(|source| FrontendError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    // SAFETY: read-only map of a file kiln does not modify.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| FrontendError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let st = SafeTensors::deserialize(&map).map_err(|e| {
        FrontendError::Weights(format!("{} is not a valid safetensors file: {e}", path.display()))
    })?;
    let mut out = vec![];
    for (name, view) in st.tensors() {
        let dtype = dtype_from_safetensors(view.dtype()).ok_or_else(|| {
            FrontendError::Weights(format!(
                "tensor '{name}' in {} has unsupported dtype {:?}",
                path.display(),
                view.dtype()
            ))
        })?;
        let t = Tensor::from_le_bytes(dtype, view.shape().to_vec(), view.data())
            .map_err(|e| FrontendError::Weights(format!("tensor '{name}' in {}: {e}", path.display())))?;
        crate::files::release_mapped(&map, view.data());
        out.push((name, t));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}
