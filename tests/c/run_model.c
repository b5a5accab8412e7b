/* Runs a model compiled by kiln as a static library, the way an application embeds it.
 * Built by the tests with: cc -DKILN_HEADER='"NAME.h"' -DKILN_API(x)=NAME_##x run_model.c libNAME.a
 * Usage: run_model THREADS IN0.bin ... -- OUT0.bin:BYTES ...
 * Inputs and outputs are raw little-endian tensors in graph order; the caller writes each input
 * with exactly the bytes the header documents. The run is NAME_run_shaped, with the input shapes
 * the header's introspection gives; each output gets a buffer of the size the header gives (a
 * bound, for an output whose size depends on the data), and OUT.bin receives the bytes of the
 * shape the run reports, written beside it as OUT.bin.shape (the dims, space-separated). BYTES
 * is the size the caller expects, checked for outputs of a fixed size (-1: not known). */
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

/* Bytes per element of an ONNX TensorProto.DataType code (what NAME_output_dtype returns). */
static long dtype_size(int32_t onnx) {
  switch (onnx) {
  case 2: case 3: case 9: return 1;      /* uint8, int8, bool */
  case 4: case 5: case 10: case 16: return 2; /* uint16, int16, float16, bfloat16 */
  case 7: case 11: case 13: return 8;    /* int64, double, uint64 */
  default: return 4;                     /* float, int32, uint32 */
  }
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
  if (n_in != KILN_API(input_count)() || n_out != KILN_API(output_count)()) {
    fprintf(stderr, "%d inputs and %d outputs given; the model has %d and %d\n", n_in, n_out,
            KILN_API(input_count)(), KILN_API(output_count)());
    return 2;
  }
  static int64_t in_dims[64][16], out_dims[64][16];
  const int64_t *in_shapes[64];
  int64_t *out_shapes[64];
  long out_bound[64], out_esize[64];
  for (int k = 0; k < n_in; k++) {
    if (KILN_API(input_shape)(k, NULL) > 16) return 2;
    KILN_API(input_shape)(k, in_dims[k]);
    in_shapes[k] = in_dims[k];
  }
  for (int o = 0; o < n_out; o++) {
    int32_t rank = KILN_API(output_shape)(o, NULL);
    if (rank < 0 || rank > 16) return 2;
    KILN_API(output_shape)(o, out_dims[o]);
    out_esize[o] = dtype_size(KILN_API(output_dtype)(o));
    out_bound[o] = out_esize[o];
    for (int d = 0; d < rank; d++) out_bound[o] *= (long)out_dims[o][d];
    free(outputs[o]);
    outputs[o] = calloc(1, out_bound[o] > 0 ? (size_t)out_bound[o] : 1);
    out_shapes[o] = out_dims[o];
  }
  KILN_API(ctx) *ctx = KILN_API(create)(threads);
  if (!ctx) {
    fprintf(stderr, "create failed: %s\n", KILN_API(last_error)(NULL));
    return 1;
  }
  if (KILN_API(run_shaped)(ctx, inputs, in_shapes, outputs, out_shapes) != 0) {
    fprintf(stderr, "run failed: %s\n", KILN_API(last_error)(ctx));
    return 1;
  }
  if (KILN_API(last_output_shape)(ctx, n_out, NULL) != -1 || !strstr(KILN_API(last_error)(ctx), "no output")) {
    fprintf(stderr, "last_output_shape accepted output %d of %d\n", n_out, n_out);
    return 1;
  }
  for (int o = 0; o < n_out; o++) {
    int32_t rank = KILN_API(output_shape)(o, NULL);
    /* NAME_last_output_shape reports what the shaped run did. */
    int64_t last[16];
    if (rank > 16 || KILN_API(last_output_shape)(ctx, o, last) != rank) return 1;
    for (int d = 0; d < rank; d++)
      if (last[d] != out_dims[o][d]) {
        fprintf(stderr, "output %d: last_output_shape dim %d is %lld, the run reported %lld\n", o, d,
                (long long)last[d], (long long)out_dims[o][d]);
        return 1;
      }
    long bytes = out_esize[o];
    char shape_path[4096];
    snprintf(shape_path, sizeof shape_path, "%s.shape", out_paths[o]);
    FILE *sf = fopen(shape_path, "w");
    if (!sf) return 1;
    for (int d = 0; d < rank; d++) {
      bytes *= (long)out_dims[o][d];
      fprintf(sf, "%s%lld", d ? " " : "", (long long)out_dims[o][d]);
    }
    fclose(sf);
    if (bytes > out_bound[o] || (out_sizes[o] >= 0 && bytes == out_bound[o] && bytes != out_sizes[o])) {
      fprintf(stderr, "output %d: %ld bytes reported, %ld expected (%ld bound)\n", o, bytes, out_sizes[o],
              out_bound[o]);
      return 1;
    }
    FILE *f = fopen(out_paths[o], "wb");
    if (!f || fwrite(outputs[o], 1, (size_t)bytes, f) != (size_t)bytes) return 1;
    fclose(f);
  }
  KILN_API(destroy)(ctx);
  return 0;
}
