//! One file per pass.

pub mod bf16_autocast;
pub mod block_quantized_products;
pub mod channels_last;
pub mod dequantize_weights;
pub mod fake_quantize;
pub mod freeze;
pub mod fuse;
pub mod integer_products;
pub mod lower_control_flow;
pub mod lower_einsum;
