//! The model's signature as JSON (printed by `--info` and `NAME_info()`): its inputs and
//! outputs with their C names, types and shapes, the target, and the plan's sizes.

use super::ModuleParts;
use kiln_ir::{Graph, TensorType};

/// The graph's inputs, as the signature and the C API list them.
pub fn signature_inputs(graph: &Graph) -> Vec<(String, TensorType)> {
    graph
        .input_types()
        .map(|(n, t)| (n.to_string(), t.clone()))
        .collect()
}

/// The graph's outputs, as the signature and the C API list them.
pub fn signature_outputs(graph: &Graph) -> Vec<(String, TensorType)> {
    graph
        .outputs()
        .iter()
        .map(|o| (o.name.clone(), graph.value_type(o.value).clone()))
        .collect()
}

/// `c_name`: the tensor's parameter and size-macro name in the C header; `bounded`: the indices
/// whose shape is an upper bound (`crate::data_dependent`), marked `"shape_is_bound": true`.
fn io_json(items: &[(String, TensorType)], c_names: &[String], bounded: &[usize]) -> serde_json::Value {
    serde_json::Value::Array(
        items
            .iter()
            .zip(c_names)
            .enumerate()
            .map(|(i, ((name, ty), c_name))| {
                let mut v = serde_json::json!({
                    "name": name,
                    "c_name": c_name,
                    "dtype": kiln_runtime::DTYPE_NAMES[ty.dtype as usize],
                    "shape": ty.fixed_shape().unwrap_or_default(),
                });
                if bounded.contains(&i) {
                    v["shape_is_bound"] = true.into();
                }
                v
            })
            .collect(),
    )
}

/// The model's signature as printed by `--info` and `NAME_info()`.
pub fn signature_json(
    parts: &ModuleParts<'_>,
    inputs: &[(String, TensorType)],
    outputs: &[(String, TensorType)],
    layout_hash: Option<u64>,
) -> String {
    let ids = crate::header::c_names(&parts.api.prefix, inputs, outputs);
    let (in_ids, out_ids) = ids.split_at(inputs.len());
    let mut sig = serde_json::json!({
        "name": parts.model_name,
        "kiln_version": env!("CARGO_PKG_VERSION"),
        "target": parts.target.triple,
        "cpu": parts.target.cpu,
        "cpu_features": parts.target.required_cpu_features(),
        "inputs": io_json(inputs, in_ids, &[]),
        "outputs": io_json(outputs, out_ids, parts.data_dependent),
        "kernels": parts.plan.kernels.len(),
        "weights_bytes": parts.plan.weights.len(),
        "arena_bytes": parts.plan.arena_bytes,
    });
    if let Some(b) = parts.batch {
        // "batch": the range; each batched input and output says so, its shape the
        // per-sample one (axis 0 is n times it at batch n).
        sig["batch"] = serde_json::json!({"min": b.lo, "max": b.hi});
        for (key, flags) in [("inputs", &b.inputs), ("outputs", &b.outputs)] {
            for (v, &batched) in sig[key].as_array_mut().into_iter().flatten().zip(flags.iter()) {
                if batched {
                    v["batched"] = true.into();
                }
            }
        }
    }
    if let Some(code) = parts.cuda {
        sig["device"] = format!("cuda sm_{}", code.sm).into();
    }
    if let Some(p) = parts.portable {
        sig["variants"] = p.names().into();
        match parts.variant {
            // A context's own description (`--info`): the variant it runs.
            Some(i) => sig["cpu"] = p.names()[i].clone().into(),
            // The artifact as a whole (`NAME_info`): what the least of its variants needs.
            None => {
                let first = &p.variants[0];
                sig["cpu"] = "portable".into();
                sig["cpu_features"] = first.target.required_cpu_features().into();
                sig["kernels"] = first.plan.kernels.len().into();
                sig["weights_bytes"] = p
                    .variants
                    .iter()
                    .map(|v| v.plan.weights.len())
                    .sum::<usize>()
                    .into();
                sig["arena_bytes"] = p.variants.iter().map(|v| v.plan.arena_bytes).max().into();
            }
        }
    }
    if let (Some(file), Some(hash)) = (&parts.api.weights_file, layout_hash) {
        sig["weights_file"] = file.as_str().into();
        sig["weights_layout_hash"] = crate::weights_file::hex(hash).into();
    }
    sig.to_string()
}
