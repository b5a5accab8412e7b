//! Operators whose output elements each take one value chosen by their index and a little
//! run-time data, a thread per output element: EyeLike (1 on a diagonal), OneHot (the on
//! value where an index points, the off value elsewhere) and ReverseSequence (each batch
//! entry's first `length` steps reversed).
//!
//! They follow the library kernels (`kiln_uk_eye_like`, `kiln_uk_one_hot`,
//! `kiln_uk_reverse_sequence` in movement.c): a OneHot index is read as f64, wrapped once when
//! negative, and ignored when it is out of range or not whole; a ReverseSequence length
//! outside `[0, steps]` is the library kernel's value error (`KILN_CUDA_EVALUE`), its entry
//! then copied unreversed.

use super::scalar::{load_any_f64, load_index};
use crate::error::Result;
use crate::gen::elementwise as ew;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims, EVALUE};
use crate::target::TargetDesc;
use inkwell::{FloatPredicate, IntPredicate};
use kiln_ir::{DType, Layout, MiscOp, Op};

const THREADS: u64 = 256;

#[derive(Debug)]
enum Map {
    EyeLike {
        rows: usize,
        cols: usize,
        k: i64,
    },
    /// Output `[outer, depth, inner]` around the one-hot axis.
    OneHot {
        depth: usize,
        inner: usize,
        indices: DType,
    },
    /// The input viewed as `[d0, d1, inner]`, the batch on axis `batch_axis` (0 or 1).
    ReverseSequence {
        batch_axis: usize,
        d0: usize,
        d1: usize,
        inner: usize,
        lengths: DType,
    },
}

#[derive(Debug)]
struct IndexMapGpu {
    map: Map,
    dtype: DType,
    len: usize,
}

/// The kernel for an EyeLike, OneHot or ReverseSequence node of static row-major tensors, or
/// None.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    let out = node.output_type(0);
    if out.layout != Layout::RowMajor || !out.is_static() || node.n_outputs() != 1 {
        return Ok(None);
    }
    let static_input = |i: usize| {
        node.input_type(i)
            .filter(|t| t.is_static() && t.layout == Layout::RowMajor)
    };
    let shape = node.output_shape(0)?;
    let map = match node.op() {
        Op::EyeLike { k, .. } if shape.len() == 2 => Map::EyeLike {
            rows: shape[0],
            cols: shape[1],
            k: *k,
        },
        Op::OneHot { axis } => {
            let (Some(idx), Some(values)) = (static_input(0), static_input(2)) else {
                return Ok(None);
            };
            let rank = shape.len() as i64;
            let a = if *axis < 0 { axis + rank } else { *axis };
            if !(0..rank).contains(&a) || values.dtype != out.dtype || idx.dtype == DType::Bool {
                return Ok(None);
            }
            let a = a as usize;
            Map::OneHot {
                depth: shape[a],
                inner: shape[a + 1..].iter().product(),
                indices: idx.dtype,
            }
        }
        Op::Misc(MiscOp::ReverseSequence { batch_axis, .. }) => {
            let Some(lengths) = static_input(1) else {
                return Ok(None);
            };
            if shape.len() < 2 || *batch_axis > 1 || !matches!(lengths.dtype, DType::I32 | DType::I64) {
                return Ok(None);
            }
            Map::ReverseSequence {
                batch_axis: *batch_axis,
                d0: shape[0],
                d1: shape[1],
                inner: shape[2..].iter().product(),
                lengths: lengths.dtype,
            }
        }
        _ => return Ok(None),
    };
    Ok(Some(Box::new(IndexMapGpu {
        map,
        dtype: out.dtype,
        len: shape.iter().product(),
    })))
}

impl KernelCommon for IndexMapGpu {
    fn describe(&self) -> String {
        let what = match self.map {
            Map::EyeLike { rows, cols, k } => format!("eye_like {rows}x{cols} k={k}"),
            Map::OneHot { depth, .. } => format!("one_hot depth={depth}"),
            Map::ReverseSequence { batch_axis, .. } => format!("reverse_sequence batch_axis={batch_axis}"),
        };
        format!("gpu {what} {} elements {}", self.len, self.dtype.name())
    }
}

impl GpuKernel for IndexMapGpu {
    fn launch(&self) -> LaunchDims {
        LaunchDims::per_item(self.len as u64, THREADS)
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let y = k.output(0)?;
        let d = self.dtype;
        k.grid_stride_loop(self.len as u64, THREADS, |idx| match self.map {
            Map::EyeLike { cols, k: diag, .. } => {
                let (i, j) = (e.udivc(idx, cols as i64)?, e.uremc(idx, cols as i64)?);
                let on = e.icmp(IntPredicate::EQ, e.sub(j, i)?, e.i64c(diag))?;
                let (one, zero) = (ew::small_const(&e, d, 1)?, ew::small_const(&e, d, 0)?);
                let v = e.b.build_select(on, one, zero, "").map_err(llvm)?;
                ew::store_one(&e, y, d, idx, v)
            }
            Map::OneHot {
                depth,
                inner,
                indices,
            } => {
                let j = e.uremc(idx, inner as i64)?;
                let slot = e.uremc(e.udivc(idx, inner as i64)?, depth as i64)?;
                let o = e.udivc(idx, (depth * inner) as i64)?;
                let f = e.add(e.mulc(o, inner as i64)?, j)?;
                let v = load_any_f64(&e, k.input(0)?, indices, f)?;
                let f64c = |x: f64| e.cx.f64_type().const_float(x);
                let negative = e.fcmp_scalar(FloatPredicate::OLT, v, f64c(0.0))?;
                let wrapped = e.b.build_float_add(v, f64c(depth as f64), "").map_err(llvm)?;
                let v = e.select_float(negative, wrapped, v)?;
                // Whole, inside [0, depth) and this slot: only then the on value.
                let fslot =
                    e.b.build_unsigned_int_to_float(slot, e.cx.f64_type(), "")
                        .map_err(llvm)?;
                let hit = e.fcmp_scalar(FloatPredicate::OEQ, v, fslot)?;
                let which = e.select_int(hit, e.i64c(1), e.i64c(0))?;
                let value = ew::load_one(&e, k.input(2)?, d, which)?;
                ew::store_one(&e, y, d, idx, value)
            }
            Map::ReverseSequence {
                batch_axis,
                d0,
                d1,
                inner,
                lengths,
            } => {
                let r = e.uremc(idx, inner as i64)?;
                let i1 = e.uremc(e.udivc(idx, inner as i64)?, d1 as i64)?;
                let i0 = e.udivc(idx, (d1 * inner) as i64)?;
                let (b, t, steps) = match batch_axis {
                    0 => (i0, i1, d1),
                    _ => (i1, i0, d0),
                };
                let l = load_index(&e, k.input(1)?, lengths, b)?;
                let bad = e.b.build_or(
                    e.icmp(IntPredicate::SLT, l, e.i64c(0))?,
                    e.icmp(IntPredicate::SGT, l, e.i64c(steps as i64))?,
                    "",
                );
                let bad = bad.map_err(llvm)?;
                e.if_then(bad, || k.report_error(EVALUE))?;
                let l = e.select_int(bad, e.i64c(0), l)?;
                let reversed = e.icmp(IntPredicate::SLT, t, l)?;
                let ts = e.select_int(reversed, e.sub(e.sub(l, e.i64c(1))?, t)?, t)?;
                let (s0, s1) = match batch_axis {
                    0 => (i0, ts),
                    _ => (ts, i1),
                };
                let src = e.add(e.mulc(e.add(e.mulc(s0, d1 as i64)?, s1)?, inner as i64)?, r)?;
                let v = ew::load_one(&e, k.input(0)?, d, src)?;
                ew::store_one(&e, y, d, idx, v)
            }
        })?;
        k.ret()
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check, run_graph};
    use kiln_ir::{DType, Graph, MiscOp, Op, Tensor, TensorType};

    fn check(g: &Graph, inputs: &[Tensor], what: &str) {
        let kernels = check_graph(g, inputs);
        assert!(kernels.iter().all(|k| k.starts_with(what)), "{kernels:?}");
    }

    fn eye_like(k: i64, dtype: DType) -> Graph {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[4, 6]));
        let y = g
            .add(
                "eye",
                Op::EyeLike {
                    k,
                    dtype: Some(dtype),
                },
                vec![Some(x)],
                "y",
            )
            .unwrap();
        g.add_output("y", y);
        g
    }

    #[test]
    fn eye_like_diagonals_in_every_dtype() {
        let x = Tensor::from_vec(vec![4, 6], vec![0.0f32; 24]);
        for (k, dtype) in [
            (0, DType::F32),
            (-2, DType::I32),
            (3, DType::Bool),
            (1, DType::U8),
            (-5, DType::F16),
        ] {
            check(&eye_like(k, dtype), std::slice::from_ref(&x), "gpu eye_like");
        }
    }

    #[test]
    fn one_hot_skips_what_the_reference_skips() {
        // Float indices: negative (wrapped once), fractional, out of range both ways, NaN.
        let mut g = Graph::new("t");
        let idx = g.add_input("idx", TensorType::fixed(DType::F32, &[2, 4]));
        let depth = g.add_const("depth", Tensor::scalar(5i64));
        let values = g.add_input("values", TensorType::fixed(DType::I64, &[2]));
        let y = g
            .add(
                "oh",
                Op::OneHot { axis: 1 },
                vec![Some(idx), Some(depth), Some(values)],
                "y",
            )
            .unwrap();
        g.add_output("y", y);
        let inputs = vec![
            Tensor::from_vec(
                vec![2, 4],
                vec![0.0f32, 4.0, -1.0, -5.0, 2.5, 5.0, -6.0, f32::NAN],
            ),
            Tensor::from_vec(vec![2], vec![-3i64, 7]),
        ];
        check(&g, &inputs, "gpu one_hot");
    }

    fn reverse(batch_axis: usize, lengths: Vec<i32>) -> (Graph, Vec<Tensor>) {
        let shape = if batch_axis == 0 {
            vec![3, 5, 2]
        } else {
            vec![5, 3, 2]
        };
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::I16, &shape));
        let l = g.add_input("l", TensorType::fixed(DType::I32, &[3]));
        let op = Op::Misc(MiscOp::ReverseSequence {
            batch_axis,
            time_axis: 1 - batch_axis,
        });
        let y = g.add("rev", op, vec![Some(x), Some(l)], "y").unwrap();
        g.add_output("y", y);
        let xs: Vec<i16> = (0..30).collect();
        (
            g,
            vec![Tensor::from_vec(shape, xs), Tensor::from_vec(vec![3], lengths)],
        )
    }

    #[test]
    fn reverse_sequence_along_either_axis() {
        for batch_axis in [0, 1] {
            let (g, inputs) = reverse(batch_axis, vec![5, 0, 3]);
            check(&g, &inputs, "gpu reverse_sequence");
        }
    }

    #[test]
    fn a_length_outside_the_steps_is_a_value_error() {
        let (g, inputs) = reverse(0, vec![2, 6, 1]);
        let err = run_graph(&g, &inputs).unwrap_err();
        assert!(err.contains("failed with code 2"), "{err}");
    }

    #[test]
    fn ptx_assembles() {
        ptxas_check(&eye_like(1, DType::BF16), 80);
        ptxas_check(&reverse(1, vec![1, 2, 3]).0, 80);
    }
}
