//! Embedding compiled models in C programs: two different models linked into one program
//! (symbols are prefixed per model, nothing else is exported), concurrent contexts of one
//! model, and byte-identical artifacts from repeated compilations.

use kiln_codegen::Emit;
use kiln_tests::compare::compare;
use kiln_tests::compiled::{compile_graph, WorkDir};
use kiln_tests::fixtures::{load_manifest, Fixture};
use kiln_tests::staticlib::build_c_program;
use std::process::Command;

fn fixture(name: &str) -> Fixture {
    load_manifest()
        .expect("manifest")
        .into_iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("fixture {name} missing"))
}

#[test]
fn two_models_link_into_one_c_program() {
    let work = WorkDir::new("two");
    let dir = &work.0;
    let mut defines = vec![];
    let mut args = vec![];
    let mut expected = vec![];
    for (tag, name) in [("a", "resnet_basic_tiny"), ("b", "lstm_classifier")] {
        let f = fixture(name);
        let model = f.load().expect("load");
        let g = &model.graph;
        assert_eq!(
            (g.inputs().len(), g.outputs().len()),
            (1, 1),
            "{name}: the program expects one input and one output"
        );
        let api = format!("model_{tag}");
        compile_graph(g, &api, Emit::StaticLib, &dir.join(&api)).expect("compile");
        let (in_name, in_ty) = g.input_types().next().unwrap();
        let input = f.read_inputs().unwrap().remove(in_name).unwrap();
        let out = &g.outputs()[0];
        let in_path = dir.join(format!("{tag}_in.bin"));
        std::fs::write(&in_path, input.to_le_bytes()).unwrap();
        let up = tag.to_uppercase();
        defines.push(format!("{up}_IN_BYTES={}", in_ty.size_bytes().unwrap()));
        defines.push(format!(
            "{up}_OUT_BYTES={}",
            g.value_type(out.value).size_bytes().unwrap()
        ));
        args.push(in_path);
        args.push(dir.join(format!("{tag}_out.bin")));
        expected.push((
            f.read_expected().unwrap().remove(&out.name).unwrap(),
            g.value_type(out.value).clone(),
        ));
    }
    let exe = dir.join("two_models");
    let src = kiln_tests::repo_root().join("tests/c/two_models.c");
    build_c_program(
        &[&src],
        &defines,
        dir,
        &[&dir.join("libmodel_a.a"), &dir.join("libmodel_b.a")],
        &exe,
    )
    .expect("a C program linking both models builds");
    let o = Command::new(&exe).args(&args).output().expect("run");
    assert!(
        o.status.success(),
        "two_models failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    for (i, (want, ty)) in expected.iter().enumerate() {
        let bytes = std::fs::read(&args[2 * i + 1]).unwrap();
        let got = kiln_ir::Tensor::from_le_bytes(ty.dtype, ty.fixed_shape().unwrap(), &bytes).unwrap();
        compare(want, &got).unwrap_or_else(|e| panic!("model {i}: {e}"));
    }
}

#[test]
fn static_library_exports_only_prefixed_symbols() {
    let work = WorkDir::new("syms");
    let f = fixture("resnet_basic_tiny");
    let model = f.load().unwrap();
    compile_graph(&model.graph, "tiny", Emit::StaticLib, &work.0.join("tiny")).unwrap();
    let o = Command::new("nm")
        .args(["-g", "--defined-only"])
        .arg(work.0.join("libtiny.a"))
        .output()
        .expect("nm (binutils) is installed");
    let text = String::from_utf8_lossy(&o.stdout);
    let symbols: Vec<&str> = text.lines().filter_map(|l| l.split_whitespace().nth(2)).collect();
    assert!(symbols.contains(&"tiny_run"), "tiny_run exported: {symbols:?}");
    let foreign: Vec<&&str> = symbols.iter().filter(|s| !s.starts_with("tiny_")).collect();
    assert!(
        foreign.is_empty(),
        "symbols without the model prefix: {foreign:?}"
    );
}

#[test]
fn compiling_twice_gives_identical_artifacts() {
    let f = fixture("mobilenetv2_tiny");
    let model = f.load().unwrap();
    for (emit, file) in [(Emit::Exe, "m"), (Emit::StaticLib, "libm.a")] {
        let (w1, w2) = (WorkDir::new("det1"), WorkDir::new("det2"));
        compile_graph(&model.graph, "m", emit, &w1.0.join("m")).unwrap();
        compile_graph(&model.graph, "m", emit, &w2.0.join("m")).unwrap();
        let a = std::fs::read(w1.0.join(file)).unwrap();
        let b = std::fs::read(w2.0.join(file)).unwrap();
        assert!(
            a == b,
            "{file}: two compilations differ ({} vs {} bytes)",
            a.len(),
            b.len()
        );
    }
}

/// A model whose tensor names are C and C++ keywords (`class`, `int`, `return`), the API's own
/// parameter (`ctx`), names that sanitize alike (`a.b`, `a_b`) and a name that would end a
/// comment: its header compiles as C and as C++ (tests/c/api_names.c, built both ways), and the
/// program checks the introspection functions, the size macros, NULL handling and that a
/// successful run clears the last error.
#[test]
fn header_with_hostile_names_compiles_as_c_and_cpp() {
    use kiln_ir::{Binary, DType, Graph, Op, TensorType, Unary};
    let mut g = Graph::new("names");
    let f32_23 = TensorType::fixed(DType::F32, &[2, 3]);
    let class = g.add_input("class", f32_23.clone());
    let int = g.add_input("int", TensorType::fixed(DType::I64, &[2, 3]));
    let ab = g.add_input("a.b", TensorType::fixed(DType::F32, &[3]));
    let a_b = g.add_input("a_b", TensorType::fixed(DType::F32, &[1, 3]));
    let ctx = g.add_input("ctx", f32_23);
    let int_f = g
        .add("cast", Op::Cast { to: DType::F32 }, vec![Some(int)], "int_f")
        .unwrap();
    let mut sum = class;
    for (i, v) in [int_f, ab, a_b, ctx].into_iter().enumerate() {
        sum = g
            .add(
                format!("add{i}"),
                Op::Binary(Binary::Add),
                vec![Some(sum), Some(v)],
                format!("s{i}"),
            )
            .unwrap();
    }
    let neg = g
        .add("neg", Op::Unary(Unary::Neg), vec![Some(ctx)], "neg")
        .unwrap();
    g.add_output("return", sum);
    g.add_output("y*/ #error injected /*\n", neg);

    let work = WorkDir::new("names");
    let dir = &work.0;
    compile_graph(&g, "names", Emit::StaticLib, &dir.join("names")).expect("compile");
    let header = std::fs::read_to_string(dir.join("names.h")).unwrap();
    assert!(
        header.contains(r#""y*\/ #error injected /\*\x0a""#),
        "the name is escaped in comments:\n{header}"
    );
    let src = kiln_tests::repo_root().join("tests/c/api_names.c");
    let cc = kiln_tests::staticlib::cc();
    for (compiler, lang, std) in [(cc.as_str(), "c", "-std=c99"), ("c++", "c++", "-std=c++11")] {
        let exe = dir.join(format!("api_names_{lang}"));
        let o = Command::new(compiler)
            .args([std, "-O1", "-Wall", "-Wextra", "-pedantic", "-Werror", "-x", lang])
            .arg(&src)
            .args(["-x", "none", "-I"])
            .arg(dir)
            .arg(dir.join("libnames.a"))
            .args(["-lpthread", "-lm", "-o"])
            .arg(&exe)
            .output()
            .unwrap_or_else(|e| panic!("running {compiler}: {e}"));
        assert!(
            o.status.success(),
            "{compiler} ({lang}) rejects the program or the header:\n{}\n{header}",
            String::from_utf8_lossy(&o.stderr)
        );
        let o = Command::new(&exe).output().expect("run");
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && out.trim() == "ok",
            "{lang}: {out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// Weights of more than 2 GiB link: on x86-64 they lie in a large section (`.lrodata`, which
/// linkers place after everything else, so that the code's 32-bit offsets to its GOT and data
/// stay short), and the code reaches them only through a base pointer loaded at run time, so
/// that no 32-bit PC-relative offset to a weight is ever needed. Checked on a small model's
/// executable (the section and where the symbol lies) and static library (the kind of every
/// relocation against the weights).
#[cfg(target_arch = "x86_64")]
#[test]
fn weights_lie_in_a_large_section_read_through_a_base_pointer() {
    let work = WorkDir::new("large");
    let f = fixture("resnet_basic_tiny");
    let model = f.load().unwrap();
    let tool = |args: &[&str], file: &std::path::Path| -> String {
        let o = Command::new(args[0])
            .args(&args[1..])
            .arg(file)
            .output()
            .unwrap_or_else(|e| panic!("{} (binutils) runs: {e}", args[0]));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let exe = work.0.join("tiny");
    compile_graph(&model.graph, "tiny", Emit::Exe, &exe).unwrap();
    let sections = tool(&["readelf", "-SW"], &exe);
    let large = sections
        .lines()
        .find(|l| l.contains(" .lrodata "))
        .unwrap_or_else(|| panic!("no .lrodata section:\n{sections}"));
    // [Nr] Name Type Address Off Size ...
    let cols: Vec<&str> = large.split(']').nth(1).unwrap().split_whitespace().collect();
    let start = u64::from_str_radix(cols[2], 16).unwrap();
    let size = u64::from_str_radix(cols[4], 16).unwrap();
    let symbols = tool(&["nm"], &exe);
    let weights = symbols
        .lines()
        .find(|l| l.ends_with(" tiny_kiln_weights"))
        .unwrap_or_else(|| panic!("no weights symbol:\n{symbols}"));
    let at = u64::from_str_radix(weights.split_whitespace().next().unwrap(), 16).unwrap();
    assert!(
        (start..start + size).contains(&at),
        "the weights ({at:#x}) lie outside .lrodata ({start:#x}, {size:#x} bytes)"
    );
    compile_graph(&model.graph, "tiny", Emit::StaticLib, &work.0.join("tiny")).unwrap();
    let relocations = tool(&["readelf", "-rW"], &work.0.join("libtiny.a"));
    let to_weights: Vec<&str> = relocations
        .lines()
        .filter(|l| l.contains("kiln_weights") || l.contains(".lrodata"))
        .collect();
    assert!(
        !to_weights.is_empty(),
        "no relocation against the weights:\n{relocations}"
    );
    let short: Vec<&&str> = to_weights
        .iter()
        .filter(|l| !l.contains("R_X86_64_64 "))
        .collect();
    assert!(
        short.is_empty(),
        "relocations against the weights that are not 64-bit absolute: {short:#?}"
    );
}
