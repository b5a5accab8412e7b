//! Helpers shared by the operator families: broadcasting, axes, strides, index iteration.

use crate::{Dim, OpError, Tensor, TensorType};

/// Normalizes a possibly negative axis against `rank` (ONNX: `-rank <= axis < rank`).
pub fn norm_axis(axis: i64, rank: usize) -> Result<usize, OpError> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        crate::bail!("axis {axis} is out of range for rank {rank}");
    }
    Ok(a as usize)
}

/// Like [`norm_axis`] for `Unsqueeze`-style axes that may equal `rank`.
pub fn norm_axis_inclusive(axis: i64, rank: usize) -> Result<usize, OpError> {
    norm_axis(axis, rank + 1)
}

/// Row-major strides of `shape` (in elements).
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Numpy broadcast of two symbolic shapes (multidirectional). Unknown against 1 gives the
/// unknown; unknown against a fixed extent > 1 gives that extent.
pub fn broadcast_dims(a: &[Dim], b: &[Dim]) -> Result<Vec<Dim>, OpError> {
    let rank = a.len().max(b.len());
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            Some(&a[i + a.len() - rank])
        } else {
            None
        };
        let db = if i + b.len() >= rank {
            Some(&b[i + b.len() - rank])
        } else {
            None
        };
        let d = match (da, db) {
            (Some(x), None) | (None, Some(x)) => x.clone(),
            (Some(x), Some(y)) => match (x, y) {
                (Dim::Fixed(1), o) | (o, Dim::Fixed(1)) => o.clone(),
                (Dim::Fixed(p), Dim::Fixed(q)) if p == q => x.clone(),
                (Dim::Fixed(_), Dim::Fixed(_)) => {
                    crate::bail!("shapes {} and {} cannot be broadcast", fmt_dims(a), fmt_dims(b))
                }
                (Dim::Fixed(_), Dim::Sym(_)) => x.clone(),
                (Dim::Sym(_), Dim::Fixed(_)) => y.clone(),
                (Dim::Sym(p), Dim::Sym(q)) if p == q => x.clone(),
                (Dim::Sym(_), Dim::Sym(_)) => Dim::unknown(),
            },
            (None, None) => unreachable!(),
        };
        out.push(d);
    }
    Ok(out)
}

/// Numpy broadcast of concrete shapes.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Vec<usize>, OpError> {
    let rank = a.len().max(b.len());
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        let d = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            crate::bail!("shapes {a:?} and {b:?} cannot be broadcast");
        };
        out.push(d);
    }
    Ok(out)
}

/// Broadcast of any number of concrete shapes.
pub fn broadcast_many(shapes: &[&[usize]]) -> Result<Vec<usize>, OpError> {
    let mut out: Vec<usize> = vec![];
    for s in shapes {
        out = broadcast_shapes(&out, s)?;
    }
    Ok(out)
}

/// For each element of the broadcast result shape `out`, the flat index into a tensor of shape
/// `inp` (which must broadcast to `out`). Straightforward and allocation-heavy by design: this
/// is the reference interpreter.
pub fn broadcast_index_map(inp: &[usize], out: &[usize]) -> Vec<usize> {
    let n: usize = out.iter().product();
    let rank = out.len();
    let off = rank - inp.len();
    let in_strides = strides(inp);
    // Effective stride of each output axis in the input (0 where broadcast).
    let eff: Vec<usize> = (0..rank)
        .map(|i| {
            if i < off || inp[i - off] == 1 {
                0
            } else {
                in_strides[i - off]
            }
        })
        .collect();
    let mut map = Vec::with_capacity(n);
    let mut idx = vec![0usize; rank];
    let mut flat = 0usize;
    for _ in 0..n {
        map.push(flat);
        // Increment the multi-index, updating the input offset incrementally.
        for ax in (0..rank).rev() {
            idx[ax] += 1;
            flat += eff[ax];
            if idx[ax] < out[ax] {
                break;
            }
            flat -= eff[ax] * idx[ax];
            idx[ax] = 0;
        }
    }
    map
}

/// Converts a flat index to a multi-index for `shape`.
pub fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for i in (0..shape.len()).rev() {
        if shape[i] > 0 {
            idx[i] = flat % shape[i];
            flat /= shape[i];
        }
    }
    idx
}

/// Converts a multi-index to a flat index for `shape`.
pub fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (&i, &d)| acc * d + i)
}

pub fn fmt_dims(d: &[Dim]) -> String {
    let parts: Vec<String> = d.iter().map(|x| x.to_string()).collect();
    format!("[{}]", parts.join(","))
}

/// The values of a known 1-D (or scalar) integer input, e.g. a `Reshape` shape.
pub fn known_i64s(t: Option<&Tensor>) -> Option<Vec<i64>> {
    let t = t?;
    if !t.dtype().is_int() {
        return None;
    }
    Some(t.to_i64_vec())
}

/// A type with the same dtype and layout as `t` and a new shape.
pub fn with_shape(t: &TensorType, shape: Vec<Dim>) -> TensorType {
    TensorType {
        dtype: t.dtype,
        shape,
        layout: t.layout,
    }
}

/// Fixed dims from concrete extents.
pub fn dims(shape: &[usize]) -> Vec<Dim> {
    shape.iter().map(|&d| Dim::Fixed(d)).collect()
}

/// Checks a declared element count against a limit before allocating, so that an absurd
/// shape in a model is an error and not an out-of-memory abort.
/// Shapes computed from data (an Expand's target, a Range's length) are checked here; the
/// memory budget is applied at one byte per element, the least any dtype takes.
pub fn check_alloc(shape: &[usize]) -> Result<usize, OpError> {
    let n = check_numel(shape)?;
    crate::budget::check(n as u128, 0, &format!("a tensor of shape {shape:?}"))?;
    Ok(n)
}

/// The element count of `shape` when it is within what any evaluation could allocate; for
/// type inference, which allocates nothing (the memory budget is not consulted).
pub fn check_numel(shape: &[usize]) -> Result<usize, OpError> {
    const MAX_ELEMENTS: usize = 1 << 34;
    match crate::tensor::checked_numel(shape) {
        Some(n) if n <= MAX_ELEMENTS => Ok(n),
        _ => crate::bail!("tensor of shape {shape:?} is too large"),
    }
}

/// A tiny deterministic xorshift generator for the randomized operator tests.
#[cfg(test)]
pub(crate) struct TestRng(pub u64);

#[cfg(test)]
#[allow(dead_code)]
impl TestRng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}
