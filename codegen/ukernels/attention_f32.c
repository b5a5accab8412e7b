/*
 * Attention's f32 fast path (`kiln_uk_attention_f32`), with its f32 register tiles and, for
 * CPUs with avx512_bf16, its bf16 tiles; the general kernel (`kiln_uk_attention`) is in nn.c.
 * See kiln_uk.h for the contract; the Rust side that packs iattr/fattr is
 * codegen/src/uk/nn.rs (`attention_f32`, `widen_attention`, `bf16_attention`).
 */
#include "kiln_uk.h"
#include "kiln_uk_ops.h" /* MASK_* codes, generated from codegen/src/uk/codes.rs */
#include "kiln_math.h"

static int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---------------------------------------------------------------------------------------------
 * Attention, f32 fast path: no KV cache, softcap, sliding window or QK output (the lowering
 * picks kiln_uk_attention for those), f32 Q/K/V, mask none, bool or f32, nonpad lengths
 * without the causal mask.
 *
 * iattr: 0 three_d, 1 B, 2 Hq, 3 Hkv, 4 Sq, 5 T, 6 Dk, 7 Dv, 8 is_causal, 9 mask kind
 *        (MASK_NONE, MASK_BOOL, MASK_FLOAT), 10-13 mask shape padded to 4-D, 14 query rows per task, 15 T padded
 *        to a multiple of the tile width, 16 wide tiles (1: 32 columns of 64-byte vectors, for
 *        targets with 512-bit registers; 0: 16 columns of 32-byte vectors; 2: the bf16 tiles,
 *        32 columns on vdpbf16ps, for avx512_bf16 targets and bf16-valued Q, K and V).
 * fattr: 0 scale.
 * in: Q, K, V ([B, H, S, D], or [B, S, H*D] when three_d), attn_mask?, -, -,
 *     nonpad_kv_seqlen? (i64 [B]: batch b sees its first nonpad[b] keys only; the later ones
 *     are never read, so they may hold anything). out: Y.
 * thread scratch: Kᵀ [Dk, Tp] and the scores of a row block [rows, Tp], f32 (the bf16
 * tiles, iattr[16] = 2: see afb_task).
 *
 * One task per (batch, head, block of query rows): the block's scores against every key live
 * in the thread's scratch, so the [Sq, T] matrix of all heads is never stored. Scores are
 * Q·Kᵀ·scale (the operator scales Q and K by sqrt(scale) each; the results differ by
 * rounding), accumulated in f32 by 4x16 register tiles written with vector types.
 * ------------------------------------------------------------------------------------------- */

#define AF_NC 16
#define AF_NC_WIDE 32
typedef float af_v8 __attribute__((vector_size(32), aligned(4)));
/* The wide tiles' vectors: one zmm register where the target has 512-bit registers (the
 * lowering picks them only there; elsewhere two 32-byte registers each, and the 4x32 tiles
 * would spill). */
typedef float af_v16 __attribute__((vector_size(64), aligned(4)));

typedef struct {
  const kiln_uk_args *a;
  int64_t three_d, B, Hq, Hkv, Sq, T, Dk, Dv, causal, mask_kind, mstr[4], mlen, rows, Tp, blocks, wide;
  const int64_t *nonpad; /* NULL: every batch sees all T keys */
  float scale;
} af_job;

/* Macros, not functions: vector arguments would change the ABI of a non-inlined helper. */
#define af_load(p) (*(const af_v8 *)(p))
#define af_store(p, v) (*(af_v8 *)(p) = (v))

/* The tiles keep their accumulators in named variables, not arrays: an array indexed by a
 * row counter lives in memory, and every FMA then loads and stores its accumulator. */

/* The register tiles, generated for each vector type V of H floats: PREFIX_scores4 and
 * PREFIX_out4 cover 4 rows x 2H columns in eight accumulators, PREFIX_scores1 and PREFIX_out1
 * one row. af_ (32-byte vectors, 16 columns) and afw_ (64-byte vectors, 32 columns) are the
 * same code at two widths.
 *
 * scores: sc[r][j0..j0+2H) = scale * sum_d q_r[d] * kt[d][j0..];
 * out:    y_r[d0..d0+2H) = sum_j p_r[j] * v_j[d0..], p_r the probability rows p, p + Tp, ... */
#define AF_TILES(PREFIX, V, H)                                                                          \
  static void PREFIX##scores4(const float *q0, const float *q1, const float *q2, const float *q3,        \
                              const float *kt, int64_t Tp, int64_t Dk, int64_t j0, float *sc, float scale) { \
    V a00 = {0}, a01 = {0}, a10 = {0}, a11 = {0}, a20 = {0}, a21 = {0}, a30 = {0}, a31 = {0};            \
    for (int64_t d = 0; d < Dk; d++) {                                                                  \
      V k0 = *(const V *)(kt + d * Tp + j0), k1 = *(const V *)(kt + d * Tp + j0 + H);                   \
      float s0 = q0[d], s1 = q1[d], s2 = q2[d], s3 = q3[d];                                             \
      a00 += k0 * s0, a01 += k1 * s0;                                                                   \
      a10 += k0 * s1, a11 += k1 * s1;                                                                   \
      a20 += k0 * s2, a21 += k1 * s2;                                                                   \
      a30 += k0 * s3, a31 += k1 * s3;                                                                   \
    }                                                                                                   \
    *(V *)(sc + j0) = a00 * scale, *(V *)(sc + j0 + H) = a01 * scale;                                   \
    *(V *)(sc + Tp + j0) = a10 * scale, *(V *)(sc + Tp + j0 + H) = a11 * scale;                         \
    *(V *)(sc + 2 * Tp + j0) = a20 * scale, *(V *)(sc + 2 * Tp + j0 + H) = a21 * scale;                 \
    *(V *)(sc + 3 * Tp + j0) = a30 * scale, *(V *)(sc + 3 * Tp + j0 + H) = a31 * scale;                 \
  }                                                                                                     \
  static void PREFIX##scores1(const float *q0, const float *kt, int64_t Tp, int64_t Dk, int64_t j0,      \
                              float *sc, float scale) {                                                 \
    V a00 = {0}, a01 = {0};                                                                             \
    for (int64_t d = 0; d < Dk; d++) {                                                                  \
      float s0 = q0[d];                                                                                 \
      a00 += *(const V *)(kt + d * Tp + j0) * s0, a01 += *(const V *)(kt + d * Tp + j0 + H) * s0;       \
    }                                                                                                   \
    *(V *)(sc + j0) = a00 * scale, *(V *)(sc + j0 + H) = a01 * scale;                                   \
  }                                                                                                     \
  static void PREFIX##out4(const float *p, int64_t Tp, const float *v, int64_t vstride, int64_t T,       \
                           int64_t d0, float *y0, float *y1, float *y2, float *y3) {                    \
    V a00 = {0}, a01 = {0}, a10 = {0}, a11 = {0}, a20 = {0}, a21 = {0}, a30 = {0}, a31 = {0};            \
    for (int64_t j = 0; j < T; j++) {                                                                   \
      V v0 = *(const V *)(v + j * vstride + d0), v1 = *(const V *)(v + j * vstride + d0 + H);           \
      float p0 = p[j], p1 = p[Tp + j], p2 = p[2 * Tp + j], p3 = p[3 * Tp + j];                          \
      a00 += v0 * p0, a01 += v1 * p0;                                                                   \
      a10 += v0 * p1, a11 += v1 * p1;                                                                   \
      a20 += v0 * p2, a21 += v1 * p2;                                                                   \
      a30 += v0 * p3, a31 += v1 * p3;                                                                   \
    }                                                                                                   \
    *(V *)(y0 + d0) = a00, *(V *)(y0 + d0 + H) = a01;                                                   \
    *(V *)(y1 + d0) = a10, *(V *)(y1 + d0 + H) = a11;                                                   \
    *(V *)(y2 + d0) = a20, *(V *)(y2 + d0 + H) = a21;                                                   \
    *(V *)(y3 + d0) = a30, *(V *)(y3 + d0 + H) = a31;                                                   \
  }                                                                                                     \
  static void PREFIX##out1(const float *p, const float *v, int64_t vstride, int64_t T, int64_t d0,      \
                           float *y0) {                                                                 \
    V a00 = {0}, a01 = {0};                                                                             \
    for (int64_t j = 0; j < T; j++) {                                                                   \
      float p0 = p[j];                                                                                  \
      a00 += *(const V *)(v + j * vstride + d0) * p0, a01 += *(const V *)(v + j * vstride + d0 + H) * p0; \
    }                                                                                                   \
    *(V *)(y0 + d0) = a00, *(V *)(y0 + d0 + H) = a01;                                                   \
  }

AF_TILES(af_, af_v8, 8)
AF_TILES(afw_, af_v16, 16)

#if defined(__x86_64__)
/* bf16 tiles (iattr[16] = 2; chosen for targets with avx512_bf16 when Q, K and V hold bf16
 * values, as the bf16 autocast leaves them): both products run on vdpbf16ps, which multiplies
 * pairs of bf16 values and accumulates in f32. Kᵀ is packed as pairs along d ([ceil(Dk/2)][Tp]
 * words holding k[j][2dp] low, k[j][2dp+1] high), V as pairs along the keys ([Tp/2][Dv]), the
 * probabilities as pairs along the keys, rounded to nearest even (Q, K and V are exact in bf16;
 * the probabilities are the one rounding these tiles add). 4 rows x 32 columns as the wide f32
 * tiles. The target attribute compiles these functions for avx512_bf16 only; the lowering
 * calls them only on such targets. */
typedef __bf16 afb_bh32 __attribute__((vector_size(64)));
typedef uint32_t afb_u16 __attribute__((vector_size(64), aligned(4)));
#define AFB_TARGET __attribute__((target("avx512f,avx512bf16,evex512")))
#define afb_dot(acc, pairs, bcast) __builtin_ia32_dpbf16ps_512((acc), (afb_bh32)(pairs), (afb_bh32)(bcast))

/* The bf16 pair of two bf16-valued floats (truncation is exact for them). */
static inline uint32_t afb_pair(float lo, float hi) {
  uint32_t l, h;
  __builtin_memcpy(&l, &lo, 4);
  __builtin_memcpy(&h, &hi, 4);
  return (l >> 16) | (h & 0xffff0000u);
}

/* f32 to bf16 bits, rounded to nearest even (finite values). */
static inline uint32_t afb_round(float x) {
  uint32_t b;
  __builtin_memcpy(&b, &x, 4);
  return (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
}

AFB_TARGET static void afb_scores4(const uint32_t *q0, const uint32_t *q1, const uint32_t *q2,
                                   const uint32_t *q3, const uint32_t *ktp, int64_t Tp, int64_t Dk2,
                                   int64_t j0, float *sc, float scale) {
  af_v16 a00 = {0}, a01 = {0}, a10 = {0}, a11 = {0}, a20 = {0}, a21 = {0}, a30 = {0}, a31 = {0};
  for (int64_t d = 0; d < Dk2; d++) {
    afb_u16 k0 = *(const afb_u16 *)(ktp + d * Tp + j0), k1 = *(const afb_u16 *)(ktp + d * Tp + j0 + 16);
    afb_u16 s0 = q0[d] + (afb_u16){0}, s1 = q1[d] + (afb_u16){0}, s2 = q2[d] + (afb_u16){0},
            s3 = q3[d] + (afb_u16){0};
    a00 = afb_dot(a00, k0, s0), a01 = afb_dot(a01, k1, s0);
    a10 = afb_dot(a10, k0, s1), a11 = afb_dot(a11, k1, s1);
    a20 = afb_dot(a20, k0, s2), a21 = afb_dot(a21, k1, s2);
    a30 = afb_dot(a30, k0, s3), a31 = afb_dot(a31, k1, s3);
  }
  *(af_v16 *)(sc + j0) = a00 * scale, *(af_v16 *)(sc + j0 + 16) = a01 * scale;
  *(af_v16 *)(sc + Tp + j0) = a10 * scale, *(af_v16 *)(sc + Tp + j0 + 16) = a11 * scale;
  *(af_v16 *)(sc + 2 * Tp + j0) = a20 * scale, *(af_v16 *)(sc + 2 * Tp + j0 + 16) = a21 * scale;
  *(af_v16 *)(sc + 3 * Tp + j0) = a30 * scale, *(af_v16 *)(sc + 3 * Tp + j0 + 16) = a31 * scale;
}

AFB_TARGET static void afb_scores1(const uint32_t *q0, const uint32_t *ktp, int64_t Tp, int64_t Dk2,
                                   int64_t j0, float *sc, float scale) {
  af_v16 a00 = {0}, a01 = {0};
  for (int64_t d = 0; d < Dk2; d++) {
    afb_u16 s0 = q0[d] + (afb_u16){0};
    a00 = afb_dot(a00, *(const afb_u16 *)(ktp + d * Tp + j0), s0);
    a01 = afb_dot(a01, *(const afb_u16 *)(ktp + d * Tp + j0 + 16), s0);
  }
  *(af_v16 *)(sc + j0) = a00 * scale, *(af_v16 *)(sc + j0 + 16) = a01 * scale;
}

/* y_r[d0..d0+32) = sum over key pairs jp of pp_r[jp] · vp[jp][d0..]: pp the probability pair
 * rows (Tp/2 words apart), vp the value pairs (Dv words a row). */
AFB_TARGET static void afb_out4(const uint32_t *pp, int64_t Tp2, const uint32_t *vp, int64_t Dv, int64_t T2,
                                int64_t d0, float *y0, float *y1, float *y2, float *y3) {
  af_v16 a00 = {0}, a01 = {0}, a10 = {0}, a11 = {0}, a20 = {0}, a21 = {0}, a30 = {0}, a31 = {0};
  for (int64_t j = 0; j < T2; j++) {
    afb_u16 v0 = *(const afb_u16 *)(vp + j * Dv + d0), v1 = *(const afb_u16 *)(vp + j * Dv + d0 + 16);
    afb_u16 p0 = pp[j] + (afb_u16){0}, p1 = pp[Tp2 + j] + (afb_u16){0}, p2 = pp[2 * Tp2 + j] + (afb_u16){0},
            p3 = pp[3 * Tp2 + j] + (afb_u16){0};
    a00 = afb_dot(a00, v0, p0), a01 = afb_dot(a01, v1, p0);
    a10 = afb_dot(a10, v0, p1), a11 = afb_dot(a11, v1, p1);
    a20 = afb_dot(a20, v0, p2), a21 = afb_dot(a21, v1, p2);
    a30 = afb_dot(a30, v0, p3), a31 = afb_dot(a31, v1, p3);
  }
  *(af_v16 *)(y0 + d0) = a00, *(af_v16 *)(y0 + d0 + 16) = a01;
  *(af_v16 *)(y1 + d0) = a10, *(af_v16 *)(y1 + d0 + 16) = a11;
  *(af_v16 *)(y2 + d0) = a20, *(af_v16 *)(y2 + d0 + 16) = a21;
  *(af_v16 *)(y3 + d0) = a30, *(af_v16 *)(y3 + d0 + 16) = a31;
}

AFB_TARGET static void afb_out1(const uint32_t *pp, const uint32_t *vp, int64_t Dv, int64_t T2, int64_t d0,
                                float *y0) {
  af_v16 a00 = {0}, a01 = {0};
  for (int64_t j = 0; j < T2; j++) {
    afb_u16 p0 = pp[j] + (afb_u16){0};
    a00 = afb_dot(a00, *(const afb_u16 *)(vp + j * Dv + d0), p0);
    a01 = afb_dot(a01, *(const afb_u16 *)(vp + j * Dv + d0 + 16), p0);
  }
  *(af_v16 *)(y0 + d0) = a00, *(af_v16 *)(y0 + d0 + 16) = a01;
}
#endif

/* The most query rows a task takes (iattr[14]; `ATTN_ROWS` in codegen/src/uk/nn.rs keeps to it). */
#define AF_MAX_ROWS 128

/* The softmax of a block's score rows runs in phases over all its rows (maxima, numerators,
 * sums), not row after row: a row of 128 keys is 8 vectors, too short for the out-of-order
 * core to hide the latency of its chain (maximum, exp, sum, division) behind the next row's;
 * phase by phase, the rows' chains are independent instructions side by side (BERT-base's
 * attention on one thread, Zen 5: 5.0-5.4 → 4.7-4.9 ms per run). Each row's values and their
 * order of operations are the same as one row at a time. */

/* The maximum of row[0..Tp) (Tp a multiple of 8) on four vectors of 8 lanes: one vector
 * would be a chain of dependent instructions. */
static float af_row_max(const float *row, int64_t Tp) {
  float ninf = -__builtin_inff();
  af_v8 m0 = {ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf}, m1 = m0, m2 = m0, m3 = m0;
  int64_t t32 = Tp / 32 * 32;
  for (int64_t t = 0; t < t32; t += 32) {
    m0 = __builtin_elementwise_max(m0, af_load(row + t));
    m1 = __builtin_elementwise_max(m1, af_load(row + t + 8));
    m2 = __builtin_elementwise_max(m2, af_load(row + t + 16));
    m3 = __builtin_elementwise_max(m3, af_load(row + t + 24));
  }
  for (int64_t t = t32; t < Tp; t += 8) m0 = __builtin_elementwise_max(m0, af_load(row + t));
  af_v8 vmx = __builtin_elementwise_max(__builtin_elementwise_max(m0, m1), __builtin_elementwise_max(m2, m3));
  float mx = ninf;
  for (int l = 0; l < 8; l++) mx = vmx[l] > mx ? vmx[l] : mx;
  return mx;
}

/* The sum of row[0..Tp) on four vectors of 8 lanes (the order of the additions differs from
 * a serial sum by rounding only). */
static float af_row_sum(const float *row, int64_t Tp) {
  af_v8 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
  int64_t t32 = Tp / 32 * 32;
  for (int64_t t = 0; t < t32; t += 32) {
    s0 += af_load(row + t);
    s1 += af_load(row + t + 8);
    s2 += af_load(row + t + 16);
    s3 += af_load(row + t + 24);
  }
  for (int64_t t = t32; t < Tp; t += 8) s0 += af_load(row + t);
  af_v8 vsum = (s0 + s1) + (s2 + s3);
  float sum = 0;
  for (int l = 0; l < 8; l++) sum += vsum[l];
  return sum;
}

/* row[T..Tp) = -inf (Tp a multiple of 8), in vector stores: the maximum reads the row as
 * vectors right after, and a vector load cannot take its data from several narrower stores
 * still in flight (store-to-load forwarding), so it would wait for them to retire. */
static void af_fill_tail(float *row, int64_t T, int64_t Tp) {
  float ninf = -__builtin_inff();
  int64_t t0 = T / 8 * 8;
  if (t0 < T) {
    af_v8 x = af_load(row + t0);
    for (int l = 0; l < 8; l++) x[l] = t0 + l < T ? x[l] : ninf;
    af_store(row + t0, x);
    t0 += 8;
  }
  af_v8 all = {ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf};
  for (; t0 < Tp; t0 += 8) af_store(row + t0, all);
}

/* Softmax numerators of the nrows score rows (Tp floats apart; Tp a multiple of 8; entries
 * T..Tp may hold anything) in place: row[t] = exp(row[t] - max), row[T..Tp) = 0, and in
 * inv[r] 1 / the sum of the numerators, by which the caller scales the row's output (Dv
 * values) instead of dividing its Tp probabilities; a row whose every entry is -inf (fully
 * masked) is cleared with factor 0, so that it gives zeros, as the reference. exp runs in a
 * loop of its own, which LLVM vectorises. */
static void af_softmax_rows(float *sc, int64_t nrows, int64_t T, int64_t Tp, float *inv) {
  float ninf = -__builtin_inff();
  float mx[AF_MAX_ROWS];
  for (int64_t r = 0; r < nrows; r++) {
    float *row = sc + r * Tp;
    af_fill_tail(row, T, Tp);
    mx[r] = af_row_max(row, Tp);
  }
  for (int64_t r = 0; r < nrows; r++) {
    float *row = sc + r * Tp, m = mx[r];
    if (m == ninf) {
      for (int64_t t = 0; t < Tp; t++) row[t] = 0;
      continue;
    }
    /* Over whole vectors: the tail's -inf gives exp = 0 (kiln_expf clamps to -104). */
    for (int64_t t = 0; t < Tp; t++) row[t] = kiln_expf(row[t] - m);
  }
  for (int64_t r = 0; r < nrows; r++) inv[r] = mx[r] == ninf ? 0 : 1.0f / af_row_sum(sc + r * Tp, Tp);
}

/* Where a task's operands lie: its (batch, head), query rows [i0, i0 + nrows), the first
 * query row, key, value and output row with their row strides, and the keys it sees: T of
 * them (the batch's nonpad length, else all), their score rows Tp floats apart (T rounded up
 * to the tile width, at most the job's Tp, which sizes the scratch). */
typedef struct {
  int64_t b, h, hk, i0, nrows, qs, ks, vs, ys, T, Tp;
  const float *q0, *k0, *v0;
  float *y0;
} af_place;

static af_place af_locate(const af_job *j, int64_t task) {
  const kiln_uk_args *a = j->a;
  af_place p;
  int64_t bh = task / j->blocks;
  p.i0 = (task % j->blocks) * j->rows;
  p.b = bh / j->Hq, p.h = bh % j->Hq;
  int64_t hk = p.h / (j->Hq / j->Hkv), T = j->T, Dk = j->Dk, Dv = j->Dv;
  p.hk = hk;
  p.nrows = imin(j->rows, j->Sq - p.i0);
  p.T = T;
  if (j->nonpad) {
    int64_t n = j->nonpad[p.b]; /* model data: clamped to 0..T */
    p.T = n < 0 ? 0 : imin(n, T);
  }
  int64_t cols = j->wide ? AF_NC_WIDE : AF_NC;
  p.Tp = (p.T + cols - 1) / cols * cols;
  const float *Q = a->in[0].data, *K = a->in[1].data, *V = a->in[2].data;
  float *Y = a->out[0].data;
  if (j->three_d) {
    p.qs = j->Hq * Dk, p.ks = j->Hkv * Dk, p.vs = j->Hkv * Dv, p.ys = j->Hq * Dv;
    p.q0 = Q + p.b * j->Sq * p.qs + p.h * Dk;
    p.k0 = K + p.b * T * p.ks + hk * Dk;
    p.v0 = V + p.b * T * p.vs + hk * Dv;
    p.y0 = Y + p.b * j->Sq * p.ys + p.h * Dv;
  } else {
    p.qs = Dk, p.ks = Dk, p.vs = Dv, p.ys = Dv;
    p.q0 = Q + bh * j->Sq * Dk;
    p.k0 = K + (p.b * j->Hkv + hk) * T * Dk;
    p.v0 = V + (p.b * j->Hkv + hk) * T * Dv;
    p.y0 = Y + bh * j->Sq * Dv;
  }
  return p;
}

/* Mask and softmax numerators of the block's score rows (Tp apart in sc), with each row's
 * normalising factor in inv[r] (af_softmax_rows). */
static void af_mask_softmax(const af_job *j, const af_place *p, float *sc, float *inv) {
  const kiln_uk_args *a = j->a;
  const kiln_tensor *m = j->mask_kind != MASK_NONE ? &a->in[3] : NULL;
  int64_t T = p->T, Tp = p->Tp, mlen = imin(j->mlen, T);
  float ninf = -__builtin_inff();
  for (int64_t r = 0; r < p->nrows; r++) {
    int64_t i = p->i0 + r;
    float *row = sc + r * Tp;
    if (m) {
      int64_t mo = p->b * j->mstr[0] + p->h * j->mstr[1] + i * j->mstr[2];
      if (j->mask_kind == MASK_BOOL) {
        const uint8_t *mb = (const uint8_t *)m->data + mo;
        for (int64_t t = 0; t < mlen; t++) row[t] = mb[t * j->mstr[3]] ? row[t] : ninf;
      } else {
        const float *mf = (const float *)m->data + mo;
        for (int64_t t = 0; t < mlen; t++) row[t] += mf[t * j->mstr[3]];
      }
      for (int64_t t = mlen; t < T; t++) row[t] = ninf;
    }
    if (j->causal)
      for (int64_t t = i + 1; t < T; t++) row[t] = ninf;
  }
  af_softmax_rows(sc, p->nrows, T, Tp, inv);
}

/* What a thread's scratch holds from its previous task of this call: the packed keys (and,
 * for the bf16 tiles, values) of one (batch, kv head). The task index runs over a head's row
 * blocks first and the threads take tasks in order, so a thread mostly finds its next task's
 * keys packed already (Whisper's 1500 keys: 12 row blocks per head). The tags sit at the start
 * of each thread's scratch (AF_TAG_BYTES, `attention_tiles` in codegen/src/uk/nn.rs) and are
 * cleared before every call, since other kernels use the same scratch in between. */
typedef struct {
  int64_t packed, b, hk;
} af_tag;
#define AF_TAG_BYTES 64

/* Whether the thread's scratch holds p's packed keys; marks them as held, since the caller
 * packs them when not. */
static int af_keys_packed(af_tag *tag, const af_place *p) {
  if (tag->packed && tag->b == p->b && tag->hk == p->hk) return 1;
  tag->packed = 1, tag->b = p->b, tag->hk = p->hk;
  return 0;
}

static void af_task(void *data, int64_t task, int64_t tid) {
  const af_job *j = data;
  const kiln_uk_args *a = j->a;
  af_place p = af_locate(j, task);
  int64_t i0 = p.i0, nrows = p.nrows, T = p.T, Tp = p.Tp, Dk = j->Dk, Dv = j->Dv;
  int64_t qs = p.qs, ks = p.ks, vs = p.vs, ys = p.ys;
  const float *q0 = p.q0, *k0 = p.k0, *v0 = p.v0;
  float *y0 = p.y0;
  char *scratch = kiln_rt_thread_scratch(a->ctx, tid);
  float *kt = (float *)(scratch + AF_TAG_BYTES);
  float *sc = kt + Dk * Tp;
  float inv[AF_MAX_ROWS];
  if (!af_keys_packed((af_tag *)scratch, &p)) {
    /* Kᵀ in blocks of 16 keys: each block's rows stay in L1 while every d writes one line. */
    for (int64_t t0 = 0; t0 < T; t0 += 16) {
      int64_t t1 = imin(t0 + 16, T);
      for (int64_t d = 0; d < Dk; d++)
        for (int64_t t = t0; t < t1; t++) kt[d * Tp + t] = k0[t * ks + d];
    }
    for (int64_t d = 0; d < Dk; d++)
      for (int64_t t = T; t < Tp; t++) kt[d * Tp + t] = 0;
  }
  /* Scores. */
  int64_t r4 = nrows / 4 * 4;
  /* Tp is a multiple of the tile width. */
  for (int64_t r = 0; r < r4; r += 4) {
    const float *q = q0 + (i0 + r) * qs;
    if (j->wide)
      for (int64_t jj = 0; jj < Tp; jj += AF_NC_WIDE)
        afw_scores4(q, q + qs, q + 2 * qs, q + 3 * qs, kt, Tp, Dk, jj, sc + r * Tp, j->scale);
    else
      for (int64_t jj = 0; jj < Tp; jj += AF_NC)
        af_scores4(q, q + qs, q + 2 * qs, q + 3 * qs, kt, Tp, Dk, jj, sc + r * Tp, j->scale);
  }
  for (int64_t r = r4; r < nrows; r++) {
    const float *q = q0 + (i0 + r) * qs;
    if (j->wide)
      for (int64_t jj = 0; jj < Tp; jj += AF_NC_WIDE) afw_scores1(q, kt, Tp, Dk, jj, sc + r * Tp, j->scale);
    else
      for (int64_t jj = 0; jj < Tp; jj += AF_NC) af_scores1(q, kt, Tp, Dk, jj, sc + r * Tp, j->scale);
  }
  af_mask_softmax(j, &p, sc, inv);
  /* Output rows: wide tiles of 32 columns (when chosen), tiles of 16, then the remaining
   * columns one by one; then each row scaled by its softmax factor. */
  int64_t dv32 = j->wide ? Dv / AF_NC_WIDE * AF_NC_WIDE : 0, dv16 = Dv / AF_NC * AF_NC;
  for (int64_t r = 0; r < r4; r += 4) {
    float *y = y0 + (i0 + r) * ys;
    for (int64_t d = 0; d < dv32; d += AF_NC_WIDE)
      afw_out4(sc + r * Tp, Tp, v0, vs, T, d, y, y + ys, y + 2 * ys, y + 3 * ys);
    for (int64_t d = dv32; d < dv16; d += AF_NC) af_out4(sc + r * Tp, Tp, v0, vs, T, d, y, y + ys, y + 2 * ys, y + 3 * ys);
  }
  for (int64_t r = r4; r < nrows; r++) {
    for (int64_t d = 0; d < dv32; d += AF_NC_WIDE) afw_out1(sc + r * Tp, v0, vs, T, d, y0 + (i0 + r) * ys);
    for (int64_t d = dv32; d < dv16; d += AF_NC) af_out1(sc + r * Tp, v0, vs, T, d, y0 + (i0 + r) * ys);
  }
  for (int64_t r = 0; r < nrows; r++)
    for (int64_t d = dv16; d < Dv; d++) {
      float acc = 0;
      for (int64_t t = 0; t < T; t++) acc += sc[r * Tp + t] * v0[t * vs + d];
      y0[(i0 + r) * ys + d] = acc;
    }
  for (int64_t r = 0; r < nrows; r++)
    for (int64_t d = 0; d < Dv; d++) y0[(i0 + r) * ys + d] *= inv[r];
}

#if defined(__x86_64__)
/* The bf16 tiles' task. Thread scratch, in order: Kᵀ pairs [ceil(Dk/2)][Tp], the scores
 * [rows][Tp] (f32), V pairs [Tp/2][Dv], probability pairs [rows][Tp/2], Q pairs
 * [rows][ceil(Dk/2)] (words). Keys past T pair with zeros. */
static void afb_task(void *data, int64_t task, int64_t tid) {
  const af_job *j = data;
  af_place p = af_locate(j, task);
  int64_t i0 = p.i0, nrows = p.nrows, T = p.T, Tp = p.Tp, Dk = j->Dk, Dv = j->Dv;
  int64_t Dk2 = (Dk + 1) / 2, Tp2 = Tp / 2, T2 = (T + 1) / 2;
  char *scratch = kiln_rt_thread_scratch(j->a->ctx, tid);
  uint32_t *ktp = (uint32_t *)(scratch + AF_TAG_BYTES);
  float *sc = (float *)(ktp + Dk2 * Tp);
  uint32_t *vp = (uint32_t *)(sc + j->rows * Tp);
  uint32_t *pp = vp + Tp2 * Dv;
  uint32_t *qp = pp + j->rows * Tp2;
  float inv[AF_MAX_ROWS];
  if (!af_keys_packed((af_tag *)scratch, &p)) {
    /* In blocks of 16 keys, as the f32 tiles' Kᵀ (Tp is a multiple of 32). */
    for (int64_t t0 = 0; t0 < Tp; t0 += 16)
      for (int64_t d = 0; d < Dk2; d++)
        for (int64_t t = t0; t < t0 + 16; t++) {
          const float *k = p.k0 + t * p.ks;
          ktp[d * Tp + t] = t < T ? afb_pair(k[2 * d], 2 * d + 1 < Dk ? k[2 * d + 1] : 0.0f) : 0;
        }
    for (int64_t jp = 0; jp < Tp2; jp++)
      for (int64_t d = 0; d < Dv; d++) {
        float lo = 2 * jp < T ? p.v0[2 * jp * p.vs + d] : 0.0f;
        float hi = 2 * jp + 1 < T ? p.v0[(2 * jp + 1) * p.vs + d] : 0.0f;
        vp[jp * Dv + d] = afb_pair(lo, hi);
      }
  }
  for (int64_t r = 0; r < nrows; r++) {
    const float *q = p.q0 + (i0 + r) * p.qs;
    for (int64_t d = 0; d < Dk2; d++) qp[r * Dk2 + d] = afb_pair(q[2 * d], 2 * d + 1 < Dk ? q[2 * d + 1] : 0.0f);
  }
  int64_t r4 = nrows / 4 * 4;
  for (int64_t r = 0; r < r4; r += 4) {
    const uint32_t *q = qp + r * Dk2;
    for (int64_t jj = 0; jj < Tp; jj += AF_NC_WIDE)
      afb_scores4(q, q + Dk2, q + 2 * Dk2, q + 3 * Dk2, ktp, Tp, Dk2, jj, sc + r * Tp, j->scale);
  }
  for (int64_t r = r4; r < nrows; r++)
    for (int64_t jj = 0; jj < Tp; jj += AF_NC_WIDE) afb_scores1(qp + r * Dk2, ktp, Tp, Dk2, jj, sc + r * Tp, j->scale);
  af_mask_softmax(j, &p, sc, inv);
  /* The probabilities, normalised as they are rounded to pairs. */
  for (int64_t r = 0; r < nrows; r++)
    for (int64_t jp = 0; jp < Tp2; jp++)
      pp[r * Tp2 + jp] = afb_round(sc[r * Tp + 2 * jp] * inv[r]) | afb_round(sc[r * Tp + 2 * jp + 1] * inv[r]) << 16;
  int64_t dv32 = Dv / AF_NC_WIDE * AF_NC_WIDE, ys = p.ys;
  for (int64_t r = 0; r < r4; r += 4) {
    float *y = p.y0 + (i0 + r) * ys;
    for (int64_t d = 0; d < dv32; d += AF_NC_WIDE)
      afb_out4(pp + r * Tp2, Tp2, vp, Dv, T2, d, y, y + ys, y + 2 * ys, y + 3 * ys);
  }
  for (int64_t r = r4; r < nrows; r++)
    for (int64_t d = 0; d < dv32; d += AF_NC_WIDE) afb_out1(pp + r * Tp2, vp, Dv, T2, d, p.y0 + (i0 + r) * ys);
  /* The columns past the last tile: the same pairs, one column at a time. */
  for (int64_t r = 0; r < nrows; r++)
    for (int64_t d = dv32; d < Dv; d++) {
      float acc = 0;
      for (int64_t jp = 0; jp < T2; jp++) {
        uint32_t pw = pp[r * Tp2 + jp], vw = vp[jp * Dv + d];
        uint32_t plo = pw << 16, phi = pw & 0xffff0000u, vlo = vw << 16, vhi = vw & 0xffff0000u;
        float fpl, fph, fvl, fvh;
        __builtin_memcpy(&fpl, &plo, 4), __builtin_memcpy(&fph, &phi, 4);
        __builtin_memcpy(&fvl, &vlo, 4), __builtin_memcpy(&fvh, &vhi, 4);
        acc += fpl * fvl + fph * fvh;
      }
      p.y0[(i0 + r) * ys + d] = acc;
    }
}
#endif

/* The most batch entries whose key lengths af_mask_lengths derives (on the caller's stack). */
#define AF_MAX_MASK_BATCH 64

/* Whether mask entry t of a mask row lets its key through: a boolean true, or a float above
 * -1e30 (NaN included). */
static int af_lets_through(const af_job *j, const kiln_tensor *m, int64_t at) {
  if (j->mask_kind == MASK_BOOL) return ((const uint8_t *)m->data)[at] != 0;
  return !(((const float *)m->data)[at] <= -1e30f);
}

/* Keys a mask hides from every query and head of a batch entry, after the last key any of
 * them lets through, are skipped as if given as nonpad lengths (lens[b]); without a causal
 * mask. A key masked out by a boolean mask, or by a float mask value at or below -1e30
 * (Hugging Face exports add finfo(float32).min; -inf too), gets a probability of exactly 0
 * in a row that lets any key through — the row's maximum is then one of its scores, so for
 * scores below 1e29 in magnitude score + mask - maximum is below -104, where exp is 0 — and
 * adds nothing to the output (finite V). Keys past the mask's length (mlen) are -inf for
 * every row and count 0 even in a row a float mask lets no key through, which averages over
 * the mask's keys, as the reference does: such a row keeps them all. Rows are scanned from
 * the last (a causal mask written as a tensor needs every key in its last row, and the scan
 * stops once a batch entry needs every key), each from its end down to the keys already
 * needed: reading the mask costs a 1/D fraction of the attention work it skips.
 * HF BERT-base with 48 tokens of 128 (a [1, 1, 128, 128] float mask): attention 3.9 → 2.1-2.2
 * ms per run on one thread. */
static int af_mask_lengths(const af_job *j, int64_t *lens) {
  if (j->mask_kind == MASK_NONE || j->causal || j->nonpad || j->B > AF_MAX_MASK_BATCH) return 0;
  const kiln_tensor *m = &j->a->in[3];
  int64_t mlen = imin(j->mlen, j->T), ms = j->mstr[3];
  int64_t heads = j->mstr[1] ? j->Hq : 1, rows = j->mstr[2] ? j->Sq : 1;
  for (int64_t b = 0; b < j->B; b++) {
    int64_t len = 0; /* the keys some row scanned so far needs */
    for (int64_t h = 0; h < heads && len < mlen; h++)
      for (int64_t i = rows - 1; i >= 0 && len < mlen; i--) {
        int64_t row = b * j->mstr[0] + h * j->mstr[1] + i * j->mstr[2];
        int64_t t = mlen - 1;
        while (t >= len && !af_lets_through(j, m, row + t * ms)) t--;
        if (t >= len) {
          len = t + 1;
        } else if (j->mask_kind == MASK_FLOAT) {
          /* None at or past len: does the row let any key through at all? */
          int any = 0;
          for (t = 0; t < len && !any; t++) any = af_lets_through(j, m, row + t * ms);
          if (!any) len = mlen;
        }
      }
    lens[b] = len > 0 ? len : j->T;
  }
  return 1;
}

int32_t kiln_uk_attention_f32(const kiln_uk_args *a) {
  const int64_t *ia = a->iattr;
  af_job j;
  j.a = a;
  j.three_d = ia[0];
  j.B = ia[1];
  j.Hq = ia[2];
  j.Hkv = ia[3];
  j.Sq = ia[4];
  j.T = ia[5];
  j.Dk = ia[6];
  j.Dv = ia[7];
  j.causal = ia[8];
  j.mask_kind = ia[9];
  int64_t acc = 1;
  for (int ax = 3; ax >= 0; ax--) {
    int64_t n = ia[10 + ax];
    j.mstr[ax] = (n == 1 && ax < 3) ? 0 : acc;
    acc *= n;
  }
  j.mlen = ia[13];
  j.rows = ia[14];
  j.Tp = ia[15];
  j.wide = ia[16];
  j.blocks = (j.Sq + j.rows - 1) / j.rows;
  j.nonpad = a->n_in > 6 && a->in[6].data ? (const int64_t *)a->in[6].data : NULL;
  j.scale = (float)a->fattr[0];
  int64_t lens[AF_MAX_MASK_BATCH];
  if (af_mask_lengths(&j, lens)) j.nonpad = lens;
  for (int64_t t = 0; t < kiln_rt_num_threads(a->ctx); t++) ((af_tag *)kiln_rt_thread_scratch(a->ctx, t))->packed = 0;
#if defined(__x86_64__)
  if (j.wide == 2) {
    kiln_rt_parallel_for(a->ctx, afb_task, &j, j.B * j.Hq * j.blocks);
    return KILN_UK_OK;
  }
#endif
  kiln_rt_parallel_for(a->ctx, af_task, &j, j.B * j.Hq * j.blocks);
  return KILN_UK_OK;
}
