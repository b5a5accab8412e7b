//! Integer products on dot-product instructions: `vpdpbusd` (AVX-512 VNNI), or `sdot` on
//! aarch64 (`IntDot`). MatMulInteger with a run-time u8 A and constant s8 weights (the product
//! onnxruntime's dynamic quantization writes, A quantized at run time by DynamicQuantizeLinear)
//! and channels-last ConvInteger; with `integer-products` both also compute a QDQ model's
//! matrix products and convolutions, A of a convolution being the u8 im2col matrix packed at
//! run time.
//!
//! The K axis runs in *quads*: `vpdpbusd` multiplies four u8 of A by four s8 of B and adds the
//! four products to an i32 lane, so B is packed at compile time as `[panel][K/4][NR]` 32-bit
//! words holding rows `4q..4q+3` of one column (zero past K), and A's rows are read in place,
//! four bytes at a time, broadcast to every lane. Accumulation is exact in i32: a product is at
//! most 255 × 128 in magnitude, so K up to `kiln_ir::ops::MAX_EXACT_INTEGER_K` (65536) cannot
//! overflow, the zero-point correction included.
//!
//! Zero points: `Σ (a - za)(b - zb)` with constant zero weights' zero point (the symmetric s8
//! weights quantizers write) is `Σ a·b - za · Σ_k b[k, j]`; the column sums are packed at
//! compile time and the epilogue subtracts `za` (a scalar input, constant or computed at run
//! time) times them. Products with a non-zero weight zero point, an s8 A, or (MatMulInteger,
//! whose A is read in place) K not a multiple of 4 stay with the kernel library.
//!
//! Column constants: the packed slot `bias_col` names holds rows of `N + NR` values, those
//! present in this order: the column sums (i32, with an A zero point or `sdot`), the
//! dequantizing scales (f32, with `Epilogue::dequantize`) and the bias (f32). A dequantized
//! product then runs the f32 epilogue (residual, activation, bf16 rounding) and stores f32, or
//! u8 with `Epilogue::quantize`; otherwise it stores its i32 sums.

use super::blocking::plan_blocks;
use super::pack::block_major_panels;
use super::{BatchDim, GemmKernel, Int8, IntDot, Operand, Tile};
use crate::error::Result;
use crate::gen::GeneratedKernel;
use crate::kernel::epilogue::{Activation, Bias, Epilogue, Residual};
use crate::kernel::geometry::ConvShape;
use crate::kernel::PackedConst;
use crate::node::NodeInfo;
use crate::target::{Arch, TargetDesc};
use kiln_ir::ops::MAX_EXACT_INTEGER_K;
use kiln_ir::{ConvAttrs, DType, Layout};

/// The GEMM kernel for a MatMulInteger node (inputs A, B, a_zero_point?, b_zero_point?) with
/// epilogue `epi`, or None when the target has no `vpdpbusd` or the node is not one it
/// computes (see the module docs). A's rows are read in place.
pub(crate) fn lower_matmul_integer(
    node: &NodeInfo,
    target: &TargetDesc,
    epi: Epilogue,
) -> Result<Option<Box<dyn GeneratedKernel>>> {
    if !integer_kernel_applies(node, target, &epi)? {
        return Ok(None);
    }
    let row_major_static = |i: usize, dtype: DType| {
        node.input_type(i)
            .is_some_and(|t| t.dtype == dtype && t.layout == Layout::RowMajor && t.is_static())
    };
    if !row_major_static(0, DType::U8) || !row_major_static(1, DType::I8) {
        return Ok(None);
    }
    let Some(b) = node.known(1) else {
        return Ok(None);
    };
    let (sa, sb) = (node.input_shape(0)?, node.input_shape(1)?);
    // B is one matrix shared by every row of A: A's leading axes fold into M.
    let (Some(&k), [kb, n]) = (sa.last(), sb.as_slice()) else {
        return Ok(None);
    };
    let (kb, n) = (*kb, *n);
    // Whole quads per row: A's rows are read in place, four bytes at a time.
    if sa.len() < 2 || k != kb || k == 0 || n == 0 || k % 4 != 0 || k > MAX_EXACT_INTEGER_K {
        return Ok(None);
    }
    let m: usize = sa[..sa.len() - 1].iter().product();
    if m == 0 || m * k >= 1 << 31 || m * n >= 1 << 31 {
        return Ok(None);
    }
    let Some(weights) = b.as_slice::<i8>() else {
        return Ok(None);
    };
    let quads = k / 4;
    let product = Product {
        m,
        n,
        k,
        weights,
        a: Operand::Strided {
            input: 0,
            rs: quads,
            cs: 1,
        },
        batch: vec![],
        what: "matmul-integer".into(),
    };
    assemble(node, target, epi, product)
}

/// The GEMM kernel for a channels-last ConvInteger (inputs x `[N, H, W, C]` u8, w `[M, C, KH,
/// KW]` constant s8, x_zero_point?, w_zero_point?) with epilogue `epi`: M = output pixels, N =
/// output channels, K = KH·KW·C (padded to whole quads). A 1×1 stride-1 convolution over a
/// whole number of quads reads x's rows in place; others pack u8 im2col rows at run time,
/// padding taps with x's zero point (an integer zero). None when the target has no `vpdpbusd`
/// or the node is not one this kernel computes.
pub(crate) fn lower_conv_integer(
    node: &NodeInfo,
    target: &TargetDesc,
    epi: Epilogue,
    attrs: &ConvAttrs,
) -> Result<Option<Box<dyn GeneratedKernel>>> {
    if !attrs.channels_last {
        return Ok(None);
    }
    if !integer_kernel_applies(node, target, &epi)? {
        return Ok(None);
    }
    let x_ok = node
        .input_type(0)
        .is_some_and(|t| t.dtype == DType::U8 && t.layout == Layout::RowMajor && t.is_static());
    let Some(w) = node.known(1) else {
        return Ok(None);
    };
    let Some(weights) = w.as_slice::<i8>() else {
        return Ok(None);
    };
    if !x_ok {
        return Ok(None);
    }
    let Some(s) = ConvShape::of(node, attrs)? else {
        return Ok(None);
    };
    let (nb, h, wd, c) = (s.batch, s.h, s.w, s.c);
    let (m, kh, kw) = (s.m, s.kh, s.kw);
    if s.groups != 1 || s.cg != c || s.y_channels != m || s.y_batch != nb {
        return Ok(None);
    }
    let Some(geo) = s.window(attrs, c) else {
        return Err(node.unsupported("convolution window does not match the output shape"));
    };
    let taps = kh * kw;
    let k = taps * c;
    let quads = k.div_ceil(4);
    let (oh, ow) = (s.oh, s.ow);
    if k == 0
        || m == 0
        || oh * ow == 0
        || k > MAX_EXACT_INTEGER_K
        || nb * h * wd * c >= 1 << 31
        || nb * oh * ow * m >= 1 << 31
    {
        return Ok(None);
    }
    let pointwise =
        kh == 1 && kw == 1 && (geo.sh, geo.sw, geo.ph, geo.pw) == (1, 1, 0, 0) && (oh, ow) == (h, wd);
    // W `[M, C, KH, KW]` as B `[K padded to quads, M]`, k = (tap, channel) as im2col's rows.
    let mut wt = vec![0i8; quads * 4 * m];
    for mo in 0..m {
        for ci in 0..c {
            for t in 0..taps {
                wt[(t * c + ci) * m + mo] = weights[(mo * c + ci) * taps + t];
            }
        }
    }
    let (a, batch, rows) = if pointwise && c % 4 == 0 {
        let a = Operand::Strided {
            input: 0,
            rs: quads,
            cs: 1,
        };
        (a, vec![], nb * oh * ow)
    } else {
        // A's batch stride counts bytes (u8).
        let batch = vec![BatchDim {
            extent: nb,
            a: h * wd * c,
            b: 0,
            c: oh * ow * m,
            bias_row: 0,
        }];
        (Operand::Im2colNhwc { input: 0, g: geo }, batch, oh * ow)
    };
    let product = Product {
        m: rows,
        n: m,
        k,
        weights: &wt,
        a,
        batch,
        what: format!("conv-integer{kh}x{kw}/{} nhwc", geo.sh),
    };
    assemble(node, target, epi, product)
}

/// Whether an integer product kernel computes the node on `target`: it has `vpdpbusd` (or
/// `sdot`), the node's zero points are ones the kernel applies (a per-tensor A zero point; the
/// weights', if any, all zeros) and `epi` is one it computes: the dequantizing epilogue and
/// what follows it (a bias per column, a residual, an activation, bf16 rounding or u8
/// quantization), or none.
fn integer_kernel_applies(node: &NodeInfo, target: &TargetDesc, epi: &Epilogue) -> Result<bool> {
    let tile = Tile::for_target(target);
    // 512-bit `vpdpbusd` or 128-bit `sdot` tiles.
    let lanes = match target.arch {
        Arch::Aarch64 => 4,
        _ => 16,
    };
    if !target.has_int8_dot_kernels() || tile.lanes != lanes {
        return Ok(false);
    }
    if epi.pool_mean
        || epi.input_scale.is_some()
        || epi.scale != 1.0
        || epi.round_bf16 && epi.quantize.is_some()
    {
        return Ok(false);
    }
    // Without dequantizing, the epilogue has nothing to apply to integer sums.
    let bare = epi.bias == Bias::None
        && epi.residual.is_none()
        && epi.activation == Activation::None
        && !epi.round_bf16
        && epi.quantize.is_none();
    if epi.dequantize.is_none() && !bare {
        return Ok(false);
    }
    let out = node.output_type(0);
    if out.layout != Layout::RowMajor || !out.is_static() || (bare && out.dtype != DType::I32) {
        return Ok(false);
    }
    if node.has_input(2) && node.input_shape(2)?.iter().product::<usize>() != 1 {
        return Ok(false);
    }
    if node.has_input(3) {
        match node.known(3) {
            Some(z) if z.to_i64_vec().iter().all(|&v| v == 0) => {}
            _ => return Ok(false),
        }
    }
    Ok(true)
}

/// An integer product as the two lowerings describe it.
struct Product<'w> {
    /// Rows per batch entry, columns, K in elements.
    m: usize,
    n: usize,
    k: usize,
    /// B `[K, N]` row-major (at least K rows; rows past K are zero).
    weights: &'w [i8],
    a: Operand,
    batch: Vec<BatchDim>,
    what: String,
}

/// The GEMM kernel for `p` with epilogue `epi` (checked by `integer_kernel_applies`): the
/// register tile for its shape, B packed as quad panels, the column constants (see the
/// module docs), the blocking.
fn assemble(
    node: &NodeInfo,
    target: &TargetDesc,
    epi: Epilogue,
    p: Product<'_>,
) -> Result<Option<Box<dyn GeneratedKernel>>> {
    let (m, n, k) = (p.m, p.n, p.k);
    let tile = Tile::for_product(target, m, n);
    let quads = k.div_ceil(4);
    let nr = tile.nr();
    if epi.quantize.is_some() && !stores_u8(n) {
        return Ok(None);
    }
    let batch_total: usize = p.batch.iter().map(|d| d.extent).product();
    let (mut kc, mb, nb) = plan_blocks(&tile, m, n, quads, batch_total, false);
    if epi.quantize.is_some() {
        // Bytes in C cannot hold the partial sums between K blocks: one block (B's panels
        // then stream from L2 on the deepest layers, 1152 quads × 32 columns).
        kc = quads;
    }
    let mut panels = quad_panels(p.weights, quads * 4, n, nr);
    if kc < quads {
        block_major_panels(&mut panels, quads, nr, kc, n.div_ceil(nr));
    }
    let a_zero = node.has_input(2).then_some(2);
    let dot = match target.arch {
        Arch::Aarch64 => IntDot::Sdot,
        _ => IntDot::Vpdpbusd,
    };
    let bias = match &epi.bias {
        Bias::None => None,
        Bias::PerCol(v) if v.len() == n => Some(v.as_slice()),
        Bias::PerCol(v) | Bias::PerRow(v) => {
            return Err(node.unsupported(format!("bias has {} values for {n} output columns", v.len())))
        }
    };
    let mut columns = vec![];
    if a_zero.is_some() || dot == IntDot::Sdot {
        columns.extend(column_sums(p.weights, k, quads * 4, n, nr).bytes);
    }
    let pad = |v: &[f32]| -> Vec<u8> {
        let mut v = v.to_vec();
        v.resize(n + nr, 0.0);
        PackedConst::from_f32s(&v).bytes
    };
    if let Some(d) = &epi.dequantize {
        if d.len() != n {
            return Err(node.unsupported(format!("{} scales for {n} output columns", d.len())));
        }
        columns.extend(pad(d));
    }
    if let Some(b) = bias {
        columns.extend(pad(b));
    }
    let mut packed = vec![panels];
    let bias_col = (!columns.is_empty()).then(|| {
        packed.push(PackedConst { bytes: columns });
        1
    });
    let same_shape = |i: usize| -> Result<bool> { Ok(node.input_shape(i)? == node.output_shape(0)?) };
    let (residual, skip) = match &epi.residual {
        None => (None, None),
        Some(Residual::Input(i)) if same_shape(*i)? => (Some(*i), None),
        // Bytes only where C holds bytes too: whole vectors, never the local tile's copy.
        Some(Residual::Skip { input, dequantize }) if same_shape(*input)? => {
            let dtype = node.input_type(*input).map(|t| t.dtype);
            let ok = match dequantize {
                Some(_) => dtype == Some(DType::U8) && epi.quantize.is_some(),
                None => dtype == Some(DType::F32),
            };
            if !ok {
                return Ok(None);
            }
            (Some(*input), Some(*dequantize))
        }
        Some(_) => return Ok(None),
    };
    let residual = residual.map(|input| Operand::Strided { input, rs: n, cs: 1 });
    let what = format!(
        "{} {}x{nr} {:?} {} M={m} N={n} K={k} batch={} KC={} MB={mb} NB={nb}",
        p.what,
        tile.mr,
        target.isa,
        match dot {
            IntDot::Vpdpbusd => "vpdpbusd",
            IntDot::Sdot => "sdot",
        },
        batch_total,
        kc * 4
    );
    let mut unread = vec![1];
    unread.extend(node.has_input(3).then_some(3));
    Ok(Some(Box::new(GemmKernel {
        what,
        isa: target.isa,
        tile,
        m,
        n,
        k: quads,
        batch: p.batch,
        a: p.a,
        b: Operand::Packed { slot: 0 },
        out: 0,
        scale: 1.0,
        bias_row: None,
        bias_col,
        residual,
        activation: epi.activation,
        round_bf16: epi.round_bf16,
        packed,
        n_inputs: node.n_inputs(),
        unread,
        kc,
        mb,
        nb,
        bf16_pairs: false,
        k_elems: k,
        a_scale: None,
        a_bf16: false,
        c_bf16: false,
        int8: Some(Int8 {
            dot,
            a_zero,
            dequantize: epi.dequantize.is_some(),
            bias: bias.is_some(),
            quantize: epi.quantize,
            skip,
        }),
    })))
}

/// Whether an integer product with N columns can store u8 (`Epilogue::quantize`): only whole
/// vectors, so that every column cut has an exact tile and C is never copied through the
/// 4-byte local tile.
pub(crate) fn stores_u8(n: usize) -> bool {
    n > 0 && n.is_multiple_of(16)
}

/// s8 B `[K, N]` (row-major) as quad panels `[panel][K/4][NR]`: the 32-bit word (q, j) holds
/// `b[4q + t, j]` in byte t; columns past N are zero.
fn quad_panels(b: &[i8], k: usize, n: usize, nr: usize) -> PackedConst {
    let quads = k / 4;
    let mut bytes = Vec::with_capacity(n.div_ceil(nr) * quads * nr * 4);
    for col0 in (0..n).step_by(nr) {
        for q in 0..quads {
            for j in col0..col0 + nr {
                for t in 0..4 {
                    bytes.push(if j < n { b[(4 * q + t) * n + j] as u8 } else { 0 });
                }
            }
        }
    }
    PackedConst { bytes }
}

/// `Σ_k b[k, j]` over the first `k` of `rows` rows per column as i32, padded with NR zeros so
/// that a tile's vector loads past N stay inside.
fn column_sums(b: &[i8], k: usize, rows: usize, n: usize, nr: usize) -> PackedConst {
    debug_assert_eq!(b.len(), rows * n);
    let sums = (0..n + nr).map(|j| {
        if j < n {
            (0..k).map(|kk| i32::from(b[kk * n + j])).sum()
        } else {
            0i32
        }
    });
    PackedConst {
        bytes: sums.flat_map(i32::to_le_bytes).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::{column_sums, quad_panels};

    #[test]
    fn quads_hold_four_rows_of_a_column() {
        // K = 8, N = 3, NR = 2: two panels, the second with a zero column.
        let b: Vec<i8> = (0..24).map(|v| v as i8 - 12).collect();
        let p = quad_panels(&b, 8, 3, 2);
        assert_eq!(p.bytes.len(), 2 * 2 * 2 * 4);
        // Panel 0, quad 1, column 1: rows 4..8 of column 1.
        let word = &p.bytes[(2 + 1) * 4..(2 + 2) * 4];
        let want: Vec<u8> = (4..8).map(|r| b[r * 3 + 1] as u8).collect();
        assert_eq!(word, want.as_slice());
        // Panel 1, column 3 (past N) is zero.
        assert!(p.bytes[16 + 4..16 + 8].iter().all(|&x| x == 0));
        let s = column_sums(&b, 8, 8, 3, 2);
        let col0: i32 = (0..8).map(|r| i32::from(b[r * 3])).sum();
        assert_eq!(&s.bytes[..4], &col0.to_le_bytes());
        assert_eq!(s.bytes.len(), 5 * 4);
    }
}
