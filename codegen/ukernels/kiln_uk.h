/*
 * kiln micro-kernel ABI. Operators without a kernel generated directly as LLVM IR are compiled
 * from the C functions in this folder: build.rs turns them into LLVM bitcode per target, and
 * codegen links that bitcode into the model's module, calls kiln_uk_<op> with constant shape
 * descriptors and attribute arrays, and lets LLVM inline and specialise the call. No function
 * here allocates memory or touches global state: scratch space comes from the memory plan.
 *
 * Contract of every micro-kernel:
 *     int32_t kiln_uk_<name>(const kiln_uk_args *a);
 * returns 0 on success, or a KILN_UK_E* code after writing a message with kiln_uk_fail (for
 * data-dependent errors, e.g. an index out of range in a runtime input). The Rust side that
 * packs the attributes lives in codegen/src/uk/<family>.rs, next to a comment giving the
 * order of iattr/fattr entries; the C side reads them in the same order.
 */
#ifndef KILN_UK_H
#define KILN_UK_H

#include "kiln_rt.h"
#include <stddef.h>
#include <stdint.h>

typedef struct kiln_tensor {
  void *data;           /* NULL for an absent optional input */
  const int64_t *dims;  /* rank entries */
  int64_t rank;
  int64_t dtype;        /* enum kiln_dtype */
  int64_t numel;
} kiln_tensor;

typedef struct kiln_uk_args {
  const kiln_tensor *in;
  int64_t n_in;
  const kiln_tensor *out;
  int64_t n_out;
  const int64_t *iattr; /* integer attributes, op-specific order */
  int64_t n_iattr;
  const double *fattr;  /* floating attributes, op-specific order */
  int64_t n_fattr;
  void *scratch;        /* scratch_bytes requested by the Rust side, 64-byte aligned, or NULL */
  kiln_ctx *ctx;        /* for kiln_rt_parallel_for, kiln_rt_thread_scratch, errors */
} kiln_uk_args;

#define KILN_UK_OK 0
#define KILN_UK_EINDEX 1   /* an index from a runtime input is out of range */
#define KILN_UK_EVALUE 2   /* a runtime value is invalid for the operator */

#define KILN_UK_INLINE static inline __attribute__((always_inline))

/* Element access by dtype code, for kernels generic over dtypes. Floating types go through
   double; 64-bit integers through int64_t/uint64_t so they stay exact. */
KILN_UK_INLINE float kiln_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else { /* subnormal: renormalise */
      int e = -1;
      do { man <<= 1; e++; } while (!(man & 0x400));
      bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

KILN_UK_INLINE uint16_t kiln_f32_to_f16(float f) { /* round to nearest even */
  uint32_t x;
  __builtin_memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* overflow to inf */
  if (ax < 0x38800000u) { /* subnormal or zero */
    if (ax < 0x33000000u) return (uint16_t)sign;
    uint32_t man = (ax & 0x7fffff) | 0x800000;
    int shift = 126 - (int)(ax >> 23);
    uint32_t r = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) r++;
    return (uint16_t)(sign | r);
  }
  uint32_t r = ((ax >> 13) - (112u << 10));
  uint32_t rem = ax & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
  return (uint16_t)(sign | r);
}

KILN_UK_INLINE float kiln_bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

KILN_UK_INLINE uint16_t kiln_f32_to_bf16(float f) { /* round to nearest even; NaN stays NaN */
  uint32_t x;
  __builtin_memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

KILN_UK_INLINE int kiln_dtype_size(int64_t dt) {
  switch (dt) {
  case KILN_BOOL: case KILN_U8: case KILN_I8: return 1;
  case KILN_U16: case KILN_I16: case KILN_F16: case KILN_BF16: return 2;
  case KILN_U32: case KILN_I32: case KILN_F32: return 4;
  default: return 8;
  }
}

KILN_UK_INLINE int kiln_dtype_is_float(int64_t dt) {
  return dt == KILN_F16 || dt == KILN_BF16 || dt == KILN_F32 || dt == KILN_F64;
}

KILN_UK_INLINE double kiln_load_f64(const void *p, int64_t dt, int64_t i) {
  switch (dt) {
  case KILN_BOOL: return ((const uint8_t *)p)[i] != 0;
  case KILN_U8: return ((const uint8_t *)p)[i];
  case KILN_I8: return ((const int8_t *)p)[i];
  case KILN_U16: return ((const uint16_t *)p)[i];
  case KILN_I16: return ((const int16_t *)p)[i];
  case KILN_U32: return ((const uint32_t *)p)[i];
  case KILN_I32: return ((const int32_t *)p)[i];
  case KILN_U64: return (double)((const uint64_t *)p)[i];
  case KILN_I64: return (double)((const int64_t *)p)[i];
  case KILN_F16: return kiln_f16_to_f32(((const uint16_t *)p)[i]);
  case KILN_BF16: return kiln_bf16_to_f32(((const uint16_t *)p)[i]);
  case KILN_F32: return ((const float *)p)[i];
  default: return ((const double *)p)[i];
  }
}

/* Stores v converted like ONNX Cast from a floating value (float to int truncates toward zero). */
KILN_UK_INLINE void kiln_store_f64(void *p, int64_t dt, int64_t i, double v) {
  switch (dt) {
  case KILN_BOOL: ((uint8_t *)p)[i] = v != 0; break;
  case KILN_U8: ((uint8_t *)p)[i] = (uint8_t)(int64_t)v; break;
  case KILN_I8: ((int8_t *)p)[i] = (int8_t)(int64_t)v; break;
  case KILN_U16: ((uint16_t *)p)[i] = (uint16_t)(int64_t)v; break;
  case KILN_I16: ((int16_t *)p)[i] = (int16_t)(int64_t)v; break;
  case KILN_U32: ((uint32_t *)p)[i] = (uint32_t)(int64_t)v; break;
  case KILN_I32: ((int32_t *)p)[i] = (int32_t)(int64_t)v; break;
  case KILN_U64: ((uint64_t *)p)[i] = (uint64_t)v; break;
  case KILN_I64: ((int64_t *)p)[i] = (int64_t)v; break;
  case KILN_F16: ((uint16_t *)p)[i] = kiln_f32_to_f16((float)v); break;
  case KILN_BF16: ((uint16_t *)p)[i] = kiln_f32_to_bf16((float)v); break;
  case KILN_F32: ((float *)p)[i] = (float)v; break;
  default: ((double *)p)[i] = v; break;
  }
}

KILN_UK_INLINE int64_t kiln_load_i64(const void *p, int64_t dt, int64_t i) {
  switch (dt) {
  case KILN_BOOL: case KILN_U8: return ((const uint8_t *)p)[i];
  case KILN_I8: return ((const int8_t *)p)[i];
  case KILN_U16: return ((const uint16_t *)p)[i];
  case KILN_I16: return ((const int16_t *)p)[i];
  case KILN_U32: return ((const uint32_t *)p)[i];
  case KILN_I32: return ((const int32_t *)p)[i];
  case KILN_U64: case KILN_I64: return ((const int64_t *)p)[i];
  default: return (int64_t)kiln_load_f64(p, dt, i);
  }
}

KILN_UK_INLINE void kiln_store_i64(void *p, int64_t dt, int64_t i, int64_t v) {
  switch (dt) {
  case KILN_BOOL: ((uint8_t *)p)[i] = v != 0; break;
  case KILN_U8: case KILN_I8: ((uint8_t *)p)[i] = (uint8_t)v; break;
  case KILN_U16: case KILN_I16: ((uint16_t *)p)[i] = (uint16_t)v; break;
  case KILN_U32: case KILN_I32: ((uint32_t *)p)[i] = (uint32_t)v; break;
  case KILN_U64: case KILN_I64: ((int64_t *)p)[i] = v; break;
  default: kiln_store_f64(p, dt, i, (double)v); break;
  }
}

/* Records a message (printf-style) on the context; returns code for `return kiln_uk_fail(..)`. */
#define kiln_uk_fail(a, code, ...) (kiln_rt_set_error((a)->ctx, __VA_ARGS__), (code))

#endif
