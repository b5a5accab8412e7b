//! Vector f32 transcendentals emitted as LLVM IR: the same branch-free polynomials as the
//! micro-kernels' `kiln_math.h` (same constants, same accuracy and special values), so that a
//! generated kernel computes what the kernel library computes. `llvm.exp` on a vector is not
//! an option: without a vector math library LLVM scalarizes it into one libm `expf` call per
//! lane, which cost a third of EfficientNet-B0's run time (SiLU after every convolution).

// The constants are written digit for digit as in kiln_math.h, so the two stay comparable.
#![allow(clippy::excessive_precision)]

use super::emit::Emit;
use super::llvm;
use crate::error::Result;
use inkwell::types::VectorType;
use inkwell::values::VectorValue;
use inkwell::FloatPredicate;

fn lanes(x: VectorValue<'_>) -> u32 {
    x.get_type().get_size()
}

fn c<'ctx>(e: &Emit<'_, 'ctx>, v: f32, n: u32) -> VectorValue<'ctx> {
    VectorType::const_vector(&vec![e.f32c(v); n as usize])
}

fn ci<'ctx>(e: &Emit<'_, 'ctx>, v: u32, n: u32) -> VectorValue<'ctx> {
    VectorType::const_vector(&vec![e.cx.i32_type().const_int(u64::from(v), false); n as usize])
}

/// `cond ? a : b` with an ordered comparison `a p b` (NaN compares false).
fn sel_cmp<'ctx>(
    e: &Emit<'_, 'ctx>,
    p: FloatPredicate,
    x: VectorValue<'ctx>,
    y: VectorValue<'ctx>,
    a: VectorValue<'ctx>,
    b: VectorValue<'ctx>,
) -> Result<VectorValue<'ctx>> {
    let m = e.fcmp(p, x, y)?;
    e.vselect(m, a, b)
}

fn fsub<'ctx>(e: &Emit<'_, 'ctx>, a: VectorValue<'ctx>, b: VectorValue<'ctx>) -> Result<VectorValue<'ctx>> {
    e.b.build_float_sub(a, b, "").map_err(llvm)
}

fn fdiv<'ctx>(e: &Emit<'_, 'ctx>, a: VectorValue<'ctx>, b: VectorValue<'ctx>) -> Result<VectorValue<'ctx>> {
    e.b.build_float_div(a, b, "").map_err(llvm)
}

/// `|x|` (clears the sign bit, so NaN stays NaN).
pub(crate) fn fabs<'ctx>(e: &Emit<'_, 'ctx>, x: VectorValue<'ctx>) -> Result<VectorValue<'ctx>> {
    Ok(e.intrinsic("llvm.fabs", &[x.get_type().into()], &[x.into()])?
        .into_vector_value())
}

/// Horner evaluation `((c0·x + c1)·x + ...)`.
fn horner<'ctx>(e: &Emit<'_, 'ctx>, x: VectorValue<'ctx>, coeffs: &[f32]) -> Result<VectorValue<'ctx>> {
    let n = lanes(x);
    let mut p = c(e, coeffs[0], n);
    for &k in &coeffs[1..] {
        p = e.fma(p, x, c(e, k, n))?;
    }
    Ok(p)
}

/// e^x (see `kiln_expf`).
pub(crate) fn exp<'ctx>(e: &Emit<'_, 'ctx>, x: VectorValue<'ctx>) -> Result<VectorValue<'ctx>> {
    let n = lanes(x);
    let b = e.b;
    let it = e.cx.i32_type().vec_type(n);
    let x = sel_cmp(e, FloatPredicate::OGT, x, c(e, 89.0, n), c(e, 89.0, n), x)?;
    let x = sel_cmp(e, FloatPredicate::OLT, x, c(e, -104.0, n), c(e, -104.0, n), x)?;
    let shifter = c(e, 12582912.0, n);
    let t = e.fma(x, c(e, std::f32::consts::LOG2_E, n), shifter)?;
    let ti = b.build_bit_cast(t, it, "").map_err(llvm)?.into_vector_value();
    let si = b
        .build_bit_cast(shifter, it, "")
        .map_err(llvm)?
        .into_vector_value();
    let ni = b.build_int_sub(ti, si, "").map_err(llvm)?;
    let nf = fsub(e, t, shifter)?;
    let r = e.fma(nf, c(e, -0.693359375, n), x)?;
    let r = e.fma(nf, c(e, 2.12194440e-4, n), r)?;
    let p = horner(
        e,
        r,
        &[
            1.9875691500e-4,
            1.3981999507e-3,
            8.3334519073e-3,
            4.1665795894e-2,
            1.6666665459e-1,
            5.0000001201e-1,
        ],
    )?;
    let r2 = e.fmul(r, r)?;
    let p = e.fma(p, r2, r)?;
    let p = e.fadd(p, c(e, 1.0, n))?;
    // 2^n in two halves, so results down to the subnormals and up to FLT_MAX need no branch.
    let n1 = b.build_right_shift(ni, ci(e, 1, n), true, "").map_err(llvm)?;
    let n2 = b.build_int_sub(ni, n1, "").map_err(llvm)?;
    let scale = |k: VectorValue<'ctx>| -> Result<VectorValue<'ctx>> {
        let k = b.build_int_add(k, ci(e, 127, n), "").map_err(llvm)?;
        let k = b.build_and(k, ci(e, 0xff, n), "").map_err(llvm)?;
        let k = b.build_left_shift(k, ci(e, 23, n), "").map_err(llvm)?;
        Ok(b.build_bit_cast(k, e.vty(n), "")
            .map_err(llvm)?
            .into_vector_value())
    };
    let s1 = scale(n1)?;
    let s2 = scale(n2)?;
    e.fmul(e.fmul(p, s1)?, s2)
}

/// 1/(1+e^-x) from e^-|x|, so neither form overflows and tiny results keep their accuracy.
pub(crate) fn sigmoid<'ctx>(e: &Emit<'_, 'ctx>, x: VectorValue<'ctx>) -> Result<VectorValue<'ctx>> {
    let n = lanes(x);
    let ax = fabs(e, x)?;
    let neg = e.b.build_float_neg(ax, "").map_err(llvm)?;
    let ex = exp(e, neg)?;
    let s = fdiv(e, c(e, 1.0, n), e.fadd(ex, c(e, 1.0, n))?)?;
    let es = e.fmul(ex, s)?;
    sel_cmp(e, FloatPredicate::OLT, x, e.zero_vec(n), es, s)
}

/// tanh(x) (see `kiln_tanhf`).
pub(crate) fn tanh<'ctx>(e: &Emit<'_, 'ctx>, x: VectorValue<'ctx>) -> Result<VectorValue<'ctx>> {
    let n = lanes(x);
    let ax = fabs(e, x)?;
    let z = e.fmul(x, x)?;
    let p = horner(
        e,
        z,
        &[
            -5.70498872745e-3,
            2.06390887954e-2,
            -5.37397155531e-2,
            1.33314422036e-1,
            -3.33332819422e-1,
        ],
    )?;
    let small = e.fma(e.fmul(x, z)?, p, x)?;
    let ex = exp(e, e.fadd(ax, ax)?)?;
    let big = fsub(e, c(e, 1.0, n), fdiv(e, c(e, 2.0, n), e.fadd(ex, c(e, 1.0, n))?)?)?;
    let nbig = e.b.build_float_neg(big, "").map_err(llvm)?;
    let big = sel_cmp(e, FloatPredicate::OLT, x, e.zero_vec(n), nbig, big)?;
    sel_cmp(e, FloatPredicate::OLT, ax, c(e, 0.625, n), small, big)
}
