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
//! The QOperator forms are the same products followed by the output's quantization:
//!
//! ```text
//! QLinearConv(xq, sx, zx, wq, sw, 0, sy, zy, B)
//!     = QuantizeLinear(Cast<f32>(ConvInteger(xq, wq, zx)) · (sx · sw) + B · (sx · sw), sy, zy)
//! ```
//!
//! and QLinearMatMul likewise (without B); these differ from the operators' reference only by
//! where the float rescale rounds. Between them, a QDQ model's MaxPool pools the bytes
//! (`integer_max_pool`), as a QOperator model's does: DequantizeLinear never decreases (its
//! scale is positive), so `MaxPool(DQ(q)) = DQ(MaxPool(q))`, and the quantization that follows
//! with the same parameters gives the bytes back (`requantized`):
//!
//! ```text
//! QuantizeLinear(MaxPool(DequantizeLinear(q, s, z)), s, z) = MaxPool(q)
//! ```
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
//! in place, four bytes at a time); sums of at most `MAX_EXACT_INTEGER_K` products, which i32
//! holds exactly. The activation's QuantizeLinear stays: it now feeds the integer product
//! (and `fake-quantize` leaves its other pairs alone).

use crate::Pass;
use kiln_ir::ops::MAX_EXACT_INTEGER_K;
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
            if let Some(pooled) = integer_max_pool(dst, graph, node, inputs)? {
                rewrites += 1;
                return Ok(Rewrite::Replace(vec![pooled]));
            }
            if let Some(q) = requantized(dst, node, inputs) {
                rewrites += 1;
                return Ok(Rewrite::Replace(vec![q]));
            }
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

/// `MaxPool(DequantizeLinear(q, s, z))` with bytes `q` and constant per-tensor parameters
/// (`s > 0`): `DequantizeLinear(MaxPool(q), s, z)`, added to `dst`. Max commutes with a
/// non-decreasing map, so the values are the same; the pool reads a quarter of the bytes and
/// the DequantizeLinear usually meets the QuantizeLinear that follows (`requantized`).
fn integer_max_pool(
    dst: &mut Graph,
    src: &Graph,
    node: &Node,
    inputs: &[Option<ValueId>],
) -> Result<Option<ValueId>, IrError> {
    let Op::Pool(p) = &node.op else {
        return Ok(None);
    };
    let (Some(Some(x)), Some(Some(x_dst))) = (node.inputs.first(), inputs.first()) else {
        return Ok(None);
    };
    if p.kind != kiln_ir::PoolKind::Max || node.outputs.len() != 1 || !node.outputs[0].ty.is_static() {
        return Ok(None);
    }
    let Some((_, q, s, z)) = dequantized(src, *x) else {
        return Ok(None);
    };
    let q_dtype = src.value_type(q).dtype;
    if !matches!(q_dtype, DType::U8 | DType::I8) || !per_tensor_scale(src, s).is_some_and(usable) {
        return Ok(None);
    }
    if z.is_some_and(|z| src.known_value(z).is_none_or(|t| t.len() != 1)) {
        return Ok(None);
    }
    // The same operands in `dst`: the DequantizeLinear node `x` was copied to (this pass
    // keeps DequantizeLinear nodes as they are).
    let dq = dst.node(x_dst.node);
    if !matches!(dq.op, Op::Quant(QuantOp::DequantizeLinear { .. })) {
        return Ok(None);
    }
    let dq_inputs = dq.inputs.clone();
    let dq_op = dq.op.clone();
    let name = node.name.as_str();
    let pooled = dst.add(
        format!("{name}_bytes"),
        node.op.clone(),
        vec![dq_inputs[0]],
        format!("{name}_bytes"),
    )?;
    let mut dq_inputs = dq_inputs;
    dq_inputs[0] = Some(pooled);
    Ok(Some(dst.add(
        name,
        dq_op,
        dq_inputs,
        node.outputs[0].name.clone(),
    )?))
}

/// `QuantizeLinear(DequantizeLinear(q, s, z), s, z)` in `dst`, per tensor, with the same
/// constant parameters and byte type: `q` itself. `(q − z)·s / s` is within a few ulps of the
/// integer `q − z` (at most 255 in magnitude), so it rounds back to it exactly; a reduced
/// `precision` for the quotient could not, and is left alone.
fn requantized(dst: &Graph, node: &Node, inputs: &[Option<ValueId>]) -> Option<ValueId> {
    let Op::Quant(QuantOp::QuantizeLinear {
        block_size: 0,
        output_dtype,
        precision,
        ..
    }) = node.op
    else {
        return None;
    };
    if precision.is_some_and(|p| p != DType::F32) {
        return None;
    }
    let y = inputs.first().copied().flatten()?;
    let (_, q, s, z) = dequantized(dst, y)?;
    if dst.value_type(q).dtype != output_dtype {
        return None;
    }
    let constant = |v: Option<ValueId>| v.map(|v| dst.known_value(v).filter(|t| t.len() == 1));
    let same = |a: Option<Option<&Tensor>>, b: Option<Option<&Tensor>>| match (a, b) {
        (None, None) => true,
        (Some(Some(a)), Some(Some(b))) => a.dtype() == b.dtype() && a.to_f64_vec() == b.to_f64_vec(),
        _ => false,
    };
    let (s2, z2) = (inputs.get(1).copied().flatten(), inputs.get(2).copied().flatten());
    let scale_ok = per_tensor_scale(dst, s).is_some_and(usable) && same(constant(Some(s)), constant(s2));
    (scale_ok && same(constant(z), constant(z2))).then_some(q)
}

/// The value of a constant one-element f32 scale.
fn per_tensor_scale(graph: &Graph, s: ValueId) -> Option<f64> {
    let t = graph.known_value(s)?;
    (t.len() == 1 && t.dtype() == DType::F32).then(|| t.to_f64_vec()[0])
}

/// What a product `P(DQ(xq), DQ(wq), bias)` or `QLinearP(xq, .., wq, .., B)` computes on
/// integers.
struct IntegerProduct {
    /// ConvInteger or MatMulInteger.
    op: Op,
    form: Form,
    /// The weights as the integer product reads them, when they differ from `wq` (a Gemm's
    /// transposed B).
    weights: Option<Tensor>,
    /// The product's scale `sx · sw`, one per output channel (column).
    scale: Vec<f32>,
    /// A convolution (channels on axis 1: the scale and the bias are `[M, 1, 1]`).
    conv: bool,
}

/// Where the integer operands are.
enum Form {
    /// A float product of DequantizeLinear outputs: the integers are those nodes' inputs, a
    /// bias (convolution B, Gemm C) is the product's input 2.
    Dequantized { has_x_zero: bool },
    /// QLinearConv/QLinearMatMul: the integers are the node's inputs 0 (with its zero point,
    /// input 2) and 3; the bias is the scaled integer B (`[M]`); the result is quantized with
    /// inputs 6 and 7.
    QLinear { bias: Option<Vec<f32>> },
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
    integer_activation(graph, xq, sx, zx)
}

/// An activation `xq` (u8, static) with constant per-tensor scale `sx` and zero point `zx`:
/// `sx`, and whether there is a zero point.
fn integer_activation(graph: &Graph, xq: ValueId, sx: ValueId, zx: Option<ValueId>) -> Option<(f64, bool)> {
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
    integer_weights(graph, wq, sw, zw, Some(axis), channel_axis)
}

/// Weights `wq` with scale `sw` and zero point `zw` (`quantized_weights`); `axis` is the
/// DequantizeLinear's, None where a per-channel scale is along `channel_axis` by definition
/// (QLinearConv's `[M]`, QLinearMatMul's `[N]`).
fn integer_weights(
    graph: &Graph,
    wq: ValueId,
    sw: ValueId,
    zw: Option<ValueId>,
    axis: Option<i64>,
    channel_axis: usize,
) -> Option<(&Tensor, Vec<f64>)> {
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
    let on_axis = axis.is_none_or(|a| a.rem_euclid(rank as i64) as usize == channel_axis);
    let scale = match sw.len() {
        1 => vec![sw[0]; channels],
        len if len == channels && on_axis => sw,
        _ => return None,
    };
    Some((wt, scale))
}

/// Whether weights of shape `ws` as the integer product reads them make one the kernels
/// compute: a 4-D convolution kernel, or a 2-D `[K, N]` matrix with K in whole quads (A's rows
/// are read in place, four bytes at a time); sums of at most `MAX_EXACT_INTEGER_K` products,
/// which i32 holds exactly.
fn integer_shape(ws: &[usize], conv: bool) -> bool {
    match ws {
        [_, c, kh, kw] if conv => c * kh * kw <= MAX_EXACT_INTEGER_K,
        [k, _] if !conv => k % 4 == 0 && *k <= MAX_EXACT_INTEGER_K,
        _ => false,
    }
}

/// Positive and finite (NaN fails both).
fn usable(s: f64) -> bool {
    s > 0.0 && s.is_finite()
}

fn integer_product(graph: &Graph, node: &Node) -> Option<IntegerProduct> {
    if let Op::Quant(QuantOp::QLinearConv(_) | QuantOp::QLinearMatMul) = node.op {
        return qlinear_product(graph, node);
    }
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
    let as_read = weights.as_ref().map_or(wq.shape(), |t| t.shape());
    if !integer_shape(as_read, conv) || !usable(sx) || !sw.iter().all(|&s| usable(s)) {
        return None;
    }
    Some(IntegerProduct {
        op,
        form: Form::Dequantized { has_x_zero },
        weights,
        scale: sw.iter().map(|&s| (sx * s) as f32).collect(),
        conv,
    })
}

/// QLinearConv (2-D, dense) or QLinearMatMul (2-D weights, K in whole quads) with u8 input, s8
/// constant weights with zero zero points, constant per-tensor input and output parameters
/// and a constant B.
fn qlinear_product(graph: &Graph, node: &Node) -> Option<IntegerProduct> {
    let input = |i: usize| node.inputs.get(i).copied().flatten();
    let out = &node.outputs.first()?.ty;
    if !out.is_static() {
        return None;
    }
    let (sx, _) = integer_activation(graph, input(0)?, input(1)?, input(2))?;
    // The output's scale and zero point: constant, per tensor.
    let sy = graph.known_value(input(6)?)?;
    if sy.len() != 1 || sy.dtype() != DType::F32 || !usable(sy.to_f64_vec()[0]) {
        return None;
    }
    if input(7).is_some_and(|z| graph.known_value(z).is_none_or(|t| t.len() != 1)) {
        return None;
    }
    let conv = matches!(node.op, Op::Quant(QuantOp::QLinearConv(_)));
    let (op, channel_axis) = match &node.op {
        Op::Quant(QuantOp::QLinearConv(a)) if a.group <= 1 && !a.channels_last && out.rank() == 4 => {
            (Op::Quant(QuantOp::ConvInteger(a.clone())), 0)
        }
        Op::Quant(QuantOp::QLinearMatMul) if graph.value_type(input(0)?).rank() >= 2 => {
            (Op::Quant(QuantOp::MatMulInteger), 1)
        }
        _ => return None,
    };
    let (wq, sw) = integer_weights(graph, input(3)?, input(4)?, input(5), None, channel_axis)?;
    if !integer_shape(wq.shape(), conv) || !usable(sx) || !sw.iter().all(|&s| usable(s)) {
        return None;
    }
    let scale: Vec<f32> = sw.iter().map(|&s| (sx * s) as f32).collect();
    let bias = match input(8) {
        None => None,
        Some(b) => {
            let b = graph.known_value(b)?;
            if b.dtype() != DType::I32 || b.len() != scale.len() {
                return None;
            }
            Some(
                b.to_f64_vec()
                    .iter()
                    .zip(&scale)
                    .map(|(&b, &s)| (b * f64::from(s)) as f32)
                    .collect(),
            )
        }
    };
    Some(IntegerProduct {
        op,
        form: Form::QLinear { bias },
        weights: None,
        scale,
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

/// `Cast<f32>(Integer(xq, wq, zx)) · scale (+ bias)` in `dst`, quantized again for a QLinear
/// form; the last node keeps the product's output name.
fn emit(
    dst: &mut Graph,
    node: &Node,
    inputs: &[Option<ValueId>],
    p: &IntegerProduct,
) -> Result<ValueId, IrError> {
    let name = node.name.as_str();
    let input = |i: usize| inputs.get(i).copied().flatten();
    let missing = || IrError::Invalid(format!("{name}: an integer operand is missing"));
    // Of a float product, the integer operands are the inputs of its DequantizeLinears, already
    // copied to `dst`.
    let producer_input = |dst: &Graph, i: usize, j: usize| -> Option<ValueId> {
        dst.node(input(i)?.node).inputs.get(j).copied().flatten()
    };
    let (xq, x_zero, wq) = match p.form {
        Form::Dequantized { has_x_zero } => (
            producer_input(dst, 0, 0),
            if has_x_zero {
                producer_input(dst, 0, 2)
            } else {
                None
            },
            producer_input(dst, 1, 0),
        ),
        Form::QLinear { .. } => (input(0), input(2), input(3)),
    };
    let (xq, wq) = (xq.ok_or_else(missing)?, wq.ok_or_else(missing)?);
    let wq = match &p.weights {
        Some(t) => dst.add_const(format!("{name}_weights"), t.clone()),
        None => wq,
    };
    let step = |dst: &mut Graph, what: &str, op: Op, ins: Vec<Option<ValueId>>| {
        dst.add(format!("{name}_{what}"), op, ins, format!("{name}_{what}"))
    };
    let acc = step(dst, "integer", p.op.clone(), vec![Some(xq), Some(wq), x_zero])?;
    let accf = step(dst, "integer_f32", Op::Cast { to: DType::F32 }, vec![Some(acc)])?;
    let n = p.scale.len();
    // Per output channel: axis 1 of a convolution's `[N, M, H, W]`, the last of a product.
    let channel_shape = |n: usize| if p.conv { vec![n, 1, 1] } else { vec![n] };
    let scale = dst.add_const(
        format!("{name}_scale"),
        Tensor::from_vec(channel_shape(n), p.scale.clone()),
    );
    let bias = match &p.form {
        Form::Dequantized { .. } => match input(2) {
            // A convolution's B is `[M]`: as `[M, 1, 1]` it broadcasts over the channel axis. A
            // Gemm's C broadcasts to the result as it is.
            Some(b) if p.conv => {
                let shape = dst.add_const(
                    format!("{name}_bias_shape"),
                    Tensor::from_vec(vec![3], vec![n as i64, 1, 1]),
                );
                Some(step(
                    dst,
                    "bias",
                    Op::Reshape { allow_zero: false },
                    vec![Some(b), Some(shape)],
                )?)
            }
            other => other,
        },
        Form::QLinear { bias } => bias.as_ref().map(|b| {
            dst.add_const(
                format!("{name}_bias"),
                Tensor::from_vec(channel_shape(n), b.clone()),
            )
        }),
    };
    // The last node keeps the product's name and output name.
    let out = node.outputs[0].name.clone();
    let (mul, add) = (Op::Binary(Binary::Mul), Op::Binary(Binary::Add));
    match (&p.form, bias) {
        (Form::Dequantized { .. }, None) => dst.add(name, mul, vec![Some(accf), Some(scale)], out),
        (Form::Dequantized { .. }, Some(b)) => {
            let scaled = step(dst, "scaled", mul, vec![Some(accf), Some(scale)])?;
            dst.add(name, add, vec![Some(scaled), Some(b)], out)
        }
        (Form::QLinear { .. }, bias) => {
            let mut y = step(dst, "scaled", mul, vec![Some(accf), Some(scale)])?;
            if let Some(b) = bias {
                y = step(dst, "biased", add, vec![Some(y), Some(b)])?;
            }
            let quantize = Op::Quant(QuantOp::QuantizeLinear {
                axis: 1,
                block_size: 0,
                output_dtype: node.outputs[0].ty.dtype,
                precision: None,
            });
            dst.add(name, quantize, vec![Some(y), input(6), input(7)], out)
        }
    }
}
