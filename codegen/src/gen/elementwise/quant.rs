//! QuantizeLinear and DequantizeLinear with per-tensor parameters in the elementwise loop:
//! the activations of a QDQ model between its integer convolutions. u8 and i8 values live in
//! i32 lanes (`reg_type`); both follow the reference (`kiln_ir::ops::quant`) exactly.

use super::{fclamp, fconst, fintr, select};
use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use inkwell::values::VectorValue;
use inkwell::FloatPredicate;
use kiln_ir::ops::quant_range;
use kiln_ir::DType;

/// `clamp(roundeven(x / s) + zp, lo, hi)` in f32 as an integer in i32 lanes; NaN gives `lo`.
/// `zp` arrives in i32 lanes. Also the integer GEMM kernel's u8 store (`Epilogue::quantize`).
pub(crate) fn quantize<'ctx>(
    e: &Emit<'_, 'ctx>,
    x: VectorValue<'ctx>,
    scale: VectorValue<'ctx>,
    zero_point: Option<VectorValue<'ctx>>,
    to: DType,
    n: u32,
) -> Result<VectorValue<'ctx>> {
    let (lo, hi) = quant_range(to).expect("checked by supports_on");
    let b = e.b;
    let q = fintr(
        e,
        "llvm.roundeven",
        &[b.build_float_div(x, scale, "").map_err(llvm)?],
    )?;
    let q = match zero_point {
        Some(z) => e.fadd(q, b.build_signed_int_to_float(z, e.vty(n), "").map_err(llvm)?)?,
        None => q,
    };
    let (lo, hi) = (fconst(e, lo as f32, n), fconst(e, hi as f32, n));
    let q = fclamp(e, q, Some(lo), Some(hi))?;
    let q = select(e, e.fcmp(FloatPredicate::UNO, q, q)?, lo, q)?;
    b.build_float_to_signed_int(q, e.cx.i32_type().vec_type(n), "")
        .map_err(llvm)
}

/// `f32(x - zp) · s` (x and zp in i32 lanes; the difference is exact).
pub(super) fn dequantize<'ctx>(
    e: &Emit<'_, 'ctx>,
    x: VectorValue<'ctx>,
    scale: VectorValue<'ctx>,
    zero_point: Option<VectorValue<'ctx>>,
    n: u32,
) -> Result<VectorValue<'ctx>> {
    let b = e.b;
    let d = match zero_point {
        Some(z) => b.build_int_sub(x, z, "").map_err(llvm)?,
        None => x,
    };
    e.fmul(b.build_signed_int_to_float(d, e.vty(n), "").map_err(llvm)?, scale)
}
