//! Elementwise groups as one generated loop: a connected set of elementwise nodes (Unary,
//! Binary, Clip, Where, Cast, per-tensor QuantizeLinear/DequantizeLinear) whose intermediate values have no users outside the set is
//! computed per element of the group's output, the intermediates living only in registers.
//!
//! numpy broadcasting composes (an input broadcast to an intermediate shape, and that shape to
//! the output's, is the input broadcast to the output's shape directly), so every external
//! input is read through strides relative to the output shape, 0 on broadcast axes. Adjacent
//! axes that every input reads the same way are merged; the loop runs over the outer axes, and
//! explicitly vectorised (`lanes` elements, then a one-lane tail) over the innermost one, where
//! each input is either contiguous (vector load) or constant (one load, splat).

use super::emit::Emit;
use super::{llvm, vmath, GeneratedKernel, KernelBuilder};
use crate::error::{CodegenError, Result};
use crate::kernel::KernelCommon;
use crate::target::TargetDesc;
use inkwell::types::{BasicTypeEnum, VectorType};
use inkwell::values::{BasicValue, BasicValueEnum, FloatValue, IntValue, PointerValue, VectorValue};
use inkwell::{FloatPredicate, IntPredicate};
use kiln_ir::{Binary, DType, Graph, NodeId, Op, QuantOp, Unary, ValueId};
use std::collections::HashMap;

/// Where a step reads an operand.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Src {
    /// External input `i` of the kernel.
    Input(usize),
    /// The result of an earlier step.
    Step(usize),
    /// A scalar constant known at compile time: its value as f64, for the float dtypes, and its
    /// bits as i64 (exact for 64-bit integers, which f64 would round), for the others.
    Const { f: f64, i: i64 },
}

#[derive(Clone, Debug)]
struct Step {
    op: Op,
    args: Vec<Option<Src>>,
    /// dtypes of the operands (None for an absent optional operand) and of the result.
    arg_types: Vec<Option<DType>>,
    dtype: DType,
}

/// A group's analysis, shared by the CPU loop ([`EwKernel`]) and the GPU kernel: the merged
/// output axes, how each external input is read on them, and the steps computed per element.
#[derive(Clone, Debug)]
pub(crate) struct EwGroup {
    /// Merged output axes (all > 1, at least one).
    pub(crate) dims: Vec<usize>,
    /// Per external input: its element strides on the merged axes (0 = broadcast).
    pub(crate) strides: Vec<Vec<usize>>,
    pub(crate) in_types: Vec<DType>,
    steps: Vec<Step>,
    /// The nodes' operator names, for reports.
    pub(crate) ops: Vec<&'static str>,
}

#[derive(Debug)]
pub struct EwKernel {
    g: EwGroup,
    lanes: u32,
    what: String,
}

fn supported_dtype(d: DType) -> bool {
    matches!(d, DType::F32 | DType::I32 | DType::I64 | DType::Bool)
}

/// The 8-bit integers of quantized models: only QuantizeLinear writes them and only
/// DequantizeLinear reads them here (`quant`).
fn is_8bit(d: DType) -> bool {
    matches!(d, DType::U8 | DType::I8)
}

/// A QuantizeLinear from f32 to u8/i8 or a DequantizeLinear from u8/i8 to f32 with per-tensor
/// parameters (`quant`), in the CPU loop and the GPU kernel: constants, or single values
/// computed at run time (DynamicQuantizeLinear's scale and zero point), read as broadcast
/// operands. The GPU kernel also takes 16-bit integers and per-axis and blocked parameters
/// (read along their axis, [`per_axis_param`]).
fn supports_quant(graph: &Graph, id: NodeId, gpu: bool) -> bool {
    let node = graph.node(id);
    let (Some(Some(x)), Some(Some(_))) = (node.inputs.first(), node.inputs.get(1)) else {
        return false;
    };
    let params_ok = node.inputs[1..].iter().flatten().all(|v| {
        let t = graph.value_type(*v);
        t.layout == kiln_ir::Layout::RowMajor
            && t.fixed_shape().is_some_and(|s| s.iter().product::<usize>() == 1)
            || (gpu && per_axis_param(graph, id, *v).is_some())
    });
    let (xt, out) = (graph.value_type(*x).dtype, graph.value_type(id.out(0)).dtype);
    let int_ok = |d: DType| is_8bit(d) || (gpu && matches!(d, DType::U16 | DType::I16));
    let scale_f32 = graph.value_type(node.inputs[1].expect("checked")).dtype == DType::F32;
    params_ok
        && scale_f32
        && match node.op {
            Op::Quant(QuantOp::QuantizeLinear {
                block_size,
                precision: None,
                ..
            }) => xt == DType::F32 && int_ok(out) && (gpu || block_size == 0),
            Op::Quant(QuantOp::DequantizeLinear { block_size, .. }) => {
                int_ok(xt) && out == DType::F32 && (gpu || block_size == 0)
            }
            _ => false,
        }
}

/// How a QuantizeLinear/DequantizeLinear reads a scale or zero point that is not one value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ParamAxis {
    /// 1-D, as long as axis `.0` of x (of rank 2 or more): element `i` along that axis.
    PerAxis(usize),
    /// x's shape with axis `axis` divided by `block`, which divides it: element `i / block`
    /// along that axis, the same position along the others.
    Blocked { axis: usize, block: usize },
}

/// How node `id` reads `param`, a per-axis or blocked scale or zero point of a
/// QuantizeLinear/DequantizeLinear; None for any other operand. (A block that does not divide
/// its axis is left to the library kernel.)
fn per_axis_param(graph: &Graph, id: NodeId, param: ValueId) -> Option<ParamAxis> {
    let node = graph.node(id);
    let (axis, block) = match node.op {
        Op::Quant(QuantOp::QuantizeLinear { axis, block_size, .. })
        | Op::Quant(QuantOp::DequantizeLinear { axis, block_size, .. }) => (axis, block_size),
        _ => return None,
    };
    if !node.inputs[1..].contains(&Some(param)) {
        return None;
    }
    let x = graph
        .value_type(node.inputs.first().copied().flatten()?)
        .fixed_shape()?;
    let p = graph.value_type(param);
    let a = usize::try_from(if axis < 0 { axis + x.len() as i64 } else { axis }).ok()?;
    if p.layout != kiln_ir::Layout::RowMajor || a >= x.len() {
        return None;
    }
    let ps = p.fixed_shape()?;
    if block == 0 {
        return (x.len() >= 2 && ps == [x[a]]).then_some(ParamAxis::PerAxis(a));
    }
    let mut blocked = x.clone();
    blocked[a] = x[a] / block;
    (x[a] % block == 0 && ps == blocked).then_some(ParamAxis::Blocked { axis: a, block })
}

/// Whether the generator computes `node` (its operator on its operand and result dtypes).
pub fn supports(graph: &Graph, id: NodeId) -> bool {
    supports_on(graph, id, false)
}

/// [`supports`] for the CPU loop or (`gpu`) the GPU kernel. The GPU kernel also takes the
/// operators whose library versions would run on one GPU thread there (log, erf, GELU, the ELU
/// family, softplus, pow, PRelu, Cast f32<->bf16); on the CPU those keep their vectorised
/// library kernels.
pub(crate) fn supports_on(graph: &Graph, id: NodeId, gpu: bool) -> bool {
    let node = graph.node(id);
    if node.outputs.len() != 1 || !graph.value_type(id.out(0)).is_static() {
        return false;
    }
    let out = graph.value_type(id.out(0)).dtype;
    if matches!(node.op, Op::Quant(_)) {
        return supports_quant(graph, id, gpu);
    }
    let ins: Vec<Option<DType>> = node
        .inputs
        .iter()
        .map(|v| v.map(|v| graph.value_type(v).dtype))
        .collect();
    // On the CPU bf16 is only converted, from or to f32 (the autocast pass's pairs), and
    // that in the GPU kernel alone: in registers it is an f32 whose low 16 bits are zero. The
    // GPU kernel also computes in bf16 and f16 (f32 registers, rounded after every operator,
    // as the reference rounds), f64, and integers of every width (`ints`).
    let dtype_ok = |d: DType| supported_dtype(d) || gpu;
    if !dtype_ok(out) || ins.iter().flatten().any(|d| !dtype_ok(*d)) {
        return false;
    }
    if node
        .inputs
        .iter()
        .flatten()
        .any(|v| !graph.value_type(*v).is_static())
    {
        return false;
    }
    let x = ins.first().copied().flatten();
    let float = x.is_some_and(|d| d.is_float());
    let int = x.is_some_and(|d| d.is_int());
    // The f32 polynomials (`vmath`) and the f32 constants of the activations: not for f64.
    let float32 = float && x != Some(DType::F64);
    if let (Op::Unary(u), Some(x)) = (&node.op, x) {
        if gpu && libm_function(u, x).is_some() {
            return true;
        }
    }
    match &node.op {
        Op::Unary(u) => match u {
            Unary::Abs | Unary::Neg | Unary::Relu => float || int,
            Unary::Not => x == Some(DType::Bool),
            Unary::BitwiseNot => int && gpu,
            Unary::IsNaN | Unary::IsInf { .. } => float,
            Unary::Sqrt | Unary::Reciprocal | Unary::Floor | Unary::Ceil | Unary::Round => float,
            Unary::Sigmoid
            | Unary::Exp
            | Unary::Tanh
            | Unary::HardSwish
            | Unary::LeakyRelu { .. }
            | Unary::HardSigmoid { .. }
            | Unary::Swish { .. } => float32,
            Unary::Sign => float && gpu,
            Unary::Log
            | Unary::Erf
            | Unary::Gelu { .. }
            | Unary::Elu { .. }
            | Unary::Selu { .. }
            | Unary::Celu { .. }
            | Unary::Softsign
            | Unary::Softplus
            | Unary::Mish
            | Unary::ThresholdedRelu { .. }
            | Unary::Shrink { .. } => float32 && gpu,
            _ => false,
        },
        Op::Binary(b) => {
            if ins.len() != 2 {
                return false;
            }
            if *b == Binary::Pow {
                // A float base takes any exponent but f64 (converted to the base's type); an
                // integer base an exponent of its own type.
                let y = ins[1];
                return gpu
                    && ((float32 && y.is_some_and(|d| d != DType::F64 && d != DType::Bool))
                        || (int && (ins[0] == ins[1] || y.is_some_and(|d| d.is_float()))));
            }
            if ins[0] != ins[1] {
                return false;
            }
            match b {
                Binary::Add | Binary::Sub | Binary::Mul | Binary::Min | Binary::Max => float || int,
                Binary::Div | Binary::Mod | Binary::FMod => float || int,
                Binary::Less | Binary::LessOrEqual | Binary::Greater | Binary::GreaterOrEqual => float || int,
                Binary::Equal => true,
                Binary::And | Binary::Or | Binary::Xor => x == Some(DType::Bool),
                Binary::BitwiseAnd
                | Binary::BitwiseOr
                | Binary::BitwiseXor
                | Binary::BitShiftLeft
                | Binary::BitShiftRight => int && gpu,
                Binary::PRelu => float32 && gpu,
                _ => false,
            }
        }
        Op::Where => ins.len() == 3 && ins[0] == Some(DType::Bool) && ins[1] == ins[2],
        Op::Clip => {
            (float || int)
                && node.inputs.iter().skip(1).flatten().all(|v| {
                    graph.value_type(*v).dtype == x.unwrap_or(DType::F32)
                        && graph
                            .value_type(*v)
                            .fixed_shape()
                            .is_some_and(|s| s.iter().product::<usize>() == 1)
                })
        }
        // A float to integer conversion is left to the CPU's kernel library (out-of-range
        // values); the GPU kernel converts with `llvm.fptosi.sat`/`fptoui.sat`, the reference's
        // semantics (truncation, saturation, NaN to 0). bf16 is reached through f32, so only
        // from values f32 holds exactly (one rounding, as the reference's from f64).
        Op::Cast { to } => match x {
            Some(from) if gpu => *to != DType::BF16 || f32_exact(from),
            _ => !(float && matches!(to, DType::I32 | DType::I64)),
        },
        _ => false,
    }
}

/// Whether every value of `d` is an f32 exactly.
fn f32_exact(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16 | DType::Bool) || ints::narrow(d).is_some()
}

/// The C library function (double precision) that computes a unary operator on `d` where the
/// vector math has no polynomial for it (the trigonometric and hyperbolic functions) or its f32
/// polynomial is not enough (f64): the GPU kernel calls it (libdevice's on the device, the
/// host's in emulation) and rounds once, as the reference computes in f64. Not for bf16, which
/// would round twice through f32.
fn libm_function(u: &Unary, d: DType) -> Option<&'static str> {
    if !matches!(d, DType::F32 | DType::F16 | DType::F64) {
        return None;
    }
    Some(match u {
        Unary::Exp if d == DType::F64 => "exp",
        Unary::Log if d == DType::F64 => "log",
        Unary::Tanh if d == DType::F64 => "tanh",
        Unary::Erf if d == DType::F64 => "erf",
        Unary::Sin => "sin",
        Unary::Cos => "cos",
        Unary::Tan => "tan",
        Unary::Asin => "asin",
        Unary::Acos => "acos",
        Unary::Atan => "atan",
        Unary::Sinh => "sinh",
        Unary::Cosh => "cosh",
        Unary::Asinh => "asinh",
        Unary::Acosh => "acosh",
        Unary::Atanh => "atanh",
        _ => return None,
    })
}

/// Lowers a group (nodes in graph order; the last one's output is the kernel's output).
/// Returns the kernel and its external inputs, or None if the group cannot be generated.
pub fn lower_group(
    graph: &Graph,
    nodes: &[NodeId],
    target: &TargetDesc,
) -> Option<(Box<dyn GeneratedKernel>, Vec<ValueId>)> {
    if target.is_gpu() {
        return None;
    }
    let (g, ext) = analyze(graph, nodes)?;
    let what = format!(
        "elementwise[{}] {:?} lanes={}",
        g.ops.join(","),
        g.dims,
        target.f32_lanes()
    );
    Some((
        Box::new(EwKernel {
            g,
            lanes: target.f32_lanes(),
            what,
        }),
        ext,
    ))
}

/// Analyses a group (nodes in graph order; the last one's output is the group's output).
/// Returns the analysis and the external inputs, or None if the group cannot be generated.
pub(crate) fn analyze(graph: &Graph, nodes: &[NodeId]) -> Option<(EwGroup, Vec<ValueId>)> {
    let root = *nodes.last()?;
    let out_shape = graph.value_type(root.out(0)).fixed_shape()?;
    let step_of: HashMap<ValueId, usize> = nodes.iter().enumerate().map(|(i, n)| (n.out(0), i)).collect();
    let mut ext: Vec<ValueId> = vec![];
    let mut steps = vec![];
    for &n in nodes {
        let node = graph.node(n);
        let mut args = vec![];
        let mut arg_types = vec![];
        for v in &node.inputs {
            let Some(v) = *v else {
                args.push(None);
                arg_types.push(None);
                continue;
            };
            arg_types.push(Some(graph.value_type(v).dtype));
            let src = if let Some(&s) = step_of.get(&v) {
                Src::Step(s)
            } else if let Some(t) = graph.known_value(v).filter(|t| t.len() == 1) {
                Src::Const {
                    f: *t.to_f64_vec().first()?,
                    i: *t.to_i64_vec().first()?,
                }
            } else {
                let i = ext.iter().position(|e| *e == v).unwrap_or_else(|| {
                    ext.push(v);
                    ext.len() - 1
                });
                Src::Input(i)
            };
            args.push(Some(src));
        }
        steps.push(Step {
            op: node.op.clone(),
            args,
            arg_types,
            dtype: graph.value_type(n.out(0)).dtype,
        });
    }
    // Full strides of every input on the output's axes. A per-axis or blocked quantization
    // parameter is read along its axis: the group's output must have the node's shape, and no
    // other reader may broadcast it the numpy way.
    let rank = out_shape.len();
    let mut along_axis: HashMap<ValueId, ParamAxis> = HashMap::new();
    for &n in nodes {
        for v in graph.node(n).inputs.iter().flatten() {
            if let Some(a) = per_axis_param(graph, n, *v) {
                let x = graph.value_type(graph.node(n).inputs[0]?).fixed_shape()?;
                if x != out_shape || along_axis.insert(*v, a).is_some_and(|b| b != a) {
                    return None;
                }
            }
        }
    }
    // Blocked parameters split their axis in two, (blocks, block), so that each is read by
    // strides: the blocks axis steps through the parameter, the block axis repeats it. One
    // split per group.
    let mut splits = along_axis.values().filter_map(|p| match *p {
        ParamAxis::Blocked { axis, block } => Some((axis, block)),
        ParamAxis::PerAxis(_) => None,
    });
    let split = splits.next();
    if splits.any(|s| Some(s) != split) {
        return None;
    }
    // An output-rank stride vector on the split axes.
    let split_strides = |st: Vec<usize>| match split {
        None => st,
        Some((a, b)) => {
            let mut out = st[..a].to_vec();
            out.extend([st[a] * b, st[a]]);
            out.extend(&st[a + 1..]);
            out
        }
    };
    // The iteration space: the output's shape, (x[a] / b, b) in place of x[a] when split.
    let iter_shape = match split {
        None => out_shape.clone(),
        Some((a, b)) => {
            let mut shape = out_shape[..a].to_vec();
            shape.extend([out_shape[a] / b, b]);
            shape.extend(&out_shape[a + 1..]);
            shape
        }
    };
    let numpy_reader = |v: ValueId| {
        nodes.iter().any(|&n| {
            graph.node(n).inputs.iter().flatten().any(|u| *u == v) && per_axis_param(graph, n, v).is_none()
        })
    };
    if along_axis.keys().any(|&v| numpy_reader(v)) {
        return None;
    }
    let mut full: Vec<Vec<usize>> = vec![];
    for &v in &ext {
        match along_axis.get(&v) {
            Some(&ParamAxis::PerAxis(a)) => {
                let mut st = vec![0usize; rank];
                st[a] = 1;
                full.push(split_strides(st));
                continue;
            }
            Some(&ParamAxis::Blocked { axis, .. }) => {
                // Row-major over the parameter's own shape; its blocks axis takes the
                // parameter's stride, the block axis none.
                let ps = graph.value_type(v).fixed_shape()?;
                let row_major: Vec<usize> = (0..rank).map(|i| ps[i + 1..].iter().product()).collect();
                let mut st = split_strides(row_major);
                st[axis] = st[axis + 1];
                st[axis + 1] = 0;
                full.push(st);
                continue;
            }
            None => {}
        }
        let s = graph.value_type(v).fixed_shape()?;
        if s.len() > rank {
            return None;
        }
        let mut st = vec![0usize; rank];
        let mut acc = 1;
        for (k, &d) in s.iter().enumerate().rev() {
            let axis = rank - s.len() + k;
            if d == out_shape[axis] && d != 1 {
                st[axis] = acc;
            } else if d != 1 {
                return None;
            }
            acc *= d;
        }
        full.push(split_strides(st));
    }
    // Drop unit axes, then merge neighbours read alike by every input.
    let mut dims: Vec<usize> = vec![];
    let mut strides: Vec<Vec<usize>> = vec![vec![]; ext.len()];
    for (axis, &d) in iter_shape.iter().enumerate() {
        if d == 1 {
            continue;
        }
        let mergeable = !dims.is_empty()
            && full.iter().zip(&strides).all(|(f, s)| {
                let prev = *s.last().expect("one stride per kept axis");
                prev == f[axis] * d
            });
        if mergeable {
            *dims.last_mut().expect("not empty") *= d;
            for (f, s) in full.iter().zip(strides.iter_mut()) {
                *s.last_mut().expect("not empty") = f[axis];
            }
        } else {
            dims.push(d);
            for (f, s) in full.iter().zip(strides.iter_mut()) {
                s.push(f[axis]);
            }
        }
    }
    if dims.is_empty() {
        dims.push(1);
        for s in strides.iter_mut() {
            s.push(0);
        }
    }
    let total: usize = dims.iter().product();
    if total >= (1 << 40) {
        return None;
    }
    let in_types = ext.iter().map(|v| graph.value_type(*v).dtype).collect();
    let ops = nodes.iter().map(|n| graph.node(*n).op.name()).collect();
    Some((
        EwGroup {
            dims,
            strides,
            in_types,
            steps,
            ops,
        },
        ext,
    ))
}

impl EwGroup {
    /// The dtype of the group's output.
    pub(crate) fn out_dtype(&self) -> DType {
        self.steps.last().expect("a group has a node").dtype
    }

    /// Emits the steps for `n` elements. `input(i)` emits the `n`-lane value of external input
    /// `i` (asked once per input, where the first step reads it); returns the output's value.
    pub(crate) fn compute<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        n: u32,
        mut input: impl FnMut(usize) -> Result<VectorValue<'ctx>>,
    ) -> Result<VectorValue<'ctx>> {
        let mut loaded: HashMap<usize, VectorValue<'ctx>> = HashMap::new();
        let mut vals: Vec<VectorValue<'ctx>> = vec![];
        for step in &self.steps {
            let mut ops = vec![];
            for (a, ty) in step.args.iter().zip(&step.arg_types) {
                let (Some(a), Some(ty)) = (a, ty) else {
                    ops.push(None);
                    continue;
                };
                let v = match *a {
                    Src::Step(s) => vals[s],
                    Src::Const { f, .. } if ty.is_float() => float_const_vec(e, *ty, f, n),
                    Src::Const { i, .. } => int_const_vec(e, *ty, i, n),
                    Src::Input(i) => match loaded.get(&i) {
                        Some(v) => *v,
                        None => {
                            let v = input(i)?;
                            loaded.insert(i, v);
                            v
                        }
                    },
                };
                ops.push(Some(v));
            }
            let v = emit_op(e, step, &ops, n)?;
            // Every operator's result in its dtype, as the reference rounds or wraps it (a
            // Cast to bf16 rounds itself; QuantizeLinear saturates).
            vals.push(match step.dtype {
                DType::F16 => round_f16(e, v)?,
                DType::BF16 if !matches!(step.op, Op::Cast { .. }) => round_bf16(e, v, n)?,
                _ if matches!(step.op, Op::Quant(_)) => v,
                d => ints::normalize(e, v, d)?,
            });
        }
        Ok(*vals.last().expect("a group has a node"))
    }
}

/// Elements per task: enough work to amortize the task, few enough to balance two threads.
const TASK_ELEMS: usize = 8192;

impl KernelCommon for EwKernel {
    fn describe(&self) -> String {
        self.what.clone()
    }
}

impl GeneratedKernel for EwKernel {
    fn emit(&self, k: &KernelBuilder<'_, '_>) -> Result<()> {
        if self.g.dims.contains(&0) {
            return k.ret_ok(); // an empty output
        }
        let (rows_per_task, blocks, block) = self.split();
        let rows: usize = self.g.dims[..self.g.dims.len() - 1].iter().product();
        let tasks = rows.div_ceil(rows_per_task) * blocks;
        let task = k.new_task_function("task");
        let tb = k.cx.create_builder();
        let entry = k.cx.append_basic_block(task, "entry");
        tb.position_at_end(entry);
        let e = Emit::new(k.cx, k.module, &tb, task).with_target(k.target);
        self.emit_task(&e, rows, rows_per_task, blocks, block)?;
        tb.build_return(None).map_err(llvm)?;

        let me = Emit::new(k.cx, k.module, k.builder, k.function).with_target(k.target);
        let args = k
            .function
            .get_nth_param(1)
            .expect("kernel has args")
            .into_pointer_value();
        k.parallel_for(task, args, me.i64c(tasks as i64))?;
        k.ret_ok()
    }
}

impl EwKernel {
    /// (rows per task, blocks per row, block length) for the innermost axis.
    fn split(&self) -> (usize, usize, usize) {
        let inner = *self.g.dims.last().expect("at least one axis");
        if inner >= 2 * TASK_ELEMS {
            let block = TASK_ELEMS.div_ceil(self.lanes as usize) * self.lanes as usize;
            (1, inner.div_ceil(block), block)
        } else {
            ((TASK_ELEMS / inner).max(1), 1, inner)
        }
    }

    fn emit_task(
        &self,
        e: &Emit<'_, '_>,
        rows: usize,
        rows_per_task: usize,
        blocks: usize,
        block: usize,
    ) -> Result<()> {
        let f = e.f;
        let args = f.get_nth_param(0).expect("task data").into_pointer_value();
        let t = f.get_nth_param(1).expect("task index").into_int_value();
        let n_in = self.g.in_types.len();
        let bases: Vec<PointerValue> = (0..=n_in)
            .map(|i| e.load_ptr(e.gep_ptr(args, i as i64)?))
            .collect::<Result<_>>()?;
        let inner = *self.g.dims.last().expect("at least one axis") as i64;
        let (row0, j0, j1) = if blocks > 1 {
            let row = e.udivc(t, blocks as i64)?;
            let blk = e.uremc(t, blocks as i64)?;
            let j0 = e.mulc(blk, block as i64)?;
            (row, j0, e.umin(e.addc(j0, block as i64)?, e.i64c(inner))?)
        } else {
            (e.mulc(t, rows_per_task as i64)?, e.i64c(0), e.i64c(inner))
        };
        let row1 = if blocks > 1 {
            e.addc(row0, 1)?
        } else {
            e.umin(e.addc(row0, rows_per_task as i64)?, e.i64c(rows.max(1) as i64))?
        };
        let outer = &self.g.dims[..self.g.dims.len() - 1];
        e.for_range(row0, row1, 1, |row| {
            // Element offsets of this row in every input and in the output.
            let mut offs: Vec<IntValue> = vec![e.i64c(0); n_in];
            let mut rem = row;
            for (ax, &d) in outer.iter().enumerate().rev() {
                let coord = e.uremc(rem, d as i64)?;
                rem = e.udivc(rem, d as i64)?;
                for (i, o) in offs.iter_mut().enumerate() {
                    let s = self.g.strides[i][ax];
                    if s != 0 {
                        *o = e.add(*o, e.mulc(coord, s as i64)?)?;
                    }
                }
            }
            let out_off = e.mulc(row, inner)?;
            let l = self.lanes as i64;
            // Vector body, then a one-lane tail.
            let nvec = e.sub(j1, j0)?;
            let nvec = e.mulc(e.udivc(nvec, l)?, l)?;
            let jv = e.add(j0, nvec)?;
            e.for_range(j0, jv, l, |j| {
                self.emit_elements(e, &bases, &offs, out_off, j, self.lanes)
            })?;
            e.for_range(jv, j1, 1, |j| self.emit_elements(e, &bases, &offs, out_off, j, 1))
        })
    }

    /// Computes and stores `n` consecutive output elements starting at innermost index `j`.
    fn emit_elements<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        bases: &[PointerValue<'ctx>],
        offs: &[IntValue<'ctx>],
        out_off: IntValue<'ctx>,
        j: IntValue<'ctx>,
        n: u32,
    ) -> Result<()> {
        let g = &self.g;
        let last = g.dims.len() - 1;
        let out = g.compute(e, n, |i| {
            let contiguous = g.strides[i][last] != 0;
            let idx = if contiguous {
                e.add(offs[i], e.mulc(j, g.strides[i][last] as i64)?)?
            } else {
                offs[i]
            };
            let v = load(e, bases[i], g.in_types[i], idx, if contiguous { n } else { 1 })?;
            if contiguous {
                Ok(v)
            } else {
                splat(e, v, n)
            }
        })?;
        let out_idx = e.add(out_off, j)?;
        store(e, bases[g.in_types.len()], g.out_dtype(), out_idx, out)
    }
}

/// The in-register element type: i1 for bool, f32 for bf16 and f16, i32 for the 8- and 16-bit
/// integers (their exact values: `ints`), the full width for the others.
fn reg_type<'ctx>(e: &Emit<'_, 'ctx>, d: DType) -> BasicTypeEnum<'ctx> {
    match d {
        DType::F32 | DType::BF16 | DType::F16 => e.cx.f32_type().into(),
        DType::F64 => e.cx.f64_type().into(),
        DType::I32 | DType::U32 | DType::U8 | DType::I8 | DType::U16 | DType::I16 => e.cx.i32_type().into(),
        DType::I64 | DType::U64 => e.cx.i64_type().into(),
        DType::Bool => e.cx.bool_type().into(),
    }
}

/// The in-memory element type: one byte for bool, the upper half of an f32 for bf16.
fn mem_type<'ctx>(e: &Emit<'_, 'ctx>, d: DType) -> BasicTypeEnum<'ctx> {
    match d {
        DType::Bool | DType::U8 | DType::I8 => e.cx.i8_type().into(),
        DType::BF16 | DType::U16 | DType::I16 => e.cx.i16_type().into(),
        DType::F16 => e.cx.f16_type().into(),
        _ => reg_type(e, d),
    }
}

fn vec_of<'ctx>(t: BasicTypeEnum<'ctx>, n: u32) -> VectorType<'ctx> {
    match t {
        BasicTypeEnum::FloatType(f) => f.vec_type(n),
        BasicTypeEnum::IntType(i) => i.vec_type(n),
        other => panic!("no vector of {other:?}"),
    }
}

/// A constant of float dtype `d` in its register lanes: f64 for f64, else f32 (the value
/// rounded to it).
fn float_const_vec<'ctx>(e: &Emit<'_, 'ctx>, d: DType, c: f64, n: u32) -> VectorValue<'ctx> {
    let s = if d == DType::F64 {
        e.cx.f64_type().const_float(c)
    } else {
        e.cx.f32_type().const_float(f64::from(c as f32))
    };
    VectorType::const_vector(&vec![s; n as usize])
}

/// An integer (or bool) constant from its bits as i64 (`Src::Const`), in `d`'s register form.
fn int_const_vec<'ctx>(e: &Emit<'_, 'ctx>, d: DType, bits: i64, n: u32) -> VectorValue<'ctx> {
    let s = match reg_type(e, d) {
        BasicTypeEnum::IntType(t) if d == DType::Bool => t.const_int(u64::from(bits != 0), false),
        // The i64 of a narrow value is already its canonical (sign- or zero-extended) form.
        BasicTypeEnum::IntType(t) => t.const_int(bits as u64, true),
        other => panic!("no integer constant of {other:?}"),
    };
    VectorType::const_vector(&vec![s; n as usize])
}

/// The small integer `v` as a register value of dtype `d` (a float, an integer or a bool).
pub(crate) fn small_const<'ctx>(e: &Emit<'_, 'ctx>, d: DType, v: i64) -> Result<BasicValueEnum<'ctx>> {
    let lanes = match d.is_float() {
        true => float_const_vec(e, d, v as f64, 1),
        false => int_const_vec(e, d, v, 1),
    };
    e.b.build_extract_element(lanes, e.i32c(0), "").map_err(llvm)
}

/// A float constant of `like`'s element type (f32 or f64 lanes).
fn fconst_like<'ctx>(e: &Emit<'_, 'ctx>, like: VectorValue<'ctx>, x: f64) -> VectorValue<'ctx> {
    let lanes = like.get_type();
    let d = if lanes.get_element_type() == e.cx.f64_type().into() {
        DType::F64
    } else {
        DType::F32
    };
    float_const_vec(e, d, x, lanes.get_size())
}

fn elem_ptr<'ctx>(
    e: &Emit<'_, 'ctx>,
    base: PointerValue<'ctx>,
    d: DType,
    idx: IntValue<'ctx>,
) -> Result<PointerValue<'ctx>> {
    // SAFETY (of the IR): indices stay inside the tensors the plan gave the kernel.
    unsafe { e.b.build_in_bounds_gep(mem_type(e, d), base, &[idx], "") }.map_err(llvm)
}

fn elem_align(d: DType) -> u32 {
    d.size_bytes() as u32
}

/// Loads `n` elements as an `n`-lane register vector.
pub(crate) fn load<'ctx>(
    e: &Emit<'_, 'ctx>,
    base: PointerValue<'ctx>,
    d: DType,
    idx: IntValue<'ctx>,
    n: u32,
) -> Result<VectorValue<'ctx>> {
    let p = elem_ptr(e, base, d, idx)?;
    let v = e.b.build_load(vec_of(mem_type(e, d), n), p, "").map_err(llvm)?;
    v.as_instruction_value()
        .expect("load is an instruction")
        .set_alignment(elem_align(d))
        .map_err(llvm)?;
    let v = v.into_vector_value();
    if d == DType::Bool {
        let zero = vec_of(e.cx.i8_type().into(), n).const_zero();
        return e.b.build_int_compare(IntPredicate::NE, v, zero, "").map_err(llvm);
    }
    if let Some((_, signed)) = ints::narrow(d) {
        let wide = e.cx.i32_type().vec_type(n);
        return if signed {
            e.b.build_int_s_extend(v, wide, "").map_err(llvm)
        } else {
            e.b.build_int_z_extend(v, wide, "").map_err(llvm)
        };
    }
    if d == DType::F16 {
        return e.b.build_float_ext(v, e.vty(n), "").map_err(llvm);
    }
    if d == DType::BF16 {
        let w =
            e.b.build_int_z_extend(v, e.cx.i32_type().vec_type(n), "")
                .map_err(llvm)?;
        let w = e.b.build_left_shift(w, splat_u32(e, 16, n), "").map_err(llvm)?;
        return Ok(e
            .b
            .build_bit_cast(w, e.vty(n), "")
            .map_err(llvm)?
            .into_vector_value());
    }
    Ok(v)
}

/// Element `idx` as its register value (the one lane of [`load`]).
pub(crate) fn load_one<'ctx>(
    e: &Emit<'_, 'ctx>,
    base: PointerValue<'ctx>,
    d: DType,
    idx: IntValue<'ctx>,
) -> Result<BasicValueEnum<'ctx>> {
    let v = load(e, base, d, idx, 1)?;
    e.b.build_extract_element(v, e.i32c(0), "").map_err(llvm)
}

/// Stores the register value `v` as element `idx` ([`store`] of one lane).
pub(crate) fn store_one<'ctx>(
    e: &Emit<'_, 'ctx>,
    base: PointerValue<'ctx>,
    d: DType,
    idx: IntValue<'ctx>,
    v: BasicValueEnum<'ctx>,
) -> Result<()> {
    let lane = vec_of(v.get_type(), 1).get_undef();
    let lane = e.b.build_insert_element(lane, v, e.i32c(0), "").map_err(llvm)?;
    store(e, base, d, idx, lane)
}

/// Stores an `n`-lane register vector as `n` elements (a bf16 value is already rounded).
pub(crate) fn store<'ctx>(
    e: &Emit<'_, 'ctx>,
    base: PointerValue<'ctx>,
    d: DType,
    idx: IntValue<'ctx>,
    v: VectorValue<'ctx>,
) -> Result<()> {
    let n = v.get_type().get_size();
    let v = if d == DType::Bool {
        e.b.build_int_z_extend(v, e.cx.i8_type().vec_type(n), "")
            .map_err(llvm)?
    } else if ints::narrow(d).is_some() {
        // In range already: every step's result is canonical (`ints`), QuantizeLinear saturates.
        e.b.build_int_truncate(v, vec_of(mem_type(e, d), n), "")
            .map_err(llvm)?
    } else if d == DType::F16 {
        // Exact: the value was rounded to f16 when computed.
        e.b.build_float_trunc(v, e.cx.f16_type().vec_type(n), "")
            .map_err(llvm)?
    } else if d == DType::BF16 {
        let w =
            e.b.build_bit_cast(v, e.cx.i32_type().vec_type(n), "")
                .map_err(llvm)?;
        let w =
            e.b.build_right_shift(w.into_vector_value(), splat_u32(e, 16, n), false, "")
                .map_err(llvm)?;
        e.b.build_int_truncate(w, e.cx.i16_type().vec_type(n), "")
            .map_err(llvm)?
    } else {
        v
    };
    let p = elem_ptr(e, base, d, idx)?;
    let st = e.b.build_store(p, v).map_err(llvm)?;
    st.set_alignment(elem_align(d)).map_err(llvm)?;
    Ok(())
}

fn splat<'ctx>(e: &Emit<'_, 'ctx>, v: VectorValue<'ctx>, n: u32) -> Result<VectorValue<'ctx>> {
    if n == 1 {
        return Ok(v);
    }
    let mask = e.cx.i32_type().vec_type(n).const_zero();
    e.b.build_shuffle_vector(v, v.get_type().get_poison(), mask, "")
        .map_err(llvm)
}

fn splat_u32<'ctx>(e: &Emit<'_, 'ctx>, x: u32, n: u32) -> VectorValue<'ctx> {
    VectorType::const_vector(&vec![e.cx.i32_type().const_int(u64::from(x), false); n as usize])
}

fn fconst<'ctx>(e: &Emit<'_, 'ctx>, x: f32, n: u32) -> VectorValue<'ctx> {
    float_const_vec(e, DType::F32, f64::from(x), n)
}

fn select<'ctx>(
    e: &Emit<'_, 'ctx>,
    m: VectorValue<'ctx>,
    a: VectorValue<'ctx>,
    b: VectorValue<'ctx>,
) -> Result<VectorValue<'ctx>> {
    Ok(e.b.build_select(m, a, b, "").map_err(llvm)?.into_vector_value())
}

fn fintr<'ctx>(e: &Emit<'_, 'ctx>, name: &str, args: &[VectorValue<'ctx>]) -> Result<VectorValue<'ctx>> {
    let a: Vec<_> = args.iter().map(|v| (*v).into()).collect();
    Ok(e.intrinsic(name, &[args[0].get_type().into()], &a)?
        .into_vector_value())
}

/// `lo <= x <= hi` as the reference does it: ordered compares, so NaN stays NaN.
fn fclamp<'ctx>(
    e: &Emit<'_, 'ctx>,
    x: VectorValue<'ctx>,
    lo: Option<VectorValue<'ctx>>,
    hi: Option<VectorValue<'ctx>>,
) -> Result<VectorValue<'ctx>> {
    let mut x = x;
    if let Some(lo) = lo {
        x = select(e, e.fcmp(FloatPredicate::OLT, x, lo)?, lo, x)?;
    }
    if let Some(hi) = hi {
        x = select(e, e.fcmp(FloatPredicate::OGT, x, hi)?, hi, x)?;
    }
    Ok(x)
}

/// Float FMod (`fmod`) and Mod (the divisor's sign; a zero result takes the divisor's sign) in
/// f64, rounded once to the operands' type, as the reference computes them.
fn float_remainder<'ctx>(
    e: &Emit<'_, 'ctx>,
    op: Binary,
    x: VectorValue<'ctx>,
    y: VectorValue<'ctx>,
    n: u32,
) -> Result<VectorValue<'ctx>> {
    let b = e.b;
    let wide = e.cx.f64_type().vec_type(n);
    let narrow = x.get_type() != wide;
    let (xd, yd) = if narrow {
        (
            b.build_float_ext(x, wide, "").map_err(llvm)?,
            b.build_float_ext(y, wide, "").map_err(llvm)?,
        )
    } else {
        (x, y)
    };
    let mut r = b.build_float_rem(xd, yd, "").map_err(llvm)?;
    if op == Binary::Mod {
        let zero = wide.const_zero();
        let signed_zero = fintr(e, "llvm.copysign", &[zero, yd])?;
        let r_negative = e.fcmp(FloatPredicate::OLT, r, zero)?;
        let y_negative = e.fcmp(FloatPredicate::OLT, yd, zero)?;
        let signs_differ = b.build_xor(r_negative, y_negative, "").map_err(llvm)?;
        let moved = select(e, signs_differ, b.build_float_add(r, yd, "").map_err(llvm)?, r)?;
        r = select(e, e.fcmp(FloatPredicate::OEQ, r, zero)?, signed_zero, moved)?;
    }
    if !narrow {
        return Ok(r);
    }
    b.build_float_trunc(r, e.vty(n), "").map_err(llvm)
}

fn emit_op<'ctx>(
    e: &Emit<'_, 'ctx>,
    step: &Step,
    ops: &[Option<VectorValue<'ctx>>],
    n: u32,
) -> Result<VectorValue<'ctx>> {
    let b = e.b;
    let x = ops.first().copied().flatten().ok_or_else(|| {
        CodegenError::internal(format!(
            "elementwise {} without its first operand",
            step.op.name()
        ))
    })?;
    let xt = step.arg_types[0].unwrap_or(DType::F32);
    let float = xt.is_float();
    let operand = |i: usize| -> Result<VectorValue<'ctx>> {
        ops.get(i).copied().flatten().ok_or_else(|| {
            CodegenError::internal(format!("elementwise {} without operand {i}", step.op.name()))
        })
    };
    // Float constants in x's lanes (f32, or f64); only asked for float operands.
    let fc = |v: f32| fconst_like(e, x, f64::from(v));
    let izero = x.get_type().const_zero();
    match &step.op {
        Op::Unary(u) if libm_function(u, xt).is_some() => {
            let name = libm_function(u, xt).expect("checked");
            let r = call_libm(e, name, &[cast(e, x, xt, DType::F64, n)?])?;
            cast(e, r, DType::F64, xt, n)
        }
        Op::Unary(u) => match (u, float) {
            (Unary::Abs, true) => vmath::fabs(e, x),
            (Unary::Abs, false) if !xt.is_signed_int() => Ok(x),
            (Unary::Abs, false) => {
                let neg = b.build_int_neg(x, "").map_err(llvm)?;
                let lt = b
                    .build_int_compare(IntPredicate::SLT, x, izero, "")
                    .map_err(llvm)?;
                select(e, lt, neg, x)
            }
            (Unary::Neg, true) => b.build_float_neg(x, "").map_err(llvm),
            (Unary::Neg, false) => b.build_int_neg(x, "").map_err(llvm),
            (Unary::Relu, true) => select(e, e.fcmp(FloatPredicate::OLT, x, fc(0.0))?, fc(0.0), x),
            (Unary::Relu, false) => {
                let lt = b
                    .build_int_compare(IntPredicate::SLT, x, izero, "")
                    .map_err(llvm)?;
                select(e, lt, izero, x)
            }
            (Unary::Not | Unary::BitwiseNot, _) => b.build_not(x, "").map_err(llvm),
            // Unordered with itself: only NaN.
            (Unary::IsNaN, _) => e.fcmp(FloatPredicate::UNO, x, x),
            (
                Unary::IsInf {
                    detect_positive,
                    detect_negative,
                },
                _,
            ) => {
                let inf = fc(f32::INFINITY);
                let pos = e.fcmp(FloatPredicate::OEQ, x, inf)?;
                let neg = e.fcmp(FloatPredicate::OEQ, x, b.build_float_neg(inf, "").map_err(llvm)?)?;
                match (detect_positive, detect_negative) {
                    (true, true) => b.build_or(pos, neg, "").map_err(llvm),
                    (true, false) => Ok(pos),
                    (false, true) => Ok(neg),
                    (false, false) => Ok(pos.get_type().const_zero()),
                }
            }
            (Unary::Sigmoid, _) => vmath::sigmoid(e, x),
            (Unary::Exp, _) => vmath::exp(e, x),
            (Unary::Tanh, _) => vmath::tanh(e, x),
            (Unary::Sqrt, _) => fintr(e, "llvm.sqrt", &[x]),
            (Unary::Reciprocal, _) => b.build_float_div(fc(1.0), x, "").map_err(llvm),
            (Unary::Floor, _) => fintr(e, "llvm.floor", &[x]),
            (Unary::Ceil, _) => fintr(e, "llvm.ceil", &[x]),
            (Unary::Round, _) => fintr(e, "llvm.roundeven", &[x]),
            (Unary::HardSwish, _) => {
                let t = e.fma(x, fc(1.0 / 6.0), fc(0.5))?;
                let t = fclamp(e, t, Some(fc(0.0)), Some(fc(1.0)))?;
                e.fmul(x, t)
            }
            (Unary::LeakyRelu { alpha }, _) => {
                let ax = e.fmul(x, fc(*alpha))?;
                select(e, e.fcmp(FloatPredicate::OLT, x, fc(0.0))?, ax, x)
            }
            (Unary::HardSigmoid { alpha, beta }, _) => {
                let t = e.fma(x, fc(*alpha), fc(*beta))?;
                fclamp(e, t, Some(fc(0.0)), Some(fc(1.0)))
            }
            (Unary::Swish { alpha }, _) => {
                let s = vmath::sigmoid(e, e.fmul(x, fc(*alpha))?)?;
                e.fmul(x, s)
            }
            (Unary::Log, _) => vmath::log(e, x),
            (Unary::Erf, _) => vmath::erf(e, x),
            (Unary::Gelu { tanh: false }, _) => vmath::gelu_erf(e, x),
            (Unary::Gelu { tanh: true }, _) => {
                let x3 = e.fmul(e.fmul(x, x)?, x)?;
                let inner = e.fma(x3, fc(0.044715), x)?;
                let t = vmath::tanh(e, e.fmul(inner, fc(0.797_884_6))?)?;
                let h = e.fmul(x, fc(0.5))?;
                e.fma(h, t, h)
            }
            (Unary::Elu { alpha }, _) => {
                let em1 = fsub(e, vmath::exp(e, x)?, fc(1.0))?;
                let neg = e.fmul(em1, fc(*alpha))?;
                select(e, e.fcmp(FloatPredicate::OLT, x, fc(0.0))?, neg, x)
            }
            (Unary::Selu { alpha, gamma }, _) => {
                let em1 = fsub(e, vmath::exp(e, x)?, fc(1.0))?;
                let neg = e.fmul(em1, fc(*alpha))?;
                let y = select(e, e.fcmp(FloatPredicate::OGT, x, fc(0.0))?, x, neg)?;
                e.fmul(y, fc(*gamma))
            }
            (Unary::Celu { alpha }, _) => {
                let ex = vmath::exp(e, e.fmul(x, fc(1.0 / *alpha))?)?;
                let neg = e.fmul(fsub(e, ex, fc(1.0))?, fc(*alpha))?;
                select(e, e.fcmp(FloatPredicate::OGT, x, fc(0.0))?, x, neg)
            }
            (Unary::Softsign, _) => {
                let d = e.fadd(vmath::fabs(e, x)?, fc(1.0))?;
                b.build_float_div(x, d, "").map_err(llvm)
            }
            (Unary::Softplus, _) => softplus(e, x, n),
            (Unary::Mish, _) => e.fmul(x, vmath::tanh(e, softplus(e, x, n)?)?),
            (Unary::Sign, _) => {
                let pos = select(e, e.fcmp(FloatPredicate::OGT, x, fc(0.0))?, fc(1.0), x)?;
                select(e, e.fcmp(FloatPredicate::OLT, x, fc(0.0))?, fc(-1.0), pos)
            }
            (Unary::ThresholdedRelu { alpha }, _) => {
                select(e, e.fcmp(FloatPredicate::OGT, x, fc(*alpha))?, x, fc(0.0))
            }
            (Unary::Shrink { bias, lambd }, _) => {
                let above = e.fcmp(FloatPredicate::OGT, x, fc(*lambd))?;
                let below = e.fcmp(FloatPredicate::OLT, x, fc(-*lambd))?;
                let y = select(e, above, fsub(e, x, fc(*bias))?, fc(0.0))?;
                select(e, below, e.fadd(x, fc(*bias))?, y)
            }

            _ => Err(CodegenError::internal(format!(
                "elementwise generator: no {}",
                u.name()
            ))),
        },
        Op::Binary(bop) => {
            let y = operand(1)?;
            let boolean = xt == DType::Bool;
            let ip = |p| {
                b.build_int_compare(ints::predicate(p, xt), x, y, "")
                    .map_err(llvm)
            };
            match (bop, float) {
                (Binary::Add, true) => e.fadd(x, y),
                (Binary::Sub, true) => b.build_float_sub(x, y, "").map_err(llvm),
                (Binary::Mul, true) => e.fmul(x, y),
                (Binary::Div, true) => b.build_float_div(x, y, "").map_err(llvm),
                (Binary::Min, true) => fintr(e, "llvm.minimum", &[x, y]),
                (Binary::Max, true) => fintr(e, "llvm.maximum", &[x, y]),
                (Binary::Equal, true) => e.fcmp(FloatPredicate::OEQ, x, y),
                (Binary::Less, true) => e.fcmp(FloatPredicate::OLT, x, y),
                (Binary::LessOrEqual, true) => e.fcmp(FloatPredicate::OLE, x, y),
                (Binary::Greater, true) => e.fcmp(FloatPredicate::OGT, x, y),
                (Binary::GreaterOrEqual, true) => e.fcmp(FloatPredicate::OGE, x, y),
                (Binary::Pow, true) => {
                    let yt = step.arg_types[1].unwrap_or(xt);
                    let y = cast(e, y, yt, DType::F32, n)?;
                    pow(e, x, y, n)
                }
                (Binary::Pow, false) => {
                    let yt = step.arg_types[1].unwrap_or(xt);
                    if !yt.is_float() {
                        return ints::pow(e, x, xt, y, yt);
                    }
                    // An integer to a float power: the f64 power, converted back with
                    // saturation (the reference's).
                    let args = [cast(e, x, xt, DType::F64, n)?, cast(e, y, yt, DType::F64, n)?];
                    cast(e, call_libm(e, "pow", &args)?, DType::F64, xt, n)
                }
                (Binary::PRelu, true) => {
                    let neg = e.fmul(x, y)?;
                    select(e, e.fcmp(FloatPredicate::OLT, x, fc(0.0))?, neg, x)
                }
                (Binary::Mod | Binary::FMod, true) => float_remainder(e, *bop, x, y, n),
                (Binary::Div | Binary::Mod | Binary::FMod, false) if !boolean => {
                    ints::division(e, *bop, x, y, xt)
                }
                (Binary::Add, false) => b.build_int_add(x, y, "").map_err(llvm),
                (Binary::Sub, false) => b.build_int_sub(x, y, "").map_err(llvm),
                (Binary::Mul, false) => b.build_int_mul(x, y, "").map_err(llvm),
                (Binary::Min, false) => select(e, ip(IntPredicate::SLT)?, x, y),
                (Binary::Max, false) => select(e, ip(IntPredicate::SGT)?, x, y),
                (Binary::Equal, false) => ip(IntPredicate::EQ),
                (Binary::Less, false) if !boolean => ip(IntPredicate::SLT),
                (Binary::LessOrEqual, false) if !boolean => ip(IntPredicate::SLE),
                (Binary::Greater, false) if !boolean => ip(IntPredicate::SGT),
                (Binary::GreaterOrEqual, false) if !boolean => ip(IntPredicate::SGE),
                (Binary::And | Binary::BitwiseAnd, false) => b.build_and(x, y, "").map_err(llvm),
                (Binary::Or | Binary::BitwiseOr, false) => b.build_or(x, y, "").map_err(llvm),
                (Binary::Xor | Binary::BitwiseXor, false) => b.build_xor(x, y, "").map_err(llvm),
                (Binary::BitShiftLeft, false) => ints::shift(e, true, x, y, xt),
                (Binary::BitShiftRight, false) => ints::shift(e, false, x, y, xt),
                _ => Err(CodegenError::internal(format!(
                    "elementwise generator: no {} on {}",
                    bop.name(),
                    xt.name()
                ))),
            }
        }
        Op::Where => select(e, x, operand(1)?, operand(2)?),
        Op::Clip => {
            let lo = ops.get(1).copied().flatten();
            let hi = ops.get(2).copied().flatten();
            if float {
                fclamp(e, x, lo, hi)
            } else {
                let mut x = x;
                if let Some(lo) = lo {
                    let m = b
                        .build_int_compare(ints::predicate(IntPredicate::SLT, xt), x, lo, "")
                        .map_err(llvm)?;
                    x = select(e, m, lo, x)?;
                }
                if let Some(hi) = hi {
                    let m = b
                        .build_int_compare(ints::predicate(IntPredicate::SGT, xt), x, hi, "")
                        .map_err(llvm)?;
                    x = select(e, m, hi, x)?;
                }
                Ok(x)
            }
        }
        Op::Cast { to } => cast(e, x, xt, *to, n),
        Op::Quant(QuantOp::QuantizeLinear { .. }) => {
            quant::quantize(e, x, operand(1)?, ops.get(2).copied().flatten(), step.dtype, n)
        }
        Op::Quant(QuantOp::DequantizeLinear { .. }) => {
            quant::dequantize(e, x, operand(1)?, ops.get(2).copied().flatten(), n)
        }
        other => Err(CodegenError::internal(format!(
            "elementwise generator: {} is not elementwise",
            other.name()
        ))),
    }
}

fn fsub<'ctx>(e: &Emit<'_, 'ctx>, a: VectorValue<'ctx>, b: VectorValue<'ctx>) -> Result<VectorValue<'ctx>> {
    e.b.build_float_sub(a, b, "").map_err(llvm)
}

/// ln(1 + e^x) as max(x, 0) + ln(1 + e^-|x|): no overflow for large x.
fn softplus<'ctx>(e: &Emit<'_, 'ctx>, x: VectorValue<'ctx>, n: u32) -> Result<VectorValue<'ctx>> {
    let ax = vmath::fabs(e, x)?;
    let t = vmath::exp(e, e.b.build_float_neg(ax, "").map_err(llvm)?)?;
    let l = vmath::log(e, e.fadd(t, fconst(e, 1.0, n))?)?;
    let pos = select(
        e,
        e.fcmp(FloatPredicate::OGT, x, fconst(e, 0.0, n))?,
        x,
        fconst(e, 0.0, n),
    )?;
    let y = e.fadd(pos, l)?;
    // NaN in, NaN out (the select above drops it).
    select(e, e.fcmp(FloatPredicate::UNO, x, x)?, x, y)
}

/// x^y as e^(y·ln|x|), with the sign of an odd integer power of a negative base, NaN for a
/// negative base and a non-integer power, and x^0 = 1.
fn pow<'ctx>(
    e: &Emit<'_, 'ctx>,
    x: VectorValue<'ctx>,
    y: VectorValue<'ctx>,
    n: u32,
) -> Result<VectorValue<'ctx>> {
    let one = fconst(e, 1.0, n);
    let zero = fconst(e, 0.0, n);
    let mag = vmath::exp(e, e.fmul(y, vmath::log(e, vmath::fabs(e, x)?)?)?)?;
    let yi = fintr(e, "llvm.floor", &[y])?;
    let integer = e.fcmp(FloatPredicate::OEQ, yi, y)?;
    let half = e.fmul(y, fconst(e, 0.5, n))?;
    let odd = e.fcmp(FloatPredicate::ONE, fintr(e, "llvm.floor", &[half])?, half)?;
    let odd = e.b.build_and(odd, integer, "").map_err(llvm)?;
    let neg_mag = e.b.build_float_neg(mag, "").map_err(llvm)?;
    let signed = select(e, odd, neg_mag, mag)?;
    let nan = fconst(e, f32::NAN, n);
    let negative = select(e, integer, signed, nan)?;
    let r = select(e, e.fcmp(FloatPredicate::OLT, x, zero)?, negative, mag)?;
    select(e, e.fcmp(FloatPredicate::OEQ, y, zero)?, one, r)
}

/// f32 to bf16 rounding to nearest even (the result is an f32 with the low 16 bits zero); a
/// NaN stays a (quiet) NaN.
pub(crate) fn round_bf16<'ctx>(
    e: &Emit<'_, 'ctx>,
    x: VectorValue<'ctx>,
    n: u32,
) -> Result<VectorValue<'ctx>> {
    let b = e.b;
    let it = e.cx.i32_type().vec_type(n);
    let u = b.build_bit_cast(x, it, "").map_err(llvm)?.into_vector_value();
    let lsb = b
        .build_right_shift(u, splat_u32(e, 16, n), false, "")
        .map_err(llvm)?;
    let lsb = b.build_and(lsb, splat_u32(e, 1, n), "").map_err(llvm)?;
    let r = b.build_int_add(u, splat_u32(e, 0x7fff, n), "").map_err(llvm)?;
    let r = b.build_int_add(r, lsb, "").map_err(llvm)?;
    let quiet = b.build_or(u, splat_u32(e, 0x0040_0000, n), "").map_err(llvm)?;
    let nan = e.fcmp(FloatPredicate::UNO, x, x)?;
    let r = select(e, nan, quiet, r)?;
    let r = b.build_and(r, splat_u32(e, 0xffff_0000, n), "").map_err(llvm)?;
    Ok(b.build_bit_cast(r, e.vty(n), "")
        .map_err(llvm)?
        .into_vector_value())
}

/// [`round_bf16`] of one f32 value.
pub(crate) fn round_bf16_one<'ctx>(e: &Emit<'_, 'ctx>, x: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
    let r = round_bf16(e, e.splat(x, 1)?, 1)?;
    Ok(e.b
        .build_extract_element(r, e.i32c(0), "")
        .map_err(llvm)?
        .into_float_value())
}

/// `x` rounded to the nearest f16 (even on ties), kept in f32: what an f16 result holds.
fn round_f16<'ctx>(e: &Emit<'_, 'ctx>, x: VectorValue<'ctx>) -> Result<VectorValue<'ctx>> {
    let n = x.get_type().get_size();
    let h =
        e.b.build_float_trunc(x, e.cx.f16_type().vec_type(n), "")
            .map_err(llvm)?;
    e.b.build_float_ext(h, e.vty(n), "").map_err(llvm)
}

/// ONNX Cast as the reference does it (`kiln_ir::Element::cast_from`): floats round once to
/// the target (bf16 only from values f32 holds exactly, `supports_on`), floats to integers
/// truncate and saturate with NaN to 0, integers to integers keep the low bits of the value
/// extended by the source's sign.
fn cast<'ctx>(
    e: &Emit<'_, 'ctx>,
    x: VectorValue<'ctx>,
    from: DType,
    to: DType,
    n: u32,
) -> Result<VectorValue<'ctx>> {
    let b = e.b;
    if from == to {
        return Ok(x);
    }
    // f16 and bf16 are their exact f32 in registers: convert as from f32.
    if matches!(from, DType::F16 | DType::BF16) {
        return cast(e, x, DType::F32, to, n);
    }
    if to == DType::F16 {
        if from == DType::F64 {
            // One rounding, not two through f32.
            let h = b
                .build_float_trunc(x, e.cx.f16_type().vec_type(n), "")
                .map_err(llvm)?;
            return b.build_float_ext(h, e.vty(n), "").map_err(llvm);
        }
        return round_f16(e, cast(e, x, from, DType::F32, n)?);
    }
    if to == DType::BF16 {
        return round_bf16(e, cast(e, x, from, DType::F32, n)?, n);
    }
    let dst = vec_of(reg_type(e, to), n);
    let float_from = matches!(from, DType::F32 | DType::F64);
    match (from, to) {
        (DType::F32, DType::F64) => b.build_float_ext(x, dst, "").map_err(llvm),
        (DType::F64, DType::F32) => b.build_float_trunc(x, e.vty(n), "").map_err(llvm),
        (_, DType::Bool) if float_from => e.fcmp(FloatPredicate::UNE, x, fconst_like(e, x, 0.0)),
        (_, _) if float_from => {
            let (bits, signed) = (to.size_bytes() as u32 * 8, to.is_signed_int());
            let exact = ints::int_type(e, bits).vec_type(n);
            let name = if signed {
                "llvm.fptosi.sat"
            } else {
                "llvm.fptoui.sat"
            };
            let v = e
                .intrinsic(name, &[exact.into(), x.get_type().into()], &[x.into()])?
                .into_vector_value();
            resize_int(e, v, signed, dst)
        }
        (_, DType::Bool) => b
            .build_int_compare(IntPredicate::NE, x, x.get_type().const_zero(), "")
            .map_err(llvm),
        (DType::Bool, DType::F32 | DType::F64) => b.build_unsigned_int_to_float(x, dst, "").map_err(llvm),
        (DType::Bool, _) => b.build_int_z_extend(x, dst, "").map_err(llvm),
        (_, DType::F32 | DType::F64) if ints::is_unsigned_full(from) => {
            b.build_unsigned_int_to_float(x, dst, "").map_err(llvm)
        }
        (_, DType::F32 | DType::F64) => b.build_signed_int_to_float(x, dst, "").map_err(llvm),
        // Integer to integer: the value (canonical in its register) extended by the source's
        // sign or truncated; `compute` then wraps it to the target's width.
        _ => resize_int(e, x, from.is_signed_int(), dst),
    }
}

/// `x` in `to`'s lanes: sign- or zero-extended, or truncated.
fn resize_int<'ctx>(
    e: &Emit<'_, 'ctx>,
    x: VectorValue<'ctx>,
    signed: bool,
    to: VectorType<'ctx>,
) -> Result<VectorValue<'ctx>> {
    let from_bits = x.get_type().get_element_type().into_int_type().get_bit_width();
    let to_bits = to.get_element_type().into_int_type().get_bit_width();
    let b = e.b;
    match from_bits.cmp(&to_bits) {
        std::cmp::Ordering::Less if signed => b.build_int_s_extend(x, to, "").map_err(llvm),
        std::cmp::Ordering::Less => b.build_int_z_extend(x, to, "").map_err(llvm),
        std::cmp::Ordering::Greater => b.build_int_truncate(x, to, "").map_err(llvm),
        std::cmp::Ordering::Equal => Ok(x),
    }
}

/// Calls the C library's double-precision `name` lane by lane on f64 vectors.
fn call_libm<'ctx>(e: &Emit<'_, 'ctx>, name: &str, args: &[VectorValue<'ctx>]) -> Result<VectorValue<'ctx>> {
    let ty = args[0].get_type();
    let mut out = ty.get_undef();
    for lane in 0..ty.get_size() {
        let i = e.cx.i32_type().const_int(u64::from(lane), false);
        let lanes = args
            .iter()
            .map(|a| {
                Ok(e.b
                    .build_extract_element(*a, i, "")
                    .map_err(llvm)?
                    .into_float_value())
            })
            .collect::<Result<Vec<_>>>()?;
        let r = e.call_libm(name, &lanes)?;
        out = e.b.build_insert_element(out, r, i, "").map_err(llvm)?;
    }
    Ok(out)
}

mod ints;
mod quant;

pub(crate) use quant::quantize;

#[cfg(test)]
mod tests;
