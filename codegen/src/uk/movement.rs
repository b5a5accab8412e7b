//! Micro-kernel lowering for the movement family (see `codegen/ukernels/movement.c`).
//!
//! Everything that is a fixed map from output to input positions (Transpose, Slice, Concat,
//! Split, Expand, Tile, DepthToSpace, SpaceToDepth) becomes one strided copy (`kiln_uk_copy`):
//! shapes are static, so the strides are computed here, contiguous dims are merged, and the C
//! loop only walks what is left, copying whole contiguous blocks at a time. Ops driven by
//! runtime indices (Gather*, Scatter*, OneHot) get their own kernels, which check every index.

use super::codes::{GridModeCode, GridPadCode, ScatterCode};
use super::UkCall;
use crate::error::Result;
use crate::node::NodeInfo;
use kiln_ir::ops::resize::{
    interpolation_taps, is_identity, kernel_width, nearest_index, plan_axes, resize_axes, saturated,
    source_coord, AxisPlan, Target,
};
use kiln_ir::ops::{pad_axis_map, slice_range};
use kiln_ir::{
    CoordTransform, DType, GridMode, GridPadding, MiscOp, Op, PadMode, ResizeAttrs, ResizeMode,
    ScatterReduction, Tensor, TensorData, VisionOp,
};

/// Must match MV_MAX_RANK in movement.c.
const MAX_RANK: usize = 32;

/// Input 0 as slices along `axis` (Compress, Unique): the extents before, at and after it and
/// its index; without an axis, the flattened tensor as one axis.
fn slices_along(node: &NodeInfo, axis: Option<i64>) -> Result<(usize, usize, usize, usize)> {
    let x = node.input_shape(0)?;
    Ok(match axis {
        None => (1, x.iter().product(), 1, 0),
        Some(axis) => {
            let a =
                kiln_ir::ops::util::norm_axis(axis, x.len()).map_err(|e| node.unsupported(e.to_string()))?;
            (x[..a].iter().product(), x[a], x[a + 1..].iter().product(), a)
        }
    })
}

pub fn lower(node: &NodeInfo) -> Result<Option<UkCall>> {
    let call = match node.op() {
        Op::Transpose { perm } => transpose(node, perm)?,
        Op::Slice => slice(node)?,
        Op::Concat { axis } => concat(node, *axis)?,
        Op::Split { axis, .. } => split(node, *axis)?,
        Op::Expand => expand(node)?,
        Op::Tile => tile(node)?,
        Op::DepthToSpace { block_size, crd } => depth_to_space(node, *block_size, *crd)?,
        Op::SpaceToDepth { block_size, crd } => space_to_depth(node, *block_size, *crd)?,
        Op::Gather { axis } => gather(node, *axis)?,
        Op::GatherElements { axis } => gather_elements(node, *axis)?,
        Op::GatherND { batch_dims } => gather_nd(node, *batch_dims)?,
        Op::ScatterND { reduction } => scatter_nd(node, *reduction)?,
        Op::ScatterElements { axis, reduction } => scatter_elements(node, *axis, *reduction)?,
        Op::Pad { mode } => pad(node, *mode)?,
        Op::ConstantOfShape { value } => constant_of_shape(node, value)?,
        Op::EyeLike { k, .. } => {
            let s = node.output_shape(0)?;
            UkCall::new("eye_like").iattr([s[0] as i64, s[1] as i64, *k])
        }
        Op::Trilu { upper } => trilu(node, *upper)?,
        Op::Range => UkCall::new("range"),
        // Its output's size depends on the data (`crate::data_dependent`). iattr: whether it
        // writes its bound's layout (a kernel reads it) rather than compacted (a graph output).
        Op::NonZero => UkCall::new("nonzero")
            .iattr([crate::data_dependent::writes_padded(node.graph, node.id.out(0)) as i64]),
        // iattr: outer, n, inner (the dims before, at and after the axis; the whole tensor as
        // one axis without one), the axis' index in the output. Its output's size depends on
        // the data unless the condition is a constant.
        Op::Misc(MiscOp::Compress { axis }) => {
            let (outer, n, inner, at) = slices_along(node, *axis)?;
            UkCall::new("compress").iattr([outer as i64, n as i64, inner as i64, at as i64])
        }
        // iattr: outer, n, inner as Compress's, sorted, the axis' index in output 0. Scratch:
        // 7 × n i64 (the sort and the groups). Outputs 0, 1 and 3 have sizes that depend on the
        // data.
        Op::Misc(MiscOp::Unique { sorted, axis }) => {
            let (outer, n, inner, at) = slices_along(node, *axis)?;
            UkCall::new("unique")
                .iattr([outer as i64, n as i64, inner as i64, *sorted as i64, at as i64])
                .scratch((7 * n.max(1) * 8) as u64)
        }
        Op::OneHot { axis } => one_hot(node, *axis)?,
        Op::Resize(a) => resize(node, a)?,
        Op::Vision(VisionOp::MaxUnpool {
            kernel_shape,
            strides,
            pads,
        }) => {
            let xs = node.input_shape(0)?;
            let os = node.output_shape(0)?;
            let n = kernel_shape.len();
            if xs.len() < 3 || xs.len() - 2 != n {
                return Err(node.unsupported("X must be [N, C, spatial...] matching kernel_shape"));
            }
            let mut natural = xs[..2].to_vec();
            for i in 0..n {
                let stride = strides.get(i).copied().unwrap_or(1);
                let (pb, pe) = (
                    pads.get(i).copied().unwrap_or(0),
                    pads.get(n + i).copied().unwrap_or(0),
                );
                let e = (xs[2 + i].saturating_sub(1) * stride + kernel_shape[i])
                    .checked_sub(pb + pe)
                    .ok_or_else(|| node.unsupported("invalid unpooled extent"))?;
                natural.push(e);
            }
            if os.len() != natural.len() || os.iter().zip(&natural).any(|(o, n)| o < n) {
                return Err(node.unsupported("output_shape is smaller than the unpooled shape"));
            }
            let mut iattr = vec![natural.len() as i64];
            iattr.extend(natural.iter().map(|&d| d as i64));
            iattr.extend(os.iter().map(|&d| d as i64));
            UkCall::new("max_unpool").iattr(iattr)
        }
        Op::Vision(VisionOp::CenterCropPad { axes }) => center_crop_pad(node, axes.as_deref())?,
        Op::Vision(op @ VisionOp::Col2Im { .. }) => col2im(node, op)?,
        Op::Vision(VisionOp::AffineGrid { align_corners }) => {
            let os = node.output_shape(0)?;
            let r = os.len().saturating_sub(2);
            if !(2..=3).contains(&r) {
                return Err(node.unsupported("AffineGrid is 2-D or 3-D"));
            }
            let mut iattr = vec![r as i64, *align_corners as i64];
            iattr.extend(os[1..=r].iter().map(|&d| d as i64));
            UkCall::new("affine_grid").iattr(iattr)
        }
        Op::Vision(VisionOp::GridSample {
            mode,
            padding,
            align_corners,
        }) => {
            let xs = node.input_shape(0)?;
            let r = xs.len().saturating_sub(2);
            if !(1..=4).contains(&r) {
                return Err(node.unsupported(format!("{r} spatial axes (the kernel takes 1 to 4)")));
            }
            if xs[2..].contains(&0) && numel(&node.output_shape(0)?) > 0 {
                return Err(node.unsupported("cannot sample from an empty spatial extent"));
            }
            let mode = match mode {
                GridMode::Linear => GridModeCode::GS_LINEAR,
                GridMode::Nearest => GridModeCode::GS_NEAREST,
                GridMode::Cubic => GridModeCode::GS_CUBIC,
            };
            let padding = match padding {
                GridPadding::Zeros => GridPadCode::GS_ZEROS,
                GridPadding::Border => GridPadCode::GS_BORDER,
                GridPadding::Reflection => GridPadCode::GS_REFLECTION,
            };
            UkCall::new("grid_sample").iattr([r as i64, mode.code(), padding.code(), *align_corners as i64])
        }
        Op::Misc(MiscOp::ReverseSequence { batch_axis, .. }) => {
            let s = node.input_shape(0)?;
            if s.len() < 2 || *batch_axis > 1 {
                return Err(node.unsupported("batch_axis/time_axis must be 0 and 1 of a rank >= 2 input"));
            }
            let inner = numel(&s[2..]) as i64 * elem_size(node);
            UkCall::new("reverse_sequence").iattr([*batch_axis as i64, s[0] as i64, s[1] as i64, inner])
        }
        Op::Misc(MiscOp::TensorScatter { circular, axis }) => {
            let cs = node.input_shape(0)?;
            let us = node.input_shape(1)?;
            let a = norm_axis(node, *axis, cs.len())?;
            if a == 0 || us.len() != cs.len() {
                return Err(node.unsupported(format!("update {us:?} does not match cache {cs:?}")));
            }
            let inner = numel(&cs[a + 1..]) as i64 * elem_size(node);
            UkCall::new("tensor_scatter").iattr([
                cs[0] as i64,
                numel(&cs[1..a]) as i64,
                us[a] as i64,
                cs[a] as i64,
                inner,
                *circular as i64,
            ])
        }
        _ => return Ok(None),
    };
    Ok(Some(call))
}

fn strides(shape: &[usize]) -> Vec<i64> {
    let mut s = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1] as i64;
    }
    s
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn norm_axis(node: &NodeInfo, axis: i64, rank: usize) -> Result<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    if a < 0 || a >= rank as i64 {
        return Err(node.unsupported(format!("axis {axis} is out of range for rank {rank}")));
    }
    Ok(a as usize)
}

fn elem_size(node: &NodeInfo) -> i64 {
    node.output_type(0).dtype.size_bytes() as i64
}

fn known_i64s(node: &NodeInfo, i: usize, what: &str) -> Result<Option<Vec<i64>>> {
    if !node.has_input(i) {
        return Ok(None);
    }
    match node.known(i) {
        Some(t) => Ok(Some(t.to_i64_vec())),
        None => Err(node.unsupported(format!("{what} must be known at compile time"))),
    }
}

// ---------------------------------------------------------------------------------------------
// Strided copies.

/// One strided copy, in elements: output position `p` (over `dims`) of output `dst_out` at
/// `dst_off + p·ds` takes input `src_in` at `src_off + p·ss`.
struct Copy {
    src_in: usize,
    dst_out: usize,
    src_off: i64,
    dst_off: i64,
    dims: Vec<usize>,
    ss: Vec<i64>,
    ds: Vec<i64>,
}

impl Copy {
    /// A copy into the whole of output `dst_out` (contiguous) from a view of input `src_in`.
    fn into_output(src_in: usize, dst_out: usize, src_off: i64, dims: Vec<usize>, ss: Vec<i64>) -> Copy {
        let ds = strides(&dims);
        Copy {
            src_in,
            dst_out,
            src_off,
            dst_off: 0,
            dims,
            ss,
            ds,
        }
    }
}

/// Packs copies for `kiln_uk_copy` after dropping unit dims, merging dims that are contiguous
/// in both source and destination, and ordering a transposed pair innermost for tiling.
fn copy_call(node: &NodeInfo, esize: i64, copies: Vec<Copy>) -> Result<UkCall> {
    let mut iattr = vec![esize, 0];
    let mut n = 0;
    for c in copies {
        if c.dims.contains(&0) {
            continue;
        }
        let mut dims: Vec<usize> = vec![];
        let mut ss: Vec<i64> = vec![];
        let mut ds: Vec<i64> = vec![];
        for k in 0..c.dims.len() {
            if c.dims[k] == 1 {
                continue;
            }
            if let (Some(&d), Some(&s), Some(&t)) = (dims.last(), ss.last(), ds.last()) {
                // The previous (outer) dim steps exactly over this one in both tensors.
                let dk = c.dims[k] as i64;
                if s == c.ss[k] * dk && t == c.ds[k] * dk {
                    let last = dims.len() - 1;
                    dims[last] = d * c.dims[k];
                    ss[last] = c.ss[k];
                    ds[last] = c.ds[k];
                    continue;
                }
            }
            dims.push(c.dims[k]);
            ss.push(c.ss[k]);
            ds.push(c.ds[k]);
        }
        let mut block = esize;
        if ss.last() == Some(&1) && ds.last() == Some(&1) {
            block = esize * dims.pop().unwrap_or(1) as i64;
            ss.pop();
            ds.pop();
        }
        let r = dims.len();
        if block == esize && r >= 2 && ds[r - 1] == 1 && ss[r - 1] != 1 {
            if let Some(j) = (0..r - 1).rev().find(|&j| ss[j] == 1) {
                // Loop order is free in a copy: put the source-contiguous dim next to the
                // destination-contiguous one so the kernel walks the pair in tiles.
                let (d, s, t) = (dims.remove(j), ss.remove(j), ds.remove(j));
                dims.insert(r - 2, d);
                ss.insert(r - 2, s);
                ds.insert(r - 2, t);
            }
        }
        if r > MAX_RANK {
            return Err(node.unsupported(format!("copy of rank {r} exceeds the kernel's {MAX_RANK}")));
        }
        iattr.extend([
            c.src_in as i64,
            c.dst_out as i64,
            c.src_off * esize,
            c.dst_off * esize,
            block,
            r as i64,
        ]);
        iattr.extend(dims.iter().map(|&d| d as i64));
        iattr.extend(ss.iter().map(|&s| s * esize));
        iattr.extend(ds.iter().map(|&s| s * esize));
        n += 1;
    }
    iattr[1] = n;
    Ok(UkCall::new("copy").iattr(iattr))
}

fn transpose(node: &NodeInfo, perm: &[usize]) -> Result<UkCall> {
    let in_shape = node.input_shape(0)?;
    let st = strides(&in_shape);
    let dims: Vec<usize> = perm.iter().map(|&p| in_shape[p]).collect();
    let ss = perm.iter().map(|&p| st[p]).collect();
    copy_call(node, elem_size(node), vec![Copy::into_output(0, 0, 0, dims, ss)])
}

fn slice(node: &NodeInfo) -> Result<UkCall> {
    let in_shape = node.input_shape(0)?;
    let out_shape = node.output_shape(0)?;
    let rank = in_shape.len();
    let starts = known_i64s(node, 1, "starts")?.unwrap_or_default();
    let ends = known_i64s(node, 2, "ends")?.unwrap_or_default();
    let axes = known_i64s(node, 3, "axes")?;
    let steps = known_i64s(node, 4, "steps")?;
    let n = starts.len();
    if ends.len() != n
        || axes.as_ref().is_some_and(|a| a.len() != n)
        || steps.as_ref().is_some_and(|s| s.len() != n)
    {
        return Err(node.unsupported("starts, ends, axes and steps differ in length"));
    }
    let mut spec = vec![(0i64, i64::MAX, 1i64); rank];
    for i in 0..n {
        let a = match &axes {
            Some(ax) => norm_axis(node, ax[i], rank)?,
            None => i,
        };
        let step = steps.as_ref().map_or(1, |s| s[i]);
        if step == 0 {
            return Err(node.unsupported("slice step cannot be 0"));
        }
        spec[a] = (starts[i], ends[i], step);
    }
    let st = strides(&in_shape);
    let mut off = 0;
    let mut ss = vec![];
    for (k, &(s, e, step)) in spec.iter().enumerate() {
        let d = in_shape[k];
        let (begin, len) = slice_range(d, s, e, step).map_err(|e| node.unsupported(e.to_string()))?;
        let (begin, len) = (begin as i64, len as i64);
        if len as usize != out_shape[k] {
            return Err(node.unsupported(format!(
                "slice of axis {k} has {len} elements but the output type says {}",
                out_shape[k]
            )));
        }
        if len > 0 {
            off += begin * st[k];
        }
        // |step| > extent reads one element at most: clamping keeps the stride small.
        let step = step.clamp(-(d as i64).max(1), (d as i64).max(1));
        ss.push(step * st[k]);
    }
    copy_call(
        node,
        elem_size(node),
        vec![Copy::into_output(0, 0, off, out_shape, ss)],
    )
}

fn concat(node: &NodeInfo, axis: i64) -> Result<UkCall> {
    let out_shape = node.output_shape(0)?;
    let a = norm_axis(node, axis, out_shape.len())?;
    let ds = strides(&out_shape);
    let mut copies = vec![];
    let mut pos = 0;
    for i in 0..node.n_inputs() {
        let s = node.input_shape(i)?;
        copies.push(Copy {
            src_in: i,
            dst_out: 0,
            src_off: 0,
            dst_off: pos as i64 * ds[a],
            ss: strides(&s),
            ds: ds.clone(),
            dims: s.clone(),
        });
        pos += s[a];
    }
    copy_call(node, elem_size(node), copies)
}

fn split(node: &NodeInfo, axis: i64) -> Result<UkCall> {
    let in_shape = node.input_shape(0)?;
    let a = norm_axis(node, axis, in_shape.len())?;
    let ss = strides(&in_shape);
    let mut copies = vec![];
    let mut pos = 0;
    for o in 0..node.n_outputs() {
        let s = node.output_shape(o)?;
        copies.push(Copy::into_output(0, o, pos as i64 * ss[a], s.clone(), ss.clone()));
        pos += s[a];
    }
    copy_call(node, elem_size(node), copies)
}

fn expand(node: &NodeInfo) -> Result<UkCall> {
    let in_shape = node.input_shape(0)?;
    let out_shape = node.output_shape(0)?;
    let st = strides(&in_shape);
    let lead = out_shape.len() - in_shape.len();
    let ss = (0..out_shape.len())
        .map(|k| {
            if k < lead || in_shape[k - lead] == 1 {
                0
            } else {
                st[k - lead]
            }
        })
        .collect();
    copy_call(
        node,
        elem_size(node),
        vec![Copy::into_output(0, 0, 0, out_shape, ss)],
    )
}

/// Tile as a copy from the view `[r0, d0, r1, d1, ...]` whose repeat dims have stride 0.
fn tile(node: &NodeInfo) -> Result<UkCall> {
    let in_shape = node.input_shape(0)?;
    let out_shape = node.output_shape(0)?;
    let st = strides(&in_shape);
    let mut dims = vec![];
    let mut ss = vec![];
    for k in 0..in_shape.len() {
        let d = in_shape[k];
        let reps = out_shape[k].checked_div(d).unwrap_or(0);
        dims.extend([reps, d]);
        ss.extend([0, st[k]]);
    }
    copy_call(node, elem_size(node), vec![Copy::into_output(0, 0, 0, dims, ss)])
}

/// A reshape-transpose-reshape: the input viewed as `view`, axes permuted by `perm`.
fn permuted(node: &NodeInfo, view: &[usize], perm: &[usize]) -> Result<UkCall> {
    let st = strides(view);
    let dims = perm.iter().map(|&p| view[p]).collect();
    let ss = perm.iter().map(|&p| st[p]).collect();
    copy_call(node, elem_size(node), vec![Copy::into_output(0, 0, 0, dims, ss)])
}

fn dims4(node: &NodeInfo) -> Result<[usize; 4]> {
    match node.input_shape(0)?.as_slice() {
        &[n, c, h, w] => Ok([n, c, h, w]),
        s => Err(node.unsupported(format!("needs a 4-D input, got {s:?}"))),
    }
}

fn depth_to_space(node: &NodeInfo, b: usize, crd: bool) -> Result<UkCall> {
    let [n, c, h, w] = dims4(node)?;
    let c2 = c / (b * b).max(1);
    if crd {
        permuted(node, &[n, c2, b, b, h, w], &[0, 1, 4, 2, 5, 3])
    } else {
        permuted(node, &[n, b, b, c2, h, w], &[0, 3, 4, 1, 5, 2])
    }
}

fn space_to_depth(node: &NodeInfo, b: usize, crd: bool) -> Result<UkCall> {
    let [n, c, h, w] = dims4(node)?;
    let b = b.max(1);
    let view = [n, c, h / b, b, w / b, b];
    if crd {
        permuted(node, &view, &[0, 1, 3, 5, 2, 4])
    } else {
        permuted(node, &view, &[0, 3, 5, 1, 2, 4])
    }
}

// ---------------------------------------------------------------------------------------------
// Runtime indices.

fn gather(node: &NodeInfo, axis: i64) -> Result<UkCall> {
    let d = node.input_shape(0)?;
    let idx = node.input_shape(1)?;
    let a = norm_axis(node, axis, d.len())?;
    let inner = numel(&d[a + 1..]) as i64 * elem_size(node);
    Ok(UkCall::new("gather").iattr([numel(&d[..a]) as i64, d[a] as i64, numel(&idx) as i64, inner]))
}

/// `[axis, rank, idx_dims, data_strides, data_axis_dim]` for the elements kernels.
fn elements_attrs(node: &NodeInfo, axis: i64) -> Result<Vec<i64>> {
    let d = node.input_shape(0)?;
    let idx = node.input_shape(1)?;
    let a = norm_axis(node, axis, d.len())?;
    if idx.len() != d.len() || d.len() > MAX_RANK {
        return Err(node.unsupported(format!("indices {idx:?} do not match the data {d:?}")));
    }
    let mut v = vec![a as i64, d.len() as i64];
    v.extend(idx.iter().map(|&x| x as i64));
    v.extend(strides(&d));
    v.push(d[a] as i64);
    Ok(v)
}

fn gather_elements(node: &NodeInfo, axis: i64) -> Result<UkCall> {
    Ok(UkCall::new("gather_elements").iattr(elements_attrs(node, axis)?))
}

/// `[tuples, slice, k, per_batch, batch_stride, dims[k], strides[k]]` for GatherND/ScatterND.
fn nd_attrs(node: &NodeInfo, b: usize) -> Result<Vec<i64>> {
    let d = node.input_shape(0)?;
    let idx = node.input_shape(1)?;
    let q = idx.len();
    let k = *idx
        .last()
        .ok_or_else(|| node.unsupported("indices must have rank >= 1"))?;
    if b + k > d.len() {
        return Err(node.unsupported("index tuples are longer than the data rank"));
    }
    let ds = strides(&d);
    let per_batch = numel(&idx[b.min(q - 1)..q - 1]).max(1);
    let batch_stride = if b == 0 { 0 } else { ds[b - 1] };
    let mut v = vec![
        numel(&idx[..q - 1]) as i64,
        numel(&d[b + k..]) as i64,
        k as i64,
        per_batch as i64,
        batch_stride,
    ];
    v.extend(d[b..b + k].iter().map(|&x| x as i64));
    v.extend(&ds[b..b + k]);
    Ok(v)
}

fn gather_nd(node: &NodeInfo, b: usize) -> Result<UkCall> {
    Ok(UkCall::new("gather_nd").iattr(nd_attrs(node, b)?))
}

fn reduction_code(r: ScatterReduction) -> i64 {
    match r {
        ScatterReduction::None => ScatterCode::SC_NONE,
        ScatterReduction::Add => ScatterCode::SC_ADD,
        ScatterReduction::Mul => ScatterCode::SC_MUL,
        ScatterReduction::Max => ScatterCode::SC_MAX,
        ScatterReduction::Min => ScatterCode::SC_MIN,
    }
    .code()
}

fn scatter_nd(node: &NodeInfo, r: ScatterReduction) -> Result<UkCall> {
    Ok(UkCall::new("scatter_nd")
        .iattr([reduction_code(r)])
        .iattr(nd_attrs(node, 0)?))
}

fn scatter_elements(node: &NodeInfo, axis: i64, r: ScatterReduction) -> Result<UkCall> {
    Ok(UkCall::new("scatter_elements")
        .iattr([reduction_code(r)])
        .iattr(elements_attrs(node, axis)?))
}

fn one_hot(node: &NodeInfo, axis: i64) -> Result<UkCall> {
    let idx = node.input_shape(0)?;
    let out = node.output_shape(0)?;
    let a = norm_axis(node, axis, idx.len() + 1)?;
    Ok(UkCall::new("one_hot").iattr([out[a] as i64, numel(&idx[a..]) as i64]))
}

// ---------------------------------------------------------------------------------------------
// Pad and generators.

/// For an empty output, the copy kernel with nothing to copy. Pad's and Resize's index maps
/// and taps hold an entry per position of every axis, which an empty output does not bound
/// (Resize sizes `[1, 3, 2^42, 0]`, a pad of 2^40 beside an axis of 0).
fn nothing_to_write(node: &NodeInfo, out_shape: &[usize]) -> Option<UkCall> {
    (numel(out_shape) == 0).then(|| UkCall::new("copy").iattr([elem_size(node), 0]))
}

fn pad(node: &NodeInfo, mode: PadMode) -> Result<UkCall> {
    let rank = node.input_shape(0)?.len();
    let pads = known_i64s(node, 1, "pads")?.unwrap_or_default();
    let axes: Vec<usize> = match known_i64s(node, 3, "axes")? {
        Some(a) => a
            .iter()
            .map(|&x| norm_axis(node, x, rank))
            .collect::<Result<_>>()?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(node.unsupported(format!("pads {pads:?} must have 2 entries per padded axis")));
    }
    let mut amounts = vec![(0, 0); rank];
    for (i, &a) in axes.iter().enumerate() {
        amounts[a] = (pads[i], pads[axes.len() + i]);
    }
    // Fill from the constant_value input (or zero).
    gather_by_pads(node, &amounts, mode, [0, 0])
}

/// CenterCropPad with its target shape known (bound or constant): a Pad by the amounts that
/// centre it — on each resized axis output index `o` reads input `o + shift`, `shift` half the
/// crop (a negative pad) or minus half the pad, the odd element going to the end — with zeros
/// outside the input.
fn center_crop_pad(node: &NodeInfo, axes: Option<&[i64]>) -> Result<UkCall> {
    let (in_shape, out_shape) = (node.input_shape(0)?, node.output_shape(0)?);
    let rank = in_shape.len();
    let axes: Vec<usize> = match axes {
        Some(a) => a
            .iter()
            .map(|&x| norm_axis(node, x, rank))
            .collect::<Result<_>>()?,
        None => (0..rank).collect(),
    };
    let mut amounts = vec![(0, 0); rank];
    for &k in &axes {
        let (d, x) = (out_shape[k] as i64, in_shape[k] as i64);
        let shift = if d <= x { (x - d) / 2 } else { -((d - x) / 2) };
        amounts[k] = (-shift, d - x + shift);
    }
    // The fill is zero (fill_mode 1, bits 0): input 1 is the shape, not a value.
    gather_by_pads(node, &amounts, PadMode::Constant, [1, 0])
}

/// A gather by axis maps (`kiln_uk_gather_axes`) that pads (or, by negative amounts, crops)
/// input 0 by `amounts` (before, after) per axis in `mode`; `fill`: fill_mode and fill_bits.
fn gather_by_pads(node: &NodeInfo, amounts: &[(i64, i64)], mode: PadMode, fill: [i64; 2]) -> Result<UkCall> {
    let in_shape = node.input_shape(0)?;
    let out_shape = node.output_shape(0)?;
    if let Some(call) = nothing_to_write(node, &out_shape) {
        return Ok(call);
    }
    let rank = in_shape.len();
    if rank > MAX_RANK {
        return Err(node.unsupported(format!("rank {rank} exceeds the kernel's {MAX_RANK}")));
    }
    let esize = elem_size(node);
    let mut iattr = vec![esize, rank as i64];
    iattr.extend(out_shape.iter().map(|&d| d as i64));
    iattr.extend(strides(&in_shape).iter().map(|&s| s * esize));
    let mut last = vec![];
    for k in 0..rank {
        let m: Vec<i64> = pad_axis_map(in_shape[k], amounts[k], out_shape[k], mode)
            .map_err(|_| node.unsupported(format!("pads {:?} do not fit axis {k}", amounts[k])))?
            .into_iter()
            .map(|s| s.map_or(-1, |s| s as i64))
            .collect();
        iattr.extend(&m);
        last = m;
    }
    let (lo, hi) = longest_run(&last);
    iattr.extend([lo, hi]);
    iattr.extend(fill);
    Ok(UkCall::new("gather_axes").iattr(iattr))
}

/// Col2Im with image_shape and block_shape known: iattr [rank, N·C, K (taps), L (blocks),
/// then per image axis its extent, block (kernel) extent, block count, stride, dilation and
/// padding before]. Each output element sums, in tap order, the one block per tap that
/// covers it (if any): the reference's order, so its f64 sums are the reference's.
fn col2im(node: &NodeInfo, op: &VisionOp) -> Result<UkCall> {
    let (Some(img), Some(blk)) = (node.known(1), node.known(2)) else {
        return Err(node.unsupported("image_shape and block_shape must be known at compile time (--bind)"));
    };
    let as_usize = |t: &Tensor| -> Vec<usize> { t.to_f64_vec().iter().map(|&v| v as usize).collect() };
    let (img, blk) = (as_usize(img), as_usize(blk));
    let axes = kiln_ir::ops::col2im_axes(op, &img, &blk).map_err(|e| node.unsupported(e.to_string()))?;
    let x = node.input_shape(0)?;
    let out = node.output_shape(0)?;
    let taps: usize = blk.iter().product();
    let blocks: usize = axes.iter().map(|a| a.output).product();
    if x.len() != 3 || out.len() != 2 + img.len() || img.len() > MAX_RANK {
        return Err(node.unsupported(format!("input {x:?} and output {out:?} do not fit Col2Im")));
    }
    let mut iattr = vec![
        img.len() as i64,
        (out[0] * out[1]) as i64,
        taps as i64,
        blocks as i64,
    ];
    for (a, &k) in axes.iter().zip(&blk) {
        iattr.extend([
            a.input as i64,
            k as i64,
            a.output as i64,
            a.stride as i64,
            a.dilation as i64,
            a.pad_begin,
        ]);
    }
    Ok(UkCall::new("col2im").iattr(iattr))
}

fn constant_of_shape(node: &NodeInfo, value: &Tensor) -> Result<UkCall> {
    let bytes = value.to_le_bytes();
    let esize = elem_size(node);
    if bytes.len() != esize as usize {
        return Err(node.unsupported("value must hold exactly one element"));
    }
    let mut bits = [0u8; 8];
    bits[..bytes.len()].copy_from_slice(&bytes);
    Ok(UkCall::new("fill").iattr([esize, i64::from_le_bytes(bits)]))
}

fn trilu(node: &NodeInfo, upper: bool) -> Result<UkCall> {
    let s = node.input_shape(0)?;
    if s.len() < 2 {
        return Err(node.unsupported("Trilu needs rank >= 2"));
    }
    let (rows, cols) = (s[s.len() - 2], s[s.len() - 1]);
    Ok(UkCall::new("trilu").iattr([upper as i64, 0, rows as i64, cols as i64]))
}

// ---------------------------------------------------------------------------------------------
// Resize. Scales, sizes and roi are known, so the whole geometry (which source indices and
// weights each output position uses) is computed here with the reference's own math
// (`kiln_ir::ops::resize`: coordinates, nearest indices, coefficients, tap windows); the C
// kernel only applies it. Nearest mode is a per-axis index map (`gather_axes`); linear and
// cubic run one separable pass per resized axis in f64 and cast once, as the reference does.

/// A known input, None when absent or empty (an empty tensor counts as absent).
fn present<'g>(node: &NodeInfo<'g>, i: usize, what: &str) -> Result<Option<&'g Tensor>> {
    if !node.has_input(i) {
        return Ok(None);
    }
    if node.input_type(i).and_then(|t| t.num_elements()) == Some(0) {
        return Ok(None);
    }
    match node.known(i) {
        Some(t) if t.is_empty() => Ok(None),
        Some(t) => Ok(Some(t)),
        None => Err(node.unsupported(format!("{what} must be known at compile time"))),
    }
}

/// `v` cast to `dtype` as the reference's `saturate_cast`, as little-endian bits.
fn saturated_bits(dtype: DType, v: f64) -> i64 {
    let v = saturated(dtype, v);
    let bytes = Tensor::new(vec![1], TensorData::from_f64s(dtype, [v]))
        .map(|t| t.to_le_bytes())
        .unwrap_or_default();
    let mut bits = [0u8; 8];
    let n = bytes.len().min(8);
    bits[..n].copy_from_slice(&bytes[..n]);
    i64::from_le_bytes(bits)
}

/// Taps of every output position along one axis: (outside the crop region, source indices
/// clamped to the input, coefficients).
#[allow(clippy::type_complexity)]
fn axis_taps(
    node: &NodeInfo,
    a: &ResizeAttrs,
    roi_dtype: DType,
    p: &AxisPlan,
    input: usize,
) -> Result<Vec<(bool, Vec<i64>, Vec<f64>)>> {
    let width = kernel_width(a, p.scale);
    if width.is_nan() || width > 4.0 * input as f64 + 16.0 {
        return Err(node.unsupported(format!("interpolation kernel of {width} taps is too wide")));
    }
    let mut taps = Vec::with_capacity(p.out);
    for y in 0..p.out {
        let (x, outside) = source_coord(a, roi_dtype, p, input, y);
        if !x.is_finite() {
            return Err(node.unsupported("resize coordinate is not finite"));
        }
        let (idx, coeff) =
            interpolation_taps(a, x, p.scale, input).map_err(|e| node.unsupported(e.to_string()))?;
        let idx = idx.into_iter().map(|i| i as i64).collect();
        taps.push((outside, idx, coeff));
    }
    Ok(taps)
}

fn resize(node: &NodeInfo, a: &ResizeAttrs) -> Result<UkCall> {
    let in_shape = node.input_shape(0)?;
    let out_shape = node.output_shape(0)?;
    let rank = in_shape.len();
    if rank > MAX_RANK {
        return Err(node.unsupported(format!("rank {rank} exceeds the kernel's {MAX_RANK}")));
    }
    let axes = resize_axes(a, rank).map_err(|e| node.unsupported(e.to_string()))?;
    let roi_t = present(node, 1, "roi").unwrap_or(None);
    let scales = present(node, 2, "scales")?.map(Tensor::to_f64_vec);
    let sizes = present(node, 3, "sizes")?.map(|t| t.to_i64_vec());
    let crop = a.coord == CoordTransform::TfCropAndResize;
    let roi = if crop {
        let t = present(node, 1, "roi")?
            .ok_or_else(|| node.unsupported("tf_crop_and_resize needs the roi input"))?;
        Some(t.to_f64_vec())
    } else {
        None
    };
    let target = match (scales.as_deref(), sizes.as_deref()) {
        (Some(s), _) => Target::Scales(s),
        (None, Some(s)) => Target::Sizes(s),
        (None, None) => return Err(node.unsupported("Resize needs scales or sizes")),
    };
    let plan = plan_axes(a, &in_shape, &axes, &target, roi.as_deref())
        .map_err(|e| node.unsupported(format!("scales/sizes/roi do not fit the input: {e}")))?;
    if plan.iter().map(|p| p.out).ne(out_shape.iter().copied()) {
        return Err(node.unsupported("resize geometry disagrees with the output type"));
    }
    if let Some(call) = nothing_to_write(node, &out_shape) {
        return Ok(call);
    }
    let roi_dtype = roi_t.map_or(DType::F32, |t| t.dtype());
    let dtype = node.output_type(0).dtype;
    let extrapolation = a.extrapolation_value as f64;
    if a.mode == ResizeMode::Nearest {
        if a.antialias {
            return Err(node.unsupported("antialias is not defined for nearest mode"));
        }
        let esize = elem_size(node);
        let mut iattr = vec![esize, rank as i64];
        iattr.extend(out_shape.iter().map(|&d| d as i64));
        iattr.extend(strides(&in_shape).iter().map(|&s| s * esize));
        let mut last = vec![];
        for (ax, p) in plan.iter().enumerate() {
            let input = in_shape[ax];
            let m: Vec<i64> = if !axes.contains(&ax) || is_identity(p, input, crop) {
                (0..p.out as i64).collect()
            } else {
                (0..p.out)
                    .map(|y| {
                        let (c, outside) = source_coord(a, roi_dtype, p, input, y);
                        if outside {
                            -1
                        } else {
                            nearest_index(a.nearest_mode, c, p.scale, input) as i64
                        }
                    })
                    .collect()
            };
            iattr.extend(&m);
            last = m;
        }
        let (lo, hi) = longest_run(&last);
        iattr.extend([lo, hi, 1, saturated_bits(dtype, extrapolation)]);
        return Ok(UkCall::new("gather_axes").iattr(iattr));
    }
    // iattr: [rank, n_steps, in_dims[rank], per step: axis, out, n_taps, per output position:
    // outside, idx[n_taps]]; fattr: [extrapolation, per step and position: coeff[n_taps]].
    let mut iattr = vec![rank as i64, 0];
    iattr.extend(in_shape.iter().map(|&d| d as i64));
    let mut fattr = vec![extrapolation];
    let mut shape = in_shape.clone();
    let mut biggest = numel(&in_shape);
    let mut steps = 0;
    for &ax in &axes {
        let p = &plan[ax];
        let input = shape[ax];
        if is_identity(p, input, crop) {
            continue;
        }
        let taps = if input > 0 && numel(&shape) > 0 {
            axis_taps(node, a, roi_dtype, p, input)?
        } else {
            vec![]
        };
        let n_taps = taps.first().map_or(0, |t| t.1.len());
        iattr.extend([ax as i64, p.out as i64, n_taps as i64]);
        if taps.len() == p.out {
            for (outside, idx, coeff) in taps {
                iattr.push(outside as i64);
                iattr.extend(idx);
                fattr.extend(coeff);
            }
        } else {
            iattr.extend(std::iter::repeat_n(0, p.out * (n_taps + 1)));
        }
        shape[ax] = p.out;
        biggest = biggest.max(numel(&shape));
        steps += 1;
    }
    iattr[1] = steps;
    Ok(UkCall::new("resize")
        .iattr(iattr)
        .fattr(fattr)
        .scratch(2 * 8 * biggest as u64))
}

/// The longest run of consecutive source indices in a map (one memcpy in `gather_axes`).
fn longest_run(m: &[i64]) -> (i64, i64) {
    let (mut best, mut j) = ((0, 0), 0);
    while j < m.len() {
        let mut e = j + 1;
        if m[j] >= 0 {
            while e < m.len() && m[e] == m[e - 1] + 1 {
                e += 1;
            }
            if e - j > best.1 - best.0 {
                best = (j, e);
            }
        }
        j = e;
    }
    (best.0 as i64, best.1 as i64)
}
