#!/usr/bin/env bash
# Builds kiln and runs its main job on a bundled model: inspect the model, then run it through
# the reference interpreter and show the outputs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release -p kiln-cli
MODEL=fixtures/models/resnet_bottleneck_tiny
echo
echo "\$ kiln inspect $MODEL/model.onnx"
target/release/kiln inspect "$MODEL/model.onnx"
echo
INPUT="$MODEL/inputs/input.npy"
echo "\$ kiln run $MODEL/model.onnx --input input=$INPUT --output-dir out --reference"
target/release/kiln run "$MODEL/model.onnx" --input "input=$INPUT" --output-dir out --reference
