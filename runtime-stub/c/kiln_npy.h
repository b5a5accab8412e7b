/* .npy reading and writing for the executable entry (npy.c); private to the runtime stub. */
#ifndef KILN_NPY_H
#define KILN_NPY_H

#include "kiln_rt.h"

#include <stddef.h>
#include <stdint.h>

/* kiln's short dtype name (the IR's: "f32", "i64", "bool", ...), "?" for a bad code. */
const char *kiln_stub_dtype_name(int32_t dtype);
/* Bytes per element, 0 for a bad code. */
int64_t kiln_stub_dtype_size(int32_t dtype);
/* Writes "f32[1,3,224,224]" into buf. */
void kiln_stub_format_type(char *buf, size_t len, int32_t dtype, int32_t rank, const int64_t *dims);
/* One element as a double (f16/bf16 decoded, bool as 0/1). */
double kiln_stub_element_f64(int32_t dtype, const void *data, int64_t i);

/* Reads the .npy file at path into dst (want->bytes bytes), checking that its dtype and shape are
   want's. A bf16 input is read from a float32 file (kiln writes bf16 outputs as float32, numpy
   has no bf16) and rounded to nearest even. Returns 0, or -1 with a message in err that names
   the input and the file. */
int kiln_npy_read(const char *path, const kiln_io_desc *want, void *dst, char *err, size_t errlen);

/* Checks the .npy file at path as kiln_npy_read does, without reading the data: header, dtype,
   shape, and the file's size against the size the header implies (before anything of that size
   is allocated). Returns 0, or -1 with kiln_npy_read's message in err. */
int kiln_npy_check(const char *path, const kiln_io_desc *want, char *err, size_t errlen);

/* kiln_npy_check for an input with a batch range: axis 0 of the file may hold n samples of
   want->dims[0] rows, lo <= n <= hi, the other dims want's. Sets *samples to n. */
int kiln_npy_batch(const char *path, const kiln_io_desc *want, int64_t lo, int64_t hi, int64_t *samples,
                   char *err, size_t errlen);

/* Writes data (shaped and typed as d) as a .npy v1.0 file; bf16 becomes float32, as kiln does.
   Returns 0, or -1 with a message in err. */
int kiln_npy_write(const char *path, const kiln_io_desc *d, const void *data, char *err, size_t errlen);

#endif
