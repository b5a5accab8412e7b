//! Weights outside the binary (`kiln compile --weights-out FILE.safetensors`): the packed
//! weights blob goes to a safetensors file the artifact memory-maps at create time.
//!
//! The file is a valid safetensors file holding one `U8` tensor, `weights`, that is the blob
//! exactly as the kernels read it (packed, laid out, 64-byte aligned offsets), and
//! `__metadata__` with `kiln.model`, `kiln.version`, `kiln.layout_hash`, `kiln.content_hash`
//! and `kiln.bytes`. The JSON header is padded with spaces (which safetensors allows) so the
//! data starts at a 64-byte aligned file offset: the kernels assume aligned weights, and an
//! mmap base is page-aligned.
//!
//! Two hashes, both XXH64 (fast, 64-bit, and the same function in the C runtime):
//! - the **layout hash** names what the compiled code assumes about the blob. It is embedded in
//!   the artifact and the artifact refuses a file with another one. Values do not enter it, so
//!   recompiling the same model with new weight values gives a file the old artifact accepts;
//! - the **content hash** is over the blob's bytes, stored in the file and checked at create
//!   time to catch truncated or corrupted files.

use crate::error::{CodegenError, Result};
use crate::kernel::Storage;
use crate::plan::{Plan, ALIGN};
use crate::target::TargetDesc;
use kiln_ir::Graph;
use kiln_runtime::weights as keys;
use std::io::Write;
use std::path::Path;

const P1: u64 = 0x9E37_79B1_85EB_CA87;
const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const P3: u64 = 0x1656_67B1_9E37_79F9;
const P4: u64 = 0x85EB_CA77_C2B2_AE63;
const P5: u64 = 0x27D4_EB2F_1656_67C5;

fn read64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

fn read32(b: &[u8]) -> u64 {
    u32::from_le_bytes(b[..4].try_into().expect("4 bytes")) as u64
}

fn round(acc: u64, lane: u64) -> u64 {
    acc.wrapping_add(lane.wrapping_mul(P2))
        .rotate_left(31)
        .wrapping_mul(P1)
}

fn merge(acc: u64, v: u64) -> u64 {
    (acc ^ round(0, v)).wrapping_mul(P1).wrapping_add(P4)
}

/// XXH64 (the reference algorithm; `runtime-stub/c/weights.c` has the same in C).
pub fn xxh64(data: &[u8], seed: u64) -> u64 {
    let len = data.len() as u64;
    let mut rest = data;
    let mut h = if data.len() >= 32 {
        let mut v = [
            seed.wrapping_add(P1).wrapping_add(P2),
            seed.wrapping_add(P2),
            seed,
            seed.wrapping_sub(P1),
        ];
        while rest.len() >= 32 {
            for (i, lane) in v.iter_mut().enumerate() {
                *lane = round(*lane, read64(&rest[8 * i..]));
            }
            rest = &rest[32..];
        }
        let mut h = v[0]
            .rotate_left(1)
            .wrapping_add(v[1].rotate_left(7))
            .wrapping_add(v[2].rotate_left(12))
            .wrapping_add(v[3].rotate_left(18));
        for lane in v {
            h = merge(h, lane);
        }
        h
    } else {
        seed.wrapping_add(P5)
    };
    h = h.wrapping_add(len);
    while rest.len() >= 8 {
        h = (h ^ round(0, read64(rest)))
            .rotate_left(27)
            .wrapping_mul(P1)
            .wrapping_add(P4);
        rest = &rest[8..];
    }
    if rest.len() >= 4 {
        h = (h ^ read32(rest).wrapping_mul(P1))
            .rotate_left(23)
            .wrapping_mul(P2)
            .wrapping_add(P3);
        rest = &rest[4..];
    }
    for &b in rest {
        h = (h ^ (b as u64).wrapping_mul(P5)).rotate_left(11).wrapping_mul(P1);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(P2);
    h ^= h >> 29;
    h = h.wrapping_mul(P3);
    h ^ (h >> 32)
}

/// How hashes are written: 16 lowercase hex digits (the artifact compares them as strings).
pub fn hex(h: u64) -> String {
    format!("{h:016x}")
}

/// The layout hash of a build whose weights live outside the binary. `code` is the generated
/// kernels and run function (LLVM IR text, before the runtime is linked in): besides the blob's
/// offsets, dtypes and shapes, it holds every decision the code makes from the weights
/// (packing, and constants small enough to become immediates). If a new set of values changes
/// any of that, the old artifact must refuse the new file, and does, because the hash differs.
pub fn layout_hash(graph: &Graph, plan: &Plan, target: &TargetDesc, model_name: &str, code: &str) -> u64 {
    let mut s = String::new();
    s.push_str("kiln weights layout v1\n");
    s.push_str(&format!(
        "model {model_name}\nkiln {}\ntarget {} {} {}\nbytes {}\n",
        env!("CARGO_PKG_VERSION"),
        target.triple,
        target.cpu,
        target.required_cpu_features().join(","),
        plan.weights.len()
    ));
    // Every constant stored in the blob, by offset (the storage map is unordered).
    let mut table: Vec<(u64, String)> = plan
        .storage
        .iter()
        .filter_map(|(v, s)| match s {
            Storage::Weights(off) => Some((*off, format!("{}", graph.value_type(*v)))),
            _ => None,
        })
        .collect();
    table.sort();
    for (off, ty) in table {
        s.push_str(&format!("constant @{off} {ty}\n"));
    }
    for (i, k) in plan.kernels.iter().enumerate() {
        if !k.packed.is_empty() {
            s.push_str(&format!("kernel {i} {} packed {:?}\n", k.describe(), k.packed));
        }
    }
    let mut h = xxh64(s.as_bytes(), 0);
    h = xxh64(code.as_bytes(), h);
    h
}

/// Writes `blob` as a kiln weights file (see the module comment). Returns the content hash.
pub fn write(path: &Path, model_name: &str, layout_hash: u64, blob: &[u8]) -> Result<u64> {
    let content_hash = xxh64(blob, 0);
    let mut meta = serde_json::Map::new();
    for (k, v) in [
        (keys::META_MODEL, model_name.to_string()),
        (keys::META_VERSION, env!("CARGO_PKG_VERSION").to_string()),
        (keys::META_LAYOUT_HASH, hex(layout_hash)),
        (keys::META_CONTENT_HASH, hex(content_hash)),
        (keys::META_BYTES, blob.len().to_string()),
    ] {
        meta.insert(k.to_string(), serde_json::Value::String(v));
    }
    let header = serde_json::json!({
        "__metadata__": meta,
        keys::TENSOR: {
            "dtype": "U8",
            "shape": [blob.len()],
            "data_offsets": [0, blob.len()],
        },
    });
    let mut json = header.to_string().into_bytes();
    // The 8-byte length prefix plus the header end on an ALIGN boundary.
    let padded = (8 + json.len() as u64).div_ceil(ALIGN) * ALIGN - 8;
    json.resize(padded as usize, b' ');
    let io = |e: std::io::Error| CodegenError::Io(format!("cannot write {}: {e}", path.display()));
    let file = std::fs::File::create(path).map_err(io)?;
    let mut w = std::io::BufWriter::new(file);
    w.write_all(&(json.len() as u64).to_le_bytes()).map_err(io)?;
    w.write_all(&json).map_err(io)?;
    w.write_all(blob).map_err(io)?;
    w.flush().map_err(io)?;
    Ok(content_hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xxh64_reference_values() {
        // From the xxHash reference implementation.
        assert_eq!(xxh64(b"", 0), 0xEF46_DB37_51D8_E999);
        assert_eq!(xxh64(b"a", 0), 0xD24E_C4F1_A98C_6E5B);
        assert_eq!(xxh64(b"abc", 0), 0x44BC_2CF5_AD77_0999);
        assert_eq!(
            xxh64(b"Nobody inspects the spammish repetition", 0),
            0xFBCE_A83C_8A37_8BF1
        );
    }

    #[test]
    fn file_is_aligned_safetensors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.safetensors");
        let blob: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let ch = write(&path, "m", 0x1234, &blob).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        assert_eq!((8 + n) % ALIGN as usize, 0);
        assert_eq!(&bytes[8 + n..], &blob[..]);
        let h: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        assert_eq!(h["__metadata__"]["kiln.layout_hash"], "0000000000001234");
        assert_eq!(h["__metadata__"]["kiln.content_hash"], hex(ch));
        assert_eq!(h["__metadata__"]["kiln.bytes"], "1000");
        assert_eq!(h["weights"]["data_offsets"], serde_json::json!([0, 1000]));
    }
}
