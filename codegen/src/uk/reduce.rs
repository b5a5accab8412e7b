//! Micro-kernel lowering for the reduce family (see `codegen/ukernels/reduce.c`): reductions,
//! ArgMax/ArgMin, TopK, CumSum/CumProd, the softmax family, the normalizations, LRN and the
//! losses. Each function below packs `iattr`/`fattr` in the order its C kernel's comment gives.

use super::codes::{LossCode, ReduceCode, SoftmaxCode};
use super::UkCall;
use crate::error::Result;
use crate::node::NodeInfo;
use kiln_ir::{LossReduction, MiscOp, Op, ReduceKind, VisionOp};

/// Most dimension groups (runs of reduced or kept axes) the C reductions walk.
const MAX_GROUPS: usize = 16;

pub fn lower(node: &NodeInfo) -> Result<Option<UkCall>> {
    let call = match node.op() {
        Op::Reduce {
            kind,
            noop_with_empty_axes,
            ..
        } => reduce(node, *kind, *noop_with_empty_axes)?,
        Op::ArgMax {
            axis,
            select_last_index,
            ..
        } => arg(node, *axis, true, *select_last_index)?,
        Op::ArgMin {
            axis,
            select_last_index,
            ..
        } => arg(node, *axis, false, *select_last_index)?,
        Op::TopK { axis, largest, .. } => topk(node, *axis, *largest)?,
        Op::CumSum { exclusive, reverse } => cumulative(node, false, *exclusive, *reverse)?,
        Op::CumProd { exclusive, reverse } => cumulative(node, true, *exclusive, *reverse)?,
        Op::Softmax { axis, coerce_2d } => softmax(node, *axis, *coerce_2d, SoftmaxCode::SM_SOFTMAX)?,
        Op::LogSoftmax { axis, coerce_2d } => softmax(node, *axis, *coerce_2d, SoftmaxCode::SM_LOG)?,
        Op::Hardmax { axis, coerce_2d } => softmax(node, *axis, *coerce_2d, SoftmaxCode::SM_HARD)?,
        Op::BatchNorm { epsilon } => batch_norm(node, *epsilon)?,
        Op::LayerNorm { axis, epsilon, .. } => layer_norm(node, *axis, *epsilon, false)?,
        Op::Misc(MiscOp::RmsNorm { axis, epsilon, .. }) => layer_norm(node, *axis, *epsilon, true)?,
        Op::InstanceNorm { epsilon } => {
            let c = channels(node)?.1;
            group_norm(node, c, *epsilon, true)?
        }
        Op::GroupNorm {
            num_groups,
            epsilon,
            per_channel_affine,
            ..
        } => group_norm(node, *num_groups, *epsilon, *per_channel_affine)?,
        Op::LpNorm { axis, p } => lp_norm(node, *axis, *p)?,
        Op::MeanVarianceNorm { axes } => mvn(node, axes)?,
        Op::Vision(VisionOp::Lrn {
            size,
            alpha,
            beta,
            bias,
        }) => lrn(node, *size, *alpha, *beta, *bias)?,
        Op::Misc(MiscOp::Loss {
            log_softmax,
            reduction,
            ignore_index,
        }) => loss(node, *log_softmax, *reduction, *ignore_index)?,
        _ => return Ok(None),
    };
    Ok(Some(call))
}

fn i(v: usize) -> i64 {
    v as i64
}

fn product(d: &[usize]) -> usize {
    d.iter().product()
}

/// `axis` in `0..rank` (negative counts from the end).
fn norm_axis(node: &NodeInfo, axis: i64, rank: usize) -> Result<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    if a < 0 || a >= rank as i64 {
        return Err(node.unsupported(format!("axis {axis} is out of range for rank {rank}")));
    }
    Ok(a as usize)
}

/// `[outer, n, inner]` of `shape` around `axis`.
fn split_at(shape: &[usize], axis: usize) -> [i64; 3] {
    [
        i(product(&shape[..axis])),
        i(shape[axis]),
        i(product(&shape[axis + 1..])),
    ]
}

/// The input's dims as (extent, reduced) groups: extent-1 dims dropped (they change neither
/// the layout nor the count), neighbours of the same kind merged.
fn groups(shape: &[usize], reduced: &[bool]) -> Vec<(usize, bool)> {
    let mut g: Vec<(usize, bool)> = vec![];
    for (&d, &r) in shape.iter().zip(reduced) {
        if d == 1 {
            continue;
        }
        match g.last_mut() {
            Some((e, lr)) if *lr == r => *e *= d,
            _ => g.push((d, r)),
        }
    }
    g
}

/// Packs groups as `[ng, extent_0, reduced_0, ...]`.
fn pack_groups(node: &NodeInfo, g: &[(usize, bool)]) -> Result<Vec<i64>> {
    if g.len() > MAX_GROUPS {
        return Err(node.unsupported(format!(
            "the reduced axes split the input into {} runs (at most {MAX_GROUPS})",
            g.len()
        )));
    }
    let mut v = vec![i(g.len())];
    for &(d, r) in g {
        v.extend([i(d), i64::from(r)]);
    }
    Ok(v)
}

/// Which of `rank` axes `axes` names; duplicates and out-of-range axes are errors.
fn axes_mask(node: &NodeInfo, axes: &[i64], rank: usize) -> Result<Vec<bool>> {
    let mut mask = vec![false; rank];
    for &a in axes {
        let a = norm_axis(node, a, rank)?;
        if mask[a] {
            return Err(node.unsupported(format!("axis {a} appears more than once in axes {axes:?}")));
        }
        mask[a] = true;
    }
    Ok(mask)
}

/// The value of a scalar or 1-element integer input that must be known at compile time.
fn known_scalar(node: &NodeInfo, idx: usize, what: &str) -> Result<i64> {
    let t = node
        .known(idx)
        .ok_or_else(|| node.unsupported(format!("{what} must be known at compile time")))?;
    match t.to_i64_vec()[..] {
        [v] => Ok(v),
        _ => Err(node.unsupported(format!("{what} must have one element"))),
    }
}

fn reduce(node: &NodeInfo, kind: ReduceKind, noop_with_empty_axes: bool) -> Result<UkCall> {
    let shape = node.input_shape(0)?;
    // An axes input of static length 0 is empty whether or not its value is known.
    let axes_len = node
        .input_type(1)
        .and_then(|t| t.fixed_shape())
        .map(|s| product(&s));
    let axes = match node.known(1) {
        Some(t) => t.to_i64_vec(),
        None if !node.has_input(1) || axes_len == Some(0) => vec![],
        None => return Err(node.unsupported("axes must be known at compile time")),
    };
    let mask = if axes.is_empty() {
        vec![!noop_with_empty_axes; shape.len()]
    } else {
        axes_mask(node, &axes, shape.len())?
    };
    let code = match kind {
        ReduceKind::Sum => ReduceCode::K_SUM,
        ReduceKind::Mean => ReduceCode::K_MEAN,
        ReduceKind::Max => ReduceCode::K_MAX,
        ReduceKind::Min => ReduceCode::K_MIN,
        ReduceKind::Prod => ReduceCode::K_PROD,
        ReduceKind::L1 => ReduceCode::K_L1,
        ReduceKind::L2 => ReduceCode::K_L2,
        ReduceKind::LogSum => ReduceCode::K_LOGSUM,
        ReduceKind::LogSumExp => ReduceCode::K_LSE,
        ReduceKind::SumSquare => ReduceCode::K_SUMSQ,
    };
    let mut iattr = vec![code.code()];
    iattr.extend(pack_groups(node, &groups(&shape, &mask))?);
    Ok(UkCall::new("reduce").iattr(iattr))
}

fn arg(node: &NodeInfo, axis: i64, max: bool, last: bool) -> Result<UkCall> {
    let shape = node.input_shape(0)?;
    let a = norm_axis(node, axis, shape.len())?;
    let [outer, n, inner] = split_at(&shape, a);
    if n == 0 && outer * inner > 0 {
        return Err(node.unsupported("cannot take the index of an extreme along an empty axis"));
    }
    Ok(UkCall::new("arg").iattr([outer, n, inner, i64::from(max), i64::from(last)]))
}

fn topk(node: &NodeInfo, axis: i64, largest: bool) -> Result<UkCall> {
    let shape = node.input_shape(0)?;
    let a = norm_axis(node, axis, shape.len())?;
    // The output's static extent along the axis is K, known or not as an input value.
    let k = node.output_shape(0)?[a];
    let [outer, n, inner] = split_at(&shape, a);
    Ok(UkCall::new("topk")
        .iattr([outer, n, inner, i(k), i64::from(largest)])
        .scratch(24 * n as u64))
}

fn cumulative(node: &NodeInfo, prod: bool, exclusive: bool, reverse: bool) -> Result<UkCall> {
    let shape = node.input_shape(0)?;
    // A run-time axis (-1) is read and checked by the kernel.
    let axis = match node.known(1) {
        Some(_) => i(norm_axis(
            node,
            known_scalar(node, 1, "the axis input")?,
            shape.len(),
        )?),
        None => -1,
    };
    let mut iattr = vec![
        i64::from(prod),
        i64::from(exclusive),
        i64::from(reverse),
        axis,
        i(shape.len()),
    ];
    iattr.extend(shape.iter().map(|&d| i(d)));
    Ok(UkCall::new("cumulative").iattr(iattr))
}

fn softmax(node: &NodeInfo, axis: i64, coerce_2d: bool, kind: SoftmaxCode) -> Result<UkCall> {
    let shape = node.input_shape(0)?;
    let a = norm_axis(node, axis, shape.len())?;
    // Before opset 13 the input is flattened to 2-D at `axis` and each row is normalized.
    let [outer, n, inner] = if coerce_2d {
        [i(product(&shape[..a])), i(product(&shape[a..])), 1]
    } else {
        split_at(&shape, a)
    };
    Ok(UkCall::new("softmax").iattr([outer, n, inner, kind.code()]))
}

/// How a LayerNormalization/RMSNormalization parameter broadcasts over X's rows: 0 when it
/// holds one value per position in the normalized row, 1 when it is a single value.
fn row_param_mode(node: &NodeInfo, p: &[usize], x: &[usize], axis: usize, what: &str) -> Result<i64> {
    if product(p) == 1 {
        return Ok(1);
    }
    let lead = x.len().saturating_sub(p.len());
    let per_row = p.len() <= x.len()
        && x.iter().enumerate().all(|(k, &xd)| {
            let pd = if k < lead { 1 } else { p[k - lead] };
            if k < axis {
                pd == 1
            } else {
                pd == xd
            }
        });
    if per_row {
        Ok(0)
    } else {
        Err(node.unsupported(format!(
            "{what} of shape {p:?} varies across the normalized rows of X {x:?}; only per-row-position or single-value parameters are compiled"
        )))
    }
}

fn layer_norm(node: &NodeInfo, axis: i64, epsilon: f32, rms: bool) -> Result<UkCall> {
    let x = node.input_shape(0)?;
    let a = norm_axis(node, axis, x.len())?;
    let scale = row_param_mode(node, &node.input_shape(1)?, &x, a, "Scale")?;
    let bias = if !rms && node.has_input(2) {
        row_param_mode(node, &node.input_shape(2)?, &x, a, "B")?
    } else {
        2
    };
    Ok(UkCall::new("layernorm")
        .iattr([
            i(product(&x[..a])),
            i(product(&x[a..])),
            scale,
            bias,
            i64::from(rms),
        ])
        .fattr([f64::from(epsilon)]))
}

/// `(N, C, plane)` of an `[N, C, spatial...]` input.
fn channels(node: &NodeInfo) -> Result<(usize, usize, usize)> {
    let x = node.input_shape(0)?;
    if x.len() < 2 {
        return Err(node.unsupported(format!("input must have shape [N, C, ...], got {x:?}")));
    }
    Ok((x[0], x[1], product(&x[2..])))
}

fn batch_norm(node: &NodeInfo, epsilon: f32) -> Result<UkCall> {
    if node.n_outputs() != 1 {
        return Err(node.unsupported("training-mode BatchNormalization is not supported"));
    }
    let (n, c, plane) = channels(node)?;
    Ok(UkCall::new("batchnorm")
        .iattr([i(n), i(c), i(plane)])
        .fattr([f64::from(epsilon)]))
}

fn group_norm(node: &NodeInfo, groups: usize, epsilon: f32, per_channel: bool) -> Result<UkCall> {
    let (n, c, plane) = channels(node)?;
    if groups == 0 || c % groups != 0 {
        return Err(node.unsupported(format!("{c} channels are not divisible into {groups} groups")));
    }
    Ok(UkCall::new("groupnorm")
        .iattr([i(n), i(c), i(groups), i(plane), i64::from(per_channel)])
        .fattr([f64::from(epsilon)]))
}

fn lp_norm(node: &NodeInfo, axis: i64, p: u8) -> Result<UkCall> {
    if !matches!(p, 1 | 2) {
        return Err(node.unsupported(format!("p must be 1 or 2, got {p}")));
    }
    let shape = node.input_shape(0)?;
    let a = norm_axis(node, axis, shape.len())?;
    let [outer, n, inner] = split_at(&shape, a);
    Ok(UkCall::new("lpnorm").iattr([outer, n, inner, i64::from(p)]))
}

fn mvn(node: &NodeInfo, axes: &[i64]) -> Result<UkCall> {
    let shape = node.input_shape(0)?;
    let mask = axes_mask(node, axes, shape.len())?;
    Ok(UkCall::new("mvn").iattr(pack_groups(node, &groups(&shape, &mask))?))
}

fn lrn(node: &NodeInfo, size: usize, alpha: f32, beta: f32, bias: f32) -> Result<UkCall> {
    let (n, c, inner) = channels(node)?;
    if size == 0 {
        return Err(node.unsupported("size must be positive"));
    }
    Ok(UkCall::new("lrn").iattr([i(n), i(c), i(inner), i(size)]).fattr([
        f64::from(alpha),
        f64::from(beta),
        f64::from(bias),
    ]))
}

fn loss(
    node: &NodeInfo,
    log_softmax: bool,
    reduction: LossReduction,
    ignore_index: Option<i64>,
) -> Result<UkCall> {
    let (n, c, d) = channels(node)?;
    let reduction = match reduction {
        LossReduction::None => LossCode::LOSS_NONE,
        LossReduction::Sum => LossCode::LOSS_SUM,
        LossReduction::Mean => LossCode::LOSS_MEAN,
    };
    let scratch = if log_softmax { 8 * (n * c * d) as u64 } else { 0 };
    Ok(UkCall::new("loss")
        .iattr([
            i(n),
            i(c),
            i(d),
            i64::from(log_softmax),
            reduction.code(),
            i64::from(ignore_index.is_some()),
            ignore_index.unwrap_or(0),
        ])
        .scratch(scratch))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_merge_runs_and_drop_unit_extents() {
        assert_eq!(
            groups(&[2, 1, 3, 4, 5], &[false, true, true, true, false]),
            vec![(2, false), (12, true), (5, false)]
        );
        assert_eq!(
            groups(&[1, 3, 1, 4], &[true, false, true, false]),
            vec![(12, false)]
        );
        assert_eq!(
            groups(&[2, 3, 4], &[true, false, true]),
            vec![(2, true), (3, false), (4, true)]
        );
        // Zero extents stay: they make the reduced set (or the output) empty.
        assert_eq!(groups(&[0, 3], &[true, false]), vec![(0, true), (3, false)]);
    }

    #[test]
    fn split_at_axis() {
        assert_eq!(split_at(&[2, 3, 4, 5], 1), [2, 3, 20]);
        assert_eq!(split_at(&[7], 0), [1, 7, 1]);
    }
}
