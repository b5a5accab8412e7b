//! Import of the control-flow operators `If` and `Loop` (their signatures are unchanged from
//! opset 7 to 28; later opsets only admit sequence and optional types, which kiln lacks).

use super::NodeCtx;
use crate::error::Result;
use kiln_ir::{DType, Dim, Graph, Op, TensorType, ValueId};

pub(super) fn import(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    match cx.op_type() {
        "If" => import_if(cx),
        "Loop" => import_loop(cx),
        other => Err(cx.err(format!("'{other}' is not a control-flow operator"))),
    }
}

/// The value of a known single-element bool tensor.
fn known_bool(cx: &NodeCtx, v: ValueId) -> Option<bool> {
    match cx.known(v)?.as_slice::<bool>()? {
        [b] => Some(*b),
        _ => None,
    }
}

fn import_if(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let cond = cx.input(0)?;
    if cx.num_inputs() != 1 {
        return Err(cx.err(format!("If takes one input (cond), {} given", cx.num_inputs())));
    }
    let mut branches = vec![];
    for name in ["then_branch", "else_branch"] {
        let g = cx
            .attr_graph(name)
            .ok_or_else(|| cx.err(format!("graph attribute '{name}' is missing")))?;
        if !g.input.is_empty() {
            return Err(cx.err(format!(
                "{name} declares {} inputs; If branches take none",
                g.input.len()
            )));
        }
        if g.output.len() != cx.num_outputs() {
            return Err(cx.err(format!(
                "{name} has {} outputs but the node declares {}",
                g.output.len(),
                cx.num_outputs()
            )));
        }
        branches.push(g);
    }
    let (then_g, else_g) = (branches[0], branches[1]);
    // A condition known now (typically derived from static shapes, as in expanded ONNX
    // functions that branch on rank) selects its branch at import: the other branch is never
    // imported, since it need not even type-check for these inputs, and the taken branch's
    // values stay visible to shape inference downstream.
    if let Some(c) = known_bool(cx, cond) {
        return cx.inline_subgraph(if c { then_g } else { else_g });
    }
    let (mut then_ir, then_captures) = cx.import_subgraph(then_g, &[])?;
    let (else_ir, captures) = cx.import_subgraph_with_captures(else_g, &[], &then_captures)?;
    // Both branches take the same inputs: the then-branch ignores the else-branch's extras.
    for &v in &captures[then_captures.len()..] {
        then_ir.add_input(cx.graph().value_name(v).to_string(), cx.ty(v).clone());
    }
    let mut inputs = vec![Some(cond)];
    inputs.extend(captures.into_iter().map(Some));
    let op = Op::If {
        then_branch: Box::new(then_ir),
        else_branch: Box::new(else_ir),
    };
    cx.add(op, inputs)
}

fn import_loop(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let trip_count = cx.opt_input(0);
    let cond = cx.opt_input(1);
    if trip_count.is_none() && cond.is_none() {
        return Err(cx.err("Loop has neither a trip count M nor a condition: it would never terminate"));
    }
    let carried = (2..cx.num_inputs())
        .map(|i| cx.input(i))
        .collect::<Result<Vec<_>>>()?;
    let body = cx
        .attr_graph("body")
        .ok_or_else(|| cx.err("graph attribute 'body' is missing"))?;
    if body.input.len() != 2 + carried.len() {
        return Err(cx.err(format!(
            "the body declares {} inputs, expected {} (iteration number, condition, {} loop-carried)",
            body.input.len(),
            2 + carried.len(),
            carried.len()
        )));
    }
    if body.output.len() != 1 + cx.num_outputs() || cx.num_outputs() < carried.len() {
        return Err(cx.err(format!(
            "the body has {} outputs and the node {}; expected the condition plus one body output per node \
             output, at least one per loop-carried value ({})",
            body.output.len(),
            cx.num_outputs(),
            carried.len()
        )));
    }
    let mut formals = vec![TensorType::scalar(DType::I64), TensorType::scalar(DType::Bool)];
    formals.extend(carried.iter().map(|&v| cx.ty(v).clone()));
    let (graph, captures) = import_body(cx, body, formals)?;
    let mut inputs = vec![trip_count, cond];
    inputs.extend(carried.iter().map(|&v| Some(v)));
    inputs.extend(captures.into_iter().map(Some));
    let op = Op::Loop {
        body: Box::new(graph),
        num_carried: carried.len(),
    };
    cx.add(op, inputs)
}

/// Imports the loop body. A body may change the shape of a loop-carried value between
/// iterations; the body is then imported again with the extents that change made unknown, so
/// that every iteration's values fit its input types.
fn import_body(
    cx: &mut NodeCtx,
    body: &super::super::proto::GraphProto,
    mut formals: Vec<TensorType>,
) -> Result<(Graph, Vec<ValueId>)> {
    // Each round makes at least one more extent unknown, so few rounds are ever needed.
    const MAX_ROUNDS: usize = 8;
    let mut round = 0;
    loop {
        let (graph, captures) = cx.import_subgraph(body, &formals)?;
        let generalized = generalize(cx, &graph, &formals)?;
        round += 1;
        match generalized {
            Some(next) if round < MAX_ROUNDS => formals = next,
            _ => return Ok((graph, captures)),
        }
    }
}

/// For each loop-carried value whose body output type differs from its body input type, the
/// formal input types with those extents unknown; `None` when nothing changes.
fn generalize(cx: &NodeCtx, body: &Graph, formals: &[TensorType]) -> Result<Option<Vec<TensorType>>> {
    let inputs: Vec<&TensorType> = body.input_types().map(|(_, t)| t).collect();
    let mut next = formals.to_vec();
    let mut changed = false;
    for (j, out) in body.outputs().iter().skip(1).take(formals.len() - 2).enumerate() {
        let (inp, out) = (inputs[2 + j], body.value_type(out.value));
        if inp.dtype != out.dtype || inp.rank() != out.rank() {
            return Err(cx.err(format!(
                "loop-carried value {j} enters the body as {inp} but leaves it as {out}; \
                 its dtype and rank must stay the same"
            )));
        }
        let shape: Vec<Dim> = inp
            .shape
            .iter()
            .zip(&out.shape)
            .map(|(a, b)| if a == b { a.clone() } else { Dim::unknown() })
            .collect();
        if shape != next[2 + j].shape {
            next[2 + j] = TensorType::new(inp.dtype, shape);
            changed = true;
        }
    }
    Ok(changed.then_some(next))
}

#[cfg(test)]
mod tests {
    use crate::onnx::proto::{
        attribute_type, data_type, AttributeProto, DimValue, Dimension, GraphProto, ModelProto, NodeProto,
        OperatorSetIdProto, TensorShapeProto, TypeProto, TypeTensor, TypeValue, ValueInfoProto,
    };
    use crate::onnx::{import_model, tensor::tensor_to_proto};
    use crate::ImportOptions;
    use kiln_ir::{eval::eval_graph, Op, Tensor};

    fn value(name: &str, elem: i32, dims: &[i64]) -> ValueInfoProto {
        let dim = dims
            .iter()
            .map(|&d| Dimension {
                value: Some(DimValue::DimValue(d)),
                ..Default::default()
            })
            .collect();
        ValueInfoProto {
            name: name.into(),
            r#type: Some(TypeProto {
                value: Some(TypeValue::TensorType(TypeTensor {
                    elem_type: elem,
                    shape: Some(TensorShapeProto { dim }),
                })),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A value info without type (as subgraph outputs often are).
    fn untyped(name: &str) -> ValueInfoProto {
        ValueInfoProto {
            name: name.into(),
            ..Default::default()
        }
    }

    fn cell(name: &str) -> ValueInfoProto {
        value(name, data_type::FLOAT, &[1, 1, 1])
    }

    fn node(op: &str, inputs: &[&str], outputs: &[&str], attribute: Vec<AttributeProto>) -> NodeProto {
        NodeProto {
            op_type: op.into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            attribute,
            ..Default::default()
        }
    }

    fn graph_attr(name: &str, g: GraphProto) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            r#type: attribute_type::GRAPH,
            g: Some(g),
            ..Default::default()
        }
    }

    /// `out = x + s` for f32[1,1,1] values: a one-step identity-activation RNN with unit
    /// weights (`one` must be in scope), so these tests need no other operator family.
    fn add(x: &str, s: &str, out: &str) -> NodeProto {
        let acts = AttributeProto {
            name: "activations".into(),
            r#type: attribute_type::STRINGS,
            strings: vec!["Affine".into()],
            ..Default::default()
        };
        let hidden = AttributeProto {
            name: "hidden_size".into(),
            r#type: attribute_type::INT,
            i: 1,
            ..Default::default()
        };
        node(
            "RNN",
            &[s, "one", "one", "", "", x],
            &["", out],
            vec![acts, hidden],
        )
    }

    fn model(g: GraphProto, opset: i64) -> ModelProto {
        ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: opset,
            }],
            graph: Some(g),
            ..Default::default()
        }
    }

    fn one() -> crate::onnx::proto::TensorProto {
        tensor_to_proto("one", &Tensor::from_vec(vec![1, 1, 1], vec![1.0f32]))
    }

    fn c(v: f32) -> Tensor {
        Tensor::from_vec(vec![1, 1, 1], vec![v])
    }

    fn import(g: GraphProto) -> kiln_ir::Graph {
        let m = import_model(&model(g, 17), ".".into(), &ImportOptions::default()).unwrap();
        kiln_ir::verify(&m.graph).unwrap();
        m.graph
    }

    /// Branches capturing different outer values share one capture list.
    #[test]
    fn if_branches_share_captures() {
        let then_g = GraphProto {
            name: "then".into(),
            node: vec![add("a", "s", "t")],
            output: vec![untyped("t")],
            ..Default::default()
        };
        let else_g = GraphProto {
            name: "else".into(),
            node: vec![add("b", "s", "e")],
            output: vec![untyped("e")],
            ..Default::default()
        };
        let g = GraphProto {
            name: "main".into(),
            node: vec![node(
                "If",
                &["cond"],
                &["y"],
                vec![
                    graph_attr("then_branch", then_g),
                    graph_attr("else_branch", else_g),
                ],
            )],
            initializer: vec![one()],
            input: vec![
                value("cond", data_type::BOOL, &[]),
                cell("a"),
                cell("b"),
                cell("s"),
            ],
            output: vec![cell("y")],
            ..Default::default()
        };
        let ir = import(g);
        let Some(Op::If {
            then_branch,
            else_branch,
        }) = ir
            .nodes()
            .iter()
            .map(|n| &n.op)
            .find(|op| matches!(op, Op::If { .. }))
        else {
            panic!("no If node in {ir}");
        };
        assert_eq!(then_branch.inputs().len(), 3);
        assert_eq!(else_branch.inputs().len(), 3);
        for (cond, want) in [(true, 11.0), (false, 21.0)] {
            let out = eval_graph(&ir, vec![Tensor::scalar(cond), c(10.0), c(20.0), c(1.0)]).unwrap();
            assert_eq!(out[0].to_f64_vec(), vec![want]);
        }
    }

    /// A condition known at import selects its branch; the other is never imported (here it
    /// would not type-check: its RNN gets a wrong hidden size).
    #[test]
    fn known_condition_inlines_the_branch() {
        let then_g = GraphProto {
            node: vec![add("a", "a", "t")],
            output: vec![untyped("t")],
            ..Default::default()
        };
        let mut broken = add("a", "a", "e");
        broken.attribute[1].i = 5;
        let else_g = GraphProto {
            node: vec![broken],
            output: vec![untyped("e")],
            ..Default::default()
        };
        let flag = tensor_to_proto("flag", &Tensor::scalar(true));
        let g = GraphProto {
            node: vec![node(
                "If",
                &["flag"],
                &["y"],
                vec![
                    graph_attr("then_branch", then_g),
                    graph_attr("else_branch", else_g),
                ],
            )],
            initializer: vec![one(), flag],
            input: vec![cell("a")],
            output: vec![cell("y")],
            ..Default::default()
        };
        let ir = import(g);
        assert!(ir.nodes().iter().all(|n| !matches!(n.op, Op::If { .. })), "{ir}");
        let out = eval_graph(&ir, vec![c(4.0)]).unwrap();
        assert_eq!(out[0].to_f64_vec(), vec![8.0]);
    }

    /// A for-loop accumulating a captured step, scanning each value; the body holds an If on
    /// a main-graph value, so captures cross two levels.
    #[test]
    fn loop_with_nested_if_and_scan() {
        let then_g = GraphProto {
            node: vec![add("x", "s", "t")],
            output: vec![untyped("t")],
            ..Default::default()
        };
        let else_g = GraphProto {
            node: vec![add("x", "x", "e")],
            output: vec![untyped("e")],
            ..Default::default()
        };
        let body = GraphProto {
            name: "body".into(),
            node: vec![
                node(
                    "If",
                    &["use_step"],
                    &["y"],
                    vec![
                        graph_attr("then_branch", then_g),
                        graph_attr("else_branch", else_g),
                    ],
                ),
                add("y", "zero", "scan"),
            ],
            input: vec![
                value("i", data_type::INT64, &[]),
                value("c", data_type::BOOL, &[]),
                cell("x"),
            ],
            output: vec![untyped("c"), untyped("y"), untyped("scan")],
            ..Default::default()
        };
        let m = tensor_to_proto("m", &Tensor::scalar(3i64));
        let zero = tensor_to_proto("zero", &c(0.0));
        let g = GraphProto {
            node: vec![node(
                "Loop",
                &["m", "", "x0"],
                &["x_final", "xs"],
                vec![graph_attr("body", body)],
            )],
            initializer: vec![one(), m, zero],
            input: vec![value("use_step", data_type::BOOL, &[]), cell("x0"), cell("s")],
            output: vec![cell("x_final"), untyped("xs")],
            ..Default::default()
        };
        let ir = import(g);
        let xs = ir.outputs()[1].value;
        assert_eq!(ir.value_type(xs).to_string(), "f32[3,1,1,1]");
        let out = eval_graph(&ir, vec![Tensor::scalar(true), c(1.0), c(2.0)]).unwrap();
        assert_eq!(out[0].to_f64_vec(), vec![7.0]);
        assert_eq!(out[1].to_f64_vec(), vec![3.0, 5.0, 7.0]);
        let out = eval_graph(&ir, vec![Tensor::scalar(false), c(1.0), c(2.0)]).unwrap();
        assert_eq!(out[1].to_f64_vec(), vec![2.0, 4.0, 8.0]);
    }

    #[test]
    fn endless_loop_is_rejected() {
        let body = GraphProto {
            node: vec![],
            input: vec![
                value("i", data_type::INT64, &[]),
                value("c", data_type::BOOL, &[]),
            ],
            output: vec![untyped("c")],
            ..Default::default()
        };
        let g = GraphProto {
            node: vec![
                node("Loop", &["", ""], &[], vec![graph_attr("body", body)]),
                node("Identity", &["x"], &["y"], vec![]),
            ],
            input: vec![value("x", data_type::FLOAT, &[1])],
            output: vec![value("y", data_type::FLOAT, &[1])],
            ..Default::default()
        };
        let err = import_model(&model(g, 17), ".".into(), &ImportOptions::default()).unwrap_err();
        assert!(err.to_string().contains("never terminate"), "{err}");
    }
}
