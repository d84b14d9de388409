"""``DriftGuard``: measurements a phone can be trusted for.

A phone's GPU clock and temperature move during a long tune: it heats, throttles, cools, and the same kernel
runs 10-40% slower for a while. A tuner that does not notice ranks configs by when they were measured.
``DriftGuard`` wraps any Runner and watches for that:

- **a reference config**: the first config it sees measured successfully. Its time, the GPU clock and the
  temperature then are the baseline.
- **checks**: every ``every`` measurements the reference is timed again (``checks``; a time off the baseline
  is timed once more, and only a second one off too counts: noise passes, throttling stays); and every
  measurement's GPU clock (``MeasureResult.gpu_clock_hz``, read by the runner, else by the guard's
  ``sensors``) is compared with the baseline's. Either one off by more than ``threshold`` (relative) is a
  drift (``drifts``).
- **on a drift** it says so (``say``), then waits, polling ``sensors`` every ``poll_s`` seconds, up to
  ``max_wait_s``, until the clock is within ``threshold`` of the baseline's and the temperature no more than
  ``temp_margin_c`` above the baseline's (a device without sensors: until the reference times within
  ``threshold`` of its baseline again). ``waited_s`` adds up the waits. It then times the reference again as
  the new baseline (after a wait that ran out: the device's state now is the new normal, and it says so).
- **then it redoes** every measurement made since the last good check (``redone``): successes and run
  timeouts; a compile error or a wrong answer does not depend on the clock. The current batch's are returned
  redone. Earlier ones were already returned, and their caller logged them: the guard appends their redone
  records to ``log`` itself, each naming the record it supersedes (``Record.replaces``: the original's
  timestamp; its trial, sampler and study copied from the log). Readers of the log then count the redo and not
  the original (``tuner.logs.index.current``: ``LogIndex``, ``apply_history_best``, ``best_records``).
  A redo that drifts again is redone again, up to ``max_rounds`` times; then the guard keeps what it has and
  says so.

Every check, wait and redo is an ``Event`` in ``events`` (its reading, the reference's time, how far each was
off), so a run can show what the device did.

    with DriftGuard(RuntimeRunner(AgentRuntime("adb://")), log="logs/phone.jsonl", say=print) as guard:
        tune("conv2d", wl, device=guard, measurer=guard, log="logs/phone.jsonl", trials=200)
        print(guard.checks, guard.drifts, guard.waited_s, guard.redone)
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field

from tuner.errors import ErrorCode, TunerError
from tuner.measure.runner import MeasureInput, MeasureResult, Runner
from tuner.measure.sensors import Reading, read as read_sysfs

REDO = (ErrorCode.NO_ERROR, ErrorCode.RUN_TIMEOUT)  # results a drift may have changed: timings and run timeouts


@dataclass
class Event:
    """One thing the guard saw or did. ``kind``: ``baseline`` (a reference timed as the baseline), ``check``
    (the reference timed again), ``clock`` (a measurement's GPU clock off the baseline's), ``wait`` (one poll
    while waiting), ``recovered`` / ``gave_up`` (the end of a wait), ``redo`` (measurements redone),
    ``kept`` (still drifting after ``max_rounds`` redos). ``measured``: measurements handed back before it;
    ``median_s`` and ``time_rel``: the reference's time and its relative change from the baseline's;
    ``clock_rel``: the clock's relative change from the baseline's; ``waited_s``: seconds waited so far in
    this wait."""
    kind: str
    measured: int
    reading: Reading = field(default_factory=Reading)
    median_s: float | None = None
    time_rel: float | None = None
    clock_rel: float | None = None
    waited_s: float = 0.0
    note: str = ""


@dataclass
class _Entry:
    """A measurement handed back since the last good check: its input, its current result and, while its batch
    is being measured, its index there (None once it was handed back: then its caller has logged it)."""
    inp: MeasureInput
    result: MeasureResult
    index: int | None


def _rel(now: float | None, base: float | None) -> float | None:
    if now is None or base is None or base <= 0:
        return None
    return abs(now - base) / base


def _mhz(hz: int | None) -> str:
    return "?" if hz is None else f"{hz / 1e6:.0f} MHz"


def _say_stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class DriftGuard(Runner):
    """Wraps ``inner`` (any Runner) and keeps its measurements comparable while the device's clock and heat
    drift (the module docstring says how).

    ``log``: the tuning log the caller appends its records to (the guard appends the redone earlier
    measurements there). ``every``: measurements between two re-timings of the reference. ``threshold``: the
    relative change of the reference's time or of the GPU clock that is a drift. ``max_wait_s``, ``poll_s``:
    how long to wait for the device at most, and how often to read its sensors meanwhile.
    ``temp_margin_c``: how far above the baseline's temperature the device may be when the wait ends.
    ``sensors``: a callable returning a ``Reading`` (default: ``inner.sensors`` where the inner runner has one,
    e.g. ``RuntimeRunner``'s through the agent, else this host's sysfs, ``tuner.measure.sensors.read``).
    ``sleep``: how to wait (``time.sleep``; tests pass a fake). ``say``: where messages go (default: stderr).
    ``max_rounds``: redos of one drift's measurements before the guard keeps them as they are."""

    def __init__(self, inner: Runner, log, every: int = 16, threshold: float = 0.08, max_wait_s: float = 120.0,
                 poll_s: float = 2.0, sensors=None, sleep=time.sleep, say=None, temp_margin_c: float = 2.0,
                 max_rounds: int = 3):
        if not isinstance(inner, Runner):
            raise TunerError(f"DriftGuard wraps a Runner (Measurer, RuntimeRunner, ...), not "
                             f"{type(inner).__name__}: open one with tuner.measure.open_runner(device)")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise TunerError(f"DriftGuard every={every!r}: the measurements between two checks, an integer >= 1")
        for name, v, lo, hi in (("threshold", threshold, 0.0, 10.0), ("max_wait_s", max_wait_s, 0.0, 86400.0),
                                ("poll_s", poll_s, 0.0, 3600.0), ("temp_margin_c", temp_margin_c, 0.0, 100.0)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi \
                    or (name in ("threshold", "poll_s") and v == 0):
                strict = name in ("threshold", "poll_s")
                raise TunerError(f"DriftGuard {name}={v!r}: give a number {'>' if strict else '>='} {lo:g} and "
                                 f"<= {hi:g}")
        if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
            raise TunerError(f"DriftGuard max_rounds={max_rounds!r}: an integer >= 1")
        if log is None:
            raise TunerError("DriftGuard needs the tuning log (log=PATH) that the caller appends to: the redone "
                             "measurements go there")
        from tuner.logs.io import ensure_writable
        self.log = str(ensure_writable(log))
        if sensors is None:
            sensors = getattr(inner, "sensors", None)
            sensors = sensors if callable(sensors) else read_sysfs
        for name, fn in (("sensors", sensors), ("sleep", sleep)):
            if not callable(fn):
                raise TunerError(f"DriftGuard {name}={fn!r} is not callable")
        self.inner, self.info = inner, inner.info
        self.every, self.threshold = every, float(threshold)
        self.max_wait_s, self.poll_s, self.temp_margin_c = float(max_wait_s), float(poll_s), float(temp_margin_c)
        self.max_rounds = max_rounds
        self._sensors, self._sleep, self._say = sensors, sleep, say or _say_stderr
        self.reference: MeasureInput | None = None
        self.base_median: float | None = None
        self.base_reading = Reading()
        self.checks = self.drifts = self.redone = 0
        self.waited_s = 0.0
        self.events: list = []
        self.measured = 0  # measurements handed back
        self._pending: list = []  # _Entry: handed back (or being measured) since the last good check
        self._since = 0  # measurements since the last good check

    # -- Runner ----------------------------------------------------------------------------------------------
    def close(self) -> None:
        self.inner.close()

    def sensors(self) -> Reading:
        """The device's reading now (the ``sensors`` callable), never an exception but a lost link."""
        try:
            got = self._sensors()
        except (TunerError, OSError) as e:
            from tuner.measure.runtime_runner import _link_errors
            if isinstance(e, _link_errors()):
                raise
            return Reading()
        if not isinstance(got, Reading):
            raise TunerError(f"DriftGuard's sensors returned {type(got).__name__}, not a "
                             f"tuner.measure.sensors.Reading")
        return got

    def measure(self, inputs: list) -> list:
        inputs = list(inputs)
        if not inputs:
            return []
        results = self._measure(inputs)
        entries = [_Entry(inp, res, i) for i, (inp, res) in enumerate(zip(inputs, results))]
        if self.reference is None:
            self._adopt(entries)
        self._pending += entries
        self._since += len(entries)
        try:
            self._settle(entries)
        except BaseException:  # a lost link, Ctrl-C: this batch is not handed back, so nobody logs it
            self._pending = [e for e in self._pending if e.index is None]
            raise
        for e in self._pending:
            e.index = None  # handed back now: the caller logs them
        self.measured += len(inputs)
        return [e.result for e in entries]

    def _settle(self, fresh: list) -> None:
        """Check what was just measured (``fresh``) and, on a drift, wait, re-baseline and redo, until a check
        passes or ``max_rounds`` redos."""
        for round_ in range(self.max_rounds + 1):
            why = self._clock_off(fresh)
            if why is None and self.reference is not None and self._since >= self.every:
                why = self._check()
                if why is None:
                    self._pending, self._since = [], 0
            if why is None:
                break
            if round_ == self.max_rounds:
                self._event("kept", note=why)
                self._say(f"drift guard: still drifting after {self.max_rounds} redos ({why}); keeping these "
                          f"measurements as they are")
                self._pending, self._since = [], 0
                break
            self.drifts += 1
            self._say(f"drift guard: {why}; waiting for the device to recover (up to {self.max_wait_s:g} s)")
            self._wait()
            self._rebaseline()
            fresh = self._redo()

    # -- measuring ---------------------------------------------------------------------------------------
    def _measure(self, inputs: list) -> list:
        """The inner runner's results; where it read no clock nor temperature for a measurement that reached
        the device, the guard's reading after the batch."""
        results = self.inner.measure(inputs)
        if len(results) != len(inputs):
            raise TunerError(f"{type(self.inner).__name__}.measure returned {len(results)} results for "
                             f"{len(inputs)} inputs")
        bare = [r for r in results if r.error_code in REDO and r.gpu_clock_hz is None and r.temp_c is None]
        if bare:
            reading = self.sensors()
            for r in bare:
                r.gpu_clock_hz, r.temp_c = reading.gpu_clock_hz, reading.temp_c
        return results

    def _adopt(self, entries: list) -> None:
        """The first successful measurement's config becomes the reference; its time and reading the baseline."""
        for e in entries:
            if e.result.ok:
                self.reference = e.inp
                self._set_baseline(e.result)
                return

    def _set_baseline(self, res: MeasureResult) -> None:
        self.base_median = res.median
        self.base_reading = Reading(res.gpu_clock_hz, res.temp_c)
        self._event("baseline", res.median, reading=self.base_reading)

    def _clock_off(self, entries: list) -> str | None:
        """Why the clock of one of ``entries`` is a drift, or None."""
        base = self.base_reading.gpu_clock_hz
        for e in entries:
            rel = _rel(e.result.gpu_clock_hz, base)
            if rel is not None and rel > self.threshold:
                reading = Reading(e.result.gpu_clock_hz, e.result.temp_c)
                self._event("clock", reading=reading, clock_rel=rel)
                return (f"the GPU clock read {_mhz(e.result.gpu_clock_hz)}, {rel:.0%} off the baseline's {_mhz(base)} "
                        f"({len(self._pending)} measurement(s) since the last good check)")
        return None

    def _time_reference(self) -> MeasureResult:
        return self._measure([self.reference])[0]

    def _check(self) -> str | None:
        """Time the reference again: why it is a drift (its time or clock off, or a failure), or None. A time
        off the baseline (or a failure) with the clock where it was is timed once more, and only a second one
        off too is a drift: a throttled device stays slow, a moment's noise (another process, a notification)
        does not."""
        self.checks += 1
        for attempt in (1, 2):
            res = self._time_reference()
            rel = _rel(res.median, self.base_median)
            clock = _rel(res.gpu_clock_hz, self.base_reading.gpu_clock_hz)
            clock_off = clock is not None and clock > self.threshold
            off = not res.ok or rel > self.threshold
            note = "" if res.ok else f"{res.error_code.name}: {res.error_msg[:200]}"
            if off and not clock_off and attempt == 1:
                note = (note + "; " if note else "") + "off the baseline: timed once more"
            self._event("check", res.median, rel, clock, reading=Reading(res.gpu_clock_hz, res.temp_c), note=note)
            if not off or clock_off:
                break
        if not res.ok:
            return f"the reference config failed ({res.error_code.name}: {res.error_msg[:200]})"
        if rel > self.threshold:
            return (f"the reference config timed {res.median * 1e3:.4g} ms, {rel:.0%} off its baseline "
                    f"{self.base_median * 1e3:.4g} ms ({len(self._pending)} measurement(s) since the last good check)")
        if clock is not None and clock > self.threshold:
            return (f"the GPU clock read {_mhz(res.gpu_clock_hz)}, {clock:.0%} off the baseline's "
                    f"{_mhz(self.base_reading.gpu_clock_hz)}")
        return None

    # -- waiting -------------------------------------------------------------------------------------------
    def _recovered(self) -> tuple:
        """``(whether the device is back, the reading, the reference's time when it was timed)``."""
        base = self.base_reading
        now = self.sensors()
        if self.reference is None:
            return True, now, None
        clock_known = base.gpu_clock_hz is not None and now.gpu_clock_hz is not None
        temp_known = base.temp_c is not None and now.temp_c is not None
        if clock_known or temp_known:
            ok = not clock_known or _rel(now.gpu_clock_hz, base.gpu_clock_hz) <= self.threshold
            ok = ok and (not temp_known or now.temp_c <= base.temp_c + self.temp_margin_c)
            return ok, now, None
        res = self._time_reference()  # no sensors: the reference's time says
        rel = _rel(res.median, self.base_median)
        return res.ok and rel is not None and rel <= self.threshold, Reading(res.gpu_clock_hz, res.temp_c), res.median

    def _wait(self) -> None:
        waited = 0.0
        while True:
            ok, reading, median = self._recovered()
            self._event("wait", median, _rel(median, self.base_median),
                        _rel(reading.gpu_clock_hz, self.base_reading.gpu_clock_hz), reading=reading, waited=waited)
            if ok:
                self._event("recovered", reading=reading, waited=waited)
                self._say(f"drift guard: the device is back ({reading.describe()}) after {waited:g} s")
                return
            if waited >= self.max_wait_s:
                self._event("gave_up", reading=reading, waited=waited)
                self._say(f"drift guard: the device did not recover within {self.max_wait_s:g} s "
                          f"({reading.describe()}; baseline {self.base_reading.describe()}); its state now is the "
                          f"new baseline")
                return
            step = min(self.poll_s, self.max_wait_s - waited)
            self._sleep(step)
            waited += step
            self.waited_s += step

    def _rebaseline(self) -> None:
        res = self._time_reference()
        if res.ok:
            self._set_baseline(res)
            return
        self._say(f"drift guard: the reference config failed when timed again ({res.error_code.name}); the next "
                  f"successful measurement becomes the reference")
        self.reference, self.base_median, self.base_reading = None, None, Reading()

    # -- redoing -----------------------------------------------------------------------------------------
    def _redo(self) -> list:
        """Measure the pending entries that a drift may have changed again; log the redone earlier ones (each
        superseding its record); the redone entries, now the pending ones."""
        todo = [e for e in self._pending if e.result.error_code in REDO]
        if not todo:
            self._pending, self._since = [], 0
            return []
        results = self._measure([e.inp for e in todo])
        earlier = [(e, res) for e, res in zip(todo, results) if e.index is None]
        if earlier:
            self._log_redone(earlier)
        for e, res in zip(todo, results):
            e.result = res
        self.redone += len(todo)
        self._event("redo", note=f"{len(todo)} measurement(s) redone, {len(earlier)} of them already logged")
        self._say(f"drift guard: redid {len(todo)} measurement(s) made since the last good check"
                  + (f" ({len(earlier)} appended to {self.log}, superseding their records)" if earlier else ""))
        if self.reference is None:
            self._adopt(todo)
        self._pending, self._since = todo, len(todo)
        return todo

    def _log_redone(self, pairs: list) -> None:
        """Append the redone records of measurements the caller logged already, each naming the record it
        supersedes (``replaces``), with that record's trial, sampler and study (found in the log by
        timestamp; a measurement the caller did not log gets none)."""
        from tuner.logs.io import append_records, find_records
        from tuner.logs.record import Record, canonical_json
        fp = self.info.fingerprint
        originals = {}
        for r in find_records(self.log, [e.result.timestamp for e, _ in pairs]):
            if r.device == fp:
                originals[(canonical_json(r.workload), canonical_json(r.config), r.timestamp)] = r
        out = []
        for e, res in pairs:
            old = e.result
            cfg = e.inp.config if isinstance(e.inp.config, dict) else _asdict(e.inp.config)
            key = e.inp.workload if isinstance(e.inp.workload, dict) else e.inp.workload.key()
            orig = originals.get((canonical_json(key), canonical_json(cfg), old.timestamp))
            out.append(Record.new(orig.template if orig else e.inp.template, e.inp.workload, cfg, self.info,
                                  costs=res.costs if res.ok else (), error_code=res.error_code,
                                  error_msg=res.error_msg[:4000], max_rel_error=res.max_rel_error,
                                  timestamp=res.timestamp, duration_s=res.duration_s,
                                  trial=orig.trial if orig else None, sampler=orig.sampler if orig else None,
                                  study=orig.study if orig else None, gpu_clock_hz=res.gpu_clock_hz,
                                  temp_c=res.temp_c, replaces=[old.timestamp] if old.timestamp else []))
        append_records(self.log, out)

    def _event(self, kind: str, median_s=None, time_rel=None, clock_rel=None, reading: Reading | None = None,
               waited: float = 0.0, note: str = "") -> None:
        self.events.append(Event(kind, self.measured, reading or Reading(), median_s, time_rel, clock_rel, waited,
                                 note))


def _asdict(config) -> dict:
    import dataclasses
    return dataclasses.asdict(config)
