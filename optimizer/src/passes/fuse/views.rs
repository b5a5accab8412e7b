//! Strided views through layout-only operators (Reshape, Flatten, Squeeze, Unsqueeze,
//! Transpose): which element of a source tensor each element of the result is, so that a chain
//! of them can be recognised as, say, the head split of an attention projection whatever
//! sequence of reshapes and transposes the exporter wrote.
//!
//! A [`View`] gives each dimension of a tensor its extent and its stride in elements of a
//! contiguous source, and where its first element lies. Transpose permutes the dimensions; a
//! reshape regroups them, which is a view only when every group of merged dimensions is itself
//! contiguous (the rule numpy's no-copy reshape follows); Gather of one constant index, Split
//! and Slice (step 1) pick a range of one dimension.

use kiln_ir::Op;

/// Operators that only reinterpret or reorder their first input's elements.
pub(crate) fn layout_only(op: &Op) -> bool {
    matches!(
        op,
        Op::Reshape { .. } | Op::Flatten { .. } | Op::Squeeze | Op::Unsqueeze | Op::Transpose { .. }
    )
}

/// Per dimension `(extent, stride)`, strides in elements of the source; `offset`: the source
/// element the view starts at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct View {
    pub dims: Vec<(usize, usize)>,
    pub offset: usize,
}

impl View {
    /// A contiguous (row-major) tensor of this shape.
    pub fn contiguous(shape: &[usize]) -> View {
        let mut dims = vec![(0, 0); shape.len()];
        let mut stride = 1;
        for (i, &e) in shape.iter().enumerate().rev() {
            dims[i] = (e, stride);
            stride *= e;
        }
        View { dims, offset: 0 }
    }

    fn with_dims(&self, dims: Vec<(usize, usize)>) -> View {
        View {
            dims,
            offset: self.offset,
        }
    }

    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().map(|d| d.0).collect()
    }

    fn count(&self) -> usize {
        self.dims.iter().map(|d| d.0).product()
    }

    /// The view after `Transpose(perm)`; None when `perm` does not fit.
    pub fn transpose(&self, perm: &[usize]) -> Option<View> {
        if perm.len() != self.dims.len() {
            return None;
        }
        let dims = perm
            .iter()
            .map(|&p| self.dims.get(p).copied())
            .collect::<Option<_>>()?;
        Some(self.with_dims(dims))
    }

    /// Elements `[start, start + extent)` of dimension `axis` (Split, Slice with step 1).
    pub fn narrow(&self, axis: usize, start: usize, extent: usize) -> Option<View> {
        let &(e, s) = self.dims.get(axis)?;
        if start + extent > e {
            return None;
        }
        let mut dims = self.dims.clone();
        dims[axis].0 = extent;
        Some(View {
            dims,
            offset: self.offset + start * s,
        })
    }

    /// Element `index` of dimension `axis`, the dimension dropped (Gather of a scalar index).
    pub fn select(&self, axis: usize, index: usize) -> Option<View> {
        let mut v = self.narrow(axis, index, 1)?;
        v.dims.remove(axis);
        Some(v)
    }

    /// `Some((c0, c1))` when the view reads columns `[c0, c1)` (fewer than `n`) of every row
    /// of its source taken as `[rows, n]`, rows in order.
    pub fn column_block(&self, rows: usize, n: usize) -> Option<(usize, usize)> {
        let width = self.count() / rows.max(1);
        let (c0, c1) = (self.offset, self.offset + width);
        let want = if rows == 1 {
            vec![(width, 1)]
        } else {
            vec![(rows, n), (width, 1)]
        };
        (width > 0 && width < n && c1 <= n && self.count() == rows * width && self.canonical() == want)
            .then_some((c0, c1))
    }

    /// The view after a reshape to `shape` (same element count), or None when the result is
    /// not a strided view of the source (merged dimensions that are not contiguous together).
    pub fn reshape(&self, shape: &[usize]) -> Option<View> {
        let count = self.count();
        if count == 0 || shape.iter().product::<usize>() != count {
            return None;
        }
        // Dimensions of extent 1 carry no layout: drop them, put them back with stride 0.
        let old: Vec<(usize, usize)> = self.dims.iter().copied().filter(|d| d.0 != 1).collect();
        let new: Vec<usize> = shape.iter().copied().filter(|&e| e != 1).collect();
        let mut strides = vec![0usize; new.len()];
        let (mut oi, mut ni) = (0, 0);
        while oi < old.len() && ni < new.len() {
            // The smallest groups old[oi..oj] and new[ni..nj] with equal element counts.
            let (mut oj, mut nj) = (oi + 1, ni + 1);
            let (mut op, mut np) = (old[oi].0, new[ni]);
            while op != np {
                if np < op {
                    np *= *new.get(nj)?;
                    nj += 1;
                } else {
                    op *= old.get(oj)?.0;
                    oj += 1;
                }
            }
            if (oi..oj - 1).any(|k| old[k].1 != old[k + 1].0 * old[k + 1].1) {
                return None;
            }
            strides[nj - 1] = old[oj - 1].1;
            for k in (ni..nj - 1).rev() {
                strides[k] = strides[k + 1] * new[k + 1];
            }
            (oi, ni) = (oj, nj);
        }
        let mut it = strides.into_iter();
        let dims = shape
            .iter()
            .map(|&e| {
                if e == 1 {
                    Some((1, 0))
                } else {
                    it.next().map(|s| (e, s))
                }
            })
            .collect::<Option<Vec<_>>>()?;
        Some(self.with_dims(dims))
    }

    /// The dimensions with extent-1 ones dropped and neighbours that walk the source as one
    /// dimension merged: two views with the same canonical form read the same elements in
    /// the same order.
    fn canonical(&self) -> Vec<(usize, usize)> {
        let mut out: Vec<(usize, usize)> = vec![];
        for &(e, s) in self.dims.iter().filter(|d| d.0 != 1) {
            match out.last_mut() {
                Some(last) if last.1 == e * s => *last = (last.0 * e, s),
                _ => out.push((e, s)),
            }
        }
        out
    }

    /// Reads the same elements in the same order as `other`.
    pub fn same_order(&self, other: &View) -> bool {
        self.offset == other.offset && self.canonical() == other.canonical()
    }

    /// Reads its source in order from the first element (a plain reshape of it).
    pub fn is_contiguous(&self) -> bool {
        self.same_order(&View::contiguous(&self.shape()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[B, S, H·D]` split into heads `[B, H, S, D]`.
    fn head_split(b: usize, s: usize, h: usize, d: usize) -> View {
        View::contiguous(&[b, s, h * d])
            .reshape(&[b, s, h, d])
            .unwrap()
            .transpose(&[0, 2, 1, 3])
            .unwrap()
    }

    #[test]
    fn head_split_is_a_view_with_strided_heads() {
        let v = head_split(2, 5, 3, 4);
        assert_eq!(v.dims, vec![(2, 60), (3, 4), (5, 12), (4, 1)]);
        assert!(!v.is_contiguous());
    }

    #[test]
    fn merging_batch_and_heads_of_a_head_split_needs_batch_one() {
        // Heads lie inside a sequence row in memory: B·H merge only when B is 1 (dropped),
        // H·S never.
        assert!(head_split(2, 5, 3, 4).reshape(&[6, 5, 4]).is_none());
        assert!(head_split(1, 5, 3, 4).reshape(&[3, 5, 4]).is_some());
        assert!(head_split(2, 5, 3, 4).reshape(&[2, 15, 4]).is_none());
    }

    #[test]
    fn key_transpose_through_a_3d_round_trip_matches_the_direct_transpose() {
        // GPT-2's dynamo export: [B,H,S,D] -> [B·H,S,D] -> Transpose(0,2,1) -> [B,H,D,S].
        let v = head_split(1, 16, 4, 16);
        let round = v
            .reshape(&[4, 16, 16])
            .and_then(|x| x.transpose(&[0, 2, 1]))
            .and_then(|x| x.reshape(&[1, 4, 16, 16]))
            .unwrap();
        assert!(round.same_order(&v.transpose(&[0, 1, 3, 2]).unwrap()));
    }

    #[test]
    fn extent_one_dims_are_layout_free() {
        let v = View::contiguous(&[16, 1, 64]).reshape(&[1, 16, 64]).unwrap();
        assert!(v.is_contiguous());
        assert!(v.same_order(&View::contiguous(&[1024])));
        assert!(View::contiguous(&[4, 8])
            .transpose(&[1, 0])
            .unwrap()
            .reshape(&[32])
            .is_none());
        assert!(View::contiguous(&[4, 8]).reshape(&[5, 6]).is_none());
    }

    #[test]
    fn packed_projection_slices_are_column_blocks() {
        // GPT-2: [1, 16, 192] split in three along the last axis.
        let y = View::contiguous(&[1, 16, 192]);
        let k = y.narrow(2, 64, 64).unwrap();
        assert_eq!(k.column_block(16, 192), Some((64, 128)));
        // torch.nn.MultiheadAttention: [S, 1, 3·D] -> [S, 1, 3, D] -> [1, S, 1, 3, D] ->
        // Transpose(3, 1, 2, 0, 4) -> Squeeze -> [3, S, 1, D] -> Gather(axis 0, index 2).
        let v = View::contiguous(&[8, 1, 12])
            .reshape(&[8, 1, 3, 4])
            .and_then(|x| x.reshape(&[1, 8, 1, 3, 4]))
            .and_then(|x| x.transpose(&[3, 1, 2, 0, 4]))
            .and_then(|x| x.reshape(&[3, 8, 1, 4]))
            .and_then(|x| x.select(0, 2))
            .unwrap();
        assert_eq!(v.column_block(8, 12), Some((8, 12)));
        // Whole rows, or a block read out of row order, are not.
        assert_eq!(y.column_block(16, 192), None);
        let swapped = View::contiguous(&[4, 6])
            .narrow(1, 0, 3)
            .unwrap()
            .transpose(&[1, 0])
            .unwrap();
        assert_eq!(swapped.column_block(4, 6), None);
        assert_eq!(
            View::contiguous(&[1, 6])
                .narrow(1, 2, 2)
                .unwrap()
                .column_block(1, 6),
            Some((2, 4))
        );
    }
}
