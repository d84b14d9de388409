"""``RuntimeRunner``: measure configs through any ``Runtime`` (tuner.runtime.base).

The host half stays here, next to NumPy: instantiate the template, check the search space's constraints,
lower and generate OpenCL C, pack the random inputs, and check the output against the reference. The device
half goes through the runtime: build the source, allocate, upload, run once, download, and time
(``Runtime.time``: warm-up, repeats and a minimum kernel time, from device timestamps). A device behind a
link (the device agent) therefore needs no Python, and its records are the same as a local device's.

The host half of the next configs runs in a thread while the device measures the current one, so the device
does not wait for lowering and code generation. Only one thread works on the IR at a time (``_IR_LOCK``): it
was taken because Python 3.11's ``functools.cached_property`` (one lock per property across all instances) let two
threads lowering at once deadlock; the IR nodes' own ``cached_property`` (``tuner/ir/expr.py``) takes no lock now,
and the lock stays because the lowering is CPU-bound Python that gains nothing from a second thread. The device's
round trips (build, run, time) happen outside it. ``cooldown_s`` (a
``MeasureOptions`` field) is slept between two measurements: a phone that throttles when hot measures each
config from the same temperature.

Nothing here isolates the process from a kernel that hangs or crashes: a local device uses ``Measurer``
(worker processes); a runtime across a link isolates on its side and raises ``TimeoutError`` for a kernel
that did not end, ``DeviceCrashed`` for one that crashed. A link that is lost (``AgentLinkError``) is not a
config's failure: it propagates, and a re-run resumes from the log.

Each measurement that reached the device carries the device's GPU clock and temperature read right after it
(``sensors()``: the agent's ``SENSORS`` for a runtime that has ``sensors``, else this host's sysfs through
``tuner.measure.sensors``); None where the device exposes neither."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np

from tuner.errors import CompileError, DeviceCrashed, ErrorCode, LoweringError, TunerError
from tuner.measure.runner import MeasureOptions, MeasureResult, Runner, now as _now
from tuner.measure.sensors import Reading, read as read_sysfs


_IR_LOCK = threading.RLock()  # held while a thread touches IR objects (instantiate, lower, pack, unpack)


def _link_errors() -> tuple:
    """The exceptions that mean the link to the device is gone (not a config's failure)."""
    from tuner.agent.protocol import ProtocolError
    from tuner.agent.transport import AgentLinkError
    return AgentLinkError, ProtocolError


def stage(rt, prog, program, inputs: dict) -> tuple:
    """``(launches, arrays)`` of a lowered program built on ``rt`` (a Runtime) as ``program``: every parameter and
    workspace allocated at its physical shape, the ``inputs`` (logical arrays by name) packed and uploaded, and
    one launch per kernel. Used by ``RuntimeRunner`` and by ``run_op`` through a Runtime."""
    from tuner.codegen.packing import pack, physical_shape
    arrays = {}
    for b in (*prog.params, *prog.workspaces):
        arrays[b.name] = rt.alloc(b.scope, tuple(physical_shape(b)), b.dtype.numpy)
        if b.name in inputs:
            rt.upload(arrays[b.name], pack(b, np.asarray(inputs[b.name])))
        elif b.dtype.base == "int32":  # a workspace of counters starts at zero (each launch leaves it so)
            rt.upload(arrays[b.name], np.zeros(tuple(physical_shape(b)), np.int32))
    launches = [rt.prepare(program, k.name, [arrays[p.name] for p in k.params], *k.launch()) for k in prog.kernels]
    return launches, arrays


class RuntimeRunner(Runner):
    """Measures on ``runtime`` in this process, one config after another on the device, the next configs'
    host half generated meanwhile. A runtime with ``set_timeouts`` (the device agent) gets the options'
    build and run timeouts as its deadlines."""

    def __init__(self, runtime, options: MeasureOptions | None = None):
        self.runtime, self.options = runtime, options or MeasureOptions()
        self.info = runtime.info
        set_timeouts = getattr(runtime, "set_timeouts", None)
        if set_timeouts is not None:
            set_timeouts(build=self.options.build_timeout, run=self.options.run_timeout)
        self._pool: ThreadPoolExecutor | None = None
        self._measured = 0

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def measure(self, inputs: list) -> list:
        if not inputs:
            return []
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="tuner-generate")
        cooldown = float(self.options.cooldown_s or 0.0)
        pending = [self._pool.submit(self._host, inp) for inp in inputs]
        out = []
        try:
            for inp, fut in zip(inputs, pending):
                host = fut.result()
                start, stamp = time.perf_counter(), _now()
                reading = Reading()
                if host[0] == "error":
                    code, payload = host[1]
                else:
                    if cooldown > 0 and self._measured:
                        time.sleep(cooldown)
                        start = time.perf_counter()
                    code, payload = self._device(inp, *host[1:])
                    self._measured += 1
                    reading = self.sensors()
                payload = payload if isinstance(payload, dict) else {"msg": payload}
                # the device's time, plus the host half's (which ran meanwhile, in a pool thread)
                duration = time.perf_counter() - start + (host[-1] if host[0] != "error" else 0.0)
                out.append(MeasureResult(ErrorCode(code), payload.get("msg", ""), payload.get("costs", []),
                                         payload.get("max_rel_error"), stamp, duration, reading.gpu_clock_hz,
                                         reading.temp_c))
        finally:
            for f in pending:
                f.cancel()
            wait(pending)  # none left touching the IR when the caller goes on (an error included)
        return out

    def sensors(self) -> Reading:
        """The device's GPU clock and temperature now: the runtime's ``sensors()`` (the agent's ``SENSORS``)
        where it has one, else this host's sysfs (a local device). A lost link propagates; any other failure is
        an empty reading (``tuner.measure.drift.DriftGuard`` polls this while it waits)."""
        fn = getattr(self.runtime, "sensors", None)
        if fn is None:
            return read_sysfs()
        lost = _link_errors()
        try:
            hz, temp, source = fn()
        except lost:
            raise
        except (TunerError, OSError):  # a reading is best effort
            return Reading()
        return Reading(hz, temp, source)

    # -- the host half (a pool thread) ----------------------------------------------------------------
    def _host(self, inp) -> tuple:
        """``("error", (code, msg))``, or ``("ok", template, lowered program, source, inputs, reference,
        seconds)``."""
        with _IR_LOCK:
            return self._host_locked(inp)

    def _host_locked(self, inp) -> tuple:
        from tuner.measure.jobs import _inputs_and_reference, _instantiate
        from tuner.codegen.generate import generate
        t0 = time.perf_counter()
        try:
            built, err = _instantiate(inp.template, inp.workload, inp.config, self)
        except TunerError as e:  # a template that cannot be loaded
            return "error", (ErrorCode.INSTANTIATION, str(e))
        if err:
            return "error", err
        t, kernel = built
        try:
            prog, source = generate(kernel)
        except LoweringError as e:
            return "error", (ErrorCode.COMPILE, f"lowering: {e}")
        except (TunerError, ValueError, TypeError) as e:
            return "error", (ErrorCode.INSTANTIATION, f"{type(e).__name__}: {e}")
        inputs, ref = _inputs_and_reference(inp.template, inp.workload, self.options.seed)
        return "ok", t, prog, source, inputs, ref, time.perf_counter() - t0

    # -- the device half (this thread) ---------------------------------------------------------------
    def _device(self, inp, t, prog, source, inputs, ref, _seconds) -> tuple:
        rt, o = self.runtime, self.options
        lost = _link_errors()
        try:
            program = rt.build(source)
        except CompileError as e:
            return ErrorCode.COMPILE, str(e)
        except TimeoutError as e:
            return ErrorCode.BUILD_TIMEOUT, str(e)
        except DeviceCrashed as e:
            return ErrorCode.UNKNOWN, str(e)
        except lost:
            raise
        except (TunerError, MemoryError, RuntimeError, OSError) as e:
            return ErrorCode.RUNTIME, f"{type(e).__name__}: {e}"
        rel = None
        try:
            with _IR_LOCK:
                launches, arrays = self._prepare(prog, program, inputs)
            rt.submit(launches)
            rt.finish()
            if o.check:
                rel, wrong = self._check(t, inp, prog, arrays, ref)
                if wrong:
                    return ErrorCode.WRONG_ANSWER, {"msg": wrong, "max_rel_error": rel if rel == rel else None}
            costs = rt.time(launches, warmup=o.warmup, repeats=o.repeats, min_seconds=o.min_seconds)
        except TimeoutError as e:
            return ErrorCode.RUN_TIMEOUT, {"msg": str(e), "max_rel_error": rel}
        except DeviceCrashed as e:
            return ErrorCode.UNKNOWN, {"msg": str(e), "max_rel_error": rel}
        except lost:
            raise
        except (TunerError, MemoryError, RuntimeError, OSError) as e:
            return ErrorCode.RUNTIME, {"msg": f"{type(e).__name__}: {e}", "max_rel_error": rel}
        return ErrorCode.NO_ERROR, {"costs": costs, "max_rel_error": rel}

    def _prepare(self, prog, program, inputs: dict) -> tuple:
        return stage(self.runtime, prog, program, inputs)

    def _check(self, t, inp, prog, arrays, ref) -> tuple:
        """``(max relative error, why it is wrong or "")`` of the template's outputs against its reference."""
        from tuner.codegen.packing import unpack
        from tuner.templates.common import output_error
        expected, got = t.expected(ref), {}
        for name in expected:
            with _IR_LOCK:
                buf = next(b for b in prog.params if b.name == name)
            raw = self.runtime.download(arrays[buf.name])
            with _IR_LOCK:
                got[name] = unpack(buf, raw)
        rel, wrong = output_error(got, expected)
        if wrong:
            return None, wrong
        tol = t.tolerance(inp.workload, inp.config)
        return rel, "" if rel <= tol else f"max relative error {rel:.3g} > tolerance {tol:g}"
