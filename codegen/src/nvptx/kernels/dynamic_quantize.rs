//! DynamicQuantizeLinear on the GPU: the u8 quantization of an f32 tensor by its own range,
//! which onnxruntime's dynamic quantization puts before every integer product.
//!
//! One block of `BLOCK` threads: each folds the minimum and maximum of the elements it strides
//! over (starting from 0, which the range always includes; NaN propagates), the block meets in
//! `rows::block_reduce`, and every thread derives the scale and zero point from the result with
//! the reference's f32 arithmetic, then quantizes its elements: `roundeven(x / scale) + zp`,
//! saturated to 0..=255 (NaN gives 0). Thread 0 writes the scale and zero point outputs. Min
//! and max do not depend on the order of the elements, so the result is the reference's
//! exactly. The range must be known before any element is quantized; one block keeps that
//! inside the kernel (a barrier), at the cost of using one SM: a few microseconds for the
//! activations of a transformer layer.

use super::rows::{block_reduce, Fold};
use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims, Sreg};
use crate::target::TargetDesc;
use inkwell::values::FloatValue;
use inkwell::{FloatPredicate, IntPredicate};
use kiln_ir::{DType, Layout, Op, QuantOp};

/// Threads of the block (a power of two, as the tree reduction needs).
const BLOCK: usize = 256;

#[derive(Debug)]
struct DynamicQuantize {
    len: usize,
    /// How many of the outputs (y, y_scale, y_zero_point) the node has.
    outputs: usize,
}

/// The kernel for a DynamicQuantizeLinear of a row-major f32 tensor, or None.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    if !matches!(node.op(), Op::Quant(QuantOp::DynamicQuantizeLinear)) {
        return Ok(None);
    }
    let ok = node
        .input_type(0)
        .is_some_and(|t| t.dtype == DType::F32 && t.layout == Layout::RowMajor && t.is_static());
    let len = node.input_shape(0)?.iter().product::<usize>();
    // The reference refuses an empty tensor (it has no range); the library reports it.
    if !ok || len == 0 || len >= 1 << 40 {
        return Ok(None);
    }
    Ok(Some(Box::new(DynamicQuantize {
        len,
        outputs: node.n_outputs(),
    })))
}

impl KernelCommon for DynamicQuantize {
    fn describe(&self) -> String {
        format!("gpu dynamic_quantize [{}] block={BLOCK}", self.len)
    }
}

impl GpuKernel for DynamicQuantize {
    fn launch(&self) -> LaunchDims {
        LaunchDims {
            grid: [1, 1, 1],
            block: [BLOCK as u32, 1, 1],
            shared_bytes: (BLOCK * 4) as u32,
        }
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let f32t = k.cx.f32_type();
        let (x, y) = (k.input(0)?, k.output(0)?);
        let tx = k.sreg64(Sreg::TidX)?;
        let smem = k.shared()?;
        let len = e.i64c(self.len as i64);
        // Each thread's minimum and maximum of elements tx, tx + BLOCK, ...
        let lo = e.entry_alloca(f32t, "lo")?;
        let hi = e.entry_alloca(f32t, "hi")?;
        e.store(lo, e.f32c(0.0))?;
        e.store(hi, e.f32c(0.0))?;
        e.for_range(tx, len, BLOCK as i64, |i| {
            let v = e.load_f32(e.gep_f32(x, i)?)?;
            e.store(lo, Fold::Min.combine(&e, e.load_f32(lo)?, v)?)?;
            e.store(hi, Fold::Max.combine(&e, e.load_f32(hi)?, v)?)
        })?;
        let lo = block_reduce(k, &e, smem, tx, BLOCK, Fold::Min, e.load_f32(lo)?)?;
        let hi = block_reduce(k, &e, smem, tx, BLOCK, Fold::Max, e.load_f32(hi)?)?;
        let (scale, zero) = params(&e, lo, hi)?;
        e.for_range(tx, len, BLOCK as i64, |i| {
            let v = e.load_f32(e.gep_f32(x, i)?)?;
            let q = e.b.build_float_div(v, scale, "").map_err(llvm)?;
            let q = e
                .intrinsic("llvm.roundeven", &[f32t.into()], &[q.into()])?
                .into_float_value();
            let q = e.b.build_float_add(q, zero, "").map_err(llvm)?;
            let byte =
                e.b.build_float_to_unsigned_int(saturate(&e, q)?, k.cx.i8_type(), "")
                    .map_err(llvm)?;
            e.store(e.gep_u8(y, i)?, byte)
        })?;
        if self.outputs > 1 {
            let first = e.icmp(IntPredicate::EQ, tx, e.i64c(0))?;
            e.if_then(first, || {
                e.store(k.output(1)?, scale)?;
                if self.outputs > 2 {
                    let z =
                        e.b.build_float_to_unsigned_int(zero, k.cx.i8_type(), "")
                            .map_err(llvm)?;
                    e.store(k.output(2)?, z)?;
                }
                Ok(())
            })?;
        }
        k.ret()
    }
}

/// The scale and zero point of the range `[lo, hi]` (both include 0), in f32 as the reference.
fn params<'ctx>(
    e: &Emit<'_, 'ctx>,
    lo: FloatValue<'ctx>,
    hi: FloatValue<'ctx>,
) -> Result<(FloatValue<'ctx>, FloatValue<'ctx>)> {
    let b = e.b;
    let select = |c, x: FloatValue<'ctx>, y: FloatValue<'ctx>| -> Result<FloatValue<'ctx>> {
        Ok(b.build_select(c, x, y, "").map_err(llvm)?.into_float_value())
    };
    let same = b
        .build_float_compare(FloatPredicate::OEQ, hi, lo, "")
        .map_err(llvm)?;
    let range = select(same, e.f32c(1.0), b.build_float_sub(hi, lo, "").map_err(llvm)?)?;
    let scale = b.build_float_div(range, e.f32c(255.0), "").map_err(llvm)?;
    let initial = b
        .build_float_sub(e.f32c(0.0), b.build_float_div(lo, scale, "").map_err(llvm)?, "")
        .map_err(llvm)?;
    // Python's max(0, min(255, v)): a NaN yields 255.
    let nan = b
        .build_float_compare(FloatPredicate::UNO, initial, initial, "")
        .map_err(llvm)?;
    let clamped = clamp(e, initial)?;
    let zero = select(nan, e.f32c(255.0), clamped)?;
    let zero = e
        .intrinsic("llvm.roundeven", &[e.cx.f32_type().into()], &[zero.into()])?
        .into_float_value();
    Ok((scale, zero))
}

/// `v` clamped to `[0, 255]` by ordered compares (NaN passes).
fn clamp<'ctx>(e: &Emit<'_, 'ctx>, v: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
    e.clamp_float(v, e.f32c(0.0), e.f32c(255.0))
}

/// `v` saturated to `[0, 255]`, NaN to 0 (the quantized value's saturation).
fn saturate<'ctx>(e: &Emit<'_, 'ctx>, v: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
    let nan =
        e.b.build_float_compare(FloatPredicate::UNO, v, v, "")
            .map_err(llvm)?;
    let v = clamp(e, v)?;
    Ok(e.b
        .build_select(nan, e.f32c(0.0), v, "")
        .map_err(llvm)?
        .into_float_value())
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check};
    use crate::test_rng::TestRng;
    use kiln_ir::{DType, Graph, Op, QuantOp, Tensor, TensorType};

    /// DynamicQuantizeLinear of `values` (shape `shape`) with all three outputs, checked in
    /// emulation against the reference.
    fn check(shape: &[usize], values: Vec<f32>) -> Graph {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, shape));
        let op = Op::Quant(QuantOp::DynamicQuantizeLinear);
        let names = vec!["y".to_string(), "s".to_string(), "z".to_string()];
        let outs = g.add_node("q", op, vec![Some(x)], names).unwrap();
        for (o, name) in outs.iter().zip(["y", "s", "z"]) {
            g.add_output(name, *o);
        }
        let describes = check_graph(&g, &[Tensor::from_vec(shape.to_vec(), values)]);
        assert!(
            describes.iter().any(|d| d.starts_with("gpu dynamic_quantize")),
            "{describes:?}"
        );
        g
    }

    #[test]
    fn dynamic_quantize_linear_matches_the_reference() {
        let mut rng = TestRng::new(9);
        // More elements than threads (ends mid-stride), a range on both sides of 0.
        let g = check(&[3, 700], rng.vec_scaled(2100, 4.0));
        for sm in [80, 90] {
            ptxas_check(&g, sm);
        }
        // All positive (the range starts at 0, zero point 0), fewer elements than threads.
        check(&[37], rng.vec(37).iter().map(|v| v.abs() + 0.5).collect());
        // All negative (zero point 255), and values on rounding ties.
        check(&[64], (0..64).map(|i| -(i as f32) * 0.5).collect());
        // Constant zero (range 0 → scale 1/255), and a NaN (propagates to the parameters).
        check(&[300], vec![0.0; 300]);
        let mut v = rng.vec(500);
        v[311] = f32::NAN;
        check(&[500], v);
    }
}
