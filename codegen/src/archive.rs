//! Writes a static library (`ar` archive in the GNU format with a symbol index) holding one
//! object file. kiln writes it itself so no `ar` is needed and the bytes are deterministic.

fn header(name: &str, size: usize) -> Vec<u8> {
    let h = format!("{name:<16}{:<12}{:<6}{:<6}{:<8}{size:<10}`\n", 0, 0, 0, 644);
    debug_assert_eq!(h.len(), 60);
    h.into_bytes()
}

/// An archive with `member` (named `member_name`, ≤ 15 bytes) exporting `symbols`.
pub fn write_archive(member_name: &str, member: &[u8], symbols: &[String]) -> Vec<u8> {
    let mut names = Vec::new();
    for s in symbols {
        names.extend_from_slice(s.as_bytes());
        names.push(0);
    }
    let index_size = 4 + 4 * symbols.len() + names.len();
    let index_padded = index_size + index_size % 2;
    let member_offset = 8 + 60 + index_padded;
    let mut out = b"!<arch>\n".to_vec();
    out.extend(header("/", index_size));
    out.extend((symbols.len() as u32).to_be_bytes());
    for _ in symbols {
        out.extend((member_offset as u32).to_be_bytes());
    }
    out.extend(&names);
    if index_size % 2 == 1 {
        out.push(b'\n');
    }
    debug_assert_eq!(out.len(), member_offset);
    out.extend(header(&format!("{member_name}/"), member.len()));
    out.extend_from_slice(member);
    if member.len() % 2 == 1 {
        out.push(b'\n');
    }
    out
}
