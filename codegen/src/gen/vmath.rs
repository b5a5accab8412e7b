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
    if e.avx512 && n == 16 {
        // p·2^n rounded once, subnormal results included: the two halves' value in one
        // instruction (`vscalefps`; `nf` is n as a float).
        let all = e.cx.i16_type().const_all_ones();
        let current_rounding = e.cx.i32_type().const_int(4, false);
        let args = [p.into(), nf.into(), p.into(), all.into(), current_rounding.into()];
        return Ok(e
            .intrinsic("llvm.x86.avx512.mask.scalef.ps.512", &[], &args)?
            .into_vector_value());
    }
    // 2^n in two halves, so results down to the subnormals and up to FLT_MAX need no branch:
    // p·2^n1 is exact, the second product rounds once.
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

/// ln(x) (see `kiln_logf`): x = m·2^e with m in [√½, √2), ln(1+f) for f = m - 1 by the Cephes
/// polynomial; subnormal inputs are scaled by 2^23 first.
pub(crate) fn log<'ctx>(e: &Emit<'_, 'ctx>, x: VectorValue<'ctx>) -> Result<VectorValue<'ctx>> {
    let n = lanes(x);
    let b = e.b;
    let it = e.cx.i32_type().vec_type(n);
    let sub = e.fcmp(FloatPredicate::OLT, x, c(e, 1.17549435e-38, n))?;
    let xs = e.vselect(sub, e.fmul(x, c(e, 8388608.0, n))?, x)?;
    let u = b.build_bit_cast(xs, it, "").map_err(llvm)?.into_vector_value();
    let ex = b.build_right_shift(u, ci(e, 23, n), false, "").map_err(llvm)?;
    let ex = b.build_and(ex, ci(e, 0xff, n), "").map_err(llvm)?;
    let bias = e.vselect(sub, ci(e, 150, n), ci(e, 127, n))?;
    let ex = b.build_int_sub(ex, bias, "").map_err(llvm)?;
    let mb = b.build_and(u, ci(e, 0x007f_ffff, n), "").map_err(llvm)?;
    let mb = b.build_or(mb, ci(e, 0x3f80_0000, n), "").map_err(llvm)?;
    let m = b
        .build_bit_cast(mb, e.vty(n), "")
        .map_err(llvm)?
        .into_vector_value();
    let big = e.fcmp(FloatPredicate::OGT, m, c(e, std::f32::consts::SQRT_2, n))?;
    let m = e.vselect(big, e.fmul(m, c(e, 0.5, n))?, m)?;
    let ex = e.vselect(big, b.build_int_add(ex, ci(e, 1, n), "").map_err(llvm)?, ex)?;
    let f = fsub(e, m, c(e, 1.0, n))?;
    let z = e.fmul(f, f)?;
    let p = horner(
        e,
        f,
        &[
            7.0376836292e-2,
            -1.1514610310e-1,
            1.1676998740e-1,
            -1.2420140846e-1,
            1.4249322787e-1,
            -1.6668057665e-1,
            2.0000714765e-1,
            -2.4999993993e-1,
            3.3333331174e-1,
        ],
    )?;
    let ef = b.build_signed_int_to_float(ex, e.vty(n), "").map_err(llvm)?;
    let y = e.fmul(e.fmul(f, z)?, p)?;
    let y = e.fma(ef, c(e, -2.12194440e-4, n), y)?;
    let y = e.fma(z, c(e, -0.5, n), y)?;
    let r = e.fadd(f, y)?;
    let r = e.fma(ef, c(e, 0.693359375, n), r)?;
    // log(±0) = -inf, log(x<0) = NaN, log(inf) = inf, NaN stays NaN.
    let r = sel_cmp(
        e,
        FloatPredicate::OEQ,
        x,
        e.zero_vec(n),
        c(e, f32::NEG_INFINITY, n),
        r,
    )?;
    let r = sel_cmp(e, FloatPredicate::OLT, x, e.zero_vec(n), c(e, f32::NAN, n), r)?;
    let r = sel_cmp(e, FloatPredicate::OEQ, x, c(e, f32::INFINITY, n), x, r)?;
    let nan = e.fcmp(FloatPredicate::UNO, x, x)?;
    e.vselect(nan, x, r)
}

/// erf(x) (see `kiln_erff`): an odd polynomial for |x| < 0.875, 1 - erfc beyond, with erfc
/// from a fit in t = 1/(1 + |x|/2) times e^(-x²); |x| is clamped to 4, where erf is ±1 in f32.
pub(crate) fn erf<'ctx>(e: &Emit<'_, 'ctx>, x: VectorValue<'ctx>) -> Result<VectorValue<'ctx>> {
    let n = lanes(x);
    let ax = fabs(e, x)?;
    let z = sel_cmp(e, FloatPredicate::OGT, ax, c(e, 4.0, n), c(e, 4.0, n), ax)?;
    // Keeps the unused branch finite.
    let z = sel_cmp(e, FloatPredicate::OLT, z, c(e, 0.875, n), c(e, 0.875, n), z)?;
    let t = fdiv(e, c(e, 1.0, n), e.fma(z, c(e, 0.5, n), c(e, 1.0, n))?)?;
    let s = e.fmul(fsub(e, t, c(e, 0.43115942, n))?, c(e, 3.7808219, n))?;
    let r = horner(
        e,
        s,
        &[
            -1.6210351532e-05,
            7.21474425517954e-05,
            2.662028418853879e-04,
            -1.1868111323565245e-03,
            -5.906339269131422e-03,
            1.8291428685188293e-02,
            3.475741446018219e-01,
            -7.63388454914093e-01,
        ],
    )?;
    let ez = exp(e, fsub(e, r, e.fmul(z, z)?)?)?;
    let big = fsub(e, c(e, 1.0, n), e.fmul(t, ez)?)?;
    let nbig = e.b.build_float_neg(big, "").map_err(llvm)?;
    let big = sel_cmp(e, FloatPredicate::OLT, x, e.zero_vec(n), nbig, big)?;
    let p = horner(
        e,
        e.fmul(x, x)?,
        &[
            8.71393785928376e-05,
            -8.220490417443216e-04,
            5.207619164139032e-03,
            -2.6861967518925667e-02,
            1.1283741146326065e-01,
            -3.7612637877464294e-01,
            1.128379225730896,
        ],
    )?;
    let small = e.fmul(x, p)?;
    let res = sel_cmp(e, FloatPredicate::OLT, ax, c(e, 0.875, n), small, big)?;
    let nan = e.fcmp(FloatPredicate::UNO, x, x)?;
    e.vselect(nan, x, res)
}

/// GELU's erf form, 0.5·x·(1 + erf(x/√2)), as `kiln_gelu_erff`: erf as one rational function
/// u·P(u²)/Q(u²) of u = x/√2 clamped to ±4, 1 + erf kept at or above 0.
pub(crate) fn gelu_erf<'ctx>(e: &Emit<'_, 'ctx>, x: VectorValue<'ctx>) -> Result<VectorValue<'ctx>> {
    let n = lanes(x);
    let u = e.fmul(x, c(e, std::f32::consts::FRAC_1_SQRT_2, n))?;
    let u = sel_cmp(e, FloatPredicate::OGT, u, c(e, 4.0, n), c(e, 4.0, n), u)?;
    let u = sel_cmp(e, FloatPredicate::OLT, u, c(e, -4.0, n), c(e, -4.0, n), u)?;
    let z = e.fmul(u, u)?;
    let p = horner(
        e,
        z,
        &[
            -2.72614225801306e-10,
            2.77068142495902e-08,
            -2.10102402082508e-06,
            -5.69250639462346e-05,
            -7.34990630326855e-04,
            -2.95459980854025e-03,
            -1.60960333262415e-02,
        ],
    )?;
    let q = horner(
        e,
        z,
        &[
            -1.45660718464996e-05,
            -2.13374055278905e-04,
            -1.68282697438203e-03,
            -7.37332916720468e-03,
            -1.42647390514189e-02,
        ],
    )?;
    let erf = fdiv(e, e.fmul(u, p)?, q)?;
    let one_plus = e.fadd(erf, c(e, 1.0, n))?;
    let one_plus = sel_cmp(
        e,
        FloatPredicate::OLT,
        one_plus,
        e.zero_vec(n),
        e.zero_vec(n),
        one_plus,
    )?;
    e.fmul(e.fmul(x, c(e, 0.5, n))?, one_plus)
}
