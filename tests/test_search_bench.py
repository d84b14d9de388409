"""bench/tuning.py for issue 37 without a device: a deadline stops every stage with work left (exit status 3) and
the same command goes on from its files; the issue's per-workload checks; the proxy over measured tables."""
import json

import pytest

from conftest import profile
from tuner.measure import MeasureResult
from tuner.templates import get_template

CPU = profile(name="CPU", type="CPU", compute_units=2, image_support=False, half_images=False, image2d_max_width=0,
              image2d_max_height=0, max_work_item_sizes=[1024, 1024, 1024], local_mem_bytes=32768, fp16=False)



class Counting:
    """A measurer that times each config at a made-up speed and counts what it was asked."""

    def __init__(self):
        self.asked = 0

    def measure(self, inputs):
        self.asked += len(inputs)
        return [MeasureResult(costs=[i.workload.flops / (1e9 * (1 + len(str(i.config)) % 7))] * 3) for i in inputs]


def test_the_corpus_stops_at_the_deadline_and_the_same_call_goes_on(tuning, tmp_path, monkeypatch):
    monkeypatch.setattr(tuning, "DEVELOPMENT", tuning.DEVELOPMENT[-2:])  # the two dense layers: quick
    dev = Counting()
    assert tuning.corpus(CPU, tmp_path, 3, dev, late=lambda: True) is None and dev.asked == 0
    looks = iter([False, True])  # one chunk, then the deadline
    monkeypatch.setattr(tuning, "CORPUS_CHUNK", 2)
    assert tuning.corpus(CPU, tmp_path, 3, dev, late=lambda: next(looks, True)) is None and dev.asked == 2
    path = tuning.corpus(CPU, tmp_path, 3, dev)  # no deadline: tops it up to 3 a workload, nothing twice
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert dev.asked == 6 == len(lines) and len({json.dumps(d["config"], sort_keys=True) for d in lines}) == 6
    assert tuning.unfinished("x") == tuning.UNFINISHED == 3


def _row(tuning, workload, sampler, seed, values, best_ever):
    return {"workload": workload, "sampler": sampler, "seed": seed, "curve": tuning.best_so_far(values),
            "best_ever": best_ever, "trials": len(values)}


def test_done_when_compares_median_bests_per_workload(tuning):
    rows = [_row(tuning, "a", "xgb", s, [1, 9], 10) for s in range(3)]
    rows += [_row(tuning, "a", "tpe", s, [v, 2], 10) for s, v in enumerate((10, 3, 8))]  # median 8 < 9
    rows += [_row(tuning, "a", "xgb-cold", s, [10, 1], 10) for s in range(3)]  # 10 > 9: transfer lost here
    text = "\n".join(tuning.done_when(rows, ["a"], ["xgb", "tpe", "xgb-cold"], 2))
    assert "| a | 0.900 | 0.800 | 1.000 | yes | **no** |" in text
    assert "1 of 1 workloads against tpe, 0 of 1 workloads against xgb-cold" in text
    assert tuning.done_when(rows, ["a"], ["xgb"], 2) == []


def dense_cache(tuning, path, info, count: int, seed: int):
    """A measurement cache of ``count`` random configs of ``dense.192-160`` on ``info``'s device, the i-th at i+1
    GFLOP/s; returns the workload's ``(name, template, arguments)``."""
    import numpy as np
    t = get_template("dense")
    name, tname, kw = next(w for w in tuning.WORKLOADS if w[0] == "dense.192-160")
    wl = t.workload(**kw)
    bound = t.space(wl, info, input_scope="buffer", weight_scope="buffer", output_scope="buffer")
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for i in range(count):
            key = tuning.cache_key(tname, wl, t.make_config(bound.sample(rng)))
            f.write(json.dumps({"key": key, "result": {"error_code": 0, "costs": [wl.flops / ((i + 1) * 1e9)]}}) + "\n")
    return name, tname, kw


def test_replay_searches_only_the_measured_table(tuning, tmp_path):
    cache = tmp_path / "tuning_cache_x.jsonl"
    name, tname, kw = dense_cache(tuning, cache, CPU, 40, 0)
    tables = tuning.replay_tables([cache], [], CPU, [(name, tname, kw)])
    bound_, table = tables[name]
    assert len(table) <= 40 and max(table.values()) == pytest.approx(40.0)
    (tmp_path / "corpus.jsonl").write_text("")
    rows = tuning.replay(CPU, tables, tmp_path / "corpus.jsonl", ["random", "xgb"], 2, 12)
    assert len(rows) == 4 and all(len(r["gflops"]) == 12 for r in rows)
    assert all(g in table.values() for r in rows for g in r["gflops"])  # only measured configs
    assert all(len(set(r["gflops"])) == 12 for r in rows)  # none twice (every config here times differently)
    assert "geometric mean of median trials to 95%" in tuning.replay_summary(rows, 12)


def test_replay_as_another_device_from_its_profile_and_summaries_of_earlier_replays(tuning, tmp_path, capsys):
    """``--profile``: the replay's space, fallback and region are the profile's device's (here the H200's, on a
    machine without it); ``--replay-rows`` summarizes the rows of earlier replays together."""
    from pathlib import Path

    from tuner.target import load_profile
    h200 = Path(__file__).resolve().parents[1] / "bench/results/behaviour/profile_h200.json"
    info = load_profile(h200)
    cache = tmp_path / "tuning_cache_x.jsonl"
    dense_cache(tuning, cache, info, 30, 1)
    out = tmp_path / "out"
    out.mkdir()
    (out / f"tuning_corpus_{info.fingerprint}.jsonl").write_text("")
    assert tuning.main(["--replay", str(cache), "--profile", str(h200), "--workloads", "^dense.192-160$",
                        "--samplers", "random,xgb", "--seeds", "1", "--trials", "8", "--out", str(out)]) == 0
    rows = out / f"replay_{info.fingerprint}.json"  # named for the H200, not for this machine's device
    assert len(json.loads(rows.read_text())) == 2
    capsys.readouterr()
    assert tuning.main(["--trials", "8", "--replay-rows", str(rows), str(rows)]) == 0
    assert "| dense.192-160 |" in capsys.readouterr().out
    assert tuning.main(["--profile", str(h200)]) == 2  # a profile without --replay: nothing to replay
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert tuning.main(["--replay", str(cache), "--profile", str(bad)]) == 2
    assert "device profile lacks" in capsys.readouterr().err
