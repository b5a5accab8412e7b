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

/// GatherElements by run-time indices, along the last axis (the row-by-row kernel) and along
/// another (the general one): the executable matches the interpreter, and an index out of range
/// — a negative one wraps — fails the run with the node and the index named, never a crash or a
/// read outside the data.
#[test]
fn gather_elements_checks_its_run_time_indices() {
    use kiln_ir::{DType, Graph, Op, TensorType};
    let w = WorkDir::new("gather_elements");
    for axis in [2i64, 1] {
        let mut g = Graph::new("g");
        let data = g.add_input("data", TensorType::fixed(DType::F32, &[2, 3, 5]));
        let idx = g.add_input("idx", TensorType::fixed(DType::I64, &[2, 3, 4]));
        let y = g
            .add(
                "pick",
                Op::GatherElements { axis },
                vec![Some(data), Some(idx)],
                "y",
            )
            .unwrap();
        g.add_output("y", y);
        let exe = w.0.join(format!("ge{axis}"));
        compile_graph(&g, "ge", Emit::Exe, &exe).unwrap();
        let extent = if axis == 2 { 5 } else { 3 };
        let x = Tensor::from_vec(
            vec![2, 3, 5],
            (0..30).map(|i| i as f32 * 0.5).collect::<Vec<f32>>(),
        );
        let good: Vec<i64> = (0..24).map(|i| (i * 7 % (2 * extent)) - extent).collect();
        let bad: Vec<i64> = good
            .iter()
            .enumerate()
            .map(|(i, &v)| if i == 17 { extent } else { v })
            .collect();
        let (xp, gp, bp, out) = (
            w.0.join("x.npy"),
            w.0.join("good.npy"),
            w.0.join("bad.npy"),
            w.0.join("out"),
        );
        kiln_frontend::npy::write_npy(&xp, &x).unwrap();
        kiln_frontend::npy::write_npy(&gp, &Tensor::from_vec(vec![2, 3, 4], good.clone())).unwrap();
        kiln_frontend::npy::write_npy(&bp, &Tensor::from_vec(vec![2, 3, 4], bad)).unwrap();
        let arg = |name: &str, p: &Path| format!("{name}={}", p.display());
        let (code, err) = run(
            &exe,
            &[
                "-i".into(),
                arg("data", &xp),
                "-i".into(),
                arg("idx", &gp),
                "-o".into(),
                out.display().to_string(),
            ],
        );
        assert_eq!(code, 0, "axis {axis}: {err}");
        let want =
            kiln_ir::eval::eval_graph(&g, vec![x.clone(), Tensor::from_vec(vec![2, 3, 4], good)]).unwrap();
        let got = kiln_frontend::npy::read_npy(&out.join("y.npy")).unwrap();
        assert_eq!(got, want[0], "axis {axis}");
        let (code, err) = run(
            &exe,
            &["-i".into(), arg("data", &xp), "-i".into(), arg("idx", &bp)],
        );
        assert_ne!(code, 0, "axis {axis}: an out-of-range index must fail the run");
        assert!(
            err.contains("pick") && err.contains(&format!("index {extent} out of range")),
            "axis {axis}: {err}"
        );
        assert!(
            !err.contains("panicked") && err.lines().count() == 1,
            "axis {axis}: {err}"
        );
    }
}
