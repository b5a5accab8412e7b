//! Runs one generated kernel on this machine: emits and optimizes it for the host, loads it
//! through MCJIT with a small stand-in runtime (`parallel_for` on a spinning pool of std
//! threads, per-thread scratch) and calls it. `--mode max-autotune` times candidate kernels
//! with it (`gemm::tuning`); the kernel tests compare its results with `kiln_ir`'s evaluator.

use super::{GeneratedKernel, KernelBuilder};
use crate::node::NodeInfo;
use crate::target::TargetDesc;
use inkwell::context::Context;
use inkwell::passes::PassBuilderOptions;
use inkwell::OptimizationLevel;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};

/// The most timed calls of one `run`, however short the kernel.
const MAX_TIMED_CALLS: usize = 1000;

struct JitCtx {
    threads: usize,
    scratch: Vec<*mut u8>,
    pool: Pool,
}

type TaskFn = unsafe extern "C" fn(*mut c_void, i64, i64);

/// A persistent spinning pool, like the runtime's: workers wait for a new generation, then
/// take task indices from a shared counter.
#[derive(Default)]
struct Pool {
    gen: AtomicUsize,
    done: AtomicUsize,
    next: AtomicI64,
    n: AtomicI64,
    f: AtomicUsize,
    data: AtomicUsize,
    stop: AtomicBool,
}

impl Pool {
    fn work(&self, tid: usize) {
        let n = self.n.load(Ordering::Acquire);
        // SAFETY: `f` was stored from a TaskFn by rt_parallel_for before the generation bump.
        let f: TaskFn = unsafe { std::mem::transmute::<usize, TaskFn>(self.f.load(Ordering::Acquire)) };
        let data = self.data.load(Ordering::Acquire) as *mut c_void;
        loop {
            let i = self.next.fetch_add(1, Ordering::AcqRel);
            if i >= n {
                break;
            }
            // SAFETY: the task function and data come from the kernel that called parallel_for.
            unsafe { f(data, i, tid as i64) };
        }
    }

    fn worker(&self, tid: usize) {
        let mut seen = 0;
        loop {
            let mut spins = 0u32;
            loop {
                if self.stop.load(Ordering::Acquire) {
                    return;
                }
                let g = self.gen.load(Ordering::Acquire);
                if g != seen {
                    seen = g;
                    break;
                }
                spins += 1;
                if spins > 1000 {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
            self.work(tid);
            self.done.fetch_add(1, Ordering::AcqRel);
        }
    }
}

unsafe extern "C" fn rt_parallel_for(ctx: *mut c_void, f: TaskFn, data: *mut c_void, n: i64) {
    // SAFETY: `run` passes its own JitCtx as the kernel's ctx.
    let cx = unsafe { &*(ctx as *const JitCtx) };
    let p = &cx.pool;
    p.f.store(f as usize, Ordering::Release);
    p.data.store(data as usize, Ordering::Release);
    p.n.store(n, Ordering::Release);
    p.next.store(0, Ordering::Release);
    p.done.store(0, Ordering::Release);
    p.gen.fetch_add(1, Ordering::AcqRel);
    p.work(0);
    while p.done.load(Ordering::Acquire) < cx.threads - 1 {
        std::hint::spin_loop();
    }
}

unsafe extern "C" fn rt_thread_scratch(ctx: *mut c_void, tid: i64) -> *mut c_void {
    // SAFETY: `run` passes its own JitCtx as the kernel's ctx.
    let cx = unsafe { &*(ctx as *const JitCtx) };
    cx.scratch[tid as usize] as *mut c_void
}

unsafe extern "C" fn rt_set_error(_ctx: *mut c_void, _fmt: *const c_void) {}

/// A kernel's result and the fastest of its timed calls.
pub(crate) struct Run {
    /// What the kernel tests check; tuning only times.
    #[cfg_attr(not(test), allow(dead_code))]
    pub out: Vec<f32>,
    /// Seconds; infinite when `reps` was 0.
    pub best_secs: f64,
}

/// Compiles `kernel` for `node` (the target must be this machine) and calls it once, then
/// again, timed, at least `reps` times and until `min_secs` have passed (at most
/// `MAX_TIMED_CALLS`), on `threads` threads. `inputs` has one slice per kernel input (None
/// for an input the kernel does not read); `out_len` f32 values of output. With `flush`, a
/// buffer larger than the caches is written before every timed call, so the kernel reads
/// its weights from memory as it does inside a model whose weights outgrow the caches.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    kernel: &dyn GeneratedKernel,
    node: &NodeInfo,
    target: &TargetDesc,
    inputs: &[Option<Vec<f32>>],
    out_len: usize,
    threads: usize,
    reps: usize,
    min_secs: f64,
    mut flush: Option<&mut [u8]>,
) -> Result<Run, String> {
    let threads = threads.max(1);
    let cx = Context::create();
    let module = cx.create_module("kiln_jit");
    let tm = target
        .target_machine(OptimizationLevel::Aggressive)
        .map_err(|e| e.to_string())?;
    module.set_triple(&tm.get_triple());
    module.set_data_layout(&tm.get_target_data().get_data_layout());
    let ptr = cx.ptr_type(inkwell::AddressSpace::default());
    let fty = cx.i32_type().fn_type(&[ptr.into(), ptr.into()], false);
    let f = module.add_function("kern", fty, None);
    crate::llvm::set_kernel_attributes(&cx, f, target);
    let builder = cx.create_builder();
    let entry = cx.append_basic_block(f, "entry");
    builder.position_at_end(entry);
    let packed = kernel.packed_constants();
    let kb = KernelBuilder {
        cx: &cx,
        module: &module,
        builder: &builder,
        function: f,
        target,
        node,
        n_inputs: node.n_inputs(),
        n_outputs: 1,
        n_packed: packed.len(),
    };
    kernel.emit(&kb).map_err(|e| e.to_string())?;
    crate::llvm::verify(&module).map_err(|e| e.to_string())?;
    module
        .run_passes("default<O3>", &tm, PassBuilderOptions::create())
        .map_err(|e| e.to_string())?;
    if let Some(path) = std::env::var_os("KILN_DUMP_ASM") {
        if let Ok(asm) = tm.write_to_memory_buffer(&module, inkwell::targets::FileType::Assembly) {
            let _ = std::fs::write(path, asm.as_slice());
        }
    }
    let ee = module
        .create_jit_execution_engine(OptimizationLevel::Aggressive)
        .map_err(|e| e.to_string())?;
    for (name, addr) in [
        ("kiln_rt_parallel_for", rt_parallel_for as *const () as usize),
        ("kiln_rt_thread_scratch", rt_thread_scratch as *const () as usize),
        ("kiln_rt_set_error", rt_set_error as *const () as usize),
    ] {
        if let Some(g) = module.get_function(name) {
            ee.add_global_mapping(&g, addr);
        }
    }
    let scratch_bytes = kernel.scratch().per_thread_bytes.max(64) as usize;
    let layout = std::alloc::Layout::from_size_align(scratch_bytes, 64).map_err(|e| e.to_string())?;
    // SAFETY: non-zero size; freed below with the same layout.
    let scratch: Vec<*mut u8> = (0..threads)
        .map(|_| unsafe { std::alloc::alloc(layout) })
        .collect();
    if scratch.iter().any(|p| p.is_null()) {
        for p in scratch.iter().filter(|p| !p.is_null()) {
            // SAFETY: allocated above with `layout`.
            unsafe { std::alloc::dealloc(*p, layout) };
        }
        return Err(format!("cannot allocate {scratch_bytes} bytes of scratch"));
    }
    let jcx = JitCtx {
        threads,
        scratch,
        pool: Pool::default(),
    };
    // The kernel's shared scratch, poisoned so that reading what was never written shows.
    let mut shared = vec![f32::NAN; (kernel.scratch().shared_bytes as usize).div_ceil(4)];
    let mut out = vec![f32::NAN; out_len];
    let mut args: Vec<*mut c_void> = inputs
        .iter()
        .map(|x| {
            x.as_ref()
                .map_or(std::ptr::null_mut(), |v| v.as_ptr() as *mut c_void)
        })
        .collect();
    args.push(out.as_mut_ptr() as *mut c_void);
    args.extend(packed.iter().map(|p| p.bytes.as_ptr() as *mut c_void));
    if !shared.is_empty() {
        args.push(shared.as_mut_ptr() as *mut c_void);
    }
    type Kern = unsafe extern "C" fn(*mut c_void, *const *mut c_void) -> i32;
    // SAFETY: "kern" has the kernel signature; args matches the layout the kernel was built for.
    let kf = unsafe { ee.get_function::<Kern>("kern") }.map_err(|e| e.to_string())?;
    let mut best_secs = f64::INFINITY;
    let mut status = 0;
    std::thread::scope(|sc| {
        for tid in 1..threads {
            let pool = &jcx.pool;
            sc.spawn(move || pool.worker(tid));
        }
        let call = || {
            // SAFETY: as above; the kernel reads only the buffers in `args`, sized for it.
            unsafe { kf.call(&jcx as *const JitCtx as *mut c_void, args.as_ptr()) }
        };
        status = call();
        if status == 0 {
            let start = std::time::Instant::now();
            let mut calls = 0;
            while calls < reps || (start.elapsed().as_secs_f64() < min_secs && calls < MAX_TIMED_CALLS) {
                if let Some(f) = flush.as_deref_mut() {
                    f.fill(calls as u8);
                    std::hint::black_box(&f);
                }
                let t0 = std::time::Instant::now();
                call();
                best_secs = best_secs.min(t0.elapsed().as_secs_f64());
                calls += 1;
            }
        }
        jcx.pool.stop.store(true, Ordering::Release);
    });
    for p in &jcx.scratch {
        // SAFETY: allocated above with `layout`.
        unsafe { std::alloc::dealloc(*p, layout) };
    }
    match status {
        0 => Ok(Run { out, best_secs }),
        s => Err(format!("the kernel returned {s}")),
    }
}
