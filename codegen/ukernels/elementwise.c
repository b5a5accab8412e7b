/*
 * Micro-kernels for the elementwise family. See kiln_uk.h for the contract and
 * codegen/src/uk/elementwise.rs for the attribute packing.
 *
 *   kiln_uk_ew_unary   iattr [op, detect_positive, detect_negative]  fattr [p0, p1]
 *   kiln_uk_ew_binary  iattr [op]
 *   kiln_uk_ew_where   inputs cond, x, y
 *   kiln_uk_ew_clip    inputs x, min?, max?
 *   kiln_uk_ew_cast    input x; the output's dtype is the target
 *
 * Semantics are those of kiln's reference interpreter (ir/src/ops/elementwise.rs): floating
 * functions of f16/bf16/f64 are evaluated in double and rounded once; integers wrap; integer
 * division and remainder by zero give 0; float to integer conversions saturate (NaN gives 0).
 *
 * Structure: f32 (the type of every hot model) has direct loops per operator, dispatched
 * outside the loop, that LLVM vectorises after inlining. Every other type goes through a
 * blocked "load into a wide domain (double or int64), compute, store" scheme, so that each
 * dtype switch and operator switch sits outside a loop of EW_BLK elements. Broadcasting is
 * handled by a plan that merges contiguous output axes and walks the output in rows along
 * which each operand either advances by one element or stays put. Large outputs are split
 * into chunks across the runtime's threads.
 */
#include "kiln_math.h"
#include "kiln_uk.h"
#include "kiln_uk_ops.h" /* U_* and B_* operator codes, generated from the operator tables */

#define EW_MAXR 16         /* axes after merging; the Rust side rejects larger ranks */
#define EW_BLK 256         /* elements per block in the generic (wide domain) path */
#define EW_PAR_MIN 65536   /* below this many elements a kernel runs on the calling thread */
#define EW_CHUNK 16384     /* elements per parallel task */

/* ------------------------------------------------------------------------------------------ */
/* Broadcast plan                                                                             */
/* ------------------------------------------------------------------------------------------ */

typedef struct ew_plan {
  int64_t rank;               /* >= 1 */
  int64_t n;                  /* output elements */
  int64_t n_ops;              /* operands */
  int64_t dims[EW_MAXR];
  int64_t str[3][EW_MAXR];    /* element strides per operand, 0 along broadcast axes */
} ew_plan;

/* Builds the plan of out = f(ops...) and merges axes along which every operand is contiguous
   (or broadcast) with the next inner one. Returns 0, or -1 if the rank is too large. */
static int ew_make_plan(ew_plan *p, const kiln_tensor *out, const kiln_tensor *const *ops,
                        int64_t n_ops) {
  int64_t r = out->rank;
  p->n = out->numel;
  p->n_ops = n_ops;
  int64_t dims[64], str[3][64];
  if (r > 64) return -1;
  for (int64_t d = 0; d < r; d++) dims[d] = out->dims[d];
  for (int64_t k = 0; k < n_ops; k++) {
    const kiln_tensor *t = ops[k];
    int64_t s = 1;
    for (int64_t d = r - 1; d >= 0; d--) {
      int64_t td = d - (r - t->rank);
      int64_t ext = td >= 0 ? t->dims[td] : 1;
      str[k][d] = ext == 1 ? 0 : s;
      s *= ext;
    }
  }
  /* Merge from the innermost axis outwards, dropping unit axes. */
  int64_t m = 0; /* merged axes, stored innermost first */
  int64_t md[64], ms[3][64];
  for (int64_t d = r - 1; d >= 0; d--) {
    if (dims[d] == 1) continue;
    int merge = m > 0;
    for (int64_t k = 0; k < n_ops && merge; k++)
      merge = str[k][d] == ms[k][m - 1] * md[m - 1];
    if (merge) {
      md[m - 1] *= dims[d];
    } else {
      md[m] = dims[d];
      for (int64_t k = 0; k < n_ops; k++) ms[k][m] = str[k][d];
      m++;
    }
  }
  if (m == 0) {
    md[0] = 1;
    for (int64_t k = 0; k < n_ops; k++) ms[k][0] = 0;
    m = 1;
  }
  if (m > EW_MAXR) return -1;
  p->rank = m;
  for (int64_t d = 0; d < m; d++) {
    p->dims[d] = md[m - 1 - d];
    for (int64_t k = 0; k < n_ops; k++) p->str[k][d] = ms[k][m - 1 - d];
  }
  return 0;
}

/* A run of output elements [o, o+len) where operand k starts at off[k] and advances by
   step[k] (0 or 1) per element. */
typedef struct ew_seg {
  int64_t o, len;
  int64_t off[3], step[3];
} ew_seg;

typedef void (*ew_seg_fn)(const void *env, const ew_seg *s);

/* Calls fn for the runs that cover output elements [lo, hi). */
KILN_UK_INLINE void ew_walk(const ew_plan *p, int64_t lo, int64_t hi, ew_seg_fn fn,
                            const void *env) {
  int64_t r = p->rank, inner = p->dims[r - 1];
  int64_t idx[EW_MAXR];
  ew_seg s;
  /* Multi-index of lo: the outer axes, and the position j along the inner one. */
  int64_t rest = lo / inner, j = lo % inner;
  for (int64_t d = r - 2; d >= 0; d--) {
    idx[d] = rest % p->dims[d];
    rest /= p->dims[d];
  }
  for (int64_t k = 0; k < p->n_ops; k++) {
    int64_t off = j * p->str[k][r - 1];
    for (int64_t d = 0; d < r - 1; d++) off += idx[d] * p->str[k][d];
    s.off[k] = off;
    s.step[k] = p->str[k][r - 1];
  }
  int64_t pos = lo;
  while (pos < hi) {
    int64_t len = inner - j;
    if (len > hi - pos) len = hi - pos;
    s.o = pos;
    s.len = len;
    fn(env, &s);
    pos += len;
    if (pos >= hi) break;
    /* Next row: rewind the inner axis, carry through the outer ones. */
    for (int64_t k = 0; k < p->n_ops; k++) s.off[k] -= j * p->str[k][r - 1];
    j = 0;
    for (int64_t d = r - 2; d >= 0; d--) {
      idx[d]++;
      for (int64_t k = 0; k < p->n_ops; k++) s.off[k] += p->str[k][d];
      if (idx[d] < p->dims[d]) break;
      for (int64_t k = 0; k < p->n_ops; k++) s.off[k] -= idx[d] * p->str[k][d];
      idx[d] = 0;
    }
  }
}

/* Runs fn over the whole output, in parallel chunks when it is large. */
typedef struct ew_par {
  const ew_plan *plan;
  ew_seg_fn fn;
  const void *env;
} ew_par;

static void ew_par_task(void *data, int64_t i, int64_t tid) {
  (void)tid;
  const ew_par *w = (const ew_par *)data;
  int64_t lo = i * EW_CHUNK, hi = lo + EW_CHUNK;
  if (hi > w->plan->n) hi = w->plan->n;
  ew_walk(w->plan, lo, hi, w->fn, w->env);
}

KILN_UK_INLINE void ew_run(kiln_ctx *ctx, const ew_plan *p, ew_seg_fn fn, const void *env) {
  if (p->n < EW_PAR_MIN) {
    ew_walk(p, 0, p->n, fn, env);
    return;
  }
  ew_par w = {p, fn, env};
  kiln_rt_parallel_for(ctx, ew_par_task, &w, (p->n + EW_CHUNK - 1) / EW_CHUNK);
}

/* A contiguous same-shape plan (unary operators, Clip, Cast). */
static void ew_plan_flat(ew_plan *p, int64_t n, int64_t n_ops) {
  p->rank = 1;
  p->n = n;
  p->n_ops = n_ops;
  p->dims[0] = n > 0 ? n : 1;
  for (int64_t k = 0; k < n_ops; k++) p->str[k][0] = 1;
}

/* ------------------------------------------------------------------------------------------ */
/* Wide-domain loads and stores                                                               */
/* ------------------------------------------------------------------------------------------ */

#define EW_LD(T, DST, E)                                                                     \
  {                                                                                          \
    const T *q = (const T *)p + off;                                                         \
    if (step) {                                                                              \
      for (int64_t i = 0; i < n; i++) {                                                      \
        T x = q[i];                                                                          \
        DST[i] = (E);                                                                        \
      }                                                                                      \
    } else {                                                                                 \
      T x = q[0];                                                                            \
      __typeof__(DST[0]) v = (E);                                                            \
      for (int64_t i = 0; i < n; i++) DST[i] = v;                                            \
    }                                                                                        \
  }                                                                                          \
  break;

/* n elements of dtype dt from p[off] (step 0: one element repeated) as doubles. */
static void ld_d(double *d, const void *p, int64_t dt, int64_t off, int64_t step, int64_t n) {
  switch (dt) {
  case KILN_BOOL: EW_LD(uint8_t, d, (double)(x != 0))
  case KILN_U8: EW_LD(uint8_t, d, (double)x)
  case KILN_I8: EW_LD(int8_t, d, (double)x)
  case KILN_U16: EW_LD(uint16_t, d, (double)x)
  case KILN_I16: EW_LD(int16_t, d, (double)x)
  case KILN_U32: EW_LD(uint32_t, d, (double)x)
  case KILN_I32: EW_LD(int32_t, d, (double)x)
  case KILN_U64: EW_LD(uint64_t, d, (double)x)
  case KILN_I64: EW_LD(int64_t, d, (double)x)
  case KILN_F16: EW_LD(uint16_t, d, (double)kiln_f16_to_f32(x))
  case KILN_BF16: EW_LD(uint16_t, d, (double)kiln_bf16_to_f32(x))
  case KILN_F32: EW_LD(float, d, (double)x)
  default: EW_LD(double, d, x)
  }
}

/* Float to integer conversion as Rust's `as` (truncate, saturate, NaN to 0), as int64 bits. */
KILN_UK_INLINE int64_t ew_sat_i(double v, double lo, double hi) {
  double c = v < lo ? lo : v;
  c = c > hi ? hi : c;
  c = v != v ? 0.0 : c;
  return (int64_t)c;
}

KILN_UK_INLINE int64_t ew_sat_i64(double v) {
  int big = v >= 9223372036854775808.0;
  double c = v < -9223372036854775808.0 ? -9223372036854775808.0 : v;
  c = (big || v != v) ? 0.0 : c;
  int64_t r = (int64_t)c;
  return big ? INT64_MAX : r;
}

KILN_UK_INLINE uint64_t ew_sat_u64(double v) {
  int big = v >= 18446744073709551616.0;
  double c = (v > 0.0 && !big) ? v : 0.0; /* NaN and negatives give 0 */
  uint64_t r = (uint64_t)c;
  return big ? UINT64_MAX : r;
}

/* The value of v converted to dtype dt with cast semantics, as int64 bits (integer dt). */
KILN_UK_INLINE int64_t ew_sat_dt(double v, int64_t dt) {
  switch (dt) {
  case KILN_BOOL: return v != 0;
  case KILN_U8: return ew_sat_i(v, 0, 255);
  case KILN_I8: return ew_sat_i(v, -128, 127);
  case KILN_U16: return ew_sat_i(v, 0, 65535);
  case KILN_I16: return ew_sat_i(v, -32768, 32767);
  case KILN_U32: return ew_sat_i(v, 0, 4294967295.0);
  case KILN_I32: return ew_sat_i(v, -2147483648.0, 2147483647.0);
  case KILN_U64: return (int64_t)ew_sat_u64(v);
  default: return ew_sat_i64(v);
  }
}

#define EW_ST(T, E)                                                                          \
  {                                                                                          \
    T *q = (T *)p + off;                                                                     \
    for (int64_t i = 0; i < n; i++) {                                                        \
      double x = d[i];                                                                       \
      q[i] = (E);                                                                            \
    }                                                                                        \
  }                                                                                          \
  break;

/* Stores doubles as dtype dt with cast semantics (floats round, integers saturate). */
static void st_d(void *p, int64_t dt, int64_t off, const double *d, int64_t n) {
  switch (dt) {
  case KILN_BOOL: EW_ST(uint8_t, x != 0)
  case KILN_U8: EW_ST(uint8_t, (uint8_t)ew_sat_i(x, 0, 255))
  case KILN_I8: EW_ST(int8_t, (int8_t)ew_sat_i(x, -128, 127))
  case KILN_U16: EW_ST(uint16_t, (uint16_t)ew_sat_i(x, 0, 65535))
  case KILN_I16: EW_ST(int16_t, (int16_t)ew_sat_i(x, -32768, 32767))
  case KILN_U32: EW_ST(uint32_t, (uint32_t)ew_sat_i(x, 0, 4294967295.0))
  case KILN_I32: EW_ST(int32_t, (int32_t)ew_sat_i(x, -2147483648.0, 2147483647.0))
  case KILN_U64: EW_ST(uint64_t, ew_sat_u64(x))
  case KILN_I64: EW_ST(int64_t, ew_sat_i64(x))
  case KILN_F16: EW_ST(uint16_t, kiln_f32_to_f16((float)x))
  case KILN_BF16: EW_ST(uint16_t, kiln_f32_to_bf16((float)x))
  case KILN_F32: EW_ST(float, (float)x)
  default: EW_ST(double, x)
  }
}

/* n integer (or bool) elements as int64: sign- or zero-extended, u64 as its bits. Floating
   types (not reached by the integer operators) convert with saturation. */
static void ld_i(int64_t *d, const void *p, int64_t dt, int64_t off, int64_t step, int64_t n) {
  switch (dt) {
  case KILN_BOOL: EW_LD(uint8_t, d, (int64_t)(x != 0))
  case KILN_U8: EW_LD(uint8_t, d, (int64_t)x)
  case KILN_I8: EW_LD(int8_t, d, (int64_t)x)
  case KILN_U16: EW_LD(uint16_t, d, (int64_t)x)
  case KILN_I16: EW_LD(int16_t, d, (int64_t)x)
  case KILN_U32: EW_LD(uint32_t, d, (int64_t)x)
  case KILN_I32: EW_LD(int32_t, d, (int64_t)x)
  case KILN_U64: EW_LD(uint64_t, d, (int64_t)x)
  case KILN_I64: EW_LD(int64_t, d, x)
  case KILN_F16: EW_LD(uint16_t, d, ew_sat_i64(kiln_f16_to_f32(x)))
  case KILN_BF16: EW_LD(uint16_t, d, ew_sat_i64(kiln_bf16_to_f32(x)))
  case KILN_F32: EW_LD(float, d, ew_sat_i64(x))
  default: EW_LD(double, d, ew_sat_i64(x))
  }
}

#define EW_STI(T, E)                                                                         \
  {                                                                                          \
    T *q = (T *)p + off;                                                                     \
    for (int64_t i = 0; i < n; i++) {                                                        \
      int64_t x = d[i];                                                                      \
      q[i] = (E);                                                                            \
    }                                                                                        \
  }                                                                                          \
  break;

/* Stores int64 values truncated to dtype dt (wrapping); to bool as x != 0; to floating types
   as Rust's `as` (u64 read as unsigned). */
static void st_i(void *p, int64_t dt, int64_t off, const int64_t *d, int64_t n, int uns) {
  switch (dt) {
  case KILN_BOOL: EW_STI(uint8_t, x != 0)
  case KILN_U8: case KILN_I8: EW_STI(uint8_t, (uint8_t)x)
  case KILN_U16: case KILN_I16: EW_STI(uint16_t, (uint16_t)x)
  case KILN_U32: case KILN_I32: EW_STI(uint32_t, (uint32_t)x)
  case KILN_U64: case KILN_I64: EW_STI(int64_t, x)
  case KILN_F16: EW_STI(uint16_t, kiln_f32_to_f16(uns ? (float)(uint64_t)x : (float)x))
  case KILN_BF16: EW_STI(uint16_t, kiln_f32_to_bf16(uns ? (float)(uint64_t)x : (float)x))
  case KILN_F32: EW_STI(float, uns ? (float)(uint64_t)x : (float)x)
  default: EW_STI(double, uns ? (double)(uint64_t)x : (double)x)
  }
}

/* n f16/bf16 values (step 0: only the first is read and converted) widened to f32. */
static void ew_half_to_f32(float *d, const uint16_t *p, int64_t step, int64_t n, int bf) {
  int64_t m = step ? n : 1;
  if (bf)
    for (int64_t i = 0; i < m; i++) d[i] = kiln_bf16_to_f32(p[i]);
  else
    for (int64_t i = 0; i < m; i++) d[i] = kiln_f16_to_f32(p[i]);
}

static void ew_f32_to_half(uint16_t *p, const float *d, int64_t n, int bf) {
  if (bf)
    for (int64_t i = 0; i < n; i++) p[i] = kiln_f32_to_bf16(d[i]);
  else
    for (int64_t i = 0; i < n; i++) p[i] = kiln_f32_to_f16(d[i]);
}

/* ------------------------------------------------------------------------------------------ */
/* Unary                                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* ln(1 + e^x) for f32 without overflow; log1p(u) as log(1+u)·u/((1+u)-1) keeps tiny u exact. */
KILN_UK_INLINE float ew_softplusf(float x) {
  float e = kiln_expf(-(x < 0.0f ? -x : x));
  float u = 1.0f + e;
  float l1p = u == 1.0f ? e : kiln_logf(u) * e / (u - 1.0f);
  return (x > 0.0f ? x : 0.0f) + l1p;
}

/* x·tanh(softplus(x)) with one exponential: tanh(ln(1+e^x)) = n/(n+2), n = e^x(e^x+2). Past
   x = 20 the ratio is 1 in f32; clamping keeps n finite. */
KILN_UK_INLINE float ew_mishf(float x) {
  float e = kiln_expf(x > 20.0f ? 20.0f : x);
  float n = e * (e + 2.0f);
  return x * (n / (n + 2.0f));
}

KILN_UK_INLINE double ew_sigmoid(double x) {
  double e = __builtin_exp(-__builtin_fabs(x));
  double s = 1.0 / (1.0 + e);
  return x < 0.0 ? e * s : s;
}

KILN_UK_INLINE double ew_softplus(double x) {
  return (x > 0.0 ? x : 0.0) + __builtin_log1p(__builtin_exp(-__builtin_fabs(x)));
}

/* One case per real-valued unary operator: F is the f32 form, D the double form; x is the
   input, p0/p1 the operator's parameters. */
#define EW_REAL_UNARY(CASE)                                                                  \
  CASE(U_ABS, x < 0 ? -x : x, __builtin_fabs(x))                                             \
  CASE(U_NEG, -x, -x)                                                                        \
  CASE(U_FLOOR, __builtin_floorf(x), __builtin_floor(x))                                     \
  CASE(U_CEIL, __builtin_ceilf(x), __builtin_ceil(x))                                        \
  CASE(U_ROUND, __builtin_rintf(x), __builtin_rint(x))                                       \
  CASE(U_RECIPROCAL, 1.0f / x, 1.0 / x)                                                      \
  CASE(U_SIGN, x > 0 ? 1.0f : (x < 0 ? -1.0f : x), x > 0 ? 1.0 : (x < 0 ? -1.0 : x))         \
  CASE(U_SQRT, __builtin_sqrtf(x), __builtin_sqrt(x))                                        \
  CASE(U_EXP, kiln_expf(x), __builtin_exp(x))                                                \
  CASE(U_LOG, kiln_logf(x), __builtin_log(x))                                                \
  CASE(U_ERF, kiln_erff(x), __builtin_erf(x))                                                \
  CASE(U_TANH, kiln_tanhf(x), __builtin_tanh(x))                                             \
  CASE(U_SIGMOID, kiln_sigmoidf(x), ew_sigmoid(x))                                           \
  CASE(U_RELU, x < 0 ? 0.0f : x, x < 0 ? 0.0 : x)                                            \
  CASE(U_SIN, (float)__builtin_sin(x), __builtin_sin(x))                                     \
  CASE(U_COS, (float)__builtin_cos(x), __builtin_cos(x))                                     \
  CASE(U_TAN, (float)__builtin_tan(x), __builtin_tan(x))                                     \
  CASE(U_ASIN, (float)__builtin_asin(x), __builtin_asin(x))                                  \
  CASE(U_ACOS, (float)__builtin_acos(x), __builtin_acos(x))                                  \
  CASE(U_ATAN, (float)__builtin_atan(x), __builtin_atan(x))                                  \
  CASE(U_SINH, (float)__builtin_sinh(x), __builtin_sinh(x))                                  \
  CASE(U_COSH, (float)__builtin_cosh(x), __builtin_cosh(x))                                  \
  CASE(U_ASINH, (float)__builtin_asinh(x), __builtin_asinh(x))                               \
  CASE(U_ACOSH, (float)__builtin_acosh(x), __builtin_acosh(x))                               \
  CASE(U_ATANH, (float)__builtin_atanh(x), __builtin_atanh(x))                               \
  CASE(U_SOFTPLUS, ew_softplusf(x), ew_softplus(x))                                          \
  CASE(U_SOFTSIGN, x / (1.0f + (x < 0 ? -x : x)), x / (1.0 + __builtin_fabs(x)))             \
  CASE(U_MISH, ew_mishf(x), x * __builtin_tanh(ew_softplus(x)))          \
  CASE(U_HARDSWISH, x * ew_clamp01f((x + 3.0f) * (1.0f / 6.0f)), x * ew_clamp01(x / 6.0 + 0.5)) \
  CASE(U_LEAKY_RELU, x < 0 ? p0 * x : x, x < 0 ? p0 * x : x)                                 \
  CASE(U_ELU, x < 0 ? p0 * kiln_expm1f(x) : x, x < 0 ? p0 * __builtin_expm1(x) : x)   \
  CASE(U_SELU, x > 0 ? p1 * x : p1 * p0 * kiln_expm1f(x),                             \
       x > 0 ? p1 * x : p1 * p0 * __builtin_expm1(x))                                        \
  CASE(U_CELU, x > 0 ? x : p0 * kiln_expm1f(x / p0),                                  \
       x > 0 ? x : p0 * __builtin_expm1(x / p0))                                             \
  CASE(U_HARD_SIGMOID, ew_clamp01f(p0 * x + p1), ew_clamp01(p0 * x + p1))                    \
  CASE(U_THRESHOLDED_RELU, x > p0 ? x : 0.0f, x > p0 ? x : 0.0)                              \
  CASE(U_GELU_ERF, kiln_gelu_erff(x),                                                        \
       0.5 * x * __builtin_erfc(x * -0.70710678118654752))                                   \
  CASE(U_GELU_TANH, /* 1 + tanh(u) = 2·sigmoid(2u), without the cancellation */            \
       x * kiln_sigmoidf(1.5957691216057307f * (x + 0.044715f * x * x * x)),   \
       0.5 * x * (1.0 + __builtin_tanh(0.79788456080286536 * (x + 0.044715 * x * x * x))))   \
  CASE(U_SHRINK, x < -p1 ? x + p0 : (x > p1 ? x - p0 : 0.0f),                                \
       x < -p1 ? x + p0 : (x > p1 ? x - p0 : 0.0))                                           \
  CASE(U_SWISH, x * kiln_sigmoidf(p0 * x), x * ew_sigmoid(p0 * x))

/* clamp to [0, 1] keeping NaN */
KILN_UK_INLINE float ew_clamp01f(float v) {
  v = v < 0.0f ? 0.0f : v;
  return v > 1.0f ? 1.0f : v;
}
KILN_UK_INLINE double ew_clamp01(double v) {
  v = v < 0.0 ? 0.0 : v;
  return v > 1.0 ? 1.0 : v;
}

typedef struct ew_unary_env {
  const kiln_uk_args *a;
  int64_t op;
  double p0, p1;
  int64_t pos, neg; /* IsInf */
} ew_unary_env;

static void ew_unary_f32_loop(const ew_unary_env *env, const float *in, float *out, int64_t n) {
  float p0 = (float)env->p0, p1 = (float)env->p1;
  (void)p1;
  switch (env->op) {
#define EW_F32_CASE(OP, F, D)                                                                \
  case OP:                                                                                   \
    for (int64_t i = 0; i < n; i++) {                                                        \
      float x = in[i];                                                                       \
      out[i] = (F);                                                                          \
    }                                                                                        \
    break;
    EW_REAL_UNARY(EW_F32_CASE)
#undef EW_F32_CASE
  default: break;
  }
}

static void ew_unary_f32_seg(const void *envp, const ew_seg *s) {
  const ew_unary_env *env = (const ew_unary_env *)envp;
  const float *in = (const float *)env->a->in[0].data + s->off[0];
  float *out = (float *)env->a->out[0].data + s->o;
  ew_unary_f32_loop(env, in, out, s->len);
}

/* f16 and bf16 (bf16 autocast makes these hot): blocks widened to f32, computed by the f32
   loops, rounded back once. */
static void ew_unary_half_seg(const void *envp, const ew_seg *s) {
  const ew_unary_env *env = (const ew_unary_env *)envp;
  const uint16_t *in = (const uint16_t *)env->a->in[0].data + s->off[0];
  uint16_t *out = (uint16_t *)env->a->out[0].data + s->o;
  int bf = env->a->in[0].dtype == KILN_BF16;
  float buf[EW_BLK];
  for (int64_t b = 0; b < s->len; b += EW_BLK) {
    int64_t n = s->len - b < EW_BLK ? s->len - b : EW_BLK;
    ew_half_to_f32(buf, in + b, 1, n, bf);
    ew_unary_f32_loop(env, buf, buf, n);
    ew_f32_to_half(out + b, buf, n, bf);
  }
}

/* Unary operators computed in double (f16, bf16, f64, and integer Erf/Shrink). */
static void ew_unary_d_block(int64_t op, double *v, int64_t n, double p0, double p1) {
  (void)p1;
  switch (op) {
#define EW_D_CASE(OP, F, D)                                                                  \
  case OP:                                                                                   \
    for (int64_t i = 0; i < n; i++) {                                                        \
      double x = v[i];                                                                       \
      v[i] = (D);                                                                            \
    }                                                                                        \
    break;
    EW_REAL_UNARY(EW_D_CASE)
#undef EW_D_CASE
  default: break;
  }
}

/* Unary operators on integers (and bool Not), wrapping like fixed-width machine integers. */
static void ew_unary_i_block(int64_t op, int64_t *v, int64_t n, int uns) {
  switch (op) {
  case U_ABS:
    if (!uns)
      for (int64_t i = 0; i < n; i++) v[i] = v[i] < 0 ? (int64_t)(0 - (uint64_t)v[i]) : v[i];
    break;
  case U_NEG:
    for (int64_t i = 0; i < n; i++) v[i] = (int64_t)(0 - (uint64_t)v[i]);
    break;
  case U_SIGN:
    for (int64_t i = 0; i < n; i++) v[i] = uns ? v[i] != 0 : (v[i] > 0) - (v[i] < 0);
    break;
  case U_RELU:
    for (int64_t i = 0; i < n; i++) v[i] = v[i] < 0 && !uns ? 0 : v[i];
    break;
  case U_NOT:
    for (int64_t i = 0; i < n; i++) v[i] = !v[i];
    break;
  case U_BITWISE_NOT:
    for (int64_t i = 0; i < n; i++) v[i] = ~v[i];
    break;
  default: break;
  }
}

static void ew_unary_generic_seg(const void *envp, const ew_seg *s) {
  const ew_unary_env *env = (const ew_unary_env *)envp;
  const kiln_tensor *x = &env->a->in[0], *y = &env->a->out[0];
  int64_t op = env->op;
  int is_float = kiln_dtype_is_float(x->dtype);
  int int_op = op == U_ABS || op == U_NEG || op == U_SIGN || op == U_RELU || op == U_NOT ||
               op == U_BITWISE_NOT;
  double dv[EW_BLK];
  int64_t iv[EW_BLK];
  for (int64_t b = 0; b < s->len; b += EW_BLK) {
    int64_t n = s->len - b < EW_BLK ? s->len - b : EW_BLK;
    int64_t xo = s->off[0] + b, yo = s->o + b;
    if (op == U_ISNAN || op == U_ISINF) {
      ld_d(dv, x->data, x->dtype, xo, 1, n);
      uint8_t *q = (uint8_t *)y->data + yo;
      if (op == U_ISNAN) {
        for (int64_t i = 0; i < n; i++) q[i] = dv[i] != dv[i];
      } else {
        int pos = (int)env->pos, neg = (int)env->neg;
        for (int64_t i = 0; i < n; i++)
          q[i] = (pos && dv[i] == __builtin_inf()) || (neg && dv[i] == -__builtin_inf());
      }
    } else if (!is_float && int_op) {
      ld_i(iv, x->data, x->dtype, xo, 1, n);
      ew_unary_i_block(op, iv, n, x->dtype == KILN_U64);
      st_i(y->data, y->dtype, yo, iv, n, 0);
    } else {
      ld_d(dv, x->data, x->dtype, xo, 1, n);
      ew_unary_d_block(op, dv, n, env->p0, env->p1);
      st_d(y->data, y->dtype, yo, dv, n);
    }
  }
}

int32_t kiln_uk_ew_unary(const kiln_uk_args *a) {
  ew_unary_env env = {a, a->iattr[0], a->fattr[0], a->fattr[1], a->iattr[1], a->iattr[2]};
  ew_plan p;
  ew_plan_flat(&p, a->out[0].numel, 1);
  if (p.n == 0) return KILN_UK_OK;
  int64_t op = env.op;
  int64_t dt = a->in[0].dtype;
  int real = op != U_NOT && op != U_BITWISE_NOT && op != U_ISNAN && op != U_ISINF;
  ew_seg_fn fn = ew_unary_generic_seg;
  if (real && dt == KILN_F32) fn = ew_unary_f32_seg;
  if (real && (dt == KILN_BF16 || dt == KILN_F16)) fn = ew_unary_half_seg;
  ew_run(a->ctx, &p, fn, &env);
  return KILN_UK_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Binary                                                                                     */
/* ------------------------------------------------------------------------------------------ */

typedef struct ew_binary_env {
  const kiln_uk_args *a;
  int64_t op;
} ew_binary_env;

/* Loops of one f32 operator over a run, specialised for the operands' steps so each is a
   plain vectorisable loop (same shape, scalar on either side, or both repeated). */
#define EW_F32_BIN(EXPR)                                                                     \
  if (sa && sb) {                                                                            \
    for (int64_t i = 0; i < n; i++) {                                                        \
      float x = pa[i], y = pb[i];                                                            \
      o[i] = (EXPR);                                                                         \
    }                                                                                        \
  } else if (sa) {                                                                           \
    float y = pb[0];                                                                         \
    for (int64_t i = 0; i < n; i++) {                                                        \
      float x = pa[i];                                                                       \
      o[i] = (EXPR);                                                                         \
    }                                                                                        \
  } else if (sb) {                                                                           \
    float x = pa[0];                                                                         \
    for (int64_t i = 0; i < n; i++) {                                                        \
      float y = pb[i];                                                                       \
      o[i] = (EXPR);                                                                         \
    }                                                                                        \
  } else {                                                                                   \
    float x = pa[0], y = pb[0];                                                              \
    float r = (EXPR);                                                                        \
    for (int64_t i = 0; i < n; i++) o[i] = r;                                                \
  }                                                                                          \
  break;

static void ew_binary_f32_loop(int64_t op, float *o, const float *pa, int64_t sa,
                               const float *pb, int64_t sb, int64_t n) {
  switch (op) {
  case B_ADD: EW_F32_BIN(x + y)
  case B_SUB: EW_F32_BIN(x - y)
  case B_MUL: EW_F32_BIN(x * y)
  case B_DIV: EW_F32_BIN(x / y)
  case B_MIN: EW_F32_BIN((x != x || y != y) ? x + y : (y < x ? y : x))
  case B_MAX: EW_F32_BIN((x != x || y != y) ? x + y : (y > x ? y : x))
  case B_PRELU: EW_F32_BIN(x < 0 ? y * x : x)
  default: break;
  }
}

static void ew_binary_f32_seg(const void *envp, const ew_seg *s) {
  const ew_binary_env *env = (const ew_binary_env *)envp;
  const kiln_uk_args *a = env->a;
  ew_binary_f32_loop(env->op, (float *)a->out[0].data + s->o,
                     (const float *)a->in[0].data + s->off[0], s->step[0],
                     (const float *)a->in[1].data + s->off[1], s->step[1], s->len);
}

static void ew_binary_half_seg(const void *envp, const ew_seg *s) {
  const ew_binary_env *env = (const ew_binary_env *)envp;
  const kiln_uk_args *a = env->a;
  int bf = a->in[0].dtype == KILN_BF16;
  const uint16_t *pa = (const uint16_t *)a->in[0].data + s->off[0];
  const uint16_t *pb = (const uint16_t *)a->in[1].data + s->off[1];
  uint16_t *o = (uint16_t *)a->out[0].data + s->o;
  int64_t sa = s->step[0], sb = s->step[1];
  float ba[EW_BLK], bb[EW_BLK];
  for (int64_t b = 0; b < s->len; b += EW_BLK) {
    int64_t n = s->len - b < EW_BLK ? s->len - b : EW_BLK;
    ew_half_to_f32(ba, pa + b * sa, sa, n, bf);
    ew_half_to_f32(bb, pb + b * sb, sb, n, bf);
    ew_binary_f32_loop(env->op, ba, ba, sa, bb, sb, n);
    ew_f32_to_half(o + b, ba, n, bf);
  }
}

/* Binary operators in double. r may alias x. */
static void ew_binary_d_block(int64_t op, double *r, const double *x, const double *y,
                              int64_t n) {
  switch (op) {
#define EW_D2(OP, EXPR)                                                                      \
  case OP:                                                                                   \
    for (int64_t i = 0; i < n; i++) {                                                        \
      double p = x[i], q = y[i];                                                             \
      r[i] = (EXPR);                                                                         \
    }                                                                                        \
    break;
    EW_D2(B_ADD, p + q)
    EW_D2(B_SUB, p - q)
    EW_D2(B_MUL, p * q)
    EW_D2(B_DIV, p / q)
    EW_D2(B_POW, __builtin_pow(p, q))
    EW_D2(B_FMOD, __builtin_fmod(p, q))
    EW_D2(B_MIN, (p != p || q != q) ? p + q : (q < p ? q : p))
    EW_D2(B_MAX, (p != p || q != q) ? p + q : (q > p ? q : p))
    EW_D2(B_PRELU, p < 0 ? q * p : p)
    EW_D2(B_EQ, p == q)
    EW_D2(B_LT, p < q)
    EW_D2(B_LE, p <= q)
    EW_D2(B_GT, p > q)
    EW_D2(B_GE, p >= q)
#undef EW_D2
  case B_MOD: /* sign of the divisor (numpy); a zero result takes the divisor's sign */
    for (int64_t i = 0; i < n; i++) {
      double p = x[i], q = y[i];
      double m = __builtin_fmod(p, q);
      m = m == 0.0 ? __builtin_copysign(0.0, q) : ((m < 0) != (q < 0) ? m + q : m);
      r[i] = m;
    }
    break;
  default: break;
  }
}

/* x^e for integers: wrapping for e >= 0; a negative exponent is evaluated in double and
   converted back with saturation (as onnxruntime does). */
KILN_UK_INLINE int64_t ew_ipow(int64_t x, int64_t e, int uns, int64_t dt) {
  if (e < 0) {
    double b = uns ? (double)(uint64_t)x : (double)x;
    return ew_sat_dt(__builtin_pow(b, (double)e), dt);
  }
  uint64_t base = (uint64_t)x, acc = 1, k = (uint64_t)e;
  while (k) {
    if (k & 1) acc *= base;
    base *= base;
    k >>= 1;
  }
  return (int64_t)acc;
}

/* Binary operators on int64 values of dtype dt (bits wide; uns: u64, compared unsigned).
   Narrower types are exact in int64 and wrap when stored. r may alias x. */
static void ew_binary_i_block(int64_t op, int64_t *r, const int64_t *x, const int64_t *y,
                              int64_t n, int uns, int64_t bits, int64_t dt) {
  switch (op) {
#define EW_I2(OP, EXPR)                                                                      \
  case OP:                                                                                   \
    for (int64_t i = 0; i < n; i++) {                                                        \
      int64_t p = x[i], q = y[i];                                                            \
      uint64_t up = (uint64_t)p, uq = (uint64_t)q;                                           \
      (void)up;                                                                              \
      (void)uq;                                                                              \
      r[i] = (int64_t)(EXPR);                                                                \
    }                                                                                        \
    break;
    EW_I2(B_ADD, up + uq)
    EW_I2(B_SUB, up - uq)
    EW_I2(B_MUL, up * uq)
    EW_I2(B_DIV, q == 0 ? 0 : (uns ? up / uq : (q == -1 ? 0 - up : (uint64_t)(p / q))))
    EW_I2(B_FMOD, q == 0 ? 0 : (uns ? up % uq : (q == -1 ? 0 : (uint64_t)(p % q))))
    EW_I2(B_MIN, uns ? (uq < up ? uq : up) : (uint64_t)(q < p ? q : p))
    EW_I2(B_MAX, uns ? (uq > up ? uq : up) : (uint64_t)(q > p ? q : p))
    EW_I2(B_EQ, p == q)
    EW_I2(B_LT, uns ? up < uq : p < q)
    EW_I2(B_LE, uns ? up <= uq : p <= q)
    EW_I2(B_GT, uns ? up > uq : p > q)
    EW_I2(B_GE, uns ? up >= uq : p >= q)
    EW_I2(B_AND, (p != 0) & (q != 0))
    EW_I2(B_OR, (p != 0) | (q != 0))
    EW_I2(B_XOR, (p != 0) ^ (q != 0))
    EW_I2(B_BITAND, up & uq)
    EW_I2(B_BITOR, up | uq)
    EW_I2(B_BITXOR, up ^ uq)
    EW_I2(B_SHL, (q >= 0 && q < bits) ? up << q : 0)
    EW_I2(B_SHR, (q >= 0 && q < bits) ? (uns ? up >> q : (uint64_t)(p >> q))
                                      : (!uns && p < 0 ? (uint64_t)-1 : 0))
    EW_I2(B_PRELU, (!uns && p < 0) ? up * uq : up)
    EW_I2(B_POW, ew_ipow(p, q, uns, dt))
#undef EW_I2
  case B_MOD: /* sign of the divisor (Python %) */
    for (int64_t i = 0; i < n; i++) {
      int64_t p = x[i], q = y[i];
      int64_t m;
      if (uns) {
        m = q == 0 ? 0 : (int64_t)((uint64_t)p % (uint64_t)q);
      } else {
        m = (q == 0 || q == -1) ? 0 : p % q;
        m = (m != 0 && ((m < 0) != (q < 0))) ? (int64_t)((uint64_t)m + (uint64_t)q) : m;
      }
      r[i] = m;
    }
    break;
  default: break;
  }
}

KILN_UK_INLINE int ew_is_cmp(int64_t op) { return op >= B_EQ && op <= B_GE; }

static void ew_binary_generic_seg(const void *envp, const ew_seg *s) {
  const ew_binary_env *env = (const ew_binary_env *)envp;
  const kiln_tensor *x = &env->a->in[0], *y = &env->a->in[1], *z = &env->a->out[0];
  int64_t op = env->op;
  int xf = kiln_dtype_is_float(x->dtype), yf = kiln_dtype_is_float(y->dtype);
  /* Floating operands compute in double; so does an integer base with a floating exponent. */
  int dbl = xf || (op == B_POW && yf);
  int uns = x->dtype == KILN_U64;
  int64_t bits = 8 * (int64_t)kiln_dtype_size(x->dtype);
  double dx[EW_BLK], dy[EW_BLK];
  int64_t ix[EW_BLK], iy[EW_BLK];
  for (int64_t b = 0; b < s->len; b += EW_BLK) {
    int64_t n = s->len - b < EW_BLK ? s->len - b : EW_BLK;
    int64_t xo = s->off[0] + b * s->step[0], yo = s->off[1] + b * s->step[1], zo = s->o + b;
    if (dbl) {
      ld_d(dx, x->data, x->dtype, xo, s->step[0], n);
      ld_d(dy, y->data, y->dtype, yo, s->step[1], n);
      ew_binary_d_block(op, dx, dx, dy, n);
      st_d(z->data, z->dtype, zo, dx, n);
    } else {
      ld_i(ix, x->data, x->dtype, xo, s->step[0], n);
      ld_i(iy, y->data, y->dtype, yo, s->step[1], n);
      ew_binary_i_block(op, ix, ix, iy, n, uns, bits, x->dtype);
      st_i(z->data, z->dtype, zo, ix, n, uns && !ew_is_cmp(op));
    }
  }
}

/* x^y for f32 with a scalar exponent: the common small exponents without pow(). Returns 0
   when the exponent is not one of them. */
static int ew_pow_f32_scalar(const kiln_uk_args *a) {
  const kiln_tensor *x = &a->in[0], *y = &a->in[1];
  if (x->dtype != KILN_F32 || y->numel != 1 || a->out[0].numel != x->numel) return 0;
  double e = kiln_load_f64(y->data, y->dtype, 0);
  const float *p = (const float *)x->data;
  float *o = (float *)a->out[0].data;
  int64_t n = x->numel;
  if (e == 2.0) {
    for (int64_t i = 0; i < n; i++) o[i] = p[i] * p[i];
  } else if (e == 1.0) {
    for (int64_t i = 0; i < n; i++) o[i] = p[i];
  } else if (e == 3.0) {
    for (int64_t i = 0; i < n; i++) o[i] = p[i] * p[i] * p[i];
  } else if (e == 0.5) {
    /* pow(-0, 0.5) = +0 and pow(-inf, 0.5) = +inf, where sqrt differs */
    for (int64_t i = 0; i < n; i++) {
      float v = __builtin_sqrtf(p[i]);
      v = p[i] == 0.0f ? 0.0f : v;
      o[i] = p[i] == -__builtin_inff() ? __builtin_inff() : v;
    }
  } else {
    return 0;
  }
  return 1;
}

int32_t kiln_uk_ew_binary(const kiln_uk_args *a) {
  ew_binary_env env = {a, a->iattr[0]};
  const kiln_tensor *ops[2] = {&a->in[0], &a->in[1]};
  ew_plan p;
  if (ew_make_plan(&p, &a->out[0], ops, 2))
    return kiln_uk_fail(a, KILN_UK_EVALUE, "elementwise: rank %lld is too large",
                        (long long)a->out[0].rank);
  if (p.n == 0) return KILN_UK_OK;
  int64_t op = env.op;
  if (op == B_POW && ew_pow_f32_scalar(a)) return KILN_UK_OK;
  int64_t dt = a->in[0].dtype;
  int f32op = op == B_ADD || op == B_SUB || op == B_MUL || op == B_DIV || op == B_MIN ||
              op == B_MAX || op == B_PRELU;
  ew_seg_fn fn = ew_binary_generic_seg;
  if (f32op && dt == a->in[1].dtype && dt == KILN_F32) fn = ew_binary_f32_seg;
  if (f32op && dt == a->in[1].dtype && (dt == KILN_BF16 || dt == KILN_F16)) fn = ew_binary_half_seg;
  ew_run(a->ctx, &p, fn, &env);
  return KILN_UK_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Where                                                                                      */
/* ------------------------------------------------------------------------------------------ */

#define EW_SEL(T)                                                                            \
  {                                                                                          \
    const T *px = (const T *)a->in[1].data + s->off[1];                                      \
    const T *py = (const T *)a->in[2].data + s->off[2];                                      \
    T *o = (T *)a->out[0].data + s->o;                                                       \
    int64_t sx = s->step[1], sy = s->step[2];                                                \
    if (sc && sx && sy) {                                                                    \
      for (int64_t i = 0; i < n; i++) o[i] = pc[i] ? px[i] : py[i];                          \
    } else if (sx && sy) {                                                                   \
      if (pc[0]) for (int64_t i = 0; i < n; i++) o[i] = px[i];                               \
      else for (int64_t i = 0; i < n; i++) o[i] = py[i];                                     \
    } else {                                                                                 \
      for (int64_t i = 0; i < n; i++) o[i] = pc[i * sc] ? px[i * sx] : py[i * sy];           \
    }                                                                                        \
  }                                                                                          \
  break;

static void ew_where_seg(const void *envp, const ew_seg *s) {
  const kiln_uk_args *a = (const kiln_uk_args *)envp;
  const uint8_t *pc = (const uint8_t *)a->in[0].data + s->off[0];
  int64_t n = s->len, sc = s->step[0];
  switch (kiln_dtype_size(a->out[0].dtype)) {
  case 1: EW_SEL(uint8_t)
  case 2: EW_SEL(uint16_t)
  case 4: EW_SEL(uint32_t)
  default: EW_SEL(uint64_t)
  }
}

int32_t kiln_uk_ew_where(const kiln_uk_args *a) {
  const kiln_tensor *ops[3] = {&a->in[0], &a->in[1], &a->in[2]};
  ew_plan p;
  if (ew_make_plan(&p, &a->out[0], ops, 3))
    return kiln_uk_fail(a, KILN_UK_EVALUE, "Where: rank %lld is too large",
                        (long long)a->out[0].rank);
  if (p.n == 0) return KILN_UK_OK;
  ew_run(a->ctx, &p, ew_where_seg, a);
  return KILN_UK_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Clip                                                                                       */
/* ------------------------------------------------------------------------------------------ */

typedef struct ew_clip_env {
  const kiln_uk_args *a;
  double lo, hi;         /* floating types: absent bounds are ∓inf */
  int64_t ilo, ihi;      /* integer types */
  int has_lo, has_hi;
} ew_clip_env;

static void ew_clip_seg(const void *envp, const ew_seg *s) {
  const ew_clip_env *env = (const ew_clip_env *)envp;
  const kiln_tensor *x = &env->a->in[0], *y = &env->a->out[0];
  int64_t n = s->len;
  if (x->dtype == KILN_F32) {
    const float *p = (const float *)x->data + s->off[0];
    float *o = (float *)y->data + s->o;
    float lo = (float)env->lo, hi = (float)env->hi;
    /* min(max(x, lo), hi) with NaN kept: when lo > hi everything becomes hi */
    for (int64_t i = 0; i < n; i++) {
      float v = p[i];
      v = v < lo ? lo : v;
      o[i] = v > hi ? hi : v;
    }
    return;
  }
  int is_float = kiln_dtype_is_float(x->dtype), uns = x->dtype == KILN_U64;
  double dv[EW_BLK];
  int64_t iv[EW_BLK];
  for (int64_t b = 0; b < n; b += EW_BLK) {
    int64_t m = n - b < EW_BLK ? n - b : EW_BLK;
    if (is_float) {
      ld_d(dv, x->data, x->dtype, s->off[0] + b, 1, m);
      for (int64_t i = 0; i < m; i++) {
        double v = dv[i];
        v = v < env->lo ? env->lo : v;
        dv[i] = v > env->hi ? env->hi : v;
      }
      st_d(y->data, y->dtype, s->o + b, dv, m);
    } else {
      ld_i(iv, x->data, x->dtype, s->off[0] + b, 1, m);
      for (int64_t i = 0; i < m; i++) {
        int64_t v = iv[i];
        if (uns) {
          if (env->has_lo && (uint64_t)v < (uint64_t)env->ilo) v = env->ilo;
          if (env->has_hi && (uint64_t)v > (uint64_t)env->ihi) v = env->ihi;
        } else {
          if (env->has_lo && v < env->ilo) v = env->ilo;
          if (env->has_hi && v > env->ihi) v = env->ihi;
        }
        iv[i] = v;
      }
      st_i(y->data, y->dtype, s->o + b, iv, m, 0);
    }
  }
}

int32_t kiln_uk_ew_clip(const kiln_uk_args *a) {
  ew_clip_env env = {a, -__builtin_inf(), __builtin_inf(), 0, 0, 0, 0};
  const kiln_tensor *x = &a->in[0];
  for (int k = 1; k <= 2 && k < a->n_in; k++) {
    const kiln_tensor *t = &a->in[k];
    if (!t->data) continue;
    double v = kiln_load_f64(t->data, t->dtype, 0);
    int64_t iv;
    ld_i(&iv, t->data, t->dtype, 0, 1, 1);
    if (k == 1) {
      env.lo = v;
      env.ilo = iv;
      env.has_lo = 1;
    } else {
      env.hi = v;
      env.ihi = iv;
      env.has_hi = 1;
    }
  }
  ew_plan p;
  ew_plan_flat(&p, x->numel, 1);
  if (p.n == 0) return KILN_UK_OK;
  ew_run(a->ctx, &p, ew_clip_seg, &env);
  return KILN_UK_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Cast                                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* ONNX Cast as ir::Element::cast_from: to f32 in one rounding from any type; through double
   when either side is floating or the source is bool (float to integer saturates); integer
   to integer keeps the low bits. */
static void ew_cast_seg(const void *envp, const ew_seg *s) {
  const kiln_uk_args *a = (const kiln_uk_args *)envp;
  const kiln_tensor *x = &a->in[0], *y = &a->out[0];
  int64_t sdt = x->dtype, ddt = y->dtype, n = s->len;
  if (sdt == ddt) {
    int64_t es = kiln_dtype_size(sdt);
    __builtin_memcpy((char *)y->data + s->o * es, (const char *)x->data + s->off[0] * es,
                     (size_t)(n * es));
    return;
  }
  /* The common conversions of real models, as direct loops. */
  if (sdt == KILN_F32 && ddt == KILN_BF16) {
    const float *p = (const float *)x->data + s->off[0];
    uint16_t *o = (uint16_t *)y->data + s->o;
    for (int64_t i = 0; i < n; i++) o[i] = kiln_f32_to_bf16(p[i]);
    return;
  }
  if (sdt == KILN_BF16 && ddt == KILN_F32) {
    const uint16_t *p = (const uint16_t *)x->data + s->off[0];
    float *o = (float *)y->data + s->o;
    for (int64_t i = 0; i < n; i++) o[i] = kiln_bf16_to_f32(p[i]);
    return;
  }
  if (sdt == KILN_I64 && ddt == KILN_F32) {
    const int64_t *p = (const int64_t *)x->data + s->off[0];
    float *o = (float *)y->data + s->o;
    for (int64_t i = 0; i < n; i++) o[i] = (float)p[i];
    return;
  }
  if (sdt == KILN_BOOL && ddt == KILN_F32) {
    const uint8_t *p = (const uint8_t *)x->data + s->off[0];
    float *o = (float *)y->data + s->o;
    for (int64_t i = 0; i < n; i++) o[i] = p[i] != 0 ? 1.0f : 0.0f;
    return;
  }
  int sf = kiln_dtype_is_float(sdt), df = kiln_dtype_is_float(ddt);
  double dv[EW_BLK];
  int64_t iv[EW_BLK];
  for (int64_t b = 0; b < n; b += EW_BLK) {
    int64_t m = n - b < EW_BLK ? n - b : EW_BLK;
    int64_t xo = s->off[0] + b, yo = s->o + b;
    if (ddt == KILN_F32 && !sf) {
      /* integers to f32 in a single rounding (through double a 64-bit integer would round
         twice) */
      ld_i(iv, x->data, sdt, xo, 1, m);
      st_i(y->data, ddt, yo, iv, m, sdt == KILN_U64);
    } else if (sf || df || sdt == KILN_BOOL) {
      ld_d(dv, x->data, sdt, xo, 1, m);
      st_d(y->data, ddt, yo, dv, m);
    } else {
      ld_i(iv, x->data, sdt, xo, 1, m);
      st_i(y->data, ddt, yo, iv, m, 0);
    }
  }
}

int32_t kiln_uk_ew_cast(const kiln_uk_args *a) {
  ew_plan p;
  ew_plan_flat(&p, a->out[0].numel, 1);
  if (p.n == 0) return KILN_UK_OK;
  ew_run(a->ctx, &p, ew_cast_seg, a);
  return KILN_UK_OK;
}
