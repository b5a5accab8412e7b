//! Recurrent operators: ONNX `RNN`, `GRU` and `LSTM` in their opset-14 form (with `layout`).
//!
//! Evaluation follows the equations of the ONNX operator documents one batch row and one time
//! step at a time. All arithmetic is in `f64`; each output is rounded once to the input dtype.
//!
//! Conventions where the ONNX text is silent, chosen to agree with onnxruntime:
//! - `sequence_lens[b]` steps are run for batch row `b`; `Y` is zero past them, and the reverse
//!   direction starts at step `sequence_lens[b] - 1`. A row of length 0 gets zero `Y_h`/`Y_c`.
//! - `clip` bounds the gate pre-activations, the inputs of `f` and `g`; LSTM's `h` gets the
//!   unclipped cell state.
//! - LSTM `input_forget` couples the gates as `f = 1 - i`.

use super::util::{check_alloc, fmt_dims};
use super::{EvalCtx, InferCtx};
use crate::{
    Activation, DType, Dim, Op, OpError, RnnAttrs, RnnDirection, RnnKind, Tensor, TensorData, TensorType,
};

// Input positions (ONNX order; LSTM only for the last two).
const X: usize = 0;
const W: usize = 1;
const R: usize = 2;
const B: usize = 3;
const SEQ_LENS: usize = 4;
const INITIAL_H: usize = 5;
const INITIAL_C: usize = 6;
const P: usize = 7;

/// Largest accepted `hidden_size`: keeps every derived extent (`8 * hidden_size` for an LSTM
/// bias) far from overflow.
const MAX_HIDDEN: usize = 1 << 31;

/// Gates per direction: the row blocks of `W` and `R`.
fn gate_count(kind: RnnKind) -> usize {
    match kind {
        RnnKind::Rnn => 1,
        RnnKind::Gru => 3,
        RnnKind::Lstm => 4,
    }
}

/// Activation functions per direction: f (RNN); f, g (GRU); f, g, h (LSTM).
fn activations_per_direction(kind: RnnKind) -> usize {
    match kind {
        RnnKind::Rnn => 1,
        RnnKind::Gru => 2,
        RnnKind::Lstm => 3,
    }
}

fn num_directions(d: RnnDirection) -> usize {
    match d {
        RnnDirection::Bidirectional => 2,
        RnnDirection::Forward | RnnDirection::Reverse => 1,
    }
}

fn max_inputs(kind: RnnKind) -> usize {
    match kind {
        RnnKind::Lstm => 8,
        RnnKind::Rnn | RnnKind::Gru => 6,
    }
}

fn max_outputs(kind: RnnKind) -> usize {
    match kind {
        RnnKind::Lstm => 3,
        RnnKind::Rnn | RnnKind::Gru => 2,
    }
}

fn attrs(op: &Op) -> Result<&RnnAttrs, OpError> {
    match op {
        Op::Rnn(a) => Ok(a),
        other => crate::bail!("{} is not a recurrent operator", other.name()),
    }
}

/// Checks the attributes against each other (the importer resolves them; a pass could not).
fn check_attrs(a: &RnnAttrs) -> Result<(), OpError> {
    let want = activations_per_direction(a.kind) * num_directions(a.direction);
    if a.activations.len() != want {
        crate::bail!(
            "{} activation functions given, {want} expected ({} per direction)",
            a.activations.len(),
            activations_per_direction(a.kind)
        );
    }
    if a.hidden_size > MAX_HIDDEN {
        crate::bail!("hidden_size {} is too large", a.hidden_size);
    }
    if a.layout > 1 {
        crate::bail!("layout must be 0 or 1, got {}", a.layout);
    }
    if let Some(c) = a.clip {
        if c.is_nan() || c < 0.0 {
            crate::bail!("clip must be a non-negative number, got {c}");
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Type inference

/// Merges two views of one extent: fixed beats symbolic, two different fixed extents are an error.
fn unify(a: &Dim, b: &Dim) -> Option<Dim> {
    match (a, b) {
        (Dim::Fixed(x), Dim::Fixed(y)) => (x == y).then(|| a.clone()),
        (Dim::Fixed(_), Dim::Sym(_)) => Some(a.clone()),
        (Dim::Sym(_), Dim::Fixed(_)) => Some(b.clone()),
        (Dim::Sym(_), Dim::Sym(_)) => Some(a.clone()),
    }
}

/// Checks input `name` against `dtype` and the expected dims; returns the unified dims.
fn expect_type(ty: &TensorType, name: &str, dtype: DType, want: &[Dim]) -> Result<Vec<Dim>, OpError> {
    if ty.dtype != dtype {
        crate::bail!("input {name} has dtype {} but X has {dtype}", ty.dtype);
    }
    let mismatch = || {
        OpError::new(format!(
            "input {name} has shape {ty}, expected {}",
            fmt_dims(want)
        ))
    };
    if ty.rank() != want.len() {
        return Err(mismatch());
    }
    ty.shape
        .iter()
        .zip(want)
        .map(|(a, b)| unify(a, b).ok_or_else(mismatch))
        .collect()
}

pub(crate) fn infer(op: &Op, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    let a = attrs(op)?;
    check_attrs(a)?;
    if cx.num_inputs() > max_inputs(a.kind) {
        crate::bail!(
            "{} inputs given, at most {} allowed",
            cx.num_inputs(),
            max_inputs(a.kind)
        );
    }
    if cx.num_outputs == 0 || cx.num_outputs > max_outputs(a.kind) {
        crate::bail!(
            "{} outputs declared, 1 to {} allowed",
            cx.num_outputs,
            max_outputs(a.kind)
        );
    }
    let x = cx.ty(X)?;
    if !x.dtype.is_float() {
        crate::bail!("input X must be a floating-point tensor, got {x}");
    }
    if x.rank() != 3 {
        crate::bail!("input X must have rank 3, got {x}");
    }
    let dt = x.dtype;
    let batch_major = a.layout == 1;
    let (seq, mut batch, input) = if batch_major {
        (x.shape[1].clone(), x.shape[0].clone(), x.shape[2].clone())
    } else {
        (x.shape[0].clone(), x.shape[1].clone(), x.shape[2].clone())
    };
    let dirs = Dim::Fixed(num_directions(a.direction));
    let h = Dim::Fixed(a.hidden_size);
    let gh = Dim::Fixed(gate_count(a.kind) * a.hidden_size);
    expect_type(cx.ty(W)?, "W", dt, &[dirs.clone(), gh.clone(), input])?;
    expect_type(cx.ty(R)?, "R", dt, &[dirs.clone(), gh, h.clone()])?;
    if let Some(t) = cx.opt_ty(B) {
        let bias = Dim::Fixed(2 * gate_count(a.kind) * a.hidden_size);
        expect_type(t, "B", dt, &[dirs.clone(), bias])?;
    }
    if let Some(t) = cx.opt_ty(SEQ_LENS) {
        batch = expect_type(t, "sequence_lens", DType::I32, &[batch])?.remove(0);
    }
    for (i, name) in [(INITIAL_H, "initial_h"), (INITIAL_C, "initial_c")] {
        if let Some(t) = cx.opt_ty(i) {
            let d = if batch_major {
                let d = expect_type(t, name, dt, &[batch.clone(), dirs.clone(), h.clone()])?;
                d[0].clone()
            } else {
                let d = expect_type(t, name, dt, &[dirs.clone(), batch.clone(), h.clone()])?;
                d[1].clone()
            };
            batch = d;
        }
    }
    if let Some(t) = cx.opt_ty(P) {
        expect_type(t, "P", dt, &[dirs.clone(), Dim::Fixed(3 * a.hidden_size)])?;
    }
    let (y, state) = if batch_major {
        (
            vec![batch.clone(), seq, dirs.clone(), h.clone()],
            vec![batch, dirs, h],
        )
    } else {
        (
            vec![seq, dirs.clone(), batch.clone(), h.clone()],
            vec![dirs, batch, h],
        )
    };
    let mut out = vec![TensorType::new(dt, y)];
    out.extend((1..cx.num_outputs).map(|_| TensorType::new(dt, state.clone())));
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Evaluation

/// The concrete extents of one evaluation.
#[derive(Clone, Copy)]
struct Dims {
    seq: usize,
    batch: usize,
    input: usize,
    hidden: usize,
    dirs: usize,
    gates: usize,
}

fn expect_shape(t: &Tensor, name: &str, dtype: DType, want: &[usize]) -> Result<(), OpError> {
    if t.dtype() != dtype {
        crate::bail!("input {name} has dtype {} but X has {dtype}", t.dtype());
    }
    if t.shape() != want {
        crate::bail!("input {name} has shape {:?}, expected {want:?}", t.shape());
    }
    Ok(())
}

/// Validates every input's concrete shape and returns the extents.
fn check_inputs(a: &RnnAttrs, cx: &EvalCtx) -> Result<Dims, OpError> {
    if cx.inputs.len() > max_inputs(a.kind) {
        crate::bail!(
            "{} inputs given, at most {} allowed",
            cx.inputs.len(),
            max_inputs(a.kind)
        );
    }
    let x = cx.input(X)?;
    if !x.dtype().is_float() || x.rank() != 3 {
        crate::bail!(
            "input X must be a rank-3 floating-point tensor, got {}",
            x.tensor_type()
        );
    }
    let s = x.shape();
    let (seq, batch) = if a.layout == 1 { (s[1], s[0]) } else { (s[0], s[1]) };
    let d = Dims {
        seq,
        batch,
        input: s[2],
        hidden: a.hidden_size,
        dirs: num_directions(a.direction),
        gates: gate_count(a.kind),
    };
    let dt = x.dtype();
    let gh = d.gates * d.hidden;
    expect_shape(cx.input(W)?, "W", dt, &[d.dirs, gh, d.input])?;
    expect_shape(cx.input(R)?, "R", dt, &[d.dirs, gh, d.hidden])?;
    if let Some(t) = cx.opt_input(B) {
        expect_shape(t, "B", dt, &[d.dirs, 2 * gh])?;
    }
    if let Some(t) = cx.opt_input(SEQ_LENS) {
        expect_shape(t, "sequence_lens", DType::I32, &[d.batch])?;
    }
    let state = if a.layout == 1 {
        [d.batch, d.dirs, d.hidden]
    } else {
        [d.dirs, d.batch, d.hidden]
    };
    for (i, name) in [(INITIAL_H, "initial_h"), (INITIAL_C, "initial_c")] {
        if let Some(t) = cx.opt_input(i) {
            expect_shape(t, name, dt, &state)?;
        }
    }
    if let Some(t) = cx.opt_input(P) {
        expect_shape(t, "P", dt, &[d.dirs, 3 * d.hidden])?;
    }
    check_alloc(&[d.seq, d.dirs, d.batch, d.hidden])?;
    check_alloc(&[d.seq, d.batch, d.input])?;
    Ok(d)
}

/// Per-row sequence lengths, each within `[0, seq]`.
fn sequence_lengths(t: Option<&Tensor>, d: Dims) -> Result<Vec<usize>, OpError> {
    let Some(t) = t else {
        return Ok(vec![d.seq; d.batch]);
    };
    t.to_i64_vec()
        .into_iter()
        .map(|l| match usize::try_from(l) {
            Ok(l) if l <= d.seq => Ok(l),
            _ => crate::bail!("sequence_lens value {l} is outside [0, {}]", d.seq),
        })
        .collect()
}

/// `[d0, d1, rest]` data reordered to `[d1, d0, rest]` (layout 1 ↔ layout 0).
fn swap_leading(v: &[f64], d0: usize, d1: usize, rest: usize) -> Vec<f64> {
    let mut out = vec![0.0; v.len()];
    for i in 0..d0 {
        for j in 0..d1 {
            let src = (i * d1 + j) * rest;
            let dst = (j * d0 + i) * rest;
            out[dst..dst + rest].copy_from_slice(&v[src..src + rest]);
        }
    }
    out
}

/// A state input (`initial_h`/`initial_c`) as `[dirs, batch, hidden]`, zeros when absent.
fn initial_state(t: Option<&Tensor>, a: &RnnAttrs, d: Dims) -> Vec<f64> {
    match t {
        None => vec![0.0; d.dirs * d.batch * d.hidden],
        Some(t) if a.layout == 1 => swap_leading(&t.to_f64_vec(), d.batch, d.dirs, d.hidden),
        Some(t) => t.to_f64_vec(),
    }
}

use super::elementwise::sigmoid;

fn activate(f: Activation, x: f64) -> f64 {
    match f {
        Activation::Relu => {
            if x > 0.0 || x.is_nan() {
                x
            } else {
                0.0
            }
        }
        Activation::Tanh => x.tanh(),
        Activation::Sigmoid => sigmoid(x),
        Activation::Affine { alpha, beta } => alpha as f64 * x + beta as f64,
        Activation::LeakyRelu { alpha } => {
            if x >= 0.0 {
                x
            } else {
                alpha as f64 * x
            }
        }
        Activation::ThresholdedRelu { alpha } => {
            if x > alpha as f64 {
                x
            } else {
                0.0
            }
        }
        Activation::ScaledTanh { alpha, beta } => alpha as f64 * (beta as f64 * x).tanh(),
        Activation::HardSigmoid { alpha, beta } => (alpha as f64 * x + beta as f64).clamp(0.0, 1.0),
        Activation::Elu { alpha } => {
            if x >= 0.0 {
                x
            } else {
                alpha as f64 * x.exp_m1()
            }
        }
        Activation::Softsign => x / (1.0 + x.abs()),
        Activation::Softplus => {
            if x > 0.0 {
                x + (-x).exp().ln_1p()
            } else {
                x.exp().ln_1p()
            }
        }
    }
}

/// The weights of one direction and how to step it.
struct Cell<'a> {
    kind: RnnKind,
    hidden: usize,
    input: usize,
    /// `[gates * hidden, input]`.
    w: &'a [f64],
    /// `[gates * hidden, hidden]`.
    r: &'a [f64],
    /// `[gates * hidden]` each.
    wb: &'a [f64],
    rb: &'a [f64],
    /// `[3 * hidden]`: i, o, f (LSTM).
    p: &'a [f64],
    /// f (RNN); f, g (GRU); f, g, h (LSTM).
    acts: &'a [Activation],
    clip: Option<f64>,
    input_forget: bool,
    linear_before_reset: bool,
}

impl Cell<'_> {
    /// Activation `k` of this direction applied to a gate pre-activation, clipped first.
    fn act(&self, k: usize, x: f64) -> f64 {
        let x = match self.clip {
            Some(c) => x.clamp(-c, c),
            None => x,
        };
        activate(self.acts[k], x)
    }

    /// Row `gate * hidden + j` of `m` (with `cols` columns) times `v`.
    fn dot(m: &[f64], cols: usize, row: usize, v: &[f64]) -> f64 {
        m[row * cols..(row + 1) * cols]
            .iter()
            .zip(v)
            .map(|(a, b)| a * b)
            .sum()
    }

    /// `W[row]·x + R[row]·h + Wb[row] + Rb[row]` for gate row `row`.
    fn pre(&self, row: usize, x: &[f64], h: &[f64]) -> f64 {
        Self::dot(self.w, self.input, row, x)
            + Self::dot(self.r, self.hidden, row, h)
            + self.wb[row]
            + self.rb[row]
    }

    /// One time step of one batch row: updates `h` (and `c` for LSTM) in place.
    fn step(&self, x: &[f64], h: &mut [f64], c: &mut [f64]) {
        match self.kind {
            RnnKind::Rnn => self.step_rnn(x, h),
            RnnKind::Gru => self.step_gru(x, h),
            RnnKind::Lstm => self.step_lstm(x, h, c),
        }
    }

    /// `Ht = f(Xt·Wiᵀ + Ht-1·Riᵀ + Wbi + Rbi)`.
    fn step_rnn(&self, x: &[f64], h: &mut [f64]) {
        let next: Vec<f64> = (0..self.hidden).map(|j| self.act(0, self.pre(j, x, h))).collect();
        h.copy_from_slice(&next);
    }

    /// Gates z, r, h (row blocks 0, 1, 2).
    fn step_gru(&self, x: &[f64], h: &mut [f64]) {
        let n = self.hidden;
        let z: Vec<f64> = (0..n).map(|j| self.act(0, self.pre(j, x, h))).collect();
        let r: Vec<f64> = (0..n).map(|j| self.act(0, self.pre(n + j, x, h))).collect();
        let rh: Vec<f64> = r.iter().zip(h.iter()).map(|(r, h)| r * h).collect();
        let next: Vec<f64> = (0..n)
            .map(|j| {
                let row = 2 * n + j;
                let wx = Self::dot(self.w, self.input, row, x) + self.wb[row];
                let pre = if self.linear_before_reset {
                    // ht = g(Xt·Whᵀ + rt ⊙ (Ht-1·Rhᵀ + Rbh) + Wbh)
                    wx + r[j] * (Self::dot(self.r, n, row, h) + self.rb[row])
                } else {
                    // ht = g(Xt·Whᵀ + (rt ⊙ Ht-1)·Rhᵀ + Rbh + Wbh)
                    wx + Self::dot(self.r, n, row, &rh) + self.rb[row]
                };
                let ht = self.act(1, pre);
                (1.0 - z[j]) * ht + z[j] * h[j]
            })
            .collect();
        h.copy_from_slice(&next);
    }

    /// Gates i, o, f, c (row blocks 0..4); peepholes i, o, f.
    fn step_lstm(&self, x: &[f64], h: &mut [f64], c: &mut [f64]) {
        let n = self.hidden;
        let (pi, po, pf) = (&self.p[..n], &self.p[n..2 * n], &self.p[2 * n..3 * n]);
        let mut next_h = vec![0.0; n];
        let mut next_c = vec![0.0; n];
        for j in 0..n {
            let i = self.act(0, self.pre(j, x, h) + pi[j] * c[j]);
            let f = if self.input_forget {
                1.0 - i
            } else {
                self.act(0, self.pre(2 * n + j, x, h) + pf[j] * c[j])
            };
            let g = self.act(1, self.pre(3 * n + j, x, h));
            let ct = f * c[j] + i * g;
            let o = self.act(0, self.pre(n + j, x, h) + po[j] * ct);
            next_c[j] = ct;
            // h sees the unclipped cell state (clip bounds gate pre-activations only).
            next_h[j] = o * activate(self.acts[2], ct);
        }
        h.copy_from_slice(&next_h);
        c.copy_from_slice(&next_c);
    }
}

/// The results of one direction: `y` `[seq, batch, hidden]`, final `h` and `c` `[batch, hidden]`.
struct DirResult {
    y: Vec<f64>,
    h: Vec<f64>,
    c: Vec<f64>,
}

/// Runs one direction over every batch row. `xs` is `[seq, batch, input]`; `h0`, `c0` are
/// `[batch, hidden]`.
fn run_direction(
    cell: &Cell,
    xs: &[f64],
    d: Dims,
    lens: &[usize],
    reverse: bool,
    h0: &[f64],
    c0: &[f64],
) -> DirResult {
    let n = d.hidden;
    let mut out = DirResult {
        y: vec![0.0; d.seq * d.batch * n],
        h: vec![0.0; d.batch * n],
        c: vec![0.0; d.batch * n],
    };
    for (b, &len) in lens.iter().enumerate() {
        let mut h = h0[b * n..(b + 1) * n].to_vec();
        let mut c = c0[b * n..(b + 1) * n].to_vec();
        for k in 0..len {
            let t = if reverse { len - 1 - k } else { k };
            let x = &xs[(t * d.batch + b) * d.input..][..d.input];
            cell.step(x, &mut h, &mut c);
            out.y[(t * d.batch + b) * n..][..n].copy_from_slice(&h);
        }
        // A row without steps keeps zero final states (onnxruntime does the same).
        if len > 0 {
            out.h[b * n..(b + 1) * n].copy_from_slice(&h);
            out.c[b * n..(b + 1) * n].copy_from_slice(&c);
        }
    }
    out
}

/// Per-direction slices of a `[dirs, len]` input, or zeros when absent.
fn per_direction(t: Option<&Tensor>, dirs: usize, len: usize) -> Vec<f64> {
    t.map(|t| t.to_f64_vec()).unwrap_or_else(|| vec![0.0; dirs * len])
}

pub(crate) fn eval(op: &Op, cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let a = attrs(op)?;
    check_attrs(a)?;
    let d = check_inputs(a, cx)?;
    if cx.num_outputs() == 0 || cx.num_outputs() > max_outputs(a.kind) {
        crate::bail!(
            "{} outputs declared, 1 to {} allowed",
            cx.num_outputs(),
            max_outputs(a.kind)
        );
    }
    let x = cx.input(X)?;
    let dt = x.dtype();
    let xs = if a.layout == 1 {
        swap_leading(&x.to_f64_vec(), d.batch, d.seq, d.input)
    } else {
        x.to_f64_vec()
    };
    let gh = d.gates * d.hidden;
    let w = cx.input(W)?.to_f64_vec();
    let r = cx.input(R)?.to_f64_vec();
    let bias = per_direction(cx.opt_input(B), d.dirs, 2 * gh);
    let p = per_direction(cx.opt_input(P), d.dirs, 3 * d.hidden);
    let lens = sequence_lengths(cx.opt_input(SEQ_LENS), d)?;
    let h0 = initial_state(cx.opt_input(INITIAL_H), a, d);
    let c0 = initial_state(cx.opt_input(INITIAL_C), a, d);
    let per = activations_per_direction(a.kind);
    let state_len = d.batch * d.hidden;
    let mut results = Vec::with_capacity(d.dirs);
    for dir in 0..d.dirs {
        let cell = Cell {
            kind: a.kind,
            hidden: d.hidden,
            input: d.input,
            w: &w[dir * gh * d.input..(dir + 1) * gh * d.input],
            r: &r[dir * gh * d.hidden..(dir + 1) * gh * d.hidden],
            wb: &bias[dir * 2 * gh..dir * 2 * gh + gh],
            rb: &bias[dir * 2 * gh + gh..(dir + 1) * 2 * gh],
            p: &p[dir * 3 * d.hidden..(dir + 1) * 3 * d.hidden],
            acts: &a.activations[dir * per..(dir + 1) * per],
            clip: a.clip.map(f64::from),
            input_forget: a.input_forget,
            linear_before_reset: a.linear_before_reset,
        };
        let reverse = a.direction == RnnDirection::Reverse || dir == 1;
        let state = dir * state_len..(dir + 1) * state_len;
        results.push(run_direction(
            &cell,
            &xs,
            d,
            &lens,
            reverse,
            &h0[state.clone()],
            &c0[state],
        ));
    }
    let mut outs = vec![assemble_y(&results, a, d, dt)];
    if cx.num_outputs() > 1 {
        outs.push(assemble_state(results.iter().map(|r| &r.h[..]), a, d, dt));
    }
    if cx.num_outputs() > 2 {
        outs.push(assemble_state(results.iter().map(|r| &r.c[..]), a, d, dt));
    }
    Ok(outs)
}

/// `Y`: `[seq, dirs, batch, hidden]`, or `[batch, seq, dirs, hidden]` for layout 1.
fn assemble_y(results: &[DirResult], a: &RnnAttrs, d: Dims, dt: DType) -> Tensor {
    let n = d.hidden;
    let mut y = vec![0.0; d.seq * d.dirs * d.batch * n];
    for (dir, res) in results.iter().enumerate() {
        for t in 0..d.seq {
            for b in 0..d.batch {
                let dst = if a.layout == 1 {
                    ((b * d.seq + t) * d.dirs + dir) * n
                } else {
                    ((t * d.dirs + dir) * d.batch + b) * n
                };
                y[dst..dst + n].copy_from_slice(&res.y[(t * d.batch + b) * n..][..n]);
            }
        }
    }
    let shape = if a.layout == 1 {
        vec![d.batch, d.seq, d.dirs, n]
    } else {
        vec![d.seq, d.dirs, d.batch, n]
    };
    to_tensor(shape, dt, y)
}

/// `Y_h`/`Y_c`: `[dirs, batch, hidden]`, or `[batch, dirs, hidden]` for layout 1.
fn assemble_state<'a>(states: impl Iterator<Item = &'a [f64]>, a: &RnnAttrs, d: Dims, dt: DType) -> Tensor {
    let stacked: Vec<f64> = states.flat_map(|s| s.iter().copied()).collect();
    if a.layout == 1 {
        let v = swap_leading(&stacked, d.dirs, d.batch, d.hidden);
        to_tensor(vec![d.batch, d.dirs, d.hidden], dt, v)
    } else {
        to_tensor(vec![d.dirs, d.batch, d.hidden], dt, stacked)
    }
}

fn to_tensor(shape: Vec<usize>, dt: DType, v: Vec<f64>) -> Tensor {
    Tensor::new(shape, TensorData::from_f64s(dt, v)).expect("output data matches its shape by construction")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(kind: RnnKind, direction: RnnDirection, hidden: usize, acts: Vec<Activation>) -> RnnAttrs {
        RnnAttrs {
            kind,
            direction,
            hidden_size: hidden,
            activations: acts,
            clip: None,
            input_forget: false,
            linear_before_reset: false,
            layout: 0,
        }
    }

    fn t(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_vec(shape.to_vec(), v.to_vec())
    }

    fn run(a: RnnAttrs, inputs: Vec<Option<Tensor>>, n_out: usize) -> Result<Vec<Tensor>, OpError> {
        let op = Op::Rnn(a);
        let refs: Vec<Option<&Tensor>> = inputs.iter().map(|t| t.as_ref()).collect();
        let owned: Vec<Option<TensorType>> = inputs
            .iter()
            .map(|t| t.as_ref().map(|t| t.tensor_type()))
            .collect();
        let icx = InferCtx {
            inputs: owned.iter().map(|t| t.as_ref()).collect(),
            values: refs.clone(),
            num_outputs: n_out,
        };
        let out_types = infer(&op, &icx)?;
        let cx = EvalCtx {
            inputs: refs,
            out_types: &out_types,
        };
        let outs = eval(&op, &cx)?;
        for (o, ty) in outs.iter().zip(&out_types) {
            assert_eq!(o.tensor_type(), *ty);
        }
        Ok(outs)
    }

    fn close(a: &Tensor, b: &[f64]) {
        let v = a.to_f64_vec();
        assert_eq!(v.len(), b.len(), "{v:?} vs {b:?}");
        for (x, y) in v.iter().zip(b) {
            assert!((x - y).abs() < 1e-6, "{v:?} vs {b:?}");
        }
    }

    /// One-unit Affine RNN (identity activation): `h_t = x_t + h_{t-1}` with W = R = 1, so
    /// outputs are prefix sums; reverse gives suffix sums; sequence_lens cuts and zero-fills.
    #[test]
    fn rnn_prefix_sums_with_lengths_and_directions() {
        let affine = Activation::Affine {
            alpha: 1.0,
            beta: 0.0,
        };
        let x = t(&[3, 2, 1], &[1.0, 10.0, 2.0, 20.0, 3.0, 30.0]);
        let w = t(&[1, 1, 1], &[1.0]);
        let lens = Tensor::from_vec(vec![2], vec![3i32, 2]);
        let a = attrs(RnnKind::Rnn, RnnDirection::Forward, 1, vec![affine]);
        let inputs = vec![
            Some(x.clone()),
            Some(w.clone()),
            Some(w.clone()),
            None,
            Some(lens.clone()),
        ];
        let out = run(a, inputs, 2).unwrap();
        // Y [seq, dirs, batch, hidden]
        close(&out[0], &[1.0, 10.0, 3.0, 30.0, 6.0, 0.0]);
        close(&out[1], &[6.0, 30.0]);

        let w2 = t(&[2, 1, 1], &[1.0, 1.0]);
        let a = attrs(RnnKind::Rnn, RnnDirection::Bidirectional, 1, vec![affine, affine]);
        let inputs = vec![Some(x), Some(w2.clone()), Some(w2), None, Some(lens)];
        let out = run(a, inputs, 2).unwrap();
        // Reverse direction of row 1 (length 2) starts at step 1: 20+10=30 at t=0, 20 at t=1.
        close(
            &out[0],
            &[1.0, 10.0, 6.0, 30.0, 3.0, 30.0, 5.0, 20.0, 6.0, 0.0, 3.0, 0.0],
        );
        close(&out[1], &[6.0, 30.0, 6.0, 30.0]);
    }

    /// Hand-computed LSTM step with peepholes and input_forget.
    #[test]
    fn lstm_single_step() {
        let acts = vec![Activation::Sigmoid, Activation::Tanh, Activation::Tanh];
        let mut a = attrs(RnnKind::Lstm, RnnDirection::Forward, 1, acts);
        let x = t(&[1, 1, 1], &[0.5]);
        // Gate rows i, o, f, c.
        let w = t(&[1, 4, 1], &[1.0, 2.0, 3.0, 4.0]);
        let r = t(&[1, 4, 1], &[0.0, 0.0, 0.0, 0.0]);
        let c0 = t(&[1, 1, 1], &[0.25]);
        let p = t(&[1, 3], &[0.5, 1.0, 2.0]);
        let inputs = vec![
            Some(x.clone()),
            Some(w.clone()),
            Some(r.clone()),
            None,
            None,
            None,
            Some(c0.clone()),
            Some(p.clone()),
        ];
        let s = |v: f64| 1.0 / (1.0 + (-v).exp());
        let i = s(0.5 + 0.5 * 0.25);
        let f = s(1.5 + 2.0 * 0.25);
        let g = (2.0f64).tanh();
        let c = f * 0.25 + i * g;
        let o = s(1.0 + 1.0 * c);
        let out = run(a.clone(), inputs.clone(), 3).unwrap();
        close(&out[1], &[o * c.tanh()]);
        close(&out[2], &[c]);

        a.input_forget = true;
        let c = (1.0 - i) * 0.25 + i * g;
        let o = s(1.0 + 1.0 * c);
        let out = run(a, inputs, 3).unwrap();
        close(&out[2], &[c]);
        close(&out[1], &[o * c.tanh()]);
    }

    /// GRU with and without linear_before_reset, hand-computed for one step from h0 = 1.
    #[test]
    fn gru_linear_before_reset() {
        let acts = vec![Activation::Sigmoid, Activation::Tanh];
        let mut a = attrs(RnnKind::Gru, RnnDirection::Forward, 1, acts);
        let x = t(&[1, 1, 1], &[1.0]);
        // Rows z, r, h.
        let w = t(&[1, 3, 1], &[0.5, -0.5, 1.0]);
        let r = t(&[1, 3, 1], &[0.25, 0.75, 2.0]);
        // Wb then Rb.
        let b = t(&[1, 6], &[0.0, 0.0, 0.1, 0.0, 0.0, 0.3]);
        let h0 = t(&[1, 1, 1], &[1.0]);
        let inputs = vec![Some(x), Some(w), Some(r), Some(b), None, Some(h0)];
        let s = |v: f64| 1.0 / (1.0 + (-v).exp());
        let z = s(0.5 + 0.25);
        let rr = s(-0.5 + 0.75);
        let ht = (1.0 + 0.1 + 2.0 * (rr * 1.0) + 0.3f64).tanh();
        let out = run(a.clone(), inputs.clone(), 2).unwrap();
        close(&out[1], &[(1.0 - z) * ht + z]);
        a.linear_before_reset = true;
        let ht = (1.0 + 0.1 + rr * (2.0 * 1.0 + 0.3f64)).tanh();
        let out = run(a, inputs, 2).unwrap();
        close(&out[1], &[(1.0 - z) * ht + z]);
    }

    /// Layout 1 is layout 0 with the batch axis moved first.
    #[test]
    fn batch_major_layout_matches() {
        let acts = vec![Activation::Tanh];
        let a0 = attrs(RnnKind::Rnn, RnnDirection::Forward, 2, acts);
        let mut a1 = a0.clone();
        a1.layout = 1;
        let xv: Vec<f32> = (0..12).map(|i| i as f32 * 0.1).collect();
        let x0 = t(&[3, 2, 2], &xv);
        let x1 = Tensor::from_vec(vec![2, 3, 2], swap_leading(&x0.to_f64_vec(), 3, 2, 2)).cast(DType::F32);
        let w = t(&[1, 2, 2], &[0.1, 0.2, 0.3, 0.4]);
        let r = t(&[1, 2, 2], &[0.5, -0.1, 0.2, 0.3]);
        let o0 = run(a0, vec![Some(x0), Some(w.clone()), Some(r.clone())], 2).unwrap();
        let o1 = run(a1, vec![Some(x1), Some(w), Some(r)], 2).unwrap();
        assert_eq!(o1[0].shape(), &[2, 3, 1, 2]);
        let y0 = o0[0].to_f64_vec();
        // y0 is [3, 1, 2, 2]; y1 is [2, 3, 1, 2].
        close(&o1[0], &swap_leading(&y0, 3, 2, 2));
        close(&o1[1], &o0[1].to_f64_vec());
    }

    /// `clip` bounds the pre-activation: an identity RNN saturates at the clip value.
    #[test]
    fn clip_bounds_pre_activations() {
        let mut a = attrs(
            RnnKind::Rnn,
            RnnDirection::Forward,
            1,
            vec![Activation::Affine {
                alpha: 1.0,
                beta: 0.0,
            }],
        );
        a.clip = Some(2.5);
        let x = t(&[3, 1, 1], &[1.0, 1.0, 1.0]);
        let w = t(&[1, 1, 1], &[1.0]);
        let out = run(a, vec![Some(x), Some(w.clone()), Some(w)], 1).unwrap();
        close(&out[0], &[1.0, 2.0, 2.5]);
    }

    /// Half-precision inputs compute in f64 and round once: the same as rounding the f32 result.
    #[test]
    fn f16_rounds_once() {
        let acts = [Activation::Sigmoid, Activation::Tanh, Activation::Tanh];
        let a = attrs(
            RnnKind::Lstm,
            RnnDirection::Bidirectional,
            2,
            [acts, acts].concat(),
        );
        let vals = |n: usize, k: f32| (0..n).map(|i| (i as f32 * k).sin() * 0.8).collect::<Vec<f32>>();
        let x = t(&[3, 2, 2], &vals(12, 0.7));
        let w = t(&[2, 8, 2], &vals(32, 1.3));
        let r = t(&[2, 8, 2], &vals(32, 0.4));
        let half = |t: &Tensor| Some(t.cast(DType::F16));
        let full = run(
            a.clone(),
            vec![Some(x.clone()), Some(w.clone()), Some(r.clone())],
            3,
        )
        .unwrap();
        let low = run(a, vec![half(&x), half(&w), half(&r)], 3).unwrap();
        assert_eq!(low[0].dtype(), DType::F16);
        // Inputs were rounded to f16, so compare loosely; the dtype and shape are exact.
        for (l, f) in low.iter().zip(&full) {
            assert_eq!(l.shape(), f.shape());
            for (p, q) in l.to_f64_vec().iter().zip(f.to_f64_vec()) {
                assert!((p - q).abs() < 1e-2, "{p} vs {q}");
            }
        }
    }

    #[test]
    fn bad_inputs_are_errors() {
        let acts = vec![Activation::Tanh];
        let a = attrs(RnnKind::Rnn, RnnDirection::Forward, 2, acts);
        let x = t(&[1, 1, 2], &[1.0, 2.0]);
        let w = t(&[1, 2, 2], &[0.0; 4]);
        let bad_r = t(&[1, 2, 3], &[0.0; 6]);
        assert!(run(a.clone(), vec![Some(x.clone()), Some(w.clone()), Some(bad_r)], 1).is_err());
        let r = t(&[1, 2, 2], &[0.0; 4]);
        let lens = Tensor::from_vec(vec![1], vec![5i32]);
        let cx_inputs = [Some(&x), Some(&w), Some(&r), None, Some(&lens)];
        let types = [
            TensorType::fixed(DType::F32, &[1, 1, 2, 2]),
            TensorType::fixed(DType::F32, &[1, 1, 2]),
        ];
        let cx = EvalCtx {
            inputs: cx_inputs.to_vec(),
            out_types: &types,
        };
        assert!(eval(&Op::Rnn(a), &cx).is_err());
    }
}
