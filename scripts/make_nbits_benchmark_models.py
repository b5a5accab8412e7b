#!/usr/bin/env python3
"""4-bit benchmark models, made from the exporter benchmark graphs the way users quantize
language models' weights, with onnxruntime's own tool: MatMulNBitsQuantizer (blocks of 32
along K), which replaces every MatMul by constant 2-D weights with com.microsoft MatMulNBits
(`<name>_q4`, asymmetric: uint8 zero points) or, in its QDQ format, with a DequantizeLinear of
INT4 weights blocked along K before the MatMul (`<name>_q4_qdq`, symmetric, opset 21).

For each exporter graph in the models folder (hf_bert, hf_llama_token: the ones
fixtures/make_benchmark_models.py exports) the output folder gets the float model and its
4-bit forms, with a manifest in scripts/bench.py's format (no expected outputs: bench.py
compares with onnxruntime's). OpenVINO is timed where it loads the com.microsoft operator.
Usage, from the repository root, with torch and transformers installed
(scripts/export-requirements.txt) and onnxruntime (scripts/bench-requirements.txt):

    python3 fixtures/make_benchmark_models.py --out bench-models --only hf_bert hf_llama_token
    python3 scripts/make_nbits_benchmark_models.py --models bench-models --out bench-q4
    python3 scripts/bench.py --models-dir bench-q4 --threads 2 --runs 10 --rounds 3
"""
import argparse
import json
import os
import shutil

from make_quantized_benchmark_models import copy_model

# GPT-2's exports are absent: its products export as Gemm, which the quantizer leaves float.
EXPORTS = ("hf_bert", "hf_llama_token")
BLOCK = 32


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="bench-models", help="the benchmark models (default: %(default)s)")
    ap.add_argument("--out", default="bench-q4", help="where to write (default: %(default)s)")
    args = ap.parse_args()

    import onnx
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import (DefaultWeightOnlyQuantConfig,
                                                                 MatMulNBitsQuantizer)

    manifest = {e["name"]: e for e in json.load(open(os.path.join(args.models, "manifest.json")))}
    os.makedirs(args.out, exist_ok=True)
    out = []
    for name in EXPORTS:
        if name not in manifest:
            print(f"{name}: not in {args.models} (export it first, see --help)")
            continue
        entry = manifest[name]
        src = os.path.join(args.models, entry["model"])
        out.append(copy_model(args.models, args.out, entry, name))
        shutil.copyfile(src, os.path.join(args.out, name, "model.onnx"))
        q_name = f"{name}_q4"
        out.append(copy_model(args.models, args.out, entry, q_name))
        q = MatMulNBitsQuantizer(onnx.load(src), block_size=BLOCK, is_symmetric=False)
        q.process()
        onnx.save_model(q.model.model, os.path.join(args.out, q_name, "model.onnx"))
        nodes = sum(n.op_type == "MatMulNBits" for n in q.model.model.graph.node)
        out[-1]["description"] = entry["description"] + f", MatMulNBitsQuantizer (4 bits, blocks of {BLOCK}, asymmetric)"
        print(f"{q_name}: {nodes} MatMulNBits")
        qdq_name = f"{name}_q4_qdq"
        out.append(copy_model(args.models, args.out, entry, qdq_name))
        model = onnx.version_converter.convert_version(onnx.load(src), 21)
        cfg = DefaultWeightOnlyQuantConfig(block_size=BLOCK, is_symmetric=True, quant_format=QuantFormat.QDQ)
        q = MatMulNBitsQuantizer(model, algo_config=cfg)
        q.process()
        onnx.save_model(q.model.model, os.path.join(args.out, qdq_name, "model.onnx"))
        nodes = sum(n.op_type == "DequantizeLinear" for n in q.model.model.graph.node)
        out[-1]["description"] = entry["description"] + f", MatMulNBitsQuantizer QDQ (INT4, blocks of {BLOCK}, symmetric)"
        print(f"{qdq_name}: {nodes} DequantizeLinear")
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    print(f"{len(out)} models in {args.out}: {', '.join(e['name'] for e in out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
