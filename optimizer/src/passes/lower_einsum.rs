//! `lower-einsum`: an Einsum becomes the products, reductions and transposes it stands for, so
//! that it runs on the GEMM and the generated kernels instead of the kernel library's generic
//! loop nest (one thread on the CPU, one block on a GPU).
//!
//! Operands are contracted pairwise, left to right. Before a pair is contracted, each side sums
//! away the labels that neither the other side, a later operand nor the output has
//! (ReduceSum). The pair's labels then fall into four groups: *batch* labels (on both sides and
//! needed later), *m* labels (left side only), *n* labels (right side only) and *k* labels (on
//! both sides and not needed later: contracted). The left side is transposed to `batch, m, k`
//! and reshaped to `[batch..., M, K]`, the right one to `batch, k, n` and `[batch..., K, N]`,
//! and a MatMul computes `[batch..., M, N]`, reshaped back to the batch, m and n labels. With no
//! k label the pair is a broadcast Mul instead. A final Transpose puts the labels in the
//! output's order. For example `bhid,bhjd->bhij` (attention scores) is
//! `MatMul(q, Transpose(k, [0, 1, 3, 2]))`, and `bsd,de->bse` (a projection) is one
//! `[b·s, d] × [d, e]` GEMM.
//!
//! Left as they are, for the library kernel: a label repeated within one operand (a diagonal
//! or trace), a contracted label whose extent is 1 on one side and larger on the other (an
//! ellipsis broadcast into a sum) and operands of unknown shape.

use crate::Pass;
use kiln_ir::ops::parse_einsum;
use kiln_ir::rewrite::{rebuild, Rewrite};
use kiln_ir::{Binary, Graph, IrError, Node, Op, ReduceKind, Tensor, ValueId};

pub struct LowerEinsum;

/// The pass's name (`--disable-pass`, `--print-after`).
pub const NAME: &str = "lower-einsum";

impl Pass for LowerEinsum {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        let mut rewrites = 0;
        let rebuilt = rebuild(graph, |dst, _, node, inputs| {
            let Op::Einsum { equation } = &node.op else {
                return Ok(Rewrite::Keep);
            };
            let Some(plan) = plan(graph, node, equation) else {
                return Ok(Rewrite::Keep);
            };
            let operands: Option<Vec<ValueId>> = inputs.iter().copied().collect();
            let Some(operands) = operands else {
                return Ok(Rewrite::Keep);
            };
            rewrites += 1;
            let mut emitter = Emitter {
                dst,
                node,
                count: 0,
                named: false,
            };
            Ok(Rewrite::Replace(vec![emitter.lower(&plan, &operands)?]))
        })?;
        if rewrites > 0 {
            *graph = rebuilt;
        }
        Ok(rewrites)
    }
}

/// One operand or intermediate result: the label of each axis and its extent.
#[derive(Clone, Debug, PartialEq)]
struct Term {
    labels: Vec<usize>,
    dims: Vec<usize>,
}

impl Term {
    fn extent(&self, label: usize) -> Option<usize> {
        self.labels.iter().position(|&l| l == label).map(|i| self.dims[i])
    }

    /// The term with only the axes whose label `keep` accepts.
    fn keeping(&self, keep: impl Fn(usize) -> bool) -> Term {
        let (labels, dims) = self
            .labels
            .iter()
            .zip(&self.dims)
            .filter(|(&l, _)| keep(l))
            .map(|(&l, &d)| (l, d))
            .unzip();
        Term { labels, dims }
    }
}

/// The lowering of one Einsum: its operands' terms and the output's labels.
struct Plan {
    operands: Vec<Term>,
    output: Vec<usize>,
}

/// The plan, or None when the node stays an Einsum (see the module docs).
fn plan(graph: &Graph, node: &Node, equation: &str) -> Option<Plan> {
    let mut operands = vec![];
    for v in &node.inputs {
        operands.push(graph.value_type((*v)?).fixed_shape()?);
    }
    let ranks: Vec<usize> = operands.iter().map(Vec::len).collect();
    let spec = parse_einsum(equation, &ranks).ok()?;
    let operands: Vec<Term> = spec
        .operands
        .into_iter()
        .zip(operands)
        .map(|(labels, dims)| Term { labels, dims })
        .collect();
    for t in &operands {
        if (1..t.labels.len()).any(|i| t.labels[..i].contains(&t.labels[i])) {
            return None;
        }
    }
    // Every label's extents agree, except a batch label's 1 broadcast against another extent.
    for (i, a) in operands.iter().enumerate() {
        for b in &operands[i + 1..] {
            for (&l, &da) in a.labels.iter().zip(&a.dims) {
                match b.extent(l) {
                    Some(db) if db != da && !spec.output.contains(&l) => return None,
                    Some(db) if db != da && da != 1 && db != 1 => return None,
                    _ => {}
                }
            }
        }
    }
    Some(Plan {
        operands,
        output: spec.output,
    })
}

/// Adds the lowering's nodes to the rebuilt graph: intermediates are named after the Einsum,
/// and the value standing for its output keeps the output's name.
struct Emitter<'a> {
    dst: &'a mut Graph,
    node: &'a Node,
    count: usize,
    /// Whether a node computing the Einsum's output (and named for it) was added.
    named: bool,
}

impl Emitter<'_> {
    fn lower(&mut self, plan: &Plan, operands: &[ValueId]) -> Result<ValueId, IrError> {
        let n = plan.operands.len();
        // Labels some operand after `i` or the output has.
        let needed_after = |i: usize, l: usize| {
            plan.output.contains(&l) || plan.operands[i + 1..].iter().any(|t| t.labels.contains(&l))
        };
        let mut acc = plan.operands[0].clone();
        let mut value = operands[0];
        if n == 1 {
            let summed = acc.keeping(|l| plan.output.contains(&l));
            let last = summed.labels.len() == plan.output.len() && summed.labels == plan.output;
            value = self.reduce(value, &acc, &summed, last)?;
            acc = summed;
        }
        for (i, b) in plan.operands.iter().enumerate().skip(1) {
            let keep = |l: usize| needed_after(i, l);
            // Each side first sums the labels that no one else needs.
            let a_needed = acc.keeping(|l| keep(l) || b.labels.contains(&l));
            value = self.reduce(value, &acc, &a_needed, false)?;
            let b_needed = b.keeping(|l| keep(l) || acc.labels.contains(&l));
            let b_value = self.reduce(operands[i], b, &b_needed, false)?;
            let last_pair = i + 1 == n;
            (value, acc) = self.contract(
                value,
                &a_needed,
                b_value,
                &b_needed,
                keep,
                last_pair,
                &plan.output,
            )?;
        }
        if self.named {
            return Ok(value);
        }
        let perm: Vec<usize> = plan
            .output
            .iter()
            .map(|l| {
                acc.labels
                    .iter()
                    .position(|x| x == l)
                    .expect("output label in the result")
            })
            .collect();
        self.add(Op::Transpose { perm }, vec![value], true)
    }

    /// Sums `from`'s axes that `to` does not have (none: `value` itself).
    fn reduce(&mut self, value: ValueId, from: &Term, to: &Term, last: bool) -> Result<ValueId, IrError> {
        if from.labels.len() == to.labels.len() {
            return Ok(value);
        }
        let axes: Vec<i64> = (0..from.labels.len())
            .filter(|&i| !to.labels.contains(&from.labels[i]))
            .map(|i| i as i64)
            .collect();
        let axes = self.constant("axes", axes);
        let op = Op::Reduce {
            kind: ReduceKind::Sum,
            keepdims: false,
            noop_with_empty_axes: false,
        };
        self.add_inputs(op, vec![Some(value), Some(axes)], last)
    }

    /// Contracts `a` with `b` (their labels given by the terms): the result's labels are the
    /// batch labels, then `a`'s others, then `b`'s others. `last`: the final pair, whose result
    /// is named after the Einsum's output when its labels are already the output's.
    #[allow(clippy::too_many_arguments)]
    fn contract(
        &mut self,
        a: ValueId,
        at: &Term,
        b: ValueId,
        bt: &Term,
        keep: impl Fn(usize) -> bool,
        last: bool,
        output: &[usize],
    ) -> Result<(ValueId, Term), IrError> {
        let in_b = |l: &usize| bt.labels.contains(l);
        let batch: Vec<usize> = at
            .labels
            .iter()
            .copied()
            .filter(|l| in_b(l) && keep(*l))
            .collect();
        let k: Vec<usize> = at
            .labels
            .iter()
            .copied()
            .filter(|l| in_b(l) && !keep(*l))
            .collect();
        let m: Vec<usize> = at.labels.iter().copied().filter(|l| !in_b(l)).collect();
        let n: Vec<usize> = bt
            .labels
            .iter()
            .copied()
            .filter(|l| !at.labels.contains(l))
            .collect();
        let ext =
            |t: &Term, ls: &[usize]| -> Vec<usize> { ls.iter().map(|&l| t.extent(l).unwrap_or(1)).collect() };
        let (a_batch, b_batch) = (ext(at, &batch), ext(bt, &batch));
        let (m_dims, n_dims, k_dims) = (ext(at, &m), ext(bt, &n), ext(at, &k));
        let result = Term {
            labels: [batch.clone(), m.clone(), n.clone()].concat(),
            dims: a_batch
                .iter()
                .zip(&b_batch)
                .map(|(&x, &y)| x.max(y))
                .chain(m_dims.iter().copied())
                .chain(n_dims.iter().copied())
                .collect(),
        };
        let named = last && result.labels == output;
        let a = self.transpose_to(a, at, &[batch.clone(), m.clone(), k.clone()].concat())?;
        let b = self.transpose_to(b, bt, &[batch.clone(), k.clone(), n.clone()].concat())?;
        if k.is_empty() {
            // An outer product per batch entry: broadcast the two sides against each other.
            let a_shape = [a_batch.clone(), m_dims.clone(), vec![1; n.len()]].concat();
            let b_shape = [b_batch.clone(), vec![1; m.len()], n_dims.clone()].concat();
            let a = self.reshape(a, &[a_batch.clone(), m_dims.clone()].concat(), &a_shape)?;
            let b = self.reshape(b, &[b_batch.clone(), n_dims.clone()].concat(), &b_shape)?;
            let y = self.add(Op::Binary(Binary::Mul), vec![a, b], named)?;
            return Ok((y, result));
        }
        let (mm, nn, kk) = (
            m_dims.iter().product::<usize>(),
            n_dims.iter().product::<usize>(),
            k_dims.iter().product::<usize>(),
        );
        let a = self.reshape(
            a,
            &[a_batch.clone(), m_dims.clone(), k_dims.clone()].concat(),
            &[a_batch.clone(), vec![mm, kk]].concat(),
        )?;
        let b = self.reshape(
            b,
            &[b_batch.clone(), k_dims.clone(), n_dims.clone()].concat(),
            &[b_batch.clone(), vec![kk, nn]].concat(),
        )?;
        let product_dims: Vec<usize> = [result.dims[..batch.len()].to_vec(), vec![mm, nn]].concat();
        let reshaped = product_dims != result.dims;
        let y = self.add(Op::MatMul, vec![a, b], named && !reshaped)?;
        let y = match reshaped {
            true => self.reshape_named(y, &result.dims, named)?,
            false => y,
        };
        Ok((y, result))
    }

    /// `value` (labels `from`) with its axes in the order of `to` (the same labels).
    fn transpose_to(&mut self, value: ValueId, from: &Term, to: &[usize]) -> Result<ValueId, IrError> {
        let perm: Vec<usize> = to
            .iter()
            .map(|l| {
                from.labels
                    .iter()
                    .position(|x| x == l)
                    .expect("label of the term")
            })
            .collect();
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(value);
        }
        self.add(Op::Transpose { perm }, vec![value], false)
    }

    /// `value` of shape `from` reshaped to `to` (none needed when they are the same).
    fn reshape(&mut self, value: ValueId, from: &[usize], to: &[usize]) -> Result<ValueId, IrError> {
        if from == to {
            return Ok(value);
        }
        self.reshape_named(value, to, false)
    }

    fn reshape_named(&mut self, value: ValueId, to: &[usize], last: bool) -> Result<ValueId, IrError> {
        let shape = self.constant("shape", to.iter().map(|&d| d as i64).collect());
        self.add_inputs(
            Op::Reshape { allow_zero: false },
            vec![Some(value), Some(shape)],
            last,
        )
    }

    fn constant(&mut self, what: &str, values: Vec<i64>) -> ValueId {
        self.count += 1;
        let name = format!("{}/einsum_{what}_{}", self.node.name, self.count);
        self.dst
            .add_const(name, Tensor::from_vec(vec![values.len()], values))
    }

    fn add(&mut self, op: Op, inputs: Vec<ValueId>, last: bool) -> Result<ValueId, IrError> {
        self.add_inputs(op, inputs.into_iter().map(Some).collect(), last)
    }

    /// Adds a node; `last`: it computes the Einsum's output and takes its node and value names.
    fn add_inputs(&mut self, op: Op, inputs: Vec<Option<ValueId>>, last: bool) -> Result<ValueId, IrError> {
        self.count += 1;
        let (node_name, value_name) = match last {
            true => (self.node.name.clone(), self.node.outputs[0].name.clone()),
            false => {
                let name = format!("{}/einsum_{}_{}", self.node.name, op.name(), self.count);
                (name.clone(), name)
            }
        };
        self.named = self.named || last;
        self.dst.add(node_name, op, inputs, value_name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::eval::eval_graph;
    use kiln_ir::{DType, TensorType};

    /// A graph of one Einsum of inputs of `shapes`, the inputs' values, and the graph after the
    /// pass with how many rewrites it made.
    fn lowered(equation: &str, shapes: &[&[usize]], dtype: DType) -> (Graph, Graph, Vec<Tensor>, usize) {
        let mut g = Graph::new("g");
        let mut ins = vec![];
        let mut values = vec![];
        for (i, shape) in shapes.iter().enumerate() {
            ins.push(Some(
                g.add_input(format!("x{i}"), TensorType::fixed(dtype, shape)),
            ));
            let n: usize = shape.iter().product();
            // Small integers, so that every float sum is exact whatever its order.
            let data: Vec<f32> = (0..n).map(|j| ((j * 7 + i * 3) % 11) as f32 - 5.0).collect();
            values.push(Tensor::from_vec(shape.to_vec(), data).cast(dtype));
        }
        let y = g
            .add(
                "e",
                Op::Einsum {
                    equation: equation.to_string(),
                },
                ins,
                "y",
            )
            .unwrap();
        g.add_output("y", y);
        let mut h = g.clone();
        let rewrites = LowerEinsum.run(&mut h).unwrap();
        (g, h, values, rewrites)
    }

    fn has_einsum(g: &Graph) -> bool {
        g.nodes().iter().any(|n| matches!(n.op, Op::Einsum { .. }))
    }

    #[test]
    fn lowered_einsums_compute_the_same_values() {
        let cases: &[(&str, &[&[usize]])] = &[
            ("bij,bjk->bik", &[&[2, 3, 4], &[2, 4, 5]]),
            ("bij->bji", &[&[2, 3, 4]]),
            ("bhid,bhjd->bhij", &[&[2, 3, 4, 5], &[2, 3, 6, 5]]),
            ("i,i->", &[&[7], &[7]]),
            ("i,j->ij", &[&[4], &[6]]),
            ("bij->b", &[&[2, 3, 4]]),
            ("...j,j->...", &[&[2, 3, 4], &[4]]),
            ("ibnd,jbnd->bnij", &[&[5, 2, 3, 4], &[6, 2, 3, 4]]),
            ("bnij,jbnd->ibnd", &[&[2, 3, 5, 6], &[6, 2, 3, 4]]),
            ("bsd,de->bse", &[&[2, 3, 4], &[4, 5]]),
            ("ij,jk,kl->il", &[&[2, 3], &[3, 4], &[4, 5]]),
            ("ij,jk", &[&[2, 3], &[3, 4]]),
            ("ij,ij->ij", &[&[3, 4], &[3, 4]]),
            ("ij,ij->", &[&[3, 4], &[3, 4]]),
            ("ijk,jl->il", &[&[2, 3, 4], &[3, 5]]),
            ("...ij,...jk->...ik", &[&[2, 3, 4, 5], &[1, 3, 5, 6]]),
            ("bi,bj->bij", &[&[1, 3], &[4, 5]]),
            ("ij->ij", &[&[2, 3]]),
        ];
        for (equation, shapes) in cases {
            for dtype in [DType::F32, DType::I64] {
                let (g, h, values, rewrites) = lowered(equation, shapes, dtype);
                assert_eq!(rewrites, 1, "{equation}");
                assert!(!has_einsum(&h), "{equation}: still an Einsum");
                let want = eval_graph(&g, values.clone()).unwrap();
                let got = eval_graph(&h, values).unwrap();
                assert_eq!(got, want, "{equation} ({dtype})");
                // The output keeps its name (kiln verify compares values by name).
                let out = h.outputs()[0].value;
                assert_eq!(h.value_name(out), "y", "{equation}");
            }
        }
    }

    #[test]
    fn diagonals_and_broadcast_sums_stay_einsums() {
        for (equation, shapes) in [
            ("ii->i", &[&[3usize, 3][..]][..]),
            ("iij->j", &[&[3, 3, 2]]),
            // j is summed with extent 1 on one side and 4 on the other.
            ("ij,jk->ik", &[&[2, 1], &[4, 5]]),
        ] {
            let (_, h, _, rewrites) = lowered(equation, shapes, DType::F32);
            assert_eq!(rewrites, 0, "{equation}");
            assert!(has_einsum(&h), "{equation}");
        }
    }

    /// The attention-score form is one product of a transposed operand; a projection by a
    /// 2-D operand is one GEMM over every leading axis.
    #[test]
    fn products_take_the_shapes_exporters_need() {
        let (_, h, _, _) = lowered("bhid,bhjd->bhij", &[&[1, 2, 8, 4], &[1, 2, 8, 4]], DType::F32);
        let ops: Vec<&str> = h.nodes().iter().skip(2).map(|n| n.op.name()).collect();
        assert_eq!(ops, ["Transpose", "MatMul"]);
        let (_, h, _, _) = lowered("bsd,de->bse", &[&[2, 3, 4], &[4, 5]], DType::F32);
        let product = h.nodes().iter().find(|n| n.op == Op::MatMul).unwrap();
        let a = h.value_type(product.inputs[0].unwrap());
        assert_eq!(a.fixed_shape(), Some(vec![6, 4]));
    }
}
