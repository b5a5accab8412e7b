//! Element-wise operators: unary functions, binary arithmetic, comparison and logic with numpy
//! (multidirectional) broadcasting, `Where`, `Clip` and `Cast`.
//!
//! Numeric conventions, chosen to match the ONNX reference implementation (numpy):
//! - Floating-point functions are evaluated in f64 and rounded once to the element type, so
//!   f16/bf16 results are correctly rounded (onnxruntime computes them in f32; the difference
//!   is below either type's resolution). For `+ - * /` on f32 this is bit-identical to f32
//!   arithmetic, and those run in native f32 for speed.
//! - Integer arithmetic wraps like fixed-width machine integers. Integer division and
//!   remainder by zero give 0 (what numpy returns; onnxruntime traps), so evaluation never
//!   fails or panics on model data.

use super::util::{broadcast_index_map, broadcast_shapes, check_alloc, fmt_dims};
use super::{EvalCtx, InferCtx};
use crate::{Binary, DType, Dim, Element, Op, OpError, Tensor, TensorData, TensorType, Unary};

pub(crate) fn infer(op: &Op, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    let ty = match op {
        Op::Unary(u) => infer_unary(u, cx)?,
        Op::Binary(b) => infer_binary(*b, cx)?,
        Op::Where => infer_where(cx)?,
        Op::Clip => infer_clip(cx)?,
        Op::Cast { to } => {
            expect_inputs(cx, 1, 1)?;
            TensorType {
                dtype: *to,
                ..cx.ty(0)?.clone()
            }
        }
        _ => crate::bail!("{} is not an elementwise operator", op.name()),
    };
    Ok(vec![ty])
}

pub(crate) fn eval(op: &Op, cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let out = match op {
        Op::Unary(u) => eval_unary(u, cx.input(0)?)?,
        Op::Binary(b) => eval_binary(*b, cx.input(0)?, cx.input(1)?)?,
        Op::Where => eval_where(cx.input(0)?, cx.input(1)?, cx.input(2)?)?,
        Op::Clip => eval_clip(cx.input(0)?, cx.opt_input(1), cx.opt_input(2))?,
        Op::Cast { to } => cx.input(0)?.cast(*to),
        _ => crate::bail!("{} is not an elementwise operator", op.name()),
    };
    Ok(vec![out])
}

// ---------------------------------------------------------------------------------------------
// Type inference
// ---------------------------------------------------------------------------------------------

/// A set of element types an operand may have.
#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum Kind {
    Float,
    Int,
    SignedOrFloat,
    /// Every type but bool.
    Numeric,
    Bool,
    Any,
}

impl Kind {
    fn admits(self, d: DType) -> bool {
        match self {
            Kind::Float => d.is_float(),
            Kind::Int => d.is_int(),
            Kind::SignedOrFloat => d.is_float() || d.is_signed_int(),
            Kind::Numeric => d != DType::Bool,
            Kind::Bool => d == DType::Bool,
            Kind::Any => true,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Kind::Float => "a floating-point type",
            Kind::Int => "an integer type",
            Kind::SignedOrFloat => "a signed integer or floating-point type",
            Kind::Numeric => "a numeric type",
            Kind::Bool => "bool",
            Kind::Any => "any type",
        }
    }
}

fn check_kind(what: &str, d: DType, kind: Kind) -> Result<(), OpError> {
    if !kind.admits(d) {
        crate::bail!("{what} must be {}, got {d}", kind.describe());
    }
    Ok(())
}

fn expect_inputs(cx: &InferCtx, min: usize, max: usize) -> Result<(), OpError> {
    let n = cx.num_inputs();
    if n < min || n > max {
        if min == max {
            let s = if min == 1 { "" } else { "s" };
            crate::bail!("expected {min} input{s}, got {n}");
        }
        crate::bail!("expected {min} to {max} inputs, got {n}");
    }
    Ok(())
}

fn infer_unary(u: &Unary, cx: &InferCtx) -> Result<TensorType, OpError> {
    expect_inputs(cx, 1, 1)?;
    let x = cx.ty(0)?;
    check_kind("the input", x.dtype, u.accepts())?;
    let dtype = if u.returns_bool() { DType::Bool } else { x.dtype };
    Ok(TensorType { dtype, ..x.clone() })
}

/// Operand kinds of a binary operator; `None` for the second operand means "same as the first".
fn binary_kinds(b: Binary) -> (Kind, Option<Kind>) {
    match b {
        Binary::Pow => (Kind::Numeric, Some(Kind::Numeric)),
        Binary::BitShiftLeft | Binary::BitShiftRight => (Kind::Int, Some(Kind::Int)),
        Binary::Equal => (Kind::Any, None),
        Binary::And | Binary::Or | Binary::Xor => (Kind::Bool, None),
        Binary::BitwiseAnd | Binary::BitwiseOr | Binary::BitwiseXor => (Kind::Int, None),
        _ => (Kind::Numeric, None),
    }
}

fn infer_binary(b: Binary, cx: &InferCtx) -> Result<TensorType, OpError> {
    expect_inputs(cx, 2, 2)?;
    let (x, y) = (cx.ty(0)?, cx.ty(1)?);
    let (kx, ky) = binary_kinds(b);
    check_kind("the first input", x.dtype, kx)?;
    match ky {
        Some(k) => check_kind("the second input", y.dtype, k)?,
        None if x.dtype != y.dtype => {
            crate::bail!("input types differ: {} and {}", x.dtype, y.dtype)
        }
        None => {}
    }
    if b == Binary::PRelu {
        check_unidirectional(&y.shape, &x.shape)?;
        return Ok(x.clone());
    }
    let shape = super::util::broadcast_dims(&x.shape, &y.shape)?;
    let dtype = if b.is_comparison() { DType::Bool } else { x.dtype };
    Ok(TensorType {
        dtype,
        shape,
        layout: x.layout,
    })
}

/// Checks that `from` broadcasts to `to` without changing it (PRelu's slope to X). Symbolic
/// extents are given the benefit of the doubt; evaluation checks the concrete shapes.
fn check_unidirectional(from: &[Dim], to: &[Dim]) -> Result<(), OpError> {
    let fits = from.len() <= to.len()
        && from.iter().rev().zip(to.iter().rev()).all(|(f, t)| match (f, t) {
            (Dim::Fixed(1), _) => true,
            (Dim::Fixed(p), Dim::Fixed(q)) => p == q,
            _ => true,
        });
    if !fits {
        crate::bail!(
            "slope of shape {} does not broadcast to input shape {}",
            fmt_dims(from),
            fmt_dims(to)
        );
    }
    Ok(())
}

fn infer_where(cx: &InferCtx) -> Result<TensorType, OpError> {
    expect_inputs(cx, 3, 3)?;
    let (c, x, y) = (cx.ty(0)?, cx.ty(1)?, cx.ty(2)?);
    check_kind("the condition", c.dtype, Kind::Bool)?;
    if x.dtype != y.dtype {
        crate::bail!("X and Y types differ: {} and {}", x.dtype, y.dtype);
    }
    let shape = super::util::broadcast_dims(&c.shape, &x.shape)?;
    let shape = super::util::broadcast_dims(&shape, &y.shape)?;
    Ok(TensorType {
        dtype: x.dtype,
        shape,
        layout: x.layout,
    })
}

fn infer_clip(cx: &InferCtx) -> Result<TensorType, OpError> {
    expect_inputs(cx, 1, 3)?;
    let x = cx.ty(0)?;
    check_kind("the input", x.dtype, Kind::Numeric)?;
    for (i, what) in [(1, "min"), (2, "max")] {
        if let Some(t) = cx.opt_ty(i) {
            if t.dtype != x.dtype {
                crate::bail!("{what} has type {} but the input has {}", t.dtype, x.dtype);
            }
            if t.num_elements().is_some_and(|n| n != 1) {
                crate::bail!("{what} must be a scalar, got shape {}", fmt_dims(&t.shape));
            }
        }
    }
    Ok(x.clone())
}

// ---------------------------------------------------------------------------------------------
// Integer arithmetic
// ---------------------------------------------------------------------------------------------

/// Fixed-width integer arithmetic with the wrapping semantics of numpy and onnxruntime.
pub(super) trait Int: Element + Ord {
    const BITS: u32;
    const MIN: Self;
    const MAX: Self;
    fn wadd(self, o: Self) -> Self;
    fn wsub(self, o: Self) -> Self;
    fn wmul(self, o: Self) -> Self;
    fn wneg(self) -> Self;
    fn wabs(self) -> Self;
    /// Division truncating toward zero; `x / 0 = 0`.
    fn div0(self, o: Self) -> Self;
    /// Remainder with the sign of the dividend (C `%`); `x % 0 = 0`.
    fn rem0(self, o: Self) -> Self;
    fn bit_not(self) -> Self;
    fn bit_and(self, o: Self) -> Self;
    fn bit_or(self, o: Self) -> Self;
    fn bit_xor(self, o: Self) -> Self;
    /// Shifts by `n < BITS`; right shifts of signed values are arithmetic.
    fn shl(self, n: u32) -> Self;
    fn shr(self, n: u32) -> Self;

    fn is_negative(self) -> bool {
        self < Self::zero()
    }

    fn minus_one() -> Self {
        Self::zero().wsub(Self::one())
    }

    fn sign(self) -> Self {
        if self > Self::zero() {
            Self::one()
        } else if self.is_negative() {
            Self::minus_one()
        } else {
            Self::zero()
        }
    }

    /// Remainder with the sign of the divisor (Python `%`); `x % 0 = 0`.
    fn py_mod(self, o: Self) -> Self {
        let r = self.rem0(o);
        if r != Self::zero() && r.is_negative() != o.is_negative() {
            r.wadd(o)
        } else {
            r
        }
    }

    /// `self ^ e`: wrapping for `e >= 0` (numpy); a negative exponent is evaluated in f64 and
    /// cast back (so `2^-1 = 0`, `(-1)^-3 = -1`), as onnxruntime does for every exponent.
    fn pow_i64(self, e: i64) -> Self {
        if e < 0 {
            return Self::from_f64(self.to_f64().powf(e as f64));
        }
        let (mut base, mut e, mut acc) = (self, e as u64, Self::one());
        while e > 0 {
            if e & 1 == 1 {
                acc = acc.wmul(base);
            }
            base = base.wmul(base);
            e >>= 1;
        }
        acc
    }

    /// ONNX `BitShift` left: shifts outside `[0, BITS)` give 0.
    fn shift_left(self, n: i64) -> Self {
        if (0..Self::BITS as i64).contains(&n) {
            self.shl(n as u32)
        } else {
            Self::zero()
        }
    }

    /// ONNX `BitShift` right: shifts outside `[0, BITS)` leave only the sign extension.
    fn shift_right(self, n: i64) -> Self {
        if (0..Self::BITS as i64).contains(&n) {
            self.shr(n as u32)
        } else if self.is_negative() {
            Self::minus_one()
        } else {
            Self::zero()
        }
    }
}

macro_rules! impl_int {
    ($t:ty, abs = $abs:expr) => {
        impl Int for $t {
            const BITS: u32 = <$t>::BITS;
            const MIN: Self = <$t>::MIN;
            const MAX: Self = <$t>::MAX;
            fn wadd(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            fn wsub(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            fn wmul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            fn wneg(self) -> Self {
                self.wrapping_neg()
            }
            fn wabs(self) -> Self {
                ($abs)(self)
            }
            fn div0(self, o: Self) -> Self {
                if o == 0 {
                    0
                } else {
                    self.wrapping_div(o)
                }
            }
            fn rem0(self, o: Self) -> Self {
                if o == 0 {
                    0
                } else {
                    self.wrapping_rem(o)
                }
            }
            fn bit_not(self) -> Self {
                !self
            }
            fn bit_and(self, o: Self) -> Self {
                self & o
            }
            fn bit_or(self, o: Self) -> Self {
                self | o
            }
            fn bit_xor(self, o: Self) -> Self {
                self ^ o
            }
            fn shl(self, n: u32) -> Self {
                self.wrapping_shl(n)
            }
            fn shr(self, n: u32) -> Self {
                self.wrapping_shr(n)
            }
        }
    };
}

impl_int!(i8, abs = i8::wrapping_abs);
impl_int!(i16, abs = i16::wrapping_abs);
impl_int!(i32, abs = i32::wrapping_abs);
impl_int!(i64, abs = i64::wrapping_abs);
impl_int!(u8, abs = std::convert::identity);
impl_int!(u16, abs = std::convert::identity);
impl_int!(u32, abs = std::convert::identity);
impl_int!(u64, abs = std::convert::identity);

/// Runs `$body` with `$v` bound to the elements of an integer [`TensorData`], `$other` for the
/// other types.
macro_rules! with_int_data {
    ($data:expr, $v:ident => $body:expr, else => $other:expr) => {
        match $data {
            TensorData::U8($v) => $body,
            TensorData::I8($v) => $body,
            TensorData::U16($v) => $body,
            TensorData::I16($v) => $body,
            TensorData::U32($v) => $body,
            TensorData::I32($v) => $body,
            TensorData::U64($v) => $body,
            TensorData::I64($v) => $body,
            _ => $other,
        }
    };
}
pub(super) use with_int_data;

// ---------------------------------------------------------------------------------------------
// Broadcasting
// ---------------------------------------------------------------------------------------------

/// How one operand of a broadcast operation is read, one output row (a run along the
/// innermost axis) at a time: the operand's offset at the start of each row, and its step
/// along the row (0 where the operand is broadcast along the innermost axis).
pub(super) struct RowReader {
    pub(super) offsets: Vec<usize>,
    pub(super) step: usize,
}

impl RowReader {
    /// `inp` must broadcast to `out`, and `out` must not be empty.
    pub(super) fn new(inp: &[usize], out: &[usize]) -> RowReader {
        let rank = out.len();
        if rank == 0 {
            return RowReader {
                offsets: vec![0],
                step: 0,
            };
        }
        let mut aligned = vec![1; rank - inp.len()];
        aligned.extend_from_slice(inp);
        let inner = aligned[rank - 1];
        let offsets = broadcast_index_map(&aligned[..rank - 1], &out[..rank - 1])
            .into_iter()
            .map(|row| row * inner)
            .collect();
        RowReader {
            offsets,
            step: usize::from(inner != 1),
        }
    }
}

/// Length of the output's innermost axis (1 for a scalar).
pub(super) fn row_len(out: &[usize]) -> usize {
    out.last().copied().unwrap_or(1)
}

/// `f` applied to every pair of elements of `a` and `b` broadcast together. Same-shape and
/// scalar operands take straight loops; the general case walks the output row by row.
fn zip2<A: Copy, B: Copy, O>(
    a: &[A],
    a_shape: &[usize],
    b: &[B],
    b_shape: &[usize],
    f: impl Fn(A, B) -> O,
) -> Result<(Vec<usize>, Vec<O>), OpError> {
    let shape = broadcast_shapes(a_shape, b_shape)?;
    let n = check_alloc(&shape)?;
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return Ok((shape, out));
    }
    if a.len() == n && b.len() == n {
        // Equal element counts after broadcasting mean equal layouts (only unit axes differ).
        out.extend(a.iter().zip(b).map(|(&x, &y)| f(x, y)));
    } else if a.len() == n && b.len() == 1 {
        let y = b[0];
        out.extend(a.iter().map(|&x| f(x, y)));
    } else if a.len() == 1 && b.len() == n {
        let x = a[0];
        out.extend(b.iter().map(|&y| f(x, y)));
    } else {
        let (ra, rb) = (RowReader::new(a_shape, &shape), RowReader::new(b_shape, &shape));
        let len = row_len(&shape);
        // Each row is a slice or a repeated element of each operand (e.g. a per-channel bias):
        // slice loops keep the common cases free of index arithmetic.
        for (&oa, &ob) in ra.offsets.iter().zip(&rb.offsets) {
            match (ra.step, rb.step) {
                (1, 1) => out.extend(
                    a[oa..oa + len]
                        .iter()
                        .zip(&b[ob..ob + len])
                        .map(|(&x, &y)| f(x, y)),
                ),
                (1, _) => {
                    let y = b[ob];
                    out.extend(a[oa..oa + len].iter().map(|&x| f(x, y)));
                }
                (_, 1) => {
                    let x = a[oa];
                    out.extend(b[ob..ob + len].iter().map(|&y| f(x, y)));
                }
                _ => out.extend((0..len).map(|_| f(a[oa], b[ob]))),
            }
        }
    }
    Ok((shape, out))
}

/// Like [`zip2`] for three operands (`Where`).
fn zip3<A: Copy, B: Copy, C: Copy, O>(
    (a, a_shape): (&[A], &[usize]),
    (b, b_shape): (&[B], &[usize]),
    (c, c_shape): (&[C], &[usize]),
    f: impl Fn(A, B, C) -> O,
) -> Result<(Vec<usize>, Vec<O>), OpError> {
    let shape = broadcast_shapes(&broadcast_shapes(a_shape, b_shape)?, c_shape)?;
    let n = check_alloc(&shape)?;
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return Ok((shape, out));
    }
    if a.len() == n && b.len() == n && c.len() == n {
        for i in 0..n {
            out.push(f(a[i], b[i], c[i]));
        }
    } else {
        let ra = RowReader::new(a_shape, &shape);
        let rb = RowReader::new(b_shape, &shape);
        let rc = RowReader::new(c_shape, &shape);
        let len = row_len(&shape);
        for ((&oa, &ob), &oc) in ra.offsets.iter().zip(&rb.offsets).zip(&rc.offsets) {
            for j in 0..len {
                out.push(f(a[oa + j * ra.step], b[ob + j * rb.step], c[oc + j * rc.step]));
            }
        }
    }
    Ok((shape, out))
}

fn tensor<T: Element>((shape, data): (Vec<usize>, Vec<T>)) -> Tensor {
    Tensor::from_vec(shape, data)
}

/// The elements of `t` as `T`, or an error when the dtypes differ.
fn same_type<'t, T: Element>(t: &'t Tensor, what: &str) -> Result<&'t [T], OpError> {
    match t.as_slice::<T>() {
        Some(s) => Ok(s),
        None => crate::bail!("{what} has type {} but {} was expected", t.dtype(), T::DTYPE),
    }
}

// ---------------------------------------------------------------------------------------------
// Unary evaluation
// ---------------------------------------------------------------------------------------------

fn eval_unary(u: &Unary, x: &Tensor) -> Result<Tensor, OpError> {
    let data = match (u, x.data()) {
        (Unary::Not, TensorData::Bool(v)) => TensorData::Bool(v.iter().map(|&b| !b).collect()),
        (Unary::Not, _) => crate::bail!("Not needs a bool input, got {}", x.dtype()),
        (Unary::IsNaN, _) => float_predicate(x, f64::is_nan)?,
        (
            Unary::IsInf {
                detect_positive,
                detect_negative,
            },
            _,
        ) => {
            let (pos, neg) = (*detect_positive, *detect_negative);
            float_predicate(x, |v| {
                (pos && v == f64::INFINITY) || (neg && v == f64::NEG_INFINITY)
            })?
        }
        // The hot activation of convolutional networks: keep it a plain loop.
        (Unary::Relu, TensorData::F32(v)) => {
            TensorData::F32(v.iter().map(|&a| if a < 0.0 { 0.0 } else { a }).collect())
        }
        (Unary::Abs | Unary::Neg | Unary::Sign | Unary::Relu | Unary::BitwiseNot, d)
            if x.dtype().is_int() =>
        {
            with_int_data!(d, v => int_unary(u, v)?, else => crate::bail!("unreachable dtype"))
        }
        (Unary::BitwiseNot, _) => crate::bail!("BitwiseNot needs an integer input, got {}", x.dtype()),
        (_, TensorData::Bool(_)) => crate::bail!("{} does not accept bool input", u.name()),
        (_, d) => {
            let Some(f) = u.real() else {
                crate::bail!("{} is not a real-valued function", u.name())
            };
            crate::with_numeric_data!(d, v => map_real(v, &*f), bool => unreachable_bool()?)
        }
    };
    Tensor::new(x.shape().to_vec(), data).map_err(|e| OpError::new(e.to_string()))
}

/// Bool data is matched before the numeric dispatch; this keeps the macro's bool arm total.
fn unreachable_bool() -> Result<TensorData, OpError> {
    crate::bail!("bool input is not accepted here")
}

fn float_predicate(x: &Tensor, p: impl Fn(f64) -> bool) -> Result<TensorData, OpError> {
    if !x.dtype().is_float() {
        crate::bail!("the input must be a floating-point type, got {}", x.dtype());
    }
    Ok(TensorData::Bool(x.to_f64_vec().into_iter().map(p).collect()))
}

fn int_unary<T: Int>(u: &Unary, v: &[T]) -> Result<TensorData, OpError> {
    let f: fn(T) -> T = match u {
        Unary::Abs => T::wabs,
        Unary::Neg => T::wneg,
        Unary::Sign => T::sign,
        Unary::Relu => |x| x.max(T::zero()),
        Unary::BitwiseNot => T::bit_not,
        _ => crate::bail!("{} has no integer form", u.name()),
    };
    Ok(T::wrap(v.iter().map(|&x| f(x)).collect()))
}

/// Applies a real function to every element, computing in f64 and rounding once (integers,
/// accepted by `Erf` and `Shrink`, are converted back with cast semantics).
fn map_real<T: Element>(v: &[T], f: &dyn Fn(f64) -> f64) -> TensorData {
    T::wrap(v.iter().map(|&x| T::from_f64(f(x.to_f64()))).collect())
}

pub(crate) fn sigmoid(x: f64) -> f64 {
    // Two forms so that exp never overflows into inf/inf.
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// `ln(1 + e^x)` without overflow for large `x`.
pub(crate) fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

/// The error function, to full f64 precision (relative error below 1e-14).
///
/// For `|x| < 2.5` the series `erf(x) = 2/√π · e^(-x²) · Σ (2x²)^n x / (2n+1)!!` is used: its
/// terms are all positive, so nothing cancels. Beyond, `erf = 1 - erfc`.
pub(crate) fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if x < 0.0 {
        return -erf(-x);
    }
    if x > 6.0 {
        return 1.0; // erfc(6) < 2.2e-17: erf rounds to 1
    }
    if x >= 2.5 {
        return 1.0 - erfc_large(x);
    }
    let x2 = x * x;
    let (mut term, mut sum) = (x, x);
    let mut n = 0.0;
    while term > sum * 1e-17 {
        n += 1.0;
        term *= 2.0 * x2 / (2.0 * n + 1.0);
        sum += term;
    }
    std::f64::consts::FRAC_2_SQRT_PI * (-x2).exp() * sum
}

/// The complementary error function `1 - erf(x)`, accurate also where it is tiny (so that
/// `Gelu` of a large negative input is not lost to cancellation).
pub(crate) fn erfc(x: f64) -> f64 {
    if x.is_nan() {
        x
    } else if x >= 2.5 {
        erfc_large(x)
    } else if x > -2.5 {
        1.0 - erf(x)
    } else {
        2.0 - erfc_large(-x)
    }
}

/// `erfc(x)` for `x >= 2.5` from its continued fraction
/// `e^(-x²)/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + ...))))`, which converges fast there
/// (modified Lentz evaluation).
fn erfc_large(x: f64) -> f64 {
    if x > 27.3 {
        return 0.0; // e^(-x²) underflows
    }
    const TINY: f64 = 1e-300;
    let (mut f, mut c, mut d) = (x, x, 0.0);
    for n in 1..500 {
        let a = f64::from(n) / 2.0;
        d = x + a * d;
        d = if d == 0.0 { 1.0 / TINY } else { 1.0 / d };
        c = x + a / c;
        if c == 0.0 {
            c = TINY;
        }
        let delta = c * d;
        f *= delta;
        if (delta - 1.0).abs() < 1e-16 {
            break;
        }
    }
    (-x * x).exp() / std::f64::consts::PI.sqrt() / f
}

// ---------------------------------------------------------------------------------------------
// Binary evaluation
// ---------------------------------------------------------------------------------------------

fn eval_binary(b: Binary, x: &Tensor, y: &Tensor) -> Result<Tensor, OpError> {
    let out = if b.is_comparison() {
        crate::with_data!(x.data(), v => compare(b, x, v, y)?)
    } else {
        match x.data() {
            TensorData::Bool(v) => logic(b, x, v, y)?,
            TensorData::F32(v) if matches!(b, Binary::Add | Binary::Sub | Binary::Mul | Binary::Div) => {
                f32_arith(b, x, v, y)?
            }
            TensorData::F16(v) => float_binary(b, x, v, y)?,
            TensorData::BF16(v) => float_binary(b, x, v, y)?,
            TensorData::F32(v) => float_binary(b, x, v, y)?,
            TensorData::F64(v) => float_binary(b, x, v, y)?,
            d => with_int_data!(d, v => int_binary(b, x, v, y)?, else => unreachable_tensor()?),
        }
    };
    if b == Binary::PRelu && out.shape() != x.shape() {
        crate::bail!(
            "slope of shape {:?} does not broadcast to input shape {:?}",
            y.shape(),
            x.shape()
        );
    }
    Ok(out)
}

/// Every dtype is matched before the integer dispatch; this keeps its fallback arm total.
fn unreachable_tensor() -> Result<Tensor, OpError> {
    crate::bail!("unsupported input type")
}

// In the functions below `v` is the data of `x`, already resolved to its element type.

fn compare<T: Element>(b: Binary, x: &Tensor, v: &[T], y: &Tensor) -> Result<Tensor, OpError> {
    let f: fn(T, T) -> bool = match b {
        Binary::Equal => |p, q| p == q,
        Binary::Less => |p, q| p < q,
        Binary::LessOrEqual => |p, q| p <= q,
        Binary::Greater => |p, q| p > q,
        Binary::GreaterOrEqual => |p, q| p >= q,
        _ => crate::bail!("{} is not a comparison", b.name()),
    };
    let w = same_type::<T>(y, "the second input")?;
    Ok(tensor(zip2(v, x.shape(), w, y.shape(), f)?))
}

fn logic(b: Binary, x: &Tensor, v: &[bool], y: &Tensor) -> Result<Tensor, OpError> {
    let f: fn(bool, bool) -> bool = match b {
        Binary::And => |p, q| p & q,
        Binary::Or => |p, q| p | q,
        Binary::Xor => |p, q| p ^ q,
        _ => crate::bail!("{} does not accept bool inputs", b.name()),
    };
    let w = same_type::<bool>(y, "the second input")?;
    Ok(tensor(zip2(v, x.shape(), w, y.shape(), f)?))
}

/// f32 `+ - * /` in native arithmetic (identical to computing in f64 and rounding once).
fn f32_arith(b: Binary, x: &Tensor, v: &[f32], y: &Tensor) -> Result<Tensor, OpError> {
    let w = same_type::<f32>(y, "the second input")?;
    let (xs, ys) = (x.shape(), y.shape());
    Ok(tensor(match b {
        Binary::Add => zip2(v, xs, w, ys, |p, q| p + q)?,
        Binary::Sub => zip2(v, xs, w, ys, |p, q| p - q)?,
        Binary::Mul => zip2(v, xs, w, ys, |p, q| p * q)?,
        Binary::Div => zip2(v, xs, w, ys, |p, q| p / q)?,
        _ => crate::bail!("{} is not basic arithmetic", b.name()),
    }))
}

fn float_binary<T: Element>(b: Binary, x: &Tensor, v: &[T], y: &Tensor) -> Result<Tensor, OpError> {
    if b == Binary::Pow {
        // The exponent may have any numeric type; the result has the base's.
        let e = y.to_f64_vec();
        let f = |p: T, q: f64| T::from_f64(p.to_f64().powf(q));
        return Ok(tensor(zip2(v, x.shape(), &e, y.shape(), f)?));
    }
    let f: fn(f64, f64) -> f64 = match b {
        Binary::Add => |p, q| p + q,
        Binary::Sub => |p, q| p - q,
        Binary::Mul => |p, q| p * q,
        Binary::Div => |p, q| p / q,
        Binary::Mod => py_mod_f64,
        Binary::FMod => |p, q| p % q,
        Binary::Min => |p, q| {
            if p.is_nan() || q.is_nan() {
                f64::NAN
            } else {
                p.min(q)
            }
        },
        Binary::Max => |p, q| {
            if p.is_nan() || q.is_nan() {
                f64::NAN
            } else {
                p.max(q)
            }
        },
        Binary::PRelu => |p, s| if p < 0.0 { s * p } else { p },
        _ => crate::bail!("{} does not accept floating-point inputs", b.name()),
    };
    let w = same_type::<T>(y, "the second input")?;
    let g = |p: T, q: T| T::from_f64(f(p.to_f64(), q.to_f64()));
    Ok(tensor(zip2(v, x.shape(), w, y.shape(), g)?))
}

/// Floating-point remainder with the sign of the divisor (numpy `mod`, ONNX `Mod` with
/// `fmod=0`): NaN for a zero divisor or an infinite dividend, `x` or `y` for an infinite
/// divisor (`x` when the signs agree), and a zero result takes the divisor's sign.
fn py_mod_f64(x: f64, y: f64) -> f64 {
    let r = x % y;
    if r == 0.0 {
        0.0f64.copysign(y)
    } else if (r < 0.0) != (y < 0.0) {
        r + y
    } else {
        r
    }
}

fn int_binary<T: Int>(b: Binary, x: &Tensor, v: &[T], y: &Tensor) -> Result<Tensor, OpError> {
    let (xs, ys) = (x.shape(), y.shape());
    match b {
        Binary::Pow if y.dtype().is_float() => {
            let e = y.to_f64_vec();
            let f = |p: T, q: f64| T::from_f64(p.to_f64().powf(q));
            return Ok(tensor(zip2(v, xs, &e, ys, f)?));
        }
        // Exponents and shift amounts may have any integer type.
        Binary::Pow | Binary::BitShiftLeft | Binary::BitShiftRight => {
            let e = y.to_i64_vec();
            let f: fn(T, i64) -> T = match b {
                Binary::Pow => T::pow_i64,
                Binary::BitShiftLeft => T::shift_left,
                _ => T::shift_right,
            };
            return Ok(tensor(zip2(v, xs, &e, ys, f)?));
        }
        _ => {}
    }
    let f: fn(T, T) -> T = match b {
        Binary::Add => T::wadd,
        Binary::Sub => T::wsub,
        Binary::Mul => T::wmul,
        Binary::Div => T::div0,
        Binary::Mod => T::py_mod,
        Binary::FMod => T::rem0,
        Binary::Min => |p, q| p.min(q),
        Binary::Max => |p, q| p.max(q),
        Binary::BitwiseAnd => T::bit_and,
        Binary::BitwiseOr => T::bit_or,
        Binary::BitwiseXor => T::bit_xor,
        Binary::PRelu => |p, s| if p.is_negative() { p.wmul(s) } else { p },
        _ => crate::bail!("{} does not accept integer inputs", b.name()),
    };
    let w = same_type::<T>(y, "the second input")?;
    Ok(tensor(zip2(v, xs, w, ys, f)?))
}

// ---------------------------------------------------------------------------------------------
// Where, Clip
// ---------------------------------------------------------------------------------------------

fn eval_where(c: &Tensor, x: &Tensor, y: &Tensor) -> Result<Tensor, OpError> {
    fn select<T: Element>(
        c: &Tensor,
        cv: &[bool],
        x: &Tensor,
        v: &[T],
        y: &Tensor,
    ) -> Result<Tensor, OpError> {
        let w = same_type::<T>(y, "Y")?;
        let f = |k: bool, p: T, q: T| if k { p } else { q };
        Ok(tensor(zip3((cv, c.shape()), (v, x.shape()), (w, y.shape()), f)?))
    }
    let cv = same_type::<bool>(c, "the condition")?;
    crate::with_data!(x.data(), v => select(c, cv, x, v, y))
}

fn eval_clip(x: &Tensor, lo: Option<&Tensor>, hi: Option<&Tensor>) -> Result<Tensor, OpError> {
    fn bound<T: Element>(t: Option<&Tensor>, what: &str) -> Result<Option<T>, OpError> {
        let Some(t) = t else { return Ok(None) };
        match same_type::<T>(t, what)? {
            [v] => Ok(Some(*v)),
            _ => crate::bail!("{what} must be a scalar, got shape {:?}", t.shape()),
        }
    }
    fn clip<T: Element>(
        x: &Tensor,
        v: &[T],
        lo: Option<&Tensor>,
        hi: Option<&Tensor>,
    ) -> Result<Tensor, OpError> {
        let (lo, hi) = (bound::<T>(lo, "min")?, bound::<T>(hi, "max")?);
        // `min(max(x, lo), hi)`: when lo > hi every element becomes hi (ONNX); NaN stays NaN.
        let data = v
            .iter()
            .map(|&e| {
                let e = match lo {
                    Some(l) if e < l => l,
                    _ => e,
                };
                match hi {
                    Some(h) if e > h => h,
                    _ => e,
                }
            })
            .collect();
        Ok(Tensor::from_vec(x.shape().to_vec(), data))
    }
    crate::with_data!(x.data(), v => clip(x, v, lo, hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t<T: Element>(shape: &[usize], v: Vec<T>) -> Tensor {
        Tensor::from_vec(shape.to_vec(), v)
    }

    fn bin(b: Binary, x: Tensor, y: Tensor) -> Tensor {
        eval_binary(b, &x, &y).unwrap()
    }

    #[test]
    fn erf_matches_known_values() {
        let cases = [
            (0.0, 0.0),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (2.5, 0.999_593_047_982_555),
            (3.0, 0.999_977_909_503_001_4),
            (4.0, 0.999_999_984_582_742_1),
            (-1.0, -0.842_700_792_949_714_9),
        ];
        for (x, want) in cases {
            assert!((erf(x) - want).abs() <= 1e-15, "erf({x}) = {} != {want}", erf(x));
        }
        assert!((erfc(5.0) - 1.537_459_794_428_034_8e-12).abs() < 1e-25);
        assert!((erfc(-1.0) - 1.842_700_792_949_715).abs() < 1e-15);
        assert!((erfc(10.0) - 2.088_487_583_762_545e-45).abs() < 1e-58);
        assert_eq!(erf(f64::INFINITY), 1.0);
        assert_eq!(erf(f64::NEG_INFINITY), -1.0);
        assert!(erf(f64::NAN).is_nan());
    }

    #[test]
    fn integer_division_truncates_and_defines_zero_divisor() {
        let x = t(&[5], vec![7i32, -7, 7, -7, i32::MIN]);
        let y = t(&[5], vec![2i32, 2, -2, 0, -1]);
        assert_eq!(bin(Binary::Div, x, y), t(&[5], vec![3i32, -3, -3, 0, i32::MIN]));
    }

    #[test]
    fn modulo_signs() {
        let x = t(&[4], vec![-7i64, 7, -7, 5]);
        let y = t(&[4], vec![3i64, -3, -3, 0]);
        assert_eq!(
            bin(Binary::Mod, x.clone(), y.clone()),
            t(&[4], vec![2i64, -2, -1, 0])
        );
        assert_eq!(bin(Binary::FMod, x, y), t(&[4], vec![-1i64, 1, -1, 0]));
        let xf = t(&[4], vec![-7.0f32, 7.0, 0.0, 3.0]);
        let yf = t(&[4], vec![3.0f32, -3.0, -2.0, f32::NEG_INFINITY]);
        let r = bin(Binary::Mod, xf, yf);
        let r = r.as_slice::<f32>().unwrap();
        assert_eq!(&r[..2], &[2.0, -2.0]);
        assert!(r[2] == 0.0 && r[2].is_sign_negative());
        assert_eq!(r[3], f32::NEG_INFINITY);
    }

    #[test]
    fn round_is_half_to_even() {
        let x = t(&[6], vec![0.5f32, 1.5, 2.5, -0.5, -1.5, 2.4]);
        let r = eval_unary(&Unary::Round, &x).unwrap();
        assert_eq!(r, t(&[6], vec![0.0f32, 2.0, 2.0, -0.0, -2.0, 2.0]));
    }

    #[test]
    fn integer_neg_and_abs_wrap() {
        let x = t(&[2], vec![i8::MIN, -3]);
        assert_eq!(eval_unary(&Unary::Neg, &x).unwrap(), t(&[2], vec![i8::MIN, 3]));
        assert_eq!(eval_unary(&Unary::Abs, &x).unwrap(), t(&[2], vec![i8::MIN, 3]));
    }

    #[test]
    fn min_max_propagate_nan() {
        let x = t(&[2], vec![f32::NAN, 1.0]);
        let y = t(&[2], vec![0.0f32, f32::NAN]);
        let r = bin(Binary::Max, x.clone(), y.clone());
        assert!(r.as_slice::<f32>().unwrap().iter().all(|v| v.is_nan()));
        let r = bin(Binary::Min, x, y);
        assert!(r.as_slice::<f32>().unwrap().iter().all(|v| v.is_nan()));
    }

    #[test]
    fn broadcasting_general_path() {
        // [2,1,3] + [2,1] -> [2,2,3]
        let x = t(&[2, 1, 3], vec![0i32, 1, 2, 10, 11, 12]);
        let y = t(&[2, 1], vec![100i32, 200]);
        let r = bin(Binary::Add, x, y);
        assert_eq!(
            r,
            t(
                &[2, 2, 3],
                vec![100, 101, 102, 200, 201, 202, 110, 111, 112, 210, 211, 212]
            )
        );
        assert!(eval_binary(Binary::Add, &t(&[2], vec![1i32, 2]), &t(&[3], vec![1i32, 2, 3])).is_err());
    }

    #[test]
    fn bitshift_out_of_range_shifts() {
        let x = t(&[4], vec![-8i8, -8, 3, 3]);
        let n = t(&[4], vec![1i8, 9, -1, 8]);
        assert_eq!(
            bin(Binary::BitShiftRight, x.clone(), n.clone()),
            t(&[4], vec![-4i8, -1, 0, 0])
        );
        assert_eq!(bin(Binary::BitShiftLeft, x, n), t(&[4], vec![-16i8, 0, 0, 0]));
    }

    #[test]
    fn integer_pow() {
        let x = t(&[4], vec![3i32, 2, -1, 2]);
        let e = t(&[4], vec![4i64, -1, -3, 31]);
        assert_eq!(bin(Binary::Pow, x, e), t(&[4], vec![81i32, 0, -1, i32::MIN]));
    }

    #[test]
    fn clip_with_min_above_max_gives_max() {
        let x = t(&[3], vec![-5i8, 0, 5]);
        let r = eval_clip(&x, Some(&t(&[], vec![2i8])), Some(&t(&[], vec![1i8]))).unwrap();
        assert_eq!(r, t(&[3], vec![1i8, 1, 1]));
    }

    #[test]
    fn softplus_does_not_overflow() {
        assert_eq!(softplus(1000.0), 1000.0);
        assert!(softplus(-1000.0) >= 0.0 && softplus(-1000.0) < 1e-300);
    }

    #[test]
    fn empty_broadcasts_with_huge_extents_do_not_overflow() {
        let x = Tensor::new(vec![0, 1 << 40, 1 << 40, 1], TensorData::F32(vec![])).unwrap();
        let y = t(&[3], vec![1.0f32, 2.0, 3.0]);
        let r = eval_binary(Binary::Mul, &x, &y).unwrap();
        assert_eq!(r.shape(), &[0, 1 << 40, 1 << 40, 3]);
        let c = t(&[1], vec![true]);
        assert!(eval_where(&c, &x, &y).is_ok());
    }

    #[test]
    fn celu_propagates_nan() {
        let r = eval_unary(&Unary::Celu { alpha: 2.0 }, &t(&[2], vec![f32::NAN, -1.0])).unwrap();
        let r = r.as_slice::<f32>().unwrap();
        assert!(r[0].is_nan());
        assert!((r[1] - 2.0 * ((-0.5f32).exp() - 1.0)).abs() < 1e-6);
    }
}
