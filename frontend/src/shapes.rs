//! Input-shape binding: `--input-shape x=1,3,224,224` fixes the dims of a graph input.

use crate::error::{FrontendError, Result};
use kiln_ir::{Dim, TensorType};
use std::collections::HashMap;

/// Parses `NAME=D0,D1,...` (also accepts `x` as separator: `1x3x224x224`).
pub fn parse_input_shape(s: &str) -> Result<(String, Vec<usize>)> {
    let err = |m: &str| {
        FrontendError::InputShape(format!(
            "'{s}': {m} (expected NAME=D0,D1,..., e.g. x=1,3,224,224)"
        ))
    };
    let (name, dims) = s.rsplit_once('=').ok_or_else(|| err("missing '='"))?;
    if name.is_empty() {
        return Err(err("missing input name"));
    }
    let dims = dims.trim();
    if dims.is_empty() {
        return Ok((name.to_string(), vec![]));
    }
    let dims = dims
        .split([',', 'x'])
        .map(|d| {
            d.trim()
                .parse::<usize>()
                .map_err(|_| err(&format!("'{d}' is not a non-negative integer")))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((name.to_string(), dims))
}

/// Applies bindings to the graph inputs' types. A binding must name an input and match its
/// rank and fixed dims; a symbol bound once is bound in every input that uses it.
pub fn bind_input_shapes(
    inputs: &mut [(String, TensorType)],
    bindings: &[(String, Vec<usize>)],
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
