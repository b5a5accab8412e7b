//! Control flow: `If` and `Loop`, whose bodies are subgraphs run by the reference interpreter.
//!
//! Captured outer values are explicit node inputs (after the condition for `If`, after the
//! loop-carried values for `Loop`) and the matching trailing inputs of the subgraphs.
//!
//! `Loop` semantics (ONNX): iterate while `cond` holds and fewer than `M` iterations ran. The
//! body's condition output is only consulted when the node has a `cond` input; with `M` alone
//! the loop is a plain for-loop (the ONNX pseudo-code marks that output as ignored). A loop
//! with neither input never ends by definition and is rejected. A loop with `cond` but no `M`
//! is stopped with an error after [`MAX_WHILE_ITERATIONS`] iterations, so that a model whose
//! condition never turns false fails instead of hanging; with `M` present the count is the
//! model's own bound and is not capped.

use super::util::check_alloc;
use super::{EvalCtx, InferCtx};
use crate::eval::eval_graph;
use crate::{DType, Dim, Element, Graph, IrError, Op, OpError, Tensor, TensorType, ValueId};

/// Iteration limit of a `Loop` without a trip count (see the module documentation).
pub const MAX_WHILE_ITERATIONS: i64 = 1 << 20;

/// Largest trip count type inference turns into a fixed scan-output extent; a larger known
/// count (often `INT64_MAX` in exported while-loops) leaves the extent unknown.
const MAX_STATIC_TRIP_COUNT: i64 = 1 << 31;

pub(crate) fn infer(op: &Op, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    match op {
        Op::If {
            then_branch,
            else_branch,
        } => infer_if(then_branch, else_branch, cx),
        Op::Loop { body, num_carried } => infer_loop(body, *num_carried, cx),
        other => crate::bail!("{} is not a control-flow operator", other.name()),
    }
}

pub(crate) fn eval(op: &Op, cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    match op {
        Op::If {
            then_branch,
            else_branch,
        } => eval_if(then_branch, else_branch, cx),
        Op::Loop { body, num_carried } => eval_loop(body, *num_carried, cx, MAX_WHILE_ITERATIONS),
        other => crate::bail!("{} is not a control-flow operator", other.name()),
    }
}

// ---------------------------------------------------------------------------------------------
// Shared helpers

/// Whether a type can hold exactly one element (every fixed extent is 1).
fn single_element(t: &TensorType) -> bool {
    t.shape.iter().all(|d| matches!(d, Dim::Fixed(1) | Dim::Sym(_)))
}

/// Checks a scalar-like input (`cond`, `M`) of type `dtype`.
fn expect_scalar_type(t: &TensorType, name: &str, dtype: DType) -> Result<(), OpError> {
    if t.dtype != dtype || !single_element(t) {
        crate::bail!("{name} must be a single-element {dtype} tensor, got {t}");
    }
    Ok(())
}

/// Whether two types may describe the same tensor: same dtype and rank, no conflicting extent.
fn compatible(a: &TensorType, b: &TensorType) -> bool {
    a.dtype == b.dtype
        && a.rank() == b.rank()
        && a.shape.iter().zip(&b.shape).all(|(x, y)| match (x, y) {
            (Dim::Fixed(p), Dim::Fixed(q)) => p == q,
            _ => true,
        })
}

/// The type covering both `a` and `b` (same dtype and rank): extents that differ are unknown.
fn merge(a: &TensorType, b: &TensorType, what: &str) -> Result<TensorType, OpError> {
    if a.dtype != b.dtype {
        crate::bail!("{what} is {} in one case and {} in the other", a.dtype, b.dtype);
    }
    if a.rank() != b.rank() {
        crate::bail!(
            "{what} has rank {} in one case and {} in the other; kiln needs one rank",
            a.rank(),
            b.rank()
        );
    }
    let shape = a
        .shape
        .iter()
        .zip(&b.shape)
        .map(|(x, y)| if x == y { x.clone() } else { Dim::unknown() })
        .collect();
    Ok(TensorType {
        dtype: a.dtype,
        shape,
        layout: if a.layout == b.layout {
            a.layout
        } else {
            Default::default()
        },
    })
}

/// The subgraph's input types, in order.
fn input_types(g: &Graph) -> Vec<&TensorType> {
    g.input_types().map(|(_, t)| t).collect()
}

fn output_types(g: &Graph) -> Vec<&TensorType> {
    g.outputs().iter().map(|o| g.value_type(o.value)).collect()
}

/// Checks that `given` (node input types) fit the subgraph's declared inputs `declared`.
fn check_subgraph_inputs(
    what: &str,
    declared: &[&TensorType],
    given: &[&TensorType],
    names: &[String],
) -> Result<(), OpError> {
    if declared.len() != given.len() {
        crate::bail!(
            "{what} takes {} inputs but the node passes {}",
            declared.len(),
            given.len()
        );
    }
    for ((d, g), name) in declared.iter().zip(given).zip(names) {
        if !compatible(d, g) {
            crate::bail!("{what} input '{name}' is typed {d} but the node passes {g}");
        }
    }
    Ok(())
}

fn input_names(g: &Graph) -> Vec<String> {
    g.input_types().map(|(n, _)| n.to_string()).collect()
}

/// The types of inputs `range` (all must be present).
fn present_types<'a>(
    cx: &InferCtx<'a>,
    range: std::ops::Range<usize>,
    what: &str,
) -> Result<Vec<&'a TensorType>, OpError> {
    range
        .map(|i| {
            cx.opt_ty(i)
                .ok_or_else(|| OpError::new(format!("{what} input {i} is missing")))
        })
        .collect()
}

/// The tensors of inputs `range` (all must be present).
fn present_inputs<'a>(cx: &EvalCtx<'a>, range: std::ops::Range<usize>) -> Result<Vec<&'a Tensor>, OpError> {
    range.map(|i| cx.input(i)).collect()
}

/// The one element of a bool tensor.
fn bool_value(t: &Tensor, name: &str) -> Result<bool, OpError> {
    match t.as_slice::<bool>() {
        Some([v]) => Ok(*v),
        _ => crate::bail!(
            "{name} must be a single-element bool tensor, got {}",
            t.tensor_type()
        ),
    }
}

/// The one element of an i64 tensor.
fn i64_value(t: &Tensor, name: &str) -> Result<i64, OpError> {
    match t.as_slice::<i64>() {
        Some([v]) => Ok(*v),
        _ => crate::bail!(
            "{name} must be a single-element i64 tensor, got {}",
            t.tensor_type()
        ),
    }
}

fn run_subgraph(g: &Graph, what: &str, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, OpError> {
    eval_graph(g, inputs).map_err(|e| {
        let msg = format!("in {what}: {e}");
        match e {
            IrError::OverBudget(_) => OpError::over_budget(msg),
            _ => OpError::new(msg),
        }
    })
}

// ---------------------------------------------------------------------------------------------
// If

fn infer_if(then_g: &Graph, else_g: &Graph, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    expect_scalar_type(cx.ty(0)?, "cond", DType::Bool)?;
    let captures = present_types(cx, 1..cx.num_inputs(), "captured")?;
    for (g, what) in [(then_g, "then_branch"), (else_g, "else_branch")] {
        check_subgraph_inputs(what, &input_types(g), &captures, &input_names(g))?;
        if g.outputs().len() != cx.num_outputs {
            crate::bail!(
                "{what} has {} outputs but the node declares {}",
                g.outputs().len(),
                cx.num_outputs
            );
        }
    }
    let (then_t, else_t) = (output_types(then_g), output_types(else_g));
    if let Some(c) = cx.value(0) {
        let taken = if bool_value(c, "cond")? { then_t } else { else_t };
        return Ok(taken.into_iter().cloned().collect());
    }
    then_t
        .iter()
        .zip(&else_t)
        .enumerate()
        .map(|(i, (a, b))| merge(a, b, &format!("output {i} of the branches")))
        .collect()
}

fn eval_if(then_g: &Graph, else_g: &Graph, cx: &EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let cond = bool_value(cx.input(0)?, "cond")?;
    let (g, what) = if cond {
        (then_g, "then_branch")
    } else {
        (else_g, "else_branch")
    };
    let captures = present_inputs(cx, 1..cx.inputs.len())?;
    let outs = run_subgraph(g, what, captures.into_iter().cloned().collect())?;
    check_outputs(&outs, cx, what)?;
    Ok(outs)
}

/// A subgraph's results must match the node's declared outputs in count and dtype.
fn check_outputs(outs: &[Tensor], cx: &EvalCtx, what: &str) -> Result<(), OpError> {
    if outs.len() != cx.num_outputs() {
        crate::bail!(
            "{what} produced {} values, the node has {} outputs",
            outs.len(),
            cx.num_outputs()
        );
    }
    for (i, t) in outs.iter().enumerate() {
        if t.dtype() != cx.out_dtype(i) {
            crate::bail!(
                "{what} output {i} is {} but the node declares {}",
                t.dtype(),
                cx.out_dtype(i)
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Loop

/// Whether the body's condition output is true in every iteration given a true condition
/// input: it is that input (through `Identity`s) or a constant true.
fn body_keeps_condition(body: &Graph) -> bool {
    let (Some(out), Some(&cond_in)) = (body.outputs().first(), body.inputs().get(1)) else {
        return false;
    };
    let mut v: ValueId = out.value;
    loop {
        if v.node == cond_in {
            return true;
        }
        if let Some(t) = body.known_value(v) {
            return t.as_slice::<bool>().is_some_and(|s| s.iter().all(|&b| b));
        }
        let node = body.node(v.node);
        match (&node.op, node.inputs.first()) {
            (Op::Identity, Some(Some(src))) => v = *src,
            _ => return false,
        }
    }
}

/// The leading extent of the scan outputs: the iteration count when it is known.
fn trip_count_dim(body: &Graph, cx: &InferCtx) -> Dim {
    let cond = match (cx.opt_ty(1), cx.value(1)) {
        (None, _) => Some(true),
        (Some(_), Some(t)) => bool_value(t, "cond").ok(),
        (Some(_), None) => None,
    };
    let m = cx.value(0).and_then(|t| i64_value(t, "M").ok());
    match (cond, m) {
        (Some(false), _) => Dim::Fixed(0),
        (Some(true), Some(m)) if m <= 0 => Dim::Fixed(0),
        // With a cond input, the body's condition may end the loop early unless it is kept.
        (Some(true), Some(m))
            if m <= MAX_STATIC_TRIP_COUNT && (cx.opt_ty(1).is_none() || body_keeps_condition(body)) =>
        {
            Dim::Fixed(m as usize)
        }
        _ => Dim::unknown(),
    }
}

fn infer_loop(body: &Graph, num_carried: usize, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    if cx.num_inputs() < 2 + num_carried {
        crate::bail!(
            "{} inputs given, at least {} expected (M, cond, carried values)",
            cx.num_inputs(),
            2 + num_carried
        );
    }
    if cx.num_outputs < num_carried {
        crate::bail!(
            "{} outputs declared for {num_carried} loop-carried values",
            cx.num_outputs
        );
    }
    match (cx.opt_ty(0), cx.opt_ty(1)) {
        (None, None) => crate::bail!("a Loop without trip count M and without cond never terminates"),
        (m, c) => {
            if let Some(m) = m {
                expect_scalar_type(m, "trip count M", DType::I64)?;
            }
            if let Some(c) = c {
                expect_scalar_type(c, "cond", DType::Bool)?;
            }
        }
    }
    let carried = present_types(cx, 2..2 + num_carried, "loop-carried")?;
    let captured = present_types(cx, 2 + num_carried..cx.num_inputs(), "captured")?;
    let body_in = input_types(body);
    let iter_ty = TensorType::scalar(DType::I64);
    let cond_ty = TensorType::scalar(DType::Bool);
    let mut given = vec![&iter_ty, &cond_ty];
    given.extend(&carried);
    given.extend(&captured);
    check_subgraph_inputs("the loop body", &body_in, &given, &input_names(body))?;
    let body_out = output_types(body);
    if body_out.len() != 1 + cx.num_outputs {
        crate::bail!(
            "the loop body has {} outputs, expected {} (cond and one per node output)",
            body_out.len(),
            1 + cx.num_outputs
        );
    }
    expect_scalar_type(body_out[0], "the loop body's condition output", DType::Bool)?;
    let mut out = Vec::with_capacity(cx.num_outputs);
    for j in 0..num_carried {
        // Zero iterations return the initial value; otherwise the body's last output.
        let what = format!("loop-carried value {j}");
        let t = merge(carried[j], body_in[2 + j], &what)?;
        out.push(merge(&t, body_out[1 + j], &what)?);
    }
    let trip = trip_count_dim(body, cx);
    for t in &body_out[1 + num_carried..] {
        let mut shape = vec![trip.clone()];
        shape.extend(t.shape.iter().cloned());
        out.push(TensorType::new(t.dtype, shape));
    }
    Ok(out)
}

/// Bytes a stacked scan part costs beyond its data until the loop ends: the tensor's header,
/// shape and allocation (a loop of 10^9 scalar iterations holds 10^9 of them).
const SCAN_PART_OVERHEAD: usize = 128;

/// Runs a Loop node; `max_while` caps a loop without trip count.
fn eval_loop(body: &Graph, num_carried: usize, cx: &EvalCtx, max_while: i64) -> Result<Vec<Tensor>, OpError> {
    let n_in = cx.inputs.len();
    if n_in < 2 + num_carried || cx.num_outputs() < num_carried {
        crate::bail!(
            "Loop node has {n_in} inputs and {} outputs for {num_carried} carried values",
            cx.num_outputs()
        );
    }
    let m = cx
        .opt_input(0)
        .map(|t| i64_value(t, "trip count M"))
        .transpose()?;
    let cond_in = cx.opt_input(1).map(|t| bool_value(t, "cond")).transpose()?;
    if m.is_none() && cond_in.is_none() {
        crate::bail!("a Loop without trip count M and without cond never terminates");
    }
    let mut carried: Vec<Tensor> = present_inputs(cx, 2..2 + num_carried)?
        .into_iter()
        .cloned()
        .collect();
    let captured = present_inputs(cx, 2 + num_carried..n_in)?;
    let num_scan = cx.num_outputs() - num_carried;
    // Scan outputs stack one value per iteration: with a trip count and static body outputs,
    // their whole size is known before the first iteration (a trip count of 10^12 fails here
    // at once instead of running for hours).
    let scan_types = &output_types(body)[1 + num_carried..];
    if let (Some(m), true) = (m, num_scan > 0) {
        let per_iteration: u128 = scan_types
            .iter()
            .filter_map(|t| t.size_bytes())
            .map(|b| (b + SCAN_PART_OVERHEAD) as u128)
            .sum();
        crate::budget::check(
            per_iteration.saturating_mul(m.max(0) as u128),
            0,
            &format!("{num_scan} scan output(s) over {m} iterations"),
        )?;
    }
    let mut scan_bytes: u128 = 0;
    let mut scans: Vec<Vec<Tensor>> = vec![vec![]; num_scan];
    let mut cond = cond_in.unwrap_or(true);
    let mut i: i64 = 0;
    while cond && !matches!(m, Some(m) if i >= m) {
        if m.is_none() && i >= max_while {
            crate::bail!(
                "the loop ran {max_while} iterations without its condition turning false; \
                 stopped as a runaway loop (a loop without trip count M is capped)"
            );
        }
        let mut feeds = Vec::with_capacity(2 + num_carried + captured.len());
        feeds.push(Tensor::scalar(i));
        feeds.push(Tensor::scalar(cond));
        feeds.append(&mut carried);
        feeds.extend(captured.iter().map(|&t| t.clone()));
        let outs = run_subgraph(body, &format!("the loop body (iteration {i})"), feeds)?;
        if outs.len() != 1 + cx.num_outputs() {
            crate::bail!(
                "the loop body produced {} values, expected {}",
                outs.len(),
                1 + cx.num_outputs()
            );
        }
        let mut outs = outs.into_iter();
        let body_cond = outs.next().expect("length checked above");
        if cond_in.is_some() {
            cond = bool_value(&body_cond, "the loop body's condition output")?;
        }
        carried = outs.by_ref().take(num_carried).collect();
        for (s, t) in scans.iter_mut().zip(outs) {
            scan_bytes += (t.size_bytes() + SCAN_PART_OVERHEAD) as u128;
            s.push(t);
        }
        i += 1;
        if num_scan > 0 {
            crate::budget::check(scan_bytes, 0, &format!("the scan outputs of {i} iterations"))?;
        }
    }
    let mut results = carried;
    for (k, parts) in scans.into_iter().enumerate() {
        results.push(stack(parts, &cx.out_types[num_carried + k], k)?);
    }
    for (i, t) in results.iter().enumerate() {
        if t.dtype() != cx.out_dtype(i) {
            crate::bail!(
                "Loop output {i} is {} but the node declares {}",
                t.dtype(),
                cx.out_dtype(i)
            );
        }
    }
    Ok(results)
}

/// Stacks the per-iteration values of scan output `k` along a new leading axis. With no
/// iterations the result is empty, shaped by the declared type (unknown extents as 0).
fn stack(parts: Vec<Tensor>, ty: &TensorType, k: usize) -> Result<Tensor, OpError> {
    let Some(first) = parts.first() else {
        let shape: Vec<usize> = std::iter::once(0)
            .chain(ty.shape.iter().skip(1).map(|d| d.fixed().unwrap_or(0)))
            .collect();
        return Ok(Tensor::zeros(ty.dtype, shape));
    };
    let (dtype, inner) = (first.dtype(), first.shape().to_vec());
    for (i, p) in parts.iter().enumerate() {
        if p.dtype() != dtype || p.shape() != inner.as_slice() {
            crate::bail!(
                "scan output {k} is {} in iteration 0 but {} in iteration {i}; every iteration must give one shape",
                first.tensor_type(),
                p.tensor_type()
            );
        }
    }
    let mut shape = vec![parts.len()];
    shape.extend(&inner);
    check_alloc(&shape)?;
    let data = crate::dispatch_dtype!(dtype, T => concat::<T>(&parts));
    Tensor::new(shape, data).map_err(|e| OpError::new(e.to_string()))
}

fn concat<T: Element>(parts: &[Tensor]) -> crate::TensorData {
    let mut out: Vec<T> = Vec::with_capacity(parts.iter().map(Tensor::len).sum());
    for p in parts {
        out.extend_from_slice(p.as_slice::<T>().expect("dtype checked by the caller"));
    }
    T::wrap(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Activation, RnnAttrs, RnnDirection, RnnKind};

    fn scalar_ty(d: DType) -> TensorType {
        TensorType::scalar(d)
    }

    fn cell() -> TensorType {
        TensorType::fixed(DType::F32, &[1, 1, 1])
    }

    fn cell_value(v: f32) -> Tensor {
        Tensor::from_vec(vec![1, 1, 1], vec![v])
    }

    /// `x + step` without other operator families: a one-step, one-unit RNN with identity
    /// activation and unit weights (`h1 = step·1 + h0·1`).
    fn add_via_rnn(g: &mut Graph, x: ValueId, step: ValueId) -> ValueId {
        let one = g.add_const("one", cell_value(1.0));
        let op = Op::Rnn(RnnAttrs {
            kind: RnnKind::Rnn,
            direction: RnnDirection::Forward,
            hidden_size: 1,
            activations: vec![Activation::Affine {
                alpha: 1.0,
                beta: 0.0,
            }],
            clip: None,
            input_forget: false,
            linear_before_reset: false,
            layout: 0,
        });
        let inputs = vec![Some(step), Some(one), Some(one), None, None, Some(x)];
        let names = vec![String::new(), "sum".to_string()];
        g.add_node("add", op, inputs, names).unwrap()[1]
    }

    /// Body: carried `x` (f32[1,1,1]) and `go` (bool[]), captured `step`. Outputs: cond = `go`
    /// (or the cond input when `pass_cond`), `x + step`, `go_next`, and scans of the iteration
    /// number and of the new `x`. `go_next` is a constant: false makes a while-loop stop after
    /// one more iteration.
    fn body(pass_cond: bool, go_next: bool) -> Graph {
        let mut g = Graph::new("body");
        let iter = g.add_input("i", scalar_ty(DType::I64));
        let cond = g.add_input("cond", scalar_ty(DType::Bool));
        let x = g.add_input("x", cell());
        let go = g.add_input("go", scalar_ty(DType::Bool));
        let step = g.add_input("step", cell());
        let y = add_via_rnn(&mut g, x, step);
        let next = g.add_const("next", Tensor::scalar(go_next));
        g.add_output("cond", if pass_cond { cond } else { go });
        g.add_output("x", y);
        g.add_output("go", next);
        g.add_output("iters", iter);
        g.add_output("xs", y);
        g
    }

    fn loop_op(body: Graph) -> Op {
        Op::Loop {
            body: Box::new(body),
            num_carried: 2,
        }
    }

    fn loop_inputs(m: Option<i64>, cond: Option<bool>) -> Vec<Option<Tensor>> {
        vec![
            m.map(Tensor::scalar),
            cond.map(Tensor::scalar),
            Some(cell_value(1.0)),
            Some(Tensor::scalar(true)),
            Some(cell_value(2.0)),
        ]
    }

    fn infer_types(op: &Op, inputs: &[Option<Tensor>], n_out: usize) -> Result<Vec<TensorType>, OpError> {
        let types: Vec<Option<TensorType>> = inputs
            .iter()
            .map(|t| t.as_ref().map(Tensor::tensor_type))
            .collect();
        let cx = InferCtx {
            inputs: types.iter().map(|t| t.as_ref()).collect(),
            values: inputs.iter().map(|t| t.as_ref()).collect(),
            num_outputs: n_out,
        };
        infer(op, &cx)
    }

    fn run_capped(
        op: &Op,
        inputs: &[Option<Tensor>],
        n_out: usize,
        cap: i64,
    ) -> Result<Vec<Tensor>, OpError> {
        let out_types = infer_types(op, inputs, n_out)?;
        let cx = EvalCtx {
            inputs: inputs.iter().map(|t| t.as_ref()).collect(),
            out_types: &out_types,
        };
        let outs = match op {
            Op::Loop { body, num_carried } => eval_loop(body, *num_carried, &cx, cap)?,
            _ => eval(op, &cx)?,
        };
        for (t, ty) in outs.iter().zip(&out_types) {
            assert!(compatible(&t.tensor_type(), ty), "{} vs {ty}", t.tensor_type());
        }
        Ok(outs)
    }

    fn run(op: &Op, inputs: &[Option<Tensor>], n_out: usize) -> Result<Vec<Tensor>, OpError> {
        run_capped(op, inputs, n_out, MAX_WHILE_ITERATIONS)
    }

    #[test]
    fn for_loop_scans_and_types() {
        let op = loop_op(body(true, true));
        let inputs = loop_inputs(Some(3), Some(true));
        let types = infer_types(&op, &inputs, 4).unwrap();
        assert_eq!(types[2].to_string(), "i64[3]");
        assert_eq!(types[3].to_string(), "f32[3,1,1,1]");
        let out = run(&op, &inputs, 4).unwrap();
        assert_eq!(out[0].to_f64_vec(), vec![7.0]);
        assert_eq!(out[2].to_f64_vec(), vec![0.0, 1.0, 2.0]);
        assert_eq!(out[3].to_f64_vec(), vec![3.0, 5.0, 7.0]);
    }

    #[test]
    fn condition_output_ends_a_while_loop() {
        // cond input given: the body's `go` output (true, then false) ends after 2 iterations.
        let op = loop_op(body(false, false));
        let inputs = loop_inputs(None, Some(true));
        let types = infer_types(&op, &inputs, 4).unwrap();
        assert_eq!(types[2].shape[0], Dim::unknown());
        let out = run(&op, &inputs, 4).unwrap();
        assert_eq!(out[2].to_f64_vec(), vec![0.0, 1.0]);
        assert_eq!(out[1].to_f64_vec(), vec![0.0]);
        // Without a cond input the body's condition is ignored: M iterations run.
        let out = run(&op, &loop_inputs(Some(4), None), 4).unwrap();
        assert_eq!(out[2].to_f64_vec(), vec![0.0, 1.0, 2.0, 3.0]);
        // M bounds a while-loop too.
        let out = run(&op, &loop_inputs(Some(1), Some(true)), 4).unwrap();
        assert_eq!(out[0].to_f64_vec(), vec![3.0]);
    }

    #[test]
    fn zero_iterations_keep_initial_values() {
        let op = loop_op(body(true, true));
        for inputs in [
            loop_inputs(Some(0), Some(true)),
            loop_inputs(Some(-5), None),
            loop_inputs(Some(9), Some(false)),
        ] {
            let types = infer_types(&op, &inputs, 4).unwrap();
            assert_eq!(types[3].to_string(), "f32[0,1,1,1]");
            let out = run(&op, &inputs, 4).unwrap();
            assert_eq!(out[0].to_f64_vec(), vec![1.0]);
            assert_eq!(out[3].shape(), &[0, 1, 1, 1]);
        }
    }

    #[test]
    fn endless_loops_are_errors() {
        let op = loop_op(body(true, true));
        assert!(infer_types(&op, &loop_inputs(None, None), 4).is_err());
        let err = run_capped(&op, &loop_inputs(None, Some(true)), 4, 50).unwrap_err();
        assert!(err.msg.contains("runaway"), "{err}");
        // With M the model's own bound applies.
        let out = run_capped(&op, &loop_inputs(Some(60), Some(true)), 4, 50).unwrap();
        assert_eq!(out[2].len(), 60);
    }

    #[test]
    fn loop_rejects_bad_inputs() {
        let op = loop_op(body(true, true));
        let mut inputs = loop_inputs(Some(2), Some(true));
        inputs[0] = Some(Tensor::scalar(2i32));
        assert!(infer_types(&op, &inputs, 4).is_err());
        let mut inputs = loop_inputs(Some(2), Some(true));
        inputs[2] = Some(Tensor::from_vec(vec![2], vec![1.0f32, 2.0]));
        assert!(infer_types(&op, &inputs, 4).is_err());
        assert!(infer_types(&op, &loop_inputs(Some(2), Some(true)), 3).is_err());
        let parts = vec![
            Tensor::from_vec(vec![1], vec![1.0f32]),
            Tensor::from_vec(vec![2], vec![1.0f32, 2.0]),
        ];
        assert!(stack(parts, &TensorType::fixed(DType::F32, &[2, 1]), 0).is_err());
    }

    /// A branch returning its captured input (`pass`) or a constant of `len` elements.
    fn branch(pass: bool, len: usize) -> Graph {
        let mut g = Graph::new("branch");
        let x = g.add_input("x", TensorType::new(DType::F32, vec![Dim::Sym("n".into())]));
        let c = g.add_const("c", Tensor::from_vec(vec![len], vec![7.0f32; len]));
        g.add_output("y", if pass { x } else { c });
        g
    }

    #[test]
    fn if_picks_branch_and_merges_types() {
        let op = Op::If {
            then_branch: Box::new(branch(true, 0)),
            else_branch: Box::new(branch(false, 3)),
        };
        let x = Tensor::from_vec(vec![2], vec![1.0f32, 2.0]);
        let cond_ty = scalar_ty(DType::Bool);
        let x_ty = TensorType::new(DType::F32, vec![Dim::Sym("n".into())]);
        let cx = InferCtx {
            inputs: vec![Some(&cond_ty), Some(&x_ty)],
            values: vec![None, None],
            num_outputs: 1,
        };
        assert_eq!(infer(&op, &cx).unwrap()[0].to_string(), "f32[?]");
        // A known condition gives the taken branch's type.
        assert_eq!(
            infer_types(&op, &[Some(Tensor::scalar(false)), Some(x.clone())], 1).unwrap()[0].to_string(),
            "f32[3]"
        );
        for (c, want) in [(true, vec![1.0, 2.0]), (false, vec![7.0; 3])] {
            let out = run(&op, &[Some(Tensor::scalar(c)), Some(x.clone())], 1).unwrap();
            assert_eq!(out[0].to_f64_vec(), want);
        }
        assert!(infer_types(&op, &[Some(Tensor::scalar(1i64)), Some(x.clone())], 1).is_err());
        assert!(infer_types(&op, &[Some(Tensor::scalar(true)), Some(x)], 2).is_err());
        // Branch outputs of different ranks cannot be merged.
        let mut g = Graph::new("scalar");
        let _ = g.add_input("x", x_ty.clone());
        let c = g.add_const("c", Tensor::scalar(1.0f32));
        g.add_output("y", c);
        let op = Op::If {
            then_branch: Box::new(branch(true, 0)),
            else_branch: Box::new(g),
        };
        assert!(infer(&op, &cx).is_err());
    }
}
