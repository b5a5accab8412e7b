/* Micro-kernels for the misc family: recurrent cells, quantization, signal processing and
   RoiAlign. See kiln_uk.h for the contract; codegen/src/uk/misc.rs packs the attributes in the
   order each kernel documents. */
#include "kiln_uk.h"
#include <float.h>

/* Every kernel here computes in double, like kiln_ir's reference interpreter, and rounds once
   when it stores: the results then agree with ir::eval bit for bit in most cases. */
KILN_UK_INLINE double ldf(const void *p, int64_t dt, int64_t i) { return kiln_load_f64(p, dt, i); }


KILN_UK_INLINE double clampd(double v, double lo, double hi) { return v < lo ? lo : (v > hi ? hi : v); }

/* =========================================================================================
   RNN / GRU / LSTM
   =========================================================================================

   Inputs (ONNX order): X, W, R, B?, sequence_lens?, initial_h?, initial_c? (LSTM), P? (LSTM).
   Outputs: Y?, Y_h?, Y_c? (LSTM); an output with data == NULL is not written.
   iattr: [kind (0 RNN, 1 GRU, 2 LSTM), dirs, reverse (direction == reverse), hidden, layout,
           input_forget, linear_before_reset, has_clip, seq, batch, input,
           n_act, act_code[n_act]]
   fattr: [clip, (alpha, beta)[n_act]]
   Activation codes: 0 Relu, 1 Tanh, 2 Sigmoid, 3 Affine, 4 LeakyRelu, 5 ThresholdedRelu,
   6 ScaledTanh, 7 HardSigmoid, 8 Elu, 9 Softsign, 10 Softplus.
   scratch: dirs * batch * rnn_task_doubles(...) doubles. */

enum { RNN_RNN = 0, RNN_GRU = 1, RNN_LSTM = 2 };

KILN_UK_INLINE double sigmoid_d(double x) {
  /* Two forms so that exp never overflows into inf/inf. */
  if (x >= 0) return 1.0 / (1.0 + __builtin_exp(-x));
  double e = __builtin_exp(x);
  return e / (1.0 + e);
}

KILN_UK_INLINE double rnn_activate(int64_t code, double alpha, double beta, double x) {
  switch (code) {
  case 0: return (x > 0 || x != x) ? x : 0.0;
  case 1: return __builtin_tanh(x);
  case 2: return sigmoid_d(x);
  case 3: return alpha * x + beta;
  case 4: return x >= 0 ? x : alpha * x;
  case 5: return x > alpha ? x : 0.0;
  case 6: return alpha * __builtin_tanh(beta * x);
  case 7: return clampd(alpha * x + beta, 0.0, 1.0);
  case 8: return x >= 0 ? x : alpha * __builtin_expm1(x);
  case 9: return x / (1.0 + __builtin_fabs(x));
  default: return x > 0 ? x + __builtin_log1p(__builtin_exp(-x)) : __builtin_log1p(__builtin_exp(x));
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
      for (int64_t k = 0; k < H; k++) kiln_store_f64(Y->data, Y->dtype, yoff + k, h[k]);
    }
  }
  if (Y) {
    for (int64_t t = len; t < j->seq; t++) {
      const int64_t yoff = j->layout ? ((b * j->seq + t) * j->dirs + dir) * H
                                     : ((t * j->dirs + dir) * j->batch + b) * H;
      for (int64_t k = 0; k < H; k++) kiln_store_f64(Y->data, Y->dtype, yoff + k, 0.0);
    }
  }
  /* A row without steps keeps zero final states (as onnxruntime does). */
  for (int64_t o = 1; o < 3 && o < a->n_out; o++) {
    const kiln_tensor *S = &a->out[o];
    if (!S->data) continue;
    const double *src = o == 1 ? h : c;
    for (int64_t k = 0; k < H; k++)
      kiln_store_f64(S->data, S->dtype, rnn_state_index(j, dir, b, k), len > 0 ? src[k] : 0.0);
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
