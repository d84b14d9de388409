#!/usr/bin/env bash
# Whole-model runtimes on a GPU machine without internet, one job (bench/runtimes_gpu.py all): the Python
# executor (kernels only and whole runs), the native runtime tuner-run, an older tree's Python executor, and
# PyTorch eager and CUDA-graph replay, each side in its own process. Writes $OUT/runtimes_gpu.{json,csv,md,log}.
#
# Before, where git is (the trees travel as untracked folders; delete them afterwards, never commit them):
#   python bench/runtimes_gpu.py prepare --new HEAD --old 4d2b635      # -> bench/_trees/{new,old}
#   and the wheels the GPU image lacks in .whl/ (pyopencl, pytools, platformdirs, siphash24, optuna, alembic,
#   sqlalchemy, colorlog, mako, greenlet, xgboost-cpu: bench/notes/runtimes-gpu.md)
# On the GPU machine, from the repository root:
#   OUT=/tmp/out bench/runtimes_gpu.sh [more arguments of runtimes_gpu.py all, e.g. --deadline 540]
# NEW_TREE / OLD_TREE override bench/_trees/{new,old}; without bench/_trees/new the checkout itself is timed,
# without an old tree the before/after columns stay empty.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [ -d .whl ] && [ ! -d /tmp/site/pyopencl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | tail -3
fi
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
# NVIDIA's OpenCL driver registered for the ICD loaders: the image has the driver and a PoCL vendor file, not
# NVIDIA's (pyopencl's loader then sees PoCL alone; CUDA's libOpenCL.so.1 finds NVIDIA without it)
mkdir -p /etc/OpenCL/vendors
if ! grep -qil nvidia /etc/OpenCL/vendors/*.icd 2>/dev/null; then
  lib=$(ldconfig -p 2>/dev/null | awk '/libnvidia-opencl\.so\.1/ {print $NF; exit}')
  echo "${lib:-/usr/lib/libnvidia-opencl.so.1}" > /etc/OpenCL/vendors/nvidia.icd
fi
NEW=${NEW_TREE:-bench/_trees/new}; [ -d "$NEW/tuner" ] || NEW=.
OLD=${OLD_TREE:-bench/_trees/old}
args=(--out "$OUT" --new-tree "$NEW")
[ -d "$OLD/tuner" ] && args+=(--old-tree "$OLD")
PYTHONUNBUFFERED=1 python3 -P bench/runtimes_gpu.py all "${args[@]}" "$@"
