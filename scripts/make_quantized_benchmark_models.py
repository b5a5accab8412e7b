#!/usr/bin/env python3
"""Quantized benchmark models, made from the full-size benchmark models the way users quantize
theirs, with onnxruntime's own tools:

  bert_encoder_dynamic_int8  quantize_dynamic(bert_encoder, QInt8 weights): DynamicQuantizeLinear
                             and MatMulInteger, the float rescale after each product;
  bert_encoder_qdq           quantize_static(bert_encoder) in QDQ format, per-channel s8
                             weights, u8 activations, calibrated on the model's inputs and three
                             random hidden states;
  resnet50_qdq               quant_pre_process (BatchNorm folded), then quantize_static in QDQ
                             format, per-channel s8 weights, u8 activations, calibrated on the
                             model's input and three random ones;
  resnet50_qoperator         the same in QOperator format (QLinearConv, com.microsoft QLinearAdd
                             and QGemm).

`--bert` and `--resnet` pick other models of the folder (names above with that prefix), such as
the exporter graphs `hf_bert` and `tv_resnet50` (fixtures/make_benchmark_models.py --only
hf_bert tv_resnet50): those are what speed claims are measured on.

The folder gets a manifest in scripts/bench.py's format listing the float originals next to
their quantized forms, so one bench run times both (no expected outputs: bench.py compares with
onnxruntime's). Usage, from the repository root, after `scripts/bench.py` (or
`fixtures/make_benchmark_models.py --out bench-models`) made bench-models/:

    .venv/bin/python scripts/make_quantized_benchmark_models.py --models bench-models --out bench-quant
    python3 scripts/bench.py --models-dir bench-quant --threads 2 --runs 10 --rounds 3
    .venv/bin/python scripts/make_quantized_benchmark_models.py --models bench-models --out bench-quant \
        --bert hf_bert --resnet tv_resnet50
"""
import argparse
import json
import os
import shutil
import tempfile

import numpy as np


def copy_model(src_dir: str, out_dir: str, entry: dict, name: str) -> dict:
    """Copies a benchmark model's inputs under `name` and returns its manifest entry (the model
    file itself is written by the caller)."""
    os.makedirs(os.path.join(out_dir, name, "inputs"), exist_ok=True)
    inputs = {}
    for k, rel in entry["inputs"].items():
        dst = os.path.join(name, "inputs", os.path.basename(rel))
        shutil.copyfile(os.path.join(src_dir, rel), os.path.join(out_dir, dst))
        inputs[k] = dst
    e = {key: v for key, v in entry.items() if key not in ("outputs", "inputs", "model")}
    e.update(name=name, model=f"{name}/model.onnx", inputs=inputs)
    return e


def calibration(inputs: dict):
    """onnxruntime's calibration reader over `inputs` (name -> array) and three batches whose
    float inputs are random normal (integer inputs, such as masks, are kept)."""
    from onnxruntime.quantization import CalibrationDataReader

    class Calibration(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            randomized = [{k: rng.standard_normal(v.shape).astype(v.dtype) if v.dtype.kind == "f" else v
                           for k, v in inputs.items()} for _ in range(3)]
            self.batches = iter([dict(inputs)] + randomized)

        def get_next(self):
            return next(self.batches, None)

    return Calibration()


def load_inputs(models: str, entry: dict) -> dict:
    return {k: np.load(os.path.join(models, rel)) for k, rel in entry["inputs"].items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="bench-models", help="the benchmark models (default: %(default)s)")
    ap.add_argument("--out", default="bench-quant", help="where to write (default: %(default)s)")
    ap.add_argument("--bert", default="bert_encoder",
                    help="the transformer to quantize (dynamic and QDQ), e.g. hf_bert for the Hugging Face "
                         "export (default: %(default)s)")
    ap.add_argument("--resnet", default="resnet50",
                    help="the CNN to quantize (QDQ and QOperator), e.g. tv_resnet50 for the torchvision "
                         "export (default: %(default)s)")
    args = ap.parse_args()

    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    manifest = {e["name"]: e for e in json.load(open(os.path.join(args.models, "manifest.json")))}
    os.makedirs(args.out, exist_ok=True)
    out = []

    b = args.bert
    bert = manifest[b]
    for name in (b, f"{b}_dynamic_int8"):
        out.append(copy_model(args.models, args.out, bert, name))
    shutil.copyfile(os.path.join(args.models, bert["model"]), os.path.join(args.out, b, "model.onnx"))
    quantize_dynamic(os.path.join(args.models, bert["model"]),
                     os.path.join(args.out, f"{b}_dynamic_int8", "model.onnx"),
                     weight_type=QuantType.QInt8)
    out[-1]["description"] = bert["description"] + ", quantize_dynamic (QInt8 weights)"
    out.append(copy_model(args.models, args.out, bert, f"{b}_qdq"))
    quantize_static(os.path.join(args.models, bert["model"]), os.path.join(args.out, f"{b}_qdq", "model.onnx"),
                    calibration(load_inputs(args.models, bert)), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    out[-1]["description"] = bert["description"] + ", quantize_static (QDQ, per-channel s8 weights, u8 activations)"

    r = args.resnet
    resnet = manifest[r]
    for name in (r, f"{r}_qdq"):
        out.append(copy_model(args.models, args.out, resnet, name))
    shutil.copyfile(os.path.join(args.models, resnet["model"]), os.path.join(args.out, r, "model.onnx"))
    out.append(copy_model(args.models, args.out, resnet, f"{r}_qoperator"))
    with tempfile.TemporaryDirectory() as d:
        pre = os.path.join(d, "pre.onnx")
        quant_pre_process(os.path.join(args.models, resnet["model"]), pre, skip_symbolic_shape=True)
        for name, fmt in ((f"{r}_qdq", QuantFormat.QDQ), (f"{r}_qoperator", QuantFormat.QOperator)):
            quantize_static(pre, os.path.join(args.out, name, "model.onnx"),
                            calibration(load_inputs(args.models, resnet)),
                            quant_format=fmt, per_channel=True,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    for e in out[-2:]:
        fmt = "QDQ" if e["name"].endswith("qdq") else "QOperator"
        e["description"] = resnet["description"] + f", quantize_static ({fmt}, per-channel s8 weights, u8 activations)"

    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    print(f"{len(out)} models in {args.out}: {', '.join(e['name'] for e in out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
