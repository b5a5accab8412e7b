//! Target description: triple, CPU, LLVM features, and what the kernels may assume (vector
//! width, FMA, BF16 dot products). Kernels ask the target, never the host.

use crate::error::{CodegenError, Result};
use inkwell::targets::{CodeModel, InitializationConfig, RelocMode, Target, TargetMachine, TargetTriple};
use inkwell::OptimizationLevel;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    X86_64,
    Aarch64,
    /// NVIDIA GPUs (`--target cuda`): the device half of a CUDA model.
    Nvptx64,
}

/// The widest vector instruction set the kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// 128-bit vectors (SSE2 on x86-64, NEON on aarch64).
    Portable,
    /// 256-bit vectors with FMA (x86-64-v3).
    Avx2,
    /// 512-bit vectors (avx512f/bw/vl/dq).
    Avx512,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetDesc {
    pub triple: String,
    pub cpu: String,
    /// LLVM feature string (`+avx2,+fma,...`); empty means the CPU's defaults.
    pub features: String,
    pub arch: Arch,
    pub isa: Isa,
    pub has_fma: bool,
    /// `vdpbf16ps` is available (avx512_bf16).
    pub has_avx512_bf16: bool,
    /// `vpdpbusd` on 512-bit vectors is available (avx512_vnni).
    pub has_avx512_vnni: bool,
    /// The aarch64 dot-product instructions `sdot`/`udot` are available (FEAT_DotProd).
    pub has_dotprod: bool,
    /// Whether this target is the machine kiln runs on (executables can be run here).
    pub is_host: bool,
    /// Which convolution algorithms the CPU kernels may use (`kiln compile --conv-algorithm`).
    pub conv_algorithm: ConvAlgorithm,
    /// `--mode max-autotune`: product kernels take the cache blocking timed fastest on this
    /// machine (`tune`); None: the cost model's.
    pub tuning: Option<crate::tune::TuningHandle>,
    /// A CUDA target's f32 products run on TF32 tensor cores (`--precision tf32`, sm_80 and
    /// later): operands rounded to TF32, f32 accumulation. Never set for a CPU.
    pub tf32: bool,
}

/// How stride-1 3×3 convolutions may be computed (`gen::winograd`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ConvAlgorithm {
    /// Products of the weights and the im2col matrix only.
    Direct,
    /// Winograd F(4×4, 3×3) or F(2×2, 3×3) where it is faster.
    #[default]
    Auto,
}

impl TargetDesc {
    /// What `--mode max-autotune` keys its measurements by: the triple, CPU and features of
    /// this machine; an error for a target that is not this machine, whose kernels cannot be
    /// timed here.
    pub fn tuning_key(&self) -> Result<String, String> {
        if !self.is_host {
            return Err(format!(
                "--mode max-autotune times kernels on this machine, and the target ({} {}) is not this machine",
                self.triple, self.cpu
            ));
        }
        Ok(format!("{} {} {}", self.triple, self.cpu, self.features))
    }
}

impl TargetDesc {
    /// The machine kiln runs on, with all of its CPU's features.
    pub fn host() -> Result<TargetDesc> {
        init_llvm();
        let triple = TargetMachine::get_default_triple()
            .as_str()
            .to_string_lossy()
            .into_owned();
        let cpu = TargetMachine::get_host_cpu_name().to_string();
        let features = TargetMachine::get_host_cpu_features().to_string();
        let mut t = TargetDesc::new(&triple, &cpu, &features)?;
        t.is_host = true;
        Ok(t)
    }

    /// A target chosen on the command line; a missing triple means the host's, a missing CPU
    /// the host CPU (same triple) or the architecture's baseline (other triple).
    pub fn select(triple: Option<&str>, cpu: Option<&str>) -> Result<TargetDesc> {
        init_llvm();
        let host = TargetDesc::host()?;
        let triple = triple
            .map(normalize_triple)
            .unwrap_or_else(|| host.triple.clone());
        let same_arch = arch_of(&triple)? == host.arch;
        match cpu {
            None if triple == host.triple => Ok(host),
            None if same_arch => TargetDesc::new(&triple, &host.cpu, &host.features),
            None => TargetDesc::new(&triple, baseline_cpu(arch_of(&triple)?), ""),
            Some(cpu) => {
                let mut t = TargetDesc::new(&triple, cpu, "")?;
                // LLVM derives the instruction set from the CPU name; the table above only
                // tells the kernels what they may assume.
                t.features = String::new();
                Ok(t)
            }
        }
    }
    /// The CPU variants of a portable x86-64 artifact (`--cpu portable`): x86-64-v3
    /// (AVX2/FMA, 8 lanes), x86-64-v4 (AVX-512, 16 lanes), when `int8` (the model has integer
    /// products) x86-64-v4 with avx512_vnni (`vpdpbusd`), and when `bf16` (the model has bf16
    /// products) x86-64-v4 with avx512_bf16 (and avx512_vnni, which every such CPU has, when
    /// `int8`). Each is a complete set of kernels; the runtime picks the last one this CPU
    /// supports when a context is created, so they go from the fewest features to the most.
    pub fn portable_variants(triple: Option<&str>, bf16: bool, int8: bool) -> Result<Vec<TargetDesc>> {
        init_llvm();
        let triple = match triple {
            Some(t) => normalize_triple(t),
            None => TargetDesc::host()?.triple,
        };
        if arch_of(&triple)? != Arch::X86_64 {
            return Err(CodegenError::Target(format!(
                "--cpu portable is for x86-64 (it carries x86-64-v3 and x86-64-v4 kernels); \
                 for {triple} name a CPU with --cpu"
            )));
        }
        // x86-64-v4 implies neither avx512_vnni nor avx512_bf16: they are added to its features.
        let v4_with = |vnni: bool, bf16: bool| -> Result<TargetDesc> {
            let mut t = TargetDesc::select(Some(&triple), Some("x86-64-v4"))?;
            let features: Vec<&str> = [(vnni, "+avx512vnni"), (bf16, "+avx512bf16")]
                .into_iter()
                .filter_map(|(on, f)| on.then_some(f))
                .collect();
            t.features = features.join(",");
            t.has_avx512_vnni = vnni;
            t.has_avx512_bf16 = bf16;
            Ok(t)
        };
        let mut v = vec![
            TargetDesc::select(Some(&triple), Some("x86-64-v3"))?,
            TargetDesc::select(Some(&triple), Some("x86-64-v4"))?,
        ];
        if int8 {
            v.push(v4_with(true, false)?);
        }
        if bf16 {
            v.push(v4_with(int8, true)?);
        }
        Ok(v)
    }

    /// The CPU the shared code of a portable artifact (runtime, API, the CPU check) is
    /// compiled for: plain x86-64, so a CPU without AVX2 still reaches the check and is told
    /// what it lacks instead of faulting.
    pub fn portable_baseline(triple: Option<&str>) -> Result<TargetDesc> {
        TargetDesc::select(triple, Some("x86-64"))
    }

    /// What the runtime, the C API and `main` of a single-target artifact are compiled for:
    /// on x86-64 the architecture's baseline, so that on a CPU without the target's features
    /// the start-up check runs and names what is missing instead of the program dying of an
    /// illegal instruction before it (the kernels keep the target's features). Elsewhere the
    /// target itself.
    pub fn runtime_target(&self) -> TargetDesc {
        if self.arch != Arch::X86_64 {
            return self.clone();
        }
        let mut t = TargetDesc::select(Some(&self.triple), Some(baseline_cpu(self.arch)))
            .unwrap_or_else(|_| self.clone());
        // A function without "target-features" gets the target machine's, which for a host
        // build include AVX-512: name the baseline's explicitly.
        if t.features.is_empty() {
            t.features = "+sse2".into();
        }
        t
    }

    /// A variant's name in summaries, reports and `KILN_CPU_VARIANT`: the CPU, plus the
    /// features added to it (`x86-64-v4+avx512bf16`).
    pub fn variant_name(&self) -> String {
        let extra: Vec<&str> = self
            .features
            .split(',')
            .filter_map(|f| f.strip_prefix('+'))
            .collect();
        if extra.is_empty() {
            self.cpu.clone()
        } else {
            format!("{}+{}", self.cpu, extra.join("+"))
        }
    }

    fn new(triple: &str, cpu: &str, features: &str) -> Result<TargetDesc> {
        let arch = arch_of(triple)?;
        // With an explicit feature string the features are exactly what it says; otherwise
        // they are the CPU's, which LLVM knows and we ask it for through a target machine.
        let feature_list = if features.is_empty() {
            cpu_features(triple, cpu)?
        } else {
            features.to_string()
        };
        let has = |f: &str| feature_list.split(',').any(|x| x == format!("+{f}"));
        let isa = match arch {
            Arch::X86_64 if has("avx512f") && has("avx512bw") && has("avx512vl") && has("avx512dq") => {
                Isa::Avx512
            }
            Arch::X86_64 if has("avx2") && has("fma") => Isa::Avx2,
            _ => Isa::Portable,
        };
        Ok(TargetDesc {
            triple: triple.to_string(),
            cpu: cpu.to_string(),
            features: features.to_string(),
            arch,
            isa,
            has_fma: has("fma") || arch == Arch::Aarch64,
            has_avx512_bf16: has("avx512bf16"),
            has_avx512_vnni: has("avx512vnni"),
            has_dotprod: arch == Arch::Aarch64 && has("dotprod"),
            is_host: false,
            conv_algorithm: ConvAlgorithm::Auto,
            tuning: None,
            tf32: false,
        })
    }

    /// The device code of a CUDA model for compute capability `sm` (80 = sm_80). LLVM picks
    /// the lowest PTX ISA version the architecture needs.
    pub fn cuda(sm: u32) -> Result<TargetDesc> {
        init_llvm();
        Ok(TargetDesc {
            triple: "nvptx64-nvidia-cuda".to_string(),
            cpu: format!("sm_{sm}"),
            features: String::new(),
            arch: Arch::Nvptx64,
            isa: Isa::Portable,
            has_fma: true,
            has_avx512_bf16: false,
            has_avx512_vnni: false,
            has_dotprod: false,
            is_host: false,
            conv_algorithm: ConvAlgorithm::Direct,
            tuning: None,
            tf32: false,
        })
    }

    /// The compute capability of a CUDA target (80 for sm_80); None for a CPU.
    pub fn cuda_sm(&self) -> Option<u32> {
        if !self.is_gpu() {
            return None;
        }
        self.cpu.strip_prefix("sm_").and_then(|s| s.parse().ok())
    }

    /// Whether this is a GPU (the CPU kernel generators decline such targets).
    pub fn is_gpu(&self) -> bool {
        self.arch == Arch::Nvptx64
    }

    /// f32 lanes in one native vector of the selected ISA.
    /// Whether products of bf16 values run on `vdpbf16ps` pairs here (`gen/gemm/`,
    /// `bf16_pairs`): avx512_bf16 with the 512-bit tiles. Such kernels round their run-time
    /// operands to bf16 as they pack them, so they absorb the autocast's
    /// `Cast<f32>(Cast<bf16>(x))` pairs (`bf16_rounding`): the optimizer's
    /// `PipelineOptions::products_round_operands`.
    pub fn has_bf16_pair_kernels(&self) -> bool {
        self.has_avx512_bf16 && self.isa == Isa::Avx512
    }

    /// Whether integer products run on dot-product instructions (`gen::gemm::int8`):
    /// `vpdpbusd` on AVX-512, `sdot` on aarch64.
    pub fn has_int8_dot_kernels(&self) -> bool {
        (self.has_avx512_vnni && self.isa == Isa::Avx512) || self.has_dotprod
    }

    /// What this target's kernels need from the passes before them, decided once: the driver
    /// gives the same value to the optimizer (`PipelineOptions`) and to the planner
    /// (`plan::passes::PlanOptions`).
    pub fn needs(&self) -> TargetNeeds {
        TargetNeeds {
            // CPUs with bf16 pair kernels, and GPUs with bf16 tensor cores (sm_80 on).
            products_round_operands: match self.cuda_sm() {
                Some(sm) => sm >= 80,
                None => self.has_bf16_pair_kernels(),
            },
            integer_products: !self.is_gpu() && self.has_int8_dot_kernels(),
            dequantize_weights: self.is_gpu(),
        }
    }

    pub fn f32_lanes(&self) -> u32 {
        match self.isa {
            Isa::Avx512 => 16,
            Isa::Avx2 => 8,
            Isa::Portable => 4,
        }
    }

    /// Architecture name as the micro-kernel bitcode is keyed (`x86_64`, `aarch64`).
    pub fn arch_name(&self) -> &'static str {
        match self.arch {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
            Arch::Nvptx64 => "nvptx64",
        }
    }

    /// CPU features the artifact checks for at start-up (names the runtime stub knows).
    pub fn required_cpu_features(&self) -> Vec<&'static str> {
        let mut f = vec![];
        if self.arch == Arch::X86_64 {
            if self.isa >= Isa::Avx2 {
                f.extend(["avx2", "fma", "f16c"]);
            }
            if self.isa >= Isa::Avx512 {
                f.extend(["avx512f", "avx512bw", "avx512vl", "avx512dq"]);
            }
            if self.has_avx512_bf16 {
                f.push("avx512bf16");
            }
            if self.has_avx512_vnni {
                f.push("avx512vnni");
            }
        }
        if self.has_dotprod {
            f.push("dotprod");
        }
        f
    }

    pub fn target_machine(&self, opt: OptimizationLevel) -> Result<TargetMachine> {
        init_llvm();
        let triple = TargetTriple::create(&self.triple);
        let target = Target::from_triple(&triple).map_err(|e| CodegenError::Target(e.to_string()))?;
        target
            .create_target_machine(
                &triple,
                &self.cpu,
                &self.features,
                opt,
                RelocMode::PIC,
                CodeModel::Default,
            )
            .ok_or_else(|| CodegenError::Target(format!("LLVM cannot target {} / {}", self.triple, self.cpu)))
    }

    /// One-line description for summaries: `x86_64-unknown-linux-gnu znver3 (avx2)`.
    pub fn describe(&self) -> String {
        let isa = match (self.arch, self.isa) {
            (Arch::X86_64, Isa::Avx512) => "avx512",
            (Arch::X86_64, Isa::Avx2) => "avx2",
            (Arch::X86_64, Isa::Portable) => "sse2",
            (Arch::Aarch64, _) => "neon",
            (Arch::Nvptx64, _) => "cuda",
        };
        format!("{} {} ({isa})", self.triple, self.cpu)
    }
}

fn init_llvm() {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        let config = InitializationConfig::default();
        Target::initialize_x86(&config);
        Target::initialize_aarch64(&config);
        Target::initialize_nvptx(&config);
    });
}

fn normalize_triple(t: &str) -> String {
    match t {
        "aarch64-linux-gnu" => "aarch64-unknown-linux-gnu".to_string(),
        "x86_64-linux-gnu" => "x86_64-unknown-linux-gnu".to_string(),
        other => other.to_string(),
    }
}

fn arch_of(triple: &str) -> Result<Arch> {
    let arch = triple.split('-').next().unwrap_or("");
    match arch {
        "x86_64" => Ok(Arch::X86_64),
        "aarch64" | "arm64" => Ok(Arch::Aarch64),
        _ => Err(CodegenError::Target(format!(
            "unsupported target triple '{triple}' (kiln generates code for x86_64 and aarch64 Linux)"
        ))),
    }
}

fn baseline_cpu(arch: Arch) -> &'static str {
    match arch {
        Arch::X86_64 => "x86-64",
        Arch::Aarch64 => "generic",
        Arch::Nvptx64 => "sm_80",
    }
}

/// What the kernels may assume of a named CPU, as a `+a,+b,...` list. LLVM accepts any CPU
/// name silently, so kiln keeps its own table of the ones it knows; others are an error.
fn cpu_features(triple: &str, cpu: &str) -> Result<String> {
    const AVX2: &str = "+avx,+avx2,+fma,+f16c,+bmi2";
    const AVX512: &str = "+avx,+avx2,+fma,+f16c,+bmi2,+avx512f,+avx512bw,+avx512vl,+avx512dq";
    const AVX512_VNNI: &str =
        "+avx,+avx2,+fma,+f16c,+bmi2,+avx512f,+avx512bw,+avx512vl,+avx512dq,+avx512vnni";
    // Every CPU with avx512_bf16 also has avx512_vnni.
    const AVX512_BF16: &str =
        "+avx,+avx2,+fma,+f16c,+bmi2,+avx512f,+avx512bw,+avx512vl,+avx512dq,+avx512vnni,+avx512bf16";
    let x86: &[(&str, &str)] = &[
        ("x86-64", "+sse2"),
        ("x86-64-v2", "+sse2,+sse4.2,+popcnt"),
        ("x86-64-v3", AVX2),
        ("haswell", AVX2),
        ("broadwell", AVX2),
        ("skylake", AVX2),
        ("alderlake", AVX2),
        ("znver1", AVX2),
        ("znver2", AVX2),
        ("znver3", AVX2),
        ("x86-64-v4", AVX512),
        ("skylake-avx512", AVX512),
        ("cascadelake", AVX512_VNNI),
        ("icelake-server", AVX512_VNNI),
        ("cooperlake", AVX512_BF16),
        ("sapphirerapids", AVX512_BF16),
        ("graniterapids", AVX512_BF16),
        ("znver4", AVX512_BF16),
        ("znver5", AVX512_BF16),
    ];
    // The dot-product instructions came with Armv8.2's FEAT_DotProd (Cortex-A76, Neoverse).
    const DOTPROD: &str = "+neon,+dotprod";
    let aarch64: &[(&str, &str)] = &[
        ("generic", "+neon"),
        ("cortex-a53", "+neon"),
        ("cortex-a72", "+neon"),
        ("cortex-a76", DOTPROD),
        ("neoverse-n1", DOTPROD),
        ("neoverse-n2", DOTPROD),
        ("neoverse-v1", DOTPROD),
        ("neoverse-v2", DOTPROD),
        ("apple-m1", DOTPROD),
    ];
    match arch_of(triple)? {
        Arch::X86_64 => x86
            .iter()
            .find(|(name, _)| *name == cpu)
            .map(|(_, f)| f.to_string())
            .ok_or_else(|| {
                let names: Vec<&str> = x86.iter().map(|(n, _)| *n).collect();
                CodegenError::Target(format!(
                    "unknown x86-64 CPU '{cpu}' (known: {})",
                    names.join(", ")
                ))
            }),
        Arch::Nvptx64 => Ok(String::new()),
        Arch::Aarch64 => aarch64
            .iter()
            .find(|(name, _)| *name == cpu)
            .map(|(_, f)| f.to_string())
            .ok_or_else(|| {
                let names: Vec<&str> = aarch64.iter().map(|(n, _)| *n).collect();
                CodegenError::Target(format!(
                    "unknown aarch64 CPU '{cpu}' (known: {})",
                    names.join(", ")
                ))
            }),
    }
}

/// What a target's kernels need from the passes: one value per target ([`TargetDesc::needs`]),
/// so that the optimizer and the planner never ask the target separately.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TargetNeeds {
    /// The product kernels round their run-time operands to bf16 as they pack them (CPUs with
    /// avx512_bf16 pair kernels; never GPU kernels). The bf16 autocast then leaves its
    /// `Cast<f32>(Cast<bf16>(x))` pairs next to the products, and the planner's
    /// `absorb-bf16-rounding` pass lets the products read `x` themselves.
    pub products_round_operands: bool,
    /// The product kernels compute u8×s8 products (`vpdpbusd`): the optimizer turns a QDQ
    /// model's convolutions and matrix products into integer ones (`integer-products`).
    pub integer_products: bool,
    /// The products do not read block-quantized weights (BlockQuantizedMatMul), which the CPU
    /// GEMM reads as nibbles on every ISA: GPU targets. `dequantize-weights` then makes them
    /// float products.
    pub dequantize_weights: bool,
}
