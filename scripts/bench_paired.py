#!/usr/bin/env python3
"""kiln's executable and OpenVINO, timed in alternating pairs.

On a shared machine whose speed moves between runs (a vCPU's neighbour comes and goes),
ratios from a long interleaved benchmark can mix fast and slow stretches. This script times
kiln's executable (`--bench RUNS`) and then OpenVINO (RUNS inferences) back to back, PAIRS
times, and prints each pair's medians and ratio, then the median ratio: the two sides of a
pair see the same machine.

Run with the Python of `.venv-bench` (scripts/bench.py creates it):

    .venv-bench/bin/python scripts/bench_paired.py --model M.onnx --exe ./model \\
        --input x=x.npy [--input ...] [--precision bf16] [--threads 2] [--pairs 8] [--runs 50]

`--exe` is the model compiled by kiln (`kiln compile M.onnx -o model`, with `--precision
bf16` to compare with OpenVINO's bf16 hint).
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the ONNX model OpenVINO runs")
    ap.add_argument("--exe", required=True, help="the same model compiled by kiln")
    ap.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                    help="an input, as the executable takes it (repeat for each input)")
    ap.add_argument("--precision", choices=["f32", "bf16"], default="bf16",
                    help="OpenVINO's INFERENCE_PRECISION_HINT (default bf16)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--runs", type=int, default=50, help="timed runs per side of a pair")
    args = ap.parse_args()
    if not args.input:
        ap.error("give every model input with --input NAME=FILE.npy")

    import numpy as np
    import openvino as ov

    feeds = {}
    for spec in args.input:
        name, sep, path = spec.partition("=")
        if not sep:
            ap.error(f"--input takes NAME=FILE.npy, got '{spec}'")
        feeds[name] = np.load(path)
    core = ov.Core()
    compiled = core.compile_model(core.read_model(args.model), "CPU", {
        "INFERENCE_PRECISION_HINT": args.precision,
        "INFERENCE_NUM_THREADS": str(args.threads),
        "NUM_STREAMS": "1",
        "PERFORMANCE_HINT": "LATENCY",
    })
    request = compiled.create_infer_request()
    for _ in range(20):
        request.infer(feeds)

    cmd = [args.exe, "--bench", str(args.runs), "--threads", str(args.threads)]
    for spec in args.input:
        cmd += ["--input", spec]
    ratios = []
    print(f"{'pair':>4} {'kiln ms':>9} {'OpenVINO ms':>12} {'kiln/OV':>8}")
    for pair in range(args.pairs):
        run = subprocess.run(cmd, capture_output=True, text=True)
        found = re.search(r"median ([0-9.]+) ms", run.stdout + run.stderr)
        if run.returncode != 0 or not found:
            print(f"{args.exe} failed (exit {run.returncode}):\n{run.stderr}", file=sys.stderr)
            return 1
        kiln_ms = float(found.group(1))
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            request.infer(feeds)
            times.append(time.perf_counter() - start)
        ov_ms = statistics.median(times) * 1e3
        ratios.append(kiln_ms / ov_ms)
        print(f"{pair:>4} {kiln_ms:>9.3f} {ov_ms:>12.3f} {kiln_ms / ov_ms:>8.2f}")
    print(f"median kiln/OpenVINO over {args.pairs} pairs: {statistics.median(ratios):.2f} "
          f"(range {min(ratios):.2f}-{max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
