#!/usr/bin/env bash
# Installs what kiln needs to build and test on a fresh Debian 12 machine, idempotently:
# from apt, LLVM 19 development packages, clang 19 with its sanitizer runtimes, a C/C++
# toolchain, the aarch64 C headers and cross compiler, valgrind, cmake and pkg-config (the tests
# build programs against compiled libraries with both) and qemu-user (the tests run artifacts on
# emulated older CPUs, and aarch64 artifacts); and a Python virtual environment at .venv with the
# pinned packages that generate the ONNX conformance cases and CUDA's ptxas and libdevice
# (nvidia-cuda-nvcc-cu12, for the CUDA target and its PTX checks).
# Run as root (or with sudo available). Safe to run again: it skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(llvm-19-dev libpolly-19-dev zlib1g-dev libzstd-dev libffi-dev libxml2-dev clang-19 libclang-rt-19-dev python3-venv build-essential libc6-dev-arm64-cross gcc-aarch64-linux-gnu valgrind cmake pkg-config qemu-user)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found; install a stable Rust toolchain (https://rustup.rs) and run again" >&2
  exit 1
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
if ! cmp -s scripts/requirements.txt .venv/.kiln-requirements 2>/dev/null; then
  echo "setup: installing Python packages (scripts/requirements.txt)"
  # python -m pip, not .venv/bin/pip: a venv that was moved or copied keeps a pip whose
  # first line names the old path.
  .venv/bin/python -m pip install -q --disable-pip-version-check -r scripts/requirements.txt
  cp scripts/requirements.txt .venv/.kiln-requirements
fi
