/* A hand-written stand-in for a compiled model, linked with the runtime stub by tests/stub.rs.
   KILN_FAKE_MODEL picks the model: "add1" (default: y/out = x + 1 over f32[3,4], through
   kiln_rt_parallel_for), "multi" (s = a + b for i64[2,2] and a u8 scalar, flag = !c for
   bool[3]), "bf16" (y = x + 1 in bf16), "avx512" (add1 requiring avx512f,avx512bw).
   `fake --selftest` checks the thread pool instead of running a model. */
#define _GNU_SOURCE
#include "kiln_rt.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- add1 ---- */
static const int64_t dims_34[] = {3, 4};
static const kiln_io_desc add1_in[] = {{"x", KILN_F32, 2, dims_34, 48}};
static const kiln_io_desc add1_out[] = {{"y/out", KILN_F32, 2, dims_34, 48}};

typedef struct {
  const float *x;
  float *y;
  kiln_ctx *ctx;
  int bad_tid;
} add1_job;

static void add1_row(void *data, int64_t i, int64_t tid) {
  add1_job *j = data;
  if (tid < 0 || tid >= kiln_rt_num_threads(j->ctx)) j->bad_tid = 1;
  for (int k = 0; k < 4; k++) j->y[i * 4 + k] = j->x[i * 4 + k] + 1.0f;
}

/* Two kernels, timed the way generated run functions time theirs. The second one's name needs
   escaping in JSON. */
static const char *const add1_k0_nodes[] = {"add"};
static const char *const add1_k1_nodes[] = {"check \"x\"\\1", "check/\xc3\xa9tape"};
static const kiln_kernel_desc add1_kernels[] = {
    {"add", "Add", "kiln_uk_add", 1, add1_k0_nodes, 12},
    {"check \"x\"\\1", "Check+Check", "generated", 2, add1_k1_nodes, 0},
};

static int32_t add1_run(kiln_ctx *ctx, const void *const *inputs, void *const *outputs) {
  add1_job j = {inputs[0], outputs[0], ctx, 0};
  kiln_prof *prof = kiln_rt_prof_run_begin(ctx);
  if (prof) kiln_rt_prof_kernel_begin(prof);
  kiln_rt_parallel_for(ctx, add1_row, &j, 3);
  if (prof) kiln_rt_prof_kernel_end(prof, 0);
  if (prof) kiln_rt_prof_kernel_begin(prof);
  if (j.bad_tid) {
    kiln_rt_set_error(ctx, "thread id out of range");
    return 1;
  }
  if (j.x[0] == -999.0f) {
    kiln_rt_set_error(ctx, "node 'add' (Add): the input asked for an error");
    return 1;
  }
  if (prof) kiln_rt_prof_kernel_end(prof, 1);
  if (prof) kiln_rt_prof_run_end(prof);
  return 0;
}

/* ---- multi ---- */
static const int64_t dims_22[] = {2, 2};
static const int64_t dims_3[] = {3};
static const kiln_io_desc multi_in[] = {
    {"a", KILN_I64, 2, dims_22, 32}, {"b", KILN_U8, 0, NULL, 1}, {"c", KILN_BOOL, 1, dims_3, 3}};
static const kiln_io_desc multi_out[] = {{"s", KILN_I64, 2, dims_22, 32}, {"flag", KILN_BOOL, 1, dims_3, 3}};

static int32_t multi_run(kiln_ctx *ctx, const void *const *inputs, void *const *outputs) {
  (void)ctx;
  const int64_t *a = inputs[0];
  const uint8_t *b = inputs[1], *c = inputs[2];
  int64_t *s = outputs[0];
  uint8_t *flag = outputs[1];
  for (int i = 0; i < 4; i++) s[i] = a[i] + b[0];
  for (int i = 0; i < 3; i++) flag[i] = !c[i];
  return 0;
}

/* ---- bf16 ---- */
static const kiln_io_desc bf16_in[] = {{"x", KILN_BF16, 1, dims_3, 6}};
static const kiln_io_desc bf16_out[] = {{"y", KILN_BF16, 1, dims_3, 6}};

static int32_t bf16_run(kiln_ctx *ctx, const void *const *inputs, void *const *outputs) {
  (void)ctx;
  const uint16_t *x = inputs[0];
  uint16_t *y = outputs[0];
  for (int i = 0; i < 3; i++) {
    uint32_t bits = (uint32_t)x[i] << 16;
    float f;
    memcpy(&f, &bits, 4);
    f += 1.0f;
    memcpy(&bits, &f, 4);
    y[i] = (uint16_t)(bits >> 16); /* exact for the test's values */
  }
  return 0;
}

static const kiln_model_desc models[] = {
    {"add1", "0.1.0-test", "x86_64-unknown-linux-gnu", "",
     "{\"name\":\"add1\",\"inputs\":[{\"name\":\"x\",\"dtype\":\"f32\",\"shape\":[3,4]}],"
     "\"outputs\":[{\"name\":\"y/out\",\"dtype\":\"f32\",\"shape\":[3,4]}]}",
     1, 1, add1_in, add1_out, 256, 128, 2, add1_run, add1_kernels, NULL, NULL, NULL},
    {"multi", "0.1.0-test", "x86_64-unknown-linux-gnu", "", "{\"name\":\"multi\"}", 3, 2, multi_in,
     multi_out, 0, 0, 1, multi_run, NULL, NULL, NULL, NULL},
    {"bf16", "0.1.0-test", "x86_64-unknown-linux-gnu", "", "{\"name\":\"bf16\"}", 1, 1, bf16_in, bf16_out,
     0, 0, 1, bf16_run, NULL, NULL, NULL, NULL},
    {"avx512", "0.1.0-test", "x86_64-unknown-linux-gnu", "+avx2,+fma,avx512f,avx512bw,-sse4a,madeup",
     "{\"name\":\"avx512\"}", 1, 1, add1_in, add1_out, 0, 0, 1, add1_run, NULL, NULL, NULL, NULL},
};

/* ---- thread pool self-test ---- */

typedef struct {
  int *counts; /* atomic */
  int64_t threads;
  int bad;     /* atomic */
  kiln_ctx *ctx;
} cover_job;

static void cover(void *data, int64_t i, int64_t tid) {
  cover_job *j = data;
  __atomic_fetch_add(&j->counts[i], 1, __ATOMIC_RELAXED);
  if (tid < 0 || tid >= j->threads) __atomic_store_n(&j->bad, 1, __ATOMIC_RELAXED);
  /* Scratch is private to the worker: a stray write by another worker would show here. */
  volatile int64_t *scratch = kiln_rt_thread_scratch(j->ctx, tid);
  if (((uintptr_t)scratch & 63) != 0) __atomic_store_n(&j->bad, 2, __ATOMIC_RELAXED);
  for (int k = 0; k < 16; k++) scratch[k] = tid * 1000 + i;
  for (int k = 0; k < 16; k++)
    if (scratch[k] != tid * 1000 + i) __atomic_store_n(&j->bad, 3, __ATOMIC_RELAXED);
}

/* Runs many parallel_for calls of assorted sizes on ctx; returns the number of failures. */
static int cover_all(kiln_ctx *ctx, const char *label) {
  static const int64_t sizes[] = {0, 1, 2, 3, 7, 8, 64, 1000, 100003};
  int failures = 0;
  int64_t threads = kiln_rt_num_threads(ctx);
  int *counts = malloc(sizeof(int) * 100003);
  for (int rep = 0; rep < 200; rep++) {
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
      int64_t n = sizes[s];
      if (n > 1000 && rep % 20) continue;
      memset(counts, 0, sizeof(int) * (size_t)(n ? n : 1));
      cover_job j = {counts, threads, 0, ctx};
      kiln_rt_parallel_for(ctx, cover, &j, n);
      for (int64_t i = 0; i < n; i++) {
        if (counts[i] != 1) {
          if (failures++ < 5)
            printf("%s: n=%lld index %lld ran %d times\n", label, (long long)n, (long long)i, counts[i]);
        }
      }
      if (j.bad) {
        if (failures++ < 5) printf("%s: n=%lld bad tid or scratch (%d)\n", label, (long long)n, j.bad);
      }
    }
  }
  free(counts);
  return failures;
}

static void *concurrent(void *arg) {
  kiln_ctx *ctx = arg;
  intptr_t f = cover_all(ctx, "concurrent");
  return (void *)f;
}

static int selftest(void) {
  static const kiln_model_desc scratchy = {"scratchy", "t", "t", "", "{}", 0, 0, NULL, NULL, 64, 128, 0, NULL, NULL, NULL, NULL, NULL};
  int failures = 0;
  int counts[] = {1, 2, 7};
  for (int k = 0; k < 3; k++) {
    kiln_ctx *ctx = kiln_rt_create(&scratchy, counts[k]);
    if (!ctx) {
      printf("create failed: %s\n", kiln_rt_create_error());
      return 1;
    }
    if (kiln_rt_num_threads(ctx) != counts[k]) {
      printf("asked for %d threads, got %lld\n", counts[k], (long long)kiln_rt_num_threads(ctx));
      failures++;
    }
    char label[32];
    snprintf(label, sizeof label, "%d threads", counts[k]);
    failures += cover_all(ctx, label);
    kiln_rt_destroy(ctx);
  }
  /* Two contexts, each driven by its own thread at the same time. */
  kiln_ctx *c1 = kiln_rt_create(&scratchy, 3), *c2 = kiln_rt_create(&scratchy, 2);
  pthread_t t1, t2;
  pthread_create(&t1, NULL, concurrent, c1);
  pthread_create(&t2, NULL, concurrent, c2);
  void *r1, *r2;
  pthread_join(t1, &r1);
  pthread_join(t2, &r2);
  failures += (int)(intptr_t)r1 + (int)(intptr_t)r2;
  kiln_rt_destroy(c1);
  kiln_rt_destroy(c2);
  /* 0 threads means one per CPU; creating and destroying in a loop must not leak threads. */
  for (int k = 0; k < 50; k++) {
    kiln_ctx *c = kiln_rt_create(&scratchy, 0);
    if (!c || kiln_rt_num_threads(c) < 1) {
      printf("default thread count failed\n");
      return failures + 1;
    }
    if (k % 10 == 0) failures += cover_all(c, "default");
    kiln_rt_destroy(c);
  }
  printf(failures ? "selftest: %d failures\n" : "selftest: ok\n", failures);
  return failures != 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--selftest") == 0) return selftest();
  const char *which = getenv("KILN_FAKE_MODEL");
  for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
    if (which ? strcmp(which, models[i].name) == 0 : i == 0) return kiln_exe_main(argc, argv, &models[i]);
  fprintf(stderr, "unknown KILN_FAKE_MODEL\n");
  return 3;
}
