//! One file per pass.

pub mod channels_last;
pub mod fold_batchnorm;
