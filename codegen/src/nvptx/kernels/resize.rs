//! Resize in linear and cubic modes on the GPU (every coordinate transform, antialias,
//! exclude_outside, tf_crop_and_resize's extrapolation), from the taps the C library's
//! `kiln_uk_resize` takes (`uk::movement`): per resized axis and output position, the source
//! indices and their coefficients, decided at compile time. Nearest mode is a gather by axis
//! maps (`gather`).
//!
//! One thread per output element (grid-stride, 256-thread blocks, the innermost axis on
//! consecutive threads): the sum, over every combination of the resized axes' taps, of the
//! product of their coefficients times the input element they select, in f32. The library
//! resizes one axis after another in f64; the two agree to f32 rounding (the sum is the same
//! multilinear form). Where an axis maps the output position outside the input
//! (tf_crop_and_resize), the element is the extrapolation value.

use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::{KernelCommon, PackedConst};
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims};
use crate::target::TargetDesc;
use inkwell::values::{FloatValue, IntValue};
use kiln_ir::{DType, Op};

const THREADS: u64 = 256;
/// Tap combinations one output element may sum (a 2-D cubic resize has 16); wider kernels
/// (antialiased downscaling by large factors) stay with the library.
const MAX_COMBINATIONS: usize = 256;

/// One resized axis: where its taps lie in the table (in 4-byte words).
#[derive(Debug, Clone)]
struct Step {
    axis: usize,
    taps: usize,
    /// `[out][taps]` i32 source indices.
    indices: u64,
    /// `[out][taps]` f32 coefficients.
    coefficients: u64,
    /// `[out]` i32: 1 where the position lies outside the input.
    outside: u64,
}

#[derive(Debug)]
struct ResizeGpu {
    in_dims: Vec<u64>,
    out_dims: Vec<u64>,
    steps: Vec<Step>,
    extrapolation: f32,
    /// Every step's table, as the kernel's one packed constant.
    table: Vec<PackedConst>,
}

/// The kernel for a linear or cubic f32 Resize, or None (nearest mode, other dtypes, kernels
/// too wide).
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    if !matches!(node.op(), Op::Resize(_))
        || node.input_type(0).is_none_or(|t| t.dtype != DType::F32)
        || node.output_type(0).dtype != DType::F32
    {
        return Ok(None);
    }
    let Some(call) = crate::uk::lower(node)? else {
        return Ok(None);
    };
    if call.symbol != "resize" {
        return Ok(None);
    }
    Ok(ResizeGpu::from_attrs(&call.iattr, &call.fattr).map(|k| Box::new(k) as Box<dyn GpuKernel>))
}

impl ResizeGpu {
    /// Reads `kiln_uk_resize`'s attributes: iattr `[rank, n_steps, in_dims[rank], per step:
    /// axis, out, n_taps, per output position: outside, idx[n_taps]]`, fattr
    /// `[extrapolation, per step and position: coeff[n_taps]]`.
    fn from_attrs(at: &[i64], fat: &[f64]) -> Option<ResizeGpu> {
        let (rank, n_steps) = (*at.first()? as usize, *at.get(1)? as usize);
        let in_dims: Vec<u64> = at.get(2..2 + rank)?.iter().map(|&d| d as u64).collect();
        let mut out_dims = in_dims.clone();
        let (mut i, mut f) = (2 + rank, 1);
        let mut words: Vec<u32> = vec![];
        let mut steps = vec![];
        for _ in 0..n_steps {
            let (axis, out, taps) = (
                *at.get(i)? as usize,
                *at.get(i + 1)? as usize,
                *at.get(i + 2)? as usize,
            );
            i += 3;
            if axis >= rank || taps == 0 {
                return None;
            }
            let (mut indices, mut coefficients, mut outside) = (vec![], vec![], vec![]);
            for _ in 0..out {
                outside.push(u32::from(*at.get(i)? != 0));
                for t in 0..taps {
                    let idx = *at.get(i + 1 + t)?;
                    if idx < 0 || idx as u64 >= in_dims[axis] {
                        return None;
                    }
                    indices.push(idx as u32);
                    coefficients.push((*fat.get(f + t)? as f32).to_bits());
                }
                i += 1 + taps;
                f += taps;
            }
            let base = words.len() as u64;
            let n = (out * taps) as u64;
            steps.push(Step {
                axis,
                taps,
                indices: base,
                coefficients: base + n,
                outside: base + 2 * n,
            });
            words.extend(indices);
            words.extend(coefficients);
            words.extend(outside);
            out_dims[axis] = out as u64;
        }
        let combinations = steps
            .iter()
            .map(|s| s.taps)
            .try_fold(1usize, |a, t| a.checked_mul(t))?;
        if steps.is_empty() || combinations > MAX_COMBINATIONS || out_dims.iter().product::<u64>() == 0 {
            return None;
        }
        Some(ResizeGpu {
            in_dims,
            out_dims,
            steps,
            extrapolation: *fat.first()? as f32,
            table: vec![PackedConst {
                bytes: words.iter().flat_map(|w| w.to_le_bytes()).collect(),
            }],
        })
    }

    fn total(&self) -> u64 {
        self.out_dims.iter().product()
    }

    /// Row-major strides of the input, in elements.
    fn in_strides(&self) -> Vec<i64> {
        let mut s = vec![1i64; self.in_dims.len()];
        for d in (0..self.in_dims.len().saturating_sub(1)).rev() {
            s[d] = s[d + 1] * self.in_dims[d + 1] as i64;
        }
        s
    }
}

impl KernelCommon for ResizeGpu {
    fn describe(&self) -> String {
        let taps: Vec<String> = self
            .steps
            .iter()
            .map(|s| format!("axis {}: {} taps", s.axis, s.taps))
            .collect();
        format!(
            "gpu resize {:?} -> {:?} ({})",
            self.in_dims,
            self.out_dims,
            taps.join(", ")
        )
    }

    fn packed_constants(&self) -> &[PackedConst] {
        &self.table
    }

    fn release_packed_constants(&mut self) {
        PackedConst::release_all(&mut self.table)
    }
}

impl GpuKernel for ResizeGpu {
    fn launch(&self) -> LaunchDims {
        LaunchDims::per_item(self.total(), THREADS)
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let (src, out, table) = (k.input(0)?, k.output(0)?, k.packed(0)?);
        let (i32t, f32t) = (k.cx.i32_type(), k.cx.f32_type());
        let strides = self.in_strides();
        let word = |at| -> Result<_> { e.gep_u8(table, e.mulc(at, 4)?) };
        k.grid_stride_loop(self.total(), THREADS, |i| {
            // The output coordinates; the offset of the axes that are not resized.
            let dims: Vec<usize> = self.out_dims.iter().map(|&d| d as usize).collect();
            let coord = e.unravel(i, &dims)?;
            let mut base = e.i64c(0);
            for (d, &c) in coord.iter().enumerate() {
                if self.steps.iter().all(|s| s.axis != d) {
                    base = e.add(base, e.mulc(c, strides[d])?)?;
                }
            }
            let mut outside = k.cx.bool_type().const_zero();
            for s in &self.steps {
                let at = word(e.addc(coord[s.axis], s.outside as i64)?)?;
                let flag =
                    e.b.build_load(i32t, at, "outside")
                        .map_err(llvm)?
                        .into_int_value();
                let flag = e.icmp(inkwell::IntPredicate::NE, flag, e.i32c(0))?;
                outside = e.b.build_or(outside, flag, "").map_err(llvm)?;
            }
            let to = e.gep_f32(out, i)?;
            e.if_else(
                outside,
                || e.store(to, e.f32c(self.extrapolation)),
                || {
                    // Each step's taps for this position: (offset along its axis, coefficient).
                    let mut taps: Vec<Vec<(IntValue, FloatValue)>> = vec![];
                    for s in &self.steps {
                        let first = e.mulc(coord[s.axis], s.taps as i64)?;
                        let mut v = vec![];
                        for t in 0..s.taps {
                            let p = e.addc(first, t as i64)?;
                            let idx =
                                e.b.build_load(i32t, word(e.addc(p, s.indices as i64)?)?, "idx")
                                    .map_err(llvm)?
                                    .into_int_value();
                            let idx = e.b.build_int_z_extend(idx, k.cx.i64_type(), "").map_err(llvm)?;
                            let c =
                                e.b.build_load(f32t, word(e.addc(p, s.coefficients as i64)?)?, "coeff")
                                    .map_err(llvm)?
                                    .into_float_value();
                            v.push((e.mulc(idx, strides[s.axis])?, c));
                        }
                        taps.push(v);
                    }
                    // Every combination of one tap per step.
                    let mut sum = e.f32c(0.0);
                    let mut pick = vec![0usize; taps.len()];
                    loop {
                        let (mut off, mut w) = (base, e.f32c(1.0));
                        for (s, &t) in pick.iter().enumerate() {
                            let (o, c) = taps[s][t];
                            off = e.add(off, o)?;
                            w = e.b.build_float_mul(w, c, "w").map_err(llvm)?;
                        }
                        let x = e.load_f32(e.gep_f32(src, off)?)?;
                        let term = e.b.build_float_mul(w, x, "t").map_err(llvm)?;
                        sum = e.b.build_float_add(sum, term, "sum").map_err(llvm)?;
                        // Next combination, the last step's tap fastest.
                        let mut s = pick.len();
                        loop {
                            if s == 0 {
                                return e.store(to, sum);
                            }
                            s -= 1;
                            pick[s] += 1;
                            if pick[s] < taps[s].len() {
                                break;
                            }
                            pick[s] = 0;
                        }
                    }
                },
            )
        })?;
        k.ret()
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check};
    use kiln_ir::{
        AspectRatioPolicy, CoordTransform, DType, Graph, NearestMode, Op, ResizeAttrs, ResizeMode, Tensor,
        TensorType,
    };

    fn attrs(mode: ResizeMode, coord: CoordTransform) -> ResizeAttrs {
        ResizeAttrs {
            mode,
            coord,
            nearest_mode: NearestMode::RoundPreferFloor,
            cubic_coeff_a: -0.75,
            exclude_outside: false,
            extrapolation_value: 0.0,
            antialias: false,
            axes: vec![],
            keep_aspect_ratio_policy: AspectRatioPolicy::Stretch,
        }
    }

    /// `x [1, 3, 6, 9]` resized by `scales` (and `roi` for tf_crop_and_resize) with `a`.
    fn graph(a: ResizeAttrs, scales: [f32; 4], roi: Option<[f32; 8]>) -> (Graph, Vec<Tensor>) {
        let mut g = Graph::new("t");
        let shape = [1usize, 3, 6, 9];
        let x = g.add_input("x", TensorType::fixed(DType::F32, &shape));
        let n: usize = shape.iter().product();
        let xt = Tensor::from_vec(
            shape.to_vec(),
            (0..n)
                .map(|i| ((i * 37) % 23) as f32 * 0.5 - 4.0)
                .collect::<Vec<f32>>(),
        );
        let scales = g.add_const("scales", Tensor::from_vec(vec![4], scales.to_vec()));
        let roi = roi.map(|r| g.add_const("roi", Tensor::from_vec(vec![8], r.to_vec())));
        let y = g
            .add("resize", Op::Resize(a), vec![Some(x), roi, Some(scales)], "y")
            .unwrap();
        g.add_output("y", y);
        (g, vec![xt])
    }

    fn assert_resized(describes: &[String]) {
        assert!(
            describes.iter().all(|d| d.starts_with("gpu resize")),
            "not a GPU resize: {describes:?}"
        );
    }

    #[test]
    fn linear_and_cubic_up_and_down() {
        let cases = [
            (
                ResizeMode::Linear,
                CoordTransform::HalfPixel,
                [1.0, 1.0, 2.0, 1.5],
            ),
            (
                ResizeMode::Linear,
                CoordTransform::AlignCorners,
                [1.0, 1.0, 0.5, 0.75],
            ),
            (
                ResizeMode::Linear,
                CoordTransform::PytorchHalfPixel,
                [1.0, 1.0, 0.5, 2.0],
            ),
            (ResizeMode::Cubic, CoordTransform::HalfPixel, [1.0, 1.0, 1.5, 2.0]),
            (
                ResizeMode::Cubic,
                CoordTransform::Asymmetric,
                [1.0, 1.0, 0.5, 0.5],
            ),
        ];
        for (mode, coord, scales) in cases {
            let (g, inputs) = graph(attrs(mode, coord), scales, None);
            assert_resized(&check_graph(&g, &inputs));
        }
    }

    #[test]
    fn antialias_exclude_outside_and_extrapolation() {
        let mut a = attrs(ResizeMode::Cubic, CoordTransform::HalfPixel);
        a.antialias = true;
        a.exclude_outside = true;
        let (g, inputs) = graph(a, [1.0, 1.0, 0.5, 0.4], None);
        assert_resized(&check_graph(&g, &inputs));
        // A crop reaching past the image on both sides: those positions take the value.
        let mut a = attrs(ResizeMode::Linear, CoordTransform::TfCropAndResize);
        a.extrapolation_value = 7.5;
        let roi = [0.0, 0.0, -0.2, 0.1, 1.0, 1.0, 1.3, 0.9];
        let (g, inputs) = graph(a, [1.0, 1.0, 2.0, 1.0], Some(roi));
        assert_resized(&check_graph(&g, &inputs));
        for sm in [80, 90] {
            ptxas_check(&g, sm);
        }
    }
}
