//! The graph core: type inference on add, compile-time value propagation, the verifier, the
//! text printer, and input checking in the interpreter.

use kiln_ir::ops::util::{broadcast_dims, broadcast_index_map, broadcast_shapes};
use kiln_ir::*;

fn sym(s: &str) -> Dim {
    Dim::Sym(s.into())
}

#[test]
fn broadcasting_rules() {
    assert_eq!(broadcast_shapes(&[2, 1, 4], &[3, 1]).unwrap(), vec![2, 3, 4]);
    assert_eq!(broadcast_shapes(&[], &[5]).unwrap(), vec![5]);
    assert!(broadcast_shapes(&[2, 3], &[4, 3]).is_err());
    let d = broadcast_dims(&[sym("batch"), Dim::Fixed(1)], &[Dim::Fixed(7)]).unwrap();
    assert_eq!(d, vec![sym("batch"), Dim::Fixed(7)]);
    let d = broadcast_dims(&[sym("a")], &[sym("b")]).unwrap();
    assert_eq!(d, vec![Dim::unknown()]);
    // [2,1] broadcast to [2,3]: each row repeats its single element.
    assert_eq!(broadcast_index_map(&[2, 1], &[2, 3]), vec![0, 0, 0, 1, 1, 1]);
    assert_eq!(broadcast_index_map(&[3], &[2, 3]), vec![0, 1, 2, 0, 1, 2]);
}

fn tiny_graph() -> (Graph, ValueId) {
    let mut g = Graph::new("tiny");
    let x = g.add_input(
        "x",
        TensorType::new(DType::F32, vec![sym("batch"), Dim::Fixed(4)]),
    );
    let w = g.add_const("w", Tensor::from_vec(vec![4], vec![1.0f32, -2.0, 3.0, -4.0]));
    let y = g
        .add("add", Op::Binary(Binary::Add), vec![Some(x), Some(w)], "y")
        .unwrap();
    let z = g.add("relu", Op::Unary(Unary::Relu), vec![Some(y)], "z").unwrap();
    g.add_output("z", z);
    (g, z)
}

#[test]
fn types_are_inferred_when_nodes_are_added() {
    let (g, z) = tiny_graph();
    assert_eq!(g.value_type(z).to_string(), "f32[batch,4]");
    verify(&g).unwrap();
}

#[test]
fn ill_typed_node_is_rejected_with_its_name() {
    let mut g = Graph::new("bad");
    let a = g.add_input("a", TensorType::fixed(DType::F32, &[2, 3]));
    let b = g.add_input("b", TensorType::fixed(DType::F32, &[4, 3]));
    let err = g
        .add("my_add", Op::Binary(Binary::Add), vec![Some(a), Some(b)], "c")
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("my_add") && msg.contains("Add"), "{msg}");
    let c = g.add_input("c", TensorType::fixed(DType::I64, &[2, 3]));
    assert!(g
        .add("mixed", Op::Binary(Binary::Add), vec![Some(a), Some(c)], "d")
        .is_err());
}

#[test]
fn shape_arithmetic_is_known_at_compile_time() {
    // Shape(x) → Reshape(y, shape) gets a static type although the shape is computed.
    let mut g = Graph::new("dyn");
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[2, 3, 4]));
    let y = g.add_input("y", TensorType::fixed(DType::F32, &[24]));
    let s = g
        .add("shape", Op::Shape { start: 0, end: None }, vec![Some(x)], "s")
        .unwrap();
    assert_eq!(g.known_value(s).unwrap().to_i64_vec(), vec![2, 3, 4]);
    let r = g
        .add(
            "reshape",
            Op::Reshape { allow_zero: false },
            vec![Some(y), Some(s)],
            "r",
        )
        .unwrap();
    assert_eq!(g.value_type(r).to_string(), "f32[2,3,4]");
    assert!(g.known_value(r).is_none(), "a graph input's data is not known");
}

#[test]
fn an_input_without_elements_is_known() {
    // An empty `axes` input has one possible value, so the reduction's axes are known at compile
    // time (all of them); an input with elements, or with a symbolic dim, is not known.
    let mut g = Graph::new("empty");
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[3, 2]));
    let axes = g.add_input("axes", TensorType::fixed(DType::I64, &[0]));
    let later = g.add_input("later", TensorType::new(DType::I64, vec![sym("n")]));
    assert_eq!(g.known_value(axes).unwrap().shape(), &[0]);
    assert!(g.known_value(x).is_none());
    assert!(g.known_value(later).is_none());
    let reduce = Op::Reduce {
        kind: ReduceKind::Sum,
        keepdims: true,
        noop_with_empty_axes: false,
    };
    let r = g.add("sum", reduce, vec![Some(x), Some(axes)], "r").unwrap();
    assert_eq!(g.value_type(r).to_string(), "f32[1,1]");
    // Bound to an empty shape later, it becomes known too.
    g.bound_value_type(later, TensorType::fixed(DType::I64, &[0]))
        .unwrap();
    assert_eq!(g.known_value(later).unwrap().len(), 0);
}

#[test]
fn printer_shows_names_ops_and_types() {
    let (g, _) = tiny_graph();
    let text = g.to_string();
    let expected = "graph tiny(%x: f32[batch,4]) {\n  %w = Constant #0 : f32[4]\n  %y = Add(%x, %w) : f32[batch,4]\n  %z = Relu(%y) : f32[batch,4]\n  return %z\n}\n";
    assert_eq!(text, expected);
}

#[test]
fn eval_checks_inputs_and_computes() {
    let (g, _) = tiny_graph();
    let x = Tensor::from_vec(vec![2, 4], vec![0.0f32, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]);
    let out = eval::eval_graph(&g, vec![x]).unwrap();
    assert_eq!(
        out[0].as_slice::<f32>().unwrap(),
        &[1.0, 0.0, 3.0, 0.0, 2.0, 0.0, 4.0, 0.0]
    );

    let wrong_dtype = Tensor::from_vec(vec![2, 4], vec![0i64; 8]);
    let e = eval::eval_graph(&g, vec![wrong_dtype]).unwrap_err().to_string();
    assert!(e.contains("'x'") && e.contains("dtype f32"), "{e}");
    let wrong_shape = Tensor::from_vec(vec![2, 5], vec![0f32; 10]);
    let e = eval::eval_graph(&g, vec![wrong_shape]).unwrap_err().to_string();
    assert!(e.contains("f32[batch,4]"), "{e}");
}

#[test]
fn symbolic_dims_must_agree_across_inputs() {
    let mut g = Graph::new("two");
    let a = g.add_input("a", TensorType::new(DType::F32, vec![sym("n")]));
    let b = g.add_input("b", TensorType::new(DType::F32, vec![sym("n")]));
    let c = g
        .add("add", Op::Binary(Binary::Add), vec![Some(a), Some(b)], "c")
        .unwrap();
    g.add_output("c", c);
    let e = eval::eval_graph(
        &g,
        vec![
            Tensor::from_vec(vec![2], vec![1f32, 2.0]),
            Tensor::from_vec(vec![3], vec![1f32, 2.0, 3.0]),
        ],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("'n'"), "{e}");
}

#[test]
fn cast_follows_numpy_semantics() {
    let t = Tensor::from_vec(vec![5], vec![-1.7f32, 2.5, 1e10, f32::NAN, 300.0]);
    assert_eq!(
        t.cast(DType::I32).to_i64_vec(),
        vec![-1, 2, i32::MAX as i64, 0, 300]
    );
    assert_eq!(t.cast(DType::Bool).to_i64_vec(), vec![1, 1, 1, 1, 1]);
    let h = Tensor::from_vec(vec![1], vec![1.0f32 + 1.5 * 2f32.powi(-10)]).cast(DType::F16);
    // Ties round to even: 1 + 1.5 ulp(f16) rounds up to 1 + 2 ulp.
    assert_eq!(h.to_f64_vec()[0], 1.001953125);
    // 2^60 + 2^36 + 1 is just above the midpoint between two f32 values: one rounding goes up,
    // rounding through f64 first lands on the midpoint and then rounds to even (down).
    let big = (1i64 << 60) + (1i64 << 36) + 1;
    let f = Tensor::from_vec(vec![1], vec![big]).cast(DType::F32);
    assert_eq!(f.as_slice::<f32>().unwrap()[0], big as f32);
}

#[test]
fn remove_dead_drops_chains_of_dead_nodes() {
    // `c -> dead1 -> dead2` is read by nothing: a dead node reading another dead node's value
    // must not be looked up.
    let mut g = Graph::new("t");
    let x = g.add_input("x", TensorType::new(DType::F32, vec![Dim::Fixed(3)]));
    let c = g.add_const("c", Tensor::from_vec(vec![3], vec![1.0f32, 2.0, 3.0]));
    let dead1 = g
        .add("dead1", Op::Unary(Unary::Neg), vec![Some(c)], "d1")
        .unwrap();
    let _dead2 = g
        .add("dead2", Op::Binary(Binary::Add), vec![Some(dead1), Some(x)], "d2")
        .unwrap();
    let y = g.add("live", Op::Unary(Unary::Relu), vec![Some(x)], "y").unwrap();
    g.add_output("y", y);
    let pruned = kiln_ir::rewrite::remove_dead(&g).unwrap();
    assert_eq!(pruned.len(), 2, "{pruned}");
    assert_eq!(pruned.outputs()[0].name, "y");
}

/// A constant's data and name can be replaced in place, in one graph only, by a tensor of the
/// same type; anything else is refused.
#[test]
fn replace_constant_keeps_the_type_and_leaves_clones_alone() {
    let mut g = Graph::new("g");
    let w = g.add_const("w", Tensor::from_vec(vec![2], vec![1.0f32, 2.0]));
    let x = g.add_input("x", TensorType::new(DType::F32, vec![Dim::Fixed(2)]));
    let y = g
        .add("add", Op::Binary(Binary::Add), vec![Some(x), Some(w)], "y")
        .unwrap();
    let before = g.clone();
    assert!(g.replace_constant(w, "w.r", Tensor::from_vec(vec![2], vec![3.0f32, 4.0])));
    assert_eq!(g.known_value(w).unwrap().as_slice::<f32>().unwrap(), &[3.0, 4.0]);
    assert_eq!(g.value_name(w), "w.r");
    assert_eq!(
        before.known_value(w).unwrap().as_slice::<f32>().unwrap(),
        &[1.0, 2.0]
    );
    assert!(
        !g.replace_constant(w, "w", Tensor::from_vec(vec![3], vec![0.0f32; 3])),
        "another shape"
    );
    assert!(
        !g.replace_constant(w, "w", Tensor::from_vec(vec![2], vec![0i64; 2])),
        "another dtype"
    );
    assert!(
        !g.replace_constant(y, "y", Tensor::from_vec(vec![2], vec![0.0f32; 2])),
        "not a constant"
    );
    assert_eq!(g.value_name(w), "w.r");
}
