/* Micro-kernels for the movement family. See kiln_uk.h for the contract.
 *
 * Pure movement is dtype-generic: elements are copied by size. Shapes, strides and index maps
 * are computed at compile time by codegen/src/uk/movement.rs (which merges contiguous dims
 * first), so these loops only walk what is left. Indices read from runtime inputs are always
 * range-checked before use. */
#include "kiln_uk.h"
#include "kiln_uk_ops.h" /* SC_*, GS_* codes, generated from codegen/src/uk/codes.rs */

typedef int64_t i64;

/* Ranks after dim merging; views (Tile, DepthToSpace) double a rank at most. */
#define MV_MAX_RANK 32
/* Copies smaller than this stay on the calling thread: waking workers costs more. */
#define MV_PAR_BYTES (256 * 1024)
/* Transpose tile edge in elements: 16 x 4 bytes is one cache line per row. */
#define MV_TILE 16

KILN_UK_INLINE void mv_copy_elem(char *d, const char *s, i64 esize) {
  switch (esize) {
  case 1: *(uint8_t *)d = *(const uint8_t *)s; break;
  case 2: *(uint16_t *)d = *(const uint16_t *)s; break;
  case 4: *(uint32_t *)d = *(const uint32_t *)s; break;
  default: *(uint64_t *)d = *(const uint64_t *)s; break;
  }
}

/* n elements from s (byte stride ss) to d (byte stride ds). The switch sits outside the loop
   so each case vectorises on its own. */
KILN_UK_INLINE void mv_copy_row(char *d, i64 ds, const char *s, i64 ss, i64 n, i64 esize) {
  switch (esize) {
  case 1:
    for (i64 j = 0; j < n; j++) *(uint8_t *)(d + j * ds) = *(const uint8_t *)(s + j * ss);
    break;
  case 2:
    for (i64 j = 0; j < n; j++) *(uint16_t *)(d + j * ds) = *(const uint16_t *)(s + j * ss);
    break;
  case 4:
    for (i64 j = 0; j < n; j++) *(uint32_t *)(d + j * ds) = *(const uint32_t *)(s + j * ss);
    break;
  default:
    for (i64 j = 0; j < n; j++) *(uint64_t *)(d + j * ds) = *(const uint64_t *)(s + j * ss);
    break;
  }
}

/* ---------------------------------------------------------------------------------------------
 * Strided copy: Transpose, Slice, Concat, Split, Expand, Tile, DepthToSpace, SpaceToDepth.
 *
 * iattr: [esize, n_copies, then per copy:
 *         src_input, dst_output, src_off, dst_off, block, rank, dims[rank], src_strides[rank],
 *         dst_strides[rank]]
 * Offsets and strides are in bytes (source strides may be negative or 0). Each index of `dims`
 * copies `block` contiguous bytes; when block == esize the innermost dim is an element loop, and
 * when the dim before it is contiguous in the source (a transpose of the last two axes) the
 * pair is walked in tiles. */

typedef struct mv_copy {
  const char *src;
  char *dst;
  i64 esize, block, rank, inner; /* inner: dims walked inside one outer step (0, 1 or 2) */
  const i64 *dims, *ss, *ds;
  i64 n_outer;
} mv_copy;

/* The few-channel case of mv_transpose_2d for elements of type T: nb (2 to 4) source rows
   interleaved into a dense destination, a loop per nb so the compiler turns each into
   shuffles. Quantized models' inputs are bytes (u8 RGB), hence 1- and 2-byte elements too. */
#define MV_INTERLEAVE(T)                                                                           \
  do {                                                                                             \
    T *dd = (T *)d;                                                                                \
    const T *s0 = (const T *)s, *s1 = (const T *)(s + ssb);                                        \
    const T *s2 = (const T *)(s + 2 * ssb), *s3 = (const T *)(s + 3 * ssb);                        \
    switch (nb) {                                                                                  \
    case 2:                                                                                        \
      for (i64 a = a_lo; a < a_hi; a++) {                                                          \
        dd[a * 2] = s0[a];                                                                         \
        dd[a * 2 + 1] = s1[a];                                                                     \
      }                                                                                            \
      break;                                                                                       \
    case 3:                                                                                        \
      for (i64 a = a_lo; a < a_hi; a++) {                                                          \
        dd[a * 3] = s0[a];                                                                         \
        dd[a * 3 + 1] = s1[a];                                                                     \
        dd[a * 3 + 2] = s2[a];                                                                     \
      }                                                                                            \
      break;                                                                                       \
    default:                                                                                       \
      for (i64 a = a_lo; a < a_hi; a++) {                                                          \
        dd[a * 4] = s0[a];                                                                         \
        dd[a * 4 + 1] = s1[a];                                                                     \
        dd[a * 4 + 2] = s2[a];                                                                     \
        dd[a * 4 + 3] = s3[a];                                                                     \
      }                                                                                            \
      break;                                                                                       \
    }                                                                                              \
  } while (0)

/* Rows [a_lo, a_hi) of the innermost pair of one outer step: dims[r-2] ("a") is contiguous in
   the source, dims[r-1] ("b") in the destination (a transpose of the last two axes, e.g. NCHW
   to NHWC with a = pixels, b = channels).
   Tiles of b sit outside a, so a tile reads MV_TILE source rows front to back (streams the
   hardware prefetcher follows) and writes MV_TILE consecutive elements of each destination row;
   walking a outside b instead reads from all nb source rows at once, which for NCHW -> NHWC of
   256 channels is 256 streams, each line a cache miss. A few channels (a model's RGB input)
   into a dense destination get loops with a constant interleave, which the compiler turns into
   shuffles. */
static void mv_transpose_2d(const mv_copy *c, char *d, const char *s, i64 a_lo, i64 a_hi) {
  const i64 r = c->rank, es = c->esize;
  const i64 nb = c->dims[r - 1], dsa = c->ds[r - 2], ssb = c->ss[r - 1];
  if ((es == 1 || es == 2 || es == 4) && dsa == nb * es && nb >= 2 && nb <= 4) {
    switch (es) {
    case 1: MV_INTERLEAVE(uint8_t); return;
    case 2: MV_INTERLEAVE(uint16_t); return;
    default: MV_INTERLEAVE(uint32_t); return;
    }
  }
  for (i64 b0 = 0; b0 < nb; b0 += MV_TILE) {
    i64 b1 = b0 + MV_TILE < nb ? b0 + MV_TILE : nb;
    for (i64 a = a_lo; a < a_hi; a++)
      mv_copy_row(d + a * dsa + b0 * es, es, s + a * es + b0 * ssb, ssb, b1 - b0, es);
  }
}

/* The source and destination of outer step `o`, and its index per outer dim when `idx` is not
   NULL. */
static void mv_outer_at(const mv_copy *c, i64 o, const char **s, char **d, i64 *idx) {
  *s = c->src;
  *d = c->dst;
  for (i64 k = c->rank - c->inner - 1; k >= 0; k--) {
    i64 i = o % c->dims[k];
    o /= c->dims[k];
    *s += i * c->ss[k];
    *d += i * c->ds[k];
    if (idx) idx[k] = i;
  }
}

static void mv_copy_range(const mv_copy *c, i64 lo, i64 hi) {
  i64 outer_rank = c->rank - c->inner;
  i64 idx[MV_MAX_RANK];
  const char *s;
  char *d;
  mv_outer_at(c, lo, &s, &d, idx);
  const i64 es = c->esize, r = c->rank;
  for (i64 o = lo; o < hi; o++) {
    if (c->inner == 0) {
      __builtin_memcpy(d, s, (size_t)c->block);
    } else if (c->inner == 1) {
      mv_copy_row(d, c->ds[r - 1], s, c->ss[r - 1], c->dims[r - 1], es);
    } else {
      mv_transpose_2d(c, d, s, 0, c->dims[r - 2]);
    }
    for (i64 k = outer_rank - 1; k >= 0; k--) {
      s += c->ss[k];
      d += c->ds[k];
      if (++idx[k] < c->dims[k]) break;
      s -= idx[k] * c->ss[k];
      d -= idx[k] * c->ds[k];
      idx[k] = 0;
    }
  }
}

/* Parallel copies: `n_tasks` tasks over the outer steps, or, for a transpose with fewer outer
   steps than tasks (one image), over (outer step, slice of a). */
typedef struct mv_par {
  const mv_copy *c;
  i64 n_tasks;
  i64 a_slices; /* > 1: each task is one slice of a in one outer step */
} mv_par;

static void mv_copy_task(void *data, i64 i, i64 tid) {
  (void)tid;
  const mv_par *p = (const mv_par *)data;
  const mv_copy *c = p->c;
  if (p->a_slices > 1) {
    const char *s;
    char *d;
    mv_outer_at(c, i / p->a_slices, &s, &d, NULL);
    i64 j = i % p->a_slices, na = c->dims[c->rank - 2];
    mv_transpose_2d(c, d, s, na * j / p->a_slices, na * (j + 1) / p->a_slices);
    return;
  }
  i64 n = c->n_outer;
  mv_copy_range(c, n * i / p->n_tasks, n * (i + 1) / p->n_tasks);
}

int32_t kiln_uk_copy(const kiln_uk_args *a) {
  const i64 *at = a->iattr;
  i64 esize = at[0], n_copies = at[1];
  at += 2;
  for (i64 ci = 0; ci < n_copies; ci++) {
    mv_copy c;
    i64 src_in = at[0], dst_out = at[1];
    c.src = (const char *)a->in[src_in].data + at[2];
    c.dst = (char *)a->out[dst_out].data + at[3];
    c.esize = esize;
    c.block = at[4];
    c.rank = at[5];
    c.dims = at + 6;
    c.ss = c.dims + c.rank;
    c.ds = c.ss + c.rank;
    at = c.ds + c.rank;
    i64 r = c.rank;
    if (c.block != esize || r == 0)
      c.inner = 0;
    else if (r >= 2 && c.ds[r - 1] == esize && c.ss[r - 2] == esize && c.ss[r - 1] != esize)
      c.inner = 2;
    else
      c.inner = 1;
    i64 total = c.block, n_outer = 1;
    for (i64 k = 0; k < r; k++) {
      total *= c.dims[k];
      if (k < r - c.inner) n_outer *= c.dims[k];
    }
    c.n_outer = n_outer;
    if (total == 0) continue;
    i64 threads = kiln_rt_num_threads(a->ctx);
    i64 want = threads * 4;
    if (total >= MV_PAR_BYTES && threads > 1 && c.inner == 2 && n_outer < want) {
      i64 na = c.dims[r - 2], slices = (want + n_outer - 1) / n_outer;
      if (slices > na) slices = na;
      mv_par p = {&c, n_outer * slices, slices};
      kiln_rt_parallel_for(a->ctx, mv_copy_task, &p, p.n_tasks);
    } else if (total >= MV_PAR_BYTES && threads > 1 && n_outer > 1) {
      mv_par p = {&c, n_outer < want ? n_outer : want, 1};
      kiln_rt_parallel_for(a->ctx, mv_copy_task, &p, p.n_tasks);
    } else {
      mv_copy_range(&c, 0, n_outer);
    }
  }
  return KILN_UK_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Per-axis index maps: Pad (every mode; the maps come from the known pads) and nearest Resize.
 *
 * iattr: [esize, rank, out_dims[rank], in_strides[rank] (bytes), maps (out_dims[k] entries per
 *         axis: source index, or -1 for the fill value), run_lo, run_hi, fill_mode, fill_bits]
 * On the last axis, outputs [run_lo, run_hi) read consecutive source elements (one memcpy).
 * fill_mode 0: the fill is the first element of input 2 (Pad's constant_value) or zero when it
 * is absent; 1: fill_bits. */
int32_t kiln_uk_gather_axes(const kiln_uk_args *a) {
  const i64 *at = a->iattr;
  i64 es = at[0], r = at[1];
  const i64 *od = at + 2, *st = od + r;
  const i64 *maps[MV_MAX_RANK];
  const i64 *m = st + r;
  for (i64 k = 0; k < r; k++) {
    maps[k] = m;
    m += od[k];
  }
  i64 run_lo = m[0], run_hi = m[1];
  uint64_t fill = 0;
  if (m[2] == 1)
    fill = (uint64_t)m[3];
  else if (a->n_in > 2 && a->in[2].data && a->in[2].numel > 0)
    __builtin_memcpy(&fill, a->in[2].data, (size_t)es);
  const char *src = (const char *)a->in[0].data;
  char *dst = (char *)a->out[0].data;
  if (a->out[0].numel == 0) return KILN_UK_OK;
  if (r == 0) {
    __builtin_memcpy(dst, src, (size_t)es);
    return KILN_UK_OK;
  }
  i64 inner = od[r - 1], rows = a->out[0].numel / inner;
  const i64 *lm = maps[r - 1];
  i64 idx[MV_MAX_RANK] = {0};
  for (i64 row = 0; row < rows; row++, dst += inner * es) {
    i64 off = 0;
    int filled = 0;
    for (i64 k = 0; k < r - 1; k++) {
      i64 s = maps[k][idx[k]];
      if (s < 0) filled = 1;
      off += s * st[k];
    }
    if (filled) {
      for (i64 j = 0; j < inner; j++) mv_copy_elem(dst + j * es, (const char *)&fill, es);
    } else {
      const char *srow = src + off;
      for (i64 j = 0; j < inner; j++) {
        if (j == run_lo && run_hi > run_lo) {
          __builtin_memcpy(dst + j * es, srow + lm[j] * st[r - 1], (size_t)((run_hi - run_lo) * es));
          j = run_hi - 1;
          continue;
        }
        i64 s = lm[j];
        mv_copy_elem(dst + j * es, s < 0 ? (const char *)&fill : srow + s * st[r - 1], es);
      }
    }
    for (i64 k = r - 2; k >= 0; k--) {
      if (++idx[k] < od[k]) break;
      idx[k] = 0;
    }
  }
  return KILN_UK_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Gather family. Indices are i32 or i64 runtime values; negative ones count from the back. */

KILN_UK_INLINE int mv_index(const kiln_uk_args *a, const kiln_tensor *t, i64 i, i64 dim, i64 *out) {
  i64 v = kiln_load_i64(t->data, t->dtype, i);
  i64 w = v < 0 ? v + dim : v;
  if (w < 0 || w >= dim) {
    kiln_rt_set_error(a->ctx, "index %lld out of range [-%lld, %lld)", (long long)v, (long long)dim,
                      (long long)dim);
    return KILN_UK_EINDEX;
  }
  *out = w;
  return 0;
}

/* Gather. iattr: [outer, axis_dim, n_indices, inner_bytes]. */
int32_t kiln_uk_gather(const kiln_uk_args *a) {
  i64 outer = a->iattr[0], dim = a->iattr[1], n = a->iattr[2], inner = a->iattr[3];
  const char *src = (const char *)a->in[0].data;
  char *dst = (char *)a->out[0].data;
  const kiln_tensor *it = &a->in[1];
  for (i64 j = 0; j < n; j++) {
    i64 w;
    if (mv_index(a, it, j, dim, &w)) return KILN_UK_EINDEX;
    for (i64 o = 0; o < outer; o++)
      __builtin_memcpy(dst + (o * n + j) * inner, src + (o * dim + w) * inner, (size_t)inner);
  }
  return KILN_UK_OK;
}

/* Flat data offsets (elements) of GatherElements/ScatterElements: the index tensor's position
   with the axis coordinate replaced by its value. iattr from `at`: [axis, rank, idx_dims[rank],
   data_strides[rank] (elements), data_axis_dim]. Calls f(ctx, element, offset). */
#define MV_ELEMENTS_LOOP(a, at, BODY)                                                        \
  do {                                                                                     \
    i64 ax_ = (at)[0], r_ = (at)[1];                                                       \
    const i64 *id_ = (at) + 2, *ds_ = id_ + r_;                                            \
    i64 adim_ = ds_[r_];                                                                   \
    const kiln_tensor *it_ = &(a)->in[1];                                                  \
    i64 pos_[MV_MAX_RANK] = {0};                                                           \
    for (i64 e_ = 0; e_ < it_->numel; e_++) {                                              \
      i64 w_;                                                                              \
      if (mv_index(a, it_, e_, adim_, &w_)) return KILN_UK_EINDEX;                         \
      i64 off_ = 0;                                                                        \
      for (i64 k_ = 0; k_ < r_; k_++) off_ += (k_ == ax_ ? w_ : pos_[k_]) * ds_[k_];       \
      {                                                                                    \
        i64 elem = e_, off = off_;                                                         \
        BODY;                                                                              \
      }                                                                                    \
      for (i64 k_ = r_ - 1; k_ >= 0; k_--) {                                               \
        if (++pos_[k_] < id_[k_]) break;                                                   \
        pos_[k_] = 0;                                                                      \
      }                                                                                    \
    }                                                                                      \
  } while (0)

/* GatherElements along the last axis of contiguous rows with 4-byte elements and i64 indices
   (DeBERTa's relative-position gathers, `torch.gather(scores, -1, index)`): row by row, in
   parallel chunks of rows, each row's data offset found once and each element one indexed
   load, where the general loop below recomputes every offset over all axes (2.5 ns an
   element, on one thread). */
typedef struct {
  const i64 *id, *ds;  /* the index tensor's dims, the data's strides (elements) */
  i64 r, adim, n;      /* rank, the data's extent on the axis, indices per row */
  i64 rows, per_task;  /* rows in all, rows per task */
  const int64_t *ix;
  const uint32_t *src;
  uint32_t *dst;
  int bad;             /* set when an index is out of range (first bad value in bad_value) */
  int64_t bad_value;
} mv_gather_rows_job;

static void mv_gather_rows_task(void *data, int64_t t, int64_t tid) {
  (void)tid;
  mv_gather_rows_job *j = data;
  i64 first = t * j->per_task, last = first + j->per_task < j->rows ? first + j->per_task : j->rows;
  i64 pos[MV_MAX_RANK] = {0}, rest = first;
  for (i64 k = j->r - 2; k >= 0; k--) {
    pos[k] = rest % j->id[k];
    rest /= j->id[k];
  }
  for (i64 row = first; row < last; row++) {
    i64 base = 0;
    for (i64 k = 0; k + 1 < j->r; k++) base += pos[k] * j->ds[k];
    const int64_t *ix = j->ix + row * j->n;
    uint32_t *o = j->dst + row * j->n;
    for (i64 c = 0; c < j->n; c++) {
      i64 v = ix[c], w = v < 0 ? v + j->adim : v;
      if (w < 0 || w >= j->adim) {
        if (!__atomic_exchange_n(&j->bad, 1, __ATOMIC_RELAXED)) __atomic_store_n(&j->bad_value, v, __ATOMIC_RELAXED);
        return;
      }
      o[c] = j->src[base + w];
    }
    for (i64 k = j->r - 2; k >= 0; k--) {
      if (++pos[k] < j->id[k]) break;
      pos[k] = 0;
    }
  }
}

/* Returns -1 when the case does not apply. */
static int32_t mv_gather_last_axis(const kiln_uk_args *a, const char *src, char *dst) {
  const i64 *at = a->iattr;
  i64 ax = at[0], r = at[1];
  const kiln_tensor *it = &a->in[1];
  if (r < 1 || r > MV_MAX_RANK || ax != r - 1 || at[2 + r + r - 1] != 1 || kiln_dtype_size(a->out[0].dtype) != 4 ||
      it->dtype != KILN_I64)
    return -1;
  mv_gather_rows_job j = {.id = at + 2, .ds = at + 2 + r, .r = r, .adim = at[2 + 2 * r], .n = at[2 + r - 1],
                          .ix = (const int64_t *)it->data, .src = (const uint32_t *)src, .dst = (uint32_t *)dst};
  if (j.n <= 0) return KILN_UK_OK;
  j.rows = it->numel / j.n;
  /* Chunks of at least 16K elements: smaller ones cost more in scheduling than they save. */
  j.per_task = (16384 + j.n - 1) / j.n;
  kiln_rt_parallel_for(a->ctx, mv_gather_rows_task, &j, (j.rows + j.per_task - 1) / j.per_task);
  if (j.bad) {
    kiln_rt_set_error(a->ctx, "index %lld out of range [-%lld, %lld)", (long long)j.bad_value, (long long)j.adim,
                      (long long)j.adim);
    return KILN_UK_EINDEX;
  }
  return KILN_UK_OK;
}

int32_t kiln_uk_gather_elements(const kiln_uk_args *a) {
  i64 es = kiln_dtype_size(a->out[0].dtype);
  const char *src = (const char *)a->in[0].data;
  char *dst = (char *)a->out[0].data;
  int32_t rc = mv_gather_last_axis(a, src, dst);
  if (rc >= 0) return rc;
  MV_ELEMENTS_LOOP(a, a->iattr, mv_copy_elem(dst + elem * es, src + off * es, es));
  return KILN_UK_OK;
}

/* Offset (elements) of index tuple t of GatherND/ScatterND. iattr from `at`: [k, per_batch,
   batch_stride, dims[k], strides[k]]. */
KILN_UK_INLINE int mv_nd_offset(const kiln_uk_args *a, const i64 *at, i64 t, i64 *off) {
  i64 k = at[0], per_batch = at[1], batch_stride = at[2];
  const i64 *dims = at + 3, *st = dims + k;
  i64 o = (t / per_batch) * batch_stride;
  for (i64 j = 0; j < k; j++) {
    i64 w;
    if (mv_index(a, &a->in[1], t * k + j, dims[j], &w)) return KILN_UK_EINDEX;
    o += w * st[j];
  }
  *off = o;
  return 0;
}

/* GatherND. iattr: [tuples, slice (elements), k, per_batch, batch_stride, dims[k], strides[k]]. */
int32_t kiln_uk_gather_nd(const kiln_uk_args *a) {
  i64 tuples = a->iattr[0], slice = a->iattr[1];
  i64 es = kiln_dtype_size(a->out[0].dtype);
  const char *src = (const char *)a->in[0].data;
  char *dst = (char *)a->out[0].data;
  for (i64 t = 0; t < tuples; t++) {
    i64 off;
    if (mv_nd_offset(a, a->iattr + 2, t, &off)) return KILN_UK_EINDEX;
    __builtin_memcpy(dst + t * slice * es, src + off * es, (size_t)(slice * es));
  }
  return KILN_UK_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Scatter family: the output starts as a copy of the data, then updates are combined in index
 * order. Reduction codes: SC_NONE, SC_ADD, SC_MUL, SC_MAX, SC_MIN. Integers wrap, f16/bf16 round
 * each step through f32, bool uses or/and. ScatterND's max/min propagate NaN (numpy maximum);
 * ScatterElements' keep the current value unless the update compares greater/less. */

#define MV_RED_INT(T, UT)                                                                   \
  {                                                                                        \
    T x = ((T *)o)[i], y = ((const T *)u)[j], z;                                           \
    switch (r) {                                                                           \
    case SC_ADD: z = (T)((UT)x + (UT)y); break;                                            \
    case SC_MUL: z = (T)((UT)x * (UT)y); break;                                            \
    case SC_MAX: z = y > x ? y : x; break;                                                 \
    case SC_MIN: z = y < x ? y : x; break;                                                 \
    default: z = y; break;                                                                 \
    }                                                                                      \
    ((T *)o)[i] = z;                                                                       \
  }                                                                                        \
  break

KILN_UK_INLINE float mv_red_float(i64 r, float x, float y, int nan_prop) {
  int nan = nan_prop && (x != x || y != y);
  switch (r) {
  case SC_ADD: return x + y;
  case SC_MUL: return x * y;
  case SC_MAX: return nan ? (x != x ? x : y) : (y > x ? y : x);
  case SC_MIN: return nan ? (x != x ? x : y) : (y < x ? y : x);
  default: return y;
  }
}

KILN_UK_INLINE double mv_red_double(i64 r, double x, double y, int nan_prop) {
  int nan = nan_prop && (x != x || y != y);
  switch (r) {
  case SC_ADD: return x + y;
  case SC_MUL: return x * y;
  case SC_MAX: return nan ? (x != x ? x : y) : (y > x ? y : x);
  case SC_MIN: return nan ? (x != x ? x : y) : (y < x ? y : x);
  default: return y;
  }
}

static void mv_reduce(i64 dt, i64 r, void *o, i64 i, const void *u, i64 j, int nan_prop) {
  switch (dt) {
  case KILN_BOOL: {
    uint8_t x = ((uint8_t *)o)[i], y = ((const uint8_t *)u)[j], z;
    switch (r) {
    case SC_ADD: z = x || y; break;
    case SC_MUL: z = x && y; break;
    case SC_MAX: z = y > x ? y : x; break;
    case SC_MIN: z = y < x ? y : x; break;
    default: z = y; break;
    }
    ((uint8_t *)o)[i] = z;
    break;
  }
  case KILN_U8: MV_RED_INT(uint8_t, uint32_t);
  case KILN_I8: MV_RED_INT(int8_t, uint32_t);
  case KILN_U16: MV_RED_INT(uint16_t, uint32_t);
  case KILN_I16: MV_RED_INT(int16_t, uint32_t);
  case KILN_U32: MV_RED_INT(uint32_t, uint32_t);
  case KILN_I32: MV_RED_INT(int32_t, uint32_t);
  case KILN_U64: MV_RED_INT(uint64_t, uint64_t);
  case KILN_I64: MV_RED_INT(int64_t, uint64_t);
  case KILN_F16: {
    float x = kiln_f16_to_f32(((uint16_t *)o)[i]), y = kiln_f16_to_f32(((const uint16_t *)u)[j]);
    ((uint16_t *)o)[i] = kiln_f32_to_f16(mv_red_float(r, x, y, nan_prop));
    break;
  }
  case KILN_BF16: {
    float x = kiln_bf16_to_f32(((uint16_t *)o)[i]), y = kiln_bf16_to_f32(((const uint16_t *)u)[j]);
    ((uint16_t *)o)[i] = kiln_f32_to_bf16(mv_red_float(r, x, y, nan_prop));
    break;
  }
  case KILN_F32: ((float *)o)[i] = mv_red_float(r, ((float *)o)[i], ((const float *)u)[j], nan_prop); break;
  default: ((double *)o)[i] = mv_red_double(r, ((double *)o)[i], ((const double *)u)[j], nan_prop); break;
  }
}

/* ScatterND. iattr: [reduction, tuples, slice (elements), k, per_batch(=1), batch_stride(=0),
   dims[k], strides[k]]. Inputs: data, indices, updates. */
int32_t kiln_uk_scatter_nd(const kiln_uk_args *a) {
  i64 red = a->iattr[0], tuples = a->iattr[1], slice = a->iattr[2];
  i64 dt = a->out[0].dtype, es = kiln_dtype_size(dt);
  char *dst = (char *)a->out[0].data;
  __builtin_memcpy(dst, a->in[0].data, (size_t)(a->out[0].numel * es));
  const char *upd = (const char *)a->in[2].data;
  for (i64 t = 0; t < tuples; t++) {
    i64 off;
    if (mv_nd_offset(a, a->iattr + 3, t, &off)) return KILN_UK_EINDEX;
    if (red == SC_NONE)
      __builtin_memcpy(dst + off * es, upd + t * slice * es, (size_t)(slice * es));
    else
      for (i64 j = 0; j < slice; j++) mv_reduce(dt, red, dst, off + j, upd, t * slice + j, 1);
  }
  return KILN_UK_OK;
}

/* ScatterElements. iattr: [reduction, axis, rank, idx_dims[rank], data_strides[rank],
   data_axis_dim]. Inputs: data, indices, updates (shape of indices). */
int32_t kiln_uk_scatter_elements(const kiln_uk_args *a) {
  i64 red = a->iattr[0];
  i64 dt = a->out[0].dtype, es = kiln_dtype_size(dt);
  char *dst = (char *)a->out[0].data;
  __builtin_memcpy(dst, a->in[0].data, (size_t)(a->out[0].numel * es));
  const char *upd = (const char *)a->in[2].data;
  MV_ELEMENTS_LOOP(a, a->iattr + 1, mv_reduce(dt, red, dst, off, upd, elem, 0));
  return KILN_UK_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Generators. */

/* ConstantOfShape. iattr: [esize, value bits (little-endian, in the low esize bytes)]. */
int32_t kiln_uk_fill(const kiln_uk_args *a) {
  i64 es = a->iattr[0];
  uint64_t v = (uint64_t)a->iattr[1];
  char *dst = (char *)a->out[0].data;
  i64 n = a->out[0].numel;
  switch (es) {
  case 1: for (i64 i = 0; i < n; i++) ((uint8_t *)dst)[i] = (uint8_t)v; break;
  case 2: for (i64 i = 0; i < n; i++) ((uint16_t *)dst)[i] = (uint16_t)v; break;
  case 4: for (i64 i = 0; i < n; i++) ((uint32_t *)dst)[i] = (uint32_t)v; break;
  default: for (i64 i = 0; i < n; i++) ((uint64_t *)dst)[i] = v; break;
  }
  return KILN_UK_OK;
}

/* EyeLike. iattr: [rows, cols, k]. */
int32_t kiln_uk_eye_like(const kiln_uk_args *a) {
  i64 rows = a->iattr[0], cols = a->iattr[1], k = a->iattr[2];
  i64 dt = a->out[0].dtype;
  char *dst = (char *)a->out[0].data;
  __builtin_memset(dst, 0, (size_t)(rows * cols * kiln_dtype_size(dt)));
  for (i64 i = 0; i < rows; i++) {
    i64 j = i + k;
    if (j >= 0 && j < cols) kiln_store_i64(dst, dt, i * cols + j, 1);
  }
  return KILN_UK_OK;
}

/* Trilu. iattr: [upper, k, rows, cols]. Inputs: x, k? (read at run time when present). */
int32_t kiln_uk_trilu(const kiln_uk_args *a) {
  i64 upper = a->iattr[0], k = a->iattr[1], rows = a->iattr[2], cols = a->iattr[3];
  if (a->n_in > 1 && a->in[1].data && a->in[1].numel > 0) k = kiln_load_i64(a->in[1].data, a->in[1].dtype, 0);
  i64 es = kiln_dtype_size(a->out[0].dtype);
  const char *src = (const char *)a->in[0].data;
  char *dst = (char *)a->out[0].data;
  i64 n = a->out[0].numel;
  if (rows == 0 || cols == 0) return KILN_UK_OK;
  i64 mats = n / (rows * cols);
  for (i64 m = 0; m < mats; m++) {
    for (i64 i = 0; i < rows; i++) {
      i64 base = (m * rows + i) * cols;
      /* kept columns: j >= i + k (upper) or j <= i + k (lower) */
      i64 lim = i + k;
      i64 lo = upper ? (lim < 0 ? 0 : lim > cols ? cols : lim) : 0;
      i64 hi = upper ? cols : (lim + 1 < 0 ? 0 : lim + 1 > cols ? cols : lim + 1);
      __builtin_memset(dst + base * es, 0, (size_t)(lo * es));
      __builtin_memcpy(dst + (base + lo) * es, src + (base + lo) * es, (size_t)((hi - lo) * es));
      __builtin_memset(dst + (base + hi) * es, 0, (size_t)((cols - hi) * es));
    }
  }
  return KILN_UK_OK;
}

/* Range with runtime start/limit/delta; the output length was fixed at compile time and must
   match. */
int32_t kiln_uk_range(const kiln_uk_args *a) {
  i64 dt = a->out[0].dtype, n = a->out[0].numel;
  if (kiln_dtype_is_float(dt)) {
    double s = kiln_load_f64(a->in[0].data, dt, 0), l = kiln_load_f64(a->in[1].data, dt, 0);
    double d = kiln_load_f64(a->in[2].data, dt, 0);
    double len = d == 0 ? -1 : __builtin_ceil((l - s) / d);
    if (len < 0) len = d == 0 ? -1 : 0;
    if (len != (double)n)
      return kiln_uk_fail(a, KILN_UK_EVALUE, "Range(%g, %g, %g) does not have the compiled length %lld", s, l, d,
                          (long long)n);
    for (i64 i = 0; i < n; i++) kiln_store_f64(a->out[0].data, dt, i, s + (double)i * d);
  } else {
    i64 s = kiln_load_i64(a->in[0].data, dt, 0), l = kiln_load_i64(a->in[1].data, dt, 0);
    i64 d = kiln_load_i64(a->in[2].data, dt, 0);
    __int128 len = -1;
    if (d != 0) {
      __int128 num = (__int128)l - s, q = num / d;
      if (num % d != 0 && ((num < 0) == (d < 0))) q++;
      len = q < 0 ? 0 : q;
    }
    if (len != n)
      return kiln_uk_fail(a, KILN_UK_EVALUE, "Range(%lld, %lld, %lld) does not have the compiled length %lld",
                          (long long)s, (long long)l, (long long)d, (long long)n);
    for (i64 i = 0; i < n; i++) kiln_store_i64(a->out[0].data, dt, i, (i64)((uint64_t)s + (uint64_t)i * (uint64_t)d));
  }
  return KILN_UK_OK;
}

/* OneHot. iattr: [depth, inner]. Inputs: indices, depth, values [off, on]. Indices that are
   out of range or not integral leave their row at off_value, as the ONNX reference does. */
int32_t kiln_uk_one_hot(const kiln_uk_args *a) {
  i64 depth = a->iattr[0], inner = a->iattr[1];
  i64 es = kiln_dtype_size(a->out[0].dtype);
  const kiln_tensor *it = &a->in[0];
  const char *vals = (const char *)a->in[2].data;
  char *dst = (char *)a->out[0].data;
  i64 n = a->out[0].numel;
  for (i64 i = 0; i < n; i++) mv_copy_elem(dst + i * es, vals, es);
  if (inner <= 0) inner = 1;
  for (i64 f = 0; f < it->numel; f++) {
    double v = kiln_load_f64(it->data, it->dtype, f);
    if (v < 0) v += (double)depth;
    if (!(v >= 0 && v < (double)depth && v == __builtin_trunc(v))) continue;
    i64 o = f / inner, j = f % inner;
    mv_copy_elem(dst + ((o * depth + (i64)v) * inner + j) * es, vals + es, es);
  }
  return KILN_UK_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Resize, linear and cubic: one separable pass per resized axis over an f64 copy of the input
 * (scratch: two buffers of the largest intermediate), then one saturating cast, as the ONNX
 * reference computes it. The taps (source indices clamped to the input, and weights) come from
 * codegen/src/uk/movement.rs.
 *
 * iattr: [rank, n_steps, in_dims[rank], per step: axis, out, n_taps, per output position:
 *         outside, idx[n_taps]]
 * fattr: [extrapolation, per step and output position: coeff[n_taps]] */

KILN_UK_INLINE void mv_store_saturated(void *p, i64 dt, i64 i, double v) {
  switch (dt) {
  case KILN_F64: ((double *)p)[i] = v; return;
  case KILN_F32: {
    const double m = 3.4028234663852886e38;
    ((float *)p)[i] = (float)(v != v ? v : v < -m ? -m : v > m ? m : v);
    return;
  }
  case KILN_F16: kiln_store_f64(p, dt, i, v != v ? v : v < -65504.0 ? -65504.0 : v > 65504.0 ? 65504.0 : v); return;
  case KILN_BF16: {
    const double m = 3.3895313892515355e38;
    kiln_store_f64(p, dt, i, v != v ? v : v < -m ? -m : v > m ? m : v);
    return;
  }
  default: break;
  }
  /* Integers: round half to even, then saturate (NaN becomes 0), as Rust's `as`. */
  double r = __builtin_rint(v), lo, hi;
  switch (dt) {
  case KILN_BOOL: kiln_store_i64(p, dt, i, r != 0); return;
  case KILN_U8: lo = 0; hi = 255; break;
  case KILN_I8: lo = -128; hi = 127; break;
  case KILN_U16: lo = 0; hi = 65535; break;
  case KILN_I16: lo = -32768; hi = 32767; break;
  case KILN_U32: lo = 0; hi = 4294967295.0; break;
  case KILN_I32: lo = -2147483648.0; hi = 2147483647.0; break;
  case KILN_U64:
    ((uint64_t *)p)[i] = r != r || r <= 0 ? 0 : r >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)r;
    return;
  default:
    ((int64_t *)p)[i] = r != r ? 0 : r <= -9223372036854775808.0 ? INT64_MIN : r >= 9223372036854775807.0 ? INT64_MAX : (int64_t)r;
    return;
  }
  kiln_store_i64(p, dt, i, r != r ? 0 : (i64)(r < lo ? lo : r > hi ? hi : r));
}

int32_t kiln_uk_resize(const kiln_uk_args *a) {
  const i64 *at = a->iattr;
  i64 rank = at[0], n_steps = at[1];
  i64 shape[MV_MAX_RANK];
  for (i64 k = 0; k < rank; k++) shape[k] = at[2 + k];
  at += 2 + rank;
  const double *coef = a->fattr + 1;
  double extrapolation = a->fattr[0];
  const kiln_tensor *x = &a->in[0];
  i64 dt = a->out[0].dtype;
  i64 n_out = a->out[0].numel;
  /* The buffers hold the largest intermediate; the Rust side sized the scratch for two. */
  i64 cap = x->numel;
  {
    i64 s[MV_MAX_RANK];
    for (i64 k = 0; k < rank; k++) s[k] = shape[k];
    const i64 *p = at;
    for (i64 st = 0; st < n_steps; st++) {
      i64 ax = p[0], out = p[1], nt = p[2];
      s[ax] = out;
      i64 n = 1;
      for (i64 k = 0; k < rank; k++) n *= s[k];
      if (n > cap) cap = n;
      p += 3 + out * (1 + nt);
    }
  }
  double *buf = (double *)a->scratch, *next = buf + cap;
  if (n_steps == 0) {
    for (i64 i = 0; i < n_out; i++) mv_store_saturated(a->out[0].data, dt, i, kiln_load_f64(x->data, x->dtype, i));
    return KILN_UK_OK;
  }
  for (i64 i = 0; i < x->numel; i++) buf[i] = kiln_load_f64(x->data, x->dtype, i);
  for (i64 st = 0; st < n_steps; st++) {
    i64 ax = at[0], out = at[1], nt = at[2];
    const i64 *taps = at + 3;
    i64 input = shape[ax], outer = 1, inner = 1;
    for (i64 k = 0; k < ax; k++) outer *= shape[k];
    for (i64 k = ax + 1; k < rank; k++) inner *= shape[k];
    if (input == 0) {
      for (i64 i = 0; i < outer * out * inner; i++) next[i] = 0;
    } else {
      for (i64 o = 0; o < outer; o++) {
        const double *src = buf + o * input * inner;
        for (i64 y = 0; y < out; y++) {
          const i64 *t = taps + y * (1 + nt);
          const double *c = coef + y * nt;
          double *d = next + (o * out + y) * inner;
          if (t[0]) {
            for (i64 j = 0; j < inner; j++) d[j] = extrapolation;
            continue;
          }
          for (i64 j = 0; j < inner; j++) d[j] = 0;
          for (i64 k = 0; k < nt; k++) {
            const double *row = src + t[1 + k] * inner;
            double w = c[k];
            for (i64 j = 0; j < inner; j++) d[j] += row[j] * w;
          }
        }
      }
    }
    coef += out * nt;
    at += 3 + out * (1 + nt);
    shape[ax] = out;
    double *tmp = buf;
    buf = next;
    next = tmp;
  }
  for (i64 i = 0; i < n_out; i++) mv_store_saturated(a->out[0].data, dt, i, buf[i]);
  return KILN_UK_OK;
}

/* ---------------------------------------------------------------------------------------------
 * ReverseSequence. iattr: [batch_axis (0 or 1), d0, d1, inner_bytes]: the input is
 * [d0, d1, inner...]; the time axis is the other of the first two. Inputs: x, sequence_lens. */
int32_t kiln_uk_reverse_sequence(const kiln_uk_args *a) {
  i64 batch_axis = a->iattr[0], d0 = a->iattr[1], d1 = a->iattr[2], inner = a->iattr[3];
  i64 batch = batch_axis == 0 ? d0 : d1, time = batch_axis == 0 ? d1 : d0;
  const kiln_tensor *lt = &a->in[1];
  for (i64 b = 0; b < batch; b++) {
    i64 l = kiln_load_i64(lt->data, lt->dtype, b);
    if (l < 0 || l > time)
      return kiln_uk_fail(a, KILN_UK_EVALUE, "sequence length %lld is outside [0, %lld]", (long long)l,
                          (long long)time);
  }
  const char *src = (const char *)a->in[0].data;
  char *dst = (char *)a->out[0].data;
  for (i64 i0 = 0; i0 < d0; i0++) {
    for (i64 i1 = 0; i1 < d1; i1++) {
      i64 b = batch_axis == 0 ? i0 : i1, t = batch_axis == 0 ? i1 : i0;
      i64 l = kiln_load_i64(lt->data, lt->dtype, b);
      i64 ts = t < l ? l - 1 - t : t;
      i64 s0 = batch_axis == 0 ? i0 : ts, s1 = batch_axis == 0 ? ts : i1;
      __builtin_memcpy(dst + (i0 * d1 + i1) * inner, src + (s0 * d1 + s1) * inner, (size_t)inner);
    }
  }
  return KILN_UK_OK;
}

/* TensorScatter: the cache with update rows written at write_indices[b] + j along the axis
 * (wrapping when circular). iattr: [batch, mid (numel between batch and axis), u_len, c_len,
 * inner_bytes, circular]. Inputs: past_cache, update, write_indices? (absent: 0). */
int32_t kiln_uk_tensor_scatter(const kiln_uk_args *a) {
  i64 batch = a->iattr[0], mid = a->iattr[1], u_len = a->iattr[2], c_len = a->iattr[3];
  i64 inner = a->iattr[4], circular = a->iattr[5];
  const kiln_tensor *wt = a->n_in > 2 && a->in[2].data ? &a->in[2] : 0;
  for (i64 b = 0; b < batch; b++) {
    i64 w = wt ? kiln_load_i64(wt->data, wt->dtype, b) : 0;
    for (i64 j = 0; j < u_len; j++) {
      i64 at = w + j;
      if (circular && c_len > 0) at = ((at % c_len) + c_len) % c_len;
      if (at < 0 || at >= c_len)
        return kiln_uk_fail(a, KILN_UK_EINDEX, "write position %lld is outside the cache's %lld slots",
                            (long long)at, (long long)c_len);
    }
  }
  char *dst = (char *)a->out[0].data;
  const char *upd = (const char *)a->in[1].data;
  __builtin_memcpy(dst, a->in[0].data, (size_t)(batch * mid * c_len * inner));
  for (i64 b = 0; b < batch; b++) {
    i64 w = wt ? kiln_load_i64(wt->data, wt->dtype, b) : 0;
    for (i64 m = 0; m < mid; m++) {
      for (i64 j = 0; j < u_len; j++) {
        i64 at = w + j;
        if (circular && c_len > 0) at = ((at % c_len) + c_len) % c_len;
        __builtin_memcpy(dst + ((b * mid + m) * c_len + at) * inner, upd + ((b * mid + m) * u_len + j) * inner,
                         (size_t)inner);
      }
    }
  }
  return KILN_UK_OK;
}

/* ---------------------------------------------------------------------------------------------
 * MaxUnpool. iattr: [rank, natural[rank], out[rank]]: indices address the natural unpooled
 * shape; a larger output pads each axis at its end. Inputs: X, I (i64, X's shape). */
int32_t kiln_uk_max_unpool(const kiln_uk_args *a) {
  i64 r = a->iattr[0];
  const i64 *nat = a->iattr + 1, *os = nat + r;
  i64 es = kiln_dtype_size(a->out[0].dtype);
  i64 nat_len = 1;
  for (i64 k = 0; k < r; k++) nat_len *= nat[k];
  const kiln_tensor *it = &a->in[1];
  for (i64 e = 0; e < it->numel; e++) {
    i64 i = kiln_load_i64(it->data, it->dtype, e);
    if (i < 0 || i >= nat_len)
      return kiln_uk_fail(a, KILN_UK_EINDEX, "index %lld out of range [0, %lld)", (long long)i, (long long)nat_len);
  }
  char *dst = (char *)a->out[0].data;
  const char *src = (const char *)a->in[0].data;
  __builtin_memset(dst, 0, (size_t)(a->out[0].numel * es));
  for (i64 e = 0; e < it->numel; e++) {
    i64 i = kiln_load_i64(it->data, it->dtype, e), off = 0, mul = 1;
    for (i64 k = r - 1; k >= 0; k--) {
      off += (i % nat[k]) * mul;
      i /= nat[k];
      mul *= os[k];
    }
    mv_copy_elem(dst + off * es, src + e * es, es);
  }
  return KILN_UK_OK;
}

/* AffineGrid. iattr: [r (2 or 3), align_corners, spatial[r]]. Inputs: theta [N, r, r+1], size.
   Output [N, spatial..., r]: theta times the homogeneous base coordinate of every point. */
KILN_UK_INLINE double mv_base_coord(i64 len, i64 i, i64 align) {
  if (align) return len == 1 ? -1.0 : -1.0 + (double)i * (2.0 / (double)(len - 1));
  double step = 2.0 / (double)len;
  return -1.0 + step / 2.0 + (double)i * step;
}

int32_t kiln_uk_affine_grid(const kiln_uk_args *a) {
  i64 r = a->iattr[0], align = a->iattr[1];
  const i64 *sp = a->iattr + 2;
  const kiln_tensor *th = &a->in[0];
  i64 n = th->dims[0], points = 1;
  for (i64 k = 0; k < r; k++) points *= sp[k];
  i64 dt = a->out[0].dtype, o = 0;
  for (i64 b = 0; b < n; b++) {
    i64 tb = b * r * (r + 1);
    for (i64 p = 0; p < points; p++) {
      double homo[4];
      i64 rem = p;
      for (i64 ax = r - 1; ax >= 0; ax--) {
        /* Coordinate component k varies along spatial axis r-1-k. */
        homo[r - 1 - ax] = mv_base_coord(sp[ax], rem % sp[ax], align);
        rem /= sp[ax];
      }
      homo[r] = 1.0;
      for (i64 row = 0; row < r; row++) {
        double s = 0;
        for (i64 k = 0; k <= r; k++) s += kiln_load_f64(th->data, th->dtype, tb + row * (r + 1) + k) * homo[k];
        kiln_store_f64(a->out[0].data, dt, o++, s);
      }
    }
  }
  return KILN_UK_OK;
}

/* GridSample. iattr: [r (spatial rank, <= 4), mode (0 linear, 1 nearest, 2 cubic), padding
   (0 zeros, 1 border, 2 reflection), align_corners]. Inputs: X [N, C, D1..Dr], grid
   [N, O1..Or, r]. Follows ir's vision/sample.rs (the ONNX reference). */
#define MV_GS_MAX_RANK 4

KILN_UK_INLINE double mv_gs_reflect(double x, double lo, double hi) {
  double range = hi - lo;
  if (range <= 0) return lo;
  if (x < lo || x > hi) {
    double dx = x < lo ? lo - x : x - hi;
    double near = x < lo ? lo : hi, far = x < lo ? hi : lo, sign = x < lo ? 1.0 : -1.0;
    double nf = __builtin_trunc(dx / range), rr = dx - nf * range;
    return __builtin_fmod(nf, 2.0) == 0 ? near + sign * rr : far - sign * rr;
  }
  return x;
}

/* Rust's saturating `as i64`: NaN is 0. */
KILN_UK_INLINE i64 mv_f2i(double v) {
  if (v != v) return 0;
  if (v <= -9.2e18) return INT64_MIN / 2;
  if (v >= 9.2e18) return INT64_MAX / 2;
  return (i64)v;
}

int32_t kiln_uk_grid_sample(const kiln_uk_args *a) {
  i64 r = a->iattr[0], mode = a->iattr[1], padding = a->iattr[2], align = a->iattr[3];
  const kiln_tensor *x = &a->in[0], *g = &a->in[1];
  i64 n = x->dims[0], c = x->dims[1], plane = 1, points = 1;
  i64 len[MV_GS_MAX_RANK];
  double lo[MV_GS_MAX_RANK], hi[MV_GS_MAX_RANK];
  for (i64 k = 0; k < r; k++) {
    len[k] = x->dims[2 + k];
    plane *= len[k];
    points *= g->dims[1 + k];
    lo[k] = align ? 0.0 : -0.5;
    hi[k] = align ? (double)len[k] - 1.0 : (double)len[k] - 0.5;
  }
  i64 dt = a->out[0].dtype;
  i64 ntaps = mode == GS_LINEAR ? 2 : mode == GS_NEAREST ? 1 : 4;
  for (i64 b = 0; b < n; b++) {
    for (i64 p = 0; p < points; p++) {
      /* Per axis: tap indices into the plane (-1: a zero read) and weights. */
      i64 tidx[MV_GS_MAX_RANK][4];
      double tw[MV_GS_MAX_RANK][4];
      for (i64 i = 0; i < r; i++) {
        float gv = (float)kiln_load_f64(g->data, g->dtype, (b * points + p) * r + (r - 1 - i));
        float fl = (float)len[i];
        double v = align ? (double)((gv + 1.0f) / 2.0f * (fl - 1.0f)) : (double)(((gv + 1.0f) * fl - 1.0f) / 2.0f);
        if (mode == GS_NEAREST) v = __builtin_rint(v);
        if (v < lo[i] || v > hi[i]) {
          if (padding == GS_BORDER)
            v = v < 0 ? 0 : v > (double)len[i] - 1 ? (double)len[i] - 1 : v;
          else if (padding == GS_REFLECTION)
            v = mv_gs_reflect(v, lo[i], hi[i]);
        }
        v = (double)(float)v;
        i64 base;
        if (mode == GS_NEAREST) {
          tidx[i][0] = mv_f2i(v);
          tw[i][0] = 1.0;
        } else if (mode == GS_LINEAR) {
          double x0 = __builtin_floor(v), t = v - x0;
          base = mv_f2i(x0);
          tidx[i][0] = base;
          tidx[i][1] = base + 1;
          tw[i][0] = 1.0 - t;
          tw[i][1] = t;
        } else {
          const double A = -0.75;
          double x0 = __builtin_floor(v), xx = __builtin_fabs(v - x0);
          base = mv_f2i(x0);
          tw[i][0] = ((A * (xx + 1.0) - 5.0 * A) * (xx + 1.0) + 8.0 * A) * (xx + 1.0) - 4.0 * A;
          tw[i][1] = ((A + 2.0) * xx - (A + 3.0)) * xx * xx + 1.0;
          tw[i][2] = ((A + 2.0) * (1.0 - xx) - (A + 3.0)) * (1.0 - xx) * (1.0 - xx) + 1.0;
          tw[i][3] = ((A * (2.0 - xx) - 5.0 * A) * (2.0 - xx) + 8.0 * A) * (2.0 - xx) - 4.0 * A;
          for (i64 k = 0; k < 4; k++) tidx[i][k] = base + k - 1;
        }
        for (i64 k = 0; k < ntaps; k++) {
          i64 t = tidx[i][k], last = len[i] - 1;
          if (padding == GS_ZEROS)
            t = t >= 0 && t <= last ? t : -1;
          else if (padding == GS_BORDER)
            t = t < 0 ? 0 : t > last ? last : t;
          else {
            t = mv_f2i(mv_gs_reflect((double)t, lo[i], hi[i]));
            t = t < 0 ? 0 : t > last ? last : t;
          }
          tidx[i][k] = t;
        }
      }
      i64 combos = 1;
      for (i64 i = 0; i < r; i++) combos *= ntaps;
      for (i64 ch = 0; ch < c; ch++) {
        i64 pbase = (b * c + ch) * plane;
        double sum = 0;
        for (i64 cb = 0; cb < combos; cb++) {
          i64 flat = 0, rem = cb, div = combos;
          double w = 1.0;
          int zero = 0;
          for (i64 i = 0; i < r; i++) {
            div /= ntaps;
            i64 k = rem / div;
            rem %= div;
            i64 t = tidx[i][k];
            if (t < 0) {
              zero = 1;
              break;
            }
            flat = flat * len[i] + t;
            w *= tw[i][k];
          }
          if (!zero) sum += w * kiln_load_f64(x->data, x->dtype, pbase + flat);
        }
        kiln_store_f64(a->out[0].data, dt, (b * c + ch) * points + p, sum);
      }
    }
  }
  return KILN_UK_OK;
}

/* Col2Im: out[nc, p] = the sum over taps t (in order) of in[nc·K + t, b] for the one block b
   whose tap t lands on image position p (none where it would lie in the padding or between
   strides), in f64 rounded once, as the reference. iattr: rank, N·C, K, L, then per image axis
   extent, kernel extent, blocks, stride, dilation, pad before (codegen/src/uk/movement.rs). A
   task per (n, c) plane. */
typedef struct {
  const kiln_uk_args *a;
  i64 plane;
} col2im_job;

static void col2im_task(void *data, int64_t nc, int64_t tid) {
  (void)tid;
  const col2im_job *j = (const col2im_job *)data;
  const kiln_uk_args *a = j->a;
  const kiln_tensor *x = &a->in[0], *y = &a->out[0];
  i64 rank = a->iattr[0], taps = a->iattr[2], blocks = a->iattr[3];
  const int64_t *ax = a->iattr + 4;
  for (i64 p = 0; p < j->plane; p++) {
    double sum = 0.0;
    for (i64 t = 0; t < taps; t++) {
      /* The tap's offsets and the block that puts it on p, axis by axis (last axis fastest). */
      i64 rest_p = p, rest_t = t, b = 0, scale = 1, ok = 1;
      for (i64 d = rank - 1; d >= 0 && ok; d--) {
        const int64_t *g = ax + 6 * d;
        i64 pos = rest_p % g[0], tap = rest_t % g[1];
        rest_p /= g[0];
        rest_t /= g[1];
        i64 s = pos + g[5] - tap * g[4];
        if (s < 0 || s % g[3] != 0 || s / g[3] >= g[2]) ok = 0;
        b += (s / g[3]) * scale;
        scale *= g[2];
      }
      if (ok) sum += kiln_load_f64(x->data, x->dtype, (nc * taps + t) * blocks + b);
    }
    kiln_store_f64(y->data, y->dtype, nc * j->plane + p, sum);
  }
}

int32_t kiln_uk_col2im(const kiln_uk_args *a) {
  i64 rank = a->iattr[0], planes = a->iattr[1];
  col2im_job j = {a, 1};
  for (i64 d = 0; d < rank; d++) j.plane *= a->iattr[4 + 6 * d];
  kiln_rt_parallel_for(a->ctx, col2im_task, &j, planes);
  return KILN_UK_OK;
}

/* NonZero: the coordinates of the non-zero elements of in[0] in row-major order, as out[0]
   [rank, count] i64. The output's size depends on the data: its buffer is sized for every
   element ([rank, numel], codegen/src/data_dependent.rs) and this writes the count into its
   dims. iattr[0]: 0 writes the coordinates compacted ([rank, count] row-major, for a graph
   output), 1 at their place in the bound ([rank, numel], for kernels that read it), the rest
   zero either way. A value is non-zero as the reference has it: NaN is, -0.0 is not. */
int32_t kiln_uk_nonzero(const kiln_uk_args *a) {
  const kiln_tensor *x = &a->in[0];
  const kiln_tensor *y = &a->out[0];
  i64 rank = x->rank, n = x->numel, count = 0;
  for (i64 i = 0; i < n; i++) count += kiln_load_f64(x->data, x->dtype, i) != 0.0;
  if (count * rank > y->numel)
    return kiln_uk_fail(a, KILN_UK_EVALUE, "NonZero found %lld values, more than its output holds (%lld)",
                        (long long)count, (long long)(rank ? y->numel / rank : 0));
  int64_t *out = (int64_t *)y->data;
  i64 stride = a->n_iattr > 0 && a->iattr[0] ? (rank ? y->numel / rank : 0) : count;
  __builtin_memset(out, 0, (size_t)y->numel * sizeof *out);
  i64 k = 0;
  for (i64 i = 0; i < n; i++) {
    if (kiln_load_f64(x->data, x->dtype, i) == 0.0) continue;
    i64 rest = i;
    for (i64 d = rank - 1; d >= 0; d--) {
      out[d * stride + k] = rest % x->dims[d];
      rest /= x->dims[d];
    }
    k++;
  }
  ((int64_t *)y->dims)[1] = count;
  return KILN_UK_OK;
}

/* Compress: the slices of in[0] along an axis (iattr: outer, n, inner — the dims before, at and
   after it; the whole tensor as one axis of inner 1 when Compress has none) where the bool
   condition in[1] is true, in order; a shorter condition selects among the leading slices,
   and one longer than the axis may not select past it (as the reference). With a run-time
   condition the output's size depends on the data: its buffer holds every slice, and the count
   is written into its dims (iattr[3]: the axis' index among them), from where the run copies
   it into the graph outputs' shapes (codegen/src/data_dependent.rs). With a constant
   condition the output is static and the count equals its dim, so nothing is written. */
int32_t kiln_uk_compress(const kiln_uk_args *a) {
  const kiln_tensor *x = &a->in[0], *cond = &a->in[1], *y = &a->out[0];
  i64 outer = a->iattr[0], n = a->iattr[1], inner = a->iattr[2], axis = a->iattr[3];
  const uint8_t *c = (const uint8_t *)cond->data;
  i64 count = 0;
  for (i64 k = 0; k < cond->numel; k++) {
    if (!c[k]) continue;
    if (k >= n)
      return kiln_uk_fail(a, KILN_UK_EINDEX, "Compress: the condition selects index %lld of an axis of extent %lld",
                          (long long)k, (long long)n);
    count++;
  }
  if (outer * count * inner > y->numel)
    return kiln_uk_fail(a, KILN_UK_EVALUE, "Compress selects %lld slices, more than its output holds",
                        (long long)count);
  i64 es = kiln_dtype_size(x->dtype), row = inner * es;
  const char *src = (const char *)x->data;
  char *dst = (char *)y->data;
  for (i64 o = 0; o < outer; o++)
    for (i64 k = 0; k < n && k < cond->numel; k++)
      if (c[k]) {
        __builtin_memcpy(dst, src + (o * n + k) * row, (size_t)row);
        dst += row;
      }
  /* What a kernel computing on the bound reads past the count (data_dependent.rs). */
  __builtin_memset(dst, 0, (size_t)((char *)y->data + y->numel * es - dst));
  if (y->dims[axis] != count) ((int64_t *)y->dims)[axis] = count;
  return KILN_UK_OK;
}

/* Unique: the distinct slices of in[0] along an axis (iattr: outer, n, inner as for Compress;
   sorted; the axis' index in out[0]), compared lexicographically in (outer, inner) order with
   NaN after every number and equal to itself (numpy's order, as the reference). Outputs, as
   many as the node has: the slices [.., count, ..], the first occurrence of each [count], the
   slice each input slice became [n], the count of each [count]. count depends on the data:
   out[0], out[1] and out[3] are bounded by n (codegen/src/data_dependent.rs) and their dims
   receive it where they differ. scratch: 7 * n int64. */
static int unique_cmp(const kiln_tensor *x, i64 outer, i64 n, i64 inner, i64 p, i64 q) {
  int fl = kiln_dtype_is_float(x->dtype);
  for (i64 o = 0; o < outer; o++)
    for (i64 i = 0; i < inner; i++) {
      i64 ip = (o * n + p) * inner + i, iq = (o * n + q) * inner + i;
      if (fl) {
        double a = kiln_load_f64(x->data, x->dtype, ip), b = kiln_load_f64(x->data, x->dtype, iq);
        int an = a != a, bn = b != b;
        if (an || bn) {
          if (an != bn) return an ? 1 : -1;
          continue;
        }
        if (a != b) return a < b ? -1 : 1;
      } else {
        int64_t a = kiln_load_i64(x->data, x->dtype, ip), b = kiln_load_i64(x->data, x->dtype, iq);
        if (a != b) return a < b ? -1 : 1;
      }
    }
  return 0;
}

/* Stable merge sort of v[0..m) through tmp: by slice order (key NULL) or by key[v[i]]. */
static void unique_sort(i64 *v, i64 *tmp, i64 m, const kiln_tensor *x, i64 outer, i64 n, i64 inner,
                        const i64 *key) {
  for (i64 w = 1; w < m; w *= 2) {
    for (i64 lo = 0; lo < m; lo += 2 * w) {
      i64 mid = lo + w < m ? lo + w : m, hi = lo + 2 * w < m ? lo + 2 * w : m;
      i64 i = lo, j = mid, k = lo;
      while (i < mid && j < hi) {
        int right_first = key ? key[v[j]] < key[v[i]] : unique_cmp(x, outer, n, inner, v[j], v[i]) < 0;
        tmp[k++] = right_first ? v[j++] : v[i++];
      }
      while (i < mid) tmp[k++] = v[i++];
      while (j < hi) tmp[k++] = v[j++];
    }
    __builtin_memcpy(v, tmp, (size_t)m * sizeof *v);
  }
}

int32_t kiln_uk_unique(const kiln_uk_args *a) {
  const kiln_tensor *x = &a->in[0];
  i64 outer = a->iattr[0], n = a->iattr[1], inner = a->iattr[2], sorted = a->iattr[3], axis = a->iattr[4];
  i64 *order = (i64 *)a->scratch, *tmp = order + n, *firsts = tmp + n, *counts = firsts + n;
  i64 *perm = counts + n, *rank = perm + n, *inverse = rank + n;
  for (i64 k = 0; k < n; k++) order[k] = k;
  unique_sort(order, tmp, n, x, outer, n, inner, NULL);
  i64 groups = 0;
  for (i64 p = 0; p < n; p++) {
    if (p == 0 || unique_cmp(x, outer, n, inner, firsts[groups - 1], order[p]) != 0) {
      firsts[groups] = order[p];
      counts[groups++] = 0;
    }
    counts[groups - 1]++;
    inverse[order[p]] = groups - 1;
  }
  /* Unsorted: the groups in the order of their first occurrences. */
  for (i64 g = 0; g < groups; g++) perm[g] = g;
  if (!sorted) unique_sort(perm, tmp, groups, x, outer, n, inner, firsts);
  for (i64 g = 0; g < groups; g++) rank[perm[g]] = g;
  if (a->n_out > 0 && groups * outer * inner > a->out[0].numel)
    return kiln_uk_fail(a, KILN_UK_EVALUE, "Unique found %lld slices, more than its output holds", (long long)groups);
  i64 es = kiln_dtype_size(x->dtype), row = inner * es;
  if (a->n_out > 0) {
    char *dst = (char *)a->out[0].data;
    for (i64 o = 0; o < outer; o++)
      for (i64 g = 0; g < groups; g++) {
        __builtin_memcpy(dst, (const char *)x->data + (o * n + firsts[perm[g]]) * row, (size_t)row);
        dst += row;
      }
    /* Past the count: zeros, what kernels computing on the bound read (data_dependent.rs). */
    __builtin_memset(dst, 0, (size_t)((char *)a->out[0].data + a->out[0].numel * es - dst));
    if (a->out[0].dims[axis] != groups) ((int64_t *)a->out[0].dims)[axis] = groups;
  }
  for (i64 g = 0; g < a->out[a->n_out > 1 ? 1 : 0].numel; g++) {
    if (a->n_out > 1) ((int64_t *)a->out[1].data)[g] = g < groups ? firsts[perm[g]] : 0;
    if (a->n_out > 3) ((int64_t *)a->out[3].data)[g] = g < groups ? counts[perm[g]] : 0;
  }
  if (a->n_out > 2)
    for (i64 k = 0; k < n; k++) ((int64_t *)a->out[2].data)[k] = rank[inverse[k]];
  for (int o = 1; o < a->n_out; o += 2)
    if (a->out[o].dims[0] != groups) ((int64_t *)a->out[o].dims)[0] = groups;
  return KILN_UK_OK;
}
