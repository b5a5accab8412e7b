//! Tests of the generated kernels: builds one-node graphs, lowers them, runs the kernel on this
//! machine (`gen::jit`) and compares with `kiln_ir`'s evaluator.

use super::{GeneratedKernel, KernelBuilder};
use crate::kernel::epilogue::{Activation, Bias, Epilogue};
use crate::node::NodeInfo;
use crate::target::TargetDesc;
use inkwell::context::Context;
use inkwell::passes::PassBuilderOptions;
use inkwell::OptimizationLevel;
use kiln_ir::{AutoPad, ConvAttrs, DType, Dim, Graph, NodeId, Op, Tensor, TensorType, ValueId};

/// Compiles `kernel` for `node` and runs it once, then `reps` more times timed, on `inputs`
/// (one slice per node input; constants included). Returns the output and the fastest timed
/// run's seconds.
pub(crate) fn run_kernel(
    kernel: &dyn GeneratedKernel,
    node: &NodeInfo,
    target: &TargetDesc,
    inputs: &[Option<Vec<f32>>],
    out_len: usize,
    threads: usize,
    reps: usize,
) -> (Vec<f32>, f64) {
    let r = super::jit::run(kernel, node, target, inputs, out_len, threads, reps, 0.0, None).unwrap();
    (r.out, r.best_secs)
}

/// Bytes in an f32 buffer, as `run_kernel` passes inputs (integer operands).
pub(crate) fn as_words(bytes: &[u8]) -> Vec<f32> {
    let mut words = vec![0f32; bytes.len().div_ceil(4) + 1];
    for (i, chunk) in bytes.chunks(4).enumerate() {
        let mut w = [0u8; 4];
        w[..chunk.len()].copy_from_slice(chunk);
        words[i] = f32::from_le_bytes(w);
    }
    words
}

use crate::test_rng::TestRng as Rng;

fn ty(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F32, shape.iter().map(|&d| Dim::Fixed(d)).collect())
}

/// A one-node test case: graph, node, and the data of each node input.
struct Case {
    g: Graph,
    id: NodeId,
    data: Vec<Option<Vec<f32>>>,
    graph_inputs: Vec<Tensor>,
}

struct CaseBuilder {
    g: Graph,
    rng: Rng,
    vals: Vec<Option<ValueId>>,
    data: Vec<Option<Vec<f32>>>,
    graph_inputs: Vec<Tensor>,
}

impl CaseBuilder {
    fn new(seed: u64) -> Self {
        CaseBuilder {
            g: Graph::new("t"),
            rng: Rng::new(seed),
            vals: vec![],
            data: vec![],
            graph_inputs: vec![],
        }
    }

    /// Adds a node input: a graph input (runtime) or a constant.
    fn operand(mut self, shape: &[usize], constant: bool) -> Self {
        let n: usize = shape.iter().product();
        let v = self.rng.vec(n);
        let name = format!("in{}", self.vals.len());
        let id = if constant {
            self.g
                .add_const(name, Tensor::from_vec(shape.to_vec(), v.clone()))
        } else {
            self.graph_inputs
                .push(Tensor::from_vec(shape.to_vec(), v.clone()));
            self.g.add_input(name, ty(shape))
        };
        self.vals.push(Some(id));
        self.data.push(Some(v));
        self
    }

    fn absent(mut self) -> Self {
        self.vals.push(None);
        self.data.push(None);
        self
    }

    fn node(mut self, op: Op) -> Case {
        let y = self.g.add("n", op, self.vals.clone(), "y").unwrap();
        self.g.add_output("y", y);
        Case {
            id: y.node,
            g: self.g,
            data: self.data,
            graph_inputs: self.graph_inputs,
        }
    }
}

impl Case {
    fn reference(&self) -> Vec<f32> {
        let out = kiln_ir::eval::eval_graph(&self.g, self.graph_inputs.clone()).unwrap();
        out[0].as_slice::<f32>().unwrap().to_vec()
    }

    fn run(&self, epi: Option<Epilogue>, threads: usize) -> Vec<f32> {
        self.run_on(&TargetDesc::host().unwrap(), epi, threads)
    }

    /// Runs the kernel generated for `target`, which must run on this machine.
    fn run_on(&self, target: &TargetDesc, epi: Option<Epilogue>, threads: usize) -> Vec<f32> {
        let target = target.clone();
        let node = NodeInfo::new(&self.g, self.id);
        let k = match epi {
            None => super::products::lower(&node, &target),
            Some(e) => super::products::lower_fused(&node, &target, e),
        }
        .unwrap()
        .unwrap_or_else(|| panic!("not lowered: {:?}", self.g.node(self.id).op));
        let n: usize = node.output_shape(0).unwrap().iter().product();
        run_kernel(k.as_ref(), &node, &target, &self.data, n, threads, 0).0
    }

    fn check(&self, what: &str) {
        let want = self.reference();
        for threads in [1, 2] {
            let got = self.run(None, threads);
            compare(what, &got, &want);
        }
    }
}

fn compare(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 + 1e-4 * w.abs(),
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

fn conv(kernel: [usize; 2], strides: [usize; 2], pads: [usize; 4], dil: [usize; 2], group: usize) -> Op {
    Op::Conv(ConvAttrs {
        kernel_shape: kernel.to_vec(),
        strides: strides.to_vec(),
        pads: pads.to_vec(),
        dilations: dil.to_vec(),
        group,
        auto_pad: AutoPad::NotSet,
        channels_last: false,
    })
}

#[path = "testing_nhwc.rs"]
mod nhwc;

#[path = "testing_bf16.rs"]
mod bf16;

#[path = "testing_winograd.rs"]
mod winograd;

#[test]
fn matmul_shapes() {
    let shapes = [
        (1, 1, 1),
        (5, 7, 3),
        (13, 17, 29),
        (6, 16, 8),
        (64, 64, 64),
        (100, 37, 300),
        (7, 600, 33),
    ];
    for (i, &(m, k, n)) in shapes.iter().enumerate() {
        for (ca, cb) in [(false, true), (false, false), (true, false)] {
            let case = CaseBuilder::new(i as u64)
                .operand(&[m, k], ca)
                .operand(&[k, n], cb)
                .node(Op::MatMul);
            case.check(&format!("matmul {m}x{k}x{n} const A {ca} B {cb}"));
        }
    }
}

#[test]
fn matmul_batched_and_vectors() {
    let cases: &[(&[usize], &[usize], bool)] = &[
        (&[2, 3, 5, 7], &[7, 9], true),
        (&[2, 3, 5, 7], &[7, 9], false),
        (&[2, 1, 5, 7], &[3, 7, 4], false),
        (&[3, 5, 7], &[3, 7, 20], true),
        (&[7], &[7, 5], true),
        (&[3, 7], &[7], false),
        (&[4, 9, 19], &[19], false),
    ];
    for (i, (a, b, cb)) in cases.iter().enumerate() {
        let case = CaseBuilder::new(100 + i as u64)
            .operand(a, false)
            .operand(b, *cb)
            .node(Op::MatMul);
        case.check(&format!("matmul {a:?} x {b:?} const B {cb}"));
    }
}

/// `[seq, 1, d] · [d, n]` runs as one product of `seq` rows (not `seq` matrix-vector
/// products), with the same results.
#[test]
fn matmul_batch_of_rows_is_one_product() {
    for (a, cb) in [(&[40usize, 1, 33][..], true), (&[2, 3, 5, 33][..], false)] {
        let case = CaseBuilder::new(150)
            .operand(a, false)
            .operand(&[33, 70], cb)
            .node(Op::MatMul);
        case.check(&format!("matmul {a:?} x [33, 70]"));
        let node = NodeInfo::new(&case.g, case.id);
        let k = super::products::lower(&node, &TargetDesc::host().unwrap())
            .unwrap()
            .unwrap();
        let rows: usize = a[..a.len() - 1].iter().product();
        assert!(k.describe().contains(&format!(" M={rows} ")), "{}", k.describe());
        assert!(k.describe().contains(" batch=1 "), "{}", k.describe());
    }
}

#[test]
fn gemm_variants() {
    let (m, k, n) = (11, 23, 19);
    for trans_a in [false, true] {
        for trans_b in [false, true] {
            for (cshape, cconst) in [
                (None, false),
                (Some(vec![n]), true),
                (Some(vec![m, 1]), true),
                (Some(vec![m, n]), true),
                (Some(vec![]), true),
                (Some(vec![m, n]), false),
            ] {
                for bconst in [true, false] {
                    let sa = if trans_a { [k, m] } else { [m, k] };
                    let sb = if trans_b { [n, k] } else { [k, n] };
                    let mut cb = CaseBuilder::new(7).operand(&sa, false).operand(&sb, bconst);
                    cb = match &cshape {
                        Some(s) => cb.operand(s, cconst),
                        None => cb.absent(),
                    };
                    let beta = if cconst { 0.5 } else { 1.0 };
                    let case = cb.node(Op::Gemm {
                        alpha: 1.5,
                        beta,
                        trans_a,
                        trans_b,
                    });
                    case.check(&format!(
                        "gemm tA {trans_a} tB {trans_b} C {cshape:?} const {cconst} B const {bconst}"
                    ));
                }
            }
        }
    }
}

/// Products whose last row panel and last column panel are cut (M % MR rows, N % NR columns
/// in whole vectors), which run exact tile variants, with every epilogue input (bias per
/// column and per row, the residual C) and K split into several blocks.
#[test]
fn gemm_cut_panels() {
    // (m, k, n): M = 1 (a matrix-vector product), M = 49 (a 7x7 stage), N = 24, 40, 1000.
    let shapes = [
        (1, 40, 24),
        (1, 600, 1000),
        (13, 600, 40),
        (49, 300, 8),
        (7, 257, 24),
        (5, 9, 56),
    ];
    for (i, &(m, k, n)) in shapes.iter().enumerate() {
        for (cshape, cconst) in [(vec![n], true), (vec![m, 1], true), (vec![m, n], false)] {
            for bconst in [true, false] {
                let case = CaseBuilder::new(60 + i as u64)
                    .operand(&[m, k], false)
                    .operand(&[k, n], bconst)
                    .operand(&cshape, cconst)
                    .node(Op::Gemm {
                        alpha: 0.75,
                        beta: 1.0,
                        trans_a: false,
                        trans_b: false,
                    });
                case.check(&format!("gemm {m}x{k}x{n} C {cshape:?} B const {bconst}"));
            }
        }
    }
}

/// The register tile follows the product's shape on AVX-512 and is fixed elsewhere.
#[test]
fn register_tile_by_shape() {
    use super::gemm::Tile;
    let v4 = TargetDesc::select(None, Some("x86-64-v4")).unwrap();
    let tile = |m, n| {
        let t = Tile::for_product(&v4, m, n);
        (t.mr, t.nr())
    };
    // Transformer rows (128 = 16 × 8), a 7×7 stage (49 rows: 54 in 6-row tiles, 60 in
    // 12-row ones), a 56×56 stage with 24 channels (12×2 wastes the least).
    assert_eq!(tile(128, 768), (8, 48));
    assert_eq!(tile(49, 512), (6, 64));
    assert_eq!(tile(3136, 24), (12, 32));
    let v3 = TargetDesc::select(None, Some("x86-64-v3")).unwrap();
    for (m, n) in [(128, 768), (49, 512), (3136, 24)] {
        assert_eq!(Tile::for_product(&v3, m, n), Tile::for_target(&v3));
    }
}

/// Products whose shapes pick each AVX-512 register tile (`Tile::for_product`: 12×2, 8×3,
/// 6×4 vectors), each with a cut row panel and a cut column panel (in whole vectors, or in
/// part of one through the local copy), K in one block and in several, B constant and at
/// run time.
#[test]
fn each_register_tile_with_cut_panels() {
    let host = TargetDesc::host().unwrap();
    // (m, k, n, the tile's rows × columns on AVX-512)
    let shapes = [
        (23, 300, 30, "12x32"),
        (21, 700, 40, "8x48"),
        (13, 300, 80, "8x48"),
        (5, 700, 120, "6x64"),
        (11, 300, 112, "6x64"),
    ];
    for (i, &(m, k, n, tile)) in shapes.iter().enumerate() {
        for bconst in [true, false] {
            let case = CaseBuilder::new(400 + i as u64)
                .operand(&[m, k], false)
                .operand(&[k, n], bconst)
                .node(Op::MatMul);
            let what = format!("matmul {m}x{k}x{n} B const {bconst}");
            if host.isa == crate::target::Isa::Avx512 {
                let node = NodeInfo::new(&case.g, case.id);
                let kernel = super::products::lower(&node, &host).unwrap().unwrap();
                assert!(
                    kernel.describe().contains(&format!(" {tile} ")),
                    "{what}: {}",
                    kernel.describe()
                );
            }
            case.check(&what);
        }
    }
}

#[test]
fn conv_shapes() {
    // (n, c, h, w, m, k, stride, pad, dilation, group)
    let cases = [
        (1, 3, 9, 11, 5, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
        (2, 4, 8, 8, 8, [1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1),
        (1, 16, 7, 7, 13, [1, 1], [2, 2], [0, 0, 0, 0], [1, 1], 1),
        (1, 3, 23, 23, 16, [7, 7], [2, 2], [3, 3, 3, 3], [1, 1], 1),
        (1, 5, 12, 10, 7, [3, 3], [1, 1], [2, 1, 0, 2], [2, 2], 1),
        (1, 6, 13, 9, 6, [3, 2], [2, 1], [1, 0, 1, 1], [1, 2], 2),
        (2, 8, 6, 6, 12, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 4),
        (1, 32, 20, 20, 33, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
        (1, 64, 9, 9, 40, [3, 3], [2, 2], [1, 1, 1, 1], [1, 1], 1),
        (1, 300, 5, 5, 7, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1),
    ];
    for (i, &(n, c, h, w, m, k, s, p, d, g)) in cases.iter().enumerate() {
        for bias in [true, false] {
            let mut cb = CaseBuilder::new(200 + i as u64)
                .operand(&[n, c, h, w], false)
                .operand(&[m, c / g, k[0], k[1]], true);
            if bias {
                cb = cb.operand(&[m], true);
            }
            let case = cb.node(conv(k, s, p, d, g));
            case.check(&format!("conv case {i} bias {bias}"));
        }
    }
}

#[test]
fn depthwise_shapes() {
    // (n, c, h, w, k, stride, pad, dilation)
    let cases = [
        (1, 8, 14, 14, 3, 1, 1, 1),
        (1, 5, 15, 13, 3, 2, 1, 1),
        (2, 3, 7, 7, 5, 1, 2, 1),
        (1, 4, 17, 19, 5, 2, 2, 1),
        (1, 6, 40, 41, 3, 1, 1, 1),
        (1, 6, 11, 12, 3, 3, 0, 2),
    ];
    for (i, &(n, c, h, w, k, s, p, d)) in cases.iter().enumerate() {
        let case = CaseBuilder::new(300 + i as u64)
            .operand(&[n, c, h, w], false)
            .operand(&[c, 1, k, k], true)
            .operand(&[c], true)
            .node(conv([k, k], [s, s], [p, p, p, p], [d, d], c));
        case.check(&format!("depthwise case {i}"));
    }
}

#[test]
fn fused_epilogues() {
    let case = CaseBuilder::new(400)
        .operand(&[1, 8, 10, 10], false)
        .operand(&[12, 8, 3, 3], true)
        .operand(&[12], true)
        .node(conv([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1));
    let want = case.reference();
    let bias: Vec<f32> = case.data[2].clone().unwrap();
    type Reference = fn(f32) -> f32;
    let acts: [(Activation, Reference); 5] = [
        (Activation::Relu, |x| x.max(0.0)),
        (Activation::Clip { min: -0.2, max: 0.3 }, |x| x.clamp(-0.2, 0.3)),
        (Activation::Sigmoid, |x| 1.0 / (1.0 + (-x).exp())),
        (Activation::Silu, |x| x / (1.0 + (-x).exp())),
        (Activation::HardSwish, |x| x * (x / 6.0 + 0.5).clamp(0.0, 1.0)),
    ];
    for (act, f) in acts {
        let epi = Epilogue::new(Bias::PerRow(bias.clone()), None, act);
        let got = case.run(Some(epi), 2);
        let want: Vec<f32> = want.iter().map(|&x| f(x)).collect();
        compare(&format!("{act:?}"), &got, &want);
    }
    // A quantize-dequantize pair, on the kernel's own product (one flipped rounding would
    // move a value by a whole step): the epilogue must round exactly as the elementwise
    // Div, Round, Clip and Mul do. With a Relu folded in, the lower bound is 0.
    let plain = case.run(
        Some(Epilogue::new(Bias::PerRow(bias.clone()), None, Activation::None)),
        2,
    );
    for (scale, lo, hi) in [
        (0.05f32, -128.0f32, 127.0f32),
        (0.01, 0.0, 255.0),
        (0.2, -3.0, 4.0),
    ] {
        let act = Activation::FakeQuant { scale, lo, hi };
        let got = case.run(Some(Epilogue::new(Bias::PerRow(bias.clone()), None, act)), 2);
        let want: Vec<f32> = plain
            .iter()
            .map(|&x| (x / scale).round_ties_even().clamp(lo, hi) * scale)
            .collect();
        assert_eq!(got, want, "{act:?}");
    }
    // GELU, referenced by the interpreter's Gelu on the biased product.
    for (act, tanh) in [(Activation::GeluErf, false), (Activation::GeluTanh, true)] {
        let epi = Epilogue::new(Bias::PerRow(bias.clone()), None, act);
        let got = case.run(Some(epi), 2);
        compare(&format!("{act:?}"), &got, &ir_gelu(&want, tanh));
    }
    // Depthwise with Relu6.
    let case = CaseBuilder::new(401)
        .operand(&[1, 8, 10, 10], false)
        .operand(&[8, 1, 3, 3], true)
        .operand(&[8], true)
        .node(conv([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 8));
    let want: Vec<f32> = case.reference().iter().map(|x| x.clamp(0.0, 6.0)).collect();
    let bias = case.data[2].clone().unwrap();
    let epi = Epilogue::new(Bias::PerRow(bias), None, Activation::Clip { min: 0.0, max: 6.0 });
    compare("dw relu6", &case.run(Some(epi), 2), &want);
}

fn ir_gelu(xs: &[f32], tanh: bool) -> Vec<f32> {
    use kiln_ir::Unary;
    let mut g = Graph::new("gelu");
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[xs.len()]));
    let y = g
        .add("y", Op::Unary(Unary::Gelu { tanh }), vec![Some(x)], "y")
        .unwrap();
    g.add_output("y", y);
    let out = kiln_ir::eval::eval_graph(&g, vec![Tensor::from_vec(vec![xs.len()], xs.to_vec())]).unwrap();
    out[0].as_slice::<f32>().unwrap().to_vec()
}

/// The kernels also build (and pass the verifier) for AVX-512 and the portable ISA.
#[test]
fn other_isas_verify() {
    let targets = [
        TargetDesc::select(None, Some("znver4")).unwrap(),
        TargetDesc::select(None, Some("x86-64")).unwrap(),
        TargetDesc::select(Some("aarch64-unknown-linux-gnu"), Some("neoverse-n1")).unwrap(),
    ];
    let cases = [
        CaseBuilder::new(1)
            .operand(&[1, 8, 10, 10], false)
            .operand(&[12, 8, 3, 3], true)
            .operand(&[12], true)
            .node(conv([3, 3], [2, 2], [1, 1, 1, 1], [1, 1], 1)),
        CaseBuilder::new(2)
            .operand(&[1, 8, 10, 10], false)
            .operand(&[8, 1, 3, 3], true)
            .node(conv([3, 3], [2, 2], [1, 1, 1, 1], [1, 1], 8)),
        CaseBuilder::new(3)
            .operand(&[3, 20, 30], false)
            .operand(&[30, 17], false)
            .node(Op::MatMul),
    ];
    for target in &targets {
        for case in &cases {
            let node = NodeInfo::new(&case.g, case.id);
            let k = super::products::lower(&node, target).unwrap().unwrap();
            let cx = Context::create();
            let module = cx.create_module("t");
            let tm = target.target_machine(OptimizationLevel::Aggressive).unwrap();
            module.set_triple(&tm.get_triple());
            module.set_data_layout(&tm.get_target_data().get_data_layout());
            let ptr = cx.ptr_type(inkwell::AddressSpace::default());
            let f = module.add_function(
                "kern",
                cx.i32_type().fn_type(&[ptr.into(), ptr.into()], false),
                None,
            );
            crate::llvm::set_kernel_attributes(&cx, f, target);
            let builder = cx.create_builder();
            builder.position_at_end(cx.append_basic_block(f, "entry"));
            let kb = KernelBuilder {
                cx: &cx,
                module: &module,
                builder: &builder,
                function: f,
                target,
                node: &node,
                n_inputs: node.n_inputs(),
                n_outputs: 1,
                n_packed: k.packed_constants().len(),
            };
            k.emit(&kb).unwrap();
            crate::llvm::verify(&module).unwrap();
            module
                .run_passes("default<O3>", &tm, PassBuilderOptions::create())
                .unwrap();
            crate::llvm::verify(&module).unwrap();
            tm.write_to_memory_buffer(&module, inkwell::targets::FileType::Object)
                .unwrap();
        }
    }
}

/// GFLOP/s on ResNet/BERT-like layers: `cargo test -p kiln-codegen --release gemm_speed -- --ignored --nocapture`.
#[test]
#[ignore]
fn gemm_speed() {
    let layers: Vec<(&str, Case, f64)> = vec![
        (
            "conv 64->64 3x3 56x56",
            CaseBuilder::new(1)
                .operand(&[1, 64, 56, 56], false)
                .operand(&[64, 64, 3, 3], true)
                .operand(&[64], true)
                .node(conv([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1)),
            2.0 * 64.0 * 64.0 * 9.0 * 56.0 * 56.0,
        ),
        (
            "conv 1x1 256->64 56x56",
            CaseBuilder::new(2)
                .operand(&[1, 256, 56, 56], false)
                .operand(&[64, 256, 1, 1], true)
                .operand(&[64], true)
                .node(conv([1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1)),
            2.0 * 64.0 * 256.0 * 56.0 * 56.0,
        ),
        (
            "conv 512->512 3x3 7x7",
            CaseBuilder::new(3)
                .operand(&[1, 512, 7, 7], false)
                .operand(&[512, 512, 3, 3], true)
                .operand(&[512], true)
                .node(conv([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1)),
            2.0 * 512.0 * 512.0 * 9.0 * 49.0,
        ),
        (
            "matmul 128x768 x 768x768",
            CaseBuilder::new(4)
                .operand(&[128, 768], false)
                .operand(&[768, 768], true)
                .node(Op::MatMul),
            2.0 * 128.0 * 768.0 * 768.0,
        ),
        (
            "dwconv 3x3/1 32ch 112x112",
            CaseBuilder::new(5)
                .operand(&[1, 32, 112, 112], false)
                .operand(&[32, 1, 3, 3], true)
                .operand(&[32], true)
                .node(conv([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 32)),
            2.0 * 32.0 * 9.0 * 112.0 * 112.0,
        ),
    ];
    let target = TargetDesc::host().unwrap();
    let filter = std::env::var("KILN_SPEED_FILTER").unwrap_or_default();
    for (name, case, flops) in layers.iter().filter(|l| l.0.contains(&filter)) {
        let node = NodeInfo::new(&case.g, case.id);
        let k = super::products::lower(&node, &target).unwrap().unwrap();
        let n: usize = node.output_shape(0).unwrap().iter().product();
        for threads in [1, 2] {
            let reps = (6e10 / flops).clamp(20.0, 400.0) as usize;
            let (_, secs) = run_kernel(k.as_ref(), &node, &target, &case.data, n, threads, reps);
            println!(
                "{name:28} {threads} thr: {:8.3} ms {:7.1} GFLOP/s   [{}]",
                secs * 1e3,
                flops / secs / 1e9,
                k.describe()
            );
        }
    }
}

#[test]
fn conv_1d_shapes() {
    // 1-D convolutions as 2-D ones of height 1. (n, c, l, m, k, stride, pads, dilation,
    // group, auto_pad): a speech front end's strided kernel, dilation, a grouped and a
    // depthwise one, SAME padding with default attributes, a pointwise one.
    let cases = [
        (1, 1, 400, 8, 10, 5, [0, 0], 1, 1, AutoPad::NotSet),
        (2, 6, 37, 10, 3, 1, [2, 2], 2, 1, AutoPad::NotSet),
        (1, 8, 30, 12, 5, 2, [1, 3], 1, 4, AutoPad::NotSet),
        (1, 7, 25, 7, 3, 1, [1, 1], 1, 7, AutoPad::NotSet),
        (1, 5, 19, 6, 4, 2, [0, 0], 1, 1, AutoPad::SameUpper),
        (2, 16, 11, 9, 1, 1, [0, 0], 1, 1, AutoPad::NotSet),
    ];
    for (i, &(n, c, l, m, k, s, p, d, g, auto_pad)) in cases.iter().enumerate() {
        let same = auto_pad != AutoPad::NotSet;
        let case = CaseBuilder::new(520 + i as u64)
            .operand(&[n, c, l], false)
            .operand(&[m, c / g, k], true)
            .operand(&[m], true)
            .node(Op::Conv(ConvAttrs {
                kernel_shape: if same { vec![] } else { vec![k] },
                strides: vec![s],
                pads: if same { vec![] } else { p.to_vec() },
                dilations: if same { vec![] } else { vec![d] },
                group: g,
                auto_pad,
                channels_last: false,
            }));
        case.check(&format!("conv 1-D case {i}"));
    }
}

#[test]
fn conv_auto_pad_and_defaults() {
    for (i, auto_pad) in [AutoPad::SameUpper, AutoPad::SameLower, AutoPad::Valid]
        .into_iter()
        .enumerate()
    {
        for (c, g) in [(6, 1), (6, 6)] {
            let case = CaseBuilder::new(500 + i as u64)
                .operand(&[1, c, 10, 9], false)
                .operand(&[6, c / g, 4, 3], true)
                .node(Op::Conv(ConvAttrs {
                    kernel_shape: vec![],
                    strides: vec![2, 2],
                    pads: vec![],
                    dilations: vec![],
                    group: g,
                    auto_pad,
                    channels_last: false,
                }));
            case.check(&format!("conv auto_pad {auto_pad:?} group {g}"));
        }
    }
    // Batched MatMul with a constant, batched A.
    let case = CaseBuilder::new(510)
        .operand(&[3, 5, 7], true)
        .operand(&[3, 7, 9], false)
        .node(Op::MatMul);
    case.check("matmul const batched A");
}
