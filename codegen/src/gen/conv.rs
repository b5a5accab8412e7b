//! Which CPU kernel computes a convolution: the GEMM kernel (im2col or pointwise, NCHW or
//! NHWC), the depthwise kernels (`dwconv`, `conv_nhwc`) or Winograd (`winograd`), from the
//! convolution's geometry.

use super::gemm::pack::{f32s, pack_a, pack_b};
use super::gemm::{BatchDim, Builder, Operand, Tile};
use crate::error::Result;
use crate::gen::GeneratedKernel;
use crate::kernel::epilogue::{Bias, Epilogue};
use crate::kernel::geometry::{ConvShape, ConvWindow};
use crate::kernel::PackedConst;
use crate::node::NodeInfo;
use crate::target::TargetDesc;
use kiln_ir::ConvAttrs;

pub(crate) fn lower_conv(
    node: &NodeInfo,
    target: &TargetDesc,
    epi: Epilogue,
    attrs: &ConvAttrs,
) -> Result<Option<Box<dyn GeneratedKernel>>> {
    let Some(s) = ConvShape::of(node, attrs)? else {
        return Ok(None);
    };
    let Some(w) = f32s(node, 1) else {
        return Ok(None);
    };
    if attrs.channels_last {
        return lower_conv_nhwc(node, target, epi, attrs, &s, w);
    }
    let (nb, c, h, wd) = (s.batch, s.c, s.h, s.w);
    let (m, cg, kh, kw) = (s.m, s.cg, s.kh, s.kw);
    let g = s.groups;
    let (oh, ow) = (s.oh, s.ow);
    let Some(geo) = s.window(attrs, cg) else {
        return Err(node.unsupported("convolution window does not match the output shape"));
    };
    if s.is_depthwise() {
        if epi.input_scale.is_some() {
            return Ok(None);
        }
        let geo = ConvWindow { c, ..geo };
        return crate::gen::dwconv::lower(node, target, epi, w, nb, geo);
    }
    if epi.pool_mean {
        return Ok(None);
    }
    if c % g != 0 || m % g != 0 || cg != c / g || s.y_channels != m {
        return Ok(None);
    }
    let mg = m / g;
    let k = cg * kh * kw;
    let n = oh * ow;
    let tile = Tile::for_product(target, mg, n);
    let per = mg.div_ceil(tile.mr) * tile.mr * k;
    let mut packed_w = Vec::with_capacity(per * g);
    for gi in 0..g {
        packed_w.extend(pack_a(&w[gi * mg * k..], mg, k, k, 1, tile.mr, 1.0));
    }
    let pointwise =
        kh == 1 && kw == 1 && geo.sh == 1 && geo.sw == 1 && geo.ph == 0 && geo.pw == 0 && oh == h && ow == wd;
    let bop = if pointwise {
        Operand::Strided {
            input: 0,
            rs: h * wd,
            cs: 1,
        }
    } else {
        Operand::Im2col { input: 0, g: geo }
    };
    if let Bias::PerRow(v) = &epi.bias {
        if v.len() != m {
            return Err(node.unsupported(format!("bias has {} values for {m} output channels", v.len())));
        }
    }
    let mut unread = vec![1];
    if node.has_input(2) {
        unread.push(2);
    }
    let b = Builder {
        m: mg,
        n,
        k,
        batch: vec![
            BatchDim {
                extent: nb,
                a: 0,
                b: c * h * wd,
                c: m * n,
                bias_row: 0,
            },
            BatchDim {
                extent: g,
                a: per,
                b: cg * h * wd,
                c: mg * n,
                bias_row: mg,
            },
        ],
        a: Operand::Packed { slot: 0 },
        b: bop,
        packed: vec![PackedConst::from_f32s(&packed_w)],
        unread,
        what: format!("conv{kh}x{kw}/{}", if s.one_d { geo.sw } else { geo.sh }),
        scalable_rows: None,
    };
    b.finish(node, target, tile, epi)
}

/// A channels-last convolution (X `[N,H,W,C]`, Y `[N,OH,OW,M]`): M = output pixels, N = output
/// channels (B = weights, re-laid out to `[(kh,kw,c), m]` and packed), K = KH·KW·C. A 1×1
/// stride-1 convolution is a plain matmul of the input over all images; others pack A from the
/// input with runs of contiguous channels per tap. The bias is per column. Depthwise
/// convolutions go to `dwconv_nhwc::lower_dw`; other grouped ones are not handled.
fn lower_conv_nhwc(
    node: &NodeInfo,
    target: &TargetDesc,
    mut epi: Epilogue,
    attrs: &ConvAttrs,
    s: &ConvShape,
    w: &[f32],
) -> Result<Option<Box<dyn GeneratedKernel>>> {
    let (nb, h, wd, c) = (s.batch, s.h, s.w, s.c);
    let (m, cg, kh, kw) = (s.m, s.cg, s.kh, s.kw);
    let g = s.groups;
    let (oh, ow) = (s.oh, s.ow);
    let Some(geo) = s.window(attrs, cg) else {
        return Err(node.unsupported("convolution window does not match the output shape"));
    };
    if s.is_depthwise() {
        if epi.input_scale.is_some() {
            return Ok(None);
        }
        let geo = ConvWindow { c, ..geo };
        return crate::gen::dwconv_nhwc::lower_dw(node, target, epi, w, nb, geo);
    }
    if g != 1 || cg != c || s.y_channels != m {
        return Ok(None);
    }
    epi.bias = match epi.bias {
        Bias::PerRow(v) if v.len() != m => {
            return Err(node.unsupported(format!("bias has {} values for {m} output channels", v.len())))
        }
        Bias::PerRow(v) => Bias::PerCol(v),
        other => other,
    };
    if kh == 3 && kw == 3 && (geo.sh, geo.sw, geo.dh, geo.dw) == (1, 1, 1, 1) {
        let wg = crate::gen::winograd::WinoGeom {
            n: nb,
            h,
            w: wd,
            c,
            k: m,
            oh,
            ow,
            ph: geo.ph,
            pw: geo.pw,
        };
        if let Some(kernel) = crate::gen::winograd::lower(node, target, &epi, w, wg)? {
            return Ok(Some(kernel));
        }
    }
    let k = kh * kw * c;
    let taps = kh * kw;
    let mut wt = vec![0f32; k * m];
    for mo in 0..m {
        for ci in 0..c {
            for t in 0..taps {
                wt[(t * c + ci) * m + mo] = w[(mo * c + ci) * taps + t];
            }
        }
    }
    let pointwise =
        kh == 1 && kw == 1 && geo.sh == 1 && geo.sw == 1 && geo.ph == 0 && geo.pw == 0 && oh == h && ow == wd;
    // A pointwise convolution is one product over all images; others one per image.
    let rows = if pointwise { nb * oh * ow } else { oh * ow };
    let tile = Tile::for_product(target, rows, m);
    let packed = pack_b(&wt, k, m, m, 1, tile.nr(), 1.0);
    let mut unread = vec![1];
    if node.has_input(2) {
        unread.push(2);
    }
    let (a, batch) = if pointwise {
        let a = Operand::Strided {
            input: 0,
            rs: c,
            cs: 1,
        };
        (a, vec![])
    } else {
        let a = Operand::Im2colNhwc { input: 0, g: geo };
        let batch = vec![BatchDim {
            extent: nb,
            a: h * wd * c,
            b: 0,
            c: oh * ow * m,
            bias_row: 0,
        }];
        (a, batch)
    };
    let b = Builder {
        m: rows,
        n: m,
        k,
        batch,
        a,
        b: Operand::Packed { slot: 0 },
        packed: vec![packed],
        unread,
        what: format!("conv{kh}x{kw}/{} nhwc", geo.sh),
        scalable_rows: pointwise.then_some(oh * ow),
    };
    b.finish(node, target, tile, epi)
}
