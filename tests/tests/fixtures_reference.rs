//! Every fixture model, run through the reference interpreter, matches the outputs that
//! onnxruntime recorded (per-dtype tolerances from `kiln_tests::compare`).

use kiln_tests::compare::compare;
use kiln_tests::fixtures::{load_manifest, Fixture};

fn check(f: &Fixture) -> anyhow::Result<()> {
    let model = f.load()?;
    let outputs = kiln_ir::eval::eval_graph_named(&model.graph, f.read_inputs()?)?;
    let expected = f.read_expected()?;
    anyhow::ensure!(
        model.graph.outputs().len() == expected.len(),
        "model has {} outputs, {} expected",
        model.graph.outputs().len(),
        expected.len()
    );
    for (out, actual) in model.graph.outputs().iter().zip(&outputs) {
        let want = expected
            .get(&out.name)
            .ok_or_else(|| anyhow::anyhow!("no expected value for output '{}'", out.name))?;
        compare(want, actual).map_err(|e| anyhow::anyhow!("output '{}': {e}", out.name))?;
    }
    Ok(())
}

#[test]
fn fixtures_match_onnxruntime() {
    let fixtures = load_manifest().expect("fixtures/manifest.json");
    assert!(!fixtures.is_empty(), "no fixtures in the manifest");
    let mut failed = vec![];
    for f in &fixtures {
        match check(f) {
            Ok(()) => println!("ok   {}", f.name),
            Err(e) => {
                println!("FAIL {}: {e:#}", f.name);
                failed.push(f.name.clone());
            }
        }
    }
    println!(
        "fixtures: {} passed, {} failed",
        fixtures.len() - failed.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "fixtures failing: {}", failed.join(", "));
}
