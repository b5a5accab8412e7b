//! Running a model compiled as a static library from a C program (`tests/c/run_model.c`), as
//! an application embedding kiln's output would.

use crate::compiled::{compile_graph, compile_graph_cross, CrossCpu, WorkDir};
use kiln_codegen::Emit;
use kiln_ir::{Graph, Tensor};
use std::path::Path;
use std::process::Command;

pub fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

/// Builds a C program from `sources` linked with the static libraries in `libs`.
pub fn build_c_program(
    sources: &[&Path],
    defines: &[String],
    include: &Path,
    libs: &[&Path],
    out: &Path,
) -> Result<(), String> {
    build_c_program_with(&cc(), sources, defines, include, libs, out)
}

/// [`build_c_program`] with the C compiler `cc` (a cross compiler for another architecture).
pub fn build_c_program_with(
    cc: &str,
    sources: &[&Path],
    defines: &[String],
    include: &Path,
    libs: &[&Path],
    out: &Path,
) -> Result<(), String> {
    let mut cmd = Command::new(cc);
    cmd.args(["-O1", "-Wall", "-Werror", "-o"]).arg(out);
    cmd.arg("-I").arg(include);
    for d in defines {
        cmd.arg(format!("-D{d}"));
    }
    cmd.args(sources).args(libs).args(["-lpthread", "-lm"]);
    let o = cmd.output().map_err(|e| format!("cannot run {cc}: {e}"))?;
    if !o.status.success() {
        return Err(format!("C build failed: {}", String::from_utf8_lossy(&o.stderr)));
    }
    Ok(())
}

/// Another architecture's static library and its C program: the CPU it is compiled for, the C
/// compiler that builds the program, and the emulator command that runs it.
pub struct Foreign<'a> {
    pub cross: CrossCpu<'a>,
    pub cc: &'a str,
    pub launcher: &'a [&'a str],
}

/// Compiles `graph` to `libNAME.a` + `NAME.h`, builds run_model.c against it, runs it on
/// `inputs` (graph order) and returns the outputs.
pub fn compile_and_run_staticlib(
    graph: &Graph,
    name: &str,
    inputs: &[Tensor],
    threads: usize,
) -> Result<Vec<Tensor>, String> {
    compile_and_run_staticlib_on(None, graph, name, inputs, threads)
}

/// [`compile_and_run_staticlib`] for this machine (`foreign` None) or for another architecture,
/// its program run under the emulator.
pub fn compile_and_run_staticlib_on(
    foreign: Option<&Foreign>,
    graph: &Graph,
    name: &str,
    inputs: &[Tensor],
    threads: usize,
) -> Result<Vec<Tensor>, String> {
    let work = WorkDir::new("lib");
    let dir = &work.0;
    let lib = dir.join(name);
    match foreign {
        None => compile_graph(graph, name, Emit::StaticLib, &lib)?,
        Some(f) => compile_graph_cross(graph, name, Emit::StaticLib, &lib, f.cross)?,
    };
    let driver = crate::repo_root().join("tests/c/run_model.c");
    let exe = dir.join("run_model");
    let cc = foreign.map_or_else(cc, |f| f.cc.to_string());
    build_c_program_with(
        &cc,
        &[&driver],
        &[
            format!("KILN_HEADER=\"{name}.h\""),
            format!("KILN_API(x)={name}_##x"),
        ],
        dir,
        &[&dir.join(format!("lib{name}.a"))],
        &exe,
    )?;
    let mut cmd = crate::compiled::command_under(foreign.map_or(&[], |f| f.launcher), &exe);
    cmd.arg(threads.to_string());
    for (i, t) in inputs.iter().enumerate() {
        let p = dir.join(format!("in{i}.bin"));
        std::fs::write(&p, t.to_le_bytes()).map_err(|e| e.to_string())?;
        cmd.arg(p);
    }
    cmd.arg("--");
    let outs: Vec<_> = graph
        .outputs()
        .iter()
        .map(|o| graph.value_type(o.value).clone())
        .collect();
    for (i, ty) in outs.iter().enumerate() {
        let p = dir.join(format!("out{i}.bin"));
        let bytes = ty.size_bytes().map_or(-1, |b| b as i64);
        cmd.arg(format!("{}:{bytes}", p.display()));
    }
    let o = cmd.output().map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(format!(
            "run_model failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    outs.iter()
        .enumerate()
        .map(|(i, ty)| {
            let bytes = std::fs::read(dir.join(format!("out{i}.bin"))).map_err(|e| e.to_string())?;
            // The shape the run reported (NAME_run_shaped): the graph's, or for an output whose
            // size depends on the data, the actual one.
            let dims =
                std::fs::read_to_string(dir.join(format!("out{i}.bin.shape"))).map_err(|e| e.to_string())?;
            let shape = dims
                .split_whitespace()
                .map(|d| {
                    d.parse::<usize>()
                        .map_err(|e| format!("output {i} shape '{dims}': {e}"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            if ty.is_static() && ty.fixed_shape().as_ref() != Some(&shape) {
                return Err(format!("output {i}: run_shaped reported {shape:?} for {ty}"));
            }
            Tensor::from_le_bytes(ty.dtype, shape, &bytes).map_err(|e| e.to_string())
        })
        .collect()
}
