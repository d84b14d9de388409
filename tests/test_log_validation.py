"""Hostile log lines: well-formed JSON with bad values is skipped and counted like a torn line, in every
reader (tuner.load_records, tuner.load_logs on its fast and its line-by-line path, the CLI)."""
from __future__ import annotations

import json
import warnings

import pytest

from tuner.analysis import load_logs
from tuner.cli import main
from tuner.errors import ErrorCode, TunerError
from tuner.logs import Record, TuningLogWarning, load_records
from tuner.logs.record import InvalidRecordError, validate_record
from tuner.templates import get_template

FP = "pocl-cpu-0123abcd"


def _good(median_ms: float, scope: str = "buffer", trial: int = 0) -> dict:
    wl = get_template("conv2d").workload(data=(1, 4, 8, 8), kernel=(4, 4, 3, 3), padding=1)
    cfg = {"tile_oc": 1, "tile_oh": 1, "tile_ow": 2, "wg_w": 8, "unroll_rs": False, "act_layout": "nchw4c",
           **{f"{op}_scope": scope for op in ("input", "weight", "output")}}
    costs = [median_ms * 1e-3] * 3
    return Record.new("conv2d", wl, cfg, _Info(), costs=costs, trial=trial).to_dict()


class _Info:
    fingerprint, name, platform, driver_version = FP, "cpu", "Portable Computing Language", "6.0"


BAD = {
    "costs not a list": {"costs": "abc"},
    "a cost not a number": {"costs": [1e-3, "x"]},
    "negative median": {"median_s": -1.0},
    "negative cost": {"costs": [-1e-3, 1e-3]},
    "NaN median": {"median_s": float("nan")},
    "unknown error code": {"error_code": 99},
    "error name disagrees": {"error_code": int(ErrorCode.WRONG_ANSWER), "error_name": "NO_ERROR"},
    "config knob a dict": {"config": {"tile_oc": {"x": 1}}},
    "config knob a list": {"config": {"tile_oc": [1, 2]}},
    "config knob null": {"config": {"tile_oc": None, "tile_ow": 2}},
    "scope not a scope": {"scopes": {"input": "cache", "weight": "buffer", "output": "buffer"}},
    "negative duration": {"duration_s": -3.0},
    "empty template": {"template": ""},
}


def _line(d: dict) -> str:
    return json.dumps(d)  # allow_nan: Python's json writes (and reads) NaN, pyarrow does not


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize("name", BAD)
def test_a_bad_value_is_a_named_tuner_error(name):
    d = {**_good(2.0), **BAD[name]}
    with pytest.raises(InvalidRecordError) as e:
        Record.from_dict(json.loads(_line(d)))
    assert isinstance(e.value, TunerError) and "record" in str(e.value) and "skipped" in str(e.value)


@pytest.mark.parametrize("name", BAD)
def test_every_reader_skips_and_counts_a_bad_record(tmp_path, name):
    good = [_line(_good(ms, trial=i)) for i, ms in enumerate((3.0, 2.0))]
    path = _write(tmp_path / "log.jsonl", [good[0], _line({**_good(1.0, trial=5), **BAD[name]}), good[1]])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        records = load_records(path)
        df = load_logs(path)
    assert [r.trial for r in records] == [0, 1] and list(df["trial"]) == [0, 1]
    msgs = [str(x.message) for x in w if issubclass(x.category, TuningLogWarning)]
    assert len(msgs) == 2 and all("skipped 1 bad line" in m and "first at line 2" in m for m in msgs)
    assert df["median_s"].min() == pytest.approx(2e-3)  # a negative or NaN time is never the best
    assert set(df["error_name"]) == {"NO_ERROR"}


def test_the_fast_path_checks_values_too(tmp_path):
    """A file pyarrow parses cleanly in one read still has its values checked (the frame of a bad file equals
    the frame of its good lines)."""
    good = [_line(_good(ms, trial=i)) for i, ms in enumerate((3.0, 2.0, 4.0))]
    clean = load_logs(_write(tmp_path / "good.jsonl", good))
    for name in ("negative median", "unknown error code", "config knob null", "negative cost"):
        path = _write(tmp_path / "bad.jsonl", good + [_line({**_good(0.5, trial=9), **BAD[name]})])
        with pytest.warns(TuningLogWarning, match="skipped 1 bad line.*first at line 4"):
            df = load_logs(path)
        assert list(df["trial"]) == [0, 1, 2], name
        assert df.drop(columns="log").equals(clean.drop(columns="log")), name


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
    with pytest.warns(TuningLogWarning, match="skipped 3 bad lines"):
        assert main(["compare", path, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["pick"] == "texture"


def test_a_line_without_error_name_takes_its_codes_name():
    d = _good(2.0)
    del d["error_name"]
    d.update(error_code=int(ErrorCode.COMPILE), median_s=None, costs=[])
    r = Record.from_dict(d)
    assert r.error_name == "COMPILE" and not r.ok
    validate_record(r.to_dict())
    r.validate()
