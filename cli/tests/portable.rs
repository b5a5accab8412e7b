//! Portable artifacts (`--cpu portable`, the default for libraries and objects on x86-64): one
//! library carries x86-64-v3 and x86-64-v4 kernels, the runtime picks one per context by CPUID
//! (or `KILN_CPU_VARIANT`), and every variant computes the fixture's outputs.
#![cfg(target_arch = "x86_64")]

mod common;

use common::{fixture, kiln};
use std::path::Path;
use std::process::{Command, Output};

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn objdump() -> &'static str {
    ["llvm-objdump-19", "llvm-objdump", "objdump"]
        .into_iter()
        .find(|c| {
            Command::new(c)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .expect("llvm-objdump or objdump")
}

/// Per function of the disassembly: (name, whether it uses zmm registers).
fn functions_using_zmm(obj: &Path) -> Vec<(String, bool)> {
    let o = Command::new(objdump())
        .args(["-d", "--no-show-raw-insn"])
        .arg(obj)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let mut fns: Vec<(String, bool)> = vec![];
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        if let Some(name) = line.strip_suffix(">:").and_then(|l| l.split_once(" <")) {
            fns.push((name.1.to_string(), false));
        } else if line.contains("zmm") {
            if let Some(last) = fns.last_mut() {
                last.1 = true;
            }
        }
    }
    fns
}

const DRIVER: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include "rn.h"
/* rn IN.bin OUT.bin: one run of the model on raw little-endian f32 input. */
int main(int argc, char **argv) {
  static float in[1 << 20], out[1 << 16];
  FILE *f = fopen(argv[1], "rb");
  size_t n = fread(in, 1, sizeof in, f);
  fclose(f);
  (void)argc;
  (void)n;
  rn_ctx *ctx = rn_create(1);
  if (!ctx) {
    fprintf(stderr, "create failed: %s\n", rn_last_error(NULL));
    return 3;
  }
  if (rn_run(ctx, in, out) != 0) return 4;
  f = fopen(argv[2], "wb");
  fwrite(out, sizeof(float), 10, f);
  fclose(f);
  rn_destroy(ctx);
  return 0;
}
"#;

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn a_static_library_is_portable_by_default_and_every_variant_matches() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let fx = fixture("resnet_bottleneck_tiny");
    let o = kiln()
        .arg("compile")
        .arg(fx.join("model.onnx"))
        .args(["--emit", "staticlib", "--name", "rn", "-o"])
        .arg(dir.join("rn"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("portable (x86-64-v3, x86-64-v4)"),
        "the summary names the variants: {}",
        stderr(&o)
    );

    // Two sets of kernels, really different code: no zmm register in the x86-64-v3 ones.
    let fns = functions_using_zmm(&dir.join("librn.a"));
    let v3: Vec<_> = fns.iter().filter(|(n, _)| n.ends_with(".x86_64_v3")).collect();
    let v4: Vec<_> = fns.iter().filter(|(n, _)| n.ends_with(".x86_64_v4")).collect();
    assert!(!v3.is_empty() && !v4.is_empty(), "variant functions: {fns:?}");
    assert!(v3.iter().all(|(_, zmm)| !zmm), "x86-64-v3 code uses zmm: {v3:?}");
    assert!(
        v4.iter().any(|(_, zmm)| *zmm),
        "no AVX-512 code in x86-64-v4: {v4:?}"
    );

    let driver = dir.join("driver.c");
    std::fs::write(&driver, DRIVER).unwrap();
    let exe = dir.join("driver");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let o = Command::new(cc)
        .arg("-o")
        .arg(&exe)
        .arg(&driver)
        .arg("-I")
        .arg(dir)
        .arg(dir.join("librn.a"))
        .args(["-lpthread", "-lm"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));

    let input = kiln_frontend::npy::read_npy(&fx.join("inputs/input.npy")).unwrap();
    let expected = kiln_frontend::npy::read_npy(&fx.join("expected/logits.npy")).unwrap();
    let expected = f32s(&expected.to_le_bytes());
    std::fs::write(dir.join("in.bin"), input.to_le_bytes()).unwrap();
    let host = kiln_codegen::TargetDesc::host().unwrap();
    let mut variants = vec![Some("x86-64-v3"), None];
    if host.isa == kiln_codegen::target::Isa::Avx512 {
        variants.push(Some("x86-64-v4"));
    }
    for v in variants {
        let mut cmd = Command::new(&exe);
        cmd.arg(dir.join("in.bin")).arg(dir.join("out.bin"));
        match v {
            Some(v) => cmd.env("KILN_CPU_VARIANT", v),
            None => cmd.env_remove("KILN_CPU_VARIANT"),
        };
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "{v:?}: {}", stderr(&o));
        let got = f32s(&std::fs::read(dir.join("out.bin")).unwrap());
        for (g, e) in got.iter().zip(&expected) {
            assert!(
                (g - e).abs() <= 1e-4 + 1e-4 * e.abs(),
                "{v:?}: {got:?} vs {expected:?}"
            );
        }
    }
    let o = Command::new(&exe)
        .arg(dir.join("in.bin"))
        .arg(dir.join("out.bin"))
        .env("KILN_CPU_VARIANT", "x86-64-v9")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no such variant (it has x86-64-v3, x86-64-v4)"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn bf16_models_carry_an_avx512_bf16_variant() {
    let tmp = tempfile::tempdir().unwrap();
    let o = kiln()
        .arg("compile")
        .arg(fixture("resnet_bottleneck_tiny").join("model.onnx"))
        .args(["--emit", "obj", "--precision", "bf16", "-o"])
        .arg(tmp.path().join("m.o"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("portable (x86-64-v3, x86-64-v4, x86-64-v4+avx512bf16)"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn portable_is_refused_where_it_cannot_apply() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fixture("resnet_bottleneck_tiny").join("model.onnx");
    let cases: &[(&[&str], &str)] = &[
        (&["--target-triple", "aarch64-linux-gnu"], "is for x86-64"),
        (&["--weights-out", "w.safetensors"], "--weights-out"),
    ];
    for (args, message) in cases {
        let o = kiln()
            .current_dir(tmp.path())
            .arg("compile")
            .arg(&model)
            .args(["--emit", "obj", "--cpu", "portable", "-q"])
            .args(*args)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(message), "{args:?}: {}", stderr(&o));
    }
}

/// A model with integer products carries an avx512_vnni variant whose products run on
/// `vpdpbusd`; every variant gives the recorded outputs (onnxruntime's) within the f32
/// tolerance. onnxruntime's dynamic quantization writes MatMulInteger; its static (QDQ)
/// quantization writes float convolutions of dequantized integers, which the VNNI variant's
/// `integer-products` pass makes integer ones and the others compute in float.
#[test]
fn integer_models_carry_an_avx512_vnni_variant() {
    check_vnni_variant(
        "bert_tiny_dynamic_int8",
        &["input_ids", "attention_mask"],
        "pooler_output",
    );
    check_vnni_variant("resnet_basic_tiny_qdq", &["input"], "logits");
}

fn check_vnni_variant(name: &str, inputs: &[&str], output: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let fx = fixture(name);
    let exe = tmp.path().join("q");
    let o = kiln()
        .arg("compile")
        .arg(fx.join("model.onnx"))
        .args(["--cpu", "portable", "-o"])
        .arg(&exe)
        .output()
        .unwrap();
    assert!(o.status.success(), "{name}: {}", stderr(&o));
    assert!(
        stderr(&o).contains("portable (x86-64-v3, x86-64-v4, x86-64-v4+avx512vnni)"),
        "{name}: {}",
        stderr(&o)
    );
    let fns = functions_using_zmm(&exe);
    assert!(
        fns.iter().any(|(n, _)| n.ends_with(".x86_64_v4_avx512vnni")),
        "{name}: no avx512vnni variant functions"
    );
    let host = kiln_codegen::TargetDesc::host().unwrap();
    let mut variants = vec!["x86-64-v3"];
    if host.isa == kiln_codegen::target::Isa::Avx512 {
        variants.push("x86-64-v4");
    }
    if host.has_int8_dot_kernels() {
        variants.push("x86-64-v4+avx512vnni");
    }
    let expected = kiln_frontend::npy::read_npy(&fx.join(format!("expected/{output}.npy"))).unwrap();
    for v in variants {
        let out = tmp.path().join(v);
        let mut cmd = Command::new(&exe);
        for i in inputs {
            cmd.arg("--input")
                .arg(format!("{i}={}", fx.join(format!("inputs/{i}.npy")).display()));
        }
        let o = cmd
            .arg("--output-dir")
            .arg(&out)
            .env("KILN_CPU_VARIANT", v)
            .output()
            .unwrap();
        assert!(o.status.success(), "{name} {v}: {}", stderr(&o));
        let got = kiln_frontend::npy::read_npy(&out.join(format!("{output}.npy"))).unwrap();
        let (got, want) = (f32s(&got.to_le_bytes()), f32s(&expected.to_le_bytes()));
        assert_eq!(got.len(), want.len(), "{name} {v}");
        for (g, e) in got.iter().zip(&want) {
            assert!((g - e).abs() <= 1e-5 + 1e-4 * e.abs(), "{name} {v}: {g} vs {e}");
        }
    }
}
