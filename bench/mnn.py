"""MNN's OpenCL backend as a benchmark peer (never a dependency): build its ``benchmark.out`` from source,
convert ONNX files with the ``MNN`` wheel's ``mnnconvert``, run it in a GPU mode, read its times.

Used by ``bench/runtimes_gpu.py`` and ``bench/peers.py``. Each function takes ``sh(cmd, env=None,
timeout=None, quiet=False) -> (returncode, output)`` so that the caller's job log records every command.

- **Source**: a tarball of alibaba/MNN's tree (the GPU job carries ``.mnn/mnn-src.tgz``; see
  ``bench/notes/peers.md`` for how it was cut: ``git archive`` of 4d40bdb without the CUDA, Vulkan, Metal,
  Hexagon, CoreML, NNAPI, QNN, TensorRT, HiAI, OpenGL and MUSA backends, protobuf, apps and docs).
- **Build**: ``-DMNN_OPENCL=ON -DMNN_BUILD_BENCHMARK=ON``, tools and protobuf off, target ``benchmark.out``.
- **One patch** (:func:`patch_any_device`, applied to the extracted source before the build): MNN's OpenCL
  runtime asks its platform for ``CL_DEVICE_TYPE_GPU`` devices only, so on a CPU OpenCL runtime (PoCL, Intel's)
  it finds none and MNN silently runs its *CPU backend* instead. With ``MNN_OPENCL_ANY_DEVICE`` set in the
  environment it asks for ``CL_DEVICE_TYPE_ALL``; unset (the GPU jobs), MNN is unchanged.
- **Run**: ``benchmark.out DIR loop warmup 3 MODE 1``: forward type 3 (OpenCL), MODE the GPU mode bits (tuning:
  1 none, 2 heavy, 4 wide, 8 normal, 16 fast; memory: 64 buffer, 128 image), precision 1 (high: float32). Its
  times include the input upload and the output download; it prints the mean (and min, max) of ``loop`` runs.
  Its OpenCL tuning runs at session creation, before the warm-up, and is not timed.
- **Which device**: MNN takes platform 0's first device. ``opencl_env`` gives it a folder with
  ``libOpenCL.so`` (the loader: the system's, or pyopencl's bundled one) and, for the bundled loader, an
  ``OCL_ICD_VENDORS`` folder holding only the vendor file of the wanted device.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import time
from pathlib import Path

# the GPU mode bits benchmark.out takes as its 5th argument (MNN_GPU_TUNING_* | MNN_GPU_MEMORY_*)
TUNING = {1: "none", 2: "heavy", 4: "wide", 8: "normal", 16: "fast"}
MEMORY = {64: "buffer", 128: "image"}
PATCH_MARK = "/* tuner bench/mnn.py */"
FELL_BACK = re.compile(r"Can't Find type=3 backend, use (\d+) instead")


def mode_name(mode: int) -> str:
    """132 -> 'wide tuning, image'."""
    t = next((v for k, v in TUNING.items() if mode & k), "?")
    m = next((v for k, v in MEMORY.items() if mode & k), "?")
    return f"{t} tuning, {m}"


def patch_any_device(src: Path) -> bool:
    """Let MNN's OpenCL runtime take a non-GPU device when ``MNN_OPENCL_ANY_DEVICE`` is set (module
    docstring). Idempotent; True if the source is (now) patched."""
    p = Path(src) / "source/backend/opencl/core/runtime/OpenCLRuntime.cpp"
    text = p.read_text()
    if PATCH_MARK in text:
        return True
    old = "res = platforms[platformId].getDevices(CL_DEVICE_TYPE_GPU, &gpuDevices);"
    if text.count(old) != 1:
        return False
    text = text.replace(old, 'res = platforms[platformId].getDevices(getenv("MNN_OPENCL_ANY_DEVICE") ? '
                             f'CL_DEVICE_TYPE_ALL : CL_DEVICE_TYPE_GPU, &gpuDevices);  {PATCH_MARK}')
    p.write_text(f"#include <cstdlib>  {PATCH_MARK}\n" + text)
    return True


def build(sh, src_tgz, build_dir, jobs: int | None = None, meta: dict | None = None):
    """``build_dir/b/benchmark.out``, built from ``src_tgz`` unless it is there; None (and ``meta['mnn_error']``)
    when it cannot be."""
    meta = meta if meta is not None else {}
    build_dir = Path(build_dir)
    exe = build_dir / "b" / "benchmark.out"
    if exe.exists():
        return exe
    if not (src_tgz and Path(src_tgz).exists()):
        meta["mnn_error"] = f"no MNN source tarball at {src_tgz}"
        return None
    src = build_dir / "src"
    if not (src / "CMakeLists.txt").exists():
        src.mkdir(parents=True, exist_ok=True)
        rc, text = sh(["tar", "xzf", src_tgz, "-C", src], quiet=True)
        if rc:
            meta["mnn_error"] = f"cannot extract {src_tgz}: {text[-300:]}"
            return None
    meta["mnn_patched_any_device"] = patch_any_device(src)
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    t0 = time.time()
    rc, text = sh(["cmake", "-S", src, "-B", build_dir / "b", *gen, "-DCMAKE_BUILD_TYPE=Release",
                   "-DMNN_OPENCL=ON", "-DMNN_BUILD_BENCHMARK=ON", "-DMNN_BUILD_TOOLS=OFF",
                   "-DMNN_BUILD_PROTOBUFFER=OFF", "-DMNN_SEP_BUILD=OFF", "-DMNN_KLEIDIAI=OFF"], quiet=True)
    if not rc:
        rc, text = sh(["cmake", "--build", build_dir / "b", "--target", "benchmark.out", "-j",
                       str(jobs or os.cpu_count() or 4)], quiet=True, timeout=3600)
    meta["mnn_build_s"] = time.time() - t0
    if rc or not exe.exists():
        meta["mnn_error"] = "build failed: " + text[-1500:]
        return None
    return exe


def install_converter(sh, wheel, site) -> str | None:
    """The ``MNN`` wheel unpacked into ``site`` (for its ``mnnconvert``); None, or what went wrong."""
    site = Path(site)
    if (site / "MNN").exists():
        return None
    if not (wheel and Path(wheel).exists()):
        return f"no MNN wheel at {wheel}"
    rc, text = sh([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", site, wheel],
                  quiet=True)
    return None if rc == 0 and (site / "MNN").exists() else f"pip install {wheel}: {text[-400:]}"


def convert(sh, onnx_path, mnn_path, site) -> str | None:
    """``onnx_path`` -> ``mnn_path`` with the wheel's mnnconvert (float32 weights); None, or the error."""
    if Path(mnn_path).exists():
        return None
    Path(mnn_path).parent.mkdir(parents=True, exist_ok=True)
    code = ("import sys; sys.argv = ['mnnconvert', '-f', 'ONNX', '--modelFile', sys.argv[1], '--MNNModel', "
            "sys.argv[2], '--bizCode', 'bench']; from MNN.tools.mnnconvert import main; main()")
    rc, text = sh([sys.executable, "-c", code, onnx_path, mnn_path],
                  env={**os.environ, "PYTHONPATH": str(site)}, quiet=True)
    return None if rc == 0 and Path(mnn_path).exists() else "mnnconvert: " + text[-400:]


def opencl_env(sh, build_dir, loader: str | None = None, vendor_file: str | None = None) -> tuple:
    """(environment, description) for benchmark.out: ``build_dir/lib/libOpenCL.so`` -> ``loader`` (default:
    the system's libOpenCL.so.1 from ldconfig) and, with ``vendor_file``, ``OCL_ICD_VENDORS`` = a folder with
    that one vendor file (MNN takes platform 0) and ``MNN_OPENCL_ANY_DEVICE=1`` (a CPU device is taken too)."""
    tag = Path(vendor_file).stem if vendor_file else "system"
    libdir = Path(build_dir) / f"lib-{tag}"
    libdir.mkdir(parents=True, exist_ok=True)
    if loader is None:
        rc, text = sh(["sh", "-c", "ldconfig -p | awk '/libOpenCL\\.so\\.1/ {print $NF; exit}'"], quiet=True)
        loader = text.strip().splitlines()[0] if text.strip() else None
    if loader is None:
        return dict(os.environ), "no libOpenCL.so.1 found"
    link = libdir / "libOpenCL.so"
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink(loader, link)
    env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join([str(libdir), os.environ.get("LD_LIBRARY_PATH", "")])}
    how = f"{link} -> {loader}"
    if vendor_file:
        vend = libdir / "vendors"
        shutil.rmtree(vend, ignore_errors=True)
        vend.mkdir()
        shutil.copy(vendor_file, vend / Path(vendor_file).name)
        # PYOPENCL_HOME: pyopencl's bundled loader crashes (SIGSEGV) without it (tuner.native.opencl_env)
        env.update({"OCL_ICD_VENDORS": str(vend), "PYOPENCL_HOME": str(vend), "MNN_OPENCL_ANY_DEVICE": "1"})
        env.pop("OCL_ICD_FILENAMES", None)
        how += f"; OCL_ICD_VENDORS={vend} ({Path(vendor_file).read_text().strip()}); MNN_OPENCL_ANY_DEVICE=1"
    return env, how


def bench(sh, exe, model_dir, repeats: int, warmup: int, mode: int, env: dict, timeout: float = 240.0,
          precision: int = 1) -> dict:
    """One ``benchmark.out`` run over the single model in ``model_dir``: {mean_s, min_s, max_s, seconds} or
    {error}. A run in which MNN gave up on OpenCL and used another backend is an error, never a time."""
    t0 = time.time()
    rc, text = sh([exe, model_dir, repeats, warmup, 3, mode, precision], env=env, quiet=True, timeout=timeout)
    wall = time.time() - t0
    fb = FELL_BACK.search(text)
    if fb:
        return {"error": f"MNN found no OpenCL device and ran backend {fb.group(1)} (CPU) instead", "seconds": wall}
    m = re.search(r"max =\s*([0-9.]+) ms\s+min =\s*([0-9.]+) ms\s+avg =\s*([0-9.]+) ms", text)
    if rc or not m:
        crash = " (the OpenCL runtime's compiler crashed: 'PLEASE submit a bug report')" if "PLEASE submit" in text else ""
        return {"error": f"exit {rc}{crash}: " + text.strip()[-300:], "seconds": wall}
    return {"max_s": float(m.group(1)) * 1e-3, "min_s": float(m.group(2)) * 1e-3, "mean_s": float(m.group(3)) * 1e-3,
            "seconds": wall}
