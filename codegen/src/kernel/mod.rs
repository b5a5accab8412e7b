//! The kernel vocabulary: the terms the planner (`plan`), the CPU emitter (`gen`) and the NVPTX
//! emitter (`nvptx`) share to describe a kernel — where its tensors live ([`Storage`]), what
//! the planner asks of every generated kernel ([`KernelCommon`]: its description, the
//! constants it reads packed, the inputs it reads), the scratch it needs, the shape of the
//! problem a product kernel solves ([`geometry`]) and what it does to the product's result
//! ([`epilogue`]). It depends on none of them, so each can use it without importing the others.

pub mod epilogue;
pub mod geometry;

/// Where a value's bytes are at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Storage {
    /// The caller's buffer for graph input `i`.
    Input(usize),
    /// The caller's buffer for graph output `i`.
    Output(usize),
    /// An offset in the context's arena.
    Arena(u64),
    /// An offset in the read-only weights blob.
    Weights(u64),
}

/// A constant the kernel wants in its own layout (packed weights), computed at compile time.
#[derive(Clone, Debug, PartialEq)]
pub struct PackedConst {
    pub bytes: Vec<u8>,
}

impl PackedConst {
    /// Frees the bytes of `packed` once the planner has stored them, keeping the entries
    /// (their count gives the kernel's argument slots): a kernel holding its copy would keep
    /// every model weight in memory twice while the rest of the model is planned.
    pub fn release_all(packed: &mut [PackedConst]) {
        for p in packed {
            p.bytes = Vec::new();
        }
    }

    /// f32 values as the little-endian bytes the kernels read.
    pub fn from_f32s(v: &[f32]) -> PackedConst {
        PackedConst {
            bytes: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }
}

/// Scratch memory a kernel needs while it runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scratch {
    /// One buffer for the whole kernel, from the arena (args' last entry).
    pub shared_bytes: u64,
    /// A buffer per worker thread (`kiln_rt_thread_scratch`).
    pub per_thread_bytes: u64,
}

/// What the planner asks of every generated kernel, CPU (`gen::GeneratedKernel`) or GPU
/// (`nvptx::GpuKernel`): a description for reports, the constants to store in its own layout,
/// and which inputs it reads at run time.
pub trait KernelCommon {
    /// A short description for reports, e.g. `gemm 6x16 avx2 M=64 N=3136 K=576`.
    fn describe(&self) -> String;

    /// Constants in the layout the kernel reads (packed weights), passed after the outputs.
    fn packed_constants(&self) -> &[PackedConst] {
        &[]
    }

    /// Frees the packed constants' bytes: the planner calls it once it has stored them
    /// (`PackedConst::release_all`).
    fn release_packed_constants(&mut self) {}

    /// Whether the kernel reads input `i` at run time (false for a weight it only reads packed,
    /// so the original need not be stored in the artifact).
    fn reads_input(&self, i: usize) -> bool {
        let _ = i;
        true
    }
}
