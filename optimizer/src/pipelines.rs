//! Pipelines: which passes run, in which order, for each target.
//!
//! A pipeline is a plain function of the user's options. The order follows the design:
//! dequantize-weights or block-quantized-products → integer-products → lower-einsum → freeze → fake-quantize → channels-last → fuse → bf16 autocast → lower-control-flow; the
//! manager verifies after every pass.
//! Einsum is lowered to products, reductions and transposes before freezing, which then folds
//! the einsums of constants, and before fusion, which then sees the products (attention scores
//! written as `bhid,bhjd->bhij` included).
//! The integer convolutions are found before freezing, which would fold the weights'
//! DequantizeLinear into float weights.
//! Fake quantization runs after freezing (which folds the weights' DequantizeLinear) and before
//! the layout pass, which then carries the elementwise form of each activation's
//! QuantizeLinear/DequantizeLinear pair instead of transposing around it.
//! Fusion runs before the autocast so that the decomposed patterns it recognizes (attention,
//! LayerNorm, Softmax, GELU) are not cut apart by the autocast's casts: the autocast then
//! rounds the fused Attention's Q, K and V, not the pieces of a MatMul-Softmax-MatMul chain.
//! Control flow is lowered last: the other passes see an `If` or a `Loop` as one node and leave
//! its subgraphs alone, and codegen receives a graph without control flow.

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
    /// f32 graphs whose products run on a GPU's TF32 tensor cores (operands rounded to TF32,
    /// f32 accumulation): a codegen choice, so the passes are f32's.
    Tf32,
}

/// What the user asked the optimizer for, and what the target's kernels can do.
#[derive(Clone, Debug, Default)]
pub struct PipelineOptions {
    pub layout: Layout,
    pub precision: Precision,
    /// The target's matrix-product and convolution kernels round their run-time operands to
    /// bf16 themselves, as they pack them (CPUs with avx512_bf16, codegen's
    /// `TargetDesc::has_bf16_pair_kernels`: codegen absorbs the
    /// autocast's `Cast<f32>(Cast<bf16>(x))` pairs). Then the autocast leaves data movement
    /// between a value and its product in f32, so that the pair sits right at the product and
    /// disappears; otherwise it moves the narrowing Cast above the movement, which then moves
    /// half the bytes (see `Bf16Autocast::hoist_movement`).
    pub products_round_operands: bool,
    /// The target computes u8×s8 products in hardware (codegen's
    /// `TargetDesc::has_int8_dot_kernels`): a QDQ model's convolutions then run on their
    /// integers (`integer-products`). Elsewhere they stay float, where the f32 kernels (Winograd
    /// included) are faster than an integer product without those instructions.
    pub integer_products: bool,
    /// The target's product kernels do not read block-quantized weights (codegen's
    /// `TargetNeeds::dequantize_weights`: GPU targets; the CPU GEMM reads them as nibbles):
    /// `dequantize-weights` makes every BlockQuantizedMatMul a float product first.
    pub dequantize_weights: bool,
}

/// Every pass a pipeline may run, in pipeline order (for `--disable-pass`/`--print-after`
/// validation: a pass the options leave out is still a valid name).
pub const PASS_NAMES: &[&str] = &[
    passes::dequantize_weights::NAME,
    passes::block_quantized_products::NAME,
    passes::integer_products::NAME,
    passes::lower_einsum::NAME,
    "freeze",
    passes::fake_quantize::NAME,
    "channels-last",
    FUSE_PASS,
    "bf16-autocast",
    passes::lower_control_flow::NAME,
];

/// The graph pass that recognizes decomposed patterns (LayerNorm, Softmax, GELU, attention).
/// Kernel grouping is codegen's `fuse-kernels` plan pass, switched on its own.
pub const FUSE_PASS: &str = "fuse";

/// The CPU pipeline: dequantize-weights (targets without block-quantized products: GPUs) or
/// block-quantized-products (the others) → integer-products (targets with integer products) →
/// lower-einsum → freeze → fake-quantize → channels-last (NHWC only) → fuse → bf16 autocast
/// (bf16 only) → lower-control-flow.
pub fn cpu(opts: &PipelineOptions) -> PassManager {
    let mut pm = PassManager::new();
    if opts.dequantize_weights {
        pm = pm.with(passes::dequantize_weights::DequantizeWeights);
    } else {
        pm = pm.with(passes::block_quantized_products::BlockQuantizedProducts);
    }
    if opts.integer_products {
        pm = pm.with(passes::integer_products::IntegerProducts);
    }
    let mut pm = pm
        .with(passes::lower_einsum::LowerEinsum)
        .with(passes::freeze::Freeze)
        .with(passes::fake_quantize::FakeQuantize);
    if opts.layout == Layout::Nhwc {
        pm = pm.with(passes::channels_last::ChannelsLast {
            integer_conv: opts.integer_products,
        });
    }
    pm = pm.with(passes::fuse::Fuse);
    if opts.precision == Precision::Bf16 {
        pm = pm.with(passes::bf16_autocast::Bf16Autocast {
            hoist_movement: !opts.products_round_operands,
        });
    }
    pm.with(passes::lower_control_flow::LowerControlFlow)
}
