"""``Measurer``: the Runner of a local OpenCL device. It builds configs in parallel worker processes and runs
them in an isolated one, each with a timeout, so that a compiler that hangs or a kernel that crashes or never
ends cannot take the tuner down (``tuner.measure.process``)."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from tuner.errors import ErrorCode
from tuner.measure.process import Worker
from tuner.measure.runner import MeasureInput, MeasureOptions, MeasureResult, Runner, now  # noqa: F401


class Measurer(Runner):
    """Worker processes bound to one local OpenCL device: ``n_parallel`` builders and one runner."""

    def __init__(self, device=None, options: MeasureOptions | None = None):
        from tuner.target import DeviceInfo
        self.options = options or MeasureOptions()
        info = device.info if hasattr(device, "info") else device
        if not isinstance(info, DeviceInfo):
            from tuner.runtime.opencl.device import choose_device
            info = choose_device(info)
        self.info = info
        spec = str(self.info.index)
        self.builders = [Worker(spec) for _ in range(max(1, self.options.n_parallel))]
        self.runner = Worker(spec)

    def close(self) -> None:
        for w in (*self.builders, self.runner):
            w.close()

    def _build(self, worker: Worker, inp: MeasureInput) -> MeasureResult:
        start, stamp = time.perf_counter(), now()
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
