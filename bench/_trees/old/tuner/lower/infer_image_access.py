"""Infer ``__read_only`` / ``__write_only`` for each image parameter (texture RFC T1): the downstream
compiler routes read-only images through the texture cache. OpenCL 1.2 has no read-write images."""
from __future__ import annotations

from ..errors import LoweringError
from ..ir.expr import Call
from ..ir.functor import visit
from ..ir.kernel import Kernel


def infer_image_access(kernel: Kernel) -> Kernel:
    reads, writes = set(), set()

    def take(n):
        if isinstance(n, Call) and n.name in ("texture2d_load", "texture2d_store"):
            (reads if n.name == "texture2d_load" else writes).add(n.args[0].name)
    visit(kernel.body, take)
    access = {}
    for b in kernel.params:
        if not b.is_texture:
            continue
        if b.name in reads and b.name in writes:
            raise LoweringError(f"kernel {kernel.name}: image {b.name!r} is both read and written; an image is "
                                f"read-only or write-only within one kernel: split the kernel or use a buffer")
        access[b.name] = "write_only" if b.name in writes else "read_only"
    return kernel.replace(access=access)
