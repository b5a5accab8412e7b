//! `kiln compile --weights-out`: the weights in a separate safetensors file that the artifact
//! maps at start. Results match the embedded build; files from another model or build, and
//! truncated or corrupted files, are refused; a file written by recompiling with new weight
//! values runs in the old executable; a C program uses the static library's
//! NAME_create_with_weights.

use kiln_ir::Tensor;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn kiln() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
}

fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/models")
        .join(name)
}

fn compile(model: &Path, out: &Path, extra: &[&str]) {
    let o = kiln()
        .arg("compile")
        .arg(model)
        .arg("-o")
        .arg(out)
        .arg("--quiet")
        .args(extra)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "kiln compile {} {extra:?} failed: {}",
        model.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}

fn run_in(exe: &Path, cwd: &Path, input: &Path, out_dir: &Path, extra: &[&str]) -> Output {
    Command::new(exe)
        .current_dir(cwd)
        .arg("--input")
        .arg(input)
        .arg("--output-dir")
        .arg(out_dir)
        .arg("--quiet")
        .args(extra)
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn succeeded(o: &Output) -> bool {
    if !o.status.success() {
        eprintln!("failed: {}", stderr(o));
    }
    o.status.success()
}

/// `|a - e| <= 1e-5 + 1e-4 |e|`, the project's f32 tolerance.
fn assert_close(expected: &Tensor, actual: &Tensor) {
    assert_eq!(expected.shape(), actual.shape());
    for (i, (e, a)) in expected.to_f64_vec().iter().zip(actual.to_f64_vec()).enumerate() {
        assert!(
            (a - e).abs() <= 1e-5 + 1e-4 * e.abs(),
            "element {i}: expected {e}, got {a}"
        );
    }
}

fn read(p: &Path) -> Tensor {
    kiln_frontend::npy::read_npy(p).unwrap()
}

/// The JSON header and the data offset of a safetensors file.
fn safetensors_header(bytes: &[u8]) -> (Value, usize) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (serde_json::from_slice(&bytes[8..8 + n]).unwrap(), 8 + n)
}

fn expect_refused(o: &Output, words: &[&str]) {
    assert!(!o.status.success(), "a bad weights file was accepted");
    let e = stderr(o);
    assert_eq!(e.trim().lines().count(), 1, "not one line: {e}");
    for w in words {
        assert!(e.contains(w), "'{w}' not in: {e}");
    }
}

#[test]
fn external_weights_match_reference_and_bad_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let fx = fixture_dir("resnet_basic_tiny");
    let model = fx.join("model.onnx");
    let input = fx.join("inputs/input.npy");
    let expected = read(&fx.join("expected/logits.npy"));
    std::fs::create_dir_all(d.join("bin")).unwrap();
    let exe = d.join("bin/net");
    let weights = d.join("bin/net.safetensors");
    compile(
        &model,
        &exe,
        &["--name", "net", "--weights-out", weights.to_str().unwrap()],
    );
    let embedded = d.join("embedded");
    compile(&model, &embedded, &["--name", "net"]);

    // A valid safetensors file: one U8 tensor, the metadata, data 64-byte aligned.
    let bytes = std::fs::read(&weights).unwrap();
    let (header, data_at) = safetensors_header(&bytes);
    assert_eq!(data_at % 64, 0);
    let meta = &header["__metadata__"];
    assert_eq!(meta["kiln.model"], "net");
    for k in ["kiln.version", "kiln.layout_hash", "kiln.content_hash"] {
        assert!(meta[k].is_string(), "{k} missing: {header}");
    }
    let blob_bytes: u64 = meta["kiln.bytes"].as_str().unwrap().parse().unwrap();
    assert_eq!(bytes.len() as u64, data_at as u64 + blob_bytes);
    let tensors = kiln_frontend::weights::read_safetensors(&weights).unwrap();
    assert_eq!(tensors.len(), 1);
    assert_eq!(tensors[0].1.shape(), &[blob_bytes as usize]);

    // The executable shrinks by about the weights' size (the linker pads each segment to a
    // 4 KiB page, so a few pages either way).
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    let saved = size(&embedded) as i64 - size(&exe) as i64;
    assert!(
        (saved - blob_bytes as i64).abs() <= 4 * 4096,
        "embedded {} B, external {} B, weights {blob_bytes} B",
        size(&embedded),
        size(&exe)
    );

    // Found next to the executable (run from elsewhere), and given with --weights.
    let out = d.join("out1");
    assert!(succeeded(&run_in(&exe, d, &input, &out, &[])));
    assert_close(&expected, &read(&out.join("logits.npy")));
    let out = d.join("out2");
    let w = weights.to_str().unwrap();
    assert!(succeeded(&run_in(&exe, d, &input, &out, &["--weights", w])));
    assert_close(&expected, &read(&out.join("logits.npy")));
    let out_embedded = d.join("out3");
    assert!(succeeded(&run_in(&embedded, d, &input, &out_embedded, &[])));
    assert_eq!(
        std::fs::read(out.join("logits.npy")).unwrap(),
        std::fs::read(out_embedded.join("logits.npy")).unwrap(),
        "external weights give other results than embedded ones"
    );
    // Found in the current directory when it is not next to the executable.
    let moved = d.join("net.safetensors");
    std::fs::rename(&weights, &moved).unwrap();
    assert!(succeeded(&run_in(&exe, d, &input, &d.join("out4"), &[])));
    // Missing: one line, non-zero exit.
    let elsewhere = d.join("bin");
    let o = run_in(&exe, &elsewhere, &input, &d.join("out5"), &[]);
    expect_refused(&o, &["cannot find the weights file net.safetensors", "--weights"]);
    let o = run_in(
        &embedded,
        d,
        &input,
        &d.join("out6"),
        &["--weights", moved.to_str().unwrap()],
    );
    expect_refused(&o, &["built in"]);
    assert_eq!(o.status.code(), Some(2));
    let good = std::fs::read(&moved).unwrap();

    // Another model's file.
    let other = d.join("other.safetensors");
    compile(
        &fixture_dir("conv_basic").join("model.onnx"),
        &d.join("other"),
        &["--weights-out", other.to_str().unwrap()],
    );
    let try_file = |bytes: &[u8]| -> Output {
        let p = d.join("try.safetensors");
        std::fs::write(&p, bytes).unwrap();
        run_in(
            &exe,
            d,
            &input,
            &d.join("out7"),
            &["--weights", p.to_str().unwrap()],
        )
    };
    let o = try_file(&std::fs::read(&other).unwrap());
    expect_refused(
        &o,
        &[
            "try.safetensors",
            "written for the model 'conv_basic', not 'net'",
            "layout hash",
        ],
    );

    // Another build of the same model (other layout): same name, other layout hash.
    let nchw = d.join("nchw.safetensors");
    compile(
        &model,
        &d.join("net_nchw"),
        &[
            "--name",
            "net",
            "--layout",
            "nchw",
            "--weights-out",
            nchw.to_str().unwrap(),
        ],
    );
    let o = try_file(&std::fs::read(&nchw).unwrap());
    expect_refused(
        &o,
        &[
            "another build of the model 'net'",
            "recompile or pass the matching file",
        ],
    );

    // Truncated, corrupted, not a weights file at all.
    expect_refused(&try_file(&good[..good.len() - 100]), &["truncated"]);
    expect_refused(&try_file(&good[..4]), &["not a safetensors file"]);
    let mut bad = good.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    expect_refused(&try_file(&bad), &["corrupt"]);
    expect_refused(&try_file(b"{\"not\": \"weights\"}"), &["not a safetensors file"]);
    // A header rewritten without kiln's padding puts the data off its alignment.
    let (mut h, at) = safetensors_header(&good);
    h["__metadata__"]["x"] = "y".into();
    let mut json = h.to_string();
    if (8 + json.len()) % 64 == 0 {
        json.push(' ');
    }
    let mut moved_data = (json.len() as u64).to_le_bytes().to_vec();
    moved_data.extend_from_slice(json.as_bytes());
    moved_data.extend_from_slice(&good[at..]);
    expect_refused(&try_file(&moved_data), &["not a multiple of 64"]);
    // The good file still works after all that.
    assert!(succeeded(&try_file(&good)));
}

/// Writes a copy of a safetensors file with every float32 value changed.
fn scaled_weights(src: &Path, dst: &Path) {
    let mut bytes = std::fs::read(src).unwrap();
    let (header, at) = safetensors_header(&bytes);
    for (name, t) in header.as_object().unwrap() {
        if name == "__metadata__" || t["dtype"] != "F32" {
            continue;
        }
        let off = t["data_offsets"].as_array().unwrap();
        let (b, e) = (
            off[0].as_u64().unwrap() as usize,
            off[1].as_u64().unwrap() as usize,
        );
        for c in bytes[at + b..at + e].chunks_exact_mut(4) {
            let x = f32::from_le_bytes(c.try_into().unwrap());
            c.copy_from_slice(&(0.5 * x + 0.01).to_le_bytes());
        }
    }
    std::fs::write(dst, bytes).unwrap();
}

#[test]
fn new_weights_run_in_the_old_executable() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let fx = fixture_dir("weights_safetensors");
    let model = fx.join("model.onnx");
    let input = fx.join("inputs/input.npy");
    let w1 = fx.join("weights.safetensors");
    let w2 = d.join("new_values.safetensors");
    scaled_weights(&w1, &w2);
    let arg = |p: &Path| p.to_str().unwrap().to_string();
    let (f1, f2) = (d.join("v1.safetensors"), d.join("v2.safetensors"));
    let exe = d.join("model");
    compile(
        &model,
        &exe,
        &["--weights", &arg(&w1), "--weights-out", &arg(&f1)],
    );
    // The new values, compiled again: only the weights file is kept.
    compile(
        &model,
        &d.join("ignored"),
        &["--weights", &arg(&w2), "--weights-out", &arg(&f2)],
    );
    // What the new model computes, from a build with the new weights embedded.
    let fresh = d.join("fresh");
    compile(&model, &fresh, &["--weights", &arg(&w2)]);

    let header = |p: &Path| safetensors_header(&std::fs::read(p).unwrap()).0["__metadata__"].clone();
    let (m1, m2) = (header(&f1), header(&f2));
    assert_eq!(m1["kiln.layout_hash"], m2["kiln.layout_hash"]);
    assert_ne!(m1["kiln.content_hash"], m2["kiln.content_hash"]);

    let o = run_in(&exe, d, &input, &d.join("old"), &["--weights", &arg(&f1)]);
    assert!(succeeded(&o));
    let o = run_in(&exe, d, &input, &d.join("new"), &["--weights", &arg(&f2)]);
    assert!(succeeded(&o));
    let o = run_in(&fresh, d, &input, &d.join("fresh_out"), &[]);
    assert!(succeeded(&o));
    let old = std::fs::read(d.join("old/logits.npy")).unwrap();
    let new = std::fs::read(d.join("new/logits.npy")).unwrap();
    assert_ne!(old, new, "the new weights changed nothing");
    assert_eq!(new, std::fs::read(d.join("fresh_out/logits.npy")).unwrap());
    assert_close(
        &read(&fx.join("expected/logits.npy")),
        &read(&d.join("old/logits.npy")),
    );
}

#[test]
fn static_library_creates_with_weights() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let fx = fixture_dir("resnet_basic_tiny");
    let weights = d.join("net.safetensors");
    compile(
        &fx.join("model.onnx"),
        &d.join("net"),
        &[
            "--emit",
            "staticlib",
            "--name",
            "net",
            "--weights-out",
            weights.to_str().unwrap(),
        ],
    );
    let h = std::fs::read_to_string(d.join("net.h")).unwrap();
    assert!(h.contains("net_ctx *net_create_with_weights(const char *weights_path, int32_t num_threads);"));
    let input = read(&fx.join("inputs/input.npy"));
    let expected = read(&fx.join("expected/logits.npy"));
    std::fs::write(d.join("input.bin"), input.to_le_bytes()).unwrap();
    let app = r#"
#include "net.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  (void)argc;
  /* Plain create has no weights: refused, with the function to use. */
  if (net_create(1) != NULL) return 10;
  if (!strstr(net_last_error(NULL), "net_create_with_weights")) return 11;
  if (net_create_with_weights("/nonexistent/net.safetensors", 1) != NULL) return 12;
  if (!strstr(net_last_error(NULL), "cannot open the weights file")) return 13;
  /* A NULL path is named as such, not taken for "no weights file". */
  if (net_create_with_weights(NULL, 1) != NULL) return 20;
  if (!strstr(net_last_error(NULL), "weights_path is NULL")) return 21;
  static float in[4096], out[4096];
  FILE *f = fopen(argv[2], "rb");
  if (!f) return 14;
  size_t n = fread(in, 1, sizeof in, f);
  fclose(f);
  if (n == 0) return 15;
  /* Two contexts map the file independently. */
  net_ctx *a = net_create_with_weights(argv[1], 2), *b = net_create_with_weights(argv[1], 1);
  if (!a || !b) {
    fprintf(stderr, "%s\n", net_last_error(NULL));
    return 16;
  }
  float out2[4096];
  if (net_run_generic(a, (const void *const[]){in}, (void *const[]){out}) != 0) return 17;
  if (net_run_generic(b, (const void *const[]){in}, (void *const[]){out2}) != 0) return 18;
  net_destroy(a);
  net_destroy(b);
  for (int i = 0; i < 10; i++) printf("%.9g\n", out[i]);
  return memcmp(out, out2, 10 * sizeof(float)) == 0 ? 0 : 19;
}
"#;
    std::fs::write(d.join("app.c"), app).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let o = Command::new(&cc)
        .current_dir(d)
        .args([
            "-std=c11",
            "-Wall",
            "-Werror",
            "app.c",
            "libnet.a",
            "-o",
            "app",
            "-lpthread",
            "-lm",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "cc: {}", stderr(&o));
    let o = Command::new(d.join("app"))
        .arg(&weights)
        .arg(d.join("input.bin"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "app failed: {}", stderr(&o));
    let got: Vec<f32> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_close(&expected, &Tensor::from_vec(expected.shape().to_vec(), got));
}
