//! MatMul, Gemm and Conv on the GPU: one shared-memory tiled GEMM kernel accumulating in f32,
//! with a fused epilogue `y = act(alpha·acc + bias + residual)`, for f32, f16 and bf16 tensors
//! (16-bit elements are widened as they are staged and the result rounded once as it is
//! stored; from sm_80 on, their products run on the tensor cores).
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
//!
//! Here: the kernel's description, built from the node (`lower`, `lower_fused`); `body` emits
//! the tiled kernel, `dwconv` is the direct depthwise kernel.

mod body;
mod dwconv;
mod gemv;
#[cfg(test)]
mod tests;

use crate::error::Result;
use crate::kernel::epilogue::{Activation, Bias, Epilogue, Residual};
use crate::kernel::geometry::{ConvShape, ConvWindow, Product};
use crate::kernel::PackedConst;
use crate::node::NodeInfo;
use crate::nvptx::{GpuKernel, MmaKind};
use crate::target::TargetDesc;
use kiln_ir::{ConvAttrs, DType, Layout, Op};

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

    /// The tile and K split of a product of `entries` `[m, k]·[k, n]` matrices: the shape's
    /// tile, split along K ([`SplitK::choose`]) and, while the launch still has fewer than
    /// [`FILL_BLOCKS`] blocks, halved (its longer side first, down to 16×16) — a 1×1
    /// convolution with K = 64 cannot split, and layer4 of ResNet-50 at batch 1 has 8 tiles of
    /// 64×64, too few for 16 slices to fill 132 SMs. Smaller tiles reuse each staged operand
    /// less; at batch 1 the products are latency-bound, and idle SMs cost more. Products under
    /// [`MIN_SHRINK_MACS`] keep their tile: they take microseconds on any number of SMs.
    fn for_launch(
        m: usize,
        n: usize,
        k: usize,
        entries: usize,
        mma: Option<MmaKind>,
    ) -> (Tile, Option<(usize, usize)>) {
        let mut tile = Tile::for_shape(m, n, mma);
        let shrink = m * n * k * entries >= MIN_SHRINK_MACS;
        loop {
            let tiles = n.div_ceil(tile.bn) * m.div_ceil(tile.bm) * entries;
            let split = SplitK::choose(tiles, k);
            let blocks = tiles * split.map_or(1, |(s, _)| s);
            if blocks >= FILL_BLOCKS || !shrink || (tile.bm == 16 && tile.bn == 16) {
                return (tile, split);
            }
            if tile.bn >= tile.bm && tile.bn > 16 {
                tile.bn /= 2;
            } else {
                tile.bm /= 2;
            }
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    g: ConvWindow,
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

/// Blocks a launch should have to fill the GPU: two per SM of a 132-SM H100 (an A100 has 108).
/// A product with fewer output tiles splits K among more blocks ([`SplitK`]).
const FILL_BLOCKS: usize = 264;
/// The fewest BK steps a K slice gets: below that the slices' partial sums cost more memory
/// traffic than the extra blocks win.
const MIN_SLICE_STEPS: usize = 2;
/// The most K slices of one tile.
const MAX_SPLIT: usize = 16;
/// The multiply-adds from which a product's tile shrinks to fill the GPU (4 Mi: ResNet-50's
/// smallest convolution has 12.8 M at batch 1); below, the launch overhead dominates.
const MIN_SHRINK_MACS: usize = 1 << 22;

/// K split among `split` blocks per output tile (split-K): block `s` of a tile sums K range
/// `[s·slice, (s+1)·slice)` and writes its partial tile to the kernel's scratch; the last of
/// the tile's blocks to finish (a per-tile counter, incremented atomically) adds the partials
/// in slice order (the same sum whichever block is last), applies the epilogue, stores the
/// output and sets the counter back to zero. The counters are a zero-filled packed constant,
/// so they start at zero in every context and every run leaves them so: one launch, no
/// clearing pass, and the kernel replays in a CUDA graph.
#[derive(Clone, Copy, Debug)]
struct SplitK {
    split: usize,
    /// K elements per slice, a multiple of BK.
    slice: usize,
    /// The packed constant holding one u32 counter per output tile.
    counters: usize,
}

impl SplitK {
    /// The split (slices, slice length) for a product of `tiles` output tiles (all batch
    /// entries) `k` deep. None when the tiles fill the GPU or K is too short to share.
    fn choose(tiles: usize, k: usize) -> Option<(usize, usize)> {
        let steps = k.div_ceil(BK);
        if tiles >= FILL_BLOCKS {
            return None;
        }
        let want = FILL_BLOCKS
            .div_ceil(tiles)
            .min(steps / MIN_SLICE_STEPS)
            .min(MAX_SPLIT);
        if want < 2 {
            return None;
        }
        // The longest slice that still gives `want` slices, within MAX_SPLIT.
        let slice_steps = (steps / want).max(steps.div_ceil(MAX_SPLIT)).max(MIN_SLICE_STEPS);
        let slice = slice_steps * BK;
        Some((k.div_ceil(slice), slice))
    }
}

pub struct GemmGpu {
    what: String,
    /// The element type of the node's tensors (f32, f16 or bf16); packed constants are f32.
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
    split_k: Option<SplitK>,
    /// A matrix-vector shaped product, run by the GEMV kernel (`gemv`).
    gemv: bool,
}

/// The generator: MatMul, Gemm and Conv with their own bias.
pub fn lower(node: &NodeInfo, target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    let epi = match node.op() {
        Op::Conv(_) => match node.known(2) {
            Some(b) if matches!(b.dtype(), DType::F32 | DType::F16 | DType::BF16) => Epilogue::new(
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
        || !matches!(elem, DType::F32 | DType::F16 | DType::BF16)
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
    // kernel's up to summation order; with `--precision tf32`, for every other f32 product,
    // whose operands are then rounded to TF32 (PyTorch's `allow_tf32`).
    let mma = match target.cuda_sm() {
        Some(sm) if sm >= 80 && elem == DType::F16 => Some(MmaKind::F16),
        Some(sm) if sm >= 80 && elem == DType::BF16 => Some(MmaKind::Bf16),
        Some(sm) if sm >= 80 && node.input_is_bf16_valued(0) && node.input_is_bf16_valued(1) => {
            Some(MmaKind::Bf16)
        }
        // `--precision tf32`: the other f32 products read their operands as TF32.
        Some(sm) if sm >= 80 && elem == DType::F32 && target.tf32 => Some(MmaKind::Tf32),
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

/// How a kernel reads and multiplies: the element type of the node's tensors (f32, f16 or bf16;
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
        DType::F16 | DType::BF16 => Some(t.to_f64_vec().iter().map(|&v| v as f32).collect()),
        _ => None,
    }
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
                self.packed.push(PackedConst::from_f32s(v));
            }
            Bias::PerCol(v) => {
                if v.len() != n {
                    return Err(
                        node.unsupported(format!("column bias has {} values for {n} columns", v.len()))
                    );
                }
                bias = Some((Slot::Packed(self.packed.len()), false));
                self.packed.push(PackedConst::from_f32s(v));
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
                // The residual has the chain's output shape, which may reshape the product's
                // rows (exporters' `[B·S, N] ↔ [B, S, N]` around a MatMul): the same elements in
                // the same row-major order, so it is read at the product's own positions.
                let elements = |s: Vec<usize>| s.iter().product::<usize>();
                if elements(node.input_shape(*i)?) != elements(node.output_shape(0)?) {
                    return Err(
                        node.unsupported(format!("residual input {i} does not have the output's elements"))
                    );
                }
                Some((Slot::Input(*i), m * n, n, 1, 1.0))
            }
            (Some(Residual::Const(v)), None) => {
                if v.len() != m * n {
                    return Err(node.unsupported("constant residual is not an [M, N] matrix"));
                }
                let slot = Slot::Packed(self.packed.len());
                self.packed.push(PackedConst::from_f32s(v));
                Some((slot, 0, n, 1, 1.0))
            }
            (Some(Residual::Skip { .. }), None) => return Ok(None),
        };
        let (tile, split) = Tile::for_launch(m, n, self.k, z, self.ty.mma);
        let tiles = n.div_ceil(tile.bn) * m.div_ceil(tile.bm) * z;
        // A side of at most 8 that the tiles cannot fill the GPU with: a thread per output.
        let gemv = m.min(n) <= gemv::GEMV_MAX_SIDE && tiles * split.map_or(1, |(s, _)| s) < FILL_BLOCKS;
        let split = split.filter(|_| !gemv);
        let split_k = match split {
            Some((split, slice)) if z * split <= 65535 => {
                let counters = self.packed.len();
                self.packed.push(PackedConst {
                    bytes: vec![0; tiles * 4],
                });
                Some(SplitK {
                    split,
                    slice,
                    counters,
                })
            }
            _ => None,
        };
        let grid = match gemv {
            true => [gemv::launch(z * m * n).grid[0] as usize, 1, 1],
            false => [
                n.div_ceil(tile.bn),
                m.div_ceil(tile.bm),
                z * split_k.map_or(1, |s| s.split),
            ],
        };
        let what = format!(
            "gpu {} {}{} M={m} N={n} K={} batch={z}{}{}{} grid={}x{}x{}",
            self.what,
            match gemv {
                true => "gemv".to_string(),
                false => format!("{}x{}x{BK}", tile.bm, tile.bn),
            },
            match (tile.mma, self.ty.elem) {
                (Some(kind), _) if !gemv => format!(" mma.{}", kind.name()),
                (_, DType::F16) => " f16".into(),
                (_, DType::BF16) => " bf16".into(),
                (_, _) => String::new(),
            },
            self.k,
            if epi.residual.is_some() { " +residual" } else { "" },
            match epi.activation {
                Activation::None => String::new(),
                a => format!(" +{a:?}"),
            },
            match split_k {
                Some(s) => format!(" split-k={}", s.split),
                None => String::new(),
            },
            grid[0],
            grid[1],
            grid[2],
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
            split_k,
            gemv,
        })))
    }
}

fn matmul(node: &NodeInfo, epi: Epilogue, ty: Operands) -> Result<Option<Box<dyn GpuKernel>>> {
    let Some(mut p) = Product::matmul(node)? else {
        return Ok(None);
    };
    if epi.allows_batch_folding() {
        p = p.with_batch_in_rows();
    }
    let (m, n, k) = (p.m, p.n, p.k);
    let mut parts = Parts {
        m,
        n,
        k,
        batch: p
            .batch_axes()
            .iter()
            .map(|axis| BatchDim {
                extent: axis.extent,
                a: axis.a * m * k,
                b: axis.b * k * n,
            })
            .collect(),
        groups: 1,
        a: Mat {
            slot: Slot::Input(0),
            rs: p.a.rs,
            cs: p.a.cs,
        },
        b: BSrc::Mat(Mat {
            slot: Slot::Input(1),
            rs: p.b.rs,
            cs: p.b.cs,
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
        parts.packed.push(PackedConst::from_f32s(&w));
        parts.unread.push(1);
    } else if let Some(w) = f32s(node, 0) {
        // K-major: consecutive threads load consecutive rows of one k into shared memory.
        let count = p.a_matrices();
        parts.a = Mat {
            slot: Slot::Packed(0),
            rs: 1,
            cs: m,
        };
        parts
            .packed
            .push(PackedConst::from_f32s(&repack(&w, count, m, k, k, 1, true)));
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
    let Some(p) = Product::gemm(node, trans_a, trans_b)? else {
        return Ok(None);
    };
    let (m, n, k) = (p.m, p.n, p.k);
    let (ars, acs) = (p.a.rs, p.a.cs);
    let (brs, bcs) = (p.b.rs, p.b.cs);
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
        parts
            .packed
            .push(PackedConst::from_f32s(&repack(&w, 1, k, n, brs, bcs, false)));
        parts.unread.push(1);
    }
    if let Some(w) = f32s(node, 0) {
        parts.a = Mat {
            slot: Slot::Packed(parts.packed.len()),
            rs: 1,
            cs: m,
        };
        parts
            .packed
            .push(PackedConst::from_f32s(&repack(&w, 1, m, k, ars, acs, true)));
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
                parts.packed.push(PackedConst::from_f32s(&v));
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

fn conv(
    node: &NodeInfo,
    epi: Epilogue,
    attrs: &ConvAttrs,
    ty: Operands,
) -> Result<Option<Box<dyn GpuKernel>>> {
    if attrs.channels_last {
        return Ok(None);
    }
    let Some(s) = ConvShape::of(node, attrs)? else {
        return Ok(None);
    };
    let Some(w) = f32s(node, 1) else {
        return Ok(None);
    };
    let (nb, c, h, wd) = (s.batch, s.c, s.h, s.w);
    let (mt, cg, kh, kw) = (s.m, s.cg, s.kh, s.kw);
    let g = s.groups;
    if c != cg * g || mt % g != 0 || s.y_channels != mt || s.y_batch != nb {
        return Err(node.unsupported("weights do not match the input channels and groups"));
    }
    let Some(geo) = s.window(attrs, c) else {
        return Err(node.unsupported("convolution window does not match the output shape"));
    };
    if s.is_depthwise() {
        return dwconv::lower(node, epi, &w, geo, nb, ty.elem);
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
        packed: vec![PackedConst::from_f32s(&repack(&w, g, mg, kk, kk, 1, true))],
        unread,
        what: format!("conv{kh}x{kw}/{}", if s.one_d { geo.sw } else { geo.sh }),
        ty,
    };
    parts.finish(node, epi, None)
}
