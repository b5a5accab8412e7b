//! Attention: `MatMul(Softmax(scaled Q·Kᵀ [+ mask]), V)` with its head split and merge.

use super::views::{layout_only, View};
use super::{Cx, Fused, ThreeD};
use kiln_ir::{Binary, DType, NodeId, Op, Unary, ValueId};
use std::collections::HashMap;

impl Cx<'_> {
    pub(super) fn find_attention(&self) -> HashMap<NodeId, Fused> {
        let mut fused = HashMap::new();
        for id in self.g.node_ids() {
            if let Some((root, f)) = self.attention(id.out(0)) {
                fused.insert(root, f);
            }
        }
        fused
    }

    /// `MatMul(Softmax((Q·Kᵀ) · c [+ mask]), V)` on [B, H, S, D] operands, where the scale
    /// may also multiply Q and Kᵀ before the product, and the softmax may be guarded as
    /// `Where(IsNaN(p), 0, p)`. When Q, K and V are head splits of 3-D values ([B, S, H·D],
    /// reached through any reshapes and transposes) and the result is merged back the same
    /// way, the operator takes the 3-D values and replaces the merge.
    fn attention(&self, y: ValueId) -> Option<(NodeId, Fused)> {
        if !matches!(self.op(y), Op::MatMul) {
            return None;
        }
        let [p, v4] = self.ins(y)[..] else { return None };
        let mut interior = vec![];
        let p = match self.nan_guard(p) {
            Some((softmax, guard)) => {
                interior.extend(guard);
                softmax
            }
            None => p,
        };
        let Op::Softmax { axis, .. } = self.op(p) else {
            return None;
        };
        let ps = self.shape(p)?;
        if ps.len() != 4 || !(*axis == -1 || *axis == 3) || self.g.value_type(p).dtype != DType::F32 {
            return None;
        }
        let [t] = self.ins(p)[..] else { return None };
        interior.push(p.node);
        let (sc, mask) = match self.binary(t, Binary::Add) {
            Some((a, b)) => {
                interior.push(t.node);
                if self.scaled_scores(a).is_some() {
                    (a, Some(b))
                } else {
                    (b, Some(a))
                }
            }
            None => (t, None),
        };
        let (qk, mut scale) = self.scaled_scores(sc)?;
        if qk != sc {
            interior.push(sc.node);
        }
        interior.push(qk.node);
        let [qa, kb] = self.ins(qk)[..] else { return None };
        // PyTorch's SDPA decomposition scales Q and Kᵀ by sqrt(scale) each.
        let (q4, q_scale) = self.scaled_operand(qa, &mut interior);
        let (kt, k_scale) = self.scaled_operand(kb, &mut interior);
        scale *= q_scale * k_scale;
        let (qs, ks, vs) = (self.shape(q4)?, self.shape(kt)?, self.shape(v4)?);
        let (b, h, sq, dk) = (qs[0], qs[1], qs[2], qs[3]);
        let skv = ks.get(3).copied()?;
        if ks != [b, h, dk, skv] || vs.len() != 4 || vs[..3] != [b, h, skv] || ps != [b, h, sq, skv] {
            return None;
        }
        let dv = vs[3];
        if let Some(m) = mask {
            let mt = self.g.value_type(m);
            let ms = mt.fixed_shape()?;
            let full = [b, h, sq, skv];
            if mt.dtype != DType::F32
                || ms.is_empty()
                || ms.len() > 4
                // Attention masks keys past a shorter mask instead of broadcasting it.
                || ms[ms.len() - 1] != skv
                || ms
                    .iter()
                    .rev()
                    .zip(full.iter().rev())
                    .any(|(&m, &f)| m != 1 && m != f)
                || self.g.value_type(t) != self.g.value_type(qk)
            {
                return None;
            }
        }
        if !self.closed(&interior, y.node) {
            return None;
        }
        let attrs = |q, k, k_transposed, v, heads, shapes| Fused::Attention {
            q,
            k,
            k_transposed,
            v,
            mask,
            scale: scale as f32,
            heads,
            shapes,
        };
        // 3-D form when every operand is a head split and the result is merged back.
        let three = (
            self.head_split_source(q4, &head_split([b, sq, h, dk], false)),
            self.head_split_source(kt, &head_split([b, skv, h, dk], true)),
            self.head_split_source(v4, &head_split([b, skv, h, dv], false)),
            self.head_merge_root(y, [b, h, sq, dv]),
        );
        if let (Some(q3), Some(k3), Some(v3), Some(root)) = three {
            let shapes = ThreeD {
                q: vec![b, sq, h * dk],
                k: vec![b, skv, h * dk],
                v: vec![b, skv, h * dv],
                y: vec![b, sq, h * dv],
                root: self.shape(root.out(0))?,
            };
            return Some((root, attrs(q3, k3, false, v3, h, Some(shapes))));
        }
        let (k, k_transposed) = match self.op(kt) {
            Op::Transpose { perm } if perm == &[0, 1, 3, 2] => (self.ins(kt)[0], false),
            _ => (kt, true),
        };
        Some((y.node, attrs(q4, k, k_transposed, v4, 0, None)))
    }

    /// `(p, [Where, IsNaN])` for `Where(IsNaN(p), 0, p)`, which PyTorch's exports put after
    /// the softmax so that a row whose every key is masked (a softmax of -inf only, NaN)
    /// gives zeros: what Attention gives for such a row. (The guard also zeroes rows made
    /// NaN by NaN or infinite scores, where Attention's rows stay NaN.)
    fn nan_guard(&self, v: ValueId) -> Option<(ValueId, [NodeId; 2])> {
        let n = self.node(v);
        let (Op::Where, [Some(cond), Some(zero), Some(p)]) = (&n.op, n.inputs.as_slice()) else {
            return None;
        };
        (self.unary(*cond, Unary::IsNaN) == Some(*p) && self.scalar(*zero) == Some(0.0))
            .then_some((*p, [v.node, cond.node]))
    }

    /// `(x, c)` for `x · c` or `c · x` with c a positive constant scalar (the Mul joins
    /// `interior`), else `(v, 1)`.
    fn scaled_operand(&self, v: ValueId, interior: &mut Vec<NodeId>) -> (ValueId, f64) {
        if let Some((a, b)) = self.binary(v, Binary::Mul) {
            for (x, c) in [(a, b), (b, a)] {
                match self.scalar(c) {
                    Some(c) if c > 0.0 && c.is_finite() && self.same_type(x, v) => {
                        interior.push(v.node);
                        return (x, c);
                    }
                    _ => {}
                }
            }
        }
        (v, 1.0)
    }

    /// The value `v` is a head split of — `v`'s elements, read in order, are `want`'s view of
    /// it — reached from `v` back through layout-only operators (the furthest such value, so
    /// that no copy is left between it and the attention).
    fn head_split_source(&self, v: ValueId, want: &View) -> Option<ValueId> {
        let mut chain = vec![v];
        while chain.len() < MAX_LAYOUT_CHAIN {
            let cur = chain[chain.len() - 1];
            if !layout_only(self.op(cur)) {
                break;
            }
            chain.push(self.ins(cur)[0]);
        }
        (1..chain.len()).rev().find_map(|j| {
            let src = chain[j];
            let mut view = View::contiguous(&self.shape(src)?);
            for &val in chain[..j].iter().rev() {
                view = self.apply_layout(&view, val)?;
            }
            view.same_order(want).then_some(src)
        })
    }

    /// The node whose output is the [B, Sq, H·Dv] merge of attention result `y` ([B, H, Sq,
    /// Dv]): the last of a chain of layout-only operators, each the sole reader of the one
    /// before, whose output reads the merged result in order.
    fn head_merge_root(&self, y: ValueId, [b, h, sq, dv]: [usize; 4]) -> Option<NodeId> {
        let mut view = View::contiguous(&[b, sq, h, dv]).transpose(&[0, 2, 1, 3])?;
        let (mut cur, mut root) = (y, None);
        for _ in 0..MAX_LAYOUT_CHAIN {
            let Some(c) = self.sole_consumer(cur) else { break };
            let out = c.out(0);
            if !layout_only(&self.g.node(c).op) {
                break;
            }
            let Some(next) = self.apply_layout(&view, out) else {
                break;
            };
            (view, cur) = (next, out);
            if view.is_contiguous() {
                root = Some(c);
            }
        }
        root
    }

    /// `view` after the layout-only operator that produces `out`.
    pub(super) fn apply_layout(&self, view: &View, out: ValueId) -> Option<View> {
        match self.op(out) {
            Op::Transpose { perm } => view.transpose(perm),
            _ => view.reshape(&self.shape(out)?),
        }
    }

    /// `(scores, c)` for `scores · c`, `c · scores`, `scores / c` (as `1/c`) or plain scores
    /// (`c = 1`), where the scores are a MatMul as [`Cx::is_scores`] and c a positive constant.
    fn scaled_scores(&self, sc: ValueId) -> Option<(ValueId, f64)> {
        let (qk, scale) = match (self.binary(sc, Binary::Div), self.binary(sc, Binary::Mul)) {
            (Some((a, c)), _) => (a, 1.0 / self.scalar(c)?),
            (_, Some((a, c))) if self.scalar(c).is_some() => (a, self.scalar(c)?),
            (_, Some((c, a))) => (a, self.scalar(c)?),
            _ => (sc, 1.0),
        };
        let ok = self.is_scores(qk) && scale > 0.0 && scale.is_finite() && self.same_type(qk, sc);
        ok.then_some((qk, scale))
    }

    /// A rank-4 f32 MatMul of two rank-4 operands.
    fn is_scores(&self, v: ValueId) -> bool {
        matches!(self.op(v), Op::MatMul)
            && self.g.value_type(v).dtype == DType::F32
            && self.ins(v).iter().all(|&i| self.g.value_type(i).rank() == 4)
    }
}

/// How many layout-only operators a head split or merge may chain.
const MAX_LAYOUT_CHAIN: usize = 8;

/// How attention reads a [B, S, H·D] value as heads: [B, H, S, D], or for `key_t` [B, H, D, S].
fn head_split([b, s, h, d]: [usize; 4], key_t: bool) -> View {
    let perm: &[usize] = if key_t { &[0, 2, 3, 1] } else { &[0, 2, 1, 3] };
    View::contiguous(&[b, s, h, d])
        .transpose(perm)
        .expect("a 4-D permutation")
}
