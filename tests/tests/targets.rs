//! Code for other CPUs and architectures: aarch64 objects and AVX-512 code are emitted and
//! disassemble; an executable built for features this CPU lacks refuses to start clearly.

use kiln_codegen::TargetDesc;
use kiln_driver::{Cpu, Emit, Options, Session};
use kiln_tests::compiled::WorkDir;
use kiln_tests::fixtures::load_manifest;
use std::path::Path;
use std::process::Command;

fn model() -> kiln_frontend::Model {
    let f = load_manifest()
        .unwrap()
        .into_iter()
        .find(|f| f.name == "resnet_basic_tiny")
        .unwrap();
    f.load().unwrap()
}

fn compile_for(triple: Option<&str>, cpu: Option<&str>, emit: Emit, out: &Path) {
    let mut session = Session::new(Options {
        name: Some("m".into()),
        emit,
        triple: triple.map(str::to_string),
        cpu: cpu.map_or(Cpu::Native, |c| Cpu::Named(c.to_string())),
        cc: Some("cc".into()),
        ..Options::default()
    });
    session.emit(&model().graph, out).expect("compile");
}

fn objdump() -> &'static str {
    ["llvm-objdump-19", "llvm-objdump"]
        .into_iter()
        .find(|c| {
            Command::new(c)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .expect("llvm-objdump (installed with LLVM 19 by scripts/setup.sh)")
}

#[test]
fn aarch64_object_disassembles() {
    let w = WorkDir::new("a64");
    let obj = w.0.join("m.o");
    compile_for(Some("aarch64-linux-gnu"), None, Emit::Obj, &obj);
    let o = Command::new(objdump()).arg("-d").arg(&obj).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("elf64-littleaarch64"), "not an aarch64 object");
    assert!(text.contains("<m_run>:"), "m_run missing from the object");
    // NEON vector instructions in the kernels.
    assert!(
        text.contains("fmla") || text.contains("fmul\tv"),
        "no NEON arithmetic"
    );
}

#[test]
fn avx512_and_avx2_code_is_emitted() {
    let w = WorkDir::new("x86");
    for (cpu, reg) in [("znver4", "zmm"), ("x86-64-v3", "ymm")] {
        let asm = w.0.join(format!("{cpu}.s"));
        compile_for(Some("x86_64-unknown-linux-gnu"), Some(cpu), Emit::Asm, &asm);
        let text = std::fs::read_to_string(&asm).unwrap();
        assert!(text.contains(reg), "{cpu}: no {reg} registers in the assembly");
        let obj = w.0.join(format!("{cpu}.o"));
        compile_for(Some("x86_64-unknown-linux-gnu"), Some(cpu), Emit::Obj, &obj);
        let o = Command::new(objdump()).arg("-d").arg(&obj).output().unwrap();
        assert!(o.status.success());
    }
}

#[test]
fn executable_refuses_a_cpu_without_its_features() {
    let host = TargetDesc::host().unwrap();
    if host.isa == kiln_codegen::target::Isa::Avx512 {
        println!("skipped: this CPU has AVX-512, so an AVX-512 build runs here");
        return;
    }
    let w = WorkDir::new("feat");
    let exe = w.0.join("m512");
    compile_for(None, Some("znver4"), Emit::Exe, &exe);
    let input = kiln_tests::fixtures::fixtures_dir().join("models/resnet_basic_tiny/inputs/input.npy");
    let o = Command::new(&exe)
        .arg("--input")
        .arg(format!("input={}", input.display()))
        .output()
        .unwrap();
    assert!(
        !o.status.success(),
        "an AVX-512 build ran on a CPU without AVX-512"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("avx512"),
        "the refusal names the missing feature: {err}"
    );
}
