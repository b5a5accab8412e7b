//! The generator of product nodes (MatMul, Gemm, Conv; MatMulInteger and ConvInteger on integer
//! dot products; BlockQuantizedMatMul on nibbles)
//! for the CPU: checks their types and hands each, with its epilogue, to the GEMM kernel or the
//! convolution dispatcher (`conv`).

use super::conv::lower_conv;
use super::gemm::{lower_gemm, lower_matmul, Tile};
use crate::error::Result;
use crate::gen::GeneratedKernel;
use crate::kernel::epilogue::{Activation, Bias, Epilogue};
use crate::node::NodeInfo;
use crate::target::TargetDesc;
use kiln_ir::{DType, Layout, Op, QuantOp};

pub fn lower(node: &NodeInfo, target: &TargetDesc) -> Result<Option<Box<dyn GeneratedKernel>>> {
    let epi = match node_bias(node)? {
        Some(e) => e,
        None => return Ok(None),
    };
    lower_fused(node, target, epi)
}

/// The epilogue `lower` uses: the node's own bias (conv B, Gemm C when constant); None when the
/// node is not one this generator handles.
fn node_bias(node: &NodeInfo) -> Result<Option<Epilogue>> {
    match node.op() {
        Op::Conv(_) => {
            if !node.has_input(2) {
                return Ok(Some(Epilogue::default()));
            }
            match node
                .known(2)
                .and_then(|t| t.cast(DType::F32).as_slice::<f32>().map(|s| s.to_vec()))
            {
                Some(b) => Ok(Some(Epilogue::new(Bias::PerRow(b), None, Activation::None))),
                None => Ok(None),
            }
        }
        // The integer products' own epilogue stores their i32 sums.
        Op::MatMul
        | Op::Gemm { .. }
        | Op::Quant(
            QuantOp::MatMulInteger | QuantOp::ConvInteger(_) | QuantOp::BlockQuantizedMatMul { .. },
        ) => Ok(Some(Epilogue::default())),
        _ => Ok(None),
    }
}

/// Lowers `node` with a given epilogue (the fusion pass supplies bias, residual, activation).
/// For Conv, `epi.bias` replaces the node's own bias input; for Gemm, C is handled here.
pub fn lower_fused(
    node: &NodeInfo,
    target: &TargetDesc,
    epi: Epilogue,
) -> Result<Option<Box<dyn GeneratedKernel>>> {
    if target.is_gpu() {
        return Ok(None);
    }
    match node.op() {
        Op::Quant(QuantOp::ConvInteger(a)) => return super::gemm::lower_conv_integer(node, target, epi, a),
        Op::Quant(QuantOp::MatMulInteger) => return super::gemm::lower_matmul_integer(node, target, epi),
        Op::Quant(QuantOp::BlockQuantizedMatMul { block_size, .. }) => {
            if epi.pool_mean {
                return Ok(None);
            }
            let tile = Tile::for_target(target);
            return super::gemm::lower_block_quantized(node, target, tile, epi, *block_size);
        }
        _ => {}
    }
    for i in 0..node.n_inputs() {
        if let Some(t) = node.input_type(i) {
            if t.dtype != DType::F32 || t.layout != Layout::RowMajor || !t.is_static() {
                return Ok(None);
            }
        }
    }
    let ot = node.output_type(0);
    if ot.dtype != DType::F32 || ot.layout != Layout::RowMajor || !ot.is_static() {
        return Ok(None);
    }
    if epi.pool_mean && !matches!(node.op(), Op::Conv(_)) {
        return Ok(None);
    }
    if epi.residual.is_some() && matches!(node.op(), Op::Gemm { .. }) {
        // Gemm's C takes the residual slot; a fused Gemm should be a MatMul.
        return Ok(None);
    }
    match node.op() {
        Op::MatMul => lower_matmul(node, target, epi),
        Op::Gemm {
            alpha,
            beta,
            trans_a,
            trans_b,
        } => lower_gemm(node, target, epi, *alpha, *beta, *trans_a, *trans_b),
        Op::Conv(a) => lower_conv(node, target, epi, a),
        _ => Ok(None),
    }
}
