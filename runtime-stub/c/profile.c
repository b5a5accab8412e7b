/* Per-kernel profiling of a context's runs: time and calls accumulated per kernel, and the
   kernel events of every profiled run for a Chrome trace. See kiln_rt.h.

   The generated run function asks kiln_rt_prof_run_begin for the profile once per run and
   skips every other hook when it gets NULL, so a context that is not profiled pays one call per
   run and one predictable branch per kernel. Everything that may allocate happens in
   kiln_rt_prof_run_begin, before the first kernel: the timed region never allocates. */
#define _GNU_SOURCE
#include "kiln_rt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Kernel events kept for the trace (24 bytes each); runs beyond them still count in the
   per-kernel totals, and the trace says how many events it lacks. */
#define KILN_PROF_MAX_EVENTS (1 << 20)

typedef struct {
  int64_t start; /* ns since profiling was turned on */
  int64_t dur;
  int32_t kernel;
  int32_t run;
} kiln_prof_event;

typedef struct {
  int64_t start;
  int64_t dur;
  int32_t run;
} kiln_prof_run;

struct kiln_prof {
  int enabled;
  int recording; /* whether the current run's events are kept */
  const kiln_model_desc *desc;
  int64_t n_kernels;
  int64_t origin; /* CLOCK_MONOTONIC ns when profiling was turned on: the trace's time zero */
  int64_t kernel_start;
  int64_t run_start;
  int32_t run; /* index of the current run since profiling was turned on */
  int64_t *total_ns;
  int64_t *calls;
  kiln_prof_event *events;
  int64_t n_events, cap_events, dropped_events;
  kiln_prof_run *runs;
  int64_t n_runs, cap_runs;
};

static inline int64_t prof_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void kiln_rt_profile_free(kiln_prof *p) {
  if (!p) return;
  free(p->total_ns);
  free(p->calls);
  free(p->events);
  free(p->runs);
  free(p);
}

int32_t kiln_rt_profile_enable(kiln_ctx *ctx, int32_t on) {
  if (!ctx) {
    kiln_rt_set_error(NULL, "profile_enable: ctx is NULL");
    return -1;
  }
  kiln_prof **slot = kiln_rt_profile_slot(ctx);
  kiln_prof *p = *slot;
  if (!on) {
    if (p) p->enabled = 0;
    return 0;
  }
  if (!p) {
    const kiln_model_desc *desc = kiln_rt_desc(ctx);
    int64_t n = desc->n_kernels > 0 ? desc->n_kernels : 0;
    p = calloc(1, sizeof *p);
    if (p) {
      p->desc = desc;
      p->n_kernels = n;
      p->total_ns = calloc((size_t)(n ? n : 1), sizeof *p->total_ns);
      p->calls = calloc((size_t)(n ? n : 1), sizeof *p->calls);
    }
    if (!p || !p->total_ns || !p->calls) {
      kiln_rt_profile_free(p);
      kiln_rt_set_error(ctx, "cannot turn profiling on: out of memory");
      return -1;
    }
    *slot = p;
  }
  memset(p->total_ns, 0, (size_t)(p->n_kernels ? p->n_kernels : 1) * sizeof *p->total_ns);
  memset(p->calls, 0, (size_t)(p->n_kernels ? p->n_kernels : 1) * sizeof *p->calls);
  p->n_events = p->dropped_events = p->n_runs = 0;
  p->run = -1;
  p->recording = 0;
  p->origin = prof_now();
  p->enabled = 1;
  return 0;
}

/* Makes room for `more` entries of `size` bytes; returns 0, or -1 (nothing changed). */
static int reserve(void **buf, int64_t *cap, int64_t len, int64_t more, size_t size, int64_t limit) {
  if (len + more <= *cap) return 0;
  if (len + more > limit) return -1;
  int64_t c = *cap ? *cap : 64;
  while (c < len + more) c *= 2;
  if (c > limit) c = limit;
  void *n = realloc(*buf, (size_t)c * size);
  if (!n) return -1;
  *buf = n;
  *cap = c;
  return 0;
}

kiln_prof *kiln_rt_prof_run_begin(kiln_ctx *ctx) {
  kiln_prof *p = *kiln_rt_profile_slot(ctx);
  if (!p || !p->enabled) return NULL;
  p->run++;
  p->recording =
      reserve((void **)&p->events, &p->cap_events, p->n_events, p->n_kernels, sizeof *p->events,
              KILN_PROF_MAX_EVENTS) == 0 &&
      reserve((void **)&p->runs, &p->cap_runs, p->n_runs, 1, sizeof *p->runs, KILN_PROF_MAX_EVENTS) == 0;
  if (!p->recording) p->dropped_events += p->n_kernels;
  p->run_start = prof_now();
  return p;
}

void kiln_rt_prof_kernel_begin(kiln_prof *p) { p->kernel_start = prof_now(); }

void kiln_rt_prof_kernel_end(kiln_prof *p, int64_t kernel) {
  int64_t t = prof_now(), d = t - p->kernel_start;
  if (kernel < 0 || kernel >= p->n_kernels) return;
  p->total_ns[kernel] += d;
  p->calls[kernel]++;
  if (p->recording && p->n_events < p->cap_events)
    p->events[p->n_events++] = (kiln_prof_event){p->kernel_start - p->origin, d, (int32_t)kernel, p->run};
}

void kiln_rt_prof_run_end(kiln_prof *p) {
  int64_t t = prof_now();
  if (p->recording && p->n_runs < p->cap_runs)
    p->runs[p->n_runs++] = (kiln_prof_run){p->run_start - p->origin, t - p->run_start, p->run};
}

/* ---- reading ----------------------------------------------------------------------------- */

static const kiln_kernel_desc *kernel_desc(const kiln_prof *p, int64_t k) {
  static const kiln_kernel_desc unknown = {"?", "?", "?", 0, NULL, 0};
  return p->desc->kernels ? &p->desc->kernels[k] : &unknown;
}

int32_t kiln_rt_profile_kernels(kiln_ctx *ctx, kiln_profile_kernel *out, int32_t max) {
  if (!ctx) {
    kiln_rt_set_error(NULL, "profile_kernels: ctx is NULL");
    return -1;
  }
  kiln_prof *p = *kiln_rt_profile_slot(ctx);
  if (!p) return -1;
  for (int64_t k = 0; out && k < p->n_kernels && k < max; k++) {
    const kiln_kernel_desc *d = kernel_desc(p, k);
    out[k] = (kiln_profile_kernel){d->name, d->op, d->n_nodes, d->nodes, p->calls[k], p->total_ns[k], d->flops};
  }
  return (int32_t)p->n_kernels;
}

/* A JSON string literal. */
static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *c = (const unsigned char *)(s ? s : ""); *c; c++) {
    if (*c == '"' || *c == '\\')
      fprintf(f, "\\%c", *c);
    else if (*c < 0x20)
      fprintf(f, "\\u%04x", *c);
    else
      fputc(*c, f);
  }
  fputc('"', f);
}

/* Microseconds with nanosecond digits, exactly (no float rounding between nested events). */
static void json_us(FILE *f, int64_t ns) {
  fprintf(f, "%lld.%03lld", (long long)(ns / 1000), (long long)(ns % 1000));
}

int32_t kiln_rt_profile_write_trace(kiln_ctx *ctx, const char *path) {
  if (!ctx || !path) {
    kiln_rt_set_error(ctx, "profile_write_trace: %s is NULL", ctx ? "path" : "ctx");
    return -1;
  }
  kiln_prof *p = *kiln_rt_profile_slot(ctx);
  if (!p) {
    kiln_rt_set_error(ctx, "cannot write the profile to %s: profiling was never turned on", path);
    return -1;
  }
  FILE *f = fopen(path, "w");
  if (!f) {
    kiln_rt_set_error(ctx, "cannot write the profile to %s: %s", path, strerror(errno));
    return -1;
  }
  const kiln_model_desc *desc = p->desc;
  long pid = (long)getpid();
  fprintf(f, "{\"traceEvents\":[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%ld,\"tid\":1,\"args\":{\"name\":", pid);
  json_str(f, desc->name);
  fprintf(f, "}},\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%ld,\"tid\":1,\"args\":{\"name\":\"run\"}}", pid);
  for (int64_t r = 0; r < p->n_runs; r++) {
    fprintf(f, ",\n{\"name\":\"run\",\"cat\":\"run\",\"ph\":\"X\",\"ts\":");
    json_us(f, p->runs[r].start);
    fprintf(f, ",\"dur\":");
    json_us(f, p->runs[r].dur);
    fprintf(f, ",\"pid\":%ld,\"tid\":1,\"args\":{\"run\":%d}}", pid, p->runs[r].run);
  }
  for (int64_t e = 0; e < p->n_events; e++) {
    const kiln_prof_event *ev = &p->events[e];
    const kiln_kernel_desc *d = kernel_desc(p, ev->kernel);
    fprintf(f, ",\n{\"name\":");
    json_str(f, d->name);
    fprintf(f, ",\"cat\":\"kernel\",\"ph\":\"X\",\"ts\":");
    json_us(f, ev->start);
    fprintf(f, ",\"dur\":");
    json_us(f, ev->dur);
    fprintf(f, ",\"pid\":%ld,\"tid\":1,\"args\":{\"kernel\":%d,\"run\":%d,\"nodes\":[", pid, ev->kernel, ev->run);
    for (int32_t i = 0; i < d->n_nodes; i++) {
      if (i) fputc(',', f);
      json_str(f, d->nodes[i]);
    }
    fprintf(f, "],\"op\":");
    json_str(f, d->op);
    fprintf(f, ",\"impl\":");
    json_str(f, d->impl);
    fprintf(f, ",\"gflop\":%.9g}}", (double)d->flops / 1e9);
  }
  fprintf(f, "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"model\":");
  json_str(f, desc->name);
  fprintf(f, ",\"kiln_version\":");
  json_str(f, desc->kiln_version);
  fprintf(f, ",\"kernels\":%lld,\"runs\":%lld,\"dropped_events\":%lld}}\n", (long long)p->n_kernels,
          (long long)p->n_runs, (long long)p->dropped_events);
  int bad = ferror(f);
  if (fclose(f) != 0 || bad) {
    kiln_rt_set_error(ctx, "cannot write the profile to %s: %s", path, strerror(errno ? errno : EIO));
    return -1;
  }
  return 0;
}

/* s cut to at most `width` bytes (ending in "..." when cut, never inside a UTF-8 sequence). */
static void fit(char *buf, size_t len, const char *s, size_t width) {
  if (width + 1 > len) width = len - 1;
  size_t n = strlen(s);
  if (n <= width) {
    memcpy(buf, s, n + 1);
    return;
  }
  size_t k = width > 3 ? width - 3 : 0;
  while (k > 0 && ((unsigned char)s[k] & 0xc0) == 0x80) k--;
  memcpy(buf, s, k);
  memcpy(buf + k, "...", 4);
}

typedef struct {
  int64_t ns;
  int64_t kernel;
} kiln_prof_rank;

static int by_time(const void *a, const void *b) {
  const kiln_prof_rank *x = a, *y = b;
  if (x->ns != y->ns) return x->ns < y->ns ? 1 : -1;
  return x->kernel < y->kernel ? -1 : 1;
}

void kiln_rt_profile_print_top(kiln_ctx *ctx, int32_t top) {
  kiln_prof *p = *kiln_rt_profile_slot(ctx);
  if (!p) return;
  int64_t n = p->n_kernels, runs = 0, total = 0, wall = 0;
  for (int64_t k = 0; k < n; k++) {
    total += p->total_ns[k];
    if (p->calls[k] > runs) runs = p->calls[k];
  }
  for (int64_t r = 0; r < p->n_runs; r++) wall += p->runs[r].dur;
  kiln_prof_rank *order = malloc((size_t)(n ? n : 1) * sizeof *order);
  if (!order) return;
  for (int64_t k = 0; k < n; k++) order[k] = (kiln_prof_rank){p->total_ns[k], k};
  qsort(order, (size_t)n, sizeof *order, by_time);
  int64_t shown = top > 0 && top < n ? top : n;
  fprintf(stderr, "profile: %lld kernels over %lld run%s, %.3f ms per run in kernels", (long long)n,
          (long long)runs, runs == 1 ? "" : "s", runs ? (double)total / 1e6 / (double)runs : 0.0);
  if (p->n_runs > 0) fprintf(stderr, " of %.3f ms", (double)wall / 1e6 / (double)p->n_runs);
  fprintf(stderr, "%s\n", shown < n ? "; top kernels by time:" : "");
  fprintf(stderr, "%4s  %-32s  %-40s  %9s  %6s  %8s\n", "rank", "kernel", "nodes", "ms/run", "share", "GFLOP/s");
  for (int64_t i = 0; i < shown; i++) {
    int64_t k = order[i].kernel;
    const kiln_kernel_desc *d = kernel_desc(p, k);
    char name[40], nodes[48], joined[256], gflops[32];
    size_t len = 0;
    joined[0] = 0;
    for (int32_t j = 0; j < d->n_nodes && len < sizeof joined - 1; j++) {
      int w = snprintf(joined + len, sizeof joined - len, "%s%s", j ? ", " : "", d->nodes[j]);
      if (w < 0) break;
      len += (size_t)w < sizeof joined - len ? (size_t)w : sizeof joined - 1 - len;
    }
    fit(name, sizeof name, d->name, 32);
    fit(nodes, sizeof nodes, joined, 40);
    double ns_per_call = p->calls[k] ? (double)p->total_ns[k] / (double)p->calls[k] : 0;
    if (d->flops > 0 && ns_per_call > 0)
      snprintf(gflops, sizeof gflops, "%.2f", (double)d->flops / ns_per_call);
    else
      snprintf(gflops, sizeof gflops, "-");
    fprintf(stderr, "%4lld  %-32s  %-40s  %9.3f  %5.1f%%  %8s\n", (long long)(i + 1), name, nodes,
            ns_per_call / 1e6, total ? 100.0 * (double)p->total_ns[k] / (double)total : 0.0, gflops);
  }
  free(order);
}
