//! The matrix product behind Conv and ConvTranspose: `C += A · B` on row-major f32/f64 slices.
//!
//! A packed, cache-blocked product (the classic panel/micro-kernel structure): `B` is packed
//! into `NR`-wide column panels and `A` into `MR`-tall row panels so that the micro-kernel
//! streams both contiguously and keeps an `MR × NR` tile of `C` in registers. On x86-64 with
//! AVX the f32 micro-kernel is written with intrinsics, so it is fast at every optimization
//! level (the test profile included), not only where the compiler happens to unroll and
//! vectorize a generic loop. Each element of `C` is accumulated over `k` in order with separate
//! multiply and add (no FMA), so the AVX and the portable kernel give bit-identical results.

use std::ops::{Add, Mul};

/// The element types the conv kernels compute in (f16/bf16 are widened to f32 first).
pub(crate) trait Float:
    Copy + Default + PartialOrd + Add<Output = Self> + Mul<Output = Self> + Send + Sync + 'static
{
    fn zero() -> Self {
        Self::default()
    }

    /// One `MR × NR` tile of `A_panel · B_panel` over depth `kc` (`a`: `kc × MR`, `b`:
    /// `kc × NR`, both packed).
    fn micro_kernel(kc: usize, a: &[Self], b: &[Self]) -> Tile<Self> {
        portable_kernel(kc, a, b)
    }
}

impl Float for f32 {
    fn micro_kernel(kc: usize, a: &[f32], b: &[f32]) -> Tile<f32> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx") {
            // SAFETY: the CPU supports AVX, checked just above.
            return unsafe { avx::kernel(kc, a, b) };
        }
        portable_kernel(kc, a, b)
    }
}

impl Float for f64 {}

/// Rows of `C` per micro-kernel tile.
const MR: usize = 6;
/// Columns of `C` per micro-kernel tile (two 8-lane f32 vectors).
const NR: usize = 16;
/// Depth of one packed block (rows of `B`).
const KC: usize = 256;
/// Columns of one packed block of `B`.
const NC: usize = 512;
/// Rows of one packed block of `A` (a multiple of `MR`).
const MC: usize = 96;

/// A register tile of `C`.
pub(crate) type Tile<F> = [[F; NR]; MR];

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
                        let tile = F::micro_kernel(kc, ap, bp);
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

/// The portable micro-kernel.
fn portable_kernel<F: Float>(kc: usize, a: &[F], b: &[F]) -> Tile<F> {
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

#[cfg(target_arch = "x86_64")]
mod avx {
    use super::{Tile, MR, NR};
    use std::arch::x86_64::*;

    /// The f32 micro-kernel: twelve 8-lane accumulators (6 rows × 2 vectors).
    ///
    /// # Safety
    /// The CPU must support AVX.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn kernel(kc: usize, a: &[f32], b: &[f32]) -> Tile<f32> {
        assert!(
            a.len() >= kc * MR && b.len() >= kc * NR,
            "packed panels too short"
        );
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        for p in 0..kc {
            // SAFETY: p < kc, so the reads stay inside the lengths asserted above.
            let (b0, b1, ap) = unsafe {
                (
                    _mm256_loadu_ps(pb.add(p * NR)),
                    _mm256_loadu_ps(pb.add(p * NR + 8)),
                    pa.add(p * MR),
                )
            };
            for (r, row) in acc.iter_mut().enumerate() {
                // SAFETY: r < MR, inside the asserted length.
                let ar = _mm256_set1_ps(unsafe { *ap.add(r) });
                row[0] = _mm256_add_ps(row[0], _mm256_mul_ps(ar, b0));
                row[1] = _mm256_add_ps(row[1], _mm256_mul_ps(ar, b1));
            }
        }
        let mut tile = [[0.0f32; NR]; MR];
        for (out, row) in tile.iter_mut().zip(&acc) {
            // SAFETY: each output row holds NR = 16 floats, two 8-lane stores.
            unsafe {
                _mm256_storeu_ps(out.as_mut_ptr(), row[0]);
                _mm256_storeu_ps(out.as_mut_ptr().add(8), row[1]);
            }
        }
        tile
    }
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

    #[test]
    fn f32_kernels_agree_bitwise() {
        let kc = 37;
        let a: Vec<f32> = (0..kc * MR).map(|i| ((i * 31 % 17) as f32).sin()).collect();
        let b: Vec<f32> = (0..kc * NR).map(|i| ((i * 7 % 23) as f32).cos()).collect();
        assert_eq!(f32::micro_kernel(kc, &a, &b), portable_kernel(kc, &a, &b));
    }

    #[test]
    fn f32_product_is_exact_on_small_integers() {
        let (m, n, k) = (40, 300, 70);
        let a: Vec<f64> = (0..m * k).map(|i| ((i * 7 % 13) as f64) - 6.0).collect();
        let b: Vec<f64> = (0..k * n).map(|i| (i * 5 % 11) as f64).collect();
        let (af, bf): (Vec<f32>, Vec<f32>) = (
            a.iter().map(|&v| v as f32).collect(),
            b.iter().map(|&v| v as f32).collect(),
        );
        let mut c = vec![0.0f32; m * n];
        let am = Mat {
            data: &af,
            rows: m,
            cols: k,
            ld: k,
        };
        let bm = Mat {
            data: &bf,
            rows: k,
            cols: n,
            ld: n,
        };
        gemm(am, bm, &mut c, n, 2);
        let expected: Vec<f32> = naive(m, n, k, &a, &b).into_iter().map(|v| v as f32).collect();
        assert_eq!(c, expected);
    }
}
