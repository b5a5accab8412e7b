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
 * $FAKE_CUDA_JIT_FAIL makes loading the PTX fail with a JIT log, $FAKE_CUDA_FAIL=K:CODE
 * makes the kernel entry kiln_kK report CODE in the frame's error slot, and
 * $FAKE_CUDA_COUNTS=N0,N1,... makes every kernel write those counts after the error slot, as
 * the kernels of outputs whose size depends on the data do (one per such output; the test
 * gives exactly as many as the model has).
 *
 * Stream capture and CUDA graphs are emulated: while a stream captures, memsets and launches
 * are recorded instead of run, and a graph launch runs the recording. $FAKE_CUDA_NO_GRAPHS=1
 * makes the capture fail (a driver whose graphs do not work). $FAKE_CUDA_STATS=FILE appends
 * one line per released context: "launches L graph_launches G captures C captured_launches K"
 * (L counts kernels launched outside graphs).
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
static long launches, graph_launches, captures, captured_launches, graphs, graph_execs;
static const char *ptx;

/* A recorded memset (f == NULL) or kernel launch. */
typedef struct op {
  void *f;
  CUdeviceptr frame_or_dst;
  unsigned value;
  size_t n;
} op;

typedef struct recording {
  op *ops;
  size_t n, cap;
} recording;

static void *capturing;      /* the stream being captured, or NULL */
static recording *capture;   /* what it has recorded */

static void write_stats(void) {
  const char *path = getenv("FAKE_CUDA_STATS");
  if (!path) return;
  FILE *f = fopen(path, "a");
  if (!f) return;
  fprintf(f, "launches %ld graph_launches %ld captures %ld captured_launches %ld\n", launches, graph_launches,
          captures, captured_launches);
  fclose(f);
}

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
    write_stats();
    check(capturing == NULL, "a stream left capturing");
    check(graphs == 0, "a graph left undestroyed");
    check(graph_execs == 0, "an instantiated graph left undestroyed");
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
  check(strstr(image, ".target sm_") != NULL, "the image is not PTX");
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

static void record(op o) {
  if (capture->n == capture->cap) {
    capture->cap = capture->cap ? 2 * capture->cap : 16;
    capture->ops = realloc(capture->ops, capture->cap * sizeof *capture->ops);
    check(capture->ops != NULL, "out of memory");
  }
  capture->ops[capture->n++] = o;
}

static void memset32(CUdeviceptr dst, unsigned value, size_t n) {
  for (size_t i = 0; i < n; i++) ((unsigned *)(uintptr_t)dst)[i] = value;
}

CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned value, size_t n, void *s) {
  if (!host()) return UNKNOWN;
  if (s && s == capturing) record((op){NULL, dst, value, n});
  else memset32(dst, value, n);
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
  if (!host()) return UNKNOWN;
  check(capturing == NULL || s != capturing, "synchronizing a capturing stream");
  return 0;
}

/* What a kernel does here: check its frame (kiln_gpu_frame: arena, weights, error slot,
   thread scratch, io[]) and report $FAKE_CUDA_FAIL's error. */
static void run_kernel(const char *f, CUdeviceptr frame_address) {
  void **frame = (void **)(uintptr_t)frame_address;
  int32_t *error = frame[2];
  check(error != NULL, "no error slot in the frame");
  const char *counts = getenv("FAKE_CUDA_COUNTS");
  for (int i = 0; counts && *counts; i++) {
    char *end;
    ((int64_t *)(void *)error)[1 + i] = strtoll(counts, &end, 10);
    counts = *end == ',' ? end + 1 : end;
  }
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
}

CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void *s, void **params, void **extra) {
  (void)shared, (void)extra;
  if (!host()) return UNKNOWN;
  check(pushed > 0, "launch without a current context");
  check(gx && gy && gz && bx && by && bz, "empty launch");
  check(params && params[0], "no kernel parameter");
  /* The driver copies the parameters at the launch (or the capture): so does the fake. */
  CUdeviceptr frame = *(CUdeviceptr *)params[0];
  if (s && s == capturing) {
    captured_launches++;
    record((op){f, frame, 0, 0});
    return 0;
  }
  launches++;
  run_kernel(f, frame);
  return 0;
}

CUresult cuStreamBeginCapture_v2(void *s, int mode) {
  if (!host()) return UNKNOWN;
  check(mode == 1, "capture not in thread-local mode");
  check(capturing == NULL, "nested capture");
  check(s == (void *)&streams, "capture of an unknown stream");
  if (getenv("FAKE_CUDA_NO_GRAPHS")) return UNKNOWN;
  capturing = s;
  capture = calloc(1, sizeof *capture);
  check(capture != NULL, "out of memory");
  captures++;
  return 0;
}

CUresult cuStreamEndCapture(void *s, void **graph) {
  if (!host()) return UNKNOWN;
  check(s != NULL && s == capturing, "end of a capture that was not begun");
  capturing = NULL;
  *graph = capture;
  capture = NULL;
  graphs++;
  return 0;
}

CUresult cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags) {
  check(flags == 0, "unexpected instantiation flags");
  recording *from = graph, *copy = calloc(1, sizeof *copy);
  check(copy != NULL, "out of memory");
  copy->n = copy->cap = from->n;
  copy->ops = malloc((from->n ? from->n : 1) * sizeof *copy->ops);
  check(copy->ops != NULL, "out of memory");
  if (from->n) memcpy(copy->ops, from->ops, from->n * sizeof *copy->ops);
  graph_execs++;
  *exec = copy;
  return 0;
}

CUresult cuGraphLaunch(void *exec, void *s) {
  (void)s;
  check(pushed > 0, "graph launch without a current context");
  recording *r = exec;
  graph_launches++;
  for (size_t i = 0; i < r->n; i++) {
    if (r->ops[i].f) run_kernel(r->ops[i].f, r->ops[i].frame_or_dst);
    else memset32(r->ops[i].frame_or_dst, r->ops[i].value, r->ops[i].n);
  }
  return 0;
}

static void free_recording(recording *r) {
  free(r->ops);
  free(r);
}

CUresult cuGraphDestroy(void *graph) {
  check(graphs > 0, "destroy of an unknown graph");
  graphs--;
  free_recording(graph);
  return 0;
}

CUresult cuGraphExecDestroy(void *exec) {
  check(graph_execs > 0, "destroy of an unknown graph instance");
  graph_execs--;
  free_recording(exec);
  return 0;
}
