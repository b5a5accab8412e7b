#!/usr/bin/env bash
# Builds kiln and runs its main job on a bundled model: compile a ResNet to a self-contained
# executable, run it on an input, show the outputs and time it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release -p kiln-cli
MODEL=fixtures/models/resnet_bottleneck_tiny
INPUT="$MODEL/inputs/input.npy"
mkdir -p out
echo
echo "\$ kiln compile $MODEL/model.onnx -o out/resnet_tiny"
target/release/kiln compile "$MODEL/model.onnx" -o out/resnet_tiny
echo
echo "\$ out/resnet_tiny --input input=$INPUT --output-dir out"
out/resnet_tiny --input "input=$INPUT" --output-dir out
echo
echo "\$ out/resnet_tiny --input input=$INPUT --bench 50"
out/resnet_tiny --input "input=$INPUT" --bench 50
