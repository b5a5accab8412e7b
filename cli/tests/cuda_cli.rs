//! `kiln compile --target cuda` on the command line: usage errors for options that need or
//! exclude the CUDA target, unknown compute capabilities, the default PTX file name and a
//! libdevice that is not where `KILN_LIBDEVICE` says.

mod common;
use common::*;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn scratch(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-cuda-cli-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn emit_ptx_without_cuda_target_is_a_usage_error() {
    let dir = scratch("ptx-cpu");
    let out = kiln()
        .args(["compile", "--emit", "ptx", "-q"])
        .arg(fixture("gemm_opset11").join("model.onnx"))
        .current_dir(&dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--emit ptx needs --target cuda"),
        "{}",
        stderr(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unknown_sm_lists_the_known_ones() {
    let dir = scratch("sm61");
    let out = kiln()
        .args(["compile", "--target", "cuda", "--sm", "61", "--emit", "ptx", "-q"])
        .arg(fixture("gemm_opset11").join("model.onnx"))
        .current_dir(&dir)
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(!out.status.success(), "--sm 61 was accepted");
    assert!(
        err.contains("--sm 61") && err.contains("known: 70, 75, 80, 86, 89, 90"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "not a one-line error: {err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sm_with_cpu_target_is_a_usage_error() {
    let dir = scratch("sm-cpu");
    let out = kiln()
        .args(["compile", "--target", "cpu", "--sm", "80", "-q"])
        .arg(fixture("gemm_opset11").join("model.onnx"))
        .current_dir(&dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--sm applies to --target cuda"),
        "{}",
        stderr(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn emit_ptx_writes_name_dot_ptx() {
    let dir = scratch("ptx-name");
    let out = kiln()
        .args(["compile", "--target", "cuda", "--emit", "ptx", "-q"])
        .arg(fixture("gemm_opset11").join("model.onnx"))
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let ptx = std::fs::read_to_string(dir.join("gemm_opset11.ptx")).expect("gemm_opset11.ptx written");
    assert!(ptx.contains(".entry"), "no kernel entry in the PTX");
    assert!(ptx.contains(".target sm_80"), "not PTX for the default sm_80");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--precision tf32` puts f32 products on TF32 tensor cores (`mma.m16n8k8 ... tf32`); without
/// it they stay f32 SIMT. It is a usage error on a CPU target and below sm_80.
#[test]
fn precision_tf32_uses_tf32_tensor_cores() {
    let dir = scratch("tf32");
    let model = fixture("bert_tiny").join("model.onnx");
    let compile = |extra: &[&str]| {
        kiln()
            .args(["compile", "-q"])
            .args(extra)
            .arg(&model)
            .current_dir(&dir)
            .output()
            .unwrap()
    };
    let tf32_mma = "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32";
    for (extra, tf32) in [
        (
            &["--target", "cuda", "--emit", "ptx", "--precision", "tf32"][..],
            true,
        ),
        (&["--target", "cuda", "--emit", "ptx"][..], false),
    ] {
        let out = compile(extra);
        assert!(out.status.success(), "{}", stderr(&out));
        let ptx = std::fs::read_to_string(dir.join("bert_tiny.ptx")).unwrap();
        assert_eq!(ptx.contains(tf32_mma), tf32, "{extra:?}");
    }
    for (extra, message) in [
        (
            &["--precision", "tf32"][..],
            "--precision tf32 runs products on a GPU's TF32 tensor cores",
        ),
        (
            &["--target", "cuda", "--sm", "75", "--precision", "tf32"][..],
            "sm_80 or later",
        ),
    ] {
        let out = compile(extra);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(message), "{}", stderr(&out));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Sin and Cos run in a generated elementwise kernel that calls libdevice's double-precision
/// sin and cos, so the compile must find libdevice.
#[test]
fn missing_libdevice_is_named() {
    let dir = scratch("libdevice");
    let out = kiln()
        .args(["compile", "--target", "cuda", "--emit", "ptx", "-q"])
        .arg(fixture("elementwise_unary_misc").join("model.onnx"))
        .env("KILN_LIBDEVICE", "/nonexistent/libdevice.10.bc")
        .current_dir(&dir)
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(!out.status.success(), "compiled without libdevice");
    assert!(
        err.contains("KILN_LIBDEVICE=/nonexistent/libdevice.10.bc: no such file")
            && err.contains("libdevice"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "not a one-line error: {err}");
    assert!(
        !dir.join("elementwise_unary_misc.ptx").exists(),
        "PTX written despite the error"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A node without a GPU kernel (an int64 MatMul) is refused for the GPU, named, with the flag
/// that accepts it as a C library kernel on one GPU block; with the flag the model compiles;
/// `explain` points at the flag.
#[test]
fn a_node_without_a_gpu_kernel_needs_gpu_library_kernels() {
    use kiln_frontend::onnx::proto::{data_type, TypeValue};
    let dir = scratch("int-matmul");
    let mut m = one_node_model("MatMul", "int_matmul_node");
    let g = m.graph.as_mut().unwrap();
    g.node[0].input = vec!["x".into(), "w".into()];
    let int64 = |name: &str, dims: &[i64]| {
        let mut v = value_info(name, dims);
        if let Some(TypeValue::TensorType(t)) = v.r#type.as_mut().and_then(|t| t.value.as_mut()) {
            t.elem_type = data_type::INT64;
        }
        v
    };
    g.input = vec![int64("x", &[2, 3]), int64("w", &[3, 4])];
    g.output = vec![int64("y", &[2, 4])];
    let model = write_model(&dir, "int_matmul.onnx", &m);
    let compile = |extra: &[&str]| {
        kiln()
            .args(["compile", "--target", "cuda", "--emit", "ptx", "-q"])
            .args(extra)
            .arg(&model)
            .current_dir(&dir)
            .output()
            .unwrap()
    };
    let out = compile(&[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains("int_matmul_node")
            && err.contains("no GPU kernel")
            && err.contains("--gpu-library-kernels"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "not a one-line error: {err}");
    assert!(
        !dir.join("int_matmul.ptx").exists(),
        "a refused model left its PTX"
    );
    let out = compile(&["--gpu-library-kernels"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(dir.join("int_matmul.ptx").exists());
    // `explain` shows the plan and says what compile will ask for.
    let out = kiln()
        .args(["explain", "--target", "cuda"])
        .arg(&model)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        text.contains("1 node(s) have no GPU kernel") && text.contains("--gpu-library-kernels"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
