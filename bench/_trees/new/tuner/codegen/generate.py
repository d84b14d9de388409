"""From a kernel (or program) to what a runtime builds, with no device: lowered through ``tuner.lower``'s
passes, then emitted as OpenCL C (``codegen.opencl``)."""
from __future__ import annotations

from tuner.codegen.opencl import program_source
from tuner.ir.functor import visit
from tuner.ir.kernel import Kernel, Program
from tuner.ir.stmt import BufferStore, Evaluate
from tuner.lower import lower


def generate(k: "Kernel | Program", trace: list | None = None) -> tuple:
    """Lower and generate OpenCL: ``(lowered Program, source)``. Needs no device (compiling for a target
    that is not attached builds nothing; the source is built on the target when it loads)."""
    prog = lower(k, trace=trace)
    return prog, program_source(prog)


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
