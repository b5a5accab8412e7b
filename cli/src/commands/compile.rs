//! `kiln compile`: a model to an executable, a static library + header, an object, LLVM IR or
//! assembly.

use crate::model_args::ModelArgs;
use crate::report_text::bytes;
use anyhow::Result;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kiln_driver::{CompileMode, Cpu, Emit, Layout, Options, Precision, Progress, Session, Target};
use std::path::PathBuf;
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

impl From<ConvAlgorithmArg> for kiln_driver::ConvAlgorithm {
    fn from(a: ConvAlgorithmArg) -> Self {
        match a {
            ConvAlgorithmArg::Auto => Self::Auto,
            ConvAlgorithmArg::Direct => Self::Direct,
        }
    }
}

/// How kernels are configured (the modes `torch.compile` users know).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    /// Kernel configurations from kiln's cost model
    #[default]
    Default,
    /// Time candidate cache blockings of every matrix product and convolution on this
    /// machine and keep the fastest; measurements are cached per CPU and shape
    /// (--autotune-cache), so compiling again is as fast as the default mode
    MaxAutotune,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PrecisionArg {
    F32,
    Bf16,
    /// f32 products on TF32 tensor cores (--target cuda, sm_80 or later)
    Tf32,
}

impl From<LayoutArg> for Layout {
    fn from(l: LayoutArg) -> Layout {
        match l {
            LayoutArg::Nchw => Layout::Nchw,
            LayoutArg::Nhwc => Layout::Nhwc,
        }
    }
}

impl From<PrecisionArg> for Precision {
    fn from(p: PrecisionArg) -> Precision {
        match p {
            PrecisionArg::F32 => Precision::F32,
            PrecisionArg::Bf16 => Precision::Bf16,
            PrecisionArg::Tf32 => Precision::Tf32,
        }
    }
}

impl From<EmitArg> for Emit {
    fn from(e: EmitArg) -> Emit {
        match e {
            EmitArg::Exe => Emit::Exe,
            EmitArg::Staticlib => Emit::StaticLib,
            EmitArg::Sharedlib => Emit::SharedLib,
            EmitArg::Obj => Emit::Obj,
            EmitArg::LlvmIr => Emit::LlvmIr,
            EmitArg::Asm => Emit::Asm,
            EmitArg::Ptx => Emit::Ptx,
        }
    }
}

impl Args {
    /// The driver's options for these flags (`report`: build the report, as `--report` and
    /// `kiln explain` need).
    pub fn options(&self, report: bool) -> Options {
        Options {
            name: self.name.clone(),
            output: self.output.clone(),
            emit: self.emit.into(),
            target: match self.target {
                TargetArg::Cpu => Target::Cpu,
                TargetArg::Cuda => Target::Cuda,
            },
            sm: self.sm,
            cpu: match self.cpu.as_deref() {
                None => Cpu::Default,
                Some("native") => Cpu::Native,
                Some("portable") => Cpu::Portable,
                Some(other) => Cpu::Named(other.to_string()),
            },
            triple: self.target_triple.clone(),
            layout: self.layout.map(Layout::from),
            precision: self.precision.into(),
            conv_algorithm: self.conv_algorithm.into(),
            mode: match self.mode {
                ModeArg::Default => CompileMode::Default,
                ModeArg::MaxAutotune => CompileMode::MaxAutotune,
            },
            autotune_cache: self.autotune_cache.clone(),
            disabled_passes: self.disable_pass.clone(),
            print_after: self.print_after.clone(),
            profile: self.profile,
            weights_out: self.weights_out.clone(),
            report: report || self.report.is_some(),
            cc: None,
            gpu_library_kernels: self.gpu_library_kernels,
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

    /// With --target cuda, let an operator that has no GPU kernel run its C library kernel on
    /// one GPU block: correct, but orders of magnitude slower (a development fallback).
    /// Without it such a model is refused, naming the node; `kiln explain --target cuda` lists
    /// every kernel and where it comes from.
    #[arg(long = "gpu-library-kernels", requires = "target")]
    pub gpu_library_kernels: bool,

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

    /// `default` configures kernels with kiln's cost model; `max-autotune` times candidate
    /// configurations of every matrix product and convolution on this machine at compile
    /// time and keeps the fastest (the artifact is then tuned for this CPU).
    #[arg(long, value_enum, default_value = "default")]
    pub mode: ModeArg,

    /// Where --mode max-autotune keeps its measurements [default:
    /// $XDG_CACHE_HOME/kiln/autotune.json or ~/.cache/kiln/autotune.json]
    #[arg(long, value_name = "FILE")]
    pub autotune_cache: Option<PathBuf>,

    /// Skip a pass: a graph pass (freeze, channels-last, fuse, bf16-autocast,
    /// lower-control-flow) or a plan pass (fuse-kernels: kernel grouping,
    /// absorb-bf16-rounding, store-bf16). May be given several times.
    #[arg(long = "disable-pass", value_name = "PASS")]
    pub disable_pass: Vec<String>,

    /// Print the graph after a pass (the kernel list after a plan pass; after every pass:
    /// `all`) to stderr, or with PASS=FILE to a file. May be given several times.
    #[arg(long = "print-after", value_name = "PASS[=FILE]")]
    pub print_after: Vec<kiln_driver::PrintAfter>,

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
    let start = Instant::now();
    let source = args.model.source();
    let mut progress = Bars::new(args.quiet);
    let compiled = {
        let mut session = Session::new(args.options(explain)).with_progress(&mut progress);
        if explain {
            session.explain(&source)?
        } else {
            session.compile(&source)?
        }
    };
    progress.finish();
    let (name, summary) = (&compiled.name, &compiled.summary);
    if let Some(report) = &compiled.report {
        if let Some(path) = &args.report {
            crate::report_text::write_json(report, path)?;
        }
        match mode {
            Mode::ExplainTable => crate::emit(&crate::report_text::to_table(report)),
            Mode::ExplainJson => crate::emit(&crate::report_text::to_json(report)),
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
                kiln_driver::layout_hash_hex(w.layout_hash)
            );
        }
        if let Some(b) = &compiled.batch {
            eprintln!("  {}", crate::report_text::batch_line(b));
        }
        if let Some(t) = &compiled.tuning {
            let s = &t.stats;
            eprintln!(
                "  max-autotune: {} product shapes timed, {} read from {}; {} run faster with another blocking than the cost model's",
                s.timed,
                s.cached,
                t.cache
                    .as_ref()
                    .map_or("no cache (neither XDG_CACHE_HOME nor HOME is set)".to_string(), |p| p.display().to_string()),
                s.changed
            );
        }
        if let Some(b) = &compiled.bf16 {
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

/// Progress on stderr: a spinner naming the phase, a bar while kernels are generated. Hidden
/// when stderr is not a terminal (indicatif's default) or with --quiet. The spinner starts with
/// the first phase (after the output path was checked).
struct Bars {
    quiet: bool,
    bar: Option<ProgressBar>,
}

impl Bars {
    fn new(quiet: bool) -> Bars {
        Bars { quiet, bar: None }
    }

    fn bar(&mut self) -> &ProgressBar {
        let quiet = self.quiet;
        self.bar.get_or_insert_with(|| {
            let bar = ProgressBar::new_spinner();
            if quiet {
                bar.set_draw_target(ProgressDrawTarget::hidden());
            }
            bar.enable_steady_tick(Duration::from_millis(100));
            bar
        })
    }

    fn finish(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
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
        let bar = self.bar();
        bar.set_style(ProgressStyle::with_template("{spinner} {msg} [{elapsed}]").expect("valid template"));
        bar.set_message(msg.to_string());
    }

    fn kernel(&mut self, index: usize, total: usize) {
        let bar = self.bar();
        if index == 0 {
            bar.set_length(total as u64);
            bar.set_position(0);
            bar.set_style(
                ProgressStyle::with_template("{spinner} generating kernels {bar:30} {pos}/{len} [{elapsed}]")
                    .expect("valid template"),
            );
        }
        bar.set_position(index as u64 + 1);
    }
}
