"""TuningTask owns a task's identity (key, hash, study names), label and knobs; failed measurements are FAIL
trials (never COMPLETE 0.0) that the samplers still count as measured; the layers point one way (no library
module imports a command-line module) and a source checkout finds tuner.templates / tuner.search_space."""
import ast
import dataclasses
import hashlib
import os
import subprocess
import sys
import sysconfig
import types
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from tuner.cli import build_parser, workload_from_args
from tuner.errors import ErrorCode, TunerError
from tuner.logs import load_records
from tuner.logs.record import canonical_json, scope_knobs, scopes_of
from tuner.measure import MeasureResult, Measurer
from tuner.search import ConstrainedRandomSampler, XGBSampler, tune
from tuner.search.features import derived_features
from tuner.search.shared import final_state, measured_error
from tuner.task import TuningTask
from tuner.templates import get_template

ROOT = Path(__file__).resolve().parents[1]
BUFFERS = {"input": "buffer", "weight": "buffer", "output": "buffer"}
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _conv(**kw):
    return get_template("conv2d").workload(**{"data": (1, 8, 8, 8), "kernel": (8, 8, 3, 3), "padding": 1, **kw})


# -- identity ----------------------------------------------------------------------------------------------------

def test_identity_is_template_workload_scopes_and_pinned_knobs():
    wl = _conv()
    a = TuningTask("conv2d", wl, BUFFERS)
    assert a == TuningTask("conv2d", wl.key(), dict(reversed(list(BUFFERS.items()))), trials=3, weight=9.0)
    others = [TuningTask("conv2d", _conv(padding=0), BUFFERS), TuningTask("conv2d", wl, {**BUFFERS, "input": "texture"}),
              TuningTask("conv2d", wl, BUFFERS, {"act_layout": "nchw4c"}), TuningTask("conv2d", wl)]
    assert len({a.hash, *(t.hash for t in others)}) == 5
    # the hash of a registered task never changes: shared studies are found by it
    ident = {"template": "conv2d", "workload": wl.key(), "scopes": BUFFERS, "fixed": {}}
    assert a.hash == hashlib.sha1(canonical_json(ident).encode()).hexdigest()[:12]
    assert a.study_name("pocl-cpu-1") == f"conv2d-{a.hash}-pocl-cpu-1 {a.label.split(' ', 1)[1]}"
    assert a.study_name("pocl-cpu-1", "net").startswith(f"net-{a.hash}-pocl-cpu-1 ")
    assert TuningTask.from_dict(a.to_dict()) == a and a.record_key("fp") == ("fp", "conv2d", canonical_json(wl.key()),
                                                                             canonical_json(BUFFERS))
    with pytest.raises(TunerError, match="scopes"):
        TuningTask("conv2d", wl, {"input": "image"})
    with pytest.raises(TunerError, match="unknown task fields"):
        TuningTask.from_dict({"template": "conv2d", "workload": wl.key(), "budget": 3})


def test_labels_say_what_the_task_is():
    """One label per workload: the task's is the one `tuner logs` and the reports show (analysis.workload_label)."""
    from tuner.analysis import workload_label
    conv = _conv(data=(1, 64, 56, 56), kernel=(64, 64, 3, 3), activation="relu")
    assert TuningTask("conv2d", conv).label == workload_label("conv2d", conv.key()) + " [fallback scopes]"
    dense, dw = get_template("dense"), get_template("depthwise_conv2d")
    assert TuningTask("conv2d", _conv(data=(1, 64, 56, 56), kernel=(64, 64, 3, 3), activation="relu"),
                      {"input": "texture", "weight": "texture", "output": "buffer"}).label == \
        "conv2d 64->64 3x3 p1 @56x56 +relu [texture/texture/buffer]"
    assert TuningTask("dense", dense.workload(data=(1, 256), weight=(100, 256), bias=True), BUFFERS).label == \
        "dense 256->100 +bias [buffer/buffer/buffer]"
    wl = dw.workload(data=(1, 32, 56, 56), kernel=(32, 1, 3, 3), stride=2, padding=(0, 0, 1, 1), dtype="float16")
    assert TuningTask("depthwise_conv2d", wl).label == "depthwise_conv2d 32 3x3 s2 p(0,0,1,1) @56x56 fp16 [fallback scopes]"


def test_knobs_and_scopes_convert_one_way_and_back(device):
    wl = _conv()
    task = TuningTask("conv2d", wl, fixed={"act_layout": "nchw4c"})
    bound = task.bind(device)
    assert bound == dataclasses.replace(task, scopes=bound.scopes) and set(bound.scopes) == set(BUFFERS)
    assert bound.knobs == {"act_layout": "nchw4c", **scope_knobs(bound.scopes)}
    cfg = bound.fallback(device)
    assert scopes_of(cfg) == bound.scopes and cfg.act_layout == "nchw4c"
    assert bound.space(device).size() == get_template("conv2d").space(wl, device, **bound.knobs).size()


def test_model_knobs_features_and_workload_options_live_on_the_templates(device):
    conv, dense = get_template("conv2d"), get_template("dense")
    assert conv.model_knobs == {"act_layout": "nchw4c"} and dense.model_knobs == {}
    wl = _conv()
    values = conv.config_values(wl, conv.fallback(wl, device.info))
    f = derived_features(conv, conv.space_vars(wl), values)
    assert {"work_per_item", "bytes_per_mac", "registers", "tex.input"} <= set(f)
    assert derived_features("conv2d", conv.space_vars(wl), values) == f
    # the grid rounds each axis up to whole work-groups: a 32-wide group over a 20-wide row launches 32 columns
    # (1.6 per useful one), over the 5 tiles of 4 columns it launches 32 (6.4); a group that fits wastes none
    wide = get_template("conv2d").workload(data=(1, 24, 20, 20), kernel=(48, 24, 3, 3), padding=1)
    vars = conv.space_vars(wide)
    cfg = lambda **k: conv.config_values(wide, dataclasses.replace(conv.fallback(wide, device.info), **k))  # noqa: E731
    waste = lambda **k: derived_features(conv, vars, cfg(**k))["launch_waste"]  # noqa: E731
    assert waste(tile_ow=1, wg_w=32, wg_h=2) == pytest.approx(1.6)
    assert waste(tile_ow=4, wg_w=32, wg_h=2) == pytest.approx(6.4)
    assert waste(tile_ow=4, wg_w=1, wg_h=4) == pytest.approx(1.0)
    args = build_parser().parse_args(["op", "conv2d", "--data", "1,8,6,6", "--kernel", "8,4,3,3", "--groups", "2",
                                      "--activation", "leaky_relu(0.2)"])
    t, wl = workload_from_args(args)
    assert t is conv and wl.groups == 2 and wl.kernel == (8, 4, 3, 3) and wl.activation.startswith("leaky_relu")
    args = build_parser().parse_args(["op", "dense", "--data", "1,16", "--weight", "8,16", "--kernel", "1,1,1,1"])
    with pytest.raises(TunerError, match="dense takes no --kernel"):
        workload_from_args(args)


# -- failed measurements are FAIL trials ---------------------------------------------------------------------------

def test_failed_measurements_are_fail_trials_and_are_never_measured_again(device, tmp_path, monkeypatch):
    calls = []

    def measure(self, inputs):  # every other config fails to compile
        out = []
        for inp in inputs:
            calls.append(canonical_json(dataclasses.asdict(inp.config)))
            out.append(MeasureResult(ErrorCode.COMPILE, "boom", timestamp="t") if len(calls) % 2 else
                       MeasureResult(costs=[1e-3], max_rel_error=0.0, timestamp="t"))
        return out
    monkeypatch.setattr(Measurer, "measure", measure)
    log, storage = str(tmp_path / "t.jsonl"), f"sqlite:///{tmp_path / 's.db'}"
    res = tune("conv2d", _conv(), device, trials=6, log=log, storage=storage, sampler="random", scopes=BUFFERS,
               progress=False)
    assert res.measured == 6 and res.best.ok
    trials = optuna.load_study(study_name=res.study_name, storage=storage).trials
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert len(failed) == 3 and all(t.user_attrs["error"] == "COMPILE" and t.value is None for t in failed)
    assert all(t.value > 0 for t in trials if t.state == TrialState.COMPLETE)
    assert {measured_error(t) for t in trials} == {"COMPILE", "NO_ERROR"}
    # a fresh study (another storage) hears of the log's failures as FAIL trials; nothing is measured twice
    again = tune("conv2d", _conv(), device, trials=4, log=log, storage=f"sqlite:///{tmp_path / 'fresh.db'}",
                 sampler="xgb", scopes=BUFFERS, progress=False)
    assert again.measured == 4 and len(calls) == len(set(calls)) == 10 == len(load_records(log))
    fresh = optuna.load_study(study_name=res.study_name, storage=f"sqlite:///{tmp_path / 'fresh.db'}").trials
    assert sum(t.state == TrialState.FAIL and bool(t.user_attrs.get("from_log")) for t in fresh) == 3


def test_samplers_count_measured_failures_as_seen(device):
    t = get_template("dense")
    wl = t.workload(data=(1, 256), weight=(100, 256))
    space = t.space(wl, device, input_scope="buffer", weight_scope="buffer", output_scope="buffer")
    dists = {n: CategoricalDistribution(c) for n, c in space.choices.items()}
    xgb = XGBSampler(space, "dense", t.space_vars(wl), seed=0, n_warmup=4, epsilon=0.0)
    study = optuna.create_study(direction="maximize", sampler=xgb)
    key = lambda p: tuple(p[n] for n in space.choices)  # noqa: E731
    failed, unmeasured = set(), set()
    for i in range(12):
        trial = study.ask(dists)
        if i % 3 == 0:  # a failed measurement
            trial.set_user_attr("error", "RUNTIME")
            study.tell(trial, state=TrialState.FAIL)
            failed.add(key(trial.params))
        elif i == 1:  # a trial that was never measured (interrupted): it may be proposed again
            study.tell(trial, state=TrialState.FAIL)
            unmeasured.add(key(trial.params))
        else:
            study.tell(trial, trial.params["tile_m"] * 2.0 + trial.params["split_k"])
    seen = xgb.seen(study)
    assert failed <= seen and seen == {key(t.params) for t in study.trials if measured_error(t)}
    assert measured_error(study.trials[1]) is None  # the interrupted one (its config may come again, and fail then)
    assert key(study.trials[1].params) in unmeasured
    assert ConstrainedRandomSampler(space).seen(study) == seen
    assert xgb.model_fits > 0  # trained on successes and failures (as zeros)
    assert final_state({"error_code": 2, "median_s": None, "gflops": None}) == (TrialState.FAIL,)
    assert final_state({"error_code": 0, "median_s": 1e-3, "gflops": 2.0}) == (TrialState.COMPLETE, [2.0])


# -- layers and packaging ------------------------------------------------------------------------------------------

# the command modules (tuner/cli/); its args.py (shared options) and parser.py (the error line) are libraries of the CLI
CLI_MODULES = {"tuner.cli", "tuner.cli.model", "tuner.cli.search", "tuner.cli.analysis", "tuner.cli.programs",
               "tuner.cli.__main__"}


def _imports(path: Path, package: str) -> set:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return out


def test_no_library_module_imports_a_command_line_module():
    offenders = []
    for folder, package in ((ROOT / "tuner", "tuner"), (ROOT / "templates", "tuner.templates"),
                            (ROOT / "search_space", "tuner.search_space")):
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            module = ".".join([package, *rel.parts]).removesuffix(".__init__")
            pkg = module if path.name == "__init__.py" else module.rpartition(".")[0]
            bad = _imports(path, pkg) & CLI_MODULES - {module}
            if module == "tuner.cli":  # registers the other commands' parsers
                bad -= CLI_MODULES
            if module in ("tuner.__main__", "tuner.cli.__main__"):  # the entry points
                bad -= {"tuner.cli"}
            if bad:
                offenders.append((module, sorted(bad)))
    assert not offenders
    for shared in ("args.py", "parser.py"):  # what every command uses imports none of them
        assert not _imports(ROOT / "tuner" / "cli" / shared, "tuner.cli") & CLI_MODULES, shared


def test_a_source_checkout_finds_templates_and_search_spaces(tmp_path):
    """Python run from the repository root imports the checkout's tuner/, which has no templates/ or
    search_space/ (pyproject maps them from top-level folders): without site's path hooks (no editable
    install), with PYTHONPATH at the checkout and the installed dependencies."""
    paths = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *paths])}
    code = ("import tuner, tuner.templates, tuner.search_space; from tuner.templates import get_template; "
            "print(tuner.templates.__file__); print(get_template('dense').space().path); print(tuner.__path__)")
    r = subprocess.run([sys.executable, "-S", "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    templates, space, path = r.stdout.splitlines()
    assert Path(templates) == ROOT / "templates" / "__init__.py" and Path(space) == ROOT / "search_space" / "dense.toml"
    assert str(ROOT) in path  # the checkout's root joined tuner.__path__ (no editable finder here)


def test_a_sibling_log_that_vanishes_while_it_is_read_is_skipped(tmp_path, monkeypatch):
    """Another tuner's writability probe (``ensure_writable``) creates and removes its log: a transfer read that
    lists the folder in between must skip the file, not fail (it failed a threaded worker test in CI)."""
    import tuner.logs.index as index_mod
    import tuner.task as task_mod

    t, ghost = TuningTask("conv2d", _conv(), BUFFERS), tmp_path / "other.jsonl"
    ghost.write_text("")
    real = index_mod.load_records

    def vanish(path):  # the probe removes the file after it was listed and stat'ed
        path.unlink()
        return real(path)

    monkeypatch.setattr(index_mod, "load_records", vanish)
    assert task_mod.log_knowledge(str(tmp_path / "mine.jsonl"), t, "fp", _Space(), True) == ({}, [])
    monkeypatch.setattr(index_mod, "load_records", real)
    ghost.mkdir()  # there, but not a log: still an error
    with pytest.raises(TunerError):
        index_mod.LogIndex.of_log(ghost)


class _Space:
    choices = {"dtype": ["float32"]}


def test_a_record_written_before_a_knob_existed_counts_with_the_knobs_default(device, tmp_path):
    """conv2d's ``split_k`` is newer than many logs: their records ran with split_k=1 and are still known (never
    measured again) and still transfer."""
    from tuner.logs import append_records
    from tuner.logs.record import Record
    from tuner.task import log_knowledge

    t = TuningTask("conv2d", _conv(), BUFFERS)
    space = t.space(device)
    cfg = dataclasses.replace(t.fallback(device), split_k=1)
    old = Record.new("conv2d", t.workload, {k: v for k, v in dataclasses.asdict(cfg).items() if k != "split_k"},
                     device, costs=[1e-3])
    other = TuningTask("conv2d", _conv(padding=0), BUFFERS)
    old_other = Record.new("conv2d", other.workload, {k: v for k, v in dataclasses.asdict(cfg).items()
                                                      if k != "split_k"}, device, costs=[1e-3])
    log = tmp_path / "old.jsonl"
    append_records(log, [old, old_other])
    known, others = log_knowledge(str(log), t, device.fingerprint, space)
    assert [dict(zip(space.choices, k))["split_k"] for k in known] == [1]
    assert len(others) == 1 and others[0][1]["split_k"] == 1


def test_a_config_another_tuner_just_asked_is_in_flight_before_its_owner_is_set():
    """Between ``study.ask`` and setting the ``owner`` attribute a peer's RUNNING trial has no owner: a tuner
    proposing the same config then must treat it as being measured (it measured it twice in CI), while a dead
    owner's trial is not."""
    from types import SimpleNamespace

    from tuner.search.tune import _key, _peer_state

    study = optuna.create_study(direction="maximize")
    dists = {"a": CategoricalDistribution([1])}  # one config: both ask it
    s = SimpleNamespace(study=study, names=["a"], known={})
    peer = study.ask(dists)  # asked by a peer, owner not set yet
    mine = study.ask(dists)
    k = _key({"a": 1}, s.names)
    assert _peer_state(s, k, mine.number) == "in_flight"
    peer.set_user_attr("owner", "some-other-host:1")  # a tuner elsewhere is not known to be alive
    assert _peer_state(s, k, mine.number) is None


def test_a_peer_still_inside_ask_is_waited_for_and_a_finished_peer_is_learnt_from(device):
    """``study.ask`` creates the RUNNING trial before it writes the parameters: a peer's trial asked first but
    showing no config yet is waited for (CI measured a config twice in that window), up to a limit; a peer
    that finished the config gives its record, read in the same snapshot as the running trials."""
    import threading
    import time

    from tuner.logs.record import Record
    from tuner.search.tune import _key, _peer_state

    dist = CategoricalDistribution([1, 2])
    study = optuna.create_study(direction="maximize")
    s = types.SimpleNamespace(study=study, names=["a"], known={})
    storage, sid = study._storage, study._study_id
    peer_id = storage.create_new_trial(sid)  # a peer inside ask: RUNNING, parameters not written yet
    mine = study.ask({"a": dist})
    k = _key({"a": mine.params["a"]}, s.names)
    threading.Timer(0.1, storage.set_trial_param, (peer_id, "a", dist.to_internal_repr(mine.params["a"]),
                                                   dist)).start()
    t0 = time.monotonic()
    assert _peer_state(s, k, mine.number, wait_s=5.0) == "in_flight"
    assert 0.05 < time.monotonic() - t0 < 4.0
    stuck = storage.create_new_trial(sid)  # a peer killed inside ask: waited for only up to the limit
    again = study.ask({"a": dist})
    t0 = time.monotonic()
    assert _peer_state(s, _key({"a": again.params["a"]}, s.names), again.number, wait_s=0.3) != "known"
    assert time.monotonic() - t0 < 2.0
    for number in (stuck, peer_id, mine._trial_id, again._trial_id):
        storage.set_trial_state_values(number, optuna.trial.TrialState.FAIL)
    done = study.ask({"a": dist})  # a peer that measured the config: its record is known, nothing to measure
    t = get_template("conv2d")  # records are checked against their template's knobs when read back
    rec = Record.new("conv2d", _conv(), dataclasses.replace(t.config(), tile_oc=done.params["a"]), device,
                     costs=[1e-3])
    done.set_user_attr("record", rec.to_dict())
    study.tell(done, 1.0)
    late = study.ask({"a": dist})
    kl = _key({"a": done.params["a"]}, s.names)
    assert _peer_state(s, kl, late.number) == "known" and s.known[kl].median_s == rec.median_s


def test_a_peer_trial_without_its_config_older_than_the_wait_is_not_waited_for():
    """An asker that failed inside ``ask`` and lives on leaves a RUNNING trial without parameters behind, in flight
    by its live owner: every later proposal would wait the full limit for it. One older than the limit is not
    waited for."""
    import socket
    import time

    from tuner.search.tune import _key, _peer_state

    study = optuna.create_study(direction="maximize")
    s = types.SimpleNamespace(study=study, names=["a"], known={})
    storage, sid = study._storage, study._study_id
    orphan = storage.create_new_trial(sid)
    storage.set_trial_user_attr(orphan, "owner", f"{socket.gethostname()}:{os.getppid()}")  # a live one: in flight
    mine = study.ask({"a": CategoricalDistribution([1])})
    k = _key({"a": 1}, s.names)
    t0 = time.monotonic()
    assert _peer_state(s, k, mine.number, wait_s=0.3) is None and time.monotonic() - t0 >= 0.25  # young: waited
    time.sleep(0.1)
    t0 = time.monotonic()
    assert _peer_state(s, k, mine.number, wait_s=0.3) is None and time.monotonic() - t0 < 0.2  # old: not
