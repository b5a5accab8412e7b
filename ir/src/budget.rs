//! The reference interpreter's memory budget.
//!
//! `ir::eval` runs untrusted models: a 115-byte model can ask for a 2^33-element tensor, a Loop
//! for 10^12 iterations of scan output. Allocating first would abort the process (Rust aborts
//! on allocation failure) or run for hours; so every allocation the interpreter can size in
//! advance is checked against a budget first, and a run that would exceed it fails with an
//! [`OpError::over_budget`] naming the node. The budget is process-wide: the CLI sets it once
//! from `--max-memory`; by default it is three quarters of the machine's physical memory.

use crate::OpError;
use std::sync::atomic::{AtomicU64, Ordering};

/// 0: not set, use [`default_budget`].
static BUDGET: AtomicU64 = AtomicU64::new(0);

/// Sets the budget in bytes for every later evaluation in this process (0 restores the default).
pub fn set_memory_budget(bytes: u64) {
    BUDGET.store(bytes, Ordering::Relaxed);
}

/// The budget in bytes now in force.
pub fn memory_budget() -> u64 {
    match BUDGET.load(Ordering::Relaxed) {
        0 => default_budget(),
        b => b,
    }
}

/// Three quarters of physical memory: room for kiln itself and the rest of the machine. 8 GiB
/// where the memory size cannot be read. Read once: every evaluated node asks.
pub fn default_budget() -> u64 {
    static DEFAULT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *DEFAULT.get_or_init(|| physical_memory().map_or(8 << 30, |m| m / 4 * 3))
}

fn physical_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Fails when `bytes` more (with `held` already live) would exceed the budget; `what` says
/// what the bytes are for.
pub fn check(bytes: u128, held: u128, what: &str) -> Result<(), OpError> {
    let budget = memory_budget();
    if bytes.saturating_add(held) > budget as u128 {
        return Err(OpError::over_budget(format!(
            "{what} needs {}{}, over the reference interpreter's memory budget of {} (raise it with --max-memory)",
            human(bytes),
            if held > 0 { format!(" with {} already held", human(held)) } else { String::new() },
            human(budget as u128)
        )));
    }
    Ok(())
}

/// A byte count as people read it: `32.0 GiB`, `512 B`.
pub fn human(bytes: u128) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_sizes() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(32 << 30), "32.0 GiB");
        assert_eq!(human(1536), "1.5 KiB");
    }

    #[test]
    fn the_default_is_a_fraction_of_physical_memory() {
        let b = default_budget();
        assert!(b >= 1 << 20, "{b}");
        if let Some(m) = physical_memory() {
            assert!(b < m, "{b} of {m}");
        }
    }

    #[test]
    fn over_budget_errors_say_so() {
        let e = check(u128::MAX, 0, "output f32[2^40]").unwrap_err();
        assert!(e.over_budget);
        assert!(e.msg.contains("--max-memory"), "{}", e.msg);
        assert!(check(16, 0, "a small tensor").is_ok());
    }
}
