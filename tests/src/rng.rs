//! Deterministic test data: values in [-1, 1) from xorshift64*, the same for a seed on every
//! machine, for tests that build their graphs and inputs in Rust.

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 >> 12;
                self.0 ^= self.0 << 25;
                self.0 ^= self.0 >> 27;
                let r = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
                r as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }
}
