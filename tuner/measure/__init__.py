"""Measurement: build configs in parallel worker processes and run them in an isolated one, each with a
timeout, so that a compiler that hangs or a kernel that crashes or never ends cannot take the tuner down.

Every measured config is checked against the template's NumPy reference on random inputs before it is
timed (warm-up, then repeats timed with OpenCL profiling events until a minimum total time). Failures are
classified by ``tuner.errors.ErrorCode`` with a message.

    with Measurer("pocl") as m:
        results = m.measure([MeasureInput("conv2d", wl, cfg), ...])
"""
from __future__ import annotations

import abc
import dataclasses
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone

from tuner.errors import ErrorCode
from tuner.measure.worker import Worker


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


def _now() -> str:
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


class Measurer(Runner):
    """Worker processes bound to one local OpenCL device: ``n_parallel`` builders and one runner."""

    def __init__(self, device=None, options: MeasureOptions | None = None):
        from tuner.target import DeviceInfo
        self.options = options or MeasureOptions()
        info = device.info if hasattr(device, "info") else device
        if not isinstance(info, DeviceInfo):
            from tuner.runtime.device import choose_device
            info = choose_device(info)
        self.info = info
        spec = str(self.info.index)
        self.builders = [Worker(spec) for _ in range(max(1, self.options.n_parallel))]
        self.runner = Worker(spec)

    def close(self) -> None:
        for w in (*self.builders, self.runner):
            w.close()

    def _build(self, worker: Worker, inp: MeasureInput) -> MeasureResult:
        start, stamp = time.perf_counter(), _now()
        code, msg = worker.call("build", (inp.template, inp.workload, inp.config), self.options.build_timeout,
                                ErrorCode.BUILD_TIMEOUT)
        return MeasureResult(code, msg, timestamp=stamp, duration_s=time.perf_counter() - start)

    def measure(self, inputs: list) -> list:
        """Build ``inputs`` in parallel, then run each in turn; one ``MeasureResult`` per input, in order."""
        o, n = self.options, len(self.builders)
        with ThreadPoolExecutor(n) as pool:  # builder i takes inputs i, i+n, ...
            chunks = list(pool.map(lambda i: [self._build(self.builders[i], x) for x in inputs[i::n]], range(n)))
        results = [chunks[k % n][k // n] for k in range(len(inputs))]
        for inp, res in zip(inputs, results):
            if res.error_code != ErrorCode.NO_ERROR:
                continue
            start = time.perf_counter()
            args = (inp.template, inp.workload, inp.config, o.warmup, o.repeats, o.min_seconds, o.check, o.seed)
            code, payload = self.runner.call("run", args, o.run_timeout, ErrorCode.RUN_TIMEOUT)
            payload = payload if isinstance(payload, dict) else {"msg": payload}
            res.error_code, res.error_msg = ErrorCode(code), payload.get("msg", "")
            res.costs, res.max_rel_error = payload.get("costs", []), payload.get("max_rel_error")
            res.duration_s += time.perf_counter() - start
        return results


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
