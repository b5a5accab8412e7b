//! Where `kiln compile -o` writes: never over the model or another input file (exit status 2,
//! the input untouched), and into a folder when -o names an existing folder or ends in '/'.

mod common;

use common::{kiln, one_node_model, write_model};
use std::path::Path;
use std::process::Output;

fn compile(dir: &Path, args: &[&str]) -> Output {
    kiln()
        .current_dir(dir)
        .arg("compile")
        .args(args)
        .arg("--quiet")
        .output()
        .expect("run kiln")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn an_output_path_naming_an_input_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let model = write_model(dir, "relu.onnx", &one_node_model("Relu", "r"));
    let original = std::fs::read(&model).unwrap();
    std::fs::write(dir.join("w.safetensors"), b"not read: refused first").unwrap();
    std::os::unix::fs::symlink("relu.onnx", dir.join("link.onnx")).unwrap();
    let absolute = model.to_str().unwrap().to_string();
    let cases: &[&[&str]] = &[
        &["relu.onnx", "-o", "relu.onnx"],
        &["relu.onnx", "-o", "./relu.onnx", "--emit", "obj"],
        // A link to the model is the model.
        &["relu.onnx", "-o", "link.onnx"],
        &["relu.onnx", "-o", &absolute, "--emit", "llvm-ir"],
        &["relu.onnx", "--weights", "w.safetensors", "-o", "w.safetensors"],
    ];
    for args in cases {
        let o = compile(dir, args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(err.contains("refusing to overwrite"), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: one line: {err}");
        assert_eq!(
            std::fs::read(&model).unwrap(),
            original,
            "{args:?}: the model changed"
        );
    }
    assert_eq!(
        std::fs::read(dir.join("w.safetensors")).unwrap(),
        b"not read: refused first",
        "the weights file changed"
    );
}

#[test]
fn an_output_folder_receives_the_default_file_names() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_model(dir, "relu.onnx", &one_node_model("Relu", "r"));
    std::fs::create_dir(dir.join("existing")).unwrap();
    // A trailing slash names a folder, created when missing; an existing folder needs none.
    for (args, files) in [
        (&["relu.onnx", "-o", "new/"][..], &["new/relu"][..]),
        (
            &["relu.onnx", "-o", "existing", "--emit", "staticlib"][..],
            &[
                "existing/librelu.a",
                "existing/relu.h",
                "existing/relu.pc",
                "existing/relu-config.cmake",
            ][..],
        ),
        (
            &["relu.onnx", "-o", "shared/", "--emit", "sharedlib"][..],
            &["shared/librelu.so", "shared/relu.h", "shared/relu.pc"][..],
        ),
        (
            &["relu.onnx", "-o", "existing/", "--emit", "obj"][..],
            &["existing/relu.o"][..],
        ),
    ] {
        let o = compile(dir, args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        for f in files {
            assert!(dir.join(f).is_file(), "{args:?}: {f} not written");
        }
    }
    // Nothing went to the current folder, and the executable in the folder runs.
    let here: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !["relu.onnx", "new", "existing", "shared"].contains(&n.as_str()))
        .collect();
    assert!(here.is_empty(), "written to the current folder: {here:?}");
    let info = std::process::Command::new(dir.join("new/relu"))
        .arg("--info")
        .output()
        .unwrap();
    assert!(info.status.success(), "{}", stderr(&info));
}
