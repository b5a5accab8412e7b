//! `--mode max-autotune` for the GEMM kernel: time the candidate blockings of a lowered
//! kernel on this machine (`tune::jit`) and adopt the fastest (`tune::Tuner` decides and
//! caches).

use super::blocking::candidates;
use super::{GemmKernel, Operand};
use crate::gen::jit;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::target::TargetDesc;
use crate::tune::{Blocking, Decision, Tuner, MIN_CALLS, TIMING_SECS};

/// Written between timed calls to evict the weights from the caches (twice a 32 MiB L3): in
/// a transformer or a large CNN every product's weights come from memory, and a kernel timed
/// with its weights in L2 would favour blockings that only pay with hot weights.
const FLUSH_BYTES: usize = 64 << 20;

impl GemmKernel {
    fn set_blocking(&mut self, b: Blocking) {
        (self.kc, self.mb, self.nb) = (b.kc, b.mb, b.nb);
    }

    /// Times this kernel's candidate blockings (the cost model's one first, which it has on
    /// entry) and keeps the one `tuner` chooses. Runs before the packed B is re-laid out K-block
    /// major: a candidate reads it in another order than the one it would be stored in, which
    /// changes its values but not its speed. None (the cost model's blocking kept) for kernels
    /// it does not time: integer products, a per-image scaled A, a second output.
    pub(super) fn tune(
        &mut self,
        tuner: &Tuner,
        node: &NodeInfo,
        target: &TargetDesc,
        batch_total: usize,
        runtime_b: bool,
    ) -> Option<Decision> {
        if self.int8.is_some() || self.a_scale.is_some() || node.n_outputs() != 1 {
            return None;
        }
        // Inputs of the right sizes; their values do not change the kernel's speed.
        let mut inputs = vec![];
        for i in 0..node.n_inputs() {
            if !self.reads_input(i) || !node.has_input(i) {
                inputs.push(None);
                continue;
            }
            let numel: usize = node.input_shape(i).ok()?.iter().product();
            inputs.push(Some(vec![0.5f32; numel]));
        }
        let out_len: usize = node.output_shape(0).ok()?.iter().product();
        let operand = |o: &Operand| match o {
            Operand::Packed { .. } => "packed".to_string(),
            other => format!("{other:?}"),
        };
        let key = format!(
            "gemm {:?} {}x{} M={} N={} K={} batch={batch_total} bf16_pairs={} A={} B={}",
            self.isa,
            self.tile.mr,
            self.tile.nr(),
            self.m,
            self.n,
            self.k,
            self.bf16_pairs,
            operand(&self.a),
            operand(&self.b),
        );
        let cands = candidates(&self.tile, self.m, self.n, self.k, batch_total, runtime_b);
        let threads = tuner.threads();
        // Allocated only when something is timed (not for a cached shape).
        let mut flush = vec![];
        let decision = tuner.choose(&key, &cands, |b| {
            self.set_blocking(b);
            if flush.is_empty() {
                flush = vec![0u8; FLUSH_BYTES];
            }
            jit::run(
                self,
                node,
                target,
                &inputs,
                out_len,
                threads,
                MIN_CALLS,
                TIMING_SECS,
                Some(&mut flush),
            )
            .ok()
            .map(|r| r.best_secs)
        });
        self.set_blocking(decision.map_or(cands[0], |d| d.blocking));
        decision
    }
}
