/* Feeds a fuzzer's bytes to kiln_npy_read, the .npy reader linked into every artifact. The first
   bytes choose what the model expects (dtype, rank, dims), the rest is the file, so that the
   fuzzer can reach the data paths (a matching header) as well as the header errors. The reader
   takes a path: the file lives in a memfd, opened through /proc/self/fd. Also built natively
   (without a fuzzer) by runtime-stub's tests to replay fuzz/regressions/npy_reader/. */
#define _GNU_SOURCE
#include "kiln_npy.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define SPEC_BYTES 8
#define MAX_ELEMS 4096

/* Returns 0 when the reader accepted the file, 1 when it reported an error, -1 when the harness
   itself failed. */
int kiln_fuzz_npy(const uint8_t *data, size_t len) {
  static int fd = -1;
  if (len < SPEC_BYTES) return 1;
  if (fd < 0) {
    fd = memfd_create("kiln_npy_fuzz", 0);
    if (fd < 0) return -1;
  }
  int64_t dims[4];
  kiln_io_desc want = {"x", (int32_t)(data[0] % 13), (int32_t)(data[1] % 5), dims, 0};
  int64_t numel = 1;
  for (int32_t i = 0; i < want.rank; i++) {
    /* Small dims keep the destination buffer small; 0 is a valid dimension. */
    dims[i] = data[2 + i] % 17;
    numel *= dims[i];
  }
  if (numel > MAX_ELEMS) return 1;
  want.bytes = numel * kiln_stub_dtype_size(want.dtype);
  const uint8_t *file = data + SPEC_BYTES;
  size_t flen = len - SPEC_BYTES;
  if (ftruncate(fd, 0) != 0 || pwrite(fd, file, flen, 0) != (ssize_t)flen) return -1;
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  /* Exactly the tensor's bytes, so ASan flags any write past it. */
  void *dst = malloc(want.bytes > 0 ? (size_t)want.bytes : 1);
  if (!dst) return -1;
  char err[1024];
  err[0] = 0;
  int rc = kiln_npy_read(path, &want, dst, err, sizeof err);
  if (rc != 0 && (err[0] == 0 || strchr(err, '\n'))) abort(); /* errors are one non-empty line */
  if (rc == 0 && want.dtype == KILN_BOOL)
    for (int64_t i = 0; i < want.bytes; i++)
      if (((uint8_t *)dst)[i] > 1) abort();
  free(dst);
  return rc == 0 ? 0 : 1;
}

#ifdef KILN_NPY_REPLAY
/* Replays saved inputs (crashers, corpus samples): npy_replay FILE... Prints "FILE: accepted" or
   "FILE: rejected" per file; a crash or sanitizer report is the failure. */
int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    FILE *f = fopen(argv[i], "rb");
    if (!f) {
      fprintf(stderr, "cannot open %s\n", argv[i]);
      return 2;
    }
    static uint8_t buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    int rc = kiln_fuzz_npy(buf, n);
    if (rc < 0) {
      fprintf(stderr, "%s: the harness failed\n", argv[i]);
      return 2;
    }
    printf("%s: %s\n", argv[i], rc == 0 ? "accepted" : "rejected");
  }
  return 0;
}
#endif
