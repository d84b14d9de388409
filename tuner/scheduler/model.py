"""Tune a model: every task of its plan with the tuning engine, the trial budget shared by weight.

With ``scope="auto"`` the tasks of three plans are tuned: all-texture, all-buffer, and then the auto plan the
log now implies (layers at a scope boundary run mixed-scope kernels, and those must be measured too, since the
kernels tuned are the kernels deployed). A node several templates take (a 3x3 stride-1 conv2d: the direct conv2d,
Winograd F(2x2) and F(4x4)) has a task per template, so that the plan can deploy the one measured fastest
(``plan.choose_templates``). A re-run resumes: what the log already holds counts against each
task's budget and is never measured again.

``trials`` is the number of measurements in all: it is shared exactly, unless the tasks need more to get
``min_trials`` each, which the plan says up front (``ModelTuneResult.notes``). Each task measures its
template's fallback config first, so the result can put the tuned configs against the fallback ones
(``LatencyEstimate``)."""
from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field

from tuner.compile.compiler import load_graph, model_tasks
from tuner.errors import TunerError
from tuner.logs import apply_history_best
from tuner.logs.index import DeviceLog, LogIndex
from tuner.logs.io import ensure_writable
from tuner.plan.lower import choose_templates, extract_tasks, lower_graph, plan_storage
from tuner.runtime.base import Runtime
from tuner.search.tune import default_log, tune
from tuner.search.worker import model_prefix
from tuner.target import DeviceInfo
from tuner.task import TuningTask as Task

# successful measurements per task: what `tuner tune` measures at least, and what `tuner compare` / `report`
# need on each side of a texture/buffer comparison
MIN_TRIALS = 5


@dataclass
class TaskResult:
    task: Task
    budget: int
    measured: int = 0  # new measurements of this run
    stopped_early: bool = False
    best: object = None  # the fastest successful Record of the task in the log (any run), or None
    records: int = 0  # measurements of the task in the log (any run)
    failures: dict = field(default_factory=dict)  # error name -> count, over those records

    @property
    def failed(self) -> bool:
        """No valid measurement: the model would deploy this kernel with an untested fallback config."""
        return self.best is None

    def failure_text(self) -> str:
        """``4 of 4 failed: COMPILE x4`` (or ``not measured``)."""
        if not self.records:
            return "not measured"
        names = ", ".join(f"{k} x{v}" for k, v in sorted(self.failures.items(), key=lambda kv: (-kv[1], kv[0])))
        return f"{sum(self.failures.values())} of {self.records} failed" + (f": {names}" if names else "")


@dataclass
class LatencyEstimate:
    """The model's tuned layers, sum over tasks of count x median: the best configs against the fallbacks."""
    tuned_s: float
    fallback_s: float
    tasks: int  # tasks of the deployed plan
    tuned_missing: int  # of those, without a successful measurement
    fallback_tasks: int  # tasks of the plan without a log
    fallback_missing: int  # of those, without a successful measurement of the fallback config

    @property
    def partial(self) -> bool:
        return bool(self.tuned_missing or self.fallback_missing)

    def text(self) -> str:
        speedup = f" ({self.fallback_s / self.tuned_s:.2f}x)" if self.tuned_s and self.fallback_s else ""
        line = (f"estimated latency of the tuned layers (count x median per task): {self.tuned_s * 1e3:.4g} ms with "
                f"the tuned configs vs {self.fallback_s * 1e3:.4g} ms with the fallback configs{speedup}")
        gaps = [f"{n} of {of} tasks have no {what}" for n, of, what in (
            (self.tuned_missing, self.tasks, "successful measurement"),
            (self.fallback_missing, self.fallback_tasks, "measurement of their fallback config")) if n]
        return line + (f"; partial: {', '.join(gaps)}" if gaps else "")


@dataclass
class ModelTuneResult:
    log: str
    tasks: list = field(default_factory=list)  # TaskResult, in tuning order
    planned: int = 0  # measurements the run set out to make (the progress bar's total)
    notes: list = field(default_factory=list)  # why the plan differs from --trials, said when it was known
    estimate: LatencyEstimate | None = None

    @property
    def measured(self) -> int:
        return sum(t.measured for t in self.tasks)

    @property
    def failed(self) -> list:
        return [t for t in self.tasks if t.failed]


def split(trials: int, parts: int) -> list:
    """``trials`` in ``parts`` near-equal integers that add up to it."""
    return [trials // parts + (i < trials % parts) for i in range(parts)]


def share_budget(tasks: list, trials: int, min_trials: int = MIN_TRIALS) -> list:
    """Trials per task: ``trials`` shared in proportion to weight (count x FLOPs) with at least ``min_trials``
    each, adding up to ``trials`` exactly -- or ``min_trials`` each when ``len(tasks) x min_trials`` is more."""
    n = len(tasks)
    if n * min_trials >= trials:
        return [min_trials] * n
    budgets, free, left = [min_trials] * n, list(range(n)), trials
    while free:  # tasks whose share is below the minimum get the minimum; the rest share what is left
        total = sum(tasks[i].weight for i in free)
        share = {i: left * (tasks[i].weight / total if total else 1 / len(free)) for i in free}
        low = [i for i in free if share[i] < min_trials]
        if not low:
            break
        left -= min_trials * len(low)
        free = [i for i in free if i not in low]
    for i in free:
        budgets[i] = int(share[i])
    rest = left - sum(budgets[i] for i in free)  # largest remainders first
    for i in sorted(free, key=lambda i: budgets[i] - share[i])[:rest]:
        budgets[i] += 1
    return budgets


def fallback_config(task: Task, info) -> dict:
    """The config the model deploys for ``task`` without a log (the template's fallback, valid for the task)."""
    return dataclasses.asdict(task.fallback(info))


def best_record(records: list):
    return min((r for r in records if r.ok), key=lambda r: r.median_s, default=None)


def summarize_task(tr: TaskResult, index: DeviceLog) -> None:
    """Fill ``tr``'s best record and failure counts from the log's records of its task."""
    records = index.of(tr.task)
    tr.best, tr.records = best_record(records), len(records)
    tr.failures = dict(Counter(r.error_name for r in records if not r.ok))


def estimate_latency(plan, info, index: DeviceLog, deployed_scope: str, history) -> LatencyEstimate:
    """The deployed plan's tasks (the templates ``history`` chooses, ``choose_templates``) at their best medians
    against the no-log plan's tasks (the direct conv2d, not Winograd) at their fallback configs' medians (both
    from the log)."""
    tuned = extract_tasks(choose_templates(plan_storage(plan, info, deployed_scope, history), history, info))
    untuned = extract_tasks(choose_templates(plan_storage(plan, info, deployed_scope, None), None, info))
    best = [best_record(index.of(t)) for t in tuned]
    fallback = []
    for t in untuned:
        cfg = fallback_config(t, info)
        fallback.append(best_record([r for r in index.of(t) if r.config == cfg]))
    return LatencyEstimate(
        tuned_s=sum(t.count * r.median_s for t, r in zip(tuned, best) if r is not None),
        fallback_s=sum(t.count * r.median_s for t, r in zip(untuned, fallback) if r is not None),
        tasks=len(tuned), tuned_missing=sum(r is None for r in best),
        fallback_tasks=len(untuned), fallback_missing=sum(r is None for r in fallback))


def overrun_note(label: str, tasks: int, min_trials: int, share: int, trials: int) -> str | None:
    """Why a round measures more than its share of ``--trials``, or None when it does not."""
    if tasks * min_trials <= share:
        return None
    of = "--trials" if share == trials else f"its {share} of --trials"
    return f"{label}{tasks} tasks x --min-trials {min_trials} = {tasks * min_trials} > {of} {trials}"


class _Run:
    """One tune_model run: the tasks tuned so far, the honest progress bar, the notes."""

    def __init__(self, result: ModelTuneResult, index: DeviceLog, say, tune_task):
        self.result, self.index, self.say, self.tune_task = result, index, say, tune_task
        self.by_key: dict = {}
        self.bar = None

    def note(self, text: str) -> None:
        self.result.notes.append(text)
        if self.bar is not None:
            self.bar.write(text)
        elif self.say is not None:
            self.say(text)

    def start_bar(self, total: int) -> None:
        from tqdm.auto import tqdm
        self.bar = tqdm(total=total, desc="model", unit="trial", dynamic_ncols=True)

    def retotal(self, delta: int) -> None:
        self.result.planned += delta
        if self.bar is not None and delta:
            self.bar.total += delta
            self.bar.refresh()

    def tune(self, task: Task, budget: int, todo: int) -> None:
        """Measure ``todo`` new configs of ``task``; a task tuned before (the auto plan's leftover share)
        adds to its entry."""
        tr = self.by_key.get(task.key())
        if tr is None:
            tr = self.by_key[task.key()] = TaskResult(task, 0)
            self.result.tasks.append(tr)
        tr.budget += budget
        new = self.tune_task(task, todo) if todo > 0 else 0
        tr.measured += new
        if new < todo:  # early stopping, or a space with fewer unmeasured configs: the total shrinks
            tr.stopped_early = True
            self.retotal(new - todo)
        if self.bar is not None:
            self.bar.update(new)
            self.bar.set_postfix_str(f"{len(self.result.tasks)} tasks")


def tune_model(model, log: str | None = None, trials: int = 200, device=None, scope: str = "auto",
               storage: str | None = None, sampler: str = "xgb", seed: int | None = 0, dtype: str = "float32",
               input_shapes: dict | None = None, min_trials: int = MIN_TRIALS, options=None, progress: bool = True,
               early_stopping: int | None = None, compare_scopes: bool = True, say=None,
               transfer_from=None) -> ModelTuneResult:
    """Tune every task of ``model`` on ``device`` with ``trials`` measurements in all (more only when the
    tasks need ``min_trials`` each: then ``say``, e.g. ``print``, hears why before anything is measured).
    With ``scope="auto"`` and ``compare_scopes=False`` only the kernels of the current auto plan are tuned
    (the log's or the templates' choice per layer), not both scopes of every layer. ``early_stopping``: each
    task stops after that many measurements without improvement. Ctrl-C (KeyboardInterrupt) propagates;
    what was measured is in the log, and a re-run resumes without measuring a config again.

    ``transfer_from``: sibling devices' fingerprints (or ``"auto"``): their records seed every task's study
    (``tune``'s ``transfer_from``: their best valid configs of the task first, their records in the cost
    model's transfer as this device's), and fill what the log lacks where the log decides the plan."""
    from tuner.measure import MeasureOptions, Runner, open_runner

    info = getattr(device, "info", device)
    if not isinstance(info, DeviceInfo):
        from tuner.runtime.opencl.device import choose_device
        info = choose_device(info)
    log = str(ensure_writable(log or default_log(info.fingerprint)))  # before any measurement
    for flag, value, least in (("--trials", trials, 1), ("--min-trials", min_trials, 1),
                               ("--early-stopping", early_stopping, 1)):
        if value is not None and value < least:
            raise TunerError(f"{flag} must be at least {least}, got {value}")
    plan = lower_graph(load_graph(model, input_shapes), dtype)
    both = scope == "auto" and compare_scopes
    history = None
    if scope == "auto" and not compare_scopes:
        history = _history(log, info, transfer_from)
        rounds = [("", extract_tasks(plan_storage(plan, info, "auto", history)))]
    else:
        rounds = [(f"{m} plan: " if both else "", extract_tasks(plan_storage(plan, info, m)))
                  for m in (["texture", "buffer"] if both else [scope])]
    shares = split(trials, len(rounds) + both)
    index = LogIndex.of_log(log).on(info.fingerprint)  # each task is tuned once (or topped up, below)
    result = ModelTuneResult(log)
    planned = _plan_rounds(rounds, shares, index, min_trials)
    result.planned = sum(todo for _, _, todo in planned) + (shares[-1] if both else 0)

    def tune_task(task: Task, todo: int) -> int:
        r = tune(task.template, task.workload, info, trials=todo, log=log, storage=storage, sampler=sampler,
                 scopes=task.scopes, fixed=task.fixed, seed=seed, options=options, progress=False,
                 early_stopping=early_stopping, measurer=measurer, fallback_first=True, transfer_from=transfer_from)
        return r.measured

    run = _Run(result, index, say, tune_task)
    notes = [n for n in (overrun_note(label, len(tasks), min_trials, share, trials)
                         for (label, tasks), share in zip(rounds, shares)) if n]
    if notes:
        budget = sum(b for _, b, _ in planned) + (shares[-1] if both else 0)
        run.note("; ".join(notes) + f"; measuring {budget}"
                 + (f" ({budget - result.planned} already in the log)" if budget > result.planned else ""))
    options = options or MeasureOptions()
    # one runner for every task: the caller's Runner, one over the caller's Runtime, or local worker processes
    measurer = open_runner(device if isinstance(device, (Runner, Runtime)) else info, options)
    try:
        if progress:
            run.start_bar(result.planned)
        for task, budget, todo in planned:
            run.tune(task, budget, todo)
        if both:  # the mixed-scope kernels the auto plan deploys, now that the log can decide
            history = _history(log, info, transfer_from)
            _mixed_round(run, extract_tasks(plan_storage(plan, info, "auto", history)), shares[-1], min_trials,
                         trials)
    finally:
        if measurer is not device:  # a Runner the caller passed stays open for the caller
            measurer.close()
        if run.bar is not None:
            run.bar.close()
    index = LogIndex.of_log(log).on(info.fingerprint)  # with this run's records
    for tr in result.tasks:
        summarize_task(tr, index)
    deployed = "auto" if scope == "auto" else scope
    # the log decides the scopes only for auto, the template of a node (direct or Winograd) always
    result.estimate = estimate_latency(plan, info, index, deployed, _history(log))
    return result


def _history(log: str, info=None, transfer_from=None):
    """The log's history (None without a log); with ``transfer_from``, as ``info`` sees it with the named
    siblings' records filling what the log lacks (``ApplyHistoryBest.for_device``)."""
    from pathlib import Path

    if transfer_from and info is not None:
        history = apply_history_best([log] if Path(log).exists() else [], transfer_from)
        history.paths = [log]  # a sibling's log is looked for beside it
        return history.for_device(info)
    return apply_history_best(log) if Path(log).exists() else None


def _plan_rounds(rounds: list, shares: list, index: DeviceLog, min_trials: int) -> list:
    """``[(task, budget, todo)]`` for the rounds known up front, each task once (its first round's)."""
    seen, out = set(), []
    for (_, tasks), share in zip(rounds, shares):
        tasks = [t for t in tasks if t.key() not in seen]
        seen.update(t.key() for t in tasks)
        out += [(t, b, max(0, b - index.count(t))) for t, b in zip(tasks, share_budget(tasks, share, min_trials))]
    return out


def _mixed_round(run: _Run, tasks: list, share: int, min_trials: int, trials: int) -> None:
    """The auto plan's kernels not tuned yet get the share kept for them; without any, its kernels (the ones
    deployed) get it on top of what they had. Needing more than the share is said, and the total grows."""
    new = [t for t in tasks if t.key() not in run.by_key]
    if not new:
        if not tasks:
            run.retotal(-share)
        for t, b in zip(tasks, share_budget(tasks, share, 0)):
            tr = run.by_key[t.key()]  # what the log had, and this run measured, counts (a re-run resumes)
            todo = max(0, tr.budget + b - run.index.count(t) - tr.measured)
            run.retotal(todo - b)
            run.tune(t, b, todo)
        return
    budgets = share_budget(new, share, min_trials)
    todo = [max(0, b - run.index.count(t)) for t, b in zip(new, budgets)]
    extra = sum(todo) - share
    if sum(budgets) > share:
        run.note(overrun_note("mixed-scope kernels of the auto plan: ", len(new), min_trials, share, trials)
                 + f"; measuring {sum(budgets) - share} more")
    run.retotal(extra)
    for t, b, n in zip(new, budgets, todo):
        run.tune(t, b, n)


def describe(task: Task) -> str:
    data = "x".join(str(d) for d in task.workload.key()["data"])
    return f"{task.template} {data} {'/'.join(task.scopes.values())}"


def model_worker_tasks(path: str, device, trials: int, scope: str = "auto", min_trials: int = 4) -> tuple:
    """The tasks of a model as ``device`` plans it, each with its share of ``trials`` (by weight), and the
    model's study prefix: what `tuner tune MODEL --workers N` registers and `tuner worker --model` tunes."""
    from pathlib import Path


    if not Path(path).exists():
        raise TunerError(f"no model file {path!r}")
    planned = model_tasks(path, device, scope=scope)
    return [t.budgeted(b) for t, b in zip(planned, share_budget(planned, trials, min_trials))], model_prefix(path)
