//! Shapes, layouts and tensor types.

use crate::DType;
use std::fmt;

/// One dimension of a tensor shape: a fixed extent, or a named symbol that is bound later
/// (`batch`, `seq`) or that type inference could not determine (`?`).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum Dim {
    Fixed(usize),
    Sym(String),
}

impl Dim {
    /// A dimension type inference could not determine.
    pub fn unknown() -> Dim {
        Dim::Sym("?".to_string())
    }

    pub fn fixed(&self) -> Option<usize> {
        match self {
            Dim::Fixed(n) => Some(*n),
            Dim::Sym(_) => None,
        }
    }

    pub fn is_fixed(&self) -> bool {
        matches!(self, Dim::Fixed(_))
    }
}

impl From<usize> for Dim {
    fn from(n: usize) -> Dim {
        Dim::Fixed(n)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Sym(s) => f.write_str(s),
        }
    }
}

/// How a tensor's logical dimensions map to memory.
///
/// Every value is `RowMajor` (the logical order, last dimension contiguous) until the
/// channels-last pass decides otherwise; the logical shape never changes with the layout.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub enum Layout {
    #[default]
    RowMajor,
    /// A 4-D NCHW-shaped value stored as NHWC (or 3-D/5-D analogues: channels innermost).
    ChannelsLast,
}

/// The static type of a value: element type, shape and layout.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Vec<Dim>,
    pub layout: Layout,
}

impl TensorType {
    pub fn new(dtype: DType, shape: Vec<Dim>) -> TensorType {
        TensorType {
            dtype,
            shape,
            layout: Layout::RowMajor,
        }
    }

    /// A type with every dimension fixed.
    pub fn fixed(dtype: DType, shape: &[usize]) -> TensorType {
        TensorType::new(dtype, shape.iter().map(|&d| Dim::Fixed(d)).collect())
    }

    pub fn scalar(dtype: DType) -> TensorType {
        TensorType::new(dtype, vec![])
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The shape as numbers, when every dimension is fixed.
    pub fn fixed_shape(&self) -> Option<Vec<usize>> {
        self.shape.iter().map(Dim::fixed).collect()
    }

    pub fn is_static(&self) -> bool {
        self.shape.iter().all(Dim::is_fixed)
    }

    /// Number of elements, when the shape is static and the count fits in `usize`.
    pub fn num_elements(&self) -> Option<usize> {
        self.fixed_shape().and_then(|s| crate::tensor::checked_numel(&s))
    }

    /// Size in bytes, when the shape is static and the size fits in `usize`.
    pub fn size_bytes(&self) -> Option<usize> {
        self.num_elements()
            .and_then(|n| n.checked_mul(self.dtype.size_bytes()))
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")?;
        if self.layout == Layout::ChannelsLast {
            f.write_str("{nhwc}")?;
        }
        Ok(())
    }
}
