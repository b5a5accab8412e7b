//! onnxruntime's quantized contrib operators, the ones its quantizer writes (`QOperator` format:
//! QLinearAdd, QGemm, QLinearGlobalAveragePool, ...; dynamic quantization's
//! DynamicQuantizeMatMul and MatMulIntegerToFloat; QAttention; the 4-bit MatMulNBits), imported
//! as their definition: dequantize the integer operands (`(q - zero_point) * scale`), apply the
//! float operator, and quantize the result again where the operator's output is quantized.
//!
//! The products and convolutions are then float products of dequantized operands (which
//! `integer-products` makes integer ones again where the target has the kernels). onnxruntime's
//! integer kernels accumulate exactly in i32 and round once, so the two agree up to the float
//! rounding of the accumulation, which can move a requantized value by one quantization step
//! where it lies within that rounding of a half-step boundary.
//!
//! Checked against onnxruntime 1.23's outputs: QGemm applies `alpha` to the bias too
//! (`alpha * a_scale * b_scale * (A·B + C)`, C an i32 bias with scale `a_scale * b_scale`);
//! MatMulNBits packs the first element of each pair in the low bits, and its zero point
//! defaults to the middle of the range (8 for 4 bits).
//!
//! MatMulNBits of 2 or 4 bits is the exception: it becomes the IR's BlockQuantizedMatMul, its
//! integers unpacked but kept, so that the weights stay 4-bit in a CPU artifact.

use super::NodeCtx;
use crate::error::Result;
use kiln_ir::{Binary, DType, Op, PoolKind, QuantOp, Tensor, Unary, ValueId};

/// The quantized `com.microsoft` operators kiln imports.
pub(super) const OPERATORS: &[&str] = &[
    "QLinearAdd",
    "QLinearMul",
    "QLinearSigmoid",
    "QLinearLeakyRelu",
    "QLinearConcat",
    "QLinearGlobalAveragePool",
    "QLinearAveragePool",
    "QGemm",
    "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat",
    "MatMulNBits",
    "QAttention",
];

pub(super) fn import(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    match cx.op_type() {
        "QLinearAdd" => qlinear_binary(cx, Binary::Add),
        "QLinearMul" => qlinear_binary(cx, Binary::Mul),
        "QLinearSigmoid" => qlinear_unary(cx, Unary::Sigmoid),
        "QLinearLeakyRelu" => {
            let alpha = cx.attr_f("alpha", 0.01);
            qlinear_unary(cx, Unary::LeakyRelu { alpha })
        }
        "QLinearConcat" => qlinear_concat(cx),
        "QLinearGlobalAveragePool" => qlinear_pool(cx, true),
        "QLinearAveragePool" => qlinear_pool(cx, false),
        "QGemm" => qgemm(cx),
        "DynamicQuantizeMatMul" => dynamic_quantize_matmul(cx),
        "MatMulIntegerToFloat" => matmul_integer_to_float(cx),
        "MatMulNBits" => matmul_nbits(cx),
        "QAttention" => qattention(cx),
        other => Err(cx.err(format!(
            "{other} is not a quantized contrib operator kiln imports"
        ))),
    }
}

/// `(x - zero_point) * scale` with per-tensor parameters, or per-slice along `axis` when the
/// scale has more than one element.
fn dequantize(
    cx: &mut NodeCtx,
    x: ValueId,
    scale: ValueId,
    zero_point: Option<ValueId>,
    axis: i64,
) -> Result<ValueId> {
    let op = Op::Quant(QuantOp::DequantizeLinear {
        axis,
        block_size: 0,
        output_dtype: None,
    });
    cx.add_aux1(op, vec![Some(x), Some(scale), zero_point])
}

/// Dequantized input `x` with its scale and optional zero point (input indices), per tensor.
fn dequantized_input(cx: &mut NodeCtx, x: usize, scale: usize, zero_point: usize) -> Result<ValueId> {
    let (xv, s) = (cx.input(x)?, cx.input(scale)?);
    let zp = cx.opt_input(zero_point);
    dequantize(cx, xv, s, zp, 1)
}

/// The node's output: `v` quantized with the scale and optional zero point at input indices
/// `scale` and `zero_point`, into the zero point's dtype or, without one, `dtype`.
fn quantized_output(
    cx: &mut NodeCtx,
    v: ValueId,
    scale: usize,
    zero_point: usize,
    dtype: DType,
) -> Result<ValueId> {
    let s = cx.input(scale)?;
    let zp = cx.opt_input(zero_point);
    let output_dtype = zp.map_or(dtype, |z| cx.ty(z).dtype);
    let op = Op::Quant(QuantOp::QuantizeLinear {
        axis: 1,
        block_size: 0,
        output_dtype,
        precision: None,
    });
    cx.add1(op, vec![Some(v), Some(s), zp])
}

/// QLinearAdd, QLinearMul (inputs A, A_scale, A_zero_point?, B, B_scale, B_zero_point?,
/// C_scale, C_zero_point?): the output has A's integer dtype.
fn qlinear_binary(cx: &mut NodeCtx, op: Binary) -> Result<Vec<ValueId>> {
    let a = dequantized_input(cx, 0, 1, 2)?;
    let b = dequantized_input(cx, 3, 4, 5)?;
    let dtype = cx.ty(cx.input(0)?).dtype;
    let y = cx.add_aux1(Op::Binary(op), vec![Some(a), Some(b)])?;
    Ok(vec![quantized_output(cx, y, 6, 7, dtype)?])
}

/// QLinearSigmoid, QLinearLeakyRelu (inputs X, X_scale, X_zero_point?, Y_scale, Y_zero_point?).
fn qlinear_unary(cx: &mut NodeCtx, op: Unary) -> Result<Vec<ValueId>> {
    let x = dequantized_input(cx, 0, 1, 2)?;
    let dtype = cx.ty(cx.input(0)?).dtype;
    let y = cx.add_aux1(Op::Unary(op), vec![Some(x)])?;
    Ok(vec![quantized_output(cx, y, 3, 4, dtype)?])
}

/// QLinearConcat (inputs Y_scale, Y_zero_point, then (X, X_scale, X_zero_point) per operand).
fn qlinear_concat(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    if !cx.has_attr("axis") {
        return Err(cx.err("attribute 'axis' is required"));
    }
    let operands = cx.num_inputs().saturating_sub(2);
    if operands == 0 || !operands.is_multiple_of(3) {
        return Err(cx.err(format!(
            "QLinearConcat takes Y_scale, Y_zero_point and (X, X_scale, X_zero_point) triples; got {} inputs",
            cx.num_inputs()
        )));
    }
    let parts = (0..operands / 3)
        .map(|i| dequantized_input(cx, 2 + 3 * i, 3 + 3 * i, 4 + 3 * i).map(Some))
        .collect::<Result<Vec<_>>>()?;
    let y = cx.add_aux1(
        Op::Concat {
            axis: cx.attr_i("axis", 0),
        },
        parts,
    )?;
    let dtype = cx.ty(cx.input(2)?).dtype;
    Ok(vec![quantized_output(cx, y, 0, 1, dtype)?])
}

/// QLinearGlobalAveragePool and QLinearAveragePool (inputs X, x_scale, x_zero_point?, y_scale,
/// y_zero_point?); `channels_last` says X is `[N, spatial..., C]`, pooled as the channels-first
/// operator between two transposes.
fn qlinear_pool(cx: &mut NodeCtx, global: bool) -> Result<Vec<ValueId>> {
    let channels_last = cx.attr_flag("channels_last", false)?;
    let mut x = dequantized_input(cx, 0, 1, 2)?;
    let rank = cx.ty(x).rank();
    if rank < 3 {
        return Err(cx.err(format!("X must have rank 3 or more, got {rank}")));
    }
    // [N, spatial..., C] -> [N, C, spatial...] and back.
    let to_first: Vec<usize> = [0, rank - 1].into_iter().chain(1..rank - 1).collect();
    let to_last: Vec<usize> = [0].into_iter().chain(2..rank).chain([1]).collect();
    if channels_last {
        x = cx.add_aux1(Op::Transpose { perm: to_first }, vec![Some(x)])?;
    }
    let mut y = if global {
        let average = PoolKind::Average {
            count_include_pad: false,
        };
        cx.add_aux1(Op::GlobalPool(average), vec![Some(x)])?
    } else {
        let attrs = super::conv::pool_attrs(cx)?;
        cx.add_aux1(Op::Pool(attrs), vec![Some(x)])?
    };
    if channels_last {
        y = cx.add_aux1(Op::Transpose { perm: to_last }, vec![Some(y)])?;
    }
    let dtype = cx.ty(cx.input(0)?).dtype;
    Ok(vec![quantized_output(cx, y, 3, 4, dtype)?])
}

/// The axis of B's per-column scale: B's last axis, or its first when the product reads B
/// transposed (`[N, K]`).
fn column_axis(cx: &NodeCtx, b: ValueId, transposed: bool) -> i64 {
    if transposed {
        0
    } else {
        cx.ty(b).rank() as i64 - 1
    }
}

/// Dequantized B of a product with its scale and zero point at input indices (per column when
/// the scale has N elements).
fn dequantized_weights(
    cx: &mut NodeCtx,
    b: usize,
    scale: usize,
    zero_point: usize,
    transposed: bool,
) -> Result<ValueId> {
    let bv = cx.input(b)?;
    let axis = column_axis(cx, bv, transposed);
    let s = cx.input(scale)?;
    let zp = cx.opt_input(zero_point);
    dequantize(cx, bv, s, zp, axis)
}

/// QGemm (inputs A, a_scale, a_zero_point, B, b_scale, b_zero_point, C?, y_scale?,
/// y_zero_point?): `alpha * a_scale * b_scale * (A·B + C)` with C an i32 bias, quantized when
/// y_scale is given, float otherwise.
fn qgemm(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let trans_b = cx.attr_i("transB", 0) != 0;
    let a = dequantized_input(cx, 0, 1, 2)?;
    let b = dequantized_weights(cx, 3, 4, 5, trans_b)?;
    let alpha = cx.attr_f("alpha", 1.0);
    // C's scale is a_scale * b_scale (per column with B's), its zero point 0.
    let c = match cx.opt_input(6) {
        None => None,
        Some(c) => {
            let (a_scale, b_scale) = (cx.input(1)?, cx.input(4)?);
            let scale = cx.add_aux1(Op::Binary(Binary::Mul), vec![Some(a_scale), Some(b_scale)])?;
            let c = cx.add_aux1(Op::Cast { to: DType::F32 }, vec![Some(c)])?;
            Some(cx.add_aux1(Op::Binary(Binary::Mul), vec![Some(c), Some(scale)])?)
        }
    };
    let gemm = Op::Gemm {
        alpha,
        beta: alpha,
        trans_a: cx.attr_i("transA", 0) != 0,
        trans_b,
    };
    match cx.opt_input(7) {
        None => Ok(vec![cx.add1(gemm, vec![Some(a), Some(b), c])?]),
        Some(_) => {
            let y = cx.add_aux1(gemm, vec![Some(a), Some(b), c])?;
            Ok(vec![quantized_output(cx, y, 7, 8, DType::U8)?])
        }
    }
}

/// `product + bias` (input index `bias`, optional).
fn with_bias(cx: &mut NodeCtx, product: ValueId, bias: usize) -> Result<Vec<ValueId>> {
    match cx.opt_input(bias) {
        None => Ok(vec![product]),
        Some(b) => Ok(vec![
            cx.add1(Op::Binary(Binary::Add), vec![Some(product), Some(b)])?
        ]),
    }
}

/// The product's value (the node's output when there is no bias).
fn product(cx: &mut NodeCtx, a: ValueId, b: ValueId, bias: usize) -> Result<Vec<ValueId>> {
    product_op(cx, Op::MatMul, vec![Some(a), Some(b)], bias)
}

/// `op` of `inputs` plus the node's input `bias` when present.
fn product_op(cx: &mut NodeCtx, op: Op, inputs: Vec<Option<ValueId>>, bias: usize) -> Result<Vec<ValueId>> {
    let p = if cx.opt_input(bias).is_some() {
        cx.add_aux1(op, inputs)?
    } else {
        cx.add1(op, inputs)?
    };
    with_bias(cx, p, bias)
}

/// DynamicQuantizeMatMul (inputs A float, B, b_scale, b_zero_point?, bias?): A quantized to u8
/// with its own range (DynamicQuantizeLinear) times B dequantized, plus bias.
fn dynamic_quantize_matmul(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let a = cx.input(0)?;
    let q = cx.add_aux(Op::Quant(QuantOp::DynamicQuantizeLinear), vec![Some(a)], 3)?;
    let a = dequantize(cx, q[0], q[1], Some(q[2]), 1)?;
    let b = dequantized_weights(cx, 1, 2, 3, false)?;
    product(cx, a, b, 4)
}

/// MatMulIntegerToFloat (inputs A, B, a_scale, b_scale, a_zero_point?, b_zero_point?, bias?).
fn matmul_integer_to_float(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let a = dequantized_input(cx, 0, 2, 4)?;
    let b = dequantized_weights(cx, 1, 3, 5, false)?;
    product(cx, a, b, 6)
}

/// QAttention (inputs input, weight, bias, input_scale, weight_scale, mask_index?,
/// input_zero_point?, weight_zero_point?, past?): Attention on the dequantized input and
/// weights (the weights' scale and zero point per tensor or per column), without a KV cache.
fn qattention(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    if cx.opt_input(8).is_some() || cx.output_is_named(1) {
        return Err(cx.err("past and present (a KV cache) are not supported"));
    }
    let x = dequantized_input(cx, 0, 3, 6)?;
    let w = dequantized_weights(cx, 1, 4, 7, false)?;
    let bias = cx.input(2)?;
    let y = super::contrib::packed_attention(cx, x, w, Some(bias), cx.opt_input(5), None)?;
    Ok(vec![y; cx.num_outputs()])
}

/// MatMulNBits (inputs A, B, scales, zero_points?, g_idx?, bias?; attributes K, N, bits,
/// block_size): `A · Wᵀ` with W `[N, K]` stored as `bits`-bit integers in blocks of
/// `block_size` along K, each block with its own scale and zero point. B is
/// `[N, blocks, block_size * bits / 8]` bytes, the first element of a byte in its low bits; the
/// zero points are packed the same way per row (or are float, one per block); the default zero
/// point is `2^(bits-1)`.
fn matmul_nbits(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let bits = cx.attr_i("bits", 4);
    if !matches!(bits, 2 | 4 | 8) {
        return Err(cx.err(format!("bits must be 2, 4 or 8, got {bits}")));
    }
    let bits = bits as usize;
    let positive = |cx: &NodeCtx, name: &str| -> Result<usize> {
        match cx.attr_opt_i(name) {
            Some(v) if v > 0 => Ok(v as usize),
            Some(v) => Err(cx.err(format!("attribute '{name}' must be positive, got {v}"))),
            None => Err(cx.err(format!("attribute '{name}' is required"))),
        }
    };
    let (k, n, block) = (
        positive(cx, "K")?,
        positive(cx, "N")?,
        positive(cx, "block_size")?,
    );
    if block < 16 || !block.is_power_of_two() {
        return Err(cx.err(format!(
            "block_size must be a power of 2 and at least 16, got {block}"
        )));
    }
    if cx.opt_input(4).is_some() {
        return Err(cx.err("g_idx (an activation-order permutation of K) is not supported"));
    }
    let blocks = k.div_ceil(block);
    let per_byte = 8 / bits;
    let packed = cx.input(1)?;
    let b = cx
        .known(packed)
        .ok_or_else(|| cx.err("B must be a constant (an initializer)"))?;
    let blob = block / per_byte;
    if b.dtype() != DType::U8 || b.len() != n * blocks * blob {
        return Err(cx.err(format!(
            "B must be uint8 [{n}, {blocks}, {blob}] for N={n}, K={k}, block_size={block}, bits={bits}; got {} {:?}",
            b.dtype(),
            b.shape()
        )));
    }
    let weights = unpack(b.as_slice::<u8>().unwrap_or_default(), bits, n * blocks * block);
    let scales = cx.input(2)?;
    let scale_type = cx.ty(scales).clone();
    if scale_type.fixed_shape().map(|s| s.iter().product::<usize>()) != Some(n * blocks) {
        return Err(cx.err(format!("scales must have N × blocks = {} elements", n * blocks)));
    }
    let shape = cx.const_i64s(&[n as i64, blocks as i64]);
    let scales = cx.add_aux1(Op::Reshape { allow_zero: false }, vec![Some(scales), Some(shape)])?;
    let zero_points = match cx.opt_input(3) {
        None => None,
        Some(z) if cx.ty(z).dtype == DType::U8 => {
            let zt = cx
                .known(z)
                .ok_or_else(|| cx.err("zero_points must be a constant (an initializer)"))?;
            let row = (blocks * bits).div_ceil(8);
            if zt.len() != n * row {
                return Err(cx.err(format!(
                    "uint8 zero_points must have N × {row} = {} bytes",
                    n * row
                )));
            }
            let bytes = zt.as_slice::<u8>().unwrap_or_default().to_vec();
            let unpacked: Vec<u8> = bytes.chunks(row).flat_map(|r| unpack(r, bits, blocks)).collect();
            Some(cx.constant(Tensor::from_vec(vec![n, blocks], unpacked)))
        }
        Some(_) => return Err(cx.err("float zero_points are not supported (only uint8, packed like B)")),
    };
    let zero_points = zero_points.unwrap_or_else(|| {
        let middle = 1u8 << (bits - 1);
        cx.constant(Tensor::from_vec(vec![n, blocks], vec![middle; n * blocks]))
    });
    if bits <= 4 {
        // The weights stay integers (their padding past K cut): the CPU's GEMM stores and reads
        // them as nibbles; other targets dequantize them (`dequantize-weights`).
        let q: Vec<u8> = weights
            .chunks_exact(blocks * block)
            .flat_map(|row| row[..k].iter().copied())
            .collect();
        let q = cx.constant(Tensor::from_vec(vec![n, k], q));
        let op = Op::Quant(QuantOp::BlockQuantizedMatMul {
            bits: bits as u32,
            block_size: block,
        });
        let a = cx.input(0)?;
        return product_op(cx, op, vec![Some(a), Some(q), Some(scales), Some(zero_points)], 5);
    }
    let weights = cx.constant(Tensor::from_vec(vec![n, blocks * block], weights));
    let dq = Op::Quant(QuantOp::DequantizeLinear {
        axis: 1,
        block_size: block,
        output_dtype: None,
    });
    let mut w = cx.add_aux1(dq, vec![Some(weights), Some(scales), Some(zero_points)])?;
    if blocks * block != k {
        // The last block is padded past K.
        let (starts, ends, axes) = (
            cx.const_i64s(&[0]),
            cx.const_i64s(&[k as i64]),
            cx.const_i64s(&[1]),
        );
        w = cx.add_aux1(Op::Slice, vec![Some(w), Some(starts), Some(ends), Some(axes)])?;
    }
    let wt = cx.add_aux1(Op::Transpose { perm: vec![1, 0] }, vec![Some(w)])?;
    let a = cx.input(0)?;
    product(cx, a, wt, 5)
}

/// The first `count` `bits`-bit unsigned values of `packed`, low bits first in each byte.
fn unpack(packed: &[u8], bits: usize, count: usize) -> Vec<u8> {
    let per_byte = 8 / bits;
    let mask = ((1u16 << bits) - 1) as u8;
    packed
        .iter()
        .flat_map(|&byte| (0..per_byte).map(move |i| (byte >> (i * bits)) & mask))
        .take(count)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::elementwise::testing::*;
    use super::super::MICROSOFT_DOMAIN;
    use super::unpack;
    use crate::onnx::proto::data_type as dt;

    fn refusal(
        op: &str,
        inputs: Vec<crate::onnx::proto::ValueInfoProto>,
        attrs: Vec<crate::onnx::proto::AttributeProto>,
    ) -> String {
        import_node_in(MICROSOFT_DOMAIN, op, inputs, attrs, vec!["y".into()], 17)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn matmul_nbits_refuses_what_it_cannot_unpack() {
        let ins = || {
            vec![
                input(0, dt::FLOAT, &[2, 32]),
                input(1, dt::UINT8, &[4, 2, 8]),
                input(2, dt::FLOAT, &[8]),
            ]
        };
        let attrs = |bits: i64| {
            vec![
                attr_i("K", 32),
                attr_i("N", 4),
                attr_i("block_size", 16),
                attr_i("bits", bits),
            ]
        };
        let err = refusal("MatMulNBits", ins(), attrs(3));
        assert!(err.contains("bits must be 2, 4 or 8"), "{err}");
        // A graph input, not an initializer: the weights must be known to unpack them.
        let err = refusal("MatMulNBits", ins(), attrs(4));
        assert!(err.contains("B must be a constant"), "{err}");
        let err = refusal(
            "MatMulNBits",
            ins(),
            vec![attr_i("N", 4), attr_i("block_size", 16)],
        );
        assert!(err.contains("'K' is required"), "{err}");
    }

    #[test]
    fn qlinear_concat_needs_whole_triples() {
        let ins = vec![
            input(0, dt::FLOAT, &[]),
            input(1, dt::UINT8, &[]),
            input(2, dt::UINT8, &[1, 4]),
            input(3, dt::FLOAT, &[]),
        ];
        let err = refusal("QLinearConcat", ins, vec![attr_i("axis", 1)]);
        assert!(err.contains("triples"), "{err}");
    }

    #[test]
    fn unpacks_low_bits_first() {
        assert_eq!(unpack(&[0x21, 0xf3], 4, 4), vec![1, 2, 3, 15]);
        assert_eq!(unpack(&[0b11_10_01_00], 2, 4), vec![0, 1, 2, 3]);
        assert_eq!(unpack(&[7, 200], 8, 2), vec![7, 200]);
        assert_eq!(unpack(&[0x21, 0xf3], 4, 3), vec![1, 2, 3]);
    }
}
