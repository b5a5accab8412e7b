//! onnxruntime's decoder attention operators (`com.microsoft` RotaryEmbedding and
//! GroupQueryAttention, which its model builder and transformer optimizer write for LLMs),
//! imported onto the IR's RotaryEmbedding and multi-head Attention.
//!
//! GroupQueryAttention is imported without a KV cache (a prompt run): no past key and value,
//! every sequence of the batch full length (`seqlens_k` a constant `sequence - 1`). A
//! right-padded batch, local windows, smooth softmax and head sinks are refused by name.

use super::NodeCtx;
use crate::error::Result;
use kiln_ir::{AttentionAttrs, MiscOp, Op, Tensor, ValueId};

pub(super) const OPERATORS: &[&str] = &["RotaryEmbedding", "GroupQueryAttention"];

pub(super) fn import(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    match cx.op_type() {
        "RotaryEmbedding" => rotary_embedding(cx),
        "GroupQueryAttention" => group_query_attention(cx),
        other => Err(cx.err(format!("{other} is not a decoder contrib operator kiln imports"))),
    }
}

/// A non-negative integer attribute (default 0).
fn count(cx: &NodeCtx, name: &str) -> Result<usize> {
    let v = cx.attr_i(name, 0);
    usize::try_from(v).map_err(|_| cx.err(format!("attribute '{name}' must be non-negative, got {v}")))
}

/// `[batch, sequence]` of a 3-D `[batch, sequence, hidden]` or 4-D `[batch, heads, sequence,
/// head]` input of known shape.
fn batch_and_sequence(cx: &NodeCtx, x: ValueId) -> Result<(usize, usize)> {
    match cx.ty(x).fixed_shape().as_deref() {
        Some([b, s, _]) | Some([b, _, s, _]) => Ok((*b, *s)),
        _ => Err(cx.err("the input must be 3-D or 4-D with a known shape")),
    }
}

/// `[batch, sequence]` positions `offset + t`.
fn positions_from(cx: &mut NodeCtx, offset: i64, batch: usize, sequence: usize) -> ValueId {
    let ids: Vec<i64> = (0..batch)
        .flat_map(|_| (0..sequence as i64).map(move |t| offset + t))
        .collect();
    cx.constant(Tensor::from_vec(vec![batch, sequence], ids))
}

/// The IR's RotaryEmbedding of `x` (3-D or 4-D) at `positions` (`[batch, sequence]`), with the
/// caches `[positions, rotary_dim / 2]`, and its inputs. A 3-D input's heads default to its
/// hidden size over the rotated width (the whole head).
fn rotation(
    cx: &NodeCtx,
    x: ValueId,
    caches: (ValueId, ValueId),
    positions: ValueId,
    interleaved: bool,
    (rotary_dim, num_heads): (usize, usize),
) -> Result<(Op, Vec<Option<ValueId>>)> {
    let half = match cx.ty(caches.0).fixed_shape().as_deref() {
        Some([_, half]) => *half,
        _ => return Err(cx.err("cos_cache must be 2-D [positions, rotary_dim / 2] of known shape")),
    };
    let x_shape = cx.ty(x).fixed_shape().unwrap_or_default();
    let num_heads = match (x_shape.as_slice(), num_heads) {
        ([_, _, hidden], 0) if half > 0 && hidden % (2 * half) == 0 && rotary_dim == 0 => hidden / (2 * half),
        ([_, _, _], 0) => {
            return Err(cx.err("num_heads is required for a 3-D input rotated over part of each head"))
        }
        ([_, _, _, _], _) => 0,
        (_, n) => n,
    };
    let op = Op::Misc(MiscOp::RotaryEmbedding {
        interleaved,
        rotary_dim,
        num_heads,
    });
    Ok((op, vec![Some(x), Some(caches.0), Some(caches.1), Some(positions)]))
}

/// `com.microsoft` RotaryEmbedding (inputs input, position_ids, cos_cache, sin_cache):
/// `position_ids` is `[batch, sequence]`, or one constant offset for positions `offset + t`.
fn rotary_embedding(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    if cx.attr_flag("is_packed_batching", false)? {
        return Err(cx.err("is_packed_batching is not supported"));
    }
    if cx.attr_opt_f("scale").is_some_and(|s| s != 1.0) {
        return Err(cx.err("a scale other than 1 is not supported"));
    }
    let x = cx.input(0)?;
    let (batch, sequence) = batch_and_sequence(cx, x)?;
    let ids = cx.input(1)?;
    let positions = if cx.ty(ids).rank() == 2 {
        ids
    } else {
        let offset = cx
            .known(ids)
            .filter(|t| t.len() == 1)
            .map(|t| t.to_i64_vec()[0])
            .ok_or_else(|| cx.err("a 1-D position_ids (a position offset) must be one constant"))?;
        positions_from(cx, offset, batch, sequence)
    };
    let caches = (cx.input(2)?, cx.input(3)?);
    let shape = (count(cx, "rotary_embedding_dim")?, count(cx, "num_heads")?);
    let interleaved = cx.attr_flag("interleaved", false)?;
    let (op, inputs) = rotation(cx, x, caches, positions, interleaved, shape)?;
    Ok(vec![cx.add1(op, inputs)?])
}

/// `com.microsoft` GroupQueryAttention (inputs query, key?, value?, past_key?, past_value?,
/// seqlens_k, total_sequence_length, cos_cache?, sin_cache?, position_ids?, attention_bias?,
/// head_sink?): causal attention of `num_heads` query heads over `kv_num_heads` key/value
/// heads, the query, key and value packed in `query` when key and value are absent, rotated
/// first when `do_rotary` is set.
fn group_query_attention(cx: &mut NodeCtx) -> Result<Vec<ValueId>> {
    let heads = cx.attr_positive("num_heads")?;
    let kv_heads = match cx.attr_i("kv_num_heads", 0) {
        n if n > 0 && heads % n as usize == 0 => n as usize,
        n => {
            return Err(cx.err(format!(
                "kv_num_heads must be positive and divide num_heads ({heads}), got {n}"
            )))
        }
    };
    if cx.opt_input(3).is_some() || cx.opt_input(4).is_some() {
        return Err(cx.err("past_key and past_value (a KV cache) are not supported"));
    }
    if cx.attr_i("local_window_size", -1) != -1 {
        return Err(cx.err("local_window_size (sliding-window attention) is not supported"));
    }
    if cx.attr_i("smooth_softmax", -1) == 1 || cx.opt_input(11).is_some() {
        return Err(cx.err("smooth_softmax and head_sink are not supported"));
    }
    if cx.attr_i("qk_output", 0) != 0 || cx.output_is_named(3) {
        return Err(cx.err("output_qk is not supported"));
    }
    let query = cx.input(0)?;
    let (batch, sequence) = match cx.ty(query).fixed_shape().as_deref() {
        Some([b, s, _]) => (*b, *s),
        _ => return Err(cx.err("query must be 3-D [batch, sequence, hidden] of known shape")),
    };
    full_length_sequences(cx, sequence)?;
    let [mut q, mut k, v] = match (cx.opt_input(1), cx.opt_input(2)) {
        (Some(k), Some(v)) => [query, k, v],
        (None, None) => unpack_qkv(cx, query, heads, kv_heads)?,
        _ => return Err(cx.err("key and value must both be given or both be absent (packed in query)")),
    };
    if cx.attr_flag("do_rotary", false)? {
        let caches = match (cx.opt_input(7), cx.opt_input(8)) {
            (Some(c), Some(s)) => (c, s),
            _ => return Err(cx.err("do_rotary needs cos_cache and sin_cache")),
        };
        let positions = match cx.opt_input(9) {
            Some(p) => p,
            None => positions_from(cx, 0, batch, sequence),
        };
        let interleaved = cx.attr_flag("rotary_interleaved", false)?;
        let (op, inputs) = rotation(cx, q, caches, positions, interleaved, (0, heads))?;
        q = cx.add_aux1(op, inputs)?;
        let (op, inputs) = rotation(cx, k, caches, positions, interleaved, (0, kv_heads))?;
        k = cx.add_aux1(op, inputs)?;
    }
    let softcap = cx.attr_f("softcap", 0.0);
    let attrs = AttentionAttrs {
        is_causal: true,
        q_num_heads: heads,
        kv_num_heads: kv_heads,
        qk_matmul_output_mode: 0,
        scale: cx.attr_opt_f("scale").filter(|&s| s != 0.0),
        softcap,
        softmax_precision: None,
        left_window_size: -1,
        right_window_size: -1,
    };
    let y = cx.add1(
        Op::Attention(attrs),
        vec![Some(q), Some(k), Some(v), cx.opt_input(10)],
    )?;
    let mut outputs = vec![y];
    // Without a past, the present key and value are this run's (rotated) key and value as
    // `[batch, kv_heads, sequence, head]`.
    for t in [k, v].into_iter().take(cx.num_outputs().saturating_sub(1)) {
        outputs.push(heads_first(cx, t, kv_heads)?);
    }
    Ok(outputs)
}

/// `[batch, sequence, heads * head]` as `[batch, heads, sequence, head]`.
fn heads_first(cx: &mut NodeCtx, t: ValueId, heads: usize) -> Result<ValueId> {
    let (batch, sequence, hidden) = match cx.ty(t).fixed_shape().as_deref() {
        Some([b, s, h]) => (*b, *s, *h),
        _ => return Err(cx.err("key and value must be 3-D of known shape")),
    };
    let shape = cx.const_i64s(&[
        batch as i64,
        sequence as i64,
        heads as i64,
        (hidden / heads) as i64,
    ]);
    let split = cx.add_aux1(Op::Reshape { allow_zero: false }, vec![Some(t), Some(shape)])?;
    cx.add_aux1(
        Op::Transpose {
            perm: vec![0, 2, 1, 3],
        },
        vec![Some(split)],
    )
}

/// Refuses a batch with padded sequences: `seqlens_k` must be a constant `sequence - 1` for
/// every row and `total_sequence_length` the sequence length, as for a full-length prompt.
fn full_length_sequences(cx: &NodeCtx, sequence: usize) -> Result<()> {
    let seqlens = cx.input(5)?;
    let total = cx.input(6)?;
    let constant = |v: ValueId| cx.known(v).map(|t| t.to_i64_vec());
    match (constant(seqlens), constant(total)) {
        (Some(lens), Some(total))
            if lens.iter().all(|&l| l == sequence as i64 - 1) && total == [sequence as i64] =>
        {
            Ok(())
        }
        (Some(_), Some(_)) => Err(cx.err(format!(
            "only full-length sequences are supported: seqlens_k must be {} for every row and total_sequence_length {sequence} (a padded batch or a KV cache is not)",
            sequence - 1
        ))),
        _ => Err(cx.err(
            "seqlens_k and total_sequence_length must be constants (bind them with --bind)",
        )),
    }
}

/// Query, key and value packed along the hidden axis of `query`:
/// `[heads * head, kv_heads * head, kv_heads * head]`.
fn unpack_qkv(cx: &mut NodeCtx, query: ValueId, heads: usize, kv_heads: usize) -> Result<[ValueId; 3]> {
    let hidden = cx.ty(query).fixed_shape().map_or(0, |s| s[2]);
    let units = heads + 2 * kv_heads;
    if !hidden.is_multiple_of(units) {
        return Err(cx.err(format!(
            "packed query width {hidden} does not split into {heads} query and 2 × {kv_heads} key/value heads"
        )));
    }
    let head = hidden / units;
    let widths = [heads * head, kv_heads * head, kv_heads * head];
    let mut start = 0;
    let mut parts = [query; 3];
    for (part, width) in parts.iter_mut().zip(widths) {
        let starts = cx.const_i64s(&[start as i64]);
        let ends = cx.const_i64s(&[(start + width) as i64]);
        let axes = cx.const_i64s(&[-1]);
        *part = cx.add_aux1(Op::Slice, vec![Some(query), Some(starts), Some(ends), Some(axes)])?;
        start += width;
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::super::elementwise::testing::*;
    use super::super::MICROSOFT_DOMAIN;
    use crate::onnx::proto::data_type as dt;

    #[test]
    fn group_query_attention_refuses_a_kv_cache_and_unknown_lengths() {
        let ins = |past: bool| {
            let mut v = vec![
                input(0, dt::FLOAT, &[1, 4, 64]),
                input(1, dt::FLOAT, &[1, 4, 32]),
                input(2, dt::FLOAT, &[1, 4, 32]),
            ];
            if past {
                v.push(input(3, dt::FLOAT, &[1, 2, 3, 16]));
            }
            v
        };
        let attrs = || vec![attr_i("num_heads", 4), attr_i("kv_num_heads", 2)];
        let run = |past| {
            import_node_in(
                MICROSOFT_DOMAIN,
                "GroupQueryAttention",
                ins(past),
                attrs(),
                vec!["y".into()],
                17,
            )
            .unwrap_err()
            .to_string()
        };
        assert!(run(true).contains("KV cache"), "{}", run(true));
        // seqlens_k and total_sequence_length are missing here: not known to be full length.
        let err = run(false);
        assert!(err.contains("seqlens_k") || err.contains("input 5"), "{err}");
        let bad_heads = vec![attr_i("num_heads", 4), attr_i("kv_num_heads", 3)];
        let err = import_node_in(
            MICROSOFT_DOMAIN,
            "GroupQueryAttention",
            ins(false),
            bad_heads,
            vec!["y".into()],
            17,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("kv_num_heads"), "{err}");
    }
}
