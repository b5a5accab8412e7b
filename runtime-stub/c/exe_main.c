/* The executable entry of a compiled model: the command line of `kiln run`, for one model. */
#define _GNU_SOURCE
#include "kiln_cuda.h"
#include "kiln_npy.h"
#include "kiln_rt.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The statuses kiln itself uses for the same failures (README, "Exit status"): 2 for what the
   user gave (flags, input files, an output folder that cannot be written), 6 for a model that
   cannot run on this machine (memory, CPU features, CUDA device). */
#define EXIT_USAGE 2
#define EXIT_RUNTIME 6

/* Writes `s` with control characters escaped as kiln itself writes them (\n, \t, \r, \u{1b};
   C1 controls, U+0080..U+009F, too): names come from the model, and a name must not be able to
   send escape sequences to the terminal or forge lines. */
static void put_printable(FILE *out, const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '\n') fputs("\\n", out);
    else if (*p == '\t') fputs("\\t", out);
    else if (*p == '\r') fputs("\\r", out);
    else if (*p < 0x20 || *p == 0x7f) fprintf(out, "\\u{%x}", *p);
    else if (*p == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f) fprintf(out, "\\u{%x}", *++p);
    else fputc(*p, out);
  }
}

/* "error: MESSAGE" on one line; messages quote model names, so they are escaped. */
static void print_error(const char *msg) {
  fputs("error: ", stderr);
  put_printable(stderr, msg);
  fputc('\n', stderr);
}

static void print_type(FILE *out, const kiln_io_desc *d) {
  char buf[1024];
  kiln_stub_format_type(buf, sizeof buf, d->dtype, d->rank, d->dims);
  fputs(buf, out);
}

/* Input or output i's type as the model declares it: with a batch range, axis 0 shows the
   range ("f32[1..8,3,224,224]", or "f32[n*16,64] (n in 1..8)" for several rows a sample). */
static void print_io_type(FILE *out, const kiln_model_desc *desc, int output, int32_t i) {
  const kiln_io_desc *d = output ? &desc->outputs[i] : &desc->inputs[i];
  const kiln_batch_desc *b = desc->batch;
  if (!b || !(output ? b->outputs[i] : b->inputs[i]) || d->rank == 0) {
    print_type(out, d);
    return;
  }
  char rest[1024];
  kiln_stub_format_type(rest, sizeof rest, d->dtype, d->rank, d->dims);
  const char *tail = strchr(rest, ',');
  if (d->dims[0] == 1)
    fprintf(out, "%s[%lld..%lld%s", kiln_stub_dtype_name(d->dtype), (long long)b->lo, (long long)b->hi,
            tail ? tail : "]");
  else
    fprintf(out, "%s[n*%lld%s (n in %lld..%lld)", kiln_stub_dtype_name(d->dtype), (long long)d->dims[0],
            tail ? tail : "]", (long long)b->lo, (long long)b->hi);
}

/* "x: f32[1,3], y: i64[2]", as kiln run lists a model's inputs. */
static void print_inputs(FILE *out, const kiln_model_desc *desc) {
  for (int32_t i = 0; i < desc->n_inputs; i++) {
    fputs(i ? ", " : "", out);
    put_printable(out, desc->inputs[i].name);
    fputs(": ", out);
    print_io_type(out, desc, 0, i);
  }
}

/* What the model runs on: the target triple, or "CUDA sm_80" (its host code runs on the triple). */
static const char *target_name(const kiln_model_desc *desc, char *buf, size_t len) {
  if (!desc->cuda) return desc->target_triple;
  snprintf(buf, len, "CUDA %s", desc->cuda->sm);
  return buf;
}

/* "4 threads", or "CUDA device 0 (NVIDIA H100)". */
static const char *where_ran(kiln_ctx *ctx, char *buf, size_t len) {
  const char *name = NULL;
  int32_t device = kiln_rt_device(ctx, &name);
  if (device >= 0)
    snprintf(buf, len, "CUDA device %d (%s)", device, name ? name : "?");
  else
    snprintf(buf, len, "%lld threads", (long long)kiln_rt_num_threads(ctx));
  return buf;
}

static void usage(FILE *out, const char *prog, const kiln_model_desc *desc) {
  char target[64];
  fprintf(out,
          "%s: the model '%s', compiled by kiln %s for %s\n\n"
          "Usage: %s --input NAME=FILE.npy ... [options]\n\n"
          "Options:\n"
          "  -i, --input NAME=FILE  an input value (.npy); may be repeated; a bare FILE is enough\n"
          "                         for single-input models\n"
          "  -o, --output-dir DIR   write each output to DIR/<output name>.npy (created if missing)\n"
          "      --bench N          one warm-up run, then N timed runs; prints the median latency\n"
          "      --threads N        worker threads (default: one per CPU this process may use)\n"
          "      --device N         the CUDA device to run on (CUDA models; default:\n"
          "                         $KILN_CUDA_DEVICE, else 0)\n"
          "      --info             print the model's signature as JSON\n"
          "      --profile FILE     time every kernel: write a Chrome trace (JSON, for Perfetto or\n"
          "                         chrome://tracing) of the runs (the timed runs with --bench)\n"
          "                         and print the kernels taking the most time to stderr\n"
          "      --profile-top N    how many kernels that table lists (default 15, 0: all)\n"
          "      --weights FILE     the weights file of a model compiled with --weights-out\n"
          "                         (default: its compile-time name, next to this program,\n"
          "                         then in the current directory)\n"
          "  -q, --quiet            print nothing but errors (and the --bench latency)\n"
          "  -h, --help             print this help\n"
          "  -V, --version          print the version\n\n"
          "Inputs:\n",
          prog, desc->name, desc->kiln_version, target_name(desc, target, sizeof target), prog);
  for (int32_t i = 0; i < desc->n_inputs; i++) {
    fputs("  ", out);
    put_printable(out, desc->inputs[i].name);
    fputs(": ", out);
    print_io_type(out, desc, 0, i);
    fprintf(out, "%s\n", desc->inputs[i].dtype == KILN_BF16 ? " (given as a float32 .npy)" : "");
  }
  fprintf(out, "Outputs:\n");
  for (int32_t i = 0; i < desc->n_outputs; i++) {
    fputs("  ", out);
    put_printable(out, desc->outputs[i].name);
    fputs(": ", out);
    print_io_type(out, desc, 1, i);
    fprintf(out, "%s\n", desc->outputs[i].dtype == KILN_BF16 ? " (written as float32)" : "");
  }
}

static int usage_error(const kiln_model_desc *desc, const char *msg, const char *arg, int list_inputs) {
  fputs("error: ", stderr);
  put_printable(stderr, msg);
  if (arg) put_printable(stderr, arg);
  if (list_inputs) {
    fprintf(stderr, " (the model's inputs: ");
    print_inputs(stderr, desc);
    fprintf(stderr, ")");
  }
  fprintf(stderr, "\n");
  return EXIT_USAGE;
}

/* Copies of n io descriptions with axis 0 of those flagged batched scaled to a batch of
   `samples` (dims and bytes); NULL when out of memory. free_descs frees them. */
static kiln_io_desc *batched_descs(const kiln_io_desc *d, int32_t n, const int32_t *batched, int64_t samples) {
  kiln_io_desc *out = calloc((size_t)(n > 0 ? n : 1), sizeof *out);
  for (int32_t i = 0; out && i < n; i++) {
    out[i] = d[i];
    out[i].dims = NULL;
    int64_t *dims = calloc((size_t)(d[i].rank > 0 ? d[i].rank : 1), sizeof *dims);
    if (!dims) {
      for (int32_t k = 0; k < i; k++) free((void *)out[k].dims);
      free(out);
      return NULL;
    }
    for (int32_t k = 0; k < d[i].rank; k++) dims[k] = d[i].dims[k];
    if (batched && batched[i] && d[i].rank > 0) {
      dims[0] *= samples;
      out[i].bytes *= samples;
    }
    out[i].dims = dims;
  }
  return out;
}

static void free_descs(kiln_io_desc *d, int32_t n) {
  for (int32_t i = 0; d && i < n; i++) free((void *)d[i].dims);
  free(d);
}

static int parse_count(const char *s, long min, long max, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < min || v > max) return -1;
  *out = v;
  return 0;
}

/* kiln run's output file name: characters outside [A-Za-z0-9._-] become '_' (one per Unicode
   character, so a UTF-8 sequence gives one '_'). */
static char *output_file_name(const char *dir, const char *name) {
  size_t dl = strlen(dir), nl = strlen(name);
  char *path = malloc(dl + nl + 6);
  if (!path) return NULL;
  memcpy(path, dir, dl);
  size_t k = dl;
  if (dl > 0 && dir[dl - 1] != '/') path[k++] = '/';
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
    unsigned char c = *p;
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
        c == '_' || c == '-')
      path[k++] = (char)c;
    else if ((c & 0xc0) != 0x80)
      path[k++] = '_';
  }
  memcpy(path + k, ".npy", 5);
  return path;
}

/* mkdir -p */
static int make_dirs(const char *dir, char *err, size_t errlen) {
  size_t n = strlen(dir);
  char *p = malloc(n + 1);
  if (!p) return -1;
  memcpy(p, dir, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (p[i] != '/' && p[i] != 0) continue;
    char saved = p[i];
    p[i] = 0;
    if (mkdir(p, 0777) != 0 && errno != EEXIST) {
      snprintf(err, errlen, "cannot create %s: %s", p, strerror(errno));
      free(p);
      return -1;
    }
    p[i] = saved;
  }
  free(p);
  struct stat st;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    snprintf(err, errlen, "cannot create %s: not a directory", dir);
    return -1;
  }
  return 0;
}

/* Rust's f64 formatting as kiln run uses it: integers without a fraction, others with six
   decimals. */
static void format_value(char *buf, size_t len, double x) {
  if (isnan(x))
    snprintf(buf, len, "NaN");
  else if (isinf(x))
    snprintf(buf, len, x > 0 ? "inf" : "-inf");
  else if (x == trunc(x) && fabs(x) < 1e15)
    snprintf(buf, len, "%.0f", x);
  else
    snprintf(buf, len, "%.6f", x);
}

/* "f32[1,1000] [0.1, 0.2, ...]  min .. max .. mean ..", as kiln run prints an output. */
static void summarize(FILE *out, const kiln_io_desc *d, const void *data) {
  int64_t esize = kiln_stub_dtype_size(d->dtype);
  int64_t n = esize ? d->bytes / esize : 0;
  char v[64];
  put_printable(out, d->name);
  fputs(": ", out);
  print_type(out, d);
  fprintf(out, " [");
  for (int64_t i = 0; i < n && i < 6; i++) {
    format_value(v, sizeof v, kiln_stub_element_f64(d->dtype, data, i));
    fprintf(out, "%s%s", i ? ", " : "", v);
  }
  fprintf(out, "%s]", n > 6 ? ", ..." : "");
  if (n > 1) {
    double mn = INFINITY, mx = -INFINITY, sum = 0;
    int64_t finite = 0;
    for (int64_t i = 0; i < n; i++) {
      double x = kiln_stub_element_f64(d->dtype, data, i);
      if (!isfinite(x)) continue;
      mn = x < mn ? x : mn;
      mx = x > mx ? x : mx;
      sum += x;
      finite++;
    }
    if (finite > 0) {
      format_value(v, sizeof v, mn);
      fprintf(out, "  min %s", v);
      format_value(v, sizeof v, mx);
      fprintf(out, " max %s", v);
      format_value(v, sizeof v, sum / (double)finite);
      fprintf(out, " mean %s", v);
    }
  }
  fprintf(out, "\n");
}

/* --weights FILE (or --weights=FILE), taken out of argv before the other options are parsed.
   Returns 0, or EXIT_USAGE after printing why. */
static int take_weights_option(int *argc, char **argv, const char **path) {
  int out = 1;
  for (int a = 1; a < *argc; a++) {
    const char *arg = argv[a];
    if (strcmp(arg, "--weights") == 0) {
      if (a + 1 >= *argc) {
        fprintf(stderr, "error: missing value after --weights\n");
        return EXIT_USAGE;
      }
      *path = argv[++a];
    } else if (strncmp(arg, "--weights=", 10) == 0) {
      *path = arg + 10;
    } else {
      argv[out++] = argv[a];
    }
  }
  *argc = out;
  return 0;
}

/* A context with the model's weights: built in, or from --weights / the default file. Prints
   why on failure. */
static kiln_ctx *create_context(const kiln_model_desc *desc, int32_t threads, int32_t device,
                                const char *weights_path, int *rc) {
  char found[4096], err[1024];
  kiln_ctx *ctx;
  if (!desc->weights) {
    if (weights_path) {
      fprintf(stderr, "error: --weights: this program has its weights built in (compiled without "
                      "--weights-out)\n");
      *rc = EXIT_USAGE;
      return NULL;
    }
  } else if (!weights_path) {
    if (kiln_rt_find_weights(desc, found, sizeof found, err, sizeof err) != 0) {
      print_error(err);
      return NULL;
    }
    weights_path = found;
  }
  /* --device: only through the descriptor, as kiln_rt_create reaches the CUDA runtime. */
  if (desc->cuda && device >= 0)
    ctx = desc->cuda->create(desc, device, weights_path);
  else
    ctx = kiln_rt_create_with_weights(desc, threads, weights_path);
  if (!ctx) print_error(kiln_rt_create_error());
  return ctx;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void *alloc_tensor(int64_t bytes) {
  void *p = NULL;
  /* Zero-size tensors still get a distinct, aligned pointer. */
  size_t n = (size_t)((bytes + 63) & ~(int64_t)63);
  if (posix_memalign(&p, 64, n ? n : 64) != 0) return NULL;
  return p;
}

int kiln_exe_main(int argc, char **argv, const kiln_model_desc *desc) {
  const char *prog = argc > 0 && argv[0] ? argv[0] : desc->name;
  const char *output_dir = NULL;
  long bench = 0, threads = 0, profile_top = 15, device = -1;
  const char *profile = NULL;
  int quiet = 0;
  int32_t n_in = desc->n_inputs, n_out = desc->n_outputs;
  const char **files = calloc((size_t)(n_in > 0 ? n_in : 1), sizeof *files);
  void **ins = calloc((size_t)(n_in > 0 ? n_in : 1), sizeof *ins);
  void **outs = calloc((size_t)(n_out > 0 ? n_out : 1), sizeof *outs);
  kiln_io_desc *in_desc = NULL, *out_desc = NULL;
  kiln_ctx *ctx = NULL;
  int rc = EXIT_RUNTIME;
  if (!files || !ins || !outs) {
    fprintf(stderr, "error: out of memory\n");
    goto done;
  }
  const char *weights_path = NULL;
  if (take_weights_option(&argc, argv, &weights_path) != 0) {
    rc = EXIT_USAGE;
    goto done;
  }

  for (int a = 1; a < argc; a++) {
    const char *arg = argv[a];
    const char *val = NULL;
    /* Options with a value take it from "--opt=VALUE" or the next argument. */
    const char *long_opts[] = {"--input",   "--output-dir",  "--bench", "--threads",
                               "--profile", "--profile-top", "--device"};
    const char *short_opts[] = {"-i", "-o", NULL, "-t", NULL, NULL, NULL};
    int which = -1;
    for (int k = 0; k < 7; k++) {
      size_t l = strlen(long_opts[k]);
      if (strncmp(arg, long_opts[k], l) == 0 && (arg[l] == 0 || arg[l] == '=')) {
        which = k;
        val = arg[l] == '=' ? arg + l + 1 : NULL;
      } else if (short_opts[k] && strcmp(arg, short_opts[k]) == 0) {
        which = k;
      }
    }
    if (which >= 0 && !val) {
      if (a + 1 >= argc) {
        rc = usage_error(desc, "missing value after ", arg, 0);
        goto done;
      }
      val = argv[++a];
    }
    if (which == 0) {
      const char *eq = strchr(val, '=');
      int32_t idx = -1;
      const char *file = NULL;
      if (eq) {
        for (int32_t i = 0; i < n_in; i++) {
          size_t l = strlen(desc->inputs[i].name);
          if ((size_t)(eq - val) == l && strncmp(val, desc->inputs[i].name, l) == 0) idx = i;
        }
        file = eq + 1;
      }
      if (idx < 0 && n_in == 1 && (!eq || access(val, F_OK) == 0)) {
        idx = 0;
        file = val;
      }
      if (idx < 0) {
        char msg[512];
        if (eq) {
          snprintf(msg, sizeof msg, "the model has no input '%.*s'", (int)(eq - val), val);
          rc = usage_error(desc, msg, NULL, 1);
        } else {
          snprintf(msg, sizeof msg, "--input '%s': expected NAME=FILE", val);
          rc = usage_error(desc, msg, NULL, 1);
        }
        goto done;
      }
      if (files[idx]) {
        char msg[512];
        snprintf(msg, sizeof msg, "input '%s' is given twice", desc->inputs[idx].name);
        rc = usage_error(desc, msg, NULL, 0);
        goto done;
      }
      files[idx] = file;
    } else if (which == 1) {
      output_dir = val;
    } else if (which == 2) {
      if (parse_count(val, 1, 1000000000, &bench) != 0) {
        rc = usage_error(desc, "--bench expects a number of runs >= 1, got ", val, 0);
        goto done;
      }
    } else if (which == 3) {
      if (parse_count(val, 0, 1 << 20, &threads) != 0) {
        rc = usage_error(desc, "--threads expects a number >= 0 (0: one per CPU), got ", val, 0);
        goto done;
      }
    } else if (which == 4) {
      profile = val;
    } else if (which == 5) {
      if (parse_count(val, 0, 1 << 30, &profile_top) != 0) {
        rc = usage_error(desc, "--profile-top expects a number of kernels >= 0 (0: all), got ", val, 0);
        goto done;
      }
    } else if (which == 6) {
      if (!desc->cuda) {
        fprintf(stderr, "error: --device applies to models compiled with --target cuda; this program "
                        "runs on the CPU (%s)\n",
                desc->target_triple);
        rc = EXIT_USAGE;
        goto done;
      }
      if (parse_count(val, 0, 1 << 20, &device) != 0) {
        rc = usage_error(desc, "--device expects a CUDA device number >= 0, got ", val, 0);
        goto done;
      }
    } else if (strcmp(arg, "--info") == 0) {
      printf("%s\n", desc->signature_json);
      rc = 0;
      goto done;
    } else if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      usage(stdout, prog, desc);
      rc = 0;
      goto done;
    } else if (strcmp(arg, "--version") == 0 || strcmp(arg, "-V") == 0) {
      char target[64];
      printf("%s (compiled by kiln %s for %s%s%s)\n", desc->name, desc->kiln_version,
             target_name(desc, target, sizeof target),
             desc->cpu_features && *desc->cpu_features ? ", CPU features " : "",
             desc->cpu_features ? desc->cpu_features : "");
      rc = 0;
      goto done;
    } else if (strcmp(arg, "--quiet") == 0 || strcmp(arg, "-q") == 0) {
      quiet = 1;
    } else {
      fprintf(stderr, "error: unexpected argument '%s'%s (run %s --help for usage)\n", arg,
              arg[0] != '-' ? "; inputs are given as --input NAME=FILE.npy" : "", prog);
      rc = EXIT_USAGE;
      goto done;
    }
  }
  {
    char missing[1024];
    size_t k = 0;
    missing[0] = 0;
    for (int32_t i = 0; i < n_in; i++) {
      if (files[i] || k >= sizeof missing) continue;
      int w = snprintf(missing + k, sizeof missing - k, "%s%s", k ? ", " : "", desc->inputs[i].name);
      if (w > 0) k += (size_t)w;
    }
    if (k > 0) {
      rc = usage_error(desc, "missing --input for ", missing, 1);
      goto done;
    }
  }

  char err[1536];
  /* With a batch range, the batch of this run: the samples on axis 0 of the batched inputs'
     files, the same in all. in_desc/out_desc are the inputs and outputs at that batch. */
  const kiln_batch_desc *batch = desc->batch;
  int64_t samples = 1;
  int32_t samples_from = -1;
  for (int32_t i = 0; batch && i < n_in; i++) {
    int64_t n = 0;
    if (!batch->inputs[i]) continue;
    if (kiln_npy_batch(files[i], &desc->inputs[i], batch->lo, batch->hi, &n, err, sizeof err) != 0) {
      print_error(err);
      rc = EXIT_USAGE;
      goto done;
    }
    if (samples_from >= 0 && n != samples) {
      snprintf(err, sizeof err, "inputs '%s' and '%s' have different batch sizes (%lld and %lld)",
               desc->inputs[samples_from].name, desc->inputs[i].name, (long long)samples, (long long)n);
      print_error(err);
      rc = EXIT_USAGE;
      goto done;
    }
    samples = n;
    samples_from = i;
  }
  in_desc = batched_descs(desc->inputs, n_in, batch ? batch->inputs : NULL, samples);
  out_desc = batched_descs(desc->outputs, n_out, batch ? batch->outputs : NULL, samples);
  if (!in_desc || !out_desc) {
    fprintf(stderr, "error: out of memory\n");
    goto done;
  }
  /* Every input file is checked (header, type, size) before the context and the input buffers are
     allocated: a small file claiming a huge shape is refused as such, not as an allocation
     failure. */
  for (int32_t i = 0; i < n_in; i++) {
    if (kiln_npy_check(files[i], &in_desc[i], err, sizeof err) != 0) {
      print_error(err);
      rc = EXIT_USAGE;
      goto done;
    }
  }
  ctx = create_context(desc, (int32_t)threads, (int32_t)device, weights_path, &rc);
  if (!ctx) goto done;
  for (int32_t i = 0; i < n_in; i++) {
    ins[i] = alloc_tensor(in_desc[i].bytes);
    if (!ins[i]) {
      fputs("error: out of memory for input '", stderr);
      put_printable(stderr, desc->inputs[i].name);
      fputs("'\n", stderr);
      goto done;
    }
    if (kiln_npy_read(files[i], &in_desc[i], ins[i], err, sizeof err) != 0) {
      print_error(err);
      rc = EXIT_USAGE;
      goto done;
    }
  }
  for (int32_t i = 0; i < n_out; i++) {
    outs[i] = alloc_tensor(out_desc[i].bytes);
    if (!outs[i]) {
      fputs("error: out of memory for output '", stderr);
      put_printable(stderr, desc->outputs[i].name);
      fputs("'\n", stderr);
      goto done;
    }
  }
  if (output_dir && make_dirs(output_dir, err, sizeof err) != 0) {
    print_error(err);
    rc = EXIT_USAGE;
    goto done;
  }

  double elapsed = 0;
  double *times = NULL;
  for (long r = bench > 0 ? -1 : 0; r < (bench > 0 ? bench : 1); r++) {
    /* The warm-up run is not profiled. */
    if (profile && r == 0 && kiln_rt_profile_enable(ctx, 1) != 0) {
      print_error(kiln_rt_last_error(ctx));
      free(times);
      goto done;
    }
    double t0 = now_ms();
    int32_t run_rc = batch ? kiln_rt_run_batch(ctx, samples, (const void *const *)ins, (void *const *)outs)
                           : desc->run(ctx, (const void *const *)ins, (void *const *)outs);
    if (run_rc != 0) {
      const char *e = kiln_rt_last_error(ctx);
      print_error(e && *e ? e : "the model failed without saying why");
      free(times);
      goto done;
    }
    elapsed = now_ms() - t0;
    if (bench > 0 && r >= 0) {
      if (!times && !(times = malloc((size_t)bench * sizeof *times))) {
        fprintf(stderr, "error: out of memory\n");
        goto done;
      }
      times[r] = elapsed;
    }
  }

  for (int32_t i = 0; i < n_out; i++) {
    /* The shape the run left (an output whose size depends on the data has its actual dims,
       its values first in the buffer). */
    kiln_io_desc shaped = desc->outputs[i];
    shaped.dims = kiln_rt_output_dims(ctx, i);
    shaped.bytes = kiln_rt_output_bytes(ctx, i);
    if (output_dir) {
      char *path = output_file_name(output_dir, desc->outputs[i].name);
      if (!path || kiln_npy_write(path, &shaped, outs[i], err, sizeof err) != 0) {
        print_error(path ? err : "out of memory");
        if (path) rc = EXIT_USAGE;
        free(path);
        free(times);
        goto done;
      }
      free(path);
    }
    if (!quiet) summarize(stdout, &shaped, outs[i]);
  }
  if (profile) {
    kiln_rt_profile_enable(ctx, 0);
    if (kiln_rt_profile_write_trace(ctx, profile) != 0) {
      print_error(kiln_rt_last_error(ctx));
      rc = EXIT_USAGE;
      free(times);
      goto done;
    }
    if (!quiet) {
      kiln_rt_profile_print_top(ctx, (int32_t)profile_top);
      fprintf(stderr, "profile written to %s\n", profile);
    }
  }
  if (bench > 0) {
    qsort(times, (size_t)bench, sizeof *times, cmp_double);
    double median = bench % 2 ? times[bench / 2] : (times[bench / 2 - 1] + times[bench / 2]) / 2;
    char where[192];
    printf("latency: median %.3f ms, min %.3f ms over %ld runs, %s\n", median, times[0], bench,
           where_ran(ctx, where, sizeof where));
    free(times);
  } else if (!quiet) {
    char where[192];
    fprintf(stderr, "run took %.3f ms on %s%s%s\n", elapsed, where_ran(ctx, where, sizeof where),
            output_dir ? ", outputs written to " : "", output_dir ? output_dir : "");
  }
  fflush(stdout);
  rc = ferror(stdout) ? EXIT_RUNTIME : 0;

done:
  kiln_rt_destroy(ctx);
  free_descs(in_desc, n_in);
  free_descs(out_desc, n_out);
  for (int32_t i = 0; ins && i < n_in; i++) free(ins[i]);
  for (int32_t i = 0; outs && i < n_out; i++) free(outs[i]);
  free(files);
  free(ins);
  free(outs);
  return rc;
}
