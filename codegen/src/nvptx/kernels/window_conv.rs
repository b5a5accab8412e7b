//! Convolutions computed a thread per output element on the GPU, for what the implicit-GEMM
//! kernel (`gemm`) does not take: ConvTranspose (1 to 3 spatial axes), Conv with three
//! spatial axes (video and volumetric models) and Conv whose weights are computed at run time. NCHW f32, groups, strides, dilations, and the
//! pads `uk::nn` resolves for `kiln_uk_conv` / `kiln_uk_conv_transpose` (`output_padding`,
//! `output_shape`, `auto_pad`).
//!
//! One thread per output element (grid-stride, 256-thread blocks, the innermost axis on
//! consecutive threads) sums, over the input channels of its group and the kernel taps, the
//! input element a tap reaches times its weight, then adds the bias. A convolution reads
//! `x[o·stride − pad + k·dilation]` where that lies inside the input. A transposed one
//! scatters each input element over a window of the output; as a gather it reads
//! `x[(o + pad − k·dilation) / stride]` wherever that division is exact and inside the input.
//! The taps are unrolled (at most `MAX_TAPS`), the channels a loop. f32 sums in f32, like the
//! library kernels, in another summation order; f16, bf16 and f64 (exports of causal and
//! depthwise 1-D convolutions in half precision) sum in f64 and round once.

use super::scalar::{load_real, store_real};
use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims};
use crate::target::TargetDesc;
use inkwell::IntPredicate;
use kiln_ir::{DType, Layout, Op};

const THREADS: u64 = 256;
/// Kernel taps unrolled per channel (a 5×5×5 window); larger windows stay with the library.
const MAX_TAPS: usize = 125;

/// One spatial axis, as the library kernels read it.
#[derive(Debug, Clone, Copy)]
struct Axis {
    kernel: usize,
    stride: usize,
    dilation: usize,
    pad_begin: i64,
    input: usize,
    output: usize,
}

#[derive(Debug)]
struct WindowConv {
    /// ConvTranspose (W `[C, M/groups, k...]`) rather than Conv (W `[M, C/groups, k...]`).
    transposed: bool,
    batch: usize,
    /// Input channels, output channels, groups.
    c: usize,
    m: usize,
    groups: usize,
    axes: Vec<Axis>,
    bias: bool,
    dtype: DType,
}

/// The kernel for a float ConvTranspose, 3-D Conv or Conv of run-time weights, or None (other
/// dtypes, layouts, ranks, windows too large).
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    let transposed = match node.op() {
        Op::ConvTranspose(_) => true,
        // 3-D, and any Conv whose weights arrive at run time (the implicit GEMM packs constant
        // weights only): models that compute their filters, ONNX's node tests.
        Op::Conv(a)
            if !a.channels_last
                && node
                    .input_type(0)
                    .is_some_and(|t| t.rank() == 5 || (t.rank() >= 3 && node.known(1).is_none())) =>
        {
            false
        }
        _ => return Ok(None),
    };
    if node.n_outputs() != 1 {
        return Ok(None);
    }
    let dtype = node.output_type(0).dtype;
    let row_major = |t: Option<&kiln_ir::TensorType>| {
        t.is_some_and(|t| t.dtype == dtype && t.layout == Layout::RowMajor && t.is_static())
    };
    let bias = node.has_input(2);
    if !dtype.is_float()
        || !row_major(node.input_type(0))
        || !row_major(node.input_type(1))
        || (bias && !row_major(node.input_type(2)))
        || !row_major(Some(node.output_type(0)))
    {
        return Ok(None);
    }
    let Some(call) = crate::uk::lower(node)? else {
        return Ok(None);
    };
    let (x, y, w) = (node.input_shape(0)?, node.output_shape(0)?, node.input_shape(1)?);
    let at = &call.iattr;
    let (groups, n) = (at[0] as usize, at[1] as usize);
    if n != x.len() - 2 || groups == 0 {
        return Ok(None);
    }
    let axes: Vec<Axis> = (0..n)
        .map(|d| {
            let a = &at[2 + 5 * d..7 + 5 * d];
            Axis {
                kernel: a[0] as usize,
                stride: a[1] as usize,
                dilation: a[2] as usize,
                pad_begin: a[3],
                input: x[2 + d],
                output: y[2 + d],
            }
        })
        .collect();
    let taps: usize = axes.iter().map(|a| a.kernel).product();
    let (c, m) = (x[1], y[1]);
    // W's first two extents: [C, M/groups] transposed, [M, C/groups] otherwise.
    let w_ok = if transposed {
        w.get(..2) == Some(&[c, m / groups.max(1)][..])
    } else {
        w.get(..2) == Some(&[m, c / groups.max(1)][..])
    };
    if taps == 0
        || taps > MAX_TAPS
        || c % groups != 0
        || m % groups != 0
        || !w_ok
        || axes.iter().any(|a| a.stride == 0 || a.dilation == 0)
        || y.iter().product::<usize>() >= 1 << 40
    {
        return Ok(None);
    }
    Ok(Some(Box::new(WindowConv {
        transposed,
        batch: x[0],
        c,
        m,
        groups,
        axes,
        bias,
        dtype,
    })))
}

impl WindowConv {
    fn total(&self) -> u64 {
        (self.batch * self.m * self.axes.iter().map(|a| a.output).product::<usize>()) as u64
    }
}

impl KernelCommon for WindowConv {
    fn describe(&self) -> String {
        let k: Vec<String> = self.axes.iter().map(|a| a.kernel.to_string()).collect();
        let s: Vec<String> = self.axes.iter().map(|a| a.stride.to_string()).collect();
        format!(
            "gpu {}{}/{} C={} M={} groups={}{}",
            if self.transposed {
                "conv_transpose"
            } else {
                "direct conv"
            },
            k.join("x"),
            s.join("x"),
            self.c,
            self.m,
            self.groups,
            match self.dtype {
                DType::F32 => String::new(),
                d => format!(" {d}"),
            }
        )
    }
}

impl GpuKernel for WindowConv {
    fn launch(&self) -> LaunchDims {
        LaunchDims::per_item(self.total(), THREADS)
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let (x, w, y) = (k.input(0)?, k.input(1)?, k.output(0)?);
        let bias = if self.bias { Some(k.input(2)?) } else { None };
        let (cg, mg) = (self.c / self.groups, self.m / self.groups);
        let in_plane: usize = self.axes.iter().map(|a| a.input).product();
        let taps: usize = self.axes.iter().map(|a| a.kernel).product();
        // f32 sums in f32; the other floats in f64, loaded widened and rounded once.
        let wide = self.dtype != DType::F32;
        let load = |p, i| match wide {
            true => load_real(&e, p, self.dtype, i),
            false => e.load_f32(e.gep_f32(p, i)?),
        };
        let acc_type = if wide { k.cx.f64_type() } else { k.cx.f32_type() };
        let acc = e.entry_alloca(acc_type, "acc")?;
        let load_acc = || -> Result<_> {
            Ok(e.b
                .build_load(acc_type, acc, "")
                .map_err(llvm)?
                .into_float_value())
        };
        k.grid_stride_loop(self.total(), THREADS, |i| {
            // (n, m, o[spatial]) of the output element.
            let mut dims = vec![self.batch, self.m];
            dims.extend(self.axes.iter().map(|a| a.output));
            let coord = e.unravel(i, &dims)?;
            let (n, m, o) = (coord[0], coord[1], &coord[2..]);
            let g = e.udivc(m, mg as i64)?;
            let init = match bias {
                Some(b) => load(b, m)?,
                None => acc_type.const_zero(),
            };
            e.store(acc, init)?;
            e.for_range(e.i64c(0), e.i64c(cg as i64), 1, |cc| {
                let ch = e.add(e.mulc(g, cg as i64)?, cc)?;
                let x_base = e.mulc(e.add(e.mulc(n, self.c as i64)?, ch)?, in_plane as i64)?;
                let w_row = if self.transposed {
                    e.add(e.mulc(ch, mg as i64)?, e.uremc(m, mg as i64)?)?
                } else {
                    e.add(e.mulc(m, cg as i64)?, cc)?
                };
                let w_base = e.mulc(w_row, taps as i64)?;
                for tap in 0..taps {
                    // The tap's position on each axis, the last fastest.
                    let mut kk = vec![0usize; self.axes.len()];
                    let mut r = tap;
                    for (d, a) in self.axes.iter().enumerate().rev() {
                        kk[d] = r % a.kernel;
                        r /= a.kernel;
                    }
                    let mut valid = k.cx.bool_type().const_int(1, false);
                    let mut off = e.i64c(0);
                    for (d, a) in self.axes.iter().enumerate() {
                        let reach = (kk[d] * a.dilation) as i64;
                        let pos = if self.transposed {
                            // t = o + pad − k·dilation; the input position is t / stride.
                            let t = e.addc(o[d], a.pad_begin - reach)?;
                            let nonneg = e.icmp(IntPredicate::SGE, t, e.i64c(0))?;
                            valid = e.b.build_and(valid, nonneg, "").map_err(llvm)?;
                            if a.stride == 1 {
                                t
                            } else {
                                let exact =
                                    e.icmp(IntPredicate::EQ, e.uremc(t, a.stride as i64)?, e.i64c(0))?;
                                valid = e.b.build_and(valid, exact, "").map_err(llvm)?;
                                e.udivc(t, a.stride as i64)?
                            }
                        } else {
                            // o·stride − pad + k·dilation (a negative one fails the bound).
                            e.addc(e.mulc(o[d], a.stride as i64)?, reach - a.pad_begin)?
                        };
                        let inside = e.icmp(IntPredicate::ULT, pos, e.i64c(a.input as i64))?;
                        valid = e.b.build_and(valid, inside, "").map_err(llvm)?;
                        off = e.add(e.mulc(off, a.input as i64)?, pos)?;
                    }
                    e.if_then(valid, || {
                        let xv = load(x, e.add(x_base, off)?)?;
                        let wv = load(w, e.addc(w_base, tap as i64)?)?;
                        let prod = e.b.build_float_mul(xv, wv, "").map_err(llvm)?;
                        let sum = e.b.build_float_add(load_acc()?, prod, "").map_err(llvm)?;
                        e.store(acc, sum)
                    })?;
                }
                Ok(())
            })?;
            match wide {
                true => store_real(&e, y, self.dtype, i, load_acc()?),
                false => e.store(e.gep_f32(y, i)?, load_acc()?),
            }
        })?;
        k.ret()
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check};
    use kiln_ir::{AutoPad, ConvAttrs, ConvTransposeAttrs, DType, Graph, Op, Tensor, TensorType};

    fn attrs(
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

    /// `op(x, w, b?)` with x of shape `x`, weights of shape `w`, `m` output channels.
    fn graph(op: Op, x: &[usize], w: Vec<usize>, m: usize, bias: bool) -> (Graph, Vec<Tensor>) {
        let values = |n: usize, f: fn(usize) -> f32| (0..n).map(f).collect::<Vec<f32>>();
        let mut g = Graph::new("t");
        let xv = g.add_input("x", TensorType::fixed(DType::F32, x));
        let xt = Tensor::from_vec(
            x.to_vec(),
            values(x.iter().product(), |i| ((i * 29) % 17) as f32 * 0.25 - 2.0),
        );
        let nw: usize = w.iter().product();
        let wv = g.add_const(
            "w",
            Tensor::from_vec(w, values(nw, |i| ((i * 13) % 11) as f32 * 0.1 - 0.5)),
        );
        let bv = bias.then(|| {
            g.add_const(
                "b",
                Tensor::from_vec(vec![m], values(m, |i| i as f32 * 0.3 - 1.0)),
            )
        });
        let y = g.add("conv", op, vec![Some(xv), Some(wv), bv], "y").unwrap();
        g.add_output("y", y);
        (g, vec![xt])
    }

    fn check(g: &Graph, inputs: &[Tensor], what: &str) {
        let describes = check_graph(g, inputs);
        assert!(describes.iter().all(|d| d.starts_with(what)), "{describes:?}");
    }

    /// A case: x's shape, output channels, kernel, strides, pads, dilations, output padding
    /// (transposed only), groups, bias.
    struct Case {
        x: &'static [usize],
        m: usize,
        k: &'static [usize],
        s: &'static [usize],
        p: &'static [usize],
        d: &'static [usize],
        op: &'static [usize],
        group: usize,
        bias: bool,
    }

    impl Case {
        fn transposed(&self) -> (Graph, Vec<Tensor>) {
            let mut w = vec![self.x[1], self.m / self.group];
            w.extend(self.k);
            let op = Op::ConvTranspose(ConvTransposeAttrs {
                conv: attrs(self.k, self.s, self.p, self.d, self.group),
                output_padding: self.op.to_vec(),
                output_shape: vec![],
            });
            graph(op, self.x, w, self.m, self.bias)
        }

        fn direct(&self) -> (Graph, Vec<Tensor>) {
            let mut w = vec![self.m, self.x[1] / self.group];
            w.extend(self.k);
            let op = Op::Conv(attrs(self.k, self.s, self.p, self.d, self.group));
            graph(op, self.x, w, self.m, self.bias)
        }
    }

    #[test]
    fn transposed_convolutions() {
        // 2× upsampling (a segmentation decoder's), stride 2 with pads and output padding,
        // dilation, groups, 1-D and 3-D, no bias.
        #[rustfmt::skip]
        let cases = [
            Case { x: &[1, 4, 5, 6], m: 3, k: &[2, 2], s: &[2, 2], p: &[0, 0, 0, 0], d: &[1, 1], op: &[], group: 1, bias: true },
            Case { x: &[2, 3, 4, 4], m: 5, k: &[3, 3], s: &[2, 2], p: &[1, 1, 1, 1], d: &[1, 1], op: &[1, 1], group: 1, bias: true },
            Case { x: &[1, 2, 5, 4], m: 2, k: &[3, 2], s: &[1, 2], p: &[0, 1, 2, 0], d: &[2, 1], op: &[], group: 1, bias: false },
            Case { x: &[1, 6, 3, 5], m: 4, k: &[3, 3], s: &[2, 1], p: &[1, 0, 1, 0], d: &[1, 1], op: &[1, 0], group: 2, bias: true },
            Case { x: &[2, 3, 9], m: 4, k: &[4], s: &[3], p: &[1, 2], d: &[1], op: &[], group: 1, bias: true },
            Case { x: &[1, 2, 3, 3, 2], m: 3, k: &[2, 2, 2], s: &[2, 2, 2], p: &[0, 0, 0, 0, 0, 0], d: &[1, 1, 1], op: &[], group: 1, bias: true },
        ];
        for c in &cases {
            let (g, inputs) = c.transposed();
            check(&g, &inputs, "gpu conv_transpose");
        }
        for sm in [80, 90] {
            ptxas_check(&cases[0].transposed().0, sm);
        }
    }

    #[test]
    fn three_d_convolutions() {
        // Padded 3×3×3, strided and dilated, grouped, no bias.
        #[rustfmt::skip]
        let cases = [
            Case { x: &[1, 2, 4, 5, 5], m: 3, k: &[3, 3, 3], s: &[1, 1, 1], p: &[1, 1, 1, 1, 1, 1], d: &[1, 1, 1], op: &[], group: 1, bias: true },
            Case { x: &[2, 3, 6, 5, 7], m: 4, k: &[2, 3, 2], s: &[2, 1, 2], p: &[0, 1, 1, 1, 0, 0], d: &[1, 2, 1], op: &[], group: 1, bias: true },
            Case { x: &[1, 4, 3, 4, 4], m: 6, k: &[1, 3, 3], s: &[1, 2, 2], p: &[0, 1, 1, 0, 1, 1], d: &[1, 1, 1], op: &[], group: 2, bias: false },
        ];
        for c in &cases {
            let (g, inputs) = c.direct();
            check(&g, &inputs, "gpu direct conv");
        }
        for sm in [80, 90] {
            ptxas_check(&cases[0].direct().0, sm);
        }
    }

    /// f16, bf16 and f64 tensors, summed in f64 and rounded once: the depthwise causal 1-D
    /// convolution of half-precision exports (weights at run time) and a transposed one.
    #[test]
    fn half_and_double_precision() {
        let values = |n: usize, seed: usize| -> Vec<f64> {
            (0..n)
                .map(|i| ((i * 29 + seed) % 17) as f64 * 0.125 - 1.0)
                .collect()
        };
        for dtype in [DType::F16, DType::BF16, DType::F64] {
            let tensor = |shape: &[usize], seed| {
                let n = shape.iter().product();
                Tensor::from_vec(shape.to_vec(), values(n, seed)).cast(dtype)
            };
            let mut g = Graph::new("t");
            let (xs, ws) = ([2, 4, 11], [4, 1, 4]);
            let x = g.add_input("x", TensorType::fixed(dtype, &xs));
            let w = g.add_input("w", TensorType::fixed(dtype, &ws));
            let b = g.add_const("b", tensor(&[4], 3));
            let op = Op::Conv(attrs(&[4], &[1], &[3, 0], &[1], 4));
            let y = g.add("conv", op, vec![Some(x), Some(w), Some(b)], "y").unwrap();
            g.add_output("y", y);
            let d = check_graph(&g, &[tensor(&xs, 1), tensor(&ws, 2)]);
            assert!(
                d[0].starts_with("gpu direct conv4/1") && d[0].contains(dtype.name()),
                "{d:?}"
            );

            let mut g = Graph::new("t");
            let x = g.add_input("x", TensorType::fixed(dtype, &[1, 3, 4, 5]));
            let w = g.add_const("w", tensor(&[3, 2, 3, 3], 4));
            let op = Op::ConvTranspose(ConvTransposeAttrs {
                conv: attrs(&[3, 3], &[2, 2], &[1, 1, 1, 1], &[1, 1], 1),
                output_padding: vec![1, 1],
                output_shape: vec![],
            });
            let y = g.add("conv", op, vec![Some(x), Some(w)], "y").unwrap();
            g.add_output("y", y);
            check(&g, &[tensor(&[1, 3, 4, 5], 5)], "gpu conv_transpose");
            ptxas_check(&g, 80);
        }
    }

    /// Conv whose weights (and bias) are graph inputs: the implicit GEMM packs constant
    /// weights only, so 1-D and 2-D convolutions with run-time filters come here.
    #[test]
    fn convolutions_with_run_time_weights() {
        #[rustfmt::skip]
        let cases = [
            Case { x: &[1, 3, 7, 6], m: 4, k: &[3, 3], s: &[1, 1], p: &[1, 1, 1, 1], d: &[1, 1], op: &[], group: 1, bias: true },
            Case { x: &[2, 4, 9, 8], m: 6, k: &[3, 2], s: &[2, 1], p: &[0, 1, 1, 0], d: &[1, 2], op: &[], group: 2, bias: false },
            Case { x: &[1, 2, 11], m: 3, k: &[4], s: &[2], p: &[3, 0], d: &[1], op: &[], group: 1, bias: true },
        ];
        for c in &cases {
            let (g, mut inputs) = c.direct();
            // The same graph with W and B as inputs holding the constants' values.
            let mut h = Graph::new("t");
            let mut args = vec![Some(h.add_input("x", g.value_type(g.inputs()[0].out(0)).clone()))];
            let conv = g
                .node_ids()
                .find(|&id| matches!(g.node(id).op, Op::Conv(_)))
                .unwrap();
            for (i, name) in [(1, "w"), (2, "b")] {
                let Some(v) = g.node(conv).inputs.get(i).copied().flatten() else {
                    continue;
                };
                args.push(Some(h.add_input(name, g.value_type(v).clone())));
                inputs.push(g.known_value(v).unwrap().clone());
            }
            let y = h.add("conv", g.node(conv).op.clone(), args, "y").unwrap();
            h.add_output("y", y);
            check(&h, &inputs, "gpu direct conv");
            for sm in [80, 90] {
                ptxas_check(&h, sm);
            }
        }
    }
}
