#!/usr/bin/env python3
"""How close can *any* bf16 execution of a model get to its f32 result?

Runs the model in onnxruntime twice: as exported (f32), and with every Conv/Gemm/MatMul
operand rounded to bf16 (round to nearest even) while accumulating in f32 — exactly the
numerics kiln's `--precision bf16` promises. The cosine similarity and max error between the
two are the bound a bf16 compiler can reach on this model and input; compare kiln's own figure
(`cargo test -p kiln-tests --test bf16 -- --nocapture`) with it. `--per-layer` rounds one layer at
a time and lists the layers whose rounding costs the most.

    .venv-bench/bin/python scripts/bf16_reference.py bench-models/mobilenetv2/model.onnx \\
        input=bench-models/mobilenetv2/inputs/input.npy --per-layer
"""
import argparse
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

MATMUL_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def bf16_round(a):
    a = np.ascontiguousarray(a, dtype=np.float32).copy()
    u = a.view(np.uint32)
    u += 0x7FFF + ((u >> 16) & 1)
    u &= 0xFFFF0000
    return u.view(np.float32)


def with_bf16_operands(model, only=None):
    """A copy of `model` whose matmul-like nodes (all, or those named in `only`) read
    bf16-rounded activations and weights."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {i.name: i for i in g.initializer}
    rounded, nodes = {}, []
    for n in g.node:
        if n.op_type in MATMUL_OPS and (only is None or n.name in only):
            for k in range(min(2, len(n.input))):
                name = n.input[k]
                if name in inits:
                    t = inits[name]
                    t.CopyFrom(numpy_helper.from_array(bf16_round(numpy_helper.to_array(t)), name))
                elif name in rounded:
                    n.input[k] = rounded[name]
                else:
                    b, f = name + "__bf16", name + "__bf16_f32"
                    nodes.append(helper.make_node("Cast", [name], [b], to=TensorProto.BFLOAT16))
                    nodes.append(helper.make_node("Cast", [b], [f], to=TensorProto.FLOAT))
                    n.input[k] = rounded[name] = f
        nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    return m


def run(model, feeds):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(o, dtype=np.float64).ravel() for o in s.run(None, feeds)]


def cosine(a, b):
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("inputs", nargs="+", help="NAME=FILE.npy (or FILE.npy for one input)")
    p.add_argument("--per-layer", action="store_true")
    a = p.parse_args()
    model = onnx.load(a.model)
    names = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    feeds = {}
    for spec in a.inputs:
        name, _, path = spec.rpartition("=")
        feeds[name or names[0]] = np.load(path)
    ref = run(model, feeds)
    low = run(with_bf16_operands(model), feeds)
    for out, r, b in zip(model.graph.output, ref, low):
        print(f"{out.name}: cosine {cosine(r, b):.6f}, max |err| {np.abs(r - b).max():.4g}, "
              f"range {r.max() - r.min():.4g}")
    if a.per_layer:
        drops = []
        for n in model.graph.node:
            if n.op_type in MATMUL_OPS:
                one = run(with_bf16_operands(model, {n.name}), feeds)
                drops.append((1 - cosine(ref[0], one[0]), n.name, n.op_type))
        drops.sort(reverse=True)
        print("layers whose bf16 rounding lowers the first output's cosine most:")
        for d, name, op in drops[:10]:
            print(f"  {d:.3e}  {name} ({op})")


if __name__ == "__main__":
    sys.exit(main())
