#!/usr/bin/env python3
"""Benchmark kiln-compiled executables against onnxruntime and OpenVINO on the same inputs.

For each model of bench-models/ (made by `fixtures/make_benchmark_models.py --out bench-models
--expected`, which this script runs when the folder has no manifest):

  1. compile it with `target/release/kiln compile bench-models/M/model.onnx -o DIR/M` (timed);
  2. check kiln's outputs against the expected outputs (max |diff|; onnxruntime's outputs when
     the manifest has none);
  3. time, in interleaved rounds (kiln, ORT, OpenVINO, kiln, ...) to spread machine noise:
     kiln: `DIR/M --input NAME=FILE.npy --bench N --threads T` (one warm-up, N timed runs);
     onnxruntime: intra_op_num_threads=T, sequential, all graph optimizations, N runs after
     a warm-up; OpenVINO: CPU, INFERENCE_NUM_THREADS=T, latency hint, INFERENCE_PRECISION_HINT
     f32 (explicit: on CPUs with bf16 OpenVINO's default is bf16), N runs after a warm-up.
     Each round gives a median; the table shows the median of the rounds' medians.

With --variants, each model is also compiled with one pass family off or one option changed
(VARIANTS below: `--disable-pass freeze|channels-last|fuse|lower-einsum`, `--conv-algorithm direct`,
`--layout nchw|nhwc`, `--precision bf16`, bf16 with `--disable-pass bf16-autocast`,
`--mode max-autotune` in f32 and bf16); every
variant runs in the same interleaved
rounds and a second table shows its kernel count (from `kiln compile --report`), latency and
the ratio to the default compile, with its output error. Variants this kiln does not accept
(an option missing from `kiln compile --help`, an unknown pass) are listed as unavailable.

With a bf16 variant (`bf16`, `bf16-no-autocast`), OpenVINO also runs the model with
INFERENCE_PRECISION_HINT bf16 (same threads and hint) in the same rounds, and a third table
shows, per bf16 variant: kiln bf16 ms, OpenVINO bf16 ms, kiln bf16 / OpenVINO bf16, the speed-up
over kiln's default (f32) compile, the cosine of kiln bf16's outputs to the f32 expected outputs,
OpenVINO bf16's own cosine to them (what another bf16 implementation reaches), and whether
BF16_TARGET is met. When OpenVINO's CPU plugin does not report BF16 in its
OPTIMIZATION_CAPABILITIES, that column is skipped with a line saying why. --json has the same
(openvino_bf16_ms, openvino_bf16_cosine, openvino_bf16_max_abs_diff, openvino_bf16_unavailable
per model; speedup_vs_f32, vs_openvino_bf16 per bf16 variant).

Prints markdown tables. Usage, from the repository root (the script creates and then uses
.venv-bench with scripts/bench-requirements.txt):

    python3 scripts/bench.py [--models resnet50 bert_encoder] [--threads 2] [--runs 10]
                             [--rounds 3] [--json bench.json] [--kiln target/release/kiln]
                             [--variants [NAME ...]]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv-bench")
REQUIREMENTS = os.path.join(ROOT, "scripts", "bench-requirements.txt")
# name -> extra `kiln compile` flags. Each is compared with the default compile (no flags).
VARIANTS = {
    "no-freeze": ["--disable-pass", "freeze"],
    "no-channels-last": ["--disable-pass", "channels-last"],
    "no-fuse": ["--disable-pass", "fuse"],
    # Einsums on the kernel library's generic loop nest instead of products (hf_xlnet).
    "no-lower-einsum": ["--disable-pass", "lower-einsum"],
    # What Winograd convolutions buy (stride-1 3x3 layers).
    "direct-conv": ["--conv-algorithm", "direct"],
    "nchw": ["--layout", "nchw"],
    "nhwc": ["--layout", "nhwc"],
    "bf16": ["--precision", "bf16"],
    # What the autocast pass buys at bf16 (without it, bf16 should compile like f32).
    "bf16-no-autocast": ["--precision", "bf16", "--disable-pass", "bf16-autocast"],
    # Kernel blockings timed on this machine (the cache in ~/.cache/kiln: a second run reads it).
    "max-autotune": ["--mode", "max-autotune"],
    "bf16-max-autotune": ["--precision", "bf16", "--mode", "max-autotune"],
}
# The bf16 acceptance targets: kiln --precision bf16 at least this much faster than kiln f32 and
# at most the model's ratio of OpenVINO bf16's latency (BF16_SPEED_MODELS: the generator's models
# at 1.1, the exporter graphs at 0.9; torchvision's ResNet-50 export as the generator's), with
# at least this cosine to the f32 reference on every model.
BF16_TARGET = {"speedup_vs_f32": 1.6, "cosine": 0.999}
BF16_SPEED_MODELS = {"resnet50": 1.1, "tv_resnet50": 1.1, "bert_encoder": 1.1, "torch_encoder": 0.9,
                     "hf_bert": 0.9, "hf_gpt2": 0.9}
LATENCY = re.compile(r"latency: median ([0-9.]+) ms, min ([0-9.]+) ms over (\d+) runs, (\d+) threads")


def ensure_venv() -> None:
    """Re-runs this script inside .venv-bench, creating or updating it first."""
    py = os.path.join(VENV, "bin", "python")
    with open(REQUIREMENTS, "rb") as f:
        want = hashlib.sha256(f.read()).hexdigest()
    stamp = os.path.join(VENV, ".requirements-sha256")
    have = open(stamp).read().strip() if os.path.exists(stamp) else None
    if have != want:
        if not os.path.exists(py):
            print(f"creating {VENV}", file=sys.stderr)
            subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", "-r", REQUIREMENTS], check=True)
        with open(stamp, "w") as f:
            f.write(want + "\n")
    if os.path.realpath(sys.prefix) != os.path.realpath(VENV):
        os.execv(py, [py, *sys.argv])


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", help="model names (default: all in the manifest)")
    ap.add_argument("--models-dir", default=os.path.join(ROOT, "bench-models"),
                    help="benchmark models folder (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=2, help="threads for every runtime (default: %(default)s)")
    ap.add_argument("--runs", type=int, default=10, help="timed runs per round (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved rounds kiln, ORT, OpenVINO (default: %(default)s)")
    ap.add_argument("--kiln", default=os.path.join(ROOT, "target", "release", "kiln"),
                    help="the kiln binary (default: %(default)s)")
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "target", "bench"),
                    help="where executables and outputs go (default: %(default)s)")
    ap.add_argument("--no-openvino", action="store_true", help="skip OpenVINO")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ap.add_argument("--variants", nargs="*", metavar="NAME",
                    help=f"also compile and time each model with these variants (none named: all of "
                         f"{', '.join(VARIANTS)})")
    ap.add_argument("--no-venv", action="store_true",
                    help="run with this Python as it is (onnxruntime and openvino already installed)")
    return ap.parse_args()


def load_manifest(models_dir: str) -> dict:
    path = os.path.join(models_dir, "manifest.json")
    if not os.path.exists(path):
        # The models are generated, not downloaded; this venv has what the generator needs
        # (onnx, numpy, and onnxruntime for BatchNorm calibration and the expected outputs).
        print(f"{path} not found: making the benchmark models (about a minute)", file=sys.stderr)
        make = os.path.join(ROOT, "fixtures", "make_benchmark_models.py")
        subprocess.run([sys.executable, make, "--out", models_dir, "--expected"], check=True)
    with open(path) as f:
        return {e["name"]: e for e in json.load(f)}


class Unavailable(Exception):
    """This kiln does not accept a variant's flags."""


def compile_flags(kiln: str) -> set[str]:
    """The long options `kiln compile` accepts."""
    r = subprocess.run([kiln, "compile", "--help"], capture_output=True, text=True)
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", r.stdout))


def compile_model(kiln: str, model: str, exe: str, flags: list[str] | None = None,
                  report: str | None = None) -> float:
    cmd = [kiln, "compile", model, "-o", exe, *(flags or [])]
    if report:
        cmd += ["--report", report]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        if "no such pass" in r.stderr:
            raise Unavailable(r.stderr.strip().splitlines()[-1])
        raise RuntimeError(f"kiln compile failed:\n{r.stderr.strip()}")
    return time.perf_counter() - t0


def kernel_count(report: str | None) -> int | None:
    if not report or not os.path.exists(report):
        return None
    with open(report) as f:
        r = json.load(f)
    return r.get("summary", {}).get("kernels")


def kiln_round(exe: str, inputs: dict, runs: int, threads: int, output_dir: str | None = None) -> float:
    cmd = [exe, "--bench", str(runs), "--threads", str(threads), "-q"]
    for name, path in inputs.items():
        cmd += ["--input", f"{name}={path}"]
    if output_dir:
        cmd += ["--output-dir", output_dir]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{os.path.basename(exe)} failed:\n{r.stderr.strip()}")
    m = LATENCY.search(r.stdout)
    if not m:
        raise RuntimeError(f"no latency line in the output of {exe}:\n{r.stdout}")
    return float(m.group(1))


def timed(fn, runs: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


def ort_session(model: str, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def ov_bf16_missing() -> str | None:
    """Why OpenVINO's CPU plugin cannot run bf16 here, or None when it can."""
    import openvino as ov

    caps = ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    return None if "BF16" in caps else f"the CPU plugin reports no BF16 capability ({', '.join(caps)})"


def ov_request(model: str, threads: int, precision: str = "f32"):
    import openvino as ov

    core = ov.Core()
    # The precision is always explicit: on CPUs with bf16 (AVX512_BF16, AMX) OpenVINO runs in
    # bf16 by default, which would make the f32 column a bf16 one.
    compiled = core.compile_model(core.read_model(model), "CPU",
                                  {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
                                   "INFERENCE_PRECISION_HINT": precision})
    # A hint the CPU cannot honour falls back silently; read back what it compiled to.
    got = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
    if got != precision:
        raise RuntimeError(f"asked for INFERENCE_PRECISION_HINT {precision}, compiled as {got}")
    return compiled.create_infer_request()


def ov_outputs(req, feeds: dict, names) -> dict:
    import numpy as np

    # Copies: the arrays infer() returns are views of buffers the next infer() overwrites.
    got = req.infer(feeds)
    return {n: np.array(got[n], copy=True) for n in names}


def sanitize(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def output_error(entry: dict, mdir: str, out_dir: str, ort_out: dict) -> tuple[float, float]:
    """Max |diff| and the smallest cosine similarity of kiln's outputs against the reference."""
    import numpy as np

    got = {out: np.load(os.path.join(out_dir, sanitize(out) + ".npy")) for out in ort_out}
    return compare(entry, mdir, got, ort_out, "kiln")


def compare(entry: dict, mdir: str, outputs: dict, ort_out: dict, who: str) -> tuple[float, float]:
    """Max |diff| and the smallest cosine similarity of `outputs` against the expected outputs
    (onnxruntime's, `ort_out`, where the manifest has none)."""
    import numpy as np

    diff, cosine = 0.0, 1.0
    for out, ref in ort_out.items():
        expected = entry.get("outputs", {}).get(out)
        ref = np.load(os.path.join(mdir, expected)) if expected else ref
        got = outputs[out]
        if got.shape != ref.shape:
            raise RuntimeError(f"output '{out}': {who} gives shape {got.shape}, expected {ref.shape}")
        if got.size:
            g, r = got.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
            diff = max(diff, float(np.max(np.abs(g - r))))
            norm = float(np.linalg.norm(g) * np.linalg.norm(r))
            cosine = min(cosine, float(g @ r / norm) if norm else float(np.array_equal(g, r)))
    return diff, cosine


def bench_model(args, entry: dict, flags: set[str]) -> dict:
    import numpy as np

    name = entry["name"]
    mdir = args.models_dir
    model = os.path.join(mdir, entry["model"])
    inputs = {k: os.path.join(mdir, v) for k, v in entry["inputs"].items()}
    feeds = {k: np.load(v) for k, v in inputs.items()}
    exe = os.path.join(args.out_dir, name)
    out_dir = os.path.join(args.out_dir, f"{name}.out")
    res = {"model": name, "threads": args.threads, "runs": args.runs, "rounds": args.rounds}

    report = exe + ".report.json" if "--report" in flags else None
    res["compile_s"] = compile_model(args.kiln, model, exe, report=report)
    res["kernels"] = kernel_count(report)

    # Variants: compiled up front, timed in the same rounds as the default.
    variants = []
    for v in args.variants or []:
        vflags = VARIANTS[v]
        var = {"variant": v, "flags": " ".join(vflags), "exe": f"{exe}.{v}", "out_dir": f"{exe}.{v}.out"}
        missing = [f for f in vflags if f.startswith("--") and f not in flags]
        try:
            if missing:
                raise Unavailable(f"kiln compile has no {', '.join(missing)}")
            vreport = f"{exe}.{v}.report.json" if report else None
            var["compile_s"] = compile_model(args.kiln, model, var["exe"], vflags, vreport)
            var["kernels"] = kernel_count(vreport)
        except Unavailable as e:
            var["unavailable"] = str(e)
        except RuntimeError as e:
            var["error"] = str(e)
        variants.append(var)
    timed_variants = [v for v in variants if "compile_s" in v]

    sess = ort_session(model, args.threads)
    ort_out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    ov_req = ov_bf16_req = None
    if not args.no_openvino:
        try:
            ov_req = ov_request(model, args.threads)
        except Exception as e:  # an op OpenVINO lacks should not stop the other columns
            print(f"{name}: OpenVINO cannot run it: {e}", file=sys.stderr)
    if args.ov_bf16 and args.ov_bf16_missing:
        res["openvino_bf16_unavailable"] = args.ov_bf16_missing
    elif args.ov_bf16:
        # The bf16 peer of kiln's bf16 variants: what another bf16 implementation reaches.
        try:
            ov_bf16_req = ov_request(model, args.threads, "bf16")
            res["openvino_bf16_max_abs_diff"], res["openvino_bf16_cosine"] = compare(
                entry, mdir, ov_outputs(ov_bf16_req, feeds, ort_out), ort_out, "OpenVINO bf16")
        except Exception as e:
            print(f"{name}: OpenVINO cannot run it in bf16: {e}", file=sys.stderr)
            res["openvino_bf16_unavailable"] = str(e)
            ov_bf16_req = None

    times = {"kiln": [], "ort": [], "openvino": []}
    if ov_bf16_req is not None:
        times["openvino_bf16"] = []
    for rnd in range(args.rounds):
        # The kiln executables start in a different order each round, so no variant always
        # runs first (cold caches) or right after a slow one.
        order = [None, *timed_variants]
        shift = rnd % len(order)
        for v in order[shift:] + order[:shift]:
            if v is None:
                times["kiln"].append(kiln_round(exe, inputs, args.runs, args.threads, out_dir if rnd == 0 else None))
                continue
            if "error" in v:
                continue
            try:
                t = kiln_round(v["exe"], inputs, args.runs, args.threads, v["out_dir"] if rnd == 0 else None)
                v.setdefault("round_ms", []).append(t)
            except RuntimeError as e:
                v["error"] = str(e)
        times["ort"].append(timed(lambda: sess.run(None, feeds), args.runs))
        if ov_req is not None:
            times["openvino"].append(timed(lambda: ov_req.infer(feeds), args.runs))
        if ov_bf16_req is not None:
            times["openvino_bf16"].append(timed(lambda: ov_bf16_req.infer(feeds), args.runs))

    res["max_abs_diff"], res["cosine"] = output_error(entry, mdir, out_dir, ort_out)
    for k, v in times.items():
        res[f"{k}_ms"] = statistics.median(v) if v else None
        res[f"{k}_round_ms"] = v
    for v in timed_variants:
        if "error" in v:
            continue
        v["ms"] = statistics.median(v["round_ms"])
        v["vs_default"] = v["ms"] / res["kiln_ms"] if res["kiln_ms"] else None
        try:
            v["max_abs_diff"], v["cosine"] = output_error(entry, mdir, v["out_dir"], ort_out)
        except Exception as e:
            v["error"] = f"output check: {e}"
        if is_bf16(v["variant"]):
            # The acceptance numbers: speed-up over kiln f32, and latency against OpenVINO bf16.
            v["speedup_vs_f32"] = res["kiln_ms"] / v["ms"] if v["ms"] else None
            bf16_ms = res.get("openvino_bf16_ms")
            v["vs_openvino_bf16"] = v["ms"] / bf16_ms if bf16_ms else None
    if args.variants is not None:
        res["variants"] = [{k: x for k, x in v.items() if k not in ("exe", "out_dir")} for v in variants]
    return res


def is_bf16(variant: str) -> bool:
    flags = VARIANTS[variant]
    return "--precision" in flags and flags[flags.index("--precision") + 1] == "bf16"


def fmt(x, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def ratio(a, b) -> str:
    return "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def print_variants(results: list) -> None:
    print("\nPass families and options: each variant against the default compile (same rounds)\n")
    print("| model | variant | flags | kernels | kiln ms | vs default | max abs diff | cosine |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for r in results:
        if "error" in r:
            continue
        print(f"| {r['model']} | default | | {fmt(r.get('kernels'), 'd')} | {r['kiln_ms']:.3f} | 1.00 | "
              f"{r['max_abs_diff']:.2e} | {r['cosine']:.6f} |")
        for v in r.get("variants", []):
            head = f"| {r['model']} | {v['variant']} | `{v['flags']}` |"
            if "unavailable" in v:
                print(f"{head} n/a | unavailable: {v['unavailable']} | | | |")
            elif "error" in v:
                msg = v["error"].splitlines()[-1][:120].replace("|", "\\|")
                print(f"{head} {fmt(v.get('kernels'), 'd')} | failed: {msg} | | | |")
            else:
                print(f"{head} {fmt(v.get('kernels'), 'd')} | {v['ms']:.3f} | {fmt(v['vs_default'], '.2f')} | "
                      f"{v['max_abs_diff']:.2e} | {v['cosine']:.6f} |")


def bf16_verdict(model: str, v: dict) -> str:
    t = BF16_TARGET
    got = (v.get("speedup_vs_f32"), v.get("vs_openvino_bf16"), v.get("cosine"))
    if None in got:
        return "n/a"
    checks = [(f"cosine < {t['cosine']}", got[2] >= t["cosine"])]
    if model in BF16_SPEED_MODELS:
        vs_ov = BF16_SPEED_MODELS[model]
        checks += [(f"speed-up < {t['speedup_vs_f32']}", got[0] >= t["speedup_vs_f32"]),
                   (f"vs OV > {vs_ov}", got[1] <= vs_ov)]
    missed = [what for what, ok in checks if not ok]
    return "met" if not missed else "missed: " + ", ".join(missed)


def print_bf16(results: list) -> None:
    t = BF16_TARGET
    speed = ", ".join(f"{m} {r}x" for m, r in BF16_SPEED_MODELS.items())
    print(f"\nbf16 against kiln f32 and OpenVINO bf16 (same rounds; target: >= {t['speedup_vs_f32']}x "
          f"kiln f32 and at most this ratio of OpenVINO bf16: {speed}; cosine >= {t['cosine']} to the "
          f"f32 reference everywhere)\n")
    print("| model | variant | kiln bf16 ms | OV bf16 ms | kiln/OV bf16 | speed-up vs kiln f32 "
          "| cosine | OV bf16 cosine | target |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        if "error" in r:
            continue
        ov_cos = fmt(r.get("openvino_bf16_cosine"), ".6f")
        for v in r.get("variants", []):
            if not is_bf16(v["variant"]) or "unavailable" in v or "error" in v:
                continue
            print(f"| {r['model']} | {v['variant']} | {v['ms']:.3f} | {fmt(r.get('openvino_bf16_ms'), '.3f')} | "
                  f"{fmt(v['vs_openvino_bf16'], '.2f')} | {fmt(v['speedup_vs_f32'], '.2f')} | "
                  f"{v['cosine']:.6f} | {ov_cos} | {bf16_verdict(r['model'], v)} |")
    for r in results:
        if "openvino_bf16_unavailable" in r:
            print(f"\n{r['model']}: no OpenVINO bf16 column: {r['openvino_bf16_unavailable']}")


def main() -> int:
    args = parse_args()
    if not args.no_venv:
        ensure_venv()
    manifest = load_manifest(args.models_dir)
    names = args.models or list(manifest)
    unknown = [n for n in names if n not in manifest]
    if unknown:
        sys.exit(f"error: unknown model(s) {', '.join(unknown)} (known: {', '.join(manifest)})")
    if not os.path.exists(args.kiln):
        sys.exit(f"error: {args.kiln} not found: build it with `cargo build --release -p kiln-cli`")
    os.makedirs(args.out_dir, exist_ok=True)
    if args.variants is not None:
        unknown = [v for v in args.variants if v not in VARIANTS]
        if unknown:
            sys.exit(f"error: unknown variant(s) {', '.join(unknown)} (known: {', '.join(VARIANTS)})")
        args.variants = args.variants or list(VARIANTS)
    # OpenVINO bf16 is timed only as the peer of a kiln bf16 variant.
    args.ov_bf16 = not args.no_openvino and any(is_bf16(v) for v in args.variants or [])
    args.ov_bf16_missing = ov_bf16_missing() if args.ov_bf16 else None
    if args.ov_bf16_missing:
        print(f"OpenVINO bf16 skipped: {args.ov_bf16_missing}", file=sys.stderr)
    flags = compile_flags(args.kiln)

    results, failures = [], 0
    for n in names:
        try:
            r = bench_model(args, manifest[n], flags)
        except Exception as e:
            print(f"{n}: {e}", file=sys.stderr)
            failures += 1
            results.append({"model": n, "error": str(e)})
            continue
        results.append(r)
        bf16 = f", OpenVINO bf16 {fmt(r['openvino_bf16_ms'], '.3f')} ms" if "openvino_bf16_ms" in r else ""
        print(f"{n}: kiln {r['kiln_ms']:.3f} ms, ORT {r['ort_ms']:.3f} ms, "
              f"OpenVINO f32 {fmt(r['openvino_ms'], '.3f')} ms{bf16}", file=sys.stderr, flush=True)

    print(f"\n{args.threads} threads, median of {args.rounds} rounds x {args.runs} runs\n")
    print("| model | kiln ms | ORT ms | OpenVINO f32 ms | kiln/ORT | kiln/OV | compile s | max abs diff |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        if "error" in r:
            print(f"| {r['model']} | failed | | | | | | |")
            continue
        print(f"| {r['model']} | {r['kiln_ms']:.3f} | {r['ort_ms']:.3f} | {fmt(r['openvino_ms'], '.3f')} | "
              f"{ratio(r['kiln_ms'], r['ort_ms'])} | {ratio(r['kiln_ms'], r['openvino_ms'])} | "
              f"{r['compile_s']:.1f} | {r['max_abs_diff']:.2e} |")
    if args.variants:
        print_variants(results)
    if any(is_bf16(v) for v in args.variants or []):
        print_bf16(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
            f.write("\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
