//! Micro-kernel lowering for the elementwise family (see `codegen/ukernels/elementwise.c`).
//!
//! Attribute layout (the C side reads the same order):
//! - `ew_unary`: iattr `[op, detect_positive, detect_negative]`, fattr `[p0, p1]` (the
//!   operator's parameters: alpha/beta, alpha/gamma, bias/lambd; 0 when unused).
//! - `ew_binary`: iattr `[op]`.
//! - `ew_where`, `ew_clip`, `ew_cast`: no attributes (Clip reads its bounds from its inputs,
//!   Cast its target from the output's dtype).
//!
//! Broadcasting is resolved in C from the tensors' static dims.

use super::UkCall;
use crate::error::Result;
use crate::node::NodeInfo;
use kiln_ir::{Op, Unary};

/// The most axes the C kernels' broadcast plan holds (`EW_MAXR`).
const MAX_RANK: usize = 16;

pub fn lower(node: &NodeInfo) -> Result<Option<UkCall>> {
    let call = match node.op() {
        Op::Unary(u) => unary(u),
        Op::Binary(b) => UkCall::new("ew_binary").iattr([b.kernel_code()]),
        Op::Where => UkCall::new("ew_where"),
        Op::Clip => UkCall::new("ew_clip"),
        Op::Cast { .. } => UkCall::new("ew_cast"),
        _ => return Ok(None),
    };
    let rank = node.output_shape(0)?.len();
    if rank > MAX_RANK {
        return Err(node.unsupported(format!(
            "rank {rank} is above the {MAX_RANK} axes the elementwise kernels support"
        )));
    }
    for i in 0..node.n_inputs() {
        if node.has_input(i) {
            node.input_shape(i)?;
        }
    }
    Ok(Some(call))
}

/// The unary kernel's operator code and parameters come from the operator table
/// (`kiln_ir::ops::unary`), which also generates the C enum they index.
fn unary(u: &Unary) -> UkCall {
    let k = u.kernel_call();
    UkCall::new("ew_unary")
        .iattr([k.code, k.flags[0].into(), k.flags[1].into()])
        .fattr(k.params.map(f64::from))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::ops::unary::KERNEL_OPS;
    use kiln_ir::Binary;

    /// The C kernel library's elementwise source, as compiled into every artifact.
    const C_SOURCE: &str = include_str!("../../ukernels/elementwise.c");

    /// The operator constants the C source handles with the `CASE(NAME, f32 form, double
    /// form)` list of real-valued functions, and with plain `case NAME:` labels.
    fn c_cases(prefix: &str) -> (Vec<String>, Vec<String>) {
        let names = |marker: &str| -> Vec<String> {
            C_SOURCE
                .match_indices(marker)
                .map(|(i, _)| {
                    let rest = &C_SOURCE[i + marker.len()..];
                    let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
                    rest[..end.unwrap_or(rest.len())].to_string()
                })
                .filter(|n| n.starts_with(prefix))
                .collect()
        };
        (names("CASE("), names("case "))
    }

    #[test]
    fn the_operator_tables_and_the_c_kernel_library_agree() {
        let (real_cases, labels) = c_cases("U_");
        for u in Unary::every_form() {
            let name = KERNEL_OPS[u.kernel_call().code as usize];
            if u.real().is_some() {
                assert!(
                    real_cases.iter().any(|c| c == name),
                    "{} ({name}) has a real function in the operator table but no \
                     CASE({name}, f32 form, double form) in EW_REAL_UNARY (elementwise.c)",
                    u.name()
                );
            } else {
                // Predicates and bitwise operators have code of their own.
                assert!(
                    labels.iter().any(|c| c == name) || C_SOURCE.contains(&format!("op == {name}")),
                    "{} ({name}) is not real-valued and has no code in elementwise.c",
                    u.name()
                );
            }
        }
        for c in real_cases.iter().chain(&labels) {
            assert!(
                KERNEL_OPS.contains(&c.as_str()),
                "elementwise.c handles {c}, which no row of the unary operator table declares"
            );
        }
        let (_, binary_labels) = c_cases("B_");
        for op in Binary::KERNEL_OPS {
            assert!(
                binary_labels.iter().any(|c| c == op)
                    || C_SOURCE.contains(&format!("EW_D2({op},"))
                    || C_SOURCE.contains(&format!("EW_I2({op},")),
                "elementwise.c does not handle {op}"
            );
        }
        // `ew_is_cmp` tests a range: the comparisons must stay contiguous in the table.
        let code = |c: &str| Binary::KERNEL_OPS.iter().position(|k| *k == c).unwrap();
        assert_eq!(
            code("B_GE") - code("B_EQ"),
            4,
            "Equal..GreaterOrEqual must be contiguous"
        );
    }

    /// docs/design.md's "Adding an operator" shows a table row and its C case: both must be
    /// the files' text, so the worked example cannot drift from the code.
    #[test]
    fn the_design_docs_worked_example_is_the_code() {
        let doc = include_str!("../../../docs/design.md");
        let section = &doc[doc.find("## Adding an operator").expect("the section")..];
        let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
        let table = include_str!("../../../ir/src/ops/unary_table.rs");
        let mut checked = 0;
        for (fence, file) in [("```rust\n", table), ("```c\n", C_SOURCE)] {
            let start = section.find(fence).expect("a code block") + fence.len();
            let block = &section[start..start + section[start..].find("```").unwrap()];
            assert!(
                file.contains(block),
                "the design doc's example is not in the source any more:\n{block}"
            );
            checked += 1;
        }
        assert_eq!(checked, 2);
    }

    #[test]
    fn unary_attributes_are_packed_for_the_kernel() {
        let c = unary(&Unary::IsInf {
            detect_positive: true,
            detect_negative: false,
        });
        assert_eq!(KERNEL_OPS[c.iattr[0] as usize], "U_ISINF");
        assert_eq!(&c.iattr[1..], &[1, 0]);
        let c = unary(&Unary::Selu {
            alpha: 2.0,
            gamma: 0.5,
        });
        assert_eq!(c.fattr, vec![2.0, 0.5]);
        assert_eq!(
            Binary::KERNEL_OPS[Binary::PRelu.kernel_code() as usize],
            "B_PRELU"
        );
    }
}
