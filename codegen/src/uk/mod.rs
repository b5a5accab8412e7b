//! Operators compiled from the C micro-kernels in `codegen/ukernels/`.
//!
//! Each family file maps an operator to a `kiln_uk_<symbol>` function and packs its attributes
//! into integer and floating arrays in the order the C side documents. Codegen passes the input
//! and output tensors (static shapes as constant descriptors) and links the kernels' bitcode
//! into the model, where LLVM inlines and specialises them.

pub mod codes;
mod elementwise;
mod misc;
mod movement;
mod nn;
mod reduce;

use crate::error::Result;
use crate::node::NodeInfo;
use crate::target::{Isa, TargetDesc};

/// A call to `kiln_uk_<symbol>(const kiln_uk_args *)`.
#[derive(Clone, Debug, PartialEq)]
pub struct UkCall {
    /// The function name without the `kiln_uk_` prefix.
    pub symbol: &'static str,
    pub iattr: Vec<i64>,
    pub fattr: Vec<f64>,
    /// Bytes of scratch the call needs for the duration of the kernel (0 for none).
    pub scratch_bytes: u64,
    /// Bytes of scratch private to each worker thread (`kiln_rt_thread_scratch`), 0 for none.
    pub thread_scratch_bytes: u64,
}

impl UkCall {
    /// Whether the call computes bf16 dot products in hardware (the attention kernel's bf16
    /// tiles, `nn::bf16_attention`).
    pub fn bf16_dot_products(&self) -> bool {
        self.symbol == "attention_f32" && self.iattr.get(16) == Some(&2)
    }

    /// The kernel's name in reports: the library function, and its tiles where it has several.
    pub fn describe(&self) -> String {
        match self.bf16_dot_products() {
            true => format!("kiln_uk_{} (bf16 tiles, vdpbf16ps)", self.symbol),
            false => format!("kiln_uk_{}", self.symbol),
        }
    }

    pub fn new(symbol: &'static str) -> UkCall {
        UkCall {
            symbol,
            iattr: vec![],
            fattr: vec![],
            scratch_bytes: 0,
            thread_scratch_bytes: 0,
        }
    }

    pub fn iattr(mut self, v: impl IntoIterator<Item = i64>) -> UkCall {
        self.iattr.extend(v);
        self
    }

    pub fn fattr(mut self, v: impl IntoIterator<Item = f64>) -> UkCall {
        self.fattr.extend(v);
        self
    }

    pub fn scratch(mut self, bytes: u64) -> UkCall {
        self.scratch_bytes = bytes;
        self
    }

    pub fn thread_scratch(mut self, bytes: u64) -> UkCall {
        self.thread_scratch_bytes = bytes;
        self
    }
}

/// The micro-kernel call for `node`, or None when no family handles its operator.
pub fn lower(node: &NodeInfo) -> Result<Option<UkCall>> {
    for family in [
        elementwise::lower,
        reduce::lower,
        movement::lower,
        nn::lower,
        misc::lower,
    ] {
        if let Some(call) = family(node)? {
            return Ok(Some(call));
        }
    }
    Ok(None)
}

/// `call` for `node` adjusted to a CPU target where its kernel has variants for vector widths
/// or for bf16 dot products.
pub fn for_cpu_target(mut call: UkCall, node: &NodeInfo, target: &TargetDesc) -> UkCall {
    if call.symbol == "attention_f32" {
        // Q, K and V as the bf16 autocast leaves them: both products on vdpbf16ps.
        if target.has_bf16_pair_kernels() && (0..3).all(|i| node.input_is_bf16_valued(i)) {
            nn::bf16_attention(&mut call);
        } else if target.isa == Isa::Avx512 {
            nn::widen_attention(&mut call);
        }
    }
    call
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{AttentionAttrs, DType, Graph, Op, TensorType};

    /// The attention kernel's tiles follow the target and the operands: the bf16 tiles for Q, K
    /// and V holding bf16 values on an avx512_bf16 CPU, the wide f32 tiles for f32 values or
    /// without avx512_bf16, the 16-column tiles without AVX-512.
    #[test]
    fn attention_tiles_follow_the_target_and_the_operands() {
        let (t, d, rows) = (40usize, 25usize, 40usize);
        let attrs = AttentionAttrs::default();
        let triple = Some("x86_64-unknown-linux-gnu");
        let bf16_cpu = TargetDesc::select(triple, Some("sapphirerapids")).unwrap();
        let avx512 = TargetDesc::select(triple, Some("skylake-avx512")).unwrap();
        let avx2 = TargetDesc::select(triple, Some("znver3")).unwrap();
        for rounded in [false, true] {
            let mut g = Graph::new("t");
            let mut ins = vec![];
            for i in 0..3 {
                let x = g.add_input(format!("x{i}"), TensorType::fixed(DType::F32, &[1, 2, t, d]));
                let v = match rounded {
                    true => {
                        let b = g.add(
                            format!("n{i}"),
                            Op::Cast { to: DType::BF16 },
                            vec![Some(x)],
                            format!("b{i}"),
                        );
                        let b = b.unwrap();
                        g.add(
                            format!("w{i}"),
                            Op::Cast { to: DType::F32 },
                            vec![Some(b)],
                            format!("f{i}"),
                        )
                        .unwrap()
                    }
                    false => x,
                };
                ins.push(Some(v));
            }
            let y = g.add("att", Op::Attention(attrs.clone()), ins, "y").unwrap();
            g.add_output("y", y);
            let info = NodeInfo::new(&g, y.node);
            let call = lower(&info).unwrap().expect("the f32 attention kernel");
            assert_eq!(call.symbol, "attention_f32");
            let on = |target: &TargetDesc| for_cpu_target(call.clone(), &info, target);
            let c = on(&bf16_cpu);
            if rounded {
                // 32-column tiles; the 64-byte tag naming the packed head, then Kᵀ pairs,
                // scores, V pairs, probability pairs, Q pairs.
                let (tp, dk2) = (64, d.div_ceil(2));
                assert_eq!((c.iattr[15], c.iattr[16]), (tp as i64, 2));
                let words = dk2 * tp + rows * tp + tp / 2 * d + rows * tp / 2 + rows * dk2;
                assert_eq!(c.thread_scratch_bytes, (64 + words * 4) as u64);
                assert!(c.bf16_dot_products() && c.describe().contains("bf16 tiles"));
            } else {
                assert_eq!((c.iattr[15], c.iattr[16]), (64, 1));
                assert!(!c.bf16_dot_products());
            }
            assert_eq!(on(&avx512).iattr[16], 1);
            assert_eq!(on(&avx2).iattr[16], 0);
        }
    }
}
