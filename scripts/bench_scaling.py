#!/usr/bin/env python3
"""How kiln's compile time and memory grow with the size of a graph.

Writes stress models with the pinned onnx package (.venv) and times kiln on each with
`/usr/bin/time`, printing a markdown table of wall seconds and peak RSS:

  chain N      x -> Relu -> Relu -> ... -> y (N nodes, f32[1,4])
  concat N     one Concat of N graph inputs f32[1,4]

Commands: `kiln explain` and `kiln compile` (and `kiln compile --disable-pass fuse` for chains,
which keeps one kernel per node). Each command runs under --timeout seconds (a cell past it
reads "> T s"). Usage, from the repository root after `cargo build --release -p kiln-cli`:

    .venv/bin/python scripts/bench_scaling.py [--sizes 10000 40000 200000] [--timeout 120]
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

import onnx
from onnx import TensorProto, helper


def chain(n):
    names = ["x"] + [f"t{i}" for i in range(n - 1)] + ["y"]
    nodes = [helper.make_node("Relu", [names[i]], [names[i + 1]], name=f"relu{i}") for i in range(n)]
    return helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )


def concat(n):
    inputs = [helper.make_tensor_value_info(f"i{i}", TensorProto.FLOAT, [1, 4]) for i in range(n)]
    node = helper.make_node("Concat", [f"i{i}" for i in range(n)], ["y"], axis=0, name="concat")
    return helper.make_graph(
        [node], "concat", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, 4])]
    )


def timed(cmd, timeout):
    """(seconds, peak RSS in MB) of cmd, or None when it ran past timeout or failed."""
    try:
        r = subprocess.run(
            ["/usr/bin/time", "-f", "TIME %e %M"] + cmd,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return None
    m = re.search(r"TIME ([\d.]+) (\d+)", r.stderr)
    if r.returncode != 0 or not m:
        sys.stderr.write(f"failed: {' '.join(cmd)}\n{r.stderr[-2000:]}\n")
        return None
    return float(m.group(1)), int(m.group(2)) / 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10000, 40000, 100000, 200000])
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--kiln", default="target/release/kiln")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for kind, make in [("chain", chain), ("concat", concat)]:
            for n in args.sizes:
                model = os.path.join(d, f"{kind}{n}.onnx")
                m = helper.make_model(make(n), opset_imports=[helper.make_opsetid("", 17)])
                m.ir_version = 8
                onnx.save(m, model)
                out = os.path.join(d, "out")
                cmds = [
                    ("explain", [args.kiln, "explain", model]),
                    ("compile", [args.kiln, "compile", "-q", model, "-o", out]),
                ]
                if kind == "chain":
                    cmds.append(
                        ("compile --disable-pass fuse",
                         [args.kiln, "compile", "-q", model, "-o", out, "--disable-pass", "fuse"])
                    )
                for what, cmd in cmds:
                    r = timed(cmd, args.timeout)
                    cell = f"> {args.timeout:.0f} s" if r is None else f"{r[0]:.1f} s, {r[1]:.0f} MB"
                    rows.append((f"{kind} {n}", what, cell))
                    print(f"{kind} {n} {what}: {cell}", file=sys.stderr)
    print("| model | command | wall, peak RSS |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | `kiln {r[1]}` | {r[2]} |")


if __name__ == "__main__":
    main()
