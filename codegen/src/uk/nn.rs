//! Micro-kernel lowering for the nn family (see `codegen/ukernels/nn.c`): pooling, convolution,
//! MatMul/Gemm, Einsum, Det, Attention and RotaryEmbedding. These are the generic fallbacks: the
//! generated f32 GEMM/convolution kernels (`gen/`) are tried first.
//!
//! Window geometry (auto_pad, ceil_mode, ConvTranspose's output_shape) is resolved here at
//! compile time with the rules of `ir/src/ops/conv.rs`, so the C kernels only see explicit
//! per-axis (kernel, stride, dilation, pad_begin, pad_end).

use super::codes::MaskCode;
use super::UkCall;
use crate::error::Result;
use crate::node::NodeInfo;
use kiln_ir::ops::attention_promote as promote;
use kiln_ir::ops::WindowAxis as Axis;
use kiln_ir::{
    AttentionAttrs, AutoPad, ConvAttrs, ConvTransposeAttrs, DType, MiscOp, Op, PoolAttrs, PoolKind,
};

/// Spatial axes the C kernels handle (they pad fewer with unit axes).
const MAX_SPATIAL: usize = 3;

pub fn lower(node: &NodeInfo) -> Result<Option<UkCall>> {
    match node.op() {
        Op::Pool(p) => pool(node, p).map(Some),
        Op::GlobalPool(kind) => global_pool(node, *kind).map(Some),
        Op::Conv(c) => conv(node, c).map(Some),
        Op::ConvTranspose(c) => conv_transpose(node, c).map(Some),
        Op::MatMul => matmul(node).map(Some),
        Op::Gemm {
            alpha,
            beta,
            trans_a,
            trans_b,
        } => gemm(node, *alpha, *beta, *trans_a, *trans_b).map(Some),
        Op::Einsum { equation } => einsum(node, equation).map(Some),
        Op::Attention(a) => attention(node, a).map(Some),
        Op::Misc(MiscOp::Det) => det(node).map(Some),
        Op::Misc(MiscOp::RotaryEmbedding {
            interleaved,
            rotary_dim,
            num_heads,
        }) => rotary(node, *interleaved, *rotary_dim, *num_heads).map(Some),
        _ => Ok(None),
    }
}

/// Scratch sizing with the C side's `carve`: every buffer starts 64-byte aligned.
#[derive(Default)]
struct Carve(u64);

impl Carve {
    fn take(&mut self, bytes: usize) {
        self.0 += (bytes as u64).div_ceil(64) * 64;
    }
}

// ---------------------------------------------------------------------------------------------
// Window geometry (ir's resolve_axis; a port of its transpose_axis)
// ---------------------------------------------------------------------------------------------

/// The axis as the kernels' integer attributes. (An axis: output `o` at tap `k` reads input
/// `o * stride + k * dilation - pad_begin`; for ConvTranspose `input` is the extent the window
/// reads, Y, and `output` the window positions, X.)
fn axis_attrs(a: &Axis) -> [i64; 5] {
    [
        a.kernel as i64,
        a.stride as i64,
        a.dilation as i64,
        a.pad_begin,
        a.pad_end,
    ]
}

fn per_axis(v: &[usize], n: usize, default: usize) -> Vec<usize> {
    if v.is_empty() {
        vec![default; n]
    } else {
        v.to_vec()
    }
}

fn split_pads(pads: &[usize], n: usize) -> Vec<(usize, usize)> {
    if pads.len() != 2 * n {
        return vec![(0, 0); n];
    }
    (0..n).map(|i| (pads[i], pads[n + i])).collect()
}

#[allow(clippy::too_many_arguments)]
fn resolve_axis(
    node: &NodeInfo,
    input: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
    pads: (usize, usize),
    auto_pad: AutoPad,
    ceil_mode: bool,
) -> Result<Axis> {
    kiln_ir::ops::resolve_window_axis(input, kernel, stride, dilation, pads, auto_pad, ceil_mode)
        .map_err(|e| node.unsupported(format!("the window geometry is invalid: {e}")))
}

/// The windows of a Conv or pool over `spatial`, checked against the output's spatial extents.
fn conv_axes(
    node: &NodeInfo,
    spatial: &[usize],
    kernel: &[usize],
    c: (&[usize], &[usize], &[usize], AutoPad, bool),
    out_spatial: &[usize],
) -> Result<Vec<Axis>> {
    let n = spatial.len();
    if n == 0 || n > MAX_SPATIAL {
        return Err(node.unsupported(format!(
            "{n} spatial axes (the compiled kernel handles 1 to {MAX_SPATIAL})"
        )));
    }
    let (strides, dilations, pads, auto_pad, ceil_mode) = c;
    let strides = per_axis(strides, n, 1);
    let dilations = per_axis(dilations, n, 1);
    let pads = split_pads(pads, n);
    let axes = (0..n)
        .map(|i| {
            resolve_axis(
                node,
                spatial[i],
                kernel[i],
                strides[i],
                dilations[i],
                pads[i],
                auto_pad,
                ceil_mode,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    check_extents(node, &axes, |a| a.output, out_spatial)?;
    Ok(axes)
}

fn check_extents(node: &NodeInfo, axes: &[Axis], f: impl Fn(&Axis) -> usize, want: &[usize]) -> Result<()> {
    let got: Vec<usize> = axes.iter().map(f).collect();
    if got != want {
        return Err(crate::CodegenError::internal(format!(
            "node '{}': window geometry gives spatial extents {got:?}, the graph says {want:?}",
            node.name()
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Pools
// ---------------------------------------------------------------------------------------------

fn pool(node: &NodeInfo, p: &PoolAttrs) -> Result<UkCall> {
    let x = node.input_shape(0)?;
    let y = node.output_shape(0)?;
    if p.channels_last {
        return pool_nhwc(node, p, &x, &y);
    }
    if x.len() < 3 {
        return Err(node.unsupported("input must have shape [N, C, spatial...]"));
    }
    let axes = conv_axes(
        node,
        &x[2..],
        &p.kernel_shape,
        (&p.strides, &p.dilations, &p.pads, p.auto_pad, p.ceil_mode),
        &y[2..],
    )?;
    let (kind, cip, lp) = match p.kind {
        PoolKind::Max => (0, false, 2.0),
        PoolKind::Average { count_include_pad } => (1, count_include_pad, 2.0),
        PoolKind::Lp { p } => (2, false, f64::from(p)),
    };
    let mut iattr = vec![kind, axes.len() as i64, cip as i64, i64::from(p.storage_order)];
    iattr.extend(axes.iter().flat_map(axis_attrs));
    Ok(UkCall::new("pool").iattr(iattr).fattr([lp]))
}

/// A channels-last 2-D max/average pool of f32, or max pool of 8-bit integers
/// (`kiln_uk_pool_nhwc`).
fn pool_nhwc(node: &NodeInfo, p: &PoolAttrs, x: &[usize], y: &[usize]) -> Result<UkCall> {
    let dtype_ok = match node.input_dtype(0) {
        Some(DType::F32) => true,
        Some(DType::U8 | DType::I8) => p.kind == PoolKind::Max,
        _ => false,
    };
    if x.len() != 4 || y.len() != 4 || !dtype_ok || node.n_outputs() != 1 {
        return Err(node.unsupported(
            "a channels-last pool needs a 4-D input (f32, or u8/i8 for MaxPool) and one output",
        ));
    }
    let axes = conv_axes(
        node,
        &x[1..3],
        &p.kernel_shape,
        (&p.strides, &p.dilations, &p.pads, p.auto_pad, p.ceil_mode),
        &y[1..3],
    )?;
    let (kind, cip) = match p.kind {
        PoolKind::Max => (0, false),
        PoolKind::Average { count_include_pad } => (1, count_include_pad),
        PoolKind::Lp { .. } => return Err(node.unsupported("channels-last LpPool is not implemented")),
    };
    let mut iattr = vec![kind, cip as i64];
    iattr.extend(axes.iter().flat_map(axis_attrs));
    Ok(UkCall::new("pool_nhwc").iattr(iattr))
}

fn global_pool(node: &NodeInfo, kind: PoolKind) -> Result<UkCall> {
    node.input_shape(0)?;
    let (k, p) = match kind {
        PoolKind::Max => (0, 2.0),
        PoolKind::Average { .. } => (1, 2.0),
        PoolKind::Lp { p } => (2, f64::from(p)),
    };
    Ok(UkCall::new("global_pool").iattr([k]).fattr([p]))
}

// ---------------------------------------------------------------------------------------------
// Conv / ConvTranspose
// ---------------------------------------------------------------------------------------------

/// Kernel extents: the attribute, or W's spatial dims.
fn kernel_of(attr: &[usize], w: &[usize]) -> Vec<usize> {
    if attr.is_empty() {
        w[2..].to_vec()
    } else {
        attr.to_vec()
    }
}

/// Scratch of a convolution: f16/bf16 operands and result widened to f32.
fn conv_scratch(node: &NodeInfo, x: &[usize], w: &[usize], y: &[usize]) -> Result<u64> {
    let dt = node.input_dtype(0).unwrap_or(DType::F32);
    if dt == DType::F32 || dt == DType::F64 {
        return Ok(0);
    }
    let mut c = Carve::default();
    c.take(x.iter().product::<usize>() * 4);
    c.take(w.iter().product::<usize>() * 4);
    if node.has_input(2) {
        c.take(node.input_shape(2)?.iter().product::<usize>() * 4);
    }
    c.take(y.iter().product::<usize>() * 4);
    Ok(c.0)
}

fn conv(node: &NodeInfo, a: &ConvAttrs) -> Result<UkCall> {
    let x = node.input_shape(0)?;
    let w = node.input_shape(1)?;
    let y = node.output_shape(0)?;
    if x.len() < 3 || w.len() != x.len() || a.group == 0 {
        return Err(node.unsupported("X, W and group do not describe a convolution"));
    }
    if a.channels_last {
        return Err(node.unsupported(
            "a channels-last convolution runs only as a generated f32 kernel (dense or depthwise)",
        ));
    }
    let kernel = kernel_of(&a.kernel_shape, &w);
    let axes = conv_axes(
        node,
        &x[2..],
        &kernel,
        (&a.strides, &a.dilations, &a.pads, a.auto_pad, false),
        &y[2..],
    )?;
    let mut iattr = vec![a.group as i64, axes.len() as i64];
    iattr.extend(axes.iter().flat_map(axis_attrs));
    Ok(UkCall::new("conv")
        .iattr(iattr)
        .scratch(conv_scratch(node, &x, &w, &y)?))
}

fn conv_transpose(node: &NodeInfo, a: &ConvTransposeAttrs) -> Result<UkCall> {
    let x = node.input_shape(0)?;
    let w = node.input_shape(1)?;
    let y = node.output_shape(0)?;
    let c = &a.conv;
    if x.len() < 3 || w.len() != x.len() || c.group == 0 {
        return Err(node.unsupported("X, W and group do not describe a transposed convolution"));
    }
    let n = x.len() - 2;
    if n > MAX_SPATIAL {
        return Err(node.unsupported(format!(
            "{n} spatial axes (the compiled kernel handles 1 to {MAX_SPATIAL})"
        )));
    }
    let kernel = kernel_of(&c.kernel_shape, &w);
    let strides = per_axis(&c.strides, n, 1);
    let dilations = per_axis(&c.dilations, n, 1);
    let output_padding = per_axis(&a.output_padding, n, 0);
    let pads = split_pads(&c.pads, n);
    let mut axes = Vec::with_capacity(n);
    for i in 0..n {
        let (stride, dilation) = (strides[i] as i64, dilations[i] as i64);
        let extent = (kernel[i] as i64 - 1) * dilation + 1;
        let natural = (x[2 + i] as i64 - 1) * stride + output_padding[i] as i64 + extent;
        // SAME_UPPER puts the odd padding element at the end, every other mode at the start.
        let split = |total: i64, upper: bool| {
            let half = total.div_euclid(2);
            if upper {
                (half, total - half)
            } else {
                (total - half, half)
            }
        };
        let upper = c.auto_pad == AutoPad::SameUpper;
        let (pb, pe) = if !a.output_shape.is_empty() {
            split(natural - a.output_shape[i] as i64, upper)
        } else {
            match c.auto_pad {
                AutoPad::SameUpper | AutoPad::SameLower => split(natural - x[2 + i] as i64 * stride, upper),
                AutoPad::Valid => (0, 0),
                AutoPad::NotSet => (pads[i].0 as i64, pads[i].1 as i64),
            }
        };
        let out = natural - pb - pe;
        if out < 0 {
            return Err(node.unsupported("the output extent is negative"));
        }
        axes.push(Axis {
            kernel: kernel[i],
            stride: strides[i],
            dilation: dilations[i],
            pad_begin: pb,
            pad_end: pe,
            input: out as usize,
            output: x[2 + i],
        });
    }
    check_extents(node, &axes, |a| a.input, &y[2..])?;
    let mut iattr = vec![c.group as i64, n as i64];
    iattr.extend(axes.iter().flat_map(axis_attrs));
    Ok(UkCall::new("conv_transpose")
        .iattr(iattr)
        .scratch(conv_scratch(node, &x, &w, &y)?))
}

// ---------------------------------------------------------------------------------------------
// MatMul / Gemm
// ---------------------------------------------------------------------------------------------

// The accumulation type, chosen by the C kernel's rule (`acc_kind` in nn.c).
use super::codes::AccCode as Acc;

fn acc_of(d: DType) -> Acc {
    match d {
        DType::F64 => Acc::ACC_F64,
        d if d.is_float() => Acc::ACC_F32,
        _ => Acc::ACC_I64,
    }
}

impl Acc {
    fn size(self) -> usize {
        if self == Acc::ACC_F32 {
            4
        } else {
            8
        }
    }

    /// Whether a tensor of `d` is used as is (else converted into scratch).
    fn direct(self, d: DType) -> bool {
        matches!(
            (self, d),
            (Acc::ACC_F32, DType::F32) | (Acc::ACC_F64, DType::F64) | (Acc::ACC_I64, DType::I64 | DType::U64)
        )
    }
}

fn numeric_dtype(node: &NodeInfo) -> Result<DType> {
    let d = node
        .input_dtype(0)
        .ok_or_else(|| node.unsupported("input A is missing"))?;
    if d == DType::Bool {
        return Err(node.unsupported("bool operands are not supported"));
    }
    Ok(d)
}

fn matmul(node: &NodeInfo) -> Result<UkCall> {
    let dt = numeric_dtype(node)?;
    let a = node.input_shape(0)?;
    let b = node.input_shape(1)?;
    let y = node.output_shape(0)?;
    if a.is_empty() || b.is_empty() {
        return Err(node.unsupported("MatMul needs inputs of rank >= 1"));
    }
    let (a_batch, m, k) = match a.len() {
        1 => (vec![], 1, a[0]),
        r => (a[..r - 2].to_vec(), a[r - 2], a[r - 1]),
    };
    let (b_batch, kb, n) = match b.len() {
        1 => (vec![], b[0], 1),
        r => (b[..r - 2].to_vec(), b[r - 2], b[r - 1]),
    };
    if k != kb {
        return Err(node.unsupported("inner dimensions differ"));
    }
    let mut iattr;
    if b_batch.is_empty() {
        // Every matrix of A multiplies the same B: fold A's batch into rows.
        let rows = a_batch.iter().product::<usize>() * m;
        iattr = vec![rows as i64, k as i64, n as i64, 0];
    } else {
        let r = a_batch.len().max(b_batch.len());
        let pad = |v: &[usize]| -> Vec<usize> {
            let mut p = vec![1; r - v.len()];
            p.extend_from_slice(v);
            p
        };
        let (ab, bb) = (pad(&a_batch), pad(&b_batch));
        let dims: Vec<usize> = ab.iter().zip(&bb).map(|(&x, &y)| x.max(y)).collect();
        let strides = |v: &[usize]| -> Vec<i64> {
            let mut s = vec![0i64; r];
            let mut acc = 1usize;
            for i in (0..r).rev() {
                s[i] = if v[i] == 1 { 0 } else { acc as i64 };
                acc *= v[i];
            }
            s
        };
        iattr = vec![m as i64, k as i64, n as i64, r as i64];
        iattr.extend(dims.iter().map(|&d| d as i64));
        iattr.extend(strides(&ab));
        iattr.extend(strides(&bb));
    }
    let acc = acc_of(dt);
    let mut c = Carve::default();
    for shape in [&a, &b] {
        if !acc.direct(dt) {
            c.take(shape.iter().product::<usize>() * acc.size());
        }
    }
    if !acc.direct(dt) {
        c.take(y.iter().product::<usize>() * acc.size());
    }
    Ok(UkCall::new("matmul").iattr(iattr).scratch(c.0))
}

fn gemm(node: &NodeInfo, alpha: f32, beta: f32, trans_a: bool, trans_b: bool) -> Result<UkCall> {
    let dt = numeric_dtype(node)?;
    let a = node.input_shape(0)?;
    let b = node.input_shape(1)?;
    if a.len() != 2 || b.len() != 2 {
        return Err(node.unsupported("Gemm needs 2-D A and B"));
    }
    let (m, k) = if trans_a { (a[1], a[0]) } else { (a[0], a[1]) };
    let (kb, n) = if trans_b { (b[1], b[0]) } else { (b[0], b[1]) };
    if k != kb {
        return Err(node.unsupported("inner dimensions differ"));
    }
    let (c0, c1, c_len) = match node.has_input(2) {
        false => (0, 0, 0),
        true => {
            let c = node.input_shape(2)?;
            let len = c.iter().product::<usize>();
            match c.len() {
                0 => (1, 1, len),
                1 => (1, c[0], len),
                2 => (c[0], c[1], len),
                _ => return Err(node.unsupported("C does not broadcast to [M, N]")),
            }
        }
    };
    let acc = acc_of(dt);
    let sz = acc.size();
    let mut s = Carve::default();
    if !acc.direct(dt) {
        s.take(m * k * sz);
        s.take(k * n * sz);
    }
    if trans_a {
        s.take(m * k * sz);
    }
    if trans_b {
        s.take(k * n * sz);
    }
    if !acc.direct(dt) {
        s.take(m * n * sz);
    }
    if c_len > 0 && beta != 0.0 && acc != Acc::ACC_I64 && !acc.direct(dt) {
        s.take(c_len * sz);
    }
    Ok(UkCall::new("gemm")
        .iattr([
            m as i64,
            k as i64,
            n as i64,
            trans_a as i64,
            trans_b as i64,
            c0 as i64,
            c1 as i64,
        ])
        .fattr([f64::from(alpha), f64::from(beta)])
        .scratch(s.0))
}

// ---------------------------------------------------------------------------------------------
// Einsum
// ---------------------------------------------------------------------------------------------

/// Operands the C kernel accepts (`EINSUM_MAX_OPS`).
const EINSUM_MAX_OPS: usize = 16;

fn einsum(node: &NodeInfo, equation: &str) -> Result<UkCall> {
    let n_ops = node.n_inputs();
    if n_ops == 0 || n_ops > EINSUM_MAX_OPS {
        return Err(node.unsupported(format!(
            "{n_ops} operands (the compiled kernel takes 1 to {EINSUM_MAX_OPS})"
        )));
    }
    let shapes = (0..n_ops)
        .map(|i| node.input_shape(i))
        .collect::<Result<Vec<_>>>()?;
    let ranks: Vec<usize> = shapes.iter().map(Vec::len).collect();
    // The labels as the reference interpreter reads the equation.
    let kiln_ir::ops::EinsumSpec { operands, output } = kiln_ir::ops::parse_einsum(equation, &ranks)
        .map_err(|e| node.unsupported(format!("invalid Einsum equation: {e}")))?;
    // Extent of every label: equal across operands, or 1 broadcast against the others.
    let mut ext: std::collections::BTreeMap<usize, usize> = Default::default();
    for (labels, shape) in operands.iter().zip(&shapes) {
        for (&l, &d) in labels.iter().zip(shape) {
            let e = ext.entry(l).or_insert(d);
            if *e == 1 {
                *e = d;
            } else if d != 1 && d != *e {
                return Err(node.unsupported("operand extents of one label differ"));
            }
        }
    }
    let mut order = output.clone();
    order.extend(ext.keys().copied().filter(|l| !output.contains(l)));
    let extent = |l: usize| ext.get(&l).copied().unwrap_or(1);
    let mut iattr = vec![n_ops as i64, order.len() as i64, output.len() as i64];
    iattr.extend(order.iter().map(|&l| extent(l) as i64));
    for (labels, shape) in operands.iter().zip(&shapes) {
        let mut strides = vec![0i64; order.len()];
        let mut acc = 1usize;
        for ax in (0..labels.len()).rev() {
            let l = labels[ax];
            if !(shape[ax] == 1 && extent(l) != 1) {
                let pos = order.iter().position(|&x| x == l).unwrap_or(0);
                strides[pos] += acc as i64;
            }
            acc *= shape[ax];
        }
        iattr.extend(strides);
    }
    Ok(UkCall::new("einsum").iattr(iattr))
}

// ---------------------------------------------------------------------------------------------
// Det, RotaryEmbedding
// ---------------------------------------------------------------------------------------------

fn det(node: &NodeInfo) -> Result<UkCall> {
    let x = node.input_shape(0)?;
    let r = x.len();
    if r < 2 || x[r - 1] != x[r - 2] {
        return Err(node.unsupported("Det needs a [*, M, M] input"));
    }
    let m = x[r - 1];
    let mut c = Carve::default();
    c.take(x.iter().product::<usize>() * 8);
    Ok(UkCall::new("det").iattr([m as i64]).scratch(c.0))
}

fn rotary(node: &NodeInfo, interleaved: bool, rotary_dim: usize, num_heads: usize) -> Result<UkCall> {
    let x = node.input_shape(0)?;
    let (three_d, b, q, h, d) = match *x.as_slice() {
        [b, h, q, d] => (false, b, q, h, d),
        [b, q, hidden] if num_heads > 0 && hidden % num_heads == 0 => {
            (true, b, q, num_heads, hidden / num_heads)
        }
        _ => return Err(node.unsupported("X must be [B, H, S, D], or [B, S, H*D] with num_heads")),
    };
    let rd = if rotary_dim == 0 { d } else { rotary_dim };
    if rd > d || rd % 2 != 0 {
        return Err(node.unsupported("rotary_embedding_dim must be even and at most the head size"));
    }
    let cos = node.input_shape(1)?;
    let ok = match node.has_input(3) {
        true => cos.len() == 2 && node.input_shape(3)? == [b, q],
        false => cos.len() == 3 && cos[..2] == [b, q],
    };
    if !ok || cos.last() != Some(&(rd / 2)) || node.input_shape(2)? != cos {
        return Err(node.unsupported("the cos/sin caches or position_ids do not fit X"));
    }
    Ok(UkCall::new("rotary_embedding").iattr([
        interleaved as i64,
        rd as i64,
        three_d as i64,
        b as i64,
        q as i64,
        h as i64,
        d as i64,
    ]))
}

// ---------------------------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------------------------

fn attention(node: &NodeInfo, a: &AttentionAttrs) -> Result<UkCall> {
    let dt = node
        .input_dtype(0)
        .ok_or_else(|| node.unsupported("Q is missing"))?;
    let (q, k, v) = (node.input_shape(0)?, node.input_shape(1)?, node.input_shape(2)?);
    let bad = || node.unsupported("Q, K and V do not fit together");
    let (three_d, b, hq, hkv, sq, skv, dk, dv) = match (q.as_slice(), k.as_slice(), v.as_slice()) {
        (&[b, sq, qh], &[_, skv, kh], &[_, _, vh]) => {
            let (hq, hkv) = (a.q_num_heads, a.kv_num_heads);
            if hq == 0 || hkv == 0 || qh % hq != 0 || kh % hkv != 0 || vh % hkv != 0 {
                return Err(bad());
            }
            (true, b, hq, hkv, sq, skv, qh / hq, vh / hkv)
        }
        (&[b, hq, sq, dk], &[_, hkv, skv, _], &[_, _, _, dv]) => (false, b, hq, hkv, sq, skv, dk, dv),
        _ => return Err(bad()),
    };
    if hkv == 0 || hq % hkv != 0 {
        return Err(bad());
    }
    let past = match node.has_input(4) {
        true => node.input_shape(4)?.get(2).copied().ok_or_else(bad)?,
        false => 0,
    };
    let total = past + skv;
    if let Some(call) = attention_f32(node, a, dt, three_d, [b, hq, hkv, sq, total, dk, dv])? {
        return Ok(call);
    }
    let (mask_kind, mask_shape, bias_dtype) = match node.input_type(3) {
        None => (MaskCode::MASK_NONE, [1; 4], dt),
        Some(m) => {
            let s = node.input_shape(3)?;
            if s.is_empty() || s.len() > 4 {
                return Err(node.unsupported("attn_mask must have rank 1 to 4"));
            }
            let mut shape = [1usize; 4];
            shape[4 - s.len()..].copy_from_slice(&s);
            let full = [b, hq, sq, total];
            if shape[3] > total || (0..3).any(|i| shape[i] != 1 && shape[i] != full[i]) {
                return Err(node.unsupported("attn_mask does not broadcast to [B, Hq, Sq, T]"));
            }
            match m.dtype {
                DType::Bool => (MaskCode::MASK_BOOL, shape, dt),
                d if d.is_float() => (MaskCode::MASK_FLOAT, shape, promote(dt, d)),
                _ => return Err(node.unsupported("attn_mask must be bool or float")),
            }
        }
    };
    let capped = if a.softcap > 0.0 {
        promote(dt, DType::F32)
    } else {
        dt
    };
    let biased = promote(capped, bias_dtype);
    let softmax = a.softmax_precision.unwrap_or(biased);
    // sqrt(scale) is taken in f32 when the scale is given (it is an f32 attribute).
    let s = match a.scale {
        Some(s) => f64::from(s.sqrt()),
        None => (1.0 / (dk as f64).sqrt()).sqrt(),
    };
    let mut iattr = vec![
        three_d as i64,
        b as i64,
        hq as i64,
        hkv as i64,
        sq as i64,
        skv as i64,
        past as i64,
        dk as i64,
        dv as i64,
        a.is_causal as i64,
        a.qk_matmul_output_mode,
        a.left_window_size,
        a.right_window_size,
        dt as i64,
        capped as i64,
        biased as i64,
        softmax as i64,
        mask_kind.code(),
    ];
    iattr.extend(mask_shape.iter().map(|&d| d as i64));
    let mut c = Carve::default();
    c.take(b * hkv * total * dk * 8);
    c.take(b * hkv * total * dv * 8);
    c.take(b * hq * (total + dk + dv) * 8);
    Ok(UkCall::new("attention")
        .iattr(iattr)
        .fattr([s, f64::from(a.softcap)])
        .scratch(c.0))
}

/// Query rows per task of the f32 attention kernel: enough to amortise transposing K (each
/// task transposes its head's K). 128 rows took 6% less time than 64 on BERT-base's attention
/// (12 heads, sequence 128, Zen 5, 2 threads); with fewer than `ATTN_MIN_HEADS` (batch ×
/// heads) the smaller blocks keep more tasks for the threads.
const ATTN_ROWS: usize = 128;
const ATTN_ROWS_FEW_HEADS: usize = 64;
const ATTN_MIN_HEADS: usize = 8;
// The kernel keeps a task's softmax factors in an array of `AF_MAX_ROWS` (128) floats.
const _: () = assert!(ATTN_ROWS <= 128 && ATTN_ROWS_FEW_HEADS <= 128);

/// The f32 kernel (`kiln_uk_attention_f32`) for the plain operator: f32 throughout, no KV
/// cache, softcap, sliding window or QK output, nonpad lengths only without the causal mask
/// (with it they also move the diagonal); None otherwise.
fn attention_f32(
    node: &NodeInfo,
    a: &AttentionAttrs,
    dt: DType,
    three_d: bool,
    [b, hq, hkv, sq, t, dk, dv]: [usize; 7],
) -> Result<Option<UkCall>> {
    let nonpad = node.has_input(6);
    let extra = (4..6).any(|i| node.has_input(i))
        || node.n_outputs() > 1
        || (nonpad && (a.is_causal || node.input_dtype(6) != Some(DType::I64)));
    let plain = a.softcap <= 0.0
        && a.left_window_size < 0
        && a.right_window_size < 0
        && matches!(a.softmax_precision, None | Some(DType::F32));
    if dt != DType::F32 || extra || !plain || (1..3).any(|i| node.input_dtype(i) != Some(DType::F32)) {
        return Ok(None);
    }
    let (mask_kind, mask_shape) = match node.input_type(3) {
        None => (MaskCode::MASK_NONE, [1; 4]),
        Some(m) => {
            let s = node.input_shape(3)?;
            let kind = match m.dtype {
                DType::Bool => MaskCode::MASK_BOOL,
                DType::F32 => MaskCode::MASK_FLOAT,
                _ => return Ok(None),
            };
            if s.is_empty() || s.len() > 4 {
                return Ok(None);
            }
            let mut shape = [1usize; 4];
            shape[4 - s.len()..].copy_from_slice(&s);
            let full = [b, hq, sq, t];
            if shape[3] > t || (0..3).any(|i| shape[i] != 1 && shape[i] != full[i]) {
                return Ok(None);
            }
            (kind, shape)
        }
    };
    let scale = a.scale.map_or(1.0 / (dk as f64).sqrt(), f64::from);
    let rows = match b * hq >= ATTN_MIN_HEADS {
        true => ATTN_ROWS,
        false => ATTN_ROWS_FEW_HEADS,
    }
    .min(sq.max(1));
    let (tp, scratch) = attention_tiles(t, dk, rows, ATTN_COLS);
    let mut iattr = vec![
        three_d as i64,
        b as i64,
        hq as i64,
        hkv as i64,
        sq as i64,
        t as i64,
        dk as i64,
        dv as i64,
        a.is_causal as i64,
        mask_kind.code(),
    ];
    iattr.extend(mask_shape.iter().map(|&d| d as i64));
    iattr.extend([rows as i64, tp as i64, 0]);
    Ok(Some(
        UkCall::new("attention_f32")
            .iattr(iattr)
            .fattr([scale])
            .thread_scratch(scratch),
    ))
}

/// The f32 attention kernel's padded key count (a multiple of its tile width `cols`) and
/// per-thread scratch: the tag saying whose keys it holds (`AF_TAG_BYTES`), Kᵀ [Dk, Tp] and a
/// row block's scores [rows, Tp].
fn attention_tiles(t: usize, dk: usize, rows: usize, cols: usize) -> (usize, u64) {
    let tp = t.div_ceil(cols) * cols;
    (tp, (ATTN_TAG_BYTES + (dk + rows) * tp * 4) as u64)
}

/// The head of the attention kernels' thread scratch naming whose packed keys it holds
/// (`AF_TAG_BYTES` in attention_f32.c).
const ATTN_TAG_BYTES: usize = 64;

/// Switches an `attention_f32` call to its wide tiles (32 columns of 64-byte vectors, for
/// targets with 512-bit registers): twice the columns per instruction of the 16-column tiles,
/// which keep to 32-byte vectors so that they fit 16 registers.
pub(super) fn widen_attention(call: &mut UkCall) {
    // iattr as `kiln_uk_attention_f32` documents it: 5 T, 6 Dk, 14 rows, 15 Tp, 16 wide.
    let ia = &mut call.iattr;
    let (tp, scratch) = attention_tiles(ia[5] as usize, ia[6] as usize, ia[14] as usize, ATTN_WIDE_COLS);
    ia[15] = tp as i64;
    ia[16] = 1;
    call.thread_scratch_bytes = scratch;
}

/// Switches an `attention_f32` call to its bf16 tiles (`afb_task`: both products on
/// `vdpbf16ps`, 32 columns), for avx512_bf16 targets whose Q, K and V hold bf16 values.
pub(super) fn bf16_attention(call: &mut UkCall) {
    // iattr: 5 T, 6 Dk, 7 Dv, 14 rows, 15 Tp, 16 tiles.
    let ia = &mut call.iattr;
    let (t, dk, dv, rows) = (ia[5] as usize, ia[6] as usize, ia[7] as usize, ia[14] as usize);
    let tp = t.div_ceil(ATTN_WIDE_COLS) * ATTN_WIDE_COLS;
    let dk2 = dk.div_ceil(2);
    // The tag, then Kᵀ pairs, scores, V pairs, probability pairs, Q pairs: 4-byte words.
    let words = dk2 * tp + rows * tp + tp / 2 * dv + rows * tp / 2 + rows * dk2;
    ia[15] = tp as i64;
    ia[16] = 2;
    call.thread_scratch_bytes = (ATTN_TAG_BYTES + words * 4) as u64;
}

/// Columns of the f32 attention kernel's tiles (`AF_NC`) and wide tiles (`AF_NC_WIDE`).
const ATTN_COLS: usize = 16;
const ATTN_WIDE_COLS: usize = 32;

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{Graph, NodeId, TensorType};

    /// Lowers a one-node graph over inputs of the given f32 shapes.
    fn lower_one(op: Op, shapes: &[&[usize]]) -> UkCall {
        let mut g = Graph::new("t");
        let ins: Vec<_> = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| Some(g.add_input(format!("x{i}"), TensorType::fixed(DType::F32, s))))
            .collect();
        let y = g.add("n", op, ins, "y").unwrap();
        g.add_output("y", y);
        let info = NodeInfo::new(&g, NodeId(shapes.len() as u32));
        lower(&info).unwrap().unwrap()
    }

    #[test]
    fn same_upper_pool_pads_the_end() {
        let op = Op::Pool(PoolAttrs {
            kind: PoolKind::Max,
            kernel_shape: vec![2, 3],
            strides: vec![2, 2],
            pads: vec![],
            dilations: vec![],
            auto_pad: AutoPad::SameUpper,
            ceil_mode: false,
            storage_order: 0,
            channels_last: false,
        });
        let call = lower_one(op, &[&[1, 1, 5, 5]]);
        // 3 outputs per axis; padding 1 (kernel 2) and 2 (kernel 3), odd element at the end.
        assert_eq!(call.iattr, vec![0, 2, 0, 0, 2, 2, 1, 0, 1, 3, 2, 1, 1, 1]);
    }

    #[test]
    fn einsum_diagonal_adds_strides_and_broadcast_is_zero() {
        let call = lower_one(
            Op::Einsum {
                equation: "ii->i".into(),
            },
            &[&[3, 3]],
        );
        assert_eq!(call.iattr, vec![1, 1, 1, 3, 4]);
        let call = lower_one(
            Op::Einsum {
                equation: "ij,ij->i".into(),
            },
            &[&[2, 3], &[1, 3]],
        );
        // Labels i (output) then j; the second operand broadcasts i.
        assert_eq!(call.iattr, vec![2, 2, 1, 2, 3, 3, 1, 0, 1]);
    }

    #[test]
    fn matmul_broadcasts_batches_and_folds_a_shared_b() {
        let call = lower_one(Op::MatMul, &[&[2, 1, 3, 4], &[3, 4, 5]]);
        assert_eq!(call.iattr, vec![3, 4, 5, 2, 2, 3, 1, 0, 0, 1]);
        let call = lower_one(Op::MatMul, &[&[2, 3, 4], &[4]]);
        assert_eq!(call.iattr, vec![6, 4, 1, 0]);
    }
}
