"""Run a lowered ``Program`` on a device: allocate each buffer by scope at its physical shape, pack host
(logical, e.g. NCHW) arrays into it through the buffer's layout, launch the kernels in order on one queue,
and unpack the outputs. Scratch workspaces (texture RFC A0/T2) come from recycling pools.

Generating the source and packing host arrays need no device (``tuner.codegen``: compiling for a target profile
uses them where no OpenCL is installed). pyopencl and the runtime modules that import it load where a device is
used, inside the functions below, not with this module (tests/test_imports.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from tuner.codegen.generate import generate, written_buffers
from tuner.codegen.packing import pack, physical_shape, unpack
from tuner.errors import TunerError
from tuner.ir.kernel import Kernel, Program

if TYPE_CHECKING:
    from .device import Device
    from .memory import DeviceArray


@dataclass
class Executable:
    """A lowered program compiled for one device. ``exe(X=x)`` returns the outputs as logical arrays."""
    program: Program
    device: Device
    source: str
    cl_program: object
    pools: dict = field(default_factory=dict)
    cl_kernels: dict = field(default_factory=dict)
    launch_shapes: dict = field(default_factory=dict)
    output_names: tuple | None = None  # the params the kernels write, when known without walking their bodies

    @property
    def outputs(self) -> list:
        written = set(self.output_names) if self.output_names is not None else written_buffers(self.program.kernels)
        return [b for b in self.program.params if b.name in written]

    def prepared(self) -> "Prepared":
        """What another process needs to run this executable without lowering or compiling again."""
        try:
            binary = self.cl_program.binaries[0]
        except Exception:  # noqa: BLE001 - a driver that hands out no binary: the other side compiles the source
            binary = b""
        shapes = {k.name: self.launch_shapes.get(k.name) or k.launch() for k in self.program.kernels}
        bare = self.program.replace(kernels=tuple(k.replace(body=None) for k in self.program.kernels))
        return Prepared(bare, self.source, bytes(binary or b""), shapes, tuple(b.name for b in self.outputs))

    def allocate(self, buf) -> DeviceArray:
        from .memory import alloc
        return alloc(self.device, buf.scope, physical_shape(buf), buf.dtype.numpy)

    def _pool(self, buf):
        from .memory import BufferPool, TexturePool
        if buf.scope not in self.pools:
            self.pools[buf.scope] = TexturePool(self.device, buf.scope) if buf.is_texture else BufferPool(self.device)
        return self.pools[buf.scope]

    def _calls(self, arrays: dict, scratch: dict) -> list:
        """``[(cl.Kernel, global, local, args)]`` of every kernel over ``arrays`` and the ``scratch`` workspaces."""
        import pyopencl as cl
        calls = []
        for k in self.program.kernels:
            args = [(arrays.get(b.name) or scratch.get(b.name)) for b in k.params]
            missing = [b.name for b, a in zip(k.params, args) if a is None]
            if missing:
                raise TunerError(f"kernel {k.name}: no array given for {', '.join(missing)}")
            if k.name not in self.launch_shapes:  # walking the body is slow for big unrolled kernels
                self.launch_shapes[k.name] = k.launch()
            if k.name not in self.cl_kernels:
                self.cl_kernels[k.name] = cl.Kernel(self.cl_program, k.name)
            calls.append((self.cl_kernels[k.name], *self.launch_shapes[k.name], [a.mem for a in args]))
        return calls

    def _with_scratch(self, arrays: dict, body):
        """``body(calls)`` with the workspaces requested, then the queue finished and the workspaces released."""
        scratch = {w.name: self._pool(w).request(physical_shape(w), w.dtype.numpy) for w in self.program.workspaces}
        from .memory import upload
        for w in self.program.workspaces:  # counters start at zero (a launch returns them to zero)
            if w.dtype.base == "int32":
                upload(self.device, scratch[w.name], np.zeros(scratch[w.name].physical_shape, np.int32))
        try:
            return body(self._calls(arrays, scratch))
        finally:
            self.device.finish()
            for w in self.program.workspaces:
                self._pool(w).release(scratch[w.name])

    def launch(self, arrays: dict) -> list:
        """Enqueue every kernel; ``arrays`` maps param name -> DeviceArray. Returns the profiling events."""
        q = self.device.queue
        return self._with_scratch(arrays, lambda calls: [fn(q, g, l, *args) for fn, g, l, args in calls])

    def upload_inputs(self, **inputs: np.ndarray) -> dict:
        """Allocate every param at its physical shape and upload the given logical inputs into it."""
        from .memory import upload
        params = {b.name: b for b in self.program.params}
        unknown = set(inputs) - set(params)
        if unknown:
            raise TunerError(f"unknown inputs {sorted(unknown)}; the program takes {sorted(params)}")
        arrays = {}
        for name, b in params.items():
            arrays[name] = self.allocate(b)
            if name in inputs:
                upload(self.device, arrays[name], pack(b, np.asarray(inputs[name])))
        return arrays

    def time(self, arrays: dict, warmup: int = 1, repeats: int = 5, min_seconds: float = 0.0) -> list:
        """Seconds per run of the whole program (all kernels, from OpenCL profiling events): ``warmup`` untimed
        runs, then at least ``repeats`` timed runs and more until ``min_seconds`` of kernel time is spent."""
        for _ in range(warmup):
            self.launch(arrays)
        costs: list = []
        while len(costs) < repeats or (sum(costs) < min_seconds and len(costs) < 10_000):
            events = self.launch(arrays)
            costs.append(sum((e.profile.end - e.profile.start) * 1e-9 for e in events))
        return costs

    def time_stream(self, arrays: dict, runs: int = 100, repeats: int = 5, warmup: int = 1) -> list:
        """Seconds per run when ``runs`` runs go back to back on the device's run queue (no profiling, as a model
        runs; arguments set once): the wall clock from releasing the batch to its end over ``runs``, one value
        per each of ``repeats`` batches. Every batch waits behind a user event until all of it is enqueued, so
        the host's enqueue rate is not timed; the gaps between launches are. Unlike ``time`` (one launch, its
        profiling events), this is what a kernel costs inside a longer sequence of kernels."""
        from .stream import gated_batch
        q = self.device.run_queue

        def batches(calls):
            for fn, _, _, args in calls:
                fn.set_args(*args)
            launches = [(fn, g, l) for fn, g, l, _ in calls]
            walls = [gated_batch(self.device.context, q, launches, runs)[0] for _ in range(warmup + repeats)]
            return walls[warmup:]
        return self._with_scratch(arrays, batches)

    def outputs_of(self, arrays: dict) -> dict:
        """Download and unpack the outputs from device ``arrays``."""
        from .memory import download
        return {b.name: unpack(b, download(self.device, arrays[b.name])) for b in self.outputs}

    def __call__(self, **inputs: np.ndarray) -> dict:
        arrays = self.upload_inputs(**inputs)
        self.launch(arrays)
        return self.outputs_of(arrays)


@dataclass(frozen=True)
class Prepared:
    """A built executable as it crosses between processes (a measuring worker's builder and its runner): the
    program without its kernels' bodies (their launch shapes and written outputs come along instead), the
    source, and the driver's binary of it. ``load`` on the same device makes an Executable from the binary,
    or from the source where the driver rejects the binary."""
    program: Program
    source: str
    binary: bytes
    launch_shapes: dict
    output_names: tuple

    def load(self, device) -> Executable:
        from .program import build_program, load_binary
        cl_program = load_binary(device, self.source, self.binary) if self.binary else None
        if cl_program is None:
            cl_program = build_program(device, self.source)
        return Executable(self.program, device, self.source, cl_program, launch_shapes=dict(self.launch_shapes),
                          output_names=self.output_names)


def build(k: "Kernel | Program", device=None, trace: list | None = None) -> Executable:
    """Lower, generate OpenCL and compile (cached) for ``device`` (a Device, spec string/index, or None)."""
    from .device import Device, open_device
    from .program import build_program
    dev = device if isinstance(device, Device) else open_device(device)
    prog, source = generate(k, trace)
    return Executable(prog, dev, source, build_program(dev, source))
