//! Runs a model's GPU kernels on the host CPU, for tests on machines without a GPU.
//!
//! A graph is planned for `TargetDesc::cuda(80)`; each generated GPU kernel is emitted with [`Mode::Emulated`] (the special registers, the barrier and the shared
//! memory become calls to `kiln_gpu_sreg` / `kiln_gpu_barrier` / `kiln_gpu_shared`) into one
//! module for the host, which MCJIT compiles. The harness lays out a `kiln_gpu_frame`
//! (kiln_cuda.h) over host buffers and runs each launch's grid: blocks one after another, the
//! threads of a block on OS threads that meet at a barrier, each with its own special registers
//! and the block's zeroed shared memory. A kernel that never calls the barrier runs its threads
//! one after another on the calling thread, which is much cheaper and equally strict: no thread
//! may rely on another without a barrier.
//!
//! Library kernels (the C micro-kernels) run too, compiled for the host and launched as on the
//! device — one block of `device::library_threads` threads — with the runtime calls they make
//! (`kiln_rt_parallel_for`, ...) answered here with `runtime-stub/c/device.c`'s semantics: every
//! thread runs the serial code and the tasks are dealt out between barriers. On real OS threads
//! that checks that a micro-kernel listed as block-parallel tolerates it.
//!
//! `check_graph` compares the outputs with `kiln_ir`'s evaluator; `ptxas_check` assembles the
//! device PTX of the same plan with ptxas.

#![allow(dead_code)] // the API for the GPU kernel tests

use super::{device, frame, MmaKind, Mode, Sreg};
use crate::kernel::Storage;
use crate::plan::kernel::KernelImpl;
use crate::plan::{self, Plan};
use crate::target::TargetDesc;
use inkwell::context::Context;
use inkwell::passes::PassBuilderOptions;
use inkwell::values::{FunctionValue, InstructionOpcode};
use inkwell::OptimizationLevel;
use kiln_ir::{DType, Graph, Tensor};
use std::cell::Cell;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// The compute capability tests plan for.
pub(crate) const SM: u32 = 80;

/// Plans `graph` for the GPU (with fusion) and runs it in emulation. Returns the outputs and
/// each kernel's description, in run order.
pub(crate) fn run_graph(graph: &Graph, inputs: &[Tensor]) -> Result<(Vec<Tensor>, Vec<String>), String> {
    run_graph_with(graph, inputs, true)
}

/// [`run_graph`] with fusion on or off.
pub(crate) fn run_graph_with(
    graph: &Graph,
    inputs: &[Tensor],
    fusion: bool,
) -> Result<(Vec<Tensor>, Vec<String>), String> {
    run_graph_for(graph, inputs, fusion, SM)
}

/// [`run_graph_with`] planned for compute capability `sm`.
fn run_graph_for(
    graph: &Graph,
    inputs: &[Tensor],
    fusion: bool,
    sm: u32,
) -> Result<(Vec<Tensor>, Vec<String>), String> {
    let target = TargetDesc::cuda(sm).map_err(|e| e.to_string())?;
    // Data-dependent outputs planned with their bounds, as compile does.
    let bounded = crate::data_dependent::bound_outputs(graph).map_err(|e| e.to_string())?;
    let plan = plan::build(&bounded.graph, &target, fusion).map_err(|e| e.to_string())?;
    let describes: Vec<String> = plan.kernels.iter().map(|k| k.describe()).collect();
    let outputs = run_plan(graph, &plan, &target, inputs)?;
    Ok((outputs, describes))
}

/// Runs `graph` in emulation and compares every output with `kiln_ir::eval`. Panics with the
/// first difference. Returns the kernels' descriptions, so tests can check which kernels ran.
pub(crate) fn check_graph(graph: &Graph, inputs: &[Tensor]) -> Vec<String> {
    check_graph_for(graph, inputs, SM)
}

/// [`check_graph`] planned for compute capability `sm`.
pub(crate) fn check_graph_for(graph: &Graph, inputs: &[Tensor], sm: u32) -> Vec<String> {
    let (got, describes) =
        run_graph_for(graph, inputs, true, sm).unwrap_or_else(|e| panic!("emulation: {e}"));
    let want = kiln_ir::eval::eval_graph(graph, inputs.to_vec()).expect("reference evaluation");
    assert_eq!(got.len(), want.len(), "number of outputs");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        compare(&format!("output {i} ({})", describes.join("; ")), g, w);
    }
    describes
}

/// Asserts `got` matches `want`: same dtype and shape; f32 within rtol 1e-4 / atol 1e-5
/// (looser for 16-bit floats; f64 within 1e-10 / 1e-12, which a kernel computing in f32
/// misses), NaN where the reference is NaN; everything else exact.
pub(crate) fn compare(what: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let (rtol, atol) = match got.dtype() {
        DType::F32 => (1e-4, 1e-5),
        DType::F64 => (1e-10, 1e-12),
        DType::F16 => (1e-3, 1e-4),
        DType::BF16 => (1e-2, 1e-3),
        _ => (0.0, 0.0),
    };
    for (i, (g, w)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else {
            g == &w || (g - w).abs() <= atol + rtol * w.abs()
        };
        assert!(ok, "{what}: element {i}: got {g}, want {w}");
    }
}

/// Emits the device PTX of `graph`'s plan for `sm` and assembles it with ptxas. Returns false
/// (after printing why) when ptxas is absent and `CI` is not set.
pub(crate) fn ptxas_check(graph: &Graph, sm: u32) -> bool {
    ptxas_check_target(graph, &TargetDesc::cuda(sm).unwrap())
}

/// [`ptxas_check`] for a CUDA `target` with its options (`tf32`).
pub(crate) fn ptxas_check_target(graph: &Graph, target: &TargetDesc) -> bool {
    let sm = target.cuda_sm().expect("a CUDA target");
    let Some(ptxas) = find_ptxas() else {
        assert!(std::env::var_os("CI").is_none(), "ptxas not found and CI is set");
        eprintln!("ptxas not found ($KILN_PTXAS or .venv's nvidia-cuda-nvcc): skipping the PTX check");
        return false;
    };
    libdevice_beside(&ptxas);
    let bounded = crate::data_dependent::bound_outputs(graph).unwrap();
    let graph = &*bounded.graph;
    let plan = plan::build(graph, target, true).unwrap();
    for k in &plan.kernels {
        assert!(
            matches!(k.imp, KernelImpl::Gpu(_)),
            "kernel {} ({}) is not a generated GPU kernel",
            k.node_name,
            k.describe()
        );
    }
    let code = device::build(graph, &plan, target, "t").unwrap();
    let dir = std::env::temp_dir().join(format!(
        "kiln-ptxas-{}-{}",
        std::process::id(),
        PTX_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let ptx = dir.join("k.ptx");
    std::fs::write(&ptx, &code.ptx).unwrap();
    let out = std::process::Command::new(&ptxas)
        .arg(format!("-arch=sm_{sm}"))
        .arg(&ptx)
        .arg("-o")
        .arg(dir.join("k.cubin"))
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "ptxas rejected the PTX for sm_{sm}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    true
}

/// Points `KILN_LIBDEVICE` (once, when unset) at the libdevice of the CUDA package `ptxas`
/// comes from (`nvidia/cuda_nvcc/{bin/ptxas, nvvm/libdevice/libdevice.10.bc}`), for the kernels
/// that call the math library.
fn libdevice_beside(ptxas: &std::path::Path) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("KILN_LIBDEVICE").is_some() {
            return;
        }
        let Some(root) = ptxas.parent().and_then(|bin| bin.parent()) else {
            return;
        };
        let bc = root.join("nvvm/libdevice/libdevice.10.bc");
        if bc.is_file() {
            std::env::set_var("KILN_LIBDEVICE", bc);
        }
    });
}

static PTX_SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn find_ptxas() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("KILN_PTXAS") {
        return Some(p.into());
    }
    // The workspace's .venv (tests run in the crate directory).
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let lib = root.join(".venv/lib");
    for entry in std::fs::read_dir(lib).ok()?.flatten() {
        let p = entry.path().join("site-packages/nvidia/cuda_nvcc/bin/ptxas");
        if p.is_file() {
            return Some(p);
        }
    }
    None
}

/// Runs every kernel of `plan` (generated GPU kernels and library kernels on a block) on
/// `inputs`, in graph input order; returns the outputs in graph output order, those whose size
/// depends on the data cut to the count their kernel wrote, as the host runtime reports them.
/// `graph` is the graph that was planned, before its data-dependent values were bounded.
pub fn run_plan(
    graph: &Graph,
    plan: &Plan,
    target: &TargetDesc,
    inputs: &[Tensor],
) -> Result<Vec<Tensor>, String> {
    let bounded = crate::data_dependent::bound_outputs(graph).map_err(|e| e.to_string())?;
    let graph = &*bounded.graph;
    let counts = crate::data_dependent::output_counts(graph).map_err(|e| e.to_string())?;
    let host = TargetDesc::host().map_err(|e| e.to_string())?;
    let cx = Context::create();
    let module = cx.create_module("kiln_emulated");
    let tm = host
        .target_machine(OptimizationLevel::Default)
        .map_err(|e| e.to_string())?;
    module.set_triple(&tm.get_triple());
    module.set_data_layout(&tm.get_target_data().get_data_layout());
    let builder = cx.create_builder();
    let api = crate::api::Api {
        prefix: "t".into(),
        profile: false,
        weights_file: None,
        cuda: false,
    };
    let parts = crate::emit::ModuleParts {
        graph,
        plan,
        target,
        api: &api,
        model_name: "t",
        with_main: false,
        cuda: None,
        portable: None,
        variant: None,
        weights_object: None,
        // Only the host's API reads this list; a root's kernel finds its count slot from the
        // graph (`data_dependent::output_counts`).
        data_dependent: &[],
        batch: None,
    };
    let bodies = crate::emit::kernels::kernel_functions(&cx, &module, &parts, &mut |_, _| {})
        .map_err(|e| e.to_string())?;
    let mut launches = vec![];
    let mut library = false;
    for (i, k) in plan.kernels.iter().enumerate() {
        let name = format!("kiln_k{i}");
        let KernelImpl::Gpu(g) = &k.imp else {
            let KernelImpl::Ukernel(c) = &k.imp else {
                return Err(format!(
                    "kernel {i} ({}) is neither a GPU nor a library kernel",
                    k.describe()
                ));
            };
            device::library_entry(
                &cx,
                &module,
                &builder,
                &name,
                i,
                k,
                plan,
                bodies[i],
                graph.inputs().len(),
            )
            .map_err(|e| e.to_string())?;
            let threads = device::library_threads(c.symbol);
            let dims = super::LaunchDims {
                grid: [1, 1, 1],
                block: [threads, 1, 1],
                shared_bytes: 0,
            };
            launches.push((name, dims, threads > 1));
            library = true;
            continue;
        };
        // SAFETY: the placeholder body of a GPU kernel is never called.
        unsafe { bodies[i].delete() };
        let f = device::gpu_entry(
            &cx,
            &module,
            &builder,
            &name,
            k,
            g.as_ref(),
            graph,
            plan,
            target,
            Mode::Emulated,
            i,
        )
        .map_err(|e| e.to_string())?;
        let dims = g.launch();
        check_dims(&name, &g.describe(), dims)?;
        launches.push((name, dims, calls_barrier(f)));
    }
    if library {
        crate::llvm::link_units(&cx, &module, &host, "uk_").map_err(|e| e.to_string())?;
        // Only what the entries reach: the library is large and the JIT compiles all it gets.
        let entries: Vec<String> = launches.iter().map(|(n, _, _)| n.clone()).collect();
        crate::llvm::internalize(&module, &entries);
        module
            .run_passes("globaldce", &tm, PassBuilderOptions::create())
            .map_err(|e| e.to_string())?;
    }
    // The entries were built for the GPU target's attributes; compile them for this CPU.
    crate::llvm::retarget_all(&cx, &module, &host);
    crate::llvm::verify(&module).map_err(|e| e.to_string())?;
    module
        .run_passes("default<O2>", &tm, PassBuilderOptions::create())
        .map_err(|e| e.to_string())?;
    let ee = module
        .create_jit_execution_engine(OptimizationLevel::Default)
        .map_err(|e| e.to_string())?;
    for (name, addr) in [
        ("kiln_gpu_sreg", emu_sreg as *const () as usize),
        ("kiln_gpu_barrier", emu_barrier as *const () as usize),
        ("kiln_gpu_shared", emu_shared as *const () as usize),
        ("kiln_gpu_mma_bf16", emu_mma_bf16 as *const () as usize),
        ("kiln_gpu_mma_f16", emu_mma_f16 as *const () as usize),
        ("kiln_gpu_mma_tf32", emu_mma_tf32 as *const () as usize),
        ("kiln_gpu_f16_to_f32", emu_f16_to_f32 as *const () as usize),
        ("kiln_gpu_f32_to_f16", emu_f32_to_f16 as *const () as usize),
        ("kiln_rt_block_begin", emu_block_begin as *const () as usize),
        ("kiln_rt_parallel_for", emu_parallel_for as *const () as usize),
        ("kiln_rt_num_threads", emu_num_threads as *const () as usize),
        ("kiln_rt_thread_scratch", emu_thread_scratch as *const () as usize),
        ("kiln_rt_set_error", emu_set_error as *const () as usize),
    ] {
        if let Some(f) = module.get_function(name) {
            ee.add_global_mapping(&f, addr);
        }
    }

    // Host buffers, 64-byte aligned like the device allocations.
    if inputs.len() != graph.inputs().len() {
        return Err(format!(
            "{} inputs given, the graph has {}",
            inputs.len(),
            graph.inputs().len()
        ));
    }
    let mut arena = Buf::new(plan.arena_bytes as usize);
    let blob = plan.weights.bytes().map_err(|e| e.to_string())?;
    let mut weights = Buf::new(blob.len());
    weights.bytes_mut()[..blob.len()].copy_from_slice(blob);
    let mut input_bufs: Vec<Buf> = inputs
        .iter()
        .map(|t| {
            let b = t.to_le_bytes();
            let mut buf = Buf::new(b.len());
            buf.bytes_mut()[..b.len()].copy_from_slice(&b);
            buf
        })
        .collect();
    let mut out_types = vec![];
    let mut output_bufs = vec![];
    for o in graph.outputs() {
        let ty = graph.value_type(o.value);
        let shape = ty
            .fixed_shape()
            .ok_or_else(|| format!("output '{}' has no static shape", o.name))?;
        let bytes = ty.size_bytes().unwrap_or(0);
        out_types.push((ty.dtype, shape, bytes));
        output_bufs.push(Buf::new(bytes));
    }
    // The error slot (two i32) and the outputs' counts after it, as `kiln_cuda.h` lays them out.
    let mut status = vec![0i64; 1 + counts.len()];
    // As the host runtime sizes it: a stride per thread of the widest library block.
    let stride = plan.thread_scratch_bytes.div_ceil(64) as usize * 64;
    let mut thread_scratch = Buf::new(stride * device::library_threads("ew_unary") as usize);
    // kiln_gpu_frame: arena, weights, error, thread scratch, io[] (inputs, then outputs).
    let mut frame_words: Vec<usize> = vec![
        arena.ptr() as usize,
        weights.ptr() as usize,
        status.as_mut_ptr() as usize,
        thread_scratch.ptr() as usize,
    ];
    debug_assert_eq!(frame::IO, 32);
    frame_words.extend(input_bufs.iter_mut().map(|b| b.ptr() as usize));
    frame_words.extend(output_bufs.iter_mut().map(|b| b.ptr() as usize));
    let frame_addr = frame_words.as_mut_ptr() as usize;

    for (name, dims, barrier) in &launches {
        type Entry = unsafe extern "C" fn(*mut u8);
        // SAFETY: every entry was built as `void (ptr frame)`.
        let f = unsafe { ee.get_function::<Entry>(name) }.map_err(|e| format!("{name}: {e}"))?;
        // SAFETY: the frame's buffers are live and sized by the plan.
        let raw: Entry = unsafe { f.as_raw() };
        run_grid(raw, frame_addr, *dims, *barrier);
        let (kernel, code) = (status[0] as i32, (status[0] >> 32) as i32);
        if kernel != 0 {
            return Err(format!("kernel {} failed with code {code}", kernel - 1));
        }
        // A kernel may use weight memory (split-K's tile counters) but must leave it as it
        // found it: the next run, or a CUDA graph's replay, starts from the same state.
        if weights.bytes()[..blob.len()] != *blob {
            return Err(format!("kernel {name} left the weights changed"));
        }
    }

    for c in &plan.output_copies {
        let n = c.bytes as usize;
        let src: Vec<u8> = match c.from {
            Storage::Input(i) => input_bufs[i].bytes()[..n].to_vec(),
            Storage::Output(i) => output_bufs[i].bytes()[..n].to_vec(),
            Storage::Arena(off) => arena.bytes()[off as usize..off as usize + n].to_vec(),
            Storage::Weights(off) => weights.bytes()[off as usize..off as usize + n].to_vec(),
        };
        output_bufs[c.output].bytes_mut()[..n].copy_from_slice(&src);
    }
    let mut outs = vec![];
    for (j, ((dtype, mut shape, bytes), buf)) in out_types.into_iter().zip(&output_bufs).enumerate() {
        let mut bytes = bytes;
        // A data-dependent output: its values come first in the bound's buffer.
        if let Some(c) = counts.iter().position(|&(o, _)| o == j) {
            let (axis, n) = (counts[c].1, status[1 + c]);
            if n < 0 || n as usize > shape[axis] {
                return Err(format!("output {j}: count {n} outside its bound {}", shape[axis]));
            }
            let bound: usize = shape.iter().product();
            shape[axis] = n as usize;
            bytes = match bound {
                0 => 0,
                _ => bytes / bound * shape.iter().product::<usize>(),
            };
        }
        outs.push(Tensor::from_le_bytes(dtype, shape, &buf.bytes()[..bytes]).map_err(|e| format!("{e:?}"))?);
    }
    Ok(outs)
}

fn check_dims(name: &str, what: &str, d: super::LaunchDims) -> Result<(), String> {
    let threads: u64 = d.block.iter().map(|&b| b as u64).product();
    let ok = d.grid.iter().chain(&d.block).all(|&x| x >= 1)
        && d.grid[0] < (1 << 31)
        && d.grid[1] <= 65535
        && d.grid[2] <= 65535
        && threads <= 1024
        && d.block[2] <= 64;
    if ok {
        Ok(())
    } else {
        Err(format!("{name} ({what}): launch {d:?} is outside CUDA's limits"))
    }
}

/// Whether the body calls `kiln_gpu_barrier` or a warp-wide instruction (its threads must then
/// run concurrently).
fn calls_barrier(f: FunctionValue<'_>) -> bool {
    for bb in f.get_basic_blocks() {
        let mut inst = bb.get_first_instruction();
        while let Some(i) = inst {
            if i.get_opcode() == InstructionOpcode::Call {
                let n = i.get_num_operands();
                let callee = n
                    .checked_sub(1)
                    .and_then(|last| i.get_operand(last))
                    .and_then(|o| o.value())
                    .map(|v| v.into_pointer_value());
                if let Some(p) = callee {
                    let name = p.get_name().to_bytes();
                    let mma = [MmaKind::Bf16, MmaKind::F16, MmaKind::Tf32].map(|k| k.emulator().as_bytes());
                    if name == b"kiln_gpu_barrier" || mma.contains(&name) {
                        return true;
                    }
                }
            }
            inst = i.get_next_instruction();
        }
    }
    false
}

/// A zeroed, 64-byte aligned host buffer (at least one block, so its address is valid).
struct Buf(Vec<Align64>);

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Align64([u8; 64]);

impl Buf {
    fn new(bytes: usize) -> Buf {
        Buf(vec![Align64([0; 64]); bytes.div_ceil(64).max(1)])
    }
    fn ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr() as *mut u8
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: Align64 is plain bytes.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr() as *const u8, self.0.len() * 64) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        let n = self.0.len() * 64;
        // SAFETY: Align64 is plain bytes.
        let all = unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr() as *mut u8, n) };
        all
    }
}

/// What the emulated special registers, barrier and shared memory read on the current thread.
#[derive(Clone, Copy)]
struct ThreadState {
    /// In `Sreg::code` order: tid, ctaid, ntid, nctaid (x, y, z each).
    sreg: [i32; 12],
    shared: usize,
    barrier: usize,
    /// The block's [`WarpExchange`] (0 when its threads run one after another).
    warps: usize,
}

thread_local! {
    static STATE: Cell<ThreadState> = const {
        Cell::new(ThreadState { sreg: [0; 12], shared: 0, barrier: 0, warps: 0 })
    };
}

extern "C" fn emu_sreg(code: i32) -> i32 {
    STATE.with(|s| s.get().sreg[code as usize])
}

extern "C" fn emu_shared() -> *mut u8 {
    STATE.with(|s| s.get().shared as *mut u8)
}

extern "C" fn emu_barrier() {
    let b = STATE.with(|s| s.get().barrier);
    assert!(b != 0, "barrier called by a kernel run without one");
    // SAFETY: set by run_grid to a BlockBarrier that outlives the block's threads.
    let b = unsafe { &*(b as *const BlockBarrier) };
    b.wait();
}

/// Where the lanes of a block's warps meet for a warp-wide instruction (`mma`): each lane's
/// registers, and a barrier per warp.
struct WarpExchange {
    regs: Mutex<Vec<[u32; 10]>>,
    barriers: Vec<BlockBarrier>,
}

impl WarpExchange {
    fn new(threads: usize) -> WarpExchange {
        WarpExchange {
            regs: Mutex::new(vec![[0; 10]; threads]),
            barriers: (0..threads.div_ceil(32))
                .map(|w| BlockBarrier::new((threads - 32 * w).min(32)))
                .collect(),
        }
    }
}

/// Where element `i` (0..8) of a lane's A fragment of `mma.m16n8k16` (bf16 or f16, row-major A) sits:
/// `(row, col)` of the 16×16 A for lane `lane`, per the PTX ISA's fragment figure: register
/// `i / 2`, low half for even `i`.
fn mma_a_element(lane: usize, i: usize) -> (usize, usize) {
    let (group, in_group) = (lane >> 2, lane & 3);
    let row = group + if i & 2 != 0 { 8 } else { 0 };
    let col = in_group * 2 + (i & 1) + if i >= 4 { 8 } else { 0 };
    (row, col)
}

/// `(k, n)` of element `i` (0..4) of a lane's B fragment (16×8, column-major B).
fn mma_b_element(lane: usize, i: usize) -> (usize, usize) {
    let (group, in_group) = (lane >> 2, lane & 3);
    (in_group * 2 + (i & 1) + if i >= 2 { 8 } else { 0 }, group)
}

/// `(row, col)` of element `i` (0..4) of a lane's C/D fragment (16×8 f32).
fn mma_c_element(lane: usize, i: usize) -> (usize, usize) {
    let (group, in_group) = (lane >> 2, lane & 3);
    (group + if i >= 2 { 8 } else { 0 }, in_group * 2 + (i & 1))
}

/// Where register `i` (0..4) of a lane's A fragment of `mma.m16n8k8` (tf32, row-major A)
/// sits: `(row, col)` of the 16×8 A — a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)
/// for group g = lane / 4 and t = lane % 4.
fn mma_tf32_a_element(lane: usize, i: usize) -> (usize, usize) {
    let (group, in_group) = (lane >> 2, lane & 3);
    (group + 8 * (i & 1), in_group + 4 * (i >> 1))
}

/// `(k, n)` of register `i` (0..2) of a lane's tf32 B fragment (8×8, column-major B): b0 (t, g),
/// b1 (t + 4, g).
fn mma_tf32_b_element(lane: usize, i: usize) -> (usize, usize) {
    let (group, in_group) = (lane >> 2, lane & 3);
    (in_group + 4 * i, group)
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32` for the calling lane (see [`emu_mma`]).
extern "C" fn emu_mma_bf16(regs: *mut u32) {
    emu_mma(MmaKind::Bf16, regs)
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32` for the calling lane (see [`emu_mma`]).
extern "C" fn emu_mma_f16(regs: *mut u32) {
    emu_mma(MmaKind::F16, regs)
}

/// `mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32` for the calling lane (see [`emu_mma`]).
extern "C" fn emu_mma_tf32(regs: *mut u32) {
    emu_mma(MmaKind::Tf32, regs)
}

/// An `mma` of `kind` for the calling lane: `regs` holds its a0..a3, b0, b1 and c0..c3 (f32
/// bits); d replaces c. The lanes of the warp publish their registers, wait for each other, and
/// each computes its own part of `d = a·b + c` (products of 16-bit floats and of TF32 values
/// are exact in f64; the sum is taken in f64 and rounded once). A TF32 operand is its register's
/// f32 with the 13 low bits ignored, as the tensor cores read it.
fn emu_mma(kind: MmaKind, regs: *mut u32) {
    let st = STATE.with(|s| s.get());
    assert!(st.warps != 0, "mma in a kernel run without concurrent threads");
    // SAFETY: set by run_grid to a WarpExchange that outlives the block's threads.
    let ex = unsafe { &*(st.warps as *const WarpExchange) };
    let [tx, ty, tz] = [st.sreg[0], st.sreg[1], st.sreg[2]].map(|v| v as usize);
    let [bx, by] = [st.sreg[6], st.sreg[7]].map(|v| v as usize);
    let tid = tx + bx * (ty + by * tz);
    let (warp, lane) = (tid / 32, tid % 32);
    // SAFETY: the kernel passes its ten-register buffer.
    let mine: [u32; 10] = unsafe { std::ptr::read(regs as *const [u32; 10]) };
    assert!(
        ex.barriers[warp].n == 32,
        "mma needs a full warp: the block has {} threads",
        ex.regs.lock().unwrap_or_else(|e| e.into_inner()).len()
    );
    ex.regs.lock().unwrap_or_else(|e| e.into_inner())[tid] = mine;
    ex.barriers[warp].wait();
    let lanes: Vec<[u32; 10]> =
        ex.regs.lock().unwrap_or_else(|e| e.into_inner())[warp * 32..warp * 32 + 32].to_vec();
    // Every lane has read the warp's registers before any lane's next mma overwrites them.
    ex.barriers[warp].wait();
    let half = |reg: u32, i: usize| {
        let bits = if i.is_multiple_of(2) {
            reg & 0xffff
        } else {
            reg >> 16
        } as u16;
        match kind {
            MmaKind::Bf16 => f64::from(half::bf16::from_bits(bits)),
            MmaKind::F16 => f64::from(half::f16::from_bits(bits)),
            MmaKind::Tf32 => unreachable!("a tf32 register holds one value"),
        }
    };
    let tf32 = |reg: u32| f64::from(f32::from_bits(reg & 0xffff_e000));
    let (mut a, mut b) = ([[0f64; 16]; 16], [[0f64; 8]; 16]);
    for (l, r) in lanes.iter().enumerate() {
        if kind == MmaKind::Tf32 {
            for (i, reg) in r[..4].iter().enumerate() {
                let (row, col) = mma_tf32_a_element(l, i);
                a[row][col] = tf32(*reg);
            }
            for (i, reg) in r[4..6].iter().enumerate() {
                let (k, n) = mma_tf32_b_element(l, i);
                b[k][n] = tf32(*reg);
            }
            continue;
        }
        for i in 0..8 {
            let (row, col) = mma_a_element(l, i);
            a[row][col] = half(r[i / 2], i);
        }
        for i in 0..4 {
            let (k, n) = mma_b_element(l, i);
            b[k][n] = half(r[4 + i / 2], i);
        }
    }
    let mut d = [0u32; 4];
    for (i, out) in d.iter_mut().enumerate() {
        let (row, col) = mma_c_element(lane, i);
        let sum: f64 = (0..kind.k()).map(|k| a[row][k] * b[k][col]).sum();
        *out = ((sum + f64::from(f32::from_bits(mine[6 + i]))) as f32).to_bits();
    }
    // SAFETY: as above.
    unsafe { std::ptr::copy_nonoverlapping(d.as_ptr(), regs.add(6), 4) };
}

/// `cvt.f32.f16`: the f16 whose bits are the low 16 of `bits`, exactly.
extern "C" fn emu_f16_to_f32(bits: u32) -> f32 {
    half::f16::from_bits(bits as u16).to_f32()
}

/// `cvt.rn.f16.f32`: `v` to the nearest f16, ties to even (its bits, zero-extended).
extern "C" fn emu_f32_to_f16(v: f32) -> u32 {
    u32::from(half::f16::from_f32(v).to_bits())
}

// The runtime calls of library kernels, as runtime-stub/c/device.c answers them on the device.

thread_local! {
    static IN_TASKS: Cell<bool> = const { Cell::new(false) };
    static SCRATCH_STRIDE: Cell<i64> = const { Cell::new(0) };
}

fn block_threads() -> i32 {
    STATE.with(|s| s.get().sreg[Sreg::NtidX.code() as usize])
}

fn thread_index() -> i32 {
    STATE.with(|s| s.get().sreg[Sreg::TidX.code() as usize])
}

extern "C" fn emu_block_begin(stride: i64) {
    SCRATCH_STRIDE.with(|s| s.set(stride));
    IN_TASKS.with(|f| f.set(false));
    if block_threads() > 1 {
        emu_barrier();
    }
}

type TaskFn = unsafe extern "C" fn(*mut u8, i64, i64);

extern "C" fn emu_parallel_for(_ctx: *mut u8, task: TaskFn, data: *mut u8, n: i64) {
    let (tid, threads) = (thread_index() as i64, block_threads() as i64);
    if n <= 0 {
        return;
    }
    if threads == 1 || IN_TASKS.with(|f| f.get()) {
        for i in 0..n {
            // SAFETY: the micro-kernel's own task on its own job.
            unsafe { task(data, i, tid) };
        }
        return;
    }
    emu_barrier();
    IN_TASKS.with(|f| f.set(true));
    let mut i = tid;
    while i < n {
        // SAFETY: as above; the thread's own copy of the job.
        unsafe { task(data, i, tid) };
        i += threads;
    }
    emu_barrier();
    IN_TASKS.with(|f| f.set(false));
}

extern "C" fn emu_num_threads(_ctx: *mut u8) -> i64 {
    block_threads() as i64
}

extern "C" fn emu_thread_scratch(ctx: *mut u8, tid: i64) -> *mut u8 {
    // SAFETY: ctx is the frame; word 3 is the thread scratch, sized for the block.
    let base = unsafe { *(ctx as *const usize).add(3) };
    (base as i64 + tid * SCRATCH_STRIDE.with(|s| s.get())) as usize as *mut u8
}

extern "C" fn emu_set_error(_ctx: *mut u8, _fmt: *const u8) {}

/// `__syncthreads()` for one block. Times out (and panics) instead of hanging when a thread
/// returned early or skipped a barrier the others reached: on a GPU that is a bug too.
struct BlockBarrier {
    n: usize,
    state: Mutex<(usize, u64)>,
    cv: Condvar,
}

impl BlockBarrier {
    fn new(n: usize) -> BlockBarrier {
        BlockBarrier {
            n,
            state: Mutex::new((0, 0)),
            cv: Condvar::new(),
        }
    }

    fn wait(&self) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let gen = st.1;
        st.0 += 1;
        if st.0 == self.n {
            st.0 = 0;
            st.1 += 1;
            self.cv.notify_all();
            return;
        }
        while st.1 == gen {
            let (next, timeout) = self
                .cv
                .wait_timeout(st, Duration::from_secs(20))
                .unwrap_or_else(|e| e.into_inner());
            st = next;
            assert!(
                !(timeout.timed_out() && st.1 == gen),
                "barrier: {} of {} threads arrived (a thread exited or diverged)",
                st.0,
                self.n
            );
        }
    }
}

fn run_grid(entry: unsafe extern "C" fn(*mut u8), frame: usize, d: super::LaunchDims, barrier: bool) {
    let [gx, gy, gz] = d.grid.map(|x| x as i32);
    let [bx, by, bz] = d.block.map(|x| x as i32);
    let threads = (bx * by * bz) as usize;
    let mut shared = vec![0u128; (d.shared_bytes as usize).div_ceil(16).max(1)];
    let shared_len = shared.len();
    let shared = shared.as_mut_ptr() as usize;
    let sreg = move |t: usize, (cx, cy, cz): (i32, i32, i32)| {
        let t = t as i32;
        let (tx, ty, tz) = (t % bx, (t / bx) % by, t / (bx * by));
        [tx, ty, tz, cx, cy, cz, bx, by, bz, gx, gy, gz]
    };
    // Blocks one after another, in grid order, each starting with zeroed shared memory.
    let blocks =
        move || (0..gz).flat_map(move |cz| (0..gy).flat_map(move |cy| (0..gx).map(move |cx| (cx, cy, cz))));
    // SAFETY: `shared` holds `shared_len` u128s and outlives every use below.
    let clear_shared = move || unsafe { std::ptr::write_bytes(shared as *mut u128, 0, shared_len) };
    if !barrier {
        for block in blocks() {
            clear_shared();
            for t in 0..threads {
                STATE.with(|s| {
                    s.set(ThreadState {
                        sreg: sreg(t, block),
                        shared,
                        barrier: 0,
                        warps: 0,
                    })
                });
                // SAFETY: the frame and shared buffer outlive the call.
                unsafe { entry(frame as *mut u8) };
            }
        }
        return;
    }
    // The block's threads run concurrently, on OS threads started once per launch (starting
    // them per block dominated the suites' time): between blocks they meet at `between`, where
    // thread 0 clears the shared memory for the next block.
    let bar = BlockBarrier::new(threads);
    let bar_addr = &bar as *const BlockBarrier as usize;
    let warps = WarpExchange::new(threads);
    let warps_addr = &warps as *const WarpExchange as usize;
    let between = BlockBarrier::new(threads);
    std::thread::scope(|scope| {
        for t in 0..threads {
            let between = &between;
            std::thread::Builder::new()
                .stack_size(1 << 20)
                .spawn_scoped(scope, move || {
                    for block in blocks() {
                        STATE.with(|s| {
                            s.set(ThreadState {
                                sreg: sreg(t, block),
                                shared,
                                barrier: bar_addr,
                                warps: warps_addr,
                            })
                        });
                        // SAFETY: the frame, shared buffer and barriers outlive the scope.
                        unsafe { entry(frame as *mut u8) };
                        between.wait();
                        if t == 0 {
                            clear_shared();
                        }
                        between.wait();
                    }
                })
                .expect("spawning an emulated GPU thread");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Result;
    use crate::gen::llvm;
    use crate::kernel::KernelCommon;
    use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims, Sreg};
    use inkwell::IntPredicate;
    use kiln_ir::{Op, TensorType, Unary};

    /// Block b's threads rotate its `block` elements by one through shared memory:
    /// `y[b*n + t] = x[b*n + (t+1) % n]`. Exercises the special registers, the barrier and the
    /// shared memory of several blocks.
    struct Rotate {
        blocks: u32,
        block: u32,
    }

    impl KernelCommon for Rotate {
        fn describe(&self) -> String {
            "gpu test rotate".into()
        }
    }

    impl GpuKernel for Rotate {
        fn launch(&self) -> LaunchDims {
            LaunchDims {
                grid: [self.blocks, 1, 1],
                block: [self.block, 1, 1],
                shared_bytes: 4 * self.block,
            }
        }
        fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
            let (b, f32t, i32t) = (k.builder, k.cx.f32_type(), k.cx.i32_type());
            let tid = k.sreg(Sreg::TidX)?;
            let bid = k.sreg(Sreg::CtaidX)?;
            let ntid = k.sreg(Sreg::NtidX)?;
            let base = b.build_int_mul(bid, ntid, "base").map_err(llvm)?;
            let i = b.build_int_add(base, tid, "i").map_err(llvm)?;
            let x = k.input(0)?;
            let y = k.output(0)?;
            let smem = k.shared()?;
            let px = unsafe { b.build_gep(f32t, x, &[i], "px") }.map_err(llvm)?;
            let v = b.build_load(f32t, px, "v").map_err(llvm)?;
            let ps = unsafe { b.build_gep(f32t, smem, &[tid], "ps") }.map_err(llvm)?;
            b.build_store(ps, v).map_err(llvm)?;
            k.barrier()?;
            let t1 = b
                .build_int_add(tid, i32t.const_int(1, false), "t1")
                .map_err(llvm)?;
            let wrap = b
                .build_int_compare(IntPredicate::EQ, t1, ntid, "wrap")
                .map_err(llvm)?;
            let src = b
                .build_select(wrap, i32t.const_zero(), t1, "src")
                .map_err(llvm)?
                .into_int_value();
            let ps = unsafe { b.build_gep(f32t, smem, &[src], "ps2") }.map_err(llvm)?;
            let v = b.build_load(f32t, ps, "w").map_err(llvm)?;
            let py = unsafe { b.build_gep(f32t, y, &[i], "py") }.map_err(llvm)?;
            b.build_store(py, v).map_err(llvm)?;
            k.ret()
        }
    }

    #[test]
    fn harness_runs_blocks_with_barrier_and_shared_memory() {
        let (blocks, block) = (3u32, 37u32);
        let n = (blocks * block) as usize;
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[n]));
        let y = g.add("y", Op::Unary(Unary::Relu), vec![Some(x)], "y").unwrap();
        g.add_output("y", y);
        let target = TargetDesc::cuda(SM).unwrap();
        let mut plan = plan::build(&g, &target, false).unwrap();
        assert_eq!(plan.kernels.len(), 1);
        plan.kernels[0].imp = KernelImpl::Gpu(Box::new(Rotate { blocks, block }));
        let xs: Vec<f32> = (0..n).map(|i| i as f32 - 50.0).collect();
        let out = run_plan(&g, &plan, &target, &[Tensor::from_vec(vec![n], xs.clone())]).unwrap();
        let want: Vec<f32> = (0..n)
            .map(|i| {
                let (b, t) = (i / block as usize, i % block as usize);
                xs[b * block as usize + (t + 1) % block as usize]
            })
            .collect();
        compare("rotate", &out[0], &Tensor::from_vec(vec![n], want));
    }

    fn filled(shape: &[usize], seed: u64) -> Tensor {
        let v = crate::test_rng::TestRng::new(seed).vec(shape.iter().product());
        Tensor::from_vec(shape.to_vec(), v)
    }

    /// Library kernels listed as block-parallel, on 128 concurrent threads, match the
    /// reference: an int64 batched MatMul; a QLinearMatMul stays on one thread.
    #[test]
    fn library_kernels_run_block_parallel() {
        let mut g = Graph::new("t");
        let a = g.add_input("a", TensorType::fixed(DType::I64, &[3, 5, 7]));
        let b = g.add_input("b", TensorType::fixed(DType::I64, &[7, 4]));
        let ab = g.add("mm", Op::MatMul, vec![Some(a), Some(b)], "ab").unwrap();
        g.add_output("ab", ab);
        let qy = device::tests::one_thread_library_node(&mut g);
        g.add_output("qy", qy);
        let ints = |shape: &[usize], seed: i64| {
            let n: usize = shape.iter().product();
            Tensor::from_vec(
                shape.to_vec(),
                (0..n as i64).map(|i| (i * seed) % 11 - 5).collect::<Vec<i64>>(),
            )
        };
        let qa = Tensor::from_vec(vec![4, 6], (0..24).map(|i| (i * 37 % 256) as u8).collect());
        let inputs = vec![ints(&[3, 5, 7], 3), ints(&[7, 4], 7), qa];
        let kernels = check_graph(&g, &inputs);
        for symbol in ["matmul", "matmul_integer"] {
            assert!(
                kernels.iter().any(|k| *k == format!("kiln_uk_{symbol}")),
                "kiln_uk_{symbol} not among {kernels:?}"
            );
        }
        assert_eq!(device::library_threads("matmul_integer"), 1);
    }

    /// f64 operators the GPU generators leave to the library, sized for the parallel paths:
    /// elementwise (>= 65536 elements), layer normalization and convolution.
    #[test]
    fn library_kernels_run_block_parallel_f64() {
        let f64s = |shape: &[usize], seed: u64| {
            let t = filled(shape, seed);
            Tensor::from_vec(shape.to_vec(), t.to_f64_vec())
        };
        let mut g = Graph::new("t");
        let a = g.add_input("a", TensorType::fixed(DType::F64, &[300, 256]));
        let b = g.add_input("b", TensorType::fixed(DType::F64, &[256]));
        let s = g
            .add(
                "prelu",
                // Generated for f32 only: f64 runs the library kernel.
                Op::Binary(kiln_ir::Binary::PRelu),
                vec![Some(a), Some(b)],
                "s",
            )
            .unwrap();
        g.add_output("s", s);
        let x = g.add_input("x", TensorType::fixed(DType::F64, &[64, 33]));
        let ln_scale = g.add_const("ln_scale", f64s(&[33], 5));
        let ln_bias = g.add_const("ln_bias", f64s(&[33], 6));
        let sm = g
            .add(
                "ln",
                Op::LayerNorm {
                    axis: -1,
                    epsilon: 1e-5,
                    stash_type: DType::F32,
                },
                vec![Some(x), Some(ln_scale), Some(ln_bias)],
                "sm",
            )
            .unwrap();
        g.add_output("sm", sm);
        let img = g.add_input("img", TensorType::fixed(DType::F64, &[2, 6, 9, 9]));
        let w = g.add_const("w", f64s(&[4, 6, 3, 3], 7));
        let conv = Op::Conv(kiln_ir::ConvAttrs {
            kernel_shape: vec![3, 3],
            strides: vec![1, 1],
            pads: vec![1, 1, 1, 1],
            dilations: vec![1, 1],
            group: 1,
            auto_pad: kiln_ir::AutoPad::NotSet,
            channels_last: false,
        });
        let c = g.add("conv", conv, vec![Some(img), Some(w)], "c").unwrap();
        let gp = g
            .add(
                "gp",
                Op::GlobalPool(kiln_ir::PoolKind::Average {
                    count_include_pad: false,
                }),
                vec![Some(c)],
                "gp",
            )
            .unwrap();
        g.add_output("gp", gp);
        let inputs = vec![
            f64s(&[300, 256], 1),
            f64s(&[256], 2),
            f64s(&[64, 33], 3),
            f64s(&[2, 6, 9, 9], 4),
        ];
        let kernels = check_graph(&g, &inputs);
        for symbol in ["ew_binary", "layernorm", "conv"] {
            assert!(
                kernels.iter().any(|k| *k == format!("kiln_uk_{symbol}")),
                "kiln_uk_{symbol} not among {kernels:?}"
            );
            assert_eq!(device::library_threads(symbol), 128);
        }
    }
}
