//! `kiln compile`: a model to an executable, a static library + header, an object, LLVM IR or
//! assembly.

use crate::model_args::ModelArgs;
use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kiln_codegen::{CompileOptions, Emit, Progress, TargetDesc};
use kiln_optimizer::{Layout, PipelineOptions, Precision};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum EmitArg {
    /// A self-contained executable (the default).
    Exe,
    /// A static library libNAME.a, its C header NAME.h, NAME.pc (pkg-config) and
    /// NAME-config.cmake (CMake's find_package).
    Staticlib,
    /// A shared library libNAME.so exporting only the NAME_ API (for dlopen or Python's
    /// ctypes), with NAME.h, NAME.pc and NAME-config.cmake.
    Sharedlib,
    /// A relocatable object file.
    Obj,
    /// Optimized LLVM IR (text).
    LlvmIr,
    /// Assembly.
    Asm,
    /// PTX of the kernels (with --target cuda).
    Ptx,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TargetArg {
    /// This machine's CPU, or the one named by --cpu / --target-triple.
    Cpu,
    /// An NVIDIA GPU (--sm); the artifact loads the CUDA driver when it starts.
    Cuda,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum LayoutArg {
    /// The model's own layout.
    Nchw,
    /// Channels-last.
    Nhwc,
}

/// How convolutions are computed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ConvAlgorithmArg {
    /// Winograd F(4x4,3x3) or F(2x2,3x3) for the stride-1 3x3 layers where it is faster
    /// (4x or 2.25x fewer multiplies, rounding errors a few times the direct kernel's);
    /// im2col products for the rest
    #[default]
    Auto,
    /// im2col products (or direct depthwise kernels) for every convolution
    Direct,
}

impl From<ConvAlgorithmArg> for kiln_codegen::target::ConvAlgorithm {
    fn from(a: ConvAlgorithmArg) -> Self {
        match a {
            ConvAlgorithmArg::Auto => Self::Auto,
            ConvAlgorithmArg::Direct => Self::Direct,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PrecisionArg {
    F32,
    Bf16,
}

/// The optimizer options from the command line.
pub fn pipeline_options(layout: Option<LayoutArg>, precision: PrecisionArg) -> PipelineOptions {
    PipelineOptions {
        layout: match layout {
            Some(LayoutArg::Nchw) => Layout::Nchw,
            Some(LayoutArg::Nhwc) => Layout::Nhwc,
            None => Layout::default(),
        },
        precision: match precision {
            PrecisionArg::F32 => Precision::F32,
            PrecisionArg::Bf16 => Precision::Bf16,
        },
        // What the target's kernels can do is for the caller, which knows the target.
        products_round_operands: false,
    }
}

use kiln_optimizer::pipelines::FUSE_PASS;

impl Args {
    /// The layout asked for, or the target's default: the GPU kernels read the model's own
    /// (NCHW) layout, so a CUDA model keeps it unless --layout says otherwise.
    pub fn effective_layout(&self) -> Option<LayoutArg> {
        match (self.layout, self.target) {
            (None, TargetArg::Cuda) => Some(LayoutArg::Nchw),
            (layout, _) => layout,
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,

    /// Output path. Default: NAME in the current folder (exe), NAME.o/.ll/.s/.ptx, or for a
    /// library libNAME.a/.so, NAME.h, NAME.pc and NAME-config.cmake (then -o is DIR/NAME).
    /// An existing folder or a path ending in '/' means those default names in that folder.
    /// Missing folders are created. A path naming one of the model's input files is refused.
    #[arg(long, short = 'o', value_name = "PATH")]
    pub output: Option<PathBuf>,

    /// What to write.
    #[arg(long, value_enum, default_value = "exe")]
    pub emit: EmitArg,

    /// The model's name: prefix of the C API (NAME_create, NAME_run, ...), made a C identifier.
    /// Default: the model file's stem (for a file named model.onnx, its folder's name).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,

    /// Where the kernels run: the CPU, or an NVIDIA GPU through CUDA (the executable or library
    /// still runs on this CPU and loads the CUDA driver when a context is created).
    #[arg(long, value_enum, default_value = "cpu")]
    pub target: TargetArg,

    /// The GPU's compute capability for --target cuda: 70, 75, 80 (A100), 86, 89, 90 (H100).
    #[arg(long, value_name = "SM", requires = "target")]
    pub sm: Option<u32>,

    /// Target CPU (e.g. x86-64-v3, znver4, skylake-avx512, neoverse-v1), `native` for this
    /// machine's, or `portable`: x86-64-v3 (AVX2) and x86-64-v4 (AVX-512, plus avx512_bf16
    /// for bf16 models) kernels in one artifact, the best one for the CPU chosen when a context
    /// is created. Default: portable for --emit staticlib, sharedlib and obj on x86-64 (native
    /// with --weights-out or --target cuda), this machine's for executables, LLVM IR and
    /// assembly.
    #[arg(long, value_name = "CPU")]
    pub cpu: Option<String>,

    /// Target triple (x86_64-unknown-linux-gnu, aarch64-unknown-linux-gnu). Default: this machine's.
    #[arg(long = "target-triple", value_name = "TRIPLE")]
    pub target_triple: Option<String>,

    /// Print nothing but errors.
    #[arg(long, short = 'q')]
    pub quiet: bool,

    /// Activation layout for convolutions and their neighbours. Default: the one measured
    /// fastest for the target.
    #[arg(long, value_enum, value_name = "LAYOUT")]
    pub layout: Option<LayoutArg>,

    /// Compute precision of MatMul/Conv/Gemm/attention (f32 accumulation either way).
    #[arg(long, value_enum, default_value = "f32")]
    pub precision: PrecisionArg,

    /// How convolutions are computed on CPUs: `auto` lets stride-1 3x3 layers run as
    /// Winograd convolutions where that is faster; `direct` keeps every convolution a
    /// product of the weights and the im2col matrix.
    #[arg(long, value_enum, value_name = "ALGORITHM", default_value = "auto")]
    pub conv_algorithm: ConvAlgorithmArg,

    /// Skip an optimizer pass (e.g. freeze). May be given several times.
    #[arg(long = "disable-pass", value_name = "PASS")]
    pub disable_pass: Vec<String>,

    /// Print the graph after a pass (or after every pass: `all`) to stderr, or with PASS=FILE
    /// to a file. May be given several times.
    #[arg(long = "print-after", value_name = "PASS[=FILE]")]
    pub print_after: Vec<kiln_optimizer::PrintAfter>,

    /// List every kernel (node, operator, implementation) after compiling.
    #[arg(long)]
    pub list_kernels: bool,

    /// Add per-kernel profiling to a static library's C API: NAME_profile_enable,
    /// NAME_profile_kernels (time, calls and FLOPs per kernel) and NAME_profile_write_trace
    /// (Chrome trace JSON). Executables can always profile: ./model --profile trace.json.
    #[arg(long)]
    pub profile: bool,

    /// Write a JSON report (schema kiln.report/1, docs/report.md): every node's kernel,
    /// layout and dtype, fusion groups, what the passes removed, the memory plan, the target.
    #[arg(long, value_name = "FILE.json")]
    pub report: Option<PathBuf>,

    /// Keep the weights out of the artifact: write the packed weights to FILE (safetensors)
    /// instead. The executable or library memory-maps it when a context is created and refuses
    /// a file written for another build; recompiling the same model with new weight values
    /// gives a file the existing artifact accepts. The executable looks for the file by this
    /// name next to itself, then in the current directory (or takes --weights FILE); a static
    /// library is created with NAME_create_with_weights(path, threads).
    #[arg(long = "weights-out", value_name = "FILE.safetensors")]
    pub weights_out: Option<PathBuf>,
}

/// What `build` does after planning: generate code, or only explain the plan (`kiln explain`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Compile,
    ExplainTable,
    ExplainJson,
}

pub fn run(args: Args) -> Result<()> {
    build(args, Mode::Compile)
}

pub fn build(args: Args, mode: Mode) -> Result<()> {
    let explain = mode != Mode::Compile;
    let stem = args
        .model
        .model
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".to_string());
    // A model file called model.onnx is better named after its folder.
    let default_name = if stem == "model" {
        args.model
            .model
            .canonicalize()
            .ok()
            .and_then(|p| {
                p.parent()
                    .and_then(|d| d.file_name())
                    .map(|d| d.to_string_lossy().into_owned())
            })
            .unwrap_or(stem)
    } else {
        stem
    };
    let name = args.name.clone().unwrap_or(default_name);
    let emit = match args.emit {
        EmitArg::Exe => Emit::Exe,
        EmitArg::Staticlib => Emit::StaticLib,
        EmitArg::Sharedlib => Emit::SharedLib,
        EmitArg::Obj => Emit::Obj,
        EmitArg::LlvmIr => Emit::LlvmIr,
        EmitArg::Asm => Emit::Asm,
        EmitArg::Ptx => Emit::Ptx,
    };
    let ident = kiln_codegen::header::c_ident(&name);
    let out = output_path(args.output.as_deref(), emit, &ident);
    // Before anything is read: a refused path should not wait for the model to compile.
    if !explain {
        refuse_overwriting_inputs(&args, emit, &out)?;
    }
    let start = Instant::now();
    let mut progress = Bars::new(args.quiet);
    progress.phase("import");
    let opts = args.model.import_options()?;
    let model = kiln_frontend::load_model(&args.model.model, &opts)
        .map_err(anyhow::Error::from)
        .with_context(|| format!("{}", args.model.model.display()))?;
    progress.phase("passes");
    let mut graph = model.graph;
    let layout = args.effective_layout();
    let portable = portable_requested(&args, emit)?;
    let mut target = match (&portable, args.cpu.as_deref()) {
        (true, _) => TargetDesc::portable_baseline(args.target_triple.as_deref())?,
        (false, Some("native")) => TargetDesc::select(args.target_triple.as_deref(), None)?,
        (false, cpu) => TargetDesc::select(args.target_triple.as_deref(), cpu)?,
    };
    target.conv_algorithm = args.conv_algorithm.into();
    // The portable variants, each with the graph optimized for it: the passes depend on
    // whether the target's products round their operands to bf16 themselves.
    let variant_targets = if portable {
        let mut v = TargetDesc::portable_variants(
            args.target_triple.as_deref(),
            args.precision == PrecisionArg::Bf16,
        )
        .map_err(|e| {
            anyhow::Error::new(crate::exit::Failure::new(crate::exit::Exit::Usage, e.to_string()))
        })?;
        for t in &mut v {
            t.conv_algorithm = args.conv_algorithm.into();
        }
        v
    } else {
        vec![]
    };
    let known = kiln_optimizer::pipelines::PASS_NAMES;
    for p in &args.disable_pass {
        if !known.contains(&p.as_str()) {
            anyhow::bail!("--disable-pass {p}: no such pass (passes: {})", known.join(", "));
        }
    }
    let fusion = !args.disable_pass.iter().any(|p| p == FUSE_PASS);
    // The report compares the imported graph with the optimized one.
    let original = (explain || args.report.is_some()).then(|| graph.clone());
    let run_passes = |graph: &mut kiln_ir::Graph, round_operands: bool, print: bool| -> Result<_> {
        let mut popts = pipeline_options(layout, args.precision);
        popts.products_round_operands = round_operands;
        let mut passes = kiln_optimizer::pipelines::cpu(&popts);
        for p in &args.disable_pass {
            passes.disable(p);
        }
        if print {
            for spec in &args.print_after {
                passes
                    .print_after(spec.clone())
                    .map_err(|e| anyhow::anyhow!("--print-after {}: {e}", spec.pass))?;
            }
        }
        Ok(passes.run(graph)?)
    };
    let cpu_products_round = |t: &TargetDesc| args.target == TargetArg::Cpu && t.has_bf16_pair_kernels();
    let mut variant_graphs: Vec<kiln_ir::Graph> = vec![];
    let pass_stats = if portable {
        // Variants that agree on the passes share one optimized graph.
        let mut stats = None;
        let mut done: Vec<(bool, usize)> = vec![];
        for t in &variant_targets {
            let round = cpu_products_round(t);
            if let Some(&(_, i)) = done.iter().find(|(r, _)| *r == round) {
                variant_graphs.push(variant_graphs[i].clone());
                continue;
            }
            let mut g = graph.clone();
            let st = run_passes(&mut g, round, stats.is_none())?;
            stats.get_or_insert(st);
            done.push((round, variant_graphs.len()));
            variant_graphs.push(g);
        }
        graph = variant_graphs.last().cloned().expect("portable variants");
        stats.expect("portable variants")
    } else {
        run_passes(&mut graph, cpu_products_round(&target), true)?
    };
    let bf16 = (args.precision == PrecisionArg::Bf16)
        .then(|| kiln_optimizer::passes::bf16_autocast::summary(&graph));
    if args.sm.is_some() && args.target != TargetArg::Cuda {
        return Err(anyhow::Error::new(crate::exit::Failure::new(
            crate::exit::Exit::Usage,
            "--sm applies to --target cuda",
        )));
    }
    if emit == Emit::Ptx && args.target != TargetArg::Cuda {
        return Err(anyhow::Error::new(crate::exit::Failure::new(
            crate::exit::Exit::Usage,
            "--emit ptx needs --target cuda",
        )));
    }
    let cuda_sm =
        (args.target == TargetArg::Cuda).then(|| args.sm.unwrap_or(kiln_codegen::nvptx::DEFAULT_SM));
    if !explain {
        let dir = kiln_codegen::artifact_files(emit, &out)[0]
            .parent()
            .map(Path::to_path_buf)
            .filter(|d| !d.as_os_str().is_empty());
        if let Some(dir) = dir {
            std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let copts = CompileOptions {
        name: name.clone(),
        target,
        emit,
        cc,
        fusion,
        profile: args.profile,
        weights_out: args.weights_out.clone(),
        cuda_sm,
    };
    let variants: Vec<kiln_codegen::Variant> = variant_targets
        .iter()
        .zip(&variant_graphs)
        .map(|(t, g)| kiln_codegen::Variant {
            target: t.clone(),
            graph: g,
        })
        .collect();
    let summary = match (explain, portable) {
        (true, false) => {
            progress.phase("plan");
            kiln_codegen::plan_only(&graph, &copts)
        }
        (true, true) => {
            progress.phase("plan");
            kiln_codegen::plan_only_portable(&variants, &copts)
        }
        (false, false) => kiln_codegen::compile(&graph, &copts, &out, &mut progress),
        (false, true) => kiln_codegen::compile_portable(&variants, &copts, &out, &mut progress),
    }
    .with_context(|| format!("{}", args.model.model.display()))?;
    progress.finish();
    if let Some(original) = &original {
        let popts = pipeline_options(layout, args.precision);
        let report = crate::commands::explain::build_report(&crate::commands::explain::Inputs {
            model_path: &args.model.model,
            name: &name,
            options: crate::commands::explain::OptionsInfo {
                layout: format!("{:?}", popts.layout).to_lowercase(),
                precision: format!("{:?}", popts.precision).to_lowercase(),
                disabled_passes: args.disable_pass.clone(),
                fusion,
                conv_algorithm: format!("{:?}", args.conv_algorithm).to_lowercase(),
            },
            original,
            optimized: &graph,
            passes: &pass_stats,
            summary: &summary,
        });
        if let Some(path) = &args.report {
            crate::commands::explain::write_json(&report, path)?;
        }
        match mode {
            Mode::ExplainTable => crate::emit(&crate::commands::explain::to_table(&report)),
            Mode::ExplainJson => crate::emit(&crate::commands::explain::to_json(&report)),
            Mode::Compile => {}
        }
    }
    if explain {
        return Ok(());
    }
    if !args.quiet {
        let files: Vec<String> = summary.files.iter().map(|f| f.display().to_string()).collect();
        eprintln!(
            "{} {name} for {} in {:.1} s → {}",
            crate::term::paint("compiled", crate::term::Style::Good),
            summary.target,
            start.elapsed().as_secs_f64(),
            files.join(", ")
        );
        eprintln!(
            "  {} kernels ({} generated, {} from the kernel library), weights {}, arena {}, per-thread scratch {}",
            summary.kernels,
            summary.generated_kernels,
            summary.kernels - summary.generated_kernels,
            bytes(summary.weights_bytes),
            bytes(summary.arena_bytes),
            bytes(summary.thread_scratch_bytes)
        );
        if let Some(w) = &summary.weights_file {
            eprintln!(
                "  weights in {} ({}, layout hash {}), mapped by the artifact when it starts",
                w.path.display(),
                bytes(summary.weights_bytes),
                kiln_codegen::weights_file::hex(w.layout_hash)
            );
        }
        if let Some(b) = bf16 {
            eprintln!(
                "  bf16: {} of {} matmul/conv ops read bf16 operands (f32 accumulation), {:.1}% of {:.2} GFLOP",
                b.bf16_ops,
                b.matmul_ops,
                100.0 * b.bf16_flops as f64 / b.total_flops.max(1) as f64,
                b.total_flops as f64 / 1e9
            );
            if args.target == TargetArg::Cpu && b.bf16_ops > 0 {
                if summary.bf16_dot_kernels > 0 {
                    eprintln!(
                        "  bf16: {} kernels compute bf16 dot products in hardware (vdpbf16ps)",
                        summary.bf16_dot_kernels
                    );
                } else {
                    eprintln!(
                        "  note: the target has no bf16 dot product (avx512_bf16): f32 kernels run the bf16 operands, with bf16 accuracy and no speed-up"
                    );
                }
            }
        }
    }
    if args.list_kernels {
        for line in &summary.kernel_lines {
            crate::emit(&format!("{}\n", kiln_ir::printable(line)));
        }
    }
    Ok(())
}

/// Whether to build a portable artifact: `--cpu portable`, or by default for libraries and
/// objects (code that is shipped to other machines) on x86-64, unless the build's options tie
/// it to one CPU (--target cuda, --weights-out, another triple).
fn portable_requested(args: &Args, emit: Emit) -> Result<bool> {
    let usage = |m: String| anyhow::Error::new(crate::exit::Failure::new(crate::exit::Exit::Usage, m));
    let x86_triple = args
        .target_triple
        .as_deref()
        .is_none_or(|t| t.starts_with("x86_64"));
    if args.cpu.as_deref() == Some("portable") {
        if args.target == TargetArg::Cuda {
            return Err(usage(
                "--cpu portable applies to CPU targets, not --target cuda".into(),
            ));
        }
        if args.weights_out.is_some() {
            return Err(usage(
                "--cpu portable carries one weights layout per variant and cannot use --weights-out: name a CPU with --cpu (e.g. --cpu x86-64-v3 or --cpu native)".into(),
            ));
        }
        if !x86_triple || !cfg!(target_arch = "x86_64") && args.target_triple.is_none() {
            return Err(usage(format!(
                "--cpu portable is for x86-64 (x86-64-v3 and x86-64-v4 kernels); for {} name a CPU with --cpu",
                args.target_triple.as_deref().unwrap_or("this machine")
            )));
        }
        return Ok(true);
    }
    Ok(args.cpu.is_none()
        && matches!(emit, Emit::StaticLib | Emit::SharedLib | Emit::Obj)
        && args.target == TargetArg::Cpu
        && args.weights_out.is_none()
        && x86_triple
        && cfg!(target_arch = "x86_64"))
}

/// The file name an emit writes when -o does not give one: the executable or the library stem
/// `ident`, or `ident` with the format's extension.
fn default_file_name(emit: Emit, ident: &str) -> String {
    match emit {
        Emit::Exe | Emit::StaticLib | Emit::SharedLib => ident.to_string(),
        Emit::Obj => format!("{ident}.o"),
        Emit::LlvmIr => format!("{ident}.ll"),
        Emit::Asm => format!("{ident}.s"),
        Emit::Ptx => format!("{ident}.ptx"),
    }
}

/// Where the artifact goes: `-o PATH` as given, or the default name inside `PATH` when it is an
/// existing folder or ends in '/' (a folder to create), or the default name here.
fn output_path(output: Option<&Path>, emit: Emit, ident: &str) -> PathBuf {
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

/// Refuses to write over a file the compilation reads (the model, a --weights or --bind file):
/// `kiln compile m.onnx -o m.onnx` would otherwise replace the model with the executable.
/// Paths are compared after resolving links, so a symlink to the model is refused too.
fn refuse_overwriting_inputs(args: &Args, emit: Emit, out: &Path) -> Result<()> {
    let inputs: Vec<(PathBuf, &Path)> = args
        .model
        .files_read()
        .into_iter()
        .filter_map(|p| p.canonicalize().ok().map(|c| (c, p)))
        .collect();
    let mut outputs = kiln_codegen::artifact_files(emit, out);
    outputs.extend(args.weights_out.clone());
    for o in &outputs {
        let Ok(canonical) = o.canonicalize() else {
            continue; // not there yet: nothing to overwrite
        };
        if let Some((_, input)) = inputs.iter().find(|(c, _)| *c == canonical) {
            return Err(anyhow::Error::new(crate::exit::Failure::new(
                crate::exit::Exit::Usage,
                format!(
                    "output {} is the input file {}: refusing to overwrite it (give -o another path or a folder)",
                    o.display(),
                    input.display()
                ),
            )));
        }
    }
    Ok(())
}

pub fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

/// Progress on stderr: a spinner naming the phase, a bar while kernels are generated. Hidden
/// when stderr is not a terminal (indicatif's default) or with --quiet.
struct Bars {
    bar: ProgressBar,
}

impl Bars {
    fn new(quiet: bool) -> Bars {
        let bar = ProgressBar::new_spinner();
        if quiet {
            bar.set_draw_target(ProgressDrawTarget::hidden());
        }
        bar.enable_steady_tick(Duration::from_millis(100));
        Bars { bar }
    }

    fn finish(&mut self) {
        self.bar.finish_and_clear();
    }
}

impl Progress for Bars {
    fn phase(&mut self, name: &str) {
        let msg = match name {
            "import" => "importing the model",
            "passes" => "optimizing the graph",
            "plan" => "selecting kernels and planning memory",
            "codegen" => "generating kernels",
            "llvm" => "optimizing and generating machine code (LLVM)",
            "link" => "linking",
            "archive" => "writing the static library",
            "weights" => "writing the weights file",
            other => other,
        };
        self.bar
            .set_style(ProgressStyle::with_template("{spinner} {msg} [{elapsed}]").expect("valid template"));
        self.bar.set_message(msg.to_string());
    }

    fn kernel(&mut self, index: usize, total: usize) {
        if index == 0 {
            self.bar.set_length(total as u64);
            self.bar.set_position(0);
            self.bar.set_style(
                ProgressStyle::with_template("{spinner} generating kernels {bar:30} {pos}/{len} [{elapsed}]")
                    .expect("valid template"),
            );
        }
        self.bar.set_position(index as u64 + 1);
    }
}
