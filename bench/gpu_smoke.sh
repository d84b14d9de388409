#!/usr/bin/env bash
# On a GPU machine without internet: install the prepared wheels from .whl/ (see README), register
# NVIDIA's OpenCL driver, then run the kernel tests and the examples on the GPU. Writes $OUT/gpu_smoke.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /etc/OpenCL/vendors
[ -f /etc/OpenCL/vendors/nvidia.icd ] || echo /usr/lib/libnvidia-opencl.so.1 > /etc/OpenCL/vendors/nvidia.icd
{
  python3 -m tuner devices
  python3 -m tuner example addone --device nvidia
  python3 -m tuner demo --device nvidia
  TUNER_TEST_DEVICE=nvidia python3 -m pytest -q -p no:cacheprovider tests/test_codegen.py tests/test_examples.py
} 2>&1 | tee "$OUT/gpu_smoke.txt"
