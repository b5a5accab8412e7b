//! Seeded random inputs: the same seed gives the same tensors on every machine and every
//! kiln version (the generator is SplitMix64, written out here, not a library's).

use kiln_ir::tensor::TensorData;
use kiln_ir::{DType, Tensor, TensorType};

/// SplitMix64 (Steele, Lea, Flood 2014): small, fast, and well mixed for test data.
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Integer inputs are drawn from `0..INT_VALUES`: valid token ids, mask values and indices into
/// any axis of at least this size. Inputs that need other values (divisors, shapes, indices into
/// smaller axes) must be given with `--input`.
pub const INT_VALUES: u64 = 4;

/// A random tensor of type `ty` (static shape): floats uniform in [-1, 1], integers uniform in
/// `0..INT_VALUES`, booleans true or false with equal probability. `rng` is shared by the
/// inputs in graph order, so input `i`'s values depend on the seed and the inputs before it.
pub fn tensor(ty: &TensorType, rng: &mut SplitMix64) -> Option<Tensor> {
    let shape = ty.fixed_shape()?;
    let n: usize = shape.iter().product();
    let vals: Vec<f64> = (0..n)
        .map(|_| match ty.dtype {
            d if d.is_float() => 2.0 * rng.next_f64() - 1.0,
            DType::Bool => (rng.next_u64() >> 63) as f64,
            _ => (rng.next_u64() % INT_VALUES) as f64,
        })
        .collect();
    Tensor::new(shape, TensorData::from_f64s(ty.dtype, vals)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_in_range() {
        let ty = TensorType::fixed(DType::F32, &[3, 5]);
        let a = tensor(&ty, &mut SplitMix64::new(7)).unwrap();
        let b = tensor(&ty, &mut SplitMix64::new(7)).unwrap();
        let c = tensor(&ty, &mut SplitMix64::new(8)).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.to_f64_vec().iter().all(|x| (-1.0..=1.0).contains(x)));
        let i = tensor(&TensorType::fixed(DType::I64, &[100]), &mut SplitMix64::new(1)).unwrap();
        let v = i.to_i64_vec();
        assert!(v.iter().all(|x| (0..INT_VALUES as i64).contains(x)));
        assert!(v.contains(&0) && v.contains(&3));
    }

    #[test]
    fn splitmix_reference_values() {
        // The first outputs for seed 1234567 from the reference implementation.
        let mut r = SplitMix64::new(1234567);
        assert_eq!(r.next_u64(), 6457827717110365317);
        assert_eq!(r.next_u64(), 3203168211198807973);
    }
}
