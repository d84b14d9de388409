"""Measurement: every measured config is checked against the template's NumPy reference on random inputs
before it is timed (warm-up, then repeats timed with device profiling events until a minimum total time).
Failures are classified by ``tuner.errors.ErrorCode`` with a message.

``runner`` holds the interface (``Runner``, ``MeasureInput``, ``MeasureResult``, ``MeasureOptions``);
``local`` the local OpenCL one (``Measurer``: worker processes); ``runtime_runner`` one over any Runtime.

    with Measurer("pocl") as m:
        results = m.measure([MeasureInput("conv2d", wl, cfg), ...])
"""
from __future__ import annotations

import dataclasses

from tuner.measure.local import Measurer
from tuner.measure.runner import Batch, MeasureInput, MeasureOptions, MeasureResult, Runner, now

_now = now  # the name earlier releases used

__all__ = ["Batch", "MeasureInput", "MeasureOptions", "MeasureResult", "Measurer", "Runner", "measure_config", "open_runner"]


def open_runner(device=None, options: MeasureOptions | None = None) -> Runner:
    """``device`` itself when it is a Runner; a RuntimeRunner over it when it is a Runtime; else a Measurer of
    the local OpenCL device ``device`` names (a DeviceInfo, Device or spec)."""
    if isinstance(device, Runner):
        return device
    from tuner.runtime.base import Runtime
    if isinstance(device, Runtime):
        from tuner.measure.runtime_runner import RuntimeRunner
        return RuntimeRunner(device, options)
    return Measurer(device, options)


def measure_config(template, workload, config, device=None, options: MeasureOptions | None = None) -> MeasureResult:
    """Measure one config in fresh worker processes (convenience for scripts and tests)."""
    name = template if isinstance(template, str) else template.name
    with Measurer(device, dataclasses.replace(options or MeasureOptions(), n_parallel=1)) as m:
        return m.measure([MeasureInput(name, workload, config)])[0]
