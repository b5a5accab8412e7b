//! Tests of the data movement and shape operators.

use super::concat_split::split_sizes;
use super::scatter::reduce;
use super::slice::slice_range;
use super::*;
use crate::ops::util::unravel;
use crate::{PadMode, ScatterReduction};
use half::f16;

fn sym(s: &str) -> Dim {
    Dim::Sym(s.into())
}

fn i64s(v: &[i64]) -> Tensor {
    Tensor::from_vec(vec![v.len()], v.to_vec())
}

fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_vec(shape.to_vec(), v.to_vec())
}

fn iota(shape: &[usize]) -> Tensor {
    let n = numel(shape);
    Tensor::from_vec(shape.to_vec(), (0..n as i64).collect())
}

/// Infers with every input value known, evaluates, and checks that the evaluated shapes
/// and dtypes agree with the inferred types.
fn run_n(op: &Op, inputs: &[Option<&Tensor>], n_out: usize) -> Res<Vec<Tensor>> {
    let types: Vec<Option<TensorType>> = inputs.iter().map(|t| t.map(Tensor::tensor_type)).collect();
    let icx = InferCtx {
        inputs: types.iter().map(Option::as_ref).collect(),
        values: inputs.to_vec(),
        num_outputs: n_out,
    };
    let out_types = infer(op, &icx)?;
    let ecx = EvalCtx {
        inputs: inputs.to_vec(),
        out_types: &out_types,
    };
    let outs = eval(op, &ecx)?;
    for (t, ty) in outs.iter().zip(&out_types) {
        assert_eq!(t.dtype(), ty.dtype);
        assert_eq!(t.rank(), ty.rank(), "{op:?}: {ty} vs {:?}", t.shape());
        for (&d, td) in t.shape().iter().zip(&ty.shape) {
            if let Dim::Fixed(n) = td {
                assert_eq!(d, *n, "{op:?}: inferred {ty}, evaluated {:?}", t.shape());
            }
        }
    }
    Ok(outs)
}

fn run(op: &Op, inputs: &[&Tensor]) -> Res<Tensor> {
    let ins: Vec<Option<&Tensor>> = inputs.iter().map(|t| Some(*t)).collect();
    Ok(run_n(op, &ins, 1)?.remove(0))
}

/// Infers with the given types and no known values beyond `values`.
fn infer_types(op: &Op, types: &[TensorType], values: &[Option<&Tensor>]) -> Res<TensorType> {
    let icx = InferCtx {
        inputs: types.iter().map(Some).collect(),
        values: (0..types.len())
            .map(|i| values.get(i).copied().flatten())
            .collect(),
        num_outputs: 1,
    };
    Ok(infer(op, &icx)?.remove(0))
}

fn vals(t: &Tensor) -> Vec<i64> {
    t.to_i64_vec()
}

#[test]
fn reshape_cancels_symbols_and_copies_zeros() {
    let x = TensorType::new(DType::F32, vec![sym("batch"), 3.into(), 4.into()]);
    let s = i64s(&[0, -1]);
    let t = infer_types(
        &Op::Reshape { allow_zero: false },
        &[x.clone(), s.tensor_type()],
        &[None, Some(&s)],
    );
    assert_eq!(t.unwrap().shape, vec![sym("batch"), 12.into()]);
    let s = i64s(&[-1, 12]);
    let t = infer_types(
        &Op::Reshape { allow_zero: false },
        &[x.clone(), s.tensor_type()],
        &[None, Some(&s)],
    );
    assert_eq!(t.unwrap().shape, vec![sym("batch"), 12.into()]);
    let s = i64s(&[-1, 5]);
    let t = infer_types(
        &Op::Reshape { allow_zero: false },
        &[x, s.tensor_type()],
        &[None, Some(&s)],
    );
    assert_eq!(t.unwrap().shape, vec![Dim::unknown(), 5.into()]);
}

#[test]
fn reshape_rules() {
    let x = iota(&[2, 3, 4]);
    let r = |spec: &[i64], allow_zero| run(&Op::Reshape { allow_zero }, &[&x, &i64s(spec)]);
    assert_eq!(r(&[4, -1], false).unwrap().shape(), &[4, 6]);
    assert_eq!(r(&[0, 0, -1], false).unwrap().shape(), &[2, 3, 4]);
    assert!(r(&[-1, -1], false).is_err());
    assert!(r(&[5, -1], false).is_err());
    assert!(r(&[0, -1], true).is_err());
    assert!(r(&[7, 3], false).is_err());
    // allowzero: a 0 is a real zero extent.
    let e = Tensor::zeros(DType::F32, vec![0, 3]);
    let t = run(&Op::Reshape { allow_zero: true }, &[&e, &i64s(&[3, 0])]).unwrap();
    assert_eq!(t.shape(), &[3, 0]);
    assert!(run(&Op::Reshape { allow_zero: true }, &[&e, &i64s(&[0, -1])]).is_err());
}

#[test]
fn transpose_matches_naive_for_every_permutation() {
    for shape in [[2, 3, 4, 5], [1, 3, 1, 5], [2, 1, 40, 33], [3, 37, 1, 1]] {
        check_transposes(shape);
    }
    let b = Tensor::from_vec(vec![2, 2], vec![true, false, false, false]);
    let t = run(&Op::Transpose { perm: vec![1, 0] }, &[&b]).unwrap();
    assert_eq!(t.as_slice::<bool>().unwrap(), &[true, false, false, false]);
    assert!(run(&Op::Transpose { perm: vec![0, 0] }, &[&b]).is_err());
    let e = Tensor::zeros(DType::F32, vec![0, 3]);
    assert_eq!(
        run(&Op::Transpose { perm: vec![1, 0] }, &[&e]).unwrap().shape(),
        &[3, 0]
    );
}

/// Every permutation of a 4-D iota against a naive index computation.
fn check_transposes(shape: [usize; 4]) {
    let x = iota(&shape);
    let perms = (0..256usize)
        .map(|k| [k & 3, (k >> 2) & 3, (k >> 4) & 3, (k >> 6) & 3])
        .filter(|p| (0..4).all(|i| p.contains(&i)));
    for perm in perms {
        let t = run(&Op::Transpose { perm: perm.to_vec() }, &[&x]).unwrap();
        let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
        assert_eq!(t.shape(), out_shape.as_slice());
        for (f, &v) in vals(&t).iter().enumerate() {
            let o = unravel(f, &out_shape);
            let mut i = [0; 4];
            for (a, &p) in perm.iter().enumerate() {
                i[p] = o[a];
            }
            assert_eq!(
                v,
                crate::ops::util::ravel(&i, &shape) as i64,
                "{shape:?} {perm:?}"
            );
        }
    }
}

#[test]
fn slice_clamping_and_negative_steps() {
    assert_eq!(slice_range(10, 2, 7, 2).unwrap(), (2, 3));
    assert_eq!(slice_range(10, -1, i64::MIN, -1).unwrap(), (9, 10));
    assert_eq!(slice_range(10, 20, 0, -3).unwrap(), (9, 3));
    assert_eq!(slice_range(10, 0, i64::MAX, 1).unwrap(), (0, 10));
    assert_eq!(slice_range(10, i64::MIN, i64::MAX, i64::MAX).unwrap(), (0, 1));
    assert_eq!(slice_range(10, 5, 5, 1).unwrap().1, 0);
    assert_eq!(slice_range(0, -1, i64::MIN, -1).unwrap().1, 0);
    assert!(slice_range(3, 0, 3, 0).is_err());

    let x = iota(&[3, 4]);
    let t = run(
        &Op::Slice,
        &[
            &x,
            &i64s(&[-1, 3]),
            &i64s(&[i64::MIN, 0]),
            &i64s(&[0, 1]),
            &i64s(&[-2, -2]),
        ],
    );
    let t = t.unwrap();
    assert_eq!(t.shape(), &[2, 2]);
    assert_eq!(vals(&t), vec![11, 9, 3, 1]);
    // Symbolic dims: the full range keeps the dim, anything else is unknown.
    let ty = TensorType::new(DType::F32, vec![sym("n"), sym("m")]);
    let (s, e, a) = (i64s(&[0, 1]), i64s(&[i64::MAX, 2]), i64s(&[0, 1]));
    let types = [ty, s.tensor_type(), e.tensor_type(), a.tensor_type()];
    let t = infer_types(&Op::Slice, &types, &[None, Some(&s), Some(&e), Some(&a)]).unwrap();
    assert_eq!(t.shape, vec![sym("n"), Dim::unknown()]);
    // Duplicate axes are rejected.
    assert!(run(&Op::Slice, &[&x, &i64s(&[0, 0]), &i64s(&[1, 1]), &i64s(&[1, -1])]).is_err());
}

#[test]
fn pad_modes_match_numpy() {
    let x = i64s(&[1, 2, 3]);
    let pad = |mode, pads: &[i64]| vals(&run(&Op::Pad { mode }, &[&x, &i64s(pads)]).unwrap());
    // np.pad([1,2,3], (7,7), 'reflect') and 'wrap'.
    assert_eq!(
        pad(PadMode::Reflect, &[7, 7]),
        vec![2, 3, 2, 1, 2, 3, 2, 1, 2, 3, 2, 1, 2, 3, 2, 1, 2]
    );
    assert_eq!(
        pad(PadMode::Wrap, &[7, 7]),
        vec![3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1]
    );
    assert_eq!(pad(PadMode::Edge, &[2, 1]), vec![1, 1, 1, 2, 3, 3]);
    assert_eq!(pad(PadMode::Constant, &[1, -1]), vec![0, 1, 2]);
    // Negative pads crop first; reflection is then about the cropped extent.
    assert_eq!(pad(PadMode::Reflect, &[-1, 1]), vec![2, 3, 2]);
    let fill = Tensor::scalar(9i64);
    let t = run(
        &Op::Pad {
            mode: PadMode::Constant,
        },
        &[&x, &i64s(&[0, 2]), &fill],
    )
    .unwrap();
    assert_eq!(vals(&t), vec![1, 2, 3, 9, 9]);
    assert!(run(
        &Op::Pad {
            mode: PadMode::Constant
        },
        &[&x, &i64s(&[-2, -2])]
    )
    .is_err());
    // Cropping past the extent is an error even when the other side pads it back.
    assert!(run(
        &Op::Pad {
            mode: PadMode::Constant
        },
        &[&x, &i64s(&[-4, 5])]
    )
    .is_err());
    let e = Tensor::zeros(DType::I64, vec![0]);
    assert!(run(&Op::Pad { mode: PadMode::Edge }, &[&e, &i64s(&[1, 0])]).is_err());
    assert!(run(
        &Op::Pad {
            mode: PadMode::Constant
        },
        &[&x, &i64s(&[i64::MAX, i64::MAX])]
    )
    .is_err());
}

#[test]
fn pad_with_axes() {
    let x = iota(&[2, 2]);
    let t = run(
        &Op::Pad {
            mode: PadMode::Constant,
        },
        &[&x, &i64s(&[1, 0]), &Tensor::scalar(7i64), &i64s(&[-1])],
    );
    assert_eq!(vals(&t.unwrap()), vec![7, 0, 1, 7, 2, 3]);
}

#[test]
fn gather_wraps_negative_and_rejects_out_of_range() {
    let x = iota(&[3, 2]);
    let t = run(
        &Op::Gather { axis: 0 },
        &[&x, &Tensor::from_vec(vec![2], vec![-1i32, 0])],
    )
    .unwrap();
    assert_eq!(vals(&t), vec![4, 5, 0, 1]);
    let t = run(&Op::Gather { axis: 1 }, &[&x, &Tensor::scalar(1i64)]).unwrap();
    assert_eq!((t.shape(), vals(&t)), (&[3usize][..], vec![1, 3, 5]));
    assert!(run(&Op::Gather { axis: 0 }, &[&x, &i64s(&[3])]).is_err());
    assert!(run(&Op::Gather { axis: 0 }, &[&x, &i64s(&[-4])]).is_err());
    let idx = Tensor::from_vec(vec![3, 1], vec![1i32, 0, -1]);
    let t = run(&Op::GatherElements { axis: 1 }, &[&x, &idx]).unwrap();
    assert_eq!(vals(&t), vec![1, 2, 5]);
    assert!(run(
        &Op::GatherElements { axis: 1 },
        &[&x, &i64s(&[2]).reshaped(vec![1, 1]).unwrap()]
    )
    .is_err());
}

#[test]
fn gather_nd_with_batch_dims() {
    // onnx example: data [2,2,2], indices [[1],[0]], batch_dims=1 -> [[2,3],[4,5]].
    let data = iota(&[2, 2, 2]);
    let idx = Tensor::from_vec(vec![2, 1], vec![1i64, 0]);
    let t = run(&Op::GatherND { batch_dims: 1 }, &[&data, &idx]).unwrap();
    assert_eq!((t.shape(), vals(&t)), (&[2usize, 2][..], vec![2, 3, 4, 5]));
    let idx = Tensor::from_vec(vec![2, 2], vec![0i64, 1, -1, 0]);
    let t = run(&Op::GatherND { batch_dims: 0 }, &[&data, &idx]).unwrap();
    assert_eq!(vals(&t), vec![2, 3, 4, 5]);
    let bad = Tensor::from_vec(vec![1, 2], vec![0i64, 2]);
    assert!(run(&Op::GatherND { batch_dims: 0 }, &[&data, &bad]).is_err());
}

#[test]
fn scatter_reductions() {
    let data = f32s(&[4], &[1.0, 2.0, 3.0, 4.0]);
    let idx = Tensor::from_vec(vec![3, 1], vec![1i64, 1, -1]);
    let upd = f32s(&[3], &[10.0, 20.0, 0.5]);
    let nd = |reduction| {
        run(&Op::ScatterND { reduction }, &[&data, &idx, &upd])
            .unwrap()
            .to_f64_vec()
    };
    assert_eq!(nd(ScatterReduction::None), vec![1.0, 20.0, 3.0, 0.5]);
    assert_eq!(nd(ScatterReduction::Add), vec![1.0, 32.0, 3.0, 4.5]);
    assert_eq!(nd(ScatterReduction::Mul), vec![1.0, 400.0, 3.0, 2.0]);
    assert_eq!(nd(ScatterReduction::Max), vec![1.0, 20.0, 3.0, 4.0]);
    assert_eq!(nd(ScatterReduction::Min), vec![1.0, 2.0, 3.0, 0.5]);
    let bad = Tensor::from_vec(vec![1, 1], vec![4i64]);
    let one = f32s(&[1], &[0.0]);
    assert!(run(
        &Op::ScatterND {
            reduction: ScatterReduction::None
        },
        &[&data, &bad, &one]
    )
    .is_err());

    // Integers wrap like numpy.
    let d = Tensor::from_vec(vec![2], vec![250u8, 1]);
    let i = Tensor::from_vec(vec![2], vec![0i32, 0]);
    let u = Tensor::from_vec(vec![2], vec![3u8, 4]);
    let op = Op::ScatterElements {
        axis: 0,
        reduction: ScatterReduction::Add,
    };
    assert_eq!(
        run(&op, &[&d, &i, &u]).unwrap().as_slice::<u8>().unwrap(),
        &[1, 1]
    );
    let bad = Tensor::from_vec(vec![2], vec![0i32, -3]);
    assert!(run(&op, &[&d, &bad, &u]).is_err());
}

#[test]
fn scatter_max_nan_semantics() {
    let nan = f32::NAN;
    assert!(reduce(ScatterReduction::Max, 1.0f32, nan, true).is_nan());
    assert_eq!(reduce(ScatterReduction::Max, 1.0f32, nan, false), 1.0);
    assert!(reduce(ScatterReduction::Min, nan, 1.0f32, false).is_nan());
}

#[test]
fn split_sizes_rules() {
    assert_eq!(split_sizes(5, None, 3, Some(3)).unwrap(), vec![2, 2, 1]);
    assert_eq!(split_sizes(6, None, 3, None).unwrap(), vec![2, 2, 2]);
    assert!(split_sizes(5, None, 3, None).is_err());
    assert!(split_sizes(5, None, 4, Some(4)).is_err());
    assert_eq!(split_sizes(5, Some(&[0, 5]), 2, None).unwrap(), vec![0, 5]);
    assert!(split_sizes(5, Some(&[1, 5]), 2, None).is_err());
    assert!(split_sizes(5, Some(&[-1, 6]), 2, None).is_err());
    let x = iota(&[2, 5]);
    let outs = run_n(
        &Op::Split {
            axis: -1,
            num_outputs: None,
        },
        &[Some(&x), Some(&i64s(&[2, 3]))],
        2,
    )
    .unwrap();
    assert_eq!(vals(&outs[0]), vec![0, 1, 5, 6]);
    assert_eq!(vals(&outs[1]), vec![2, 3, 4, 7, 8, 9]);
}

#[test]
fn expand_and_tile() {
    let x = TensorType::new(DType::F32, vec![sym("b"), 1.into()]);
    let s = i64s(&[1, 5]);
    let t = infer_types(&Op::Expand, &[x, s.tensor_type()], &[None, Some(&s)]).unwrap();
    assert_eq!(t.shape, vec![sym("b"), 5.into()]);
    let x = i64s(&[1, 2]).reshaped(vec![2, 1]).unwrap();
    let t = run(&Op::Expand, &[&x, &i64s(&[2, 1, 3])]).unwrap();
    assert_eq!(
        (t.shape(), vals(&t)),
        (&[2usize, 2, 3][..], vec![1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2])
    );
    assert!(run(&Op::Expand, &[&x, &i64s(&[3, 1])]).is_err());
    let t = run(&Op::Tile, &[&x, &i64s(&[2, 2])]).unwrap();
    assert_eq!(vals(&t), vec![1, 1, 2, 2, 1, 1, 2, 2]);
    assert!(run(&Op::Tile, &[&x, &i64s(&[1 << 40, 1 << 40])]).is_err());
}

#[test]
fn squeeze_and_unsqueeze() {
    let x = iota(&[1, 3, 1]);
    assert_eq!(run(&Op::Squeeze, &[&x]).unwrap().shape(), &[3]);
    assert_eq!(run(&Op::Squeeze, &[&x, &i64s(&[-1])]).unwrap().shape(), &[1, 3]);
    assert!(run(&Op::Squeeze, &[&x, &i64s(&[1])]).is_err());
    let t = run(&Op::Unsqueeze, &[&x, &i64s(&[4, 0])]).unwrap();
    assert_eq!(t.shape(), &[1, 1, 3, 1, 1]);
    assert!(run(&Op::Unsqueeze, &[&x, &i64s(&[0, -5])]).is_err());
    let sx = TensorType::new(DType::F32, vec![sym("b"), 3.into()]);
    assert!(infer_types(&Op::Squeeze, &[sx], &[]).is_err());
}

#[test]
fn range_lengths() {
    let r = |s: i64, l: i64, d: i64| {
        vals(
            &run(
                &Op::Range,
                &[&Tensor::scalar(s), &Tensor::scalar(l), &Tensor::scalar(d)],
            )
            .unwrap(),
        )
    };
    assert_eq!(r(10, 4, -2), vec![10, 8, 6]);
    assert_eq!(r(3, 9, 3), vec![3, 6]);
    assert_eq!(r(3, 3, 1), Vec::<i64>::new());
    assert_eq!(r(5, 0, 1), Vec::<i64>::new());
    assert_eq!(r(i64::MIN, i64::MAX, i64::MAX).len(), 3);
    let f = run(
        &Op::Range,
        &[
            &Tensor::scalar(1f32),
            &Tensor::scalar(2f32),
            &Tensor::scalar(0.3f32),
        ],
    )
    .unwrap();
    assert_eq!(f.len(), 4);
    assert!(run(
        &Op::Range,
        &[
            &Tensor::scalar(0i32),
            &Tensor::scalar(5i32),
            &Tensor::scalar(0i32)
        ]
    )
    .is_err());
    let inf = Tensor::scalar(f32::INFINITY);
    assert!(run(&Op::Range, &[&Tensor::scalar(0f32), &inf, &Tensor::scalar(1f32)]).is_err());
    assert!(run(
        &Op::Range,
        &[
            &Tensor::scalar(0i64),
            &Tensor::scalar(i64::MAX),
            &Tensor::scalar(1i64)
        ]
    )
    .is_err());
}

#[test]
fn one_hot_wraps_and_ignores_out_of_range() {
    let idx = Tensor::from_vec(vec![4], vec![0i64, -1, 3, 7]);
    let depth = Tensor::scalar(3.0f32);
    let values = f32s(&[2], &[-1.0, 5.0]);
    let t = run(&Op::OneHot { axis: -1 }, &[&idx, &depth, &values]).unwrap();
    assert_eq!(t.shape(), &[4, 3]);
    let v: Vec<f64> = t.to_f64_vec();
    assert_eq!(
        v,
        vec![5.0, -1.0, -1.0, -1.0, -1.0, 5.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0]
    );
    let t = run(&Op::OneHot { axis: 0 }, &[&idx, &depth, &values]).unwrap();
    assert_eq!(t.shape(), &[3, 4]);
    assert_eq!(t.to_f64_vec()[..4], [5.0, -1.0, -1.0, -1.0]);
    assert!(run(&Op::OneHot { axis: 2 }, &[&idx, &depth, &values]).is_err());
}

#[test]
fn trilu_nonzero_eyelike() {
    let x = iota(&[2, 3]);
    let k = Tensor::scalar(1i64);
    assert_eq!(
        vals(&run(&Op::Trilu { upper: true }, &[&x, &k]).unwrap()),
        vec![0, 1, 2, 0, 0, 5]
    );
    assert_eq!(
        vals(&run(&Op::Trilu { upper: false }, &[&x]).unwrap()),
        vec![0, 0, 0, 3, 4, 0]
    );
    let nz = run_n(&Op::NonZero, &[Some(&x)], 1).unwrap().remove(0);
    assert_eq!(
        (nz.shape(), vals(&nz)),
        (&[2usize, 5][..], vec![0, 0, 1, 1, 1, 1, 2, 0, 1, 2])
    );
    let e = run(
        &Op::EyeLike {
            dtype: Some(DType::Bool),
            k: -1,
        },
        &[&x],
    )
    .unwrap();
    assert_eq!(
        e.as_slice::<bool>().unwrap(),
        &[false, false, false, true, false, false]
    );
}

#[test]
fn concat_and_shape_ops() {
    let a = iota(&[2, 1]);
    let b = iota(&[2, 2]);
    let t = run(&Op::Concat { axis: 1 }, &[&a, &b]).unwrap();
    assert_eq!(vals(&t), vec![0, 0, 1, 1, 2, 3]);
    assert!(run(&Op::Concat { axis: 0 }, &[&a, &b]).is_err());
    assert!(run(&Op::Concat { axis: 0 }, &[&a, &b.cast(DType::F32)]).is_err());
    let sa = TensorType::new(DType::I64, vec![sym("n"), 1.into()]);
    let sb = TensorType::new(DType::I64, vec![5.into(), 2.into()]);
    let t = infer_types(&Op::Concat { axis: 1 }, &[sa, sb], &[]).unwrap();
    assert_eq!(t.shape, vec![5.into(), 3.into()]);
    let s = run(&Op::Shape { start: -1, end: None }, &[&b]).unwrap();
    assert_eq!(vals(&s), vec![2]);
    let c = run(
        &Op::ConstantOfShape {
            value: Tensor::scalar(true),
        },
        &[&i64s(&[2, 0])],
    )
    .unwrap();
    assert_eq!(c.shape(), &[2, 0]);
    assert!(run(
        &Op::ConstantOfShape {
            value: Tensor::scalar(1f32)
        },
        &[&i64s(&[1 << 40, 1 << 40])]
    )
    .is_err());
    let f = run(&Op::Flatten { axis: -1 }, &[&iota(&[2, 3, 4])]).unwrap();
    assert_eq!(f.shape(), &[6, 4]);
}

#[test]
fn half_types_move_exactly() {
    let x = Tensor::from_vec(
        vec![2, 2],
        [1.5f32, -2.25, 3.0, 256.0].map(f16::from_f32).to_vec(),
    );
    let t = run(&Op::Transpose { perm: vec![1, 0] }, &[&x]).unwrap();
    assert_eq!(t.to_f64_vec(), vec![1.5, 3.0, -2.25, 256.0]);
    let b = x.cast(DType::BF16);
    let t = run(&Op::Slice, &[&b, &i64s(&[1]), &i64s(&[2])]).unwrap();
    assert_eq!((t.dtype(), t.to_f64_vec()), (DType::BF16, vec![3.0, 256.0]));
}

#[test]
fn symbolic_dims_flow_through_a_graph() {
    use crate::{eval::eval_graph, verify, Graph};
    let mut g = Graph::new("t");
    let xt = TensorType::new(DType::F32, vec![sym("batch"), sym("seq"), 24.into()]);
    let x = g.add_input("x", xt);
    let c = |g: &mut Graph, name: &str, v: &[i64]| g.add_const(name, i64s(v));
    let spec = c(&mut g, "spec", &[0, 0, 2, -1]);
    let r = g.add(
        "r",
        Op::Reshape { allow_zero: false },
        vec![Some(x), Some(spec)],
        "r",
    );
    let r = r.unwrap();
    assert_eq!(
        g.value_type(r).shape,
        vec![sym("batch"), sym("seq"), 2.into(), 12.into()]
    );
    let t = g
        .add(
            "t",
            Op::Transpose {
                perm: vec![0, 2, 1, 3],
            },
            vec![Some(r)],
            "t",
        )
        .unwrap();
    assert_eq!(
        g.value_type(t).shape,
        vec![sym("batch"), 2.into(), sym("seq"), 12.into()]
    );
    let (s0, e0, a0) = (
        c(&mut g, "s0", &[0, 4]),
        c(&mut g, "e0", &[i64::MAX, 8]),
        c(&mut g, "a0", &[2, 3]),
    );
    let sl = g
        .add("sl", Op::Slice, vec![Some(t), Some(s0), Some(e0), Some(a0)], "sl")
        .unwrap();
    assert_eq!(
        g.value_type(sl).shape,
        vec![sym("batch"), 2.into(), sym("seq"), 4.into()]
    );
    let sh = g
        .add("sh", Op::Shape { start: 0, end: None }, vec![Some(sl)], "sh")
        .unwrap();
    let ax = c(&mut g, "ax", &[0]);
    let cs = g.add(
        "cs",
        Op::ConstantOfShape {
            value: Tensor::scalar(1f32),
        },
        vec![Some(sh)],
        "cs",
    );
    assert_eq!(g.value_type(cs.unwrap()).rank(), 4);
    let u = g.add("u", Op::Unsqueeze, vec![Some(sl), Some(ax)], "u").unwrap();
    assert_eq!(g.value_type(u).shape[0], Dim::Fixed(1));
    let f = g.add("f", Op::Flatten { axis: 2 }, vec![Some(sl)], "f").unwrap();
    assert_eq!(g.value_type(f).shape, vec![Dim::unknown(), Dim::unknown()]);
    let sz = g.add("sz", Op::Size, vec![Some(f)], "sz").unwrap();
    g.add_output("sl", sl);
    g.add_output("sz", sz);
    verify(&g).unwrap();
    let out = eval_graph(&g, vec![iota(&[3, 5, 24]).cast(DType::F32)]).unwrap();
    assert_eq!(out[0].shape(), &[3, 2, 5, 4]);
    // x[0, 0, 12 + 4] lands at sl[0, 1, 0, 0].
    assert_eq!(out[0].to_f64_vec()[20], 16.0);
    assert_eq!(vals(&out[1]), vec![120]);
}
