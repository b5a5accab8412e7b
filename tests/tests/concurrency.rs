//! A model compiled as a static library, run from 6 threads at once with one context each
//! (tests/c/concurrency.c): every run on every thread gives exactly the single-threaded result
//! for its inputs, and those results match the fixture's recorded outputs and the reference
//! interpreter.

use kiln_ir::{Tensor, TensorData};
use kiln_tests::compare::compare;
use kiln_tests::compiled::{compile_graph, WorkDir};
use kiln_tests::fixtures::load_manifest;
use kiln_tests::staticlib::build_c_program;
use std::process::Command;

const THREADS: usize = 6;
const ITERS: usize = 40;
const SETS: usize = 4;

/// Input set `k`: the fixture's inputs with float inputs scaled and shifted, so that each set
/// has its own outputs (a run that read another thread's inputs or context would show).
fn variant(t: &Tensor, k: usize) -> Tensor {
    let mut t = t.clone();
    if let TensorData::F32(v) = t.data_mut() {
        let (scale, shift) = (1.0 + 0.25 * k as f32, 0.05 * k as f32);
        for x in v.iter_mut() {
            *x = *x * scale + shift;
        }
    }
    t
}

fn check_fixture(name: &str) {
    let fixture = load_manifest()
        .unwrap()
        .into_iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no fixture '{name}'"));
    let model = fixture.load().unwrap();
    let graph = &model.graph;
    let mut inputs = fixture.read_inputs().unwrap();
    let ordered: Vec<Tensor> = graph
        .input_types()
        .map(|(n, _)| {
            inputs
                .remove(n)
                .unwrap_or_else(|| panic!("{name}: no input '{n}'"))
        })
        .collect();

    let work = WorkDir::new(&format!("concurrency-{name}"));
    let dir = &work.0;
    compile_graph(graph, name, kiln_codegen::Emit::StaticLib, &dir.join(name)).unwrap();
    let exe = dir.join("concurrency");
    build_c_program(
        &[&kiln_tests::repo_root().join("tests/c/concurrency.c")],
        &[
            format!("KILN_HEADER=\"{name}.h\""),
            format!("KILN_API(x)={name}_##x"),
        ],
        dir,
        &[&dir.join(format!("lib{name}.a"))],
        &exe,
    )
    .unwrap();

    let sets: Vec<Vec<Tensor>> = (0..SETS)
        .map(|k| ordered.iter().map(|t| variant(t, k)).collect())
        .collect();
    for (s, set) in sets.iter().enumerate() {
        for (i, t) in set.iter().enumerate() {
            std::fs::write(dir.join(format!("in{s}_{i}.bin")), t.to_le_bytes()).unwrap();
        }
    }
    let out_types: Vec<_> = graph
        .outputs()
        .iter()
        .map(|o| graph.value_type(o.value).clone())
        .collect();
    let mut cmd = Command::new(&exe);
    cmd.arg(dir).args([THREADS, ITERS, SETS].map(|n| n.to_string()));
    cmd.args(ordered.iter().map(|t| t.size_bytes().to_string()))
        .arg("--");
    cmd.args(out_types.iter().map(|t| t.size_bytes().unwrap().to_string()));
    let o = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{name}: concurrent runs differ or fail: {stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        stdout.trim(),
        format!("runs {} mismatches 0 failures 0", THREADS * ITERS)
    );

    let recorded = fixture.read_expected().unwrap();
    let mut first_outputs = vec![];
    for (s, set) in sets.iter().enumerate() {
        let want = kiln_ir::eval::eval_graph(graph, set.clone()).unwrap();
        for (o, ty) in out_types.iter().enumerate() {
            let bytes = std::fs::read(dir.join(format!("ref{s}_{o}.bin"))).unwrap();
            let got = Tensor::from_le_bytes(ty.dtype, ty.fixed_shape().unwrap(), &bytes).unwrap();
            compare(&want[o], &got)
                .unwrap_or_else(|e| panic!("{name}: set {s}, output {o} vs the interpreter: {e}"));
            if s == 0 {
                let out_name = &graph.outputs()[o].name;
                compare(&recorded[out_name], &got)
                    .unwrap_or_else(|e| panic!("{name}: output '{out_name}' vs onnxruntime: {e}"));
                first_outputs.push(bytes);
            } else if o == 0 {
                assert_ne!(
                    first_outputs[0], bytes,
                    "{name}: input sets 0 and {s} give the same output"
                );
            }
        }
    }
}

#[test]
fn convnet_from_many_threads() {
    check_fixture("resnet_basic_tiny");
}

#[test]
fn recurrent_model_from_many_threads() {
    check_fixture("lstm");
}
