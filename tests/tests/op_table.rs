//! The unary operator table (`ir/src/ops/unary_table.rs`) drives both the reference interpreter
//! and the C kernel library (through the operator codes generated from it). This test compiles
//! one executable holding every row of the table, in f64 (the library's double forms) and f16
//! (its f32 forms, which bf16 autocast also runs), and checks each against the interpreter: a
//! row added to the table without its C math, or with math that disagrees, fails here.

use kiln_codegen::Emit;
use kiln_ir::{DType, Graph, Op, Tensor, TensorType, Unary};
use kiln_tests::compiled::{compile_graph, run_executable, WorkDir};

/// Every operator form of the table: each row with its ONNX attribute defaults, and the forms
/// the attributes select (Gelu's tanh approximation, IsInf for one sign).
fn forms() -> Vec<Unary> {
    let mut forms = Unary::every_form();
    forms.push(Unary::IsInf {
        detect_positive: false,
        detect_negative: true,
    });
    forms.push(Unary::LeakyRelu { alpha: 0.3 });
    forms
}

/// Finite values across the interesting ranges of every function (outside a function's
/// domain both sides give NaN).
fn grid() -> Vec<f64> {
    let mut v: Vec<f64> = (-24..=24).map(|i| f64::from(i) * 0.125).collect();
    v.extend([0.01, -0.01, 1e-4, 10.0, -10.0, 0.999, -0.999]);
    v
}

fn close(got: f64, want: f64, rel: f64, abs: f64) -> bool {
    (got.is_nan() && want.is_nan()) || got == want || (got - want).abs() <= abs + rel * want.abs()
}

#[test]
fn every_unary_row_agrees_with_the_reference_in_the_kernel_library() {
    let x = grid();
    let n = x.len();
    let specials = vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, 1.5];
    let mut g = Graph::new("unary_table");
    let in64 = g.add_input("x64", TensorType::fixed(DType::F64, &[n]));
    let in16 = g.add_input("x16", TensorType::fixed(DType::F16, &[n]));
    let special = g.add_input("special", TensorType::fixed(DType::F64, &[specials.len()]));
    let boolean = g.add_input("b", TensorType::fixed(DType::Bool, &[2]));
    let int = g.add_input("i", TensorType::fixed(DType::I32, &[4]));
    for (k, u) in forms().into_iter().enumerate() {
        let operands: Vec<_> = match u.name() {
            "Not" => vec![boolean],
            "BitwiseNot" => vec![int],
            "IsNaN" | "IsInf" => vec![special, in16],
            _ => vec![in64, in16],
        };
        for (j, v) in operands.into_iter().enumerate() {
            let out = format!("{}_{k}_{j}", u.name());
            let y = g.add(&out, Op::Unary(u.clone()), vec![Some(v)], &out).unwrap();
            g.add_output(out, y);
        }
    }
    let inputs = vec![
        ("x64".to_string(), Tensor::from_vec(vec![n], x.clone())),
        ("x16".to_string(), Tensor::from_vec(vec![n], x).cast(DType::F16)),
        ("special".to_string(), Tensor::from_vec(vec![5], specials)),
        ("b".to_string(), Tensor::from_vec(vec![2], vec![true, false])),
        (
            "i".to_string(),
            Tensor::from_vec(vec![4], vec![-3i32, 0, 7, i32::MIN]),
        ),
    ];
    let want = kiln_ir::eval::eval_graph(&g, inputs.iter().map(|(_, t)| t.clone()).collect()).unwrap();
    let work = WorkDir::new("unary_table");
    let exe = work.0.join("unary_table");
    compile_graph(&g, "unary_table", Emit::Exe, &exe).unwrap();
    let got = run_executable(&exe, &g, &inputs, &work.0, 1).unwrap();

    let mut wrong = vec![];
    for ((out, got), want) in g.outputs().iter().zip(&got).zip(&want) {
        assert_eq!(got.dtype(), want.dtype(), "{}", out.name);
        // The double forms agree with the interpreter's f64 math to rounding; the f32 forms
        // (f16 outputs) to one f16 step.
        let (rel, abs) = match want.dtype() {
            DType::F16 => (1.0e-3, 1.0e-4),
            _ => (1.0e-12, 1.0e-300),
        };
        for (i, (a, b)) in got.to_f64_vec().into_iter().zip(want.to_f64_vec()).enumerate() {
            if !close(a, b, rel, abs) {
                wrong.push(format!("{}[{i}]: kernel library {a}, reference {b}", out.name));
                break;
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "C kernels disagree with the operator table:\n{}",
        wrong.join("\n")
    );
}
