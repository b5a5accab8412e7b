//! The integer codes codegen passes to the C kernel library (`iattr` entries that select a
//! behaviour), declared once. codegen's build script reads every `c_enum [...]` list of this
//! file and writes it into `kiln_uk_ops.h` as a C enum in the same order, so the kernels in
//! `codegen/ukernels/` switch on the names and no number is kept in step by hand. (The
//! elementwise operators' codes come from `ir/src/ops/{unary,binary}_table.rs` the same way.)
//!
//! Row grammar (macro `c_enums!` below; the build script reads the text):
//!     /// doc
//!     RustName: c_enum [C_NAME, ...];
//! The Rust enum's variants are the C names, so `ReduceCode::K_SUM` in Rust is `K_SUM` in C.

macro_rules! c_enums {
    ($( $(#[$doc:meta])* $Name:ident : c_enum [$($c:ident),+ $(,)?]; )*) => {
        $(
            $(#[$doc])*
            #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
            #[derive(Clone, Copy, Debug, PartialEq, Eq)]
            pub enum $Name { $($c),+ }

            impl $Name {
                /// The value the C kernel reads.
                pub const fn code(self) -> i64 {
                    self as i64
                }
            }
        )*

        /// Every set: its Rust name and its (C name, code) pairs, for the test that compares
        /// them with the generated header.
        #[cfg(test)]
        const ALL: &[(&str, &[(&str, i64)])] =
            &[$((stringify!($Name), &[$((stringify!($c), $Name::$c.code())),+])),*];
    };
}

c_enums! {
    /// `kiln_uk_reduce`'s kind (iattr[0], reduce.c).
    ReduceCode: c_enum [K_SUM, K_MEAN, K_MAX, K_MIN, K_PROD, K_L1, K_L2, K_LOGSUM, K_LSE, K_SUMSQ];
    /// `kiln_uk_softmax`'s kind (iattr[3], reduce.c).
    SoftmaxCode: c_enum [SM_SOFTMAX, SM_LOG, SM_HARD];
    /// `kiln_uk_loss`'s reduction (iattr[4], reduce.c).
    LossCode: c_enum [LOSS_NONE, LOSS_SUM, LOSS_MEAN];
    /// `kiln_uk_rnn`'s cell (iattr[0], misc.c).
    RnnCode: c_enum [RNN_RNN, RNN_GRU, RNN_LSTM];
    /// `kiln_uk_rnn`'s activation functions (the act codes after n_act, misc.c).
    RnnActCode: c_enum [
        RA_RELU, RA_TANH, RA_SIGMOID, RA_AFFINE, RA_LEAKY_RELU, RA_THRESHOLDED_RELU,
        RA_SCALED_TANH, RA_HARD_SIGMOID, RA_ELU, RA_SOFTSIGN, RA_SOFTPLUS
    ];
    /// `kiln_uk_window`'s window (iattr[0], misc.c).
    WindowCode: c_enum [WIN_HANN, WIN_HAMMING, WIN_BLACKMAN];
    /// The accumulation type of MatMul/Gemm (nn.c): codegen sizes the scratch with the same
    /// rule the kernel uses to choose it.
    AccCode: c_enum [ACC_F32, ACC_F64, ACC_I64];
    /// The scatter kernels' reduction (iattr[0] of `kiln_uk_scatter_nd` and
    /// `kiln_uk_scatter_elements`, movement.c).
    ScatterCode: c_enum [SC_NONE, SC_ADD, SC_MUL, SC_MAX, SC_MIN];
    /// `kiln_uk_grid_sample`'s interpolation mode (iattr[1], movement.c).
    GridModeCode: c_enum [GS_LINEAR, GS_NEAREST, GS_CUBIC];
    /// `kiln_uk_grid_sample`'s padding mode (iattr[2], movement.c).
    GridPadCode: c_enum [GS_ZEROS, GS_BORDER, GS_REFLECTION];
    /// The attention kernels' mask (`kiln_uk_attention` iattr[17], `kiln_uk_attention_f32`
    /// iattr[9], nn.c): none, bool (false masks), or float (added to the scores).
    MaskCode: c_enum [MASK_NONE, MASK_BOOL, MASK_FLOAT];
    /// How a quantization scale or zero point maps onto the tensor (the first entry of a
    /// parameter layout, misc.c `param_index`).
    QuantParamCode: c_enum [QP_TENSOR, QP_AXIS, QP_BLOCKED];
}

#[cfg(test)]
mod tests {
    use super::ALL;
    use kiln_ir::ops::unary::KERNEL_OPS;
    use kiln_ir::Binary;

    /// The header build.rs generated, as the C kernels compiled into this build include it.
    const HEADER: &str = include_str!(concat!(env!("OUT_DIR"), "/kiln_uk_ops.h"));

    /// The C kernel library's sources.
    const C_SOURCES: &[(&str, &str)] = &[
        ("elementwise.c", include_str!("../../ukernels/elementwise.c")),
        ("reduce.c", include_str!("../../ukernels/reduce.c")),
        ("movement.c", include_str!("../../ukernels/movement.c")),
        ("nn.c", include_str!("../../ukernels/nn.c")),
        ("attention_f32.c", include_str!("../../ukernels/attention_f32.c")),
        ("misc.c", include_str!("../../ukernels/misc.c")),
        ("kiln_uk.h", include_str!("../../ukernels/kiln_uk.h")),
        ("kiln_math.h", include_str!("../../ukernels/kiln_math.h")),
    ];

    /// The names of each anonymous `enum { ... };` of C `text`, in order.
    fn c_enums(text: &str) -> Vec<Vec<String>> {
        text.match_indices("enum {")
            .map(|(i, _)| {
                let body = &text[i + "enum {".len()..];
                let body = &body[..body.find('}').expect("an enum without '}'")];
                body.split(',')
                    .map(|n| n.split('=').next().unwrap().trim().to_string())
                    .filter(|n| !n.is_empty())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn the_generated_header_numbers_every_code_as_rust_does() {
        let header = c_enums(HEADER);
        let mut expected: Vec<Vec<(String, i64)>> = vec![];
        for ops in [KERNEL_OPS, Binary::KERNEL_OPS] {
            // Rust passes a table operator's index in its list (`Unary::kernel_call`,
            // `Binary::kernel_code`).
            expected.push(
                ops.iter()
                    .enumerate()
                    .map(|(i, n)| (n.to_string(), i as i64))
                    .collect(),
            );
        }
        for (_, codes) in ALL {
            expected.push(codes.iter().map(|&(n, c)| (n.to_string(), c)).collect());
        }
        assert_eq!(header.len(), expected.len(), "one C enum per code set:\n{HEADER}");
        for (names, codes) in header.iter().zip(&expected) {
            // A C enum without initializers numbers its names 0, 1, 2, ...
            let c: Vec<(String, i64)> = names
                .iter()
                .enumerate()
                .map(|(i, n)| (n.clone(), i as i64))
                .collect();
            assert_eq!(&c, codes, "the generated header and the Rust codes disagree");
        }
    }

    /// The element type codes are not generated: `enum kiln_dtype` is the runtime's public
    /// ABI (`runtime-stub/c/kiln_rt.h`, explicit values that never change), and codegen
    /// passes `DType as i64`. This holds the two together.
    #[test]
    fn the_runtime_dtype_codes_are_the_dtype_order() {
        let rt = include_str!("../../../runtime-stub/c/kiln_rt.h");
        let body = &rt[rt.find("enum kiln_dtype {").expect("enum kiln_dtype")..];
        let body = &body[body.find('{').unwrap() + 1..body.find('}').unwrap()];
        let c: Vec<(String, i64)> = body
            .split(',')
            .filter(|e| !e.trim().is_empty())
            .map(|e| {
                let (n, v) = e.split_once('=').expect("an explicit value");
                (n.trim().to_string(), v.trim().parse().unwrap())
            })
            .collect();
        let rust: Vec<(String, i64)> = kiln_ir::DType::ALL
            .iter()
            .map(|&d| (format!("KILN_{}", format!("{d:?}").to_uppercase()), d as i64))
            .collect();
        assert_eq!(c, rust, "kiln_rt.h's enum kiln_dtype and kiln_ir::DType disagree");
    }

    /// The C sources use the generated names and keep no copy of their own.
    #[test]
    fn no_c_source_declares_a_generated_code() {
        let generated: Vec<String> = c_enums(HEADER).into_iter().flatten().collect();
        for (file, text) in C_SOURCES {
            for names in c_enums(text) {
                for n in names {
                    assert!(
                        !generated.contains(&n),
                        "{file} declares {n}, which kiln_uk_ops.h generates from the Rust side"
                    );
                }
            }
            for n in &generated {
                assert!(
                    !text.contains(&format!("#define {n} ")),
                    "{file} defines {n}, which kiln_uk_ops.h generates from the Rust side"
                );
            }
        }
        // Every set is used by the C side.
        for (name, codes) in ALL {
            assert!(
                codes
                    .iter()
                    .any(|(c, _)| C_SOURCES.iter().any(|(_, t)| t.contains(c))),
                "no C source uses {name}"
            );
        }
    }
}
