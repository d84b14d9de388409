"""This machine's OpenCL devices, through pyopencl: listing them, probing them, and opening one (``Device``).

Devices are listed over all pyopencl platforms in a fixed order (platform, then device), and that order gives the
indices used by ``choose_device(spec)``; which device a spec names, and the default, are ``tuner.runtime.choice``'s
rules over that list and this module's probe.

Importing this module registers the bundled runtimes (``tuner.runtime.opencl.icd``) and imports pyopencl. What a
device is, as data (:class:`DeviceInfo`, profiles), lives in ``tuner.target``, which imports neither; it is
re-exported here for code written before it moved.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import warnings
from pathlib import Path

from tuner.runtime.opencl.cache_folders import ensure_cache_folders
from tuner.runtime.opencl.icd import register_bundled_runtimes

register_bundled_runtimes()  # before pyopencl enumerates platforms: adds Intel's CPU runtime from PyPI
ensure_cache_folders()  # PoCL reports no device at all when it cannot create its cache folder

import pyopencl as cl  # noqa: E402

from tuner.errors import TunerError  # noqa: E402
from tuner.runtime import choice  # noqa: E402
from tuner.runtime.base import probe_source  # noqa: E402
from tuner.runtime.choice import DEVICE_ENV  # noqa: E402,F401  (re-exported: the CLI's --device help names it)
from tuner.target import POCL_PLATFORM, DeviceInfo  # noqa: E402,F401  (re-exported: their home before tuner.target)

NO_DEVICE_HINT = ("`pip install pocl-binary-distribution` provides a CPU device; on CPUs its LLVM does not know "
                  "(e.g. AMD Zen 5) `pip install 'tuner[cpu]'` adds Intel's CPU runtime for OpenCL")

_TYPE_NAMES = (
    (cl.device_type.GPU, "GPU"),
    (cl.device_type.CPU, "CPU"),
    (cl.device_type.ACCELERATOR, "ACCELERATOR"),
    (cl.device_type.CUSTOM, "CUSTOM"),
)


def _type_name(t: int) -> str:
    return next((name for bit, name in _TYPE_NAMES if t & bit), "OTHER")


def _get(dev: cl.Device, attr: str, default):
    # Some drivers raise for attributes they don't implement (e.g. image limits without images).
    try:
        return getattr(dev, attr)
    except (cl.Error, AttributeError):
        return default


def _half_images(dev: cl.Device) -> bool:
    try:
        ctx = cl.Context([dev])
        ok = all(
            any(f.channel_order == cl.channel_order.RGBA and f.channel_data_type == cl.channel_type.HALF_FLOAT
                for f in cl.get_supported_image_formats(ctx, flags, cl.mem_object_type.IMAGE2D))
            for flags in (cl.mem_flags.READ_ONLY, cl.mem_flags.WRITE_ONLY))
    except cl.Error:
        return False
    return ok


def _describe(index: int, dev: cl.Device) -> DeviceInfo:
    images = bool(_get(dev, "image_support", False))
    return DeviceInfo(
        index=index,
        platform=dev.platform.name.strip(),
        name=dev.name.strip(),
        type=_type_name(dev.type),
        driver_version=dev.driver_version.strip(),
        opencl_version=dev.version.strip(),
        image_support=images,
        image2d_max_width=int(_get(dev, "image2d_max_width", 0)) if images else 0,
        image2d_max_height=int(_get(dev, "image2d_max_height", 0)) if images else 0,
        max_work_group_size=int(dev.max_work_group_size),
        max_work_item_sizes=tuple(int(s) for s in dev.max_work_item_sizes),
        local_mem_bytes=int(dev.local_mem_size),
        global_mem_bytes=int(dev.global_mem_size),
        max_mem_alloc_bytes=int(dev.max_mem_alloc_size),
        compute_units=int(dev.max_compute_units),
        fp16="cl_khr_fp16" in dev.extensions.split(),
        half_images=images and _half_images(dev),
    )


@functools.cache
def _enumerate() -> tuple[tuple[DeviceInfo, cl.Device], ...]:
    # Cached: platform enumeration and the per-device probe context are slow, and the
    # set of devices does not change within a process.
    try:
        platforms = cl.get_platforms()
    except cl.Error as e:  # no ICD loader / no platforms at all
        raise TunerError(f"no OpenCL platform found ({e}); {NO_DEVICE_HINT}") from None
    devs = []
    for p in platforms:
        try:
            devs.extend(p.get_devices())
        except cl.Error:  # a platform with no devices raises DEVICE_NOT_FOUND
            continue
    return tuple((_describe(i, d), d) for i, d in enumerate(devs))


def list_devices() -> list[DeviceInfo]:
    """All OpenCL devices over all platforms; `DeviceInfo.index` is the position in this list."""
    return [info for info, _ in _enumerate()]


PROBE_VERSION = 1  # of the probe (tuner.runtime.base.probe_source): its answers are cached under it


def _probe_cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tuner" / "probe.json"


def _probe_key(info: DeviceInfo) -> str:
    # The build depends on the device and on the runtimes' own environment (e.g. POCL_EXTRA_BUILD_FLAGS).
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith(("POCL_", "CL_CONFIG_")))
    return f"{info.fingerprint}:{PROBE_VERSION}:{hashlib.sha1(repr(env).encode()).hexdigest()[:8]}"


def _read_probe_cache() -> dict:
    try:
        data = json.loads(_probe_cache_path().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_probe_cache(key: str, reason: str | None) -> None:
    path = _probe_cache_path()
    try:
        data = {**_read_probe_cache(), key: {"ok": reason is None, "reason": reason}}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home only costs a probe per process


def _run_probe(dev: cl.Device, images: bool) -> None:
    import numpy as np
    ctx = cl.Context([dev])
    queue = cl.CommandQueue(ctx)
    n = 8
    prog = cl.Program(ctx, probe_source(images))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pyopencl's CompilerWarning about non-empty build logs
            prog.build()
    except cl.Error as e:
        try:
            log = prog.get_build_info(dev, cl.program_build_info.LOG)
        except cl.Error:
            log = ""
        raise _BuildFailed(_first_line(log) if log.strip() else _first_line(str(e)).split(" - ")[0]) from None
    host = np.arange(4 * n, dtype=np.float32).reshape(1, n, 4)
    mf = cl.mem_flags
    if images:
        fmt = cl.ImageFormat(cl.channel_order.RGBA, cl.channel_type.FLOAT)
        src_mem = cl.Image(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, fmt, shape=(n, 1), hostbuf=host)
    else:
        src_mem = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=host)
    out = cl.Buffer(ctx, mf.WRITE_ONLY, 4 * n)
    prog.probe(queue, (n,), None, src_mem, out)
    got = np.empty(n, np.float32)
    cl.enqueue_copy(queue, got, out)
    queue.finish()
    want = host[0, :, 0] * 2 + np.arange(n)
    if not np.array_equal(got, want):
        raise RuntimeError(f"the probe kernel computed {got.tolist()}, expected {want.tolist()}")


class _BuildFailed(Exception):
    pass


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (errors or lines or ["unknown failure"])[0][:200]


def probe_device(info: DeviceInfo) -> str | None:
    """None when `info` builds and runs a small image kernel correctly, else why not (one line).

    The answer is cached per fingerprint (and the runtimes' environment) in ~/.cache/tuner/probe.json,
    so only a device's first use pays for the build.
    """
    return _probe(info)


@functools.cache
def _probe(info: DeviceInfo) -> str | None:
    key = _probe_key(info)
    cached = _read_probe_cache().get(key)
    if isinstance(cached, dict) and "ok" in cached:
        return None if cached["ok"] else str(cached.get("reason") or "the probe kernel failed")
    try:
        _run_probe(_enumerate()[info.index][1], info.image_support)
        reason = None
    except _BuildFailed as e:
        reason = f"cannot build OpenCL programs: {e}"
    except Exception as e:  # a runtime that misbehaves in any other way is not usable either
        reason = f"probe failed: {_first_line(str(e)) or type(e).__name__}"
    _write_probe_cache(key, reason)
    return reason


def default_device() -> DeviceInfo:
    """The device used when none is named: $TUNER_DEVICE (a choose_device spec) or pyopencl's $PYOPENCL_CTX
    when set, else the best device that passes :func:`probe_device` (``tuner.runtime.choice.pick_default``)."""
    infos = list_devices()
    if not infos:
        raise TunerError(f"no OpenCL devices found; {NO_DEVICE_HINT}")
    return choice.pick_default(infos, probe_device, hint=NO_DEVICE_HINT)


def choose_device(spec: int | str | None = None, check: bool = True) -> DeviceInfo:
    """Pick a device.

    spec None: :func:`default_device` ($TUNER_DEVICE, else the first GPU that can build programs, else
    PoCL's CPU device if it can, else another CPU device that can).
    spec int or digit string: index into list_devices().
    spec other string: first device whose platform/name/type/fingerprint contains it (case-insensitive),
    e.g. "nvidia", "pocl", "intel", "cpu".
    check: a named device that fails :func:`probe_device` raises TunerError with the reason.
    """
    if spec is None:
        return default_device()
    infos = list_devices()
    if not infos:
        raise TunerError(f"no OpenCL devices found; {NO_DEVICE_HINT}")
    return choice.pick(spec, infos, probe_device, check)


class Device:
    """An opened device: pyopencl context, a profiling-enabled in-order queue (``queue``: measuring, copies),
    an in-order queue without profiling (``run_queue``: running models), and its DeviceInfo."""

    def __init__(self, info: DeviceInfo):
        self.info = info
        self.cl_device: cl.Device = _enumerate()[info.index][1]
        self.context = cl.Context([self.cl_device])
        self.queue = cl.CommandQueue(self.context, properties=cl.command_queue_properties.PROFILING_ENABLE)
        self._run_queue = None

    @property
    def run_queue(self) -> cl.CommandQueue:
        """The queue a model runs on: no profiling timestamps. On NVIDIA's OpenCL (H200, driver 580) a kernel
        launched behind another costs 10.6 us on a profiling queue and 5.2 us on this one (empty kernel,
        1000 back to back), which took MobileNetV2 from 0.686 ms to 0.398 ms a run. Copies stay blocking on
        ``queue``, so a run never sees a half-copied input."""
        if self._run_queue is None:
            self._run_queue = cl.CommandQueue(self.context)
        return self._run_queue

    @property
    def fingerprint(self) -> str:
        return self.info.fingerprint

    def finish(self) -> None:
        self.queue.finish()
        if self._run_queue is not None:
            self._run_queue.finish()

    def __repr__(self) -> str:
        return f"Device([{self.info.index}] {self.info.platform} / {self.info.name}, {self.info.fingerprint})"


def open_device(spec: int | str | DeviceInfo | None = None) -> Device:
    """choose_device(spec) and open it; a DeviceInfo is opened as is."""
    return Device(spec if isinstance(spec, DeviceInfo) else choose_device(spec))
