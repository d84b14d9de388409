"""`tuner tune` (tune_model) tells the truth: failed tasks make it exit 1 and are named with their error codes,
--trials is the total (or it says up front why not) and the progress bar's total is the real one, the
summary ends with the estimated latency tuned against fallback, tune/compare/report share one --min-trials
default, --early-stopping works per task, and Ctrl-C leaves nothing running and nothing to measure twice.

Most tests replace the device measurement with a deterministic fake (``fake_measure``): they test the
tuning logic, fast; the last one interrupts a real `python -m tuner tune` with SIGINT."""
import collections
import importlib
import dataclasses
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import onnx
import optuna
import pytest
from optuna.trial import TrialState

from conftest import fake_measurer
from tuner.cli import build_parser, main
from tuner.errors import ErrorCode
from tuner.zoo import models as zoo
from tuner.scheduler.model import MIN_TRIALS, fallback_config, share_budget, tune_model
from tuner.logs import load_records
from tuner.measure import MeasureOptions, MeasureResult, Measurer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """The zoo's small mixed model: 4 tuned tasks (conv2d 3->8, depthwise, conv2d 1x1, and the dense layer reading
    the global average pool before it, ``in_pool``)."""
    path = tmp_path_factory.mktemp("model") / "m.onnx"
    onnx.save(zoo.test_models()["mixed"], path)
    return str(path)


def _wl(inp) -> str:
    return json.dumps(inp.workload.key(), sort_keys=True)


class FakeMeasure:
    """Measurer.measure without a device: the first config of each workload (the fallback) takes 2 ms, later
    ones 1 ms, or ``slower`` ms more each; ``fail`` templates fail to compile. Asserts nothing is measured twice
    (per workload and config) across every run of a test."""

    def __init__(self, fail=(), slower=False):
        self.fail, self.slower = set(fail), slower
        self.seen = collections.defaultdict(list)
        self.calls = 0

    def __call__(self, measurer, inputs):
        self.calls += 1
        out = []
        for inp in inputs:
            key = json.dumps(dataclasses.asdict(inp.config), sort_keys=True)
            assert key not in self.seen[_wl(inp)], f"measured twice: {inp.template} {key}"
            self.seen[_wl(inp)].append(key)
            if inp.template in self.fail:
                out.append(MeasureResult(ErrorCode.COMPILE, "no_such_opencl_builtin", timestamp="t"))
                continue
            n = len(self.seen[_wl(inp)])
            ms = 2.0 if n == 1 else (1.0 + n if self.slower else 1.0)
            out.append(MeasureResult(costs=[ms * 1e-3], max_rel_error=0.0, timestamp="t"))
        return out


@pytest.fixture
def fake(monkeypatch):
    def install(**kwargs):
        f = FakeMeasure(**kwargs)
        fake_measurer(monkeypatch, f)
        return f
    return install


def _tune(model, tmp_path, *extra):
    return main(["tune", model, "--log", str(tmp_path / "t.jsonl"), "--storage", f"sqlite:///{tmp_path / 's.db'}",
                 "--scope", "buffer", "--sampler", "random", "--no-progress", *extra])


def _measured(log):
    return [r for r in load_records(str(log)) if r.error_name != "INSTANTIATION"]


# -- 1. failed tasks -------------------------------------------------------------------------------------------

def test_a_task_without_a_valid_measurement_is_named_and_exits_1(model, tmp_path, fake, capsys):
    fake(fail={"dense"})
    assert _tune(model, tmp_path, "--trials", "15", "--min-trials", "3") == 1
    out = capsys.readouterr().out
    assert "1 of 4 tasks have no valid measurement" in out
    assert re.search(r"dense 16->10 \+bias in_pool=\[4,4\] \[buffer/buffer/buffer\]: (\d+) of \1 failed: COMPILE x\1\n", out)
    failed = out.split("no valid measurement")[1]
    assert "conv2d" not in failed  # the tasks that worked are not listed as failed


def test_every_task_succeeding_exits_0(model, tmp_path, fake, capsys):
    fake()
    assert _tune(model, tmp_path, "--trials", "8", "--min-trials", "2") == 0
    assert "no valid measurement" not in capsys.readouterr().out


# -- 2. --trials is the total ----------------------------------------------------------------------------------

class _Task:
    def __init__(self, weight):
        self.weight = weight


@pytest.mark.parametrize("weights, trials, least", [([1, 1, 1], 10, 1), ([100, 10, 1, 1], 40, 4),
                                                     ([5, 3, 2, 2, 1], 23, 2), ([0, 0], 7, 1)])
def test_share_budget_adds_up_to_trials_with_the_minimum_each(weights, trials, least):
    budgets = share_budget([_Task(w) for w in weights], trials, least)
    assert sum(budgets) == trials and min(budgets) >= least
    assert budgets == sorted(budgets, reverse=True) or len(set(weights)) == 1  # heavier never gets less


def test_share_budget_over_the_total_gives_the_minimum_each():
    assert share_budget([_Task(9), _Task(1)], 5, 4) == [4, 4]


class RecordingBar:
    """tqdm stand-in: remembers the total it was created with and what was counted."""
    made: list = []

    def __init__(self, total=None, **kwargs):
        self.total, self.first_total, self.n = total, total, 0
        RecordingBar.made.append(self)

    def update(self, n=1):
        self.n += n

    def set_postfix_str(self, *a, **k):
        pass

    def refresh(self):
        pass

    def write(self, text):
        print(text)

    def close(self):
        pass


def test_trials_is_the_total_and_the_bar_knows_it_from_the_start(model, tmp_path, fake, monkeypatch):
    import tqdm.auto
    fake()
    monkeypatch.setattr(tqdm.auto, "tqdm", RecordingBar)
    RecordingBar.made = []
    res = tune_model(model, log=str(tmp_path / "t.jsonl"), trials=13, scope="buffer", min_trials=2,
                     sampler="random", storage=f"sqlite:///{tmp_path / 's.db'}", progress=True)
    bar, = RecordingBar.made
    assert res.measured == len(_measured(tmp_path / "t.jsonl")) == 13 == res.planned
    assert bar.first_total == bar.total == bar.n == 13
    assert res.notes == []


def test_trials_is_a_limit_below_tasks_times_min_trials(model, tmp_path, fake, monkeypatch, capsys):
    """--trials 6 on 4 tasks with --min-trials 3: 6 measurements, not 12. Each task's fallback first (the
    heaviest first), then a visit where the latency is; said up front."""
    import tqdm.auto
    fake()
    monkeypatch.setattr(tqdm.auto, "tqdm", RecordingBar)
    RecordingBar.made = []
    assert main(["tune", model, "--log", str(tmp_path / "t.jsonl"), "--storage", f"sqlite:///{tmp_path / 's.db'}",
                 "--scope", "buffer", "--sampler", "random", "--trials", "6", "--min-trials", "3"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("4 tasks x --min-trials 3 = 12 > --trials 6; --trials is the limit")
    bar, = RecordingBar.made
    recs = _measured(tmp_path / "t.jsonl")
    assert bar.first_total == bar.n == 6 == len(recs)
    assert [r.sampler for r in recs[:4]] == ["fallback"] * 4


def test_trials_below_the_tasks_leaves_the_lightest_untouched_and_names_them(model, tmp_path, fake, capsys):
    fake()
    assert main(["tune", model, "--log", str(tmp_path / "t.jsonl"), "--scope", "buffer", "--sampler", "random",
                 "--trials", "3"]) == 0
    out = capsys.readouterr().out
    assert len(_measured(tmp_path / "t.jsonl")) == 3
    assert "1 of 4 tasks not measured" in out
    untouched = out.split("1 of 4 tasks not measured")[1].splitlines()[1:2]
    assert all(line.startswith("  x1 ") for line in untouched), untouched
    assert {line.split()[1] for line in untouched} == {"dense"}  # the lightest


def test_auto_scope_spends_exactly_trials_over_its_rounds(model, tmp_path, fake, monkeypatch):
    """texture, buffer, then the auto plan's kernels: the share kept for the last round is spent too."""
    import tqdm.auto
    fake()
    monkeypatch.setattr(tqdm.auto, "tqdm", RecordingBar)
    RecordingBar.made = []
    res = tune_model(model, log=str(tmp_path / "t.jsonl"), trials=30, scope="auto", min_trials=1,
                     sampler="random", storage=f"sqlite:///{tmp_path / 's.db'}", progress=True)
    bar, = RecordingBar.made
    assert res.measured == len(_measured(tmp_path / "t.jsonl")) == 30 == bar.first_total == bar.n
    again = tune_model(model, log=str(tmp_path / "t.jsonl"), trials=30, scope="auto", min_trials=1,
                       sampler="random", storage=f"sqlite:///{tmp_path / 's.db'}", progress=False)
    assert again.measured == 0  # resumed: the budget is spent


# -- 3. estimated latency --------------------------------------------------------------------------------------

def test_summary_ends_with_the_estimated_latency_against_the_fallback(model, tmp_path, fake, capsys, device):
    fake()
    assert _tune(model, tmp_path, "--trials", "10", "--min-trials", "2") == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    # 4 tasks, each run once: fallback 2 ms each (measured first), tuned 1 ms each
    assert last.startswith("estimated latency") and "4 ms with the tuned configs vs 8 ms with the fallback" in last
    assert "(2.00x)" in last and "partial" not in last
    res_first = {}
    for r in _measured(tmp_path / "t.jsonl"):
        res_first.setdefault((r.template, json.dumps(r.workload, sort_keys=True)), r)
    from tuner.compile.compiler import model_tasks
    for task in model_tasks(model, device, scope="buffer"):
        first = res_first[(task.template, json.dumps(task.workload.key(), sort_keys=True))]
        assert first.config == fallback_config(task, device.info)  # the fallback is each task's first trial


def test_an_estimate_missing_a_task_says_it_is_partial(model, tmp_path, fake, capsys):
    fake(fail={"dense"})
    assert _tune(model, tmp_path, "--trials", "10", "--min-trials", "2") == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "3 ms with the tuned configs vs 6 ms with the fallback" in last
    assert "partial: 1 of 4 tasks have no successful measurement, 1 of 4 tasks have no measurement of their " \
           "fallback config" in last


# -- 4. one --min-trials default -------------------------------------------------------------------------------

def test_tune_compare_and_report_share_the_min_trials_default():
    p = build_parser()
    got = {cmd: p.parse_args([cmd, "x"]).min_trials for cmd in ("tune", "compare", "report")}
    assert got == {"tune": MIN_TRIALS, "compare": MIN_TRIALS, "report": MIN_TRIALS}
    import inspect
    assert inspect.signature(tune_model).parameters["min_trials"].default == MIN_TRIALS


# -- 5. --early-stopping ---------------------------------------------------------------------------------------

def test_early_stopping_stops_each_task_and_shrinks_the_total(model, tmp_path, fake, monkeypatch, capsys):
    import tqdm.auto
    fake(slower=True)  # the fallback (2 ms) is never beaten: each task stops 2 measurements after it
    monkeypatch.setattr(tqdm.auto, "tqdm", RecordingBar)
    RecordingBar.made = []
    assert main(["tune", model, "--log", str(tmp_path / "t.jsonl"), "--storage", f"sqlite:///{tmp_path / 's.db'}",
                 "--scope", "buffer", "--sampler", "random", "--trials", "40", "--min-trials", "6",
                 "--early-stopping", "2", "--parallel", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("(stopped early)") == 4
    per_task = collections.Counter(r.study for r in _measured(tmp_path / "t.jsonl"))
    assert sorted(per_task.values()) == [3, 3, 3, 3]
    bar, = RecordingBar.made
    assert bar.first_total == 40 and bar.total == bar.n == 12


def test_tune_rejects_a_bad_early_stopping(model, capsys):
    assert main(["tune", model, "--early-stopping", "0"]) == 2
    assert "--early-stopping must be at least 1" in capsys.readouterr().err


# -- 6. Ctrl-C -------------------------------------------------------------------------------------------------

def _studies(storage):
    out = []
    for s in optuna.get_all_study_summaries(storage):
        out += optuna.load_study(study_name=s.study_name, storage=storage).trials
    return out


def _assert_no_duplicates(log):
    keys = [(r.template, json.dumps(r.workload, sort_keys=True), json.dumps(r.scopes, sort_keys=True),
             json.dumps(r.config, sort_keys=True)) for r in _measured(log)]
    assert len(keys) == len(set(keys)), [k for k, n in collections.Counter(keys).items() if n > 1]


def test_ctrl_c_while_measuring_leaves_no_trial_running_and_a_rerun_repeats_nothing(model, tmp_path, fake,
                                                                                    monkeypatch):
    fake()
    real, calls = Measurer.measure, []

    def interrupted(self, inputs):
        calls.append(len(inputs))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, inputs)
    fake_measurer(monkeypatch, interrupted)
    storage = f"sqlite:///{tmp_path / 's.db'}"
    kwargs = dict(log=str(tmp_path / "t.jsonl"), trials=16, scope="buffer", min_trials=2, sampler="random",
                  storage=storage, progress=False)
    with pytest.raises(KeyboardInterrupt):
        tune_model(model, **kwargs)
    assert not [t for t in _studies(storage) if t.state == TrialState.RUNNING]
    fake_measurer(monkeypatch, real)  # the fake again, uninterrupted (it asserts no repeats)
    tune_model(model, **kwargs)
    _assert_no_duplicates(tmp_path / "t.jsonl")
    assert len(_measured(tmp_path / "t.jsonl")) == 16


def test_ctrl_c_after_logging_tells_the_study_what_the_log_has(model, tmp_path, fake, monkeypatch):
    """Interrupted right after a search logged its batch: every open study knows every record of its task, and
    no trial is left running. The fallbacks go to the log before any study exists (the scheduler measures them
    first, several tasks to a batch); a task's study reads its fallback from the log when it opens."""
    fake()
    search_module = importlib.import_module("tuner.search.tune")  # a task search appends each batch's records
    model_module = importlib.import_module("tuner.scheduler.model")  # the scheduler appends the fallbacks
    calls = []

    def interrupting(real):
        def append_then_interrupt(path, records):
            real(path, records)
            calls.append(len(records))
            if len(calls) == 3:
                raise KeyboardInterrupt
        return append_then_interrupt
    for m in (search_module, model_module):
        monkeypatch.setattr(m, "append_records", interrupting(m.append_records))
    storage = f"sqlite:///{tmp_path / 's.db'}"
    with pytest.raises(KeyboardInterrupt):
        tune_model(model, log=str(tmp_path / "t.jsonl"), trials=16, scope="buffer", min_trials=2,
                   sampler="random", storage=storage, progress=False, options=MeasureOptions(n_parallel=1))
    trials = _studies(storage)
    assert trials and not [t for t in trials if t.state == TrialState.RUNNING]
    logged = _measured(tmp_path / "t.jsonl")
    assert len(logged) == sum(calls)
    studies = {s.study_name for s in optuna.get_all_study_summaries(storage)}
    in_open = [r for r in logged if r.study in studies]
    assert in_open and sum(t.state == TrialState.COMPLETE for t in trials) == len(in_open)


@pytest.mark.slow
def test_sigint_exits_130_without_a_traceback_and_the_rerun_repeats_nothing(model, tmp_path):
    """Real measurements: SIGINT at seeded random moments of `python -m tuner tune`, then a run to the end."""
    log = tmp_path / "t.jsonl"
    argv = [sys.executable, "-m", "tuner", "tune", model, "--log", str(log), "--storage",
            f"sqlite:///{tmp_path / 's.db'}", "--scope", "buffer", "--trials", "14", "--min-trials", "3",
            "--repeats", "2", "--parallel", "1", "--sampler", "random", "--no-progress"]
    rng = random.Random(7)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(3):
        before = len(log.read_text().splitlines()) if log.exists() else 0
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120  # past start-up (imports, planning): wait for a new record, then a moment
        while time.time() < deadline and proc.poll() is None and (
                not log.exists() or len(log.read_text().splitlines()) <= before):
            time.sleep(0.1)
        time.sleep(rng.uniform(0, 2.5))
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        if proc.returncode == 0:  # it finished first: nothing left to interrupt
            break
        assert proc.returncode == 130, err
        assert "Traceback" not in err and "interrupted" in err, err
    r = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    _assert_no_duplicates(log)
    assert len(_measured(log)) >= 14
