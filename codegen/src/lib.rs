//! kiln-codegen: lowers a typed graph to kernels, plans memory, emits LLVM IR with inkwell,
//! links the micro-kernel and runtime bitcode, and writes artifacts (object, executable,
//! static library + C header, LLVM IR, assembly).

pub mod error;
pub mod gen;
pub mod llvm;
pub mod node;
pub mod target;
pub mod uk;

pub use error::CodegenError;
pub use target::TargetDesc;
