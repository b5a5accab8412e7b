//! DeformConv on the GPU, with the library kernel's results (`kiln_uk_deform_conv` in misc.c):
//! a thread per output element sums, over its group's input channels and the taps (in that
//! order), the weight times X sampled bilinearly (zero outside) at the tap's position moved by
//! its offset, times the mask — in f64 from the bias, rounded once: the reference's order, so
//! the sums are the reference's. Each sample is computed by every output channel that reads
//! it, where the reference samples once into a column buffer; the arithmetic is the same.

use super::scalar::{load_local, load_real, store_real};
use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims};
use crate::target::TargetDesc;
use inkwell::values::{FloatValue, IntValue};
use inkwell::FloatPredicate;
use kiln_ir::{DType, Layout, Op, VisionOp};

const THREADS: u64 = 128;

/// One spatial axis: input extent, kernel, output extent, stride, dilation, padding before.
#[derive(Debug, Clone, Copy)]
struct Axis {
    input: i64,
    kernel: i64,
    output: i64,
    stride: i64,
    dilation: i64,
    pad: i64,
}

#[derive(Debug)]
struct DeformConvGpu {
    n: i64,
    c: i64,
    m: i64,
    group: i64,
    offset_group: i64,
    bias: bool,
    mask: bool,
    axes: Vec<Axis>,
    dtypes: [DType; 5],
}

/// The kernel for a DeformConv of static row-major float tensors, or None.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    if !matches!(node.op(), Op::Vision(VisionOp::DeformConv { .. })) {
        return Ok(None);
    }
    let plain = |t: &kiln_ir::TensorType| t.layout == Layout::RowMajor && t.is_static() && t.dtype.is_float();
    let mut dtypes = [DType::F32; 5];
    for (i, d) in dtypes.iter_mut().enumerate() {
        match node.input_type(i) {
            Some(t) if node.has_input(i) => {
                if !plain(t) {
                    return Ok(None);
                }
                *d = t.dtype;
            }
            _ if i < 3 => return Ok(None),
            _ => {}
        }
    }
    if !plain(node.output_type(0)) {
        return Ok(None);
    }
    let Some(call) = crate::uk::lower(node)? else {
        return Ok(None);
    };
    let at = &call.iattr;
    let axes = at[8..]
        .chunks(6)
        .map(|g| Axis {
            input: g[0],
            kernel: g[1],
            output: g[2],
            stride: g[3],
            dilation: g[4],
            pad: g[5],
        })
        .collect();
    Ok(Some(Box::new(DeformConvGpu {
        n: at[1],
        c: at[2],
        m: at[3],
        group: at[4],
        offset_group: at[5],
        bias: at[6] != 0,
        mask: at[7] != 0,
        axes,
        dtypes,
    })))
}

impl DeformConvGpu {
    fn points(&self) -> i64 {
        self.axes.iter().map(|a| a.output).product()
    }

    fn taps(&self) -> i64 {
        self.axes.iter().map(|a| a.kernel).product()
    }

    fn plane(&self) -> i64 {
        self.axes.iter().map(|a| a.input).product()
    }

    /// Plane `base` of X sampled at `pos` (one f64 per axis): every corner of the cell inside
    /// X weighted by the product of its fractions, as the reference's bilinear.
    fn sample<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        k: &GpuBuilder<'_, 'ctx>,
        base: IntValue<'ctx>,
        pos: &[FloatValue<'ctx>],
    ) -> Result<FloatValue<'ctx>> {
        let f64t = e.cx.f64_type();
        let x = k.input(0)?;
        let r = self.axes.len();
        let sum = e.entry_alloca(f64t, "sample")?;
        e.store(sum, f64t.const_zero())?;
        let mut cells = vec![];
        for p in pos {
            let f = e
                .intrinsic("llvm.floor", &[f64t.into()], &[(*p).into()])?
                .into_float_value();
            cells.push((f, e.b.build_float_sub(*p, f, "").map_err(llvm)?));
        }
        for corner in 0..(1usize << r) {
            let (mut flat, mut weight) = (e.i64c(0), f64t.const_float(1.0));
            let mut inside = e.cx.bool_type().const_all_ones();
            for (d, a) in self.axes.iter().enumerate() {
                let (f, t) = cells[d];
                let hi = (corner >> (r - 1 - d)) & 1 == 1;
                let i = match hi {
                    true => e.b.build_float_add(f, f64t.const_float(1.0), "").map_err(llvm)?,
                    false => f,
                };
                let ge = e.fcmp_scalar(FloatPredicate::OGE, i, f64t.const_zero())?;
                let lt = e.fcmp_scalar(FloatPredicate::OLT, i, f64t.const_float(a.input as f64))?;
                let here = e.b.build_and(ge, lt, "").map_err(llvm)?;
                inside = e.b.build_and(inside, here, "").map_err(llvm)?;
                // Clamped so that the index is valid whether or not the corner is inside.
                let safe = e.select_float(here, i, f64t.const_zero())?;
                let idx =
                    e.b.build_float_to_signed_int(safe, e.cx.i64_type(), "")
                        .map_err(llvm)?;
                flat = e.add(e.mulc(flat, a.input)?, idx)?;
                let factor = match hi {
                    true => t,
                    false => e.b.build_float_sub(f64t.const_float(1.0), t, "").map_err(llvm)?,
                };
                weight = e.b.build_float_mul(weight, factor, "").map_err(llvm)?;
            }
            e.if_then(inside, || {
                let v = load_real(e, x, self.dtypes[0], e.add(base, flat)?)?;
                let term = e.b.build_float_mul(weight, v, "").map_err(llvm)?;
                e.store(
                    sum,
                    e.b.build_float_add(load_local(e, sum)?, term, "").map_err(llvm)?,
                )
            })?;
        }
        load_local(e, sum)
    }
}

impl KernelCommon for DeformConvGpu {
    fn describe(&self) -> String {
        let out: Vec<i64> = self.axes.iter().map(|a| a.output).collect();
        format!(
            "gpu deformconv N={} C={} M={} out={out:?} taps={} group={} offset_group={}{}",
            self.n,
            self.c,
            self.m,
            self.taps(),
            self.group,
            self.offset_group,
            if self.mask { " +mask" } else { "" }
        )
    }
}

impl GpuKernel for DeformConvGpu {
    fn launch(&self) -> LaunchDims {
        LaunchDims::per_item((self.n * self.m * self.points()) as u64, THREADS)
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let f64t = k.cx.f64_type();
        let (w, off, y) = (k.input(1)?, k.input(2)?, k.output(0)?);
        let (points, taps, r) = (self.points(), self.taps(), self.axes.len() as i64);
        let (cg, mg, c_per_og) = (
            self.c / self.group,
            self.m / self.group,
            self.c / self.offset_group,
        );
        let acc = e.entry_alloca(f64t, "acc")?;
        k.grid_stride_loop((self.n * self.m * points) as u64, THREADS, |f| {
            let task = e.udivc(f, points)?;
            let p = e.uremc(f, points)?;
            let (b, oc) = (e.udivc(task, self.m)?, e.uremc(task, self.m)?);
            let grp = e.udivc(oc, mg)?;
            let outs: Vec<usize> = self.axes.iter().map(|a| a.output as usize).collect();
            let o = e.unravel(p, &outs)?;
            let start = match self.bias {
                true => load_real(&e, k.input(3)?, self.dtypes[3], oc)?,
                false => f64t.const_zero(),
            };
            e.store(acc, start)?;
            e.for_range(e.i64c(0), e.i64c(cg), 1, |ic| {
                let ch = e.add(e.mulc(grp, cg)?, ic)?;
                let o_grp = e.udivc(ch, c_per_og)?;
                let list = e.add(e.mulc(b, self.offset_group)?, o_grp)?;
                e.for_range(e.i64c(0), e.i64c(taps), 1, |t| {
                    let kernel: Vec<usize> = self.axes.iter().map(|a| a.kernel as usize).collect();
                    let tap = e.unravel(t, &kernel)?;
                    let mut pos = vec![];
                    for (d, a) in self.axes.iter().enumerate() {
                        let at = e.add(
                            e.mulc(
                                e.add(e.mulc(e.add(e.mulc(list, taps)?, t)?, r)?, e.i64c(d as i64))?,
                                points,
                            )?,
                            p,
                        )?;
                        let grid = e.sub(
                            e.add(e.mulc(o[d], a.stride)?, e.mulc(tap[d], a.dilation)?)?,
                            e.i64c(a.pad),
                        )?;
                        let grid = e.b.build_signed_int_to_float(grid, f64t, "").map_err(llvm)?;
                        let shift = load_real(&e, off, self.dtypes[2], at)?;
                        pos.push(e.b.build_float_add(grid, shift, "").map_err(llvm)?);
                    }
                    let mut s =
                        self.sample(&e, k, e.mulc(e.add(e.mulc(b, self.c)?, ch)?, self.plane())?, &pos)?;
                    if self.mask {
                        let at = e.add(e.mulc(e.add(e.mulc(list, taps)?, t)?, points)?, p)?;
                        let scale = load_real(&e, k.input(4)?, self.dtypes[4], at)?;
                        s = e.b.build_float_mul(s, scale, "").map_err(llvm)?;
                    }
                    let wv = load_real(
                        &e,
                        w,
                        self.dtypes[1],
                        e.add(e.mulc(e.add(e.mulc(oc, cg)?, ic)?, taps)?, t)?,
                    )?;
                    let term = e.b.build_float_mul(wv, s, "").map_err(llvm)?;
                    e.store(
                        acc,
                        e.b.build_float_add(load_local(&e, acc)?, term, "")
                            .map_err(llvm)?,
                    )
                })
            })?;
            store_real(&e, y, self.dtypes[0], f, load_local(&e, acc)?)
        })?;
        k.ret()
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check};
    use kiln_ir::{DType, Graph, Op, Tensor, TensorType, VisionOp};

    fn values(n: usize, seed: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i * 7919 + seed * 104729) % 2003) as f32 / 1001.5 - 1.0) * scale)
            .collect()
    }

    /// DeformConv of X [1, 4, 5, 6] by W [6, 2, 3, 3] in 2 groups, 2 offset groups, padding 1,
    /// offsets of up to ±2.5 pixels (corners outside X), with or without a mask and a bias.
    fn graph(mask: bool, bias: bool) -> (Graph, Vec<Tensor>) {
        let mut g = Graph::new("t");
        let shapes: [(&str, Vec<usize>); 5] = [
            ("x", vec![1, 4, 5, 6]),
            ("w", vec![6, 2, 3, 3]),
            ("offset", vec![1, 36, 5, 6]),
            ("b", vec![6]),
            ("mask", vec![1, 18, 5, 6]),
        ];
        let mut ids = vec![];
        let mut inputs = vec![];
        for (i, (name, shape)) in shapes.iter().enumerate() {
            let present = i < 3 || (i == 3 && bias) || (i == 4 && mask);
            if !present {
                ids.push(None);
                continue;
            }
            ids.push(Some(g.add_input(*name, TensorType::fixed(DType::F32, shape))));
            let scale = if i == 2 { 2.5 } else { 1.0 };
            inputs.push(Tensor::from_vec(
                shape.clone(),
                values(shape.iter().product(), i, scale),
            ));
        }
        let op = Op::Vision(VisionOp::DeformConv {
            kernel_shape: vec![],
            strides: vec![1, 1],
            pads: vec![1, 1, 1, 1],
            dilations: vec![1, 1],
            group: 2,
            offset_group: 2,
        });
        let y = g.add("deform", op, ids, "y").unwrap();
        g.add_output("y", y);
        (g, inputs)
    }

    #[test]
    fn samples_and_sums_as_the_reference() {
        for (mask, bias) in [(true, true), (false, false), (true, false)] {
            let (g, inputs) = graph(mask, bias);
            let d = check_graph(&g, &inputs);
            assert!(d[0].starts_with("gpu deformconv"), "{d:?}");
        }
        let (g, _) = graph(true, true);
        for sm in [80, 90] {
            ptxas_check(&g, sm);
        }
    }
}
