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
    (
        "uk_attention_f32",
        &["ukernels/attention_f32.c"],
        false,
        Runs::Everywhere,
    ),
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
    write_op_codes(&manifest, &out);
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

/// Writes `kiln_uk_ops.h`: every integer code the Rust side passes to the C kernels, as C
/// enums in the order of their one declaration, so the codes Rust passes and the C switches
/// agree by construction:
/// - the elementwise kernels' unary and binary operators, in the order of the operator tables
///   `ir/src/ops/{unary,binary}_table.rs` (all `c_enum [...]` lists of a table form one enum,
///   as `Unary::kernel_call` and `Binary::kernel_code` number them);
/// - the other kernels' codes, `codegen/src/uk/codes.rs` (each `Name: c_enum [...]` row its
///   own enum, as the Rust enum `Name` numbers them).
fn write_op_codes(manifest: &Path, out: &Path) {
    let mut header = String::from(
        "/* Generated by codegen/build.rs from ir/src/ops/{unary,binary}_table.rs and codegen/src/uk/codes.rs:\n\
         \x20  do not edit. */\n\
         #ifndef KILN_UK_OPS_H\n#define KILN_UK_OPS_H\n",
    );
    for (table, what) in [
        ("unary_table.rs", "kiln_uk_ew_unary operators (iattr[0])"),
        ("binary_table.rs", "kiln_uk_ew_binary operators (iattr[0])"),
    ] {
        let path = manifest.join("../ir/src/ops").join(table);
        let names: Vec<String> = c_enum_lists(&path, "")
            .into_iter()
            .flat_map(|(_, list)| list)
            .collect();
        header.push_str(&c_enum(what, &names));
    }
    // The rows follow the macro's definition, whose pattern also reads `c_enum [`.
    let path = manifest.join("src/uk/codes.rs");
    for (name, list) in c_enum_lists(&path, "c_enums! {") {
        header.push_str(&c_enum(&name, &list));
    }
    header.push_str("#endif\n");
    std::fs::write(out.join("kiln_uk_ops.h"), header).unwrap();
}

/// The `c_enum [...]` lists of a Rust file after the first `start` (comments are not rows),
/// each with the identifier before its `: c_enum` (empty when there is none).
fn c_enum_lists(path: &Path, start: &str) -> Vec<(String, Vec<String>)> {
    println!("cargo:rerun-if-changed={}", path.display());
    let text = std::fs::read_to_string(path).unwrap();
    let text = &text[text.find(start).expect("the table's start")..];
    let text: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut lists = vec![];
    for (i, _) in text.match_indices("c_enum [") {
        let before = text[..i].trim_end().trim_end_matches(':').trim_end();
        let ident = before
            .rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .next()
            .unwrap_or("");
        let rest = &text[i + "c_enum [".len()..];
        let list = &rest[..rest.find(']').expect("c_enum list without ']'")];
        let names = list
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(String::from)
            .collect();
        lists.push((ident.to_string(), names));
    }
    assert!(!lists.is_empty(), "no c_enum lists in {}", path.display());
    lists
}

fn c_enum(what: &str, names: &[String]) -> String {
    format!("/* {what} */\nenum {{\n  {},\n}};\n", names.join(",\n  "))
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
        .arg(std::env::var("OUT_DIR").unwrap())
        .arg("-I")
        .arg(manifest.join("../runtime-stub/c"))
        .arg(src)
        .arg("-o")
        .arg(out)
        .status()
        .unwrap_or_else(|e| panic!("running {}: {e}", clang.display()));
    assert!(status.success(), "clang failed on {}", src.display());
}
