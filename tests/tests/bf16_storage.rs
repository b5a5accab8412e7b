//! bf16 activations between kernels (`store-bf16`): with `--precision bf16` on a CPU with
//! avx512_bf16, a depthwise convolution or a product whose only reader is a pointwise bf16
//! product stores its output as bf16, and the product reads those rows in place. The readers round their
//! operands to bf16 anyway, so the outputs must be bit-identical to the same compile with
//! the pass off; the arena must shrink; and both must match the f32 reference to bf16
//! accuracy. Compiled end to end (the channels-last pass makes the convolutions NHWC), as
//! MobileNetV2's inverted residual blocks: expand 1×1 → depthwise 3×3 → project 1×1, the
//! first with a residual, the second at stride 2; then a ResNet bottleneck, whose 3×3
//! convolution packs its bf16 input through the im2col packing.

use kiln_ir::{Binary, ConvAttrs, DType, Graph, Op, Tensor, TensorType, Unary, ValueId};
use kiln_tests::compiled::{compile_graph_bf16_without, run_executable, WorkDir};
use kiln_tests::rng::Rng;

const N: usize = 2;
const C: usize = 16;
const H: usize = 10;
// 10 × 13 pixels: 130 rows, not a multiple of the register tile's 12.
const W: usize = 13;

#[allow(clippy::too_many_arguments)]
fn conv(
    g: &mut Graph,
    rng: &mut Rng,
    name: &str,
    x: ValueId,
    cin: usize,
    cout: usize,
    k: usize,
    stride: usize,
    group: usize,
) -> ValueId {
    let w = g.add_const(
        format!("{name}_w"),
        Tensor::from_vec(vec![cout, cin / group, k, k], rng.vec(cout * cin / group * k * k)),
    );
    let b = g.add_const(format!("{name}_b"), Tensor::from_vec(vec![cout], rng.vec(cout)));
    let p = k / 2;
    let attrs = ConvAttrs {
        kernel_shape: vec![k, k],
        strides: vec![stride, stride],
        pads: vec![p; 4],
        dilations: vec![1, 1],
        group,
        ..Default::default()
    };
    g.add(name, Op::Conv(attrs), vec![Some(x), Some(w), Some(b)], name)
        .unwrap()
}

fn relu6(g: &mut Graph, name: &str, x: ValueId) -> ValueId {
    let lo = g.add_const(format!("{name}_min"), Tensor::from_vec(vec![], vec![0.0f32]));
    let hi = g.add_const(format!("{name}_max"), Tensor::from_vec(vec![], vec![6.0f32]));
    g.add(name, Op::Clip, vec![Some(x), Some(lo), Some(hi)], name)
        .unwrap()
}

/// expand (×6) → ReLU6 → depthwise 3×3 → ReLU6 → project, plus the input when `residual`.
fn block(
    g: &mut Graph,
    rng: &mut Rng,
    name: &str,
    x: ValueId,
    cin: usize,
    cout: usize,
    stride: usize,
) -> ValueId {
    let hidden = cin * 6;
    let e = conv(g, rng, &format!("{name}_expand"), x, cin, hidden, 1, 1, 1);
    let e = relu6(g, &format!("{name}_expand_relu6"), e);
    let d = conv(
        g,
        rng,
        &format!("{name}_dw"),
        e,
        hidden,
        hidden,
        3,
        stride,
        hidden,
    );
    let d = relu6(g, &format!("{name}_dw_relu6"), d);
    let p = conv(g, rng, &format!("{name}_project"), d, hidden, cout, 1, 1, 1);
    if stride == 1 && cin == cout {
        g.add(
            format!("{name}_add"),
            Op::Binary(Binary::Add),
            vec![Some(p), Some(x)],
            name,
        )
        .unwrap()
    } else {
        p
    }
}

fn model() -> Graph {
    let mut rng = Rng::new(2929);
    let mut g = Graph::new("inverted_residuals");
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[N, C, H, W]));
    let b1 = block(&mut g, &mut rng, "b1", x, C, C, 1);
    let b2 = block(&mut g, &mut rng, "b2", b1, C, 24, 2);
    let b3 = block(&mut g, &mut rng, "b3", b2, 24, 32, 1);
    // A ResNet bottleneck without its skip: 1×1 → ReLU → 3×3 (read through the im2col
    // packing) → ReLU → 1×1.
    let relu = |g: &mut Graph, name: &str, x: ValueId| {
        g.add(name, Op::Unary(Unary::Relu), vec![Some(x)], name).unwrap()
    };
    // The 3×3 has K = 864: two K blocks, whose partial sums stay f32 until the bf16 store;
    // its 40 channels end in a column panel cut inside a vector.
    let r1 = conv(&mut g, &mut rng, "r_conv1", b3, 32, 96, 1, 1, 1);
    let r1 = relu(&mut g, "r_relu1", r1);
    let r2 = conv(&mut g, &mut rng, "r_conv2", r1, 96, 40, 3, 1, 1);
    let r2 = relu(&mut g, "r_relu2", r2);
    let y = conv(&mut g, &mut rng, "r_conv3", r2, 40, 24, 1, 1, 1);
    g.add_output("y", y);
    g
}

fn host_has_bf16_products() -> bool {
    kiln_codegen::TargetDesc::host().unwrap().has_bf16_pair_kernels()
}

#[test]
fn depthwise_outputs_stored_as_bf16_change_no_bit() {
    let g = model();
    let mut rng = Rng::new(17);
    let x = Tensor::from_vec(vec![N, C, H, W], rng.vec(N * C * H * W));
    let want = kiln_ir::eval::eval_graph(&g, vec![x.clone()]).unwrap();
    let want = want[0].as_slice::<f32>().unwrap().to_vec();
    let feeds = [("x".to_string(), x)];
    let work = WorkDir::new("bf16_storage");
    let mut outputs = vec![];
    let mut arenas = vec![];
    for disabled in [&[][..], &["store-bf16"][..]] {
        let exe = work.0.join(format!("model{}", disabled.len()));
        let summary = compile_graph_bf16_without(&g, "ir", kiln_codegen::Emit::Exe, &exe, disabled).unwrap();
        let stored = summary
            .plan_passes
            .iter()
            .find(|p| p.pass == "store-bf16")
            .map_or(0, |p| p.rewrites);
        let expected = if disabled.is_empty() && host_has_bf16_products() {
            // The three depthwise outputs; each block's output (the first's with its
            // residual add; the second's 24 channels, a column panel cut inside a vector,
            // stored through the tile's local copy), which only the next product reads;
            // the bottleneck's first two convolutions' (the second reads the first's
            // through its im2col packing). The expansions' outputs feed f32 depthwise
            // kernels; the last convolution's is the graph output.
            8
        } else {
            0
        };
        assert_eq!(
            stored, expected,
            "values stored as bf16: {:#?}",
            summary.kernel_lines
        );
        // The report says which outputs are stored as bf16.
        let reported = summary
            .report
            .kernels
            .iter()
            .flat_map(|k| &k.outputs)
            .filter(|v| v.stored_as.as_deref() == Some("bf16"))
            .count();
        assert_eq!(reported, stored, "outputs the report shows stored as bf16");
        arenas.push(summary.arena_bytes);
        for threads in [1, 2] {
            let got = run_executable(&exe, &g, &feeds, &work.0, threads).unwrap();
            outputs.push(got[0].as_slice::<f32>().unwrap().to_vec());
        }
    }
    if !host_has_bf16_products() {
        eprintln!("no avx512_bf16 on this CPU: nothing is stored as bf16; checked the outputs only");
    } else {
        assert!(
            arenas[0] < arenas[1],
            "arena with bf16 values {} vs without {}",
            arenas[0],
            arenas[1]
        );
    }
    for (i, got) in outputs.iter().enumerate() {
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            outputs[0].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "run {i} differs from the first (bf16 storage, 1 thread)"
        );
        // bf16 operands through three products and a depthwise convolution per block.
        let dot: f64 = got
            .iter()
            .zip(&want)
            .map(|(a, b)| f64::from(*a) * f64::from(*b))
            .sum();
        let norm = |v: &[f32]| v.iter().map(|a| f64::from(*a).powi(2)).sum::<f64>().sqrt();
        let cosine = dot / (norm(got) * norm(&want));
        assert!(cosine > 0.999, "run {i}: cosine to the f32 reference {cosine}");
    }
}
