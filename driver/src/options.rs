//! What a compilation is asked to do: plain library types the command line's flags convert into.

use std::path::PathBuf;

pub use kiln_codegen::target::ConvAlgorithm;

/// The compile modes (`--mode`), named after `torch.compile`'s.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CompileMode {
    /// Kernel configurations from the cost model.
    #[default]
    Default,
    /// Each product's cache blocking timed on this machine (`kiln_codegen::tune`), the
    /// choices cached per CPU and shape.
    MaxAutotune,
}

/// `$XDG_CACHE_HOME/kiln/autotune.json`, else `$HOME/.cache/kiln/autotune.json`; None when
/// neither variable is set.
pub fn default_autotune_cache() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(x) => PathBuf::from(x),
        None => PathBuf::from(std::env::var_os("HOME").filter(|v| !v.is_empty())?).join(".cache"),
    };
    Some(base.join("kiln").join("autotune.json"))
}
pub use kiln_codegen::Emit;
pub use kiln_optimizer::{Layout, Precision, PrintAfter};

/// Where the kernels run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Target {
    /// A CPU: this machine's, or the one [`Options::cpu`] and [`Options::triple`] name.
    #[default]
    Cpu,
    /// An NVIDIA GPU of compute capability [`Options::sm`]; the host code runs on the CPU
    /// and loads the CUDA driver when a context is created.
    Cuda,
}

/// Which CPU the code is generated for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Cpu {
    /// Portable for libraries and objects on x86-64 (unless other options tie the artifact to
    /// one CPU), this machine's CPU otherwise.
    #[default]
    Default,
    /// This machine's CPU (or, with another triple, its architecture's baseline).
    Native,
    /// x86-64-v3 and x86-64-v4 kernels in one artifact, the best chosen at run time.
    Portable,
    /// A CPU by LLVM's name (`x86-64-v3`, `znver4`, `neoverse-v1`, ...).
    Named(String),
}

/// The options of a compilation (`kiln compile`'s flags, less the printing ones).
#[derive(Clone, Debug)]
pub struct Options {
    /// The model's name (prefix of the C API); default: [`crate::ModelSource::default_name`].
    pub name: Option<String>,
    /// Where the artifact goes (a file, or a folder for the default names); default: the
    /// default name in the current folder.
    pub output: Option<PathBuf>,
    pub emit: Emit,
    pub target: Target,
    /// The GPU's compute capability (with [`Target::Cuda`]); default
    /// [`kiln_codegen::nvptx::DEFAULT_SM`].
    pub sm: Option<u32>,
    pub cpu: Cpu,
    /// The target triple; default: this machine's.
    pub triple: Option<String>,
    /// The activation layout; default: the target's (channels-last on CPUs, the model's own
    /// on GPUs).
    pub layout: Option<Layout>,
    pub precision: Precision,
    pub conv_algorithm: ConvAlgorithm,
    /// How kernels are configured: by the cost model, or by timing candidates on this
    /// machine (`--mode max-autotune`).
    pub mode: CompileMode,
    /// Where `max-autotune` keeps its measurements; default: [`default_autotune_cache`].
    pub autotune_cache: Option<PathBuf>,
    /// Passes to skip, by name: the optimizer's graph passes and codegen's plan passes
    /// ([`crate::pass_names`]; `fuse-kernels` turns off codegen's kernel grouping).
    pub disabled_passes: Vec<String>,
    /// Print the graph after these passes (the optimizer writes to stderr or to a file).
    pub print_after: Vec<PrintAfter>,
    /// Add the profiling functions to a library's C API.
    pub profile: bool,
    /// Write the packed weights to this safetensors file instead of embedding them.
    pub weights_out: Option<PathBuf>,
    /// Build the [`crate::Report`] of a compilation (always built when explaining).
    pub report: bool,
    /// The C compiler that links executables and shared libraries; default: the one codegen
    /// finds for the target (`kiln_codegen::linker::linker_for`: `$CC` or `cc` for this
    /// machine's architecture, the cross toolchain for another).
    pub cc: Option<String>,
    /// With [`Target::Cuda`], accept operators without a GPU kernel as C library kernels on
    /// one GPU block (`--gpu-library-kernels`); without it such a model is refused.
    pub gpu_library_kernels: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            name: None,
            output: None,
            emit: Emit::Exe,
            target: Target::Cpu,
            sm: None,
            cpu: Cpu::Default,
            triple: None,
            layout: None,
            precision: Precision::F32,
            conv_algorithm: ConvAlgorithm::Auto,
            mode: CompileMode::Default,
            autotune_cache: None,
            disabled_passes: vec![],
            print_after: vec![],
            profile: false,
            weights_out: None,
            report: false,
            cc: None,
            gpu_library_kernels: false,
        }
    }
}

impl Options {
    /// Options for an executable for this machine's CPU named `model`: what `kiln run` and
    /// `kiln verify` compile.
    pub fn host_executable() -> Options {
        Options {
            name: Some("model".to_string()),
            cpu: Cpu::Native,
            ..Options::default()
        }
    }

    /// The layout asked for, or the target's default: the GPU kernels read the model's own
    /// (NCHW) layout, so a CUDA model keeps it unless asked otherwise.
    pub fn effective_layout(&self) -> Layout {
        match (self.layout, self.target) {
            (Some(l), _) => l,
            (None, Target::Cuda) => Layout::Nchw,
            (None, Target::Cpu) => Layout::default(),
        }
    }

    /// Whether codegen groups nodes into fused kernels (off with the `fuse-kernels` plan pass
    /// disabled; the `fuse` graph pass is switched on its own).
    pub fn fusion(&self) -> bool {
        !self
            .disabled_passes
            .iter()
            .any(|p| p == kiln_codegen::plan::passes::FUSE_KERNELS)
    }
}
