//! RotaryEmbedding on the GPU (ONNX opset 23 and `com.microsoft`'s, as language models apply
//! it to Q and K): a thread per output element, over the kernel library's geometry
//! (`uk::lower`: layout, resolved rotary dimension, heads).
//!
//! Element `i` of a head's first `rotary_dim` values pairs with its partner (`i ^ 1`
//! interleaved, `i ± rotary_dim/2` otherwise); with the cache row's `cos` and `sin` at the
//! pair's index the first of the pair becomes `cos·x1 − sin·x2`, the second `sin·x1 + cos·x2`,
//! in f64 and rounded once to f32 as the library computes them (products of f32 values are
//! exact in f64, so whether a compiler fuses them into an FMA does not change the result).
//! Values past `rotary_dim` are copied. Position ids outside the cache report
//! `KILN_CUDA_EINDEX` through the frame's error slot, as the library kernel fails.

use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims, EINDEX};
use crate::target::TargetDesc;
use inkwell::values::{FloatValue, IntValue};
use inkwell::IntPredicate;
use kiln_ir::{DType, Layout, MiscOp, Op};

const THREADS: u64 = 256;

#[derive(Debug)]
struct Rotary {
    interleaved: bool,
    rotary_dim: usize,
    /// X is `[B, S, H·D]` (else `[B, H, S, D]`).
    three_d: bool,
    batch: usize,
    seq: usize,
    heads: usize,
    head_size: usize,
    /// Rows of the caches when position ids pick them.
    positions: Option<usize>,
}

/// The kernel for an f32 RotaryEmbedding, or None.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    let Op::Misc(MiscOp::RotaryEmbedding { interleaved, .. }) = node.op() else {
        return Ok(None);
    };
    let f32_row_major = |t: Option<&kiln_ir::TensorType>| {
        t.is_some_and(|t| t.dtype == DType::F32 && t.layout == Layout::RowMajor && t.is_static())
    };
    let ok = (0..3).all(|i| f32_row_major(node.input_type(i)))
        && f32_row_major(Some(node.output_type(0)))
        && node.n_outputs() == 1;
    if !ok {
        return Ok(None);
    }
    let positions = match node.has_input(3) {
        true => {
            let ids = node.input_type(3);
            if !ids.is_some_and(|t| t.dtype == DType::I64 && t.layout == Layout::RowMajor && t.is_static()) {
                return Ok(None);
            }
            Some(node.input_shape(1)?[0])
        }
        false => None,
    };
    let Some(call) = crate::uk::lower(node)? else {
        return Ok(None);
    };
    // [interleaved, rotary_dim, three_d, batch, seq, heads, head_size]
    let at = &call.iattr;
    let k = Rotary {
        interleaved: *interleaved,
        rotary_dim: at[1] as usize,
        three_d: at[2] != 0,
        batch: at[3] as usize,
        seq: at[4] as usize,
        heads: at[5] as usize,
        head_size: at[6] as usize,
        positions,
    };
    if k.total() == 0 || k.total() >= 1 << 40 {
        return Ok(None);
    }
    Ok(Some(Box::new(k)))
}

impl Rotary {
    fn total(&self) -> u64 {
        (self.batch * self.seq * self.heads * self.head_size) as u64
    }
}

impl KernelCommon for Rotary {
    fn describe(&self) -> String {
        format!(
            "gpu rotary_embedding{} dim={} of {} heads={} seq={}",
            if self.interleaved { " interleaved" } else { "" },
            self.rotary_dim,
            self.head_size,
            self.heads,
            self.seq
        )
    }
}

impl GpuKernel for Rotary {
    fn launch(&self) -> LaunchDims {
        LaunchDims::per_item(self.total(), THREADS)
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let (x, cos, sin, y) = (k.input(0)?, k.input(1)?, k.input(2)?, k.output(0)?);
        let (d, rd) = (self.head_size, self.rotary_dim);
        k.grid_stride_loop(self.total(), THREADS, |i| {
            // (batch, position) of the element and its index in the head.
            let dims = match self.three_d {
                true => [self.batch, self.seq, self.heads, d],
                false => [self.batch, self.heads, self.seq, d],
            };
            let c = e.unravel(i, &dims)?;
            let (b, s, dd) = match self.three_d {
                true => (c[0], c[1], c[3]),
                false => (c[0], c[2], c[3]),
            };
            let rotated = e.icmp(IntPredicate::ULT, dd, e.i64c(rd as i64))?;
            e.if_else(
                rotated,
                || {
                    let token = e.add(e.mulc(b, self.seq as i64)?, s)?;
                    let row = match self.positions {
                        Some(_) => e.load_i64(k.input(3)?, token)?,
                        None => token,
                    };
                    let rows = self.positions.unwrap_or(self.batch * self.seq);
                    // An id below 0 is a large unsigned one.
                    let inside = e.icmp(IntPredicate::ULT, row, e.i64c(rows as i64))?;
                    e.if_else(
                        inside,
                        || self.rotate(k, &e, i, dd, row, (x, cos, sin, y)),
                        || k.report_error(EINDEX),
                    )
                },
                || e.store(e.gep_f32(y, i)?, e.load_f32(e.gep_f32(x, i)?)?),
            )
        })?;
        k.ret()
    }
}

type Tensors<'ctx> = (
    inkwell::values::PointerValue<'ctx>,
    inkwell::values::PointerValue<'ctx>,
    inkwell::values::PointerValue<'ctx>,
    inkwell::values::PointerValue<'ctx>,
);

impl Rotary {
    /// Element `i` (index `dd` in its head, inside the rotary dimension) with cache row `row`.
    fn rotate<'ctx>(
        &self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        i: IntValue<'ctx>,
        dd: IntValue<'ctx>,
        row: IntValue<'ctx>,
        (x, cos, sin, y): Tensors<'ctx>,
    ) -> Result<()> {
        let half = (self.rotary_dim / 2) as i64;
        let b = e.b;
        // The pair's index j, whether this element is its first, and the partner's offset.
        let (j, first, partner) = if self.interleaved {
            let j = e.udivc(dd, 2)?;
            let first = e.icmp(IntPredicate::EQ, e.uremc(dd, 2)?, e.i64c(0))?;
            let partner = b.build_xor(i, e.i64c(1), "").map_err(llvm)?;
            (j, first, partner)
        } else {
            let first = e.icmp(IntPredicate::ULT, dd, e.i64c(half))?;
            let j = e.select_int(first, dd, e.addc(dd, -half)?)?;
            let partner = e.select_int(first, e.addc(i, half)?, e.addc(i, -half)?)?;
            (j, first, partner)
        };
        let f64t = k.cx.f64_type();
        let wide = |v: FloatValue<'ctx>| b.build_float_ext(v, f64t, "").map_err(llvm);
        let own = wide(e.load_f32(e.gep_f32(x, i)?)?)?;
        let other = wide(e.load_f32(e.gep_f32(x, partner)?)?)?;
        let at = e.add(e.mulc(row, half)?, j)?;
        let c = wide(e.load_f32(e.gep_f32(cos, at)?)?)?;
        let s = wide(e.load_f32(e.gep_f32(sin, at)?)?)?;
        let pick = |m, p: FloatValue<'ctx>, q: FloatValue<'ctx>| -> Result<FloatValue<'ctx>> {
            Ok(b.build_select(m, p, q, "").map_err(llvm)?.into_float_value())
        };
        let (x1, x2) = (pick(first, own, other)?, pick(first, other, own)?);
        let mul = |p, q| b.build_float_mul(p, q, "").map_err(llvm);
        let y1 = b.build_float_sub(mul(c, x1)?, mul(s, x2)?, "").map_err(llvm)?;
        let y2 = b.build_float_add(mul(s, x1)?, mul(c, x2)?, "").map_err(llvm)?;
        let v = pick(first, y1, y2)?;
        let v = b.build_float_trunc(v, k.cx.f32_type(), "").map_err(llvm)?;
        e.store(e.gep_f32(y, i)?, v)
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check, run_graph};
    use crate::test_rng::TestRng;
    use kiln_ir::{DType, Graph, MiscOp, Op, Tensor, TensorType};

    /// RotaryEmbedding of a random X of shape `x` with caches of `rows` rows (position ids
    /// `ids` when given, else caches per (batch, position)), checked in emulation.
    fn rotary(
        x: &[usize],
        interleaved: bool,
        rotary_dim: usize,
        heads: usize,
        ids: Option<Vec<i64>>,
    ) -> (Graph, Vec<Tensor>) {
        let mut rng = TestRng::new(x.iter().product::<usize>() as u64);
        let mut g = Graph::new("t");
        let xv = g.add_input("x", TensorType::fixed(DType::F32, x));
        let d = if x.len() == 4 { x[3] } else { x[2] / heads };
        let half = if rotary_dim == 0 { d / 2 } else { rotary_dim / 2 };
        let (b, s) = (x[0], if x.len() == 4 { x[2] } else { x[1] });
        let cache_shape = match &ids {
            Some(_) => vec![2 * s + 3, half],
            None => vec![b, s, half],
        };
        let n: usize = cache_shape.iter().product();
        let cos = g.add_const("cos", Tensor::from_vec(cache_shape.clone(), rng.vec(n)));
        let sin = g.add_const("sin", Tensor::from_vec(cache_shape, rng.vec(n)));
        let mut inputs = vec![Tensor::from_vec(x.to_vec(), rng.vec(x.iter().product()))];
        let mut args = vec![Some(xv), Some(cos), Some(sin)];
        if let Some(ids) = ids {
            args.push(Some(g.add_input("ids", TensorType::fixed(DType::I64, &[b, s]))));
            inputs.push(Tensor::from_vec(vec![b, s], ids));
        }
        let op = Op::Misc(MiscOp::RotaryEmbedding {
            interleaved,
            rotary_dim,
            num_heads: heads,
        });
        let y = g.add("r", op, args, "y").unwrap();
        g.add_output("y", y);
        (g, inputs)
    }

    #[test]
    fn rotary_embedding_layouts_and_positions() {
        // [B, H, S, D] halves with per-token caches; [B, S, H·D] interleaved, partial rotary
        // dimension, position ids into a longer cache.
        let (g, inputs) = rotary(&[2, 3, 5, 8], false, 0, 0, None);
        let d = check_graph(&g, &inputs);
        assert!(
            d.iter().any(|d| d.starts_with("gpu rotary_embedding dim=8")),
            "{d:?}"
        );
        for sm in [80, 90] {
            ptxas_check(&g, sm);
        }
        let ids = vec![0, 4, 2, 10, 7, 1, 9, 3];
        let (g, inputs) = rotary(&[2, 4, 3 * 12], true, 6, 3, Some(ids.clone()));
        let d = check_graph(&g, &inputs);
        assert!(
            d.iter()
                .any(|d| d.starts_with("gpu rotary_embedding interleaved dim=6 of 12")),
            "{d:?}"
        );
        let (g, inputs) = rotary(&[1, 2, 4, 10], false, 4, 0, Some(vec![5, 0, 10, 2]));
        check_graph(&g, &inputs);
        // A position id outside the cache is an index error, as the library reports it.
        let (g, mut inputs) = rotary(&[2, 4, 3 * 12], true, 6, 3, Some(ids));
        inputs[1] = Tensor::from_vec(vec![2, 4], vec![0i64, 4, 2, 10, 7, 1, 11, 3]);
        let err = run_graph(&g, &inputs).unwrap_err();
        assert!(err.contains("failed with code 1"), "{err}");
    }
}
