//! The compile report ([`kiln_driver::Report`], schema `kiln.report/1`, docs/report.md) as
//! people and programs read it: the table `kiln explain` prints, and the JSON document of
//! `kiln explain --json` and `kiln compile --report`.

use anyhow::{Context, Result};
use kiln_driver::report::Report;
use std::path::Path;

pub fn to_json(r: &Report) -> String {
    let mut s = serde_json::to_string_pretty(r).expect("a report serializes");
    s.push('\n');
    s
}

pub fn write_json(r: &Report, path: &Path) -> Result<()> {
    std::fs::write(path, to_json(r)).with_context(|| format!("cannot write the report {}", path.display()))
}

/// Left-aligned columns, two spaces apart; the last column is not padded.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    // Cells hold model names: escaped, so a control character can neither reach the terminal
    // nor break the table's lines.
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| kiln_ir::printable(c).into_owned()).collect())
        .collect();
    let rows = &rows;
    let mut w: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::from("  ");
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(c);
                s.push_str(&" ".repeat(w[i] - c.chars().count() + 2));
            }
        }
        s.truncate(s.trim_end().len());
        s.push('\n');
        s
    };
    let mut out = line(header.to_vec());
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

/// A byte count for people: B, KiB or MiB with one decimal.
pub fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

fn layout_short(l: Option<&str>) -> &str {
    match l {
        Some("channels-last") => "nhwc",
        Some(_) => "row-major",
        None => "-",
    }
}

/// The human-readable report.
pub fn to_table(r: &Report) -> String {
    let mut out = String::new();
    let t = &r.target;
    out.push_str(&format!(
        "kiln explain: {} ({}) for {} / {} ({})\n",
        r.model.path, r.model.name, t.triple, t.cpu, t.isa
    ));
    if t.isa == "ptx" {
        let sm = t.cpu.trim_start_matches("sm_");
        let (major, minor) = sm.split_at(sm.len().saturating_sub(1));
        out.push_str(&format!(
            "  GPU: NVIDIA compute capability {major}.{minor} or newer (CUDA driver loaded at run time)\n"
        ));
    } else {
        out.push_str(&format!(
            "  CPU features assumed: {}\n",
            if t.cpu_features.is_empty() {
                "baseline".to_string()
            } else {
                t.cpu_features.join(" ")
            }
        ));
        if !t.variants.is_empty() {
            out.push_str(&format!(
                "  portable: carries {} (chosen by CPUID when a context is created; kernels below are {}'s)\n",
                t.variants.join(", "),
                t.variants.last().map(String::as_str).unwrap_or("")
            ));
        }
    }
    out.push_str(&format!(
        "  options: layout {}, precision {}, fusion {}{}\n",
        r.options.layout,
        r.options.precision,
        if r.options.fusion { "on" } else { "off" },
        if r.options.disabled_passes.is_empty() {
            String::new()
        } else {
            format!(", disabled passes: {}", r.options.disabled_passes.join(", "))
        }
    ));
    let s = &r.summary;
    out.push_str(&format!(
        "  {} nodes → {} after passes → {} kernels ({} generated, {} from the kernel library), {} fusion groups\n",
        s.nodes_before_passes,
        s.nodes_after_passes,
        s.kernels,
        s.generated_kernels,
        s.library_kernels,
        s.fusion_groups
    ));
    if r.target.isa == "ptx" && s.library_kernels > 0 {
        out.push_str(&format!(
            "  {} node(s) have no GPU kernel: `kiln compile --target cuda` refuses them unless --gpu-library-kernels runs them as library kernels on one GPU block (a slow development fallback)\n",
            s.library_kernels
        ));
    }
    if let Some(b) = &r.batch {
        out.push_str(&format!("  {}\n", batch_line(b)));
    }
    let status: Vec<String> = s.node_status.iter().map(|(k, v)| format!("{k} {v}")).collect();
    out.push_str(&format!("  nodes by status: {}\n", status.join(", ")));

    out.push_str("\npasses\n");
    let rows: Vec<Vec<String>> = r
        .passes
        .iter()
        .map(|p| {
            vec![
                p.name.to_string(),
                p.nodes_before.to_string(),
                p.nodes_after.to_string(),
                p.rewrites.to_string(),
                format!("{:.1}", p.time_ms),
                p.summary.clone(),
            ]
        })
        .collect();
    out.push_str(&table(
        &["pass", "nodes before", "after", "rewrites", "ms", "what"],
        &rows,
    ));

    out.push_str("\nkernels\n");
    let rows: Vec<Vec<String>> = r
        .kernels
        .iter()
        .map(|k| {
            let nodes: Vec<String> = k.nodes.iter().map(|n| format!("{} ({})", n.name, n.op)).collect();
            vec![
                k.index.to_string(),
                k.implementation.clone(),
                layout_short(k.layout).to_string(),
                match (&k.dtype, k.outputs.first().and_then(|v| v.stored_as.as_ref())) {
                    // An f32 output the kernel stores as bf16 (`store-bf16`).
                    (Some(d), Some(s)) => format!("{d}→{s}"),
                    (d, _) => d.clone().unwrap_or_else(|| "-".into()),
                },
                nodes.join(" + "),
            ]
        })
        .collect();
    out.push_str(&table(
        &["#", "implementation", "layout", "dtype", "nodes"],
        &rows,
    ));

    out.push_str("\nnodes\n");
    let rows: Vec<Vec<String>> = r
        .nodes
        .iter()
        .map(|n| {
            let kernel = match n.kernels.as_slice() {
                [] => "-".to_string(),
                ks => ks.iter().map(|k| k.to_string()).collect::<Vec<_>>().join(","),
            };
            let detail = match (&n.into, &n.view_of) {
                (Some(i), _) => format!("→ {i}"),
                (None, Some(v)) => format!("view of {v}"),
                _ => String::new(),
            };
            vec![
                n.name.clone(),
                n.op.to_string(),
                n.status.to_string(),
                kernel,
                layout_short(n.layout).to_string(),
                n.dtype.clone().unwrap_or_else(|| "-".into()),
                detail,
            ]
        })
        .collect();
    out.push_str(&table(
        &["node", "op", "status", "kernel", "layout", "dtype", "detail"],
        &rows,
    ));

    let m = &r.memory;
    out.push_str(&format!(
        "\nmemory: arena {}, weights {}, per-thread scratch {}\n",
        bytes(m.arena_bytes),
        bytes(m.weights_bytes),
        bytes(m.thread_scratch_bytes)
    ));
    let rows: Vec<Vec<String>> = m
        .buffers
        .iter()
        .map(|b| {
            vec![
                match (&b.value, b.scratch_of_kernel) {
                    (Some(v), _) => v.clone(),
                    (None, Some(k)) => format!("(scratch of kernel {k})"),
                    _ => "?".into(),
                },
                b.offset.to_string(),
                b.size.to_string(),
                format!("[{}, {}]", b.first_kernel, b.last_kernel),
            ]
        })
        .collect();
    out.push_str(&table(&["buffer", "offset", "bytes", "kernels alive"], &rows));
    out
}

/// "batch range 1..8: compiled for one sample, run once per sample (batched: x → y)".
pub fn batch_line(b: &kiln_driver::report::BatchInfo) -> String {
    format!(
        "batch range {}..{}: compiled for one sample, run once per sample (batched: {} → {})",
        b.min,
        b.max,
        b.inputs.join(", "),
        if b.outputs.is_empty() {
            "none".to_string()
        } else {
            b.outputs.join(", ")
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let t = table(&["a", "bb"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(t, "  a    bb\n  xyz  1\n");
    }
}
