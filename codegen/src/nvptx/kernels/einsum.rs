//! Einsum on the GPU, for the equations no rewrite turns into products, transposes and
//! reductions (diagonals such as `...ii->...i`, several operands contracted at once): a thread
//! per output element sums the product of its operands' elements over every contracted label,
//! as the library kernel (`kiln_uk_einsum` in nn.c) does, from the same lowering (`uk::lower`:
//! the label extents, output labels first, and each operand's stride per label). Floats
//! accumulate in f64 and are rounded once; integers wrap in 64 bits as the C kernel's do.

use super::scalar::{load_any_f64, load_int, load_local, store_real};
use crate::error::Result;
use crate::gen::elementwise as ew;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims};
use crate::target::TargetDesc;
use inkwell::values::IntValue;
use kiln_ir::{DType, Layout, Op};

const THREADS: u64 = 128;

#[derive(Debug)]
struct EinsumGpu {
    dtype: DType,
    /// Extent of each label, the output's first.
    extents: Vec<usize>,
    n_out: usize,
    /// Each operand's element stride per label (0 where it lacks or broadcasts the label).
    strides: Vec<Vec<i64>>,
}

/// The kernel for an Einsum of static row-major numeric tensors, or None.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    if !matches!(node.op(), Op::Einsum { .. }) {
        return Ok(None);
    }
    let dtype = node.output_type(0).dtype;
    let plain = |t: &kiln_ir::TensorType| t.dtype == dtype && t.layout == Layout::RowMajor && t.is_static();
    let all_plain = (0..node.n_inputs()).all(|i| node.input_type(i).is_some_and(plain));
    if !(dtype.is_float() || dtype.is_int()) || !all_plain || !plain(node.output_type(0)) {
        return Ok(None);
    }
    let Some(call) = crate::uk::lower(node)? else {
        return Ok(None);
    };
    let at = &call.iattr;
    let (n_ops, labels, n_out) = (at[0] as usize, at[1] as usize, at[2] as usize);
    let extents: Vec<usize> = at[3..3 + labels].iter().map(|&x| x as usize).collect();
    let strides = (0..n_ops)
        .map(|q| at[3 + labels + q * labels..3 + labels + (q + 1) * labels].to_vec())
        .collect();
    let kernel = EinsumGpu {
        dtype,
        extents,
        n_out,
        strides,
    };
    if kernel.outputs() == 0 || kernel.outputs() >= 1 << 40 {
        return Ok(None);
    }
    Ok(Some(Box::new(kernel)))
}

impl EinsumGpu {
    fn outputs(&self) -> u64 {
        self.extents[..self.n_out].iter().product::<usize>() as u64
    }

    fn terms(&self) -> usize {
        self.extents[self.n_out..].iter().product()
    }

    /// Each operand's offset for the label indices `idx` of `labels` (a slice of the labels).
    fn offsets<'ctx>(
        &self,
        e: &Emit<'_, 'ctx>,
        labels: std::ops::Range<usize>,
        idx: &[IntValue<'ctx>],
    ) -> Result<Vec<IntValue<'ctx>>> {
        self.strides
            .iter()
            .map(|s| {
                let mut off = e.i64c(0);
                for (l, &i) in labels.clone().zip(idx) {
                    if s[l] != 0 {
                        off = e.add(off, e.mulc(i, s[l])?)?;
                    }
                }
                Ok(off)
            })
            .collect()
    }
}

impl KernelCommon for EinsumGpu {
    fn describe(&self) -> String {
        format!(
            "gpu einsum {} operand(s), {} outputs x {} terms",
            self.strides.len(),
            self.outputs(),
            self.terms()
        )
    }
}

impl GpuKernel for EinsumGpu {
    fn launch(&self) -> LaunchDims {
        LaunchDims::per_item(self.outputs(), THREADS)
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let inputs = (0..self.strides.len())
            .map(|q| k.input(q))
            .collect::<Result<Vec<_>>>()?;
        let y = k.output(0)?;
        let float = self.dtype.is_float();
        let (f64t, i64t) = (e.cx.f64_type(), e.cx.i64_type());
        let fsum = e.entry_alloca(f64t, "fsum")?;
        let isum = e.entry_alloca(i64t, "isum")?;
        let n_out = self.n_out;
        let out_dims = &self.extents[..n_out];
        let red_dims = &self.extents[n_out..];
        k.grid_stride_loop(self.outputs(), THREADS, |o| {
            let base = self.offsets(&e, 0..n_out, &e.unravel(o, out_dims)?)?;
            e.store(fsum, f64t.const_zero())?;
            e.store(isum, e.i64c(0))?;
            e.for_range(e.i64c(0), e.i64c(self.terms() as i64), 1, |r| {
                let at = self.offsets(&e, n_out..self.extents.len(), &e.unravel(r, red_dims)?)?;
                if float {
                    let mut p = f64t.const_float(1.0);
                    for (q, x) in inputs.iter().enumerate() {
                        let v = load_any_f64(&e, *x, self.dtype, e.add(base[q], at[q])?)?;
                        p = e.b.build_float_mul(p, v, "").map_err(llvm)?;
                    }
                    let s = e.b.build_float_add(load_local(&e, fsum)?, p, "").map_err(llvm)?;
                    e.store(fsum, s)
                } else {
                    let mut p = e.i64c(1);
                    for (q, x) in inputs.iter().enumerate() {
                        let v = load_int(&e, *x, self.dtype, e.add(base[q], at[q])?)?;
                        p = e.mul(p, v)?;
                    }
                    let s = e.b.build_load(i64t, isum, "").map_err(llvm)?.into_int_value();
                    e.store(isum, e.add(s, p)?)
                }
            })?;
            if float {
                store_real(&e, y, self.dtype, o, load_local(&e, fsum)?)
            } else {
                let s = e.b.build_load(i64t, isum, "").map_err(llvm)?.into_int_value();
                let reg = if self.dtype.size_bytes() == 8 {
                    s
                } else {
                    // The register of narrower integers is i32; the store truncates further.
                    e.b.build_int_truncate(s, e.cx.i32_type(), "").map_err(llvm)?
                };
                ew::store_one(&e, y, self.dtype, o, reg.into())
            }
        })?;
        k.ret()
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check};
    use kiln_ir::{Graph, Op, Tensor, TensorType};

    fn graph(equation: &str, xs: Vec<Tensor>) -> (Graph, Vec<Tensor>) {
        let mut g = Graph::new("t");
        let ins = xs
            .iter()
            .enumerate()
            .map(|(i, x)| Some(g.add_input(format!("x{i}"), TensorType::fixed(x.dtype(), x.shape()))))
            .collect();
        let y = g
            .add_node(
                "einsum",
                Op::Einsum {
                    equation: equation.into(),
                },
                ins,
                vec!["y".into()],
            )
            .unwrap();
        g.add_output("y", y[0]);
        (g, xs)
    }

    fn ramp_f32(shape: &[usize], seed: usize) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::from_vec(
            shape.to_vec(),
            (0..n)
                .map(|i| ((i * 7 + seed) % 13) as f32 * 0.25 - 1.5)
                .collect(),
        )
    }

    #[test]
    fn diagonals_traces_and_contractions() {
        // A diagonal (the repeated label reads the stride sum), a trace, a three-operand
        // contraction with a broadcast label, and integers that wrap: each against the
        // reference.
        let cases = [
            ("...ii->...i", vec![ramp_f32(&[3, 5, 5], 1)]),
            ("ii", vec![ramp_f32(&[6, 6], 2)]),
            (
                "bij,bjk,k->bi",
                vec![
                    ramp_f32(&[2, 3, 4], 3),
                    ramp_f32(&[1, 4, 5], 4),
                    ramp_f32(&[5], 5),
                ],
            ),
        ];
        for (eq, xs) in cases {
            let (g, inputs) = graph(eq, xs);
            let d = check_graph(&g, &inputs);
            assert!(d.iter().any(|d| d.starts_with("gpu einsum")), "{eq}: {d:?}");
        }
        let ints: Vec<i32> = (0..4 * 4).map(|i: i32| i.wrapping_mul(0x3fff_ffff)).collect();
        let (g, inputs) = graph(
            "ij,ij->i",
            vec![
                Tensor::from_vec(vec![4, 4], ints.clone()),
                Tensor::from_vec(vec![4, 4], ints),
            ],
        );
        check_graph(&g, &inputs);
        let (g, _) = graph("...ii->...i", vec![ramp_f32(&[3, 5, 5], 1)]);
        for sm in [80, 90] {
            ptxas_check(&g, sm);
        }
    }
}
