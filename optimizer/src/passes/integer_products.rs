//! `integer-products`: a convolution or matrix product that a QDQ model computes in float
//! between a dequantized activation and dequantized weights is computed on their integers:
//!
//! ```text
//! Conv(DequantizeLinear(xq, sx, zx), DequantizeLinear(wq, sw, 0), B)
//!     = Cast<f32>(ConvInteger(xq, wq, zx)) · (sx · sw) + B
//! MatMul(DequantizeLinear(xq, sx, zx), DequantizeLinear(wq, sw, 0))
//!     = Cast<f32>(MatMulInteger(xq, wq, zx)) · (sx · sw)
//! ```
//!
//! and a Gemm (alpha 1, A not transposed) as the MatMul, its B transposed at compile time, plus
//! C. `sw` is per output channel (column) or per tensor; the product's scale is a constant
//! `[M, 1, 1]` for a convolution, `[N]` for a matrix product. The integer sum is exact, so the
//! two sides differ only by the float rounding of the dequantized operands and of their sum,
//! which the right side does not have.
//!
//! Why: quantizers write every convolution and matrix product of a QDQ model this way, and the
//! float form computes with f32 operands (and f32 weights: four times the bytes). The integer
//! products run on the target's u8×s8 dot-product kernels (`vpdpbusd`: four times the
//! multiply-adds of an f32 FMA per instruction), and codegen fuses the Cast, the scale, the
//! bias and what follows into their epilogue. The pipeline runs this pass only for targets
//! with those kernels (`PipelineOptions::integer_products`), before `freeze` folds the
//! weights' DequantizeLinear to float.
//!
//! What it takes: u8 activations with a per-tensor constant scale and zero point; constant s8
//! weights with a constant scale and zero weight zero points, of a dense 2-D convolution
//! (group 1) or a 2-D matrix with K a multiple of 4 (the integer matrix kernel reads A's rows
//! in place, four bytes at a time). The activation's QuantizeLinear stays: it now feeds the
//! integer product (and `fake-quantize` leaves its other pairs alone).

use crate::Pass;
use kiln_ir::rewrite::{rebuild, remove_dead, Rewrite};
use kiln_ir::{Binary, DType, Graph, IrError, Node, Op, QuantOp, Tensor, ValueId};

pub struct IntegerProducts;

/// The pass's name (`--disable-pass`, `--print-after`).
pub const NAME: &str = "integer-products";

impl Pass for IntegerProducts {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        let mut rewrites = 0;
        let rebuilt = rebuild(graph, |dst, _, node, inputs| {
            let Some(p) = integer_product(graph, node) else {
                return Ok(Rewrite::Keep);
            };
            rewrites += 1;
            Ok(Rewrite::Replace(vec![emit(dst, node, inputs, &p)?]))
        })?;
        if rewrites > 0 {
            *graph = remove_dead(&rebuilt)?;
        }
        Ok(rewrites)
    }
}

/// What a product `P(DQ(xq), DQ(wq), bias)` computes on integers.
struct IntegerProduct {
    /// ConvInteger or MatMulInteger.
    op: Op,
    has_x_zero: bool,
    /// The weights as the integer product reads them, when they differ from `wq` (a Gemm's
    /// transposed B).
    weights: Option<Tensor>,
    /// The product's scale `sx · sw`, one per output channel (column).
    scale: Vec<f32>,
    /// A convolution (channels on axis 1: the scale and the bias are `[M, 1, 1]`).
    conv: bool,
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

/// The activation `DQ(xq, sx, zx)` producing `x`: u8 with per-tensor constant parameters.
/// Returns `sx` and whether there is a zero point.
fn quantized_activation(graph: &Graph, x: ValueId) -> Option<(f64, bool)> {
    let (_, xq, sx, zx) = dequantized(graph, x)?;
    let xt = graph.value_type(xq);
    if xt.dtype != DType::U8 || !xt.is_static() {
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
    Some((sx.to_f64_vec()[0], zx.is_some()))
}

/// The weights `DQ(wq, sw, 0)` producing `w`: constant s8 with a zero (or no) zero point and a
/// scale per tensor or along `channel_axis` (of `channels`). Returns `wq` and the scale per
/// channel.
fn quantized_weights(graph: &Graph, w: ValueId, channel_axis: usize) -> Option<(&Tensor, Vec<f64>)> {
    let (axis, wq, sw, zw) = dequantized(graph, w)?;
    let wt = graph.known_value(wq)?;
    let rank = wt.shape().len();
    let channels = *wt.shape().get(channel_axis)?;
    if wt.dtype() != DType::I8 || channels == 0 {
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
    let on_axis = axis.rem_euclid(rank as i64) as usize == channel_axis;
    let scale = match sw.len() {
        1 => vec![sw[0]; channels],
        len if len == channels && on_axis => sw,
        _ => return None,
    };
    Some((wt, scale))
}

/// Positive and finite (NaN fails both).
fn usable(s: f64) -> bool {
    s > 0.0 && s.is_finite()
}

fn integer_product(graph: &Graph, node: &Node) -> Option<IntegerProduct> {
    let (Some(Some(x)), Some(Some(w))) = (node.inputs.first(), node.inputs.get(1)) else {
        return None;
    };
    let out = &node.outputs.first()?.ty;
    if out.dtype != DType::F32 || !out.is_static() {
        return None;
    }
    let (sx, has_x_zero) = quantized_activation(graph, *x)?;
    let x_rank = graph.value_type(*x).rank();
    let (op, wq, sw, weights, conv) = match &node.op {
        // 2-D, dense: the convolutions the integer kernels compute.
        Op::Conv(a) if a.group <= 1 && !a.channels_last && out.rank() == 4 => {
            let (wq, sw) = quantized_weights(graph, *w, 0)?;
            (Op::Quant(QuantOp::ConvInteger(a.clone())), wq, sw, None, true)
        }
        Op::MatMul if x_rank >= 2 => {
            let (wq, sw) = quantized_weights(graph, *w, 1)?;
            (Op::Quant(QuantOp::MatMulInteger), wq, sw, None, false)
        }
        Op::Gemm {
            alpha,
            beta,
            trans_a: false,
            trans_b,
        } if *alpha == 1.0 && (*beta == 1.0 || node.inputs.get(2).copied().flatten().is_none()) => {
            // B is `[N, K]` when transposed: its channels (columns of the result) on axis 0.
            let (wq, sw) = quantized_weights(graph, *w, if *trans_b { 0 } else { 1 })?;
            let transposed = trans_b.then(|| transpose_2d(wq)).flatten();
            if *trans_b && transposed.is_none() {
                return None;
            }
            (Op::Quant(QuantOp::MatMulInteger), wq, sw, transposed, false)
        }
        _ => return None,
    };
    let ws = wq.shape();
    let ok_shape = if conv {
        ws.len() == 4
    } else {
        // K (B's rows) whole quads.
        ws.len() == 2 && weights.as_ref().map_or(ws[0], |t| t.shape()[0]) % 4 == 0
    };
    if !ok_shape || !usable(sx) || !sw.iter().all(|&s| usable(s)) {
        return None;
    }
    Some(IntegerProduct {
        op,
        has_x_zero,
        weights,
        scale: sw.iter().map(|&s| (sx * s) as f32).collect(),
        conv,
    })
}

/// A 2-D s8 tensor transposed.
fn transpose_2d(t: &Tensor) -> Option<Tensor> {
    let (r, c) = match t.shape() {
        [r, c] => (*r, *c),
        _ => return None,
    };
    let v = t.as_slice::<i8>()?;
    let data = (0..r * c).map(|i| v[(i % r) * c + i / r]).collect();
    Some(Tensor::from_vec(vec![c, r], data))
}

/// `Cast<f32>(Integer(xq, wq, zx)) · scale (+ bias)` in `dst`; the last node keeps the
/// product's output name.
fn emit(
    dst: &mut Graph,
    node: &Node,
    inputs: &[Option<ValueId>],
    p: &IntegerProduct,
) -> Result<ValueId, IrError> {
    let name = node.name.as_str();
    // The integer operands are the inputs of the DequantizeLinears, already copied to `dst`.
    let producer_input = |dst: &Graph, i: usize, j: usize| -> Result<Option<ValueId>, IrError> {
        let v = inputs
            .get(i)
            .copied()
            .flatten()
            .ok_or_else(|| IrError::Invalid(format!("{name}: input {i} missing")))?;
        Ok(dst.node(v.node).inputs.get(j).copied().flatten())
    };
    let missing = || IrError::Invalid(format!("{name}: a DequantizeLinear without input"));
    let xq = producer_input(dst, 0, 0)?.ok_or_else(missing)?;
    let x_zero = if p.has_x_zero {
        producer_input(dst, 0, 2)?
    } else {
        None
    };
    let wq = match &p.weights {
        Some(t) => dst.add_const(format!("{name}_weights"), t.clone()),
        None => producer_input(dst, 1, 0)?.ok_or_else(missing)?,
    };
    let acc = dst.add(
        format!("{name}_integer"),
        p.op.clone(),
        vec![Some(xq), Some(wq), x_zero],
        format!("{name}_integer"),
    )?;
    let accf = dst.add(
        format!("{name}_integer_f32"),
        Op::Cast { to: DType::F32 },
        vec![Some(acc)],
        format!("{name}_integer_f32"),
    )?;
    let n = p.scale.len();
    // Per output channel: axis 1 of a convolution's `[N, M, H, W]`, the last of a product.
    let channel_shape = |n: usize| if p.conv { vec![n, 1, 1] } else { vec![n] };
    let scale = dst.add_const(
        format!("{name}_scale"),
        Tensor::from_vec(channel_shape(n), p.scale.clone()),
    );
    let out = node.outputs[0].name.clone();
    let Some(bias) = inputs.get(2).copied().flatten() else {
        return dst.add(name, Op::Binary(Binary::Mul), vec![Some(accf), Some(scale)], out);
    };
    let scaled = dst.add(
        format!("{name}_scaled"),
        Op::Binary(Binary::Mul),
        vec![Some(accf), Some(scale)],
        format!("{name}_scaled"),
    )?;
    // A convolution's B is `[M]`: as `[M, 1, 1]` it broadcasts over the channel axis. A Gemm's
    // C broadcasts to the result as it is.
    let bias = if p.conv {
        let shape = dst.add_const(
            format!("{name}_bias_shape"),
            Tensor::from_vec(vec![3], vec![n as i64, 1, 1]),
        );
        dst.add(
            format!("{name}_bias"),
            Op::Reshape { allow_zero: false },
            vec![Some(bias), Some(shape)],
            format!("{name}_bias"),
        )?
    } else {
        bias
    };
    dst.add(name, Op::Binary(Binary::Add), vec![Some(scaled), Some(bias)], out)
}
