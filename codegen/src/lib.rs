//! kiln-codegen: lowers a typed graph to kernels, plans memory, emits LLVM IR with inkwell,
//! links the micro-kernel and runtime bitcode, and writes artifacts (executable, static or shared
//! library + C header + pkg-config and CMake files, object, LLVM IR, assembly).

pub mod api;
mod archive;
pub mod batch;
mod bf16_rounding;
pub mod buildfiles;
pub mod data_dependent;
pub mod emit;
pub mod error;
pub mod fuse;
pub mod gen;
pub mod generators;
pub mod header;
pub mod kernel;
pub mod linker;
pub mod llvm;
pub mod node;
pub mod nvptx;
pub mod plan;
pub mod profile;
pub mod report;
pub mod target;
pub mod tune;
pub mod uk;
pub mod weights_file;
pub mod weights_object;

#[cfg(test)]
mod test_rng;

pub use error::CodegenError;
pub use target::{TargetDesc, TargetNeeds};

use error::Result;
use inkwell::context::Context;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::FileType;
use inkwell::OptimizationLevel;
use kiln_ir::Graph;
use std::io::Write;
use std::path::{Path, PathBuf};

/// What `kiln compile` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Emit {
    /// A self-contained executable (linked with the system C compiler).
    Exe,
    /// `libNAME.a`, `NAME.h`, `NAME.pc` and `NAME-config.cmake`.
    StaticLib,
    /// `libNAME.so` (exporting only the `NAME_` API), `NAME.h`, `NAME.pc` and
    /// `NAME-config.cmake`.
    SharedLib,
    /// A relocatable object file with the model and its runtime.
    Obj,
    /// Optimized LLVM IR (text).
    LlvmIr,
    /// Assembly for the target.
    Asm,
    /// The PTX of a CUDA model's kernels (`--target cuda`).
    Ptx,
}

pub struct CompileOptions {
    /// The model name: the exported API's prefix (a C identifier).
    pub name: String,
    pub target: TargetDesc,
    pub emit: Emit,
    /// The C compiler that links executables and shared libraries; `None`: the one
    /// [`linker::linker_for`] finds for the target (`$CC` or `cc` for this machine's
    /// architecture, the cross toolchain for another).
    pub cc: Option<String>,
    /// What the kernel target needs ([`TargetNeeds`], the value the driver also gave the
    /// optimizer) and which plan passes run: `fuse-kernels` groups nodes into fused kernels
    /// (epilogues, elementwise chains; off with `--disable-pass fuse-kernels`, to measure what
    /// fusion buys or to bisect a wrong result), `absorb-bf16-rounding`, `store-bf16`.
    pub plan: plan::passes::PlanOptions,
    /// Add the profiling functions to the C API (`NAME_profile_enable`, ...). Executables can
    /// always profile (`--profile FILE.json`); a library without them times nothing.
    pub profile: bool,
    /// Write the packed weights to this safetensors file instead of embedding them; the
    /// artifact maps it at create time (see [`weights_file`]).
    pub weights_out: Option<PathBuf>,
    /// Run the kernels on an NVIDIA GPU of this compute capability (`--target cuda --sm N`);
    /// `target` is then the host CPU, which runs the launches.
    pub cuda_sm: Option<u32>,
    /// A batch range (`--input-shape x=1..8,...`): the graph is the per-sample program and the
    /// run calls it once per sample ([`batch`]).
    pub batch: Option<batch::Batch>,
    /// Let an operator without a GPU kernel run its C library kernel on one GPU block
    /// (`--gpu-library-kernels`, a development fallback: correct, but orders of magnitude
    /// slower). Without it, a CUDA model with such a node is refused, naming the node.
    pub gpu_library_kernels: bool,
    /// Run the f32 products of a CUDA model on TF32 tensor cores (`--precision tf32`).
    pub gpu_tf32: bool,
}

impl CompileOptions {
    /// The target the kernels are planned for: the GPU of a CUDA model, else the CPU.
    pub fn kernel_target(&self) -> Result<TargetDesc> {
        match self.cuda_sm {
            Some(sm) => {
                let mut t = TargetDesc::cuda(nvptx::check_sm(sm)?)?;
                t.tf32 = self.gpu_tf32;
                Ok(t)
            }
            None => Ok(self.target.clone()),
        }
    }
}

/// The compile phases, for progress display.
pub trait Progress {
    fn phase(&mut self, name: &str);
    fn kernel(&mut self, index: usize, total: usize);
}

/// No progress display.
pub struct Silent;

impl Progress for Silent {
    fn phase(&mut self, _: &str) {}
    fn kernel(&mut self, _: usize, _: usize) {}
}

/// What a compilation produced.
#[derive(Clone, Debug)]
pub struct Summary {
    pub files: Vec<PathBuf>,
    pub kernels: usize,
    pub generated_kernels: usize,
    /// CPU kernels that compute bf16 dot products in hardware (`vdpbf16ps`).
    pub bf16_dot_kernels: usize,
    pub weights_bytes: u64,
    pub arena_bytes: u64,
    pub thread_scratch_bytes: u64,
    pub target: String,
    /// One line per kernel: node name, operator, implementation.
    pub kernel_lines: Vec<String>,
    /// What each plan pass did (`fuse-kernels`, `absorb-bf16-rounding`, `store-bf16`).
    pub plan_passes: Vec<plan::passes::PlanPassStats>,
    /// The planner's decisions in detail (kernels, nodes, memory, target).
    pub report: report::PlanReport,
    /// With `weights_out`: the file written, its layout hash and content hash.
    pub weights_file: Option<WeightsFile>,
    /// A portable artifact's CPU variants, baseline first (`x86-64-v3`, `x86-64-v4`, ...);
    /// empty for a single target. The kernel lines and the report then describe the last.
    pub variants: Vec<String>,
}

/// One CPU variant of a portable artifact: its target and the graph optimized for it (the
/// passes may depend on the target: bf16 products).
pub struct Variant<'a> {
    pub target: TargetDesc,
    /// What the variant's kernels need (the value its graph was optimized with).
    pub needs: TargetNeeds,
    pub graph: &'a Graph,
}

/// The weights file a compilation wrote.
#[derive(Clone, Debug)]
pub struct WeightsFile {
    pub path: PathBuf,
    pub layout_hash: u64,
    pub content_hash: u64,
}

/// Plans `graph` (kernel selection and memory) without generating code: what [`compile`] would
/// build, for reports. Cheap next to the LLVM pipeline.
pub fn plan_only(graph: &Graph, opts: &CompileOptions) -> Result<Summary> {
    let kernel_target = opts.kernel_target()?;
    let bounded = data_dependent::bound_outputs(graph)?;
    let graph = &*bounded.graph;
    let plan = plan::build_with(graph, &kernel_target, &opts.plan)?;
    Ok(summarize(graph, &plan, &kernel_target, vec![]))
}

/// The files a compilation to `out` writes (besides a `--weights-out` file): `out` itself, or
/// for a library, where `out` is the folder-and-stem, `dir/libname.a` (or `.so`), `dir/name.h`,
/// `dir/name.pc` and `dir/name-config.cmake`.
pub fn artifact_files(emit: Emit, out: &Path) -> Vec<PathBuf> {
    let lib_ext = match emit {
        Emit::StaticLib => "a",
        Emit::SharedLib => "so",
        _ => return vec![out.to_path_buf()],
    };
    let dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let stem = out
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".to_string());
    vec![
        dir.join(format!("lib{stem}.{lib_ext}")),
        dir.join(format!("{stem}.h")),
        dir.join(format!("{stem}.pc")),
        dir.join(format!("{stem}-config.cmake")),
    ]
}

/// Compiles `graph` and writes the artifact at `out` (for a library, `out` is the
/// folder-and-stem: see [`artifact_files`]).
/// Refuses a GPU plan in which a node runs as a C library kernel (on one block of the GPU):
/// the first such node is named, with the flag that accepts it.
fn refuse_gpu_library_kernels(graph: &Graph, plan: &plan::Plan) -> Result<()> {
    let library = |k: &&plan::kernel::Kernel| matches!(k.imp, plan::kernel::KernelImpl::Ukernel(_));
    let Some(k) = plan.kernels.iter().find(library) else {
        return Ok(());
    };
    let others = plan.kernels.iter().filter(library).count() - 1;
    let dtype = graph.value_type(k.node.out(0)).dtype;
    Err(node::NodeInfo::new(graph, k.node).unsupported(format!(
        "no GPU kernel for this node ({} {}){}: it would run as a C library kernel on one GPU \
         block, orders of magnitude slower; `kiln explain --target cuda` lists them, and \
         --gpu-library-kernels accepts them",
        dtype.name(),
        k.op_name,
        match others {
            0 => String::new(),
            n => format!(" nor for {n} other node{}", if n == 1 { "" } else { "s" }),
        }
    )))
}

pub fn compile(
    graph: &Graph,
    opts: &CompileOptions,
    out: &Path,
    progress: &mut dyn Progress,
) -> Result<Summary> {
    progress.phase("plan");
    let kernel_target = opts.kernel_target()?;
    let bounded = data_dependent::bound_outputs(graph)?;
    let graph = &*bounded.graph;
    if opts.emit == Emit::Ptx && opts.cuda_sm.is_none() {
        return Err(CodegenError::Target("--emit ptx needs --target cuda".into()));
    }
    let weights_file = match &opts.weights_out {
        Some(p) => Some(
            p.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .ok_or_else(|| CodegenError::Io(format!("--weights-out {}: not a file name", p.display())))?,
        ),
        None => None,
    };
    // Linked artifacts take their weights as an object of their own (`weights_object`), which
    // the planner writes as it packs them.
    let separate_weights = weights_file.is_none()
        && matches!(opts.emit, Emit::Exe | Emit::StaticLib | Emit::SharedLib)
        && weights_object::supported(opts.target.arch);
    let prefix = header::c_ident(&opts.name);
    let weights_symbol = weights_object::symbol(&prefix);
    let weights = match separate_weights {
        true => plan::weights::Weights::streamed(weights_object::ObjectWriter::create(
            opts.target.arch,
            &weights_symbol,
        )?),
        false => plan::weights::Weights::in_memory(),
    };
    let mut plan = plan::build_into(graph, &kernel_target, &opts.plan, weights)?;
    if opts.cuda_sm.is_some() && !opts.gpu_library_kernels {
        refuse_gpu_library_kernels(graph, &plan)?;
    }
    let weights_obj = plan.weights.finish_object()?;
    let device_code = match opts.cuda_sm {
        Some(_) => {
            progress.phase("ptx");
            Some(nvptx::build_device_code(
                graph,
                &plan,
                &kernel_target,
                &opts.name,
            )?)
        }
        None => None,
    };
    if let (Emit::Ptx, Some(code)) = (opts.emit, &device_code) {
        std::fs::write(out, &code.ptx)
            .map_err(|e| CodegenError::Io(format!("cannot write {}: {e}", out.display())))?;
        return Ok(summarize(graph, &plan, &kernel_target, vec![out.to_path_buf()]));
    }
    let api = api::Api {
        prefix,
        profile: opts.profile,
        weights_file,
        cuda: device_code.is_some(),
    };
    let parts = emit::ModuleParts {
        graph,
        plan: &plan,
        target: &opts.target,
        api: &api,
        model_name: &opts.name,
        with_main: opts.emit == Emit::Exe,
        cuda: device_code.as_ref(),
        portable: None,
        variant: None,
        weights_object: separate_weights.then_some(weights_symbol.as_str()),
        data_dependent: &bounded.outputs,
        batch: opts.batch.as_ref(),
    };
    progress.phase("codegen");
    let cx = Context::create();
    let (module, layout_hash) = emit::build_module(&cx, &parts, &mut |i, n| progress.kernel(i, n))?;
    let weights_len = plan.weights.len();
    let target = match &device_code {
        Some(code) => format!("CUDA sm_{} (host code: {})", code.sm, opts.target.triple),
        None => opts.target.triple.clone(),
    };
    let files = finish_module(
        &module,
        opts,
        out,
        progress,
        &api,
        graph,
        &bounded.outputs,
        &target,
        (plan.arena_bytes, plan.thread_scratch_bytes),
        device_code.is_some(),
        weights_obj.as_ref(),
    )?;
    let mut summary = summarize(graph, &plan, &kernel_target, files);
    summary.weights_bytes = weights_len as u64;
    if let (Some(path), Some(layout_hash)) = (&opts.weights_out, layout_hash) {
        progress.phase("weights");
        let content_hash = weights_file::write(path, &opts.name, layout_hash, plan.weights.bytes()?)?;
        summary.files.push(path.clone());
        summary.weights_file = Some(WeightsFile {
            path: path.clone(),
            layout_hash,
            content_hash,
        });
    }
    Ok(summary)
}

/// Plans every variant of a portable artifact; variants that would be the same code are
/// dropped (avx512_bf16 when no kernel computes bf16 products in hardware, avx512_vnni when no
/// kernel computes integer ones).
/// A portable artifact's variant: its graph (outputs bounded), plan and target.
type PlannedVariant<'a> = (Graph, plan::Plan, &'a TargetDesc);

/// The planned variants, and the graph outputs whose shapes are bounds (`data_dependent`; the
/// same for every variant, whose graphs differ only in what their targets' passes did).
fn plan_variants<'a>(
    variants: &'a [Variant<'a>],
    opts: &plan::passes::PlanOptions,
) -> Result<(Vec<PlannedVariant<'a>>, Vec<usize>)> {
    let mut planned = vec![];
    let mut data_dependent = vec![];
    for v in variants {
        let bounded = data_dependent::bound_outputs(v.graph)?;
        data_dependent = bounded.outputs;
        let graph = bounded.graph.into_owned();
        let opts = plan::passes::PlanOptions {
            needs: v.needs,
            ..opts.clone()
        };
        let plan = plan::build_with(&graph, &v.target, &opts)?;
        let uses = |f: fn(&dyn gen::GeneratedKernel) -> bool| {
            plan.kernels
                .iter()
                .any(|k| matches!(&k.imp, plan::kernel::KernelImpl::Generated(g) if f(g.as_ref())))
        };
        let needless = if v.target.has_avx512_bf16 {
            !uses(|g| g.bf16_dot_products())
        } else {
            v.target.has_avx512_vnni && !uses(|g| g.int8_dot_products())
        };
        if needless && !planned.is_empty() {
            continue;
        }
        planned.push((graph, plan, &v.target));
    }
    Ok((planned, data_dependent))
}

fn check_portable(opts: &CompileOptions) -> Result<()> {
    if opts.cuda_sm.is_some() || opts.weights_out.is_some() || opts.emit == Emit::Ptx {
        return Err(CodegenError::Target(
            "--cpu portable applies to CPU code with built-in weights (name a CPU with --cpu for --target cuda or --weights-out)"
                .into(),
        ));
    }
    Ok(())
}

fn summarize_portable(planned: &[(Graph, plan::Plan, &TargetDesc)], files: Vec<PathBuf>) -> Summary {
    let (graph, plan, target) = planned.last().expect("at least one variant");
    let mut s = summarize(graph, plan, target, files);
    s.variants = planned.iter().map(|(_, _, t)| t.variant_name()).collect();
    s.target = format!("{} portable ({})", target.triple, s.variants.join(", "));
    let mut blobs: Vec<&plan::weights::Weights> = vec![];
    for (_, p, _) in planned {
        if !blobs.contains(&&p.weights) {
            blobs.push(&p.weights);
        }
    }
    s.weights_bytes = blobs.iter().map(|b| b.len() as u64).sum();
    s.arena_bytes = planned.iter().map(|(_, p, _)| p.arena_bytes).max().unwrap_or(0);
    s.thread_scratch_bytes = planned
        .iter()
        .map(|(_, p, _)| p.thread_scratch_bytes)
        .max()
        .unwrap_or(0);
    s.report.target.variants = s.variants.clone();
    s
}

/// [`plan_only`] for a portable artifact (`--cpu portable`).
pub fn plan_only_portable(variants: &[Variant<'_>], opts: &CompileOptions) -> Result<Summary> {
    check_portable(opts)?;
    let (planned, _) = plan_variants(variants, &opts.plan)?;
    Ok(summarize_portable(&planned, vec![]))
}

/// Compiles a portable artifact (`--cpu portable`): one set of kernels per variant, the one
/// for this CPU chosen when a context is created. `opts.target` is the baseline the shared
/// code is compiled for ([`TargetDesc::portable_baseline`]).
pub fn compile_portable(
    variants: &[Variant<'_>],
    opts: &CompileOptions,
    out: &Path,
    progress: &mut dyn Progress,
) -> Result<Summary> {
    check_portable(opts)?;
    progress.phase("plan");
    let (planned, data_dependent) = plan_variants(variants, &opts.plan)?;
    let api = api::Api {
        prefix: header::c_ident(&opts.name),
        profile: opts.profile,
        weights_file: None,
        cuda: false,
    };
    let portable = emit::Portable {
        variants: planned
            .iter()
            .map(|(graph, plan, target)| emit::VariantParts { graph, plan, target })
            .collect(),
    };
    let (graph, plan, _) = &planned[0];
    let parts = emit::ModuleParts {
        graph,
        plan,
        target: &opts.target,
        api: &api,
        model_name: &opts.name,
        with_main: opts.emit == Emit::Exe,
        cuda: None,
        portable: Some(&portable),
        variant: None,
        weights_object: None,
        data_dependent: &data_dependent,
        batch: opts.batch.as_ref(),
    };
    progress.phase("codegen");
    let cx = Context::create();
    let module = emit::build_portable_module(&cx, &parts, &mut |i, n| progress.kernel(i, n))?;
    let arena = planned.iter().map(|(_, p, _)| p.arena_bytes).max().unwrap_or(0);
    let scratch = planned
        .iter()
        .map(|(_, p, _)| p.thread_scratch_bytes)
        .max()
        .unwrap_or(0);
    let header_target = format!(
        "{} (portable: {})",
        opts.target.triple,
        portable.names().join(", ")
    );
    let files = finish_module(
        &module,
        opts,
        out,
        progress,
        &api,
        graph,
        &data_dependent,
        &header_target,
        (arena, scratch),
        false,
        None,
    )?;
    Ok(summarize_portable(&planned, files))
}

/// Optimizes the module and writes the artifact; returns the files written.
#[allow(clippy::too_many_arguments)]
fn finish_module(
    module: &inkwell::module::Module<'_>,
    opts: &CompileOptions,
    out: &Path,
    progress: &mut dyn Progress,
    api: &api::Api,
    graph: &Graph,
    // The graph outputs whose shape is a bound (`data_dependent`), for the header.
    bounded: &[usize],
    target: &str,
    memory: (u64, u64),
    cuda: bool,
    // The weights' own object, when they are not in the module.
    weights: Option<&weights_object::TempObject>,
) -> Result<Vec<PathBuf>> {
    progress.phase("llvm");
    let tm = opts.target.target_machine(OptimizationLevel::Aggressive)?;
    // Drop the kernel library and runtime functions this model does not use before the
    // expensive pipeline, which would otherwise optimize all of them.
    module
        .run_passes("globaldce", &tm, PassBuilderOptions::create())
        .map_err(|e| CodegenError::internal(format!("LLVM optimization: {e}")))?;
    module
        .run_passes("default<O3>", &tm, PassBuilderOptions::create())
        .map_err(|e| CodegenError::internal(format!("LLVM optimization: {e}")))?;
    llvm::verify(module)?;

    let write = |path: &Path, bytes: &[u8]| -> Result<()> {
        std::fs::write(path, bytes)
            .map_err(|e| CodegenError::Io(format!("cannot write {}: {e}", path.display())))
    };
    let object = |ft: FileType| -> Result<inkwell::memory_buffer::MemoryBuffer> {
        tm.write_to_memory_buffer(module, ft)
            .map_err(|e| CodegenError::internal(format!("LLVM code generation: {e}")))
    };
    let extra: Vec<&Path> = weights.iter().map(|w| w.path.as_path()).collect();
    let mut files = vec![];
    match opts.emit {
        Emit::Ptx => unreachable!("written above"),
        Emit::LlvmIr => {
            write(out, module.print_to_string().to_bytes())?;
            files.push(out.to_path_buf());
        }
        Emit::Asm => {
            write(out, object(FileType::Assembly)?.as_slice())?;
            files.push(out.to_path_buf());
        }
        Emit::Obj => {
            write(out, object(FileType::Object)?.as_slice())?;
            files.push(out.to_path_buf());
        }
        Emit::Exe => {
            let obj = object(FileType::Object)?;
            progress.phase("link");
            let cc = linker::linker_for(opts.cc.as_deref(), &opts.target)?;
            linker::link_executable(&cc, obj.as_slice(), &extra, out)?;
            files.push(out.to_path_buf());
        }
        Emit::StaticLib | Emit::SharedLib => {
            let obj = object(FileType::Object)?;
            let obj = obj.as_slice();
            let paths = artifact_files(opts.emit, out);
            let (lib, h, pc, cmake) = (&paths[0], &paths[1], &paths[2], &paths[3]);
            let stem = out
                .file_name()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "model".to_string());
            let kind = if opts.emit == Emit::StaticLib {
                progress.phase("archive");
                let mut members = vec![archive::Member {
                    name: format!("{}.o", truncate(&api.prefix, 13)),
                    source: archive::Source::Bytes(obj),
                    symbols: api.exported(false),
                }];
                if let Some(w) = weights {
                    members.push(archive::Member {
                        name: format!("{}.w.o", truncate(&api.prefix, 11)),
                        source: archive::Source::File(&w.path, w.len),
                        symbols: vec![w.symbol.clone()],
                    });
                }
                let file = std::fs::File::create(lib)
                    .map_err(|e| CodegenError::Io(format!("cannot write {}: {e}", lib.display())))?;
                let mut w = std::io::BufWriter::new(file);
                archive::write_archive(&mut w, &members)
                    .and_then(|()| w.flush())
                    .map_err(|e| CodegenError::Io(format!("cannot write {}: {e}", lib.display())))?;
                buildfiles::LibKind::Static
            } else {
                progress.phase("link");
                let cc = linker::linker_for(opts.cc.as_deref(), &opts.target)?;
                linker::link_shared(&cc, obj, &extra, lib, &api.exported(false), cuda)?;
                buildfiles::LibKind::Shared
            };
            let text = header::header(
                api,
                &opts.name,
                target,
                &header::HeaderIo {
                    inputs: &emit::signature::signature_inputs(graph),
                    outputs: &emit::signature::signature_outputs(graph),
                    bounded,
                    batch: opts.batch.as_ref(),
                },
                memory,
                kind,
            );
            write(h, text.as_bytes())?;
            write(
                pc,
                buildfiles::pkg_config(&stem, &opts.name, kind, cuda).as_bytes(),
            )?;
            write(
                cmake,
                buildfiles::cmake_config(&stem, &opts.name, kind, cuda).as_bytes(),
            )?;
            files.extend(paths);
        }
    }
    Ok(files)
}

fn summarize(graph: &Graph, plan: &plan::Plan, target: &TargetDesc, files: Vec<PathBuf>) -> Summary {
    let generated_kernels = plan
        .kernels
        .iter()
        .filter(|k| {
            matches!(
                k.imp,
                plan::kernel::KernelImpl::Generated(_) | plan::kernel::KernelImpl::Gpu(_)
            )
        })
        .count();
    let bf16_dot_kernels = plan
        .kernels
        .iter()
        .filter(|k| match &k.imp {
            plan::kernel::KernelImpl::Generated(g) => g.bf16_dot_products(),
            plan::kernel::KernelImpl::Ukernel(c) => c.bf16_dot_products(),
            plan::kernel::KernelImpl::Gpu(_) => false,
        })
        .count();
    Summary {
        files,
        kernels: plan.kernels.len(),
        generated_kernels,
        bf16_dot_kernels,
        weights_bytes: plan.weights.len() as u64,
        arena_bytes: plan.arena_bytes,
        thread_scratch_bytes: plan.thread_scratch_bytes,
        target: target.describe(),
        kernel_lines: plan::passes::kernel_lines(graph, &plan.kernels),
        plan_passes: plan.passes.clone(),
        report: report::build(graph, plan, target),
        weights_file: None,
        variants: vec![],
    }
}

fn truncate(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}
