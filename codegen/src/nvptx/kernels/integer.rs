//! Integer products on the GPU, a thread per output element: MatMulInteger and ConvInteger
//! (i32 results, the products of onnxruntime's dynamic quantization), QLinearMatMul and
//! QLinearConv (requantized u8/i8 results, its QOperator format).
//!
//! Each thread sums `(a - a_zero_point)·(b - b_zero_point)` over K in i32, wrapping as the
//! reference's int32 result does (the sum is exact, so its order does not matter), then, for
//! the QLinear operators, requantizes as the kernel library does: `acc·mult + y_zero_point` in
//! f64, rounded half to even and saturated, with `mult = f32(f32(a_scale·b_scale) / y_scale)`
//! (B's scale per tensor, per output column or per channel). The geometry is the
//! kernel library's (`uk::lower`: batch offsets, convolution windows and pads), so both read
//! the same elements; a padded tap contributes nothing, as padding reads the zero point.
//!
//! A MatMul thread reads its A row (the same address across a warp) and walks B down a column
//! (consecutive addresses across the warp); a convolution thread, like `window_conv`, loops
//! over its group's input channels with the kernel taps unrolled.
//!
//! Zero points and scales are read at run time (dynamic quantization computes A's; constants
//! are read from the weights): zero points per tensor, per row of A, per column of B or per
//! output channel of W; f32, f16 or bf16 scales (the multiplier rounded to their dtype, as the
//! library's `requant_mult`), B's per tensor or per column/channel, A's and Y's per tensor.
//! Anything else (per-row scales, mixed scale dtypes) stays with the library kernel.

use super::scalar::{load_real, round_to};
use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::{KernelCommon, PackedConst};
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims};
use crate::target::TargetDesc;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;
use kiln_ir::{DType, Layout, Op, QuantOp};

const THREADS: u64 = 256;
/// Kernel taps unrolled per channel (a 5×5×5 window); larger windows stay with the library.
const MAX_TAPS: usize = 125;

/// An 8-bit operand: the input it is and whether its values are signed.
#[derive(Clone, Copy, Debug)]
struct Operand {
    input: usize,
    signed: bool,
}

/// How a zero point is indexed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ZeroIndex {
    /// One value.
    Tensor,
    /// One per row of A, column of B or output channel of W: the thread's own index.
    Own,
}

/// A zero point read at run time: its input, its dtype's signedness, how it is indexed.
#[derive(Clone, Copy, Debug)]
struct ZeroPoint {
    operand: Operand,
    index: ZeroIndex,
}

/// The QLinear operators' requantization, its parameters read at run time: the scales of A
/// (input 1) and Y (input 6), one each, B's (input 4), one or one per output column or
/// channel, all of one float dtype, and Y's zero point (input 7), one or none.
#[derive(Clone, Copy, Debug)]
struct Requant {
    /// The scales' dtype (f32, f16 or bf16), to which the multiplier is rounded.
    scale_dtype: DType,
    b_scale_per_index: bool,
    y_zero: Option<Operand>,
    lo: f64,
    hi: f64,
}

#[derive(Clone, Debug)]
enum Shape {
    /// `batches` products `[M, K]·[K, N]`; with several, the packed i64 table `offsets`
    /// holds each one's A and B element offsets.
    MatMul {
        m: usize,
        k: usize,
        n: usize,
        batches: usize,
        offsets: Option<usize>,
    },
    /// NC(spatial) convolution: `batch` images, `c` input and `m` output channels.
    Conv {
        batch: usize,
        c: usize,
        m: usize,
        groups: usize,
        input: Vec<usize>,
        output: Vec<usize>,
        kernel: Vec<usize>,
        stride: Vec<usize>,
        dilation: Vec<usize>,
        pad: Vec<i64>,
    },
}

#[derive(Debug)]
struct IntegerProduct {
    shape: Shape,
    a: Operand,
    b: Operand,
    a_zero: Option<ZeroPoint>,
    b_zero: Option<ZeroPoint>,
    /// QLinearConv's i32 bias (one per output channel), read at run time.
    bias: Option<usize>,
    requant: Option<Requant>,
    packed: Vec<PackedConst>,
}

/// The kernel for an integer product node, or None when it is not one this kernel takes (see
/// the module docs).
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    let (qlinear, conv) = match node.op() {
        Op::Quant(QuantOp::MatMulInteger) => (false, None),
        Op::Quant(QuantOp::QLinearMatMul) => (true, None),
        Op::Quant(QuantOp::ConvInteger(a)) => (false, Some(a)),
        Op::Quant(QuantOp::QLinearConv(a)) => (true, Some(a)),
        _ => return Ok(None),
    };
    if conv.is_some_and(|a| a.channels_last) {
        return Ok(None);
    }
    // Inputs: A, B and their zero points; the QLinear operators interleave the scales.
    let (ib, iza, izb) = if qlinear { (3, 2, 5) } else { (1, 2, 3) };
    let out = node.output_type(0);
    let out_ok = match qlinear {
        true => matches!(out.dtype, DType::U8 | DType::I8),
        false => out.dtype == DType::I32,
    };
    if node.n_outputs() != 1 || !out_ok || out.layout != Layout::RowMajor || !out.is_static() {
        return Ok(None);
    }
    let Some(a) = operand(node, 0) else {
        return Ok(None);
    };
    let Some(b) = operand(node, ib) else {
        return Ok(None);
    };
    let Some(call) = crate::uk::lower(node)? else {
        return Ok(None);
    };
    let at = &call.iattr;
    let total = node.output_shape(0)?.iter().product::<usize>();
    if total == 0 || total >= 1 << 40 {
        return Ok(None);
    }
    let mut packed = vec![];
    let (shape, own_a, own_b) = if conv.is_some() {
        // [q, nsp, N, C, M, group, in, out, kernel, stride, dilation, pad_begin]
        let nsp = at[1] as usize;
        let axis = |i: usize| -> Vec<i64> { at[6 + i * nsp..6 + (i + 1) * nsp].to_vec() };
        let us = |v: Vec<i64>| v.iter().map(|&x| x as usize).collect::<Vec<_>>();
        let kernel = us(axis(2));
        let taps: usize = kernel.iter().product();
        let m = at[4] as usize;
        if taps == 0 || taps > MAX_TAPS {
            return Ok(None);
        }
        let shape = Shape::Conv {
            batch: at[2] as usize,
            c: at[3] as usize,
            m,
            groups: at[5] as usize,
            input: us(axis(0)),
            output: us(axis(1)),
            kernel,
            stride: us(axis(3)),
            dilation: us(axis(4)),
            pad: axis(5),
        };
        (shape, None, m)
    } else {
        // [q, M, K, N, batches, bcasts..., (A offset, B offset) per batch]
        let (m, k, n, batches) = (at[1] as usize, at[2] as usize, at[3] as usize, at[4] as usize);
        let offsets = (batches > 1).then(|| {
            let table = &at[at.len() - 2 * batches..];
            packed.push(PackedConst {
                bytes: table.iter().flat_map(|v| v.to_le_bytes()).collect(),
            });
            packed.len() - 1
        });
        let shape = Shape::MatMul {
            m,
            k,
            n,
            batches,
            offsets,
        };
        (shape, Some(m), n)
    };
    // The per-index shapes the reference broadcasts as this kernel indexes them: a row of A
    // ([M] or [M, 1]), a column of B ([N] or [1, N]), an output channel of W ([M]).
    let a_own: Vec<Vec<usize>> = own_a.map_or(vec![], |m| vec![vec![m], vec![m, 1]]);
    let b_own: Vec<Vec<usize>> = match conv {
        Some(_) => vec![vec![own_b]],
        None => vec![vec![own_b], vec![1, own_b]],
    };
    let Some(a_zero) = zero_point(node, iza, &a_own)? else {
        return Ok(None);
    };
    let Some(b_zero) = zero_point(node, izb, &b_own)? else {
        return Ok(None);
    };
    let (requant, bias) = if qlinear {
        let Some(r) = requant(node, &b_own, out.dtype)? else {
            return Ok(None);
        };
        let bias = (conv.is_some() && node.has_input(8)).then_some(8);
        if let Some(i) = bias {
            let ok = node
                .input_type(i)
                .is_some_and(|t| t.dtype == DType::I32 && t.is_static())
                && node.input_shape(i)?.iter().product::<usize>() == own_b;
            if !ok {
                return Ok(None);
            }
        }
        (Some(r), bias)
    } else {
        (None, None)
    };
    Ok(Some(Box::new(IntegerProduct {
        shape,
        a,
        b,
        a_zero,
        b_zero,
        bias,
        requant,
        packed,
    })))
}

/// Input `i` as an 8-bit row-major operand.
fn operand(node: &NodeInfo, i: usize) -> Option<Operand> {
    let t = node.input_type(i)?;
    let signed = match t.dtype {
        DType::U8 => false,
        DType::I8 => true,
        _ => return None,
    };
    (t.layout == Layout::RowMajor && t.is_static()).then_some(Operand { input: i, signed })
}

/// Zero point input `i`: Some(None) when absent, Some(Some(..)) when it is one value or has
/// one of the `own` shapes (one value per row, column or channel), None otherwise.
fn zero_point(node: &NodeInfo, i: usize, own: &[Vec<usize>]) -> Result<Option<Option<ZeroPoint>>> {
    if !node.has_input(i) {
        return Ok(Some(None));
    }
    let Some(operand) = operand(node, i) else {
        return Ok(None);
    };
    let shape = node.input_shape(i)?;
    let index = if shape.iter().product::<usize>() == 1 {
        ZeroIndex::Tensor
    } else if own.contains(&shape) {
        ZeroIndex::Own
    } else {
        return Ok(None);
    };
    Ok(Some(Some(ZeroPoint { operand, index })))
}

/// The requantization of a QLinear node (see [`Requant`]), or None for other parameters
/// (scales of different or f64 dtypes, per-row scales of A or Y).
fn requant(node: &NodeInfo, own: &[Vec<usize>], out: DType) -> Result<Option<Requant>> {
    let Some(scale_dtype) = node
        .input_type(1)
        .map(|t| t.dtype)
        .filter(|d| matches!(d, DType::F32 | DType::F16 | DType::BF16))
    else {
        return Ok(None);
    };
    let f32_of = |i: usize, shapes: &[Vec<usize>]| -> Result<Option<bool>> {
        let Some(t) = node.input_type(i) else {
            return Ok(None);
        };
        if t.dtype != scale_dtype || t.layout != Layout::RowMajor || !t.is_static() {
            return Ok(None);
        }
        let shape = node.input_shape(i)?;
        Ok(if shape.iter().product::<usize>() == 1 {
            Some(false)
        } else {
            shapes.contains(&shape).then_some(true)
        })
    };
    let (Some(false), Some(false)) = (f32_of(1, &[])?, f32_of(6, &[])?) else {
        return Ok(None);
    };
    let Some(b_scale_per_index) = f32_of(4, own)? else {
        return Ok(None);
    };
    let y_zero = match node.has_input(7) {
        false => None,
        true => match operand(node, 7) {
            Some(z) if node.input_shape(7)?.iter().product::<usize>() == 1 => Some(z),
            _ => return Ok(None),
        },
    };
    let Some((lo, hi)) = kiln_ir::ops::quant_range(out) else {
        return Ok(None);
    };
    Ok(Some(Requant {
        scale_dtype,
        b_scale_per_index,
        y_zero,
        lo,
        hi,
    }))
}

impl IntegerProduct {
    fn total(&self) -> u64 {
        match &self.shape {
            Shape::MatMul { m, n, batches, .. } => (batches * m * n) as u64,
            Shape::Conv { batch, m, output, .. } => (batch * m * output.iter().product::<usize>()) as u64,
        }
    }

    fn name(&self) -> &'static str {
        match (&self.shape, self.requant.is_some()) {
            (Shape::MatMul { .. }, false) => "matmul_integer",
            (Shape::MatMul { .. }, true) => "qlinear_matmul",
            (Shape::Conv { .. }, false) => "conv_integer",
            (Shape::Conv { .. }, true) => "qlinear_conv",
        }
    }
}

/// Element `idx` of 8-bit operand `op` as i32.
fn load_int8<'ctx>(
    e: &Emit<'_, 'ctx>,
    p: PointerValue<'ctx>,
    idx: IntValue<'ctx>,
    signed: bool,
) -> Result<IntValue<'ctx>> {
    let at = e.gep_u8(p, idx)?;
    if !signed {
        return e.load_u8_as_i32(at);
    }
    let byte =
        e.b.build_load(e.cx.i8_type(), at, "")
            .map_err(llvm)?
            .into_int_value();
    e.b.build_int_s_extend(byte, e.cx.i32_type(), "").map_err(llvm)
}

/// `x - zero_point[own or 0]` in i32.
fn minus_zero<'ctx>(
    k: &GpuBuilder<'_, 'ctx>,
    e: &Emit<'_, 'ctx>,
    x: IntValue<'ctx>,
    zero: Option<ZeroPoint>,
    own: IntValue<'ctx>,
) -> Result<IntValue<'ctx>> {
    let Some(z) = zero else {
        return Ok(x);
    };
    let idx = match z.index {
        ZeroIndex::Tensor => e.i64c(0),
        ZeroIndex::Own => own,
    };
    let zv = load_int8(e, k.input(z.operand.input)?, idx, z.operand.signed)?;
    e.b.build_int_sub(x, zv, "").map_err(llvm)
}

impl KernelCommon for IntegerProduct {
    fn describe(&self) -> String {
        match &self.shape {
            Shape::MatMul { m, k, n, batches, .. } => {
                format!("gpu {} M={m} N={n} K={k} batch={batches}", self.name())
            }
            Shape::Conv {
                c, m, groups, kernel, ..
            } => {
                let k: Vec<String> = kernel.iter().map(|x| x.to_string()).collect();
                format!("gpu {} {} C={c} M={m} groups={groups}", self.name(), k.join("x"))
            }
        }
    }

    fn packed_constants(&self) -> &[PackedConst] {
        &self.packed
    }

    fn release_packed_constants(&mut self) {
        PackedConst::release_all(&mut self.packed)
    }
}

impl GpuKernel for IntegerProduct {
    fn launch(&self) -> LaunchDims {
        LaunchDims::per_item(self.total(), THREADS)
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let i32t = k.cx.i32_type();
        let acc = e.entry_alloca(i32t, "acc")?;
        let (a, b, y) = (k.input(self.a.input)?, k.input(self.b.input)?, k.output(0)?);
        k.grid_stride_loop(self.total(), THREADS, |i| {
            // The index of the thread's B column or W channel (for per-index parameters).
            let own_b = match &self.shape {
                Shape::MatMul {
                    m, k: kk, n, offsets, ..
                } => {
                    let j = e.uremc(i, *n as i64)?;
                    let r = e.udivc(i, *n as i64)?;
                    let row = e.uremc(r, *m as i64)?;
                    let batch = e.udivc(r, *m as i64)?;
                    let (a_off, b_off) = match offsets {
                        Some(slot) => {
                            let table = k.packed(*slot)?;
                            let w = e.mulc(batch, 2)?;
                            (e.load_i64(table, w)?, e.load_i64(table, e.addc(w, 1)?)?)
                        }
                        None => (e.i64c(0), e.i64c(0)),
                    };
                    let a_row = e.add(a_off, e.mulc(row, *kk as i64)?)?;
                    let b_col = e.add(b_off, j)?;
                    e.store(acc, i32t.const_zero())?;
                    e.for_range(e.i64c(0), e.i64c(*kk as i64), 1, |t| {
                        let av = load_int8(&e, a, e.add(a_row, t)?, self.a.signed)?;
                        let av = minus_zero(k, &e, av, self.a_zero, row)?;
                        let bv = load_int8(&e, b, e.add(b_col, e.mulc(t, *n as i64)?)?, self.b.signed)?;
                        let bv = minus_zero(k, &e, bv, self.b_zero, j)?;
                        accumulate(&e, acc, av, bv)
                    })?;
                    j
                }
                Shape::Conv {
                    batch,
                    c,
                    m,
                    groups,
                    input,
                    output,
                    kernel,
                    stride,
                    dilation,
                    pad,
                } => {
                    let mut dims = vec![*batch, *m];
                    dims.extend(output);
                    let coord = e.unravel(i, &dims)?;
                    let (img, ch_out, o) = (coord[0], coord[1], &coord[2..]);
                    let (cg, mg) = (c / groups, m / groups);
                    let g = e.udivc(ch_out, mg as i64)?;
                    let in_plane: usize = input.iter().product();
                    let taps: usize = kernel.iter().product();
                    let zero = i32t.const_zero();
                    let init = match self.bias {
                        Some(bi) => {
                            let p = k.input(bi)?;
                            // SAFETY (of the IR): one bias per output channel.
                            let at =
                                unsafe { e.b.build_in_bounds_gep(i32t, p, &[ch_out], "") }.map_err(llvm)?;
                            e.b.build_load(i32t, at, "").map_err(llvm)?.into_int_value()
                        }
                        None => zero,
                    };
                    e.store(acc, init)?;
                    e.for_range(e.i64c(0), e.i64c(cg as i64), 1, |cc| {
                        let chan = e.add(e.mulc(g, cg as i64)?, cc)?;
                        let x_base = e.mulc(e.add(e.mulc(img, *c as i64)?, chan)?, in_plane as i64)?;
                        let w_base = e.mulc(e.add(e.mulc(ch_out, cg as i64)?, cc)?, taps as i64)?;
                        for tap in 0..taps {
                            let mut kk = vec![0usize; kernel.len()];
                            let mut r = tap;
                            for d in (0..kernel.len()).rev() {
                                kk[d] = r % kernel[d];
                                r /= kernel[d];
                            }
                            let mut valid = k.cx.bool_type().const_int(1, false);
                            let mut off = e.i64c(0);
                            for d in 0..kernel.len() {
                                // o·stride − pad + k·dilation (a negative one fails the bound).
                                let reach = (kk[d] * dilation[d]) as i64 - pad[d];
                                let pos = e.addc(e.mulc(o[d], stride[d] as i64)?, reach)?;
                                let inside = e.icmp(IntPredicate::ULT, pos, e.i64c(input[d] as i64))?;
                                valid = e.b.build_and(valid, inside, "").map_err(llvm)?;
                                off = e.add(e.mulc(off, input[d] as i64)?, pos)?;
                            }
                            e.if_then(valid, || {
                                let xv = load_int8(&e, a, e.add(x_base, off)?, self.a.signed)?;
                                let xv = minus_zero(k, &e, xv, self.a_zero, ch_out)?;
                                let wv = load_int8(&e, b, e.addc(w_base, tap as i64)?, self.b.signed)?;
                                let wv = minus_zero(k, &e, wv, self.b_zero, ch_out)?;
                                accumulate(&e, acc, xv, wv)
                            })?;
                        }
                        Ok(())
                    })?;
                    ch_out
                }
            };
            let sum = e.b.build_load(i32t, acc, "").map_err(llvm)?.into_int_value();
            match self.requant {
                None => {
                    // SAFETY (of the IR): `i` indexes the output.
                    let at = unsafe { e.b.build_in_bounds_gep(i32t, y, &[i], "") }.map_err(llvm)?;
                    e.store(at, sum)
                }
                Some(r) => {
                    let q = requantize(k, &e, sum, r, own_b)?;
                    let q = e.b.build_float_to_signed_int(q, i32t, "").map_err(llvm)?;
                    // Saturated to the output type's range, so its low byte is the value.
                    let byte = e.b.build_int_truncate(q, k.cx.i8_type(), "").map_err(llvm)?;
                    e.store(e.gep_u8(y, i)?, byte)
                }
            }
        })?;
        k.ret()
    }
}

/// `acc += x·w`, wrapping in i32.
fn accumulate<'ctx>(
    e: &Emit<'_, 'ctx>,
    acc: PointerValue<'ctx>,
    x: IntValue<'ctx>,
    w: IntValue<'ctx>,
) -> Result<()> {
    let i32t = e.cx.i32_type();
    let prod = e.b.build_int_mul(x, w, "").map_err(llvm)?;
    let old = e.b.build_load(i32t, acc, "").map_err(llvm)?.into_int_value();
    e.store(acc, e.b.build_int_add(old, prod, "").map_err(llvm)?)
}

/// `clamp(roundeven(f64(sum)·mult + zero), lo, hi)` as the kernel library's `saturate`.
fn requantize<'ctx>(
    k: &GpuBuilder<'_, 'ctx>,
    e: &Emit<'_, 'ctx>,
    sum: IntValue<'ctx>,
    r: Requant,
    own: IntValue<'ctx>,
) -> Result<FloatValue<'ctx>> {
    let f64t = k.cx.f64_type();
    let b = e.b;
    let sdt = r.scale_dtype;
    let scale = |input: usize, idx: IntValue<'ctx>| load_real(e, k.input(input)?, sdt, idx);
    let first = e.i64c(0);
    let (sa, sy) = (scale(1, first)?, scale(6, first)?);
    let sb = scale(4, if r.b_scale_per_index { own } else { first })?;
    // The kernel library's `requant_mult`: each step rounded to the scales' dtype.
    let ab = round_to(e, sdt, b.build_float_mul(sa, sb, "").map_err(llvm)?)?;
    let mult = round_to(e, sdt, b.build_float_div(ab, sy, "").map_err(llvm)?)?;
    let zero = match r.y_zero {
        Some(z) => {
            let zv = load_int8(e, k.input(z.input)?, first, z.signed)?;
            b.build_signed_int_to_float(zv, f64t, "").map_err(llvm)?
        }
        None => f64t.const_zero(),
    };
    let v = e.b.build_signed_int_to_float(sum, f64t, "").map_err(llvm)?;
    let v = e.b.build_float_mul(v, mult, "").map_err(llvm)?;
    let v = e.b.build_float_add(v, zero, "").map_err(llvm)?;
    let v = e
        .intrinsic("llvm.roundeven", &[f64t.into()], &[v.into()])?
        .into_float_value();
    e.clamp_float(v, f64t.const_float(r.lo), f64t.const_float(r.hi))
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check};
    use crate::test_rng::TestRng;
    use kiln_ir::{AutoPad, ConvAttrs, DType, Graph, Op, QuantOp, Tensor, TensorType, ValueId};

    /// Random 8-bit test data: u8 over 0..=255, i8 over -128..=127.
    fn bytes(rng: &mut TestRng, dtype: DType, shape: &[usize]) -> Tensor {
        let n = shape.iter().product();
        let v = rng.vec(n);
        match dtype {
            DType::U8 => Tensor::from_vec(
                shape.to_vec(),
                v.iter().map(|x| ((x + 1.0) * 127.99) as u8).collect(),
            ),
            _ => Tensor::from_vec(shape.to_vec(), v.iter().map(|x| (x * 127.99) as i8).collect()),
        }
    }

    /// A graph under construction with its run-time inputs' values.
    struct G {
        g: Graph,
        inputs: Vec<Tensor>,
        rng: TestRng,
    }

    impl G {
        fn new(seed: u64) -> G {
            G {
                g: Graph::new("t"),
                inputs: vec![],
                rng: TestRng::new(seed),
            }
        }
        /// A run-time input of random 8-bit values.
        fn input(&mut self, name: &str, dtype: DType, shape: &[usize]) -> ValueId {
            let t = bytes(&mut self.rng, dtype, shape);
            self.inputs.push(t);
            self.g.add_input(name, TensorType::fixed(dtype, shape))
        }
        /// A run-time input of the given values.
        fn input_values(&mut self, name: &str, t: Tensor) -> ValueId {
            let ty = TensorType::fixed(t.dtype(), t.shape());
            self.inputs.push(t);
            self.g.add_input(name, ty)
        }
        /// A constant of random 8-bit values.
        fn weights(&mut self, name: &str, dtype: DType, shape: &[usize]) -> ValueId {
            let t = bytes(&mut self.rng, dtype, shape);
            self.g.add_const(name, t)
        }
        fn konst(&mut self, name: &str, t: Tensor) -> ValueId {
            self.g.add_const(name, t)
        }
        /// Checks `op(inputs)` in emulation against the reference and that `kernel` ran it.
        fn check(mut self, op: Op, inputs: Vec<Option<ValueId>>, kernel: &str) -> Graph {
            let y = self.g.add("p", op, inputs, "y").unwrap();
            self.g.add_output("y", y);
            let describes = check_graph(&self.g, &self.inputs);
            assert!(describes.iter().any(|d| d.starts_with(kernel)), "{describes:?}");
            self.g
        }
    }

    fn conv(
        kernel: &[usize],
        strides: &[usize],
        pads: &[usize],
        dilations: &[usize],
        group: usize,
    ) -> ConvAttrs {
        ConvAttrs {
            kernel_shape: kernel.to_vec(),
            strides: strides.to_vec(),
            pads: pads.to_vec(),
            dilations: dilations.to_vec(),
            group,
            auto_pad: AutoPad::NotSet,
            channels_last: false,
        }
    }

    #[test]
    fn matmul_integer_with_zero_points_and_batches() {
        // Dynamic quantization's form: u8 A with a run-time scalar zero point, constant s8
        // weights, batch folded into A's leading axis.
        let mut g = G::new(1);
        let a = g.input("a", DType::U8, &[2, 5, 37]);
        let za = g.input("za", DType::U8, &[]);
        let b = g.weights("b", DType::I8, &[37, 19]);
        let graph = g.check(
            Op::Quant(QuantOp::MatMulInteger),
            vec![Some(a), Some(b), Some(za)],
            "gpu matmul_integer M=5 N=19 K=37 batch=2",
        );
        for sm in [80, 90] {
            ptxas_check(&graph, sm);
        }
        // Broadcast batches of two run-time operands, A's zero point per row and B's per
        // column, i8 A.
        let mut g = G::new(2);
        let a = g.input("a", DType::I8, &[2, 1, 4, 16]);
        let b = g.input("b", DType::U8, &[3, 16, 6]);
        let za = g.input("za", DType::I8, &[4]);
        let zb = g.input("zb", DType::U8, &[6]);
        g.check(
            Op::Quant(QuantOp::MatMulInteger),
            vec![Some(a), Some(b), Some(za), Some(zb)],
            "gpu matmul_integer M=4 N=6 K=16 batch=6",
        );
    }

    #[test]
    fn conv_integer_windows_groups_and_zero_points() {
        // Padded, strided 3×3 with a per-channel weight zero point.
        let mut g = G::new(3);
        let x = g.input("x", DType::U8, &[1, 3, 7, 6]);
        let w = g.weights("w", DType::I8, &[4, 3, 3, 3]);
        let zx = g.input("zx", DType::U8, &[]);
        let zw = g.weights("zw", DType::I8, &[4]);
        let graph = g.check(
            Op::Quant(QuantOp::ConvInteger(conv(
                &[3, 3],
                &[2, 2],
                &[1, 1, 1, 1],
                &[1, 1],
                1,
            ))),
            vec![Some(x), Some(w), Some(zx), Some(zw)],
            "gpu conv_integer 3x3 C=3 M=4",
        );
        for sm in [80, 90] {
            ptxas_check(&graph, sm);
        }
        // Grouped and dilated, two images, uneven pads; 1-D.
        let mut g = G::new(4);
        let x = g.input("x", DType::U8, &[2, 4, 6, 7]);
        let w = g.weights("w", DType::U8, &[6, 2, 2, 3]);
        g.check(
            Op::Quant(QuantOp::ConvInteger(conv(
                &[2, 3],
                &[1, 1],
                &[0, 2, 1, 0],
                &[2, 1],
                2,
            ))),
            vec![Some(x), Some(w)],
            "gpu conv_integer 2x3 C=4 M=6 groups=2",
        );
        let mut g = G::new(5);
        let x = g.input("x", DType::I8, &[1, 3, 11]);
        let w = g.weights("w", DType::I8, &[5, 3, 4]);
        let zx = g.input("zx", DType::I8, &[]);
        g.check(
            Op::Quant(QuantOp::ConvInteger(conv(&[4], &[3], &[1, 2], &[1], 1))),
            vec![Some(x), Some(w), Some(zx)],
            "gpu conv_integer 4 C=3 M=5",
        );
    }

    #[test]
    fn qlinear_products_requantize_as_the_library() {
        // QLinearConv as onnxruntime's QOperator format writes it: per-channel weight scales,
        // an i32 bias, u8 out; then i8 out with per-tensor scales and no bias.
        for (out, per_channel, bias) in [(DType::U8, true, true), (DType::I8, false, false)] {
            let mut g = G::new(6);
            let x = g.input("x", DType::U8, &[1, 5, 6, 6]);
            let sx = g.konst("sx", Tensor::scalar(0.02f32));
            let zx = g.konst("zx", Tensor::scalar(117u8));
            let w = g.weights("w", DType::I8, &[8, 5, 3, 3]);
            let sw = match per_channel {
                true => g.konst(
                    "sw",
                    Tensor::from_vec(vec![8], (0..8).map(|i| 0.003 + 0.0007 * i as f32).collect()),
                ),
                false => g.konst("sw", Tensor::scalar(0.0041f32)),
            };
            let zw = g.konst("zw", Tensor::scalar(0i8));
            let sy = g.konst("sy", Tensor::scalar(0.057f32));
            let zy = match out {
                DType::U8 => g.konst("zy", Tensor::scalar(101u8)),
                _ => g.konst("zy", Tensor::scalar(-7i8)),
            };
            let b = bias.then(|| {
                g.konst(
                    "b",
                    Tensor::from_vec(vec![8], (0..8).map(|i| i * 900 - 3000).collect::<Vec<i32>>()),
                )
            });
            let graph = g.check(
                Op::Quant(QuantOp::QLinearConv(conv(
                    &[3, 3],
                    &[1, 1],
                    &[1, 1, 1, 1],
                    &[1, 1],
                    1,
                ))),
                vec![
                    Some(x),
                    Some(sx),
                    Some(zx),
                    Some(w),
                    Some(sw),
                    Some(zw),
                    Some(sy),
                    Some(zy),
                    b,
                ],
                "gpu qlinear_conv 3x3 C=5 M=8",
            );
            if bias {
                for sm in [80, 90] {
                    ptxas_check(&graph, sm);
                }
            }
        }
        // QLinearMatMul with per-column B scales and zero points.
        let mut g = G::new(7);
        let a = g.input("a", DType::U8, &[3, 24]);
        let sa = g.konst("sa", Tensor::scalar(0.03f32));
        let za = g.konst("za", Tensor::scalar(128u8));
        let b = g.weights("b", DType::U8, &[24, 10]);
        let sb = g.konst(
            "sb",
            Tensor::from_vec(vec![10], (0..10).map(|i| 0.002 + 0.0005 * i as f32).collect()),
        );
        let zb = g.weights("zb", DType::U8, &[10]);
        let sy = g.konst("sy", Tensor::scalar(0.21f32));
        let zy = g.konst("zy", Tensor::scalar(120u8));
        g.check(
            Op::Quant(QuantOp::QLinearMatMul),
            vec![
                Some(a),
                Some(sa),
                Some(za),
                Some(b),
                Some(sb),
                Some(zb),
                Some(sy),
                Some(zy),
            ],
            "gpu qlinear_matmul M=3 N=10 K=24",
        );
        // Every parameter given at run time (as ONNX's node tests do), batched i8, i8 out.
        let mut g = G::new(8);
        let a = g.input("a", DType::I8, &[2, 3, 20]);
        let sa = g.input_values("sa", Tensor::scalar(0.011f32));
        let za = g.input_values("za", Tensor::scalar(-3i8));
        let b = g.input("b", DType::I8, &[2, 20, 7]);
        let sb = g.input_values("sb", Tensor::scalar(0.0093f32));
        let zb = g.input_values("zb", Tensor::scalar(5i8));
        let sy = g.input_values("sy", Tensor::scalar(0.034f32));
        let zy = g.input_values("zy", Tensor::scalar(-9i8));
        let params = [a, sa, za, b, sb, zb, sy, zy].map(Some).to_vec();
        g.check(
            Op::Quant(QuantOp::QLinearMatMul),
            params,
            "gpu qlinear_matmul M=3 N=7 K=20 batch=2",
        );
        // f16 scales (opset 21): the multiplier rounded to f16 at each step (which moves some of
        // the 256 outputs by one against f32 rounding), u8 out.
        let mut g = G::new(9);
        let a = g.input("a", DType::U8, &[16, 64]);
        let f16 = |v: f32| Tensor::scalar(half::f16::from_f32(v));
        let sa = g.input_values("sa", f16(0.0101));
        let za = g.input_values("za", Tensor::scalar(131u8));
        let b = g.input("b", DType::U8, &[64, 16]);
        let sb = g.input_values("sb", f16(0.00871));
        let zb = g.input_values("zb", Tensor::scalar(97u8));
        let sy = g.input_values("sy", f16(0.3));
        let zy = g.input_values("zy", Tensor::scalar(125u8));
        let params = [a, sa, za, b, sb, zb, sy, zy].map(Some).to_vec();
        g.check(
            Op::Quant(QuantOp::QLinearMatMul),
            params,
            "gpu qlinear_matmul M=16 N=16 K=64",
        );
    }
}
