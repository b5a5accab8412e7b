//! Cache blocking of the GEMM kernel: the K block (KC) and the output blocks of a task (MB×NB).

use super::Tile;

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
pub(super) fn plan_blocks(
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
