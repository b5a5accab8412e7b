//! The exported C API functions (`NAME_create`, `NAME_run`, the introspection functions,
//! the CUDA and profiling entry points) and the executable's `main`.

use super::{DescRef, Emitter, MAX_UNROLLED_OPERANDS};
use crate::error::{CodegenError, Result};
use crate::gen::{llvm, runtime_fn};
use inkwell::module::Linkage;
use inkwell::values::{BasicValueEnum, FunctionValue, GlobalValue, PointerValue};
use inkwell::IntPredicate;

impl<'a, 'ctx> Emitter<'a, 'ctx> {
    pub(super) fn exported_fn(
        &self,
        name: &str,
        ty: inkwell::types::FunctionType<'ctx>,
    ) -> FunctionValue<'ctx> {
        let f = self.module.add_function(name, ty, Some(Linkage::External));
        crate::llvm::set_kernel_attributes(self.cx, f, self.parts.target);
        let entry = self.cx.append_basic_block(f, "entry");
        self.builder.position_at_end(entry);
        f
    }

    pub(super) fn call_rt(
        &self,
        name: &str,
        args: &[BasicValueEnum<'ctx>],
    ) -> Result<Option<BasicValueEnum<'ctx>>> {
        let f = runtime_fn(self.cx, self.module, name);
        let args: Vec<_> = args.iter().map(|a| (*a).into()).collect();
        Ok(self
            .builder
            .build_call(f, &args, "r")
            .map_err(llvm)?
            .try_as_basic_value()
            .basic())
    }

    /// NAME_create_on_device / create_with_weights_on_device / run_device of a CUDA model:
    /// straight calls into the CUDA runtime (cuda.c), which is linked into such a model.
    pub(super) fn cuda_api_functions(&self, desc_global: GlobalValue<'ctx>) -> Result<()> {
        let b = &self.builder;
        let api = self.parts.api;
        let (p, i32t) = (self.ptr(), self.cx.i32_type());
        let desc = desc_global.as_pointer_value();

        let f = self.exported_fn(&api.symbol("create_on_device"), p.fn_type(&[i32t.into()], false));
        let device = f.get_nth_param(0).expect("device");
        let ctx = self
            .call_rt(
                "kiln_rt_cuda_create",
                &[desc.into(), device, p.const_null().into()],
            )?
            .expect("ptr");
        b.build_return(Some(&ctx)).map_err(llvm)?;

        if api.weights_file.is_some() {
            let f = self.exported_fn(
                &api.symbol("create_with_weights_on_device"),
                p.fn_type(&[p.into(), i32t.into()], false),
            );
            let path = f.get_nth_param(0).expect("path");
            let device = f.get_nth_param(1).expect("device");
            self.null_path_check(f, "create_with_weights_on_device")?;
            let ctx = self
                .call_rt("kiln_rt_cuda_create", &[desc.into(), device, path])?
                .expect("ptr");
            b.build_return(Some(&ctx)).map_err(llvm)?;
        }

        let f = self.exported_fn(
            &api.symbol("run_device"),
            i32t.fn_type(&[p.into(), p.into(), p.into(), p.into()], false),
        );
        let params: Vec<BasicValueEnum> = f.get_param_iter().collect();
        self.api_check(
            f,
            &DescRef::One(desc_global),
            "run_device",
            params[1].into_pointer_value(),
            params[2].into_pointer_value(),
            2,
        )?;
        let rc = self.call_rt("kiln_rt_cuda_run_device", &params)?.expect("i32");
        b.build_return(Some(&rc)).map_err(llvm)?;
        Ok(())
    }

    /// NAME_create / destroy / run / run_generic / last_error / workspace_size / info.
    pub(super) fn api_functions(&self, desc: &DescRef<'ctx>) -> Result<()> {
        let b = &self.builder;
        let api = self.parts.api;
        let (p, i32t, i64t) = (self.ptr(), self.cx.i32_type(), self.cx.i64_type());
        let run = self.module.get_function("kiln.run").expect("run emitted");

        let f = self.exported_fn(&api.symbol("create"), p.fn_type(&[i32t.into()], false));
        let threads = f.get_nth_param(0).expect("threads");
        let ctx = match desc {
            DescRef::One(desc) => {
                self.call_rt("kiln_rt_create", &[desc.as_pointer_value().into(), threads])?
            }
            DescRef::Variants { descs, names, n, .. } => self.call_rt(
                "kiln_rt_create_variant",
                &[
                    (*descs).into(),
                    (*names).into(),
                    i32t.const_int(*n, false).into(),
                    threads,
                ],
            )?,
        }
        .expect("ptr");
        b.build_return(Some(&ctx)).map_err(llvm)?;

        if let (Some(_), DescRef::One(desc)) = (&api.weights_file, desc) {
            let f = self.exported_fn(
                &api.symbol("create_with_weights"),
                p.fn_type(&[p.into(), i32t.into()], false),
            );
            let path = f.get_nth_param(0).expect("path");
            let threads = f.get_nth_param(1).expect("threads");
            self.null_path_check(f, "create_with_weights")?;
            let ctx = self
                .call_rt(
                    "kiln_rt_create_with_weights",
                    &[desc.as_pointer_value().into(), threads, path],
                )?
                .expect("ptr");
            b.build_return(Some(&ctx)).map_err(llvm)?;
        }

        let f = self.exported_fn(
            &api.symbol("destroy"),
            self.cx.void_type().fn_type(&[p.into()], false),
        );
        self.call_rt("kiln_rt_destroy", &[f.get_nth_param(0).expect("ctx")])?;
        b.build_return(None).map_err(llvm)?;

        // A null context has no error of its own: report why create failed.
        let f = self.exported_fn(&api.symbol("last_error"), p.fn_type(&[p.into()], false));
        let ctx = f.get_nth_param(0).expect("ctx").into_pointer_value();
        let is_null = b.build_is_null(ctx, "null").map_err(llvm)?;
        let (bn, bc) = (
            self.cx.append_basic_block(f, "null"),
            self.cx.append_basic_block(f, "ctx"),
        );
        b.build_conditional_branch(is_null, bn, bc).map_err(llvm)?;
        b.position_at_end(bn);
        let e = self.call_rt("kiln_rt_create_error", &[])?.expect("ptr");
        b.build_return(Some(&e)).map_err(llvm)?;
        b.position_at_end(bc);
        let e = self.call_rt("kiln_rt_last_error", &[ctx.into()])?.expect("ptr");
        b.build_return(Some(&e)).map_err(llvm)?;

        self.exported_fn(&api.symbol("workspace_size"), i64t.fn_type(&[], false));
        b.build_return(Some(&i64t.const_int(self.arena_bytes(), false)))
            .map_err(llvm)?;

        // The same JSON string the descriptor points at (--info prints that one).
        self.exported_fn(&api.symbol("info"), p.fn_type(&[], false));
        let sig = self
            .module
            .get_global("kiln.signature")
            .ok_or_else(|| CodegenError::internal("the model descriptor's signature is emitted first"))?;
        b.build_return(Some(&sig.as_pointer_value())).map_err(llvm)?;

        self.introspection_functions(desc.io())?;

        let guarded_run = |f: FunctionValue<'ctx>,
                           what: &str,
                           ins: PointerValue<'ctx>,
                           outs: PointerValue<'ctx>,
                           mode: u64|
         -> Result<()> {
            self.api_check(f, desc, what, ins, outs, mode)?;
            let ctx = f.get_nth_param(0).expect("ctx").into_pointer_value();
            let rc = b
                .build_call(run, &[ctx.into(), ins.into(), outs.into()], "rc")
                .map_err(llvm)?
                .try_as_basic_value()
                .basic()
                .expect("i32");
            b.build_return(Some(&rc)).map_err(llvm)?;
            Ok(())
        };

        let f = self.exported_fn(
            &api.symbol("run_generic"),
            i32t.fn_type(&[p.into(), p.into(), p.into()], false),
        );
        let ins = f.get_nth_param(1).expect("inputs").into_pointer_value();
        let outs = f.get_nth_param(2).expect("outputs").into_pointer_value();
        guarded_run(f, "run_generic", ins, outs, 1)?;

        // The shaped run: input shapes checked, output shapes reported (kiln_rt_run_shaped).
        let f = self.exported_fn(
            &api.symbol("run_shaped"),
            i32t.fn_type(&[p.into(), p.into(), p.into(), p.into(), p.into()], false),
        );
        let params: Vec<BasicValueEnum> = f.get_param_iter().collect();
        self.api_check(
            f,
            desc,
            "run_shaped",
            params[1].into_pointer_value(),
            params[3].into_pointer_value(),
            3,
        )?;
        let name = self.cstring("kiln.api.run_shaped.name", &api.symbol("run_shaped"));
        let rc = self
            .call_rt(
                "kiln_rt_run_shaped",
                &[params[0], name.into(), params[1], params[2], params[3], params[4]],
            )?
            .expect("i32");
        b.build_return(Some(&rc)).map_err(llvm)?;

        // The shapes of the last run, for the runs that report none (run_device above all).
        let f = self.exported_fn(
            &api.symbol("last_output_shape"),
            i32t.fn_type(&[p.into(), i32t.into(), p.into()], false),
        );
        let params: Vec<BasicValueEnum> = f.get_param_iter().collect();
        let name = self.cstring(
            "kiln.api.last_output_shape.name",
            &api.symbol("last_output_shape"),
        );
        let rank = self
            .call_rt(
                "kiln_rt_last_output_shape",
                &[params[0], name.into(), params[1], params[2]],
            )?
            .expect("i32");
        b.build_return(Some(&rank)).map_err(llvm)?;

        let n_in = self.parts.graph.inputs().len();
        let n_out = self.parts.graph.outputs().len();
        let params: Vec<_> = std::iter::repeat_n(p.into(), 1 + n_in + n_out).collect();
        let f = self.exported_fn(&api.symbol("run"), i32t.fn_type(&params, false));
        let ins = b
            .build_array_alloca(p, i64t.const_int(n_in.max(1) as u64, false), "ins")
            .map_err(llvm)?;
        let outs = b
            .build_array_alloca(p, i64t.const_int(n_out.max(1) as u64, false), "outs")
            .map_err(llvm)?;
        for i in 0..n_in + n_out {
            let (arr, idx) = if i < n_in { (ins, i) } else { (outs, i - n_in) };
            let slot = unsafe { b.build_in_bounds_gep(p, arr, &[i64t.const_int(idx as u64, false)], "s") }
                .map_err(llvm)?;
            b.build_store(slot, f.get_nth_param(1 + i as u32).expect("param"))
                .map_err(llvm)?;
        }
        if n_in + n_out > MAX_UNROLLED_OPERANDS {
            // Thousands of parameters stored in one block: LLVM's passes and instruction
            // scheduling take quadratic time on them, and there is nothing to optimize.
            crate::llvm::set_optnone(self.cx, f);
        }
        guarded_run(f, "run", ins, outs, 0)?;
        Ok(())
    }

    /// The start of an API function that runs the model: `kiln_rt_api_check` of its context and
    /// tensor pointers, returning its -1 when they are unusable (`what`: the function, for the
    /// message; `mode`: how the tensors are passed, see kiln_rt.h). The builder is left in the
    /// block where the checks passed.
    pub(super) fn api_check(
        &self,
        f: FunctionValue<'ctx>,
        desc: &DescRef<'ctx>,
        what: &str,
        ins: PointerValue<'ctx>,
        outs: PointerValue<'ctx>,
        mode: u64,
    ) -> Result<()> {
        let b = &self.builder;
        let i32t = self.cx.i32_type();
        let ctx = f.get_nth_param(0).expect("ctx");
        let name = self.cstring(&format!("kiln.api.{what}"), &self.parts.api.symbol(what));
        let checked = [
            ctx,
            name.into(),
            ins.into(),
            outs.into(),
            i32t.const_int(mode, false).into(),
        ];
        // A portable model's context holds whichever variant this CPU got: any of them is
        // this model's.
        let rc = match desc {
            DescRef::One(d) => {
                let args: Vec<BasicValueEnum> = std::iter::once(d.as_pointer_value().into())
                    .chain(checked)
                    .collect();
                self.call_rt("kiln_rt_api_check", &args)?
            }
            DescRef::Variants { descs, n, .. } => {
                let args: Vec<BasicValueEnum> = [(*descs).into(), i32t.const_int(*n, false).into()]
                    .into_iter()
                    .chain(checked)
                    .collect();
                self.call_rt("kiln_rt_api_check_variant", &args)?
            }
        }
        .expect("i32")
        .into_int_value();
        let bad = b
            .build_int_compare(IntPredicate::NE, rc, i32t.const_zero(), "bad")
            .map_err(llvm)?;
        let (bn, bc) = (
            self.cx.append_basic_block(f, "bad"),
            self.cx.append_basic_block(f, "ok"),
        );
        b.build_conditional_branch(bad, bn, bc).map_err(llvm)?;
        b.position_at_end(bn);
        b.build_return(Some(&rc)).map_err(llvm)?;
        b.position_at_end(bc);
        Ok(())
    }

    /// The start of `NAME_create_with_weights*`: a NULL path fails with a message naming it
    /// (the runtime would otherwise read it as "no weights file" and advise this very call).
    pub(super) fn null_path_check(&self, f: FunctionValue<'ctx>, what: &str) -> Result<()> {
        let b = &self.builder;
        let p = self.ptr();
        let path = f.get_nth_param(0).expect("path").into_pointer_value();
        let is_null = b.build_is_null(path, "null").map_err(llvm)?;
        let (bn, bc) = (
            self.cx.append_basic_block(f, "null"),
            self.cx.append_basic_block(f, "ok"),
        );
        b.build_conditional_branch(is_null, bn, bc).map_err(llvm)?;
        b.position_at_end(bn);
        let fmt = self.cstring(&format!("kiln.api.{what}.fmt"), "%s");
        let msg = self.cstring(
            &format!("kiln.api.{what}.null"),
            &format!("{}: weights_path is NULL", self.parts.api.symbol(what)),
        );
        self.call_rt(
            "kiln_rt_set_error",
            &[p.const_null().into(), fmt.into(), msg.into()],
        )?;
        b.build_return(Some(&p.const_null())).map_err(llvm)?;
        b.position_at_end(bc);
        Ok(())
    }

    /// NAME_input_count / input_name / input_dtype / input_shape and the output_ variants:
    /// each calls its kiln_rt_io_* function on the model descriptor.
    pub(super) fn introspection_functions(&self, desc: PointerValue<'ctx>) -> Result<()> {
        let b = &self.builder;
        let (p, i32t) = (self.ptr(), self.cx.i32_type());
        for (output, what) in [(0u64, "input"), (1, "output")] {
            let which = i32t.const_int(output, false);
            for (suffix, rt, ty) in [
                ("count", "kiln_rt_io_count", i32t.fn_type(&[], false)),
                ("name", "kiln_rt_io_name", p.fn_type(&[i32t.into()], false)),
                ("dtype", "kiln_rt_io_dtype", i32t.fn_type(&[i32t.into()], false)),
                (
                    "shape",
                    "kiln_rt_io_shape",
                    i32t.fn_type(&[i32t.into(), p.into()], false),
                ),
            ] {
                let f = self.exported_fn(&self.parts.api.symbol(&format!("{what}_{suffix}")), ty);
                let mut args: Vec<BasicValueEnum> = vec![desc.into(), which.into()];
                args.extend(f.get_param_iter());
                let r = self.call_rt(rt, &args)?.expect("a value");
                b.build_return(Some(&r)).map_err(llvm)?;
            }
        }
        Ok(())
    }

    pub(super) fn main_function(&self, desc: &DescRef<'ctx>) -> Result<()> {
        let (b, p, i32t) = (&self.builder, self.ptr(), self.cx.i32_type());
        let f = self.exported_fn("main", i32t.fn_type(&[i32t.into(), p.into()], false));
        let argc = f.get_nth_param(0).expect("argc");
        let argv = f.get_nth_param(1).expect("argv");
        let desc = match desc {
            DescRef::One(desc) => desc.as_pointer_value(),
            DescRef::Variants { descs, names, n, .. } => {
                let d = self
                    .call_rt(
                        "kiln_rt_select_variant",
                        &[(*descs).into(), (*names).into(), i32t.const_int(*n, false).into()],
                    )?
                    .expect("ptr")
                    .into_pointer_value();
                let is_null = b.build_is_null(d, "null").map_err(llvm)?;
                let (bn, bc) = (
                    self.cx.append_basic_block(f, "none"),
                    self.cx.append_basic_block(f, "chosen"),
                );
                b.build_conditional_branch(is_null, bn, bc).map_err(llvm)?;
                b.position_at_end(bn);
                let rc = self.call_rt("kiln_rt_no_variant_exit", &[])?.expect("i32");
                b.build_return(Some(&rc)).map_err(llvm)?;
                b.position_at_end(bc);
                d
            }
        };
        let rc = self
            .call_rt("kiln_exe_main", &[argc, argv, desc.into()])?
            .expect("i32");
        self.builder.build_return(Some(&rc)).map_err(llvm)?;
        Ok(())
    }
}
