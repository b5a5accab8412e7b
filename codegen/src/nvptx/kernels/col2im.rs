//! Col2Im on the GPU, with the library kernel's results (`kiln_uk_col2im` in movement.c): a
//! thread per output element sums, in tap order, the one block per tap whose tap lands on its
//! image position (none in the padding or between strides), in f64 rounded once — the
//! reference's order, so the sums are the reference's. Float tensors; integer ones stay with
//! the library kernel.

use super::scalar::{load_real, store_real};
use crate::error::Result;
use crate::gen::emit::Emit;
use crate::gen::llvm;
use crate::kernel::KernelCommon;
use crate::node::NodeInfo;
use crate::nvptx::{GpuBuilder, GpuKernel, LaunchDims};
use crate::target::TargetDesc;
use inkwell::IntPredicate;
use kiln_ir::{DType, Layout, Op, VisionOp};

const THREADS: u64 = 256;

/// One image axis: its extent, kernel extent, block count, stride, dilation, padding before.
#[derive(Debug, Clone, Copy)]
struct Axis {
    extent: i64,
    kernel: i64,
    blocks: i64,
    stride: i64,
    dilation: i64,
    pad: i64,
}

#[derive(Debug)]
struct Col2ImGpu {
    dtype: DType,
    planes: i64,
    taps: i64,
    blocks: i64,
    axes: Vec<Axis>,
}

/// The kernel for a Col2Im of a static row-major float tensor (image and block shapes known),
/// or None.
pub fn lower(node: &NodeInfo, _target: &TargetDesc) -> Result<Option<Box<dyn GpuKernel>>> {
    if !matches!(node.op(), Op::Vision(VisionOp::Col2Im { .. })) {
        return Ok(None);
    }
    let Some(x) = node.input_type(0) else {
        return Ok(None);
    };
    let out = node.output_type(0);
    let plain = |t: &kiln_ir::TensorType| t.layout == Layout::RowMajor && t.is_static();
    if !plain(x) || !plain(out) || !x.dtype.is_float() {
        return Ok(None);
    }
    let Some(call) = crate::uk::lower(node)? else {
        return Ok(None);
    };
    let at = &call.iattr;
    let axes = at[4..]
        .chunks(6)
        .map(|g| Axis {
            extent: g[0],
            kernel: g[1],
            blocks: g[2],
            stride: g[3],
            dilation: g[4],
            pad: g[5],
        })
        .collect();
    Ok(Some(Box::new(Col2ImGpu {
        dtype: x.dtype,
        planes: at[1],
        taps: at[2],
        blocks: at[3],
        axes,
    })))
}

impl Col2ImGpu {
    fn plane(&self) -> i64 {
        self.axes.iter().map(|a| a.extent).product()
    }
}

impl KernelCommon for Col2ImGpu {
    fn describe(&self) -> String {
        let image: Vec<i64> = self.axes.iter().map(|a| a.extent).collect();
        format!(
            "gpu col2im {} planes of {image:?} from {} taps × {} blocks ({})",
            self.planes,
            self.taps,
            self.blocks,
            self.dtype.name()
        )
    }

    fn reads_input(&self, i: usize) -> bool {
        // image_shape and block_shape are compiled in.
        i == 0
    }
}

impl GpuKernel for Col2ImGpu {
    fn launch(&self) -> LaunchDims {
        LaunchDims::per_item((self.planes * self.plane()) as u64, THREADS)
    }

    fn emit(&self, k: &GpuBuilder<'_, '_>) -> Result<()> {
        let e = Emit::new(k.cx, k.module, k.builder, k.function);
        let (x, y) = (k.input(0)?, k.output(0)?);
        let (f64t, i1) = (k.cx.f64_type(), k.cx.bool_type());
        let plane = self.plane();
        let sum = e.entry_alloca(f64t, "sum")?;
        k.grid_stride_loop((self.planes * plane) as u64, THREADS, |f| {
            let nc = e.udivc(f, plane)?;
            let p = e.uremc(f, plane)?;
            e.store(sum, f64t.const_zero())?;
            e.for_range(e.i64c(0), e.i64c(self.taps), 1, |t| {
                // The block that puts tap t on p, axis by axis (the last fastest).
                let (mut rest_p, mut rest_t) = (p, t);
                let (mut block, mut scale) = (e.i64c(0), 1i64);
                let mut ok = i1.const_all_ones();
                for a in self.axes.iter().rev() {
                    let pos = e.uremc(rest_p, a.extent)?;
                    let tap = e.uremc(rest_t, a.kernel)?;
                    rest_p = e.udivc(rest_p, a.extent)?;
                    rest_t = e.udivc(rest_t, a.kernel)?;
                    let s = e.sub(e.addc(pos, a.pad)?, e.mulc(tap, a.dilation)?)?;
                    let non_negative = e.icmp(IntPredicate::SGE, s, e.i64c(0))?;
                    // Unsigned division is right once s is known not to be negative.
                    let (q, r) = (e.udivc(s, a.stride)?, e.uremc(s, a.stride)?);
                    let fits = e.b.build_and(
                        e.icmp(IntPredicate::EQ, r, e.i64c(0))?,
                        e.icmp(IntPredicate::ULT, q, e.i64c(a.blocks))?,
                        "",
                    );
                    let here =
                        e.b.build_and(non_negative, fits.map_err(llvm)?, "")
                            .map_err(llvm)?;
                    ok = e.b.build_and(ok, here, "").map_err(llvm)?;
                    block = e.add(block, e.mulc(q, scale)?)?;
                    scale *= a.blocks;
                }
                e.if_then(ok, || {
                    let at = e.add(e.mulc(e.add(e.mulc(nc, self.taps)?, t)?, self.blocks)?, block)?;
                    let v = load_real(&e, x, self.dtype, at)?;
                    let acc = super::scalar::load_local(&e, sum)?;
                    e.store(sum, e.b.build_float_add(acc, v, "").map_err(llvm)?)
                })
            })?;
            store_real(&e, y, self.dtype, f, super::scalar::load_local(&e, sum)?)
        })?;
        k.ret()
    }
}

#[cfg(test)]
mod tests {
    use crate::nvptx::emulate::{check_graph, ptxas_check};
    use kiln_ir::{DType, Graph, Op, Tensor, TensorType, VisionOp};

    /// Col2Im of `x` into `image` by `block`, with strides, dilations and pads.
    fn graph(
        x: &Tensor,
        image: &[i64],
        block: &[i64],
        geometry: (Vec<usize>, Vec<usize>, Vec<usize>),
    ) -> Graph {
        let (strides, dilations, pads) = geometry;
        let mut g = Graph::new("t");
        let xv = g.add_input("x", TensorType::fixed(x.dtype(), x.shape()));
        let iv = g.add_const("image", Tensor::from_vec(vec![image.len()], image.to_vec()));
        let bv = g.add_const("block", Tensor::from_vec(vec![block.len()], block.to_vec()));
        let op = Op::Vision(VisionOp::Col2Im {
            dilations,
            pads,
            strides,
        });
        let y = g
            .add("col2im", op, vec![Some(xv), Some(iv), Some(bv)], "y")
            .unwrap();
        g.add_output("y", y);
        g
    }

    fn input(dtype: DType, shape: Vec<usize>) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::from_vec(
            shape,
            (0..n)
                .map(|i| ((i * 37) % 29) as f64 * 0.25 - 3.0)
                .collect::<Vec<f64>>(),
        )
        .cast(dtype)
    }

    #[test]
    fn sums_overlapping_blocks_as_the_reference() {
        // 2-D, overlapping 3×3 blocks (stride 1) with padding; strided and dilated blocks
        // that leave gaps; 1-D; f64 and f16.
        let cases = [
            (
                DType::F32,
                vec![2, 2 * 9, 25],
                vec![5, 5],
                vec![3, 3],
                (vec![1, 1], vec![1, 1], vec![1, 1, 1, 1]),
            ),
            (
                DType::F32,
                vec![1, 3 * 4, 9],
                vec![7, 8],
                vec![2, 2],
                (vec![2, 3], vec![2, 1], vec![0, 1, 0, 0]),
            ),
            (
                DType::F64,
                vec![1, 3, 6],
                vec![8],
                vec![3],
                (vec![1], vec![1], vec![0, 0]),
            ),
            (
                DType::F16,
                vec![1, 4, 16],
                vec![5, 5],
                vec![2, 2],
                (vec![1, 1], vec![1, 1], vec![0, 0, 0, 0]),
            ),
        ];
        for (dtype, shape, image, block, geometry) in cases {
            let x = input(dtype, shape);
            let d = check_graph(&graph(&x, &image, &block, geometry), std::slice::from_ref(&x));
            assert!(d[0].starts_with("gpu col2im"), "{d:?}");
        }
        let x = input(DType::F32, vec![2, 2 * 9, 25]);
        let g = graph(&x, &[5, 5], &[3, 3], (vec![1, 1], vec![1, 1], vec![1, 1, 1, 1]));
        for sm in [80, 90] {
            ptxas_check(&g, sm);
        }
    }
}
