/* The C API of a model whose tensor names are not C identifiers (tests/tests/embedding.rs):
 * inputs "class" f32[2,3], "int" i64[2,3], "a.b" f32[3], "a_b" f32[1,3], "ctx" f32[2,3]; outputs
 * "return" f32[2,3] (their sum) and a name holding a comment terminator f32[2,3] (-ctx).
 * Written in the common subset of C99 and C++11: the tests build it as both, so the generated
 * header is compiled by a C and a C++ compiler. Prints "ok" or the first failed check. */
#include "names.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      printf("line %d: %s\n", __LINE__, #cond);                                                    \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

static const char *const IN_NAMES[5] = {"class", "int", "a.b", "a_b", "ctx"};
static const char *const OUT_NAMES[2] = {"return", "y*/ #error injected /*\n"};

static const char *other_thread_error;

static void *read_error(void *arg) {
  (void)arg;
  other_thread_error = names_last_error(NULL);
  return NULL;
}

int main(void) {
  /* Introspection: counts, names, dtypes, shapes, out-of-range answers. */
  CHECK(names_input_count() == 5 && NAMES_NUM_INPUTS == 5);
  CHECK(names_output_count() == 2 && NAMES_NUM_OUTPUTS == 2);
  for (int32_t i = 0; i < 5; i++) CHECK(names_input_name(i) && strcmp(names_input_name(i), IN_NAMES[i]) == 0);
  for (int32_t i = 0; i < 2; i++) CHECK(names_output_name(i) && strcmp(names_output_name(i), OUT_NAMES[i]) == 0);
  CHECK(names_input_name(5) == NULL && names_input_name(-1) == NULL && names_output_name(2) == NULL);
  CHECK(names_input_dtype(0) == NAMES_DTYPE_F32 && names_input_dtype(1) == NAMES_DTYPE_I64);
  CHECK(names_output_dtype(1) == NAMES_DTYPE_F32 && names_input_dtype(5) == -1 && names_output_dtype(-1) == -1);
  int64_t dims[4] = {0, 0, 0, 0};
  CHECK(names_input_shape(2, dims) == 1 && dims[0] == 3);
  CHECK(names_input_shape(3, dims) == 2 && dims[0] == 1 && dims[1] == 3);
  CHECK(names_input_shape(0, NULL) == 2 && names_output_shape(0, dims) == 2 && dims[0] == 2 && dims[1] == 3);
  CHECK(names_input_shape(7, dims) == -1 && names_output_shape(2, NULL) == -1);

  /* Size macros, named by the collision-free identifiers. */
  CHECK(NAMES_INPUT_CLASS_2_ELEMENTS == 6 && NAMES_INPUT_CLASS_2_BYTES == 24);
  CHECK(NAMES_INPUT_INT_2_ELEMENTS == 6 && NAMES_INPUT_INT_2_BYTES == 48);
  CHECK(NAMES_INPUT_A_B_ELEMENTS == 3 && NAMES_INPUT_A_B_2_ELEMENTS == 3 && NAMES_INPUT_A_B_2_BYTES == 12);
  CHECK(NAMES_INPUT_CTX_2_BYTES == 24 && NAMES_OUTPUT_RETURN_2_BYTES == 24);
  CHECK(NAMES_OUTPUT_Y_ERROR_INJECTED_ELEMENTS == 6);

  float cls[6], ab[3], ab2[3], c[6], sum[6], neg[6];
  int64_t in[6];
  for (int i = 0; i < 6; i++) {
    cls[i] = (float)i;
    in[i] = 10 * i;
    c[i] = 0.5f * (float)i;
  }
  for (int i = 0; i < 3; i++) {
    ab[i] = 100.0f * (float)(i + 1);
    ab2[i] = 1000.0f * (float)(i + 1);
  }

  /* NULL context: an error naming it, readable through last_error(NULL) on this thread only. */
  CHECK(names_run(NULL, cls, in, ab, ab2, c, sum, neg) != 0);
  CHECK(strstr(names_last_error(NULL), "names_run") && strstr(names_last_error(NULL), "ctx"));
  pthread_t t;
  CHECK(pthread_create(&t, NULL, read_error, NULL) == 0 && pthread_join(t, NULL) == 0);
  CHECK(other_thread_error && other_thread_error[0] == 0);
  const void *ins[5] = {cls, in, ab, ab2, c};
  void *outs[2] = {sum, neg};
  CHECK(names_run_generic(NULL, ins, outs) != 0 && strstr(names_last_error(NULL), "names_run_generic"));
  names_destroy(NULL);

  names_ctx *ctx = names_create(2);
  CHECK(ctx != NULL);
  /* NULL tensors: errors naming the argument, never a crash. */
  CHECK(names_run(ctx, cls, in, ab, NULL, c, sum, neg) != 0);
  CHECK(strstr(names_last_error(ctx), "input 'a_b'") && !strchr(names_last_error(ctx), '\n'));
  CHECK(names_run(ctx, cls, in, ab, ab2, c, sum, NULL) != 0 && strstr(names_last_error(ctx), "output"));
  CHECK(names_run_generic(ctx, NULL, outs) != 0 && strstr(names_last_error(ctx), "inputs is NULL"));
  CHECK(names_run_generic(ctx, ins, NULL) != 0 && strstr(names_last_error(ctx), "outputs is NULL"));
  outs[1] = NULL;
  CHECK(names_run_generic(ctx, ins, outs) != 0 && strstr(names_last_error(ctx), "outputs[1]"));
  outs[1] = neg;

  /* A successful run clears the last error. */
  CHECK(names_run(ctx, cls, in, ab, ab2, c, sum, neg) == 0);
  CHECK(names_last_error(ctx)[0] == 0);
  for (int i = 0; i < 6; i++) {
    float want = cls[i] + (float)in[i] + ab[i % 3] + ab2[i % 3] + c[i];
    CHECK(sum[i] == want && neg[i] == -c[i]);
  }
  CHECK(names_run_generic(ctx, ins, outs) == 0 && names_last_error(ctx)[0] == 0);

  /* The shaped run: input shapes checked against the compiled ones, output shapes reported. */
  int64_t in_dims[5][2], out_dims[2][2] = {{-1, -1}, {-1, -1}};
  const int64_t *in_shapes[5];
  int64_t *out_shapes[2] = {out_dims[0], out_dims[1]};
  for (int32_t i = 0; i < 5; i++) {
    names_input_shape(i, in_dims[i]);
    in_shapes[i] = in_dims[i];
  }
  CHECK(names_run_shaped(ctx, ins, NULL, outs, out_shapes) != 0 && strstr(names_last_error(ctx), "input_shapes is NULL"));
  in_dims[2][0] = 4;
  CHECK(names_run_shaped(ctx, ins, in_shapes, outs, out_shapes) != 0);
  CHECK(strstr(names_last_error(ctx), "names_run_shaped") && strstr(names_last_error(ctx), "'a.b'") &&
        strstr(names_last_error(ctx), "[3]"));
  in_dims[2][0] = 3;
  CHECK(names_run_shaped(NULL, ins, in_shapes, outs, out_shapes) != 0);
  CHECK(names_run_shaped(ctx, ins, in_shapes, outs, out_shapes) == 0 && names_last_error(ctx)[0] == 0);
  CHECK(out_dims[0][0] == 2 && out_dims[0][1] == 3 && out_dims[1][0] == 2 && out_dims[1][1] == 3);
  CHECK(names_run_shaped(ctx, ins, in_shapes, outs, NULL) == 0);
  names_destroy(ctx);
  printf("ok\n");
  return 0;
}
