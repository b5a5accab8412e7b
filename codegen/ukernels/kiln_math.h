/*
 * Branch-free f32 transcendental functions for the micro-kernels.
 *
 * libm calls (expf, tanhf, ...) block loop vectorisation; these are written with selects
 * instead of branches and without table lookups, so that a plain `for` loop over them
 * vectorises to the target's full vector width once LLVM inlines them. Accuracy: a few ulp
 * (relative error below 1e-6 on the whole f32 range), with IEEE behaviour for ±0, ±inf, NaN
 * and subnormal inputs and results.
 *
 * Freestanding: only <stdint.h>; safe to include from any micro-kernel.
 */
#ifndef KILN_MATH_H
#define KILN_MATH_H

#include <stdint.h>

#define KILN_MATH_INLINE static inline __attribute__((always_inline))

KILN_MATH_INLINE uint32_t kiln_f2u(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
}

KILN_MATH_INLINE float kiln_u2f(uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

/* 2^n for integer n in [-126, 127], built from the exponent bits. */
KILN_MATH_INLINE float kiln_pow2i(int32_t n) { return kiln_u2f((uint32_t)(n + 127) << 23); }

/* e^x. Cody-Waite reduction x = n·ln2 + r, |r| <= ln2/2, and a degree-6 polynomial for e^r
   (Cephes). The scale 2^n is applied in two halves so that results between the largest
   subnormal and FLT_MAX need no special case and overflow/underflow round correctly. */
KILN_MATH_INLINE float kiln_expf(float x) {
  /* Beyond these e^x is inf or rounds to 0; clamping (NaN-preserving) keeps n in range. */
  x = x > 89.0f ? 89.0f : x;
  x = x < -104.0f ? -104.0f : x;
  /* n = round(x / ln2) by the 1.5·2^23 shifter: the integer is read back from the bits, so
     no float→int conversion (undefined for NaN) is needed. */
  const float shifter = 12582912.0f;
  float t = x * 1.44269504088896341f + shifter;
  int32_t n = (int32_t)(kiln_f2u(t) - kiln_f2u(shifter));
  float nf = t - shifter;
  float r = x - nf * 0.693359375f;
  r = r - nf * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  /* NaN gives garbage n but p is NaN; keep the shift arithmetic defined with unsigned ops. */
  int32_t n1 = n >> 1;
  int32_t n2 = n - n1;
  uint32_t m = 0xffu;
  float s1 = kiln_u2f((((uint32_t)(n1 + 127)) & m) << 23);
  float s2 = kiln_u2f((((uint32_t)(n2 + 127)) & m) << 23);
  return p * s1 * s2;
}

/* e^x - 1, accurate near 0 where e^x - 1 cancels: the Taylor series (degree 9, truncation
   below 3e-10 relative) for |x| < 0.5, e^x - 1 beyond (at most two bits lost there). */
KILN_MATH_INLINE float kiln_expm1f(float x) {
  float p = 2.75573192e-6f;
  p = p * x + 2.48015873e-5f;
  p = p * x + 1.98412698e-4f;
  p = p * x + 1.38888889e-3f;
  p = p * x + 8.33333333e-3f;
  p = p * x + 4.16666667e-2f;
  p = p * x + 1.66666667e-1f;
  p = p * x + 0.5f;
  float small = x + x * x * p;
  float big = kiln_expf(x) - 1.0f;
  float ax = x < 0.0f ? -x : x;
  return ax < 0.5f ? small : big;
}

/* ln(x). x = m·2^e with m in [√½, √2), ln(1+f) for f = m - 1 by the Cephes polynomial;
   subnormal inputs are scaled by 2^23 first. */
KILN_MATH_INLINE float kiln_logf(float x) {
  int sub = x < 1.17549435e-38f;
  float xs = sub ? x * 8388608.0f : x;
  uint32_t u = kiln_f2u(xs);
  int32_t e = (int32_t)((u >> 23) & 0xff) - 127 - (sub ? 23 : 0);
  /* mantissa in [1, 2) */
  float m = kiln_u2f((u & 0x007fffffu) | 0x3f800000u);
  int big = m > 1.41421356f;
  m = big ? m * 0.5f : m;
  e = big ? e + 1 : e;
  float f = m - 1.0f;
  float z = f * f;
  float p = 7.0376836292e-2f;
  p = p * f + -1.1514610310e-1f;
  p = p * f + 1.1676998740e-1f;
  p = p * f + -1.2420140846e-1f;
  p = p * f + 1.4249322787e-1f;
  p = p * f + -1.6668057665e-1f;
  p = p * f + 2.0000714765e-1f;
  p = p * f + -2.4999993993e-1f;
  p = p * f + 3.3333331174e-1f;
  float ef = (float)e;
  float y = f * z * p;
  y = y + ef * -2.12194440e-4f;
  y = y - 0.5f * z;
  float r = f + y;
  r = r + ef * 0.693359375f;
  /* Special values: log(±0) = -inf, log(x<0) = NaN, log(inf) = inf, NaN stays NaN. */
  r = x == 0.0f ? -__builtin_inff() : r;
  r = x < 0.0f ? __builtin_nanf("") : r;
  r = x == __builtin_inff() ? x : r;
  r = x != x ? x : r;
  return r;
}

/* 1/(1+e^-x), from e = e^-|x| so that neither form overflows and tiny results keep their
   relative accuracy. */
KILN_MATH_INLINE float kiln_sigmoidf(float x) {
  float ax = x < 0.0f ? -x : x;
  float e = kiln_expf(-ax);
  float s = 1.0f / (1.0f + e);
  return x < 0.0f ? e * s : s;
}

/* tanh(x): an odd polynomial for |x| < 0.625 (Cephes), 1 - 2/(e^2|x| + 1) beyond. */
KILN_MATH_INLINE float kiln_tanhf(float x) {
  float ax = x < 0.0f ? -x : x;
  float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z + -5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z + -3.33332819422e-1f;
  float small = x + x * z * p;
  float e = kiln_expf(2.0f * ax);
  float big = 1.0f - 2.0f / (e + 1.0f);
  big = x < 0.0f ? -big : big;
  return ax < 0.625f ? small : big;
}

/* erfc(z) for z in [0.875, 10] without the leading e^(-z²): erfc(z) = t·e^(R(s) - z²) with
   t = 1/(1 + z/2) and R a least-squares polynomial in s, t mapped to [-1, 1] (relative error
   of the fit below 3e-7). Returns t·e^R(s) in *tr; the caller applies e^(-z²). */
KILN_MATH_INLINE float kiln_erfc_tail_(float z, float *tr) {
  float t = 1.0f / (1.0f + 0.5f * z);
  float s = (t - 0.43115942f) * 3.7808219f;
  float r = -1.6210351532e-05f;
  r = r * s + 7.21474425517954e-05f;
  r = r * s + 2.662028418853879e-04f;
  r = r * s + -1.1868111323565245e-03f;
  r = r * s + -5.906339269131422e-03f;
  r = r * s + 1.8291428685188293e-02f;
  r = r * s + 3.475741446018219e-01f;
  r = r * s + -7.63388454914093e-01f;
  *tr = t;
  return r;
}

/* erf(x)/x as a polynomial in x² on |x| < 0.875 (least squares, relative error 6e-8). */
KILN_MATH_INLINE float kiln_erf_small_(float x) {
  float z = x * x;
  float p = 8.71393785928376e-05f;
  p = p * z + -8.220490417443216e-04f;
  p = p * z + 5.207619164139032e-03f;
  p = p * z + -2.6861967518925667e-02f;
  p = p * z + 1.1283741146326065e-01f;
  p = p * z + -3.7612637877464294e-01f;
  p = p * z + 1.128379225730896f;
  return x * p;
}

/* erf(x): the odd polynomial for |x| < 0.875, 1 - erfc beyond (erf rounds to ±1 in f32 past
   3.92, so |x| is clamped to 4 there; the rounding of z² in e^(-z²) is harmless because erfc
   is small next to 1). */
KILN_MATH_INLINE float kiln_erff(float x) {
  float z = x < 0.0f ? -x : x;
  z = z > 4.0f ? 4.0f : z;
  z = z < 0.875f ? 0.875f : z; /* keeps the unused branch finite */
  float t;
  float r = kiln_erfc_tail_(z, &t);
  float big = 1.0f - t * kiln_expf(r - z * z);
  big = x < 0.0f ? -big : big;
  float ax = x < 0.0f ? -x : x;
  float res = ax < 0.875f ? kiln_erf_small_(x) : big;
  return x != x ? x : res;
}

/* erfc(x) = 1 - erf(x), accurate also where it is tiny (the negative tail of Gelu). e^(-z²) is
   computed as e^(-zh²)·e^(-(z-zh)(z+zh)) with zh = z rounded to 12 bits, so zh² is exact. */
KILN_MATH_INLINE float kiln_erfcf(float x) {
  float z = x < 0.0f ? -x : x;
  float zc = z > 10.0f ? 10.0f : z;
  zc = zc < 0.875f ? 0.875f : zc;
  float t;
  float r = kiln_erfc_tail_(zc, &t);
  float zh = kiln_u2f(kiln_f2u(zc) & 0xfffff000u);
  float tail = t * kiln_expf(r - (zc - zh) * (zc + zh)) * kiln_expf(-(zh * zh));
  tail = z > 10.0f ? 0.0f : tail;
  float big = x < 0.0f ? 2.0f - tail : tail;
  float res = z < 0.875f ? 1.0f - kiln_erf_small_(x) : big;
  return x != x ? x : res;
}

/* GELU's erf form, 0.5·x·(1 + erf(x/√2)), with erf as one rational function u·P(u²)/Q(u²) of
   u clamped to ±4 (the minimax coefficients Eigen uses for its fast f32 erf): absolute error
   of erf below 5e-7, no exponential, no branch, a third of the work of kiln_erff. 1 + erf
   loses its relative accuracy where erf nears -1 (x < -3.7), as every f32 GELU that forms
   1 + erf does; the result's absolute error stays below 3e-7 there. The rational overshoots 1
   by an ulp near the clamp, so 1 + erf is kept at or above 0 (no sign flip for x ≪ 0). The
   generated kernels compute the same (vmath.rs `gelu_erf`), so fused and unfused GELU agree. */
KILN_MATH_INLINE float kiln_gelu_erff(float x) {
  float u = x * 0.70710678118654752f;
  u = u > 4.0f ? 4.0f : u;
  u = u < -4.0f ? -4.0f : u;
  float z = u * u;
  float p = -2.72614225801306e-10f;
  p = p * z + 2.77068142495902e-08f;
  p = p * z + -2.10102402082508e-06f;
  p = p * z + -5.69250639462346e-05f;
  p = p * z + -7.34990630326855e-04f;
  p = p * z + -2.95459980854025e-03f;
  p = p * z + -1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * z + -2.13374055278905e-04f;
  q = q * z + -1.68282697438203e-03f;
  q = q * z + -7.37332916720468e-03f;
  q = q * z + -1.42647390514189e-02f;
  float c = 1.0f + u * p / q;
  c = c < 0.0f ? 0.0f : c;
  return 0.5f * x * c;
}

#endif
