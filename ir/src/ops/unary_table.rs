// The unary operator table: one row per element-wise function of one tensor. Everything kiln
// knows about such an operator is declared here, and read from here by the frontend (name,
// opset, attributes), type inference (accepted and returned types), the reference interpreter
// (`real`), the bf16 autocast pass (`bf16`) and the C kernel library (the `c_enum` constants,
// generated into `kiln_uk_ops.h` by codegen's build script in this table's order). See
// "Adding an operator" in docs/design.md.
//
// Row grammar (macro `unary_ops!` in unary.rs):
//
//   /// doc
//   Variant { field: f32 = ONNX default, flag: bool = default }: "OnnxName" since OPSET,
//       accepts KIND [returns Bool], bf16 exact|f32,
//       c_enum [C_NAME, ...] [, select INDEX] [, params [field, field]] [, flags [field, field]]
//       [, import |attrs| ...] [, real |x| ...];
//
// - `accepts`: Float, Int, SignedOrFloat, Numeric, Bool (the input types type inference admits).
// - `bf16 exact`: the function is exact on bf16 inputs (piecewise linear, predicates), so the
//   autocast pass lets it follow its producer's precision; `bf16 f32` keeps it in f32.
// - `c_enum`: the constants of `kiln_uk_ew_unary` in codegen/ukernels/elementwise.c; `select`
//   picks one when the attributes choose between forms. `params` become the kernel's float
//   attributes p0, p1, `flags` its integer attributes.
// - Fields are read from the ONNX attributes of the same name with the given defaults, unless
//   `import` builds the operator itself (validation, string attributes).
// - `real`: the function in f64, with the fields in scope. Rows without it (predicates, bitwise
//   operators) are evaluated by `ops::elementwise`.
unary_ops! {
    /// |x|; integers wrap (|MIN| = MIN).
    Abs: "Abs" since 1, accepts Numeric, bf16 exact, c_enum [U_ABS], real f64::abs;
    Neg: "Neg" since 1, accepts SignedOrFloat, bf16 exact, c_enum [U_NEG], real |x: f64| -x;
    Floor: "Floor" since 1, accepts Float, bf16 exact, c_enum [U_FLOOR], real f64::floor;
    Ceil: "Ceil" since 1, accepts Float, bf16 exact, c_enum [U_CEIL], real f64::ceil;
    /// Round half to even.
    Round: "Round" since 11, accepts Float, bf16 exact, c_enum [U_ROUND], real f64::round_ties_even;
    Reciprocal: "Reciprocal" since 1, accepts Float, bf16 f32, c_enum [U_RECIPROCAL],
        real |x: f64| 1.0 / x;
    /// -1, 0 or 1; ±0 and NaN map to themselves.
    Sign: "Sign" since 9, accepts Numeric, bf16 exact, c_enum [U_SIGN],
        real |x: f64| if x > 0.0 { 1.0 } else if x < 0.0 { -1.0 } else { x };
    Sqrt: "Sqrt" since 1, accepts Float, bf16 f32, c_enum [U_SQRT], real f64::sqrt;
    Exp: "Exp" since 1, accepts Float, bf16 f32, c_enum [U_EXP], real f64::exp;
    Log: "Log" since 1, accepts Float, bf16 f32, c_enum [U_LOG], real f64::ln;
    /// Integers were accepted up to opset 12; they are evaluated in f64 and cast back.
    Erf: "Erf" since 9, accepts Numeric, bf16 f32, c_enum [U_ERF], real erf;
    Tanh: "Tanh" since 1, accepts Float, bf16 f32, c_enum [U_TANH], real f64::tanh;
    Sigmoid: "Sigmoid" since 1, accepts Float, bf16 f32, c_enum [U_SIGMOID], real sigmoid;
    Relu: "Relu" since 1, accepts SignedOrFloat, bf16 exact, c_enum [U_RELU],
        real |x: f64| if x < 0.0 { 0.0 } else { x };
    Sin: "Sin" since 7, accepts Float, bf16 f32, c_enum [U_SIN], real f64::sin;
    Cos: "Cos" since 7, accepts Float, bf16 f32, c_enum [U_COS], real f64::cos;
    Tan: "Tan" since 7, accepts Float, bf16 f32, c_enum [U_TAN], real f64::tan;
    Asin: "Asin" since 7, accepts Float, bf16 f32, c_enum [U_ASIN], real f64::asin;
    Acos: "Acos" since 7, accepts Float, bf16 f32, c_enum [U_ACOS], real f64::acos;
    Atan: "Atan" since 7, accepts Float, bf16 f32, c_enum [U_ATAN], real f64::atan;
    Sinh: "Sinh" since 9, accepts Float, bf16 f32, c_enum [U_SINH], real f64::sinh;
    Cosh: "Cosh" since 9, accepts Float, bf16 f32, c_enum [U_COSH], real f64::cosh;
    Asinh: "Asinh" since 9, accepts Float, bf16 f32, c_enum [U_ASINH], real f64::asinh;
    Acosh: "Acosh" since 9, accepts Float, bf16 f32, c_enum [U_ACOSH], real f64::acosh;
    Atanh: "Atanh" since 9, accepts Float, bf16 f32, c_enum [U_ATANH], real f64::atanh;
    /// Logical not (bool → bool).
    Not: "Not" since 1, accepts Bool, bf16 exact, c_enum [U_NOT];
    BitwiseNot: "BitwiseNot" since 18, accepts Int, bf16 exact, c_enum [U_BITWISE_NOT];
    IsNaN: "IsNaN" since 9, accepts Float returns Bool, bf16 exact, c_enum [U_ISNAN];
    IsInf { detect_positive: bool = true, detect_negative: bool = true }: "IsInf" since 10,
        accepts Float returns Bool, bf16 exact,
        c_enum [U_ISINF], flags [detect_positive, detect_negative];
    Softplus: "Softplus" since 1, accepts Float, bf16 f32, c_enum [U_SOFTPLUS], real softplus;
    Softsign: "Softsign" since 1, accepts Float, bf16 f32, c_enum [U_SOFTSIGN],
        real |x: f64| x / (1.0 + x.abs());
    Mish: "Mish" since 18, accepts Float, bf16 f32, c_enum [U_MISH],
        real |x: f64| x * softplus(x).tanh();
    /// `x * clamp(x/6 + 1/2, 0, 1)`.
    HardSwish: "HardSwish" since 14, accepts Float, bf16 f32, c_enum [U_HARDSWISH],
        real |x: f64| x * (x / 6.0 + 0.5).clamp(0.0, 1.0);
    LeakyRelu { alpha: f32 = 0.01 }: "LeakyRelu" since 1, accepts Float, bf16 exact,
        c_enum [U_LEAKY_RELU], params [alpha],
        real move |x: f64| if x < 0.0 { f64::from(alpha) * x } else { x };
    Elu { alpha: f32 = 1.0 }: "Elu" since 1, accepts Float, bf16 f32,
        c_enum [U_ELU], params [alpha],
        real move |x: f64| if x < 0.0 { f64::from(alpha) * x.exp_m1() } else { x };
    /// Defaults of opset 6 and later (opset 1 had rounder constants).
    Selu { alpha: f32 = 1.673_263_2, gamma: f32 = 1.050_701 }: "Selu" since 1,
        accepts Float, bf16 f32, c_enum [U_SELU], params [alpha, gamma],
        real move |x: f64| {
            let (alpha, gamma) = (f64::from(alpha), f64::from(gamma));
            if x > 0.0 { gamma * x } else { gamma * alpha * x.exp_m1() }
        };
    /// max(0,x) + min(0, alpha·(exp(x/alpha) − 1)), written so that NaN propagates.
    Celu { alpha: f32 = 1.0 }: "Celu" since 12, accepts Float, bf16 f32,
        c_enum [U_CELU], params [alpha],
        import |a: &dyn UnaryAttrs| {
            let alpha = a.float("alpha", 1.0);
            if alpha == 0.0 {
                return Err("attribute 'alpha' must be nonzero".to_string());
            }
            Ok(Unary::Celu { alpha })
        },
        real move |x: f64| {
            let alpha = f64::from(alpha);
            if x > 0.0 { x } else { alpha * (x / alpha).exp_m1() }
        };
    /// `clamp(alpha·x + beta, 0, 1)`; `clamp` keeps NaN (`f64::max`/`min` would drop it).
    HardSigmoid { alpha: f32 = 0.2, beta: f32 = 0.5 }: "HardSigmoid" since 1,
        accepts Float, bf16 f32, c_enum [U_HARD_SIGMOID], params [alpha, beta],
        real move |x: f64| (f64::from(alpha) * x + f64::from(beta)).clamp(0.0, 1.0);
    ThresholdedRelu { alpha: f32 = 1.0 }: "ThresholdedRelu" since 10, accepts Float, bf16 exact,
        c_enum [U_THRESHOLDED_RELU], params [alpha],
        real move |x: f64| if x > f64::from(alpha) { x } else { 0.0 };
    /// `tanh`: the tanh approximation (`approximate="tanh"`), else the exact erf form
    /// 0.5·x·(1 + erf(x/√2)), computed as erfc(−t) to keep the negative tail.
    Gelu { tanh: bool }: "Gelu" since 20, accepts Float, bf16 f32,
        c_enum [U_GELU_ERF, U_GELU_TANH], select usize::from(tanh),
        import |a: &dyn UnaryAttrs| match a.string("approximate", "none").as_str() {
            "none" => Ok(Unary::Gelu { tanh: false }),
            "tanh" => Ok(Unary::Gelu { tanh: true }),
            other => Err(format!(
                "attribute 'approximate' must be \"none\" or \"tanh\", got \"{other}\""
            )),
        },
        real move |x: f64| if tanh {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
        } else {
            0.5 * x * erfc(-x / std::f64::consts::SQRT_2)
        };
    Shrink { bias: f32 = 0.0, lambd: f32 = 0.5 }: "Shrink" since 9, accepts Numeric, bf16 f32,
        c_enum [U_SHRINK], params [bias, lambd],
        real move |x: f64| {
            let (bias, lambd) = (f64::from(bias), f64::from(lambd));
            if x < -lambd { x + bias } else if x > lambd { x - bias } else { 0.0 }
        };
    /// `x * sigmoid(alpha * x)`.
    Swish { alpha: f32 = 1.0 }: "Swish" since 24, accepts Float, bf16 f32,
        c_enum [U_SWISH], params [alpha],
        real move |x: f64| x * sigmoid(f64::from(alpha) * x);
}
