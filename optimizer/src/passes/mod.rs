//! One file per pass.

pub mod fold_batchnorm;
pub mod channels_last;
