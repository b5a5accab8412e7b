//! Block-quantized weights (BlockQuantizedMatMul: onnxruntime's MatMulNBits of 2 or 4 bits)
//! stored as nibbles and dequantized as the GEMM packs B.
//!
//! At compile time the weights `Q [N, K]` are laid out per column panel of NR = 2 × lanes
//! columns: `[panel][k][lanes]` bytes, byte `j` holding column `j` of the panel in its low
//! nibble and column `lanes + j` in its high one, so one vector load of `lanes` bytes gives
//! both vectors of a panel row (`and 15`, `shift 4`). After the nibbles (rounded up to a
//! cache line) come the dequantization parameters in rows of the padded N per block of K:
//! every block's scales (f32), then every block's zero points (one byte each). Columns past N
//! hold zero weights with zero scales. Per weight that is half a byte and, with blocks of 32,
//! 0.16 bytes of parameters (f32 weights: 4 bytes).
//!
//! At run time B is a run-time operand of the f32 kernel: each task unpacks its panels of a K
//! block into the per-thread B scratch as `(q - zp) · scale` (the value DequantizeLinear
//! computes, so the result is the float product's up to the order of its additions), and the
//! f32 register tiles multiply them. The weights take a sixth of their f32 bytes in the
//! artifact and in memory traffic; the unpacking costs a few vector instructions per panel row,
//! shared by every row tile of the task.

use super::nibble_gemv::NibbleGemv;
use super::{Builder, Operand, Tile};
use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::{llvm, GeneratedKernel};
use crate::kernel::epilogue::Epilogue;
use crate::kernel::PackedConst;
use crate::node::NodeInfo;
use crate::target::TargetDesc;
use inkwell::values::{IntValue, PointerValue};
use kiln_ir::{DType, Layout};

/// Byte offset of the parameters after the nibbles of a `k`-deep B with `n_padded` columns.
pub(super) fn params_offset(k: usize, n_padded: usize) -> usize {
    (k * n_padded / 2).next_multiple_of(64)
}

/// The kernel of a BlockQuantizedMatMul (inputs A f32 `[..., K]`, constant Q u8 `[N, K]`,
/// scales f32 and zero points u8 `[N, ceil(K / block)]`), A's leading axes folded into M: the
/// matrix-vector kernel (`nibble_gemv`) for a few rows, else the GEMM on unpacked panels. None
/// when an input is not one this kernel reads (run-time weights, a value past 4 bits).
pub(crate) fn lower_block_quantized(
    node: &NodeInfo,
    target: &TargetDesc,
    tile: Tile,
    epi: Epilogue,
    block: usize,
) -> Result<Option<Box<dyn GeneratedKernel>>> {
    if tile.nv != 2 {
        return Ok(None);
    }
    let a_ok = node
        .input_type(0)
        .is_some_and(|t| t.dtype == DType::F32 && t.layout == Layout::RowMajor && t.is_static());
    let out_ok = {
        let t = node.output_type(0);
        t.dtype == DType::F32 && t.layout == Layout::RowMajor && t.is_static()
    };
    let (Some(q), Some(scales), Some(zeros)) = (node.known(1), node.known(2), node.known(3)) else {
        return Ok(None);
    };
    let (Some(q), Some(scales), Some(zeros)) = (
        q.as_slice::<u8>(),
        scales.as_slice::<f32>(),
        zeros.as_slice::<u8>(),
    ) else {
        return Ok(None);
    };
    if !a_ok || !out_ok || block == 0 {
        return Ok(None);
    }
    let sa = node.input_shape(0)?;
    let sq = node.input_shape(1)?;
    let (Some(&k), [n, kq]) = (sa.last(), sq.as_slice()) else {
        return Ok(None);
    };
    let n = *n;
    let blocks = k.div_ceil(block);
    if *kq != k || scales.len() != n * blocks || zeros.len() != n * blocks {
        return Ok(None);
    }
    if q.iter().chain(zeros).any(|&v| v > 15) {
        return Ok(None);
    }
    let m: usize = sa[..sa.len() - 1].iter().product();
    let weights = pack(q, scales, zeros, n, k, block, tile);
    // A residual read as rows of N (the GEMM refuses any other with a message).
    let residual_rows = match &epi.residual {
        Some(crate::kernel::epilogue::Residual::Input(i)) => {
            let rs = node.input_shape(*i)?;
            rs.iter().product::<usize>() == m * n && rs.last() == Some(&n)
        }
        _ => true,
    };
    if residual_rows && NibbleGemv::accepts(m, n, &epi) {
        let params_at = params_offset(k, n.div_ceil(tile.nr()) * tile.nr());
        let gemv = NibbleGemv::new(
            tile,
            (m, n, k, block),
            (weights, params_at),
            node.n_inputs(),
            &epi,
        );
        return Ok(Some(Box::new(gemv)));
    }
    let b = Builder {
        m,
        n,
        k,
        batch: vec![],
        a: Operand::Strided {
            input: 0,
            rs: k,
            cs: 1,
        },
        b: Operand::Nibbles { slot: 0, block },
        packed: vec![weights],
        unread: vec![1, 2, 3],
        what: "matmul-4bit".into(),
        scalable_rows: None,
    };
    b.finish(node, target, tile, epi)
}

/// The packed B of the module docs.
fn pack(q: &[u8], scales: &[f32], zeros: &[u8], n: usize, k: usize, block: usize, tile: Tile) -> PackedConst {
    let lanes = tile.lanes as usize;
    let nr = tile.nr();
    let n_padded = n.div_ceil(nr) * nr;
    let blocks = k.div_ceil(block);
    let at = params_offset(k, n_padded);
    let mut bytes = vec![0u8; at + blocks * n_padded * 5];
    let q_at = |col: usize, kk: usize| if col < n { q[col * k + kk] } else { 0 };
    for panel in 0..n_padded / nr {
        for kk in 0..k {
            let row = (panel * k + kk) * lanes;
            for j in 0..lanes {
                let col = panel * nr + j;
                bytes[row + j] = q_at(col, kk) | (q_at(col + lanes, kk) << 4);
            }
        }
    }
    let params = &mut bytes[at..];
    for col in 0..n {
        for bk in 0..blocks {
            let si = (bk * n_padded + col) * 4;
            params[si..si + 4].copy_from_slice(&scales[col * blocks + bk].to_le_bytes());
            params[blocks * n_padded * 4 + bk * n_padded + col] = zeros[col * blocks + bk];
        }
    }
    PackedConst { bytes }
}

impl super::GemmKernel {
    /// Unpacks rows `[k0, k0 + kc)` of the column panel starting at `col` from packed nibbles
    /// `src` into the f32 panel `dst` (`dst[x * NR + j]`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn unpack_nibble_panel<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        dst: PointerValue<'ctx>,
        src: PointerValue<'ctx>,
        col: IntValue<'ctx>,
        k0: IntValue<'ctx>,
        kc: IntValue<'ctx>,
        block: usize,
    ) -> Result<()> {
        let lanes = self.tile.lanes;
        let nr = self.tile.nr() as i64;
        let (k, n_padded) = (self.k as i64, self.n_padded() as i64);
        let blocks = self.k.div_ceil(block) as i64;
        let params = e.gep_u8(src, e.i64c(params_offset(self.k, self.n_padded()) as i64))?;
        let zero_points = e.gep_u8(params, e.i64c(blocks * n_padded * 4))?;
        // The panel's first row of nibbles: panel `col / NR`, `lanes` bytes per row.
        let panel_rows = e.gep_u8(src, e.mulc(e.udivc(col, nr)?, k * lanes as i64)?)?;
        let low = e.splat_i32(e.i32c(15), lanes)?;
        let shift = e.splat_i32(e.i32c(4), lanes)?;
        // Block by block, its parameters loaded once: the rows of `[k0, k0 + kc)` in block `bk`.
        let k_end = e.add(k0, kc)?;
        let first_block = e.udivc(k0, block as i64)?;
        let end_block = e.addc(e.udivc(e.addc(k_end, -1)?, block as i64)?, 1)?;
        e.for_range(first_block, end_block, 1, |bk| {
            let block_start = e.mulc(bk, block as i64)?;
            let lo =
                e.b.build_select(
                    e.icmp(inkwell::IntPredicate::UGT, block_start, k0)?,
                    block_start,
                    k0,
                    "",
                )
                .map_err(llvm)?
                .into_int_value();
            let hi = e.umin(e.addc(block_start, block as i64)?, k_end)?;
            let param_row = e.add(e.mulc(bk, n_padded)?, col)?;
            let mut params_of = vec![];
            for h in 0..2 {
                let at = e.addc(param_row, (h * lanes as usize) as i64)?;
                let scale = e.load_vec(e.gep_f32(params, at)?, lanes)?;
                let zero = e.load_u8s_as_i32s(e.gep_u8(zero_points, at)?, lanes)?;
                params_of.push((scale, zero));
            }
            e.for_range(lo, hi, 1, |kk| {
                let wide = e.load_u8s_as_i32s(e.gep_u8(panel_rows, e.mulc(kk, lanes as i64)?)?, lanes)?;
                let halves = [
                    e.b.build_and(wide, low, "").map_err(llvm)?,
                    e.b.build_right_shift(wide, shift, false, "").map_err(llvm)?,
                ];
                let row = e.mulc(e.sub(kk, k0)?, nr)?;
                for (h, (q, &(scale, zero))) in halves.into_iter().zip(&params_of).enumerate() {
                    // q - zp is exact in i32, and so is its conversion: DequantizeLinear's value.
                    let centred = e.b.build_int_sub(q, zero, "").map_err(llvm)?;
                    let qf =
                        e.b.build_signed_int_to_float(centred, e.vty(lanes), "")
                            .map_err(llvm)?;
                    let w = e.fmul(qf, scale)?;
                    e.store(e.gep_f32(dst, e.addc(row, (h * lanes as usize) as i64)?)?, w)?;
                }
                Ok(())
            })
        })
    }
}
