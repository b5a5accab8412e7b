#!/usr/bin/env python3
"""Record or check the SHA-256 of every artifact kiln writes for the fixtures and benchmark models.

A restructuring of the compiler must not change what it emits. This script compiles every
fixture of fixtures/manifest.json (and, with --bench-models, the full-size benchmark models of
fixtures/make_benchmark_models.py) six ways:

    exe        executable for this host (f32)          exe-bf16        the same with --precision bf16
    lib        static library + header + .pc + cmake   lib-bf16        (portable CPU variants)
    ptx        --target cuda --emit ptx (sm_80)        ptx-bf16

and records one SHA-256 per artifact file. A compile that is refused is recorded as its exit
status and first line of error, so a change in what is refused shows up as well.

    scripts/artifact_hashes.py record OUT.json [--kiln target/release/kiln] [--bench-models DIR]
    scripts/artifact_hashes.py check BASELINE.json [--kiln ...] [--bench-models DIR]
    scripts/artifact_hashes.py check --rev REV [--bench-models DIR]

`--only conv,gemm` limits either action to the models whose name contains one of the parts.

`check --rev REV` builds kiln at REV in a temporary git worktree (its own target folder),
records the baseline with it, then records the working tree's kiln and compares: use it on a
machine other than the one a baseline file was recorded on, since executables are compiled for
the host CPU. Exit status: 0 identical, 1 differences (listed), 2 usage.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "fixtures")

MODES = {
    "exe": ["--emit", "exe"],
    "exe-bf16": ["--emit", "exe", "--precision", "bf16"],
    "lib": ["--emit", "staticlib"],
    "lib-bf16": ["--emit", "staticlib", "--precision", "bf16"],
    "ptx": ["--target", "cuda", "--emit", "ptx"],
    "ptx-bf16": ["--target", "cuda", "--emit", "ptx", "--precision", "bf16"],
}


def npy_shape(path: str) -> tuple[int, ...]:
    """The shape of a .npy file, read from its header (no numpy needed)."""
    with open(path, "rb") as f:
        magic = f.read(8)
        if magic[:6] != b"\x93NUMPY":
            raise ValueError(f"{path}: not a .npy file")
        hlen = struct.unpack("<H" if magic[6] == 1 else "<I", f.read(2 if magic[6] == 1 else 4))[0]
        header = f.read(hlen).decode("latin1")
    shape = header.split("'shape':")[1].split(")")[0].strip(" (")
    return tuple(int(d) for d in shape.split(",") if d.strip())


def models(bench_dir: str | None, only: list[str] | None = None) -> list[dict]:
    """(name, model path, compile arguments, small inputs that may be bound) for every model."""
    out = []
    sources = [(FIXTURES, json.load(open(os.path.join(FIXTURES, "manifest.json"))))]
    if bench_dir:
        sources.append((bench_dir, json.load(open(os.path.join(bench_dir, "manifest.json")))))
    for base, manifest in sources:
        for f in manifest:
            if only and not any(o in f["name"] for o in only):
                continue
            args = []
            if f.get("weights"):
                args += ["--weights", os.path.join(base, f["weights"])]
            for name, dims in sorted(f.get("input_shapes", {}).items()):
                args += ["--input-shape", f"{name}={','.join(map(str, dims))}"]
            binds = []
            for name, rel in sorted(f.get("inputs", {}).items()):
                p = os.path.join(base, rel)
                shape = npy_shape(p)
                n = 1
                for d in shape:
                    n *= d
                if len(shape) <= 1 and n <= 64:
                    binds += ["--bind", f"{name}={p}"]
            out.append({"name": f["name"], "model": os.path.join(base, f["model"]), "args": args, "binds": binds})
    return out


def compile_one(kiln: str, model: dict, mode: str, work: str) -> dict[str, str]:
    """Compiles one model one way; returns {artifact key: sha256 or refusal}."""
    key = f"{model['name']}/{mode}"
    out_dir = os.path.join(work, model["name"], mode)
    os.makedirs(out_dir, exist_ok=True)
    base = [kiln, "compile", model["model"], "--name", "m", *model["args"], *MODES[mode]]
    target = os.path.join(out_dir, "") if mode.startswith("lib") else os.path.join(out_dir, "m")
    run = subprocess.run([*base, "-o", target], capture_output=True, text=True)
    if run.returncode != 0 and model["binds"]:
        # Shape-determining inputs (a Reshape's target, a Resize's sizes) must be bound, as
        # the compiled test suites do.
        run = subprocess.run([*base, *model["binds"], "-o", target], capture_output=True, text=True)
    if run.returncode != 0:
        first = (run.stderr.strip().splitlines() or [""])[0]
        return {key: f"refused (exit {run.returncode}): {first}"}
    result = {}
    for name in sorted(os.listdir(out_dir)):
        with open(os.path.join(out_dir, name), "rb") as f:
            result[f"{key}/{name}"] = hashlib.sha256(f.read()).hexdigest()
    shutil.rmtree(out_dir)
    return result


def host() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def record(kiln: str, bench_dir: str | None, jobs: int, only: list[str] | None = None) -> dict:
    kiln = os.path.abspath(kiln)
    hashes: dict[str, str] = {}
    todo = [(m, mode) for m in models(bench_dir, only) for mode in MODES]
    with tempfile.TemporaryDirectory(prefix="kiln-hashes-") as work:
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(compile_one, kiln, m, mode, work) for m, mode in todo]
            for i, fut in enumerate(concurrent.futures.as_completed(futures), 1):
                hashes.update(fut.result())
                print(f"\r{i}/{len(todo)} compiles", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return {"host": host(), "artifacts": dict(sorted(hashes.items()))}


def build_rev(rev: str, work: str) -> str:
    tree = os.path.join(work, "tree")
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", tree, rev], check=True)
    env = dict(os.environ, CARGO_TARGET_DIR=os.path.join(work, "target"))
    subprocess.run(["cargo", "build", "--release", "-p", "kiln-cli"], cwd=tree, env=env, check=True)
    return os.path.join(work, "target", "release", "kiln")


def checkout_relative(value: str) -> str:
    """A refusal quotes the model's absolute path: name the fixtures relative to the checkout,
    so that a baseline recorded in another clone or worktree compares equal."""
    return re.sub(r"(?:/[^/\s:]+)*/fixtures/models/", "fixtures/models/", value)


def compare(old: dict, new: dict, only: list[str] | None = None) -> int:
    a, b = old["artifacts"], new["artifacts"]
    a = {k: checkout_relative(v) for k, v in a.items()}
    b = {k: checkout_relative(v) for k, v in b.items()}
    if only:
        # A baseline file holds every model; compare the ones recorded this time (benchmark
        # models only when --bench-models was given).
        recorded = {k.split("/")[0] for k in b}
        a = {k: v for k, v in a.items() if any(o in k.split("/")[0] for o in only) and k.split("/")[0] in recorded}
    if old.get("host") != new.get("host"):
        print(f"note: baseline recorded on '{old.get('host')}', this host is '{new.get('host')}'; "
              "executables are compiled for the host CPU (use --rev to rebuild the baseline here)")
    diffs = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    for k in diffs:
        print(f"{k}: {a.get(k, 'absent')} -> {b.get(k, 'absent')}")
    print(f"{len(b)} artifacts, {len(diffs)} differ")
    return 1 if diffs else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("action", choices=["record", "check"])
    ap.add_argument("file", nargs="?", help="OUT.json (record) or BASELINE.json (check)")
    ap.add_argument("--kiln", default=os.path.join(ROOT, "target", "release", "kiln"))
    ap.add_argument("--bench-models", help="folder written by fixtures/make_benchmark_models.py")
    ap.add_argument("--rev", help="check: build this git revision's kiln as the baseline")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--only", help="comma-separated parts of model names: just those models")
    args = ap.parse_args()
    if args.action == "record" and not args.file:
        ap.error("record needs OUT.json")
    if args.action == "check" and bool(args.file) == bool(args.rev):
        ap.error("check needs BASELINE.json or --rev REV")
    only = args.only.split(",") if args.only else None
    if not os.path.exists(args.kiln):
        ap.error(f"{args.kiln} does not exist: cargo build --release -p kiln-cli")

    if args.action == "record":
        result = record(args.kiln, args.bench_models, args.jobs, only)
        with open(args.file, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        print(f"{len(result['artifacts'])} artifacts recorded in {args.file}")
        return 0
    if args.rev:
        with tempfile.TemporaryDirectory(prefix="kiln-baseline-") as work:
            try:
                baseline = record(build_rev(args.rev, work), args.bench_models, args.jobs, only)
            finally:
                subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force",
                                os.path.join(work, "tree")], check=False)
    else:
        baseline = json.load(open(args.file))
    return compare(baseline, record(args.kiln, args.bench_models, args.jobs, only), only)


if __name__ == "__main__":
    sys.exit(main())
