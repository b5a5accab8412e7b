//! Pipelines: which passes run, in which order, for each target.
//!
//! A pipeline is a plain function of the user's options. The order follows the design:
//! freeze → channels-last → bf16 autocast → fuse; the manager verifies after every pass.

use crate::{passes, PassManager};

/// The activation layout convolutions and their neighbours run in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// The model's own layout (NCHW for ONNX).
    Nchw,
    /// Channels-last: Conv, pooling and their elementwise neighbours run in NHWC. The CPU
    /// default: measured faster than NCHW on ResNet-50, MobileNetV2 and EfficientNet-B0 (x86
    /// AVX2, 1 and 2 threads; see docs/design.md).
    #[default]
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
    if opts.layout == Layout::Nhwc {
        pm = pm.with(passes::channels_last::ChannelsLast);
    }
    pm
}
