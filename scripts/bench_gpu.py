#!/usr/bin/env python3
"""Benchmark kiln's CUDA executables against the same PyTorch modules on the same GPU.

For each model (torchvision ResNet-50, MobileNetV2, EfficientNet-B0; a torch.nn
TransformerEncoder 12x768; Hugging Face BertModel base and GPT2LMHeadModel small, when
`transformers` is installed), all with seeded random weights, batch 1:

  1. export it with `torch.onnx.export` (static shapes) into --work;
  2. compile it with `kiln compile --target cuda --sm SM` in f32, with `--precision bf16`
     and (when asked for) with `--precision tf32`;
  3. check kiln's first output against the torch module's (f32 with TF32 off; cosine and
     relative error);
  4. time, host to host (inputs copied to the GPU, the forward pass, outputs copied back, as the
     kiln executable's `--bench` does): kiln with its CUDA graph (and with `KILN_CUDA_GRAPH=0`,
     kernel by kernel), torch eager, `torch.compile` (default) and
     `torch.compile(mode="reduce-overhead")` (CUDA graphs), f32 and under
     `torch.autocast("cuda", torch.bfloat16)`, and for tf32 torch's f32 with its defaults
     (TF32 convolutions, f32 matmuls: what `--precision tf32` is held against); median of
     --runs runs after a warm-up;
  5. print a table with kiln's ratio to the best torch mode, and with --json write everything.

--profile MODEL... also prints kiln's per-kernel profile (`--profile-top`) of those models in
f32. --deadline-s stops starting slow steps (torch.compile) when time runs short: a skipped
cell says so. Needs torch with CUDA, torchvision, numpy, onnx; a GPU; and scripts/torch_exports.py
beside it (the models and how they are exported, shared with the CPU benchmark).

    python3 scripts/bench_gpu.py --sm 90 --json gpu.json
    python3 scripts/bench_gpu.py --models encoder bert --precision f32 --modes eager reduce-overhead
    python3 scripts/bench_gpu.py --precision f32 tf32 bf16
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_exports import First, export, make_module  # noqa: E402  (the same modules as the CPU benchmark)
LATENCY = re.compile(r"latency: median ([0-9.]+) ms")
MODELS = ["resnet50", "mobilenet_v2", "efficientnet_b0", "encoder", "bert", "gpt2"]
MODES = ["eager", "default", "reduce-overhead"]
START = time.time()


def log(*a):
    print(f"[{time.time() - START:6.0f}s]", *a, flush=True)


def kiln_compile(kiln: str, onnx_path: str, exe: str, sm: int, precision: str) -> tuple[int, str, float]:
    cmd = [kiln, "compile", onnx_path, "--target", "cuda", "--sm", str(sm), "-o", exe, "--quiet"]
    if precision in ("bf16", "tf32"):
        cmd += ["--precision", precision]
    t = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode, (r.stdout + r.stderr).strip(), time.time() - t


def kiln_args(feeds: dict, work: str, name: str) -> list[str]:
    args = []
    for k, v in feeds.items():
        p = os.path.join(work, f"{name}_in_{k}.npy")
        np.save(p, v)
        args += ["--input", f"{k}={p}"]
    return args


def kiln_bench(exe: str, args: list[str], runs: int, env: dict | None = None) -> float | None:
    r = subprocess.run([exe, *args, "--bench", str(runs)], capture_output=True, text=True,
                       env={**os.environ, **(env or {})}, timeout=600)
    m = LATENCY.search(r.stdout + r.stderr)
    if not m:
        log(f"  {os.path.basename(exe)}: {(r.stdout + r.stderr).strip()[-300:]}")
    return float(m.group(1)) if m else None


def torch_bench(fn, feeds: dict, runs: int) -> float:
    """Host to host, as kiln's --bench: copy in, forward, copy the first output back."""
    import torch

    def once():
        xs = {k: torch.from_numpy(v).cuda() for k, v in feeds.items()}
        return fn(**xs).float().cpu()

    for _ in range(10):
        once()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        once()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def cosine(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-300))
    return cos, float(np.linalg.norm(a - b) / (np.linalg.norm(b) + 1e-300))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    p.add_argument("--precision", nargs="+", default=["f32", "bf16"], choices=["f32", "tf32", "bf16"])
    p.add_argument("--modes", nargs="+", default=MODES, choices=MODES, help="torch modes to time")
    p.add_argument("--sm", type=int, default=90)
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--kiln", default=os.environ.get("KILN", os.path.join(ROOT, "target", "release", "kiln")))
    p.add_argument("--work", default=os.path.join(ROOT, ".cache", "bench-gpu"))
    p.add_argument("--profile", nargs="*", default=[], help="models whose f32 kernel profile to print")
    p.add_argument("--no-graph-compare", action="store_true", help="skip timing kiln without its CUDA graph")
    p.add_argument("--deadline-s", type=float, default=1e9, help="start no torch.compile after this many seconds")
    p.add_argument("--json")
    args = p.parse_args()

    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # f32 means f32, for torch as for kiln
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    os.makedirs(args.work, exist_ok=True)
    card = torch.cuda.get_device_name(0)
    log(f"GPU: {card}; torch {torch.__version__}; kiln: {args.kiln}")
    results: dict = {"card": card, "torch": torch.__version__, "models": {}}

    def save():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)

    for name in args.models:
        made = make_module(name)
        if made is None:
            log(f"{name}: skipped (transformers is not installed)")
            continue
        module, inputs = made
        module.eval()
        res = results["models"].setdefault(name, {})
        onnx_path = os.path.join(args.work, name + ".onnx")
        try:
            with torch.no_grad():
                export(name, module, inputs, onnx_path)
        except Exception as e:
            res["error"] = f"export: {e}"[:300]
            log(f"{name}: export failed: {res['error']}")
            continue
        feeds = {k: v.numpy() for k, v in inputs.items()}
        kargs = kiln_args(feeds, args.work, name)
        gpu_module = module.cuda()
        eager = First(gpu_module)
        with torch.no_grad():
            want = eager(**{k: v.cuda() for k, v in inputs.items()}).float().cpu().numpy()
        for prec in args.precision:
            cell = res.setdefault(prec, {})
            exe = os.path.join(args.work, f"{name}_{prec}")
            rc, out, secs = kiln_compile(args.kiln, onnx_path, exe, args.sm, prec)
            cell["kiln_compile_s"] = round(secs, 1)
            if rc:
                cell["kiln_error"] = out[-300:]
                log(f"{name} {prec}: kiln compile failed: {out[-300:]}")
            else:
                od = os.path.join(args.work, f"{name}_{prec}_out")
                r = subprocess.run([exe, *kargs, "--output-dir", od, "--quiet"], capture_output=True, text=True)
                if r.returncode:
                    cell["kiln_error"] = (r.stdout + r.stderr).strip()[-300:]
                    log(f"{name} {prec}: kiln run failed: {cell['kiln_error']}")
                else:
                    got = np.load(os.path.join(od, "y.npy"))
                    cell["cosine"], cell["rel_error"] = cosine(got, want)
                    cell["kiln_ms"] = kiln_bench(exe, kargs, args.runs)
                    if not args.no_graph_compare:
                        cell["kiln_no_graph_ms"] = kiln_bench(exe, kargs, args.runs, {"KILN_CUDA_GRAPH": "0"})
                    log(f"{name} {prec}: kiln {cell['kiln_ms']} ms (kernel by kernel "
                        f"{cell.get('kiln_no_graph_ms')}), cosine {cell['cosine']:.6f}, "
                        f"rel error {cell['rel_error']:.2e}, compile {secs:.0f}s")
                    if prec == "f32" and name in args.profile:
                        r = subprocess.run([exe, *kargs, "--bench", "20", "--profile",
                                            os.path.join(args.work, f"{name}_trace.json"), "--profile-top", "25"],
                                           capture_output=True, text=True)
                        log(f"{name} profile:\n{r.stderr.strip()[-6000:]}")
            for mode in args.modes:
                if mode != "eager" and time.time() - START > args.deadline_s:
                    cell[f"torch_{mode}_ms"] = "skipped (time)"
                    continue
                try:
                    t = time.time()
                    fn = eager
                    if mode == "default":
                        fn = First(torch.compile(gpu_module))
                    elif mode == "reduce-overhead":
                        fn = First(torch.compile(gpu_module, mode="reduce-overhead"))

                    def run(fn=fn, prec=prec, **kw):
                        with torch.no_grad(), torch.autocast("cuda", torch.bfloat16, enabled=prec == "bf16"):
                            return fn(**kw)

                    # tf32: torch's defaults (TF32 convolutions, f32 matmuls); otherwise f32 means f32.
                    torch.backends.cudnn.allow_tf32 = prec == "tf32"
                    cell[f"torch_{mode}_ms"] = torch_bench(run, feeds, args.runs)
                    log(f"{name} {prec}: torch {mode} {cell[f'torch_{mode}_ms']:.3f} ms ({time.time() - t:.0f}s)")
                except Exception as e:
                    cell[f"torch_{mode}_ms"] = f"failed: {str(e)[:200]}"
                    log(f"{name} {prec}: torch {mode} failed: {str(e)[:300]}")
                torch._dynamo.reset()
            save()
        del gpu_module
        torch.cuda.empty_cache()
    save()
    print(f"\n{card}, batch 1, host to host, median of {args.runs} runs (ms); ratio = kiln / best torch mode")
    head = f"{'model':16s} {'prec':5s} {'kiln':>8s} {'no graph':>8s} " + " ".join(f"{m:>15s}" for m in args.modes)
    print(head + f" {'ratio':>7s}  cosine")
    for name, res in results["models"].items():
        for prec in args.precision:
            c = res.get(prec)
            if not c:
                continue
            torch_ms = [c.get(f"torch_{m}_ms") for m in args.modes]
            best = min([t for t in torch_ms if isinstance(t, float)], default=None)
            k = c.get("kiln_ms")
            ratio = f"{k / best:.2f}x" if isinstance(k, float) and best else "-"
            fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else ("-" if v is None else str(v)[:15])
            print(f"{name:16s} {prec:5s} {fmt(k):>8s} {fmt(c.get('kiln_no_graph_ms')):>8s} "
                  + " ".join(f"{fmt(t):>15s}" for t in torch_ms) + f" {ratio:>7s}  {fmt(c.get('cosine'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
