/*
 * The peak multiply-add rate of one core: 24 independent 512-bit (or, built without
 * -mavx512f, 256-bit) dot-product chains, enough to cover the instruction's latency on every
 * x86 core kiln targets. Run one copy per core at once for the machine's peak; a model's
 * operations over this peak is the time no engine can beat.
 *
 *   f32   FMA (vfmadd): 2 FLOP per lane
 *   bf16  vdpbf16ps: a pair of bf16 products added to an f32 lane, 4 FLOP per lane
 *   int8  vpdpbusd: four u8 x s8 products added to an i32 lane, 8 OP per lane
 *
 *   cc -O2 -march=native -o fma_peak scripts/fma_peak.c && ./fma_peak [f32|bf16|int8]
 *   (./fma_peak int8 & ./fma_peak int8 & wait)          # two cores
 */
#include <immintrin.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

enum { CHAINS = 24 };
static const long ITERS = 50000000;

static double seconds_since(const struct timespec *t0) {
  struct timespec t1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (double)(t1.tv_sec - t0->tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0->tv_nsec);
}

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

static void f32_peak(void) {
  vec acc[CHAINS], b = SET1(1.0000001f), c = SET1(0.999999f);
  for (int i = 0; i < CHAINS; i++) acc[i] = SET1((float)i);
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long it = 0; it < ITERS; it++) {
#pragma GCC unroll 24
    for (int i = 0; i < CHAINS; i++) acc[i] = FMA(acc[i], b, c);
  }
  double s = seconds_since(&t0);
  float sum = 0;
  for (int i = 0; i < CHAINS; i++) sum += SUM(acc[i]);
  /* The sum keeps the loop from being optimized away. */
  printf("%.1f GFLOP/s f32 FMA, %d-bit vectors (checksum %g)\n", (double)ITERS * CHAINS * LANES * 2 / s / 1e9,
         LANES * 32, (double)sum);
}

#if defined(__AVX512BF16__)
static void bf16_peak(void) {
  __m512 acc[CHAINS];
  __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3c00);
  for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_set1_ps((float)i);
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long it = 0; it < ITERS; it++) {
#pragma GCC unroll 24
    for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  double s = seconds_since(&t0);
  float sum = 0;
  for (int i = 0; i < CHAINS; i++) sum += _mm512_reduce_add_ps(acc[i]);
  printf("%.1f GFLOP/s bf16 vdpbf16ps, 512-bit vectors (checksum %g)\n",
         (double)ITERS * CHAINS * 16 * 4 / s / 1e9, (double)sum);
}
#endif

#if defined(__AVX512VNNI__)
/* vpdpbusd in inline assembly: with the intrinsic on an array of 24 accumulators GCC keeps
   them on the stack, and the loop measures its loads and stores instead. */
#define DPBUSD(r) "vpdpbusd %1, %0, %%zmm" #r "\n\t"
static void int8_peak(void) {
  __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-1);
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long it = 0; it < ITERS; it++)
    __asm__ volatile(DPBUSD(8) DPBUSD(9) DPBUSD(10) DPBUSD(11) DPBUSD(12) DPBUSD(13) DPBUSD(14)
                         DPBUSD(15) DPBUSD(16) DPBUSD(17) DPBUSD(18) DPBUSD(19) DPBUSD(20) DPBUSD(21)
                             DPBUSD(22) DPBUSD(23) DPBUSD(24) DPBUSD(25) DPBUSD(26) DPBUSD(27)
                                 DPBUSD(28) DPBUSD(29) DPBUSD(30) DPBUSD(31)
                     :
                     : "v"(a), "v"(b)
                     : "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16",
                       "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24",
                       "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31");
  double s = seconds_since(&t0);
  printf("%.1f GOP/s int8 vpdpbusd, 512-bit vectors\n", (double)ITERS * CHAINS * 16 * 8 / s / 1e9);
}
#endif

int main(int argc, char **argv) {
  const char *what = argc > 1 ? argv[1] : "f32";
  if (!strcmp(what, "f32")) {
    f32_peak();
    return 0;
  }
#if defined(__AVX512BF16__)
  if (!strcmp(what, "bf16")) {
    bf16_peak();
    return 0;
  }
#endif
#if defined(__AVX512VNNI__)
  if (!strcmp(what, "int8")) {
    int8_peak();
    return 0;
  }
#endif
  fprintf(stderr, "usage: %s [f32|bf16|int8] (bf16 and int8 need a build with avx512bf16 / avx512vnni)\n",
          argv[0]);
  return 2;
}
