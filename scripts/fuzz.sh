#!/usr/bin/env bash
# Runs one of kiln's fuzz targets (fuzz/fuzz_targets/) with libFuzzer for SECONDS (default 600).
#   scripts/fuzz.sh onnx_import|compile_plan|npy_reader|npy_rust [SECONDS] [extra libFuzzer flags...]
# Needs cargo-fuzz (cargo install cargo-fuzz) and clang-19. The stable toolchain is enough:
# RUSTC_BOOTSTRAP=1 unlocks the sanitizer flags cargo fuzz passes. The corpus grows in
# fuzz/corpus/TARGET (seeded from the fixtures and fuzz/regressions/TARGET); crashes land in
# fuzz/artifacts/TARGET/. onnx_import resolves external data into a folder holding symlinks out
# of it, a FIFO and a device (fuzz/hostile_folder.rs); its seeds (regressions/external_*.onnx)
# name each of them. Copy a crasher into fuzz/regressions/TARGET/ once it is fixed: the normal
# test suite replays that folder.
set -euo pipefail
target=${1:?usage: scripts/fuzz.sh TARGET [SECONDS] [libFuzzer flags...]}
secs=${2:-600}
shift $(($# < 2 ? $# : 2))
root=$(cd "$(dirname "$0")/.." && pwd)
fuzz="$root/fuzz"
corpus="$fuzz/corpus/$target"
mkdir -p "$corpus" "$fuzz/artifacts/$target"

if [ -z "$(ls -A "$corpus")" ]; then
  case "$target" in
    onnx_import|compile_plan)
      for m in "$root"/fixtures/models/*/model.onnx; do
        cp "$m" "$corpus/$(basename "$(dirname "$m")").onnx"
      done ;;
    npy_rust)
      for f in "$root"/fixtures/models/*/inputs/*.npy; do
        cp "$f" "$corpus/$(basename "$(dirname "$(dirname "$f")")")_$(basename "$f")"
      done ;;
    npy_reader)
      # The harness reads an 8-byte spec (dtype, rank, dims) before the file: prefix each
      # fixture input with its own, so that the seeds reach the data paths.
      python3 - "$root" "$corpus" <<'PY'
import ast, glob, os, sys
root, out = sys.argv[1], sys.argv[2]
codes = {"b1": 0, "u1": 1, "i1": 2, "u2": 3, "i2": 4, "u4": 5, "i4": 6, "u8": 7, "i8": 8,
         "f2": 9, "f4": 11, "f8": 12}
for f in sorted(glob.glob(f"{root}/fixtures/models/*/inputs/*.npy")):
    b = open(f, "rb").read()
    hl = b[8] | b[9] << 8
    h = ast.literal_eval(b[10:10 + hl].decode("latin1"))
    shape = h["shape"][:4]
    spec = bytes([codes.get(h["descr"][1:].replace("?", "b1"), 0), len(shape)]
                 + [d % 17 for d in shape] + [0] * (6 - len(shape)))
    name = f.split("/")[-3] + "_" + os.path.basename(f)
    open(os.path.join(out, name), "wb").write(spec + b)
PY
      ;;
    *) echo "unknown target '$target' (onnx_import, compile_plan, npy_reader, npy_rust)" >&2; exit 2 ;;
  esac
fi

seeds=()
[ -d "$fuzz/regressions/$target" ] && seeds+=("$fuzz/regressions/$target")
target_dir=()
[ -n "${CARGO_TARGET_DIR:-}" ] && target_dir=(--target-dir "$CARGO_TARGET_DIR/fuzz")
cd "$fuzz"
RUSTC_BOOTSTRAP=1 exec cargo fuzz run "${target_dir[@]}" "$target" "$corpus" "${seeds[@]}" -- \
  -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
  -artifact_prefix="$fuzz/artifacts/$target/" -print_final_stats=1 "$@"
