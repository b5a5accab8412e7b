//! Pipelines: which passes run, in which order, for each target.
//!
//! A pipeline is a plain function of the user's options. The order follows the design:
//! freeze → channels-last → bf16 autocast → fuse; the manager verifies after every pass.

use crate::{passes, PassManager};

/// The activation layout convolutions and their neighbours run in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// The model's own layout (NCHW for ONNX).
    #[default]
    Nchw,
    /// Channels-last: Conv, pooling, Resize and normalizations run in NHWC.
    Nhwc,
}

/// The precision matmul-like operators compute in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    #[default]
    F32,
    /// BF16 inputs with f32 accumulation for MatMul/Conv/Gemm/attention (per-op policy).
    Bf16,
}

/// What the user asked the optimizer for.
#[derive(Clone, Debug, Default)]
pub struct PipelineOptions {
    pub layout: Layout,
    pub precision: Precision,
}

/// The CPU pipeline.
pub fn cpu(opts: &PipelineOptions) -> PassManager {
    let mut pm = PassManager::new().with(passes::fold_batchnorm::FoldBatchNorm);
    if opts.precision == Precision::Bf16 {
        pm = pm.with(passes::bf16_autocast::Bf16Autocast);
    }
    pm
}
