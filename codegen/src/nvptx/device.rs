//! The device module of a CUDA model: the kernel bodies (emitted by the same code as the CPU's,
//! for the nvptx64 triple), one PTX entry per kernel that resolves the kernel's tensors from the
//! frame and calls the body, the device runtime (`runtime-stub/c/device.c`) and, when a library
//! kernel needs math functions, CUDA's libdevice. Optimized with the NVPTX target machine and
//! printed as PTX.

use super::kernel::load_ptr;
use super::{frame, libdevice, DeviceCode, GpuBuilder, GpuKernel, Launch, LaunchDims, Mode};
use crate::api::Api;
use crate::emit::call::{call_and_branch_on_status, store_arg_slots};
use crate::emit::{self, ModuleParts};
use crate::error::{CodegenError, Result};
use crate::gen::llvm;
use crate::kernel::Storage;
use crate::node::NodeInfo;
use crate::plan::kernel::{Kernel, KernelImpl};
use crate::plan::Plan;
use crate::target::TargetDesc;
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::FileType;
use inkwell::values::{FunctionValue, PointerValue};
use inkwell::{AddressSpace, OptimizationLevel};
use kiln_ir::Graph;

/// Generates the PTX of every kernel in `plan` for `target` (a [`TargetDesc::cuda`]).
pub fn build(graph: &Graph, plan: &Plan, target: &TargetDesc, model_name: &str) -> Result<DeviceCode> {
    let sm = target
        .cuda_sm()
        .ok_or_else(|| CodegenError::internal(format!("not a CUDA target: {}", target.cpu)))?;
    let cx = Context::create();
    let module = cx.create_module(model_name);
    let tm = target.target_machine(OptimizationLevel::Aggressive)?;
    module.set_triple(&tm.get_triple());
    module.set_data_layout(&tm.get_target_data().get_data_layout());
    let api = Api {
        prefix: crate::header::c_ident(model_name),
        profile: false,
        weights_file: None,
        cuda: false,
    };
    let parts = ModuleParts {
        graph,
        plan,
        target,
        api: &api,
        model_name,
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
    let bodies = emit::kernels::kernel_functions(&cx, &module, &parts, &mut |_, _| {})?;
    let builder = cx.create_builder();
    let mut launches = vec![];
    let n_inputs = graph.inputs().len();
    for (i, (k, body)) in plan.kernels.iter().zip(&bodies).enumerate() {
        let entry = format!("kiln_k{i}");
        let launch = match &k.imp {
            KernelImpl::Gpu(g) => {
                gpu_entry(
                    &cx,
                    &module,
                    &builder,
                    &entry,
                    k,
                    g.as_ref(),
                    graph,
                    plan,
                    target,
                    Mode::Device,
                    i,
                )?;
                // SAFETY: the placeholder body of a GPU kernel is never called.
                unsafe { body.delete() };
                g.launch()
            }
            _ => {
                library_entry(&cx, &module, &builder, &entry, i, k, plan, *body, n_inputs)?;
                let threads = match &k.imp {
                    KernelImpl::Ukernel(c) => library_threads(c.symbol),
                    _ => 1,
                };
                LaunchDims {
                    grid: [1, 1, 1],
                    block: [threads, 1, 1],
                    shared_bytes: 0,
                }
            }
        };
        launches.push(Launch {
            entry,
            grid: launch.grid,
            block: launch.block,
            shared_bytes: launch.shared_bytes,
        });
    }
    crate::llvm::link_units(&cx, &module, target, "uk_")?;
    crate::llvm::link_units(&cx, &module, target, "rt_device")?;
    // Each library call has constant descriptors (dtypes, shapes, attributes): inlined, its
    // generic dtype switches fold away. Without this the NVPTX inliner keeps the whole generic
    // function, whose PTX is large and slow to JIT.
    inline_library_calls(&cx, &module);
    let entries: Vec<String> = launches.iter().map(|l| l.entry.clone()).collect();
    let globaldce = || {
        crate::llvm::internalize(&module, &entries);
        module
            .run_passes("globaldce", &tm, PassBuilderOptions::create())
            .map_err(|e| CodegenError::internal(format!("LLVM optimization: {e}")))
    };
    // Only the library functions this model calls decide whether libdevice is needed.
    globaldce()?;
    let uses_libdevice = libdevice::lower_math(&cx, &module)?;
    if uses_libdevice {
        globaldce()?;
    }
    crate::llvm::retarget_all(&cx, &module, target);
    crate::llvm::verify(&module)?;
    module
        .run_passes("default<O3>", &tm, PassBuilderOptions::create())
        .map_err(|e| CodegenError::internal(format!("LLVM optimization: {e}")))?;
    crate::llvm::verify(&module)?;
    let ptx = tm
        .write_to_memory_buffer(&module, FileType::Assembly)
        .map_err(|e| CodegenError::internal(format!("LLVM NVPTX code generation: {e}")))?;
    let ptx =
        String::from_utf8(ptx.as_slice().to_vec()).map_err(|_| CodegenError::internal("PTX is not UTF-8"))?;
    Ok(DeviceCode {
        ptx,
        sm,
        launches,
        uses_libdevice,
    })
}

/// Marks `f` as a kernel entry (the `nvvm.annotations` LLVM 19's NVPTX backend reads).
pub(crate) fn mark_kernel<'ctx>(
    cx: &'ctx Context,
    module: &Module<'ctx>,
    f: FunctionValue<'ctx>,
) -> Result<()> {
    let md = cx.metadata_node(&[
        f.as_global_value().as_pointer_value().into(),
        cx.metadata_string("kernel").into(),
        cx.i32_type().const_int(1, false).into(),
    ]);
    module
        .add_global_metadata("nvvm.annotations", &md)
        .map_err(|e| CodegenError::internal(format!("nvvm.annotations: {e}")))
}

/// `void entry(ptr frame)` of a generated GPU kernel: resolves its tensors from the frame and
/// lets the generator emit the body. `mode` Emulated builds the same entry for the host CPU
/// (tests).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gpu_entry<'ctx>(
    cx: &'ctx Context,
    module: &Module<'ctx>,
    b: &Builder<'ctx>,
    name: &str,
    k: &Kernel,
    g: &dyn GpuKernel,
    graph: &Graph,
    plan: &Plan,
    target: &TargetDesc,
    mode: Mode,
    kernel_index: usize,
) -> Result<FunctionValue<'ctx>> {
    let ptr = cx.ptr_type(AddressSpace::default());
    let f = module.add_function(
        name,
        cx.void_type().fn_type(&[ptr.into()], false),
        Some(Linkage::External),
    );
    if mode == Mode::Device {
        mark_kernel(cx, module, f)?;
    }
    crate::llvm::set_kernel_attributes(cx, f, target);
    b.position_at_end(cx.append_basic_block(f, "entry"));
    let frame = f.get_nth_param(0).expect("frame").into_pointer_value();
    let mut slots = vec![];
    for s in plan.arg_slots(k)? {
        slots.push(match s {
            Some(s) => Some(resolve(cx, b, frame, s, graph.inputs().len())?),
            None => None,
        });
    }
    let mut info = NodeInfo::new(graph, k.node);
    if let Some((slot, v)) = k.extra {
        info = info.with_extra(slot, v);
    }
    let gb = GpuBuilder {
        cx,
        module,
        builder: b,
        function: f,
        target,
        node: &info,
        mode,
        slots,
        n_inputs: k.inputs.len(),
        n_outputs: k.outputs.len(),
        n_packed: k.packed.len(),
        kernel_index,
    };
    g.emit(&gb)?;
    Ok(f)
}

/// Threads of a block-parallel library kernel (`KILN_GPU_LIBRARY_THREADS` in kiln_cuda.h: the
/// host sizes the thread scratch by it).
const LIBRARY_THREADS: u32 = 128;

/// Whether micro-kernel `kiln_uk_{symbol}` may run block-parallel (runtime-stub/c/device.c):
/// its serial code, run by every thread of the block, only computes its job and writes values
/// that do not depend on how many threads wrote them before (no in-place update), and the
/// work is in its `kiln_rt_parallel_for` tasks. Each was read for that; a micro-kernel not
/// listed runs on one thread, which is always correct.
fn block_parallel(symbol: &str) -> bool {
    matches!(
        symbol,
        "ew_unary"
            | "ew_binary"
            | "ew_cast"
            | "ew_clip"
            | "ew_where"
            | "copy"
            | "pool"
            | "pool_nhwc"
            | "global_pool"
            | "conv"
            | "conv_transpose"
            | "matmul"
            | "einsum"
            | "det"
            | "attention"
            | "attention_f32"
            | "reduce"
            | "softmax"
            | "layernorm"
            | "batchnorm"
            | "groupnorm"
    )
}

/// The block size micro-kernel `kiln_uk_{symbol}` is launched with on the device.
pub(crate) fn library_threads(symbol: &str) -> u32 {
    if block_parallel(symbol) {
        LIBRARY_THREADS
    } else {
        1
    }
}

/// `void entry(ptr frame)`: builds the `args` array of kernel `i`'s body from the frame, calls
/// it, and records a failure in the frame's error slot.
#[allow(clippy::too_many_arguments)]
pub(crate) fn library_entry<'ctx>(
    cx: &'ctx Context,
    module: &Module<'ctx>,
    b: &Builder<'ctx>,
    name: &str,
    i: usize,
    k: &Kernel,
    plan: &Plan,
    body: FunctionValue<'ctx>,
    n_inputs: usize,
) -> Result<()> {
    let ptr = cx.ptr_type(AddressSpace::default());
    let (i32t, i64t) = (cx.i32_type(), cx.i64_type());
    let f = module.add_function(
        name,
        cx.void_type().fn_type(&[ptr.into()], false),
        Some(Linkage::External),
    );
    mark_kernel(cx, module, f)?;
    b.position_at_end(cx.append_basic_block(f, "entry"));
    let frame = f.get_nth_param(0).expect("frame").into_pointer_value();
    // Block-wide runtime state first (device.c): shared memory starts undefined.
    let begin = module.get_function("kiln_rt_block_begin").unwrap_or_else(|| {
        module.add_function(
            "kiln_rt_block_begin",
            cx.void_type().fn_type(&[i64t.into()], false),
            Some(Linkage::External),
        )
    });
    let stride = plan.thread_scratch_bytes.div_ceil(64) * 64;
    b.build_call(begin, &[i64t.const_int(stride, false).into()], "")
        .map_err(llvm)?;
    let slots = plan.arg_slots(k)?;
    let args = b
        .build_array_alloca(ptr, i64t.const_int(slots.len().max(1) as u64, false), "args")
        .map_err(llvm)?;
    store_arg_slots(cx, b, args, &slots, |s| resolve(cx, b, frame, s, n_inputs))?;
    let (rc, done_bb) = call_and_branch_on_status(
        cx,
        b,
        f,
        body,
        &[frame.into(), args.into()],
        "kernel",
        "fail",
        "done",
    )?;
    let error = load_ptr(cx, b, frame, frame::ERROR)?;
    b.build_store(error, i32t.const_int(i as u64 + 1, false))
        .map_err(llvm)?;
    let code =
        unsafe { b.build_in_bounds_gep(i32t, error, &[i64t.const_int(1, false)], "code") }.map_err(llvm)?;
    b.build_store(code, rc).map_err(llvm)?;
    b.build_unconditional_branch(done_bb).map_err(llvm)?;
    b.position_at_end(done_bb);
    b.build_return(None).map_err(llvm)?;
    Ok(())
}

/// The device address of a value: a frame base plus a constant offset.
pub(crate) fn resolve<'ctx>(
    cx: &'ctx Context,
    b: &Builder<'ctx>,
    frame_ptr: PointerValue<'ctx>,
    s: Storage,
    n_inputs: usize,
) -> Result<PointerValue<'ctx>> {
    let i64t = cx.i64_type();
    let (base, off) = match s {
        Storage::Arena(off) => (load_ptr(cx, b, frame_ptr, frame::ARENA)?, off),
        Storage::Weights(off) => (load_ptr(cx, b, frame_ptr, frame::WEIGHTS)?, off),
        Storage::Input(j) => (load_ptr(cx, b, frame_ptr, frame::IO + 8 * j as u64)?, 0),
        // Outputs follow the inputs in io[].
        Storage::Output(j) => (
            load_ptr(cx, b, frame_ptr, frame::IO + 8 * (n_inputs + j) as u64)?,
            0,
        ),
    };
    if off == 0 {
        return Ok(base);
    }
    unsafe { b.build_in_bounds_gep(cx.i8_type(), base, &[i64t.const_int(off, false)], "p") }.map_err(llvm)
}

/// Marks the library's kernel functions `alwaysinline`.
fn inline_library_calls<'ctx>(cx: &'ctx Context, module: &Module<'ctx>) {
    use inkwell::attributes::{Attribute, AttributeLoc};
    let always = Attribute::get_named_enum_kind_id("alwaysinline");
    let never = Attribute::get_named_enum_kind_id("noinline");
    let mut f = module.get_first_function();
    while let Some(func) = f {
        f = func.get_next_function();
        if func.count_basic_blocks() > 0 && func.get_name().to_string_lossy().starts_with("kiln_uk_") {
            func.remove_enum_attribute(AttributeLoc::Function, never);
            func.add_attribute(AttributeLoc::Function, cx.create_enum_attribute(always, 0));
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::plan;
    use kiln_ir::{DType, Op, Tensor, TensorType};

    #[test]
    fn library_thread_count_matches_the_runtime_header() {
        let header = include_str!("../../../runtime-stub/c/kiln_cuda.h");
        assert!(
            header.contains(&format!("#define KILN_GPU_LIBRARY_THREADS {LIBRARY_THREADS}\n")),
            "kiln_cuda.h's KILN_GPU_LIBRARY_THREADS differs from LIBRARY_THREADS"
        );
    }

    #[test]
    fn storage_codes_match_the_runtime_header() {
        let header = include_str!("../../../runtime-stub/c/kiln_cuda.h");
        for (s, name) in [
            (Storage::Input(0), "KILN_CUDA_INPUT"),
            (Storage::Output(0), "KILN_CUDA_OUTPUT"),
            (Storage::Arena(0), "KILN_CUDA_ARENA"),
            (Storage::Weights(0), "KILN_CUDA_WEIGHTS"),
        ] {
            let code = super::super::storage_code(s).0;
            assert!(
                header.contains(&format!("  {name} = {code},")),
                "kiln_cuda.h's {name} differs from storage_code's {code}"
            );
        }
    }

    /// Adds a node that runs as a library kernel on one GPU thread: a QLinearMatMul with a
    /// scale per row of A (`[M, 1]`), which the integer GPU kernel does not take and whose
    /// micro-kernel (`matmul_integer`) is not block-parallel. Its run-time input is "qa", u8
    /// `[4, 6]`. Returns its output.
    pub(crate) fn one_thread_library_node(g: &mut Graph) -> kiln_ir::ValueId {
        let qa = g.add_input("qa", TensorType::fixed(DType::U8, &[4, 6]));
        let sa = g.add_const(
            "sa",
            Tensor::from_vec(vec![4, 1], vec![0.02f32, 0.03, 0.05, 0.07]),
        );
        let za = g.add_const("za", Tensor::scalar(120u8));
        let qb = g.add_const(
            "qb",
            Tensor::from_vec(vec![6, 3], (0..18).map(|i| (i * 13 % 256) as u8).collect()),
        );
        let sb = g.add_const("sb", Tensor::scalar(0.011f32));
        let zb = g.add_const("zb", Tensor::scalar(100u8));
        let sy = g.add_const("sy", Tensor::scalar(0.4f32));
        let zy = g.add_const("zy", Tensor::scalar(128u8));
        let params = [qa, sa, za, qb, sb, zb, sy, zy].map(Some).to_vec();
        g.add("qmm", Op::Quant(kiln_ir::QuantOp::QLinearMatMul), params, "qy")
            .unwrap()
    }

    /// MatMul's micro-kernel is listed as block-parallel, matmul_integer's is not: one launch
    /// of a block of LIBRARY_THREADS, one of a single thread, each entry starting the block
    /// state. (Neither integer product has a GPU generator.)
    #[test]
    fn library_kernels_launch_block_parallel_only_when_listed() {
        let mut g = Graph::new("t");
        let a = g.add_input("a", TensorType::fixed(DType::I64, &[8, 16]));
        let b = g.add_input("b", TensorType::fixed(DType::I64, &[16, 4]));
        let e = g.add("mm", Op::MatMul, vec![Some(a), Some(b)], "e").unwrap();
        g.add_output("e", e);
        let y = one_thread_library_node(&mut g);
        g.add_output("y", y);
        let target = TargetDesc::cuda(80).unwrap();
        let plan = plan::build(&g, &target, false).unwrap();
        let code = build(&g, &plan, &target, "t").unwrap();
        let blocks: Vec<(String, [u32; 3])> = plan
            .kernels
            .iter()
            .zip(&code.launches)
            .map(|(k, l)| (k.op_name.to_string(), l.block))
            .collect();
        assert_eq!(
            blocks,
            vec![
                ("MatMul".to_string(), [LIBRARY_THREADS, 1, 1]),
                ("QLinearMatMul".to_string(), [1, 1, 1])
            ]
        );
        assert!(
            code.ptx.contains("barrier.sync 0;"),
            "the block-parallel loop's barrier"
        );
    }
}
