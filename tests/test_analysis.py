"""Analysis: logs as DataFrames (against a real tuning run), exports that round-trip, the texture/buffer
comparison on a log with known costs, the HTML report, and the logs/compare/report commands."""
from __future__ import annotations

import base64
import dataclasses
import json
import re
import shutil
import warnings

import pandas as pd
import pytest

from tuner.analysis import (compare, compare_totals, export_frame, load_logs, pick_scopes, read_export,
                            records_frame, render_report, summarize)
from tuner.analysis.frame import workload_label
from tuner.cli import main
from tuner.errors import ErrorCode, TunerError
from tuner.logs import Record, TuningLogWarning, append_records, load_records
from tuner.logs.record import canonical_json
from tuner.templates import get_template

SCOPES = ("input", "weight", "output")

pytestmark = pytest.mark.xdist_group("analysis")  # one worker runs the tuning of `tuned` (tests/conftest.py)


# ---------------------------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def tuned(tmp_path_factory, device):
    """A real tuning run: 4 configs of a tiny conv2d measured on the test device."""
    from tuner.search.tune import tune
    d = tmp_path_factory.mktemp("tuned")
    t = get_template("conv2d")
    wl = t.workload(data=(1, 4, 6, 6), kernel=(8, 4, 3, 3), padding=1, bias=True, activation="relu")
    log = d / "conv.jsonl"
    res = tune("conv2d", wl, device, trials=4, log=str(log), storage=f"sqlite:///{d}/studies.db", progress=False)
    assert res.measured == 4
    return log, wl


def _info(device, name="pocl"):
    info = device.info
    return info if name == "pocl" else dataclasses.replace(info, driver_version=info.driver_version + " " + name)


def _scoped(t, wl, info, scope, **knobs):
    cfg = dataclasses.asdict(t.fallback(wl, info))
    scopes = scope if isinstance(scope, dict) else {op: scope for op in SCOPES}
    cfg.update({f"{op}_scope": s for op, s in scopes.items()}, **knobs)
    return cfg


def _records(t, wl, info, scope, medians_ms, sampler="xgb", failures=0):
    """Successful records with these medians (three equal costs each), then ``failures`` compile errors."""
    knob = "tile_oh" if "tile_oh" in {f.name for f in dataclasses.fields(t.config)} else "tile_m"
    out = [Record.new(t.name, wl, _scoped(t, wl, info, scope, **{knob: 1 + i % 2}), info, costs=[m * 1e-3] * 3,
                      trial=i, sampler=sampler, study=f"{t.name}-{scope}")
           for i, m in enumerate(medians_ms)]
    out += [Record.new(t.name, wl, _scoped(t, wl, info, scope), info, error_code=ErrorCode.COMPILE,
                       error_msg="clBuildProgram failed: <kernel>:3: error", trial=len(medians_ms) + i,
                       sampler=sampler) for i in range(failures)]
    return out


@pytest.fixture(scope="module")
def known(tmp_path_factory, device):
    """A hand-made log with known costs: A (texture 2 ms vs buffer 3 ms), B (texture 4 vs buffer 1),
    C (buffer has 3 successes only), plus mixed-scope records and failures that must not count."""
    conv = get_template("conv2d")
    a = conv.workload(data=(1, 8, 8, 8), kernel=(8, 8, 3, 3), padding=1)
    b = conv.workload(data=(1, 8, 8, 8), kernel=(16, 8, 1, 1))
    c = conv.workload(data=(1, 4, 8, 8), kernel=(4, 4, 3, 3), stride=2, padding=1)
    info = _info(device)
    mixed = {"input": "buffer", "weight": "texture", "output": "buffer"}
    records = (_records(conv, a, info, "texture", [6, 2, 5, 4, 3], failures=2)
               + _records(conv, a, info, "buffer", [3, 7, 8, 9, 10], sampler="random", failures=1)
               + _records(conv, a, info, mixed, [0.5] * 5)  # faster, but mixed: not a side of the comparison
               + _records(conv, b, info, "texture", [4, 5, 6, 7, 8, 9])
               + _records(conv, b, info, "buffer", [2, 1, 3, 4, 5])
               + _records(conv, c, info, "texture", [1, 2, 3, 4, 5])
               + _records(conv, c, info, "buffer", [0.5, 0.6, 0.7], failures=4))
    path = tmp_path_factory.mktemp("known") / "known.jsonl"
    append_records(path, records)
    return path, {"a": a, "b": b, "c": c}


# ------------------------------------------------------------------------------------------------ frames

def test_frame_matches_the_records_of_a_real_tuning_run(tuned):
    log, wl = tuned
    records = load_records(log)
    df = load_logs(log)
    assert len(df) == len(records) == 4
    for col, dtype in {"cfg.tile_oc": "int64", "cfg.unroll_rs": "bool", "cfg.act_layout": "str",
                       "wl.bias": "bool", "wl.groups": "int64", "error_code": "int64", "trial": "Int64",
                       "median_s": "float64", "ok": "bool", "timestamp": "datetime64[us, UTC]"}.items():
        assert str(df[col].dtype) == dtype, col
    assert list(df.columns[:8]) == ["task", "workload", "workload_key", "template", "device", "device_name",
                                    "platform", "driver"]
    assert not any(c == "wl.op" for c in df.columns)
    for (_, row), r in zip(df.iterrows(), records):
        assert row["template"] == r.template == "conv2d"
        assert row["workload_key"] == canonical_json(r.workload) == canonical_json(wl.key())
        assert row["wl.data"] == (1, 4, 6, 6) and row["wl.kernel"] == (8, 4, 3, 3)
        assert row["wl.padding"] == (1, 1, 1, 1) and row["wl.stride"] == (1, 1)
        assert row["wl.activation"] == "relu" and bool(row["wl.bias"]) is True and row["wl.groups"] == 1
        assert {op: row[f"scope.{op}"] for op in SCOPES} == r.scopes
        assert {k: row[f"cfg.{k}"] for k in r.config} == r.config
        assert row["device"] == r.device and row["device_name"] == r.device_name
        assert row["ok"] == r.ok and row["error_code"] == r.error_code and row["error_name"] == r.error_name
        assert row["costs"] == r.costs and row["trial"] == r.trial and row["sampler"] == r.sampler == "xgb"
        assert row["study"] == r.study and row["log"] == str(log)
        assert row["timestamp"] == pd.Timestamp(r.timestamp)
        if r.ok:
            assert row["median_s"] == r.median_s and row["gflops"] == pytest.approx(wl.flops / r.median_s / 1e9)
        scope = r.scopes["input"] if len(set(r.scopes.values())) == 1 else "/".join(r.scopes[o] for o in SCOPES)
        assert row["task"] == f"conv2d 4->8 3x3 p1 @6x6 +bias+relu [{scope}]"


def test_a_torn_line_takes_the_tolerant_path_with_the_same_frame(tuned, tmp_path):
    log, _ = tuned
    torn = tmp_path / "torn.jsonl"
    shutil.copy(log, torn)
    clean = load_logs(torn)
    with open(torn, "a") as f:
        f.write('{"version": 1, "template": "conv2d", "workl')  # a writer killed mid-line
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        tolerant = load_logs(torn)
    assert any(issubclass(x.category, TuningLogWarning) and "skipped 1 bad line" in str(x.message) for x in w)
    pd.testing.assert_frame_equal(clean, tolerant)
    pd.testing.assert_frame_equal(clean.drop(columns="log"), records_frame(load_records(log)).drop(columns="log"))


def test_bad_lines_in_a_long_log_are_counted_by_kind_and_pyarrow_reads_what_was_checked(known, tmp_path):
    from tuner.analysis import frame
    good = [line for line in open(known[0]) if line.strip()]
    lines = (good * (2 * frame.CHUNK_LINES // len(good) + 2))[:2 * frame.CHUNK_LINES + 500]
    newer = json.loads(good[0])
    newer["version"] = 99
    lines.insert(2100, '{"version": 1, "template": "conv2d", "work\n')  # torn, in the second chunk
    lines.insert(10, json.dumps(newer) + "\n")  # a newer schema, in the first
    mixed = json.loads(good[1])
    mixed["workload"]["padding"] = 1  # not the key conv2d writes ([1, 1, 1, 1]): never matched, never shown
    lines.append(json.dumps(mixed) + "\n")
    # a key given twice: json.loads keeps the last value, which is what is checked; pyarrow refuses the line,
    # so the chunk holding it is built from its Records rather than from values nobody checked
    twice = json.loads(good[2])
    lines.insert(3000, '{"trial": 10000000000000000000000000000000, ' + json.dumps(twice)[1:] + "\n")
    log = tmp_path / "long.jsonl"
    log.write_text("".join(lines))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        df = load_logs(log)
        records = load_records(log)
    messages = [str(x.message) for x in w if issubclass(x.category, TuningLogWarning)]
    assert len(messages) == 6 and messages[:3] == messages[3:]
    assert "skipped 1 bad line (from a newer tuner), first at line 11" in messages[0]
    assert "skipped 1 bad line (torn or not JSON), first at line 2102" in messages[1]
    assert f"skipped 1 bad line (a workload its template rejects), first at line {len(lines)}" in messages[2]
    assert len(df) == len(records) == len(lines) - 3
    expected = records_frame(records)
    expected["log"] = str(log)
    pd.testing.assert_frame_equal(df, expected)
    assert df["trial"].iloc[3000 - 2] == twice["trial"]  # line 3001, after two skipped ones


def test_many_files_and_globs_merge_templates(tuned, known, tmp_path, device):
    dense = get_template("dense")
    wl = dense.workload(data=(2, 16), weight=(8, 16), bias=True, activation="relu6")
    append_records(tmp_path / "dense.jsonl", _records(dense, wl, _info(device), "buffer", [1, 2]))
    shutil.copy(tuned[0], tmp_path / "conv.jsonl")
    df = load_logs([str(tmp_path / "*.jsonl"), known[0]])
    assert len(df) == 4 + 2 + len(load_records(known[0]))
    assert set(df["log"]) == {str(tmp_path / "conv.jsonl"), str(tmp_path / "dense.jsonl"), str(known[0])}
    d = df[df["template"] == "dense"]
    assert d["task"].iloc[0] == "dense 16->8 n2 +bias+relu6 [buffer]"
    assert d["wl.weight"].iloc[0] == (8, 16) and d["wl.kernel"].isna().all()
    assert str(df["cfg.tile_oc"].dtype) == "Int64" and d["cfg.tile_oc"].isna().all()  # a conv2d knob
    assert (d["cfg.weight_pack"].notna()).all() and df.loc[df["template"] == "conv2d", "cfg.weight_pack"].isna().all()
    with pytest.raises(TunerError, match="no such file"):
        load_logs(tmp_path / "missing.jsonl")
    assert load_logs(str(tmp_path / "nothing*.jsonl")).empty
    pd.testing.assert_frame_equal(load_logs(tmp_path), load_logs(str(tmp_path / "*.jsonl")))  # a directory


def test_workload_labels_tell_workloads_apart():
    conv, dw = get_template("conv2d"), get_template("depthwise_conv2d")
    assert workload_label("conv2d", conv.workload(data=(2, 64, 56, 56), kernel=(128, 64, 3, 3), stride=2,
                                                  padding=(1, 0), dilation=2, residual=True, dtype="float16",
                                                  bias=True).key()) \
        == "conv2d 64->128 3x3 s2 d2 p(1,0) @56x56 n2 fp16 +bias+res"
    assert workload_label("depthwise_conv2d", dw.workload(data=(1, 32, 112, 112), kernel=(32, 1, 3, 3),
                                                          padding=(0, 0, 1, 1)).key()) \
        == "depthwise_conv2d 32 3x3 p(0,0,1,1) @112x112"
    assert workload_label("conv2d", {"data": [1, 4, 8, 8], "kernel": [4, 4, 1, 1], "extra": [1, 2]}) \
        == "conv2d 4->4 1x1 @8x8 extra=[1,2]"


@pytest.mark.parametrize("suffix", ["csv", "parquet", "json"])
def test_exports_round_trip(tuned, known, tmp_path, suffix):
    df = load_logs([tuned[0], known[0]])
    path = export_frame(df, tmp_path / f"all.{suffix}")
    pd.testing.assert_frame_equal(read_export(path), df)
    if suffix == "csv":  # readable without this package: shapes are JSON arrays
        plain = pd.read_csv(path)
        assert plain["wl.data"].iloc[0] == "[1, 4, 6, 6]" and json.loads(plain["costs"].iloc[0]) == df["costs"][0]


# ------------------------------------------------------------------------------------ summary, compare

def test_summary_counts_failures_and_finds_the_best(known):
    s = summarize(load_logs(known[0])).set_index("task")
    a_tex = s.loc["conv2d 8->8 3x3 p1 @8x8 [texture]"]
    assert (a_tex["trials"], a_tex["ok"], a_tex["failed"], a_tex["failed.COMPILE"]) == (7, 5, 2, 2)
    assert a_tex["best_median_s"] == pytest.approx(2e-3) and a_tex["best_at"] == 2
    assert json.loads(a_tex["best_config"])["tile_oh"] == 2 and json.loads(a_tex["best_config"])["input_scope"] == "texture"
    assert s.loc["conv2d 4->4 3x3 s2 p1 @8x8 [buffer]", "failed.COMPILE"] == 4


def test_compare_gives_the_known_speedups(known):
    path, wls = known
    cmp = compare(load_logs(path)).set_index("workload_key")
    a, b, c = (cmp.loc[canonical_json(wls[k].key())] for k in "abc")
    assert (a["texture_median_s"], a["buffer_median_s"]) == pytest.approx((2e-3, 3e-3))
    assert a["texture_speedup"] == pytest.approx(1.5) and a["pick"] == "texture"
    assert (a["texture_trials"], a["texture_ok"], a["buffer_trials"], a["buffer_ok"]) == (7, 5, 6, 5)
    assert a["texture_gflops"] == pytest.approx(wls["a"].flops / 2e-3 / 1e9)
    assert json.loads(a["texture_config"])["tile_oh"] == 2
    assert b["texture_speedup"] == pytest.approx(0.25) and b["pick"] == "buffer"
    assert pd.isna(c["pick"]) and pd.isna(c["texture_speedup"]) and c["buffer_ok"] == 3
    assert c["note"] == "too few trials: buffer 3 < 5 successful"
    assert compare(load_logs(path), min_trials=3).set_index("workload_key").loc[c.name, "pick"] == "buffer"
    t = compare_totals(compare(load_logs(path))).iloc[0]
    assert (t["workloads"], t["compared"], t["texture_picks"]) == (3, 2, 1)
    assert (t["texture_s"], t["buffer_s"], t["auto_s"]) == pytest.approx((6e-3, 4e-3, 3e-3))
    assert (t["auto_vs_texture"], t["auto_vs_buffer"]) == pytest.approx((2.0, 4 / 3))


def test_pick_scopes_from_frames_records_and_paths(known, device):
    path, wls = known
    df, records = load_logs(path), load_records(path)
    fp = device.fingerprint
    for source in (df, records, str(path)):
        assert pick_scopes(source, "conv2d", wls["a"].key(), fp) == "texture"
        assert pick_scopes(source, "conv2d", wls["b"], device) == "buffer"  # workload object, Device
        assert pick_scopes(source, "conv2d", json.dumps(wls["c"].key()), device.info) is None
        assert pick_scopes(source, "conv2d", wls["c"].key(), fp, min_trials=3) == "buffer"
        assert pick_scopes(source, "conv2d", wls["a"].key(), "another-device") is None
        assert pick_scopes(source, "dense", wls["a"].key(), fp) is None


def test_device_selection(known, device, tmp_path):
    path, wls = known
    other = _info(device, "other")
    conv = get_template("conv2d")
    log = tmp_path / "two.jsonl"
    shutil.copy(path, log)
    append_records(log, _records(conv, wls["a"], other, "buffer", [1] * 5) + _records(conv, wls["a"], other,
                                                                                        "texture", [4] * 5))
    df = load_logs(log)
    both = compare(df)
    assert len(both) == 4 and set(both["device"]) == {device.fingerprint, other.fingerprint}
    mine = compare(df, device=device.fingerprint)
    assert len(mine) == 3 and set(mine["device"]) == {device.fingerprint}
    theirs = compare(df, device=other.fingerprint)
    assert theirs["pick"].tolist() == ["buffer"] and theirs["texture_speedup"].iloc[0] == pytest.approx(0.25)
    with pytest.raises(TunerError, match="matches 2 devices"):
        compare(df, device=device.info.platform_tag)  # "pocl", "intel", ...: both runs' fingerprints
    with pytest.raises(TunerError, match="no device matching 'nvidia'"):
        compare(df, device="nvidia")


# ------------------------------------------------------------------------------------------------ report

PROFILE = {"device": "pocl-cpu-test", "total_s": 0.0075, "rows": [
    {"node": "conv1", "op": "conv2d", "template": "conv2d", "scopes": "texture", "median_s": 0.0021},
    {"node": "pool1", "op": "maxpool", "template": None, "scopes": None, "median_s": 0.0003},
    {"node": "conv2", "op": "conv2d", "template": "conv2d", "scopes": "buffer", "median_s": 0.0042},
    {"node": "fc", "op": "dense", "template": "dense", "scopes": "texture/buffer/buffer", "median_s": 0.0007}]}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    d = tmp_path_factory.mktemp("artifact")
    (d / "profile.json").write_text(json.dumps(PROFILE))
    return d


def _images(text: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'<img alt="[^"]*" src="data:image/png;base64,([^"]+)"', text)]


def test_report_embeds_every_figure_and_loads_nothing(known, tuned, artifact):
    df = load_logs([known[0], tuned[0]])
    text = render_report(df, artifact=artifact, title="t <&> t")
    images = _images(text)
    assert len(images) == text.count("<img") == 5  # convergence, texture/buffer, ceiling, errors, profile
    assert all(png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000 for png in images)
    assert "<title>t &lt;&amp;&gt; t</title>" in text
    assert not re.search(r'(src|href)="(?!data:)', text) and "<script" not in text and "url(" not in text
    for task in summarize(df)["task"]:
        assert task.replace("&", "&amp;").replace(">", "&gt;") in text
    assert "too few trials: buffer 3 &lt; 5 successful" in text and "1.500" in text  # workload A's speedup
    assert "<td>conv2</td><td>conv2d</td><td>conv2d</td><td>buffer</td>" in text and "56.0%" in text
    without = render_report(df)
    assert len(_images(without)) == 4 and "per-layer latency" not in without


def test_report_without_successes_says_so(tmp_path, device):
    conv = get_template("conv2d")
    wl = conv.workload(data=(1, 4, 4, 4), kernel=(4, 4, 1, 1))
    append_records(tmp_path / "bad.jsonl", _records(conv, wl, _info(device), "buffer", [], failures=3))
    text = render_report(load_logs(tmp_path / "bad.jsonl"))
    assert len(_images(text)) == 2 and "no successful measurement yet" in text  # scope table + errors remain
    assert "COMPILE" in text and "clBuildProgram failed" in text


@pytest.mark.parametrize("content, message", [
    (None, r"no profile.json and no manifest.json: not a compiled model's directory .*`tuner run DIR --profile`"),
    ("{not json", "not valid JSON"),
    (json.dumps({"device": "d", "rows": [{"node": "n", "op": "conv2d"}], "total_s": 1.0}),
     r'rows\[0\]\["median_s"\] must be a number'),
    (json.dumps({"device": "d", "rows": []}), '"total_s" must be a number'),
])
def test_bad_profiles_are_named(tmp_path, known, content, message):
    if content is not None:
        (tmp_path / "profile.json").write_text(content)
    with pytest.raises(TunerError, match=message):
        render_report(load_logs(known[0]), artifact=tmp_path)


# --------------------------------------------------------------------------------------------------- CLI

def test_cli_logs_summary_and_exports(known, tmp_path, capsys):
    path = str(known[0])
    assert main(["logs", path]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("conv2d 8->8 3x3 p1 @8x8 [texture]"))
    assert re.search(r"\s7\s+5\s+COMPILE 2\s", line) and " 2 " in line  # trials, ok, failures; best 2 ms
    assert "records, 7 tasks" in out
    assert main(["logs", path, "--best", "-o", str(tmp_path / "best.csv")]) == 0
    best = read_export(tmp_path / "best.csv")
    assert len(best) == 7 and best["ok"].all()
    assert best.set_index("task").loc["conv2d 8->8 3x3 p1 @8x8 [buffer]", "median_s"] == pytest.approx(3e-3)
    assert main(["logs", path, "--format", "parquet", "-o", str(tmp_path / "all.parquet")]) == 0
    pd.testing.assert_frame_equal(read_export(tmp_path / "all.parquet"), load_logs(path))
    assert main(["logs", path, "--best", "--format", "json"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 7


def test_cli_compare_and_report(known, artifact, tmp_path, capsys):
    assert main(["compare", str(known[0])]) == 0
    out = capsys.readouterr().out
    assert re.search(r"conv2d 8->8 3x3 p1 @8x8 .* 1\.50x\s+texture", out)
    assert re.search(r"conv2d 8->16 1x1 @8x8 .* 0\.25x\s+buffer", out)
    assert "too few trials: buffer 3 < 5 successful" in out
    assert "texture 6 ms, buffer 4 ms, auto 3 ms (2.00x over all-texture, 1.33x over all-buffer" in out
    report = tmp_path / "r" / "report.html"
    assert main(["report", str(known[0]), "--artifact", str(artifact), "-o", str(report)]) == 0
    assert len(_images(report.read_text())) == 5


@pytest.mark.parametrize("argv, message", [
    (["logs", "/nonexistent/log.jsonl"], "tuning log /nonexistent/log.jsonl: no such file"),
    (["compare", "EMPTY"], "no records in EMPTY"),
    (["report", "/nonexistent/*.jsonl"], "no records in /nonexistent/*.jsonl"),
    (["logs", "KNOWN", "--format", "parquet"], "--format parquet writes a binary file: give -o FILE.parquet"),
    (["logs", "KNOWN", "-o", "out.xlsx", "--format", "csv", "--device", "nvidia"], "no device matching 'nvidia'"),
    (["report", "KNOWN", "--artifact", "/nonexistent"], "--artifact /nonexistent: not a directory"),
])
def test_cli_bad_input_exits_2_with_a_message(known, tmp_path, capsys, argv, message):
    (tmp_path / "empty.jsonl").write_text("")
    names = {"EMPTY": str(tmp_path / "empty.jsonl"), "KNOWN": str(known[0])}
    argv = [names.get(a, a) for a in argv]
    message = message.replace("EMPTY", names["EMPTY"])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
