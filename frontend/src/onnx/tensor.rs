//! ONNX tensors and types to kiln's: `TensorProto` → [`Tensor`] (inline or external data),
//! element types, value-info shapes.

use super::proto::{data_type as dt, DimValue, TensorProto, TypeProto, TypeValue};
use crate::error::{FrontendError, Result};
use kiln_ir::{DType, Dim, Element, Tensor, TensorType};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

/// Largest single dimension accepted from a model; anything above is a corrupt or hostile file.
pub const MAX_DIM: i64 = 1 << 40;
/// Largest tensor (in elements) a model may declare.
pub const MAX_ELEMENTS: u128 = 1 << 36;

/// kiln's dtype for an ONNX `TensorProto.DataType`, or a message naming the unsupported type.
pub fn dtype_from_onnx(code: i32) -> Result<DType, String> {
    Ok(match code {
        dt::FLOAT => DType::F32,
        dt::UINT8 => DType::U8,
        dt::INT8 => DType::I8,
        dt::UINT16 => DType::U16,
        dt::INT16 => DType::I16,
        dt::INT32 => DType::I32,
        dt::INT64 => DType::I64,
        dt::BOOL => DType::Bool,
        dt::FLOAT16 => DType::F16,
        dt::DOUBLE => DType::F64,
        dt::UINT32 => DType::U32,
        dt::UINT64 => DType::U64,
        dt::BFLOAT16 => DType::BF16,
        dt::UNDEFINED => return Err("data type is undefined".into()),
        dt::STRING => return Err("string tensors are not supported".into()),
        dt::COMPLEX64 | dt::COMPLEX128 => return Err("complex tensors are not supported".into()),
        17..=20 | 24 => return Err(format!("float8 data type {code} is not supported")),
        21 | 22 => {
            return Err(format!(
                "4-bit integer data type {code} is supported for initializers (weights) only, not for graph inputs, outputs or computed values"
            ))
        }
        25 | 26 => return Err(format!("sub-byte integer data type {code} is not supported")),
        23 | 27 | 28 => return Err(format!("4/6-bit float data type {code} is not supported")),
        _ => return Err(format!("unknown data type {code}")),
    })
}

/// The IR dtype that holds the values of a 4-bit integer initializer (ONNX UINT4 and INT4):
/// one value per byte, u8 or i8. Quantizers write weights this way (blocked DequantizeLinear);
/// the values stay within 4 bits, which `block-quantized-products` relies on to keep them 4-bit.
pub fn nibble_dtype(code: i32) -> Option<DType> {
    match code {
        21 => Some(DType::U8),
        22 => Some(DType::I8),
        _ => None,
    }
}

/// An INT4/UINT4 tensor: two values per byte, the first in the low nibble (raw_data, external
/// data, or one packed byte per `int32_data` entry), unpacked to one per byte.
fn nibble_tensor(
    t: &TensorProto,
    dtype: DType,
    ext: Option<&mut ExternalData>,
    name: &str,
) -> Result<Tensor> {
    let err = |msg: String| FrontendError::Tensor {
        name: name.to_string(),
        msg,
    };
    let shape = checked_dims(&t.dims).map_err(err)?;
    let n: usize = shape.iter().product();
    let want = n.div_ceil(2);
    let unpack = |packed: &[u8]| -> Tensor {
        let nibble = |i: usize| (packed[i / 2] >> (4 * (i % 2))) & 15;
        if dtype == DType::I8 {
            Tensor::from_vec(
                shape.clone(),
                (0..n).map(|i| ((nibble(i) ^ 8) as i8) - 8).collect::<Vec<i8>>(),
            )
        } else {
            Tensor::from_vec(shape.clone(), (0..n).map(nibble).collect::<Vec<u8>>())
        }
    };
    if t.data_location == 1 {
        let ext = ext.ok_or_else(|| err("refers to external data, which is not available here".into()))?;
        return ext.decode(name, t, want, unpack);
    }
    if !t.raw_data.is_empty() || t.int32_data.is_empty() {
        if t.raw_data.len() != want {
            return Err(err(format!(
                "raw_data has {} bytes but its shape {:?} of 4-bit values needs {want}",
                t.raw_data.len(),
                t.dims
            )));
        }
        return Ok(unpack(&t.raw_data));
    }
    if t.int32_data.len() != want || t.int32_data.iter().any(|v| !(0..=255).contains(v)) {
        return Err(err(format!(
            "int32_data must hold {want} packed bytes for its shape {:?}",
            t.dims
        )));
    }
    let packed: Vec<u8> = t.int32_data.iter().map(|&v| v as u8).collect();
    Ok(unpack(&packed))
}

pub fn dtype_to_onnx(d: DType) -> i32 {
    match d {
        DType::F32 => dt::FLOAT,
        DType::U8 => dt::UINT8,
        DType::I8 => dt::INT8,
        DType::U16 => dt::UINT16,
        DType::I16 => dt::INT16,
        DType::I32 => dt::INT32,
        DType::I64 => dt::INT64,
        DType::Bool => dt::BOOL,
        DType::F16 => dt::FLOAT16,
        DType::F64 => dt::DOUBLE,
        DType::U32 => dt::UINT32,
        DType::U64 => dt::UINT64,
        DType::BF16 => dt::BFLOAT16,
    }
}

/// Validates declared dims: none negative, none absurd, total size bounded.
pub fn checked_dims(dims: &[i64]) -> Result<Vec<usize>, String> {
    let mut total: u128 = 1;
    for &d in dims {
        if d < 0 {
            return Err(format!("negative dimension {d} in shape {dims:?}"));
        }
        if d > MAX_DIM {
            return Err(format!("dimension {d} in shape {dims:?} is absurdly large"));
        }
        total = total.saturating_mul(d as u128);
    }
    if total > MAX_ELEMENTS {
        return Err(format!(
            "shape {dims:?} has {total} elements, more than kiln accepts"
        ));
    }
    Ok(dims.iter().map(|&d| d as usize).collect())
}

/// Where external tensor data lives: the model's folder, with each data file mapped once.
pub struct ExternalData {
    base_dir: PathBuf,
    files: HashMap<PathBuf, Arc<memmap2::Mmap>>,
}

impl ExternalData {
    pub fn new(base_dir: PathBuf) -> ExternalData {
        ExternalData {
            base_dir,
            files: HashMap::new(),
        }
    }

    /// Decodes tensor `t`'s `want` bytes of external data with `decode`, then hands their
    /// mapped pages back (`files::release_mapped`): the weights are resident once, not mapped
    /// and decoded side by side.
    fn decode<T>(
        &mut self,
        name: &str,
        t: &TensorProto,
        want: usize,
        decode: impl FnOnce(&[u8]) -> T,
    ) -> Result<T> {
        let (map, offset, length) = self.locate(name, t)?;
        let len = length.unwrap_or(want);
        let end = offset.checked_add(len).filter(|&e| e <= map.len() && len == want);
        let Some(end) = end else {
            return Err(FrontendError::Tensor {
                name: name.to_string(),
                msg: format!(
                    "external data [{offset}, {offset}+{len}) does not hold the {want} bytes of its shape {:?} in the {}-byte file",
                    t.dims,
                    map.len()
                ),
            });
        };
        let decoded = decode(&map[offset..end]);
        crate::files::release_mapped(&map, &map[offset..end]);
        Ok(decoded)
    }

    fn locate(&mut self, name: &str, t: &TensorProto) -> Result<(Arc<memmap2::Mmap>, usize, Option<usize>)> {
        let err = |msg: String| FrontendError::Tensor {
            name: name.to_string(),
            msg,
        };
        let mut location = None;
        let mut offset = 0usize;
        let mut length = None;
        for kv in &t.external_data {
            match kv.key.as_str() {
                "location" => location = Some(kv.value.clone()),
                "offset" => {
                    offset = kv
                        .value
                        .parse()
                        .map_err(|_| err(format!("bad external offset '{}'", kv.value)))?
                }
                "length" => {
                    length = Some(
                        kv.value
                            .parse()
                            .map_err(|_| err(format!("bad external length '{}'", kv.value)))?,
                    )
                }
                _ => {}
            }
        }
        let location = location.ok_or_else(|| err("external data without a location".into()))?;
        // Like onnxruntime, only files inside the model's folder may be read; unlike a check of
        // the text alone, symbolic links are followed before deciding.
        let (path, file) = crate::files::open_inside(&self.base_dir, &location)
            .map_err(|why| err(format!("external data location '{location}' {why}")))?;
        let map = match self.files.get(&path) {
            Some(m) => m.clone(),
            None => {
                // SAFETY: the map is read-only and kiln does not modify the file; a file changed
                // by another process while kiln reads it can give wrong weights, never UB in safe code
                // beyond what reading a changing file gives.
                let map = unsafe { memmap2::Mmap::map(&file) }
                    .map_err(|e| err(format!("cannot map external data {}: {e}", path.display())))?;
                let map = Arc::new(map);
                self.files.insert(path, map.clone());
                map
            }
        };
        Ok((map, offset, length))
    }
}

/// Converts a `TensorProto` (inline typed fields, `raw_data`, or external data) to a tensor.
pub fn tensor_from_proto(t: &TensorProto, ext: Option<&mut ExternalData>) -> Result<Tensor> {
    let name = if t.name.is_empty() { "<unnamed>" } else { &t.name };
    if let Some(dtype) = nibble_dtype(t.data_type) {
        return nibble_tensor(t, dtype, ext, name);
    }
    let err = |msg: String| FrontendError::Tensor {
        name: name.to_string(),
        msg,
    };
    let dtype = dtype_from_onnx(t.data_type).map_err(err)?;
    let shape = checked_dims(&t.dims).map_err(err)?;
    let n: usize = shape.iter().product();
    let mismatch = |got: usize| {
        err(format!(
            "holds {got} elements but its shape {:?} needs {n}",
            t.dims
        ))
    };

    if t.data_location == 1 {
        let ext = ext.ok_or_else(|| err("refers to external data, which is not available here".into()))?;
        let want = n * dtype.size_bytes();
        return ext
            .decode(name, t, want, |bytes| Tensor::from_le_bytes(dtype, shape, bytes))?
            .map_err(|e| err(e.to_string()));
    }
    if !t.raw_data.is_empty() || n == 0 {
        let want = n * dtype.size_bytes();
        if t.raw_data.len() != want && !(n == 0 && t.raw_data.is_empty()) {
            return Err(err(format!(
                "raw_data has {} bytes but its shape {:?} of {dtype} needs {want}",
                t.raw_data.len(),
                t.dims
            )));
        }
        return Tensor::from_le_bytes(dtype, shape, &t.raw_data).map_err(|e| err(e.to_string()));
    }
    fn typed<T: Element, S: Copy>(shape: Vec<usize>, src: &[S], f: impl Fn(S) -> T) -> Tensor {
        Tensor::from_vec(shape, src.iter().map(|&x| f(x)).collect())
    }
    let check = |len: usize| if len == n { Ok(()) } else { Err(mismatch(len)) };
    let tensor = match dtype {
        DType::F32 => {
            check(t.float_data.len())?;
            typed(shape, &t.float_data, |x| x)
        }
        DType::F64 => {
            check(t.double_data.len())?;
            typed(shape, &t.double_data, |x| x)
        }
        DType::I64 => {
            check(t.int64_data.len())?;
            typed(shape, &t.int64_data, |x| x)
        }
        DType::U32 | DType::U64 => {
            check(t.uint64_data.len())?;
            let v = typed(shape, &t.uint64_data, |x| x);
            if dtype == DType::U32 {
                v.cast(DType::U32)
            } else {
                v
            }
        }
        // int32_data carries every narrower type; f16/bf16 as their bit patterns.
        DType::F16 => {
            check(t.int32_data.len())?;
            typed(shape, &t.int32_data, |x| half::f16::from_bits(x as u16))
        }
        DType::BF16 => {
            check(t.int32_data.len())?;
            typed(shape, &t.int32_data, |x| half::bf16::from_bits(x as u16))
        }
        DType::Bool | DType::U8 | DType::I8 | DType::U16 | DType::I16 | DType::I32 => {
            check(t.int32_data.len())?;
            typed(shape, &t.int32_data, |x| x).cast(dtype)
        }
    };
    Ok(tensor)
}

/// Builds a `TensorProto` with `raw_data` (used to write test inputs and reduced models).
pub fn tensor_to_proto(name: &str, t: &Tensor) -> TensorProto {
    TensorProto {
        dims: t.shape().iter().map(|&d| d as i64).collect(),
        data_type: dtype_to_onnx(t.dtype()),
        name: name.to_string(),
        raw_data: t.to_le_bytes().into(),
        ..Default::default()
    }
}

/// The tensor type in a value-info, with unknown dims as `?`. `None` when the type is absent;
/// an error for non-tensor types.
pub fn tensor_type_from_proto(name: &str, tp: Option<&TypeProto>) -> Result<Option<TensorType>> {
    let err = |msg: String| FrontendError::Model(format!("value '{name}': {msg}"));
    let Some(tp) = tp else { return Ok(None) };
    let tt = match &tp.value {
        Some(TypeValue::TensorType(tt)) => tt,
        Some(TypeValue::SequenceType(_)) => return Err(err("sequence types are not supported".into())),
        Some(TypeValue::MapType(_)) => return Err(err("map types are not supported".into())),
        Some(TypeValue::OptionalType(_)) => return Err(err("optional types are not supported".into())),
        Some(TypeValue::SparseTensorType(_)) => return Err(err("sparse tensors are not supported".into())),
        Some(TypeValue::OpaqueType(_)) => return Err(err("opaque types are not supported".into())),
        None => return Ok(None),
    };
    let dtype = dtype_from_onnx(tt.elem_type).map_err(err)?;
    let Some(shape) = &tt.shape else {
        return Err(err(
            "its rank is unknown; kiln needs at least the rank of every input".into(),
        ));
    };
    let mut dims = Vec::with_capacity(shape.dim.len());
    for d in &shape.dim {
        dims.push(match &d.value {
            // Some exporters (PaddlePaddle's) write a dynamic dim as -1; onnxruntime reads it
            // as unknown, and so does kiln (`--input-shape` binds it). Other negatives are
            // garbage.
            Some(DimValue::DimValue(-1)) => Dim::unknown(),
            Some(DimValue::DimValue(v)) => {
                if *v < 0 {
                    return Err(err(format!("negative dimension {v}")));
                }
                if *v > MAX_DIM {
                    return Err(err(format!("dimension {v} is absurdly large")));
                }
                Dim::Fixed(*v as usize)
            }
            Some(DimValue::DimParam(p)) if !p.is_empty() => Dim::Sym(p.clone()),
            _ => Dim::unknown(),
        });
    }
    let ty = TensorType::new(dtype, dims);
    if let Some(fixed) = ty.fixed_shape() {
        let total = fixed.iter().fold(1u128, |a, &d| a.saturating_mul(d as u128));
        if total > MAX_ELEMENTS {
            return Err(err(format!("shape {ty} has more elements than kiln accepts")));
        }
    }
    Ok(Some(ty))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn four_bit(code: i32, dims: Vec<i64>, raw: Vec<u8>, int32: Vec<i32>) -> Result<Tensor> {
        let t = TensorProto {
            dims,
            data_type: code,
            name: "w".into(),
            raw_data: raw.into(),
            int32_data: int32,
            ..Default::default()
        };
        tensor_from_proto(&t, None)
    }

    /// INT4 and UINT4 hold two values per byte, the first in the low nibble; INT4 is signed.
    #[test]
    fn four_bit_integers_unpack_to_one_per_byte() {
        let packed = vec![0x21u8, 0xf8, 0x07];
        let u = four_bit(21, vec![5], packed.clone(), vec![]).unwrap();
        assert_eq!(u.as_slice::<u8>().unwrap(), &[1, 2, 8, 15, 7]);
        let i = four_bit(22, vec![5], packed.clone(), vec![]).unwrap();
        assert_eq!(i.as_slice::<i8>().unwrap(), &[1, 2, -8, -1, 7]);
        let words = packed.iter().map(|&b| i32::from(b)).collect();
        let w = four_bit(22, vec![5], vec![], words).unwrap();
        assert_eq!(w.as_slice::<i8>().unwrap(), i.as_slice::<i8>().unwrap());
        let short = four_bit(21, vec![7], packed, vec![]).unwrap_err().to_string();
        assert!(short.contains("needs 4"), "{short}");
        let bad = four_bit(22, vec![2], vec![], vec![300]).unwrap_err().to_string();
        assert!(bad.contains("packed bytes"), "{bad}");
    }
}
