"""Run one operator: a template, a workload and a config (default: the template's fallback for the device),
checked against the NumPy reference and timed. ``tuner op`` is a thin layer over ``run_op``."""
from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass

import numpy as np

from tuner.errors import TunerError
from tuner.runtime.opencl.device import Device, open_device
from tuner.runtime.opencl.launch import build


def make_workload(template, **fields):
    """``template.workload(**fields)`` with a bad shape or attribute reported as a TunerError."""
    try:
        return template.workload(**fields)
    except (ValueError, TypeError) as e:
        raise TunerError(f"{template.name} workload: {e}") from None


def make_config(template, workload, device, overrides: dict | None = None, **fixed):
    """The fallback config for ``device`` with ``overrides`` (knob -> value) and ``fixed`` task knobs (scopes)
    applied, validated against the search space: an invalid value names the knob or the constraint."""
    info = getattr(device, "info", device)
    values = template.config_values(workload, template.fallback(workload, info))
    space = template.space(workload, info)
    changes = {**fixed, **(overrides or {})}
    unknown = set(changes) - set(space.choices)
    if unknown:
        raise TunerError(f"unknown knob {sorted(unknown)[0]!r} for {template.name}; knobs: "
                         f"{', '.join(k for k in space.choices if k != 'dtype')}")
    if "dtype" in changes and changes["dtype"] != workload.dtype:
        raise TunerError("dtype is the workload's storage dtype: use --dtype, not the config")
    values.update(changes)
    space.check(values)
    return template.make_config(values)


@dataclass
class OpResult:
    template: str
    workload: object
    config: object
    device: str
    source: str
    max_rel_error: float | None = None
    tolerance: float | None = None
    costs: list | None = None  # seconds per run

    @property
    def median(self) -> float | None:
        return statistics.median(self.costs) if self.costs else None

    @property
    def gflops(self) -> float | None:
        return self.workload.flops / self.median / 1e9 if self.costs else None

    @property
    def ok(self) -> bool:
        return self.max_rel_error is None or self.max_rel_error <= self.tolerance

    def to_dict(self) -> dict:
        return {"template": self.template, "workload": self.workload.key(),
                "config": dataclasses.asdict(self.config), "device": self.device,
                "max_rel_error": self.max_rel_error, "tolerance": self.tolerance, "costs": self.costs,
                "median_s": self.median, "gflops": self.gflops}


def _shown(workload) -> str:
    import json
    return json.dumps(workload.key(), separators=(",", ":"))


def _check_fits(template, workload, program, info) -> None:
    """Every buffer the operator's run allocates within the device's limits, checked before its random inputs
    and reference are made on the host (a huge workload gave a NumPy MemoryError traceback there)."""
    from tuner.ir.kernel import as_program
    prog = as_program(program)
    for b in (*prog.params, *prog.workspaces):
        shape = tuple(int(s) for s in b.shape)
        if b.scope.startswith("texture"):
            if len(shape) == 3 and (shape[1] > info.image2d_max_width or shape[0] > info.image2d_max_height):
                raise TunerError(f"{template.name} {_shown(workload)}: {b.name!r} is a texture of {shape[1]} x "
                                 f"{shape[0]} pixels, past this device's image2d limit of {info.image2d_max_width} x "
                                 f"{info.image2d_max_height} ({info.name}): give smaller shapes, or --scope buffer")
            continue
        nbytes = math.prod(shape) * b.dtype.bytes
        if nbytes > info.max_mem_alloc_bytes:
            raise TunerError(f"{template.name} {_shown(workload)}: {b.name!r} needs a buffer of {nbytes} bytes; this "
                             f"device ({info.name}) allocates at most {info.max_mem_alloc_bytes}: give smaller shapes")


def run_op(template, workload, config=None, device=None, check: bool = True, time: bool = False,
           repeats: int = 10, seed: int = 0) -> OpResult:
    """Build ``template`` for ``workload`` with ``config`` (default: fallback), run it on random inputs,
    compare with the reference (``check``) and time it (``time``: median of ``repeats`` profiled runs)."""
    from tuner.runtime.base import Runtime
    if isinstance(device, Runtime):
        from tuner.errors import DeviceCrashed
        config = config if config is not None else make_config(template, workload, device)
        try:
            return _run_op_on(device, template, workload, config, check, time, repeats, seed)
        except (TimeoutError, DeviceCrashed) as e:
            raise TunerError(f"{template.name} on {device.info.name}: {e}") from None
    dev = device if isinstance(device, Device) else open_device(device)
    config = config if config is not None else make_config(template, workload, dev)
    if not (check or time):
        exe = build(template.build(workload, config), dev)
        return OpResult(template.name, workload, config, dev.fingerprint, exe.source)
    result, timer = prepared_op(template, workload, config, dev, check, seed)
    if time:
        result.costs = timer(repeats)
    return result


def prepared_op(template, workload, config, device: Device, check: bool = True, seed: int = 0) -> tuple:
    """``(OpResult, time)``: ``run_op``'s op on a local device, built and run once on random inputs (compared with
    the reference with ``check``), and ``time(repeats)``, the seconds of ``repeats`` profiled runs of that same
    build -- for timing several ops in alternating rounds without building each again every round
    (``bench/se_gate_ab.py``, ``bench/stats_epilogue.py``)."""
    program = template.build(workload, config)
    _check_fits(template, workload, program, device.info)
    exe = build(program, device)
    result = OpResult(template.name, workload, config, device.fingerprint, exe.source)
    inputs = template.random_inputs(workload, np.random.default_rng(seed))
    arrays = exe.upload_inputs(**inputs)
    exe.launch(arrays)
    if check:
        result.max_rel_error = template.check(workload, exe.outputs_of(arrays), inputs)
        result.tolerance = template.tolerance(workload, config)
    return result, lambda repeats: exe.time(arrays, warmup=1, repeats=repeats)


def _run_op_on(rt, template, workload, config, check: bool, time: bool, repeats: int, seed: int) -> OpResult:
    """``run_op`` through any Runtime (a device agent): generated and checked here, built, run and timed
    there."""
    from tuner.measure.runtime_runner import stage
    from tuner.codegen.generate import generate, written_buffers
    from tuner.codegen.packing import unpack
    prog, source = generate(template.build(workload, config))
    result = OpResult(template.name, workload, config, rt.fingerprint, source)
    program = rt.build(source)
    if not (check or time):
        return result
    _check_fits(template, workload, prog, rt.info)
    inputs = template.random_inputs(workload, np.random.default_rng(seed))
    launches, arrays = stage(rt, prog, program, inputs)
    rt.submit(launches)
    rt.finish()
    if check:
        written = written_buffers(prog.kernels)
        outs = {b.name: unpack(b, rt.download(arrays[b.name])) for b in prog.params if b.name in written}
        result.max_rel_error = template.check(workload, outs, inputs)
        result.tolerance = template.tolerance(workload, config)
    if time:
        result.costs = rt.time(launches, warmup=1, repeats=repeats)
    return result
