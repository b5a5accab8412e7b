//! The folder external data resolves into while fuzzing the importer (and while replaying the
//! saved inputs in the test suite): besides a plain data file it holds every kind of path a
//! hostile model may name, so that mutated locations reach them.
//!
//! | name | what it is | kiln must |
//! |---|---|---|
//! | `data.bin` | 4 KiB regular file | read it |
//! | `alias.bin` | symlink to `data.bin` | read it (the link stays inside) |
//! | `sub/data.bin` | regular file in a subfolder | read it |
//! | `w.bin` | symlink to `/etc/passwd` | refuse it (outside the folder) |
//! | `linkdir` | symlink to `/etc` (`linkdir/passwd`) | refuse it |
//! | `fifo` | a FIFO nobody writes | refuse it without blocking |
//! | `zero` | symlink to `/dev/zero` | refuse it (outside, and a device) |
//! | `sub` | a folder | refuse it (not a regular file) |
//!
//! Seed models naming each location are in `fuzz/regressions/onnx_import/external_*.onnx`.

use std::path::Path;

/// Creates the entries above in `dir` (which must exist); entries already there are kept.
pub fn populate(dir: &Path) {
    use std::os::unix::fs::symlink;
    let _ = std::fs::write(dir.join("data.bin"), vec![0x3fu8; 4096]);
    let _ = std::fs::create_dir(dir.join("sub"));
    let _ = std::fs::write(dir.join("sub/data.bin"), vec![0x3fu8; 64]);
    let _ = symlink("data.bin", dir.join("alias.bin"));
    let _ = symlink("/etc/passwd", dir.join("w.bin"));
    let _ = symlink("/etc", dir.join("linkdir"));
    let _ = symlink("/dev/zero", dir.join("zero"));
    if !dir.join("fifo").exists() {
        let _ = std::process::Command::new("mkfifo")
            .arg(dir.join("fifo"))
            .status();
    }
}
