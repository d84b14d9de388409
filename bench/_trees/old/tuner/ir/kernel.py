"""``Kernel`` (one OpenCL kernel: buffer params, a body, a launch shape from its thread loops) and
``Program`` (kernels run in order over user buffers and scratch workspaces, e.g. texture RFC A0)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .functor import visit
from .stmt import For, Stmt


@dataclass(frozen=True, eq=False)
class Kernel:
    name: str
    params: tuple  # Buffers, in argument order
    body: Stmt
    access: dict = field(default_factory=dict)  # image name -> "read_only" | "write_only"

    def replace(self, **changes) -> "Kernel":
        return dataclasses.replace(self, **changes)

    def launch(self) -> tuple[tuple, tuple]:
        """(global size, local size) from the loops bound to ``group.d`` and ``local.d``."""
        groups, local = [1, 1, 1], [1, 1, 1]

        def take(n):
            if isinstance(n, For) and n.kind == "thread":
                kind, d = n.thread.split(".")
                target = groups if kind == "group" else local
                if target[int(d)] not in (1, n.extent):
                    raise ValueError(f"kernel {self.name}: {n.thread} bound twice with extents "
                                     f"{target[int(d)]} and {n.extent}")
                target[int(d)] = n.extent
        visit(self.body, take)
        return tuple(g * l for g, l in zip(groups, local)), tuple(local)

    def __str__(self) -> str:
        from .printer import kernel_str
        return kernel_str(self)


@dataclass(frozen=True, eq=False)
class Program:
    name: str
    kernels: tuple
    params: tuple  # user-visible buffers (inputs and outputs)
    workspaces: tuple = ()  # scratch buffers allocated from the runtime's pools

    def replace(self, **changes) -> "Program":
        return dataclasses.replace(self, **changes)

    def __str__(self) -> str:
        return "\n\n".join(str(k) for k in self.kernels)


def as_program(k: "Kernel | Program") -> Program:
    return k if isinstance(k, Program) else Program(k.name, (k,), k.params)
