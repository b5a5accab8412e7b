//! The compiled path for end-to-end tests: compile a model with kiln-codegen to an executable
//! and run it as a user would (`./model --input NAME=FILE.npy --output-dir DIR`), each run in
//! its own process so a crash or hang in generated code fails one case, not the suite.

use kiln_driver::{Cpu, Emit, Layout, Options, Precision, Session, Target};
use kiln_frontend::{load_model, ImportOptions, Model};
use kiln_ir::{Graph, Tensor};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one compiled run may take before it counts as a hang.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// Whether every value the graph computes has a static shape.
pub fn fully_static(graph: &Graph) -> bool {
    graph
        .nodes()
        .iter()
        .all(|n| n.outputs.iter().all(|o| o.ty.is_static()))
}

/// Tensors with the graph input names they are for, in graph order.
pub type NamedTensors = Vec<(String, Tensor)>;

/// A scratch folder removed on drop.
pub struct WorkDir(pub PathBuf);

impl WorkDir {
    pub fn new(tag: &str) -> WorkDir {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("kiln-test-{}-{n}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create work dir");
        WorkDir(dir)
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Optimizes `graph` with the CPU pipeline and compiles it to `out` for the host with `emit`.
pub fn compile_graph(
    graph: &Graph,
    name: &str,
    emit: Emit,
    out: &Path,
) -> Result<kiln_codegen::Summary, String> {
    compile_graph_without(graph, name, emit, out, &[])
}

pub use kiln_driver::FUSE_PASS;

/// Whether `--disable-pass NAME` means something for the default CPU pipeline: one of its
/// graph passes or one of codegen's plan passes (`fuse-kernels`: kernel grouping).
pub fn pass_exists(name: &str) -> bool {
    kiln_driver::pass_names().contains(&name)
}

/// [`compile_graph`] with the passes named in `disabled` turned off, as `kiln compile
/// --disable-pass` does.
pub fn compile_graph_without(
    graph: &Graph,
    name: &str,
    emit: Emit,
    out: &Path,
    disabled: &[&str],
) -> Result<kiln_codegen::Summary, String> {
    compile_for(graph, name, emit, out, disabled, None, Precision::F32, None)
}

/// [`compile_graph_without`] with `--precision bf16`, for this machine's CPU.
pub fn compile_graph_bf16_without(
    graph: &Graph,
    name: &str,
    emit: Emit,
    out: &Path,
    disabled: &[&str],
) -> Result<kiln_codegen::Summary, String> {
    compile_for(graph, name, emit, out, disabled, None, Precision::Bf16, None)
}

/// Optimizes `graph` and compiles it to `out` for an NVIDIA GPU of compute capability `sm`, as
/// `kiln compile --target cuda --sm SM` does: `Emit::Exe` or `Emit::StaticLib` for an artifact
/// that runs the kernels on the GPU, `Emit::Ptx` for the device code alone.
pub fn compile_graph_cuda(
    graph: &Graph,
    name: &str,
    sm: u32,
    emit: Emit,
    out: &Path,
) -> Result<kiln_codegen::Summary, String> {
    compile_for(graph, name, emit, out, &[], Some(sm), Precision::F32, None)
}

/// [`compile_graph_cuda`] with `--precision bf16`: the autocast's products run on tensor cores
/// from sm_80 on.
pub fn compile_graph_cuda_bf16(
    graph: &Graph,
    name: &str,
    sm: u32,
    emit: Emit,
    out: &Path,
) -> Result<kiln_codegen::Summary, String> {
    compile_for(graph, name, emit, out, &[], Some(sm), Precision::Bf16, None)
}

/// A CPU other than this machine's: the triple and CPU `kiln compile --target-triple T --cpu C`
/// take (no CPU: the architecture's baseline).
#[derive(Clone, Copy)]
pub struct CrossCpu<'a> {
    pub triple: &'a str,
    pub cpu: Option<&'a str>,
}

/// Optimizes `graph` with the CPU pipeline and compiles it to `out` for `cross` (an executable
/// is linked with that architecture's C toolchain; run it with [`run_executable_under`]).
pub fn compile_graph_cross(
    graph: &Graph,
    name: &str,
    emit: Emit,
    out: &Path,
    cross: CrossCpu,
) -> Result<kiln_codegen::Summary, String> {
    compile_for(graph, name, emit, out, &[], None, Precision::F32, Some(cross))
}

/// Optimizes and compiles `graph` as `kiln compile` would: for this machine's CPU, a GPU
/// (`cuda_sm`) or another CPU (`cross`), with the passes in `disabled` off.
#[allow(clippy::too_many_arguments)]
fn compile_for(
    graph: &Graph,
    name: &str,
    emit: Emit,
    out: &Path,
    disabled: &[&str],
    cuda_sm: Option<u32>,
    precision: Precision,
    cross: Option<CrossCpu>,
) -> Result<kiln_codegen::Summary, String> {
    // KILN_LAYOUT=nchw|nhwc runs the suites in one layout (default: the target's, as `kiln
    // compile` chooses: the pipeline's for the CPU, the model's own for the GPU).
    let layout = match std::env::var("KILN_LAYOUT").as_deref() {
        Ok("nchw") => Some(Layout::Nchw),
        Ok("nhwc") => Some(Layout::Nhwc),
        Ok(other) => return Err(format!("KILN_LAYOUT must be nchw or nhwc, got '{other}'")),
        Err(_) => None,
    };
    for p in disabled {
        if !pass_exists(p) {
            return Err(format!("no such pass '{p}'"));
        }
    }
    // This machine's CPU (a library too: not portable), as `kiln compile --cpu native`, or the
    // CPU of another architecture.
    let cpu = match cross {
        None => Cpu::Native,
        Some(CrossCpu { cpu: Some(c), .. }) => Cpu::Named(c.to_string()),
        Some(CrossCpu { cpu: None, .. }) => Cpu::Default,
    };
    let mut session = Session::new(Options {
        name: Some(name.to_string()),
        emit,
        target: if cuda_sm.is_some() {
            Target::Cuda
        } else {
            Target::Cpu
        },
        sm: cuda_sm,
        cpu,
        triple: cross.map(|c| c.triple.to_string()),
        layout,
        precision,
        disabled_passes: disabled.iter().map(|p| p.to_string()).collect(),
        // The suites track which plans still hold library kernels (the CUDA manifests).
        gpu_library_kernels: true,
        ..Options::default()
    });
    let mut graph = graph.clone();
    session
        .optimize(&mut graph)
        .map_err(|e| format!("optimize: {e}"))?;
    session.emit(&graph, out).map_err(|e| format!("compile: {e}"))
}

/// Runs a compiled executable on named inputs; returns its outputs in graph order.
pub fn run_executable(
    exe: &Path,
    graph: &Graph,
    inputs: &[(String, Tensor)],
    dir: &Path,
    threads: usize,
) -> Result<Vec<Tensor>, String> {
    run_executable_under(&[], exe, graph, inputs, dir, threads)
}

/// The command that starts `exe` through `launcher` (an emulator's command line, the
/// executable appended), or directly when `launcher` is empty.
pub fn command_under(launcher: &[&str], exe: &Path) -> Command {
    match launcher.split_first() {
        None => Command::new(exe),
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(exe);
            c
        }
    }
}

/// [`run_executable`] for an executable of another architecture, started by `launcher` (an
/// emulator's command line, such as `qemu-aarch64 -L /usr/aarch64-linux-gnu`, the executable
/// appended); an empty launcher runs it directly.
pub fn run_executable_under(
    launcher: &[&str],
    exe: &Path,
    graph: &Graph,
    inputs: &[(String, Tensor)],
    dir: &Path,
    threads: usize,
) -> Result<Vec<Tensor>, String> {
    let mut cmd = command_under(launcher, exe);
    for (i, (name, t)) in inputs.iter().enumerate() {
        let p = dir.join(format!("input{i}.npy"));
        kiln_frontend::npy::write_npy(&p, t).map_err(|e| format!("write input: {e}"))?;
        cmd.arg("--input").arg(format!("{name}={}", p.display()));
    }
    let out_dir = dir.join("out");
    cmd.arg("--output-dir")
        .arg(&out_dir)
        .arg("--threads")
        .arg(threads.to_string());
    cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
            break s;
        }
        if start.elapsed() > RUN_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "compiled model did not finish in {} s",
                RUN_TIMEOUT.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut stderr);
    }
    if !status.success() {
        return Err(format!("compiled model failed ({status}): {}", stderr.trim()));
    }
    graph
        .outputs()
        .iter()
        .map(|o| {
            let p = out_dir.join(kiln_frontend::npy::output_file_name(&o.name));
            let t = kiln_frontend::npy::read_npy(&p).map_err(|e| format!("output '{}': {e}", o.name))?;
            // numpy has no bfloat16: the artifact writes bf16 outputs as float32 (exactly).
            Ok(match graph.value_type(o.value).dtype {
                kiln_ir::DType::BF16 if t.dtype() == kiln_ir::DType::F32 => t.cast(kiln_ir::DType::BF16),
                _ => t,
            })
        })
        .collect()
}

/// An ahead-of-time compiler needs shape-determining operands (Reshape shapes, Slice starts,
/// Resize scales, TopK's k, Tile repeats, ...) at compile time. Tests pass them as graph inputs,
/// so when `model` is not fully static, the small inputs (rank ≤ 1, ≤ 64 elements) are bound as
/// constants — what a user does with `kiln compile --bind NAME=FILE`. Returns the re-imported
/// model (None: compile `model` as it is) and the inputs left to pass at run time (graph order).
pub fn bind_shape_inputs(
    model_path: &Path,
    opts: &ImportOptions,
    model: &Model,
    inputs: Vec<(String, Tensor)>,
) -> Result<(Option<Model>, NamedTensors), String> {
    if fully_static(&model.graph) {
        return Ok((None, inputs));
    }
    let (bound, runtime): (Vec<_>, Vec<_>) = inputs
        .into_iter()
        .partition(|(_, t)| t.rank() <= 1 && t.len() <= 64);
    let mut opts = opts.clone();
    opts.weights.extend(bound);
    let model = load_model(model_path, &opts).map_err(|e| format!("import with bound inputs: {e}"))?;
    Ok((Some(model), runtime))
}

/// The compiled backend for ONNX node cases (see [`bind_shape_inputs`]).
pub fn node_case_backend(
    model_path: &Path,
    model: &Model,
    inputs: Vec<Tensor>,
) -> Result<Vec<Tensor>, String> {
    node_case_on(model_path, model, inputs, None)
}

/// [`node_case_backend`] with the kernels on an NVIDIA GPU of compute capability `sm`.
pub fn node_case_backend_cuda(
    sm: u32,
) -> impl Fn(&Path, &Model, Vec<Tensor>) -> Result<Vec<Tensor>, String> + Sync {
    move |path, model, inputs| node_case_on(path, model, inputs, Some(sm))
}

/// The node-case backend on the CUDA target without a GPU: [`run_cuda_emulated`].
pub fn node_case_backend_cuda_emulated(
    model_path: &Path,
    model: &Model,
    inputs: Vec<Tensor>,
) -> Result<Vec<Tensor>, String> {
    let names: Vec<String> = model.graph.input_types().map(|(n, _)| n.to_string()).collect();
    let named: Vec<(String, Tensor)> = names.into_iter().zip(inputs).collect();
    let (bound, runtime) = bind_shape_inputs(model_path, &ImportOptions::default(), model, named)?;
    let graph = &bound.as_ref().unwrap_or(model).graph;
    let case = model_path
        .parent()
        .and_then(Path::file_name)
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let inputs = runtime.into_iter().map(|(_, t)| t).collect();
    run_cuda_emulated_with(graph, "model", inputs, Precision::F32, |_, library| {
        CUDA_LIBRARY_KERNELS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(case.clone(), library);
    })
}

/// The C library kernels in the CUDA plan of every node case [`node_case_backend_cuda_emulated`]
/// planned, by case name (0 for a plan of generated kernels only).
static CUDA_LIBRARY_KERNELS: std::sync::Mutex<std::collections::BTreeMap<String, usize>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// What [`node_case_backend_cuda_emulated`] has recorded so far: case name → library kernels.
pub fn cuda_library_kernels_planned() -> std::collections::BTreeMap<String, usize> {
    CUDA_LIBRARY_KERNELS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// The compute capability the emulated CUDA suites plan for.
pub const EMULATED_SM: u32 = 80;

/// Optimizes and plans `graph` as `kiln compile --target cuda --sm 80` does and runs the plan on
/// this CPU under codegen's emulator (`kiln_codegen::nvptx::emulate`: each block's threads on
/// OS threads meeting at its barriers, library kernels on a block as on the device); `inputs`
/// in graph input order. Returns the outputs in graph order.
pub fn run_cuda_emulated(graph: &Graph, name: &str, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, String> {
    run_cuda_emulated_with(graph, name, inputs, Precision::F32, |_, _| {})
}

/// [`run_cuda_emulated`] as `kiln compile --target cuda --precision bf16` compiles it; also
/// returns how many operators the autocast put in bf16.
pub fn run_cuda_emulated_bf16(
    graph: &Graph,
    name: &str,
    inputs: Vec<Tensor>,
) -> Result<(Vec<Tensor>, usize), String> {
    let mut bf16_ops = 0;
    let outputs = run_cuda_emulated_with(graph, name, inputs, Precision::Bf16, |optimized, _| {
        bf16_ops = kiln_optimizer::passes::bf16_autocast::summary(optimized).bf16_ops;
    })?;
    Ok((outputs, bf16_ops))
}

/// [`run_cuda_emulated`] in `precision`, telling `planned` the optimized graph and how many C
/// library kernels the plan has before running it.
fn run_cuda_emulated_with(
    graph: &Graph,
    name: &str,
    inputs: Vec<Tensor>,
    precision: Precision,
    planned: impl FnOnce(&Graph, usize),
) -> Result<Vec<Tensor>, String> {
    let mut session = Session::new(Options {
        name: Some(name.to_string()),
        target: Target::Cuda,
        sm: Some(EMULATED_SM),
        cpu: Cpu::Native,
        precision,
        ..Options::default()
    });
    let mut optimized = graph.clone();
    session
        .optimize(&mut optimized)
        .map_err(|e| format!("optimize: {e}"))?;
    let plan = session.plan(&optimized).map_err(|e| format!("compile: {e}"))?;
    planned(
        &optimized,
        plan.kernels
            .iter()
            .filter(|k| matches!(k.imp, kiln_codegen::plan::kernel::KernelImpl::Ukernel(_)))
            .count(),
    );
    let target = session.kernel_target().map_err(|e| format!("{e}"))?;
    kiln_codegen::nvptx::emulate::run_plan(&optimized, &plan, &target, &inputs)
        .map_err(|e| format!("emulation: {e}"))
}

fn node_case_on(
    model_path: &Path,
    model: &Model,
    inputs: Vec<Tensor>,
    cuda_sm: Option<u32>,
) -> Result<Vec<Tensor>, String> {
    let names: Vec<String> = model.graph.input_types().map(|(n, _)| n.to_string()).collect();
    let named: Vec<(String, Tensor)> = names.into_iter().zip(inputs).collect();
    let (bound, runtime) = bind_shape_inputs(model_path, &ImportOptions::default(), model, named)?;
    let graph = &bound.as_ref().unwrap_or(model).graph;
    let work = WorkDir::new("case");
    let exe = work.0.join("model");
    compile_for(
        graph,
        "model",
        Emit::Exe,
        &exe,
        &[],
        cuda_sm,
        Precision::F32,
        None,
    )?;
    run_executable(&exe, graph, &runtime, &work.0, 1)
}
