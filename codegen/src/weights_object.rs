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
use std::path::PathBuf;

/// Alignment of the weights section: packed panels are read with aligned vector loads.
const ALIGN: u64 = 64;
const EHDR: u64 = 64;
const SHDR: u64 = 64;
const SYM: u64 = 24;
/// On x86-64 the weights are a *large* section (`.lrodata`, `SHF_X86_64_LARGE`): linkers place
/// those after every other section, so that gigabytes of weights never come between the code
/// and its GOT or data, which the small code model reaches with 32-bit offsets (a model of more
/// than 2 GiB of weights otherwise fails to link). The code reads the weights through a base
/// pointer it loads at run time (`emit::run`), so their own distance does not matter.
pub(crate) const SECTION_NAME_X86_64: &str = ".lrodata.kiln_weights";
/// AArch64 has no large sections; its code reaches ±4 GiB.
const SECTION_NAME: &str = ".rodata.kiln_weights";
/// `SHF_X86_64_LARGE`.
const SHF_X86_64_LARGE: u64 = 0x1000_0000;
/// Section names (the weights section's under either name), in section-header order after the
/// null section.
const SHSTRTAB: &[u8] =
    b"\0.rodata.kiln_weights\0.lrodata.kiln_weights\0.symtab\0.strtab\0.shstrtab\0.note.GNU-stack\0";

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

/// Where the data starts: right after the ELF header, which is exactly one alignment unit.
const DATA_OFFSET: u64 = EHDR;
const _: () = assert!(DATA_OFFSET.is_multiple_of(ALIGN));

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
    let data_end = DATA_OFFSET + data_len;
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

/// Writes the object defining `symbol` as `data` (at least one byte: an empty model still has
/// a symbol to point at).
pub fn write(w: &mut impl Write, arch: Arch, symbol: &str, data: &[u8]) -> std::io::Result<()> {
    let one = [0u8];
    let data = if data.is_empty() { &one[..] } else { data };
    let l = layout(symbol, data.len() as u64);
    w.write_all(&header(arch, &l))?;
    w.write_all(data)?;
    w.write_all(&tail(arch, symbol, &l))
}

/// The ELF header (`DATA_OFFSET` bytes): the data follows it.
fn header(arch: Arch, l: &Layout) -> Vec<u8> {
    let machine = machine(arch).expect("callers check `supported`");
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
    debug_assert_eq!(h.len() as u64, DATA_OFFSET);
    h
}

/// Everything after the data: padding, the symbol and string tables, the section headers.
fn tail(arch: Arch, symbol: &str, l: &Layout) -> Vec<u8> {
    let data_end = DATA_OFFSET + l.data_len;
    let mut t = vec![0u8; (l.symtab - data_end) as usize];

    // Symbols: the null one, then the weights (global, object, hidden, section 1).
    t.extend_from_slice(&[0u8; SYM as usize]);
    t.extend_from_slice(&1u32.to_le_bytes());
    t.push(0x11); // STB_GLOBAL << 4 | STT_OBJECT
    t.push(2); // STV_HIDDEN
    t.extend_from_slice(&1u16.to_le_bytes());
    t.extend_from_slice(&0u64.to_le_bytes());
    t.extend_from_slice(&l.data_len.to_le_bytes());
    t.push(0);
    t.extend_from_slice(symbol.as_bytes());
    t.push(0);
    t.extend_from_slice(SHSTRTAB);
    t.resize((l.shdrs - data_end) as usize, 0);

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
        t: &mut Vec<u8>,
        name: u32,
        ty: u32,
        flags: u64,
        off: u64,
        size: u64,
        link: u32,
        info: u32,
        align: u64,
        ent: u64,
    ) {
        t.extend_from_slice(&name.to_le_bytes());
        t.extend_from_slice(&ty.to_le_bytes());
        t.extend_from_slice(&flags.to_le_bytes());
        t.extend_from_slice(&0u64.to_le_bytes());
        t.extend_from_slice(&off.to_le_bytes());
        t.extend_from_slice(&size.to_le_bytes());
        t.extend_from_slice(&link.to_le_bytes());
        t.extend_from_slice(&info.to_le_bytes());
        t.extend_from_slice(&align.to_le_bytes());
        t.extend_from_slice(&ent.to_le_bytes());
    }
    t.extend_from_slice(&[0u8; SHDR as usize]);
    // SHT_PROGBITS, SHF_ALLOC (and SHF_X86_64_LARGE)
    let (section, flags) = match arch {
        Arch::X86_64 => (SECTION_NAME_X86_64, 2 | SHF_X86_64_LARGE),
        _ => (SECTION_NAME, 2),
    };
    shdr(
        &mut t,
        name(section),
        1,
        flags,
        DATA_OFFSET,
        l.data_len,
        0,
        0,
        ALIGN,
        0,
    );
    // SHT_SYMTAB: strings in section 3, the first global symbol is 1
    shdr(&mut t, name(".symtab"), 2, 0, l.symtab, 2 * SYM, 3, 1, 8, SYM);
    let strtab_len = symbol.len() as u64 + 2;
    shdr(&mut t, name(".strtab"), 3, 0, l.strtab, strtab_len, 0, 0, 1, 0);
    let shstrtab_len = SHSTRTAB.len() as u64;
    shdr(
        &mut t,
        name(".shstrtab"),
        3,
        0,
        l.shstrtab,
        shstrtab_len,
        0,
        0,
        1,
        0,
    );
    // An empty .note.GNU-stack: the weights do not ask for an executable stack.
    shdr(&mut t, name(".note.GNU-stack"), 1, 0, l.shdrs, 0, 0, 0, 1, 0);
    debug_assert_eq!(data_end + t.len() as u64, l.total);
    t
}

/// A weights object written as the planner packs each constant: the data goes to the file as
/// it comes, the header (which needs the data's size) last. A model's packed weights are thus
/// never in memory all at once.
pub struct ObjectWriter {
    file: std::io::BufWriter<std::fs::File>,
    arch: Arch,
    data_len: u64,
    object: TempObject,
}

impl ObjectWriter {
    pub fn create(arch: Arch, symbol: &str) -> Result<ObjectWriter> {
        let object = TempObject::create(symbol)?;
        let file = std::fs::File::create(&object.path).map_err(|e| object.io_error(e))?;
        let mut file = std::io::BufWriter::with_capacity(1 << 20, file);
        // Room for the header, written by `finish`.
        file.write_all(&[0u8; DATA_OFFSET as usize])
            .map_err(|e| object.io_error(e))?;
        Ok(ObjectWriter {
            file,
            arch,
            data_len: 0,
            object,
        })
    }

    /// Appends to the data section.
    pub fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.data_len += bytes.len() as u64;
        self.file.write_all(bytes)
    }

    /// Bytes of data written so far.
    pub fn data_len(&self) -> u64 {
        self.data_len
    }

    /// Writes the tables and the header: the object is complete.
    pub fn finish(mut self) -> Result<TempObject> {
        use std::io::{Seek, SeekFrom};
        let io = |e: std::io::Error| self.object.io_error(e);
        if self.data_len == 0 {
            self.file.write_all(&[0]).map_err(io)?;
            self.data_len = 1;
        }
        let l = layout(&self.object.symbol, self.data_len);
        self.file
            .write_all(&tail(self.arch, &self.object.symbol, &l))
            .map_err(io)?;
        self.file.seek(SeekFrom::Start(0)).map_err(io)?;
        self.file.write_all(&header(self.arch, &l)).map_err(io)?;
        self.file.flush().map_err(io)?;
        self.object.len = l.total;
        Ok(self.object)
    }

    /// The error to report for a failed `write`.
    pub fn error(&self, e: std::io::Error) -> CodegenError {
        self.object.io_error(e)
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
    /// A fresh temporary folder for the object (the file is not created yet).
    fn create(symbol: &str) -> Result<TempObject> {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("kiln-weights-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| CodegenError::Io(format!("cannot write {}: {e}", dir.display())))?;
        let path = dir.join("weights.o");
        Ok(TempObject {
            dir,
            path,
            symbol: symbol.to_string(),
            len: 0,
        })
    }

    fn io_error(&self, e: std::io::Error) -> CodegenError {
        CodegenError::Io(format!("cannot write {}: {e}", self.path.display()))
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
        assert_eq!(o.len() as u64, layout("m_kiln_weights", data.len() as u64).total);
        assert_eq!(&o[..4], b"\x7fELF");
        assert_eq!(&o[64..64 + 1000], &data[..]);
        // An empty blob still defines one byte.
        assert_eq!(object(&[]).len() as u64, layout("m_kiln_weights", 1).total);
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
