//! MaxPool, AveragePool and LpPool on the GPU (NCHW, 1 to 3 spatial axes, f32; MaxPool also
//! of u8 and i8, the QOperator models' pools, compared as exact f32 values; LpPool sums
//! `|x|^p` in f64 and takes the `1/p` power, as the reference, with the math library's `pow`,
//! libdevice's on the device): one thread per output
//! element, consecutive threads on consecutive output positions of a plane, so the window
//! reads of a warp are close together. The window is one loop over its taps; a tap outside the
//! input is skipped (AveragePool counts it when `count_include_pad` and it lies in the explicit
//! padding, as the reference does). The global pools are row reductions (`rows`).

use super::rows::{fadd, fdiv};
use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims, Sreg};
use crate::target::TargetDesc;
use inkwell::{FloatPredicate, IntPredicate};
use kiln_ir::ops::WindowAxis as Axis;
use kiln_ir::{AutoPad, DType, Layout, Op, PoolAttrs, PoolKind};

const BLOCK: usize = 256;

/// The window of axis `i` over an input of `input` elements (the ONNX rules for auto_pad and
/// ceil_mode); None for a geometry that is not valid.
fn axis(p: &PoolAttrs, i: usize, n: usize, input: usize) -> Option<Axis> {
    let at = |v: &[usize], d: usize| if v.is_empty() { Some(d) } else { v.get(i).copied() };
    let kernel = *p.kernel_shape.get(i)?;
    let stride = at(&p.strides, 1)?;
    let dilation = at(&p.dilations, 1)?;
    let pads = match p.pads.len() {
        0 => (0, 0),
        len if len == 2 * n => (p.pads[i], p.pads[n + i]),
        _ if p.auto_pad == AutoPad::NotSet => return None,
        _ => (0, 0),
    };
    kiln_ir::ops::resolve_window_axis(input, kernel, stride, dilation, pads, p.auto_pad, p.ceil_mode).ok()
}

pub struct PoolGpu {
    what: String,
    /// Average: Some(count_include_pad); Max and Lp: None.
    average: Option<bool>,
    /// LpPool's p.
    lp: Option<f32>,
    /// The tensors' element type: f32, or (MaxPool) u8 or i8.
    elem: DType,
    planes: usize,
    axes: Vec<Axis>,
    /// MaxPool's Indices output, if asked: Some(column-major) for `storage_order` 1.
    indices: Option<bool>,
}

/// The generator: MaxPool (with or without its Indices output), AveragePool and LpPool.
pub fn lower(node: &NodeInfo, target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    let Op::Pool(p) = node.op() else {
        return Ok(None);
    };
    if !target.is_gpu() || p.channels_last || node.extra.is_some() {
        return Ok(None);
    }
    let indices = match node.n_outputs() {
        1 => None,
        2 if matches!(p.kind, PoolKind::Max) && node.output_type(1).dtype == DType::I64 => {
            Some(p.storage_order == 1)
        }
        _ => return Ok(None),
    };
    let (average, lp) = match p.kind {
        PoolKind::Max => (None, None),
        PoolKind::Average { count_include_pad } => (Some(count_include_pad), None),
        PoolKind::Lp { p } => (None, Some(p)),
    };
    let elem = node.output_type(0).dtype;
    let elem_ok = match (average, lp) {
        (None, None) => matches!(elem, DType::F32 | DType::U8 | DType::I8),
        _ => elem == DType::F32,
    };
    let ok = |t: &kiln_ir::TensorType| t.dtype == elem && t.layout == Layout::RowMajor && t.is_static();
    if !elem_ok || !node.input_type(0).is_some_and(ok) || !ok(node.output_type(0)) {
        return Ok(None);
    }
    let x = node.input_shape(0)?;
    let y = node.output_shape(0)?;
    let n = x.len().saturating_sub(2);
    if !(1..=3).contains(&n) || p.kernel_shape.len() != n {
        return Ok(None);
    }
    let Some(axes) = (0..n)
        .map(|i| axis(p, i, n, x[2 + i]))
        .collect::<Option<Vec<_>>>()
    else {
        return Ok(None);
    };
    if axes.iter().map(|a| a.output).collect::<Vec<_>>() != y[2..] {
        return Ok(None);
    }
    let total: usize = y.iter().product();
    if total == 0 || total.div_ceil(BLOCK) >= 1 << 31 || x.iter().product::<usize>() >= 1 << 40 {
        return Ok(None);
    }
    let list = |f: fn(&Axis) -> usize| {
        axes.iter()
            .map(|a| f(a).to_string())
            .collect::<Vec<_>>()
            .join("x")
    };
    let what = format!(
        "gpu {}{}{} k={} s={} out={:?}",
        match (average, lp) {
            (Some(_), _) => "avgpool".to_string(),
            (_, Some(p)) => format!("lppool p={p}"),
            _ => "maxpool".to_string(),
        },
        if elem == DType::F32 {
            String::new()
        } else {
            format!(" {elem}")
        },
        match indices {
            Some(true) => " +indices (column-major)",
            Some(false) => " +indices",
            None => "",
        },
        list(|a| a.kernel),
        list(|a| a.stride),
        y
    );
    Ok(Some(Box::new(PoolGpu {
        what,
        average,
        lp,
        elem,
        planes: x[0] * x[1],
        axes,
        indices,
    })))
}

impl PoolGpu {
    fn total(&self) -> usize {
        self.planes * self.axes.iter().map(|a| a.output).product::<usize>()
    }
}

impl KernelCommon for PoolGpu {
    fn describe(&self) -> String {
        self.what.clone()
    }
}

impl GpuKernel for PoolGpu {
    fn launch(&self) -> LaunchDims {
        LaunchDims {
            grid: [self.total().div_ceil(BLOCK) as u32, 1, 1],
            block: [BLOCK as u32, 1, 1],
            shared_bytes: 0,
        }
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let f32t = k.cx.f32_type();
        let i64t = k.cx.i64_type();
        let idx = e.add(
            e.mulc(k.sreg64(Sreg::CtaidX)?, BLOCK as i64)?,
            k.sreg64(Sreg::TidX)?,
        )?;
        let inside = e.icmp(IntPredicate::ULT, idx, e.i64c(self.total() as i64))?;
        let (x, y) = (k.input(0)?, k.output(0)?);
        let acc = e.entry_alloca(f32t, "acc")?;
        let f64t = k.cx.f64_type();
        let lp_sum = e.entry_alloca(f64t, "lp_sum")?;
        let taken = e.entry_alloca(i64t, "taken")?;
        let padded = e.entry_alloca(i64t, "padded")?;
        let arg = e.entry_alloca(i64t, "arg")?;
        e.if_then(inside, || {
            // Output position, last axis fastest; the first tap of the window on each axis.
            let mut rest = idx;
            let mut starts = vec![];
            for a in self.axes.iter().rev() {
                let o = e.uremc(rest, a.output as i64)?;
                rest = e.udivc(rest, a.output as i64)?;
                starts.push(e.addc(e.mulc(o, a.stride as i64)?, -a.pad_begin)?);
            }
            starts.reverse();
            let plane_len: usize = self.axes.iter().map(|a| a.input).product();
            let plane = e.mulc(rest, plane_len as i64)?;
            // A window with no tap in the input (not a valid geometry) gives -inf, as in the
            // reference.
            let init = if self.average.is_some() {
                0.0
            } else {
                f32::NEG_INFINITY
            };
            e.store(acc, e.f32c(init))?;
            e.store(lp_sum, f64t.const_zero())?;
            e.store(taken, e.i64c(0))?;
            e.store(padded, e.i64c(0))?;
            e.store(arg, e.i64c(-1))?;
            let taps: usize = self.axes.iter().map(|a| a.kernel).product();
            e.for_n(taps as i64, |t| {
                let mut rest = t;
                let mut in_input = e.cx.bool_type().const_int(1, false);
                let mut in_padding = in_input;
                let mut off = e.i64c(0);
                let mut stride = 1i64;
                // The column-major offset, for MaxPool's indices with `storage_order` 1.
                let mut col_off = e.i64c(0);
                let mut col_stride: i64 = self.axes.iter().map(|a| a.input as i64).product();
                for (d, a) in self.axes.iter().enumerate().rev() {
                    let kd = e.uremc(rest, a.kernel as i64)?;
                    rest = e.udivc(rest, a.kernel as i64)?;
                    let s = e.add(starts[d], e.mulc(kd, a.dilation as i64)?)?;
                    // Unsigned: a tap in the begin padding is negative, so out of range.
                    let ok = e.icmp(IntPredicate::ULT, s, e.i64c(a.input as i64))?;
                    in_input = e.b.build_and(in_input, ok, "").map_err(llvm)?;
                    let lo = e.icmp(IntPredicate::SGE, s, e.i64c(-a.pad_begin))?;
                    let hi = e.icmp(IntPredicate::SLT, s, e.i64c(a.input as i64 + a.pad_end))?;
                    let p = e.b.build_and(lo, hi, "").map_err(llvm)?;
                    in_padding = e.b.build_and(in_padding, p, "").map_err(llvm)?;
                    off = e.add(off, e.mulc(s, stride)?)?;
                    stride *= a.input as i64;
                    col_stride /= a.input as i64;
                    col_off = e.add(col_off, e.mulc(s, col_stride)?)?;
                }
                if self.average == Some(true) {
                    let n = load_i64(&e, padded)?;
                    let inc = e.b.build_int_z_extend(in_padding, i64t, "").map_err(llvm)?;
                    e.store(padded, e.add(n, inc)?)?;
                }
                e.if_then(in_input, || {
                    let v = self.load(k, &e, x, e.add(plane, off)?)?;
                    if let Some(p) = self.lp {
                        let v = e.b.build_float_ext(v, f64t, "").map_err(llvm)?;
                        let v = e
                            .intrinsic("llvm.fabs", &[f64t.into()], &[v.into()])?
                            .into_float_value();
                        let term = e.call_libm("pow", &[v, f64t.const_float(f64::from(p))])?;
                        let sum = e.b.build_load(f64t, lp_sum, "").map_err(llvm)?.into_float_value();
                        return e.store(lp_sum, e.b.build_float_add(sum, term, "").map_err(llvm)?);
                    }
                    let a = e.load_f32(acc)?;
                    let n = load_i64(&e, taken)?;
                    let next = if self.average.is_some() {
                        fadd(&e, a, v)?
                    } else {
                        // The first tap, then any greater one: a NaN counts only as the first
                        // tap, as in the reference.
                        let first = e.icmp(IntPredicate::EQ, n, e.i64c(0))?;
                        let greater =
                            e.b.build_float_compare(FloatPredicate::OGT, v, a, "")
                                .map_err(llvm)?;
                        let take = e.b.build_or(first, greater, "").map_err(llvm)?;
                        if let Some(column_major) = self.indices {
                            let at = e.add(plane, if column_major { col_off } else { off })?;
                            e.store(arg, e.select_int(take, at, load_i64(&e, arg)?)?)?;
                        }
                        e.b.build_select(take, v, a, "").map_err(llvm)?.into_float_value()
                    };
                    e.store(acc, next)?;
                    e.store(taken, e.addc(n, 1)?)
                })
            })?;
            let mut v = e.load_f32(acc)?;
            if let Some(p) = self.lp {
                let sum = e.b.build_load(f64t, lp_sum, "").map_err(llvm)?.into_float_value();
                let r = e.call_libm("pow", &[sum, f64t.const_float(1.0 / f64::from(p))])?;
                v = e.b.build_float_trunc(r, f32t, "").map_err(llvm)?;
            }
            if let Some(include_pad) = self.average {
                let n = load_i64(&e, if include_pad { padded } else { taken })?;
                let nf = e.b.build_unsigned_int_to_float(n, f32t, "").map_err(llvm)?;
                v = fdiv(&e, v, nf)?;
            }
            if self.indices.is_some() {
                let out = k.output(1)?;
                // SAFETY (of the IR): idx < total, the Indices output's length.
                let p = unsafe { e.b.build_in_bounds_gep(i64t, out, &[idx], "") }.map_err(llvm)?;
                e.store(p, load_i64(&e, arg)?)?;
            }
            self.store(k, &e, y, idx, v)
        })?;
        k.ret()
    }
}

impl PoolGpu {
    /// Element `i` of `p` as f32 (exact for 8-bit integers).
    fn load<'ctx>(
        &self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        p: inkwell::values::PointerValue<'ctx>,
        i: inkwell::values::IntValue<'ctx>,
    ) -> Result<inkwell::values::FloatValue<'ctx>> {
        let f32t = k.cx.f32_type();
        match self.elem {
            DType::F32 => e.load_f32(e.gep_f32(p, i)?),
            DType::U8 => {
                let v = e.load_u8_as_i32(e.gep_u8(p, i)?)?;
                e.b.build_unsigned_int_to_float(v, f32t, "").map_err(llvm)
            }
            _ => {
                let v =
                    e.b.build_load(k.cx.i8_type(), e.gep_u8(p, i)?, "")
                        .map_err(llvm)?;
                e.b.build_signed_int_to_float(v.into_int_value(), f32t, "")
                    .map_err(llvm)
            }
        }
    }

    /// Stores `v` as element `i` of `p`: an integer converted as the reference's saturating
    /// cast (a window without a tap in the input holds -inf: 0 for u8, -128 for i8).
    fn store<'ctx>(
        &self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        p: inkwell::values::PointerValue<'ctx>,
        i: inkwell::values::IntValue<'ctx>,
        v: inkwell::values::FloatValue<'ctx>,
    ) -> Result<()> {
        let conv = match self.elem {
            DType::F32 => return e.store(e.gep_f32(p, i)?, v),
            DType::U8 => "llvm.fptoui.sat",
            _ => "llvm.fptosi.sat",
        };
        let i8t = k.cx.i8_type();
        let b = e.intrinsic(conv, &[i8t.into(), k.cx.f32_type().into()], &[v.into()])?;
        e.store(e.gep_u8(p, i)?, b.into_int_value())
    }
}

fn load_i64<'ctx>(
    e: &Emit<'_, 'ctx>,
    p: inkwell::values::PointerValue<'ctx>,
) -> Result<inkwell::values::IntValue<'ctx>> {
    Ok(e.b
        .build_load(e.cx.i64_type(), p, "")
        .map_err(llvm)?
        .into_int_value())
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check};
    use kiln_ir::{AutoPad, DType, Dim, Graph, Op, PoolAttrs, PoolKind, Tensor, TensorType};

    fn pool(kind: PoolKind, k: &[usize], s: &[usize], pads: &[usize], dil: &[usize], ceil: bool) -> Op {
        Op::Pool(PoolAttrs {
            kind,
            kernel_shape: k.to_vec(),
            strides: s.to_vec(),
            pads: pads.to_vec(),
            dilations: dil.to_vec(),
            auto_pad: AutoPad::NotSet,
            ceil_mode: ceil,
            storage_order: 0,
            channels_last: false,
        })
    }

    fn graph(shape: &[usize], op: Op, seed: u64) -> (Graph, Vec<Tensor>) {
        let mut g = Graph::new("t");
        let ty = TensorType::new(DType::F32, shape.iter().map(|&d| Dim::Fixed(d)).collect());
        let x = g.add_input("x", ty);
        let y = g.add("p", op, vec![Some(x)], "y").unwrap();
        g.add_output("y", y);
        let v = crate::test_rng::TestRng::new(seed.wrapping_add(1)).vec_scaled(shape.iter().product(), 4.0);
        (g, vec![Tensor::from_vec(shape.to_vec(), v)])
    }

    const KINDS: [PoolKind; 5] = [
        PoolKind::Max,
        PoolKind::Average {
            count_include_pad: false,
        },
        PoolKind::Average {
            count_include_pad: true,
        },
        PoolKind::Lp { p: 2.0 },
        PoolKind::Lp { p: 3.0 },
    ];

    #[test]
    fn pools_2d() {
        // (shape, kernel, strides, pads, dilations, ceil_mode)
        #[allow(clippy::type_complexity)]
        let cases: &[(&[usize], &[usize], &[usize], &[usize], &[usize], bool)] = &[
            (&[1, 3, 8, 8], &[2, 2], &[2, 2], &[], &[], false),
            (&[2, 5, 9, 11], &[3, 3], &[2, 2], &[1, 1, 1, 1], &[], false),
            (&[2, 5, 9, 11], &[3, 3], &[2, 2], &[1, 1, 1, 1], &[], true),
            (&[1, 4, 10, 7], &[3, 2], &[1, 2], &[0, 1, 2, 0], &[], true),
            (&[1, 2, 12, 12], &[3, 3], &[1, 1], &[1, 1, 1, 1], &[2, 2], false),
            (&[3, 70, 6, 6], &[3, 3], &[1, 1], &[1, 1, 1, 1], &[], false),
            (&[1, 1, 5, 5], &[5, 5], &[1, 1], &[], &[], false),
        ];
        for (i, &(shape, k, s, p, d, ceil)) in cases.iter().enumerate() {
            for kind in KINDS {
                let (g, inputs) = graph(shape, pool(kind, k, s, p, d, ceil), i as u64);
                let desc = check_graph(&g, &inputs);
                assert!(desc[0].starts_with("gpu "), "{desc:?}");
            }
        }
    }

    #[test]
    fn pools_1d_3d_and_auto_pad() {
        for kind in KINDS {
            let (g, inputs) = graph(&[2, 3, 17], pool(kind, &[4], &[3], &[2, 1], &[], true), 1);
            check_graph(&g, &inputs);
            let (g, inputs) = graph(
                &[1, 2, 5, 6, 7],
                pool(kind, &[2, 3, 2], &[2, 1, 2], &[0, 1, 0, 1, 1, 1], &[], false),
                2,
            );
            check_graph(&g, &inputs);
            for auto_pad in [AutoPad::SameUpper, AutoPad::SameLower, AutoPad::Valid] {
                let mut op = pool(kind, &[3, 2], &[2, 2], &[], &[], false);
                if let Op::Pool(a) = &mut op {
                    a.auto_pad = auto_pad;
                }
                let (g, inputs) = graph(&[1, 3, 7, 8], op, 3);
                let desc = check_graph(&g, &inputs);
                assert!(desc[0].starts_with("gpu "), "{desc:?}");
            }
        }
    }

    #[test]
    fn max_pool_nan_as_the_reference() {
        let (g, mut inputs) = graph(
            &[1, 1, 6, 6],
            pool(PoolKind::Max, &[2, 2], &[1, 1], &[], &[], false),
            4,
        );
        let mut v: Vec<f32> = inputs[0].to_f64_vec().iter().map(|&x| x as f32).collect();
        v[0] = f32::NAN;
        v[14] = f32::NAN;
        inputs[0] = Tensor::from_vec(vec![1, 1, 6, 6], v);
        check_graph(&g, &inputs);
    }

    /// MaxPool's Indices output, row- and column-major (`storage_order`), over several planes
    /// (the index counts from the tensor's start), with padding, ties (the first tap wins) and
    /// a 3-D window.
    #[test]
    fn max_pool_indices_in_both_storage_orders() {
        #[allow(clippy::type_complexity)]
        let cases: &[(&[usize], &[usize], &[usize], &[usize])] = &[
            (&[2, 3, 7, 6], &[3, 2], &[2, 1], &[1, 0, 1, 1]),
            (&[1, 2, 4, 5, 6], &[2, 3, 2], &[1, 2, 2], &[0, 1, 1, 1, 0, 0]),
        ];
        for &(shape, k, s, p) in cases {
            for storage_order in [0, 1] {
                let mut op = pool(PoolKind::Max, k, s, p, &[], false);
                if let Op::Pool(a) = &mut op {
                    a.storage_order = storage_order;
                }
                let mut g = Graph::new("t");
                let x = g.add_input("x", TensorType::fixed(DType::F32, shape));
                let outs = g
                    .add_node("p", op, vec![Some(x)], vec!["y".into(), "i".into()])
                    .unwrap();
                g.add_output("y", outs[0]);
                g.add_output("i", outs[1]);
                // Few distinct values, so windows hold ties.
                let n: usize = shape.iter().product();
                let v: Vec<f32> = (0..n).map(|i| ((i * 7) % 5) as f32).collect();
                let desc = check_graph(&g, &[Tensor::from_vec(shape.to_vec(), v)]);
                assert!(desc[0].contains("+indices"), "{desc:?}");
                ptxas_check(&g, 90);
            }
        }
    }

    /// MaxPool of 8-bit integers (QOperator models' pools), padded and strided, with a
    /// dilated window; `graph`'s f32 values scaled into each type's range.
    #[test]
    fn max_pool_of_8_bit_integers() {
        for dtype in [DType::U8, DType::I8] {
            for (k, s, p, d) in [
                ([3, 3], [2, 2], [1, 1, 1, 1], [1, 1]),
                ([2, 3], [1, 2], [1, 0, 0, 2], [2, 1]),
            ] {
                let op = pool(PoolKind::Max, &k, &s, &p, &d, true);
                let (_, inputs) = graph(&[2, 3, 7, 9], op.clone(), 5);
                let mut g = Graph::new("t");
                let x = g.add_input("x", TensorType::fixed(dtype, &[2, 3, 7, 9]));
                let y = g.add("p", op, vec![Some(x)], "y").unwrap();
                g.add_output("y", y);
                let v = inputs[0].to_f64_vec();
                let x = match dtype {
                    DType::U8 => Tensor::from_vec(
                        vec![2, 3, 7, 9],
                        v.iter().map(|x| (x * 31.0 + 128.0) as u8).collect(),
                    ),
                    _ => Tensor::from_vec(vec![2, 3, 7, 9], v.iter().map(|x| (x * 31.0) as i8).collect()),
                };
                let desc = check_graph(&g, &[x]);
                assert!(desc[0].starts_with(&format!("gpu maxpool {dtype}")), "{desc:?}");
                for sm in [80, 90] {
                    ptxas_check(&g, sm);
                }
            }
        }
    }

    #[test]
    fn ptxas_accepts_pool_kernels() {
        for kind in KINDS {
            let (g, _) = graph(
                &[1, 3, 9, 9],
                pool(kind, &[3, 3], &[2, 2], &[1, 1, 1, 1], &[], true),
                0,
            );
            for sm in [80, 90] {
                if !ptxas_check(&g, sm) {
                    return;
                }
            }
        }
    }
}
