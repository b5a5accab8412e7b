//! The run function: the calls of every kernel in order with their argument slots, split in
//! parts for large models; the dispatching run function of a portable artifact and the CUDA
//! one.

use super::call::{call_and_branch_on_status, store_arg_slots};
use super::{Emitter, MAX_UNROLLED_OPERANDS};
use crate::error::{CodegenError, Result};
use crate::gen::{llvm, runtime_fn};
use crate::kernel::Storage;
use inkwell::context::Context;
use inkwell::module::Linkage;
use inkwell::types::StructType;
use inkwell::values::{BasicValueEnum, FunctionValue, GlobalValue, PointerValue};

/// Kernels per part of the run function of a large model (see `run_function`).
pub(super) const RUN_PART_KERNELS: usize = 256;

/// The pointers every kernel call of a run is built from.
pub(super) struct RunBases<'ctx> {
    ctx: PointerValue<'ctx>,
    inputs: PointerValue<'ctx>,
    outputs: PointerValue<'ctx>,
    arena: PointerValue<'ctx>,
    weights: PointerValue<'ctx>,
    /// The profile of this run, when the model is instrumented.
    prof: Option<PointerValue<'ctx>>,
}

/// Marks the kernels `noinline`. Inlined, every kernel of the model would land in the run
/// function, and LLVM's time on one function grows faster than its size (a graph of 2,000
/// small kernels took 50 s): called, each kernel is optimized on its own and the run function
/// stays a list of calls. A call costs nanoseconds next to a kernel.
pub(super) fn keep_out_of_line<'ctx>(cx: &'ctx Context, kernels: &[FunctionValue<'ctx>]) {
    for &f in kernels {
        crate::llvm::set_noinline(cx, f);
    }
}

impl<'a, 'ctx> Emitter<'a, 'ctx> {
    /// The address of the weights global, read at run time from a pointer variable that holds
    /// it (`NAME_kiln_weights.base`, filled in by the loader), so that every weight's address
    /// is that base plus an offset in a 64-bit register. Written as the global's address, the
    /// compiler folds each offset into a 32-bit displacement from the code, which cannot reach
    /// past 2 GiB of weights (and cannot reach them at all once the linker has put them, as a
    /// large section, after everything else: see `weights_object`). The load is volatile so
    /// that it stays a load.
    fn weights_base(&self, weights: GlobalValue<'ctx>) -> Result<PointerValue<'ctx>> {
        let ptr = self.ptr();
        let name = format!("{}.base", weights.get_name().to_string_lossy());
        let base = match self.module.get_global(&name) {
            Some(g) => g,
            None => {
                let g = self.module.add_global(ptr, None, &name);
                g.set_initializer(&weights.as_pointer_value());
                g.set_linkage(Linkage::Internal);
                g
            }
        };
        let load = self
            .builder
            .build_load(ptr, base.as_pointer_value(), "weights")
            .map_err(llvm)?;
        load.into_pointer_value()
            .as_instruction()
            .ok_or_else(|| CodegenError::internal("a load is an instruction"))?
            .set_volatile(true)
            .map_err(llvm)?;
        Ok(load.into_pointer_value())
    }

    /// `i32 run(ptr ctx, ptr inputs, ptr outputs)`: every kernel in order, then output copies.
    /// The weights are the embedded global, or (None) the context's mapped weights file.
    ///
    /// A model of more than `RUN_PART_KERNELS` kernels calls them from `noinline` parts of that
    /// many kernels each: one function with a block per kernel (its call, its failure exit, its
    /// profiling hooks) costs LLVM time that grows faster than the kernel count, so the run
    /// function's size stays bounded however large the graph.
    pub(super) fn run_function(
        &self,
        kernels: &[FunctionValue<'ctx>],
        weights: Option<GlobalValue<'ctx>>,
    ) -> Result<FunctionValue<'ctx>> {
        let n = self.parts.plan.kernels.len();
        let parts = if n > RUN_PART_KERNELS {
            (0..n)
                .step_by(RUN_PART_KERNELS)
                .enumerate()
                .map(|(c, lo)| self.run_part(c, lo..(lo + RUN_PART_KERNELS).min(n), kernels))
                .collect::<Result<Vec<_>>>()?
        } else {
            vec![]
        };
        let b = &self.builder;
        let ptr = self.ptr();
        let i64t = self.cx.i64_type();
        let i32t = self.cx.i32_type();
        let ty = i32t.fn_type(&[ptr.into(), ptr.into(), ptr.into()], false);
        let f = self.module.add_function("kiln.run", ty, Some(Linkage::Internal));
        crate::llvm::set_kernel_attributes(self.cx, f, self.parts.target);
        let entry = self.cx.append_basic_block(f, "entry");
        b.position_at_end(entry);
        let ctx = f.get_nth_param(0).expect("ctx").into_pointer_value();
        let inputs = f.get_nth_param(1).expect("inputs").into_pointer_value();
        let outputs = f.get_nth_param(2).expect("outputs").into_pointer_value();
        let arena = b
            .build_call(
                runtime_fn(self.cx, self.module, "kiln_rt_arena"),
                &[ctx.into()],
                "arena",
            )
            .map_err(llvm)?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| CodegenError::internal("kiln_rt_arena returns a pointer"))?
            .into_pointer_value();
        let prof = match self.instrumented() {
            true => Some(self.profile_gen().run_begin(ctx)?),
            false => None,
        };
        let weights = match weights {
            Some(g) => self.weights_base(g)?,
            None => b
                .build_call(
                    runtime_fn(self.cx, self.module, "kiln_rt_weights"),
                    &[ctx.into()],
                    "weights",
                )
                .map_err(llvm)?
                .try_as_basic_value()
                .basic()
                .ok_or_else(|| CodegenError::internal("kiln_rt_weights returns a pointer"))?
                .into_pointer_value(),
        };
        let bases = RunBases {
            ctx,
            inputs,
            outputs,
            arena,
            weights,
            prof,
        };
        if parts.is_empty() {
            self.kernel_calls(f, 0..n, kernels, &bases)?;
        }
        for (c, part) in parts.iter().enumerate() {
            let prof = prof.unwrap_or(ptr.const_null());
            let (rc, next_bb) = call_and_branch_on_status(
                self.cx,
                b,
                f,
                *part,
                &[
                    ctx.into(),
                    inputs.into(),
                    outputs.into(),
                    arena.into(),
                    weights.into(),
                    prof.into(),
                ],
                "a run part",
                &format!("part_fail{c}"),
                &format!("after_part{c}"),
            )?;
            b.build_return(Some(&rc)).map_err(llvm)?;
            b.position_at_end(next_bb);
        }
        for c in &self.parts.plan.output_copies {
            let src = self.locate(c.from, &bases)?;
            let dst = self.locate(Storage::Output(c.output), &bases)?;
            b.build_memcpy(dst, 1, src, 1, i64t.const_int(c.bytes, false))
                .map_err(llvm)?;
        }
        if let Some(prof) = prof {
            self.profile_gen().run_end(f, prof)?;
        }
        b.build_return(Some(&i32t.const_zero())).map_err(llvm)?;
        Ok(f)
    }

    /// `i32 kiln.run.part{c}(ctx, inputs, outputs, arena, weights, prof)`: the kernels of
    /// `range`, as the run function would call them; 0, or the failing kernel's status.
    pub(super) fn run_part(
        &self,
        c: usize,
        range: std::ops::Range<usize>,
        kernels: &[FunctionValue<'ctx>],
    ) -> Result<FunctionValue<'ctx>> {
        let b = &self.builder;
        let ptr = self.ptr();
        let i32t = self.cx.i32_type();
        let ty = i32t.fn_type(&[ptr.into(); 6], false);
        let f = self
            .module
            .add_function(&format!("kiln.run.part{c}"), ty, Some(Linkage::Internal));
        crate::llvm::set_kernel_attributes(self.cx, f, self.parts.target);
        crate::llvm::set_noinline(self.cx, f);
        b.position_at_end(self.cx.append_basic_block(f, "entry"));
        let param = |i: u32| f.get_nth_param(i).expect("part parameter").into_pointer_value();
        let bases = RunBases {
            ctx: param(0),
            inputs: param(1),
            outputs: param(2),
            arena: param(3),
            weights: param(4),
            prof: self.instrumented().then(|| param(5)),
        };
        self.kernel_calls(f, range, kernels, &bases)?;
        b.build_return(Some(&i32t.const_zero())).map_err(llvm)?;
        Ok(f)
    }

    /// Where a storage lives, computed in the block being built.
    pub(super) fn locate(&self, s: Storage, bases: &RunBases<'ctx>) -> Result<PointerValue<'ctx>> {
        let b = &self.builder;
        let (ptr, i64t) = (self.ptr(), self.cx.i64_type());
        let gep = |base: PointerValue<'ctx>, off: u64| unsafe {
            b.build_in_bounds_gep(self.cx.i8_type(), base, &[i64t.const_int(off, false)], "p")
        };
        let load = |arr: PointerValue<'ctx>, i: usize| -> Result<PointerValue<'ctx>> {
            let p = unsafe { b.build_in_bounds_gep(ptr, arr, &[i64t.const_int(i as u64, false)], "pp") }
                .map_err(llvm)?;
            Ok(b.build_load(ptr, p, "io").map_err(llvm)?.into_pointer_value())
        };
        match s {
            Storage::Input(i) => load(bases.inputs, i),
            Storage::Output(i) => load(bases.outputs, i),
            Storage::Arena(off) => gep(bases.arena, off).map_err(llvm),
            Storage::Weights(off) => gep(bases.weights, off).map_err(llvm),
        }
    }

    /// Calls the kernels of `range` in order from `f` (at the builder's block): each with its
    /// argument slots filled, between its profiling hooks, returning its status when it fails.
    pub(super) fn kernel_calls(
        &self,
        f: FunctionValue<'ctx>,
        range: std::ops::Range<usize>,
        kernels: &[FunctionValue<'ctx>],
        bases: &RunBases<'ctx>,
    ) -> Result<()> {
        let b = &self.builder;
        let ptr = self.ptr();
        let i64t = self.cx.i64_type();
        let plan = self.parts.plan;
        let ctx = bases.ctx;
        let max_args = plan.kernels[range.clone()]
            .iter()
            .map(|k| k.inputs.len() + k.outputs.len() + k.packed.len() + 1)
            .max()
            .unwrap_or(1);
        let args = b
            .build_array_alloca(ptr, i64t.const_int(max_args as u64, false), "args")
            .map_err(llvm)?;
        for i in range {
            let (k, kf) = (&plan.kernels[i], kernels[i]);
            let slots = plan.arg_slots(k)?;
            if slots.len() > MAX_UNROLLED_OPERANDS {
                let table_bases = [bases.inputs, bases.outputs, bases.arena, bases.weights];
                self.fill_args_in_loop(f, i, args, &slots, table_bases)?;
            } else {
                store_arg_slots(self.cx, b, args, &slots, |s| self.locate(s, bases))?;
            }
            if let Some(prof) = bases.prof {
                self.profile_gen().kernel_begin(f, prof)?;
            }
            let (rc, next_bb) = call_and_branch_on_status(
                self.cx,
                b,
                f,
                kf,
                &[ctx.into(), args.into()],
                "kernel",
                &format!("fail{i}"),
                &format!("after{i}"),
            )?;
            let node = self.cstring(&format!("kiln.k{i}.node"), &k.node_name);
            let op = self.cstring(&format!("kiln.k{i}.op"), k.op_name);
            b.build_call(
                runtime_fn(self.cx, self.module, "kiln_rt_error_context"),
                &[ctx.into(), node.into(), op.into()],
                "",
            )
            .map_err(llvm)?;
            b.build_return(Some(&rc)).map_err(llvm)?;
            b.position_at_end(next_bb);
            if let Some(prof) = bases.prof {
                self.profile_gen().kernel_end(f, prof, i)?;
            }
        }
        Ok(())
    }

    /// `i32 run(ptr ctx, ptr inputs, ptr outputs)` of a portable artifact: the run function of
    /// the variant the context was created with (its description's `run`).
    pub(super) fn dispatch_run_function(&self, desc_ty: StructType<'ctx>) -> Result<FunctionValue<'ctx>> {
        let (b, ptr, i32t) = (&self.builder, self.ptr(), self.cx.i32_type());
        let ty = i32t.fn_type(&[ptr.into(), ptr.into(), ptr.into()], false);
        let f = self.module.add_function("kiln.run", ty, Some(Linkage::Internal));
        crate::llvm::set_kernel_attributes(self.cx, f, self.parts.target);
        b.position_at_end(self.cx.append_basic_block(f, "entry"));
        let params: Vec<BasicValueEnum> = f.get_param_iter().collect();
        let desc = self
            .call_rt("kiln_rt_desc", &params[..1])?
            .expect("ptr")
            .into_pointer_value();
        // Field 12 of kiln_model_desc: run.
        let slot = b.build_struct_gep(desc_ty, desc, 12, "run").map_err(llvm)?;
        let run = b.build_load(ptr, slot, "run").map_err(llvm)?.into_pointer_value();
        let args: Vec<_> = params.iter().map(|a| (*a).into()).collect();
        let rc = b
            .build_indirect_call(ty, run, &args, "rc")
            .map_err(llvm)?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| CodegenError::internal("run returns i32"))?;
        b.build_return(Some(&rc)).map_err(llvm)?;
        Ok(f)
    }
}

impl<'a, 'ctx> Emitter<'a, 'ctx> {
    /// The `kiln_weights_desc` of a build with external weights, or a null pointer.
    /// `i32 run(ptr ctx, ptr inputs, ptr outputs)` of a CUDA model: the runtime does it all.
    pub(super) fn cuda_run_function(&self) -> Result<FunctionValue<'ctx>> {
        let (b, ptr, i32t) = (&self.builder, self.ptr(), self.cx.i32_type());
        let ty = i32t.fn_type(&[ptr.into(), ptr.into(), ptr.into()], false);
        let f = self.module.add_function("kiln.run", ty, Some(Linkage::Internal));
        crate::llvm::set_kernel_attributes(self.cx, f, self.parts.target);
        b.position_at_end(self.cx.append_basic_block(f, "entry"));
        let params: Vec<BasicValueEnum> = f.get_param_iter().collect();
        let rc = self
            .call_rt("kiln_rt_cuda_run", &params)?
            .ok_or_else(|| CodegenError::internal("kiln_rt_cuda_run returns i32"))?;
        b.build_return(Some(&rc)).map_err(llvm)?;
        Ok(f)
    }
}
