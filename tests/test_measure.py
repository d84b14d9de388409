"""Measurement: every error code from a real failing config, in worker processes with timeouts; failures
are never chosen as best."""
import os
from pathlib import Path

import pytest

from tuner.errors import ErrorCode
from tuner.logs import best_records
from tuner.measure import MeasureInput, MeasureOptions, Measurer
from tuner.search.loop import record_of as _record
from tuner.templates import get_template

ROOT = Path(__file__).resolve().parents[1]
BUFFERS = dict(input_scope="buffer", weight_scope="buffer", output_scope="buffer")


@pytest.fixture(autouse=True)
def _at_repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # worker processes import tests.faulty_templates from here


def test_every_error_code_from_a_real_failing_config(device):
    t = get_template("conv2d")
    wl = t.workload(data=(1, 8, 6, 6), kernel=(8, 8, 3, 3), padding=1)
    good = t.config(tile_ow=2, wg_w=2, **BUFFERS)
    cases = [
        ("conv2d", good, ErrorCode.NO_ERROR),
        ("conv2d", t.config(tile_ow=2, wg_w=64, wg_h=8, **BUFFERS), ErrorCode.INSTANTIATION),  # wider than the work
        ("tests.faulty_templates:NO_WORK_GROUP_LIMIT", t.config(tile_ow=1, wg_w=65536, **BUFFERS), ErrorCode.RUNTIME),
        ("tests.faulty_templates:COMPILE_ERROR", good, ErrorCode.COMPILE),
        ("tests.faulty_templates:WRONG_ANSWER", good, ErrorCode.WRONG_ANSWER),
        ("tests.faulty_templates:RUN_FOREVER", good, ErrorCode.RUN_TIMEOUT),
        ("tests.faulty_templates:BUILD_FOREVER", good, ErrorCode.BUILD_TIMEOUT),
        ("tests.faulty_templates:CRASH", good, ErrorCode.UNKNOWN),
        ("conv2d", t.config(tile_ow=4, wg_w=2, **BUFFERS), ErrorCode.NO_ERROR),  # workers recovered
    ]
    options = MeasureOptions(build_timeout=8, run_timeout=5, repeats=2, min_seconds=0, n_parallel=2)
    with Measurer(device, options) as m:
        results = m.measure([MeasureInput(name, wl, cfg) for name, cfg, _ in cases])
    for (name, cfg, expected), res in zip(cases, results):
        assert res.error_code == expected, f"{name}: {res.error_code.name} {res.error_msg[:300]}"
        assert res.ok == (expected == ErrorCode.NO_ERROR) and (res.error_msg != "") == (not res.ok)
    by_code = {e: r for (_, _, e), r in zip(cases, results)}
    assert "no_such_opencl_builtin" in by_code[ErrorCode.COMPILE].error_msg
    assert "max relative error" in by_code[ErrorCode.WRONG_ANSWER].error_msg
    assert "within 5 s" in by_code[ErrorCode.RUN_TIMEOUT].error_msg
    assert "wg_w_needed" in by_code[ErrorCode.INSTANTIATION].error_msg
    assert "WORK_GROUP" in by_code[ErrorCode.RUNTIME].error_msg.upper()
    assert results[0].max_rel_error < 1e-4 and len(results[0].costs) >= 2

    # failures are never the best record, whatever their timings
    records = [_record(t, wl, cfg, device.info, res, i, "test", "s") for i, ((_, cfg, _), res)
               in enumerate(zip(cases, results))]
    for r in records[1:-1]:
        r.median_s, r.gflops = 1e-9, 1e9  # a failure that claims to be fast
    (best,) = best_records(records).values()
    assert best.ok and best.error_code == 0 and best.config in (records[0].config, records[-1].config)


def test_a_worker_whose_device_faulted_is_replaced(monkeypatch):
    """A run that leaves the device unusable (a GPU's queue lost to a kernel's wild access; see
    tuner.measure.jobs._faulted) answers with ``restart``: the worker process is ended and the next call starts
    a fresh one, which opens the device again. The flag does not reach the caller. (On NVIDIA's OpenCL the
    config after such a fault failed too before this; the conformance suite checks it there.)"""
    import sys

    from tuner.measure import process

    script = ("import pickle, sys\n"
              "msg = pickle.load(sys.stdin.buffer)\n"
              "pickle.dump((7, {'msg': 'the device faulted', 'restart': msg[1][0]}), sys.stdout.buffer)\n"
              "sys.stdout.buffer.flush()\n"
              "pickle.load(sys.stdin.buffer)\n")  # then waits, as a worker does

    def start(self):
        self.proc = process.subprocess.Popen([sys.executable, "-c", script], stdin=process.subprocess.PIPE,
                                             stdout=process.subprocess.PIPE)
    monkeypatch.setattr(process.Worker, "_start", start)
    w = process.Worker("0")
    try:
        code, payload = w.call("run", (True,), 30, ErrorCode.RUN_TIMEOUT)
        assert (code, payload) == (7, {"msg": "the device faulted"}) and w.proc is None  # ended, flag removed
        code, payload = w.call("run", (False,), 30, ErrorCode.RUN_TIMEOUT)  # a fresh process answers
        assert code == 7 and w.proc is not None and w.proc.poll() is None  # no restart asked: it is kept
    finally:
        w.kill()


def test_a_worker_killed_from_two_threads_at_once_raises_nothing():
    """A measurer closing on Ctrl-C kills a builder whose own thread, its pipe gone, kills it too: the second
    ``kill`` that finds the process cleared under it by the first (here between its check and its wait) ends the
    process it found and raises nothing -- before, ``None.wait()`` put a traceback where exit 130 belongs."""
    import sys

    from tuner.measure import process

    w = process.Worker("0")
    w.proc = process.subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                      stdin=process.subprocess.PIPE, stdout=process.subprocess.PIPE)
    real = w.proc

    class Racing:  # the other thread's kill lands right after this one's poll
        def __getattr__(self, name):
            return getattr(real, name)

        def poll(self):
            w.proc = None
            return real.poll()
    w.proc = Racing()
    w.kill()
    assert real.returncode is not None and w.proc is None
    w.kill()  # and again, on nothing
