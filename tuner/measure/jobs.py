"""What the worker processes do: ``build`` (instantiate, lower, generate, compile) and ``run`` (check
against the reference, then time). Each returns ``(ErrorCode, payload)``; nothing raises to the caller."""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from tuner.errors import CompileError, ErrorCode, LoweringError, TunerError


def _faulted(dev) -> bool:
    """After an OpenCL error: is the device's queue still usable? A kernel's wild access on a GPU loses the
    queue (NVIDIA: CL_INVALID_COMMAND_QUEUE on every later call) as a CPU device's kills the process; an error at
    enqueue (too many resources for a launch) leaves it working."""
    import pyopencl as cl
    try:
        dev.queue.finish()
        return False
    except cl.Error:
        return True


@lru_cache(maxsize=None)
def _device(spec: str):
    from tuner.runtime.opencl.device import open_device
    return open_device(spec)


def _instantiate(template, workload, config, device):
    """The kernel of a config, or ``(INSTANTIATION, why)`` when the config breaks the search space's
    constraints for this workload and device, or the template rejects it."""
    from tuner.templates import get_template
    t = get_template(template)
    try:
        bad = t.space(workload, device.info).violations(t.config_values(workload, config))
    except TunerError as e:
        return None, (ErrorCode.INSTANTIATION, str(e))
    if bad:
        return None, (ErrorCode.INSTANTIATION, "constraints broken: " + "; ".join(bad))
    try:
        return (t, t.build(workload, config)), None
    except (ValueError, TypeError, TunerError) as e:
        return None, (ErrorCode.INSTANTIATION, f"{type(e).__name__}: {e}")


def build(spec: str, template, workload, config):
    """Instantiate, lower, generate and compile: ``(NO_ERROR, Prepared)`` -- what ``run`` needs to run the config
    without lowering or compiling it again (the serial runner's time is the tuner's bottleneck: lowering and
    compiling a convolution take a second or more each, issue 53) -- or ``(code, message)``."""
    from tuner.codegen.generate import generate
    from tuner.runtime.opencl.launch import Executable
    from tuner.runtime.opencl.program import build_program
    dev = _device(spec)
    built, err = _instantiate(template, workload, config, dev)
    if err:
        return err
    try:
        prog, source = generate(built[1])
    except LoweringError as e:
        return ErrorCode.COMPILE, f"lowering: {e}"
    try:
        cl_program = build_program(dev, source)
    except CompileError as e:
        return ErrorCode.COMPILE, str(e)
    try:
        return ErrorCode.NO_ERROR, Executable(prog, dev, source, cl_program).prepared()
    except ValueError as e:  # a launch shape the kernel's loops contradict
        return ErrorCode.COMPILE, f"launch shape: {e}"


@lru_cache(maxsize=4)
def _inputs_and_reference(template, workload, seed: int):
    """Random inputs and the reference output, once per workload (all its configs see the same data)."""
    from tuner.templates import get_template
    t = get_template(template)
    inputs = t.random_inputs(workload, np.random.default_rng(seed))
    return inputs, t.reference(workload, inputs)


def run(spec: str, template, workload, config, warmup: int, repeats: int, min_seconds: float, check: bool,
        seed: int, prepared=None):
    """Check against the reference, then time. ``prepared``: ``build``'s Prepared of this config (its binary is
    loaded, nothing lowered or compiled); without it the config is instantiated and built here."""
    import pyopencl as cl

    from tuner.runtime.opencl.launch import build as build_executable
    from tuner.templates import get_template
    from tuner.templates.common import output_error
    dev = _device(spec)
    try:
        if prepared is not None:
            t, exe = get_template(template), prepared.load(dev)
        else:
            built, err = _instantiate(template, workload, config, dev)
            if err:
                return err
            t, kernel = built
            exe = build_executable(kernel, dev)
    except (CompileError, LoweringError) as e:
        return ErrorCode.COMPILE, str(e)
    inputs, ref = _inputs_and_reference(template, workload, seed)
    rel = None
    try:
        arrays = exe.upload_inputs(**inputs)
        exe.launch(arrays)
        if check:
            rel, shape = output_error(exe.outputs_of(arrays), t.expected(ref))
            tol = t.tolerance(workload, config)
            if rel is None or not rel <= tol:  # NaN compares false: a wrong answer too
                shape = shape or f"max relative error {rel:.3g} > tolerance {tol:g}"
                return ErrorCode.WRONG_ANSWER, {"msg": shape, "max_rel_error": rel if rel == rel else None}
        costs = exe.time(arrays, warmup=warmup, repeats=repeats, min_seconds=min_seconds)
    except (cl.Error, cl.RuntimeError, TunerError, MemoryError) as e:
        if isinstance(e, cl.Error) and _faulted(dev):  # "restart": process.Worker starts a fresh process next
            return ErrorCode.UNKNOWN, {"msg": f"the device faulted during the run ({type(e).__name__}: {e}): the run "
                                              f"worker exits and the next config opens the device again",
                                       "max_rel_error": rel, "restart": True}
        return ErrorCode.RUNTIME, {"msg": f"{type(e).__name__}: {e}", "max_rel_error": rel}
    return ErrorCode.NO_ERROR, {"costs": costs, "max_rel_error": rel}
