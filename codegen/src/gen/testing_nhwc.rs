//! Channels-last convolution kernels against the reference interpreter (a child of `testing`,
//! whose case builder it uses).

use super::*;
use crate::kernel::epilogue::Residual;

pub(super) fn conv_nhwc(
    kernel: [usize; 2],
    strides: [usize; 2],
    pads: [usize; 4],
    dil: [usize; 2],
    group: usize,
) -> Op {
    match conv(kernel, strides, pads, dil, group) {
        Op::Conv(a) => Op::Conv(ConvAttrs {
            channels_last: true,
            ..a
        }),
        _ => unreachable!(),
    }
}

#[test]
fn nhwc_conv_shapes() {
    // (n, c, h, w, m, k, stride, pad, dilation)
    let cases = [
        (1, 3, 9, 11, 5, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1]),
        (2, 4, 8, 8, 8, [1, 1], [1, 1], [0, 0, 0, 0], [1, 1]),
        (1, 16, 7, 7, 13, [1, 1], [2, 2], [0, 0, 0, 0], [1, 1]),
        (1, 3, 23, 23, 16, [7, 7], [2, 2], [3, 3, 3, 3], [1, 1]),
        (1, 5, 12, 10, 7, [3, 3], [1, 1], [2, 1, 0, 2], [2, 2]),
        (2, 32, 20, 20, 33, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1]),
        (1, 64, 9, 9, 40, [3, 3], [2, 2], [1, 1, 1, 1], [1, 1]),
        (1, 300, 5, 5, 7, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1]),
        // Batches, uneven strides, pads and dilations, K blocks that split taps, and an edge
        // tile past M.
        (2, 128, 9, 7, 20, [3, 3], [2, 1], [1, 0, 2, 1], [2, 1]),
        (3, 24, 6, 5, 20, [1, 1], [1, 1], [0, 0, 0, 0], [1, 1]),
        // Tap rows copied as one run where the window is inside the image: K blocks that
        // end inside a tap row (K = 500 and 3000), row dilation, a window wider than the
        // image (tap by tap only), and a 7x7 stem-like window.
        (2, 20, 11, 13, 17, [5, 5], [2, 2], [2, 2, 2, 2], [1, 1]),
        (1, 200, 6, 9, 24, [3, 5], [1, 2], [2, 1, 0, 2], [2, 1]),
        (1, 3, 5, 4, 8, [7, 7], [1, 1], [3, 3, 3, 3], [1, 1]),
        (1, 3, 30, 29, 64, [7, 7], [2, 2], [3, 3, 3, 3], [1, 1]),
    ];
    for (i, &(n, c, h, w, m, k, s, p, d)) in cases.iter().enumerate() {
        for bias in [true, false] {
            let mut cb = CaseBuilder::new(700 + i as u64)
                .operand(&[n, h, w, c], false)
                .operand(&[m, c, k[0], k[1]], true);
            if bias {
                cb = cb.operand(&[m], true);
            }
            let case = cb.node(conv_nhwc(k, s, p, d, 1));
            case.check(&format!("nhwc conv case {i} bias {bias}"));
        }
    }
}

#[test]
fn nhwc_depthwise_shapes() {
    // (n, c, h, w, k, stride, pad, dilation): channel counts around the vector width and the
    // 4-vector block, so every path (blocks, single vectors, scalar tail) runs; rows whose
    // interior columns make whole blocks of pixels, blocks and leftover pixels, and none.
    let cases = [
        (1, 8, 14, 14, 3, 1, 1, 1),
        (1, 5, 15, 13, 3, 2, 1, 1),
        (2, 3, 7, 7, 5, 1, 2, 1),
        (1, 37, 17, 19, 5, 2, 2, 1),
        (1, 64, 10, 11, 3, 1, 1, 1),
        (1, 6, 11, 12, 3, 3, 0, 2),
        (1, 48, 6, 30, 3, 1, 2, 2),
        (2, 144, 9, 23, 3, 2, 1, 1),
        (1, 96, 5, 20, 3, 1, 0, 1),
        (1, 40, 4, 3, 5, 1, 2, 1),
    ];
    // This machine's target and, on x86-64, the AVX2 one (8 lanes, two vectors per block).
    let host = TargetDesc::host().unwrap();
    let mut targets = vec![host.clone()];
    if host.arch == crate::target::Arch::X86_64 {
        targets.push(TargetDesc::select(None, Some("x86-64-v3")).unwrap());
    }
    for (i, &(n, c, h, w, k, s, p, d)) in cases.iter().enumerate() {
        let case = CaseBuilder::new(800 + i as u64)
            .operand(&[n, h, w, c], false)
            .operand(&[c, 1, k, k], true)
            .operand(&[c], true)
            .node(conv_nhwc([k, k], [s, s], [p, p, p, p], [d, d], c));
        let want = case.reference();
        for target in &targets {
            for threads in [1, 2] {
                let what = format!("nhwc depthwise case {i} on {:?}, {threads} threads", target.isa);
                compare(&what, &case.run_on(target, None, threads), &want);
            }
        }
    }
}

#[test]
fn nhwc_depthwise_residual_and_activation() {
    // The residual and the activation applied per pixel of a block and of the border.
    let (c, h, w) = (32, 6, 13);
    let operands = |with_residual: bool| {
        let cb = CaseBuilder::new(880)
            .operand(&[1, h, w, c], false)
            .operand(&[c, 1, 3, 3], true)
            .operand(&[c], true);
        let cb = if with_residual {
            cb.operand(&[1, h, w, c], false)
        } else {
            cb
        };
        cb.node(conv_nhwc([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], c))
    };
    // Same seed, same first operands: the plain case is the reference convolution.
    let conv = operands(false).reference();
    let case = operands(true);
    let res = case.data[3].clone().unwrap();
    let want: Vec<f32> = conv
        .iter()
        .zip(&res)
        .map(|(y, r)| (y + r).clamp(0.0, 6.0))
        .collect();
    let epi = Epilogue::new(
        Bias::PerRow(case.data[2].clone().unwrap()),
        Some(Residual::Input(3)),
        Activation::Clip { min: 0.0, max: 6.0 },
    );
    compare("nhwc depthwise residual", &case.run(Some(epi), 2), &want);
}

#[test]
fn nhwc_fused_epilogues() {
    for (seed, c, m, g) in [(900, 8, 12, 1), (901, 21, 21, 21)] {
        let case = CaseBuilder::new(seed)
            .operand(&[1, 10, 9, c], false)
            .operand(&[m, c / g, 3, 3], true)
            .operand(&[m], true)
            .node(conv_nhwc([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], g));
        let want: Vec<f32> = case.reference().iter().map(|x| x.clamp(0.0, 6.0)).collect();
        let bias = case.data[2].clone().unwrap();
        let epi = Epilogue::new(Bias::PerRow(bias), None, Activation::Clip { min: 0.0, max: 6.0 });
        compare(&format!("nhwc relu6 group {g}"), &case.run(Some(epi), 2), &want);
    }
}

#[test]
fn nhwc_pointwise_scaled_input() {
    // (n, c, m): images whose rows share a 12-row panel, a channel tail past the vector
    // width, and K split into two blocks (the scales offset by the block's k0).
    for (i, &(n, c, m)) in [(1, 24, 20), (3, 40, 33), (2, 400, 17)].iter().enumerate() {
        let (h, w) = (5, 7);
        let mut case = CaseBuilder::new(950 + i as u64)
            .operand(&[n, h, w, c], false)
            .operand(&[m, c, 1, 1], true)
            .operand(&[m], true)
            .node(conv_nhwc([1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1));
        let x = case.data[0].clone().unwrap();
        let scale: Vec<f32> = Rng::new(960 + i as u64).vec(n * c);
        let scaled: Vec<f32> = x
            .iter()
            .enumerate()
            .map(|(j, v)| v * scale[(j / (h * w * c)) * c + j % c])
            .collect();
        // The reference convolves the scaled input; the kernel reads x and the scales.
        case.graph_inputs[0] = Tensor::from_vec(vec![n, h, w, c], scaled);
        let want = case.reference();
        let mut epi = Epilogue::new(
            Bias::PerRow(case.data[2].clone().unwrap()),
            None,
            Activation::None,
        );
        epi.input_scale = Some(4);
        case.data.extend([None, Some(scale)]);
        compare(
            &format!("nhwc scaled input case {i}"),
            &case.run(Some(epi), 2),
            &want,
        );
    }
}
