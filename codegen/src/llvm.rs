//! LLVM plumbing shared by the emitters: function attributes, linking the micro-kernel and
//! runtime bitcode, internalizing, optimizing and verifying.

use crate::error::{CodegenError, Result};
use crate::target::TargetDesc;
use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::context::Context;
use inkwell::memory_buffer::MemoryBuffer;
use inkwell::module::{Linkage, Module};
use inkwell::values::FunctionValue;

mod bitcode {
    include!(concat!(env!("OUT_DIR"), "/bitcode.rs"));
}

/// Gives a function the target CPU and features, and the attributes every kernel wants.
pub fn set_kernel_attributes<'ctx>(cx: &'ctx Context, f: FunctionValue<'ctx>, target: &TargetDesc) {
    set_target_attributes(cx, f, target);
    f.add_attribute(
        AttributeLoc::Function,
        cx.create_string_attribute("no-trapping-math", "true"),
    );
    let nounwind = Attribute::get_named_enum_kind_id("nounwind");
    f.add_attribute(AttributeLoc::Function, cx.create_enum_attribute(nounwind, 0));
}

/// Keeps every call of `f` a call (idempotent).
pub fn set_noinline<'ctx>(cx: &'ctx Context, f: FunctionValue<'ctx>) {
    let never = Attribute::get_named_enum_kind_id("noinline");
    if f.get_enum_attribute(AttributeLoc::Function, never).is_none() {
        f.add_attribute(AttributeLoc::Function, cx.create_enum_attribute(never, 0));
    }
}

/// Leaves `f` out of LLVM's optimizations (which needs it `noinline` too).
pub fn set_optnone<'ctx>(cx: &'ctx Context, f: FunctionValue<'ctx>) {
    set_noinline(cx, f);
    let optnone = Attribute::get_named_enum_kind_id("optnone");
    f.add_attribute(AttributeLoc::Function, cx.create_enum_attribute(optnone, 0));
}

/// Replaces whatever CPU the function was compiled for (clang's bitcode says x86-64) with the
/// selected target, so the whole module is optimized for one CPU.
pub fn set_target_attributes<'ctx>(cx: &'ctx Context, f: FunctionValue<'ctx>, target: &TargetDesc) {
    for key in ["target-cpu", "target-features", "tune-cpu"] {
        f.remove_string_attribute(AttributeLoc::Function, key);
    }
    f.add_attribute(
        AttributeLoc::Function,
        cx.create_string_attribute("target-cpu", &target.cpu),
    );
    if !target.features.is_empty() {
        f.add_attribute(
            AttributeLoc::Function,
            cx.create_string_attribute("target-features", &target.features),
        );
    }
    if target.isa == crate::target::Isa::Avx512 {
        f.add_attribute(
            AttributeLoc::Function,
            cx.create_string_attribute("prefer-vector-width", "512"),
        );
        f.add_attribute(
            AttributeLoc::Function,
            cx.create_string_attribute("min-legal-vector-width", "512"),
        );
    }
}

/// Bitcode units available for an architecture, by unit name prefix (`uk_`, `rt_core`, ...).
fn units<'a>(arch: &'a str, prefix: &'a str) -> impl Iterator<Item = (&'static str, &'static [u8])> + 'a {
    bitcode::BITCODE
        .iter()
        .filter(move |(a, u, _)| *a == arch && u.starts_with(prefix))
        .map(|(_, u, bc)| (*u, *bc))
}

/// Links the bitcode units whose names start with `prefix` into `module`.
pub fn link_units<'ctx>(
    cx: &'ctx Context,
    module: &Module<'ctx>,
    target: &TargetDesc,
    prefix: &str,
) -> Result<()> {
    let mut found = false;
    for (unit, bc) in units(target.arch_name(), prefix) {
        found = true;
        let buf = MemoryBuffer::create_from_memory_range_copy(bc, unit);
        let m = Module::parse_bitcode_from_buffer(&buf, cx)
            .map_err(|e| CodegenError::internal(format!("bitcode {unit}: {e}")))?;
        m.set_triple(&module.get_triple());
        m.set_data_layout(&module.get_data_layout());
        module
            .link_in_module(m)
            .map_err(|e| CodegenError::internal(format!("linking {unit}: {e}")))?;
    }
    if !found {
        return Err(CodegenError::Target(format!(
            "this kiln was built without the {prefix} runtime for {} (install the target's C headers and rebuild)",
            target.arch_name()
        )));
    }
    Ok(())
}

/// Gives every definition internal linkage except `exported`, so two models' artifacts link into
/// one program, and unused runtime or micro-kernel code is dropped by the optimizer.
pub fn internalize(module: &Module<'_>, exported: &[String]) {
    let mut f = module.get_first_function();
    while let Some(func) = f {
        let name = func.get_name().to_string_lossy().into_owned();
        if func.count_basic_blocks() > 0 && !exported.contains(&name) {
            func.set_linkage(Linkage::Internal);
        }
        f = func.get_next_function();
    }
    let mut g = module.get_first_global();
    while let Some(global) = g {
        let name = global.get_name().to_string_lossy().into_owned();
        if global.get_initializer().is_some() && !exported.contains(&name) {
            global.set_linkage(Linkage::Internal);
        }
        g = global.get_next_global();
    }
}

/// Applies the target attributes to every defined function (including linked bitcode).
/// The names of the functions `module` defines (has bodies for).
pub fn defined_functions(module: &Module<'_>) -> std::collections::HashSet<String> {
    let mut names = std::collections::HashSet::new();
    let mut f = module.get_first_function();
    while let Some(func) = f {
        if func.count_basic_blocks() > 0 {
            names.insert(func.get_name().to_string_lossy().into_owned());
        }
        f = func.get_next_function();
    }
    names
}

pub fn retarget_all<'ctx>(cx: &'ctx Context, module: &Module<'ctx>, target: &TargetDesc) {
    let mut f = module.get_first_function();
    while let Some(func) = f {
        if func.count_basic_blocks() > 0 {
            set_target_attributes(cx, func, target);
        }
        f = func.get_next_function();
    }
}

/// Runs LLVM's verifier; a failure is a kiln bug.
pub fn verify(module: &Module<'_>) -> Result<()> {
    module.verify().map_err(|e| {
        CodegenError::internal(format!(
            "LLVM verifier rejected the generated module: {}",
            e.to_string_lossy()
        ))
    })
}
