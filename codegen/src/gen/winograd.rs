//! Winograd convolution F(m×m, 3×3) for channels-last, stride-1 3×3 convolutions.
//!
//! The output is cut into m×m tiles, each computed from an α×α input tile (α = m + 2):
//! `Y = Aᵀ [ Σ_c (G g_c Gᵀ) ⊙ (Bᵀ d_c B) ] A`. The element-wise products summed over input
//! channels are α² independent matrix products `M_ξ[tiles × K] = V_ξ[tiles × C] · U_ξ[C × K]`,
//! one per position ξ of the α×α tile, with `U = G g Gᵀ` computed once at compile time. They
//! take α²/m² multiply-adds per output where the direct convolution takes 9: 4× fewer with
//! m = 4 (α = 6), 2.25× with m = 2. ResNet-50's stride-1 3×3 layers are a third of its FLOPs.
//!
//! A kernel runs three steps per group of tiles, each a `parallel_for`:
//! 1. the input transform `V = Bᵀ d B`, vectorized along channels (NHWC keeps a pixel's
//!    channels contiguous), written to shared scratch `V[ξ][tile][C]`;
//! 2. the α² products, by the GEMM generator (`gemm::batched_product`) into `M[ξ][tile][K]`;
//! 3. the output transform `Aᵀ M A` with the convolution's epilogue (scale, bias, residual,
//!    activation, bf16 rounding) applied before the tile is stored.
//!
//! Tiles are processed in groups so that V and M stay a few MiB (`SCRATCH_BYTES`) whatever
//! the batch. The transforms cost a few adds per element; what the kernel pays for is moving
//! V and M through the caches, which is why the smaller layers (7×7) keep the direct kernel.
//!
//! Accuracy: the transforms multiply by small constants (at most 8 in Aᵀ, 5 in Bᵀ), so the
//! result differs from the direct convolution by a few f32 roundings of the tile's terms:
//! relative errors around 1e-6 for F(4×4) and smaller for F(2×2).

use super::activation::activation;
use super::emit::Emit;
use super::gemm::{batched_product, GemmKernel};
use super::{llvm, GeneratedKernel, KernelBuilder};
use crate::error::Result;
use crate::kernel::epilogue::{Activation, Bias, Epilogue, Residual};
use crate::kernel::{KernelCommon, PackedConst, Scratch};
use crate::node::NodeInfo;
use crate::target::{ConvAlgorithm, TargetDesc};
use inkwell::values::{IntValue, PointerValue, VectorValue};
use inkwell::IntPredicate;

/// One Winograd variant F(m×m, 3×3): its transform matrices (rows of `Bᵀ`, `G`, `Aᵀ`).
struct Variant {
    m: usize,
    bt: &'static [&'static [f64]],
    g: &'static [[f64; 3]],
    at: &'static [&'static [f64]],
}

impl Variant {
    fn alpha(&self) -> usize {
        self.m + 2
    }
}

/// F(2×2, 3×3), interpolation points 0, 1, -1 and ∞.
const F2: Variant = Variant {
    m: 2,
    bt: &[
        &[1.0, 0.0, -1.0, 0.0],
        &[0.0, 1.0, 1.0, 0.0],
        &[0.0, -1.0, 1.0, 0.0],
        &[0.0, 1.0, 0.0, -1.0],
    ],
    g: &[
        [1.0, 0.0, 0.0],
        [0.5, 0.5, 0.5],
        [0.5, -0.5, 0.5],
        [0.0, 0.0, 1.0],
    ],
    at: &[&[1.0, 1.0, 1.0, 0.0], &[0.0, 1.0, -1.0, -1.0]],
};

/// F(4×4, 3×3), interpolation points 0, 1, -1, 2, -1/2 and ∞. The usual 0, ±1, ±2 give
/// rounding errors about three times larger (errors up to 1.8e-6 of `Σ|x·w|` against 6e-7,
/// simulated in f32 with He-scaled weights; the direct kernel's sequential sums reach
/// 1.5e-7): with -1/2 the large coefficients of `Aᵀ` (powers of 2) meet small ones (powers of
/// 1/2) instead of doubling up, the choice Barabasz et al. found best for F(4, 3) ("Error
/// analysis and improving the accuracy of Winograd convolution for deep neural networks").
const F4: Variant = Variant {
    m: 4,
    bt: &[
        &[1.0, 1.5, -2.0, -1.5, 1.0, 0.0],
        &[0.0, -1.0, -2.5, -0.5, 1.0, 0.0],
        &[0.0, 1.0, 0.5, -2.5, 1.0, 0.0],
        &[0.0, -0.5, -1.0, 0.5, 1.0, 0.0],
        &[0.0, 2.0, -1.0, -2.0, 1.0, 0.0],
        &[0.0, 1.0, 1.5, -2.0, -1.5, 1.0],
    ],
    g: &[
        [1.0, 0.0, 0.0],
        [-1.0 / 3.0, -1.0 / 3.0, -1.0 / 3.0],
        [1.0 / 3.0, -1.0 / 3.0, 1.0 / 3.0],
        [1.0 / 15.0, 2.0 / 15.0, 4.0 / 15.0],
        [-16.0 / 15.0, 8.0 / 15.0, -4.0 / 15.0],
        [0.0, 0.0, 1.0],
    ],
    at: &[
        &[1.0, 1.0, 1.0, 1.0, 1.0, 0.0],
        &[0.0, 1.0, -1.0, 2.0, -0.5, 0.0],
        &[0.0, 1.0, 1.0, 4.0, 0.25, 0.0],
        &[0.0, 1.0, -1.0, 8.0, -0.125, 1.0],
    ],
};

/// Shared scratch (V and M) per group of tiles: with batch 1 every layer kiln takes fits in
/// one group, larger batches run several groups instead of growing the arena.
const SCRATCH_BYTES: usize = 6 << 20;

/// Fewest channels (input and output) worth the transforms: with fewer, the products' K is
/// too short for the GEMM kernel to run near its peak and the direct kernel keeps the layer.
const MIN_CHANNELS: usize = 32;

/// Fewest input channels for F(2×2), which saves only 2.25× the multiplies: on ResNet-50
/// (Zen 4, 2 threads) it lost to the direct kernel with 64 channels (56×56: 1.54 against
/// 1.13 ms, the products' short K and moving V and M through L3 cost more than it saves),
/// won 15% with 128 and 2× with 256.
const MIN_CHANNELS_F2: usize = 128;

/// Fewest tiles (over the batch) per layer: the α² products then have at least four row
/// tiles each; smaller layers (ResNet-50's 7×7 stage at batch 1: 16 tiles of 2×2) read α²/9
/// times the weights for too little work.
const MIN_TILES: usize = 48;

/// Largest share of padding the tiles may add (outputs computed and dropped past the edge).
const MAX_TILE_WASTE: f64 = 1.15;

/// Channels-last convolution geometry (one group, stride 1, 3×3, unit dilation).
#[derive(Clone, Copy, Debug)]
pub(crate) struct WinoGeom {
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub c: usize,
    pub k: usize,
    pub oh: usize,
    pub ow: usize,
    pub ph: usize,
    pub pw: usize,
}

pub struct WinogradKernel {
    g: WinoGeom,
    v: &'static Variant,
    tiles_h: usize,
    tiles_w: usize,
    /// Tiles per group (the products' M).
    group_tiles: usize,
    groups: usize,
    /// Tiles per transform task.
    task_tiles: usize,
    lanes: u32,
    product: GemmKernel,
    scale: f32,
    bias: bool,
    residual: Option<usize>,
    activation: Activation,
    round_bf16: bool,
    /// Round the input to bf16 as it is read (`GeneratedKernel::rounds_input_to_bf16`).
    round_input: bool,
    /// `[U packed for the products, bias]`.
    packed: Vec<PackedConst>,
    unread: Vec<usize>,
}

impl std::fmt::Debug for WinogradKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// The variant for a layer, or None when the direct kernel should keep it.
fn choose(g: &WinoGeom, lanes: usize, variants: &[&'static Variant]) -> Option<&'static Variant> {
    if g.c < MIN_CHANNELS || g.k < MIN_CHANNELS || !g.c.is_multiple_of(lanes) || !g.k.is_multiple_of(lanes) {
        return None;
    }
    variants.iter().copied().find(|v| {
        if v.m == 2 && g.c < MIN_CHANNELS_F2 {
            return false;
        }
        let tiles = g.oh.div_ceil(v.m) * g.ow.div_ceil(v.m);
        let waste = (tiles * v.m * v.m) as f64 / (g.oh * g.ow) as f64;
        waste <= MAX_TILE_WASTE && g.n * tiles >= MIN_TILES
    })
}

/// `U_ξ[c][k]` for every position ξ of the α×α tile: `G g Gᵀ` of each 3×3 filter (`w` is
/// `[K][C][3][3]`), computed in f64 and rounded once.
fn transform_weights(v: &Variant, w: &[f32], c: usize, k: usize) -> Vec<f32> {
    let a = v.alpha();
    let mut u = vec![0f32; a * a * c * k];
    for ko in 0..k {
        for ci in 0..c {
            let f = &w[(ko * c + ci) * 9..][..9];
            // t = G · f (α×3), then t · Gᵀ.
            let mut t = vec![[0f64; 3]; a];
            for (i, row) in v.g.iter().enumerate() {
                for j in 0..3 {
                    t[i][j] = (0..3).map(|r| row[r] * f[r * 3 + j] as f64).sum();
                }
            }
            for i in 0..a {
                for j in 0..a {
                    let x: f64 = (0..3).map(|s| t[i][s] * v.g[j][s]).sum();
                    u[((i * a + j) * c + ci) * k + ko] = x as f32;
                }
            }
        }
    }
    u
}

/// Lowers a channels-last stride-1 3×3 convolution to a Winograd kernel, or None when the
/// layer is better left to the direct kernel (or the epilogue is one it does not apply).
pub(crate) fn lower(
    node: &NodeInfo,
    target: &TargetDesc,
    epi: &Epilogue,
    w: &[f32],
    g: WinoGeom,
) -> Result<Option<Box<dyn GeneratedKernel>>> {
    if target.conv_algorithm == ConvAlgorithm::Direct || epi.pool_mean || epi.input_scale.is_some() {
        return Ok(None);
    }
    // Under the bf16 autocast the direct kernel multiplies bf16 pairs (`vdpbf16ps`) at twice
    // the f32 rate: F(2x2) saves too little against that, F(4x4) still runs faster (with f32
    // products of the bf16-valued operands, more accurate than the pairs). It then rounds its
    // input to bf16 itself, as the pair kernels do, so the autocast's rounding pair goes.
    let bf16_pairs =
        target.has_bf16_pair_kernels() && node.input_is_bf16_valued(0) && node.input_is_bf16_valued(1);
    let variants: &[&Variant] = if bf16_pairs { &[&F4] } else { &[&F4, &F2] };
    let lanes = target.f32_lanes();
    let Some(v) = choose(&g, lanes as usize, variants) else {
        return Ok(None);
    };
    let residual = match &epi.residual {
        None => None,
        Some(Residual::Input(i)) if node.input_shape(*i)? == node.output_shape(0)? => Some(*i),
        Some(_) => return Ok(None),
    };
    let packed_bias = match &epi.bias {
        Bias::None => None,
        Bias::PerRow(b) | Bias::PerCol(b) if b.len() == g.k => Some(PackedConst::from_f32s(b)),
        Bias::PerRow(_) | Bias::PerCol(_) => return Ok(None),
    };
    let a = v.alpha();
    let (tiles_h, tiles_w) = (g.oh.div_ceil(v.m), g.ow.div_ceil(v.m));
    let total = g.n * tiles_h * tiles_w;
    let row_bytes = a * a * (g.c + g.k) * 4;
    let groups = total.div_ceil((SCRATCH_BYTES / row_bytes).max(1));
    let group_tiles = total.div_ceil(groups);
    if (group_tiles * a * a * g.c.max(g.k)) >= (1 << 31) || g.n * g.h * g.w * g.c.max(g.k) >= (1 << 31) {
        return Ok(None);
    }
    let task_tiles = (group_tiles / 16).clamp(1, 8);
    let u = transform_weights(v, w, g.c, g.k);
    let (product, packed_u) = batched_product(target, "products", a * a, group_tiles, g.k, g.c, &u);
    let mut packed = vec![packed_u];
    packed.extend(packed_bias);
    let mut unread = vec![1];
    if node.has_input(2) {
        unread.push(2);
    }
    Ok(Some(Box::new(WinogradKernel {
        g,
        v,
        tiles_h,
        tiles_w,
        group_tiles,
        groups,
        task_tiles,
        lanes,
        product,
        scale: epi.scale,
        bias: !matches!(epi.bias, Bias::None),
        residual,
        activation: epi.activation,
        round_bf16: epi.round_bf16,
        round_input: bf16_pairs,
        packed,
        unread,
    })))
}

impl KernelCommon for WinogradKernel {
    fn describe(&self) -> String {
        let g = &self.g;
        format!(
            "winograd F({m}x{m},3x3) nhwc C={} K={} {}x{} tiles={} groups={}; {}",
            g.c,
            g.k,
            g.oh,
            g.ow,
            g.n * self.tiles_h * self.tiles_w,
            self.groups,
            self.product.describe(),
            m = self.v.m,
        )
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

impl GeneratedKernel for WinogradKernel {
    fn rounds_input_to_bf16(&self, i: usize) -> bool {
        self.round_input && i == 0
    }

    fn scratch(&self) -> Scratch {
        let a = self.v.alpha();
        Scratch {
            shared_bytes: (a * a * self.group_tiles * (self.g.c + self.g.k) * 4) as u64,
            per_thread_bytes: self.product.scratch().per_thread_bytes,
        }
    }

    fn emit(&self, k: &KernelBuilder<'_, '_>) -> Result<()> {
        let me = Emit::new(k.cx, k.module, k.builder, k.function).with_target(k.target);
        let args = k.args();
        let a = self.v.alpha() as i64;
        let shared = k.shared_scratch()?;
        let m_buf = me.gep_f32c(shared, a * a * (self.group_tiles * self.g.c) as i64)?;
        // The products' own arguments: A = V, C = M, packed U.
        let product_args = me.entry_alloca(me.ptr_ty().array_type(3), "products.args")?;
        me.store(product_args, shared)?;
        me.store(me.gep_ptr(product_args, 1)?, m_buf)?;
        me.store(me.gep_ptr(product_args, 2)?, k.packed(0)?)?;

        let input_task = self.emit_transform_task(k, "input_transform", true)?;
        let output_task = self.emit_transform_task(k, "output_transform", false)?;
        // Task data: ctx, the kernel's args, the group's first tile.
        let data = me.entry_alloca(me.cx.i64_type().array_type(3), "winograd.data")?;
        me.store(data, k.ctx())?;
        me.store(me.gep_ptr(data, 1)?, args)?;
        let tasks = me.i64c(self.group_tiles.div_ceil(self.task_tiles) as i64);
        me.for_n(self.groups as i64, |group| {
            me.store(me.gep_ptr(data, 2)?, me.mulc(group, self.group_tiles as i64)?)?;
            k.parallel_for(input_task, data, tasks)?;
            self.product.emit_product(k, product_args)?;
            k.parallel_for(output_task, data, tasks)
        })?;
        k.ret_ok()
    }
}

/// The tile of the batch at a (group-relative) row: its image and top-left output pixel.
struct TilePos<'ctx> {
    image: IntValue<'ctx>,
    y0: IntValue<'ctx>,
    x0: IntValue<'ctx>,
}

impl WinogradKernel {
    /// A `parallel_for` task running one transform over `task_tiles` tiles of the group:
    /// the input transform (`input`) or the output transform with the epilogue.
    fn emit_transform_task<'ctx>(
        &self,
        k: &KernelBuilder<'_, 'ctx>,
        name: &str,
        input: bool,
    ) -> Result<inkwell::values::FunctionValue<'ctx>> {
        let task = k.new_task_function(name);
        let tb = k.cx.create_builder();
        tb.position_at_end(k.cx.append_basic_block(task, "entry"));
        let e = Emit::new(k.cx, k.module, &tb, task).with_target(k.target);
        let data = task.get_nth_param(0).expect("task data").into_pointer_value();
        let t = task.get_nth_param(1).expect("task index").into_int_value();
        let args = e.load_ptr(e.gep_ptr(data, 1)?)?;
        let first_tile = tb
            .build_load(e.cx.i64_type(), e.gep_ptr(data, 2)?, "first_tile")
            .map_err(llvm)?
            .into_int_value();
        let slot = |i: usize| -> Result<PointerValue<'ctx>> { e.load_ptr(e.gep_ptr(args, i as i64)?) };
        let n_packed = self.packed.len();
        let n_inputs = k.n_inputs;
        let shared = slot(n_inputs + 1 + n_packed)?;
        let total = (self.g.n * self.tiles_h * self.tiles_w) as i64;
        let row0 = e.mulc(t, self.task_tiles as i64)?;
        let rows_end = e.umin(
            e.addc(row0, self.task_tiles as i64)?,
            e.i64c(self.group_tiles as i64),
        )?;
        e.for_range(row0, rows_end, 1, |row| {
            let tile = e.add(first_tile, row)?;
            let in_batch = e.icmp(IntPredicate::ULT, tile, e.i64c(total))?;
            if input {
                let v_buf = shared;
                e.if_else(
                    in_batch,
                    || self.input_transform(&e, slot(0)?, v_buf, tile, row),
                    || self.zero_rows(&e, v_buf, row),
                )
            } else {
                let a = self.v.alpha() as i64;
                let m_buf = e.gep_f32c(shared, a * a * (self.group_tiles * self.g.c) as i64)?;
                e.if_then(in_batch, || {
                    self.output_transform(&e, &slot, n_inputs, m_buf, tile, row)
                })
            }
        })?;
        tb.build_return(None).map_err(llvm)?;
        Ok(task)
    }

    fn tile_pos<'ctx>(&self, e: &Emit<'_, 'ctx>, tile: IntValue<'ctx>) -> Result<TilePos<'ctx>> {
        let per_image = (self.tiles_h * self.tiles_w) as i64;
        let image = e.udivc(tile, per_image)?;
        let in_image = e.uremc(tile, per_image)?;
        let m = self.v.m as i64;
        Ok(TilePos {
            image,
            y0: e.mulc(e.udivc(in_image, self.tiles_w as i64)?, m)?,
            x0: e.mulc(e.uremc(in_image, self.tiles_w as i64)?, m)?,
        })
    }

    /// `<lanes x i1>` all equal to `b`.
    fn splat_bool<'ctx>(&self, e: &Emit<'_, 'ctx>, b: IntValue<'ctx>) -> Result<VectorValue<'ctx>> {
        let wide = e.b.build_int_z_extend(b, e.cx.i32_type(), "").map_err(llvm)?;
        e.b.build_int_compare(
            IntPredicate::NE,
            e.splat_i32(wide, self.lanes)?,
            e.cx.i32_type().vec_type(self.lanes).const_zero(),
            "",
        )
        .map_err(llvm)
    }

    /// The element offset of pixel (y, x) of an NHWC image `width` pixels wide, and the lane
    /// mask that reads or writes it: all lanes when both coordinates are inside (`(value,
    /// inside)` pairs), none otherwise, with the offset 0 so that the address stays in range.
    fn pixel<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        (y, y_inside): (IntValue<'ctx>, IntValue<'ctx>),
        (x, x_inside): (IntValue<'ctx>, IntValue<'ctx>),
        width: usize,
        channels: usize,
    ) -> Result<(IntValue<'ctx>, VectorValue<'ctx>)> {
        let inside = e.b.build_and(y_inside, x_inside, "").map_err(llvm)?;
        let off = e.mulc(e.add(e.mulc(y, width as i64)?, x)?, channels as i64)?;
        let off =
            e.b.build_select(inside, off, e.i64c(0), "")
                .map_err(llvm)?
                .into_int_value();
        Ok((off, self.splat_bool(e, inside)?))
    }

    /// Writes `V[ξ][row][·] = (Bᵀ d B)[ξ]` for the input tile of `tile`; pixels outside the
    /// image (the padding) read as zero.
    fn input_transform<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        x: PointerValue<'ctx>,
        v_buf: PointerValue<'ctx>,
        tile: IntValue<'ctx>,
        row: IntValue<'ctx>,
    ) -> Result<()> {
        let g = self.g;
        let a = self.v.alpha();
        let pos = self.tile_pos(e, tile)?;
        let x = e.gep_f32(x, e.mulc(pos.image, (g.h * g.w * g.c) as i64)?)?;
        // Input rows and columns of the tile, signed (they start at -pad).
        let axis =
            |o: IntValue<'ctx>, pad: usize, extent: usize| -> Result<Vec<(IntValue<'ctx>, IntValue<'ctx>)>> {
                (0..a)
                    .map(|i| {
                        let at = e.addc(o, i as i64 - pad as i64)?;
                        let inside = e.b.build_and(
                            e.icmp(IntPredicate::SGE, at, e.i64c(0))?,
                            e.icmp(IntPredicate::SLT, at, e.i64c(extent as i64))?,
                            "",
                        );
                        Ok((at, inside.map_err(llvm)?))
                    })
                    .collect()
            };
        let ys = axis(pos.y0, g.ph, g.h)?;
        let xs = axis(pos.x0, g.pw, g.w)?;
        let mut taps = Vec::with_capacity(a * a);
        for &(iy, vy) in &ys {
            for &(ix, vx) in &xs {
                let (off, mask) = self.pixel(e, (iy, vy), (ix, vx), g.w, g.c)?;
                taps.push((e.gep_f32(x, off)?, mask));
            }
        }
        let l = self.lanes as i64;
        let plane = (self.group_tiles * g.c) as i64;
        let dst = e.gep_f32(v_buf, e.mulc(row, g.c as i64)?)?;
        e.for_n(g.c as i64 / l, |cv| {
            let c0 = e.mulc(cv, l)?;
            let d: Vec<VectorValue> = taps
                .iter()
                .map(|&(p, mask)| {
                    let x = e.masked_load(e.gep_f32(p, c0)?, mask, self.lanes)?;
                    if self.round_input {
                        super::elementwise::round_bf16(e, x, self.lanes)
                    } else {
                        Ok(x)
                    }
                })
                .collect::<Result<_>>()?;
            let v = self.sandwich(e, self.v.bt, &d, a)?;
            for (xi, val) in v.iter().enumerate() {
                e.store(e.gep_f32(dst, e.addc(c0, xi as i64 * plane)?)?, *val)?;
            }
            Ok(())
        })
    }

    /// Zero rows of V past the batch's last tile (the last group's padding), so the products
    /// read defined values.
    fn zero_rows<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        v_buf: PointerValue<'ctx>,
        row: IntValue<'ctx>,
    ) -> Result<()> {
        let a = self.v.alpha() as i64;
        let c = self.g.c as i64;
        let plane = self.group_tiles as i64 * c;
        let l = self.lanes as i64;
        let dst = e.gep_f32(v_buf, e.mulc(row, c)?)?;
        for xi in 0..a * a {
            e.for_n(c / l, |cv| {
                e.store(
                    e.gep_f32(dst, e.addc(e.mulc(cv, l)?, xi * plane)?)?,
                    e.zero_vec(self.lanes),
                )
            })?;
        }
        Ok(())
    }

    /// `T = L · X · Lᵀ` for `X` (`cols`×`cols` vectors, row-major) and constant `L`
    /// (rows × cols): the input transform with `L = Bᵀ`, the output one with `L = Aᵀ`.
    fn sandwich<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        l: &[&[f64]],
        x: &[VectorValue<'ctx>],
        cols: usize,
    ) -> Result<Vec<VectorValue<'ctx>>> {
        let rows = l.len();
        // L · X: rows × cols.
        let mut left = Vec::with_capacity(rows * cols);
        for coef in l {
            for j in 0..cols {
                let terms: Vec<_> = (0..cols).map(|r| (coef[r], x[r * cols + j])).collect();
                left.push(self.combine(e, &terms)?);
            }
        }
        // (L · X) · Lᵀ: rows × rows.
        let mut out = Vec::with_capacity(rows * rows);
        for i in 0..rows {
            for coef in l {
                let terms: Vec<_> = (0..cols).map(|s| (coef[s], left[i * cols + s])).collect();
                out.push(self.combine(e, &terms)?);
            }
        }
        Ok(out)
    }

    /// `Σ c·x` over the terms with a non-zero constant `c`: adds and subtracts for ±1,
    /// multiply-adds otherwise.
    fn combine<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        terms: &[(f64, VectorValue<'ctx>)],
    ) -> Result<VectorValue<'ctx>> {
        let mut acc: Option<VectorValue<'ctx>> = None;
        for &(c, x) in terms.iter().filter(|(c, _)| *c != 0.0) {
            let b = e.b;
            acc = Some(match (acc, c) {
                (None, 1.0) => x,
                (None, _) => e.fmul(x, e.splat(e.f32c(c as f32), self.lanes)?)?,
                (Some(s), 1.0) => e.fadd(s, x)?,
                (Some(s), -1.0) => b.build_float_sub(s, x, "").map_err(llvm)?,
                (Some(s), _) => e.fma(x, e.splat(e.f32c(c as f32), self.lanes)?, s)?,
            });
        }
        Ok(acc.unwrap_or_else(|| e.zero_vec(self.lanes)))
    }

    /// Stores `act(scale·(Aᵀ M A) + bias + residual)` for the output tile of `tile`, the
    /// pixels inside the image only.
    fn output_transform<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        slot: &dyn Fn(usize) -> Result<PointerValue<'ctx>>,
        n_inputs: usize,
        m_buf: PointerValue<'ctx>,
        tile: IntValue<'ctx>,
        row: IntValue<'ctx>,
    ) -> Result<()> {
        let g = self.g;
        let (m, a) = (self.v.m, self.v.alpha());
        let pos = self.tile_pos(e, tile)?;
        let image_off = e.mulc(pos.image, (g.oh * g.ow * g.k) as i64)?;
        let y = e.gep_f32(slot(n_inputs)?, image_off)?;
        let res = match self.residual {
            Some(i) => Some(e.gep_f32(slot(i)?, image_off)?),
            None => None,
        };
        let bias = if self.bias {
            Some(slot(n_inputs + 1 + self.packed.len() - 1)?)
        } else {
            None
        };
        let mut outs = Vec::with_capacity(m * m);
        for i in 0..m {
            let oy = e.addc(pos.y0, i as i64)?;
            let vy = e.icmp(IntPredicate::ULT, oy, e.i64c(g.oh as i64))?;
            for j in 0..m {
                let ox = e.addc(pos.x0, j as i64)?;
                let vx = e.icmp(IntPredicate::ULT, ox, e.i64c(g.ow as i64))?;
                outs.push(self.pixel(e, (oy, vy), (ox, vx), g.ow, g.k)?);
            }
        }
        let l = self.lanes as i64;
        let plane = (self.group_tiles * g.k) as i64;
        let src = e.gep_f32(m_buf, e.mulc(row, g.k as i64)?)?;
        e.for_n(g.k as i64 / l, |kv| {
            let k0 = e.mulc(kv, l)?;
            let prods: Vec<VectorValue> = (0..a * a)
                .map(|xi| e.load_vec(e.gep_f32(src, e.addc(k0, xi as i64 * plane)?)?, self.lanes))
                .collect::<Result<_>>()?;
            let ys = self.sandwich(e, self.v.at, &prods, a)?;
            let bias = match bias {
                Some(b) => Some(e.load_vec(e.gep_f32(b, k0)?, self.lanes)?),
                None => None,
            };
            for (yv, &(off, mask)) in ys.into_iter().zip(&outs) {
                let at = e.add(off, k0)?;
                let mut yv = yv;
                if self.scale != 1.0 {
                    yv = e.fmul(yv, e.splat(e.f32c(self.scale), self.lanes)?)?;
                }
                if let Some(b) = bias {
                    yv = e.fadd(yv, b)?;
                }
                if let Some(r) = res {
                    yv = e.fadd(yv, e.masked_load(e.gep_f32(r, at)?, mask, self.lanes)?)?;
                }
                yv = activation(e, self.activation, yv, self.lanes)?;
                if self.round_bf16 {
                    yv = super::elementwise::round_bf16(e, yv, self.lanes)?;
                }
                e.masked_store(e.gep_f32(y, at)?, yv, mask, 4)?;
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The transforms compute a 3×3 correlation (ONNX Conv) of an α×α tile exactly, up to
    /// f64 rounding: `Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A`.
    #[test]
    fn transforms_compute_the_correlation() {
        let mut rng = crate::test_rng::TestRng::new(7);
        for v in [&F2, &F4] {
            let a = v.alpha();
            let d: Vec<f64> = rng.vec(a * a).into_iter().map(f64::from).collect();
            let f: Vec<f32> = rng.vec(9);
            let u = transform_weights(v, &f, 1, 1);
            // Bᵀ d B
            let mut t = vec![0f64; a * a];
            for i in 0..a {
                for j in 0..a {
                    t[i * a + j] = (0..a).map(|r| v.bt[i][r] * d[r * a + j]).sum();
                }
            }
            let mut vd = vec![0f64; a * a];
            for i in 0..a {
                for j in 0..a {
                    vd[i * a + j] = (0..a).map(|s| t[i * a + s] * v.bt[j][s]).sum();
                }
            }
            let prod: Vec<f64> = (0..a * a).map(|x| vd[x] * u[x] as f64).collect();
            for i in 0..v.m {
                for j in 0..v.m {
                    let got: f64 = (0..a)
                        .flat_map(|r| (0..a).map(move |s| (r, s)))
                        .map(|(r, s)| v.at[i][r] * prod[r * a + s] * v.at[j][s])
                        .sum();
                    let want: f64 = (0..3)
                        .flat_map(|r| (0..3).map(move |s| (r, s)))
                        .map(|(r, s)| d[(i + r) * a + j + s] * f[r * 3 + s] as f64)
                        .sum();
                    assert!(
                        (got - want).abs() < 1e-5,
                        "F({0}x{0}) y[{i}][{j}]: {got} vs {want}",
                        v.m
                    );
                }
            }
        }
    }
}
