//! Kernels generated for the GPU: the interface a generator implements ([`GpuKernel`]) and what
//! it emits with ([`GpuBuilder`]).
//!
//! A generated kernel is the body of a PTX entry `void kiln_k{i}(ptr frame)`; the builder hands
//! it the addresses of its tensors (already resolved from the frame), the thread and block
//! indices, block barriers and the block's dynamic shared memory.
//!
//! The same body can be emitted for the host CPU ([`Mode::Emulated`]): the special registers,
//! the barrier and the shared-memory base then become calls to `kiln_gpu_sreg`,
//! `kiln_gpu_barrier` and `kiln_gpu_shared`, which a test harness implements by running each
//! block's threads on CPU threads. That is how the kernels' index arithmetic, tiling and
//! synchronization are tested on machines without a GPU.

use crate::error::{CodegenError, Result};
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::target::TargetDesc;
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::types::BasicMetadataTypeEnum;
use inkwell::values::{
    BasicMetadataValueEnum, BasicValueEnum, FloatValue, FunctionValue, IntValue, PointerValue,
};
use inkwell::AddressSpace;

/// kiln_cuda.h's `KILN_CUDA_EINDEX`: an index read from an input is out of range
/// ([`GpuBuilder::report_error`]).
pub const EINDEX: u32 = 1;
/// kiln_cuda.h's `KILN_CUDA_EVALUE`: a value read from an input is invalid for the operator.
pub const EVALUE: u32 = 2;

/// Grid, block and dynamic shared memory of a kernel's launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchDims {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
}

impl LaunchDims {
    /// A 1-D grid of `threads`-thread blocks, a thread per item: at least one block and at most
    /// 2^20 (beyond that the kernel's grid-stride loop, `GpuBuilder::grid_stride_loop`, covers
    /// the rest).
    pub fn per_item(items: u64, threads: u64) -> LaunchDims {
        let blocks = items.div_ceil(threads).clamp(1, 1 << 20);
        LaunchDims {
            grid: [blocks as u32, 1, 1],
            block: [threads as u32, 1, 1],
            shared_bytes: 0,
        }
    }
}

/// A GPU kernel: what the planner asks of every generated kernel ([`KernelCommon`]: its
/// description, e.g. `gpu gemm 64x64x16 M=.. N=.. K=..`, its packed constants, the inputs it
/// reads), and how it is launched.
pub trait GpuKernel: KernelCommon {
    /// How the kernel is launched.
    fn launch(&self) -> LaunchDims;

    /// Bytes of scratch in the arena for the whole launch (`GpuBuilder::scratch`).
    fn scratch_bytes(&self) -> u64 {
        0
    }

    /// Emits the body. The builder is positioned in the entry block; every path must end
    /// with `ret void`.
    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()>;

    /// Whether the kernel rounds input `i` to bf16 (to nearest even, as `Cast<bf16>`) as it
    /// reads it, so it may read the f32 value behind the autocast's `Cast<f32>(Cast<bf16>(x))`
    /// instead of the pair's result (`bf16_rounding`).
    fn rounds_input_to_bf16(&self, i: usize) -> bool {
        let _ = i;
        false
    }
}

/// Where the body will run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// PTX for the device.
    Device,
    /// The host CPU, under a test harness that emulates the grid.
    Emulated,
}

/// The multiplicand type of a tensor-core `mma` (m16n8k16, f32 accumulators).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmaKind {
    Bf16,
    F16,
    /// f32 operands read as TF32 (`--precision tf32`), `mma` m16n8k8: one value per 32-bit
    /// register, rounded to TF32 by the kernel ([`tf32_round`]).
    Tf32,
}

impl MmaKind {
    /// As kernel descriptions spell it (`mma.bf16`, `mma.f16`).
    pub fn name(self) -> &'static str {
        match self {
            MmaKind::Bf16 => "bf16",
            MmaKind::F16 => "f16",
            MmaKind::Tf32 => "tf32",
        }
    }

    /// The instruction's K: 16 for the 16-bit kinds, 8 for TF32.
    pub fn k(self) -> usize {
        match self {
            MmaKind::Tf32 => 8,
            _ => 16,
        }
    }

    fn intrinsic(self) -> &'static str {
        match self {
            MmaKind::Bf16 => "llvm.nvvm.mma.m16n8k16.row.col.bf16",
            // f16 multiplicands, f32 D and C.
            MmaKind::F16 => "llvm.nvvm.mma.m16n8k16.row.col.f32.f32",
            MmaKind::Tf32 => "llvm.nvvm.mma.m16n8k8.row.col.tf32",
        }
    }

    /// The function emulation answers the instruction with.
    pub(crate) fn emulator(self) -> &'static str {
        match self {
            MmaKind::Bf16 => "kiln_gpu_mma_bf16",
            MmaKind::F16 => "kiln_gpu_mma_f16",
            MmaKind::Tf32 => "kiln_gpu_mma_tf32",
        }
    }
}

/// A special register: thread index in the block, block index in the grid, block and grid size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sreg {
    TidX,
    TidY,
    TidZ,
    CtaidX,
    CtaidY,
    CtaidZ,
    NtidX,
    NtidY,
    NtidZ,
    NctaidX,
    NctaidY,
    NctaidZ,
}

impl Sreg {
    const ALL: [Sreg; 12] = [
        Sreg::TidX,
        Sreg::TidY,
        Sreg::TidZ,
        Sreg::CtaidX,
        Sreg::CtaidY,
        Sreg::CtaidZ,
        Sreg::NtidX,
        Sreg::NtidY,
        Sreg::NtidZ,
        Sreg::NctaidX,
        Sreg::NctaidY,
        Sreg::NctaidZ,
    ];

    /// The code `kiln_gpu_sreg` receives in emulation (its index in this order).
    pub fn code(self) -> u32 {
        Sreg::ALL.iter().position(|s| *s == self).expect("listed") as u32
    }

    fn intrinsic(self) -> &'static str {
        match self {
            Sreg::TidX => "llvm.nvvm.read.ptx.sreg.tid.x",
            Sreg::TidY => "llvm.nvvm.read.ptx.sreg.tid.y",
            Sreg::TidZ => "llvm.nvvm.read.ptx.sreg.tid.z",
            Sreg::CtaidX => "llvm.nvvm.read.ptx.sreg.ctaid.x",
            Sreg::CtaidY => "llvm.nvvm.read.ptx.sreg.ctaid.y",
            Sreg::CtaidZ => "llvm.nvvm.read.ptx.sreg.ctaid.z",
            Sreg::NtidX => "llvm.nvvm.read.ptx.sreg.ntid.x",
            Sreg::NtidY => "llvm.nvvm.read.ptx.sreg.ntid.y",
            Sreg::NtidZ => "llvm.nvvm.read.ptx.sreg.ntid.z",
            Sreg::NctaidX => "llvm.nvvm.read.ptx.sreg.nctaid.x",
            Sreg::NctaidY => "llvm.nvvm.read.ptx.sreg.nctaid.y",
            Sreg::NctaidZ => "llvm.nvvm.read.ptx.sreg.nctaid.z",
        }
    }
}

/// The shared-memory array every kernel's dynamic shared memory starts at.
pub const SHARED_SYMBOL: &str = "kiln_smem";

/// What a generator needs to emit one GPU kernel body.
pub struct GpuBuilder<'a, 'ctx> {
    pub cx: &'ctx Context,
    pub module: &'a Module<'ctx>,
    pub builder: &'a Builder<'ctx>,
    pub function: FunctionValue<'ctx>,
    pub target: &'a TargetDesc,
    pub node: &'a NodeInfo<'a>,
    pub mode: Mode,
    /// The kernel's tensors: inputs, outputs, packed constants, scratch (None: absent).
    pub slots: Vec<Option<PointerValue<'ctx>>>,
    pub n_inputs: usize,
    pub n_outputs: usize,
    pub n_packed: usize,
    /// The kernel's position in the run (the `K` of its entry `kiln_kK`), for error reports.
    pub kernel_index: usize,
}

impl<'a, 'ctx> GpuBuilder<'a, 'ctx> {
    pub fn ptr_type(&self) -> inkwell::types::PointerType<'ctx> {
        self.cx.ptr_type(AddressSpace::default())
    }

    fn slot(&self, i: usize, what: &str) -> Result<PointerValue<'ctx>> {
        self.slots
            .get(i)
            .copied()
            .flatten()
            .ok_or_else(|| CodegenError::internal(format!("GPU kernel reads absent {what} (slot {i})")))
    }

    pub fn input(&self, i: usize) -> Result<PointerValue<'ctx>> {
        self.slot(i, "input")
    }

    pub fn output(&self, i: usize) -> Result<PointerValue<'ctx>> {
        self.slot(self.n_inputs + i, "output")
    }

    pub fn packed(&self, i: usize) -> Result<PointerValue<'ctx>> {
        self.slot(self.n_inputs + self.n_outputs + i, "packed constant")
    }

    /// The kernel's arena scratch (`GpuKernel::scratch_bytes`).
    pub fn scratch(&self) -> Result<PointerValue<'ctx>> {
        self.slot(self.n_inputs + self.n_outputs + self.n_packed, "scratch")
    }

    /// Reads a special register (i32).
    pub fn sreg(&self, r: Sreg) -> Result<IntValue<'ctx>> {
        let i32t = self.cx.i32_type();
        let v = match self.mode {
            Mode::Device => self.call(r.intrinsic(), i32t.fn_type(&[], false), &[])?,
            Mode::Emulated => self.call(
                "kiln_gpu_sreg",
                i32t.fn_type(&[i32t.into()], false),
                &[i32t.const_int(r.code() as u64, false).into()],
            )?,
        };
        Ok(v.into_int_value())
    }

    /// Calls `name` (declared as `ty` when new) and returns its result.
    fn call(
        &self,
        name: &str,
        ty: inkwell::types::FunctionType<'ctx>,
        args: &[BasicMetadataValueEnum<'ctx>],
    ) -> Result<BasicValueEnum<'ctx>> {
        let f = self.declare(name, ty);
        self.builder
            .build_call(f, args, "")
            .map_err(llvm)?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| CodegenError::internal(format!("{name} returns no value")))
    }

    /// A special register zero-extended to i64, for index arithmetic.
    pub fn sreg64(&self, r: Sreg) -> Result<IntValue<'ctx>> {
        let v = self.sreg(r)?;
        self.builder
            .build_int_z_extend(v, self.cx.i64_type(), "")
            .map_err(crate::gen::llvm)
    }

    /// `__threadfence()`: this thread's writes to global memory are seen by the whole GPU
    /// before its later ones, and its later reads see what other threads published before
    /// their fences (`membar.gl`). In emulation, a sequentially consistent fence.
    pub fn fence_device(&self) -> Result<()> {
        match self.mode {
            Mode::Device => {
                let f = self.declare("llvm.nvvm.membar.gl", self.cx.void_type().fn_type(&[], false));
                self.builder.build_call(f, &[], "").map_err(llvm)?;
            }
            Mode::Emulated => {
                self.builder
                    .build_fence(inkwell::AtomicOrdering::SequentiallyConsistent, false, "")
                    .map_err(llvm)?;
            }
        }
        Ok(())
    }

    /// `__syncthreads()`: every thread of the block waits here.
    pub fn barrier(&self) -> Result<()> {
        let void = self.cx.void_type().fn_type(&[], false);
        let f = match self.mode {
            Mode::Device => self.declare("llvm.nvvm.barrier0", void),
            Mode::Emulated => self.declare("kiln_gpu_barrier", void),
        };
        self.builder.build_call(f, &[], "").map_err(llvm)?;
        Ok(())
    }

    /// One warp-wide `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32` (sm_80
    /// and later): `d = a·b + c` for a 16×16 A, a 16×8 B (both of `kind`, two elements per
    /// 32-bit register, the lower-indexed one in the low half) and a 16×8 f32 C spread over the
    /// warp's 32 lanes in PTX's fragment layout (the PTX ISA's "Matrix Fragments for
    /// mma.m16n8k16"; `emulate.rs` spells it out). For [`MmaKind::Tf32`] it is
    /// `mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`: a 16×8 A and an 8×8 B, one TF32
    /// value per register. Every lane of the warp must call it together.
    /// In emulation it is a call to `kiln_gpu_mma_{bf16,f16,tf32}`, which meets the
    /// warp's other lanes and computes the product from their fragments.
    pub fn mma(
        &self,
        kind: MmaKind,
        a: [IntValue<'ctx>; 4],
        b: [IntValue<'ctx>; 2],
        c: [FloatValue<'ctx>; 4],
    ) -> Result<[FloatValue<'ctx>; 4]> {
        let (i32t, f32t) = (self.cx.i32_type(), self.cx.f32_type());
        match self.mode {
            Mode::Device => {
                let ret = self
                    .cx
                    .struct_type(&[f32t.into(), f32t.into(), f32t.into(), f32t.into()], false);
                // bf16 and tf32 fragments travel as i32 registers, f16 ones as <2 x half>.
                let pair_ty: inkwell::types::BasicTypeEnum<'ctx> = match kind {
                    MmaKind::Bf16 | MmaKind::Tf32 => i32t.into(),
                    MmaKind::F16 => self.cx.f16_type().vec_type(2).into(),
                };
                let params: Vec<BasicMetadataTypeEnum> =
                    [pair_ty.into(); 6].into_iter().chain([f32t.into(); 4]).collect();
                let mut args: Vec<BasicMetadataValueEnum> = vec![];
                for v in a.iter().chain(&b) {
                    let v = self.builder.build_bit_cast(*v, pair_ty, "").map_err(llvm)?;
                    args.push(v.into());
                }
                args.extend(c.iter().map(|v| BasicMetadataValueEnum::from(*v)));
                let d = self
                    .call(kind.intrinsic(), ret.fn_type(&params, false), &args)?
                    .into_struct_value();
                let mut out = [c[0]; 4];
                for (i, o) in out.iter_mut().enumerate() {
                    *o = self
                        .builder
                        .build_extract_value(d, i as u32, "")
                        .map_err(llvm)?
                        .into_float_value();
                }
                Ok(out)
            }
            Mode::Emulated => {
                // The ten registers in memory: a0..a3, b0, b1, c0..c3 (d comes back in c's place).
                let regs_ty = i32t.array_type(10);
                let e = crate::gen::emit::Emit::new(self.cx, self.module, self.builder, self.function);
                let regs = e.entry_alloca(regs_ty, "regs")?;
                let at = |i: u64| unsafe {
                    self.builder
                        .build_gep(regs_ty, regs, &[i32t.const_zero(), i32t.const_int(i, false)], "")
                        .map_err(llvm)
                };
                for (i, v) in a.iter().chain(&b).enumerate() {
                    self.builder.build_store(at(i as u64)?, *v).map_err(llvm)?;
                }
                for (i, v) in c.iter().enumerate() {
                    self.builder.build_store(at(6 + i as u64)?, *v).map_err(llvm)?;
                }
                let f = self.declare(
                    kind.emulator(),
                    self.cx.void_type().fn_type(&[self.ptr_type().into()], false),
                );
                self.builder.build_call(f, &[regs.into()], "").map_err(llvm)?;
                let mut out = [c[0]; 4];
                for (i, o) in out.iter_mut().enumerate() {
                    *o = self
                        .builder
                        .build_load(f32t, at(6 + i as u64)?, "d")
                        .map_err(llvm)?
                        .into_float_value();
                }
                Ok(out)
            }
        }
    }

    /// An f16 value (its 16 bits in an i16) widened to f32, exactly.
    pub fn f16_to_f32(&self, bits: IntValue<'ctx>) -> Result<FloatValue<'ctx>> {
        let f32t = self.cx.f32_type();
        match self.mode {
            Mode::Device => {
                let h = self
                    .builder
                    .build_bit_cast(bits, self.cx.f16_type(), "")
                    .map_err(llvm)?
                    .into_float_value();
                self.builder.build_float_ext(h, f32t, "").map_err(llvm)
            }
            Mode::Emulated => {
                // Through a helper: the host's lowering of `half` may call compiler-rt
                // routines the JIT does not resolve. i32 arguments avoid extension ABI questions.
                let i32t = self.cx.i32_type();
                let arg = self.builder.build_int_z_extend(bits, i32t, "").map_err(llvm)?;
                let ty = f32t.fn_type(&[i32t.into()], false);
                Ok(self
                    .call("kiln_gpu_f16_to_f32", ty, &[arg.into()])?
                    .into_float_value())
            }
        }
    }

    /// `v` rounded to the nearest f16 (ties to even, overflow to infinity), as its 16 bits.
    pub fn f32_to_f16(&self, v: FloatValue<'ctx>) -> Result<IntValue<'ctx>> {
        let i16t = self.cx.i16_type();
        match self.mode {
            Mode::Device => {
                let h = self
                    .builder
                    .build_float_trunc(v, self.cx.f16_type(), "")
                    .map_err(llvm)?;
                Ok(self
                    .builder
                    .build_bit_cast(h, i16t, "")
                    .map_err(llvm)?
                    .into_int_value())
            }
            Mode::Emulated => {
                let i32t = self.cx.i32_type();
                let ty = i32t.fn_type(&[self.cx.f32_type().into()], false);
                let r = self
                    .call("kiln_gpu_f32_to_f16", ty, &[v.into()])?
                    .into_int_value();
                self.builder.build_int_truncate(r, i16t, "").map_err(llvm)
            }
        }
    }

    /// The block's dynamic shared memory (`launch().shared_bytes` bytes, 16-byte aligned), as a
    /// generic pointer (LLVM infers the shared address space for the loads and stores).
    pub fn shared(&self) -> Result<PointerValue<'ctx>> {
        match self.mode {
            Mode::Device => {
                let g = match self.module.get_global(SHARED_SYMBOL) {
                    Some(g) => g,
                    None => {
                        let ty = self.cx.i8_type().array_type(0);
                        let g = self
                            .module
                            .add_global(ty, Some(AddressSpace::from(3u16)), SHARED_SYMBOL);
                        g.set_linkage(Linkage::External);
                        g.set_alignment(16);
                        g
                    }
                };
                self.builder
                    .build_address_space_cast(g.as_pointer_value(), self.ptr_type(), "smem")
                    .map_err(llvm)
            }
            Mode::Emulated => {
                let f = self.declare("kiln_gpu_shared", self.ptr_type().fn_type(&[], false));
                let v = self.builder.build_call(f, &[], "smem").map_err(llvm)?;
                Ok(v.try_as_basic_value()
                    .basic()
                    .ok_or_else(|| CodegenError::internal("kiln_gpu_shared returns a pointer"))?
                    .into_pointer_value())
            }
        }
    }

    /// Runs `body(i)` for every `i` in `0..total` on a 1-D grid of `threads`-thread blocks:
    /// thread `t` of block `b` starts at `b·threads + t` and strides by the grid's thread count,
    /// so consecutive threads take consecutive `i` and any grid size covers everything.
    pub fn grid_stride_loop(
        &self,
        total: u64,
        threads: u64,
        body: impl FnOnce(IntValue<'ctx>) -> Result<()>,
    ) -> Result<()> {
        let e = crate::gen::emit::Emit::new(self.cx, self.module, self.builder, self.function);
        let first = e.add(
            e.mulc(self.sreg64(Sreg::CtaidX)?, threads as i64)?,
            self.sreg64(Sreg::TidX)?,
        )?;
        let stride = e.mulc(self.sreg64(Sreg::NctaidX)?, threads as i64)?;
        let pre = e.b.get_insert_block().expect("positioned");
        let head = self.cx.append_basic_block(self.function, "elem");
        let exit = self.cx.append_basic_block(self.function, "done");
        let enter = e.icmp(inkwell::IntPredicate::ULT, first, e.i64c(total as i64))?;
        e.b.build_conditional_branch(enter, head, exit).map_err(llvm)?;
        e.b.position_at_end(head);
        let phi = e.b.build_phi(self.cx.i64_type(), "i").map_err(llvm)?;
        phi.add_incoming(&[(&first, pre)]);
        let i = phi.as_basic_value().into_int_value();
        body(i)?;
        let next = e.add(i, stride)?;
        let latch = e.b.get_insert_block().expect("positioned");
        phi.add_incoming(&[(&next, latch)]);
        let more = e.icmp(inkwell::IntPredicate::ULT, next, e.i64c(total as i64))?;
        e.b.build_conditional_branch(more, head, exit).map_err(llvm)?;
        e.b.position_at_end(exit);
        Ok(())
    }

    /// Records in the frame's error slot that this kernel failed with `code` (kiln_cuda.h's
    /// `KILN_CUDA_E*`), unless a failure is already recorded: `error[0]` goes from 0 to
    /// 1 + [`Self::kernel_index`] by compare-and-swap, so of many failing threads one reports,
    /// and that thread writes `error[1]`. The host reads the slot after the run.
    pub fn report_error(&self, code: u32) -> Result<()> {
        let (i32t, b) = (self.cx.i32_type(), self.builder);
        let frame = self
            .function
            .get_nth_param(0)
            .expect("frame")
            .into_pointer_value();
        let error = load_ptr(self.cx, b, frame, frame::ERROR)?;
        let swap = b
            .build_cmpxchg(
                error,
                i32t.const_zero(),
                i32t.const_int(self.kernel_index as u64 + 1, false),
                inkwell::AtomicOrdering::Monotonic,
                inkwell::AtomicOrdering::Monotonic,
            )
            .map_err(llvm)?;
        let won = b
            .build_extract_value(swap, 1, "won")
            .map_err(llvm)?
            .into_int_value();
        let e = crate::gen::emit::Emit::new(self.cx, self.module, b, self.function);
        e.if_then(won, || {
            // SAFETY: the error slot is two i32s.
            let at = unsafe {
                b.build_in_bounds_gep(i32t, error, &[self.cx.i64_type().const_int(1, false)], "code")
            }
            .map_err(llvm)?;
            b.build_store(at, i32t.const_int(code as u64, false))
                .map_err(llvm)?;
            Ok(())
        })
    }

    /// Writes `count`, the extent of output `o`'s data-dependent axis, into the count slot of
    /// every graph output computed from it (after the frame's error slot, as
    /// `data_dependent::output_counts` orders them); the host copies the counts into the
    /// outputs' shapes after the run. Every thread may store the same count.
    pub fn store_count(&self, o: usize, count: IntValue<'ctx>) -> Result<()> {
        let graph = self.node.graph;
        let Some(root) = crate::data_dependent::root(graph, self.node.id.out(o as u32))? else {
            return Err(CodegenError::internal(format!(
                "output {o} of '{}' has no data-dependent axis",
                self.node.name()
            )));
        };
        let frame = self
            .function
            .get_nth_param(0)
            .expect("frame")
            .into_pointer_value();
        for (j, _) in root.outputs {
            let at = count_slot(self.cx, self.builder, frame, graph, j)?;
            self.builder.build_store(at, count).map_err(llvm)?;
        }
        Ok(())
    }

    /// `ret void`.
    pub fn ret(&self) -> Result<()> {
        self.builder.build_return(None).map_err(llvm)?;
        Ok(())
    }

    fn declare(&self, name: &str, ty: inkwell::types::FunctionType<'ctx>) -> FunctionValue<'ctx> {
        self.module
            .get_function(name)
            .unwrap_or_else(|| self.module.add_function(name, ty, Some(Linkage::External)))
    }
}

/// Byte offsets of `kiln_gpu_frame`'s fields.
pub(crate) mod frame {
    pub const ARENA: u64 = 0;
    pub const WEIGHTS: u64 = 8;
    pub const ERROR: u64 = 16;
    // 24: the thread scratch, read by device.c.
    /// `io[0]`: inputs, then outputs, 8 bytes each.
    pub const IO: u64 = 32;
}

/// Loads the pointer at byte `offset` of the frame.
/// `v` rounded to TF32 (10 stored significand bits), to nearest with ties away from zero as
/// `cvt.rna.tf32.f32`, as f32 bits with the 13 low bits clear: what `mma` of
/// [`MmaKind::Tf32`] reads. A carry into the exponent rounds up a binade (or to infinity);
/// infinities keep their bits and every NaN becomes one NaN (its payload could otherwise lie
/// in the dropped bits).
pub(crate) fn tf32_round<'ctx>(
    e: &crate::gen::emit::Emit<'_, 'ctx>,
    v: inkwell::values::FloatValue<'ctx>,
) -> Result<IntValue<'ctx>> {
    let i32t = e.cx.i32_type();
    let c = |x: u32| i32t.const_int(u64::from(x), false);
    let bits = e.b.build_bit_cast(v, i32t, "").map_err(llvm)?.into_int_value();
    let magnitude = e.b.build_and(bits, c(0x7fff_ffff), "").map_err(llvm)?;
    let finite = e.icmp(inkwell::IntPredicate::ULT, magnitude, c(0x7f80_0000))?;
    let nan = e.icmp(inkwell::IntPredicate::UGT, magnitude, c(0x7f80_0000))?;
    let up = e.b.build_int_add(bits, c(0x1000), "").map_err(llvm)?;
    let rounded = e.b.build_and(up, c(0xffff_e000), "").map_err(llvm)?;
    let special = e.select_int(nan, c(0x7fff_e000), bits)?;
    e.select_int(finite, rounded, special)
}

/// Where the count of graph output `j` (one whose extent depends on the data) goes on the
/// device: the int64 after the frame's error slot at `j`'s index in
/// `data_dependent::output_counts`.
pub(crate) fn count_slot<'ctx>(
    cx: &'ctx Context,
    b: &Builder<'ctx>,
    frame_ptr: PointerValue<'ctx>,
    graph: &kiln_ir::Graph,
    j: usize,
) -> Result<PointerValue<'ctx>> {
    let slot = crate::data_dependent::output_counts(graph)?
        .iter()
        .position(|&(o, _)| o == j)
        .ok_or_else(|| CodegenError::internal(format!("graph output {j} has no count slot")))?;
    let status = load_ptr(cx, b, frame_ptr, frame::ERROR)?;
    let i64t = cx.i64_type();
    // SAFETY (of the IR): the error slot (two i32, one i64) is followed by a count per slot.
    unsafe { b.build_in_bounds_gep(i64t, status, &[i64t.const_int(1 + slot as u64, false)], "count") }
        .map_err(llvm)
}

pub(crate) fn load_ptr<'ctx>(
    cx: &'ctx Context,
    b: &Builder<'ctx>,
    frame_ptr: PointerValue<'ctx>,
    offset: u64,
) -> Result<PointerValue<'ctx>> {
    let ptr = cx.ptr_type(AddressSpace::default());
    let p = unsafe {
        b.build_in_bounds_gep(
            cx.i8_type(),
            frame_ptr,
            &[cx.i64_type().const_int(offset, false)],
            "fp",
        )
    }
    .map_err(llvm)?;
    let v = b.build_load(ptr, p, "base").map_err(llvm)?.into_pointer_value();
    // The frame never changes during a run: let LLVM hoist and share these loads.
    if let Some(inst) = v.as_instruction() {
        let kind = cx.get_kind_id("invariant.load");
        let _ = inst.set_metadata(cx.metadata_node(&[]), kind);
    }
    Ok(v)
}
