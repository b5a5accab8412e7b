//! GELU (erf form) compiled two ways, against the f64 GELU of the reference interpreter: as a
//! kernel of its own (the kernel library's elementwise loop) and as the epilogue of the
//! product that feeds it (generated code). Both evaluate 0.5·x·(1 + erf(x/√2)) with the same
//! rational erf, so they must both stay within the bound kiln documents for it: an absolute
//! error below 4e-7 + 3e-7·|x| (a few ulps where GELU(x) ≈ x; where erf nears -1 the
//! cancellation in 1 + erf leaves an absolute, not relative, error, as in every f32 GELU that
//! forms 1 + erf), and never the wrong sign.

use kiln_ir::{DType, Graph, Op, Tensor, TensorType, Unary};
use kiln_tests::compiled::{compile_graph, run_executable, WorkDir};

const GELU: Op = Op::Unary(Unary::Gelu { tanh: false });

/// x from -12 to 12 in steps of 1/512, plus the values where the erf is clamped or saturates.
fn inputs() -> Vec<f32> {
    let mut x: Vec<f32> = (-12 * 512..=12 * 512).map(|i| i as f32 / 512.0).collect();
    x.extend([5.656_854, -5.656_854, 5.7, -5.7, 1e-30, -1e-30, 3e4, -3e4]);
    x.resize(x.len().div_ceil(8) * 8, 0.5);
    x
}

fn check(what: &str, x: &[f32], got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for ((&x, &g), &w) in x.iter().zip(got).zip(want) {
        let bound = 4e-7 + 3e-7 * x.abs();
        assert!(
            (g - w).abs() <= bound,
            "{what}: GELU({x}) = {g}, want {w} (error {:e}, bound {bound:e})",
            (g - w).abs()
        );
        assert!(
            (x >= 0.0 && g >= 0.0) || (x < 0.0 && g <= 0.0),
            "{what}: GELU({x}) = {g} has the wrong sign"
        );
    }
}

#[test]
fn gelu_alone_and_as_an_epilogue_within_the_documented_error() {
    let x = inputs();
    let n = x.len();
    let mut g = Graph::new("gelu");
    // Alone: Gelu over x as a [1, n] row.
    let row = g.add_input("x", TensorType::fixed(DType::F32, &[1, n]));
    let alone = g.add("gelu_alone", GELU, vec![Some(row)], "alone").unwrap();
    g.add_output("alone", alone);
    // As an epilogue: [x, 0] · [[1…], [0…]] reproduces x exactly in every column, then Gelu.
    let pairs = g.add_input("pairs", TensorType::fixed(DType::F32, &[n, 2]));
    let mut ones = vec![1.0f32; 8];
    ones.extend([0.0f32; 8]);
    let b = g.add_const("b", Tensor::from_vec(vec![2, 8], ones));
    let prod = g
        .add("mm", Op::MatMul, vec![Some(pairs), Some(b)], "prod")
        .unwrap();
    let fused = g.add("gelu_fused", GELU, vec![Some(prod)], "fused").unwrap();
    g.add_output("fused", fused);

    let row_t = Tensor::from_vec(vec![1, n], x.clone());
    let pairs_t = Tensor::from_vec(vec![n, 2], x.iter().flat_map(|&v| [v, 0.0]).collect::<Vec<f32>>());
    let want = kiln_ir::eval::eval_graph(&g, vec![row_t.clone(), pairs_t.clone()]).unwrap();

    let work = WorkDir::new("gelu");
    let exe = work.0.join("model");
    let summary = compile_graph(&g, "gelu", kiln_codegen::Emit::Exe, &exe).unwrap();
    assert_eq!(
        summary.kernels, 2,
        "the product carries its Gelu as an epilogue: {:#?}",
        summary.kernel_lines
    );
    let feeds = [("x".to_string(), row_t), ("pairs".to_string(), pairs_t)];
    for threads in [1, 2] {
        let got = run_executable(&exe, &g, &feeds, &work.0, threads).unwrap();
        let alone_got = got[0].as_slice::<f32>().unwrap();
        check("alone", &x, alone_got, want[0].as_slice::<f32>().unwrap());
        let fused_got = got[1].as_slice::<f32>().unwrap();
        let fused_want = want[1].as_slice::<f32>().unwrap();
        for col in 0..8 {
            let got_col: Vec<f32> = (0..n).map(|r| fused_got[r * 8 + col]).collect();
            let want_col: Vec<f32> = (0..n).map(|r| fused_want[r * 8 + col]).collect();
            check(&format!("epilogue, column {col}"), &x, &got_col, &want_col);
        }
    }
}
