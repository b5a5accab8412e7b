/*
 * A stand-in for libcuda.so.1 (loaded through $KILN_CUDA_DRIVER) to test how CUDA artifacts fail
 * on machines without a usable GPU. It exports every driver function the runtime resolves.
 *
 * $FAKE_CUDA_DEVICES unset: cuInit fails with CUDA_ERROR_NO_DEVICE, as the real driver does
 * on a machine without a GPU. Set to N: cuInit succeeds and N devices are reported, of compute
 * capability $FAKE_CUDA_SM (default 80); everything past reading the device's properties fails
 * with CUDA_ERROR_UNKNOWN (999), so the runtime's error paths after initialization run too.
 * With $FAKE_CUDA_HOST=1 as well, the rest works on host memory: "device" pointers are host
 * pointers, kernels do nothing but check their frame, and the driver aborts when the runtime
 * releases the context with memory, a stream, a module or a pushed context left over. Then
 * $FAKE_CUDA_JIT_FAIL makes loading the PTX fail with a JIT log, and $FAKE_CUDA_FAIL=K:CODE
 * makes the kernel entry kiln_kK report CODE in the frame's error slot.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

#define NO_DEVICE 100
#define INVALID_DEVICE 101
#define INVALID_PTX 218
#define NOT_FOUND 500
#define UNKNOWN 999

static int devices(void) {
  const char *v = getenv("FAKE_CUDA_DEVICES");
  return v ? atoi(v) : -1;
}

CUresult cuGetErrorString(CUresult r, const char **s) {
  switch (r) {
  case NO_DEVICE:
    *s = "no CUDA-capable device is detected";
    return 0;
  case INVALID_DEVICE:
    *s = "invalid device ordinal";
    return 0;
  case UNKNOWN:
    *s = "unknown error";
    return 0;
  case INVALID_PTX:
    *s = "a PTX JIT compilation failed";
    return 0;
  case NOT_FOUND:
    *s = "named symbol not found";
    return 0;
  default:
    *s = NULL;
    return 1;
  }
}

CUresult cuInit(unsigned flags) {
  (void)flags;
  return devices() < 0 ? NO_DEVICE : 0;
}

CUresult cuDeviceGetCount(int *count) {
  *count = devices() < 0 ? 0 : devices();
  return 0;
}

CUresult cuDeviceGet(int *dev, int ordinal) {
  if (ordinal < 0 || ordinal >= devices()) return INVALID_DEVICE;
  *dev = ordinal;
  return 0;
}

CUresult cuDeviceGetName(char *name, int len, int dev) {
  (void)dev;
  strncpy(name, "Fake GPU", (size_t)len);
  return 0;
}

CUresult cuDeviceGetAttribute(int *value, int attrib, int dev) {
  (void)dev;
  const char *v = getenv("FAKE_CUDA_SM");
  int sm = v ? atoi(v) : 80;
  if (attrib == 75) *value = sm / 10;
  else if (attrib == 76) *value = sm % 10;
  else return UNKNOWN;
  return 0;
}

/* ---- past the device check: host memory, or failures ------------------------------------ */

static int host(void) {
  const char *v = getenv("FAKE_CUDA_HOST");
  return v && *v == '1';
}

static long allocations, streams, modules, pushed, retained;
static const char *ptx;

static void check(int ok, const char *what) {
  if (ok) return;
  fprintf(stderr, "fake CUDA driver: %s\n", what);
  abort();
}

CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) {
  (void)dev;
  if (!host()) return UNKNOWN;
  retained++;
  *ctx = (void *)&retained;
  return 0;
}

CUresult cuDevicePrimaryCtxRelease_v2(int dev) {
  (void)dev;
  if (!host()) return UNKNOWN;
  check(retained > 0, "release without retain");
  retained--;
  if (retained == 0) {
    check(allocations == 0, "device memory left allocated");
    check(streams == 0, "a stream left undestroyed");
    check(modules == 0, "a module left loaded");
    check(pushed == 0, "a context left pushed");
  }
  return 0;
}

CUresult cuCtxPushCurrent_v2(void *ctx) {
  if (!host()) return UNKNOWN;
  check(ctx == (void *)&retained, "push of a context that was not retained");
  pushed++;
  return 0;
}

CUresult cuCtxPopCurrent_v2(void **ctx) {
  if (!host()) return UNKNOWN;
  check(pushed > 0, "pop without push");
  pushed--;
  if (ctx) *ctx = (void *)&retained;
  return 0;
}

CUresult cuModuleLoadDataEx(void **mod, const void *image, unsigned n, int *options, void **values) {
  if (!host()) return UNKNOWN;
  check(pushed > 0, "module load without a current context");
  if (getenv("FAKE_CUDA_JIT_FAIL")) {
    for (unsigned i = 0; i < n; i++)
      if (options[i] == 5) snprintf(values[i], 64, "ptxas fatal   : fake failure\nsecond line");
    return INVALID_PTX;
  }
  check(strstr(image, ".entry") != NULL, "the image is not PTX");
  ptx = image;
  modules++;
  *mod = (void *)&modules;
  return 0;
}

CUresult cuModuleGetFunction(void **f, void *mod, const char *name) {
  if (!host()) return UNKNOWN;
  check(mod == (void *)&modules, "unknown module");
  char entry[256];
  snprintf(entry, sizeof entry, ".entry %s(", name);
  const char *at = strstr(ptx, entry);
  if (!at) return NOT_FOUND;
  *f = (void *)(at + 7);
  return 0;
}

CUresult cuModuleUnload(void *mod) {
  if (!host()) return UNKNOWN;
  check(mod == (void *)&modules && modules > 0, "unload of an unknown module");
  modules--;
  return 0;
}

CUresult cuFuncSetAttribute(void *f, int attrib, int value) {
  (void)f, (void)attrib, (void)value;
  return host() ? 0 : UNKNOWN;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
  if (!host()) return UNKNOWN;
  check(bytes > 0, "zero-byte allocation");
  void *m = calloc(1, bytes);
  if (!m) return 2;
  allocations++;
  *p = (CUdeviceptr)(uintptr_t)m;
  return 0;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
  if (!host()) return UNKNOWN;
  check(allocations > 0, "free without allocation");
  allocations--;
  free((void *)(uintptr_t)p);
  return 0;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, void *s) {
  (void)s;
  if (!host()) return UNKNOWN;
  memcpy((void *)(uintptr_t)dst, src, bytes);
  return 0;
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, void *s) {
  (void)s;
  if (!host()) return UNKNOWN;
  memcpy(dst, (const void *)(uintptr_t)src, bytes);
  return 0;
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, void *s) {
  (void)s;
  if (!host()) return UNKNOWN;
  memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes);
  return 0;
}

CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned value, size_t n, void *s) {
  (void)s;
  if (!host()) return UNKNOWN;
  for (size_t i = 0; i < n; i++) ((unsigned *)(uintptr_t)dst)[i] = value;
  return 0;
}

CUresult cuStreamCreate(void **s, unsigned flags) {
  (void)flags;
  if (!host()) return UNKNOWN;
  streams++;
  *s = (void *)&streams;
  return 0;
}

CUresult cuStreamDestroy_v2(void *s) {
  if (!host()) return UNKNOWN;
  check(s == (void *)&streams && streams > 0, "destroy of an unknown stream");
  streams--;
  return 0;
}

CUresult cuStreamSynchronize(void *s) {
  (void)s;
  return host() ? 0 : UNKNOWN;
}

/* The frame (kiln_gpu_frame): arena, weights, error slot, thread scratch, io[]. */
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void *s, void **params, void **extra) {
  (void)shared, (void)s, (void)extra;
  if (!host()) return UNKNOWN;
  check(pushed > 0, "launch without a current context");
  check(gx && gy && gz && bx && by && bz, "empty launch");
  check(params && params[0], "no kernel parameter");
  void **frame = (void **)(uintptr_t) * (CUdeviceptr *)params[0];
  int32_t *error = frame[2];
  check(error != NULL, "no error slot in the frame");
  const char *fail = getenv("FAKE_CUDA_FAIL");
  if (fail) {
    int k = atoi(fail), code = atoi(strchr(fail, ':') ? strchr(fail, ':') + 1 : "1");
    char name[64];
    int len = snprintf(name, sizeof name, "kiln_k%d(", k);
    if (strncmp(f, name, (size_t)len) == 0 && error[0] == 0) {
      error[0] = k + 1;
      error[1] = code;
    }
  }
  return 0;
}
