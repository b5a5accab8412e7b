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

/// The dtype of a numpy `descr`: an optional byte order (`<`, `>`, `|`, `=`) and a type code
/// (`?` is `b1`). As the artifact's reader (runtime-stub/c/npy.c) decides: big-endian is
/// refused for multi-byte types, any order is taken for single bytes.
fn dtype_from_descr(d: &str) -> Result<DType, String> {
    let (order, code) = match d.as_bytes().first() {
        Some(b'<' | b'>' | b'|' | b'=') => (d.as_bytes()[0], &d[1..]),
        _ => (b'|', d),
    };
    let code = if code == "?" { "b1" } else { code };
    let dt = DType::ALL
        .into_iter()
        .find(|&t| descr(t).is_some_and(|x| &x[1..] == code))
        .ok_or_else(|| format!("unsupported dtype '{}'", printable(d)))?;
    if order == b'>' && dt.size_bytes() > 1 {
        return Err(format!(
            "big-endian arrays ('{}') are not supported; save with arr.astype('<{code}')",
            printable(d)
        ));
    }
    Ok(dt)
}

/// Headers longer than this are refused (numpy itself stops at 10000 bytes by default), by both
/// of kiln's readers.
pub const MAX_HEADER: usize = 64 << 10;

/// A cursor over the header: the Python dict literal numpy writes.
struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn skip_ws(&mut self) {
        while let [b' ' | b'\t' | b'\n' | b'\r', rest @ ..] = self.0 {
            self.0 = rest;
        }
    }
    fn eat(&mut self, c: u8) -> bool {
        self.skip_ws();
        match self.0 {
            [x, rest @ ..] if *x == c => {
                self.0 = rest;
                true
            }
            _ => false,
        }
    }
    fn word(&mut self, w: &str) -> bool {
        match self.0.strip_prefix(w.as_bytes()) {
            Some(rest) => {
                self.0 = rest;
                true
            }
            None => false,
        }
    }
    /// A quoted string ('...' or "...", no escapes).
    fn string(&mut self) -> Option<String> {
        self.skip_ws();
        let (&q, rest) = self.0.split_first()?;
        if q != b'\'' && q != b'"' {
            return None;
        }
        let n = rest.iter().position(|&c| c == q)?;
        let s = String::from_utf8_lossy(&rest[..n]).into_owned();
        self.0 = &rest[n + 1..];
        Some(s)
    }
}

/// Parses `{'descr': '<f4', 'fortran_order': False, 'shape': (1, 3), }`: exactly these three
/// keys, each once, in any order. The rules are the artifact's reader's (npy.c), so that a file
/// kiln run accepts is one a compiled executable accepts.
fn parse_header(text: &[u8]) -> Result<(DType, Vec<usize>), String> {
    let mut c = Cursor(text);
    let (mut dtype, mut fortran, mut shape) = (None, None, None);
    if !c.eat(b'{') {
        return Err("the header is not a Python dict".into());
    }
    loop {
        if c.eat(b'}') {
            break;
        }
        let key = c.string().filter(|_| c.eat(b':')).ok_or("malformed header")?;
        c.skip_ws();
        // Python would keep a repeated key's last value; which one counts is not left to chance.
        let seen = match key.as_str() {
            "descr" => dtype.is_some(),
            "fortran_order" => fortran.is_some(),
            "shape" => shape.is_some(),
            _ => false,
        };
        if seen {
            return Err(format!("duplicate header key '{key}'"));
        }
        match key.as_str() {
            "descr" => {
                let d = c
                    .string()
                    .ok_or("structured arrays are not supported (descr is not a simple type)")?;
                dtype = Some(dtype_from_descr(&d)?);
            }
            "fortran_order" => {
                if c.word("True") {
                    return Err(
                        "Fortran-order arrays are not supported; save with np.ascontiguousarray".into(),
                    );
                }
                if !c.word("False") {
                    return Err("malformed 'fortran_order'".into());
                }
                fortran = Some(false);
            }
            "shape" => {
                if !c.eat(b'(') {
                    return Err("malformed 'shape'".into());
                }
                let mut dims = vec![];
                loop {
                    if c.eat(b')') {
                        break;
                    }
                    c.skip_ws();
                    let n = c.0.iter().take_while(|b| b.is_ascii_digit()).count();
                    if n == 0 {
                        return Err("malformed 'shape'".into());
                    }
                    let v: usize = std::str::from_utf8(&c.0[..n])
                        .ok()
                        .and_then(|t| t.parse::<i64>().ok())
                        .and_then(|v| usize::try_from(v).ok())
                        .ok_or("a dimension of 'shape' is too large")?;
                    c.0 = &c.0[n..];
                    c.word("L"); // Python 2 longs
                    if dims.len() >= 64 {
                        return Err("'shape' has more than 64 dimensions".into());
                    }
                    dims.push(v);
                    if !c.eat(b',') {
                        if !c.eat(b')') {
                            return Err("malformed 'shape'".into());
                        }
                        break;
                    }
                }
                shape = Some(dims);
            }
            _ => return Err(format!("unexpected header key '{}'", printable(&key))),
        }
        if !c.eat(b',') {
            if !c.eat(b'}') {
                return Err("malformed header".into());
            }
            break;
        }
    }
    match (dtype, fortran, shape) {
        (Some(d), Some(_), Some(s)) => Ok((d, s)),
        (d, f, _) => Err(format!(
            "the header has no '{}'",
            if d.is_none() {
                "descr"
            } else if f.is_none() {
                "fortran_order"
            } else {
                "shape"
            }
        )),
    }
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
        v => return Err(err(format!("unsupported format version {v}.{}", bytes[7]))),
    };
    if header_len > MAX_HEADER {
        return Err(err(format!("header of {header_len} bytes is too long")));
    }
    let end = start
        .checked_add(header_len)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| err("truncated header".into()))?;
    let (dtype, shape) = parse_header(&bytes[start..end]).map_err(err)?;
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
