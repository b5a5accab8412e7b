//! Packed projections read as blocks of columns become one product per block.

use super::views::{layout_only, View};
use super::{Cx, Fused};
use kiln_ir::{Binary, DType, NodeId, Op, Tensor, ValueId};
use std::collections::HashMap;

impl Cx<'_> {
    /// Packed projections (`x · W [+ b]`, W and b constants) read only as blocks of columns
    /// (through Split, Slice, Gather of a constant index and layout-only operators, as the
    /// packed QKV projections of GPT-2 and `torch.nn.MultiheadAttention` exports are): each
    /// block becomes its own product with W's columns, and no copy splits the output.
    pub(super) fn find_split_projections(&self) -> HashMap<NodeId, Fused> {
        let mut fused = HashMap::new();
        for id in self.g.node_ids() {
            let y = id.out(0);
            let Some(p) = self.projection(y) else { continue };
            let Some(leaves) = self.column_slices(y, p.n) else {
                continue;
            };
            let (Some(w), bias) = (
                self.g.known_value(p.w),
                p.bias.and_then(|b| self.g.known_value(b)),
            ) else {
                continue;
            };
            // Every block or none: a block left out would still need the packed product.
            let Some(shapes) = leaves
                .iter()
                .map(|(leaf, _)| self.shape(leaf.out(0)))
                .collect::<Option<Vec<_>>>()
            else {
                continue;
            };
            // Read once, sliced per block.
            let (w_vals, b_vals) = (w.to_f64_vec(), bias.map(|b| (b.dtype(), b.to_f64_vec())));
            for ((leaf, (c0, c1)), shape) in leaves.into_iter().zip(shapes) {
                fused.insert(
                    leaf,
                    Fused::ProjectionSlice {
                        x: p.x,
                        weight: weight_columns(w, &w_vals, p.w_transposed, c0, c1),
                        bias: b_vals.as_ref().map(|(dt, b)| vector(*dt, b[c0..c1].to_vec())),
                        shape,
                    },
                );
            }
        }
        fused
    }

    /// `y` as a product of a run-time value by constant f32 weights, plus a constant f32 bias
    /// along its last axis: `Add(MatMul(x, W), b)`, `MatMul(x, W)`, `Gemm(x, B, C)` (alpha and
    /// beta 1, A not transposed).
    fn projection(&self, y: ValueId) -> Option<Projection> {
        let n = *self.shape(y)?.last()?;
        let f32_const =
            |v: ValueId| self.g.known_value(v).is_some() && self.g.value_type(v).dtype == DType::F32;
        let row_vector = |v: ValueId| {
            f32_const(v)
                && self
                    .shape(v)
                    .is_some_and(|s| s.last() == Some(&n) && s.iter().product::<usize>() == n)
        };
        let matmul = |p: ValueId| -> Option<(ValueId, ValueId)> {
            let [x, w] = self.ins(p)[..] else { return None };
            let ws = self.shape(w)?;
            (matches!(self.op(p), Op::MatMul) && f32_const(w) && ws.len() == 2 && ws[1] == n)
                .then_some((x, w))
        };
        if let Some((a, b)) = self.binary(y, Binary::Add) {
            for (p, bias) in [(a, b), (b, a)] {
                if let Some((x, w)) = matmul(p) {
                    if row_vector(bias) && self.same_type(p, y) && self.sole_consumer(p) == Some(y.node) {
                        return Some(Projection {
                            x,
                            w,
                            w_transposed: false,
                            bias: Some(bias),
                            n,
                        });
                    }
                }
            }
            return None;
        }
        if let Some((x, w)) = matmul(y) {
            return Some(Projection {
                x,
                w,
                w_transposed: false,
                bias: None,
                n,
            });
        }
        let Op::Gemm {
            alpha,
            beta,
            trans_a: false,
            trans_b,
        } = self.op(y)
        else {
            return None;
        };
        let ins = &self.node(y).inputs;
        let (Some(x), Some(w)) = (ins[0], ins[1]) else {
            return None;
        };
        let ws = self.shape(w)?;
        let bias = ins.get(2).copied().flatten();
        let ok = *alpha == 1.0
            && *beta == 1.0
            && f32_const(w)
            && ws.len() == 2
            && ws[usize::from(!*trans_b)] == n
            && bias.is_none_or(row_vector);
        ok.then_some(Projection {
            x,
            w,
            w_transposed: *trans_b,
            bias,
            n,
        })
    }

    /// The nodes that read `y` (taken as [rows, n]) as blocks of columns `[c0, c1)`, with
    /// their blocks, when every path from `y` through slicing and layout-only operators ends
    /// in such a block (and none of the values on the way is a graph output).
    fn column_slices(&self, y: ValueId, n: usize) -> Option<Vec<(NodeId, (usize, usize))>> {
        let shape = self.shape(y)?;
        let rows = shape.iter().product::<usize>() / n.max(1);
        let mut leaves = vec![];
        let mut stack = vec![(y, View::contiguous(&shape))];
        let mut visited = 0;
        while let Some((v, view)) = stack.pop() {
            if self.outputs.contains(&v) {
                return None;
            }
            for &c in self.consumers.get(&v)? {
                let node = self.g.node(c);
                visited += 1;
                // v is the data input, and only that.
                if visited > MAX_SLICE_NODES || node.inputs.iter().skip(1).any(|&i| i == Some(v)) {
                    return None;
                }
                for o in 0..node.outputs.len() {
                    let next = self.slice_view(&view, c, o)?;
                    match next.column_block(rows, n) {
                        Some(block) if node.outputs.len() == 1 => leaves.push((c, block)),
                        _ => stack.push((c.out(o as u32), next)),
                    }
                }
            }
        }
        (!leaves.is_empty()).then_some(leaves)
    }

    /// `view` after output `o` of node `c`, for layout-only and slicing operators (Split,
    /// Slice with step 1, Gather of one constant index); None for any other.
    fn slice_view(&self, view: &View, c: NodeId, o: usize) -> Option<View> {
        let node = self.g.node(c);
        let out = c.out(o as u32);
        let rank = view.dims.len() as i64;
        let axis = |a: i64| -> Option<usize> {
            let a = if a < 0 { a + rank } else { a };
            (0..rank).contains(&a).then_some(a as usize)
        };
        let konst = |i: usize| -> Option<Vec<i64>> {
            Some(
                self.g
                    .known_value(node.inputs.get(i).copied().flatten()?)?
                    .to_i64_vec(),
            )
        };
        match &node.op {
            op if layout_only(op) => self.apply_layout(view, out),
            Op::Gather { axis: a } => {
                let a = axis(*a)?;
                let idx = self.g.known_value(node.inputs.get(1).copied().flatten()?)?;
                let [i] = idx.to_i64_vec()[..] else { return None };
                let e = view.dims[a].0 as i64;
                let i = if i < 0 { i + e } else { i };
                if !(0..e).contains(&i) {
                    return None;
                }
                match idx.shape().len() {
                    0 => view.select(a, i as usize),
                    1 => view.narrow(a, i as usize, 1),
                    _ => None,
                }
            }
            Op::Split { axis: a, .. } => {
                let a = axis(*a)?;
                let start = (0..o)
                    .map(|j| Some(self.shape(c.out(j as u32))?[a]))
                    .sum::<Option<usize>>()?;
                view.narrow(a, start, self.shape(out)?[a])
            }
            Op::Slice => {
                let (starts, out_shape) = (konst(1)?, self.shape(out)?);
                let axes = match konst(3) {
                    Some(axes) => axes,
                    None => (0..starts.len() as i64).collect(),
                };
                if konst(4).is_some_and(|steps| steps.iter().any(|&s| s != 1)) || axes.len() != starts.len() {
                    return None;
                }
                let mut v = view.clone();
                for (&a, &s) in axes.iter().zip(&starts) {
                    let a = axis(a)?;
                    let e = view.dims[a].0 as i64;
                    let s = if s < 0 { s + e } else { s }.clamp(0, e) as usize;
                    v = v.narrow(a, s, out_shape[a])?;
                }
                Some(v)
            }
            _ => None,
        }
    }
}

/// A packed projection's operands: `x · W [+ bias]`, `W` [K, n] (given as [n, K] when
/// `w_transposed`), `bias` n values.
struct Projection {
    x: ValueId,
    w: ValueId,
    w_transposed: bool,
    bias: Option<ValueId>,
    n: usize,
}

/// How many nodes may read a packed projection's output on the way to its slices.
const MAX_SLICE_NODES: usize = 32;

/// Columns `[c0, c1)` of the weights `w` ([K, N], or [N, K] when `transposed`; `vals` its
/// elements) as [K, c1-c0].
fn weight_columns(w: &Tensor, vals: &[f64], transposed: bool, c0: usize, c1: usize) -> Tensor {
    let (k, n) = match (w.shape(), transposed) {
        (&[n, k], true) => (k, n),
        (&[k, n], _) => (k, n),
        _ => unreachable!("projection weights are 2-D"),
    };
    let at = |r: usize, c: usize| {
        if transposed {
            vals[c * k + r]
        } else {
            vals[r * n + c]
        }
    };
    let cols = (0..k).flat_map(|r| (c0..c1).map(move |c| at(r, c)));
    Tensor::new(
        vec![k, c1 - c0],
        kiln_ir::tensor::TensorData::from_f64s(w.dtype(), cols.collect::<Vec<_>>()),
    )
    .expect("the columns fill the shape")
}

/// A vector of `vals` in `dtype`.
fn vector(dtype: DType, vals: Vec<f64>) -> Tensor {
    Tensor::new(
        vec![vals.len()],
        kiln_ir::tensor::TensorData::from_f64s(dtype, vals),
    )
    .expect("a vector fills its shape")
}
