//! Which CPU kernel computes a convolution: the GEMM kernel (im2col or pointwise, NCHW or
//! NHWC), the depthwise kernels (`dwconv`, `conv_nhwc`) or Winograd (`winograd`), from the
//! convolution's geometry.

use super::gemm::pack::{f32s, pack_a, pack_b, to_bytes};
use super::gemm::{BatchDim, Builder, ConvGeom, Operand, Tile};
use crate::error::Result;
use crate::gen::GeneratedKernel;
use crate::kernel::epilogue::{Bias, Epilogue};
use crate::node::NodeInfo;
use crate::target::TargetDesc;
use kiln_ir::{AutoPad, ConvAttrs};

pub(crate) fn lower_conv(
    node: &NodeInfo,
    target: &TargetDesc,
    tile: Tile,
    epi: Epilogue,
    attrs: &ConvAttrs,
) -> Result<Option<Box<dyn GeneratedKernel>>> {
    let xs = node.input_shape(0)?;
    let ws = node.input_shape(1)?;
    let ys = node.output_shape(0)?;
    if xs.len() != 4 || ws.len() != 4 || ys.len() != 4 {
        return Ok(None);
    }
    let Some(w) = f32s(node, 1) else {
        return Ok(None);
    };
    if attrs.channels_last {
        return lower_conv_nhwc(node, target, tile, epi, attrs, &w);
    }
    let (nb, c, h, wd) = (xs[0], xs[1], xs[2], xs[3]);
    let (m, cg, kh, kw) = (ws[0], ws[1], ws[2], ws[3]);
    let g = attrs.group.max(1);
    let (oh, ow) = (ys[2], ys[3]);
    let Some(geo) = conv_geometry(attrs, h, wd, kh, kw, oh, ow) else {
        return Err(node.unsupported("convolution window does not match the output shape"));
    };
    if g == c && g == m && cg == 1 && g > 1 {
        if epi.input_scale.is_some() {
            return Ok(None);
        }
        return crate::gen::dwconv::lower(node, target, epi, &w, geo.into_dw(nb, c));
    }
    if epi.pool_mean {
        return Ok(None);
    }
    if c % g != 0 || m % g != 0 || cg != c / g || ys[1] != m {
        return Ok(None);
    }
    let mg = m / g;
    let geo = ConvGeom { c: cg, ..geo };
    let k = cg * kh * kw;
    let n = oh * ow;
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
        packed: vec![to_bytes(&packed_w)],
        unread,
        what: format!("conv{kh}x{kw}/{}", geo.sh),
        scalable_rows: None,
    };
    b.finish(node, target, tile, epi)
}

/// A channels-last convolution (X `[N,H,W,C]`, Y `[N,OH,OW,M]`): M = output pixels, N = output
/// channels (B = weights, re-laid out to `[(kh,kw,c), m]` and packed), K = KH·KW·C. A 1×1
/// stride-1 convolution is a plain matmul of the input over all images; others pack A from the
/// input with runs of contiguous channels per tap. The bias is per column. Depthwise
/// convolutions go to `conv_nhwc::lower_dw`; other grouped ones are not handled.
fn lower_conv_nhwc(
    node: &NodeInfo,
    target: &TargetDesc,
    tile: Tile,
    mut epi: Epilogue,
    attrs: &ConvAttrs,
    w: &[f32],
) -> Result<Option<Box<dyn GeneratedKernel>>> {
    let xs = node.input_shape(0)?;
    let ws = node.input_shape(1)?;
    let ys = node.output_shape(0)?;
    let (nb, h, wd, c) = (xs[0], xs[1], xs[2], xs[3]);
    let (m, cg, kh, kw) = (ws[0], ws[1], ws[2], ws[3]);
    let g = attrs.group.max(1);
    let (oh, ow) = (ys[1], ys[2]);
    let Some(geo) = conv_geometry(attrs, h, wd, kh, kw, oh, ow) else {
        return Err(node.unsupported("convolution window does not match the output shape"));
    };
    if g == c && g == m && cg == 1 && g > 1 {
        if epi.input_scale.is_some() {
            return Ok(None);
        }
        return crate::gen::conv_nhwc::lower_dw(node, target, epi, w, geo.into_dw(nb, c));
    }
    if g != 1 || cg != c || ys[3] != m {
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
    let packed = pack_b(&wt, k, m, m, 1, tile.nr(), 1.0);
    let pointwise =
        kh == 1 && kw == 1 && geo.sh == 1 && geo.sw == 1 && geo.ph == 0 && geo.pw == 0 && oh == h && ow == wd;
    let mut unread = vec![1];
    if node.has_input(2) {
        unread.push(2);
    }
    let (rows, a, batch) = if pointwise {
        let a = Operand::Strided {
            input: 0,
            rs: c,
            cs: 1,
        };
        (nb * oh * ow, a, vec![])
    } else {
        let a = Operand::Im2colNhwc {
            input: 0,
            g: ConvGeom { c, ..geo },
        };
        let batch = vec![BatchDim {
            extent: nb,
            a: h * wd * c,
            b: 0,
            c: oh * ow * m,
            bias_row: 0,
        }];
        (oh * ow, a, batch)
    };
    let b = Builder {
        m: rows,
        n: m,
        k,
        batch,
        a,
        b: Operand::Packed { slot: 0 },
        packed: vec![to_bytes(&packed)],
        unread,
        what: format!("conv{kh}x{kw}/{} nhwc", geo.sh),
        scalable_rows: pointwise.then_some(oh * ow),
    };
    b.finish(node, target, tile, epi)
}

/// Resolved 2-D window (pads from `auto_pad`), checked against the output extents.
fn conv_geometry(
    a: &ConvAttrs,
    h: usize,
    w: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
) -> Option<ConvGeom> {
    if !a.kernel_shape.is_empty() && a.kernel_shape != [kh, kw] {
        return None;
    }
    let get = |v: &Vec<usize>, i: usize| if v.is_empty() { 1 } else { v[i] };
    let (sh, sw) = (get(&a.strides, 0), get(&a.strides, 1));
    let (dh, dw) = (get(&a.dilations, 0), get(&a.dilations, 1));
    if sh == 0 || sw == 0 || dh == 0 || dw == 0 {
        return None;
    }
    let axis = |input: usize, k: usize, s: usize, d: usize, i: usize| -> Option<(usize, usize)> {
        let ext = (k - 1) * d + 1;
        let (pb, pe) = match a.auto_pad {
            AutoPad::NotSet => {
                if a.pads.is_empty() {
                    (0, 0)
                } else {
                    (a.pads[i], a.pads[i + 2])
                }
            }
            AutoPad::Valid => (0, 0),
            AutoPad::SameUpper | AutoPad::SameLower => {
                let out = input.div_ceil(s);
                let total = ((out.max(1) - 1) * s + ext).saturating_sub(input);
                let b = if a.auto_pad == AutoPad::SameUpper {
                    total / 2
                } else {
                    total.div_ceil(2)
                };
                return Some((b, out));
            }
        };
        let padded = input + pb + pe;
        if padded < ext {
            return None;
        }
        Some((pb, (padded - ext) / s + 1))
    };
    let (ph, o_h) = axis(h, kh, sh, dh, 0)?;
    let (pw, o_w) = axis(w, kw, sw, dw, 1)?;
    if o_h != oh || o_w != ow || kh == 0 || kw == 0 {
        return None;
    }
    Some(ConvGeom {
        c: 0,
        h,
        w,
        kh,
        kw,
        sh,
        sw,
        dh,
        dw,
        ph,
        pw,
        oh,
        ow,
    })
}
