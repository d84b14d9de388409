"""Tuning logs: records round-trip, concurrent appends, tolerant loading, best-config dispatch."""
import dataclasses
import json
import subprocess
import sys
import textwrap
import warnings

import pytest

from tuner.errors import ErrorCode, TunerError
from tuner.logs import (SCHEMA_VERSION, ApplyHistoryBest, Record, append_records, apply_history_best,
                        best_records, current_history, load_records)
from tuner.logs.io import iter_records
from tuner.templates import get_template

SPEC_FIELDS = ["version", "template", "workload", "scopes", "config", "device", "device_name", "platform",
               "driver", "costs", "median_s", "gflops", "error_code", "error_name", "error_msg",
               "max_rel_error", "timestamp", "duration_s", "tuner_version", "trial", "sampler", "study",
               "gpu_clock_hz", "temp_c", "replaces"]


@pytest.fixture(scope="module")
def conv():
    return get_template("conv2d")


@pytest.fixture(scope="module")
def wl(conv):
    return conv.workload(data=(1, 8, 8, 8), kernel=(8, 8, 3, 3), padding=1)


def rec(t, wl, cfg, info, median=None, error=ErrorCode.NO_ERROR, **kw):
    return Record.new(t.name, wl, cfg, info, costs=[median] * 3 if median else [], error_code=error, **kw)


def other_device(info):
    """The same device with another driver: another fingerprint."""
    return dataclasses.replace(info, driver_version=info.driver_version + " (other)")


@pytest.fixture
def caught():
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        yield w


def test_record_round_trip(conv, wl, device):
    cfg = conv.config(tile_oc=2, tile_ow=4, input_scope="buffer")
    r = rec(conv, wl, cfg, device, 2e-3, max_rel_error=3e-7, duration_s=0.5, trial=7, sampler="tpe",
            study="s", error_msg="multi\nline")
    assert [f.name for f in dataclasses.fields(Record)] == SPEC_FIELDS
    line = r.to_json()
    assert "\n" not in line
    back = Record.from_dict(json.loads(line))
    assert back == r and back.ok and back.task_key == r.task_key
    assert r.version == SCHEMA_VERSION and r.device == device.fingerprint and r.driver == device.info.driver_version
    assert r.scopes == {"input": "buffer", "weight": "texture", "output": "texture"}
    assert r.gflops == pytest.approx(wl.flops / 2e-3 / 1e9) and r.error_name == "NO_ERROR"
    assert conv.config(**back.config) == cfg and back.workload == wl.key()
    assert hash(r.task_key) == hash(back.task_key)
    # task keys do not depend on key order or tuple vs list
    shuffled = dataclasses.replace(r, workload=dict(reversed(list(wl.key().items()))))
    assert shuffled.task_key == r.task_key and shuffled.workload_key == r.workload_key == ("conv2d", r.task_key[2])

    d = json.loads(line)
    assert Record.from_dict({**d, "from_the_future": 1}) == r
    for missing in ("template", "workload", "config", "error_code"):
        with pytest.raises(KeyError):
            Record.from_dict({k: v for k, v in d.items() if k != missing})
    for k, bad in (("template", 3), ("workload", [1]), ("config", "x"), ("error_code", "0"), ("median_s", "1")):
        with pytest.raises(TypeError):
            Record.from_dict({**d, k: bad})
    with pytest.raises(ValueError):
        Record.from_dict({**d, "version": SCHEMA_VERSION + 1})

    failed = rec(conv, wl, cfg, device, 1e-3, error=ErrorCode.COMPILE, error_msg="boom")
    assert not failed.ok and failed.median_s is None and failed.error_name == "COMPILE"
    assert Record.from_dict(json.loads(failed.to_json())) == failed
    inf = dataclasses.replace(r, max_rel_error=float("inf"))
    assert json.loads(inf.to_json())["max_rel_error"] is None  # strict JSON: no Infinity token


WRITER = textwrap.dedent("""
    import sys
    from types import SimpleNamespace
    from tuner.logs import Record, append_records
    from tuner.templates import get_template
    path, w = sys.argv[1], int(sys.argv[2])
    conv = get_template("conv2d")
    wl = conv.workload(data=(1, 8, 8, 8), kernel=(8, 8, 3, 3), padding=1)
    info = SimpleNamespace(fingerprint="dev", name="dev", platform="p", driver_version="1")
    for i in range(200):  # long lines (4 KB of message), so that interleaved writes would tear them
        append_records(path, [Record.new("conv2d", wl, conv.config(), info, costs=[1e-3] * 100, trial=i,
                                         study=f"w{w}", error_msg="x" * 4000)])
""")


def test_concurrent_appends(tmp_path):
    path = tmp_path / "sub" / "log.jsonl"  # parent dirs are created
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(w)]) for w in range(4)]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    lines = path.read_text().splitlines()
    assert len(lines) == 800 and all(isinstance(json.loads(line), dict) for line in lines)
    records = load_records(path)
    assert sorted((int(r.study[1:]), r.trial) for r in records) == [(w, i) for w in range(4) for i in range(200)]


PROBER = textwrap.dedent("""
    import sys, time
    from tuner.logs.io import ensure_writable
    path, start = sys.argv[1], float(sys.argv[2])
    time.sleep(max(0.0, start - time.time()))  # all probers start together
    for _ in range(300):  # each round: a prober may see the log missing, create it and remove it
        ensure_writable(path)
""")


def test_concurrent_writability_probes_on_fresh_logs(tmp_path):
    """Tuners started together on a fresh log each probe it (create, then remove what they created): one must
    not fail because another removed the probe first (a clean-clone CI run of four tuners did)."""
    import time
    path, start = tmp_path / "logs" / "shared.jsonl", time.time() + 3.0
    procs = [subprocess.Popen([sys.executable, "-c", PROBER, str(path), str(start)], stderr=subprocess.PIPE,
                              text=True) for _ in range(6)]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, "\n".join(errs)[-2000:]
    assert not path.exists()  # probes leave no empty log behind


def test_bad_lines_skipped_with_one_warning_per_kind(tmp_path, conv, wl, device, caught):
    path = tmp_path / "log.jsonl"
    good = [rec(conv, wl, conv.config(tile_ow=n), device, n * 1e-3) for n in (1, 2, 4)]
    newer = {**json.loads(good[0].to_json()), "version": SCHEMA_VERSION + 1}
    append_records(path, good[:2])
    with open(path, "a") as f:
        f.write("\n   \n")  # lines 3 and 4: blank lines are not errors
        f.write("not json at all\n")  # line 5
        f.write(json.dumps(newer) + "\n")
        f.write(json.dumps([1, 2]) + "\n")
    append_records(path, good[2:])
    with open(path, "a") as f:
        f.write(good[0].to_json()[:57])  # torn by a killed writer
    assert load_records(path) == good[:2] + good[2:]
    # garbage and torn (lines 5 and 9), newer (6), not an object (7): three kinds, three warnings
    msgs = [str(w.message) for w in caught]
    assert len(msgs) == 3 and all(str(path) in m for m in msgs)
    assert "skipped 2 bad lines (torn or not JSON), first at line 5" in msgs[0]
    assert "skipped 1 bad line (from a newer tuner), first at line 6" in msgs[1]
    assert "skipped 1 bad line (a field of the wrong type), first at line 7" in msgs[2]


def test_truncated_garbage_newer_are_counted_by_kind(tmp_path, conv, wl, device, caught):
    path = tmp_path / "log.jsonl"
    good = [rec(conv, wl, conv.config(tile_ow=n), device, n * 1e-3) for n in (1, 2)]
    append_records(path, good)
    with open(path, "a") as f:
        f.write("{garbage\n")
        f.write(json.dumps({**json.loads(good[0].to_json()), "version": SCHEMA_VERSION + 1}) + "\n")
        f.write(good[1].to_json()[:40])
    assert load_records(path) == good
    expected = ["skipped 2 bad lines (torn or not JSON), first at line 3",
                "skipped 1 bad line (from a newer tuner), first at line 4"]
    assert [e in str(w.message) for e, w in zip(expected, caught)] == [True, True] and len(caught) == 2
    # a writer appending after a torn line does not glue its record onto it
    caught.clear()
    extra = rec(conv, wl, conv.config(tile_ow=8), device, 5e-3)
    append_records(path, extra)
    assert load_records(path) == good + [extra]
    assert [e in str(w.message) for e, w in zip(expected, caught)] == [True, True] and len(caught) == 2


def test_globs_and_lists(tmp_path, conv, wl, device, caught):
    a, b = tmp_path / "a.jsonl", tmp_path / "more" / "b.jsonl"
    ra = [rec(conv, wl, conv.config(tile_ow=n), device, n * 1e-3) for n in (1, 2)]
    rb = [rec(conv, wl, conv.config(tile_oh=2), device, 3e-3)]
    append_records(a, ra)
    append_records(b, rb)
    assert load_records(str(tmp_path / "*.jsonl")) == ra
    assert load_records(str(tmp_path / "**" / "*.jsonl")) == ra + rb  # lock files are not logs
    assert load_records([a, str(b)]) == ra + rb
    assert load_records([str(tmp_path / "*.jsonl"), a, b]) == ra + rb  # each file once
    assert list(iter_records([b])) == rb
    assert load_records(str(tmp_path / "nothing-*.jsonl")) == []
    with pytest.raises(TunerError, match="missing.jsonl"):
        load_records([a, tmp_path / "missing.jsonl"])
    with pytest.raises(TunerError, match="missing.jsonl"):
        iter_records(tmp_path / "missing.jsonl")
    assert not caught


def test_best_records_never_picks_failures(conv, wl, device):
    other = other_device(device.info)
    fast_fail = rec(conv, wl, conv.config(tile_ow=1), device, 1e-4, error=ErrorCode.WRONG_ANSWER)
    fast_fail.median_s = 1e-4  # even a failure that carries a timing
    slow = rec(conv, wl, conv.config(tile_ow=2), device, 3e-3)
    fast = rec(conv, wl, conv.config(tile_ow=4), device, 2e-3)
    buf = rec(conv, wl, conv.config(input_scope="buffer"), device, 1e-3)
    elsewhere = rec(conv, wl, conv.config(tile_ow=8), other, 1e-3)
    only_fail = rec(conv, conv.workload(data=(1, 4, 8, 8), kernel=(4, 4, 1, 1)), conv.config(), device, 1e-5,
                    error=ErrorCode.RUNTIME)
    best = best_records([fast_fail, slow, fast, buf, elsewhere, only_fail])
    assert best == {fast.task_key: fast, buf.task_key: buf, elsewhere.task_key: elsewhere}
    assert best_records([]) == {}


def test_apply_history_best_context(tmp_path, conv, wl, device, caught):
    other = other_device(device.info)
    texture_best = rec(conv, wl, conv.config(wg_w=1, tile_ow=4, tile_oc=2), device, 2e-3)
    buffer_best = rec(conv, wl, conv.config(wg_w=1, tile_ow=2, input_scope="buffer"), device, 1e-3)
    records = [rec(conv, wl, conv.config(wg_w=1, tile_ow=1), device, 5e-3), texture_best, buffer_best,
               rec(conv, wl, conv.config(wg_w=1, tile_ow=8), other, 1e-4),  # faster, but another device
               rec(conv, wl, conv.config(wg_w=1, tile_oh=2), device, 1e-5, error=ErrorCode.RUN_TIMEOUT)]
    append_records(tmp_path / "log.jsonl", records)

    assert current_history() is None
    with apply_history_best(str(tmp_path / "*.jsonl")) as h:
        assert isinstance(h, ApplyHistoryBest) and current_history() is h and len(h) == 3
        assert h.pick(conv, wl, device) == conv.config(**buffer_best.config)  # any scopes: fastest
        assert h.pick(conv, wl, device.info, texture_best.scopes) == conv.config(wg_w=1, tile_ow=4, tile_oc=2)
        assert h.query("conv2d", wl.key(), device.fingerprint, buffer_best.scopes) == buffer_best
        assert h.query("conv2d", wl.key(), "pocl-cpu-00000000", buffer_best.scopes) is None
        assert h.query("dense", wl.key(), device.fingerprint, buffer_best.scopes) is None
        assert not caught
        with apply_history_best(records[:1]) as inner:  # innermost wins
            assert current_history() is inner
        assert current_history() is h
        # another device fingerprint is a miss: its (faster) record is never used there either
        assert h.pick(conv, wl, other) == conv.config(wg_w=1, tile_ow=8)
        picked = h.pick(conv, wl, other_device(other))
        assert picked == conv.fallback(wl, device.info) and len(caught) == 1
    assert current_history() is None
    plain = apply_history_best(records)  # a plain call works without `with`
    assert current_history() is None and plain.pick(conv, wl, device) == conv.config(**buffer_best.config)


def test_miss_falls_back_and_warns_once_per_workload(conv, wl, device, caught):
    h = apply_history_best([])
    fb = conv.fallback(wl, device.info)
    assert h.pick(conv, wl, device) == fb
    assert h.pick(conv, wl.key(), device) == fb  # the key dict names the same workload
    assert len(caught) == 1
    msg = str(caught[0].message)
    assert "conv2d" in msg and json.dumps(wl.key()["data"]).replace(" ", "") in msg and device.fingerprint in msg
    buffered = h.pick(conv, wl, device, {"input": "buffer", "weight": "buffer", "output": "buffer"})
    assert buffered == dataclasses.replace(fb, input_scope="buffer", weight_scope="buffer", output_scope="buffer")
    assert len(caught) == 1  # same workload, other scopes: still once
    wl2 = conv.workload(data=(1, 8, 8, 8), kernel=(8, 8, 1, 1))
    h.pick(conv, wl2, device)
    h.pick(conv, wl2, device)
    dense = get_template("dense")
    dwl = dense.workload(data=(1, 16), weight=(8, 16))
    assert h.pick(dense, dwl, device) == dense.fallback(dwl, device.info)
    assert len(caught) == 3 and "dense" in str(caught[2].message)


def test_the_log_index_matches_a_task_by_key_and_pinned_knobs_and_follows_the_file(conv, wl, device, tmp_path):
    """``LogIndex``, the one index every reader of a log asks: a task's records are those of its key with its
    pinned knobs; ``measured`` leaves the template's refusals out; ``best`` never picks a failure; ``of_log``
    reads the file again once it changed."""
    from tuner.logs.index import LogIndex
    from tuner.task import TuningTask
    scopes = {"input": "buffer", "weight": "buffer", "output": "buffer"}
    task = TuningTask("conv2d", wl, scopes, fixed={"tile_oc": 2})
    cfg = lambda **k: conv.config(input_scope="buffer", weight_scope="buffer", output_scope="buffer", **k)  # noqa: E731
    fast_other = rec(conv, wl, cfg(tile_oc=1), device, 1e-4)  # faster, but not the pinned knob
    slow, fast = rec(conv, wl, cfg(tile_oc=2, tile_ow=1), device, 3e-3), rec(conv, wl, cfg(tile_oc=2, tile_ow=2), device, 2e-3)
    failed = rec(conv, wl, cfg(tile_oc=2, tile_ow=4), device, 1e-5, error=ErrorCode.RUNTIME)  # timings, but failed
    refused = rec(conv, wl, cfg(tile_oc=2, tile_ow=8), device, error=ErrorCode.INSTANTIATION)
    log = tmp_path / "dev.jsonl"
    append_records(log, [fast_other, slow, failed, refused])
    index = LogIndex.of_log(log)
    key = task.record_key(device.fingerprint)
    assert index.task(key, task.fixed) == [slow, failed, refused]
    assert index.task(key, task.fixed, measured=True) == [slow, failed]
    assert index.best(key, task.fixed) == slow and index.best(key) == fast_other
    assert index.on(device.fingerprint).count(task) == 2 and index.on("other-fp").count(task) == 0
    assert LogIndex.of_log(log) is index  # unchanged file: the same index
    append_records(log, [fast])
    again = LogIndex.of_log(log)
    assert again is not index and again.best(key, task.fixed) == fast and again.ranked(key, task.fixed) == [fast, slow]
    assert again.best_any_scope(device.fingerprint, "conv2d", wl) == fast_other
    assert best_records(again.records) == again.bests() == {key: fast_other}
    assert LogIndex.of_log(tmp_path / "none.jsonl").records == []


def test_a_record_keeps_at_most_max_costs_order_statistics(conv, wl, device):
    """A fast GPU times a small kernel thousands of times a measurement: the record's median is of them all, and
    it keeps ``MAX_COSTS`` order statistics (the extremes included), so a log line stays a few KiB."""
    import random
    import statistics

    from tuner.logs.record import MAX_COSTS
    cfg = conv.config(tile_oc=2, tile_ow=4, input_scope="buffer")
    rng = random.Random(3)
    costs = [rng.lognormvariate(-9, 0.3) for _ in range(4001)]
    r = Record.new(conv.name, wl, cfg, device, costs=costs)
    assert r.median_s == statistics.median(costs)
    assert len(r.costs) == MAX_COSTS and r.costs == sorted(r.costs)
    assert r.costs[0] == min(costs) and r.costs[-1] == max(costs)
    assert statistics.median(r.costs) == pytest.approx(r.median_s, rel=0.02)
    assert Record.from_dict(json.loads(r.to_json())) == r and len(r.to_json()) < 8000
    few = [3e-4, 1e-4, 2e-4]
    assert Record.new(conv.name, wl, cfg, device, costs=few).costs == few  # in the order measured
