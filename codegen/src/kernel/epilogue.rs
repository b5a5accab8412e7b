//! What a product kernel does to its result before it stores it: scale, bias, residual,
//! activation (and the fusion-only extras). Built by the fusion pass (`fuse`) or from a node's
//! own bias, and read by both the CPU GEMM/convolution kernels (`gen`) and the GPU ones
//! (`nvptx::kernels::gemm`).

/// An activation applied to the output tile in registers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    None,
    Relu,
    Clip {
        min: f32,
        max: f32,
    },
    Sigmoid,
    /// `x * sigmoid(x)`.
    Silu,
    /// ONNX HardSwish: `x * clamp(x/6 + 1/2, 0, 1)`.
    HardSwish,
    /// `0.5·x·(1 + erf(x/√2))`.
    GeluErf,
    /// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
    GeluTanh,
    /// `Clip(Round(x / scale), lo, hi) · scale`: a quantize-dequantize pair in float (the
    /// optimizer's `fake-quantize` form), a Relu before it folded into `lo`.
    FakeQuant {
        scale: f32,
        lo: f32,
        hi: f32,
    },
}

/// A bias added to every output element of a row (output channel) or of a column.
#[derive(Clone, Debug, PartialEq)]
pub enum Bias {
    None,
    /// One value per row of the product (per output channel of a convolution).
    PerRow(Vec<f32>),
    /// One value per column of the product.
    PerCol(Vec<f32>),
}

/// A tensor with the output's shape added before the activation.
#[derive(Clone, Debug, PartialEq)]
pub enum Residual {
    /// Input `i` of the (fused) node, with exactly the output's shape and layout.
    Input(usize),
    /// A constant `[M, N]` matrix, the same for every batch entry.
    Const(Vec<f32>),
    /// Input `input`, with the output's shape, added *after* the activation: the skip
    /// connection of a quantized residual block, `Q(fake_quant(conv) + DQ(x))`, where the
    /// activation is the convolution's `FakeQuant`. With `dequantize` the input holds u8,
    /// read as `(q - zero_point) · scale` (its DequantizeLinear, fused); else f32. Only the
    /// integer GEMM kernel takes it (`fuse::find_chains` builds it after integer anchors).
    Skip {
        input: usize,
        dequantize: Option<Quantize>,
    },
}

/// What happens to an output tile after the product, before it is stored:
/// `y = act(scale * acc + bias + residual)` (or `act(scale * acc + bias) + residual` for a
/// `Residual::Skip`).
#[derive(Clone, Debug, PartialEq)]
pub struct Epilogue {
    pub scale: f32,
    pub bias: Bias,
    pub residual: Option<Residual>,
    pub activation: Activation,
    /// Also write the per-channel mean of the result (a fused GlobalAveragePool) as a second
    /// output; only the depthwise kernel does.
    pub pool_mean: bool,
    /// Round the result to bf16 values (to nearest even) as the last step: the autocast's
    /// `Cast<f32>(Cast<bf16>(y))` of a result that has no other use. Only the GEMM kernels
    /// do (`fuse::find_chains` asks for it on their anchors only).
    pub round_bf16: bool,
    /// A per-channel scale of the input fused in front of the product (squeeze-excitation's
    /// `x * s` before a pointwise convolution): the input slot of `s`, `[N, 1, 1, C]` for an
    /// input `[N, H, W, C]`. A is scaled as it is packed, so the scaled input is never
    /// stored. Only channels-last pointwise f32 convolutions take it; others decline.
    pub input_scale: Option<usize>,
    /// The product is an integer one (`vpdpbusd`, i32 accumulators) whose result is converted
    /// to f32 and multiplied by this scale per output channel before everything above (the
    /// `Cast<f32>` and the scale `Mul` after a ConvInteger, from `integer-products`). Without it
    /// an integer product stores its i32 sums.
    pub dequantize: Option<Vec<f32>>,
    /// Quantize the result to u8 as the last step and store bytes (a QuantizeLinear after the
    /// chain, the only use of its result: the next integer convolution's input). Only the
    /// integer GEMM kernel does (`fuse::find_chains` asks for it after integer anchors).
    pub quantize: Option<Quantize>,
}

/// A per-tensor QuantizeLinear to u8: `clamp(roundeven(x / scale) + zero_point, 0, 255)` (or
/// the parameters of the DequantizeLinear that reads such bytes back, `Residual::Skip`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Quantize {
    pub scale: f32,
    pub zero_point: u8,
}

impl Default for Epilogue {
    fn default() -> Self {
        Epilogue {
            scale: 1.0,
            bias: Bias::None,
            residual: None,
            activation: Activation::None,
            pool_mean: false,
            round_bf16: false,
            input_scale: None,
            dequantize: None,
            quantize: None,
        }
    }
}

impl Epilogue {
    /// Whether the epilogue is the same for every row of the product whatever batch entry it
    /// belongs to, so a product's batch axes may become rows (`Product::with_batch_in_rows`):
    /// not with a bias per row or a constant residual matrix repeated per entry.
    pub fn allows_batch_folding(&self) -> bool {
        !matches!(self.bias, Bias::PerRow(_)) && !matches!(self.residual, Some(Residual::Const(_)))
    }

    /// The epilogue a fusion pass builds: bias (per output channel / row), optional residual
    /// input of the fused node, optional activation.
    pub fn new(bias: Bias, residual: Option<Residual>, activation: Activation) -> Epilogue {
        Epilogue {
            scale: 1.0,
            bias,
            residual,
            activation,
            pool_mean: false,
            round_bf16: false,
            input_scale: None,
            dequantize: None,
            quantize: None,
        }
    }
}
