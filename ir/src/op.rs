//! The operator set.
//!
//! `Op` is a closed enum: adding an operator is a compile error everywhere it must be handled
//! (type inference, evaluation, printing, later the backends). Semantics follow the newest ONNX
//! opset; the frontend rewrites older forms (attributes that became inputs, changed defaults)
//! into this one form. Inputs are positional and may be absent (`None`) where ONNX allows an
//! optional input; each variant documents its inputs and outputs.

pub use crate::ops::binary::Binary;
pub use crate::ops::misc::{LossReduction, MiscOp};
pub use crate::ops::quant::QuantOp;
pub use crate::ops::signal::SignalOp;
pub use crate::ops::unary::{Unary, UnaryAttrs, UnaryKernelCall};
pub use crate::ops::vision::{GridMode, GridPadding, RoiPoolMode, VisionOp};
use crate::{ConstId, DType, Graph, Tensor};

impl Binary {
    /// Comparisons produce bool whatever their input type.
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            Binary::Equal | Binary::Less | Binary::LessOrEqual | Binary::Greater | Binary::GreaterOrEqual
        )
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub enum AutoPad {
    /// Explicit `pads` are used.
    #[default]
    NotSet,
    SameUpper,
    SameLower,
    Valid,
}

/// Convolution attributes. Spatial attribute vectors are empty when the model left them unset
/// (`kernel_shape` from the weight, strides/dilations 1, pads 0).
#[derive(Clone, PartialEq, Eq, Hash, Debug, Default)]
pub struct ConvAttrs {
    pub kernel_shape: Vec<usize>,
    pub strides: Vec<usize>,
    /// `[x1_begin, x2_begin, ..., x1_end, x2_end, ...]`, ONNX order.
    pub pads: Vec<usize>,
    pub dilations: Vec<usize>,
    pub group: usize,
    pub auto_pad: AutoPad,
    /// X and Y are `[N, spatial..., C]` (channels-last) instead of `[N, C, spatial...]`; W and
    /// B keep the ONNX layout (codegen re-lays weights out when it packs them).
    pub channels_last: bool,
}

#[derive(Clone, PartialEq, Eq, Hash, Debug, Default)]
pub struct ConvTransposeAttrs {
    pub conv: ConvAttrs,
    pub output_padding: Vec<usize>,
    /// If set, pads are computed from it (ONNX `output_shape`, spatial dims only).
    pub output_shape: Vec<usize>,
}

#[derive(Clone, Copy, PartialEq, Debug)]
pub enum PoolKind {
    Max,
    Average { count_include_pad: bool },
    Lp { p: f32 },
}

#[derive(Clone, PartialEq, Debug)]
pub struct PoolAttrs {
    pub kind: PoolKind,
    pub kernel_shape: Vec<usize>,
    pub strides: Vec<usize>,
    pub pads: Vec<usize>,
    pub dilations: Vec<usize>,
    pub auto_pad: AutoPad,
    pub ceil_mode: bool,
    /// MaxPool's optional `Indices` output: column-major (1) or row-major (0) flattening.
    pub storage_order: u8,
    /// X and Y are `[N, spatial..., C]` (channels-last) instead of `[N, C, spatial...]`.
    /// Indices (MaxPool's second output) still number elements of the NCHW input.
    pub channels_last: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum ReduceKind {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    L1,
    L2,
    LogSum,
    LogSumExp,
    SumSquare,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum ScatterReduction {
    None,
    Add,
    Mul,
    Max,
    Min,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum PadMode {
    Constant,
    Reflect,
    Edge,
    Wrap,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum ResizeMode {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum CoordTransform {
    HalfPixel,
    HalfPixelSymmetric,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
    TfCropAndResize,
    /// `(x + 0.5) / scale` (opsets 11-12 only).
    TfHalfPixelForNn,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum NearestMode {
    RoundPreferFloor,
    RoundPreferCeil,
    Floor,
    Ceil,
    /// Resize-10 and Upsample (no `nearest_mode` attribute): floor along axes that are
    /// enlarged, ceil along axes that are shrunk (onnxruntime's behaviour).
    Simple,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum AspectRatioPolicy {
    Stretch,
    NotLarger,
    NotSmaller,
}

#[derive(Clone, PartialEq, Debug)]
pub struct ResizeAttrs {
    pub mode: ResizeMode,
    pub coord: CoordTransform,
    pub nearest_mode: NearestMode,
    pub cubic_coeff_a: f32,
    pub exclude_outside: bool,
    pub extrapolation_value: f32,
    pub antialias: bool,
    /// Axes the `scales`/`sizes`/`roi` inputs refer to; empty = all axes.
    pub axes: Vec<i64>,
    pub keep_aspect_ratio_policy: AspectRatioPolicy,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum RnnKind {
    Rnn,
    Gru,
    Lstm,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum RnnDirection {
    Forward,
    Reverse,
    Bidirectional,
}

#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Activation {
    Relu,
    Tanh,
    Sigmoid,
    Affine { alpha: f32, beta: f32 },
    LeakyRelu { alpha: f32 },
    ThresholdedRelu { alpha: f32 },
    ScaledTanh { alpha: f32, beta: f32 },
    HardSigmoid { alpha: f32, beta: f32 },
    Elu { alpha: f32 },
    Softsign,
    Softplus,
}

#[derive(Clone, PartialEq, Debug)]
pub struct RnnAttrs {
    pub kind: RnnKind,
    pub direction: RnnDirection,
    pub hidden_size: usize,
    /// Resolved activation list (defaults filled in): per direction, 1 for RNN, 2 for GRU
    /// (f, g), 3 for LSTM (f, g, h).
    pub activations: Vec<Activation>,
    pub clip: Option<f32>,
    /// LSTM only.
    pub input_forget: bool,
    /// GRU only.
    pub linear_before_reset: bool,
    /// 0: `[seq, batch, ...]`; 1: `[batch, seq, ...]`.
    pub layout: u8,
}

/// `Default` is ONNX's attribute defaults: non-causal, 4-D inputs, the default scale, no
/// softcap or window.
#[derive(Clone, PartialEq, Debug)]
pub struct AttentionAttrs {
    pub is_causal: bool,
    /// Heads for 3-D inputs (0 when inputs are 4-D).
    pub q_num_heads: usize,
    pub kv_num_heads: usize,
    /// Mode of the optional `qk_matmul_output` output.
    pub qk_matmul_output_mode: i64,
    /// Defaults to `1/sqrt(head_size)` when absent.
    pub scale: Option<f32>,
    pub softcap: f32,
    pub softmax_precision: Option<DType>,
    /// Sliding window (opset 25): keys more than this many positions before (after) the
    /// query's absolute position are masked; -1 = unbounded.
    pub left_window_size: i64,
    pub right_window_size: i64,
}

impl Default for AttentionAttrs {
    fn default() -> AttentionAttrs {
        AttentionAttrs {
            is_causal: false,
            q_num_heads: 0,
            kv_num_heads: 0,
            qk_matmul_output_mode: 0,
            scale: None,
            softcap: 0.0,
            softmax_precision: None,
            left_window_size: -1,
            right_window_size: -1,
        }
    }
}

/// One operation in the graph.
#[derive(Clone, PartialEq, Debug)]
pub enum Op {
    /// A graph input. No inputs; one output whose type is given when the node is created.
    Input,
    /// A tensor from the graph's constant pool. No inputs; one output.
    Constant(ConstId),
    /// Inputs: x. Outputs: y.
    Unary(Unary),
    /// Inputs: a, b. Outputs: c (bool for comparisons).
    Binary(Binary),
    /// Inputs: condition (bool), x, y, broadcast together.
    Where,
    /// Inputs: x, min?, max? (scalars). Missing bounds are unbounded.
    Clip,
    /// Inputs: x. Converts to `to`; `saturate` applies to float8 only (kept for fidelity).
    Cast {
        to: DType,
    },
    /// Inputs: a, b. numpy `matmul` semantics (1-D promotion, batch broadcasting).
    MatMul,
    /// Inputs: A, B, C?. `alpha * op(A) @ op(B) + beta * C`.
    Gemm {
        alpha: f32,
        beta: f32,
        trans_a: bool,
        trans_b: bool,
    },
    /// Inputs: operands... . Output per `equation`.
    Einsum {
        equation: String,
    },
    /// Inputs: X [N,C,spatial...], W [M,C/group,k...], B? [M].
    Conv(ConvAttrs),
    /// Inputs: X [N,C,spatial...], W [C,M/group,k...], B? [M*?]. (ONNX ConvTranspose.)
    ConvTranspose(ConvTransposeAttrs),
    /// Inference-mode BatchNormalization. Inputs: X, scale, B, mean, var. Outputs: Y.
    BatchNorm {
        epsilon: f32,
    },
    /// Inputs: X, scale, B?. Outputs: Y, Mean?, InvStdDev?.
    LayerNorm {
        axis: i64,
        epsilon: f32,
        stash_type: DType,
    },
    /// Inputs: X, scale [C], B [C].
    InstanceNorm {
        epsilon: f32,
    },
    /// Inputs: X, scale, bias. `per_channel_affine` (opset ≥ 21): scale/bias are [C];
    /// otherwise (opset 18) [num_groups].
    GroupNorm {
        num_groups: usize,
        epsilon: f32,
        stash_type: DType,
        per_channel_affine: bool,
    },
    /// Inputs: X. `x / ||x||_p` along `axis`.
    LpNorm {
        axis: i64,
        p: u8,
    },
    /// Inputs: X. `(x - mean) / (sqrt(var) + 1e-9)` over `axes` (the ONNX function body adds
    /// the epsilon to the standard deviation).
    MeanVarianceNorm {
        axes: Vec<i64>,
    },
    /// Inputs: X. Outputs: Y, Indices? (MaxPool only, i64).
    Pool(PoolAttrs),
    /// Inputs: X [N,C,spatial...]. Output [N,C,1,1...].
    GlobalPool(PoolKind),
    /// Inputs: x. `coerce_2d`: opset < 13 semantics (flatten to 2-D at `axis`, normalize rows).
    Softmax {
        axis: i64,
        coerce_2d: bool,
    },
    LogSoftmax {
        axis: i64,
        coerce_2d: bool,
    },
    Hardmax {
        axis: i64,
        coerce_2d: bool,
    },
    /// Inputs: data, axes? (i64 1-D). Axes absent or empty: all axes, unless
    /// `noop_with_empty_axes` (then identity).
    Reduce {
        kind: ReduceKind,
        keepdims: bool,
        noop_with_empty_axes: bool,
    },
    /// Inputs: data. Output i64.
    ArgMax {
        axis: i64,
        keepdims: bool,
        select_last_index: bool,
    },
    ArgMin {
        axis: i64,
        keepdims: bool,
        select_last_index: bool,
    },
    /// Inputs: X, K (i64 [1]). Outputs: Values, Indices (i64).
    TopK {
        axis: i64,
        largest: bool,
        sorted: bool,
    },
    /// Inputs: x, axis (scalar int).
    CumSum {
        exclusive: bool,
        reverse: bool,
    },
    /// Inputs: x, axis (scalar int). Running products (opset 26).
    CumProd {
        exclusive: bool,
        reverse: bool,
    },
    /// Inputs: data, shape (i64).
    Reshape {
        allow_zero: bool,
    },
    /// Inputs: x. Output 2-D.
    Flatten {
        axis: i64,
    },
    /// Inputs: x. `perm` resolved (default: reversed axes).
    Transpose {
        perm: Vec<usize>,
    },
    /// Inputs: data, axes? (i64). No axes: every dimension of extent 1.
    Squeeze,
    /// Inputs: data, axes (i64).
    Unsqueeze,
    /// Inputs: tensors... .
    Concat {
        axis: i64,
    },
    /// Inputs: input, split? (i64). Output count = the node's outputs; `num_outputs` (opset 18)
    /// allows an uneven last chunk.
    Split {
        axis: i64,
        num_outputs: Option<usize>,
    },
    /// Inputs: data, starts, ends, axes?, steps? (all i32/i64 1-D).
    Slice,
    /// Inputs: data, indices (i32/i64, negative wrap).
    Gather {
        axis: i64,
    },
    GatherElements {
        axis: i64,
    },
    GatherND {
        batch_dims: usize,
    },
    /// Inputs: data, indices, updates.
    ScatterND {
        reduction: ScatterReduction,
    },
    ScatterElements {
        axis: i64,
        reduction: ScatterReduction,
    },
    /// Inputs: input, shape (i64). Bidirectional broadcast.
    Expand,
    /// Inputs: input, repeats (i64).
    Tile,
    /// Inputs: data, pads (i64 `[begins..., ends...]`, may be negative), constant_value?, axes?.
    Pad {
        mode: PadMode,
    },
    /// Inputs: X, roi?, scales? (f32), sizes? (i64). Exactly one of scales/sizes is present.
    Resize(ResizeAttrs),
    /// Inputs: data. Output i64 1-D: the shape, sliced by `start`/`end` (ONNX clamping).
    Shape {
        start: i64,
        end: Option<i64>,
    },
    /// Inputs: data. Output i64 scalar.
    Size,
    /// Inputs: start, limit, delta (scalars of one type).
    Range,
    /// Inputs: shape (i64 1-D). Output filled with `value` (a one-element tensor).
    ConstantOfShape {
        value: Tensor,
    },
    /// Inputs: x.
    Identity,
    DepthToSpace {
        block_size: usize,
        crd: bool,
    },
    /// `crd`: column-row-depth block order (opset 28 `mode="CRD"`); else depth-column-row.
    SpaceToDepth {
        block_size: usize,
        crd: bool,
    },
    /// Inputs: input, k? (scalar i64).
    Trilu {
        upper: bool,
    },
    /// Inputs: X. Output i64 [rank, nnz].
    NonZero,
    /// Inputs: indices, depth (scalar), values ([off, on]). Output type of values.
    OneHot {
        axis: i64,
    },
    /// Inputs: input (2-D). Output of `dtype` (input's type when None).
    EyeLike {
        dtype: Option<DType>,
        k: i64,
    },
    /// Inputs: X, W, R, B?, sequence_lens?, initial_h?, (LSTM: initial_c?, P?).
    /// Outputs: Y, Y_h, (LSTM: Y_c).
    Rnn(RnnAttrs),
    /// Inputs: cond (bool scalar), captured values... . The branches take the captured values
    /// as their inputs, in order; both produce the node's outputs.
    If {
        then_branch: Box<Graph>,
        else_branch: Box<Graph>,
    },
    /// Inputs: M? (i64 trip count), cond? (bool), loop-carried initial values..., captured
    /// values... . `body` inputs: iteration (i64 scalar), cond, carried..., captured... ; body
    /// outputs: cond, carried..., scan outputs... . Node outputs: final carried..., stacked
    /// scan outputs... .
    Loop {
        body: Box<Graph>,
        num_carried: usize,
    },
    /// ONNX opset-23 Attention. Inputs: Q, K, V, attn_mask?, past_key?, past_value?
    /// (nonpad_kv_seqlen? from opset 24). Outputs: Y, present_key?, present_value?,
    /// qk_matmul_output?.
    Attention(AttentionAttrs),
    /// Quantized and integer-arithmetic operators (`ops/quant.rs`).
    Quant(QuantOp),
    /// Detection and vision operators (`ops/vision.rs`).
    Vision(VisionOp),
    /// Signal processing: DFT, STFT, windows, mel filters (`ops/signal.rs`).
    Signal(SignalOp),
    /// RMSNormalization, Compress, ReverseSequence, Unique, RotaryEmbedding, TensorScatter,
    /// Det and the losses (`ops/misc.rs`).
    Misc(MiscOp),
}

impl Op {
    /// Subgraphs held by control-flow operators.
    pub fn subgraphs(&self) -> Vec<&Graph> {
        match self {
            Op::If {
                then_branch,
                else_branch,
            } => vec![then_branch, else_branch],
            Op::Loop { body, .. } => vec![body],
            _ => vec![],
        }
    }
}

impl ReduceKind {
    pub fn op_name(self) -> &'static str {
        match self {
            ReduceKind::Sum => "ReduceSum",
            ReduceKind::Mean => "ReduceMean",
            ReduceKind::Max => "ReduceMax",
            ReduceKind::Min => "ReduceMin",
            ReduceKind::Prod => "ReduceProd",
            ReduceKind::L1 => "ReduceL1",
            ReduceKind::L2 => "ReduceL2",
            ReduceKind::LogSum => "ReduceLogSum",
            ReduceKind::LogSumExp => "ReduceLogSumExp",
            ReduceKind::SumSquare => "ReduceSumSquare",
        }
    }
}
