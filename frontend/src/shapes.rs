//! Input-shape binding: `--input-shape x=1,3,224,224` fixes the dims of a graph input.

use crate::error::{FrontendError, Result};
use kiln_ir::{Dim, TensorType};
use std::collections::HashMap;

/// A batch range: `--input-shape x=1..8,3,224,224` lets a run take any batch of `lo..=hi`
/// samples along axis 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchRange {
    pub lo: usize,
    pub hi: usize,
}

impl std::fmt::Display for BatchRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}..{}", self.lo, self.hi)
    }
}

/// One `--input-shape` argument: the input, its dims (axis 0 is a placeholder when `batch` is
/// given) and the batch range of axis 0, if one was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputShape {
    pub name: String,
    pub dims: Vec<usize>,
    pub batch: Option<BatchRange>,
}

impl InputShape {
    /// The dims with the batch axis (if ranged) set to `n`.
    pub fn at_batch(&self, n: usize) -> (String, Vec<usize>) {
        let mut dims = self.dims.clone();
        if self.batch.is_some() {
            dims[0] = n;
        }
        (self.name.clone(), dims)
    }
}

/// Parses `NAME=D0,D1,...` (also accepts `x` as separator: `1x3x224x224`). The first dim may be
/// a range `LO..HI` (the batch).
pub fn parse_input_shape(s: &str) -> Result<InputShape> {
    let err = |m: &str| {
        FrontendError::InputShape(format!(
            "'{s}': {m} (expected NAME=D0,D1,..., e.g. x=1,3,224,224, or x=1..8,3,224,224 for a batch range)"
        ))
    };
    let (name, dims) = s.rsplit_once('=').ok_or_else(|| err("missing '='"))?;
    if name.is_empty() {
        return Err(err("missing input name"));
    }
    let dims = dims.trim();
    let mut shape = InputShape {
        name: name.to_string(),
        dims: vec![],
        batch: None,
    };
    if dims.is_empty() {
        return Ok(shape);
    }
    let number = |d: &str| {
        d.trim()
            .parse::<usize>()
            .map_err(|_| err(&format!("'{}' is not a non-negative integer", d.trim())))
    };
    // Split on ',' (or 'x' when there is no ','), so that a range's ".." stays whole.
    let parts: Vec<&str> = if dims.contains(',') {
        dims.split(',').collect()
    } else {
        dims.split('x').collect()
    };
    for (axis, d) in parts.iter().enumerate() {
        if let Some((lo, hi)) = d.split_once("..") {
            if axis != 0 {
                return Err(err(&format!(
                    "'{}' on axis {axis}: only the first (batch) axis may be a range; the other dims are fixed",
                    d.trim()
                )));
            }
            let (lo, hi) = (number(lo)?, number(hi)?);
            if lo == 0 || lo > hi {
                return Err(err(&format!("the range {lo}..{hi} must have 1 <= LO <= HI")));
            }
            shape.batch = Some(BatchRange { lo, hi });
            shape.dims.push(lo);
        } else {
            shape.dims.push(number(d)?);
        }
    }
    Ok(shape)
}

/// The batch range of a set of `--input-shape` arguments: at most one, shared by every input
/// given one.
pub fn batch_range(shapes: &[InputShape]) -> Result<Option<BatchRange>> {
    let mut ranged = shapes.iter().filter_map(|s| s.batch.map(|b| (s, b)));
    let Some((first, range)) = ranged.next() else {
        return Ok(None);
    };
    if let Some((other, b)) = ranged.find(|(_, b)| *b != range) {
        return Err(FrontendError::InputShape(format!(
            "inputs '{}' and '{}' have different batch ranges ({range} and {b}); a model has one batch range",
            first.name, other.name
        )));
    }
    Ok(Some(range))
}

/// Applies bindings to the graph inputs' types. A binding must name an input and match its
/// rank and fixed dims; a symbol bound once is bound in every input that uses it. The inputs
/// in `batch_inputs` were given a batch range: their axis 0 must be symbolic.
pub fn bind_input_shapes(
    inputs: &mut [(String, TensorType)],
    bindings: &[(String, Vec<usize>)],
    batch_inputs: &[String],
) -> Result<()> {
    let mut symbols: HashMap<String, usize> = HashMap::new();
    for (name, dims) in bindings {
        let Some((_, ty)) = inputs.iter().find(|(n, _)| n == name) else {
            let names: Vec<&str> = inputs.iter().map(|(n, _)| n.as_str()).collect();
            return Err(FrontendError::InputShape(format!(
                "the model has no input '{name}' (its inputs: {})",
                names.join(", ")
            )));
        };
        if ty.rank() != dims.len() {
            return Err(FrontendError::InputShape(format!(
                "input '{name}' has rank {} ({ty}) but {} dims were given",
                ty.rank(),
                dims.len()
            )));
        }
        if let (true, Some(Dim::Fixed(f))) = (batch_inputs.contains(name), ty.shape.first()) {
            return Err(FrontendError::InputShape(format!(
                "input '{name}' is {ty}: its first axis is fixed at {f} in the model, so it cannot take a batch range (export the model with a dynamic batch axis)"
            )));
        }
        for (d, &v) in ty.shape.iter().zip(dims) {
            match d {
                Dim::Fixed(f) if *f != v => {
                    return Err(FrontendError::InputShape(format!(
                        "input '{name}' is {ty}: its fixed dimension {f} cannot be bound to {v}"
                    )))
                }
                Dim::Sym(s) if s != "?" => {
                    if let Some(&prev) = symbols.get(s) {
                        if prev != v {
                            return Err(FrontendError::InputShape(format!(
                                "dimension '{s}' is bound to both {prev} and {v}"
                            )));
                        }
                    }
                    symbols.insert(s.clone(), v);
                }
                _ => {}
            }
        }
    }
    for (name, ty) in inputs.iter_mut() {
        let explicit = bindings.iter().find(|(n, _)| n == name);
        for (i, d) in ty.shape.iter_mut().enumerate() {
            if let Some((_, dims)) = explicit {
                *d = Dim::Fixed(dims[i]);
            } else if let Dim::Sym(s) = d {
                if let Some(&v) = symbols.get(s.as_str()) {
                    *d = Dim::Fixed(v);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_dim_may_be_a_batch_range() {
        let s = parse_input_shape("x=1..8,3,224,224").unwrap();
        assert_eq!(s.batch, Some(BatchRange { lo: 1, hi: 8 }));
        assert_eq!(s.at_batch(5), ("x".to_string(), vec![5, 3, 224, 224]));
        let s = parse_input_shape("ids=2..4x128").unwrap();
        assert_eq!(
            (s.batch, s.dims),
            (Some(BatchRange { lo: 2, hi: 4 }), vec![2, 128])
        );
        let fixed = parse_input_shape("x=1,3").unwrap();
        assert_eq!((fixed.batch, fixed.at_batch(7).1), (None, vec![1, 3]));
    }

    #[test]
    fn bad_ranges_say_what_is_wrong() {
        for (arg, msg) in [
            ("x=1,1..512", "only the first (batch) axis may be a range"),
            ("x=0..8,3", "1 <= LO <= HI"),
            ("x=8..2,3", "1 <= LO <= HI"),
            ("x=1..y,3", "'y' is not a non-negative integer"),
        ] {
            let e = parse_input_shape(arg).unwrap_err().to_string();
            assert!(e.contains(msg), "{arg}: {e}");
        }
        let shapes = ["a=1..8,4", "b=1..4,4"].map(|s| parse_input_shape(s).unwrap());
        let e = batch_range(&shapes).unwrap_err().to_string();
        assert!(e.contains("different batch ranges (1..8 and 1..4)"), "{e}");
    }

    #[test]
    fn a_range_needs_a_symbolic_batch_axis() {
        let mut inputs = vec![("x".to_string(), TensorType::fixed(kiln_ir::DType::F32, &[1, 3]))];
        let e = bind_input_shapes(&mut inputs, &[("x".into(), vec![1, 3])], &["x".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("first axis is fixed at 1"), "{e}");
    }
}
