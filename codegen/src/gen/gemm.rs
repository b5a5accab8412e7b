//! Register-blocked GEMM and convolution kernels (see the module docs of `gen`).
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
//!
//! Convolution (NCHW) maps to: M = output channels (A = filters), N = output pixels, K =
//! C/group·KH·KW; groups become a batch axis. Depthwise convolution has its own kernel
//! (`dwconv`).

use super::conv_nhwc::PackTo;
use super::emit::Emit;
use super::{llvm, GeneratedKernel, KernelBuilder, PackedConst, Scratch};
use crate::error::Result;
use crate::node::NodeInfo;
use crate::target::{Isa, TargetDesc};
use inkwell::values::{FunctionValue, IntValue, PointerValue, VectorValue};
use inkwell::{FloatPredicate, IntPredicate};
use kiln_ir::{AutoPad, ConvAttrs, DType, Layout, Op};

/// An activation applied to the output tile in registers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    None,
    Relu,
    Clip {
        min: f32,
        max: f32,
    },
    Sigmoid,
    /// `x * sigmoid(x)`.
    Silu,
    /// ONNX HardSwish: `x * clamp(x/6 + 1/2, 0, 1)`.
    HardSwish,
    /// `0.5·x·(1 + erf(x/√2))`.
    GeluErf,
    /// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
    GeluTanh,
}

/// A bias added to every output element of a row (output channel) or of a column.
#[derive(Clone, Debug, PartialEq)]
pub enum Bias {
    None,
    /// One value per row of the product (per output channel of a convolution).
    PerRow(Vec<f32>),
    /// One value per column of the product.
    PerCol(Vec<f32>),
}

/// A tensor with the output's shape added before the activation.
#[derive(Clone, Debug, PartialEq)]
pub enum Residual {
    /// Input `i` of the (fused) node, with exactly the output's shape and layout.
    Input(usize),
    /// A constant `[M, N]` matrix, the same for every batch entry.
    Const(Vec<f32>),
}

/// What happens to an output tile after the product, before it is stored:
/// `y = act(scale * acc + bias + residual)`.
#[derive(Clone, Debug, PartialEq)]
pub struct Epilogue {
    pub scale: f32,
    pub bias: Bias,
    pub residual: Option<Residual>,
    pub activation: Activation,
    /// Also write the per-channel mean of the result (a fused GlobalAveragePool) as a second
    /// output; only the depthwise kernel does.
    pub pool_mean: bool,
    /// Round the result to bf16 values (to nearest even) as the last step: the autocast's
    /// `Cast<f32>(Cast<bf16>(y))` of a result that has no other use. Only the GEMM kernels
    /// do (`fuse::find_chains` asks for it on their anchors only).
    pub round_bf16: bool,
    /// A per-channel scale of the input fused in front of the product (squeeze-excitation's
    /// `x * s` before a pointwise convolution): the input slot of `s`, `[N, 1, 1, C]` for an
    /// input `[N, H, W, C]`. A is scaled as it is packed, so the scaled input is never
    /// stored. Only channels-last pointwise f32 convolutions take it; others decline.
    pub input_scale: Option<usize>,
}

impl Default for Epilogue {
    fn default() -> Self {
        Epilogue {
            scale: 1.0,
            bias: Bias::None,
            residual: None,
            activation: Activation::None,
            pool_mean: false,
            round_bf16: false,
            input_scale: None,
        }
    }
}

impl Epilogue {
    /// The epilogue a fusion pass builds: bias (per output channel / row), optional residual
    /// input of the fused node, optional activation.
    pub fn new(bias: Bias, residual: Option<Residual>, activation: Activation) -> Epilogue {
        Epilogue {
            scale: 1.0,
            bias,
            residual,
            activation,
            pool_mean: false,
            round_bf16: false,
            input_scale: None,
        }
    }
}

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

    pub fn nr(&self) -> usize {
        (self.lanes * self.nv) as usize
    }
}

/// Where an operand's panels come from.
#[derive(Clone, Debug, PartialEq)]
enum Operand {
    /// Packed at compile time: packed constant `slot`, one panel set per own batch entry.
    Packed { slot: usize },
    /// Node input `input`: element (row, col) at `row * rs + col * cs`.
    Strided { input: usize, rs: usize, cs: usize },
    /// The im2col matrix of a convolution input (B only).
    Im2col { input: usize, g: ConvGeom },
    /// The im2col matrix of a channels-last convolution input (A only): row = output pixel,
    /// k = (kh, kw, c) (see `conv_nhwc`).
    Im2colNhwc { input: usize, g: ConvGeom },
}

/// Convolution geometry for im2col (per group: `c` is the group's input channels).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ConvGeom {
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

/// One batch axis: its extent and the element stride it adds to each operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BatchDim {
    extent: usize,
    a: usize,
    b: usize,
    c: usize,
    bias_row: usize,
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
}

/// The per-image column scale of A (`Epilogue::input_scale`).
#[derive(Clone, Copy, Debug)]
struct AScale {
    /// Input slot of the scales, K per image.
    input: usize,
    /// Rows of A per image.
    rows_per_image: usize,
}

pub fn lower(node: &NodeInfo, target: &TargetDesc) -> Result<Option<Box<dyn GeneratedKernel>>> {
    let epi = match node_bias(node)? {
        Some(e) => e,
        None => return Ok(None),
    };
    lower_fused(node, target, epi)
}

/// The epilogue `lower` uses: the node's own bias (conv B, Gemm C when constant); None when the
/// node is not one this generator handles.
fn node_bias(node: &NodeInfo) -> Result<Option<Epilogue>> {
    match node.op() {
        Op::Conv(_) => {
            if !node.has_input(2) {
                return Ok(Some(Epilogue::default()));
            }
            match node
                .known(2)
                .and_then(|t| t.cast(DType::F32).as_slice::<f32>().map(|s| s.to_vec()))
            {
                Some(b) => Ok(Some(Epilogue::new(Bias::PerRow(b), None, Activation::None))),
                None => Ok(None),
            }
        }
        Op::MatMul | Op::Gemm { .. } => Ok(Some(Epilogue::default())),
        _ => Ok(None),
    }
}

/// Lowers `node` with a given epilogue (the fusion pass supplies bias, residual, activation).
/// For Conv, `epi.bias` replaces the node's own bias input; for Gemm, C is handled here.
pub fn lower_fused(
    node: &NodeInfo,
    target: &TargetDesc,
    epi: Epilogue,
) -> Result<Option<Box<dyn GeneratedKernel>>> {
    if target.is_gpu() {
        return Ok(None);
    }
    for i in 0..node.n_inputs() {
        if let Some(t) = node.input_type(i) {
            if t.dtype != DType::F32 || t.layout != Layout::RowMajor || !t.is_static() {
                return Ok(None);
            }
        }
    }
    let ot = node.output_type(0);
    if ot.dtype != DType::F32 || ot.layout != Layout::RowMajor || !ot.is_static() {
        return Ok(None);
    }
    if epi.pool_mean && !matches!(node.op(), Op::Conv(_)) {
        return Ok(None);
    }
    if epi.residual.is_some() && matches!(node.op(), Op::Gemm { .. }) {
        // Gemm's C takes the residual slot; a fused Gemm should be a MatMul.
        return Ok(None);
    }
    let tile = Tile::for_target(target);
    match node.op() {
        Op::MatMul => lower_matmul(node, target, tile, epi),
        Op::Gemm {
            alpha,
            beta,
            trans_a,
            trans_b,
        } => lower_gemm(node, target, tile, epi, *alpha, *beta, *trans_a, *trans_b),
        Op::Conv(a) => lower_conv(node, target, tile, epi, a),
        _ => Ok(None),
    }
}

fn f32s(node: &NodeInfo, i: usize) -> Option<Vec<f32>> {
    node.known(i)
        .and_then(|t| t.as_slice::<f32>().map(|s| s.to_vec()))
}

/// Packs an `m×k` matrix (element (i,kk) at `i*rs + kk*cs`) into MR-row panels over all of K,
/// zero-padded to a multiple of MR rows.
fn pack_a(src: &[f32], m: usize, k: usize, rs: usize, cs: usize, mr: usize, scale: f32) -> Vec<f32> {
    let panels = m.div_ceil(mr);
    let mut out = vec![0f32; panels * mr * k];
    for p in 0..panels {
        for kk in 0..k {
            for i in 0..mr {
                let row = p * mr + i;
                if row < m {
                    out[p * mr * k + kk * mr + i] = src[row * rs + kk * cs] * scale;
                }
            }
        }
    }
    out
}

/// Packs a `k×n` matrix (element (kk,j) at `kk*rs + j*cs`) into NR-column panels over all of K.
fn pack_b(src: &[f32], k: usize, n: usize, rs: usize, cs: usize, nr: usize, scale: f32) -> Vec<f32> {
    let panels = n.div_ceil(nr);
    let mut out = vec![0f32; panels * nr * k];
    for p in 0..panels {
        for kk in 0..k {
            for j in 0..nr {
                let col = p * nr + j;
                if col < n {
                    out[p * nr * k + kk * nr + j] = src[kk * rs + col * cs] * scale;
                }
            }
        }
    }
    out
}

pub(crate) fn to_bytes(v: &[f32]) -> PackedConst {
    PackedConst {
        bytes: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

/// Row-major strides of a shape.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

struct Builder {
    m: usize,
    n: usize,
    k: usize,
    batch: Vec<BatchDim>,
    a: Operand,
    b: Operand,
    packed: Vec<PackedConst>,
    unread: Vec<usize>,
    what: String,
    /// Rows of A per image when A is a row-major input that `Epilogue::input_scale` may scale.
    scalable_rows: Option<usize>,
}

impl Builder {
    fn finish(
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
                self.packed.push(to_bytes(&p));
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
                self.packed.push(to_bytes(&p));
            }
        }
        let residual = match &epi.residual {
            None => None,
            Some(Residual::Input(i)) => {
                if node.input_shape(*i)? != node.output_shape(0)? {
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
                self.packed.push(to_bytes(v));
                Some(Operand::Packed { slot })
            }
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
        // Pair packing has no scaling step: a scaled A stays f32.
        let bf16_pairs = a_scale.is_none() && self.try_bf16_pairs(node, target, &tile);
        if bf16_pairs {
            self.k = k_elems.div_ceil(2);
        }
        let batch_total: usize = self.batch.iter().map(|d| d.extent).product();
        let (kc, mb, nb) = plan_blocks(
            &tile,
            m,
            n,
            self.k,
            batch_total,
            !matches!(self.b, Operand::Packed { .. }),
        );
        // With one K block the panel-major layout already is the K-block-major one.
        if let Operand::Packed { slot } = self.b {
            if kc < self.k {
                self.packed[slot] = block_major_panels(&self.packed[slot], self.k, nr, kc, n.div_ceil(nr));
            }
        }
        let what = format!(
            "{} {}x{} {:?}{} M={m} N={n} K={k_elems} batch={batch_total} KC={kc} MB={mb} NB={nb}",
            self.what,
            mr,
            nr,
            target.isa,
            if bf16_pairs { " bf16" } else { "" },
        );
        Ok(Some(Box::new(GemmKernel {
            what,
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
        })))
    }

    /// Switches the product to bf16 pairs when the target has `vdpbf16ps` and both operands
    /// hold only bf16 values (the autocast pass's operands: weights rounded at compile time,
    /// activations widened from bf16), so the result is the f32 kernel's up to the order of
    /// f32 additions. Re-packs the constant B as pairs; the run-time A must be one the pair
    /// packing reads (row-major, or an NHWC im2col).
    fn try_bf16_pairs(&mut self, node: &NodeInfo, target: &TargetDesc, tile: &Tile) -> bool {
        if !target.has_bf16_pair_kernels() || tile.lanes != 16 {
            return false;
        }
        let Operand::Packed { slot } = self.b else {
            return false;
        };
        // One panel set for every batch entry.
        if self.batch.iter().any(|d| d.b != 0) {
            return false;
        }
        let a_input = match self.a {
            Operand::Strided { input, cs: 1, .. } | Operand::Im2colNhwc { input, .. } => input,
            _ => return false,
        };
        if !node.input_is_bf16_valued(a_input) {
            return false;
        }
        match pair_panels(&self.packed[slot], self.k, tile.nr()) {
            Some(p) => {
                self.packed[slot] = p;
                true
            }
            None => false,
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
    let tile = Tile::for_target(target);
    let nr = tile.nr();
    let mut panels = Vec::with_capacity(batch * n.div_ceil(nr) * nr * k);
    for mat in b_mats.chunks_exact(k * n) {
        panels.extend(pack_b(mat, k, n, n, 1, nr, 1.0));
    }
    let b_per_entry = panels.len() / batch;
    let (kc, mb, nb) = plan_blocks(&tile, m, n, k, batch, false);
    let mut packed = to_bytes(&panels);
    if kc < k {
        packed = block_major_panels(&packed, k, nr, kc, n.div_ceil(nr));
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
    };
    (kernel, packed)
}

/// Re-lays packed B panels `[panel][K][NR]` (4-byte elements, one panel set per batch entry)
/// out K-block major, `[K block][panel][kc][NR]` with blocks of `kc` rows (the last one
/// shorter): a task walks its panels of one K block, then the next block, so it reads B
/// front to back. Weights larger than the caches stream from memory on every run, and with
/// panel-major B each panel's block was a separate stream the hardware prefetcher had to
/// find again.
fn block_major_panels(packed: &PackedConst, k: usize, nr: usize, kc: usize, n_panels: usize) -> PackedConst {
    let panel_bytes = k * nr * 4;
    let mut out = Vec::with_capacity(packed.bytes.len());
    // Batch entries are whole panel sets of `n_panels` panels each, re-laid one by one.
    for matrix in packed.bytes.chunks_exact(n_panels * panel_bytes) {
        for k0 in (0..k).step_by(kc) {
            let rows = kc.min(k - k0);
            for panel in matrix.chunks_exact(panel_bytes) {
                out.extend_from_slice(&panel[k0 * nr * 4..(k0 + rows) * nr * 4]);
            }
        }
    }
    PackedConst { bytes: out }
}

/// Re-packs f32 B panels `[panel][K][NR]` as bf16 pairs `[panel][ceil(K/2)][NR]`, the operand
/// layout of `vdpbf16ps`: the 32-bit word (kp, j) holds row 2kp in its low half and row 2kp+1
/// (zero past K) in its high half. None when some value is not exactly a bf16 value (a Gemm's
/// alpha folded into the weights, say), which the pairs could not represent.
fn pair_panels(packed: &PackedConst, k: usize, nr: usize) -> Option<PackedConst> {
    let words: Vec<u32> = packed
        .bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    if words.iter().any(|w| w & 0xffff != 0) || !words.len().is_multiple_of(k * nr) {
        return None;
    }
    let k2 = k.div_ceil(2);
    let mut out = Vec::with_capacity(words.len() / (k * nr) * k2 * nr * 4);
    for panel in words.chunks_exact(k * nr) {
        for kp in 0..k2 {
            for j in 0..nr {
                let lo = panel[2 * kp * nr + j] >> 16;
                let hi = if 2 * kp + 1 < k {
                    panel[(2 * kp + 1) * nr + j] & 0xffff_0000
                } else {
                    0
                };
                out.extend_from_slice(&(lo | hi).to_le_bytes());
            }
        }
    }
    Some(PackedConst { bytes: out })
}

/// The size of a weight matrix beyond which it is read from memory rather than a cache, so
/// that every M block re-reading it costs bandwidth. Measured on ResNet-50: limits of 1-2 MiB
/// also re-planned its stage-3 convolutions (2.4 MB of weights), which got slower; at 4 MiB
/// only its stage-4 ones (9.4 MB) and the FC layer change, and they get faster.
const WEIGHT_STREAM_BYTES: usize = 4 << 20;

/// The A block (MB rows × KC, packed once per K block and reused by every column panel) is
/// sized to stay in a 1 MiB L2 beside one B panel: 192 KiB normally, and up to 512 KiB when the
/// weights outgrow L2 (`LARGE_WEIGHT_BYTES`). A task reads its NB columns of B once for its MB
/// rows, so a bigger M block reads the weights from L3 fewer times: ResNet-50's stage-3 3x3
/// convolutions (M = 196, 2.3 MiB of weights) then take all rows in one block and run 8-11%
/// faster (Zen 4, 2 threads). Layers with small weights gain nothing from a bigger A block
/// and lost 3-7% with one (stage-1 pointwise convolutions, K = 64).
const A_BLOCK_BYTES: usize = 192 << 10;
const LARGE_A_BLOCK_BYTES: usize = 512 << 10;
const LARGE_WEIGHT_BYTES: usize = 512 << 10;

/// Chooses KC, MB, NB: KC splits K evenly into blocks of at most ~256; MB keeps the A block in
/// L2; MB and NB minimize the slowest of two threads' work (tasks are spread evenly), counting
/// B packing, streaming the A block, re-reading weights over `WEIGHT_STREAM_BYTES` and a
/// per-task overhead, so two threads balance on the common conv/matmul layers.
fn plan_blocks(
    tile: &Tile,
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    pack_b: bool,
) -> (usize, usize, usize) {
    let kc_target = if tile.lanes >= 16 { 384 } else { 256 };
    let n_kb = k.div_ceil(kc_target).max(1);
    let kc = k.div_ceil(n_kb);
    let mr = tile.mr;
    let nr = tile.nr();
    let mpad = m.div_ceil(mr) * mr;
    let npad = n.div_ceil(nr) * nr;
    let a_block_bytes = if n * k * 4 > LARGE_WEIGHT_BYTES {
        LARGE_A_BLOCK_BYTES
    } else {
        A_BLOCK_BYTES
    };
    let mb_max = ((a_block_bytes / (kc * 4)) / mr).max(1) * mr;
    let threads = 2.0f64;
    let mut best = (f64::INFINITY, mr, nr);
    let mut mb = mr;
    while mb <= mpad.min(mb_max) {
        let n_mb = m.div_ceil(mb);
        let mut nb = nr;
        while nb <= npad.min(512) {
            let n_nb = n.div_ceil(nb);
            let tasks = (batch * n_mb * n_nb) as f64;
            let compute = (mb * nb * k) as f64;
            // A run-time B is packed by every task; the weights, when too large for the
            // caches, are streamed from memory by every task, which makes small-M products
            // with large weights (the last stages of a CNN, FC layers) prefer one M block.
            let packing = if pack_b {
                (nb * k) as f64 * 6.0
            } else if n * k * 4 > WEIGHT_STREAM_BYTES {
                (nb * k) as f64 * 8.0
            } else {
                0.0
            };
            // Each task streams its A block from memory.
            let a_stream = (mb * k) as f64 * 8.0;
            let per_task = compute + packing + a_stream + 20000.0;
            let cost = (tasks / threads).ceil() * per_task;
            // Ties go to bigger blocks (fewer tasks, less packing).
            if cost < best.0 * 0.999 {
                best = (cost, mb, nb);
            }
            nb += nr;
        }
        mb += mr;
    }
    (kc, best.1, best.2)
}

fn lower_matmul(
    node: &NodeInfo,
    target: &TargetDesc,
    tile: Tile,
    epi: Epilogue,
) -> Result<Option<Box<dyn GeneratedKernel>>> {
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
    let (sta, stb, stc) = (strides(&pa), strides(&pb), strides(&out_batch));
    let mut b = Builder {
        m,
        n,
        k,
        batch: vec![],
        a: Operand::Strided {
            input: 0,
            rs: k,
            cs: 1,
        },
        b: Operand::Strided {
            input: 1,
            rs: n,
            cs: 1,
        },
        packed: vec![],
        unread: vec![],
        what: "matmul".into(),
        scalable_rows: None,
    };
    let (mut a_mat, mut b_mat) = (m * k, k * n);
    if let Some(w) = f32s(node, 1) {
        let per = n.div_ceil(tile.nr()) * tile.nr() * k;
        let mut all = Vec::with_capacity(per * pb.iter().product::<usize>());
        for bi in 0..pb.iter().product::<usize>() {
            all.extend(pack_b(&w[bi * k * n..], k, n, n, 1, tile.nr(), 1.0));
        }
        b.b = Operand::Packed { slot: 0 };
        b.packed.push(to_bytes(&all));
        b.unread.push(1);
        b_mat = per;
    } else if let Some(w) = f32s(node, 0) {
        let per = m.div_ceil(tile.mr) * tile.mr * k;
        let mut all = Vec::with_capacity(per * pa.iter().product::<usize>());
        for bi in 0..pa.iter().product::<usize>() {
            all.extend(pack_a(&w[bi * m * k..], m, k, k, 1, tile.mr, 1.0));
        }
        b.a = Operand::Packed { slot: 0 };
        b.packed.push(to_bytes(&all));
        b.unread.push(0);
        a_mat = per;
    }
    b.batch = (0..nd)
        .map(|i| BatchDim {
            extent: out_batch[i],
            a: if pa[i] == 1 { 0 } else { sta[i] * a_mat },
            b: if pb[i] == 1 { 0 } else { stb[i] * b_mat },
            c: stc[i] * m * n,
            bias_row: 0,
        })
        .collect();
    b.finish(node, target, tile, epi)
}

#[allow(clippy::too_many_arguments)]
fn lower_gemm(
    node: &NodeInfo,
    target: &TargetDesc,
    tile: Tile,
    mut epi: Epilogue,
    alpha: f32,
    beta: f32,
    trans_a: bool,
    trans_b: bool,
) -> Result<Option<Box<dyn GeneratedKernel>>> {
    let sa = node.input_shape(0)?;
    let sb = node.input_shape(1)?;
    if sa.len() != 2 || sb.len() != 2 {
        return Ok(None);
    }
    let (m, k) = if trans_a { (sa[1], sa[0]) } else { (sa[0], sa[1]) };
    let n = if trans_b { sb[0] } else { sb[1] };
    // Element (i, kk) of op(A) and (kk, j) of op(B).
    let (ars, acs) = if trans_a { (1, m) } else { (k, 1) };
    let (brs, bcs) = if trans_b { (1, k) } else { (n, 1) };
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
        b.packed
            .push(to_bytes(&pack_b(&w, k, n, brs, bcs, tile.nr(), alpha)));
        b.b = Operand::Packed { slot: 0 };
        b.unread.push(1);
    } else if let Some(w) = f32s(node, 0) {
        b.packed
            .push(to_bytes(&pack_a(&w, m, k, ars, acs, tile.mr, alpha)));
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

fn lower_conv(
    node: &NodeInfo,
    target: &TargetDesc,
    tile: Tile,
    epi: Epilogue,
    attrs: &ConvAttrs,
) -> Result<Option<Box<dyn GeneratedKernel>>> {
    let xs = node.input_shape(0)?;
    let ws = node.input_shape(1)?;
    let ys = node.output_shape(0)?;
    if xs.len() != 4 || ws.len() != 4 || ys.len() != 4 {
        return Ok(None);
    }
    let Some(w) = f32s(node, 1) else {
        return Ok(None);
    };
    if attrs.channels_last {
        return lower_conv_nhwc(node, target, tile, epi, attrs, &w);
    }
    let (nb, c, h, wd) = (xs[0], xs[1], xs[2], xs[3]);
    let (m, cg, kh, kw) = (ws[0], ws[1], ws[2], ws[3]);
    let g = attrs.group.max(1);
    let (oh, ow) = (ys[2], ys[3]);
    let Some(geo) = conv_geometry(attrs, h, wd, kh, kw, oh, ow) else {
        return Err(node.unsupported("convolution window does not match the output shape"));
    };
    if g == c && g == m && cg == 1 && g > 1 {
        if epi.input_scale.is_some() {
            return Ok(None);
        }
        return super::dwconv::lower(node, target, epi, &w, geo.into_dw(nb, c));
    }
    if epi.pool_mean {
        return Ok(None);
    }
    if c % g != 0 || m % g != 0 || cg != c / g || ys[1] != m {
        return Ok(None);
    }
    let mg = m / g;
    let geo = ConvGeom { c: cg, ..geo };
    let k = cg * kh * kw;
    let n = oh * ow;
    let per = mg.div_ceil(tile.mr) * tile.mr * k;
    let mut packed_w = Vec::with_capacity(per * g);
    for gi in 0..g {
        packed_w.extend(pack_a(&w[gi * mg * k..], mg, k, k, 1, tile.mr, 1.0));
    }
    let pointwise =
        kh == 1 && kw == 1 && geo.sh == 1 && geo.sw == 1 && geo.ph == 0 && geo.pw == 0 && oh == h && ow == wd;
    let bop = if pointwise {
        Operand::Strided {
            input: 0,
            rs: h * wd,
            cs: 1,
        }
    } else {
        Operand::Im2col { input: 0, g: geo }
    };
    if let Bias::PerRow(v) = &epi.bias {
        if v.len() != m {
            return Err(node.unsupported(format!("bias has {} values for {m} output channels", v.len())));
        }
    }
    let mut unread = vec![1];
    if node.has_input(2) {
        unread.push(2);
    }
    let b = Builder {
        m: mg,
        n,
        k,
        batch: vec![
            BatchDim {
                extent: nb,
                a: 0,
                b: c * h * wd,
                c: m * n,
                bias_row: 0,
            },
            BatchDim {
                extent: g,
                a: per,
                b: cg * h * wd,
                c: mg * n,
                bias_row: mg,
            },
        ],
        a: Operand::Packed { slot: 0 },
        b: bop,
        packed: vec![to_bytes(&packed_w)],
        unread,
        what: format!("conv{kh}x{kw}/{}", geo.sh),
        scalable_rows: None,
    };
    b.finish(node, target, tile, epi)
}

/// A channels-last convolution (X `[N,H,W,C]`, Y `[N,OH,OW,M]`): M = output pixels, N = output
/// channels (B = weights, re-laid out to `[(kh,kw,c), m]` and packed), K = KH·KW·C. A 1×1
/// stride-1 convolution is a plain matmul of the input over all images; others pack A from the
/// input with runs of contiguous channels per tap. The bias is per column. Depthwise
/// convolutions go to `conv_nhwc::lower_dw`; other grouped ones are not handled.
fn lower_conv_nhwc(
    node: &NodeInfo,
    target: &TargetDesc,
    tile: Tile,
    mut epi: Epilogue,
    attrs: &ConvAttrs,
    w: &[f32],
) -> Result<Option<Box<dyn GeneratedKernel>>> {
    let xs = node.input_shape(0)?;
    let ws = node.input_shape(1)?;
    let ys = node.output_shape(0)?;
    let (nb, h, wd, c) = (xs[0], xs[1], xs[2], xs[3]);
    let (m, cg, kh, kw) = (ws[0], ws[1], ws[2], ws[3]);
    let g = attrs.group.max(1);
    let (oh, ow) = (ys[1], ys[2]);
    let Some(geo) = conv_geometry(attrs, h, wd, kh, kw, oh, ow) else {
        return Err(node.unsupported("convolution window does not match the output shape"));
    };
    if g == c && g == m && cg == 1 && g > 1 {
        if epi.input_scale.is_some() {
            return Ok(None);
        }
        return super::conv_nhwc::lower_dw(node, target, epi, w, geo.into_dw(nb, c));
    }
    if g != 1 || cg != c || ys[3] != m {
        return Ok(None);
    }
    epi.bias = match epi.bias {
        Bias::PerRow(v) if v.len() != m => {
            return Err(node.unsupported(format!("bias has {} values for {m} output channels", v.len())))
        }
        Bias::PerRow(v) => Bias::PerCol(v),
        other => other,
    };
    if kh == 3 && kw == 3 && (geo.sh, geo.sw, geo.dh, geo.dw) == (1, 1, 1, 1) {
        let wg = super::winograd::WinoGeom {
            n: nb,
            h,
            w: wd,
            c,
            k: m,
            oh,
            ow,
            ph: geo.ph,
            pw: geo.pw,
        };
        if let Some(kernel) = super::winograd::lower(node, target, &epi, w, wg)? {
            return Ok(Some(kernel));
        }
    }
    let k = kh * kw * c;
    let taps = kh * kw;
    let mut wt = vec![0f32; k * m];
    for mo in 0..m {
        for ci in 0..c {
            for t in 0..taps {
                wt[(t * c + ci) * m + mo] = w[(mo * c + ci) * taps + t];
            }
        }
    }
    let packed = pack_b(&wt, k, m, m, 1, tile.nr(), 1.0);
    let pointwise =
        kh == 1 && kw == 1 && geo.sh == 1 && geo.sw == 1 && geo.ph == 0 && geo.pw == 0 && oh == h && ow == wd;
    let mut unread = vec![1];
    if node.has_input(2) {
        unread.push(2);
    }
    let (rows, a, batch) = if pointwise {
        let a = Operand::Strided {
            input: 0,
            rs: c,
            cs: 1,
        };
        (nb * oh * ow, a, vec![])
    } else {
        let a = Operand::Im2colNhwc {
            input: 0,
            g: ConvGeom { c, ..geo },
        };
        let batch = vec![BatchDim {
            extent: nb,
            a: h * wd * c,
            b: 0,
            c: oh * ow * m,
            bias_row: 0,
        }];
        (oh * ow, a, batch)
    };
    let b = Builder {
        m: rows,
        n: m,
        k,
        batch,
        a,
        b: Operand::Packed { slot: 0 },
        packed: vec![to_bytes(&packed)],
        unread,
        what: format!("conv{kh}x{kw}/{} nhwc", geo.sh),
        scalable_rows: pointwise.then_some(oh * ow),
    };
    b.finish(node, target, tile, epi)
}

/// Resolved 2-D window (pads from `auto_pad`), checked against the output extents.
fn conv_geometry(
    a: &ConvAttrs,
    h: usize,
    w: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
) -> Option<ConvGeom> {
    if !a.kernel_shape.is_empty() && a.kernel_shape != [kh, kw] {
        return None;
    }
    let get = |v: &Vec<usize>, i: usize| if v.is_empty() { 1 } else { v[i] };
    let (sh, sw) = (get(&a.strides, 0), get(&a.strides, 1));
    let (dh, dw) = (get(&a.dilations, 0), get(&a.dilations, 1));
    if sh == 0 || sw == 0 || dh == 0 || dw == 0 {
        return None;
    }
    let axis = |input: usize, k: usize, s: usize, d: usize, i: usize| -> Option<(usize, usize)> {
        let ext = (k - 1) * d + 1;
        let (pb, pe) = match a.auto_pad {
            AutoPad::NotSet => {
                if a.pads.is_empty() {
                    (0, 0)
                } else {
                    (a.pads[i], a.pads[i + 2])
                }
            }
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
    if o_h != oh || o_w != ow || kh == 0 || kw == 0 {
        return None;
    }
    Some(ConvGeom {
        c: 0,
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

impl ConvGeom {
    fn into_dw(self, batch: usize, c: usize) -> super::dwconv::DwGeom {
        super::dwconv::DwGeom {
            batch,
            c,
            h: self.h,
            w: self.w,
            kh: self.kh,
            kw: self.kw,
            sh: self.sh,
            sw: self.sw,
            dh: self.dh,
            dw: self.dw,
            ph: self.ph,
            pw: self.pw,
            oh: self.oh,
            ow: self.ow,
        }
    }
}

/// Applies `act` to a vector.
pub(crate) fn activation<'ctx>(
    e: &Emit<'_, 'ctx>,
    act: Activation,
    x: VectorValue<'ctx>,
    lanes: u32,
) -> Result<VectorValue<'ctx>> {
    let zero = e.zero_vec(lanes);
    let c = |v: f32| e.splat(e.f32c(v), lanes);
    // Comparisons are ordered, so NaN passes through Relu/Clip unchanged like the reference.
    let clamp =
        |x: VectorValue<'ctx>, lo: VectorValue<'ctx>, hi: VectorValue<'ctx>| -> Result<VectorValue<'ctx>> {
            let below = e.fcmp(FloatPredicate::OLT, x, lo)?;
            let x = e.vselect(below, lo, x)?;
            let above = e.fcmp(FloatPredicate::OGT, x, hi)?;
            e.vselect(above, hi, x)
        };
    let sigmoid = |x: VectorValue<'ctx>| super::vmath::sigmoid(e, x);
    match act {
        Activation::None => Ok(x),
        Activation::Relu => {
            let neg = e.fcmp(FloatPredicate::OLT, x, zero)?;
            e.vselect(neg, zero, x)
        }
        Activation::Clip { min, max } => clamp(x, c(min)?, c(max)?),
        Activation::Sigmoid => sigmoid(x),
        Activation::Silu => {
            let s = sigmoid(x)?;
            e.fmul(x, s)
        }
        Activation::HardSwish => {
            let t = e.fma(x, c(1.0 / 6.0)?, c(0.5)?)?;
            let t = clamp(t, zero, c(1.0)?)?;
            e.fmul(x, t)
        }
        // 1 + tanh(u) = 2·sigmoid(2u), without the cancellation (as the elementwise kernel).
        Activation::GeluTanh => {
            let x2 = e.fmul(x, x)?;
            let inner = e.fma(x2, c(0.044715)?, c(1.0)?)?;
            let u = e.fmul(e.fmul(x, inner)?, c(1.595_769)?)?;
            e.fmul(x, sigmoid(u)?)
        }
        Activation::GeluErf => super::vmath::gelu_erf(e, x),
    }
}

impl GeneratedKernel for GemmKernel {
    fn describe(&self) -> String {
        self.what.clone()
    }

    fn packed_constants(&self) -> Vec<PackedConst> {
        self.packed.clone()
    }

    fn reads_input(&self, i: usize) -> bool {
        !self.unread.contains(&i)
    }

    fn bf16_dot_products(&self) -> bool {
        self.bf16_pairs
    }

    fn rounds_input_to_bf16(&self, i: usize) -> bool {
        // The pair packing converts A with vcvtneps2bf16 (`bf16_pair_row`).
        self.bf16_pairs
            && matches!(self.a, Operand::Strided { input, .. } | Operand::Im2colNhwc { input, .. } if input == i)
    }

    fn scratch(&self) -> Scratch {
        let mut floats = 0;
        if !matches!(self.b, Operand::Packed { .. }) {
            floats += self.kc * self.nb.div_ceil(self.tile.nr()) * self.tile.nr();
        }
        let a_panels = self.mb.div_ceil(self.tile.mr) * self.tile.mr;
        if self.bf16_pairs {
            floats += self.pair_row_stride() as usize * a_panels;
        } else if !matches!(self.a, Operand::Packed { .. }) {
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
    /// Emits the product at `k`'s builder position, reading its operands from `args` (laid out
    /// as a kernel's arguments: inputs, output, packed constants): a kernel's whole body, or
    /// one step of a kernel that runs a product on its own scratch buffers (`winograd`).
    pub(crate) fn emit_product<'ctx>(
        &self,
        k: &KernelBuilder<'_, 'ctx>,
        args: PointerValue<'ctx>,
    ) -> Result<()> {
        let _ = self.isa;
        let (mr, nv, lanes) = (self.tile.mr, self.tile.nv as usize, self.tile.lanes as usize);
        let row_variants = match self.m % mr {
            0 => vec![mr],
            rows => vec![mr, rows],
        };
        let col_variants = match self.n % self.tile.nr() {
            cols if cols > 0 && cols % lanes == 0 => vec![nv, cols / lanes],
            _ => vec![nv],
        };
        let mut tiles = TileFns { fns: [[None; 2]; 2] };
        for (r, &rows) in row_variants.iter().enumerate() {
            for (c, &vecs) in col_variants.iter().enumerate() {
                tiles.fns[r][c] = Some(self.emit_tile_fn(k, self.a_row_stride(), rows, vecs)?);
            }
        }
        let task = k.new_task_function("task");
        let tb = k.cx.create_builder();
        let entry = k.cx.append_basic_block(task, "entry");
        tb.position_at_end(entry);
        let e = Emit::new(k.cx, k.module, &tb, task);
        self.emit_task(&e, k, &tiles)?;
        tb.build_return(None).map_err(llvm)?;

        let me = Emit::new(k.cx, k.module, k.builder, k.function);
        let data = me.entry_alloca(me.ptr_ty().array_type(2), "taskdata")?;
        me.store(data, k.ctx())?;
        me.store(me.gep_ptr(data, 1)?, args)?;
        let batch: usize = self.batch.iter().map(|d| d.extent).product();
        let tasks = batch * self.m.div_ceil(self.mb) * self.n.div_ceil(self.nb);
        k.parallel_for(task, data, me.i64c(tasks as i64))
    }
}

/// The tile functions of one kernel: the MR×NR tile, and exact tiles for the matrix's last
/// row panel (`M % MR` rows) and last column panel (`N % NR` columns, when that is whole
/// vectors). Running the full tile on a cut panel spends MR rows of FMAs on `M % MR` rows —
/// 10% of the work of a 7x7 stage (M = 49 = 8*6 + 1), 5/6 of a matrix-vector product (M = 1,
/// the classifier heads and squeeze-excitation layers) — and copies C through a local tile.
struct TileFns<'ctx> {
    /// `[rows cut][columns cut]`.
    fns: [[Option<FunctionValue<'ctx>>; 2]; 2],
}

impl<'ctx> TileFns<'ctx> {
    fn cut_rows(&self) -> bool {
        self.fns[1][0].is_some()
    }

    fn cut_cols(&self) -> bool {
        self.fns[0][1].is_some()
    }

    fn get(&self, rows_cut: bool, cols_cut: bool) -> FunctionValue<'ctx> {
        self.fns[usize::from(rows_cut)][usize::from(cols_cut)].expect("tile variant was emitted")
    }
}

/// Pointers a task reads, loaded once at its start.
struct TaskPtrs<'ctx> {
    a: PointerValue<'ctx>,
    b: PointerValue<'ctx>,
    c: PointerValue<'ctx>,
    res: Option<PointerValue<'ctx>>,
    brow: PointerValue<'ctx>,
    bcol: PointerValue<'ctx>,
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
        if self.bf16_pairs {
            return Some(self.pair_row_stride());
        }
        matches!(
            self.a,
            Operand::Im2colNhwc { .. } | Operand::Strided { cs: 1, .. }
        )
        .then_some(self.kc as i64)
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
            Operand::Packed { slot } => self.n_inputs + 1 + slot,
            Operand::Strided { input, .. }
            | Operand::Im2col { input, .. }
            | Operand::Im2colNhwc { input, .. } => *input,
        }
    }

    /// `void tile(a, b, kc, c, ldc, first, last, brow, bcol, res, ldr)`: one `rows` × `vecs`
    /// vectors tile (at most MR × NR) over `kc` steps of k; adds to C unless `first`; applies
    /// the epilogue when `last`. It reads and writes only those rows and columns of C and of
    /// the residual.
    ///
    /// A is read from a panel of MR rows (of which the tile uses the first `rows`): with
    /// `a_rows`, element (i, kk) at `a[i*rs + kk]`, otherwise interleaved, at `a[kk*MR + i]`.
    fn emit_tile_fn<'ctx>(
        &self,
        k: &KernelBuilder<'_, 'ctx>,
        a_rows: Option<i64>,
        rows: usize,
        vecs: usize,
    ) -> Result<FunctionValue<'ctx>> {
        let cx = k.cx;
        let ptr = k.ptr_type();
        let i64t = cx.i64_type();
        let i1 = cx.bool_type();
        let ty = cx.void_type().fn_type(
            &[
                ptr.into(),
                ptr.into(),
                i64t.into(),
                ptr.into(),
                i64t.into(),
                i1.into(),
                i1.into(),
                ptr.into(),
                ptr.into(),
                ptr.into(),
                i64t.into(),
            ],
            false,
        );
        let name = format!("{}.tile{rows}x{vecs}", k.function.get_name().to_string_lossy());
        let f = k
            .module
            .add_function(&name, ty, Some(inkwell::module::Linkage::Internal));
        crate::llvm::set_kernel_attributes(cx, f, k.target);
        for i in [0u32, 1, 3, 7, 8, 9] {
            let noalias = inkwell::attributes::Attribute::get_named_enum_kind_id("noalias");
            f.add_attribute(
                inkwell::attributes::AttributeLoc::Param(i),
                cx.create_enum_attribute(noalias, 0),
            );
        }
        let b = cx.create_builder();
        let entry = cx.append_basic_block(f, "entry");
        b.position_at_end(entry);
        let e = Emit::new(cx, k.module, &b, f);
        let p = |i: u32| f.get_nth_param(i).expect("tile param");
        let (ap, bp, kc) = (
            p(0).into_pointer_value(),
            p(1).into_pointer_value(),
            p(2).into_int_value(),
        );
        let (cp, ldc) = (p(3).into_pointer_value(), p(4).into_int_value());
        let (first, last) = (p(5).into_int_value(), p(6).into_int_value());
        let (brow, bcol) = (p(7).into_pointer_value(), p(8).into_pointer_value());
        let (rp, ldr) = (p(9).into_pointer_value(), p(10).into_int_value());
        let (mr, nv, lanes) = (rows, vecs, self.tile.lanes);
        let nr = self.tile.nr() as i64;
        let vt = e.vty(lanes);
        let acc: Vec<PointerValue> = (0..mr * nv)
            .map(|i| e.entry_alloca(vt, &format!("acc{i}")))
            .collect::<Result<_>>()?;
        let row_ptr = |base: PointerValue<'ctx>,
                       ld: IntValue<'ctx>,
                       i: usize,
                       v: usize|
         -> Result<PointerValue<'ctx>> {
            let off = e.addc(e.mulc(ld, i as i64)?, (v as u32 * lanes) as i64)?;
            e.gep_f32(base, off)
        };
        e.if_else(
            first,
            || {
                for a in &acc {
                    e.store(*a, e.zero_vec(lanes))?;
                }
                Ok(())
            },
            || {
                for i in 0..mr {
                    for v in 0..nv {
                        let x = e.load_vec(row_ptr(cp, ldc, i, v)?, lanes)?;
                        e.store(acc[i * nv + v], x)?;
                    }
                }
                Ok(())
            },
        )?;
        e.for_range(e.i64c(0), kc, 1, |kk| {
            let boff = e.mulc(kk, nr)?;
            let bv: Vec<VectorValue> = (0..nv)
                .map(|v| e.load_vec(e.gep_f32(bp, e.addc(boff, (v as u32 * lanes) as i64)?)?, lanes))
                .collect::<Result<_>>()?;
            let (aoff, row_stride) = match a_rows {
                Some(rs) => (kk, rs),
                None => (e.mulc(kk, self.tile.mr as i64)?, 1),
            };
            for i in 0..mr {
                let s = e.load_f32(e.gep_f32(ap, e.addc(aoff, row_stride * i as i64)?)?)?;
                let sv = e.splat(s, lanes)?;
                for v in 0..nv {
                    let cur = b
                        .build_load(vt, acc[i * nv + v], "")
                        .map_err(llvm)?
                        .into_vector_value();
                    let nx = if self.bf16_pairs {
                        dot_bf16_pairs(&e, cur, sv, bv[v])?
                    } else {
                        e.fma(sv, bv[v], cur)?
                    };
                    b.build_store(acc[i * nv + v], nx).map_err(llvm)?;
                }
            }
            Ok(())
        })?;
        let has_epi = !(self.scale == 1.0
            && self.bias_row.is_none()
            && self.bias_col.is_none()
            && self.residual.is_none()
            && self.activation == Activation::None
            && !self.round_bf16);
        if has_epi {
            e.if_then(last, || {
                let bcolv: Vec<VectorValue> = if self.bias_col.is_some() {
                    (0..nv)
                        .map(|v| e.load_vec(e.gep_f32c(bcol, (v as u32 * lanes) as i64)?, lanes))
                        .collect::<Result<_>>()?
                } else {
                    vec![]
                };
                for i in 0..mr {
                    let br = if self.bias_row.is_some() {
                        Some(e.splat(e.load_f32(e.gep_f32c(brow, i as i64)?)?, lanes)?)
                    } else {
                        None
                    };
                    for v in 0..nv {
                        let mut x = b
                            .build_load(vt, acc[i * nv + v], "")
                            .map_err(llvm)?
                            .into_vector_value();
                        if self.scale != 1.0 {
                            x = e.fmul(x, e.splat(e.f32c(self.scale), lanes)?)?;
                        }
                        if let Some(br) = br {
                            x = e.fadd(x, br)?;
                        }
                        if self.bias_col.is_some() {
                            x = e.fadd(x, bcolv[v])?;
                        }
                        if self.residual.is_some() {
                            x = e.fadd(x, e.load_vec(row_ptr(rp, ldr, i, v)?, lanes)?)?;
                        }
                        x = activation(&e, self.activation, x, lanes)?;
                        if self.round_bf16 {
                            x = super::elementwise::round_bf16(&e, x, lanes)?;
                        }
                        b.build_store(acc[i * nv + v], x).map_err(llvm)?;
                    }
                }
                Ok(())
            })?;
        }
        for i in 0..mr {
            for v in 0..nv {
                let x = b.build_load(vt, acc[i * nv + v], "").map_err(llvm)?;
                e.store(row_ptr(cp, ldc, i, v)?, x)?;
            }
        }
        b.build_return(None).map_err(llvm)?;
        Ok(f)
    }

    fn emit_task<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        k: &KernelBuilder<'_, 'ctx>,
        tiles: &TileFns<'ctx>,
    ) -> Result<()> {
        let f = e.f;
        let data = f.get_nth_param(0).expect("task data").into_pointer_value();
        let t = f.get_nth_param(1).expect("task index").into_int_value();
        let tid = f.get_nth_param(2).expect("task tid").into_int_value();
        let ctx = e.load_ptr(data)?;
        let args = e.load_ptr(e.gep_ptr(data, 1)?)?;
        let slot = |i: usize| -> Result<PointerValue<'ctx>> { e.load_ptr(e.gep_ptr(args, i as i64)?) };
        let (m, n, kk) = (self.m as i64, self.n as i64, self.k as i64);
        let (mr, nr) = (self.tile.mr as i64, self.tile.nr() as i64);
        let (mb, nb, kc_max) = (self.mb as i64, self.nb as i64, self.kc as i64);
        let n_nb = cdiv(n, nb);
        let n_mb = cdiv(m, mb);
        let n_kb = cdiv(kk, kc_max);

        let nbi = e.uremc(t, n_nb)?;
        let t2 = e.udivc(t, n_nb)?;
        let mbi = e.uremc(t2, n_mb)?;
        let bi = e.udivc(t2, n_mb)?;
        // Batch offsets (elements) of each operand.
        let mut offs = [e.i64c(0); 4];
        let mut inner = 1i64;
        for d in self.batch.iter().rev() {
            let idx = e.uremc(e.udivc(bi, inner)?, d.extent as i64)?;
            for (o, s) in offs.iter_mut().zip([d.a, d.b, d.c, d.bias_row]) {
                if s != 0 {
                    *o = e.add(*o, e.mulc(idx, s as i64)?)?;
                }
            }
            inner *= d.extent as i64;
        }
        let [a_off, b_off, c_off, br_off] = offs;
        let null = e.ptr_ty().const_null();
        let ptrs = TaskPtrs {
            a: e.gep_f32(slot(self.slot_of(&self.a))?, a_off)?,
            b: e.gep_f32(slot(self.slot_of(&self.b))?, b_off)?,
            c: e.gep_f32(slot(self.n_inputs + self.out)?, c_off)?,
            res: match &self.residual {
                None => None,
                Some(r @ Operand::Packed { .. }) => Some(slot(self.slot_of(r))?),
                Some(r) => Some(e.gep_f32(slot(self.slot_of(r))?, c_off)?),
            },
            brow: match self.bias_row {
                Some(s) => e.gep_f32(slot(self.n_inputs + 1 + s)?, br_off)?,
                None => null,
            },
            bcol: match self.bias_col {
                Some(s) => slot(self.n_inputs + 1 + s)?,
                None => null,
            },
        };
        let a_packed = matches!(self.a, Operand::Packed { .. });
        let b_packed = matches!(self.b, Operand::Packed { .. });
        let scratch = if a_packed && b_packed {
            null
        } else {
            k.thread_scratch(e.b, ctx, tid)?
        };
        let bpack = scratch;
        let apack = if b_packed {
            scratch
        } else {
            e.gep_f32c(scratch, kc_max * cdiv(nb, nr) * nr)?
        };
        let tmp_c = e.entry_alloca(e.cx.f32_type().array_type((mr * nr) as u32), "tmpc")?;
        let tmp_r = e.entry_alloca(e.cx.f32_type().array_type((mr * nr) as u32), "tmpr")?;

        let m0 = e.mulc(mbi, mb)?;
        let n0 = e.mulc(nbi, nb)?;
        let mcnt = e.umin(e.i64c(mb), e.sub(e.i64c(m), m0)?)?;
        let ncnt = e.umin(e.i64c(nb), e.sub(e.i64c(n), n0)?)?;
        let n_mp = e.udivc(e.addc(mcnt, mr - 1)?, mr)?;
        let n_np = e.udivc(e.addc(ncnt, nr - 1)?, nr)?;

        e.for_n(n_kb, |kb| {
            let k0 = e.mulc(kb, kc_max)?;
            let kc = e.umin(e.i64c(kc_max), e.sub(e.i64c(kk), k0)?)?;
            let first = e.icmp(IntPredicate::EQ, kb, e.i64c(0))?;
            let last = e.icmp(IntPredicate::EQ, kb, e.i64c(n_kb - 1))?;
            let (a_base, a_ps) = if self.bf16_pairs {
                let rs = self.pair_row_stride();
                e.for_range(e.i64c(0), n_mp, 1, |mp| {
                    let row = e.add(m0, e.mulc(mp, mr)?)?;
                    let dst = e.gep_f32(apack, e.mulc(mp, mr * rs)?)?;
                    self.pack_a_pairs(e, dst, ptrs.a, row, k0, kc)
                })?;
                (apack, e.i64c(mr * rs))
            } else if a_packed {
                let off = e.add(e.mulc(m0, kk)?, e.mulc(k0, mr)?)?;
                (e.gep_f32(ptrs.a, off)?, e.i64c(mr * kk))
            } else if let (Some(rs), Operand::Im2colNhwc { g, .. }) = (self.a_row_stride(), &self.a) {
                let g = g.into_dw(1, g.c);
                e.for_range(e.i64c(0), n_mp, 1, |mp| {
                    let row = e.add(m0, e.mulc(mp, mr)?)?;
                    let dst = e.gep_f32(apack, e.mulc(mp, mr * rs)?)?;
                    super::conv_nhwc::pack_a_im2col(
                        e,
                        dst,
                        ptrs.a,
                        row,
                        k0,
                        kc,
                        mr,
                        m,
                        &g,
                        rs,
                        PackTo::F32,
                        self.tile.lanes,
                    )
                })?;
                (apack, e.i64c(mr * rs))
            } else if let (Some(rs), Operand::Strided { rs: a_rs, cs: 1, .. }) =
                (self.a_row_stride(), &self.a)
            {
                let rows = super::conv_nhwc::RowSource {
                    src: ptrs.a,
                    m,
                    row_stride: *a_rs as i64,
                    scale: match self.a_scale {
                        Some(sc) => Some((slot(sc.input)?, sc.rows_per_image as i64, self.k_elems as i64)),
                        None => None,
                    },
                };
                e.for_range(e.i64c(0), n_mp, 1, |mp| {
                    let row = e.add(m0, e.mulc(mp, mr)?)?;
                    let dst = e.gep_f32(apack, e.mulc(mp, mr * rs)?)?;
                    super::conv_nhwc::pack_a_rows(e, dst, &rows, row, k0, kc, mr, rs, self.tile.lanes)
                })?;
                (apack, e.i64c(mr * rs))
            } else {
                e.for_range(e.i64c(0), n_mp, 1, |mp| {
                    let row = e.add(m0, e.mulc(mp, mr)?)?;
                    let dst = e.gep_f32(apack, e.mul(e.mulc(mp, mr)?, kc)?)?;
                    self.pack_a_panel(e, dst, ptrs.a, row, k0, kc)
                })?;
                (apack, e.mulc(kc, mr)?)
            };
            let (b_base, b_ps) = if b_packed {
                // K-block major (`block_major_panels`): the block's panels are consecutive.
                let off = e.add(e.mulc(k0, self.n_padded() as i64)?, e.mul(n0, kc)?)?;
                (e.gep_f32(ptrs.b, off)?, e.mulc(kc, nr)?)
            } else {
                e.for_range(e.i64c(0), n_np, 1, |np| {
                    let col = e.add(n0, e.mulc(np, nr)?)?;
                    let dst = e.gep_f32(bpack, e.mul(e.mulc(np, nr)?, kc)?)?;
                    self.pack_b_panel(e, dst, ptrs.b, col, k0, kc)
                })?;
                (bpack, e.mulc(kc, nr)?)
            };
            e.for_range(e.i64c(0), n_np, 1, |np| {
                let bp = e.gep_f32(b_base, e.mul(np, b_ps)?)?;
                let col = e.add(n0, e.mulc(np, nr)?)?;
                let ncols = e.umin(e.i64c(nr), e.sub(e.i64c(n), col)?)?;
                let next_b = if b_packed {
                    let at = ChunkAt { np, n_np, n0, k0, kc };
                    Some(self.next_b_chunk(e, ptrs.b, bp, b_ps, &at, n_mp)?)
                } else {
                    None
                };
                e.for_range(e.i64c(0), n_mp, 1, |mp| {
                    if let Some(next) = &next_b {
                        next.prefetch_share(e, mp)?;
                    }
                    let ap = e.gep_f32(a_base, e.mul(mp, a_ps)?)?;
                    let row = e.add(m0, e.mulc(mp, mr)?)?;
                    let nrows = e.umin(e.i64c(mr), e.sub(e.i64c(m), row)?)?;
                    let coff = e.add(e.mulc(row, n)?, col)?;
                    let cptr = e.gep_f32(ptrs.c, coff)?;
                    let rptr = match ptrs.res {
                        Some(r) => e.gep_f32(r, coff)?,
                        None => null,
                    };
                    let brow = if self.bias_row.is_some() {
                        e.gep_f32(ptrs.brow, row)?
                    } else {
                        null
                    };
                    let bcol = if self.bias_col.is_some() {
                        e.gep_f32(ptrs.bcol, col)?
                    } else {
                        null
                    };
                    let rows_full = e.icmp(IntPredicate::EQ, nrows, e.i64c(mr))?;
                    let cols_full = e.icmp(IntPredicate::EQ, ncols, e.i64c(nr))?;
                    // Only the matrix's last row panel and last column panel are cut (blocks
                    // are whole panels); a tile goes through the local copy only when its cut
                    // has no exact tile function.
                    let full = match (tiles.cut_rows(), tiles.cut_cols()) {
                        (true, true) => e.cx.bool_type().const_int(1, false),
                        (true, false) => cols_full,
                        (false, true) => rows_full,
                        (false, false) => e.b.build_and(rows_full, cols_full, "").map_err(llvm)?,
                    };
                    let call_tile = |tile_fn: FunctionValue<'ctx>,
                                     c: PointerValue<'ctx>,
                                     ldc: IntValue<'ctx>,
                                     r: PointerValue<'ctx>,
                                     ldr: IntValue<'ctx>|
                     -> Result<()> {
                        e.b.build_call(
                            tile_fn,
                            &[
                                ap.into(),
                                bp.into(),
                                kc.into(),
                                c.into(),
                                ldc.into(),
                                first.into(),
                                last.into(),
                                brow.into(),
                                bcol.into(),
                                r.into(),
                                ldr.into(),
                            ],
                            "",
                        )
                        .map_err(llvm)?;
                        Ok(())
                    };
                    // The exact tile for this panel's rows and columns, straight into C.
                    let call_exact = || -> Result<()> {
                        let by_cols = |rows_cut: bool| -> Result<()> {
                            let call = |cols_cut: bool| {
                                call_tile(tiles.get(rows_cut, cols_cut), cptr, e.i64c(n), rptr, e.i64c(n))
                            };
                            if tiles.cut_cols() {
                                e.if_else(cols_full, || call(false), || call(true))
                            } else {
                                call(false)
                            }
                        };
                        if tiles.cut_rows() {
                            e.if_else(rows_full, || by_cols(false), || by_cols(true))
                        } else {
                            by_cols(false)
                        }
                    };
                    e.if_else(full, call_exact, || {
                        // A cut with no exact tile: run the full tile on a local copy of
                        // the valid part.
                        let copy =
                            |to_tmp: bool, tmp: PointerValue<'ctx>, mem: PointerValue<'ctx>| -> Result<()> {
                                e.for_range(e.i64c(0), nrows, 1, |i| {
                                    e.for_range(e.i64c(0), ncols, 1, |j| {
                                        let pt = e.gep_f32(tmp, e.add(e.mulc(i, nr)?, j)?)?;
                                        let pm = e.gep_f32(mem, e.add(e.mulc(i, n)?, j)?)?;
                                        let (from, to) = if to_tmp { (pm, pt) } else { (pt, pm) };
                                        let v = e.load_f32(from)?;
                                        e.store(to, v)
                                    })
                                })
                            };
                        let not_first = e.b.build_not(first, "").map_err(llvm)?;
                        e.if_then(not_first, || copy(true, tmp_c, cptr))?;
                        if ptrs.res.is_some() {
                            e.if_then(last, || copy(true, tmp_r, rptr))?;
                        }
                        call_tile(tiles.get(false, false), tmp_c, e.i64c(nr), tmp_r, e.i64c(nr))?;
                        copy(false, tmp_c, cptr)
                    })
                })
            })
        })?;
        Ok(())
    }

    /// The packed-B chunk this task reads `prefetch_ahead()` chunks after panel `np` of the K
    /// block at `k0`: a later panel's chunk of the same K block, or past the task's last
    /// panel, one of its chunks of the next K block. Constant weights come from memory the
    /// first time a row tile reads them; prefetching a chunk ahead (the next ones in memory,
    /// but for the jump to the next K block) while the current one serves every row panel
    /// keeps the weights ahead of the tiles, each row tile issuing an equal share of it.
    fn next_b_chunk<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        b_all: PointerValue<'ctx>,
        bp: PointerValue<'ctx>,
        b_ps: IntValue<'ctx>,
        at: &ChunkAt<'ctx>,
        n_mp: IntValue<'ctx>,
    ) -> Result<ChunkPrefetch<'ctx>> {
        let nr = self.tile.nr() as i64;
        let ahead = self.prefetch_ahead();
        let target = e.addc(at.np, ahead)?;
        let in_block = e.icmp(IntPredicate::ULT, target, at.n_np)?;
        let k_next = e.add(at.k0, at.kc)?;
        let kc_next = e.umin(e.i64c(self.kc as i64), e.sub(e.i64c(self.k as i64), k_next)?)?;
        // Plain GEPs: after the last K block the address lies past B (and is not read).
        let f32t = e.cx.f32_type();
        // SAFETY (of the IR): plain GEPs, only used as prefetch addresses.
        let same_block = unsafe { e.b.build_gep(f32t, bp, &[e.mulc(b_ps, ahead)?], "") }.map_err(llvm)?;
        // In the next K block: its panel `target - n_np` (the last one when the task has
        // fewer panels than the distance).
        let panel_next = e.umin(e.sub(target, at.n_np)?, e.addc(at.n_np, -1)?)?;
        let next_block_off = e.add(
            e.add(e.mulc(k_next, self.n_padded() as i64)?, e.mul(at.n0, kc_next)?)?,
            e.mul(e.mulc(panel_next, nr)?, kc_next)?,
        )?;
        let next_block = unsafe { e.b.build_gep(f32t, b_all, &[next_block_off], "") }.map_err(llvm)?;
        let base =
            e.b.build_select(in_block, same_block, next_block, "")
                .map_err(llvm)?
                .into_pointer_value();
        let rows =
            e.b.build_select(in_block, at.kc, kc_next, "")
                .map_err(llvm)?
                .into_int_value();
        let lines = e.udivc(e.addc(e.mulc(rows, nr * 4)?, LINE - 1)?, LINE)?;
        // A task has at least one row panel (n_mp ≥ 1).
        let share =
            e.b.build_int_unsigned_div(e.add(lines, e.addc(n_mp, -1)?)?, n_mp, "")
                .map_err(llvm)?;
        Ok(ChunkPrefetch { base, lines, share })
    }

    /// How many chunks of packed B ahead of the one in use a task prefetches: enough to cover
    /// `PREFETCH_AHEAD_BYTES` (at most 16 chunks).
    fn prefetch_ahead(&self) -> i64 {
        let chunk = self.kc * self.tile.nr() * 4;
        PREFETCH_AHEAD_BYTES.div_ceil(chunk).clamp(1, 16) as i64
    }

    /// Packs rows `[row, row+MR)` × pairs `[k0, k0+kc)` of a run-time A into `dst` as bf16
    /// pair rows (row i at `dst[i*rs..]`, `rs = pair_row_stride`), rounding to nearest even;
    /// rows past M are zero.
    fn pack_a_pairs<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        dst: PointerValue<'ctx>,
        src: PointerValue<'ctx>,
        row: IntValue<'ctx>,
        k0: IntValue<'ctx>,
        kc: IntValue<'ctx>,
    ) -> Result<()> {
        let (mr, m, rs) = (self.tile.mr as i64, self.m as i64, self.pair_row_stride());
        // The block's k range in elements; the last block of an odd K ends on half a pair,
        // whose high half the conversion fills with zero.
        let k0e = e.mulc(k0, 2)?;
        let kce = e.umin(e.mulc(kc, 2)?, e.sub(e.i64c(self.k_elems as i64), k0e)?)?;
        match self.a {
            Operand::Im2colNhwc { g, .. } => {
                // A row of bf16 elements is a row of pairs: pack straight into it, then give
                // an odd K's last pair its zero high half.
                let g = g.into_dw(1, g.c);
                super::conv_nhwc::pack_a_im2col(
                    e,
                    dst,
                    src,
                    row,
                    k0e,
                    kce,
                    mr,
                    m,
                    &g,
                    2 * rs,
                    PackTo::Bf16,
                    self.tile.lanes,
                )?;
                let odd = e.b.build_int_truncate(kce, e.cx.bool_type(), "").map_err(llvm)?;
                e.if_then(odd, || {
                    for i in 0..mr {
                        let row_end = PackTo::Bf16.gep(e, dst, e.addc(kce, i * 2 * rs)?)?;
                        e.store(row_end, e.cx.bf16_type().const_zero())?;
                    }
                    Ok(())
                })
            }
            Operand::Strided {
                rs: src_rs, cs: 1, ..
            } => {
                for i in 0..mr {
                    let r = e.addc(row, i)?;
                    let to = e.gep_f32c(dst, i * rs)?;
                    let valid = e.icmp(IntPredicate::ULT, r, e.i64c(m))?;
                    e.if_else(
                        valid,
                        || {
                            let from = e.gep_f32(src, e.add(e.mulc(r, src_rs as i64)?, k0e)?)?;
                            bf16_pair_row(e, to, from, kce)
                        },
                        || {
                            let per_vector = 2 * PAIRS_PER_VECTOR as i64;
                            let vectors = e.udivc(e.addc(kce, per_vector - 1)?, per_vector)?;
                            e.for_range(e.i64c(0), vectors, 1, |x| {
                                let at = e.gep_f32(to, e.mulc(x, PAIRS_PER_VECTOR as i64)?)?;
                                e.store(at, e.zero_vec(PAIRS_PER_VECTOR as u32))
                            })
                        },
                    )?;
                }
                Ok(())
            }
            _ => Err(crate::error::CodegenError::internal(
                "bf16 pair packing needs a row-major or NHWC im2col A",
            )),
        }
    }

    /// Packs rows `[row, row+MR)` × k `[k0, k0+kc)` of a run-time A into `dst`, interleaved
    /// (zero rows past M).
    fn pack_a_panel<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        dst: PointerValue<'ctx>,
        src: PointerValue<'ctx>,
        row: IntValue<'ctx>,
        k0: IntValue<'ctx>,
        kc: IntValue<'ctx>,
    ) -> Result<()> {
        let Operand::Strided { rs, cs, .. } = self.a else {
            return Err(crate::error::CodegenError::internal(
                "A panel packing needs a strided A",
            ));
        };
        let mr = self.tile.mr as i64;
        for i in 0..mr {
            let r = e.addc(row, i)?;
            let valid = e.icmp(IntPredicate::ULT, r, e.i64c(self.m as i64))?;
            e.if_else(
                valid,
                || {
                    let base = e.gep_f32(src, e.add(e.mulc(r, rs as i64)?, e.mulc(k0, cs as i64)?)?)?;
                    e.for_range(e.i64c(0), kc, 1, |x| {
                        let v = e.load_f32(e.gep_f32(base, e.mulc(x, cs as i64)?)?)?;
                        e.store(e.gep_f32(dst, e.addc(e.mulc(x, mr)?, i)?)?, v)
                    })
                },
                || {
                    e.for_range(e.i64c(0), kc, 1, |x| {
                        e.store(e.gep_f32(dst, e.addc(e.mulc(x, mr)?, i)?)?, e.f32c(0.0))
                    })
                },
            )?;
        }
        Ok(())
    }

    /// Packs columns `[col, col+NR)` × k `[k0, k0+kc)` of a run-time B (or the im2col matrix of
    /// the conv input) into `dst`; columns past N are zero.
    fn pack_b_panel<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        dst: PointerValue<'ctx>,
        src: PointerValue<'ctx>,
        col: IntValue<'ctx>,
        k0: IntValue<'ctx>,
        kc: IntValue<'ctx>,
    ) -> Result<()> {
        let nr = self.tile.nr() as u32;
        let i32t = e.cx.i32_type();
        let iota = e.iota_i32(nr);
        let col32 = e.b.build_int_truncate(col, i32t, "").map_err(llvm)?;
        let cols =
            e.b.build_int_add(iota, e.splat_i32(col32, nr)?, "")
                .map_err(llvm)?;
        let valid =
            e.b.build_int_compare(
                IntPredicate::SLT,
                cols,
                e.splat_i32(e.i32c(self.n as i32), nr)?,
                "",
            )
            .map_err(llvm)?;
        match self.b {
            Operand::Strided { rs, cs, .. } => {
                if cs == 1 {
                    e.for_range(e.i64c(0), kc, 1, |x| {
                        let off = e.add(e.mulc(e.add(k0, x)?, rs as i64)?, col)?;
                        let v = e.masked_load(e.gep_f32(src, off)?, valid, nr)?;
                        e.store(e.gep_f32(dst, e.mulc(x, nr as i64)?)?, v)
                    })
                } else {
                    let csv = e.splat_i32(e.i32c(cs as i32), nr)?;
                    let idx = e.b.build_int_mul(cols, csv, "").map_err(llvm)?;
                    e.for_range(e.i64c(0), kc, 1, |x| {
                        let base = e.gep_f32(src, e.mulc(e.add(k0, x)?, rs as i64)?)?;
                        let v = e.masked_gather(base, idx, valid, nr)?;
                        e.store(e.gep_f32(dst, e.mulc(x, nr as i64)?)?, v)
                    })
                }
            }
            Operand::Im2col { g, .. } => self.pack_im2col(e, dst, src, col, cols, valid, k0, kc, g),
            Operand::Packed { .. } | Operand::Im2colNhwc { .. } => Err(crate::error::CodegenError::internal(
                "packed B is not packed at run time",
            )),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn pack_im2col<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        dst: PointerValue<'ctx>,
        src: PointerValue<'ctx>,
        col: IntValue<'ctx>,
        cols: VectorValue<'ctx>,
        valid: VectorValue<'ctx>,
        k0: IntValue<'ctx>,
        kc: IntValue<'ctx>,
        g: ConvGeom,
    ) -> Result<()> {
        let nr = self.tile.nr() as u32;
        let b = e.b;
        let i32t = e.cx.i32_type();
        let sv = |x: i64| e.splat_i32(e.i32c(x as i32), nr);
        let oh = b
            .build_int_unsigned_div(cols, sv(g.ow as i64)?, "")
            .map_err(llvm)?;
        let ow = b
            .build_int_unsigned_rem(cols, sv(g.ow as i64)?, "")
            .map_err(llvm)?;
        let ihb = b
            .build_int_sub(
                b.build_int_mul(oh, sv(g.sh as i64)?, "").map_err(llvm)?,
                sv(g.ph as i64)?,
                "",
            )
            .map_err(llvm)?;
        let iwb = b
            .build_int_sub(
                b.build_int_mul(ow, sv(g.sw as i64)?, "").map_err(llvm)?,
                sv(g.pw as i64)?,
                "",
            )
            .map_err(llvm)?;
        // Lanes of a panel that lie in one output row read consecutive inputs when the stride
        // is 1: one masked load instead of a gather.
        let ow0 = e.uremc(col, g.ow as i64)?;
        let one_row = if g.sw == 1 {
            e.icmp(IntPredicate::ULE, e.addc(ow0, nr as i64)?, e.i64c(g.ow as i64))?
        } else {
            e.cx.bool_type().const_zero()
        };
        let khw = (g.kh * g.kw) as i64;
        let hw = (g.h * g.w) as i64;
        let ch0 = e.udivc(k0, khw)?;
        let r0 = e.uremc(k0, khw)?;
        let kh0 = e.udivc(r0, g.kw as i64)?;
        let kw0 = e.uremc(r0, g.kw as i64)?;
        let st = |name: &str, v: IntValue<'ctx>| -> Result<PointerValue<'ctx>> {
            let p = e.entry_alloca(e.cx.i64_type(), name)?;
            e.store(p, v)?;
            Ok(p)
        };
        let (pc, ph, pw) = (st("ic", ch0)?, st("ikh", kh0)?, st("ikw", kw0)?);
        let ld = |p: PointerValue<'ctx>| -> Result<IntValue<'ctx>> {
            Ok(b.build_load(e.cx.i64_type(), p, "")
                .map_err(llvm)?
                .into_int_value())
        };
        let body = |contiguous: bool| -> Result<()> {
            e.for_range(e.i64c(0), kc, 1, |x| {
                let (c, kh, kw) = (ld(pc)?, ld(ph)?, ld(pw)?);
                let dh = b
                    .build_int_truncate(e.mulc(kh, g.dh as i64)?, i32t, "")
                    .map_err(llvm)?;
                let dw = b
                    .build_int_truncate(e.mulc(kw, g.dw as i64)?, i32t, "")
                    .map_err(llvm)?;
                let ih = b.build_int_add(ihb, e.splat_i32(dh, nr)?, "").map_err(llvm)?;
                let iw = b.build_int_add(iwb, e.splat_i32(dw, nr)?, "").map_err(llvm)?;
                let okh = b
                    .build_int_compare(IntPredicate::ULT, ih, sv(g.h as i64)?, "")
                    .map_err(llvm)?;
                let okw = b
                    .build_int_compare(IntPredicate::ULT, iw, sv(g.w as i64)?, "")
                    .map_err(llvm)?;
                let mask = b
                    .build_and(b.build_and(okh, okw, "").map_err(llvm)?, valid, "")
                    .map_err(llvm)?;
                let plane = e.gep_f32(src, e.mulc(c, hw)?)?;
                let v = if contiguous {
                    // Lane 0's (ih, iw) may be out of bounds; masked lanes are not accessed, so
                    // the address only has to be formed, not read (no inbounds here).
                    let ih0 = b
                        .build_extract_element(ih, e.i32c(0), "")
                        .map_err(llvm)?
                        .into_int_value();
                    let iw0 = b
                        .build_extract_element(iw, e.i32c(0), "")
                        .map_err(llvm)?
                        .into_int_value();
                    let ih0 = b.build_int_s_extend(ih0, e.cx.i64_type(), "").map_err(llvm)?;
                    let iw0 = b.build_int_s_extend(iw0, e.cx.i64_type(), "").map_err(llvm)?;
                    let off = e.add(e.mulc(ih0, g.w as i64)?, iw0)?;
                    // SAFETY (of the IR): plain GEP, no inbounds claim for a possibly
                    // out-of-range start address.
                    let p = unsafe { b.build_gep(e.cx.f32_type(), plane, &[off], "") }.map_err(llvm)?;
                    e.masked_load(p, mask, nr)?
                } else {
                    let idx = b
                        .build_int_add(b.build_int_mul(ih, sv(g.w as i64)?, "").map_err(llvm)?, iw, "")
                        .map_err(llvm)?;
                    e.masked_gather(plane, idx, mask, nr)?
                };
                e.store(e.gep_f32(dst, e.mulc(x, nr as i64)?)?, v)?;
                // Advance (c, kh, kw).
                let kw1 = e.addc(kw, 1)?;
                let wrap_w = e.icmp(IntPredicate::EQ, kw1, e.i64c(g.kw as i64))?;
                let kh1 = e.addc(kh, 1)?;
                let wrap_h = e.icmp(IntPredicate::EQ, kh1, e.i64c(g.kh as i64))?;
                let sel =
                    |c: IntValue<'ctx>, a: IntValue<'ctx>, bb: IntValue<'ctx>| -> Result<IntValue<'ctx>> {
                        Ok(b.build_select(c, a, bb, "").map_err(llvm)?.into_int_value())
                    };
                let nkw = sel(wrap_w, e.i64c(0), kw1)?;
                let nkh = sel(wrap_w, sel(wrap_h, e.i64c(0), kh1)?, kh)?;
                let both = b.build_and(wrap_w, wrap_h, "").map_err(llvm)?;
                let nc = sel(both, e.addc(c, 1)?, c)?;
                e.store(pw, nkw)?;
                e.store(ph, nkh)?;
                e.store(pc, nc)
            })
        };
        e.if_else(one_row, || body(true), || body(false))
    }
}

/// Cache line size in bytes.
const LINE: i64 = 64;

/// How far ahead (bytes of packed B) a task prefetches its weights into L2 (half of a 1 MiB
/// L2). The weights of ResNet-50 (49 MiB bf16, 98 MiB f32) and the encoder outgrow the L3, so
/// every run streams them from memory; one chunk ahead (48 KiB at KC = 384, the distance
/// before) left the tiles waiting on it. Measured on Zen 4, 2 threads, interleaved rounds,
/// one chunk → 512 KiB: ResNet-50 stage 4 -8 to -13% (whole model -4% bf16, -1.5 to -4.5%
/// f32), the encoder -4 to -12%, MobileNetV2 and EfficientNet-B0 -1.7% (f32); 128 and 256
/// KiB helped less, 1 MiB no more.
const PREFETCH_AHEAD_BYTES: usize = 512 << 10;

/// Where a task is in packed B: panel `np` of `n_np` from column `n0`, K block `[k0, k0+kc)`.
struct ChunkAt<'ctx> {
    np: IntValue<'ctx>,
    n_np: IntValue<'ctx>,
    n0: IntValue<'ctx>,
    k0: IntValue<'ctx>,
    kc: IntValue<'ctx>,
}

/// A chunk of packed B to prefetch, `share` lines per row tile.
struct ChunkPrefetch<'ctx> {
    base: PointerValue<'ctx>,
    lines: IntValue<'ctx>,
    share: IntValue<'ctx>,
}

impl<'ctx> ChunkPrefetch<'ctx> {
    /// Prefetches row tile `mp`'s share of the chunk.
    fn prefetch_share(&self, e: &Emit<'_, 'ctx>, mp: IntValue<'ctx>) -> Result<()> {
        let start = e.mul(mp, self.share)?;
        let end = e.umin(e.add(start, self.share)?, self.lines)?;
        e.for_range(start, end, 1, |l| e.prefetch_l2(self.base, e.mulc(l, LINE)?))
    }
}

/// Ceiling division of positive i64 values.
pub(crate) fn cdiv(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

/// 32-bit words (bf16 pairs) in one 512-bit vector.
const PAIRS_PER_VECTOR: usize = 16;

/// `acc + a·b` over bf16 pairs: each f32 lane j of `acc` adds `a.lo·b[j].lo + a.hi·b[j].hi`
/// (`vdpbf16ps`). `a_pair` is one pair splatted to every lane, `b_pairs` 16 pairs; both
/// arrive as `<16 x float>` holding the pairs' bits.
fn dot_bf16_pairs<'ctx>(
    e: &Emit<'_, 'ctx>,
    acc: VectorValue<'ctx>,
    a_pair: VectorValue<'ctx>,
    b_pairs: VectorValue<'ctx>,
) -> Result<VectorValue<'ctx>> {
    let pairs = e.cx.bf16_type().vec_type(2 * PAIRS_PER_VECTOR as u32);
    let a = e.b.build_bit_cast(a_pair, pairs, "").map_err(llvm)?;
    let b = e.b.build_bit_cast(b_pairs, pairs, "").map_err(llvm)?;
    Ok(e.intrinsic(
        "llvm.x86.avx512bf16.dpbf16ps.512",
        &[],
        &[acc.into(), a.into(), b.into()],
    )?
    .into_vector_value())
}

/// Converts `n` f32 at `src` to bf16 (round to nearest even, as `vcvtneps2bf16`: exact for
/// the bf16 values the pair kernels take) at `dst`, 32 at a time; the last vector's lanes
/// past `n` are zero, so an odd `n` ends on a pair whose high half is zero. Writes whole
/// 64-byte vectors.
fn bf16_pair_row<'ctx>(
    e: &Emit<'_, 'ctx>,
    dst: PointerValue<'ctx>,
    src: PointerValue<'ctx>,
    n: IntValue<'ctx>,
) -> Result<()> {
    let lanes = 2 * PAIRS_PER_VECTOR as u32;
    e.for_masked(n, lanes, |x0, mask| {
        let v = e.masked_load(e.gep_f32(src, x0)?, mask, lanes)?;
        let bf =
            e.b.build_float_trunc(v, e.cx.bf16_type().vec_type(lanes), "")
                .map_err(llvm)?;
        // x0 elements are x0 / 2 pairs.
        e.store(e.gep_f32(dst, e.udivc(x0, 2)?)?, bf)
    })
}
