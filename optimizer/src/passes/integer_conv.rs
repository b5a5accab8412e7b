//! `integer-conv`: a convolution that a QDQ model computes in float between a dequantized
//! activation and dequantized weights is computed on their integers:
//!
//! ```text
//! Conv(DequantizeLinear(xq, sx, zx), DequantizeLinear(wq, sw, 0), B)
//!     = Cast<f32>(ConvInteger(xq, wq, zx)) · (sx · sw) + B
//! ```
//!
//! (`sw` per output channel or per tensor, the product's scale a constant `[M, 1, 1]`). The
//! integer sum is exact, so the two sides differ only by the float rounding of the dequantized
//! operands and of their sum, which the right side does not have.
//!
//! Why: quantizers write every convolution of a QDQ model this way, and the float form
//! computes with f32 operands. `ConvInteger` runs on the target's u8×s8 dot-product kernels
//! (`vpdpbusd`: four times the multiply-adds of an f32 FMA per instruction), and codegen
//! fuses the Cast, the scale, the bias and what follows into the product's epilogue. The
//! pipeline runs this pass only for targets with those kernels (`PipelineOptions::
//! integer_products`), before `freeze` folds the weights' DequantizeLinear to float.
//!
//! What it takes: u8 activations with a per-tensor constant scale and zero point; s8 constant
//! weights of a 2-D dense convolution (group 1) with a constant scale and zero weight zero
//! points. The activation's QuantizeLinear stays: it now feeds the ConvInteger (the
//! `fake-quantize` pass leaves a QuantizeLinear that something else reads).

use crate::Pass;
use kiln_ir::rewrite::{rebuild, remove_dead, Rewrite};
use kiln_ir::{ConvAttrs, DType, Graph, IrError, Node, Op, QuantOp, Tensor, ValueId};

pub struct IntegerConv;

/// The pass's name (`--disable-pass`, `--print-after`).
pub const NAME: &str = "integer-conv";

impl Pass for IntegerConv {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        let mut rewrites = 0;
        let rebuilt = rebuild(graph, |dst, _, node, inputs| {
            let Op::Conv(attrs) = &node.op else {
                return Ok(Rewrite::Keep);
            };
            let Some(q) = integer_operands(graph, node, attrs) else {
                return Ok(Rewrite::Keep);
            };
            rewrites += 1;
            Ok(Rewrite::Replace(vec![emit(dst, node, attrs, inputs, &q)?]))
        })?;
        if rewrites > 0 {
            *graph = remove_dead(&rebuilt)?;
        }
        Ok(rewrites)
    }
}

/// What a convolution `Conv(DQ(xq), DQ(wq), B)` computes on integers: whether the
/// activation has a zero point, and the product's per-channel scale `sx · sw`.
struct IntegerOperands {
    has_x_zero: bool,
    scale: Vec<f32>,
}

/// `(axis, input, scale, zero point)` of a per-tensor or per-axis DequantizeLinear to f32
/// producing `v`.
fn dequantized(graph: &Graph, v: ValueId) -> Option<(i64, ValueId, ValueId, Option<ValueId>)> {
    let node = graph.node(v.node);
    let Op::Quant(QuantOp::DequantizeLinear {
        axis,
        block_size: 0,
        output_dtype,
    }) = node.op
    else {
        return None;
    };
    if output_dtype.is_some_and(|d| d != DType::F32) {
        return None;
    }
    let input = node.inputs.first().copied().flatten()?;
    let scale = node.inputs.get(1).copied().flatten()?;
    Some((axis, input, scale, node.inputs.get(2).copied().flatten()))
}

fn integer_operands(graph: &Graph, node: &Node, attrs: &ConvAttrs) -> Option<IntegerOperands> {
    let (Some(Some(x)), Some(Some(w))) = (node.inputs.first(), node.inputs.get(1)) else {
        return None;
    };
    let out = &node.outputs.first()?.ty;
    // 2-D, dense, static: the convolutions the integer kernels compute.
    if attrs.group > 1
        || attrs.channels_last
        || out.dtype != DType::F32
        || out.rank() != 4
        || !out.is_static()
    {
        return None;
    }
    let (_, xq, sx, zx) = dequantized(graph, *x)?;
    let xt = graph.value_type(xq);
    if xt.dtype != DType::U8 || xt.rank() != 4 || !xt.is_static() {
        return None;
    }
    let sx = graph.known_value(sx)?;
    if sx.len() != 1 || sx.dtype() != DType::F32 {
        return None;
    }
    if let Some(z) = zx {
        let z = graph.known_value(z)?;
        if z.len() != 1 || z.dtype() != DType::U8 {
            return None;
        }
    }
    let (axis, wq, sw, zw) = dequantized(graph, *w)?;
    let wt = graph.known_value(wq)?;
    let m = *wt.shape().first()?;
    if wt.dtype() != DType::I8 || wt.shape().len() != 4 || m == 0 {
        return None;
    }
    if let Some(z) = zw {
        if graph.known_value(z)?.to_f64_vec().iter().any(|&v| v != 0.0) {
            return None;
        }
    }
    let sw = graph.known_value(sw)?;
    if sw.dtype() != DType::F32 {
        return None;
    }
    let sw = sw.to_f64_vec();
    let per_channel = sw.len() == m && m > 1 && (axis == 0 || axis == -4);
    if sw.len() != 1 && !per_channel {
        return None;
    }
    let sx = sx.to_f64_vec()[0];
    // Positive and finite (NaN fails both).
    let usable = |s: f64| s > 0.0 && s.is_finite();
    if !usable(sx) || !sw.iter().all(|&s| usable(s)) {
        return None;
    }
    let scale = (0..m)
        .map(|c| (sx * sw[if per_channel { c } else { 0 }]) as f32)
        .collect();
    Some(IntegerOperands {
        has_x_zero: zx.is_some(),
        scale,
    })
}

/// `Cast<f32>(ConvInteger(xq, wq, zx)) · scale (+ B)` in `dst`; the last node keeps the
/// convolution's output name.
fn emit(
    dst: &mut Graph,
    conv: &Node,
    attrs: &ConvAttrs,
    inputs: &[Option<ValueId>],
    q: &IntegerOperands,
) -> Result<ValueId, IrError> {
    let name = conv.name.as_str();
    // The integer operands are the inputs of the DequantizeLinears, already copied to `dst`.
    let producer_input = |i: usize, j: usize| -> Result<Option<ValueId>, IrError> {
        let v = inputs
            .get(i)
            .copied()
            .flatten()
            .ok_or_else(|| IrError::Invalid(format!("{name}: input {i} missing")))?;
        Ok(dst.node(v.node).inputs.get(j).copied().flatten())
    };
    let xq = producer_input(0, 0)?.ok_or_else(|| IrError::Invalid(format!("{name}: no xq")))?;
    let x_zero = if q.has_x_zero { producer_input(0, 2)? } else { None };
    let wq = producer_input(1, 0)?.ok_or_else(|| IrError::Invalid(format!("{name}: no wq")))?;
    let acc = dst.add(
        format!("{name}_integer"),
        Op::Quant(QuantOp::ConvInteger(attrs.clone())),
        vec![Some(xq), Some(wq), x_zero],
        format!("{name}_integer"),
    )?;
    let accf = dst.add(
        format!("{name}_integer_f32"),
        Op::Cast { to: DType::F32 },
        vec![Some(acc)],
        format!("{name}_integer_f32"),
    )?;
    let m = q.scale.len();
    let scale = dst.add_const(
        format!("{name}_scale"),
        Tensor::from_vec(vec![m, 1, 1], q.scale.clone()),
    );
    let out = conv.outputs[0].name.clone();
    let Some(bias) = inputs.get(2).copied().flatten() else {
        return dst.add(
            name,
            Op::Binary(kiln_ir::Binary::Mul),
            vec![Some(accf), Some(scale)],
            out,
        );
    };
    let scaled = dst.add(
        format!("{name}_scaled"),
        Op::Binary(kiln_ir::Binary::Mul),
        vec![Some(accf), Some(scale)],
        format!("{name}_scaled"),
    )?;
    // B is `[M]`; as `[M, 1, 1]` it broadcasts over the output's channel axis.
    let shape = dst.add_const(
        format!("{name}_bias_shape"),
        Tensor::from_vec(vec![3], vec![m as i64, 1, 1]),
    );
    let bias = dst.add(
        format!("{name}_bias"),
        Op::Reshape { allow_zero: false },
        vec![Some(bias), Some(shape)],
        format!("{name}_bias"),
    )?;
    dst.add(
        name,
        Op::Binary(kiln_ir::Binary::Add),
        vec![Some(scaled), Some(bias)],
        out,
    )
}
