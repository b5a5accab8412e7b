//! How a model compiled with `--precision bf16` is judged against the f32 reference outputs.
//!
//! Criteria, per float output: cosine similarity ≥ 0.999 (the bar) and a maximum error
//! relative to the output's range, `max|y - ref| / max|ref|`, of at most 2%: a bf16 operand
//! carries a relative rounding error of up to 2^-9 and a dot product over K terms adds such
//! errors with random signs, so a few tenths of a percent per layer is expected and 2% leaves
//! room for a handful of layers. Integer and boolean outputs must match exactly. Models the
//! autocast does not touch (no MatMul/Gemm/Conv/ConvTranspose/Attention/Einsum on f32) must
//! match with the ordinary f32 tolerances: the pass must not change anything else.
//!
//! Documented exceptions (looser thresholds) are in [`thresholds`]; each says why. MobileNetV2
//! does not reach 0.999, and no bf16 execution can: see `thresholds`.

use crate::compare::compare;
use crate::fixtures::Fixture;
use kiln_ir::{DType, Graph, Tensor};

/// Minimum cosine similarity and maximum range-relative error for one fixture.
pub fn thresholds(name: &str) -> (f64, f64) {
    match name {
        // Below the general bar (cosine 0.999) by the model, not by kiln: rounding every
        // Conv/Gemm operand to bf16 with f32 accumulation — the numerics bf16 autocast promises —
        // in onnxruntime gives cosine 0.99744 on this fixture (0.99650 on the full-size
        // MobileNetV2), its error dominated by the first convolutions
        // (`scripts/bf16_reference.py ... --per-layer`). kiln measures 0.9970 (full size: 0.9971).
        // Meeting 0.999 would take keeping layers in f32, i.e. not running the model in bf16.
        "mobilenetv2_tiny" => (0.997, 0.08),
        // Cosine meets the bar (0.99916); the largest error, 4% of the logits' range, is on one
        // logit.
        "efficientnet_tiny" => (0.999, 0.05),
        // Dynamically quantized: every product's activation is re-quantized to 8 bits with a
        // scale taken from its own range, so a bf16 rounding upstream that moves a value across
        // a rounding boundary changes it by a whole quantization step (1/255 of that range), not
        // by an ulp, and the step propagates. Rounding the float MatMuls' operands to bf16 in
        // onnxruntime (`scripts/bf16_reference.py`) already costs 1.8% of the pooler output's
        // range on this input; kiln's bf16 attention measures 3.9% (cosine 0.99975).
        "bert_tiny_dynamic_int8" => (0.999, 0.05),
        // Statically quantized (QDQ): every activation is rounded to an 8-bit grid with a fixed
        // scale, so the same whole-step changes propagate. onnxruntime with its products'
        // operands rounded to bf16 (`scripts/bf16_reference.py`) is off by 0.058 on the pooler
        // output, 5.8% of its largest value (cosine 0.99965); kiln, whose weight products are
        // exact integers here and only the attention's are bf16, measures 6.8% (cosine
        // 0.99945): which values cross a step differs, not how many.
        "bert_tiny_qdq" => (0.999, 0.08),
        _ => (0.999, 0.02),
    }
}

/// Cosine similarity and `max|a - b| / max|b|` of two float tensors of the same shape.
pub fn similarity(actual: &Tensor, expected: &Tensor) -> (f64, f64) {
    let a = actual.to_f64_vec();
    let b = expected.to_f64_vec();
    let dot: f64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
    let na = a.iter().map(|x| x * x).sum::<f64>().sqrt();
    let nb = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    let cos = if na == 0.0 && nb == 0.0 {
        1.0
    } else if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na * nb)
    };
    let range = b.iter().fold(0f64, |m, x| m.max(x.abs()));
    let err = a.iter().zip(&b).fold(0f64, |m, (x, y)| m.max((x - y).abs()));
    let rel = if range == 0.0 { err } else { err / range };
    (cos, rel)
}

/// Checks `outputs` (in `graph`'s order) of fixture `f` compiled in bf16 against its f32
/// expected outputs; `bf16_ops` is how many operators the autocast changed (none: f32
/// tolerances). Returns the worst cosine and range-relative error.
pub fn check_bf16_outputs(
    f: &Fixture,
    graph: &Graph,
    outputs: &[Tensor],
    bf16_ops: usize,
) -> anyhow::Result<(f64, f64)> {
    let expected = f.read_expected()?;
    let (min_cos, max_rel) = thresholds(&f.name);
    let (mut worst_cos, mut worst_rel) = (1f64, 0f64);
    for (out, actual) in graph.outputs().iter().zip(outputs) {
        let want = expected
            .get(&out.name)
            .ok_or_else(|| anyhow::anyhow!("no expected value for output '{}'", out.name))?;
        let float = matches!(want.dtype(), DType::F32 | DType::F16 | DType::BF16 | DType::F64);
        if bf16_ops == 0 || !float {
            compare(want, actual).map_err(|e| anyhow::anyhow!("output '{}': {e}", out.name))?;
            continue;
        }
        if actual.shape() != want.shape() {
            anyhow::bail!(
                "output '{}': shape {:?}, expected {:?}",
                out.name,
                actual.shape(),
                want.shape()
            );
        }
        let (cos, rel) = similarity(actual, want);
        worst_cos = worst_cos.min(cos);
        worst_rel = worst_rel.max(rel);
        if !(cos >= min_cos && rel <= max_rel) {
            anyhow::bail!(
                "output '{}': cosine {cos:.6} (needs ≥ {min_cos}), max error {rel:.4} of the range (needs ≤ {max_rel})",
                out.name
            );
        }
    }
    Ok((worst_cos, worst_rel))
}
