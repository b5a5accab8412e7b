/*
 * The runtime functions kiln's kernels call, for CUDA devices (compiled for nvptx64 and linked
 * into the device module of every `--target cuda` model).
 *
 * The C micro-kernels (codegen/ukernels) are written for a CPU thread pool. On the device a
 * library kernel runs on one GPU thread: kiln_rt_parallel_for is a loop, and the kernel's
 * "worker" scratch is the frame's thread scratch. That is correct for every operator of the
 * library; the operators that matter for speed have kernels generated for the GPU instead.
 *
 * Errors: the kernel entry records the failing kernel and the micro-kernel's code in the frame;
 * the message text is not carried off the device (no formatting on a GPU thread), the host
 * names the node and the kind of error.
 */
#include "kiln_cuda.h"
#include "kiln_rt.h"

void kiln_rt_parallel_for(kiln_ctx *ctx, kiln_task_fn fn, void *data, int64_t n) {
  (void)ctx;
  for (int64_t i = 0; i < n; i++) fn(data, i, 0);
}

int64_t kiln_rt_num_threads(kiln_ctx *ctx) {
  (void)ctx;
  return 1;
}

void *kiln_rt_thread_scratch(kiln_ctx *ctx, int64_t tid) {
  (void)tid;
  return ((kiln_gpu_frame *)(void *)ctx)->thread_scratch;
}

void kiln_rt_set_error(kiln_ctx *ctx, const char *fmt, ...) {
  (void)ctx;
  (void)fmt;
}
