/*
 * Micro-kernels for the reduce family: Reduce*, ArgMax/ArgMin, TopK, CumSum/CumProd, the
 * softmax family, the normalizations (Batch/Layer/Instance/Group/Lp/MeanVariance/RMS), LRN
 * and the two losses. See kiln_uk.h for the contract; codegen/src/uk/reduce.rs packs the
 * attributes in the order each kernel's comment gives.
 *
 * Numerics follow kiln_ir (ir/src/ops/reduce.rs, norm.rs, misc.rs): statistics and results are
 * computed in double and rounded once. The exceptions are the f32 fast paths of the hot
 * operators (softmax and layer/RMS normalization over contiguous rows), which compute in float
 * with several partial accumulators: well inside the f32 tolerance, and vectorizable.
 *
 * Every generic body takes the dtype as a parameter and is always inlined into one wrapper per
 * dtype (DEF_*_TASKS), so the dtype switches in kiln_load_f64/kiln_store_f64 fold away and
 * the loops specialise per element type.
 */
#include "kiln_uk.h"
#include "kiln_uk_ops.h" /* K_*, SM_*, LOSS_* codes, generated from codegen/src/uk/codes.rs */
#include <float.h>

#define R_INF __builtin_inf()

/* ---------------------------------------------------------------------------------------------
 * Shared helpers
 * ------------------------------------------------------------------------------------------- */

/* Splits `units` independent pieces of work into tasks of about 64K elements each. */
KILN_UK_INLINE int64_t task_count(int64_t units, int64_t elems_per_unit) {
  if (units <= 1) return units < 1 ? 0 : 1;
  if (elems_per_unit < 1) elems_per_unit = 1;
  int64_t n = units * elems_per_unit / 65536;
  if (n > units) n = units;
  if (n > 1024) n = 1024;
  return n < 1 ? 1 : n;
}

KILN_UK_INLINE int64_t task_lo(int64_t t, int64_t n_tasks, int64_t units) {
  return t * units / n_tasks;
}

/* One task runs on the calling thread: no need to wake the pool. */
static void run_tasks(kiln_ctx *ctx, kiln_task_fn fn, void *job, int64_t n) {
  if (n == 1)
    fn(job, 0, 0);
  else if (n > 1)
    kiln_rt_parallel_for(ctx, fn, job, n);
}

/* Wrappers fixing the dtype of an always-inlined body(void *job, int64_t task, int64_t dt). */
#define DEF_TASK(body, sfx, DT)                                                                  \
  static void body##_##sfx(void *job, int64_t t, int64_t tid) {                                \
    (void)tid;                                                                                   \
    body(job, t, DT);                                                                            \
  }

#define DEF_FLOAT_TASKS(body)                                                                    \
  DEF_TASK(body, f32, KILN_F32)                                                                  \
  DEF_TASK(body, f64, KILN_F64)                                                                  \
  DEF_TASK(body, f16, KILN_F16)                                                                  \
  DEF_TASK(body, bf16, KILN_BF16)                                                                \
  static kiln_task_fn body##_for(int64_t dt) {                                                   \
    switch (dt) {                                                                                \
    case KILN_F32: return body##_f32;                                                            \
    case KILN_F64: return body##_f64;                                                            \
    case KILN_F16: return body##_f16;                                                            \
    default: return body##_bf16;                                                                 \
    }                                                                                            \
  }

/* `F(DT)` with the dtype as a literal (F returns), so each case specialises its loops. */
#define DISPATCH_FLOAT(dt, F)                                                                    \
  switch (dt) {                                                                                  \
  case KILN_F32: F(KILN_F32);                                                                    \
  case KILN_F64: F(KILN_F64);                                                                    \
  case KILN_F16: F(KILN_F16);                                                                    \
  default: F(KILN_BF16);                                                                         \
  }

#define DISPATCH_ALL(dt, F)                                                                      \
  switch (dt) {                                                                                  \
  case KILN_BOOL: F(KILN_BOOL);                                                                  \
  case KILN_U8: F(KILN_U8);                                                                      \
  case KILN_I8: F(KILN_I8);                                                                      \
  case KILN_U16: F(KILN_U16);                                                                    \
  case KILN_I16: F(KILN_I16);                                                                    \
  case KILN_U32: F(KILN_U32);                                                                    \
  case KILN_I32: F(KILN_I32);                                                                    \
  case KILN_U64: F(KILN_U64);                                                                    \
  case KILN_I64: F(KILN_I64);                                                                    \
  default: DISPATCH_FLOAT(dt, F)                                                                 \
  }

KILN_UK_INLINE double ld(const void *p, int64_t dt, int64_t i) { return kiln_load_f64(p, dt, i); }
KILN_UK_INLINE void st(void *p, int64_t dt, int64_t i, double v) { kiln_store_f64(p, dt, i, v); }

KILN_UK_INLINE int is_unsigned(int64_t dt) {
  return dt == KILN_BOOL || dt == KILN_U8 || dt == KILN_U16 || dt == KILN_U32 || dt == KILN_U64;
}

/* Integers as order-preserving int64 keys: u64 needs its sign bit flipped to compare signed. */
KILN_UK_INLINE int64_t ikey(const void *p, int64_t dt, int64_t i) {
  int64_t v = kiln_load_i64(p, dt, i);
  return dt == KILN_U64 ? (int64_t)((uint64_t)v ^ 0x8000000000000000ull) : v;
}

KILN_UK_INLINE int64_t unkey(int64_t dt, int64_t k) {
  return dt == KILN_U64 ? (int64_t)((uint64_t)k ^ 0x8000000000000000ull) : k;
}

/* The smallest and largest key of an integer dtype (identities of Max and Min). */
KILN_UK_INLINE int64_t ikey_min(int64_t dt) {
  switch (dt) {
  case KILN_I8: return -128;
  case KILN_I16: return -32768;
  case KILN_I32: return -2147483647 - 1;
  case KILN_U64: case KILN_I64: return INT64_MIN;
  default: return 0;
  }
}

KILN_UK_INLINE int64_t ikey_max(int64_t dt) {
  switch (dt) {
  case KILN_BOOL: case KILN_U8: return 255;
  case KILN_I8: return 127;
  case KILN_U16: return 65535;
  case KILN_I16: return 32767;
  case KILN_U32: return 4294967295ll;
  case KILN_I32: return 2147483647;
  default: return INT64_MAX;
  }
}

/* e^x for softmax arguments (x <= 0), branch-free so loops over it vectorize. kiln_math.h's
   kiln_expf where the elementwise family provides it; until then Cephes' expf polynomial
   (about 1 ulp) with x clamped at -87 so 2^n stays normal (e^-87 ~ 1.6e-38 instead of a
   smaller or zero result is far below any tolerance next to the row's e^0 = 1). */
#if __has_include("kiln_math.h")
#include "kiln_math.h"
KILN_UK_INLINE float rd_expf(float x) { return kiln_expf(x); }
#else
KILN_UK_INLINE float rd_expf(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  float n = __builtin_rintf(x * 1.44269504088896341f);
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  /* 2^n: n + 127 lands in the low mantissa bits of 2^23 + n + 127 (NaN stays NaN through p). */
  float biased = n + 8388735.0f;
  uint32_t bits;
  __builtin_memcpy(&bits, &biased, 4);
  bits <<= 23;
  float scale;
  __builtin_memcpy(&scale, &bits, 4);
  return p * scale;
}
#endif

/* ---------------------------------------------------------------------------------------------
 * Reduce*
 *
 * kiln_uk_reduce: in[0] data (in[1] axes, already applied), out[0].
 * iattr: [kind, ng, extent_0, reduced_0, extent_1, reduced_1, ...] -- the input's dims with
 * neighbours of the same kind merged and extent-1 dims dropped (at most 16 groups).
 * kind: K_* (ReduceCode in codegen/src/uk/codes.rs).
 * ------------------------------------------------------------------------------------------- */

/* How elements accumulate. */
enum { A_SUM, A_ABS, A_SQ, A_MAX, A_MIN, A_PROD };

#define MAX_GROUPS 16

KILN_UK_INLINE int acc_of(int64_t kind) {
  switch (kind) {
  case K_MAX: case K_LSE: return A_MAX;
  case K_MIN: return A_MIN;
  case K_PROD: return A_PROD;
  case K_L1: return A_ABS;
  case K_L2: case K_SUMSQ: return A_SQ;
  default: return A_SUM;
  }
}

KILN_UK_INLINE double acc_init(int a) {
  return a == A_MAX ? -R_INF : a == A_MIN ? R_INF : a == A_PROD ? 1.0 : 0.0;
}

/* NaN-propagating extremes: a NaN element replaces the accumulator, and a NaN accumulator
   stays (no element compares above it). */
KILN_UK_INLINE double acc_step(int a, double acc, double e) {
  switch (a) {
  case A_SUM: return acc + e;
  case A_ABS: return acc + __builtin_fabs(e);
  case A_SQ: return acc + e * e;
  case A_MAX: return (e != e || e > acc) ? e : acc;
  case A_MIN: return (e != e || e < acc) ? e : acc;
  default: return acc * e;
  }
}

KILN_UK_INLINE double acc_merge(int a, double x, double y) {
  if (a == A_SUM || a == A_ABS || a == A_SQ) return x + y;
  if (a == A_PROD) return x * y;
  return acc_step(a, x, y);
}

KILN_UK_INLINE double finish(int64_t kind, double acc, double count) {
  switch (kind) {
  case K_MEAN: return acc / count;
  case K_L2: return __builtin_sqrt(acc);
  case K_LOGSUM: return __builtin_log(acc);
  default: return acc;
  }
}

/* The input seen as [outer, r, inner] (r reduced), or as a general pattern of groups. */
typedef struct {
  const void *x;
  void *y;
  int64_t kind, outer, r, inner, nblocks, n_tasks, units;
  /* general pattern: kept and reduced dims (outermost first) with their input strides */
  int64_t nk, nr, kdim[MAX_GROUPS], kstride[MAX_GROUPS], rdim[MAX_GROUPS], rstride[MAX_GROUPS];
  int general;
} reduce_job;

#define BLOCK 64

/* One contiguous row of n elements from `base`, folded with 8 partial accumulators. */
KILN_UK_INLINE double fold_row(const void *x, int64_t dt, int64_t base, int64_t n, int a) {
  double p[8];
  for (int j = 0; j < 8; j++) p[j] = acc_init(a);
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int j = 0; j < 8; j++) p[j] = acc_step(a, p[j], ld(x, dt, base + k + j));
  for (; k < n; k++) p[0] = acc_step(a, p[0], ld(x, dt, base + k));
  double r = p[0];
  for (int j = 1; j < 8; j++) r = acc_merge(a, r, p[j]);
  return r;
}

KILN_UK_INLINE double lse_row(const void *x, int64_t dt, int64_t base, int64_t n) {
  double m = fold_row(x, dt, base, n, A_MAX);
  if (!__builtin_isfinite(m)) return m; /* keeps inf - inf out of the sum */
  double s = 0;
  for (int64_t k = 0; k < n; k++) s += __builtin_exp(ld(x, dt, base + k) - m);
  return m + __builtin_log(s);
}

/* Reduction of rows (inner == 1): units are output elements. */
KILN_UK_INLINE void reduce_rows_kind(const reduce_job *j, int64_t lo, int64_t hi, int64_t dt, int64_t kind) {
  int a = acc_of(kind);
  for (int64_t o = lo; o < hi; o++) {
    double v = kind == K_LSE ? lse_row(j->x, dt, o * j->r, j->r)
                             : finish(kind, fold_row(j->x, dt, o * j->r, j->r, a), (double)j->r);
    st(j->y, dt, o, v);
  }
}

/* Reduction along a middle axis: units are (outer, block of up to 64 inner) pairs, reduced
   element-wise so the inner loop runs over contiguous memory. */
KILN_UK_INLINE void reduce_blocks_kind(const reduce_job *j, int64_t lo, int64_t hi, int64_t dt, int64_t kind) {
  int a = acc_of(kind);
  double acc[BLOCK], m[BLOCK];
  for (int64_t u = lo; u < hi; u++) {
    int64_t o = u / j->nblocks, i0 = (u % j->nblocks) * BLOCK;
    int64_t w = j->inner - i0 < BLOCK ? j->inner - i0 : BLOCK;
    const int64_t base = o * j->r * j->inner + i0;
    for (int64_t i = 0; i < w; i++) acc[i] = acc_init(a);
    for (int64_t k = 0; k < j->r; k++)
      for (int64_t i = 0; i < w; i++) acc[i] = acc_step(a, acc[i], ld(j->x, dt, base + k * j->inner + i));
    if (kind == K_LSE) {
      for (int64_t i = 0; i < w; i++) {
        m[i] = acc[i];
        acc[i] = 0;
      }
      for (int64_t k = 0; k < j->r; k++)
        for (int64_t i = 0; i < w; i++)
          if (__builtin_isfinite(m[i])) acc[i] += __builtin_exp(ld(j->x, dt, base + k * j->inner + i) - m[i]);
      for (int64_t i = 0; i < w; i++)
        st(j->y, dt, o * j->inner + i0 + i, __builtin_isfinite(m[i]) ? m[i] + __builtin_log(acc[i]) : m[i]);
    } else {
      for (int64_t i = 0; i < w; i++) st(j->y, dt, o * j->inner + i0 + i, finish(kind, acc[i], (double)j->r));
    }
  }
}

/* Offset in the input of output element q (kept dims, row-major). */
KILN_UK_INLINE int64_t kept_offset(const reduce_job *j, int64_t q) {
  int64_t off = 0;
  for (int64_t g = j->nk - 1; g >= 0; g--) {
    off += (q % j->kdim[g]) * j->kstride[g];
    q /= j->kdim[g];
  }
  return off;
}

/* Offset of the r-th element of the reduced set, relative to its output's base. */
KILN_UK_INLINE int64_t reduced_offset(const reduce_job *j, int64_t r) {
  int64_t off = 0;
  for (int64_t g = j->nr - 1; g >= 0; g--) {
    off += (r % j->rdim[g]) * j->rstride[g];
    r /= j->rdim[g];
  }
  return off;
}

/* Any other pattern of reduced axes: units are output elements, each walking its reduced set. */
KILN_UK_INLINE void reduce_general_kind(const reduce_job *j, int64_t lo, int64_t hi, int64_t dt, int64_t kind) {
  int a = acc_of(kind);
  for (int64_t q = lo; q < hi; q++) {
    int64_t base = kept_offset(j, q);
    double acc = acc_init(a);
    for (int64_t r = 0; r < j->r; r++) acc = acc_step(a, acc, ld(j->x, dt, base + reduced_offset(j, r)));
    if (kind == K_LSE) {
      double m = acc, s = 0;
      if (__builtin_isfinite(m)) {
        for (int64_t r = 0; r < j->r; r++) s += __builtin_exp(ld(j->x, dt, base + reduced_offset(j, r)) - m);
        m += __builtin_log(s);
      }
      st(j->y, dt, q, m);
    } else {
      st(j->y, dt, q, finish(kind, acc, (double)j->r));
    }
  }
}

/* The kind as a literal at each call, so every loop specialises for its accumulation. */
#define REDUCE_KINDS(fn, j, lo, hi, dt)                                                          \
  switch ((j)->kind) {                                                                           \
  case K_SUM: fn(j, lo, hi, dt, K_SUM); break;                                                   \
  case K_MEAN: fn(j, lo, hi, dt, K_MEAN); break;                                                 \
  case K_MAX: fn(j, lo, hi, dt, K_MAX); break;                                                   \
  case K_MIN: fn(j, lo, hi, dt, K_MIN); break;                                                   \
  case K_PROD: fn(j, lo, hi, dt, K_PROD); break;                                                 \
  case K_L1: fn(j, lo, hi, dt, K_L1); break;                                                     \
  case K_L2: fn(j, lo, hi, dt, K_L2); break;                                                     \
  case K_LOGSUM: fn(j, lo, hi, dt, K_LOGSUM); break;                                             \
  case K_LSE: fn(j, lo, hi, dt, K_LSE); break;                                                   \
  default: fn(j, lo, hi, dt, K_SUMSQ); break;                                                    \
  }

KILN_UK_INLINE void reduce_float_task(void *job, int64_t t, int64_t dt) {
  const reduce_job *j = (const reduce_job *)job;
  int64_t lo = task_lo(t, j->n_tasks, j->units), hi = task_lo(t + 1, j->n_tasks, j->units);
  if (j->general) {
    REDUCE_KINDS(reduce_general_kind, j, lo, hi, dt)
  } else if (j->inner == 1) {
    REDUCE_KINDS(reduce_rows_kind, j, lo, hi, dt)
  } else {
    REDUCE_KINDS(reduce_blocks_kind, j, lo, hi, dt)
  }
}
DEF_FLOAT_TASKS(reduce_float_task)

/* Integer (and bool) reductions: Sum/Prod/L1/SumSquare wrap in the element type (computed in
   uint64, whose wrap-around agrees with every narrower type's), Mean divides the wrapped sum
   and truncates, Max/Min compare keys, L2/LogSum/LogSumExp go through double. */
KILN_UK_INLINE void reduce_int_one(const reduce_job *j, int64_t dt, int64_t q, int64_t base) {
  const int64_t kind = j->kind;
  if (kind == K_L2 || kind == K_LOGSUM || kind == K_LSE) {
    int a = acc_of(kind);
    double acc = acc_init(a);
    for (int64_t r = 0; r < j->r; r++) acc = acc_step(a, acc, ld(j->x, dt, base + reduced_offset(j, r)));
    if (kind == K_LSE && __builtin_isfinite(acc)) {
      double s = 0;
      for (int64_t r = 0; r < j->r; r++) s += __builtin_exp(ld(j->x, dt, base + reduced_offset(j, r)) - acc);
      acc += __builtin_log(s);
    }
    st(j->y, dt, q, finish(kind, acc, (double)j->r));
    return;
  }
  if (kind == K_MAX || kind == K_MIN) {
    int64_t best = kind == K_MAX ? ikey_min(dt) : ikey_max(dt);
    for (int64_t r = 0; r < j->r; r++) {
      int64_t e = ikey(j->x, dt, base + reduced_offset(j, r));
      if (kind == K_MAX ? e > best : e < best) best = e;
    }
    kiln_store_i64(j->y, dt, q, unkey(dt, best));
    return;
  }
  uint64_t acc = kind == K_PROD ? 1 : 0;
  for (int64_t r = 0; r < j->r; r++) {
    uint64_t e = (uint64_t)kiln_load_i64(j->x, dt, base + reduced_offset(j, r));
    switch (kind) {
    case K_PROD: acc *= e; break;
    case K_L1: acc += (!is_unsigned(dt) && (int64_t)e < 0) ? (uint64_t)0 - e : e; break;
    case K_SUMSQ: acc += e * e; break;
    default: acc += e; break;
    }
  }
  kiln_store_i64(j->y, dt, q, (int64_t)acc);
  if (kind == K_MEAN) /* reread the wrapped sum in the element type */
    st(j->y, dt, q, j->r == 0 ? 0.0 : ld(j->y, dt, q) / (double)j->r);
}

static int32_t reduce_ints(const reduce_job *j, int64_t dt, int64_t n_out) {
  for (int64_t q = 0; q < n_out; q++) reduce_int_one(j, dt, q, kept_offset(j, q));
  return 0;
}

/* Reads `ng` (extent, reduced) pairs into j's kept and reduced dims; also sets j->outer/inner
   for a single reduced group (outer: extents before it, inner: after). Returns the number of
   elements each output reduces. */
static int64_t parse_groups(reduce_job *j, const int64_t *g, int64_t ng) {
  int64_t stride[MAX_GROUPS], s = 1, count = 1, before = 1, after = 1;
  for (int64_t i = ng - 1; i >= 0; i--) {
    stride[i] = s;
    s *= g[2 * i];
  }
  j->nk = j->nr = 0;
  for (int64_t i = 0; i < ng; i++) {
    int64_t d = g[2 * i];
    if (g[2 * i + 1]) {
      j->rdim[j->nr] = d;
      j->rstride[j->nr++] = stride[i];
      count *= d;
    } else {
      j->kdim[j->nk] = d;
      j->kstride[j->nk++] = stride[i];
      if (j->nr == 0)
        before *= d;
      else
        after *= d;
    }
  }
  j->outer = before;
  j->inner = after;
  return count;
}

int32_t kiln_uk_reduce(const kiln_uk_args *a) {
  const kiln_tensor *x = &a->in[0], *y = &a->out[0];
  reduce_job j;
  __builtin_memset(&j, 0, sizeof j);
  j.x = x->data;
  j.y = y->data;
  j.kind = a->iattr[0];
  int64_t ng = a->iattr[1];
  if (ng > MAX_GROUPS)
    return kiln_uk_fail(a, KILN_UK_EVALUE, "reduce: %lld dimension groups (at most %d)", (long long)ng, MAX_GROUPS);
  int64_t count = parse_groups(&j, a->iattr + 2, ng);
  j.r = count;
  int64_t n_out = y->numel;
  if (n_out == 0) return 0;
  if (!kiln_dtype_is_float(x->dtype)) return reduce_ints(&j, x->dtype, n_out);
  if (j.nr == 0) { /* nothing reduced: each output reduces its own element */
    j.outer = n_out;
    j.inner = 1;
  } else if (j.nr > 1 || x->numel == 0) {
    j.general = 1;
  }
  if (j.general) {
    j.units = n_out;
    j.n_tasks = task_count(j.units, count);
  } else if (j.inner == 1) {
    j.units = j.outer;
    j.n_tasks = task_count(j.units, count);
  } else {
    j.nblocks = (j.inner + BLOCK - 1) / BLOCK;
    j.units = j.outer * j.nblocks;
    j.n_tasks = task_count(j.units, count * BLOCK);
  }
  run_tasks(a->ctx, reduce_float_task_for(x->dtype), &j, j.n_tasks);
  return 0;
}

/* ---------------------------------------------------------------------------------------------
 * ArgMax / ArgMin
 *
 * kiln_uk_arg: in[0] data (any numeric dtype), out[0] i64.
 * iattr: [outer, n, inner, is_max, select_last_index]  (n >= 1)
 * ------------------------------------------------------------------------------------------- */

/* Whether candidate c replaces the current best b. NaN beats every number; among equals the
   first (or, with `last`, the last) index wins. */
KILN_UK_INLINE int arg_better_f(double c, double b, int64_t max, int64_t last) {
  if (b != b) return last && c != c;
  if (c != c) return 1;
  if (c == b) return (int)last;
  return c > b ? (int)max : (int)!max;
}

KILN_UK_INLINE void arg_body(const kiln_uk_args *a, int64_t dt) {
  const void *x = a->in[0].data;
  int64_t *y = (int64_t *)a->out[0].data;
  int64_t outer = a->iattr[0], n = a->iattr[1], inner = a->iattr[2], max = a->iattr[3], last = a->iattr[4];
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      int64_t base = o * n * inner + i, best = 0;
      if (kiln_dtype_is_float(dt)) {
        double bv = ld(x, dt, base);
        for (int64_t k = 1; k < n; k++) {
          double c = ld(x, dt, base + k * inner);
          if (arg_better_f(c, bv, max, last)) {
            best = k;
            bv = c;
          }
        }
      } else {
        int64_t bv = ikey(x, dt, base);
        for (int64_t k = 1; k < n; k++) {
          int64_t c = ikey(x, dt, base + k * inner);
          if (c == bv ? last : (c > bv) == (max != 0)) {
            best = k;
            bv = c;
          }
        }
      }
      y[o * inner + i] = best;
    }
}

int32_t kiln_uk_arg(const kiln_uk_args *a) {
#define ARG_CALL(DT) return (arg_body(a, DT), 0)
  DISPATCH_ALL(a->in[0].dtype, ARG_CALL)
#undef ARG_CALL
}

/* ---------------------------------------------------------------------------------------------
 * TopK (always sorted; ties keep the lower index first)
 *
 * kiln_uk_topk: in[0] X, in[1] K (known, unused), out[0] values, out[1] indices (i64).
 * iattr: [outer, n, inner, k, largest]; scratch: 24 * n bytes.
 * ------------------------------------------------------------------------------------------- */

/* a above b in numpy's order with NaN above every number. */
KILN_UK_INLINE int above_f(double a, double b) {
  if (a != a) return b == b;
  return a > b;
}

/* Whether row element p goes strictly before q in the output. */
KILN_UK_INLINE int topk_before(const double *fk, const int64_t *ik, int is_float, int64_t largest, int64_t p, int64_t q) {
  if (is_float) return largest ? above_f(fk[p], fk[q]) : above_f(fk[q], fk[p]);
  return largest ? ik[p] > ik[q] : ik[q] > ik[p];
}

KILN_UK_INLINE void topk_body(const kiln_uk_args *a, int64_t dt) {
  const void *x = a->in[0].data;
  void *vals = a->out[0].data;
  int64_t *idx = (int64_t *)a->out[1].data;
  int64_t outer = a->iattr[0], n = a->iattr[1], inner = a->iattr[2], k = a->iattr[3], largest = a->iattr[4];
  int is_float = kiln_dtype_is_float(dt);
  int64_t esize = kiln_dtype_size(dt);
  double *fk = (double *)a->scratch;
  int64_t *ik = (int64_t *)a->scratch;
  int64_t *src = (int64_t *)a->scratch + n, *dst = src + n;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      int64_t base = o * n * inner + i;
      for (int64_t j = 0; j < n; j++) {
        if (is_float)
          fk[j] = ld(x, dt, base + j * inner);
        else
          ik[j] = ikey(x, dt, base + j * inner);
        src[j] = j;
      }
      /* bottom-up stable merge sort of the indices */
      int64_t *s = src, *d = dst;
      for (int64_t w = 1; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
          int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
          int64_t p = lo, q = mid, out = lo;
          while (p < mid && q < hi) d[out++] = topk_before(fk, ik, is_float, largest, s[q], s[p]) ? s[q++] : s[p++];
          while (p < mid) d[out++] = s[p++];
          while (q < hi) d[out++] = s[q++];
        }
        int64_t *t = s;
        s = d;
        d = t;
      }
      for (int64_t r = 0; r < k; r++) {
        int64_t at = (o * k + r) * inner + i;
        __builtin_memcpy((char *)vals + at * esize, (const char *)x + (base + s[r] * inner) * esize, (size_t)esize);
        idx[at] = s[r];
      }
    }
}

int32_t kiln_uk_topk(const kiln_uk_args *a) {
#define TOPK_CALL(DT) return (topk_body(a, DT), 0)
  DISPATCH_ALL(a->in[0].dtype, TOPK_CALL)
#undef TOPK_CALL
}

/* ---------------------------------------------------------------------------------------------
 * CumSum / CumProd
 *
 * kiln_uk_cumulative: in[0] x, in[1] axis (integer scalar), out[0].
 * iattr: [prod, exclusive, reverse, axis, rank, dims...]  axis: normalized when known at
 * compile time, -1 to read in[1] at run time.
 * Floats accumulate in double and round each output once; integers wrap in the element type.
 * ------------------------------------------------------------------------------------------- */

KILN_UK_INLINE void cumulative_body(const kiln_uk_args *a, int64_t dt) {
  const void *x = a->in[0].data;
  void *y = a->out[0].data;
  int64_t prod = a->iattr[0], excl = a->iattr[1], rev = a->iattr[2], axis = a->iattr[3], rank = a->iattr[4];
  const int64_t *dims = a->iattr + 5;
  if (axis < 0) axis = kiln_load_i64(a->in[1].data, a->in[1].dtype, 0);
  if (axis < 0) axis += rank;
  int64_t outer = 1, n = 1, inner = 1;
  for (int64_t d = 0; d < rank; d++) {
    if (d < axis) outer *= dims[d];
    else if (d == axis) n = dims[d];
    else inner *= dims[d];
  }
  int is_float = kiln_dtype_is_float(dt);
  double facc[BLOCK];
  uint64_t iacc[BLOCK];
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i0 = 0; i0 < inner; i0 += BLOCK) {
      int64_t w = inner - i0 < BLOCK ? inner - i0 : BLOCK;
      for (int64_t i = 0; i < w; i++) {
        facc[i] = prod ? 1.0 : 0.0;
        iacc[i] = prod ? 1 : 0;
      }
      for (int64_t step = 0; step < n; step++) {
        int64_t kk = rev ? n - 1 - step : step;
        int64_t row = (o * n + kk) * inner + i0;
        for (int64_t i = 0; i < w; i++) {
          if (is_float) {
            double e = ld(x, dt, row + i);
            if (excl) st(y, dt, row + i, facc[i]);
            facc[i] = prod ? facc[i] * e : facc[i] + e;
            if (!excl) st(y, dt, row + i, facc[i]);
          } else {
            uint64_t e = (uint64_t)kiln_load_i64(x, dt, row + i);
            if (excl) kiln_store_i64(y, dt, row + i, (int64_t)iacc[i]);
            iacc[i] = prod ? iacc[i] * e : iacc[i] + e;
            if (!excl) kiln_store_i64(y, dt, row + i, (int64_t)iacc[i]);
          }
        }
      }
    }
}

int32_t kiln_uk_cumulative(const kiln_uk_args *a) {
  if (a->iattr[3] < 0) {
    int64_t axis = kiln_load_i64(a->in[1].data, a->in[1].dtype, 0), rank = a->iattr[4];
    if (axis < -rank || axis >= rank)
      return kiln_uk_fail(a, KILN_UK_EVALUE, "axis %lld is out of range for rank %lld", (long long)axis, (long long)rank);
  }
#define CUMULATIVE_CALL(DT) return (cumulative_body(a, DT), 0)
  DISPATCH_ALL(a->in[0].dtype, CUMULATIVE_CALL)
#undef CUMULATIVE_CALL
}

/* ---------------------------------------------------------------------------------------------
 * Softmax / LogSoftmax / Hardmax
 *
 * kiln_uk_softmax: in[0] x, out[0] y.
 * iattr: [outer, n, inner, kind]  kind: SM_SOFTMAX, SM_LOG, SM_HARD. (The Rust side
 * flattens coerce_2d forms to [outer, n, 1].)
 * ------------------------------------------------------------------------------------------- */

typedef struct {
  const void *x;
  void *y;
  int64_t outer, n, inner, kind, nblocks, units, n_tasks;
} softmax_job;

/* f32 rows: 16 partial maxima and sums keep the loops vectorizable. */
static void softmax_rows_f32(const float *x, float *y, int64_t n, int64_t lo, int64_t hi, int64_t kind) {
  for (int64_t o = lo; o < hi; o++) {
    const float *xr = x + o * n;
    float *yr = y + o * n;
    /* The maximum ignores NaN (as f64::max); a NaN then poisons the whole row through exp. */
    float m[16];
    for (int j = 0; j < 16; j++) m[j] = -__builtin_inff();
    int64_t k = 0;
    for (; k + 16 <= n; k += 16)
      for (int j = 0; j < 16; j++) m[j] = xr[k + j] > m[j] ? xr[k + j] : m[j];
    for (; k < n; k++) m[0] = xr[k] > m[0] ? xr[k] : m[0];
    float mx = m[0];
    for (int j = 1; j < 16; j++) mx = m[j] > mx ? m[j] : mx;
    float s[16];
    for (int j = 0; j < 16; j++) s[j] = 0;
    k = 0;
    if (kind == SM_SOFTMAX) {
      for (; k + 16 <= n; k += 16)
        for (int j = 0; j < 16; j++) {
          float e = rd_expf(xr[k + j] - mx);
          yr[k + j] = e;
          s[j] += e;
        }
      for (; k < n; k++) {
        float e = rd_expf(xr[k] - mx);
        yr[k] = e;
        s[0] += e;
      }
    } else {
      for (; k + 16 <= n; k += 16)
        for (int j = 0; j < 16; j++) s[j] += rd_expf(xr[k + j] - mx);
      for (; k < n; k++) s[0] += rd_expf(xr[k] - mx);
    }
    float sum = 0;
    for (int j = 0; j < 16; j++) sum += s[j];
    if (kind == SM_SOFTMAX) {
      float inv = 1.0f / sum;
      for (k = 0; k < n; k++) yr[k] *= inv;
    } else {
      float ls = __builtin_logf(sum);
      for (k = 0; k < n; k++) yr[k] = (xr[k] - mx) - ls;
    }
  }
}

/* Generic: units are (outer, block of up to 64 inner), computed in double. */
KILN_UK_INLINE void softmax_generic(const softmax_job *j, int64_t lo, int64_t hi, int64_t dt) {
  double mx[BLOCK], sum[BLOCK];
  int64_t first[BLOCK], nan_at[BLOCK];
  const int64_t n = j->n, inner = j->inner;
  for (int64_t u = lo; u < hi; u++) {
    int64_t o = u / j->nblocks, i0 = (u % j->nblocks) * BLOCK;
    int64_t w = inner - i0 < BLOCK ? inner - i0 : BLOCK;
    const int64_t base = o * n * inner + i0;
    for (int64_t i = 0; i < w; i++) {
      mx[i] = -R_INF;
      sum[i] = 0;
    }
    for (int64_t k = 0; k < n; k++)
      for (int64_t i = 0; i < w; i++) mx[i] = __builtin_fmax(mx[i], ld(j->x, dt, base + k * inner + i));
    if (j->kind == SM_HARD) {
      /* numpy's argmax: the first NaN, else the first maximum */
      for (int64_t i = 0; i < w; i++) first[i] = nan_at[i] = -1;
      for (int64_t k = 0; k < n; k++)
        for (int64_t i = 0; i < w; i++) {
          double v = ld(j->x, dt, base + k * inner + i);
          if (v != v && nan_at[i] < 0) nan_at[i] = k;
          if (v == mx[i] && first[i] < 0) first[i] = k;
        }
      for (int64_t k = 0; k < n; k++)
        for (int64_t i = 0; i < w; i++)
          st(j->y, dt, base + k * inner + i, (nan_at[i] >= 0 ? nan_at[i] : first[i]) == k ? 1.0 : 0.0);
      continue;
    }
    for (int64_t k = 0; k < n; k++)
      for (int64_t i = 0; i < w; i++) sum[i] += __builtin_exp(ld(j->x, dt, base + k * inner + i) - mx[i]);
    for (int64_t k = 0; k < n; k++)
      for (int64_t i = 0; i < w; i++) {
        double v = ld(j->x, dt, base + k * inner + i) - mx[i];
        st(j->y, dt, base + k * inner + i, j->kind == SM_SOFTMAX ? __builtin_exp(v) / sum[i] : v - __builtin_log(sum[i]));
      }
  }
}

KILN_UK_INLINE void softmax_task(void *job, int64_t t, int64_t dt) {
  const softmax_job *j = (const softmax_job *)job;
  int64_t lo = task_lo(t, j->n_tasks, j->units), hi = task_lo(t + 1, j->n_tasks, j->units);
  if (dt == KILN_F32 && j->inner == 1 && j->kind != SM_HARD)
    softmax_rows_f32((const float *)j->x, (float *)j->y, j->n, lo, hi, j->kind);
  else
    softmax_generic(j, lo, hi, dt);
}
DEF_FLOAT_TASKS(softmax_task)

int32_t kiln_uk_softmax(const kiln_uk_args *a) {
  softmax_job j;
  j.x = a->in[0].data;
  j.y = a->out[0].data;
  j.outer = a->iattr[0];
  j.n = a->iattr[1];
  j.inner = a->iattr[2];
  j.kind = a->iattr[3];
  if (a->out[0].numel == 0) return 0;
  if (a->in[0].dtype == KILN_F32 && j.inner == 1 && j.kind != SM_HARD) {
    j.nblocks = 1;
    j.units = j.outer;
    j.n_tasks = task_count(j.units, j.n * 4);
  } else {
    j.nblocks = (j.inner + BLOCK - 1) / BLOCK;
    j.units = j.outer * j.nblocks;
    j.n_tasks = task_count(j.units, j.n * (j.inner < BLOCK ? j.inner : BLOCK) * 8);
  }
  run_tasks(a->ctx, softmax_task_for(a->in[0].dtype), &j, j.n_tasks);
  return 0;
}

/* ---------------------------------------------------------------------------------------------
 * LayerNormalization / RMSNormalization
 *
 * kiln_uk_layernorm: in[0] X, in[1] scale, in[2] bias (absent: NULL); out[0] Y, out[1] Mean?,
 * out[2] InvStdDev? (in the stash dtype).
 * iattr: [rows, row, scale_mode, bias_mode, rms]  mode: 0 one value per row position,
 * 1 a single value, 2 absent. rms: RMSNormalization (no mean; no statistics outputs).
 * fattr: [epsilon]
 * ------------------------------------------------------------------------------------------- */

typedef struct {
  const void *x, *scale, *bias;
  void *y, *mean_out, *inv_out;
  int64_t stash_dt, rows, row, scale_mode, bias_mode, rms, n_tasks;
  double eps;
} layernorm_job;

KILN_UK_INLINE double param_at(const void *p, int64_t dt, int64_t mode, int64_t i, double absent) {
  if (mode == 2) return absent;
  return ld(p, dt, mode == 1 ? 0 : i);
}

static void layernorm_rows_f32(const layernorm_job *j, int64_t lo, int64_t hi) {
  const int64_t n = j->row;
  const float *scale = (const float *)j->scale, *bias = (const float *)j->bias;
  for (int64_t r = lo; r < hi; r++) {
    const float *x = (const float *)j->x + r * n;
    float *y = (float *)j->y + r * n;
    float s[16];
    float mean = 0;
    if (!j->rms) {
      for (int i = 0; i < 16; i++) s[i] = 0;
      int64_t k = 0;
      for (; k + 16 <= n; k += 16)
        for (int i = 0; i < 16; i++) s[i] += x[k + i];
      for (; k < n; k++) s[0] += x[k];
      float sum = 0;
      for (int i = 0; i < 16; i++) sum += s[i];
      mean = sum / (float)n;
    }
    for (int i = 0; i < 16; i++) s[i] = 0;
    int64_t k = 0;
    for (; k + 16 <= n; k += 16)
      for (int i = 0; i < 16; i++) {
        float d = x[k + i] - mean;
        s[i] += d * d;
      }
    for (; k < n; k++) s[0] += (x[k] - mean) * (x[k] - mean);
    float ss = 0;
    for (int i = 0; i < 16; i++) ss += s[i];
    float inv = (float)(1.0 / __builtin_sqrt((double)(ss / (float)n) + j->eps));
    if (j->scale_mode == 0 && j->bias_mode == 0) {
      for (k = 0; k < n; k++) y[k] = (x[k] - mean) * inv * scale[k] + bias[k];
    } else if (j->scale_mode == 0 && j->bias_mode == 2) {
      for (k = 0; k < n; k++) y[k] = (x[k] - mean) * inv * scale[k];
    } else {
      for (k = 0; k < n; k++)
        y[k] = (x[k] - mean) * inv * scale[j->scale_mode == 1 ? 0 : k] +
               (j->bias_mode == 2 ? 0.0f : bias[j->bias_mode == 1 ? 0 : k]);
    }
    if (j->mean_out) st(j->mean_out, j->stash_dt, r, mean);
    if (j->inv_out) st(j->inv_out, j->stash_dt, r, inv);
  }
}

KILN_UK_INLINE void layernorm_generic(const layernorm_job *j, int64_t lo, int64_t hi, int64_t dt) {
  const int64_t n = j->row;
  for (int64_t r = lo; r < hi; r++) {
    const int64_t base = r * n;
    double mean = 0, ss = 0;
    if (!j->rms) {
      for (int64_t k = 0; k < n; k++) mean += ld(j->x, dt, base + k);
      mean /= (double)n;
    }
    for (int64_t k = 0; k < n; k++) {
      double d = ld(j->x, dt, base + k) - mean;
      ss += d * d;
    }
    double inv = 1.0 / __builtin_sqrt(ss / (double)n + j->eps);
    for (int64_t k = 0; k < n; k++)
      st(j->y, dt, base + k,
         (ld(j->x, dt, base + k) - mean) * inv * param_at(j->scale, dt, j->scale_mode, k, 1.0) +
             param_at(j->bias, dt, j->bias_mode, k, 0.0));
    if (j->mean_out) st(j->mean_out, j->stash_dt, r, mean);
    if (j->inv_out) st(j->inv_out, j->stash_dt, r, inv);
  }
}

KILN_UK_INLINE void layernorm_task(void *job, int64_t t, int64_t dt) {
  const layernorm_job *j = (const layernorm_job *)job;
  int64_t lo = task_lo(t, j->n_tasks, j->rows), hi = task_lo(t + 1, j->n_tasks, j->rows);
  if (dt == KILN_F32)
    layernorm_rows_f32(j, lo, hi);
  else
    layernorm_generic(j, lo, hi, dt);
}
DEF_FLOAT_TASKS(layernorm_task)

int32_t kiln_uk_layernorm(const kiln_uk_args *a) {
  layernorm_job j;
  j.x = a->in[0].data;
  j.scale = a->in[1].data;
  j.bias = a->n_in > 2 ? a->in[2].data : NULL;
  j.y = a->out[0].data;
  j.mean_out = a->n_out > 1 ? a->out[1].data : NULL;
  j.inv_out = a->n_out > 2 ? a->out[2].data : NULL;
  j.stash_dt = a->n_out > 1 ? a->out[1].dtype : KILN_F32;
  j.rows = a->iattr[0];
  j.row = a->iattr[1];
  j.scale_mode = a->iattr[2];
  j.bias_mode = j.bias ? a->iattr[3] : 2;
  j.rms = a->iattr[4];
  j.eps = a->fattr[0];
  if (j.rows == 0) return 0;
  if (j.row == 0) { /* statistics of empty rows: 0/0 */
    for (int64_t r = 0; r < j.rows; r++) {
      if (j.mean_out) st(j.mean_out, j.stash_dt, r, __builtin_nan(""));
      if (j.inv_out) st(j.inv_out, j.stash_dt, r, __builtin_nan(""));
    }
    return 0;
  }
  j.n_tasks = task_count(j.rows, j.row * 4);
  run_tasks(a->ctx, layernorm_task_for(a->in[0].dtype), &j, j.n_tasks);
  return 0;
}

/* ---------------------------------------------------------------------------------------------
 * BatchNormalization (inference)
 *
 * kiln_uk_batchnorm: in[0] X, in[1] scale, in[2] B, in[3] mean, in[4] var (each its own float
 * dtype), out[0] Y.  iattr: [N, C, plane]  fattr: [epsilon]
 * ------------------------------------------------------------------------------------------- */

typedef struct {
  const kiln_uk_args *a;
  int64_t c, plane, units, n_tasks;
  double eps;
} bn_job;

KILN_UK_INLINE void batchnorm_task(void *job, int64_t t, int64_t dt) {
  const bn_job *j = (const bn_job *)job;
  const kiln_uk_args *a = j->a;
  int64_t lo = task_lo(t, j->n_tasks, j->units), hi = task_lo(t + 1, j->n_tasks, j->units);
  for (int64_t u = lo; u < hi; u++) {
    int64_t ch = u % j->c, base = u * j->plane;
    double s = ld(a->in[1].data, a->in[1].dtype, ch), b = ld(a->in[2].data, a->in[2].dtype, ch);
    double m = ld(a->in[3].data, a->in[3].dtype, ch), v = ld(a->in[4].data, a->in[4].dtype, ch);
    double d = __builtin_sqrt(v + j->eps);
    if (dt == KILN_F32) {
      const float *x = (const float *)a->in[0].data + base;
      float *y = (float *)a->out[0].data + base;
      float fm = (float)m, fa = (float)(s / d), fb = (float)b;
      for (int64_t i = 0; i < j->plane; i++) y[i] = (x[i] - fm) * fa + fb;
    } else {
      for (int64_t i = 0; i < j->plane; i++)
        st(a->out[0].data, dt, base + i, s * (ld(a->in[0].data, dt, base + i) - m) / d + b);
    }
  }
}
DEF_FLOAT_TASKS(batchnorm_task)

int32_t kiln_uk_batchnorm(const kiln_uk_args *a) {
  bn_job j;
  j.a = a;
  j.c = a->iattr[1];
  j.plane = a->iattr[2];
  j.units = a->iattr[0] * j.c;
  j.eps = a->fattr[0];
  if (a->out[0].numel == 0) return 0;
  j.n_tasks = task_count(j.units, j.plane);
  run_tasks(a->ctx, batchnorm_task_for(a->in[0].dtype), &j, j.n_tasks);
  return 0;
}

/* ---------------------------------------------------------------------------------------------
 * InstanceNormalization / GroupNormalization
 *
 * kiln_uk_groupnorm: in[0] X [N, C, ...], in[1] scale, in[2] bias, out[0] Y.
 * iattr: [N, C, groups, plane, per_channel]  (InstanceNorm: groups = C, per_channel = 1)
 * fattr: [epsilon]
 * ------------------------------------------------------------------------------------------- */

typedef struct {
  const kiln_uk_args *a;
  int64_t c, groups, plane, per_channel, units, n_tasks;
  double eps;
} gn_job;

KILN_UK_INLINE void groupnorm_task(void *job, int64_t t, int64_t dt) {
  const gn_job *j = (const gn_job *)job;
  const kiln_uk_args *a = j->a;
  const void *x = a->in[0].data;
  void *y = a->out[0].data;
  const int64_t per_group = j->c / j->groups, block = per_group * j->plane;
  int64_t lo = task_lo(t, j->n_tasks, j->units), hi = task_lo(t + 1, j->n_tasks, j->units);
  for (int64_t u = lo; u < hi; u++) {
    int64_t g = u % j->groups, base = u * block;
    double sum = 0, ss = 0;
    for (int64_t i = 0; i < block; i++) sum += ld(x, dt, base + i);
    double mean = sum / (double)block;
    for (int64_t i = 0; i < block; i++) {
      double d = ld(x, dt, base + i) - mean;
      ss += d * d;
    }
    double inv = 1.0 / __builtin_sqrt(ss / (double)block + j->eps);
    for (int64_t cg = 0; cg < per_group; cg++) {
      int64_t p = j->per_channel ? g * per_group + cg : g;
      double s = ld(a->in[1].data, dt, p), b = ld(a->in[2].data, dt, p);
      int64_t cb = base + cg * j->plane;
      for (int64_t i = 0; i < j->plane; i++) st(y, dt, cb + i, (ld(x, dt, cb + i) - mean) * inv * s + b);
    }
  }
}
DEF_FLOAT_TASKS(groupnorm_task)

int32_t kiln_uk_groupnorm(const kiln_uk_args *a) {
  gn_job j;
  j.a = a;
  j.c = a->iattr[1];
  j.groups = a->iattr[2];
  j.plane = a->iattr[3];
  j.per_channel = a->iattr[4];
  j.units = a->iattr[0] * j.groups;
  j.eps = a->fattr[0];
  if (a->out[0].numel == 0 || j.groups == 0) return 0;
  j.n_tasks = task_count(j.units, 3 * (j.c / j.groups) * j.plane);
  run_tasks(a->ctx, groupnorm_task_for(a->in[0].dtype), &j, j.n_tasks);
  return 0;
}

/* ---------------------------------------------------------------------------------------------
 * LpNormalization
 *
 * kiln_uk_lpnorm: in[0] x, out[0] y.  iattr: [outer, len, inner, p]  (p is 1 or 2)
 * A zero vector stays zero.
 * ------------------------------------------------------------------------------------------- */

KILN_UK_INLINE void lpnorm_body(const kiln_uk_args *a, int64_t dt) {
  const void *x = a->in[0].data;
  void *y = a->out[0].data;
  int64_t outer = a->iattr[0], len = a->iattr[1], inner = a->iattr[2], p = a->iattr[3];
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      int64_t base = o * len * inner + i;
      double norm = 0;
      for (int64_t k = 0; k < len; k++) {
        double v = ld(x, dt, base + k * inner);
        norm += p == 1 ? __builtin_fabs(v) : v * v;
      }
      if (p != 1) norm = __builtin_sqrt(norm);
      for (int64_t k = 0; k < len; k++)
        st(y, dt, base + k * inner, norm != 0.0 ? ld(x, dt, base + k * inner) / norm : 0.0);
    }
}

int32_t kiln_uk_lpnorm(const kiln_uk_args *a) {
#define LPNORM_CALL(DT) return (lpnorm_body(a, DT), 0)
  DISPATCH_FLOAT(a->in[0].dtype, LPNORM_CALL)
#undef LPNORM_CALL
}

/* ---------------------------------------------------------------------------------------------
 * MeanVarianceNormalization: (x - mean) / (std + 1e-9) over the reduced axes.
 *
 * kiln_uk_mvn: in[0] x, out[0] y.  iattr: [ng, extent_0, reduced_0, ...] as for kiln_uk_reduce.
 * ------------------------------------------------------------------------------------------- */

KILN_UK_INLINE void mvn_body(const kiln_uk_args *a, int64_t dt) {
  const void *x = a->in[0].data;
  void *y = a->out[0].data;
  reduce_job j;
  int64_t count = parse_groups(&j, a->iattr + 1, a->iattr[0]), groups = 1;
  for (int64_t g = 0; g < j.nk; g++) groups *= j.kdim[g];
  if (a->in[0].numel == 0) return;
  for (int64_t q = 0; q < groups; q++) {
    int64_t base = kept_offset(&j, q);
    double sum = 0, ss = 0;
    for (int64_t r = 0; r < count; r++) sum += ld(x, dt, base + reduced_offset(&j, r));
    double mean = sum / (double)count;
    for (int64_t r = 0; r < count; r++) {
      double d = ld(x, dt, base + reduced_offset(&j, r)) - mean;
      ss += d * d;
    }
    double den = __builtin_sqrt(ss / (double)count) + 1e-9;
    for (int64_t r = 0; r < count; r++) {
      int64_t at = base + reduced_offset(&j, r);
      st(y, dt, at, (ld(x, dt, at) - mean) / den);
    }
  }
}

int32_t kiln_uk_mvn(const kiln_uk_args *a) {
  if (a->iattr[0] > MAX_GROUPS) return kiln_uk_fail(a, KILN_UK_EVALUE, "mvn: %lld dimension groups (at most %d)", (long long)a->iattr[0], MAX_GROUPS);
#define MVN_CALL(DT) return (mvn_body(a, DT), 0)
  DISPATCH_FLOAT(a->in[0].dtype, MVN_CALL)
#undef MVN_CALL
}

/* ---------------------------------------------------------------------------------------------
 * LRN across channels: y = x / (bias + alpha / size * sum of squares in the window)^beta
 *
 * kiln_uk_lrn: in[0] X [N, C, ...], out[0] Y.  iattr: [N, C, inner, size]
 * fattr: [alpha, beta, bias]
 * ------------------------------------------------------------------------------------------- */

KILN_UK_INLINE void lrn_body(const kiln_uk_args *a, int64_t dt) {
  const void *x = a->in[0].data;
  void *y = a->out[0].data;
  int64_t n = a->iattr[0], c = a->iattr[1], inner = a->iattr[2], size = a->iattr[3];
  double scale = a->fattr[0] / (double)size, beta = a->fattr[1], bias = a->fattr[2];
  /* channel ch's window: [ch - floor((size-1)/2), ch + ceil((size-1)/2)] */
  int64_t before = (size - 1) / 2, after = size / 2;
  for (int64_t b = 0; b < n; b++)
    for (int64_t ch = 0; ch < c; ch++) {
      int64_t lo = ch - before < 0 ? 0 : ch - before, hi = ch + after > c - 1 ? c - 1 : ch + after;
      for (int64_t i = 0; i < inner; i++) {
        double sq = 0;
        for (int64_t k = lo; k <= hi; k++) {
          double v = ld(x, dt, (b * c + k) * inner + i);
          sq += v * v;
        }
        int64_t at = (b * c + ch) * inner + i;
        st(y, dt, at, ld(x, dt, at) / __builtin_pow(bias + scale * sq, beta));
      }
    }
}

int32_t kiln_uk_lrn(const kiln_uk_args *a) {
#define LRN_CALL(DT) return (lrn_body(a, DT), 0)
  DISPATCH_FLOAT(a->in[0].dtype, LRN_CALL)
#undef LRN_CALL
}

/* ---------------------------------------------------------------------------------------------
 * NegativeLogLikelihoodLoss / SoftmaxCrossEntropyLoss
 *
 * kiln_uk_loss: in[0] input [N, C, d...], in[1] target [N, d...] (integer), in[2] weight [C]
 * (absent: NULL); out[0] loss, out[1] log_prob? (SoftmaxCrossEntropyLoss).
 * iattr: [N, C, D, log_softmax, reduction, has_ignore_index, ignore_index]
 * reduction: LOSS_NONE, LOSS_SUM, LOSS_MEAN.  scratch: 8 * N * C * D bytes when log_softmax.
 * ------------------------------------------------------------------------------------------- */

KILN_UK_INLINE int32_t loss_body(const kiln_uk_args *a, int64_t dt) {
  const void *x = a->in[0].data, *target = a->in[1].data;
  const void *weight = a->n_in > 2 ? a->in[2].data : NULL;
  int64_t tdt = a->in[1].dtype;
  int64_t n = a->iattr[0], c = a->iattr[1], d = a->iattr[2], lsm = a->iattr[3], red = a->iattr[4],
          has_ii = a->iattr[5], ii = a->iattr[6];
  double *lp = (double *)a->scratch;
  if (lsm) {
    for (int64_t ni = 0; ni < n; ni++)
      for (int64_t di = 0; di < d; di++) {
        int64_t base = ni * c * d + di;
        double mx = -R_INF, s = 0;
        for (int64_t k = 0; k < c; k++) mx = __builtin_fmax(mx, ld(x, dt, base + k * d));
        for (int64_t k = 0; k < c; k++) s += __builtin_exp(ld(x, dt, base + k * d) - mx);
        double lse = mx + __builtin_log(s);
        for (int64_t k = 0; k < c; k++) lp[base + k * d] = ld(x, dt, base + k * d) - lse;
      }
    if (a->n_out > 1)
      for (int64_t i = 0; i < n * c * d; i++) st(a->out[1].data, dt, i, lp[i]);
  }
  double total = 0, wsum = 0;
  for (int64_t ni = 0; ni < n; ni++)
    for (int64_t di = 0; di < d; di++) {
      int64_t t = kiln_load_i64(target, tdt, ni * d + di);
      double l = 0;
      if (!(has_ii && t == ii)) {
        if (t < 0 || t >= c)
          return kiln_uk_fail(a, KILN_UK_EINDEX, "target %lld is outside the %lld classes", (long long)t, (long long)c);
        double w = weight ? ld(weight, dt, t) : 1.0;
        int64_t at = (ni * c + t) * d + di;
        l = -(lsm ? lp[at] : ld(x, dt, at)) * w;
        wsum += w;
      }
      if (red == LOSS_NONE)
        st(a->out[0].data, dt, ni * d + di, l);
      else
        total += l;
    }
  if (red == LOSS_SUM) st(a->out[0].data, dt, 0, total);
  if (red == LOSS_MEAN) st(a->out[0].data, dt, 0, total / wsum);
  return 0;
}

int32_t kiln_uk_loss(const kiln_uk_args *a) {
#define LOSS_CALL(DT) return loss_body(a, DT)
  DISPATCH_FLOAT(a->in[0].dtype, LOSS_CALL)
#undef LOSS_CALL
}
