/*
 * The runtime functions kiln's kernels call, for CUDA devices (compiled for nvptx64 and linked
 * into the device module of every `--target cuda` model).
 *
 * The C micro-kernels (codegen/ukernels) are written for a CPU thread pool: a kernel's serial
 * code sets up a job, then kiln_rt_parallel_for runs independent tasks. On the device a library
 * kernel runs on one block, in one of two ways the compiler picks per micro-kernel:
 *
 * - Block-parallel (KILN_GPU_LIBRARY_THREADS threads): every thread runs the kernel's serial
 *   code (each on its own stack, so the job a task reads is the thread's own copy) and
 *   kiln_rt_parallel_for deals the tasks out over the block's threads, with a barrier before
 *   (every thread's serial writes are done before any task reads them) and after (every task is
 *   done before serial code goes on). This is only correct for micro-kernels whose serial code is
 *   idempotent — it writes the same values however many threads run it and never updates
 *   memory in place — which is why the compiler lists them (nvptx/device.rs) rather than
 *   assuming it of all.
 * - One thread (a block of 1), for the others: kiln_rt_parallel_for is then a loop.
 *
 * A task that itself calls kiln_rt_parallel_for runs the nested tasks as a loop on its thread:
 * the block's threads are then not all at the same call, so a barrier would never complete.
 *
 * Errors: the kernel entry records the failing kernel and the micro-kernel's code in the frame;
 * the message text is not carried off the device (no formatting on a GPU thread), the host
 * names the node and the kind of error.
 */
#include "kiln_cuda.h"
#include "kiln_rt.h"

#define BLOCK_SHARED __attribute__((address_space(3)))

/* Block-wide state, set by kiln_rt_block_begin at the start of each library kernel: shared
   memory starts undefined. */
static BLOCK_SHARED volatile int32_t in_parallel_tasks;
static BLOCK_SHARED volatile int64_t thread_scratch_stride;

static int64_t thread_index(void) { return __nvvm_read_ptx_sreg_tid_x(); }
static int64_t block_threads(void) { return __nvvm_read_ptx_sreg_ntid_x(); }

/* `barrier.sync 0` (not the `.aligned` form): the threads of a warp may reach it from
   different call sites (sm_70 and later schedule them independently). Inline PTX: the
   builtin wants a PTX version feature on this file, while the PTX version is the device
   module's, chosen per SM when a model is compiled. */
static void block_barrier(void) { __asm__ volatile("barrier.sync 0;" ::: "memory"); }

void kiln_rt_block_begin(int64_t scratch_stride) {
  if (thread_index() == 0) {
    in_parallel_tasks = 0;
    thread_scratch_stride = scratch_stride;
  }
  block_barrier();
}

void kiln_rt_parallel_for(kiln_ctx *ctx, kiln_task_fn fn, void *data, int64_t n) {
  (void)ctx;
  int64_t tid = thread_index(), threads = block_threads();
  if (n <= 0) return;
  if (threads == 1 || in_parallel_tasks) {
    for (int64_t i = 0; i < n; i++) fn(data, i, tid);
    return;
  }
  block_barrier();
  /* Every thread has read the flag as 0 before any sets it. */
  in_parallel_tasks = 1;
  for (int64_t i = tid; i < n; i += threads) fn(data, i, tid);
  block_barrier();
  in_parallel_tasks = 0;
}

int64_t kiln_rt_num_threads(kiln_ctx *ctx) {
  (void)ctx;
  return block_threads();
}

void *kiln_rt_thread_scratch(kiln_ctx *ctx, int64_t tid) {
  return ((kiln_gpu_frame *)(void *)ctx)->thread_scratch + tid * thread_scratch_stride;
}

void kiln_rt_set_error(kiln_ctx *ctx, const char *fmt, ...) {
  (void)ctx;
  (void)fmt;
}
