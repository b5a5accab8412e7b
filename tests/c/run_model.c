/* Runs a model compiled by kiln as a static library, the way an application embeds it.
 * Built by the tests with: cc -DKILN_HEADER='"NAME.h"' -DKILN_API(x)=NAME_##x run_model.c libNAME.a
 * Usage: run_model THREADS IN0.bin ... -- OUT0.bin:BYTES ...
 * Inputs and outputs are raw little-endian tensors in graph order; the caller writes each input
 * with exactly the bytes the header documents and gives each output's size. */
#include KILN_HEADER

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *read_file(const char *path, long *size) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  *size = ftell(f);
  fseek(f, 0, SEEK_SET);
  void *buf = malloc(*size > 0 ? (size_t)*size : 1);
  if (fread(buf, 1, (size_t)*size, f) != (size_t)*size) {
    fclose(f);
    free(buf);
    return NULL;
  }
  fclose(f);
  return buf;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s THREADS IN... -- OUT:BYTES...\n", argv[0]);
    return 2;
  }
  int threads = atoi(argv[1]);
  const void *inputs[64];
  void *outputs[64];
  const char *out_paths[64];
  long out_sizes[64];
  int n_in = 0, n_out = 0, i = 2;
  for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
    long size;
    inputs[n_in] = read_file(argv[i], &size);
    if (!inputs[n_in]) {
      fprintf(stderr, "cannot read %s\n", argv[i]);
      return 1;
    }
    n_in++;
  }
  for (i++; i < argc; i++) {
    char *colon = strrchr(argv[i], ':');
    if (!colon) return 2;
    *colon = 0;
    out_paths[n_out] = argv[i];
    out_sizes[n_out] = atol(colon + 1);
    outputs[n_out] = calloc(1, out_sizes[n_out] > 0 ? (size_t)out_sizes[n_out] : 1);
    n_out++;
  }
  KILN_API(ctx) *ctx = KILN_API(create)(threads);
  if (!ctx) {
    fprintf(stderr, "create failed: %s\n", KILN_API(last_error)(NULL));
    return 1;
  }
  if (KILN_API(run_generic)(ctx, inputs, outputs) != 0) {
    fprintf(stderr, "run failed: %s\n", KILN_API(last_error)(ctx));
    return 1;
  }
  for (int o = 0; o < n_out; o++) {
    FILE *f = fopen(out_paths[o], "wb");
    if (!f || fwrite(outputs[o], 1, (size_t)out_sizes[o], f) != (size_t)out_sizes[o]) return 1;
    fclose(f);
  }
  KILN_API(destroy)(ctx);
  return 0;
}
