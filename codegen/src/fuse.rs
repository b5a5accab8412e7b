//! Epilogue fusion at kernel selection: a Conv or MatMul whose only consumer is a chain of
//! `Add` (a residual of the same shape, or for MatMul a constant per-column bias) and an
//! activation (Relu, Clip with constant bounds, Sigmoid, SiLU as `x * sigmoid(x)`, HardSwish,
//! GELU in its erf and tanh forms)
//! runs as one kernel that applies them to the output tile while it is in registers.
//! The chain's intermediate values are never stored. The kernel runs at the position of the
//! chain's last node, where every input it reads (the residual included) has been computed.
//! On the input side, a channels-last convolution whose input is `x * s` with a per-channel
//! `s` (squeeze-excitation) reads `x` and `s` and scales while packing (`InputScale`).

use crate::kernel::epilogue::{Activation, Bias, Epilogue, Quantize, Residual};
use kiln_ir::{Binary, DType, Graph, NodeId, Op, QuantOp, Unary, ValueId};
use std::collections::{HashMap, HashSet};

/// A fusable chain starting at `anchor`.
pub struct Chain {
    pub anchor: NodeId,
    /// The absorbed nodes in order; the last one's output is the kernel's output.
    pub absorbed: Vec<NodeId>,
    pub output: ValueId,
    pub residual: Option<ValueId>,
    /// A constant per-column bias for a MatMul.
    pub col_bias: Option<Vec<f32>>,
    pub activation: Activation,
    /// A GlobalAveragePool of the chain's output computed by the same kernel (a depthwise
    /// convolution has each channel's plane in cache when it finishes it). The output is still
    /// stored for its other users.
    pub pool: Option<NodeId>,
    /// The chain ends in the autocast's `Cast<bf16>` → `Cast<f32>` of a result with no other
    /// use: the kernel rounds its output to bf16 values and the two casts need no kernels.
    pub round_bf16: bool,
    /// A channels-last convolution's input is `x * s` with a per-image channel vector `s`
    /// (squeeze-excitation) used nowhere else: the kernel scales `x` as it packs it
    /// (`Epilogue::input_scale`), and the Mul needs no kernel.
    pub input_scale: Option<InputScale>,
    /// An integer product's `Cast<f32>` and per-channel scale `Mul` (and the bias `Add` after
    /// them, in `col_bias`): the kernel converts its integer sums and scales them
    /// (`Epilogue::dequantize`).
    pub dequantize: Option<Vec<f32>>,
    /// The chain of an integer product ends in a per-tensor QuantizeLinear to u8 (in
    /// `absorbed`), its result's only use: the kernel stores bytes (`Epilogue::quantize`).
    pub quantize: Option<Quantize>,
    /// The skip connection of a quantized residual block, added after an integer product's
    /// fake-quantized result (`Epilogue`'s `Residual::Skip`); `residual` is its input.
    pub skip: Option<Skip>,
}

/// `fake_quant(product) + x`, `x` read as it is stored: an f32 value, or the u8 input of a
/// DequantizeLinear whose only use is the Add (the kernel dequantizes it, so the f32 copy
/// never exists).
#[derive(Clone, Copy, Debug)]
pub struct Skip {
    pub add: NodeId,
    /// The fused DequantizeLinear and its parameters.
    pub dequantize: Option<(NodeId, Quantize)>,
    /// How many nodes `absorbed` held before the skip's: what the chain is without it.
    absorbed_before: usize,
}

/// The `Mul` in front of a chain's anchor (`Chain::input_scale`).
#[derive(Clone, Copy, Debug)]
pub struct InputScale {
    pub mul: NodeId,
    /// The unscaled input `[N, H, W, C]`, read in place of the Mul's output.
    pub input: ValueId,
    /// The scales, `[N, 1, 1, C]`.
    pub scale: ValueId,
    /// The bf16 autocast's rounding pair between the Mul and the anchor (narrowing Cast,
    /// widening Cast): the kernel's bf16 packing rounds as the pair does, so only a kernel
    /// that packs A as bf16 pairs takes the scale then.
    pub rounding: Option<[NodeId; 2]>,
}

impl Chain {
    /// The epilogue for the anchor's generated kernel (the Conv's own bias included).
    pub fn epilogue(&self, graph: &Graph, residual_slot: usize) -> Epilogue {
        let anchor = graph.node(self.anchor);
        let bias = match (&anchor.op, &self.col_bias) {
            (_, Some(b)) => Bias::PerCol(b.clone()),
            (Op::Conv(_), None) => match anchor
                .inputs
                .get(2)
                .copied()
                .flatten()
                .and_then(|b| graph.known_value(b))
            {
                Some(b) => Bias::PerRow(b.to_f64_vec().iter().map(|&v| v as f32).collect()),
                None => Bias::None,
            },
            _ => Bias::None,
        };
        let residual = self.residual.map(|_| match self.skip {
            Some(skip) => Residual::Skip {
                input: residual_slot,
                dequantize: skip.dequantize.map(|(_, params)| params),
            },
            None => Residual::Input(residual_slot),
        });
        let mut epi = Epilogue::new(bias, residual, self.activation);
        epi.pool_mean = self.pool.is_some();
        epi.round_bf16 = self.round_bf16;
        epi.input_scale = self.input_scale.map(|_| residual_slot + 1);
        epi.dequantize = self.dequantize.clone();
        epi.quantize = self.quantize;
        epi
    }

    /// The chain without its skip connection (when its kernel does not take it): it ends at
    /// the fake-quantized result again, which is stored as f32.
    pub fn without_skip(&mut self) {
        let Some(skip) = self.skip.take() else {
            return;
        };
        self.absorbed.truncate(skip.absorbed_before);
        self.residual = None;
        self.quantize = None;
        self.round_bf16 = false;
        if let Some(&last) = self.absorbed.last() {
            self.output = last.out(0);
        }
    }

    /// Every node the chain's kernel computes besides its anchor.
    pub fn fused_nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.input_scale
            .into_iter()
            .flat_map(|s| std::iter::once(s.mul).chain(s.rounding.into_iter().flatten()))
            .chain(self.absorbed.iter().copied())
            .chain(self.pool)
    }
}

fn consumers(graph: &Graph) -> (HashMap<ValueId, Vec<NodeId>>, HashMap<ValueId, usize>) {
    let mut by_value: HashMap<ValueId, Vec<NodeId>> = HashMap::new();
    for (id, n) in graph.node_ids().zip(graph.nodes()) {
        for v in n.inputs.iter().flatten() {
            by_value.entry(*v).or_default().push(id);
        }
    }
    let uses = kiln_ir::rewrite::use_counts(graph);
    (by_value, uses)
}

/// `v` reaches an unclaimed Add, or an activation the epilogue applies, through reshapes that
/// keep its last dimension, each the sole reader of the one before.
fn reshapes_to_epilogue(
    graph: &Graph,
    mut v: ValueId,
    sole: &impl Fn(ValueId) -> Option<NodeId>,
    claimed: &HashSet<NodeId>,
) -> bool {
    let n = last_dim(graph, v);
    for _ in 0..4 {
        let Some(d) = sole(v).filter(|d| !claimed.contains(d)) else {
            return false;
        };
        match &graph.node(d).op {
            Op::Binary(Binary::Add) | Op::Clip => return true,
            Op::Unary(u) if unary_activation(u).is_some() => return true,
            Op::Reshape { .. } | Op::Flatten { .. } | Op::Squeeze | Op::Unsqueeze
                if last_dim(graph, d.out(0)) == n =>
            {
                v = d.out(0)
            }
            _ => return false,
        }
    }
    false
}

/// The epilogue activation a unary operator is, if it is one.
fn unary_activation(u: &Unary) -> Option<Activation> {
    match u {
        Unary::Relu => Some(Activation::Relu),
        Unary::HardSwish => Some(Activation::HardSwish),
        Unary::Sigmoid => Some(Activation::Sigmoid),
        Unary::Gelu { tanh: true } => Some(Activation::GeluTanh),
        Unary::Gelu { tanh: false } => Some(Activation::GeluErf),
        _ => None,
    }
}

fn last_dim(graph: &Graph, v: ValueId) -> Option<usize> {
    graph.value_type(v).fixed_shape()?.last().copied()
}

fn is_f32(graph: &Graph, v: ValueId) -> bool {
    graph.value_type(v).dtype == DType::F32
}

/// `Mul(Clip(Round(Div(v, s)), lo, hi), s)` reading `v`, each node the only use of the one
/// before, none claimed, `s`, `lo` and `hi` scalar constants: the nodes and `(s, lo, hi)`.
fn fake_quant_after(
    graph: &Graph,
    v: ValueId,
    sole: impl Fn(ValueId) -> Option<NodeId>,
    claimed: &HashSet<NodeId>,
) -> Option<([NodeId; 4], (f32, f32, f32))> {
    let scalar = |v: Option<&Option<ValueId>>| -> Option<f32> {
        let t = graph.known_value((*v?)?)?;
        (t.len() == 1 && t.dtype() == DType::F32).then(|| t.to_f64_vec()[0] as f32)
    };
    let next = |v: ValueId, pred: fn(&Op) -> bool| -> Option<NodeId> {
        sole(v).filter(|c| !claimed.contains(c) && pred(&graph.node(*c).op))
    };
    let div = next(v, |op| matches!(op, Op::Binary(Binary::Div)))?;
    let dn = graph.node(div);
    if dn.inputs.first().copied().flatten() != Some(v) {
        return None;
    }
    let scale = scalar(dn.inputs.get(1))?;
    let round = next(div.out(0), |op| matches!(op, Op::Unary(Unary::Round)))?;
    let clip = next(round.out(0), |op| matches!(op, Op::Clip))?;
    let cn = graph.node(clip);
    let (lo, hi) = (scalar(cn.inputs.get(1))?, scalar(cn.inputs.get(2))?);
    let mul = next(clip.out(0), |op| matches!(op, Op::Binary(Binary::Mul)))?;
    let mn = graph.node(mul);
    let other = match mn.inputs.as_slice() {
        [Some(a), b] if *a == clip.out(0) => b,
        [a, Some(b)] if *b == clip.out(0) => a,
        _ => return None,
    };
    if scalar(Some(other)) != Some(scale) || graph.value_type(mul.out(0)) != graph.value_type(v) {
        return None;
    }
    Some(([div, round, clip, mul], (scale, lo, hi)))
}

/// The skip connection after `v` (`Skip`): its only use is an Add, not claimed, of another
/// value with `v`'s type, or of a per-tensor DequantizeLinear (constant f32 scale, u8 zero
/// point if any) of u8 bytes of that shape and layout whose only use is the Add. Returns the
/// skip and the value the kernel reads.
fn skip_after(
    graph: &Graph,
    v: ValueId,
    sole: impl Fn(ValueId) -> Option<NodeId>,
    claimed: &HashSet<NodeId>,
    absorbed_before: usize,
) -> Option<(Skip, ValueId)> {
    let add =
        sole(v).filter(|c| !claimed.contains(c) && matches!(graph.node(*c).op, Op::Binary(Binary::Add)))?;
    let ty = graph.value_type(v);
    let other = match graph.node(add).inputs.as_slice() {
        [Some(a), Some(b)] if *a == v && *b != v => *b,
        [Some(a), Some(b)] if *b == v && *a != v => *a,
        _ => return None,
    };
    if graph.value_type(other) != ty
        || graph.value_type(add.out(0)) != ty
        || graph.known_value(other).is_some()
    {
        return None;
    }
    let skip = |dequantize| Skip {
        add,
        dequantize,
        absorbed_before,
    };
    let dq = other.node;
    let dn = graph.node(dq);
    let per_tensor = matches!(dn.op, Op::Quant(QuantOp::DequantizeLinear { block_size: 0, .. }));
    if !per_tensor || claimed.contains(&dq) || sole(other) != Some(add) {
        return Some((skip(None), other));
    }
    let scalar = |i: usize| {
        graph
            .known_value(dn.inputs.get(i).copied().flatten()?)
            .filter(|t| t.len() == 1)
    };
    let bytes = dn.inputs.first().copied().flatten()?;
    let bt = graph.value_type(bytes);
    let scale = scalar(1)
        .filter(|t| t.dtype() == DType::F32)
        .map(|t| t.to_f64_vec()[0] as f32);
    let zero_point = match dn.inputs.get(2).copied().flatten() {
        None => Some(0),
        Some(_) => scalar(2).and_then(|t| t.as_slice::<u8>().map(|z| z[0])),
    };
    match (scale, zero_point) {
        (Some(scale), Some(zero_point))
            if bt.dtype == DType::U8 && bt.shape == ty.shape && bt.layout == ty.layout && scale > 0.0 =>
        {
            Some((skip(Some((dq, Quantize { scale, zero_point }))), bytes))
        }
        _ => Some((skip(None), other)),
    }
}

/// The values of a constant f32 operand that is one per output channel (`[n]`, or `[1, .., n]`)
/// or a single value (repeated `n` times): a scale or bias per column of a product.
fn per_channel_const(graph: &Graph, v: ValueId, n: usize) -> Option<Vec<f32>> {
    let t = graph.known_value(v)?;
    if t.dtype() != DType::F32 || t.shape().iter().rev().skip(1).any(|&d| d != 1) {
        return None;
    }
    let vals: Vec<f32> = t.to_f64_vec().iter().map(|&x| x as f32).collect();
    match vals.len() {
        1 => Some(vec![vals[0]; n]),
        len if len == n => Some(vals),
        _ => None,
    }
}

/// The float result of integer sums (`dequantize_after`).
struct Dequantized {
    /// The Cast, the Mul and the bias Add if any.
    nodes: Vec<NodeId>,
    scale: Vec<f32>,
    bias: Option<Vec<f32>>,
    /// The last node's output.
    end: ValueId,
}

/// After an integer product's output `acc` (i32, output channels or columns last: a
/// channels-last ConvInteger, a MatMulInteger): `Cast<f32>`, a `Mul` by a constant per-channel
/// scale, and optionally an `Add` of a constant per-channel bias, each the only use of the one
/// before and none claimed.
fn dequantize_after(
    graph: &Graph,
    acc: ValueId,
    sole: impl Fn(ValueId) -> Option<NodeId>,
    claimed: &HashSet<NodeId>,
) -> Option<Dequantized> {
    let n = *graph.value_type(acc).fixed_shape()?.last()?;
    let next = |v: ValueId| sole(v).filter(|c| !claimed.contains(c));
    let other = |node: NodeId, v: ValueId| -> Option<ValueId> {
        match graph.node(node).inputs.as_slice() {
            [Some(a), Some(b)] if *a == v => Some(*b),
            [Some(a), Some(b)] if *b == v => Some(*a),
            _ => None,
        }
    };
    let cast = next(acc).filter(|c| matches!(graph.node(*c).op, Op::Cast { to: DType::F32 }))?;
    let mul = next(cast.out(0)).filter(|c| matches!(graph.node(*c).op, Op::Binary(Binary::Mul)))?;
    let scale = per_channel_const(graph, other(mul, cast.out(0))?, n)?;
    let mut nodes = vec![cast, mul];
    let mut bias = None;
    let mut end = mul.out(0);
    if let Some(add) = next(end).filter(|c| matches!(graph.node(*c).op, Op::Binary(Binary::Add))) {
        if let Some(b) = other(add, end).and_then(|b| per_channel_const(graph, b, n)) {
            nodes.push(add);
            bias = Some(b);
            end = add.out(0);
        }
    }
    (graph.value_type(end).fixed_shape() == graph.value_type(acc).fixed_shape()).then_some(Dequantized {
        nodes,
        scale,
        bias,
        end,
    })
}

/// The only use of `v` (f32) when it is a QuantizeLinear to u8 with per-tensor constant
/// parameters that the integer kernel can store (`gen::gemm::stores_u8`), not claimed.
fn quantize_after(
    graph: &Graph,
    v: ValueId,
    sole: impl Fn(ValueId) -> Option<NodeId>,
    claimed: &HashSet<NodeId>,
) -> Option<(NodeId, Quantize)> {
    let q = sole(v).filter(|c| !claimed.contains(c))?;
    let node = graph.node(q);
    let Op::Quant(QuantOp::QuantizeLinear {
        block_size: 0,
        output_dtype: DType::U8,
        precision: None,
        ..
    }) = node.op
    else {
        return None;
    };
    let scalar = |i: usize| {
        graph
            .known_value(node.inputs.get(i).copied().flatten()?)
            .filter(|t| t.len() == 1)
    };
    let scale = scalar(1).filter(|t| t.dtype() == DType::F32)?.to_f64_vec()[0] as f32;
    let zero_point = match node.inputs.get(2).copied().flatten() {
        None => 0,
        Some(_) => scalar(2)?.as_slice::<u8>()?[0],
    };
    let channels = *graph.value_type(v).fixed_shape()?.last()?;
    (node.inputs.first() == Some(&Some(v)) && crate::gen::gemm::stores_u8(channels))
        .then_some((q, Quantize { scale, zero_point }))
}

/// The squeeze-excitation scale in front of a channels-last convolution `conv`: its input is
/// the only use of `x * s` (either operand order; under the bf16 autocast, through the
/// rounding pair that is its only use), `x` is `[N, H, W, C]` f32 and `s` `[N, 1, 1, C]` f32.
fn input_scale_of(
    graph: &Graph,
    conv: NodeId,
    sole: impl Fn(ValueId) -> Option<NodeId>,
    claimed: &HashSet<NodeId>,
) -> Option<InputScale> {
    let node = graph.node(conv);
    if !matches!(&node.op, Op::Conv(a) if a.channels_last && a.group <= 1) {
        return None;
    }
    let mut x = node.inputs.first().copied().flatten()?;
    if sole(x) != Some(conv) {
        return None;
    }
    let mut rounding = None;
    let widen = graph.node(x.node);
    if let (Op::Cast { to: DType::F32 }, Some(Some(narrowed))) = (&widen.op, widen.inputs.first()) {
        let narrow = graph.node(narrowed.node);
        match (&narrow.op, narrow.inputs.first()) {
            (Op::Cast { to: DType::BF16 }, Some(Some(product)))
                if sole(*narrowed) == Some(x.node)
                    && sole(*product) == Some(narrowed.node)
                    && !claimed.contains(&x.node)
                    && !claimed.contains(&narrowed.node) =>
            {
                rounding = Some([narrowed.node, x.node]);
                x = *product;
            }
            _ => return None,
        }
    }
    let mul = x.node;
    if claimed.contains(&mul) || !matches!(graph.node(mul).op, Op::Binary(Binary::Mul)) {
        return None;
    }
    let xt = graph.value_type(x);
    let shape = xt.fixed_shape()?;
    if xt.dtype != DType::F32 || shape.len() != 4 {
        return None;
    }
    let ins: Vec<ValueId> = graph.node(mul).inputs.iter().flatten().copied().collect();
    let [u, v] = ins.as_slice() else {
        return None;
    };
    let is_scale = |s: ValueId| {
        let t = graph.value_type(s);
        t.dtype == DType::F32 && t.fixed_shape() == Some(vec![shape[0], 1, 1, shape[3]])
    };
    let full = |s: ValueId| graph.value_type(s) == xt;
    let (input, scale) = if full(*u) && is_scale(*v) {
        (*u, *v)
    } else if full(*v) && is_scale(*u) {
        (*v, *u)
    } else {
        return None;
    };
    Some(InputScale {
        mul,
        input,
        scale,
        rounding,
    })
}

/// Finds the chains of every Conv/MatMul anchor (at most one per anchor). With `cpu` (CPU
/// targets, whose GEMM kernels round in their epilogue and scale A as they pack it), a
/// chain also takes the autocast's rounding pair when the pair is its result's only use, and
/// a squeeze-excitation scale of its input (`Chain::input_scale`).
pub fn find_chains(graph: &Graph, cpu: bool) -> Vec<Chain> {
    let (by_value, uses) = consumers(graph);
    let sole = |v: ValueId| -> Option<NodeId> {
        match (uses.get(&v), by_value.get(&v)) {
            (Some(1), Some(c)) if c.len() == 1 => Some(c[0]),
            _ => None,
        }
    };
    let mut chains = vec![];
    // A node joins at most one chain (an Add of two convolutions could join either).
    let mut claimed = HashSet::new();
    for (id, node) in graph.node_ids().zip(graph.nodes()) {
        // A product of block-quantized weights is a MatMul to its epilogue (CPU only: GPU
        // targets never see one, `dequantize-weights`).
        let is_matmul = matches!(node.op, Op::MatMul)
            || (cpu && matches!(node.op, Op::Quant(QuantOp::BlockQuantizedMatMul { .. })));
        // Integer products fuse on the CPU only, which has their kernels.
        let integer = cpu
            && match &node.op {
                Op::Quant(QuantOp::ConvInteger(a)) => a.channels_last,
                Op::Quant(QuantOp::MatMulInteger) => true,
                _ => false,
            };
        if !(matches!(node.op, Op::Conv(_)) || is_matmul || integer) || node.outputs.len() != 1 {
            continue;
        }
        let mut cur = id.out(0);
        let mut absorbed = vec![];
        let (mut dequantize, mut col_bias) = (None, None);
        if integer {
            let Some(d) = dequantize_after(graph, cur, sole, &claimed) else {
                continue;
            };
            (absorbed, dequantize, col_bias, cur) = (d.nodes, Some(d.scale), d.bias, d.end);
        }
        if !is_f32(graph, cur) {
            continue;
        }
        let mut chain = Chain {
            anchor: id,
            absorbed,
            output: cur,
            residual: None,
            col_bias,
            activation: Activation::None,
            pool: None,
            round_bf16: false,
            input_scale: None,
            dequantize,
            quantize: None,
            skip: None,
        };
        if cpu {
            chain.input_scale = input_scale_of(graph, id, sole, &claimed);
        }
        loop {
            // SiLU: the value feeds exactly a Sigmoid and the Mul of itself with that Sigmoid.
            if let (Some(2), Some(cs)) = (uses.get(&cur), by_value.get(&cur)) {
                if cs.len() == 2 {
                    let sig = cs
                        .iter()
                        .copied()
                        .find(|&c| matches!(graph.node(c).op, Op::Unary(Unary::Sigmoid)));
                    let mul = cs
                        .iter()
                        .copied()
                        .find(|&c| matches!(graph.node(c).op, Op::Binary(Binary::Mul)));
                    if let (Some(s), Some(m)) = (sig, mul) {
                        let sv = s.out(0);
                        let mn = graph.node(m);
                        let operands: Vec<ValueId> = mn.inputs.iter().flatten().copied().collect();
                        let free = !claimed.contains(&s) && !claimed.contains(&m);
                        if free && sole(sv) == Some(m) && operands.contains(&cur) && operands.contains(&sv) {
                            chain.absorbed.extend([s, m]);
                            chain.activation = Activation::Silu;
                            cur = m.out(0);
                        }
                    }
                }
                break;
            }
            let Some(c) = sole(cur).filter(|c| !claimed.contains(c)) else {
                break;
            };
            let cn = graph.node(c);
            let other = |cn: &kiln_ir::Node| -> Option<ValueId> {
                let ins: Vec<ValueId> = cn.inputs.iter().flatten().copied().collect();
                match ins.as_slice() {
                    [a, b] if *a == cur && *b != cur => Some(*b),
                    [a, b] if *b == cur && *a != cur => Some(*a),
                    _ => None,
                }
            };
            let out_ty = graph.value_type(cur).clone();
            match &cn.op {
                Op::Binary(Binary::Add) if chain.activation == Activation::None => {
                    let Some(o) = other(cn) else { break };
                    let oty = graph.value_type(o);
                    if chain.residual.is_none() && oty == &out_ty && graph.known_value(o).is_none() {
                        chain.residual = Some(o);
                    } else if is_matmul && chain.col_bias.is_none() && graph.known_value(o).is_some() {
                        let n = out_ty.fixed_shape().and_then(|s| s.last().copied()).unwrap_or(0);
                        let Some(bias) = per_channel_const(graph, o, n) else {
                            break;
                        };
                        chain.col_bias = Some(bias);
                    } else {
                        break;
                    }
                    if graph.value_type(c.out(0)) != &out_ty {
                        break;
                    }
                }
                Op::Unary(u) if chain.activation == Activation::None => match unary_activation(u) {
                    Some(a) => chain.activation = a,
                    None => break,
                },
                // A reshape keeping rows of the product's N columns (exporters wrap a 2-D
                // Gemm/MatMul in `[B, S, N] ↔ [B·S, N]` reshapes) on the way to an Add or an
                // activation (onnxruntime's optimizer leaves `Reshape → Gelu` after its
                // MatMul+bias): the tile writes the same bytes, so the Add's residual or bias,
                // or the activation, still fuses.
                Op::Reshape { .. } | Op::Flatten { .. } | Op::Squeeze | Op::Unsqueeze
                    if is_matmul
                        && chain.activation == Activation::None
                        && last_dim(graph, c.out(0)) == last_dim(graph, cur)
                        && reshapes_to_epilogue(graph, c.out(0), &sole, &claimed) => {}
                Op::Clip if chain.activation == Activation::None => {
                    let bound = |i: usize, dflt: f32| -> Option<f32> {
                        match cn.inputs.get(i).copied().flatten() {
                            None => Some(dflt),
                            Some(v) => graph
                                .known_value(v)
                                .and_then(|t| t.to_f64_vec().first().map(|&x| x as f32)),
                        }
                    };
                    let (Some(min), Some(max)) = (bound(1, f32::NEG_INFINITY), bound(2, f32::INFINITY))
                    else {
                        break;
                    };
                    chain.activation = Activation::Clip { min, max };
                }
                _ => break,
            }
            chain.absorbed.push(c);
            cur = c.out(0);
            if chain.activation != Activation::None {
                break;
            }
        }
        // Reshapes are only worth absorbing with the Add or activation after them.
        while let Some(&last) = chain.absorbed.last() {
            if !graph.node(last).op.is_view() {
                break;
            }
            chain.absorbed.pop();
            cur = graph.node(last).inputs[0].expect("a reshape reads its input");
        }
        // A fake-quantized result (`fake-quantize`'s Div, Round, Clip, Mul) after no
        // activation or a Relu, which the quantization's lower bound then takes over.
        if matches!(chain.activation, Activation::None | Activation::Relu) {
            if let Some((nodes, (scale, lo, hi))) = fake_quant_after(graph, cur, sole, &claimed) {
                let lo = if chain.activation == Activation::Relu {
                    lo.max(0.0)
                } else {
                    lo
                };
                chain.activation = Activation::FakeQuant { scale, lo, hi };
                cur = nodes[3].out(0);
                chain.absorbed.extend(nodes);
            }
        }
        // A quantized residual block: its skip connection joins the fake-quantized result
        // (the DequantizeLinear before the Add first: `absorbed` ends with the output's node).
        if integer && chain.residual.is_none() && matches!(chain.activation, Activation::FakeQuant { .. }) {
            if let Some((skip, input)) = skip_after(graph, cur, sole, &claimed, chain.absorbed.len()) {
                chain.absorbed.extend(skip.dequantize.map(|(dq, _)| dq));
                chain.absorbed.push(skip.add);
                chain.residual = Some(input);
                chain.skip = Some(skip);
                cur = skip.add.out(0);
            }
        }
        let grouped = matches!(&node.op, Op::Conv(a) if a.group > 1);
        if grouped && graph.value_type(cur).rank() == 4 {
            chain.pool = by_value.get(&cur).and_then(|cs| {
                cs.iter().copied().find(|&c| {
                    matches!(
                        graph.node(c).op,
                        Op::GlobalPool(kiln_ir::PoolKind::Average { .. })
                    ) && !claimed.contains(&c)
                        && is_f32(graph, c.out(0))
                })
            });
        }
        if cpu && !grouped {
            // The pair may round a reshape of the result (a product's [S, 1, N] output read
            // as [1, S, N] by attention): the kernel writes the same bytes either way.
            let mut views = vec![];
            let mut at = cur;
            while let Some(v) = sole(at).filter(|c| !claimed.contains(c) && graph.node(*c).op.is_view()) {
                if views.len() == 4 {
                    break;
                }
                views.push(v);
                at = v.out(0);
            }
            let narrow = sole(at).filter(|c| !claimed.contains(c));
            let widen = narrow
                .filter(|&c| matches!(graph.node(c).op, Op::Cast { to: DType::BF16 }))
                .and_then(|c| sole(c.out(0)))
                .filter(|c| !claimed.contains(c) && matches!(graph.node(*c).op, Op::Cast { to: DType::F32 }));
            if let (Some(n), Some(w)) = (narrow, widen) {
                chain.absorbed.extend(views);
                chain.absorbed.extend([n, w]);
                chain.round_bf16 = true;
                cur = w.out(0);
            }
        }
        // An integer product's result quantized for the next one: stored as bytes.
        if integer && !chain.round_bf16 {
            if let Some((q, params)) = quantize_after(graph, cur, sole, &claimed) {
                chain.absorbed.push(q);
                chain.quantize = Some(params);
                cur = q.out(0);
            }
        }
        if !chain.absorbed.is_empty() || chain.pool.is_some() || chain.input_scale.is_some() {
            claimed.extend(chain.fused_nodes());
            chain.output = cur;
            chains.push(chain);
        }
    }
    chains
}

/// Groups of elementwise nodes for one generated loop each (see `gen::elementwise`), in graph
/// order within a group, the last node's output being the group's output. A node joins the
/// group of a consumer when every use of its output is inside that group and it is not a graph
/// output, so the intermediates need no storage. Nodes in `claimed` (epilogues) stay out.
/// A single node is a group of its own only if it computes f32 (the others keep their library
/// kernels).
pub fn find_elementwise_groups(graph: &Graph, claimed: &HashSet<NodeId>) -> Vec<Vec<NodeId>> {
    find_elementwise_groups_on(graph, claimed, false)
}

/// [`find_elementwise_groups`] for the CPU loop or (`gpu`) the GPU kernel, which computes more
/// operators (`gen::elementwise::supports_on`).
pub fn find_elementwise_groups_on(graph: &Graph, claimed: &HashSet<NodeId>, gpu: bool) -> Vec<Vec<NodeId>> {
    let (by_value, uses) = consumers(graph);
    let outputs: HashSet<ValueId> = graph.outputs().iter().map(|o| o.value).collect();
    let ids: Vec<NodeId> = graph.node_ids().collect();
    let candidate: HashSet<NodeId> = ids
        .iter()
        .copied()
        .filter(|&id| {
            let node = graph.node(id);
            // The generator table says which operators the loops (and GPU kernels) cover.
            let gens = crate::generators::generators(&node.op);
            let listed = if gpu {
                gens.gpu.contains(&crate::generators::GpuGenerator::Elementwise)
            } else {
                gens.cpu
                    .contains(&crate::generators::CpuGenerator::ElementwiseLoop)
            };
            listed
                && !claimed.contains(&id)
                && node.outputs.len() == 1
                && graph.known_value(id.out(0)).is_none()
                && crate::gen::elementwise::supports_on(graph, id, gpu)
        })
        .collect();
    let mut member: HashSet<NodeId> = HashSet::new();
    let mut groups = vec![];
    // Roots are taken from the end, so a group grows backwards from its output.
    for &root in ids.iter().rev() {
        if !candidate.contains(&root) || member.contains(&root) {
            continue;
        }
        // A value can be kept inside a group when it is not a graph output and all its uses
        // are node inputs; the group must then hold all of them.
        let node_uses = |v: ValueId| {
            let n = by_value.get(&v).map_or(0, Vec::len);
            (!outputs.contains(&v) && n == uses.get(&v).copied().unwrap_or(0)).then_some(n)
        };
        let group = grow_group(
            graph,
            root,
            |p| candidate.contains(&p) && !member.contains(&p),
            node_uses,
        );
        // A lone f32 node runs generated too: the loop is specialised to its shapes, where the
        // library kernel walks a generic broadcast plan; so does a lone quantizing node (the
        // library's is a scalar loop).
        let lone =
            graph.value_type(root.out(0)).dtype == DType::F32 || matches!(graph.node(root).op, Op::Quant(_));
        if group.len() >= 2 || lone {
            member.extend(group.iter().copied());
            groups.push(group);
        }
    }
    groups.reverse();
    groups
}

/// The most nodes one elementwise group takes: its loop body is one straight-line function,
/// and LLVM's time on a function grows faster than its size, so a long chain (thousands of
/// Relus in a row) becomes several kernels instead of one function that takes minutes to
/// optimize. Real models' groups are a few nodes to a few dozen.
pub const MAX_GROUP_NODES: usize = 256;

#[cfg(test)]
thread_local! {
    /// Nodes visited by [`grow_group`] on this thread: tests check that grouping visits each
    /// node a bounded number of times, whatever the chain length.
    static GROW_VISITS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The group that grows backwards from `root`, sorted in graph order. A `free` producer joins
/// once every use of its value is inside the group (`node_uses(v)`: how many uses v has, or
/// None when it must be stored anyway). A worklist of new members and a count of each value's uses inside the
/// group make this linear in the group's edges: a member's inputs are looked at once, when
/// it joins.
fn grow_group(
    graph: &Graph,
    root: NodeId,
    free: impl Fn(NodeId) -> bool,
    node_uses: impl Fn(ValueId) -> Option<usize>,
) -> Vec<NodeId> {
    let mut group: HashSet<NodeId> = HashSet::from([root]);
    let mut uses_inside: HashMap<ValueId, usize> = HashMap::new();
    let mut work = vec![root];
    while let Some(n) = work.pop() {
        #[cfg(test)]
        GROW_VISITS.set(GROW_VISITS.get() + 1);
        for v in graph.node(n).inputs.iter().flatten() {
            let inside = uses_inside.entry(*v).or_insert(0);
            *inside += 1;
            let p = v.node;
            if group.len() >= MAX_GROUP_NODES || group.contains(&p) || !free(p) {
                continue;
            }
            if node_uses(*v) == Some(*inside) {
                group.insert(p);
                work.push(p);
            }
        }
    }
    let mut g: Vec<NodeId> = group.into_iter().collect();
    g.sort_by_key(|n| n.index());
    g
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{Dim, TensorType};

    /// `x → Relu → … → Relu` (n nodes), the last value a graph output.
    fn relu_chain(n: usize) -> Graph {
        let mut g = Graph::new("chain");
        let mut v = g.add_input(
            "x",
            TensorType::new(DType::F32, vec![Dim::Fixed(1), Dim::Fixed(4)]),
        );
        for i in 0..n {
            v = g
                .add(
                    format!("r{i}"),
                    Op::Unary(Unary::Relu),
                    vec![Some(v)],
                    format!("t{i}"),
                )
                .unwrap();
        }
        g.add_output("y", v);
        g
    }

    /// `x[4, 8] · w[8, 6] + b`, reshaped to `[1, 4, 6]`, then `then` (onnxruntime's optimizer
    /// writes `Reshape → Gelu` after its MatMul+bias).
    fn product_reshape_then(then: Op) -> Graph {
        let mut g = Graph::new("g");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[4, 8]));
        let w = g.add_const("w", kiln_ir::Tensor::from_vec(vec![8, 6], vec![0.25f32; 48]));
        let b = g.add_const("b", kiln_ir::Tensor::from_vec(vec![6], vec![0.5f32; 6]));
        let shape = g.add_const("shape", kiln_ir::Tensor::from_vec(vec![3], vec![1i64, 4, 6]));
        let add = |g: &mut Graph, name: &str, op: Op, ins: &[ValueId]| {
            g.add(name, op, ins.iter().map(|&v| Some(v)).collect(), name)
                .unwrap()
        };
        let y = add(&mut g, "mm", Op::MatMul, &[x, w]);
        let y = add(&mut g, "bias", Op::Binary(Binary::Add), &[y, b]);
        let y = add(&mut g, "rows", Op::Reshape { allow_zero: false }, &[y, shape]);
        let y = add(&mut g, "act", then, &[y]);
        g.add_output("y", y);
        g
    }

    #[test]
    fn an_activation_after_a_row_keeping_reshape_joins_the_product() {
        let g = product_reshape_then(Op::Unary(Unary::Gelu { tanh: false }));
        let chains = find_chains(&g, true);
        assert_eq!(chains.len(), 1);
        assert_eq!(chains[0].activation, Activation::GeluErf);
        assert_eq!(chains[0].absorbed.len(), 3, "bias, reshape and Gelu");
        assert_eq!(chains[0].output, g.outputs()[0].value);
        // Nothing worth fusing after the reshape: it stays a view of the product's output.
        let g = product_reshape_then(Op::Unary(Unary::Exp));
        let chains = find_chains(&g, true);
        assert_eq!(chains[0].absorbed.len(), 1, "the bias only");
    }

    #[test]
    fn long_chain_splits_into_bounded_groups() {
        let n = 3 * MAX_GROUP_NODES + 5;
        let g = relu_chain(n);
        let groups = find_elementwise_groups(&g, &HashSet::new());
        assert!(groups.iter().all(|gr| gr.len() <= MAX_GROUP_NODES));
        assert_eq!(
            groups.iter().map(Vec::len).sum::<usize>(),
            n,
            "every Relu in a group"
        );
        assert_eq!(groups.len(), n.div_ceil(MAX_GROUP_NODES));
        // Groups are in graph order and each is a contiguous run of the chain.
        let flat: Vec<NodeId> = groups.concat();
        assert!(flat.windows(2).all(|w| w[0].index() + 1 == w[1].index()));
    }

    #[test]
    fn grouping_visits_each_node_once() {
        let n = 20_000;
        let g = relu_chain(n);
        let before = GROW_VISITS.get();
        find_elementwise_groups(&g, &HashSet::new());
        let visits = GROW_VISITS.get() - before;
        assert_eq!(visits, n, "each node visited once when it joins its group");
    }
}
