//! The register-blocked GEMM kernel (see the module docs of `gen`): matrix products and the
//! convolutions that map to one (`super::conv` decides which do).
//!
//! Every matrix product here is `C[M,N] = A[M,K] · B[K,N]` (per batch entry) computed in
//! MR×NR register tiles: vectors run along N (output rows are contiguous), A values are
//! broadcast. Both operands are read from *panels*: A as MR rows interleaved per k
//! (`a[k*MR + i]`) or in rows, B as NR columns per k (`b[k*NR + j]`). A constant operand
//! (weights) is packed into panels at compile time (a constant B K-block major, see
//! `block_major_panels`); a run-time operand is packed per
//! (task, K block) into per-thread scratch — for a convolution, B is the im2col matrix, packed
//! straight from the input and never materialized whole.
//!
//! Work is split into tasks of MB×NB output blocks (per batch entry) for `parallel_for`; inside
//! a task the K axis is blocked by KC (partial sums go through the output) and the epilogue
//! (scale, bias, residual, activation) runs on the last K block while the tile is in registers.
//! The matrix's last row panel (`M % MR` rows) and last column panel (`N % NR` columns, when
//! whole vectors) run exact, smaller tiles; other cuts run the full tile on a local copy.
//! MR and NR follow the product's shape (`Tile::for_product`).
//!
//! Convolution (NCHW) maps to: M = output channels (A = filters), N = output pixels, K =
//! C/group·KH·KW; groups become a batch axis. Depthwise convolution has its own kernel
//! (`dwconv`).
//!
//! Here: the kernel's description and how it is built from a product's operands; `pack`
//! lays out operand panels (constants at compile time, run-time operands in the emitted
//! code), `blocking` chooses the cache blocks, `task` emits the parallel task loop and
//! `microkernel` the register tile.

mod blocking;
mod int8;
mod microkernel;
mod nibble_gemv;
mod nibbles;
pub(crate) mod pack;
mod task;
mod tuning;

use crate::error::Result;
use crate::gen::{GeneratedKernel, KernelBuilder};
use crate::kernel::epilogue::{Activation, Bias, Epilogue, Quantize, Residual};
use crate::kernel::geometry::{ConvWindow, Product};
use crate::kernel::{KernelCommon, PackedConst, Scratch};
use crate::node::NodeInfo;
use crate::target::{Isa, TargetDesc};
use blocking::plan_blocks;
use microkernel::PAIRS_PER_VECTOR;
use pack::{block_major_panels, f32s, pack_a, pack_b, pack_b_into, pair_panels};

pub(crate) use int8::{lower_conv_integer, lower_matmul_integer, stores_u8};
pub(crate) use nibbles::lower_block_quantized;

/// The register tile and vector width for a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tile {
    pub lanes: u32,
    /// Vectors per tile row (NR = lanes * nv).
    pub nv: u32,
    pub mr: usize,
}

impl Tile {
    pub fn for_target(t: &TargetDesc) -> Tile {
        match t.isa {
            // 24 accumulators of 32 zmm registers.
            Isa::Avx512 => Tile {
                lanes: 16,
                nv: 2,
                mr: 12,
            },
            // 12 accumulators + 2 B vectors + 1 broadcast of 16 ymm registers.
            Isa::Avx2 => Tile {
                lanes: 8,
                nv: 2,
                mr: 6,
            },
            Isa::Portable => Tile {
                lanes: 4,
                nv: 2,
                mr: 4,
            },
        }
    }

    /// The register tile for a product of M rows and N columns. On AVX-512 three tiles hold
    /// 24 accumulators: 12×2, 8×3 and 6×4 vectors (rows × vectors). A cut row or column
    /// panel runs a smaller, less efficient tile or a full one on a local copy, so the tile
    /// with the least padded work (M and N rounded up to whole tiles) wins, weighted by its
    /// cost per FMA: the wider tiles load fewer operands per FMA (11 and 10 loads per 24
    /// FMAs against 14), and fitted to the product kernels of three CNNs in bf16 and f32
    /// (Zen 5) they take 3-4% less time per FMA of padded work. Choosing by shape gains most
    /// where 12 rows cut badly: the 7×7 stages of a CNN
    /// (M = 49: 60 rows of work in 12-row tiles, 54 in 6-row ones) and transformers' 128
    /// rows (8×3). Other targets have one tile.
    pub fn for_product(t: &TargetDesc, m: usize, n: usize) -> Tile {
        let default = Tile::for_target(t);
        if t.isa != Isa::Avx512 {
            return default;
        }
        const CANDIDATES: [(usize, u32, f64); 3] = [(12, 2, 1.0), (8, 3, 0.97), (6, 4, 0.96)];
        let work = |&(mr, nv, cost): &(usize, u32, f64)| {
            let nr = default.lanes as usize * nv as usize;
            (m.div_ceil(mr) * mr * n.div_ceil(nr) * nr) as f64 * cost
        };
        let mut best = CANDIDATES[0];
        for c in &CANDIDATES[1..] {
            if work(c) < work(&best) {
                best = *c;
            }
        }
        Tile {
            lanes: default.lanes,
            nv: best.1,
            mr: best.0,
        }
    }

    pub fn nr(&self) -> usize {
        (self.lanes * self.nv) as usize
    }
}

/// Where an operand's panels come from.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Operand {
    /// Packed at compile time: packed constant `slot`, one panel set per own batch entry.
    Packed { slot: usize },
    /// Node input `input`: element (row, col) at `row * rs + col * cs`.
    Strided { input: usize, rs: usize, cs: usize },
    /// The im2col matrix of a convolution input (B only).
    Im2col { input: usize, g: ConvWindow },
    /// The im2col matrix of a channels-last convolution input (A only): row = output pixel,
    /// k = (kh, kw, c) (see `conv_nhwc`).
    Im2colNhwc { input: usize, g: ConvWindow },
    /// Block-quantized weights packed as nibbles (B only): packed constant `slot`, its
    /// parameters in blocks of `block` along K, unpacked at run time (`nibbles`).
    Nibbles { slot: usize, block: usize },
}

/// One batch axis: its extent and the element stride it adds to each operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BatchDim {
    pub(crate) extent: usize,
    pub(crate) a: usize,
    pub(crate) b: usize,
    pub(crate) c: usize,
    pub(crate) bias_row: usize,
}

#[derive(Debug)]
pub struct GemmKernel {
    what: String,
    isa: Isa,
    tile: Tile,
    m: usize,
    n: usize,
    k: usize,
    batch: Vec<BatchDim>,
    a: Operand,
    b: Operand,
    /// Output index.
    out: usize,
    scale: f32,
    /// Packed slots of the padded bias vectors.
    bias_row: Option<usize>,
    bias_col: Option<usize>,
    residual: Option<Operand>,
    activation: Activation,
    /// `Epilogue::round_bf16`.
    round_bf16: bool,
    packed: Vec<PackedConst>,
    n_inputs: usize,
    unread: Vec<usize>,
    kc: usize,
    mb: usize,
    nb: usize,
    /// Runs on bf16 pairs with `vdpbf16ps` (see `try_bf16_pairs`): K, KC and the packed B
    /// count pairs of k, and A is packed as pair rows at run time.
    bf16_pairs: bool,
    /// K in elements (`k` counts pairs when `bf16_pairs`).
    k_elems: usize,
    /// `Epilogue::input_scale` of a row-major A: every row's K values are multiplied by the
    /// scale vector of its image as they are packed.
    a_scale: Option<AScale>,
    /// An integer product on `vpdpbusd` (`int8`): K, KC and the packed B count quads of k, A
    /// (u8) is read in place, the accumulators and C are i32.
    int8: Option<Int8>,
    /// A held as bf16 (`GeneratedKernel::read_bf16`): a row-major A's rows are rows of pairs
    /// already, which the tile reads in place, unpacked; an NHWC im2col A's runs are copied
    /// into the pair rows as they are.
    a_bf16: bool,
    /// C is stored as bf16 (`GeneratedKernel::store_bf16`). With one K block the tiles store
    /// bf16 themselves; with several, a task keeps its block's partial sums in f32 scratch
    /// and converts the block once its last K block is done (`c_partials_in_scratch`).
    c_bf16: bool,
}

/// What an integer product needs beyond the f32 kernel's fields: A's zero point, and which
/// rows of column constants `bias_col`'s packed slot holds (see `int8`): the column sums of
/// the zero point's correction `za · Σ_k b[k, j]`, the dequantizing scales, the bias.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Int8 {
    /// The dot-product instruction.
    dot: IntDot,
    /// Input slot of A's zero point (a u8 scalar), when the node has one.
    a_zero: Option<usize>,
    /// The sums are converted to f32 and scaled (`Epilogue::dequantize`); the f32 epilogue
    /// follows and C is f32.
    dequantize: bool,
    /// A bias row follows the scales.
    bias: bool,
    /// The result is quantized to u8 and C holds bytes (`Epilogue::quantize`); the product
    /// then runs in one K block, C never holding partial sums.
    quantize: Option<Quantize>,
    /// The residual operand is a `Residual::Skip`, added after the activation: u8 dequantized
    /// with these parameters, else f32.
    skip: Option<Option<Quantize>>,
}

/// The instruction an integer tile multiplies quads with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IntDot {
    /// x86 `vpdpbusd`: u8 × s8.
    Vpdpbusd,
    /// aarch64 `sdot`: s8 × s8. A is read as `a - 128` (its top bit flipped), which the
    /// zero-point correction takes back: `Σ (a - za)·b = Σ (a - 128)·b - (za - 128)·Σ b`, so
    /// the column sums are always there.
    Sdot,
}

impl Int8 {
    /// The element offsets (from `bias_col`'s pointer) of the column sums, the scales and the
    /// bias rows, for `n_padded` = N + NR values per row.
    fn rows(&self, n_padded: i64) -> (Option<i64>, Option<i64>, Option<i64>) {
        let mut at = 0;
        let mut next = |present: bool| {
            present.then(|| {
                at += n_padded;
                at - n_padded
            })
        };
        let sums = next(self.a_zero.is_some() || self.dot == IntDot::Sdot);
        let scales = next(self.dequantize);
        let bias = next(self.bias);
        (sums, scales, bias)
    }
}

/// The per-image column scale of A (`Epilogue::input_scale`).
#[derive(Clone, Copy, Debug)]
struct AScale {
    /// Input slot of the scales, K per image.
    input: usize,
    /// Rows of A per image.
    rows_per_image: usize,
}

pub(crate) struct Builder {
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) batch: Vec<BatchDim>,
    pub(crate) a: Operand,
    pub(crate) b: Operand,
    pub(crate) packed: Vec<PackedConst>,
    pub(crate) unread: Vec<usize>,
    pub(crate) what: String,
    /// Rows of A per image when A is a row-major input that `Epilogue::input_scale` may scale.
    pub(crate) scalable_rows: Option<usize>,
}

impl Builder {
    pub(crate) fn finish(
        mut self,
        node: &NodeInfo,
        target: &TargetDesc,
        tile: Tile,
        epi: Epilogue,
    ) -> Result<Option<Box<dyn GeneratedKernel>>> {
        let (m, n) = (self.m, self.n);
        if m == 0 || n == 0 || self.k == 0 {
            return Ok(None);
        }
        let out_numel: usize = node.output_shape(0)?.iter().product();
        if out_numel >= (1 << 31) {
            return Ok(None);
        }
        for i in 0..node.n_inputs() {
            if let Ok(s) = node.input_shape(i) {
                if s.iter().product::<usize>() >= (1 << 31) {
                    return Ok(None);
                }
            }
        }
        let nr = tile.nr();
        let mr = tile.mr;
        let mut bias_row = None;
        let mut bias_col = None;
        match &epi.bias {
            Bias::None => {}
            Bias::PerRow(v) => {
                // Per-row bias of a grouped product is indexed per group by the batch stride.
                let rows = v.len();
                let mut p = v.clone();
                p.resize(rows + mr, 0.0);
                bias_row = Some(self.packed.len());
                self.packed.push(PackedConst::from_f32s(&p));
            }
            Bias::PerCol(v) => {
                if v.len() != n {
                    return Err(
                        node.unsupported(format!("column bias has {} values for {n} columns", v.len()))
                    );
                }
                let mut p = v.clone();
                p.resize(n + nr, 0.0);
                bias_col = Some(self.packed.len());
                self.packed.push(PackedConst::from_f32s(&p));
            }
        }
        let residual = match &epi.residual {
            None => None,
            Some(Residual::Input(i)) => {
                // The same rows of N values; its shape may be a reshape of the output's (an
                // exporter's [B·S, N] product added to a [B, S, N] residual).
                let (rs, os) = (node.input_shape(*i)?, node.output_shape(0)?);
                if rs.iter().product::<usize>() != os.iter().product::<usize>() || rs.last() != os.last() {
                    return Err(
                        node.unsupported(format!("residual input {i} does not have the output's shape"))
                    );
                }
                Some(Operand::Strided {
                    input: *i,
                    rs: n,
                    cs: 1,
                })
            }
            Some(Residual::Const(v)) => {
                if v.len() != m * n {
                    return Err(node.unsupported("constant residual is not an [M, N] matrix"));
                }
                let slot = self.packed.len();
                self.packed.push(PackedConst::from_f32s(v));
                Some(Operand::Packed { slot })
            }
            // Integer products only (`int8`).
            Some(Residual::Skip { .. }) => return Ok(None),
        };
        let a_scale = match (epi.input_scale, self.scalable_rows) {
            (None, _) => None,
            (Some(input), Some(rows_per_image)) => Some(AScale {
                input,
                rows_per_image,
            }),
            (Some(_), None) => return Ok(None),
        };
        let k_elems = self.k;
        let bf16_pairs = self.try_bf16_pairs(node, target, &tile);
        if bf16_pairs {
            self.k = k_elems.div_ceil(2);
        }
        let batch_total: usize = self.batch.iter().map(|d| d.extent).product();
        let runtime_b = !matches!(self.b, Operand::Packed { .. });
        let (kc, mb, nb) = plan_blocks(&tile, m, n, self.k, batch_total, runtime_b);
        let mut kernel = GemmKernel {
            what: String::new(),
            isa: target.isa,
            tile,
            m,
            n,
            k: self.k,
            batch: self.batch,
            a: self.a,
            b: self.b,
            out: 0,
            scale: epi.scale,
            bias_row,
            bias_col,
            residual,
            activation: epi.activation,
            round_bf16: epi.round_bf16,
            packed: self.packed,
            n_inputs: node.n_inputs().max(a_scale.map_or(0, |s| s.input + 1)),
            unread: self.unread,
            kc,
            mb,
            nb,
            bf16_pairs,
            k_elems,
            a_scale,
            int8: None,
            a_bf16: false,
            c_bf16: false,
        };
        let tuned = match &target.tuning {
            Some(t) => kernel.tune(&t.0, node, target, batch_total, runtime_b),
            None => None,
        };
        // With one K block the panel-major layout already is the K-block-major one.
        if let Operand::Packed { slot } = kernel.b {
            if kernel.kc < kernel.k {
                block_major_panels(&mut kernel.packed[slot], kernel.k, nr, kernel.kc, n.div_ceil(nr));
            }
        }
        let (kc, mb, nb) = (kernel.kc, kernel.mb, kernel.nb);
        kernel.what = format!(
            "{} {}x{} {:?}{} M={m} N={n} K={k_elems} batch={batch_total} KC={kc} MB={mb} NB={nb}{}",
            self.what,
            mr,
            nr,
            target.isa,
            if bf16_pairs { " bf16" } else { "" },
            tuned.map(|d| format!(" ({})", d.describe())).unwrap_or_default(),
        );
        Ok(Some(Box::new(kernel)))
    }

    /// Switches the product to bf16 pairs when the target has `vdpbf16ps` and both operands
    /// hold only bf16 values (the autocast pass's operands: weights rounded at compile time,
    /// activations widened from bf16), so the result is the f32 kernel's up to the order of
    /// f32 additions. Re-packs a constant B as pairs; a run-time B (a product of two
    /// activations: attention scores, XLNet's and DeBERTa's per-head products) is packed as
    /// pairs block by block (`pack_b_pair_panel`). The run-time A must be one the pair packing
    /// reads (row-major, or an NHWC im2col).
    fn try_bf16_pairs(&mut self, node: &NodeInfo, target: &TargetDesc, tile: &Tile) -> bool {
        if !target.has_bf16_pair_kernels() || tile.lanes != 16 {
            return false;
        }
        let a_input = match self.a {
            Operand::Strided { input, cs: 1, .. } | Operand::Im2colNhwc { input, .. } => input,
            _ => return false,
        };
        if !node.input_is_bf16_valued(a_input) {
            return false;
        }
        match self.b {
            Operand::Strided { input, .. } => node.input_is_bf16_valued(input),
            Operand::Packed { slot } => {
                // Per batch entry a whole panel set (or the same one): K pairs instead of K
                // rows make each set, and so each batch stride, k2/k as long.
                let (k, k2) = (self.k, self.k.div_ceil(2));
                let set = k * self.n.div_ceil(tile.nr()) * tile.nr();
                if self.batch.iter().any(|d| d.b % set != 0) {
                    return false;
                }
                match pair_panels(&self.packed[slot], k, tile.nr()) {
                    Some(p) => {
                        self.packed[slot] = p;
                        for d in &mut self.batch {
                            d.b = d.b / k * k2;
                        }
                        true
                    }
                    None => false,
                }
            }
            _ => false,
        }
    }
}

/// A batch of products `C[b] = A[b] · B[b]` with a run-time row-major A (`[batch][m][k]`,
/// argument 0), constant B (`b_mats`, `[batch][k][n]` row-major) and C `[batch][m][n]`
/// (argument 1), no epilogue: the multiply step of a kernel that transforms its operands
/// itself (`winograd`). Returns the kernel and its packed B, which the caller owns and passes
/// as argument 2 (the kernel keeps no copy).
pub(crate) fn batched_product(
    target: &TargetDesc,
    what: &str,
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    b_mats: &[f32],
) -> (GemmKernel, PackedConst) {
    let tile = Tile::for_product(target, m, n);
    let nr = tile.nr();
    let mut packed = PackedConst { bytes: vec![] };
    for mat in b_mats.chunks_exact(k * n) {
        pack_b_into(&mut packed.bytes, mat, k, n, n, 1, nr, 1.0);
    }
    let b_per_entry = packed.bytes.len() / 4 / batch;
    let (kc, mb, nb) = plan_blocks(&tile, m, n, k, batch, false);
    if kc < k {
        block_major_panels(&mut packed, k, nr, kc, n.div_ceil(nr));
    }
    let kernel = GemmKernel {
        what: format!(
            "{what} {}x{nr} {:?} M={m} N={n} K={k} batch={batch} KC={kc} MB={mb} NB={nb}",
            tile.mr, target.isa
        ),
        isa: target.isa,
        tile,
        m,
        n,
        k,
        batch: vec![BatchDim {
            extent: batch,
            a: m * k,
            b: b_per_entry,
            c: m * n,
            bias_row: 0,
        }],
        a: Operand::Strided {
            input: 0,
            rs: k,
            cs: 1,
        },
        b: Operand::Packed { slot: 0 },
        out: 0,
        scale: 1.0,
        bias_row: None,
        bias_col: None,
        residual: None,
        activation: Activation::None,
        round_bf16: false,
        packed: vec![],
        n_inputs: 1,
        unread: vec![],
        kc,
        mb,
        nb,
        bf16_pairs: false,
        k_elems: k,
        a_scale: None,
        int8: None,
        a_bf16: false,
        c_bf16: false,
    };
    (kernel, packed)
}

pub(crate) fn lower_matmul(
    node: &NodeInfo,
    target: &TargetDesc,
    epi: Epilogue,
) -> Result<Option<Box<dyn GeneratedKernel>>> {
    let Some(mut p) = Product::matmul(node)? else {
        return Ok(None);
    };
    if epi.allows_batch_folding() {
        p = p.with_batch_in_rows();
    }
    let (m, n, k) = (p.m, p.n, p.k);
    let tile = Tile::for_product(target, m, n);
    let mut b = Builder {
        m,
        n,
        k,
        batch: vec![],
        a: Operand::Strided {
            input: 0,
            rs: p.a.rs,
            cs: p.a.cs,
        },
        b: Operand::Strided {
            input: 1,
            rs: p.b.rs,
            cs: p.b.cs,
        },
        packed: vec![],
        unread: vec![],
        what: "matmul".into(),
        scalable_rows: None,
    };
    let (mut a_mat, mut b_mat) = (m * k, k * n);
    if let Some(w) = f32s(node, 1) {
        let per = n.div_ceil(tile.nr()) * tile.nr() * k;
        let mut all = PackedConst { bytes: vec![] };
        for bi in 0..p.b_matrices() {
            pack_b_into(&mut all.bytes, &w[bi * k * n..], k, n, n, 1, tile.nr(), 1.0);
        }
        b.b = Operand::Packed { slot: 0 };
        b.packed.push(all);
        b.unread.push(1);
        b_mat = per;
    } else if let Some(w) = f32s(node, 0) {
        let per = m.div_ceil(tile.mr) * tile.mr * k;
        let mut all = Vec::with_capacity(per * p.a_matrices());
        for bi in 0..p.a_matrices() {
            all.extend(pack_a(&w[bi * m * k..], m, k, k, 1, tile.mr, 1.0));
        }
        b.a = Operand::Packed { slot: 0 };
        b.packed.push(PackedConst::from_f32s(&all));
        b.unread.push(0);
        a_mat = per;
    }
    b.batch = p
        .batch_axes()
        .iter()
        .map(|axis| BatchDim {
            extent: axis.extent,
            a: axis.a * a_mat,
            b: axis.b * b_mat,
            c: axis.out * m * n,
            bias_row: 0,
        })
        .collect();
    b.finish(node, target, tile, epi)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn lower_gemm(
    node: &NodeInfo,
    target: &TargetDesc,
    mut epi: Epilogue,
    alpha: f32,
    beta: f32,
    trans_a: bool,
    trans_b: bool,
) -> Result<Option<Box<dyn GeneratedKernel>>> {
    let Some(p) = Product::gemm(node, trans_a, trans_b)? else {
        return Ok(None);
    };
    let (m, n, k) = (p.m, p.n, p.k);
    let tile = Tile::for_product(target, m, n);
    // Element (i, kk) of op(A) and (kk, j) of op(B).
    let (ars, acs) = (p.a.rs, p.a.cs);
    let (brs, bcs) = (p.b.rs, p.b.cs);
    let mut b = Builder {
        m,
        n,
        k,
        batch: vec![],
        a: Operand::Strided {
            input: 0,
            rs: ars,
            cs: acs,
        },
        b: Operand::Strided {
            input: 1,
            rs: brs,
            cs: bcs,
        },
        packed: vec![],
        unread: vec![],
        what: "gemm".into(),
        scalable_rows: None,
    };
    if let Some(w) = f32s(node, 1) {
        b.packed.push(pack_b(w, k, n, brs, bcs, tile.nr(), alpha));
        b.b = Operand::Packed { slot: 0 };
        b.unread.push(1);
    } else if let Some(w) = f32s(node, 0) {
        b.packed
            .push(PackedConst::from_f32s(&pack_a(w, m, k, ars, acs, tile.mr, alpha)));
        b.a = Operand::Packed { slot: 0 };
        b.unread.push(0);
    } else {
        epi.scale *= alpha;
    }
    if node.has_input(2) && beta != 0.0 {
        let sc = node.input_shape(2)?;
        if let Some(c) = f32s(node, 2) {
            // Broadcast C to [M, N] and keep the cheapest form that represents it.
            let (cr, cc) = match sc.len() {
                0 => (1, 1),
                1 => (1, sc[0]),
                _ => (sc[0], sc[1]),
            };
            let at = |i: usize, j: usize| {
                c[(if cr == 1 { 0 } else { i }) * cc + if cc == 1 { 0 } else { j }] * beta
            };
            if cr == 1 {
                epi.bias = Bias::PerCol((0..n).map(|j| at(0, j)).collect());
            } else if cc == 1 {
                epi.bias = Bias::PerRow((0..m).map(|i| at(i, 0)).collect());
            } else {
                epi.residual = Some(Residual::Const((0..m * n).map(|x| at(x / n, x % n)).collect()));
            }
            b.unread.push(2);
        } else if sc == [m, n] && beta == 1.0 {
            epi.residual = Some(Residual::Input(2));
        } else {
            return Ok(None);
        }
    }
    b.finish(node, target, tile, epi)
}

impl KernelCommon for GemmKernel {
    fn describe(&self) -> String {
        self.what.clone()
    }

    fn packed_constants(&self) -> &[PackedConst] {
        &self.packed
    }

    fn release_packed_constants(&mut self) {
        PackedConst::release_all(&mut self.packed)
    }

    fn reads_input(&self, i: usize) -> bool {
        !self.unread.contains(&i)
    }
}

impl GeneratedKernel for GemmKernel {
    fn bf16_dot_products(&self) -> bool {
        self.bf16_pairs
    }

    fn int8_dot_products(&self) -> bool {
        self.int8.is_some()
    }

    fn can_read_bf16(&self, i: usize) -> bool {
        // A row-major A's pair rows in place: whole pairs (even K), a row stride of whole
        // pairs, no scale to apply while packing. An NHWC im2col A's runs copied as they are.
        self.bf16_pairs
            && self.a_scale.is_none()
            && match self.a {
                Operand::Strided { input, rs, cs: 1 } => {
                    input == i && self.k_elems.is_multiple_of(2) && rs.is_multiple_of(2)
                }
                Operand::Im2colNhwc { input, .. } => input == i,
                _ => false,
            }
            && !matches!(self.b, Operand::Strided { input, .. } if input == i)
    }

    fn read_bf16(&mut self, i: usize) {
        debug_assert!(self.can_read_bf16(i));
        self.a_bf16 = true;
    }

    fn can_store_bf16(&self) -> bool {
        // Bytes are an integer product's own.
        self.int8.is_none()
    }

    fn store_bf16(&mut self) {
        debug_assert!(self.can_store_bf16());
        self.c_bf16 = true;
    }

    fn rounds_input_to_bf16(&self, i: usize) -> bool {
        // The pair packing converts A with vcvtneps2bf16 (`bf16_pair_row`), a run-time B the
        // same way (`pack_b_pair_panel`).
        self.bf16_pairs
            && (matches!(self.a, Operand::Strided { input, .. } | Operand::Im2colNhwc { input, .. } if input == i)
                || matches!(self.b, Operand::Strided { input, .. } if input == i))
    }

    fn scratch(&self) -> Scratch {
        let mut floats = self.c_partials_floats();
        if !matches!(self.b, Operand::Packed { .. }) {
            floats += self.kc * self.nb.div_ceil(self.tile.nr()) * self.tile.nr();
        }
        let a_panels = self.mb.div_ceil(self.tile.mr) * self.tile.mr;
        if self.a_in_place_bf16().is_some() {
            // Read in place.
        } else if self.bf16_pairs {
            floats += self.pair_row_stride() as usize * a_panels;
        } else if self.int8.is_none() && !matches!(self.a, Operand::Packed { .. }) {
            floats += self.kc * a_panels;
        } else if self.int8.is_some() && matches!(self.a, Operand::Im2colNhwc { .. }) {
            // u8 im2col rows of KC quads, one 32-bit word each.
            floats += self.kc * a_panels;
        }
        Scratch {
            shared_bytes: 0,
            per_thread_bytes: (floats as u64 * 4).div_ceil(64) * 64,
        }
    }

    fn emit(&self, k: &KernelBuilder<'_, '_>) -> Result<()> {
        self.emit_product(k, k.args())?;
        k.ret_ok()
    }
}

impl GemmKernel {
    /// The row stride of A's panels when they are packed in rows (`a[i*rs + kk]`), None for
    /// interleaved panels (`a[kk*MR + i]`). Packing in rows copies contiguous runs (a row of a
    /// row-major A; a tap row of an NHWC im2col A inside the image) with masked vector
    /// copies, where interleaving them stores element by element with stride MR (LLVM makes
    /// that loop a `vscatterqps`, microcoded on Zen 4: 15% of a pointwise convolution's
    /// samples). Measured per layer on Zen 4, 2 threads: 3x3 convolutions 10-20% faster from
    /// 64 input channels; ResNet-50's pointwise convolutions 5-17% faster, the encoder's
    /// MatMuls 5-14% (whole encoder 5-7%). A padded row stride (one kernel's KC plus a
    /// cache line, against L1 set aliasing) measured no better.
    fn a_row_stride(&self) -> Option<i64> {
        if let Some(rs) = self.a_in_place_bf16() {
            return Some(rs);
        }
        if self.bf16_pairs {
            return Some(self.pair_row_stride());
        }
        if self.int8.is_some() {
            // A's rows in place, K/4 words each, or packed im2col rows of KC words.
            return Some(match self.a {
                Operand::Im2colNhwc { .. } => self.kc as i64,
                _ => self.k as i64,
            });
        }
        matches!(
            self.a,
            Operand::Im2colNhwc { .. } | Operand::Strided { cs: 1, .. }
        )
        .then_some(self.kc as i64)
    }

    /// Whether the tiles store bf16 into C themselves: a bf16 C computed in one K block.
    fn tiles_store_bf16(&self) -> bool {
        self.c_bf16 && self.kc >= self.k
    }

    /// A bf16 C computed over several K blocks keeps the task's partial sums in f32 scratch
    /// (MB × NB, whole tiles), converted once the last block is done.
    fn c_partials_in_scratch(&self) -> bool {
        self.c_bf16 && self.kc < self.k
    }

    /// Per-thread scratch floats of those partial sums (0 without).
    fn c_partials_floats(&self) -> usize {
        if self.c_partials_in_scratch() {
            self.mb.next_multiple_of(self.tile.mr) * self.c_partials_stride()
        } else {
            0
        }
    }

    /// The row stride of the partial sums: NB rounded up to whole tiles.
    fn c_partials_stride(&self) -> usize {
        self.nb.next_multiple_of(self.tile.nr())
    }

    /// The row stride in pairs of a row-major bf16 A the tile reads in place (`a_bf16`).
    fn a_in_place_bf16(&self) -> Option<i64> {
        match (self.a_bf16, &self.a) {
            (true, Operand::Strided { rs, .. }) => Some(*rs as i64 / 2),
            _ => None,
        }
    }

    /// Whether C holds u8 (an integer product's quantized result).
    fn stores_u8(&self) -> bool {
        self.int8.is_some_and(|i| i.quantize.is_some())
    }

    /// Whether the residual operand holds bytes (a dequantized `Residual::Skip`).
    fn residual_u8(&self) -> bool {
        self.int8.is_some_and(|i| matches!(i.skip, Some(Some(_))))
    }

    /// N rounded up to whole column panels: the width of one K block of packed B.
    fn n_padded(&self) -> usize {
        self.n.div_ceil(self.tile.nr()) * self.tile.nr()
    }

    /// The row stride (in pairs) of bf16 pair rows of A: KC rounded up to whole 64-byte
    /// vectors, so that converting a row a vector at a time never writes into the next row.
    fn pair_row_stride(&self) -> i64 {
        self.kc.next_multiple_of(PAIRS_PER_VECTOR) as i64
    }

    fn slot_of(&self, op: &Operand) -> usize {
        match op {
            Operand::Packed { slot } | Operand::Nibbles { slot, .. } => self.n_inputs + 1 + slot,
            Operand::Strided { input, .. }
            | Operand::Im2col { input, .. }
            | Operand::Im2colNhwc { input, .. } => *input,
        }
    }
}
