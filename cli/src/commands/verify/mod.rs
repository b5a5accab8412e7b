//! `kiln verify`: compile a model, run it, and compare every graph output and every value that
//! survives fusion with the reference interpreter; on a mismatch, find the pass or the kernel
//! that introduced it.
//!
//! Graph outputs are compared with `ir::eval` of the imported graph (what the model means).
//! Intermediates — the output of every kernel in codegen's plan — are compared with `ir::eval`
//! of the optimized graph, which has the same values under the same ids (channels-last values
//! included, in the layout the passes gave them). The compiled executable writes them because
//! they are added to the optimized graph as extra outputs; a value a kernel computes is kept in
//! memory either way, so this changes no fusion decision (checked: the plan of the graph with
//! the extra outputs must have the same kernels, else only graph outputs are compared).

mod compare;
mod random;

use crate::commands::compile::{LayoutArg, PrecisionArg};
use crate::exit::{Exit, Failure};
use crate::model_args::ModelArgs;
use crate::tensors::{read_output_files, write_input_files};
use anyhow::{bail, Context, Result};
use compare::{Metrics, Tolerance};
use kiln_driver::{Layout, Options, Plan, Session};
use kiln_ir::{Graph, NodeId, Op, Tensor, ValueId};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const SCHEMA: &str = "kiln.verify/1";

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,

    /// An input value: NAME=FILE (.npy, or .pb ONNX TensorProto); a bare FILE is enough for a
    /// single-input model. May be repeated. Inputs not given are random (see --seed).
    #[arg(long = "input", short = 'i', value_name = "NAME=FILE")]
    pub inputs: Vec<String>,

    /// Seed of the random inputs: floats uniform in [-1, 1], integers uniform in {0, 1, 2, 3},
    /// booleans true or false with equal odds.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub seed: u64,

    /// Activation layout for convolutions and their neighbours, as `kiln compile --layout`.
    #[arg(long, value_enum, value_name = "LAYOUT")]
    pub layout: Option<LayoutArg>,

    /// Compute precision, as `kiln compile --precision`; selects the default tolerances.
    #[arg(long, value_enum, default_value = "f32")]
    pub precision: PrecisionArg,

    /// Skip a graph or plan pass, as `kiln compile --disable-pass`. May be given several times.
    #[arg(long = "disable-pass", value_name = "PASS")]
    pub disable_pass: Vec<String>,

    /// Absolute error allowed per element (default: 1e-4 for f32, 0 for bf16).
    #[arg(long, value_name = "X")]
    pub atol: Option<f64>,

    /// Error allowed per element relative to the reference element (default: 1e-3 for f32, 0
    /// for bf16).
    #[arg(long, value_name = "X")]
    pub rtol: Option<f64>,

    /// Error allowed per element relative to the largest reference magnitude of the value
    /// (default: 1e-5 for f32, 0.02 for bf16).
    #[arg(long = "range-tol", value_name = "X")]
    pub range_tol: Option<f64>,

    /// Smallest cosine similarity with the reference (default: 0.9999 for f32, 0.999 for bf16).
    #[arg(long = "min-cosine", value_name = "X")]
    pub min_cosine: Option<f64>,

    /// Threads for the compiled runs (default: one per CPU).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,

    /// On a mismatch, do not recompile with each pass disabled in turn (the slow part of
    /// locating the culprit).
    #[arg(long)]
    pub no_bisect: bool,

    /// Print the result as JSON (schema kiln.verify/1, docs/report.md) instead of a table.
    #[arg(long)]
    pub json: bool,

    /// Also write the JSON result to this file.
    #[arg(long, value_name = "FILE.json")]
    pub report: Option<PathBuf>,
}

/// Where an input's values came from.
#[derive(Serialize, Clone, Debug)]
struct InputInfo {
    name: String,
    dtype: String,
    shape: Vec<usize>,
    /// The file given with --input, or null for random values.
    file: Option<String>,
}

/// A compared value.
#[derive(Serialize, Clone, Debug)]
struct Compared {
    name: String,
    dtype: String,
    shape: Vec<usize>,
    #[serde(flatten)]
    metrics: Metrics,
}

#[derive(Serialize, Clone, Debug)]
struct KernelRef {
    index: usize,
    /// The implementation: generated kernel description or kernel-library symbol.
    name: String,
    /// The kernel's nodes, anchor first.
    nodes: Vec<String>,
    ops: Vec<String>,
}

#[derive(Serialize, Clone, Debug)]
struct Intermediate {
    #[serde(flatten)]
    value: Compared,
    kernel: KernelRef,
}

#[derive(Serialize, Clone, Debug)]
struct Intermediates {
    /// Whether kernel outputs were compared.
    checked: bool,
    /// Why not, when they were not.
    reason: Option<String>,
    values: Vec<Intermediate>,
}

#[derive(Serialize, Clone, Debug)]
struct PassCheck {
    pass: &'static str,
    /// Whether the graph after this pass still computes the imported graph's outputs.
    outputs_match: bool,
}

#[derive(Serialize, Clone, Debug)]
struct Culprit {
    /// `pass` (an optimizer pass changed the results), `codegen` (a kernel computes something
    /// other than its nodes), or `unknown`.
    kind: &'static str,
    pass: Option<&'static str>,
    node: Option<String>,
    op: Option<String>,
    value: Option<String>,
    kernel: Option<KernelRef>,
    message: String,
}

#[derive(Serialize, Clone, Debug)]
struct Disabled {
    pass: &'static str,
    /// Whether the graph outputs are within tolerance with this pass disabled; null when that
    /// compilation failed.
    outputs_match: Option<bool>,
    error: Option<String>,
}

#[derive(Serialize, Clone, Debug)]
struct OptionsInfo {
    layout: String,
    precision: String,
    disabled_passes: Vec<String>,
    fusion: bool,
    seed: u64,
    threads: Option<usize>,
}

/// The artifact compiled for a batch range, run at one batch size.
#[derive(Serialize, Clone, Debug)]
struct BatchRun {
    batch: usize,
    outputs: Vec<Compared>,
}

#[derive(Serialize, Clone, Debug)]
struct VerifyReport {
    schema: &'static str,
    kiln_version: &'static str,
    model: String,
    options: OptionsInfo,
    tolerance: Tolerance,
    passed: bool,
    inputs: Vec<InputInfo>,
    outputs: Vec<Compared>,
    intermediates: Intermediates,
    passes: Option<Vec<PassCheck>>,
    culprit: Option<Culprit>,
    disabled_pass_runs: Option<Vec<Disabled>>,
    /// With a batch range: the artifact compiled for it, at its smallest, a middle and its
    /// largest batch, on random inputs, against the reference interpreter at that batch.
    batches: Option<Vec<BatchRun>>,
}

/// A kernel output the executable writes as graph output `output`.
struct Probe {
    kernel: usize,
    value: ValueId,
    output: usize,
}

pub fn run(args: Args) -> Result<()> {
    // The pipeline `kiln compile` runs for the host, to an executable.
    let mut session = Session::new(Options {
        layout: args.layout.map(Layout::from),
        precision: args.precision.into(),
        disabled_passes: args.disable_pass.clone(),
        ..Options::host_executable()
    });
    let target = session.target()?;
    let needs = session.target_needs(&target);
    let popts = session.pipeline_options(needs);
    let base_tol = {
        let d = match args.precision {
            PrecisionArg::F32 => Tolerance::F32,
            PrecisionArg::Bf16 => Tolerance::BF16,
            PrecisionArg::Tf32 => {
                bail!("verify runs the model on this CPU; --precision tf32 is a GPU precision (kiln compile --target cuda)")
            }
        };
        Tolerance {
            min_cosine: args.min_cosine.unwrap_or(d.min_cosine),
            atol: args.atol.unwrap_or(d.atol),
            rtol: args.rtol.unwrap_or(d.rtol),
            range_tol: args.range_tol.unwrap_or(d.range_tol),
        }
    };
    session.check_passes()?;
    let source = args.model.source();
    let batch_range = source.batch_range()?;
    if batch_range.is_some() && !args.inputs.is_empty() {
        bail!("with a batch range, verify draws random inputs at each batch size it checks; drop --input (or fix the batch to verify on files)");
    }
    let original = source.load()?.graph;
    let (inputs, input_info) = gather_inputs(&original, &args.inputs, args.seed)?;
    let reference = kiln_ir::eval::eval_graph(&original, inputs.clone())
        .context("the reference interpreter cannot run the model on these inputs")?;

    let passes = session.pass_manager(needs, false)?;
    let mut graph = original.clone();
    let mut snapshots: Vec<(&'static str, Graph)> = vec![];
    passes.run_observed(&mut graph, |p, g| snapshots.push((p, g.clone())))?;
    let fusion = session.options().fusion();
    let plan = session.plan(&graph)?;

    // The optimized graph with every kernel output as an extra graph output.
    let mut probed = graph.clone();
    let mut probes = vec![];
    let mut output_of: HashMap<ValueId, usize> = HashMap::new();
    for (j, o) in graph.outputs().iter().enumerate() {
        output_of.entry(o.value).or_insert(j);
    }
    let unprobed: HashSet<ValueId> = kiln_driver::padded_values(&graph).into_iter().collect();
    for (k, kern) in plan.kernels.iter().enumerate() {
        for &v in kern.outputs.iter().filter(|v| !unprobed.contains(v)) {
            let output = *output_of.entry(v).or_insert_with(|| {
                probed.add_output(format!("kiln_verify_probe_{}", probed.outputs().len()), v);
                probed.outputs().len() - 1
            });
            probes.push(Probe {
                kernel: k,
                value: v,
                output,
            });
        }
    }
    let probed_plan = session.plan(&probed)?;
    let same_plan = plan_signature(&plan) == plan_signature(&probed_plan);
    let compiled_graph = if same_plan { &probed } else { &graph };

    let dir = tempfile::tempdir().context("cannot create a temporary folder")?;
    let input_files = write_input_files(dir.path(), &graph, &inputs)?;
    let exe = dir.path().join("model");
    session
        .emit(compiled_graph, &exe)
        .with_context(|| format!("{}", args.model.model.display()))?;
    let actual = run_exe(
        &exe,
        &dir.path().join("out"),
        compiled_graph,
        &input_files,
        args.threads,
    )?;

    let outputs: Vec<Compared> = original
        .outputs()
        .iter()
        .zip(&reference)
        .zip(&actual)
        .map(|((o, want), got)| compared(&o.name, got, want, &base_tol))
        .collect();

    let intermediates = if same_plan {
        let wanted: HashSet<NodeId> = probes.iter().map(|p| p.value.node).collect();
        let mut values: HashMap<ValueId, Arc<Tensor>> = HashMap::new();
        kiln_ir::eval::eval_graph_observed(&graph, inputs.clone(), |id, outs| {
            if wanted.contains(&id) {
                for (o, t) in outs.iter().enumerate() {
                    values.insert(id.out(o as u32), t.clone());
                }
            }
        })
        .map_err(|e| anyhow::anyhow!("the reference interpreter cannot run the optimized graph: {e}"))?;
        let values = probes
            .iter()
            .map(|p| Intermediate {
                value: compared(
                    graph.value_name(p.value),
                    &actual[p.output],
                    &values[&p.value],
                    &base_tol,
                ),
                kernel: kernel_ref(&graph, &plan, p.kernel),
            })
            .collect();
        Intermediates {
            checked: true,
            reason: None,
            values,
        }
    } else {
        Intermediates {
            checked: false,
            reason: Some(
                "making the kernel outputs graph outputs changes the plan; only graph outputs are compared"
                    .to_string(),
            ),
            values: vec![],
        }
    };

    let batches = match batch_range {
        Some(range) => Some(batch_runs(
            session.options(),
            &source,
            range,
            &args,
            &base_tol,
            dir.path(),
        )?),
        None => None,
    };
    let passed = outputs.iter().all(|c| c.metrics.passed)
        && intermediates.values.iter().all(|i| i.value.metrics.passed)
        && batches
            .iter()
            .flatten()
            .flat_map(|b| &b.outputs)
            .all(|c| c.metrics.passed);
    let mut report = VerifyReport {
        schema: SCHEMA,
        kiln_version: env!("CARGO_PKG_VERSION"),
        model: args.model.model.display().to_string(),
        options: OptionsInfo {
            layout: format!("{:?}", popts.layout).to_lowercase(),
            precision: format!("{:?}", popts.precision).to_lowercase(),
            disabled_passes: args.disable_pass.clone(),
            fusion,
            seed: args.seed,
            threads: args.threads,
        },
        tolerance: base_tol,
        passed,
        inputs: input_info,
        outputs,
        intermediates,
        passes: None,
        culprit: None,
        disabled_pass_runs: None,
        batches,
    };

    if !passed {
        let (checks, culprit) = locate(
            &original,
            &snapshots,
            &inputs,
            &reference,
            &base_tol,
            &graph,
            &plan,
            &report.intermediates,
        )?;
        report.passes = Some(checks);
        report.culprit = Some(culprit);
        // Recompiling without a pass tells something only when a graph output differs: the
        // recompiled models' kernels are not the same, so only their outputs are compared.
        let an_output_differs = report.outputs.iter().any(|c| !c.metrics.passed);
        if !args.no_bisect && an_output_differs {
            // The graph passes that ran, then the plan passes that ran (kernel grouping).
            let to_try: Vec<&'static str> = passes
                .pass_names()
                .into_iter()
                .filter(|p| !passes.is_disabled(p))
                .chain(plan.passes.iter().map(|p| p.pass))
                .collect();
            let options = session.options();
            let without = |pass: &'static str| -> Result<bool> {
                let mut s = Session::new(kiln_driver::without_pass(options, pass));
                let mut g = original.clone();
                s.optimize(&mut g)?;
                let exe = dir.path().join(format!("model-without-{pass}"));
                s.emit(&g, &exe)?;
                let out_dir = dir.path().join(format!("out-without-{pass}"));
                let out = run_exe(&exe, &out_dir, &g, &input_files, args.threads)?;
                Ok(original
                    .outputs()
                    .iter()
                    .zip(&reference)
                    .zip(&out)
                    .all(|((o, want), got)| compared(&o.name, got, want, &base_tol).metrics.passed))
            };
            // The compilations are independent: run as many at once as there are CPUs.
            let width = std::thread::available_parallelism().map_or(1, |n| n.get());
            let mut runs = vec![];
            for chunk in to_try.chunks(width) {
                let outcomes: Vec<Result<bool>> = std::thread::scope(|s| {
                    let handles: Vec<_> = chunk.iter().map(|&p| s.spawn(move || without(p))).collect();
                    handles
                        .into_iter()
                        .map(|h| {
                            h.join()
                                .unwrap_or_else(|_| Err(anyhow::anyhow!("internal error (a panic)")))
                        })
                        .collect()
                });
                for (&pass, outcome) in chunk.iter().zip(outcomes) {
                    runs.push(match outcome {
                        Ok(m) => Disabled {
                            pass,
                            outputs_match: Some(m),
                            error: None,
                        },
                        Err(e) => Disabled {
                            pass,
                            outputs_match: None,
                            error: Some(crate::one_line(&e)),
                        },
                    });
                }
            }
            report.disabled_pass_runs = Some(runs);
        }
    }

    let json = serde_json::to_string_pretty(&report).expect("the report serializes") + "\n";
    if let Some(path) = &args.report {
        std::fs::write(path, &json).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if args.json {
        crate::emit(&json);
    } else {
        crate::emit(&to_text(&report));
    }
    if report.passed {
        return Ok(());
    }
    let batch_outputs: Vec<&Compared> = report.batches.iter().flatten().flat_map(|b| &b.outputs).collect();
    let failing = report.outputs.iter().filter(|c| !c.metrics.passed).count()
        + batch_outputs.iter().filter(|c| !c.metrics.passed).count()
        + report
            .intermediates
            .values
            .iter()
            .filter(|i| !i.value.metrics.passed)
            .count();
    let total = report.outputs.len() + report.intermediates.values.len() + batch_outputs.len();
    let culprit = report
        .culprit
        .as_ref()
        .map(|c| c.message.clone())
        .unwrap_or_default();
    Err(anyhow::Error::new(Failure::new(
        Exit::VerifyFailed,
        format!("{failing} of {total} compared values outside tolerance; {culprit}"),
    )))
}

/// Compiles the model for its batch range (as `kiln compile` does) and runs the artifact at the
/// range's smallest, middle and largest batch on random inputs, each compared with the
/// reference interpreter on the model imported at that batch.
fn batch_runs(
    options: &Options,
    source: &kiln_driver::ModelSource,
    range: kiln_frontend::shapes::BatchRange,
    args: &Args,
    tol: &Tolerance,
    dir: &Path,
) -> Result<Vec<BatchRun>> {
    let exe = dir.join("model-batched");
    let mut session = Session::new(Options {
        output: Some(exe.clone()),
        ..options.clone()
    });
    session
        .compile(source)
        .with_context(|| format!("batch range {range}"))?;
    let mut sizes = vec![range.lo, (range.lo + range.hi) / 2, range.hi];
    sizes.dedup();
    let mut runs = vec![];
    for n in sizes {
        let graph = source.load_at(n)?.graph;
        let (inputs, _) = gather_inputs(&graph, &[], args.seed.wrapping_add(n as u64))?;
        let reference = kiln_ir::eval::eval_graph(&graph, inputs.clone())
            .with_context(|| format!("the reference interpreter cannot run the model at batch {n}"))?;
        let at = dir.join(format!("batch-{n}"));
        std::fs::create_dir_all(&at).with_context(|| format!("cannot create {}", at.display()))?;
        let files = write_input_files(&at, &graph, &inputs)?;
        let actual = run_exe(&exe, &at.join("out"), &graph, &files, args.threads)?;
        let outputs = graph
            .outputs()
            .iter()
            .zip(&reference)
            .zip(&actual)
            .map(|((o, want), got)| compared(&o.name, got, want, tol))
            .collect();
        runs.push(BatchRun { batch: n, outputs });
    }
    Ok(runs)
}

/// The kernels of a plan as comparable data: anchor, fused nodes, outputs, implementation.
fn plan_signature(plan: &Plan) -> Vec<(NodeId, Vec<NodeId>, Vec<ValueId>, String)> {
    plan.kernels
        .iter()
        .map(|k| (k.node, k.fused.clone(), k.outputs.clone(), k.describe()))
        .collect()
}

fn kernel_ref(graph: &Graph, plan: &Plan, k: usize) -> KernelRef {
    let kern = &plan.kernels[k];
    let ids: Vec<NodeId> = std::iter::once(kern.node)
        .chain(kern.fused.iter().copied())
        .collect();
    KernelRef {
        index: k,
        name: kern.describe(),
        nodes: ids.iter().map(|&n| graph.node(n).name.clone()).collect(),
        ops: ids.iter().map(|&n| graph.node(n).op.name().to_string()).collect(),
    }
}

fn compared(name: &str, actual: &Tensor, expected: &Tensor, base: &Tolerance) -> Compared {
    let tol = compare::tolerance_for(expected.dtype(), base);
    Compared {
        name: name.to_string(),
        dtype: expected.dtype().to_string(),
        shape: expected.shape().to_vec(),
        metrics: compare::compare(actual, expected, &tol),
    }
}

/// The inputs in graph order: from --input files, the rest random.
fn gather_inputs(graph: &Graph, specs: &[String], seed: u64) -> Result<(Vec<Tensor>, Vec<InputInfo>)> {
    let names: Vec<&str> = graph.input_types().map(|(n, _)| n).collect();
    let mut given: HashMap<String, (Tensor, String)> = HashMap::new();
    for spec in specs {
        let (name, file) = match spec.split_once('=') {
            Some((n, f)) if names.contains(&n) => (n.to_string(), f.to_string()),
            _ if names.len() == 1 && Path::new(spec).exists() => (names[0].to_string(), spec.clone()),
            Some((n, _)) => bail!(
                "--input '{spec}': the model has no input '{n}' (its inputs: {})",
                names.join(", ")
            ),
            None => bail!(
                "--input '{spec}': expected NAME=FILE (the model's inputs: {})",
                names.join(", ")
            ),
        };
        if given.contains_key(&name) {
            bail!("input '{name}' is given twice");
        }
        let t =
            crate::tensors::read_tensor_file(Path::new(&file)).with_context(|| format!("input '{name}'"))?;
        given.insert(name, (t, file));
    }
    let mut rng = random::SplitMix64::new(seed);
    let mut tensors = vec![];
    let mut info = vec![];
    for (name, ty) in graph.input_types() {
        let (t, file) = match given.remove(name) {
            Some((t, f)) => (t, Some(f)),
            None => {
                let t = random::tensor(ty, &mut rng).with_context(|| {
                    format!("input '{name}' has type {ty}: random values need a static shape; fix it with --input-shape {name}=D0,D1,... or give --input {name}=FILE")
                })?;
                (t, None)
            }
        };
        info.push(InputInfo {
            name: name.to_string(),
            dtype: t.dtype().to_string(),
            shape: t.shape().to_vec(),
            file,
        });
        tensors.push(t);
    }
    kiln_ir::eval::check_inputs(graph, &tensors).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok((tensors, info))
}

/// Runs a compiled executable and reads its outputs, in graph order.
fn run_exe(
    exe: &Path,
    out_dir: &Path,
    graph: &Graph,
    inputs: &[(String, PathBuf)],
    threads: Option<usize>,
) -> Result<Vec<Tensor>> {
    let mut cmd = std::process::Command::new(exe);
    for (name, path) in inputs {
        cmd.arg("--input").arg(format!("{name}={}", path.display()));
    }
    cmd.arg("--output-dir").arg(out_dir).arg("--quiet");
    if let Some(t) = threads {
        cmd.arg("--threads").arg(t.to_string());
    }
    let out = cmd.output().context("cannot run the compiled model")?;
    if !out.status.success() {
        return Err(anyhow::Error::new(Failure::new(
            Exit::VerifyFailed,
            format!(
                "the compiled model failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        )));
    }
    read_output_files(out_dir, graph)
}

/// Whether `graph`'s outputs on `inputs` match the imported graph's reference outputs.
fn outputs_match(graph: &Graph, inputs: &[Tensor], reference: &[Tensor], tol: &Tolerance) -> Result<bool> {
    let out = kiln_ir::eval::eval_graph(graph, inputs.to_vec())
        .map_err(|e| anyhow::anyhow!("the reference interpreter cannot run the optimized graph: {e}"))?;
    Ok(out
        .iter()
        .zip(reference)
        .all(|(got, want)| compared("", got, want, tol).metrics.passed))
}

/// Finds who changed the results: the first pass after which the graph's outputs differ from
/// the imported graph's (and, in that pass's output, the first node whose value differs from
/// the value of the same name before the pass), else the first kernel whose output differs
/// from the optimized graph's.
#[allow(clippy::too_many_arguments)]
fn locate(
    original: &Graph,
    snapshots: &[(&'static str, Graph)],
    inputs: &[Tensor],
    reference: &[Tensor],
    tol: &Tolerance,
    optimized: &Graph,
    plan: &Plan,
    intermediates: &Intermediates,
) -> Result<(Vec<PassCheck>, Culprit)> {
    let mut checks = vec![];
    let mut culprit_pass = None;
    for (i, (pass, g)) in snapshots.iter().enumerate() {
        let ok = outputs_match(g, inputs, reference, tol)?;
        checks.push(PassCheck {
            pass,
            outputs_match: ok,
        });
        if !ok && culprit_pass.is_none() {
            culprit_pass = Some(i);
        }
    }
    if let Some(i) = culprit_pass {
        let pass = snapshots[i].0;
        let before = if i == 0 { original } else { &snapshots[i - 1].1 };
        let after = &snapshots[i].1;
        let node = first_divergence(before, after, inputs, tol)?;
        let culprit = match node {
            Some((node, op, value)) => {
                // The kernel that runs the node in the compiled model, found by name (the
                // node may have been rewritten again by later passes, or fused away).
                let kernel = plan.kernels.iter().enumerate().find_map(|(k, kern)| {
                    let mut ids = std::iter::once(kern.node).chain(kern.fused.iter().copied());
                    ids.any(|n| optimized.node(n).name == node)
                        .then(|| kernel_ref(optimized, plan, k))
                });
                let at = match &kernel {
                    Some(k) => format!(", kernel {} '{}'", k.index, k.name),
                    None => String::new(),
                };
                Culprit {
                    kind: "pass",
                    pass: Some(pass),
                    message: format!("first divergence: node '{node}' ({op}){at}, introduced by pass '{pass}'"),
                    node: Some(node),
                    op: Some(op),
                    value: Some(value),
                    kernel,
                }
            }
            None => Culprit {
                kind: "pass",
                pass: Some(pass),
                node: None,
                op: None,
                value: None,
                kernel: None,
                message: format!(
                    "first divergence: introduced by pass '{pass}' (the graph's outputs differ after it; no value it kept the name of differs)"
                ),
            },
        };
        return Ok((checks, culprit));
    }
    if let Some(bad) = intermediates.values.iter().find(|i| !i.value.metrics.passed) {
        let k = &bad.kernel;
        let node = k.nodes.first().cloned().unwrap_or_default();
        let op = k.ops.first().cloned().unwrap_or_default();
        let fused = if k.nodes.len() > 1 {
            format!(" with {} fused", k.nodes[1..].join(", "))
        } else {
            String::new()
        };
        return Ok((
            checks,
            Culprit {
                kind: "codegen",
                pass: None,
                message: format!(
                    "first divergence: node '{node}' ({op}){fused}, kernel {} '{}', in the generated code (every pass keeps the results)",
                    k.index, k.name
                ),
                node: Some(node),
                op: Some(op),
                value: Some(bad.value.name.clone()),
                kernel: Some(k.clone()),
            },
        ));
    }
    Ok((
        checks,
        Culprit {
            kind: "unknown",
            pass: None,
            node: None,
            op: None,
            value: None,
            kernel: None,
            message: "no single pass or kernel changes the results beyond tolerance (the error accumulates over several kernels)".to_string(),
        },
    ))
}

/// The first node of `after` (in graph order, constants aside) whose output differs from the
/// value of the same name in `before`: (node, op, value name).
fn first_divergence(
    before: &Graph,
    after: &Graph,
    inputs: &[Tensor],
    tol: &Tolerance,
) -> Result<Option<(String, String, String)>> {
    let names: HashSet<&str> = after
        .nodes()
        .iter()
        .filter(|n| !matches!(n.op, Op::Input | Op::Constant(_)))
        .flat_map(|n| n.outputs.iter().map(|o| o.name.as_str()))
        .collect();
    let mut old: HashMap<String, Arc<Tensor>> = HashMap::new();
    kiln_ir::eval::eval_graph_observed(before, inputs.to_vec(), |id, outs| {
        for (o, t) in before.node(id).outputs.iter().zip(outs) {
            if names.contains(o.name.as_str()) {
                old.insert(o.name.clone(), t.clone());
            }
        }
    })
    .map_err(|e| anyhow::anyhow!("the reference interpreter: {e}"))?;
    let mut found = None;
    kiln_ir::eval::eval_graph_observed(after, inputs.to_vec(), |id, outs| {
        let node = after.node(id);
        if found.is_some() || matches!(node.op, Op::Input | Op::Constant(_)) {
            return;
        }
        for (o, t) in node.outputs.iter().zip(outs) {
            let Some(want) = old.get(&o.name) else { continue };
            if !agrees(t, want, tol) {
                found = Some((node.name.clone(), node.op.name().to_string(), o.name.clone()));
                return;
            }
        }
    })
    .map_err(|e| anyhow::anyhow!("the reference interpreter: {e}"))?;
    Ok(found)
}

/// Whether a value after a pass agrees with the value of the same name before it: equal, or
/// equal once the earlier value is put in channels-last order (channels-last keeps names).
fn agrees(after: &Tensor, before: &Tensor, tol: &Tolerance) -> bool {
    let t = compare::tolerance_for(before.dtype(), tol);
    let exact = !before.dtype().is_float();
    if after.shape() == before.shape()
        && compare::compare_values(&after.to_f64_vec(), &before.to_f64_vec(), exact, &t).passed
    {
        return true;
    }
    match compare::nchw_to_nhwc(before) {
        Some((shape, vals)) if shape == after.shape() => {
            compare::compare_values(&after.to_f64_vec(), &vals, exact, &t).passed
        }
        // A value whose shape changed for another reason cannot be compared by name.
        _ => after.shape() != before.shape(),
    }
}

fn fmt_metrics(m: &Metrics) -> String {
    if let Some(p) = &m.problem {
        return p.clone();
    }
    format!(
        "cosine {:.6}  max abs {:.2e}  max rel {:.2e}{}",
        m.cosine,
        m.max_abs_err,
        m.max_rel_err,
        if m.mismatches > 0 {
            format!("  {} elements outside tolerance", m.mismatches)
        } else {
            String::new()
        }
    )
}

fn status(passed: bool) -> &'static str {
    if passed {
        "ok  "
    } else {
        "FAIL"
    }
}

/// "  ok   LABELy f32[1, 10]  cosine ..." for one compared value.
fn compared_line(label: &str, c: &Compared) -> String {
    format!(
        "  {} {label}{} {}{:?}  {}\n",
        status(c.metrics.passed),
        c.name,
        c.dtype,
        c.shape,
        fmt_metrics(&c.metrics)
    )
}

fn to_text(r: &VerifyReport) -> String {
    let mut s = String::new();
    let random = r.inputs.iter().filter(|i| i.file.is_none()).count();
    let inputs = match random {
        0 => "inputs from files".to_string(),
        n if n == r.inputs.len() => format!("random inputs, seed {}", r.options.seed),
        n => format!("{n} random inputs, seed {}", r.options.seed),
    };
    s += &format!(
        "verify {}: {}, {}, {inputs}\n",
        r.model, r.options.precision, r.options.layout
    );
    let t = &r.tolerance;
    s += &format!(
        "tolerance: cosine >= {}, |error| <= {} + {}*|ref| + {}*max|ref| per element\n",
        t.min_cosine, t.atol, t.rtol, t.range_tol
    );
    s += "outputs (compiled vs the reference interpreter on the imported graph):\n";
    for c in &r.outputs {
        s += &compared_line("", c);
    }
    let im = &r.intermediates;
    if im.checked {
        let bad: Vec<&Intermediate> = im.values.iter().filter(|i| !i.value.metrics.passed).collect();
        s += &format!(
            "intermediates (kernel outputs vs the reference interpreter on the optimized graph): {} of {} within tolerance\n",
            im.values.len() - bad.len(),
            im.values.len()
        );
        for i in bad.iter().take(10) {
            s += &format!(
                "  FAIL kernel {} '{}' ({}): {}  {}\n",
                i.kernel.index,
                i.kernel.name,
                i.kernel.nodes.join(", "),
                i.value.name,
                fmt_metrics(&i.value.metrics)
            );
        }
        if bad.len() > 10 {
            s += &format!("  ... and {} more\n", bad.len() - 10);
        }
    } else if let Some(reason) = &im.reason {
        s += &format!("intermediates: not compared ({reason})\n");
    }
    if let Some(runs) = &r.batches {
        s += "batch range (the artifact compiled for it vs the reference interpreter at each batch):\n";
        for b in runs {
            for c in &b.outputs {
                s += &compared_line(&format!("batch {}: ", b.batch), c);
            }
        }
    }
    if let Some(checks) = &r.passes {
        let list: Vec<String> = checks
            .iter()
            .map(|c| format!("{} {}", c.pass, if c.outputs_match { "ok" } else { "differs" }))
            .collect();
        s += &format!(
            "graph after each pass (reference interpreter): {}\n",
            list.join(", ")
        );
    }
    if let Some(c) = &r.culprit {
        s += &format!("{}\n", c.message);
    }
    if let Some(runs) = &r.disabled_pass_runs {
        let list: Vec<String> = runs
            .iter()
            .map(|d| match (d.outputs_match, &d.error) {
                (Some(true), _) => format!("without {}: matches", d.pass),
                (Some(false), _) => format!("without {}: still differs", d.pass),
                (None, e) => format!("without {}: failed ({})", d.pass, e.as_deref().unwrap_or("")),
            })
            .collect();
        s += &format!("recompiled with each pass disabled: {}\n", list.join("; "));
    }
    s += if r.passed { "PASSED\n" } else { "FAILED\n" };
    s
}
