"""Pick tuned configs from logs: the fastest successful record per task, AutoTVM's ``ApplyHistoryBest``.

Compiling a model asks ``current_history().pick(...)`` per operator; the history is installed with
``with apply_history_best("logs/*.jsonl"):`` so that the code building operators needs no log argument.
An operator nobody tuned still has to run, so a miss returns the template's fallback config and warns once.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from tuner.errors import TunerError
from tuner.logs.index import LogIndex, holds
from tuner.logs.io import load_records
from tuner.logs.record import Record, canonical_json, scope_knobs, task_key

_STACK: list["ApplyHistoryBest"] = []


class FallbackConfigWarning(UserWarning):
    """No tuned config for a workload: the template's fallback is used (slower, but correct)."""


SIBLING_WEIGHT = 0.5  # a named sibling device's records in a cost model, beside this device's (weight 1)


class OtherDriverWarning(UserWarning):
    """Tuned configs of the same device under another driver version apply (none of this driver's records)."""


class InvalidLoggedConfigWarning(UserWarning):
    """A logged config that the template's space rejects was skipped (never deployed)."""


class SiblingConfigWarning(UserWarning):
    """Configs tuned on a named sibling device (``transfer_from``) fill tasks this device has no record of."""


class SiblingDeviceHint(UserWarning):
    """The logs hold records of a device of the same family as this one; they apply only when named."""


OTHER_DTYPE = {"float32": "float16", "float16": "float32"}  # storage dtypes whose records transfer (for_dtype)
FINGERPRINT = re.compile(r"^[a-z0-9][a-z0-9-]{0,80}$")
AUTO = "auto"  # transfer_from=["auto"]: every device of this one's family that the logs hold


def device_family(platform: str, type_: str, name: str) -> tuple:
    """What makes two devices siblings: the same platform and type, and the same name up to its first digit
    (``NVIDIA H200`` and ``NVIDIA H100 80GB HBM3`` are ``nvidia h``; ``Adreno (TM) 640`` and ``650`` are
    ``adreno``; ``Mali-G78`` and ``Mali-G710`` are ``mali-g``)."""
    head = re.split(r"\d", re.sub(r"\((tm|r)\)", "", name.lower()), maxsplit=1)[0]
    return platform, type_.upper(), " ".join(head.split())


def parse_transfer_from(value) -> list:
    """``transfer_from`` as a list of fingerprints (or ``"auto"``): a comma-separated string, a list, or None
    (``[]``). A value that is no fingerprint is a TunerError naming it and where fingerprints are listed."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    out = []
    for item in items:
        fp = str(getattr(item, "fingerprint", item)).strip().lower()  # a DeviceInfo is taken by its fingerprint
        if not fp:
            continue
        if fp != AUTO and not FINGERPRINT.match(fp):
            raise TunerError(f"--transfer-from {str(item)!r} is not a device fingerprint (like nvidia-gpu-fcae3850: "
                             f"`tuner devices` lists them, and `tuner logs LOG` shows a log's) nor 'auto'")
        if fp not in out:
            out.append(fp)
    return out


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


# workload fields that change what surrounds the sum (or what the padding reads), not the loop nest
EPILOGUE = ("bias", "activation", "residual", "in_scale", "scale_rows", "in_norm", "norm_partials", "pad_mode",
            "in_group_norm", "in_response", "in_add", "in_view", "row_sums", "gate", "gate_act1",
            "gate_activation", "in_gate")  # (a depthwise convolution's row sums, or the gate its last work-group
# computes from them: after the same loop nest; a convolution's gate computed before it)
# workload fields that pin a knob (a group_norm's ``stats``: its split is the chunk count, not a choice): a record
# lends its config only to a workload with the same value -- a whole norm took a statistics kernel's split of 16
# on the H200, where its own best was one launch
PINNING = ("stats",)


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
    whatever their (partial) timings, nor a measurement a redo superseded. Ties go to the earlier record
    (``LogIndex.bests``)."""
    return LogIndex(records).bests()


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


def _paths_of(log_or_records) -> list:
    if isinstance(log_or_records, (str, os.PathLike)):
        return [os.fspath(log_or_records)]
    return [os.fspath(x) for x in log_or_records if isinstance(x, (str, os.PathLike))]


def sibling_logs(fingerprints, near=()) -> list:
    """The default logs of ``fingerprints`` (``<fingerprint>.jsonl``) beside the logs ``near`` (paths or globs)
    and in ``logs/``: where a sibling's records are looked for when the logs given hold none of them."""
    folders = [Path(os.path.dirname(p) or ".") for p in near] + [Path("logs")]
    found = []
    for fp in fingerprints:
        for folder in folders:
            f = folder / f"{fp}.jsonl"
            if f.is_file() and f.resolve() not in {x.resolve() for x in found}:
                found.append(f)
    return found


@dataclass
class Pick:
    """A config for a task without a record of its own (``ApplyHistoryBest.suggest``): ``how`` is
    ``"transferred"`` (the same shapes with another epilogue, or the nearest workload when no cost model can
    be trained) or ``"predicted"`` (the candidate the cost model ranks first); ``record`` is the record the
    config comes from, ``origin`` the sibling device's fingerprint when it comes from one, else None."""
    config: object
    record: Record
    how: str
    origin: str | None = None


class ApplyHistoryBest:
    """The best configs of a set of records, queryable per (template, workload, device, scopes).

    Also a context manager: inside ``with``, ``current_history()`` returns it (innermost wins)."""

    def __init__(self, log_or_records, transfer_from=None):
        """``log_or_records``: a log path or glob, a list of paths/globs, or Records (mixed is fine).
        ``transfer_from``: fingerprints of sibling devices whose records may fill the tasks a device has no
        record of (``for_device``); ``"auto"`` names every device of the same family the logs hold."""
        self.index = LogIndex(_to_records(log_or_records))
        self.records = self.index.records  # without the measurements a redo superseded (``LogIndex``)
        self.paths = _paths_of(log_or_records)  # where sibling logs are looked for (``sibling_logs``)
        self.transfer_from = parse_transfer_from(transfer_from)
        self._warned: set = set()
        self._models: dict = {}  # template name -> CostModel or None (trained once, on first need)

    @property
    def best(self) -> dict:
        """``task_key -> Record``: the fastest successful record of every task (``LogIndex.bests``)."""
        return self.index.bests()

    adopted: set = frozenset()  # task keys answered by another driver's records (for_device)
    origin: dict = {}  # task key -> the sibling fingerprint whose records answer it (for_device)
    siblings: tuple = ()  # the sibling fingerprints applied (for_device), in the order named
    sibling_records: list = []  # their records as logged (the cost model trains on them)
    device: str | None = None  # the fingerprint this history was made for (for_device), if any

    def for_device(self, info, transfer_from=None) -> "ApplyHistoryBest":
        """This history as seen from ``info`` (a DeviceInfo).

        - The fingerprint hashes the driver version, so an over-the-air driver update would drop every tuned
          config to its fallback. Tuned choices belong to the device model (platform and name); so a task this
          driver has no record of takes the records of the same device under other drivers, ranked below this
          driver's own (they only fill what it lacks), with one warning that names the drivers. Program
          binaries stay keyed by driver (``runtime.program``).
        - Then the records of the sibling devices named by ``transfer_from`` (or the history's own
          ``transfer_from``), in the order named, fill the tasks still without a record, with one warning per
          sibling; their configs are checked against this device's space like any other (``best_valid``), and
          ``origin`` says which task came from which sibling. A named sibling whose records the logs lack is
          looked for in ``<fingerprint>.jsonl`` beside the logs and in ``logs/``; none anywhere is a TunerError.
          Without a name, records of a device of the same family only bring a hint (``SiblingDeviceHint``):
          another GPU's configs are never applied unasked."""
        fp = info.fingerprint
        names = parse_transfer_from(transfer_from) or self.transfer_from
        if self.device == fp and (not names or tuple(names) == self.named):
            return self
        siblings = self._siblings(info, names)  # first: it adds the records of siblings' logs found beside
        records = self.records
        mine = {r.task_key[1:] for r in records if r.ok and r.device == fp}
        others = [r for r in records if r.ok and r.device != fp and r.platform == info.platform
                  and r.device_name == info.name and r.task_key[1:] not in mine]
        if others:
            drivers = sorted({r.driver or "?" for r in others})
            tasks = {r.task_key[1:] for r in others}
            warnings.warn(f"{len(tasks)} tuned task(s) come from records of {info.name} under driver "
                          f"{', '.join(drivers)}; this one runs driver {info.driver_version or '?'} ({fp}), which "
                          f"has none of its own for them: re-tune to measure them under this driver",
                          OtherDriverWarning, stacklevel=2)
        adopted = [dataclasses.replace(r, device=fp) for r in others]
        filled = mine | {r.task_key[1:] for r in others}
        sibling_records, origin, taken = [], {}, []
        for sib in siblings:
            theirs = [r for r in records if r.device == sib]
            sibling_records += theirs
            fill = [r for r in theirs if r.ok and r.task_key[1:] not in filled]
            keys = {r.task_key[1:] for r in fill}
            filled |= keys
            origin.update({(fp, *k): sib for k in keys})
            taken += [dataclasses.replace(r, device=fp) for r in fill]
            if keys:
                name = theirs[0].device_name or sib
                warnings.warn(f"{len(keys)} task(s) take the configs tuned on {name} ({sib}), named by "
                              f"--transfer-from, where {info.name} ({fp}) has no record of its own; each is checked "
                              f"against this device's search space: tune them here to measure them",
                              SiblingConfigWarning, stacklevel=2)
        if not adopted and not siblings:
            return self  # nothing of another driver or sibling applies: the history as it is
        out = ApplyHistoryBest(records + adopted + taken)
        out.paths, out.transfer_from = self.paths, self.transfer_from
        out.adopted = {r.task_key for r in adopted}
        out.origin, out.siblings, out.sibling_records = origin, tuple(siblings), sibling_records
        out.device, out.named = fp, tuple(names)
        return out

    named: tuple = ()  # the transfer_from names for_device resolved (``"auto"`` included as given)
    dtype_origin: dict = {}  # task key -> the storage dtype whose record answers it (for_dtype)

    def for_dtype(self, info, dtype: str, replace: bool = False) -> "ApplyHistoryBest":
        """This history for a model stored in ``dtype`` on ``info`` (a DeviceInfo), where the records of the
        other storage dtype (``OTHER_DTYPE``: float32 for float16 and the reverse) of this device transfer: a
        float16 layer runs the same loop nest as its float32 twin on half the bytes, so float32's tuned config
        is a far better start than a fallback (on the H200, ResNet-18 ran 2.1x slower in float16 on fallbacks).

        Each record of the other dtype is read as this dtype's (its workload's ``dtype`` switched; half
        arithmetic, ``compute``, set to float32 where this dtype is not float16), and ``dtype_origin`` names
        the task keys that came so. ``replace=False``: they fill only the workloads (any scope) that this
        device has no record of in ``dtype``; ``replace=True``: every workload the other dtype measured takes
        its records instead of this dtype's -- the plan built from those transfers, which ``--scope auto``
        times beside the other (``tuner.compile.compiler.fastest_plan``). Plans, scopes and template choices
        read them as any record; each config is still checked against this device's space (``best_valid``)."""
        other = OTHER_DTYPE.get(dtype)
        if other is None:
            return self
        fp = info.fingerprint
        workload_of = lambda r: (r.template, canonical_json({k: v for k, v in r.workload.items()  # noqa: E731
                                                              if k != "dtype"}))
        dtype_of = lambda r: r.workload.get("dtype", "float32")  # noqa: E731
        theirs = [r for r in self.records if r.ok and r.device == fp and dtype_of(r) == other]
        mine = {workload_of(r) for r in self.records if r.ok and r.device == fp and dtype_of(r) == dtype}
        moved, origin = [], dict(self.origin)
        for r in theirs:
            if replace or workload_of(r) not in mine:
                config = dict(r.config)
                if "compute" in config and dtype != "float16":
                    config["compute"] = "float32"  # half arithmetic needs half storage
                moved.append(dataclasses.replace(r, workload={**r.workload, "dtype": dtype}, config=config))
                if r.task_key in self.origin:  # a named sibling's record, read as this device's (for_device)
                    origin[moved[-1].task_key] = self.origin[r.task_key]
        if not moved:
            return self
        taken = {workload_of(r) for r in moved}
        keep = [r for r in self.records if not (replace and r.device == fp and dtype_of(r) == dtype
                                                  and workload_of(r) in taken)]
        out = ApplyHistoryBest(keep + moved)
        out.paths, out.transfer_from, out.adopted = self.paths, self.transfer_from, self.adopted
        out.siblings, out.sibling_records, out.device, out.named = (self.siblings, self.sibling_records,
                                                                    self.device, self.named)
        out.dtype_origin, out.origin = {r.task_key: other for r in moved}, origin
        return out

    def _siblings(self, info, names: list) -> list:
        """The sibling fingerprints ``names`` stands for on ``info`` (``"auto"``: the family's), their logs
        loaded from beside the logs when the records lack them; a hint when unnamed siblings are logged."""
        fp = info.fingerprint
        family = device_family(info.platform, info.type, info.name)
        logged: dict = {}
        for r in self.records:
            if r.device != fp and r.device not in logged:
                logged[r.device] = r
        def sibling(r) -> bool:  # noqa: E306 - a device of this family, not this device under another driver
            return (device_family(r.platform, r.device.split("-")[1] if r.device.count("-") >= 2 else "", r.device_name)
                    == family and not (r.platform == info.platform and r.device_name == info.name))
        wanted = [n for n in names if n not in (AUTO, fp)]
        missing = [n for n in wanted if n not in logged]
        if missing:
            extra = load_records(sibling_logs(missing, self.paths)) if sibling_logs(missing, self.paths) else []
            self.index = LogIndex(self.records + [r for r in extra if r.device in missing])
            self.records = self.index.records
            for r in extra:
                logged.setdefault(r.device, r)
        still = [n for n in wanted if n not in logged]
        if still:
            have = ", ".join(f"{d} ({r.device_name})" for d, r in logged.items()) or "no other device"
            raise TunerError(f"--transfer-from {', '.join(still)}: no records of that device in the logs given "
                             f"({have}), nor in {still[0]}.jsonl beside them or in logs/; add its log to --log "
                             f"(e.g. --log 'logs/*.jsonl') or name a fingerprint the logs hold")
        out = list(wanted)
        if AUTO in names:
            out += [d for d, r in logged.items() if d not in out and sibling(r)]
        elif not names:
            hint = [(d, r) for d, r in logged.items() if sibling(r)]
            for d, r in hint:
                self._warn_once(("sibling", fp, d), f"the logs hold configs tuned on {r.device_name} ({d}), a "
                                f"sibling of {info.name} ({fp}); they apply only when named: --transfer-from {d} "
                                f"(Python: transfer_from=[{d!r}]) fills the layers this device has not tuned",
                                SiblingDeviceHint)
        return out

    def query(self, template_name: str, workload, device_fingerprint: str, scopes: dict | None,
              fixed: dict | None = None) -> Record | None:
        """The best record of the task, or None. ``workload``: the key dict (or a workload object);
        ``scopes=None``: the best over any scopes; ``fixed``: only configs with these knob values."""
        if scopes is None:
            if not fixed:
                return self.index.best_any_scope(device_fingerprint, template_name, workload)
            return min((r for r in self.index.workload(device_fingerprint, template_name, workload) if holds(r, fixed)),
                       key=lambda r: r.median_s, default=None)
        return self.index.best(task_key(device_fingerprint, template_name, _workload_key(workload), scopes), fixed)

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
            if rec.task_key in self.origin:  # another device's limits: expected, and never deployed
                self.rejected_sibling += 1
                continue
            self._warn_once(("invalid", rec.timestamp, rec.trial, canonical_json(rec.config)),
                            f"the log's {template.name} config {canonical_json(rec.config)} for "
                            f"{canonical_json(_workload_key(workload))} is not valid for the template's space "
                            f"({why}): skipped", InvalidLoggedConfigWarning)
        return None

    rejected_sibling: int = 0  # sibling configs this device's space rejected (best_valid), never deployed

    def transfer(self, template, workload, device, scopes: dict | None = None, fixed: dict | None = None,
                 fit=None):
        """``(config, Record it came from)`` for a task this device has no record of, or None: ``suggest``'s
        pick (every pick is checked against the template's space; none is ever invalid)."""
        pick = self.suggest(template, workload, device, scopes, fixed, fit=fit)
        return None if pick is None else (pick.config, pick.record)

    def suggest(self, template, workload, device, scopes: dict | None = None, fixed: dict | None = None,
                limit: int = 96, fit=None) -> Pick | None:
        """A config for a task this device (and its named siblings, ``for_device``) has no record of, or None.

        1. The same shapes with another epilogue (``workload_distance`` 0: the same loop nest): the fastest
           measured config of those tasks that is valid here (their bests and ``NEAR_RUNNERS_UP`` others).
        2. Else the candidates -- the best configs of the template's tuned workloads on the device and its
           siblings, and the runners-up of each (up to ``limit``, nearest workloads first) -- ranked by the
           template's cost model (``tuner.search.samplers.CostModel``: XGBoost trained on this device's and
           the siblings' records of the template, predicting for this workload): ``how="predicted"``.
        3. With too few records to train one, or no ``fit`` given, the nearest workload's config
           (``how="transferred"``).
        ``fit``: ``(template, [(Record, weight)]) -> model or None``, the cost model's trainer
        (``tuner.search.samplers.CostModel.fit``; the caller passes it: logs depend on no search code).
        The first candidate in that order that the template's space accepts for this workload on this device,
        with ``fixed`` applied, is the pick."""
        info = getattr(device, "info", device)
        key = _workload_key(workload)
        fp = info.fingerprint
        tasks = [r for r in self.best.values() if r.device == fp and r.template == template.name
                 and (scopes is None or r.scopes == scopes)
                 and all(r.workload.get(k) == key.get(k) for k in PINNING)]
        dist = {id(r): workload_distance(key, r.workload) for r in tasks}
        tasks.sort(key=lambda r: (dist[id(r)], r.median_s))
        for r in self._same_nest(tasks, dist, fixed):
            cfg = {**r.config, **(fixed or {})}
            if invalid_config(template, workload, info, cfg) is None:
                return Pick(template.config(**cfg), r, "transferred", self.origin.get(r.task_key))
        model = self.cost_model(template, fp, fit) if fit is not None else None
        if model is not None:
            cands = self._candidates(template, tasks, fixed, limit)
            if cands:
                scores = model.predict(template, _workload_obj(template, workload), [c for c, _ in cands])
                order = sorted(range(len(cands)), key=lambda i: -scores[i])
                for i in order[:limit]:
                    cfg, r = cands[i]
                    if invalid_config(template, workload, info, cfg) is None:
                        return Pick(template.config(**cfg), r, "predicted", self.origin.get(r.task_key))
        for r in tasks[:64]:
            cfg = {**r.config, **(fixed or {})}
            if invalid_config(template, workload, info, cfg) is None:
                return Pick(template.config(**cfg), r, "transferred", self.origin.get(r.task_key))
        return None

    RUNNERS_UP = 3  # configs per tuned task offered to the cost model besides its best
    # measured configs of the same loop nest tried, fastest first: every such task's best, and where none fits the
    # workload (a convolution writing its norm's statistics needs more local memory) its other records -- on the
    # H200 the cost model's pick from another workload ran 58.4 us where the plain layer ran 26.5
    NEAR_RUNNERS_UP = 64

    def _same_nest(self, tasks: list, dist: dict, fixed: dict | None) -> list:
        """The measured records of ``tasks`` at distance 0 (the same loop nest, another epilogue) with ``fixed``
        held, fastest first, each config once: their bests and up to ``NEAR_RUNNERS_UP`` others."""
        near = [r for r in tasks if dist[id(r)] == 0]
        rest = [x for r in near for x in self.index.ranked(r.task_key, fixed) if x is not r]
        out, seen = [], set()
        for r in sorted(near + sorted(rest, key=lambda x: x.median_s)[:self.NEAR_RUNNERS_UP],
                        key=lambda x: x.median_s):
            k = canonical_json({**r.config, **(fixed or {})})
            if k not in seen:
                seen.add(k)
                out.append(r)
        return out

    def _candidates(self, template, tasks: list, fixed: dict | None, limit: int) -> list:
        """``[(config dict, Record)]``: the best config and the runners-up of each task in ``tasks`` (nearest
        first), ``fixed`` applied, each config once, at most ``limit``."""
        out, seen = [], set()
        for t in tasks:
            fits = self.index.ranked(t.task_key, fixed)
            for r in fits[:1 + self.RUNNERS_UP]:
                cfg = {**r.config, **(fixed or {})}
                k = canonical_json(cfg)
                if k not in seen:
                    seen.add(k)
                    out.append((cfg, r))
            if len(out) >= limit:
                break
        return out[:limit]

    def cost_model(self, template, fingerprint: str, fit):
        """``fit``: the trainer (see ``suggest``). The template's cost model on ``fingerprint``, trained once on first
        need from the successful records of the template on this device (the other drivers' adopted ones included)
        and on the named siblings (their records as logged, at ``SIBLING_WEIGHT``); None when too few records to
        train one."""
        key = (template.name, fingerprint)
        if key not in self._models:
            own = [r for r in self.index.template(template.name) if r.device == fingerprint
                   and r.task_key not in self.origin]
            sib = [r for r in self.sibling_records if r.ok and r.template == template.name]
            self._models[key] = fit(template, [(r, 1.0) for r in own] + [(r, SIBLING_WEIGHT) for r in sib])
        return self._models[key]

    def _runners_up(self, template_name, workload, fingerprint, scopes, fixed, first) -> list:
        same = [r for r in self.index.workload(fingerprint, template_name, workload) if r is not first
                and (scopes is None or r.scopes == scopes) and holds(r, fixed)]
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


def apply_history_best(log_or_records, transfer_from=None) -> ApplyHistoryBest:
    """``ApplyHistoryBest(log_or_records, transfer_from)``; use it plainly or as ``with apply_history_best(...)
    as h:``. ``transfer_from``: fingerprints of sibling devices (a list or a comma-separated string, or
    ``"auto"``) whose configs fill the tasks a device has none of (``ApplyHistoryBest.for_device``)."""
    return ApplyHistoryBest(log_or_records, transfer_from)


def current_history() -> ApplyHistoryBest | None:
    """The innermost history entered with ``with``, or None outside any."""
    return _STACK[-1] if _STACK else None
