"""``Measurer``: the Runner of a local OpenCL device. It builds configs in parallel worker processes and runs
them in an isolated one, each with a timeout, so that a compiler that hangs or a kernel that crashes or never
ends cannot take the tuner down (``tuner.measure.process``)."""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from tuner.errors import ErrorCode
from tuner.measure.process import Worker
from tuner.measure.sensors import read as read_sensors
from tuner.measure.runner import Batch, MeasureInput, MeasureOptions, MeasureResult, Runner, now  # noqa: F401


class Measurer(Runner):
    """Worker processes bound to one local OpenCL device: ``n_parallel`` builders and one runner.

    Builds run in parallel and each built config is run (checked, then timed) as soon as its build is done, one
    at a time in a thread of its own, so timings never overlap. ``start`` returns at once: a model's scheduler
    starts its next visit while the slowest builds of the last one finish (on the H200, a visit's last build
    took 5-20 s while its median took 1 s, and the builders sat idle meanwhile)."""

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
        self._free: queue.Queue = queue.Queue()
        for w in self.builders:
            self._free.put(w)
        self._pool = ThreadPoolExecutor(len(self.builders), thread_name_prefix="build")
        self._runs: queue.Queue = queue.Queue()
        self._cv = threading.Condition()
        self._queued = 0  # builds submitted that no builder has taken yet
        self._closed = False
        self._running = False  # the runner is checking or timing a config
        self._run_thread = threading.Thread(target=self._run_loop, name="run", daemon=True)
        self._run_thread.start()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._runs.put(None)
        idle = set()
        while True:
            try:
                idle.add(id(self._free.get_nowait()))
            except queue.Empty:
                break
        for w in self.builders:  # a builder still building (a visit cut short by the budget) is killed at once:
            w.close() if id(w) in idle else w.kill()  # a polite close waits 2 s for each
        self.runner.close() if self._runs.qsize() <= 1 and not self._running else self.runner.kill()

    def _notify(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def start(self, inputs: list) -> Batch:
        batch = Batch(len(inputs), on_done=self._notify)
        with self._cv:
            self._queued += len(inputs)
        for i, inp in enumerate(inputs):
            self._pool.submit(self._build, batch, i, inp)
        return batch

    def measure(self, inputs: list) -> list:
        """Build ``inputs`` in parallel and run each as soon as its build is done (one at a time: timings never
        overlap), so that the runner works while the builders do; one ``MeasureResult`` per input, in order.
        The runner loads the builder's binary: nothing is lowered or compiled twice."""
        return self.start(inputs).wait()

    def idle(self) -> bool:
        with self._cv:
            return self._queued == 0 and not self._free.empty()

    def wait(self, timeout: float | None = None, builder: bool = True) -> None:
        with self._cv:
            self._cv.wait(timeout)

    def _build(self, batch: Batch, i: int, inp: MeasureInput) -> None:
        """Build ``inp`` on whichever builder is free, then queue it for the runner (a failure is its result)."""
        worker = self._free.get()
        with self._cv:
            self._queued -= 1
        start, stamp = time.perf_counter(), now()
        try:
            if self._closed:
                code, payload = ErrorCode.UNKNOWN, "the measurer was closed"
            else:
                code, payload = worker.call("build", (inp.template, inp.workload, inp.config),
                                            self.options.build_timeout, ErrorCode.BUILD_TIMEOUT)
        except Exception as e:  # noqa: BLE001 - a result, never a batch left open (a worker closed under it)
            code, payload = ErrorCode.UNKNOWN, f"the build failed: {e!r}"
        finally:
            self._free.put(worker)
            self._notify()  # a builder is free
        ok = code == ErrorCode.NO_ERROR
        res = MeasureResult(code, "" if ok else str(payload), timestamp=stamp, duration_s=time.perf_counter() - start)
        if not ok:
            batch.put(i, res)
            return
        self._runs.put((batch, i, inp, res, payload if not isinstance(payload, str) else None))

    def _run_loop(self) -> None:
        """The runner's thread: each built config checked and timed, one at a time, in the order builds finish."""
        o = self.options
        while True:
            job = self._runs.get()
            if job is None:
                return
            batch, i, inp, res, prepared = job
            self._running = True
            start = time.perf_counter()
            try:
                if self._closed:
                    code, payload = ErrorCode.UNKNOWN, "the measurer was closed"
                else:
                    args = (inp.template, inp.workload, inp.config, o.warmup, o.repeats, o.min_seconds, o.check,
                            o.seed, prepared)
                    code, payload = self.runner.call("run", args, o.run_timeout, ErrorCode.RUN_TIMEOUT)
                payload = payload if isinstance(payload, dict) else {"msg": payload}
                res.error_code, res.error_msg = ErrorCode(code), payload.get("msg", "")
                res.costs, res.max_rel_error = payload.get("costs", []), payload.get("max_rel_error")
                reading = read_sensors()  # this host's sysfs: None where it has none
                res.gpu_clock_hz, res.temp_c = reading.gpu_clock_hz, reading.temp_c
            except Exception as e:  # noqa: BLE001 - a result, never a dead thread that leaves a batch open
                res.error_code, res.error_msg = ErrorCode.UNKNOWN, f"the run failed: {e!r}"
            res.duration_s += time.perf_counter() - start
            self._running = False
            batch.put(i, res)
