//! The compiler past the importer on arbitrary bytes: a model that imports runs through the
//! optimizer's passes for the host CPU and codegen's planner (what `kiln explain` does), which
//! must return an error or a plan, never panic, hang or allocate without bound. Seeded with
//! the fixture models, so that mutations reach the passes with graphs that nearly make sense.
#![no_main]

use kiln_driver::{Options, Session};
use kiln_frontend::onnx::import_model_bytes;
use kiln_frontend::ImportOptions;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // External data resolves into an empty folder: the target is the compiler, not the files.
    let Ok(model) = import_model_bytes(
        data,
        std::env::temp_dir().join("kiln-fuzz-empty"),
        &ImportOptions::default(),
    ) else {
        return;
    };
    let mut graph = model.graph;
    if kiln_ir::verify(&graph).is_err() {
        return;
    }
    let mut session = Session::new(Options::default());
    if session.optimize(&mut graph).is_ok() {
        let _ = session.plan(&graph);
    }
});
