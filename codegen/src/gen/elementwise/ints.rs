//! Integer arithmetic of every width, as the reference computes it (`kiln_ir::ops::elementwise`:
//! fixed-width wrapping, division by zero giving 0, ONNX's shift rules).
//!
//! Registers hold 32 or 64 bits (`reg_type`). The 8- and 16-bit types are kept *canonical* in
//! i32 lanes: the exact value, sign-extended for i8/i16 and zero-extended for u8/u16, so that
//! signed compares, division and min/max on the register give the narrow type's results, and
//! every operator's result is brought back to that form (`normalize`: truncate to the width,
//! extend by the type's sign), which is the wrap. u32 and u64 fill their registers: they use
//! the unsigned compares and divisions.

use super::{select, Emit};
use crate::error::Result;
use crate::gen::llvm;
use inkwell::types::{IntType, VectorType};
use inkwell::values::VectorValue;
use inkwell::IntPredicate;
use kiln_ir::{Binary, DType};

/// An integer dtype kept in a wider register: its width in bits and whether it is signed.
pub(super) fn narrow(d: DType) -> Option<(u32, bool)> {
    match d {
        DType::I8 => Some((8, true)),
        DType::U8 => Some((8, false)),
        DType::I16 => Some((16, true)),
        DType::U16 => Some((16, false)),
        _ => None,
    }
}

/// The LLVM integer type of `bits` (8, 16, 32 or 64) bits.
pub(super) fn int_type<'ctx>(e: &Emit<'_, 'ctx>, bits: u32) -> IntType<'ctx> {
    match bits {
        8 => e.cx.i8_type(),
        16 => e.cx.i16_type(),
        32 => e.cx.i32_type(),
        _ => e.cx.i64_type(),
    }
}

/// An integer dtype that fills its register and compares and divides unsigned.
pub(super) fn is_unsigned_full(d: DType) -> bool {
    matches!(d, DType::U32 | DType::U64)
}

/// `x` brought back to `d`'s canonical form after an operation that may have left the range
/// (the wrap of fixed-width arithmetic); other dtypes are returned as they are.
pub(super) fn normalize<'ctx>(
    e: &Emit<'_, 'ctx>,
    x: VectorValue<'ctx>,
    d: DType,
) -> Result<VectorValue<'ctx>> {
    let Some((bits, signed)) = narrow(d) else {
        return Ok(x);
    };
    let t = x.get_type();
    let n = t.get_size();
    let short =
        e.b.build_int_truncate(x, int_type(e, bits).vec_type(n), "")
            .map_err(llvm)?;
    if signed {
        e.b.build_int_s_extend(short, t, "").map_err(llvm)
    } else {
        e.b.build_int_z_extend(short, t, "").map_err(llvm)
    }
}

/// The compare `p` (a signed predicate) on `d`'s values: the unsigned one for u32 and u64.
pub(super) fn predicate(p: IntPredicate, d: DType) -> IntPredicate {
    if !is_unsigned_full(d) {
        return p;
    }
    match p {
        IntPredicate::SLT => IntPredicate::ULT,
        IntPredicate::SLE => IntPredicate::ULE,
        IntPredicate::SGT => IntPredicate::UGT,
        IntPredicate::SGE => IntPredicate::UGE,
        other => other,
    }
}

fn splat<'ctx>(x: VectorValue<'ctx>, v: u64) -> VectorValue<'ctx> {
    let elem = x.get_type().get_element_type().into_int_type();
    VectorType::const_vector(&vec![elem.const_int(v, true); x.get_type().get_size() as usize])
}

/// Div, FMod (C's `%`) and Mod (Python's `%`: the divisor's sign) on `d`'s values: a zero
/// divisor gives 0; for signed types a divisor of -1 gives the wrapped negation (Div) or 0 (the
/// remainders) instead of `MIN / -1`'s overflow. LLVM's divisions are undefined for those
/// divisors in any lane, so they divide by 1 there and the result is replaced.
pub(super) fn division<'ctx>(
    e: &Emit<'_, 'ctx>,
    op: Binary,
    x: VectorValue<'ctx>,
    y: VectorValue<'ctx>,
    d: DType,
) -> Result<VectorValue<'ctx>> {
    let b = e.b;
    let zero = x.get_type().const_zero();
    let is_zero = b.build_int_compare(IntPredicate::EQ, y, zero, "").map_err(llvm)?;
    if is_unsigned_full(d) {
        // Remainders of unsigned values are non-negative: Mod and FMod agree.
        let safe = select(e, is_zero, splat(x, 1), y)?;
        let r = if op == Binary::Div {
            b.build_int_unsigned_div(x, safe, "").map_err(llvm)?
        } else {
            b.build_int_unsigned_rem(x, safe, "").map_err(llvm)?
        };
        return select(e, is_zero, zero, r);
    }
    let is_minus_one = b
        .build_int_compare(IntPredicate::EQ, y, splat(x, u64::MAX), "")
        .map_err(llvm)?;
    let special = b.build_or(is_zero, is_minus_one, "").map_err(llvm)?;
    let safe = select(e, special, splat(x, 1), y)?;
    if op == Binary::Div {
        let q = b.build_int_signed_div(x, safe, "").map_err(llvm)?;
        let negated = b.build_int_neg(x, "").map_err(llvm)?;
        let q = select(e, is_minus_one, negated, q)?;
        return select(e, is_zero, zero, q);
    }
    let r = b.build_int_signed_rem(x, safe, "").map_err(llvm)?;
    let r = select(e, special, zero, r)?;
    if op == Binary::FMod {
        return Ok(r);
    }
    // A non-zero remainder whose sign differs from the divisor's moves by one divisor.
    let r_negative = b
        .build_int_compare(IntPredicate::SLT, r, zero, "")
        .map_err(llvm)?;
    let y_negative = b
        .build_int_compare(IntPredicate::SLT, y, zero, "")
        .map_err(llvm)?;
    let signs_differ = b.build_xor(r_negative, y_negative, "").map_err(llvm)?;
    let nonzero = b.build_int_compare(IntPredicate::NE, r, zero, "").map_err(llvm)?;
    let fix = b.build_and(nonzero, signs_differ, "").map_err(llvm)?;
    let moved = b.build_int_add(r, y, "").map_err(llvm)?;
    select(e, fix, moved, r)
}

/// ONNX BitShift on `d`'s values: a shift outside `[0, bits)` gives 0 to the left, and to the
/// right only the sign extension (-1 for a negative signed value, else 0). The shift amount
/// has `d`'s type; a negative one is a huge unsigned one, so one unsigned compare tells both.
pub(super) fn shift<'ctx>(
    e: &Emit<'_, 'ctx>,
    left: bool,
    x: VectorValue<'ctx>,
    amount: VectorValue<'ctx>,
    d: DType,
) -> Result<VectorValue<'ctx>> {
    let b = e.b;
    let bits = (d.size_bytes() * 8) as u64;
    let zero = x.get_type().const_zero();
    let in_range = b
        .build_int_compare(IntPredicate::ULT, amount, splat(x, bits), "")
        .map_err(llvm)?;
    let safe = select(e, in_range, amount, zero)?;
    let signed = d.is_signed_int();
    let (shifted, outside) = if left {
        (b.build_left_shift(x, safe, "").map_err(llvm)?, zero)
    } else {
        let register_bits = u64::from(x.get_type().get_element_type().into_int_type().get_bit_width());
        let sign = if signed {
            b.build_right_shift(x, splat(x, register_bits - 1), true, "")
                .map_err(llvm)?
        } else {
            zero
        };
        // Canonical narrow values are their own extension: an arithmetic shift of a signed one
        // and a logical shift of an unsigned one stay in range.
        (b.build_right_shift(x, safe, signed, "").map_err(llvm)?, sign)
    };
    select(e, in_range, shifted, outside)
}

/// `x^y` for integers, wrapping (numpy) for `y >= 0` by binary exponentiation over every bit
/// of `y`'s register; a negative power is the reference's f64 `powf` cast back with
/// saturation: 1 for a base of 1, ±1 by parity for -1, the type's maximum for 0 (`+inf`), and 0
/// for every other base. `x` has `xd`'s canonical form, `y` `yd`'s.
pub(super) fn pow<'ctx>(
    e: &Emit<'_, 'ctx>,
    x: VectorValue<'ctx>,
    xd: DType,
    y: VectorValue<'ctx>,
    yd: DType,
) -> Result<VectorValue<'ctx>> {
    let b = e.b;
    let xt = x.get_type();
    let y_bits = y.get_type().get_element_type().into_int_type().get_bit_width();
    let one = splat(x, 1);
    let y_one = splat(y, 1);
    let mut acc = one;
    let mut base = x;
    let mut rest = y;
    for bit in 0..y_bits {
        let odd = b.build_and(rest, y_one, "").map_err(llvm)?;
        let odd = b
            .build_int_compare(IntPredicate::NE, odd, y.get_type().const_zero(), "")
            .map_err(llvm)?;
        let times = b.build_int_mul(acc, base, "").map_err(llvm)?;
        acc = select(e, odd, times, acc)?;
        if bit + 1 < y_bits {
            base = b.build_int_mul(base, base, "").map_err(llvm)?;
            rest = b.build_right_shift(rest, y_one, false, "").map_err(llvm)?;
        }
    }
    let acc = normalize(e, acc, xd)?;
    if !yd.is_signed_int() {
        return Ok(acc);
    }
    let negative = b
        .build_int_compare(IntPredicate::SLT, y, y.get_type().const_zero(), "")
        .map_err(llvm)?;
    let y_odd = b.build_and(y, y_one, "").map_err(llvm)?;
    let y_odd = b
        .build_int_compare(IntPredicate::NE, y_odd, y.get_type().const_zero(), "")
        .map_err(llvm)?;
    let minus_one = splat(x, u64::MAX);
    let is = |v: VectorValue<'ctx>| b.build_int_compare(IntPredicate::EQ, x, v, "").map_err(llvm);
    let max = match narrow(xd) {
        Some((bits, signed)) => (1u64 << (bits - u32::from(signed))) - 1,
        None if is_unsigned_full(xd) => u64::MAX,
        None => u64::MAX >> (65 - u64::from(xt.get_element_type().into_int_type().get_bit_width())),
    };
    let reciprocal = select(e, is(one)?, one, xt.const_zero())?;
    let reciprocal = select(e, is(minus_one)?, select(e, y_odd, minus_one, one)?, reciprocal)?;
    let reciprocal = select(e, is(xt.const_zero())?, splat(x, max), reciprocal)?;
    select(e, negative, reciprocal, acc)
}
