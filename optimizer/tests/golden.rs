//! Golden pass tests: every `golden/<pass>/<case>.onnx` (generated from `<case>.txt` by
//! `scripts/gen_golden_models.py`) is imported, run through the passes and printed; the text
//! must equal `<case>.expected`. `KILN_BLESS=1` writes the expected files instead. See
//! `golden/README.md`.
//!
//! Besides the text, every case checks that the passes kept the results (the reference
//! interpreter on the graph before and after, same inputs), and a case named `unchanged*`
//! checks that the passes left the graph exactly as imported.

use kiln_frontend::{load_model, ImportOptions};
use kiln_ir::{DType, Graph, Tensor};
use kiln_optimizer::{pipelines, Layout, PipelineOptions, Precision};
use std::path::{Path, PathBuf};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// `# passes: a,b` and `# options: layout=nhwc,precision=bf16,integer_products` header lines of
/// the case.
struct Header {
    passes: Vec<String>,
    options: PipelineOptions,
}

fn header(txt: &Path, dir_pass: &str) -> Result<Header, String> {
    let text = std::fs::read_to_string(txt).map_err(|e| format!("{}: {e}", txt.display()))?;
    let mut h = Header {
        passes: vec![dir_pass.to_string()],
        options: PipelineOptions::default(),
    };
    for line in text.lines().take_while(|l| l.starts_with('#')) {
        let line = line.trim_start_matches('#').trim();
        if let Some(p) = line.strip_prefix("passes:") {
            h.passes = p
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect();
        } else if let Some(o) = line.strip_prefix("options:") {
            for kv in o.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                match kv {
                    "layout=nchw" => h.options.layout = Layout::Nchw,
                    "layout=nhwc" => h.options.layout = Layout::Nhwc,
                    "precision=f32" => h.options.precision = Precision::F32,
                    "precision=bf16" => h.options.precision = Precision::Bf16,
                    "integer_products" => h.options.integer_products = true,
                    other => return Err(format!("{}: unknown option '{other}'", txt.display())),
                }
            }
        }
    }
    Ok(h)
}

/// Deterministic inputs: floats in [-1, 1], small integers, alternating booleans.
fn inputs(g: &Graph) -> Option<Vec<Tensor>> {
    g.input_types()
        .enumerate()
        .map(|(k, (_, ty))| {
            let shape = ty.fixed_shape()?;
            let n: usize = shape.iter().product();
            let f: Vec<f64> = (0..n).map(|i| ((i * 7 + k * 13) as f64 * 0.61).sin()).collect();
            let t = Tensor::from_vec(shape.clone(), f);
            Some(match ty.dtype {
                DType::Bool => Tensor::from_vec(shape, (0..n).map(|i| i % 2 == 0).collect()),
                d if d.is_float() => t.cast(d),
                d => Tensor::from_vec(shape, (0..n).map(|i| (i % 4) as i64).collect()).cast(d),
            })
        })
        .collect()
}

/// The passes may only change results by rounding: f32 tolerances, or for bf16 autocast a
/// cosine similarity of at least 0.999.
fn same_results(before: &Graph, after: &Graph, bf16: bool) -> Result<(), String> {
    let Some(ins) = inputs(before) else {
        return Ok(()); // symbolic inputs: nothing to evaluate
    };
    let want = kiln_ir::eval::eval_graph(before, ins.clone()).map_err(|e| format!("eval before: {e}"))?;
    let got = kiln_ir::eval::eval_graph(after, ins).map_err(|e| format!("eval after: {e}"))?;
    for ((o, w), a) in before.outputs().iter().zip(&want).zip(&got) {
        if w.shape() != a.shape() || w.dtype() != a.dtype() {
            return Err(format!(
                "output '{}': {} became {}",
                o.name,
                w.tensor_type(),
                a.tensor_type()
            ));
        }
        let (w, a) = (w.to_f64_vec(), a.to_f64_vec());
        if bf16 {
            let dot: f64 = w.iter().zip(&a).map(|(x, y)| x * y).sum();
            let nw: f64 = w.iter().map(|x| x * x).sum::<f64>().sqrt();
            let na: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
            let cos = if nw == 0.0 && na == 0.0 {
                1.0
            } else {
                dot / (nw * na)
            };
            if cos < 0.999 {
                return Err(format!("output '{}': cosine similarity {cos}", o.name));
            }
        } else if let Some((x, y)) = w
            .iter()
            .zip(&a)
            .find(|(x, y)| !(x.is_nan() && y.is_nan()) && (*x - *y).abs() > 1e-5 + 1e-4 * x.abs())
        {
            return Err(format!("output '{}': {x} became {y}", o.name));
        }
    }
    Ok(())
}

fn run_case(onnx: &Path, pass: &str, bless: bool) -> Result<(), String> {
    let h = header(&onnx.with_extension("txt"), pass)?;
    let model = load_model(onnx, &ImportOptions::default()).map_err(|e| format!("import: {e}"))?;
    let before = model.graph;
    let mut graph = before.clone();
    let mut pm = pipelines::cpu(&h.options);
    for p in &h.passes {
        pm.check_pass_name(p)?;
    }
    for p in pm.pass_names() {
        if !h.passes.iter().any(|q| q == p) {
            pm.disable(p);
        }
    }
    let stats = pm.run(&mut graph).map_err(|e| e.to_string())?;
    let text = graph.to_string();
    let case = onnx.file_stem().unwrap().to_string_lossy().into_owned();
    if case.starts_with("unchanged") {
        let rewrites: usize = stats.iter().map(|s| s.rewrites).sum();
        if rewrites != 0 || text != before.to_string() {
            return Err(format!(
                "an 'unchanged' case was rewritten ({rewrites} rewrites):\n{before}\nbecame\n{text}"
            ));
        }
    }
    same_results(&before, &graph, h.options.precision == Precision::Bf16)?;
    let expected_path = onnx.with_extension("expected");
    if bless {
        std::fs::write(&expected_path, &text).map_err(|e| e.to_string())?;
        return Ok(());
    }
    let expected = std::fs::read_to_string(&expected_path).map_err(|_| {
        format!(
            "no {} (run `KILN_BLESS=1 cargo test -p kiln-optimizer --test golden` and review it)",
            expected_path.display()
        )
    })?;
    if expected != text {
        return Err(format!(
            "text differs from {} (KILN_BLESS=1 rewrites it)\n--- expected\n{expected}--- got\n{text}",
            expected_path.display()
        ));
    }
    Ok(())
}

#[test]
fn golden_pass_cases() {
    let bless = std::env::var("KILN_BLESS").is_ok_and(|v| v == "1");
    let mut cases: Vec<(PathBuf, String)> = vec![];
    let mut missing_unchanged = vec![];
    for dir in std::fs::read_dir(golden_dir()).expect("golden dir") {
        let dir = dir.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        let pass = dir.file_name().unwrap().to_string_lossy().into_owned();
        let mut txts = vec![];
        for f in std::fs::read_dir(&dir).unwrap() {
            let f = f.unwrap().path();
            if f.extension().is_some_and(|e| e == "txt") {
                txts.push(f);
            }
        }
        txts.sort();
        // Every pass shows at least one graph it must leave alone.
        if !txts.iter().any(|t| {
            t.file_stem()
                .is_some_and(|s| s.to_string_lossy().starts_with("unchanged"))
        }) {
            println!("FAIL {pass}: no 'unchanged*' case (a graph the pass must leave as it is)");
            missing_unchanged.push(pass.clone());
        }
        for txt in txts {
            cases.push((txt.with_extension("onnx"), pass.clone()));
        }
    }
    assert!(
        !cases.is_empty(),
        "no golden cases under {}",
        golden_dir().display()
    );
    let mut failed = missing_unchanged;
    for (onnx, pass) in &cases {
        let name = format!("{pass}/{}", onnx.file_stem().unwrap().to_string_lossy());
        let res = if onnx.exists() {
            run_case(onnx, pass, bless)
        } else {
            Err("no .onnx: run scripts/gen_golden_models.py".to_string())
        };
        match res {
            Ok(()) => println!("ok   {name}"),
            Err(e) => {
                println!("FAIL {name}: {e}");
                failed.push(name);
            }
        }
    }
    assert!(failed.is_empty(), "golden cases failing: {}", failed.join(", "));
}
