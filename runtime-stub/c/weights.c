/* Weights outside the binary: maps a build's weights file (kiln compile --weights-out) and
   checks it before a context uses it. The file is safetensors: an 8-byte little-endian header
   length, a JSON header (padded with spaces so the data starts 64-byte aligned), then one U8
   tensor holding the packed weights blob. Its __metadata__ carries kiln.layout_hash (must equal
   the artifact's), kiln.content_hash (XXH64 of the blob) and kiln.bytes. */
#define _GNU_SOURCE
#include "kiln_weights.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define WEIGHTS_ALIGN 64
/* kiln's headers are a few hundred bytes; anything far larger is not one of its files. */
#define MAX_HEADER (1 << 20)

/* ---- XXH64 (the reference algorithm; codegen/src/weights_file.rs has the same) ------------- */

static const uint64_t P1 = 0x9E3779B185EBCA87ull, P2 = 0xC2B2AE3D27D4EB4Full, P3 = 0x165667B19E3779F9ull,
                      P4 = 0x85EBCA77C2B2AE63ull, P5 = 0x27D4EB2F165667C5ull;

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t rd64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}

static inline uint64_t rd32(const unsigned char *p) {
  uint32_t v;
  memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap32(v);
#endif
  return v;
}

static inline uint64_t xround(uint64_t acc, uint64_t lane) { return rotl64(acc + lane * P2, 31) * P1; }

static inline uint64_t xmerge(uint64_t acc, uint64_t v) { return (acc ^ xround(0, v)) * P1 + P4; }

uint64_t kiln_weights_xxh64(const void *data, size_t len, uint64_t seed) {
  const unsigned char *p = data, *end = p + len;
  uint64_t h;
  if (len >= 32) {
    uint64_t v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
    const unsigned char *limit = end - 32;
    do {
      v1 = xround(v1, rd64(p));
      v2 = xround(v2, rd64(p + 8));
      v3 = xround(v3, rd64(p + 16));
      v4 = xround(v4, rd64(p + 24));
      p += 32;
    } while (p <= limit);
    h = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
    h = xmerge(h, v1);
    h = xmerge(h, v2);
    h = xmerge(h, v3);
    h = xmerge(h, v4);
  } else {
    h = seed + P5;
  }
  h += (uint64_t)len;
  for (; end - p >= 8; p += 8) h = rotl64(h ^ xround(0, rd64(p)), 27) * P1 + P4;
  if (end - p >= 4) {
    h = rotl64(h ^ (rd32(p) * P1), 23) * P2 + P3;
    p += 4;
  }
  for (; p < end; p++) h = rotl64(h ^ (*p * P5), 11) * P1;
  h ^= h >> 33;
  h *= P2;
  h ^= h >> 29;
  h *= P3;
  return h ^ (h >> 32);
}

/* ---- the safetensors header: only what kiln writes is looked at -------------------------- */

static const char *skip_ws(const char *p, const char *end) {
  while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
  return p;
}

/* The text after `"key":` in the header, or NULL. */
static const char *find_key(const char *h, size_t n, const char *key) {
  char quoted[64];
  int ql = snprintf(quoted, sizeof quoted, "\"%s\"", key);
  if (ql <= 0 || (size_t)ql >= sizeof quoted) return NULL;
  const char *end = h + n, *p = h;
  while (p < end) {
    const char *at = memmem(p, (size_t)(end - p), quoted, (size_t)ql);
    if (!at) return NULL;
    const char *q = skip_ws(at + ql, end);
    if (q < end && *q == ':') return skip_ws(q + 1, end);
    p = at + 1;
  }
  return NULL;
}

/* Copies the string value of key (no escapes: kiln writes none) into out. Returns 0 or -1. */
static int header_string(const char *h, size_t n, const char *key, char *out, size_t outlen) {
  const char *p = find_key(h, n, key), *end = h + n;
  if (!p || p >= end || *p != '"') return -1;
  p++;
  size_t k = 0;
  for (; p < end && *p != '"'; p++) {
    if (*p == '\\' || k + 1 >= outlen) return -1;
    out[k++] = *p;
  }
  if (p >= end) return -1;
  out[k] = 0;
  return 0;
}

static const char *parse_u64(const char *p, const char *end, uint64_t *v) {
  if (p >= end || *p < '0' || *p > '9') return NULL;
  uint64_t x = 0;
  for (; p < end && *p >= '0' && *p <= '9'; p++) {
    if (x > (UINT64_MAX - 9) / 10) return NULL;
    x = x * 10 + (uint64_t)(*p - '0');
  }
  *v = x;
  return p;
}

/* "data_offsets": [begin, end] of the file's (one) tensor. */
static int header_offsets(const char *h, size_t n, uint64_t *begin, uint64_t *stop) {
  const char *end = h + n, *p = find_key(h, n, "data_offsets");
  if (!p || p >= end || *p != '[') return -1;
  p = parse_u64(skip_ws(p + 1, end), end, begin);
  if (!p) return -1;
  p = skip_ws(p, end);
  if (p >= end || *p != ',') return -1;
  p = parse_u64(skip_ws(p + 1, end), end, stop);
  if (!p) return -1;
  p = skip_ws(p, end);
  return p < end && *p == ']' ? 0 : -1;
}

/* ---- mapping --------------------------------------------------------------------------- */

void kiln_weights_close(kiln_weights_map *m) {
  if (m && m->base) munmap(m->base, m->size);
  if (m) memset(m, 0, sizeof *m);
}

int kiln_weights_open(const kiln_model_desc *desc, const char *path, kiln_weights_map *m, char *err,
                      size_t errlen) {
  memset(m, 0, sizeof *m);
  const kiln_weights_desc *w = desc->weights;
  if (!w) {
    snprintf(err, errlen, "the model '%s' has its weights built in; it takes no weights file", desc->name);
    return -1;
  }
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    snprintf(err, errlen, "cannot open the weights file %s: %s", path, strerror(errno));
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    snprintf(err, errlen, "the weights file %s is not a regular file", path);
    close(fd);
    return -1;
  }
  size_t size = (size_t)st.st_size;
  if (size < 8) {
    snprintf(err, errlen, "the weights file %s is not a safetensors file (%zu bytes)", path, size);
    close(fd);
    return -1;
  }
  /* MAP_POPULATE reads the file in with few faults: the content hash touches every page anyway. */
  void *base = mmap(NULL, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  int map_errno = errno;
  close(fd);
  if (base == MAP_FAILED) {
    snprintf(err, errlen, "cannot map the weights file %s: %s", path, strerror(map_errno));
    return -1;
  }
  m->base = base;
  m->size = size;
  const unsigned char *bytes = base;
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | bytes[i];
  const char *h = (const char *)bytes + 8;
  char file_model[256] = "?", file_version[64] = "?", layout[32], content[32], nbytes[32];
  uint64_t begin = 0, stop = 0;
  if (n > MAX_HEADER || n + 8 > size || n < 2 || h[0] != '{') {
    snprintf(err, errlen,
             "the weights file %s is not a safetensors file or is truncated (header of %llu bytes, file "
             "of %zu)",
             path, (unsigned long long)n, size);
    goto fail;
  }
  if (header_string(h, n, "kiln.layout_hash", layout, sizeof layout) != 0 ||
      header_string(h, n, "kiln.content_hash", content, sizeof content) != 0 ||
      header_string(h, n, "kiln.bytes", nbytes, sizeof nbytes) != 0 || header_offsets(h, n, &begin, &stop) != 0) {
    snprintf(err, errlen,
             "the weights file %s was not written by kiln compile --weights-out (its header lacks "
             "kiln.layout_hash, kiln.content_hash, kiln.bytes or the tensor's data_offsets)",
             path);
    goto fail;
  }
  if (header_string(h, n, "kiln.model", file_model, sizeof file_model) != 0) strcpy(file_model, "?");
  if (header_string(h, n, "kiln.version", file_version, sizeof file_version) != 0) strcpy(file_version, "?");
  if (strcmp(layout, w->layout_hash) != 0) {
    if (strcmp(file_version, desc->kiln_version) != 0)
      snprintf(err, errlen,
               "the weights file %s was written by kiln %s for the model '%s', this artifact by kiln %s "
               "(layout hash %s, this artifact expects %s); recompile or pass the matching file",
               path, file_version, file_model, desc->kiln_version, layout, w->layout_hash);
    else if (strcmp(file_model, desc->name) != 0)
      snprintf(err, errlen,
               "the weights file %s was written for the model '%s', not '%s' (layout hash %s, this "
               "artifact expects %s); recompile or pass the matching file",
               path, file_model, desc->name, layout, w->layout_hash);
    else
      snprintf(err, errlen,
               "the weights file %s was written for another build of the model '%s' (layout hash %s, "
               "this artifact expects %s); recompile or pass the matching file",
               path, desc->name, layout, w->layout_hash);
    goto fail;
  }
  uint64_t data_at = 8 + n + begin;
  if (stop < begin || stop - begin != (uint64_t)w->bytes || strtoull(nbytes, NULL, 10) != (uint64_t)w->bytes) {
    snprintf(err, errlen, "the weights file %s holds %llu bytes of weights, this artifact expects %lld", path,
             (unsigned long long)(stop - begin), (long long)w->bytes);
    goto fail;
  }
  if (data_at % WEIGHTS_ALIGN != 0) {
    snprintf(err, errlen,
             "the weights file %s has its data at file offset %llu, not a multiple of %d (rewritten by "
             "another tool?); write it with kiln compile --weights-out",
             path, (unsigned long long)data_at, WEIGHTS_ALIGN);
    goto fail;
  }
  if (data_at > size || size - data_at < (uint64_t)w->bytes) {
    snprintf(err, errlen, "the weights file %s is truncated: %zu bytes, it should have %llu", path, size,
             (unsigned long long)(data_at + (uint64_t)w->bytes));
    goto fail;
  }
  const void *data = bytes + data_at;
  char actual[32];
  snprintf(actual, sizeof actual, "%016llx",
           (unsigned long long)kiln_weights_xxh64(data, (size_t)w->bytes, 0));
  if (strcmp(actual, content) != 0) {
    snprintf(err, errlen,
             "the weights file %s is corrupt: its weights hash to %s, its header says %s (copy or "
             "write it again)",
             path, actual, content);
    goto fail;
  }
  m->data = data;
  return 0;
fail:
  kiln_weights_close(m);
  return -1;
}

int kiln_rt_find_weights(const kiln_model_desc *desc, char *path, size_t len, char *err, size_t errlen) {
  if (!desc->weights) {
    snprintf(err, errlen, "the model '%s' has its weights built in", desc->name);
    return -1;
  }
  const char *name = desc->weights->file_name;
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  char dir[PATH_MAX] = "";
  if (n > 0) {
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) {
      *slash = 0;
      snprintf(dir, sizeof dir, "%s", exe[0] ? exe : "/");
      int w = snprintf(path, len, "%s/%s", dir, name);
      if (w > 0 && (size_t)w < len && access(path, F_OK) == 0) return 0;
    }
  }
  int w = snprintf(path, len, "%s", name);
  if (w > 0 && (size_t)w < len && access(path, F_OK) == 0) return 0;
  snprintf(err, errlen,
           "cannot find the weights file %s next to the executable%s%s%s or in the current directory; "
           "pass --weights FILE",
           name, dir[0] ? " (" : "", dir, dir[0] ? ")" : "");
  return -1;
}
