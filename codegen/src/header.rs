//! The C header shipped with a static library: the model's API, each input and output
//! documented with name, dtype and shape.

use crate::api::Api;
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

/// One tensor's line; `batch`: the batch range of a batched tensor, whose sizes are per sample.
fn doc_line(
    ty: &TensorType,
    name: &str,
    id: &str,
    what: &str,
    bound: bool,
    batch: Option<(usize, usize)>,
) -> String {
    let shape = ty.fixed_shape().unwrap_or_default();
    let n: usize = shape.iter().product();
    let at_most = if bound { "at most " } else { "" };
    let (shown, per) = match (batch, shape.split_first()) {
        (Some((lo, hi)), Some((&a0, rest))) => {
            let rest: String = rest.iter().map(|d| format!(",{d}")).collect();
            let axis0 = if a0 == 1 {
                format!("{lo}..{hi}")
            } else {
                format!("n*{a0} (n in {lo}..{hi}), ")
            };
            (format!("{}[{axis0}{rest}]", ty.dtype), " a sample")
        }
        _ => (ty.to_string(), ""),
    };
    format!(
        " *   {what} {:<24} {at_most}{shown}  ({at_most}{} elements, {} bytes{per})  C name: {id}\n",
        comment_text(name),
        n,
        ty.size_bytes().unwrap_or(0)
    )
}

/// ONNX's `TensorProto.DataType` code of a dtype: what `NAME_input_dtype` returns.
pub fn onnx_dtype(dt: DType) -> i32 {
    match dt {
        DType::F32 => 1,
        DType::U8 => 2,
        DType::I8 => 3,
        DType::U16 => 4,
        DType::I16 => 5,
        DType::I32 => 6,
        DType::I64 => 7,
        DType::Bool => 9,
        DType::F16 => 10,
        DType::F64 => 11,
        DType::U32 => 12,
        DType::U64 => 13,
        DType::BF16 => 16,
    }
}

/// C and C++ keywords (every standard up to C23 and C++23, with the alternative operator
/// spellings), which a parameter or macro name must never be.
const KEYWORDS: &[&str] = &[
    "alignas",
    "alignof",
    "and",
    "and_eq",
    "asm",
    "auto",
    "bitand",
    "bitor",
    "bool",
    "break",
    "case",
    "catch",
    "char",
    "char8_t",
    "char16_t",
    "char32_t",
    "class",
    "compl",
    "concept",
    "const",
    "consteval",
    "constexpr",
    "constinit",
    "const_cast",
    "continue",
    "co_await",
    "co_return",
    "co_yield",
    "decltype",
    "default",
    "delete",
    "do",
    "double",
    "dynamic_cast",
    "else",
    "enum",
    "explicit",
    "export",
    "extern",
    "false",
    "float",
    "for",
    "fortran",
    "friend",
    "goto",
    "if",
    "inline",
    "int",
    "long",
    "mutable",
    "namespace",
    "new",
    "noexcept",
    "not",
    "not_eq",
    "nullptr",
    "operator",
    "or",
    "or_eq",
    "private",
    "protected",
    "public",
    "register",
    "reinterpret_cast",
    "requires",
    "restrict",
    "return",
    "short",
    "signed",
    "sizeof",
    "static",
    "static_assert",
    "static_cast",
    "struct",
    "switch",
    "template",
    "this",
    "thread_local",
    "throw",
    "true",
    "try",
    "typedef",
    "typeid",
    "typename",
    "typeof",
    "typeof_unqual",
    "union",
    "unsigned",
    "using",
    "virtual",
    "void",
    "volatile",
    "wchar_t",
    "while",
    "xor",
    "xor_eq",
];

/// Macros an application commonly has defined where it includes the header: GCC's predefined
/// ones in its default GNU modes, and those of the C library headers most programs include.
const COMMON_MACROS: &[&str] = &[
    "linux",
    "unix",
    "i386",
    "errno",
    "stdin",
    "stdout",
    "stderr",
    "assert",
    "EOF",
    "BUFSIZ",
    "FILENAME_MAX",
    "EXIT_SUCCESS",
    "EXIT_FAILURE",
    "RAND_MAX",
    "MB_CUR_MAX",
    "complex",
    "imaginary",
    "I",
];

/// Whether `id` cannot name a tensor in the header: a keyword, the API's own parameter, a macro
/// or type of <stddef.h>/<stdint.h> (the header includes them, and a parameter named like a
/// macro is replaced by the preprocessor; one named like a type hides it from the parameters
/// after it), another common macro, or a name that starts like the header's own macros.
fn reserved(id: &str, macro_prefix: &str) -> bool {
    let upper_macro = id
        .bytes()
        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        && ["_MIN", "_MAX", "_C", "_WIDTH"].iter().any(|s| id.ends_with(s));
    KEYWORDS.contains(&id)
        || COMMON_MACROS.contains(&id)
        || matches!(id, "ctx" | "NULL" | "offsetof")
        || id.ends_with("_t")
        || upper_macro
        || id.starts_with(macro_prefix)
}

/// The C identifiers of a model's inputs and outputs (in that order, one namespace: they are
/// all parameters of `NAME_run`). Each is the tensor name with anything but letters, digits
/// and `_` made `_`, runs of `_` collapsed and leading/trailing ones dropped, so that no name
/// takes a reserved form (`_X`, `__`) and the size macros built from it (`NAME_INPUT_<ID>_BYTES`)
/// are not reserved either. A name that is a keyword or otherwise reserved, or that is already
/// taken (compared case-insensitively, as the macros use it upper-cased), gets the first free
/// suffix `_2`, `_3`, ... — deterministically, in graph order.
pub fn c_names(
    prefix: &str,
    inputs: &[(String, TensorType)],
    outputs: &[(String, TensorType)],
) -> Vec<String> {
    let macro_prefix = format!("{}_", prefix.to_uppercase());
    let mut used = std::collections::HashSet::new();
    let mut out = vec![];
    for (name, _) in inputs.iter().chain(outputs) {
        let mut base = String::new();
        for c in name.chars() {
            let c = if c.is_ascii_alphanumeric() { c } else { '_' };
            if !(c == '_' && (base.is_empty() || base.ends_with('_'))) {
                base.push(c);
            }
        }
        while base.ends_with('_') {
            base.pop();
        }
        if base.is_empty() {
            base.push('t');
        } else if base.starts_with(|c: char| c.is_ascii_digit()) || base.starts_with(&macro_prefix) {
            base.insert_str(0, "t_");
        }
        let id = (1..)
            .map(|k| {
                if k == 1 {
                    base.clone()
                } else {
                    format!("{base}_{k}")
                }
            })
            .find(|id| !reserved(id, &macro_prefix) && !used.contains(&id.to_ascii_lowercase()))
            .expect("a free suffix exists");
        used.insert(id.to_ascii_lowercase());
        out.push(id);
    }
    out
}

/// A tensor or model name as it may appear inside a `/* */` comment: quoted, with `\`, `"`,
/// control and non-ASCII characters escaped, and `*/`, `/*` and `??` (a trigraph) broken up, so
/// that no name can end the comment early or splice lines.
pub fn comment_text(name: &str) -> String {
    let mut s = String::from("\"");
    let mut prev = '\0';
    for c in name.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '/' if prev == '*' => s.push_str("\\/"),
            '*' if prev == '/' => s.push_str("\\*"),
            '?' if prev == '?' => s.push_str("\\?"),
            ' '..='~' => s.push(c),
            c if (c as u32) < 0x100 => s.push_str(&format!("\\x{:02x}", c as u32)),
            c => s.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
        prev = c;
    }
    s.push('"');
    s
}

/// The header of a library of `kind`; `memory` is (arena bytes, per-thread scratch bytes).
/// The tensors a header documents: the graph inputs and outputs (name, type), and which
/// outputs have a shape that is an upper bound (`crate::data_dependent`).
pub struct HeaderIo<'a> {
    pub inputs: &'a [(String, TensorType)],
    pub outputs: &'a [(String, TensorType)],
    pub bounded: &'a [usize],
    /// A batch range (`crate::batch`): which inputs and outputs it batches.
    pub batch: Option<&'a crate::batch::Batch>,
}

pub fn header(
    api: &Api,
    model_name: &str,
    target: &str,
    io: &HeaderIo<'_>,
    memory: (u64, u64),
    kind: crate::buildfiles::LibKind,
) -> String {
    let (inputs, outputs, bounded) = (io.inputs, io.outputs, io.bounded);
    let (arena_bytes, thread_scratch_bytes) = memory;
    let p = &api.prefix;
    let dl = if api.cuda { " -ldl" } else { "" };
    // How an application links this library, for the header's first lines.
    let link = match kind {
        crate::buildfiles::LibKind::Static => format!("cc app.c lib{p}.a -lpthread -lm{dl}"),
        crate::buildfiles::LibKind::Shared => {
            format!("cc app.c -L DIR -l{p} (run with DIR in the rpath or LD_LIBRARY_PATH)")
        }
    };
    let guard = format!("{}_H", p.to_uppercase());
    let mut s = String::new();
    s.push_str(&format!(
        "/*\n * {p}.h — the model {} compiled by kiln {} for {target}.\n *\n",
        comment_text(model_name),
        env!("CARGO_PKG_VERSION")
    ));
    s.push_str(" * Tensors are dense, row-major (C order); float16/bfloat16 are passed as their 16-bit\n");
    s.push_str(" * patterns (uint16_t), bool as uint8_t (0 or 1).\n *\n");
    let ids = c_names(p, inputs, outputs);
    let (in_ids, out_ids) = ids.split_at(inputs.len());
    let range = |flags: fn(&crate::batch::Batch) -> &Vec<bool>, i: usize| {
        io.batch.filter(|b| flags(b)[i]).map(|b| (b.lo, b.hi))
    };
    for (i, ((n, ty), id)) in inputs.iter().zip(in_ids).enumerate() {
        s.push_str(&doc_line(ty, n, id, "input ", false, range(|b| &b.inputs, i)));
    }
    for (j, ((n, ty), id)) in outputs.iter().zip(out_ids).enumerate() {
        s.push_str(&doc_line(
            ty,
            n,
            id,
            "output",
            bounded.contains(&j),
            range(|b| &b.outputs, j),
        ));
    }
    if let Some(b) = io.batch {
        s.push_str(&format!(
            " *\n * Batch: this model runs any batch of {}..{} samples (axis 0 of the tensors with a range above;\n * each buffer holds the samples one after another, n times the per-sample size given).\n * Run it with {p}_run_shaped, whose input shapes give the batch; {p}_run and {p}_run_generic\n * refuse. The size macros and {p}_input_shape/{p}_output_shape give one sample.\n",
            b.lo, b.hi
        ));
    }
    if !bounded.is_empty() {
        s.push_str(" *\n * Outputs marked \"at most\" have a size that depends on the data: their buffers need the\n * size given, the run writes their values first, and NAME_run_shaped reports their shape.\n".replace("NAME", p).as_str());
    }
    s.push_str(" *\n * The C names are the tensor names made valid, unique C and C++ identifiers; the size macros\n * below use them, NAME_info() and NAME_input_name() give the original names.\n");
    if api.cuda {
        s.push_str(&format!(
            " *\n * Link: {link}\n * The kernels run on an NVIDIA GPU. The CUDA driver (libcuda.so.1) is loaded with dlopen when a\n * context is created, so nothing CUDA is needed to build or link; -ldl is for dlopen (part of\n * the C library since glibc 2.34). Each context owns {arena_bytes} bytes of device memory for\n * intermediate values, plus the weights and a device copy of every input and output.\n"
        ));
        s.push_str(" * Contexts share nothing mutable, so several may run at once (one run per context at a time).\n */\n");
    } else {
        s.push_str(&format!(
            " *\n * Link: {link}\n * Each context owns {arena_bytes} bytes of working memory plus {thread_scratch_bytes} per thread;\n"
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
            "/* The weights are not in this library: they are in the file written at compile time as\n   {} (kiln compile --weights-out). {p}_create_with_weights maps that file read-only,\n   checks that it was written for this build (layout hash) and is intact (content hash), and\n   creates a context with num_threads threads (<= 0: one per online CPU). Returns NULL on\n   failure (a missing, foreign, truncated or corrupt file; a CPU that lacks a required\n   feature); {p}_last_error(NULL) says why. The mapping is released by {p}_destroy.\n   A file written by recompiling the same model with other weight values works too. */\n{p}_ctx *{p}_create_with_weights(const char *weights_path, int32_t num_threads);\n\n/* Fails for this build (the weights file is needed): use {p}_create_with_weights. */\n{p}_ctx *{p}_create(int32_t num_threads);\n\n",
            comment_text(file)
        )),
    }
    s.push_str(&format!(
        "/* Frees the context and all it owns; NULL is ignored. */\nvoid {p}_destroy({p}_ctx *ctx);\n\n"
    ));
    // One parameter a line, each with the tensor's original name and type.
    let mut params = vec![];
    for ((n, ty), id) in inputs.iter().zip(in_ids) {
        params.push((
            format!("const {} *{id}", c_type(ty.dtype)),
            format!("input {} {ty}", comment_text(n)),
        ));
    }
    for ((n, ty), id) in outputs.iter().zip(out_ids) {
        params.push((
            format!("{} *{id}", c_type(ty.dtype)),
            format!("output {} {ty}", comment_text(n)),
        ));
    }
    s.push_str(&format!(
        "/* Runs the model once. Returns 0 (and clears {p}_last_error(ctx)), or non-zero with\n   {p}_last_error(ctx) set. A NULL ctx or tensor pointer is an error, not a crash: with a NULL\n   ctx the message is {p}_last_error(NULL)'s. */\nint32_t {p}_run({p}_ctx *ctx"
    ));
    for (param, doc) in &params {
        s.push_str(&format!(",\n               {param} /* {doc} */"));
    }
    s.push_str(");\n\n");
    s.push_str(&format!(
        "/* Same, with inputs[i] / outputs[i] pointing at graph input / output i in the order above. */\nint32_t {p}_run_generic({p}_ctx *ctx, const void *const *inputs, void *const *outputs);\n\n"
    ));
    s.push_str(&format!(
        "/* Same as {p}_run_generic, with shapes: input_shapes[i] must be graph input i's shape above\n   (its rank entries; a different shape is an error naming the input); output_shapes[i], where\n   output_shapes and it are not NULL, receives output i's shape after the run. Outputs whose\n   size depends on the data (marked \"at most\" above) need buffers of the size above, which\n   bounds them; the run writes their values first and reports their actual shape here. */\nint32_t {p}_run_shaped({p}_ctx *ctx, const void *const *inputs, const int64_t *const *input_shapes,\n                       void *const *outputs, int64_t *const *output_shapes);\n\n"
    ));
    s.push_str(&format!(
        "/* Output i's shape after the last run of ctx, whichever run it was (the runs without shapes,\n   {p}_run_device above all): its rank entries into dims (NULL: only the rank). Before any run,\n   and for every output whose size does not depend on the data, the shape above. Returns the\n   rank, or -1 with {p}_last_error(ctx) set (i out of range; a NULL ctx: {p}_last_error(NULL)). */\nint32_t {p}_last_output_shape({p}_ctx *ctx, int32_t i, int64_t *dims);\n\n"
    ));
    s.push_str(&format!(
        "/* The last error of ctx (\"\" if none). With ctx NULL: why the last call on this thread that\n   had no context to record it in failed ({p}_create, or any call given a NULL ctx). That message\n   is thread-local: read it on the thread that made the failed call. */\nconst char *{p}_last_error({p}_ctx *ctx);\n\n"
    ));
    s.push_str(&format!("/* Bytes of working memory each context allocates (excluding per-thread scratch). */\nint64_t {p}_workspace_size(void);\n\n"));
    s.push_str(&format!("/* The signature as JSON: name, inputs, outputs (name, c_name: the C name above, dtype, shape), target. */\nconst char *{p}_info(void);\n\n"));
    s.push_str(&introspection_section(p, inputs, outputs, in_ids, out_ids));
    if api.cuda {
        s.push_str(&format!(
            "/* Runs the model on tensors already in device memory: d_inputs[i] / d_outputs[i] are device\n   pointers (CUdeviceptr values, e.g. from cuMemAlloc or cudaMalloc, in the context's CUDA\n   device's primary context) to graph input / output i, with the sizes above. stream is a\n   CUstream / cudaStream_t the work is queued on (NULL: the context's own stream); inputs must be\n   ready on it. The call synchronizes that stream before it returns: a failure found by a kernel\n   (an index read from an input out of range) is only known from device memory, and reporting it\n   in a later call would blame the wrong run. Returns 0 with the outputs complete, or non-zero\n   with {p}_last_error(ctx) set. {p}_run copies host tensors in and out around the same launches.\n   Outputs marked \"at most\" hold their values first; {p}_last_output_shape gives their shapes. */\nint32_t {p}_run_device({p}_ctx *ctx, const void *const *d_inputs, void *const *d_outputs, void *stream);\n\n"
        ));
    }
    if api.profile {
        s.push_str(&crate::profile::header_section(p));
    }
    s.push_str("#ifdef __cplusplus\n}\n#endif\n#endif\n");
    s
}

/// The signature without JSON: counts, names, dtypes and shapes by index, the dtype codes, and
/// per-tensor size macros.
fn introspection_section(
    p: &str,
    inputs: &[(String, TensorType)],
    outputs: &[(String, TensorType)],
    in_ids: &[String],
    out_ids: &[String],
) -> String {
    let up = p.to_uppercase();
    let mut s = format!(
        "/* The signature by index (i: 0 .. {p}_input_count() - 1, in the order above), without parsing\n   {p}_info()'s JSON. input_name returns the tensor's name in the model (NULL when i is out of\n   range); input_dtype its element type as {up}_DTYPE_* (ONNX's TensorProto.DataType codes; -1\n   out of range); input_shape its rank, writing the rank dimensions to dims when dims is not\n   NULL (-1 out of range). The output_* functions are the same for outputs. */\n"
    );
    for what in ["input", "output"] {
        s.push_str(&format!(
            "int32_t {p}_{what}_count(void);\nconst char *{p}_{what}_name(int32_t i);\nint32_t {p}_{what}_dtype(int32_t i);\nint32_t {p}_{what}_shape(int32_t i, int64_t *dims);\n"
        ));
    }
    s.push('\n');
    for dt in DType::ALL {
        s.push_str(&format!(
            "#define {up}_DTYPE_{} {}\n",
            dt.name().to_uppercase(),
            onnx_dtype(dt)
        ));
    }
    s.push_str(&format!(
        "\n#define {up}_NUM_INPUTS {}\n#define {up}_NUM_OUTPUTS {}\n\n",
        inputs.len(),
        outputs.len()
    ));
    s.push_str(
        "/* Elements and bytes of each tensor, by C name (a float16/bfloat16 element is 2 bytes). */\n",
    );
    for (what, items, ids) in [("INPUT", inputs, in_ids), ("OUTPUT", outputs, out_ids)] {
        for ((n, ty), id) in items.iter().zip(ids) {
            let shape = ty.fixed_shape().unwrap_or_default();
            let elems: usize = shape.iter().product();
            let id = id.to_uppercase();
            s.push_str(&format!(
                "#define {up}_{what}_{id}_ELEMENTS {elems}LL /* {} */\n#define {up}_{what}_{id}_BYTES {}LL\n",
                comment_text(n),
                ty.size_bytes().unwrap_or(0)
            ));
        }
    }
    s.push('\n');
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

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        let t = TensorType::fixed(DType::F32, &[1]);
        let items: Vec<(String, TensorType)> = list.iter().map(|n| (n.to_string(), t.clone())).collect();
        c_names("m", &items, &[])
    }

    #[test]
    fn c_names_are_unique_identifiers_and_never_reserved() {
        let list = [
            "class",
            "int",
            "a.b",
            "a_b",
            "A_B",
            "ctx",
            "return",
            "_x",
            "__y",
            "a..b",
            "0in",
            "",
            "size_t",
            "NULL",
            "INT8_MAX",
            "M_NUM_INPUTS",
            "x",
            "x_2",
        ];
        let got = names(&list);
        assert_eq!(got, names(&list), "deterministic");
        let mut lower: Vec<String> = got.iter().map(|s| s.to_ascii_lowercase()).collect();
        lower.sort();
        lower.dedup();
        assert_eq!(lower.len(), got.len(), "unique even upper-cased: {got:?}");
        for id in &got {
            assert!(!reserved(id, "M_"), "{id} is reserved");
            assert!(id.starts_with(|c: char| c.is_ascii_alphabetic()), "{id}");
            assert!(!id.contains("__") && !id.ends_with('_'), "{id}");
            assert!(id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "{id}");
        }
        // In graph order, the first of the names that sanitize alike keeps the plain form.
        assert_eq!((got[2].as_str(), got[3].as_str()), ("a_b", "a_b_2"));
        assert_eq!((got[7].as_str(), got[16].as_str()), ("x", "x_2"));
    }

    #[test]
    fn comment_text_cannot_end_a_comment_or_a_line() {
        let s = comment_text("a*/b/*c\nd\u{7f}\u{e9}\"\\??/");
        assert!(!s.contains("*/") && !s.contains("/*") && !s.contains("??"), "{s}");
        assert!(s.chars().all(|c| (' '..='~').contains(&c)), "{s}");
    }
}
