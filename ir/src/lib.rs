//! kiln's intermediate representation.
//!
//! A [`Graph`] is an arena of [`Node`]s in topological order; each node applies one [`Op`] to
//! values of earlier nodes and has typed outputs ([`TensorType`]: [`DType`], shape of [`Dim`]s,
//! [`Layout`]). Types are inferred when a node is added. [`eval`] is the reference interpreter.
//! This crate knows nothing of ONNX or LLVM.

pub mod budget;
pub mod cost;
mod dtype;
mod error;
pub mod eval;
mod graph;
pub mod op;
mod op_table;
pub mod ops;
mod print;
mod printable;
pub mod rewrite;
pub mod tensor;
mod types;
mod verify;

pub use dtype::DType;
pub use error::{IrError, OpError, OverBudget};
pub use graph::{
    ConstId, Graph, GraphOutput, Node, NodeId, NodeOutput, ValueId, KNOWN_VALUE_MAX_ELEMENTS, MAX_VALUE_BYTES,
};
pub use op::*;
pub use op_table::{
    onnx_operator, Autocast, LayoutRole, Motion, OnnxOperator, OpFamily, OpInfo, ALL_INPUTS, ONNX_OPERATORS,
};
pub use print::op_label;
pub use printable::{escape_controls, printable};
pub use tensor::{Element, Tensor, TensorData};
pub use types::{Dim, Layout, TensorType};
pub use verify::verify;
