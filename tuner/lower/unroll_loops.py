"""Expand ``unrolled`` loops of at most ``MAX_UNROLL`` iterations into straight-line code. Done in the IR,
not left to the OpenCL compiler, so that later passes see constant indices: a channel lane ``ci`` becomes
0..3 and a texture read of one lane becomes ``.x``..``.w``. Longer unrolled loops keep ``#pragma unroll``."""
from __future__ import annotations

from ..ir.expr import const
from ..ir.functor import Mutator, substitute
from ..ir.kernel import Kernel
from ..ir.stmt import For, seq

MAX_UNROLL = 16


class _Unroll(Mutator):
    def visit_For(self, s: For):
        body = self.visit(s.body)
        if s.kind == "unrolled" and s.extent <= MAX_UNROLL:
            return seq(*(substitute(body, {s.var: const(i)}) for i in range(s.extent)))
        return s if body is s.body else For(s.var, s.extent, s.kind, body, s.thread)


def unroll_loops(kernel: Kernel) -> Kernel:
    return kernel.replace(body=_Unroll().visit(kernel.body))
