use super::*;
use kiln_ir::{Binary, ConvAttrs, PoolAttrs, TensorType, Unary};

fn wconst(g: &mut Graph, name: &str, shape: &[usize], seed: f32) -> ValueId {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| ((i as f32 + seed) * 0.37).sin() * 0.5).collect();
    g.add_const(name, Tensor::from_vec(shape.to_vec(), v))
}

#[allow(clippy::too_many_arguments)]
fn conv(
    g: &mut Graph,
    name: &str,
    x: ValueId,
    m: usize,
    c: usize,
    k: usize,
    group: usize,
    stride: usize,
) -> ValueId {
    let w = wconst(g, &format!("{name}_w"), &[m, c / group, k, k], m as f32);
    let b = wconst(g, &format!("{name}_b"), &[m], 1.0);
    let p = k / 2;
    let a = ConvAttrs {
        strides: vec![stride, stride],
        pads: vec![p, p, p, p],
        group,
        ..ConvAttrs::default()
    };
    g.add(name, Op::Conv(a), vec![Some(x), Some(w), Some(b)], name)
        .unwrap()
}

/// A small residual CNN: conv → relu → depthwise conv → add(per-channel const) → maxpool →
/// concat with a 1×1 conv → residual add → global pool → flatten.
fn cnn() -> Graph {
    let mut g = Graph::new("cnn");
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[2, 3, 9, 9]));
    let c1 = conv(&mut g, "c1", x, 8, 3, 3, 1, 1);
    let r1 = g.add("r1", Op::Unary(Unary::Relu), vec![Some(c1)], "r1").unwrap();
    let dw = conv(&mut g, "dw", r1, 8, 8, 3, 8, 2);
    let bias = wconst(&mut g, "bias", &[8, 1, 1], 3.0);
    let a1 = g
        .add("a1", Op::Binary(Binary::Add), vec![Some(dw), Some(bias)], "a1")
        .unwrap();
    let pool = PoolAttrs {
        kind: PoolKind::Max,
        kernel_shape: vec![3, 3],
        strides: vec![1, 1],
        pads: vec![1, 1, 1, 1],
        dilations: vec![],
        auto_pad: Default::default(),
        ceil_mode: false,
        storage_order: 0,
        channels_last: false,
    };
    let mp = g.add("mp", Op::Pool(pool), vec![Some(a1)], "mp").unwrap();
    let pw = conv(&mut g, "pw", mp, 4, 8, 1, 1, 1);
    let cat = g
        .add("cat", Op::Concat { axis: 1 }, vec![Some(mp), Some(pw)], "cat")
        .unwrap();
    let c2 = conv(&mut g, "c2", cat, 12, 12, 3, 1, 1);
    let res = g
        .add("res", Op::Binary(Binary::Add), vec![Some(c2), Some(cat)], "res")
        .unwrap();
    let gp = g
        .add(
            "gp",
            Op::GlobalPool(PoolKind::Average {
                count_include_pad: false,
            }),
            vec![Some(res)],
            "gp",
        )
        .unwrap();
    let fl = g
        .add("fl", Op::Flatten { axis: 1 }, vec![Some(gp)], "fl")
        .unwrap();
    g.add_output("y", fl);
    g.add_output("feat", res);
    g
}

fn input(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec(
        shape.to_vec(),
        (0..n).map(|i| ((i * 7919 % 113) as f32 / 56.0) - 1.0).collect(),
    )
}

fn assert_close(a: &[Tensor], b: &[Tensor]) {
    assert_eq!(a.len(), b.len());
    for (a, b) in a.iter().zip(b) {
        assert_eq!(a.shape(), b.shape());
        for (x, y) in a.to_f64_vec().iter().zip(b.to_f64_vec()) {
            assert!((x - y).abs() <= 1e-4 * (1.0 + y.abs()), "{x} vs {y}");
        }
    }
}

fn count(g: &Graph, f: impl Fn(&Op) -> bool) -> usize {
    g.nodes().iter().filter(|n| f(&n.op)).count()
}

#[test]
fn cnn_runs_channels_last_with_transposes_only_at_the_edges() {
    let g = cnn();
    let mut h = g.clone();
    let n = ChannelsLast::default().run(&mut h).unwrap();
    kiln_ir::verify(&h).unwrap();
    assert!(n >= 6, "{n} rewrites\n{h}");
    let x = input(&[2, 3, 9, 9]);
    let want = kiln_ir::eval::eval_graph(&g, vec![x.clone()]).unwrap();
    let got = kiln_ir::eval::eval_graph(&h, vec![x]).unwrap();
    assert_close(&got, &want);
    let convs = count(&h, |op| matches!(op, Op::Conv(a) if a.channels_last));
    assert_eq!(convs, 4, "{h}");
    assert_eq!(
        count(&h, |op| matches!(op, Op::Pool(p) if p.channels_last)),
        1,
        "{h}"
    );
    assert_eq!(count(&h, |op| matches!(op, Op::Concat { axis: 3 })), 1, "{h}");
    // In: x. Out: `feat` (a graph output). The pooled features become NCHW by a Reshape.
    assert_eq!(count(&h, |op| matches!(op, Op::Transpose { .. })), 2, "{h}");
    assert_eq!(count(&h, |op| matches!(op, Op::GlobalPool(_))), 0, "{h}");
    // The [8,1,1] bias is re-laid out as [8].
    let add = h.nodes().iter().find(|n| n.name == "a1").unwrap();
    assert_eq!(h.value_type(add.inputs[1].unwrap()).shape, vec![Dim::Fixed(8)]);
}

#[test]
fn a_graph_without_convolutions_is_unchanged() {
    let mut g = Graph::new("mlp");
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[2, 3, 4, 4]));
    let r = g.add("r", Op::Unary(Unary::Relu), vec![Some(x)], "r").unwrap();
    let p = g
        .add("gp", Op::GlobalPool(PoolKind::Max), vec![Some(r)], "gp")
        .unwrap();
    g.add_output("y", p);
    let before = g.to_string();
    assert_eq!(ChannelsLast::default().run(&mut g).unwrap(), 0);
    assert_eq!(g.to_string(), before);
}

#[test]
fn model_transposes_cancel_against_ours() {
    // An NHWC model: Transpose in, conv, Transpose out.
    let mut g = Graph::new("tf");
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[1, 6, 6, 3]));
    let t = g
        .add(
            "t_in",
            Op::Transpose {
                perm: vec![0, 3, 1, 2],
            },
            vec![Some(x)],
            "t_in",
        )
        .unwrap();
    let c = conv(&mut g, "c", t, 5, 3, 3, 1, 1);
    let r = g.add("r", Op::Unary(Unary::Relu), vec![Some(c)], "r").unwrap();
    let o = g
        .add(
            "t_out",
            Op::Transpose {
                perm: vec![0, 2, 3, 1],
            },
            vec![Some(r)],
            "t_out",
        )
        .unwrap();
    g.add_output("y", o);
    let mut h = g.clone();
    ChannelsLast::default().run(&mut h).unwrap();
    assert_eq!(count(&h, |op| matches!(op, Op::Transpose { .. })), 0, "{h}");
    let x = input(&[1, 6, 6, 3]);
    assert_close(
        &kiln_ir::eval::eval_graph(&h, vec![x.clone()]).unwrap(),
        &kiln_ir::eval::eval_graph(&g, vec![x]).unwrap(),
    );
}

/// `x (u8) → ConvInteger → Cast → Relu`, the weights' zero point `wz` (None: absent).
fn integer_conv(wz: Option<i8>) -> Graph {
    let mut g = Graph::new("int");
    let x = g.add_input("x", TensorType::fixed(DType::U8, &[1, 4, 5, 5]));
    let w = g.add_const(
        "w",
        Tensor::from_vec(
            vec![2, 4, 3, 3],
            (0..72).map(|i| (i % 7) as i8 - 3).collect::<Vec<_>>(),
        ),
    );
    let xz = g.add_const("xz", Tensor::scalar(9u8));
    let wz = wz.map(|z| g.add_const("wz", Tensor::from_vec(vec![2], vec![z, 0])));
    let a = ConvAttrs {
        pads: vec![1, 1, 1, 1],
        group: 1,
        ..ConvAttrs::default()
    };
    let c = g
        .add(
            "c",
            Op::Quant(QuantOp::ConvInteger(a)),
            vec![Some(x), Some(w), Some(xz), wz],
            "c",
        )
        .unwrap();
    let f = g
        .add("f", Op::Cast { to: DType::F32 }, vec![Some(c)], "f")
        .unwrap();
    let r = g.add("r", Op::Unary(Unary::Relu), vec![Some(f)], "r").unwrap();
    g.add_output("r", r);
    g
}

#[test]
fn integer_convolutions_go_channels_last_where_the_kernel_takes_them() {
    let laid_out = |g: &Graph| {
        g.nodes()
            .iter()
            .any(|n| matches!(&n.op, Op::Quant(QuantOp::ConvInteger(a)) if a.channels_last))
    };
    let with = ChannelsLast { integer_conv: true };
    for wz in [None, Some(0)] {
        let before = integer_conv(wz);
        let mut h = before.clone();
        assert!(with.run(&mut h).unwrap() > 0);
        assert!(laid_out(&h), "{h}");
        let x = Tensor::from_vec(
            vec![1, 4, 5, 5],
            (0..100).map(|i| (i * 37 % 256) as u8).collect::<Vec<_>>(),
        );
        let run = |g: &Graph| kiln_ir::eval::eval_graph(g, vec![x.clone()]).unwrap();
        assert_eq!(run(&before), run(&h));
    }
    // A weight zero point the integer kernel does not apply, or a target without the kernel:
    // the model's layout.
    for (pass, wz) in [(with, Some(1)), (ChannelsLast::default(), None)] {
        let mut h = integer_conv(wz);
        assert_eq!(pass.run(&mut h).unwrap(), 0);
    }
}
