//! `dequantize-weights`: a BlockQuantizedMatMul becomes the float product it stands for,
//!
//! ```text
//! BlockQuantizedMatMul(A, Q, scales, zp) = MatMul(A, Transpose(DequantizeLinear(Q, scales, zp)))
//! ```
//!
//! with the DequantizeLinear blocked along K (axis 1 of `Q [N, K]`), for targets whose product
//! kernels do not read block-quantized weights (`PipelineOptions::dequantize_weights`: the
//! GPU's). `freeze` then folds the constant weights to f32, as it does for any
//! DequantizeLinear of constants, and the products run on the float kernels. CPU targets keep
//! the operator: their GEMM stores the weights as nibbles and dequantizes them as it packs.

use crate::Pass;
use kiln_ir::rewrite::{rebuild, Rewrite};
use kiln_ir::{Graph, IrError, Op, QuantOp};

pub struct DequantizeWeights;

/// The pass's name (`--disable-pass`, `--print-after`).
pub const NAME: &str = "dequantize-weights";

impl Pass for DequantizeWeights {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, graph: &mut Graph) -> Result<usize, IrError> {
        let mut rewrites = 0;
        let rebuilt = rebuild(graph, |dst, _, node, inputs| {
            let Op::Quant(QuantOp::BlockQuantizedMatMul { block_size, .. }) = node.op else {
                return Ok(Rewrite::Keep);
            };
            rewrites += 1;
            let name = node.name.as_str();
            let dequantize = Op::Quant(QuantOp::DequantizeLinear {
                axis: 1,
                block_size,
                output_dtype: None,
            });
            let w = dst.add(
                format!("{name}_weights"),
                dequantize,
                inputs[1..4].to_vec(),
                format!("{name}_weights"),
            )?;
            let wt = dst.add(
                format!("{name}_weights_t"),
                Op::Transpose { perm: vec![1, 0] },
                vec![Some(w)],
                format!("{name}_weights_t"),
            )?;
            let y = dst.add(
                name,
                Op::MatMul,
                vec![inputs[0], Some(wt)],
                node.outputs[0].name.clone(),
            )?;
            Ok(Rewrite::Replace(vec![y]))
        })?;
        if rewrites > 0 {
            *graph = rebuilt;
        }
        Ok(rewrites)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{eval::eval_graph, DType, Dim, Tensor, TensorType};

    /// A BlockQuantizedMatMul of K = 5 in blocks of 2 (the last one cut) and its float form
    /// compute the same values.
    #[test]
    fn the_float_product_computes_the_same_values() {
        let (m, n, k, block) = (3usize, 4usize, 5usize, 2usize);
        let blocks = k.div_ceil(block);
        let mut g = Graph::new("g");
        let a = g.add_input(
            "a",
            TensorType::new(DType::F32, vec![Dim::Fixed(m), Dim::Fixed(k)]),
        );
        let q: Vec<u8> = (0..n * k).map(|i| (i * 7 % 16) as u8).collect();
        let s: Vec<f32> = (0..n * blocks).map(|i| 0.25 + i as f32 * 0.125).collect();
        let z: Vec<u8> = (0..n * blocks).map(|i| (i * 5 % 16) as u8).collect();
        let q = g.add_const("q", Tensor::from_vec(vec![n, k], q));
        let s = g.add_const("s", Tensor::from_vec(vec![n, blocks], s));
        let z = g.add_const("z", Tensor::from_vec(vec![n, blocks], z));
        let op = Op::Quant(QuantOp::BlockQuantizedMatMul {
            bits: 4,
            block_size: block,
        });
        let y = g
            .add("p", op, vec![Some(a), Some(q), Some(s), Some(z)], "y")
            .unwrap();
        g.add_output("y", y);
        let x = Tensor::from_vec(
            vec![m, k],
            (0..m * k).map(|i| i as f32 - 6.5).collect::<Vec<f32>>(),
        );
        let want = eval_graph(&g, vec![x.clone()]).unwrap();
        let mut h = g.clone();
        assert_eq!(DequantizeWeights.run(&mut h).unwrap(), 1);
        assert!(h.nodes().iter().any(|n| n.op == Op::MatMul));
        assert!(!h
            .nodes()
            .iter()
            .any(|n| matches!(n.op, Op::Quant(QuantOp::BlockQuantizedMatMul { .. }))));
        assert_eq!(eval_graph(&h, vec![x]).unwrap(), want);
    }
}
