//! The matrix product behind Conv and ConvTranspose: `C += A · B` on row-major f32/f64 slices.
//!
//! A packed, cache-blocked product (the classic panel/micro-kernel structure): `B` is packed
//! into `NR`-wide column panels and `A` into `MR`-tall row panels so that the micro-kernel
//! streams both contiguously and keeps an `MR × NR` tile of `C` in registers. Each element of
//! `C` is accumulated over `k` in order, so the result does not depend on the vector width the
//! compiler picked; on x86-64 the same code is compiled a second time with AVX2 enabled and
//! chosen at run time (no FMA contraction, so both builds give bit-identical results).

use std::ops::{Add, Mul};

/// The element types the conv kernels compute in (f16/bf16 are widened to f32 first).
pub(crate) trait Float:
    Copy + Default + PartialOrd + Add<Output = Self> + Mul<Output = Self> + Send + Sync + 'static
{
    fn zero() -> Self {
        Self::default()
    }
}

impl Float for f32 {}
impl Float for f64 {}

/// Rows of `C` per micro-kernel tile.
const MR: usize = 4;
/// Columns of `C` per micro-kernel tile.
const NR: usize = 16;
/// Depth of one packed block (rows of `B`).
const KC: usize = 256;
/// Columns of one packed block of `B`.
const NC: usize = 512;
/// Rows of one packed block of `A`.
const MC: usize = 64;

/// A row-major matrix view: `rows × cols` elements, row `r` starting at `r * ld`.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a, F> {
    pub data: &'a [F],
    pub rows: usize,
    pub cols: usize,
    pub ld: usize,
}

/// `c[m × n] += a[m × k] · b[k × n]`; `c` is row-major with leading dimension `ldc`. Splits the
/// rows of `c` over `threads` threads when that pays.
pub(crate) fn gemm<F: Float>(a: Mat<F>, b: Mat<F>, c: &mut [F], ldc: usize, threads: usize) {
    let (m, n) = (a.rows, b.cols);
    debug_assert_eq!(a.cols, b.rows);
    if m == 0 || n == 0 {
        return;
    }
    let work = m * n * a.cols;
    let threads = if work < 1 << 20 {
        1
    } else {
        threads.clamp(1, m.div_ceil(MR))
    };
    if threads == 1 {
        gemm_serial(a, b, c, ldc);
        return;
    }
    // Row ranges in whole micro-tiles, so every thread runs full-height tiles but the last.
    let rows_per = m.div_ceil(MR).div_ceil(threads) * MR;
    std::thread::scope(|s| {
        let mut rest = &mut c[..];
        let mut row = 0;
        while row < m {
            let take = rows_per.min(m - row);
            let split = if row + take < m { take * ldc } else { rest.len() };
            let (mine, tail) = rest.split_at_mut(split);
            rest = tail;
            let a_part = Mat {
                data: &a.data[row * a.ld..],
                rows: take,
                ..a
            };
            s.spawn(move || gemm_serial(a_part, b, mine, ldc));
            row += take;
        }
    });
}

fn gemm_serial<F: Float>(a: Mat<F>, b: Mat<F>, c: &mut [F], ldc: usize) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        unsafe { gemm_avx2(a, b, c, ldc) };
        return;
    }
    gemm_blocked(a, b, c, ldc);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn gemm_avx2<F: Float>(a: Mat<F>, b: Mat<F>, c: &mut [F], ldc: usize) {
    gemm_blocked(a, b, c, ldc);
}

#[inline(always)]
fn gemm_blocked<F: Float>(a: Mat<F>, b: Mat<F>, c: &mut [F], ldc: usize) {
    let (m, n, k) = (a.rows, b.cols, a.cols);
    let mut pb = vec![F::zero(); KC * NC.min(n.next_multiple_of(NR))];
    let mut pa = vec![F::zero(); MC.min(m.next_multiple_of(MR)) * KC];
    for jc in (0..n).step_by(NC) {
        let nc = NC.min(n - jc);
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            pack_b(b, pc, kc, jc, nc, &mut pb);
            for ic in (0..m).step_by(MC) {
                let mc = MC.min(m - ic);
                pack_a(a, ic, mc, pc, kc, &mut pa);
                for jr in (0..nc).step_by(NR) {
                    let nr = NR.min(nc - jr);
                    let bp = &pb[jr * kc..(jr + NR) * kc];
                    for ir in (0..mc).step_by(MR) {
                        let mr = MR.min(mc - ir);
                        let ap = &pa[ir * kc..(ir + MR) * kc];
                        let tile = micro_kernel(kc, ap, bp);
                        for (r, row) in tile.iter().enumerate().take(mr) {
                            let off = (ic + ir + r) * ldc + jc + jr;
                            for (cv, &t) in c[off..off + nr].iter_mut().zip(row) {
                                *cv = *cv + t;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Packs `b[pc..pc+kc, jc..jc+nc]` into `NR`-wide panels, each `kc × NR` row-major,
/// zero-filling the columns past `nc`.
#[inline(always)]
fn pack_b<F: Float>(b: Mat<F>, pc: usize, kc: usize, jc: usize, nc: usize, out: &mut [F]) {
    for (panel, j0) in (0..nc).step_by(NR).enumerate() {
        let w = NR.min(nc - j0);
        let dst = &mut out[panel * NR * kc..(panel + 1) * NR * kc];
        for (p, drow) in dst.chunks_exact_mut(NR).enumerate() {
            let src = (pc + p) * b.ld + jc + j0;
            drow[..w].copy_from_slice(&b.data[src..src + w]);
            drow[w..].fill(F::zero());
        }
    }
}

/// Packs `a[ic..ic+mc, pc..pc+kc]` into `MR`-tall panels, each stored column by column
/// (`kc × MR`), zero-filling the rows past `mc`.
#[inline(always)]
fn pack_a<F: Float>(a: Mat<F>, ic: usize, mc: usize, pc: usize, kc: usize, out: &mut [F]) {
    for (panel, i0) in (0..mc).step_by(MR).enumerate() {
        let h = MR.min(mc - i0);
        let dst = &mut out[panel * MR * kc..(panel + 1) * MR * kc];
        for r in 0..MR {
            if r < h {
                let src = &a.data[(ic + i0 + r) * a.ld + pc..][..kc];
                for (p, &v) in src.iter().enumerate() {
                    dst[p * MR + r] = v;
                }
            } else {
                for p in 0..kc {
                    dst[p * MR + r] = F::zero();
                }
            }
        }
    }
}

/// One `MR × NR` tile of `A_panel · B_panel` over depth `kc`, accumulated in registers.
#[inline(always)]
fn micro_kernel<F: Float>(kc: usize, a: &[F], b: &[F]) -> [[F; NR]; MR] {
    let mut acc = [[F::zero(); NR]; MR];
    for (av, bv) in a.chunks_exact(MR).zip(b.chunks_exact(NR)).take(kc) {
        for (row, &ar) in acc.iter_mut().zip(av) {
            for (t, &bj) in row.iter_mut().zip(bv) {
                *t = *t + ar * bj;
            }
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(m: usize, n: usize, k: usize, a: &[f64], b: &[f64]) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                for p in 0..k {
                    c[i * n + j] += a[i * k + p] * b[p * n + j];
                }
            }
        }
        c
    }

    #[test]
    fn matches_naive_on_ragged_shapes() {
        for &(m, n, k) in &[(1, 1, 1), (3, 17, 5), (5, 33, 300), (70, 600, 7), (9, 1, 260)] {
            let a: Vec<f64> = (0..m * k).map(|i| ((i * 7 % 13) as f64) - 6.0).collect();
            let b: Vec<f64> = (0..k * n).map(|i| ((i * 5 % 11) as f64) * 0.5).collect();
            let mut c = vec![0.0; m * n];
            let am = Mat {
                data: &a,
                rows: m,
                cols: k,
                ld: k,
            };
            let bm = Mat {
                data: &b,
                rows: k,
                cols: n,
                ld: n,
            };
            gemm(am, bm, &mut c, n, 2);
            assert_eq!(c, naive(m, n, k, &a, &b), "m={m} n={n} k={k}");
        }
    }
}
