"""Vectorize loops of kind ``vectorized``: the loop variable becomes ``ramp(0, 1, n)`` (RFC 0012) and each
expression inside takes ``n`` lanes; scalars broadcast. The loop must be innermost."""
from __future__ import annotations

from ..errors import LoweringError
from ..ir.expr import Ramp, const
from ..ir.functor import Mutator, substitute, visit
from ..ir.kernel import Kernel
from ..ir.stmt import For


class _Vectorize(Mutator):
    def visit_For(self, s: For):
        body = self.visit(s.body)
        if s.kind != "vectorized":
            return s if body is s.body else For(s.var, s.extent, s.kind, body, s.thread)

        def no_loops(n):
            if isinstance(n, For):
                raise LoweringError(f"vectorized loop {s.var.name} must be innermost; it contains loop {n.var.name}")
        visit(s.body, no_loops)  # the body as written: an inner vectorized loop is already gone from ``body``
        return substitute(body, {s.var: Ramp(const(0), const(1), s.extent)})


def vectorize_loops(kernel: Kernel) -> Kernel:
    return kernel.replace(body=_Vectorize().visit(kernel.body))
