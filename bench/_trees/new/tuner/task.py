"""A tuning task: one template, one workload, the operands' scopes and the knobs a model pins. It is what is
tuned (an Optuna study per device), logged (records match it by template, workload, scopes, pinned knobs and
device) and deployed; ``TuningTask`` owns its identity (``key``, ``hash``, study names), its readable
``label`` and its knobs, for model planning, ``tune()``, the workers and the logs alike.

    task = TuningTask("conv2d", wl, {"input": "texture", "weight": "texture", "output": "buffer"})
    task.label        # 'conv2d 64->64 3x3 p1 @56x56 +relu [texture/texture/buffer]'
    task.study_name(info.fingerprint)   # 'conv2d-<hash>-<fingerprint> 64->64 3x3 p1 @56x56 [...]'
"""
from __future__ import annotations

import dataclasses
import hashlib
import numbers
from dataclasses import dataclass, field
from pathlib import Path

from tuner.errors import TunerError
from tuner.logs.index import LogIndex, holds
from tuner.logs.record import SCOPE_OPERANDS, SCOPES, canonical_json, scope_knobs, task_key

IDENTITY = ("template", "workload", "scopes", "fixed")
STORED = (*IDENTITY, "trials", "weight")  # what a storage holds of a task (``to_dict``)


def check_scopes(scopes, where: str) -> None:
    if scopes is not None and (not isinstance(scopes, dict) or set(scopes) - set(SCOPE_OPERANDS)
                               or set(scopes.values()) - set(SCOPES)):
        raise TunerError(f"{where}: scopes {scopes}: keys input/weight/output, values texture or buffer")


def workload_of(t, key: dict):
    """A template's workload object from its key (JSON lists back to tuples)."""
    return t.workload(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in key.items() if k != "op"})


@dataclass(frozen=True)
class TuningTask:
    """``template``: a registered name or ``"module:ATTRIBUTE"``; ``workload``: the template's workload (a key
    dict is resolved); ``scopes``: operand -> texture or buffer (None: the device's fallback decides, ``bind``);
    ``fixed``: knobs a model pins. Not the task's identity, only how much it matters: ``count`` (occurrences
    in a model), ``trials`` (a worker's budget per device), ``weight`` (share of the model's time, by default
    count x FLOPs; heavier tasks are tuned first)."""
    template: str
    workload: object
    scopes: dict | None = None
    fixed: dict = field(default_factory=dict)
    count: int = field(default=1, compare=False)
    trials: int = field(default=32, compare=False)
    weight: float | None = field(default=None, compare=False)

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        if not isinstance(self.template, str):
            set_("template", self.template.name)
        if isinstance(self.workload, dict):
            t = self.tmpl
            try:
                set_("workload", workload_of(t, self.workload))
            except (TypeError, ValueError) as e:
                raise TunerError(f"workload {canonical_json(self.workload)} is not a {t.name} workload: {e}") from None
        check_scopes(self.scopes, f"task {self.template}")
        set_("scopes", None if self.scopes is None else {k: self.scopes[k] for k in SCOPE_OPERANDS if k in self.scopes})
        set_("fixed", dict(self.fixed or {}))
        if not isinstance(self.trials, int) or isinstance(self.trials, bool) or self.trials < 1:
            raise TunerError(f"task {self.template}: trials must be a positive integer, not {self.trials!r}")
        w = self.weight
        if w is not None and (isinstance(w, bool) or not isinstance(w, numbers.Real) or not 0 < w < float("inf")):
            raise TunerError(f"task {self.template}: weight must be a positive finite number (its share of the "
                             f"budget), not {w!r}")  # NaN and inf were taken, and shared the budget out as NaN
        set_("weight", float(self.count * self.workload.flops if w is None else w))

    # -- identity ------------------------------------------------------------------------------------------
    @property
    def tmpl(self):
        """The Template."""
        from tuner.templates import get_template
        return get_template(self.template)

    @property
    def flops(self) -> int:
        """Of one occurrence."""
        return self.workload.flops

    def identity(self) -> dict:
        return {"template": self.template, "workload": self.workload.key(), "scopes": self.scopes,
                "fixed": self.fixed}

    def key(self) -> str:
        """The identity as canonical JSON (budget, count and weight are not part of it)."""
        return canonical_json(self.identity())

    @property
    def hash(self) -> str:
        """The identity, short: study names carry it."""
        return hashlib.sha1(self.key().encode()).hexdigest()[:12]

    def study_name(self, fingerprint: str, prefix: str | None = None) -> str:
        """The task's study on one device, named so that optuna-dashboard's list reads as the layers:
        ``<template>-<hash>-<fingerprint> <workload> [<scopes>]``, or ``<prefix>-<hash>-...`` for the tasks
        registered under a prefix (shared by workers). The hash keeps names unique; the rest is the label."""
        return f"{prefix or self.tmpl.name}-{self.hash}-{fingerprint} {self.label.split(' ', 1)[1]}"

    @property
    def label(self) -> str:
        """``conv2d 64->64 3x3 p1 @56x56 +relu [texture/texture/buffer]``"""
        scopes = "/".join(self.scopes.get(k, "?") for k in SCOPE_OPERANDS) if self.scopes else "fallback scopes"
        fixed = "".join(f" {k}={v}" for k, v in self.fixed.items())
        return f"{self.tmpl.name} {self.tmpl.label(self.workload)} [{scopes}]{fixed}"

    def record_key(self, fingerprint: str) -> tuple:
        """``Record.task_key`` of this task's records on a device (which also need ``fits``)."""
        return task_key(fingerprint, self.tmpl.name, self.workload, self.scopes or {})

    def fits(self, record) -> bool:
        """Whether a record of the same template, workload and scopes has this task's pinned knobs."""
        return holds(record, self.fixed)

    def attrs(self, fingerprint: str) -> dict:
        """What a study says about its task (user attribute ``task``)."""
        return {"template": self.tmpl.name, "workload": self.workload.key(), "scopes": self.scopes,
                "fixed": self.fixed, "device": fingerprint}

    # -- knobs ---------------------------------------------------------------------------------------------
    def bind(self, device) -> "TuningTask":
        """The task with its scopes decided: as given, else the template's fallback for ``device``."""
        if self.scopes is not None:
            return self
        fb = self.tmpl.fallback(self.workload, getattr(device, "info", device))
        return dataclasses.replace(self, scopes={k: getattr(fb, f"{k}_scope") for k in SCOPE_OPERANDS})

    @property
    def knobs(self) -> dict:
        """The knobs the task fixes: its pinned knobs and its scopes as ``*_scope`` knobs."""
        return {**self.fixed, **scope_knobs(self.scopes)}

    def space(self, device):
        """The bound search space of the task's valid configs on ``device``."""
        return self.tmpl.space(self.workload, device, **self.knobs)

    def fallback(self, device):
        """The config the task deploys untuned: the template's fallback with the task's knobs, kept valid."""
        return self.tmpl.fallback_with(self.workload, device, **self.knobs)

    # -- storage -------------------------------------------------------------------------------------------
    def budgeted(self, trials: int) -> "TuningTask":
        return dataclasses.replace(self, trials=trials)

    def to_dict(self) -> dict:
        return {"template": self.template, "workload": self.workload.key(), "scopes": self.scopes,
                "fixed": self.fixed, "trials": self.trials, "weight": self.weight}

    @classmethod
    def from_dict(cls, d: dict, where: str = "task") -> "TuningTask":
        if not isinstance(d, dict) or not {"template", "workload"} <= set(d):
            raise TunerError(f"{where}: a task is an object with template and workload (and optionally scopes, "
                             f"fixed, trials, weight); got {d!r}")
        unknown = set(d) - set(STORED)
        if unknown:
            raise TunerError(f"{where}: unknown task fields {sorted(unknown)}")
        try:
            return cls(**d)
        except TunerError as e:
            raise TunerError(f"{where}: {e}") from None


def as_task(task, where: str = "task") -> TuningTask:
    """A TuningTask from itself or its dict."""
    return task if isinstance(task, TuningTask) else TuningTask.from_dict(task, where)


def log_knowledge(log: str, task: TuningTask, fingerprint: str, space, transfer: bool = True):
    """What logs know for a (bound) task: ``known`` maps each config (its knob values in ``space``'s order) of
    this task to its best record in ``log`` (never measured again); ``others`` holds ``(vars, values, gflops)``
    of successful records of the template's other workloads (or scopes) on the device, and ``(vars, values,
    gflops, device)`` of the template's records in the other devices' logs beside ``log`` (a weaker prior),
    for transfer learning."""
    known, others = {}, []
    mine, t, names = task.record_key(fingerprint), task.tmpl, list(space.choices)
    score = lambda r: r.gflops if r.ok and r.gflops else 0.0  # noqa: E731
    # a record written before a knob existed ran with its default (the config dataclass's)
    defaults = {f.name: f.default for f in dataclasses.fields(t.config) if f.default is not dataclasses.MISSING}
    logs = [Path(log)] + (sorted(p for p in Path(log).parent.glob("*.jsonl") if p != Path(log)) if transfer else [])
    for path in logs:
        index = LogIndex.of_log(path)
        theirs = path != logs[0]  # another log's records of this device: not this run's to answer from or weigh
        for r in index.task(mine) if not theirs else ():
            values = {**defaults, "dtype": r.workload.get("dtype"), **r.config}
            if all(values.get(n) in space.choices[n] for n in names):  # pinned knobs too
                k = tuple(values[n] for n in names)
                if k not in known or score(r) > score(known[k]):
                    known[k] = r
        for r in index.template(t.name) if transfer else ():
            if r.task_key == mine or (theirs and r.device == fingerprint):
                continue
            try:
                vars = t.space_vars(workload_of(t, r.workload))
            except (TypeError, ValueError):
                continue
            values = {**defaults, "dtype": r.workload.get("dtype"), **r.config}
            others.append((vars, values, r.gflops) if r.device == fingerprint else (vars, values, r.gflops, r.device))
    return known, others
