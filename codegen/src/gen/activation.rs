//! Activations applied to vectors of a product's result in registers, shared by the CPU
//! product kernels (GEMM, depthwise, Winograd) and the GPU ones on scalars.

use crate::error::Result;
use crate::gen::emit::Emit;
use crate::kernel::epilogue::Activation;
use inkwell::values::VectorValue;
use inkwell::FloatPredicate;

/// Applies `act` to a vector.
pub(crate) fn activation<'ctx>(
    e: &Emit<'_, 'ctx>,
    act: Activation,
    x: VectorValue<'ctx>,
    lanes: u32,
) -> Result<VectorValue<'ctx>> {
    let zero = e.zero_vec(lanes);
    let c = |v: f32| e.splat(e.f32c(v), lanes);
    // Comparisons are ordered, so NaN passes through Relu/Clip unchanged like the reference.
    let clamp =
        |x: VectorValue<'ctx>, lo: VectorValue<'ctx>, hi: VectorValue<'ctx>| -> Result<VectorValue<'ctx>> {
            let below = e.fcmp(FloatPredicate::OLT, x, lo)?;
            let x = e.vselect(below, lo, x)?;
            let above = e.fcmp(FloatPredicate::OGT, x, hi)?;
            e.vselect(above, hi, x)
        };
    let sigmoid = |x: VectorValue<'ctx>| super::vmath::sigmoid(e, x);
    match act {
        Activation::None => Ok(x),
        Activation::Relu => {
            let neg = e.fcmp(FloatPredicate::OLT, x, zero)?;
            e.vselect(neg, zero, x)
        }
        Activation::Clip { min, max } => clamp(x, c(min)?, c(max)?),
        Activation::Sigmoid => sigmoid(x),
        Activation::Silu => {
            let s = sigmoid(x)?;
            e.fmul(x, s)
        }
        Activation::HardSwish => {
            let t = e.fma(x, c(1.0 / 6.0)?, c(0.5)?)?;
            let t = clamp(t, zero, c(1.0)?)?;
            e.fmul(x, t)
        }
        // 1 + tanh(u) = 2·sigmoid(2u), without the cancellation (as the elementwise kernel).
        Activation::GeluTanh => {
            let x2 = e.fmul(x, x)?;
            let inner = e.fma(x2, c(0.044715)?, c(1.0)?)?;
            let u = e.fmul(e.fmul(x, inner)?, c(1.595_769)?)?;
            e.fmul(x, sigmoid(u)?)
        }
        Activation::GeluErf => super::vmath::gelu_erf(e, x),
        // The same operations as the elementwise Div, Round (half to even), Clip and Mul.
        Activation::FakeQuant { scale, lo, hi } => {
            let q = e.b.build_float_div(x, c(scale)?, "").map_err(crate::gen::llvm)?;
            let r = e
                .intrinsic("llvm.roundeven", &[q.get_type().into()], &[q.into()])?
                .into_vector_value();
            e.fmul(clamp(r, c(lo)?, c(hi)?)?, c(scale)?)
        }
    }
}
