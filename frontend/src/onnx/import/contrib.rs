//! onnxruntime's contrib operators that its tools write into models (the transformer optimizer
//! fuses exported graphs into them), imported as compositions of the IR's own operators.
//!
//! Semantics follow onnxruntime's contrib-operator documentation, checked against onnxruntime
//! 1.23's outputs (the defaults below are those it applies: `SkipLayerNormalization` and
//! `SkipSimplifiedLayerNormalization` normalize with epsilon 1e-12 and include the bias in
//! `input_skip_bias_sum`; `SimplifiedLayerNormalization`, which onnxruntime registers in the
//! default domain, uses 1e-5).

use super::NodeCtx;
use crate::error::Result;
use kiln_ir::{AttentionAttrs, Binary, DType, MiscOp, Op, ReduceKind, Tensor, Unary, ValueId};

/// The `com.microsoft` operators imported here.
pub(super) const OPERATORS: &[&str] = &[
    "Gelu",
    "FastGelu",
    "BiasGelu",
    "QuickGelu",
    "BiasAdd",
    "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "SimplifiedLayerNormalization",
    "FusedMatMul",
    "Attention",
    "EmbedLayerNormalization",
    "MultiHeadAttention",
    "FusedConv",
];

/// Operators outside the ONNX standard that onnxruntime registers in the default domain.
pub(super) const DEFAULT_DOMAIN_EXTENSIONS: &[&str] = &["SimplifiedLayerNormalization"];

/// onnxruntime's epsilon for the skip normalizations when the attribute is absent.
const SKIP_NORM_EPSILON: f32 = 1e-12;

pub(super) fn import(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    match cx.op_type() {
        "Gelu" => {
            let y = cx.add1(Op::Unary(Unary::Gelu { tanh: false }), vec![Some(cx.input(0)?)])?;
            Ok(vec![y])
        }
        // Gelu's tanh approximation of `x + bias`.
        "FastGelu" => {
            let x = with_bias(cx, 0, 1)?;
            Ok(vec![
                cx.add1(Op::Unary(Unary::Gelu { tanh: true }), vec![Some(x)])?
            ])
        }
        // Gelu (erf form) of `A + B`.
        "BiasGelu" => {
            let x = with_bias(cx, 0, 1)?;
            Ok(vec![
                cx.add1(Op::Unary(Unary::Gelu { tanh: false }), vec![Some(x)])?
            ])
        }
        // `x * sigmoid(alpha * x)`: ONNX's Swish.
        "QuickGelu" => {
            let alpha = cx.attr_f("alpha", 1.702);
            Ok(vec![cx.add1(
                Op::Unary(Unary::Swish { alpha }),
                vec![Some(cx.input(0)?)],
            )?])
        }
        // `X + bias + skip`.
        "BiasAdd" => {
            let xb = with_bias(cx, 0, 1)?;
            let skip = cx.input(2)?;
            Ok(vec![cx.add1(Op::Binary(Binary::Add), vec![Some(xb), Some(skip)])?])
        }
        "SkipLayerNormalization" => skip_norm(cx, false),
        "SkipSimplifiedLayerNormalization" => skip_norm(cx, true),
        "SimplifiedLayerNormalization" => {
            refuse_outputs_from(cx, 1, "inv_std_var")?;
            let op = rms_norm(cx, cx.attr_i("axis", -1), cx.attr_f("epsilon", 1e-5))?;
            let y = cx.add1(op, vec![Some(cx.input(0)?), Some(cx.input(1)?)])?;
            Ok(vec![y; cx.num_outputs()])
        }
        "FusedMatMul" => fused_matmul(cx),
        "Attention" => attention(cx),
        "EmbedLayerNormalization" => embed_layer_norm(cx),
        "MultiHeadAttention" => multi_head_attention(cx),
        "FusedConv" => fused_conv(cx),
        other => Err(cx.err(format!("{other} is not a contrib operator kiln imports"))),
    }
}

/// Input `x` plus the optional input `bias` (just `x` when it is absent).
fn with_bias(cx: &mut NodeCtx, x: usize, bias: usize) -> Result<ValueId> {
    let xv = cx.input(x)?;
    match cx.opt_input(bias) {
        None => Ok(xv),
        Some(b) => cx.add_aux1(Op::Binary(Binary::Add), vec![Some(xv), Some(b)]),
    }
}

/// Outputs from `first` on are the training statistics kiln does not compute: refused when
/// the model reads them.
fn refuse_outputs_from(cx: &NodeCtx, first: usize, what: &str) -> Result<()> {
    let node_outputs = (first..cx.num_outputs()).filter(|&i| cx.output_is_named(i));
    match node_outputs.min() {
        None => Ok(()),
        Some(i) => Err(cx.err(format!(
            "output {i} ({what}) is a training statistic kiln does not compute; leave it unnamed"
        ))),
    }
}

fn rms_norm(cx: &NodeCtx, axis: i64, epsilon: f32) -> Result<Op> {
    Ok(Op::Misc(MiscOp::RmsNorm {
        axis,
        epsilon,
        stash_type: super::norm::stash_type(cx)?,
    }))
}

/// `SkipLayerNormalization` (inputs input, skip, gamma, beta?, bias?) and
/// `SkipSimplifiedLayerNormalization` (input, skip, gamma, bias?): the sum `input + skip + bias`
/// normalized over the last axis. Outputs: output, mean and inv_std_var (not computed),
/// input_skip_bias_sum.
fn skip_norm(cx: &mut NodeCtx, rms: bool) -> Result<Vec<ValueId>> {
    if (1..cx.num_outputs().min(3)).any(|i| cx.output_is_named(i)) {
        return Err(cx.err(
            "outputs 1 and 2 (mean, inv_std_var) are training statistics kiln does not compute; leave them unnamed",
        ));
    }
    let epsilon = cx.attr_f("epsilon", SKIP_NORM_EPSILON);
    let (x, skip, gamma) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
    let (beta, bias) = if rms {
        (None, cx.opt_input(3))
    } else {
        (cx.opt_input(3), cx.opt_input(4))
    };
    let mut sum = cx.add_aux1(Op::Binary(Binary::Add), vec![Some(x), Some(skip)])?;
    if let Some(b) = bias {
        sum = cx.add_aux1(Op::Binary(Binary::Add), vec![Some(sum), Some(b)])?;
    }
    let y = if rms {
        let op = rms_norm(cx, -1, epsilon)?;
        cx.add1(op, vec![Some(sum), Some(gamma)])?
    } else {
        let op = Op::LayerNorm {
            axis: -1,
            epsilon,
            stash_type: DType::F32,
        };
        cx.add1(op, vec![Some(sum), Some(gamma), beta])?
    };
    let mut outs = vec![y; cx.num_outputs()];
    if let Some(last) = outs.get_mut(3) {
        *last = sum;
    }
    Ok(outs)
}

/// `alpha * op(A) @ op(B)`, `op` transposing the last two axes where `transA`/`transB` say.
fn fused_matmul(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    for attr in ["transBatchA", "transBatchB"] {
        if cx.attr_i(attr, 0) != 0 {
            return Err(cx.err(format!("{attr} is not supported")));
        }
    }
    let a = transposed_last_two(cx, 0, "transA")?;
    let b = transposed_last_two(cx, 1, "transB")?;
    let alpha = cx.attr_f("alpha", 1.0);
    if alpha == 1.0 {
        return Ok(vec![cx.add1(Op::MatMul, vec![Some(a), Some(b)])?]);
    }
    let product = cx.add_aux1(Op::MatMul, vec![Some(a), Some(b)])?;
    let dtype = cx.ty(product).dtype;
    let scale = cx.constant(Tensor::scalar(alpha).cast(dtype));
    Ok(vec![cx.add1(
        Op::Binary(Binary::Mul),
        vec![Some(product), Some(scale)],
    )?])
}

/// Input `i`, with its last two axes swapped when attribute `flag` is set.
fn transposed_last_two(cx: &mut NodeCtx, i: usize, flag: &str) -> Result<ValueId> {
    let v = cx.input(i)?;
    if cx.attr_i(flag, 0) == 0 {
        return Ok(v);
    }
    let rank = cx.ty(v).rank();
    if rank < 2 {
        return Err(cx.err(format!("{flag} needs an operand of rank 2 or more")));
    }
    let mut perm: Vec<usize> = (0..rank).collect();
    perm.swap(rank - 2, rank - 1);
    cx.add_aux1(Op::Transpose { perm }, vec![Some(v)])
}

/// `com.microsoft` Attention without a KV cache: the packed projection `input @ weights + bias`
/// split into Q, K and V (`qkv_hidden_sizes`, equal thirds by default), then the IR's
/// multi-head Attention on the 3-D heads-packed operands. A 2-D (`[batch, total_sequence]`) or
/// 3-D (`[batch, sequence, total_sequence]`) `mask_index` of 1s and 0s adds
/// `mask_filter_value` (default -10000) to the scores of the 0 positions, as onnxruntime does;
/// `attention_bias` is added as well; `unidirectional` is the causal mask.
fn attention(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    if cx.opt_input(4).is_some() || cx.opt_input(6).is_some() || cx.output_is_named(1) {
        return Err(cx.err("past and present (a KV cache) are not supported"));
    }
    let (x, w) = (cx.input(0)?, cx.input(1)?);
    let y = packed_attention(cx, x, w, cx.opt_input(2), cx.opt_input(3), cx.opt_input(5))?;
    Ok(vec![y; cx.num_outputs()])
}

/// Attention's computation (also QAttention's, on its dequantized operands): the packed
/// projection `x · w (+ bias)` split into Q, K and V by `qkv_hidden_sizes`, then
/// `heads_attention` with the mask and attention bias.
pub(super) fn packed_attention(
    cx: &mut NodeCtx,
    x: ValueId,
    w: ValueId,
    bias: Option<ValueId>,
    mask: Option<ValueId>,
    attention_bias: Option<ValueId>,
) -> Result<ValueId> {
    let heads = cx.attr_positive("num_heads")?;
    if cx.attr_i("do_rotary", 0) != 0 {
        return Err(cx.err("do_rotary is not supported"));
    }
    let total = match cx.ty(w).fixed_shape().as_deref() {
        Some([_, total]) => *total,
        _ => return Err(cx.err("weights must be a 2-D tensor of known shape")),
    };
    let sizes: Vec<usize> = match cx.attr_ints("qkv_hidden_sizes") {
        Some(v) if v.len() == 3 && v.iter().all(|&d| d > 0) => v.iter().map(|&d| d as usize).collect(),
        Some(v) => return Err(cx.err(format!("qkv_hidden_sizes must be 3 positive sizes, got {v:?}"))),
        None if total % 3 == 0 => vec![total / 3; 3],
        None => return Err(cx.err(format!("weights' {total} columns do not split into Q, K and V"))),
    };
    if sizes.iter().sum::<usize>() != total || sizes[0] != sizes[1] || sizes.iter().any(|s| s % heads != 0) {
        return Err(cx.err(format!(
            "qkv_hidden_sizes {sizes:?} must give Q and K one size, sum to the weights' {total} columns and divide into {heads} heads"
        )));
    }
    let mut qkv = cx.add_aux1(Op::MatMul, vec![Some(x), Some(w)])?;
    if let Some(b) = bias {
        qkv = cx.add_aux1(Op::Binary(Binary::Add), vec![Some(qkv), Some(b)])?;
    }
    let mut start = 0;
    let mut parts = vec![];
    for size in &sizes {
        let starts = cx.const_i64s(&[start as i64]);
        let ends = cx.const_i64s(&[(start + size) as i64]);
        let axes = cx.const_i64s(&[-1]);
        parts.push(cx.add_aux1(Op::Slice, vec![Some(qkv), Some(starts), Some(ends), Some(axes)])?);
        start += size;
    }
    heads_attention(cx, heads, [parts[0], parts[1], parts[2]], x, mask, attention_bias)
}

/// The IR's multi-head Attention on 3-D `[q, k, v]` with the contrib operators' masks: the
/// `mask_index`/`key_padding_mask` (`mask`, batch and key length read from `keys`) and the
/// additive `attention_bias`; `unidirectional` and `scale` from the node's attributes.
fn heads_attention(
    cx: &mut NodeCtx,
    heads: usize,
    qkv: [ValueId; 3],
    keys: ValueId,
    mask: Option<ValueId>,
    attention_bias: Option<ValueId>,
) -> Result<ValueId> {
    let dtype = cx.ty(qkv[0]).dtype;
    let mut mask = match mask {
        None => None,
        Some(m) => Some(additive_mask(cx, m, keys, dtype)?),
    };
    if let Some(bias) = attention_bias {
        mask = Some(match mask {
            None => bias,
            Some(m) => cx.add_aux1(Op::Binary(Binary::Add), vec![Some(m), Some(bias)])?,
        });
    }
    let attrs = AttentionAttrs {
        is_causal: cx.attr_i("unidirectional", 0) != 0,
        q_num_heads: heads,
        kv_num_heads: heads,
        qk_matmul_output_mode: 0,
        scale: cx.attr_opt_f("scale"),
        softcap: 0.0,
        softmax_precision: None,
        left_window_size: -1,
        right_window_size: -1,
    };
    let inputs = vec![Some(qkv[0]), Some(qkv[1]), Some(qkv[2]), mask];
    cx.add1(Op::Attention(attrs), inputs)
}

/// `com.microsoft` MultiHeadAttention with separate 3-D query, key and value (`[batch,
/// sequence, hidden]`) and no KV cache: the optional packed `bias` (query, key, value parts)
/// added, then the IR's multi-head Attention with the `key_padding_mask` and `attention_bias`.
fn multi_head_attention(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let heads = cx.attr_positive("num_heads")?;
    if (6..10).any(|i| cx.opt_input(i).is_some()) || cx.output_is_named(1) || cx.output_is_named(2) {
        return Err(cx.err("past and present (a KV cache) are not supported"));
    }
    let (q, k, v) = (cx.input(0)?, cx.opt_input(1), cx.opt_input(2));
    let (Some(k), Some(v)) = (k, v) else {
        return Err(cx.err("packed query/key/value are not supported: give key and value as inputs"));
    };
    if [q, k, v].iter().any(|&t| cx.ty(t).rank() != 3) {
        return Err(cx.err("query, key and value must be 3-D [batch, sequence, hidden] (the 4-D and packed forms are not supported)"));
    }
    let mut qkv = [q, k, v];
    if let Some(bias) = cx.opt_input(3) {
        let widths: Vec<usize> = qkv
            .iter()
            .map(|&t| cx.ty(t).fixed_shape().map(|s| s[2]))
            .collect::<Option<_>>()
            .ok_or_else(|| cx.err("a bias needs query, key and value of known hidden sizes"))?;
        let mut start = 0;
        for (t, width) in qkv.iter_mut().zip(widths) {
            let starts = cx.const_i64s(&[start as i64]);
            let ends = cx.const_i64s(&[(start + width) as i64]);
            let part = cx.add_aux1(Op::Slice, vec![Some(bias), Some(starts), Some(ends)])?;
            *t = cx.add_aux1(Op::Binary(Binary::Add), vec![Some(*t), Some(part)])?;
            start += width;
        }
    }
    let y = heads_attention(cx, heads, qkv, k, cx.opt_input(4), cx.opt_input(5))?;
    Ok(vec![y; cx.num_outputs()])
}

/// `com.microsoft` FusedConv: `activation(Conv(X, W, B) + Z)`, the activation named by the
/// `activation` attribute with its `activation_params` (Relu, Tanh, Sigmoid, LeakyRelu [alpha],
/// HardSigmoid [alpha, beta], Clip [min, max]).
fn fused_conv(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let attrs = super::conv::conv_attrs(cx)?;
    let inputs = vec![Some(cx.input(0)?), Some(cx.input(1)?), cx.opt_input(2)];
    let mut y = cx.add_aux1(Op::Conv(attrs), inputs)?;
    if let Some(z) = cx.opt_input(3) {
        y = cx.add_aux1(Op::Binary(Binary::Add), vec![Some(y), Some(z)])?;
    }
    let params = cx.attr_floats("activation_params").unwrap_or_default();
    let param = |i: usize, default: f32| params.get(i).copied().unwrap_or(default);
    let activation = cx.attr_s("activation", "");
    let op = match activation.as_str() {
        "" | "Identity" => Op::Identity,
        "Relu" => Op::Unary(Unary::Relu),
        "Tanh" => Op::Unary(Unary::Tanh),
        "Sigmoid" => Op::Unary(Unary::Sigmoid),
        "LeakyRelu" => Op::Unary(Unary::LeakyRelu {
            alpha: param(0, 0.01),
        }),
        "HardSigmoid" => Op::Unary(Unary::HardSigmoid {
            alpha: param(0, 0.2),
            beta: param(1, 0.5),
        }),
        "Clip" => {
            let dtype = cx.ty(y).dtype;
            let lo = cx.constant(Tensor::scalar(param(0, f32::MIN)).cast(dtype));
            let hi = cx.constant(Tensor::scalar(param(1, f32::MAX)).cast(dtype));
            return Ok(vec![cx.add1(Op::Clip, vec![Some(y), Some(lo), Some(hi)])?]);
        }
        other => return Err(cx.err(format!("activation '{other}' is not supported"))),
    };
    Ok(vec![cx.add1(op, vec![Some(y)])?])
}

/// `mask_index` as the scores' additive mask, broadcast over the heads:
/// `(1 - keep) * mask_filter_value`, shaped `[batch, 1, 1 or sequence, total_sequence]`. `keep`
/// is the 2-D or 3-D mask of 1s and 0s itself, or, for a 1-D mask of per-batch lengths (what
/// EmbedLayerNormalization writes), 1 for the key positions before the length.
fn additive_mask(cx: &mut NodeCtx, mask: ValueId, x: ValueId, dtype: DType) -> Result<ValueId> {
    let rank = cx.ty(mask).rank();
    let batch = cx.ty(x).fixed_shape().map(|s| s[0]);
    let axes: &[i64] = match rank {
        1 if cx.ty(mask).fixed_shape().map(|s| s[0]) == batch => &[1, 2],
        2 => &[1, 2],
        3 => &[1],
        _ => {
            return Err(cx.err(format!(
                "a mask_index of rank {rank} (start and end positions, or a 4-D mask) is not supported; sequence lengths or a 2-D or 3-D mask of 1s and 0s are"
            )))
        }
    };
    let filter = cx.attr_f("mask_filter_value", -10000.0);
    let keep = if rank == 1 {
        lengths_to_mask(cx, mask, x)?
    } else {
        mask
    };
    let m = cx.add_aux1(Op::Cast { to: dtype }, vec![Some(keep)])?;
    let one = cx.constant(Tensor::scalar(1.0f32).cast(dtype));
    let off = cx.add_aux1(Op::Binary(Binary::Sub), vec![Some(one), Some(m)])?;
    let filter = cx.constant(Tensor::scalar(filter).cast(dtype));
    let add = cx.add_aux1(Op::Binary(Binary::Mul), vec![Some(off), Some(filter)])?;
    let axes = cx.const_i64s(axes);
    cx.add_aux1(Op::Unsqueeze, vec![Some(add), Some(axes)])
}

/// Per-batch key lengths `[batch]` as a `[batch, total_sequence]` bool mask (true before the
/// length); the total sequence is `x`'s (no KV cache).
fn lengths_to_mask(cx: &mut NodeCtx, lengths: ValueId, x: ValueId) -> Result<ValueId> {
    let Some(total) = cx.ty(x).fixed_shape().map(|s| s[1]) else {
        return Err(cx.err("a mask_index of sequence lengths needs a static sequence length"));
    };
    let positions: Vec<i64> = (0..total as i64).collect();
    let positions = cx.constant(Tensor::from_vec(vec![1, total], positions));
    let len = cx.add_aux1(Op::Cast { to: DType::I64 }, vec![Some(lengths)])?;
    let axes = cx.const_i64s(&[1]);
    let len = cx.add_aux1(Op::Unsqueeze, vec![Some(len), Some(axes)])?;
    cx.add_aux1(Op::Binary(Binary::Less), vec![Some(positions), Some(len)])
}

/// `com.microsoft` EmbedLayerNormalization: word, position (`position_ids`, else 0..sequence)
/// and optional segment embeddings summed and layer-normalized (epsilon 1e-12 by default).
/// Outputs: output, mask_index (the number of 1s in each row of `mask`, 0 without one, as
/// onnxruntime computes it), embedding_sum.
fn embed_layer_norm(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let ids = cx.input(0)?;
    let word = cx.input(2)?;
    let mut sum = cx.add_aux1(Op::Gather { axis: 0 }, vec![Some(word), Some(ids)])?;
    let position_table = cx.input(3)?;
    let positions = match cx.opt_input(8) {
        Some(p) => p,
        None => {
            let Some(seq) = cx.ty(ids).fixed_shape().and_then(|s| s.get(1).copied()) else {
                return Err(cx.err("input_ids must be [batch, sequence] with a static sequence length"));
            };
            cx.const_i64s(&(0..seq as i64).collect::<Vec<_>>())
        }
    };
    let pos = cx.add_aux1(
        Op::Gather { axis: 0 },
        vec![Some(position_table), Some(positions)],
    )?;
    sum = cx.add_aux1(Op::Binary(Binary::Add), vec![Some(sum), Some(pos)])?;
    if let (Some(seg_ids), Some(seg_table)) = (cx.opt_input(1), cx.opt_input(4)) {
        let seg = cx.add_aux1(Op::Gather { axis: 0 }, vec![Some(seg_table), Some(seg_ids)])?;
        sum = cx.add_aux1(Op::Binary(Binary::Add), vec![Some(sum), Some(seg)])?;
    }
    let op = Op::LayerNorm {
        axis: -1,
        epsilon: cx.attr_f("epsilon", SKIP_NORM_EPSILON),
        stash_type: DType::F32,
    };
    let (gamma, beta) = (cx.input(5)?, cx.opt_input(6));
    let y = cx.add1(op, vec![Some(sum), Some(gamma), beta])?;
    let mut outs = vec![y; cx.num_outputs()];
    if cx.output_is_named(1) {
        outs[1] = match cx.opt_input(7) {
            Some(mask) => {
                let mask = cx.add_aux1(Op::Cast { to: DType::I32 }, vec![Some(mask)])?;
                let axes = cx.const_i64s(&[1]);
                let reduce = Op::Reduce {
                    kind: ReduceKind::Sum,
                    keepdims: false,
                    noop_with_empty_axes: false,
                };
                cx.add_aux1(reduce, vec![Some(mask), Some(axes)])?
            }
            None => {
                let Some(batch) = cx.ty(ids).fixed_shape().map(|s| s[0]) else {
                    return Err(cx.err("input_ids must have a static batch size"));
                };
                cx.constant(Tensor::from_vec(vec![batch], vec![0i32; batch]))
            }
        };
    }
    if let Some(last) = outs.get_mut(2) {
        *last = sum;
    }
    Ok(outs)
}

#[cfg(test)]
mod tests {
    use super::super::elementwise::testing::*;
    use crate::onnx::proto::data_type as dt;
    use crate::onnx::proto::AttributeProto;
    use kiln_ir::{Binary, Op, Unary};

    fn ops(g: &kiln_ir::Graph) -> Vec<&Op> {
        g.nodes()
            .iter()
            .map(|n| &n.op)
            .filter(|op| !matches!(op, Op::Input | Op::Constant(_)))
            .collect()
    }

    fn names(outputs: &[&str]) -> Vec<String> {
        outputs.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn bias_add_is_two_adds() {
        // onnxruntime computes BiasAdd on CUDA only, so the fixture cannot hold it.
        let ins = vec![
            input(0, dt::FLOAT, &[2, 3, 4]),
            input(1, dt::FLOAT, &[4]),
            input(2, dt::FLOAT, &[2, 3, 4]),
        ];
        let g = import_node_in(
            super::super::MICROSOFT_DOMAIN,
            "BiasAdd",
            ins,
            vec![],
            names(&["y"]),
            17,
        )
        .unwrap();
        assert_eq!(ops(&g), vec![&Op::Binary(Binary::Add), &Op::Binary(Binary::Add)]);
    }

    #[test]
    fn quick_gelu_is_swish_with_its_alpha() {
        let ins = || vec![input(0, dt::FLOAT, &[3])];
        let g = import_node_in(
            super::super::MICROSOFT_DOMAIN,
            "QuickGelu",
            ins(),
            vec![],
            names(&["y"]),
            17,
        )
        .unwrap();
        assert_eq!(ops(&g), vec![&Op::Unary(Unary::Swish { alpha: 1.702 })]);
        let a = vec![attr_f("alpha", 1.0)];
        let g = import_node_in(
            super::super::MICROSOFT_DOMAIN,
            "QuickGelu",
            ins(),
            a,
            names(&["y"]),
            17,
        )
        .unwrap();
        assert_eq!(ops(&g), vec![&Op::Unary(Unary::Swish { alpha: 1.0 })]);
    }

    #[test]
    fn skip_layer_norm_statistics_outputs_are_refused_by_name() {
        let ins = || {
            vec![
                input(0, dt::FLOAT, &[2, 4]),
                input(1, dt::FLOAT, &[2, 4]),
                input(2, dt::FLOAT, &[4]),
            ]
        };
        let ms = super::super::MICROSOFT_DOMAIN;
        let ok = import_node_in(
            ms,
            "SkipLayerNormalization",
            ins(),
            vec![],
            names(&["y", "", "", "s"]),
            17,
        );
        assert!(ok.is_ok(), "{:?}", ok.err());
        let err = import_node_in(
            ms,
            "SkipLayerNormalization",
            ins(),
            vec![],
            names(&["y", "mean"]),
            17,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("training statistics"), "{err}");
    }

    #[test]
    fn fused_matmul_batch_transposes_are_refused() {
        let ins = vec![input(0, dt::FLOAT, &[2, 3, 4]), input(1, dt::FLOAT, &[2, 4, 5])];
        let a = vec![attr_i("transBatchA", 1)];
        let err = import_node_in(
            super::super::MICROSOFT_DOMAIN,
            "FusedMatMul",
            ins,
            a,
            names(&["y"]),
            17,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("transBatchA"), "{err}");
    }

    #[test]
    fn fused_conv_names_an_unknown_activation_and_mha_a_packed_form() {
        let ms = super::super::MICROSOFT_DOMAIN;
        let ins = vec![
            input(0, dt::FLOAT, &[1, 2, 4, 4]),
            input(1, dt::FLOAT, &[3, 2, 1, 1]),
        ];
        let a = vec![AttributeProto {
            name: "activation".into(),
            r#type: crate::onnx::proto::attribute_type::STRING,
            s: b"Gelu".to_vec().into(),
            ..Default::default()
        }];
        let err = import_node_in(ms, "FusedConv", ins, a, names(&["y"]), 17)
            .unwrap_err()
            .to_string();
        assert!(err.contains("activation 'Gelu'"), "{err}");
        let packed = vec![input(0, dt::FLOAT, &[2, 3, 2, 3, 4])];
        let a = vec![attr_i("num_heads", 2)];
        let err = import_node_in(ms, "MultiHeadAttention", packed, a, names(&["y"]), 17)
            .unwrap_err()
            .to_string();
        assert!(err.contains("packed"), "{err}");
    }

    #[test]
    fn other_contrib_operators_are_still_reported_with_their_domain() {
        let ins = vec![input(0, dt::FLOAT, &[3])];
        let err = import_node_in(
            super::super::MICROSOFT_DOMAIN,
            "NoSuchFusion",
            ins,
            vec![],
            names(&["y"]),
            17,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("com.microsoft"), "{err}");
    }
}
