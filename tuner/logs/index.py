"""The one index of logged records: how a record is matched to a task, for every reader of a log.

A task's records are those with its ``Record.task_key`` (device, template, canonical workload key, scopes) whose
config holds the task's pinned knobs (``fixed``). Each reader asks this index, built once per set of records:
- compiling and planning (``ApplyHistoryBest``: the best record per task, per workload over any scopes, the
  records of one workload, the runners-up);
- tuning (``tuner.task.log_knowledge``: what a study already knows, and the template's other records
  for the sampler's transfer);
- model tuning (``tuner.compile.tuning``: what each task has measured, against its budget; the summaries);
- analysis reads the same records as a pandas frame (``tuner.analysis.frame``), grouped by the same key.

    index = LogIndex.of_log("logs/dev.jsonl")         # read again only when the file changed
    index.task(task.record_key(fp), task.fixed)       # every record of exactly this task, in log order
    index.best(task.record_key(fp))                    # the fastest successful one (no pinned knobs)

A measurement that was redone (``tuner.measure.drift.DriftGuard``: the device's clock or heat drifted while it
was measured) is superseded by its redo: the redo's record names the original's timestamp in ``replaces``, and
``current`` leaves the original out, so it counts nowhere (bests, tasks, transfer, the cost model). One line
carries both the new measurement and what it supersedes, so a tuner killed at any moment leaves either the
original counting or the redo, never neither.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from tuner.errors import TunerError
from tuner.logs.io import load_records
from tuner.logs.record import Record, canonical_json

INSTANTIATION = "INSTANTIATION"  # a config the template refused to build: a rejection, not a measurement


def holds(record: Record, fixed: dict | None) -> bool:
    """Whether ``record``'s config has the pinned knob values ``fixed`` (what makes it a record of a task with
    those knobs pinned, beside the task key)."""
    return all(record.config.get(k) == v for k, v in (fixed or {}).items())


def current(records) -> list:
    """``records`` without those a redo supersedes: a record whose task key, config and timestamp a record of
    ``records`` names (its task key and config, a timestamp in its ``replaces``). Order kept; the list itself
    when nothing is redone (every log without a drift: one pass over the records' ``replaces``)."""
    records = records if isinstance(records, list) else list(records)
    redone = [r for r in records if r.replaces]
    if not redone:
        return records
    stamps = {ts for r in redone for ts in r.replaces}
    replaced = {(r.task_key, canonical_json(r.config), ts) for r in redone for ts in r.replaces}
    return [r for r in records if r.timestamp not in stamps
            or (r.task_key, canonical_json(r.config), r.timestamp) not in replaced]


def workload_json(workload) -> str:
    """A workload (its key dict or a template's workload object) as the index's canonical JSON."""
    return canonical_json(workload if isinstance(workload, dict) else workload.key())


class LogIndex:
    """Records grouped once: by task key (all of them, in log order), by workload over scopes and by template
    (the successful ones), with the best record per task and per workload. Records are never copied. Records
    superseded by a redo (``current``) are left out of all of it; ``superseded`` counts them."""

    def __init__(self, records: Iterable[Record]):
        given = list(records)
        self.records = current(given)
        self.superseded = len(given) - len(self.records)
        self._tasks: dict = {}  # task_key -> [Record], log order
        self._workloads: dict = {}  # (device, template, workload json) -> [ok Record]
        self._templates: dict = {}  # template -> [ok Record]
        self._best: dict = {}  # task_key -> the ok Record with the lowest median (ties: the earlier)
        self._any_scope: dict = {}  # (device, template, workload json) -> the best of its tasks' bests
        for r in self.records:
            k = r.task_key  # computed (two canonical JSON dumps), so once per record
            self._tasks.setdefault(k, []).append(r)
            if not r.ok:
                continue
            self._workloads.setdefault(k[:3], []).append(r)
            self._templates.setdefault(r.template, []).append(r)
            if k not in self._best or r.median_s < self._best[k].median_s:
                self._best[k] = r
        for k, r in self._best.items():
            if k[:3] not in self._any_scope or r.median_s < self._any_scope[k[:3]].median_s:
                self._any_scope[k[:3]] = r
        self._ranked: dict = {}  # task_key -> its ok records, fastest first (built on first ask)

    # -- one task ------------------------------------------------------------------------------------------
    def task(self, key: tuple, fixed: dict | None = None, ok: bool = False, measured: bool = False) -> list:
        """The records of the task ``key`` (``Record.task_key``) with the pinned knobs ``fixed``, in log order;
        ``ok``: the successful ones only; ``measured``: without the configs the template refused to build."""
        return [r for r in self._tasks.get(key, ()) if holds(r, fixed) and (r.ok or not ok)
                and not (measured and r.error_name == INSTANTIATION)]

    def best(self, key: tuple, fixed: dict | None = None) -> Record | None:
        """The task's fastest successful record (with the pinned knobs ``fixed``), or None."""
        if not fixed:
            return self._best.get(key)
        ranked = self.ranked(key, fixed)
        return ranked[0] if ranked else None

    def ranked(self, key: tuple, fixed: dict | None = None) -> list:
        """The task's successful records (with the pinned knobs ``fixed``), fastest first (ties: log order)."""
        if key not in self._ranked:
            self._ranked[key] = sorted(self.task(key, ok=True), key=lambda r: r.median_s)
        return [r for r in self._ranked[key] if holds(r, fixed)]

    # -- wider -------------------------------------------------------------------------------------------
    def workload(self, device: str, template: str, workload) -> list:
        """The successful records of one workload of a template on a device, over every scope, log order."""
        return self._workloads.get((device, template, workload_json(workload)), [])

    def best_any_scope(self, device: str, template: str, workload) -> Record | None:
        """The fastest of the per-scope bests of one workload on a device."""
        return self._any_scope.get((device, template, workload_json(workload)))

    def template(self, name: str) -> list:
        """The successful records of a template, every device and workload, log order."""
        return self._templates.get(name, [])

    def bests(self) -> dict:
        """``task_key -> Record``: every task's fastest successful record."""
        return self._best

    def on(self, fingerprint: str) -> "DeviceLog":
        """The index as the device ``fingerprint`` sees it (what each of its tasks has measured)."""
        return DeviceLog(self, fingerprint)

    def __len__(self) -> int:
        return len(self.records)

    # -- from files --------------------------------------------------------------------------------------
    @classmethod
    def of_log(cls, path) -> "LogIndex":
        """The index of the log at ``path`` (empty if there is none), built again only when the file changed:
        a model's tasks each ask the same device log."""
        p = Path(path)
        try:
            st = p.stat()
        except FileNotFoundError:
            return cls(())
        key = (str(p.resolve()), st.st_mtime_ns, st.st_size)
        cached = _CACHE.get(key[0])
        if cached is None or cached[0] != key:
            try:
                records = load_records(p)
            except (FileNotFoundError, TunerError):
                if p.exists():
                    raise
                return cls(())  # gone since the stat: a writability probe's file, or a removed log
            _CACHE[key[0]] = (key, cls(records))
        return _CACHE[key[0]][1]


_CACHE: dict = {}  # resolved path -> ((path, mtime, size), LogIndex)


class DeviceLog:
    """A ``LogIndex`` seen from one device: ``of(task)`` is every measurement of exactly that task there (a
    ``TuningTask``: its key on the device and its pinned knobs), the template's refusals left out."""

    def __init__(self, index: LogIndex, fingerprint: str):
        self.index, self.fingerprint = index, fingerprint

    def of(self, task) -> list:
        return self.index.task(task.record_key(self.fingerprint), task.fixed, measured=True)

    def count(self, task) -> int:
        """How many measurements the task has on the device."""
        return len(self.of(task))
