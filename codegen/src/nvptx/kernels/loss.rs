//! NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss on the GPU.
//!
//! The input is `[N, C, d...]`, the target `[N, d...]`; a *position* is one (n, d) pair. One
//! block of `BLOCK` threads strides over the positions: at each, SoftmaxCrossEntropyLoss takes
//! the log-sum-exp over the C classes (max, then the sum of `exp(x - max)`) and writes the
//! log-probabilities when the node has that output; the loss term is `-w[t] · lp[t]` for the
//! position's target class `t` (`lp = x` for NegativeLogLikelihoodLoss), 0 for an ignored
//! target. Reduction `none` stores each term; `sum` and `mean` fold the terms and weights per
//! thread, meet in `rows::block_reduce` and thread 0 stores the sum, or the sum over the
//! weights. Everything is computed in f64 and rounded once, as the library kernel and the
//! reference do (exp and log from the math library: libdevice on the device). A target
//! outside the classes is reported as `KILN_CUDA_EINDEX`, the library kernel's error.

use super::rows::{block_reduce, Fold};
use super::scalar::{load_index, load_local, load_real, store_real};
use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims, Sreg, EINDEX};
use crate::target::TargetDesc;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;
use kiln_ir::{DType, Layout, LossReduction, MiscOp, Op};

/// Threads of the block (a power of two, as the tree reduction needs).
const BLOCK: usize = 256;

#[derive(Debug)]
struct Loss {
    n: usize,
    c: usize,
    d: usize,
    log_softmax: bool,
    reduction: LossReduction,
    ignore_index: Option<i64>,
    /// The input's (and weight's and outputs') dtype, and the target's.
    dtype: DType,
    target: DType,
    weight: bool,
    /// The node writes its log-probabilities (SoftmaxCrossEntropyLoss's second output).
    log_prob: bool,
}

/// The kernel for a loss node of row-major static tensors (f32, f64 or f16 input, i32 or i64
/// target), or None.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    let Op::Misc(MiscOp::Loss {
        log_softmax,
        reduction,
        ignore_index,
    }) = node.op()
    else {
        return Ok(None);
    };
    let typed = |i: usize| {
        node.input_type(i)
            .filter(|t| t.layout == Layout::RowMajor && t.is_static())
    };
    let (Some(x), Some(t)) = (typed(0), typed(1)) else {
        return Ok(None);
    };
    let weight = node.has_input(2);
    if !matches!(x.dtype, DType::F32 | DType::F64 | DType::F16)
        || !matches!(t.dtype, DType::I32 | DType::I64)
        || (weight && typed(2).is_none_or(|w| w.dtype != x.dtype))
    {
        return Ok(None);
    }
    let shape = node.input_shape(0)?;
    if shape.len() < 2 || shape.iter().product::<usize>() >= 1 << 40 {
        return Ok(None);
    }
    Ok(Some(Box::new(Loss {
        n: shape[0],
        c: shape[1],
        d: shape[2..].iter().product(),
        log_softmax: *log_softmax,
        reduction: *reduction,
        ignore_index: *ignore_index,
        dtype: x.dtype,
        target: t.dtype,
        weight,
        log_prob: *log_softmax && node.n_outputs() > 1,
    })))
}

impl KernelCommon for Loss {
    fn describe(&self) -> String {
        format!(
            "gpu {} {:?} [{}, {}, {}] block={BLOCK}",
            if self.log_softmax {
                "softmax_cross_entropy"
            } else {
                "nll_loss"
            },
            self.reduction,
            self.n,
            self.c,
            self.d
        )
    }
}

impl GpuKernel for Loss {
    fn launch(&self) -> LaunchDims {
        LaunchDims {
            grid: [1, 1, 1],
            block: [BLOCK as u32, 1, 1],
            shared_bytes: (BLOCK * 8) as u32,
        }
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let f64t = k.cx.f64_type();
        let (x, target, out) = (k.input(0)?, k.input(1)?, k.output(0)?);
        let weight = if self.weight { Some(k.input(2)?) } else { None };
        let tx = k.sreg64(Sreg::TidX)?;
        let (c, d) = (self.c as i64, self.d as i64);
        let total = e.entry_alloca(f64t, "total")?;
        let wsum = e.entry_alloca(f64t, "wsum")?;
        let term = e.entry_alloca(f64t, "term")?;
        let lse = e.entry_alloca(f64t, "lse")?;
        e.store(total, f64t.const_zero())?;
        e.store(wsum, f64t.const_zero())?;
        e.store(lse, f64t.const_zero())?;
        let positions = e.i64c((self.n * self.d) as i64);
        e.for_range(tx, positions, BLOCK as i64, |p| {
            let (ni, di) = (e.udivc(p, d)?, e.uremc(p, d)?);
            // Element (ni, class 0, di); class k is k·d further.
            let base = e.add(e.mulc(ni, c * d)?, di)?;
            if self.log_softmax {
                e.store(lse, self.log_sum_exp(&e, x, base)?)?;
                if self.log_prob {
                    let lp_out = k.output(1)?;
                    e.for_range(e.i64c(0), e.i64c(c), 1, |class| {
                        let at = e.add(base, e.mulc(class, d)?)?;
                        let v = load_real(&e, x, self.dtype, at)?;
                        let lp = e.b.build_float_sub(v, load_local(&e, lse)?, "").map_err(llvm)?;
                        store_real(&e, lp_out, self.dtype, at, lp)
                    })?;
                }
            }
            e.store(term, f64t.const_zero())?;
            let t = load_index(&e, target, self.target, p)?;
            let counted = match self.ignore_index {
                Some(ii) => e.icmp(IntPredicate::NE, t, e.i64c(ii))?,
                None => e.cx.bool_type().const_all_ones(),
            };
            e.if_then(counted, || {
                let inside = e.icmp(IntPredicate::ULT, t, e.i64c(c))?;
                e.if_else(
                    inside,
                    || {
                        let w = match weight {
                            Some(wp) => load_real(&e, wp, self.dtype, t)?,
                            None => f64t.const_float(1.0),
                        };
                        let at = e.add(base, e.mulc(t, d)?)?;
                        let mut lp = load_real(&e, x, self.dtype, at)?;
                        if self.log_softmax {
                            lp = e.b.build_float_sub(lp, load_local(&e, lse)?, "").map_err(llvm)?;
                        }
                        let l = e.b.build_float_mul(lp, w, "").map_err(llvm)?;
                        e.store(term, e.b.build_float_neg(l, "").map_err(llvm)?)?;
                        let ws = e.b.build_float_add(load_local(&e, wsum)?, w, "").map_err(llvm)?;
                        e.store(wsum, ws)
                    },
                    || k.report_error(EINDEX),
                )
            })?;
            let l = load_local(&e, term)?;
            if self.reduction == LossReduction::None {
                store_real(&e, out, self.dtype, p, l)
            } else {
                let s = e.b.build_float_add(load_local(&e, total)?, l, "").map_err(llvm)?;
                e.store(total, s)
            }
        })?;
        if self.reduction != LossReduction::None {
            let smem = k.shared()?;
            let sum = block_reduce(k, &e, smem, tx, BLOCK, Fold::Sum, load_local(&e, total)?)?;
            let weights = block_reduce(k, &e, smem, tx, BLOCK, Fold::Sum, load_local(&e, wsum)?)?;
            let first = e.icmp(IntPredicate::EQ, tx, e.i64c(0))?;
            e.if_then(first, || {
                let r = if self.reduction == LossReduction::Mean {
                    e.b.build_float_div(sum, weights, "").map_err(llvm)?
                } else {
                    sum
                };
                store_real(&e, out, self.dtype, e.i64c(0), r)
            })?;
        }
        k.ret()
    }
}

impl Loss {
    /// `max + ln Σ exp(x - max)` over the classes of the position at `base`, in f64; the
    /// maximum skips NaN as C's `fmax` does (a NaN still reaches the sum).
    fn log_sum_exp<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        x: PointerValue<'ctx>,
        base: IntValue<'ctx>,
    ) -> Result<FloatValue<'ctx>> {
        let f64t = e.cx.f64_type();
        let d = self.d as i64;
        let acc = e.entry_alloca(f64t, "acc")?;
        e.store(acc, f64t.const_float(f64::NEG_INFINITY))?;
        let classes = e.i64c(self.c as i64);
        e.for_range(e.i64c(0), classes, 1, |class| {
            let v = load_real(e, x, self.dtype, e.add(base, e.mulc(class, d)?)?)?;
            let m = e
                .intrinsic(
                    "llvm.maxnum",
                    &[f64t.into()],
                    &[load_local(e, acc)?.into(), v.into()],
                )?
                .into_float_value();
            e.store(acc, m)
        })?;
        let max = load_local(e, acc)?;
        e.store(acc, f64t.const_zero())?;
        e.for_range(e.i64c(0), classes, 1, |class| {
            let v = load_real(e, x, self.dtype, e.add(base, e.mulc(class, d)?)?)?;
            let z = e.b.build_float_sub(v, max, "").map_err(llvm)?;
            let s =
                e.b.build_float_add(load_local(e, acc)?, e.call_libm("exp", &[z])?, "")
                    .map_err(llvm)?;
            e.store(acc, s)
        })?;
        let log = e.call_libm("log", &[load_local(e, acc)?])?;
        e.b.build_float_add(max, log, "").map_err(llvm)
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check, run_graph};
    use crate::test_rng::TestRng;
    use kiln_ir::{DType, Graph, LossReduction, MiscOp, Op, Tensor, TensorType};

    /// A loss node over `x` (shape `shape`, dtype `dtype`) and targets drawn from `0..classes`
    /// (a few set to `ignore`), with class weights when `weighted`; checked in emulation.
    #[allow(clippy::too_many_arguments)]
    fn check(
        shape: &[usize],
        dtype: DType,
        log_softmax: bool,
        reduction: LossReduction,
        ignore: Option<i64>,
        weighted: bool,
        seed: u64,
    ) -> Graph {
        let mut rng = TestRng::new(seed);
        let (n, c) = (shape[0], shape[1]);
        let tshape: Vec<usize> = [n].into_iter().chain(shape[2..].iter().copied()).collect();
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(dtype, shape));
        let t = g.add_input("t", TensorType::fixed(DType::I64, &tshape));
        let mut ins = vec![Some(x), Some(t)];
        let mut values =
            vec![Tensor::from_vec(shape.to_vec(), rng.vec_scaled(shape.iter().product(), 3.0)).cast(dtype)];
        let targets: Vec<i64> = (0..tshape.iter().product::<usize>())
            .map(|i| match ignore {
                Some(ii) if i % 5 == 2 => ii,
                _ => ((rng.next() + 1.0) / 2.0 * c as f32) as i64 % c as i64,
            })
            .collect();
        values.push(Tensor::from_vec(tshape.clone(), targets));
        if weighted {
            let w = g.add_input("w", TensorType::fixed(dtype, &[c]));
            ins.push(Some(w));
            let wv: Vec<f32> = rng.vec(c).iter().map(|v| v.abs() + 0.25).collect();
            values.push(Tensor::from_vec(vec![c], wv).cast(dtype));
        }
        let op = Op::Misc(MiscOp::Loss {
            log_softmax,
            reduction,
            ignore_index: ignore,
        });
        let names: Vec<String> = if log_softmax {
            vec!["loss".into(), "lp".into()]
        } else {
            vec!["loss".into()]
        };
        let outs = g.add_node("loss", op, ins, names.clone()).unwrap();
        for (o, name) in outs.iter().zip(&names) {
            g.add_output(name.as_str(), *o);
        }
        let describes = check_graph(&g, &values);
        assert!(describes.iter().any(|d| d.starts_with("gpu ")), "{describes:?}");
        assert!(
            !describes.iter().any(|d| d.starts_with("kiln_uk")),
            "{describes:?}"
        );
        g
    }

    #[test]
    fn losses_match_the_reference() {
        let mut seed = 0;
        for log_softmax in [false, true] {
            for reduction in [LossReduction::None, LossReduction::Sum, LossReduction::Mean] {
                for (ignore, weighted) in [(None, false), (Some(1), true), (Some(-1), false)] {
                    seed += 1;
                    // More positions than threads, and 2-D inputs (one position per sample).
                    check(
                        &[3, 5, 7, 20],
                        DType::F32,
                        log_softmax,
                        reduction,
                        ignore,
                        weighted,
                        seed,
                    );
                    check(
                        &[6, 4],
                        DType::F32,
                        log_softmax,
                        reduction,
                        ignore,
                        weighted,
                        seed,
                    );
                }
            }
        }
        let g = check(
            &[2, 3, 4],
            DType::F64,
            true,
            LossReduction::Mean,
            Some(0),
            true,
            90,
        );
        check(&[2, 3, 4], DType::F16, true, LossReduction::None, None, true, 91);
        for sm in [80, 90] {
            ptxas_check(&g, sm);
        }
    }

    #[test]
    fn a_target_outside_the_classes_is_an_index_error() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[2, 3]));
        let t = g.add_input("t", TensorType::fixed(DType::I64, &[2]));
        let op = Op::Misc(MiscOp::Loss {
            log_softmax: false,
            reduction: LossReduction::Sum,
            ignore_index: None,
        });
        let out = g.add("loss", op, vec![Some(x), Some(t)], "loss").unwrap();
        g.add_output("loss", out);
        let inputs = vec![
            Tensor::from_vec(vec![2, 3], vec![0.5f32; 6]),
            Tensor::from_vec(vec![2], vec![1i64, 3]),
        ];
        let err = run_graph(&g, &inputs).unwrap_err();
        assert!(err.contains("failed with code 1"), "{err}");
    }
}
