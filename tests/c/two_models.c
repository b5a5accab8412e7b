/* Two different models compiled by kiln, linked into one C program, run side by side; and two
 * contexts of one model running at the same time on two threads.
 * Built by the tests with: cc -I DIR -DA_IN_BYTES=.. -DA_OUT_BYTES=.. -DB_IN_BYTES=.. -DB_OUT_BYTES=..
 *   two_models.c libmodel_a.a libmodel_b.a -lpthread -lm   (both models: one input, one output)
 * Usage: two_models A_IN.bin A_OUT.bin B_IN.bin B_OUT.bin
 * Writes each model's first output; exits non-zero on any failure or if the two concurrent
 * contexts of model A disagree. */
#include "model_a.h"
#include "model_b.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *read_file(const char *path, long expect) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  void *buf = malloc((size_t)expect);
  size_t got = fread(buf, 1, (size_t)expect, f);
  fclose(f);
  if (got != (size_t)expect) {
    free(buf);
    return NULL;
  }
  return buf;
}

static int write_file(const char *path, const void *data, long size) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  size_t n = fwrite(data, 1, (size_t)size, f);
  fclose(f);
  return n == (size_t)size ? 0 : -1;
}

struct job {
  const void *input;
  void *output;
  int rc;
};

/* Each thread owns its own context: contexts share nothing mutable. */
static void *run_a(void *arg) {
  struct job *j = arg;
  model_a_ctx *ctx = model_a_create(1);
  if (!ctx) {
    j->rc = -1;
    return NULL;
  }
  const void *ins[1] = {j->input};
  void *outs[1] = {j->output};
  for (int rep = 0; rep < 3 && j->rc == 0; rep++) j->rc = model_a_run_generic(ctx, ins, outs);
  model_a_destroy(ctx);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s A_IN A_OUT B_IN B_OUT\n", argv[0]);
    return 2;
  }
  const long a_out_bytes = A_OUT_BYTES, b_out_bytes = B_OUT_BYTES;
  void *xa = read_file(argv[1], A_IN_BYTES);
  void *xb = read_file(argv[3], B_IN_BYTES);
  if (!xa || !xb) {
    fprintf(stderr, "cannot read inputs\n");
    return 1;
  }
  void *ya = calloc(1, (size_t)a_out_bytes), *yb = calloc(1, (size_t)b_out_bytes);

  /* Both models in one program, interleaved. */
  model_a_ctx *a = model_a_create(2);
  model_b_ctx *b = model_b_create(2);
  if (!a || !b) {
    fprintf(stderr, "create failed: %s / %s\n", model_a_last_error(NULL), model_b_last_error(NULL));
    return 1;
  }
  const void *ia[1] = {xa}, *ib[1] = {xb};
  void *oa[1] = {ya}, *ob[1] = {yb};
  if (model_a_run_generic(a, ia, oa) || model_b_run_generic(b, ib, ob) || model_a_run_generic(a, ia, oa)) {
    fprintf(stderr, "run failed: %s / %s\n", model_a_last_error(a), model_b_last_error(b));
    return 1;
  }
  if (write_file(argv[2], ya, a_out_bytes) || write_file(argv[4], yb, b_out_bytes)) return 1;

  /* Two contexts of model A at once must agree with the single run. */
  struct job j1 = {xa, calloc(1, (size_t)a_out_bytes), 0}, j2 = {xa, calloc(1, (size_t)a_out_bytes), 0};
  pthread_t t1, t2;
  pthread_create(&t1, NULL, run_a, &j1);
  pthread_create(&t2, NULL, run_a, &j2);
  pthread_join(t1, NULL);
  pthread_join(t2, NULL);
  if (j1.rc || j2.rc) {
    fprintf(stderr, "concurrent runs failed\n");
    return 1;
  }
  if (memcmp(j1.output, ya, (size_t)a_out_bytes) || memcmp(j2.output, ya, (size_t)a_out_bytes)) {
    fprintf(stderr, "concurrent contexts disagree with a single run\n");
    return 1;
  }
  model_a_destroy(a);
  model_b_destroy(b);
  printf("ok\n");
  return 0;
}
