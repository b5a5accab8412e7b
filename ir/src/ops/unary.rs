//! Unary element-wise operators, driven by one table (`unary_table.rs`).
//!
//! Each row of the table declares an operator once; the `unary_ops!` macro below turns the rows
//! into the [`Unary`] enum and the functions every layer reads: the ONNX name and opset
//! ([`Unary::from_onnx`], [`Unary::onnx_since`]), type inference ([`Unary::accepts`],
//! [`Unary::returns_bool`]), reference math ([`Unary::real`]), autocast policy
//! ([`Unary::exact_in_bf16`]) and the C kernel library's operator code
//! ([`Unary::kernel_call`], [`KERNEL_OPS`]). codegen's build script reads the same table file
//! to generate the C enum, so the numbers are never kept in step by hand.

use super::elementwise::{erf, erfc, sigmoid, softplus, Kind};

/// The ONNX attributes of a node, as the frontend reads them (ONNX defaults filled in).
pub trait UnaryAttrs {
    fn float(&self, name: &str, default: f32) -> f32;
    fn int(&self, name: &str, default: i64) -> i64;
    fn string(&self, name: &str, default: &str) -> String;
}

/// No attributes: every operator with the ONNX defaults of its attributes.
pub struct OnnxDefaults;

impl UnaryAttrs for OnnxDefaults {
    fn float(&self, _: &str, default: f32) -> f32 {
        default
    }
    fn int(&self, _: &str, default: i64) -> i64 {
        default
    }
    fn string(&self, _: &str, default: &str) -> String {
        default.to_string()
    }
}

/// A field of a table row read from the ONNX attribute of the same name.
trait AttrValue: Sized {
    fn read(attrs: &dyn UnaryAttrs, name: &str, default: Self) -> Result<Self, String>;
}

impl AttrValue for f32 {
    fn read(attrs: &dyn UnaryAttrs, name: &str, default: f32) -> Result<f32, String> {
        Ok(attrs.float(name, default))
    }
}

impl AttrValue for bool {
    /// A 0/1 integer attribute.
    fn read(attrs: &dyn UnaryAttrs, name: &str, default: bool) -> Result<bool, String> {
        match attrs.int(name, i64::from(default)) {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(format!("attribute '{name}' must be 0 or 1, got {v}")),
        }
    }
}

/// A real function of one variable, evaluated in f64.
pub type RealFn = Box<dyn Fn(f64) -> f64>;

/// How the C kernel library's `kiln_uk_ew_unary` computes an operator: `code` indexes
/// [`KERNEL_OPS`] (the C enum), `params` are its float attributes, `flags` its integer ones.
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct UnaryKernelCall {
    pub code: i64,
    pub params: [f32; 2],
    pub flags: [bool; 2],
}

macro_rules! unary_ops {
    ($(
        $(#[$doc:meta])*
        $V:ident $({ $($f:ident : $ft:ty $(= $def:expr)?),* $(,)? })?
            : $onnx:literal since $since:literal,
            accepts $kind:ident $(returns $ret:ident)?, bf16 $bf16:ident,
            c_enum [$($c:ident),+]
            $(, select $sel:expr)?
            $(, params [$($p:ident),*])?
            $(, flags [$($fl:ident),*])?
            $(, import $imp:expr)?
            $(, real $real:expr)?
        ;
    )*) => {
        /// Element-wise functions of one tensor. Output shape = input shape. Declared in
        /// `ops/unary_table.rs`.
        #[derive(Clone, PartialEq, Debug)]
        pub enum Unary {
            $( $(#[$doc])* $V $({ $($f: $ft),* })?, )*
        }

        /// The C kernel library's unary operator constants, in the order of its enum
        /// (generated into `kiln_uk_ops.h` from this table by codegen's build script).
        pub const KERNEL_OPS: &[&str] = &[$($(stringify!($c)),+),*];

        impl Unary {
            /// The ONNX operator name.
            pub fn name(&self) -> &'static str {
                match self { $( Unary::$V { .. } => $onnx, )* }
            }

            /// Every ONNX operator name of the table.
            pub fn onnx_names() -> &'static [&'static str] {
                &[$($onnx),*]
            }

            /// Every row of the table with its ONNX attribute defaults, and the forms the C
            /// kernel library computes that the defaults do not reach (Gelu's tanh form).
            pub fn every_form() -> Vec<Unary> {
                let mut forms: Vec<Unary> = Self::onnx_names()
                    .iter()
                    .filter_map(|n| Unary::from_onnx(n, &OnnxDefaults)?.ok())
                    .collect();
                forms.push(Unary::Gelu { tanh: true });
                forms
            }

            /// The ONNX operator `op_type`'s name and the first default-domain opset that
            /// defines it, if the table has it.
            pub fn onnx_since(op_type: &str) -> Option<(&'static str, i64)> {
                match op_type {
                    $( $onnx => Some(($onnx, $since)), )*
                    _ => None,
                }
            }

            /// The ONNX operator `op_type` with its attributes, or `None` if `op_type` is not a
            /// unary operator. An invalid attribute is an error naming it.
            #[allow(clippy::redundant_closure_call)]
            pub fn from_onnx(op_type: &str, attrs: &dyn UnaryAttrs) -> Option<Result<Unary, String>> {
                Some(match op_type {
                    $( $onnx => unary_import!(attrs, $V, [$($($f : $ft $(= $def)?),*)?] $(, $imp)?), )*
                    _ => return None,
                })
            }

            /// The input types the operator admits.
            pub(crate) fn accepts(&self) -> Kind {
                match self { $( Unary::$V { .. } => Kind::$kind, )* }
            }

            /// Predicates return bool; every other operator returns its input's type.
            pub fn returns_bool(&self) -> bool {
                match self { $( Unary::$V { .. } => unary_returns_bool!($($ret)?), )* }
            }

            /// Exact on bf16 inputs (piecewise linear functions and predicates): the autocast
            /// pass lets it follow its producer; anything with a transcendental or a division
            /// amplifies rounding and stays f32.
            pub fn exact_in_bf16(&self) -> bool {
                match self { $( Unary::$V { .. } => unary_bf16!($bf16), )* }
            }

            /// The function in f64, for the reference interpreter; `None` for predicates and
            /// bitwise operators.
            #[allow(unused_variables)]
            pub fn real(&self) -> Option<RealFn> {
                match *self {
                    $( Unary::$V $({ $($f),* })? => unary_real!($($real)?), )*
                }
            }

            /// The C kernel library's call for this operator.
            #[allow(unused_variables)]
            pub fn kernel_call(&self) -> UnaryKernelCall {
                match *self {
                    $( Unary::$V $({ $($f),* })? => {
                        let forms = [$(stringify!($c)),+];
                        let form = forms[unary_select!($($sel)?)];
                        UnaryKernelCall {
                            code: KERNEL_OPS.iter().position(|c| *c == form).unwrap_or(0) as i64,
                            params: unary_pair!(0.0f32; $($($p),*)?),
                            flags: unary_pair!(false; $($($fl),*)?),
                        }
                    } )*
                }
            }
        }
    };
}

/// A row's import: its own `import` closure, or every field read from its attribute.
macro_rules! unary_import {
    ($a:ident, $V:ident, [$($f:ident : $ft:ty $(= $def:expr)?),*], $imp:expr) => {
        ($imp)($a)
    };
    ($a:ident, $V:ident, [$($f:ident : $ft:ty = $def:expr),*]) => {
        (|| -> Result<Unary, String> {
            Ok(Unary::$V { $($f: <$ft as AttrValue>::read($a, stringify!($f), $def)?),* })
        })()
    };
}

macro_rules! unary_real {
    () => {
        None
    };
    ($real:expr) => {
        Some(Box::new($real))
    };
}

macro_rules! unary_returns_bool {
    () => {
        false
    };
    (Bool) => {
        true
    };
}

macro_rules! unary_bf16 {
    (exact) => {
        true
    };
    (f32) => {
        false
    };
}

macro_rules! unary_select {
    () => {
        0
    };
    ($sel:expr) => {
        $sel
    };
}

/// Up to two fields as the kernel's attribute pair, padded with `zero`.
macro_rules! unary_pair {
    ($zero:expr;) => {
        [$zero, $zero]
    };
    ($zero:expr; $a:ident) => {
        [$a, $zero]
    };
    ($zero:expr; $a:ident, $b:ident) => {
        [$a, $b]
    };
}

include!("unary_table.rs");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_imports_under_its_name() {
        for name in Unary::onnx_names() {
            let u = Unary::from_onnx(name, &OnnxDefaults).unwrap().unwrap();
            assert_eq!(u.name(), *name);
        }
        assert!(Unary::from_onnx("Add", &OnnxDefaults).is_none());
    }

    #[test]
    fn kernel_codes_follow_the_table() {
        let gelu_tanh = Unary::Gelu { tanh: true }.kernel_call();
        assert_eq!(KERNEL_OPS[gelu_tanh.code as usize], "U_GELU_TANH");
        let selu = Unary::Selu {
            alpha: 2.0,
            gamma: 3.0,
        }
        .kernel_call();
        assert_eq!(
            (KERNEL_OPS[selu.code as usize], selu.params),
            ("U_SELU", [2.0, 3.0])
        );
        let isinf = Unary::IsInf {
            detect_positive: true,
            detect_negative: false,
        };
        assert_eq!(isinf.kernel_call().flags, [true, false]);
        // Every constant is reached by an operator form.
        let mut seen = vec![false; KERNEL_OPS.len()];
        for u in Unary::every_form() {
            seen[u.kernel_call().code as usize] = true;
        }
        assert!(seen.iter().all(|s| *s), "{KERNEL_OPS:?} {seen:?}");
    }

    #[test]
    fn attributes_are_read_and_checked() {
        struct Alpha(f32, i64);
        impl UnaryAttrs for Alpha {
            fn float(&self, _: &str, _: f32) -> f32 {
                self.0
            }
            fn int(&self, _: &str, _: i64) -> i64 {
                self.1
            }
            fn string(&self, _: &str, _: &str) -> String {
                "tanh".into()
            }
        }
        let leaky = Unary::from_onnx("LeakyRelu", &Alpha(0.3, 1)).unwrap().unwrap();
        assert_eq!(leaky, Unary::LeakyRelu { alpha: 0.3 });
        assert_eq!(leaky.real().unwrap()(-2.0), -2.0 * f64::from(0.3f32));
        let err = Unary::from_onnx("IsInf", &Alpha(0.0, 2)).unwrap().unwrap_err();
        assert_eq!(err, "attribute 'detect_positive' must be 0 or 1, got 2");
        assert!(Unary::from_onnx("Celu", &Alpha(0.0, 1)).unwrap().is_err());
        let gelu = Unary::from_onnx("Gelu", &Alpha(0.0, 1)).unwrap().unwrap();
        assert_eq!(gelu, Unary::Gelu { tanh: true });
    }
}
