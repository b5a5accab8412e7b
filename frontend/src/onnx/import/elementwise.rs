//! Import of element-wise operators: unary functions and activations, binary arithmetic,
//! comparison and logic, the variadic `Sum`/`Mean`/`Min`/`Max`, `Where`, `Clip`, `Cast` and
//! `CastLike`.

use super::NodeCtx;
use crate::error::Result;
use crate::onnx::tensor::dtype_from_onnx;
use kiln_ir::{Binary, DType, Op, Tensor, TensorData, Unary, UnaryAttrs, ValueId};

pub(super) fn import(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let op_type = cx.op_type().to_string();
    if let Some(u) = unary(cx, &op_type)? {
        let inputs = cx.inputs().to_vec();
        return Ok(vec![cx.add1(Op::Unary(u), inputs)?]);
    }
    if let Some(b) = binary(cx, &op_type)? {
        let inputs = cx.inputs().to_vec();
        return Ok(vec![cx.add1(Op::Binary(b), inputs)?]);
    }
    let out = match op_type.as_str() {
        "Sum" => variadic(cx, Binary::Add)?,
        "Min" => variadic(cx, Binary::Min)?,
        "Max" => variadic(cx, Binary::Max)?,
        "Mean" => mean(cx)?,
        "Where" => {
            let inputs = cx.inputs().to_vec();
            cx.add1(Op::Where, inputs)?
        }
        "Clip" => clip(cx)?,
        "Cast" => cast(cx)?,
        "CastLike" => {
            let (x, target) = (cx.input(0)?, cx.input(1)?);
            let to = cx.ty(target).dtype;
            cx.add1(Op::Cast { to }, vec![Some(x)])?
        }
        other => return Err(cx.err(format!("{other} is not an elementwise operator"))),
    };
    Ok(vec![out])
}

/// The unary operator `op_type` names (from the table in `kiln_ir::ops::unary`), with its
/// attributes (ONNX defaults filled in).
fn unary(cx: &NodeCtx, op_type: &str) -> Result<Option<Unary>> {
    let Some(parsed) = Unary::from_onnx(op_type, &Attrs(cx)) else {
        return Ok(None);
    };
    // The importer has checked the operator's opset against the table.
    parsed.map(Some).map_err(|msg| cx.err(msg))
}

/// A node's attributes as the unary table reads them.
struct Attrs<'a, 'b, 'p>(&'a NodeCtx<'b, 'p>);

impl UnaryAttrs for Attrs<'_, '_, '_> {
    fn float(&self, name: &str, default: f32) -> f32 {
        self.0.attr_f(name, default)
    }
    fn int(&self, name: &str, default: i64) -> i64 {
        self.0.attr_i(name, default)
    }
    fn string(&self, name: &str, default: &str) -> String {
        self.0.attr_s(name, default)
    }
}

/// The two-input operator `op_type` names.
fn binary(cx: &NodeCtx, op_type: &str) -> Result<Option<Binary>> {
    Ok(Some(match op_type {
        "Add" => Binary::Add,
        "Sub" => Binary::Sub,
        "Mul" => Binary::Mul,
        "Div" => Binary::Div,
        "Pow" => Binary::Pow,
        "Mod" => modulo(cx)?,
        "Equal" => Binary::Equal,
        "Less" => Binary::Less,
        "LessOrEqual" => Binary::LessOrEqual,
        "Greater" => Binary::Greater,
        "GreaterOrEqual" => Binary::GreaterOrEqual,
        "And" => Binary::And,
        "Or" => Binary::Or,
        "Xor" => Binary::Xor,
        "BitShift" => match cx.attr_s("direction", "").as_str() {
            "LEFT" => Binary::BitShiftLeft,
            "RIGHT" => Binary::BitShiftRight,
            "" => return Err(cx.err("attribute 'direction' is required")),
            other => {
                return Err(cx.err(format!(
                    "attribute 'direction' must be \"LEFT\" or \"RIGHT\", got \"{other}\""
                )))
            }
        },
        "BitwiseAnd" => Binary::BitwiseAnd,
        "BitwiseOr" => Binary::BitwiseOr,
        "BitwiseXor" => Binary::BitwiseXor,
        "PRelu" => Binary::PRelu,
        _ => return Ok(None),
    }))
}

/// `Mod`: `fmod=0` is the Python remainder, `fmod=1` C's `fmod`. Before opset 28, floats
/// required `fmod=1`.
fn modulo(cx: &NodeCtx) -> Result<Binary> {
    let fmod = cx.attr_flag("fmod", false)?;
    if !fmod && cx.opset() < 28 {
        let x = cx.input(0)?;
        if cx.ty(x).dtype.is_float() {
            return Err(cx.err("fmod must be 1 for floating-point inputs before opset 28"));
        }
    }
    Ok(if fmod { Binary::FMod } else { Binary::Mod })
}

/// Every input of a variadic operator; all must be present and there must be at least one.
fn variadic_inputs(cx: &NodeCtx) -> Result<Vec<ValueId>> {
    if cx.num_inputs() == 0 {
        return Err(cx.err("needs at least one input"));
    }
    (0..cx.num_inputs()).map(|i| cx.input(i)).collect()
}

/// `Sum`/`Min`/`Max` of N inputs as a left fold of binary nodes (broadcasting composes, so
/// the result is the same as broadcasting all inputs at once). One input is an identity.
fn variadic(cx: &mut NodeCtx, b: Binary) -> Result<ValueId> {
    let inputs = variadic_inputs(cx)?;
    fold(cx, b, &inputs, true)
}

/// Folds `inputs` with `b`; the last node carries the ONNX output name when `is_final`.
fn fold(cx: &mut NodeCtx, b: Binary, inputs: &[ValueId], is_final: bool) -> Result<ValueId> {
    let Some((&first, rest)) = inputs.split_first() else {
        return Err(cx.err("needs at least one input"));
    };
    if rest.is_empty() {
        return if is_final {
            cx.add1(Op::Identity, vec![Some(first)])
        } else {
            Ok(first)
        };
    }
    let mut acc = first;
    for (i, &v) in rest.iter().enumerate() {
        let args = vec![Some(acc), Some(v)];
        acc = if is_final && i + 1 == rest.len() {
            cx.add1(Op::Binary(b), args)?
        } else {
            cx.add_aux1(Op::Binary(b), args)?
        };
    }
    Ok(acc)
}

/// `Mean` = the sum of the inputs divided by their count (in the input type).
fn mean(cx: &mut NodeCtx) -> Result<ValueId> {
    let inputs = variadic_inputs(cx)?;
    if inputs.len() == 1 {
        return fold(cx, Binary::Add, &inputs, true);
    }
    let sum = fold(cx, Binary::Add, &inputs, false)?;
    let dtype = cx.ty(inputs[0]).dtype;
    let n = scalar(cx, dtype, inputs.len() as f64)?;
    cx.add1(Op::Binary(Binary::Div), vec![Some(sum), Some(n)])
}

/// A scalar constant of `dtype`.
fn scalar(cx: &mut NodeCtx, dtype: DType, v: f64) -> Result<ValueId> {
    let t = Tensor::new(vec![], TensorData::from_f64s(dtype, [v])).map_err(|e| cx.err(e.to_string()))?;
    Ok(cx.constant(t))
}

/// `Clip`: before opset 11 the bounds are float attributes, whose absent values default to
/// ±3.4028234663852886e38 (the schema's); they become scalar inputs of the input's type.
fn clip(cx: &mut NodeCtx) -> Result<ValueId> {
    let x = cx.input(0)?;
    if cx.opset() >= 11 {
        let inputs = cx.inputs().to_vec();
        return cx.add1(Op::Clip, inputs);
    }
    if cx.num_inputs() != 1 {
        return Err(cx.err(format!(
            "takes 1 input before opset 11 (bounds are attributes), got {}",
            cx.num_inputs()
        )));
    }
    let dtype = cx.ty(x).dtype;
    let lo = f64::from(cx.attr_f("min", f32::MIN));
    let hi = f64::from(cx.attr_f("max", f32::MAX));
    let lo = scalar(cx, dtype, lo)?;
    let hi = scalar(cx, dtype, hi)?;
    cx.add1(Op::Clip, vec![Some(x), Some(lo), Some(hi)])
}

/// `Cast` to the `to` attribute's type; `saturate` and `round_mode` only concern float8
/// targets, which kiln does not have.
fn cast(cx: &mut NodeCtx) -> Result<ValueId> {
    let Some(code) = cx.attr_opt_i("to") else {
        return Err(cx.err("attribute 'to' is required"));
    };
    let code = i32::try_from(code).map_err(|_| cx.err(format!("unknown data type {code} in 'to'")))?;
    let to = dtype_from_onnx(code).map_err(|msg| cx.err(format!("cannot cast: {msg}")))?;
    let inputs = cx.inputs().to_vec();
    cx.add1(Op::Cast { to }, inputs)
}

/// Builds one-node models for the importer tests of this family.
#[cfg(test)]
pub(super) mod testing {
    use crate::onnx::proto::*;
    use kiln_ir::Graph;

    pub fn attr_i(name: &str, i: i64) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            r#type: attribute_type::INT,
            i,
            ..Default::default()
        }
    }

    pub fn attr_f(name: &str, f: f32) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            r#type: attribute_type::FLOAT,
            f,
            ..Default::default()
        }
    }

    pub fn attr_ints(name: &str, ints: &[i64]) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            r#type: attribute_type::INTS,
            ints: ints.to_vec(),
            ..Default::default()
        }
    }

    /// A graph input `x<i>` of ONNX element type `elem_type` and static `dims`.
    pub fn input(i: usize, elem_type: i32, dims: &[i64]) -> ValueInfoProto {
        let dim = dims
            .iter()
            .map(|&d| Dimension {
                value: Some(DimValue::DimValue(d)),
                denotation: String::new(),
            })
            .collect();
        ValueInfoProto {
            name: format!("x{i}"),
            r#type: Some(TypeProto {
                value: Some(TypeValue::TensorType(TypeTensor {
                    elem_type,
                    shape: Some(TensorShapeProto { dim }),
                })),
                denotation: String::new(),
            }),
            doc_string: String::new(),
        }
    }

    /// Imports a model whose graph is one `op_type` node reading `inputs` (in order) and
    /// producing `n_out` graph outputs `y0, y1, ...`.
    pub fn import_one(
        op_type: &str,
        inputs: Vec<ValueInfoProto>,
        attribute: Vec<AttributeProto>,
        n_out: usize,
        opset: i64,
    ) -> crate::error::Result<Graph> {
        let outputs: Vec<String> = (0..n_out).map(|i| format!("y{i}")).collect();
        import_node_in("", op_type, inputs, attribute, outputs, opset)
    }

    /// Like [`import_one`] for an operator of `domain` (imported at version 1 besides the
    /// default domain's `opset`), with the node's declared output names (empty: not read); the
    /// named ones become the graph outputs.
    pub fn import_node_in(
        domain: &str,
        op_type: &str,
        inputs: Vec<ValueInfoProto>,
        attribute: Vec<AttributeProto>,
        outputs: Vec<String>,
        opset: i64,
    ) -> crate::error::Result<Graph> {
        let node = NodeProto {
            input: inputs.iter().map(|v| v.name.clone()).collect(),
            output: outputs.clone(),
            name: "n".into(),
            op_type: op_type.into(),
            domain: domain.into(),
            attribute,
            ..Default::default()
        };
        let outputs: Vec<String> = outputs.into_iter().filter(|o| !o.is_empty()).collect();
        let graph = GraphProto {
            node: vec![node],
            name: "g".into(),
            input: inputs,
            output: outputs
                .into_iter()
                .map(|name| ValueInfoProto {
                    name,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let model = ModelProto {
            ir_version: 8,
            opset_import: [(String::new(), opset), (domain.to_string(), 1)]
                .into_iter()
                .take(if domain.is_empty() { 1 } else { 2 })
                .map(|(domain, version)| OperatorSetIdProto { domain, version })
                .collect(),
            graph: Some(graph),
            ..Default::default()
        };
        Ok(crate::onnx::import_model(&model, ".".into(), &Default::default())?.graph)
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use crate::onnx::proto::data_type as dt;
    use kiln_ir::{Binary, Op, Tensor, TensorType};

    fn output_type(g: &kiln_ir::Graph, i: usize) -> TensorType {
        g.value_type(g.outputs()[i].value).clone()
    }

    #[test]
    fn clip_attributes_become_scalar_inputs_of_the_input_type() {
        let g = import_one(
            "Clip",
            vec![input(0, dt::FLOAT16, &[4])],
            vec![attr_f("min", -1.0)],
            1,
            7,
        )
        .unwrap();
        let clip = g.nodes().last().unwrap();
        assert_eq!(clip.op, Op::Clip);
        let bound = |i: usize| g.known_value(clip.inputs[i].unwrap()).unwrap().clone();
        assert_eq!(bound(1), Tensor::scalar(half::f16::from_f32(-1.0)));
        // The schema's default max (f32::MAX) overflows f16 to +inf: no upper bound.
        assert_eq!(bound(2), Tensor::scalar(half::f16::INFINITY));
    }

    #[test]
    fn mean_is_a_sum_chain_divided_by_the_count() {
        let inputs = (0..3).map(|i| input(i, dt::FLOAT, &[2])).collect();
        let g = import_one("Mean", inputs, vec![], 1, 13).unwrap();
        let ops: Vec<&Op> = g
            .nodes()
            .iter()
            .map(|n| &n.op)
            .filter(|op| !matches!(op, Op::Input))
            .collect();
        assert_eq!(ops.len(), 4);
        assert_eq!(ops[0], &Op::Binary(Binary::Add));
        assert_eq!(ops[1], &Op::Binary(Binary::Add));
        assert_eq!(ops[3], &Op::Binary(Binary::Div));
        let div = g.nodes().last().unwrap();
        assert_eq!(
            g.known_value(div.inputs[1].unwrap()),
            Some(&Tensor::scalar(3.0f32))
        );
        assert_eq!(g.value_name(g.outputs()[0].value), "y0");
        assert_eq!(output_type(&g, 0), TensorType::fixed(kiln_ir::DType::F32, &[2]));
    }

    #[test]
    fn float_mod_needs_fmod_before_opset_28() {
        let ins = || vec![input(0, dt::FLOAT, &[2]), input(1, dt::FLOAT, &[2])];
        assert!(import_one("Mod", ins(), vec![], 1, 13).is_err());
        assert!(import_one("Mod", ins(), vec![attr_i("fmod", 1)], 1, 13).is_ok());
        assert!(import_one("Mod", ins(), vec![], 1, 28).is_ok());
        assert!(import_one("Mod", ins(), vec![attr_i("fmod", 2)], 1, 28).is_err());
    }

    #[test]
    fn invalid_attributes_are_errors() {
        let x = || vec![input(0, dt::FLOAT, &[2])];
        let err = import_one("Celu", x(), vec![attr_f("alpha", 0.0)], 1, 13).unwrap_err();
        assert!(err.to_string().contains("alpha"), "{err}");
        assert!(import_one("IsInf", x(), vec![attr_i("detect_positive", 3)], 1, 20).is_err());
        let err = import_one("Cast", x(), vec![attr_i("to", 8)], 1, 13).unwrap_err();
        assert!(err.to_string().contains("string"), "{err}");
        assert!(import_one("Cast", x(), vec![], 1, 13).is_err());
    }

    #[test]
    fn an_operator_below_its_first_opset_is_refused_naming_both() {
        // The operator table's `since` column, for unary (own table) and other operators.
        let x = || vec![input(0, dt::FLOAT, &[2, 3])];
        let err = import_one("Gelu", x(), vec![], 1, 17).unwrap_err().to_string();
        assert!(
            err.contains("Gelu is defined from opset 20; the model imports opset 17"),
            "{err}"
        );
        assert!(import_one("Gelu", x(), vec![], 1, 20).is_ok());
        let two = || vec![input(0, dt::FLOAT, &[2, 3]), input(1, dt::FLOAT, &[2, 3])];
        let err = import_one("GreaterOrEqual", two(), vec![], 1, 11)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("defined from opset 12; the model imports opset 11"),
            "{err}"
        );
        assert!(import_one("GreaterOrEqual", two(), vec![], 1, 12).is_ok());
    }

    #[test]
    fn cast_like_takes_the_type_of_its_second_input() {
        let ins = vec![input(0, dt::INT8, &[3]), input(1, dt::BFLOAT16, &[])];
        let g = import_one("CastLike", ins, vec![], 1, 15).unwrap();
        assert_eq!(output_type(&g, 0), TensorType::fixed(kiln_ir::DType::BF16, &[3]));
    }
}
