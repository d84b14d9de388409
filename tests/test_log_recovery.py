"""Recovery after a full disk: a failed append leaves the log whole, its records go to a side file named in a
warning that counts them right, and ``tuner logs --merge SIDE... -o LOG`` brings them back whole, even onto a
log whose last line a killed writer tore (``cat SIDE >> LOG`` glued the first record onto that line)."""
from __future__ import annotations

import dataclasses
import errno
import os
import re
import shlex
import warnings
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.errors import TunerError
from tuner.logs import Record, TuningLogWarning, append_records, load_records
from tuner.logs import io as log_io
from tuner.logs.io import merge_records
from tuner.templates import get_template

CONV = get_template("conv2d")
WL = CONV.workload(data=(1, 4, 8, 8), kernel=(4, 4, 3, 3), padding=1)


class _Info:
    fingerprint, name, platform, driver_version = "pocl-cpu-0123abcd", "cpu", "p", "1"


def _records(n: int, start: int = 0) -> list:
    return [Record.new("conv2d", WL, dataclasses.replace(CONV.config(), tile_ow=2), _Info(),
                       costs=[(1 + i) * 1e-3] * 3, trial=i) for i in range(start, start + n)]


@pytest.fixture
def disk(tmp_path, monkeypatch):
    """A disk whose ``folder`` fills up on ``fill()``: each write there takes half its bytes, then ENOSPC; the
    temp folder, ``temp``, keeps room. ``free()`` makes room again."""
    class Disk:
        folder, temp, full = tmp_path / "full", tmp_path / "spare", False

        def fill(self):
            self.full = True

        def free(self):
            self.full = False

    d = Disk()
    d.folder.mkdir()
    d.temp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(d.temp))
    real = log_io._write_all

    def write_all(fd, data):
        if d.full and Path(os.readlink(f"/proc/self/fd/{fd}")).parent == d.folder:
            os.write(fd, data[:len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, data)

    monkeypatch.setattr(log_io, "_write_all", write_all)
    return d


def _merge_argv(message: str) -> list:
    """The command a rescue warning names, as argv for ``tuner.cli.main``."""
    command = re.search(r"merge them back with: (tuner logs --merge .*)$", message).group(1)
    argv = shlex.split(command)
    assert argv[:3] == ["tuner", "logs", "--merge"]
    return argv[1:]


def test_a_full_disk_keeps_the_log_whole_and_the_merge_brings_every_record_back(disk, capsys):
    log = disk.folder / "L.jsonl"
    before, rescued, messages = _records(3), [], []
    append_records(log, before)
    disk.fill()
    for batch in range(3):  # each batch of 2 goes to one side file
        recs = _records(2, start=10 + 2 * batch)
        rescued += recs
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            side = append_records(log, recs)
        messages += [str(x.message) for x in w if issubclass(x.category, TuningLogWarning)]
    assert side.parent == disk.temp and side.name == f"L.jsonl.rescued-{os.getpid()}.jsonl"
    # the count is right: each warning names its records and what the side file holds in all
    assert [re.search(r"(\d+) records saved in .* instead \((\d+) there in all\)", m).groups() for m in messages] == [
        ("2", "2"), ("2", "4"), ("2", "6")]
    assert sorted(p.name for p in disk.folder.iterdir()) == ["L.jsonl", "L.jsonl.lock"]  # no empty side file
    assert load_records(log) == before  # every failed write was undone: no torn line
    assert load_records(side) == rescued
    disk.free()
    assert main(_merge_argv(messages[-1])) == 0
    assert "merged 6 records from 1 file" in capsys.readouterr().err
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_records(log) == before + rescued
    assert main(_merge_argv(messages[-1])) == 0  # again: nothing twice
    assert "merged 0 records from 1 file" in capsys.readouterr().err and len(load_records(log)) == 9


def test_merging_onto_a_torn_last_line_keeps_every_merged_record(tmp_path, capsys):
    """The issue's case: the log ends in half a record; `cat rescued >> log` glued the first rescued record onto
    it (9 of 10 read back). The merge ends the torn line first: it stays one bad line, and all N come back."""
    log, side = tmp_path / "L.jsonl", tmp_path / "L.jsonl.rescued-123.jsonl"
    kept, rescued = _records(3), _records(10, start=100)
    append_records(log, kept)
    with open(log, "a") as f:
        f.write(_records(1, start=50)[0].to_json()[:70])  # a writer killed mid-line
    append_records(side, rescued)
    with pytest.warns(TuningLogWarning, match=r"L\.jsonl: skipped 1 bad line \(torn or not JSON\), first at line 4"):
        assert main(["logs", "--merge", str(tmp_path / "L.jsonl.rescued-*.jsonl"), "-o", str(log)]) == 0
    assert "merged 10 records from 1 file" in capsys.readouterr().err
    assert log.read_bytes().count(b"\n") == 3 + 1 + 10  # the torn line ended: one line, then ten whole ones
    with pytest.warns(TuningLogWarning, match=r"skipped 1 bad line \(torn or not JSON\), first at line 4"):
        assert load_records(log) == kept + rescued


def test_merge_skips_what_the_log_holds_and_bad_source_lines(tmp_path):
    log, a, b = tmp_path / "L.jsonl", tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    recs = _records(4)
    append_records(log, recs[:2])
    append_records(a, recs[1:3])  # recs[1] is in the log already
    append_records(b, recs[2:])  # recs[2] is in a too
    with open(b, "a") as f:
        f.write("{torn\n" + "[" * 10_000 + "]" * 10_000 + "\n")
    with pytest.warns(TuningLogWarning) as w:
        res = merge_records([a, str(tmp_path / "b.*")], log)
    assert (res.added, res.present, res.skipped) == (2, 2, 2) and len(w) == 2
    assert load_records(log) == recs
    assert merge_records([log], log).added == 0  # the log itself is never merged into itself


def test_a_side_file_that_cannot_be_written_is_not_left_behind(tmp_path, monkeypatch):
    """Neither the log's folder nor the temp folder takes the records: one error naming both, and no side
    file, empty or half written, remains."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))

    def enospc(fd, data):
        os.write(fd, data[:10])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(log_io, "_write_all", enospc)
    log = tmp_path / "L.jsonl"
    with pytest.raises(TunerError, match=r"cannot write tuning records to .*L\.jsonl nor to .*rescued.*nor to"):
        append_records(log, _records(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["L.jsonl", "L.jsonl.lock"]
    assert log.read_bytes() == b""


def test_merge_needs_a_log_and_takes_nothing_else(tmp_path, capsys):
    append_records(tmp_path / "a.jsonl", _records(1))
    assert main(["logs", "--merge", str(tmp_path / "a.jsonl")]) == 2
    assert "name it with -o" in capsys.readouterr().err
    assert main(["logs", "--merge", str(tmp_path / "a.jsonl"), "-o", str(tmp_path / "L.jsonl"), "--best"]) == 2
    assert "not --best" in capsys.readouterr().err
    assert main(["logs", "--merge", str(tmp_path / "none-*.jsonl"), "-o", str(tmp_path / "L.jsonl")]) == 0
    assert "nothing to merge" in capsys.readouterr().err and not list(tmp_path.glob("L.jsonl*"))


def test_merge_refuses_a_target_that_is_not_a_log(tmp_path, capsys):
    """`tuner logs --merge SIDE -o model.onnx` (a slip) must not append records to a model."""
    from tuner.cli import main
    victim = tmp_path / "model.onnx"
    victim.write_bytes(b"\x08\x07\x12\x04onnx not a log")
    side = tmp_path / "side.jsonl"
    side.write_text("")
    before = victim.read_bytes()
    assert main(["logs", "--merge", str(side), "-o", str(victim)]) == 2
    assert "is not a tuning log" in capsys.readouterr().err and victim.read_bytes() == before
