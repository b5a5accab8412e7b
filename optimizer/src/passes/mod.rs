//! One file per pass.

pub mod freeze;
