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
from tuner.logs import append_records, apply_history_best
from tuner.logs.index import DeviceLog, LogIndex
from tuner.logs.io import ensure_writable
from tuner.errors import ErrorCode
from tuner.plan.lower import choose_templates, extract_tasks, lower_graph, plan_storage, task_nodes
from tuner.scheduler.task_scheduler import TaskScheduler
from tuner.runtime.base import Runtime
from tuner.search.tune import default_log
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
    nodes: tuple = ()  # the model's nodes the task can serve
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
    fallback_estimate_s: float | None = None  # the no-log plan's kernels at their fallback configs (the baseline)
    served: dict = field(default_factory=dict)  # node -> whether some task of its pool has a valid measurement
    elapsed_s: float = 0.0
    drift: object = None  # the DriftGuard of the run (its checks, drifts, waits and redone measurements), or None
    phases: dict = field(default_factory=lambda: dict.fromkeys(("measure", "propose", "record", "other"), 0.0))
    # seconds of the run: measuring (building and timing), the samplers' proposals, recording and telling, the rest

    @property
    def measured(self) -> int:
        return sum(t.measured for t in self.tasks)

    @property
    def failed(self) -> list:
        """Tasks measured without one valid result, whose nodes no other task of their pool serves: the model
        would run those nodes with an untested fallback config."""
        return [t for t in self.tasks if t.failed and t.records and not any(self.served.get(n) for n in t.nodes)]

    @property
    def unmeasured(self) -> list:
        """Tasks the budget ran out before (the compile runs them with their fallback or a transferred config)."""
        return [t for t in self.tasks if not t.records]


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
    """Why a run (or a round) measures more than its share of ``--trials``, or None when it does not."""
    if tasks * min_trials <= share:
        return None
    of = "--trials" if share == trials else f"its {share} of --trials"
    return f"{label}{tasks} tasks x --min-trials {min_trials} = {tasks * min_trials} > {of} {trials}"


class _Progress:
    """The progress line: against the time budget (seconds) or the trial total, with the model's estimated latency
    now against its fallback estimate, and the notes written above it."""

    def __init__(self, result: ModelTuneResult, say, enabled: bool, budget_s: float | None):
        self.result, self.say, self.budget_s = result, say, budget_s
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm
            if budget_s is not None:
                self.bar = tqdm(total=round(budget_s), desc="model", unit="s", dynamic_ncols=True,
                                bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s [{postfix}]")
            else:
                self.bar = tqdm(total=result.planned, desc="model", unit="trial", dynamic_ncols=True)

    def note(self, text: str) -> None:
        self.result.notes.append(text)
        if self.bar is not None:
            self.bar.write(text)
        elif self.say is not None:
            self.say(text)

    def retotal(self, planned: int) -> None:
        self.result.planned = planned
        if self.bar is not None and self.budget_s is None and self.bar.total != planned:
            self.bar.total = planned
            self.bar.refresh()

    def update(self, elapsed_s: float, new: int, sched: TaskScheduler) -> None:
        if self.bar is None:
            return
        lat, missing = sched.latency_s()
        fb = self.result.fallback_estimate_s
        est = f"est {lat * 1e3:.4g} ms" + (f" ({missing} nodes unmeasured)" if missing else "")
        if fb:
            est += f" vs fallback {fb * 1e3:.4g} ms" + (f" ({fb / lat:.2f}x)" if lat else "")
        open_ = len(sched.open)
        post = f"{self.result.measured} measured, {est}, {open_} of {len(sched.tasks)} tasks open"
        if self.budget_s is not None:
            self.bar.n = min(round(elapsed_s), self.bar.total)
        else:
            self.bar.n += new
        self.bar.set_postfix_str(post, refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


FAIL_LIMIT = 8  # measurements a task with no valid one gets (the node's other variants serve it meanwhile)
VISIT = 8  # least measurements a visit makes of a task (a batch the builders share; more with more builders)
OPEN_VISITS = 2  # visits measured at once (a background runner): the next starts while the last one's stragglers run
REPLAN_S = 30.0  # how often (seconds of tuning) the auto plan the log now implies is read again for new kernels


def tune_model(model, log: str | None = None, trials: int | None = 200, device=None, scope: str = "auto",
               storage: str | None = None, sampler: str = "xgb", seed: int | None = 0, dtype: str = "float32",
               input_shapes: dict | None = None, min_trials: int = MIN_TRIALS, options=None, progress: bool = True,
               early_stopping: int | None = None, compare_scopes: bool = True, say=None,
               transfer_from=None, time_budget: float | None = None, patience: int | None = None,
               drift_every: int | None = None, drift_threshold: float = 0.08) -> ModelTuneResult:
    """Tune the tasks of ``model`` on ``device`` with the task scheduler (``tuner.scheduler.task_scheduler``):
    every task's fallback config first (the model's baseline, task by task; with ``trials``, ``min_trials``
    measurements of each), then visits of ``VISIT`` or more measurements to the task with the largest expected
    cut of the model's estimated latency, until ``trials`` measurements in all (the log's earlier ones of these
    tasks count: a re-run resumes) or ``time_budget`` seconds are spent, whichever comes first, or every task is
    done. ``trials=None`` with a time budget: no trial limit.

    With ``scope="auto"`` the pool holds each node's texture and buffer variants, the no-log plan's kernels,
    and, read again from the log every ``REPLAN_S`` seconds, the mixed-scope kernels the auto plan the log
    implies deploys at scope boundaries (the kernels tuned are the kernels deployed); with ``compare_scopes=False``
    only the current auto plan's. A node several templates take has a task per template: one pool per node.
    ``early_stopping``: a task is done after that many measurements without improvement; ``patience``: the
    scheduler's own (default: ``early_stopping``, else 24 with a time budget and none with trials alone).
    ``storage``: an Optuna storage URL for the tasks' studies (to share them with workers or a dashboard); by
    default they live in memory, rebuilt from the log on every run (a config the log has is never measured
    again). ``say`` (e.g. ``print``) hears why the plan differs from ``trials`` before anything is measured.
    ``transfer_from``: sibling devices whose records seed every task's study (``tune``'s ``transfer_from``) and
    fill what the log lacks where the log decides the plan. ``drift_every``: a reference config is re-timed every
    that many measurements and the GPU clock read with each (``tuner.measure.drift.DriftGuard``); past
    ``drift_threshold`` the tuner waits for the device and measures again what was measured since the last good
    check (None: no check). Ctrl-C (KeyboardInterrupt) propagates; what was measured is in
    the log, and every prefix of the log compiles."""
    import time

    from tuner.measure import MeasureOptions, Runner, open_runner
    from tuner.search.storage import open_storage
    from optuna.storages import InMemoryStorage

    from tuner.search.tune import TaskSearch

    t_start = time.monotonic()
    info = getattr(device, "info", device)
    if not isinstance(info, DeviceInfo):
        from tuner.runtime.opencl.device import choose_device
        info = choose_device(info)
    log = str(ensure_writable(log or default_log(info.fingerprint)))  # before any measurement
    if trials is None and time_budget is None:
        trials = 200
    for flag, value, least in (("--trials", trials, 1), ("--min-trials", min_trials, 1),
                               ("--early-stopping", early_stopping, 1), ("--patience", patience, 1)):
        if value is not None and value < least:
            raise TunerError(f"{flag} must be at least {least}, got {value}")
    if time_budget is not None and not time_budget > 0:
        raise TunerError(f"--time-budget must be positive, got {time_budget}")
    if patience is None:
        patience = early_stopping or (24 if time_budget is not None else None)
    warm = min_trials if trials is not None else 1  # a time budget measures each fallback, then prioritizes
    plan = lower_graph(load_graph(model, input_shapes), dtype)
    both = scope == "auto" and compare_scopes

    def pool_now() -> dict:
        """The tasks the plans hold now: {key: (task, nodes)}."""
        if scope != "auto":
            plans = [plan_storage(plan, info, scope)]
        elif not compare_scopes:
            plans = [plan_storage(plan, info, "auto", _history(log, info, transfer_from))]
        else:
            plans = []
            for mode in ("texture", "buffer"):
                try:
                    plans.append(plan_storage(plan, info, mode))
                except TunerError:  # a layer no texture kernel serves here: the buffer plan serves it
                    pass
            plans.append(plan_storage(plan, info, "auto", None))  # what the model runs untuned
            history = _history(log, info, transfer_from)
            if history is not None:
                plans.append(plan_storage(plan, info, "auto", history))
        out: dict = {}
        for p in plans:
            for k, (t, nodes) in task_nodes(p).items():
                if k in out:
                    out[k] = (out[k][0], list(dict.fromkeys(out[k][1] + nodes)))
                else:
                    out[k] = (t, nodes)
        return out

    result = ModelTuneResult(log)
    sched = TaskScheduler(patience=patience)
    tasks: dict = {}  # key -> TuningTask
    index = LogIndex.of_log(log).on(info.fingerprint)

    def join(found: dict) -> list:
        new = []
        for k, (t, nodes) in sorted(found.items(), key=lambda kv: -kv[1][0].weight):
            fresh = k not in tasks
            st = sched.add(k, nodes)
            if fresh:
                tasks[k] = t
                recs = index.of(t)
                ok = [r.median_s for r in recs if r.ok]
                sched.observe(k, ok, len(recs)) if recs else None
                st.since_best = 0  # the log's measurements tell what is best, not whether the search has stalled
                new.append(k)
        return new

    order = join(pool_now())
    already = sum(sched.tasks[k].measured for k in order)
    need = sum(max(0, warm - sched.tasks[k].measured) for k in order)
    if trials is not None:
        total = max(trials, already)  # --trials is a limit: never more, whatever --min-trials asks
        note = None
        if already + need > trials:
            note = overrun_note("", len(order), warm, trials, trials) or f"{len(order)} tasks > --trials {trials}"
            note += ("; --trials is the limit: each task's fallback first, the heaviest first, then the tasks where "
                     "the latency is")
            warm = 1
            need = sum(max(0, warm - sched.tasks[k].measured) for k in order)
        result.planned = max(0, total - already)
    else:
        total, note = None, None
        result.planned = need
    options = options or MeasureOptions()
    opened = {}  # the Optuna storage, opened at the first visit (the fallbacks need none)
    measurer = open_runner(device if isinstance(device, (Runner, Runtime)) else info, options)
    prog = _Progress(result, say, progress, time_budget)
    runner = measurer
    if drift_every:
        from tuner.measure.drift import DriftGuard
        runner = result.drift = DriftGuard(measurer, log, every=drift_every, threshold=drift_threshold, say=prog.note)
    visit_n = max(VISIT, 2 * options.n_parallel)
    searches: dict = {}
    by_key: dict = {}
    if note:
        prog.note(note)
    # the end (closing the searches and the runner, the estimate) takes a moment of the budget too
    deadline = t_start + time_budget - min(10.0, max(1.0, 0.02 * time_budget)) if time_budget is not None else None
    phases = result.phases
    rate = {"s": None}  # seconds per measurement of a whole visit (proposals, measuring, recording), a moving average
    task_rate: dict = {}  # the same, per task, from its last visit (a 720p layer's kernels take seconds each)

    def spent() -> int:
        return sum(st.measured for st in sched.tasks.values())

    def room(n: int, key=None, pending: int = 0) -> int:
        """How many of ``n`` measurements (of task ``key``) fit in what is left of the budgets, with ``pending``
        measurements started and not finished yet."""
        if total is not None:
            n = min(n, total - spent() - pending)
        if deadline is not None:
            left = deadline - time.monotonic() - pending * (rate["s"] or 0.25)
            if rate["s"] is None:  # the first batch learns the rate: as many as the builders take at once
                n = min(n, options.n_parallel)
            n = min(n, int(left / max(rate["s"] or 0.25, task_rate.get(key, 0.0))))
        return max(0, n)

    def result_of(k) -> TaskResult:
        if k not in by_key:
            by_key[k] = TaskResult(tasks[k], 0)
            result.tasks.append(by_key[k])
        return by_key[k]

    def search_of(k):
        if k not in searches:
            if "storage" not in opened:  # without --storage the studies live in memory: the log is the truth,
                # and a re-run rebuilds each study from it (SQLite's reads took most of a proposal's time)
                opened["storage"] = open_storage(storage, heartbeat=None) if storage else InMemoryStorage()
            searches[k] = TaskSearch(tasks[k].bind(info), info, log, opened["storage"], sampler, seed, True, True,
                                     transfer_from, True, None, early_stopping)
            result_of(k)
        return searches[k]

    def timed_measure(inputs: list) -> list:
        t0 = time.monotonic()
        outs = runner.measure(inputs)
        phases["measure"] += time.monotonic() - t0
        return outs

    def learn_rate(t0: float, n: int, key=None) -> None:
        per = (time.monotonic() - t0) / max(1, n)
        rate["s"] = per if rate["s"] is None else 0.7 * rate["s"] + 0.3 * per
        if key is not None:
            task_rate[key] = per

    def count(k, recs: list) -> int:
        counted = [r for r in recs if r.error_code != ErrorCode.INSTANTIATION]
        sched.observe(k, [r.median_s for r in counted if r.ok], len(counted))
        result_of(k).measured += len(counted)
        return len(counted)

    def measure_fallbacks(keys: list) -> int:
        """Each task's fallback config, several tasks to a batch, straight into the log (no study yet: a task's
        study hears of it from the log when the task is first visited)."""
        from tuner.measure import MeasureInput
        from tuner.search.loop import record_of
        t0 = time.monotonic()
        bound = [tasks[k].bind(info) for k in keys]
        cfgs = [b.fallback(info) for b in bound]
        outs = timed_measure([MeasureInput(b.template, b.workload, c) for b, c in zip(bound, cfgs)])
        recs = [record_of(b.tmpl, b.workload, c, info, res, None, "fallback", b.study_name(info.fingerprint))
                for b, c, res in zip(bound, cfgs, outs)]
        append_records(log, recs)
        new = 0
        for k, rec in zip(keys, recs):
            result_of(k).budget += 1
            new += count(k, [rec])
        learn_rate(t0, len(keys))
        return new

    def launch(parts: list):
        """Start one batch over several tasks' searches, ``[(key, n)]``: a ``_Visit``, or None when none of
        them had anything to propose."""
        from tuner.measure import MeasureInput
        t_visit = time.monotonic()
        batch = []
        for k, n in parts:
            s = search_of(k)
            if s.stopping is not None:  # no measurement past the one that ends the search
                es = s.stopping
                n = min(n, max(1, es.patience - es.since + (es.best is None)))
            by_key[k].budget += n
            if sched.tasks[k].best_s is None:  # nothing valid yet: no more than its failure allowance
                n = min(n, max(1, FAIL_LIMIT - sched.tasks[k].measured))
            t0 = time.monotonic()
            props = s.propose(n) if not s.done else []
            phases["propose"] += time.monotonic() - t0
            if props:
                batch.append((k, s, props))
            elif s.exhausted or s.stopped:
                sched.finish(k, "early stopping" if s.stopped else "space exhausted")
        if not batch:
            return None
        inputs = [MeasureInput(s.task.template, s.task.workload, s.session.task.tmpl.make_config(v))
                  for _, s, props in batch for _, v in props]
        return _Visit(parts, batch, runner.start(inputs), t_visit, len(inputs))

    def land(v) -> int:
        """A finished visit's measurements into the log, the studies and the scheduler; the number measured."""
        outs = v.handle.results
        i, new = 0, 0
        for k, s, props in v.batch:
            res = outs[i:i + len(props)]
            i += len(props)
            if None in res:  # the budget ended while these were measured: the finished ones count, the others
                # stay asked and are failed when the search closes (a re-run proposes them again)
                props, res = [p for p, r in zip(props, res) if r is not None], [r for r in res if r is not None]
            t0 = time.monotonic()
            new += count(k, s.take(props, res)) if props else 0
            phases["record"] += time.monotonic() - t0
            if s.stopped:
                by_key[k].stopped_early = True
                sched.finish(k, "early stopping")
            elif s.exhausted:
                sched.finish(k, "space exhausted")
        for k, _ in v.parts:
            sched.end_visit(k)
        return new

    def measure(parts: list) -> int:
        """One batch over several tasks' searches, measured before it returns: ``[(key, n)]``; the number
        measured."""
        v = launch(parts)
        if v is None:
            return 0
        t0 = time.monotonic()
        v.handle.wait()
        phases["measure"] += time.monotonic() - t0
        new = land(v)
        learn_rate(v.t0, new, parts[0][0] if len(parts) == 1 else None)
        return new

    last_plan = time.monotonic()
    try:
        # the baseline: every task's fallback first, many tasks to a batch; then (``--min-trials``) their searches
        def warm_up(keys: list) -> None:
            fresh = [k for k in keys if sched.tasks[k].measured == 0]
            while fresh:
                n = room(min(len(fresh), 4 * visit_n))
                if n <= 0:
                    return
                new = measure_fallbacks(fresh[:n])
                for k in fresh[:n]:
                    sched.end_visit(k)
                fresh = fresh[n:]
                prog.update(time.monotonic() - t_start, new, sched)
            pending = [(k, warm - sched.tasks[k].measured) for k in keys if sched.tasks[k].measured < warm]
            while pending:
                parts, n = [], 0
                while pending and n < visit_n:
                    k, want = pending.pop(0)
                    take = min(want, visit_n - n)
                    parts.append((k, take))
                    n += take
                    if want > take:
                        pending.insert(0, (k, want - take))
                parts = _trim(parts, room(n))
                if not parts:
                    return
                new = measure(parts)
                for k, _ in parts:
                    sched.end_visit(k)
                prog.update(time.monotonic() - t_start, new, sched)
        warm_up(order)
        result.fallback_estimate_s = _fallback_estimate(plan, info, log, scope, index_of=lambda: LogIndex.of_log(
            log).on(info.fingerprint))
        # the visits: the task with the largest expected cut first. A visit starts while the last one's slowest
        # builds finish (a runner that measures in the background: ``Runner.idle``), on another task, so the
        # builders never wait for one straggler; each task has one visit open at a time.
        open_: list = []  # _Visit, oldest first
        last_done = time.monotonic()
        while True:
            if both and time.monotonic() - last_plan >= REPLAN_S:
                last_plan = time.monotonic()
                warm_up(join(pool_now()))
            started = False
            while not open_ or (len(open_) < OPEN_VISITS and runner.idle()):
                busy = {k for v in open_ for k, _ in v.parts}
                k = sched.pick(exclude=busy)
                if k is None:
                    break
                n = room(visit_n, k, sum(v.n for v in open_))
                if n <= 0:
                    break
                v = launch([(k, n)])
                if v is not None:
                    open_.append(v)
                    started = True
                elif sched.tasks[k].done is None:  # nothing to propose, yet not finished: do not pick it again
                    sched.finish(k, "nothing left to propose")
            if not open_:
                break
            t0 = time.monotonic()
            while not any(v.handle.done for v in open_):
                if deadline is not None and time.monotonic() >= deadline:
                    break
                runner.wait(0.5 if deadline is None else max(0.01, min(0.5, deadline - time.monotonic())),
                            builder=started)
                if started and runner.idle():
                    break
            phases["measure"] += time.monotonic() - t0
            expired = deadline is not None and time.monotonic() >= deadline  # what is still open is cut short
            for v in [v for v in open_ if v.handle.done or expired]:
                open_.remove(v)
                new = land(v)
                now_ = time.monotonic()
                # the rate: the run's seconds per measurement between landings (visits overlap); the task's own:
                # its visit's slowest config plus its mean over the builders
                per = (now_ - last_done) / max(1, new)
                rate["s"] = per if rate["s"] is None else 0.7 * rate["s"] + 0.3 * per
                last_done = now_
                durs = [r.duration_s for r in v.handle.results if r is not None]
                if durs:
                    task_rate[v.parts[0][0]] = (max(durs) + sum(durs) / max(1, options.n_parallel)) / len(durs)
                prog.update(now_ - t_start, new, sched)
        if both:  # the auto plan the log implies now: its kernels not measured yet get their fallback
            warm_up(join(pool_now()))
        if trials is not None:
            prog.retotal(result.measured if not sched.open or spent() < total else result.planned)
    finally:
        for s in searches.values():
            s.close()
        if measurer is not device:  # a Runner the caller passed stays open for the caller
            measurer.close()
        prog.close()
    index = LogIndex.of_log(log).on(info.fingerprint)  # with this run's records
    for k in tasks:
        result_of(k)  # a task never measured (the budget ran out first) too
    for tr in result.tasks:
        summarize_task(tr, index)
        tr.nodes = tuple(sched.tasks[tr.task.key()].nodes)
    result.served = {n: sched.node_s(n) is not None for n in sched.nodes}
    result.elapsed_s = time.monotonic() - t_start
    phases["other"] = result.elapsed_s - sum(v for k, v in phases.items() if k != "other")
    deployed = "auto" if scope == "auto" else scope
    # the log decides the scopes only for auto, the template of a node (direct or Winograd) always
    result.estimate = estimate_latency(plan, info, index, deployed, _history(log))
    return result


@dataclass
class _Visit:
    """A batch started: its ``parts`` ([(key, n)]), each task's search and proposals, the runner's ``Batch``."""
    parts: list
    batch: list
    handle: object
    t0: float
    n: int


def _trim(parts: list, n: int) -> list:
    out = []
    for k, m in parts:
        if n <= 0:
            break
        out.append((k, min(m, n)))
        n -= min(m, n)
    return out


def _fallback_estimate(plan, info, log: str, scope: str, index_of) -> float | None:
    """The no-log plan's tuned kernels at their fallback configs' medians from the log (None: none measured)."""
    est = estimate_latency(plan, info, index_of(), "auto" if scope == "auto" else scope, None)
    return est.fallback_s or None


def _history(log: str, info=None, transfer_from=None):
    """The log's history (None without a log); with ``transfer_from``, as ``info`` sees it with the named
    siblings' records filling what the log lacks (``ApplyHistoryBest.for_device``)."""
    from pathlib import Path

    if transfer_from and info is not None:
        history = apply_history_best([log] if Path(log).exists() else [], transfer_from)
        history.paths = [log]  # a sibling's log is looked for beside it
        return history.for_device(info)
    return apply_history_best(log) if Path(log).exists() else None


def describe(task: Task) -> str:
    """The task as `tuner tune` lists it: its label (``TuningTask.label``, the one label of a workload: channels,
    kernel size, stride, padding, input size, fused epilogue and scopes), as `tuner logs` and reports show it."""
    return task.label


def model_worker_tasks(path: str, device, trials: int, scope: str = "auto", min_trials: int = 4) -> tuple:
    """The tasks of a model as ``device`` plans it, each with its share of ``trials`` (by weight), and the
    model's study prefix: what `tuner tune MODEL --workers N` registers and `tuner worker --model` tunes."""
    from pathlib import Path


    if not Path(path).exists():
        raise TunerError(f"no model file {path!r}")
    planned = model_tasks(path, device, scope=scope)
    return [t.budgeted(b) for t, b in zip(planned, share_budget(planned, trials, min_trials))], model_prefix(path)
