/* Internal to the runtime stub: the weights file mapping of a context (weights.c). */
#ifndef KILN_WEIGHTS_H
#define KILN_WEIGHTS_H

#include "kiln_rt.h"

typedef struct kiln_weights_map {
  void *base;       /* the whole file, mapped read-only; NULL when nothing is mapped */
  size_t size;
  const void *data; /* the blob inside it, 64-byte aligned */
} kiln_weights_map;

/* Maps and checks the weights file at path for desc (desc->weights must be set). Returns 0, or
   -1 with a one-line message in err and nothing mapped. */
int kiln_weights_open(const kiln_model_desc *desc, const char *path, kiln_weights_map *m, char *err,
                      size_t errlen);
/* Unmaps (a zeroed map is fine). */
void kiln_weights_close(kiln_weights_map *m);
/* XXH64 of data, the content hash of the file (the compiler computes the same). */
uint64_t kiln_weights_xxh64(const void *data, size_t len, uint64_t seed);

#endif
