"""The Runner interface and what crosses it: a config to measure (``MeasureInput``), its result
(``MeasureResult``: an ErrorCode and a message, or the seconds of each timed run and the max relative error
against the reference) and how to measure (``MeasureOptions``). The tuner reaches a device only through a
Runner: ``Measurer`` (tuner.measure.local, isolated worker processes on a local OpenCL device) or
``RuntimeRunner`` (tuner.measure.runtime_runner, through any Runtime, e.g. the device agent)."""
from __future__ import annotations

import abc
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timezone

from tuner.errors import ErrorCode


@dataclass(frozen=True)
class MeasureInput:
    template: str  # a registry name ("conv2d") or "module:ATTRIBUTE" of a Template
    workload: object
    config: object


@dataclass
class MeasureResult:
    error_code: ErrorCode = ErrorCode.NO_ERROR
    error_msg: str = ""
    costs: list = field(default_factory=list)  # seconds per timed run
    max_rel_error: float | None = None
    timestamp: str = ""
    duration_s: float = 0.0
    gpu_clock_hz: int | None = None  # the device's GPU clock when it was measured (tuner.measure.sensors)
    temp_c: float | None = None  # and its temperature, degrees C; None where the device does not expose them

    @property
    def ok(self) -> bool:
        return self.error_code == ErrorCode.NO_ERROR and bool(self.costs)

    @property
    def median(self) -> float | None:
        return statistics.median(self.costs) if self.costs else None


@dataclass
class MeasureOptions:
    build_timeout: float = 60.0  # seconds to lower, generate and compile one config
    run_timeout: float = 30.0  # seconds to run, check and time one config
    warmup: int = 1
    repeats: int = 5
    min_seconds: float = 0.02  # keep timing until this much kernel time is spent (short kernels)
    n_parallel: int = 2  # build workers
    check: bool = True
    seed: int = 0
    cooldown_s: float = 0.0  # slept between two measurements (a phone that throttles; RuntimeRunner)


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class Runner(abc.ABC):
    """Measures configs on one device: the tuner reaches a device only through this (``tune(...,
    device=runner)``, ``tune_model``). ``Measurer`` is the local one (isolated worker processes);
    ``RuntimeRunner`` (``tuner.measure.runtime_runner``) measures through any ``Runtime``. ``info``: the
    device's profile, which keys the records and the search space's constraints."""

    info: object  # DeviceInfo

    @abc.abstractmethod
    def measure(self, inputs: list) -> list:
        """One ``MeasureResult`` per ``MeasureInput``, in order; a failure is a result, never an exception."""

    def close(self) -> None:
        """Stop what the runner started."""

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
