//! `.npy` files (NumPy format versions 1–3): reading inputs, writing outputs.

use kiln_ir::{DType, Tensor};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    #[error("cannot read {path}: {msg}")]
    Io { path: String, msg: String },
    #[error("{path} is not a valid .npy file: {msg}")]
    Format { path: String, msg: String },
}

const MAGIC: &[u8] = b"\x93NUMPY";

/// The numpy `descr` of a dtype (little-endian). bf16 has no numpy type; it is stored as `<V2`
/// by nobody, so it is rejected when writing and reading alike.
pub fn descr(d: DType) -> Option<&'static str> {
    Some(match d {
        DType::Bool => "|b1",
        DType::U8 => "|u1",
        DType::I8 => "|i1",
        DType::U16 => "<u2",
        DType::I16 => "<i2",
        DType::U32 => "<u4",
        DType::I32 => "<i4",
        DType::U64 => "<u8",
        DType::I64 => "<i8",
        DType::F16 => "<f2",
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::BF16 => return None,
    })
}

fn dtype_from_descr(s: &str) -> Option<DType> {
    let s = s.replace('=', "<");
    let s = match s.as_str() {
        "<b1" | "b1" | "?" => "|b1",
        "<u1" | "u1" => "|u1",
        "<i1" | "i1" => "|i1",
        other => other,
    }
    .to_string();
    DType::ALL.into_iter().find(|&d| descr(d) == Some(s.as_str()))
}

/// Parses `.npy` bytes.
pub fn parse_npy(bytes: &[u8], path: &str) -> Result<Tensor, NpyError> {
    let err = |msg: String| NpyError::Format {
        path: path.to_string(),
        msg,
    };
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(err("missing the \\x93NUMPY magic".into()));
    }
    let major = bytes[6];
    let (header_len, start) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10usize),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err(err("truncated header".into()));
            }
            (
                u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
                12,
            )
        }
        v => return Err(err(format!("unsupported format version {v}"))),
    };
    let end = start
        .checked_add(header_len)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| err("truncated header".into()))?;
    let header = std::str::from_utf8(&bytes[start..end]).map_err(|_| err("header is not text".into()))?;
    let descr_s = dict_value(header, "descr").ok_or_else(|| err("header has no 'descr'".into()))?;
    let descr_s = descr_s.trim().trim_matches(|c| c == '\'' || c == '"');
    let dtype = dtype_from_descr(descr_s)
        .ok_or_else(|| err(format!("unsupported dtype '{}'", printable(descr_s))))?;
    let fortran =
        dict_value(header, "fortran_order").ok_or_else(|| err("header has no 'fortran_order'".into()))?;
    if fortran.trim().starts_with("True") {
        return Err(err(
            "Fortran-order arrays are not supported; save with np.ascontiguousarray".into(),
        ));
    }
    let shape_s = dict_value(header, "shape").ok_or_else(|| err("header has no 'shape'".into()))?;
    let shape_s = shape_s.trim();
    let inner = shape_s
        .strip_prefix('(')
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| err(format!("bad shape '{}'", printable(shape_s))))?;
    let mut shape = vec![];
    for part in inner.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let d: usize = part
            .trim_end_matches('L')
            .parse()
            .map_err(|_| err(format!("bad dimension '{}'", printable(part))))?;
        shape.push(d);
    }
    let n =
        kiln_ir::tensor::checked_numel(&shape).ok_or_else(|| err(format!("shape {shape:?} is too large")))?;
    let want = n
        .checked_mul(dtype.size_bytes())
        .ok_or_else(|| err(format!("shape {shape:?} is too large")))?;
    let data = &bytes[end..];
    if data.len() < want {
        return Err(err(format!(
            "truncated data: shape {shape:?} of {dtype} needs {want} bytes, the file has {}",
            data.len()
        )));
    }
    if data.len() > want {
        return Err(err(format!(
            "{} bytes of trailing data after the array",
            data.len() - want
        )));
    }
    Tensor::from_le_bytes(dtype, shape, data).map_err(|e| err(e.to_string()))
}

/// Header text quoted in an error: errors are one line, so control characters (a corrupt
/// header can hold newlines) become '?', and a long run is cut.
fn printable(s: &str) -> String {
    let mut out: String = s
        .chars()
        .take(40)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if s.chars().count() > 40 {
        out.push_str("...");
    }
    out
}

/// The text after `'key':` up to the next top-level comma (shape tuples kept whole).
fn dict_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let pat1 = format!("'{key}':");
    let pat2 = format!("\"{key}\":");
    let i = header
        .find(&pat1)
        .map(|i| i + pat1.len())
        .or_else(|| header.find(&pat2).map(|i| i + pat2.len()))?;
    let rest = &header[i..];
    let mut depth = 0;
    for (j, c) in rest.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' | '}' if depth == 0 => return Some(&rest[..j]),
            _ => {}
        }
    }
    Some(rest)
}

pub fn read_npy(path: &Path) -> Result<Tensor, NpyError> {
    let p = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| NpyError::Io {
        path: p.clone(),
        msg: e.to_string(),
    })?;
    parse_npy(&bytes, &p)
}

/// Serializes a tensor as `.npy` version 1.0 bytes. bf16 tensors are written as f32.
pub fn to_npy_bytes(t: &Tensor) -> Vec<u8> {
    let t = if t.dtype() == DType::BF16 {
        t.cast(DType::F32)
    } else {
        t.clone()
    };
    let d = descr(t.dtype()).expect("every dtype but bf16 has a numpy descr");
    let shape = match t.shape() {
        [] => "()".to_string(),
        [x] => format!("({x},)"),
        s => format!(
            "({})",
            s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
        ),
    };
    let mut header = format!("{{'descr': '{d}', 'fortran_order': False, 'shape': {shape}, }}");
    // Pad so that the data starts 64-byte aligned, as numpy does.
    let total = MAGIC.len() + 4 + header.len() + 1;
    header.push_str(&" ".repeat((64 - total % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + t.size_bytes());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&t.to_le_bytes());
    out
}

pub fn write_npy(path: &Path, t: &Tensor) -> std::io::Result<()> {
    std::fs::write(path, to_npy_bytes(t))
}

/// The output file name of an output value: characters outside `[A-Za-z0-9._-]` become `_`.
pub fn output_file_name(name: &str) -> String {
    let base: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{base}.npy")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_every_dtype() {
        for d in DType::ALL {
            if d == DType::BF16 {
                continue;
            }
            let t = Tensor::from_vec(vec![2, 3], (0..6).map(|i| i as f64).collect::<Vec<_>>()).cast(d);
            let back = parse_npy(&to_npy_bytes(&t), "t.npy").unwrap();
            assert_eq!(back, t, "{d}");
        }
    }

    #[test]
    fn scalar_and_truncation() {
        let t = Tensor::scalar(3.5f32);
        let bytes = to_npy_bytes(&t);
        assert_eq!(parse_npy(&bytes, "s.npy").unwrap(), t);
        let err = parse_npy(&bytes[..bytes.len() - 1], "s.npy")
            .unwrap_err()
            .to_string();
        assert!(err.contains("truncated data"), "{err}");
        assert!(parse_npy(b"hello world", "x.npy")
            .unwrap_err()
            .to_string()
            .contains("magic"));
    }
}
