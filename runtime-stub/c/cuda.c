/*
 * Host side of CUDA models (see kiln_cuda.h). Linked only into `--target cuda` artifacts.
 */
#include "kiln_cuda.h"
#include "kiln_rt.h"

int32_t kiln_rt_cuda_run(struct kiln_ctx *ctx, const void *const *inputs, void *const *outputs) {
  (void)inputs;
  (void)outputs;
  kiln_rt_set_error(ctx, "no CUDA device: this kiln runtime has no CUDA support yet");
  return 1;
}
