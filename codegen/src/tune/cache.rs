//! The autotune cache file: JSON, one entry per (CPU, kiln version, threads, product shape),
//! holding the chosen blocking, the cost model's, and both times.
//!
//! ```json
//! {"kiln_autotune": 1, "entries": {"<key>": {"blocking": [384, 48, 256],
//!   "default": [384, 48, 256], "default_us": 812.5, "best_us": 812.5}}}
//! ```
//!
//! Saving merges with what the file holds by then (another compilation may have added to
//! it) and replaces it atomically (a new file renamed over the old one).

use super::{Blocking, Decision};
use crate::error::{CodegenError, Result};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::Path;

const FORMAT: u64 = 1;
/// A cache larger than this is not one kiln wrote (an entry is ~300 bytes).
const MAX_BYTES: u64 = 64 << 20;

#[derive(Default)]
pub struct Cache {
    entries: BTreeMap<String, Decision>,
    /// Entries this compilation added.
    added: BTreeMap<String, Decision>,
}

impl Cache {
    /// Reads the cache at `path`; a missing file is an empty cache. A file that is not a kiln
    /// autotune cache is an error (it is not overwritten).
    pub fn load(path: &Path) -> Result<Cache> {
        let mut c = Cache::default();
        if let Some(entries) = read(path)? {
            c.entries = entries;
        }
        Ok(c)
    }

    pub fn get(&self, key: &str) -> Option<Decision> {
        self.entries.get(key).copied()
    }

    pub fn insert(&mut self, key: String, d: Decision) {
        self.entries.insert(key.clone(), d);
        self.added.insert(key, d);
    }

    /// Writes the file when entries were added: what it holds now, plus them.
    pub fn save_if_changed(&self, path: &Path) -> Result<()> {
        if self.added.is_empty() {
            return Ok(());
        }
        let mut all = read(path)?.unwrap_or_default();
        all.extend(self.added.iter().map(|(k, d)| (k.clone(), *d)));
        let entries: Map<String, Value> = all.iter().map(|(k, d)| (k.clone(), entry_json(d))).collect();
        let text = serde_json::to_string_pretty(&json!({"kiln_autotune": FORMAT, "entries": entries}))
            .map_err(|e| CodegenError::internal(format!("autotune cache: {e}")))?;
        let io = |e: std::io::Error, p: &Path| {
            CodegenError::Io(format!("cannot write the autotune cache {}: {e}", p.display()))
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| io(e, dir))?;
        }
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, text + "\n").map_err(|e| io(e, &tmp))?;
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io(e, path)
        })
    }
}

fn not_a_cache(path: &Path, why: &str) -> CodegenError {
    CodegenError::Io(format!(
        "{} is not a kiln autotune cache ({why}); remove it or pass another --autotune-cache",
        path.display()
    ))
}

/// The entries of the file at `path`, or None when there is no file.
fn read(path: &Path) -> Result<Option<BTreeMap<String, Decision>>> {
    let io = |e: std::io::Error| {
        CodegenError::Io(format!("cannot read the autotune cache {}: {e}", path.display()))
    };
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    if !meta.is_file() {
        return Err(not_a_cache(path, "not a regular file"));
    }
    if meta.len() > MAX_BYTES {
        return Err(not_a_cache(path, "larger than 64 MiB"));
    }
    let text = std::fs::read_to_string(path).map_err(io)?;
    let v: Value = serde_json::from_str(&text).map_err(|e| not_a_cache(path, &format!("not JSON: {e}")))?;
    if v.get("kiln_autotune").and_then(Value::as_u64) != Some(FORMAT) {
        return Err(not_a_cache(path, "no \"kiln_autotune\": 1 field"));
    }
    let Some(entries) = v.get("entries").and_then(Value::as_object) else {
        return Err(not_a_cache(path, "no \"entries\" object"));
    };
    let mut out = BTreeMap::new();
    for (k, e) in entries {
        // An entry kiln cannot read (edited by hand, say) is timed again, not trusted.
        if let Some(d) = entry_from_json(e) {
            out.insert(k.clone(), d);
        }
    }
    Ok(Some(out))
}

fn blocking_json(b: &Blocking) -> Value {
    json!([b.kc, b.mb, b.nb])
}

fn entry_json(d: &Decision) -> Value {
    json!({
        "blocking": blocking_json(&d.blocking),
        "default": blocking_json(&d.default),
        "default_us": d.default_secs * 1e6,
        "best_us": d.best_secs * 1e6,
    })
}

fn blocking_from_json(v: &Value) -> Option<Blocking> {
    let a = v.as_array()?;
    let n = |i: usize| -> Option<usize> {
        let x = a.get(i)?.as_u64()?;
        // Positive and small: a blocking is a handful of cache-sized blocks.
        (1..=1 << 20).contains(&x).then_some(x as usize)
    };
    (a.len() == 3).then_some(())?;
    Some(Blocking {
        kc: n(0)?,
        mb: n(1)?,
        nb: n(2)?,
    })
}

fn entry_from_json(v: &Value) -> Option<Decision> {
    let secs = |f: &str| -> Option<f64> {
        let us = v.get(f)?.as_f64()?;
        (us.is_finite() && us > 0.0).then_some(us * 1e-6)
    };
    Some(Decision {
        blocking: blocking_from_json(v.get("blocking")?)?,
        default: blocking_from_json(v.get("default")?)?,
        default_secs: secs("default_us")?,
        best_secs: secs("best_us")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_that_are_not_a_cache_are_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in [
            ("notes.txt", "my notes"),
            ("other.json", "{\"entries\": {}}"),
            ("future.json", "{\"kiln_autotune\": 2, \"entries\": {}}"),
        ] {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            let e = Cache::load(&p).err().expect("refused").to_string();
            assert!(e.contains("is not a kiln autotune cache"), "{e}");
            assert_eq!(std::fs::read_to_string(&p).unwrap(), text);
        }
        assert!(Cache::load(dir.path()).is_err(), "a folder");
        assert!(Cache::load(&dir.path().join("missing.json"))
            .unwrap()
            .get("x")
            .is_none());
    }

    #[test]
    fn unreadable_entries_are_dropped_and_saving_merges() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.json");
        std::fs::write(
            &p,
            r#"{"kiln_autotune": 1, "entries": {
                "good": {"blocking": [256, 48, 128], "default": [384, 48, 256], "default_us": 10, "best_us": 8},
                "zero": {"blocking": [0, 48, 128], "default": [384, 48, 256], "default_us": 10, "best_us": 8},
                "short": {"blocking": [256, 48], "default": [384, 48, 256], "default_us": 10, "best_us": 8}}}"#,
        )
        .unwrap();
        let mut c = Cache::load(&p).unwrap();
        let good = c.get("good").unwrap();
        assert_eq!(
            good.blocking,
            Blocking {
                kc: 256,
                mb: 48,
                nb: 128
            }
        );
        assert!(c.get("zero").is_none() && c.get("short").is_none());
        // Another compilation adds an entry meanwhile; ours is merged with it.
        let mut other = Cache::load(&p).unwrap();
        other.insert("theirs".into(), good);
        other.save_if_changed(&p).unwrap();
        c.insert("ours".into(), good);
        c.save_if_changed(&p).unwrap();
        let merged = Cache::load(&p).unwrap();
        assert!(
            merged.get("theirs").is_some() && merged.get("ours").is_some() && merged.get("good").is_some()
        );
    }
}
