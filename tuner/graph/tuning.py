"""Tune a model: every task of its plan with the tuning engine, the trial budget shared by weight.

With ``scope="auto"`` the tasks of three plans are tuned: all-texture, all-buffer, and then the auto plan the
log now implies (layers at a scope boundary run mixed-scope kernels, and those must be measured too, since the
kernels tuned are the kernels deployed). A re-run resumes: what the log already holds counts against each
task's budget and is never measured again."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from tuner.errors import TunerError

from .plan import Task


@dataclass
class ModelTuneResult:
    log: str
    tasks: list = field(default_factory=list)  # (Task, budget, measured now, best Record | None)

    @property
    def measured(self) -> int:
        return sum(m for _, _, m, _ in self.tasks)


def share_budget(tasks: list, trials: int, min_trials: int = 4) -> list:
    """Trials per task: ``trials`` shared in proportion to weight (count x FLOPs), at least ``min_trials``."""
    total = sum(t.weight for t in tasks) or 1
    return [max(min_trials, round(trials * t.weight / total)) for t in tasks]


def measured_index(log: str, fingerprint: str) -> dict:
    """What a log has measured on one device, read once: ``(template, workload, scopes) -> [config, ...]``
    (instantiation rejects are not measurements)."""
    from pathlib import Path

    from tuner.logs import load_records
    from tuner.logs.record import canonical_json
    index: dict = {}
    if Path(log).exists():
        for r in load_records(log):
            if r.device == fingerprint and r.error_name != "INSTANTIATION":
                key = (r.template, canonical_json(r.workload), canonical_json(r.scopes))
                index.setdefault(key, []).append(r.config)
    return index


def measured(index: dict, task: Task) -> int:
    """Measurements of exactly this task (its pinned knobs included) in a ``measured_index``."""
    from tuner.logs.record import canonical_json
    configs = index.get((task.template, canonical_json(task.workload.key()), canonical_json(task.scopes)), [])
    return sum(all(c.get(k) == v for k, v in task.fixed.items()) for c in configs)


def tune_model(model, log: str | None = None, trials: int = 200, device=None, scope: str = "auto",
               storage: str | None = None, sampler: str = "xgb", seed: int | None = 0, dtype: str = "float32",
               input_shapes: dict | None = None, min_trials: int = 4, options=None, progress: bool = True,
               early_stopping: int | None = None, compare_scopes: bool = True) -> ModelTuneResult:
    """Tune every task of ``model`` on ``device`` with about ``trials`` measurements in all. With
    ``scope="auto"`` and ``compare_scopes=False`` only the kernels of the current auto plan are tuned (the
    log's or the templates' choice per layer), not both scopes of every layer."""
    from tuner.measure import MeasureOptions, Measurer
    from tuner.runtime.device import DeviceInfo, choose_device
    from tuner.search.tune import default_log, tune

    from .compiler import load_graph
    from .plan import extract_tasks, lower_graph, plan_storage
    info = getattr(device, "info", device)
    info = info if isinstance(info, DeviceInfo) else choose_device(info)
    log = log or default_log(info.fingerprint)
    if trials < 1:
        raise TunerError("--trials must be at least 1")
    plan = lower_graph(load_graph(model, input_shapes), dtype)
    modes = ["texture", "buffer"] if scope == "auto" and compare_scopes else [scope]
    rounds = [extract_tasks(plan_storage(plan, info, m)) for m in modes]
    result = ModelTuneResult(log)
    seen: set = set()
    # read once: a task's count changes only by its own tune() below, and each task runs once (``seen``)
    index = measured_index(log, info.fingerprint)
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=trials, desc="model", unit="trial", dynamic_ncols=True)

    def run(tasks: list, budget_trials: int):
        tasks = [t for t in tasks if t.key() not in seen]
        for t, budget in zip(tasks, share_budget(tasks, budget_trials, min_trials)):
            seen.add(t.key())
            todo = budget - measured(index, t)
            new, best = 0, None
            if todo > 0:
                r = tune(t.template, t.workload, info, trials=todo, log=log, storage=storage, sampler=sampler,
                         scopes=t.scopes, fixed=t.fixed, seed=seed, options=options, progress=False,
                         early_stopping=early_stopping, measurer=measurer)
                new, best = r.measured, r.best
            result.tasks.append((t, budget, new, best))
            if bar is not None:
                bar.total = max(bar.total, bar.n + max(todo, 0))
                bar.update(max(todo, 0))
                bar.set_postfix_str(f"{len(result.tasks)} tasks")

    options = options or MeasureOptions()
    measurer = Measurer(info, options)  # one set of worker processes for every task
    try:
        if scope == "auto" and not compare_scopes:
            from pathlib import Path

            from tuner.logs import apply_history_best
            history = apply_history_best(log) if Path(log).exists() else None
            rounds = [extract_tasks(plan_storage(plan, info, "auto", history))]
        both = scope == "auto" and compare_scopes
        per_round = trials // (len(rounds) + both)
        for tasks in rounds:
            run(tasks, per_round)
        if both:  # the mixed-scope kernels the auto plan deploys, now that the log can decide
            from tuner.logs import apply_history_best
            run(extract_tasks(plan_storage(plan, info, "auto", apply_history_best(log))),
                trials - per_round * len(rounds))
    finally:
        measurer.close()
        if bar is not None:
            bar.close()
    return result


def describe(task: Task) -> str:
    return f"{task.template} {json.dumps(task.workload.key()['data'])} {'/'.join(task.scopes.values())}"
