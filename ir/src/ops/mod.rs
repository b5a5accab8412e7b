//! Per-operator type inference and reference evaluation, one module per operator family.
//!
//! Every family module exposes `infer(op, cx)` and `eval(op, cx)` for its operators; this file
//! only routes. Inference sees input types and, where known at compile time, input values
//! (so that `Reshape` by a constant shape gets a static type); evaluation sees concrete tensors.

mod attention;
pub mod binary;
mod control;
mod conv;
mod elementwise;
mod linalg;
pub(crate) mod misc;
mod norm;
pub(crate) mod quant;
mod recurrent;
mod reduce;
pub mod resize;
mod shape;
pub(crate) mod signal;
pub mod unary;
pub mod util;
pub(crate) mod vision;

use crate::{DType, Op, OpError, Tensor, TensorType};

/// The window geometry of Conv and the pools, for backends that lower them: one resolved axis,
/// and the ONNX rules (auto_pad, ceil_mode) that resolve it.
pub use conv::{resolve_axis as resolve_window_axis, Axis as WindowAxis};

// Reference semantics that backends computing constants at compile time call rather than copy
// (Resize's coordinate and coefficient math is the public module `resize`).
/// Attention's dtype promotion: the dtype its softmax input and additive bias are built in.
pub use attention::promote as attention_promote;
/// The quantization operators' dtype promotion: their compute precision when none is set.
pub use quant::promote as quant_promote;
/// Pad's per-axis source index map (constant, reflect, edge and wrap modes, negative pads).
pub use shape::pad_axis_map;
/// Slice's start and length along one axis, with ONNX's clamping of starts, ends and steps.
pub use shape::slice_range;
/// `(cos, sin)` of `2πk/n`, exact at quarter turns: the DFT's twiddle factors.
pub use signal::unit_root;

/// What type inference knows about a node's inputs.
pub struct InferCtx<'a> {
    /// Input types; `None` for an absent optional input.
    pub inputs: Vec<Option<&'a TensorType>>,
    /// Input values known at compile time (constants and small shape arithmetic).
    pub values: Vec<Option<&'a Tensor>>,
    /// How many outputs the node declares.
    pub num_outputs: usize,
}

impl<'a> InferCtx<'a> {
    /// Type of required input `i`.
    pub fn ty(&self, i: usize) -> Result<&'a TensorType, OpError> {
        self.inputs
            .get(i)
            .copied()
            .flatten()
            .ok_or_else(|| OpError::new(format!("missing required input {i}")))
    }

    /// Type of optional input `i`.
    pub fn opt_ty(&self, i: usize) -> Option<&'a TensorType> {
        self.inputs.get(i).copied().flatten()
    }

    /// Known value of input `i`, if any.
    pub fn value(&self, i: usize) -> Option<&'a Tensor> {
        self.values.get(i).copied().flatten()
    }

    pub fn num_inputs(&self) -> usize {
        self.inputs.len()
    }
}

/// The concrete inputs of one evaluation.
pub struct EvalCtx<'a> {
    /// Input tensors; `None` for an absent optional input.
    pub inputs: Vec<Option<&'a Tensor>>,
    /// The node's inferred output types. Use them for dtypes and the output count only: a
    /// dimension may be symbolic while the evaluated tensor has a concrete extent.
    pub out_types: &'a [TensorType],
}

impl<'a> EvalCtx<'a> {
    pub fn input(&self, i: usize) -> Result<&'a Tensor, OpError> {
        self.inputs
            .get(i)
            .copied()
            .flatten()
            .ok_or_else(|| OpError::new(format!("missing required input {i}")))
    }

    pub fn opt_input(&self, i: usize) -> Option<&'a Tensor> {
        self.inputs.get(i).copied().flatten()
    }

    pub fn out_dtype(&self, i: usize) -> DType {
        self.out_types[i].dtype
    }

    pub fn num_outputs(&self) -> usize {
        self.out_types.len()
    }
}

/// Infers the output types of `op`.
pub fn infer(op: &Op, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    match op {
        Op::Input | Op::Constant(_) => crate::bail!("source nodes have no inputs to infer from"),
        Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Clip | Op::Cast { .. } => elementwise::infer(op, cx),
        Op::MatMul | Op::Gemm { .. } | Op::Einsum { .. } => linalg::infer(op, cx),
        Op::Conv(_) | Op::ConvTranspose(_) | Op::Pool(_) | Op::GlobalPool(_) => conv::infer(op, cx),
        Op::BatchNorm { .. }
        | Op::LayerNorm { .. }
        | Op::InstanceNorm { .. }
        | Op::GroupNorm { .. }
        | Op::LpNorm { .. }
        | Op::MeanVarianceNorm { .. }
        | Op::Softmax { .. }
        | Op::LogSoftmax { .. }
        | Op::Hardmax { .. } => norm::infer(op, cx),
        Op::Resize(_) | Op::DepthToSpace { .. } | Op::SpaceToDepth { .. } => resize::infer(op, cx),
        Op::Attention(_) => attention::infer(op, cx),
        Op::Reduce { .. }
        | Op::ArgMax { .. }
        | Op::ArgMin { .. }
        | Op::TopK { .. }
        | Op::CumSum { .. }
        | Op::CumProd { .. } => reduce::infer(op, cx),
        Op::Reshape { .. }
        | Op::Flatten { .. }
        | Op::Transpose { .. }
        | Op::Squeeze
        | Op::Unsqueeze
        | Op::Concat { .. }
        | Op::Split { .. }
        | Op::Slice
        | Op::Gather { .. }
        | Op::GatherElements { .. }
        | Op::GatherND { .. }
        | Op::ScatterND { .. }
        | Op::ScatterElements { .. }
        | Op::Expand
        | Op::Tile
        | Op::Pad { .. }
        | Op::Shape { .. }
        | Op::Size
        | Op::Range
        | Op::ConstantOfShape { .. }
        | Op::Identity
        | Op::Trilu { .. }
        | Op::NonZero
        | Op::OneHot { .. }
        | Op::EyeLike { .. } => shape::infer(op, cx),
        Op::Rnn(_) => recurrent::infer(op, cx),
        Op::If { .. } | Op::Loop { .. } => control::infer(op, cx),
        Op::Quant(q) => quant::infer(q, cx),
        Op::Vision(v) => vision::infer(v, cx),
        Op::Signal(x) => signal::infer(x, cx),
        Op::Misc(m) => misc::infer(m, cx),
    }
}

/// Evaluates `op` on concrete inputs. Outputs whose size the inferred types already give are
/// checked against the memory budget ([`crate::budget`]) before anything is allocated.
pub fn eval(op: &Op, cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let static_bytes: u128 = cx
        .out_types
        .iter()
        .filter_map(|t| t.size_bytes())
        .map(|b| b as u128)
        .sum();
    crate::budget::check(static_bytes, 0, "its output")?;
    eval_op(op, cx)
}

fn eval_op(op: &Op, cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    match op {
        Op::Input | Op::Constant(_) => crate::bail!("source nodes are not evaluated"),
        Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Clip | Op::Cast { .. } => elementwise::eval(op, cx),
        Op::MatMul | Op::Gemm { .. } | Op::Einsum { .. } => linalg::eval(op, cx),
        Op::Conv(_) | Op::ConvTranspose(_) | Op::Pool(_) | Op::GlobalPool(_) => conv::eval(op, cx),
        Op::BatchNorm { .. }
        | Op::LayerNorm { .. }
        | Op::InstanceNorm { .. }
        | Op::GroupNorm { .. }
        | Op::LpNorm { .. }
        | Op::MeanVarianceNorm { .. }
        | Op::Softmax { .. }
        | Op::LogSoftmax { .. }
        | Op::Hardmax { .. } => norm::eval(op, cx),
        Op::Resize(_) | Op::DepthToSpace { .. } | Op::SpaceToDepth { .. } => resize::eval(op, cx),
        Op::Attention(_) => attention::eval(op, cx),
        Op::Reduce { .. }
        | Op::ArgMax { .. }
        | Op::ArgMin { .. }
        | Op::TopK { .. }
        | Op::CumSum { .. }
        | Op::CumProd { .. } => reduce::eval(op, cx),
        Op::Reshape { .. }
        | Op::Flatten { .. }
        | Op::Transpose { .. }
        | Op::Squeeze
        | Op::Unsqueeze
        | Op::Concat { .. }
        | Op::Split { .. }
        | Op::Slice
        | Op::Gather { .. }
        | Op::GatherElements { .. }
        | Op::GatherND { .. }
        | Op::ScatterND { .. }
        | Op::ScatterElements { .. }
        | Op::Expand
        | Op::Tile
        | Op::Pad { .. }
        | Op::Shape { .. }
        | Op::Size
        | Op::Range
        | Op::ConstantOfShape { .. }
        | Op::Identity
        | Op::Trilu { .. }
        | Op::NonZero
        | Op::OneHot { .. }
        | Op::EyeLike { .. } => shape::eval(op, cx),
        Op::Rnn(_) => recurrent::eval(op, cx),
        Op::If { .. } | Op::Loop { .. } => control::eval(op, cx),
        Op::Quant(q) => quant::eval(q, cx),
        Op::Vision(v) => vision::eval(v, cx),
        Op::Signal(x) => signal::eval(x, cx),
        Op::Misc(m) => misc::eval(m, cx),
    }
}

/// `[start, end)` of ONNX `Shape(start, end)` on a tensor of rank `rank`, with negative
/// indices counted from the back and both clamped to `[0, rank]`.
pub fn shape_slice_bounds(rank: usize, start: i64, end: Option<i64>) -> (usize, usize) {
    let r = rank as i64;
    let clamp = |v: i64| {
        let v = if v < 0 { v + r } else { v };
        v.clamp(0, r) as usize
    };
    let s = clamp(start);
    let e = clamp(end.unwrap_or(r));
    (s, e.max(s))
}
