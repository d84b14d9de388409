"""Simplify index arithmetic using loop bounds (see ``tuner.ir.arith``)."""
from __future__ import annotations

from ..ir.arith import simplify as simplify_node
from ..ir.kernel import Kernel


def simplify(kernel: Kernel) -> Kernel:
    return kernel.replace(body=simplify_node(kernel.body))
