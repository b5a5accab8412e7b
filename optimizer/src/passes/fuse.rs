//! `fuse`: recognises decomposed exports of LayerNorm, RMSNorm, Softmax and GELU and the attention
//! pattern `MatMul(Q, Kᵀ) → scale → (+ mask) → Softmax → MatMul(·, V)` (the scale may instead
//! multiply Q and Kᵀ, and the softmax may be guarded by `Where(IsNaN(p), 0, p)`, as PyTorch's
//! exports of `scaled_dot_product_attention` write it), and replaces each by
//! one existing IR operator (`LayerNorm`, `RMSNormalization`, `Softmax`, `Unary::Gelu`,
//! `Attention`), so the
//! interpreter and the verifier check the rewrite and codegen picks one kernel for it.
//!
//! Matching reads the source graph; the rewrite copies it, emitting the fused node at the
//! pattern's last node and dropping the nodes nobody reads any more. A node of a pattern whose
//! value is also read outside the pattern simply stays alive, so a match is never wrong, only
//! less profitable; the interior of the numeric patterns must be read only inside them so that
//! no work is done twice. Constants are matched with a relative tolerance (exports write
//! `sqrt(2)` or `1/sqrt(2)` rounded to f32 or spelled out with fewer digits).
//!
//! Softmax runs first so that attention sees `Softmax` nodes of decomposed exports too.

mod attention;
mod projections;
mod views;

use crate::Pass;
use kiln_ir::{
    AttentionAttrs, Binary, DType, Graph, IrError, MiscOp, Node, NodeId, Op, ReduceKind, Tensor, TensorType,
    Unary, ValueId,
};
use std::collections::{HashMap, HashSet};

pub struct Fuse;

impl Pass for Fuse {
    fn name(&self) -> &'static str {
        "fuse"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        let mut total = 0;
        // Each phase's patterns are built from the previous phase's fused operators.
        for phase in [Phase::Elementwise, Phase::Projections, Phase::Attention] {
            let cx = Cx::new(graph);
            let fused = match phase {
                Phase::Elementwise => cx.find_elementwise(),
                Phase::Projections => cx.find_split_projections(),
                Phase::Attention => cx.find_attention(),
            };
            if fused.is_empty() {
                continue;
            }
            total += fused.len();
            *graph = apply(graph, &fused)?;
        }
        Ok(total)
    }
}

#[derive(Clone, Copy)]
enum Phase {
    Elementwise,
    /// Packed projections split into one product per slice, so that attention then sees
    /// each of Q, K and V come from its own product.
    Projections,
    Attention,
}

/// The fused operator standing for a pattern, emitted in place of its root node.
#[derive(Debug)]
enum Fused {
    LayerNorm {
        x: ValueId,
        scale: Option<ValueId>,
        bias: Option<ValueId>,
        axis: usize,
        epsilon: f32,
    },
    /// RMSNormalization: `x / sqrt(mean(x²) + eps) · scale` over the axes from `axis`.
    RmsNorm {
        x: ValueId,
        scale: Option<ValueId>,
        axis: usize,
        epsilon: f32,
    },
    Softmax {
        x: ValueId,
        axis: usize,
    },
    Gelu {
        x: ValueId,
        tanh: bool,
    },
    Attention {
        q: ValueId,
        /// K as the operator takes it; `k_transposed`: the value is Kᵀ ([B, H, D, S]) and a
        /// Transpose must be inserted.
        k: ValueId,
        k_transposed: bool,
        v: ValueId,
        mask: Option<ValueId>,
        scale: f32,
        /// Heads for the 3-D form (inputs [B, S, H·D]); 0 for the 4-D form.
        heads: usize,
        /// 3-D form: the shapes the operator reads Q, K, V as and writes its result as (the
        /// values matched are reshapes of these), and the shape of the root it stands for.
        shapes: Option<ThreeD>,
    },
    /// Columns of a packed projection: `x · weight [+ bias]`, reshaped to `shape`.
    ProjectionSlice {
        x: ValueId,
        weight: Tensor,
        bias: Option<Tensor>,
        shape: Vec<usize>,
    },
}

/// The `[B, S, H·D]` shapes of a 3-D attention's Q, K, V and result, and the root's shape.
#[derive(Debug)]
struct ThreeD {
    q: Vec<usize>,
    k: Vec<usize>,
    v: Vec<usize>,
    y: Vec<usize>,
    root: Vec<usize>,
}

impl Fused {
    /// The source values the fused operator reads (what keeps them alive).
    fn inputs(&self) -> Vec<ValueId> {
        match self {
            Fused::LayerNorm { x, scale, bias, .. } => {
                [Some(*x), *scale, *bias].into_iter().flatten().collect()
            }
            Fused::RmsNorm { x, scale, .. } => [Some(*x), *scale].into_iter().flatten().collect(),
            Fused::Softmax { x, .. } | Fused::Gelu { x, .. } | Fused::ProjectionSlice { x, .. } => {
                vec![*x]
            }
            Fused::Attention { q, k, v, mask, .. } => [Some(*q), Some(*k), Some(*v), *mask]
                .into_iter()
                .flatten()
                .collect(),
        }
    }
}

/// Relative tolerance for matched constants.
const TOL: f64 = 1e-3;

fn near(a: f64, b: f64) -> bool {
    (a - b).abs() <= TOL * b.abs().max(1e-30)
}

struct Cx<'g> {
    g: &'g Graph,
    consumers: HashMap<ValueId, Vec<NodeId>>,
    outputs: HashSet<ValueId>,
}

impl<'g> Cx<'g> {
    fn new(g: &'g Graph) -> Cx<'g> {
        let mut consumers: HashMap<ValueId, Vec<NodeId>> = HashMap::new();
        for (id, n) in g.node_ids().zip(g.nodes()) {
            for v in n.inputs.iter().flatten() {
                let c = consumers.entry(*v).or_default();
                if !c.contains(&id) {
                    c.push(id);
                }
            }
        }
        let outputs = g.outputs().iter().map(|o| o.value).collect();
        Cx {
            g,
            consumers,
            outputs,
        }
    }

    fn node(&self, v: ValueId) -> &'g Node {
        self.g.node(v.node)
    }

    fn op(&self, v: ValueId) -> &'g Op {
        &self.node(v).op
    }

    fn ins(&self, v: ValueId) -> Vec<ValueId> {
        self.node(v).inputs.iter().flatten().copied().collect()
    }

    /// The two operands of `v` if it is `Binary(op)`.
    fn binary(&self, v: ValueId, op: Binary) -> Option<(ValueId, ValueId)> {
        let n = self.node(v);
        match (&n.op, n.inputs.as_slice()) {
            (Op::Binary(b), [Some(a), Some(c)]) if *b == op && v.output == 0 => Some((*a, *c)),
            _ => None,
        }
    }

    fn unary(&self, v: ValueId, op: Unary) -> Option<ValueId> {
        let n = self.node(v);
        match (&n.op, n.inputs.as_slice()) {
            (Op::Unary(u), [Some(a)]) if *u == op => Some(*a),
            _ => None,
        }
    }

    /// The value of a constant whose elements are all equal.
    fn scalar(&self, v: ValueId) -> Option<f64> {
        let t = self.g.known_value(v)?;
        if !t.dtype().is_float() || t.is_empty() {
            return None;
        }
        let vals = t.to_f64_vec();
        vals.iter().all(|&x| x == vals[0]).then_some(vals[0])
    }

    fn is_const(&self, v: ValueId, want: f64) -> bool {
        self.scalar(v).is_some_and(|c| near(c, want))
    }

    fn shape(&self, v: ValueId) -> Option<Vec<usize>> {
        self.g.value_type(v).fixed_shape()
    }

    fn float(&self, v: ValueId) -> bool {
        self.g.value_type(v).dtype.is_float()
    }

    fn same_type(&self, a: ValueId, b: ValueId) -> bool {
        self.g.value_type(a) == self.g.value_type(b)
    }

    /// Every value of `interior` is read only by nodes of `interior` or by `root`, and none
    /// is a graph output.
    fn closed(&self, interior: &[NodeId], root: NodeId) -> bool {
        interior.iter().filter(|&&n| n != root).all(|&n| {
            self.g.node(n).outputs.iter().enumerate().all(|(o, _)| {
                let v = n.out(o as u32);
                !self.outputs.contains(&v)
                    && self
                        .consumers
                        .get(&v)
                        .is_none_or(|cs| cs.iter().all(|c| *c == root || interior.contains(c)))
            })
        })
    }

    /// The single axis a keepdims reduction of `kind` over `v` reduces, normalised.
    fn reduce_axis(&self, v: ValueId, kind: ReduceKind) -> Option<(ValueId, Vec<usize>)> {
        let n = self.node(v);
        let Op::Reduce {
            kind: k,
            keepdims: true,
            ..
        } = &n.op
        else {
            return None;
        };
        if *k != kind {
            return None;
        }
        let x = n.inputs.first().copied().flatten()?;
        let rank = self.g.value_type(x).rank() as i64;
        let axes = self
            .g
            .known_value(n.inputs.get(1).copied().flatten()?)?
            .to_i64_vec();
        let mut norm: Vec<usize> = axes
            .iter()
            .map(|&a| if a < 0 { a + rank } else { a })
            .filter(|&a| (0..rank).contains(&a))
            .map(|a| a as usize)
            .collect();
        if norm.len() != axes.len() || norm.is_empty() {
            return None;
        }
        norm.sort_unstable();
        norm.dedup();
        Some((x, norm))
    }

    /// The leaves of the product tree rooted at `v` (Mul nodes, and Div by a constant as a
    /// multiplication by its reciprocal), with the Mul/Div nodes walked through. A leaf that
    /// is a constant is returned as its value.
    fn product(&self, v: ValueId, depth: usize, nodes: &mut Vec<NodeId>, leaves: &mut Vec<Leaf>) {
        if depth > 0 {
            if let Some((a, b)) = self.binary(v, Binary::Mul) {
                nodes.push(v.node);
                self.product(a, depth - 1, nodes, leaves);
                self.product(b, depth - 1, nodes, leaves);
                return;
            }
            if let Some((a, b)) = self.binary(v, Binary::Div) {
                if let Some(c) = self.scalar(b).filter(|c| *c != 0.0) {
                    nodes.push(v.node);
                    self.product(a, depth - 1, nodes, leaves);
                    leaves.push(Leaf::Const(1.0 / c));
                    return;
                }
            }
        }
        match self.scalar(v) {
            Some(c) => leaves.push(Leaf::Const(c)),
            None => leaves.push(Leaf::Value(v)),
        }
    }

    // -----------------------------------------------------------------------------------------
    // Elementwise patterns
    // -----------------------------------------------------------------------------------------

    fn find_elementwise(&self) -> HashMap<NodeId, Fused> {
        let mut fused = HashMap::new();
        let mut claimed: HashSet<NodeId> = HashSet::new();
        // Latest roots first: a LayerNorm's root (the bias Add) comes after its Div.
        for id in self.g.node_ids().collect::<Vec<_>>().into_iter().rev() {
            if claimed.contains(&id) {
                continue;
            }
            let v = id.out(0);
            if self.g.node(id).outputs.len() != 1 || !self.float(v) {
                continue;
            }
            let found = self
                .layer_norm(v)
                .or_else(|| self.rms_norm(v))
                .or_else(|| self.softmax(v))
                .or_else(|| self.gelu(v));
            if let Some((f, interior)) = found {
                if interior.iter().any(|n| claimed.contains(n)) || !self.closed(&interior, id) {
                    continue;
                }
                claimed.extend(interior);
                claimed.insert(id);
                fused.insert(id, f);
            }
        }
        fused
    }

    /// `(x - mean(x)) / sqrt(mean((x - mean(x))²) + eps) [* scale] [+ bias]` over the
    /// trailing axes; the division may be a multiplication by `Reciprocal`.
    fn layer_norm(&self, root: ValueId) -> Option<(Fused, Vec<NodeId>)> {
        let mut interior = vec![];
        let mut cur = root;
        // Optional bias then optional scale, each a constant-shaped parameter of the row.
        let mut bias = None;
        let mut scale = None;
        if let Some((a, b)) = self.binary(cur, Binary::Add) {
            let (n, p) = if self.is_norm_div(a) || self.binary(a, Binary::Mul).is_some() {
                (a, b)
            } else {
                (b, a)
            };
            bias = Some(p);
            interior.push(cur.node);
            cur = n;
        }
        if let Some((a, b)) = self.binary(cur, Binary::Mul) {
            let (n, p) = if self.is_norm_div(a) { (a, b) } else { (b, a) };
            if self.is_norm_div(n) {
                scale = Some(p);
                interior.push(cur.node);
                cur = n;
            }
        }
        // cur: d / sqrt(var + eps) or d * Reciprocal(sqrt(var + eps))
        let (d, sq) = self.norm_div(cur)?;
        interior.push(cur.node);
        if sq.1 != sq.0 {
            interior.push(sq.1.node);
        }
        let (axes, eps) = self.root_mean_square(sq.0, d, &mut interior)?;
        let (x, m) = self.binary(d, Binary::Sub)?;
        interior.push(d.node);
        let (mx, maxes) = self.reduce_axis(m, ReduceKind::Mean)?;
        interior.push(m.node);
        if mx != x || maxes != axes || !self.float(x) {
            return None;
        }
        let xs = self.g.value_type(x).clone();
        let rank = xs.rank();
        let axis = axes[0];
        if axes != (axis..rank).collect::<Vec<_>>() {
            return None;
        }
        // The result must keep x's type (parameters that broadcast x up are not LayerNorm's).
        if self.g.value_type(root) != &xs || self.g.value_type(d) != &xs {
            return None;
        }
        let epsilon = self.norm_epsilon(&xs, axis, &[scale, bias], eps)?;
        Some((
            Fused::LayerNorm {
                x,
                scale,
                bias,
                axis,
                epsilon,
            },
            interior,
        ))
    }

    /// `x / sqrt(mean(x²) + eps) [* scale]` over the trailing axes (RMSNorm, as T5 and Llama
    /// write it: `x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)`); the division may be a
    /// multiplication by `Reciprocal(Sqrt(..))` or by `1 / Sqrt(..)`.
    fn rms_norm(&self, root: ValueId) -> Option<(Fused, Vec<NodeId>)> {
        let mut interior = vec![];
        let mut cur = root;
        let mut scale = None;
        if let Some((a, b)) = self.binary(cur, Binary::Mul) {
            let (n, p) = if self.is_norm_div(a) { (a, b) } else { (b, a) };
            if self.is_norm_div(n) {
                scale = Some(p);
                interior.push(cur.node);
                cur = n;
            }
        }
        let (x, (s, divisor)) = self.norm_div(cur)?;
        interior.push(cur.node);
        if divisor != s {
            interior.push(divisor.node);
        }
        let (axes, eps) = self.root_mean_square(s, x, &mut interior)?;
        let xs = self.g.value_type(x).clone();
        let axis = axes[0];
        if !self.float(x) || axes != (axis..xs.rank()).collect::<Vec<_>>() {
            return None;
        }
        if self.g.value_type(root) != &xs || self.g.value_type(cur) != &xs {
            return None;
        }
        let epsilon = self.norm_epsilon(&xs, axis, &[scale], eps)?;
        Some((
            Fused::RmsNorm {
                x,
                scale,
                axis,
                epsilon,
            },
            interior,
        ))
    }

    /// `s = Sqrt(ReduceMean(v², axes) + eps)` (the square a Pow by 2 or `v * v`), the
    /// denominator of LayerNorm (v centred) and RMSNorm: returns the axes and eps, adding the
    /// chain's nodes to `interior`.
    fn root_mean_square(
        &self,
        s: ValueId,
        v: ValueId,
        interior: &mut Vec<NodeId>,
    ) -> Option<(Vec<usize>, f64)> {
        let e = self.unary(s, Unary::Sqrt)?;
        interior.push(s.node);
        let (va, ea) = self.binary(e, Binary::Add)?;
        let (var, eps) = match (self.scalar(va), self.scalar(ea)) {
            (None, Some(c)) => (va, c),
            (Some(c), None) => (ea, c),
            _ => return None,
        };
        interior.push(e.node);
        let (sq, axes) = self.reduce_axis(var, ReduceKind::Mean)?;
        interior.push(var.node);
        match (self.binary(sq, Binary::Pow), self.binary(sq, Binary::Mul)) {
            (Some((b, p)), _) if b == v && self.is_const(p, 2.0) => {}
            (_, Some((a, b))) if a == v && b == v => {}
            _ => return None,
        }
        interior.push(sq.node);
        Some((axes, eps))
    }

    fn is_norm_div(&self, v: ValueId) -> bool {
        self.norm_div(v).is_some()
    }

    /// `d / s`, `d * Reciprocal(s)` or `d * (1 / s)` (either operand order) where `s =
    /// Sqrt(..)`: returns `(d, (s, the divisor value as read by the node))`.
    fn norm_div(&self, v: ValueId) -> Option<(ValueId, (ValueId, ValueId))> {
        if let Some((d, s)) = self.binary(v, Binary::Div) {
            self.unary(s, Unary::Sqrt)?;
            return Some((d, (s, s)));
        }
        let (a, b) = self.binary(v, Binary::Mul)?;
        for (d, r) in [(a, b), (b, a)] {
            let s = match self.binary(r, Binary::Div) {
                Some((one, s)) if self.is_const(one, 1.0) => Some(s),
                _ => self.unary(r, Unary::Reciprocal),
            };
            if let Some(s) = s.filter(|&s| self.unary(s, Unary::Sqrt).is_some()) {
                return Some((d, (s, r)));
            }
        }
        None
    }

    /// The epsilon of a normalization of `xs` over the axes from `axis`, when every parameter
    /// in `params` has its dtype and varies only along those axes and the epsilon is a
    /// non-negative number.
    fn norm_epsilon(
        &self,
        xs: &TensorType,
        axis: usize,
        params: &[Option<ValueId>],
        eps: f64,
    ) -> Option<f32> {
        for p in params.iter().flatten() {
            let t = self.g.value_type(*p);
            if t.dtype != xs.dtype || !row_param(&t.shape, &xs.shape, axis) {
                return None;
            }
        }
        let epsilon = eps as f32;
        (!epsilon.is_nan() && epsilon >= 0.0).then_some(epsilon)
    }

    /// `Exp(t) / ReduceSum(Exp(t))` (or `* Reciprocal(ReduceSum(..))`) over one axis, where
    /// `t` is `x` or `x - ReduceMax(x)` over the same axis.
    fn softmax(&self, root: ValueId) -> Option<(Fused, Vec<NodeId>)> {
        let mut interior = vec![];
        let (e, s) = match self.binary(root, Binary::Div) {
            Some(p) => p,
            None => {
                let (a, b) = self.binary(root, Binary::Mul)?;
                let (e, r) = if self.unary(b, Unary::Reciprocal).is_some() {
                    (a, b)
                } else {
                    (b, a)
                };
                let s = self.unary(r, Unary::Reciprocal)?;
                interior.push(r.node);
                (e, s)
            }
        };
        let t = self.unary(e, Unary::Exp)?;
        interior.push(e.node);
        let (se, axes) = self.reduce_axis(s, ReduceKind::Sum)?;
        interior.push(s.node);
        if se != e || axes.len() != 1 {
            return None;
        }
        let axis = axes[0];
        let x = match self.binary(t, Binary::Sub) {
            Some((x, m)) => match self.reduce_axis(m, ReduceKind::Max) {
                Some((mx, maxes)) if mx == x && maxes == axes => {
                    interior.extend([t.node, m.node]);
                    x
                }
                _ => t,
            },
            None => t,
        };
        if !self.same_type(x, root) {
            return None;
        }
        Some((Fused::Softmax { x, axis }, interior))
    }

    /// `0.5·x·(1 + erf(x/√2))` and `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, the
    /// factors in any order and grouping.
    fn gelu(&self, root: ValueId) -> Option<(Fused, Vec<NodeId>)> {
        self.binary(root, Binary::Mul)?;
        let mut interior = vec![];
        let mut leaves = vec![];
        self.product(root, 3, &mut interior, &mut leaves);
        // The root is not interior.
        interior.retain(|&n| n != root.node);
        let coef: f64 = leaves.iter().filter_map(Leaf::constant).product();
        let vals: Vec<ValueId> = leaves.iter().filter_map(Leaf::value).collect();
        if !near(coef, 0.5) || vals.len() != 2 {
            return None;
        }
        for (x, one_plus) in [(vals[0], vals[1]), (vals[1], vals[0])] {
            let Some((a, b)) = self.binary(one_plus, Binary::Add) else {
                continue;
            };
            let f = match (self.is_const(a, 1.0), self.is_const(b, 1.0)) {
                (true, false) => b,
                (false, true) => a,
                _ => continue,
            };
            let mut inner = vec![one_plus.node, f.node];
            let tanh = if let Some(z) = self.unary(f, Unary::Erf) {
                if !self.scaled_x(z, x, std::f64::consts::FRAC_1_SQRT_2, &mut inner) {
                    continue;
                }
                false
            } else if let Some(z) = self.unary(f, Unary::Tanh) {
                if !self.tanh_arg(z, x, &mut inner) {
                    continue;
                }
                true
            } else {
                continue;
            };
            if !self.same_type(x, root) || !self.float(x) {
                return None;
            }
            interior.extend(inner);
            return Some((Fused::Gelu { x, tanh }, interior));
        }
        None
    }

    /// `z = c·x` (Mul or Div by a constant) with `c ≈ want`.
    fn scaled_x(&self, z: ValueId, x: ValueId, want: f64, nodes: &mut Vec<NodeId>) -> bool {
        let mut ns = vec![];
        let mut leaves = vec![];
        self.product(z, 2, &mut ns, &mut leaves);
        let coef: f64 = leaves.iter().filter_map(Leaf::constant).product();
        let vals: Vec<ValueId> = leaves.iter().filter_map(Leaf::value).collect();
        if vals == [x] && near(coef, want) {
            nodes.extend(ns);
            true
        } else {
            false
        }
    }

    /// `z = √(2/π)·(x + 0.044715·x³)` with x³ as `Pow(x, 3)` or a product of x's.
    fn tanh_arg(&self, z: ValueId, x: ValueId, nodes: &mut Vec<NodeId>) -> bool {
        let mut ns = vec![];
        let mut leaves = vec![];
        self.product(z, 2, &mut ns, &mut leaves);
        let coef: f64 = leaves.iter().filter_map(Leaf::constant).product();
        let vals: Vec<ValueId> = leaves.iter().filter_map(Leaf::value).collect();
        let [sum] = vals.as_slice() else { return false };
        if !near(coef, (2.0 / std::f64::consts::PI).sqrt()) {
            return false;
        }
        let Some((a, b)) = self.binary(*sum, Binary::Add) else {
            return false;
        };
        let cube = if a == x {
            b
        } else if b == x {
            a
        } else {
            return false;
        };
        let mut cns = vec![];
        let mut cl = vec![];
        self.product(cube, 3, &mut cns, &mut cl);
        let c: f64 = cl.iter().filter_map(Leaf::constant).product();
        let mut power = 0;
        for l in &cl {
            match l {
                Leaf::Const(_) => {}
                Leaf::Value(v) if *v == x => power += 1,
                Leaf::Value(v) => match self.binary(*v, Binary::Pow) {
                    Some((b, p)) if b == x && self.is_const(p, 3.0) => {
                        power += 3;
                        cns.push(v.node);
                    }
                    Some((b, p)) if b == x && self.is_const(p, 2.0) => {
                        power += 2;
                        cns.push(v.node);
                    }
                    _ => return false,
                },
            }
        }
        if power != 3 || !near(c, 0.044715) {
            return false;
        }
        nodes.extend(ns);
        nodes.push(sum.node);
        nodes.extend(cns);
        true
    }

    fn sole_consumer(&self, v: ValueId) -> Option<NodeId> {
        if self.outputs.contains(&v) {
            return None;
        }
        match self.consumers.get(&v)?.as_slice() {
            [c] if self
                .g
                .node(*c)
                .inputs
                .iter()
                .flatten()
                .filter(|&&i| i == v)
                .count()
                == 1 =>
            {
                Some(*c)
            }
            _ => None,
        }
    }
}

#[derive(Debug)]
enum Leaf {
    Const(f64),
    Value(ValueId),
}

impl Leaf {
    fn constant(&self) -> Option<f64> {
        match self {
            Leaf::Const(c) => Some(*c),
            Leaf::Value(_) => None,
        }
    }
    fn value(&self) -> Option<ValueId> {
        match self {
            Leaf::Value(v) => Some(*v),
            Leaf::Const(_) => None,
        }
    }
}

/// A LayerNorm parameter of shape `p` varies only along x's axes `axis..` (it may have fewer
/// dimensions, or leading 1s).
fn row_param(p: &[kiln_ir::Dim], x: &[kiln_ir::Dim], axis: usize) -> bool {
    let lead = x.len() - axis;
    if p.len() > x.len() {
        return false;
    }
    let extra = p.len().saturating_sub(lead);
    if p[..extra].iter().any(|d| d != &kiln_ir::Dim::Fixed(1)) {
        return false;
    }
    p[extra..]
        .iter()
        .rev()
        .zip(x.iter().rev())
        .all(|(pd, xd)| pd == xd || pd == &kiln_ir::Dim::Fixed(1))
}

/// Copies `src`, emitting the fused operator at each pattern root and leaving out every node
/// no longer read (what the patterns absorbed).
fn apply(src: &Graph, fused: &HashMap<NodeId, Fused>) -> Result<Graph, IrError> {
    let mut live = vec![false; src.len()];
    for o in src.outputs() {
        live[o.value.node.index()] = true;
    }
    for id in src.node_ids().collect::<Vec<_>>().into_iter().rev() {
        if !live[id.index()] {
            continue;
        }
        let deps = match fused.get(&id) {
            Some(f) => f.inputs(),
            None => src.node(id).inputs.iter().flatten().copied().collect(),
        };
        for d in deps {
            live[d.node.index()] = true;
        }
    }
    let mut dst = Graph::new(src.name.clone());
    let mut map: HashMap<ValueId, ValueId> = HashMap::new();
    for &id in src.inputs() {
        let out = &src.node(id).outputs[0];
        map.insert(id.out(0), dst.add_input(out.name.clone(), out.ty.clone()));
    }
    for (id, node) in src.node_ids().zip(src.nodes()) {
        if !live[id.index()] || matches!(node.op, Op::Input) {
            continue;
        }
        let outs = match (fused.get(&id), &node.op) {
            (Some(f), _) => vec![emit(&mut dst, node, f, &map)?],
            (None, Op::Constant(c)) => {
                vec![dst.add_const(node.outputs[0].name.clone(), src.consts()[c.0 as usize].clone())]
            }
            (None, op) => {
                let inputs = node.inputs.iter().map(|v| v.map(|v| map[&v])).collect();
                dst.add_node(
                    node.name.clone(),
                    op.clone(),
                    inputs,
                    node.outputs.iter().map(|o| o.name.clone()).collect(),
                )?
            }
        };
        for (o, v) in outs.into_iter().enumerate() {
            map.insert(id.out(o as u32), v);
        }
    }
    for o in src.outputs() {
        dst.add_output(o.name.clone(), map[&o.value]);
    }
    Ok(dst)
}

/// Ones over `x`'s axes from `axis`: the scale a normalization operator needs when the pattern
/// had none.
fn unit_scale(
    dst: &mut Graph,
    x: ValueId,
    axis: usize,
    name: &str,
    out: &str,
    op: &str,
) -> Result<ValueId, IrError> {
    let ty = dst.value_type(x).clone();
    let shape: Vec<usize> = ty
        .fixed_shape()
        .map(|s| s[axis..].to_vec())
        .ok_or_else(|| IrError::node(name, op, "normalised axes must be static"))?;
    let n = shape.iter().product();
    let ones = Tensor::new(
        shape,
        kiln_ir::tensor::TensorData::from_f64s(ty.dtype, vec![1.0; n]),
    )
    .map_err(|e| IrError::node(name, op, e.to_string()))?;
    Ok(dst.add_const(format!("{out}.scale"), ones))
}

/// Adds the fused operator for `root` (named after it, its output keeping the root's name).
fn emit(
    dst: &mut Graph,
    root: &Node,
    f: &Fused,
    map: &HashMap<ValueId, ValueId>,
) -> Result<ValueId, IrError> {
    let m = |v: &ValueId| map[v];
    let name = root.name.clone();
    let out = root.outputs[0].name.clone();
    match f {
        Fused::LayerNorm {
            x,
            scale,
            bias,
            axis,
            epsilon,
        } => {
            let x = m(x);
            let scale = match scale {
                Some(s) => m(s),
                None => unit_scale(dst, x, *axis, &name, &out, "LayerNormalization")?,
            };
            dst.add(
                name,
                Op::LayerNorm {
                    axis: *axis as i64,
                    epsilon: *epsilon,
                    stash_type: DType::F32,
                },
                vec![Some(x), Some(scale), bias.as_ref().map(m)],
                out,
            )
        }
        Fused::RmsNorm {
            x,
            scale,
            axis,
            epsilon,
        } => {
            let x = m(x);
            let scale = match scale {
                Some(s) => m(s),
                None => unit_scale(dst, x, *axis, &name, &out, "RMSNormalization")?,
            };
            dst.add(
                name,
                Op::Misc(MiscOp::RmsNorm {
                    axis: *axis as i64,
                    epsilon: *epsilon,
                    stash_type: DType::F32,
                }),
                vec![Some(x), Some(scale)],
                out,
            )
        }
        Fused::Softmax { x, axis } => dst.add(
            name,
            Op::Softmax {
                axis: *axis as i64,
                coerce_2d: false,
            },
            vec![Some(m(x))],
            out,
        ),
        Fused::Gelu { x, tanh } => dst.add(
            name,
            Op::Unary(Unary::Gelu { tanh: *tanh }),
            vec![Some(m(x))],
            out,
        ),
        Fused::ProjectionSlice {
            x,
            weight,
            bias,
            shape,
        } => {
            let x = m(x);
            let mut product_shape = dst.value_type(x).fixed_shape().unwrap_or_default();
            if let Some(last) = product_shape.last_mut() {
                *last = weight.shape()[1];
            }
            let reshaped = &product_shape != shape;
            let w = dst.add_const(format!("{out}.weight"), weight.clone());
            let product_out = if reshaped || bias.is_some() {
                format!("{out}.product")
            } else {
                out.clone()
            };
            let mut y = dst.add(
                format!("{name}.product"),
                Op::MatMul,
                vec![Some(x), Some(w)],
                product_out,
            )?;
            if let Some(b) = bias {
                let b = dst.add_const(format!("{out}.bias"), b.clone());
                let biased = if reshaped {
                    format!("{out}.biased")
                } else {
                    out.clone()
                };
                y = dst.add(
                    format!("{name}.bias"),
                    Op::Binary(Binary::Add),
                    vec![Some(y), Some(b)],
                    biased,
                )?;
            }
            if reshaped {
                y = reshape_named(dst, y, shape, name, out)?;
            }
            Ok(y)
        }
        Fused::Attention {
            q,
            k,
            k_transposed,
            v,
            mask,
            scale,
            heads,
            shapes,
        } => {
            let (mut q, mut k, mut v) = (m(q), m(k), m(v));
            if *k_transposed {
                k = dst.add(
                    format!("{name}.k"),
                    Op::Transpose {
                        perm: vec![0, 1, 3, 2],
                    },
                    vec![Some(k)],
                    format!("{out}.k"),
                )?;
            }
            if let Some(s) = shapes {
                q = reshape_to(dst, q, &s.q, &format!("{name}.q"))?;
                k = reshape_to(dst, k, &s.k, &format!("{name}.k"))?;
                v = reshape_to(dst, v, &s.v, &format!("{name}.v"))?;
            }
            let merged = shapes.as_ref().is_some_and(|s| s.root != s.y);
            let attention_out = if merged {
                format!("{out}.attention")
            } else {
                out.clone()
            };
            let y = dst.add(
                name.clone(),
                Op::Attention(AttentionAttrs {
                    is_causal: false,
                    q_num_heads: *heads,
                    kv_num_heads: *heads,
                    qk_matmul_output_mode: 0,
                    scale: Some(*scale),
                    softcap: 0.0,
                    softmax_precision: None,
                    left_window_size: -1,
                    right_window_size: -1,
                }),
                vec![Some(q), Some(k), Some(v), mask.as_ref().map(m)],
                attention_out,
            )?;
            match shapes {
                // The root wanted another reshape of the merged heads: keep its shape.
                Some(s) if merged => reshape_named(dst, y, &s.root, format!("{name}.merge"), out),
                _ => Ok(y),
            }
        }
    }
}

/// `x` reshaped to `shape` (a Reshape by a constant), or `x` when it already has that shape.
fn reshape_to(dst: &mut Graph, x: ValueId, shape: &[usize], name: &str) -> Result<ValueId, IrError> {
    if dst.value_type(x).fixed_shape().as_deref() == Some(shape) {
        return Ok(x);
    }
    reshape_named(dst, x, shape, name.to_string(), format!("{name}.reshaped"))
}

fn reshape_named(
    dst: &mut Graph,
    x: ValueId,
    shape: &[usize],
    name: String,
    out: String,
) -> Result<ValueId, IrError> {
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let c = dst.add_const(format!("{out}.shape"), Tensor::from_vec(vec![dims.len()], dims));
    dst.add(
        name,
        Op::Reshape { allow_zero: false },
        vec![Some(x), Some(c)],
        out,
    )
}
