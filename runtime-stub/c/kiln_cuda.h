/*
 * kiln CUDA ABI: what a model compiled with `kiln compile --target cuda` carries besides the CPU
 * model descriptor, and what its kernels receive on the device.
 *
 * The host side (cuda.c) loads the CUDA driver at run time (dlopen of libcuda.so.1, the same
 * dynamic loading cudarc does), so an artifact starts on any machine and reports "no CUDA device"
 * where there is none. It loads the embedded PTX once per context, uploads the weights, keeps
 * the arena in device memory and launches the kernel table in order on one stream, recorded
 * once as a CUDA graph and replayed by every later run (kernel by kernel when profiling).
 *
 * The device side (device.c, compiled for nvptx64) holds the runtime functions the kernels call.
 */
#ifndef KILN_CUDA_H
#define KILN_CUDA_H

#include <stdint.h>

/* What every kernel entry receives as its only parameter: a pointer (device memory) to this
   frame, rewritten by the host before each run. Kernels find their tensors at fixed offsets from
   these bases; the offsets are compile-time constants in the PTX. */
typedef struct kiln_gpu_frame {
  char *arena;            /* the context's arena (device memory) */
  const char *weights;    /* the packed weights (device memory) */
  int32_t *error;         /* error[0]: 1 + index of the first kernel that failed, error[1]: its code;
                             then an int64 count per kiln_cuda_desc.counts row (8-byte aligned) */
  char *thread_scratch;   /* per-thread scratch of a library kernel's threads (thread i at
                             i * the model's thread_scratch_bytes rounded up to 64) */
  void *io[];             /* graph inputs, then graph outputs (device pointers) */
} kiln_gpu_frame;

/* Threads of the block a block-parallel library kernel runs on (device.c): the host allocates
   thread scratch for this many. codegen's nvptx/device.rs launches with the same number. */
#define KILN_GPU_LIBRARY_THREADS 128

/* Where a value lives, for the host's copies (kind, index, offset). */
enum kiln_cuda_storage {
  KILN_CUDA_INPUT = 0,    /* graph input `index` */
  KILN_CUDA_OUTPUT = 1,   /* graph output `index` */
  KILN_CUDA_ARENA = 2,    /* arena + offset */
  KILN_CUDA_WEIGHTS = 3,  /* weights + offset */
};

/* One kernel launch, in run order. */
typedef struct kiln_cuda_kernel {
  const char *entry;      /* the PTX entry's name */
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t shared_bytes;  /* dynamic shared memory per block */
  uint32_t reserved;
} kiln_cuda_kernel;

/* A copy into graph output `output` after the kernels (an output that is an input, a constant,
   a view of another value, or listed twice). */
typedef struct kiln_cuda_copy {
  int32_t output;
  int32_t from_kind;      /* enum kiln_cuda_storage */
  int64_t from_index;     /* for INPUT/OUTPUT */
  int64_t from_offset;    /* for ARENA/WEIGHTS */
  int64_t bytes;
} kiln_cuda_copy;

/* A graph output whose extent along `axis` depends on the data (NonZero, NonMaxSuppression,
   Unique, Compress): its kernel writes the count into the int64 at ((int64_t *)error)[1 + row],
   and the host sets kiln_rt_output_dims(ctx, output)[axis] from it after the run. */
typedef struct kiln_cuda_count {
  int32_t output;
  int32_t axis;
} kiln_cuda_count;

/* Device error codes in kiln_gpu_frame.error[1] (the micro-kernels' KILN_UK_E* codes). */
#define KILN_CUDA_EINDEX 1  /* an index read from an input is out of range */
#define KILN_CUDA_EVALUE 2  /* a value read from an input is invalid for the operator */

struct kiln_ctx;
struct kiln_model_desc;

/* kiln_model_desc.cuda of a CUDA model (NULL for a CPU model). */
typedef struct kiln_cuda_desc {
  const char *ptx;        /* NUL-terminated PTX text */
  const char *sm;         /* the architecture the PTX was generated for, e.g. "sm_80" */
  int32_t n_kernels;      /* == kiln_model_desc.n_kernels; the kernel table's rows match */
  int32_t n_copies;
  const kiln_cuda_kernel *kernels;
  const kiln_cuda_copy *copies;
  const void *weights;    /* the packed weights in the artifact (NULL with --weights-out: the
                             mapped file, kiln_rt_weights) */
  int64_t weights_bytes;
  /* cuda.c's entry points, reached through the descriptor so that the generic runtime and the
     executable's main (linked into CPU artifacts too) never reference CUDA code directly. */
  /* Creates a context on `device` (-1: $KILN_CUDA_DEVICE, else 0). NULL on failure, with
     kiln_rt_create_error() set ("no CUDA device: ..." when there is no driver or device). */
  struct kiln_ctx *(*create)(const struct kiln_model_desc *desc, int32_t device, const char *weights_path);
  /* Runs with device pointers on `stream` (a CUstream; NULL: the context's stream), without
     synchronizing. Returns 0 or non-zero after kiln_rt_set_error. */
  int32_t (*run_device)(struct kiln_ctx *ctx, const void *const *inputs, void *const *outputs, void *stream);
  /* Releases the device memory, module and stream (kiln_rt_destroy calls it). */
  void (*destroy)(struct kiln_ctx *ctx);
  int32_t n_counts;       /* rows of `counts` (outputs whose size depends on the data) */
  const kiln_cuda_count *counts;
} kiln_cuda_desc;

/* The run function of a CUDA model (its kiln_model_desc.run): host pointers in and out; copies
   the inputs to the device, launches every kernel, copies the outputs back, synchronizes. */
int32_t kiln_rt_cuda_run(struct kiln_ctx *ctx, const void *const *inputs, void *const *outputs);

/* cuda.c's entry points (kiln_cuda_desc.create / run_device / destroy point at them; the C API
   of a CUDA model calls the first two by name).
   kiln_rt_cuda_run_device synchronizes `stream` before it returns: a kernel's failure (an index
   out of range) is only known from the error slot in device memory, and an error reported by a
   later call would name the wrong run. The inputs must be ready on `stream` (or before the call);
   the outputs are complete when it returns 0. One run per context at a time, as on the CPU. */
struct kiln_ctx *kiln_rt_cuda_create(const struct kiln_model_desc *desc, int32_t device,
                                     const char *weights_path);
int32_t kiln_rt_cuda_run_device(struct kiln_ctx *ctx, const void *const *inputs, void *const *outputs,
                                void *stream);
void kiln_rt_cuda_destroy(struct kiln_ctx *ctx);

/* ---- what runtime.c offers cuda.c (the context struct is private to runtime.c) ----------- */

/* A context without CPU working memory: the description, the mapped weights file (when
   weights_path is given, checked as for the CPU), num_threads for kiln_rt_num_threads. NULL
   with kiln_rt_create_error() set on failure. */
struct kiln_ctx *kiln_rt_ctx_new(const struct kiln_model_desc *desc, int32_t num_threads,
                                 const char *weights_path);
/* Sets what kiln_rt_create_error() returns (printf-style). */
void kiln_rt_set_create_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The context's device state (cuda.c's); kiln_rt_destroy calls desc->cuda->destroy when set. */
void **kiln_rt_device_slot(struct kiln_ctx *ctx);
/* The device a context runs on, for messages: kiln_rt_device returns its index (-1: the CPU)
   and its name. */
void kiln_rt_set_device_name(struct kiln_ctx *ctx, int32_t device, const char *name);
int32_t kiln_rt_device(struct kiln_ctx *ctx, const char **name);

#endif
