//! CUDA's tools for the tests of the CUDA target: `ptxas` (the PTX assembler, which checks the
//! PTX kiln generates the way the driver's JIT would) and libdevice (the math library the
//! device code links). Both come with `nvidia-cuda-nvcc-cu12`, which `scripts/setup.sh` installs
//! into the repository's `.venv`; a CUDA toolkit works as well.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The error message prefix of a CUDA artifact that finds no driver or no device.
pub const NO_DEVICE: &str = "no CUDA device";

/// The compute capabilities whose PTX CI checks: A100 and H100.
pub const CHECKED_SM: [u32; 2] = [80, 90];

/// `nvidia/cuda_nvcc` in the repository's `.venv` (any python3.x).
fn venv_cuda_nvcc() -> Vec<PathBuf> {
    let lib = crate::repo_root().join(".venv/lib");
    let Ok(entries) = std::fs::read_dir(&lib) else {
        return vec![];
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
    pythons
        .into_iter()
        .map(|py| py.join("site-packages/nvidia/cuda_nvcc"))
        .collect()
}

fn cuda_homes() -> Vec<PathBuf> {
    let mut homes: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .collect();
    homes.push(PathBuf::from("/usr/local/cuda"));
    homes
}

/// ptxas: `$KILN_PTXAS`, else the `.venv`'s `nvidia-cuda-nvcc-cu12`, else `ptxas` on `PATH`,
/// else a CUDA toolkit's (`$CUDA_HOME/bin`). `$KILN_PTXAS` is taken as given: a wrong path
/// fails the check that runs it rather than quietly falling back to another ptxas.
pub fn ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KILN_PTXAS") {
        return Some(PathBuf::from(p));
    }
    let from_venv = venv_cuda_nvcc().into_iter().map(|d| d.join("bin/ptxas"));
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("ptxas"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let from_toolkit = cuda_homes().into_iter().map(|h| h.join("bin/ptxas"));
    from_venv.chain(on_path).chain(from_toolkit).find(|p| p.is_file())
}

const LIBDEVICE: &str = "nvvm/libdevice/libdevice.10.bc";

/// libdevice: `$KILN_LIBDEVICE`, else the `.venv`'s `nvidia-cuda-nvcc-cu12`, else a CUDA
/// toolkit's. As with ptxas, `$KILN_LIBDEVICE` is taken as given.
pub fn libdevice() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KILN_LIBDEVICE") {
        return Some(PathBuf::from(p));
    }
    venv_cuda_nvcc()
        .into_iter()
        .chain(cuda_homes())
        .map(|d| d.join(LIBDEVICE))
        .find(|p| p.is_file())
}

/// Points the compiler at [`libdevice`] through `KILN_LIBDEVICE` when it is not set: codegen
/// looks in CUDA toolkits and Python environments, not in this repository's `.venv`. Every test
/// that compiles for CUDA calls this first, before it starts threads, so the environment is
/// written once while nothing else reads it.
pub fn export_libdevice() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("KILN_LIBDEVICE").is_none() {
            if let Some(p) = libdevice() {
                std::env::set_var("KILN_LIBDEVICE", p);
            }
        }
    });
}

/// Assembles `ptx` for `sm_{sm}` with `ptxas` (into a cubin next to it); the error is ptxas's
/// own diagnostics.
pub fn ptxas_check(ptxas: &Path, ptx: &Path, sm: u32) -> Result<(), String> {
    let cubin = ptx.with_extension(format!("sm{sm}.cubin"));
    let out = Command::new(ptxas)
        .arg(format!("-arch=sm_{sm}"))
        .arg(ptx)
        .arg("-o")
        .arg(&cubin)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", ptxas.display()))?;
    let _ = std::fs::remove_file(&cubin);
    if out.status.success() {
        return Ok(());
    }
    let diag = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = diag.lines().filter(|l| !l.trim().is_empty()).take(5).collect();
    Err(format!(
        "ptxas -arch=sm_{sm} failed ({}): {}",
        out.status,
        lines.join(" | ")
    ))
}

/// Whether a failed run of a CUDA artifact is the runtime reporting that there is no driver or
/// no device: the executable prints `error: no CUDA device...`. Returns the reason after the
/// prefix; None for any other failure.
pub fn no_device_reason(run_error: &str) -> Option<String> {
    let marker = format!("error: {NO_DEVICE}");
    let at = run_error.find(&marker)?;
    let rest = &run_error[at + marker.len()..];
    let reason = rest.lines().next().unwrap_or("").trim_start_matches(':').trim();
    Some(if reason.is_empty() {
        "the runtime gave no reason".to_string()
    } else {
        reason.to_string()
    })
}

/// Whether the GPU suites must run (`KILN_REQUIRE_GPU=1`, for machines with a GPU): then a
/// missing device is a failure, not a skip.
pub fn gpu_required() -> bool {
    std::env::var("KILN_REQUIRE_GPU").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Runs `f` on every item on `threads` threads; results in item order.
pub fn run_parallel<T: Sync, R: Send>(items: &[T], threads: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(Vec::with_capacity(items.len()));
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let r = f(item);
                results.lock().unwrap().push((i, r));
            });
        }
    });
    let mut r = results.into_inner().unwrap();
    r.sort_by_key(|(i, _)| *i);
    r.into_iter().map(|(_, r)| r).collect()
}

/// Runs the node cases the compiled CPU path passes (`tests/conformance/compiled_manifest.txt`,
/// those whose names start with an `excluded` prefix left out) on `backend`, a CUDA backend
/// (a device or the emulator): each must pass. Runs on `threads` threads; prints
/// `<suite>: N passed, K failed ...`.
pub fn check_cuda_node_cases(
    suite: &str,
    backend: &crate::conformance::Backend,
    excluded: &[&str],
    threads: usize,
) {
    use crate::conformance::{cache_dir, filtered_cases, list_cases, read_manifest, run_all, CaseResult};
    let dir = cache_dir();
    let manifest = read_manifest(&crate::repo_root().join("tests/conformance/compiled_manifest.txt"));
    let cases: Vec<_> = list_cases(&dir)
        .unwrap_or_default()
        .into_iter()
        .filter(|c| {
            let name = c.file_name().unwrap().to_string_lossy();
            manifest.contains(&*name) && !excluded.iter().any(|p| name.starts_with(p))
        })
        .collect();
    assert!(
        !cases.is_empty(),
        "no compiled-path ONNX node test cases in {}: generate them with `python3 scripts/gen_node_tests.py`",
        dir.display()
    );
    let (cases, _) = filtered_cases(cases);
    let results = run_all(&cases, backend, threads);
    let failed: Vec<&CaseResult> = results.iter().filter(|r| r.outcome.is_err()).collect();
    for r in &failed {
        println!("FAIL {}: {}", r.name, r.outcome.as_ref().unwrap_err());
    }
    println!(
        "{suite}: {} passed, {} failed of the compiled-path cases",
        results.iter().filter(|r| r.outcome.is_ok()).count(),
        failed.len()
    );
    assert!(failed.is_empty(), "{} node cases fail ({suite})", failed.len());
}

/// The manifest of the compiled-path node cases whose CUDA plans still run C library kernels.
pub const CUDA_LIBRARY_MANIFEST: &str = "tests/conformance/cuda_library_manifest.txt";

/// Checks the C library kernels counted in the CUDA plans of the node cases (`planned`: case
/// name → count) against [`CUDA_LIBRARY_MANIFEST`]: an unlisted case must have none and a
/// listed one exactly its count, so a new library kernel fails and a new GPU kernel must lower
/// the list. A listed case that was not planned fails too, unless `filtered` (a subset ran).
/// `KILN_BLESS=1` (on a full run) rewrites the manifest first. Prints the total.
pub fn check_cuda_library_manifest(planned: &std::collections::BTreeMap<String, usize>, filtered: bool) {
    use std::collections::BTreeMap;
    let path = crate::repo_root().join(CUDA_LIBRARY_MANIFEST);
    if std::env::var_os("KILN_BLESS").is_some() && !filtered {
        let mut text = String::from(
            "# Compiled-path ONNX node cases whose CUDA plan (sm_80) still runs C library kernels on one\n\
             # GPU block, and how many; every other case compiles to generated GPU kernels only.\n\
             # Checked by `cargo test -p kiln-tests --test cuda_emulated`; regenerate with KILN_BLESS=1.\n",
        );
        for (case, n) in planned.iter().filter(|(_, n)| **n > 0) {
            text.push_str(&format!("{case} {n}\n"));
        }
        std::fs::write(&path, text).expect("write the CUDA library manifest");
        println!("blessed {}", path.display());
    }
    let listed: BTreeMap<String, usize> = std::fs::read_to_string(&path)
        .unwrap_or_default()
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (case, n) = l
                .split_once(' ')
                .unwrap_or_else(|| panic!("{CUDA_LIBRARY_MANIFEST}: bad line '{l}'"));
            (
                case.to_string(),
                n.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{CUDA_LIBRARY_MANIFEST}: bad count in '{l}'")),
            )
        })
        .collect();
    let mut wrong = vec![];
    for (case, n) in planned {
        let want = listed.get(case).copied().unwrap_or(0);
        if *n != want {
            wrong.push(format!("{case}: {n} library kernels, listed {want}"));
        }
    }
    if !filtered {
        wrong.extend(
            listed
                .keys()
                .filter(|c| !planned.contains_key(*c))
                .map(|c| format!("{c}: listed but not planned")),
        );
    }
    println!(
        "CUDA library kernels in the node cases' plans: {} in {} cases",
        planned.values().sum::<usize>(),
        planned.values().filter(|n| **n > 0).count()
    );
    assert!(
        wrong.is_empty(),
        "library kernels differ from {CUDA_LIBRARY_MANIFEST} (a GPU kernel that removes some lowers the list: KILN_BLESS=1; a new library kernel needs a GPU kernel): {}",
        wrong.join("; ")
    );
}

#[cfg(test)]
mod tests {
    use super::no_device_reason;

    #[test]
    fn no_device_detection() {
        assert_eq!(
            no_device_reason(
                "compiled model failed (exit status: 1): error: no CUDA device: cuInit failed (100)"
            )
            .as_deref(),
            Some("cuInit failed (100)")
        );
        assert_eq!(
            no_device_reason("failed: error: no CUDA device\nmore").as_deref(),
            Some("the runtime gave no reason")
        );
        assert_eq!(
            no_device_reason("compiled model failed: error: out of memory"),
            None
        );
        assert_eq!(
            no_device_reason("link: undefined reference to kiln_rt_cuda_create"),
            None
        );
    }
}
