//! DFT and STFT on the GPU, a thread per output frequency.
//!
//! Ports of the library kernels (`kiln_uk_dft`, `kiln_uk_stft` in misc.c) with their
//! parameters and twiddle table from the same lowering (`uk::lower`): each output value is the
//! direct sum `Σ_j x[j]·w^(k·j)` in f64, in the library's order, over the exact unit roots
//! kiln_ir computes (a packed constant of `(re, im)` f64 pairs), the power `k·j mod n` kept
//! reduced as it steps. A thread reads its signal once per frequency — O(n²) work for a
//! transform of length n, as the library does; an FFT would be the next step for long
//! transforms. The DFT's input is read as the library buffers it: the first `take` values
//! along the axis (zeros past them), and for a one-sided inverse (irfft) the missing half
//! rebuilt by conjugate symmetry; the inverse is scaled by `1/n`.

use super::scalar::{load_local, load_real, store_real};
use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::{KernelCommon, PackedConst};
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims};
use crate::target::TargetDesc;
use inkwell::values::{FloatValue, IntValue};
use inkwell::IntPredicate;
use kiln_ir::{DType, Layout, Op, SignalOp};

const THREADS: u64 = 128;

#[derive(Debug)]
enum Transform {
    /// iattr of `kiln_uk_dft`: n, n_in, out_len, c_in, c_out, outer, inner, take, irfft,
    /// inverse.
    Dft {
        n_in: usize,
        out_len: usize,
        c_in: usize,
        c_out: usize,
        outer: usize,
        inner: usize,
        take: usize,
        irfft: bool,
        inverse: bool,
    },
    /// iattr of `kiln_uk_stft`: batch, len, c, fl (= n), step, frames, bins.
    Stft {
        batch: usize,
        len: usize,
        c: usize,
        step: usize,
        frames: usize,
        bins: usize,
        window: bool,
    },
}

#[derive(Debug)]
struct SpectralGpu {
    transform: Transform,
    /// The transform length (the DFT's n, the STFT's frame length).
    n: usize,
    x_dtype: DType,
    window_dtype: DType,
    y_dtype: DType,
    twiddles: Vec<PackedConst>,
}

/// The kernel for a DFT or STFT node of static row-major float tensors, or None.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    if !matches!(
        node.op(),
        Op::Signal(SignalOp::Dft { .. } | SignalOp::Stft { .. })
    ) {
        return Ok(None);
    }
    let float = |t: Option<&kiln_ir::TensorType>| {
        t.filter(|t| t.dtype.is_float() && t.layout == Layout::RowMajor && t.is_static())
            .map(|t| t.dtype)
    };
    let (Some(x_dtype), Some(y_dtype)) = (float(node.input_type(0)), float(Some(node.output_type(0)))) else {
        return Ok(None);
    };
    let Some(call) = crate::uk::lower(node)? else {
        return Ok(None);
    };
    let p: Vec<usize> = call.iattr.iter().map(|&v| v as usize).collect();
    let (transform, n, window_dtype) = match call.symbol {
        "dft" => (
            Transform::Dft {
                n_in: p[1],
                out_len: p[2],
                c_in: p[3],
                c_out: p[4],
                outer: p[5],
                inner: p[6],
                take: p[7],
                irfft: p[8] != 0,
                inverse: p[9] != 0,
            },
            p[0],
            x_dtype,
        ),
        "stft" => {
            let window = node.has_input(2);
            let window_dtype = match window {
                true => match float(node.input_type(2)) {
                    Some(d) => d,
                    None => return Ok(None),
                },
                false => x_dtype,
            };
            (
                Transform::Stft {
                    batch: p[0],
                    len: p[1],
                    c: p[2],
                    step: p[4],
                    frames: p[5],
                    bins: p[6],
                    window,
                },
                p[3],
                window_dtype,
            )
        }
        _ => return Ok(None),
    };
    let bytes = call.fattr.iter().flat_map(|v| v.to_le_bytes()).collect();
    Ok(Some(Box::new(SpectralGpu {
        transform,
        n,
        x_dtype,
        window_dtype,
        y_dtype,
        twiddles: vec![PackedConst { bytes }],
    })))
}

impl SpectralGpu {
    /// Output frequencies (complex values) of the node.
    fn outputs(&self) -> usize {
        match self.transform {
            Transform::Dft {
                outer,
                inner,
                out_len,
                ..
            } => outer * inner * out_len,
            Transform::Stft {
                batch, frames, bins, ..
            } => batch * frames * bins,
        }
    }

    /// `Σ_j x(j)·w^(k·j)` for j in 0..n, where `x(j)` gives the (re, im) of signal value j.
    fn direct_sum<'ctx>(
        &self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        freq: IntValue<'ctx>,
        x: impl Fn(IntValue<'ctx>) -> Result<(FloatValue<'ctx>, FloatValue<'ctx>)>,
    ) -> Result<(FloatValue<'ctx>, FloatValue<'ctx>)> {
        let (f64t, i64t) = (e.cx.f64_type(), e.cx.i64_type());
        let n = self.n as i64;
        let tw = k.packed(0)?;
        let twiddle = |i: IntValue<'ctx>| -> Result<FloatValue<'ctx>> { load_real(e, tw, DType::F64, i) };
        let (re, im, power) = (
            e.entry_alloca(f64t, "re")?,
            e.entry_alloca(f64t, "im")?,
            e.entry_alloca(i64t, "power")?,
        );
        e.store(re, f64t.const_zero())?;
        e.store(im, f64t.const_zero())?;
        e.store(power, e.i64c(0))?;
        let step = e.uremc(freq, n)?;
        let fmul = |a, b| e.b.build_float_mul(a, b, "").map_err(llvm);
        e.for_range(e.i64c(0), e.i64c(n), 1, |j| {
            let (br, bi) = x(j)?;
            let pw = e.b.build_load(i64t, power, "").map_err(llvm)?.into_int_value();
            let (wr, wi) = (twiddle(e.mulc(pw, 2)?)?, twiddle(e.addc(e.mulc(pw, 2)?, 1)?)?);
            let dr =
                e.b.build_float_sub(fmul(br, wr)?, fmul(bi, wi)?, "")
                    .map_err(llvm)?;
            let di =
                e.b.build_float_add(fmul(br, wi)?, fmul(bi, wr)?, "")
                    .map_err(llvm)?;
            e.store(re, e.b.build_float_add(load_local(e, re)?, dr, "").map_err(llvm)?)?;
            e.store(im, e.b.build_float_add(load_local(e, im)?, di, "").map_err(llvm)?)?;
            // power = (power + k) mod n, both below n.
            let next = e.add(pw, step)?;
            let wrapped = e.icmp(IntPredicate::UGE, next, e.i64c(n))?;
            e.store(power, e.select_int(wrapped, e.sub(next, e.i64c(n))?, next)?)
        })?;
        Ok((load_local(e, re)?, load_local(e, im)?))
    }
}

impl KernelCommon for SpectralGpu {
    fn describe(&self) -> String {
        match self.transform {
            Transform::Dft { inverse, irfft, .. } => format!(
                "gpu dft n={} outputs={}{}",
                self.n,
                self.outputs(),
                match (inverse, irfft) {
                    (true, true) => " irfft",
                    (true, false) => " inverse",
                    _ => "",
                }
            ),
            Transform::Stft { frames, bins, .. } => {
                format!("gpu stft frame={} frames={frames} bins={bins}", self.n)
            }
        }
    }

    fn packed_constants(&self) -> &[PackedConst] {
        &self.twiddles
    }

    fn release_packed_constants(&mut self) {
        PackedConst::release_all(&mut self.twiddles);
    }
}

impl GpuKernel for SpectralGpu {
    fn launch(&self) -> LaunchDims {
        LaunchDims::per_item(self.outputs() as u64, THREADS)
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        match self.transform {
            Transform::Dft { .. } => self.emit_dft(k, &e)?,
            Transform::Stft { .. } => self.emit_stft(k, &e)?,
        }
        k.ret()
    }
}

impl SpectralGpu {
    fn emit_dft<'ctx>(&self, k: &GpuBuilder<'_, 'ctx>, e: &Emit<'_, 'ctx>) -> Result<()> {
        let Transform::Dft {
            n_in,
            out_len,
            c_in,
            c_out,
            inner,
            take,
            irfft,
            inverse,
            ..
        } = self.transform
        else {
            return Ok(());
        };
        let f64t = e.cx.f64_type();
        let (x, y) = (k.input(0)?, k.output(0)?);
        let n = self.n as i64;
        k.grid_stride_loop(self.outputs() as u64, THREADS, |idx| {
            // idx = (o·out_len + freq)·inner + i.
            let i = e.uremc(idx, inner as i64)?;
            let freq = e.uremc(e.udivc(idx, inner as i64)?, out_len as i64)?;
            let o = e.udivc(idx, (inner * out_len) as i64)?;
            // Signal value j as read: the input's first `take` values, zeros after them.
            let read = |j: IntValue<'ctx>| -> Result<(FloatValue<'ctx>, FloatValue<'ctx>)> {
                let inside = e.icmp(IntPredicate::ULT, j, e.i64c(take as i64))?;
                let safe = e.select_int(inside, j, e.i64c(0))?;
                let row = e.add(e.mulc(e.add(e.mulc(o, n_in as i64)?, safe)?, inner as i64)?, i)?;
                let at = e.mulc(row, c_in as i64)?;
                let re = load_real(e, x, self.x_dtype, at)?;
                let im = match c_in {
                    2 => load_real(e, x, self.x_dtype, e.addc(at, 1)?)?,
                    _ => f64t.const_zero(),
                };
                Ok((
                    e.select_float(inside, re, f64t.const_zero())?,
                    e.select_float(inside, im, f64t.const_zero())?,
                ))
            };
            let value = |j: IntValue<'ctx>| -> Result<(FloatValue<'ctx>, FloatValue<'ctx>)> {
                if !irfft {
                    return read(j);
                }
                // Past the middle, the conjugate of value n - j when that was read.
                let mirror = e.sub(e.i64c(n), j)?;
                let read_mirror =
                    e.b.build_and(
                        e.icmp(IntPredicate::UGE, mirror, e.i64c(1))?,
                        e.icmp(IntPredicate::ULT, mirror, e.i64c(take as i64))?,
                        "",
                    )
                    .map_err(llvm)?;
                let past_middle = e.icmp(IntPredicate::UGT, j, e.i64c(n / 2))?;
                let rebuilt = e.b.build_and(past_middle, read_mirror, "").map_err(llvm)?;
                let (re, im) = read(e.select_int(rebuilt, mirror, j)?)?;
                let conj = e.b.build_float_neg(im, "").map_err(llvm)?;
                Ok((re, e.select_float(rebuilt, conj, im)?))
            };
            let (mut re, mut im) = self.direct_sum(k, e, freq, value)?;
            if inverse {
                let scale = f64t.const_float(1.0 / self.n as f64);
                re = e.b.build_float_mul(re, scale, "").map_err(llvm)?;
                im = e.b.build_float_mul(im, scale, "").map_err(llvm)?;
            }
            let at = e.mulc(idx, c_out as i64)?;
            store_real(e, y, self.y_dtype, at, re)?;
            if c_out == 2 {
                store_real(e, y, self.y_dtype, e.addc(at, 1)?, im)?;
            }
            Ok(())
        })
    }

    fn emit_stft<'ctx>(&self, k: &GpuBuilder<'_, 'ctx>, e: &Emit<'_, 'ctx>) -> Result<()> {
        let Transform::Stft {
            len,
            c,
            step,
            frames,
            bins,
            window,
            ..
        } = self.transform
        else {
            return Ok(());
        };
        let f64t = e.cx.f64_type();
        let (x, y) = (k.input(0)?, k.output(0)?);
        k.grid_stride_loop(self.outputs() as u64, THREADS, |idx| {
            // idx = (b·frames + f)·bins + freq.
            let freq = e.uremc(idx, bins as i64)?;
            let bf = e.udivc(idx, bins as i64)?;
            let f = e.uremc(bf, frames as i64)?;
            let b = e.udivc(bf, frames as i64)?;
            let start = e.add(e.mulc(b, len as i64)?, e.mulc(f, step as i64)?)?;
            let value = |t: IntValue<'ctx>| -> Result<(FloatValue<'ctx>, FloatValue<'ctx>)> {
                let at = e.mulc(e.add(start, t)?, c as i64)?;
                let w = match window {
                    true => load_real(e, k.input(2)?, self.window_dtype, t)?,
                    false => f64t.const_float(1.0),
                };
                let re = load_real(e, x, self.x_dtype, at)?;
                let im = match c {
                    2 => load_real(e, x, self.x_dtype, e.addc(at, 1)?)?,
                    _ => f64t.const_zero(),
                };
                Ok((
                    e.b.build_float_mul(re, w, "").map_err(llvm)?,
                    e.b.build_float_mul(im, w, "").map_err(llvm)?,
                ))
            };
            let (re, im) = self.direct_sum(k, e, freq, value)?;
            let at = e.mulc(idx, 2)?;
            store_real(e, y, self.y_dtype, at, re)?;
            store_real(e, y, self.y_dtype, e.addc(at, 1)?, im)
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check};
    use crate::test_rng::TestRng;
    use kiln_ir::{DType, Graph, Op, SignalOp, Tensor, TensorType, ValueId};

    /// A DFT of an `x_shape` f32 input along `axis`, `dft_length` given or not.
    fn dft(
        x_shape: &[usize],
        axis: i64,
        length: Option<i64>,
        inverse: bool,
        onesided: bool,
    ) -> (Graph, Vec<Tensor>) {
        let mut rng = TestRng::new(x_shape.iter().product::<usize>() as u64);
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, x_shape));
        let len = length.map(|l| g.add_const("len", Tensor::scalar(l)));
        let ax = g.add_const("axis", Tensor::scalar(axis));
        let op = Op::Signal(SignalOp::Dft { inverse, onesided });
        let y = g.add("dft", op, vec![Some(x), len, Some(ax)], "y").unwrap();
        g.add_output("y", y);
        let xv = Tensor::from_vec(x_shape.to_vec(), rng.vec_scaled(x_shape.iter().product(), 2.0));
        (g, vec![xv])
    }

    fn check(case: (Graph, Vec<Tensor>), what: &str) {
        let kernels = check_graph(&case.0, &case.1);
        assert!(kernels.iter().all(|k| k.starts_with(what)), "{kernels:?}");
    }

    #[test]
    fn dft_forms() {
        // Real and complex input, forward and inverse, along the middle axis.
        check(dft(&[2, 7, 3, 1], 1, None, false, false), "gpu dft n=7");
        check(dft(&[2, 6, 2], 1, None, true, false), "gpu dft n=6");
        check(dft(&[3, 8, 1], -2, None, false, true), "gpu dft n=8");
        // Zero-padded and truncated lengths.
        check(dft(&[1, 5, 2], 1, Some(9), false, false), "gpu dft n=9");
        check(dft(&[1, 9, 2], 1, Some(4), false, false), "gpu dft n=4");
        // irfft: the missing half by conjugate symmetry, n even and odd.
        check(dft(&[2, 5, 2], 1, None, true, true), "gpu dft n=8");
        check(dft(&[2, 5, 2], 1, Some(9), true, true), "gpu dft n=9");
    }

    fn stft(len: usize, c: usize, step: i64, frame: usize, window: bool) -> (Graph, Vec<Tensor>) {
        let mut rng = TestRng::new(len as u64 + c as u64);
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[2, len, c]));
        let s = g.add_const("step", Tensor::scalar(step));
        let mut inputs = vec![Tensor::from_vec(
            vec![2, len, c],
            rng.vec_scaled(2 * len * c, 2.0),
        )];
        let w: Option<ValueId> = window.then(|| g.add_input("w", TensorType::fixed(DType::F32, &[frame])));
        if window {
            inputs.push(Tensor::from_vec(vec![frame], rng.vec(frame)));
        }
        let fl = (!window).then(|| g.add_const("frame", Tensor::scalar(frame as i64)));
        let op = Op::Signal(SignalOp::Stft { onesided: c == 1 });
        let y = g.add("stft", op, vec![Some(x), Some(s), w, fl], "y").unwrap();
        g.add_output("y", y);
        (g, inputs)
    }

    #[test]
    fn stft_with_and_without_window() {
        check(stft(40, 1, 7, 12, true), "gpu stft frame=12");
        check(stft(33, 2, 5, 9, false), "gpu stft frame=9");
    }

    #[test]
    fn ptx_assembles() {
        ptxas_check(&dft(&[2, 5, 2], 1, Some(9), true, true).0, 80);
        ptxas_check(&stft(40, 1, 7, 12, true).0, 90);
    }
}
