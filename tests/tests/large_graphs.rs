//! Graphs whose size used to make compilation super-linear: a Concat of thousands of inputs
//! and chains of thousands of Relus, fused and unfused. Each compiles in seconds now (it took
//! minutes); a watchdog turns a regression into a failure instead of a hung test run. The
//! compiled outputs must equal the reference interpreter's.

use kiln_ir::{DType, Graph, Op, Tensor, TensorType, Unary};
use kiln_tests::compiled::{compile_graph_without, run_executable, WorkDir};
use std::sync::mpsc;
use std::time::Duration;

/// Runs `f` on a thread of its own and fails if it takes longer than `limit`.
fn within(limit: Duration, what: &str, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(limit) {
        Ok(()) => worker.join().expect("worker"),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            // The worker panicked: report its message.
            if let Err(e) = worker.join() {
                std::panic::resume_unwind(e);
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what} took longer than {limit:?}"),
    }
}

/// Compiles `g` to an executable (with the passes in `disabled` off), runs it on `inputs` and
/// compares bit for bit with the interpreter (Relu and Concat only move or clamp values).
fn check(name: &str, g: Graph, inputs: Vec<(String, Tensor)>, disabled: &[&str]) {
    let want = kiln_ir::eval::eval_graph(&g, inputs.iter().map(|(_, t)| t.clone()).collect()).unwrap();
    let work = WorkDir::new(name);
    let exe = work.0.join("model");
    compile_graph_without(&g, name, kiln_codegen::Emit::Exe, &exe, disabled).unwrap();
    let got = run_executable(&exe, &g, &inputs, &work.0, 2).unwrap();
    assert_eq!(got[0].shape(), want[0].shape());
    assert!(
        got[0].as_slice::<f32>().unwrap() == want[0].as_slice::<f32>().unwrap(),
        "{name}: outputs differ from the interpreter's"
    );
}

fn row(i: usize) -> Tensor {
    let v: Vec<f32> = (0..4).map(|j| (i * 4 + j) as f32 - 3000.0).collect();
    Tensor::from_vec(vec![1, 4], v)
}

#[test]
fn concat_of_thousands_of_inputs() {
    within(Duration::from_secs(180), "a Concat of 2,000 inputs", || {
        let n = 2000;
        let mut g = Graph::new("concat_many");
        let ins: Vec<_> = (0..n)
            .map(|i| g.add_input(format!("x{i}"), TensorType::fixed(DType::F32, &[1, 4])))
            .collect();
        let y = g
            .add(
                "cat",
                Op::Concat { axis: 0 },
                ins.into_iter().map(Some).collect(),
                "y",
            )
            .unwrap();
        g.add_output("y", y);
        let inputs = (0..n).map(|i| (format!("x{i}"), row(i))).collect();
        check("concat_many", g, inputs, &[]);
    });
}

fn relu_chain(n: usize) -> Graph {
    let mut g = Graph::new("chain");
    let mut v = g.add_input("x", TensorType::fixed(DType::F32, &[1, 4]));
    for i in 0..n {
        v = g
            .add(
                format!("r{i}"),
                Op::Unary(Unary::Relu),
                vec![Some(v)],
                format!("t{i}"),
            )
            .unwrap();
    }
    g.add_output("y", v);
    g
}

#[test]
fn long_relu_chain_fused() {
    within(Duration::from_secs(180), "a chain of 3,000 Relus", || {
        check("chain_fused", relu_chain(3000), vec![("x".into(), row(0))], &[]);
    });
}

#[test]
fn long_relu_chain_unfused() {
    within(Duration::from_secs(180), "a chain of 2,000 unfused Relus", || {
        check(
            "chain_unfused",
            relu_chain(2000),
            vec![("x".into(), row(0))],
            &["fuse", "fuse-kernels"],
        );
    });
}
