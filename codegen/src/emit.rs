//! Builds the LLVM module of a compiled model: the weights blob, one function per kernel, the
//! run function that calls them in order, the model descriptor the runtime reads, and the
//! exported C API (`NAME_create`, `NAME_run`, ...). The micro-kernel and runtime bitcode is
//! linked in, everything but the API is made internal, and the module is verified.

use crate::api::Api;
use crate::error::{CodegenError, Result};
use crate::gen::{llvm, runtime_fn, KernelBuilder};
use crate::kernel::Storage;
use crate::node::NodeInfo;
use crate::plan::kernel::{Kernel, KernelImpl};
use crate::plan::Plan;
use crate::target::TargetDesc;
use crate::uk::UkCall;
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::types::{BasicTypeEnum, StructType};
use inkwell::values::{BasicValueEnum, FunctionValue, GlobalValue, PointerValue};
use inkwell::{AddressSpace, IntPredicate};
use kiln_ir::{Graph, TensorType};
use std::collections::HashMap;

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

/// Emits `i32 kiln.k{i}(ptr ctx, ptr args)` for every kernel of the plan into `module` (whose
/// triple decides where they run): the CPU module's kernels, or the bodies the CUDA device
/// module wraps in kernel entries.
pub(crate) fn kernel_functions<'ctx>(
    cx: &'ctx Context,
    module: &Module<'ctx>,
    parts: &ModuleParts<'_>,
    on_kernel: &mut dyn FnMut(usize, usize),
) -> Result<Vec<FunctionValue<'ctx>>> {
    let e = Emitter {
        cx,
        module,
        builder: cx.create_builder(),
        parts,
    };
    let n = parts.plan.kernels.len();
    let mut fns = vec![];
    let mut shared: HashMap<UkKey, FunctionValue<'ctx>> = HashMap::new();
    for (i, k) in parts.plan.kernels.iter().enumerate() {
        on_kernel(i, n);
        let key = uk_key(parts.graph, k);
        let f = match key.as_ref().and_then(|key| shared.get(key)) {
            Some(&f) => f,
            None => e.kernel_function(i, k)?,
        };
        if let Some(key) = key {
            shared.entry(key).or_insert(f);
        }
        fns.push(f);
    }
    Ok(fns)
}

/// Above this many inputs, a library kernel's descriptors are filled by a loop over a constant
/// table (`describe_in_loop`) instead of straight-line stores, which LLVM specialises best but
/// which made a Concat of 10,000 inputs a function of 50,000 stores.
const MAX_UNROLLED_OPERANDS: usize = 64;

/// Kernels per part of the run function of a large model (see `run_function`).
const RUN_PART_KERNELS: usize = 256;

/// The pointers every kernel call of a run is built from.
struct RunBases<'ctx> {
    ctx: PointerValue<'ctx>,
    inputs: PointerValue<'ctx>,
    outputs: PointerValue<'ctx>,
    arena: PointerValue<'ctx>,
    weights: PointerValue<'ctx>,
    /// The profile of this run, when the model is instrumented.
    prof: Option<PointerValue<'ctx>>,
}

/// Marks the kernels `noinline`. Inlined, every kernel of the model would land in the run
/// function, and LLVM's time on one function grows faster than its size (a graph of 2,000
/// small kernels took 50 s): called, each kernel is optimized on its own and the run function
/// stays a list of calls. A call costs nanoseconds next to a kernel.
fn keep_out_of_line<'ctx>(cx: &'ctx Context, kernels: &[FunctionValue<'ctx>]) {
    for &f in kernels {
        crate::llvm::set_noinline(cx, f);
    }
}

/// Everything a library kernel's body depends on: the call and its operands' types and
/// presence. Kernels with equal keys share one function, so a graph that repeats a layer
/// (or a chain of 200k identical Relus) gives LLVM one body to specialise, not one per node.
#[derive(PartialEq, Eq, Hash)]
struct UkKey {
    symbol: &'static str,
    iattr: Vec<i64>,
    fattr: Vec<u64>,
    inputs: Vec<Option<TensorType>>,
    outputs: Vec<TensorType>,
    scratch: bool,
}

fn uk_key(graph: &Graph, k: &Kernel) -> Option<UkKey> {
    let KernelImpl::Ukernel(call) = &k.imp else {
        return None;
    };
    Some(UkKey {
        symbol: call.symbol,
        iattr: call.iattr.clone(),
        fattr: call.fattr.iter().map(|f| f.to_bits()).collect(),
        inputs: k
            .inputs
            .iter()
            .map(|v| v.map(|v| graph.value_type(v).clone()))
            .collect(),
        outputs: k.outputs.iter().map(|&v| graph.value_type(v).clone()).collect(),
        scratch: k.scratch.is_some(),
    })
}

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
    let weights = (!external).then(|| e.weights_global());
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
            let ty = cx.i8_type().array_type(parts.plan.weights.len().max(1) as u32);
            let g = module.add_global(ty, None, &variant_weights_name(j));
            g.set_linkage(Linkage::External);
            g
        }
        None => {
            let g = e.weights_global();
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

    fn weights_global(&self) -> GlobalValue<'ctx> {
        let bytes = &self.parts.plan.weights;
        // An empty array would make a zero-sized global; one byte keeps the symbol valid.
        let v = self
            .cx
            .const_string(if bytes.is_empty() { &[0u8] } else { bytes }, false);
        let g = self.const_global("kiln.weights", v.into(), 64);
        g.set_unnamed_addr(false);
        g
    }

    /// `i32 kernel(ptr ctx, ptr args)` for kernel `i`.
    fn kernel_function(&self, i: usize, k: &Kernel) -> Result<FunctionValue<'ctx>> {
        let ptr = self.ptr();
        let ty = self.cx.i32_type().fn_type(&[ptr.into(), ptr.into()], false);
        let f = self
            .module
            .add_function(&format!("kiln.k{i}"), ty, Some(Linkage::Internal));
        crate::llvm::set_kernel_attributes(self.cx, f, self.parts.target);
        let entry = self.cx.append_basic_block(f, "entry");
        self.builder.position_at_end(entry);
        let mut info = NodeInfo::new(self.parts.graph, k.node);
        if let Some((slot, v)) = k.extra {
            info = info.with_extra(slot, v);
        }
        match &k.imp {
            KernelImpl::Generated(g) => {
                let kb = KernelBuilder {
                    cx: self.cx,
                    module: self.module,
                    builder: &self.builder,
                    function: f,
                    target: self.parts.target,
                    node: &info,
                    n_inputs: k.inputs.len(),
                    n_outputs: k.outputs.len(),
                    n_packed: k.packed.len(),
                };
                g.emit(&kb)?;
            }
            KernelImpl::Ukernel(call) => self.ukernel_body(i, f, k, call)?,
            // Emitted as a PTX entry of its own (nvptx::device); never called as a body.
            KernelImpl::Gpu(_) => {
                self.builder
                    .build_return(Some(&self.cx.i32_type().const_zero()))
                    .map_err(llvm)?;
            }
        }
        Ok(f)
    }

    fn tensor_type(&self) -> StructType<'ctx> {
        let (p, i) = (self.ptr().into(), self.cx.i64_type().into());
        self.cx.struct_type(&[p, p, i, i, i], false)
    }

    fn uk_args_type(&self) -> StructType<'ctx> {
        let (p, i): (BasicTypeEnum, BasicTypeEnum) = (self.ptr().into(), self.cx.i64_type().into());
        self.cx.struct_type(&[p, i, p, i, p, i, p, i, p, p], false)
    }

    /// Fills `kiln_tensor` descriptors and `kiln_uk_args`, calls `kiln_uk_<symbol>`.
    fn ukernel_body(&self, i: usize, f: FunctionValue<'ctx>, k: &Kernel, call: &UkCall) -> Result<()> {
        let b = &self.builder;
        let graph = self.parts.graph;
        let i64t = self.cx.i64_type();
        let tt = self.tensor_type();
        let args = f.get_nth_param(1).expect("args").into_pointer_value();
        let ctx = f.get_nth_param(0).expect("ctx").into_pointer_value();
        let load_arg = |slot: usize| -> Result<PointerValue<'ctx>> {
            let p = unsafe {
                b.build_in_bounds_gep(self.ptr(), args, &[i64t.const_int(slot as u64, false)], "p")
            }
            .map_err(llvm)?;
            Ok(b.build_load(self.ptr(), p, "a")
                .map_err(llvm)?
                .into_pointer_value())
        };
        let describe = |tensors: PointerValue<'ctx>,
                        idx: usize,
                        slot: usize,
                        ty: Option<&TensorType>,
                        tag: &str|
         -> Result<()> {
            let t = unsafe { b.build_in_bounds_gep(tt, tensors, &[i64t.const_int(idx as u64, false)], "t") }
                .map_err(llvm)?;
            let (data, dims, rank, dtype, numel) = match ty {
                Some(ty) => {
                    let shape: Vec<i64> = ty
                        .fixed_shape()
                        .unwrap_or_default()
                        .iter()
                        .map(|&d| d as i64)
                        .collect();
                    let numel: i64 = shape.iter().product();
                    let dims = self.i64_array(&format!("kiln.k{i}.{tag}{idx}.dims"), &shape);
                    (
                        load_arg(slot)?,
                        dims,
                        shape.len() as u64,
                        ty.dtype as u64,
                        numel as u64,
                    )
                }
                None => (self.ptr().const_null(), self.ptr().const_null(), 0, 0, 0),
            };
            let fields: [BasicValueEnum; 5] = [
                data.into(),
                dims.into(),
                i64t.const_int(rank, false).into(),
                i64t.const_int(dtype, false).into(),
                i64t.const_int(numel, false).into(),
            ];
            for (fi, v) in fields.iter().enumerate() {
                let p = b.build_struct_gep(tt, t, fi as u32, "f").map_err(llvm)?;
                b.build_store(p, *v).map_err(llvm)?;
            }
            Ok(())
        };
        let n_in = k.inputs.len();
        let n_out = k.outputs.len();
        let ins = b
            .build_array_alloca(tt, i64t.const_int(n_in.max(1) as u64, false), "ins")
            .map_err(llvm)?;
        let outs = b
            .build_array_alloca(tt, i64t.const_int(n_out.max(1) as u64, false), "outs")
            .map_err(llvm)?;
        if n_in > MAX_UNROLLED_OPERANDS {
            self.describe_in_loop(i, f, ins, k)?;
        } else {
            for (idx, v) in k.inputs.iter().enumerate() {
                describe(ins, idx, idx, v.map(|v| graph.value_type(v)), "in")?;
            }
        }
        for (idx, v) in k.outputs.iter().enumerate() {
            describe(outs, idx, n_in + idx, Some(graph.value_type(*v)), "out")?;
        }
        let scratch = match k.scratch {
            Some(_) => load_arg(n_in + n_out)?,
            None => self.ptr().const_null(),
        };
        let at = self.uk_args_type();
        let a = b.build_alloca(at, "ukargs").map_err(llvm)?;
        let fields: [BasicValueEnum; 10] = [
            ins.into(),
            i64t.const_int(n_in as u64, false).into(),
            outs.into(),
            i64t.const_int(n_out as u64, false).into(),
            self.i64_array(&format!("kiln.k{i}.iattr"), &call.iattr).into(),
            i64t.const_int(call.iattr.len() as u64, false).into(),
            self.f64_array(&format!("kiln.k{i}.fattr"), &call.fattr).into(),
            i64t.const_int(call.fattr.len() as u64, false).into(),
            scratch.into(),
            ctx.into(),
        ];
        for (fi, v) in fields.iter().enumerate() {
            let p = b.build_struct_gep(at, a, fi as u32, "f").map_err(llvm)?;
            b.build_store(p, *v).map_err(llvm)?;
        }
        let name = format!("kiln_uk_{}", call.symbol);
        let uk = self.module.get_function(&name).unwrap_or_else(|| {
            let ty = self.cx.i32_type().fn_type(&[self.ptr().into()], false);
            self.module.add_function(&name, ty, Some(Linkage::External))
        });
        let rc = b.build_call(uk, &[a.into()], "rc").map_err(llvm)?;
        let rc = rc
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| CodegenError::internal("ukernel returns i32"))?;
        b.build_return(Some(&rc)).map_err(llvm)?;
        Ok(())
    }

    /// The input descriptors of a library kernel with many inputs (a Concat of thousands):
    /// copied from a constant table whose data pointers are null, then a loop sets each
    /// `data` from the argument slots — a function whose size does not depend on the count.
    fn describe_in_loop(
        &self,
        i: usize,
        f: FunctionValue<'ctx>,
        ins: PointerValue<'ctx>,
        k: &Kernel,
    ) -> Result<()> {
        let b = &self.builder;
        let graph = self.parts.graph;
        let (i64t, tt, ptr) = (self.cx.i64_type(), self.tensor_type(), self.ptr());
        // Inputs share few shapes: one dims array per shape.
        let mut dims_of: HashMap<Vec<i64>, PointerValue<'ctx>> = HashMap::new();
        let mut rows = Vec::with_capacity(k.inputs.len());
        for v in &k.inputs {
            let row = match v.map(|v| graph.value_type(v)) {
                Some(ty) => {
                    let shape: Vec<i64> = ty
                        .fixed_shape()
                        .unwrap_or_default()
                        .iter()
                        .map(|&d| d as i64)
                        .collect();
                    let n = dims_of.len();
                    let dims = *dims_of
                        .entry(shape.clone())
                        .or_insert_with(|| self.i64_array(&format!("kiln.k{i}.dims{n}"), &shape));
                    [
                        ptr.const_null().into(),
                        dims.into(),
                        i64t.const_int(shape.len() as u64, false).into(),
                        i64t.const_int(ty.dtype as u64, false).into(),
                        i64t.const_int(shape.iter().product::<i64>() as u64, false).into(),
                    ]
                }
                None => [
                    ptr.const_null().into(),
                    ptr.const_null().into(),
                    i64t.const_zero().into(),
                    i64t.const_zero().into(),
                    i64t.const_zero().into(),
                ],
            };
            rows.push(tt.const_named_struct(&row));
        }
        let table = self.const_global(&format!("kiln.k{i}.ins"), tt.const_array(&rows).into(), 8);
        // kiln_tensor is five 8-byte fields.
        let bytes = i64t.const_int(40 * rows.len() as u64, false);
        b.build_memcpy(ins, 8, table.as_pointer_value(), 8, bytes)
            .map_err(llvm)?;
        // for (j = 0; j < n; j++) ins[j].data = args[j];   (input j is argument slot j)
        let args = f.get_nth_param(1).expect("args").into_pointer_value();
        let pre = b.get_insert_block().expect("positioned");
        let (body, done) = (
            self.cx.append_basic_block(f, "ins.loop"),
            self.cx.append_basic_block(f, "ins.done"),
        );
        b.build_unconditional_branch(body).map_err(llvm)?;
        b.position_at_end(body);
        let j = b.build_phi(i64t, "j").map_err(llvm)?;
        j.add_incoming(&[(&i64t.const_zero(), pre)]);
        let jv = j.as_basic_value().into_int_value();
        let src = unsafe { b.build_in_bounds_gep(ptr, args, &[jv], "slot") }.map_err(llvm)?;
        let data = b.build_load(ptr, src, "data").map_err(llvm)?;
        let t = unsafe { b.build_in_bounds_gep(tt, ins, &[jv], "t") }.map_err(llvm)?;
        let dst = b.build_struct_gep(tt, t, 0, "data.p").map_err(llvm)?;
        b.build_store(dst, data).map_err(llvm)?;
        let next = b
            .build_int_add(jv, i64t.const_int(1, false), "j.next")
            .map_err(llvm)?;
        j.add_incoming(&[(&next, body)]);
        let more = b
            .build_int_compare(
                IntPredicate::ULT,
                next,
                i64t.const_int(rows.len() as u64, false),
                "more",
            )
            .map_err(llvm)?;
        b.build_conditional_branch(more, body, done).map_err(llvm)?;
        b.position_at_end(done);
        Ok(())
    }

    /// Kernel `i`'s argument slots when it has many (a Concat of thousands of inputs): a loop
    /// over a constant table of (kind, index or offset) rows resolves each against `bases`
    /// (inputs, outputs, arena, weights), where straight-line code would be one basic block
    /// that grows with the graph and that LLVM's instruction scheduler takes quadratic time on.
    fn fill_args_in_loop(
        &self,
        f: FunctionValue<'ctx>,
        i: usize,
        args: PointerValue<'ctx>,
        slots: &[Option<Storage>],
        bases: [PointerValue<'ctx>; 4],
    ) -> Result<()> {
        let b = &self.builder;
        let (i64t, ptr, i8t) = (self.cx.i64_type(), self.ptr(), self.cx.i8_type());
        // Kinds: 0 to 3 index `bases`; 4 is an absent operand (null).
        let row = |s: &Option<Storage>| -> [u64; 2] {
            match *s {
                Some(Storage::Input(j)) => [0, j as u64],
                Some(Storage::Output(j)) => [1, j as u64],
                Some(Storage::Arena(off)) => [2, off],
                Some(Storage::Weights(off)) => [3, off],
                None => [4, 0],
            }
        };
        let flat: Vec<i64> = slots.iter().flat_map(row).map(|v| v as i64).collect();
        let table = self.i64_array(&format!("kiln.k{i}.slots"), &flat);
        let pre = b.get_insert_block().expect("positioned");
        let bb = |name: &str| self.cx.append_basic_block(f, &format!("{name}{i}"));
        let (head, io, offset, null, store, done) = (
            bb("slots"),
            bb("slots.io"),
            bb("slots.offset"),
            bb("slots.null"),
            bb("slots.store"),
            bb("slots.done"),
        );
        b.build_unconditional_branch(head).map_err(llvm)?;
        b.position_at_end(head);
        let j = b.build_phi(i64t, "slot").map_err(llvm)?;
        j.add_incoming(&[(&i64t.const_zero(), pre)]);
        let jv = j.as_basic_value().into_int_value();
        let field = |k: u64, name: &str| -> Result<inkwell::values::IntValue<'ctx>> {
            let at = b
                .build_int_add(
                    b.build_int_mul(jv, i64t.const_int(2, false), "r").map_err(llvm)?,
                    i64t.const_int(k, false),
                    "at",
                )
                .map_err(llvm)?;
            let p = unsafe { b.build_in_bounds_gep(i64t, table, &[at], name) }.map_err(llvm)?;
            Ok(b.build_load(i64t, p, name).map_err(llvm)?.into_int_value())
        };
        let (kind, value) = (field(0, "kind")?, field(1, "value")?);
        // The base for kinds 0 to 3 (null for an absent operand, which goes to `null`).
        let base_of = |which: &[u64]| -> Result<PointerValue<'ctx>> {
            let mut p = ptr.const_null();
            for &k in which {
                let is = b
                    .build_int_compare(IntPredicate::EQ, kind, i64t.const_int(k, false), "is")
                    .map_err(llvm)?;
                p = b
                    .build_select(is, bases[k as usize], p, "base")
                    .map_err(llvm)?
                    .into_pointer_value();
            }
            Ok(p)
        };
        b.build_switch(
            kind,
            null,
            &[
                (i64t.const_int(0, false), io),
                (i64t.const_int(1, false), io),
                (i64t.const_int(2, false), offset),
                (i64t.const_int(3, false), offset),
            ],
        )
        .map_err(llvm)?;
        // An input or output: the caller's pointer array, entry `value`.
        b.position_at_end(io);
        let array = base_of(&[0, 1])?;
        let entry = unsafe { b.build_in_bounds_gep(ptr, array, &[value], "io.p") }.map_err(llvm)?;
        let from_io = b.build_load(ptr, entry, "io").map_err(llvm)?.into_pointer_value();
        b.build_unconditional_branch(store).map_err(llvm)?;
        // The arena or the weights: `value` bytes in.
        b.position_at_end(offset);
        let base = base_of(&[2, 3])?;
        let from_offset = unsafe { b.build_in_bounds_gep(i8t, base, &[value], "p") }.map_err(llvm)?;
        b.build_unconditional_branch(store).map_err(llvm)?;
        b.position_at_end(null);
        b.build_unconditional_branch(store).map_err(llvm)?;
        b.position_at_end(store);
        let p = b.build_phi(ptr, "arg").map_err(llvm)?;
        p.add_incoming(&[(&from_io, io), (&from_offset, offset), (&ptr.const_null(), null)]);
        let dst = unsafe { b.build_in_bounds_gep(ptr, args, &[jv], "dst") }.map_err(llvm)?;
        b.build_store(dst, p.as_basic_value()).map_err(llvm)?;
        let next = b
            .build_int_add(jv, i64t.const_int(1, false), "next")
            .map_err(llvm)?;
        j.add_incoming(&[(&next, store)]);
        let more = b
            .build_int_compare(
                IntPredicate::ULT,
                next,
                i64t.const_int(slots.len() as u64, false),
                "more",
            )
            .map_err(llvm)?;
        b.build_conditional_branch(more, head, done).map_err(llvm)?;
        b.position_at_end(done);
        Ok(())
    }

    /// `i32 run(ptr ctx, ptr inputs, ptr outputs)`: every kernel in order, then output copies.
    /// The weights are the embedded global, or (None) the context's mapped weights file.
    ///
    /// A model of more than `RUN_PART_KERNELS` kernels calls them from `noinline` parts of that
    /// many kernels each: one function with a block per kernel (its call, its failure exit, its
    /// profiling hooks) costs LLVM time that grows faster than the kernel count, so the run
    /// function's size stays bounded however large the graph.
    fn run_function(
        &self,
        kernels: &[FunctionValue<'ctx>],
        weights: Option<GlobalValue<'ctx>>,
    ) -> Result<FunctionValue<'ctx>> {
        let n = self.parts.plan.kernels.len();
        let parts = if n > RUN_PART_KERNELS {
            (0..n)
                .step_by(RUN_PART_KERNELS)
                .enumerate()
                .map(|(c, lo)| self.run_part(c, lo..(lo + RUN_PART_KERNELS).min(n), kernels))
                .collect::<Result<Vec<_>>>()?
        } else {
            vec![]
        };
        let b = &self.builder;
        let ptr = self.ptr();
        let i64t = self.cx.i64_type();
        let i32t = self.cx.i32_type();
        let ty = i32t.fn_type(&[ptr.into(), ptr.into(), ptr.into()], false);
        let f = self.module.add_function("kiln.run", ty, Some(Linkage::Internal));
        crate::llvm::set_kernel_attributes(self.cx, f, self.parts.target);
        let entry = self.cx.append_basic_block(f, "entry");
        b.position_at_end(entry);
        let ctx = f.get_nth_param(0).expect("ctx").into_pointer_value();
        let inputs = f.get_nth_param(1).expect("inputs").into_pointer_value();
        let outputs = f.get_nth_param(2).expect("outputs").into_pointer_value();
        let arena = b
            .build_call(
                runtime_fn(self.cx, self.module, "kiln_rt_arena"),
                &[ctx.into()],
                "arena",
            )
            .map_err(llvm)?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| CodegenError::internal("kiln_rt_arena returns a pointer"))?
            .into_pointer_value();
        let prof = match self.instrumented() {
            true => Some(self.profile_gen().run_begin(ctx)?),
            false => None,
        };
        let weights = match weights {
            Some(g) => g.as_pointer_value(),
            None => b
                .build_call(
                    runtime_fn(self.cx, self.module, "kiln_rt_weights"),
                    &[ctx.into()],
                    "weights",
                )
                .map_err(llvm)?
                .try_as_basic_value()
                .basic()
                .ok_or_else(|| CodegenError::internal("kiln_rt_weights returns a pointer"))?
                .into_pointer_value(),
        };
        let bases = RunBases {
            ctx,
            inputs,
            outputs,
            arena,
            weights,
            prof,
        };
        if parts.is_empty() {
            self.kernel_calls(f, 0..n, kernels, &bases)?;
        }
        for (c, part) in parts.iter().enumerate() {
            let prof = prof.unwrap_or(ptr.const_null());
            let rc = b
                .build_call(
                    *part,
                    &[
                        ctx.into(),
                        inputs.into(),
                        outputs.into(),
                        arena.into(),
                        weights.into(),
                        prof.into(),
                    ],
                    "rc",
                )
                .map_err(llvm)?
                .try_as_basic_value()
                .basic()
                .ok_or_else(|| CodegenError::internal("a run part returns i32"))?
                .into_int_value();
            let failed = b
                .build_int_compare(IntPredicate::NE, rc, i32t.const_zero(), "failed")
                .map_err(llvm)?;
            let fail_bb = self.cx.append_basic_block(f, &format!("part_fail{c}"));
            let next_bb = self.cx.append_basic_block(f, &format!("after_part{c}"));
            b.build_conditional_branch(failed, fail_bb, next_bb)
                .map_err(llvm)?;
            b.position_at_end(fail_bb);
            b.build_return(Some(&rc)).map_err(llvm)?;
            b.position_at_end(next_bb);
        }
        for c in &self.parts.plan.output_copies {
            let src = self.locate(c.from, &bases)?;
            let dst = self.locate(Storage::Output(c.output), &bases)?;
            b.build_memcpy(dst, 1, src, 1, i64t.const_int(c.bytes, false))
                .map_err(llvm)?;
        }
        if let Some(prof) = prof {
            self.profile_gen().run_end(f, prof)?;
        }
        b.build_return(Some(&i32t.const_zero())).map_err(llvm)?;
        Ok(f)
    }

    /// `i32 kiln.run.part{c}(ctx, inputs, outputs, arena, weights, prof)`: the kernels of
    /// `range`, as the run function would call them; 0, or the failing kernel's status.
    fn run_part(
        &self,
        c: usize,
        range: std::ops::Range<usize>,
        kernels: &[FunctionValue<'ctx>],
    ) -> Result<FunctionValue<'ctx>> {
        let b = &self.builder;
        let ptr = self.ptr();
        let i32t = self.cx.i32_type();
        let ty = i32t.fn_type(&[ptr.into(); 6], false);
        let f = self
            .module
            .add_function(&format!("kiln.run.part{c}"), ty, Some(Linkage::Internal));
        crate::llvm::set_kernel_attributes(self.cx, f, self.parts.target);
        crate::llvm::set_noinline(self.cx, f);
        b.position_at_end(self.cx.append_basic_block(f, "entry"));
        let param = |i: u32| f.get_nth_param(i).expect("part parameter").into_pointer_value();
        let bases = RunBases {
            ctx: param(0),
            inputs: param(1),
            outputs: param(2),
            arena: param(3),
            weights: param(4),
            prof: self.instrumented().then(|| param(5)),
        };
        self.kernel_calls(f, range, kernels, &bases)?;
        b.build_return(Some(&i32t.const_zero())).map_err(llvm)?;
        Ok(f)
    }

    /// Where a storage lives, computed in the block being built.
    fn locate(&self, s: Storage, bases: &RunBases<'ctx>) -> Result<PointerValue<'ctx>> {
        let b = &self.builder;
        let (ptr, i64t) = (self.ptr(), self.cx.i64_type());
        let gep = |base: PointerValue<'ctx>, off: u64| unsafe {
            b.build_in_bounds_gep(self.cx.i8_type(), base, &[i64t.const_int(off, false)], "p")
        };
        let load = |arr: PointerValue<'ctx>, i: usize| -> Result<PointerValue<'ctx>> {
            let p = unsafe { b.build_in_bounds_gep(ptr, arr, &[i64t.const_int(i as u64, false)], "pp") }
                .map_err(llvm)?;
            Ok(b.build_load(ptr, p, "io").map_err(llvm)?.into_pointer_value())
        };
        match s {
            Storage::Input(i) => load(bases.inputs, i),
            Storage::Output(i) => load(bases.outputs, i),
            Storage::Arena(off) => gep(bases.arena, off).map_err(llvm),
            Storage::Weights(off) => gep(bases.weights, off).map_err(llvm),
        }
    }

    /// Calls the kernels of `range` in order from `f` (at the builder's block): each with its
    /// argument slots filled, between its profiling hooks, returning its status when it fails.
    fn kernel_calls(
        &self,
        f: FunctionValue<'ctx>,
        range: std::ops::Range<usize>,
        kernels: &[FunctionValue<'ctx>],
        bases: &RunBases<'ctx>,
    ) -> Result<()> {
        let b = &self.builder;
        let ptr = self.ptr();
        let i64t = self.cx.i64_type();
        let i32t = self.cx.i32_type();
        let plan = self.parts.plan;
        let ctx = bases.ctx;
        let max_args = plan.kernels[range.clone()]
            .iter()
            .map(|k| k.inputs.len() + k.outputs.len() + k.packed.len() + 1)
            .max()
            .unwrap_or(1);
        let args = b
            .build_array_alloca(ptr, i64t.const_int(max_args as u64, false), "args")
            .map_err(llvm)?;
        for i in range {
            let (k, kf) = (&plan.kernels[i], kernels[i]);
            let mut slots: Vec<Option<Storage>> = vec![];
            for v in &k.inputs {
                slots.push(match v {
                    Some(v) => Some(plan.storage_of(*v)?),
                    None => None,
                });
            }
            for v in &k.outputs {
                slots.push(Some(plan.storage_of(*v)?));
            }
            for off in &k.packed {
                slots.push(Some(Storage::Weights(*off)));
            }
            slots.push(k.scratch.map(Storage::Arena));
            if slots.len() > MAX_UNROLLED_OPERANDS {
                let table_bases = [bases.inputs, bases.outputs, bases.arena, bases.weights];
                self.fill_args_in_loop(f, i, args, &slots, table_bases)?;
            }
            for (slot, s) in slots
                .iter()
                .enumerate()
                .filter(|_| slots.len() <= MAX_UNROLLED_OPERANDS)
            {
                let p = match s {
                    Some(s) => self.locate(*s, bases)?,
                    None => ptr.const_null(),
                };
                let dst = unsafe {
                    b.build_in_bounds_gep(ptr, args, &[i64t.const_int(slot as u64, false)], "slot")
                }
                .map_err(llvm)?;
                b.build_store(dst, p).map_err(llvm)?;
            }
            if let Some(prof) = bases.prof {
                self.profile_gen().kernel_begin(f, prof)?;
            }
            let rc = b
                .build_call(kf, &[ctx.into(), args.into()], "rc")
                .map_err(llvm)?
                .try_as_basic_value()
                .basic()
                .ok_or_else(|| CodegenError::internal("kernel returns i32"))?
                .into_int_value();
            let failed = b
                .build_int_compare(IntPredicate::NE, rc, i32t.const_zero(), "failed")
                .map_err(llvm)?;
            let fail_bb = self.cx.append_basic_block(f, &format!("fail{i}"));
            let next_bb = self.cx.append_basic_block(f, &format!("after{i}"));
            b.build_conditional_branch(failed, fail_bb, next_bb)
                .map_err(llvm)?;
            b.position_at_end(fail_bb);
            let node = self.cstring(&format!("kiln.k{i}.node"), &k.node_name);
            let op = self.cstring(&format!("kiln.k{i}.op"), k.op_name);
            b.build_call(
                runtime_fn(self.cx, self.module, "kiln_rt_error_context"),
                &[ctx.into(), node.into(), op.into()],
                "",
            )
            .map_err(llvm)?;
            b.build_return(Some(&rc)).map_err(llvm)?;
            b.position_at_end(next_bb);
            if let Some(prof) = bases.prof {
                self.profile_gen().kernel_end(f, prof, i)?;
            }
        }
        Ok(())
    }

    /// `i32 run(ptr ctx, ptr inputs, ptr outputs)` of a portable artifact: the run function of
    /// the variant the context was created with (its description's `run`).
    fn dispatch_run_function(&self, desc_ty: StructType<'ctx>) -> Result<FunctionValue<'ctx>> {
        let (b, ptr, i32t) = (&self.builder, self.ptr(), self.cx.i32_type());
        let ty = i32t.fn_type(&[ptr.into(), ptr.into(), ptr.into()], false);
        let f = self.module.add_function("kiln.run", ty, Some(Linkage::Internal));
        crate::llvm::set_kernel_attributes(self.cx, f, self.parts.target);
        b.position_at_end(self.cx.append_basic_block(f, "entry"));
        let params: Vec<BasicValueEnum> = f.get_param_iter().collect();
        let desc = self
            .call_rt("kiln_rt_desc", &params[..1])?
            .expect("ptr")
            .into_pointer_value();
        // Field 12 of kiln_model_desc: run.
        let slot = b.build_struct_gep(desc_ty, desc, 12, "run").map_err(llvm)?;
        let run = b.build_load(ptr, slot, "run").map_err(llvm)?.into_pointer_value();
        let args: Vec<_> = params.iter().map(|a| (*a).into()).collect();
        let rc = b
            .build_indirect_call(ty, run, &args, "rc")
            .map_err(llvm)?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| CodegenError::internal("run returns i32"))?;
        b.build_return(Some(&rc)).map_err(llvm)?;
        Ok(f)
    }

    fn io_descs(&self, tag: &str, items: &[(String, TensorType)]) -> Result<PointerValue<'ctx>> {
        let (p, i32t, i64t) = (self.ptr(), self.cx.i32_type(), self.cx.i64_type());
        let st = self.cx.struct_type(
            &[p.into(), i32t.into(), i32t.into(), p.into(), i64t.into()],
            false,
        );
        let mut vals = vec![];
        for (n, (name, ty)) in items.iter().enumerate() {
            let shape: Vec<i64> = ty
                .fixed_shape()
                .ok_or_else(|| {
                    CodegenError::unsupported(
                        name,
                        "graph",
                        format!("{tag} '{name}' has a dynamic shape {ty}; bind it with --input-shape"),
                    )
                })?
                .iter()
                .map(|&d| d as i64)
                .collect();
            let bytes = ty.size_bytes().unwrap_or(0) as u64;
            vals.push(st.const_named_struct(&[
                self.cstring(&format!("kiln.{tag}{n}.name"), name).into(),
                i32t.const_int(ty.dtype as u64, false).into(),
                i32t.const_int(shape.len() as u64, false).into(),
                self.i64_array(&format!("kiln.{tag}{n}.dims"), &shape).into(),
                i64t.const_int(bytes, false).into(),
            ]));
        }
        if vals.is_empty() {
            return Ok(p.const_null());
        }
        let arr = st.const_array(&vals);
        Ok(self
            .const_global(&format!("kiln.{tag}s"), arr.into(), 8)
            .as_pointer_value())
    }

    /// The `kiln_weights_desc` of a build with external weights, or a null pointer.
    /// `i32 run(ptr ctx, ptr inputs, ptr outputs)` of a CUDA model: the runtime does it all.
    fn cuda_run_function(&self) -> Result<FunctionValue<'ctx>> {
        let (b, ptr, i32t) = (&self.builder, self.ptr(), self.cx.i32_type());
        let ty = i32t.fn_type(&[ptr.into(), ptr.into(), ptr.into()], false);
        let f = self.module.add_function("kiln.run", ty, Some(Linkage::Internal));
        crate::llvm::set_kernel_attributes(self.cx, f, self.parts.target);
        b.position_at_end(self.cx.append_basic_block(f, "entry"));
        let params: Vec<BasicValueEnum> = f.get_param_iter().collect();
        let rc = self
            .call_rt("kiln_rt_cuda_run", &params)?
            .ok_or_else(|| CodegenError::internal("kiln_rt_cuda_run returns i32"))?;
        b.build_return(Some(&rc)).map_err(llvm)?;
        Ok(f)
    }

    /// `kiln_cuda_desc` (kiln_cuda.h) of a CUDA model, or null.
    fn cuda_desc(&self) -> PointerValue<'ctx> {
        let Some(code) = self.parts.cuda else {
            return self.ptr().const_null();
        };
        let (p, i32t, i64t) = (self.ptr(), self.cx.i32_type(), self.cx.i64_type());
        let u3 = i32t.array_type(3);
        let kt = self
            .cx
            .struct_type(&[p.into(), u3.into(), u3.into(), i32t.into(), i32t.into()], false);
        let u32s = |v: [u32; 3]| i32t.const_array(&v.map(|x| i32t.const_int(x as u64, false)));
        let rows: Vec<_> = code
            .launches
            .iter()
            .enumerate()
            .map(|(i, l)| {
                kt.const_named_struct(&[
                    self.cstring(&format!("kiln.cuda.entry{i}"), &l.entry).into(),
                    u32s(l.grid).into(),
                    u32s(l.block).into(),
                    i32t.const_int(l.shared_bytes as u64, false).into(),
                    i32t.const_zero().into(),
                ])
            })
            .collect();
        let kernels = self
            .const_global("kiln.cuda.kernels", kt.const_array(&rows).into(), 8)
            .as_pointer_value();
        let ct = self.cx.struct_type(
            &[i32t.into(), i32t.into(), i64t.into(), i64t.into(), i64t.into()],
            false,
        );
        let copies: Vec<_> = self
            .parts
            .plan
            .output_copies
            .iter()
            .map(|c| {
                let (kind, index, offset) = crate::nvptx::storage_code(c.from);
                ct.const_named_struct(&[
                    i32t.const_int(c.output as u64, false).into(),
                    i32t.const_int(kind, false).into(),
                    i64t.const_int(index, false).into(),
                    i64t.const_int(offset, false).into(),
                    i64t.const_int(c.bytes, false).into(),
                ])
            })
            .collect();
        let copies = self
            .const_global("kiln.cuda.copies", ct.const_array(&copies).into(), 8)
            .as_pointer_value();
        let weights = match self.parts.api.weights_file {
            Some(_) => p.const_null(),
            None => self
                .module
                .get_global("kiln.weights")
                .map(|g| g.as_pointer_value())
                .unwrap_or_else(|| p.const_null()),
        };
        let fns = [
            "kiln_rt_cuda_create",
            "kiln_rt_cuda_run_device",
            "kiln_rt_cuda_destroy",
        ]
        .map(|n| {
            runtime_fn(self.cx, self.module, n)
                .as_global_value()
                .as_pointer_value()
        });
        let st = self.cx.struct_type(
            &[
                p.into(),
                p.into(),
                i32t.into(),
                i32t.into(),
                p.into(),
                p.into(),
                p.into(),
                i64t.into(),
                p.into(),
                p.into(),
                p.into(),
            ],
            false,
        );
        let value = st.const_named_struct(&[
            self.cstring("kiln.cuda.ptx", &code.ptx).into(),
            self.cstring("kiln.cuda.sm", &format!("sm_{}", code.sm)).into(),
            i32t.const_int(code.launches.len() as u64, false).into(),
            i32t.const_int(self.parts.plan.output_copies.len() as u64, false)
                .into(),
            kernels.into(),
            copies.into(),
            weights.into(),
            i64t.const_int(self.parts.plan.weights.len() as u64, false).into(),
            fns[0].into(),
            fns[1].into(),
            fns[2].into(),
        ]);
        self.const_global("kiln.cuda", value.into(), 8).as_pointer_value()
    }

    fn weights_desc(&self, layout_hash: Option<u64>) -> PointerValue<'ctx> {
        let (Some(file), Some(hash)) = (&self.parts.api.weights_file, layout_hash) else {
            return self.ptr().const_null();
        };
        let (p, i64t) = (self.ptr(), self.cx.i64_type());
        let st = self.cx.struct_type(&[p.into(), p.into(), i64t.into()], false);
        let value = st.const_named_struct(&[
            self.cstring("kiln.weights_file", file).into(),
            self.cstring("kiln.weights_layout_hash", &crate::weights_file::hex(hash))
                .into(),
            i64t.const_int(self.parts.plan.weights.len() as u64, false).into(),
        ]);
        self.const_global("kiln.weights_desc", value.into(), 8)
            .as_pointer_value()
    }

    /// `kiln_model_desc` (kiln_rt.h).
    fn model_desc_type(&self) -> StructType<'ctx> {
        let (p, i32t, i64t) = (self.ptr(), self.cx.i32_type(), self.cx.i64_type());
        self.cx.struct_type(
            &[
                p.into(),
                p.into(),
                p.into(),
                p.into(),
                p.into(),
                i32t.into(),
                i32t.into(),
                p.into(),
                p.into(),
                i64t.into(),
                i64t.into(),
                i64t.into(),
                p.into(),
                p.into(),
                // -- weights outside the binary --
                p.into(),
                // -- CUDA --
                p.into(),
            ],
            false,
        )
    }

    /// Bytes of working memory a context allocates: for a portable artifact, enough for any
    /// of its variants.
    fn arena_bytes(&self) -> u64 {
        match self.parts.portable {
            Some(p) => p.variants.iter().map(|v| v.plan.arena_bytes).max().unwrap_or(0),
            None => self.parts.plan.arena_bytes,
        }
    }

    fn model_desc(&self, run: FunctionValue<'ctx>, layout_hash: Option<u64>) -> Result<GlobalValue<'ctx>> {
        let parts = self.parts;
        let (i32t, i64t) = (self.cx.i32_type(), self.cx.i64_type());
        let inputs = signature_inputs(parts.graph);
        let outputs = signature_outputs(parts.graph);
        let st = self.model_desc_type();
        let sig = signature_json(parts, &inputs, &outputs, layout_hash);
        let kernels = self
            .profile_gen()
            .kernel_table_global(&crate::profile::kernel_table(parts.graph, parts.plan));
        let value = st.const_named_struct(&[
            self.cstring("kiln.name", parts.model_name).into(),
            self.cstring("kiln.version", env!("CARGO_PKG_VERSION")).into(),
            self.cstring("kiln.triple", &parts.target.triple).into(),
            self.cstring(
                "kiln.cpu_features",
                &parts.target.required_cpu_features().join(","),
            )
            .into(),
            self.cstring("kiln.signature", &sig).into(),
            i32t.const_int(inputs.len() as u64, false).into(),
            i32t.const_int(outputs.len() as u64, false).into(),
            self.io_descs("input", &inputs)?.into(),
            self.io_descs("output", &outputs)?.into(),
            i64t.const_int(parts.plan.arena_bytes, false).into(),
            i64t.const_int(parts.plan.thread_scratch_bytes, false).into(),
            i64t.const_int(parts.plan.kernels.len() as u64, false).into(),
            run.as_global_value().as_pointer_value().into(),
            kernels.into(),
            self.weights_desc(layout_hash).into(),
            self.cuda_desc().into(),
        ]);
        Ok(self.const_global("kiln.model", value.into(), 8))
    }

    fn exported_fn(&self, name: &str, ty: inkwell::types::FunctionType<'ctx>) -> FunctionValue<'ctx> {
        let f = self.module.add_function(name, ty, Some(Linkage::External));
        crate::llvm::set_kernel_attributes(self.cx, f, self.parts.target);
        let entry = self.cx.append_basic_block(f, "entry");
        self.builder.position_at_end(entry);
        f
    }

    fn call_rt(&self, name: &str, args: &[BasicValueEnum<'ctx>]) -> Result<Option<BasicValueEnum<'ctx>>> {
        let f = runtime_fn(self.cx, self.module, name);
        let args: Vec<_> = args.iter().map(|a| (*a).into()).collect();
        Ok(self
            .builder
            .build_call(f, &args, "r")
            .map_err(llvm)?
            .try_as_basic_value()
            .basic())
    }

    /// NAME_create_on_device / create_with_weights_on_device / run_device of a CUDA model:
    /// straight calls into the CUDA runtime (cuda.c), which is linked into such a model.
    fn cuda_api_functions(&self, desc_global: GlobalValue<'ctx>) -> Result<()> {
        let b = &self.builder;
        let api = self.parts.api;
        let (p, i32t) = (self.ptr(), self.cx.i32_type());
        let desc = desc_global.as_pointer_value();

        let f = self.exported_fn(&api.symbol("create_on_device"), p.fn_type(&[i32t.into()], false));
        let device = f.get_nth_param(0).expect("device");
        let ctx = self
            .call_rt(
                "kiln_rt_cuda_create",
                &[desc.into(), device, p.const_null().into()],
            )?
            .expect("ptr");
        b.build_return(Some(&ctx)).map_err(llvm)?;

        if api.weights_file.is_some() {
            let f = self.exported_fn(
                &api.symbol("create_with_weights_on_device"),
                p.fn_type(&[p.into(), i32t.into()], false),
            );
            let path = f.get_nth_param(0).expect("path");
            let device = f.get_nth_param(1).expect("device");
            self.null_path_check(f, "create_with_weights_on_device")?;
            let ctx = self
                .call_rt("kiln_rt_cuda_create", &[desc.into(), device, path])?
                .expect("ptr");
            b.build_return(Some(&ctx)).map_err(llvm)?;
        }

        let f = self.exported_fn(
            &api.symbol("run_device"),
            i32t.fn_type(&[p.into(), p.into(), p.into(), p.into()], false),
        );
        let params: Vec<BasicValueEnum> = f.get_param_iter().collect();
        self.api_check(
            f,
            &DescRef::One(desc_global),
            "run_device",
            params[1].into_pointer_value(),
            params[2].into_pointer_value(),
            2,
        )?;
        let rc = self.call_rt("kiln_rt_cuda_run_device", &params)?.expect("i32");
        b.build_return(Some(&rc)).map_err(llvm)?;
        Ok(())
    }

    /// NAME_create / destroy / run / run_generic / last_error / workspace_size / info.
    fn api_functions(&self, desc: &DescRef<'ctx>) -> Result<()> {
        let b = &self.builder;
        let api = self.parts.api;
        let (p, i32t, i64t) = (self.ptr(), self.cx.i32_type(), self.cx.i64_type());
        let run = self.module.get_function("kiln.run").expect("run emitted");

        let f = self.exported_fn(&api.symbol("create"), p.fn_type(&[i32t.into()], false));
        let threads = f.get_nth_param(0).expect("threads");
        let ctx = match desc {
            DescRef::One(desc) => {
                self.call_rt("kiln_rt_create", &[desc.as_pointer_value().into(), threads])?
            }
            DescRef::Variants { descs, names, n, .. } => self.call_rt(
                "kiln_rt_create_variant",
                &[
                    (*descs).into(),
                    (*names).into(),
                    i32t.const_int(*n, false).into(),
                    threads,
                ],
            )?,
        }
        .expect("ptr");
        b.build_return(Some(&ctx)).map_err(llvm)?;

        if let (Some(_), DescRef::One(desc)) = (&api.weights_file, desc) {
            let f = self.exported_fn(
                &api.symbol("create_with_weights"),
                p.fn_type(&[p.into(), i32t.into()], false),
            );
            let path = f.get_nth_param(0).expect("path");
            let threads = f.get_nth_param(1).expect("threads");
            self.null_path_check(f, "create_with_weights")?;
            let ctx = self
                .call_rt(
                    "kiln_rt_create_with_weights",
                    &[desc.as_pointer_value().into(), threads, path],
                )?
                .expect("ptr");
            b.build_return(Some(&ctx)).map_err(llvm)?;
        }

        let f = self.exported_fn(
            &api.symbol("destroy"),
            self.cx.void_type().fn_type(&[p.into()], false),
        );
        self.call_rt("kiln_rt_destroy", &[f.get_nth_param(0).expect("ctx")])?;
        b.build_return(None).map_err(llvm)?;

        // A null context has no error of its own: report why create failed.
        let f = self.exported_fn(&api.symbol("last_error"), p.fn_type(&[p.into()], false));
        let ctx = f.get_nth_param(0).expect("ctx").into_pointer_value();
        let is_null = b.build_is_null(ctx, "null").map_err(llvm)?;
        let (bn, bc) = (
            self.cx.append_basic_block(f, "null"),
            self.cx.append_basic_block(f, "ctx"),
        );
        b.build_conditional_branch(is_null, bn, bc).map_err(llvm)?;
        b.position_at_end(bn);
        let e = self.call_rt("kiln_rt_create_error", &[])?.expect("ptr");
        b.build_return(Some(&e)).map_err(llvm)?;
        b.position_at_end(bc);
        let e = self.call_rt("kiln_rt_last_error", &[ctx.into()])?.expect("ptr");
        b.build_return(Some(&e)).map_err(llvm)?;

        self.exported_fn(&api.symbol("workspace_size"), i64t.fn_type(&[], false));
        b.build_return(Some(&i64t.const_int(self.arena_bytes(), false)))
            .map_err(llvm)?;

        // The same JSON string the descriptor points at (--info prints that one).
        self.exported_fn(&api.symbol("info"), p.fn_type(&[], false));
        let sig = self
            .module
            .get_global("kiln.signature")
            .ok_or_else(|| CodegenError::internal("the model descriptor's signature is emitted first"))?;
        b.build_return(Some(&sig.as_pointer_value())).map_err(llvm)?;

        self.introspection_functions(desc.io())?;

        let guarded_run = |f: FunctionValue<'ctx>,
                           what: &str,
                           ins: PointerValue<'ctx>,
                           outs: PointerValue<'ctx>,
                           mode: u64|
         -> Result<()> {
            self.api_check(f, desc, what, ins, outs, mode)?;
            let ctx = f.get_nth_param(0).expect("ctx").into_pointer_value();
            let rc = b
                .build_call(run, &[ctx.into(), ins.into(), outs.into()], "rc")
                .map_err(llvm)?
                .try_as_basic_value()
                .basic()
                .expect("i32");
            b.build_return(Some(&rc)).map_err(llvm)?;
            Ok(())
        };

        let f = self.exported_fn(
            &api.symbol("run_generic"),
            i32t.fn_type(&[p.into(), p.into(), p.into()], false),
        );
        let ins = f.get_nth_param(1).expect("inputs").into_pointer_value();
        let outs = f.get_nth_param(2).expect("outputs").into_pointer_value();
        guarded_run(f, "run_generic", ins, outs, 1)?;

        let n_in = self.parts.graph.inputs().len();
        let n_out = self.parts.graph.outputs().len();
        let params: Vec<_> = std::iter::repeat_n(p.into(), 1 + n_in + n_out).collect();
        let f = self.exported_fn(&api.symbol("run"), i32t.fn_type(&params, false));
        let ins = b
            .build_array_alloca(p, i64t.const_int(n_in.max(1) as u64, false), "ins")
            .map_err(llvm)?;
        let outs = b
            .build_array_alloca(p, i64t.const_int(n_out.max(1) as u64, false), "outs")
            .map_err(llvm)?;
        for i in 0..n_in + n_out {
            let (arr, idx) = if i < n_in { (ins, i) } else { (outs, i - n_in) };
            let slot = unsafe { b.build_in_bounds_gep(p, arr, &[i64t.const_int(idx as u64, false)], "s") }
                .map_err(llvm)?;
            b.build_store(slot, f.get_nth_param(1 + i as u32).expect("param"))
                .map_err(llvm)?;
        }
        if n_in + n_out > MAX_UNROLLED_OPERANDS {
            // Thousands of parameters stored in one block: LLVM's passes and instruction
            // scheduling take quadratic time on them, and there is nothing to optimize.
            crate::llvm::set_optnone(self.cx, f);
        }
        guarded_run(f, "run", ins, outs, 0)?;
        Ok(())
    }

    /// The start of an API function that runs the model: `kiln_rt_api_check` of its context and
    /// tensor pointers, returning its -1 when they are unusable (`what`: the function, for the
    /// message; `mode`: how the tensors are passed, see kiln_rt.h). The builder is left in the
    /// block where the checks passed.
    fn api_check(
        &self,
        f: FunctionValue<'ctx>,
        desc: &DescRef<'ctx>,
        what: &str,
        ins: PointerValue<'ctx>,
        outs: PointerValue<'ctx>,
        mode: u64,
    ) -> Result<()> {
        let b = &self.builder;
        let i32t = self.cx.i32_type();
        let ctx = f.get_nth_param(0).expect("ctx");
        let name = self.cstring(&format!("kiln.api.{what}"), &self.parts.api.symbol(what));
        let checked = [
            ctx,
            name.into(),
            ins.into(),
            outs.into(),
            i32t.const_int(mode, false).into(),
        ];
        // A portable model's context holds whichever variant this CPU got: any of them is
        // this model's.
        let rc = match desc {
            DescRef::One(d) => {
                let args: Vec<BasicValueEnum> = std::iter::once(d.as_pointer_value().into())
                    .chain(checked)
                    .collect();
                self.call_rt("kiln_rt_api_check", &args)?
            }
            DescRef::Variants { descs, n, .. } => {
                let args: Vec<BasicValueEnum> = [(*descs).into(), i32t.const_int(*n, false).into()]
                    .into_iter()
                    .chain(checked)
                    .collect();
                self.call_rt("kiln_rt_api_check_variant", &args)?
            }
        }
        .expect("i32")
        .into_int_value();
        let bad = b
            .build_int_compare(IntPredicate::NE, rc, i32t.const_zero(), "bad")
            .map_err(llvm)?;
        let (bn, bc) = (
            self.cx.append_basic_block(f, "bad"),
            self.cx.append_basic_block(f, "ok"),
        );
        b.build_conditional_branch(bad, bn, bc).map_err(llvm)?;
        b.position_at_end(bn);
        b.build_return(Some(&rc)).map_err(llvm)?;
        b.position_at_end(bc);
        Ok(())
    }

    /// The start of `NAME_create_with_weights*`: a NULL path fails with a message naming it
    /// (the runtime would otherwise read it as "no weights file" and advise this very call).
    fn null_path_check(&self, f: FunctionValue<'ctx>, what: &str) -> Result<()> {
        let b = &self.builder;
        let p = self.ptr();
        let path = f.get_nth_param(0).expect("path").into_pointer_value();
        let is_null = b.build_is_null(path, "null").map_err(llvm)?;
        let (bn, bc) = (
            self.cx.append_basic_block(f, "null"),
            self.cx.append_basic_block(f, "ok"),
        );
        b.build_conditional_branch(is_null, bn, bc).map_err(llvm)?;
        b.position_at_end(bn);
        let fmt = self.cstring(&format!("kiln.api.{what}.fmt"), "%s");
        let msg = self.cstring(
            &format!("kiln.api.{what}.null"),
            &format!("{}: weights_path is NULL", self.parts.api.symbol(what)),
        );
        self.call_rt(
            "kiln_rt_set_error",
            &[p.const_null().into(), fmt.into(), msg.into()],
        )?;
        b.build_return(Some(&p.const_null())).map_err(llvm)?;
        b.position_at_end(bc);
        Ok(())
    }

    /// NAME_input_count / input_name / input_dtype / input_shape and the output_ variants:
    /// each calls its kiln_rt_io_* function on the model descriptor.
    fn introspection_functions(&self, desc: PointerValue<'ctx>) -> Result<()> {
        let b = &self.builder;
        let (p, i32t) = (self.ptr(), self.cx.i32_type());
        for (output, what) in [(0u64, "input"), (1, "output")] {
            let which = i32t.const_int(output, false);
            for (suffix, rt, ty) in [
                ("count", "kiln_rt_io_count", i32t.fn_type(&[], false)),
                ("name", "kiln_rt_io_name", p.fn_type(&[i32t.into()], false)),
                ("dtype", "kiln_rt_io_dtype", i32t.fn_type(&[i32t.into()], false)),
                (
                    "shape",
                    "kiln_rt_io_shape",
                    i32t.fn_type(&[i32t.into(), p.into()], false),
                ),
            ] {
                let f = self.exported_fn(&self.parts.api.symbol(&format!("{what}_{suffix}")), ty);
                let mut args: Vec<BasicValueEnum> = vec![desc.into(), which.into()];
                args.extend(f.get_param_iter());
                let r = self.call_rt(rt, &args)?.expect("a value");
                b.build_return(Some(&r)).map_err(llvm)?;
            }
        }
        Ok(())
    }

    fn main_function(&self, desc: &DescRef<'ctx>) -> Result<()> {
        let (b, p, i32t) = (&self.builder, self.ptr(), self.cx.i32_type());
        let f = self.exported_fn("main", i32t.fn_type(&[i32t.into(), p.into()], false));
        let argc = f.get_nth_param(0).expect("argc");
        let argv = f.get_nth_param(1).expect("argv");
        let desc = match desc {
            DescRef::One(desc) => desc.as_pointer_value(),
            DescRef::Variants { descs, names, n, .. } => {
                let d = self
                    .call_rt(
                        "kiln_rt_select_variant",
                        &[(*descs).into(), (*names).into(), i32t.const_int(*n, false).into()],
                    )?
                    .expect("ptr")
                    .into_pointer_value();
                let is_null = b.build_is_null(d, "null").map_err(llvm)?;
                let (bn, bc) = (
                    self.cx.append_basic_block(f, "none"),
                    self.cx.append_basic_block(f, "chosen"),
                );
                b.build_conditional_branch(is_null, bn, bc).map_err(llvm)?;
                b.position_at_end(bn);
                let rc = self.call_rt("kiln_rt_no_variant_exit", &[])?.expect("i32");
                b.build_return(Some(&rc)).map_err(llvm)?;
                b.position_at_end(bc);
                d
            }
        };
        let rc = self
            .call_rt("kiln_exe_main", &[argc, argv, desc.into()])?
            .expect("i32");
        self.builder.build_return(Some(&rc)).map_err(llvm)?;
        Ok(())
    }
}

pub fn signature_inputs(graph: &Graph) -> Vec<(String, TensorType)> {
    graph
        .input_types()
        .map(|(n, t)| (n.to_string(), t.clone()))
        .collect()
}

pub fn signature_outputs(graph: &Graph) -> Vec<(String, TensorType)> {
    graph
        .outputs()
        .iter()
        .map(|o| (o.name.clone(), graph.value_type(o.value).clone()))
        .collect()
}

/// `c_name`: the tensor's parameter and size-macro name in the C header.
fn io_json(items: &[(String, TensorType)], c_names: &[String]) -> serde_json::Value {
    serde_json::Value::Array(
        items
            .iter()
            .zip(c_names)
            .map(|((name, ty), c_name)| {
                serde_json::json!({
                    "name": name,
                    "c_name": c_name,
                    "dtype": kiln_runtime::DTYPE_NAMES[ty.dtype as usize],
                    "shape": ty.fixed_shape().unwrap_or_default(),
                })
            })
            .collect(),
    )
}

/// The model's signature as printed by `--info` and `NAME_info()`.
pub fn signature_json(
    parts: &ModuleParts<'_>,
    inputs: &[(String, TensorType)],
    outputs: &[(String, TensorType)],
    layout_hash: Option<u64>,
) -> String {
    let ids = crate::header::c_names(&parts.api.prefix, inputs, outputs);
    let (in_ids, out_ids) = ids.split_at(inputs.len());
    let mut sig = serde_json::json!({
        "name": parts.model_name,
        "kiln_version": env!("CARGO_PKG_VERSION"),
        "target": parts.target.triple,
        "cpu": parts.target.cpu,
        "cpu_features": parts.target.required_cpu_features(),
        "inputs": io_json(inputs, in_ids),
        "outputs": io_json(outputs, out_ids),
        "kernels": parts.plan.kernels.len(),
        "weights_bytes": parts.plan.weights.len(),
        "arena_bytes": parts.plan.arena_bytes,
    });
    if let Some(code) = parts.cuda {
        sig["device"] = format!("cuda sm_{}", code.sm).into();
    }
    if let Some(p) = parts.portable {
        sig["variants"] = p.names().into();
        match parts.variant {
            // A context's own description (`--info`): the variant it runs.
            Some(i) => sig["cpu"] = p.names()[i].clone().into(),
            // The artifact as a whole (`NAME_info`): what the least of its variants needs.
            None => {
                let first = &p.variants[0];
                sig["cpu"] = "portable".into();
                sig["cpu_features"] = first.target.required_cpu_features().into();
                sig["kernels"] = first.plan.kernels.len().into();
                sig["weights_bytes"] = p
                    .variants
                    .iter()
                    .map(|v| v.plan.weights.len())
                    .sum::<usize>()
                    .into();
                sig["arena_bytes"] = p.variants.iter().map(|v| v.plan.arena_bytes).max().into();
            }
        }
    }
    if let (Some(file), Some(hash)) = (&parts.api.weights_file, layout_hash) {
        sig["weights_file"] = file.as_str().into();
        sig["weights_layout_hash"] = crate::weights_file::hex(hash).into();
    }
    sig.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use inkwell::values::AsValueRef;
    use kiln_ir::{DType, Op, Unary};

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
