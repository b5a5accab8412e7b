//! Kernels generated directly as LLVM IR (the hot operators: GEMM and convolution micro-kernels,
//! elementwise loops). Each generator decides in `lower` whether it handles a node, and then
//! emits the body of the kernel function through a [`KernelBuilder`].
//!
//! Every kernel is an LLVM function `i32 kernel(ptr ctx, ptr args)`: `ctx` is the runtime context
//! (`kiln_ctx*`), `args` an array of pointers laid out as
//! `[inputs..., outputs..., packed constants..., shared scratch]` (absent optional inputs are
//! null). The function returns 0, or non-zero after `kiln_rt_set_error`.

pub(crate) mod activation;
pub mod conv;
pub mod conv_nhwc;
pub mod dwconv;
pub mod dwconv_nhwc;
pub mod elementwise;
pub(crate) mod emit;
pub mod gemm;
pub(crate) mod jit;
pub mod products;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod testing_int8;
#[cfg(test)]
mod testing_nibbles;
pub(crate) mod vmath;
pub mod winograd;

use crate::error::{CodegenError, Result};
use crate::kernel::{KernelCommon, Scratch};
use crate::node::NodeInfo;
use crate::target::TargetDesc;
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::values::{FunctionValue, IntValue, PointerValue};
use inkwell::AddressSpace;

/// A CPU kernel: what the planner asks of every generated kernel ([`KernelCommon`]: its
/// description, e.g. `gemm 6x16 avx2 M=64 N=3136 K=576`, the constants it reads packed after
/// the outputs in `args`, the inputs it reads), and what only CPU kernels have.
pub trait GeneratedKernel: KernelCommon {
    /// Whether the kernel rounds input `i` to bf16 (to nearest even) as it reads it, so it
    /// may read the f32 value behind the autocast's `Cast<f32>(Cast<bf16>(x))` instead of the
    /// pair's result (`bf16_rounding`).
    fn rounds_input_to_bf16(&self, i: usize) -> bool {
        let _ = i;
        false
    }

    /// Whether input `i`, which the kernel rounds to bf16 as it reads it
    /// ([`Self::rounds_input_to_bf16`]), may be given as bf16 instead of f32 (`read_bf16`):
    /// the rounding then has nothing left to do, and the input is half the bytes.
    fn can_read_bf16(&self, i: usize) -> bool {
        let _ = i;
        false
    }

    /// Reads input `i` as bf16 (only where [`Self::can_read_bf16`]).
    fn read_bf16(&mut self, i: usize) {
        let _ = i;
        unreachable!("read_bf16 on a kernel that reads no bf16 input")
    }

    /// Whether the kernel can store its (one) output as bf16, rounded to nearest even
    /// (`store_bf16`), for readers that round it to bf16 anyway (`bf16_rounding::store_bf16`).
    fn can_store_bf16(&self) -> bool {
        false
    }

    /// Stores the output as bf16 (only where [`Self::can_store_bf16`]).
    fn store_bf16(&mut self) {
        unreachable!("store_bf16 on a kernel that stores no bf16 output")
    }

    /// Whether the kernel computes bf16 dot products in hardware (`vdpbf16ps`), for the
    /// compile summary: bf16 operands on f32 kernels give bf16 accuracy but no speed-up.
    fn bf16_dot_products(&self) -> bool {
        false
    }

    /// Whether the kernel computes integer dot products in hardware (`vpdpbusd`): what a
    /// portable artifact's avx512_vnni variant is for.
    fn int8_dot_products(&self) -> bool {
        false
    }

    fn scratch(&self) -> Scratch {
        Scratch::default()
    }

    /// Emits the kernel's body. The builder is positioned in the entry block of `k.function`;
    /// the body must end every path with `ret i32`.
    fn emit(&self, k: &KernelBuilder<'_, '_>) -> Result<()>;
}

/// Ceiling division of positive i64 values.
pub(crate) fn cdiv(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

/// What a generator needs to emit one kernel function.
pub struct KernelBuilder<'a, 'ctx> {
    pub cx: &'ctx Context,
    pub module: &'a Module<'ctx>,
    pub builder: &'a Builder<'ctx>,
    pub function: FunctionValue<'ctx>,
    pub target: &'a TargetDesc,
    pub node: &'a NodeInfo<'a>,
    pub n_inputs: usize,
    pub n_outputs: usize,
    pub n_packed: usize,
}

impl<'a, 'ctx> KernelBuilder<'a, 'ctx> {
    pub fn ptr_type(&self) -> inkwell::types::PointerType<'ctx> {
        self.cx.ptr_type(AddressSpace::default())
    }

    /// The runtime context argument.
    pub fn ctx(&self) -> PointerValue<'ctx> {
        self.function
            .get_nth_param(0)
            .expect("kernel has ctx")
            .into_pointer_value()
    }

    /// The kernel's argument array (`args`).
    pub fn args(&self) -> PointerValue<'ctx> {
        self.function
            .get_nth_param(1)
            .expect("kernel has args")
            .into_pointer_value()
    }

    /// Loads `args[slot]`.
    pub fn arg(&self, slot: usize) -> Result<PointerValue<'ctx>> {
        let b = self.builder;
        let idx = self.cx.i64_type().const_int(slot as u64, false);
        // SAFETY (of the IR): `slot` is within the args array the caller built for this kernel.
        let p =
            unsafe { b.build_in_bounds_gep(self.ptr_type(), self.args(), &[idx], "argp") }.map_err(llvm)?;
        Ok(b.build_load(self.ptr_type(), p, &format!("arg{slot}"))
            .map_err(llvm)?
            .into_pointer_value())
    }

    pub fn input(&self, i: usize) -> Result<PointerValue<'ctx>> {
        self.arg(i)
    }

    pub fn output(&self, i: usize) -> Result<PointerValue<'ctx>> {
        self.arg(self.n_inputs + i)
    }

    pub fn packed(&self, i: usize) -> Result<PointerValue<'ctx>> {
        self.arg(self.n_inputs + self.n_outputs + i)
    }

    /// The kernel's shared scratch buffer (only if `scratch().shared_bytes > 0`).
    pub fn shared_scratch(&self) -> Result<PointerValue<'ctx>> {
        self.arg(self.n_inputs + self.n_outputs + self.n_packed)
    }

    /// Declares (once) a function of the runtime ABI (`kiln_rt.h`).
    pub fn runtime_fn(&self, name: &str) -> FunctionValue<'ctx> {
        runtime_fn(self.cx, self.module, name)
    }

    /// A new internal function `void task(ptr data, i64 i, i64 tid)` for `parallel_for`, named
    /// after this kernel. The caller fills its body with a separate builder.
    pub fn new_task_function(&self, suffix: &str) -> FunctionValue<'ctx> {
        let ptr = self.ptr_type();
        let i64t = self.cx.i64_type();
        let ty = self
            .cx
            .void_type()
            .fn_type(&[ptr.into(), i64t.into(), i64t.into()], false);
        let name = format!("{}.{suffix}", self.function.get_name().to_string_lossy());
        let f = self.module.add_function(&name, ty, Some(Linkage::Internal));
        crate::llvm::set_kernel_attributes(self.cx, f, self.target);
        f
    }

    /// Emits `kiln_rt_parallel_for(ctx, task, data, n)` at the builder's position.
    pub fn parallel_for(
        &self,
        task: FunctionValue<'ctx>,
        data: PointerValue<'ctx>,
        n: IntValue<'ctx>,
    ) -> Result<()> {
        let f = self.runtime_fn("kiln_rt_parallel_for");
        let task_ptr = task.as_global_value().as_pointer_value();
        self.builder
            .build_call(
                f,
                &[self.ctx().into(), task_ptr.into(), data.into(), n.into()],
                "",
            )
            .map_err(llvm)?;
        Ok(())
    }

    /// Emits `kiln_rt_thread_scratch(ctx, tid)` with `builder` (which may be a task's builder).
    pub fn thread_scratch(
        &self,
        builder: &Builder<'ctx>,
        ctx: PointerValue<'ctx>,
        tid: IntValue<'ctx>,
    ) -> Result<PointerValue<'ctx>> {
        let f = self.runtime_fn("kiln_rt_thread_scratch");
        let v = builder
            .build_call(f, &[ctx.into(), tid.into()], "scratch")
            .map_err(llvm)?;
        v.try_as_basic_value()
            .basic()
            .map(|v| v.into_pointer_value())
            .ok_or_else(|| CodegenError::internal("kiln_rt_thread_scratch returns a pointer"))
    }

    /// `ret i32 0`.
    pub fn ret_ok(&self) -> Result<()> {
        self.builder
            .build_return(Some(&self.cx.i32_type().const_zero()))
            .map_err(llvm)?;
        Ok(())
    }
}

/// Declares (once) a function of the runtime ABI by name.
pub fn runtime_fn<'ctx>(cx: &'ctx Context, module: &Module<'ctx>, name: &str) -> FunctionValue<'ctx> {
    if let Some(f) = module.get_function(name) {
        return f;
    }
    let ptr = cx.ptr_type(AddressSpace::default());
    let i64t = cx.i64_type();
    let i32t = cx.i32_type();
    let ty = match name {
        "kiln_rt_parallel_for" => cx
            .void_type()
            .fn_type(&[ptr.into(), ptr.into(), ptr.into(), i64t.into()], false),
        "kiln_rt_thread_scratch" => ptr.fn_type(&[ptr.into(), i64t.into()], false),
        "kiln_rt_num_threads" => i64t.fn_type(&[ptr.into()], false),
        "kiln_rt_arena" => ptr.fn_type(&[ptr.into()], false),
        "kiln_rt_set_error" => cx.void_type().fn_type(&[ptr.into(), ptr.into()], true),
        "kiln_rt_last_error" => ptr.fn_type(&[ptr.into()], false),
        "kiln_rt_error_context" => cx
            .void_type()
            .fn_type(&[ptr.into(), ptr.into(), ptr.into()], false),
        "kiln_rt_create" => ptr.fn_type(&[ptr.into(), i32t.into()], false),
        "kiln_rt_create_with_weights" => ptr.fn_type(&[ptr.into(), i32t.into(), ptr.into()], false),
        "kiln_rt_weights" => ptr.fn_type(&[ptr.into()], false),
        "kiln_rt_create_error" => ptr.fn_type(&[], false),
        "kiln_rt_destroy" => cx.void_type().fn_type(&[ptr.into()], false),
        "kiln_rt_api_check" => i32t.fn_type(
            &[
                ptr.into(),
                ptr.into(),
                ptr.into(),
                ptr.into(),
                ptr.into(),
                i32t.into(),
            ],
            false,
        ),
        "kiln_rt_api_check_variant" => i32t.fn_type(
            &[
                ptr.into(),
                i32t.into(),
                ptr.into(),
                ptr.into(),
                ptr.into(),
                ptr.into(),
                i32t.into(),
            ],
            false,
        ),
        "kiln_rt_run_shaped" => i32t.fn_type(&[ptr.into(); 6], false),
        "kiln_rt_output_dims" => ptr.fn_type(&[ptr.into(), i32t.into()], false),
        "kiln_rt_last_output_shape" => {
            i32t.fn_type(&[ptr.into(), ptr.into(), i32t.into(), ptr.into()], false)
        }
        "kiln_rt_io_count" => i32t.fn_type(&[ptr.into(), i32t.into()], false),
        "kiln_rt_io_name" => ptr.fn_type(&[ptr.into(), i32t.into(), i32t.into()], false),
        "kiln_rt_io_dtype" => i32t.fn_type(&[ptr.into(), i32t.into(), i32t.into()], false),
        "kiln_rt_io_shape" => i32t.fn_type(&[ptr.into(), i32t.into(), i32t.into(), ptr.into()], false),
        "kiln_rt_cuda_run" => i32t.fn_type(&[ptr.into(), ptr.into(), ptr.into()], false),
        "kiln_rt_cuda_create" => ptr.fn_type(&[ptr.into(), i32t.into(), ptr.into()], false),
        "kiln_rt_cuda_run_device" => i32t.fn_type(&[ptr.into(), ptr.into(), ptr.into(), ptr.into()], false),
        "kiln_rt_cuda_destroy" => cx.void_type().fn_type(&[ptr.into()], false),
        "kiln_exe_main" => i32t.fn_type(&[i32t.into(), ptr.into(), ptr.into()], false),
        "kiln_rt_desc" => ptr.fn_type(&[ptr.into()], false),
        "kiln_rt_select_variant" => ptr.fn_type(&[ptr.into(), ptr.into(), i32t.into()], false),
        "kiln_rt_create_variant" => ptr.fn_type(&[ptr.into(), ptr.into(), i32t.into(), i32t.into()], false),
        "kiln_rt_no_variant_exit" => i32t.fn_type(&[], false),
        other => panic!("unknown runtime function {other}"),
    };
    module.add_function(name, ty, Some(Linkage::External))
}

/// Wraps an inkwell builder error as an internal compiler error.
pub fn llvm(e: impl std::fmt::Display) -> CodegenError {
    CodegenError::internal(format!("LLVM builder: {e}"))
}
