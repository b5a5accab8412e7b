//! The GPU kernel generators, one module per operator family. Which of them the planner asks
//! for an operator is codegen's generator table (`crate::generators`); a node none handles runs
//! as a library kernel on one block (`nvptx/device.rs`).

pub mod arg;
pub mod attention;
pub mod attention_general;
pub mod attention_mma;
pub mod batch_norm;
pub mod col2im;
pub mod copy;
pub mod cumulative;
pub mod deform_conv;
pub mod det;
pub mod dynamic_quantize;
pub mod einsum;
pub mod elementwise;
pub mod gather;
pub mod gemm;
pub mod index_map;
pub mod integer;
pub mod loss;
pub mod lrn;
pub mod matmul_f64;
pub mod nms;
pub mod pool;
pub mod recurrent;
pub mod resize;
pub mod roi_align;
pub mod rotary;
pub mod rows;
pub mod sample;
pub mod scalar;
pub mod select;
pub mod spectral;
pub mod topk;
pub mod unique;
pub mod unpool;
pub mod window_conv;
