"""``Measurer``: the Runner of a local OpenCL device. It builds configs in parallel worker processes and runs
them in an isolated one, each with a timeout, so that a compiler that hangs or a kernel that crashes or never
ends cannot take the tuner down (``tuner.measure.process``)."""
from __future__ import annotations

import time
import queue
from concurrent.futures import ThreadPoolExecutor, as_completed

from tuner.errors import ErrorCode
from tuner.measure.process import Worker
from tuner.measure.sensors import read as read_sensors
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

    def _build(self, free: queue.Queue, inp: MeasureInput) -> tuple:
        """``(MeasureResult, Prepared or None)``: the input built by whichever builder is free."""
        worker = free.get()
        try:
            start, stamp = time.perf_counter(), now()
            code, payload = worker.call("build", (inp.template, inp.workload, inp.config), self.options.build_timeout,
                                        ErrorCode.BUILD_TIMEOUT)
        finally:
            free.put(worker)
        ok = code == ErrorCode.NO_ERROR
        res = MeasureResult(code, "" if ok else str(payload), timestamp=stamp, duration_s=time.perf_counter() - start)
        return res, (payload if ok and not isinstance(payload, str) else None)

    def measure(self, inputs: list) -> list:
        """Build ``inputs`` in parallel and run each as soon as its build is done (one at a time: timings never
        overlap), so that the runner works while the builders do; one ``MeasureResult`` per input, in order.
        The runner loads the builder's binary: nothing is lowered or compiled twice."""
        o = self.options
        free: queue.Queue = queue.Queue()
        for w in self.builders:
            free.put(w)
        results: list = [None] * len(inputs)
        with ThreadPoolExecutor(len(self.builders)) as pool:
            futures = {pool.submit(self._build, free, x): i for i, x in enumerate(inputs)}
            for fut in as_completed(futures):
                i = futures[fut]
                res, prepared = fut.result()
                results[i] = res
                if res.error_code != ErrorCode.NO_ERROR:
                    continue
                inp = inputs[i]
                start = time.perf_counter()
                args = (inp.template, inp.workload, inp.config, o.warmup, o.repeats, o.min_seconds, o.check, o.seed,
                        prepared)
                code, payload = self.runner.call("run", args, o.run_timeout, ErrorCode.RUN_TIMEOUT)
                payload = payload if isinstance(payload, dict) else {"msg": payload}
                res.error_code, res.error_msg = ErrorCode(code), payload.get("msg", "")
                res.costs, res.max_rel_error = payload.get("costs", []), payload.get("max_rel_error")
                reading = read_sensors()  # this host's sysfs: None where it has none
                res.gpu_clock_hz, res.temp_c = reading.gpu_clock_hz, reading.temp_c
                res.duration_s += time.perf_counter() - start
        return results
