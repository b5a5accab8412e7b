#!/usr/bin/env bash
# kiln's full test suite, from a fresh clone: install dependencies, generate the ONNX
# conformance cases from the pinned onnx package, then run every Rust test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/python scripts/gen_node_tests.py --out .cache/onnx-node-tests
mkdir -p .cache
cargo test --workspace -- --nocapture 2>&1 | tee .cache/test.log
# One closing line for the whole suite: the sum of every test binary's result line.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' .cache/test.log
