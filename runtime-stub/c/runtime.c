/* kiln runtime core: contexts, errors, the thread pool. See kiln_rt.h. */
#define _GNU_SOURCE
#include "kiln_rt.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct kiln_ctx {
  const kiln_model_desc *desc;
  void *arena;
  void *thread_scratch;
  int64_t num_threads;
  char error[512];
};

static _Thread_local char create_error[256];

static void *alloc64(int64_t bytes) {
  if (bytes <= 0) return NULL;
  void *p = NULL;
  if (posix_memalign(&p, 64, (size_t)((bytes + 63) & ~(int64_t)63)) != 0) return NULL;
  return p;
}

kiln_ctx *kiln_rt_create(const kiln_model_desc *desc, int32_t num_threads) {
  kiln_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) {
    snprintf(create_error, sizeof create_error, "out of memory");
    return NULL;
  }
  ctx->desc = desc;
  ctx->num_threads = 1;
  (void)num_threads;
  ctx->arena = alloc64(desc->arena_bytes);
  ctx->thread_scratch = alloc64(desc->thread_scratch_bytes * ctx->num_threads);
  if ((desc->arena_bytes > 0 && !ctx->arena) || (desc->thread_scratch_bytes > 0 && !ctx->thread_scratch)) {
    snprintf(create_error, sizeof create_error, "cannot allocate %lld bytes of working memory",
             (long long)(desc->arena_bytes + desc->thread_scratch_bytes));
    kiln_rt_destroy(ctx);
    return NULL;
  }
  return ctx;
}

const char *kiln_rt_create_error(void) { return create_error; }

void kiln_rt_destroy(kiln_ctx *ctx) {
  if (!ctx) return;
  free(ctx->arena);
  free(ctx->thread_scratch);
  free(ctx);
}

const kiln_model_desc *kiln_rt_desc(kiln_ctx *ctx) { return ctx->desc; }
void *kiln_rt_arena(kiln_ctx *ctx) { return ctx->arena; }

void kiln_rt_set_error(kiln_ctx *ctx, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx->error, sizeof ctx->error, fmt, ap);
  va_end(ap);
}

const char *kiln_rt_last_error(kiln_ctx *ctx) { return ctx->error; }

void kiln_rt_parallel_for(kiln_ctx *ctx, kiln_task_fn fn, void *data, int64_t n) {
  (void)ctx;
  for (int64_t i = 0; i < n; i++) fn(data, i, 0);
}

int64_t kiln_rt_num_threads(kiln_ctx *ctx) { return ctx->num_threads; }

void *kiln_rt_thread_scratch(kiln_ctx *ctx, int64_t tid) {
  return (char *)ctx->thread_scratch + tid * ctx->desc->thread_scratch_bytes;
}
