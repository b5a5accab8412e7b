//! The runtime stub linked into every kiln artifact lives in `c/` (C, compiled to LLVM bitcode
//! by kiln-codegen's build script and linked into each model's module). This crate is its Rust
//! side: the ABI constants and layouts codegen emits against, kept equal to `c/kiln_rt.h`.

/// `enum kiln_dtype`: the code of each `kiln_ir::DType`, in declaration order.
pub const DTYPE_NAMES: [&str; 13] = [
    "bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "float16", "bfloat16",
    "float32", "float64",
];

/// The C header, for tools that want to show or ship it.
pub const KILN_RT_H: &str = include_str!("../c/kiln_rt.h");

/// `kiln_kernel_desc`: one entry of the kernel table at the end of `kiln_model_desc` (what
/// codegen's profile.rs emits).
#[repr(C)]
pub struct KernelDesc {
    pub name: *const std::ffi::c_char,
    pub op: *const std::ffi::c_char,
    pub implementation: *const std::ffi::c_char,
    pub n_nodes: i32,
    pub nodes: *const *const std::ffi::c_char,
    pub flops: i64,
}

/// `kiln_profile_kernel`: one row of a context's profile (and `NAME_profile_kernel` of a
/// library's header, which has the same layout).
#[repr(C)]
pub struct ProfileKernel {
    pub name: *const std::ffi::c_char,
    pub op: *const std::ffi::c_char,
    pub n_nodes: i32,
    pub nodes: *const *const std::ffi::c_char,
    pub calls: i64,
    pub total_ns: i64,
    pub flops: i64,
}

/// The weights file of a build compiled with `--weights-out` (a safetensors file): the names
/// codegen writes and `c/weights.c` reads.
pub mod weights {
    /// The one tensor: the packed weights blob as `U8[bytes]`.
    pub const TENSOR: &str = "weights";
    pub const META_MODEL: &str = "kiln.model";
    pub const META_VERSION: &str = "kiln.version";
    pub const META_LAYOUT_HASH: &str = "kiln.layout_hash";
    pub const META_CONTENT_HASH: &str = "kiln.content_hash";
    pub const META_BYTES: &str = "kiln.bytes";
    /// The C reader, to check it uses the same names.
    pub const WEIGHTS_C: &str = include_str!("../c/weights.c");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_dtype_codes_match() {
        let codes = [
            "KILN_BOOL = 0",
            "KILN_U8 = 1",
            "KILN_I8 = 2",
            "KILN_U16 = 3",
            "KILN_I16 = 4",
            "KILN_U32 = 5",
            "KILN_I32 = 6",
            "KILN_U64 = 7",
            "KILN_I64 = 8",
            "KILN_F16 = 9",
            "KILN_BF16 = 10",
            "KILN_F32 = 11",
            "KILN_F64 = 12",
        ];
        for c in codes {
            assert!(KILN_RT_H.contains(c), "{c} missing from kiln_rt.h");
        }
        assert_eq!(DTYPE_NAMES.len(), codes.len());
    }

    /// The fields of a C struct declaration in the header, in order.
    fn c_fields(name: &str) -> Vec<String> {
        let start = KILN_RT_H
            .find(&format!("typedef struct {name} {{"))
            .unwrap_or_else(|| panic!("{name} missing"));
        let mut body = &KILN_RT_H[start..];
        body = &body[body.find('{').unwrap() + 1..body.find("\n}").unwrap()];
        let mut code = String::new();
        while let Some(c) = body.find("/*") {
            code.push_str(&body[..c]);
            body = &body[c + body[c..].find("*/").unwrap() + 2..];
        }
        code.push_str(body);
        let ident = |s: &str| {
            s.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .rfind(|w| !w.is_empty())
                .map(str::to_string)
        };
        code.split(';')
            .filter_map(|decl| match decl.find("(*") {
                // A function pointer: `int32_t (*run)(...)`.
                Some(p) => ident(&decl[p + 2..p + 2 + decl[p..].find(')').unwrap() - 2]),
                None => ident(decl),
            })
            .collect()
    }

    #[test]
    fn profile_structs_match() {
        assert_eq!(
            c_fields("kiln_kernel_desc"),
            ["name", "op", "impl", "n_nodes", "nodes", "flops"]
        );
        assert_eq!(std::mem::size_of::<KernelDesc>(), 48);
        assert_eq!(
            c_fields("kiln_profile_kernel"),
            ["name", "op", "n_nodes", "nodes", "calls", "total_ns", "flops"]
        );
        assert_eq!(std::mem::size_of::<ProfileKernel>(), 56);
        // The kernel table follows `run`, then the weights file's description, the CUDA
        // description and the batch range (codegen's emit/descriptor.rs writes them in this
        // order).
        let desc = c_fields("kiln_model_desc");
        assert_eq!(
            &desc[desc.len() - 5..],
            ["run", "kernels", "weights", "cuda", "batch"]
        );
        assert_eq!(c_fields("kiln_batch_desc"), ["lo", "hi", "inputs", "outputs"]);
    }

    #[test]
    fn weights_reader_uses_the_writers_names() {
        use weights::*;
        for key in [
            META_MODEL,
            META_VERSION,
            META_LAYOUT_HASH,
            META_CONTENT_HASH,
            META_BYTES,
        ] {
            assert!(
                WEIGHTS_C.contains(&format!("\"{key}\"")),
                "{key} missing from weights.c"
            );
        }
        assert!(KILN_RT_H.contains("kiln_rt_create_with_weights"));
    }
}
