//! One file per pass.

pub mod bf16_autocast;
pub mod fold_batchnorm;
