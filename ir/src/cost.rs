//! Static cost estimates: floating-point operations per node, for `kiln inspect` and reports.
//!
//! A multiply-add counts as two operations, as is usual for model FLOP counts; an integer
//! product's multiply-adds (MatMulInteger, ConvInteger) count the same, so that a profile's
//! rates compare across precisions. Estimates need
//! static shapes; nodes whose shapes are not fully known count as zero.

use crate::{Graph, Node, Op, QuantOp};

/// Estimated floating-point operations of one node (0 for data movement).
pub fn node_flops(g: &Graph, node: &Node) -> u64 {
    let out_elems = |i: usize| node.outputs.get(i).and_then(|o| o.ty.num_elements()).unwrap_or(0) as u64;
    let in_shape = |i: usize| {
        node.inputs
            .get(i)
            .copied()
            .flatten()
            .and_then(|v| g.value_type(v).fixed_shape())
    };
    let in_elems = |i: usize| {
        in_shape(i)
            .map(|s| s.iter().product::<usize>() as u64)
            .unwrap_or(0)
    };
    match &node.op {
        Op::MatMul | Op::Quant(QuantOp::MatMulInteger | QuantOp::BlockQuantizedMatMul { .. }) => {
            // out = [..., M, N]; K = last dim of A.
            let k = in_shape(0).and_then(|s| s.last().copied()).unwrap_or(0) as u64;
            2 * out_elems(0) * k
        }
        Op::Gemm { trans_a, .. } => {
            let k = in_shape(0)
                .filter(|s| s.len() == 2)
                .map(|s| if *trans_a { s[0] } else { s[1] })
                .unwrap_or(0) as u64;
            2 * out_elems(0) * k
        }
        Op::Conv(_) | Op::Quant(QuantOp::ConvInteger(_)) => {
            // Each output element reads (C_in / group) * prod(kernel) inputs: W is [M, C/g, k...].
            let w = in_shape(1).unwrap_or_default();
            let per_out: u64 = w.iter().skip(1).map(|&d| d as u64).product();
            2 * out_elems(0) * per_out
        }
        Op::ConvTranspose(_) => {
            // Each input element scatters into (C_out / group) * prod(kernel) outputs.
            let w = in_shape(1).unwrap_or_default();
            let per_in: u64 = w.iter().skip(1).map(|&d| d as u64).product();
            2 * in_elems(0) * per_in
        }
        Op::Einsum { .. } => 2 * out_elems(0).max(in_elems(0)),
        Op::Rnn(a) => {
            // Per step and direction: gates x (input + hidden) matmuls.
            let gates = match a.kind {
                crate::RnnKind::Rnn => 1,
                crate::RnnKind::Gru => 3,
                crate::RnnKind::Lstm => 4,
            };
            let x = in_shape(0).unwrap_or_default();
            let (seq, batch, input) = match (x.as_slice(), a.layout) {
                ([s, b, i], 0) | ([b, s, i], _) => (*s as u64, *b as u64, *i as u64),
                _ => (0, 0, 0),
            };
            let dirs = if a.direction == crate::RnnDirection::Bidirectional {
                2
            } else {
                1
            };
            let h = a.hidden_size as u64;
            2 * dirs * seq * batch * gates * h * (input + h)
        }
        Op::Attention(_) => {
            // QK^T and PV: 2 * 2 * B * heads * Sq * Skv * H = 4 * |Q| * Skv.
            let skv = in_shape(1)
                .and_then(|s| s.get(s.len().wrapping_sub(2)).copied())
                .unwrap_or(0) as u64;
            4 * in_elems(0) * skv
        }
        Op::Pool(p) => out_elems(0) * p.kernel_shape.iter().product::<usize>() as u64,
        Op::GlobalPool(_) | Op::Reduce { .. } | Op::ArgMax { .. } | Op::ArgMin { .. } => in_elems(0),
        Op::BatchNorm { .. } => 2 * out_elems(0),
        Op::LayerNorm { .. }
        | Op::InstanceNorm { .. }
        | Op::GroupNorm { .. }
        | Op::MeanVarianceNorm { .. } => 5 * out_elems(0),
        Op::Softmax { .. } | Op::LogSoftmax { .. } => 3 * out_elems(0),
        Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Clip if node.outputs[0].ty.dtype.is_float() => {
            out_elems(0)
        }
        Op::Resize(_) => out_elems(0) * 4,
        Op::If { then_branch, .. } => graph_flops(then_branch),
        Op::Loop { body, .. } => graph_flops(body),
        _ => 0,
    }
}

/// Estimated floating-point operations of a whole graph (one pass; loop bodies counted once).
pub fn graph_flops(g: &Graph) -> u64 {
    g.nodes().iter().map(|n| node_flops(g, n)).sum()
}
