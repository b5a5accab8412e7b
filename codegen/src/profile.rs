//! Per-kernel profiling in artifacts: the kernel table every model descriptor carries (name,
//! graph nodes, operators, estimated FLOPs per kernel), the timing hooks of the generated run
//! function, and the profiling functions of the C API (`kiln compile --profile`). The recording
//! itself is runtime-stub/c/profile.c.

use crate::api::Api;
use crate::error::Result;
use crate::gen::llvm;
use crate::plan::Plan;
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::values::{BasicMetadataValueEnum, BasicValueEnum, FunctionValue, PointerValue};
use inkwell::AddressSpace;
use kiln_ir::Graph;

/// One kernel as profiles name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelEntry {
    /// The graph node the kernel is planned from: `kiln explain`'s first node of the kernel.
    pub name: String,
    /// The operators it implements, `Conv+Add+Relu` for a fused kernel.
    pub op: String,
    /// The generated kernel's description or the kernel-library symbol.
    pub implementation: String,
    /// The graph nodes it implements, the anchor first.
    pub nodes: Vec<String>,
    /// Estimated floating-point operations per call (`kiln_ir::cost`).
    pub flops: u64,
}

/// The kernel table of a plan, in run order.
pub fn kernel_table(graph: &Graph, plan: &Plan) -> Vec<KernelEntry> {
    plan.kernels
        .iter()
        .map(|k| {
            let ids: Vec<_> = std::iter::once(k.node).chain(k.fused.iter().copied()).collect();
            let nodes: Vec<String> = ids.iter().map(|&n| graph.node(n).name.clone()).collect();
            let ops: Vec<&str> = ids.iter().map(|&n| graph.node(n).op.name()).collect();
            KernelEntry {
                name: k.node_name.clone(),
                op: ops.join("+"),
                implementation: k.describe(),
                nodes,
                flops: ids
                    .iter()
                    .map(|&n| kiln_ir::cost::node_flops(graph, graph.node(n)))
                    .sum(),
            }
        })
        .collect()
}

/// What emits into one module.
pub struct Gen<'a, 'ctx> {
    pub cx: &'ctx Context,
    pub module: &'a Module<'ctx>,
    pub builder: &'a Builder<'ctx>,
}

impl<'a, 'ctx> Gen<'a, 'ctx> {
    fn ptr(&self) -> inkwell::types::PointerType<'ctx> {
        self.cx.ptr_type(AddressSpace::default())
    }

    /// A declaration of a profile.c function (its body is linked in with the runtime).
    fn runtime(&self, name: &str) -> FunctionValue<'ctx> {
        if let Some(f) = self.module.get_function(name) {
            return f;
        }
        let (p, i32t, i64t, void) = (
            self.ptr(),
            self.cx.i32_type(),
            self.cx.i64_type(),
            self.cx.void_type(),
        );
        let ty = match name {
            "kiln_rt_prof_run_begin" => p.fn_type(&[p.into()], false),
            "kiln_rt_prof_kernel_begin" | "kiln_rt_prof_run_end" => void.fn_type(&[p.into()], false),
            "kiln_rt_prof_kernel_end" => void.fn_type(&[p.into(), i64t.into()], false),
            "kiln_rt_profile_enable" => i32t.fn_type(&[p.into(), i32t.into()], false),
            "kiln_rt_profile_kernels" => i32t.fn_type(&[p.into(), p.into(), i32t.into()], false),
            "kiln_rt_profile_write_trace" => i32t.fn_type(&[p.into(), p.into()], false),
            other => panic!("unknown profile function {other}"),
        };
        self.module.add_function(name, ty, Some(Linkage::External))
    }

    fn global(&self, name: &str, value: BasicValueEnum<'ctx>, align: u32) -> PointerValue<'ctx> {
        let g = self.module.add_global(value.get_type(), None, name);
        g.set_initializer(&value);
        g.set_constant(true);
        g.set_linkage(Linkage::Private);
        g.set_unnamed_addr(true);
        g.set_alignment(align);
        g.as_pointer_value()
    }

    fn cstring(&self, name: &str, s: &str) -> PointerValue<'ctx> {
        self.global(name, self.cx.const_string(s.as_bytes(), true).into(), 1)
    }

    /// The `kiln_kernel_desc` array the descriptor points at (null for a model without kernels).
    pub fn kernel_table_global(&self, entries: &[KernelEntry]) -> PointerValue<'ctx> {
        let (p, i32t, i64t) = (self.ptr(), self.cx.i32_type(), self.cx.i64_type());
        let st = self.cx.struct_type(
            &[p.into(), p.into(), p.into(), i32t.into(), p.into(), i64t.into()],
            false,
        );
        if entries.is_empty() {
            return p.const_null();
        }
        let vals: Vec<_> = entries
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let nodes: Vec<_> = e
                    .nodes
                    .iter()
                    .enumerate()
                    .map(|(j, n)| self.cstring(&format!("kiln.kt{i}.node{j}"), n))
                    .collect();
                let nodes = self.global(&format!("kiln.kt{i}.nodes"), p.const_array(&nodes).into(), 8);
                st.const_named_struct(&[
                    self.cstring(&format!("kiln.kt{i}.name"), &e.name).into(),
                    self.cstring(&format!("kiln.kt{i}.op"), &e.op).into(),
                    self.cstring(&format!("kiln.kt{i}.impl"), &e.implementation)
                        .into(),
                    i32t.const_int(e.nodes.len() as u64, false).into(),
                    nodes.into(),
                    i64t.const_int(e.flops, false).into(),
                ])
            })
            .collect();
        self.global("kiln.kernels", st.const_array(&vals).into(), 8)
    }

    fn call(
        &self,
        name: &str,
        args: &[BasicMetadataValueEnum<'ctx>],
    ) -> Result<Option<BasicValueEnum<'ctx>>> {
        Ok(self
            .builder
            .build_call(self.runtime(name), args, "")
            .map_err(llvm)?
            .try_as_basic_value()
            .basic())
    }

    /// `if (*slot) name(*slot, extra...)` at the builder's position; continues after it.
    fn if_profiling(
        &self,
        f: FunctionValue<'ctx>,
        prof: PointerValue<'ctx>,
        name: &str,
        extra: &[BasicMetadataValueEnum<'ctx>],
    ) -> Result<()> {
        let b = self.builder;
        // A volatile load per check: LLVM cannot see that every check in the run function
        // tests the same pointer, so it does not thread jumps from one kernel's check to the
        // next — which duplicates the run function per path and took minutes (quadratic in
        // the kernel count) for graphs of a few thousand kernels.
        let prof = b
            .build_load(self.ptr(), prof, "prof")
            .map_err(llvm)?
            .into_pointer_value();
        prof.as_instruction()
            .expect("a load is an instruction")
            .set_volatile(true)
            .map_err(|e| crate::error::CodegenError::internal(e.to_string()))?;
        let on = b.build_is_not_null(prof, "profiling").map_err(llvm)?;
        let (call_bb, next_bb) = (
            self.cx.append_basic_block(f, "prof"),
            self.cx.append_basic_block(f, "noprof"),
        );
        b.build_conditional_branch(on, call_bb, next_bb).map_err(llvm)?;
        b.position_at_end(call_bb);
        let mut args = vec![prof.into()];
        args.extend_from_slice(extra);
        self.call(name, &args)?;
        b.build_unconditional_branch(next_bb).map_err(llvm)?;
        b.position_at_end(next_bb);
        Ok(())
    }

    /// At the start of the run function: a stack slot holding the context's profile, or null
    /// when it is not profiled (the other hooks take the slot).
    pub fn run_begin(&self, ctx: PointerValue<'ctx>) -> Result<PointerValue<'ctx>> {
        let prof = self
            .call("kiln_rt_prof_run_begin", &[ctx.into()])?
            .expect("pointer")
            .into_pointer_value();
        let slot = self.builder.build_alloca(self.ptr(), "prof.slot").map_err(llvm)?;
        self.builder.build_store(slot, prof).map_err(llvm)?;
        Ok(slot)
    }

    pub fn kernel_begin(&self, f: FunctionValue<'ctx>, prof: PointerValue<'ctx>) -> Result<()> {
        self.if_profiling(f, prof, "kiln_rt_prof_kernel_begin", &[])
    }

    pub fn kernel_end(&self, f: FunctionValue<'ctx>, prof: PointerValue<'ctx>, kernel: usize) -> Result<()> {
        let k = self.cx.i64_type().const_int(kernel as u64, false);
        self.if_profiling(f, prof, "kiln_rt_prof_kernel_end", &[k.into()])
    }

    pub fn run_end(&self, f: FunctionValue<'ctx>, prof: PointerValue<'ctx>) -> Result<()> {
        self.if_profiling(f, prof, "kiln_rt_prof_run_end", &[])
    }

    /// `NAME_profile_enable`, `NAME_profile_kernels`, `NAME_profile_write_trace`: each forwards
    /// to profile.c, which refuses a null context with a message for `NAME_last_error(NULL)`.
    pub fn api_functions(&self, api: &Api, target: &crate::TargetDesc) -> Result<()> {
        let b = self.builder;
        let (p, i32t) = (self.ptr(), self.cx.i32_type());
        let fns: [(&str, &str, Vec<inkwell::types::BasicMetadataTypeEnum<'ctx>>); 3] = [
            (
                "profile_enable",
                "kiln_rt_profile_enable",
                vec![p.into(), i32t.into()],
            ),
            (
                "profile_kernels",
                "kiln_rt_profile_kernels",
                vec![p.into(), p.into(), i32t.into()],
            ),
            (
                "profile_write_trace",
                "kiln_rt_profile_write_trace",
                vec![p.into(), p.into()],
            ),
        ];
        for (what, rt, params) in fns {
            let f = self.module.add_function(
                &api.symbol(what),
                i32t.fn_type(&params, false),
                Some(Linkage::External),
            );
            crate::llvm::set_kernel_attributes(self.cx, f, target);
            let entry = self.cx.append_basic_block(f, "entry");
            b.position_at_end(entry);
            let args: Vec<BasicMetadataValueEnum> = f.get_param_iter().map(|a| a.into()).collect();
            let rc = self.call(rt, &args)?.expect("i32");
            b.build_return(Some(&rc)).map_err(llvm)?;
        }
        Ok(())
    }
}

/// The header's profiling section (static libraries compiled with `--profile`).
pub fn header_section(prefix: &str) -> String {
    let p = prefix;
    format!(
        r#"/* ---- profiling (compiled with kiln compile --profile) ----
 * Per-kernel timing of a context's runs. Off until {p}_profile_enable(ctx, 1); while on, each
 * run records a timestamp around every kernel. */

/* What was recorded for one kernel. The strings belong to the library and live forever. */
typedef struct {p}_profile_kernel {{
  const char *name;          /* the graph node the kernel is planned from */
  const char *op;            /* its operators, "Conv+Add+Relu" for a fused kernel */
  int32_t n_nodes;
  const char *const *nodes;  /* the model's nodes the kernel implements (n_nodes entries) */
  int64_t calls;             /* timed calls since profiling was turned on */
  int64_t total_ns;          /* their summed duration in nanoseconds */
  int64_t flops;             /* estimated floating-point operations per call (0: data movement) */
}} {p}_profile_kernel;

/* on = 1 turns profiling on and clears what was recorded; on = 0 turns it off and keeps the
   recording for reading. Returns 0, or non-zero with {p}_last_error(ctx) set. */
int32_t {p}_profile_enable({p}_ctx *ctx, int32_t on);

/* Copies the per-kernel table, in run order, into out[0 .. min(count, max)) and returns the
   number of kernels (call with out = NULL, max = 0 to size the array), or -1 when profiling was
   never turned on for ctx. */
int32_t {p}_profile_kernels({p}_ctx *ctx, {p}_profile_kernel *out, int32_t max);

/* Writes the recorded runs as a Chrome trace (JSON: open it in https://ui.perfetto.dev or
   chrome://tracing). Returns 0, or non-zero with {p}_last_error(ctx) set. */
int32_t {p}_profile_write_trace({p}_ctx *ctx, const char *path);

"#
    )
}

/// Marks the per-kernel hooks `noinline` once the runtime is linked in: the run function calls
/// them around every kernel, and inlined (clock reads, event bookkeeping) they made it grow
/// with the kernel count until LLVM took seconds per thousand kernels.
pub fn keep_hooks_out_of_line<'ctx>(
    cx: &'ctx inkwell::context::Context,
    module: &inkwell::module::Module<'ctx>,
) {
    for name in ["kiln_rt_prof_kernel_begin", "kiln_rt_prof_kernel_end"] {
        if let Some(f) = module.get_function(name).filter(|f| f.count_basic_blocks() > 0) {
            crate::llvm::set_noinline(cx, f);
        }
    }
}
