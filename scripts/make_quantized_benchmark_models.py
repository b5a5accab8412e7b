#!/usr/bin/env python3
"""Quantized benchmark models, made from the full-size benchmark models the way users quantize
theirs, with onnxruntime's own tools:

  bert_encoder_dynamic_int8  quantize_dynamic(bert_encoder, QInt8 weights): DynamicQuantizeLinear
                             and MatMulInteger, the float rescale after each product;
  resnet50_qdq               quant_pre_process (BatchNorm folded), then quantize_static in QDQ
                             format, per-channel s8 weights, u8 activations, calibrated on the
                             model's input and three random ones.

The folder gets a manifest in scripts/bench.py's format listing the float originals next to
their quantized forms, so one bench run times both (no expected outputs: bench.py compares with
onnxruntime's). Usage, from the repository root, after `scripts/bench.py` (or
`fixtures/make_benchmark_models.py --out bench-models`) made bench-models/:

    .venv/bin/python scripts/make_quantized_benchmark_models.py --models bench-models --out bench-quant
    python3 scripts/bench.py --models-dir bench-quant --threads 2 --runs 10 --rounds 3
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="bench-models", help="the benchmark models (default: %(default)s)")
    ap.add_argument("--out", default="bench-quant", help="where to write (default: %(default)s)")
    args = ap.parse_args()

    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_dynamic, quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    manifest = {e["name"]: e for e in json.load(open(os.path.join(args.models, "manifest.json")))}
    os.makedirs(args.out, exist_ok=True)
    out = []

    bert = manifest["bert_encoder"]
    for name in ("bert_encoder", "bert_encoder_dynamic_int8"):
        out.append(copy_model(args.models, args.out, bert, name))
    shutil.copyfile(os.path.join(args.models, bert["model"]), os.path.join(args.out, "bert_encoder/model.onnx"))
    quantize_dynamic(os.path.join(args.models, bert["model"]),
                     os.path.join(args.out, "bert_encoder_dynamic_int8/model.onnx"),
                     weight_type=QuantType.QInt8)
    out[-1]["description"] = bert["description"] + ", quantize_dynamic (QInt8 weights)"

    resnet = manifest["resnet50"]
    for name in ("resnet50", "resnet50_qdq"):
        out.append(copy_model(args.models, args.out, resnet, name))
    shutil.copyfile(os.path.join(args.models, resnet["model"]), os.path.join(args.out, "resnet50/model.onnx"))
    (input_name, input_rel), = resnet["inputs"].items()
    x = np.load(os.path.join(args.models, input_rel))

    class Calibration(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.batches = iter([{input_name: x}] + [{input_name: rng.standard_normal(x.shape).astype(x.dtype)}
                                                      for _ in range(3)])

        def get_next(self):
            return next(self.batches, None)

    with tempfile.TemporaryDirectory() as d:
        pre = os.path.join(d, "pre.onnx")
        quant_pre_process(os.path.join(args.models, resnet["model"]), pre, skip_symbolic_shape=True)
        quantize_static(pre, os.path.join(args.out, "resnet50_qdq/model.onnx"), Calibration(),
                        quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    out[-1]["description"] = resnet["description"] + ", quantize_static (QDQ, per-channel s8 weights, u8 activations)"

    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    print(f"{len(out)} models in {args.out}: {', '.join(e['name'] for e in out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
