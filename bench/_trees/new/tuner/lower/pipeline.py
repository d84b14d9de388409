"""The lowering pipeline, in order. ``lower(k, trace=list)`` records each pass's output (``--show-passes``)."""
from __future__ import annotations

from typing import Callable, Optional

from ..ir.kernel import Kernel, Program, as_program
from .apply_layout_transforms import apply_layout_transforms
from .flatten_buffers import flatten_buffers
from .infer_image_access import infer_image_access
from .lower_texture_access import lower_texture_access
from .simplify import simplify
from .unroll_loops import unroll_loops
from .vectorize_buffer_access import vectorize_buffer_access
from .vectorize_loops import vectorize_loops

PASSES: list[Callable[[Kernel], Kernel]] = [
    apply_layout_transforms,  # logical -> transformed indices (RFC 0039), C0/C1 defaults for textures
    vectorize_loops,          # vectorized loop var -> ramp(0, 1, n)
    unroll_loops,             # short unrolled loops -> straight-line code with constant indices
    simplify,                 # (4*cb + ramp) // 4 -> cb, % 4 -> ramp, using loop bounds
    flatten_buffers,          # axis groups -> physical dims: 1-D buffers, [H, W, 4] textures
    simplify,
    lower_texture_access,     # texture2d_load / texture2d_store, single-lane reads
    vectorize_buffer_access,  # stride-1 ramps -> vector element access (RFC 0012)
    infer_image_access,       # __read_only / __write_only
]


def lower(k: "Kernel | Program", trace: Optional[list] = None) -> Program:
    """Run every pass on every kernel; returns a Program whose buffers have physical shapes."""
    prog = as_program(k)
    kernels = []
    for kernel in prog.kernels:
        if trace is not None:
            trace.append(("input", kernel))
        for p in PASSES:
            kernel = p(kernel)
            if trace is not None:
                trace.append((p.__name__, kernel))
        kernels.append(kernel)
    physical = {b.declared: b for kern in kernels for b in kern.params}
    return prog.replace(kernels=tuple(kernels), params=tuple(physical.get(b, b) for b in prog.params),
                        workspaces=tuple(physical.get(b, b) for b in prog.workspaces))
