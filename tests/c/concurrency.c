/* Runs a model compiled by kiln as a static library from many threads at once, one context per
 * thread, and checks that every run gives exactly the single-threaded result for its inputs.
 * Built by tests/tests/concurrency.rs with:
 *   cc -DKILN_HEADER='"NAME.h"' -DKILN_API(x)=NAME_##x concurrency.c libNAME.a -lpthread
 * Usage: concurrency DIR THREADS ITERS SETS IN_BYTES... -- OUT_BYTES...
 * Reads input set s, input i from DIR/in<s>_<i>.bin; writes the reference outputs (one context,
 * one caller) to DIR/ref<s>_<o>.bin, then starts THREADS threads that each create a context and
 * run ITERS times, cycling through the sets, comparing every output byte for byte. */
#include KILN_HEADER

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_IO 16
#define MAX_SETS 16
/* Threads per context: more than one, so that each context's own worker pool runs too. */
#define CTX_THREADS 2

static int n_in, n_out, n_sets, iters;
static long in_bytes[MAX_IO], out_bytes[MAX_IO];
static void *inputs[MAX_SETS][MAX_IO];
static void *refs[MAX_SETS][MAX_IO];

typedef struct {
  int id;
  long runs, mismatches, failures;
  char error[256];
} worker;

static void *read_exact(const char *path, long size) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  void *buf = malloc(size > 0 ? (size_t)size : 1);
  int ok = buf && fread(buf, 1, (size_t)size, f) == (size_t)size && fgetc(f) == EOF;
  fclose(f);
  if (!ok) {
    free(buf);
    return NULL;
  }
  return buf;
}

static void *work(void *arg) {
  worker *w = arg;
  KILN_API(ctx) *ctx = KILN_API(create)(CTX_THREADS);
  if (!ctx) {
    snprintf(w->error, sizeof w->error, "create failed: %s", KILN_API(last_error)(NULL));
    w->failures++;
    return NULL;
  }
  void *outs[MAX_IO];
  for (int o = 0; o < n_out; o++) outs[o] = malloc(out_bytes[o] > 0 ? (size_t)out_bytes[o] : 1);
  for (int it = 0; it < iters; it++) {
    int s = (w->id + it) % n_sets;
    /* Garbage in the output buffers: a run that skips writing an element is caught. */
    for (int o = 0; o < n_out; o++) memset(outs[o], 0xA5 ^ it, (size_t)out_bytes[o]);
    if (KILN_API(run_generic)(ctx, (const void *const *)inputs[s], outs) != 0) {
      snprintf(w->error, sizeof w->error, "run failed: %s", KILN_API(last_error)(ctx));
      w->failures++;
      continue;
    }
    w->runs++;
    for (int o = 0; o < n_out; o++)
      if (memcmp(outs[o], refs[s][o], (size_t)out_bytes[o]) != 0) w->mismatches++;
  }
  for (int o = 0; o < n_out; o++) free(outs[o]);
  KILN_API(destroy)(ctx);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: %s DIR THREADS ITERS SETS IN_BYTES... -- OUT_BYTES...\n", argv[0]);
    return 2;
  }
  const char *dir = argv[1];
  int threads = atoi(argv[2]);
  iters = atoi(argv[3]);
  n_sets = atoi(argv[4]);
  int i = 5;
  for (; i < argc && strcmp(argv[i], "--") != 0 && n_in < MAX_IO; i++) in_bytes[n_in++] = atol(argv[i]);
  for (i++; i < argc && n_out < MAX_IO; i++) out_bytes[n_out++] = atol(argv[i]);
  if (threads < 1 || threads > 64 || n_sets < 1 || n_sets > MAX_SETS) return 2;
  char path[4096];
  for (int s = 0; s < n_sets; s++)
    for (int k = 0; k < n_in; k++) {
      snprintf(path, sizeof path, "%s/in%d_%d.bin", dir, s, k);
      if (!(inputs[s][k] = read_exact(path, in_bytes[k]))) {
        fprintf(stderr, "cannot read %ld bytes from %s\n", in_bytes[k], path);
        return 1;
      }
    }

  /* The reference: one context, one caller. */
  KILN_API(ctx) *ctx = KILN_API(create)(CTX_THREADS);
  if (!ctx) {
    fprintf(stderr, "create failed: %s\n", KILN_API(last_error)(NULL));
    return 1;
  }
  for (int s = 0; s < n_sets; s++) {
    for (int o = 0; o < n_out; o++) refs[s][o] = calloc(1, out_bytes[o] > 0 ? (size_t)out_bytes[o] : 1);
    if (KILN_API(run_generic)(ctx, (const void *const *)inputs[s], refs[s]) != 0) {
      fprintf(stderr, "run failed: %s\n", KILN_API(last_error)(ctx));
      return 1;
    }
    for (int o = 0; o < n_out; o++) {
      snprintf(path, sizeof path, "%s/ref%d_%d.bin", dir, s, o);
      FILE *f = fopen(path, "wb");
      if (!f || fwrite(refs[s][o], 1, (size_t)out_bytes[o], f) != (size_t)out_bytes[o]) return 1;
      fclose(f);
    }
  }
  KILN_API(destroy)(ctx);

  pthread_t tids[64];
  worker ws[64];
  memset(ws, 0, sizeof ws);
  for (int t = 0; t < threads; t++) {
    ws[t].id = t;
    if (pthread_create(&tids[t], NULL, work, &ws[t]) != 0) {
      fprintf(stderr, "pthread_create failed\n");
      return 1;
    }
  }
  long runs = 0, mismatches = 0, failures = 0;
  for (int t = 0; t < threads; t++) {
    pthread_join(tids[t], NULL);
    runs += ws[t].runs;
    mismatches += ws[t].mismatches;
    failures += ws[t].failures;
    if (ws[t].error[0]) fprintf(stderr, "thread %d: %s\n", t, ws[t].error);
  }
  printf("runs %ld mismatches %ld failures %ld\n", runs, mismatches, failures);
  for (int s = 0; s < n_sets; s++)
    for (int k = 0; k < n_in; k++) free(inputs[s][k]);
  for (int s = 0; s < n_sets; s++)
    for (int o = 0; o < n_out; o++) free(refs[s][o]);
  return mismatches || failures ? 1 : 0;
}
