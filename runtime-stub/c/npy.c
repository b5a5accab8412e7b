/* .npy reading and writing for the executable entry (NumPy format 1.0/2.0/3.0, C order,
   little-endian), compatible with kiln's own reader and writer (frontend/src/npy.rs). */
#define _GNU_SOURCE
#include "kiln_npy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Headers this long are not arrays of the 13 dtypes (numpy itself refuses 10000 bytes by
   default); the cap keeps a corrupt length from making us allocate gigabytes. kiln's Rust reader
   (frontend/src/npy.rs) has the same limit, so that both accept and refuse the same files. */
#define NPY_MAX_HEADER (64 << 10)
#define NPY_MAX_RANK 64

static const char *const DTYPE_NAMES[13] = {"bool", "u8",  "i8",  "u16", "i16", "u32", "i32",
                                            "u64",  "i64", "f16", "bf16", "f32", "f64"};
static const int64_t DTYPE_SIZES[13] = {1, 1, 1, 2, 2, 4, 4, 8, 8, 2, 2, 4, 8};
/* numpy descr per dtype (without the byte-order character); bf16 has none. */
static const char *const DTYPE_DESCR[13] = {"b1", "u1", "i1", "u2", "i2", "u4", "i4",
                                            "u8", "i8", "f2", NULL, "f4", "f8"};

const char *kiln_stub_dtype_name(int32_t dtype) {
  return dtype >= 0 && dtype < 13 ? DTYPE_NAMES[dtype] : "?";
}

int64_t kiln_stub_dtype_size(int32_t dtype) { return dtype >= 0 && dtype < 13 ? DTYPE_SIZES[dtype] : 0; }

void kiln_stub_format_type(char *buf, size_t len, int32_t dtype, int32_t rank, const int64_t *dims) {
  size_t k = 0;
  int w = snprintf(buf, len, "%s[", kiln_stub_dtype_name(dtype));
  if (w < 0) return;
  k = (size_t)w;
  for (int32_t i = 0; i < rank && k < len; i++) {
    w = snprintf(buf + k, len - k, i ? ",%lld" : "%lld", (long long)dims[i]);
    if (w < 0) return;
    k += (size_t)w;
  }
  if (k < len) snprintf(buf + k, len - k, "]");
}

static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else { /* subnormal: renormalise */
      int e = -1;
      do {
        man <<= 1;
        e++;
      } while (!(man & 0x400));
      bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static float bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static uint16_t f32_to_bf16(float f) { /* round to nearest even; NaN stays NaN */
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

double kiln_stub_element_f64(int32_t dtype, const void *data, int64_t i) {
  switch (dtype) {
  case KILN_BOOL: return ((const uint8_t *)data)[i] != 0;
  case KILN_U8: return ((const uint8_t *)data)[i];
  case KILN_I8: return ((const int8_t *)data)[i];
  case KILN_U16: return ((const uint16_t *)data)[i];
  case KILN_I16: return ((const int16_t *)data)[i];
  case KILN_U32: return ((const uint32_t *)data)[i];
  case KILN_I32: return ((const int32_t *)data)[i];
  case KILN_U64: return (double)((const uint64_t *)data)[i];
  case KILN_I64: return (double)((const int64_t *)data)[i];
  case KILN_F16: return f16_to_f32(((const uint16_t *)data)[i]);
  case KILN_BF16: return bf16_to_f32(((const uint16_t *)data)[i]);
  case KILN_F32: return ((const float *)data)[i];
  case KILN_F64: return ((const double *)data)[i];
  default: return 0;
  }
}

/* ---- header parsing: the Python dict literal numpy writes ------------------------------------ */

typedef struct {
  const char *p, *end;
} cursor;

static void skip_ws(cursor *c) {
  while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static int eat(cursor *c, char ch) {
  skip_ws(c);
  if (c->p < c->end && *c->p == ch) {
    c->p++;
    return 1;
  }
  return 0;
}

/* A quoted string ('...' or "..."); copies up to cap-1 bytes into out. */
static int parse_str(cursor *c, char *out, size_t cap) {
  skip_ws(c);
  if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return 0;
  char q = *c->p++;
  size_t n = 0;
  while (c->p < c->end && *c->p != q) {
    /* The text may end up in an error message: keep it printable. */
    unsigned char ch = (unsigned char)*c->p;
    if (n + 1 < cap) out[n++] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
    c->p++;
  }
  if (c->p >= c->end) return 0;
  c->p++;
  out[n] = 0;
  return 1;
}

static int starts(cursor *c, const char *word) {
  size_t n = strlen(word);
  if ((size_t)(c->end - c->p) >= n && memcmp(c->p, word, n) == 0) {
    c->p += n;
    return 1;
  }
  return 0;
}

/* Fills *dtype from a descr string; returns 0, or -1 with why in msg. */
static int dtype_from_descr(const char *d, int32_t *dtype, char *msg, size_t len) {
  char order = '|';
  const char *code = d;
  if (*d == '<' || *d == '>' || *d == '|' || *d == '=') {
    order = *d == '=' ? '<' : *d;
    code = d + 1;
  }
  if (strcmp(code, "?") == 0) code = "b1";
  for (int32_t t = 0; t < 13; t++) {
    if (!DTYPE_DESCR[t] || strcmp(DTYPE_DESCR[t], code) != 0) continue;
    if (order == '>' && DTYPE_SIZES[t] > 1) {
      snprintf(msg, len, "big-endian arrays ('%s') are not supported; save with arr.astype('<%s')", d,
               code);
      return -1;
    }
    *dtype = t;
    return 0;
  }
  snprintf(msg, len, "unsupported dtype '%s'", d);
  return -1;
}

typedef struct {
  int32_t dtype;
  int32_t rank;
  int64_t dims[NPY_MAX_RANK];
} npy_header;

/* Parses "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 3), }". */
static int parse_header(const char *text, size_t n, npy_header *h, char *msg, size_t len) {
  cursor c = {text, text + n};
  int have_descr = 0, have_fortran = 0, have_shape = 0;
  if (!eat(&c, '{')) {
    snprintf(msg, len, "the header is not a Python dict");
    return -1;
  }
  for (;;) {
    if (eat(&c, '}')) break;
    char key[32];
    if (!parse_str(&c, key, sizeof key) || !eat(&c, ':')) {
      snprintf(msg, len, "malformed header");
      return -1;
    }
    skip_ws(&c);
    /* A repeated key would leave which value counts to the parser (Python keeps the last): refuse
       it, as kiln's Rust reader does. */
    if ((strcmp(key, "descr") == 0 && have_descr) || (strcmp(key, "fortran_order") == 0 && have_fortran) ||
        (strcmp(key, "shape") == 0 && have_shape)) {
      snprintf(msg, len, "duplicate header key '%s'", key);
      return -1;
    }
    if (strcmp(key, "descr") == 0) {
      char d[32];
      if (!parse_str(&c, d, sizeof d)) {
        snprintf(msg, len, "structured arrays are not supported (descr is not a simple type)");
        return -1;
      }
      if (dtype_from_descr(d, &h->dtype, msg, len) != 0) return -1;
      have_descr = 1;
    } else if (strcmp(key, "fortran_order") == 0) {
      if (starts(&c, "True")) {
        snprintf(msg, len, "Fortran-order arrays are not supported; save with np.ascontiguousarray");
        return -1;
      }
      if (!starts(&c, "False")) {
        snprintf(msg, len, "malformed 'fortran_order'");
        return -1;
      }
      have_fortran = 1;
    } else if (strcmp(key, "shape") == 0) {
      if (!eat(&c, '(')) {
        snprintf(msg, len, "malformed 'shape'");
        return -1;
      }
      h->rank = 0;
      for (;;) {
        if (eat(&c, ')')) break;
        skip_ws(&c);
        if (c.p >= c.end || *c.p < '0' || *c.p > '9') {
          snprintf(msg, len, "malformed 'shape'");
          return -1;
        }
        int64_t v = 0;
        while (c.p < c.end && *c.p >= '0' && *c.p <= '9') {
          if (v > (INT64_MAX - 9) / 10) {
            snprintf(msg, len, "a dimension of 'shape' is too large");
            return -1;
          }
          v = v * 10 + (*c.p++ - '0');
        }
        if (c.p < c.end && *c.p == 'L') c.p++; /* Python 2 longs */
        if (h->rank >= NPY_MAX_RANK) {
          snprintf(msg, len, "'shape' has more than %d dimensions", NPY_MAX_RANK);
          return -1;
        }
        h->dims[h->rank++] = v;
        if (!eat(&c, ',')) {
          if (!eat(&c, ')')) {
            snprintf(msg, len, "malformed 'shape'");
            return -1;
          }
          break;
        }
      }
      have_shape = 1;
    } else {
      snprintf(msg, len, "unexpected header key '%s'", key);
      return -1;
    }
    if (!eat(&c, ',')) {
      if (!eat(&c, '}')) {
        snprintf(msg, len, "malformed header");
        return -1;
      }
      break;
    }
  }
  if (!have_descr || !have_fortran || !have_shape) {
    snprintf(msg, len, "the header has no '%s'",
             !have_descr ? "descr" : !have_fortran ? "fortran_order" : "shape");
    return -1;
  }
  return 0;
}

/* ---- reading ------------------------------------------------------------------------------- */

/* Opens path and checks everything but the data itself: the header, the dtype and shape against
   want, and (for a regular file) the file's size against the bytes the header implies, so that
   a file claiming a huge shape is refused before anything that large is allocated. Returns the
   file positioned at the data, or NULL with a message in err. */
static FILE *open_checked(const char *path, const kiln_io_desc *want, const int64_t *batch, int64_t *samples,
                          char *err, size_t errlen) {
  char msg[256] = "";
  char *header = NULL;
  int ok = 0;
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "input '%s': cannot read %s: %s", want->name, path, strerror(errno));
    return NULL;
  }
#define FAIL(...)                                                                                  \
  do {                                                                                             \
    snprintf(msg, sizeof msg, __VA_ARGS__);                                                        \
    goto bad_file;                                                                                 \
  } while (0)
  unsigned char pre[12];
  size_t got = fread(pre, 1, 10, f);
  if (got < 6 || memcmp(pre, "\x93NUMPY", 6) != 0) FAIL("missing the \\x93NUMPY magic");
  if (got < 10) FAIL("truncated header");
  uint64_t header_len;
  if (pre[6] == 1) {
    header_len = (uint64_t)pre[8] | (uint64_t)pre[9] << 8;
  } else if (pre[6] == 2 || pre[6] == 3) {
    if (fread(pre + 10, 1, 2, f) != 2) FAIL("truncated header");
    header_len = (uint64_t)pre[8] | (uint64_t)pre[9] << 8 | (uint64_t)pre[10] << 16 | (uint64_t)pre[11] << 24;
  } else {
    FAIL("unsupported format version %d.%d", pre[6], pre[7]);
  }
  if (header_len > NPY_MAX_HEADER) FAIL("header of %llu bytes is too long", (unsigned long long)header_len);
  header = malloc(header_len + 1);
  if (!header) FAIL("out of memory");
  if (fread(header, 1, header_len, f) != header_len) FAIL("truncated header");
  header[header_len] = 0;
  npy_header h;
  if (parse_header(header, header_len, &h, msg, sizeof msg) != 0) goto bad_file;

  /* The file's dtype must be the input's; bf16 inputs come as float32 (numpy has no bf16). */
  int32_t file_dtype = want->dtype == KILN_BF16 ? KILN_F32 : want->dtype;
  /* With a batch range, axis 0 holds n samples of want->dims[0] rows, n in batch[0]..batch[1]. */
  int batched = batch && want->rank > 0 && want->dims[0] > 0;
  int shape_ok = h.rank == want->rank;
  for (int32_t i = batched ? 1 : 0; shape_ok && i < h.rank; i++) shape_ok = h.dims[i] == want->dims[i];
  if (shape_ok && batched) {
    int64_t n = h.dims[0] / want->dims[0];
    shape_ok = h.dims[0] % want->dims[0] == 0 && n >= batch[0] && n <= batch[1];
    if (samples) *samples = n;
  }
  if (h.dtype != file_dtype || !shape_ok) {
    char exp[512], have[512];
    kiln_stub_format_type(exp, sizeof exp, want->dtype, want->rank, want->dims);
    if (batched && want->dims[0] == 1) {
      /* "f32[1..8,3,224,224]": the range in place of the per-sample 1. */
      char rest[480];
      const char *tail = strchr(exp, ',');
      snprintf(rest, sizeof rest, "%s", tail ? tail : "]");
      snprintf(exp, sizeof exp, "%s[%lld..%lld%s", kiln_stub_dtype_name(want->dtype), (long long)batch[0],
               (long long)batch[1], rest);
    }
    kiln_stub_format_type(have, sizeof have, h.dtype, h.rank, h.dims);
    snprintf(err, errlen, "input '%s': expected %s%s, got %s in %s", want->name, exp,
             want->dtype == KILN_BF16 ? " (as a float32 .npy)" : "", have, path);
    goto out;
  }
  /* The shape is the model's (or a batch of it), whose byte size is known; numel comes from it. */
  int64_t numel = 1;
  for (int32_t i = 0; i < h.rank; i++) numel *= h.dims[i];
  int64_t file_bytes = numel * kiln_stub_dtype_size(file_dtype);
  struct stat st;
  long data_at = ftell(f);
  if (data_at >= 0 && fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode)) {
    int64_t have = (int64_t)st.st_size - data_at;
    if (have < file_bytes)
      FAIL("truncated data: %s needs %lld bytes, the file has %lld", kiln_stub_dtype_name(file_dtype),
           (long long)file_bytes, (long long)(have > 0 ? have : 0));
    if (have > file_bytes) FAIL("%lld bytes of trailing data after the array", (long long)(have - file_bytes));
  }
  ok = 1;
  goto out;
bad_file:
  snprintf(err, errlen, "input '%s': %s is not a valid .npy file: %s", want->name, path, msg);
out:
#undef FAIL
  free(header);
  if (!ok) {
    fclose(f);
    return NULL;
  }
  return f;
}

int kiln_npy_check(const char *path, const kiln_io_desc *want, char *err, size_t errlen) {
  FILE *f = open_checked(path, want, NULL, NULL, err, errlen);
  if (!f) return -1;
  fclose(f);
  return 0;
}

int kiln_npy_batch(const char *path, const kiln_io_desc *want, int64_t lo, int64_t hi, int64_t *samples,
                   char *err, size_t errlen) {
  const int64_t range[2] = {lo, hi};
  FILE *f = open_checked(path, want, range, samples, err, errlen);
  if (!f) return -1;
  fclose(f);
  return 0;
}

int kiln_npy_read(const char *path, const kiln_io_desc *want, void *dst, char *err, size_t errlen) {
  char msg[256] = "";
  int rc = -1;
  FILE *f = open_checked(path, want, NULL, NULL, err, errlen);
  if (!f) return -1;
#define FAIL(...)                                                                                  \
  do {                                                                                             \
    snprintf(msg, sizeof msg, __VA_ARGS__);                                                        \
    goto bad_file;                                                                                 \
  } while (0)
  /* open_checked compared the size of a regular file; a pipe is checked as it is read. */
  int32_t file_dtype = want->dtype == KILN_BF16 ? KILN_F32 : want->dtype;
  int64_t numel = 1;
  for (int32_t i = 0; i < want->rank; i++) numel *= want->dims[i];
  int64_t file_bytes = numel * kiln_stub_dtype_size(file_dtype);
  if (want->dtype == KILN_BF16) {
    uint16_t *out = dst;
    float buf[1024];
    int64_t done = 0;
    while (done < numel) {
      size_t chunk = (size_t)(numel - done < 1024 ? numel - done : 1024);
      size_t r = fread(buf, 4, chunk, f);
      for (size_t k = 0; k < r; k++) out[done + (int64_t)k] = f32_to_bf16(buf[k]);
      done += (int64_t)r;
      if (r < chunk) {
        FAIL("truncated data: shape needs %lld bytes, the file has %lld", (long long)file_bytes,
             (long long)(done * 4));
      }
    }
  } else {
    size_t r = fread(dst, 1, (size_t)file_bytes, f);
    if ((int64_t)r < file_bytes)
      FAIL("truncated data: %s needs %lld bytes, the file has %lld", kiln_stub_dtype_name(file_dtype),
           (long long)file_bytes, (long long)r);
    if (want->dtype == KILN_BOOL) {
      /* Kernels rely on bools being exactly 0 or 1. */
      uint8_t *b = dst;
      for (int64_t i = 0; i < numel; i++) b[i] = b[i] != 0;
    }
  }
  char extra;
  if (fread(&extra, 1, 1, f) == 1) {
    long long more = 1;
    while (fread(&extra, 1, 1, f) == 1 && more < (1 << 20)) more++;
    FAIL("%s%lld bytes of trailing data after the array", more >= (1 << 20) ? "over " : "", more);
  }
  if (ferror(f)) FAIL("read error: %s", strerror(errno));
  rc = 0;
  goto out;
bad_file:
  snprintf(err, errlen, "input '%s': %s is not a valid .npy file: %s", want->name, path, msg);
out:
#undef FAIL
  fclose(f);
  return rc;
}

/* ---- writing ------------------------------------------------------------------------------- */

int kiln_npy_write(const char *path, const kiln_io_desc *d, const void *data, char *err, size_t errlen) {
  int32_t dtype = d->dtype == KILN_BF16 ? KILN_F32 : d->dtype;
  const char *order = DTYPE_SIZES[dtype] == 1 ? "|" : "<";
  /* 21 characters hold any int64 and its ", " separator. */
  size_t cap = 128 + 24 * (size_t)(d->rank > 0 ? d->rank : 0);
  char *header = malloc(cap + 64);
  if (!header) {
    snprintf(err, errlen, "cannot write %s: out of memory", path);
    return -1;
  }
  int hl = snprintf(header, cap, "{'descr': '%s%s', 'fortran_order': False, 'shape': (", order,
                    DTYPE_DESCR[dtype]);
  for (int32_t i = 0; i < d->rank; i++)
    hl += snprintf(header + hl, cap - (size_t)hl, "%s%lld", i ? ", " : "", (long long)d->dims[i]);
  hl += snprintf(header + hl, cap - (size_t)hl, "%s), }", d->rank == 1 ? "," : "");
  if (hl + 1 > 0xffff) {
    free(header);
    snprintf(err, errlen, "cannot write %s: output '%s' has too many dimensions", path, d->name);
    return -1;
  }
  /* Pad so that the data starts 64-byte aligned, as numpy does. */
  int total = 10 + hl + 1;
  int pad = (64 - total % 64) % 64;
  memset(header + hl, ' ', (size_t)pad);
  hl += pad;
  header[hl++] = '\n';
  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hl & 0xff),
                           (unsigned char)(hl >> 8)};
  FILE *f = fopen(path, "wb");
  if (!f) {
    free(header);
    snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
    return -1;
  }
  int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(header, 1, (size_t)hl, f) == (size_t)hl;
  int64_t numel = d->bytes / kiln_stub_dtype_size(d->dtype);
  if (ok && d->dtype == KILN_BF16) {
    float buf[1024];
    for (int64_t done = 0; ok && done < numel;) {
      size_t chunk = (size_t)(numel - done < 1024 ? numel - done : 1024);
      for (size_t j = 0; j < chunk; j++) buf[j] = bf16_to_f32(((const uint16_t *)data)[done + (int64_t)j]);
      ok = fwrite(buf, 4, chunk, f) == chunk;
      done += (int64_t)chunk;
    }
  } else if (ok && d->bytes > 0) {
    ok = fwrite(data, 1, (size_t)d->bytes, f) == (size_t)d->bytes;
  }
  free(header);
  int saved = errno;
  if (fclose(f) != 0 && ok) {
    ok = 0;
    saved = errno;
  }
  if (!ok) {
    snprintf(err, errlen, "cannot write %s: %s", path, strerror(saved));
    return -1;
  }
  return 0;
}
