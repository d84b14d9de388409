"""``OpenCLRuntime``: the Runtime of a local OpenCL device, through pyopencl (``Device``, ``memory``,
``program``). Copies and runs share the run queue, an in-order queue without profiling timestamps (see
``Device.run_queue``): an upload is enqueued without waiting, the kernels after it see its data, and a
download waits only for what came before it on that queue; no round trip between queues. Uploads and
downloads go through staging arrays in pinned host memory (a ``CL_MEM_ALLOC_HOST_PTR`` buffer mapped once),
one per model input and output, so that the driver copies at the bus's speed, as the native runtime does;
``TUNER_RUN_PINNED=0`` turns that off in both. ``profile`` enqueues on the profiling queue to read events,
after the run queue is drained.

Every pyopencl error becomes a ``DeviceError`` (``tuner.errors``) that says what was asked of which device. A
launch refused at enqueue carries its handle; one that fails while the device runs it surfaces at the next wait
(``finish``, a download), and the launch is then found from the events of the launches submitted since the last
wait: the first whose status is an error."""
from __future__ import annotations

import os

import numpy as np
import pyopencl as cl

from tuner.errors import DeviceError, TunerError
from tuner.runtime.base import Runtime
from tuner.runtime.opencl.device import Device, open_device
from tuner.runtime.opencl.memory import DeviceArray, _region, alloc
from tuner.runtime.opencl.program import (SharedProgram, build_program, build_together, keep_programs,
                                          shared_program)

RUNNING_KEPT = 100_000  # events kept to find a failed launch by, at most (submits never waited for)


class OpenCLRuntime(Runtime):
    """``device``: a Device, or what ``open_device`` takes."""

    runs_here = True

    def __init__(self, device=None):
        self.device = device if isinstance(device, Device) else open_device(device)
        self.info = self.device.info
        self._stages: dict = {}  # (mem, shape, dtype) -> [pinned buffer, its mapped array, last copy's event] | None
        self._running: list = []  # (launch, event) of every launch submitted since the last wait

    def _error(self, what: str, e: Exception, launch=None) -> DeviceError:
        return DeviceError(f"{what} on {self.info.name}: {e}", launch)

    def _failed_launch(self):
        """The first launch submitted since the last wait whose event reports an error, else None."""
        for launch, event in self._running:
            try:
                if event.command_execution_status < 0:
                    return launch
            except cl.Error:  # a driver that no longer answers for its events: no telling which
                return None
        return None

    def _wait_failed(self, what: str, e: Exception) -> DeviceError:
        launch = self._failed_launch()
        self._running.clear()
        return self._error(f"{what} (a launch failed while the device ran it)" if launch is not None else what, e,
                           launch)

    def build(self, source, cache_dir=None, stats=None):
        if cache_dir is None:  # a binary cache keeps each program alone: never a shared one
            shared = shared_program(self.device, source)
            if shared is not None:
                if stats is not None:
                    kind = "memory" if shared.handed_out else "source"
                    stats[kind] = stats.get(kind, 0) + 1
                shared.handed_out = True
                return shared
        try:
            return build_program(self.device, source, cache_dir=cache_dir, stats=stats)
        except cl.Error as e:  # the build itself fails as CompileError, with its log
            raise self._error("creating the program", e) from None

    def build_together(self, sources) -> int:
        return build_together(self.device, sources)

    def keep_programs(self, sources, binaries_dir):
        return keep_programs(self.device, sources, binaries_dir)

    def alloc(self, scope, physical_shape, dtype):
        try:
            return alloc(self.device, scope, physical_shape, np.dtype(dtype))
        except cl.Error as e:
            raise self._error(f"allocating {scope} memory of {list(physical_shape)} {np.dtype(dtype)}", e) from None

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
        try:
            stage = self._stage(mem) if staged else None
            if stage is None:
                data = np.ascontiguousarray(host, dtype=mem.dtype)  # pyopencl's event keeps it alive until copied
                cl.enqueue_copy(self.device.run_queue, mem.mem, data, is_blocking=False, **region)
                return
            np.copyto(stage[1], host, casting="unsafe")
            stage[2] = cl.enqueue_copy(self.device.run_queue, mem.mem, stage[1], is_blocking=False, **region)
        except cl.Error as e:  # a copy behind a failed launch reports that launch's failure
            raise self._wait_failed(f"copying {mem!r} to the device", e) from None

    def download(self, mem, staged: bool = False):
        region = _region(mem) if mem.is_texture else {}
        try:
            stage = self._stage(mem) if staged else None
            if stage is None:
                out = np.empty(mem.physical_shape, dtype=mem.dtype)
                cl.enqueue_copy(self.device.run_queue, out, mem.mem, is_blocking=True, **region)
            else:
                cl.enqueue_copy(self.device.run_queue, stage[1], mem.mem, is_blocking=True, **region)
                out = stage[1].copy()
        except cl.Error as e:
            raise self._wait_failed(f"copying {mem!r} from the device", e) from None
        self._running.clear()  # a blocking copy on the run queue: everything before it has finished
        return out

    def prepare(self, program, kernel, args, global_size, local_size):
        if isinstance(program, SharedProgram):  # built with others: the kernel has another name there
            program, kernel = program.program, program.kernel_name(kernel)
        try:
            k = cl.Kernel(program, kernel)  # one object per launch: its own arguments
            k.set_args(*[a.mem for a in args])
        except cl.Error as e:
            raise self._error(f"setting up kernel {kernel!r}", e) from None
        return k, tuple(global_size), tuple(local_size)

    def enqueue(self, launches, profiling: bool = False) -> list:
        """Enqueue on the run queue (or the profiling queue); the events. A launch the driver refuses raises a
        DeviceError that carries it; the launches before it stay enqueued."""
        q = self.device.queue if profiling else self.device.run_queue
        events = []
        for launch in launches:
            k, g, l = launch
            try:
                events.append(cl.enqueue_nd_range_kernel(q, k, g, l))
            except cl.Error as e:
                raise self._error("the launch was refused", e, launch) from None
            self._running.append((launch, events[-1]))
        if len(self._running) > RUNNING_KEPT:  # never waited for: the oldest are long done
            del self._running[:-RUNNING_KEPT]
        return events

    def submit(self, launches):
        self.enqueue(launches)

    def finish(self):
        try:
            self.device.finish()
        except cl.Error as e:
            raise self._wait_failed("waiting for the device", e) from None
        self._running.clear()

    def profile(self, launches):
        self.finish()
        events = self.enqueue(launches, profiling=True)
        self.finish()
        try:
            return [(e.profile.end - e.profile.start) * 1e-9 for e in events]
        except cl.Error as e:
            raise self._error("reading the launches' profiling events", e) from None
