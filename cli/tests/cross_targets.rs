//! Executables for another architecture are linked with that architecture's C toolchain: `$CC`
//! when it targets it, else `aarch64-linux-gnu-gcc`; with neither, one line naming the package
//! to install and exit status 4, and nothing written. (`tests/tests/aarch64.rs` runs what they
//! compute under qemu.)
#![cfg(target_arch = "x86_64")]

mod common;

use common::{fixture, kiln};
use std::process::Output;

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// ELF `e_machine` of the file: 183 is aarch64, 62 x86-64.
fn elf_machine(path: &std::path::Path) -> u16 {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..4], b"\x7fELF", "{} is not an ELF file", path.display());
    u16::from_le_bytes([bytes[18], bytes[19]])
}

#[test]
fn aarch64_executable_is_linked_with_the_cross_toolchain_even_when_cc_is_the_hosts() {
    let tmp = tempfile::tempdir().unwrap();
    let exe = tmp.path().join("m");
    let o = kiln()
        .env("CC", "cc")
        .arg("compile")
        .arg(fixture("resnet_basic_tiny").join("model.onnx"))
        .args(["--target-triple", "aarch64-linux-gnu", "-q", "-o"])
        .arg(&exe)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(elf_machine(&exe), 183, "not an aarch64 executable");
}

#[test]
fn missing_cross_toolchain_is_one_line_naming_the_package() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("bin");
    std::fs::create_dir(&empty).unwrap();
    for emit in ["exe", "sharedlib"] {
        let out = tmp.path().join(format!("out-{emit}"));
        let o = kiln()
            .env("PATH", &empty)
            .env_remove("CC")
            .arg("compile")
            .arg(fixture("resnet_basic_tiny").join("model.onnx"))
            .args(["--target-triple", "aarch64-linux-gnu", "-q", "--emit", emit, "-o"])
            .arg(&out)
            .output()
            .unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(4), "{emit}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{emit}: {err}");
        assert!(err.contains("install gcc-aarch64-linux-gnu"), "{emit}: {err}");
        let written: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(
            written,
            vec![std::ffi::OsString::from("bin")],
            "{emit}: files were written"
        );
    }
    // An object needs no toolchain.
    let obj = tmp.path().join("m.o");
    let o = kiln()
        .env("PATH", &empty)
        .env_remove("CC")
        .arg("compile")
        .arg(fixture("resnet_basic_tiny").join("model.onnx"))
        .args([
            "--target-triple",
            "aarch64-linux-gnu",
            "-q",
            "--emit",
            "obj",
            "-o",
        ])
        .arg(&obj)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(elf_machine(&obj), 183);
}
