/* Micro-kernels for the misc family: recurrent cells, quantization, signal processing and
   RoiAlign. See kiln_uk.h for the contract; codegen/src/uk/misc.rs packs the attributes in the
   order each kernel documents. */
#include "kiln_uk.h"
#include "kiln_uk_ops.h" /* RNN_*, RA_*, WIN_*, QP_* codes, generated from codegen/src/uk/codes.rs */
#include <float.h>

/* Every kernel here computes in double, like kiln_ir's reference interpreter, and rounds once
   when it stores: the results then agree with ir::eval bit for bit in most cases. */
KILN_UK_INLINE double ldf(const void *p, int64_t dt, int64_t i) { return kiln_load_f64(p, dt, i); }


KILN_UK_INLINE double clampd(double v, double lo, double hi) { return v < lo ? lo : (v > hi ? hi : v); }

/* A float with the value of v truncated toward zero and its last bit set when inexact
   ("round to odd"): rounding that float to a narrower type then rounds v exactly once. */
KILN_UK_INLINE float f32_round_odd(double v) {
  float f = (float)v;
  if ((double)f == v || f != f) return f;
  uint32_t bits;
  __builtin_memcpy(&bits, &f, 4);
  if (__builtin_fabs((double)f) > __builtin_fabs(v)) bits--; /* rounded away: step back */
  bits |= 1;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

/* f32 -> f16 bits, round to nearest even. kiln_f32_to_f16 in kiln_uk.h (as of this writing)
   shifts subnormal results one place too far, halving them; the QLinear scale products are
   often f16 subnormals, so this family keeps a correct copy. */
KILN_UK_INLINE uint16_t f32_to_f16_rne(float f) {
  uint32_t x;
  __builtin_memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);
  if (ax < 0x38800000u) { /* f16 subnormal or zero: units of 2^-24 */
    if (ax < 0x33000000u) return (uint16_t)sign;
    uint32_t man = (ax & 0x7fffff) | 0x800000;
    int shift = 126 - (int)(ax >> 23);
    uint32_t r = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) r++;
    return (uint16_t)(sign | r);
  }
  uint32_t r = (ax >> 13) - (112u << 10), rem = ax & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
  return (uint16_t)(sign | r);
}

/* v rounded to the precision of float dtype dt (the result of one numpy operation in dt). */
KILN_UK_INLINE double round_to(int64_t dt, double v) {
  switch (dt) {
  case KILN_F32: return (double)(float)v;
  case KILN_F16: return kiln_f16_to_f32(f32_to_f16_rne(f32_round_odd(v)));
  case KILN_BF16: return kiln_bf16_to_f32(kiln_f32_to_bf16(f32_round_odd(v)));
  default: return v;
  }
}

/* Stores v to element i of a dtype-dt tensor, rounding once (kiln_store_f64 goes through f32
   and its f16 subnormals are off, see above). */
KILN_UK_INLINE void stf(void *p, int64_t dt, int64_t i, double v) {
  switch (dt) {
  case KILN_F16: ((uint16_t *)p)[i] = f32_to_f16_rne(f32_round_odd(v)); break;
  case KILN_BF16: ((uint16_t *)p)[i] = kiln_f32_to_bf16(f32_round_odd(v)); break;
  default: kiln_store_f64(p, dt, i, v); break;
  }
}

/* =========================================================================================
   RNN / GRU / LSTM
   =========================================================================================

   Inputs (ONNX order): X, W, R, B?, sequence_lens?, initial_h?, initial_c? (LSTM), P? (LSTM).
   Outputs: Y?, Y_h?, Y_c? (LSTM); an output with data == NULL is not written.
   iattr: [kind (RNN_RNN, RNN_GRU, RNN_LSTM), dirs, reverse (direction == reverse), hidden, layout,
           input_forget, linear_before_reset, has_clip, seq, batch, input,
           n_act, act_code[n_act]]
   fattr: [clip, (alpha, beta)[n_act]]
   Activation codes: RA_* (RnnActCode in codegen/src/uk/codes.rs).
   scratch: dirs * batch * rnn_task_doubles(...) doubles. */

KILN_UK_INLINE double sigmoid_d(double x) {
  /* Two forms so that exp never overflows into inf/inf. */
  if (x >= 0) return 1.0 / (1.0 + __builtin_exp(-x));
  double e = __builtin_exp(x);
  return e / (1.0 + e);
}

KILN_UK_INLINE double rnn_activate(int64_t code, double alpha, double beta, double x) {
  switch (code) {
  case RA_RELU: return (x > 0 || x != x) ? x : 0.0;
  case RA_TANH: return __builtin_tanh(x);
  case RA_SIGMOID: return sigmoid_d(x);
  case RA_AFFINE: return alpha * x + beta;
  case RA_LEAKY_RELU: return x >= 0 ? x : alpha * x;
  case RA_THRESHOLDED_RELU: return x > alpha ? x : 0.0;
  case RA_SCALED_TANH: return alpha * __builtin_tanh(beta * x);
  case RA_HARD_SIGMOID: return clampd(alpha * x + beta, 0.0, 1.0);
  case RA_ELU: return x >= 0 ? x : alpha * __builtin_expm1(x);
  case RA_SOFTSIGN: return x / (1.0 + __builtin_fabs(x));
  default: /* RA_SOFTPLUS */ return x > 0 ? x + __builtin_log1p(__builtin_exp(-x)) : __builtin_log1p(__builtin_exp(x));
  }
}

/* Row `row` of a [rows, n] matrix of dtype dt (at element offset off) dotted with v. Eight
   partial sums give the vectorizer independent chains without fast-math. */
KILN_UK_INLINE double rnn_dot(const void *m, int64_t dt, int64_t off, const double *v, int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int u = 0; u < 8; u++) acc[u] += ldf(m, dt, off + k + u) * v[k + u];
  double s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; k < n; k++) s += ldf(m, dt, off + k) * v[k];
  return s;
}

typedef struct rnn_job {
  const kiln_uk_args *a;
  int64_t kind, dirs, reverse_only, H, layout, input_forget, lbr, has_clip, seq, batch, input;
  int64_t G;
  double clip;
  const int32_t *lens; /* NULL: all rows run seq steps */
} rnn_job;

KILN_UK_INLINE int64_t rnn_task_doubles(int64_t G, int64_t H, int64_t input) {
  /* x_t, h, c, gate pre-activations, r*h and the candidate (GRU) */
  return input + 4 * H + G * H;
}

static double rnn_act(const rnn_job *j, int64_t dir, int64_t k, double x) {
  const kiln_uk_args *a = j->a;
  int64_t per = j->kind == RNN_RNN ? 1 : (j->kind == RNN_GRU ? 2 : 3);
  int64_t idx = dir * per + k;
  if (j->has_clip && k < 2) x = clampd(x, -j->clip, j->clip);
  return rnn_activate(a->iattr[12 + idx], a->fattr[1 + 2 * idx], a->fattr[2 + 2 * idx], x);
}

/* The state input (initial_h / initial_c) element for (dir, b, h). */
KILN_UK_INLINE int64_t rnn_state_index(const rnn_job *j, int64_t dir, int64_t b, int64_t h) {
  return j->layout ? (b * j->dirs + dir) * j->H + h : (dir * j->batch + b) * j->H + h;
}

static void rnn_task(void *data, int64_t task, int64_t tid) {
  (void)tid;
  const rnn_job *j = (const rnn_job *)data;
  const kiln_uk_args *a = j->a;
  const int64_t H = j->H, G = j->G, I = j->input, dir = task / j->batch, b = task % j->batch;
  double *buf = (double *)a->scratch + task * rnn_task_doubles(G, H, I);
  double *x = buf, *h = x + I, *c = h + H, *g = c + H, *rh = g + G * H, *hn = rh + H;
  const kiln_tensor *X = &a->in[0], *W = &a->in[1], *R = &a->in[2];
  const kiln_tensor *B = a->n_in > 3 && a->in[3].data ? &a->in[3] : 0;
  const kiln_tensor *H0 = a->n_in > 5 && a->in[5].data ? &a->in[5] : 0;
  const kiln_tensor *C0 = j->kind == RNN_LSTM && a->n_in > 6 && a->in[6].data ? &a->in[6] : 0;
  const kiln_tensor *P = j->kind == RNN_LSTM && a->n_in > 7 && a->in[7].data ? &a->in[7] : 0;
  const int64_t wdt = W->dtype, woff = dir * G * H * I, roff = dir * G * H * H;
  const int64_t boff = dir * 2 * G * H;
  const int reverse = j->reverse_only || dir == 1;
  const int64_t len = j->lens ? j->lens[b] : j->seq;
  for (int64_t k = 0; k < H; k++) {
    h[k] = H0 ? ldf(H0->data, H0->dtype, rnn_state_index(j, dir, b, k)) : 0.0;
    c[k] = C0 ? ldf(C0->data, C0->dtype, rnn_state_index(j, dir, b, k)) : 0.0;
  }
  const kiln_tensor *Y = a->n_out > 0 && a->out[0].data ? &a->out[0] : 0;
  for (int64_t step = 0; step < len; step++) {
    const int64_t t = reverse ? len - 1 - step : step;
    const int64_t xoff = j->layout ? (b * j->seq + t) * I : (t * j->batch + b) * I;
    for (int64_t k = 0; k < I; k++) x[k] = ldf(X->data, X->dtype, xoff + k);
    /* Input part and both biases for every gate row; the recurrent part follows per kind
       because GRU's candidate gate needs r before it. */
    for (int64_t row = 0; row < G * H; row++) {
      double s = rnn_dot(W->data, wdt, woff + row * I, x, I);
      if (B) s += ldf(B->data, B->dtype, boff + row);
      g[row] = s;
    }
    if (j->kind == RNN_RNN) {
      for (int64_t k = 0; k < H; k++) {
        double s = g[k] + rnn_dot(R->data, R->dtype, roff + k * H, h, H);
        if (B) s += ldf(B->data, B->dtype, boff + G * H + k);
        g[k] = s;
      }
      for (int64_t k = 0; k < H; k++) h[k] = rnn_act(j, dir, 0, g[k]);
    } else if (j->kind == RNN_GRU) {
      /* z and r rows. */
      for (int64_t row = 0; row < 2 * H; row++) {
        double s = g[row] + rnn_dot(R->data, R->dtype, roff + row * H, h, H);
        if (B) s += ldf(B->data, B->dtype, boff + G * H + row);
        g[row] = rnn_act(j, dir, 0, s);
      }
      for (int64_t k = 0; k < H; k++) rh[k] = g[H + k] * h[k];
      for (int64_t k = 0; k < H; k++) {
        const int64_t row = 2 * H + k;
        double rb = B ? ldf(B->data, B->dtype, boff + G * H + row) : 0.0;
        double pre = j->lbr ? g[row] + g[H + k] * (rnn_dot(R->data, R->dtype, roff + row * H, h, H) + rb)
                            : g[row] + rnn_dot(R->data, R->dtype, roff + row * H, rh, H) + rb;
        hn[k] = rnn_act(j, dir, 1, pre);
      }
      for (int64_t k = 0; k < H; k++) h[k] = (1.0 - g[k]) * hn[k] + g[k] * h[k];
    } else {
      for (int64_t row = 0; row < G * H; row++) {
        double s = g[row] + rnn_dot(R->data, R->dtype, roff + row * H, h, H);
        if (B) s += ldf(B->data, B->dtype, boff + G * H + row);
        g[row] = s;
      }
      const int64_t poff = dir * 3 * H;
      for (int64_t k = 0; k < H; k++) {
        double pi = P ? ldf(P->data, P->dtype, poff + k) : 0.0;
        double po = P ? ldf(P->data, P->dtype, poff + H + k) : 0.0;
        double pf = P ? ldf(P->data, P->dtype, poff + 2 * H + k) : 0.0;
        double ig = rnn_act(j, dir, 0, g[k] + pi * c[k]);
        double fg = j->input_forget ? 1.0 - ig : rnn_act(j, dir, 0, g[2 * H + k] + pf * c[k]);
        double gg = rnn_act(j, dir, 1, g[3 * H + k]);
        double ct = fg * c[k] + ig * gg;
        double og = rnn_act(j, dir, 0, g[H + k] + po * ct);
        c[k] = ct;
        /* h sees the unclipped cell state: clip bounds gate pre-activations only. */
        h[k] = og * rnn_act(j, dir, 2, ct);
      }
    }
    if (Y) {
      const int64_t yoff = j->layout ? ((b * j->seq + t) * j->dirs + dir) * H
                                     : ((t * j->dirs + dir) * j->batch + b) * H;
      for (int64_t k = 0; k < H; k++) stf(Y->data, Y->dtype, yoff + k, h[k]);
    }
  }
  if (Y) {
    for (int64_t t = len; t < j->seq; t++) {
      const int64_t yoff = j->layout ? ((b * j->seq + t) * j->dirs + dir) * H
                                     : ((t * j->dirs + dir) * j->batch + b) * H;
      for (int64_t k = 0; k < H; k++) stf(Y->data, Y->dtype, yoff + k, 0.0);
    }
  }
  /* A row without steps keeps zero final states (as onnxruntime does). */
  for (int64_t o = 1; o < 3 && o < a->n_out; o++) {
    const kiln_tensor *S = &a->out[o];
    if (!S->data) continue;
    const double *src = o == 1 ? h : c;
    for (int64_t k = 0; k < H; k++)
      stf(S->data, S->dtype, rnn_state_index(j, dir, b, k), len > 0 ? src[k] : 0.0);
  }
}

int32_t kiln_uk_rnn(const kiln_uk_args *a) {
  rnn_job j;
  j.a = a;
  j.kind = a->iattr[0];
  j.dirs = a->iattr[1];
  j.reverse_only = a->iattr[2];
  j.H = a->iattr[3];
  j.layout = a->iattr[4];
  j.input_forget = a->iattr[5];
  j.lbr = a->iattr[6];
  j.has_clip = a->iattr[7];
  j.seq = a->iattr[8];
  j.batch = a->iattr[9];
  j.input = a->iattr[10];
  j.G = j.kind == RNN_RNN ? 1 : (j.kind == RNN_GRU ? 3 : 4);
  j.clip = a->fattr[0];
  j.lens = a->n_in > 4 && a->in[4].data ? (const int32_t *)a->in[4].data : 0;
  if (j.lens) {
    for (int64_t b = 0; b < j.batch; b++)
      if (j.lens[b] < 0 || j.lens[b] > j.seq)
        return kiln_uk_fail(a, KILN_UK_EVALUE, "sequence_lens value %d is outside [0, %lld]",
                            (int)j.lens[b], (long long)j.seq);
  }
  kiln_rt_parallel_for(a->ctx, rnn_task, &j, j.dirs * j.batch);
  return KILN_UK_OK;
}

/* =========================================================================================
   Quantization
   ========================================================================================= */

/* Rounds half to even and saturates to [lo, hi]; NaN becomes lo (numpy's NaN-to-int32 gives
   INT_MIN before the clip). */
KILN_UK_INLINE double saturate(double v, double lo, double hi) {
  if (v != v) return lo;
  return clampd(__builtin_roundeven(v), lo, hi);
}

/* Scale / zero-point layout: pl = [kind (QP_TENSOR, QP_AXIS, QP_BLOCKED), inner, dim,
   block, blocks]; the parameter's flat index for the quantized tensor's flat index i. */
KILN_UK_INLINE int64_t param_index(const int64_t *pl, int64_t i) {
  switch (pl[0]) {
  case QP_TENSOR: return 0;
  case QP_AXIS: return (i / pl[1]) % pl[2];
  default: { /* QP_BLOCKED */
    int64_t inner = pl[1], dim = pl[2];
    int64_t ax = (i / inner) % dim, outer = i / (inner * dim);
    return (outer * pl[4] + ax / pl[3]) * inner + i % inner;
  }
  }
}

/* QuantizeLinear. Inputs: x, y_scale, y_zero_point?. Output: y.
   iattr: [precision dtype, lo, hi, scale layout[5], zero-point layout[5]] */
int32_t kiln_uk_quantize_linear(const kiln_uk_args *a) {
  const kiln_tensor *x = &a->in[0], *s = &a->in[1];
  const kiln_tensor *z = a->n_in > 2 && a->in[2].data ? &a->in[2] : 0;
  const kiln_tensor *y = &a->out[0];
  const int64_t prec = a->iattr[0];
  const double lo = (double)a->iattr[1], hi = (double)a->iattr[2];
  const int64_t *sl = a->iattr + 3, *zl = a->iattr + 8;
  for (int64_t i = 0; i < x->numel; i++) {
    double sv = round_to(prec, ldf(s->data, s->dtype, param_index(sl, i)));
    double q = __builtin_roundeven(round_to(prec, round_to(prec, ldf(x->data, x->dtype, i)) / sv));
    double zp = z ? ldf(z->data, z->dtype, param_index(zl, i)) : 0.0;
    stf(y->data, y->dtype, i, q != q ? lo : clampd(q + zp, lo, hi));
  }
  return KILN_UK_OK;
}

/* DequantizeLinear. Inputs: x, x_scale, x_zero_point?. Output: y.
   iattr: [work dtype (f32 or f64), scale layout[5], zero-point layout[5]] */
int32_t kiln_uk_dequantize_linear(const kiln_uk_args *a) {
  const kiln_tensor *x = &a->in[0], *s = &a->in[1];
  const kiln_tensor *z = a->n_in > 2 && a->in[2].data ? &a->in[2] : 0;
  const kiln_tensor *y = &a->out[0];
  const int64_t work = a->iattr[0];
  const int64_t *sl = a->iattr + 1, *zl = a->iattr + 6;
  for (int64_t i = 0; i < x->numel; i++) {
    double zp = z ? ldf(z->data, z->dtype, param_index(zl, i)) : 0.0;
    double d = round_to(work, round_to(work, ldf(x->data, x->dtype, i)) - zp);
    double sv = round_to(work, ldf(s->data, s->dtype, param_index(sl, i)));
    stf(y->data, y->dtype, i, round_to(work, d * sv));
  }
  return KILN_UK_OK;
}

/* DynamicQuantizeLinear. Inputs: x (float). Outputs: y (u8), y_scale (x's dtype), y_zero_point
   (u8). Computed in float32, as the ONNX reference does. No attributes. */
/* The float32 range of DynamicQuantizeLinear's input, min(0, x) and max(0, x), in 16
   independent lanes so that the compiler keeps them in vector registers (vminps/vmaxps) instead
   of one serial chain. Returns 0 when x holds a NaN or an infinity: the caller then takes the
   element-by-element path, whose NaN handling numpy's defines. */
KILN_UK_INLINE int dql_f32_range(const float *x, int64_t n, float *lo_out, float *hi_out) {
  float lo[16] = {0}, hi[16] = {0};
  int bad = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; j++) {
      float v = x[i + j];
      bad |= !(v - v == 0.0f); /* NaN or infinity */
      lo[j] = v < lo[j] ? v : lo[j];
      hi[j] = v > hi[j] ? v : hi[j];
    }
  }
  for (; i < n; i++) {
    float v = x[i];
    bad |= !(v - v == 0.0f);
    lo[0] = v < lo[0] ? v : lo[0];
    hi[0] = v > hi[0] ? v : hi[0];
  }
  for (int j = 1; j < 16; j++) {
    lo[0] = lo[j] < lo[0] ? lo[j] : lo[0];
    hi[0] = hi[j] > hi[0] ? hi[j] : hi[0];
  }
  *lo_out = lo[0];
  *hi_out = hi[0];
  return !bad;
}

/* The fast path's parallel form: finite float32 input split into chunks of DQL_CHUNK (at most
   DQL_MAX_TASKS of them, so larger inputs take larger chunks), each task taking the range of
   its chunk, then each quantizing it. min and max are exact and the quantization is per
   element, so the result does not depend on the split. A transformer's activations ([128, 768]
   per product) made it one thread's serial work between parallel products. Its tasks write
   the job (the chunk ranges) that the serial code then reads, so on the GPU it must stay off
   the block-parallel list (nvptx/device.rs) and run on one thread. */
#define DQL_CHUNK 16384
#define DQL_MAX_TASKS 64

typedef struct dql_job {
  const float *x;
  uint8_t *y;
  int64_t n, chunk;
  float scale, zp;
  float lo[DQL_MAX_TASKS], hi[DQL_MAX_TASKS];
  int finite[DQL_MAX_TASKS];
} dql_job;

static void dql_range_task(void *data, int64_t t, int64_t tid) {
  (void)tid;
  dql_job *j = (dql_job *)data;
  const int64_t start = t * j->chunk;
  const int64_t len = j->n - start < j->chunk ? j->n - start : j->chunk;
  j->finite[t] = dql_f32_range(j->x + start, len, &j->lo[t], &j->hi[t]);
}

/* Quantizes x[start, end) to y: division by the scale, rounding half to even, the zero point
   added and clamped (a uint8_t store may alias anything, hence the locals). */
KILN_UK_INLINE void dql_f32_quantize(const float *xs, uint8_t *ys, int64_t start, int64_t end, float scale,
                                     float zp) {
  for (int64_t i = start; i < end; i++) {
    float q = __builtin_roundevenf(xs[i] / scale) + zp;
    ys[i] = (uint8_t)(q < 0.0f ? 0.0f : (q > 255.0f ? 255.0f : q));
  }
}

static void dql_quantize_task(void *data, int64_t t, int64_t tid) {
  (void)tid;
  const dql_job *j = (const dql_job *)data;
  const int64_t start = t * j->chunk;
  const int64_t end = j->n - start < j->chunk ? j->n : start + j->chunk;
  dql_f32_quantize(j->x, j->y, start, end, j->scale, j->zp);
}

int32_t kiln_uk_dynamic_quantize_linear(const kiln_uk_args *a) {
  const kiln_tensor *x = &a->in[0];
  const kiln_tensor *y = &a->out[0];
  float lo, hi;
  dql_job j;
  j.x = (const float *)x->data;
  j.y = (uint8_t *)y->data;
  j.n = x->numel;
  j.chunk = (j.n + DQL_MAX_TASKS - 1) / DQL_MAX_TASKS;
  j.chunk = j.chunk < DQL_CHUNK ? DQL_CHUNK : (j.chunk + 15) / 16 * 16;
  const int64_t tasks = j.n > 0 ? (j.n + j.chunk - 1) / j.chunk : 0;
  int fast = x->dtype == KILN_F32;
  if (fast && tasks > 1) {
    kiln_rt_parallel_for(a->ctx, dql_range_task, &j, tasks);
    lo = hi = 0.0f;
    for (int64_t t = 0; t < tasks; t++) {
      fast &= j.finite[t];
      lo = j.lo[t] < lo ? j.lo[t] : lo;
      hi = j.hi[t] > hi ? j.hi[t] : hi;
    }
  } else if (fast) {
    fast = dql_f32_range(j.x, j.n, &lo, &hi);
  }
  if (!fast) {
    lo = hi = 0.0f;
    for (int64_t i = 0; i < x->numel; i++) {
      float v = (float)ldf(x->data, x->dtype, i);
      /* NaN propagates like numpy's max/min. */
      if (v != v || lo != lo) {
        lo = hi = __builtin_nanf("");
        continue;
      }
      lo = v < lo ? v : lo;
      hi = v > hi ? v : hi;
    }
  }
  float range = hi == lo ? 1.0f : hi - lo;
  float scale = range / 255.0f;
  float initial = 0.0f - lo / scale;
  /* Python's max(0, min(255, v)): a NaN compares false and yields the constant bound. */
  float zpf = initial != initial ? 255.0f : (initial < 0.0f ? 0.0f : (initial > 255.0f ? 255.0f : initial));
  float zp = __builtin_roundevenf(zpf);
  if (fast) {
    /* Finite float32 input: the same arithmetic as the loop below as a vector loop, in
       parallel chunks when there are several. */
    j.scale = scale;
    j.zp = zp;
    if (tasks > 1) {
      kiln_rt_parallel_for(a->ctx, dql_quantize_task, &j, tasks);
    } else {
      dql_f32_quantize(j.x, j.y, 0, j.n, scale, zp);
    }
  } else {
    for (int64_t i = 0; i < x->numel; i++) {
      float q = __builtin_roundevenf((float)ldf(x->data, x->dtype, i) / scale);
      ((uint8_t *)y->data)[i] = (uint8_t)saturate((double)q + (double)zp, 0.0, 255.0);
    }
  }
  if (a->n_out > 1 && a->out[1].data) stf(a->out[1].data, a->out[1].dtype, 0, (double)scale);
  if (a->n_out > 2 && a->out[2].data) ((uint8_t *)a->out[2].data)[0] = (uint8_t)zp;
  return KILN_UK_OK;
}

/* Broadcast of a parameter onto a target shape: blk = [r, dims[r], strides[r]] (a stride is 0
   where the parameter is broadcast; r == 0 for a single value). Returns the parameter's flat
   index for the target's flat index i. */
KILN_UK_INLINE int64_t bcast_index(const int64_t *blk, int64_t i) {
  const int64_t r = blk[0];
  int64_t idx = 0;
  for (int64_t d = r - 1; d >= 0; d--) {
    const int64_t n = blk[1 + d];
    idx += (i % n) * blk[1 + r + d];
    i /= n;
  }
  return idx;
}

KILN_UK_INLINE int64_t bcast_len(const int64_t *blk) { return 1 + 2 * blk[0]; }

/* Copies integer tensor t minus its zero point (broadcast by blk) to dst as int32. */
static void minus_zero_point(int32_t *dst, const kiln_tensor *t, const kiln_tensor *zp, const int64_t *blk) {
  for (int64_t i = 0; i < t->numel; i++) {
    int64_t v = kiln_load_i64(t->data, t->dtype, i);
    if (zp) v -= kiln_load_i64(zp->data, zp->dtype, bcast_index(blk, i));
    dst[i] = (int32_t)v;
  }
}

/* The requantization multiplier of the QLinear operators, in the scales' dtype sdt. */
KILN_UK_INLINE double requant_mult(int64_t sdt, double sa, double sb, double sy) {
  return round_to(sdt, round_to(sdt, sa * sb) / sy);
}

KILN_UK_INLINE void int_range(int64_t dt, double *lo, double *hi) {
  switch (dt) {
  case KILN_U8: *lo = 0; *hi = 255; break;
  case KILN_I8: *lo = -128; *hi = 127; break;
  case KILN_U16: *lo = 0; *hi = 65535; break;
  default: *lo = -32768; *hi = 32767; break;
  }
}

/* MatMulInteger (qlinear = 0; inputs A, B, a_zero_point?, b_zero_point?; output i32) and
   QLinearMatMul (qlinear = 1; inputs a, a_scale, a_zero_point, b, b_scale, b_zero_point,
   y_scale, y_zero_point).
   iattr: [qlinear, M, K, N, nbatch, a_zp bcast onto A, b_zp bcast onto B,
           (qlinear: a_scale, b_scale, y_scale, y_zero_point bcasts onto the output),
           (A offset, B offset)[nbatch] in elements]
   scratch: int32 A - a_zp, B - b_zp, and the M x N x nbatch accumulators. */
int32_t kiln_uk_matmul_integer(const kiln_uk_args *a) {
  const int64_t q = a->iattr[0], M = a->iattr[1], K = a->iattr[2], N = a->iattr[3];
  const int64_t nb = a->iattr[4];
  const int64_t *p = a->iattr + 5;
  const int ib = q ? 3 : 1, iza = 2, izb = q ? 5 : 3;
  const kiln_tensor *A = &a->in[0], *B = &a->in[ib];
  const kiln_tensor *za = a->n_in > iza && a->in[iza].data ? &a->in[iza] : 0;
  const kiln_tensor *zb = a->n_in > izb && a->in[izb].data ? &a->in[izb] : 0;
  const int64_t *blk_za = p;
  p += bcast_len(p);
  const int64_t *blk_zb = p;
  p += bcast_len(p);
  const int64_t *blk_sa = 0, *blk_sb = 0, *blk_sy = 0, *blk_zy = 0;
  if (q) {
    blk_sa = p;
    p += bcast_len(p);
    blk_sb = p;
    p += bcast_len(p);
    blk_sy = p;
    p += bcast_len(p);
    blk_zy = p;
    p += bcast_len(p);
  }
  const int64_t *offs = p;
  int32_t *av = (int32_t *)a->scratch;
  int32_t *bv = av + A->numel;
  uint32_t *acc = (uint32_t *)(bv + B->numel);
  minus_zero_point(av, A, za, blk_za);
  minus_zero_point(bv, B, zb, blk_zb);
  /* int32 wraparound, as numpy's int32 matmul: unsigned arithmetic has the same bits. */
  for (int64_t bi = 0; bi < nb; bi++) {
    const int32_t *ap = av + offs[2 * bi], *bp = bv + offs[2 * bi + 1];
    uint32_t *cp = acc + bi * M * N;
    for (int64_t i = 0; i < M; i++) {
      uint32_t *row = cp + i * N;
      for (int64_t j = 0; j < N; j++) row[j] = 0;
      for (int64_t t = 0; t < K; t++) {
        const uint32_t x = (uint32_t)ap[i * K + t];
        const int32_t *brow = bp + t * N;
        for (int64_t j = 0; j < N; j++) row[j] += x * (uint32_t)brow[j];
      }
    }
  }
  const kiln_tensor *Y = &a->out[0];
  const int64_t total = nb * M * N;
  if (!q) {
    for (int64_t i = 0; i < total; i++) ((int32_t *)Y->data)[i] = (int32_t)acc[i];
    return KILN_UK_OK;
  }
  const kiln_tensor *sa = &a->in[1], *sb = &a->in[4], *sy = &a->in[6];
  const kiln_tensor *zy = a->n_in > 7 && a->in[7].data ? &a->in[7] : 0;
  double lo, hi;
  int_range(Y->dtype, &lo, &hi);
  for (int64_t i = 0; i < total; i++) {
    double m = requant_mult(sa->dtype, ldf(sa->data, sa->dtype, bcast_index(blk_sa, i)),
                            ldf(sb->data, sb->dtype, bcast_index(blk_sb, i)),
                            ldf(sy->data, sy->dtype, bcast_index(blk_sy, i)));
    double zp = zy ? ldf(zy->data, zy->dtype, bcast_index(blk_zy, i)) : 0.0;
    stf(Y->data, Y->dtype, i, saturate((double)(int32_t)acc[i] * m + zp, lo, hi));
  }
  return KILN_UK_OK;
}

/* ConvInteger (qlinear = 0; inputs x, w, x_zero_point?, w_zero_point?; output i32) and
   QLinearConv (qlinear = 1; inputs x, x_scale, x_zero_point, w, w_scale, w_zero_point,
   y_scale, y_zero_point, B?). x_zero_point, x_scale, y_scale and y_zero_point are single
   values; w_zero_point and w_scale one value or one per output channel.
   iattr: [qlinear, nsp, N, C, M, group, in[nsp], out[nsp], kernel[nsp], stride[nsp],
           dilation[nsp], pad_begin[nsp]]
   scratch: int32 x - x_zero_point, then w - w_zero_point. */
#define QCONV_MAX_SP 8

typedef struct qconv_job {
  const kiln_uk_args *a;
  int64_t q, nsp, N, C, M, group;
  const int64_t *in, *out, *k, *st, *dil, *pad;
  int64_t in_plane, out_plane, k_plane;
  const int32_t *xv, *wv;
} qconv_job;

static void qconv_task(void *data, int64_t task, int64_t tid) {
  (void)tid;
  const qconv_job *j = (const qconv_job *)data;
  const kiln_uk_args *a = j->a;
  const int64_t n = task / j->M, m = task % j->M;
  const int64_t cg = j->C / j->group, mg = j->M / j->group, g = m / mg;
  const kiln_tensor *Y = &a->out[0];
  const kiln_tensor *bias = j->q && a->n_in > 8 && a->in[8].data ? &a->in[8] : 0;
  double mult = 0, zy = 0, lo = 0, hi = 0;
  if (j->q) {
    const kiln_tensor *sx = &a->in[1], *sw = &a->in[4], *sy = &a->in[6];
    const kiln_tensor *z = a->n_in > 7 && a->in[7].data ? &a->in[7] : 0;
    mult = requant_mult(sx->dtype, ldf(sx->data, sx->dtype, 0),
                        ldf(sw->data, sw->dtype, sw->numel == 1 ? 0 : m), ldf(sy->data, sy->dtype, 0));
    zy = z ? ldf(z->data, z->dtype, 0) : 0.0;
    int_range(Y->dtype, &lo, &hi);
  }
  int64_t o[QCONV_MAX_SP], kk[QCONV_MAX_SP];
  for (int64_t op = 0; op < j->out_plane; op++) {
    int64_t r = op;
    for (int64_t d = j->nsp - 1; d >= 0; d--) {
      o[d] = r % j->out[d];
      r /= j->out[d];
    }
    int64_t acc = bias ? kiln_load_i64(bias->data, bias->dtype, m) : 0;
    for (int64_t kp = 0; kp < j->k_plane; kp++) {
      int64_t rk = kp, src = 0, inside = 1;
      for (int64_t d = j->nsp - 1; d >= 0; d--) {
        kk[d] = rk % j->k[d];
        rk /= j->k[d];
      }
      for (int64_t d = 0; d < j->nsp; d++) {
        const int64_t pos = o[d] * j->st[d] + kk[d] * j->dil[d] - j->pad[d];
        if (pos < 0 || pos >= j->in[d]) {
          inside = 0;
          break;
        }
        src = src * j->in[d] + pos;
      }
      if (!inside) continue; /* padding reads zero after the zero point is removed */
      for (int64_t c = 0; c < cg; c++) {
        const int64_t xi = (n * j->C + g * cg + c) * j->in_plane + src;
        const int64_t wi = (m * cg + c) * j->k_plane + kp;
        acc += (int64_t)j->xv[xi] * (int64_t)j->wv[wi];
      }
    }
    const int64_t yi = (n * j->M + m) * j->out_plane + op;
    if (!j->q)
      ((int32_t *)Y->data)[yi] = (int32_t)acc;
    else
      stf(Y->data, Y->dtype, yi, saturate((double)(int32_t)acc * mult + zy, lo, hi));
  }
}

int32_t kiln_uk_conv_integer(const kiln_uk_args *a) {
  qconv_job j;
  const int64_t *p = a->iattr;
  j.a = a;
  j.q = p[0];
  j.nsp = p[1];
  j.N = p[2];
  j.C = p[3];
  j.M = p[4];
  j.group = p[5];
  j.in = p + 6;
  j.out = j.in + j.nsp;
  j.k = j.out + j.nsp;
  j.st = j.k + j.nsp;
  j.dil = j.st + j.nsp;
  j.pad = j.dil + j.nsp;
  j.in_plane = j.out_plane = j.k_plane = 1;
  for (int64_t d = 0; d < j.nsp; d++) {
    j.in_plane *= j.in[d];
    j.out_plane *= j.out[d];
    j.k_plane *= j.k[d];
  }
  const int ix = 0, iw = j.q ? 3 : 1, izx = 2, izw = j.q ? 5 : 3;
  const kiln_tensor *X = &a->in[ix], *W = &a->in[iw];
  const kiln_tensor *zx = a->n_in > izx && a->in[izx].data ? &a->in[izx] : 0;
  const kiln_tensor *zw = a->n_in > izw && a->in[izw].data ? &a->in[izw] : 0;
  int32_t *xv = (int32_t *)a->scratch, *wv = xv + X->numel;
  const int64_t zero[1] = {0};
  minus_zero_point(xv, X, zx, zero);
  const int64_t per_m = W->numel / (j.M ? j.M : 1);
  for (int64_t i = 0; i < W->numel; i++) {
    int64_t v = kiln_load_i64(W->data, W->dtype, i);
    if (zw) v -= kiln_load_i64(zw->data, zw->dtype, zw->numel == 1 ? 0 : i / per_m);
    wv[i] = (int32_t)v;
  }
  j.xv = xv;
  j.wv = wv;
  kiln_rt_parallel_for(a->ctx, qconv_task, &j, j.N * j.M);
  return KILN_UK_OK;
}

/* =========================================================================================
   Signal processing
   =========================================================================================

   The transforms sum directly over the twiddle table that codegen computes with kiln_ir's
   exact unit roots (fattr: re, im per power, the sign of the direction baked in). */

/* res[k] = sum_j buf[j] * w^(k j) for k < out_len; buf, res: n complex values (re, im). */
static void dft_direct(const double *tw, int64_t n, const double *buf, double *res, int64_t out_len) {
  for (int64_t k = 0; k < out_len; k++) {
    double re = 0.0, im = 0.0;
    int64_t e = 0;
    for (int64_t j = 0; j < n; j++) {
      const double br = buf[2 * j], bi = buf[2 * j + 1], wr = tw[2 * e], wi = tw[2 * e + 1];
      re += br * wr - bi * wi;
      im += br * wi + bi * wr;
      /* e = k*j mod n, kept reduced so that it never overflows. */
      e += k;
      while (e >= n) e -= n;
    }
    res[2 * k] = re;
    res[2 * k + 1] = im;
  }
}

/* DFT. Inputs: input, dft_length?, axis? (both known at compile time and already applied).
   iattr: [n, n_in, out_len, c_in, c_out, outer, inner, take, irfft, inverse]
   fattr: twiddles (2n). scratch: outer * inner * 4n doubles. */
typedef struct dft_job {
  const kiln_uk_args *a;
  int64_t n, n_in, out_len, c_in, c_out, inner, take, irfft, inverse;
} dft_job;

static void dft_task(void *data, int64_t lane, int64_t tid) {
  (void)tid;
  const dft_job *j = (const dft_job *)data;
  const kiln_uk_args *a = j->a;
  const kiln_tensor *X = &a->in[0], *Y = &a->out[0];
  const int64_t n = j->n, o = lane / j->inner, i = lane % j->inner;
  double *buf = (double *)a->scratch + lane * 4 * n, *res = buf + 2 * n;
  for (int64_t k = 0; k < 2 * n; k++) buf[k] = 0.0;
  for (int64_t k = 0; k < j->take; k++) {
    const int64_t at = ((o * j->n_in + k) * j->inner + i) * j->c_in;
    buf[2 * k] = ldf(X->data, X->dtype, at);
    buf[2 * k + 1] = j->c_in == 2 ? ldf(X->data, X->dtype, at + 1) : 0.0;
  }
  if (j->irfft) {
    /* Conjugate symmetry rebuilds the half the one-sided input lacks. */
    for (int64_t k = 1; k < j->take; k++) {
      const int64_t m = n - k;
      if (m > n / 2) {
        buf[2 * m] = buf[2 * k];
        buf[2 * m + 1] = -buf[2 * k + 1];
      }
    }
  }
  dft_direct(a->fattr, n, buf, res, j->out_len);
  const double scale = 1.0 / (double)n;
  for (int64_t k = 0; k < j->out_len; k++) {
    const int64_t at = ((o * j->out_len + k) * j->inner + i) * j->c_out;
    double re = res[2 * k], im = res[2 * k + 1];
    if (j->inverse) {
      re *= scale;
      im *= scale;
    }
    stf(Y->data, Y->dtype, at, re);
    if (j->c_out == 2) stf(Y->data, Y->dtype, at + 1, im);
  }
}

int32_t kiln_uk_dft(const kiln_uk_args *a) {
  const int64_t *p = a->iattr;
  dft_job j = {a, p[0], p[1], p[2], p[3], p[4], p[6], p[7], p[8], p[9]};
  kiln_rt_parallel_for(a->ctx, dft_task, &j, p[5] * p[6]);
  return KILN_UK_OK;
}

/* STFT. Inputs: signal [batch, len, c], frame_step (known), window? [fl], frame_length?.
   iattr: [batch, len, c, fl, step, frames, bins]; fattr: twiddles (2 fl).
   scratch: batch * frames * 4 fl doubles. */
typedef struct stft_job {
  const kiln_uk_args *a;
  int64_t batch, len, c, fl, step, frames, bins;
} stft_job;

static void stft_task(void *data, int64_t task, int64_t tid) {
  (void)tid;
  const stft_job *j = (const stft_job *)data;
  const kiln_uk_args *a = j->a;
  const kiln_tensor *X = &a->in[0], *Y = &a->out[0];
  const kiln_tensor *win = a->n_in > 2 && a->in[2].data ? &a->in[2] : 0;
  const int64_t fl = j->fl, b = task / j->frames, f = task % j->frames;
  double *buf = (double *)a->scratch + task * 4 * fl, *res = buf + 2 * fl;
  for (int64_t t = 0; t < fl; t++) {
    const int64_t at = (b * j->len + f * j->step + t) * j->c;
    const double w = win ? ldf(win->data, win->dtype, t) : 1.0;
    buf[2 * t] = ldf(X->data, X->dtype, at) * w;
    buf[2 * t + 1] = (j->c == 2 ? ldf(X->data, X->dtype, at + 1) : 0.0) * w;
  }
  dft_direct(a->fattr, fl, buf, res, j->bins);
  for (int64_t k = 0; k < j->bins; k++) {
    const int64_t at = ((b * j->frames + f) * j->bins + k) * 2;
    stf(Y->data, Y->dtype, at, res[2 * k]);
    stf(Y->data, Y->dtype, at + 1, res[2 * k + 1]);
  }
}

int32_t kiln_uk_stft(const kiln_uk_args *a) {
  const int64_t *p = a->iattr;
  stft_job j = {a, p[0], p[1], p[2], p[3], p[4], p[5], p[6]};
  kiln_rt_parallel_for(a->ctx, stft_task, &j, j.batch * j.frames);
  return KILN_UK_OK;
}

/* HannWindow / HammingWindow / BlackmanWindow. Inputs: size (known). Output [size].
   iattr: [kind (WIN_HANN, WIN_HAMMING, WIN_BLACKMAN), size, periodic] */
int32_t kiln_uk_window(const kiln_uk_args *a) {
  const double pi = 3.141592653589793;
  const int64_t kind = a->iattr[0], size = a->iattr[1];
  /* A symmetric window of one point divides 0 by 0 (NaN), as the reference does. */
  const double denom = (double)(a->iattr[2] ? size : (size > 0 ? size - 1 : 0));
  const kiln_tensor *Y = &a->out[0];
  for (int64_t i = 0; i < size; i++) {
    const double n = (double)i;
    double v;
    if (kind == WIN_HANN) {
      const double s = __builtin_sin(pi * n / denom);
      v = s * s;
    } else if (kind == WIN_HAMMING) {
      const double alpha = 25.0 / 46.0;
      v = alpha - (1.0 - alpha) * __builtin_cos(2.0 * pi * n / denom);
    } else {
      v = 0.42 - 0.5 * __builtin_cos(2.0 * pi * n / denom) + 0.08 * __builtin_cos(4.0 * pi * n / denom);
    }
    stf(Y->data, Y->dtype, i, v);
  }
  return KILN_UK_OK;
}

/* =========================================================================================
   RoiAlign
   =========================================================================================
   Inputs: X [N, C, H, W], rois [R, 4], batch_indices [R]. Output [R, C, ph, pw].
   iattr: [N, C, H, W, R, ph, pw, sampling_ratio, max_mode, half_pixel]; fattr: [spatial_scale] */

typedef struct roi_tap {
  int64_t pos[4];
  double w[4];
} roi_tap;

/* The bilinear sample at (y, x) of an h x w plane, with the reference's edge rules. */
KILN_UK_INLINE roi_tap roi_sample(double y, double x, int64_t h, int64_t w) {
  roi_tap t = {{0, 0, 0, 0}, {0, 0, 0, 0}};
  if (y < -1.0 || y > (double)h || x < -1.0 || x > (double)w) return t;
  y = y >= 0.0 ? y : 0.0; /* NaN becomes 0 too, like Rust's f64::max */
  x = x >= 0.0 ? x : 0.0;
  int64_t yl = (int64_t)y, xl = (int64_t)x, yh, xh;
  if (yl >= h - 1) {
    yl = yh = h - 1;
    y = (double)yl;
  } else {
    yh = yl + 1;
  }
  if (xl >= w - 1) {
    xl = xh = w - 1;
    x = (double)xl;
  } else {
    xh = xl + 1;
  }
  const double ly = y - (double)yl, lx = x - (double)xl, hy = 1.0 - ly, hx = 1.0 - lx;
  t.pos[0] = yl * w + xl;
  t.pos[1] = yl * w + xh;
  t.pos[2] = yh * w + xl;
  t.pos[3] = yh * w + xh;
  t.w[0] = hy * hx;
  t.w[1] = hy * lx;
  t.w[2] = ly * hx;
  t.w[3] = ly * lx;
  return t;
}

/* The sample count of one bin axis when sampling_ratio is 0: ceil(extent / bins), saturating
   like Rust's float-to-int cast (NaN and negatives give 0). */
KILN_UK_INLINE int64_t roi_grid(double extent, int64_t bins) {
  const double g = __builtin_ceil(extent / (double)bins);
  if (!(g > 0.0)) return 0;
  return g >= 9.2e18 ? INT64_MAX : (int64_t)g;
}

typedef struct roi_job {
  const kiln_uk_args *a;
  int64_t N, C, H, W, R, ph, pw, ratio, max_mode, half_pixel;
  double scale;
} roi_job;

static void roi_task(void *data, int64_t task, int64_t tid) {
  (void)tid;
  const roi_job *j = (const roi_job *)data;
  const kiln_uk_args *a = j->a;
  const kiln_tensor *X = &a->in[0], *rois = &a->in[1], *bi = &a->in[2], *Y = &a->out[0];
  const int64_t r = task / j->C, ch = task % j->C;
  const int64_t b = kiln_load_i64(bi->data, bi->dtype, r);
  const double off = j->half_pixel ? 0.5 : 0.0;
  const double x0 = ldf(rois->data, rois->dtype, 4 * r) * j->scale - off;
  const double y0 = ldf(rois->data, rois->dtype, 4 * r + 1) * j->scale - off;
  double rw = ldf(rois->data, rois->dtype, 4 * r + 2) * j->scale - off - x0;
  double rh = ldf(rois->data, rois->dtype, 4 * r + 3) * j->scale - off - y0;
  if (!j->half_pixel) {
    rw = rw >= 1.0 ? rw : 1.0;
    rh = rh >= 1.0 ? rh : 1.0;
  }
  const double bin_h = rh / (double)j->ph, bin_w = rw / (double)j->pw;
  const int64_t gh = j->ratio > 0 ? j->ratio : roi_grid(rh, j->ph);
  const int64_t gw = j->ratio > 0 ? j->ratio : roi_grid(rw, j->pw);
  const double count = (double)(gh * gw > 0 ? gh * gw : 1);
  const int64_t plane = (b * j->C + ch) * j->H * j->W;
  for (int64_t py = 0; py < j->ph; py++) {
    for (int64_t px = 0; px < j->pw; px++) {
      double acc = 0.0;
      int any = 0;
      for (int64_t iy = 0; iy < gh; iy++) {
        const double yy = y0 + (double)py * bin_h + ((double)iy + 0.5) * bin_h / (double)gh;
        for (int64_t ix = 0; ix < gw; ix++) {
          const double xx = x0 + (double)px * bin_w + ((double)ix + 0.5) * bin_w / (double)gw;
          const roi_tap t = roi_sample(yy, xx, j->H, j->W);
          if (j->max_mode) {
            /* The largest weighted corner, as the reference and onnxruntime do. */
            double m = -__builtin_inf();
            for (int k = 0; k < 4; k++) {
              const double v = t.w[k] * ldf(X->data, X->dtype, plane + t.pos[k]);
              m = (v > m || m != m) ? v : m;
            }
            acc = (!any || m > acc || acc != acc) ? m : acc;
            any = 1;
          } else {
            for (int k = 0; k < 4; k++) acc += t.w[k] * ldf(X->data, X->dtype, plane + t.pos[k]);
          }
        }
      }
      const double v = j->max_mode ? (any ? acc : 0.0) : acc / count;
      stf(Y->data, Y->dtype, (r * j->C + ch) * j->ph * j->pw + py * j->pw + px, v);
    }
  }
}

int32_t kiln_uk_roi_align(const kiln_uk_args *a) {
  const int64_t *p = a->iattr;
  roi_job j = {a, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], a->fattr[0]};
  const kiln_tensor *bi = &a->in[2];
  for (int64_t r = 0; r < j.R; r++) {
    const int64_t b = kiln_load_i64(bi->data, bi->dtype, r);
    if (b < 0 || b >= j.N)
      return kiln_uk_fail(a, KILN_UK_EINDEX, "RoiAlign batch index %lld is out of range for %lld images",
                          (long long)b, (long long)j.N);
  }
  kiln_rt_parallel_for(a->ctx, roi_task, &j, j.R * j.C);
  return KILN_UK_OK;
}

/* ---- NonMaxSuppression ---------------------------------------------------------------------
   in: boxes [B, N, 4], scores [B, C, N] (same float dtype), max_output_boxes_per_class (i64
   scalar, absent: 0), iou_threshold, score_threshold (scalars, optional). out[0]: the selected
   [batch, class, box] triples, [count, 3] i64, count only known at run time: the buffer holds
   the bound computed at compile time (codegen/src/data_dependent.rs) and this writes the actual
   count into out[0].dims[0] (the run copies it into the shape of every graph output computed
   from it) and zeros past it. iattr: center_point_box.
   scratch: 3 * N int64 (candidates, merge-sort buffer, selected boxes).
   The arithmetic follows the reference (kiln_ir's detect.rs) in the boxes' precision (float
   for f16/bf16/f32 boxes, double for f64): candidates scoring above the threshold, highest
   score first and the lower index on ties, each kept unless its IoU with a kept box exceeds
   the threshold, at most max_output_boxes_per_class per class. */

#define NMS_DEFINE(T, SUFFIX)                                                                      \
  KILN_UK_INLINE T nms_max_##SUFFIX(T a, T b) { return a >= b ? a : b; }                          \
  KILN_UK_INLINE T nms_min_##SUFFIX(T a, T b) { return a <= b ? a : b; }                          \
  KILN_UK_INLINE void nms_extent_##SUFFIX(const T *b, int axis, int center, T *lo, T *hi) {        \
    if (center) {                                                                                  \
      T half = b[axis + 2] / (T)2.0;                                                               \
      *lo = b[axis] - half;                                                                        \
      *hi = b[axis] + half;                                                                        \
    } else if (b[axis] <= b[axis + 2]) {                                                           \
      *lo = b[axis];                                                                               \
      *hi = b[axis + 2];                                                                           \
    } else {                                                                                       \
      *lo = b[axis + 2];                                                                           \
      *hi = b[axis];                                                                               \
    }                                                                                              \
  }                                                                                                \
  KILN_UK_INLINE int nms_suppresses_##SUFFIX(const T *a, const T *b, int center, T threshold) {    \
    T ay0, ay1, ax0, ax1, by0, by1, bx0, bx1;                                                      \
    nms_extent_##SUFFIX(a, 0, center, &ay0, &ay1);                                                 \
    nms_extent_##SUFFIX(a, 1, center, &ax0, &ax1);                                                 \
    nms_extent_##SUFFIX(b, 0, center, &by0, &by1);                                                 \
    nms_extent_##SUFFIX(b, 1, center, &bx0, &bx1);                                                 \
    T ix = nms_min_##SUFFIX(ax1, bx1) - nms_max_##SUFFIX(ax0, bx0);                                \
    T iy = nms_min_##SUFFIX(ay1, by1) - nms_max_##SUFFIX(ay0, by0);                                \
    if (ix <= (T)0 || iy <= (T)0) return 0;                                                        \
    T inter = ix * iy;                                                                             \
    T area_a = (ax1 - ax0) * (ay1 - ay0);                                                          \
    T area_b = (bx1 - bx0) * (by1 - by0);                                                          \
    T uni = area_a + area_b - inter;                                                               \
    if (inter <= (T)0 || area_a <= (T)0 || area_b <= (T)0 || uni <= (T)0) return 0;                \
    return inter / uni > threshold;                                                                \
  }

NMS_DEFINE(float, f)
NMS_DEFINE(double, d)

/* Whether candidate i comes before j: the higher score, then the lower index. */
KILN_UK_INLINE int nms_before(const kiln_tensor *s, int64_t base, int64_t i, int64_t j, int wide) {
  double si = kiln_load_f64(s->data, s->dtype, base + i), sj = kiln_load_f64(s->data, s->dtype, base + j);
  if (!wide) {
    si = (float)si;
    sj = (float)sj;
  }
  if (si > sj) return 1;
  if (sj > si) return 0;
  return i < j;
}

/* Stable merge sort of idx[0..n) by nms_before, through tmp (n entries). */
static void nms_sort(int64_t *idx, int64_t *tmp, int64_t n, const kiln_tensor *s, int64_t base, int wide) {
  for (int64_t width = 1; width < n; width *= 2) {
    for (int64_t lo = 0; lo < n; lo += 2 * width) {
      int64_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
      int64_t i = lo, j = mid, k = lo;
      while (i < mid && j < hi) tmp[k++] = nms_before(s, base, idx[j], idx[i], wide) ? idx[j++] : idx[i++];
      while (i < mid) tmp[k++] = idx[i++];
      while (j < hi) tmp[k++] = idx[j++];
    }
    __builtin_memcpy(idx, tmp, (size_t)n * sizeof *idx);
  }
}

int32_t kiln_uk_nms(const kiln_uk_args *a) {
  const kiln_tensor *boxes = &a->in[0], *scores = &a->in[1];
  const kiln_tensor *y = &a->out[0];
  int center = (int)a->iattr[0];
  int64_t nb = boxes->dims[0], n = boxes->dims[1], nc = scores->dims[1];
  int wide = boxes->dtype == KILN_F64;
  int64_t max_out = 0;
  if (a->n_in > 2 && a->in[2].data && a->in[2].numel > 0) max_out = kiln_load_i64(a->in[2].data, a->in[2].dtype, 0);
  if (max_out < 0) max_out = 0;
  double iou = 0.0, score_t = 0.0;
  int has_score_t = 0;
  if (a->n_in > 3 && a->in[3].data && a->in[3].numel > 0) iou = kiln_load_f64(a->in[3].data, a->in[3].dtype, 0);
  if (a->n_in > 4 && a->in[4].data && a->in[4].numel > 0) {
    score_t = kiln_load_f64(a->in[4].data, a->in[4].dtype, 0);
    has_score_t = 1;
  }
  if (!wide) {
    iou = (float)iou;
    score_t = (float)score_t;
  }
  int64_t *cand = (int64_t *)a->scratch, *tmp = cand + n, *kept = tmp + n;
  int64_t *out = (int64_t *)y->data, count = 0, cap = y->numel / 3;
  float fa[4], fb[4];
  double da[4], db[4];
  for (int64_t b = 0; b < nb; b++) {
    for (int64_t c = 0; c < nc; c++) {
      int64_t base = (b * nc + c) * n, m = 0;
      for (int64_t i = 0; i < n; i++) {
        double s = kiln_load_f64(scores->data, scores->dtype, base + i);
        if (!wide) s = (float)s;
        if (!has_score_t || s > score_t) cand[m++] = i;
      }
      nms_sort(cand, tmp, m, scores, base, wide);
      int64_t n_kept = 0;
      for (int64_t t = 0; t < m && n_kept < max_out; t++) {
        int64_t i = cand[t], keep = 1;
        for (int q = 0; q < 4; q++) {
          da[q] = kiln_load_f64(boxes->data, boxes->dtype, (b * n + i) * 4 + q);
          fa[q] = (float)da[q];
        }
        for (int64_t s = 0; s < n_kept && keep; s++) {
          for (int q = 0; q < 4; q++) {
            db[q] = kiln_load_f64(boxes->data, boxes->dtype, (b * n + kept[s]) * 4 + q);
            fb[q] = (float)db[q];
          }
          keep = wide ? !nms_suppresses_d(da, db, center, iou) : !nms_suppresses_f(fa, fb, center, (float)iou);
        }
        if (!keep) continue;
        if (count >= cap)
          return kiln_uk_fail(a, KILN_UK_EVALUE,
                              "NonMaxSuppression selected more boxes than its output holds (%lld)",
                              (long long)cap);
        kept[n_kept++] = i;
        out[count * 3] = b;
        out[count * 3 + 1] = c;
        out[count * 3 + 2] = i;
        count++;
      }
    }
  }
  /* Past the count: zeros, which index the first box, class and batch entry for the kernels
     that compute on the bound (codegen/src/data_dependent.rs). */
  for (int64_t k = count * 3; k < y->numel; k++) out[k] = 0;
  ((int64_t *)y->dims)[0] = count;
  return KILN_UK_OK;
}

/* DeformConv: Y[b, oc, p] = B[oc] + the sum over the group's input channels ic and the taps t
   (in that order) of W[oc, ic, t] · X[b, ch] sampled bilinearly (zero outside) at p's tap
   position moved by its offset, times the mask — in f64, rounded once, the reference's order
   (ir's eval_deform_conv). iattr: r, N, C, M, group, offset_group, has_bias, has_mask, then
   per spatial axis input extent, kernel, output extent, stride, dilation, pad before
   (codegen/src/uk/misc.rs). Inputs X, W, offset, B, mask. A task per (b, oc) output plane. */
typedef struct {
  const kiln_uk_args *a;
  int64_t plane, taps, points;
} deform_job;

/* X's plane `base` sampled at pos[0..r) (each corner of the cell weighted by the products of
   its fractions; corners outside contribute nothing), as ir's bilinear. */
static double deform_sample(const kiln_tensor *x, int64_t base, const int64_t *ax, int64_t r, const double *pos) {
  double sum = 0.0;
  for (int64_t corner = 0; corner < ((int64_t)1 << r); corner++) {
    int64_t flat = 0, inside = 1;
    double weight = 1.0;
    for (int64_t d = 0; d < r && inside; d++) {
      double f = __builtin_floor(pos[d]), t = pos[d] - f;
      int hi = (corner >> (r - 1 - d)) & 1;
      double i = hi ? f + 1.0 : f;
      if (!(i >= 0.0 && i < (double)ax[6 * d])) {
        inside = 0;
        break;
      }
      flat = flat * ax[6 * d] + (int64_t)i;
      weight *= hi ? t : 1.0 - t;
    }
    if (inside) sum += weight * kiln_load_f64(x->data, x->dtype, base + flat);
  }
  return sum;
}

static void deform_task(void *data, int64_t task, int64_t tid) {
  (void)tid;
  const deform_job *j = (const deform_job *)data;
  const kiln_uk_args *a = j->a;
  const kiln_tensor *x = &a->in[0], *w = &a->in[1], *off = &a->in[2], *y = &a->out[0];
  int64_t r = a->iattr[0], c = a->iattr[2], m = a->iattr[3], g = a->iattr[4], og = a->iattr[5];
  int has_bias = (int)a->iattr[6], has_mask = (int)a->iattr[7];
  const int64_t *ax = a->iattr + 8;
  int64_t b = task / m, oc = task % m, cg = c / g, grp = oc / (m / g), c_per_og = c / og;
  int64_t tap[8], o[8];
  double pos[8];
  for (int64_t p = 0; p < j->points; p++) {
    int64_t rest = p;
    for (int64_t d = r - 1; d >= 0; d--) {
      o[d] = rest % ax[6 * d + 2];
      rest /= ax[6 * d + 2];
    }
    double acc = has_bias ? kiln_load_f64(a->in[3].data, a->in[3].dtype, oc) : 0.0;
    for (int64_t ic = 0; ic < cg; ic++) {
      int64_t ch = grp * cg + ic, o_grp = ch / c_per_og;
      for (int64_t t = 0; t < j->taps; t++) {
        int64_t rt = t;
        for (int64_t d = r - 1; d >= 0; d--) {
          tap[d] = rt % ax[6 * d + 1];
          rt /= ax[6 * d + 1];
        }
        for (int64_t d = 0; d < r; d++) {
          double base = (double)(o[d] * ax[6 * d + 3] + tap[d] * ax[6 * d + 4]) - (double)ax[6 * d + 5];
          pos[d] = base + kiln_load_f64(off->data, off->dtype, (((b * og + o_grp) * j->taps + t) * r + d) * j->points + p);
        }
        double scale = has_mask ? kiln_load_f64(a->in[4].data, a->in[4].dtype, ((b * og + o_grp) * j->taps + t) * j->points + p)
                                : 1.0;
        double s = deform_sample(x, (b * c + ch) * j->plane, ax, r, pos) * scale;
        acc += kiln_load_f64(w->data, w->dtype, (oc * cg + ic) * j->taps + t) * s;
      }
    }
    kiln_store_f64(y->data, y->dtype, task * j->points + p, acc);
  }
}

int32_t kiln_uk_deform_conv(const kiln_uk_args *a) {
  int64_t r = a->iattr[0];
  deform_job j = {a, 1, 1, 1};
  for (int64_t d = 0; d < r; d++) {
    j.plane *= a->iattr[8 + 6 * d];
    j.taps *= a->iattr[8 + 6 * d + 1];
    j.points *= a->iattr[8 + 6 * d + 2];
  }
  kiln_rt_parallel_for(a->ctx, deform_task, &j, a->iattr[1] * a->iattr[3]);
  return KILN_UK_OK;
}
