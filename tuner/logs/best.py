"""Pick tuned configs from logs: the fastest successful record per task, AutoTVM's ``ApplyHistoryBest``.

Compiling a model asks ``current_history().pick(...)`` per operator; the history is installed with
``with apply_history_best("logs/*.jsonl"):`` so that the code building operators needs no log argument.
An operator nobody tuned still has to run, so a miss returns the template's fallback config and warns once.
"""
from __future__ import annotations

import math
import os
import warnings
from typing import Iterable

from tuner.errors import TunerError
from tuner.logs.io import load_records
from tuner.logs.record import Record, canonical_json, scope_knobs, task_key

_STACK: list["ApplyHistoryBest"] = []


class FallbackConfigWarning(UserWarning):
    """No tuned config for a workload: the template's fallback is used (slower, but correct)."""


class OtherDriverWarning(UserWarning):
    """Tuned configs of the same device under another driver version apply (none of this driver's records)."""


class InvalidLoggedConfigWarning(UserWarning):
    """A logged config that the template's space rejects was skipped (never deployed)."""


def invalid_config(template, workload, device, config: dict) -> str | None:
    """None when ``config`` (a record's knob dict) is a valid config of ``template`` for ``workload`` on
    ``device`` (a DeviceInfo: its capabilities decide constraints such as image limits), else why not."""
    try:
        wl = _workload_obj(template, workload)
        cfg = template.config(**config)
    except (TypeError, ValueError) as e:
        return f"its knobs do not fit the template: {e}"
    try:
        bad = template.space(wl, device).violations(template.config_values(wl, cfg))
    except (TunerError, TypeError, ValueError) as e:
        return str(e)
    return "; ".join(bad) or None


EPILOGUE = ("bias", "activation", "residual")  # workload fields that change what follows the sum, not the loop nest


def workload_distance(a: dict, b: dict) -> float:
    """How far workload key ``b`` is from ``a`` for a config to carry over: 0 for the same shapes with another
    epilogue; else the summed |log2| ratio of every size (channels, spatial, kernel, ...) plus 4 for each
    other difference (stride, dilation, groups, dtype)."""
    d = 0.0
    for k in set(a) | set(b):
        if k in EPILOGUE or k == "op":
            continue
        x, y = a.get(k), b.get(k)
        xs = x if isinstance(x, (list, tuple)) else [x]
        ys = y if isinstance(y, (list, tuple)) else [y]
        if len(xs) != len(ys):
            d += 4.0
            continue
        for u, v in zip(xs, ys):
            if isinstance(u, (int, float)) and isinstance(v, (int, float)) and not isinstance(u, bool) \
                    and k in ("data", "kernel", "weight"):
                d += abs(math.log2((abs(u) + 1) / (abs(v) + 1)))
            elif u != v:
                d += 4.0
    return d


def best_records(records: Iterable[Record]) -> dict:
    """``task_key -> Record``: the successful record with the lowest median; failures are never picked,
    whatever their (partial) timings. Ties go to the earlier record."""
    best: dict = {}
    for r in records:
        if r.ok and (r.task_key not in best or r.median_s < best[r.task_key].median_s):
            best[r.task_key] = r
    return best


def _workload_key(workload) -> dict:
    return workload if isinstance(workload, dict) else workload.key()


def _workload_obj(template, workload):
    if not isinstance(workload, dict):
        return workload
    return template.workload(**{k: v for k, v in workload.items() if k != "op"})


def _to_records(log_or_records) -> list[Record]:
    if isinstance(log_or_records, (str, os.PathLike)):
        return load_records(log_or_records)
    records, paths = [], []
    for item in log_or_records:
        (records if isinstance(item, Record) else paths).append(item)
    return records + (load_records(paths) if paths else [])


class ApplyHistoryBest:
    """The best configs of a set of records, queryable per (template, workload, device, scopes).

    Also a context manager: inside ``with``, ``current_history()`` returns it (innermost wins)."""

    def __init__(self, log_or_records):
        """``log_or_records``: a log path or glob, a list of paths/globs, or Records (mixed is fine)."""
        self.records = _to_records(log_or_records)
        self.best = best_records(self.records)
        # scopes=None picks across scopes: the fastest of the per-scope bests of one workload on one device
        self._any_scope: dict = {}
        for r in self.best.values():
            k = r.task_key[:3]
            if k not in self._any_scope or r.median_s < self._any_scope[k].median_s:
                self._any_scope[k] = r
        self._warned: set = set()

    def for_device(self, info) -> "ApplyHistoryBest":
        """This history as seen from ``info`` (a DeviceInfo): the fingerprint hashes the driver version, so an
        over-the-air driver update would drop every tuned config to its fallback. Tuned choices belong to the
        device model (platform and name); so a task this driver has no record of takes the records of the same
        device under other drivers, ranked below this driver's own (they only fill what it lacks), with one
        warning that names the drivers. Program binaries stay keyed by driver (``runtime.program``)."""
        fp = info.fingerprint
        mine = {r.task_key[1:] for r in self.records if r.ok and r.device == fp}
        others = [r for r in self.records if r.ok and r.device != fp and r.platform == info.platform
                  and r.device_name == info.name and r.task_key[1:] not in mine]
        if not others:
            return self
        import dataclasses
        drivers = sorted({r.driver or "?" for r in others})
        tasks = {r.task_key[1:] for r in others}
        warnings.warn(f"{len(tasks)} tuned task(s) come from records of {info.name} under driver "
                      f"{', '.join(drivers)}; this one runs driver {info.driver_version or '?'} ({fp}), which has "
                      f"none of its own for them: re-tune to measure them under this driver",
                      OtherDriverWarning, stacklevel=2)
        adopted = [dataclasses.replace(r, device=fp) for r in others]
        out = ApplyHistoryBest(self.records + adopted)
        out.adopted = {r.task_key for r in adopted}
        return out

    adopted: set = frozenset()  # task keys answered by another driver's records (for_device)

    def query(self, template_name: str, workload, device_fingerprint: str, scopes: dict | None,
              fixed: dict | None = None) -> Record | None:
        """The best record of the task, or None. ``workload``: the key dict (or a workload object);
        ``scopes=None``: the best over any scopes; ``fixed``: only configs with these knob values."""
        wl = canonical_json(_workload_key(workload))
        if fixed:
            best = None
            for r in self.records:
                if (r.ok and r.device == device_fingerprint and r.template == template_name
                        and canonical_json(r.workload) == wl and (scopes is None or r.scopes == scopes)
                        and all(r.config.get(k) == v for k, v in fixed.items())
                        and (best is None or r.median_s < best.median_s)):
                    best = r
            return best
        if scopes is None:
            return self._any_scope.get((device_fingerprint, template_name, wl))
        return self.best.get(task_key(device_fingerprint, template_name, _workload_key(workload), scopes))

    def pick(self, template, workload, device, scopes: dict | None = None, fixed: dict | None = None):
        """The config to build ``workload`` with on ``device`` (Device or DeviceInfo): the best tuned one,
        else the template's fallback for the device with ``scopes`` (and ``fixed`` knobs) applied
        (``Template.fallback_with``: valid for the space), warning once per workload."""
        info = getattr(device, "info", device)
        record = self.best_valid(template, workload, info, scopes, fixed)
        if record is not None:
            return template.config(**record.config)
        key = _workload_key(workload)
        warn_key = (info.fingerprint, template.name, canonical_json(key))
        if warn_key not in self._warned:
            self._warned.add(warn_key)
            warnings.warn(f"no tuned config for {template.name} {canonical_json(key)} on {info.fingerprint}: "
                          f"using the fallback config", FallbackConfigWarning, stacklevel=2)
        return template.fallback_with(_workload_obj(template, workload), info, **scope_knobs(scopes),
                                      **(fixed or {}))

    def best_valid(self, template, workload, device, scopes: dict | None = None,
                   fixed: dict | None = None) -> Record | None:
        """``query``'s record if its config is valid for the template's space on ``device`` (a DeviceInfo),
        else the next fastest valid one of the task, else None. The log is a file users share: a config the
        space rejects (edited by hand, or from another template version) is never deployed; each one skipped
        warns once."""
        info = getattr(device, "info", device)
        record = self.query(template.name, workload, info.fingerprint, scopes, fixed)
        if record is None:
            return None
        for rec in [record] + self._runners_up(template.name, workload, info.fingerprint, scopes, fixed, record):
            why = invalid_config(template, workload, info, rec.config)
            if why is None:
                return rec
            self._warn_once(("invalid", rec.timestamp, rec.trial, canonical_json(rec.config)),
                            f"the log's {template.name} config {canonical_json(rec.config)} for "
                            f"{canonical_json(_workload_key(workload))} is not valid for the template's space "
                            f"({why}): skipped", InvalidLoggedConfigWarning)
        return None

    def transfer(self, template, workload, device, scopes: dict | None = None, fixed: dict | None = None):
        """``(config, Record it came from)`` for a task this device has no record of, or None: the configs the
        device's log holds for the same template, nearest workload first (``workload_distance``: the same
        shapes with another epilogue are nearest), the first one the template's space accepts for this workload
        with ``fixed`` applied. Every pick is checked against the space; none is ever invalid."""
        info = getattr(device, "info", device)
        key = _workload_key(workload)
        cands = [r for r in self.best.values() if r.device == info.fingerprint and r.template == template.name
                 and (scopes is None or r.scopes == scopes)]
        cands.sort(key=lambda r: (workload_distance(key, r.workload), r.median_s))
        for r in cands[:64]:
            cfg = {**r.config, **(fixed or {})}
            if invalid_config(template, workload, info, cfg) is None:
                return template.config(**cfg), r
        return None

    def _runners_up(self, template_name, workload, fingerprint, scopes, fixed, first) -> list:
        wl = canonical_json(_workload_key(workload))
        same = [r for r in self.records if r.ok and r is not first and r.device == fingerprint
                and r.template == template_name and canonical_json(r.workload) == wl
                and (scopes is None or r.scopes == scopes)
                and all(r.config.get(k) == v for k, v in (fixed or {}).items())]
        return sorted(same, key=lambda r: r.median_s)

    def _warn_once(self, key, message: str, category) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, category, stacklevel=3)

    def __len__(self) -> int:
        return len(self.best)

    def __enter__(self) -> "ApplyHistoryBest":
        _STACK.append(self)
        return self

    def __exit__(self, *exc) -> None:
        # remove this one even if an inner context leaked, so the stack cannot keep a stale history
        for i in range(len(_STACK) - 1, -1, -1):
            if _STACK[i] is self:
                del _STACK[i:]
                break

    def __repr__(self) -> str:
        return f"ApplyHistoryBest({len(self.records)} records, {len(self.best)} tasks)"


def apply_history_best(log_or_records) -> ApplyHistoryBest:
    """``ApplyHistoryBest(log_or_records)``; use it plainly or as ``with apply_history_best(...) as h:``."""
    return ApplyHistoryBest(log_or_records)


def current_history() -> ApplyHistoryBest | None:
    """The innermost history entered with ``with``, or None outside any."""
    return _STACK[-1] if _STACK else None
