//! A compiled executable validates its inputs: a wrong shape, a wrong dtype, a truncated or
//! malformed `.npy`, a missing or unknown input all fail with a message saying what was
//! expected, and a non-zero exit status — never a crash.

use kiln_codegen::Emit;
use kiln_ir::Tensor;
use kiln_tests::compiled::{compile_graph, WorkDir};
use kiln_tests::fixtures::load_manifest;
use std::path::Path;
use std::process::Command;

fn run(exe: &Path, args: &[String]) -> (i32, String) {
    let o = Command::new(exe).args(args).output().expect("run");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn executable_rejects_bad_inputs_clearly() {
    let f = load_manifest()
        .unwrap()
        .into_iter()
        .find(|f| f.name == "resnet_basic_tiny")
        .unwrap();
    let model = f.load().unwrap();
    let w = WorkDir::new("inputs");
    let exe = w.0.join("tiny");
    compile_graph(&model.graph, "tiny", Emit::Exe, &exe).unwrap();
    let good = f.read_inputs().unwrap().remove("input").unwrap();
    let shape = good.shape().to_vec();

    let wrong_shape = w.0.join("shape.npy");
    let mut s2 = shape.clone();
    s2[3] += 1;
    kiln_frontend::npy::write_npy(&wrong_shape, &Tensor::zeros(kiln_ir::DType::F32, s2)).unwrap();
    let wrong_dtype = w.0.join("dtype.npy");
    kiln_frontend::npy::write_npy(&wrong_dtype, &good.cast(kiln_ir::DType::F64)).unwrap();
    let truncated = w.0.join("trunc.npy");
    let bytes = kiln_frontend::npy::to_npy_bytes(&good);
    std::fs::write(&truncated, &bytes[..bytes.len() - 10]).unwrap();
    let garbage = w.0.join("garbage.npy");
    std::fs::write(&garbage, b"not a numpy file at all").unwrap();

    let input = |p: &Path| vec!["--input".to_string(), format!("input={}", p.display())];
    for (path, expect) in [
        (&wrong_shape, "expected f32[1,3,32,32]"),
        (&wrong_dtype, "expected f32"),
        (&truncated, "truncated"),
        (&garbage, "npy"),
    ] {
        let (code, err) = run(&exe, &input(path));
        // A bad input file is a usage error, status 2, as for kiln itself.
        assert_eq!(code, 2, "{}: {err}", path.display());
        assert!(
            err.to_lowercase().contains(&expect.to_lowercase()),
            "{}: message {err:?} lacks {expect:?}",
            path.display()
        );
        assert!(err.contains("input"), "the message names the input: {err}");
    }
    let (code, err) = run(&exe, &[]);
    assert_ne!(code, 0);
    assert!(err.contains("input"), "missing input named: {err}");
    let (code, err) = run(
        &exe,
        &["--input".into(), format!("nope={}", wrong_shape.display())],
    );
    assert_ne!(code, 0);
    assert!(err.contains("nope"), "unknown input named: {err}");
}

/// A small file whose header claims a huge shape is refused for its size before the executable
/// allocates anything that large: the address space is capped far below the 128 GiB the shape
/// needs, so an allocation first would fail as "out of memory" instead.
#[test]
fn executable_checks_file_size_before_allocating() {
    let n = 1usize << 35;
    let mut g = kiln_ir::Graph::new("huge");
    let x = g.add_input("x", kiln_ir::TensorType::fixed(kiln_ir::DType::F32, &[n]));
    let y = g
        .add("neg", kiln_ir::Op::Unary(kiln_ir::Unary::Neg), vec![Some(x)], "y")
        .unwrap();
    g.add_output("y", y);
    let w = WorkDir::new("huge_input");
    let exe = w.0.join("huge");
    compile_graph(&g, "huge", Emit::Exe, &exe).unwrap();
    // A valid header for f32[2^35] followed by 16 bytes of data.
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({n},), }}");
    header.push_str(&" ".repeat((64 - (10 + header.len() + 1) % 64) % 64));
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&[0u8; 16]);
    let file = w.0.join("claims_huge.npy");
    std::fs::write(&file, &bytes).unwrap();
    let o = Command::new("sh")
        .arg("-c")
        .arg(r#"ulimit -v 4000000 && exec "$0" --threads 1 --input "x=$1""#)
        .arg(&exe)
        .arg(&file)
        .output()
        .expect("sh");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.code().is_some_and(|c| c > 0), "{:?}: {err}", o.status);
    assert!(err.contains("truncated data"), "{err}");
    assert!(err.contains("the file has 16"), "{err}");
    assert!(!err.contains("out of memory"), "{err}");
}
