/* CPU variants of a portable artifact (`kiln compile --cpu portable`): the generated code
   carries one complete model description per variant (x86-64-v3, x86-64-v4, ...), baseline
   first, and asks here which one a new context runs. The choice is made once per context, by
   CPUID, so the kernels themselves carry no dispatch. */
#include "kiln_cuda.h" /* kiln_rt_set_create_error */
#include "kiln_rt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
int kiln_rt_x86_has(const char *name); /* runtime.c */
#endif

/* Whether this CPU has every feature of a comma-separated list (as kiln_model_desc's
   cpu_features). A feature this runtime cannot test counts as present, as in the start-up
   check. */
static int cpu_has_all(const char *list) {
  if (!list) return 1;
  const char *p = list;
  while (*p) {
    while (*p == ',') p++;
    const char *start = p;
    while (*p && *p != ',') p++;
    size_t len = (size_t)(p - start);
    char name[64];
    if (len == 0 || len >= sizeof name) continue;
    memcpy(name, start, len);
    name[len] = 0;
#if defined(__x86_64__) || defined(__i386__)
    if (kiln_rt_x86_has(name) == 0) return 0;
#endif
  }
  return 1;
}

const kiln_model_desc *kiln_rt_select_variant(const kiln_model_desc *const *descs,
                                              const char *const *names, int32_t n) {
  if (n <= 0) {
    kiln_rt_set_create_error("bad model description: no CPU variants");
    return NULL;
  }
  /* A testing and diagnostic override: run the named variant whatever the CPU has (a variant
     the CPU cannot run is still refused by the start-up check, naming what is missing). */
  const char *forced = getenv("KILN_CPU_VARIANT");
  if (forced && *forced) {
    char known[256] = "";
    for (int32_t i = 0; i < n; i++) {
      if (strcmp(forced, names[i]) == 0) return descs[i];
      size_t k = strlen(known);
      snprintf(known + k, sizeof known - k, "%s%s", i ? ", " : "", names[i]);
    }
    kiln_rt_set_create_error("KILN_CPU_VARIANT=%s: this artifact carries no such variant (it has %s)",
                             forced, known);
    return NULL;
  }
  for (int32_t i = n - 1; i > 0; i--)
    if (cpu_has_all(descs[i]->cpu_features)) return descs[i];
  /* The baseline, even when this CPU lacks its features: creating the context then fails with
     the message that names them. */
  return descs[0];
}

/* NAME_create of a portable artifact: a context running the variant chosen for this CPU. */
kiln_ctx *kiln_rt_create_variant(const kiln_model_desc *const *descs, const char *const *names,
                                 int32_t n, int32_t num_threads) {
  const kiln_model_desc *desc = kiln_rt_select_variant(descs, names, n);
  return desc ? kiln_rt_create(desc, num_threads) : NULL;
}

/* The executable's exit when no variant can be chosen (the message is the create error). */
int32_t kiln_rt_no_variant_exit(void) {
  fprintf(stderr, "error: %s\n", kiln_rt_create_error());
  return 6; /* a run failure: this CPU cannot run the model (README, "Exit status") */
}
