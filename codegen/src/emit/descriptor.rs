//! The model descriptor the runtime reads: inputs and outputs, the weights, the arena, the
//! kernel table and, for CUDA, the device code and launches.

use super::signature::{signature_inputs, signature_json, signature_outputs};
use super::Emitter;
use crate::error::{CodegenError, Result};
use crate::gen::runtime_fn;
use inkwell::types::StructType;
use inkwell::values::{FunctionValue, GlobalValue, PointerValue};
use kiln_ir::TensorType;

impl<'a, 'ctx> Emitter<'a, 'ctx> {
    pub(super) fn io_descs(&self, tag: &str, items: &[(String, TensorType)]) -> Result<PointerValue<'ctx>> {
        let (p, i32t, i64t) = (self.ptr(), self.cx.i32_type(), self.cx.i64_type());
        let st = self.cx.struct_type(
            &[p.into(), i32t.into(), i32t.into(), p.into(), i64t.into()],
            false,
        );
        let mut vals = vec![];
        for (n, (name, ty)) in items.iter().enumerate() {
            let shape: Vec<i64> = ty
                .fixed_shape()
                .ok_or_else(|| {
                    CodegenError::unsupported(
                        name,
                        "graph",
                        format!("{tag} '{name}' has a dynamic shape {ty}; bind it with --input-shape"),
                    )
                })?
                .iter()
                .map(|&d| d as i64)
                .collect();
            let bytes = ty.size_bytes().unwrap_or(0) as u64;
            vals.push(st.const_named_struct(&[
                self.cstring(&format!("kiln.{tag}{n}.name"), name).into(),
                i32t.const_int(ty.dtype as u64, false).into(),
                i32t.const_int(shape.len() as u64, false).into(),
                self.i64_array(&format!("kiln.{tag}{n}.dims"), &shape).into(),
                i64t.const_int(bytes, false).into(),
            ]));
        }
        if vals.is_empty() {
            return Ok(p.const_null());
        }
        let arr = st.const_array(&vals);
        Ok(self
            .const_global(&format!("kiln.{tag}s"), arr.into(), 8)
            .as_pointer_value())
    }
}

impl<'a, 'ctx> Emitter<'a, 'ctx> {
    /// `kiln_cuda_desc` (kiln_cuda.h) of a CUDA model, or null.
    pub(super) fn cuda_desc(&self) -> Result<PointerValue<'ctx>> {
        let Some(code) = self.parts.cuda else {
            return Ok(self.ptr().const_null());
        };
        let (p, i32t, i64t) = (self.ptr(), self.cx.i32_type(), self.cx.i64_type());
        let u3 = i32t.array_type(3);
        let kt = self
            .cx
            .struct_type(&[p.into(), u3.into(), u3.into(), i32t.into(), i32t.into()], false);
        let u32s = |v: [u32; 3]| i32t.const_array(&v.map(|x| i32t.const_int(x as u64, false)));
        let rows: Vec<_> = code
            .launches
            .iter()
            .enumerate()
            .map(|(i, l)| {
                kt.const_named_struct(&[
                    self.cstring(&format!("kiln.cuda.entry{i}"), &l.entry).into(),
                    u32s(l.grid).into(),
                    u32s(l.block).into(),
                    i32t.const_int(l.shared_bytes as u64, false).into(),
                    i32t.const_zero().into(),
                ])
            })
            .collect();
        let kernels = self
            .const_global("kiln.cuda.kernels", kt.const_array(&rows).into(), 8)
            .as_pointer_value();
        let ct = self.cx.struct_type(
            &[i32t.into(), i32t.into(), i64t.into(), i64t.into(), i64t.into()],
            false,
        );
        let copies: Vec<_> = self
            .parts
            .plan
            .output_copies
            .iter()
            .map(|c| {
                let (kind, index, offset) = crate::nvptx::storage_code(c.from);
                ct.const_named_struct(&[
                    i32t.const_int(c.output as u64, false).into(),
                    i32t.const_int(kind, false).into(),
                    i64t.const_int(index, false).into(),
                    i64t.const_int(offset, false).into(),
                    i64t.const_int(c.bytes, false).into(),
                ])
            })
            .collect();
        let copies = self
            .const_global("kiln.cuda.copies", ct.const_array(&copies).into(), 8)
            .as_pointer_value();
        // Which graph output's dims each count after the error slot goes to.
        let count_type = self.cx.struct_type(&[i32t.into(), i32t.into()], false);
        let counts = crate::data_dependent::output_counts(self.parts.graph)?;
        let count_rows: Vec<_> = counts
            .iter()
            .map(|&(output, axis)| {
                count_type.const_named_struct(&[
                    i32t.const_int(output as u64, false).into(),
                    i32t.const_int(axis as u64, false).into(),
                ])
            })
            .collect();
        let count_table = match count_rows.is_empty() {
            true => p.const_null(),
            false => self
                .const_global("kiln.cuda.counts", count_type.const_array(&count_rows).into(), 8)
                .as_pointer_value(),
        };
        let weights = match self.parts.api.weights_file {
            Some(_) => p.const_null(),
            None => self
                .module
                .get_global(self.parts.weights_object.unwrap_or("kiln.weights"))
                .map(|g| g.as_pointer_value())
                .unwrap_or_else(|| p.const_null()),
        };
        let fns = [
            "kiln_rt_cuda_create",
            "kiln_rt_cuda_run_device",
            "kiln_rt_cuda_destroy",
        ]
        .map(|n| {
            runtime_fn(self.cx, self.module, n)
                .as_global_value()
                .as_pointer_value()
        });
        let st = self.cx.struct_type(
            &[
                p.into(),
                p.into(),
                i32t.into(),
                i32t.into(),
                p.into(),
                p.into(),
                p.into(),
                i64t.into(),
                p.into(),
                p.into(),
                p.into(),
                i32t.into(),
                p.into(),
            ],
            false,
        );
        let value = st.const_named_struct(&[
            self.cstring("kiln.cuda.ptx", &code.ptx).into(),
            self.cstring("kiln.cuda.sm", &format!("sm_{}", code.sm)).into(),
            i32t.const_int(code.launches.len() as u64, false).into(),
            i32t.const_int(self.parts.plan.output_copies.len() as u64, false)
                .into(),
            kernels.into(),
            copies.into(),
            weights.into(),
            i64t.const_int(self.parts.plan.weights.len() as u64, false).into(),
            fns[0].into(),
            fns[1].into(),
            fns[2].into(),
            i32t.const_int(counts.len() as u64, false).into(),
            count_table.into(),
        ]);
        Ok(self.const_global("kiln.cuda", value.into(), 8).as_pointer_value())
    }

    /// `kiln_batch_desc` of a model compiled for a batch range, or null.
    pub(super) fn batch_desc(&self) -> PointerValue<'ctx> {
        let Some(batch) = self.parts.batch else {
            return self.ptr().const_null();
        };
        let (p, i32t, i64t) = (self.ptr(), self.cx.i32_type(), self.cx.i64_type());
        let flags = |name: &str, v: &[bool]| {
            let vals: Vec<_> = v.iter().map(|&b| i32t.const_int(b as u64, false)).collect();
            let arr = if vals.is_empty() {
                i32t.const_array(&[i32t.const_zero()])
            } else {
                i32t.const_array(&vals)
            };
            self.const_global(name, arr.into(), 4).as_pointer_value()
        };
        let st = self
            .cx
            .struct_type(&[i64t.into(), i64t.into(), p.into(), p.into()], false);
        let value = st.const_named_struct(&[
            i64t.const_int(batch.lo as u64, false).into(),
            i64t.const_int(batch.hi as u64, false).into(),
            flags("kiln.batch.inputs", &batch.inputs).into(),
            flags("kiln.batch.outputs", &batch.outputs).into(),
        ]);
        self.const_global("kiln.batch", value.into(), 8)
            .as_pointer_value()
    }

    pub(super) fn weights_desc(&self, layout_hash: Option<u64>) -> PointerValue<'ctx> {
        let (Some(file), Some(hash)) = (&self.parts.api.weights_file, layout_hash) else {
            return self.ptr().const_null();
        };
        let (p, i64t) = (self.ptr(), self.cx.i64_type());
        let st = self.cx.struct_type(&[p.into(), p.into(), i64t.into()], false);
        let value = st.const_named_struct(&[
            self.cstring("kiln.weights_file", file).into(),
            self.cstring("kiln.weights_layout_hash", &crate::weights_file::hex(hash))
                .into(),
            i64t.const_int(self.parts.plan.weights.len() as u64, false).into(),
        ]);
        self.const_global("kiln.weights_desc", value.into(), 8)
            .as_pointer_value()
    }

    /// `kiln_model_desc` (kiln_rt.h).
    pub(super) fn model_desc_type(&self) -> StructType<'ctx> {
        let (p, i32t, i64t) = (self.ptr(), self.cx.i32_type(), self.cx.i64_type());
        self.cx.struct_type(
            &[
                p.into(),
                p.into(),
                p.into(),
                p.into(),
                p.into(),
                i32t.into(),
                i32t.into(),
                p.into(),
                p.into(),
                i64t.into(),
                i64t.into(),
                i64t.into(),
                p.into(),
                p.into(),
                // -- weights outside the binary --
                p.into(),
                // -- CUDA --
                p.into(),
                // -- batch range --
                p.into(),
            ],
            false,
        )
    }

    /// Bytes of working memory a context allocates: for a portable artifact, enough for any
    /// of its variants.
    pub(super) fn arena_bytes(&self) -> u64 {
        match self.parts.portable {
            Some(p) => p.variants.iter().map(|v| v.plan.arena_bytes).max().unwrap_or(0),
            None => self.parts.plan.arena_bytes,
        }
    }

    pub(super) fn model_desc(
        &self,
        run: FunctionValue<'ctx>,
        layout_hash: Option<u64>,
    ) -> Result<GlobalValue<'ctx>> {
        let parts = self.parts;
        let (i32t, i64t) = (self.cx.i32_type(), self.cx.i64_type());
        let inputs = signature_inputs(parts.graph);
        let outputs = signature_outputs(parts.graph);
        let st = self.model_desc_type();
        let sig = signature_json(parts, &inputs, &outputs, layout_hash);
        let kernels = self
            .profile_gen()
            .kernel_table_global(&crate::profile::kernel_table(parts.graph, parts.plan));
        let value = st.const_named_struct(&[
            self.cstring("kiln.name", parts.model_name).into(),
            self.cstring("kiln.version", env!("CARGO_PKG_VERSION")).into(),
            self.cstring("kiln.triple", &parts.target.triple).into(),
            self.cstring(
                "kiln.cpu_features",
                &parts.target.required_cpu_features().join(","),
            )
            .into(),
            self.cstring("kiln.signature", &sig).into(),
            i32t.const_int(inputs.len() as u64, false).into(),
            i32t.const_int(outputs.len() as u64, false).into(),
            self.io_descs("input", &inputs)?.into(),
            self.io_descs("output", &outputs)?.into(),
            i64t.const_int(parts.plan.arena_bytes, false).into(),
            i64t.const_int(parts.plan.thread_scratch_bytes, false).into(),
            i64t.const_int(parts.plan.kernels.len() as u64, false).into(),
            run.as_global_value().as_pointer_value().into(),
            kernels.into(),
            self.weights_desc(layout_hash).into(),
            self.cuda_desc()?.into(),
            self.batch_desc().into(),
        ]);
        Ok(self.const_global("kiln.model", value.into(), 8))
    }
}
