//! Channels-last (NHWC) convolution pieces: the A-side im2col packing the GEMM kernel uses for
//! a dense NHWC convolution (`conv::lower_conv_nhwc`), and a direct depthwise kernel.
//!
//! In NHWC the channels of one pixel are contiguous, so an im2col row (one output pixel, k =
//! (kh, kw, c)) is a sequence of contiguous channel runs, one per tap (one per tap row where the
//! window is inside the image); packing copies those runs into a panel of MR rows. The
//! depthwise NHWC kernel is `dwconv_nhwc`.

use super::emit::Emit;
use super::llvm;
use crate::error::Result;
use crate::kernel::geometry::ConvWindow;
use inkwell::values::{IntValue, PointerValue, VectorValue};
use inkwell::IntPredicate;

/// The element type an im2col panel is packed in (and, for u8, read from).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PackTo<'ctx> {
    F32,
    /// bf16, rounded to nearest even: a row of bf16 elements is a row of the bf16 pairs the
    /// `vdpbf16ps` kernels read.
    Bf16,
    /// bf16 from a bf16 input (`store-bf16`): runs are copied as they are.
    Bf16FromBf16,
    /// u8 from a u8 input: a row of bytes is a row of the quads the `vpdpbusd` kernels read.
    /// Taps outside the image are `pad` (the input's zero point: an integer zero).
    U8 {
        pad: IntValue<'ctx>,
    },
}

impl<'ctx> PackTo<'ctx> {
    /// `p + i` elements.
    pub(crate) fn gep(
        self,
        e: &Emit<'_, 'ctx>,
        p: PointerValue<'ctx>,
        i: IntValue<'ctx>,
    ) -> Result<PointerValue<'ctx>> {
        match self {
            PackTo::F32 => e.gep_f32(p, i),
            PackTo::Bf16 | PackTo::Bf16FromBf16 => e.gep_bf16(p, i),
            PackTo::U8 { .. } => e.gep_u8(p, i),
        }
    }

    /// `p + i` elements of the input the panel is packed from.
    fn source_gep(
        self,
        e: &Emit<'_, 'ctx>,
        p: PointerValue<'ctx>,
        i: IntValue<'ctx>,
    ) -> Result<PointerValue<'ctx>> {
        match self {
            PackTo::F32 | PackTo::Bf16 => e.gep_f32(p, i),
            PackTo::Bf16FromBf16 => e.gep_bf16(p, i),
            PackTo::U8 { .. } => e.gep_u8(p, i),
        }
    }

    /// Stores the lanes of `v` (f32) that `mask` selects at `p`, as this element type.
    fn masked_store(
        self,
        e: &Emit<'_, 'ctx>,
        p: PointerValue<'ctx>,
        v: VectorValue<'ctx>,
        mask: VectorValue<'ctx>,
    ) -> Result<()> {
        match self {
            PackTo::F32 => e.masked_store(p, v, mask, 4),
            PackTo::Bf16 => {
                let ty = e.cx.bf16_type().vec_type(v.get_type().get_size());
                e.masked_store(p, e.b.build_float_trunc(v, ty, "").map_err(llvm)?, mask, 2)
            }
            PackTo::U8 { .. } | PackTo::Bf16FromBf16 => {
                unreachable!("u8 and bf16 runs are copied bytewise (copy_run)")
            }
        }
    }
}

/// `d[x] = s[x]` (times `scale[x]` when given) for x in `[0, n)`. With AVX-512 (`lanes` =
/// 16), a loop of masked 16-lane loads and stores: im2col runs are short (21 floats per tap
/// row of a 3-channel 7×7 stem, 9 of a 3×3 one), below the length where LLVM's vectorized
/// loop (64 elements a step) or a `memcpy` call pay off, so they ran element by element.
/// Otherwise the plain loop (LLVM makes it a `memcpy`; AVX2's masked stores are microcoded on
/// some cores). u8 runs are a `memcpy` (a run of C bytes per tap).
fn copy_run<'ctx>(
    e: &Emit<'_, 'ctx>,
    to: PackTo<'ctx>,
    d: PointerValue<'ctx>,
    s: PointerValue<'ctx>,
    scale: Option<PointerValue<'ctx>>,
    n: IntValue<'ctx>,
    lanes: u32,
) -> Result<()> {
    match to {
        PackTo::U8 { .. } => {
            e.b.build_memcpy(d, 1, s, 1, n).map_err(llvm)?;
            return Ok(());
        }
        PackTo::Bf16FromBf16 => {
            e.b.build_memcpy(d, 2, s, 2, e.mulc(n, 2)?).map_err(llvm)?;
            return Ok(());
        }
        _ => {}
    }
    if lanes >= 16 {
        return e.for_masked(n, lanes, |x0, mask| {
            let mut v = e.masked_load(e.gep_f32(s, x0)?, mask, lanes)?;
            if let Some(scale) = scale {
                let w = e.masked_load(e.gep_f32(scale, x0)?, mask, lanes)?;
                v = e.b.build_float_mul(v, w, "").map_err(llvm)?;
            }
            to.masked_store(e, to.gep(e, d, x0)?, v, mask)
        });
    }
    e.for_range(e.i64c(0), n, 1, |x| {
        let mut v = e.load_f32(e.gep_f32(s, x)?)?;
        if let Some(scale) = scale {
            v =
                e.b.build_float_mul(v, e.load_f32(e.gep_f32(scale, x)?)?, "")
                    .map_err(llvm)?;
        }
        let at = to.gep(e, d, x)?;
        match to {
            PackTo::F32 => e.store(at, v),
            PackTo::Bf16 => e.store(at, e.b.build_float_trunc(v, e.cx.bf16_type(), "").map_err(llvm)?),
            PackTo::U8 { .. } | PackTo::Bf16FromBf16 => unreachable!("copied above"),
        }
    })
}

/// `d[x] = 0` (u8: the pad value) for x in `[0, n)` (masked 16-lane stores with AVX-512, as
/// `copy_run`).
fn zero_run<'ctx>(
    e: &Emit<'_, 'ctx>,
    to: PackTo<'ctx>,
    d: PointerValue<'ctx>,
    n: IntValue<'ctx>,
    lanes: u32,
) -> Result<()> {
    match to {
        PackTo::U8 { pad } => {
            e.b.build_memset(d, 1, pad, n).map_err(llvm)?;
            return Ok(());
        }
        PackTo::Bf16FromBf16 => {
            let zero = e.cx.i8_type().const_zero();
            e.b.build_memset(d, 2, zero, e.mulc(n, 2)?).map_err(llvm)?;
            return Ok(());
        }
        _ => {}
    }
    if lanes >= 16 {
        return e.for_masked(n, lanes, |x0, mask| {
            to.masked_store(e, to.gep(e, d, x0)?, e.zero_vec(lanes), mask)
        });
    }
    e.for_range(e.i64c(0), n, 1, |x| {
        let at = to.gep(e, d, x)?;
        match to {
            PackTo::F32 => e.store(at, e.f32c(0.0)),
            PackTo::Bf16 => e.store(at, e.cx.bf16_type().const_zero()),
            PackTo::U8 { .. } | PackTo::Bf16FromBf16 => unreachable!("set above"),
        }
    })
}

/// A row-major f32 matrix that `pack_a_rows` reads: `m` rows, row `r` at
/// `src[r * row_stride..]`, optionally scaled per column by image (`Epilogue::input_scale`):
/// `(scales, rows per image, scales per image)`, row `r` of image `r / rows_per_image`.
pub(crate) struct RowSource<'ctx> {
    pub src: PointerValue<'ctx>,
    pub m: i64,
    pub row_stride: i64,
    pub scale: Option<(PointerValue<'ctx>, i64, i64)>,
}

/// Packs rows `[row, row+mr)` × k `[k0, k0+kc)` of `a` into `dst`, row `i` at
/// `dst[i*stride..]`; rows past `a.m` are zero.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pack_a_rows<'ctx>(
    e: &Emit<'_, 'ctx>,
    dst: PointerValue<'ctx>,
    a: &RowSource<'ctx>,
    row: IntValue<'ctx>,
    k0: IntValue<'ctx>,
    kc: IntValue<'ctx>,
    mr: i64,
    stride: i64,
    lanes: u32,
) -> Result<()> {
    for i in 0..mr {
        let r = e.addc(row, i)?;
        let d = e.gep_f32(dst, e.i64c(i * stride))?;
        let valid = e.icmp(IntPredicate::ULT, r, e.i64c(a.m))?;
        e.if_else(
            valid,
            || {
                let s = e.gep_f32(a.src, e.add(e.mulc(r, a.row_stride)?, k0)?)?;
                let scale = match a.scale {
                    None => None,
                    Some((scales, rows_per_image, per_image)) => {
                        let image = e.udivc(r, rows_per_image)?;
                        Some(e.gep_f32(scales, e.add(e.mulc(image, per_image)?, k0)?)?)
                    }
                };
                copy_run(e, PackTo::F32, d, s, scale, kc, lanes)
            },
            || zero_run(e, PackTo::F32, d, kc, lanes),
        )?;
    }
    Ok(())
}

/// Packs rows `[row, row+mr)` (output pixels of one image) × k `[k0, k0+kc)` of the NHWC im2col
/// matrix into `dst` as `to` elements, row `i` at `dst[i*stride..]`; padding taps and rows
/// past `m` are zero.
///
/// With unit dilation along W, one tap row of a pixel's window (every kx of one ky) is
/// `kw·C` contiguous input floats whenever the window lies inside the image, so it is copied
/// as one run (a run of zeros above or below the image); only windows that cross the left or
/// right border go tap by tap. This matters most where C is
/// small: the 3-channel stem of a CNN copies 7 runs of 21 floats per pixel instead of 49 runs
/// of 3, each with its own bounds checks.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pack_a_im2col<'ctx>(
    e: &Emit<'_, 'ctx>,
    dst: PointerValue<'ctx>,
    src: PointerValue<'ctx>,
    row: IntValue<'ctx>,
    k0: IntValue<'ctx>,
    kc: IntValue<'ctx>,
    mr: i64,
    m: i64,
    g: &ConvWindow,
    stride: i64,
    to: PackTo<'ctx>,
    lanes: u32,
) -> Result<()> {
    let c = g.c as i64;
    let end = e.add(k0, kc)?;
    let tap_rows = g.dw == 1 && g.kw > 1 && g.w >= g.kw;
    let seg = if tap_rows { c * g.kw as i64 } else { c };
    let s0 = e.udivc(k0, seg)?;
    let s1 = e.addc(e.udivc(e.addc(end, -1)?, seg)?, 1)?;
    // The part [lo, hi) of the k range [start, start + len) that lies in [k0, end).
    let clip = |start: IntValue<'ctx>, len: i64| -> Result<(IntValue<'ctx>, IntValue<'ctx>)> {
        let lo = e.sub(
            e.b.build_select(e.icmp(IntPredicate::UGT, k0, start)?, k0, start, "")
                .map_err(llvm)?
                .into_int_value(),
            start,
        )?;
        let hi = e.sub(e.umin(end, e.addc(start, len)?)?, start)?;
        Ok((lo, hi))
    };
    for i in 0..mr {
        let r = e.addc(row, i)?;
        let valid = e.icmp(IntPredicate::ULT, r, e.i64c(m))?;
        let rr = e.umin(r, e.i64c(m - 1))?;
        let oh = e.udivc(rr, g.ow as i64)?;
        let ow = e.uremc(rr, g.ow as i64)?;
        // May be negative (wrapping): the unsigned bound checks below reject it.
        let ihb = e.addc(e.mulc(oh, g.sh as i64)?, -(g.ph as i64))?;
        let iwb = e.addc(e.mulc(ow, g.sw as i64)?, -(g.pw as i64))?;
        // Row `i`'s copy of the k range [start + lo, start + hi) when the input pixel (ih, iw)
        // (where the range starts) is inside the image and the row is valid; zeros otherwise.
        let run = |start: IntValue<'ctx>,
                   (lo, hi): (IntValue<'ctx>, IntValue<'ctx>),
                   ih: IntValue<'ctx>,
                   iw: IntValue<'ctx>,
                   okw: IntValue<'ctx>|
         -> Result<()> {
            let n = e.sub(hi, lo)?;
            let d = to.gep(e, dst, e.addc(e.sub(e.add(start, lo)?, k0)?, i * stride)?)?;
            let okh = e.icmp(IntPredicate::ULT, ih, e.i64c(g.h as i64))?;
            let ok =
                e.b.build_and(e.b.build_and(okh, okw, "").map_err(llvm)?, valid, "")
                    .map_err(llvm)?;
            e.if_else(
                ok,
                || {
                    let pix = e.add(e.mulc(ih, g.w as i64)?, iw)?;
                    copy_run(
                        e,
                        to,
                        d,
                        to.source_gep(e, src, e.add(e.mulc(pix, c)?, lo)?)?,
                        None,
                        n,
                        lanes,
                    )
                },
                || zero_run(e, to, d, n, lanes),
            )
        };
        // One tap's channel run.
        let tap = |t: IntValue<'ctx>| -> Result<()> {
            let tc = e.mulc(t, c)?;
            let ky = e.udivc(t, g.kw as i64)?;
            let kx = e.uremc(t, g.kw as i64)?;
            let ih = e.add(ihb, e.mulc(ky, g.dh as i64)?)?;
            let iw = e.add(iwb, e.mulc(kx, g.dw as i64)?)?;
            let okw = e.icmp(IntPredicate::ULT, iw, e.i64c(g.w as i64))?;
            run(tc, clip(tc, c)?, ih, iw, okw)
        };
        e.for_range(s0, s1, 1, |s| {
            if !tap_rows {
                return tap(s);
            }
            let sc = e.mulc(s, seg)?;
            let (lo, hi) = clip(sc, seg)?;
            let ih = e.add(ihb, e.mulc(s, g.dh as i64)?)?;
            // The window's columns are all inside the image: 0 <= iwb and iwb + kw - 1 < W,
            // in one unsigned compare. Then the tap row is one run (or, above or below the
            // image, one run of zeros).
            let okw = e.icmp(IntPredicate::ULE, iwb, e.i64c((g.w - g.kw) as i64))?;
            e.if_else(
                okw,
                || run(sc, (lo, hi), ih, iwb, okw),
                || {
                    // The taps of this tap row that overlap [k0, end).
                    let t0 = e.add(e.mulc(s, g.kw as i64)?, e.udivc(lo, c)?)?;
                    let t1 = e.add(e.mulc(s, g.kw as i64)?, e.addc(e.udivc(e.addc(hi, -1)?, c)?, 1)?)?;
                    e.for_range(t0, t1, 1, tap)
                },
            )
        })?;
    }
    Ok(())
}
