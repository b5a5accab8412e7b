/*
 * Micro-kernels for the nn family: pooling, convolution, matrix products, Einsum, Det,
 * Attention and RotaryEmbedding (Attention's f32 fast path is in attention_f32.c). See kiln_uk.h for the contract; the Rust side that packs
 * iattr/fattr is codegen/src/uk/nn.rs, and every kernel below documents the order it reads.
 *
 * Arithmetic follows the reference interpreter (ir/src/ops): convolutions and products of
 * f16/bf16/f32 accumulate in f32 (f16/bf16 widened once, rounded once at the end), f64 in f64,
 * integers in wrapping 64-bit arithmetic; pools, Einsum, Det, Attention and RotaryEmbedding
 * compute in f64. Spatial kernels handle up to 3 spatial axes (the Rust side rejects more);
 * fewer are padded with leading unit axes so that one loop nest serves 1-D to 3-D.
 */
#include "kiln_uk.h"
#include "kiln_uk_ops.h" /* ACC_*, MASK_* codes, generated from codegen/src/uk/codes.rs */
#include "kiln_math.h"

#include <float.h>

#define SP 3 /* spatial axes after padding */

/* ---------------------------------------------------------------------------------------------
 * Shared helpers
 * ------------------------------------------------------------------------------------------- */

static int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

/* Takes `bytes` from a 64-byte aligned scratch cursor (the Rust side sizes scratch with the same
   rounding: see `Carve` in nn.rs). */
static void *carve(char **cur, int64_t bytes) {
  void *p = *cur;
  *cur += (bytes + 63) & ~(int64_t)63;
  return p;
}

static int has_in(const kiln_uk_args *a, int64_t i) { return i < a->n_in && a->in[i].data != NULL; }

/* Widens a float tensor to f32 (an f32 tensor is copied). */
static void load_f32(float *dst, const kiln_tensor *t) {
  int64_t n = t->numel;
  switch (t->dtype) {
  case KILN_F16: {
    const uint16_t *p = t->data;
    for (int64_t i = 0; i < n; i++) dst[i] = kiln_f16_to_f32(p[i]);
    break;
  }
  case KILN_BF16: {
    const uint16_t *p = t->data;
    for (int64_t i = 0; i < n; i++) dst[i] = kiln_bf16_to_f32(p[i]);
    break;
  }
  case KILN_F32: {
    const float *p = t->data;
    for (int64_t i = 0; i < n; i++) dst[i] = p[i];
    break;
  }
  default:
    for (int64_t i = 0; i < n; i++) dst[i] = (float)kiln_load_f64(t->data, t->dtype, i);
  }
}

static void store_f32(const kiln_tensor *t, const float *src) {
  int64_t n = t->numel;
  switch (t->dtype) {
  case KILN_F16: {
    uint16_t *p = t->data;
    for (int64_t i = 0; i < n; i++) p[i] = kiln_f32_to_f16(src[i]);
    break;
  }
  case KILN_BF16: {
    uint16_t *p = t->data;
    for (int64_t i = 0; i < n; i++) p[i] = kiln_f32_to_bf16(src[i]);
    break;
  }
  default:
    for (int64_t i = 0; i < n; i++) kiln_store_f64(t->data, t->dtype, i, src[i]);
  }
}

static void load_i64(int64_t *dst, const kiln_tensor *t) {
  for (int64_t i = 0; i < t->numel; i++) dst[i] = kiln_load_i64(t->data, t->dtype, i);
}

/* Wraps into the element type, as numpy's integer arithmetic does. */
static void store_i64(const kiln_tensor *t, const int64_t *src) {
  for (int64_t i = 0; i < t->numel; i++) kiln_store_i64(t->data, t->dtype, i, src[i]);
}

/* Rounds v to float dtype `code` (f64 and anything else: unchanged). */
static double round_to(int64_t code, double v) {
  switch (code) {
  case KILN_F16: return kiln_f16_to_f32(kiln_f32_to_f16((float)v));
  case KILN_BF16: return kiln_bf16_to_f32(kiln_f32_to_bf16((float)v));
  case KILN_F32: return (float)v;
  default: return v;
  }
}

/* One spatial axis of a sliding window (see ir/src/ops/conv.rs `Axis`): output position o at
   tap k reads input index o * stride + k * dil - pad. For ConvTranspose, `in` is the Y extent
   and `out` the X extent of the equivalent convolution. */
typedef struct {
  int64_t in, out, k, stride, dil, pad;
} win_axis;

/* Outputs [*lo, *hi) whose tap k reads inside the input. */
static void valid_outputs(const win_axis *a, int64_t k, int64_t *lo, int64_t *hi) {
  int64_t first = k * a->dil - a->pad;
  int64_t l = first >= 0 ? 0 : (-first + a->stride - 1) / a->stride;
  int64_t limit = a->in - first;
  int64_t h = limit <= 0 ? 0 : (limit + a->stride - 1) / a->stride;
  h = imin(h, a->out);
  *lo = imin(l, h);
  *hi = h;
}

/* Reads `nsp` axes of (kernel, stride, dilation, pad_begin, pad_end) from iattr[at..] and the
   extents from the tensors' spatial dims, padded to SP axes with leading unit axes. */
static void read_axes(win_axis ax[SP], const int64_t *attr, int64_t nsp, const kiln_tensor *in,
                      const kiln_tensor *out) {
  int64_t lead = SP - nsp;
  for (int64_t i = 0; i < SP; i++) {
    if (i < lead) {
      win_axis u = {1, 1, 1, 1, 1, 0};
      ax[i] = u;
      continue;
    }
    const int64_t *p = attr + 5 * (i - lead);
    ax[i].k = p[0];
    ax[i].stride = p[1];
    ax[i].dil = p[2];
    ax[i].pad = p[3];
    ax[i].in = in->dims[2 + i - lead];
    ax[i].out = out->dims[2 + i - lead];
  }
}

/* ---------------------------------------------------------------------------------------------
 * MaxPool / AveragePool / LpPool
 *
 * iattr: kind (0 max, 1 average, 2 lp), nsp, count_include_pad, storage_order,
 *        then per spatial axis: kernel, stride, dilation, pad_begin, pad_end.
 * fattr: p (LpPool).
 * in: X [N, C, spatial...]; out: Y, Indices? (i64, MaxPool).
 * ------------------------------------------------------------------------------------------- */

typedef struct {
  const kiln_uk_args *a;
  win_axis ax[SP];
  int64_t pad_end[SP];
  int64_t kind, count_include_pad, storage_order;
  double p;
} pool_job;

/* Number of taps of output o on axis `a` inside the input or its explicit padding. */
static int64_t padded_count(const win_axis *a, int64_t pad_end, int64_t o) {
  int64_t n = 0;
  for (int64_t k = 0; k < a->k; k++) {
    int64_t s = o * a->stride + k * a->dil - a->pad;
    if (s >= -a->pad && s < a->in + pad_end) n++;
  }
  return n;
}

/* MaxPool of one f32 plane, 2-D, no dilation, no Indices output: the common CNN case. Taps
   outside the input are skipped (as -inf); the first maximum wins and NaN never replaces a
   value, like the generic path. Interior outputs take the unchecked inner loop. */
static void maxpool2d_f32_plane(const win_axis *ax, const float *x, float *y) {
  const win_axis *r = &ax[1], *c = &ax[2];
  for (int64_t oh = 0; oh < r->out; oh++) {
    int64_t h0 = oh * r->stride - r->pad;
    int64_t kh_lo = h0 < 0 ? -h0 : 0, kh_hi = r->in - h0 < r->k ? r->in - h0 : r->k;
    float *yrow = y + oh * c->out;
    for (int64_t ow = 0; ow < c->out; ow++) {
      int64_t w0 = ow * c->stride - c->pad;
      int64_t kw_lo = w0 < 0 ? -w0 : 0, kw_hi = c->in - w0 < c->k ? c->in - w0 : c->k;
      int found = 0;
      float best = 0;
      for (int64_t kh = kh_lo; kh < kh_hi; kh++) {
        const float *xr = x + (h0 + kh) * c->in + w0;
        for (int64_t kw = kw_lo; kw < kw_hi; kw++) {
          float v = xr[kw];
          if (!found || v > best) {
            best = v;
            found = 1;
          }
        }
      }
      yrow[ow] = found ? best : -__builtin_inff();
    }
  }
}

static void pool_task(void *data, int64_t plane, int64_t tid) {
  (void)tid;
  const pool_job *j = data;
  const kiln_uk_args *a = j->a;
  const win_axis *ax = j->ax;
  int64_t dt = a->in[0].dtype;
  if (j->kind == 0 && dt == KILN_F32 && a->n_out == 1 && ax[0].in == 1 && ax[0].out == 1 && ax[0].k == 1 &&
      ax[1].dil == 1 && ax[2].dil == 1) {
    int64_t in_plane = ax[1].in * ax[2].in, out_plane = ax[1].out * ax[2].out;
    maxpool2d_f32_plane(ax, (const float *)a->in[0].data + plane * in_plane,
                        (float *)a->out[0].data + plane * out_plane);
    return;
  }
  int64_t in_plane = ax[0].in * ax[1].in * ax[2].in;
  int64_t out_plane = ax[0].out * ax[1].out * ax[2].out;
  int64_t xoff = plane * in_plane, yoff = plane * out_plane;
  const void *x = a->in[0].data;
  const float *xf = dt == KILN_F32 ? (const float *)x + xoff : NULL;
  int64_t *idx = a->n_out > 1 ? (int64_t *)a->out[1].data + yoff : NULL;
  /* Column-major strides of the real spatial axes (leading unit axes do not change them). */
  int64_t col[SP] = {1, ax[0].in, ax[0].in * ax[1].in};
  int64_t yi = 0;
  for (int64_t o0 = 0; o0 < ax[0].out; o0++)
    for (int64_t o1 = 0; o1 < ax[1].out; o1++)
      for (int64_t o2 = 0; o2 < ax[2].out; o2++, yi++) {
        int64_t o[SP] = {o0, o1, o2};
        int64_t lo[SP], hi[SP];
        for (int i = 0; i < SP; i++) {
          /* The taps k in [lo, hi) read inside the input. */
          int64_t base = o[i] * ax[i].stride - ax[i].pad;
          int64_t l = base >= 0 ? 0 : (-base + ax[i].dil - 1) / ax[i].dil;
          int64_t h = ax[i].in - base <= 0 ? 0 : (ax[i].in - base + ax[i].dil - 1) / ax[i].dil;
          lo[i] = l;
          hi[i] = imin(h, ax[i].k);
        }
        int found = 0;
        double best = 0, sum = 0;
        int64_t n = 0, best_r = 0, best_c = 0;
        for (int64_t k0 = lo[0]; k0 < hi[0]; k0++) {
          int64_t s0 = o0 * ax[0].stride + k0 * ax[0].dil - ax[0].pad;
          for (int64_t k1 = lo[1]; k1 < hi[1]; k1++) {
            int64_t s1 = o1 * ax[1].stride + k1 * ax[1].dil - ax[1].pad;
            int64_t row = (s0 * ax[1].in + s1) * ax[2].in;
            for (int64_t k2 = lo[2]; k2 < hi[2]; k2++) {
              int64_t s2 = o2 * ax[2].stride + k2 * ax[2].dil - ax[2].pad;
              int64_t r = row + s2;
              double v = xf ? (double)xf[r] : kiln_load_f64(x, dt, xoff + r);
              if (j->kind == 0) {
                /* First maximum wins; NaN never replaces a value. */
                if (!found || v > best) {
                  best = v;
                  best_r = r;
                  best_c = s0 * col[0] + s1 * col[1] + s2 * col[2];
                  found = 1;
                }
              } else if (j->kind == 1) {
                sum += v;
                n++;
              } else {
                sum += __builtin_pow(__builtin_fabs(v), j->p);
              }
            }
          }
        }
        double y;
        if (j->kind == 0) {
          if (found) {
            y = best;
          } else if (kiln_dtype_is_float(dt)) {
            y = -__builtin_inf();
          } else {
            y = dt == KILN_I8 ? -128.0 : 0.0; /* the lowest value of i8 / u8 */
          }
          if (idx) idx[yi] = found ? xoff + (j->storage_order == 1 ? best_c : best_r) : -1;
        } else if (j->kind == 1) {
          if (j->count_include_pad) {
            n = 1;
            for (int i = 0; i < SP; i++) n *= padded_count(&ax[i], j->pad_end[i], o[i]);
          }
          y = sum / (double)n;
        } else {
          y = __builtin_pow(sum, 1.0 / j->p);
        }
        if (dt == KILN_F32)
          ((float *)a->out[0].data)[yoff + yi] = (float)y;
        else
          kiln_store_f64(a->out[0].data, dt, yoff + yi, y);
      }
}

int32_t kiln_uk_pool(const kiln_uk_args *a) {
  pool_job j;
  j.a = a;
  j.kind = a->iattr[0];
  int64_t nsp = a->iattr[1];
  j.count_include_pad = a->iattr[2];
  j.storage_order = a->iattr[3];
  j.p = a->n_fattr > 0 ? a->fattr[0] : 2.0;
  read_axes(j.ax, a->iattr + 4, nsp, &a->in[0], &a->out[0]);
  for (int64_t i = 0; i < SP; i++)
    j.pad_end[i] = i < SP - nsp ? 0 : a->iattr[4 + 5 * (i - (SP - nsp)) + 4];
  int64_t planes = a->in[0].dims[0] * a->in[0].dims[1];
  kiln_rt_parallel_for(a->ctx, pool_task, &j, planes);
  return KILN_UK_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Channels-last MaxPool / AveragePool (2-D)
 *
 * iattr: kind (0 max, 1 average), count_include_pad,
 *        then for H and W: kernel, stride, dilation, pad_begin, pad_end.
 * in: X [N, H, W, C] (f32; u8 and i8 for max); out: Y [N, OH, OW, C]. One task per output row;
 * every tap is a contiguous run of C channels, so the inner loops vectorize along C. Max keeps
 * the first tap's value unless a later one is greater (NaN never replaces a value), like `pool`.
 * ------------------------------------------------------------------------------------------- */

typedef struct {
  const kiln_uk_args *a;
  int64_t kind, cip, c;
  int64_t k[2], s[2], d[2], pb[2], pe[2], in[2], out[2];
} pool_nhwc_job;

/* Taps of output o on axis i that lie in the input or its explicit padding. */
static int64_t nhwc_padded_count(const pool_nhwc_job *j, int i, int64_t o) {
  int64_t n = 0;
  for (int64_t k = 0; k < j->k[i]; k++) {
    int64_t s = o * j->s[i] + k * j->d[i] - j->pb[i];
    if (s >= -j->pb[i] && s < j->in[i] + j->pe[i]) n++;
  }
  return n;
}

static void pool_nhwc_task(void *data, int64_t row, int64_t tid) {
  (void)tid;
  const pool_nhwc_job *j = data;
  const int64_t C = j->c, H = j->in[0], W = j->in[1], OH = j->out[0], OW = j->out[1];
  const int64_t n = row / OH, oh = row % OH;
  const float *x = (const float *)j->a->in[0].data + n * H * W * C;
  float *y = (float *)j->a->out[0].data + row * OW * C;
  const int64_t h0 = oh * j->s[0] - j->pb[0];
  for (int64_t ow = 0; ow < OW; ow++, y += C) {
    const int64_t w0 = ow * j->s[1] - j->pb[1];
    int64_t cnt = 0;
    for (int64_t kh = 0; kh < j->k[0]; kh++) {
      const int64_t ih = h0 + kh * j->d[0];
      if (ih < 0 || ih >= H) continue;
      for (int64_t kw = 0; kw < j->k[1]; kw++) {
        const int64_t iw = w0 + kw * j->d[1];
        if (iw < 0 || iw >= W) continue;
        const float *restrict xp = x + (ih * W + iw) * C;
        float *restrict yp = y;
        if (cnt == 0) {
          for (int64_t c = 0; c < C; c++) yp[c] = xp[c];
        } else if (j->kind == 0) {
          for (int64_t c = 0; c < C; c++) yp[c] = xp[c] > yp[c] ? xp[c] : yp[c];
        } else {
          for (int64_t c = 0; c < C; c++) yp[c] += xp[c];
        }
        cnt++;
      }
    }
    if (j->kind == 0) {
      if (cnt == 0)
        for (int64_t c = 0; c < C; c++) y[c] = -__builtin_inff();
      continue;
    }
    int64_t div = j->cip ? nhwc_padded_count(j, 0, oh) * nhwc_padded_count(j, 1, ow) : cnt;
    if (cnt == 0)
      for (int64_t c = 0; c < C; c++) y[c] = 0.0f;
    const float fd = (float)div;
    for (int64_t c = 0; c < C; c++) y[c] = y[c] / fd;
  }
}

/* MaxPool of 8-bit integers (a quantized model's pool between its integer convolutions): the
   f32 task's loop on bytes, so a tap is one 64-lane max (vpmaxub / vpmaxsb) per 64 channels.
   An empty window gives the dtype's lowest value, as `pool`. */
#define POOL_NHWC_MAX_BYTES(T, LOWEST)                                                             \
  static void pool_nhwc_max_##T(void *data, int64_t row, int64_t tid) {                           \
    (void)tid;                                                                                     \
    const pool_nhwc_job *j = data;                                                                 \
    const int64_t C = j->c, H = j->in[0], W = j->in[1], OH = j->out[0], OW = j->out[1];           \
    const int64_t n = row / OH, oh = row % OH;                                                     \
    const T *x = (const T *)j->a->in[0].data + n * H * W * C;                                      \
    T *y = (T *)j->a->out[0].data + row * OW * C;                                                  \
    const int64_t h0 = oh * j->s[0] - j->pb[0];                                                    \
    for (int64_t ow = 0; ow < OW; ow++, y += C) {                                                  \
      const int64_t w0 = ow * j->s[1] - j->pb[1];                                                  \
      for (int64_t c = 0; c < C; c++) y[c] = LOWEST;                                               \
      for (int64_t kh = 0; kh < j->k[0]; kh++) {                                                   \
        const int64_t ih = h0 + kh * j->d[0];                                                      \
        if (ih < 0 || ih >= H) continue;                                                           \
        for (int64_t kw = 0; kw < j->k[1]; kw++) {                                                 \
          const int64_t iw = w0 + kw * j->d[1];                                                    \
          if (iw < 0 || iw >= W) continue;                                                         \
          const T *restrict xp = x + (ih * W + iw) * C;                                            \
          T *restrict yp = y;                                                                      \
          for (int64_t c = 0; c < C; c++) yp[c] = xp[c] > yp[c] ? xp[c] : yp[c];                   \
        }                                                                                          \
      }                                                                                            \
    }                                                                                              \
  }
POOL_NHWC_MAX_BYTES(uint8_t, 0)
POOL_NHWC_MAX_BYTES(int8_t, -128)

int32_t kiln_uk_pool_nhwc(const kiln_uk_args *a) {
  pool_nhwc_job j;
  j.a = a;
  j.kind = a->iattr[0];
  j.cip = a->iattr[1];
  j.c = a->in[0].dims[3];
  for (int i = 0; i < 2; i++) {
    const int64_t *p = a->iattr + 2 + 5 * i;
    j.k[i] = p[0];
    j.s[i] = p[1];
    j.d[i] = p[2];
    j.pb[i] = p[3];
    j.pe[i] = p[4];
    j.in[i] = a->in[0].dims[1 + i];
    j.out[i] = a->out[0].dims[1 + i];
  }
  void (*task)(void *, int64_t, int64_t) = pool_nhwc_task;
  if (a->in[0].dtype == KILN_U8 && j.kind == 0)
    task = pool_nhwc_max_uint8_t;
  else if (a->in[0].dtype == KILN_I8 && j.kind == 0)
    task = pool_nhwc_max_int8_t;
  kiln_rt_parallel_for(a->ctx, task, &j, a->out[0].dims[0] * j.out[0]);
  return KILN_UK_OK;
}

/* ---------------------------------------------------------------------------------------------
 * GlobalMaxPool / GlobalAveragePool / GlobalLpPool
 *
 * iattr: kind (0 max, 1 average, 2 lp). fattr: p (lp).
 * in: X [N, C, spatial...]; out: Y [N, C, 1...].
 * ------------------------------------------------------------------------------------------- */

typedef struct {
  const kiln_uk_args *a;
  int64_t kind, plane, planes;
  double p;
} gpool_job;

#define GPOOL_CHUNK 32

/* Sum of an f32 plane in f64 with 8 independent lanes, so the loop vectorizes. */
static double sum_f32(const float *x, int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; l++) acc[l] += (double)x[i + l];
  double s = 0;
  for (; i < n; i++) s += (double)x[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + s;
}

static void gpool_task(void *data, int64_t chunk, int64_t tid) {
  (void)tid;
  const gpool_job *j = data;
  const kiln_uk_args *a = j->a;
  int64_t dt = a->in[0].dtype, n = j->plane;
  int64_t end = imin(j->planes, (chunk + 1) * GPOOL_CHUNK);
  for (int64_t p = chunk * GPOOL_CHUNK; p < end; p++) {
    double y;
    if (dt == KILN_F32 && j->kind == 1) {
      y = sum_f32((const float *)a->in[0].data + p * n, n) / (double)n;
      ((float *)a->out[0].data)[p] = (float)y;
      continue;
    }
    const void *x = a->in[0].data;
    if (j->kind == 0) {
      y = kiln_load_f64(x, dt, p * n);
      for (int64_t i = 1; i < n; i++) {
        double v = kiln_load_f64(x, dt, p * n + i);
        if (v > y) y = v;
      }
    } else if (j->kind == 1) {
      double s = 0;
      for (int64_t i = 0; i < n; i++) s += kiln_load_f64(x, dt, p * n + i);
      y = s / (double)n;
    } else {
      double s = 0;
      for (int64_t i = 0; i < n; i++) s += __builtin_pow(__builtin_fabs(kiln_load_f64(x, dt, p * n + i)), j->p);
      y = __builtin_pow(s, 1.0 / j->p);
    }
    kiln_store_f64(a->out[0].data, dt, p, y);
  }
}

int32_t kiln_uk_global_pool(const kiln_uk_args *a) {
  gpool_job j;
  j.a = a;
  j.kind = a->iattr[0];
  j.p = a->n_fattr > 0 ? a->fattr[0] : 2.0;
  j.planes = a->in[0].dims[0] * a->in[0].dims[1];
  j.plane = j.planes > 0 ? a->in[0].numel / j.planes : 0;
  if (j.plane == 0 && j.planes > 0 && j.kind == 0)
    return kiln_uk_fail(a, KILN_UK_EVALUE, "GlobalMaxPool of an empty spatial extent has no value");
  kiln_rt_parallel_for(a->ctx, gpool_task, &j, (j.planes + GPOOL_CHUNK - 1) / GPOOL_CHUNK);
  return KILN_UK_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Conv and ConvTranspose
 *
 * iattr: group, nsp, then per spatial axis: kernel, stride, dilation, pad_begin, pad_end
 *        (ConvTranspose: the window of the equivalent convolution over Y; pad_begin may be
 *        negative).
 * in: X [N, C, spatial...], W (Conv [M, C/group, k...]; ConvTranspose [C, M/group, k...]), B? [M].
 * out: Y [N, M, spatial...].
 * scratch (f16/bf16 only): X, W, B and Y as f32.
 *
 * Both run one task per output plane (n, m): Conv gathers every input channel of the group
 * through each kernel tap, one contiguous output row at a time; ConvTranspose scatters each
 * input row into the output rows it reaches.
 * ------------------------------------------------------------------------------------------- */

typedef struct {
  const void *x, *w, *b;
  void *y;
  win_axis ax[SP];
  int64_t c, m, group, transposed;
} conv_job;

#define CONV_TASK(T)                                                                              \
  static void conv_task_##T(void *data, int64_t plane, int64_t tid) {                             \
    (void)tid;                                                                                    \
    const conv_job *j = data;                                                                     \
    const win_axis *ax = j->ax;                                                                   \
    int64_t n = plane / j->m, m = plane % j->m;                                                   \
    int64_t cg = j->c / j->group, mg = j->m / j->group, g = m / mg;                               \
    int64_t taps = ax[0].k * ax[1].k * ax[2].k;                                                   \
    int64_t in_plane = ax[0].in * ax[1].in * ax[2].in;                                            \
    int64_t out_plane = ax[0].out * ax[1].out * ax[2].out;                                        \
    /* Conv: y is the window's output; ConvTranspose: y is the window's input. */                 \
    int64_t y_plane = j->transposed ? in_plane : out_plane;                                       \
    int64_t x_plane = j->transposed ? out_plane : in_plane;                                       \
    T *y = (T *)j->y + plane * y_plane;                                                           \
    for (int64_t i = 0; i < y_plane; i++) y[i] = 0;                                               \
    for (int64_t ci = 0; ci < cg; ci++) {                                                         \
      int64_t c = g * cg + ci;                                                                    \
      const T *xp = (const T *)j->x + (n * j->c + c) * x_plane;                                   \
      const T *wp = j->transposed ? (const T *)j->w + (c * mg + m % mg) * taps                    \
                                  : (const T *)j->w + (m * cg + ci) * taps;                       \
      int64_t t = 0;                                                                              \
      for (int64_t k0 = 0; k0 < ax[0].k; k0++)                                                    \
        for (int64_t k1 = 0; k1 < ax[1].k; k1++)                                                  \
          for (int64_t k2 = 0; k2 < ax[2].k; k2++, t++) {                                         \
            T wv = wp[t];                                                                         \
            int64_t lo0, hi0, lo1, hi1, lo2, hi2;                                                 \
            valid_outputs(&ax[0], k0, &lo0, &hi0);                                                \
            valid_outputs(&ax[1], k1, &lo1, &hi1);                                                \
            valid_outputs(&ax[2], k2, &lo2, &hi2);                                                \
            if (lo2 >= hi2) continue;                                                             \
            int64_t s2 = ax[2].stride;                                                            \
            for (int64_t o0 = lo0; o0 < hi0; o0++) {                                              \
              int64_t i0 = o0 * ax[0].stride + k0 * ax[0].dil - ax[0].pad;                        \
              for (int64_t o1 = lo1; o1 < hi1; o1++) {                                            \
                int64_t i1 = o1 * ax[1].stride + k1 * ax[1].dil - ax[1].pad;                      \
                int64_t orow = (o0 * ax[1].out + o1) * ax[2].out;                                 \
                int64_t irow = (i0 * ax[1].in + i1) * ax[2].in + k2 * ax[2].dil - ax[2].pad;      \
                if (!j->transposed) {                                                             \
                  T *dst = y + orow;                                                              \
                  const T *src = xp + irow;                                                       \
                  if (s2 == 1)                                                                    \
                    for (int64_t o2 = lo2; o2 < hi2; o2++) dst[o2] += wv * src[o2];               \
                  else                                                                            \
                    for (int64_t o2 = lo2; o2 < hi2; o2++) dst[o2] += wv * src[o2 * s2];          \
                } else {                                                                          \
                  T *dst = y + irow;                                                              \
                  const T *src = xp + orow;                                                       \
                  if (s2 == 1)                                                                    \
                    for (int64_t o2 = lo2; o2 < hi2; o2++) dst[o2] += wv * src[o2];               \
                  else                                                                            \
                    for (int64_t o2 = lo2; o2 < hi2; o2++) dst[o2 * s2] += wv * src[o2];          \
                }                                                                                 \
              }                                                                                   \
            }                                                                                     \
          }                                                                                       \
    }                                                                                             \
    if (j->b) {                                                                                   \
      T bv = ((const T *)j->b)[m];                                                                \
      for (int64_t i = 0; i < y_plane; i++) y[i] += bv;                                           \
    }                                                                                             \
  }

CONV_TASK(float)
CONV_TASK(double)

static int32_t conv_common(const kiln_uk_args *a, int64_t transposed) {
  conv_job j;
  j.group = a->iattr[0];
  int64_t nsp = a->iattr[1];
  j.transposed = transposed;
  const kiln_tensor *x = &a->in[0], *w = &a->in[1], *y = &a->out[0];
  /* The window runs over X for Conv and over Y for ConvTranspose. */
  if (transposed)
    read_axes(j.ax, a->iattr + 2, nsp, y, x);
  else
    read_axes(j.ax, a->iattr + 2, nsp, x, y);
  j.c = x->dims[1];
  j.m = y->dims[1];
  int64_t planes = y->dims[0] * j.m;
  int has_b = has_in(a, 2);
  int64_t dt = x->dtype;
  if (dt == KILN_F32 || dt == KILN_F64) {
    j.x = x->data;
    j.w = w->data;
    j.b = has_b ? a->in[2].data : NULL;
    j.y = y->data;
    kiln_rt_parallel_for(a->ctx, dt == KILN_F32 ? conv_task_float : conv_task_double, &j, planes);
    return KILN_UK_OK;
  }
  char *cur = a->scratch;
  float *xs = carve(&cur, x->numel * 4), *ws = carve(&cur, w->numel * 4);
  float *bs = has_b ? carve(&cur, a->in[2].numel * 4) : NULL;
  float *ys = carve(&cur, y->numel * 4);
  load_f32(xs, x);
  load_f32(ws, w);
  if (has_b) load_f32(bs, &a->in[2]);
  j.x = xs;
  j.w = ws;
  j.b = bs;
  j.y = ys;
  kiln_rt_parallel_for(a->ctx, conv_task_float, &j, planes);
  store_f32(y, ys);
  return KILN_UK_OK;
}

int32_t kiln_uk_conv(const kiln_uk_args *a) { return conv_common(a, 0); }
int32_t kiln_uk_conv_transpose(const kiln_uk_args *a) { return conv_common(a, 1); }

/* ---------------------------------------------------------------------------------------------
 * MatMul and Gemm
 *
 * MatMul iattr: M, K, N, R (batch rank), out batch dims[R], A batch strides[R], B batch
 *               strides[R] (in matrices; 0 where broadcast).
 * Gemm iattr:   M, K, N, trans_a, trans_b, C rows, C cols (C's shape padded to 2-D; 0 0
 *               without C). fattr: alpha, beta.
 * scratch: operands converted to the accumulation type (f16/bf16 to f32, small integers to
 *          i64), transposed Gemm operands, and the accumulated output when it is not the output
 *          tensor itself; the Rust side sizes it with the same rules.
 *
 * The product runs in i-k-j order (out row += a[i,p] * b row p, p ascending), the summation
 * order of ir's kernel, over tasks of (matrix, block of rows).
 * ------------------------------------------------------------------------------------------- */

static int acc_kind(int64_t dt) {
  if (dt == KILN_F64) return ACC_F64;
  if (kiln_dtype_is_float(dt)) return ACC_F32;
  return ACC_I64;
}

static int acc_size(int kind) { return kind == ACC_F32 ? 4 : 8; }

typedef struct {
  const void *a, *b;
  void *y;
  int64_t m, k, n, rows_per_task, tasks_per_mat, kind;
  int64_t r;
  const int64_t *bdims, *astr, *bstr;
} mm_job;

/* The A and B matrix of output matrix `mat` (batch broadcasting). */
static void mm_offsets(const mm_job *j, int64_t mat, int64_t *ai, int64_t *bi) {
  int64_t ao = 0, bo = 0, rem = mat;
  for (int64_t d = j->r - 1; d >= 0; d--) {
    int64_t idx = rem % j->bdims[d];
    rem /= j->bdims[d];
    ao += idx * j->astr[d];
    bo += idx * j->bstr[d];
  }
  *ai = ao;
  *bi = bo;
}

#define MM_ROWS(T, ADD, MUL)                                                                     \
  static void mm_rows_##T(const T *a, const T *b, T *out, int64_t rows, int64_t k, int64_t n) {  \
    for (int64_t i = 0; i < rows; i++) {                                                         \
      T *o = out + i * n;                                                                        \
      for (int64_t jj = 0; jj < n; jj++) o[jj] = 0;                                              \
      for (int64_t p = 0; p < k; p++) {                                                          \
        T av = a[i * k + p];                                                                     \
        const T *brow = b + p * n;                                                               \
        for (int64_t jj = 0; jj < n; jj++) o[jj] = ADD(o[jj], MUL(av, brow[jj]));                \
      }                                                                                          \
    }                                                                                            \
  }

#define F_ADD(x, y) ((x) + (y))
#define F_MUL(x, y) ((x) * (y))
/* Integer products wrap modulo 2^64 (unsigned arithmetic: no undefined overflow). */
#define I_ADD(x, y) ((int64_t)((uint64_t)(x) + (uint64_t)(y)))
#define I_MUL(x, y) ((int64_t)((uint64_t)(x) * (uint64_t)(y)))

MM_ROWS(float, F_ADD, F_MUL)
MM_ROWS(double, F_ADD, F_MUL)
MM_ROWS(int64_t, I_ADD, I_MUL)

static void mm_task(void *data, int64_t t, int64_t tid) {
  (void)tid;
  const mm_job *j = data;
  int64_t mat = t / j->tasks_per_mat, r0 = (t % j->tasks_per_mat) * j->rows_per_task;
  int64_t rows = imin(j->rows_per_task, j->m - r0);
  if (rows <= 0) return;
  int64_t ai, bi;
  mm_offsets(j, mat, &ai, &bi);
  int64_t mk = j->m * j->k, kn = j->k * j->n, mn = j->m * j->n;
  int64_t aoff = ai * mk + r0 * j->k, boff = bi * kn, yoff = mat * mn + r0 * j->n;
  switch (j->kind) {
  case ACC_F32:
    mm_rows_float((const float *)j->a + aoff, (const float *)j->b + boff, (float *)j->y + yoff, rows, j->k, j->n);
    break;
  case ACC_F64:
    mm_rows_double((const double *)j->a + aoff, (const double *)j->b + boff, (double *)j->y + yoff, rows, j->k,
                   j->n);
    break;
  default:
    mm_rows_int64_t((const int64_t *)j->a + aoff, (const int64_t *)j->b + boff, (int64_t *)j->y + yoff, rows,
                    j->k, j->n);
  }
}

/* Splits `mats` products of m rows into tasks of about 64 rows, fewer when matrices are many. */
static void mm_run(kiln_ctx *ctx, mm_job *j, int64_t mats) {
  int64_t rpt = j->m < 1 ? 1 : j->m;
  if (mats < 16 && j->m > 64) rpt = 64;
  j->rows_per_task = rpt;
  j->tasks_per_mat = (j->m + rpt - 1) / rpt;
  if (j->m == 0 || mats == 0) return;
  kiln_rt_parallel_for(ctx, mm_task, j, mats * j->tasks_per_mat);
}

/* The operand in accumulation type: the tensor itself, or a converted copy carved from scratch. */
static const void *acc_operand(char **cur, const kiln_tensor *t, int kind) {
  if ((kind == ACC_F32 && t->dtype == KILN_F32) || (kind == ACC_F64 && t->dtype == KILN_F64) ||
      (kind == ACC_I64 && (t->dtype == KILN_I64 || t->dtype == KILN_U64)))
    return t->data;
  void *p = carve(cur, t->numel * acc_size(kind));
  if (kind == ACC_F32)
    load_f32(p, t);
  else if (kind == ACC_I64)
    load_i64(p, t);
  else
    for (int64_t i = 0; i < t->numel; i++) ((double *)p)[i] = kiln_load_f64(t->data, t->dtype, i);
  return p;
}

/* Whether the output tensor can hold the accumulated values directly. */
static int acc_is_output(const kiln_tensor *t, int kind) {
  return (kind == ACC_F32 && t->dtype == KILN_F32) || (kind == ACC_F64 && t->dtype == KILN_F64) ||
         (kind == ACC_I64 && (t->dtype == KILN_I64 || t->dtype == KILN_U64));
}

static void store_acc(const kiln_tensor *t, const void *src, int kind) {
  if (src == t->data) return;
  if (kind == ACC_F32)
    store_f32(t, src);
  else if (kind == ACC_I64)
    store_i64(t, src);
  else
    for (int64_t i = 0; i < t->numel; i++) kiln_store_f64(t->data, t->dtype, i, ((const double *)src)[i]);
}

int32_t kiln_uk_matmul(const kiln_uk_args *a) {
  mm_job j;
  j.m = a->iattr[0];
  j.k = a->iattr[1];
  j.n = a->iattr[2];
  j.r = a->iattr[3];
  j.bdims = a->iattr + 4;
  j.astr = a->iattr + 4 + j.r;
  j.bstr = a->iattr + 4 + 2 * j.r;
  int64_t mats = 1;
  for (int64_t d = 0; d < j.r; d++) mats *= j.bdims[d];
  int kind = acc_kind(a->in[0].dtype);
  j.kind = kind;
  char *cur = a->scratch;
  j.a = acc_operand(&cur, &a->in[0], kind);
  j.b = acc_operand(&cur, &a->in[1], kind);
  const kiln_tensor *y = &a->out[0];
  j.y = acc_is_output(y, kind) ? y->data : carve(&cur, y->numel * acc_size(kind));
  mm_run(a->ctx, &j, mats);
  store_acc(y, j.y, kind);
  return KILN_UK_OK;
}

/* Row-major transpose of an r x c matrix of `size`-byte elements. */
static void transpose_bytes(void *dst, const void *src, int64_t r, int64_t c, int size) {
  for (int64_t i = 0; i < r; i++)
    for (int64_t jj = 0; jj < c; jj++) {
      if (size == 4)
        ((uint32_t *)dst)[jj * r + i] = ((const uint32_t *)src)[i * c + jj];
      else
        ((uint64_t *)dst)[jj * r + i] = ((const uint64_t *)src)[i * c + jj];
    }
}

int32_t kiln_uk_gemm(const kiln_uk_args *a) {
  mm_job j;
  j.m = a->iattr[0];
  j.k = a->iattr[1];
  j.n = a->iattr[2];
  int64_t trans_a = a->iattr[3], trans_b = a->iattr[4];
  int64_t c0 = a->iattr[5], c1 = a->iattr[6];
  double alpha = a->fattr[0], beta = a->fattr[1];
  j.r = 0;
  j.bdims = j.astr = j.bstr = NULL;
  int64_t dt = a->in[0].dtype;
  int kind = acc_kind(dt);
  j.kind = kind;
  int sz = acc_size(kind);
  char *cur = a->scratch;
  const void *av = acc_operand(&cur, &a->in[0], kind);
  const void *bv = acc_operand(&cur, &a->in[1], kind);
  if (trans_a) {
    void *t = carve(&cur, j.m * j.k * sz);
    transpose_bytes(t, av, j.k, j.m, sz);
    av = t;
  }
  if (trans_b) {
    void *t = carve(&cur, j.k * j.n * sz);
    transpose_bytes(t, bv, j.n, j.k, sz);
    bv = t;
  }
  j.a = av;
  j.b = bv;
  const kiln_tensor *y = &a->out[0];
  j.y = acc_is_output(y, kind) ? y->data : carve(&cur, y->numel * sz);
  mm_run(a->ctx, &j, 1);
  int has_c = has_in(a, 2) && beta != 0.0;
  const kiln_tensor *c = has_c ? &a->in[2] : NULL;
  int64_t mn = j.m * j.n;
  if (kind == ACC_I64) {
    /* The product wraps in the element type; alpha and beta then apply in f64 and the result
       is truncated toward zero (numpy's astype of the float result). */
    store_i64(y, j.y);
    if (alpha == 1.0 && !has_c) return KILN_UK_OK;
    for (int64_t i = 0; i < j.m; i++)
      for (int64_t jj = 0; jj < j.n; jj++) {
        int64_t o = i * j.n + jj;
        double v = kiln_load_f64(y->data, dt, o) * alpha;
        if (c) v += kiln_load_f64(c->data, c->dtype, (c0 > 1 ? i : 0) * c1 + (c1 > 1 ? jj : 0)) * beta;
        int64_t iv;
        if (v != v)
          iv = 0;
        else if (v >= 9223372036854775807.0)
          iv = INT64_MAX;
        else if (v <= -9223372036854775808.0)
          iv = INT64_MIN;
        else
          iv = (int64_t)v;
        kiln_store_i64(y->data, dt, o, iv);
      }
    return KILN_UK_OK;
  }
  if (kind == ACC_F32) {
    float *yv = j.y;
    float fa = (float)alpha, fb = (float)beta;
    if (alpha != 1.0)
      for (int64_t i = 0; i < mn; i++) yv[i] *= fa;
    if (c) {
      const float *cv = acc_operand(&cur, c, kind);
      for (int64_t i = 0; i < j.m; i++)
        for (int64_t jj = 0; jj < j.n; jj++)
          yv[i * j.n + jj] += cv[(c0 > 1 ? i : 0) * c1 + (c1 > 1 ? jj : 0)] * fb;
    }
  } else {
    double *yv = j.y;
    if (alpha != 1.0)
      for (int64_t i = 0; i < mn; i++) yv[i] *= alpha;
    if (c) {
      const double *cv = acc_operand(&cur, c, kind);
      for (int64_t i = 0; i < j.m; i++)
        for (int64_t jj = 0; jj < j.n; jj++)
          yv[i * j.n + jj] += cv[(c0 > 1 ? i : 0) * c1 + (c1 > 1 ? jj : 0)] * beta;
    }
  }
  store_acc(y, j.y, kind);
  return KILN_UK_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Einsum
 *
 * iattr: n_ops, L (labels), n_out (output labels: the first n_out labels, in output order),
 *        extents[L], then per operand its element stride for each label[L] (0 where the operand
 *        lacks the label or broadcasts it; a label repeated in one operand adds its strides,
 *        which reads the diagonal).
 * in: the operands; out: Y (row-major over the output labels).
 * Every output element sums, over the contracted labels, the product of the operands: in f64
 * for floats, wrapping 64-bit for integers.
 * ------------------------------------------------------------------------------------------- */

#define EINSUM_MAX_OPS 16
#define EINSUM_MAX_LABELS 64
#define EINSUM_CHUNK 256

typedef struct {
  const kiln_uk_args *a;
  int64_t n_ops, L, n_out, total_out, total_red;
  const int64_t *ext, *str;
} einsum_job;

static void einsum_task(void *data, int64_t chunk, int64_t tid) {
  (void)tid;
  const einsum_job *j = data;
  const kiln_uk_args *a = j->a;
  int64_t L = j->L, n_out = j->n_out, n_ops = j->n_ops;
  int is_int = !kiln_dtype_is_float(a->out[0].dtype);
  int64_t end = imin(j->total_out, (chunk + 1) * EINSUM_CHUNK);
  for (int64_t o = chunk * EINSUM_CHUNK; o < end; o++) {
    int64_t base[EINSUM_MAX_OPS], off[EINSUM_MAX_OPS], idx[EINSUM_MAX_LABELS];
    for (int64_t q = 0; q < n_ops; q++) base[q] = 0;
    int64_t rem = o;
    for (int64_t l = n_out - 1; l >= 0; l--) {
      int64_t i = rem % j->ext[l];
      rem /= j->ext[l];
      for (int64_t q = 0; q < n_ops; q++) base[q] += i * j->str[q * L + l];
    }
    for (int64_t l = n_out; l < L; l++) idx[l] = 0;
    for (int64_t q = 0; q < n_ops; q++) off[q] = base[q];
    double fs = 0;
    uint64_t is = 0;
    for (int64_t r = 0; r < j->total_red; r++) {
      if (is_int) {
        uint64_t p = 1;
        for (int64_t q = 0; q < n_ops; q++) p *= (uint64_t)kiln_load_i64(a->in[q].data, a->in[q].dtype, off[q]);
        is += p;
      } else {
        double p = 1;
        for (int64_t q = 0; q < n_ops; q++) p *= kiln_load_f64(a->in[q].data, a->in[q].dtype, off[q]);
        fs += p;
      }
      /* Odometer over the contracted labels, moving the operand offsets along. */
      for (int64_t l = L - 1; l >= n_out; l--) {
        idx[l]++;
        for (int64_t q = 0; q < n_ops; q++) off[q] += j->str[q * L + l];
        if (idx[l] < j->ext[l]) break;
        for (int64_t q = 0; q < n_ops; q++) off[q] -= idx[l] * j->str[q * L + l];
        idx[l] = 0;
      }
    }
    if (is_int)
      kiln_store_i64(a->out[0].data, a->out[0].dtype, o, (int64_t)is);
    else
      kiln_store_f64(a->out[0].data, a->out[0].dtype, o, fs);
  }
}

int32_t kiln_uk_einsum(const kiln_uk_args *a) {
  einsum_job j;
  j.a = a;
  j.n_ops = a->iattr[0];
  j.L = a->iattr[1];
  j.n_out = a->iattr[2];
  j.ext = a->iattr + 3;
  j.str = a->iattr + 3 + j.L;
  j.total_out = 1;
  for (int64_t l = 0; l < j.n_out; l++) j.total_out *= j.ext[l];
  j.total_red = 1;
  for (int64_t l = j.n_out; l < j.L; l++) j.total_red *= j.ext[l];
  kiln_rt_parallel_for(a->ctx, einsum_task, &j, (j.total_out + EINSUM_CHUNK - 1) / EINSUM_CHUNK);
  return KILN_UK_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Det
 *
 * iattr: M. in: X [*, M, M]; out: Y [*]. scratch: one M x M f64 matrix per batch entry.
 * LU decomposition with partial pivoting (the last of equal pivots wins, as in ir).
 * ------------------------------------------------------------------------------------------- */

typedef struct {
  const kiln_uk_args *a;
  int64_t m;
  double *work;
} det_job;

static void det_task(void *data, int64_t bi, int64_t tid) {
  (void)tid;
  const det_job *j = data;
  const kiln_tensor *x = &j->a->in[0];
  int64_t m = j->m;
  double *w = j->work + bi * m * m;
  for (int64_t i = 0; i < m * m; i++) w[i] = kiln_load_f64(x->data, x->dtype, bi * m * m + i);
  double det = 1.0;
  for (int64_t c = 0; c < m; c++) {
    int64_t p = c;
    for (int64_t i = c + 1; i < m; i++)
      if (__builtin_fabs(w[i * m + c]) >= __builtin_fabs(w[p * m + c])) p = i;
    if (w[p * m + c] == 0.0) {
      det = 0.0;
      break;
    }
    if (p != c) {
      for (int64_t k = 0; k < m; k++) {
        double t = w[p * m + k];
        w[p * m + k] = w[c * m + k];
        w[c * m + k] = t;
      }
      det = -det;
    }
    double piv = w[c * m + c];
    det *= piv;
    for (int64_t i = c + 1; i < m; i++) {
      double f = w[i * m + c] / piv;
      for (int64_t k = c; k < m; k++) w[i * m + k] -= f * w[c * m + k];
    }
  }
  kiln_store_f64(j->a->out[0].data, j->a->out[0].dtype, bi, det);
}

int32_t kiln_uk_det(const kiln_uk_args *a) {
  det_job j;
  j.a = a;
  j.m = a->iattr[0];
  j.work = a->scratch;
  kiln_rt_parallel_for(a->ctx, det_task, &j, a->out[0].numel);
  return KILN_UK_OK;
}

/* ---------------------------------------------------------------------------------------------
 * RotaryEmbedding
 *
 * iattr: interleaved, rotary_dim (resolved), three_d, batch, seq, heads, head_size.
 * in: X ([B, H, S, D] or [B, S, H*D]), cos_cache, sin_cache, position_ids? (i64 [B, S]).
 * out: Y like X. Computed in f64 and rounded once.
 * ------------------------------------------------------------------------------------------- */

int32_t kiln_uk_rotary_embedding(const kiln_uk_args *a) {
  int64_t inter = a->iattr[0], rd = a->iattr[1], three_d = a->iattr[2];
  int64_t b = a->iattr[3], q = a->iattr[4], h = a->iattr[5], d = a->iattr[6];
  int64_t half = rd / 2;
  const kiln_tensor *x = &a->in[0], *cs = &a->in[1], *sn = &a->in[2], *y = &a->out[0];
  const int64_t *pos = has_in(a, 3) ? a->in[3].data : NULL;
  if (pos) {
    int64_t rows = cs->dims[0];
    for (int64_t i = 0; i < b * q; i++)
      if (pos[i] < 0 || pos[i] >= rows)
        return kiln_uk_fail(a, KILN_UK_EINDEX, "RotaryEmbedding: position id %lld is outside the %lld cache rows",
                            (long long)pos[i], (long long)rows);
  }
  int64_t dt = x->dtype;
  for (int64_t bi = 0; bi < b; bi++)
    for (int64_t qi = 0; qi < q; qi++) {
      int64_t row = (pos ? pos[bi * q + qi] : bi * q + qi) * half;
      for (int64_t hi = 0; hi < h; hi++) {
        int64_t base = three_d ? (bi * q + qi) * h * d + hi * d : ((bi * h + hi) * q + qi) * d;
        for (int64_t i = rd; i < d; i++) kiln_store_f64(y->data, dt, base + i, kiln_load_f64(x->data, dt, base + i));
        for (int64_t jj = 0; jj < half; jj++) {
          int64_t i1 = inter ? 2 * jj : jj, i2 = inter ? 2 * jj + 1 : jj + half;
          double x1 = kiln_load_f64(x->data, dt, base + i1), x2 = kiln_load_f64(x->data, dt, base + i2);
          double c = kiln_load_f64(cs->data, cs->dtype, row + jj), s = kiln_load_f64(sn->data, sn->dtype, row + jj);
          kiln_store_f64(y->data, dt, base + i1, c * x1 - s * x2);
          kiln_store_f64(y->data, dt, base + i2, s * x1 + c * x2);
        }
      }
    }
  return KILN_UK_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Attention (ONNX opsets 23-25; a port of ir/src/ops/attention.rs)
 *
 * iattr: 0 three_d, 1 B, 2 Hq, 3 Hkv, 4 Sq, 5 Skv, 6 past, 7 Dk, 8 Dv, 9 is_causal,
 *        10 qk_matmul_output_mode, 11 left_window, 12 right_window, 13-16 rounding dtype codes
 *        of the operator, the softcapped scores, the biased scores and the softmax,
 *        17 mask kind (MASK_NONE, MASK_BOOL, MASK_FLOAT), 18-21 mask shape padded to 4-D with leading 1s.
 * fattr: 0 sqrt(scale) before rounding, 1 softcap (<= 0: none).
 * in: Q, K, V, attn_mask?, past_key?, past_value?, nonpad_kv_seqlen? (i64 [B]).
 * out: Y, present_key?, present_value?, qk_matmul_output?.
 * scratch (f64): K scaled [B, Hkv, T, Dk], V [B, Hkv, T, Dv], and per (batch, head) task a
 *                score row [T], a query row [Dk] and an output row [Dv].
 *
 * Values are f64 rounded to the stage's dtype wherever the reference rounds, so f16/bf16
 * results match it; one task per (batch, query head).
 * ------------------------------------------------------------------------------------------- */

typedef struct {
  const kiln_uk_args *a;
  int64_t three_d, B, Hq, Hkv, Sq, Skv, past, T, Dk, Dv, causal, mode, left, right;
  int64_t r, rc, rb, rs, mask_kind, mstr[4], mlen;
  const int64_t *nonpad;
  double s, softcap;
  double *ks, *vs, *work;
} attn_job;

/* Element d of row s of head h of batch b in a Q/K/V input ([B, H, S, D] or [B, S, H*D]). */
static double attn_in(const attn_job *j, const kiln_tensor *t, int64_t heads, int64_t seq, int64_t dim,
                      int64_t b, int64_t h, int64_t s, int64_t d) {
  int64_t off = j->three_d ? (b * seq + s) * heads * dim + h * dim + d : ((b * heads + h) * seq + s) * dim + d;
  return kiln_load_f64(t->data, t->dtype, off);
}

static double attn_bias(const attn_job *j, int64_t b, int64_t h, int64_t i, int64_t jj) {
  const kiln_uk_args *a = j->a;
  double v = 0;
  if (j->mask_kind != MASK_NONE) {
    if (jj >= j->mlen) {
      v = -__builtin_inf();
    } else {
      const kiln_tensor *m = &a->in[3];
      double mv = kiln_load_f64(m->data, m->dtype, b * j->mstr[0] + h * j->mstr[1] + i * j->mstr[2] + jj * j->mstr[3]);
      v = j->mask_kind == MASK_BOOL ? (mv != 0 ? 0.0 : -__builtin_inf()) : mv;
    }
  }
  /* nonpad_kv_seqlen never comes with a past (the type check rejects it). */
  int64_t offset = j->nonpad ? j->nonpad[b] - j->Sq : j->past;
  int64_t pos = i + offset;
  if (j->causal && jj > pos) v += -__builtin_inf();
  if ((j->left >= 0 && pos - jj > j->left) || (j->right >= 0 && jj - pos > j->right)) v += -__builtin_inf();
  if (j->nonpad && jj >= j->nonpad[b]) v += -__builtin_inf();
  return v;
}

/* Fills the scaled K and the V buffers (past ++ new) and the present_key/present_value outputs. */
static void attn_kv_task(void *data, int64_t bh, int64_t tid) {
  (void)tid;
  const attn_job *j = data;
  const kiln_uk_args *a = j->a;
  int64_t b = bh / j->Hkv, h = bh % j->Hkv;
  const kiln_tensor *pk = has_in(a, 4) ? &a->in[4] : NULL, *pv = has_in(a, 5) ? &a->in[5] : NULL;
  const kiln_tensor *ok = a->n_out > 1 && a->out[1].data ? &a->out[1] : NULL;
  const kiln_tensor *ov = a->n_out > 2 && a->out[2].data ? &a->out[2] : NULL;
  for (int64_t s = 0; s < j->T; s++) {
    int64_t row = bh * j->T + s;
    for (int64_t d = 0; d < j->Dk; d++) {
      double v = s < j->past ? kiln_load_f64(pk->data, pk->dtype, (bh * j->past + s) * j->Dk + d)
                             : attn_in(j, &a->in[1], j->Hkv, j->Skv, j->Dk, b, h, s - j->past, d);
      if (ok) kiln_store_f64(ok->data, ok->dtype, row * j->Dk + d, v);
      j->ks[row * j->Dk + d] = round_to(j->r, v * j->s);
    }
    for (int64_t d = 0; d < j->Dv; d++) {
      double v = s < j->past ? kiln_load_f64(pv->data, pv->dtype, (bh * j->past + s) * j->Dv + d)
                             : attn_in(j, &a->in[2], j->Hkv, j->Skv, j->Dv, b, h, s - j->past, d);
      if (ov) kiln_store_f64(ov->data, ov->dtype, row * j->Dv + d, v);
      j->vs[row * j->Dv + d] = v;
    }
  }
}

static void attn_task(void *data, int64_t bh, int64_t tid) {
  (void)tid;
  const attn_job *j = data;
  const kiln_uk_args *a = j->a;
  int64_t b = bh / j->Hq, h = bh % j->Hq, T = j->T;
  int64_t kbase = (b * j->Hkv + h / (j->Hq / j->Hkv)) * T;
  double *row = j->work + bh * (T + j->Dk + j->Dv), *qrow = row + T, *yrow = qrow + j->Dk;
  const kiln_tensor *qk = a->n_out > 3 && a->out[3].data ? &a->out[3] : NULL;
  const kiln_tensor *y = &a->out[0];
  double ninf = -__builtin_inf();
  for (int64_t i = 0; i < j->Sq; i++) {
    for (int64_t d = 0; d < j->Dk; d++)
      qrow[d] = round_to(j->r, attn_in(j, &a->in[0], j->Hq, j->Sq, j->Dk, b, h, i, d) * j->s);
    int64_t qk_row = (bh * j->Sq + i) * T;
    int all_masked = 1;
    for (int64_t jj = 0; jj < T; jj++) {
      const double *krow = j->ks + (kbase + jj) * j->Dk;
      double dot = 0;
      for (int64_t d = 0; d < j->Dk; d++) dot += qrow[d] * krow[d];
      double raw = round_to(j->r, dot), capped = raw;
      if (j->softcap > 0) {
        double c = j->softcap;
        capped = round_to(j->rc, round_to(j->rc, __builtin_tanh(round_to(j->rc, raw / c))) * c);
      }
      double bv = attn_bias(j, b, h, i, jj);
      all_masked &= bv == ninf;
      double wb = round_to(j->rb, capped + bv);
      if (qk) {
        double out = j->mode == 0 ? raw : j->mode == 1 ? round_to(j->r, capped) : round_to(j->r, wb);
        kiln_store_f64(qk->data, qk->dtype, qk_row + jj, out);
      }
      row[jj] = round_to(j->rs, wb);
    }
    /* Softmax as the reference computes it: a fully masked row gives zeros, not NaN. */
    double mx = ninf;
    for (int64_t jj = 0; jj < T; jj++) {
      double x = row[jj];
      mx = (x != x || mx != mx) ? __builtin_nan("") : (x > mx ? x : mx);
    }
    double safe = mx == ninf ? 0.0 : mx, sum = 0;
    for (int64_t jj = 0; jj < T; jj++) {
      row[jj] = round_to(j->rs, round_to(j->rs, __builtin_exp(round_to(j->rs, row[jj] - safe))));
      sum += row[jj];
    }
    sum = round_to(j->rs, sum);
    if (sum == 0.0) sum = 1.0;
    for (int64_t jj = 0; jj < T; jj++) {
      double p = all_masked ? 0.0 : round_to(j->r, round_to(j->rs, row[jj] / sum));
      row[jj] = p;
      if (qk && j->mode == 3) kiln_store_f64(qk->data, qk->dtype, qk_row + jj, p);
    }
    for (int64_t d = 0; d < j->Dv; d++) yrow[d] = 0;
    for (int64_t jj = 0; jj < T; jj++) {
      double p = row[jj];
      const double *vrow = j->vs + (kbase + jj) * j->Dv;
      for (int64_t d = 0; d < j->Dv; d++) yrow[d] += p * vrow[d];
    }
    for (int64_t d = 0; d < j->Dv; d++) {
      int64_t off = j->three_d ? (b * j->Sq + i) * j->Hq * j->Dv + h * j->Dv + d : ((bh * j->Sq) + i) * j->Dv + d;
      kiln_store_f64(y->data, y->dtype, off, round_to(j->r, yrow[d]));
    }
  }
}

int32_t kiln_uk_attention(const kiln_uk_args *a) {
  const int64_t *ia = a->iattr;
  attn_job j;
  j.a = a;
  j.three_d = ia[0];
  j.B = ia[1];
  j.Hq = ia[2];
  j.Hkv = ia[3];
  j.Sq = ia[4];
  j.Skv = ia[5];
  j.past = ia[6];
  j.T = j.past + j.Skv;
  j.Dk = ia[7];
  j.Dv = ia[8];
  j.causal = ia[9];
  j.mode = ia[10];
  j.left = ia[11];
  j.right = ia[12];
  j.r = ia[13];
  j.rc = ia[14];
  j.rb = ia[15];
  j.rs = ia[16];
  j.mask_kind = ia[17];
  /* Mask strides for [B, Hq, Sq, len] (0 where broadcast); the last axis may be shorter than T. */
  int64_t acc = 1;
  for (int ax = 3; ax >= 0; ax--) {
    int64_t n = ia[18 + ax];
    j.mstr[ax] = (n == 1 && ax < 3) ? 0 : acc;
    acc *= n;
  }
  j.mlen = ia[21];
  j.nonpad = has_in(a, 6) ? a->in[6].data : NULL;
  j.s = round_to(j.r, a->fattr[0]);
  j.softcap = a->fattr[1];
  char *cur = a->scratch;
  j.ks = carve(&cur, j.B * j.Hkv * j.T * j.Dk * 8);
  j.vs = carve(&cur, j.B * j.Hkv * j.T * j.Dv * 8);
  j.work = carve(&cur, j.B * j.Hq * (j.T + j.Dk + j.Dv) * 8);
  kiln_rt_parallel_for(a->ctx, attn_kv_task, &j, j.B * j.Hkv);
  kiln_rt_parallel_for(a->ctx, attn_task, &j, j.B * j.Hq);
  return KILN_UK_OK;
}
