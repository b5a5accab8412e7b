//! The packed weights as an object file of their own: an ELF relocatable with one read-only
//! section and one hidden global symbol, written straight from the packed bytes.
//!
//! Embedded in the LLVM module, the weights were copied into an LLVM constant and again into
//! the object writer's section buffers (GPT-2 small: 3.7 GB peak for 0.6 GB of weights);
//! linked beside the code as this object they are written once, after which kiln drops them
//! before LLVM optimizes and emits the code. The code declares the symbol (`[N x i8]`,
//! external, hidden) and reads it exactly as it read the embedded global.

use crate::error::{CodegenError, Result};
use crate::target::Arch;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Alignment of the weights section: packed panels are read with aligned vector loads.
const ALIGN: u64 = 64;
const EHDR: u64 = 64;
const SHDR: u64 = 64;
const SYM: u64 = 24;
const SECTION_NAME: &str = ".rodata.kiln_weights";
/// Section names, in section-header order after the null section.
const SHSTRTAB: &[u8] = b"\0.rodata.kiln_weights\0.symtab\0.strtab\0.shstrtab\0.note.GNU-stack\0";

/// The symbol a model's separate weights object defines (unique per model, so that several
/// models' static libraries link into one program).
pub fn symbol(prefix: &str) -> String {
    format!("{prefix}_kiln_weights")
}

/// The ELF machine number for `arch`, or None where kiln embeds the weights instead.
fn machine(arch: Arch) -> Option<u16> {
    match arch {
        Arch::X86_64 => Some(62),
        Arch::Aarch64 => Some(183),
        Arch::Nvptx64 => None,
    }
}

/// Whether weights for `arch` can go in an object of their own.
pub fn supported(arch: Arch) -> bool {
    machine(arch).is_some()
}

/// Where the parts of the object lie, from the size of the data.
struct Layout {
    data_len: u64,
    symtab: u64,
    strtab: u64,
    shstrtab: u64,
    shdrs: u64,
    total: u64,
}

fn layout(symbol: &str, data_len: u64) -> Layout {
    let data_end = EHDR.next_multiple_of(ALIGN) + data_len;
    let symtab = data_end.next_multiple_of(8);
    let strtab = symtab + 2 * SYM;
    let shstrtab = strtab + symbol.len() as u64 + 2;
    let shdrs = (shstrtab + SHSTRTAB.len() as u64).next_multiple_of(8);
    Layout {
        data_len,
        symtab,
        strtab,
        shstrtab,
        shdrs,
        total: shdrs + 6 * SHDR,
    }
}

/// The object's size in bytes for `data_len` bytes of weights.
fn object_len(symbol: &str, data_len: usize) -> u64 {
    layout(symbol, data_len.max(1) as u64).total
}

/// Writes the object defining `symbol` as `data` (at least one byte: an empty model still has
/// a symbol to point at).
pub fn write(w: &mut impl Write, arch: Arch, symbol: &str, data: &[u8]) -> std::io::Result<()> {
    let machine = machine(arch).expect("callers check `supported`");
    let one = [0u8];
    let data = if data.is_empty() { &one[..] } else { data };
    let l = layout(symbol, data.len() as u64);
    let mut o = Out { w, pos: 0 };

    // ELF header.
    let mut h = Vec::with_capacity(EHDR as usize);
    h.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
    h.extend_from_slice(&[0; 8]);
    h.extend_from_slice(&1u16.to_le_bytes()); // ET_REL
    h.extend_from_slice(&machine.to_le_bytes());
    h.extend_from_slice(&1u32.to_le_bytes()); // EV_CURRENT
    h.extend_from_slice(&0u64.to_le_bytes()); // entry
    h.extend_from_slice(&0u64.to_le_bytes()); // program headers: none
    h.extend_from_slice(&l.shdrs.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes()); // flags
    h.extend_from_slice(&(EHDR as u16).to_le_bytes());
    h.extend_from_slice(&0u16.to_le_bytes()); // phentsize
    h.extend_from_slice(&0u16.to_le_bytes()); // phnum
    h.extend_from_slice(&(SHDR as u16).to_le_bytes());
    h.extend_from_slice(&6u16.to_le_bytes()); // sections
    h.extend_from_slice(&4u16.to_le_bytes()); // .shstrtab's index
    o.put(&h)?;
    o.pad_to(EHDR.next_multiple_of(ALIGN))?;
    o.put(data)?;
    o.pad_to(l.symtab)?;

    // Symbols: the null one, then the weights (global, object, hidden, section 1).
    let mut s = vec![0u8; SYM as usize];
    s.extend_from_slice(&1u32.to_le_bytes());
    s.push(0x11); // STB_GLOBAL << 4 | STT_OBJECT
    s.push(2); // STV_HIDDEN
    s.extend_from_slice(&1u16.to_le_bytes());
    s.extend_from_slice(&0u64.to_le_bytes());
    s.extend_from_slice(&l.data_len.to_le_bytes());
    o.put(&s)?;
    let mut strtab = vec![0u8];
    strtab.extend_from_slice(symbol.as_bytes());
    strtab.push(0);
    o.put(&strtab)?;
    o.put(SHSTRTAB)?;
    o.pad_to(l.shdrs)?;

    // Section headers: name offset, type, flags, address, offset, size, link, info, align,
    // entry size.
    let name = |n: &str| -> u32 {
        let at = SHSTRTAB
            .windows(n.len() + 1)
            .position(|win| &win[..n.len()] == n.as_bytes() && win[n.len()] == 0)
            .expect("a listed section name");
        at as u32
    };
    #[allow(clippy::too_many_arguments)]
    fn shdr(
        name: u32,
        ty: u32,
        flags: u64,
        off: u64,
        size: u64,
        link: u32,
        info: u32,
        align: u64,
        ent: u64,
    ) -> Vec<u8> {
        let mut v = Vec::with_capacity(SHDR as usize);
        v.extend_from_slice(&name.to_le_bytes());
        v.extend_from_slice(&ty.to_le_bytes());
        v.extend_from_slice(&flags.to_le_bytes());
        v.extend_from_slice(&0u64.to_le_bytes());
        v.extend_from_slice(&off.to_le_bytes());
        v.extend_from_slice(&size.to_le_bytes());
        v.extend_from_slice(&link.to_le_bytes());
        v.extend_from_slice(&info.to_le_bytes());
        v.extend_from_slice(&align.to_le_bytes());
        v.extend_from_slice(&ent.to_le_bytes());
        v
    }
    let headers = [
        vec![0u8; SHDR as usize],
        // SHT_PROGBITS, SHF_ALLOC
        shdr(
            name(SECTION_NAME),
            1,
            2,
            EHDR.next_multiple_of(ALIGN),
            l.data_len,
            0,
            0,
            ALIGN,
            0,
        ),
        // SHT_SYMTAB: strings in section 3, the first global symbol is 1
        shdr(name(".symtab"), 2, 0, l.symtab, 2 * SYM, 3, 1, 8, SYM),
        shdr(
            name(".strtab"),
            3,
            0,
            l.strtab,
            symbol.len() as u64 + 2,
            0,
            0,
            1,
            0,
        ),
        shdr(
            name(".shstrtab"),
            3,
            0,
            l.shstrtab,
            SHSTRTAB.len() as u64,
            0,
            0,
            1,
            0,
        ),
        // An empty .note.GNU-stack: the weights do not ask for an executable stack.
        shdr(name(".note.GNU-stack"), 1, 0, l.shdrs, 0, 0, 0, 1, 0),
    ];
    for hd in headers {
        o.put(&hd)?;
    }
    debug_assert_eq!(o.pos, l.total);
    Ok(())
}

/// A writer that counts what it wrote, to pad to the layout's offsets.
struct Out<'a, W: Write> {
    w: &'a mut W,
    pos: u64,
}

impl<W: Write> Out<'_, W> {
    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.pos += bytes.len() as u64;
        self.w.write_all(bytes)
    }

    fn pad_to(&mut self, to: u64) -> std::io::Result<()> {
        self.put(&vec![0u8; (to - self.pos) as usize])
    }
}

/// A weights object written to a temporary file, removed when dropped.
pub struct TempObject {
    dir: PathBuf,
    pub path: PathBuf,
    /// The symbol it defines.
    pub symbol: String,
    /// The file's size in bytes.
    pub len: u64,
}

impl TempObject {
    pub fn write(arch: Arch, symbol: &str, data: &[u8]) -> Result<TempObject> {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("kiln-weights-{}-{n}", std::process::id()));
        let io = |e: std::io::Error, p: &Path| CodegenError::Io(format!("cannot write {}: {e}", p.display()));
        std::fs::create_dir_all(&dir).map_err(|e| io(e, &dir))?;
        let path = dir.join("weights.o");
        let obj = TempObject {
            dir,
            path,
            symbol: symbol.to_string(),
            len: object_len(symbol, data.len()),
        };
        let file = std::fs::File::create(&obj.path).map_err(|e| io(e, &obj.path))?;
        let mut w = std::io::BufWriter::new(file);
        write(&mut w, arch, symbol, data)
            .and_then(|()| w.flush())
            .map_err(|e| io(e, &obj.path))?;
        Ok(obj)
    }
}

impl Drop for TempObject {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(data: &[u8]) -> Vec<u8> {
        let mut v = vec![];
        write(&mut v, Arch::X86_64, "m_kiln_weights", data).unwrap();
        v
    }

    #[test]
    fn the_weights_lie_aligned_and_the_size_is_known_up_front() {
        let data: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        let o = object(&data);
        assert_eq!(o.len() as u64, object_len("m_kiln_weights", data.len()));
        assert_eq!(&o[..4], b"\x7fELF");
        assert_eq!(&o[64..64 + 1000], &data[..]);
        // An empty blob still defines one byte.
        assert_eq!(object(&[]).len() as u64, object_len("m_kiln_weights", 0));
    }

    /// The system's tools read the object: `nm` sees the hidden global of the right size.
    #[test]
    fn nm_reads_the_symbol() {
        let dir = std::env::temp_dir().join(format!("kiln-weights-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("w.o");
        std::fs::write(&path, object(&[7u8; 300])).unwrap();
        let out = std::process::Command::new("nm").arg("-S").arg(&path).output();
        let _ = std::fs::remove_dir_all(&dir);
        let out = out.expect("nm (binutils) runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(
            text.contains("000000000000012c R m_kiln_weights"),
            "nm -S printed: {text}"
        );
    }
}
