"""The model-level task scheduler (``tuner.scheduler``): the policy on its own (which task it visits, how a node's
pool of variants counts, when a task is done), then ``tune_model`` with a time budget: every fallback first, the
budget kept, the visits going where the latency is, and a log that compiles at every prefix -- with the scope
boundary that used to make `tuner tune` and `tuner compile` fail at the end (a pool whose buffer kernel is
fastest, fed by a texture producer).

The model runs use a deterministic fake measurement (no device work): they test the scheduling, fast."""
import collections
import dataclasses
import json
import time

import onnx
import pytest

from conftest import fake_measurer
from tuner.cli import main
from tuner.measure import Batch, MeasureOptions, MeasureResult, Measurer, Runner
from tuner.scheduler.model import tune_model
from tuner.scheduler.task_scheduler import TaskScheduler
from tuner.zoo import models as zoo


# -- the policy ----------------------------------------------------------------------------------------------------

def test_the_task_with_the_largest_expected_cut_is_visited_first():
    s = TaskScheduler({"big": ["conv1", "conv2"], "small": ["conv3"]})
    s.observe("big", [0.004])  # 2 nodes at 4 ms
    s.observe("small", [0.001])
    assert s.pick() == "big"
    assert s.latency_s() == (pytest.approx(0.009), 0)


def test_a_variant_that_cannot_beat_its_node_gets_nothing_while_another_can():
    s = TaskScheduler({"tex": ["conv1"], "buf": ["conv1"], "other": ["conv2"]})
    s.observe("tex", [0.001])
    s.observe("buf", [0.010])  # even halved it stays slower than the texture kernel of the same node
    s.observe("other", [0.0005])
    assert s.expected_cut("buf") == 0.0
    assert s.pick() in ("tex", "other") and s.pick() != "buf"
    assert s.latency_s()[0] == pytest.approx(0.0015)  # the node runs its fastest variant


def test_a_task_whose_improvements_stopped_leaves_the_pool():
    s = TaskScheduler({"a": ["n1"], "b": ["n2"]}, patience=4)
    s.observe("a", [0.002, 0.0015])
    s.observe("a", [0.0016, 0.0017, 0.0015, 0.00151])
    assert s.tasks["a"].done == "no improvement in 4 measurements"
    s.observe("b", [0.003])
    assert s.pick() == "b" and s.open == ["b"]


def test_the_gain_falls_as_a_task_is_measured_and_rises_with_recent_improvements():
    s = TaskScheduler({"a": ["n1"]})
    s.observe("a", [0.004])
    fresh = s.tasks["a"].gain()
    s.observe("a", [0.004] * 30)
    s.end_visit("a")
    stale = s.tasks["a"].gain()
    assert stale < fresh
    s.observe("a", [0.002])
    s.end_visit("a")
    assert s.tasks["a"].gain() > stale


def test_an_unmeasured_node_is_worth_everything_and_counted_as_missing():
    s = TaskScheduler({"a": ["n1"], "b": ["n2"]})
    s.observe("a", [0.001])
    assert s.pick() == "b"
    assert s.latency_s() == (pytest.approx(0.001), 1)


# -- tune_model with a time budget ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """The zoo's small mixed model: conv2d 3->8, depthwise, conv2d 1x1, the global average pool, dense."""
    path = tmp_path_factory.mktemp("model") / "m.onnx"
    onnx.save(zoo.test_models()["mixed"], path)
    return str(path)


class ScopeFake:
    """Measurer.measure without a device, ``delay`` seconds a config: convolutions run faster with a texture
    output, the pool and the dense layer with a buffer output (the boundary that has no texture-in/buffer-out
    kernel of the pool when its weight role is mis-scoped), the fallback slowest and later configs faster
    until they stall."""

    def __init__(self, delay=0.0, repeats=False):
        self.delay, self.repeats = delay, repeats
        self.seen = collections.defaultdict(list)
        self.visits = []  # one list of workload keys per measure() call

    def __call__(self, measurer, inputs):
        out = []
        self.visits.append([inp.template for inp in inputs])
        for inp in inputs:
            wl = json.dumps(inp.workload.key(), sort_keys=True)
            cfg = dataclasses.asdict(inp.config)
            key = json.dumps(cfg, sort_keys=True)
            seen = self.seen[wl + inp.template + json.dumps(cfg.get("output_scope"))]
            assert self.repeats or key not in seen, "measured twice"
            if key not in seen:
                seen.append(key)
            n = seen.index(key) + 1  # a config re-timed takes its time again
            conv = inp.template in ("conv2d", "depthwise_conv2d", "winograd2", "winograd4")
            tex = cfg.get("output_scope") == "texture"
            base = (1.0 if conv == tex else 3.0) * inp.workload.flops ** 0.5 * 1e-6
            out.append(MeasureResult(costs=[base * max(0.5, 1.0 - 0.1 * (n - 1))], max_rel_error=0.0,
                                     timestamp=time.strftime("%Y-%m-%dT%H:%M:%S")))
        if self.delay:
            time.sleep(self.delay * len(inputs))
        return out


@pytest.fixture
def scope_fake(monkeypatch):
    def install(**kwargs):
        f = ScopeFake(**kwargs)
        fake_measurer(monkeypatch, f)
        return f
    return install


def test_a_time_budget_stops_in_time_after_every_fallback(model, tmp_path, scope_fake, device):
    fake = scope_fake(delay=0.05)
    t0 = time.monotonic()
    res = tune_model(model, log=str(tmp_path / "t.jsonl"), trials=None, time_budget=6.0, device=device,
                     storage=f"sqlite:///{tmp_path / 's.db'}", sampler="random", progress=False)
    took = time.monotonic() - t0
    assert took < 6.0 + 4.0, took  # the budget, and the summary after it
    # every task of the pool had its fallback measured, several to a batch, before any task got a second visit
    from tuner.logs import load_records
    recs = load_records(str(tmp_path / "t.jsonl"))
    assert len(res.tasks) >= 8 and all(t.records for t in res.tasks)
    assert {r.sampler for r in recs[:len(res.tasks)]} == {"fallback"}
    assert len(fake.visits[0]) > 1
    assert res.measured > len(res.tasks)  # then visits
    assert res.fallback_estimate_s and res.estimate.tuned_s < res.estimate.fallback_s
    assert not res.failed


class BackgroundFake(Runner):
    """A runner that measures in the background like ``Measurer``: ``builders`` threads, each config taking
    ``fast`` seconds but the first of every visit (a batch of one task) ``slow`` (a straggler), with ``ScopeFake``'s timings. It records
    which tasks' batches were open at once."""

    def __init__(self, info, builders=3, fast=0.01, slow=0.4):
        from concurrent.futures import ThreadPoolExecutor
        import threading
        self.info, self.fast, self.slow, self.builders = info, fast, slow, builders
        self.fake = ScopeFake()
        self.pool = ThreadPoolExecutor(builders)
        self.cv = threading.Condition()
        self.queued = self.running = 0
        self.open = []  # (task keys, Batch) of the batches not done
        self.overlaps = []  # the task keys of the batches open at once, whenever a batch starts beside another

    def measure(self, inputs):
        return self.start(inputs).wait()

    def start(self, inputs):
        results = self.fake(self, inputs)
        batch = Batch(len(inputs), on_done=self._notify)
        keys = {(i.template, json.dumps(i.workload.key(), sort_keys=True),
                 json.dumps(dataclasses.asdict(i.config).get("output_scope"))) for i in inputs}
        with self.cv:
            self.open = [(k, b) for k, b in self.open if not b.done]
            if self.open:
                self.overlaps.append([k for k, _ in self.open] + [keys])
            self.open.append((keys, batch))
            self.queued += len(inputs)
        for i, r in enumerate(results):
            self.pool.submit(self._one, batch, i, r, self.slow if i == 0 and len(keys) == 1 else self.fast)
        return batch

    def _one(self, batch, i, result, seconds):
        with self.cv:
            self.queued -= 1
            self.running += 1
        time.sleep(seconds)
        with self.cv:
            self.running -= 1
        batch.put(i, result)
        self._notify()

    def _notify(self):
        with self.cv:
            self.cv.notify_all()

    def idle(self):
        with self.cv:
            return self.queued == 0 and self.running < self.builders

    def wait(self, timeout=None, builder=True):
        with self.cv:
            self.cv.wait(timeout)

    def close(self):
        self.pool.shutdown(wait=True)


def test_a_visit_starts_while_the_last_ones_stragglers_finish(model, tmp_path, device):
    """With a runner that measures in the background, the scheduler does not wait for a visit's slowest config:
    it starts the next task's visit once builders are idle, never two visits of one task at a time, and the
    budget and the log hold as before."""
    runner = BackgroundFake(device.info)
    res = tune_model(model, log=str(tmp_path / "t.jsonl"), trials=None, time_budget=5.0, device=runner,
                     sampler="random", progress=False, options=MeasureOptions(n_parallel=3))
    runner.close()
    assert runner.overlaps, "no visit started while another was open"
    for open_keys in runner.overlaps:
        flat = [k for keys in open_keys for k in keys]
        assert len(flat) == len(set(flat)), f"one task in two open visits: {open_keys}"
    assert all(len(o) <= 2 for o in runner.overlaps)
    assert res.measured > len(res.tasks) and not res.failed


def test_a_visit_still_measuring_when_the_budget_ends_is_cut_short(model, tmp_path, device):
    """A straggler that would outlast the budget does not hold the tune: what finished is logged, the rest is left
    to a re-run (nothing in the study stays running), and the tune ends inside its budget."""
    runner = BackgroundFake(device.info, slow=3.0)
    t0 = time.monotonic()
    res = tune_model(model, log=str(tmp_path / "t.jsonl"), trials=None, time_budget=4.0, device=runner,
                     sampler="random", progress=False, options=MeasureOptions(n_parallel=3))
    took = time.monotonic() - t0
    runner.pool.shutdown(wait=False, cancel_futures=True)
    assert took < 4.0 + 1.0, took
    assert res.measured >= len(res.tasks) and not res.failed


def test_visits_go_to_the_tasks_that_hold_the_latency(model, tmp_path, scope_fake, device):
    scope_fake()
    res = tune_model(model, log=str(tmp_path / "t.jsonl"), trials=60, time_budget=None, device=device,
                     scope="buffer", storage=f"sqlite:///{tmp_path / 's.db'}", sampler="random", progress=False,
                     min_trials=1)
    by_flops = sorted(res.tasks, key=lambda t: -t.task.workload.flops)
    assert by_flops[0].measured > by_flops[-1].measured  # the heaviest layer got more than the lightest
    assert res.measured == 60


@pytest.fixture(scope="module")
def se_model(tmp_path_factory):
    """The zoo's squeeze-excitation block: a convolution feeds the global average pool directly."""
    path = tmp_path_factory.mktemp("model") / "se.onnx"
    onnx.save(zoo.test_models()["squeeze_excitation"], path)
    return str(path)


def test_every_prefix_of_a_time_budget_log_compiles(se_model, tmp_path, scope_fake, device):
    """`tuner tune --time-budget` from an empty log with the default options, then `tuner compile` of every
    prefix of its log (a tune killed at any moment leaves one of these), for the device's profile. The pool
    measures fastest with a buffer output and its producer with a texture one: the boundary that made EfficientNet-B0's
    tune and compile fail at the end on the H200."""
    from tuner.compile.compiler import compile_model
    model = se_model
    scope_fake(delay=0.02)
    log = tmp_path / "t.jsonl"
    assert main(["tune", model, "--log", str(log), "--storage", f"sqlite:///{tmp_path / 's.db'}",
                 "--time-budget", "4s", "--no-progress", "--sampler", "random"]) == 0
    lines = log.read_text().splitlines()
    assert len(lines) >= 10
    kept = set()
    for n in sorted({1, 2, len(lines) // 4, len(lines) // 2, 3 * len(lines) // 4, len(lines)}):
        prefix = tmp_path / f"p{n}.jsonl"
        prefix.write_text("\n".join(lines[:n]) + "\n")
        mod = compile_model(model, log=str(prefix), target=device.info, scope="auto")
        kept.add(tuple(sorted({n.scopes.get("output") for n in mod.spec.nodes if n.template and n.scopes})))
    assert any("buffer" in k for k in kept)  # the pool and the dense layer took buffer outputs somewhere


def test_the_cli_rejects_a_bad_time_budget(model, capsys):
    assert main(["tune", model, "--time-budget", "ten minutes"]) == 2
    assert "is not a duration" in capsys.readouterr().err


def test_a_variant_that_keeps_failing_is_dropped_while_another_serves_its_node():
    s = TaskScheduler({"wino": ["conv1"], "direct": ["conv1"], "other": ["conv2"]}, patience=24)
    s.observe("direct", [0.002])
    s.observe("other", [0.001])
    s.observe("wino", [], measured=2)
    assert s.expected_cut("wino") < s.expected_cut("direct") + 0.002  # worth less than a node's time
    s.observe("wino", [], measured=6)
    assert s.tasks["wino"].done.startswith("8 measurements, none valid")
    lone = TaskScheduler({"only": ["conv9"]}, patience=24)
    lone.observe("only", [], measured=10)  # nothing else serves its node: it keeps trying
    assert lone.tasks["only"].done is None and lone.pick() == "only"


def test_an_unexplored_variant_slower_than_its_node_still_gets_a_visit():
    """The H200's ResNet-18: the buffer kernel of a layer got fast first; its texture kernel, whose fallback was
    twice as slow, ended faster with the committed logs."""
    s = TaskScheduler({"buf": ["conv1"], "tex": ["conv1"]})
    s.observe("buf", [0.0473] + [0.03] * 40 + [0.0291])
    s.end_visit("buf")
    s.observe("tex", [0.0624, 0.0638])
    assert s.pick() == "tex"


@pytest.mark.slow
def test_a_short_real_tune_of_a_held_out_model_ends_well_and_its_log_compiles(tmp_path, device):
    """Real measurements on the device under test, default options but the budget: the zoo's MobileNetV3-Small
    (squeeze-excitation pools read straight from convolutions, hard-swish, both scopes) at 32x32 for 15 s, then
    `tuner compile` of its log: the tune exits 0 within its budget and the log compiles for the device."""
    model = tmp_path / "m.onnx"
    assert main(["zoo", "mobilenet_v3_small", "-o", str(model), "--input-size", "32"]) == 0
    log = tmp_path / "t.jsonl"
    t0 = time.monotonic()
    assert main(["tune", str(model), "--log", str(log), "--time-budget", "15s", "--no-progress"]) == 0
    assert time.monotonic() - t0 < 15 + 15  # the budget, the summary, the model's planning
    assert len(log.read_text().splitlines()) >= 5
    spec = device.info.to_dict()
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(spec))
    assert main(["compile", str(model), "--log", str(log), "--target", str(profile), "-o", str(tmp_path / "a")]) == 0


def test_drift_check_runs_through_the_model_tune_and_is_summarized(model, tmp_path, scope_fake, capsys):
    scope_fake(repeats=True)  # the guard re-times its reference config
    assert main(["tune", model, "--log", str(tmp_path / "t.jsonl"), "--trials", "24", "--min-trials", "1",
                 "--scope", "buffer", "--sampler", "random", "--no-progress", "--drift-check", "4"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("drift check: "))
    checks = int(line.split()[2])
    assert checks >= 3 and "0 drifts" in line  # the fake device never drifts
