//! Tests of the row kernels, run under emulation through the planner.

use crate::nvptx::emulate::{check_graph, ptxas_check};
use kiln_ir::{DType, Dim, Graph, MiscOp, Op, PoolKind, ReduceKind, Tensor, TensorType, ValueId};

use crate::test_rng::TestRng as Rng;

struct G {
    g: Graph,
    rng: Rng,
    inputs: Vec<Tensor>,
    names: usize,
}

impl G {
    fn new(seed: u64) -> G {
        G {
            g: Graph::new("t"),
            rng: Rng::new(seed + 1),
            inputs: vec![],
            names: 0,
        }
    }

    fn input(&mut self, shape: &[usize]) -> ValueId {
        let v = self.rng.vec_scaled(shape.iter().product(), 4.0);
        self.inputs.push(Tensor::from_vec(shape.to_vec(), v));
        let ty = TensorType::new(DType::F32, shape.iter().map(|&d| Dim::Fixed(d)).collect());
        self.g.add_input(format!("in{}", self.inputs.len()), ty)
    }

    /// An f16 input (the values rounded to half).
    fn input_f16(&mut self, shape: &[usize]) -> ValueId {
        let v = self.rng.vec_scaled(shape.iter().product(), 4.0);
        let h: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
        self.inputs.push(Tensor::from_vec(shape.to_vec(), h));
        let ty = TensorType::new(DType::F16, shape.iter().map(|&d| Dim::Fixed(d)).collect());
        self.g.add_input(format!("in{}", self.inputs.len()), ty)
    }

    /// A bf16 input (the values rounded to bf16).
    fn input_bf16(&mut self, shape: &[usize]) -> ValueId {
        let v = self.rng.vec_scaled(shape.iter().product(), 4.0);
        let h: Vec<half::bf16> = v.iter().map(|&x| half::bf16::from_f32(x)).collect();
        self.inputs.push(Tensor::from_vec(shape.to_vec(), h));
        let ty = TensorType::new(DType::BF16, shape.iter().map(|&d| Dim::Fixed(d)).collect());
        self.g.add_input(format!("in{}", self.inputs.len()), ty)
    }

    /// An f64 input.
    fn input_f64(&mut self, shape: &[usize]) -> ValueId {
        let v = self.rng.vec_scaled(shape.iter().product(), 4.0);
        let d: Vec<f64> = v.iter().map(|&x| f64::from(x) * (1.0 + 1e-9)).collect();
        self.inputs.push(Tensor::from_vec(shape.to_vec(), d));
        let ty = TensorType::new(DType::F64, shape.iter().map(|&d| Dim::Fixed(d)).collect());
        self.g.add_input(format!("in{}", self.inputs.len()), ty)
    }

    fn weights_f16(&mut self, shape: &[usize]) -> ValueId {
        let v = self.rng.vec_scaled(shape.iter().product(), 1.0);
        let h: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
        self.constant(Tensor::from_vec(shape.to_vec(), h))
    }

    fn constant(&mut self, t: Tensor) -> ValueId {
        self.names += 1;
        self.g.add_const(format!("c{}", self.names), t)
    }

    fn weights(&mut self, shape: &[usize]) -> ValueId {
        let v = self.rng.vec_scaled(shape.iter().product(), 1.0);
        self.constant(Tensor::from_vec(shape.to_vec(), v))
    }

    fn node(&mut self, op: Op, inputs: Vec<Option<ValueId>>) -> ValueId {
        self.names += 1;
        let n = self.names;
        self.g.add(format!("n{n}"), op, inputs, format!("v{n}")).unwrap()
    }

    fn graph(mut self, y: ValueId) -> (Graph, Vec<Tensor>) {
        self.g.add_output("y", y);
        (self.g, self.inputs)
    }

    fn check(self, y: ValueId, what: &str) {
        let (g, inputs) = self.graph(y);
        let d = check_graph(&g, &inputs);
        assert!(
            d.iter().all(|s| s.starts_with(what)),
            "kernels {d:?}, expected {what}"
        );
    }
}

/// Shapes with rows shorter and longer than a block, not multiples of 32, one row and more
/// rows than fit one block.
const ROWS: &[&[usize]] = &[
    &[1, 5],
    &[3, 33],
    &[1, 300],
    &[70, 7],
    &[4, 3, 17],
    &[2, 1000],
    &[9, 64],
];

#[test]
fn softmax_innermost_and_strided() {
    for (i, &shape) in ROWS.iter().enumerate() {
        for log in [false, true] {
            let mut g = G::new(i as u64);
            let x = g.input(shape);
            let op = if log {
                Op::LogSoftmax {
                    axis: -1,
                    coerce_2d: false,
                }
            } else {
                Op::Softmax {
                    axis: -1,
                    coerce_2d: false,
                }
            };
            let y = g.node(op, vec![Some(x)]);
            g.check(y, if log { "gpu logsoftmax" } else { "gpu softmax" });
        }
    }
    // A middle axis (strided rows, a block or a thread per row) and opset-11 flattening.
    let cases: [(&[usize], i64, bool); 5] = [
        (&[3, 40, 5], 1, false),
        (&[3, 40, 5], 0, false),
        (&[3, 40, 5], 1, true),
        (&[2, 7, 300], 1, false),
        (&[300, 2], 0, false),
    ];
    for (shape, axis, coerce_2d) in cases {
        for log in [false, true] {
            let mut g = G::new(7);
            let x = g.input(shape);
            let op = if log {
                Op::LogSoftmax { axis, coerce_2d }
            } else {
                Op::Softmax { axis, coerce_2d }
            };
            let y = g.node(op, vec![Some(x)]);
            g.check(y, "gpu");
        }
    }
}

/// Hardmax and LpNormalization (p 1 and 2) on innermost and strided rows; Hardmax on ties
/// (the first maximum wins) and NaN (the first NaN wins), LpNormalization on a zero row.
#[test]
fn hardmax_and_lp_normalization() {
    let cases: [(&[usize], i64, bool); 6] = [
        (&[3, 33], -1, false),
        (&[2, 1000], 1, false),
        (&[3, 40, 5], 1, false),
        (&[300, 2], 0, false),
        (&[2, 7, 300], 1, false),
        (&[3, 4, 5], 1, true),
    ];
    for (i, (shape, axis, coerce_2d)) in cases.into_iter().enumerate() {
        let mut g = G::new(40 + i as u64);
        let x = g.input(shape);
        let y = g.node(Op::Hardmax { axis, coerce_2d }, vec![Some(x)]);
        g.check(y, "gpu hardmax");
        for p in [1, 2] {
            if coerce_2d {
                continue;
            }
            let mut g = G::new(50 + i as u64);
            let x = g.input(shape);
            let y = g.node(Op::LpNorm { axis, p }, vec![Some(x)]);
            g.check(y, "gpu lpnorm");
        }
    }
    // Ties, a NaN, and (LpNormalization) an all-zero row.
    let row = |v: &[f32]| Tensor::from_vec(vec![3, 6], v.to_vec());
    let values = row(&[
        1.0,
        5.0,
        2.0,
        5.0,
        0.0,
        5.0, // ties: the first 5
        1.0,
        f32::NAN,
        9.0,
        f32::NAN,
        0.0,
        2.0, // the first NaN
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0, // all equal: the first
    ]);
    for op in [
        Op::Hardmax {
            axis: 1,
            coerce_2d: false,
        },
        Op::LpNorm { axis: 1, p: 2 },
    ] {
        let mut g = G::new(3);
        let x = g.input(&[3, 6]);
        let y = g.node(op, vec![Some(x)]);
        let (gr, mut inputs) = g.graph(y);
        inputs[0] = values.clone();
        check_graph(&gr, &inputs);
        ptxas_check(&gr, 90);
    }
}

#[test]
fn softmax_large_values_and_infinities() {
    let mut g = G::new(0);
    let x = g.input(&[3, 40]);
    let y = g.node(
        Op::Softmax {
            axis: 1,
            coerce_2d: false,
        },
        vec![Some(x)],
    );
    let (gr, mut inputs) = g.graph(y);
    let mut v = inputs[0]
        .to_f64_vec()
        .iter()
        .map(|&v| (v * 30.0) as f32)
        .collect::<Vec<_>>();
    v[3] = 1e30;
    v[45] = f32::NEG_INFINITY;
    inputs[0] = Tensor::from_vec(vec![3, 40], v);
    check_graph(&gr, &inputs);
}

#[test]
fn layer_norm_family() {
    for (i, &shape) in ROWS.iter().enumerate() {
        let last = *shape.last().unwrap();
        // Scale/bias per element, with a leading 1, and scalar.
        #[allow(clippy::type_complexity)]
        let params: [(&[usize], Option<&[usize]>, usize); 3] = [
            (&[last], Some(&[last]), 1),
            (&[1, last], None, 1),
            (&[1], Some(&[1]), 3),
        ];
        for (ps, pb, n_out) in params {
            let mut g = G::new(i as u64);
            let x = g.input(shape);
            let s = g.weights(ps);
            let b = pb.map(|pb| g.weights(pb));
            let op = Op::LayerNorm {
                axis: -1,
                epsilon: 1e-5,
                stash_type: DType::F32,
            };
            if n_out == 1 {
                let y = g.node(op, vec![Some(x), Some(s), b]);
                g.check(y, "gpu layernorm");
            } else {
                g.names += 1;
                let outs =
                    g.g.add_node(
                        "ln",
                        op,
                        vec![Some(x), Some(s), b],
                        vec!["y0".into(), "mean".into(), "inv".into()],
                    )
                    .unwrap();
                for (j, o) in outs.iter().enumerate() {
                    g.g.add_output(format!("o{j}"), *o);
                }
                let d = check_graph(&g.g, &g.inputs);
                assert!(d[0].starts_with("gpu layernorm"), "{d:?}");
            }
        }
    }
    // Normalizing over the last two axes.
    let mut g = G::new(3);
    let x = g.input(&[5, 6, 7]);
    let s = g.weights(&[6, 7]);
    let y = g.node(
        Op::LayerNorm {
            axis: 1,
            epsilon: 1e-3,
            stash_type: DType::F32,
        },
        vec![Some(x), Some(s), None],
    );
    g.check(y, "gpu layernorm");
    for (i, &shape) in ROWS.iter().enumerate() {
        let mut g = G::new(i as u64);
        let x = g.input(shape);
        let s = g.weights(&[*shape.last().unwrap()]);
        let y = g.node(
            Op::Misc(MiscOp::RmsNorm {
                axis: -1,
                epsilon: 1e-6,
                stash_type: DType::F32,
            }),
            vec![Some(x), Some(s)],
        );
        g.check(y, "gpu rmsnorm");
    }
}

#[test]
fn f16_rows_compute_in_f32_and_round_once() {
    let mut g = G::new(60);
    let x = g.input_f16(&[3, 300]);
    let y = g.node(
        Op::Softmax {
            axis: -1,
            coerce_2d: false,
        },
        vec![Some(x)],
    );
    g.check(y, "gpu softmax");
    let mut g = G::new(61);
    let x = g.input_f16(&[4, 7, 96]);
    let (s, b) = (g.weights_f16(&[96]), g.weights_f16(&[96]));
    let y = g.node(
        Op::LayerNorm {
            axis: -1,
            epsilon: 1e-5,
            stash_type: DType::F32,
        },
        vec![Some(x), Some(s), Some(b)],
    );
    g.check(y, "gpu layernorm");
    let mut g = G::new(62);
    let x = g.input_f16(&[2, 16, 5, 5]);
    let y = g.node(
        Op::GlobalPool(PoolKind::Average {
            count_include_pad: false,
        }),
        vec![Some(x)],
    );
    g.check(y, "gpu global avgpool");
    let mut g = G::new(63);
    let x = g.input_f16(&[2, 6, 4, 5]);
    let (s, b) = (g.weights_f16(&[6]), g.weights_f16(&[6]));
    let y = g.node(
        Op::InstanceNorm { epsilon: 1e-5 },
        vec![Some(x), Some(s), Some(b)],
    );
    g.check(y, "gpu instancenorm");
}

#[test]
fn bf16_rows_compute_in_f32_and_round_once() {
    let mut g = G::new(64);
    let x = g.input_bf16(&[3, 300]);
    let y = g.node(
        Op::Softmax {
            axis: -1,
            coerce_2d: false,
        },
        vec![Some(x)],
    );
    g.check(y, "gpu softmax rows=3 len=300 bf16");
    let mut g = G::new(65);
    let x = g.input_bf16(&[4, 7, 96]);
    let s = g.input_bf16(&[96]);
    let y = g.node(
        Op::LayerNorm {
            axis: -1,
            epsilon: 1e-5,
            stash_type: DType::F32,
        },
        vec![Some(x), Some(s), None],
    );
    g.check(y, "gpu layernorm");
    let mut g = G::new(66);
    let x = g.input_bf16(&[5, 40, 3]);
    let a = g.constant(Tensor::from_vec(vec![1], vec![1i64]));
    let y = g.node(
        Op::Reduce {
            kind: ReduceKind::Mean,
            keepdims: true,
            noop_with_empty_axes: false,
        },
        vec![Some(x), Some(a)],
    );
    g.check(y, "gpu mean reduce");
}

#[test]
fn bool_max_and_min_are_any_and_all() {
    for kind in [ReduceKind::Max, ReduceKind::Min] {
        for (shape, axes) in [(vec![4usize, 9], vec![1i64]), (vec![3, 5, 2], vec![0, 2])] {
            let mut g = G::new(95);
            let n: usize = shape.iter().product();
            // Rows all true, all false and mixed.
            let v: Vec<bool> = (0..n).map(|i| i % 7 != 0 && i < n / 2 || i % 9 == 0).collect();
            g.inputs.push(Tensor::from_vec(shape.clone(), v));
            let ty = TensorType::new(DType::Bool, shape.iter().map(|&d| Dim::Fixed(d)).collect());
            let x = g.g.add_input("b", ty);
            let a = g.constant(Tensor::from_vec(vec![axes.len()], axes));
            let y = g.node(
                Op::Reduce {
                    kind,
                    keepdims: false,
                    noop_with_empty_axes: false,
                },
                vec![Some(x), Some(a)],
            );
            g.check(y, "gpu");
        }
    }
}

#[test]
fn i32_sums_wrap_and_extremes_are_exact() {
    for kind in [ReduceKind::Sum, ReduceKind::Max, ReduceKind::Min] {
        let mut g = G::new(97);
        // Large values: the sums pass 2^31 and wrap, as the reference's int32 sum does.
        let v: Vec<i32> = (0..60)
            .map(|i: i32| i.wrapping_mul(1_234_567_891i32.wrapping_mul(i + 1)) | 1)
            .collect();
        g.inputs.push(Tensor::from_vec(vec![4, 15], v));
        let ty = TensorType::new(DType::I32, vec![Dim::Fixed(4), Dim::Fixed(15)]);
        let x = g.g.add_input("i", ty);
        let a = g.constant(Tensor::from_vec(vec![1], vec![1i64]));
        let y = g.node(
            Op::Reduce {
                kind,
                keepdims: true,
                noop_with_empty_axes: false,
            },
            vec![Some(x), Some(a)],
        );
        g.check(y, "gpu");
    }
}

#[test]
fn f64_softmax_and_reductions_compute_in_f64() {
    for (i, (shape, axis)) in [(vec![3usize, 300], -1i64), (vec![4, 70, 5], 1)]
        .into_iter()
        .enumerate()
    {
        for log in [false, true] {
            let mut g = G::new(70 + i as u64);
            let x = g.input_f64(&shape);
            let op = match log {
                true => Op::LogSoftmax {
                    axis,
                    coerce_2d: false,
                },
                false => Op::Softmax {
                    axis,
                    coerce_2d: false,
                },
            };
            let y = g.node(op, vec![Some(x)]);
            g.check(y, if log { "gpu logsoftmax" } else { "gpu softmax" });
        }
    }
    let kinds = [
        ReduceKind::Sum,
        ReduceKind::Mean,
        ReduceKind::Max,
        ReduceKind::L2,
        ReduceKind::LogSumExp,
    ];
    for (ki, kind) in kinds.into_iter().enumerate() {
        for (shape, axes) in [(vec![3usize, 40, 5], vec![1i64]), (vec![2, 3, 300], vec![0, 2])] {
            let mut g = G::new(80 + ki as u64);
            let x = g.input_f64(&shape);
            let a = g.constant(Tensor::from_vec(vec![axes.len()], axes));
            let y = g.node(
                Op::Reduce {
                    kind,
                    keepdims: false,
                    noop_with_empty_axes: false,
                },
                vec![Some(x), Some(a)],
            );
            g.check(y, "gpu");
        }
    }
    let mut g = G::new(90);
    let x = g.input_f64(&[2, 3, 5, 5]);
    let y = g.node(
        Op::GlobalPool(PoolKind::Average {
            count_include_pad: false,
        }),
        vec![Some(x)],
    );
    g.check(y, "gpu global avgpool rows=6 len=25 f64");
    // The math library's f64 exp and log assemble for the device.
    let mut g = G::new(91);
    let x = g.input_f64(&[4, 300]);
    let sm = g.node(
        Op::LogSoftmax {
            axis: -1,
            coerce_2d: false,
        },
        vec![Some(x)],
    );
    let y = g.node(
        Op::Reduce {
            kind: ReduceKind::LogSumExp,
            keepdims: false,
            noop_with_empty_axes: false,
        },
        vec![Some(sm), None],
    );
    let (gr, _) = g.graph(y);
    ptxas_check(&gr, 80);
}

#[test]
fn mean_variance_normalization_over_any_axes() {
    for (i, axes) in [vec![0i64, 2, 3], vec![1], vec![-1, -2], vec![0, 1, 2, 3]]
        .into_iter()
        .enumerate()
    {
        let mut g = G::new(100 + i as u64);
        let x = g.input(&[2, 3, 4, 5]);
        let y = g.node(Op::MeanVarianceNorm { axes }, vec![Some(x)]);
        g.check(y, "gpu mvn");
    }
}

#[test]
fn instance_and_group_norms() {
    // (shape, groups: None for InstanceNormalization, per-channel affine): rows shorter
    // and longer than a block, 1-D and 3-D spatial extents, a channel per group.
    let cases: [(&[usize], Option<usize>, bool); 6] = [
        (&[2, 3, 5, 7], None, true),
        (&[1, 4, 300], None, true),
        (&[2, 6, 4, 5], Some(3), true),
        (&[1, 8, 2, 3, 4], Some(2), true),
        (&[2, 6, 9], Some(2), false),
        (&[1, 4, 6, 6], Some(4), true),
    ];
    for (i, (shape, groups, per_channel)) in cases.into_iter().enumerate() {
        let mut g = G::new(40 + i as u64);
        let x = g.input(shape);
        let len = if per_channel { shape[1] } else { groups.unwrap() };
        let (s, b) = (g.weights(&[len]), g.weights(&[len]));
        let (op, what) = match groups {
            None => (Op::InstanceNorm { epsilon: 1e-5 }, "gpu instancenorm"),
            Some(num_groups) => (
                Op::GroupNorm {
                    num_groups,
                    epsilon: 1e-3,
                    stash_type: DType::F32,
                    per_channel_affine: per_channel,
                },
                "gpu groupnorm",
            ),
        };
        let y = g.node(op, vec![Some(x), Some(s), Some(b)]);
        g.check(y, what);
    }
}

#[test]
fn reductions() {
    let kinds = [
        ReduceKind::Sum,
        ReduceKind::Mean,
        ReduceKind::Max,
        ReduceKind::Min,
        ReduceKind::L1,
        ReduceKind::L2,
        ReduceKind::SumSquare,
        ReduceKind::Prod,
        ReduceKind::LogSumExp,
    ];
    let cases: &[(&[usize], &[i64])] = &[
        (&[3, 33], &[-1]),
        (&[2, 500], &[1]),
        (&[70, 7], &[1]),
        (&[4, 5, 6], &[1, 2]),
        (&[4, 5, 6], &[1]),
        (&[4, 5, 6], &[0]),
        (&[4, 1, 6], &[0, 2]),
        (&[4, 5, 6], &[0, 2]),
        (&[3, 4, 5, 6], &[1, 3]),
        (&[2, 3, 40], &[0, -1]),
        (&[3, 20, 100], &[1]),
        (&[5, 270], &[0]),
        (&[4, 5, 6], &[]),
    ];
    for (ci, &(shape, axes)) in cases.iter().enumerate() {
        for (ki, &kind) in kinds.iter().enumerate() {
            for keepdims in [true, false] {
                let mut g = G::new((ci * 16 + ki) as u64);
                let x = g.input(shape);
                let a =
                    (!axes.is_empty()).then(|| g.constant(Tensor::from_vec(vec![axes.len()], axes.to_vec())));
                let y = g.node(
                    Op::Reduce {
                        kind,
                        keepdims,
                        noop_with_empty_axes: false,
                    },
                    vec![Some(x), a],
                );
                // Products of many elements of magnitude up to 4 overflow; keep them short.
                if kind == ReduceKind::Prod && shape.iter().product::<usize>() > 200 {
                    continue;
                }
                g.check(y, "gpu");
            }
        }
    }
    // LogSum needs positive sums: of sums of squares, over 270 of them and over one (only
    // size-1 axes left).
    for (shape, axes) in [([6, 45, 3], vec![2i64]), ([1, 5, 1], vec![])] {
        let mut g = G::new(5);
        let x = g.input(&shape);
        let a = (!axes.is_empty()).then(|| g.constant(Tensor::from_vec(vec![axes.len()], axes.clone())));
        let sq = g.node(
            Op::Reduce {
                kind: ReduceKind::SumSquare,
                keepdims: true,
                noop_with_empty_axes: false,
            },
            vec![Some(x), a],
        );
        let y = g.node(
            Op::Reduce {
                kind: ReduceKind::LogSum,
                keepdims: false,
                noop_with_empty_axes: false,
            },
            vec![Some(sq), None],
        );
        g.check(y, "gpu");
    }
}

#[test]
fn global_pools() {
    for (i, shape) in [[1, 3, 7, 7], [2, 5, 1, 1], [2, 300, 4, 4], [1, 2, 20, 30]]
        .iter()
        .enumerate()
    {
        for kind in [
            PoolKind::Average {
                count_include_pad: false,
            },
            PoolKind::Max,
        ] {
            let mut g = G::new(i as u64);
            let x = g.input(shape);
            let y = g.node(Op::GlobalPool(kind), vec![Some(x)]);
            g.check(y, "gpu global");
        }
    }
}

#[test]
fn declines_what_it_does_not_handle() {
    // Empty axes with noop_with_empty_axes (the identity): the row generator declines it and
    // the copy generator takes it.
    let mut g = G::new(1);
    let x = g.input(&[4, 5, 6]);
    let a = g.constant(Tensor::from_vec(vec![0], Vec::<i64>::new()));
    let y = g.node(
        Op::Reduce {
            kind: ReduceKind::Sum,
            keepdims: true,
            noop_with_empty_axes: true,
        },
        vec![Some(x), Some(a)],
    );
    let (gr, _) = g.graph(y);
    let target = crate::target::TargetDesc::cuda(80).unwrap();
    let node = crate::node::NodeInfo::new(&gr, y.node);
    assert!(super::lower(&node, &target).unwrap().is_none());
    let plan = crate::plan::build(&gr, &target, true).unwrap();
    assert!(
        plan.kernels[0].describe().starts_with("gpu copy"),
        "{}",
        plan.kernels[0].describe()
    );
}

#[test]
fn strided_rows_with_many_rows_take_a_thread_each() {
    let mut g = G::new(0);
    let x = g.input(&[6, 300]);
    let y = g.node(
        Op::LogSoftmax {
            axis: 0,
            coerce_2d: false,
        },
        vec![Some(x)],
    );
    let (gr, _) = g.graph(y);
    let plan = crate::plan::build(&gr, &crate::target::TargetDesc::cuda(80).unwrap(), true).unwrap();
    let d = plan.kernels[0].describe();
    assert!(d.contains("thread-per-row"), "{d}");
}

#[test]
fn ptxas_accepts_row_kernels() {
    let mut g = G::new(0);
    let x = g.input(&[6, 300]);
    let sm = g.node(
        Op::Softmax {
            axis: -1,
            coerce_2d: false,
        },
        vec![Some(x)],
    );
    let ls = g.node(
        Op::LogSoftmax {
            axis: 0,
            coerce_2d: false,
        },
        vec![Some(sm)],
    );
    let s = g.weights(&[300]);
    let b = g.weights(&[300]);
    let ln = g.node(
        Op::LayerNorm {
            axis: -1,
            epsilon: 1e-5,
            stash_type: DType::F32,
        },
        vec![Some(ls), Some(s), Some(b)],
    );
    let rms = g.node(
        Op::Misc(MiscOp::RmsNorm {
            axis: -1,
            epsilon: 1e-5,
            stash_type: DType::F32,
        }),
        vec![Some(ln), Some(s)],
    );
    let y = g.node(
        Op::Reduce {
            kind: ReduceKind::LogSum,
            keepdims: false,
            noop_with_empty_axes: false,
        },
        vec![Some(rms), None],
    );
    let (gr, _) = g.graph(y);
    for sm in [80, 90] {
        if !ptxas_check(&gr, sm) {
            return;
        }
    }
}
