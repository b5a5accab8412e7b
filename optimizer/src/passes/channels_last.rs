//! Channels-last layout (`channels-last`): 2-D convolutions and pools run on `[N, H, W, C]`
//! activations, and the layout spreads to their elementwise neighbours and channel concats, so
//! that a CNN converts once at its input and once where its features meet a Reshape/Flatten,
//! an unsupported op or a graph output.
//!
//! The IR stays logical: a channels-last value simply has the NHWC shape, and the ops that read
//! it say so (`ConvAttrs::channels_last`, `PoolAttrs::channels_last`, GlobalPool becomes a
//! `ReduceMean/Max` over axes 1 and 2, Concat along axis 3). Conv weights and bias keep their
//! ONNX layout in the graph (codegen re-lays them out when packing); constant operands of the
//! elementwise ops are re-laid out here, at compile time (`[C,1,1]` becomes `[C]`).
//!
//! Every value keeps at most one NCHW and one NHWC form in the new graph; a form is made on
//! demand (Transpose, or a Reshape when H = W = 1), so a transpose back to NCHW exists only where
//! something needs it. A model's own `Transpose(perm=[0,2,3,1])` of a channels-last value, or
//! `[0,3,1,2]` into a convolution, cancels against ours. Dead nodes are dropped at the end.

use crate::Pass;
use kiln_ir::ops::{EvalCtx, InferCtx, MAX_EXACT_INTEGER_K};
use kiln_ir::{
    DType, Dim, Graph, IrError, LayoutRole, Node, NodeId, Op, PoolKind, QuantOp, ReduceKind, Tensor, ValueId,
};
use std::collections::HashMap;

#[derive(Default)]
pub struct ChannelsLast {
    /// Integer convolutions (ConvInteger) get a channels-last form too: the target's integer
    /// product kernels compute them (the kernel library's ConvInteger reads NCHW only).
    pub integer_conv: bool,
}

/// NCHW → NHWC.
const TO_LAST: [usize; 4] = [0, 2, 3, 1];
/// NHWC → NCHW.
const TO_FIRST: [usize; 4] = [0, 3, 1, 2];

impl Pass for ChannelsLast {
    fn name(&self) -> &'static str {
        "channels-last"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        // Without a convolution to anchor it, the layout would only add transposes.
        let anchored = graph.node_ids().zip(graph.nodes()).any(|(_, n)| {
            matches!(n.op, Op::Conv(_) | Op::Quant(QuantOp::ConvInteger(_))) && self.anchor(graph, n)
        });
        if !anchored {
            return Ok(0);
        }
        let mut cv = Convert {
            pass: self,
            src: graph,
            dst: Graph::new(graph.name.clone()),
            first: HashMap::new(),
            last: HashMap::new(),
            rewrites: 0,
        };
        cv.run()?;
        let rewrites = cv.rewrites;
        *graph = kiln_ir::rewrite::remove_dead(&cv.dst)?;
        Ok(rewrites)
    }
}

fn is_4d_static(graph: &Graph, v: ValueId, dtype: DType) -> bool {
    let t = graph.value_type(v);
    t.dtype == dtype && t.rank() == 4 && t.is_static()
}

impl ChannelsLast {
    fn anchor(&self, graph: &Graph, node: &Node) -> bool {
        let integer = matches!(node.op, Op::Quant(QuantOp::ConvInteger(_)));
        (self.integer_conv || !integer) && anchor(graph, node)
    }
}

/// Whether `node` (Conv, Pool or GlobalPool) gets a channels-last form: 2-D, f32 (MaxPool also
/// u8 and i8), static; a convolution with constant weights (and bias) that is dense or
/// depthwise (the shapes the NHWC kernels implement); an integer convolution (ConvInteger) with
/// u8 input and constant s8 weights that is dense.
fn anchor(graph: &Graph, node: &Node) -> bool {
    if node.op.layout_role() != LayoutRole::Anchor {
        return false;
    }
    let Some(x) = node.inputs.first().copied().flatten() else {
        return false;
    };
    let x_dtype = match &node.op {
        Op::Quant(QuantOp::ConvInteger(_)) => DType::U8,
        // A quantized model's MaxPool of bytes (the NHWC pool kernel takes u8 and i8 for max).
        Op::Pool(p)
            if p.kind == PoolKind::Max && matches!(graph.value_type(x).dtype, DType::U8 | DType::I8) =>
        {
            graph.value_type(x).dtype
        }
        _ => DType::F32,
    };
    if !is_4d_static(graph, x, x_dtype) || node.outputs.len() != 1 || !node.outputs[0].ty.is_static() {
        return false;
    }
    match &node.op {
        // What the integer kernel computes (it has no fallback in this layout): a per-tensor
        // input zero point, symmetric weights, sums i32 holds exactly.
        Op::Quant(QuantOp::ConvInteger(a)) => {
            let input = |i: usize| node.inputs.get(i).copied().flatten();
            let w = input(1).and_then(|w| graph.known_value(w));
            let x_zero_ok = input(2).is_none_or(|z| graph.value_type(z).num_elements() == Some(1));
            let w_zero_ok = input(3).is_none_or(|z| {
                graph
                    .known_value(z)
                    .is_some_and(|t| t.to_f64_vec().iter().all(|&v| v == 0.0))
            });
            !a.channels_last
                && a.group <= 1
                && x_zero_ok
                && w_zero_ok
                && w.is_some_and(|w| {
                    w.dtype() == DType::I8
                        && w.shape().len() == 4
                        && w.shape()[1..].iter().product::<usize>() <= MAX_EXACT_INTEGER_K
                })
        }
        Op::Conv(a) => {
            let Some(w) = node
                .inputs
                .get(1)
                .copied()
                .flatten()
                .and_then(|w| graph.known_value(w))
            else {
                return false;
            };
            let bias_ok = match node.inputs.get(2).copied().flatten() {
                None => true,
                Some(b) => graph.known_value(b).is_some(),
            };
            let c = graph.value_type(x).fixed_shape().map_or(0, |s| s[1]);
            let ws = w.shape();
            let dense = a.group == 1;
            let depthwise = a.group > 1 && a.group == c && ws.first() == Some(&c) && ws.get(1) == Some(&1);
            !a.channels_last && w.dtype() == DType::F32 && ws.len() == 4 && bias_ok && (dense || depthwise)
        }
        Op::Pool(p) => {
            !p.channels_last
                && matches!(p.kind, PoolKind::Max | PoolKind::Average { .. })
                && p.kernel_shape.len() == 2
        }
        Op::GlobalPool(k) => matches!(k, PoolKind::Max | PoolKind::Average { .. }),
        _ => false,
    }
}

struct Convert<'a> {
    pass: &'a ChannelsLast,
    src: &'a Graph,
    dst: Graph,
    /// Source value → its NCHW (model-layout) form in `dst`.
    first: HashMap<ValueId, ValueId>,
    /// Source value (rank 4) → its NHWC form in `dst`.
    last: HashMap<ValueId, ValueId>,
    rewrites: usize,
}

impl Convert<'_> {
    fn run(&mut self) -> Result<(), IrError> {
        let src = self.src;
        for &id in src.inputs() {
            let out = &src.node(id).outputs[0];
            let v = self.dst.add_input(out.name.clone(), out.ty.clone());
            self.first.insert(id.out(0), v);
        }
        for (id, node) in src.node_ids().zip(src.nodes()) {
            match &node.op {
                Op::Input => {}
                Op::Constant(c) => {
                    let v = self
                        .dst
                        .add_const(node.outputs[0].name.clone(), src.consts()[c.0 as usize].clone());
                    self.first.insert(id.out(0), v);
                }
                _ => self.node(id, node)?,
            }
        }
        for o in src.outputs() {
            let v = self.nchw(o.value)?;
            self.dst.add_output(o.name.clone(), v);
        }
        Ok(())
    }

    fn node(&mut self, id: NodeId, node: &Node) -> Result<(), IrError> {
        let src = self.src;
        let ins: Vec<Option<ValueId>> = node.inputs.clone();
        let out_name = || node.outputs[0].name.clone();
        // The model's own layout changes, where they meet ours.
        if let (Op::Transpose { perm }, Some(Some(x))) = (&node.op, ins.first()) {
            if perm.as_slice() == TO_LAST && self.last.contains_key(x) {
                // NHWC → NCHW (ours) → NHWC (the model's): both vanish.
                self.first.insert(id.out(0), self.last[x]);
                self.rewrites += 1;
                return Ok(());
            }
            if perm.as_slice() == TO_FIRST && src.value_type(*x).rank() == 4 {
                // The input is this value's channels-last form, should a convolution want it.
                let x_first = self.nchw(*x)?;
                self.last.insert(id.out(0), x_first);
            }
        }
        if self.pass.anchor(src, node) {
            let x = ins[0].expect("anchor has X");
            let x_last = self.nhwc(x)?;
            let (op, extra) = match &node.op {
                Op::Conv(a) | Op::Quant(QuantOp::ConvInteger(a)) => {
                    let mut a = a.clone();
                    a.channels_last = true;
                    let rest: Vec<Option<ValueId>> = ins[1..]
                        .iter()
                        .map(|v| v.map(|v| self.nchw(v)).transpose())
                        .collect::<Result<_, _>>()?;
                    let op = match node.op {
                        Op::Conv(_) => Op::Conv(a),
                        _ => Op::Quant(QuantOp::ConvInteger(a)),
                    };
                    (op, rest)
                }
                Op::Pool(p) => {
                    let mut p = p.clone();
                    p.channels_last = true;
                    (Op::Pool(p), vec![])
                }
                Op::GlobalPool(k) => {
                    let kind = if *k == PoolKind::Max {
                        ReduceKind::Max
                    } else {
                        ReduceKind::Mean
                    };
                    let axes = self.dst.add_const(
                        format!("{}_axes", node.name),
                        Tensor::from_vec(vec![2], vec![1i64, 2]),
                    );
                    (
                        Op::Reduce {
                            kind,
                            keepdims: true,
                            noop_with_empty_axes: false,
                        },
                        vec![Some(axes)],
                    )
                }
                _ => unreachable!("anchor() accepts Conv, ConvInteger, Pool and GlobalPool only"),
            };
            let mut inputs = vec![Some(x_last)];
            inputs.extend(extra);
            let y = self.dst.add(node.name.clone(), op, inputs, out_name())?;
            self.last.insert(id.out(0), y);
            self.rewrites += 1;
            return Ok(());
        }
        if let Some(inputs) = self.propagate(node)? {
            let op = match &node.op {
                Op::Concat { .. } => Op::Concat { axis: 3 },
                op => op.clone(),
            };
            let y = self.dst.add(node.name.clone(), op, inputs, out_name())?;
            self.last.insert(id.out(0), y);
            self.rewrites += 1;
            return Ok(());
        }
        let inputs: Vec<Option<ValueId>> = ins
            .iter()
            .map(|v| v.map(|v| self.nchw(v)).transpose())
            .collect::<Result<_, _>>()?;
        let names = node.outputs.iter().map(|o| o.name.clone()).collect();
        let outs = self
            .dst
            .add_node(node.name.clone(), node.op.clone(), inputs, names)?;
        for (o, v) in outs.into_iter().enumerate() {
            self.first.insert(id.out(o as u32), v);
        }
        Ok(())
    }

    /// The NHWC inputs of an elementwise op or channel Concat that has a channels-last input
    /// and a rank-4 output; None when it should stay NCHW.
    fn propagate(&mut self, node: &Node) -> Result<Option<Vec<Option<ValueId>>>, IrError> {
        let src = self.src;
        if node.outputs.len() != 1 || node.outputs[0].ty.rank() != 4 || !node.outputs[0].ty.is_static() {
            return Ok(None);
        }
        // Elementwise operators carry the layout through unchanged; a Concat does along the
        // channel axis (the operator table's layout role).
        let carries = match node.op.layout_role() {
            // Quantizing carries the layout with per-tensor parameters only.
            LayoutRole::Carry if matches!(node.op, Op::Quant(_)) => per_tensor(src, node),
            LayoutRole::Carry => true,
            LayoutRole::ChannelConcat => matches!(node.op, Op::Concat { axis: 1 | -3 }),
            LayoutRole::Anchor | LayoutRole::Model => false,
        };
        if !carries {
            return Ok(None);
        }
        let vals: Vec<ValueId> = node.inputs.iter().flatten().copied().collect();
        if !vals.iter().any(|v| self.last.contains_key(v)) {
            return Ok(None);
        }
        // Every operand must have an NHWC form: rank 4 (transposed if need be), a constant
        // (re-laid out), or a single element (broadcasts the same in both layouts).
        for v in &vals {
            let t = src.value_type(*v);
            let ok = self.last.contains_key(v)
                || (t.rank() == 4 && t.is_static())
                || (t.rank() <= 4 && src.known_value(*v).is_some())
                || t.num_elements() == Some(1);
            if !ok {
                return Ok(None);
            }
        }
        let mut inputs = vec![];
        for v in &node.inputs {
            inputs.push(match v {
                None => None,
                Some(v) => Some(self.operand(*v)?),
            });
        }
        Ok(Some(inputs))
    }

    /// An operand of a channels-last elementwise op.
    fn operand(&mut self, v: ValueId) -> Result<ValueId, IrError> {
        let t = self.src.value_type(v);
        if self.last.contains_key(&v) || t.rank() == 4 {
            return self.nhwc(v);
        }
        if t.num_elements() == Some(1) || t.rank() == 0 {
            return self.nchw(v);
        }
        // A broadcast constant of lower rank: align it to 4-D, re-lay it out, drop the leading
        // ones ([C,1,1] → [1,C,1,1] → [1,1,1,C] → [C]).
        let k = self.src.known_value(v).expect("checked in propagate").clone();
        let mut shape = vec![1; 4 - k.shape().len()];
        shape.extend_from_slice(k.shape());
        let k = k
            .reshaped(shape)
            .map_err(|e| IrError::Invalid(format!("channels-last: {e}")))?;
        let k = transpose(&k, &TO_LAST)?;
        let lead = k.shape().iter().take_while(|&&d| d == 1).count().min(3);
        let shape = k.shape()[lead..].to_vec();
        let k = k
            .reshaped(shape)
            .map_err(|e| IrError::Invalid(format!("channels-last: {e}")))?;
        let name = format!("{}_nhwc", self.src.value_name(v));
        self.rewrites += 1;
        Ok(self.dst.add_const(name, k))
    }

    /// `v` in the model's layout (made from its NHWC form if that is all there is).
    fn nchw(&mut self, v: ValueId) -> Result<ValueId, IrError> {
        if let Some(&x) = self.first.get(&v) {
            return Ok(x);
        }
        let x = *self
            .last
            .get(&v)
            .ok_or_else(|| IrError::Invalid("channels-last: a value has no form in the new graph".into()))?;
        let y = self.relayout(v, x, &TO_FIRST, "nchw")?;
        self.first.insert(v, y);
        Ok(y)
    }

    /// `v` (rank 4) in NHWC.
    fn nhwc(&mut self, v: ValueId) -> Result<ValueId, IrError> {
        if let Some(&x) = self.last.get(&v) {
            return Ok(x);
        }
        let x = self.nchw(v)?;
        let y = self.relayout(v, x, &TO_LAST, "nhwc")?;
        self.last.insert(v, y);
        Ok(y)
    }

    /// `x` (the new graph's form of source value `v`) permuted by `perm`: folded for a
    /// constant, a Reshape when only unit axes move (H = W = 1), a Transpose otherwise.
    fn relayout(&mut self, v: ValueId, x: ValueId, perm: &[usize; 4], tag: &str) -> Result<ValueId, IrError> {
        let name = format!("{}_{tag}", self.src.value_name(v));
        if let Some(t) = self.dst.known_value(x) {
            let t = transpose(&t.clone(), perm)?;
            return Ok(self.dst.add_const(name, t));
        }
        let shape = self.dst.value_type(x).shape.clone();
        let out: Vec<Dim> = perm.iter().map(|&i| shape[i].clone()).collect();
        let (h, w) = if perm == &TO_FIRST { (1, 2) } else { (2, 3) };
        if shape[h] == Dim::Fixed(1) && shape[w] == Dim::Fixed(1) {
            if let Some(dims) = out.iter().map(Dim::fixed).collect::<Option<Vec<usize>>>() {
                let s = self.dst.add_const(
                    format!("{name}_shape"),
                    Tensor::from_vec(vec![4], dims.iter().map(|&d| d as i64).collect()),
                );
                return self.dst.add(
                    format!("{name}_reshape"),
                    Op::Reshape { allow_zero: false },
                    vec![Some(x), Some(s)],
                    name,
                );
            }
        }
        self.dst.add(
            format!("{name}_transpose"),
            Op::Transpose { perm: perm.to_vec() },
            vec![Some(x)],
            name,
        )
    }
}

/// A QuantizeLinear/DequantizeLinear whose scale and zero point are single values.
fn per_tensor(graph: &Graph, node: &Node) -> bool {
    let blocked = matches!(
        node.op,
        Op::Quant(QuantOp::QuantizeLinear { block_size, .. } | QuantOp::DequantizeLinear { block_size, .. })
            if block_size > 0
    );
    !blocked
        && node.inputs[1..]
            .iter()
            .flatten()
            .all(|v| graph.value_type(*v).num_elements() == Some(1))
}

/// `t` transposed by `perm`, through the reference Transpose.
fn transpose(t: &Tensor, perm: &[usize]) -> Result<Tensor, IrError> {
    let op = Op::Transpose { perm: perm.to_vec() };
    let ty = t.tensor_type();
    let inf = InferCtx {
        inputs: vec![Some(&ty)],
        values: vec![Some(t)],
        num_outputs: 1,
    };
    let out_ty =
        kiln_ir::ops::infer(&op, &inf).map_err(|e| IrError::Invalid(format!("channels-last: {e}")))?;
    let cx = EvalCtx {
        inputs: vec![Some(t)],
        out_types: &out_ty,
    };
    let mut r = kiln_ir::ops::eval(&op, &cx).map_err(|e| IrError::Invalid(format!("channels-last: {e}")))?;
    Ok(r.remove(0))
}

#[cfg(test)]
mod tests;
