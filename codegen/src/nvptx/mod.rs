//! The CUDA target (`kiln compile --target cuda`): the plan's kernels become PTX entries,
//! compiled by LLVM's NVPTX backend, and the host artifact carries that PTX, the launch table and
//! the runtime that loads the CUDA driver at run time (`runtime-stub/c/cuda.c`).
//!
//! Every entry takes one parameter, the device address of a `kiln_gpu_frame` (kiln_cuda.h): the
//! arena, the weights, the error slot and the graph's input and output buffers. A kernel finds
//! its tensors at offsets from those bases that are constants in the PTX, so nothing about a
//! launch but the frame's contents changes between runs.

mod device;
#[cfg(any(test, feature = "cuda-emulation"))]
pub mod emulate;
pub mod kernel;
pub(crate) mod kernels;
mod libdevice;

pub(crate) use kernel::frame;
pub use kernel::{GpuBuilder, GpuKernel, LaunchDims, MmaKind, Mode, Sreg, EINDEX, EVALUE};

use crate::error::{CodegenError, Result};
use crate::kernel::Storage;

/// Compute capabilities kiln generates PTX for (`--sm`).
pub const SUPPORTED_SM: &[u32] = &[70, 75, 80, 86, 89, 90];

/// The default `--sm`: Ampere, the oldest architecture with bf16 tensor cores.
pub const DEFAULT_SM: u32 = 80;

/// Checks an `--sm` value.
pub fn check_sm(sm: u32) -> Result<u32> {
    if SUPPORTED_SM.contains(&sm) {
        Ok(sm)
    } else {
        let known: Vec<String> = SUPPORTED_SM.iter().map(|s| s.to_string()).collect();
        Err(CodegenError::Target(format!(
            "--sm {sm}: not a compute capability kiln targets (known: {})",
            known.join(", ")
        )))
    }
}

/// How one kernel is launched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// The PTX entry's name.
    pub entry: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Dynamic shared memory per block, in bytes.
    pub shared_bytes: u32,
}

/// The device half of a CUDA model.
#[derive(Clone, Debug)]
pub struct DeviceCode {
    pub ptx: String,
    pub sm: u32,
    /// One per plan kernel, in run order.
    pub launches: Vec<Launch>,
    /// Whether CUDA's libdevice was linked (for math functions of library kernels).
    pub uses_libdevice: bool,
}

pub use device::build as build_device_code;
pub(crate) use device::library_threads;

/// `enum kiln_cuda_storage` and the (index, offset) pair of a value's storage.
pub(crate) fn storage_code(s: Storage) -> (u64, u64, u64) {
    match s {
        Storage::Input(i) => (0, i as u64, 0),
        Storage::Output(i) => (1, i as u64, 0),
        Storage::Arena(off) => (2, 0, off),
        Storage::Weights(off) => (3, 0, off),
    }
}
