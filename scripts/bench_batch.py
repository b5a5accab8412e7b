#!/usr/bin/env python3
"""Batch ranges against fixed batches and the peers: one kiln artifact compiled with
`--input-shape NAME=1..MAX,...` run at several batch sizes, beside kiln compiled for each batch
size alone, onnxruntime and OpenVINO on the same dynamic-batch export, in the same run.

    python3 scripts/bench_batch.py --dir /tmp/batch-models [--models resnet50 bert] \\
        [--batches 1 4 8] [--threads 2] [--runs 10] [--rounds 3]

The models are `torch.onnx.export`s with a dynamic batch axis (scripts/torch_exports.py,
seeded random weights), written to --dir on first use (needs torch, torchvision, transformers);
bert is transformers' BertModel base at sequence 128 with a padding mask, encoder
torch.nn.TransformerEncoder 12x768 (batch_first; sequence-first attention inside), gpt2
transformers' GPT2LMHeadModel small at sequence 128 (logits; the dynamo exporter). Timings are the
median over rounds of each round's median, the engines interleaved within a round; outputs of
the range artifact are checked against onnxruntime at every batch.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench  # noqa: E402  (kiln_round, ort_session, ov_request, timed, compile_model)
import torch_exports  # noqa: E402

SEQ = torch_exports.SEQ


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def export(name: str, path: str) -> None:
    if os.path.exists(path):
        return
    log(f"exporting {name} with a dynamic batch axis to {path}")
    if torch_exports.export_with_data(name, path, dynamic_batch=True) is None:
        raise SystemExit(f"{name}: a package torch_exports needs is missing")


def inputs_for(name: str, n: int, rng) -> dict:
    """Random inputs at batch n (token ids and a padding mask for bert)."""
    if name == "bert":
        ids = rng.integers(0, 30000, (n, SEQ)).astype(np.int64)
        mask = np.ones((n, SEQ), np.int64)
        mask[:, SEQ - torch_exports.BERT_PADDING:] = 0
        return {"input_ids": ids, "attention_mask": mask}
    if name == "encoder":
        return {"x": rng.standard_normal((n, SEQ, 768)).astype(np.float32)}
    if name == "gpt2":
        return {"input_ids": rng.integers(0, 50000, (n, SEQ)).astype(np.int64)}
    return {"x": rng.standard_normal((n, 3, 224, 224)).astype(np.float32)}


def shape_arg(name: str, batch: str) -> str:
    return {"bert": f"input_ids={batch},{SEQ}", "gpt2": f"input_ids={batch},{SEQ}",
            "encoder": f"x={batch},{SEQ},768"}.get(name, f"x={batch},3,224,224")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", required=True, help="folder of the dynamic-batch exports (written on first use)")
    p.add_argument("--models", nargs="+", default=["resnet50", "bert"], choices=["resnet50", "mobilenet_v2", "bert", "encoder", "gpt2"])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 4, 8])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--kiln", default=os.path.join(HERE, "..", "target", "release", "kiln"))
    args = p.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    hi = max(args.batches)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            model = os.path.join(args.dir, f"{name}.onnx")
            export(name, model)
            ranged = os.path.join(tmp, f"{name}-range")
            bench.compile_model(args.kiln, model, ranged, ["--input-shape", shape_arg(name, f"1..{hi}")])
            ort = bench.ort_session(model, args.threads)
            ov = bench.ov_request(model, args.threads)
            rng = np.random.default_rng(0)
            for n in args.batches:
                fixed = os.path.join(tmp, f"{name}-{n}")
                bench.compile_model(args.kiln, model, fixed, ["--input-shape", shape_arg(name, str(n))])
                feeds = inputs_for(name, n, rng)
                files = {}
                for k, v in feeds.items():
                    files[k] = os.path.join(tmp, f"{name}-{n}-{k}.npy")
                    np.save(files[k], v)
                # Correctness of the range artifact at this batch, against onnxruntime.
                out_dir = os.path.join(tmp, f"{name}-{n}-out")
                bench.kiln_round(ranged, files, 1, args.threads, out_dir)
                want = ort.run(None, feeds)[0]
                got = np.load(os.path.join(out_dir, os.listdir(out_dir)[0]))
                err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
                times = {"range": [], "fixed": [], "ort": [], "ov": []}
                for _ in range(args.rounds):
                    times["range"].append(bench.kiln_round(ranged, files, args.runs, args.threads))
                    times["fixed"].append(bench.kiln_round(fixed, files, args.runs, args.threads))
                    times["ort"].append(bench.timed(lambda: ort.run(None, feeds), args.runs))
                    times["ov"].append(bench.timed(lambda: ov.infer(feeds), args.runs))
                med = {k: statistics.median(v) for k, v in times.items()}
                rows.append((name, n, med, err))
                log(f"{name} batch {n}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in med.items())
                    + f", max error / max |ref| {err:.1e}")
    print(f"\n{args.threads} threads, median of {args.rounds} rounds x {args.runs} runs")
    print("| model | batch | kiln 1..%d | kiln fixed batch | onnxruntime | OpenVINO | range / fixed | range / best peer |" % hi)
    print("|---|---|---|---|---|---|---|---|")
    for name, n, m, _ in rows:
        best = min(m["ort"], m["ov"])
        print(f"| {name} | {n} | {m['range']:.2f} ms | {m['fixed']:.2f} | {m['ort']:.2f} | {m['ov']:.2f} | "
              f"{m['range'] / m['fixed']:.2f} | {m['range'] / best:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
