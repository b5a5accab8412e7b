//! Math functions on the device. The NVPTX backend has instructions for square roots, rounding,
//! min/max and fused multiply-add, but none for exp, log, pow, the trigonometric and hyperbolic
//! functions or erf: LLVM would need a library call it does not have. The library kernels call
//! those (through clang's builtins) in double or single precision, so calls to them are renamed
//! to CUDA's libdevice (`__nv_exp`, `__nv_logf`, ...), and libdevice's bitcode is linked in.
//!
//! libdevice ships with the CUDA toolkit (`nvvm/libdevice/libdevice.10.bc`) and with the
//! `nvidia-cuda-nvcc-cu12` Python package; `KILN_LIBDEVICE` names the file explicitly. It is
//! only needed when a kernel uses one of these functions: a library kernel, or a generated
//! elementwise kernel with a function the vector math has no polynomial for (the trigonometric
//! and hyperbolic functions, computed in f64 as the reference does); the other generated
//! kernels use their own polynomials.

use crate::error::{CodegenError, Result};
use inkwell::context::Context;
use inkwell::memory_buffer::MemoryBuffer;
use inkwell::module::{Linkage, Module};
use std::path::{Path, PathBuf};

/// LLVM intrinsics (`llvm.NAME.f64` / `.f32`) the NVPTX backend cannot lower.
const INTRINSICS: &[&str] = &[
    "exp", "exp2", "exp10", "log", "log2", "log10", "pow", "sin", "cos", "tan", "asin", "acos", "atan",
    "atan2", "sinh", "cosh", "tanh", "frem",
];

/// C library functions the kernels call by name (double; the `f` forms too).
const LIBM: &[&str] = &[
    "erf", "erfc", "expm1", "log1p", "acosh", "asinh", "atanh", "cbrt", "hypot", "fmod", "atan2", "exp",
    "log", "pow", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "exp2", "log2",
    "log10", "round", "lgamma", "tgamma",
];

/// Renames the math calls of `module` to libdevice and links libdevice if any remain. Returns
/// whether libdevice was linked.
pub fn lower_math<'ctx>(cx: &'ctx Context, module: &Module<'ctx>) -> Result<bool> {
    let mut renamed = vec![];
    let mut f = module.get_first_function();
    while let Some(func) = f {
        f = func.get_next_function();
        if func.count_basic_blocks() > 0 {
            continue;
        }
        let name = func.get_name().to_string_lossy().into_owned();
        let Some(target) = libdevice_name(&name) else {
            continue;
        };
        let replacement = module
            .get_function(&target)
            .unwrap_or_else(|| module.add_function(&target, func.get_type(), Some(Linkage::External)));
        func.replace_all_uses_with(replacement);
        // SAFETY: the declaration has no uses left.
        unsafe { func.delete() };
        renamed.push(name);
    }
    if renamed.is_empty() {
        return Ok(false);
    }
    // A KILN_LIBDEVICE that names no file is a mistake to report as such, not a reason to look
    // elsewhere or to fail later with LLVM's read error.
    if let Some(p) = std::env::var_os("KILN_LIBDEVICE").filter(|p| !Path::new(p).is_file()) {
        return Err(CodegenError::Target(format!(
            "KILN_LIBDEVICE={}: no such file; it must name CUDA's libdevice (nvvm/libdevice/libdevice.10.bc), which the model's kernels need",
            Path::new(&p).display()
        )));
    }
    let path = find().ok_or_else(|| {
        renamed.sort();
        renamed.dedup();
        CodegenError::Target(format!(
            "the model's kernels need CUDA's libdevice for {} and it was not found: set KILN_LIBDEVICE=/path/to/libdevice.10.bc (from a CUDA toolkit's nvvm/libdevice, or `pip install nvidia-cuda-nvcc-cu12`)",
            renamed.join(", ")
        ))
    })?;
    let buf = MemoryBuffer::create_from_file(&path)
        .map_err(|e| CodegenError::Io(format!("cannot read libdevice {}: {e}", path.display())))?;
    let lib = Module::parse_bitcode_from_buffer(&buf, cx)
        .map_err(|e| CodegenError::Io(format!("{} is not LLVM bitcode: {e}", path.display())))?;
    lib.set_triple(&module.get_triple());
    lib.set_data_layout(&module.get_data_layout());
    module
        .link_in_module(lib)
        .map_err(|e| CodegenError::internal(format!("linking libdevice {}: {e}", path.display())))?;
    Ok(true)
}

/// `llvm.exp.f64` → `__nv_exp`, `llvm.exp.f32` → `__nv_expf`, `erf` → `__nv_erf`, `erff` →
/// `__nv_erff`; None for anything else.
fn libdevice_name(name: &str) -> Option<String> {
    if let Some(rest) = name.strip_prefix("llvm.") {
        let (base, ty) = rest.rsplit_once('.')?;
        if !INTRINSICS.contains(&base) {
            return None;
        }
        let base = if base == "frem" { "fmod" } else { base };
        return match ty {
            "f64" => Some(format!("__nv_{base}")),
            "f32" => Some(format!("__nv_{base}f")),
            _ => None,
        };
    }
    let base = name
        .strip_suffix('f')
        .filter(|b| LIBM.contains(b))
        .unwrap_or(name);
    LIBM.contains(&base).then(|| format!("__nv_{name}"))
}

/// Where libdevice is: `$KILN_LIBDEVICE`, a CUDA toolkit, or a Python environment's
/// `nvidia/cuda_nvcc` package.
pub fn find() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KILN_LIBDEVICE") {
        return Some(PathBuf::from(p));
    }
    const REL: &str = "nvvm/libdevice/libdevice.10.bc";
    let mut candidates: Vec<PathBuf> = vec![];
    for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
        if let Some(home) = std::env::var_os(var) {
            candidates.push(Path::new(&home).join(REL));
        }
    }
    candidates.push(PathBuf::from("/usr/local/cuda").join(REL));
    candidates.push(PathBuf::from(
        "/usr/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc",
    ));
    let mut site_roots: Vec<PathBuf> = vec![];
    if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
        site_roots.push(Path::new(&venv).join("lib"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        site_roots.push(Path::new(&home).join(".local/lib"));
    }
    site_roots.extend(["/usr/local/lib", "/usr/lib"].map(PathBuf::from));
    for root in site_roots {
        let Ok(entries) = std::fs::read_dir(&root) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("python3"))
            })
            .collect();
        pythons.sort();
        for py in pythons {
            for pkgs in ["site-packages", "dist-packages"] {
                candidates.push(py.join(pkgs).join("nvidia/cuda_nvcc").join(REL));
            }
        }
    }
    candidates.into_iter().find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::libdevice_name;

    #[test]
    fn names() {
        assert_eq!(libdevice_name("llvm.exp.f64").as_deref(), Some("__nv_exp"));
        assert_eq!(libdevice_name("llvm.tanh.f32").as_deref(), Some("__nv_tanhf"));
        assert_eq!(libdevice_name("llvm.sqrt.f32"), None);
        assert_eq!(libdevice_name("llvm.exp.v8f32"), None);
        assert_eq!(libdevice_name("erf").as_deref(), Some("__nv_erf"));
        assert_eq!(libdevice_name("erff").as_deref(), Some("__nv_erff"));
        assert_eq!(libdevice_name("log1p").as_deref(), Some("__nv_log1p"));
        assert_eq!(libdevice_name("kiln_rt_set_error"), None);
        assert_eq!(libdevice_name("memcpy"), None);
    }
}
