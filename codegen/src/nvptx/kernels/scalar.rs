//! Scalar reads and writes for the GPU kernels that compute in f64 as the library kernels and
//! the reference do (losses, the general attention): any float element as f64, an f64 rounded
//! to a float dtype, index elements as i64.

use crate::error::Result;
use crate::gen::elementwise as ew;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use kiln_ir::DType;

/// The f64 at `p` (a local of the kernel).
pub fn load_local<'ctx>(e: &Emit<'_, 'ctx>, p: PointerValue<'ctx>) -> Result<FloatValue<'ctx>> {
    Ok(e.b
        .build_load(e.cx.f64_type(), p, "")
        .map_err(llvm)?
        .into_float_value())
}

/// Element `i` of a float tensor of `dtype` (f16, bf16, f32 or f64), as f64.
pub fn load_real<'ctx>(
    e: &Emit<'_, 'ctx>,
    base: PointerValue<'ctx>,
    dtype: DType,
    i: IntValue<'ctx>,
) -> Result<FloatValue<'ctx>> {
    let v = ew::load_one(e, base, dtype, i)?.into_float_value();
    if dtype == DType::F64 {
        return Ok(v);
    }
    e.b.build_float_ext(v, e.cx.f64_type(), "").map_err(llvm)
}

/// `v` rounded to `dtype`'s precision (once; bf16 from the f32 nearest `v`), in the register
/// type the elementwise loads and stores use for it: f64 for f64, f32 otherwise.
fn narrow<'ctx>(e: &Emit<'_, 'ctx>, dtype: DType, v: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
    let f32t = e.cx.f32_type();
    Ok(match dtype {
        DType::F64 => v,
        DType::F16 => {
            let h = e.b.build_float_trunc(v, e.cx.f16_type(), "").map_err(llvm)?;
            e.b.build_float_ext(h, f32t, "").map_err(llvm)?
        }
        DType::BF16 => ew::round_bf16_one(e, e.b.build_float_trunc(v, f32t, "").map_err(llvm)?)?,
        _ => e.b.build_float_trunc(v, f32t, "").map_err(llvm)?,
    })
}

/// `v` rounded to `dtype`'s precision, as f64 again: where the reference rounds a stage's
/// result to the operator's (or its softmax's) dtype.
pub fn round_to<'ctx>(e: &Emit<'_, 'ctx>, dtype: DType, v: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
    if dtype == DType::F64 {
        return Ok(v);
    }
    e.b.build_float_ext(narrow(e, dtype, v)?, e.cx.f64_type(), "")
        .map_err(llvm)
}

/// Stores the f64 `v` as element `i` of a float tensor of `dtype`, rounded once.
pub fn store_real<'ctx>(
    e: &Emit<'_, 'ctx>,
    base: PointerValue<'ctx>,
    dtype: DType,
    i: IntValue<'ctx>,
    v: FloatValue<'ctx>,
) -> Result<()> {
    ew::store_one(e, base, dtype, i, narrow(e, dtype, v)?.into())
}

/// Element `i` of a tensor of any numeric dtype, as f64 (what the library kernels'
/// `kiln_load_f64` reads: integers converted exactly below 2^53).
pub fn load_any_f64<'ctx>(
    e: &Emit<'_, 'ctx>,
    base: PointerValue<'ctx>,
    dtype: DType,
    i: IntValue<'ctx>,
) -> Result<FloatValue<'ctx>> {
    if dtype.is_float() {
        return load_real(e, base, dtype, i);
    }
    let v = ew::load_one(e, base, dtype, i)?.into_int_value();
    let f64t = e.cx.f64_type();
    // Narrow integers are held exactly (sign- or zero-extended) in i32; bool is one bit.
    match dtype {
        DType::U32 | DType::U64 | DType::Bool => e.b.build_unsigned_int_to_float(v, f64t, ""),
        _ => e.b.build_signed_int_to_float(v, f64t, ""),
    }
    .map_err(llvm)
}

/// Element `i` of an i32 or i64 tensor, as i64.
pub fn load_index<'ctx>(
    e: &Emit<'_, 'ctx>,
    base: PointerValue<'ctx>,
    dtype: DType,
    i: IntValue<'ctx>,
) -> Result<IntValue<'ctx>> {
    load_int(e, base, dtype, i)
}

/// Element `i` of an integer tensor of any width, sign- or zero-extended to i64 as its dtype
/// is signed or not.
pub fn load_int<'ctx>(
    e: &Emit<'_, 'ctx>,
    base: PointerValue<'ctx>,
    dtype: DType,
    i: IntValue<'ctx>,
) -> Result<IntValue<'ctx>> {
    let v = ew::load_one(e, base, dtype, i)?.into_int_value();
    if v.get_type().get_bit_width() == 64 {
        return Ok(v);
    }
    if dtype.is_signed_int() {
        e.b.build_int_s_extend(v, e.cx.i64_type(), "").map_err(llvm)
    } else {
        e.b.build_int_z_extend(v, e.cx.i64_type(), "").map_err(llvm)
    }
}
