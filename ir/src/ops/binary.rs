//! Binary element-wise operators, declared in `binary_table.rs`: the [`Binary`] enum, its
//! names and the C kernel library's operator codes ([`Binary::kernel_code`], generated into
//! the C enum by codegen's build script from the same table).

macro_rules! binary_ops {
    ($( $(#[$doc:meta])* $V:ident : $name:literal, c_enum [$c:ident]; )*) => {
        /// Element-wise functions of two tensors with multidirectional (numpy) broadcasting.
        /// Declared in `ops/binary_table.rs`.
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
        pub enum Binary {
            $( $(#[$doc])* $V, )*
        }

        impl Binary {
            /// The C kernel library's binary operator constants, in the order of its enum.
            pub const KERNEL_OPS: &'static [&'static str] = &[$(stringify!($c)),*];

            pub fn name(&self) -> &'static str {
                match self { $( Binary::$V => $name, )* }
            }

            /// The operator's code in `kiln_uk_ew_binary` (an index of [`Self::KERNEL_OPS`]).
            pub fn kernel_code(self) -> i64 {
                let c = match self { $( Binary::$V => stringify!($c), )* };
                Self::KERNEL_OPS.iter().position(|k| *k == c).unwrap_or(0) as i64
            }
        }
    };
}

include!("binary_table.rs");
