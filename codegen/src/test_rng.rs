//! Deterministic test data for the kernel tests: a 64-bit LCG, so every run and machine sees
//! the same values and a failure reproduces from its seed.

pub(crate) struct TestRng(u64);

impl TestRng {
    pub(crate) fn new(seed: u64) -> TestRng {
        TestRng(seed)
    }

    /// Uniform in [-1, 1), on a grid of 2^-23.
    pub(crate) fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// `n` values in [-1, 1).
    pub(crate) fn vec(&mut self, n: usize) -> Vec<f32> {
        self.vec_scaled(n, 1.0)
    }

    /// `n` values in [-scale, scale).
    pub(crate) fn vec_scaled(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}
