#!/usr/bin/env bash
# kiln's full test suite, from a fresh clone: install dependencies, generate the ONNX
# conformance cases from the pinned onnx package, then run every Rust test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/python scripts/gen_node_tests.py --out .cache/onnx-node-tests
cargo test --workspace -- --nocapture
