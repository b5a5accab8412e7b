/* kiln runtime core: contexts, errors, the CPU feature check, the thread pool. See kiln_rt.h. */
#define _GNU_SOURCE
#include "kiln_cuda.h"
#include "kiln_rt.h"
#include "kiln_weights.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#elif defined(__aarch64__)
#include <sys/auxv.h>
#endif

#define KILN_MAX_THREADS 256
/* How long an idle worker (and a caller waiting for stragglers) spins before sleeping. A model
   runs ~50-300 kernels back to back; the gaps between them are far shorter than this, so
   workers stay awake for the whole run and a sleep/wake (tens of µs each) is paid once. */
#define KILN_SPIN_NS 100000

/* Why the last call on this thread that had no context to hold its error failed: a
   kiln_rt_create, or an API call given a NULL context. The only mutable global; thread-local so
   that threads creating contexts at once each read their own. Long enough for a weights file
   path and two hashes. */
static _Thread_local char create_error[1024];

typedef struct kiln_pool kiln_pool;

struct kiln_ctx {
  const kiln_model_desc *desc;
  void *arena;
  void *thread_scratch;
  int64_t num_threads;
  kiln_pool *pool; /* NULL when single-threaded */
  char error[512];
  kiln_prof *prof; /* per-kernel timing (profile.c); NULL until profiling is turned on */
  kiln_weights_map weights; /* the mapped weights file (--weights-out builds) */
  void *device;             /* a CUDA model's device state (cuda.c), NULL for a CPU model */
  int32_t device_index;
  char device_name[128];
  /* The shapes of the graph outputs after the last run (kiln_rt_output_dims): the static dims,
     whose data-dependent extent the run overwrites with the actual count. out_dims[out_at[i]..] holds
     output i's rank entries. */
  int64_t *out_dims;
  int64_t *out_at;
  /* A batch-range model's per-sample input and output pointers (kiln_rt_run_batch), made
     at creation so that a run allocates nothing. */
  const void **sample_in;
  void **sample_out;
};

/* ---- CPU features ------------------------------------------------------------------------ */

#if defined(__x86_64__) || defined(__i386__)
/* 1: present, 0: absent, -1: a name this check does not know (skipped). Also used by
   cpu_dispatch.c to choose a portable artifact's variant. */
int kiln_rt_x86_has(const char *name) {
  unsigned a, b, c, d;
  unsigned l1c = 0, l7b = 0, l7c = 0, l71a = 0, max = __get_cpuid_max(0, NULL);
  if (max >= 1 && __get_cpuid(1, &a, &b, &c, &d)) l1c = c;
  if (max >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    l7b = b;
    l7c = c;
    if (a >= 1) {
      __cpuid_count(7, 1, a, b, c, d);
      l71a = a;
    }
  }
  /* The instructions also need the OS to save the wider registers (XCR0). */
  unsigned long long xcr0 = 0;
  if (l1c & (1u << 27)) { /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = ((unsigned long long)hi << 32) | lo;
  }
  int avx_os = (xcr0 & 0x6) == 0x6;
  int avx512_os = avx_os && (xcr0 & 0xe0) == 0xe0;
  static const struct {
    const char *name;
    int reg; /* 1: leaf 1 ecx, 7: leaf 7.0 ebx, 70: leaf 7.0 ecx, 71: leaf 7.1 eax */
    int bit;
    int needs; /* 0: nothing, 1: AVX state, 2: AVX-512 state */
  } table[] = {
      {"sse3", 1, 0, 0},       {"ssse3", 1, 9, 0},       {"sse4.1", 1, 19, 0},
      {"sse4.2", 1, 20, 0},    {"popcnt", 1, 23, 0},     {"avx", 1, 28, 1},
      {"fma", 1, 12, 1},       {"f16c", 1, 29, 1},       {"bmi", 7, 3, 0},
      {"avx2", 7, 5, 1},       {"bmi2", 7, 8, 0},        {"avx512f", 7, 16, 2},
      {"avx512dq", 7, 17, 2},  {"avx512ifma", 7, 21, 2}, {"avx512cd", 7, 28, 2},
      {"avx512bw", 7, 30, 2},  {"avx512vl", 7, 31, 2},   {"avx512bf16", 71, 5, 2},
      {"avxvnni", 71, 4, 1},   {"avx512vnni", 70, 11, 2},
  };
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    if (strcmp(table[i].name, name) != 0) continue;
    unsigned reg = table[i].reg == 1   ? l1c
                   : table[i].reg == 7  ? l7b
                   : table[i].reg == 70 ? l7c
                                        : l71a;
    if (!(reg & (1u << table[i].bit))) return 0;
    if (table[i].needs == 1 && !avx_os) return 0;
    if (table[i].needs == 2 && !avx512_os) return 0;
    return 1;
  }
  return -1;
}
#endif

#if defined(__aarch64__)
/* 1: present, 0: absent, -1: a name this check does not know (skipped): the kernel's HWCAP
   bits (Linux). */
static int arm_has(const char *name) {
  unsigned long hwcap = getauxval(AT_HWCAP);
  if (strcmp(name, "dotprod") == 0) return (hwcap & (1ul << 20)) != 0; /* HWCAP_ASIMDDP */
  if (strcmp(name, "neon") == 0) return (hwcap & (1ul << 1)) != 0;     /* HWCAP_ASIMD */
  return -1;
}
#endif

/* Checks every feature of the comma-separated list (entries may carry LLVM's '+'; '-' entries
   are features the code avoids, so nothing to check). Returns 0, or -1 with create_error set. */
static int check_cpu_features(const char *list) {
  if (!list) return 0;
  const char *p = list;
  while (*p) {
    while (*p == ',' || *p == ' ') p++;
    const char *start = p;
    while (*p && *p != ',') p++;
    size_t len = (size_t)(p - start);
    while (len > 0 && start[len - 1] == ' ') len--;
    if (len == 0) continue;
    if (start[0] == '-') continue;
    if (start[0] == '+') {
      start++;
      len--;
    }
    char name[64];
    if (len == 0 || len >= sizeof name) continue;
    memcpy(name, start, len);
    name[len] = 0;
#if defined(__x86_64__) || defined(__i386__)
    int has = kiln_rt_x86_has(name);
#elif defined(__aarch64__)
    int has = arm_has(name);
#else
    int has = -1;
#endif
    if (has == 0) {
      snprintf(create_error, sizeof create_error,
               "this program was compiled for a CPU with %s, which this CPU lacks (compile with "
               "--cpu for this machine, e.g. --cpu native, or an older CPU)",
               name);
      return -1;
    }
  }
  return 0;
}

/* ---- thread pool ------------------------------------------------------------------------- */

/* One job at a time. `state` holds the job's sequence number (high 32 bits), whether it is open
   for joining (JOB_OPEN) and how many workers are inside it (low bits). The caller publishes
   fn/data/n and a new open sequence number; an idle worker joins with a CAS while the job is
   open, claims indices from `next`, and leaves. When the caller runs out of indices it closes
   the job and waits only for the workers inside it: a worker that was descheduled or asleep and
   never joined costs the caller nothing, and no worker reads fn/data/n after the caller returns. */
#define JOB_OPEN (1ull << 31)
#define JOB_ACTIVE (JOB_OPEN - 1)

/* The indices [next, end) of one thread's share of a job; `next` is claimed atomically, by
   the owner and, once their own shares are done, by the others. */
typedef struct {
  _Alignas(64) int64_t next; /* atomic */
  int64_t end;
} kiln_range;

struct kiln_pool {
  kiln_ctx *ctx;
  int nworkers;
  int started;
  pthread_t threads[KILN_MAX_THREADS];

  kiln_task_fn fn;
  void *data;
  /* Each hot atomic on its own cache line: each thread claims from its own range while the
     others poll `state`. */
  kiln_range *ranges;           /* one per thread (the caller's is 0), nworkers + 1 */
  _Alignas(64) uint64_t state;  /* atomic */
  _Alignas(64) unsigned seq;    /* the caller's last sequence number (caller only) */
  int stop;                     /* atomic */

  /* Sleeping: workers wait on `wake` for a new sequence number, the caller on `done`. */
  pthread_mutex_t mu;
  pthread_cond_t wake;
  pthread_cond_t done;
  int sleeping_workers; /* atomic */
  int caller_sleeping;  /* atomic */
};

typedef struct {
  kiln_pool *pool;
  int64_t tid;
} kiln_worker_arg;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}

/* One step of a spin-wait. After KILN_PURE_SPIN_NS of pure spinning, yield as well: when there
   are more runnable threads than cores (other processes, or --threads above the core count), the
   thread being waited for may need this core. Kernels usually follow each other within a few
   µs, so the pure spin catches them without a system call. */
#define KILN_PURE_SPIN_NS 20000
static inline void spin_step(int yielding) {
  cpu_relax();
  if (yielding) sched_yield();
}

static inline int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline unsigned state_seq(uint64_t s) { return (unsigned)(s >> 32); }

/* Runs the indices of range `r` that this thread can claim, `run` at a time at most (at least
   one, and never more than half of what is left). */
static void drain(kiln_pool *p, kiln_range *r, int64_t tid, int64_t run) {
  kiln_task_fn fn = p->fn;
  void *data = p->data;
  for (;;) {
    int64_t left = r->end - __atomic_load_n(&r->next, __ATOMIC_RELAXED);
    if (left <= 0) return;
    int64_t take = left / 2 < run ? left / 2 : run;
    if (take < 1) take = 1;
    int64_t i = __atomic_fetch_add(&r->next, take, __ATOMIC_RELAXED);
    int64_t end = i + take < r->end ? i + take : r->end;
    for (; i < end; i++) fn(data, i, tid);
  }
}

/* Each thread owns a contiguous share of the indices (thread t: [t·n/T, (t+1)·n/T)) and runs it
   first, one index per claim on a counter no other thread touches until it is done with its own
   share; then it takes what is left of the others' shares, in runs of at most half of it.
   Claims on a shared counter move its cache line between cores (~90 ns on one CCD, ~400 ns
   across CCDs, where a host may place two vCPUs: one claim per index on one counter made a
   depthwise convolution's 112 row tasks pay that 112 times), and contiguous shares give the
   same rows to the same thread from one kernel to the next, so an activation a thread wrote
   stays in its core's caches for the next kernel's tasks over the same rows. */
static void run_indices(kiln_pool *p, int64_t tid) {
  int64_t threads = (int64_t)p->nworkers + 1;
  drain(p, &p->ranges[tid], tid, 1);
  for (int64_t k = 1; k < threads; k++) drain(p, &p->ranges[(tid + k) % threads], tid, INT64_MAX);
}

/* Joins job `seq` if it is still open; returns whether it did. */
static int try_join(kiln_pool *p, unsigned seq) {
  uint64_t s = __atomic_load_n(&p->state, __ATOMIC_ACQUIRE);
  while (state_seq(s) == seq && (s & JOB_OPEN)) {
    if (__atomic_compare_exchange_n(&p->state, &s, s + 1, 1, __ATOMIC_ACQUIRE, __ATOMIC_ACQUIRE))
      return 1;
  }
  return 0;
}

static void leave(kiln_pool *p) {
  uint64_t s = __atomic_sub_fetch(&p->state, 1, __ATOMIC_SEQ_CST);
  if ((s & JOB_ACTIVE) == 0 && !(s & JOB_OPEN) && __atomic_load_n(&p->caller_sleeping, __ATOMIC_SEQ_CST)) {
    pthread_mutex_lock(&p->mu);
    pthread_cond_signal(&p->done);
    pthread_mutex_unlock(&p->mu);
  }
}

static void *worker_main(void *argp) {
  kiln_worker_arg *arg = argp;
  kiln_pool *p = arg->pool;
  int64_t tid = arg->tid;
  unsigned seen = 0;
  for (;;) {
    unsigned g = state_seq(__atomic_load_n(&p->state, __ATOMIC_ACQUIRE));
    if (g == seen) {
      int64_t start = now_ns(), t = start;
      for (unsigned k = 1;; k++) {
        spin_step(t - start > KILN_PURE_SPIN_NS);
        g = state_seq(__atomic_load_n(&p->state, __ATOMIC_ACQUIRE));
        if (g != seen) break;
        if ((k & 63) == 0 && (t = now_ns()) - start > KILN_SPIN_NS) {
          pthread_mutex_lock(&p->mu);
          __atomic_fetch_add(&p->sleeping_workers, 1, __ATOMIC_SEQ_CST);
          while ((g = state_seq(__atomic_load_n(&p->state, __ATOMIC_SEQ_CST))) == seen)
            pthread_cond_wait(&p->wake, &p->mu);
          __atomic_fetch_sub(&p->sleeping_workers, 1, __ATOMIC_SEQ_CST);
          pthread_mutex_unlock(&p->mu);
          break;
        }
      }
    }
    seen = g;
    if (__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) break;
    if (try_join(p, g)) {
      run_indices(p, tid);
      leave(p);
    }
  }
  return NULL;
}

/* Publishes a new open job (or the stop request) and wakes sleeping workers. */
static void pool_post(kiln_pool *p) {
  p->seq++;
  __atomic_store_n(&p->state, (uint64_t)p->seq << 32 | JOB_OPEN, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&p->sleeping_workers, __ATOMIC_SEQ_CST) > 0) {
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
  }
}

/* Closes the current job and waits for the workers inside it. */
static void pool_finish(kiln_pool *p) {
  uint64_t s = __atomic_and_fetch(&p->state, ~JOB_OPEN, __ATOMIC_ACQ_REL);
  if ((s & JOB_ACTIVE) == 0) return;
  int64_t start = now_ns(), t = start;
  for (unsigned k = 1;; k++) {
    spin_step(t - start > KILN_PURE_SPIN_NS);
    if ((__atomic_load_n(&p->state, __ATOMIC_ACQUIRE) & JOB_ACTIVE) == 0) return;
    if ((k & 63) == 0 && (t = now_ns()) - start > KILN_SPIN_NS) break;
  }
  pthread_mutex_lock(&p->mu);
  __atomic_store_n(&p->caller_sleeping, 1, __ATOMIC_SEQ_CST);
  while ((__atomic_load_n(&p->state, __ATOMIC_SEQ_CST) & JOB_ACTIVE) != 0) pthread_cond_wait(&p->done, &p->mu);
  __atomic_store_n(&p->caller_sleeping, 0, __ATOMIC_SEQ_CST);
  pthread_mutex_unlock(&p->mu);
}

static void pool_destroy(kiln_pool *p) {
  if (!p) return;
  if (p->started > 0) {
    __atomic_store_n(&p->stop, 1, __ATOMIC_SEQ_CST);
    pool_post(p);
    for (int i = 0; i < p->started; i++) pthread_join(p->threads[i], NULL);
  }
  pthread_cond_destroy(&p->done);
  pthread_cond_destroy(&p->wake);
  pthread_mutex_destroy(&p->mu);
  free(p->ranges);
  free(p);
}

static kiln_worker_arg *worker_args(kiln_pool *p) { return (kiln_worker_arg *)(p + 1); }

static kiln_pool *pool_create(kiln_ctx *ctx, int nworkers) {
  size_t bytes = sizeof(kiln_pool) + (size_t)nworkers * sizeof(kiln_worker_arg);
  kiln_pool *p = NULL;
  if (posix_memalign((void **)&p, 64, bytes) != 0) p = NULL;
  if (p) memset(p, 0, bytes);
  if (!p) {
    snprintf(create_error, sizeof create_error, "out of memory");
    return NULL;
  }
  if (posix_memalign((void **)&p->ranges, 64, (size_t)(nworkers + 1) * sizeof(kiln_range)) != 0) {
    free(p);
    snprintf(create_error, sizeof create_error, "out of memory");
    return NULL;
  }
  p->ctx = ctx;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->wake, NULL);
  pthread_cond_init(&p->done, NULL);
  p->nworkers = nworkers;
  for (int i = 0; i < nworkers; i++) {
    kiln_worker_arg *a = &worker_args(p)[i];
    a->pool = p;
    a->tid = i + 1;
    int rc = pthread_create(&p->threads[i], NULL, worker_main, a);
    if (rc != 0) {
      snprintf(create_error, sizeof create_error, "cannot start worker thread %d of %d: %s", i + 1,
               nworkers, strerror(rc));
      pool_destroy(p);
      return NULL;
    }
    p->started++;
  }
  return p;
}

/* ---- contexts ---------------------------------------------------------------------------- */

static void *alloc64(int64_t bytes) {
  if (bytes <= 0) return NULL;
  if (bytes > INT64_MAX - 63) return NULL;
  void *p = NULL;
  if (posix_memalign(&p, 64, (size_t)((bytes + 63) & ~(int64_t)63)) != 0) return NULL;
  return p;
}

static int online_cpus(void) {
  cpu_set_t set;
  /* The CPUs this process may run on (a container or taskset may allow fewer than are online). */
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)(n > KILN_MAX_THREADS ? KILN_MAX_THREADS : n) : 1;
}

/* ---- weights outside the binary --------------------------------------------------------- */

/* The model's C API prefix (its name made a C identifier), for messages. */
static void api_prefix(const char *name, char *out, size_t len) {
  size_t k = 0;
  if (len == 0) return;
  if (*name >= '0' && *name <= '9' && k + 1 < len) out[k++] = '_';
  for (; *name && k + 1 < len; name++) {
    char c = *name;
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    out[k++] = ok ? c : '_';
  }
  out[k] = 0;
}

/* Maps the weights file into ctx, or checks that none is needed. Returns 0 or -1 (create_error). */
static int attach_weights(kiln_ctx *ctx, const char *path) {
  const kiln_model_desc *desc = ctx->desc;
  if (!desc->weights && !path) return 0;
  if (desc->weights && !path) {
    char prefix[128];
    api_prefix(desc->name, prefix, sizeof prefix);
    snprintf(create_error, sizeof create_error,
             "the model '%s' was compiled with its weights in a separate file (%s): create it with "
             "%s_create_with_weights(path, num_threads)",
             desc->name, desc->weights->file_name, prefix);
    return -1;
  }
  return kiln_weights_open(desc, path, &ctx->weights, create_error, sizeof create_error);
}

const void *kiln_rt_weights(kiln_ctx *ctx) { return ctx->weights.data; }

kiln_ctx *kiln_rt_create(const kiln_model_desc *desc, int32_t num_threads) {
  return kiln_rt_create_with_weights(desc, num_threads, NULL);
}

/* The context's copy of the outputs' static dims (kiln_rt_output_dims). */
static int init_output_dims(kiln_ctx *ctx) {
  const kiln_model_desc *desc = ctx->desc;
  int64_t total = 0;
  for (int32_t i = 0; i < desc->n_outputs; i++) {
    if (desc->outputs[i].rank < 0 || desc->outputs[i].rank > 64) {
      snprintf(create_error, sizeof create_error, "bad model description: output %d has rank %d", i,
               desc->outputs[i].rank);
      return -1;
    }
    total += desc->outputs[i].rank;
  }
  ctx->out_dims = calloc((size_t)(total > 0 ? total : 1), sizeof *ctx->out_dims);
  ctx->out_at = calloc((size_t)(desc->n_outputs > 0 ? desc->n_outputs : 1), sizeof *ctx->out_at);
  if (desc->batch) {
    ctx->sample_in = calloc((size_t)(desc->n_inputs > 0 ? desc->n_inputs : 1), sizeof *ctx->sample_in);
    ctx->sample_out = calloc((size_t)(desc->n_outputs > 0 ? desc->n_outputs : 1), sizeof *ctx->sample_out);
  }
  if (!ctx->out_dims || !ctx->out_at || (desc->batch && (!ctx->sample_in || !ctx->sample_out))) {
    snprintf(create_error, sizeof create_error, "out of memory");
    return -1;
  }
  int64_t at = 0;
  for (int32_t i = 0; i < desc->n_outputs; i++) {
    ctx->out_at[i] = at;
    for (int32_t d = 0; d < desc->outputs[i].rank; d++) ctx->out_dims[at + d] = desc->outputs[i].dims[d];
    at += desc->outputs[i].rank;
  }
  return 0;
}

int64_t *kiln_rt_output_dims(kiln_ctx *ctx, int32_t i) {
  if (!ctx || i < 0 || i >= ctx->desc->n_outputs) return NULL;
  return ctx->out_dims + ctx->out_at[i];
}

int32_t kiln_rt_last_output_shape(kiln_ctx *ctx, const char *fn, int32_t i, int64_t *dims) {
  if (!ctx) {
    snprintf(create_error, sizeof create_error, "%s: ctx is NULL", fn);
    return -1;
  }
  const int64_t *d = kiln_rt_output_dims(ctx, i);
  if (!d) {
    kiln_rt_set_error(ctx, "%s: no output %d (the model has %d)", fn, (int)i, (int)ctx->desc->n_outputs);
    return -1;
  }
  int32_t rank = ctx->desc->outputs[i].rank;
  for (int32_t k = 0; dims && k < rank; k++) dims[k] = d[k];
  return rank;
}

int64_t kiln_rt_output_bytes(kiln_ctx *ctx, int32_t i) {
  const int64_t *dims = kiln_rt_output_dims(ctx, i);
  if (!dims) return -1;
  const kiln_io_desc *d = &ctx->desc->outputs[i];
  int64_t numel = 1, all = 1;
  for (int32_t k = 0; k < d->rank; k++) {
    numel *= dims[k];
    all *= d->dims[k];
  }
  return all > 0 ? d->bytes / all * numel : 0;
}

/* "[1, 3, 224, 224]", or with a batch range "[1..8, 3, 224, 224]" (axis 0 as n*a0). */
static void format_dims(char *buf, size_t len, const kiln_io_desc *d, const kiln_batch_desc *batch) {
  int n = snprintf(buf, len, "[");
  for (int32_t k = 0; k < d->rank && n < (int)len - 48; k++) {
    if (k == 0 && batch && d->dims[0] == 1)
      n += snprintf(buf + n, len - (size_t)n, "%lld..%lld", (long long)batch->lo, (long long)batch->hi);
    else if (k == 0 && batch)
      n += snprintf(buf + n, len - (size_t)n, "n*%lld (n in %lld..%lld)", (long long)d->dims[0],
                    (long long)batch->lo, (long long)batch->hi);
    else
      n += snprintf(buf + n, len - (size_t)n, "%s%lld", k ? ", " : "", (long long)d->dims[k]);
  }
  snprintf(buf + n, len - (size_t)n, "]");
}

int32_t kiln_rt_run_batch(kiln_ctx *ctx, int64_t n, const void *const *inputs, void *const *outputs) {
  const kiln_model_desc *desc = ctx->desc;
  const kiln_batch_desc *b = desc->batch;
  if (!b || n < b->lo || n > b->hi) {
    kiln_rt_set_error(ctx, "a batch of %lld is outside the range this model was compiled for", (long long)n);
    return -1;
  }
  for (int64_t s = 0; s < n; s++) {
    for (int32_t i = 0; i < desc->n_inputs; i++)
      ctx->sample_in[i] = b->inputs[i] ? (const char *)inputs[i] + s * desc->inputs[i].bytes : inputs[i];
    for (int32_t i = 0; i < desc->n_outputs; i++)
      ctx->sample_out[i] = b->outputs[i] ? (char *)outputs[i] + s * desc->outputs[i].bytes : outputs[i];
    int32_t rc = desc->run(ctx, ctx->sample_in, ctx->sample_out);
    if (rc != 0) return rc;
  }
  for (int32_t i = 0; i < desc->n_outputs; i++)
    if (b->outputs[i] && desc->outputs[i].rank > 0) kiln_rt_output_dims(ctx, i)[0] = n * desc->outputs[i].dims[0];
  return 0;
}

int32_t kiln_rt_run_shaped(kiln_ctx *ctx, const char *fn, const void *const *inputs,
                           const int64_t *const *input_shapes, void *const *outputs,
                           int64_t *const *output_shapes) {
  const kiln_model_desc *desc = ctx->desc;
  const kiln_batch_desc *batch = desc->batch;
  if (!input_shapes && desc->n_inputs > 0) {
    kiln_rt_set_error(ctx, "%s: input_shapes is NULL", fn);
    return -1;
  }
  int64_t n = -1;      /* the batch, from the first batched input */
  int32_t n_from = -1; /* that input */
  for (int32_t i = 0; i < desc->n_inputs; i++) {
    const kiln_io_desc *d = &desc->inputs[i];
    int batched = batch && batch->inputs[i] && d->rank > 0 && d->dims[0] > 0;
    int same = input_shapes[i] != NULL;
    for (int32_t k = batched ? 1 : 0; same && k < d->rank; k++) same = input_shapes[i][k] == d->dims[k];
    if (same && batched) {
      int64_t rows = input_shapes[i][0];
      int64_t m = rows / d->dims[0];
      if (rows % d->dims[0] != 0 || m < batch->lo || m > batch->hi) {
        kiln_rt_set_error(ctx, "%s: input '%s' has %lld rows on axis 0, not a batch of %lld..%lld samples", fn,
                          d->name, (long long)rows, (long long)batch->lo, (long long)batch->hi);
        return -1;
      }
      if (n >= 0 && m != n) {
        kiln_rt_set_error(ctx, "%s: inputs '%s' and '%s' have different batch sizes (%lld and %lld)", fn,
                          desc->inputs[n_from].name, d->name, (long long)n, (long long)m);
        return -1;
      }
      n = m;
      n_from = i;
    }
    if (same) continue;
    char want[256];
    format_dims(want, sizeof want, d, batched ? batch : NULL);
    if (!input_shapes[i])
      kiln_rt_set_error(ctx, "%s: input_shapes[%d] ('%s') is NULL", fn, i, d->name);
    else
      kiln_rt_set_error(ctx, "%s: input '%s' does not have the shape %s this model was compiled for", fn,
                        d->name, want);
    return -1;
  }
  int32_t rc = batch ? kiln_rt_run_batch(ctx, n, inputs, outputs) : desc->run(ctx, inputs, outputs);
  if (rc != 0 || !output_shapes) return rc;
  for (int32_t i = 0; i < desc->n_outputs; i++) {
    if (!output_shapes[i]) continue;
    const int64_t *dims = kiln_rt_output_dims(ctx, i);
    for (int32_t k = 0; k < desc->outputs[i].rank; k++) output_shapes[i][k] = dims[k];
  }
  return 0;
}

/* The parts of a context every model has: the description and the mapped weights. */
static kiln_ctx *ctx_new(const kiln_model_desc *desc, const char *weights_path) {
  if (check_cpu_features(desc->cpu_features) != 0) return NULL;
  kiln_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) {
    snprintf(create_error, sizeof create_error, "out of memory");
    return NULL;
  }
  ctx->desc = desc;
  ctx->device_index = -1;
  if (init_output_dims(ctx) != 0 || attach_weights(ctx, weights_path) != 0) {
    free(ctx->out_dims);
    free(ctx->out_at);
    free(ctx->sample_in);
    free(ctx->sample_out);
    free(ctx);
    return NULL;
  }
  return ctx;
}

kiln_ctx *kiln_rt_ctx_new(const kiln_model_desc *desc, int32_t num_threads, const char *weights_path) {
  create_error[0] = 0;
  kiln_ctx *ctx = desc ? ctx_new(desc, weights_path) : NULL;
  if (!desc) snprintf(create_error, sizeof create_error, "no model description");
  if (ctx) ctx->num_threads = num_threads > 0 ? num_threads : 1;
  return ctx;
}

void kiln_rt_set_create_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(create_error, sizeof create_error, fmt, ap);
  va_end(ap);
}

void **kiln_rt_device_slot(kiln_ctx *ctx) { return &ctx->device; }

void kiln_rt_set_device_name(kiln_ctx *ctx, int32_t device, const char *name) {
  ctx->device_index = device;
  snprintf(ctx->device_name, sizeof ctx->device_name, "%s", name ? name : "");
}

int32_t kiln_rt_device(kiln_ctx *ctx, const char **name) {
  if (name) *name = ctx->device_name;
  return ctx->device_index;
}

kiln_ctx *kiln_rt_create_with_weights(const kiln_model_desc *desc, int32_t num_threads,
                                      const char *weights_path) {
  create_error[0] = 0;
  if (!desc) {
    snprintf(create_error, sizeof create_error, "no model description");
    return NULL;
  }
  /* A CUDA model's context lives on the GPU; its code is reached only through the descriptor,
     so CPU artifacts never reference it. */
  if (desc->cuda) {
    if (!desc->cuda->create) {
      snprintf(create_error, sizeof create_error, "bad model description: no CUDA runtime");
      return NULL;
    }
    return desc->cuda->create(desc, -1, weights_path);
  }
  kiln_ctx *ctx = ctx_new(desc, weights_path);
  if (!ctx) return NULL;
  int threads = num_threads > 0 ? num_threads : online_cpus();
  if (threads > KILN_MAX_THREADS) threads = KILN_MAX_THREADS;
  ctx->num_threads = threads;
  int64_t per = desc->thread_scratch_bytes;
  if (desc->arena_bytes < 0 || per < 0 || (per > 0 && per > INT64_MAX / 64 / threads)) {
    snprintf(create_error, sizeof create_error, "bad model description: working memory sizes");
    kiln_rt_destroy(ctx);
    return NULL;
  }
  per = (per + 63) & ~(int64_t)63;
  ctx->arena = alloc64(desc->arena_bytes);
  ctx->thread_scratch = alloc64(per * threads);
  if ((desc->arena_bytes > 0 && !ctx->arena) || (per > 0 && !ctx->thread_scratch)) {
    snprintf(create_error, sizeof create_error,
             "cannot allocate %lld bytes of working memory (%lld arena + %lld per thread x %d threads)",
             (long long)(desc->arena_bytes + per * threads), (long long)desc->arena_bytes,
             (long long)per, threads);
    kiln_rt_destroy(ctx);
    return NULL;
  }
  if (threads > 1) {
    ctx->pool = pool_create(ctx, threads - 1);
    if (!ctx->pool) {
      kiln_rt_destroy(ctx);
      return NULL;
    }
  }
  return ctx;
}

const char *kiln_rt_create_error(void) { return create_error; }

void kiln_rt_destroy(kiln_ctx *ctx) {
  if (!ctx) return;
  if (ctx->device && ctx->desc->cuda && ctx->desc->cuda->destroy) ctx->desc->cuda->destroy(ctx);
  pool_destroy(ctx->pool);
  kiln_rt_profile_free(ctx->prof);
  kiln_weights_close(&ctx->weights);
  free(ctx->out_dims);
  free(ctx->out_at);
  free(ctx->sample_in);
  free(ctx->sample_out);
  free(ctx->arena);
  free(ctx->thread_scratch);
  free(ctx);
}

const kiln_model_desc *kiln_rt_desc(kiln_ctx *ctx) { return ctx->desc; }
kiln_prof **kiln_rt_profile_slot(kiln_ctx *ctx) { return &ctx->prof; }
void *kiln_rt_arena(kiln_ctx *ctx) { return ctx->arena; }

void kiln_rt_set_error(kiln_ctx *ctx, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (ctx)
    vsnprintf(ctx->error, sizeof ctx->error, fmt, ap);
  else
    vsnprintf(create_error, sizeof create_error, fmt, ap);
  va_end(ap);
}

const char *kiln_rt_last_error(kiln_ctx *ctx) { return ctx ? ctx->error : create_error; }

/* ---- the checks and introspection of the generated API --------------------------------------- */

int32_t kiln_rt_api_check(const kiln_model_desc *desc, kiln_ctx *ctx, const char *fn,
                          const void *const *inputs, void *const *outputs, int32_t mode) {
  if (!ctx) {
    snprintf(create_error, sizeof create_error, "%s: ctx is NULL", fn);
    return -1;
  }
  if (ctx->desc != desc) {
    kiln_rt_set_error(ctx, "%s: ctx was created by another model ('%s')", fn,
                      ctx->desc ? ctx->desc->name : "?");
    return -1;
  }
  if (desc->batch && mode != 3) {
    char prefix[128];
    api_prefix(desc->name, prefix, sizeof prefix);
    kiln_rt_set_error(ctx,
                      "%s: this model takes a batch of %lld..%lld samples; run it with %s_run_shaped, which "
                      "is given the inputs' shapes",
                      fn, (long long)desc->batch->lo, (long long)desc->batch->hi, prefix);
    return -1;
  }
  const char *in_arg = mode == 2 ? "d_inputs" : "inputs", *out_arg = mode == 2 ? "d_outputs" : "outputs";
  if ((!inputs && desc->n_inputs > 0) || (!outputs && desc->n_outputs > 0)) {
    kiln_rt_set_error(ctx, "%s: %s is NULL", fn, !inputs && desc->n_inputs > 0 ? in_arg : out_arg);
    return -1;
  }
  for (int32_t k = 0; k < desc->n_inputs + desc->n_outputs; k++) {
    int out = k >= desc->n_inputs;
    int32_t i = out ? k - desc->n_inputs : k;
    if (out ? outputs[i] != NULL : inputs[i] != NULL) continue;
    const char *name = out ? desc->outputs[i].name : desc->inputs[i].name;
    if (mode == 0)
      kiln_rt_set_error(ctx, "%s: the pointer to %s '%s' is NULL", fn, out ? "output" : "input", name);
    else
      kiln_rt_set_error(ctx, "%s: %s[%d] (%s '%s') is NULL", fn, out ? out_arg : in_arg, (int)i,
                        out ? "output" : "input", name);
    return -1;
  }
  ctx->error[0] = 0;
  return 0;
}

int32_t kiln_rt_api_check_variant(const kiln_model_desc *const *descs, int32_t n, kiln_ctx *ctx,
                                  const char *fn, const void *const *inputs, void *const *outputs,
                                  int32_t mode) {
  /* A portable model's context holds the variant chosen for this CPU: accept any of its own. */
  const kiln_model_desc *desc = descs[0];
  for (int32_t i = 0; ctx && i < n; i++)
    if (ctx->desc == descs[i]) desc = descs[i];
  return kiln_rt_api_check(desc, ctx, fn, inputs, outputs, mode);
}

static const kiln_io_desc *io_at(const kiln_model_desc *desc, int32_t output, int32_t i) {
  int32_t n = output ? desc->n_outputs : desc->n_inputs;
  if (i < 0 || i >= n) return NULL;
  return output ? &desc->outputs[i] : &desc->inputs[i];
}

int32_t kiln_rt_io_count(const kiln_model_desc *desc, int32_t output) {
  return output ? desc->n_outputs : desc->n_inputs;
}

const char *kiln_rt_io_name(const kiln_model_desc *desc, int32_t output, int32_t i) {
  const kiln_io_desc *d = io_at(desc, output, i);
  return d ? d->name : NULL;
}

int32_t kiln_rt_io_dtype(const kiln_model_desc *desc, int32_t output, int32_t i) {
  /* ONNX TensorProto.DataType per enum kiln_dtype (the header's NAME_DTYPE_* values). */
  static const int32_t onnx[13] = {9, 2, 3, 4, 5, 12, 6, 13, 7, 10, 16, 1, 11};
  const kiln_io_desc *d = io_at(desc, output, i);
  return d && d->dtype >= 0 && d->dtype < 13 ? onnx[d->dtype] : -1;
}

int32_t kiln_rt_io_shape(const kiln_model_desc *desc, int32_t output, int32_t i, int64_t *dims) {
  const kiln_io_desc *d = io_at(desc, output, i);
  if (!d) return -1;
  for (int32_t k = 0; dims && k < d->rank; k++) dims[k] = d->dims[k];
  return d->rank;
}

void kiln_rt_parallel_for(kiln_ctx *ctx, kiln_task_fn fn, void *data, int64_t n) {
  if (n <= 0) return;
  kiln_pool *p = ctx->pool;
  if (n == 1 || !p) {
    for (int64_t i = 0; i < n; i++) fn(data, i, 0);
    return;
  }
  p->fn = fn;
  p->data = data;
  int64_t threads = (int64_t)p->nworkers + 1;
  for (int64_t t = 0; t < threads; t++) {
    p->ranges[t].end = (t + 1) * n / threads;
    __atomic_store_n(&p->ranges[t].next, t * n / threads, __ATOMIC_RELAXED);
  }
  pool_post(p);
  run_indices(p, 0);
  pool_finish(p);
}

int64_t kiln_rt_num_threads(kiln_ctx *ctx) { return ctx->num_threads; }

void *kiln_rt_thread_scratch(kiln_ctx *ctx, int64_t tid) {
  int64_t per = (ctx->desc->thread_scratch_bytes + 63) & ~(int64_t)63;
  return (char *)ctx->thread_scratch + tid * per;
}
