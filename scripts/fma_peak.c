/*
 * The f32 FMA peak of one core: 24 independent 512-bit (or, built without -mavx512f, 256-bit)
 * multiply-add chains, enough to cover the FMA latency on every x86 core kiln targets. Run one
 * copy per core at once for the machine's peak; a model's FLOPs over this peak is the time no
 * engine can beat.
 *
 *   cc -O2 -mavx512f -o fma_peak scripts/fma_peak.c && ./fma_peak
 *   (./fma_peak & ./fma_peak & wait)          # two cores
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#ifdef __AVX512F__
typedef __m512 vec;
#define LANES 16
#define SET1 _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define SUM _mm512_reduce_add_ps
#else
typedef __m256 vec;
#define LANES 8
#define SET1 _mm256_set1_ps
#define FMA _mm256_fmadd_ps
static float SUM(__m256 v) {
  float t[8], s = 0;
  _mm256_storeu_ps(t, v);
  for (int i = 0; i < 8; i++) s += t[i];
  return s;
}
#endif

int main(void) {
  enum { CHAINS = 24 };
  vec acc[CHAINS], b = SET1(1.0000001f), c = SET1(0.999999f);
  for (int i = 0; i < CHAINS; i++) acc[i] = SET1((float)i);
  const long iters = 50000000;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long it = 0; it < iters; it++) {
#pragma GCC unroll 24
    for (int i = 0; i < CHAINS; i++) acc[i] = FMA(acc[i], b, c);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  float sum = 0;
  for (int i = 0; i < CHAINS; i++) sum += SUM(acc[i]);
  /* The sum keeps the loop from being optimized away. */
  printf("%.1f GFLOP/s f32 FMA, %d-bit vectors (checksum %g)\n", (double)iters * CHAINS * LANES * 2 / s / 1e9,
         LANES * 32, (double)sum);
  return 0;
}
