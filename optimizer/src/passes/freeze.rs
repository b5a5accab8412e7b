//! `freeze`: everything that can be decided at compile time is.
//!
//! One forward sweep over the graph builds a new one:
//! - a node whose inputs are all constants is evaluated with the reference interpreter's
//!   per-operator evaluation (`ir::ops::eval`) and becomes constants (weight transposes, casts,
//!   shape arithmetic: this is what turns exported `Shape → Gather → Concat → Reshape` chains
//!   static); values the importer already knew (`NodeOutput.known`) become constants too;
//! - Identity (inference Dropout is imported as Identity) vanishes;
//! - a Transpose that moves only dimensions of extent 1 (the others keep their order, as in
//!   `[1, S, D] → [S, 1, D]` of a batch-1 seq-first export) becomes a Reshape: a view of its
//!   input instead of a copy;
//! - a Gather of constant indices that count up one by one (`index_select(x, 3,
//!   torch.arange(n))`, XLNet's relative shift) becomes the Slice it is: a strided copy (or a
//!   view) instead of the element-by-element index kernel;
//! - a Gemm of constant weights (alpha and beta 1, A not transposed) becomes a MatMul with the
//!   weights transposed as the product needs them, plus an Add of its per-column C: codegen then
//!   fuses the bias, a residual and an activation into the product as for any MatMul;
//! - BatchNormalization becomes a per-channel affine map that folds into the Conv,
//!   ConvTranspose, Gemm or MatMul-with-constant-weights before it when that producer has no
//!   other use, and otherwise is a `Mul` + `Add` of constants (elementwise, so later passes and
//!   codegen can fuse it); a `Mul`/`Add`/`Sub` by a per-channel constant folds the same way;
//! - common subexpressions merge (same operator, attributes and inputs; constants are equal by
//!   content, so identical weights are stored once);
//! - a second sweep drops dead nodes and gives each graph output's name back to the value that
//!   now produces it (an Identity in front of an output no longer renames it).
//!
//! Folding evaluates exactly what the interpreter would at run time, so results only change
//! where an affine map is folded into weights (f64 arithmetic, one f32 rounding).

use crate::{Pass, PassReport};
use kiln_ir::ops::{self, EvalCtx};
use kiln_ir::tensor::{LeBytes, TensorData};
use kiln_ir::{Binary, DType, Graph, IrError, NodeId, Op, Tensor, ValueId};
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

pub struct Freeze;

/// A folded value this large is kept as a computation when it is also much larger than what
/// it is computed from: `ConstantOfShape`, `Expand` or `Tile` of a few bytes can describe
/// gigabytes, which would bloat the artifact's weights (and compile-time memory) for a value
/// that costs one cheap kernel to produce at run time. Growth up to `FOLD_MAX_GROWTH` (casts,
/// dequantization of int4/int8 weights) is always folded: it makes weights directly usable.
const FOLD_MAX_BYTES: usize = 16 << 20;
const FOLD_MAX_GROWTH: usize = 8;

/// What the pass did, for the pass manager's report.
#[derive(Default, Debug, Clone, PartialEq, Eq)]
pub struct FreezeCounts {
    /// Nodes evaluated at compile time.
    pub folded: usize,
    /// Values the importer already knew, now constants.
    pub known: usize,
    pub identities: usize,
    /// Transposes of extent-1 dimensions only, now Reshapes.
    pub transposes_as_reshapes: usize,
    /// Gathers of consecutive constant indices, now Slices.
    pub gathers_as_slices: usize,
    /// Gemm of constant weights, now MatMul (+ Add).
    pub gemms_as_matmuls: usize,
    /// BatchNormalization folded into the producer's weights.
    pub bn_folded: usize,
    /// BatchNormalization rewritten as Mul + Add.
    pub bn_affine: usize,
    /// Mul/Add/Sub by a per-channel constant folded into the producer's weights.
    pub affine_folded: usize,
    /// Nodes merged with an identical earlier node.
    pub cse: usize,
    /// Constants merged with an identical earlier constant.
    pub const_dedup: usize,
    pub dead: usize,
    /// Large foldable nodes left to run time (see `FOLD_MAX_BYTES`).
    pub not_folded_large: usize,
}

impl FreezeCounts {
    pub fn rewrites(&self) -> usize {
        self.folded
            + self.known
            + self.identities
            + self.transposes_as_reshapes
            + self.gathers_as_slices
            + self.gemms_as_matmuls
            + self.bn_folded
            + self.bn_affine
            + self.affine_folded
            + self.cse
            + self.const_dedup
            + self.dead
    }

    pub fn summary(&self) -> String {
        let parts: Vec<String> = [
            (self.folded, "folded {} nodes"),
            (self.known, "{} known values made constant"),
            (self.identities, "removed {} Identity"),
            (
                self.transposes_as_reshapes,
                "{} Transpose of extent-1 dimensions as Reshape",
            ),
            (
                self.gathers_as_slices,
                "{} Gather of consecutive indices as Slice",
            ),
            (self.gemms_as_matmuls, "{} Gemm as MatMul"),
            (self.bn_folded, "folded {} BatchNormalization into weights"),
            (self.bn_affine, "{} BatchNormalization as Mul+Add"),
            (self.affine_folded, "folded {} Mul/Add into weights"),
            (self.cse, "merged {} duplicate nodes"),
            (self.const_dedup, "merged {} duplicate constants"),
            (self.dead, "removed {} dead nodes"),
            (self.not_folded_large, "left {} large foldable nodes to run time"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, f)| f.replace("{}", &n.to_string()))
        .collect();
        if parts.is_empty() {
            "unchanged".to_string()
        } else {
            parts.join(", ")
        }
    }
}

impl Pass for Freeze {
    fn name(&self) -> &'static str {
        "freeze"
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        Ok(self.run_with_report(graph)?.rewrites)
    }

    fn run_with_report(&self, graph: &mut Graph) -> Result<PassReport, IrError> {
        let (new, counts) = freeze(graph)?;
        let rewrites = counts.rewrites();
        if rewrites > 0 {
            *graph = new;
        }
        Ok(PassReport {
            rewrites,
            summary: counts.summary(),
        })
    }
}

/// Freezes `src` into a new graph; see the module documentation.
pub fn freeze(src: &Graph) -> Result<(Graph, FreezeCounts), IrError> {
    let mut b = Builder {
        src,
        dst: Graph::new(src.name.clone()),
        map: HashMap::new(),
        consts: HashMap::new(),
        cse: HashMap::new(),
        origin: HashMap::new(),
        uses: root_use_counts(src),
        counts: FreezeCounts::default(),
    };
    for &id in src.inputs() {
        let out = &src.node(id).outputs[0];
        let v = b.dst.add_input(out.name.clone(), out.ty.clone());
        b.map.insert(id.out(0), v);
    }
    for id in src.node_ids() {
        b.node(id)?;
    }
    for o in src.outputs() {
        let v = b.map[&o.value];
        b.dst.add_output(o.name.clone(), v);
    }
    let mut counts = b.counts;
    // Dead nodes of the source; the nodes that rewriting left unused go too, without counting
    // (they are already counted as what replaced them).
    counts.dead = kiln_ir::rewrite::live_nodes(src)
        .iter()
        .zip(src.nodes())
        .filter(|(live, n)| !**live && n.op != Op::Input)
        .count();
    let graph = finish(&b.dst)?;
    Ok((graph, counts))
}

struct Builder<'a> {
    src: &'a Graph,
    dst: Graph,
    /// Source value → value of `dst` standing for it.
    map: HashMap<ValueId, ValueId>,
    /// Content hash → constants of `dst` with that hash.
    consts: HashMap<u64, Vec<ValueId>>,
    /// Operator, attributes and inputs → the first node of `dst` computing them.
    cse: HashMap<String, Vec<NodeId>>,
    /// Value of `dst` → the source value it was first copied from (for use counts).
    origin: HashMap<ValueId, ValueId>,
    /// Uses of each source value: weights are only rewritten for a producer used once, so
    /// folding never duplicates a convolution.
    uses: HashMap<ValueId, usize>,
    counts: FreezeCounts,
}

/// A hash of the dtype, shape and up to `HASH_SAMPLES` evenly spaced elements: constants with
/// equal hashes are compared in full, so sampling only costs a comparison on a collision, and
/// hashing the weights of a large model stays cheap.
fn content_hash(t: &Tensor) -> u64 {
    const HASH_SAMPLES: usize = 1024;
    fn sample<T: kiln_ir::Element + LeBytes>(v: &[T], h: &mut DefaultHasher) {
        let step = v.len().div_ceil(HASH_SAMPLES).max(1);
        let mut bytes = Vec::with_capacity(HASH_SAMPLES * 8);
        for x in v.iter().step_by(step) {
            x.put_le(&mut bytes);
        }
        bytes.hash(h);
    }
    let mut h = DefaultHasher::new();
    t.dtype().hash(&mut h);
    t.shape().hash(&mut h);
    kiln_ir::with_data!(t.data(), v => sample(v, &mut h));
    h.finish()
}

fn same_content(a: &Tensor, b: &Tensor) -> bool {
    // Bytes, not values: -0.0 and 0.0 differ, and NaN equals itself.
    a.dtype() == b.dtype() && a.shape() == b.shape() && a.to_le_bytes() == b.to_le_bytes()
}

/// Uses of each source value, where an Identity passes its uses on to its input (it vanishes,
/// so a Conv read through an Identity and elsewhere has two uses).
fn root_use_counts(g: &Graph) -> HashMap<ValueId, usize> {
    let mut uses = HashMap::new();
    for n in g.nodes().iter().filter(|n| n.op != Op::Identity) {
        for &v in n.inputs.iter().flatten() {
            *uses.entry(identity_root(g, v)).or_insert(0) += 1;
        }
    }
    for o in g.outputs() {
        *uses.entry(identity_root(g, o.value)).or_insert(0) += 1;
    }
    uses
}

/// The value behind a chain of Identity nodes.
fn identity_root(g: &Graph, mut v: ValueId) -> ValueId {
    while let (Op::Identity, Some(x)) = (
        &g.node(v.node).op,
        g.node(v.node).inputs.first().copied().flatten(),
    ) {
        v = x;
    }
    v
}

impl Builder<'_> {
    fn root(&self, v: ValueId) -> ValueId {
        identity_root(self.src, v)
    }

    /// A constant of `dst` with this content (an existing one when there is one).
    fn constant(&mut self, name: &str, t: Arc<Tensor>) -> ValueId {
        let h = content_hash(&t);
        if let Some(vs) = self.consts.get(&h) {
            for &v in vs {
                let existing = self.dst.known_value(v).expect("interned values are constants");
                if Arc::ptr_eq(&self.const_arc(v), &t) || same_content(existing, &t) {
                    self.counts.const_dedup += 1;
                    return v;
                }
            }
        }
        let v = self.dst.add_const(name, t);
        self.consts.entry(h).or_default().push(v);
        v
    }

    fn const_arc(&self, v: ValueId) -> Arc<Tensor> {
        match self.dst.node(v.node).op {
            Op::Constant(c) => self.dst.consts()[c.0 as usize].clone(),
            _ => unreachable!("interned values are constants"),
        }
    }

    fn is_const(&self, v: ValueId) -> bool {
        matches!(self.dst.node(v.node).op, Op::Constant(_))
    }

    fn node(&mut self, id: NodeId) -> Result<(), IrError> {
        let src = self.src;
        let node = src.node(id);
        let op = &node.op;
        match op {
            Op::Input => return Ok(()),
            Op::Constant(c) => {
                let v = self.constant(&node.outputs[0].name, src.consts()[c.0 as usize].clone());
                self.map.insert(id.out(0), v);
                return Ok(());
            }
            _ => {}
        }
        let inputs: Vec<Option<ValueId>> = node.inputs.iter().map(|v| v.map(|v| self.map[&v])).collect();
        if let Op::Identity = op {
            if let Some(x) = inputs[0] {
                self.map.insert(id.out(0), x);
                self.counts.identities += 1;
                return Ok(());
            }
        }
        if inputs.iter().flatten().all(|&v| self.is_const(v)) && self.fold(id, &inputs)? {
            return Ok(());
        }
        let outs = match op {
            Op::Transpose { perm } => self.transpose_as_reshape(id, &inputs, perm)?,
            Op::Gather { axis } => self.gather_as_slice(id, &inputs, *axis)?,
            Op::Gemm {
                alpha,
                beta,
                trans_a: false,
                trans_b,
            } if *alpha == 1.0 && *beta == 1.0 => self.gemm_as_matmul(id, &inputs, *trans_b)?,
            Op::BatchNorm { epsilon } => self.batch_norm(id, &inputs, *epsilon)?,
            Op::Binary(b @ (Binary::Mul | Binary::Add | Binary::Sub)) => self.affine_op(id, &inputs, *b)?,
            _ => None,
        };
        let outs = match outs {
            Some(outs) => outs,
            None => self.add_cse(id, &inputs)?,
        };
        // Values inference computed from known inputs (Shape of a static tensor, arithmetic on
        // it) become constants; the node computing them goes dead.
        let mut known = false;
        let mut mapped = Vec::with_capacity(outs.len());
        for (i, &v) in outs.iter().enumerate() {
            match self.dst.node(v.node).outputs[v.output as usize].known.clone() {
                Some(t) if !self.is_const(v) => {
                    known = true;
                    mapped.push(self.constant(&node.outputs[i].name, t));
                }
                _ => mapped.push(v),
            }
        }
        self.counts.known += usize::from(known);
        for (i, v) in mapped.into_iter().enumerate() {
            self.map.insert(id.out(i as u32), v);
        }
        Ok(())
    }

    /// Evaluates a node whose inputs are all constants; false when it is left to run time.
    fn fold(&mut self, id: NodeId, inputs: &[Option<ValueId>]) -> Result<bool, IrError> {
        let node = self.src.node(id);
        let args: Vec<Option<&Tensor>> = inputs
            .iter()
            .map(|v| v.map(|v| self.dst.known_value(v).expect("constant")))
            .collect();
        let in_bytes: usize = args.iter().flatten().map(|t| t.size_bytes()).sum();
        let too_big = |out: usize| out > FOLD_MAX_BYTES && out > FOLD_MAX_GROWTH.saturating_mul(in_bytes);
        let declared: Option<usize> = node.outputs.iter().map(|o| o.ty.size_bytes()).sum();
        if declared.is_some_and(too_big) {
            self.counts.not_folded_large += 1;
            return Ok(false);
        }
        let types: Vec<_> = node.outputs.iter().map(|o| o.ty.clone()).collect();
        let cx = EvalCtx {
            inputs: args,
            out_types: &types,
        };
        let outs = ops::eval(&node.op, &cx).map_err(|e| IrError::op(&node.name, node.op.name(), e))?;
        if outs.len() != node.outputs.len() {
            return Err(IrError::node(
                &node.name,
                node.op.name(),
                format!(
                    "folding produced {} outputs, expected {}",
                    outs.len(),
                    node.outputs.len()
                ),
            ));
        }
        if too_big(outs.iter().map(Tensor::size_bytes).sum()) {
            self.counts.not_folded_large += 1;
            return Ok(false);
        }
        for (i, t) in outs.into_iter().enumerate() {
            let v = self.constant(&node.outputs[i].name, Arc::new(t));
            self.map.insert(id.out(i as u32), v);
        }
        self.counts.folded += 1;
        Ok(true)
    }

    /// A Reshape for a Transpose whose permutation keeps the dimensions of extent > 1 in
    /// order (the same elements in the same order: a view, where the Transpose is a copy).
    fn transpose_as_reshape(
        &mut self,
        id: NodeId,
        inputs: &[Option<ValueId>],
        perm: &[usize],
    ) -> Result<Option<Vec<ValueId>>, IrError> {
        let node = self.src.node(id);
        let (Some(x), Some(out_shape)) = (inputs[0], node.outputs[0].ty.fixed_shape()) else {
            return Ok(None);
        };
        let Some(shape) = self.dst.value_type(x).fixed_shape() else {
            return Ok(None);
        };
        let moved: Vec<usize> = perm
            .iter()
            .copied()
            .filter(|&p| shape.get(p) != Some(&1))
            .collect();
        if perm.len() != shape.len() || !moved.windows(2).all(|w| w[0] < w[1]) {
            return Ok(None);
        }
        let dims: Vec<i64> = out_shape.iter().map(|&d| d as i64).collect();
        let name = &node.outputs[0].name;
        let target = self.constant(
            &format!("{name}.shape"),
            Arc::new(Tensor::from_vec(vec![dims.len()], dims)),
        );
        let y = self.dst.add(
            node.name.clone(),
            Op::Reshape { allow_zero: false },
            vec![Some(x), Some(target)],
            name.clone(),
        )?;
        self.counts.transposes_as_reshapes += 1;
        Ok(Some(vec![y]))
    }

    /// A Slice for a Gather along `axis` whose indices are a constant 1-D run `s, s+1, ...,
    /// s+n-1` (negative ones counted from the end, as Gather does): the same elements.
    fn gather_as_slice(
        &mut self,
        id: NodeId,
        inputs: &[Option<ValueId>],
        axis: i64,
    ) -> Result<Option<Vec<ValueId>>, IrError> {
        let node = self.src.node(id);
        let (Some(x), Some(indices)) = (inputs[0], inputs[1]) else {
            return Ok(None);
        };
        let Some(t) = self.dst.known_value(indices) else {
            return Ok(None);
        };
        let shape = self.dst.value_type(x).fixed_shape();
        let rank = shape.as_ref().map_or(0, Vec::len) as i64;
        if t.shape().len() != 1 || t.shape()[0] == 0 || !(-rank..rank).contains(&axis) {
            return Ok(None);
        }
        let axis = axis.rem_euclid(rank) as usize;
        let extent = shape.expect("rank > 0")[axis] as i64;
        let wrapped: Vec<i64> = t
            .to_i64_vec()
            .into_iter()
            .map(|i| if i < 0 { i + extent } else { i })
            .collect();
        let start = wrapped[0];
        let run = wrapped.iter().enumerate().all(|(k, &i)| i == start + k as i64);
        if start < 0 || !run || start + wrapped.len() as i64 > extent {
            return Ok(None);
        }
        let name = node.outputs[0].name.clone();
        let one = |me: &mut Self, what: &str, v: i64| {
            me.constant(
                &format!("{name}.{what}"),
                Arc::new(Tensor::from_vec(vec![1], vec![v])),
            )
        };
        let starts = one(self, "starts", start);
        let ends = one(self, "ends", start + wrapped.len() as i64);
        let axes = one(self, "axes", axis as i64);
        let y = self.dst.add(
            node.name.clone(),
            Op::Slice,
            vec![Some(x), Some(starts), Some(ends), Some(axes)],
            name,
        )?;
        self.counts.gathers_as_slices += 1;
        Ok(Some(vec![y]))
    }

    /// `MatMul(A, B [transposed]) [+ C]` for a `Gemm(A, B, C?)` (alpha and beta 1, A not
    /// transposed) whose B is a constant f32 matrix and C, if any, a constant per-column f32
    /// vector.
    fn gemm_as_matmul(
        &mut self,
        id: NodeId,
        inputs: &[Option<ValueId>],
        trans_b: bool,
    ) -> Result<Option<Vec<ValueId>>, IrError> {
        let node = self.src.node(id);
        let (Some(a), Some(b)) = (inputs[0], inputs[1]) else {
            return Ok(None);
        };
        let c = inputs.get(2).copied().flatten();
        let Some(out_shape) = node.outputs[0].ty.fixed_shape() else {
            return Ok(None);
        };
        let n = out_shape[1];
        let f32_const = |v: ValueId| self.is_const(v) && self.dst.value_type(v).dtype == DType::F32;
        let per_column = |v: ValueId| {
            let shape = self.dst.value_type(v).fixed_shape().unwrap_or_default();
            f32_const(v) && (shape == [n] || shape == [1, n])
        };
        if !f32_const(b) || self.dst.value_type(b).rank() != 2 || c.is_some_and(|c| !per_column(c)) {
            return Ok(None);
        }
        let out = node.outputs[0].name.clone();
        let w = if trans_b {
            let t = self.const_arc(b);
            let ty = [kiln_ir::TensorType::fixed(
                DType::F32,
                &[t.shape()[1], t.shape()[0]],
            )];
            let cx = EvalCtx {
                inputs: vec![Some(&*t)],
                out_types: &ty,
            };
            let wt = ops::eval(&Op::Transpose { perm: vec![1, 0] }, &cx)
                .map_err(|e| IrError::op(&node.name, node.op.name(), e))?
                .remove(0);
            self.constant(&format!("{out}.weight"), Arc::new(wt))
        } else {
            b
        };
        let product_out = if c.is_some() {
            format!("{out}.product")
        } else {
            out.clone()
        };
        let mut y = self
            .dst
            .add(node.name.clone(), Op::MatMul, vec![Some(a), Some(w)], product_out)?;
        if let Some(c) = c {
            y = self.dst.add(
                format!("{}.bias", node.name),
                Op::Binary(Binary::Add),
                vec![Some(y), Some(c)],
                out,
            )?;
        }
        self.counts.gemms_as_matmuls += 1;
        Ok(Some(vec![y]))
    }

    /// Adds the node, or reuses an identical earlier one.
    fn add_cse(&mut self, id: NodeId, inputs: &[Option<ValueId>]) -> Result<Vec<ValueId>, IrError> {
        let node = self.src.node(id);
        let n_out = node.outputs.len();
        // Subgraph operators are rare and their Debug form is the whole subgraph: not merged.
        let key = node
            .op
            .subgraphs()
            .is_empty()
            .then(|| format!("{:?}|{inputs:?}|{n_out}", node.op));
        if let Some(key) = &key {
            if let Some(prev) = self.cse.get(key) {
                // The key is the operator's Debug form; `==` confirms (NaN attributes never merge).
                if let Some(&p) = prev.iter().find(|&&p| self.dst.node(p).op == node.op) {
                    self.counts.cse += 1;
                    return Ok((0..n_out as u32).map(|i| p.out(i)).collect());
                }
            }
        }
        let outs = self.dst.add_node(
            node.name.clone(),
            node.op.clone(),
            inputs.to_vec(),
            node.outputs.iter().map(|o| o.name.clone()).collect(),
        )?;
        if let Some(key) = key {
            self.cse.entry(key).or_default().push(outs[0].node);
        }
        for (i, &v) in outs.iter().enumerate() {
            self.origin.insert(v, id.out(i as u32));
        }
        Ok(outs)
    }

    /// Inference BatchNormalization with constant parameters: `y = x * k + s` per channel
    /// (axis 1), with `k = scale / sqrt(var + eps)` and `s = B - mean * k` in f64.
    fn batch_norm(
        &mut self,
        id: NodeId,
        inputs: &[Option<ValueId>],
        epsilon: f32,
    ) -> Result<Option<Vec<ValueId>>, IrError> {
        let node = self.src.node(id);
        let Some(x) = inputs[0] else { return Ok(None) };
        let xty = self.dst.value_type(x).clone();
        let Some(c) = xty.shape.get(1).and_then(|d| d.fixed()) else {
            return Ok(None);
        };
        if !matches!(xty.dtype, DType::F32 | DType::F64) || node.outputs.len() != 1 {
            return Ok(None);
        }
        let params: Option<Vec<Vec<f64>>> = inputs[1..]
            .iter()
            .map(|v| v.and_then(|v| self.dst.known_value(v)).map(Tensor::to_f64_vec))
            .collect();
        let Some(p) = params.filter(|p| p.len() == 4 && p.iter().all(|v| v.len() == c)) else {
            return Ok(None);
        };
        let k: Vec<f64> = (0..c)
            .map(|i| p[0][i] / (p[3][i] + f64::from(epsilon)).sqrt())
            .collect();
        let s: Vec<f64> = (0..c).map(|i| p[1][i] - p[2][i] * k[i]).collect();
        let x_src = node.inputs[0].expect("present");
        if let Some(v) = self.fold_affine(x, x_src, 1, Some(&k), Some(&s), &node.outputs[0].name)? {
            self.counts.bn_folded += 1;
            return Ok(Some(vec![v]));
        }
        // x * k + s with [C, 1, ...] constants that broadcast along axis 1.
        let mut shape = vec![c];
        shape.resize(xty.rank().max(2) - 1, 1);
        let kc = self.affine_const(&format!("{}.scale", node.name), &shape, xty.dtype, &k);
        let sc = self.affine_const(&format!("{}.shift", node.name), &shape, xty.dtype, &s);
        let m = self.dst.add(
            format!("{}.mul", node.name),
            Op::Binary(Binary::Mul),
            vec![Some(x), Some(kc)],
            format!("{}.scaled", node.outputs[0].name),
        )?;
        let y = self.dst.add(
            node.name.clone(),
            Op::Binary(Binary::Add),
            vec![Some(m), Some(sc)],
            node.outputs[0].name.clone(),
        )?;
        self.counts.bn_affine += 1;
        Ok(Some(vec![y]))
    }

    fn affine_const(&mut self, name: &str, shape: &[usize], dtype: DType, vals: &[f64]) -> ValueId {
        let t = Tensor::new(shape.to_vec(), TensorData::from_f64s(dtype, vals.iter().copied()))
            .expect("shape matches the channel count");
        self.constant(name, Arc::new(t))
    }

    /// `y = x * c`, `x + c` or `x - c` with a per-channel constant `c`, folded into the
    /// weights of `x`'s producer.
    fn affine_op(
        &mut self,
        id: NodeId,
        inputs: &[Option<ValueId>],
        op: Binary,
    ) -> Result<Option<Vec<ValueId>>, IrError> {
        let node = self.src.node(id);
        let (Some(a), Some(b)) = (inputs[0], inputs[1]) else {
            return Ok(None);
        };
        // The variable operand and the constant, in either order except for Sub.
        let (x, x_src, c) = match (self.dst.known_value(a), self.dst.known_value(b)) {
            (None, Some(c)) => (a, node.inputs[0], c.clone()),
            (Some(c), None) if op != Binary::Sub => (b, node.inputs[1], c.clone()),
            _ => return Ok(None),
        };
        let Some(x_src) = x_src else { return Ok(None) };
        let axis = match self.producer_channel_axis(x) {
            Some(a) => a,
            None if self.matmul_with_bias(x).is_some() => self.dst.value_type(x).rank() - 1,
            None => return Ok(None),
        };
        let xty = self.dst.value_type(x);
        // The result must have x's shape and dtype: c only broadcasts along x.
        if self.dst.value_type(x).dtype != c.dtype() || c.rank() > xty.rank() {
            return Ok(None);
        }
        let Some(shape) = xty.fixed_shape() else {
            return Ok(None);
        };
        let Some(vals) = per_channel(&c, &shape, axis) else {
            return Ok(None);
        };
        let folded = match op {
            Binary::Mul => self.fold_affine(x, x_src, axis, Some(&vals), None, &node.outputs[0].name)?,
            Binary::Add => self.fold_affine(x, x_src, axis, None, Some(&vals), &node.outputs[0].name)?,
            _ => {
                let neg: Vec<f64> = vals.iter().map(|v| -v).collect();
                self.fold_affine(x, x_src, axis, None, Some(&neg), &node.outputs[0].name)?
            }
        };
        Ok(folded.map(|v| {
            self.counts.affine_folded += 1;
            vec![v]
        }))
    }

    /// The axis of `x` that indexes its producer's output channels, when the producer is a
    /// Conv/ConvTranspose/Gemm/MatMul with constant f32/f64 weights.
    fn producer_channel_axis(&self, x: ValueId) -> Option<usize> {
        let p = self.dst.node(x.node);
        let w = p
            .inputs
            .get(1)
            .copied()
            .flatten()
            .and_then(|w| self.dst.known_value(w))?;
        if !matches!(w.dtype(), DType::F32 | DType::F64) || p.outputs.len() != 1 {
            return None;
        }
        let rank = self.dst.value_type(x).rank();
        match p.op {
            Op::Conv(_) | Op::ConvTranspose(_) | Op::Gemm { .. } => Some(1),
            Op::MatMul if w.rank() >= 2 && rank >= 2 => Some(rank - 1),
            _ => None,
        }
    }

    /// When `x` is `MatMul(a, W) + c` (constant weights, a per-column constant `c`, the MatMul
    /// used only there): the MatMul's value, its source value and `c` per column.
    fn matmul_with_bias(&self, x: ValueId) -> Option<(ValueId, ValueId, Vec<f64>)> {
        let p = self.dst.node(x.node);
        if p.op != Op::Binary(Binary::Add) {
            return None;
        }
        let (a, b) = (p.inputs[0]?, p.inputs[1]?);
        let (m, c) = match (self.dst.known_value(a), self.dst.known_value(b)) {
            (None, Some(c)) => (a, c),
            (Some(c), None) => (b, c),
            _ => return None,
        };
        let xty = self.dst.value_type(x);
        let rank = xty.rank();
        if self.dst.node(m.node).op != Op::MatMul
            || self.producer_channel_axis(m) != Some(rank.checked_sub(1)?)
            || self.dst.value_type(m) != xty
            || c.dtype() != xty.dtype
            || c.rank() > rank
        {
            return None;
        }
        let m_src = *self.origin.get(&m)?;
        if self.uses.get(&self.root(m_src)).copied() != Some(1) {
            return None;
        }
        let bias = per_channel(c, &xty.fixed_shape()?, rank - 1)?;
        Some((m, m_src, bias))
    }

    /// Replaces `x` (= `x_src` in the source graph) by its producer with the affine map
    /// `x * scale + shift` (per channel along `axis`) folded into its weights and bias.
    /// None when the producer cannot absorb it.
    fn fold_affine(
        &mut self,
        x: ValueId,
        x_src: ValueId,
        axis: usize,
        scale: Option<&[f64]>,
        shift: Option<&[f64]>,
        out_name: &str,
    ) -> Result<Option<ValueId>, IrError> {
        if self.uses.get(&self.root(x_src)).copied() != Some(1) {
            return Ok(None);
        }
        if let Some((m, m_src, bias)) = self.matmul_with_bias(x) {
            // (x W + c) * k + s = x (W k) + (c k + s): the scale goes into the weights, the
            // two shifts merge into one per-column Add.
            if axis + 1 != self.dst.value_type(x).rank() {
                return Ok(None);
            }
            let ones = vec![1.0; bias.len()];
            let merged: Vec<f64> = (0..bias.len())
                .map(|j| bias[j] * scale.map_or(1.0, |k| k[j]) + shift.map_or(0.0, |s| s[j]))
                .collect();
            return self.fold_affine(
                m,
                m_src,
                axis,
                Some(scale.unwrap_or(&ones)),
                Some(&merged),
                out_name,
            );
        }
        if self.producer_channel_axis(x) != Some(axis) {
            return Ok(None);
        }
        let p = self.dst.node(x.node).clone();
        let w = self
            .dst
            .known_value(p.inputs[1].expect("weights"))
            .expect("constant")
            .clone();
        let bias = p.inputs.get(2).copied().flatten();
        let bias_t = match bias {
            Some(b) => match self.dst.known_value(b) {
                Some(t) => Some(t.clone()),
                None => return Ok(None),
            },
            None => None,
        };
        let dt = w.dtype();
        let wv = w.to_f64_vec();
        let ws = w.shape().to_vec();
        let new_w = |out_channel: &dyn Fn(usize) -> usize| -> Vec<f64> {
            match scale {
                Some(k) => wv
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| v * k[out_channel(i)])
                    .collect(),
                None => wv.clone(),
            }
        };
        let tensor = |shape: Vec<usize>, vals: Vec<f64>| {
            Tensor::new(shape, TensorData::from_f64s(dt, vals)).expect("same element count")
        };
        let (weights, new_bias, new_op): (Tensor, Option<Tensor>, Op) = match &p.op {
            Op::Conv(_) | Op::ConvTranspose(_) => {
                let m = match &p.op {
                    Op::Conv(_) => ws[0],
                    _ => match self.dst.value_type(x).shape[1].fixed() {
                        Some(m) => m,
                        None => return Ok(None),
                    },
                };
                let per: usize = ws[1..].iter().product();
                let wvals = match &p.op {
                    Op::Conv(_) => new_w(&|i| i / per.max(1)),
                    Op::ConvTranspose(a) => {
                        // W is [C, M/group, k...]: input channel c of group c / (C/group) feeds
                        // output channel group * (M/group) + m.
                        let group = a.conv.group.max(1);
                        let (cin, mg) = (ws[0], ws[1]);
                        let cg = (cin / group).max(1);
                        let k: usize = ws[2..].iter().product();
                        new_w(&|i| {
                            let c = i / (mg * k).max(1);
                            let mm = (i / k.max(1)) % mg.max(1);
                            (c / cg) * mg + mm
                        })
                    }
                    _ => unreachable!(),
                };
                if scale.is_some_and(|k| k.len() != m) || shift.is_some_and(|s| s.len() != m) {
                    return Ok(None);
                }
                let b0 = bias_t.as_ref().map(Tensor::to_f64_vec);
                if b0.as_ref().is_some_and(|b| b.len() != m) {
                    return Ok(None);
                }
                let nb = if b0.is_none() && shift.is_none() {
                    None
                } else {
                    Some(tensor(
                        vec![m],
                        (0..m)
                            .map(|i| {
                                let b = b0.as_ref().map_or(0.0, |b| b[i]);
                                b * scale.map_or(1.0, |k| k[i]) + shift.map_or(0.0, |s| s[i])
                            })
                            .collect(),
                    ))
                };
                (tensor(ws.clone(), wvals), nb, p.op.clone())
            }
            Op::Gemm {
                alpha,
                beta,
                trans_a,
                trans_b,
            } => {
                if ws.len() != 2 {
                    return Ok(None);
                }
                let n = if *trans_b { ws[0] } else { ws[1] };
                if scale.is_some_and(|k| k.len() != n) || shift.is_some_and(|s| s.len() != n) {
                    return Ok(None);
                }
                let wvals = if *trans_b {
                    new_w(&|i| i / ws[1].max(1))
                } else {
                    new_w(&|i| i % ws[1].max(1))
                };
                let Some(out_shape) = self.dst.value_type(x).fixed_shape() else {
                    return Ok(None);
                };
                // C' = beta * C * k + s, as [N] when C varies by column only, else [M, N].
                let (nb, new_beta) = match (&bias_t, shift) {
                    (None, None) => (None, *beta),
                    _ => {
                        let c = bias_t.as_ref();
                        let per_col = c.is_none_or(|c| c.shape().iter().rev().skip(1).all(|&d| d == 1));
                        let shape = if per_col { vec![n] } else { out_shape.clone() };
                        let full = match c {
                            Some(c) => match broadcast_f64(c, &shape) {
                                Some(f) => f,
                                None => return Ok(None),
                            },
                            None => vec![0.0; shape.iter().product()],
                        };
                        let vals = full
                            .iter()
                            .enumerate()
                            .map(|(i, &cv)| {
                                let j = i % n;
                                f64::from(*beta) * cv * scale.map_or(1.0, |k| k[j])
                                    + shift.map_or(0.0, |s| s[j])
                            })
                            .collect();
                        (Some(tensor(shape, vals)), 1.0)
                    }
                };
                let op = Op::Gemm {
                    alpha: *alpha,
                    beta: new_beta,
                    trans_a: *trans_a,
                    trans_b: *trans_b,
                };
                (tensor(ws.clone(), wvals), nb, op)
            }
            Op::MatMul => {
                let n = ws[ws.len() - 1];
                if scale.is_some_and(|k| k.len() != n) || shift.is_some_and(|s| s.len() != n) {
                    return Ok(None);
                }
                // A MatMul has no bias input: a shift stays an Add (codegen fuses a per-column
                // constant Add into the MatMul kernel), so only a scale is worth folding.
                if scale.is_none() {
                    return Ok(None);
                }
                (tensor(ws.clone(), new_w(&|i| i % n.max(1))), None, Op::MatMul)
            }
            _ => return Ok(None),
        };
        let wc = self.constant(&format!("{}.folded_weight", p.name), Arc::new(weights));
        let mut ins = vec![p.inputs[0], Some(wc)];
        if let Some(b) = new_bias {
            ins.push(Some(
                self.constant(&format!("{}.folded_bias", p.name), Arc::new(b)),
            ));
        }
        let matmul_shift = matches!(p.op, Op::MatMul).then_some(shift).flatten();
        let y_name = if matmul_shift.is_some() {
            format!("{out_name}.matmul")
        } else {
            out_name.to_string()
        };
        let mut y = self.dst.add(p.name.clone(), new_op, ins, y_name)?;
        if let Some(s) = matmul_shift {
            let sc = self.affine_const(&format!("{}.folded_bias", p.name), &[s.len()], dt, s);
            y = self.dst.add(
                format!("{}.bias", p.name),
                Op::Binary(Binary::Add),
                vec![Some(y), Some(sc)],
                out_name,
            )?;
        }
        Ok(Some(y))
    }
}

/// The values of `c` along `axis` of a tensor of `shape` it broadcasts to without changing
/// the shape, when `c` varies along that axis only (a scalar gives one value per channel).
fn per_channel(c: &Tensor, shape: &[usize], axis: usize) -> Option<Vec<f64>> {
    let r = shape.len();
    let off = r - c.rank();
    let mut len = 1;
    for (i, &d) in c.shape().iter().enumerate() {
        let a = off + i;
        if a == axis {
            if d != 1 && d != shape[a] {
                return None;
            }
            len = d;
        } else if d != 1 {
            return None;
        }
    }
    let vals = c.to_f64_vec();
    let n = shape[axis];
    Some(if len == 1 { vec![vals[0]; n] } else { vals })
}

/// `t` broadcast (numpy rules) to `shape`, as f64; None when it does not broadcast.
fn broadcast_f64(t: &Tensor, shape: &[usize]) -> Option<Vec<f64>> {
    let r = shape.len();
    if t.rank() > r {
        return None;
    }
    let off = r - t.rank();
    let ts = t.shape();
    for (i, &d) in ts.iter().enumerate() {
        if d != 1 && d != shape[off + i] {
            return None;
        }
    }
    let vals = t.to_f64_vec();
    let total: usize = shape.iter().product();
    let mut out = Vec::with_capacity(total);
    for flat in 0..total {
        let mut rem = flat;
        let mut src = 0;
        let mut stride = 1;
        for a in (0..r).rev() {
            let idx = rem % shape[a];
            rem /= shape[a];
            if a >= off {
                let d = ts[a - off];
                if d != 1 {
                    src += idx * stride;
                }
                stride *= d;
            }
        }
        out.push(vals[src]);
    }
    Some(out)
}

/// Copies the live part of `g` (what the graph outputs depend on; inputs always stay) and
/// gives each graph output's name to the value producing it when that value is not a graph
/// input and no other output or value claims the name.
fn finish(g: &Graph) -> Result<Graph, IrError> {
    let live = kiln_ir::rewrite::live_nodes(g);
    let mut outputs_of: HashMap<ValueId, Vec<&str>> = HashMap::new();
    for o in g.outputs() {
        outputs_of.entry(o.value).or_default().push(&o.name);
    }
    let mut taken: HashMap<&str, usize> = HashMap::new();
    for id in g.node_ids().filter(|id| live[id.index()]) {
        for o in &g.node(id).outputs {
            *taken.entry(o.name.as_str()).or_default() += 1;
        }
    }
    let mut rename: HashMap<ValueId, String> = HashMap::new();
    for (v, names) in &outputs_of {
        let [name] = names.as_slice() else { continue };
        if g.node(v.node).op == Op::Input || g.value_name(*v) == *name || taken.contains_key(name) {
            continue;
        }
        rename.insert(*v, name.to_string());
    }
    let name_of = |v: ValueId| {
        rename
            .get(&v)
            .cloned()
            .unwrap_or_else(|| g.value_name(v).to_string())
    };
    let mut dst = Graph::new(g.name.clone());
    let mut map: HashMap<ValueId, ValueId> = HashMap::new();
    for &id in g.inputs() {
        let out = &g.node(id).outputs[0];
        map.insert(id.out(0), dst.add_input(out.name.clone(), out.ty.clone()));
    }
    for id in g.node_ids() {
        let node = g.node(id);
        if !live[id.index()] {
            continue;
        }
        match &node.op {
            Op::Input => {}
            Op::Constant(c) => {
                let v = dst.add_const(name_of(id.out(0)), g.consts()[c.0 as usize].clone());
                map.insert(id.out(0), v);
            }
            op => {
                let inputs = node.inputs.iter().map(|v| v.map(|v| map[&v])).collect();
                let names = (0..node.outputs.len() as u32)
                    .map(|i| name_of(id.out(i)))
                    .collect();
                let outs = dst.add_node(node.name.clone(), op.clone(), inputs, names)?;
                for (i, v) in outs.into_iter().enumerate() {
                    map.insert(id.out(i as u32), v);
                }
            }
        }
    }
    for o in g.outputs() {
        dst.add_output(o.name.clone(), map[&o.value]);
    }
    Ok(dst)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{ConvAttrs, ConvTransposeAttrs, TensorType, Unary};

    fn vals(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 + seed) * 0.37).sin()).collect()
    }

    fn cst(g: &mut Graph, name: &str, shape: &[usize], seed: f32) -> ValueId {
        let n = shape.iter().product();
        g.add_const(name, Tensor::from_vec(shape.to_vec(), vals(n, seed)))
    }

    /// BN parameters for `c` channels; the variance is positive.
    fn bn(g: &mut Graph, x: ValueId, c: usize, out: &str) -> ValueId {
        let s = cst(g, "s", &[c], 1.0);
        let b = cst(g, "b", &[c], 2.0);
        let m = cst(g, "m", &[c], 3.0);
        let v: Vec<f32> = vals(c, 4.0).iter().map(|v| v.abs() + 0.5).collect();
        let v = g.add_const("v", Tensor::from_vec(vec![c], v));
        let ins = vec![Some(x), Some(s), Some(b), Some(m), Some(v)];
        g.add("bn", Op::BatchNorm { epsilon: 1e-5 }, ins, out).unwrap()
    }

    fn conv_attrs(group: usize) -> ConvAttrs {
        ConvAttrs {
            kernel_shape: vec![3, 3],
            strides: vec![1, 1],
            pads: vec![1, 1, 1, 1],
            dilations: vec![1, 1],
            group,
            ..ConvAttrs::default()
        }
    }

    fn input_values(g: &Graph) -> Vec<Tensor> {
        g.input_types()
            .enumerate()
            .map(|(i, (_, ty))| {
                let shape = ty.fixed_shape().unwrap();
                let n = shape.iter().product();
                Tensor::from_vec(shape, vals(n, 10.0 + i as f32))
            })
            .collect()
    }

    /// Freezes `g`, checks the results are unchanged (f32 rounding) and returns the new graph.
    fn frozen(g: &Graph) -> (Graph, FreezeCounts) {
        let (new, counts) = freeze(g).unwrap();
        kiln_ir::verify(&new).unwrap();
        let want = kiln_ir::eval::eval_graph(g, input_values(g)).unwrap();
        let got = kiln_ir::eval::eval_graph(&new, input_values(&new)).unwrap();
        for (w, a) in want.iter().zip(&got) {
            assert_eq!(w.shape(), a.shape());
            for (x, y) in w.to_f64_vec().iter().zip(a.to_f64_vec()) {
                assert!((x - y).abs() <= 1e-5 * (1.0 + x.abs()), "{x} vs {y}\n{new}");
            }
        }
        (new, counts)
    }

    fn count(g: &Graph, name: &str) -> usize {
        g.nodes().iter().filter(|n| n.op.name() == name).count()
    }

    #[test]
    fn batchnorm_folds_into_conv_with_and_without_bias() {
        for bias in [true, false] {
            let mut g = Graph::new("t");
            let x = g.add_input("x", TensorType::fixed(DType::F32, &[1, 2, 5, 5]));
            let w = cst(&mut g, "w", &[3, 2, 3, 3], 0.0);
            let mut ins = vec![Some(x), Some(w)];
            if bias {
                ins.push(Some(cst(&mut g, "cb", &[3], 5.0)));
            }
            let c = g.add("conv", Op::Conv(conv_attrs(1)), ins, "c").unwrap();
            let y = bn(&mut g, c, 3, "y");
            g.add_output("y", y);
            let (new, counts) = frozen(&g);
            assert_eq!(counts.bn_folded, 1);
            assert_eq!(count(&new, "BatchNormalization") + count(&new, "Mul"), 0, "{new}");
            assert_eq!(count(&new, "Conv"), 1);
            assert_eq!(new.value_name(new.outputs()[0].value), "y");
        }
    }

    #[test]
    fn batchnorm_after_a_shared_conv_becomes_mul_add() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[1, 2, 5, 5]));
        let w = cst(&mut g, "w", &[3, 2, 3, 3], 0.0);
        let c = g
            .add("conv", Op::Conv(conv_attrs(1)), vec![Some(x), Some(w)], "c")
            .unwrap();
        let y = bn(&mut g, c, 3, "y");
        g.add_output("y", y);
        g.add_output("c", c);
        let (new, counts) = frozen(&g);
        assert_eq!((counts.bn_folded, counts.bn_affine), (0, 1));
        assert_eq!(
            (count(&new, "Mul"), count(&new, "Add"), count(&new, "Conv")),
            (1, 1, 1)
        );
    }

    #[test]
    fn batchnorm_folds_into_grouped_conv_transpose() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[1, 4, 3, 3]));
        // C = 4 input channels, 2 groups, M/group = 3: 6 output channels.
        let w = cst(&mut g, "w", &[4, 3, 3, 3], 0.0);
        let attrs = ConvTransposeAttrs {
            conv: conv_attrs(2),
            ..ConvTransposeAttrs::default()
        };
        let c = g
            .add("convt", Op::ConvTranspose(attrs), vec![Some(x), Some(w)], "c")
            .unwrap();
        let y = bn(&mut g, c, 6, "y");
        g.add_output("y", y);
        let (new, counts) = frozen(&g);
        assert_eq!(counts.bn_folded, 1, "{new}");
    }

    #[test]
    fn batchnorm_folds_into_gemm_and_matmul() {
        for (op, trans_b, bias) in [
            ("gemm", false, true),
            ("gemm", true, false),
            ("gemm", true, true),
            ("matmul", false, false),
        ] {
            let mut g = Graph::new("t");
            let x = g.add_input("x", TensorType::fixed(DType::F32, &[2, 4]));
            let wshape = if trans_b { [5, 4] } else { [4, 5] };
            let w = cst(&mut g, "w", &wshape, 0.0);
            let y = if op == "gemm" {
                let mut ins = vec![Some(x), Some(w)];
                if bias {
                    ins.push(Some(cst(&mut g, "c", &[5], 7.0)));
                }
                let gemm = Op::Gemm {
                    alpha: 0.5,
                    beta: 2.0,
                    trans_a: false,
                    trans_b,
                };
                g.add("gemm", gemm, ins, "g").unwrap()
            } else {
                g.add("mm", Op::MatMul, vec![Some(x), Some(w)], "g").unwrap()
            };
            let y = bn(&mut g, y, 5, "y");
            g.add_output("y", y);
            let (new, counts) = frozen(&g);
            assert_eq!(counts.bn_folded, 1, "{op} {trans_b} {bias}: {new}");
            assert_eq!(count(&new, "BatchNormalization") + count(&new, "Mul"), 0, "{new}");
        }
    }

    #[test]
    fn batchnorm_and_mul_fold_into_matmul_with_bias_add() {
        for (rank3, use_bn) in [(false, true), (true, false)] {
            let mut g = Graph::new("t");
            let shape: &[usize] = if rank3 { &[2, 3, 4] } else { &[3, 4] };
            let x = g.add_input("x", TensorType::fixed(DType::F32, shape));
            let w = cst(&mut g, "w", &[4, 5], 0.0);
            let m = g.add("mm", Op::MatMul, vec![Some(x), Some(w)], "m").unwrap();
            let c = cst(&mut g, "c", &[5], 3.0);
            let a = g
                .add("bias", Op::Binary(Binary::Add), vec![Some(c), Some(m)], "a")
                .unwrap();
            let y = if use_bn {
                bn(&mut g, a, 5, "y")
            } else {
                let k = cst(&mut g, "k", &[1, 1, 5], 1.0);
                g.add("mul", Op::Binary(Binary::Mul), vec![Some(a), Some(k)], "y")
                    .unwrap()
            };
            g.add_output("y", y);
            let (new, counts) = frozen(&g);
            assert_eq!(counts.bn_folded + counts.affine_folded, 1, "{new}");
            assert_eq!(
                (count(&new, "MatMul"), count(&new, "Add"), new.len()),
                (1, 1, 5),
                "{new}"
            );
        }
    }

    #[test]
    fn per_channel_mul_and_add_fold_into_conv() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[1, 2, 5, 5]));
        let w = cst(&mut g, "w", &[3, 2, 3, 3], 0.0);
        let c = g
            .add("conv", Op::Conv(conv_attrs(1)), vec![Some(x), Some(w)], "c")
            .unwrap();
        let k = cst(&mut g, "k", &[3, 1, 1], 1.0);
        let m = g
            .add("mul", Op::Binary(Binary::Mul), vec![Some(k), Some(c)], "m")
            .unwrap();
        let s = cst(&mut g, "s", &[1, 3, 1, 1], 2.0);
        let y = g
            .add("sub", Op::Binary(Binary::Sub), vec![Some(m), Some(s)], "y")
            .unwrap();
        g.add_output("y", y);
        let (new, counts) = frozen(&g);
        assert_eq!(counts.affine_folded, 2, "{new}");
        assert_eq!(new.len(), 4, "{new}");
    }

    #[test]
    fn constant_subgraphs_and_known_shapes_fold() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[2, 3, 4]));
        // A weight stored transposed, then cast twice.
        let w = cst(&mut g, "w", &[4, 4], 0.0);
        let wt = g
            .add("wt", Op::Transpose { perm: vec![1, 0] }, vec![Some(w)], "wt")
            .unwrap();
        let w64 = g
            .add("c1", Op::Cast { to: DType::F64 }, vec![Some(wt)], "w64")
            .unwrap();
        let w32 = g
            .add("c2", Op::Cast { to: DType::F32 }, vec![Some(w64)], "w32")
            .unwrap();
        let y = g.add("mm", Op::MatMul, vec![Some(x), Some(w32)], "y").unwrap();
        // Shape arithmetic: reshape y to [shape[0], -1].
        let sh = g
            .add("shape", Op::Shape { start: 0, end: None }, vec![Some(y)], "sh")
            .unwrap();
        let i0 = g.add_const("i0", Tensor::from_vec(vec![1], vec![0i64]));
        let d0 = g
            .add("gather", Op::Gather { axis: 0 }, vec![Some(sh), Some(i0)], "d0")
            .unwrap();
        let m1 = g.add_const("m1", Tensor::from_vec(vec![1], vec![-1i64]));
        let cat = g
            .add("cat", Op::Concat { axis: 0 }, vec![Some(d0), Some(m1)], "cat")
            .unwrap();
        let r = g
            .add(
                "reshape",
                Op::Reshape { allow_zero: false },
                vec![Some(y), Some(cat)],
                "r",
            )
            .unwrap();
        g.add_output("r", r);
        let (new, counts) = frozen(&g);
        assert_eq!((counts.folded, counts.known), (5, 1), "{new}");
        for op in ["Transpose", "Cast", "Shape", "Gather", "Concat"] {
            assert_eq!(count(&new, op), 0, "{op} left: {new}");
        }
        assert_eq!((count(&new, "MatMul"), count(&new, "Reshape")), (1, 1));
    }

    #[test]
    fn huge_constant_of_shape_stays_a_computation() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[1]));
        let shape = g.add_const("shape", Tensor::from_vec(vec![2], vec![4096i64, 2048]));
        let op = Op::ConstantOfShape {
            value: Tensor::from_vec(vec![1], vec![1.0f32]),
        };
        let big = g.add("fill", op, vec![Some(shape)], "big").unwrap();
        let y = g
            .add("add", Op::Binary(Binary::Add), vec![Some(big), Some(x)], "y")
            .unwrap();
        g.add_output("y", y);
        let (new, counts) = freeze(&g).unwrap();
        assert_eq!((counts.folded, counts.not_folded_large), (0, 1));
        assert_eq!(count(&new, "ConstantOfShape"), 1);
    }

    #[test]
    fn identities_vanish_and_outputs_keep_their_names() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[3]));
        let r = g.add("relu", Op::Unary(Unary::Relu), vec![Some(x)], "r").unwrap();
        let i1 = g.add("id1", Op::Identity, vec![Some(r)], "i1").unwrap();
        let y = g.add("id2", Op::Identity, vec![Some(i1)], "y").unwrap();
        g.add_output("y", y);
        // An input passed straight through keeps the input's name (it is the API).
        let z = g.add("id3", Op::Identity, vec![Some(x)], "z").unwrap();
        g.add_output("z", z);
        let (new, counts) = frozen(&g);
        assert_eq!(counts.identities, 3);
        assert_eq!(count(&new, "Identity"), 0);
        let names: Vec<&str> = new.outputs().iter().map(|o| new.value_name(o.value)).collect();
        assert_eq!(names, ["y", "x"]);
        assert_eq!(new.outputs()[1].name, "z");
    }

    #[test]
    fn common_subexpressions_and_duplicate_constants_merge_and_dead_nodes_go() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[3]));
        let a = g.add_const("a", Tensor::from_vec(vec![3], vec![1.0f32, 2.0, 3.0]));
        let b = g.add_const("b", Tensor::from_vec(vec![3], vec![1.0f32, 2.0, 3.0]));
        let p = g
            .add("p", Op::Binary(Binary::Mul), vec![Some(x), Some(a)], "p")
            .unwrap();
        let q = g
            .add("q", Op::Binary(Binary::Mul), vec![Some(x), Some(b)], "q")
            .unwrap();
        let _dead = g
            .add("dead", Op::Unary(Unary::Exp), vec![Some(x)], "dead")
            .unwrap();
        let y = g
            .add("y", Op::Binary(Binary::Add), vec![Some(p), Some(q)], "y")
            .unwrap();
        g.add_output("y", y);
        let (new, counts) = frozen(&g);
        assert_eq!((counts.const_dedup, counts.cse), (1, 1), "{new}");
        assert_eq!(count(&new, "Mul"), 1);
        assert_eq!(count(&new, "Exp"), 0);
        assert_eq!(new.len(), 4, "{new}");
    }

    #[test]
    fn a_graph_with_nothing_to_freeze_is_unchanged() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[1, 2, 5, 5]));
        let w = cst(&mut g, "w", &[3, 2, 3, 3], 0.0);
        let c = g
            .add("conv", Op::Conv(conv_attrs(1)), vec![Some(x), Some(w)], "c")
            .unwrap();
        let r = g.add("relu", Op::Unary(Unary::Relu), vec![Some(c)], "r").unwrap();
        g.add_output("r", r);
        let before = g.to_string();
        let report = Freeze.run_with_report(&mut g).unwrap();
        assert_eq!(report.rewrites, 0);
        assert_eq!(report.summary, "unchanged");
        assert_eq!(g.to_string(), before);
    }

    #[test]
    fn transposes_of_extent_one_dims_become_reshapes() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[1, 5, 3]));
        // [1, 5, 3] -> [5, 1, 3]: the same elements in the same order.
        let a = g
            .add("a", Op::Transpose { perm: vec![1, 0, 2] }, vec![Some(x)], "a")
            .unwrap();
        // [5, 1, 3] -> [3, 1, 5]: moves data.
        let b = g
            .add("b", Op::Transpose { perm: vec![2, 1, 0] }, vec![Some(a)], "b")
            .unwrap();
        g.add_output("b", b);
        let (new, counts) = frozen(&g);
        assert_eq!(counts.transposes_as_reshapes, 1, "{new}");
        assert_eq!(
            (count(&new, "Reshape"), count(&new, "Transpose")),
            (1, 1),
            "{new}"
        );
    }

    #[test]
    fn gathers_of_consecutive_indices_become_slices() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[2, 6, 3]));
        for (name, idx, axis) in [
            ("run", vec![1i64, 2, 3], 1),
            ("negative", vec![-3, -2, -1], -2),
            ("gap", vec![0, 2], 1),
            ("descending", vec![2, 1], 1),
        ] {
            let i = g.add_const(format!("{name}_i"), Tensor::from_vec(vec![idx.len()], idx));
            let y = g
                .add(name, Op::Gather { axis }, vec![Some(x), Some(i)], name)
                .unwrap();
            g.add_output(name, y);
        }
        let (new, counts) = frozen(&g);
        assert_eq!(counts.gathers_as_slices, 2, "{new}");
        assert_eq!((count(&new, "Slice"), count(&new, "Gather")), (2, 2), "{new}");
        let inputs = input_values(&g);
        assert_eq!(
            kiln_ir::eval::eval_graph(&new, inputs.clone()).unwrap(),
            kiln_ir::eval::eval_graph(&g, inputs).unwrap()
        );
    }

    #[test]
    fn gemm_of_constant_weights_becomes_matmul_and_bias() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[2, 4]));
        let w = cst(&mut g, "w", &[3, 4], 0.5);
        let c = cst(&mut g, "c", &[3], 1.5);
        let gemm = |trans_b, alpha| Op::Gemm {
            alpha,
            beta: 1.0,
            trans_a: false,
            trans_b,
        };
        let y = g
            .add("g", gemm(true, 1.0), vec![Some(x), Some(w), Some(c)], "y")
            .unwrap();
        // Without C, and with B as stored.
        let w2 = cst(&mut g, "w2", &[3, 2], 2.5);
        let z = g
            .add("g2", gemm(false, 1.0), vec![Some(y), Some(w2)], "z")
            .unwrap();
        // alpha 2 stays a Gemm (folding it into the weights would round differently).
        let w3 = cst(&mut g, "w3", &[2, 2], 3.5);
        let u = g
            .add("g3", gemm(false, 2.0), vec![Some(z), Some(w3)], "u")
            .unwrap();
        g.add_output("u", u);
        let (new, counts) = frozen(&g);
        assert_eq!(counts.gemms_as_matmuls, 2, "{new}");
        assert_eq!(
            (count(&new, "MatMul"), count(&new, "Gemm"), count(&new, "Add")),
            (2, 1, 1),
            "{new}"
        );
    }
}
