"""What people read: one-line warnings, tables that fit the terminal, and a report that labels layers by
scope and says why textures lost."""
from __future__ import annotations

import io
import json
import warnings

import pytest

from tuner import console
from tuner.analysis import compare, load_logs, read_export, render_report
from tuner.analysis.report import _scope_kind
from tuner.cli import main
from tuner.logs import Record, append_records
from tuner.templates import get_template

SCOPES = ("input", "weight", "output")


# ---------------------------------------------------------------------------------------------- warnings

@pytest.fixture
def one_line(monkeypatch):
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)
    monkeypatch.setattr(console, "_shown", set())
    console.setup_warnings()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        yield


def test_warnings_print_on_one_line_once_each(one_line, capsys):
    warnings.warn("tuning log x.jsonl: skipped 2 bad lines\n(torn)", UserWarning)
    warnings.warn("tuning log x.jsonl: skipped 2 bad lines\n(torn)", UserWarning)  # again: not shown
    warnings.warn("another", DeprecationWarning)
    assert capsys.readouterr().err == ("warning: tuning log x.jsonl: skipped 2 bad lines (torn) (UserWarning)\n"
                                   "warning: another (DeprecationWarning)\n")
    assert warnings.formatwarning("m", RuntimeWarning, "f.py", 3) == "warning: m (RuntimeWarning)\n"


# ------------------------------------------------------------------------------------------------ tables

def test_format_table_cuts_long_columns_to_the_width():
    rows = [["a" * 50, 1, "x" * 300], ["b", 22, "y"]]
    text = console.format_table(["name", "n", "config"], rows, right={1}, width=60,
                                fit=[("shrink", 2, 10), ("shrink", 0, 12, "middle")])
    lines = text.splitlines()
    assert max(map(len, lines)) <= 60 and lines[2].endswith("x…") and lines[3].endswith("y")
    narrow = console.format_table(["name", "n", "config"], rows, width=20,
                                  fit=[("drop", 2), ("shrink", 0, 12, "middle")])
    assert "config" not in narrow and max(map(len, narrow.splitlines())) <= 20
    assert narrow.splitlines()[2].startswith("aaaaaaaa…aaaaaaa ")
    assert console.format_table(["c"], [["z" * 300]], width=None, fit=[("shrink", 0, 5)]).endswith("z" * 300)


def test_terminal_width_is_100_off_a_terminal(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr("sys.stdout", io.StringIO())
    assert console.terminal_width() == 100
    monkeypatch.setenv("COLUMNS", "132")
    assert console.terminal_width() == 132


def _info(fingerprint):
    class Info:
        name, platform, driver_version = "dev", "p", "1"
    Info.fingerprint = fingerprint
    return Info


def _log(path, fingerprint, tex_ms, buf_ms):
    conv = get_template("conv2d")
    wl = conv.workload(data=(1, 64, 56, 56), kernel=(64, 64, 3, 3), padding=1, bias=True, activation="relu")
    records = []
    for scope, ms in (("texture", tex_ms), ("buffer", buf_ms)):
        cfg = {"tile_oc": 2, "tile_oh": 1, "tile_ow": 2, "wg_w": 8, "wg_h": 4, "split_c": 1, "unroll_rs": False,
               "vec_load": 4, "act_layout": "nchw4c", "weight_layout": "oihw4o", "cache_input": False,
               **{f"{op}_scope": scope for op in SCOPES}}
        records += [Record.new("conv2d", wl, cfg, _info(fingerprint), costs=[ms * 1e-3 * (1 + i / 10)] * 3, trial=i)
                    for i in range(5)]
    append_records(path, records)
    return str(path)


def test_logs_and_compare_tables_fit_100_columns_and_exports_keep_everything(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    path = _log(tmp_path / "log.jsonl", "nvidia-gpu-0123abcd", 2.0, 1.0)
    for argv in (["logs", path], ["logs", path, "--best"], ["compare", path]):
        assert main(argv) == 0
        out = capsys.readouterr().out
        table = out.split("\n\n")[0].splitlines()
        assert max(map(len, table)) <= 100, argv
        assert "conv2d 64->64 3x3 p1 @56x56 +bias+relu" in out
    assert main(["logs", path, "--best", "-o", str(tmp_path / "best.csv")]) == 0
    best = read_export(tmp_path / "best.csv")
    assert set(best["cfg.weight_layout"]) == {"oihw4o"} and set(best["cfg.cache_input"]) == {False}


# ------------------------------------------------------------------------------------------------ report

@pytest.mark.parametrize("scopes, kind", [
    ("i=buffer,w=buffer,o=buffer", "buffer"), ("i=texture,w=texture,o=texture", "texture"),
    ("buffer", "buffer"), ("texture", "texture"), ("i=texture,w=buffer,o=buffer", "mixed"),
    ("texture/buffer/buffer", "mixed"), ("", "none"), (None, "none")])
def test_layers_are_labelled_by_their_operands_scopes(scopes, kind):
    assert _scope_kind(scopes) == kind


def test_report_labels_all_buffer_layers_and_says_why_textures_lost_on_a_cpu(tmp_path):
    path = _log(tmp_path / "cpu.jsonl", "pocl-cpu-0123abcd", 4.0, 1.0)
    (tmp_path / "art").mkdir()
    (tmp_path / "art" / "profile.json").write_text(json.dumps({
        "device": "cpu-haswell", "fingerprint": "pocl-cpu-0123abcd", "total_s": 0.01, "rows": [
            {"node": "conv1", "op": "conv2d", "template": "conv2d", "scopes": "i=buffer,w=buffer,o=buffer",
             "median_s": 0.004},
            {"node": "conv2", "op": "conv2d", "template": "conv2d", "scopes": "i=texture,w=buffer,o=buffer",
             "median_s": 0.003},
            {"node": "pool", "op": "maxpool", "template": None, "scopes": "", "median_s": 0.001}]}))
    text = render_report(load_logs(path), artifact=tmp_path / "art")
    assert "<td>conv1</td><td>conv2d</td><td>conv2d</td><td>buffer</td>" in text
    assert "<td>mixed (texture/buffer/buffer)</td>" in text
    assert "CPU OpenCL runtimes emulate image reads in software" in text
    assert "1 of 2 kernel layers run in buffers" in text


def test_on_a_gpu_the_reason_is_the_measured_ratio(tmp_path):
    df = load_logs(_log(tmp_path / "gpu.jsonl", "nvidia-gpu-0123abcd", 3.0, 2.0))
    row = compare(df).iloc[0]
    assert row["pick"] == "buffer" and row["why"].startswith("measured: buffer 1.50x faster")
    text = render_report(df)
    assert "buffer 1.50x faster (3 ms texture, 2 ms buffer)" in text and "emulate" not in text
    assert compare(load_logs(_log(tmp_path / "tex.jsonl", "nvidia-gpu-0123abcd", 1.0, 2.0))).iloc[0]["why"] == ""
