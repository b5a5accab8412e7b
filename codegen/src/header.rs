//! The C header shipped with a static library: the model's API, each input and output
//! documented with name, dtype and shape.

use crate::emit::Api;
use kiln_ir::{DType, TensorType};

fn c_type(dt: DType) -> &'static str {
    match dt {
        DType::Bool | DType::U8 => "uint8_t",
        DType::I8 => "int8_t",
        DType::U16 | DType::F16 | DType::BF16 => "uint16_t",
        DType::I16 => "int16_t",
        DType::U32 => "uint32_t",
        DType::I32 => "int32_t",
        DType::U64 => "uint64_t",
        DType::I64 => "int64_t",
        DType::F32 => "float",
        DType::F64 => "double",
    }
}

/// A C identifier from a tensor name (`input.1` → `input_1`).
pub fn c_ident(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    s
}

fn doc_line(ty: &TensorType, name: &str, what: &str) -> String {
    let shape = ty.fixed_shape().unwrap_or_default();
    let n: usize = shape.iter().product();
    format!(
        " *   {what} {:<24} {}  ({} elements, {} bytes)\n",
        format!("\"{name}\""),
        ty,
        n,
        ty.size_bytes().unwrap_or(0)
    )
}

pub fn header(
    api: &Api,
    model_name: &str,
    target: &str,
    inputs: &[(String, TensorType)],
    outputs: &[(String, TensorType)],
    arena_bytes: u64,
    thread_scratch_bytes: u64,
) -> String {
    let p = &api.prefix;
    let guard = format!("{}_H", p.to_uppercase());
    let mut s = String::new();
    s.push_str(&format!(
        "/*\n * {p}.h — the model \"{model_name}\" compiled by kiln {} for {target}.\n *\n",
        env!("CARGO_PKG_VERSION")
    ));
    s.push_str(" * Tensors are dense, row-major (C order); float16/bfloat16 are passed as their 16-bit\n");
    s.push_str(" * patterns (uint16_t), bool as uint8_t (0 or 1).\n *\n");
    for (n, ty) in inputs {
        s.push_str(&doc_line(ty, n, "input "));
    }
    for (n, ty) in outputs {
        s.push_str(&doc_line(ty, n, "output"));
    }
    if api.cuda {
        s.push_str(&format!(
            " *\n * Link: cc app.c lib{p}.a -lpthread -lm -ldl\n * The kernels run on an NVIDIA GPU. The CUDA driver (libcuda.so.1) is loaded with dlopen when a\n * context is created, so nothing CUDA is needed to build or link; -ldl is for dlopen (part of\n * the C library since glibc 2.34). Each context owns {arena_bytes} bytes of device memory for\n * intermediate values, plus the weights and a device copy of every input and output.\n"
        ));
        s.push_str(" * Contexts share nothing mutable, so several may run at once (one run per context at a time).\n */\n");
    } else {
        s.push_str(&format!(
            " *\n * Link: cc app.c lib{p}.a -lpthread -lm\n * Each context owns {arena_bytes} bytes of working memory plus {thread_scratch_bytes} per thread;\n"
        ));
        s.push_str(" * contexts share nothing mutable, so several may run at once (one run per context at a time).\n */\n");
    }
    s.push_str(&format!(
        "#ifndef {guard}\n#define {guard}\n\n#include <stddef.h>\n#include <stdint.h>\n\n"
    ));
    s.push_str("#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n");
    s.push_str(&format!("typedef struct {p}_ctx {p}_ctx;\n\n"));
    if api.cuda {
        s.push_str(&cuda_create_section(p, api.weights_file.as_deref()));
    }
    match &api.weights_file {
        None if api.cuda => s.push_str(&format!(
            "/* Creates a context on CUDA device $KILN_CUDA_DEVICE (default 0); num_threads is ignored.\n   Returns NULL on failure; {p}_last_error(NULL) says why. */\n{p}_ctx *{p}_create(int32_t num_threads);\n\n"
        )),
        None => s.push_str(&format!(
            "/* Creates a context with num_threads threads (<= 0: one per online CPU). Returns NULL on\n   failure (e.g. the CPU lacks a required feature); {p}_last_error(NULL) says why. */\n{p}_ctx *{p}_create(int32_t num_threads);\n\n"
        )),
        Some(file) => s.push_str(&format!(
            "/* The weights are not in this library: they are in the file written at compile time as\n   \"{file}\" (kiln compile --weights-out). {p}_create_with_weights maps that file read-only,\n   checks that it was written for this build (layout hash) and is intact (content hash), and\n   creates a context with num_threads threads (<= 0: one per online CPU). Returns NULL on\n   failure (a missing, foreign, truncated or corrupt file; a CPU that lacks a required\n   feature); {p}_last_error(NULL) says why. The mapping is released by {p}_destroy.\n   A file written by recompiling the same model with other weight values works too. */\n{p}_ctx *{p}_create_with_weights(const char *weights_path, int32_t num_threads);\n\n/* Fails for this build (the weights file is needed): use {p}_create_with_weights. */\n{p}_ctx *{p}_create(int32_t num_threads);\n\n"
        )),
    }
    s.push_str(&format!("void {p}_destroy({p}_ctx *ctx);\n\n"));
    let mut params = vec![format!("{p}_ctx *ctx")];
    for (n, ty) in inputs {
        params.push(format!("const {} *{}", c_type(ty.dtype), c_ident(n)));
    }
    for (n, ty) in outputs {
        params.push(format!("{} *{}", c_type(ty.dtype), c_ident(n)));
    }
    s.push_str(&format!(
        "/* Runs the model once. Returns 0, or non-zero with {p}_last_error(ctx) set. */\nint32_t {p}_run({});\n\n",
        params.join(", ")
    ));
    s.push_str(&format!(
        "/* Same, with inputs[i] / outputs[i] pointing at graph input / output i in the order above. */\nint32_t {p}_run_generic({p}_ctx *ctx, const void *const *inputs, void *const *outputs);\n\n"
    ));
    s.push_str(&format!(
        "/* The last error of ctx (\"\" if none), or why {p}_create failed when ctx is NULL. */\nconst char *{p}_last_error({p}_ctx *ctx);\n\n"
    ));
    s.push_str(&format!("/* Bytes of working memory each context allocates (excluding per-thread scratch). */\nint64_t {p}_workspace_size(void);\n\n"));
    s.push_str(&format!("/* The signature as JSON: name, inputs, outputs (name, dtype, shape), target. */\nconst char *{p}_info(void);\n\n"));
    if api.cuda {
        s.push_str(&format!(
            "/* Runs the model on tensors already in device memory: d_inputs[i] / d_outputs[i] are device\n   pointers (CUdeviceptr values, e.g. from cuMemAlloc or cudaMalloc, in the context's CUDA\n   device's primary context) to graph input / output i, with the sizes above. stream is a\n   CUstream / cudaStream_t the work is queued on (NULL: the context's own stream); inputs must be\n   ready on it. The call synchronizes that stream before it returns: a failure found by a kernel\n   (an index read from an input out of range) is only known from device memory, and reporting it\n   in a later call would blame the wrong run. Returns 0 with the outputs complete, or non-zero\n   with {p}_last_error(ctx) set. {p}_run copies host tensors in and out around the same launches. */\nint32_t {p}_run_device({p}_ctx *ctx, const void *const *d_inputs, void *const *d_outputs, void *stream);\n\n"
        ));
    }
    if api.profile {
        s.push_str(&crate::profile::header_section(p));
    }
    s.push_str(&format!(
        "#define {}_NUM_INPUTS {}\n#define {}_NUM_OUTPUTS {}\n\n",
        p.to_uppercase(),
        inputs.len(),
        p.to_uppercase(),
        outputs.len()
    ));
    s.push_str("#ifdef __cplusplus\n}\n#endif\n#endif\n");
    s
}

/// `NAME_create_on_device` (and the weights-file variant) of a CUDA model.
fn cuda_create_section(p: &str, weights_file: Option<&str>) -> String {
    let mut s = format!(
        "/* Creates a context on CUDA device `device` (0, 1, ...; -1: $KILN_CUDA_DEVICE, default 0):\n   loads the driver, compiles the kernels for the device, allocates device memory and copies\n   the weights there. Returns NULL on failure; {p}_last_error(NULL) says why: \"no CUDA\n   device: ...\" when the driver is missing or finds no such device, or the device is older\n   than the architecture the model was compiled for. */\n"
    );
    match weights_file {
        None => s.push_str(&format!("{p}_ctx *{p}_create_on_device(int32_t device);\n\n")),
        Some(_) => s.push_str(&format!(
            "{p}_ctx *{p}_create_with_weights_on_device(const char *weights_path, int32_t device);\n/* Fails for this build (the weights file is needed). */\n{p}_ctx *{p}_create_on_device(int32_t device);\n\n"
        )),
    }
    s
}
