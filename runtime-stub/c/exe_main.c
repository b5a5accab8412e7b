/* The executable entry of a compiled model. */
#define _GNU_SOURCE
#include "kiln_rt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kiln_exe_main(int argc, char **argv, const kiln_model_desc *desc) {
  (void)argc;
  (void)argv;
  kiln_ctx *ctx = kiln_rt_create(desc, 0);
  if (!ctx) {
    fprintf(stderr, "error: %s\n", kiln_rt_create_error());
    return 1;
  }
  printf("%s\n", desc->signature_json);
  kiln_rt_destroy(ctx);
  return 0;
}
