//! Using a compiled model from other build systems and languages: a C++ program linked against
//! the static and the shared library through the pkg-config file kiln writes, a CMake project
//! finding either through `NAME-config.cmake`, and Python loading the shared library with
//! ctypes. Each library is compiled once and its folder moved before use, so the files'
//! relative paths are exercised too. Every output is compared with onnxruntime's.

use kiln_codegen::Emit;
use kiln_ir::{Tensor, TensorType};
use kiln_tests::compare::compare;
use kiln_tests::compiled::{compile_graph, WorkDir};
use kiln_tests::fixtures::load_manifest;
use kiln_tests::repo_root;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The model every program here runs: one f32 input, one output, convolutions and a Gemm.
const FIXTURE: &str = "resnet_basic_tiny";
/// The library name the C++ program and the CMake project are written for.
const NAME: &str = "tiny";

struct Built {
    work: WorkDir,
    /// The library's folder, after moving it away from where it was compiled.
    lib_dir: PathBuf,
    input: PathBuf,
    expected: Tensor,
    out_ty: TensorType,
}

fn build(emit: Emit, tag: &str) -> Built {
    let work = WorkDir::new(tag);
    let f = load_manifest()
        .expect("manifest")
        .into_iter()
        .find(|f| f.name == FIXTURE)
        .expect("fixture");
    let model = f.load().expect("load");
    let g = &model.graph;
    std::fs::create_dir(work.0.join("compiled")).unwrap();
    compile_graph(g, NAME, emit, &work.0.join("compiled").join(NAME)).expect("compile");
    let lib_dir = work.0.join("moved");
    std::fs::rename(work.0.join("compiled"), &lib_dir).unwrap();
    let (in_name, _) = g.input_types().next().unwrap();
    let input = work.0.join("in.bin");
    let tensor = f.read_inputs().unwrap().remove(in_name).unwrap();
    std::fs::write(&input, tensor.to_le_bytes()).unwrap();
    let out = &g.outputs()[0];
    Built {
        expected: f.read_expected().unwrap().remove(&out.name).unwrap(),
        out_ty: g.value_type(out.value).clone(),
        lib_dir,
        input,
        work,
    }
}

impl Built {
    fn out_bytes(&self) -> String {
        self.out_ty.size_bytes().unwrap().to_string()
    }

    /// Compares the output a program wrote to `path` with the fixture's expected output.
    fn check(&self, path: &Path, what: &str) {
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{what}: no output: {e}"));
        let ty = &self.out_ty;
        let got = Tensor::from_le_bytes(ty.dtype, ty.fixed_shape().unwrap(), &bytes)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        compare(&self.expected, &got).unwrap_or_else(|e| panic!("{what}: {e}"));
    }

    /// Runs a program built against the library on the fixture's input; checks its output.
    fn run_and_check(&self, exe: &Path, what: &str) {
        let out = self.work.0.join(format!("{what}.bin").replace(' ', "_"));
        let o = Command::new(exe)
            .arg(&self.input)
            .arg(&out)
            .arg(self.out_bytes())
            .output()
            .unwrap_or_else(|e| panic!("{what}: cannot run {}: {e}", exe.display()));
        assert!(o.status.success(), "{what}: {}", text(&o.stderr));
        self.check(&out, what);
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim().to_string()
}

fn run(cmd: &mut Command, what: &str) -> Output {
    let o = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?} (scripts/setup.sh installs it): {e}"));
    assert!(
        o.status.success(),
        "{what}: {cmd:?} failed:\n{}\n{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    o
}

/// `pkg-config --cflags --libs NAME` with the library's folder on the search path.
fn pkg_config_flags(lib_dir: &Path) -> Vec<String> {
    let o = run(
        Command::new("pkg-config")
            .env("PKG_CONFIG_PATH", lib_dir)
            .args(["--cflags", "--libs", NAME]),
        "pkg-config",
    );
    text(&o.stdout).split_whitespace().map(str::to_string).collect()
}

/// Builds tests/c/embed_model.cpp with the C++ compiler and `flags` after the source, as a
/// Makefile would.
fn build_cpp(built: &Built, flags: &[String], exe_name: &str) -> PathBuf {
    let exe = built.work.0.join(exe_name);
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    run(
        Command::new(&cxx)
            .args(["-O1", "-Wall", "-Werror", "-o"])
            .arg(&exe)
            .arg(repo_root().join("tests/c/embed_model.cpp"))
            .args(flags),
        "C++ build",
    );
    exe
}

/// Configures and builds tests/cmake with `-D{var}=lib_dir`; returns the program.
fn build_cmake(built: &Built, var: &str) -> PathBuf {
    let dir = built.work.0.join("cmake-build");
    run(
        Command::new("cmake")
            .arg("-S")
            .arg(repo_root().join("tests/cmake"))
            .arg("-B")
            .arg(&dir)
            .arg(format!("-D{var}={}", built.lib_dir.display())),
        "cmake configure",
    );
    run(Command::new("cmake").arg("--build").arg(&dir), "cmake build");
    dir.join("embed_model")
}

/// The shared libraries a program needs (DT_NEEDED).
fn needed(exe: &Path) -> String {
    text(&run(Command::new("readelf").arg("-d").arg(exe), "readelf").stdout)
}

#[test]
fn static_library_links_through_pkg_config_and_cmake() {
    let built = build(Emit::StaticLib, "static-lib");
    let flags = pkg_config_flags(&built.lib_dir);
    assert!(
        flags.contains(&format!("-l:lib{NAME}.a")) && flags.contains(&"-lm".to_string()),
        "pkg-config flags: {flags:?}"
    );
    let exe = build_cpp(&built, &flags, "cpp_static");
    assert!(
        !needed(&exe).contains(&format!("lib{NAME}.so")),
        "linked statically"
    );
    built.run_and_check(&exe, "C++ with the static library (pkg-config)");
    let exe = build_cmake(&built, "CMAKE_PREFIX_PATH");
    built.run_and_check(&exe, "CMake project with the static library");
}

#[test]
fn shared_library_links_through_pkg_config_and_cmake_and_loads_in_python() {
    let built = build(Emit::SharedLib, "shared-lib");
    let so = built.lib_dir.join(format!("lib{NAME}.so"));

    // Only the model's API is exported: kiln's runtime and kernels stay private, so the library
    // cannot clash with another model's library or with the application.
    let o = run(Command::new("nm").args(["-D", "--defined-only"]).arg(&so), "nm");
    let listing = text(&o.stdout);
    let symbols: Vec<&str> = listing
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    assert!(
        symbols.contains(&"tiny_run") && symbols.contains(&"tiny_create"),
        "{symbols:?}"
    );
    let foreign: Vec<&&str> = symbols.iter().filter(|s| !s.starts_with("tiny_")).collect();
    assert!(
        foreign.is_empty(),
        "exported without the model prefix: {foreign:?}"
    );

    // C++ through pkg-config; the loader finds the library through the rpath.
    let mut flags = pkg_config_flags(&built.lib_dir);
    flags.push(format!("-Wl,-rpath,{}", built.lib_dir.display()));
    let exe = build_cpp(&built, &flags, "cpp_shared");
    assert!(
        needed(&exe).contains(&format!("[lib{NAME}.so]")),
        "links the shared library"
    );
    built.run_and_check(&exe, "C++ with the shared library (pkg-config)");

    // CMake, pointed at the package file's folder directly this time.
    let exe = build_cmake(&built, &format!("{NAME}_DIR"));
    assert!(
        needed(&exe).contains(&format!("[lib{NAME}.so]")),
        "links the shared library"
    );
    built.run_and_check(&exe, "CMake project with the shared library");

    // Python, standard library only.
    let venv = repo_root().join(".venv/bin/python");
    let python = if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    };
    let out = built.work.0.join("python.bin");
    run(
        Command::new(&python)
            .arg(repo_root().join("tests/python/ctypes_run.py"))
            .arg(&so)
            .arg(NAME)
            .arg(&built.input)
            .arg(&out)
            .arg(built.out_bytes()),
        "Python ctypes",
    );
    built.check(&out, "Python ctypes");
}
