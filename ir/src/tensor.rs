//! Concrete tensors: constants in the graph and the values `eval` computes.

use crate::{DType, TensorType};
use half::{bf16, f16};
use std::fmt;

/// Typed element storage, one variant per [`DType`].
#[derive(Clone, PartialEq, Debug)]
pub enum TensorData {
    Bool(Vec<bool>),
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    F32(Vec<f32>),
    F64(Vec<f64>),
}

/// Runs `$body` with `$v` bound to the typed `Vec` inside a [`TensorData`] (by the same
/// reference-ness as `$data`). The body must have one type for every element type, which in
/// practice means calling a generic function over [`Element`].
#[macro_export]
macro_rules! with_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::TensorData::Bool($v) => $body,
            $crate::TensorData::U8($v) => $body,
            $crate::TensorData::I8($v) => $body,
            $crate::TensorData::U16($v) => $body,
            $crate::TensorData::I16($v) => $body,
            $crate::TensorData::U32($v) => $body,
            $crate::TensorData::I32($v) => $body,
            $crate::TensorData::U64($v) => $body,
            $crate::TensorData::I64($v) => $body,
            $crate::TensorData::F16($v) => $body,
            $crate::TensorData::BF16($v) => $body,
            $crate::TensorData::F32($v) => $body,
            $crate::TensorData::F64($v) => $body,
        }
    };
}

/// Like [`with_data!`] but only for numeric (non-bool) data; `$bool_case` handles `Bool`.
#[macro_export]
macro_rules! with_numeric_data {
    ($data:expr, $v:ident => $body:expr, bool => $bool_case:expr) => {
        match $data {
            $crate::TensorData::Bool(_) => $bool_case,
            $crate::TensorData::U8($v) => $body,
            $crate::TensorData::I8($v) => $body,
            $crate::TensorData::U16($v) => $body,
            $crate::TensorData::I16($v) => $body,
            $crate::TensorData::U32($v) => $body,
            $crate::TensorData::I32($v) => $body,
            $crate::TensorData::U64($v) => $body,
            $crate::TensorData::I64($v) => $body,
            $crate::TensorData::F16($v) => $body,
            $crate::TensorData::BF16($v) => $body,
            $crate::TensorData::F32($v) => $body,
            $crate::TensorData::F64($v) => $body,
        }
    };
}

/// A Rust element type that maps to one [`DType`].
///
/// Conversions go through `f64` (exact for every type but 64-bit integers beyond 2^53) or
/// `i64`; [`Element::cast_from`] implements ONNX `Cast` semantics exactly.
pub trait Element: Copy + Default + PartialOrd + PartialEq + Send + Sync + fmt::Debug + 'static {
    const DTYPE: DType;
    fn to_f64(self) -> f64;
    /// Converts with ONNX/numpy cast semantics: floats round to nearest even, float to integer
    /// truncates toward zero (out-of-range values saturate), integers wrap.
    fn from_f64(v: f64) -> Self;
    fn to_i64(self) -> i64;
    fn from_i64(v: i64) -> Self;
    fn wrap(v: Vec<Self>) -> TensorData;
    fn slice(d: &TensorData) -> Option<&[Self]>;
    fn vec_mut(d: &mut TensorData) -> Option<&mut Vec<Self>>;
    fn zero() -> Self {
        Self::default()
    }
    fn one() -> Self {
        Self::from_i64(1)
    }
    fn is_nan(self) -> bool {
        false
    }
    /// The nearest `f32` (a single rounding, also for 64-bit integers).
    fn to_f32(self) -> f32 {
        self.to_f64() as f32
    }
    /// Converts a value of another element type, exactly as ONNX `Cast` does.
    fn cast_from<S: Element>(s: S) -> Self {
        if Self::DTYPE == DType::F32 {
            // Through f64 a 64-bit integer would be rounded twice.
            return Self::from_f64(s.to_f32() as f64);
        }
        if S::DTYPE.is_float() || Self::DTYPE.is_float() || S::DTYPE == DType::Bool {
            Self::from_f64(s.to_f64())
        } else {
            Self::from_i64(s.to_i64())
        }
    }
}

macro_rules! int_element {
    ($t:ty, $variant:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                // `as` saturates and maps NaN to 0, which is what every ONNX runtime does for
                // out-of-range float→int casts (the spec leaves it undefined).
                v as $t
            }
            fn to_i64(self) -> i64 {
                self as i64
            }
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            fn to_f32(self) -> f32 {
                self as f32
            }
            fn wrap(v: Vec<Self>) -> TensorData {
                TensorData::$variant(v)
            }
            fn slice(d: &TensorData) -> Option<&[Self]> {
                match d {
                    TensorData::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn vec_mut(d: &mut TensorData) -> Option<&mut Vec<Self>> {
                match d {
                    TensorData::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}

int_element!(u8, U8);
int_element!(i8, I8);
int_element!(u16, U16);
int_element!(i16, I16);
int_element!(u32, U32);
int_element!(i32, I32);
int_element!(u64, U64);
int_element!(i64, I64);

macro_rules! float_element {
    ($t:ty, $variant:ident, $to:expr, $from:expr) => {
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            fn to_f64(self) -> f64 {
                ($to)(self)
            }
            fn from_f64(v: f64) -> Self {
                ($from)(v)
            }
            fn to_i64(self) -> i64 {
                ($to)(self) as i64
            }
            fn from_i64(v: i64) -> Self {
                ($from)(v as f64)
            }
            fn wrap(v: Vec<Self>) -> TensorData {
                TensorData::$variant(v)
            }
            fn slice(d: &TensorData) -> Option<&[Self]> {
                match d {
                    TensorData::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn vec_mut(d: &mut TensorData) -> Option<&mut Vec<Self>> {
                match d {
                    TensorData::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn is_nan(self) -> bool {
                ($to)(self).is_nan()
            }
        }
    };
}

float_element!(f32, F32, |x: f32| x as f64, |v: f64| v as f32);
float_element!(f64, F64, |x: f64| x, |v: f64| v);
float_element!(f16, F16, |x: f16| x.to_f64(), f16_from_f64);
float_element!(bf16, BF16, |x: bf16| x.to_f64(), bf16_from_f64);

/// `v` rounded to f32 by rounding to odd: toward zero, with the last bit set when inexact.
/// Rounding that to a format of at most 11 significant bits (f16, bf16) to nearest even gives
/// the same result as rounding `v` directly (24 ≥ 2·11 + 2 bits), so f64 values round once.
fn f32_round_to_odd(v: f64) -> f32 {
    let f = v as f32;
    if !f.is_finite() || f64::from(f) == v {
        return f;
    }
    let toward_zero = if f64::from(f).abs() > v.abs() {
        f32::from_bits(f.to_bits() - 1)
    } else {
        f
    };
    f32::from_bits(toward_zero.to_bits() | 1)
}

/// `v` to the nearest bf16 (ties to even), rounded once. `half`'s own f64 conversions drop
/// the low 32 bits of the f64 first, which loses the sticky bits of a value just above a tie
/// (f32 0xBF348006 became 0xBF34, not 0xBF35).
pub fn bf16_from_f64(v: f64) -> bf16 {
    bf16::from_f32(f32_round_to_odd(v))
}

/// `v` to the nearest f16 (ties to even), rounded once; see [`bf16_from_f64`].
pub fn f16_from_f64(v: f64) -> f16 {
    f16::from_f32(f32_round_to_odd(v))
}

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn to_f64(self) -> f64 {
        self as u8 as f64
    }
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    fn to_i64(self) -> i64 {
        self as i64
    }
    fn from_i64(v: i64) -> Self {
        v != 0
    }
    fn wrap(v: Vec<Self>) -> TensorData {
        TensorData::Bool(v)
    }
    fn slice(d: &TensorData) -> Option<&[Self]> {
        match d {
            TensorData::Bool(v) => Some(v),
            _ => None,
        }
    }
    fn vec_mut(d: &mut TensorData) -> Option<&mut Vec<Self>> {
        match d {
            TensorData::Bool(v) => Some(v),
            _ => None,
        }
    }
}

impl TensorData {
    pub fn dtype(&self) -> DType {
        with_data!(self, v => elem_dtype(v))
    }

    pub fn len(&self) -> usize {
        with_data!(self, v => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `n` zeros (false for bool) of type `dtype`.
    pub fn zeros(dtype: DType, n: usize) -> TensorData {
        fn z<T: Element>(n: usize) -> TensorData {
            T::wrap(vec![T::zero(); n])
        }
        crate::dispatch_dtype!(dtype, T => z::<T>(n))
    }

    /// Builds data of `dtype` from `f64` values with cast semantics.
    pub fn from_f64s(dtype: DType, vals: impl IntoIterator<Item = f64>) -> TensorData {
        let vals: Vec<f64> = vals.into_iter().collect();
        fn conv<T: Element>(vals: &[f64]) -> TensorData {
            T::wrap(vals.iter().map(|&v| T::from_f64(v)).collect())
        }
        crate::dispatch_dtype!(dtype, T => conv::<T>(&vals))
    }

    /// Converts every element to `dtype` with ONNX `Cast` semantics.
    pub fn cast(&self, dtype: DType) -> TensorData {
        fn cast_to<S: Element, T: Element>(v: &[S]) -> TensorData {
            T::wrap(v.iter().map(|&x| T::cast_from(x)).collect())
        }
        with_data!(self, v => crate::dispatch_dtype!(dtype, T => cast_to::<_, T>(v)))
    }
}

fn elem_dtype<T: Element>(_: &[T]) -> DType {
    T::DTYPE
}

/// Runs `$body` with the type alias `$T` set to the Rust element type of `$dtype`.
#[macro_export]
macro_rules! dispatch_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::DType::Bool => {
                type $T = bool;
                $body
            }
            $crate::DType::U8 => {
                type $T = u8;
                $body
            }
            $crate::DType::I8 => {
                type $T = i8;
                $body
            }
            $crate::DType::U16 => {
                type $T = u16;
                $body
            }
            $crate::DType::I16 => {
                type $T = i16;
                $body
            }
            $crate::DType::U32 => {
                type $T = u32;
                $body
            }
            $crate::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::DType::U64 => {
                type $T = u64;
                $body
            }
            $crate::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::DType::F16 => {
                type $T = half::f16;
                $body
            }
            $crate::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
        }
    };
}

/// A dense row-major tensor with a static shape.
#[derive(Clone, PartialEq, Debug)]
pub struct Tensor {
    shape: Vec<usize>,
    data: TensorData,
}

/// The data length does not match the shape.
#[derive(Debug, thiserror::Error)]
#[error("tensor data has {len} elements but shape {shape:?} needs {expected}")]
pub struct ShapeMismatch {
    pub shape: Vec<usize>,
    pub len: usize,
    pub expected: usize,
}

impl Tensor {
    pub fn new(shape: Vec<usize>, data: TensorData) -> Result<Tensor, ShapeMismatch> {
        let expected = checked_numel(&shape).unwrap_or(usize::MAX);
        if expected != data.len() {
            return Err(ShapeMismatch {
                shape,
                len: data.len(),
                expected,
            });
        }
        Ok(Tensor { shape, data })
    }

    /// Builds a tensor from a typed vector. Panics if the length does not match the shape:
    /// use it only where the caller computed both (never on data read from a model).
    pub fn from_vec<T: Element>(shape: Vec<usize>, data: Vec<T>) -> Tensor {
        Tensor::new(shape, T::wrap(data)).expect("tensor data length matches shape")
    }

    pub fn scalar<T: Element>(v: T) -> Tensor {
        Tensor::from_vec(vec![], vec![v])
    }

    pub fn zeros(dtype: DType, shape: Vec<usize>) -> Tensor {
        let n = shape.iter().product();
        Tensor {
            shape,
            data: TensorData::zeros(dtype, n),
        }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn data(&self) -> &TensorData {
        &self.data
    }

    pub fn data_mut(&mut self) -> &mut TensorData {
        &mut self.data
    }

    pub fn into_data(self) -> TensorData {
        self.data
    }

    pub fn size_bytes(&self) -> usize {
        self.len() * self.dtype().size_bytes()
    }

    pub fn tensor_type(&self) -> TensorType {
        TensorType::fixed(self.dtype(), &self.shape)
    }

    /// The typed elements, if the tensor holds `T`.
    pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
        T::slice(&self.data)
    }

    /// Same data, new shape with the same element count.
    pub fn reshaped(self, shape: Vec<usize>) -> Result<Tensor, ShapeMismatch> {
        Tensor::new(shape, self.data)
    }

    /// All elements converted to `f64`.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        with_data!(&self.data, v => v.iter().map(|x| x.to_f64()).collect())
    }

    /// All elements converted to `i64` (floats truncate). Used for shape-like inputs.
    pub fn to_i64_vec(&self) -> Vec<i64> {
        with_data!(&self.data, v => v.iter().map(|x| x.to_i64()).collect())
    }

    pub fn cast(&self, dtype: DType) -> Tensor {
        Tensor {
            shape: self.shape.clone(),
            data: self.data.cast(dtype),
        }
    }

    /// Little-endian bytes of the elements (bool as one byte 0/1), the layout of `.npy` files,
    /// ONNX `raw_data` and the compiled artifact's buffers.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        fn bytes<T: Element + LeBytes>(v: &[T]) -> Vec<u8> {
            let mut out = Vec::with_capacity(v.len() * T::DTYPE.size_bytes());
            for x in v {
                x.put_le(&mut out);
            }
            out
        }
        with_data!(&self.data, v => bytes(v))
    }

    /// Parses little-endian bytes into a tensor of `dtype` and `shape`.
    pub fn from_le_bytes(dtype: DType, shape: Vec<usize>, bytes: &[u8]) -> Result<Tensor, ShapeMismatch> {
        let n = checked_numel(&shape).unwrap_or(usize::MAX);
        let size = dtype.size_bytes();
        if n.checked_mul(size) != Some(bytes.len()) {
            return Err(ShapeMismatch {
                shape,
                len: bytes.len() / size,
                expected: n,
            });
        }
        fn parse<T: Element + LeBytes>(bytes: &[u8]) -> TensorData {
            let size = T::DTYPE.size_bytes();
            T::wrap(bytes.chunks_exact(size).map(T::get_le).collect())
        }
        let data = crate::dispatch_dtype!(dtype, T => parse::<T>(bytes));
        Tensor::new(shape, data)
    }
}

/// Number of elements of `shape`, or `None` if it overflows `usize`.
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// Little-endian (de)serialization of one element.
pub trait LeBytes: Sized {
    fn put_le(&self, out: &mut Vec<u8>);
    fn get_le(b: &[u8]) -> Self;
}

macro_rules! le_bytes {
    ($($t:ty),*) => {$(
        impl LeBytes for $t {
            fn put_le(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get_le(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().expect("chunk has the element size"))
            }
        }
    )*};
}
le_bytes!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64, f16, bf16);

impl LeBytes for bool {
    fn put_le(&self, out: &mut Vec<u8>) {
        out.push(*self as u8);
    }
    fn get_le(b: &[u8]) -> Self {
        b[0] != 0
    }
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.tensor_type())?;
        const SHOWN: usize = 8;
        let vals = self.to_f64_vec();
        f.write_str(" {")?;
        for (i, v) in vals.iter().take(SHOWN).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{v}")?;
        }
        if vals.len() > SHOWN {
            write!(f, ", ... ({} total)", vals.len())?;
        }
        f.write_str("}")
    }
}

#[cfg(test)]
mod rounding_tests {
    use super::{bf16_from_f64, f16_from_f64};
    use half::{bf16, f16};

    /// The nearer of the two bf16 neighbours of `v` (ties to the even one), by exact f64
    /// distances: an independent statement of round-to-nearest-even.
    fn nearest_bf16(v: f64) -> u16 {
        let lo = bf16::from_bits((v as f32).to_bits().wrapping_shr(16) as u16);
        let lo = if lo.to_f64().abs() > v.abs() {
            bf16::from_bits(lo.to_bits() - 1)
        } else {
            lo
        };
        let hi = bf16::from_bits(lo.to_bits() + 1);
        let (dl, dh) = ((v - lo.to_f64()).abs(), (hi.to_f64() - v).abs());
        if dl < dh || (dl == dh && lo.to_bits() % 2 == 0) {
            lo.to_bits()
        } else {
            hi.to_bits()
        }
    }

    #[test]
    fn bf16_rounds_once_with_sticky_bits() {
        // Just above a tie: the deciding bits are the f32's last three.
        assert_eq!(
            bf16_from_f64(f64::from(f32::from_bits(0xBF34_8006))).to_bits(),
            0xBF35
        );
        // Exact ties go to even; an f64 a hair above a tie rounds up.
        assert_eq!(bf16_from_f64(1.0 + 2f64.powi(-8)).to_bits(), 0x3F80);
        assert_eq!(bf16_from_f64(1.0 + 3.0 * 2f64.powi(-8)).to_bits(), 0x3F82);
        assert_eq!(
            bf16_from_f64(1.0 + 2f64.powi(-8) + 2f64.powi(-40)).to_bits(),
            0x3F81
        );
        assert_eq!(
            f16_from_f64(1.0 + 2f64.powi(-11) + 2f64.powi(-40)),
            f16::from_bits(0x3C01)
        );
        assert_eq!(f16_from_f64(1.0 + 2f64.powi(-11)), f16::from_bits(0x3C00));
        assert!(bf16_from_f64(f64::NAN).is_nan());
        assert_eq!(bf16_from_f64(1e300).to_bits(), 0x7F80);
        assert_eq!(bf16_from_f64(-1e-300).to_bits(), 0x8000);
        // Every f32 rounds as half's f32 conversion (which sees all its bits) rounds it, and
        // f64 values with bits below f32 precision as the exact nearest.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let f = f32::from_bits(x as u32);
            if f.is_finite() {
                assert_eq!(bf16_from_f64(f64::from(f)), bf16::from_f32(f), "{f:e}");
                assert_eq!(f16_from_f64(f64::from(f)), f16::from_f32(f), "{f:e}");
            }
            let v = f64::from_bits((x >> 2) | 0x3000_0000_0000_0000) * if x & 1 == 0 { 1.0 } else { -1.0 };
            if v.is_finite() && v.abs() < 1e30 && v.abs() > 1e-30 {
                assert_eq!(bf16_from_f64(v).to_bits(), nearest_bf16(v), "{v:e}");
            }
        }
    }
}
