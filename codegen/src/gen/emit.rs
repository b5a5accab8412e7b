//! Small IR-building helpers shared by the generated kernels: constants, pointer arithmetic on
//! f32 buffers, vectors, intrinsics and structured control flow (counted loops, if/else).

use super::llvm;
use crate::error::Result;
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::intrinsics::Intrinsic;
use inkwell::module::Module;
use inkwell::types::{BasicType, BasicTypeEnum, VectorType};
use inkwell::values::BasicValue;
use inkwell::values::{
    BasicMetadataValueEnum, BasicValueEnum, FloatValue, FunctionValue, IntValue, PointerValue, VectorValue,
};
use inkwell::{AddressSpace, FloatPredicate, IntPredicate};

pub(crate) struct Emit<'a, 'ctx> {
    pub cx: &'ctx Context,
    pub module: &'a Module<'ctx>,
    pub b: &'a Builder<'ctx>,
    pub f: FunctionValue<'ctx>,
    /// The function runs on a CPU with AVX-512 (`with_target`): 16-lane vector math may use
    /// its instructions (`vmath::exp`'s `vscalefps`). Off for GPU kernels and by default.
    pub avx512: bool,
}

impl<'a, 'ctx> Emit<'a, 'ctx> {
    pub fn new(
        cx: &'ctx Context,
        module: &'a Module<'ctx>,
        b: &'a Builder<'ctx>,
        f: FunctionValue<'ctx>,
    ) -> Self {
        Emit {
            cx,
            module,
            b,
            f,
            avx512: false,
        }
    }

    /// The same builder for a CPU kernel of `target`: what its instructions allow.
    pub fn with_target(mut self, target: &crate::target::TargetDesc) -> Self {
        self.avx512 = target.isa == crate::target::Isa::Avx512;
        self
    }

    pub fn ptr_ty(&self) -> inkwell::types::PointerType<'ctx> {
        self.cx.ptr_type(AddressSpace::default())
    }

    pub fn vty(&self, lanes: u32) -> VectorType<'ctx> {
        self.cx.f32_type().vec_type(lanes)
    }

    pub fn i64c(&self, v: i64) -> IntValue<'ctx> {
        self.cx.i64_type().const_int(v as u64, true)
    }

    pub fn i32c(&self, v: i32) -> IntValue<'ctx> {
        self.cx.i32_type().const_int(v as u32 as u64, true)
    }

    pub fn f32c(&self, v: f32) -> FloatValue<'ctx> {
        self.cx.f32_type().const_float(v as f64)
    }

    pub fn add(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
        self.b.build_int_add(a, b, "").map_err(llvm)
    }

    pub fn sub(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
        self.b.build_int_sub(a, b, "").map_err(llvm)
    }

    pub fn mul(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
        self.b.build_int_mul(a, b, "").map_err(llvm)
    }

    pub fn mulc(&self, a: IntValue<'ctx>, c: i64) -> Result<IntValue<'ctx>> {
        if c == 1 {
            return Ok(a);
        }
        self.mul(a, self.i64c(c))
    }

    pub fn addc(&self, a: IntValue<'ctx>, c: i64) -> Result<IntValue<'ctx>> {
        if c == 0 {
            return Ok(a);
        }
        self.add(a, self.i64c(c))
    }

    pub fn udivc(&self, a: IntValue<'ctx>, c: i64) -> Result<IntValue<'ctx>> {
        if c == 1 {
            return Ok(a);
        }
        self.b.build_int_unsigned_div(a, self.i64c(c), "").map_err(llvm)
    }

    pub fn uremc(&self, a: IntValue<'ctx>, c: i64) -> Result<IntValue<'ctx>> {
        if c == 1 {
            return Ok(self.i64c(0));
        }
        self.b.build_int_unsigned_rem(a, self.i64c(c), "").map_err(llvm)
    }

    /// The coordinates of the row-major flat index `i` over `dims`, outermost first; the
    /// outermost takes what is left (an index past the end stays past it).
    pub fn unravel(&self, i: IntValue<'ctx>, dims: &[usize]) -> Result<Vec<IntValue<'ctx>>> {
        let mut coord = vec![self.i64c(0); dims.len()];
        let mut rest = i;
        for d in (0..dims.len()).rev() {
            if d == 0 {
                coord[0] = rest;
            } else {
                coord[d] = self.uremc(rest, dims[d] as i64)?;
                rest = self.udivc(rest, dims[d] as i64)?;
            }
        }
        Ok(coord)
    }

    pub fn icmp(&self, p: IntPredicate, a: IntValue<'ctx>, b: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
        self.b.build_int_compare(p, a, b, "").map_err(llvm)
    }

    /// `c ? a : b` for integers.
    pub fn select_int(
        &self,
        c: IntValue<'ctx>,
        a: IntValue<'ctx>,
        b: IntValue<'ctx>,
    ) -> Result<IntValue<'ctx>> {
        Ok(self.b.build_select(c, a, b, "").map_err(llvm)?.into_int_value())
    }

    /// `c ? a : b` for floats.
    pub fn select_float(
        &self,
        c: IntValue<'ctx>,
        a: FloatValue<'ctx>,
        b: FloatValue<'ctx>,
    ) -> Result<FloatValue<'ctx>> {
        Ok(self.b.build_select(c, a, b, "").map_err(llvm)?.into_float_value())
    }

    /// A compare of two floats (`fcmp` compares vectors).
    pub fn fcmp_scalar(
        &self,
        p: FloatPredicate,
        a: FloatValue<'ctx>,
        b: FloatValue<'ctx>,
    ) -> Result<IntValue<'ctx>> {
        self.b.build_float_compare(p, a, b, "").map_err(llvm)
    }

    /// `v` (signed) clamped to `[lo, hi]`.
    pub fn clamp_int(&self, v: IntValue<'ctx>, lo: i64, hi: i64) -> Result<IntValue<'ctx>> {
        let v = self.select_int(self.icmp(IntPredicate::SLT, v, self.i64c(lo))?, self.i64c(lo), v)?;
        self.select_int(self.icmp(IntPredicate::SGT, v, self.i64c(hi))?, self.i64c(hi), v)
    }

    /// `v` clamped to `[lo, hi]` by ordered compares, so NaN passes through (f32 or f64).
    pub fn clamp_float(
        &self,
        v: FloatValue<'ctx>,
        lo: FloatValue<'ctx>,
        hi: FloatValue<'ctx>,
    ) -> Result<FloatValue<'ctx>> {
        let below = self
            .b
            .build_float_compare(FloatPredicate::OLT, v, lo, "")
            .map_err(llvm)?;
        let v = self
            .b
            .build_select(below, lo, v, "")
            .map_err(llvm)?
            .into_float_value();
        let above = self
            .b
            .build_float_compare(FloatPredicate::OGT, v, hi, "")
            .map_err(llvm)?;
        Ok(self
            .b
            .build_select(above, hi, v, "")
            .map_err(llvm)?
            .into_float_value())
    }

    /// Unsigned minimum of two i64 values.
    pub fn umin(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
        let lt = self.icmp(IntPredicate::ULT, a, b)?;
        Ok(self.b.build_select(lt, a, b, "").map_err(llvm)?.into_int_value())
    }

    /// `p + i` f32 elements.
    pub fn gep_f32(&self, p: PointerValue<'ctx>, i: IntValue<'ctx>) -> Result<PointerValue<'ctx>> {
        // SAFETY (of the IR): callers index inside the buffers the kernel was planned for.
        unsafe { self.b.build_in_bounds_gep(self.cx.f32_type(), p, &[i], "") }.map_err(llvm)
    }

    /// `p + i` bytes (u8 elements).
    pub fn gep_u8(&self, p: PointerValue<'ctx>, i: IntValue<'ctx>) -> Result<PointerValue<'ctx>> {
        // SAFETY (of the IR): callers index inside the buffers the kernel was planned for.
        unsafe { self.b.build_in_bounds_gep(self.cx.i8_type(), p, &[i], "") }.map_err(llvm)
    }

    /// `p + i` bf16 elements.
    pub fn gep_bf16(&self, p: PointerValue<'ctx>, i: IntValue<'ctx>) -> Result<PointerValue<'ctx>> {
        // SAFETY (of the IR): callers index inside the buffers the kernel was planned for.
        unsafe { self.b.build_in_bounds_gep(self.cx.bf16_type(), p, &[i], "") }.map_err(llvm)
    }

    /// Stores f32 `v` (a scalar or vector) at `p` as bf16, rounded to nearest even
    /// (`vcvtneps2bf16` with avx512_bf16). bf16 elements are only 2-byte aligned.
    pub fn store_as_bf16(&self, p: PointerValue<'ctx>, v: BasicValueEnum<'ctx>) -> Result<()> {
        let narrow = match v {
            BasicValueEnum::VectorValue(x) => {
                let ty = self.cx.bf16_type().vec_type(x.get_type().get_size());
                self.b.build_float_trunc(x, ty, "").map_err(llvm)?.into()
            }
            BasicValueEnum::FloatValue(x) => {
                let t = self
                    .b
                    .build_float_trunc(x, self.cx.bf16_type(), "")
                    .map_err(llvm)?;
                BasicValueEnum::from(t)
            }
            _ => {
                return Err(crate::error::CodegenError::internal(
                    "store_as_bf16 of a non-float",
                ))
            }
        };
        let st = self.b.build_store(p, narrow).map_err(llvm)?;
        st.set_alignment(2).map_err(llvm)?;
        Ok(())
    }

    pub fn gep_f32c(&self, p: PointerValue<'ctx>, i: i64) -> Result<PointerValue<'ctx>> {
        if i == 0 {
            return Ok(p);
        }
        self.gep_f32(p, self.i64c(i))
    }

    pub fn gep_ptr(&self, p: PointerValue<'ctx>, i: i64) -> Result<PointerValue<'ctx>> {
        // SAFETY (of the IR): an index into an array of pointers the kernel built.
        unsafe { self.b.build_in_bounds_gep(self.ptr_ty(), p, &[self.i64c(i)], "") }.map_err(llvm)
    }

    pub fn load_ptr(&self, p: PointerValue<'ctx>) -> Result<PointerValue<'ctx>> {
        Ok(self
            .b
            .build_load(self.ptr_ty(), p, "")
            .map_err(llvm)?
            .into_pointer_value())
    }

    /// Element `i` of an i64 tensor at `p`.
    pub fn load_i64(&self, p: PointerValue<'ctx>, i: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
        let i64t = self.cx.i64_type();
        // SAFETY (of the IR): the callers' indices lie inside the tensor.
        let at = unsafe { self.b.build_in_bounds_gep(i64t, p, &[i], "") }.map_err(llvm)?;
        Ok(self.b.build_load(i64t, at, "").map_err(llvm)?.into_int_value())
    }

    pub fn load_f32(&self, p: PointerValue<'ctx>) -> Result<FloatValue<'ctx>> {
        Ok(self
            .b
            .build_load(self.cx.f32_type(), p, "")
            .map_err(llvm)?
            .into_float_value())
    }

    pub fn store<V: inkwell::values::BasicValue<'ctx>>(&self, p: PointerValue<'ctx>, v: V) -> Result<()> {
        let st = self.b.build_store(p, v).map_err(llvm)?;
        // Buffers are only guaranteed f32-aligned (packed constants, offsets into tensors).
        st.set_alignment(4).map_err(llvm)?;
        Ok(())
    }

    pub fn load_vec(&self, p: PointerValue<'ctx>, lanes: u32) -> Result<VectorValue<'ctx>> {
        let v = self.b.build_load(self.vty(lanes), p, "").map_err(llvm)?;
        v.as_instruction_value()
            .expect("load is an instruction")
            .set_alignment(4)
            .map_err(llvm)?;
        Ok(v.into_vector_value())
    }

    pub fn splat(&self, x: FloatValue<'ctx>, lanes: u32) -> Result<VectorValue<'ctx>> {
        let ty = self.vty(lanes);
        let v = self
            .b
            .build_insert_element(ty.get_poison(), x, self.i32c(0), "")
            .map_err(llvm)?;
        let mask = self.cx.i32_type().vec_type(lanes).const_zero();
        self.b
            .build_shuffle_vector(v, ty.get_poison(), mask, "")
            .map_err(llvm)
    }

    /// The bits of a float vector as i32 lanes (the integer kernels keep i32 values in the f32
    /// kernels' vectors and memory).
    pub fn to_i32s(&self, v: VectorValue<'ctx>) -> Result<VectorValue<'ctx>> {
        let ty = self.cx.i32_type().vec_type(v.get_type().get_size());
        Ok(self
            .b
            .build_bit_cast(v, ty, "")
            .map_err(llvm)?
            .into_vector_value())
    }

    /// The bits of an i32 vector as f32 lanes (the inverse of [`Emit::to_i32s`]).
    pub fn to_f32s(&self, v: VectorValue<'ctx>) -> Result<VectorValue<'ctx>> {
        let ty = self.cx.f32_type().vec_type(v.get_type().get_size());
        Ok(self
            .b
            .build_bit_cast(v, ty, "")
            .map_err(llvm)?
            .into_vector_value())
    }

    /// The byte at `p`, zero-extended to i32.
    pub fn load_u8_as_i32(&self, p: PointerValue<'ctx>) -> Result<IntValue<'ctx>> {
        let byte = self
            .b
            .build_load(self.cx.i8_type(), p, "")
            .map_err(llvm)?
            .into_int_value();
        self.b
            .build_int_z_extend(byte, self.cx.i32_type(), "")
            .map_err(llvm)
    }

    /// `lanes` bytes at `p` (any alignment), zero-extended to i32 lanes.
    pub fn load_u8s_as_i32s(&self, p: PointerValue<'ctx>, lanes: u32) -> Result<VectorValue<'ctx>> {
        let bytes = self
            .b
            .build_load(self.cx.i8_type().vec_type(lanes), p, "")
            .map_err(llvm)?;
        bytes
            .as_instruction_value()
            .expect("load is an instruction")
            .set_alignment(1)
            .map_err(llvm)?;
        self.b
            .build_int_z_extend(bytes.into_vector_value(), self.cx.i32_type().vec_type(lanes), "")
            .map_err(llvm)
    }

    pub fn splat_i32(&self, x: IntValue<'ctx>, lanes: u32) -> Result<VectorValue<'ctx>> {
        let ty = self.cx.i32_type().vec_type(lanes);
        let v = self
            .b
            .build_insert_element(ty.get_poison(), x, self.i32c(0), "")
            .map_err(llvm)?;
        let mask = self.cx.i32_type().vec_type(lanes).const_zero();
        self.b
            .build_shuffle_vector(v, ty.get_poison(), mask, "")
            .map_err(llvm)
    }

    /// `<0, 1, ..., lanes-1>` as i32.
    pub fn iota_i32(&self, lanes: u32) -> VectorValue<'ctx> {
        let vals: Vec<IntValue> = (0..lanes).map(|i| self.i32c(i as i32)).collect();
        VectorType::const_vector(&vals)
    }

    pub fn zero_vec(&self, lanes: u32) -> VectorValue<'ctx> {
        self.vty(lanes).const_zero()
    }

    /// Calls an overloaded intrinsic.
    pub fn intrinsic(
        &self,
        name: &str,
        types: &[BasicTypeEnum<'ctx>],
        args: &[BasicMetadataValueEnum<'ctx>],
    ) -> Result<BasicValueEnum<'ctx>> {
        let call = self.call_intrinsic(name, types, args)?;
        call.try_as_basic_value()
            .basic()
            .ok_or_else(|| crate::error::CodegenError::internal(format!("{name} returns nothing")))
    }

    /// Calls the C math library's double-precision `name` (`exp`, `log`, `pow`, `sin`, ...) on
    /// f64 `args`. On the GPU the call becomes libdevice's (`nvptx::libdevice`); the host's
    /// libm answers it on the CPU and in emulation.
    pub fn call_libm(&self, name: &str, args: &[FloatValue<'ctx>]) -> Result<FloatValue<'ctx>> {
        let f64t = self.cx.f64_type();
        let params: Vec<_> = args.iter().map(|_| f64t.into()).collect();
        let f = self
            .module
            .get_function(name)
            .unwrap_or_else(|| self.module.add_function(name, f64t.fn_type(&params, false), None));
        let args: Vec<_> = args.iter().map(|a| (*a).into()).collect();
        Ok(self
            .b
            .build_call(f, &args, "")
            .map_err(llvm)?
            .try_as_basic_value()
            .basic()
            .expect("a double")
            .into_float_value())
    }

    /// Calls an overloaded intrinsic that returns nothing.
    pub fn intrinsic_void(
        &self,
        name: &str,
        types: &[BasicTypeEnum<'ctx>],
        args: &[BasicMetadataValueEnum<'ctx>],
    ) -> Result<()> {
        self.call_intrinsic(name, types, args).map(|_| ())
    }

    fn call_intrinsic(
        &self,
        name: &str,
        types: &[BasicTypeEnum<'ctx>],
        args: &[BasicMetadataValueEnum<'ctx>],
    ) -> Result<inkwell::values::CallSiteValue<'ctx>> {
        let i = Intrinsic::find(name)
            .ok_or_else(|| crate::error::CodegenError::internal(format!("no intrinsic {name}")))?;
        let decl = i
            .get_declaration(self.module, types)
            .ok_or_else(|| crate::error::CodegenError::internal(format!("cannot declare {name}")))?;
        self.b.build_call(decl, args, "").map_err(llvm)
    }

    /// Hints that the cache line at `p + bytes` will be read soon, into L2 (`prefetcht1`).
    /// A prefetch never faults, so the address may lie past the buffer's end.
    pub fn prefetch_l2(&self, p: PointerValue<'ctx>, bytes: IntValue<'ctx>) -> Result<()> {
        // SAFETY (of the IR): a plain (not inbounds) GEP, only used as a prefetch address.
        let at = unsafe { self.b.build_gep(self.cx.i8_type(), p, &[bytes], "") }.map_err(llvm)?;
        let i32t = self.cx.i32_type();
        // (address, read, locality 2 = keep in L2, data cache)
        let args = [
            at.into(),
            i32t.const_zero().into(),
            i32t.const_int(2, false).into(),
            i32t.const_int(1, false).into(),
        ];
        self.intrinsic_void("llvm.prefetch", &[self.ptr_ty().into()], &args)
    }

    pub fn fma(
        &self,
        a: VectorValue<'ctx>,
        b: VectorValue<'ctx>,
        c: VectorValue<'ctx>,
    ) -> Result<VectorValue<'ctx>> {
        let ty = a.get_type().as_basic_type_enum();
        Ok(self
            .intrinsic("llvm.fma", &[ty], &[a.into(), b.into(), c.into()])?
            .into_vector_value())
    }

    pub fn fadd(&self, a: VectorValue<'ctx>, b: VectorValue<'ctx>) -> Result<VectorValue<'ctx>> {
        self.b.build_float_add(a, b, "").map_err(llvm)
    }

    pub fn fmul(&self, a: VectorValue<'ctx>, b: VectorValue<'ctx>) -> Result<VectorValue<'ctx>> {
        self.b.build_float_mul(a, b, "").map_err(llvm)
    }

    pub fn fcmp(
        &self,
        p: FloatPredicate,
        a: VectorValue<'ctx>,
        b: VectorValue<'ctx>,
    ) -> Result<VectorValue<'ctx>> {
        self.b.build_float_compare(p, a, b, "").map_err(llvm)
    }

    pub fn vselect(
        &self,
        m: VectorValue<'ctx>,
        a: VectorValue<'ctx>,
        b: VectorValue<'ctx>,
    ) -> Result<VectorValue<'ctx>> {
        Ok(self
            .b
            .build_select(m, a, b, "")
            .map_err(llvm)?
            .into_vector_value())
    }

    /// `llvm.masked.load` of `lanes` f32 from `p`; masked-off lanes are 0 and not accessed.
    pub fn masked_load(
        &self,
        p: PointerValue<'ctx>,
        mask: VectorValue<'ctx>,
        lanes: u32,
    ) -> Result<VectorValue<'ctx>> {
        let vt = self.vty(lanes);
        Ok(self
            .intrinsic(
                "llvm.masked.load",
                &[vt.into(), self.ptr_ty().into()],
                &[p.into(), self.i32c(4).into(), mask.into(), vt.const_zero().into()],
            )?
            .into_vector_value())
    }

    /// `llvm.masked.store` of the lanes of `v` that `mask` selects at `p`, aligned to `align`
    /// bytes (its element size); masked-off lanes are not accessed.
    pub fn masked_store(
        &self,
        p: PointerValue<'ctx>,
        v: VectorValue<'ctx>,
        mask: VectorValue<'ctx>,
        align: i32,
    ) -> Result<()> {
        let vt = v.get_type();
        self.intrinsic_void(
            "llvm.masked.store",
            &[vt.into(), self.ptr_ty().into()],
            &[v.into(), p.into(), self.i32c(align).into(), mask.into()],
        )
    }

    /// `llvm.masked.gather` of f32 at `base + idx[j]` (i32 element indices); masked-off lanes are 0.
    pub fn masked_gather(
        &self,
        base: PointerValue<'ctx>,
        idx: VectorValue<'ctx>,
        mask: VectorValue<'ctx>,
        lanes: u32,
    ) -> Result<VectorValue<'ctx>> {
        let i64t = self.cx.i64_type();
        let base_i = self.b.build_ptr_to_int(base, i64t, "").map_err(llvm)?;
        let base_v = {
            let v = self
                .b
                .build_insert_element(i64t.vec_type(lanes).get_poison(), base_i, self.i32c(0), "")
                .map_err(llvm)?;
            let m = self.cx.i32_type().vec_type(lanes).const_zero();
            self.b
                .build_shuffle_vector(v, i64t.vec_type(lanes).get_poison(), m, "")
                .map_err(llvm)?
        };
        let idx64 = self
            .b
            .build_int_s_extend(idx, i64t.vec_type(lanes), "")
            .map_err(llvm)?;
        let four = VectorType::const_vector(&vec![i64t.const_int(4, false); lanes as usize]);
        let off = self.b.build_int_mul(idx64, four, "").map_err(llvm)?;
        let addr = self.b.build_int_add(base_v, off, "").map_err(llvm)?;
        let ptrs = self
            .b
            .build_int_to_ptr(addr, self.ptr_ty().vec_type(lanes), "")
            .map_err(llvm)?;
        let vt = self.vty(lanes);
        Ok(self
            .intrinsic(
                "llvm.masked.gather",
                &[vt.into(), self.ptr_ty().vec_type(lanes).into()],
                &[
                    ptrs.into(),
                    self.i32c(4).into(),
                    mask.into(),
                    vt.const_zero().into(),
                ],
            )?
            .into_vector_value())
    }

    /// An alloca in the function's entry block (so SROA promotes it).
    pub fn entry_alloca<T: BasicType<'ctx>>(&self, ty: T, name: &str) -> Result<PointerValue<'ctx>> {
        let entry = self
            .f
            .get_first_basic_block()
            .expect("function has an entry block");
        let tmp = self.cx.create_builder();
        match entry.get_first_instruction() {
            Some(i) => tmp.position_before(&i),
            None => tmp.position_at_end(entry),
        }
        let a = tmp.build_alloca(ty, name).map_err(llvm)?;
        a.as_instruction_value()
            .expect("alloca is an instruction")
            .set_alignment(64)
            .map_err(llvm)?;
        Ok(a)
    }

    /// `for (i = start; i < end; i += step) body(i)` with an unsigned i64 counter.
    pub fn for_range(
        &self,
        start: IntValue<'ctx>,
        end: IntValue<'ctx>,
        step: i64,
        mut body: impl FnMut(IntValue<'ctx>) -> Result<()>,
    ) -> Result<()> {
        let pre = self.b.get_insert_block().expect("builder is positioned");
        let head = self.cx.append_basic_block(self.f, "loop");
        let bodyb = self.cx.append_basic_block(self.f, "body");
        let exit = self.cx.append_basic_block(self.f, "exit");
        let enter = self.icmp(IntPredicate::ULT, start, end)?;
        self.b.build_conditional_branch(enter, head, exit).map_err(llvm)?;
        self.b.position_at_end(head);
        let phi = self.b.build_phi(self.cx.i64_type(), "i").map_err(llvm)?;
        phi.add_incoming(&[(&start, pre)]);
        let i = phi.as_basic_value().into_int_value();
        self.b.build_unconditional_branch(bodyb).map_err(llvm)?;
        self.b.position_at_end(bodyb);
        body(i)?;
        let next = self.addc(i, step)?;
        let latch = self.b.get_insert_block().expect("builder is positioned");
        phi.add_incoming(&[(&next, latch)]);
        let more = self.icmp(IntPredicate::ULT, next, end)?;
        self.b.build_conditional_branch(more, head, exit).map_err(llvm)?;
        self.b.position_at_end(exit);
        Ok(())
    }

    /// Calls `step(x0, mask)` for x0 = 0, lanes, 2·lanes, … below `n`, `mask` (`<lanes x i1>`)
    /// selecting the lanes x0 + j < n: a loop of whole vectors whose last one is cut.
    pub fn for_masked(
        &self,
        n: IntValue<'ctx>,
        lanes: u32,
        mut step: impl FnMut(IntValue<'ctx>, VectorValue<'ctx>) -> Result<()>,
    ) -> Result<()> {
        let iota = self.iota_i32(lanes);
        let steps = self.udivc(self.addc(n, lanes as i64 - 1)?, lanes as i64)?;
        self.for_range(self.i64c(0), steps, 1, |x| {
            let x0 = self.mulc(x, lanes as i64)?;
            let left = self
                .b
                .build_int_truncate(self.sub(n, x0)?, self.cx.i32_type(), "")
                .map_err(llvm)?;
            let mask = self
                .b
                .build_int_compare(IntPredicate::SLT, iota, self.splat_i32(left, lanes)?, "")
                .map_err(llvm)?;
            step(x0, mask)
        })
    }

    pub fn for_n(&self, n: i64, body: impl FnMut(IntValue<'ctx>) -> Result<()>) -> Result<()> {
        self.for_range(self.i64c(0), self.i64c(n), 1, body)
    }

    pub fn if_then(&self, cond: IntValue<'ctx>, then: impl FnOnce() -> Result<()>) -> Result<()> {
        let t = self.cx.append_basic_block(self.f, "then");
        let join = self.cx.append_basic_block(self.f, "join");
        self.b.build_conditional_branch(cond, t, join).map_err(llvm)?;
        self.b.position_at_end(t);
        then()?;
        self.b.build_unconditional_branch(join).map_err(llvm)?;
        self.b.position_at_end(join);
        Ok(())
    }

    pub fn if_else(
        &self,
        cond: IntValue<'ctx>,
        then: impl FnOnce() -> Result<()>,
        otherwise: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let t = self.cx.append_basic_block(self.f, "then");
        let e = self.cx.append_basic_block(self.f, "else");
        let join = self.cx.append_basic_block(self.f, "join");
        self.b.build_conditional_branch(cond, t, e).map_err(llvm)?;
        self.b.position_at_end(t);
        then()?;
        self.b.build_unconditional_branch(join).map_err(llvm)?;
        self.b.position_at_end(e);
        otherwise()?;
        self.b.build_unconditional_branch(join).map_err(llvm)?;
        self.b.position_at_end(join);
        Ok(())
    }
}
