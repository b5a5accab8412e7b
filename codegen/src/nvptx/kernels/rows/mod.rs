//! Row kernels on the GPU: Softmax, LogSoftmax, LayerNormalization, RMSNormalization,
//! InstanceNormalization, GroupNormalization, Reduce*
//! and the global pools, as reductions over rows of a tensor viewed as `[outer, len, inner]`.
//!
//! A row is the `len` elements `(o·len + k)·inner + i` of one `(o, i)`; row `r = o·inner + i`,
//! which is also the flat index of a reduction's output element. A block is `T×R` threads:
//! `T` (a power of two, 32 to 256, after `len`) threads share a row, `R` rows per block so short
//! rows still fill 256 threads. Each thread strides through its row by `T` (consecutive threads
//! read consecutive addresses when `inner` is 1), folds into a register, and the row's partials
//! meet in a shared-memory tree reduction. Softmax and the normalizations take two or three
//! passes over the row (max, sum of exponentials / mean, variance) and write every element;
//! reductions write one value per row. Rows past the end still take part in every barrier.

// The polynomial constants are written digit for digit as in kiln_math.h.
#![allow(clippy::excessive_precision)]

use crate::error::Result;
use crate::gen::elementwise as ew;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims, Sreg};
use crate::target::TargetDesc;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::{FloatPredicate, IntPredicate};
use kiln_ir::{DType, Layout, MiscOp, Op, PoolKind, ReduceKind};

/// Threads of a block.
const BLOCK: usize = 256;

/// How a normalization's scale or bias is indexed by the element's position `k` in its row.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Param {
    /// One value per row position: `p[k]`.
    PerElement,
    /// One value for everything: `p[0]`.
    Scalar,
    /// One value per channel of an NCHW tensor whose rows are the consecutive groups of
    /// `per_row` channels of `spatial` elements each, `rows_per_sample` rows to a sample (group
    /// and instance normalization): `p[(r % rows_per_sample) · per_row + k / spatial]`.
    PerChannel {
        rows_per_sample: usize,
        per_row: usize,
        spatial: usize,
    },
}

/// A reduction a kernel folds a row with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Fold {
    Sum,
    Prod,
    Max,
    Min,
}

#[derive(Clone, Debug)]
enum RowOp {
    Softmax {
        log: bool,
    },
    /// 1 at the row's first maximum (its first NaN, if any), 0 elsewhere.
    Hardmax,
    /// `x / ‖row‖_p` (p 1 or 2); a zero row stays zero.
    LpNorm {
        p: u8,
    },
    LayerNorm {
        epsilon: f32,
        scale: Param,
        bias: Option<Param>,
        /// Mean and InvStdDev outputs present (0 to 2).
        stats: usize,
    },
    RmsNorm {
        epsilon: f32,
        scale: Param,
    },
    /// `(x - mean) / (std + 1e-9)`: MeanVarianceNormalization, over any axes.
    MeanVariance,
    Reduce(ReduceKind),
}

pub struct RowGpu {
    what: String,
    op: RowOp,
    /// The axes a row index runs over and those an element of a row runs over, each as
    /// (extent, element stride), outermost first, adjacent axes merged, size-1 axes dropped.
    kept: Vec<(usize, usize)>,
    red: Vec<(usize, usize)>,
    rows: usize,
    len: usize,
    /// Threads per row (power of two) and rows per block.
    t: usize,
    r: usize,
    /// The tensors' element type: f32, f16 or bf16 (read into f32, computed in f32, rounded
    /// once when stored), f64 (computed in f64: softmax and reductions only), bool (max and
    /// min on 0 and 1 in f32) or i32 (sum, max and min, exact in f64).
    elem: DType,
}

/// The axes of `shape` where `mask` is `want`, as (extent, stride), adjacent ones merged.
fn axes_of(shape: &[usize], mask: &[bool], want: bool) -> Vec<(usize, usize)> {
    let mut stride = 1;
    let mut out: Vec<(usize, usize)> = vec![];
    for d in (0..shape.len()).rev() {
        if mask[d] == want && shape[d] != 1 {
            match out.last_mut() {
                Some(last) if last.0 * last.1 == stride => last.0 *= shape[d],
                _ => out.push((shape[d], stride)),
            }
        }
        stride *= shape[d];
    }
    out.reverse();
    out
}

impl RowGpu {
    /// Rows of `[outer, len, inner]` along the middle axis.
    fn new(what: &str, op: RowOp, outer: usize, len: usize, inner: usize) -> Option<RowGpu> {
        RowGpu::over(what, op, &[outer, len, inner], &[false, true, false])
    }

    /// A row per position of the axes of `shape` outside `mask`, over the axes in it.
    fn over(what: &str, op: RowOp, shape: &[usize], mask: &[bool]) -> Option<RowGpu> {
        let total = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
        let kept = axes_of(shape, mask, false);
        let red = axes_of(shape, mask, true);
        let rows: usize = kept.iter().map(|a| a.0).product();
        let len: usize = red.iter().map(|a| a.0).product();
        if total == 0 || total >= 1 << 40 {
            return None;
        }
        // Rows whose elements are strided but whose neighbours are adjacent (a softmax or a
        // reduction over a middle axis): one thread per row, so that a warp reads 32 adjacent
        // rows' elements at once, when there are rows enough to fill blocks.
        let strided = red.last().is_some_and(|a| a.1 != 1);
        let columns = strided && kept.last().is_some_and(|a| a.1 == 1) && rows >= BLOCK;
        let t = if columns {
            1
        } else {
            len.next_power_of_two().clamp(32, BLOCK)
        };
        let r = (BLOCK / t).min(rows).max(1);
        if rows.div_ceil(r) >= 1 << 31 {
            return None;
        }
        let what = format!(
            "gpu {what} rows={rows} len={len}{}",
            match (columns, strided || red.len() > 1) {
                (true, _) => " thread-per-row",
                (false, true) => " strided",
                _ => "",
            }
        );
        Some(RowGpu {
            elem: DType::F32,
            what,
            op,
            kept,
            red,
            rows,
            len,
            t,
            r,
        })
    }

    fn rows(&self) -> usize {
        self.rows
    }

    /// Bytes of a value in the compute type (a shared-memory slot of the reductions).
    fn elem_bytes(&self) -> usize {
        match self.elem {
            DType::F64 | DType::I32 => 8,
            _ => 4,
        }
    }
}

/// Whether every input present and every output are static row-major tensors of `elem`.
fn all_of(node: &NodeInfo, inputs: &[usize], elem: DType) -> bool {
    let ok = |t: &kiln_ir::TensorType| t.dtype == elem && t.layout == Layout::RowMajor && t.is_static();
    inputs.iter().all(|&i| node.input_type(i).is_none_or(ok))
        && (0..node.n_outputs()).all(|i| ok(node.output_type(i)))
}

fn norm_axis(axis: i64, rank: usize) -> Option<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    (0..rank as i64).contains(&a).then_some(a as usize)
}

/// The generator: Softmax, LogSoftmax, LayerNormalization, RMSNormalization, Reduce* over
/// contiguous axes and the global average/max pools, all f32.
pub fn lower(node: &NodeInfo, target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    if !target.is_gpu() || node.extra.is_some() || node.n_outputs() == 0 {
        return Ok(None);
    }
    // f32, f16 or bf16 throughout (scale and bias included); f64 for softmax and reductions.
    let elem = node.output_type(0).dtype;
    let f64_ok = matches!(
        node.op(),
        Op::Softmax { .. } | Op::LogSoftmax { .. } | Op::Reduce { .. } | Op::GlobalPool(_)
    );
    // Bool ReduceMax/ReduceMin (any/all) on 0 and 1 in f32.
    let bool_ok = matches!(
        node.op(),
        Op::Reduce {
            kind: ReduceKind::Max | ReduceKind::Min,
            ..
        }
    );
    // i32 ReduceSum/Max/Min in f64: exact for rows shorter than 2^22 (sums below 2^53),
    // wrapped to 32 bits when stored, as the reference's int32 sum wraps.
    let i32_ok = match node.op() {
        Op::Reduce {
            kind: ReduceKind::Sum | ReduceKind::Max | ReduceKind::Min,
            ..
        } => node.input_shape(0)?.iter().all(|&d| d > 0 && d < 1 << 22),
        _ => false,
    };
    if !(matches!(elem, DType::F32 | DType::F16 | DType::BF16)
        || (elem == DType::F64 && f64_ok)
        || (elem == DType::Bool && bool_ok)
        || (elem == DType::I32 && i32_ok))
    {
        return Ok(None);
    }
    let all_f32 = |node: &NodeInfo, inputs: &[usize]| all_of(node, inputs, elem);
    let boxed = |k: Option<RowGpu>| -> Result<Option<Box<dyn GpuKernel>>> {
        Ok(k.map(|mut k| {
            if elem != DType::F32 {
                k.what.push_str(&format!(" {}", elem.name()));
            }
            k.elem = elem;
            Box::new(k) as Box<dyn GpuKernel>
        }))
    };
    match node.op() {
        Op::Softmax { axis, coerce_2d }
        | Op::LogSoftmax { axis, coerce_2d }
        | Op::Hardmax { axis, coerce_2d } => {
            let log = matches!(node.op(), Op::LogSoftmax { .. });
            if !all_f32(node, &[0]) || node.n_outputs() != 1 {
                return Ok(None);
            }
            let x = node.input_shape(0)?;
            let Some(a) = norm_axis(*axis, x.len()) else {
                return Ok(None);
            };
            let p = |s: &[usize]| s.iter().product::<usize>();
            let (outer, len, inner) = if *coerce_2d {
                (p(&x[..a]), p(&x[a..]), 1)
            } else {
                (p(&x[..a]), x[a], p(&x[a + 1..]))
            };
            if matches!(node.op(), Op::Hardmax { .. }) {
                // Element indices are compared as f32: exact below 2^24.
                if len >= 1 << 24 {
                    return Ok(None);
                }
                return boxed(RowGpu::new("hardmax", RowOp::Hardmax, outer, len, inner));
            }
            let name = if log { "logsoftmax" } else { "softmax" };
            boxed(RowGpu::new(name, RowOp::Softmax { log }, outer, len, inner))
        }
        Op::LpNorm { axis, p } => {
            if !all_f32(node, &[0]) || node.n_outputs() != 1 || !matches!(p, 1 | 2) {
                return Ok(None);
            }
            let x = node.input_shape(0)?;
            let Some(a) = norm_axis(*axis, x.len()) else {
                return Ok(None);
            };
            let p3 = |s: &[usize]| s.iter().product::<usize>();
            let op = RowOp::LpNorm { p: *p };
            boxed(RowGpu::new("lpnorm", op, p3(&x[..a]), x[a], p3(&x[a + 1..])))
        }
        Op::LayerNorm {
            axis,
            epsilon,
            stash_type,
        } => {
            if !all_f32(node, &[0, 1, 2]) || *stash_type != DType::F32 {
                return Ok(None);
            }
            let x = node.input_shape(0)?;
            let Some(a) = norm_axis(*axis, x.len()) else {
                return Ok(None);
            };
            let Some(scale) = param(node, 1, &x, a)? else {
                return Ok(None);
            };
            let bias = match node.has_input(2) {
                true => match param(node, 2, &x, a)? {
                    Some(b) => Some(b),
                    None => return Ok(None),
                },
                false => None,
            };
            let op = RowOp::LayerNorm {
                epsilon: *epsilon,
                scale,
                bias,
                stats: node.n_outputs() - 1,
            };
            let (outer, len) = (x[..a].iter().product(), x[a..].iter().product());
            boxed(RowGpu::new("layernorm", op, outer, len, 1))
        }
        // Rows of NCHW samples: each channel (InstanceNormalization) or group of channels
        // (GroupNormalization) is a contiguous row, normalized like a layer norm's, with a
        // scale and bias per channel (per group for opset 18's GroupNormalization).
        Op::InstanceNorm { epsilon } | Op::GroupNorm { epsilon, .. } => {
            if !all_f32(node, &[0, 1, 2]) || node.n_outputs() != 1 || !node.has_input(2) {
                return Ok(None);
            }
            let x = node.input_shape(0)?;
            if x.len() < 3 {
                return Ok(None);
            }
            let (n, c, spatial) = (x[0], x[1], x[2..].iter().product::<usize>());
            let (groups, per_channel) = match node.op() {
                Op::GroupNorm {
                    num_groups,
                    stash_type,
                    per_channel_affine,
                    ..
                } => {
                    if *stash_type != DType::F32 {
                        return Ok(None);
                    }
                    (*num_groups, *per_channel_affine)
                }
                _ => (c, true),
            };
            if groups == 0 || c % groups != 0 {
                return Ok(None);
            }
            let per_group = c / groups;
            let mode = if per_channel {
                Param::PerChannel {
                    rows_per_sample: groups,
                    per_row: per_group,
                    spatial: spatial.max(1),
                }
            } else {
                Param::PerChannel {
                    rows_per_sample: groups,
                    per_row: 1,
                    spatial: (per_group * spatial).max(1),
                }
            };
            let want = if per_channel { c } else { groups };
            for i in [1, 2] {
                if node.input_shape(i)?.iter().product::<usize>() != want {
                    return Ok(None);
                }
            }
            let op = RowOp::LayerNorm {
                epsilon: *epsilon,
                scale: mode,
                bias: Some(mode),
                stats: 0,
            };
            let name = if matches!(node.op(), Op::InstanceNorm { .. }) {
                "instancenorm"
            } else {
                "groupnorm"
            };
            boxed(RowGpu::new(name, op, n * groups, per_group * spatial, 1))
        }
        Op::Misc(MiscOp::RmsNorm { axis, epsilon, .. }) => {
            if !all_f32(node, &[0, 1]) || node.n_outputs() != 1 {
                return Ok(None);
            }
            let x = node.input_shape(0)?;
            let Some(a) = norm_axis(*axis, x.len()) else {
                return Ok(None);
            };
            let Some(scale) = param(node, 1, &x, a)? else {
                return Ok(None);
            };
            let op = RowOp::RmsNorm {
                epsilon: *epsilon,
                scale,
            };
            let (outer, len) = (x[..a].iter().product(), x[a..].iter().product());
            boxed(RowGpu::new("rmsnorm", op, outer, len, 1))
        }
        Op::MeanVarianceNorm { axes } => {
            if !all_f32(node, &[0]) || node.n_outputs() != 1 {
                return Ok(None);
            }
            let x = node.input_shape(0)?;
            let mut mask = vec![false; x.len()];
            for &a in axes {
                match norm_axis(a, x.len()) {
                    Some(a) if !mask[a] => mask[a] = true,
                    _ => return Ok(None),
                }
            }
            boxed(RowGpu::over("mvn", RowOp::MeanVariance, &x, &mask))
        }
        Op::Reduce {
            kind,
            noop_with_empty_axes,
            ..
        } => {
            if !all_f32(node, &[0]) || node.n_outputs() != 1 {
                return Ok(None);
            }
            let x = node.input_shape(0)?;
            let axes: Vec<i64> = match node.input(1) {
                None => vec![],
                Some(_) => match node.known(1).and_then(|t| t.as_slice::<i64>()) {
                    Some(a) => a.to_vec(),
                    None => return Ok(None),
                },
            };
            let mut mask = vec![axes.is_empty() && !noop_with_empty_axes; x.len()];
            for &a in &axes {
                match norm_axis(a, x.len()) {
                    Some(a) if !mask[a] => mask[a] = true,
                    _ => return Ok(None),
                }
            }
            // Empty axes with noop_with_empty_axes: the identity, left to the library kernel.
            if !mask.contains(&true) {
                return Ok(None);
            }
            if node.output_shape(0)?.iter().product::<usize>()
                != (0..x.len())
                    .filter(|&d| !mask[d])
                    .map(|d| x[d])
                    .product::<usize>()
            {
                return Ok(None);
            }
            let name = format!(
                "{} reduce",
                kind.op_name().trim_start_matches("Reduce").to_lowercase()
            );
            boxed(RowGpu::over(&name, RowOp::Reduce(*kind), &x, &mask))
        }
        Op::GlobalPool(kind) => {
            let kind = match kind {
                PoolKind::Average { .. } => ReduceKind::Mean,
                PoolKind::Max => ReduceKind::Max,
                PoolKind::Lp { .. } => return Ok(None),
            };
            if !all_f32(node, &[0]) || node.n_outputs() != 1 {
                return Ok(None);
            }
            let x = node.input_shape(0)?;
            if x.len() < 3 {
                return Ok(None);
            }
            let name = if kind == ReduceKind::Mean {
                "global avgpool"
            } else {
                "global maxpool"
            };
            boxed(RowGpu::new(
                name,
                RowOp::Reduce(kind),
                x[0] * x[1],
                x[2..].iter().product(),
                1,
            ))
        }
        _ => Ok(None),
    }
}

/// How the normalization parameter `i` (broadcast to X) is indexed, when it depends on the
/// row position only: equal to X's trailing axes from `axis` on (leading 1s aside), or a scalar.
fn param(node: &NodeInfo, i: usize, x: &[usize], axis: usize) -> Result<Option<Param>> {
    let p = node.input_shape(i)?;
    if p.iter().product::<usize>() == 1 {
        return Ok(Some(Param::Scalar));
    }
    if p.len() > x.len() {
        return Ok(None);
    }
    let pad = x.len() - p.len();
    let full: Vec<usize> = std::iter::repeat_n(1, pad).chain(p.iter().copied()).collect();
    let ok = full[..axis].iter().all(|&d| d == 1) && full[axis..] == x[axis..];
    Ok(ok.then_some(Param::PerElement))
}

// ---------------------------------------------------------------------------------------------
// Scalar float arithmetic in portable IR
// ---------------------------------------------------------------------------------------------

pub(super) fn fadd<'ctx>(
    e: &Emit<'_, 'ctx>,
    a: FloatValue<'ctx>,
    b: FloatValue<'ctx>,
) -> Result<FloatValue<'ctx>> {
    e.b.build_float_add(a, b, "").map_err(llvm)
}

pub(super) fn fsub<'ctx>(
    e: &Emit<'_, 'ctx>,
    a: FloatValue<'ctx>,
    b: FloatValue<'ctx>,
) -> Result<FloatValue<'ctx>> {
    e.b.build_float_sub(a, b, "").map_err(llvm)
}

pub(super) fn fmul<'ctx>(
    e: &Emit<'_, 'ctx>,
    a: FloatValue<'ctx>,
    b: FloatValue<'ctx>,
) -> Result<FloatValue<'ctx>> {
    e.b.build_float_mul(a, b, "").map_err(llvm)
}

pub(super) fn fdiv<'ctx>(
    e: &Emit<'_, 'ctx>,
    a: FloatValue<'ctx>,
    b: FloatValue<'ctx>,
) -> Result<FloatValue<'ctx>> {
    e.b.build_float_div(a, b, "").map_err(llvm)
}

fn fma<'ctx>(
    e: &Emit<'_, 'ctx>,
    a: FloatValue<'ctx>,
    b: FloatValue<'ctx>,
    c: FloatValue<'ctx>,
) -> Result<FloatValue<'ctx>> {
    let t = e.cx.f32_type().into();
    Ok(e.intrinsic("llvm.fma", &[t], &[a.into(), b.into(), c.into()])?
        .into_float_value())
}

fn unary<'ctx>(e: &Emit<'_, 'ctx>, name: &str, x: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
    let t = x.get_type().into();
    Ok(e.intrinsic(name, &[t], &[x.into()])?.into_float_value())
}

fn fcmp<'ctx>(
    e: &Emit<'_, 'ctx>,
    p: FloatPredicate,
    a: FloatValue<'ctx>,
    b: FloatValue<'ctx>,
) -> Result<IntValue<'ctx>> {
    e.b.build_float_compare(p, a, b, "").map_err(llvm)
}

fn select<'ctx>(
    e: &Emit<'_, 'ctx>,
    c: IntValue<'ctx>,
    a: FloatValue<'ctx>,
    b: FloatValue<'ctx>,
) -> Result<FloatValue<'ctx>> {
    Ok(e.b.build_select(c, a, b, "").map_err(llvm)?.into_float_value())
}

impl Fold {
    pub(super) fn init(self) -> f32 {
        match self {
            Fold::Sum => 0.0,
            Fold::Prod => 1.0,
            Fold::Max => f32::NEG_INFINITY,
            Fold::Min => f32::INFINITY,
        }
    }

    /// `a ⊕ b`; max and min propagate NaN (whichever side it is on), as the reference does.
    pub(super) fn combine<'ctx>(
        self,
        e: &Emit<'_, 'ctx>,
        a: FloatValue<'ctx>,
        b: FloatValue<'ctx>,
    ) -> Result<FloatValue<'ctx>> {
        let pick = |p: FloatPredicate| -> Result<FloatValue<'ctx>> {
            let nan = fcmp(e, FloatPredicate::UNO, b, b)?;
            let better = fcmp(e, p, b, a)?;
            let take = e.b.build_or(nan, better, "").map_err(llvm)?;
            select(e, take, b, a)
        };
        match self {
            Fold::Sum => fadd(e, a, b),
            Fold::Prod => fmul(e, a, b),
            Fold::Max => pick(FloatPredicate::OGT),
            Fold::Min => pick(FloatPredicate::OLT),
        }
    }
}

/// e^x: the polynomial of `kiln_expf` (gen::vmath), scalar; an f64 `x` through the math
/// library (libdevice on the device).
pub(super) fn exp<'ctx>(e: &Emit<'_, 'ctx>, x: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
    if x.get_type() == e.cx.f64_type() {
        return e.call_libm("exp", &[x]);
    }
    let b = e.b;
    let i32t = e.cx.i32_type();
    let c = |v: f32| e.f32c(v);
    let ci = |v: u32| i32t.const_int(u64::from(v), false);
    let hi = fcmp(e, FloatPredicate::OGT, x, c(89.0))?;
    let x = select(e, hi, c(89.0), x)?;
    let lo = fcmp(e, FloatPredicate::OLT, x, c(-104.0))?;
    let x = select(e, lo, c(-104.0), x)?;
    let shifter = c(12582912.0);
    let t = fma(e, x, c(std::f32::consts::LOG2_E), shifter)?;
    let ti = b.build_bit_cast(t, i32t, "").map_err(llvm)?.into_int_value();
    let ni = b.build_int_sub(ti, ci(12582912f32.to_bits()), "").map_err(llvm)?;
    let nf = fsub(e, t, shifter)?;
    let r = fma(e, nf, c(-0.693359375), x)?;
    let r = fma(e, nf, c(2.12194440e-4), r)?;
    let coeffs = [
        1.9875691500e-4f32,
        1.3981999507e-3,
        8.3334519073e-3,
        4.1665795894e-2,
        1.6666665459e-1,
        5.0000001201e-1,
    ];
    let mut p = c(coeffs[0]);
    for &k in &coeffs[1..] {
        p = fma(e, p, r, c(k))?;
    }
    let r2 = fmul(e, r, r)?;
    let p = fma(e, p, r2, r)?;
    let p = fadd(e, p, c(1.0))?;
    // 2^n in two halves, so results down to the subnormals and up to FLT_MAX need no branch.
    let n1 = b.build_right_shift(ni, ci(1), true, "").map_err(llvm)?;
    let n2 = b.build_int_sub(ni, n1, "").map_err(llvm)?;
    let scale = |k: IntValue<'ctx>| -> Result<FloatValue<'ctx>> {
        let k = b.build_int_add(k, ci(127), "").map_err(llvm)?;
        let k = b.build_and(k, ci(0xff), "").map_err(llvm)?;
        let k = b.build_left_shift(k, ci(23), "").map_err(llvm)?;
        Ok(b.build_bit_cast(k, e.cx.f32_type(), "")
            .map_err(llvm)?
            .into_float_value())
    };
    let p = fmul(e, p, scale(n1)?)?;
    fmul(e, p, scale(n2)?)
}

/// ln x (the Cephes `logf` polynomial on the mantissa in [√½, √2)): ln 0 = -inf, ln of a
/// negative number or NaN = NaN, ln inf = inf; subnormals are scaled into the normal range.
/// An f64 `x` goes through the math library.
pub(super) fn log<'ctx>(e: &Emit<'_, 'ctx>, x0: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
    if x0.get_type() == e.cx.f64_type() {
        return e.call_libm("log", &[x0]);
    }
    let b = e.b;
    let i32t = e.cx.i32_type();
    let c = |v: f32| e.f32c(v);
    let ci = |v: i32| i32t.const_int(v as u32 as u64, true);
    let tiny = fcmp(e, FloatPredicate::OLT, x0, c(f32::MIN_POSITIVE))?;
    let x = select(e, tiny, fmul(e, x0, c(8388608.0))?, x0)?;
    let bias = b
        .build_select(tiny, ci(126 + 23), ci(126), "")
        .map_err(llvm)?
        .into_int_value();
    let bits = b.build_bit_cast(x, i32t, "").map_err(llvm)?.into_int_value();
    let ex = b.build_right_shift(bits, ci(23), false, "").map_err(llvm)?;
    let ex = b.build_and(ex, ci(0xff), "").map_err(llvm)?;
    let ex = b.build_int_sub(ex, bias, "").map_err(llvm)?;
    let mb = b.build_and(bits, ci(0x007f_ffff), "").map_err(llvm)?;
    let mb = b.build_or(mb, ci(0x3f00_0000), "").map_err(llvm)?;
    let m = b
        .build_bit_cast(mb, e.cx.f32_type(), "")
        .map_err(llvm)?
        .into_float_value();
    // m in [0.5, 1): below √½ take 2m - 1 and one less in the exponent.
    let small = fcmp(e, FloatPredicate::OLT, m, c(std::f32::consts::FRAC_1_SQRT_2))?;
    let one = b
        .build_select(small, ci(1), ci(0), "")
        .map_err(llvm)?
        .into_int_value();
    let ex = b.build_int_sub(ex, one, "").map_err(llvm)?;
    let m = select(e, small, fadd(e, m, m)?, m)?;
    let f = fsub(e, m, c(1.0))?;
    let ef = b
        .build_signed_int_to_float(ex, e.cx.f32_type(), "")
        .map_err(llvm)?;
    let coeffs = [
        7.0376836292e-2f32,
        -1.1514610310e-1,
        1.1676998740e-1,
        -1.2420140846e-1,
        1.4249322787e-1,
        -1.6668057665e-1,
        2.0000714765e-1,
        -2.4999993993e-1,
        3.3333331174e-1,
    ];
    let mut p = c(coeffs[0]);
    for &k in &coeffs[1..] {
        p = fma(e, p, f, c(k))?;
    }
    let z = fmul(e, f, f)?;
    let y = fmul(e, fmul(e, f, z)?, p)?;
    let y = fma(e, ef, c(-2.12194440e-4), y)?;
    let y = fma(e, z, c(-0.5), y)?;
    let r = fadd(e, f, y)?;
    let r = fma(e, ef, c(0.693359375), r)?;
    let r = select(
        e,
        fcmp(e, FloatPredicate::OEQ, x0, c(f32::INFINITY))?,
        c(f32::INFINITY),
        r,
    )?;
    let r = select(
        e,
        fcmp(e, FloatPredicate::OEQ, x0, c(0.0))?,
        c(f32::NEG_INFINITY),
        r,
    )?;
    // Negative or NaN.
    select(e, fcmp(e, FloatPredicate::ULT, x0, c(0.0))?, c(f32::NAN), r)
}

// ---------------------------------------------------------------------------------------------
// Emission
// ---------------------------------------------------------------------------------------------

/// A row of the block: where its elements are, which thread of the row this is, and its slice
/// of shared memory.
struct Row<'ctx> {
    /// Element `k` at `base + k·inner`.
    base: IntValue<'ctx>,
    /// `len` for a row inside the tensor, 0 past the end.
    len: IntValue<'ctx>,
    tx: IntValue<'ctx>,
    smem: PointerValue<'ctx>,
}

impl RowGpu {
    fn at<'ctx>(&self, e: &Emit<'_, 'ctx>, row: &Row<'ctx>, k: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
        e.add(row.base, offset(e, &self.red, k)?)
    }

    /// The type values are computed in: f64 for f64 tensors, else f32.
    fn compute_type<'ctx>(&self, e: &Emit<'_, 'ctx>) -> inkwell::types::FloatType<'ctx> {
        match self.elem {
            DType::F64 | DType::I32 => e.cx.f64_type(),
            _ => e.cx.f32_type(),
        }
    }

    /// A constant of the compute type.
    fn constant<'ctx>(&self, e: &Emit<'_, 'ctx>, v: f64) -> FloatValue<'ctx> {
        self.compute_type(e).const_float(v)
    }

    /// Element `i` of a tensor of the kernel's element type, in the compute type.
    fn load<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        base: PointerValue<'ctx>,
        i: IntValue<'ctx>,
    ) -> Result<FloatValue<'ctx>> {
        load_elem(e, self.elem, base, i)
    }

    /// Stores `v` as element `i` (rounded to nearest even for a 16-bit float tensor).
    fn store<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        base: PointerValue<'ctx>,
        i: IntValue<'ctx>,
        v: FloatValue<'ctx>,
    ) -> Result<()> {
        let v = match self.elem {
            DType::I32 => {
                // Exact in f64; the low 32 bits are the reference's wrapped int32 result.
                let wide =
                    e.b.build_float_to_signed_int(v, e.cx.i64_type(), "")
                        .map_err(llvm)?;
                e.b.build_int_truncate(wide, e.cx.i32_type(), "")
                    .map_err(llvm)?
                    .into()
            }
            DType::Bool => fcmp(e, FloatPredicate::ONE, v, e.f32c(0.0))?.into(),
            DType::BF16 => ew::round_bf16_one(e, v)?.into(),
            // f16 rounds as it is stored; f32 and f64 are stored as they are.
            _ => v.into(),
        };
        ew::store_one(e, base, self.elem, i, v)
    }

    /// Folds `f(k, x[k])` over this thread's elements of the row, then over the row: every
    /// thread of the row gets the result.
    fn reduce<'ctx>(
        &self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        row: &Row<'ctx>,
        fold: Fold,
        f: impl Fn(IntValue<'ctx>, FloatValue<'ctx>) -> Result<FloatValue<'ctx>>,
    ) -> Result<FloatValue<'ctx>> {
        let ct = self.compute_type(e);
        let x = k.input(0)?;
        let acc = e.entry_alloca(ct, "acc")?;
        e.store(acc, ct.const_float(f64::from(fold.init())))?;
        let load_acc = || -> Result<FloatValue<'ctx>> {
            Ok(e.b.build_load(ct, acc, "").map_err(llvm)?.into_float_value())
        };
        e.for_range(row.tx, row.len, self.t as i64, |kk| {
            let v = self.load(e, x, self.at(e, row, kk)?)?;
            let v = f(kk, v)?;
            e.store(acc, fold.combine(e, load_acc()?, v)?)
        })?;
        let mine = load_acc()?;
        block_reduce(k, e, row.smem, row.tx, self.t, fold, mine)
    }

    /// `y[k] = f(k, x[k])` over this thread's elements of the row.
    fn map<'ctx>(
        &self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        row: &Row<'ctx>,
        f: impl Fn(IntValue<'ctx>, FloatValue<'ctx>) -> Result<FloatValue<'ctx>>,
    ) -> Result<()> {
        let (x, y) = (k.input(0)?, k.output(0)?);
        e.for_range(row.tx, row.len, self.t as i64, |kk| {
            let at = self.at(e, row, kk)?;
            let v = self.load(e, x, at)?;
            self.store(e, y, at, f(kk, v)?)
        })
    }
}

/// The element offset of flat index `i` over `axes` (extent, stride; last fastest).
fn offset<'ctx>(e: &Emit<'_, 'ctx>, axes: &[(usize, usize)], i: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
    let mut off = e.i64c(0);
    let mut rest = i;
    for (j, &(extent, stride)) in axes.iter().enumerate().rev() {
        // The outermost axis takes what is left (an index past the end stays past it).
        let idx = if j == 0 {
            rest
        } else {
            e.uremc(rest, extent as i64)?
        };
        if j > 0 {
            rest = e.udivc(rest, extent as i64)?;
        }
        let term = if stride == 1 {
            idx
        } else {
            e.mulc(idx, stride as i64)?
        };
        off = if j == axes.len() - 1 {
            term
        } else {
            e.add(off, term)?
        };
    }
    Ok(off)
}

/// Reduces the `t` values `v` of a row's threads (`tx` = 0..t) through `smem[0..t]` (slots of
/// `v`'s type, f32 or f64); every thread gets the result. All threads of the block must call it
/// (it has barriers).
pub(super) fn block_reduce<'ctx>(
    k: &GpuBuilder<'_, 'ctx>,
    e: &Emit<'_, 'ctx>,
    smem: PointerValue<'ctx>,
    tx: IntValue<'ctx>,
    t: usize,
    fold: Fold,
    v: FloatValue<'ctx>,
) -> Result<FloatValue<'ctx>> {
    let ty = v.get_type();
    // SAFETY (of the IR): the callers size the shared memory for t values of v's type.
    let slot = |i: IntValue<'ctx>| unsafe { e.b.build_in_bounds_gep(ty, smem, &[i], "") }.map_err(llvm);
    let load = |p: PointerValue<'ctx>| -> Result<FloatValue<'ctx>> {
        Ok(e.b.build_load(ty, p, "").map_err(llvm)?.into_float_value())
    };
    e.store(slot(tx)?, v)?;
    k.barrier()?;
    let mut s = t / 2;
    while s >= 1 {
        let active = e.icmp(IntPredicate::ULT, tx, e.i64c(s as i64))?;
        e.if_then(active, || {
            let a = load(slot(tx)?)?;
            let b = load(slot(e.addc(tx, s as i64)?)?)?;
            e.store(slot(tx)?, fold.combine(e, a, b)?)
        })?;
        k.barrier()?;
        s /= 2;
    }
    let r = load(smem)?;
    // The next reduction overwrites the slots.
    k.barrier()?;
    Ok(r)
}

/// Element `i` of an f32, f16 or bf16 tensor, as f32; of an f64 tensor, as f64.
fn load_elem<'ctx>(
    e: &Emit<'_, 'ctx>,
    elem: DType,
    base: PointerValue<'ctx>,
    i: IntValue<'ctx>,
) -> Result<FloatValue<'ctx>> {
    let v = ew::load_one(e, base, elem, i)?;
    match elem {
        DType::I32 => {
            e.b.build_signed_int_to_float(v.into_int_value(), e.cx.f64_type(), "")
        }
        DType::Bool => {
            e.b.build_unsigned_int_to_float(v.into_int_value(), e.cx.f32_type(), "")
        }
        _ => return Ok(v.into_float_value()),
    }
    .map_err(llvm)
}

/// Parameter `p` (of `elem`) for position `kk` of row `r` (see [`Param`]).
fn load_param<'ctx>(
    e: &Emit<'_, 'ctx>,
    elem: DType,
    p: PointerValue<'ctx>,
    mode: Param,
    r: IntValue<'ctx>,
    kk: IntValue<'ctx>,
) -> Result<FloatValue<'ctx>> {
    match mode {
        Param::PerElement => load_elem(e, elem, p, kk),
        Param::Scalar => load_elem(e, elem, p, e.i64c(0)),
        Param::PerChannel {
            rows_per_sample,
            per_row,
            spatial,
        } => {
            let first = e.mulc(e.uremc(r, rows_per_sample as i64)?, per_row as i64)?;
            let channel = e.add(first, e.udivc(kk, spatial as i64)?)?;
            load_elem(e, elem, p, channel)
        }
    }
}

impl KernelCommon for RowGpu {
    fn describe(&self) -> String {
        self.what.clone()
    }

    fn reads_input(&self, i: usize) -> bool {
        // A reduction's axes are compiled in.
        !(matches!(self.op, RowOp::Reduce(_)) && i > 0)
    }
}

impl GpuKernel for RowGpu {
    fn launch(&self) -> LaunchDims {
        LaunchDims {
            grid: [self.rows().div_ceil(self.r) as u32, 1, 1],
            block: [self.t as u32, self.r as u32, 1],
            shared_bytes: (self.t * self.r * self.elem_bytes()) as u32,
        }
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let tx = k.sreg64(Sreg::TidX)?;
        let ty = k.sreg64(Sreg::TidY)?;
        let bx = k.sreg64(Sreg::CtaidX)?;
        let r = e.add(e.mulc(bx, self.r as i64)?, ty)?;
        let valid = e.icmp(IntPredicate::ULT, r, e.i64c(self.rows() as i64))?;
        let len =
            e.b.build_select(valid, e.i64c(self.len as i64), e.i64c(0), "")
                .map_err(llvm)?
                .into_int_value();
        let base = offset(&e, &self.kept, r)?;
        let smem = e.gep_u8(k.shared()?, e.mulc(ty, (self.t * self.elem_bytes()) as i64)?)?;
        let row = Row { base, len, tx, smem };
        let n = self.constant(&e, self.len as f64);
        match &self.op {
            RowOp::Softmax { log: is_log } => {
                let m = self.reduce(k, &e, &row, Fold::Max, id)?;
                let s = self.reduce(k, &e, &row, Fold::Sum, |_, v| exp(&e, fsub(&e, v, m)?))?;
                if *is_log {
                    let ls = log(&e, s)?;
                    self.map(k, &e, &row, |_, v| fsub(&e, fsub(&e, v, m)?, ls))?;
                } else {
                    self.map(k, &e, &row, |_, v| fdiv(&e, exp(&e, fsub(&e, v, m)?)?, s))?;
                }
            }
            RowOp::Hardmax => {
                // The maximum (NaN if any element is), then the first index holding it.
                let m = self.reduce(k, &e, &row, Fold::Max, id)?;
                let nan_max = fcmp(&e, FloatPredicate::UNO, m, m)?;
                let first = self.reduce(k, &e, &row, Fold::Min, |kk, v| {
                    let nan = fcmp(&e, FloatPredicate::UNO, v, v)?;
                    let equal = fcmp(&e, FloatPredicate::OEQ, v, m)?;
                    let hit =
                        e.b.build_select(nan_max, nan, equal, "")
                            .map_err(llvm)?
                            .into_int_value();
                    select(&e, hit, index_f32(&e, kk)?, e.f32c(f32::INFINITY))
                })?;
                self.map(k, &e, &row, |kk, _| {
                    let at_first = fcmp(&e, FloatPredicate::OEQ, index_f32(&e, kk)?, first)?;
                    select(&e, at_first, e.f32c(1.0), e.f32c(0.0))
                })?;
            }
            RowOp::LpNorm { p } => {
                let s = self.reduce(k, &e, &row, Fold::Sum, |_, v| match p {
                    1 => unary(&e, "llvm.fabs", v),
                    _ => fmul(&e, v, v),
                })?;
                let norm = if *p == 1 { s } else { unary(&e, "llvm.sqrt", s)? };
                let zero = fcmp(&e, FloatPredicate::OEQ, norm, e.f32c(0.0))?;
                self.map(k, &e, &row, |_, v| {
                    select(&e, zero, e.f32c(0.0), fdiv(&e, v, norm)?)
                })?;
            }
            RowOp::LayerNorm {
                epsilon,
                scale,
                bias,
                stats,
            } => {
                let sum = self.reduce(k, &e, &row, Fold::Sum, id)?;
                let mean = fdiv(&e, sum, n)?;
                let ss = self.reduce(k, &e, &row, Fold::Sum, |_, v| {
                    let d = fsub(&e, v, mean)?;
                    fmul(&e, d, d)
                })?;
                let var = fdiv(&e, ss, n)?;
                let inv = inv_sqrt(&e, var, *epsilon)?;
                let sp = k.input(1)?;
                let bp = match bias {
                    Some(_) => Some(k.input(2)?),
                    None => None,
                };
                self.map(k, &e, &row, |kk, v| {
                    let y = fmul(
                        &e,
                        fmul(&e, fsub(&e, v, mean)?, inv)?,
                        load_param(&e, self.elem, sp, *scale, r, kk)?,
                    )?;
                    match (bp, bias) {
                        (Some(p), Some(mode)) => fadd(&e, y, load_param(&e, self.elem, p, *mode, r, kk)?),
                        _ => Ok(y),
                    }
                })?;
                if *stats > 0 {
                    let first =
                        e.b.build_and(valid, e.icmp(IntPredicate::EQ, tx, e.i64c(0))?, "")
                            .map_err(llvm)?;
                    e.if_then(first, || {
                        self.store(&e, k.output(1)?, r, mean)?;
                        if *stats > 1 {
                            self.store(&e, k.output(2)?, r, inv)?;
                        }
                        Ok(())
                    })?;
                }
            }
            RowOp::RmsNorm { epsilon, scale } => {
                let ss = self.reduce(k, &e, &row, Fold::Sum, |_, v| fmul(&e, v, v))?;
                let inv = inv_sqrt(&e, fdiv(&e, ss, n)?, *epsilon)?;
                let sp = k.input(1)?;
                self.map(k, &e, &row, |kk, v| {
                    fmul(
                        &e,
                        fmul(&e, v, inv)?,
                        load_param(&e, self.elem, sp, *scale, r, kk)?,
                    )
                })?;
            }
            RowOp::MeanVariance => {
                let mean = fdiv(&e, self.reduce(k, &e, &row, Fold::Sum, id)?, n)?;
                let ss = self.reduce(k, &e, &row, Fold::Sum, |_, v| {
                    let d = fsub(&e, v, mean)?;
                    fmul(&e, d, d)
                })?;
                let std = unary(&e, "llvm.sqrt", fdiv(&e, ss, n)?)?;
                let den = fadd(&e, std, self.constant(&e, 1e-9))?;
                self.map(k, &e, &row, |_, v| fdiv(&e, fsub(&e, v, mean)?, den))?;
            }
            RowOp::Reduce(ReduceKind::LogSumExp) => {
                // max + ln Σ exp(x - max); an infinite or NaN max is the result itself.
                let m = self.reduce(k, &e, &row, Fold::Max, id)?;
                let s = self.reduce(k, &e, &row, Fold::Sum, |_, v| exp(&e, fsub(&e, v, m)?))?;
                let finite = fcmp(
                    &e,
                    FloatPredicate::OLT,
                    unary(&e, "llvm.fabs", m)?,
                    self.constant(&e, f64::INFINITY),
                )?;
                let y = select(&e, finite, fadd(&e, m, log(&e, s)?)?, m)?;
                let first =
                    e.b.build_and(valid, e.icmp(IntPredicate::EQ, tx, e.i64c(0))?, "")
                        .map_err(llvm)?;
                e.if_then(first, || self.store(&e, k.output(0)?, r, y))?;
            }
            RowOp::Reduce(kind) => {
                let fold = match kind {
                    ReduceKind::Max => Fold::Max,
                    ReduceKind::Min => Fold::Min,
                    ReduceKind::Prod => Fold::Prod,
                    _ => Fold::Sum,
                };
                let acc = self.reduce(k, &e, &row, fold, |_, v| match kind {
                    ReduceKind::L1 => unary(&e, "llvm.fabs", v),
                    ReduceKind::L2 | ReduceKind::SumSquare => fmul(&e, v, v),
                    _ => Ok(v),
                })?;
                let y = match kind {
                    ReduceKind::Mean => fdiv(&e, acc, n)?,
                    ReduceKind::L2 => unary(&e, "llvm.sqrt", acc)?,
                    ReduceKind::LogSum => log(&e, acc)?,
                    _ => acc,
                };
                let first =
                    e.b.build_and(valid, e.icmp(IntPredicate::EQ, tx, e.i64c(0))?, "")
                        .map_err(llvm)?;
                e.if_then(first, || self.store(&e, k.output(0)?, r, y))?;
            }
        }
        k.ret()
    }
}

/// An element index as f32 (exact below 2^24).
fn index_f32<'ctx>(e: &Emit<'_, 'ctx>, kk: IntValue<'ctx>) -> Result<FloatValue<'ctx>> {
    e.b.build_unsigned_int_to_float(kk, e.cx.f32_type(), "")
        .map_err(llvm)
}

fn id<'ctx>(_: IntValue<'ctx>, v: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
    Ok(v)
}

/// `1 / sqrt(v + epsilon)`.
fn inv_sqrt<'ctx>(e: &Emit<'_, 'ctx>, v: FloatValue<'ctx>, epsilon: f32) -> Result<FloatValue<'ctx>> {
    let s = unary(e, "llvm.sqrt", fadd(e, v, e.f32c(epsilon))?)?;
    fdiv(e, e.f32c(1.0), s)
}

#[cfg(test)]
mod tests;
