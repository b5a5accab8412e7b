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
