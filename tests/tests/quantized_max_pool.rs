//! A quantized model's MaxPool pools bytes: `QuantizeLinear(MaxPool(DequantizeLinear(q)))`
//! with the same parameters becomes `MaxPool(q)` (`integer-products`), channels-last takes
//! the byte pool like a float one, and the NHWC pool kernel computes it on u8 (between integer
//! convolutions) or i8 (between float ones). Compiled for the host and run against the
//! reference interpreter on the graph as written.

use kiln_ir::{
    AutoPad, ConvAttrs, DType, Graph, Op, PoolAttrs, PoolKind, QuantOp, Tensor, TensorType, Unary, ValueId,
};
use kiln_tests::compiled::{compile_graph, run_executable, WorkDir};

const H: usize = 9;

/// Activation scale and weight scale: powers of two, so that the float convolutions and
/// quantizations are exact and no byte sits on a rounding boundary that the summation order
/// could move (the comparison is then exact up to the last product's rounding).
const S: f32 = 1.0 / 32.0;
const SW: f32 = 1.0 / 64.0;

/// Deterministic integers in [-lim, lim).
fn ints(n: usize, seed: usize, lim: i32) -> Vec<i32> {
    (0..n)
        .map(|i| ((i * 7919 + seed * 104_729) % (2 * lim as usize)) as i32 - lim)
        .collect()
}

fn quantize(g: &mut Graph, name: &str, x: ValueId, scale: ValueId, zero: ValueId, dtype: DType) -> ValueId {
    let op = Op::Quant(QuantOp::QuantizeLinear {
        axis: 1,
        block_size: 0,
        output_dtype: dtype,
        precision: None,
    });
    g.add(name, op, vec![Some(x), Some(scale), Some(zero)], name)
        .unwrap()
}

fn dequantize(g: &mut Graph, name: &str, q: ValueId, scale: ValueId, zero: Option<ValueId>) -> ValueId {
    let op = Op::Quant(QuantOp::DequantizeLinear {
        axis: 1,
        block_size: 0,
        output_dtype: None,
    });
    g.add(name, op, vec![Some(q), Some(scale), zero], name).unwrap()
}

/// `Conv` of `x` by s8 weights `[c_out, c_in, 3, 3]` dequantized with one scale.
fn conv(g: &mut Graph, name: &str, x: ValueId, c_in: usize, c_out: usize, seed: usize) -> ValueId {
    let n = c_out * c_in * 9;
    let w: Vec<i8> = ints(n, seed, 8).into_iter().map(|v| v as i8).collect();
    let w = g.add_const(format!("{name}_wq"), Tensor::from_vec(vec![c_out, c_in, 3, 3], w));
    let sw = g.add_const(format!("{name}_sw"), Tensor::scalar(SW));
    let w = dequantize(g, &format!("{name}_w"), w, sw, None);
    let attrs = ConvAttrs {
        kernel_shape: vec![3, 3],
        strides: vec![1, 1],
        pads: vec![1, 1, 1, 1],
        dilations: vec![1, 1],
        group: 1,
        ..ConvAttrs::default()
    };
    g.add(name, Op::Conv(attrs), vec![Some(x), Some(w)], name)
        .unwrap()
}

/// `x → Q → DQ → Conv → Relu (u8 only) → Q → DQ → MaxPool 3×3/2 → Q → DQ → Conv → y`,
/// activations quantized to `dtype` with `zero`, `c` channels between the convolutions.
fn graph(dtype: DType, zero: f64, c: usize) -> Graph {
    let mut g = Graph::new("quantized_max_pool");
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[1, 3, H, H]));
    let s = g.add_const("s", Tensor::scalar(S));
    let z = match dtype {
        DType::U8 => g.add_const("z", Tensor::scalar(zero as u8)),
        _ => g.add_const("z", Tensor::scalar(zero as i8)),
    };
    let xq = quantize(&mut g, "xq", x, s, z, dtype);
    let xd = dequantize(&mut g, "xd", xq, s, Some(z));
    let c1 = conv(&mut g, "conv1", xd, 3, c, 1);
    // u8 after a Relu, as in a CNN; i8 keeps negative values, which a pool comparing
    // unsigned bytes would get wrong.
    let r = match dtype {
        DType::U8 => g
            .add("relu", Op::Unary(Unary::Relu), vec![Some(c1)], "relu")
            .unwrap(),
        _ => c1,
    };
    let rq = quantize(&mut g, "rq", r, s, z, dtype);
    let rd = dequantize(&mut g, "rd", rq, s, Some(z));
    let pool = PoolAttrs {
        kind: PoolKind::Max,
        kernel_shape: vec![3, 3],
        strides: vec![2, 2],
        pads: vec![1, 1, 1, 1],
        dilations: vec![1, 1],
        auto_pad: AutoPad::NotSet,
        ceil_mode: false,
        storage_order: 0,
        channels_last: false,
    };
    let p = g.add("pool", Op::Pool(pool), vec![Some(rd)], "pool").unwrap();
    let pq = quantize(&mut g, "pq", p, s, z, dtype);
    let pd = dequantize(&mut g, "pd", pq, s, Some(z));
    let y = conv(&mut g, "conv2", pd, c, 8, 2);
    g.add_output("y", y);
    g
}

fn check(dtype: DType, zero: f64, c: usize) {
    let g = graph(dtype, zero, c);
    let work = WorkDir::new(&format!("quantized_max_pool_{dtype}_{c}"));
    let exe = work.0.join("model");
    let lines = compile_graph(&g, "quantized_max_pool", kiln_codegen::Emit::Exe, &exe)
        .unwrap()
        .kernel_lines;
    // The pool of the bytes (`integer-products` names it after the float one), channels-last.
    let pools: Vec<&String> = lines.iter().filter(|l| l.contains("MaxPool")).collect();
    assert!(
        pools.len() == 1 && pools[0].starts_with("pool_bytes (MaxPool): kiln_uk_pool_nhwc"),
        "{dtype}, {c} channels: one channels-last pool of bytes: {lines:#?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains("pq")),
        "{dtype}, {c} channels: the pool's quantization is gone: {lines:#?}"
    );
    let x: Vec<f32> = ints(3 * H * H, 7, 64).into_iter().map(|v| v as f32 * S).collect();
    let x = Tensor::from_vec(vec![1, 3, H, H], x);
    let want = kiln_ir::eval::eval_graph(&g, vec![x.clone()]).unwrap();
    let want = want[0].as_slice::<f32>().unwrap();
    let range = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    for threads in [1, 2] {
        let got = run_executable(&exe, &g, &[("x".into(), x.clone())], &work.0, threads).unwrap();
        for (i, (g, w)) in got[0].as_slice::<f32>().unwrap().iter().zip(want).enumerate() {
            // The pooled bytes are the reference's; the products differ only in f32 rounding.
            assert!(
                (g - w).abs() <= 1e-5 * range,
                "{dtype}, {c} channels, {threads} threads: element {i} is {g}, want {w}"
            );
        }
    }
}

#[test]
fn u8_max_pool_between_integer_convolutions() {
    // 64 channels: whole vectors of bytes; 72: a partial one.
    for c in [64, 72] {
        check(DType::U8, 128.0, c);
    }
}

#[test]
fn i8_max_pool_between_float_convolutions() {
    check(DType::I8, 0.0, 72);
}
