"""Tuning: an Optuna study per task, resumed from its storage and its log; never the same config twice,
not even across a run killed with SIGKILL."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

from tuner.logs import apply_history_best, load_records
from tuner.measure import MeasureOptions
from tuner.search import XGBSampler, study_name, tune
from tuner.search.shared import measured_error
from tuner.templates import get_template

ROOT = Path(__file__).resolve().parents[1]
FAST = MeasureOptions(repeats=2, min_seconds=0, n_parallel=2, build_timeout=60, run_timeout=30)
BUFFERS = {"input": "buffer", "weight": "buffer", "output": "buffer"}


def _measured(records):
    return [r for r in records if r.error_name != "INSTANTIATION"]


def _configs(records):
    return [json.dumps(r.config, sort_keys=True) for r in _measured(records)]


@pytest.mark.slow
def test_tune_then_resume_never_measures_a_config_twice(device, tmp_path):
    t = get_template("conv2d")
    wl = t.workload(data=(1, 8, 8, 8), kernel=(8, 8, 3, 3), padding=1)
    log = str(tmp_path / "log.jsonl")
    first = tune("conv2d", wl, device, trials=10, log=log, sampler="xgb", scopes=BUFFERS, options=FAST,
                 progress=False)
    assert first.measured == 10 and len(_measured(load_records(log))) == 10
    assert first.best.ok and first.best.gflops == max(r.gflops or 0 for r in load_records(log))
    again = tune("conv2d", wl, device, trials=4, log=log, sampler="random", scopes=BUFFERS, options=FAST,
                 progress=False, seed=1)
    configs = _configs(load_records(log))
    assert again.measured == 4 and len(configs) == 14 == len(set(configs))
    study = optuna.load_study(study_name=first.study_name, storage=f"sqlite:///{tmp_path / 'studies.db'}")
    assert sum(measured_error(tr) is not None for tr in study.trials) >= 14  # successes and failures
    assert all(tr.value > 0 for tr in study.trials if tr.state == TrialState.COMPLETE)  # never a made-up 0
    assert study.user_attrs["task"]["scopes"] == BUFFERS and study.metric_names == ["GFLOP/s"]
    assert study.user_attrs["label"] == first.label == "conv2d 8->8 3x3 p1 @8x8 [buffer/buffer/buffer]"
    # the log applies: the tuned config is what a compile would use
    with apply_history_best(log) as history:
        assert history.pick(t, wl, device, BUFFERS) == t.config(**again.best.config)


@pytest.mark.slow
def test_resume_after_sigkill_loses_nothing_and_repeats_nothing(tmp_path):
    log = tmp_path / "log.jsonl"
    argv = [sys.executable, "-m", "tuner.cli", "tune-op", "conv2d", "--data", "1,8,8,8", "--kernel", "8,8,3,3",
            "--padding", "1", "--scope", "buffer", "--repeats", "2", "--log", str(log),
            "--no-progress"]
    proc = subprocess.Popen([*argv, "--trials", "40"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 3):
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = load_records(str(log))
    assert len(before) >= 3
    r = subprocess.run([*argv, "--trials", "4"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    after = load_records(str(log))
    assert [x.to_json() for x in after[:len(before)]] == [x.to_json() for x in before]  # nothing lost
    configs = _configs(after)
    assert len(configs) == len(set(configs)) == len(_measured(before)) + 4  # nothing measured twice
    study = optuna.load_study(study_name=before[0].study, storage=f"sqlite:///{tmp_path / 'studies.db'}")
    assert not any(tr.state == TrialState.RUNNING for tr in study.trials)  # the killed run's trial is failed


def test_xgb_sampler_learns_and_never_repeats(device):
    """The sampler on a synthetic objective (no device): after warm-up it fits its model, proposes only
    valid unseen configs, and finds better configs than its random warm-up did."""
    t = get_template("dense")
    wl = t.workload(data=(1, 256), weight=(100, 256))
    space = t.space(wl, device, input_scope="buffer", weight_scope="buffer", output_scope="buffer")

    def objective(values):  # prefers big tiles and split_k 4: a smooth landscape a model can learn
        return values["tile_m"] * 2 + (4 - abs(np.log2(values["split_k"]) - 2)) + np.log2(values["wg_m"]) * 0.5

    sampler = XGBSampler(space, "dense", t.space_vars(wl), seed=0, n_warmup=8, epsilon=0.0, far=(0.0, 0.0))
    study = optuna.create_study(direction="maximize", sampler=sampler)
    seen = set()
    from optuna.distributions import CategoricalDistribution
    dists = {n: CategoricalDistribution(c) for n, c in space.choices.items()}
    for _ in range(30):
        trial = study.ask(dists)
        values = dict(trial.params)
        key = tuple(values[n] for n in space.choices)
        assert key not in seen and space.violations(values) == []
        seen.add(key)
        study.tell(trial, objective(values))
    values = [tr.value for tr in study.trials]
    assert sampler.model_fits >= 20
    assert max(values[8:]) > max(values[:8])  # the model beat random warm-up
    assert np.mean(values[-10:]) > np.mean(values[:8])


def test_study_names_key_the_task():
    t = get_template("conv2d")
    a = t.workload(data=(1, 8, 8, 8), kernel=(8, 8, 3, 3), padding=1)
    b = t.workload(data=(1, 8, 8, 8), kernel=(8, 8, 3, 3), padding=0)
    name = study_name("conv2d", a, BUFFERS, "pocl-cpu-1")
    assert name == study_name("conv2d", a, dict(BUFFERS), "pocl-cpu-1")
    assert name != study_name("conv2d", b, BUFFERS, "pocl-cpu-1")
    assert name != study_name("conv2d", a, {**BUFFERS, "input": "texture"}, "pocl-cpu-1")
    assert name != study_name("conv2d", a, BUFFERS, "nvidia-gpu-2")


def test_a_small_space_all_in_the_log_stops_proposing():
    """A task whose every valid config is in the log stops proposing once ``REPEATS`` proposals in a row measured
    nothing new, instead of asking its whole proposal budget (20 x trials + 100) of the study, each answered from
    the log (a 12-config task spent 160 s so on an H100; a 9-config one here, re-run with TPE, 380 proposals in
    78 s). The space is counted only then, and only once."""
    from types import SimpleNamespace

    from tuner.search.tune import LocalStrategy, TuneResult
    counted = []

    class Space:
        def size(self):
            counted.append(1)
            return 9

        def violations(self, params):
            return ["too big"] if params["x"] >= 9 else []
    session = SimpleNamespace(space=Space(), names=["x"], known={(i,): None for i in range(8)})
    s = LocalStrategy(session, TuneResult.__new__(TuneResult), max_proposals=280)
    s.repeats = LocalStrategy.REPEATS - 1
    assert not s.finished() and not counted  # measuring new configs: the space is never counted
    s.repeats = LocalStrategy.REPEATS
    assert not s.finished() and len(counted) == 1  # one config of 9 is not in the log yet
    session.known[(9,)] = None  # a logged config the constraints reject now: not one of the 9
    assert not s.finished() and len(counted) == 1
    session.known[(8,)] = None
    assert s.finished() and s.exhausted() and len(counted) == 1  # all 9 known: done, counted once


def test_a_tiny_space_sends_no_refused_config_to_the_device_and_stops(tmp_path):
    """A task with fewer valid configs than its trials (EfficientNet-B0's squeeze-excite 1x1 conv2d on a
    [1,4,1,1] input: 12) used to send 472 refused proposals to the device, 0.75 s each on an H100 (bench/notes/
    peers.md): once every valid config was seen, the sampler fell back to Optuna's independent draws, whose
    rejects went to the measurer one by one and reset the count that ends an exhausted space. Now the strategy
    refuses them itself and the run ends after ``REPEATS`` such proposals."""
    from tuner.measure import MeasureResult, Runner
    from tuner.search.tune import LocalStrategy
    from conftest import profile
    from tuner.logs.record import scope_knobs
    info = profile(name="CPU", type="CPU", compute_units=2, image_support=False, half_images=False,
                   image2d_max_width=0, image2d_max_height=0, max_work_item_sizes=[1024, 1024, 1024],
                   local_mem_bytes=32768, fp16=False)
    t = get_template("dense")
    wl = t.workload(data=(1, 4), weight=(4, 4))
    space = t.space(wl, info, **scope_knobs(BUFFERS))
    valid = space.size()
    assert 1 < valid < 16

    class Device(Runner):
        def __init__(self):
            self.info, self.seen = info, []

        def measure(self, inputs):
            self.seen += [t.config_values(wl, i.config) for i in inputs]
            return [MeasureResult(costs=[1e-4, 1e-4]) for _ in inputs]
    device = Device()
    for sampler in ("xgb", "random"):
        log = str(tmp_path / f"{sampler}.jsonl")
        res = tune("dense", wl, info, trials=16, log=log, sampler=sampler, scopes=BUFFERS, measurer=device,
                   progress=False, storage=f"sqlite:///{tmp_path / sampler}.db")
        assert res.measured == valid and len(load_records(log)) == valid  # every valid config, no reject logged
        study = optuna.load_study(study_name=res.study_name, storage=f"sqlite:///{tmp_path / sampler}.db")
        assert len(study.trials) <= valid + 2 * LocalStrategy.REPEATS  # not 20 x 16 + 100 proposals
    assert all(not space.violations({k: v[k] for k in space.choices}) for v in device.seen)
    assert len(device.seen) == 2 * valid
