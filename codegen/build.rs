//! Compiles the C micro-kernels (codegen/ukernels) and the runtime stub (runtime-stub/c) to LLVM
//! bitcode for each target architecture with clang 19 (the LLVM kiln links), and writes
//! `bitcode.rs` listing them for `include!`. Codegen links this bitcode into every model.

use std::path::{Path, PathBuf};
use std::process::Command;

/// (architecture, clang target triple, extra flags)
const ARCHES: &[(&str, &str, &[&str])] = &[
    ("x86_64", "x86_64-unknown-linux-gnu", &["-fPIC"]),
    (
        "aarch64",
        "aarch64-unknown-linux-gnu",
        &["-fPIC", "-isystem", "/usr/aarch64-linux-gnu/include"],
    ),
    // CUDA devices: the micro-kernels run there too (see runtime-stub/c/device.c). No C
    // library exists on the device, so everything compiled for it is freestanding.
    ("nvptx64", "nvptx64-nvidia-cuda", &["-ffreestanding"]),
];

/// Where a unit is compiled: for every architecture, the CPUs only (host code), or the
/// CUDA device only.
#[derive(PartialEq)]
enum Runs {
    Everywhere,
    Cpu,
    Device,
}

/// Bitcode units: name, sources, whether it needs the C library's headers (the runtime does;
/// the micro-kernels are freestanding), where it runs.
const UNITS: &[(&str, &[&str], bool, Runs)] = &[
    (
        "uk_elementwise",
        &["ukernels/elementwise.c"],
        false,
        Runs::Everywhere,
    ),
    ("uk_reduce", &["ukernels/reduce.c"], false, Runs::Everywhere),
    ("uk_movement", &["ukernels/movement.c"], false, Runs::Everywhere),
    ("uk_nn", &["ukernels/nn.c"], false, Runs::Everywhere),
    ("uk_misc", &["ukernels/misc.c"], false, Runs::Everywhere),
    ("rt_device", &["../runtime-stub/c/device.c"], false, Runs::Device),
    ("rt_cuda", &["../runtime-stub/c/cuda.c"], true, Runs::Cpu),
    (
        "rt_core",
        &[
            "../runtime-stub/c/runtime.c",
            "../runtime-stub/c/error_context.c",
            "../runtime-stub/c/profile.c",
            "../runtime-stub/c/weights.c",
            "../runtime-stub/c/cpu_dispatch.c",
        ],
        true,
        Runs::Cpu,
    ),
    (
        "rt_exe",
        &["../runtime-stub/c/exe_main.c", "../runtime-stub/c/npy.c"],
        true,
        Runs::Cpu,
    ),
];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let clang = find_clang();
    println!("cargo:rerun-if-env-changed=KILN_CLANG");
    for dir in ["ukernels", "../runtime-stub/c"] {
        println!("cargo:rerun-if-changed={}", manifest.join(dir).display());
        for entry in std::fs::read_dir(manifest.join(dir)).unwrap().flatten() {
            println!("cargo:rerun-if-changed={}", entry.path().display());
        }
    }
    let aarch64_libc = Path::new("/usr/aarch64-linux-gnu/include/stdio.h").exists();
    let mut listing =
        String::from("/// (architecture, unit, bitcode)\npub static BITCODE: &[(&str, &str, &[u8])] = &[\n");
    for (arch, triple, extra) in ARCHES {
        for (unit, sources, needs_libc, runs) in UNITS {
            let device = *arch == "nvptx64";
            if (device && *runs == Runs::Cpu) || (!device && *runs == Runs::Device) {
                continue;
            }
            if *needs_libc && *arch == "aarch64" && !aarch64_libc {
                println!("cargo:warning=aarch64 C library headers not found (apt install libc6-dev-arm64-cross): aarch64 artifacts will lack the runtime");
                continue;
            }
            let mut parts = vec![];
            for (i, src) in sources.iter().enumerate() {
                let bc = out.join(format!("{arch}_{unit}_{i}.bc"));
                compile(&clang, triple, extra, &manifest.join(src), &bc, &manifest);
                parts.push(bc);
            }
            for bc in parts {
                listing.push_str(&format!(
                    "    ({arch:?}, {unit:?}, include_bytes!({:?})),\n",
                    bc.display().to_string()
                ));
            }
        }
    }
    listing.push_str("];\n");
    std::fs::write(out.join("bitcode.rs"), listing).unwrap();
}

fn find_clang() -> PathBuf {
    if let Ok(c) = std::env::var("KILN_CLANG") {
        return PathBuf::from(c);
    }
    for c in ["clang-19", "/usr/lib/llvm-19/bin/clang"] {
        if Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return PathBuf::from(c);
        }
    }
    panic!("clang 19 not found: kiln compiles its micro-kernels and runtime with the clang of the LLVM it links (apt install clang-19, or set KILN_CLANG)");
}

fn compile(clang: &Path, triple: &str, extra: &[&str], src: &Path, out: &Path, manifest: &Path) {
    let status = Command::new(clang)
        .args(["-target", triple, "-std=gnu11", "-O2", "-emit-llvm", "-c"])
        // Vectorisation and unrolling happen later, when kiln optimises the whole module for
        // the selected CPU; doing them here would fix the vector width to the baseline ISA.
        .args(["-fno-vectorize", "-fno-slp-vectorize", "-fno-unroll-loops"])
        .args([
            "-fno-math-errno",
            "-fno-stack-protector",
            "-fno-asynchronous-unwind-tables",
        ])
        .args([
            "-Wall",
            "-Werror=implicit-function-declaration",
            "-Werror=return-type",
            "-Werror=incompatible-pointer-types",
        ])
        .args(extra)
        .arg("-I")
        .arg(manifest.join("ukernels"))
        .arg("-I")
        .arg(manifest.join("../runtime-stub/c"))
        .arg(src)
        .arg("-o")
        .arg(out)
        .status()
        .unwrap_or_else(|e| panic!("running {}: {e}", clang.display()));
    assert!(status.success(), "clang failed on {}", src.display());
}
