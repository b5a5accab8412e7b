//! Which kernel generators handle each operator: codegen's column of the operator table
//! (`kiln_ir::Op::info` holds the rest).
//!
//! The planner asks only the generators listed for a node's operator, in the order listed; a
//! generator may still decline a node (its shape or dtypes), and a node no generator takes
//! runs as a call into the C kernel library (`uk`), on the CPU or, for `--target cuda`, on one
//! GPU block. Giving an operator a new kernel is its generator plus its entry here; `kiln
//! explain` shows which kernel each node got.

use crate::error::Result;
use crate::gen::{self, GeneratedKernel};
use crate::node::NodeInfo;
use crate::nvptx::{kernels, GpuKernel};
use crate::target::TargetDesc;
use kiln_ir::{MiscOp, Op, OpFamily, QuantOp, SignalOp, VisionOp};

/// A GPU kernel generator (`nvptx/kernels/`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuGenerator {
    /// Tiled products and convolutions (`gemm`).
    Gemm,
    /// Integer products and convolutions, a thread per output element (`integer`).
    Integer,
    /// DynamicQuantizeLinear, one block (`dynamic_quantize`).
    DynamicQuantize,
    /// RotaryEmbedding, a thread per element (`rotary`).
    Rotary,
    /// Fused attention on tensor cores, bf16-valued operands (`attention_mma`).
    AttentionMma,
    /// Fused attention, f32 (`attention`).
    Attention,
    /// Attention in the forms the f32 kernel declines: KV cache, softcap, windows, QK output,
    /// 16-bit and f64 operands; a thread per query row, in f64 (`attention_general`).
    AttentionGeneral,
    /// Strided copies (`copy`).
    Copy,
    /// ConvTranspose and 3-D Conv, a thread per output element (`window_conv`).
    WindowConv,
    /// Gathers by run-time indices or compile-time axis maps (`gather`).
    Gather,
    /// One block per row: softmax, normalizations, reductions (`rows`).
    Rows,
    /// Windowed pooling (`pool`).
    Pool,
    /// Resize by interpolation, linear and cubic (`resize`).
    Resize,
    /// LSTM, GRU and RNN, a persistent block per direction and batch row (`recurrent`).
    Recurrent,
    /// TopK, a block per row (`topk`).
    TopK,
    /// Element-wise groups (`elementwise`).
    Elementwise,
    /// ArgMax and ArgMin (`arg`).
    Arg,
    /// CumSum and CumProd (`cumulative`).
    Cumulative,
    /// NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss, one block (`loss`).
    Loss,
    /// Inference BatchNormalization, a thread per element (`batch_norm`).
    BatchNorm,
    /// GridSample and AffineGrid, a thread per output element (`sample`).
    Sample,
    /// DFT and STFT, a thread per output frequency (`spectral`).
    Spectral,
    /// EyeLike, OneHot and ReverseSequence, a thread per output element (`index_map`).
    IndexMap,
    /// MatMul of f64 tensors, a thread per output element (`matmul_f64`).
    MatMulF64,
    /// LRN, a thread per element (`lrn`).
    Lrn,
    /// RoiAlign, a thread per output bin (`roi_align`).
    RoiAlign,
    /// Det, a thread per matrix (`det`).
    Det,
    /// Einsum, a thread per output element (`einsum`).
    Einsum,
    /// MaxUnpool, one block (`unpool`).
    Unpool,
    /// NonZero and Compress, one block that compacts the selection (`select`).
    Select,
    /// NonMaxSuppression, one block in rounds (`nms`).
    Nms,
    /// Unique, one block that ranks the slices (`unique`).
    Unique,
    /// Col2Im, a thread per output element (`col2im`).
    Col2Im,
    /// DeformConv, a thread per output element (`deform_conv`).
    DeformConv,
}

/// A CPU kernel generator (`gen/`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuGenerator {
    /// GEMM, convolutions and their epilogues, integer products on `vpdpbusd`
    /// (`gen::products`), for a single node.
    Products,
    /// Vector loops over groups of element-wise nodes (`gen::elementwise`), formed by the
    /// `fuse-kernels` plan pass.
    ElementwiseLoop,
}

/// The generators of one operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Generators {
    pub gpu: &'static [GpuGenerator],
    pub cpu: &'static [CpuGenerator],
}

/// The generators that may handle `op`, in the order they are asked.
pub fn generators(op: &Op) -> Generators {
    use CpuGenerator as C;
    use GpuGenerator as G;
    let (gpu, cpu): (&'static [GpuGenerator], &'static [CpuGenerator]) = match op {
        Op::MatMul => (&[G::Gemm, G::MatMulF64], &[C::Products]),
        Op::Gemm { .. } => (&[G::Gemm], &[C::Products]),
        Op::Conv(_) => (&[G::Gemm, G::WindowConv], &[C::Products]),
        Op::Quant(QuantOp::MatMulInteger | QuantOp::ConvInteger(_)) => (&[G::Integer], &[C::Products]),
        Op::Quant(QuantOp::QLinearMatMul | QuantOp::QLinearConv(_)) => (&[G::Integer], &[]),
        Op::Quant(QuantOp::BlockQuantizedMatMul { .. }) => (&[], &[C::Products]),
        Op::Quant(QuantOp::DynamicQuantizeLinear) => (&[G::DynamicQuantize], &[]),
        Op::Misc(MiscOp::RotaryEmbedding { .. }) => (&[G::Rotary], &[]),
        Op::Misc(MiscOp::Loss { .. }) => (&[G::Loss], &[]),
        Op::BatchNorm { .. } => (&[G::BatchNorm], &[]),
        Op::Vision(VisionOp::GridSample { .. } | VisionOp::AffineGrid { .. }) => (&[G::Sample], &[]),
        Op::Signal(SignalOp::Dft { .. } | SignalOp::Stft { .. }) => (&[G::Spectral], &[]),
        Op::Vision(VisionOp::Lrn { .. }) => (&[G::Lrn], &[]),
        Op::Vision(VisionOp::RoiAlign { .. }) => (&[G::RoiAlign], &[]),
        Op::Misc(MiscOp::Det) => (&[G::Det], &[]),
        Op::Einsum { .. } => (&[G::Einsum], &[]),
        Op::Vision(VisionOp::MaxUnpool { .. }) => (&[G::Unpool], &[]),
        Op::Vision(VisionOp::NonMaxSuppression { .. }) => (&[G::Nms], &[]),
        // A gather by compile-time axis maps, as Pad.
        Op::Vision(VisionOp::CenterCropPad { .. }) => (&[G::Gather], &[]),
        Op::Vision(VisionOp::Col2Im { .. }) => (&[G::Col2Im], &[]),
        Op::Vision(VisionOp::DeformConv { .. }) => (&[G::DeformConv], &[]),
        Op::NonZero => (&[G::Select], &[]),
        Op::Misc(MiscOp::Unique { .. }) => (&[G::Unique], &[]),
        Op::Misc(MiscOp::Compress { .. }) => (&[G::Copy, G::Gather, G::Select], &[]),
        Op::EyeLike { .. } | Op::OneHot { .. } | Op::Misc(MiscOp::ReverseSequence { .. }) => {
            (&[G::IndexMap], &[])
        }
        Op::Misc(MiscOp::TensorScatter { .. }) => (&[G::Gather], &[]),
        Op::Quant(QuantOp::QuantizeLinear { .. } | QuantOp::DequantizeLinear { .. }) => {
            (&[G::Elementwise], &[C::ElementwiseLoop])
        }
        Op::Attention(_) => (&[G::AttentionMma, G::Attention, G::AttentionGeneral], &[]),
        Op::ConvTranspose(_) => (&[G::WindowConv], &[]),
        Op::Rnn(_) => (&[G::Recurrent], &[]),
        Op::TopK { .. } => (&[G::TopK], &[]),
        Op::ArgMax { .. } | Op::ArgMin { .. } => (&[G::Arg], &[]),
        Op::CumSum { .. } | Op::CumProd { .. } => (&[G::Cumulative], &[]),
        Op::Pool(_) => (&[G::Pool], &[]),
        // Nearest mode is a gather by axis maps; the interpolating modes have their own kernel.
        Op::Resize(_) => (&[G::Copy, G::Gather, G::Resize], &[]),
        Op::Softmax { .. }
        | Op::LogSoftmax { .. }
        | Op::Hardmax { .. }
        | Op::LpNorm { .. }
        | Op::LayerNorm { .. }
        | Op::InstanceNorm { .. }
        | Op::GroupNorm { .. }
        | Op::Misc(MiscOp::RmsNorm { .. })
        | Op::MeanVarianceNorm { .. }
        | Op::GlobalPool(_) => (&[G::Rows], &[]),
        // With noop_with_empty_axes and no axes, a reduction is a copy.
        Op::Reduce { .. } => (&[G::Rows, G::Copy], &[]),
        _ => match op.family() {
            OpFamily::DataMovement | OpFamily::Resize => (&[G::Copy, G::Gather], &[]),
            OpFamily::Elementwise => (&[G::Elementwise], &[C::ElementwiseLoop]),
            _ => (&[], &[]),
        },
    };
    Generators { gpu, cpu }
}

impl GpuGenerator {
    /// The generator's kernel for `node`, or None when it declines it.
    pub fn lower(self, node: &NodeInfo, target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
        match self {
            GpuGenerator::Gemm => kernels::gemm::lower(node, target),
            GpuGenerator::Integer => kernels::integer::lower(node, target),
            GpuGenerator::DynamicQuantize => kernels::dynamic_quantize::lower(node, target),
            GpuGenerator::Rotary => kernels::rotary::lower(node, target),
            GpuGenerator::AttentionMma => kernels::attention_mma::lower(node, target),
            GpuGenerator::Attention => kernels::attention::lower(node, target),
            GpuGenerator::AttentionGeneral => kernels::attention_general::lower(node, target),
            GpuGenerator::Copy => kernels::copy::lower(node, target),
            GpuGenerator::WindowConv => kernels::window_conv::lower(node, target),
            GpuGenerator::Gather => kernels::gather::lower(node, target),
            GpuGenerator::Rows => kernels::rows::lower(node, target),
            GpuGenerator::Pool => kernels::pool::lower(node, target),
            GpuGenerator::Resize => kernels::resize::lower(node, target),
            GpuGenerator::Recurrent => kernels::recurrent::lower(node, target),
            GpuGenerator::TopK => kernels::topk::lower(node, target),
            GpuGenerator::Elementwise => kernels::elementwise::lower(node, target),
            GpuGenerator::Arg => kernels::arg::lower(node, target),
            GpuGenerator::Cumulative => kernels::cumulative::lower(node, target),
            GpuGenerator::Loss => kernels::loss::lower(node, target),
            GpuGenerator::BatchNorm => kernels::batch_norm::lower(node, target),
            GpuGenerator::Sample => kernels::sample::lower(node, target),
            GpuGenerator::Spectral => kernels::spectral::lower(node, target),
            GpuGenerator::IndexMap => kernels::index_map::lower(node, target),
            GpuGenerator::MatMulF64 => kernels::matmul_f64::lower(node, target),
            GpuGenerator::Lrn => kernels::lrn::lower(node, target),
            GpuGenerator::RoiAlign => kernels::roi_align::lower(node, target),
            GpuGenerator::Det => kernels::det::lower(node, target),
            GpuGenerator::Einsum => kernels::einsum::lower(node, target),
            GpuGenerator::Unpool => kernels::unpool::lower(node, target),
            GpuGenerator::Select => kernels::select::lower(node, target),
            GpuGenerator::Nms => kernels::nms::lower(node, target),
            GpuGenerator::Unique => kernels::unique::lower(node, target),
            GpuGenerator::Col2Im => kernels::col2im::lower(node, target),
            GpuGenerator::DeformConv => kernels::deform_conv::lower(node, target),
        }
    }
}

/// A kernel a generator made for one node.
pub enum Generated {
    Gpu(Box<dyn GpuKernel>),
    Cpu(Box<dyn GeneratedKernel>),
}

/// The generated kernel for a single node: the GPU generators of its operator for a GPU
/// target, else the CPU ones; None when none of them takes it.
pub fn lower(node: &NodeInfo, target: &TargetDesc) -> Result<Option<Generated>> {
    let gens = generators(node.op());
    if target.is_gpu() {
        for g in gens.gpu {
            if let Some(k) = g.lower(node, target)? {
                return Ok(Some(Generated::Gpu(k)));
            }
        }
    }
    // CPU micro-kernels (explicit vector registers, a thread pool's tiles): never for the GPU.
    if !target.is_gpu() && gens.cpu.contains(&CpuGenerator::Products) {
        if let Some(k) = gen::products::lower(node, target)? {
            return Ok(Some(Generated::Cpu(k)));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{Binary, Unary};

    #[test]
    fn element_wise_operators_go_to_the_element_wise_generators() {
        for op in [
            Op::Unary(Unary::Relu),
            Op::Binary(Binary::Add),
            Op::Where,
            Op::Clip,
        ] {
            let g = generators(&op);
            assert_eq!(g.gpu, &[GpuGenerator::Elementwise], "{op:?}");
            assert_eq!(g.cpu, &[CpuGenerator::ElementwiseLoop], "{op:?}");
        }
    }

    #[test]
    fn products_have_both_generators_and_sources_none() {
        let g = generators(&Op::MatMul);
        assert_eq!(
            (g.gpu, g.cpu),
            (
                &[GpuGenerator::Gemm, GpuGenerator::MatMulF64][..],
                &[CpuGenerator::Products][..]
            )
        );
        let g = generators(&Op::Input);
        assert!(g.gpu.is_empty() && g.cpu.is_empty());
        assert_eq!(
            generators(&Op::Transpose { perm: vec![1, 0] }).gpu,
            &[GpuGenerator::Copy, GpuGenerator::Gather]
        );
    }
}
