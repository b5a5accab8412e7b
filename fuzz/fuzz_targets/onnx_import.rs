//! The ONNX importer on arbitrary bytes: decoding, validation and graph import must return an
//! error or a model, never panic, hang or allocate without bound.
#![no_main]

use kiln_frontend::onnx::import_model_bytes;
use kiln_frontend::ImportOptions;
use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;
use std::sync::OnceLock;

#[path = "../hostile_folder.rs"]
mod hostile_folder;

/// The folder external data resolves into: a data file, and symlinks out of the folder, a FIFO
/// and a device for the importer to refuse (see `hostile_folder.rs`).
fn base_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("kiln-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("creating the fuzz folder");
        hostile_folder::populate(&d);
        d
    })
    .clone()
}

fuzz_target!(|data: &[u8]| {
    if let Ok(model) = import_model_bytes(data, base_dir(), &ImportOptions::default()) {
        // What every command does next with an imported graph.
        let _ = kiln_ir::verify(&model.graph);
    }
});
