//! bf16 pair kernels (`vdpbf16ps`) against the reference interpreter: products whose run-time
//! operand is the autocast pass's `Cast<f32>(Cast<bf16>(x))` and whose weights are bf16
//! values. On a host with avx512_bf16 they must run on pairs; elsewhere the f32 kernels take
//! the same cases (the fallback), and the tests say the pair kernels were not run.

use super::*;

/// The host, and whether its products of bf16 values run on pairs.
fn host() -> (TargetDesc, bool) {
    let t = TargetDesc::host().unwrap();
    let pairs = t.has_bf16_pair_kernels();
    if !pairs {
        eprintln!("skipped: no avx512_bf16 on this CPU; the f32 kernels ran the bf16 cases");
    }
    (t, pairs)
}

fn round_bf16(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect()
}

impl CaseBuilder {
    /// A run-time operand that is bf16-valued the way autocast makes it: a graph input
    /// rounded by `Cast<bf16>` and widened back by `Cast<f32>`. The kernel's data is the
    /// rounded values (what the two casts compute).
    fn bf16_operand(mut self, shape: &[usize]) -> Self {
        let n: usize = shape.iter().product();
        let v = self.rng.vec(n);
        let name = format!("in{}", self.vals.len());
        self.graph_inputs
            .push(Tensor::from_vec(shape.to_vec(), v.clone()));
        let x = self.g.add_input(name.clone(), ty(shape));
        let narrow = self
            .g
            .add(
                format!("{name}.to_bf16"),
                Op::Cast { to: DType::BF16 },
                vec![Some(x)],
                "b",
            )
            .unwrap();
        let wide = self
            .g
            .add(
                format!("{name}.to_f32"),
                Op::Cast { to: DType::F32 },
                vec![Some(narrow)],
                "w",
            )
            .unwrap();
        self.vals.push(Some(wide));
        self.data.push(Some(round_bf16(&v)));
        self
    }

    /// Constant weights rounded to bf16 at compile time, as autocast leaves them.
    fn bf16_weights(mut self, shape: &[usize]) -> Self {
        let n: usize = shape.iter().product();
        let v = round_bf16(&self.rng.vec(n));
        let name = format!("in{}", self.vals.len());
        let id = self
            .g
            .add_const(name, Tensor::from_vec(shape.to_vec(), v.clone()));
        self.vals.push(Some(id));
        self.data.push(Some(v));
        self
    }
}

impl Case {
    /// Lowers the node, checks whether it runs on pairs, and compares 1- and 2-thread runs
    /// with the interpreter (the same products of bf16 values, summed in another order).
    fn check_pairs(&self, what: &str, epi: Option<Epilogue>, want_pairs: bool) {
        let (target, host_pairs) = host();
        let node = NodeInfo::new(&self.g, self.id);
        let k = match epi {
            None => super::super::products::lower(&node, &target),
            Some(e) => super::super::products::lower_fused(&node, &target, e),
        }
        .unwrap()
        .unwrap_or_else(|| panic!("{what}: not lowered"));
        let on_pairs = k.bf16_dot_products();
        assert_eq!(
            on_pairs,
            want_pairs && host_pairs,
            "{what}: kernel {}",
            k.describe()
        );
        let want = self.reference();
        let n: usize = node.output_shape(0).unwrap().iter().product();
        for threads in [1, 2] {
            let got = run_kernel(k.as_ref(), &node, &target, &self.data, n, threads, 0).0;
            compare(&format!("{what} ({threads} threads)"), &got, &want);
        }
    }
}

#[test]
fn bf16_pairs_matmul_shapes() {
    // (m, k, n): odd K (a half pair at the end), K over several blocks, M = 1, cut tiles.
    let shapes = [
        (1, 40, 24),
        (13, 257, 40),
        (49, 1100, 1000),
        (7, 3, 56),
        (30, 768, 96),
        (12, 1, 32),
        (25, 511, 19),
        // The 8×3 and 6×4 tiles (`Tile::for_product`), rows and columns cut.
        (21, 900, 40),
        (5, 300, 120),
    ];
    for (i, &(m, k, n)) in shapes.iter().enumerate() {
        let case = CaseBuilder::new(1000 + i as u64)
            .bf16_operand(&[m, k])
            .bf16_weights(&[k, n])
            .node(Op::MatMul);
        case.check_pairs(&format!("matmul {m}x{k}x{n}"), None, true);
    }
    // A batched run-time A against one weight matrix.
    let case = CaseBuilder::new(1010)
        .bf16_operand(&[2, 3, 5, 64])
        .bf16_weights(&[64, 40])
        .node(Op::MatMul);
    case.check_pairs("batched matmul", None, true);
}

#[test]
fn bf16_pairs_only_for_bf16_values() {
    // A Gemm's alpha folded into the weights leaves values bf16 cannot hold: f32 kernels.
    let gemm = |alpha: f32| Op::Gemm {
        alpha,
        beta: 1.0,
        trans_a: false,
        trans_b: false,
    };
    let case = CaseBuilder::new(1020)
        .bf16_operand(&[9, 70])
        .bf16_weights(&[70, 48])
        .operand(&[48], true)
        .node(gemm(0.3));
    case.check_pairs("gemm alpha 0.3", None, false);
    let case = CaseBuilder::new(1021)
        .bf16_operand(&[9, 70])
        .bf16_weights(&[70, 48])
        .operand(&[48], true)
        .node(gemm(1.0));
    case.check_pairs("gemm with bias", None, true);
    // An f32 run-time operand (no autocast casts), and f32 weights.
    let case = CaseBuilder::new(1022)
        .operand(&[9, 70], false)
        .bf16_weights(&[70, 48])
        .node(Op::MatMul);
    case.check_pairs("f32 activations", None, false);
    let case = CaseBuilder::new(1023)
        .bf16_operand(&[9, 70])
        .operand(&[70, 48], true)
        .node(Op::MatMul);
    case.check_pairs("f32 weights", None, false);
}

#[test]
fn bf16_pairs_with_a_run_time_b() {
    // Both operands activations (attention scores, per-head products): B is packed as pairs
    // block by block (and per-head constants as pair panel sets). Odd K (the last pair's high half zero), K over several blocks, N cut.
    for (i, &(m, k, n)) in [
        (1, 40, 24),
        (13, 257, 40),
        (30, 1100, 70),
        (7, 3, 56),
        (12, 1, 32),
    ]
    .iter()
    .enumerate()
    {
        let case = CaseBuilder::new(1100 + i as u64)
            .bf16_operand(&[m, k])
            .bf16_operand(&[k, n])
            .node(Op::MatMul);
        case.check_pairs(&format!("activations {m}x{k}x{n}"), None, true);
    }
    // Per-head products: batched A and B.
    let case = CaseBuilder::new(1110)
        .bf16_operand(&[2, 3, 17, 64])
        .bf16_operand(&[2, 3, 64, 33])
        .node(Op::MatMul);
    case.check_pairs("per-head matmul", None, true);
    // Per-head constant B (XLNet's position keys): one pair panel set per head, the batch
    // strides halved with K; and one broadcast over the outer batch axis.
    let case = CaseBuilder::new(1113)
        .bf16_operand(&[2, 3, 17, 65])
        .bf16_weights(&[2, 3, 65, 33])
        .node(Op::MatMul);
    case.check_pairs("per-head weights", None, true);
    let case = CaseBuilder::new(1114)
        .bf16_operand(&[2, 3, 17, 64])
        .bf16_weights(&[3, 64, 33])
        .node(Op::MatMul);
    case.check_pairs("per-head weights, broadcast", None, true);
    // A transposed B (Q·Kᵀ): its columns are strided, gathered as they are packed.
    let case = CaseBuilder::new(1111)
        .bf16_operand(&[9, 67])
        .bf16_operand(&[45, 67])
        .node(Op::Gemm {
            alpha: 1.0,
            beta: 1.0,
            trans_a: false,
            trans_b: true,
        });
    case.check_pairs("gemm with Bᵀ", None, true);
    // A run-time B that is not bf16-valued stays on the f32 kernel.
    let case = CaseBuilder::new(1112)
        .bf16_operand(&[9, 70])
        .operand(&[70, 48], false)
        .node(Op::MatMul);
    case.check_pairs("f32 run-time B", None, false);
}

#[test]
fn bf16_pairs_nhwc_conv_shapes() {
    // (n, c, h, w, m, k, stride, pad, dilation): the 3-channel 7x7 stem (K = 147, odd),
    // 3x3 with K blocks that split taps and pairs, pointwise (a row-major A), a batch.
    let cases = [
        (1, 3, 30, 29, 64, [7, 7], [2, 2], [3, 3, 3, 3], [1, 1]),
        (1, 64, 9, 9, 40, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1]),
        (1, 300, 5, 5, 7, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1]),
        (2, 5, 12, 10, 7, [3, 3], [1, 1], [2, 1, 0, 2], [2, 2]),
        (2, 24, 6, 5, 33, [1, 1], [1, 1], [0, 0, 0, 0], [1, 1]),
        (1, 129, 7, 7, 20, [1, 1], [2, 2], [0, 0, 0, 0], [1, 1]),
    ];
    for (i, &(n, c, h, w, m, k, s, p, d)) in cases.iter().enumerate() {
        let case = CaseBuilder::new(1100 + i as u64)
            .bf16_operand(&[n, h, w, c])
            .bf16_weights(&[m, c, k[0], k[1]])
            .operand(&[m], true)
            .node(nhwc::conv_nhwc(k, s, p, d, 1));
        case.check_pairs(&format!("nhwc conv case {i}"), None, true);
    }
}

#[test]
fn bf16_pairs_pointwise_scaled_input() {
    // The squeeze-excitation scale fused in front of a bf16 pointwise convolution: the kernel
    // reads x and the per-image scales and rounds x·s as it packs the pairs, which is what the
    // autocast's rounding pair after the Mul computes. (n, c, m): images sharing a panel, an
    // odd channel count (a half pair), K over two blocks.
    for (i, &(n, c, m)) in [(1, 24, 20), (3, 41, 33), (2, 400, 17)].iter().enumerate() {
        let (h, w) = (5, 7);
        let mut case = CaseBuilder::new(1150 + i as u64)
            .bf16_operand(&[n, h, w, c])
            .bf16_weights(&[m, c, 1, 1])
            .operand(&[m], true)
            .node(nhwc::conv_nhwc([1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1));
        let x: Vec<f32> = Rng::new(1160 + i as u64).vec(n * h * w * c);
        let scale: Vec<f32> = Rng::new(1170 + i as u64).vec(n * c);
        let scaled: Vec<f32> = x
            .iter()
            .enumerate()
            .map(|(j, v)| v * scale[(j / (h * w * c)) * c + j % c])
            .collect();
        // The reference rounds the scaled input (its casts); the kernel gets x and the scales.
        case.graph_inputs[0] = Tensor::from_vec(vec![n, h, w, c], scaled);
        case.data[0] = Some(x);
        let mut epi = Epilogue::new(
            Bias::PerRow(case.data[2].clone().unwrap()),
            None,
            Activation::None,
        );
        epi.input_scale = Some(4);
        case.data.extend([None, Some(scale)]);
        case.check_pairs(&format!("scaled pointwise case {i}"), Some(epi), true);
    }
}

#[test]
fn bf16_pairs_fused_epilogue() {
    // Bias, residual and ReLU in registers after the pair products (ResNet's block end).
    let case = CaseBuilder::new(1200)
        .bf16_operand(&[1, 8, 7, 64])
        .bf16_weights(&[48, 64, 3, 3])
        .operand(&[48], true)
        .operand(&[1, 8, 7, 48], false)
        .node(nhwc::conv_nhwc([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1));
    // The interpreter's Conv ignores the 4th input; add the residual and ReLU here.
    let conv_only = {
        let mut g = case.g.clone();
        let inputs: Vec<_> = g.node(case.id).inputs[..3].to_vec();
        let y = g.add("conv", g.node(case.id).op.clone(), inputs, "c").unwrap();
        g.add_output("c", y);
        let all = kiln_ir::eval::eval_graph(&g, case.graph_inputs.clone()).unwrap();
        all[1].as_slice::<f32>().unwrap().to_vec()
    };
    let res = case.data[3].clone().unwrap();
    let want: Vec<f32> = conv_only
        .iter()
        .zip(&res)
        .map(|(c, r)| (c + r).max(0.0))
        .collect();
    let (target, host_pairs) = host();
    let node = NodeInfo::new(&case.g, case.id);
    let bias = case.data[2].clone().unwrap();
    let epi = Epilogue::new(
        Bias::PerRow(bias),
        Some(crate::kernel::epilogue::Residual::Input(3)),
        Activation::Relu,
    );
    let k = super::super::products::lower_fused(&node, &target, epi)
        .unwrap()
        .unwrap();
    assert_eq!(k.bf16_dot_products(), host_pairs, "{}", k.describe());
    let n = want.len();
    for threads in [1, 2] {
        let got = run_kernel(k.as_ref(), &node, &target, &case.data, n, threads, 0).0;
        compare(&format!("fused epilogue ({threads} threads)"), &got, &want);
    }
    // The autocast's rounding of the result as the last step (the result's only use is a
    // Cast<bf16> → Cast<f32> pair): every output a bf16 value, the nearest one.
    let mut epi = Epilogue::new(
        Bias::PerRow(case.data[2].clone().unwrap()),
        Some(crate::kernel::epilogue::Residual::Input(3)),
        Activation::Relu,
    );
    epi.round_bf16 = true;
    let k = super::super::products::lower_fused(&node, &target, epi)
        .unwrap()
        .unwrap();
    let rounded = round_bf16(&want);
    for threads in [1, 2] {
        let got = run_kernel(k.as_ref(), &node, &target, &case.data, n, threads, 0).0;
        assert!(
            got.iter().all(|x| x.to_bits() & 0xffff == 0),
            "outputs are bf16 values"
        );
        // Within f32 tolerance of the reference, the sums can round to neighbouring bf16
        // values: at most one bf16 step apart (2^-8 relative).
        for (i, (g, w)) in got.iter().zip(&rounded).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 + w.abs() / 128.0,
                "rounded epilogue: element {i}: got {g}, want {w}"
            );
        }
        let exact = got.iter().zip(&rounded).filter(|(g, w)| g == w).count();
        assert!(
            exact * 10 >= n * 9,
            "rounded epilogue: only {exact} of {n} equal the reference's rounding"
        );
    }
}

/// GFLOP/s of bf16 pair kernels next to the f32 kernels on the same shapes (`cargo test
/// --release -p kiln-codegen bf16_gemm_speed -- --ignored --nocapture`). A measurement, not a
/// check: run it on an idle machine and compare with the core's `vdpbf16ps` peak.
#[test]
#[ignore]
fn bf16_gemm_speed() {
    let shapes: Vec<(&str, CaseBuilder, Op, f64)> = vec![
        (
            "matmul 128x768 x 768x768",
            CaseBuilder::new(1300)
                .bf16_operand(&[128, 768])
                .bf16_weights(&[768, 768]),
            Op::MatMul,
            2.0 * 128.0 * 768.0 * 768.0,
        ),
        (
            "matmul 128x768 x 768x3072",
            CaseBuilder::new(1301)
                .bf16_operand(&[128, 768])
                .bf16_weights(&[768, 3072]),
            Op::MatMul,
            2.0 * 128.0 * 768.0 * 3072.0,
        ),
        (
            "matmul 1024^3",
            CaseBuilder::new(1302)
                .bf16_operand(&[1024, 1024])
                .bf16_weights(&[1024, 1024]),
            Op::MatMul,
            2.0 * 1024.0 * 1024.0 * 1024.0,
        ),
        (
            "nhwc conv 64->64 3x3 56x56",
            CaseBuilder::new(1303)
                .bf16_operand(&[1, 56, 56, 64])
                .bf16_weights(&[64, 64, 3, 3])
                .operand(&[64], true),
            nhwc::conv_nhwc([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
            2.0 * 64.0 * 64.0 * 9.0 * 56.0 * 56.0,
        ),
        (
            "nhwc conv 1x1 256->64 56x56",
            CaseBuilder::new(1304)
                .bf16_operand(&[1, 56, 56, 256])
                .bf16_weights(&[64, 256, 1, 1])
                .operand(&[64], true),
            nhwc::conv_nhwc([1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1),
            2.0 * 64.0 * 256.0 * 56.0 * 56.0,
        ),
        (
            "nhwc conv 1x1 64->256 56x56",
            CaseBuilder::new(1308)
                .bf16_operand(&[1, 56, 56, 64])
                .bf16_weights(&[256, 64, 1, 1])
                .operand(&[256], true),
            nhwc::conv_nhwc([1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1),
            2.0 * 256.0 * 64.0 * 56.0 * 56.0,
        ),
        (
            "nhwc conv 1x1 16->96 112x112",
            CaseBuilder::new(1309)
                .bf16_operand(&[1, 112, 112, 16])
                .bf16_weights(&[96, 16, 1, 1])
                .operand(&[96], true),
            nhwc::conv_nhwc([1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1),
            2.0 * 96.0 * 16.0 * 112.0 * 112.0,
        ),
        (
            "nhwc conv 256->256 3x3 14x14",
            CaseBuilder::new(1305)
                .bf16_operand(&[1, 14, 14, 256])
                .bf16_weights(&[256, 256, 3, 3])
                .operand(&[256], true),
            nhwc::conv_nhwc([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
            2.0 * 256.0 * 256.0 * 9.0 * 196.0,
        ),
        (
            "nhwc conv 1x1 2048->512 7x7",
            CaseBuilder::new(1306)
                .bf16_operand(&[1, 7, 7, 2048])
                .bf16_weights(&[512, 2048, 1, 1])
                .operand(&[512], true),
            nhwc::conv_nhwc([1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1),
            2.0 * 49.0 * 2048.0 * 512.0,
        ),
        (
            "nhwc conv 1x1 512->2048 7x7",
            CaseBuilder::new(1307)
                .bf16_operand(&[1, 7, 7, 512])
                .bf16_weights(&[2048, 512, 1, 1])
                .operand(&[2048], true),
            nhwc::conv_nhwc([1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1),
            2.0 * 49.0 * 2048.0 * 512.0,
        ),
    ];
    let (host, _) = host();
    let filter = std::env::var("KILN_SPEED_FILTER").unwrap_or_default();
    for (name, builder, op, flops) in shapes.into_iter().filter(|s| s.0.contains(&filter)) {
        let case = builder.node(op);
        let node = NodeInfo::new(&case.g, case.id);
        // The same shape on the f32 kernels: a target without avx512_bf16.
        let f32_target = TargetDesc {
            has_avx512_bf16: false,
            features: host.features.replace("+avx512bf16", "-avx512bf16"),
            ..host.clone()
        };
        for (what, target) in [("bf16", &host), ("f32 ", &f32_target)] {
            let k = super::super::products::lower(&node, target).unwrap().unwrap();
            let n: usize = node.output_shape(0).unwrap().iter().product();
            for threads in [1, 2] {
                let reps = (6e10 / flops).clamp(20.0, 400.0) as usize;
                let (_, secs) = run_kernel(k.as_ref(), &node, target, &case.data, n, threads, reps);
                println!(
                    "{name:30} {what} {threads} thr: {:8.3} ms {:7.1} GFLOP/s   [{}]",
                    secs * 1e3,
                    flops / secs / 1e9,
                    k.describe()
                );
            }
        }
    }
}
