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
use kiln_ir::{Binary, Op, Unary};

/// The most axes the C kernels' broadcast plan holds (`EW_MAXR`).
const MAX_RANK: usize = 16;

pub fn lower(node: &NodeInfo) -> Result<Option<UkCall>> {
    let call = match node.op() {
        Op::Unary(u) => unary(u),
        Op::Binary(b) => UkCall::new("ew_binary").iattr([binary_code(*b)]),
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

fn unary(u: &Unary) -> UkCall {
    let (code, p0, p1, flags) = match *u {
        Unary::Abs => (0, 0.0, 0.0, (0, 0)),
        Unary::Neg => (1, 0.0, 0.0, (0, 0)),
        Unary::Floor => (2, 0.0, 0.0, (0, 0)),
        Unary::Ceil => (3, 0.0, 0.0, (0, 0)),
        Unary::Round => (4, 0.0, 0.0, (0, 0)),
        Unary::Reciprocal => (5, 0.0, 0.0, (0, 0)),
        Unary::Sign => (6, 0.0, 0.0, (0, 0)),
        Unary::Sqrt => (7, 0.0, 0.0, (0, 0)),
        Unary::Exp => (8, 0.0, 0.0, (0, 0)),
        Unary::Log => (9, 0.0, 0.0, (0, 0)),
        Unary::Erf => (10, 0.0, 0.0, (0, 0)),
        Unary::Tanh => (11, 0.0, 0.0, (0, 0)),
        Unary::Sigmoid => (12, 0.0, 0.0, (0, 0)),
        Unary::Relu => (13, 0.0, 0.0, (0, 0)),
        Unary::Sin => (14, 0.0, 0.0, (0, 0)),
        Unary::Cos => (15, 0.0, 0.0, (0, 0)),
        Unary::Tan => (16, 0.0, 0.0, (0, 0)),
        Unary::Asin => (17, 0.0, 0.0, (0, 0)),
        Unary::Acos => (18, 0.0, 0.0, (0, 0)),
        Unary::Atan => (19, 0.0, 0.0, (0, 0)),
        Unary::Sinh => (20, 0.0, 0.0, (0, 0)),
        Unary::Cosh => (21, 0.0, 0.0, (0, 0)),
        Unary::Asinh => (22, 0.0, 0.0, (0, 0)),
        Unary::Acosh => (23, 0.0, 0.0, (0, 0)),
        Unary::Atanh => (24, 0.0, 0.0, (0, 0)),
        Unary::Not => (25, 0.0, 0.0, (0, 0)),
        Unary::BitwiseNot => (26, 0.0, 0.0, (0, 0)),
        Unary::IsNaN => (27, 0.0, 0.0, (0, 0)),
        Unary::IsInf {
            detect_positive,
            detect_negative,
        } => (28, 0.0, 0.0, (detect_positive.into(), detect_negative.into())),
        Unary::Softplus => (29, 0.0, 0.0, (0, 0)),
        Unary::Softsign => (30, 0.0, 0.0, (0, 0)),
        Unary::Mish => (31, 0.0, 0.0, (0, 0)),
        Unary::HardSwish => (32, 0.0, 0.0, (0, 0)),
        Unary::LeakyRelu { alpha } => (33, alpha, 0.0, (0, 0)),
        Unary::Elu { alpha } => (34, alpha, 0.0, (0, 0)),
        Unary::Selu { alpha, gamma } => (35, alpha, gamma, (0, 0)),
        Unary::Celu { alpha } => (36, alpha, 0.0, (0, 0)),
        Unary::HardSigmoid { alpha, beta } => (37, alpha, beta, (0, 0)),
        Unary::ThresholdedRelu { alpha } => (38, alpha, 0.0, (0, 0)),
        Unary::Gelu { tanh: false } => (39, 0.0, 0.0, (0, 0)),
        Unary::Gelu { tanh: true } => (40, 0.0, 0.0, (0, 0)),
        Unary::Shrink { bias, lambd } => (41, bias, lambd, (0, 0)),
        Unary::Swish { alpha } => (42, alpha, 0.0, (0, 0)),
    };
    UkCall::new("ew_unary")
        .iattr([code, flags.0, flags.1])
        .fattr([f64::from(p0), f64::from(p1)])
}

fn binary_code(b: Binary) -> i64 {
    match b {
        Binary::Add => 0,
        Binary::Sub => 1,
        Binary::Mul => 2,
        Binary::Div => 3,
        Binary::Pow => 4,
        Binary::Mod => 5,
        Binary::FMod => 6,
        Binary::Min => 7,
        Binary::Max => 8,
        Binary::Equal => 9,
        Binary::Less => 10,
        Binary::LessOrEqual => 11,
        Binary::Greater => 12,
        Binary::GreaterOrEqual => 13,
        Binary::And => 14,
        Binary::Or => 15,
        Binary::Xor => 16,
        Binary::BitShiftLeft => 17,
        Binary::BitShiftRight => 18,
        Binary::BitwiseAnd => 19,
        Binary::BitwiseOr => 20,
        Binary::BitwiseXor => 21,
        Binary::PRelu => 22,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_match_the_c_enums() {
        // The C enums list the operators in Unary's and Binary's declaration order.
        assert_eq!(unary(&Unary::Swish { alpha: 1.0 }).iattr[0], 42);
        assert_eq!(binary_code(Binary::PRelu), 22);
        let c = unary(&Unary::IsInf {
            detect_positive: true,
            detect_negative: false,
        });
        assert_eq!(c.iattr, vec![28, 1, 0]);
        assert_eq!(c.fattr.len(), 2);
    }
}
