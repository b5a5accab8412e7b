//! `kiln inspect`: what a model is made of.

use crate::model_args::ModelArgs;
use anyhow::{Context, Result};
use kiln_frontend::onnx::proto::GraphProto;
use kiln_frontend::FrontendError;
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,

    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,

    /// Also write the JSON report to a file (schema kiln.inspect/1, docs/report.md).
    #[arg(long, value_name = "FILE.json")]
    pub report: Option<std::path::PathBuf>,
}

#[derive(Serialize)]
struct Value {
    name: String,
    dtype: String,
    shape: Vec<String>,
}

#[derive(Serialize)]
struct Report {
    schema: &'static str,
    kiln_version: &'static str,
    model: String,
    producer: String,
    ir_version: i64,
    opset_imports: Vec<(String, i64)>,
    inputs: Vec<Value>,
    outputs: Vec<Value>,
    nodes: usize,
    op_histogram: BTreeMap<String, usize>,
    parameters: u64,
    parameter_bytes: u64,
    /// Estimated floating-point operations of one run; absent when the model does not import.
    flops: Option<u64>,
    unsupported: Vec<String>,
    /// Why the model does not import (unsupported ops, or the first error).
    import_error: Option<String>,
}

/// Counts nodes per operator, including subgraphs.
fn histogram(g: &GraphProto, h: &mut BTreeMap<String, usize>) -> usize {
    let mut n = 0;
    for node in &g.node {
        let key = if node.domain.is_empty() || node.domain == "ai.onnx" {
            node.op_type.clone()
        } else {
            format!("{}::{}", node.domain, node.op_type)
        };
        *h.entry(key).or_default() += 1;
        n += 1;
        for a in &node.attribute {
            for sub in a.g.iter().chain(a.graphs.iter()) {
                n += histogram(sub, h);
            }
        }
    }
    n
}

fn value(name: &str, ty: &kiln_ir::TensorType) -> Value {
    Value {
        name: name.to_string(),
        dtype: ty.dtype.to_string(),
        shape: ty.shape.iter().map(|d| d.to_string()).collect(),
    }
}

pub fn run(args: Args) -> Result<()> {
    let path = &args.model.model;
    let proto = kiln_frontend::onnx::read_model_proto(path)?;
    kiln_frontend::onnx::default_opset(&proto)?;
    let g = proto.graph.as_ref().context("the model has no graph")?;
    let mut op_histogram = BTreeMap::new();
    let nodes = histogram(g, &mut op_histogram);
    let mut report = Report {
        schema: "kiln.inspect/1",
        kiln_version: env!("CARGO_PKG_VERSION"),
        model: path.display().to_string(),
        producer: format!("{} {}", proto.producer_name, proto.producer_version)
            .trim()
            .to_string(),
        ir_version: proto.ir_version,
        opset_imports: proto
            .opset_import
            .iter()
            .map(|o| (display_domain(&o.domain), o.version))
            .collect(),
        inputs: vec![],
        outputs: vec![],
        nodes,
        op_histogram,
        parameters: 0,
        parameter_bytes: 0,
        flops: None,
        unsupported: vec![],
        import_error: None,
    };
    let opts = args.model.import_options()?;
    let base = kiln_frontend::files::model_folder(path);
    match kiln_frontend::onnx::import_model(&proto, base, &opts) {
        Ok(model) => {
            let graph = &model.graph;
            report.inputs = graph.input_types().map(|(n, t)| value(n, t)).collect();
            report.outputs = graph
                .outputs()
                .iter()
                .map(|o| value(&o.name, graph.value_type(o.value)))
                .collect();
            for node in graph.nodes() {
                if let kiln_ir::Op::Constant(c) = node.op {
                    let t = graph.constant(c);
                    if t.dtype().is_float() {
                        report.parameters += t.len() as u64;
                    }
                    report.parameter_bytes += t.size_bytes() as u64;
                }
            }
            report.flops = Some(kiln_ir::cost::graph_flops(graph));
        }
        Err(e) => {
            if let FrontendError::Unsupported(ops) = &e {
                report.unsupported = ops.iter().map(|o| o.to_string()).collect();
            }
            // Still describe what the file declares.
            for vi in &g.input {
                if g.initializer.iter().any(|t| t.name == vi.name) {
                    continue;
                }
                if let Ok(Some(t)) =
                    kiln_frontend::onnx::tensor::tensor_type_from_proto(&vi.name, vi.r#type.as_ref())
                {
                    report.inputs.push(value(&vi.name, &t));
                }
            }
            for vi in &g.output {
                if let Ok(Some(t)) =
                    kiln_frontend::onnx::tensor::tensor_type_from_proto(&vi.name, vi.r#type.as_ref())
                {
                    report.outputs.push(value(&vi.name, &t));
                }
            }
            for init in &g.initializer {
                let n: u64 = init.dims.iter().map(|&d| d.max(0) as u64).product();
                if let Ok(d) = kiln_frontend::onnx::tensor::dtype_from_onnx(init.data_type) {
                    if d.is_float() {
                        report.parameters += n;
                    }
                    report.parameter_bytes += n * d.size_bytes() as u64;
                }
            }
            report.import_error = Some(e.to_string());
        }
    }
    if let Some(path) = &args.report {
        crate::diagnostic::write_json(&report, path)?;
    }
    if args.json {
        crate::emit(&format!("{}\n", serde_json::to_string_pretty(&report)?));
    } else {
        crate::emit(&format_report(&report));
    }
    Ok(())
}

fn display_domain(d: &str) -> String {
    if d.is_empty() {
        "ai.onnx".into()
    } else {
        d.to_string()
    }
}

fn format_report(r: &Report) -> String {
    use kiln_ir::printable;
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "model:      {}", printable(&r.model));
    if !r.producer.is_empty() {
        let _ = writeln!(s, "producer:   {}", printable(&r.producer));
    }
    let opsets: Vec<String> = r
        .opset_imports
        .iter()
        .map(|(d, v)| format!("{} {v}", printable(d)))
        .collect();
    let _ = writeln!(s, "ir version: {}   opset: {}", r.ir_version, opsets.join(", "));
    let _ = writeln!(s, "inputs:");
    for v in &r.inputs {
        let _ = writeln!(
            s,
            "  {:<24} {}[{}]",
            printable(&v.name),
            v.dtype,
            printable(&v.shape.join(","))
        );
    }
    let _ = writeln!(s, "outputs:");
    for v in &r.outputs {
        let _ = writeln!(
            s,
            "  {:<24} {}[{}]",
            printable(&v.name),
            v.dtype,
            printable(&v.shape.join(","))
        );
    }
    let _ = writeln!(
        s,
        "parameters: {} ({})",
        group_digits(r.parameters),
        human_bytes(r.parameter_bytes)
    );
    match r.flops {
        Some(f) => {
            let _ = writeln!(s, "FLOPs:      {} per run (estimated)", human_count(f));
        }
        None => {
            let _ = writeln!(s, "FLOPs:      unknown (the model does not import)");
        }
    }
    let _ = writeln!(s, "nodes:      {}", r.nodes);
    let mut ops: Vec<(&String, &usize)> = r.op_histogram.iter().collect();
    ops.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    for (op, n) in ops {
        let _ = writeln!(s, "  {:<24} {n}", printable(op));
    }
    if r.unsupported.is_empty() {
        let _ = writeln!(s, "unsupported operators: none");
    } else {
        let _ = writeln!(s, "unsupported operators ({}):", r.unsupported.len());
        for u in &r.unsupported {
            let _ = writeln!(s, "  {}", printable(&u.to_string()));
        }
    }
    if let Some(e) = &r.import_error {
        if r.unsupported.is_empty() {
            let _ = writeln!(s, "import error: {}", printable(&e.to_string()));
        }
    }
    s
}

fn group_digits(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn human_count(n: u64) -> String {
    let v = n as f64;
    if v >= 1e9 {
        format!("{:.2} G", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.2} K", v / 1e3)
    } else {
        format!("{n}")
    }
}
