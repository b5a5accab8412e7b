//! Squeeze-excitation in front of a pointwise convolution: `x * s` with `s` per image and
//! channel is applied by the convolution as it packs its input, so the scaled tensor gets
//! no kernel of its own. Compiled end to end (the channels-last pass makes the convolutions
//! NHWC), at batch 3 so that rows of several images share a register tile, against the
//! reference interpreter; and with the scaled tensor also a graph output, where the Mul
//! must keep its kernel.

use kiln_ir::{Binary, ConvAttrs, DType, Graph, Op, PoolKind, Tensor, TensorType, Unary, ValueId};
use kiln_tests::compiled::{compile_graph, run_executable, WorkDir};
use kiln_tests::rng::Rng;

const N: usize = 3;
const C: usize = 40;
const H: usize = 6;
const W: usize = 7;

fn conv1x1(g: &mut Graph, rng: &mut Rng, name: &str, x: ValueId, cin: usize, cout: usize) -> ValueId {
    let w = g.add_const(
        format!("{name}_w"),
        Tensor::from_vec(vec![cout, cin, 1, 1], rng.vec(cout * cin)),
    );
    let b = g.add_const(format!("{name}_b"), Tensor::from_vec(vec![cout], rng.vec(cout)));
    let attrs = ConvAttrs {
        kernel_shape: vec![1, 1],
        strides: vec![1, 1],
        pads: vec![0; 4],
        dilations: vec![1, 1],
        group: 1,
        ..Default::default()
    };
    g.add(name, Op::Conv(attrs), vec![Some(x), Some(w), Some(b)], name)
        .unwrap()
}

/// x → GlobalAveragePool → 1×1 → Relu → 1×1 → Sigmoid = s; y = 1×1(x · s).
fn se_block(scaled_is_output: bool) -> Graph {
    let mut rng = Rng::new(4242);
    let mut g = Graph::new("se");
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[N, C, H, W]));
    let pooled = g
        .add(
            "pool",
            Op::GlobalPool(PoolKind::Average {
                count_include_pad: false,
            }),
            vec![Some(x)],
            "pooled",
        )
        .unwrap();
    let squeeze = conv1x1(&mut g, &mut rng, "squeeze", pooled, C, 8);
    let relu = g
        .add("relu", Op::Unary(Unary::Relu), vec![Some(squeeze)], "relu")
        .unwrap();
    let excite = conv1x1(&mut g, &mut rng, "excite", relu, 8, C);
    let s = g
        .add("sigmoid", Op::Unary(Unary::Sigmoid), vec![Some(excite)], "s")
        .unwrap();
    let scaled = g
        .add("scale", Op::Binary(Binary::Mul), vec![Some(x), Some(s)], "scaled")
        .unwrap();
    let y = conv1x1(&mut g, &mut rng, "project", scaled, C, 24);
    g.add_output("y", y);
    if scaled_is_output {
        g.add_output("scaled", scaled);
    }
    g
}

#[test]
fn squeeze_excitation_scale_runs_inside_the_pointwise_convolution() {
    let mut rng = Rng::new(7);
    let x = Tensor::from_vec(vec![N, C, H, W], rng.vec(N * C * H * W));
    for scaled_is_output in [false, true] {
        let g = se_block(scaled_is_output);
        let want = kiln_ir::eval::eval_graph(&g, vec![x.clone()]).unwrap();
        let work = WorkDir::new("se");
        let exe = work.0.join("model");
        let summary = compile_graph(&g, "se", kiln_codegen::Emit::Exe, &exe).unwrap();
        let mul_kernel = summary
            .kernel_lines
            .iter()
            .any(|l| l.contains("elementwise[Mul]"));
        assert_eq!(
            mul_kernel, scaled_is_output,
            "the Mul has a kernel of its own exactly when its result is also an output: {:#?}",
            summary.kernel_lines
        );
        let feeds = [("x".to_string(), x.clone())];
        for threads in [1, 2] {
            let got = run_executable(&exe, &g, &feeds, &work.0, threads).unwrap();
            for (o, (got, want)) in got.iter().zip(&want).enumerate() {
                let (got, want) = (got.as_slice::<f32>().unwrap(), want.as_slice::<f32>().unwrap());
                assert_eq!(got.len(), want.len());
                for (i, (a, b)) in got.iter().zip(want).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-5 + 1e-5 * b.abs(),
                        "output {o} element {i}: got {a}, want {b} (threads {threads}, scaled output {scaled_is_output})"
                    );
                }
            }
        }
    }
}
