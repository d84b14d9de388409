"""The Runner interface and what crosses it: a config to measure (``MeasureInput``), its result
(``MeasureResult``: an ErrorCode and a message, or the seconds of each timed run and the max relative error
against the reference) and how to measure (``MeasureOptions``). The tuner reaches a device only through a
Runner: ``Measurer`` (tuner.measure.local, isolated worker processes on a local OpenCL device) or
``RuntimeRunner`` (tuner.measure.runtime_runner, through any Runtime, e.g. the device agent)."""
from __future__ import annotations

import abc
import statistics
import threading
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


class Batch:
    """Measurements started together (``Runner.start``): ``results`` fill in as they finish (one
    ``MeasureResult`` per input, in order); ``done`` once all have."""

    def __init__(self, n: int, on_done=None):
        self.results: list = [None] * n
        self.left = n
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._on_done = on_done
        if n == 0:
            self._event.set()

    @classmethod
    def completed(cls, results: list) -> "Batch":
        b = cls(0)
        b.results = list(results)
        return b

    @property
    def done(self) -> bool:
        return self._event.is_set()

    def put(self, i: int, result: "MeasureResult") -> None:
        """Result ``i`` is in (called by whoever measured it; the last one marks the batch done)."""
        with self._lock:
            self.results[i] = result
            self.left -= 1
            last = self.left == 0
        if last:
            self._event.set()
            if self._on_done is not None:
                self._on_done()

    def wait(self) -> list:
        self._event.wait()
        return self.results


class Runner(abc.ABC):
    """Measures configs on one device: the tuner reaches a device only through this (``tune(...,
    device=runner)``, ``tune_model``). ``Measurer`` is the local one (isolated worker processes);
    ``RuntimeRunner`` (``tuner.measure.runtime_runner``) measures through any ``Runtime``. ``info``: the
    device's profile, which keys the records and the search space's constraints."""

    info: object  # DeviceInfo

    @abc.abstractmethod
    def measure(self, inputs: list) -> list:
        """One ``MeasureResult`` per ``MeasureInput``, in order; a failure is a result, never an exception."""

    def start(self, inputs: list) -> Batch:
        """Begin measuring ``inputs``; the ``Batch`` fills in as they finish. This one measures them before it
        returns; a runner that measures in the background (``Measurer``) returns at once, so that a model's
        scheduler can start the next visit while this one's slowest builds finish (``idle``, ``wait``)."""
        return Batch.completed(self.measure(inputs))

    def idle(self) -> bool:
        """Whether a builder would sit idle now: nothing waits to be built and a builder is free. A runner that
        measures before ``start`` returns is never idle while a batch is open."""
        return False

    def wait(self, timeout: float | None = None, builder: bool = True) -> None:
        """Block until some started batch is done (or, with ``builder``, a builder falls idle), or ``timeout``."""

    def close(self) -> None:
        """Stop what the runner started."""

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
