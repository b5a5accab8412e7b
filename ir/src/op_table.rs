//! The operator table: every fact that more than one part of kiln reads about an operator,
//! declared once per operator.
//!
//! [`Op::info`] is one row per IR operator: its name, the family module that infers and
//! evaluates it (and whose frontend importer reads it), what it does with its data
//! ([`Motion`]), what the bf16 autocast does with it ([`Autocast`]) and how it meets the
//! channels-last layout ([`LayoutRole`]). [`ONNX_OPERATORS`] lists every ONNX operator the
//! frontend imports, with its family and the opset that introduced it; element-wise unary
//! operators come from their own table (`ops/unary_table.rs`), which also holds their
//! attributes, types and math.
//!
//! The passes, the interpreter's dispatch and the frontend's dispatch read these answers
//! instead of matching on operators themselves: a new operator is one row here, one in the
//! ONNX list, and its family module's `infer`/`eval` (and importer).

use crate::{Binary, Op, PoolKind, QuantOp, RnnKind};

/// What an operator does with its data input's elements: the one answer the passes that
/// share, move or pass through data read (the memory plan aliases views, bf16 autocast hoists
/// casts above views and rearrangements, the channels-last pass carries a layout through
/// element-wise operators, fusion groups them).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Motion {
    /// The output is the input's bytes under another shape: it aliases the input, no kernel
    /// runs (Reshape, Flatten, Squeeze, Unsqueeze, Identity).
    View,
    /// Elements are rearranged or repeated, none is computed (Transpose, Expand).
    Rearrange,
    /// Each output element is a function of the corresponding (broadcast) input elements
    /// (unary and binary operators, Clip, Where, Cast).
    Elementwise,
    /// Everything else.
    Compute,
}

/// The family an operator belongs to: the module of `ops/` that infers and evaluates it, and
/// the frontend importer that builds it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum OpFamily {
    /// Graph inputs and constants.
    Source,
    /// Unary and binary functions, Where, Clip, Cast.
    Elementwise,
    /// MatMul, Gemm, Einsum.
    Linalg,
    /// Convolutions and pools.
    Conv,
    /// Normalizations and the softmax family.
    Norm,
    /// Resize and the depth/space rearrangements.
    Resize,
    Attention,
    /// Reductions, arg-extrema, TopK, cumulative sums and products.
    Reduce,
    /// Shape manipulation, gathers, scatters, padding (`ops/shape`).
    DataMovement,
    Recurrent,
    Control,
    Quant,
    Vision,
    Signal,
    Misc,
}

/// What `--precision bf16` does with an operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Autocast {
    /// The multiplicands listed are rounded to bf16; accumulation and output stay f32.
    /// Inputs not listed (Conv/Gemm bias, attention mask and caches) are added in f32.
    Always(&'static [usize]),
    /// Stays f32: numerically sensitive.
    Never,
    /// Keeps the dtype of its inputs (elementwise arithmetic, data movement).
    Follow,
}

/// [`Autocast::Always`] of every input of a variadic operator (Einsum).
pub const ALL_INPUTS: &[usize] = &[usize::MAX];

/// How an operator meets the channels-last layout (`optimizer`'s `channels-last` pass).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutRole {
    /// Has a channels-last form of its own (2-D Conv, pools): the layout starts here.
    Anchor,
    /// Element-wise: computes the same in any layout, so it carries the layout through.
    Carry,
    /// Concat: carries the layout when it joins along the channel axis.
    ChannelConcat,
    /// Reads its input in the model's layout.
    Model,
}

/// One row of the operator table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpInfo {
    /// The ONNX operator name, for histograms, messages and the text printer.
    pub name: &'static str,
    pub family: OpFamily,
    pub motion: Motion,
    pub autocast: Autocast,
    pub layout: LayoutRole,
}

/// Building a row: most operators compute, follow the autocast and read the model's layout.
impl OpInfo {
    const fn new(name: &'static str, family: OpFamily) -> OpInfo {
        OpInfo {
            name,
            family,
            motion: Motion::Compute,
            autocast: Autocast::Follow,
            layout: LayoutRole::Model,
        }
    }
    const fn motion(mut self, motion: Motion) -> OpInfo {
        self.motion = motion;
        self
    }
    const fn autocast(mut self, autocast: Autocast) -> OpInfo {
        self.autocast = autocast;
        self
    }
    const fn layout(mut self, layout: LayoutRole) -> OpInfo {
        self.layout = layout;
        self
    }
    /// An element-wise operator: its motion, and the layout it carries through.
    const fn elementwise(self) -> OpInfo {
        self.motion(Motion::Elementwise).layout(LayoutRole::Carry)
    }
}

impl Op {
    /// The operator's row of the table.
    pub fn info(&self) -> OpInfo {
        use Autocast::{Always, Never};
        use OpFamily as F;
        match self {
            Op::Input => OpInfo::new("Input", F::Source),
            Op::Constant(_) => OpInfo::new("Constant", F::Source),

            // Piecewise-linear functions and predicates are exact on bf16 inputs (the unary
            // table says which); anything with a transcendental or a division amplifies
            // rounding.
            Op::Unary(u) => {
                let row = OpInfo::new(u.name(), F::Elementwise).elementwise();
                if u.exact_in_bf16() {
                    row
                } else {
                    row.autocast(Never)
                }
            }
            Op::Binary(b) => {
                let row = OpInfo::new(b.name(), F::Elementwise).elementwise();
                match b {
                    Binary::Pow | Binary::Div => row.autocast(Never),
                    _ => row,
                }
            }
            Op::Where => OpInfo::new("Where", F::Elementwise).elementwise(),
            Op::Clip => OpInfo::new("Clip", F::Elementwise).elementwise(),
            Op::Cast { .. } => OpInfo::new("Cast", F::Elementwise).elementwise(),

            Op::MatMul => OpInfo::new("MatMul", F::Linalg).autocast(Always(&[0, 1])),
            Op::Gemm { .. } => OpInfo::new("Gemm", F::Linalg).autocast(Always(&[0, 1])),
            Op::Einsum { .. } => OpInfo::new("Einsum", F::Linalg).autocast(Always(ALL_INPUTS)),

            Op::Conv(_) => OpInfo::new("Conv", F::Conv)
                .autocast(Always(&[0, 1]))
                .layout(LayoutRole::Anchor),
            Op::ConvTranspose(_) => OpInfo::new("ConvTranspose", F::Conv).autocast(Always(&[0, 1])),
            // Max pooling selects an input element; averages stay f32.
            Op::Pool(p) => match p.kind {
                PoolKind::Max => OpInfo::new("MaxPool", F::Conv),
                PoolKind::Average { .. } => OpInfo::new("AveragePool", F::Conv).autocast(Never),
                PoolKind::Lp { .. } => OpInfo::new("LpPool", F::Conv).autocast(Never),
            }
            .layout(LayoutRole::Anchor),
            Op::GlobalPool(k) => OpInfo::new(
                match k {
                    PoolKind::Max => "GlobalMaxPool",
                    PoolKind::Average { .. } => "GlobalAveragePool",
                    PoolKind::Lp { .. } => "GlobalLpPool",
                },
                F::Conv,
            )
            .autocast(Never)
            .layout(LayoutRole::Anchor),

            Op::BatchNorm { .. } => OpInfo::new("BatchNormalization", F::Norm).autocast(Never),
            Op::LayerNorm { .. } => OpInfo::new("LayerNormalization", F::Norm).autocast(Never),
            Op::InstanceNorm { .. } => OpInfo::new("InstanceNormalization", F::Norm).autocast(Never),
            Op::GroupNorm { .. } => OpInfo::new("GroupNormalization", F::Norm).autocast(Never),
            Op::LpNorm { .. } => OpInfo::new("LpNormalization", F::Norm).autocast(Never),
            Op::MeanVarianceNorm { .. } => OpInfo::new("MeanVarianceNormalization", F::Norm).autocast(Never),
            Op::Softmax { .. } => OpInfo::new("Softmax", F::Norm).autocast(Never),
            Op::LogSoftmax { .. } => OpInfo::new("LogSoftmax", F::Norm).autocast(Never),
            Op::Hardmax { .. } => OpInfo::new("Hardmax", F::Norm),

            Op::Resize(_) => OpInfo::new("Resize", F::Resize),
            Op::DepthToSpace { .. } => OpInfo::new("DepthToSpace", F::Resize),
            Op::SpaceToDepth { .. } => OpInfo::new("SpaceToDepth", F::Resize),

            Op::Attention(_) => OpInfo::new("Attention", F::Attention).autocast(Always(&[0, 1, 2])),

            Op::Reduce { kind, .. } => OpInfo::new(kind.op_name(), F::Reduce).autocast(Never),
            Op::ArgMax { .. } => OpInfo::new("ArgMax", F::Reduce),
            Op::ArgMin { .. } => OpInfo::new("ArgMin", F::Reduce),
            Op::TopK { .. } => OpInfo::new("TopK", F::Reduce),
            Op::CumSum { .. } => OpInfo::new("CumSum", F::Reduce).autocast(Never),
            Op::CumProd { .. } => OpInfo::new("CumProd", F::Reduce).autocast(Never),

            Op::Reshape { .. } => OpInfo::new("Reshape", F::DataMovement).motion(Motion::View),
            Op::Flatten { .. } => OpInfo::new("Flatten", F::DataMovement).motion(Motion::View),
            Op::Squeeze => OpInfo::new("Squeeze", F::DataMovement).motion(Motion::View),
            Op::Unsqueeze => OpInfo::new("Unsqueeze", F::DataMovement).motion(Motion::View),
            Op::Identity => OpInfo::new("Identity", F::DataMovement).motion(Motion::View),
            Op::Transpose { .. } => OpInfo::new("Transpose", F::DataMovement).motion(Motion::Rearrange),
            Op::Expand => OpInfo::new("Expand", F::DataMovement).motion(Motion::Rearrange),
            Op::Concat { .. } => OpInfo::new("Concat", F::DataMovement).layout(LayoutRole::ChannelConcat),
            Op::Split { .. } => OpInfo::new("Split", F::DataMovement),
            Op::Slice => OpInfo::new("Slice", F::DataMovement),
            Op::Gather { .. } => OpInfo::new("Gather", F::DataMovement),
            Op::GatherElements { .. } => OpInfo::new("GatherElements", F::DataMovement),
            Op::GatherND { .. } => OpInfo::new("GatherND", F::DataMovement),
            Op::ScatterND { .. } => OpInfo::new("ScatterND", F::DataMovement),
            Op::ScatterElements { .. } => OpInfo::new("ScatterElements", F::DataMovement),
            Op::Tile => OpInfo::new("Tile", F::DataMovement),
            Op::Pad { .. } => OpInfo::new("Pad", F::DataMovement),
            Op::Shape { .. } => OpInfo::new("Shape", F::DataMovement),
            Op::Size => OpInfo::new("Size", F::DataMovement),
            Op::Range => OpInfo::new("Range", F::DataMovement),
            Op::ConstantOfShape { .. } => OpInfo::new("ConstantOfShape", F::DataMovement),
            Op::Trilu { .. } => OpInfo::new("Trilu", F::DataMovement),
            Op::NonZero => OpInfo::new("NonZero", F::DataMovement),
            Op::OneHot { .. } => OpInfo::new("OneHot", F::DataMovement),
            Op::EyeLike { .. } => OpInfo::new("EyeLike", F::DataMovement),

            Op::Rnn(a) => OpInfo::new(
                match a.kind {
                    RnnKind::Rnn => "RNN",
                    RnnKind::Gru => "GRU",
                    RnnKind::Lstm => "LSTM",
                },
                F::Recurrent,
            )
            .autocast(Never),
            Op::If { .. } => OpInfo::new("If", F::Control).autocast(Never),
            Op::Loop { .. } => OpInfo::new("Loop", F::Control).autocast(Never),

            // A 2-D integer convolution has the float one's channels-last form. Quantizing and
            // dequantizing are element-wise where their parameters are per tensor (the pass
            // checks; per-axis ones name an axis of the model's layout).
            Op::Quant(q @ QuantOp::ConvInteger(_)) => {
                OpInfo::new(q.name(), F::Quant).layout(LayoutRole::Anchor)
            }
            Op::Quant(q @ (QuantOp::QuantizeLinear { .. } | QuantOp::DequantizeLinear { .. })) => {
                OpInfo::new(q.name(), F::Quant).layout(LayoutRole::Carry)
            }
            // Its weights are integers the kernel dequantizes; A stays f32 (the bf16 pair
            // kernels read float weights).
            Op::Quant(q @ QuantOp::BlockQuantizedMatMul { .. }) => {
                OpInfo::new(q.name(), F::Quant).autocast(Never)
            }
            Op::Quant(q) => OpInfo::new(q.name(), F::Quant),
            Op::Vision(v) => OpInfo::new(v.name(), F::Vision),
            Op::Signal(s) => OpInfo::new(s.name(), F::Signal),
            Op::Misc(m) => OpInfo::new(m.name(), F::Misc),
        }
    }

    /// The operator's name for histograms, messages and the text printer.
    pub fn name(&self) -> &'static str {
        self.info().name
    }

    pub fn family(&self) -> OpFamily {
        self.info().family
    }

    pub fn motion(&self) -> Motion {
        self.info().motion
    }

    /// The output aliases the input's bytes ([`Motion::View`]).
    pub fn is_view(&self) -> bool {
        self.motion() == Motion::View
    }

    /// What the bf16 autocast does with the operator (before the pass's own graph-dependent
    /// exceptions, such as depthwise convolutions).
    pub fn autocast(&self) -> Autocast {
        self.info().autocast
    }

    pub fn layout_role(&self) -> LayoutRole {
        self.info().layout
    }
}

/// An ONNX operator of the default domain that kiln imports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OnnxOperator {
    pub name: &'static str,
    /// The family whose importer builds it (usually the family of the IR operator it becomes;
    /// operators imported as compositions, such as Dropout or CastLike, are listed with the
    /// importer that composes them).
    pub family: OpFamily,
    /// The first default-domain opset that defines it.
    pub since: i64,
}

/// Every default-domain ONNX operator kiln imports, except the element-wise unary operators
/// (`ops/unary_table.rs`), with its family and the opset that introduced it.
pub const ONNX_OPERATORS: &[OnnxOperator] = {
    use OpFamily as F;
    const fn op(name: &'static str, family: OpFamily, since: i64) -> OnnxOperator {
        OnnxOperator { name, family, since }
    }
    &[
        op("Add", F::Elementwise, 1),
        op("Sub", F::Elementwise, 1),
        op("Mul", F::Elementwise, 1),
        op("Div", F::Elementwise, 1),
        op("Pow", F::Elementwise, 1),
        op("Mod", F::Elementwise, 10),
        op("Min", F::Elementwise, 1),
        op("Max", F::Elementwise, 1),
        op("Sum", F::Elementwise, 1),
        op("Mean", F::Elementwise, 1),
        op("Equal", F::Elementwise, 1),
        op("Less", F::Elementwise, 1),
        op("LessOrEqual", F::Elementwise, 12),
        op("Greater", F::Elementwise, 1),
        op("GreaterOrEqual", F::Elementwise, 12),
        op("And", F::Elementwise, 1),
        op("Or", F::Elementwise, 1),
        op("Xor", F::Elementwise, 1),
        op("BitShift", F::Elementwise, 11),
        op("BitwiseAnd", F::Elementwise, 18),
        op("BitwiseOr", F::Elementwise, 18),
        op("BitwiseXor", F::Elementwise, 18),
        op("PRelu", F::Elementwise, 1),
        op("Where", F::Elementwise, 9),
        op("Clip", F::Elementwise, 1),
        op("Cast", F::Elementwise, 1),
        op("CastLike", F::Elementwise, 15),
        op("MatMul", F::Linalg, 1),
        op("Gemm", F::Linalg, 1),
        op("Einsum", F::Linalg, 12),
        op("Conv", F::Conv, 1),
        op("ConvTranspose", F::Conv, 1),
        op("MaxPool", F::Conv, 1),
        op("AveragePool", F::Conv, 1),
        op("LpPool", F::Conv, 1),
        op("GlobalAveragePool", F::Conv, 1),
        op("GlobalMaxPool", F::Conv, 1),
        op("GlobalLpPool", F::Conv, 1),
        op("BatchNormalization", F::Norm, 1),
        op("LayerNormalization", F::Norm, 17),
        op("InstanceNormalization", F::Norm, 1),
        op("GroupNormalization", F::Norm, 18),
        op("LpNormalization", F::Norm, 1),
        op("MeanVarianceNormalization", F::Norm, 9),
        op("Softmax", F::Norm, 1),
        op("LogSoftmax", F::Norm, 1),
        op("Hardmax", F::Norm, 1),
        op("Resize", F::Resize, 10),
        op("Upsample", F::Resize, 1),
        op("DepthToSpace", F::Resize, 1),
        op("SpaceToDepth", F::Resize, 1),
        op("Attention", F::Attention, 23),
        op("ReduceSum", F::Reduce, 1),
        op("ReduceMean", F::Reduce, 1),
        op("ReduceMax", F::Reduce, 1),
        op("ReduceMin", F::Reduce, 1),
        op("ReduceProd", F::Reduce, 1),
        op("ReduceL1", F::Reduce, 1),
        op("ReduceL2", F::Reduce, 1),
        op("ReduceLogSum", F::Reduce, 1),
        op("ReduceLogSumExp", F::Reduce, 1),
        op("ReduceSumSquare", F::Reduce, 1),
        op("ArgMax", F::Reduce, 1),
        op("ArgMin", F::Reduce, 1),
        op("TopK", F::Reduce, 1),
        op("CumSum", F::Reduce, 11),
        op("CumProd", F::Reduce, 26),
        op("Reshape", F::DataMovement, 1),
        op("Flatten", F::DataMovement, 1),
        op("Transpose", F::DataMovement, 1),
        op("Squeeze", F::DataMovement, 1),
        op("Unsqueeze", F::DataMovement, 1),
        op("Concat", F::DataMovement, 1),
        op("Split", F::DataMovement, 1),
        op("Slice", F::DataMovement, 1),
        op("Gather", F::DataMovement, 1),
        op("GatherElements", F::DataMovement, 11),
        op("GatherND", F::DataMovement, 11),
        op("ScatterND", F::DataMovement, 11),
        op("ScatterElements", F::DataMovement, 11),
        op("Scatter", F::DataMovement, 9),
        op("Expand", F::DataMovement, 8),
        op("Tile", F::DataMovement, 1),
        op("Pad", F::DataMovement, 1),
        op("Shape", F::DataMovement, 1),
        op("Size", F::DataMovement, 1),
        op("Range", F::DataMovement, 11),
        op("ConstantOfShape", F::DataMovement, 9),
        op("Identity", F::DataMovement, 1),
        op("Dropout", F::DataMovement, 1),
        op("Trilu", F::DataMovement, 14),
        op("NonZero", F::DataMovement, 9),
        op("OneHot", F::DataMovement, 9),
        op("EyeLike", F::DataMovement, 9),
        op("Constant", F::DataMovement, 1),
        op("LSTM", F::Recurrent, 1),
        op("GRU", F::Recurrent, 1),
        op("RNN", F::Recurrent, 1),
        op("If", F::Control, 1),
        op("Loop", F::Control, 1),
        op("QuantizeLinear", F::Quant, 10),
        op("DequantizeLinear", F::Quant, 10),
        op("DynamicQuantizeLinear", F::Quant, 11),
        op("QLinearMatMul", F::Quant, 10),
        op("QLinearConv", F::Quant, 10),
        op("MatMulInteger", F::Quant, 10),
        op("ConvInteger", F::Quant, 10),
        op("NonMaxSuppression", F::Vision, 10),
        op("RoiAlign", F::Vision, 10),
        op("GridSample", F::Vision, 16),
        op("AffineGrid", F::Vision, 20),
        op("LRN", F::Vision, 1),
        op("MaxUnpool", F::Vision, 9),
        op("Col2Im", F::Vision, 18),
        op("CenterCropPad", F::Vision, 18),
        op("DeformConv", F::Vision, 19),
        op("DFT", F::Signal, 17),
        op("STFT", F::Signal, 17),
        op("HannWindow", F::Signal, 17),
        op("HammingWindow", F::Signal, 17),
        op("BlackmanWindow", F::Signal, 17),
        op("MelWeightMatrix", F::Signal, 17),
        op("RMSNormalization", F::Misc, 23),
        op("Compress", F::Misc, 9),
        op("ReverseSequence", F::Misc, 10),
        op("Unique", F::Misc, 11),
        op("RotaryEmbedding", F::Misc, 23),
        op("TensorScatter", F::Misc, 24),
        op("Det", F::Misc, 11),
        op("NegativeLogLikelihoodLoss", F::Misc, 12),
        op("SoftmaxCrossEntropyLoss", F::Misc, 12),
    ]
};

/// The default-domain ONNX operator `op_type`, if kiln imports it.
pub fn onnx_operator(op_type: &str) -> Option<OnnxOperator> {
    if let Some((name, since)) = crate::Unary::onnx_since(op_type) {
        return Some(OnnxOperator {
            name,
            family: OpFamily::Elementwise,
            since,
        });
    }
    ONNX_OPERATORS.iter().find(|o| o.name == op_type).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn every_onnx_operator_is_listed_once() {
        let mut seen = HashSet::new();
        for name in ONNX_OPERATORS
            .iter()
            .map(|o| o.name)
            .chain(crate::Unary::onnx_names().iter().copied())
        {
            assert!(seen.insert(name), "{name} is listed twice");
        }
    }

    #[test]
    fn lookups_reach_both_tables() {
        let gelu = onnx_operator("Gelu").unwrap();
        assert_eq!((gelu.family, gelu.since), (OpFamily::Elementwise, 20));
        let conv = onnx_operator("Conv").unwrap();
        assert_eq!((conv.family, conv.since), (OpFamily::Conv, 1));
        assert_eq!(onnx_operator("Attention").unwrap().since, 23);
        assert!(onnx_operator("NoSuchOp").is_none());
    }

    #[test]
    fn element_wise_motion_is_element_wise_family() {
        // The channels-last pass and fusion rely on the two answers agreeing.
        for op in [
            Op::Where,
            Op::Clip,
            Op::Cast {
                to: crate::DType::F16,
            },
            Op::Binary(Binary::Add),
        ] {
            assert_eq!(op.family(), OpFamily::Elementwise);
            assert_eq!(op.motion(), Motion::Elementwise);
            assert_eq!(op.layout_role(), LayoutRole::Carry);
        }
        assert_eq!(Op::Reshape { allow_zero: false }.motion(), Motion::View);
        assert_eq!(Op::Expand.motion(), Motion::Rearrange);
    }
}
