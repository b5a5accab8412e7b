//! kiln-driver: the compile driver. A [`Session`] takes a model from its file to an artifact —
//! import (frontend) → optimizer passes (freeze, channels-last, fusion, bf16 autocast, as the
//! [`Options`] say) → plan → emit → link (codegen) — and returns what it did as data
//! ([`Compiled`]: the files written, kernel counts, the [`Report`]). It prints nothing: progress
//! goes to a [`Progress`] callback, and the command line (or a test) decides what to show.
//!
//! The session also makes, in one place, the decisions that depend on the target: which CPU
//! or GPU the code is for, whether the artifact is portable, and what the target's kernels
//! need from the passes ([`Session::target_needs`]: whether the product kernels round their
//! operands to bf16 themselves, which changes what the bf16 autocast inserts and whether the
//! planner absorbs its casts). That one value goes to both the optimizer and the planner.
//!
//! Errors are `anyhow` errors carrying the underlying crate's error (`FrontendError`,
//! `PassError`, `CodegenError`, ...) so callers can classify them; a wrong option is a
//! [`UsageError`].

mod failure;
mod options;
pub mod report;
mod source;

pub use kiln_codegen::data_dependent::padded_values;
pub use kiln_codegen::plan::passes::{ABSORB_BF16_ROUNDING, FUSE_KERNELS, PLAN_PASS_NAMES, STORE_BF16};
pub use kiln_codegen::plan::Plan;
pub use kiln_codegen::weights_file::hex as layout_hash_hex;
pub use kiln_codegen::{Summary, TargetDesc, TargetNeeds, WeightsFile};
pub use kiln_optimizer::passes::bf16_autocast::Bf16Summary;
pub use kiln_optimizer::pipelines::{FUSE_PASS, PASS_NAMES};
pub use kiln_optimizer::{PassManager, PassStats, PipelineOptions};

/// Every name `--disable-pass` and `--print-after` accept, in the order the passes run: the
/// optimizer's graph passes ([`PASS_NAMES`]), then codegen's plan passes ([`PLAN_PASS_NAMES`]).
pub fn pass_names() -> Vec<&'static str> {
    PASS_NAMES.iter().chain(PLAN_PASS_NAMES).copied().collect()
}
pub use failure::{failure_kind, locate, FailureKind, Location};
pub use options::{
    default_autotune_cache, CompileMode, ConvAlgorithm, Cpu, Emit, Layout, Options, Precision, PrintAfter,
    Target,
};
pub use report::Report;
pub use source::{read_tensor_file, ModelSource};

use anyhow::{Context, Result};
use kiln_codegen::plan::passes::{PlanOptions, PlanPrint};
use kiln_ir::Graph;
use kiln_optimizer::PrintTarget;
use std::fmt;
use std::path::{Path, PathBuf};

/// A wrong or contradictory option (an unknown pass, `--sm` without CUDA, ...).
#[derive(Debug)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

fn usage(message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(UsageError(message.into()))
}

/// Progress of a compilation. `phase` names the stage that starts: `import`, `passes`,
/// `plan`, `ptx`, `codegen`, `llvm`, `link`, `archive`, `weights`; `kernel` counts the kernels
/// generated (index from 0).
pub trait Progress {
    fn phase(&mut self, _name: &str) {}
    fn kernel(&mut self, _index: usize, _total: usize) {}
}

impl<P: Progress + ?Sized> Progress for &mut P {
    fn phase(&mut self, name: &str) {
        (**self).phase(name)
    }
    fn kernel(&mut self, index: usize, total: usize) {
        (**self).kernel(index, total)
    }
}

/// No progress reports.
pub struct Silent;

impl Progress for Silent {}

/// Codegen's progress, passed on.
struct Forward<'a, 'p>(&'a mut (dyn Progress + 'p));

impl kiln_codegen::Progress for Forward<'_, '_> {
    fn phase(&mut self, name: &str) {
        self.0.phase(name)
    }
    fn kernel(&mut self, index: usize, total: usize) {
        self.0.kernel(index, total)
    }
}

/// What [`Session::compile`] (or [`Session::explain`]) did.
#[derive(Debug)]
pub struct Compiled {
    /// The model's name (the C API's prefix before it is made an identifier).
    pub name: String,
    /// The artifact path (for a library, the folder-and-stem: see
    /// [`kiln_codegen::artifact_files`]); nothing is written there when explaining.
    pub output: PathBuf,
    /// Files written, kernels, memory, target; with no files when explaining.
    pub summary: Summary,
    /// With `--precision bf16`: how much of the model's products read bf16 operands.
    pub bf16: Option<Bf16Summary>,
    /// What each optimizer pass did (of the first variant, for a portable artifact).
    pub passes: Vec<PassStats>,
    /// Where every node went, when [`Options::report`] asked for it or when explaining.
    pub report: Option<Report>,
    /// With `--mode max-autotune`: what tuning timed and read from its cache.
    pub tuning: Option<Tuning>,
    /// With a batch range: the range and which inputs and outputs it batches.
    pub batch: Option<report::BatchInfo>,
}

/// What `--mode max-autotune` did in one compilation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tuning {
    pub stats: kiln_codegen::tune::TuningStats,
    /// The cache file (None: none was kept, for want of a home folder).
    pub cache: Option<PathBuf>,
}

/// The targets a compilation is for.
struct Targets {
    /// The single target, or a portable artifact's baseline.
    main: TargetDesc,
    /// A portable artifact's CPU variants (empty for one target).
    variants: Vec<TargetDesc>,
    portable: bool,
}

/// A compilation: options and a progress callback. See the crate documentation.
pub struct Session<'p> {
    options: Options,
    progress: Box<dyn Progress + 'p>,
}

impl Session<'static> {
    /// A session without progress reports.
    pub fn new(options: Options) -> Session<'static> {
        Session {
            options,
            progress: Box::new(Silent),
        }
    }
}

impl<'p> Session<'p> {
    /// The same session reporting its progress to `progress`.
    pub fn with_progress<'q>(self, progress: impl Progress + 'q) -> Session<'q> {
        Session {
            options: self.options,
            progress: Box::new(progress),
        }
    }

    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Fails on a disabled pass that does not exist (graph or plan pass).
    pub fn check_passes(&self) -> Result<()> {
        let names = pass_names();
        for p in &self.options.disabled_passes {
            if !names.contains(&p.as_str()) {
                return Err(usage(format!(
                    "--disable-pass {p}: no such pass (passes: {})",
                    names.join(", ")
                )));
            }
        }
        Ok(())
    }

    /// The one place that decides what the target's kernels need from the passes, for CPU
    /// target `t` (for a CUDA model, the host CPU: then the GPU's kernels decide, and they never
    /// round their operands to bf16 themselves). The optimizer ([`Self::pipeline_options`])
    /// and the planner ([`kiln_codegen::plan::passes::PlanOptions`]) get this same value.
    pub fn target_needs(&self, t: &TargetDesc) -> TargetNeeds {
        match self.options.target {
            Target::Cpu => t.needs(),
            // `t` is the host CPU that runs the launches; the kernels' needs are the GPU's.
            Target::Cuda => {
                let sm = self.options.sm.unwrap_or(kiln_codegen::nvptx::DEFAULT_SM);
                match TargetDesc::cuda(sm) {
                    Ok(gpu) => gpu.needs(),
                    Err(_) => TargetNeeds {
                        dequantize_weights: true,
                        ..TargetNeeds::default()
                    },
                }
            }
        }
    }

    /// The optimizer's options for a target that needs `needs` ([`Self::target_needs`]).
    pub fn pipeline_options(&self, needs: TargetNeeds) -> PipelineOptions {
        PipelineOptions {
            layout: self.options.effective_layout(),
            precision: self.options.precision,
            products_round_operands: needs.products_round_operands,
            integer_products: needs.integer_products,
            dequantize_weights: needs.dequantize_weights,
        }
    }

    /// The pass pipeline for a target that needs `needs`, with the disabled passes off and,
    /// when `print`, the `print_after` requests set (those naming a plan pass go to the
    /// planner: [`Self::plan_options`]; their files are started empty here).
    pub fn pass_manager(&self, needs: TargetNeeds, print: bool) -> Result<PassManager> {
        let mut passes = kiln_optimizer::pipelines::cpu(&self.pipeline_options(needs));
        for p in &self.options.disabled_passes {
            passes.disable(p);
        }
        if print {
            for spec in &self.options.print_after {
                if PLAN_PASS_NAMES.contains(&spec.pass.as_str()) {
                    if let PrintTarget::File(path) = &spec.target {
                        std::fs::write(path, "").map_err(|e| {
                            anyhow::anyhow!(
                                "--print-after {}: cannot write {}: {e}",
                                spec.pass,
                                path.display()
                            )
                        })?;
                    }
                    continue;
                }
                if spec.pass != kiln_optimizer::ALL_PASSES && passes.check_pass_name(&spec.pass).is_err() {
                    let names: Vec<&str> = passes
                        .pass_names()
                        .into_iter()
                        .chain(PLAN_PASS_NAMES.iter().copied())
                        .collect();
                    return Err(anyhow::anyhow!(
                        "--print-after {}: no such pass '{}' (passes: {}); or '{}'",
                        spec.pass,
                        spec.pass,
                        names.join(", "),
                        kiln_optimizer::ALL_PASSES
                    ));
                }
                passes
                    .print_after(spec.clone())
                    .map_err(|e| anyhow::anyhow!("--print-after {}: {e}", spec.pass))?;
            }
        }
        Ok(passes)
    }

    /// The planner's options for a target that needs `needs`: the disabled plan passes and,
    /// when `print`, the `print_after` requests for plan passes (or `all`).
    pub fn plan_options(&self, needs: TargetNeeds, print: bool) -> PlanOptions {
        let o = &self.options;
        let print_after = o
            .print_after
            .iter()
            .filter(|spec| {
                print
                    && (spec.pass == kiln_optimizer::ALL_PASSES
                        || PLAN_PASS_NAMES.contains(&spec.pass.as_str()))
            })
            .map(|spec| PlanPrint {
                pass: spec.pass.clone(),
                file: match &spec.target {
                    PrintTarget::File(p) => Some(p.clone()),
                    PrintTarget::Stderr => None,
                },
            })
            .collect();
        PlanOptions {
            needs,
            disabled: o
                .disabled_passes
                .iter()
                .filter(|p| PLAN_PASS_NAMES.contains(&p.as_str()))
                .cloned()
                .collect(),
            print_after,
        }
    }

    /// Whether to build a portable artifact: [`Cpu::Portable`], or by default for libraries
    /// and objects (code that is shipped to other machines) on x86-64, unless the options tie
    /// it to one CPU (CUDA, `weights_out`, another triple).
    fn portable_requested(&self) -> Result<bool> {
        let o = &self.options;
        let x86_triple = o.triple.as_deref().is_none_or(|t| t.starts_with("x86_64"));
        if o.cpu == Cpu::Portable {
            if o.target == Target::Cuda {
                return Err(usage("--cpu portable applies to CPU targets, not --target cuda"));
            }
            if o.weights_out.is_some() {
                return Err(usage(
                    "--cpu portable carries one weights layout per variant and cannot use --weights-out: name a CPU with --cpu (e.g. --cpu x86-64-v3 or --cpu native)",
                ));
            }
            if !x86_triple || !cfg!(target_arch = "x86_64") && o.triple.is_none() {
                return Err(usage(format!(
                    "--cpu portable is for x86-64 (x86-64-v3 and x86-64-v4 kernels); for {} name a CPU with --cpu",
                    o.triple.as_deref().unwrap_or("this machine")
                )));
            }
            return Ok(true);
        }
        Ok(o.cpu == Cpu::Default
            && matches!(o.emit, Emit::StaticLib | Emit::SharedLib | Emit::Obj)
            && o.target == Target::Cpu
            && o.weights_out.is_none()
            && x86_triple
            && cfg!(target_arch = "x86_64"))
    }

    fn targets(&self) -> Result<Targets> {
        self.targets_for(None)
    }

    /// The targets for `graph` when it is known: a portable artifact of a model with integer
    /// products (MatMulInteger, ConvInteger, or a QDQ convolution or matrix product that
    /// `integer-products` makes one) also carries a variant with avx512_vnni for them.
    fn targets_for(&self, graph: Option<&Graph>) -> Result<Targets> {
        use kiln_ir::{Op, QuantOp};
        let o = &self.options;
        let int8 = graph.is_some_and(|g| {
            g.nodes().iter().any(|n| match &n.op {
                Op::Quant(QuantOp::MatMulInteger | QuantOp::ConvInteger(_)) => true,
                Op::Conv(_) | Op::MatMul | Op::Gemm { .. } => {
                    n.inputs.get(1).copied().flatten().is_some_and(|w| {
                        matches!(g.node(w.node).op, Op::Quant(QuantOp::DequantizeLinear { .. }))
                    })
                }
                _ => false,
            })
        });
        let triple = o.triple.as_deref();
        let portable = self.portable_requested()?;
        let mut main = match (portable, &o.cpu) {
            (true, _) => TargetDesc::portable_baseline(triple)?,
            (false, Cpu::Named(cpu)) => TargetDesc::select(triple, Some(cpu))?,
            (false, _) => TargetDesc::select(triple, None)?,
        };
        main.conv_algorithm = o.conv_algorithm;
        if o.mode == CompileMode::MaxAutotune {
            if portable {
                return Err(usage(
                    "--mode max-autotune tunes the kernels for this machine; a portable artifact (--cpu portable) runs on others",
                ));
            }
            if o.target == Target::Cuda {
                return Err(usage(
                    "--mode max-autotune times CPU kernels; it does not tune --target cuda yet",
                ));
            }
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            let cache = o.autotune_cache.clone().or_else(default_autotune_cache);
            let key = main.tuning_key().map_err(usage)?;
            // A cache file kiln cannot use is the command line's problem (--autotune-cache).
            let tuner =
                kiln_codegen::tune::Tuner::new(&key, threads, cache).map_err(|e| usage(e.to_string()))?;
            main.tuning = Some(kiln_codegen::tune::TuningHandle(std::sync::Arc::new(tuner)));
        }
        // The portable variants, each with the graph optimized for it: the passes depend on
        // whether the target's products round their operands to bf16 themselves.
        let variants = if portable {
            let mut v = TargetDesc::portable_variants(triple, o.precision == Precision::Bf16, int8)
                .map_err(|e| usage(e.to_string()))?;
            for t in &mut v {
                t.conv_algorithm = o.conv_algorithm;
            }
            v
        } else {
            vec![]
        };
        Ok(Targets {
            main,
            variants,
            portable,
        })
    }

    /// The CPU target of a single-target compilation (for a CUDA model, the host CPU that
    /// runs the launches).
    pub fn target(&self) -> Result<TargetDesc> {
        let t = self.targets()?;
        if t.portable {
            return Err(usage(
                "a portable artifact has several targets: compile it with Session::compile",
            ));
        }
        Ok(t.main)
    }

    /// The target the kernels are planned for: the GPU of a CUDA model, else [`Self::target`].
    pub fn kernel_target(&self) -> Result<TargetDesc> {
        Ok(self.codegen_options(self.target()?, false)?.kernel_target()?)
    }

    fn check_target_options(&self) -> Result<()> {
        let o = &self.options;
        if o.sm.is_some() && o.target != Target::Cuda {
            return Err(usage("--sm applies to --target cuda"));
        }
        if o.emit == Emit::Ptx && o.target != Target::Cuda {
            return Err(usage("--emit ptx needs --target cuda"));
        }
        if o.precision == Precision::Tf32 {
            if o.target != Target::Cuda {
                return Err(usage(
                    "--precision tf32 runs products on a GPU's TF32 tensor cores: it needs --target cuda (CPUs have bf16: --precision bf16)",
                ));
            }
            let sm = o.sm.unwrap_or(kiln_codegen::nvptx::DEFAULT_SM);
            if sm < 80 {
                return Err(usage(format!(
                    "--precision tf32 needs TF32 tensor cores, sm_80 or later (got --sm {sm})"
                )));
            }
        }
        Ok(())
    }

    fn name_or(&self, default: impl FnOnce() -> String) -> String {
        self.options.name.clone().unwrap_or_else(default)
    }

    fn codegen_options(&self, target: TargetDesc, print: bool) -> Result<kiln_codegen::CompileOptions> {
        self.codegen_options_named(self.name_or(|| "model".to_string()), target, print)
    }

    /// Codegen's options for `target` (a portable artifact's baseline: each variant brings its
    /// own needs), printing after the plan passes when `print`.
    fn codegen_options_named(
        &self,
        name: String,
        target: TargetDesc,
        print: bool,
    ) -> Result<kiln_codegen::CompileOptions> {
        let o = &self.options;
        let plan = self.plan_options(self.target_needs(&target), print);
        let cuda_sm = (o.target == Target::Cuda).then(|| o.sm.unwrap_or(kiln_codegen::nvptx::DEFAULT_SM));
        Ok(kiln_codegen::CompileOptions {
            name,
            target,
            emit: o.emit,
            cc: o.cc.clone(),
            plan,
            profile: o.profile,
            weights_out: o.weights_out.clone(),
            cuda_sm,
            batch: None,
            gpu_library_kernels: o.gpu_library_kernels,
            gpu_tf32: o.precision == Precision::Tf32,
        })
    }

    /// The batch a source with a batch range serves, checked on its per-sample graph against
    /// the same model imported at a larger batch (`None` without a range).
    pub fn batch(
        &self,
        source: &ModelSource,
        per_sample: &Graph,
    ) -> Result<Option<kiln_codegen::batch::Batch>> {
        let Some(range) = source.batch_range()? else {
            return Ok(None);
        };
        // 3, not 2: a batch that enters the shapes as n*n or n+n (not sample by sample) shows.
        const PROBE: usize = 3;
        let probe = source.load_at_sharing(PROBE, per_sample)?.graph;
        let batch = kiln_codegen::batch::analyze(per_sample, &probe, PROBE, range.lo, range.hi)
            .with_context(|| format!("{}: batch range {range}", source.path.display()))?;
        Ok(Some(batch))
    }

    /// Imports the model (`import` phase).
    pub fn import(&mut self, source: &ModelSource) -> Result<Graph> {
        self.progress.phase("import");
        Ok(source.load()?.graph)
    }

    /// Runs the optimizer passes for the single target on `graph` (`passes` phase).
    pub fn optimize(&mut self, graph: &mut Graph) -> Result<Vec<PassStats>> {
        let target = self.target()?;
        self.progress.phase("passes");
        Ok(self.pass_manager(self.target_needs(&target), true)?.run(graph)?)
    }

    /// Codegen's plan of an optimized graph (control flow lowered by the passes) for the
    /// kernel target: the kernels, the fusion groups, the memory.
    pub fn plan(&self, lowered: &Graph) -> Result<Plan> {
        let target = self.target()?;
        let kernel_target = self.kernel_target()?;
        // Data-dependent graph outputs planned with the types that bound them, as compile does
        // (the value ids are the same; only those types differ from `lowered`'s).
        let bounded = kiln_codegen::data_dependent::bound_outputs(lowered)?;
        let plan = kiln_codegen::plan::build_with(
            &bounded.graph,
            &kernel_target,
            &self.plan_options(self.target_needs(&target), false),
        )?;
        save_tuning(&kernel_target)?;
        Ok(plan)
    }

    /// Generates, links and writes the artifact of an optimized graph for the single target
    /// at `out` (for a library, the folder-and-stem).
    pub fn emit(&mut self, graph: &Graph, out: &Path) -> Result<Summary> {
        self.check_target_options()?;
        let copts = self.codegen_options(self.target()?, true)?;
        let summary = kiln_codegen::compile(graph, &copts, out, &mut Forward(&mut *self.progress))?;
        save_tuning(&copts.target)?;
        Ok(summary)
    }

    /// Compiles the model to the artifact the options ask for: import, passes, plan, emit,
    /// link. Nothing is read before a refused output path is found (an output that would
    /// overwrite one of the model's files).
    pub fn compile(&mut self, source: &ModelSource) -> Result<Compiled> {
        self.build(source, false)
    }

    /// Everything [`Self::compile`] does up to the plan, without generating code: the
    /// [`Compiled::report`] of what the compilation would do.
    pub fn explain(&mut self, source: &ModelSource) -> Result<Compiled> {
        self.build(source, true)
    }

    fn build(&mut self, source: &ModelSource, explain: bool) -> Result<Compiled> {
        let o = &self.options;
        let name = self.name_or(|| source.default_name());
        let ident = kiln_codegen::header::c_ident(&name);
        let out = output_path(o.output.as_deref(), o.emit, &ident);
        // Before anything is read: a refused path should not wait for the model to compile.
        if !explain {
            refuse_overwriting_inputs(source, o, &out)?;
        }
        let mut graph = self.import(source)?;
        let batch = self.batch(source, &graph)?;
        let batch_info = batch.as_ref().map(|b| report::BatchInfo::new(&graph, b));
        self.progress.phase("passes");
        let targets = self.targets_for(Some(&graph))?;
        self.check_passes()?;
        let o = &self.options;
        // The report compares the imported graph with the optimized one.
        let original = (explain || o.report).then(|| graph.clone());
        let run_passes = |graph: &mut Graph, needs: TargetNeeds, print: bool| -> Result<Vec<PassStats>> {
            self.pass_manager(needs, print)?.run(graph).map_err(|e| {
                // What the model uses and kiln cannot compile is said about the model file, as
                // codegen's refusals are.
                let unsupported = e.failure == kiln_optimizer::PassFailure::Unsupported;
                let e = anyhow::Error::new(e);
                if unsupported {
                    e.context(format!("{}", source.path.display()))
                } else {
                    e
                }
            })
        };
        let mut variant_graphs: Vec<Graph> = vec![];
        let pass_stats = if targets.portable {
            // Variants that agree on the passes share one optimized graph.
            let mut stats = None;
            let mut done: Vec<(TargetNeeds, usize)> = vec![];
            for t in &targets.variants {
                let needs = self.target_needs(t);
                if let Some(&(_, i)) = done.iter().find(|(n, _)| *n == needs) {
                    variant_graphs.push(variant_graphs[i].clone());
                    continue;
                }
                let mut g = graph.clone();
                let st = run_passes(&mut g, needs, stats.is_none())?;
                stats.get_or_insert(st);
                done.push((needs, variant_graphs.len()));
                variant_graphs.push(g);
            }
            graph = variant_graphs.last().cloned().expect("portable variants");
            stats.expect("portable variants")
        } else {
            run_passes(&mut graph, self.target_needs(&targets.main), true)?
        };
        let bf16 =
            (o.precision == Precision::Bf16).then(|| kiln_optimizer::passes::bf16_autocast::summary(&graph));
        self.check_target_options()?;
        if !explain {
            let dir = kiln_codegen::artifact_files(o.emit, &out)[0]
                .parent()
                .map(Path::to_path_buf)
                .filter(|d| !d.as_os_str().is_empty());
            if let Some(dir) = dir {
                std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
            }
        }
        let mut copts = self.codegen_options_named(name.clone(), targets.main, true)?;
        copts.batch = batch;
        let variants: Vec<kiln_codegen::Variant> = targets
            .variants
            .iter()
            .zip(&variant_graphs)
            .map(|(t, g)| kiln_codegen::Variant {
                target: t.clone(),
                needs: self.target_needs(t),
                graph: g,
            })
            .collect();
        let mut progress = Forward(&mut *self.progress);
        let summary = match (explain, targets.portable) {
            (true, false) => {
                kiln_codegen::Progress::phase(&mut progress, "plan");
                kiln_codegen::plan_only(&graph, &copts)
            }
            (true, true) => {
                kiln_codegen::Progress::phase(&mut progress, "plan");
                kiln_codegen::plan_only_portable(&variants, &copts)
            }
            (false, false) => kiln_codegen::compile(&graph, &copts, &out, &mut progress),
            (false, true) => kiln_codegen::compile_portable(&variants, &copts, &out, &mut progress),
        }
        .with_context(|| format!("{}", source.path.display()))?;
        let tuning = save_tuning(&copts.target)?;
        // The plan passes after the graph passes; they leave the graph as it is and say what
        // they did to the kernels in their summary.
        let mut pass_stats = pass_stats;
        pass_stats.extend(summary.plan_passes.iter().map(|p| PassStats {
            pass: p.pass,
            nodes_before: graph.len(),
            nodes_after: graph.len(),
            rewrites: p.rewrites,
            summary: format!(
                "{} → {} kernels: {}",
                p.kernels_before, p.kernels_after, p.summary
            ),
            time: p.time,
        }));
        let o = &self.options;
        let report = original.map(|original| {
            report::build_report(&report::Inputs {
                model_path: &source.path,
                name: &name,
                options: report::OptionsInfo {
                    layout: format!("{:?}", o.effective_layout()).to_lowercase(),
                    precision: format!("{:?}", o.precision).to_lowercase(),
                    disabled_passes: o.disabled_passes.clone(),
                    fusion: o.fusion(),
                    conv_algorithm: format!("{:?}", o.conv_algorithm).to_lowercase(),
                    mode: match o.mode {
                        CompileMode::Default => "default",
                        CompileMode::MaxAutotune => "max-autotune",
                    }
                    .to_string(),
                },
                original: &original,
                optimized: &graph,
                passes: &pass_stats,
                summary: &summary,
                batch: batch_info.as_ref(),
            })
        });
        Ok(Compiled {
            name,
            output: out,
            summary,
            bf16,
            passes: pass_stats,
            report,
            tuning,
            batch: batch_info,
        })
    }
}

/// Saves what `--mode max-autotune` measured while `target`'s kernels were planned (wherever
/// a session plans: a compile, `emit`, `plan`), and says what it did; None without tuning.
fn save_tuning(target: &TargetDesc) -> Result<Option<Tuning>> {
    let Some(t) = &target.tuning else { return Ok(None) };
    t.0.save()?;
    Ok(Some(Tuning {
        stats: t.0.stats(),
        cache: t.0.cache_path().map(Path::to_path_buf),
    }))
}

/// A copy of `options` with `pass` disabled too (for bisecting which pass changes a result).
pub fn without_pass(options: &Options, pass: &str) -> Options {
    let mut o = options.clone();
    o.disabled_passes.push(pass.to_string());
    o
}

/// The file name an emit writes when no output path gives one: the executable or the library
/// stem `ident`, or `ident` with the format's extension.
pub fn default_file_name(emit: Emit, ident: &str) -> String {
    match emit {
        Emit::Exe | Emit::StaticLib | Emit::SharedLib => ident.to_string(),
        Emit::Obj => format!("{ident}.o"),
        Emit::LlvmIr => format!("{ident}.ll"),
        Emit::Asm => format!("{ident}.s"),
        Emit::Ptx => format!("{ident}.ptx"),
    }
}

/// Where the artifact goes: `output` as given, or the default name inside `output` when it is
/// an existing folder or ends in '/' (a folder to create), or the default name here.
pub fn output_path(output: Option<&Path>, emit: Emit, ident: &str) -> PathBuf {
    let name = default_file_name(emit, ident);
    match output {
        None => PathBuf::from(name),
        Some(o) => {
            let text = o.as_os_str().to_string_lossy();
            if o.is_dir() || text.ends_with('/') {
                o.join(name)
            } else {
                o.to_path_buf()
            }
        }
    }
}

/// Refuses to write over a file the compilation reads (the model, a weights or bind file):
/// compiling `m.onnx` to `m.onnx` would otherwise replace the model with the executable.
/// Paths are compared after resolving links, so a symlink to the model is refused too.
fn refuse_overwriting_inputs(source: &ModelSource, o: &Options, out: &Path) -> Result<()> {
    let inputs: Vec<(PathBuf, &Path)> = source
        .files_read()
        .into_iter()
        .filter_map(|p| p.canonicalize().ok().map(|c| (c, p)))
        .collect();
    let mut outputs = kiln_codegen::artifact_files(o.emit, out);
    outputs.extend(o.weights_out.clone());
    for f in &outputs {
        let Ok(canonical) = f.canonicalize() else {
            continue; // not there yet: nothing to overwrite
        };
        if let Some((_, input)) = inputs.iter().find(|(c, _)| *c == canonical) {
            return Err(usage(format!(
                "output {} is the input file {}: refusing to overwrite it (give -o another path or a folder)",
                f.display(),
                input.display()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> ModelSource {
        ModelSource::new(
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../fixtures/models/{name}/model.onnx")),
        )
    }

    #[test]
    fn default_output_paths() {
        assert_eq!(output_path(None, Emit::Exe, "m"), PathBuf::from("m"));
        assert_eq!(output_path(None, Emit::Obj, "m"), PathBuf::from("m.o"));
        assert_eq!(
            output_path(Some(Path::new("no/such/dir/")), Emit::Ptx, "m"),
            PathBuf::from("no/such/dir/m.ptx")
        );
        assert_eq!(
            output_path(Some(Path::new("x.bin")), Emit::Exe, "m"),
            PathBuf::from("x.bin")
        );
        // A file called model.onnx is named after its folder.
        assert_eq!(fixture("conv_basic").default_name(), "conv_basic");
    }

    /// A session that plans outside a whole compilation (`optimize` then `plan` or `emit`, as
    /// a library user or the test suites do) keeps what max-autotune measured in its cache.
    #[test]
    fn tuning_outside_a_compile_is_saved_too() {
        let dir = std::env::temp_dir().join(format!("kiln-driver-tuning-{}", std::process::id()));
        let cache = dir.join("autotune.json");
        let mut session = Session::new(Options {
            mode: CompileMode::MaxAutotune,
            autotune_cache: Some(cache.clone()),
            ..Options::default()
        });
        let mut graph = session.import(&fixture("matmul_2d")).unwrap();
        session.optimize(&mut graph).unwrap();
        session.plan(&graph).unwrap();
        let text = std::fs::read_to_string(&cache);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(text.unwrap().contains("\"kiln_autotune\": 1"));
    }

    #[test]
    fn target_decisions() {
        let cuda = Options {
            target: Target::Cuda,
            ..Options::default()
        };
        assert_eq!(cuda.effective_layout(), Layout::Nchw);
        assert_eq!(Options::default().effective_layout(), Layout::default());
        // The graph pass and the kernel grouping are switched separately.
        let no_fuse = Options {
            disabled_passes: vec![FUSE_PASS.to_string()],
            ..Options::default()
        };
        let no_grouping = Options {
            disabled_passes: vec![FUSE_KERNELS.to_string()],
            ..Options::default()
        };
        assert!(no_fuse.fusion() && !no_grouping.fusion() && Options::default().fusion());
        assert!(Session::new(no_grouping).check_passes().is_ok());
        let host = TargetDesc::host().unwrap();
        // GPU products round their operands on bf16 tensor cores (sm_80 on); CPU ones do with
        // avx512_bf16 pairs.
        assert!(
            Session::new(cuda.clone())
                .target_needs(&host)
                .products_round_operands
        );
        let sm75 = Options { sm: Some(75), ..cuda };
        assert!(!Session::new(sm75).target_needs(&host).products_round_operands);
        let cpu = Session::new(Options::default());
        assert_eq!(
            cpu.target_needs(&host).products_round_operands,
            host.has_bf16_pair_kernels()
        );
        // The optimizer and the planner get the same value.
        let needs = cpu.target_needs(&host);
        assert_eq!(
            cpu.pipeline_options(needs).products_round_operands,
            cpu.plan_options(needs, false).needs.products_round_operands
        );
        let lib = Session::new(Options {
            emit: Emit::StaticLib,
            ..Options::default()
        });
        assert_eq!(lib.portable_requested().unwrap(), cfg!(target_arch = "x86_64"));
        assert!(!Session::new(Options::host_executable())
            .portable_requested()
            .unwrap());
    }

    #[test]
    fn wrong_options_are_usage_errors() {
        let s = Session::new(Options {
            disabled_passes: vec!["no-such-pass".into()],
            ..Options::default()
        });
        let e = s.check_passes().unwrap_err();
        assert!(e.downcast_ref::<UsageError>().is_some());
        // The list names the graph passes and the plan passes.
        assert!(
            e.to_string().contains("freeze")
                && e.to_string()
                    .contains("fuse-kernels, absorb-bf16-rounding, store-bf16"),
            "{e}"
        );
        let mut s = Session::new(Options {
            sm: Some(80),
            ..Options::host_executable()
        });
        let e = s.emit(&Graph::new("g"), Path::new("unused")).unwrap_err();
        assert_eq!(
            e.downcast_ref::<UsageError>().map(|u| u.0.as_str()),
            Some("--sm applies to --target cuda")
        );
    }

    #[derive(Default)]
    struct Phases(Vec<String>, usize);

    impl Progress for Phases {
        fn phase(&mut self, name: &str) {
            self.0.push(name.to_string());
        }
        fn kernel(&mut self, _: usize, _: usize) {
            self.1 += 1;
        }
    }

    #[test]
    fn explains_and_compiles_a_model() {
        let dir = std::env::temp_dir().join(format!("kiln-driver-test-{}", std::process::id()));
        let source = fixture("conv_basic");
        let mut phases = Phases::default();
        let explained = Session::new(Options::host_executable())
            .with_progress(&mut phases)
            .explain(&source)
            .unwrap();
        assert_eq!(phases.0, ["import", "passes", "plan"]);
        assert!(explained.summary.files.is_empty());
        let report = explained.report.expect("explaining builds the report");
        assert_eq!(report.summary.kernels, explained.summary.kernels);

        let mut phases = Phases::default();
        let compiled = Session::new(Options {
            output: Some(dir.join("")),
            ..Options::host_executable()
        })
        .with_progress(&mut phases)
        .compile(&source)
        .unwrap();
        assert_eq!(compiled.output, dir.join("model"));
        assert_eq!(compiled.summary.files, [dir.join("model")]);
        assert!(compiled.output.is_file());
        assert!(compiled.report.is_none());
        assert_eq!(compiled.summary.kernels, explained.summary.kernels);
        assert_eq!(phases.0[..3], ["import", "passes", "plan"]);
        assert!(phases.0.iter().any(|p| p == "link"));
        assert!(phases.1 > 0, "kernel progress reported");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
