//! Artifacts on CPUs older than the build machine, run under qemu's user-mode emulation with
//! its CPU models: a portable executable picks x86-64-v3 on a Haswell and computes the
//! fixture's outputs; on a pre-AVX2 Nehalem it refuses to start, and so does a build for this
//! machine's CPU (on a Haswell too, when this machine has AVX-512) — one line naming the missing
//! feature, exit status 6, never an illegal instruction. qemu-user is installed by
//! scripts/setup.sh.
#![cfg(target_arch = "x86_64")]

mod common;

use common::{fixture, kiln};
use std::path::Path;
use std::process::{Command, Output};

/// stderr without qemu's own warnings about CPU features its emulator leaves out.
fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .filter(|l| !l.starts_with("qemu-x86_64: warning"))
        .map(|l| format!("{l}\n"))
        .collect()
}

fn under_qemu(cpu: &str, exe: &Path, input: &Path) -> Output {
    Command::new("qemu-x86_64")
        .args(["-cpu", cpu])
        .arg(exe)
        .arg("--input")
        .arg(format!("input={}", input.display()))
        .output()
        .expect("qemu-x86_64 runs (scripts/setup.sh installs qemu-user)")
}

fn assert_refused(o: &Output, what: &str, feature: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(6), "{what}: {err}");
    assert_eq!(err.lines().count(), 1, "{what}: {err}");
    assert!(err.contains(&format!("a CPU with {feature}")), "{what}: {err}");
}

fn host_has_avx512() -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| c.contains(" avx512f"))
}

#[test]
fn older_cpus_run_the_portable_artifact_or_are_told_what_they_lack() {
    let fx = fixture("resnet_basic_tiny");
    let input = fx.join("inputs/input.npy");
    let dir = tempfile::tempdir().unwrap();
    let (portable, native) = (dir.path().join("portable"), dir.path().join("native"));
    for (exe, cpu) in [(&portable, "portable"), (&native, "native")] {
        let o = kiln()
            .args(["compile", "-q", "--cpu", cpu])
            .arg(fx.join("model.onnx"))
            .arg("-o")
            .arg(exe)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }

    // Haswell: AVX2 and FMA, no AVX-512. The portable executable runs its x86-64-v3 kernels.
    let out = dir.path().join("out");
    let o = Command::new("qemu-x86_64")
        .args(["-cpu", "Haswell"])
        .arg(&portable)
        .arg("--input")
        .arg(format!("input={}", input.display()))
        .arg("--output-dir")
        .arg(&out)
        .arg("-q")
        .output()
        .expect("qemu-x86_64 runs");
    assert!(o.status.success(), "{}", stderr(&o));
    let got = kiln_frontend::npy::read_npy(&out.join("logits.npy"))
        .unwrap()
        .to_f64_vec();
    let want = kiln_frontend::npy::read_npy(&fx.join("expected/logits.npy"))
        .unwrap()
        .to_f64_vec();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-4 + 1e-4 * w.abs(), "{got:?} vs {want:?}");
    }

    // Nehalem: no AVX2. Both refuse, before anything else runs.
    assert_refused(
        &under_qemu("Nehalem", &portable, &input),
        "portable on Nehalem",
        "avx2",
    );
    assert_refused(
        &under_qemu("Nehalem", &native, &input),
        "native on Nehalem",
        "avx2",
    );
    if host_has_avx512() {
        assert_refused(
            &under_qemu("Haswell", &native, &input),
            "native on Haswell",
            "avx512",
        );
    }
}
