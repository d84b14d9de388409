"""Expand ``unrolled`` loops of at most ``MAX_UNROLL`` iterations into straight-line code. Done in the IR,
not left to the OpenCL compiler, so that later passes see constant indices: a channel lane ``ci`` becomes
0..3 and a texture read of one lane becomes ``.x``..``.w``. Longer unrolled loops keep ``#pragma unroll``."""
from __future__ import annotations

import dataclasses

from ..ir.expr import Var, const
from ..ir.functor import Mutator, substitute
from ..ir.kernel import Kernel
from ..ir.stmt import Allocate, For, Let, seq

MAX_UNROLL = 16


class _Rename(Mutator):
    """Fresh names for the lets and allocations of one unrolled copy: the copies share one C scope, where
    ``const int t`` or ``float acc[4]`` may be declared only once."""

    def __init__(self, suffix: str):
        self.suffix, self.vars, self.bufs = suffix, {}, {}

    def visit_Let(self, s: Let):
        var = self.vars.setdefault(s.var, Var(s.var.name + self.suffix, s.var.dtype))
        return Let(var, self.visit(s.value), self.visit(s.body))

    def visit_Var(self, v: Var):
        return self.vars.get(v, v)

    def visit_Allocate(self, s: Allocate):
        buf = self.bufs.setdefault(s.buffer, dataclasses.replace(s.buffer, name=s.buffer.name + self.suffix))
        return Allocate(buf, self.visit(s.body))

    def visit_buffer(self, buf):
        return self.bufs.get(buf, buf)


class _Unroll(Mutator):
    def visit_For(self, s: For):
        body = self.visit(s.body)
        if s.kind == "unrolled" and s.extent <= MAX_UNROLL:
            return seq(*(_Rename(f"_{s.var.name}{i}").visit(substitute(body, {s.var: const(i)}))
                         for i in range(s.extent)))
        return s if body is s.body else For(s.var, s.extent, s.kind, body, s.thread)


def unroll_loops(kernel: Kernel) -> Kernel:
    return kernel.replace(body=_Unroll().visit(kernel.body))
