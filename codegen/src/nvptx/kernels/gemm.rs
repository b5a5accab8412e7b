//! MatMul, Gemm and Conv on the GPU: one shared-memory tiled GEMM kernel accumulating in f32,
//! with a fused epilogue `y = act(alpha·acc + bias + residual)`, for f32 and f16 tensors (f16
//! elements are widened as they are staged and the result rounded once as it is stored).
//!
//! A block computes a `bm×bn` tile (16, 32 or 64 a side, after M and N) of one batch entry
//! (grid.z) with 256 threads, each holding a `bm/16×bn/16` micro-tile in registers. Per K-step
//! the block stages a `bm×BK` slice of A (stored k-major, so the compute loop reads a column of
//! A) and a `BK×bn` slice of B in shared memory; consecutive threads load consecutive addresses of whichever operand axis is
//! contiguous in memory. A thread's micro-tile is strided (rows `ty + 16·r`, columns `tx + 16·c`):
//! the threads of a warp read consecutive shared words of B and store consecutive output
//! columns. Edge tiles load zeros outside M, N and K and skip the stores.
//!
//! A convolution is the same product (implicit GEMM): A = the group's weights, B = the im2col
//! matrix of one image and group, gathered from the input while the B slice is staged (pads
//! read as zeros), so the im2col matrix never exists in memory. A depthwise convolution runs as
//! a direct kernel (`DwConvGpu`), one thread per output element.

use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::epilogue::{Activation, Bias, Epilogue, Residual};
use crate::kernel::PackedConst;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims, MmaKind, Sreg};
use crate::target::TargetDesc;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;
use kiln_ir::{AutoPad, ConvAttrs, DType, Layout, Op};

const BK: usize = 16;
/// Threads along N and along M of the block tile (256 in all).
const TX: usize = 16;
const TY: usize = 16;
const THREADS: usize = TX * TY;

/// The block tile: `bm×bn`, 16, 32 or 64 each, so that small M or N (a convolution with few
/// output channels, a matrix-vector product) does not leave most threads idle. A thread's
/// micro-tile is `bm/16 × bn/16`.
#[derive(Clone, Copy, Debug)]
struct Tile {
    bm: usize,
    bn: usize,
    /// The block's warps multiply on tensor cores (`mma` m16n8k16 with these operands).
    mma: Option<MmaKind>,
}

impl Tile {
    fn for_shape(m: usize, n: usize, mma: Option<MmaKind>) -> Tile {
        let side = |x: usize| match x {
            0..=16 => 16,
            17..=32 => 32,
            _ => 64,
        };
        Tile {
            bm: side(m),
            bn: side(n),
            mma,
        }
    }
    fn tm(self) -> usize {
        self.bm / TY
    }
    fn tn(self) -> usize {
        self.bn / TX
    }
    /// Shared rows are padded so that the reads of the compute loop hit distinct banks: by one
    /// word for the SIMT loop (its k-fastest stores too); by four for the `mma` fragments,
    /// whose lanes read rows `2t` and columns `g` (t < 4, g < 8): with a row stride of 4 mod
    /// 16 words, `2t·stride + g` covers the 32 banks once.
    fn pad(self) -> usize {
        if self.mma.is_some() {
            4
        } else {
            1
        }
    }
    fn sa(self) -> usize {
        self.bm + self.pad()
    }
    fn sb(self) -> usize {
        self.bn + self.pad()
    }
    fn shared_bytes(self) -> usize {
        (BK * self.sa() + BK * self.sb()) * 4
    }
}

/// Where a tensor's elements come from.
#[derive(Clone, Copy, Debug)]
enum Slot {
    Input(usize),
    Packed(usize),
}

/// An operand matrix: element `(r, c)` of batch entry `z` at `off(z) + r·rs + c·cs`.
#[derive(Clone, Copy, Debug)]
struct Mat {
    slot: Slot,
    rs: usize,
    cs: usize,
}

/// The im2col matrix of a 2-D convolution: row `c·KH·KW + kh·KW + kw`, column `oh·OW + ow`.
#[derive(Clone, Copy, Debug)]
struct Im2col {
    input: usize,
    g: Geom,
}

#[derive(Clone, Copy, Debug)]
enum BSrc {
    Mat(Mat),
    Im2col(Im2col),
}

/// One batch dimension: its extent and the element strides of A and B along it (0 when that
/// operand is broadcast).
#[derive(Clone, Copy, Debug)]
struct BatchDim {
    extent: usize,
    a: usize,
    b: usize,
}

/// The epilogue's sources, resolved to slots.
#[derive(Clone, Debug)]
struct Epi {
    alpha: f32,
    /// Bias vector and whether it is indexed by row (else by column).
    bias: Option<(Slot, bool)>,
    /// Residual (or Gemm's C): element `(i, j)` of batch `z` at `z·zs + i·rs + j·cs`, times
    /// `scale`.
    residual: Option<(Slot, usize, usize, usize, f32)>,
    activation: Activation,
}

pub struct GemmGpu {
    what: String,
    /// The element type of the node's tensors (f32 or f16); packed constants are f32.
    elem: DType,
    tile: Tile,
    m: usize,
    n: usize,
    k: usize,
    batch: Vec<BatchDim>,
    /// Groups of a convolution: batch entry `z` is group `z % groups` (its bias rows).
    groups: usize,
    a: Mat,
    b: BSrc,
    epi: Epi,
    packed: Vec<PackedConst>,
    unread: Vec<usize>,
}

/// The generator: MatMul, Gemm and Conv with their own bias.
pub fn lower(node: &NodeInfo, target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    let epi = match node.op() {
        Op::Conv(_) => match node.known(2) {
            Some(b) if matches!(b.dtype(), DType::F32 | DType::F16) => Epilogue::new(
                Bias::PerRow(b.to_f64_vec().iter().map(|&v| v as f32).collect()),
                None,
                Activation::None,
            ),
            _ => Epilogue::default(),
        },
        Op::MatMul | Op::Gemm { .. } => Epilogue::default(),
        _ => return Ok(None),
    };
    lower_fused(node, target, epi)
}

/// `node` with the epilogue `epi` (the fusion pass supplies bias, residual, activation). For
/// Conv, `epi.bias` replaces a constant bias input; a bias computed at run time is read as is.
pub fn lower_fused(
    node: &NodeInfo,
    target: &TargetDesc,
    epi: Epilogue,
) -> Result<Option<Box<dyn GpuKernel>>> {
    if !target.is_gpu() || epi.pool_mean || epi.round_bf16 {
        return Ok(None);
    }
    // Every tensor of the node (the epilogue's residual included) has the output's type.
    let ot = node.output_type(0);
    let elem = ot.dtype;
    if node.n_outputs() != 1
        || !matches!(elem, DType::F32 | DType::F16)
        || ot.layout != Layout::RowMajor
        || !ot.is_static()
    {
        return Ok(None);
    }
    for i in 0..node.n_inputs() {
        if let Some(t) = node.input_type(i) {
            if t.dtype != elem || t.layout != Layout::RowMajor || !t.is_static() {
                return Ok(None);
            }
        }
    }
    if node.output_shape(0)?.iter().product::<usize>() >= 1 << 31 {
        return Ok(None);
    }
    // Tensor cores from sm_80 on: for f16 tensors, and for f32 tensors whose two multiplicands
    // hold bf16 values (bf16 autocast) — the same products as in f32, so the result is the f32
    // kernel's up to summation order.
    let mma = match target.cuda_sm() {
        Some(sm) if sm >= 80 && elem == DType::F16 => Some(MmaKind::F16),
        Some(sm) if sm >= 80 && node.input_is_bf16_valued(0) && node.input_is_bf16_valued(1) => {
            Some(MmaKind::Bf16)
        }
        _ => None,
    };
    let ty = Operands { elem, mma };
    match node.op() {
        Op::MatMul => matmul(node, epi, ty),
        Op::Gemm {
            alpha,
            beta,
            trans_a,
            trans_b,
        } => gemm(node, epi, *alpha, *beta, *trans_a, *trans_b, ty),
        Op::Conv(a) => conv(node, epi, a, ty),
        _ => Ok(None),
    }
}

/// How a kernel reads and multiplies: the element type of the node's tensors (f32 or f16;
/// packed constants are always f32) and the tensor-core instruction, if any.
#[derive(Clone, Copy, Debug)]
struct Operands {
    elem: DType,
    mma: Option<MmaKind>,
}

/// A constant input's values as f32 (exact for f32 and f16 tensors; None for other types).
fn f32s(node: &NodeInfo, i: usize) -> Option<Vec<f32>> {
    let t = node.known(i)?;
    match t.dtype() {
        DType::F32 => t.as_slice::<f32>().map(|s| s.to_vec()),
        DType::F16 => Some(t.to_f64_vec().iter().map(|&v| v as f32).collect()),
        _ => None,
    }
}

fn to_bytes(v: &[f32]) -> PackedConst {
    PackedConst {
        bytes: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Copies `count` `rows×cols` matrices (element `(r, c)` of matrix `b` at
/// `b·rows·cols + r·rs + c·cs`) into row-major (`k_major` false) or column-major order.
fn repack(
    src: &[f32],
    count: usize,
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
    k_major: bool,
) -> Vec<f32> {
    let mut out = vec![0f32; count * rows * cols];
    for b in 0..count {
        for r in 0..rows {
            for c in 0..cols {
                let d = if k_major { c * rows + r } else { r * cols + c };
                out[b * rows * cols + d] = src[b * rows * cols + r * rs + c * cs];
            }
        }
    }
    out
}

struct Parts {
    m: usize,
    n: usize,
    k: usize,
    batch: Vec<BatchDim>,
    groups: usize,
    a: Mat,
    b: BSrc,
    packed: Vec<PackedConst>,
    unread: Vec<usize>,
    what: String,
    ty: Operands,
}

impl Parts {
    /// Resolves the epilogue and checks the launch limits.
    fn finish(
        mut self,
        node: &NodeInfo,
        epi: Epilogue,
        extra: Option<(Slot, usize, usize, usize, f32)>,
    ) -> Result<Option<Box<dyn GpuKernel>>> {
        let (m, n) = (self.m, self.n);
        let z: usize = self.batch.iter().map(|d| d.extent).product();
        if m == 0 || n == 0 || self.k == 0 || z == 0 || z > 65535 || m.div_ceil(16) > 65535 {
            return Ok(None);
        }
        let mut bias = None;
        match &epi.bias {
            Bias::None => {}
            Bias::PerRow(v) => {
                if v.len() != m * self.groups {
                    return Err(node.unsupported(format!(
                        "row bias has {} values for {} rows",
                        v.len(),
                        m * self.groups
                    )));
                }
                bias = Some((Slot::Packed(self.packed.len()), true));
                self.packed.push(to_bytes(v));
            }
            Bias::PerCol(v) => {
                if v.len() != n {
                    return Err(
                        node.unsupported(format!("column bias has {} values for {n} columns", v.len()))
                    );
                }
                bias = Some((Slot::Packed(self.packed.len()), false));
                self.packed.push(to_bytes(v));
            }
        }
        // A convolution's bias computed at run time.
        if let (Op::Conv(_), None, true) = (node.op(), &bias, node.has_input(2)) {
            if node.known(2).is_some() {
                // A constant bias the epilogue did not carry: not this kernel's to drop.
                return Ok(None);
            }
            if node.input_shape(2)?.iter().product::<usize>() != m * self.groups {
                return Err(node.unsupported("bias does not have one value per output channel"));
            }
            bias = Some((Slot::Input(2), true));
        }
        let residual = match (&epi.residual, extra) {
            (None, e) => e,
            (Some(_), Some(_)) => return Ok(None),
            (Some(Residual::Input(i)), None) => {
                if node.input_shape(*i)? != node.output_shape(0)? {
                    return Err(
                        node.unsupported(format!("residual input {i} does not have the output's shape"))
                    );
                }
                Some((Slot::Input(*i), m * n, n, 1, 1.0))
            }
            (Some(Residual::Const(v)), None) => {
                if v.len() != m * n {
                    return Err(node.unsupported("constant residual is not an [M, N] matrix"));
                }
                let slot = Slot::Packed(self.packed.len());
                self.packed.push(to_bytes(v));
                Some((slot, 0, n, 1, 1.0))
            }
        };
        let tile = Tile::for_shape(m, n, self.ty.mma);
        let what = format!(
            "gpu {} {}x{}x{BK}{} M={m} N={n} K={} batch={z}{}{}",
            self.what,
            tile.bm,
            tile.bn,
            match (tile.mma, self.ty.elem) {
                (Some(kind), _) => format!(" mma.{}", kind.name()),
                (None, DType::F16) => " f16".into(),
                (None, _) => String::new(),
            },
            self.k,
            if epi.residual.is_some() { " +residual" } else { "" },
            match epi.activation {
                Activation::None => String::new(),
                a => format!(" +{a:?}"),
            }
        );
        Ok(Some(Box::new(GemmGpu {
            what,
            elem: self.ty.elem,
            tile,
            m,
            n,
            k: self.k,
            batch: self.batch,
            groups: self.groups,
            a: self.a,
            b: self.b,
            epi: Epi {
                alpha: epi.scale,
                bias,
                residual,
                activation: epi.activation,
            },
            packed: self.packed,
            unread: self.unread,
        })))
    }
}

fn matmul(node: &NodeInfo, epi: Epilogue, ty: Operands) -> Result<Option<Box<dyn GpuKernel>>> {
    let sa = node.input_shape(0)?;
    let sb = node.input_shape(1)?;
    if sa.is_empty() || sb.is_empty() {
        return Ok(None);
    }
    let (ra, rb) = (sa.len(), sb.len());
    let m = if ra >= 2 { sa[ra - 2] } else { 1 };
    let k = sa[ra - 1];
    let n = if rb >= 2 { sb[rb - 1] } else { 1 };
    let kb = if rb >= 2 { sb[rb - 2] } else { sb[0] };
    if k != kb {
        return Err(node.unsupported("inner dimensions differ"));
    }
    let ba: Vec<usize> = if ra > 2 { sa[..ra - 2].to_vec() } else { vec![] };
    let bb: Vec<usize> = if rb > 2 { sb[..rb - 2].to_vec() } else { vec![] };
    let nd = ba.len().max(bb.len());
    let pad = |v: &[usize]| -> Vec<usize> {
        let mut r = vec![1; nd - v.len()];
        r.extend_from_slice(v);
        r
    };
    let (pa, pb) = (pad(&ba), pad(&bb));
    let out_batch: Vec<usize> = (0..nd).map(|i| pa[i].max(pb[i])).collect();
    let (sta, stb) = (strides(&pa), strides(&pb));
    let mut parts = Parts {
        m,
        n,
        k,
        batch: (0..nd)
            .map(|i| BatchDim {
                extent: out_batch[i],
                a: if pa[i] == 1 { 0 } else { sta[i] * m * k },
                b: if pb[i] == 1 { 0 } else { stb[i] * k * n },
            })
            .collect(),
        groups: 1,
        a: Mat {
            slot: Slot::Input(0),
            rs: k,
            cs: 1,
        },
        b: BSrc::Mat(Mat {
            slot: Slot::Input(1),
            rs: n,
            cs: 1,
        }),
        packed: vec![],
        unread: vec![],
        what: "matmul".into(),
        ty,
    };
    if let Some(w) = f32s(node, 1) {
        // Already the K×N row-major layout the B loader reads best.
        parts.b = BSrc::Mat(Mat {
            slot: Slot::Packed(0),
            rs: n,
            cs: 1,
        });
        parts.packed.push(to_bytes(&w));
        parts.unread.push(1);
    } else if let Some(w) = f32s(node, 0) {
        // K-major: consecutive threads load consecutive rows of one k into shared memory.
        let count = pa.iter().product();
        parts.a = Mat {
            slot: Slot::Packed(0),
            rs: 1,
            cs: m,
        };
        parts.packed.push(to_bytes(&repack(&w, count, m, k, k, 1, true)));
        parts.unread.push(0);
    }
    if parts.batch.is_empty() {
        parts.batch.push(BatchDim {
            extent: 1,
            a: 0,
            b: 0,
        });
    }
    parts.finish(node, epi, None)
}

fn gemm(
    node: &NodeInfo,
    epi: Epilogue,
    alpha: f32,
    beta: f32,
    trans_a: bool,
    trans_b: bool,
    ty: Operands,
) -> Result<Option<Box<dyn GpuKernel>>> {
    let sa = node.input_shape(0)?;
    let sb = node.input_shape(1)?;
    if sa.len() != 2 || sb.len() != 2 {
        return Ok(None);
    }
    let (m, k) = if trans_a { (sa[1], sa[0]) } else { (sa[0], sa[1]) };
    let (kb, n) = if trans_b { (sb[1], sb[0]) } else { (sb[0], sb[1]) };
    if k != kb {
        return Err(node.unsupported("inner dimensions differ"));
    }
    let (ars, acs) = if trans_a { (1, m) } else { (k, 1) };
    let (brs, bcs) = if trans_b { (1, k) } else { (n, 1) };
    let mut parts = Parts {
        m,
        n,
        k,
        batch: vec![BatchDim {
            extent: 1,
            a: 0,
            b: 0,
        }],
        groups: 1,
        a: Mat {
            slot: Slot::Input(0),
            rs: ars,
            cs: acs,
        },
        b: BSrc::Mat(Mat {
            slot: Slot::Input(1),
            rs: brs,
            cs: bcs,
        }),
        packed: vec![],
        unread: vec![],
        what: "gemm".into(),
        ty,
    };
    if let Some(w) = f32s(node, 1) {
        parts.b = BSrc::Mat(Mat {
            slot: Slot::Packed(parts.packed.len()),
            rs: n,
            cs: 1,
        });
        parts.packed.push(to_bytes(&repack(&w, 1, k, n, brs, bcs, false)));
        parts.unread.push(1);
    }
    if let Some(w) = f32s(node, 0) {
        parts.a = Mat {
            slot: Slot::Packed(parts.packed.len()),
            rs: 1,
            cs: m,
        };
        parts.packed.push(to_bytes(&repack(&w, 1, m, k, ars, acs, true)));
        parts.unread.push(0);
    }
    let mut epi = epi;
    epi.scale *= alpha;
    // C, unidirectionally broadcast to [M, N], read in place with zero strides.
    let mut c = None;
    if node.has_input(2) && beta != 0.0 {
        let sc = node.input_shape(2)?;
        let (cr, cc) = match sc.len() {
            0 => (1, 1),
            1 => (1, sc[0]),
            2 => (sc[0], sc[1]),
            _ => return Ok(None),
        };
        if !(cr == 1 || cr == m) || !(cc == 1 || cc == n) {
            return Err(node.unsupported(format!("C of shape {sc:?} does not broadcast to [{m}, {n}]")));
        }
        let rs = if cr == 1 { 0 } else { cc };
        let cs = if cc == 1 { 0 } else { 1 };
        let slot = match f32s(node, 2) {
            Some(v) => {
                parts.unread.push(2);
                parts.packed.push(to_bytes(&v));
                Slot::Packed(parts.packed.len() - 1)
            }
            None => Slot::Input(2),
        };
        c = Some((slot, 0, rs, cs, beta));
    } else if node.has_input(2) {
        parts.unread.push(2);
    }
    parts.finish(node, epi, c)
}

/// A resolved 2-D convolution window.
#[derive(Clone, Copy, Debug)]
struct Geom {
    c: usize,
    h: usize,
    w: usize,
    kh: usize,
    kw: usize,
    sh: usize,
    sw: usize,
    dh: usize,
    dw: usize,
    ph: usize,
    pw: usize,
    oh: usize,
    ow: usize,
}

/// The window of `attrs` (pads from `auto_pad`), None unless it produces `oh×ow`.
#[allow(clippy::too_many_arguments)]
fn geometry(
    a: &ConvAttrs,
    c: usize,
    h: usize,
    w: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
) -> Option<Geom> {
    if !a.kernel_shape.is_empty() && a.kernel_shape != [kh, kw] {
        return None;
    }
    let get = |v: &Vec<usize>, i: usize| if v.is_empty() { 1 } else { v[i] };
    let (sh, sw) = (get(&a.strides, 0), get(&a.strides, 1));
    let (dh, dw) = (get(&a.dilations, 0), get(&a.dilations, 1));
    if sh == 0 || sw == 0 || dh == 0 || dw == 0 || kh == 0 || kw == 0 {
        return None;
    }
    let axis = |input: usize, k: usize, s: usize, d: usize, i: usize| -> Option<(usize, usize)> {
        let ext = (k - 1) * d + 1;
        let (pb, pe) = match a.auto_pad {
            AutoPad::NotSet if a.pads.is_empty() => (0, 0),
            AutoPad::NotSet => (*a.pads.get(i)?, *a.pads.get(i + 2)?),
            AutoPad::Valid => (0, 0),
            AutoPad::SameUpper | AutoPad::SameLower => {
                let out = input.div_ceil(s);
                let total = ((out.max(1) - 1) * s + ext).saturating_sub(input);
                let b = if a.auto_pad == AutoPad::SameUpper {
                    total / 2
                } else {
                    total.div_ceil(2)
                };
                return Some((b, out));
            }
        };
        let padded = input + pb + pe;
        if padded < ext {
            return None;
        }
        Some((pb, (padded - ext) / s + 1))
    };
    let (ph, o_h) = axis(h, kh, sh, dh, 0)?;
    let (pw, o_w) = axis(w, kw, sw, dw, 1)?;
    if o_h != oh || o_w != ow {
        return None;
    }
    Some(Geom {
        c,
        h,
        w,
        kh,
        kw,
        sh,
        sw,
        dh,
        dw,
        ph,
        pw,
        oh,
        ow,
    })
}

fn conv(
    node: &NodeInfo,
    epi: Epilogue,
    attrs: &ConvAttrs,
    ty: Operands,
) -> Result<Option<Box<dyn GpuKernel>>> {
    if attrs.channels_last {
        return Ok(None);
    }
    let xs = node.input_shape(0)?;
    let ws = node.input_shape(1)?;
    let ys = node.output_shape(0)?;
    if xs.len() != 4 || ws.len() != 4 || ys.len() != 4 {
        return Ok(None);
    }
    let Some(w) = f32s(node, 1) else {
        return Ok(None);
    };
    let (nb, c, h, wd) = (xs[0], xs[1], xs[2], xs[3]);
    let (mt, cg, kh, kw) = (ws[0], ws[1], ws[2], ws[3]);
    let g = attrs.group.max(1);
    if c != cg * g || mt % g != 0 || ys[1] != mt || ys[0] != nb {
        return Err(node.unsupported("weights do not match the input channels and groups"));
    }
    let Some(geo) = geometry(attrs, c, h, wd, kh, kw, ys[2], ys[3]) else {
        return Err(node.unsupported("convolution window does not match the output shape"));
    };
    if g == c && g == mt && g > 1 {
        return dwconv(node, epi, &w, geo, nb, ty.elem);
    }
    let mg = mt / g;
    let kk = cg * kh * kw;
    let pointwise = kh == 1 && kw == 1 && geo.sh == 1 && geo.sw == 1 && geo.ph == 0 && geo.pw == 0;
    let b = if pointwise {
        // The input itself is the K×N matrix of an image and group.
        BSrc::Mat(Mat {
            slot: Slot::Input(0),
            rs: h * wd,
            cs: 1,
        })
    } else {
        BSrc::Im2col(Im2col { input: 0, g: geo })
    };
    let mut unread = vec![1];
    if node.known(2).is_some() {
        unread.push(2);
    }
    let parts = Parts {
        m: mg,
        n: geo.oh * geo.ow,
        k: kk,
        batch: vec![
            BatchDim {
                extent: nb,
                a: 0,
                b: c * h * wd,
            },
            BatchDim {
                extent: g,
                a: mg * kk,
                b: cg * h * wd,
            },
        ],
        groups: g,
        // Each group's [Mg, K] weights stored K-major ([K, Mg]).
        a: Mat {
            slot: Slot::Packed(0),
            rs: 1,
            cs: mg,
        },
        b,
        packed: vec![to_bytes(&repack(&w, g, mg, kk, kk, 1, true))],
        unread,
        what: format!("conv{kh}x{kw}/{}", geo.sh),
        ty,
    };
    parts.finish(node, epi, None)
}

fn resolve<'ctx>(k: &GpuBuilder<'_, 'ctx>, s: Slot) -> Result<PointerValue<'ctx>> {
    match s {
        Slot::Input(i) => k.input(i),
        Slot::Packed(i) => k.packed(i),
    }
}

fn select_i<'ctx>(
    e: &Emit<'_, 'ctx>,
    c: IntValue<'ctx>,
    a: IntValue<'ctx>,
    b: IntValue<'ctx>,
) -> Result<IntValue<'ctx>> {
    Ok(e.b.build_select(c, a, b, "").map_err(llvm)?.into_int_value())
}

fn and<'ctx>(e: &Emit<'_, 'ctx>, a: IntValue<'ctx>, b: IntValue<'ctx>) -> Result<IntValue<'ctx>> {
    e.b.build_and(a, b, "").map_err(llvm)
}

fn ult<'ctx>(e: &Emit<'_, 'ctx>, a: IntValue<'ctx>, n: usize) -> Result<IntValue<'ctx>> {
    e.icmp(IntPredicate::ULT, a, e.i64c(n as i64))
}

/// Element `idx` of `p`, a tensor of `elem` (f32 or f16) values, as f32.
fn load_elem<'ctx>(
    k: &GpuBuilder<'_, 'ctx>,
    e: &Emit<'_, 'ctx>,
    elem: DType,
    p: PointerValue<'ctx>,
    idx: IntValue<'ctx>,
) -> Result<FloatValue<'ctx>> {
    if elem != DType::F16 {
        return e.load_f32(e.gep_f32(p, idx)?);
    }
    let i16t = k.cx.i16_type();
    // SAFETY: the callers' indices lie inside the tensor.
    let at = unsafe { e.b.build_gep(i16t, p, &[idx], "") }.map_err(llvm)?;
    let bits = e.b.build_load(i16t, at, "").map_err(llvm)?.into_int_value();
    k.f16_to_f32(bits)
}

/// Stores `v` as element `idx` of `p`, a tensor of `elem` values (rounded to f16 for f16).
fn store_elem<'ctx>(
    k: &GpuBuilder<'_, 'ctx>,
    e: &Emit<'_, 'ctx>,
    elem: DType,
    p: PointerValue<'ctx>,
    idx: IntValue<'ctx>,
    v: FloatValue<'ctx>,
) -> Result<()> {
    if elem != DType::F16 {
        return e.store(e.gep_f32(p, idx)?, v);
    }
    let i16t = k.cx.i16_type();
    // SAFETY: as for load_elem.
    let at = unsafe { e.b.build_gep(i16t, p, &[idx], "") }.map_err(llvm)?;
    e.store(at, k.f32_to_f16(v)?)
}

/// The element type `slot` holds in a kernel over `elem` tensors: packed constants are f32.
fn slot_elem(slot: Slot, elem: DType) -> DType {
    match slot {
        Slot::Input(_) => elem,
        Slot::Packed(_) => DType::F32,
    }
}

/// `valid ? p[idx] : 0`, never reading outside the buffer (an invalid lane reads element 0).
fn guarded_load<'ctx>(
    k: &GpuBuilder<'_, 'ctx>,
    e: &Emit<'_, 'ctx>,
    elem: DType,
    p: PointerValue<'ctx>,
    idx: IntValue<'ctx>,
    valid: IntValue<'ctx>,
) -> Result<FloatValue<'ctx>> {
    let safe = select_i(e, valid, idx, e.i64c(0))?;
    let v = load_elem(k, e, elem, p, safe)?;
    Ok(e.b
        .build_select(valid, v, e.f32c(0.0), "")
        .map_err(llvm)?
        .into_float_value())
}

/// Applies `act` to a scalar (the CPU kernels' polynomials on a one-lane vector).
fn activate<'ctx>(e: &Emit<'_, 'ctx>, act: Activation, x: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
    if act == Activation::None {
        return Ok(x);
    }
    let v = e.splat(x, 1)?;
    let y = crate::gen::activation::activation(e, act, v, 1)?;
    Ok(e.b
        .build_extract_element(y, e.i32c(0), "")
        .map_err(llvm)?
        .into_float_value())
}

impl Epi {
    /// `act(alpha·acc + bias[bias_idx] + scale·residual[res_idx])`, reading run-time tensors
    /// of `elem`.
    #[allow(clippy::too_many_arguments)]
    fn apply<'ctx>(
        &self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        elem: DType,
        acc: FloatValue<'ctx>,
        bias_idx: (IntValue<'ctx>, IntValue<'ctx>),
        res_idx: impl FnOnce(usize, usize, usize) -> Result<IntValue<'ctx>>,
    ) -> Result<FloatValue<'ctx>> {
        let b = e.b;
        let mut v = acc;
        if self.alpha != 1.0 {
            v = b.build_float_mul(v, e.f32c(self.alpha), "").map_err(llvm)?;
        }
        if let Some((slot, per_row)) = self.bias {
            let idx = if per_row { bias_idx.0 } else { bias_idx.1 };
            let x = load_elem(k, e, slot_elem(slot, elem), resolve(k, slot)?, idx)?;
            v = b.build_float_add(v, x, "").map_err(llvm)?;
        }
        if let Some((slot, zs, rs, cs, scale)) = self.residual {
            let idx = res_idx(zs, rs, cs)?;
            let mut x = load_elem(k, e, slot_elem(slot, elem), resolve(k, slot)?, idx)?;
            if scale != 1.0 {
                x = b.build_float_mul(x, e.f32c(scale), "").map_err(llvm)?;
            }
            v = b.build_float_add(v, x, "").map_err(llvm)?;
        }
        activate(e, self.activation, v)
    }
}

/// How the block's 8 warps share a tile on tensor cores. The tile is a grid of 16×8 `mma`
/// units (`bm/16` by `bn/8`); with 8 or more units each warp takes `per_warp` consecutive units
/// of one unit row (so one A fragment serves them all), with fewer (16×16, 16×32, 32×16 tiles)
/// warp `w` computes unit `w mod units` and only the first `units` warps store.
struct WarpTiles<'ctx> {
    tile: Tile,
    kind: MmaKind,
    per_warp: usize,
    /// Unit row and first unit column of this warp.
    unit_row: IntValue<'ctx>,
    unit_col: IntValue<'ctx>,
    /// `lane / 4` and `lane % 4`: the fragment coordinates of PTX's layout.
    group: IntValue<'ctx>,
    in_group: IntValue<'ctx>,
    /// Whether this warp's results are stored (false for a duplicate of another warp's unit).
    owner: IntValue<'ctx>,
}

impl<'ctx> WarpTiles<'ctx> {
    fn new(e: &Emit<'_, 'ctx>, t: Tile, kind: MmaKind, tid: IntValue<'ctx>) -> Result<WarpTiles<'ctx>> {
        let (units_n, units) = (t.bn / 8, (t.bm / 16) * (t.bn / 8));
        let warp = e.udivc(tid, 32)?;
        let lane = e.uremc(tid, 32)?;
        let warps = THREADS / 32;
        let (per_warp, first, owner) = if units >= warps {
            (
                units / warps,
                e.mulc(warp, (units / warps) as i64)?,
                ult(e, warp, warps)?,
            )
        } else {
            (1, e.uremc(warp, units as i64)?, ult(e, warp, units)?)
        };
        Ok(WarpTiles {
            tile: t,
            kind,
            per_warp,
            unit_row: e.udivc(first, units_n as i64)?,
            unit_col: e.uremc(first, units_n as i64)?,
            group: e.udivc(lane, 4)?,
            in_group: e.uremc(lane, 4)?,
            owner,
        })
    }

    /// Two values as one 32-bit register of `self.kind`, `lo` in the low half. The values are
    /// of that type already (the kernel is chosen for such operands; f16 tensors are widened
    /// exactly as they are staged), so the narrowing is exact.
    fn pack(
        &self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        lo: FloatValue<'ctx>,
        hi: FloatValue<'ctx>,
    ) -> Result<IntValue<'ctx>> {
        let i32t = e.cx.i32_type();
        let sixteen = i32t.const_int(16, false);
        match self.kind {
            MmaKind::Bf16 => {
                // A bf16 is the upper half of its f32.
                let bits = |v: FloatValue<'ctx>| -> Result<IntValue<'ctx>> {
                    Ok(e.b.build_bit_cast(v, i32t, "").map_err(llvm)?.into_int_value())
                };
                let lo =
                    e.b.build_right_shift(bits(lo)?, sixteen, false, "")
                        .map_err(llvm)?;
                let hi =
                    e.b.build_and(bits(hi)?, i32t.const_int(0xffff_0000, false), "")
                        .map_err(llvm)?;
                e.b.build_or(lo, hi, "").map_err(llvm)
            }
            MmaKind::F16 => {
                let bits = |v: FloatValue<'ctx>| -> Result<IntValue<'ctx>> {
                    e.b.build_int_z_extend(k.f32_to_f16(v)?, i32t, "").map_err(llvm)
                };
                let hi = e.b.build_left_shift(bits(hi)?, sixteen, "").map_err(llvm)?;
                e.b.build_or(bits(lo)?, hi, "").map_err(llvm)
            }
        }
    }

    /// Reads two consecutive-k elements `(k, x)` and `(k + 1, x)` of a k-major shared slice
    /// with row stride `stride`, as one packed register.
    fn pair(
        &self,
        kb: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        sh: PointerValue<'ctx>,
        stride: usize,
        k: IntValue<'ctx>,
        x: IntValue<'ctx>,
    ) -> Result<IntValue<'ctx>> {
        let at = e.add(e.mulc(k, stride as i64)?, x)?;
        let lo = e.load_f32(e.gep_f32(sh, at)?)?;
        let hi = e.load_f32(e.gep_f32(sh, e.addc(at, stride as i64)?)?)?;
        self.pack(kb, e, lo, hi)
    }

    /// One K step (BK = 16 = the `mma` k) of this warp's units: A and B fragments from the
    /// shared slices (both k-major), then an `mma` per unit into the accumulators.
    fn multiply(
        &self,
        k: &GpuBuilder<'_, 'ctx>,
        e: &Emit<'_, 'ctx>,
        a_sh: PointerValue<'ctx>,
        b_sh: PointerValue<'ctx>,
        acc: PointerValue<'ctx>,
    ) -> Result<()> {
        let (sa, sb) = (self.tile.sa(), self.tile.sb());
        let k_lo = e.mulc(self.in_group, 2)?;
        let k_hi = e.addc(k_lo, 8)?;
        let row = e.add(e.mulc(self.unit_row, 16)?, self.group)?;
        let row8 = e.addc(row, 8)?;
        // a0a1: (g, 2t), a2a3: (g + 8, 2t), a4a5: (g, 2t + 8), a6a7: (g + 8, 2t + 8).
        let a = [
            self.pair(k, e, a_sh, sa, k_lo, row)?,
            self.pair(k, e, a_sh, sa, k_lo, row8)?,
            self.pair(k, e, a_sh, sa, k_hi, row)?,
            self.pair(k, e, a_sh, sa, k_hi, row8)?,
        ];
        for u in 0..self.per_warp {
            // b0b1: (2t, g), b2b3: (2t + 8, g) of the unit's 16×8 B.
            let col = e.add(e.mulc(e.addc(self.unit_col, u as i64)?, 8)?, self.group)?;
            let b = [
                self.pair(k, e, b_sh, sb, k_lo, col)?,
                self.pair(k, e, b_sh, sb, k_hi, col)?,
            ];
            let slot = |q: usize| e.gep_f32c(acc, (u * 4 + q) as i64);
            let c = [
                e.load_f32(slot(0)?)?,
                e.load_f32(slot(1)?)?,
                e.load_f32(slot(2)?)?,
                e.load_f32(slot(3)?)?,
            ];
            let d = k.mma(self.kind, a, b, c)?;
            for (q, v) in d.iter().enumerate() {
                e.store(slot(q)?, *v)?;
            }
        }
        Ok(())
    }

    /// The tile coordinates (row, column) of accumulator `q` (0..4) of unit `u`: c0c1 at
    /// (g, 2t..2t+1), c2c3 at (g + 8, 2t..2t+1) of the unit.
    fn element(&self, e: &Emit<'_, 'ctx>, u: usize, q: usize) -> Result<(IntValue<'ctx>, IntValue<'ctx>)> {
        let row = e.addc(
            e.add(e.mulc(self.unit_row, 16)?, self.group)?,
            if q >= 2 { 8 } else { 0 },
        )?;
        let col = e.addc(
            e.add(
                e.mulc(e.addc(self.unit_col, u as i64)?, 8)?,
                e.mulc(self.in_group, 2)?,
            )?,
            (q & 1) as i64,
        )?;
        Ok((row, col))
    }
}

impl GpuKernel for GemmGpu {
    fn describe(&self) -> String {
        self.what.clone()
    }

    fn launch(&self) -> LaunchDims {
        let z: usize = self.batch.iter().map(|d| d.extent).product();
        LaunchDims {
            grid: [
                self.n.div_ceil(self.tile.bn) as u32,
                self.m.div_ceil(self.tile.bm) as u32,
                z as u32,
            ],
            block: [THREADS as u32, 1, 1],
            shared_bytes: self.tile.shared_bytes() as u32,
        }
    }

    fn packed_constants(&self) -> Vec<PackedConst> {
        self.packed.clone()
    }

    fn reads_input(&self, i: usize) -> bool {
        !self.unread.contains(&i)
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let f32t = k.cx.f32_type();
        let t = self.tile;
        let (bm, bn, tm, tn, sa, sb) = (t.bm, t.bn, t.tm(), t.tn(), t.sa(), t.sb());
        let tid = k.sreg64(Sreg::TidX)?;
        let col0 = e.mulc(k.sreg64(Sreg::CtaidX)?, bn as i64)?;
        let row0 = e.mulc(k.sreg64(Sreg::CtaidY)?, bm as i64)?;
        let z = k.sreg64(Sreg::CtaidZ)?;
        // Operand offsets of this batch entry (last dimension fastest).
        let (mut a_off, mut b_off) = (e.i64c(0), e.i64c(0));
        let mut rest = z;
        for d in self.batch.iter().rev() {
            let idx = e.uremc(rest, d.extent as i64)?;
            rest = e.udivc(rest, d.extent as i64)?;
            a_off = e.add(a_off, e.mulc(idx, d.a as i64)?)?;
            b_off = e.add(b_off, e.mulc(idx, d.b as i64)?)?;
        }
        let smem = k.shared()?;
        let a_sh = smem;
        let b_sh = e.gep_f32c(smem, (BK * sa) as i64)?;
        let tx = e.uremc(tid, TX as i64)?;
        let ty = e.udivc(tid, TX as i64)?;
        let warps = if let Some(kind) = t.mma {
            Some(WarpTiles::new(&e, t, kind, tid)?)
        } else {
            None
        };
        let n_acc = warps.as_ref().map_or(tm * tn, |w| w.per_warp * 4);
        let acc = e.entry_alloca(f32t.array_type(n_acc as u32), "acc")?;
        let acc_at = |r: usize, c: usize| e.gep_f32c(acc, (r * tn + c) as i64);
        for i in 0..n_acc {
            e.store(e.gep_f32c(acc, i as i64)?, f32t.const_zero())?;
        }
        let a_ptr = resolve(k, self.a.slot)?;
        let (m, n, kk) = (self.m, self.n, self.k);
        e.for_range(e.i64c(0), e.i64c(kk as i64), BK as i64, |k0| {
            // A slice: bm×BK elements, THREADS at a time, along A's contiguous axis.
            let a_k_fast = self.a.cs == 1 || self.a.rs != 1;
            for l in 0..(bm * BK) / THREADS {
                let el = e.addc(tid, (l * THREADS) as i64)?;
                let (ii, kq) = if a_k_fast {
                    (e.udivc(el, BK as i64)?, e.uremc(el, BK as i64)?)
                } else {
                    (e.uremc(el, bm as i64)?, e.udivc(el, bm as i64)?)
                };
                let gi = e.add(row0, ii)?;
                let gk = e.add(k0, kq)?;
                let valid = and(&e, ult(&e, gi, m)?, ult(&e, gk, kk)?)?;
                let idx = e.add(
                    a_off,
                    e.add(e.mulc(gi, self.a.rs as i64)?, e.mulc(gk, self.a.cs as i64)?)?,
                )?;
                let v = guarded_load(k, &e, slot_elem(self.a.slot, self.elem), a_ptr, idx, valid)?;
                e.store(e.gep_f32(a_sh, e.add(e.mulc(kq, sa as i64)?, ii)?)?, v)?;
            }
            // B slice: BK×bn.
            let b_k_fast = matches!(self.b, BSrc::Mat(bm) if bm.cs != 1 && bm.rs == 1);
            for l in 0..(BK * bn) / THREADS {
                let el = e.addc(tid, (l * THREADS) as i64)?;
                let (kq, jj) = if b_k_fast {
                    (e.uremc(el, BK as i64)?, e.udivc(el, BK as i64)?)
                } else {
                    (e.udivc(el, bn as i64)?, e.uremc(el, bn as i64)?)
                };
                let gk = e.add(k0, kq)?;
                let gj = e.add(col0, jj)?;
                let mut valid = and(&e, ult(&e, gk, kk)?, ult(&e, gj, n)?)?;
                let (ptr, elem, idx) = match self.b {
                    BSrc::Mat(bm) => (
                        resolve(k, bm.slot)?,
                        slot_elem(bm.slot, self.elem),
                        e.add(
                            b_off,
                            e.add(e.mulc(gk, bm.rs as i64)?, e.mulc(gj, bm.cs as i64)?)?,
                        )?,
                    ),
                    BSrc::Im2col(ic) => {
                        let g = ic.g;
                        let taps = (g.kh * g.kw) as i64;
                        let ch = e.udivc(gk, taps)?;
                        let t = e.uremc(gk, taps)?;
                        let khi = e.udivc(t, g.kw as i64)?;
                        let kwi = e.uremc(t, g.kw as i64)?;
                        let oh = e.udivc(gj, g.ow as i64)?;
                        let ow = e.uremc(gj, g.ow as i64)?;
                        // Negative coordinates wrap to large unsigned values: one compare each.
                        let ih = e.addc(
                            e.add(e.mulc(oh, g.sh as i64)?, e.mulc(khi, g.dh as i64)?)?,
                            -(g.ph as i64),
                        )?;
                        let iw = e.addc(
                            e.add(e.mulc(ow, g.sw as i64)?, e.mulc(kwi, g.dw as i64)?)?,
                            -(g.pw as i64),
                        )?;
                        valid = and(&e, valid, and(&e, ult(&e, ih, g.h)?, ult(&e, iw, g.w)?)?)?;
                        let idx = e.add(
                            e.mulc(ch, (g.h * g.w) as i64)?,
                            e.add(e.mulc(ih, g.w as i64)?, iw)?,
                        )?;
                        (k.input(ic.input)?, self.elem, e.add(b_off, idx)?)
                    }
                };
                let v = guarded_load(k, &e, elem, ptr, idx, valid)?;
                e.store(e.gep_f32(b_sh, e.add(e.mulc(kq, sb as i64)?, jj)?)?, v)?;
            }
            k.barrier()?;
            if let Some(warps) = &warps {
                warps.multiply(k, &e, a_sh, b_sh, acc)?;
                // The next slice overwrites what slower warps may still read.
                return k.barrier();
            }
            for q in 0..BK {
                let av: Vec<FloatValue> = (0..tm)
                    .map(|r| e.load_f32(e.gep_f32(a_sh, e.addc(ty, (q * sa + r * TY) as i64)?)?))
                    .collect::<Result<_>>()?;
                let bv: Vec<FloatValue> = (0..tn)
                    .map(|c| e.load_f32(e.gep_f32(b_sh, e.addc(tx, (q * sb + c * TX) as i64)?)?))
                    .collect::<Result<_>>()?;
                for (r, a) in av.iter().enumerate() {
                    for (c, bval) in bv.iter().enumerate() {
                        let p = acc_at(r, c)?;
                        let s = e.load_f32(p)?;
                        let s = e
                            .intrinsic(
                                "llvm.fma",
                                &[f32t.into()],
                                &[(*a).into(), (*bval).into(), s.into()],
                            )?
                            .into_float_value();
                        e.store(p, s)?;
                    }
                }
            }
            // The next slice overwrites what slower threads may still read.
            k.barrier()
        })?;
        let g_idx = e.uremc(z, self.groups as i64)?;
        // Stores accumulator `slot` as output element (i, j) when inside the output (and
        // `also`, when given).
        let store = |slot: usize, i, j, also: Option<_>| -> Result<()> {
            let mut inside = and(&e, ult(&e, i, m)?, ult(&e, j, n)?)?;
            if let Some(c) = also {
                inside = and(&e, inside, c)?;
            }
            e.if_then(inside, || {
                let s = e.load_f32(e.gep_f32c(acc, slot as i64)?)?;
                let bias_row = e.add(e.mulc(g_idx, m as i64)?, i)?;
                let v = self.epi.apply(k, &e, self.elem, s, (bias_row, j), |zs, rs, cs| {
                    e.add(
                        e.mulc(z, zs as i64)?,
                        e.add(e.mulc(i, rs as i64)?, e.mulc(j, cs as i64)?)?,
                    )
                })?;
                let o = e.add(e.mulc(z, (m * n) as i64)?, e.add(e.mulc(i, n as i64)?, j)?)?;
                store_elem(k, &e, self.elem, k.output(0)?, o, v)
            })
        };
        if let Some(warps) = &warps {
            for u in 0..warps.per_warp {
                for q in 0..4 {
                    let (i, j) = warps.element(&e, u, q)?;
                    store(u * 4 + q, e.add(row0, i)?, e.add(col0, j)?, Some(warps.owner))?;
                }
            }
            return k.ret();
        }
        for r in 0..tm {
            for c in 0..tn {
                let i = e.add(row0, e.addc(ty, (r * TY) as i64)?)?;
                let j = e.add(col0, e.addc(tx, (c * TX) as i64)?)?;
                store(r * tn + c, i, j, None)?;
            }
        }
        k.ret()
    }
}

/// A depthwise convolution (groups == channels == output channels): one thread per output
/// element, consecutive threads along a row of the output.
pub struct DwConvGpu {
    what: String,
    /// The element type of the input, output and run-time bias/residual (f32 or f16).
    elem: DType,
    batch: usize,
    g: Geom,
    epi: Epi,
    packed: Vec<PackedConst>,
    unread: Vec<usize>,
}

const DW_BLOCK: usize = 256;

fn dwconv(
    node: &NodeInfo,
    epi: Epilogue,
    w: &[f32],
    g: Geom,
    batch: usize,
    elem: DType,
) -> Result<Option<Box<dyn GpuKernel>>> {
    let total = batch * g.c * g.oh * g.ow;
    if total.div_ceil(DW_BLOCK) >= 1 << 31 {
        return Ok(None);
    }
    let mut packed = vec![to_bytes(w)];
    let mut unread = vec![1];
    if node.known(2).is_some() {
        unread.push(2);
    }
    let bias = match &epi.bias {
        Bias::PerRow(v) if v.len() == g.c => {
            packed.push(to_bytes(v));
            Some((Slot::Packed(1), true))
        }
        Bias::None if node.has_input(2) => {
            if node.known(2).is_some() {
                return Ok(None);
            }
            Some((Slot::Input(2), true))
        }
        Bias::None => None,
        _ => return Ok(None),
    };
    let residual = match &epi.residual {
        None => None,
        Some(Residual::Input(i)) => {
            if node.input_shape(*i)? != node.output_shape(0)? {
                return Err(node.unsupported(format!("residual input {i} does not have the output's shape")));
            }
            Some((Slot::Input(*i), 0, 0, 1, 1.0))
        }
        Some(Residual::Const(_)) => return Ok(None),
    };
    Ok(Some(Box::new(DwConvGpu {
        what: format!(
            "gpu dwconv{}x{}/{}{} C={} {}x{}{}{}",
            g.kh,
            g.kw,
            g.sh,
            if elem == DType::F16 { " f16" } else { "" },
            g.c,
            g.oh,
            g.ow,
            if residual.is_some() { " +residual" } else { "" },
            match epi.activation {
                Activation::None => String::new(),
                a => format!(" +{a:?}"),
            }
        ),
        elem,
        batch,
        g,
        epi: Epi {
            alpha: epi.scale,
            bias,
            residual,
            activation: epi.activation,
        },
        packed,
        unread,
    })))
}

impl GpuKernel for DwConvGpu {
    fn describe(&self) -> String {
        self.what.clone()
    }

    fn launch(&self) -> LaunchDims {
        let total = self.batch * self.g.c * self.g.oh * self.g.ow;
        LaunchDims {
            grid: [total.div_ceil(DW_BLOCK) as u32, 1, 1],
            block: [DW_BLOCK as u32, 1, 1],
            shared_bytes: 0,
        }
    }

    fn packed_constants(&self) -> Vec<PackedConst> {
        self.packed.clone()
    }

    fn reads_input(&self, i: usize) -> bool {
        !self.unread.contains(&i)
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let g = self.g;
        let f32t = k.cx.f32_type();
        let total = self.batch * g.c * g.oh * g.ow;
        let tid = k.sreg64(Sreg::TidX)?;
        let bx = k.sreg64(Sreg::CtaidX)?;
        let idx = e.add(e.mulc(bx, DW_BLOCK as i64)?, tid)?;
        let x = k.input(0)?;
        let w = k.packed(0)?;
        let acc = e.entry_alloca(f32t, "acc")?;
        e.if_then(ult(&e, idx, total)?, || {
            let ow = e.uremc(idx, g.ow as i64)?;
            let t = e.udivc(idx, g.ow as i64)?;
            let oh = e.uremc(t, g.oh as i64)?;
            let plane = e.udivc(t, g.oh as i64)?;
            let ch = e.uremc(plane, g.c as i64)?;
            let x_base = e.mulc(plane, (g.h * g.w) as i64)?;
            let w_base = e.mulc(ch, (g.kh * g.kw) as i64)?;
            let ih0 = e.addc(e.mulc(oh, g.sh as i64)?, -(g.ph as i64))?;
            let iw0 = e.addc(e.mulc(ow, g.sw as i64)?, -(g.pw as i64))?;
            e.store(acc, f32t.const_zero())?;
            e.for_n(g.kh as i64, |khi| {
                let ih = e.add(ih0, e.mulc(khi, g.dh as i64)?)?;
                let row_ok = ult(&e, ih, g.h)?;
                e.for_n(g.kw as i64, |kwi| {
                    let iw = e.add(iw0, e.mulc(kwi, g.dw as i64)?)?;
                    let valid = and(&e, row_ok, ult(&e, iw, g.w)?)?;
                    let xi = e.add(x_base, e.add(e.mulc(ih, g.w as i64)?, iw)?)?;
                    let xv = guarded_load(k, &e, self.elem, x, xi, valid)?;
                    let wi = e.add(w_base, e.add(e.mulc(khi, g.kw as i64)?, kwi)?)?;
                    let wv = e.load_f32(e.gep_f32(w, wi)?)?;
                    let s = e.load_f32(acc)?;
                    let s = e
                        .intrinsic("llvm.fma", &[f32t.into()], &[xv.into(), wv.into(), s.into()])?
                        .into_float_value();
                    e.store(acc, s)
                })
            })?;
            let s = e.load_f32(acc)?;
            let v = self.epi.apply(k, &e, self.elem, s, (ch, ch), |_, _, _| Ok(idx))?;
            store_elem(k, &e, self.elem, k.output(0)?, idx, v)
        })?;
        k.ret()
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph_for, ptxas_check};
    use crate::nvptx::MmaKind;
    use kiln_ir::{AutoPad, Binary, ConvAttrs, DType, Dim, Graph, Op, Tensor, TensorType, Unary, ValueId};

    use crate::test_rng::TestRng as Rng;

    /// A graph under construction with its run-time inputs.
    struct G {
        g: Graph,
        rng: Rng,
        inputs: Vec<Tensor>,
        names: usize,
        values: Values,
    }

    /// What a test graph's operands hold.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Values {
        F32,
        /// As bf16 autocast writes them: f32 constants rounded to bf16, run-time inputs through
        /// a `Cast<f32>(Cast<bf16>(x))` pair.
        Bf16,
        /// f16 tensors throughout.
        F16,
    }

    impl G {
        fn new(seed: u64) -> G {
            G {
                g: Graph::new("t"),
                rng: Rng::new(seed),
                inputs: vec![],
                names: 0,
                values: Values::F32,
            }
        }

        fn bf16(seed: u64) -> G {
            G {
                values: Values::Bf16,
                ..G::new(seed)
            }
        }

        fn f16(seed: u64) -> G {
            G {
                values: Values::F16,
                ..G::new(seed)
            }
        }

        /// Random values as a tensor holding `values`.
        fn tensor(&mut self, values: Values, shape: &[usize]) -> Tensor {
            let v = self.rng.vec(shape.iter().product());
            let s = shape.to_vec();
            match values {
                Values::F32 => Tensor::from_vec(s, v),
                Values::Bf16 => Tensor::from_vec(
                    s,
                    v.iter()
                        .map(|&x| kiln_ir::tensor::bf16_from_f64(f64::from(x)).to_f32())
                        .collect(),
                ),
                Values::F16 => Tensor::from_vec(s, v.iter().map(|&x| half::f16::from_f32(x)).collect()),
            }
        }

        fn input(&mut self, shape: &[usize]) -> ValueId {
            self.input_as(self.values, shape)
        }

        /// A run-time f32 input, whatever the operand mode.
        fn input_f32(&mut self, shape: &[usize]) -> ValueId {
            self.input_as(Values::F32, shape)
        }

        fn input_as(&mut self, values: Values, shape: &[usize]) -> ValueId {
            // Run-time bf16 values come from the Cast pair, not from the data.
            let data = if values == Values::Bf16 {
                Values::F32
            } else {
                values
            };
            let t = self.tensor(data, shape);
            let ty = TensorType::new(t.dtype(), shape.iter().map(|&d| Dim::Fixed(d)).collect());
            self.inputs.push(t);
            let x = self.g.add_input(format!("in{}", self.inputs.len()), ty);
            if values != Values::Bf16 {
                return x;
            }
            let narrow = self.node(Op::Cast { to: DType::BF16 }, vec![Some(x)]);
            self.node(Op::Cast { to: DType::F32 }, vec![Some(narrow)])
        }

        fn constant(&mut self, shape: &[usize]) -> ValueId {
            let t = self.tensor(self.values, shape);
            self.names += 1;
            self.g.add_const(format!("c{}", self.names), t)
        }

        fn operand(&mut self, shape: &[usize], constant: bool) -> ValueId {
            if constant {
                self.constant(shape)
            } else {
                self.input(shape)
            }
        }

        fn node(&mut self, op: Op, inputs: Vec<Option<ValueId>>) -> ValueId {
            self.names += 1;
            let n = self.names;
            self.g.add(format!("n{n}"), op, inputs, format!("v{n}")).unwrap()
        }

        /// Checks the graph (output `y`) in emulation; returns the kernel descriptions.
        fn check(self, y: ValueId) -> Vec<String> {
            self.check_for(y, crate::nvptx::emulate::SM)
        }

        /// [`G::check`] planned for compute capability `sm`.
        fn check_for(mut self, y: ValueId, sm: u32) -> Vec<String> {
            self.g.add_output("y", y);
            check_graph_for(&self.g, &self.inputs, sm)
        }
    }

    fn conv(kernel: [usize; 2], strides: [usize; 2], pads: [usize; 4], dil: [usize; 2], group: usize) -> Op {
        Op::Conv(ConvAttrs {
            kernel_shape: kernel.to_vec(),
            strides: strides.to_vec(),
            pads: pads.to_vec(),
            dilations: dil.to_vec(),
            group,
            auto_pad: AutoPad::NotSet,
            channels_last: false,
        })
    }

    fn assert_gpu(d: &[String], what: &str) {
        assert!(
            d.iter().all(|s| s.starts_with(what)),
            "kernels {d:?}, expected {what}"
        );
    }

    #[test]
    fn matmul_shapes() {
        // Not multiples of the tile; more than one block along M, N and K; size-1 dims.
        let shapes = [
            (1, 1, 1),
            (5, 7, 3),
            (13, 17, 29),
            (70, 33, 130),
            (1, 40, 65),
            (65, 1, 2),
        ];
        for (i, &(m, k, n)) in shapes.iter().enumerate() {
            for (ca, cb) in [(false, true), (false, false), (true, false)] {
                let mut g = G::new(i as u64);
                let a = g.operand(&[m, k], ca);
                let b = g.operand(&[k, n], cb);
                let y = g.node(Op::MatMul, vec![Some(a), Some(b)]);
                assert_gpu(&g.check(y), "gpu matmul");
            }
        }
    }

    #[test]
    fn matmul_batched_and_broadcast() {
        let cases: &[(&[usize], &[usize], bool)] = &[
            (&[2, 3, 5, 7], &[7, 9], true),
            (&[2, 3, 5, 7], &[7, 9], false),
            (&[2, 1, 5, 7], &[3, 7, 4], false),
            (&[3, 5, 7], &[3, 7, 20], true),
            (&[1, 70, 18], &[2, 18, 66], false),
            (&[7], &[7, 5], true),
            (&[3, 7], &[7], false),
            (&[4, 9, 19], &[19], false),
        ];
        for (i, (a, b, cb)) in cases.iter().enumerate() {
            let mut g = G::new(100 + i as u64);
            let a = g.input(a);
            let b = g.operand(b, *cb);
            let y = g.node(Op::MatMul, vec![Some(a), Some(b)]);
            assert_gpu(&g.check(y), "gpu matmul");
        }
    }

    #[test]
    fn gemm_variants() {
        let (m, k, n) = (11, 23, 67);
        for trans_a in [false, true] {
            for trans_b in [false, true] {
                for (cshape, cconst) in [
                    (None, false),
                    (Some(vec![n]), true),
                    (Some(vec![m, 1]), false),
                    (Some(vec![m, n]), true),
                    (Some(vec![]), true),
                    (Some(vec![m, n]), false),
                    (Some(vec![1, n]), false),
                ] {
                    for (aconst, bconst) in [(false, true), (false, false), (true, false)] {
                        let mut g = G::new(7);
                        let a = g.operand(&if trans_a { [k, m] } else { [m, k] }, aconst);
                        let b = g.operand(&if trans_b { [n, k] } else { [k, n] }, bconst);
                        let c = cshape.as_ref().map(|s| g.operand(s, cconst));
                        let op = Op::Gemm {
                            alpha: 1.5,
                            beta: if cconst { 0.5 } else { -1.25 },
                            trans_a,
                            trans_b,
                        };
                        let y = g.node(op, vec![Some(a), Some(b), c]);
                        assert_gpu(&g.check(y), "gpu gemm");
                    }
                }
            }
        }
    }

    #[test]
    fn conv_shapes() {
        // (n, c, h, w, m, kernel, stride, pads, dilation, group)
        let cases = [
            (1, 3, 9, 11, 5, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
            (2, 4, 8, 8, 8, [1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1),
            (1, 16, 7, 7, 13, [1, 1], [2, 2], [0, 0, 0, 0], [1, 1], 1),
            (1, 3, 23, 23, 16, [7, 7], [2, 2], [3, 3, 3, 3], [1, 1], 1),
            (1, 5, 12, 10, 7, [3, 3], [1, 1], [2, 1, 0, 2], [2, 2], 1),
            (1, 6, 13, 9, 6, [3, 2], [2, 1], [1, 0, 1, 1], [1, 2], 2),
            (2, 8, 6, 6, 12, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 4),
            (1, 4, 6, 6, 8, [1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 2),
            (1, 20, 12, 12, 70, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
        ];
        for (i, &(n, c, h, w, m, k, s, p, d, grp)) in cases.iter().enumerate() {
            for bias in [true, false] {
                let mut g = G::new(200 + i as u64);
                let x = g.input(&[n, c, h, w]);
                let wt = g.constant(&[m, c / grp, k[0], k[1]]);
                let b = bias.then(|| g.constant(&[m]));
                let y = g.node(conv(k, s, p, d, grp), vec![Some(x), Some(wt), b]);
                assert_gpu(&g.check(y), "gpu conv");
            }
        }
        // A bias computed at run time.
        let mut g = G::new(250);
        let x = g.input(&[1, 3, 5, 5]);
        let wt = g.constant(&[4, 3, 3, 3]);
        let b = g.input(&[4]);
        let y = g.node(
            conv([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
            vec![Some(x), Some(wt), Some(b)],
        );
        assert_gpu(&g.check(y), "gpu conv");
    }

    #[test]
    fn depthwise_shapes() {
        // (n, c, h, w, k, stride, pad, dilation)
        let cases = [
            (1, 8, 14, 14, 3, 1, 1, 1),
            (1, 5, 15, 13, 3, 2, 1, 1),
            (2, 3, 7, 7, 5, 1, 2, 1),
            (1, 6, 11, 12, 3, 3, 0, 2),
            (1, 3, 30, 31, 3, 1, 1, 1),
        ];
        for (i, &(n, c, h, w, k, s, p, d)) in cases.iter().enumerate() {
            let mut g = G::new(300 + i as u64);
            let x = g.input(&[n, c, h, w]);
            let wt = g.constant(&[c, 1, k, k]);
            let b = g.constant(&[c]);
            let y = g.node(
                conv([k, k], [s, s], [p, p, p, p], [d, d], c),
                vec![Some(x), Some(wt), Some(b)],
            );
            assert_gpu(&g.check(y), "gpu dwconv");
        }
    }

    /// The activations the epilogue fuses, as graph nodes after `v`.
    fn activate(g: &mut G, v: ValueId, which: usize) -> ValueId {
        match which {
            0 => g.node(Op::Unary(Unary::Relu), vec![Some(v)]),
            1 => {
                g.names += 1;
                let lo = g.g.add_const(format!("lo{}", g.names), Tensor::scalar(-0.2f32));
                let hi = g.g.add_const(format!("hi{}", g.names), Tensor::scalar(0.3f32));
                g.node(Op::Clip, vec![Some(v), Some(lo), Some(hi)])
            }
            2 => g.node(Op::Unary(Unary::Sigmoid), vec![Some(v)]),
            3 => {
                let s = g.node(Op::Unary(Unary::Sigmoid), vec![Some(v)]);
                g.node(Op::Binary(Binary::Mul), vec![Some(v), Some(s)])
            }
            4 => g.node(Op::Unary(Unary::HardSwish), vec![Some(v)]),
            5 => g.node(Op::Unary(Unary::Gelu { tanh: false }), vec![Some(v)]),
            _ => g.node(Op::Unary(Unary::Gelu { tanh: true }), vec![Some(v)]),
        }
    }

    #[test]
    fn fused_epilogues() {
        for act in 0..7 {
            for residual in [false, true] {
                // Conv: bias per row, residual, activation.
                let mut g = G::new(400 + act as u64);
                let x = g.input(&[2, 5, 9, 7]);
                let wt = g.constant(&[6, 5, 3, 3]);
                let b = g.constant(&[6]);
                let mut y = g.node(
                    conv([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
                    vec![Some(x), Some(wt), Some(b)],
                );
                if residual {
                    let r = g.input(&[2, 6, 9, 7]);
                    y = g.node(Op::Binary(Binary::Add), vec![Some(y), Some(r)]);
                }
                let y = activate(&mut g, y, act);
                let d = g.check(y);
                assert_eq!(d.len(), 1, "one fused kernel: {d:?}");
                assert_gpu(&d, "gpu conv");
                assert_eq!(d[0].contains("+residual"), residual, "{d:?}");

                // Depthwise.
                let mut g = G::new(450 + act as u64);
                let x = g.input(&[1, 4, 8, 9]);
                let wt = g.constant(&[4, 1, 3, 3]);
                let b = g.constant(&[4]);
                let mut y = g.node(
                    conv([3, 3], [2, 2], [1, 1, 1, 1], [1, 1], 4),
                    vec![Some(x), Some(wt), Some(b)],
                );
                if residual {
                    let r = g.input(&[1, 4, 4, 5]);
                    y = g.node(Op::Binary(Binary::Add), vec![Some(y), Some(r)]);
                }
                let y = activate(&mut g, y, act);
                let d = g.check(y);
                assert_eq!(d.len(), 1, "one fused kernel: {d:?}");
                assert_gpu(&d, "gpu dwconv");

                // MatMul: per-column bias, residual, activation (batched).
                let mut g = G::new(500 + act as u64);
                let a = g.input(&[2, 17, 24]);
                let w = g.constant(&[24, 70]);
                let mut y = g.node(Op::MatMul, vec![Some(a), Some(w)]);
                let bias = g.constant(&[70]);
                y = g.node(Op::Binary(Binary::Add), vec![Some(y), Some(bias)]);
                if residual {
                    let r = g.input(&[2, 17, 70]);
                    y = g.node(Op::Binary(Binary::Add), vec![Some(r), Some(y)]);
                }
                let y = activate(&mut g, y, act);
                let d = g.check(y);
                assert_eq!(d.len(), 1, "one fused kernel: {d:?}");
                assert_gpu(&d, "gpu matmul");
            }
        }
    }

    /// Asserts every GEMM-family kernel in `d` (not the bf16 autocast's Cast kernels) is
    /// `what` on `kind` tensor cores.
    fn assert_mma_of(d: &[String], what: &str, kind: MmaKind) {
        let products: Vec<&String> = d.iter().filter(|s| !s.starts_with("gpu elementwise")).collect();
        let mark = format!("mma.{}", kind.name());
        assert!(
            !products.is_empty() && products.iter().all(|s| s.starts_with(what) && s.contains(&mark)),
            "kernels {d:?}, expected {what} on {} tensor cores",
            kind.name()
        );
    }

    fn assert_mma(d: &[String], what: &str) {
        assert_mma_of(d, what, MmaKind::Bf16)
    }

    fn assert_f16_mma(d: &[String], what: &str) {
        assert_mma_of(d, what, MmaKind::F16)
    }

    /// MatMuls of `new(seed)` graphs on `kind` tensor cores: tiles of 2 and 4 units (fewer
    /// than the 8 warps) and of 8 to 32; edges along M, N and K; one and several K steps;
    /// constant A or B; batched with broadcast.
    fn matmuls_on_tensor_cores(new: fn(u64) -> G, seed: u64, kind: MmaKind) {
        let shapes = [
            (1, 1, 1),
            (5, 7, 3),
            (13, 17, 29),
            (30, 40, 20),
            (20, 16, 70),
            (64, 48, 64),
            (70, 33, 130),
            (1, 40, 65),
        ];
        for (i, &(m, k, n)) in shapes.iter().enumerate() {
            for (ca, cb) in [(false, true), (false, false), (true, false)] {
                let mut g = new(seed + i as u64);
                let a = g.operand(&[m, k], ca);
                let b = g.operand(&[k, n], cb);
                let y = g.node(Op::MatMul, vec![Some(a), Some(b)]);
                assert_mma_of(&g.check(y), "gpu matmul", kind);
            }
        }
        let mut g = new(seed + 20);
        let a = g.input(&[2, 1, 18, 24]);
        let b = g.input(&[3, 24, 20]);
        let y = g.node(Op::MatMul, vec![Some(a), Some(b)]);
        assert_mma_of(&g.check(y), "gpu matmul", kind);
    }

    #[test]
    fn bf16_matmul_on_tensor_cores() {
        matmuls_on_tensor_cores(G::bf16, 700, MmaKind::Bf16);
    }

    #[test]
    fn bf16_gemm_and_conv_on_tensor_cores() {
        for (trans_a, trans_b) in [(false, false), (true, true), (false, true)] {
            let (m, k, n) = (19, 37, 45);
            let mut g = G::bf16(730);
            let a = g.operand(&if trans_a { [k, m] } else { [m, k] }, false);
            let b = g.operand(&if trans_b { [n, k] } else { [k, n] }, true);
            let c = g.constant(&[n]);
            let op = Op::Gemm {
                alpha: 0.75,
                beta: 1.5,
                trans_a,
                trans_b,
            };
            let y = g.node(op, vec![Some(a), Some(b), Some(c)]);
            assert_mma(&g.check(y), "gpu gemm");
        }
        // (n, c, h, w, m, kernel, stride, pads, dilation, group): implicit GEMM, pointwise,
        // strided, grouped, 70 output channels (edge tiles).
        let cases = [
            (1, 3, 9, 11, 5, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
            (2, 16, 8, 8, 24, [1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1),
            (1, 5, 12, 10, 7, [3, 3], [2, 2], [2, 1, 0, 2], [2, 2], 1),
            (2, 8, 6, 6, 12, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 4),
            (1, 20, 12, 12, 70, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
        ];
        for (i, &(n, c, h, w, m, k, s, p, d, grp)) in cases.iter().enumerate() {
            let mut g = G::bf16(740 + i as u64);
            let x = g.input(&[n, c, h, w]);
            let wt = g.constant(&[m, c / grp, k[0], k[1]]);
            let b = g.constant(&[m]);
            let y = g.node(conv(k, s, p, d, grp), vec![Some(x), Some(wt), Some(b)]);
            assert_mma(&g.check(y), "gpu conv");
        }
    }

    #[test]
    fn bf16_fused_epilogues_on_tensor_cores() {
        for act in [0, 3, 5] {
            // Conv + bias + residual (f32) + activation, then MatMul + bias + residual.
            let mut g = G::bf16(760 + act as u64);
            let x = g.input(&[1, 6, 9, 7]);
            let wt = g.constant(&[10, 6, 3, 3]);
            let b = g.constant(&[10]);
            let y = g.node(
                conv([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
                vec![Some(x), Some(wt), Some(b)],
            );
            let r = g.input_f32(&[1, 10, 9, 7]);
            let y = g.node(Op::Binary(Binary::Add), vec![Some(y), Some(r)]);
            let y = activate(&mut g, y, act);
            let d = g.check(y);
            assert_mma(&d, "gpu conv");
            assert!(d.iter().any(|s| s.contains("+residual")), "{d:?}");

            let mut g = G::bf16(770 + act as u64);
            let a = g.input(&[2, 17, 24]);
            let w = g.constant(&[24, 40]);
            let y = g.node(Op::MatMul, vec![Some(a), Some(w)]);
            let bias = g.constant(&[40]);
            let y = g.node(Op::Binary(Binary::Add), vec![Some(y), Some(bias)]);
            let r = g.input_f32(&[2, 17, 40]);
            let y = g.node(Op::Binary(Binary::Add), vec![Some(r), Some(y)]);
            let y = activate(&mut g, y, act);
            assert_mma(&g.check(y), "gpu matmul");
        }
    }

    #[test]
    fn tensor_cores_only_for_bf16_values_from_sm_80() {
        use crate::plan;
        use crate::target::TargetDesc;
        let describe = |g: &Graph, sm: u32| -> Vec<String> {
            let plan = plan::build(g, &TargetDesc::cuda(sm).unwrap(), true).unwrap();
            plan.kernels.iter().map(|k| k.describe()).collect()
        };
        let mma = |d: &[String]| d.iter().any(|s| s.contains("mma.bf16"));
        // bf16 operands: tensor cores on sm_80 and sm_90, not on sm_75 (no bf16 mma).
        let mut g = G::bf16(780);
        let a = g.input(&[8, 32]);
        let b = g.constant(&[32, 16]);
        let y = g.node(Op::MatMul, vec![Some(a), Some(b)]);
        g.g.add_output("y", y);
        assert!(mma(&describe(&g.g, 80)) && mma(&describe(&g.g, 90)));
        assert!(!mma(&describe(&g.g, 75)));
        // One f32 operand (an input, or a weight that is not all bf16 values): f32 SIMT.
        let mut g = G::bf16(781);
        let a = g.input_f32(&[8, 32]);
        let b = g.constant(&[32, 16]);
        let y = g.node(Op::MatMul, vec![Some(a), Some(b)]);
        g.g.add_output("y", y);
        assert!(!mma(&describe(&g.g, 80)));
        let mut g = G::new(782);
        let a = g.input(&[8, 32]);
        let a = g.node(Op::Cast { to: DType::BF16 }, vec![Some(a)]);
        let a = g.node(Op::Cast { to: DType::F32 }, vec![Some(a)]);
        let b = g.constant(&[32, 16]);
        let y = g.node(Op::MatMul, vec![Some(a), Some(b)]);
        g.g.add_output("y", y);
        assert!(!mma(&describe(&g.g, 80)));
    }

    #[test]
    fn f16_matmul_and_gemm_on_tensor_cores() {
        matmuls_on_tensor_cores(G::f16, 800, MmaKind::F16);
        for (trans_a, trans_b, cconst) in [(false, false, true), (true, true, false), (false, true, false)] {
            let (m, k, n) = (19, 37, 45);
            let mut g = G::f16(820);
            let a = g.operand(&if trans_a { [k, m] } else { [m, k] }, false);
            let b = g.operand(&if trans_b { [n, k] } else { [k, n] }, true);
            let c = g.operand(&[n], cconst);
            let op = Op::Gemm {
                alpha: 0.75,
                beta: -1.5,
                trans_a,
                trans_b,
            };
            let y = g.node(op, vec![Some(a), Some(b), Some(c)]);
            assert_f16_mma(&g.check(y), "gpu gemm");
        }
    }

    #[test]
    fn f16_convolutions() {
        // (n, c, h, w, m, kernel, stride, pads, dilation, group, bias): implicit GEMM,
        // pointwise, strided and dilated, grouped, 70 output channels (edge tiles), a bias
        // computed at run time.
        let cases = [
            (
                1,
                3,
                9,
                11,
                5,
                [3, 3],
                [1, 1],
                [1, 1, 1, 1],
                [1, 1],
                1,
                Some(true),
            ),
            (2, 16, 8, 8, 24, [1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1, None),
            (
                1,
                5,
                12,
                10,
                7,
                [3, 3],
                [2, 2],
                [2, 1, 0, 2],
                [2, 2],
                1,
                Some(true),
            ),
            (
                2,
                8,
                6,
                6,
                12,
                [3, 3],
                [1, 1],
                [1, 1, 1, 1],
                [1, 1],
                4,
                Some(false),
            ),
            (
                1,
                20,
                12,
                12,
                70,
                [3, 3],
                [1, 1],
                [1, 1, 1, 1],
                [1, 1],
                1,
                Some(true),
            ),
        ];
        for (i, &(n, c, h, w, m, k, s, p, d, grp, bias)) in cases.iter().enumerate() {
            let mut g = G::f16(830 + i as u64);
            let x = g.input(&[n, c, h, w]);
            let wt = g.constant(&[m, c / grp, k[0], k[1]]);
            let b = bias.map(|constant| g.operand(&[m], constant));
            let y = g.node(conv(k, s, p, d, grp), vec![Some(x), Some(wt), b]);
            assert_f16_mma(&g.check(y), "gpu conv");
        }
        // Depthwise: the direct kernel, reading and writing f16.
        let mut g = G::f16(840);
        let x = g.input(&[2, 6, 9, 7]);
        let wt = g.constant(&[6, 1, 3, 3]);
        let b = g.constant(&[6]);
        let y = g.node(
            conv([3, 3], [2, 1], [1, 1, 1, 1], [1, 1], 6),
            vec![Some(x), Some(wt), Some(b)],
        );
        let d = g.check(y);
        assert!(d.iter().all(|s| s.starts_with("gpu dwconv3x3/2 f16")), "{d:?}");
    }

    #[test]
    fn f16_before_sm_80_runs_simt() {
        // sm_75 has no m16n8k16 f16 mma: the same kernel multiplies the widened values.
        let mut g = G::f16(850);
        let a = g.input(&[21, 40]);
        let b = g.constant(&[40, 33]);
        let y = g.node(Op::MatMul, vec![Some(a), Some(b)]);
        let d = g.check_for(y, 75);
        assert!(
            d.iter()
                .all(|s| s.starts_with("gpu matmul") && s.contains(" f16 ")),
            "{d:?}"
        );
        assert!(!d.iter().any(|s| s.contains("mma")), "{d:?}");
    }

    #[test]
    fn ptx_assembles() {
        let mut graphs = vec![];
        // Conv + residual + GELU, then a depthwise conv without bias + SiLU.
        let mut g = G::new(600);
        let x = g.input(&[1, 5, 9, 7]);
        let wt = g.constant(&[6, 5, 3, 3]);
        let b = g.constant(&[6]);
        let y = g.node(
            conv([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
            vec![Some(x), Some(wt), Some(b)],
        );
        let r = g.input(&[1, 6, 9, 7]);
        let y = g.node(Op::Binary(Binary::Add), vec![Some(y), Some(r)]);
        let y = g.node(Op::Unary(Unary::Gelu { tanh: false }), vec![Some(y)]);
        let dw = g.constant(&[6, 1, 3, 3]);
        let y = g.node(
            conv([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 6),
            vec![Some(y), Some(dw), None],
        );
        let y = activate(&mut g, y, 3);
        g.g.add_output("y", y);
        graphs.push(g.g);
        // Batched MatMul + GELU (tanh), Gemm with transposed B and a run-time C.
        let mut g = G::new(601);
        let a = g.input(&[3, 4, 10]);
        let w = g.constant(&[10, 7]);
        let z = g.node(Op::MatMul, vec![Some(a), Some(w)]);
        let z = activate(&mut g, z, 6);
        g.g.add_output("z", z);
        let a2 = g.input(&[5, 9]);
        let bt = g.input(&[7, 9]);
        let c = g.input(&[7]);
        let op = Op::Gemm {
            alpha: 1.0,
            beta: 1.0,
            trans_a: false,
            trans_b: true,
        };
        let z2 = g.node(op, vec![Some(a2), Some(bt), Some(c)]);
        g.g.add_output("z2", z2);
        graphs.push(g.g);
        // The same on tensor cores: bf16 conv + residual, bf16 batched MatMul.
        let mut g = G::bf16(602);
        let x = g.input(&[1, 6, 9, 7]);
        let wt = g.constant(&[20, 6, 3, 3]);
        let y = g.node(
            conv([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
            vec![Some(x), Some(wt), None],
        );
        let r = g.input_f32(&[1, 20, 9, 7]);
        let y = g.node(Op::Binary(Binary::Add), vec![Some(y), Some(r)]);
        g.g.add_output("y", y);
        let a = g.input(&[3, 40, 64]);
        let w = g.constant(&[64, 72]);
        let z = g.node(Op::MatMul, vec![Some(a), Some(w)]);
        g.g.add_output("z", z);
        graphs.push(g.g);
        // f16: conv with bias on tensor cores, depthwise conv, Gemm with a run-time C.
        let mut g = G::f16(603);
        let x = g.input(&[1, 6, 9, 7]);
        let wt = g.constant(&[20, 6, 3, 3]);
        let b = g.constant(&[20]);
        let y = g.node(
            conv([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
            vec![Some(x), Some(wt), Some(b)],
        );
        let dw = g.constant(&[20, 1, 3, 3]);
        let y = g.node(
            conv([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 20),
            vec![Some(y), Some(dw), None],
        );
        g.g.add_output("y", y);
        let a = g.input(&[5, 9]);
        let bt = g.constant(&[7, 9]);
        let c = g.input(&[5, 7]);
        let op = Op::Gemm {
            alpha: 1.0,
            beta: 1.0,
            trans_a: false,
            trans_b: true,
        };
        let z = g.node(op, vec![Some(a), Some(bt), Some(c)]);
        g.g.add_output("z", z);
        graphs.push(g.g);
        for graph in &graphs {
            for sm in [80, 90] {
                if !ptxas_check(graph, sm) {
                    return;
                }
            }
        }
    }
}
