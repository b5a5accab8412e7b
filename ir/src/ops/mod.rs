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

use crate::{DType, Op, OpError, OpFamily, Tensor, TensorType};

/// The window geometry of Conv and the pools, for backends that lower them: one resolved axis,
/// and the ONNX rules (auto_pad, ceil_mode) that resolve it.
pub use conv::{resolve_axis as resolve_window_axis, Axis as WindowAxis};

// Reference semantics that backends computing constants at compile time call rather than copy
// (Resize's coordinate and coefficient math is the public module `resize`).
/// Attention's dtype promotion: the dtype its softmax input and additive bias are built in.
pub use attention::promote as attention_promote;
/// Einsum's equation resolved to axis labels (implicit output, ellipsis broadcasting).
pub use linalg::{parse_einsum, EinsumSpec};
/// The saturation range of a quantized integer dtype.
pub use quant::int_range as quant_range;

/// The longest sum of u8 × s8 products (ConvInteger, MatMulInteger) that i32 holds exactly
/// whatever the values: each product is at most 255 × 128 in magnitude, and 65536 of them (a
/// zero-point correction included) stay below 2³¹. Integer kernels and the passes that make
/// integer products keep to it.
pub const MAX_EXACT_INTEGER_K: usize = 65536;
/// The quantization operators' dtype promotion: their compute precision when none is set.
pub use quant::promote as quant_promote;
/// Pad's per-axis source index map (constant, reflect, edge and wrap modes, negative pads).
pub use shape::pad_axis_map;
/// Slice's start and length along one axis, with ONNX's clamping of starts, ends and steps.
pub use shape::slice_range;
/// `(cos, sin)` of `2πk/n`, exact at quarter turns: the DFT's twiddle factors.
pub use signal::unit_root;
/// Col2Im's block geometry: per image axis its stride, dilation, padding and block count.
pub use vision::col2im_axes;
/// DeformConv's window geometry: per spatial axis its kernel, stride, dilation, padding and output.
pub use vision::deform_conv_axes;

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

/// Infers the output types of `op`, in the module of its family (the operator table).
pub fn infer(op: &Op, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    match op.family() {
        OpFamily::Source => crate::bail!("source nodes have no inputs to infer from"),
        OpFamily::Elementwise => elementwise::infer(op, cx),
        OpFamily::Linalg => linalg::infer(op, cx),
        OpFamily::Conv => conv::infer(op, cx),
        OpFamily::Norm => norm::infer(op, cx),
        OpFamily::Resize => resize::infer(op, cx),
        OpFamily::Attention => attention::infer(op, cx),
        OpFamily::Reduce => reduce::infer(op, cx),
        OpFamily::DataMovement => shape::infer(op, cx),
        OpFamily::Recurrent => recurrent::infer(op, cx),
        OpFamily::Control => control::infer(op, cx),
        OpFamily::Quant => quant::infer(op, cx),
        OpFamily::Vision => vision::infer(op, cx),
        OpFamily::Signal => signal::infer(op, cx),
        OpFamily::Misc => misc::infer(op, cx),
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
    match op.family() {
        OpFamily::Source => crate::bail!("source nodes are not evaluated"),
        OpFamily::Elementwise => elementwise::eval(op, cx),
        OpFamily::Linalg => linalg::eval(op, cx),
        OpFamily::Conv => conv::eval(op, cx),
        OpFamily::Norm => norm::eval(op, cx),
        OpFamily::Resize => resize::eval(op, cx),
        OpFamily::Attention => attention::eval(op, cx),
        OpFamily::Reduce => reduce::eval(op, cx),
        OpFamily::DataMovement => shape::eval(op, cx),
        OpFamily::Recurrent => recurrent::eval(op, cx),
        OpFamily::Control => control::eval(op, cx),
        OpFamily::Quant => quant::eval(op, cx),
        OpFamily::Vision => vision::eval(op, cx),
        OpFamily::Signal => signal::eval(op, cx),
        OpFamily::Misc => misc::eval(op, cx),
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
