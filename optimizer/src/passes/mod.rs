//! One file per pass.

pub mod fold_batchnorm;
pub mod bf16_autocast;
