//! Transpose: axis permutation, with unit axes dropped and adjacent axes merged before the
//! copy, and batched 2-D transposes done in cache-sized tiles.

use super::{make, numel, strided_copy, Res};
use crate::ops::util::strides;
use crate::ops::InferCtx;
use crate::{bail, Element, Tensor, TensorData, TensorType};

fn check_perm(perm: &[usize], rank: usize) -> Res<()> {
    if perm.len() != rank {
        bail!(
            "perm {perm:?} has {} entries for an input of rank {rank}",
            perm.len()
        );
    }
    let mut seen = vec![false; rank];
    for &p in perm {
        if p >= rank || seen[p] {
            bail!("perm {perm:?} is not a permutation of the {rank} axes");
        }
        seen[p] = true;
    }
    Ok(())
}

pub(super) fn infer_transpose(cx: &InferCtx, perm: &[usize]) -> Res<TensorType> {
    let x = cx.ty(0)?;
    check_perm(perm, x.rank())?;
    Ok(TensorType::new(
        x.dtype,
        perm.iter().map(|&p| x.shape[p].clone()).collect(),
    ))
}

pub(super) fn eval_transpose(x: &Tensor, perm: &[usize]) -> Res<Tensor> {
    check_perm(perm, x.rank())?;
    let out_shape: Vec<usize> = perm.iter().map(|&p| x.shape()[p]).collect();
    let (merged, mperm) = merge_transpose_axes(x.shape(), perm);
    let m = mperm.len();
    fn general<T: Element>(v: &[T], in_shape: &[usize], perm: &[usize]) -> TensorData {
        let in_strides = strides(in_shape);
        let st: Vec<isize> = perm.iter().map(|&p| in_strides[p] as isize).collect();
        let shape: Vec<usize> = perm.iter().map(|&p| in_shape[p]).collect();
        T::wrap(strided_copy(v, &shape, 0, &st))
    }
    let data = if mperm.iter().enumerate().all(|(i, &p)| i == p) {
        // Only unit axes move: the data order is unchanged.
        x.data().clone()
    } else if mperm[..m - 2].iter().enumerate().all(|(i, &p)| i == p) {
        let (rows, cols) = (merged[m - 2], merged[m - 1]);
        crate::with_data!(x.data(), v => T2d::wrap_batched(v, rows, cols))
    } else {
        crate::with_data!(x.data(), v => general(v, &merged, &mperm))
    };
    make(out_shape, data)
}

/// Simplifies a transpose: drops unit axes and merges runs of input axes that stay adjacent
/// and in order in the output. Returns the merged input shape and permutation, e.g.
/// NCHW→NHWC on `[n, c, h, w]` becomes `[n, c, h*w]` with perm `[0, 2, 1]`.
fn merge_transpose_axes(shape: &[usize], perm: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let kept: Vec<usize> = (0..shape.len()).filter(|&a| shape[a] != 1).collect();
    let renum = |a: usize| kept.iter().position(|&k| k == a);
    let p: Vec<usize> = perm.iter().filter_map(|&a| renum(a)).collect();
    // Runs of consecutive input axes, in output order.
    let mut groups: Vec<Vec<usize>> = vec![];
    for &a in &p {
        match groups.last_mut() {
            Some(g) if g.last().is_some_and(|&l| l + 1 == a) => g.push(a),
            _ => groups.push(vec![a]),
        }
    }
    let mut order: Vec<usize> = (0..groups.len()).collect();
    order.sort_by_key(|&g| groups[g][0]);
    let merged: Vec<usize> = order
        .iter()
        .map(|&g| groups[g].iter().map(|&a| shape[kept[a]]).product())
        .collect();
    let mperm: Vec<usize> = (0..groups.len())
        .map(|g| order.iter().position(|&o| o == g).unwrap_or(0))
        .collect();
    if merged.len() < 2 {
        return (vec![numel(shape)], vec![0]);
    }
    (merged, mperm)
}

/// Batched 2-D transposes `[b, rows, cols] → [b, cols, rows]` in cache-sized tiles, so that
/// neither the reads nor the writes stride through memory one element at a time.
struct T2d;

impl T2d {
    const TILE: usize = 32;

    fn wrap_batched<T: Element>(v: &[T], rows: usize, cols: usize) -> TensorData {
        let mat = rows * cols;
        let mut out = vec![T::default(); v.len()];
        if mat == 0 {
            return T::wrap(out);
        }
        for (src, dst) in v.chunks_exact(mat).zip(out.chunks_exact_mut(mat)) {
            for r0 in (0..rows).step_by(Self::TILE) {
                for c0 in (0..cols).step_by(Self::TILE) {
                    for c in c0..(c0 + Self::TILE).min(cols) {
                        for r in r0..(r0 + Self::TILE).min(rows) {
                            dst[c * rows + r] = src[r * cols + c];
                        }
                    }
                }
            }
        }
        T::wrap(out)
    }
}
