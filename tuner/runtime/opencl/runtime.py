"""``OpenCLRuntime``: the Runtime of a local OpenCL device, through pyopencl (``Device``, ``memory``,
``program``). Copies and runs share the run queue, an in-order queue without profiling timestamps (see
``Device.run_queue``): an upload is enqueued without waiting, the kernels after it see its data, and a
download waits only for what came before it on that queue; no round trip between queues. Uploads and
downloads go through staging arrays in pinned host memory (a ``CL_MEM_ALLOC_HOST_PTR`` buffer mapped once),
one per model input and output, so that the driver copies at the bus's speed, as the native runtime does;
``TUNER_RUN_PINNED=0`` turns that off in both. ``profile`` enqueues on the profiling queue to read events,
after the run queue is drained."""
from __future__ import annotations

import os

import numpy as np
import pyopencl as cl

from tuner.runtime.base import Runtime
from tuner.runtime.opencl.device import Device, open_device
from tuner.errors import TunerError
from tuner.runtime.opencl.memory import DeviceArray, _region, alloc
from tuner.runtime.opencl.program import build_program


class OpenCLRuntime(Runtime):
    """``device``: a Device, or what ``open_device`` takes."""

    runs_here = True

    def __init__(self, device=None):
        self.device = device if isinstance(device, Device) else open_device(device)
        self.info = self.device.info
        self._stages: dict = {}  # (mem, shape, dtype) -> [pinned buffer, its mapped array, last copy's event] | None

    def build(self, source, cache_dir=None, stats=None):
        return build_program(self.device, source, cache_dir=cache_dir, stats=stats)

    def alloc(self, scope, physical_shape, dtype):
        return alloc(self.device, scope, physical_shape, np.dtype(dtype))

    def view(self, pool, scope, physical_shape, dtype):
        return DeviceArray(scope, tuple(physical_shape), np.dtype(dtype), pool.mem,
                           pool.alloc_shape if pool.is_texture else tuple(physical_shape))

    def _stage(self, mem):
        """The pinned staging array of ``mem`` (made on first use), after its last copy has finished; None where
        pinning is off or the driver offers no such memory."""
        stages = self._stages
        key = mem.mem.int_ptr, mem.physical_shape, mem.dtype.str
        if key not in stages:
            stages[key] = None
            if os.environ.get("TUNER_RUN_PINNED", "1") != "0":
                try:
                    buf = cl.Buffer(self.device.context, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR,
                                    max(mem.nbytes, 1))
                    host, _ = cl.enqueue_map_buffer(self.device.run_queue, buf, cl.map_flags.READ | cl.map_flags.WRITE,
                                                    0, mem.physical_shape, mem.dtype, is_blocking=True)
                    stages[key] = [buf, host, None]
                except cl.Error:
                    pass
        stage = stages[key]
        if stage is not None and stage[2] is not None:
            stage[2].wait()
            stage[2] = None
        return stage

    def pinned_stages(self) -> int:
        """How many inputs and outputs are staged in pinned host memory so far."""
        return sum(s is not None for s in self._stages.values())

    def upload(self, mem, host, staged: bool = False):
        host = np.asarray(host)
        if tuple(host.shape) != mem.physical_shape:
            raise TunerError(f"upload of shape {tuple(host.shape)} into {mem!r}: shapes differ")
        region = _region(mem) if mem.is_texture else {}
        stage = self._stage(mem) if staged else None
        if stage is None:
            data = np.ascontiguousarray(host, dtype=mem.dtype)  # pyopencl's event keeps it alive until copied
            cl.enqueue_copy(self.device.run_queue, mem.mem, data, is_blocking=False, **region)
            return
        np.copyto(stage[1], host, casting="unsafe")
        stage[2] = cl.enqueue_copy(self.device.run_queue, mem.mem, stage[1], is_blocking=False, **region)

    def download(self, mem, staged: bool = False):
        region = _region(mem) if mem.is_texture else {}
        stage = self._stage(mem) if staged else None
        if stage is None:
            out = np.empty(mem.physical_shape, dtype=mem.dtype)
            cl.enqueue_copy(self.device.run_queue, out, mem.mem, is_blocking=True, **region)
            return out
        cl.enqueue_copy(self.device.run_queue, stage[1], mem.mem, is_blocking=True, **region)
        return stage[1].copy()

    def prepare(self, program, kernel, args, global_size, local_size):
        k = cl.Kernel(program, kernel)  # one object per launch: its own arguments
        k.set_args(*[a.mem for a in args])
        return k, tuple(global_size), tuple(local_size)

    def enqueue(self, launches, profiling: bool = False) -> list:
        """Enqueue on the run queue (or the profiling queue); the events."""
        q = self.device.queue if profiling else self.device.run_queue
        return [cl.enqueue_nd_range_kernel(q, k, g, l) for k, g, l in launches]

    def submit(self, launches):
        self.enqueue(launches)

    def finish(self):
        self.device.finish()

    def profile(self, launches):
        self.device.run_queue.finish()
        events = self.enqueue(launches, profiling=True)
        self.device.queue.finish()
        return [(e.profile.end - e.profile.start) * 1e-9 for e in events]
