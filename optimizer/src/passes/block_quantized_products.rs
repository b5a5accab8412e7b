//! `block-quantized-products`: a MatMul by weights that a blocked DequantizeLinear makes from
//! constant 4-bit integers (what weight-only quantizers write in the QDQ format: INT4 or UINT4
//! weights `[K, N]`, a scale per block of K and column) becomes a BlockQuantizedMatMul,
//!
//! ```text
//! MatMul(A, DequantizeLinear(wq [K, N], scale [K/b, N], zp?; axis 0, block_size b))
//!     = BlockQuantizedMatMul(A, (wq + o)ᵀ, scaleᵀ, (zp + o)ᵀ)
//! ```
//!
//! with `o = 8` for signed weights (their values and zero points moved to `0..16`, which
//! leaves `wq - zp` alone) and 0 for unsigned ones; an absent zero point is 0. The values are
//! those DequantizeLinear computes, so the product is the same one; the CPU GEMM then keeps
//! the weights 4-bit where `freeze` would have folded them to f32.
//!
//! Why a pass and not the importer: the weights reach the IR as one integer per byte (the
//! frontend unpacks INT4/UINT4), and only their values say that they fit in 4 bits. It runs
//! before `freeze` on targets that read block-quantized weights (not `dequantize-weights`'s),
//! and takes f32 activations, constant weights, scales and zero points whose values fit.

use crate::Pass;
use kiln_ir::rewrite::{rebuild, remove_dead, Rewrite};
use kiln_ir::{DType, Graph, IrError, Node, Op, QuantOp, Tensor};

pub struct BlockQuantizedProducts;

/// The pass's name (`--disable-pass`, `--print-after`).
pub const NAME: &str = "block-quantized-products";

impl Pass for BlockQuantizedProducts {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        let mut rewrites = 0;
        let rebuilt = rebuild(graph, |dst, _, node, inputs| {
            let Some(w) = nibble_weights(graph, node) else {
                return Ok(Rewrite::Keep);
            };
            rewrites += 1;
            let name = node.name.as_str();
            let q = dst.add_const(format!("{name}_q4"), w.q);
            let s = dst.add_const(format!("{name}_q4_scales"), w.scales);
            let z = dst.add_const(format!("{name}_q4_zero_points"), w.zero_points);
            let op = Op::Quant(QuantOp::BlockQuantizedMatMul {
                bits: 4,
                block_size: w.block,
            });
            let y = dst.add(
                name,
                op,
                vec![inputs[0], Some(q), Some(s), Some(z)],
                node.outputs[0].name.clone(),
            )?;
            Ok(Rewrite::Replace(vec![y]))
        })?;
        if rewrites > 0 {
            *graph = remove_dead(&rebuilt)?;
        }
        Ok(rewrites)
    }
}

/// BlockQuantizedMatMul's operands for a MatMul node: `Q [N, K]`, scales and zero points
/// `[N, blocks]`.
struct NibbleWeights {
    q: Tensor,
    scales: Tensor,
    zero_points: Tensor,
    block: usize,
}

/// The weights of `node` when it is a MatMul of an f32 A by a blocked DequantizeLinear of
/// constant 4-bit values (see the module docs).
fn nibble_weights(graph: &Graph, node: &Node) -> Option<NibbleWeights> {
    if node.op != Op::MatMul || node.outputs.len() != 1 {
        return None;
    }
    let a = node.inputs.first().copied().flatten()?;
    let w = node.inputs.get(1).copied().flatten()?;
    let a_ty = graph.value_type(a);
    if a_ty.dtype != DType::F32 || a_ty.rank() < 1 {
        return None;
    }
    let dq = graph.node(w.node);
    let Op::Quant(QuantOp::DequantizeLinear {
        axis,
        block_size: block,
        output_dtype,
    }) = dq.op
    else {
        return None;
    };
    if block == 0 || !matches!(axis, 0 | -2) || output_dtype.is_some_and(|d| d != DType::F32) {
        return None;
    }
    let known = |i: usize| {
        dq.inputs
            .get(i)
            .copied()
            .flatten()
            .and_then(|v| graph.known_value(v))
    };
    let wq = known(0)?;
    let scales = known(1)?;
    let zp = match dq.inputs.get(2).copied().flatten() {
        Some(_) => Some(known(2)?),
        None => None,
    };
    let [k, n] = *wq.shape() else {
        return None;
    };
    let blocks = k.div_ceil(block);
    if scales.dtype() != DType::F32 || scales.shape() != [blocks, n] {
        return None;
    }
    if zp.is_some_and(|z| z.dtype() != wq.dtype() || z.shape() != [blocks, n]) {
        return None;
    }
    // The values moved to 0..16; None when one does not fit in 4 bits.
    let nibbles = |t: &Tensor| -> Option<Vec<u8>> {
        match t.dtype() {
            DType::U8 => {
                let v = t.as_slice::<u8>()?;
                v.iter().all(|&x| x < 16).then(|| v.to_vec())
            }
            DType::I8 => {
                let v = t.as_slice::<i8>()?;
                v.iter()
                    .all(|&x| (-8..8).contains(&x))
                    .then(|| v.iter().map(|&x| (x + 8) as u8).collect())
            }
            _ => None,
        }
    };
    let q = nibbles(wq)?;
    let middle = if wq.dtype() == DType::I8 { 8 } else { 0 };
    let zero_points = match zp {
        Some(z) => nibbles(z)?,
        None => vec![middle; blocks * n],
    };
    let scales = scales.as_slice::<f32>()?;
    let transposed = |v: &[u8], rows: usize| -> Vec<u8> {
        (0..n)
            .flat_map(|j| (0..rows).map(move |r| v[r * n + j]))
            .collect()
    };
    let scales_t: Vec<f32> = (0..n)
        .flat_map(|j| (0..blocks).map(move |b| scales[b * n + j]))
        .collect();
    Some(NibbleWeights {
        q: Tensor::from_vec(vec![n, k], transposed(&q, k)),
        scales: Tensor::from_vec(vec![n, blocks], scales_t),
        zero_points: Tensor::from_vec(vec![n, blocks], transposed(&zero_points, blocks)),
        block,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{eval::eval_graph, Dim, TensorType};

    /// `x [3, K] · DequantizeLinear(w [K, 5])` with K = 7 in blocks of 3 (the last one cut),
    /// signed or unsigned weights, with or without a zero point.
    fn graph(signed: bool, zero_point: bool, wide: bool) -> Graph {
        let (m, k, n, block) = (3usize, 7usize, 5usize, 3usize);
        let blocks = k.div_ceil(block);
        let mut g = Graph::new("g");
        let x = g.add_input(
            "x",
            TensorType::new(DType::F32, vec![Dim::Fixed(m), Dim::Fixed(k)]),
        );
        let (w, z) = if signed {
            let mut w: Vec<i8> = (0..k * n).map(|i| (i * 5 % 16) as i8 - 8).collect();
            if wide {
                w[4] = 8;
            }
            let z: Vec<i8> = (0..blocks * n).map(|i| (i * 3 % 16) as i8 - 8).collect();
            (
                g.add_const("w", Tensor::from_vec(vec![k, n], w)),
                g.add_const("z", Tensor::from_vec(vec![blocks, n], z)),
            )
        } else {
            let w: Vec<u8> = (0..k * n).map(|i| (i * 5 % 16) as u8).collect();
            let z: Vec<u8> = (0..blocks * n).map(|i| (i * 3 % 16) as u8).collect();
            (
                g.add_const("w", Tensor::from_vec(vec![k, n], w)),
                g.add_const("z", Tensor::from_vec(vec![blocks, n], z)),
            )
        };
        let s: Vec<f32> = (0..blocks * n).map(|i| 0.125 * (i + 1) as f32).collect();
        let s = g.add_const("s", Tensor::from_vec(vec![blocks, n], s));
        let dq = Op::Quant(QuantOp::DequantizeLinear {
            axis: 0,
            block_size: block,
            output_dtype: None,
        });
        let zp = zero_point.then_some(z);
        let wf = g.add("dq", dq, vec![Some(w), Some(s), zp], "wf").unwrap();
        let y = g.add("mm", Op::MatMul, vec![Some(x), Some(wf)], "y").unwrap();
        g.add_output("y", y);
        g
    }

    fn input() -> Vec<Tensor> {
        vec![Tensor::from_vec(
            vec![3, 7],
            (0..21).map(|i| i as f32 * 0.5 - 4.0).collect::<Vec<f32>>(),
        )]
    }

    #[test]
    fn four_bit_weights_become_a_block_quantized_product_of_the_same_values() {
        for (signed, zero_point) in [(true, true), (true, false), (false, true), (false, false)] {
            let g = graph(signed, zero_point, false);
            let want = eval_graph(&g, input()).unwrap();
            let mut h = g.clone();
            assert_eq!(
                BlockQuantizedProducts.run(&mut h).unwrap(),
                1,
                "signed {signed} zp {zero_point}"
            );
            let ops: Vec<&Op> = h.nodes().iter().map(|n| &n.op).collect();
            assert!(
                ops.iter()
                    .any(|op| matches!(op, Op::Quant(QuantOp::BlockQuantizedMatMul { .. })))
                    && !ops
                        .iter()
                        .any(|op| matches!(op, Op::MatMul | Op::Quant(QuantOp::DequantizeLinear { .. }))),
                "{ops:?}"
            );
            assert_eq!(
                eval_graph(&h, input()).unwrap(),
                want,
                "signed {signed} zp {zero_point}"
            );
        }
    }

    #[test]
    fn weights_past_four_bits_stay_a_float_product() {
        let mut g = graph(true, true, true);
        assert_eq!(BlockQuantizedProducts.run(&mut g).unwrap(), 0);
    }
}
