/*
 * Host side of CUDA models (see kiln_cuda.h). Linked only into `--target cuda` artifacts; the
 * generic runtime reaches it through kiln_cuda_desc's function pointers.
 *
 * The driver is loaded with dlopen at context creation, so no CUDA library or header is needed
 * to build or link an artifact, and an artifact on a machine without a GPU fails with a one-line
 * "no CUDA device" error instead of a missing-library error from the dynamic linker.
 */
#define _GNU_SOURCE
#include "kiln_cuda.h"
#include "kiln_rt.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the driver API, declared here (no CUDA headers at build time) ------------------------ */

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_NO_DEVICE 100
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
#define CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8
#define CU_JIT_ERROR_LOG_BUFFER 5
#define CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES 6
#define CU_STREAM_NON_BLOCKING 1
/* Only this thread's unsafe calls break a capture (another thread's context use does not). */
#define CU_STREAM_CAPTURE_MODE_THREAD_LOCAL 1
/* Dynamic shared memory above this needs the function attribute set (opt-in). */
#define DEFAULT_SHARED_LIMIT (48 * 1024)

/* name, return, parameters: every function the runtime uses. Versioned names (_v2) are the
   ones cuda.h maps the plain names to; the driver keeps both. */
#define CUDA_FUNCTIONS(X)                                                                          \
  X(cuInit, (unsigned flags))                                                                      \
  X(cuDeviceGetCount, (int *count))                                                                \
  X(cuDeviceGet, (CUdevice * dev, int ordinal))                                                    \
  X(cuDeviceGetName, (char *name, int len, CUdevice dev))                                          \
  X(cuDeviceGetAttribute, (int *value, int attrib, CUdevice dev))                                  \
  X(cuDevicePrimaryCtxRetain, (CUcontext * ctx, CUdevice dev))                                     \
  X(cuDevicePrimaryCtxRelease_v2, (CUdevice dev))                                                  \
  X(cuCtxPushCurrent_v2, (CUcontext ctx))                                                          \
  X(cuCtxPopCurrent_v2, (CUcontext * ctx))                                                         \
  X(cuModuleLoadDataEx, (CUmodule * mod, const void *image, unsigned n, int *options, void **values)) \
  X(cuModuleGetFunction, (CUfunction * f, CUmodule mod, const char *name))                         \
  X(cuModuleUnload, (CUmodule mod))                                                                \
  X(cuFuncSetAttribute, (CUfunction f, int attrib, int value))                                     \
  X(cuMemAlloc_v2, (CUdeviceptr * p, size_t bytes))                                                \
  X(cuMemFree_v2, (CUdeviceptr p))                                                                 \
  X(cuMemcpyHtoDAsync_v2, (CUdeviceptr dst, const void *src, size_t bytes, CUstream s))            \
  X(cuMemcpyDtoHAsync_v2, (void *dst, CUdeviceptr src, size_t bytes, CUstream s))                  \
  X(cuMemcpyDtoDAsync_v2, (CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s))            \
  X(cuMemsetD32Async, (CUdeviceptr dst, unsigned value, size_t n, CUstream s))                     \
  X(cuStreamCreate, (CUstream * s, unsigned flags))                                                \
  X(cuStreamDestroy_v2, (CUstream s))                                                              \
  X(cuStreamSynchronize, (CUstream s))                                                             \
  X(cuLaunchKernel, (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, \
                     unsigned bz, unsigned shared, CUstream s, void **params, void **extra))       \
  X(cuGetErrorString, (CUresult r, const char **str))

/* CUDA graphs (driver API of CUDA 11.4 and later): optional. A driver without them runs every
   kernel as its own launch. */
#define CUDA_GRAPH_FUNCTIONS(X)                                                                    \
  X(cuStreamBeginCapture_v2, (CUstream s, int mode))                                               \
  X(cuStreamEndCapture, (CUstream s, CUgraph * graph))                                             \
  X(cuGraphInstantiateWithFlags, (CUgraphExec * exec, CUgraph graph, unsigned long long flags))    \
  X(cuGraphLaunch, (CUgraphExec exec, CUstream s))                                                 \
  X(cuGraphExecDestroy, (CUgraphExec exec))                                                        \
  X(cuGraphDestroy, (CUgraph graph))

typedef struct cuda_api {
  void *lib;
#define FIELD(name, params) CUresult(*name) params;
  CUDA_FUNCTIONS(FIELD)
  CUDA_GRAPH_FUNCTIONS(FIELD)
#undef FIELD
  int has_graphs; /* every CUDA_GRAPH_FUNCTIONS entry was found */
} cuda_api;

/* ---- the device state of a context -------------------------------------------------------- */

typedef struct cuda_state {
  cuda_api api;
  int device;
  char device_name[128];
  CUdevice dev;
  CUcontext cuctx; /* the device's primary context (retained), NULL until retained */
  CUmodule module;
  CUstream stream;
  CUfunction *functions; /* one per kernel table row */
  CUdeviceptr arena, weights, thread_scratch, error, frame;
  CUdeviceptr *staging; /* inputs then outputs, for the host-pointer run */
  int64_t frame_bytes;
  void **frame_host;    /* what the device frame holds now (io[] valid when frame_valid) */
  int frame_valid;
  /* The error slot as read back: two int32 (the failing kernel, its code), then the counts of
     the outputs whose extent depends on the data (kiln_cuda_desc.counts), an int64 each. */
  int64_t *status_host;
  int64_t status_bytes;
  /* The kernel table as one CUDA graph, captured at the first unprofiled run and replayed by
     every later one. Its launches read only the frame, whose device address never changes, so
     rebinding inputs and outputs (a rewrite of the frame) needs no new graph. */
  CUgraphExec graph;
  enum { GRAPH_UNTRIED, GRAPH_READY, GRAPH_OFF } graph_state;
} cuda_state;

/* What the frame looks like on the host side before it is copied; same layout as kiln_gpu_frame. */
#define FRAME_HEAD 4

/* Where kiln_rt_cuda_create writes why it failed: kiln_rt_create_error's buffer (runtime.c). */
#define create_fail(...) kiln_rt_set_create_error(__VA_ARGS__)

static const char *cu_error(const cuda_api *api, CUresult r) {
  const char *s = NULL;
  if (api->cuGetErrorString && api->cuGetErrorString(r, &s) == CUDA_SUCCESS && s) return s;
  return "unknown CUDA error";
}

/* Loads the driver and every function. Returns 0, or -1 with the create error set. */
static int load_driver(cuda_api *api) {
  const char *path = getenv("KILN_CUDA_DRIVER");
  if (!path || !*path) path = "libcuda.so.1";
  api->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!api->lib) {
    const char *why = dlerror();
    create_fail("no CUDA device: cannot load the CUDA driver %s (%s)", path, why ? why : "not found");
    return -1;
  }
#define LOAD(name, params)                                                                         \
  {                                                                                                \
    void *sym = dlsym(api->lib, #name);                                                            \
    if (!sym) {                                                                                    \
      create_fail("no CUDA device: the CUDA driver %s lacks %s (a driver older than CUDA 11?)",    \
                  path, #name);                                                                    \
      dlclose(api->lib);                                                                           \
      api->lib = NULL;                                                                             \
      return -1;                                                                                   \
    }                                                                                              \
    memcpy(&api->name, &sym, sizeof sym);                                                          \
  }
  CUDA_FUNCTIONS(LOAD)
#undef LOAD
  api->has_graphs = 1;
#define LOAD_OPTIONAL(name, params)                                                                \
  {                                                                                                \
    void *sym = dlsym(api->lib, #name);                                                            \
    if (!sym) api->has_graphs = 0;                                                                 \
    memcpy(&api->name, &sym, sizeof sym);                                                          \
  }
  CUDA_GRAPH_FUNCTIONS(LOAD_OPTIONAL)
#undef LOAD_OPTIONAL
  return 0;
}

static int parse_sm(const char *sm) {
  if (!sm || strncmp(sm, "sm_", 3) != 0) return 0;
  return atoi(sm + 3);
}

static CUresult dev_alloc(cuda_state *s, CUdeviceptr *p, int64_t bytes) {
  *p = 0;
  if (bytes <= 0) return CUDA_SUCCESS;
  return s->api.cuMemAlloc_v2(p, (size_t)bytes);
}

static void dev_free(cuda_state *s, CUdeviceptr *p) {
  if (*p) s->api.cuMemFree_v2(*p);
  *p = 0;
}

static int32_t n_io(const kiln_model_desc *desc) { return desc->n_inputs + desc->n_outputs; }

/* Frees everything the state holds (any subset may be set), then the state. */
static void state_free(const kiln_model_desc *desc, cuda_state *s) {
  if (!s) return;
  if (s->cuctx && s->api.cuCtxPushCurrent_v2(s->cuctx) == CUDA_SUCCESS) {
    if (s->stream) {
      s->api.cuStreamSynchronize(s->stream);
      s->api.cuStreamDestroy_v2(s->stream);
    }
    if (s->graph) s->api.cuGraphExecDestroy(s->graph);
    if (s->staging)
      for (int32_t i = 0; i < n_io(desc); i++) dev_free(s, &s->staging[i]);
    dev_free(s, &s->arena);
    dev_free(s, &s->weights);
    dev_free(s, &s->thread_scratch);
    dev_free(s, &s->error);
    dev_free(s, &s->frame);
    if (s->module) s->api.cuModuleUnload(s->module);
    CUcontext popped;
    s->api.cuCtxPopCurrent_v2(&popped);
  }
  if (s->cuctx) s->api.cuDevicePrimaryCtxRelease_v2(s->dev);
  if (s->api.lib) dlclose(s->api.lib);
  free(s->staging);
  free(s->functions);
  free(s->frame_host);
  free(s->status_host);
  free(s);
}

/* Selects and checks the device, retains its primary context. Returns 0 or -1 (create error). */
static int open_device(cuda_state *s, const kiln_model_desc *desc, int32_t device) {
  cuda_api *api = &s->api;
  CUresult r = api->cuInit(0);
  if (r != CUDA_SUCCESS) {
    create_fail("no CUDA device: the CUDA driver failed to initialize (%s)", cu_error(api, r));
    return -1;
  }
  int count = 0;
  r = api->cuDeviceGetCount(&count);
  if (r != CUDA_SUCCESS) {
    create_fail("no CUDA device: cannot count the CUDA devices (%s)", cu_error(api, r));
    return -1;
  }
  if (count <= 0) {
    create_fail("no CUDA device: the CUDA driver reports no devices");
    return -1;
  }
  if (device < 0) {
    const char *env = getenv("KILN_CUDA_DEVICE");
    device = 0;
    if (env && *env) {
      char *end;
      long v = strtol(env, &end, 10);
      if (*end || v < 0 || v > 1 << 20) {
        create_fail("$KILN_CUDA_DEVICE must be a device number >= 0, got '%s'", env);
        return -1;
      }
      device = (int32_t)v;
    }
  }
  if (device >= count) {
    create_fail("no CUDA device: device %d was asked for, the CUDA driver reports %d device%s (0..%d)",
                device, count, count == 1 ? "" : "s", count - 1);
    return -1;
  }
  s->device = device;
  r = api->cuDeviceGet(&s->dev, device);
  if (r != CUDA_SUCCESS) {
    create_fail("no CUDA device: cannot open CUDA device %d (%s)", device, cu_error(api, r));
    return -1;
  }
  if (api->cuDeviceGetName(s->device_name, (int)sizeof s->device_name, s->dev) != CUDA_SUCCESS)
    snprintf(s->device_name, sizeof s->device_name, "?");
  s->device_name[sizeof s->device_name - 1] = 0;
  int major = 0, minor = 0;
  if ((r = api->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, s->dev)) !=
          CUDA_SUCCESS ||
      (r = api->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, s->dev)) !=
          CUDA_SUCCESS) {
    create_fail("cannot read the compute capability of CUDA device %d (%s): %s", device, s->device_name,
                cu_error(api, r));
    return -1;
  }
  /* PTX runs on its own architecture and newer ones (the driver compiles it), never on older. */
  int want = parse_sm(desc->cuda->sm), have = major * 10 + minor;
  if (want > 0 && have < want) {
    create_fail("CUDA device %d (%s) is sm_%d, older than the %s this model was compiled for "
                "(recompile with --target cuda --sm %d or lower)",
                device, s->device_name, have, desc->cuda->sm, have);
    return -1;
  }
  r = api->cuDevicePrimaryCtxRetain(&s->cuctx, s->dev);
  if (r != CUDA_SUCCESS) {
    s->cuctx = NULL;
    create_fail("cannot create a context on CUDA device %d (%s): %s", device, s->device_name,
                cu_error(api, r));
    return -1;
  }
  return 0;
}

/* Loads the PTX (with the JIT's error log on failure) and finds every entry. */
static int load_module(cuda_state *s, const kiln_model_desc *desc) {
  cuda_api *api = &s->api;
  const kiln_cuda_desc *cd = desc->cuda;
  char log[2048];
  log[0] = 0;
  int options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void *values[] = {log, (void *)(uintptr_t)sizeof log};
  CUresult r = api->cuModuleLoadDataEx(&s->module, cd->ptx, 2, options, values);
  if (r != CUDA_SUCCESS) {
    s->module = NULL;
    log[sizeof log - 1] = 0;
    /* One line: the log's line breaks become "; ". */
    for (char *p = log; *p; p++)
      if (*p == '\n' || *p == '\r') *p = ' ';
    create_fail("cannot load the model's PTX (%s) on CUDA device %d (%s): %s%s%s", cd->sm, s->device,
                s->device_name, cu_error(api, r), log[0] ? ": " : "", log);
    return -1;
  }
  s->functions = calloc((size_t)(cd->n_kernels > 0 ? cd->n_kernels : 1), sizeof *s->functions);
  if (!s->functions) {
    create_fail("out of memory");
    return -1;
  }
  for (int32_t k = 0; k < cd->n_kernels; k++) {
    const kiln_cuda_kernel *kk = &cd->kernels[k];
    r = api->cuModuleGetFunction(&s->functions[k], s->module, kk->entry);
    if (r != CUDA_SUCCESS) {
      create_fail("the model's PTX lacks the kernel entry %s: %s", kk->entry, cu_error(api, r));
      return -1;
    }
    if (kk->shared_bytes > DEFAULT_SHARED_LIMIT) {
      r = api->cuFuncSetAttribute(s->functions[k], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                  (int)kk->shared_bytes);
      if (r != CUDA_SUCCESS) {
        create_fail("kernel %s needs %u bytes of shared memory, more than CUDA device %d (%s) allows: %s",
                    kk->entry, kk->shared_bytes, s->device, s->device_name, cu_error(api, r));
        return -1;
      }
    }
  }
  return 0;
}

/* Device memory, the weights, the stream and the frame. */
static int allocate(cuda_state *s, struct kiln_ctx *ctx, const kiln_model_desc *desc) {
  cuda_api *api = &s->api;
  const kiln_cuda_desc *cd = desc->cuda;
  int32_t n = n_io(desc);
  CUresult r = api->cuStreamCreate(&s->stream, CU_STREAM_NON_BLOCKING);
  if (r != CUDA_SUCCESS) {
    s->stream = NULL;
    create_fail("cannot create a CUDA stream on device %d (%s): %s", s->device, s->device_name,
                cu_error(api, r));
    return -1;
  }
  s->staging = calloc((size_t)(n > 0 ? n : 1), sizeof *s->staging);
  s->frame_bytes = (int64_t)sizeof(void *) * (FRAME_HEAD + n);
  s->frame_host = calloc((size_t)(FRAME_HEAD + n), sizeof(void *));
  if (cd->n_counts < 0 || (cd->n_counts > 0 && !cd->counts)) {
    create_fail("bad model description: %d output counts", cd->n_counts);
    return -1;
  }
  s->status_bytes = (int64_t)sizeof(int64_t) * (1 + cd->n_counts);
  s->status_host = calloc((size_t)(1 + cd->n_counts), sizeof(int64_t));
  if (!s->staging || !s->frame_host || !s->status_host) {
    create_fail("out of memory");
    return -1;
  }
  int64_t scratch = ((desc->thread_scratch_bytes + 63) & ~(int64_t)63) * KILN_GPU_LIBRARY_THREADS;
  struct {
    CUdeviceptr *p;
    int64_t bytes;
    const char *what;
  } want[] = {
      {&s->arena, desc->arena_bytes, "the arena"},
      {&s->weights, cd->weights_bytes, "the weights"},
      {&s->thread_scratch, scratch, "the thread scratch"},
      {&s->error, s->status_bytes, "the error slot"},
      {&s->frame, s->frame_bytes, "the kernel frame"},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    if ((r = dev_alloc(s, want[i].p, want[i].bytes)) != CUDA_SUCCESS) {
      create_fail("cannot allocate %lld bytes for %s on CUDA device %d (%s): %s", (long long)want[i].bytes,
                  want[i].what, s->device, s->device_name, cu_error(api, r));
      return -1;
    }
  }
  for (int32_t i = 0; i < n; i++) {
    const kiln_io_desc *io = i < desc->n_inputs ? &desc->inputs[i] : &desc->outputs[i - desc->n_inputs];
    /* Zero-size tensors still get a distinct pointer. */
    if ((r = dev_alloc(s, &s->staging[i], io->bytes > 0 ? io->bytes : 256)) != CUDA_SUCCESS) {
      create_fail("cannot allocate %lld bytes for %s '%s' on CUDA device %d (%s): %s", (long long)io->bytes,
                  i < desc->n_inputs ? "input" : "output", io->name, s->device, s->device_name,
                  cu_error(api, r));
      return -1;
    }
  }
  const void *blob = cd->weights ? cd->weights : kiln_rt_weights(ctx);
  if (cd->weights_bytes > 0) {
    if (!blob) {
      create_fail("bad model description: no weights");
      return -1;
    }
    if ((r = api->cuMemcpyHtoDAsync_v2(s->weights, blob, (size_t)cd->weights_bytes, s->stream)) !=
            CUDA_SUCCESS ||
        (r = api->cuStreamSynchronize(s->stream)) != CUDA_SUCCESS) {
      create_fail("cannot copy the weights (%lld bytes) to CUDA device %d (%s): %s",
                  (long long)cd->weights_bytes, s->device, s->device_name, cu_error(api, r));
      return -1;
    }
  }
  return 0;
}

/* $KILN_CUDA_GRAPH=0 launches every kernel on its own (to compare, or to rule graphs out). */
static int graphs_wanted(void) {
  const char *v = getenv("KILN_CUDA_GRAPH");
  return !(v && strcmp(v, "0") == 0);
}

struct kiln_ctx *kiln_rt_cuda_create(const struct kiln_model_desc *desc, int32_t device,
                                     const char *weights_path) {
  if (!desc || !desc->cuda) {
    kiln_rt_set_create_error("no CUDA model description");
    return NULL;
  }
  struct kiln_ctx *ctx = kiln_rt_ctx_new(desc, 1, weights_path);
  if (!ctx) return NULL;
  cuda_state *s = calloc(1, sizeof *s);
  if (!s) {
    create_fail("out of memory");
    kiln_rt_destroy(ctx);
    return NULL;
  }
  if (load_driver(&s->api) != 0 || open_device(s, desc, device) != 0) {
    state_free(desc, s);
    kiln_rt_destroy(ctx);
    return NULL;
  }
  CUresult r = s->api.cuCtxPushCurrent_v2(s->cuctx);
  if (r != CUDA_SUCCESS) {
    create_fail("cannot use the context of CUDA device %d (%s): %s", s->device, s->device_name,
                cu_error(&s->api, r));
    state_free(desc, s);
    kiln_rt_destroy(ctx);
    return NULL;
  }
  int ok = load_module(s, desc) == 0 && allocate(s, ctx, desc) == 0;
  CUcontext popped;
  s->api.cuCtxPopCurrent_v2(&popped);
  if (!ok) {
    state_free(desc, s);
    kiln_rt_destroy(ctx);
    return NULL;
  }
  s->graph_state = s->api.has_graphs && graphs_wanted() ? GRAPH_UNTRIED : GRAPH_OFF;
  *kiln_rt_device_slot(ctx) = s;
  kiln_rt_set_device_name(ctx, s->device, s->device_name);
  return ctx;
}

void kiln_rt_cuda_destroy(struct kiln_ctx *ctx) {
  void **slot = kiln_rt_device_slot(ctx);
  state_free(kiln_rt_desc(ctx), *slot);
  *slot = NULL;
}

/* ---- running ------------------------------------------------------------------------------ */

/* Records a driver failure; returns 1. */
static int32_t fail(struct kiln_ctx *ctx, cuda_state *s, CUresult r, const char *fmt, ...) {
  char what[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  kiln_rt_set_error(ctx, "%s on CUDA device %d (%s) failed: %s", what, s->device, s->device_name,
                    cu_error(&s->api, r));
  return 1;
}

static const char *device_error_text(int32_t code) {
  switch (code) {
  case KILN_CUDA_EINDEX:
    return "an index read from an input is out of range";
  case KILN_CUDA_EVALUE:
    return "a value read from an input is invalid for the operator";
  default:
    return "the kernel reported an unknown failure";
  }
}

/* Launches kernel table row k on `stream`; its one parameter is the frame's device address. */
static CUresult launch_kernel(cuda_state *s, const kiln_cuda_desc *cd, int32_t k, CUstream stream) {
  const kiln_cuda_kernel *kk = &cd->kernels[k];
  void *params[] = {&s->frame};
  return s->api.cuLaunchKernel(s->functions[k], kk->grid[0], kk->grid[1], kk->grid[2], kk->block[0],
                               kk->block[1], kk->block[2], kk->shared_bytes, stream, params, NULL);
}

/* What one run executes on the device: clearing the error slot, then every kernel in table
   order. On failure *failed is the kernel that could not be launched (-1: the clear). */
static CUresult enqueue_kernels(cuda_state *s, const kiln_model_desc *desc, CUstream stream, int32_t *failed) {
  CUresult r = s->api.cuMemsetD32Async(s->error, 0, 2, stream);
  if (r != CUDA_SUCCESS) return r;
  for (int32_t k = 0; k < desc->cuda->n_kernels; k++)
    if ((r = launch_kernel(s, desc->cuda, k, stream)) != CUDA_SUCCESS) {
      *failed = k;
      return r;
    }
  return CUDA_SUCCESS;
}

/* Records enqueue_kernels once as a CUDA graph on the context's own stream (recording runs
   nothing) and instantiates it: a run is then one cuGraphLaunch instead of a launch per kernel,
   the driver's per-launch cost paid once. Any failure leaves graphs off for this context and
   runs keep launching kernel by kernel, with the same results. */
static void capture_graph(cuda_state *s, const kiln_model_desc *desc) {
  cuda_api *api = &s->api;
  s->graph_state = GRAPH_OFF;
  if (api->cuStreamBeginCapture_v2(s->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) != CUDA_SUCCESS) return;
  int32_t failed = -1;
  CUresult launched = enqueue_kernels(s, desc, s->stream, &failed);
  CUgraph graph = NULL;
  CUresult ended = api->cuStreamEndCapture(s->stream, &graph);
  if (launched == CUDA_SUCCESS && ended == CUDA_SUCCESS && graph &&
      api->cuGraphInstantiateWithFlags(&s->graph, graph, 0) == CUDA_SUCCESS)
    s->graph_state = GRAPH_READY;
  else
    s->graph = NULL;
  if (graph) api->cuGraphDestroy(graph);
}

/* Everything between writing the inputs and reading the outputs: the frame, the kernels, the
   output copies. io: the device pointers of the inputs then outputs. */
static int32_t launch_all(struct kiln_ctx *ctx, cuda_state *s, const CUdeviceptr *io, CUstream stream) {
  const kiln_model_desc *desc = kiln_rt_desc(ctx);
  const kiln_cuda_desc *cd = desc->cuda;
  cuda_api *api = &s->api;
  int32_t n = n_io(desc);
  CUresult r;
  /* The frame is device memory: rewritten only when the tensors moved (the host-pointer run's
     staging buffers never do). */
  int changed = !s->frame_valid;
  void *head[FRAME_HEAD] = {(void *)(uintptr_t)s->arena, (void *)(uintptr_t)s->weights,
                            (void *)(uintptr_t)s->error, (void *)(uintptr_t)s->thread_scratch};
  for (int i = 0; i < FRAME_HEAD; i++) {
    changed |= s->frame_host[i] != head[i];
    s->frame_host[i] = head[i];
  }
  for (int32_t i = 0; i < n; i++) {
    void *p = (void *)(uintptr_t)io[i];
    changed |= s->frame_host[FRAME_HEAD + i] != p;
    s->frame_host[FRAME_HEAD + i] = p;
  }
  if (changed) {
    s->frame_valid = 0;
    if ((r = api->cuMemcpyHtoDAsync_v2(s->frame, s->frame_host, (size_t)s->frame_bytes, stream)) != CUDA_SUCCESS)
      return fail(ctx, s, r, "writing the kernel frame");
    s->frame_valid = 1;
  }
  kiln_prof *prof = kiln_rt_prof_run_begin(ctx);
  if (prof) {
    /* Profiled runs time each kernel alone, launched one by one. */
    if ((r = api->cuMemsetD32Async(s->error, 0, 2, stream)) != CUDA_SUCCESS)
      return fail(ctx, s, r, "clearing the error slot");
    for (int32_t k = 0; k < cd->n_kernels; k++) {
      if ((r = api->cuStreamSynchronize(stream)) != CUDA_SUCCESS)
        return fail(ctx, s, r, "waiting for the stream before kernel %d", k);
      kiln_rt_prof_kernel_begin(prof);
      if ((r = launch_kernel(s, cd, k, stream)) != CUDA_SUCCESS)
        return fail(ctx, s, r, "launching kernel %d (%s)", k, cd->kernels[k].entry);
      if ((r = api->cuStreamSynchronize(stream)) != CUDA_SUCCESS)
        return fail(ctx, s, r, "running kernel %d (%s)", k, cd->kernels[k].entry);
      kiln_rt_prof_kernel_end(prof, k);
    }
    kiln_rt_prof_run_end(prof);
  } else {
    if (s->graph_state == GRAPH_UNTRIED) capture_graph(s, desc);
    if (s->graph_state == GRAPH_READY) {
      if ((r = api->cuGraphLaunch(s->graph, stream)) != CUDA_SUCCESS)
        return fail(ctx, s, r, "launching the model's CUDA graph");
    } else {
      int32_t failed = -1;
      if ((r = enqueue_kernels(s, desc, stream, &failed)) != CUDA_SUCCESS)
        return failed < 0 ? fail(ctx, s, r, "clearing the error slot")
                          : fail(ctx, s, r, "launching kernel %d (%s)", failed, cd->kernels[failed].entry);
    }
  }
  for (int32_t c = 0; c < cd->n_copies; c++) {
    const kiln_cuda_copy *cp = &cd->copies[c];
    if (cp->bytes <= 0) continue;
    CUdeviceptr src = 0;
    switch (cp->from_kind) {
    case KILN_CUDA_INPUT:
      if (cp->from_index >= 0 && cp->from_index < desc->n_inputs) src = io[cp->from_index];
      break;
    case KILN_CUDA_OUTPUT:
      if (cp->from_index >= 0 && cp->from_index < desc->n_outputs) src = io[desc->n_inputs + cp->from_index];
      break;
    case KILN_CUDA_ARENA:
      src = s->arena + (CUdeviceptr)cp->from_offset;
      break;
    case KILN_CUDA_WEIGHTS:
      src = s->weights + (CUdeviceptr)cp->from_offset;
      break;
    }
    if (!src || cp->output < 0 || cp->output >= desc->n_outputs) {
      kiln_rt_set_error(ctx, "bad model description: output copy %d", c);
      return 1;
    }
    r = api->cuMemcpyDtoDAsync_v2(io[desc->n_inputs + cp->output], src, (size_t)cp->bytes, stream);
    if (r != CUDA_SUCCESS)
      return fail(ctx, s, r, "copying into output '%s'", desc->outputs[cp->output].name);
  }
  return 0;
}

/* Reads the error slot (after the stream drained) and turns a device failure into the error;
   after a clean run, sets the dims of the outputs whose extent depends on the data from the
   counts that their kernels wrote after the slot. */
static int32_t check_device_error(struct kiln_ctx *ctx, cuda_state *s, CUstream stream) {
  const kiln_model_desc *desc = kiln_rt_desc(ctx);
  const kiln_cuda_desc *cd = desc->cuda;
  CUresult r = s->api.cuMemcpyDtoHAsync_v2(s->status_host, s->error, (size_t)s->status_bytes, stream);
  if (r != CUDA_SUCCESS) return fail(ctx, s, r, "reading the error slot");
  if ((r = s->api.cuStreamSynchronize(stream)) != CUDA_SUCCESS) return fail(ctx, s, r, "running the model");
  int32_t error[2];
  memcpy(error, s->status_host, sizeof error);
  if (error[0] == 0) {
    for (int32_t c = 0; c < cd->n_counts; c++) {
      const kiln_cuda_count *count = &cd->counts[c];
      int64_t *dims = kiln_rt_output_dims(ctx, count->output);
      int64_t n = s->status_host[1 + c];
      /* The kernel writes at most the bound (the static dim); anything else is not a count. */
      if (!dims || count->axis < 0 || count->axis >= desc->outputs[count->output].rank || n < 0 ||
          n > desc->outputs[count->output].dims[count->axis]) {
        kiln_rt_set_error(ctx, "bad count %lld for output %d on the device", (long long)n, count->output);
        return 1;
      }
      dims[count->axis] = n;
    }
    return 0;
  }
  int32_t k = error[0] - 1;
  const char *node = "?", *op = "?";
  if (k >= 0 && k < desc->n_kernels && desc->kernels) {
    node = desc->kernels[k].name;
    op = desc->kernels[k].op;
  } else if (k >= 0 && k < cd->n_kernels) {
    node = cd->kernels[k].entry;
  }
  kiln_rt_set_error(ctx, "kernel %d (node '%s', op %s) failed on the device: %s", k, node, op,
                    device_error_text(error[1]));
  return 1;
}

/* Makes the context's CUDA context current on this thread for one call. */
static int32_t enter(struct kiln_ctx *ctx, cuda_state **out) {
  cuda_state *s = ctx ? *kiln_rt_device_slot(ctx) : NULL;
  if (!s) {
    if (ctx) kiln_rt_set_error(ctx, "this context has no CUDA device");
    return 1;
  }
  CUresult r = s->api.cuCtxPushCurrent_v2(s->cuctx);
  if (r != CUDA_SUCCESS) return fail(ctx, s, r, "making the context current");
  *out = s;
  return 0;
}

static void leave(cuda_state *s) {
  CUcontext popped;
  s->api.cuCtxPopCurrent_v2(&popped);
}

int32_t kiln_rt_cuda_run(struct kiln_ctx *ctx, const void *const *inputs, void *const *outputs) {
  cuda_state *s;
  if (enter(ctx, &s) != 0) return 1;
  const kiln_model_desc *desc = kiln_rt_desc(ctx);
  CUstream stream = s->stream;
  int32_t rc = 0;
  CUresult r;
  for (int32_t i = 0; i < desc->n_inputs && rc == 0; i++) {
    if (desc->inputs[i].bytes <= 0) continue;
    r = s->api.cuMemcpyHtoDAsync_v2(s->staging[i], inputs[i], (size_t)desc->inputs[i].bytes, stream);
    if (r != CUDA_SUCCESS) rc = fail(ctx, s, r, "copying input '%s' to the device", desc->inputs[i].name);
  }
  if (rc == 0) rc = launch_all(ctx, s, s->staging, stream);
  for (int32_t i = 0; i < desc->n_outputs && rc == 0; i++) {
    if (desc->outputs[i].bytes <= 0) continue;
    r = s->api.cuMemcpyDtoHAsync_v2(outputs[i], s->staging[desc->n_inputs + i], (size_t)desc->outputs[i].bytes,
                                    stream);
    if (r != CUDA_SUCCESS) rc = fail(ctx, s, r, "copying output '%s' from the device", desc->outputs[i].name);
  }
  if (rc == 0) rc = check_device_error(ctx, s, stream);
  /* After a failure the stream may still hold work that reads the staging buffers. */
  if (rc != 0) s->api.cuStreamSynchronize(stream);
  leave(s);
  return rc;
}

int32_t kiln_rt_cuda_run_device(struct kiln_ctx *ctx, const void *const *inputs, void *const *outputs,
                                void *stream_arg) {
  cuda_state *s;
  if (enter(ctx, &s) != 0) return 1;
  const kiln_model_desc *desc = kiln_rt_desc(ctx);
  CUstream stream = stream_arg ? (CUstream)stream_arg : s->stream;
  int32_t n = n_io(desc), rc = 0;
  CUdeviceptr local[16];
  CUdeviceptr *io = n <= 16 ? local : malloc((size_t)n * sizeof *io);
  if (!io) {
    kiln_rt_set_error(ctx, "out of memory");
    leave(s);
    return 1;
  }
  for (int32_t i = 0; i < n; i++) {
    const void *p = i < desc->n_inputs ? inputs[i] : outputs[i - desc->n_inputs];
    io[i] = (CUdeviceptr)(uintptr_t)p;
  }
  rc = launch_all(ctx, s, io, stream);
  if (rc == 0) rc = check_device_error(ctx, s, stream);
  if (rc != 0) s->api.cuStreamSynchronize(stream);
  if (io != local) free(io);
  leave(s);
  return rc;
}
