//! One LLVM function per planned kernel: a generated kernel's body (`gen`), or a call of a
//! kernel-library function with its operand descriptors (identical library kernels share one
//! function).

use super::{Emitter, ModuleParts, MAX_UNROLLED_OPERANDS};
use crate::error::{CodegenError, Result};
use crate::gen::{llvm, KernelBuilder};
use crate::kernel::Storage;
use crate::node::NodeInfo;
use crate::plan::kernel::{Kernel, KernelImpl};
use crate::uk::UkCall;
use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::types::{BasicTypeEnum, StructType};
use inkwell::values::{BasicValueEnum, FunctionValue, PointerValue};
use inkwell::IntPredicate;
use kiln_ir::{Graph, TensorType};
use std::collections::HashMap;

/// Emits `i32 kiln.k{i}(ptr ctx, ptr args)` for every kernel of the plan into `module` (whose
/// triple decides where they run): the CPU module's kernels, or the bodies the CUDA device
/// module wraps in kernel entries.
pub(crate) fn kernel_functions<'ctx>(
    cx: &'ctx Context,
    module: &Module<'ctx>,
    parts: &ModuleParts<'_>,
    on_kernel: &mut dyn FnMut(usize, usize),
) -> Result<Vec<FunctionValue<'ctx>>> {
    let e = Emitter {
        cx,
        module,
        builder: cx.create_builder(),
        parts,
    };
    let n = parts.plan.kernels.len();
    let mut fns = vec![];
    let mut shared: HashMap<UkKey, FunctionValue<'ctx>> = HashMap::new();
    for (i, k) in parts.plan.kernels.iter().enumerate() {
        on_kernel(i, n);
        let key = uk_key(parts.graph, k);
        let f = match key.as_ref().and_then(|key| shared.get(key)) {
            Some(&f) => f,
            None => e.kernel_function(i, k)?,
        };
        if let Some(key) = key {
            shared.entry(key).or_insert(f);
        }
        fns.push(f);
    }
    Ok(fns)
}

/// Everything a library kernel's body depends on: the call and its operands' types and
/// presence. Kernels with equal keys share one function, so a graph that repeats a layer
/// (or a chain of 200k identical Relus) gives LLVM one body to specialise, not one per node.
#[derive(PartialEq, Eq, Hash)]
pub(super) struct UkKey {
    symbol: &'static str,
    iattr: Vec<i64>,
    fattr: Vec<u64>,
    inputs: Vec<Option<TensorType>>,
    outputs: Vec<TensorType>,
    scratch: bool,
}

pub(super) fn uk_key(graph: &Graph, k: &Kernel) -> Option<UkKey> {
    let KernelImpl::Ukernel(call) = &k.imp else {
        return None;
    };
    Some(UkKey {
        symbol: call.symbol,
        iattr: call.iattr.clone(),
        fattr: call.fattr.iter().map(|f| f.to_bits()).collect(),
        inputs: k
            .inputs
            .iter()
            .map(|v| v.map(|v| graph.value_type(v).clone()))
            .collect(),
        outputs: k.outputs.iter().map(|&v| graph.value_type(v).clone()).collect(),
        scratch: k.scratch.is_some(),
    })
}

impl<'a, 'ctx> Emitter<'a, 'ctx> {
    /// `i32 kernel(ptr ctx, ptr args)` for kernel `i`.
    pub(super) fn kernel_function(&self, i: usize, k: &Kernel) -> Result<FunctionValue<'ctx>> {
        let ptr = self.ptr();
        let ty = self.cx.i32_type().fn_type(&[ptr.into(), ptr.into()], false);
        let f = self
            .module
            .add_function(&format!("kiln.k{i}"), ty, Some(Linkage::Internal));
        crate::llvm::set_kernel_attributes(self.cx, f, self.parts.target);
        let entry = self.cx.append_basic_block(f, "entry");
        self.builder.position_at_end(entry);
        let mut info = NodeInfo::new(self.parts.graph, k.node);
        if let Some((slot, v)) = k.extra {
            info = info.with_extra(slot, v);
        }
        match &k.imp {
            KernelImpl::Generated(g) => {
                let kb = KernelBuilder {
                    cx: self.cx,
                    module: self.module,
                    builder: &self.builder,
                    function: f,
                    target: self.parts.target,
                    node: &info,
                    n_inputs: k.inputs.len(),
                    n_outputs: k.outputs.len(),
                    n_packed: k.packed.len(),
                };
                g.emit(&kb)?;
            }
            KernelImpl::Ukernel(call) => self.ukernel_body(i, f, k, call)?,
            // Emitted as a PTX entry of its own (nvptx::device); never called as a body.
            KernelImpl::Gpu(_) => {
                self.builder
                    .build_return(Some(&self.cx.i32_type().const_zero()))
                    .map_err(llvm)?;
            }
        }
        Ok(f)
    }

    pub(super) fn tensor_type(&self) -> StructType<'ctx> {
        let (p, i) = (self.ptr().into(), self.cx.i64_type().into());
        self.cx.struct_type(&[p, p, i, i, i], false)
    }

    pub(super) fn uk_args_type(&self) -> StructType<'ctx> {
        let (p, i): (BasicTypeEnum, BasicTypeEnum) = (self.ptr().into(), self.cx.i64_type().into());
        self.cx.struct_type(&[p, i, p, i, p, i, p, i, p, p], false)
    }

    /// Fills `kiln_tensor` descriptors and `kiln_uk_args`, calls `kiln_uk_<symbol>`.
    pub(super) fn ukernel_body(
        &self,
        i: usize,
        f: FunctionValue<'ctx>,
        k: &Kernel,
        call: &UkCall,
    ) -> Result<()> {
        let b = &self.builder;
        let graph = self.parts.graph;
        let i64t = self.cx.i64_type();
        let tt = self.tensor_type();
        let args = f.get_nth_param(1).expect("args").into_pointer_value();
        let ctx = f.get_nth_param(0).expect("ctx").into_pointer_value();
        let load_arg = |slot: usize| -> Result<PointerValue<'ctx>> {
            let p = unsafe {
                b.build_in_bounds_gep(self.ptr(), args, &[i64t.const_int(slot as u64, false)], "p")
            }
            .map_err(llvm)?;
            Ok(b.build_load(self.ptr(), p, "a")
                .map_err(llvm)?
                .into_pointer_value())
        };
        let describe = |tensors: PointerValue<'ctx>,
                        idx: usize,
                        slot: usize,
                        ty: Option<&TensorType>,
                        tag: &str|
         -> Result<()> {
            let t = unsafe { b.build_in_bounds_gep(tt, tensors, &[i64t.const_int(idx as u64, false)], "t") }
                .map_err(llvm)?;
            let (data, dims, rank, dtype, numel) = match ty {
                Some(ty) => {
                    let shape: Vec<i64> = ty
                        .fixed_shape()
                        .unwrap_or_default()
                        .iter()
                        .map(|&d| d as i64)
                        .collect();
                    let numel: i64 = shape.iter().product();
                    let dims = self.i64_array(&format!("kiln.k{i}.{tag}{idx}.dims"), &shape);
                    (
                        load_arg(slot)?,
                        dims,
                        shape.len() as u64,
                        ty.dtype as u64,
                        numel as u64,
                    )
                }
                None => (self.ptr().const_null(), self.ptr().const_null(), 0, 0, 0),
            };
            let fields: [BasicValueEnum; 5] = [
                data.into(),
                dims.into(),
                i64t.const_int(rank, false).into(),
                i64t.const_int(dtype, false).into(),
                i64t.const_int(numel, false).into(),
            ];
            for (fi, v) in fields.iter().enumerate() {
                let p = b.build_struct_gep(tt, t, fi as u32, "f").map_err(llvm)?;
                b.build_store(p, *v).map_err(llvm)?;
            }
            Ok(())
        };
        let n_in = k.inputs.len();
        let n_out = k.outputs.len();
        let ins = b
            .build_array_alloca(tt, i64t.const_int(n_in.max(1) as u64, false), "ins")
            .map_err(llvm)?;
        let outs = b
            .build_array_alloca(tt, i64t.const_int(n_out.max(1) as u64, false), "outs")
            .map_err(llvm)?;
        if n_in > MAX_UNROLLED_OPERANDS {
            self.describe_in_loop(i, f, ins, k)?;
        } else {
            for (idx, v) in k.inputs.iter().enumerate() {
                describe(ins, idx, idx, v.map(|v| graph.value_type(v)), "in")?;
            }
        }
        // Data-dependent outputs (`crate::data_dependent`): the kernel writes the actual dims
        // into a copy of the bound's, and the count goes on to the graph outputs computed
        // from the value.
        let mut roots = vec![];
        for (idx, v) in k.outputs.iter().enumerate() {
            let ty = graph.value_type(*v);
            describe(outs, idx, n_in + idx, Some(ty), "out")?;
            let Some(root) = crate::data_dependent::root(graph, *v)? else {
                continue;
            };
            let bound: Vec<i64> = ty
                .fixed_shape()
                .unwrap_or_default()
                .iter()
                .map(|&d| d as i64)
                .collect();
            let dims = b
                .build_array_alloca(i64t, i64t.const_int(bound.len().max(1) as u64, false), "dims")
                .map_err(llvm)?;
            for (d, &n) in bound.iter().enumerate() {
                let p = unsafe { b.build_in_bounds_gep(i64t, dims, &[i64t.const_int(d as u64, false)], "d") }
                    .map_err(llvm)?;
                b.build_store(p, i64t.const_int(n as u64, true)).map_err(llvm)?;
            }
            let t = unsafe { b.build_in_bounds_gep(tt, outs, &[i64t.const_int(idx as u64, false)], "t") }
                .map_err(llvm)?;
            let p = b.build_struct_gep(tt, t, 1, "dims").map_err(llvm)?;
            b.build_store(p, dims).map_err(llvm)?;
            roots.push((dims, root));
        }
        let scratch = match k.scratch {
            Some(_) => load_arg(n_in + n_out)?,
            None => self.ptr().const_null(),
        };
        let at = self.uk_args_type();
        let a = b.build_alloca(at, "ukargs").map_err(llvm)?;
        let fields: [BasicValueEnum; 10] = [
            ins.into(),
            i64t.const_int(n_in as u64, false).into(),
            outs.into(),
            i64t.const_int(n_out as u64, false).into(),
            self.i64_array(&format!("kiln.k{i}.iattr"), &call.iattr).into(),
            i64t.const_int(call.iattr.len() as u64, false).into(),
            self.f64_array(&format!("kiln.k{i}.fattr"), &call.fattr).into(),
            i64t.const_int(call.fattr.len() as u64, false).into(),
            scratch.into(),
            ctx.into(),
        ];
        for (fi, v) in fields.iter().enumerate() {
            let p = b.build_struct_gep(at, a, fi as u32, "f").map_err(llvm)?;
            b.build_store(p, *v).map_err(llvm)?;
        }
        let name = format!("kiln_uk_{}", call.symbol);
        let uk = self.module.get_function(&name).unwrap_or_else(|| {
            let ty = self.cx.i32_type().fn_type(&[self.ptr().into()], false);
            self.module.add_function(&name, ty, Some(Linkage::External))
        });
        let rc = b.build_call(uk, &[a.into()], "rc").map_err(llvm)?;
        let rc = rc
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| CodegenError::internal("ukernel returns i32"))?;
        for (dims, root) in roots {
            let at =
                unsafe { b.build_in_bounds_gep(i64t, dims, &[i64t.const_int(root.axis as u64, false)], "n") }
                    .map_err(llvm)?;
            let count = b.build_load(i64t, at, "count").map_err(llvm)?;
            for (j, axis) in root.outputs {
                let p = match self.parts.target.is_gpu() {
                    // On the device a library kernel's context is the frame.
                    true => crate::nvptx::kernel::count_slot(self.cx, b, ctx, graph, j)?,
                    false => {
                        let out_dims = self
                            .call_rt(
                                "kiln_rt_output_dims",
                                &[ctx.into(), self.cx.i32_type().const_int(j as u64, false).into()],
                            )?
                            .expect("ptr")
                            .into_pointer_value();
                        unsafe {
                            b.build_in_bounds_gep(i64t, out_dims, &[i64t.const_int(axis as u64, false)], "o")
                        }
                        .map_err(llvm)?
                    }
                };
                b.build_store(p, count).map_err(llvm)?;
            }
        }
        b.build_return(Some(&rc)).map_err(llvm)?;
        Ok(())
    }

    /// The input descriptors of a library kernel with many inputs (a Concat of thousands):
    /// copied from a constant table whose data pointers are null, then a loop sets each
    /// `data` from the argument slots — a function whose size does not depend on the count.
    pub(super) fn describe_in_loop(
        &self,
        i: usize,
        f: FunctionValue<'ctx>,
        ins: PointerValue<'ctx>,
        k: &Kernel,
    ) -> Result<()> {
        let b = &self.builder;
        let graph = self.parts.graph;
        let (i64t, tt, ptr) = (self.cx.i64_type(), self.tensor_type(), self.ptr());
        // Inputs share few shapes: one dims array per shape.
        let mut dims_of: HashMap<Vec<i64>, PointerValue<'ctx>> = HashMap::new();
        let mut rows = Vec::with_capacity(k.inputs.len());
        for v in &k.inputs {
            let row = match v.map(|v| graph.value_type(v)) {
                Some(ty) => {
                    let shape: Vec<i64> = ty
                        .fixed_shape()
                        .unwrap_or_default()
                        .iter()
                        .map(|&d| d as i64)
                        .collect();
                    let n = dims_of.len();
                    let dims = *dims_of
                        .entry(shape.clone())
                        .or_insert_with(|| self.i64_array(&format!("kiln.k{i}.dims{n}"), &shape));
                    [
                        ptr.const_null().into(),
                        dims.into(),
                        i64t.const_int(shape.len() as u64, false).into(),
                        i64t.const_int(ty.dtype as u64, false).into(),
                        i64t.const_int(shape.iter().product::<i64>() as u64, false).into(),
                    ]
                }
                None => [
                    ptr.const_null().into(),
                    ptr.const_null().into(),
                    i64t.const_zero().into(),
                    i64t.const_zero().into(),
                    i64t.const_zero().into(),
                ],
            };
            rows.push(tt.const_named_struct(&row));
        }
        let table = self.const_global(&format!("kiln.k{i}.ins"), tt.const_array(&rows).into(), 8);
        // kiln_tensor is five 8-byte fields.
        let bytes = i64t.const_int(40 * rows.len() as u64, false);
        b.build_memcpy(ins, 8, table.as_pointer_value(), 8, bytes)
            .map_err(llvm)?;
        // for (j = 0; j < n; j++) ins[j].data = args[j];   (input j is argument slot j)
        let args = f.get_nth_param(1).expect("args").into_pointer_value();
        let pre = b.get_insert_block().expect("positioned");
        let (body, done) = (
            self.cx.append_basic_block(f, "ins.loop"),
            self.cx.append_basic_block(f, "ins.done"),
        );
        b.build_unconditional_branch(body).map_err(llvm)?;
        b.position_at_end(body);
        let j = b.build_phi(i64t, "j").map_err(llvm)?;
        j.add_incoming(&[(&i64t.const_zero(), pre)]);
        let jv = j.as_basic_value().into_int_value();
        let src = unsafe { b.build_in_bounds_gep(ptr, args, &[jv], "slot") }.map_err(llvm)?;
        let data = b.build_load(ptr, src, "data").map_err(llvm)?;
        let t = unsafe { b.build_in_bounds_gep(tt, ins, &[jv], "t") }.map_err(llvm)?;
        let dst = b.build_struct_gep(tt, t, 0, "data.p").map_err(llvm)?;
        b.build_store(dst, data).map_err(llvm)?;
        let next = b
            .build_int_add(jv, i64t.const_int(1, false), "j.next")
            .map_err(llvm)?;
        j.add_incoming(&[(&next, body)]);
        let more = b
            .build_int_compare(
                IntPredicate::ULT,
                next,
                i64t.const_int(rows.len() as u64, false),
                "more",
            )
            .map_err(llvm)?;
        b.build_conditional_branch(more, body, done).map_err(llvm)?;
        b.position_at_end(done);
        Ok(())
    }

    /// Kernel `i`'s argument slots when it has many (a Concat of thousands of inputs): a loop
    /// over a constant table of (kind, index or offset) rows resolves each against `bases`
    /// (inputs, outputs, arena, weights), where straight-line code would be one basic block
    /// that grows with the graph and that LLVM's instruction scheduler takes quadratic time on.
    pub(super) fn fill_args_in_loop(
        &self,
        f: FunctionValue<'ctx>,
        i: usize,
        args: PointerValue<'ctx>,
        slots: &[Option<Storage>],
        bases: [PointerValue<'ctx>; 4],
    ) -> Result<()> {
        let b = &self.builder;
        let (i64t, ptr, i8t) = (self.cx.i64_type(), self.ptr(), self.cx.i8_type());
        // Kinds: 0 to 3 index `bases`; 4 is an absent operand (null).
        let row = |s: &Option<Storage>| -> [u64; 2] {
            match *s {
                Some(Storage::Input(j)) => [0, j as u64],
                Some(Storage::Output(j)) => [1, j as u64],
                Some(Storage::Arena(off)) => [2, off],
                Some(Storage::Weights(off)) => [3, off],
                None => [4, 0],
            }
        };
        let flat: Vec<i64> = slots.iter().flat_map(row).map(|v| v as i64).collect();
        let table = self.i64_array(&format!("kiln.k{i}.slots"), &flat);
        let pre = b.get_insert_block().expect("positioned");
        let bb = |name: &str| self.cx.append_basic_block(f, &format!("{name}{i}"));
        let (head, io, offset, null, store, done) = (
            bb("slots"),
            bb("slots.io"),
            bb("slots.offset"),
            bb("slots.null"),
            bb("slots.store"),
            bb("slots.done"),
        );
        b.build_unconditional_branch(head).map_err(llvm)?;
        b.position_at_end(head);
        let j = b.build_phi(i64t, "slot").map_err(llvm)?;
        j.add_incoming(&[(&i64t.const_zero(), pre)]);
        let jv = j.as_basic_value().into_int_value();
        let field = |k: u64, name: &str| -> Result<inkwell::values::IntValue<'ctx>> {
            let at = b
                .build_int_add(
                    b.build_int_mul(jv, i64t.const_int(2, false), "r").map_err(llvm)?,
                    i64t.const_int(k, false),
                    "at",
                )
                .map_err(llvm)?;
            let p = unsafe { b.build_in_bounds_gep(i64t, table, &[at], name) }.map_err(llvm)?;
            Ok(b.build_load(i64t, p, name).map_err(llvm)?.into_int_value())
        };
        let (kind, value) = (field(0, "kind")?, field(1, "value")?);
        // The base for kinds 0 to 3 (null for an absent operand, which goes to `null`).
        let base_of = |which: &[u64]| -> Result<PointerValue<'ctx>> {
            let mut p = ptr.const_null();
            for &k in which {
                let is = b
                    .build_int_compare(IntPredicate::EQ, kind, i64t.const_int(k, false), "is")
                    .map_err(llvm)?;
                p = b
                    .build_select(is, bases[k as usize], p, "base")
                    .map_err(llvm)?
                    .into_pointer_value();
            }
            Ok(p)
        };
        b.build_switch(
            kind,
            null,
            &[
                (i64t.const_int(0, false), io),
                (i64t.const_int(1, false), io),
                (i64t.const_int(2, false), offset),
                (i64t.const_int(3, false), offset),
            ],
        )
        .map_err(llvm)?;
        // An input or output: the caller's pointer array, entry `value`.
        b.position_at_end(io);
        let array = base_of(&[0, 1])?;
        let entry = unsafe { b.build_in_bounds_gep(ptr, array, &[value], "io.p") }.map_err(llvm)?;
        let from_io = b.build_load(ptr, entry, "io").map_err(llvm)?.into_pointer_value();
        b.build_unconditional_branch(store).map_err(llvm)?;
        // The arena or the weights: `value` bytes in.
        b.position_at_end(offset);
        let base = base_of(&[2, 3])?;
        let from_offset = unsafe { b.build_in_bounds_gep(i8t, base, &[value], "p") }.map_err(llvm)?;
        b.build_unconditional_branch(store).map_err(llvm)?;
        b.position_at_end(null);
        b.build_unconditional_branch(store).map_err(llvm)?;
        b.position_at_end(store);
        let p = b.build_phi(ptr, "arg").map_err(llvm)?;
        p.add_incoming(&[(&from_io, io), (&from_offset, offset), (&ptr.const_null(), null)]);
        let dst = unsafe { b.build_in_bounds_gep(ptr, args, &[jv], "dst") }.map_err(llvm)?;
        b.build_store(dst, p.as_basic_value()).map_err(llvm)?;
        let next = b
            .build_int_add(jv, i64t.const_int(1, false), "next")
            .map_err(llvm)?;
        j.add_incoming(&[(&next, store)]);
        let more = b
            .build_int_compare(
                IntPredicate::ULT,
                next,
                i64t.const_int(slots.len() as u64, false),
                "more",
            )
            .map_err(llvm)?;
        b.build_conditional_branch(more, head, done).map_err(llvm)?;
        b.position_at_end(done);
        Ok(())
    }
}
