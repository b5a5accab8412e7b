//! Integer products on `vpdpbusd` (AVX-512 VNNI): MatMulInteger with a run-time u8 A and
//! constant s8 weights, the product onnxruntime's dynamic quantization writes (A quantized at
//! run time by DynamicQuantizeLinear).
//!
//! The K axis runs in *quads*: `vpdpbusd` multiplies four u8 of A by four s8 of B and adds the
//! four products to an i32 lane, so B is packed at compile time as `[panel][K/4][NR]` 32-bit
//! words holding rows `4q..4q+3` of one column (zero past K), and A's rows are read in place,
//! four bytes at a time, broadcast to every lane. Accumulation is exact in i32 (a quad adds at
//! most 4 × 255 × 128 = 130560; K up to 16384 cannot overflow).
//!
//! Zero points: `Σ (a - za)(b - zb)` with constant zero weights' zero point (the symmetric s8
//! weights quantizers write) is `Σ a·b - za · Σ_k b[k, j]`; the column sums are packed at
//! compile time and the epilogue subtracts `za` (a scalar input, constant or computed at run
//! time) times them. Products with a non-zero weight zero point, an s8 A, or K not a multiple
//! of 4 stay with the kernel library.

use super::blocking::plan_blocks;
use super::pack::block_major_panels;
use super::{GemmKernel, Int8, Operand, Tile};
use crate::error::Result;
use crate::gen::GeneratedKernel;
use crate::kernel::epilogue::Activation;
use crate::kernel::PackedConst;
use crate::node::NodeInfo;
use crate::target::TargetDesc;
use kiln_ir::{DType, Layout};

/// The GEMM kernel for a MatMulInteger node (inputs A, B, a_zero_point?, b_zero_point?), or
/// None when the target has no `vpdpbusd` or the node is not one it computes (see the module
/// docs).
pub(crate) fn lower_matmul_integer(
    node: &NodeInfo,
    target: &TargetDesc,
) -> Result<Option<Box<dyn GeneratedKernel>>> {
    if !target.has_int8_dot_kernels() {
        return Ok(None);
    }
    let tile = Tile::for_target(target);
    if tile.lanes != 16 {
        return Ok(None);
    }
    let row_major_static = |i: usize, dtype: DType| {
        node.input_type(i)
            .is_some_and(|t| t.dtype == dtype && t.layout == Layout::RowMajor && t.is_static())
    };
    let out = node.output_type(0);
    if !row_major_static(0, DType::U8)
        || !row_major_static(1, DType::I8)
        || out.dtype != DType::I32
        || out.layout != Layout::RowMajor
        || !out.is_static()
    {
        return Ok(None);
    }
    let Some(b) = node.known(1) else {
        return Ok(None);
    };
    // A per-tensor A zero point; the weights' zero point, if any, all zeros.
    if node.has_input(2) && node.input_shape(2)?.iter().product::<usize>() != 1 {
        return Ok(None);
    }
    if node.has_input(3) {
        match node.known(3) {
            Some(z) if z.to_i64_vec().iter().all(|&v| v == 0) => {}
            _ => return Ok(None),
        }
    }
    let (sa, sb) = (node.input_shape(0)?, node.input_shape(1)?);
    // B is one matrix shared by every row of A: A's leading axes fold into M.
    let (Some(&k), [kb, n]) = (sa.last(), sb.as_slice()) else {
        return Ok(None);
    };
    let (kb, n) = (*kb, *n);
    // N in whole vectors: every column panel then has an exact tile, and no tile reads rows
    // of A (in place, not padded) past M through the full-tile copy path.
    if sa.len() < 2 || k != kb || k == 0 || n == 0 || k % 4 != 0 || k > 16384 || n % 16 != 0 {
        return Ok(None);
    }
    let m: usize = sa[..sa.len() - 1].iter().product();
    if m == 0 || m * k >= 1 << 31 || m * n >= 1 << 31 {
        return Ok(None);
    }
    let Some(weights) = b.as_slice::<i8>() else {
        return Ok(None);
    };
    let nr = tile.nr();
    let quads = k / 4;
    let (kc, mb, nb) = plan_blocks(&tile, m, n, quads, 1, false);
    let mut panels = quad_panels(weights, k, n, nr);
    if kc < quads {
        panels = block_major_panels(&panels, quads, nr, kc, n.div_ceil(nr));
    }
    let mut packed = vec![panels];
    let a_zero = node.has_input(2).then_some(2);
    let colsum = a_zero.map(|_| {
        packed.push(column_sums(weights, k, n, nr));
        1
    });
    let what = format!(
        "matmul-integer {}x{nr} {:?} vpdpbusd M={m} N={n} K={k} KC={} MB={mb} NB={nb}",
        tile.mr,
        target.isa,
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
        batch: vec![],
        a: Operand::Strided {
            input: 0,
            rs: quads,
            cs: 1,
        },
        b: Operand::Packed { slot: 0 },
        out: 0,
        scale: 1.0,
        bias_row: None,
        bias_col: colsum,
        residual: None,
        activation: Activation::None,
        round_bf16: false,
        packed,
        n_inputs: node.n_inputs(),
        unread,
        kc,
        mb,
        nb,
        bf16_pairs: false,
        k_elems: k,
        a_scale: None,
        int8: Some(Int8 { a_zero }),
    })))
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

/// `Σ_k b[k, j]` per column as i32, padded with NR zeros so that a tile's vector loads past N
/// stay inside.
fn column_sums(b: &[i8], k: usize, n: usize, nr: usize) -> PackedConst {
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
        let s = column_sums(&b, 8, 3, 2);
        let col0: i32 = (0..8).map(|r| i32::from(b[r * 3])).sum();
        assert_eq!(&s.bytes[..4], &col0.to_le_bytes());
        assert_eq!(s.bytes.len(), 5 * 4);
    }
}
