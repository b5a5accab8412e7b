//! aarch64 artifacts executed: every fixture model compiled for `aarch64-linux-gnu`, linked with
//! the cross toolchain (`aarch64-linux-gnu-gcc`) and run under `qemu-aarch64`'s user-mode
//! emulation, matches the outputs onnxruntime recorded, with the x86 suite's tolerances.
//!
//! Executables and static libraries (driven from C by `tests/c/run_model.c`, built with the
//! cross compiler) both run. Two CPUs: the architecture's baseline (`generic`: NEON only) for
//! every fixture, and a Neoverse N1 (with the `sdot`/`udot` dot-product instructions) for the
//! quantized fixtures, whose integer products then run on kiln's `sdot` kernels
//! (`gen::gemm::int8`; the generic builds use the f32 kernels and the kernel library's integer
//! loop). `scripts/setup.sh` installs the cross toolchain and qemu-user; without them the suite
//! fails, saying so.
#![cfg(target_arch = "x86_64")]

use kiln_codegen::Emit;
use kiln_tests::compiled::{compile_graph_cross, run_executable_under, CrossCpu, WorkDir};
use kiln_tests::fixtures::{check_fixtures, load_manifest, suite_threads, Fixture};
use kiln_tests::staticlib::{compile_and_run_staticlib_on, Foreign};
use std::process::{Command, Stdio};

const TRIPLE: &str = "aarch64-linux-gnu";
const CC: &str = "aarch64-linux-gnu-gcc";

/// qemu's user-mode emulator with the cross toolchain's C library as the guest's root (where
/// it finds `ld-linux-aarch64.so.1` and libc). Its default CPU model (`max`) has every
/// extension the Neoverse builds use.
const QEMU: &[&str] = &["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"];

/// Fails the suite, naming the package, when a tool it needs is missing.
fn require(tool: &str, package: &str) {
    let found = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "{tool} not found: install {package} (scripts/setup.sh does)"
    );
}

#[derive(Clone, Copy, PartialEq)]
enum Artifact {
    Executable,
    StaticLib,
}

fn check(f: &Fixture, cross: CrossCpu, artifact: Artifact) -> anyhow::Result<()> {
    let (graph, inputs) = f.prepared()?;
    let outputs = match artifact {
        Artifact::Executable => {
            let work = WorkDir::new(&format!("a64-{}", f.name));
            let exe = work.0.join(&f.name);
            compile_graph_cross(&graph, &f.name, Emit::Exe, &exe, cross).map_err(anyhow::Error::msg)?;
            run_executable_under(QEMU, &exe, &graph, &inputs, &work.0, 2).map_err(anyhow::Error::msg)?
        }
        Artifact::StaticLib => {
            let foreign = Foreign {
                cross,
                cc: CC,
                launcher: QEMU,
            };
            let tensors: Vec<_> = inputs.into_iter().map(|(_, t)| t).collect();
            compile_and_run_staticlib_on(Some(&foreign), &graph, &f.name, &tensors, 2)
                .map_err(anyhow::Error::msg)?
        }
    };
    f.check_outputs(&graph, &outputs)
}

fn check_all(fixtures: &[Fixture], cross: CrossCpu, artifact: Artifact) {
    require(CC, "gcc-aarch64-linux-gnu");
    require("qemu-aarch64", "qemu-user");
    let what = format!(
        "aarch64 fixtures ({}, {}, under qemu-aarch64)",
        cross.cpu.unwrap_or("generic"),
        match artifact {
            Artifact::Executable => "executables",
            Artifact::StaticLib => "static libraries",
        }
    );
    check_fixtures(fixtures, &what, suite_threads(), |f| {
        check(f, cross, artifact)
            .map(|()| String::new())
            .map_err(|e| format!("{e:#}"))
    });
}

const NEON: CrossCpu = CrossCpu {
    triple: TRIPLE,
    cpu: None,
};

#[test]
fn fixtures_for_aarch64_neon_match_onnxruntime() {
    let fixtures = load_manifest().expect("fixtures/manifest.json");
    check_all(&fixtures, NEON, Artifact::Executable);
}

#[test]
fn fixtures_as_aarch64_static_libraries_match_onnxruntime() {
    let fixtures = load_manifest().expect("fixtures/manifest.json");
    check_all(&fixtures, NEON, Artifact::StaticLib);
}

/// The quantized fixtures (family `quant`: onnxruntime's quantizers' models and its quantized
/// contrib operators).
fn quantized_fixtures() -> Vec<Fixture> {
    load_manifest()
        .expect("fixtures/manifest.json")
        .into_iter()
        .filter(|f| f.family == "quant")
        .collect()
}

#[test]
fn quantized_fixtures_for_aarch64_dotprod_match_onnxruntime() {
    let fixtures = quantized_fixtures();
    assert!(!fixtures.is_empty(), "no quantized fixtures in the manifest");
    let dotprod = CrossCpu {
        triple: TRIPLE,
        cpu: Some("neoverse-n1"),
    };
    check_all(&fixtures, dotprod, Artifact::Executable);
}

/// A Neoverse N1 build runs its integer products on `sdot`, and the artifact refuses, in one
/// line and before computing anything, a CPU without the dot-product instructions.
#[test]
fn dotprod_artifacts_check_the_cpu_has_dotprod() {
    require(CC, "gcc-aarch64-linux-gnu");
    require("qemu-aarch64", "qemu-user");
    let f = quantized_fixtures()
        .into_iter()
        .find(|f| f.name == "resnet_basic_tiny_qdq")
        .expect("the resnet_basic_tiny_qdq fixture");
    let (graph, inputs) = f.prepared().unwrap();
    let work = WorkDir::new("a64-dotprod-check");
    let exe = work.0.join("q");
    let n1 = CrossCpu {
        triple: TRIPLE,
        cpu: Some("neoverse-n1"),
    };
    let summary = compile_graph_cross(&graph, "q", Emit::Exe, &exe, n1).unwrap();
    assert!(
        summary.kernel_lines.iter().any(|k| k.contains(" sdot ")),
        "no sdot kernel: {:?}",
        summary.kernel_lines
    );
    let input = work.0.join("input.npy");
    std::fs::write(&input, kiln_frontend::npy::to_npy_bytes(&inputs[0].1)).unwrap();
    let run = |cpu: &str| {
        Command::new("qemu-aarch64")
            .args(["-cpu", cpu, "-L", "/usr/aarch64-linux-gnu"])
            .arg(&exe)
            .arg("--input")
            .arg(&input)
            .output()
            .unwrap()
    };
    let o = run("cortex-a72");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "ran on a CPU without dotprod");
    assert!(err.contains("dotprod") && err.lines().count() == 1, "{err}");
    assert!(run("neoverse-n1").status.success());
}
