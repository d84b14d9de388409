"""Hostile log lines: well-formed JSON with bad values, oversized or over-nested lines, and special files.
Every reader (tuner.load_records, tuner.load_logs, apply_history_best, the CLI, the tuner resuming from its
log) checks a line with the one validator (``tuner.logs.record.validate_record``), skips a bad one and counts
it in one warning per kind of problem; a log that is not a regular file is a clean error, never a hang."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from tuner.analysis import load_logs
from tuner.cli import main
from tuner.errors import ErrorCode, TunerError
from tuner.logs import Record, TuningLogWarning, append_records, apply_history_best, load_records
from tuner.logs.io import ensure_writable, merge_records
from tuner.logs.record import (MAX_DEPTH, MAX_LINE_BYTES, InvalidRecordError, check_line, parse_line, too_deep,
                               validate_record)
from tuner.templates import get_template

FP = "pocl-cpu-0123abcd"
ROOT = Path(__file__).resolve().parent.parent
CONV = get_template("conv2d")
WL = CONV.workload(data=(1, 4, 8, 8), kernel=(4, 4, 3, 3), padding=1)


class _Info:
    fingerprint, name, platform, driver_version = FP, "cpu", "Portable Computing Language", "6.0"


def _good(median_ms: float, scope: str = "buffer", trial: int = 0, **knobs) -> dict:
    cfg = dataclasses.asdict(CONV.config(tile_ow=2, wg_w=8, unroll_rs=False, **knobs,
                                         **{f"{op}_scope": scope for op in ("input", "weight", "output")}))
    costs = [median_ms * 1e-3] * 3
    return Record.new("conv2d", WL, cfg, _Info(), costs=costs, trial=trial).to_dict()


def _without(d: dict, *knobs) -> dict:
    return {**d, "config": {k: v for k, v in d["config"].items() if k not in knobs}}


def _config(**knobs) -> dict:
    return {"config": {**_good(1.0)["config"], **knobs}}


BAD = {  # name -> (fields replaced in a good record, the kind of problem the warning names)
    "costs not a list": ({"costs": "abc"}, "a field of the wrong type"),
    "a cost not a number": ({"costs": [1e-3, "x"]}, "a field of the wrong type"),
    "negative median": ({"median_s": -1.0}, "an invalid value"),
    "negative cost": ({"costs": [-1e-3, 1e-3]}, "an invalid value"),
    "NaN median": ({"median_s": float("nan")}, "an invalid value"),
    "unknown error code": ({"error_code": 99}, "an invalid value"),
    "error name disagrees": ({"error_code": int(ErrorCode.WRONG_ANSWER), "error_name": "NO_ERROR"},
                             "an invalid value"),
    "config knob a dict": (_config(tile_oc={"x": 1}), "a config its template rejects"),
    "config knob a list": (_config(tile_oc=[1, 2]), "a config its template rejects"),
    "config knob null": (_config(tile_oc=None), "a config its template rejects"),
    "scope not a scope": ({"scopes": {"input": "cache", "weight": "buffer", "output": "buffer"}}, "an invalid value"),
    "negative duration": ({"duration_s": -3.0}, "an invalid value"),
    "empty template": ({"template": ""}, "an invalid value"),
    # the hostile-user sweep
    "workload data a string": ({"workload": {**WL.key(), "data": "abc"}}, "a workload its template rejects"),
    "workload not canonical": ({"workload": {**WL.key(), "padding": 1}}, "a workload its template rejects"),
    "workload int past 2**53": ({"workload": {**WL.key(), "data": [1, 4, 2 ** 60, 8]}}, "an invalid value"),
    "template nosuch": ({"template": "nosuch"}, "an unknown template"),
    "template importing code": ({"template": "os:system"}, "an unknown template"),
    "knob of the wrong type": (_config(tile_oc="huge"), "a config its template rejects"),
    "bool knob given 1": (_config(unroll_rs=1), "a config its template rejects"),
    "int knob given 4.0": (_config(tile_ow=4.0), "a config its template rejects"),
    "knob not of the template": (_config(tile_zz=1), "a config its template rejects"),
    "scopes disagree with config": ({"scopes": {"input": "texture", "weight": "buffer", "output": "buffer"}},
                                    "a config its template rejects"),
    "median 0 in a success": ({"median_s": 0, "costs": [0, 0, 0]}, "an invalid value"),
    "a success with no time": ({"median_s": None, "costs": []}, "an invalid value"),  # issue 36
    "median outside its costs": ({"median_s": 1e-6}, "an invalid value"),
    "median of a day and more": ({"median_s": 1e6, "costs": [1e6]}, "an invalid value"),
    "trial 10**30": ({"trial": 10 ** 30}, "an invalid value"),
    "negative trial": ({"trial": -1}, "an invalid value"),
    "bidi override in the template": ({"template": "conv2d\u202e"}, "text with control or bidi characters"),
    "escape sequence in the device": ({"device": "dev\x1b[2J"}, "text with control or bidi characters"),
    "bidi override in a knob": (_config(act_layout="nchw4c\u202e"), "text with control or bidi characters"),
    "a name of 1,000 characters": ({"device_name": "x" * 1000}, "text with control or bidi characters"),
}


def _line(d: dict) -> str:
    return json.dumps(d)  # allow_nan: Python's json writes (and reads) NaN, pyarrow does not


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _messages(w) -> list:
    return [str(x.message) for x in w if issubclass(x.category, TuningLogWarning)]


@pytest.mark.parametrize("name", BAD)
def test_a_bad_value_is_a_named_tuner_error(name):
    d = {**_good(2.0), **BAD[name][0]}
    with pytest.raises(InvalidRecordError) as e:
        Record.from_dict(json.loads(_line(d)))
    assert isinstance(e.value, TunerError) and "record" in str(e.value) and "skipped" in str(e.value)
    assert e.value.kind.startswith(BAD[name][1])
    assert not {"\u202e", "\x1b"} & set(str(e.value))  # hostile text is escaped: it never reaches the terminal


@pytest.mark.parametrize("name", BAD)
def test_every_reader_skips_and_counts_a_bad_record(tmp_path, name):
    good = [_line(_good(ms, trial=i)) for i, ms in enumerate((3.0, 2.0))]
    path = _write(tmp_path / "log.jsonl", [good[0], _line({**_good(1.0, trial=5), **BAD[name][0]}), good[1]])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        records = load_records(path)
        df = load_logs(path)
        history = apply_history_best(str(path))
    assert [r.trial for r in records] == [0, 1] and list(df["trial"]) == [0, 1] and len(history.records) == 2
    msgs = _messages(w)
    assert len(msgs) == 3 and all(f"skipped 1 bad line ({BAD[name][1]}" in m and "first at line 2" in m for m in msgs)
    assert df["median_s"].min() == pytest.approx(2e-3)  # a negative, zero or NaN time is never the best
    assert set(df["error_name"]) == {"NO_ERROR"}


def test_a_forged_gflops_is_recomputed_not_trusted(tmp_path):
    """GFLOP/s follow from the workload's flops and the median: a line's own number is never shown."""
    path = _write(tmp_path / "log.jsonl", [_line({**_good(2.0), "gflops": 1e9}), _line({**_good(4.0), "gflops": None})])
    expected = [WL.flops / 2e-3 / 1e9, WL.flops / 4e-3 / 1e9]
    assert [r.gflops for r in load_records(path)] == pytest.approx(expected)
    assert list(load_logs(path)["gflops"]) == pytest.approx(expected)


def test_bad_lines_warn_once_per_kind_with_count_and_first_line(tmp_path):
    good = _line(_good(2.0))
    lines = [good, _line({**_good(1.0), "trial": 10 ** 30}), "{torn", _line({**_good(1.0), "median_s": 0.0}), good,
             "[" * 100_000 + "]" * 100_000, '{"also": "torn', _line({**_good(1.0), "template": "nosuch"})]
    with pytest.warns(TuningLogWarning) as w:
        assert len(load_records(_write(tmp_path / "log.jsonl", lines))) == 2
    msgs = _messages(w)
    assert len(msgs) == 4, msgs
    assert "skipped 2 bad lines (an invalid value), first at line 2" in msgs[0]
    assert "skipped 2 bad lines (torn or not JSON), first at line 3" in msgs[1]
    assert f"skipped 1 bad line (nested deeper than {MAX_DEPTH} levels), first at line 6" in msgs[2]
    assert "skipped 1 bad line (an unknown template), first at line 8" in msgs[3]


def test_deep_nesting_is_refused_before_json_loads():
    """A line of 100,000 nested lists raised RecursionError in `tuner logs` and `tune-op --log`."""
    deep = b"[" * 100_000 + b"]" * 100_000
    assert too_deep(deep) and not too_deep(json.dumps(_good(1.0)).encode())
    assert not too_deep(b'{"error_msg": "' + b"[{" * 1000 + b'"}')  # brackets in a string do not nest
    assert not too_deep(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH) and too_deep(b"[" * (MAX_DEPTH + 1))
    start = time.perf_counter()  # escaped quotes and an unterminated string cost a linear scan, not a quadratic one
    too_deep(b'"\\"' * 300_000 + b"[" * 40 + b'"\\' * 300_000)
    assert time.perf_counter() - start < 2.0
    with pytest.raises(InvalidRecordError, match="nested deeper"):
        parse_line(deep)


def test_an_oversized_line_is_skipped_in_bounded_pieces(tmp_path):
    good = _line(_good(2.0))
    huge = _line({**_good(1.0), "error_msg": "x" * (3 * MAX_LINE_BYTES)})
    path = _write(tmp_path / "log.jsonl", [good, huge, huge[:MAX_LINE_BYTES + 5], good])  # the 3rd is torn too
    with pytest.warns(TuningLogWarning, match=r"skipped 2 bad lines \(longer than 1 MiB\), first at line 2"):
        assert len(load_records(path)) == 2
    with pytest.warns(TuningLogWarning, match=r"skipped 2 bad lines \(longer than 1 MiB\), first at line 2"):
        assert len(load_logs(path)) == 2


def test_cli_logs_survives_the_hostile_sweep(tmp_path, capsys):
    lines = [_line(_good(2.0, trial=i)) for i in range(3)]
    lines += [_line({**_good(0.1), **BAD[name][0]}) for name in BAD] + ["[" * 100_000 + "]" * 100_000]
    path = str(_write(tmp_path / "log.jsonl", lines))
    with pytest.warns(TuningLogWarning):
        assert main(["logs", path, "--format", "json"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["trial"] for r in rows] == [0, 1, 2] and {r["template"] for r in rows} == {"conv2d"}
    assert all(r["median_s"] == pytest.approx(2e-3) and r["gflops"] == pytest.approx(WL.flops / 2e-3 / 1e9)
               for r in rows)
    with pytest.warns(TuningLogWarning):
        assert main(["logs", path]) == 0
    table = capsys.readouterr().out
    assert "\u202e" not in table and "\x1b" not in table and "3 records" in table


def test_cli_commands_survive_bad_values(tmp_path, capsys):
    lines = [_line(_good(ms, scope, trial=i)) for i, (ms, scope) in
             enumerate([(2.0, "texture")] * 5 + [(3.0, "buffer")] * 5)]
    lines += [_line({**_good(1.0), "costs": "abc"}), _line({**_good(1.0), "median_s": -1.0}),
              _line({**_good(1.0), "error_code": 99})]
    path = str(_write(tmp_path / "log.jsonl", lines))
    with pytest.warns(TuningLogWarning):
        assert main(["logs", path, "--best", "--format", "json"]) == 0
    best = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert sorted(b["median_s"] for b in best) == pytest.approx([2e-3, 3e-3])
    with pytest.warns(TuningLogWarning) as w:
        assert main(["compare", path, "--format", "json"]) == 0
    assert sorted(m.split(": ")[1].split(", first")[0] for m in _messages(w)) == [
        "skipped 1 bad line (a field of the wrong type)", "skipped 2 bad lines (an invalid value)"]
    assert json.loads(capsys.readouterr().out)["pick"] == "texture"


# ------------------------------------------------------------------------------------------- missing knobs

def test_a_record_missing_a_knob_warns_and_is_never_deployed_with_its_default(tmp_path):
    """The fastest record lost its tile_oc: it used to be deployed with tile_oc's default (1) without a word."""
    fast = _without(_good(1.0, tile_oc=4), "tile_oc")
    slow = _good(3.0, tile_oc=2)
    path = _write(tmp_path / "log.jsonl", [_line(fast), _line(slow)])
    with pytest.warns(TuningLogWarning, match="a config its template rejects.*lacks conv2d knob tile_oc"):
        history = apply_history_best(str(path))
    best = history.query("conv2d", WL.key(), FP, {op: "buffer" for op in ("input", "weight", "output")})
    assert best.config["tile_oc"] == 2 and best.median_s == pytest.approx(3e-3)
    only = _write(tmp_path / "only.jsonl", [_line(fast)])
    with pytest.warns(TuningLogWarning, match="tile_oc"):
        assert len(apply_history_best(str(only))) == 0  # nothing to deploy: the fallback, with its own warning


def test_records_older_than_a_knob_are_read_with_its_default():
    """Knobs added since logs were first written (split_k, compute, local_input; se_gate's excite_split, unroll
    and partial_squeeze) may be missing: the committed logs predate them, and every one of their records still
    reads."""
    old = _without(_good(1.0), "split_k", "compute", "local_input")
    assert Record.from_dict(old).config == old["config"]
    validate_record(old)
    for log in sorted((ROOT / "logs").glob("*.jsonl")):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert len(load_records(log)) == sum(1 for line in log.read_text().splitlines() if line.strip())


def test_a_line_without_error_name_takes_its_codes_name():
    d = _good(2.0)
    del d["error_name"]
    d.update(error_code=int(ErrorCode.COMPILE), median_s=None, costs=[])
    r = Record.from_dict(d)
    assert r.error_name == "COMPILE" and not r.ok
    validate_record(r.to_dict())
    r.validate()
    assert check_line(json.dumps(d).encode())["error_name"] == "COMPILE"


# ------------------------------------------------------------------------------------------- special files

def _fifo(tmp_path) -> Path:
    path = tmp_path / "fifo.jsonl"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("make", ["fifo", "device", "directory"])
def test_a_log_that_is_not_a_regular_file_is_a_clean_error(tmp_path, capsys, make):
    path = {"fifo": lambda: _fifo(tmp_path), "device": lambda: Path("/dev/null"),
            "directory": lambda: tmp_path / "dir.jsonl"}[make]()
    if make == "directory":
        path.mkdir()
    what = {"fifo": "a FIFO", "device": "a device", "directory": "a directory"}[make]
    # load_logs reads a directory's *.jsonl (its documented meaning); the others want a log
    readers = (load_records, apply_history_best, ensure_writable) + ((load_logs,) if make != "directory" else ())
    for read in readers:
        with pytest.raises(TunerError, match=f"{path} is {what}"):
            read(str(path))
    with pytest.raises(TunerError, match=f"{path} is {what}"):
        merge_records([], path)
    with pytest.raises(TunerError, match=f"{path} is {what}"):
        merge_records([path], tmp_path / "out.jsonl")
    assert main(["logs", str(tmp_path / "dir.jsonl" if make == "directory" else path), "--merge", "-o",
                 str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"{path} is {what}" in err


def test_tune_op_refuses_a_fifo_log_instead_of_hanging(tmp_path):
    fifo = _fifo(tmp_path)
    r = subprocess.run([sys.executable, "-m", "tuner", "tune-op", "conv2d", "--data", "1,4,6,6", "--kernel", "4,4,3,3",
                        "--trials", "1", "--log", str(fifo), "--storage", f"sqlite:///{tmp_path / 's.db'}"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "is a FIFO" in r.stderr, r.stderr


def test_appending_to_a_fifo_rescues_the_records_instead_of_blocking(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    fifo = _fifo(tmp_path)
    rec = Record.from_dict(_good(2.0))
    with pytest.warns(TuningLogWarning, match="is a FIFO.*saved in"):
        side = append_records(fifo, [rec])
    assert side != fifo and load_records(side) == [rec]


def test_tune_op_reads_past_a_hostile_log(tmp_path, capsys):
    """The tuner's resume reads its log with the same validator: a RecursionError line, a 10**30 trial and a
    record missing a knob are skipped with warnings, and the run measures and logs as usual."""
    log = _write(tmp_path / "log.jsonl", ["[" * 100_000 + "]" * 100_000, _line({**_good(1.0), "trial": 10 ** 30}),
                                          _line(_without(_good(1.0), "tile_oc"))])
    with pytest.warns(TuningLogWarning) as w:
        assert main(["tune-op", "conv2d", "--data", "1,4,6,6", "--kernel", "4,4,3,3", "--trials", "1", "--no-progress",
                     "--log", str(log), "--storage", f"sqlite:///{tmp_path / 's.db'}"]) == 0
    msgs = " ".join(_messages(w))
    assert "nested deeper" in msgs and "an invalid value" in msgs and "tile_oc" in msgs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert len(load_records(log)) == 1  # the new measurement, whole, after the three bad lines


def test_a_field_whose_type_changes_deep_in_a_large_log_loads():
    """A dense record's ``weight`` is a shape, a weighted reduction's a name: the H200 log holds both, the change
    past pyarrow's first 1 MiB block, and pyarrow 26's JSON reader crashed the process on it (a segmentation
    fault) once that log's reductions were tuned. ``load_logs`` now reads in one block, where the change is an
    error it falls back from. Run in a child process, so that a crash fails this test and nothing else."""
    path = ROOT / "logs" / "nvidia-gpu-fcae3850.jsonl"
    lines = path.read_text().splitlines()
    assert any('"weight":[' in x for x in lines) and any('"weight":"pixel"' in x for x in lines)
    code = ("import sys, warnings; warnings.simplefilter('ignore'); from tuner.analysis.frame import load_logs; "
            "df = load_logs(sys.argv[1]); print(len(df), sorted(set(df['template'])))")
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.split()[0] == str(len(lines)) and "spatial_reduce" in r.stdout, r.stdout
