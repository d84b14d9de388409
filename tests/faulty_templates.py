"""Templates that fail on purpose, one way each, for the measurement tests. Worker processes import them
as ``tests.faulty_templates:NAME`` (the tests run from the repository root)."""
import dataclasses
import time
from pathlib import Path

from tuner.ir.builder import Builder
from tuner.ir.expr import call
from tuner.ir.stmt import Evaluate, seq
from tuner.templates.conv2d_nchw4c import TEMPLATE as CONV2D
from tuner.templates.conv2d_nchw4c import conv2d_nchw4c


def _undefined_call(wl, cfg):
    k = conv2d_nchw4c(wl, cfg)
    return k.replace(body=seq(Evaluate(call("no_such_opencl_builtin", [1], "int32")), k.body))


def _off_by_one_reference(wl, inputs):
    return CONV2D.reference(wl, inputs) + 1.0


def _endless(wl, cfg):
    """Writes the output forever (2^60 stores per work-item): only the run timeout ends it."""
    k = conv2d_nchw4c(wl, cfg)
    Y = k.params[-1]
    b = Builder()
    with b.loop("i", 1 << 30), b.loop("j", 1 << 30):
        b.store(Y, (0, 0, 0, 0), Y[0, 0, 0, 0] + 1.0)
    return k.replace(body=seq(b.get(), k.body))


def _slow_build(wl, cfg):
    time.sleep(120)
    return conv2d_nchw4c(wl, cfg)


def _crash(wl, cfg):
    import os
    os._exit(3)


CONV2D_SPACE = "conv2d"
COMPILE_ERROR = dataclasses.replace(CONV2D, build=_undefined_call, space_file=CONV2D_SPACE)
WRONG_ANSWER = dataclasses.replace(CONV2D, reference=_off_by_one_reference, space_file=CONV2D_SPACE)
RUN_FOREVER = dataclasses.replace(CONV2D, build=_endless, space_file=CONV2D_SPACE)
BUILD_FOREVER = dataclasses.replace(CONV2D, build=_slow_build, space_file=CONV2D_SPACE)
CRASH = dataclasses.replace(CONV2D, build=_crash, space_file=CONV2D_SPACE)
NO_WORK_GROUP_LIMIT = dataclasses.replace(
    CONV2D, space_file=str(Path(__file__).parent / "data" / "conv2d_no_wg_limit.toml"))
