"""From a kernel (or program) to what a runtime builds, with no device: lowered through ``tuner.lower``'s
passes, then emitted as OpenCL C (``codegen.opencl``)."""
from __future__ import annotations

import contextlib
import gc

from tuner.codegen.opencl import program_source
from tuner.ir.functor import visit
from tuner.ir.kernel import Kernel, Program
from tuner.ir.stmt import BufferStore, Evaluate
from tuner.lower import lower


def generate(k: "Kernel | Program", trace: list | None = None) -> tuple:
    """Lower and generate OpenCL: ``(lowered Program, source)``. Needs no device (compiling for a target
    that is not attached builds nothing; the source is built on the target when it loads)."""
    with _cycle_collector_paused():
        prog = lower(k, trace=trace)
        return prog, program_source(prog)


@contextlib.contextmanager
def _cycle_collector_paused():
    """Python's cycle collector off while a kernel is lowered and emitted: the passes allocate IR nodes by the
    hundred thousand, immutable and free of cycles (reference counting frees them), and each of the collector's
    runs walked the heap for them. Compiling every test model for two device profiles (3,342 sources, the same
    bytes): 47-48.6 s before, 43-44.5 s with the collector paused here."""
    if not gc.isenabled():  # paused already (a nested call) or by the caller: theirs to turn back on
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def written_buffers(kernels) -> set:
    names = set()

    def take(n):
        if isinstance(n, BufferStore):
            names.add(n.buffer.name)
        elif isinstance(n, Evaluate) and getattr(n.value, "name", "") == "texture2d_store":
            names.add(n.value.args[0].name)
    for k in kernels:
        visit(k.body, take)
    return names
