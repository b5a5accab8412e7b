//! Builds the LLVM module of a compiled model: the weights blob, one function per kernel, the
//! run function that calls them in order, the model descriptor the runtime reads, and the
//! exported C API (`NAME_create`, `NAME_run`, ...). The micro-kernel and runtime bitcode is
//! linked in, everything but the API is made internal, and the module is verified.
//!
//! Here: the module as a whole (`build_module`, `build_portable_module`) and the emitter's
//! shared helpers; `kernels` emits one function per planned kernel, `run` the run function
//! that calls them, `descriptor` the model descriptor, `c_api` the exported functions and
//! `signature` the JSON signature written beside an artifact.

mod c_api;
pub(crate) mod call;
mod descriptor;
pub(crate) mod kernels;
mod run;
pub mod signature;

use kernels::kernel_functions;
use run::keep_out_of_line;
use signature::{signature_inputs, signature_json, signature_outputs};

use crate::api::Api;
use crate::error::{CodegenError, Result};
use crate::plan::kernel::KernelImpl;
use crate::plan::Plan;
use crate::target::TargetDesc;
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::values::{BasicValueEnum, GlobalValue, PointerValue};
use inkwell::AddressSpace;
use kiln_ir::Graph;

pub struct ModuleParts<'a> {
    pub graph: &'a Graph,
    pub plan: &'a Plan,
    pub target: &'a TargetDesc,
    pub api: &'a Api,
    pub model_name: &'a str,
    pub with_main: bool,
    /// A CUDA model's device code: the kernels run on the GPU, the host module carries the PTX
    /// and the launch table, and its run function is the runtime's `kiln_rt_cuda_run`.
    pub cuda: Option<&'a crate::nvptx::DeviceCode>,
    /// A portable artifact's CPU variants (`--cpu portable`, [`build_portable_module`]).
    pub portable: Option<&'a Portable<'a>>,
    /// Which of them these parts are (None: the shared part, or a single-target build).
    pub variant: Option<usize>,
    /// The packed weights are linked beside the code as an object of their own defining this
    /// symbol (`crate::weights_object`); None: embedded in the module.
    pub weights_object: Option<&'a str>,
    /// The graph outputs whose shape is an upper bound (`crate::data_dependent`): their
    /// kernels write the actual dims into the context's output shape.
    pub data_dependent: &'a [usize],
    /// A batch range: the graph is the per-sample program (`crate::batch`).
    pub batch: Option<&'a crate::batch::Batch>,
}

/// The CPU variants of a portable artifact, baseline first: each one a complete set of
/// kernels, weights and run function for its target, planned from the graph optimized for it.
pub struct Portable<'a> {
    pub variants: Vec<VariantParts<'a>>,
}

pub struct VariantParts<'a> {
    pub graph: &'a Graph,
    pub plan: &'a Plan,
    pub target: &'a TargetDesc,
}

impl Portable<'_> {
    pub fn names(&self) -> Vec<String> {
        self.variants.iter().map(|v| v.target.variant_name()).collect()
    }
}

/// Where the API functions find the model description: the one constant, or the variant the
/// runtime picks for this CPU when a context is created.
enum DescRef<'ctx> {
    One(GlobalValue<'ctx>),
    Variants {
        descs: PointerValue<'ctx>,
        names: PointerValue<'ctx>,
        n: u64,
        /// The first variant's description: the inputs and outputs every variant shares.
        first: PointerValue<'ctx>,
    },
}

impl<'ctx> DescRef<'ctx> {
    /// A description of the model's inputs and outputs (the same in every variant).
    fn io(&self) -> PointerValue<'ctx> {
        match self {
            DescRef::One(desc) => desc.as_pointer_value(),
            DescRef::Variants { first, .. } => *first,
        }
    }
}

/// Above this many inputs, a library kernel's descriptors are filled by a loop over a constant
/// table (`describe_in_loop`) instead of straight-line stores, which LLVM specialises best but
/// which made a Concat of 10,000 inputs a function of 50,000 stores.
const MAX_UNROLLED_OPERANDS: usize = 64;

/// Emits the whole module (unoptimized but verified). `on_kernel(i, n)` reports progress.
/// With external weights (`api.weights_file`), also returns the build's layout hash
/// ([`crate::weights_file::layout_hash`]), which the module embeds.
pub fn build_module<'ctx>(
    cx: &'ctx Context,
    parts: &ModuleParts<'_>,
    on_kernel: &mut dyn FnMut(usize, usize),
) -> Result<(Module<'ctx>, Option<u64>)> {
    let module = cx.create_module(parts.model_name);
    let tm = parts
        .target
        .target_machine(inkwell::OptimizationLevel::Aggressive)?;
    module.set_triple(&tm.get_triple());
    module.set_data_layout(&tm.get_target_data().get_data_layout());
    let e = Emitter {
        cx,
        module: &module,
        builder: cx.create_builder(),
        parts,
    };
    let external = parts.api.weights_file.is_some();
    let weights = match external {
        true => None,
        false => Some(e.weights_global()?),
    };
    let run = match parts.cuda {
        Some(_) => e.cuda_run_function()?,
        None => {
            let kernel_fns = kernel_functions(cx, &module, parts, on_kernel)?;
            keep_out_of_line(cx, &kernel_fns);
            e.run_function(&kernel_fns, weights)?
        }
    };
    // Hashed before anything that embeds the hash: the kernels and the run function are all the
    // code that reads the blob.
    let layout_hash = external.then(|| {
        crate::weights_file::layout_hash(
            parts.graph,
            parts.plan,
            parts.target,
            parts.model_name,
            &module.print_to_string().to_string(),
        )
    });
    let desc = e.model_desc(run, layout_hash)?;
    e.api_functions(&DescRef::One(desc))?;
    if parts.cuda.is_some() {
        e.cuda_api_functions(desc)?;
    }
    if parts.api.profile {
        e.profile_gen().api_functions(parts.api, parts.target)?;
    }
    if parts.with_main {
        e.main_function(&DescRef::One(desc))?;
    }

    crate::llvm::link_units(cx, &module, parts.target, "uk_")?;
    // The kernels, the run function and the library kernels they call run with the target's
    // features; the runtime, the API and main (linked or named below) with the runtime target's
    // (`TargetDesc::runtime_target`): the CPU check must run on any CPU of the architecture.
    crate::llvm::retarget_all(cx, &module, parts.target);
    let model_code = crate::llvm::defined_functions(&module);
    crate::llvm::link_units(cx, &module, parts.target, "rt_core")?;
    crate::profile::keep_hooks_out_of_line(cx, &module);
    if parts.with_main {
        crate::llvm::link_units(cx, &module, parts.target, "rt_exe")?;
    }
    if parts.cuda.is_some() {
        crate::llvm::link_units(cx, &module, parts.target, "rt_cuda")?;
    }
    check_ukernels(&module, parts)?;
    let runtime_target = parts.target.runtime_target();
    let entry_points = parts.api.exported(parts.with_main);
    let mut f = module.get_first_function();
    while let Some(func) = f {
        let name = func.get_name().to_string_lossy();
        let runtime = !model_code.contains(name.as_ref()) || entry_points.iter().any(|e| *e == name);
        if func.count_basic_blocks() > 0 && runtime {
            crate::llvm::set_target_attributes(cx, func, &runtime_target);
        }
        f = func.get_next_function();
    }
    crate::llvm::internalize(&module, &parts.api.exported(parts.with_main));
    crate::llvm::verify(&module)?;
    Ok((module, layout_hash))
}

/// Emits the module of a portable artifact (`--cpu portable`): the shared part (the C API, the
/// runtime, a run function that calls the context's variant) for `parts.target`, the
/// baseline, and one complete model per variant of `parts.portable`, each with its kernels,
/// weights, run function and description, compiled for its own CPU through LLVM's per-function
/// target attributes. `NAME_create` asks the runtime which variant this CPU runs
/// (`kiln_rt_select_variant`, CPUID); the ABI is that of a single-target build.
pub fn build_portable_module<'ctx>(
    cx: &'ctx Context,
    parts: &ModuleParts<'_>,
    on_kernel: &mut dyn FnMut(usize, usize),
) -> Result<Module<'ctx>> {
    let portable = parts
        .portable
        .ok_or_else(|| CodegenError::internal("a portable module needs its variants"))?;
    let module = cx.create_module(parts.model_name);
    let tm = parts
        .target
        .target_machine(inkwell::OptimizationLevel::Aggressive)?;
    module.set_triple(&tm.get_triple());
    module.set_data_layout(&tm.get_target_data().get_data_layout());
    let e = Emitter {
        cx,
        module: &module,
        builder: cx.create_builder(),
        parts,
    };
    let p = e.ptr();
    let desc_ty = e.model_desc_type();
    let names = portable.names();
    // The variants' descriptions are defined by their modules, linked in below.
    let descs: Vec<BasicValueEnum> = (0..names.len())
        .map(|i| {
            let g = module.add_global(desc_ty, None, &variant_desc_name(i));
            g.set_linkage(Linkage::External);
            g.as_pointer_value().into()
        })
        .collect();
    let name_ptrs: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, n)| e.cstring(&format!("kiln.variant_name.{i}"), n))
        .collect();
    let desc_table = e
        .const_global(
            "kiln.variants",
            p.const_array(&descs.iter().map(|d| d.into_pointer_value()).collect::<Vec<_>>())
                .into(),
            8,
        )
        .as_pointer_value();
    let name_table = e
        .const_global("kiln.variant_names", p.const_array(&name_ptrs).into(), 8)
        .as_pointer_value();
    let desc = DescRef::Variants {
        descs: desc_table,
        names: name_table,
        n: names.len() as u64,
        first: descs[0].into_pointer_value(),
    };
    e.dispatch_run_function(desc_ty)?;
    let sig = signature_json(
        parts,
        &signature_inputs(parts.graph),
        &signature_outputs(parts.graph),
        None,
    );
    e.cstring("kiln.signature", &sig);
    e.api_functions(&desc)?;
    if parts.api.profile {
        e.profile_gen().api_functions(parts.api, parts.target)?;
    }
    if parts.with_main {
        e.main_function(&desc)?;
    }
    crate::llvm::link_units(cx, &module, parts.target, "rt_core")?;
    if parts.with_main {
        crate::llvm::link_units(cx, &module, parts.target, "rt_exe")?;
    }
    crate::llvm::retarget_all(cx, &module, parts.target);

    let total: usize = portable.variants.iter().map(|v| v.plan.kernels.len()).sum();
    let mut done = 0;
    for (i, v) in portable.variants.iter().enumerate() {
        // Packed weights depend on the register tiles (8 or 16 lanes), so variants usually
        // carry their own; identical blobs are stored once.
        let shared = portable.variants[..i]
            .iter()
            .position(|w| w.plan.weights == v.plan.weights);
        let vparts = ModuleParts {
            graph: v.graph,
            plan: v.plan,
            target: v.target,
            api: parts.api,
            model_name: parts.model_name,
            with_main: parts.with_main,
            cuda: None,
            portable: Some(portable),
            variant: Some(i),
            weights_object: None,
            data_dependent: parts.data_dependent,
            batch: parts.batch,
        };
        let m = variant_module(cx, &module, &vparts, i, shared, &mut |k, _| {
            on_kernel(done + k, total)
        })?;
        done += v.plan.kernels.len();
        module
            .link_in_module(m)
            .map_err(|e| CodegenError::internal(format!("linking CPU variant {}: {e}", names[i])))?;
    }
    crate::llvm::internalize(&module, &parts.api.exported(parts.with_main));
    crate::llvm::verify(&module)?;
    Ok(module)
}

fn variant_desc_name(i: usize) -> String {
    format!("kiln.variant.{i}")
}

fn variant_weights_name(i: usize) -> String {
    format!("kiln.variant_weights.{i}")
}

/// One variant of a portable artifact as a module of its own, with the same triple and data
/// layout as `main`: everything internal but its description (and its weights, which a later
/// variant may share), every function compiled for the variant's CPU.
fn variant_module<'ctx>(
    cx: &'ctx Context,
    main: &Module<'ctx>,
    parts: &ModuleParts<'_>,
    i: usize,
    shared_weights: Option<usize>,
    on_kernel: &mut dyn FnMut(usize, usize),
) -> Result<Module<'ctx>> {
    let module = cx.create_module(&format!("{}.{}", parts.model_name, i));
    module.set_triple(&main.get_triple());
    module.set_data_layout(&main.get_data_layout());
    let e = Emitter {
        cx,
        module: &module,
        builder: cx.create_builder(),
        parts,
    };
    let weights = match shared_weights {
        Some(j) => {
            let ty = cx.i8_type().array_type(declared_len(parts.plan.weights.len()));
            let g = module.add_global(ty, None, &variant_weights_name(j));
            g.set_linkage(Linkage::External);
            g
        }
        None => {
            let g = e.weights_global()?;
            g.set_name(&variant_weights_name(i));
            g.set_linkage(Linkage::External);
            g
        }
    };
    let kernel_fns = kernel_functions(cx, &module, parts, on_kernel)?;
    let run = e.run_function(&kernel_fns, Some(weights))?;
    let desc = e.model_desc(run, None)?;
    desc.set_name(&variant_desc_name(i));
    desc.set_linkage(Linkage::External);
    crate::llvm::link_units(cx, &module, parts.target, "uk_")?;
    check_ukernels(&module, parts)?;
    crate::llvm::retarget_all(cx, &module, parts.target);
    crate::llvm::internalize(&module, &[variant_desc_name(i), variant_weights_name(i)]);
    // Every function of the variant is named after it (`kiln.k3.x86_64_v4`), so profiles,
    // debuggers and disassemblies tell the variants apart.
    let suffix: String = parts
        .target
        .variant_name()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let mut f = module.get_first_function();
    while let Some(func) = f {
        if func.count_basic_blocks() > 0 {
            let name = func.get_name().to_string_lossy().into_owned();
            func.as_global_value().set_name(&format!("{name}.{suffix}"));
        }
        f = func.get_next_function();
    }
    Ok(module)
}

/// Every kernel-library call of the plan has its definition in the module.
fn check_ukernels(module: &Module<'_>, parts: &ModuleParts<'_>) -> Result<()> {
    for k in parts.plan.kernels.iter().filter(|_| parts.cuda.is_none()) {
        if let KernelImpl::Ukernel(c) = &k.imp {
            let name = format!("kiln_uk_{}", c.symbol);
            if module
                .get_function(&name)
                .is_none_or(|f| f.count_basic_blocks() == 0)
            {
                return Err(CodegenError::internal(format!(
                    "micro-kernel {name} (for node '{}') is not in the kernel library",
                    k.node_name
                )));
            }
        }
    }
    Ok(())
}

struct Emitter<'a, 'ctx> {
    cx: &'ctx Context,
    module: &'a Module<'ctx>,
    builder: Builder<'ctx>,
    parts: &'a ModuleParts<'a>,
}

impl<'a, 'ctx> Emitter<'a, 'ctx> {
    fn profile_gen(&self) -> crate::profile::Gen<'_, 'ctx> {
        crate::profile::Gen {
            cx: self.cx,
            module: self.module,
            builder: &self.builder,
        }
    }

    /// Whether the run function times its kernels when a context turns profiling on: always in
    /// executables (`--profile`), in libraries only when their API can turn it on.
    fn instrumented(&self) -> bool {
        self.parts.with_main || self.parts.api.profile
    }

    fn ptr(&self) -> inkwell::types::PointerType<'ctx> {
        self.cx.ptr_type(AddressSpace::default())
    }

    fn const_global(&self, name: &str, value: BasicValueEnum<'ctx>, align: u32) -> GlobalValue<'ctx> {
        let g = self.module.add_global(value.get_type(), None, name);
        g.set_initializer(&value);
        g.set_constant(true);
        g.set_linkage(Linkage::Private);
        g.set_unnamed_addr(true);
        g.set_alignment(align);
        g
    }

    fn cstring(&self, name: &str, s: &str) -> PointerValue<'ctx> {
        let v = self.cx.const_string(s.as_bytes(), true);
        self.const_global(name, v.into(), 1).as_pointer_value()
    }

    fn i64_array(&self, name: &str, vals: &[i64]) -> PointerValue<'ctx> {
        let t = self.cx.i64_type();
        let vals: Vec<_> = vals.iter().map(|&v| t.const_int(v as u64, true)).collect();
        let arr = if vals.is_empty() {
            t.const_array(&[t.const_zero()])
        } else {
            t.const_array(&vals)
        };
        self.const_global(name, arr.into(), 8).as_pointer_value()
    }

    fn f64_array(&self, name: &str, vals: &[f64]) -> PointerValue<'ctx> {
        let t = self.cx.f64_type();
        let vals: Vec<_> = vals.iter().map(|&v| t.const_float(v)).collect();
        let arr = if vals.is_empty() {
            t.const_array(&[t.const_zero()])
        } else {
            t.const_array(&vals)
        };
        self.const_global(name, arr.into(), 8).as_pointer_value()
    }

    fn weights_global(&self) -> Result<GlobalValue<'ctx>> {
        let bytes = &self.parts.plan.weights;
        if let Some(symbol) = self.parts.weights_object {
            // Declared here, defined by the weights object (at least one byte, as below).
            let ty = self.cx.i8_type().array_type(declared_len(bytes.len()));
            let g = self.module.add_global(ty, None, symbol);
            g.set_linkage(Linkage::External);
            g.set_visibility(inkwell::GlobalVisibility::Hidden);
            g.set_alignment(64);
            g.set_constant(true);
            return Ok(g);
        }
        // An empty array would make a zero-sized global; one byte keeps the symbol valid.
        let bytes = bytes
            .bytes()
            .expect("weights not streamed into an object are in memory");
        if u32::try_from(bytes.len()).is_err() {
            // LLVM's constant arrays count their elements in 32 bits.
            return Err(CodegenError::Target(format!(
                "{:.1} GiB of weights cannot be embedded in one LLVM module (at most 4 GiB): compile an executable or a library for one CPU (--cpu native or a named CPU), whose weights go in an object of their own, or write them to a file with --weights-out",
                bytes.len() as f64 / (1u64 << 30) as f64
            )));
        }
        let v = self
            .cx
            .const_string(if bytes.is_empty() { &[0u8] } else { bytes }, false);
        let g = self.const_global("kiln.weights", v.into(), 64);
        g.set_unnamed_addr(false);
        if self.parts.target.arch == crate::target::Arch::X86_64 {
            // A large section, as the weights object's (see `crate::weights_object`).
            g.set_section(Some(crate::weights_object::SECTION_NAME_X86_64));
        }
        Ok(g)
    }
}

/// The element count a declaration of the weights gives them: their size, at least one byte
/// and at most what LLVM's 32-bit array length holds. Only informational: the code reaches the
/// weights through a base pointer loaded at run time (`emit::run`), never through the
/// declared type.
fn declared_len(bytes: usize) -> u32 {
    u32::try_from(bytes.max(1)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use inkwell::values::AsValueRef;
    use kiln_ir::{DType, Op, TensorType, Unary};

    /// The kernel functions of `graph`'s plan (fusion off) and their instruction counts.
    fn kernel_sizes(graph: &Graph) -> (usize, Vec<usize>) {
        let target = TargetDesc::host().unwrap();
        let plan = crate::plan::build(graph, &target, false).unwrap();
        let api = Api {
            prefix: "m".into(),
            profile: false,
            weights_file: None,
            cuda: false,
        };
        let parts = ModuleParts {
            graph,
            plan: &plan,
            target: &target,
            api: &api,
            model_name: "m",
            with_main: false,
            cuda: None,
            portable: None,
            variant: None,
            weights_object: None,
            data_dependent: &[],
            batch: None,
        };
        let cx = Context::create();
        let module = cx.create_module("m");
        let fns = kernel_functions(&cx, &module, &parts, &mut |_, _| {}).unwrap();
        let sizes = fns
            .iter()
            .map(|f| {
                f.get_basic_block_iter()
                    .map(|b| b.get_instructions().count())
                    .sum()
            })
            .collect();
        let distinct: std::collections::HashSet<_> = fns.iter().map(|f| f.as_value_ref()).collect();
        (distinct.len(), sizes)
    }

    fn concat(n: usize) -> Graph {
        let mut g = Graph::new("concat");
        let ins: Vec<_> = (0..n)
            .map(|i| Some(g.add_input(format!("x{i}"), TensorType::fixed(DType::F32, &[1, 4]))))
            .collect();
        let y = g.add("cat", Op::Concat { axis: 0 }, ins, "y").unwrap();
        g.add_output("y", y);
        g
    }

    #[test]
    fn concat_kernel_size_does_not_grow_with_its_inputs() {
        let (_, small) = kernel_sizes(&concat(MAX_UNROLLED_OPERANDS + 1));
        let (_, large) = kernel_sizes(&concat(5000));
        assert_eq!(small.len(), 1);
        assert_eq!(
            large[0], small[0],
            "the 5,000-input Concat's kernel is as long as a 65-input one's"
        );
    }

    #[test]
    fn identical_library_kernels_share_a_function() {
        let mut g = Graph::new("chain");
        let mut v = g.add_input("x", TensorType::fixed(DType::F32, &[1, 4]));
        for i in 0..100 {
            v = g
                .add(
                    format!("r{i}"),
                    Op::Unary(Unary::Relu),
                    vec![Some(v)],
                    format!("t{i}"),
                )
                .unwrap();
        }
        g.add_output("y", v);
        let (distinct, sizes) = kernel_sizes(&g);
        assert_eq!(sizes.len(), 100, "a kernel per Relu");
        assert_eq!(distinct, 1, "one function for all of them");
    }
}
