"""Configs that travel to a sibling device (issue 26): a log recorded on device A applies on device B only when
A is named (``transfer_from``), says so, and every pick is valid in B's space; a task B has records of never
takes A's; an untuned task takes the logged config the cost model ranks first."""
import dataclasses
import json
import warnings

import numpy as np
import pytest

import tuner
from tuner.cli import main
from tuner.compile.compiler import model_tasks
from tuner.logs.best import (FallbackConfigWarning, SiblingConfigWarning, SiblingDeviceHint, device_family,
                             invalid_config)
from tuner.logs.record import Record, scope_knobs
from tuner.search.samplers import CostModel
from tuner.templates import get_template

BUFFER = {"input": "buffer", "weight": "buffer", "output": "buffer"}


@pytest.fixture
def conv_model(conv3x3_onnx):
    return conv3x3_onnx(32)


@pytest.fixture
def pair(device):
    """Devices A (where the log was tuned) and B (this device): the same family, B with a smaller work-group
    limit, so that some of A's configs are invalid on B."""
    a = dataclasses.replace(device.info, name="Family X200", max_work_group_size=1024)
    b = dataclasses.replace(device.info, name="Family X100", max_work_group_size=64)
    assert device_family(a.platform, a.type, a.name) == device_family(b.platform, b.type, b.name)
    return a, b


def _task(model, info):
    """The direct conv2d's task (the one deployed when the log has no Winograd record)."""
    return next(t for t in model_tasks(model, info, scope="buffer") if t.template == "conv2d")


def _config(task, info, **knobs):
    cfg = task.tmpl.fallback_with(task.workload, info, **task.knobs)
    return dataclasses.replace(cfg, **knobs)


def _sources(mod) -> list:
    return [n.config_source for n in mod.spec.nodes if n.template]


def _compile(model, records, b, **kw):
    return tuner.compile_model(model, log=records, target=b.to_dict(), scope="buffer", **kw)


def test_a_sibling_log_applies_only_when_named_and_says_so(conv_model, pair):
    a, b = pair
    task = _task(conv_model, b)
    cfg = _config(task, a, tile_oc=1, tile_ow=2, wg_w=4)
    records = [Record.new(task.template, task.workload, cfg, a, costs=[1e-4])]
    with pytest.warns(SiblingDeviceHint, match=f"--transfer-from {a.fingerprint}"):
        with pytest.warns(FallbackConfigWarning):
            plain = _compile(conv_model, records, b)
    assert _sources(plain) == ["fallback"]
    with pytest.warns(SiblingConfigWarning, match=a.fingerprint):
        mod = _compile(conv_model, records, b, transfer_from=[a.fingerprint])
    assert _sources(mod) == [f"sibling {a.fingerprint}"]
    node = next(n for n in mod.spec.nodes if n.template)
    assert node.config["tile_ow"] == 2 and not node.tuned  # A's config, not counted as tuned here
    with pytest.warns(SiblingConfigWarning):  # "auto": every device of B's family in the logs
        assert _sources(_compile(conv_model, records, b, transfer_from="auto")) == [f"sibling {a.fingerprint}"]


def test_a_siblings_picks_are_valid_here_even_when_its_best_is_not(conv_model, pair):
    a, b = pair
    task = _task(conv_model, b)
    t = task.tmpl
    best = _config(task, a, tile_oc=1, tile_oh=1, tile_ow=1, wg_w=16, wg_h=8, split_k=1)  # 128 work-items
    slower = _config(task, a, tile_oc=1, tile_oh=1, tile_ow=2, wg_w=4, wg_h=4, split_k=1)
    for cfg in (best, slower):
        assert invalid_config(t, task.workload, a, dataclasses.asdict(cfg)) is None
    assert "work_group" in invalid_config(t, task.workload, b, dataclasses.asdict(best))
    records = [Record.new(task.template, task.workload, best, a, costs=[1e-5]),
               Record.new(task.template, task.workload, slower, a, costs=[1e-3])]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SiblingConfigWarning)
        warnings.simplefilter("error", FallbackConfigWarning)
        mod = _compile(conv_model, records, b, transfer_from=[a.fingerprint])
    node = next(n for n in mod.spec.nodes if n.template)
    assert node.config_source == f"sibling {a.fingerprint}"
    assert node.config == dataclasses.asdict(slower)
    assert invalid_config(t, task.workload, b, node.config) is None
    # only A's invalid config: nothing of A's is deployed, the layer falls back, valid
    with pytest.warns(FallbackConfigWarning), pytest.warns(SiblingConfigWarning):
        mod = _compile(conv_model, records[:1], b, transfer_from=[a.fingerprint])
    node = next(n for n in mod.spec.nodes if n.template)
    assert node.config_source == "fallback" and invalid_config(t, task.workload, b, node.config) is None


def test_a_task_with_records_here_never_takes_a_siblings(conv_model, pair):
    a, b = pair
    task = _task(conv_model, b)
    mine = Record.new(task.template, task.workload, _config(task, b, tile_ow=1), b, costs=[5e-3])
    theirs = Record.new(task.template, task.workload, _config(task, a, tile_ow=2, wg_w=4), a, costs=[1e-6])
    with warnings.catch_warnings():
        warnings.simplefilter("error", SiblingConfigWarning)  # nothing of A's fills anything: no warning
        mod = _compile(conv_model, [mine, theirs], b, transfer_from=[a.fingerprint])
    node = next(n for n in mod.spec.nodes if n.template)
    assert node.config_source == "tuned" and node.config == mine.config


def _synthetic_records(t, info, workloads, n, seed=0):
    """``n`` random valid configs per workload, timed by a rule the cost model can learn: a bigger tile
    (tile_oc x tile_ow) is faster."""
    rng = np.random.default_rng(seed)
    out = []
    for wl in workloads:
        space = t.space(wl, info, **t.model_knobs, **scope_knobs(BUFFER))
        for _ in range(n):
            cfg = t.make_config(space.sample(rng))
            s = 1e-3 / (cfg.tile_oc * cfg.tile_ow) * (1 + 0.01 * rng.random())
            out.append(Record.new(t.name, wl, cfg, info, costs=[s]))
    return out


def test_the_cost_model_ranks_the_candidates(device):
    """With enough records the candidates are ranked by the model (the pick is the valid candidate it scores
    highest); with too few, the nearest workload's config is taken as before."""
    t, info = get_template("conv2d"), device.info
    tuned = [t.workload(data=(1, 16, 32, 32), kernel=(16, 16, 3, 3), padding=(1, 1, 1, 1)),
             t.workload(data=(1, 32, 16, 16), kernel=(32, 32, 3, 3), padding=(1, 1, 1, 1))]
    target = t.workload(data=(1, 16, 16, 16), kernel=(32, 16, 3, 3), padding=(1, 1, 1, 1))
    h = tuner.apply_history_best(_synthetic_records(t, info, tuned, 24))
    pick = h.suggest(t, target, info, BUFFER, t.model_knobs, fit=CostModel.fit)
    assert pick.how == "predicted"
    assert invalid_config(t, target, info, dataclasses.asdict(pick.config)) is None
    tasks = sorted((r for r in h.best.values()), key=lambda r: r.median_s)
    cands = [c for c, _ in h._candidates(t, tasks, t.model_knobs, 96)
             if invalid_config(t, target, info, c) is None]
    scores = h.cost_model(t, info.fingerprint, CostModel.fit).predict(t, target, cands)
    assert dataclasses.asdict(pick.config) == cands[int(np.argmax(scores))]
    size = lambda c: c["tile_oc"] * c["tile_ow"]  # noqa: E731
    assert size(dataclasses.asdict(pick.config)) == max(size(c) for c in cands)  # it learned the rule

    few = tuner.apply_history_best(_synthetic_records(t, info, tuned[:1], 3))
    pick = few.suggest(t, target, info, BUFFER, t.model_knobs, fit=CostModel.fit)
    assert pick.how == "transferred" and pick.record.workload == tuned[0].key()


def test_sibling_records_seed_tuning(tmp_path, conv_model, pair, device):
    """A named sibling's records of the task become the study's first trials, only those valid here (B's
    smaller work-group limit rejects A's best); and ``tune(..., transfer_from=[A])`` on this device measures
    A's fastest config of the task first."""
    from tuner.search.loop import sibling_knowledge
    from tuner.search.tune import tune
    a, b = pair
    task = _task(conv_model, b).bind(b)
    best = _config(task, a, tile_oc=1, tile_oh=1, tile_ow=1, wg_w=16, wg_h=8, split_k=1)  # 128 > B's 64
    good = _config(task, a, tile_oc=1, tile_oh=1, tile_ow=2, wg_w=4, wg_h=4, split_k=1)
    records = [Record.new(task.template, task.workload, best, a, costs=[1e-5]),
               Record.new(task.template, task.workload, good, a, costs=[1e-3])]
    (tmp_path / f"{a.fingerprint}.jsonl").write_text("".join(r.to_json() + "\n" for r in records))
    log = str(tmp_path / "here.jsonl")
    space = task.space(b)
    rows, seeds, siblings = sibling_knowledge(log, task, b, space, [a.fingerprint], {})
    assert siblings == [a.fingerprint] and len(rows) == 2
    values = task.tmpl.config_values(task.workload, good)
    assert seeds == [{n: values[n] for n in space.choices}]

    here = device.info  # measured for real: A as a sibling of this device, its fastest config first
    a2 = dataclasses.replace(here, name=here.name + " sibling")
    task = _task(conv_model, here)
    rec = Record.new(task.template, task.workload, _config(task, a2, tile_ow=2, wg_w=4, wg_h=4), a2, costs=[1e-3])
    (tmp_path / f"{a2.fingerprint}.jsonl").write_text(rec.to_json() + "\n")
    res = tune(task.template, task.workload, device, trials=1, log=log, scopes=task.scopes, fixed=task.fixed,
               progress=False, transfer_from=[a2.fingerprint])
    assert res.measured == 1 and res.records[0].config == rec.config


def test_the_flag_names_what_is_wrong(tmp_path, conv_model, pair, capsys):
    a, b = pair
    task = _task(conv_model, b)
    log = tmp_path / "a.jsonl"
    log.write_text(Record.new(task.template, task.workload, _config(task, a), a, costs=[1e-3]).to_json() + "\n")
    profile = tmp_path / "b.json"
    profile.write_text(json.dumps(b.to_dict()))
    base = ["compile", conv_model, "--log", str(log), "--target", str(profile), "--scope", "buffer",
            "--no-progress", "-o", str(tmp_path / "out")]
    assert main(base + ["--transfer-from", "Not A Fingerprint!"]) == 2
    err = capsys.readouterr().err
    assert "--transfer-from" in err and "not a device fingerprint" in err and "Traceback" not in err
    assert main(base + ["--transfer-from", "nvidia-gpu-00000000"]) == 2
    err = capsys.readouterr().err
    assert "no records of that device" in err and a.fingerprint in err and "Traceback" not in err
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(base + ["--transfer-from", a.fingerprint]) == 0
    out = capsys.readouterr().out
    assert f"1 from the records of sibling {a.fingerprint}" in out
    from tuner.artifact import read_artifact
    nodes = [n for n in read_artifact(tmp_path / "out")[0].nodes if n.template]
    assert [n.config_source for n in nodes] == [f"sibling {a.fingerprint}"]


def test_a_worker_seeds_its_studies_from_a_named_sibling(tmp_path, conv_model, device):
    """`tuner worker --transfer-from A` (``run_worker(transfer_from=...)``): the sibling's config of a task is
    the first this worker measures, as with ``tune``."""
    from tuner.search.worker import run_worker
    here = device.info
    a2 = dataclasses.replace(here, name=here.name + " sibling")
    task = dataclasses.replace(_task(conv_model, here), trials=1)
    rec = Record.new(task.template, task.workload, _config(task, a2, tile_ow=2, wg_w=4, wg_h=4), a2, costs=[1e-3])
    (tmp_path / f"{a2.fingerprint}.jsonl").write_text(rec.to_json() + "\n")
    s = run_worker(f"journal:{tmp_path / 'studies.journal'}", device=device, tasks=[task],
                   log=str(tmp_path / "here.jsonl"), max_trials=1, progress=False, transfer_from=[a2.fingerprint])
    assert s.measured == 1 and s.records[0].config == rec.config


def test_a_statistics_kernel_lends_its_split_to_no_whole_norm(device):
    """A group_norm record with ``stats`` (the statistics only: its split is the chunk count) lends its config only
    to another statistics kernel (``logs.best.PINNING``): a whole norm with no other donor takes its fallback,
    one with a whole norm's record nearby takes that one's."""
    t, info = get_template("group_norm"), device.info
    stats = t.workload(data=(1, 64, 32, 32), groups=1, stats=16)
    whole = t.workload(data=(1, 64, 16, 16), groups=32)
    target = t.workload(data=(1, 64, 28, 28), groups=32)

    def record(wl, **knobs):
        cfg = dataclasses.replace(t.fallback_with(wl, info, **scope_knobs(BUFFER)), **knobs)
        assert invalid_config(t, wl, info, dataclasses.asdict(cfg)) is None
        return Record.new(t.name, wl, cfg, info, costs=[1e-5])
    only_stats = tuner.apply_history_best([record(stats, split=16)])
    assert only_stats.suggest(t, target, info, BUFFER, t.model_knobs) is None
    assert only_stats.suggest(t, t.workload(data=(1, 64, 28, 28), groups=1, stats=16), info, BUFFER,
                              t.model_knobs).record.workload == stats.key()
    both = tuner.apply_history_best([record(stats, split=16), record(whole, split=1, wg_reduce=128)])
    pick = both.suggest(t, target, info, BUFFER, t.model_knobs)
    assert pick.record.workload == whole.key() and pick.config.split == 1


def test_a_fused_variant_takes_the_fastest_valid_config_of_its_loop_nest(device):
    """A convolution writing its norm's statistics (``out_stats``, untuned) needs more local memory than
    the same loop nest without them: where the nest's best config does not fit, the next fastest measured config
    of that nest that does is taken ("transferred"), not the cost model's pick from another workload."""
    t = get_template("conv2d")
    info = dataclasses.replace(device.info, local_mem_bytes=10000)  # split_k 4: 8 KB of partials, 10 KB with the tree
    shapes = dict(data=(1, 32, 28, 28), kernel=(32, 32, 3, 3), padding=(1, 1, 1, 1))
    plain = t.workload(**shapes, activation="relu")
    target = t.workload(**shapes, out_stats=1)
    other = t.workload(data=(1, 64, 14, 14), kernel=(64, 64, 3, 3), padding=(1, 1, 1, 1))
    base = t.fallback_with(plain, info, **scope_knobs(BUFFER), **t.model_knobs)
    knobs = dict(tile_oc=2, tile_oh=1, tile_ow=2, wg_w=8, wg_h=4, local_input=False, split_c=1)
    big, small, worse = (dataclasses.replace(base, **knobs, split_k=k) for k in (4, 2, 1))
    assert invalid_config(t, plain, info, dataclasses.asdict(big)) is None
    assert "out_stats_local" in invalid_config(t, target, info, dataclasses.asdict(big))
    assert invalid_config(t, target, info, dataclasses.asdict(small)) is None
    recs = [Record.new(t.name, plain, big, info, costs=[1e-5]), Record.new(t.name, plain, worse, info, costs=[4e-5]),
            Record.new(t.name, plain, small, info, costs=[2e-5])]
    recs += _synthetic_records(t, info, [other], 24)  # enough for a cost model, none of the same nest
    h = tuner.apply_history_best(recs)
    pick = h.suggest(t, target, info, BUFFER, t.model_knobs, fit=CostModel.fit)
    assert pick.how == "transferred" and pick.record.workload == plain.key()
    assert pick.config == small  # the fastest valid one, not the first logged or the slowest
