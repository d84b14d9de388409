"""The device seam: what an executor asks of a device to run a compiled model (docs/artifact.md).

A ``Runtime`` builds OpenCL C sources, allocates buffers and RGBA images, copies to and from them, prepares
kernel launches with their arguments set once, and runs them in order. ``tuner.runtime.module.Module`` runs an
artifact on any Runtime. ``tuner.runtime.opencl.OpenCLRuntime`` is the local pyopencl one; a runtime that
reaches a device another way (a device agent over a link, a native library) implements the same methods,
and nothing under ``tuner/`` changes for it.

Handles (programs, memory, launches) are opaque to the executor: it only passes back what a method returned.
A device's failure raises a ``TunerError``: ``CompileError`` for a build, else a ``DeviceError`` that carries the
launch handle it concerns where the runtime can tell, so the executor can name the node and its kernel file.
This module imports no OpenCL."""
from __future__ import annotations

import abc

import numpy as np

from tuner.target import DeviceInfo


class Runtime(abc.ABC):
    """One opened device. ``info``: its profile (the fields ``tuner devices --json`` prints)."""

    info: DeviceInfo
    runs_here = False  # the device is this machine's own: a native program here (tuner-run) can open it

    @property
    def fingerprint(self) -> str:
        return self.info.fingerprint

    @abc.abstractmethod
    def build(self, source: str, cache_dir=None, stats: dict | None = None):
        """A program handle for ``source``; raises ``CompileError`` with the build log. ``cache_dir``: where
        program binaries may be kept and reused; ``stats`` counts builds from ``source``, a cached ``binary``
        or this process's ``memory``."""

    def build_together(self, sources) -> int:
        """Build several of ``sources`` at once where that is cheaper than one by one; ``build`` then hands each
        out. Returns how many were built so: none by default."""
        return 0

    @abc.abstractmethod
    def alloc(self, scope: str, physical_shape: tuple, dtype):
        """A memory handle: a buffer of ``prod(physical_shape)`` elements (scope ``global``) or an RGBA image
        of ``(height, width, 4)`` (scope ``texture*``) of ``dtype`` (float32 or float16; a pool: uint8)."""

    @abc.abstractmethod
    def view(self, pool, scope: str, physical_shape: tuple, dtype):
        """A memory handle for a tensor that lives at the start of ``pool`` (an ``alloc`` of the same kind)."""

    @abc.abstractmethod
    def upload(self, mem, host: np.ndarray, staged: bool = False) -> None:
        """Copy ``host`` (the handle's physical shape, cast to its dtype) to the device, ordered before any
        launch submitted after it. ``staged``: the handle is copied again and again (a model's input or output),
        so a runtime may keep a staging copy in pinned host memory for it."""

    @abc.abstractmethod
    def download(self, mem, staged: bool = False) -> np.ndarray:
        """The handle's contents, physical shape and dtype, after every launch submitted before. ``staged``: as
        for ``upload``."""

    @abc.abstractmethod
    def prepare(self, program, kernel: str, args: list, global_size: tuple, local_size: tuple):
        """A launch handle: ``kernel`` of ``program`` with ``args`` (memory handles) set once."""

    @abc.abstractmethod
    def submit(self, launches: list) -> None:
        """Enqueue ``launches`` in order; return without waiting."""

    @abc.abstractmethod
    def finish(self) -> None:
        """Wait for everything submitted."""

    @abc.abstractmethod
    def profile(self, launches: list) -> list:
        """Run ``launches`` once in order and return each one's device time in seconds."""

    def time(self, launches: list, warmup: int = 1, repeats: int = 5, min_seconds: float = 0.0) -> list:
        """Seconds per run of ``launches`` (the sum of their device times): ``warmup`` untimed runs, then at
        least ``repeats`` timed runs and more until ``min_seconds`` of kernel time is spent (at most 10,000).
        A runtime across a link overrides it to loop on the device, not over the link."""
        for _ in range(warmup):
            self.profile(launches)
        costs: list = []
        while len(costs) < repeats or (sum(costs) < min_seconds and len(costs) < 10_000):
            costs.append(sum(self.profile(launches)))
        return costs

    def keep_programs(self, sources, binaries_dir) -> int:
        """Keep the built programs of ``sources`` in the user's binary cache ``binaries_dir``
        (``tuner.artifact.cache``), so the first run of an artifact builds nothing; how many were kept. Never
        raises for a cache that cannot be written. By default none: a device elsewhere (an agent's) keeps its own."""
        return 0

    def close(self) -> None:
        """Release the device (a no-op where nothing is held)."""


# The probe: a kernel every tuned template needs to build and run (an image read and a buffer write). A device
# is a default only if it builds it: the local one (``tuner.runtime.opencl.device``, which also runs it) and an
# agent's (``tuner.agent.runtime``, which builds it on the agent's device).
PROBE_SOURCE = """
__constant sampler_t smp = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_CLAMP | CLK_FILTER_NEAREST;
__kernel void probe(__read_only image2d_t img, __global float *out) {
    int i = get_global_id(0);
    out[i] = read_imagef(img, smp, (int2)(i, 0)).x * 2.0f + (float)i;
}
"""


def probe_source(images: bool) -> str:
    """The probe's source; on a device without images it reads a buffer instead."""
    if images:
        return PROBE_SOURCE
    return PROBE_SOURCE.replace("__read_only image2d_t img", "__global const float4 *img").replace(
        "read_imagef(img, smp, (int2)(i, 0))", "img[i]")
