//! Compiled Transposes against the reference interpreter, at the sizes where the copy kernel
//! changes strategy: layout changes of whole activations (NCHW <-> NHWC of 256 channels, an RGB
//! image's 3 channels, 2 and 4 channels), one image split across threads, many images split by
//! image, and small copies that stay on one thread. A transpose moves bits, so the outputs must
//! be equal, not close.

use kiln_ir::{DType, Graph, Op, Tensor, TensorType};
use kiln_tests::compiled::{compile_graph, run_executable, WorkDir};

fn check(shape: &[usize], perm: &[usize]) {
    let mut g = Graph::new("transpose");
    let x = g.add_input("x", TensorType::fixed(DType::F32, shape));
    let y = g
        .add("t", Op::Transpose { perm: perm.to_vec() }, vec![Some(x)], "y")
        .unwrap();
    g.add_output("y", y);
    let n: usize = shape.iter().product();
    // Every element distinct, so a misplaced one shows.
    let input = Tensor::from_vec(shape.to_vec(), (0..n).map(|i| i as f32).collect::<Vec<f32>>());
    let want = kiln_ir::eval::eval_graph(&g, vec![input.clone()]).unwrap();

    let work = WorkDir::new("transpose");
    let exe = work.0.join("model");
    compile_graph(&g, "transpose", kiln_codegen::Emit::Exe, &exe).unwrap();
    for threads in [1, 2, 3] {
        let got = run_executable(&exe, &g, &[("x".into(), input.clone())], &work.0, threads).unwrap();
        assert_eq!(got[0].shape(), want[0].shape(), "{shape:?} perm {perm:?}");
        assert!(
            got[0].as_slice::<f32>().unwrap() == want[0].as_slice::<f32>().unwrap(),
            "{shape:?} perm {perm:?}, {threads} threads: outputs differ"
        );
    }
}

#[test]
fn nchw_to_nhwc() {
    check(&[1, 256, 56, 56], &[0, 2, 3, 1]);
    check(&[1, 3, 224, 224], &[0, 2, 3, 1]);
    check(&[2, 4, 120, 130], &[0, 2, 3, 1]);
    check(&[1, 2, 300, 301], &[0, 2, 3, 1]);
    check(&[16, 64, 20, 20], &[0, 2, 3, 1]);
    check(&[3, 5, 7, 9], &[0, 2, 3, 1]);
    check(&[1, 3, 5, 7], &[0, 2, 3, 1]);
}

#[test]
fn nhwc_to_nchw_and_other_perms() {
    check(&[1, 56, 56, 256], &[0, 3, 1, 2]);
    check(&[1, 224, 224, 3], &[0, 3, 1, 2]);
    check(&[2, 17, 300, 40], &[0, 3, 1, 2]);
    check(&[6, 7, 8, 9], &[3, 1, 0, 2]);
    check(&[300, 400], &[1, 0]);
}
