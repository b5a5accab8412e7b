//! Linking an artifact's object into an executable or a shared library with a C toolchain for
//! the target: `$CC` (else `cc`) for this machine's architecture, the target's cross compiler
//! (`aarch64-linux-gnu-gcc`) for another. The object already holds the runtime and the kernel
//! library (linked in as bitcode), so the toolchain brings only the C library's start-up files,
//! libc, libm and pthreads.

use crate::buildfiles;
use crate::error::{CodegenError, Result};
use crate::target::{Arch, TargetDesc};
use std::path::Path;
use std::process::{Command, Stdio};

/// The C compiler that links for `target`: `requested` when the caller names one; for this
/// machine's architecture `$CC`, else `cc`; for another architecture `$CC` when it targets
/// that architecture (`$CC -dumpmachine`), else the GNU cross compiler on `PATH`. Fails, naming
/// the package to install, when no toolchain for the architecture is found.
pub fn linker_for(requested: Option<&str>, target: &TargetDesc) -> Result<String> {
    if let Some(cc) = requested {
        return Ok(cc.to_string());
    }
    let env_cc = std::env::var("CC").ok().filter(|c| !c.trim().is_empty());
    if target.arch == host_arch() {
        return Ok(env_cc.unwrap_or_else(|| "cc".to_string()));
    }
    let arch = target.arch_name();
    let (cross, package) = cross_toolchain(target.arch)?;
    env_cc
        .into_iter()
        .chain(std::iter::once(cross.to_string()))
        .find(|cc| targets_arch(cc, arch))
        .ok_or_else(|| {
            CodegenError::Target(format!(
                "linking for {arch} needs a C toolchain for {arch}, and neither `{cross}` nor $CC \
                 is one: install {package} (Debian, Ubuntu) or set $CC to an {arch} C compiler \
                 (--emit obj and --emit staticlib need no toolchain)"
            ))
        })
}

/// The architecture kiln itself runs on.
fn host_arch() -> Arch {
    if cfg!(target_arch = "aarch64") {
        Arch::Aarch64
    } else {
        Arch::X86_64
    }
}

/// The GNU cross compiler's command for `arch` and the Debian package that installs it.
fn cross_toolchain(arch: Arch) -> Result<(&'static str, &'static str)> {
    match arch {
        Arch::Aarch64 => Ok(("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu")),
        Arch::X86_64 => Ok(("x86_64-linux-gnu-gcc", "gcc-x86-64-linux-gnu")),
        Arch::Nvptx64 => Err(CodegenError::internal(
            "CUDA device code is not linked by a C toolchain",
        )),
    }
}

/// Whether the C compiler `cc` runs and generates code for `arch` (its `-dumpmachine` triple,
/// `aarch64-linux-gnu` say, starts with the architecture's name).
fn targets_arch(cc: &str, arch: &str) -> bool {
    Command::new(cc)
        .arg("-dumpmachine")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).starts_with(arch))
}

/// Runs the C compiler as a linker on `files` (name, bytes), written to a fresh temporary
/// folder that is removed afterwards; `command` builds the command line from that folder.
/// `what` names the step in the error when the linker fails.
fn run_linker(
    cc: &str,
    what: &str,
    files: &[(&str, &[u8])],
    command: impl FnOnce(&Path) -> Command,
) -> Result<()> {
    static LINKS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = LINKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("kiln-link-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .map_err(|e| CodegenError::Io(format!("cannot create {}: {e}", dir.display())))?;
    let result = files
        .iter()
        .try_for_each(|(name, bytes)| std::fs::write(dir.join(name), bytes))
        .map_err(|e| CodegenError::Io(format!("cannot write in {}: {e}", dir.display())))
        .and_then(|()| {
            command(&dir).output().map_err(|e| {
                CodegenError::Io(format!("cannot run the C compiler '{cc}' to link: {e} (set $CC)"))
            })
        });
    let _ = std::fs::remove_dir_all(&dir);
    let output = result?;
    if !output.status.success() {
        return Err(CodegenError::Io(format!(
            "{what} with '{cc}' failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(())
}

/// Links the object, and the objects `extra` names (the weights), into an executable with the
/// system C compiler.
pub fn link_executable(cc: &str, obj: &[u8], extra: &[&Path], out: &Path) -> Result<()> {
    run_linker(cc, "linking", &[("model.o", obj)], |dir| {
        let mut c = Command::new(cc);
        c.arg("-o")
            .arg(out)
            .arg(dir.join("model.o"))
            .args(extra)
            // libdl: a CUDA model loads the driver with dlopen (part of libc since glibc 2.34).
            .args(["-lpthread", "-lm", "-ldl", "-Wl,--build-id=none"]);
        c
    })
}

/// Links the object (position-independent: [`TargetDesc::target_machine`] generates PIC, and
/// the runtime bitcode is compiled with `-fPIC`) into a shared library that exports `exported`
/// and nothing else. The soname is the file name, so programs linked against it record
/// `libNAME.so` and find it through their rpath or the loader's search path.
pub fn link_shared(
    cc: &str,
    obj: &[u8],
    extra: &[&Path],
    out: &Path,
    exported: &[String],
    cuda: bool,
) -> Result<()> {
    let script = buildfiles::version_script(exported);
    let soname = out
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let libs: Vec<String> = buildfiles::system_libs(cuda)
        .iter()
        .map(|l| format!("-l{l}"))
        .collect();
    let files = [("model.o", obj), ("exports.map", script.as_bytes())];
    run_linker(cc, "linking the shared library", &files, |dir| {
        let mut c = Command::new(cc);
        c.arg("-shared")
            .arg("-o")
            .arg(out)
            .arg(dir.join("model.o"))
            .args(extra)
            .arg(format!("-Wl,-soname,{soname}"))
            .arg(format!(
                "-Wl,--version-script={}",
                dir.join("exports.map").display()
            ))
            // An undefined symbol is a link error now, not a failure when the library is loaded.
            .args(["-Wl,--no-undefined", "-Wl,--build-id=none"])
            .args(&libs);
        c
    })
}
