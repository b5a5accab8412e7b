//! Every fixture model compiled by kiln, as an executable and as a static library driven from
//! C (`tests/c/run_model.c`), matches the outputs onnxruntime recorded (per-dtype tolerances).
//! The `*_off` variants compile each fixture with one optimizer pass disabled (executables
//! only, to keep the cost down): every pass must be optional, and a wrong result that goes away
//! with a pass off points at that pass.

use kiln_tests::compiled::{compile_graph_without, pass_exists, run_executable, WorkDir};
use kiln_tests::fixtures::{check_fixtures, load_manifest, suite_threads, Fixture};
use kiln_tests::staticlib::compile_and_run_staticlib;

#[derive(Clone, Copy, PartialEq)]
enum Artifact {
    Executable,
    StaticLib,
}

fn check(f: &Fixture, artifact: Artifact, disabled: &[&str]) -> anyhow::Result<()> {
    let (graph, inputs) = f.prepared()?;
    let outputs = match artifact {
        Artifact::Executable => {
            let work = WorkDir::new(&f.name);
            let exe = work.0.join(&f.name);
            compile_graph_without(&graph, &f.name, kiln_codegen::Emit::Exe, &exe, disabled)
                .map_err(anyhow::Error::msg)?;
            run_executable(&exe, &graph, &inputs, &work.0, 2).map_err(anyhow::Error::msg)?
        }
        Artifact::StaticLib => {
            assert!(disabled.is_empty(), "pass-off variants compile executables only");
            let tensors: Vec<_> = inputs.into_iter().map(|(_, t)| t).collect();
            compile_and_run_staticlib(&graph, &f.name, &tensors, 2).map_err(anyhow::Error::msg)?
        }
    };
    f.check_outputs(&graph, &outputs)
}

fn check_all(artifact: Artifact, label: &str, disabled: &[&str]) {
    let fixtures = load_manifest().expect("fixtures/manifest.json");
    check_fixtures(&fixtures, label, suite_threads(), |f| {
        check(f, artifact, disabled)
            .map(|()| String::new())
            .map_err(|e| format!("{e:#}"))
    });
}

#[test]
fn fixtures_compiled_to_executables_match_onnxruntime() {
    check_all(Artifact::Executable, "compiled fixtures (executables)", &[]);
}

#[test]
fn fixtures_compiled_to_static_libraries_match_onnxruntime() {
    check_all(Artifact::StaticLib, "compiled fixtures (static libraries)", &[]);
}

/// Every fixture compiled to an executable with `pass` disabled. A pass this branch's pipeline
/// does not have (yet) is skipped with a note, so the test is ready when the pass lands.
fn check_pass_off(pass: &str) {
    check_passes_off(&[pass]);
}

/// [`check_pass_off`] with several passes off at once.
fn check_passes_off(passes: &[&str]) {
    if let Some(missing) = passes.iter().find(|p| !pass_exists(p)) {
        println!("skipped: no pass '{missing}' in the CPU pipeline");
        return;
    }
    let names = passes.join("', '");
    let start = std::time::Instant::now();
    check_all(
        Artifact::Executable,
        &format!("compiled fixtures with '{names}' off (executables)"),
        passes,
    );
    println!("'{names}' off: {:.1} s", start.elapsed().as_secs_f64());
}

#[test]
fn fixtures_with_freeze_off() {
    check_pass_off("freeze");
}

#[test]
fn fixtures_with_channels_last_off() {
    check_pass_off("channels-last");
}

// bf16-autocast only runs with `--precision bf16`: with it off, bf16 compiles exactly like the
// default f32 suite above, and with it on, `tests/bf16.rs` checks every fixture.

/// The graph pass and codegen's kernel grouping off together, as `--disable-pass fuse` did
/// before grouping became a pass of its own (one suite run, not two).
#[test]
fn fixtures_with_fuse_off() {
    check_passes_off(&["fuse", "fuse-kernels"]);
}
