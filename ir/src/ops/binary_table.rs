// The binary operator table: one row per element-wise function of two tensors with
// multidirectional (numpy) broadcasting. The `c_enum` constants are those of
// `kiln_uk_ew_binary` in codegen/ukernels/elementwise.c, generated into `kiln_uk_ops.h` by
// codegen's build script in this table's order.
//
// The comparisons Equal..GreaterOrEqual stay contiguous: the C kernels test the range.
//
// Row grammar (macro `binary_ops!` in binary.rs):  /// doc  Variant: "Name", c_enum [C_NAME];
binary_ops! {
    Add: "Add", c_enum [B_ADD];
    Sub: "Sub", c_enum [B_SUB];
    Mul: "Mul", c_enum [B_MUL];
    /// Integer division truncates toward zero (C semantics, as onnxruntime).
    Div: "Div", c_enum [B_DIV];
    Pow: "Pow", c_enum [B_POW];
    /// `Mod` with `fmod=0`: result has the sign of the divisor (Python `%`). Integers only
    /// in ONNX; floats are accepted and follow the same rule.
    Mod: "Mod", c_enum [B_MOD];
    /// `Mod` with `fmod=1`: result has the sign of the dividend (C `fmod`).
    FMod: "FMod", c_enum [B_FMOD];
    /// NaN-propagating minimum.
    Min: "Min", c_enum [B_MIN];
    /// NaN-propagating maximum.
    Max: "Max", c_enum [B_MAX];
    /// Output bool.
    Equal: "Equal", c_enum [B_EQ];
    Less: "Less", c_enum [B_LT];
    LessOrEqual: "LessOrEqual", c_enum [B_LE];
    Greater: "Greater", c_enum [B_GT];
    GreaterOrEqual: "GreaterOrEqual", c_enum [B_GE];
    /// Bool inputs and output.
    And: "And", c_enum [B_AND];
    Or: "Or", c_enum [B_OR];
    Xor: "Xor", c_enum [B_XOR];
    BitShiftLeft: "BitShiftLeft", c_enum [B_SHL];
    BitShiftRight: "BitShiftRight", c_enum [B_SHR];
    BitwiseAnd: "BitwiseAnd", c_enum [B_BITAND];
    BitwiseOr: "BitwiseOr", c_enum [B_BITOR];
    BitwiseXor: "BitwiseXor", c_enum [B_BITXOR];
    /// `x < 0 ? slope * x : x`, slope broadcast to x (unidirectional).
    PRelu: "PRelu", c_enum [B_PRELU];
}
