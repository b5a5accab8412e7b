//! `--mode max-autotune`: each product kernel (MatMul, Gemm, a convolution run as a GEMM) is
//! timed on this machine at compile time with several cache blockings (KC, MB, NB: the
//! cost model's choice, its next-best ones, other K blocks), and the fastest is kept. The
//! choices are remembered in a cache file keyed by the CPU, kiln's version and the product's
//! shape, so compiling the same model again (or another one with the same shapes) reads them
//! instead of timing again.
//!
//! A candidate replaces the cost model's choice only when it is at least `MIN_GAIN` faster in
//! two separate timings, so tuning never trades a measured-equal kernel for a noisy one.

pub mod cache;

use crate::error::Result;
use cache::Cache;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// A candidate must be this much faster than the cost model's blocking (both timings).
const MIN_GAIN: f64 = 0.03;
/// Each candidate is called until this much time has passed (at least `MIN_CALLS` times).
pub(crate) const TIMING_SECS: f64 = 0.03;
pub(crate) const MIN_CALLS: usize = 3;

/// The cache blocking of a GEMM kernel: K block and a task's output rows and columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocking {
    pub kc: usize,
    pub mb: usize,
    pub nb: usize,
}

impl std::fmt::Display for Blocking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KC={} MB={} NB={}", self.kc, self.mb, self.nb)
    }
}

/// What tuning decided for one product shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision {
    pub blocking: Blocking,
    /// The cost model's blocking and its time, and the chosen one's (seconds per call).
    pub default: Blocking,
    pub default_secs: f64,
    pub best_secs: f64,
}

impl Decision {
    /// How `kiln explain` and the kernel list describe the choice.
    pub fn describe(&self) -> String {
        if self.blocking == self.default {
            format!(
                "tuned: the cost model's blocking is fastest ({:.0} µs)",
                self.default_secs * 1e6
            )
        } else {
            format!(
                "tuned: {:.2}x faster than the cost model's {} ({:.0} → {:.0} µs)",
                self.default_secs / self.best_secs,
                self.default,
                self.default_secs * 1e6,
                self.best_secs * 1e6
            )
        }
    }
}

/// Counts for the compile summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TuningStats {
    /// Product shapes timed in this compilation.
    pub timed: usize,
    /// Product shapes whose choice came from the cache.
    pub cached: usize,
    /// Of both, how many got a blocking other than the cost model's.
    pub changed: usize,
}

/// The tuning state of one compilation: the cache, and where to save it.
pub struct Tuner {
    /// The CPU part of every cache key.
    cpu: String,
    threads: usize,
    path: Option<PathBuf>,
    state: Mutex<State>,
}

struct State {
    cache: Cache,
    stats: TuningStats,
    /// Keys counted in `stats` (a shape met again in the same model counts once).
    counted: std::collections::HashSet<String>,
}

impl Tuner {
    /// A tuner for kernels of the machine kiln runs on, described by `cpu` (its triple, CPU
    /// name and features: `TargetDesc::tuning_key`), timed on `threads` threads, with the
    /// cache at `path` (read now if it exists; None: nothing is kept).
    pub fn new(cpu: &str, threads: usize, path: Option<PathBuf>) -> Result<Tuner> {
        let cache = match &path {
            Some(p) => Cache::load(p)?,
            None => Cache::default(),
        };
        Ok(Tuner {
            cpu: format!("kiln {} {cpu}", env!("CARGO_PKG_VERSION")),
            threads: threads.max(1),
            path,
            state: Mutex::new(State {
                cache,
                stats: TuningStats::default(),
                counted: Default::default(),
            }),
        })
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    pub fn cache_path(&self) -> Option<&std::path::Path> {
        self.path.as_deref()
    }

    pub fn stats(&self) -> TuningStats {
        self.lock().stats
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves a consistent cache: entries are inserted whole.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The blocking for the product `key` (its shape and operands): from the cache, or by
    /// timing `candidates` (the first is the cost model's choice) with `time`, which returns a
    /// candidate's seconds per call or None when it cannot run. None when the default cannot
    /// be timed.
    pub(crate) fn choose(
        &self,
        key: &str,
        candidates: &[Blocking],
        mut time: impl FnMut(Blocking) -> Option<f64>,
    ) -> Option<Decision> {
        let default = *candidates.first()?;
        let key = format!("{} | threads={} | {key}", self.cpu, self.threads);
        let cached = self.lock().cache.get(&key);
        if let Some(d) = cached {
            // A cached choice for a blocking the cost model no longer offers is stale.
            if d.default == default {
                let mut st = self.lock();
                if st.counted.insert(key) {
                    st.stats.cached += 1;
                    st.stats.changed += usize::from(d.blocking != d.default);
                }
                return Some(d);
            }
        }
        let default_secs = time(default)?;
        let mut best = (default, default_secs);
        for &c in &candidates[1..] {
            if let Some(s) = time(c) {
                if s < best.1 {
                    best = (c, s);
                }
            }
        }
        let mut decision = Decision {
            blocking: default,
            default,
            default_secs,
            best_secs: default_secs,
        };
        if best.0 != default && best.1 < default_secs * (1.0 - MIN_GAIN) {
            // Confirm with fresh timings of both: one lucky run must not win.
            if let (Some(d2), Some(b2)) = (time(default), time(best.0)) {
                if b2 < d2 * (1.0 - MIN_GAIN) {
                    decision = Decision {
                        blocking: best.0,
                        default,
                        default_secs: default_secs.min(d2),
                        best_secs: best.1.min(b2),
                    };
                }
            }
        }
        let mut st = self.lock();
        st.cache.insert(key.clone(), decision);
        if st.counted.insert(key) {
            st.stats.timed += 1;
            st.stats.changed += usize::from(decision.blocking != default);
        }
        Some(decision)
    }

    /// Writes the cache file when this compilation added to it.
    pub fn save(&self) -> Result<()> {
        let Some(path) = &self.path else { return Ok(()) };
        let st = self.lock();
        st.cache.save_if_changed(path)
    }
}

/// The tuner a target's product kernels consult (`TargetDesc::tuning`). Targets compare equal
/// when they share the same tuner.
#[derive(Clone)]
pub struct TuningHandle(pub Arc<Tuner>);

impl PartialEq for TuningHandle {
    fn eq(&self, other: &TuningHandle) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for TuningHandle {}

impl std::fmt::Debug for TuningHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tuner({:?})", self.0.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuner(path: Option<PathBuf>) -> Tuner {
        Tuner::new("x86_64-pc-linux-gnu znver5 +avx512f", 2, path).unwrap()
    }

    const A: Blocking = Blocking {
        kc: 384,
        mb: 48,
        nb: 256,
    };
    const B: Blocking = Blocking {
        kc: 256,
        mb: 96,
        nb: 128,
    };

    #[test]
    fn a_candidate_wins_only_when_clearly_faster_twice() {
        let t = tuner(None);
        // 2% faster: noise, the cost model's choice stays.
        let d = t
            .choose("p1", &[A, B], |b| Some(if b == A { 1.0 } else { 0.98 }))
            .unwrap();
        assert_eq!(d.blocking, A);
        // 20% faster in both timings: it wins.
        let d = t
            .choose("p2", &[A, B], |b| Some(if b == A { 1.0 } else { 0.8 }))
            .unwrap();
        assert_eq!(d.blocking, B);
        assert!((d.default_secs / d.best_secs - 1.25).abs() < 1e-9);
        // Faster once, not in the confirming run: it does not.
        let mut calls = 0;
        let d = t
            .choose("p3", &[A, B], |b| {
                calls += 1;
                Some(match (b == A, calls > 2) {
                    (true, _) => 1.0,
                    (false, false) => 0.5,
                    (false, true) => 1.1,
                })
            })
            .unwrap();
        assert_eq!(d.blocking, A);
        assert_eq!(
            t.stats(),
            TuningStats {
                timed: 3,
                cached: 0,
                changed: 1
            }
        );
        // A default that cannot run: no decision.
        assert!(t.choose("p4", &[A, B], |_| None).is_none());
    }

    #[test]
    fn a_second_tuner_reads_the_choices_from_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("autotune.json");
        let t = tuner(Some(path.clone()));
        let d = t
            .choose("p", &[A, B], |b| Some(if b == A { 1.0 } else { 0.5 }))
            .unwrap();
        t.save().unwrap();
        let t2 = tuner(Some(path.clone()));
        for _ in 0..3 {
            let again = t2
                .choose("p", &[A, B], |_| panic!("a cached shape is not timed"))
                .unwrap();
            assert_eq!(again, d);
        }
        // Met three times, counted once.
        assert_eq!(
            t2.stats(),
            TuningStats {
                timed: 0,
                cached: 1,
                changed: 1
            }
        );
        // The cost model now proposes another default: the entry is stale and timed again.
        let d3 = t2
            .choose("p", &[B, A], |b| Some(if b == B { 1.0 } else { 2.0 }))
            .unwrap();
        assert_eq!(d3.blocking, B);
    }
}
