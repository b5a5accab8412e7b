//! Writes a static library (`ar` archive in the GNU format with a symbol index) holding the
//! model's object files: its code and, separately, its weights (`weights_object`). kiln
//! writes it itself so no `ar` is needed and the bytes are deterministic; a member held in a
//! file is copied into the archive, never read into memory whole.

use std::io::{Read, Write};
use std::path::Path;

fn header(name: &str, size: u64) -> Vec<u8> {
    let h = format!("{name:<16}{:<12}{:<6}{:<6}{:<8}{size:<10}`\n", 0, 0, 0, 644);
    debug_assert_eq!(h.len(), 60);
    h.into_bytes()
}

/// Where an archive member's bytes come from.
pub enum Source<'a> {
    Bytes(&'a [u8]),
    /// A file of this many bytes.
    File(&'a Path, u64),
}

impl Source<'_> {
    fn len(&self) -> u64 {
        match self {
            Source::Bytes(b) => b.len() as u64,
            Source::File(_, n) => *n,
        }
    }
}

/// One member: its name (≤ 15 bytes), its bytes, and the symbols it defines (listed in the
/// index, which is how the linker finds the member that defines an undefined symbol).
pub struct Member<'a> {
    pub name: String,
    pub source: Source<'a>,
    pub symbols: Vec<String>,
}

/// Writes the archive of `members` to `w`.
pub fn write_archive(w: &mut impl Write, members: &[Member<'_>]) -> std::io::Result<()> {
    let mut names = Vec::new();
    let mut count = 0usize;
    for m in members {
        for s in &m.symbols {
            names.extend_from_slice(s.as_bytes());
            names.push(0);
            count += 1;
        }
    }
    let index_size = (4 + 4 * count + names.len()) as u64;
    let index_padded = index_size + index_size % 2;
    let mut offsets = vec![];
    let mut at = 8 + 60 + index_padded;
    for m in members {
        offsets.push(at);
        at += 60 + m.source.len() + m.source.len() % 2;
    }
    w.write_all(b"!<arch>\n")?;
    w.write_all(&header("/", index_size))?;
    w.write_all(&(count as u32).to_be_bytes())?;
    for (m, off) in members.iter().zip(&offsets) {
        for _ in &m.symbols {
            let off = u32::try_from(*off).map_err(|_| {
                std::io::Error::other("the static library's members pass the 4 GiB its index can address")
            })?;
            w.write_all(&off.to_be_bytes())?;
        }
    }
    w.write_all(&names)?;
    if index_size % 2 == 1 {
        w.write_all(b"\n")?;
    }
    for m in members {
        w.write_all(&header(&format!("{}/", m.name), m.source.len()))?;
        match &m.source {
            Source::Bytes(b) => w.write_all(b)?,
            Source::File(path, n) => {
                let copied = std::io::copy(&mut std::fs::File::open(path)?.take(*n), w)?;
                if copied != *n {
                    return Err(std::io::Error::other(format!(
                        "{} is shorter than expected",
                        path.display()
                    )));
                }
            }
        }
        if m.source.len() % 2 == 1 {
            w.write_all(b"\n")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ar` and `nm` read an archive of two members, one copied from a file, each member's
    /// symbols indexed at its own offset.
    #[test]
    fn system_tools_read_a_two_member_archive() {
        let dir = std::env::temp_dir().join(format!("kiln-archive-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let weights = dir.join("w.o");
        let mut obj = vec![];
        crate::weights_object::write(&mut obj, crate::target::Arch::X86_64, "m_kiln_weights", &[1; 33])
            .unwrap();
        std::fs::write(&weights, &obj).unwrap();
        let members = [
            Member {
                name: "odd.txt".into(),
                source: Source::Bytes(b"odd"),
                symbols: vec![],
            },
            Member {
                name: "weights.o".into(),
                source: Source::File(&weights, obj.len() as u64),
                symbols: vec!["m_kiln_weights".into()],
            },
        ];
        let lib = dir.join("libm.a");
        let mut out = vec![];
        write_archive(&mut out, &members).unwrap();
        std::fs::write(&lib, &out).unwrap();
        let ar = std::process::Command::new("ar")
            .arg("t")
            .arg(&lib)
            .output()
            .unwrap();
        let nm = std::process::Command::new("nm")
            .arg("-s")
            .arg(&lib)
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(String::from_utf8_lossy(&ar.stdout), "odd.txt\nweights.o\n");
        let nm = String::from_utf8_lossy(&nm.stdout);
        assert!(nm.contains("m_kiln_weights in weights.o"), "nm -s printed: {nm}");
    }
}
