//! Opening the files a model reads: the model itself, `--weights` files, and external data
//! named inside a model.
//!
//! A model is untrusted input. A path taken from it must not lead anywhere the user did not hand
//! kiln: after following every symbolic link, it must still lie inside the model's folder. And
//! every file kiln reads must be a regular file: opening a FIFO for reading blocks until a writer
//! appears (forever, for a hostile model), and a character device such as `/dev/zero` never ends.

use std::fs::File;
use std::io;
use std::path::{Component, Path, PathBuf};

/// Opens `path` for reading and checks, on the opened file, that it is a regular file.
///
/// The file is opened non-blocking so that a FIFO is refused instead of hanging the open; the
/// check is made on the open descriptor, so a file swapped after a check by name cannot slip
/// through.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let file = open_nonblocking(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a regular file (it is {})", kind_of(&meta.file_type())),
        ));
    }
    Ok(file)
}

#[cfg(unix)]
fn open_nonblocking(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

#[cfg(not(unix))]
fn open_nonblocking(path: &Path) -> io::Result<File> {
    File::open(path)
}

fn kind_of(t: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_char_device() || t.is_block_device() {
            return "a device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_dir() {
        "a folder"
    } else {
        "not a plain file"
    }
}

/// Reads a whole regular file (see [`open_regular`]).
pub fn read_regular(path: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut file = open_regular(path)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Hands the pages of `bytes`, a part of `map`, back to the kernel once they have been decoded:
/// without it a model's weights stay resident twice until the import ends (mapped and
/// decoded), which is what bounds the peak memory of compiling a model of several GiB. The
/// pages stay in the page cache, and a later read of the same bytes maps them in again.
pub fn release_mapped(map: &memmap2::Mmap, bytes: &[u8]) {
    let offset = (bytes.as_ptr() as usize).wrapping_sub(map.as_ptr() as usize);
    if bytes.is_empty() || offset > map.len() || map.len() - offset < bytes.len() {
        return;
    }
    #[cfg(unix)]
    // SAFETY: the map is shared and read-only, so dropping its pages loses nothing: a later
    // access reads them from the file again. Failure only means the pages stay resident.
    let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, bytes.len()) };
}

/// The folder a model file's external data is read from: the file's parent, or the current
/// folder for a bare file name (`model.onnx`, whose parent is the empty path).
pub fn model_folder(model: &Path) -> PathBuf {
    match model.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Opens `location`, a path written inside a model, relative to the model's folder `base`.
///
/// Refused: absolute paths and `..` (by their text), then any path whose real location — after
/// every symbolic link on the way is followed — is outside `base`'s real location, then
/// anything but a regular file. Returns the real path and the open file. Errors are phrased to
/// follow "external data location 'LOCATION' ...".
pub fn open_inside(base: &Path, location: &str) -> Result<(PathBuf, File), String> {
    let rel = Path::new(location);
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err("must be a relative path inside the model's folder".into());
    }
    let base = if base.as_os_str().is_empty() {
        Path::new(".")
    } else {
        base
    };
    let base_real = base
        .canonicalize()
        .map_err(|e| format!("cannot be resolved: the model's folder {}: {e}", base.display()))?;
    let joined = base.join(rel);
    let real = joined
        .canonicalize()
        .map_err(|e| format!("cannot be opened ({}): {e}", joined.display()))?;
    if !real.starts_with(&base_real) {
        return Err("leads outside the model's folder through a symbolic link".into());
    }
    let file = open_regular(&real).map_err(|e| format!("cannot be read ({}): {e}", real.display()))?;
    Ok((real, file))
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn a_plain_file_inside_opens() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("w.bin"), [1u8, 2, 3]).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/v.bin"), [4u8]).unwrap();
        assert!(open_inside(dir.path(), "w.bin").is_ok());
        assert!(open_inside(dir.path(), "./sub/v.bin").is_ok());
    }

    #[test]
    fn a_link_inside_the_folder_is_followed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("real.bin"), [1u8]).unwrap();
        symlink("real.bin", dir.path().join("alias.bin")).unwrap();
        let (real, _) = open_inside(dir.path(), "alias.bin").unwrap();
        assert!(real.ends_with("real.bin"));
    }

    #[test]
    fn links_out_of_the_folder_are_refused() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"secret").unwrap();
        let dir = tempfile::tempdir().unwrap();
        symlink(outside.path().join("secret"), dir.path().join("w.bin")).unwrap();
        symlink(outside.path(), dir.path().join("linkdir")).unwrap();
        for loc in ["w.bin", "linkdir/secret"] {
            let e = open_inside(dir.path(), loc).unwrap_err();
            assert!(e.contains("outside the model's folder"), "{loc}: {e}");
        }
    }

    #[test]
    fn text_escapes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        for loc in ["/etc/passwd", "../x", "a/../../x"] {
            let e = open_inside(dir.path(), loc).unwrap_err();
            assert!(e.contains("relative path inside"), "{loc}: {e}");
        }
    }

    #[test]
    fn special_files_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = open_inside(dir.path(), "fifo").unwrap_err();
        assert!(e.contains("FIFO"), "{e}");
        std::fs::create_dir(dir.path().join("folder")).unwrap();
        let e = open_inside(dir.path(), "folder").unwrap_err();
        assert!(e.contains("folder"), "{e}");
        let e = open_regular(Path::new("/dev/zero")).unwrap_err();
        assert!(e.to_string().contains("device"), "{e}");
    }
}
