//! LSTM, GRU and RNN on the GPU (f32; every direction, both layouts, sequence_lens, initial
//! states, peepholes, clip, input_forget, linear_before_reset; the Sigmoid, Tanh and Relu
//! activations), with the library kernel's semantics (`kiln_uk_rnn`, `ukernels/misc.c`).
//!
//! A persistent block per (direction, batch row) walks the sequence: the step's input, the
//! hidden and cell state and the gate pre-activations live in shared memory. Each step, the
//! block's threads take the gate rows (`W·x + R·h` and the biases, a row a thread in turn),
//! meet at a barrier, then take the hidden units to update the state and write `Y`. GRU's
//! candidate gate reads `r` first, so its rows come after a barrier of their own. Dots and
//! state are f32 (the library uses f64); time steps are sequential within a block, rows of
//! the batch and directions run on different blocks.

use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims, Sreg, EVALUE};
use crate::target::TargetDesc;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;
use kiln_ir::{Activation, DType, Op, RnnDirection, RnnKind};

/// Shared memory a block may use (the 48 KiB every GPU since sm_50 gives without opting in).
const MAX_SHARED: usize = 48 * 1024;

#[derive(Debug)]
struct RecurrentGpu {
    kind: RnnKind,
    dirs: usize,
    reverse_only: bool,
    hidden: usize,
    /// `[batch, seq, ...]` rather than `[seq, batch, ...]`.
    batch_first: bool,
    input_forget: bool,
    linear_before_reset: bool,
    clip: Option<f32>,
    seq: usize,
    batch: usize,
    input: usize,
    /// Per direction: f, g (GRU, LSTM), h (LSTM).
    activations: Vec<Activation>,
    /// Which of the node's eight inputs are present.
    has_input: [bool; 8],
    threads: usize,
}

/// The kernel for an f32 LSTM, GRU or RNN, or None (other dtypes or activations, states too
/// large for shared memory).
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    let Op::Rnn(a) = node.op() else {
        return Ok(None);
    };
    let f32_ok = |i: usize| {
        node.input_type(i)
            .is_none_or(|t| t.dtype == DType::F32 && t.is_static())
    };
    if ![0, 1, 2, 3, 5, 6, 7].into_iter().all(f32_ok)
        || node.input_type(4).is_some_and(|t| t.dtype != DType::I32)
        || (0..node.n_outputs()).any(|o| node.output_type(o).dtype != DType::F32)
        || a.activations
            .iter()
            .any(|f| !matches!(f, Activation::Sigmoid | Activation::Tanh | Activation::Relu))
    {
        return Ok(None);
    }
    let x = node.input_shape(0)?;
    if x.len() != 3 {
        return Ok(None);
    }
    let (seq, batch) = if a.layout == 1 { (x[1], x[0]) } else { (x[0], x[1]) };
    let dirs = if a.direction == RnnDirection::Bidirectional {
        2
    } else {
        1
    };
    let per = match a.kind {
        RnnKind::Rnn => 1,
        RnnKind::Gru => 2,
        RnnKind::Lstm => 3,
    };
    if a.activations.len() != per * dirs || batch == 0 || a.hidden_size == 0 {
        return Ok(None);
    }
    let k = RecurrentGpu {
        kind: a.kind,
        dirs,
        reverse_only: a.direction == RnnDirection::Reverse,
        hidden: a.hidden_size,
        batch_first: a.layout == 1,
        input_forget: a.input_forget,
        linear_before_reset: a.linear_before_reset,
        clip: a.clip,
        seq,
        batch,
        input: x[2],
        activations: a.activations.clone(),
        has_input: std::array::from_fn(|i| node.has_input(i)),
        threads: (gates(a.kind) * a.hidden_size).next_power_of_two().clamp(32, 512),
    };
    if k.shared_floats() * 4 > MAX_SHARED {
        return Ok(None);
    }
    Ok(Some(Box::new(k)))
}

fn gates(kind: RnnKind) -> usize {
    match kind {
        RnnKind::Rnn => 1,
        RnnKind::Gru => 3,
        RnnKind::Lstm => 4,
    }
}

/// The block's shared arrays.
struct Shared<'ctx> {
    x: PointerValue<'ctx>,
    h: PointerValue<'ctx>,
    c: PointerValue<'ctx>,
    /// GRU: r·h, then the candidate.
    t: PointerValue<'ctx>,
    g: PointerValue<'ctx>,
}

impl RecurrentGpu {
    fn g(&self) -> usize {
        gates(self.kind)
    }

    /// x, h, c, a scratch vector of H, the gate rows.
    fn shared_floats(&self) -> usize {
        self.input + 3 * self.hidden + self.g() * self.hidden
    }

    fn per(&self) -> usize {
        self.activations.len() / self.dirs
    }

    /// Activation `k` (0: f, 1: g, 2: h) of direction `dir` on `x`; clip bounds f's and g's
    /// arguments, as the library does.
    fn act<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        dir: usize,
        k: usize,
        x: FloatValue<'ctx>,
    ) -> Result<FloatValue<'ctx>> {
        let mut x = x;
        if let (Some(clip), true) = (self.clip, k < 2) {
            for (p, bound) in [
                (inkwell::FloatPredicate::OLT, -clip),
                (inkwell::FloatPredicate::OGT, clip),
            ] {
                let out = e.b.build_float_compare(p, x, e.f32c(bound), "").map_err(llvm)?;
                x =
                    e.b.build_select(out, e.f32c(bound), x, "")
                        .map_err(llvm)?
                        .into_float_value();
            }
        }
        let v = e.splat(x, 1)?;
        let y = match self.activations[dir * self.per() + k] {
            Activation::Sigmoid => crate::gen::vmath::sigmoid(e, v)?,
            Activation::Tanh => crate::gen::vmath::tanh(e, v)?,
            _ => {
                let neg = e.fcmp(inkwell::FloatPredicate::OLT, v, e.zero_vec(1))?;
                e.vselect(neg, e.zero_vec(1), v)?
            }
        };
        Ok(e.b
            .build_extract_element(y, e.i32c(0), "")
            .map_err(llvm)?
            .into_float_value())
    }
}

impl KernelCommon for RecurrentGpu {
    fn describe(&self) -> String {
        let kind = match self.kind {
            RnnKind::Rnn => "rnn",
            RnnKind::Gru => "gru",
            RnnKind::Lstm => "lstm",
        };
        format!(
            "gpu {kind} seq={} batch={} input={} hidden={} directions={}",
            self.seq, self.batch, self.input, self.hidden, self.dirs
        )
    }
}

/// `Σ m[row·n + k] · v[k]` over k in `[0, n)`, in a loop (one thread's dot).
fn dot<'ctx>(
    e: &Emit<'_, 'ctx>,
    acc: PointerValue<'ctx>,
    m: PointerValue<'ctx>,
    row_start: IntValue<'ctx>,
    v: PointerValue<'ctx>,
    n: usize,
) -> Result<FloatValue<'ctx>> {
    e.store(acc, e.f32c(0.0))?;
    e.for_range(e.i64c(0), e.i64c(n as i64), 1, |k| {
        let a = e.load_f32(e.gep_f32(m, e.add(row_start, k)?)?)?;
        let b = e.load_f32(e.gep_f32(v, k)?)?;
        let p = e.b.build_float_mul(a, b, "").map_err(llvm)?;
        let s = e.b.build_float_add(e.load_f32(acc)?, p, "").map_err(llvm)?;
        e.store(acc, s)
    })?;
    e.load_f32(acc)
}

fn fadd<'ctx>(e: &Emit<'_, 'ctx>, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
    e.b.build_float_add(a, b, "").map_err(llvm)
}

fn fmul<'ctx>(e: &Emit<'_, 'ctx>, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
    e.b.build_float_mul(a, b, "").map_err(llvm)
}

impl GpuKernel for RecurrentGpu {
    fn launch(&self) -> LaunchDims {
        LaunchDims {
            grid: [(self.dirs * self.batch) as u32, 1, 1],
            block: [self.threads as u32, 1, 1],
            shared_bytes: (self.shared_floats() * 4) as u32,
        }
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let (h_n, g_n, i_n) = (self.hidden, self.g(), self.input);
        let rows = (g_n * h_n) as i64;
        let threads = self.threads as i64;
        let tid = k.sreg64(Sreg::TidX)?;
        let task = k.sreg64(Sreg::CtaidX)?;
        let dir_v = e.udivc(task, self.batch as i64)?;
        let b = e.uremc(task, self.batch as i64)?;
        let base = k.shared()?;
        let sh = Shared {
            x: base,
            h: e.gep_f32c(base, i_n as i64)?,
            c: e.gep_f32c(base, (i_n + h_n) as i64)?,
            t: e.gep_f32c(base, (i_n + 2 * h_n) as i64)?,
            g: e.gep_f32c(base, (i_n + 3 * h_n) as i64)?,
        };
        let (x, w, r) = (k.input(0)?, k.input(1)?, k.input(2)?);
        let opt_in = |i: usize| -> Result<Option<PointerValue>> {
            match self.has_input[i] {
                true => k.input(i).map(Some),
                false => Ok(None),
            }
        };
        let (bias, lens, h0) = (opt_in(3)?, opt_in(4)?, opt_in(5)?);
        let lstm = self.kind == RnnKind::Lstm;
        let (c0, peep) = if lstm {
            (opt_in(6)?, opt_in(7)?)
        } else {
            (None, None)
        };
        // Outputs the node declares (an unused one may have no buffer).
        let out = |o: usize| (o < k.n_outputs).then(|| k.output(o).ok()).flatten();
        let (y, y_h, y_c) = (out(0), out(1), if lstm { out(2) } else { None });
        let acc = e.entry_alloca(k.cx.f32_type(), "acc")?;
        let len = match lens {
            Some(l) => {
                let v =
                    e.b.build_load(k.cx.i32_type(), e.gep_u8(l, e.mulc(b, 4)?)?, "len")
                        .map_err(llvm)?;
                e.b.build_int_s_extend(v.into_int_value(), k.cx.i64_type(), "")
                    .map_err(llvm)?
            }
            None => e.i64c(self.seq as i64),
        };
        // A length outside [0, seq] (unsigned compare catches the negative ones) is an error.
        let bad = e.icmp(IntPredicate::UGT, len, e.i64c(self.seq as i64))?;
        let first = e.icmp(IntPredicate::EQ, tid, e.i64c(0))?;
        let report = e.b.build_and(bad, first, "").map_err(llvm)?;
        e.if_then(report, || k.report_error(EVALUE))?;
        let len =
            e.b.build_select(bad, e.i64c(0), len, "")
                .map_err(llvm)?
                .into_int_value();
        // Each direction has its own code path (its activations are compile-time constants).
        for dir in 0..self.dirs {
            let here = e.icmp(IntPredicate::EQ, dir_v, e.i64c(dir as i64))?;
            e.if_then(here, || {
                self.direction(
                    k,
                    &e,
                    dir,
                    b,
                    len,
                    tid,
                    threads,
                    rows,
                    &sh,
                    acc,
                    (x, w, r),
                    (bias, h0, c0, peep),
                    (y, y_h, y_c),
                )
            })?;
        }
        k.ret()
    }
}

type Inputs<'ctx> = (PointerValue<'ctx>, PointerValue<'ctx>, PointerValue<'ctx>);
type Optional<'ctx> = (
    Option<PointerValue<'ctx>>,
    Option<PointerValue<'ctx>>,
    Option<PointerValue<'ctx>>,
    Option<PointerValue<'ctx>>,
);
type Outputs<'ctx> = (
    Option<PointerValue<'ctx>>,
    Option<PointerValue<'ctx>>,
    Option<PointerValue<'ctx>>,
);

impl RecurrentGpu {
    /// The state's index in initial_h/initial_c and Y_h/Y_c for (dir, b, unit).
    fn state_index<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        dir: usize,
        b: IntValue<'ctx>,
        u: IntValue<'ctx>,
    ) -> Result<IntValue<'ctx>> {
        let at = if self.batch_first {
            e.addc(e.mulc(b, self.dirs as i64)?, dir as i64)?
        } else {
            e.add(e.i64c((dir * self.batch) as i64), b)?
        };
        e.add(e.mulc(at, self.hidden as i64)?, u)
    }

    /// Y's offset of step t's hidden vector.
    fn y_offset<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        dir: usize,
        b: IntValue<'ctx>,
        t: IntValue<'ctx>,
    ) -> Result<IntValue<'ctx>> {
        let at = if self.batch_first {
            e.addc(
                e.mulc(e.add(e.mulc(b, self.seq as i64)?, t)?, self.dirs as i64)?,
                dir as i64,
            )?
        } else {
            e.add(
                e.mulc(
                    e.addc(e.mulc(t, self.dirs as i64)?, dir as i64)?,
                    self.batch as i64,
                )?,
                b,
            )?
        };
        e.mulc(at, self.hidden as i64)
    }

    /// Runs direction `dir` of batch row `b` over `len` steps.
    #[allow(clippy::too_many_arguments)]
    fn direction<'ctx>(
        &self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        dir: usize,
        b: IntValue<'ctx>,
        len: IntValue<'ctx>,
        tid: IntValue<'ctx>,
        threads: i64,
        rows: i64,
        sh: &Shared<'ctx>,
        acc: PointerValue<'ctx>,
        (x, w, r): Inputs<'ctx>,
        (bias, h0, c0, peep): Optional<'ctx>,
        (y, y_h, y_c): Outputs<'ctx>,
    ) -> Result<()> {
        let (h_n, g_n, i_n) = (self.hidden as i64, self.g() as i64, self.input as i64);
        let hn = e.i64c(h_n);
        let reverse = self.reverse_only || dir == 1;
        let (woff, roff, boff) = (
            dir as i64 * g_n * h_n * i_n,
            dir as i64 * g_n * h_n * h_n,
            dir as i64 * 2 * g_n * h_n,
        );
        let load_or_zero = |p: Option<PointerValue<'ctx>>, at: IntValue<'ctx>| -> Result<FloatValue<'ctx>> {
            match p {
                Some(p) => e.load_f32(e.gep_f32(p, at)?),
                None => Ok(e.f32c(0.0)),
            }
        };
        let bias_at = |at: IntValue<'ctx>| load_or_zero(bias, e.addc(at, boff)?);
        // Initial state.
        e.for_range(tid, hn, threads, |u| {
            let s = self.state_index(e, dir, b, u)?;
            e.store(e.gep_f32(sh.h, u)?, load_or_zero(h0, s)?)?;
            e.store(e.gep_f32(sh.c, u)?, load_or_zero(c0, s)?)
        })?;
        k.barrier()?;
        e.for_range(e.i64c(0), len, 1, |step| {
            let t = if reverse {
                e.sub(e.sub(len, step)?, e.i64c(1))?
            } else {
                step
            };
            let xrow = if self.batch_first {
                e.add(e.mulc(b, self.seq as i64)?, t)?
            } else {
                e.add(e.mulc(t, self.batch as i64)?, b)?
            };
            let xoff = e.mulc(xrow, i_n)?;
            e.for_range(tid, e.i64c(i_n), threads, |i| {
                e.store(e.gep_f32(sh.x, i)?, e.load_f32(e.gep_f32(x, e.add(xoff, i)?)?)?)
            })?;
            k.barrier()?;
            // Gate rows: the input part and its bias; the recurrent part and its bias too,
            // except for GRU's candidate rows, whose recurrent part needs r.
            e.for_range(tid, e.i64c(rows), threads, |row| {
                let mut s = dot(e, acc, w, e.addc(e.mulc(row, i_n)?, woff)?, sh.x, self.input)?;
                s = fadd(e, s, bias_at(row)?)?;
                let recurrent = |s: FloatValue<'ctx>| -> Result<FloatValue<'ctx>> {
                    let rs = dot(e, acc, r, e.addc(e.mulc(row, h_n)?, roff)?, sh.h, self.hidden)?;
                    fadd(e, fadd(e, s, rs)?, bias_at(e.addc(row, g_n * h_n)?)?)
                };
                let at = e.gep_f32(sh.g, row)?;
                match self.kind {
                    RnnKind::Gru => {
                        let gate = e.icmp(IntPredicate::ULT, row, e.i64c(2 * h_n))?;
                        e.if_else(
                            gate,
                            || e.store(at, self.act(e, dir, 0, recurrent(s)?)?),
                            || e.store(at, s),
                        )
                    }
                    _ => e.store(at, recurrent(s)?),
                }
            })?;
            k.barrier()?;
            let g = |i: i64, u: IntValue<'ctx>| e.load_f32(e.gep_f32(sh.g, e.addc(u, i * h_n)?)?);
            match self.kind {
                RnnKind::Rnn => {
                    e.for_range(tid, hn, threads, |u| {
                        e.store(e.gep_f32(sh.h, u)?, self.act(e, dir, 0, g(0, u)?)?)
                    })?;
                }
                RnnKind::Lstm => {
                    let poff = dir as i64 * 3 * h_n;
                    e.for_range(tid, hn, threads, |u| {
                        let c = e.load_f32(e.gep_f32(sh.c, u)?)?;
                        let p = |i: i64| load_or_zero(peep, e.addc(u, poff + i * h_n)?);
                        let ig = self.act(e, dir, 0, fadd(e, g(0, u)?, fmul(e, p(0)?, c)?)?)?;
                        let fg = if self.input_forget {
                            e.b.build_float_sub(e.f32c(1.0), ig, "").map_err(llvm)?
                        } else {
                            self.act(e, dir, 0, fadd(e, g(2, u)?, fmul(e, p(2)?, c)?)?)?
                        };
                        let gg = self.act(e, dir, 1, g(3, u)?)?;
                        let ct = fadd(e, fmul(e, fg, c)?, fmul(e, ig, gg)?)?;
                        let og = self.act(e, dir, 0, fadd(e, g(1, u)?, fmul(e, p(1)?, ct)?)?)?;
                        e.store(e.gep_f32(sh.c, u)?, ct)?;
                        e.store(e.gep_f32(sh.h, u)?, fmul(e, og, self.act(e, dir, 2, ct)?)?)
                    })?;
                }
                RnnKind::Gru => {
                    let row_of = |u: IntValue<'ctx>| e.addc(u, 2 * h_n);
                    if !self.linear_before_reset {
                        e.for_range(tid, hn, threads, |u| {
                            let rh = fmul(e, g(1, u)?, e.load_f32(e.gep_f32(sh.h, u)?)?)?;
                            e.store(e.gep_f32(sh.t, u)?, rh)
                        })?;
                        k.barrier()?;
                    }
                    // The candidate, into the gate rows' g section (read only by its unit).
                    e.for_range(tid, hn, threads, |u| {
                        let row = row_of(u)?;
                        let rb = bias_at(e.addc(row, g_n * h_n)?)?;
                        let src = if self.linear_before_reset { sh.h } else { sh.t };
                        let rs = dot(e, acc, r, e.addc(e.mulc(row, h_n)?, roff)?, src, self.hidden)?;
                        let pre = if self.linear_before_reset {
                            fadd(e, g(2, u)?, fmul(e, g(1, u)?, fadd(e, rs, rb)?)?)?
                        } else {
                            fadd(e, fadd(e, g(2, u)?, rs)?, rb)?
                        };
                        e.store(e.gep_f32(sh.g, row)?, self.act(e, dir, 1, pre)?)
                    })?;
                    k.barrier()?;
                    e.for_range(tid, hn, threads, |u| {
                        let (z, cand) = (g(0, u)?, g(2, u)?);
                        let h = e.load_f32(e.gep_f32(sh.h, u)?)?;
                        let keep = e.b.build_float_sub(e.f32c(1.0), z, "").map_err(llvm)?;
                        e.store(
                            e.gep_f32(sh.h, u)?,
                            fadd(e, fmul(e, keep, cand)?, fmul(e, z, h)?)?,
                        )
                    })?;
                }
            }
            if let Some(y) = y {
                let yoff = self.y_offset(e, dir, b, t)?;
                e.for_range(tid, hn, threads, |u| {
                    e.store(e.gep_f32(y, e.add(yoff, u)?)?, e.load_f32(e.gep_f32(sh.h, u)?)?)
                })?;
            }
            k.barrier()
        })?;
        // Steps past the row's length are zero in Y; a row without steps keeps zero states.
        if let Some(y) = y {
            e.for_range(len, e.i64c(self.seq as i64), 1, |t| {
                let yoff = self.y_offset(e, dir, b, t)?;
                e.for_range(tid, hn, threads, |u| {
                    e.store(e.gep_f32(y, e.add(yoff, u)?)?, e.f32c(0.0))
                })
            })?;
        }
        let empty = e.icmp(IntPredicate::EQ, len, e.i64c(0))?;
        for (out, state) in [(y_h, sh.h), (y_c, sh.c)] {
            let Some(out) = out else { continue };
            e.for_range(tid, hn, threads, |u| {
                let v = e.load_f32(e.gep_f32(state, u)?)?;
                let v = e.b.build_select(empty, e.f32c(0.0), v, "").map_err(llvm)?;
                e.store(e.gep_f32(out, self.state_index(e, dir, b, u)?)?, v)
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check, run_graph};
    use kiln_ir::{
        Activation, DType, Graph, Op, RnnAttrs, RnnDirection, RnnKind, Tensor, TensorType, ValueId,
    };

    /// Deterministic values in [-0.5, 0.5).
    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 37 + seed * 11) % 41) as f32 / 41.0 - 0.5)
            .collect()
    }

    struct Case {
        kind: RnnKind,
        direction: RnnDirection,
        seq: usize,
        batch: usize,
        input: usize,
        hidden: usize,
        batch_first: bool,
        clip: Option<f32>,
        input_forget: bool,
        linear_before_reset: bool,
        /// Optional inputs: B, sequence_lens, initial_h, initial_c, P.
        bias: bool,
        lens: Option<Vec<i32>>,
        initial: bool,
        peepholes: bool,
        activations: Option<Vec<Activation>>,
    }

    impl Case {
        fn new(kind: RnnKind) -> Case {
            Case {
                kind,
                direction: RnnDirection::Forward,
                seq: 5,
                batch: 2,
                input: 7,
                hidden: 6,
                batch_first: false,
                clip: None,
                input_forget: false,
                linear_before_reset: false,
                bias: true,
                lens: None,
                initial: false,
                peepholes: false,
                activations: None,
            }
        }

        fn graph(&self) -> (Graph, Vec<Tensor>) {
            let (g_n, per) = match self.kind {
                RnnKind::Rnn => (1, 1),
                RnnKind::Gru => (3, 2),
                RnnKind::Lstm => (4, 3),
            };
            let dirs = if self.direction == RnnDirection::Bidirectional {
                2
            } else {
                1
            };
            let (h, i) = (self.hidden, self.input);
            let mut g = Graph::new("t");
            let mut feeds = vec![];
            let mut input = |g: &mut Graph, name: &str, shape: Vec<usize>, seed: usize| -> ValueId {
                let n: usize = shape.iter().product();
                feeds.push(Tensor::from_vec(shape.clone(), values(n, seed)));
                g.add_input(name, TensorType::fixed(DType::F32, &shape))
            };
            let xs = if self.batch_first {
                vec![self.batch, self.seq, i]
            } else {
                vec![self.seq, self.batch, i]
            };
            let x = input(&mut g, "x", xs, 1);
            let konst = |g: &mut Graph, name: &str, shape: Vec<usize>, seed: usize| -> ValueId {
                let n: usize = shape.iter().product();
                g.add_const(name, Tensor::from_vec(shape, values(n, seed)))
            };
            let w = konst(&mut g, "w", vec![dirs, g_n * h, i], 2);
            let r = konst(&mut g, "r", vec![dirs, g_n * h, h], 3);
            let b = self.bias.then(|| konst(&mut g, "b", vec![dirs, 2 * g_n * h], 4));
            let lens = self
                .lens
                .as_ref()
                .map(|l| g.add_const("lens", Tensor::from_vec(vec![self.batch], l.clone())));
            let state = if self.batch_first {
                vec![self.batch, dirs, h]
            } else {
                vec![dirs, self.batch, h]
            };
            let h0 = self.initial.then(|| input(&mut g, "h0", state.clone(), 5));
            let c0 =
                (self.initial && self.kind == RnnKind::Lstm).then(|| input(&mut g, "c0", state.clone(), 6));
            let p = self.peepholes.then(|| konst(&mut g, "p", vec![dirs, 3 * h], 7));
            let default = match self.kind {
                RnnKind::Rnn => vec![Activation::Tanh],
                RnnKind::Gru => vec![Activation::Sigmoid, Activation::Tanh],
                RnnKind::Lstm => vec![Activation::Sigmoid, Activation::Tanh, Activation::Tanh],
            };
            let acts = self.activations.clone().unwrap_or(default);
            assert_eq!(acts.len(), per);
            let attrs = RnnAttrs {
                kind: self.kind,
                direction: self.direction,
                hidden_size: h,
                activations: acts.iter().cycle().take(per * dirs).cloned().collect(),
                clip: self.clip,
                input_forget: self.input_forget,
                linear_before_reset: self.linear_before_reset,
                layout: self.batch_first as u8,
            };
            let mut inputs = vec![Some(x), Some(w), Some(r), b, lens, h0];
            if self.kind == RnnKind::Lstm {
                inputs.extend([c0, p]);
            }
            let n_out = if self.kind == RnnKind::Lstm { 3 } else { 2 };
            let names = ["y", "y_h", "y_c"][..n_out]
                .iter()
                .map(|s| s.to_string())
                .collect();
            let outs = g.add_node("rnn", Op::Rnn(attrs), inputs, names).unwrap();
            for (o, v) in outs.iter().enumerate() {
                g.add_output(format!("out{o}"), *v);
            }
            (g, feeds)
        }

        fn check(&self) {
            let (g, feeds) = self.graph();
            let d = check_graph(&g, &feeds);
            assert!(d.iter().all(|s| s.starts_with("gpu ")), "{d:?}");
        }
    }

    #[test]
    fn lstm_variants() {
        Case::new(RnnKind::Lstm).check();
        Case {
            direction: RnnDirection::Bidirectional,
            initial: true,
            peepholes: true,
            ..Case::new(RnnKind::Lstm)
        }
        .check();
        Case {
            direction: RnnDirection::Reverse,
            batch_first: true,
            clip: Some(0.3),
            input_forget: true,
            lens: Some(vec![3, 0]),
            bias: false,
            ..Case::new(RnnKind::Lstm)
        }
        .check();
        // More gate rows than threads (4 × 200 > 512) and an input wider than the hidden size.
        Case {
            hidden: 200,
            input: 300,
            seq: 2,
            batch: 1,
            ..Case::new(RnnKind::Lstm)
        }
        .check();
    }

    #[test]
    fn gru_and_rnn_variants() {
        for lbr in [false, true] {
            Case {
                linear_before_reset: lbr,
                direction: RnnDirection::Bidirectional,
                initial: true,
                lens: Some(vec![5, 2]),
                ..Case::new(RnnKind::Gru)
            }
            .check();
        }
        Case::new(RnnKind::Rnn).check();
        Case {
            activations: Some(vec![Activation::Relu]),
            batch_first: true,
            direction: RnnDirection::Reverse,
            ..Case::new(RnnKind::Rnn)
        }
        .check();
    }

    #[test]
    fn a_sequence_length_past_the_sequence_is_reported() {
        let (g, feeds) = Case {
            lens: Some(vec![3, 6]),
            ..Case::new(RnnKind::Gru)
        }
        .graph();
        assert_eq!(run_graph(&g, &feeds).unwrap_err(), "kernel 0 failed with code 2");
        for sm in [80, 90] {
            ptxas_check(&g, sm);
        }
    }
}
