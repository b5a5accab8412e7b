//! The f32 attention kernel over several blocks of query rows per head, called twice in a
//! row: a thread reuses the keys it packed for the previous block of the same head (its
//! scratch's tag), and never the keys of an earlier call, which sit at the same place in its
//! scratch with the same (batch, head) tag. Against the reference interpreter on one and two
//! threads, with one head (the second call starts on the head the first ended on) and two; on
//! a CPU with avx512_bf16 also compiled with `--precision bf16`, whose tiles keep packed keys
//! and values the same way. And a boolean mask that hides every key from some query rows and
//! part of them from others, rows of both kinds in every block: the softmax runs phase by
//! phase over a block's rows. And padding masks (`[B, 1, 1, T]`, boolean and float), whose
//! masked keys past the last one let through the kernel skips.

use kiln_driver::{Cpu, Options, Precision, Session};
use kiln_ir::{AttentionAttrs, DType, Graph, Op, Tensor, TensorType};
use kiln_tests::compiled::{compile_graph, run_executable, WorkDir};
use std::path::Path;

const B: usize = 1;
/// More query rows than one task takes (64 rows per task with fewer than 8 heads).
const SQ: usize = 300;
const T: usize = 70;
const D: usize = 16;

/// `y = Attention(Attention(q, k1, v1), k2, v2)` with `h` heads.
fn graph(h: usize) -> Graph {
    let mut g = Graph::new("attention_blocks");
    let heads = |n| TensorType::fixed(DType::F32, &[B, h, n, D]);
    let q = g.add_input("q", heads(SQ));
    let kv: Vec<_> = ["k1", "v1", "k2", "v2"]
        .into_iter()
        .map(|n| g.add_input(n, heads(T)))
        .collect();
    let attention = |g: &mut Graph, name: &str, q, k, v| {
        g.add(
            name,
            Op::Attention(AttentionAttrs::default()),
            vec![Some(q), Some(k), Some(v)],
            format!("{name}_y"),
        )
        .unwrap()
    };
    let first = attention(&mut g, "first", q, kv[0], kv[1]);
    let second = attention(&mut g, "second", first, kv[2], kv[3]);
    g.add_output("y", second);
    g
}

/// Deterministic values in [-2, 2).
fn values(shape: &[usize], seed: usize) -> Tensor {
    let n = shape.iter().product();
    let x = (0..n)
        .map(|i| ((i * 7919 + seed * 104_729) % 2003) as f32 / 500.75 - 2.0)
        .collect();
    Tensor::from_vec(shape.to_vec(), x)
}

/// How a test model is compiled: its kernel lines, and the largest error allowed against the
/// reference (the bf16 tiles round Q, K, V and the probabilities to bf16).
struct Build {
    precision: Precision,
    /// What every attention kernel's line says.
    kernel: &'static str,
    /// The error allowed: `abs + rel * |want|`.
    abs: f32,
    rel: f32,
}

const F32: Build = Build {
    precision: Precision::F32,
    kernel: "kiln_uk_attention_f32",
    abs: 1e-5,
    rel: 1e-4,
};

const BF16: Build = Build {
    precision: Precision::Bf16,
    kernel: "bf16 tiles",
    abs: 3e-2,
    rel: 3e-2,
};

#[test]
fn packed_keys_are_reused_within_a_call_only() {
    for h in [1, 2] {
        check(h, &F32);
    }
}

#[test]
fn bf16_tiles_reuse_packed_keys_within_a_call_only() {
    let host = kiln_codegen::target::TargetDesc::select(None, None).unwrap();
    if !host.has_bf16_pair_kernels() {
        eprintln!("this CPU has no avx512_bf16: the bf16 tiles are not compiled for it");
        return;
    }
    for h in [1, 2] {
        check(h, &BF16);
    }
}

/// Compiles `g` for the host as `kiln compile --precision P` does; returns the kernel lines.
fn compile(g: &Graph, precision: Precision, exe: &Path) -> Vec<String> {
    if precision == Precision::F32 {
        return compile_graph(g, "attention_blocks", kiln_codegen::Emit::Exe, exe)
            .unwrap()
            .kernel_lines;
    }
    let mut session = Session::new(Options {
        name: Some("attention_blocks".into()),
        precision,
        cpu: Cpu::Native,
        ..Options::default()
    });
    let mut g = g.clone();
    session.optimize(&mut g).unwrap();
    session.emit(&g, exe).unwrap().kernel_lines
}

fn check(h: usize, build: &Build) {
    let g = graph(h);
    let work = WorkDir::new(&format!("attention_blocks_{h}"));
    let exe = work.0.join("model");
    let lines = compile(&g, build.precision, &exe);
    let attention = lines.iter().filter(|l| l.contains(build.kernel)).count();
    assert_eq!(attention, 2, "both on {}: {lines:#?}", build.kernel);

    let names = ["q", "k1", "v1", "k2", "v2"];
    let inputs: Vec<Tensor> = names
        .iter()
        .enumerate()
        .map(|(i, n)| values(&[B, h, if *n == "q" { SQ } else { T }, D], i + 1))
        .collect();
    let want = kiln_ir::eval::eval_graph(&g, inputs.clone()).unwrap();
    let feeds: Vec<_> = names.iter().map(|n| n.to_string()).zip(inputs).collect();
    for threads in [1, 2] {
        let got = run_executable(&exe, &g, &feeds, &work.0, threads).unwrap();
        let (got, want) = (
            got[0].as_slice::<f32>().unwrap(),
            want[0].as_slice::<f32>().unwrap(),
        );
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= build.abs + build.rel * w.abs(),
                "{} heads, {threads} threads: element {i} is {g}, want {w}",
                h
            );
        }
    }
}

/// `y = Attention(q, k, v, mask)` over `batch` entries of `h` heads, `mask` of `dtype` and
/// `mask_shape`.
fn masked_graph(batch: usize, h: usize, dtype: DType, mask_shape: &[usize]) -> Graph {
    let mut g = Graph::new("attention_masked");
    let heads = |n| TensorType::fixed(DType::F32, &[batch, h, n, D]);
    let q = g.add_input("q", heads(SQ));
    let k = g.add_input("k", heads(T));
    let v = g.add_input("v", heads(T));
    let mask = g.add_input("mask", TensorType::fixed(dtype, mask_shape));
    let y = g
        .add(
            "attention",
            Op::Attention(AttentionAttrs::default()),
            vec![Some(q), Some(k), Some(v), Some(mask)],
            "y",
        )
        .unwrap();
    g.add_output("y", y);
    g
}

/// The builds this CPU runs: f32, and bf16 where it has avx512_bf16.
fn host_builds() -> Vec<Build> {
    let host = kiln_codegen::target::TargetDesc::select(None, None).unwrap();
    let mut builds = vec![F32];
    if host.has_bf16_pair_kernels() {
        builds.push(BF16);
    }
    builds
}

/// Compiles a `masked_graph` for each of `builds` and compares its runs on one and two
/// threads with `want` (the reference's output for `inputs`: q, k, v, mask).
fn check_masked(g: &Graph, inputs: Vec<Tensor>, want: &[f32], builds: &[Build], what: &str) {
    let feeds: Vec<_> = ["q", "k", "v", "mask"]
        .iter()
        .map(|n| n.to_string())
        .zip(inputs)
        .collect();
    for build in builds {
        let work = WorkDir::new(&format!("attention_{what}_{:?}", build.precision));
        let exe = work.0.join("model");
        let lines = compile(g, build.precision, &exe);
        assert!(lines.iter().any(|l| l.contains(build.kernel)), "{lines:#?}");
        for threads in [1, 2] {
            let got = run_executable(&exe, g, &feeds, &work.0, threads).unwrap();
            let got = got[0].as_slice::<f32>().unwrap();
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                assert!(
                    (g - w).abs() <= build.abs + build.rel * w.abs(),
                    "{what}, {:?}, {threads} threads: element {i} is {g}, want {w}",
                    build.precision
                );
            }
        }
    }
}

#[test]
fn rows_with_every_key_masked_give_zeros_beside_partly_masked_ones() {
    let h = 2;
    let g = masked_graph(B, h, DType::Bool, &[1, 1, SQ, T]);
    // Every fifth query row sees no key; the others two keys of three.
    let mask: Vec<bool> = (0..SQ * T)
        .map(|x| !(x / T).is_multiple_of(5) && !(x % T + x / T).is_multiple_of(3))
        .collect();
    let inputs = vec![
        values(&[B, h, SQ, D], 1),
        values(&[B, h, T, D], 2),
        values(&[B, h, T, D], 3),
        Tensor::from_vec(vec![1, 1, SQ, T], mask),
    ];
    let want = kiln_ir::eval::eval_graph(&g, inputs.clone()).unwrap();
    let want = want[0].as_slice::<f32>().unwrap();
    assert!(want.chunks(D).step_by(5).all(|row| row.iter().all(|&x| x == 0.0)));
    check_masked(&g, inputs, want, &host_builds(), "masked_rows");
}

/// Padding masks as exporters write them, boolean and float (`finfo(float32).min`, as Hugging
/// Face adds), one row per batch entry or one per query: batch entry 0 lets keys through up
/// to an isolated one, at 41 in its longest row (the keys after it are skipped); entry 1 none
/// at all — a boolean mask then gives zeros, a float one averages over every key, as the
/// reference does, so neither may be cut short; nor may entry 0 where a float mask blanks
/// some of its rows.
#[test]
fn padding_masks_skip_the_keys_after_the_last_one_let_through() {
    let h = 2;
    let cases = [
        (DType::Bool, vec![2, 1, 1, T]),
        (DType::F32, vec![2, 1, 1, T]),
        (DType::F32, vec![2, 1, SQ, T]),
    ];
    for (dtype, shape) in cases {
        let rows = shape[2];
        // Row i of entry 0 lets keys 0..30 through, and key 30 + i % 12 (41 at most);
        // with a row per query, every thirteenth row of it none (averaged over all T keys).
        let through: Vec<bool> = (0..2 * rows * T)
            .map(|x| {
                let (b, i, t) = (x / (rows * T), x / T % rows, x % T);
                let blank = rows > 1 && i % 13 == 5;
                b == 0 && !blank && (t < 30 || t == 30 + i % 12 || (rows == 1 && t == 41))
            })
            .collect();
        let mask = match dtype {
            DType::Bool => Tensor::from_vec(shape.clone(), through),
            _ => Tensor::from_vec(
                shape.clone(),
                through
                    .iter()
                    .map(|&t| if t { 0.0f32 } else { f32::MIN })
                    .collect::<Vec<_>>(),
            ),
        };
        let g = masked_graph(2, h, dtype, &shape);
        let inputs = vec![
            values(&[2, h, SQ, D], 4),
            values(&[2, h, T, D], 5),
            values(&[2, h, T, D], 6),
            mask,
        ];
        let want = kiln_ir::eval::eval_graph(&g, inputs.clone()).unwrap();
        let want = want[0].as_slice::<f32>().unwrap();
        let second = &want[want.len() / 2..];
        assert_eq!(second.iter().all(|&x| x == 0.0), dtype == DType::Bool);
        check_masked(
            &g,
            inputs,
            want,
            &host_builds(),
            &format!("padding_{dtype:?}_{rows}"),
        );
    }
}
