//! The planner's passes: named rewrites of the kernel list, switched off and printed by name like
//! the optimizer's graph passes (`--disable-pass`, `--print-after`).
//!
//! - `fuse-kernels` groups nodes into one kernel each: a Conv/MatMul/Gemm with its epilogue
//!   (bias, residual, activation, pooling; `fuse::find_chains`) and chains of elementwise
//!   nodes (`fuse::find_elementwise_groups_on`). It decides the groups before the schedule
//!   (which then emits one kernel per group), so its result — and its check and print — is the
//!   kernel list the schedule builds.
//! - `absorb-bf16-rounding` points the kernels that round an input to bf16 themselves at the
//!   source of the autocast's `Cast<f32>(Cast<bf16>(x))` pair and drops the casts
//!   (`bf16_rounding`). It runs only for targets whose products round their operands
//!   ([`TargetNeeds::products_round_operands`]).
//! - `store-bf16` stores as bf16 every kernel output whose readers all round it to bf16 as
//!   they read it and can read bf16 (a depthwise convolution or a product feeding a
//!   pointwise bf16 product): the producer rounds once, the bytes between them halve, and a product reads
//!   its bf16 rows in place (`bf16_rounding::store_bf16`). Same targets as the pass above.
//!
//! After each pass the kernel list is checked ([`verify`]): every value is produced by one
//! kernel, and every kernel reads only values an earlier kernel produced, graph inputs and
//! constants (through views).

use super::kernel::Kernel;
use crate::error::{CodegenError, Result};
use crate::target::TargetNeeds;
use kiln_ir::{Graph, Op, ValueId};
use std::collections::HashMap;
use std::fmt;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// Kernel grouping: epilogue chains and elementwise groups.
pub const FUSE_KERNELS: &str = "fuse-kernels";
/// The autocast's rounding pairs absorbed by the kernels that read them.
pub const ABSORB_BF16_ROUNDING: &str = "absorb-bf16-rounding";
/// f32 values that only bf16 readers read, stored as bf16.
pub const STORE_BF16: &str = "store-bf16";
/// Every plan pass, in the order the planner runs them.
pub const PLAN_PASS_NAMES: &[&str] = &[FUSE_KERNELS, ABSORB_BF16_ROUNDING, STORE_BF16];
/// `--print-after` name of every pass.
const ALL: &str = "all";

/// Print the kernel list after a plan pass (or every one: `all`), to stderr or appended to a
/// file (which the caller starts empty).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanPrint {
    pub pass: String,
    pub file: Option<PathBuf>,
}

/// How the planner runs: what the target's kernels need, which plan passes are off and which
/// are printed.
#[derive(Clone, Debug, Default)]
pub struct PlanOptions {
    pub needs: TargetNeeds,
    /// Plan passes to skip, by name (other names are ignored: the graph passes').
    pub disabled: Vec<String>,
    pub print_after: Vec<PlanPrint>,
}

impl PlanOptions {
    /// The options for `target`'s own needs, with kernel grouping on or off.
    pub fn for_target(target: &crate::TargetDesc, fusion: bool) -> PlanOptions {
        PlanOptions {
            needs: target.needs(),
            disabled: if fusion {
                vec![]
            } else {
                vec![FUSE_KERNELS.to_string()]
            },
            print_after: vec![],
        }
    }

    pub fn is_disabled(&self, pass: &str) -> bool {
        self.disabled.iter().any(|d| d == pass)
    }
}

/// What one plan pass did. The counts are kernels (the graph passes count nodes).
#[derive(Clone, Debug)]
pub struct PlanPassStats {
    pub pass: &'static str,
    pub kernels_before: usize,
    pub kernels_after: usize,
    pub rewrites: usize,
    pub summary: String,
    pub time: Duration,
}

impl fmt::Display for PlanPassStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} → {} kernels, {} rewrites ({}), {:.1} ms",
            self.pass,
            self.kernels_before,
            self.kernels_after,
            self.rewrites,
            self.summary,
            self.time.as_secs_f64() * 1e3
        )
    }
}

/// The value whose bytes `v` shares: itself, or the value behind a chain of views, stopping at
/// a value known at compile time (stored in the weights).
fn stored_root(graph: &Graph, mut v: ValueId) -> ValueId {
    while graph.known_value(v).is_none() {
        let node = graph.node(v.node);
        match node.inputs.first().copied().flatten() {
            Some(src) if node.op.is_view() => v = src,
            _ => break,
        }
    }
    v
}

/// Checks the kernel list after `pass`: each value is produced by one kernel, and each kernel
/// reads values produced by earlier kernels, graph inputs or constants. A failure is a bug of
/// the pass.
pub fn verify(graph: &Graph, kernels: &[Kernel], pass: &str) -> Result<()> {
    let mut producer: HashMap<ValueId, usize> = HashMap::new();
    for (k, kern) in kernels.iter().enumerate() {
        for &v in &kern.outputs {
            if let Some(j) = producer.insert(v, k) {
                return Err(CodegenError::internal(format!(
                    "plan pass '{pass}': value '{}' is produced by kernels {j} ('{}') and {k} ('{}')",
                    graph.value_name(v),
                    kernels[j].node_name,
                    kern.node_name
                )));
            }
        }
    }
    for (k, kern) in kernels.iter().enumerate() {
        for &v in kern.inputs.iter().flatten() {
            let root = stored_root(graph, v);
            let ok = match producer.get(&root) {
                Some(&j) => j < k,
                None => graph.known_value(root).is_some() || matches!(graph.node(root.node).op, Op::Input),
            };
            if !ok {
                return Err(CodegenError::internal(format!(
                    "plan pass '{pass}': kernel {k} ('{}') reads '{}', which no earlier kernel produces",
                    kern.node_name,
                    graph.value_name(v)
                )));
            }
        }
    }
    Ok(())
}

/// One line per kernel, as `kiln compile --list-kernels` shows them.
pub fn kernel_lines(graph: &Graph, kernels: &[Kernel]) -> Vec<String> {
    kernels.iter().map(|k| k.line(graph)).collect()
}

/// Prints the kernel list after `stats.pass` where `opts` asks for it. Printing is a debugging
/// aid: a write failure is reported, not fatal.
pub fn print(opts: &PlanOptions, graph: &Graph, kernels: &[Kernel], stats: &PlanPassStats) {
    let mut text: Option<String> = None;
    for spec in &opts.print_after {
        if spec.pass != ALL && spec.pass != stats.pass {
            continue;
        }
        let text = text.get_or_insert_with(|| {
            let mut t = format!("# after {stats}\n");
            for (i, line) in kernel_lines(graph, kernels).iter().enumerate() {
                t.push_str(&format!("{i:>4}  {line}\n"));
            }
            t
        });
        let res = match &spec.file {
            None => std::io::stderr().write_all(text.as_bytes()),
            Some(path) => std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(path)
                .and_then(|mut f| f.write_all(text.as_bytes())),
        };
        if let Err(e) = res {
            eprintln!("warning: --print-after {}: {e}", spec.pass);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TargetDesc;
    use kiln_ir::{DType, TensorType, Unary};

    /// `exp(relu(x))`: two elementwise kernels, or one group.
    fn chain() -> Graph {
        let mut g = Graph::new("g");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[64]));
        let r = g.add("relu", Op::Unary(Unary::Relu), vec![Some(x)], "r").unwrap();
        let e = g.add("exp", Op::Unary(Unary::Exp), vec![Some(r)], "e").unwrap();
        g.add_output("e", e);
        g
    }

    #[test]
    fn grouping_is_a_pass_and_the_kernel_list_is_checked() {
        let g = chain();
        let target = TargetDesc::host().unwrap();
        let grouped = super::super::build(&g, &target, true).unwrap();
        assert_eq!(grouped.kernels.len(), 1);
        let st = &grouped.passes[0];
        assert_eq!(
            (st.pass, st.kernels_before, st.kernels_after),
            (FUSE_KERNELS, 2, 1)
        );
        let mut plan = super::super::build(&g, &target, false).unwrap();
        assert_eq!(plan.kernels.len(), 2);
        assert!(
            plan.passes.iter().all(|p| p.pass != FUSE_KERNELS),
            "a disabled pass has no stats"
        );
        assert!(verify(&g, &plan.kernels, "test").is_ok());
        // Out of dependency order: a kernel reads what a later one produces.
        plan.kernels.swap(0, 1);
        let err = verify(&g, &plan.kernels, "test").unwrap_err().to_string();
        assert!(err.contains("kernel 0 ('exp') reads 'r'"), "{err}");
    }
}
