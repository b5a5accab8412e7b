//! Cache blocking of the GEMM kernel: the K block (KC) and the output blocks of a task (MB×NB).

use super::Tile;
use crate::tune::Blocking;

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
    let kc = even_k_block(k, if tile.lanes >= 16 { 384 } else { 256 });
    let mut best = (f64::INFINITY, tile.mr, tile.nr());
    for (cost, mb, nb) in output_block_costs(tile, m, n, k, kc, batch, pack_b) {
        // Ties go to bigger blocks (fewer tasks, less packing).
        if cost < best.0 * 0.999 {
            best = (cost, mb, nb);
        }
    }
    (kc, best.1, best.2)
}

/// K split evenly into blocks of at most about `target`.
fn even_k_block(k: usize, target: usize) -> usize {
    k.div_ceil(k.div_ceil(target).max(1))
}

/// The modelled cost of every output blocking (MB, NB) for K blocks of `kc`, MB and NB
/// ascending.
fn output_block_costs(
    tile: &Tile,
    m: usize,
    n: usize,
    k: usize,
    kc: usize,
    batch: usize,
    pack_b: bool,
) -> Vec<(f64, usize, usize)> {
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
    let mut costs = vec![];
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
            costs.push(((tasks / threads).ceil() * per_task, mb, nb));
            nb += nr;
        }
        mb += mr;
    }
    costs
}

/// The blockings `--mode max-autotune` times, the cost model's choice first: its next-best
/// output blockings, and the best output blocking for other K blocks (about 192, 256, 512 and
/// 768 deep, and all of K when K ≤ 1024). At most `MAX_CANDIDATES`.
pub(super) fn candidates(
    tile: &Tile,
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    pack_b: bool,
) -> Vec<Blocking> {
    const MAX_CANDIDATES: usize = 8;
    let (kc0, mb0, nb0) = plan_blocks(tile, m, n, k, batch, pack_b);
    let mut out = vec![Blocking {
        kc: kc0,
        mb: mb0,
        nb: nb0,
    }];
    let ranked = |kc: usize| {
        let mut c = output_block_costs(tile, m, n, k, kc, batch, pack_b);
        c.sort_by(|a, b| a.0.total_cmp(&b.0));
        c.into_iter().map(move |(_, mb, nb)| Blocking { kc, mb, nb })
    };
    for b in ranked(kc0).take(4) {
        if !out.contains(&b) {
            out.push(b);
        }
    }
    let mut depths: Vec<usize> = [192, 256, 512, 768].iter().map(|&t| even_k_block(k, t)).collect();
    if k <= 1024 {
        depths.push(k);
    }
    for kc in depths {
        if let Some(b) = ranked(kc).next() {
            if !out.contains(&b) {
                out.push(b);
            }
        }
    }
    out.truncate(MAX_CANDIDATES);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cost_models_choice_is_the_first_candidate_and_all_differ() {
        let tile = Tile {
            lanes: 16,
            nv: 2,
            mr: 12,
        };
        for (m, n, k) in [
            (128, 768, 768),
            (128, 3072, 768),
            (49, 512, 4608),
            (1, 1000, 2048),
            (3136, 64, 576),
        ] {
            let c = candidates(&tile, m, n, k, 1, false);
            let (kc, mb, nb) = plan_blocks(&tile, m, n, k, 1, false);
            assert_eq!(c[0], Blocking { kc, mb, nb });
            assert!(c.len() > 1 && c.len() <= 8, "{m}x{n}x{k}: {c:?}");
            for (i, a) in c.iter().enumerate() {
                assert!(c[i + 1..].iter().all(|b| b != a), "{c:?}");
                assert!(a.kc <= k && a.mb % tile.mr == 0 && a.nb % tile.nr() == 0, "{a:?}");
            }
        }
    }
}
