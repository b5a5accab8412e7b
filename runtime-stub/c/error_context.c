/* Naming the failing node in run-time errors. */
#include "kiln_rt.h"

#include <string.h>

void kiln_rt_error_context(kiln_ctx *ctx, const char *node, const char *op) {
  char cause[512];
  strncpy(cause, kiln_rt_last_error(ctx), sizeof cause - 1);
  cause[sizeof cause - 1] = 0;
  kiln_rt_set_error(ctx, "node '%s' (%s): %s", node, op, cause[0] ? cause : "kernel failed");
}
