//! Winograd convolutions against the reference interpreter (a child of `testing`).

use super::nhwc::conv_nhwc;
use super::*;

/// Lowers `case` (a channels-last 3×3 convolution) with `epi`, checks that it became the
/// Winograd kernel `variant` (e.g. "F(4x4,3x3)"), and runs it.
fn run_winograd(case: &Case, epi: Epilogue, variant: &str, threads: usize) -> Vec<f32> {
    let node = NodeInfo::new(&case.g, case.id);
    let target = TargetDesc::host().unwrap();
    let k = super::super::products::lower_fused(&node, &target, epi)
        .unwrap()
        .expect("lowered");
    let what = k.describe();
    assert!(
        what.starts_with(&format!("winograd {variant}")),
        "expected Winograd {variant}, got {what}"
    );
    let n: usize = node.output_shape(0).unwrap().iter().product();
    run_kernel(k.as_ref(), &node, &target, &case.data, n, threads, 0).0
}

/// Largest error allowed, relative to `Σ |x·w|` of the output (`magnitudes`): Winograd's
/// transforms round terms of that size, not of the (possibly much smaller) result, so an
/// error relative to the result would fail near zero crossings; measured up to 1.1e-6 for
/// F(4x4,3x3) (2.2e-6 with the usual points 0, ±1, ±2) and 1.2e-7 for F(2x2,3x3) on these
/// cases. A wrong coefficient or tile offset
/// gives errors of the order of the magnitude itself.
const ERROR_PER_MAGNITUDE: f32 = 1e-5;

fn check_error(what: &str, got: &[f32], want: &[f32], magnitude: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, ((g, w), m)) in got.iter().zip(want).zip(magnitude).enumerate() {
        assert!(
            (g - w).abs() <= ERROR_PER_MAGNITUDE * m,
            "{what}: element {i}: got {g}, want {w} (magnitude {m})"
        );
    }
}

fn bias_epilogue(case: &Case) -> Epilogue {
    Epilogue::new(
        Bias::PerRow(case.data[2].clone().unwrap()),
        None,
        Activation::None,
    )
}

#[test]
fn winograd_shapes() {
    // (n, c, h, w, m, pads, variant): exact tilings, tiles cut at the bottom and right edge,
    // asymmetric pads, no padding, and batches that take several groups of tiles (the last
    // one padded with rows past the batch).
    let cases = [
        (3, 32, 16, 16, 48, [1, 1, 1, 1], "F(4x4,3x3)"),
        (1, 48, 28, 28, 32, [1, 1, 1, 1], "F(4x4,3x3)"),
        (1, 128, 14, 14, 32, [1, 1, 1, 1], "F(2x2,3x3)"),
        (2, 32, 30, 30, 32, [1, 1, 1, 1], "F(4x4,3x3)"),
        (2, 128, 30, 29, 16 * 3, [1, 0, 1, 2], "F(2x2,3x3)"),
        (1, 64, 30, 30, 32, [0, 0, 0, 0], "F(4x4,3x3)"),
        (7, 64, 28, 28, 64, [1, 1, 1, 1], "F(4x4,3x3)"),
    ];
    for (i, &(n, c, h, w, m, p, variant)) in cases.iter().enumerate() {
        let case = CaseBuilder::new(1200 + i as u64)
            .operand(&[n, h, w, c], false)
            .operand(&[m, c, 3, 3], true)
            .operand(&[m], true)
            .node(conv_nhwc([3, 3], [1, 1], p, [1, 1], 1));
        let want = case.reference();
        for threads in [1, 2] {
            let got = run_winograd(&case, bias_epilogue(&case), variant, threads);
            check_error(
                &format!("winograd case {i} threads {threads}"),
                &got,
                &want,
                &magnitudes(&case),
            );
        }
    }
}

#[test]
fn winograd_fused_epilogue() {
    // y = relu(0.5·conv + bias + residual), on a tiling with cut edge tiles so that the
    // residual's masked loads and the masked stores both see partial tiles.
    for (seed, h, c, variant) in [(1300, 30, 32, "F(4x4,3x3)"), (1301, 14, 128, "F(2x2,3x3)")] {
        let (n, m) = (2, 48);
        let operands = |with_residual: bool| {
            let cb = CaseBuilder::new(seed)
                .operand(&[n, h, h, c], false)
                .operand(&[m, c, 3, 3], true)
                .operand(&[m], true);
            let cb = if with_residual {
                cb.operand(&[n, h, h, m], false)
            } else {
                cb
            };
            cb.node(conv_nhwc([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1))
        };
        // Same seed, same first operands: the plain case is the reference convolution.
        let plain = operands(false);
        let conv = plain.reference();
        let case = operands(true);
        let residual = case.data[3].clone().unwrap();
        let bias = case.data[2].clone().unwrap();
        let want: Vec<f32> = conv
            .iter()
            .enumerate()
            .map(|(j, y)| {
                // The reference's conv includes the bias once; the epilogue scales before it.
                let b = bias[j % m];
                (0.5 * (y - b) + b + residual[j]).max(0.0)
            })
            .collect();
        let residual_input = Some(crate::kernel::epilogue::Residual::Input(3));
        let mut epi = Epilogue::new(Bias::PerRow(bias), residual_input, Activation::Relu);
        epi.scale = 0.5;
        // The epilogue halves the product's rounding errors and adds the residual's.
        let bound: Vec<f32> = magnitudes(&plain)
            .iter()
            .zip(&residual)
            .map(|(m, r)| 0.5 * m + r.abs())
            .collect();
        let got = run_winograd(&case, epi, variant, 2);
        check_error(&format!("winograd fused epilogue {variant}"), &got, &want, &bound);
    }
}

/// What `products::lower` makes of a channels-last 3×3 convolution under `algorithm`.
fn lowered(n: usize, c: usize, h: usize, m: usize, algorithm: crate::target::ConvAlgorithm) -> String {
    let case = CaseBuilder::new(1400)
        .operand(&[n, h, h, c], false)
        .operand(&[m, c, 3, 3], true)
        .node(conv_nhwc([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1));
    let node = NodeInfo::new(&case.g, case.id);
    let mut target = TargetDesc::host().unwrap();
    target.conv_algorithm = algorithm;
    super::super::products::lower(&node, &target)
        .unwrap()
        .unwrap()
        .describe()
}

#[test]
fn winograd_declines_small_layers() {
    use crate::target::ConvAlgorithm::Auto;
    // Too few channels, channels off the vector width, too few tiles, and a layer only
    // F(2x2) fits with fewer than 128 channels keep the direct kernel.
    for (n, c, h, m) in [(1, 16, 28, 32), (1, 40, 28, 32), (1, 64, 7, 64), (1, 64, 14, 64)] {
        let what = lowered(n, c, h, m, Auto);
        assert!(!what.starts_with("winograd"), "{what}");
    }
}

#[test]
fn conv_algorithm_chooses_the_variant() {
    use crate::target::ConvAlgorithm::{Auto, Direct};
    assert!(lowered(1, 32, 28, 32, Auto).starts_with("winograd F(4x4,3x3)"));
    assert!(lowered(1, 128, 14, 32, Auto).starts_with("winograd F(2x2,3x3)"));
    assert!(lowered(1, 32, 28, 32, Direct).starts_with("conv3x3/1 nhwc"));
}

/// `Σ |x|·|w| + |bias|` per output of a case's 3×3 NHWC convolution (inputs x, w, bias): the
/// magnitude the rounding errors of any summation order scale with.
fn magnitudes(case: &Case) -> Vec<f32> {
    let node = NodeInfo::new(&case.g, case.id);
    let [n, h, w, c] = node.input_shape(0).unwrap()[..] else {
        panic!("rank")
    };
    let [_, oh, ow, m] = node.output_shape(0).unwrap()[..] else {
        panic!("rank")
    };
    let Op::Conv(a) = &case.g.node(case.id).op else {
        panic!("conv")
    };
    let (pt, pl) = (a.pads[0] as i64, a.pads[1] as i64);
    let (x, wt, b) = (
        case.data[0].as_ref().unwrap(),
        case.data[1].as_ref().unwrap(),
        case.data[2].as_ref().unwrap(),
    );
    let mut out = vec![0f32; n * oh * ow * m];
    for (o, mag) in out.iter_mut().enumerate() {
        let (img, y, xo, mo) = (o / (oh * ow * m), o / (ow * m) % oh, o / m % ow, o % m);
        let mut s = b[mo].abs() as f64;
        for ky in 0..3 {
            for kx in 0..3 {
                let (iy, ix) = (y as i64 + ky - pt, xo as i64 + kx - pl);
                if iy < 0 || ix < 0 || iy >= h as i64 || ix >= w as i64 {
                    continue;
                }
                for ci in 0..c {
                    let xv = x[((img * h + iy as usize) * w + ix as usize) * c + ci];
                    let wv = wt[((mo * c + ci) * 3 + ky as usize) * 3 + kx as usize];
                    s += (xv * wv).abs() as f64;
                }
            }
        }
        *mag = s as f32;
    }
    out
}
