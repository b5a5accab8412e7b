#!/usr/bin/env python3
"""Benchmark kiln's CUDA executables against PyTorch eager and torch.compile on the same GPU.

For each model of bench-models/ (made by `fixtures/make_benchmark_models.py --out bench-models`):

  1. compile it with `kiln compile M/model.onnx --target cuda --sm SM [--precision bf16]`;
  2. build the same graph as a PyTorch module (`OnnxModule` below: the ONNX nodes executed in
     order with torch operators, the initializers as CUDA tensors), and check kiln's outputs
     against it (cosine similarity, max |diff|);
  3. time, in interleaved rounds (kiln, eager, compiled, kiln, ...): kiln:
     `DIR/M --input NAME=FILE.npy --bench N` (one warm-up, N timed runs, host inputs copied in and
     outputs copied out); PyTorch: the same host-to-host work (inputs copied to the GPU, forward,
     outputs copied back) timed around a synchronization, N runs after warm-up, for eager mode
     and `torch.compile(module)`; with --precision bf16 PyTorch runs under
     `torch.autocast("cuda", torch.bfloat16)`. Each round gives a median; the table shows the
     median of the rounds' medians and kiln's ratio to the faster PyTorch.

Needs python packages torch (with CUDA), onnx and numpy, and a GPU. Without a GPU,
`--check-cpu` still compares `OnnxModule` with onnxruntime on the CPU (for its own tests).

    python3 scripts/bench_gpu.py [--models resnet50 bert_encoder] [--precision f32 bf16]
                                 [--sm 80] [--runs 50] [--rounds 3] [--json gpu.json]
    python3 scripts/bench_gpu.py --check-cpu [--models-dir fixtures/models --models conv_basic]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np
import onnx
from onnx import numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LATENCY = re.compile(r"latency: median ([0-9.]+) ms, min ([0-9.]+) ms over (\d+) runs")


def torch_module():
    import torch  # imported late: --help and argument errors need no torch

    return torch


class OnnxModule:
    """An ONNX graph run with torch operators. Shape operands (Reshape's shape, Unsqueeze's
    axes) must be initializers: they are read once here, so torch.compile sees plain ints."""

    def __init__(self, path: str, device: str):
        torch = torch_module()
        self.torch = torch
        model = onnx.load(path)
        self.graph = model.graph
        self.consts = {}
        self.np_consts = {}
        for init in self.graph.initializer:
            arr = numpy_helper.to_array(init)
            self.np_consts[init.name] = arr
            self.consts[init.name] = torch.from_numpy(np.ascontiguousarray(arr)).to(device)
        for node in self.graph.node:
            if node.op_type == "Constant":
                arr = numpy_helper.to_array(node.attribute[0].t)
                self.np_consts[node.output[0]] = arr
                self.consts[node.output[0]] = torch.from_numpy(np.ascontiguousarray(arr)).to(device)
        self.inputs = [i.name for i in self.graph.input if i.name not in self.consts]
        self.outputs = [o.name for o in self.graph.output]
        # Everything but the tensor work is resolved here, so the forward pass torch.compile
        # traces is torch operators and dictionary lookups only.
        self.steps = []
        for n in self.graph.node:
            if n.op_type == "Constant":
                continue
            if n.op_type not in OPS:
                raise SystemExit(f"bench_gpu: {path}: node '{n.name}' ({n.op_type}) has no torch equivalent here")
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            if n.op_type == "Reshape":
                attrs["shape"] = _const_ints(self, n, 1)
            if n.op_type == "Unsqueeze" and len(n.input) > 1:
                attrs["axes"] = _const_ints(self, n, 1)
            self.steps.append((OPS[n.op_type], list(n.input), list(n.output), attrs))

    def __call__(self, *args):
        env = dict(self.consts)
        env.update(zip(self.inputs, args))
        for op, inputs, outputs, attrs in self.steps:
            outs = op(self, [env[i] if i else None for i in inputs], attrs)
            if not isinstance(outs, (list, tuple)):
                outs = [outs]
            env.update(zip(outputs, outs))
        return [env[o] for o in self.outputs]


def _pads(torch, x, attrs, nsp):
    """Symmetric pads as torch's padding argument; asymmetric ones applied to x first."""
    if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise SystemExit("bench_gpu: auto_pad is not supported; export with explicit pads")
    pads = list(attrs.get("pads", [0] * (2 * nsp)))
    begin, end = pads[:nsp], pads[nsp:]
    if begin == end:
        return x, begin
    flat = []
    for b, e in zip(reversed(begin), reversed(end)):
        flat += [b, e]
    return torch.nn.functional.pad(x, flat), [0] * nsp


def _conv(m, ins, a):
    F = m.torch.nn.functional
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    nsp = w.dim() - 2
    x, pad = _pads(m.torch, x, a, nsp)
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nsp]
    return conv(x, w, b, stride=list(a.get("strides", [1] * nsp)), padding=pad,
                dilation=list(a.get("dilations", [1] * nsp)), groups=a.get("group", 1))


def _maxpool(m, ins, a):
    F = m.torch.nn.functional
    k = list(a["kernel_shape"])
    x, pad = _pads(m.torch, ins[0], a, len(k))
    pool = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[len(k)]
    return pool(x, k, stride=list(a.get("strides", [1] * len(k))), padding=pad,
                dilation=list(a.get("dilations", [1] * len(k))), ceil_mode=bool(a.get("ceil_mode", 0)))


def _gemm(m, ins, a):
    x = ins[0].t() if a.get("transA", 0) else ins[0]
    w = ins[1].t() if a.get("transB", 0) else ins[1]
    y = (x @ w) * a.get("alpha", 1.0)
    if len(ins) > 2 and ins[2] is not None:
        y = y + ins[2] * a.get("beta", 1.0)
    return y


def _const_ints(m, n, i):
    name = n.input[i]
    if name not in m.np_consts:
        raise SystemExit(f"bench_gpu: node '{n.name}' ({n.op_type}): input {i} must be a constant")
    return [int(v) for v in m.np_consts[name].reshape(-1)]


def _reshape(m, ins, a):
    shape = a["shape"]
    x = ins[0]
    shape = [x.shape[i] if s == 0 and not a.get("allowzero", 0) else s for i, s in enumerate(shape)]
    return x.reshape(shape)


def _unsqueeze(m, ins, a):
    axes = list(a["axes"])
    x = ins[0]
    rank = x.dim() + len(axes)
    for ax in sorted(ax % rank for ax in axes):
        x = x.unsqueeze(ax)
    return x


def _cast(m, ins, a):
    torch = m.torch
    dtypes = {1: torch.float32, 6: torch.int32, 7: torch.int64, 9: torch.bool, 10: torch.float16,
              11: torch.float64, 16: torch.bfloat16}
    return ins[0].to(dtypes[a["to"]])


def _clip(m, ins, a):
    lo = ins[1] if len(ins) > 1 and ins[1] is not None else a.get("min")
    hi = ins[2] if len(ins) > 2 and ins[2] is not None else a.get("max")
    return m.torch.clamp(ins[0], min=lo, max=hi)


def _layernorm(m, ins, a):
    x = ins[0]
    axis = a.get("axis", -1) % x.dim()
    b = ins[2] if len(ins) > 2 else None
    return m.torch.nn.functional.layer_norm(x, x.shape[axis:], ins[1], b, a.get("epsilon", 1e-5))


def _batchnorm(m, ins, a):
    x, scale, bias, mean, var = ins[:5]
    return m.torch.nn.functional.batch_norm(x, mean, var, scale, bias, False, 0.0, a.get("epsilon", 1e-5))


OPS = {
    "Conv": _conv,
    "BatchNormalization": _batchnorm,
    "Relu": lambda m, i, a: m.torch.relu(i[0]),
    "Sigmoid": lambda m, i, a: m.torch.sigmoid(i[0]),
    "Erf": lambda m, i, a: m.torch.erf(i[0]),
    "Clip": _clip,
    "Add": lambda m, i, a: i[0] + i[1],
    "Sub": lambda m, i, a: i[0] - i[1],
    "Mul": lambda m, i, a: i[0] * i[1],
    "Div": lambda m, i, a: i[0] / i[1],
    "MatMul": lambda m, i, a: m.torch.matmul(i[0], i[1]),
    "Gemm": _gemm,
    "MaxPool": _maxpool,
    "GlobalAveragePool": lambda m, i, a: i[0].mean(dim=list(range(2, i[0].dim())), keepdim=True),
    "Flatten": lambda m, i, a: i[0].reshape(
        (int(np.prod(i[0].shape[: a.get("axis", 1)])), -1)),
    "Identity": lambda m, i, a: i[0],
    "Cast": _cast,
    "Unsqueeze": _unsqueeze,
    "Reshape": _reshape,
    "Transpose": lambda m, i, a: i[0].permute(
        list(a["perm"]) if "perm" in a else list(reversed(range(i[0].dim())))),
    "Softmax": lambda m, i, a: m.torch.softmax(i[0], dim=a.get("axis", -1)),
    "LayerNormalization": _layernorm,
}


def load_inputs(mdir: str, names: list[str]) -> dict:
    return {n: np.load(os.path.join(mdir, "inputs", sanitize(n) + ".npy")) for n in names}


def sanitize(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def agreement(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    denom = np.linalg.norm(a64) * np.linalg.norm(b64)
    cos = float(a64 @ b64 / denom) if denom > 0 else float(np.array_equal(a64, b64))
    return cos, float(np.max(np.abs(a64 - b64))) if a64.size else 0.0


def check_cpu(args) -> int:
    """OnnxModule against onnxruntime on the CPU: the torch side of the benchmark is the model."""
    import onnxruntime as ort

    torch = torch_module()
    worst = 1.0
    for name in args.models:
        path = os.path.join(args.models_dir, name, "model.onnx")
        mod = OnnxModule(path, "cpu")
        feeds = load_inputs(os.path.join(args.models_dir, name), mod.inputs)
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        want = sess.run(None, feeds)
        with torch.no_grad():
            got = mod(*[torch.from_numpy(feeds[n]) for n in mod.inputs])
        for o, g, w in zip(mod.outputs, got, want):
            cos, diff = agreement(g.numpy(), w)
            worst = min(worst, cos)
            print(f"{name} {o}: cosine {cos:.7f}, max |diff| {diff:.3g}")
    ok = worst >= 0.99999
    print("OnnxModule matches onnxruntime" if ok else "OnnxModule DIFFERS from onnxruntime")
    return 0 if ok else 1


def kiln_run(exe: str, feeds: dict, tmp: str, bench: int | None) -> tuple[float | None, dict]:
    flags = []
    for n, v in feeds.items():
        f = os.path.join(tmp, sanitize(n) + ".npy")
        if not os.path.exists(f):
            np.save(f, v)
        flags += ["--input", f"{n}={f}"]
    out = os.path.join(tmp, "out")
    os.makedirs(out, exist_ok=True)
    cmd = [exe, *flags, "--output-dir", out] + (["--bench", str(bench)] if bench else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"bench_gpu: {' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    m = LATENCY.search(r.stdout)
    outs = {f[:-4]: np.load(os.path.join(out, f)) for f in os.listdir(out) if f.endswith(".npy")}
    return (float(m.group(1)) if m else None), outs


def torch_timer(torch, fn, feeds: list, runs: int) -> float:
    """Median ms of `runs` host-to-host runs after two warm-ups (compilation happens there)."""
    def once():
        with torch.no_grad():
            outs = fn(*[torch.from_numpy(f).cuda(non_blocking=False) for f in feeds])
            return [o.float().cpu() for o in outs]
    for _ in range(2):
        once()
    times = []
    for _ in range(runs):
        torch.cuda.synchronize()
        t = time.perf_counter()
        once()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def bench(args) -> int:
    torch = torch_module()
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device visible to PyTorch", file=sys.stderr)
        return 1
    gpu = torch.cuda.get_device_name(0)
    os.makedirs(args.work, exist_ok=True)
    results = []
    for name in args.models:
        mdir = os.path.join(args.models_dir, name)
        path = os.path.join(mdir, "model.onnx")
        mod = OnnxModule(path, "cuda")
        feeds = load_inputs(mdir, mod.inputs)
        ordered = [feeds[n] for n in mod.inputs]
        compiled = torch.compile(mod.__call__)
        for precision in args.precision:
            exe = os.path.join(args.work, f"{name}-{precision}")
            t0 = time.time()
            subprocess.run([args.kiln, "compile", path, "-o", exe, "--target", "cuda", "--sm", str(args.sm),
                            "--precision", precision], check=True)
            compile_s = time.time() - t0
            tmp = os.path.join(args.work, f"{name}-{precision}.io")
            os.makedirs(tmp, exist_ok=True)
            _, kiln_outs = kiln_run(exe, feeds, tmp, None)
            ctx = torch.autocast("cuda", dtype=torch.bfloat16) if precision == "bf16" else _null()
            with ctx, torch.no_grad():
                ref = [o.float().cpu().numpy() for o in mod(*[torch.from_numpy(f).cuda() for f in ordered])]
            cos, diff = min((agreement(kiln_outs[sanitize(o)], r) for o, r in zip(mod.outputs, ref)),
                            key=lambda t: t[0])
            rounds = {"kiln": [], "eager": [], "compile": []}
            for _ in range(args.rounds):
                rounds["kiln"].append(kiln_run(exe, feeds, tmp, args.runs)[0])
                with (torch.autocast("cuda", dtype=torch.bfloat16) if precision == "bf16" else _null()):
                    rounds["eager"].append(torch_timer(torch, mod, ordered, args.runs))
                    rounds["compile"].append(torch_timer(torch, compiled, ordered, args.runs))
            med = {k: statistics.median(v) for k, v in rounds.items()}
            best = min(med["eager"], med["compile"])
            results.append({"model": name, "precision": precision, "gpu": gpu, "sm": args.sm,
                            "kiln_ms": med["kiln"], "eager_ms": med["eager"], "compile_ms": med["compile"],
                            "kiln_over_compile": med["kiln"] / med["compile"], "kiln_over_best": med["kiln"] / best,
                            "cosine_vs_torch": cos, "max_abs_diff": diff, "kiln_compile_s": compile_s,
                            "rounds": rounds})
            print(f"{name} {precision}: kiln {med['kiln']:.3f} ms, eager {med['eager']:.3f} ms, "
                  f"torch.compile {med['compile']:.3f} ms → kiln/compile {med['kiln'] / med['compile']:.2f} "
                  f"(cosine vs torch {cos:.6f})", flush=True)
    print(f"\nGPU: {gpu}, sm_{args.sm}, batch 1, {args.runs} runs × {args.rounds} rounds, host-to-host\n")
    print("| model | precision | kiln ms | eager ms | torch.compile ms | kiln / torch.compile | cosine |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['model']} | {r['precision']} | {r['kiln_ms']:.3f} | {r['eager_ms']:.3f} | "
              f"{r['compile_ms']:.3f} | {r['kiln_over_compile']:.2f} | {r['cosine_vs_torch']:.6f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models-dir", default=os.path.join(ROOT, "bench-models"))
    p.add_argument("--models", nargs="+", default=["resnet50", "mobilenetv2", "efficientnet_b0", "bert_encoder"])
    p.add_argument("--precision", nargs="+", default=["f32", "bf16"], choices=["f32", "bf16"])
    p.add_argument("--sm", type=int, default=80)
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--kiln", default=os.path.join(ROOT, "target", "release", "kiln"))
    p.add_argument("--work", default=os.path.join(ROOT, ".cache", "bench-gpu"))
    p.add_argument("--json")
    p.add_argument("--check-cpu", action="store_true",
                   help="compare the PyTorch version of each model with onnxruntime on the CPU and exit")
    args = p.parse_args()
    return check_cpu(args) if args.check_cpu else bench(args)


if __name__ == "__main__":
    sys.exit(main())
