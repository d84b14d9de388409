"""``RuntimeRunner``: measure configs through any ``Runtime`` (tuner.runtime.base).

The host half stays here, next to NumPy: instantiate the template, check the search space's constraints,
lower and generate OpenCL C, pack the random inputs, and check the output against the reference. The device
half goes through the runtime: build the source, allocate, upload, run once, download, and time
(``Runtime.time``: warm-up, repeats and a minimum kernel time, from device timestamps). A device behind a
link (the device agent) therefore needs no Python, and its records are the same as a local device's.

Nothing here isolates the process from a kernel that hangs or crashes: a local device uses ``Measurer``
(worker processes); a runtime across a link isolates on its side and raises ``TimeoutError`` for a kernel
that did not end."""
from __future__ import annotations

import time

import numpy as np

from tuner.errors import CompileError, DeviceCrashed, ErrorCode, LoweringError, TunerError
from tuner.measure.runner import MeasureOptions, MeasureResult, Runner, now as _now


class RuntimeRunner(Runner):
    """Measures on ``runtime`` in this process, one config after another."""

    def __init__(self, runtime, options: MeasureOptions | None = None):
        self.runtime, self.options = runtime, options or MeasureOptions()
        self.info = runtime.info

    def measure(self, inputs: list) -> list:
        out = []
        for inp in inputs:
            start, stamp = time.perf_counter(), _now()
            code, payload = self._one(inp)
            payload = payload if isinstance(payload, dict) else {"msg": payload}
            out.append(MeasureResult(ErrorCode(code), payload.get("msg", ""), payload.get("costs", []),
                                     payload.get("max_rel_error"), stamp, time.perf_counter() - start))
        return out

    def _one(self, inp) -> tuple:
        from tuner.measure.jobs import _inputs_and_reference, _instantiate
        from tuner.runtime.launch import generate
        built, err = _instantiate(inp.template, inp.workload, inp.config, self)
        if err:
            return err
        t, kernel = built
        try:
            prog, source = generate(kernel)
        except LoweringError as e:
            return ErrorCode.COMPILE, f"lowering: {e}"
        rt = self.runtime
        try:
            program = rt.build(source)
        except CompileError as e:
            return ErrorCode.COMPILE, str(e)
        except TimeoutError as e:
            return ErrorCode.BUILD_TIMEOUT, str(e)
        except DeviceCrashed as e:
            return ErrorCode.UNKNOWN, str(e)
        o = self.options
        rel = None
        try:
            launches, arrays = self._prepare(prog, program, *_inputs_and_reference(inp.template, inp.workload,
                                                                                  o.seed)[:1])
            rt.submit(launches)
            rt.finish()
            if o.check:
                rel, wrong = self._check(t, inp, prog, arrays)
                if wrong:
                    return ErrorCode.WRONG_ANSWER, {"msg": wrong, "max_rel_error": rel if rel == rel else None}
            costs = rt.time(launches, warmup=o.warmup, repeats=o.repeats, min_seconds=o.min_seconds)
        except TimeoutError as e:
            return ErrorCode.RUN_TIMEOUT, {"msg": str(e), "max_rel_error": rel}
        except DeviceCrashed as e:
            return ErrorCode.UNKNOWN, {"msg": str(e), "max_rel_error": rel}
        except (TunerError, MemoryError, RuntimeError, OSError) as e:
            return ErrorCode.RUNTIME, {"msg": f"{type(e).__name__}: {e}", "max_rel_error": rel}
        return ErrorCode.NO_ERROR, {"costs": costs, "max_rel_error": rel}

    def _prepare(self, prog, program, inputs: dict) -> tuple:
        """Every parameter and workspace allocated at its physical shape, the inputs packed and uploaded, and
        one launch per kernel."""
        from tuner.runtime.launch import pack, physical_shape
        rt, arrays = self.runtime, {}
        for b in (*prog.params, *prog.workspaces):
            arrays[b.name] = rt.alloc(b.scope, tuple(physical_shape(b)), b.dtype.numpy)
            if b.name in inputs:
                rt.upload(arrays[b.name], pack(b, np.asarray(inputs[b.name])))
        launches = [rt.prepare(program, k.name, [arrays[p.name] for p in k.params], *k.launch())
                    for k in prog.kernels]
        return launches, arrays

    def _check(self, t, inp, prog, arrays) -> tuple:
        """``(max relative error, why it is wrong or "")`` of the template's output against its reference."""
        from tuner.measure.jobs import _inputs_and_reference
        from tuner.runtime.launch import unpack
        _, ref = _inputs_and_reference(inp.template, inp.workload, self.options.seed)
        buf = next(b for b in prog.params if b.name == t.output)
        got = np.asarray(unpack(buf, self.runtime.download(arrays[buf.name])), dtype=np.float64)
        if got.shape != ref.shape:
            return None, f"output shape {got.shape} vs reference {ref.shape}"
        rel = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))
        tol = t.tolerance(inp.workload)
        return rel, "" if rel <= tol else f"max relative error {rel:.3g} > tolerance {tol:g}"
