//! The two pieces of a kernel call that the CPU run function (`emit::run`) and the CUDA device
//! entries (`nvptx::device`) emit alike: filling a kernel's argument slots, and calling a
//! function that returns an `i32` status and branching on it. Where the pointers come from
//! (the run function's bases or the device frame) and what a failure does (return the status,
//! or record it in the frame) stay with the caller.

use crate::error::{CodegenError, Result};
use crate::gen::llvm;
use crate::kernel::Storage;
use inkwell::basic_block::BasicBlock;
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::values::{BasicMetadataValueEnum, FunctionValue, IntValue, PointerValue};
use inkwell::{AddressSpace, IntPredicate};

/// Stores a kernel's argument slots (`Plan::arg_slots`) into the pointer array `args`, at the
/// builder's block: slot `i` gets the address `locate` computes for its storage, or null for
/// an absent optional operand.
pub(crate) fn store_arg_slots<'ctx>(
    cx: &'ctx Context,
    b: &Builder<'ctx>,
    args: PointerValue<'ctx>,
    slots: &[Option<Storage>],
    mut locate: impl FnMut(Storage) -> Result<PointerValue<'ctx>>,
) -> Result<()> {
    let ptr = cx.ptr_type(AddressSpace::default());
    let i64t = cx.i64_type();
    for (slot, s) in slots.iter().enumerate() {
        let p = match s {
            Some(s) => locate(*s)?,
            None => ptr.const_null(),
        };
        let dst = unsafe { b.build_in_bounds_gep(ptr, args, &[i64t.const_int(slot as u64, false)], "slot") }
            .map_err(llvm)?;
        b.build_store(dst, p).map_err(llvm)?;
    }
    Ok(())
}

/// Calls `callee` (which returns an `i32` status, 0 for success) from `f` at the builder's
/// block, then branches on the status: the builder is left at the start of a new block
/// `fail` of `f`, reached when the status is not 0, for the caller's failure handling; the
/// status and the block `next`, where the success path continues, are returned. `what` names
/// the callee in the error for a callee that returns nothing.
#[allow(clippy::too_many_arguments)]
pub(crate) fn call_and_branch_on_status<'ctx>(
    cx: &'ctx Context,
    b: &Builder<'ctx>,
    f: FunctionValue<'ctx>,
    callee: FunctionValue<'ctx>,
    args: &[BasicMetadataValueEnum<'ctx>],
    what: &str,
    fail: &str,
    next: &str,
) -> Result<(IntValue<'ctx>, BasicBlock<'ctx>)> {
    let rc = b
        .build_call(callee, args, "rc")
        .map_err(llvm)?
        .try_as_basic_value()
        .basic()
        .ok_or_else(|| CodegenError::internal(format!("{what} returns i32")))?
        .into_int_value();
    let failed = b
        .build_int_compare(IntPredicate::NE, rc, cx.i32_type().const_zero(), "failed")
        .map_err(llvm)?;
    let fail_bb = cx.append_basic_block(f, fail);
    let next_bb = cx.append_basic_block(f, next);
    b.build_conditional_branch(failed, fail_bb, next_bb)
        .map_err(llvm)?;
    b.position_at_end(fail_bb);
    Ok((rc, next_bb))
}
