"""JSON-lines tuning logs: append from many processes, load what survived, merge what was rescued.

Tuning runs get killed (OOM, Ctrl-C, a hung driver), so a log may end in half a line; the loader skips
such lines with a warning instead of losing the whole run, and the writer never glues a new record onto
a torn one. A write that fails (a full disk) is undone, so the log keeps whole lines, and its records go to a
side file that ``tuner logs --merge`` brings back. A log is only ever a regular file: a FIFO would block a
reader or writer forever, a device would swallow or refuse records.
"""
from __future__ import annotations

import errno
import glob
import hashlib
import json
import os
import shlex
import stat
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from filelock import FileLock, Timeout

from tuner.errors import TunerError
from tuner.logs.record import MAX_LINE_BYTES, NOT_JSON, InvalidRecordError, Record


class TuningLogWarning(UserWarning):
    """Lines of a tuning log were skipped (torn, corrupted, invalid or from a newer tuner), or records were
    rescued to a side file."""


LOCK_TIMEOUT_S = 60.0  # a lock held longer than this is a stuck or dead process, not a busy one
WRITE_RETRIES = 3


# ------------------------------------------------------------------------------------------ regular files

def _special(mode: int) -> str | None:
    """What a file of this ``st_mode`` is when it is not a regular file (None when it is)."""
    if stat.S_ISREG(mode):
        return None
    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "not a regular file")


def _not_a_log(path, what: str) -> TunerError:
    return TunerError(f"tuning log {path} is {what}, not a regular file: a log is a .jsonl file (reading or "
                      "appending to anything else could block forever or lose records); give another path")


_FLAGS = {"rb": os.O_RDONLY, "ab": os.O_WRONLY | os.O_APPEND | os.O_CREAT,
          "a+b": os.O_RDWR | os.O_APPEND | os.O_CREAT}


def open_regular(path, mode: str = "rb", buffering: int = -1):
    """``open(path, mode)`` for a log, refusing anything but a regular file with a TunerError that names it.
    Opened non-blocking and checked on the open descriptor, so a FIFO put where a log was expected (or
    swapped in after a check) is refused instead of blocking for a writer or a reader that never comes."""
    flags = _FLAGS[mode] | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        if e.errno in (errno.ENXIO, errno.EISDIR):  # a FIFO without a reader, opened to write; a directory
            raise _not_a_log(path, "a FIFO (named pipe)" if e.errno == errno.ENXIO else "a directory") from None
        raise
    try:
        what = _special(os.fstat(fd).st_mode)
        if what:
            raise _not_a_log(path, what)
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode, buffering=buffering)
    except BaseException:
        os.close(fd)
        raise


def _check_regular(path: Path) -> None:
    """TunerError when ``path`` exists and is not a regular file (followed through symlinks)."""
    try:
        what = _special(path.stat().st_mode)
    except OSError:
        return  # missing (created later) or unreadable: the open says why
    if what:
        raise _not_a_log(path, what)


# ------------------------------------------------------------------------------------------------ writing

def _lock(path: Path) -> FileLock:
    """The log's inter-process lock, created up front so that an uncreatable lock file is an error, not an
    endless retry."""
    lock_path = Path(str(path) + ".lock")
    try:
        with open(lock_path, "a"):
            pass
    except OSError as e:
        raise TunerError(f"cannot create the lock file {lock_path} of log {path} ({e.strerror or e}); "
                         "give --log a path in a writable folder") from None
    return FileLock(str(lock_path), timeout=LOCK_TIMEOUT_S)


def _locked(path: Path) -> TunerError:
    return TunerError(f"log {path} has been locked by another process for {LOCK_TIMEOUT_S:.0f} s ({path}.lock); "
                      "if no tuner is running, delete the lock file")


def ensure_writable(path) -> Path:
    """Check before any measurement that the log (and its lock) can be written; TunerError if not, also when
    it is a directory, a FIFO or a device."""
    path = Path(path)
    _check_regular(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # under the log's lock: tuners started together on a fresh log must not unlink each other's probe
        with _lock(path):
            existed = path.exists()
            with open_regular(path, "ab"):
                pass
            if not existed and path.stat().st_size == 0:
                path.unlink(missing_ok=True)  # checked, not created: a run that fails early leaves no empty log
    except Timeout:
        raise _locked(path) from None
    except OSError as e:
        raise TunerError(f"tuning log {path} cannot be written ({e.strerror or e}); give --log a writable "
                         "path") from None
    return path


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _write(path: Path, data: bytes) -> None:
    """Append ``data`` (whole lines) to ``path`` and fsync it. A torn last line (a writer died mid-line) is
    ended first, so ours stays whole; a write that fails (a full disk) is undone, so the file never keeps
    half of ours."""
    with open_regular(path, "a+b", buffering=0) as f:
        end = f.seek(0, os.SEEK_END)
        if end > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                data = b"\n" + data
        try:
            _write_all(f.fileno(), data)
            os.fsync(f.fileno())
        except OSError:
            try:
                os.ftruncate(f.fileno(), end)
            except OSError:
                pass  # the next writer ends the torn line, the reader skips it
            raise


def side_files(path: Path) -> list:
    """Where records go when their log cannot take them: beside it, else in the temp folder."""
    name = f"{path.name}.rescued-{os.getpid()}.jsonl"
    return [path.parent / name, Path(tempfile.gettempdir()) / name]


def _rescue(path: Path, data: bytes) -> tuple[Path, int]:
    """Write ``data`` to the first side file that takes it; returns it and how many records it holds now (this
    process's rescues add up there). A side file that cannot take them is left as it was: removed if this
    write created it, so a full disk leaves no empty file behind."""
    failures = []
    for side in side_files(path):
        existed = side.exists()
        try:
            _write(side, data)
            with open_regular(side, "rb") as f:
                return side, sum(1 for line in f if line.strip())
        except (OSError, TunerError) as e:
            failures.append(f"{side} ({getattr(e, 'strerror', None) or e})")
            if not existed:
                try:
                    side.unlink(missing_ok=True)
                except OSError:
                    pass
    raise TunerError(f"cannot write tuning records to {path} nor to {' nor to '.join(failures)}; free some disk "
                     "space or give --log a writable path")


def merge_command(path: Path, side: Path) -> str:
    """The command that brings the records of ``path``'s side files in ``side``'s folder back into it."""
    pattern = side.parent / f"{path.name}.rescued-*.jsonl"
    return f"tuner logs --merge {shlex.quote(str(pattern))} -o {shlex.quote(str(path))}"


def append_records(path, records: Iterable[Record] | Record) -> Path:
    """Append one JSON line per record, durably (fsync), under an inter-process file lock (with a timeout that
    names the lock): several measuring processes may share one log. A write that keeps failing (a full disk,
    the log replaced by a folder) is retried, then the records go to a side file named in one warning with
    the command that merges them back, so a measurement is never lost; returns the file written."""
    if isinstance(records, Record):
        records = [records]
    records = list(records)
    data = "".join(r.to_json() + "\n" for r in records).encode("utf-8")
    path = Path(path)
    if not data:
        return path
    error = None
    for attempt in range(WRITE_RETRIES):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with _lock(path):
                _write(path, data)
            return path
        except Timeout:
            raise _locked(path) from None
        except (OSError, TunerError) as e:
            error = e
            time.sleep(0.05 * (attempt + 1))
    side, held = _rescue(path, data)
    n = len(records)
    warnings.warn(f"cannot write {path} ({getattr(error, 'strerror', None) or error}); {n} record{'s' * (n > 1)} "
                  f"saved in {side} instead ({held} there in all); once {path} can be written, merge them back "
                  f"with: {merge_command(path, side)}", TuningLogWarning, stacklevel=2)
    return side


# ------------------------------------------------------------------------------------------------ reading

class SkippedLines:
    """The bad lines of one log, counted by kind of problem (``InvalidRecordError.kind``): ``warn`` gives one
    warning per kind with its count and first line, so a damaged log says what is wrong with it without a
    warning per line."""

    def __init__(self, path):
        self.path, self.kinds = path, {}

    def add(self, lineno: int, error: Exception) -> None:
        kind = getattr(error, "kind", NOT_JSON)
        n, first, why = self.kinds.get(kind, (0, lineno, str(error)))
        self.kinds[kind] = (n + 1, first, why)

    @property
    def count(self) -> int:
        return sum(n for n, _, _ in self.kinds.values())

    def warn(self, stacklevel: int = 3) -> None:
        for kind, (n, first, why) in self.kinds.items():
            warnings.warn(f"tuning log {self.path}: skipped {n} bad line{'s' * (n > 1)} ({kind}), first at line "
                          f"{first}: {why}", TuningLogWarning, stacklevel=stacklevel)


def _lines(f) -> Iterator[bytes]:
    """A binary file's lines without their newline, read at most ``MAX_LINE_BYTES + 2`` bytes at a time: a
    longer line comes out cut (too long to be a record) and its rest is read and dropped piece by piece, so
    one endless line costs no more memory than a record may take."""
    while True:
        line = f.readline(MAX_LINE_BYTES + 2)
        if not line:
            return
        if line.endswith(b"\n"):
            yield line[:-1]
            continue
        rest = line
        while len(rest) > MAX_LINE_BYTES and not rest.endswith(b"\n"):
            rest = f.readline(MAX_LINE_BYTES + 2)
        yield line


def read_log(path: Path, skipped: SkippedLines) -> Iterator[Record]:
    """The valid records of one log, in order; each bad line is counted in ``skipped`` (see ``Record.from_line``
    and ``validate_record``: the one check of every reader)."""
    with open_regular(path, "rb") as f:
        for lineno, raw in enumerate(_lines(f), 1):
            if not raw.strip():
                continue
            try:
                record = Record.from_line(raw)
            except InvalidRecordError as e:
                skipped.add(lineno, e)
                continue
            yield record


def find_records(path, timestamps) -> list[Record]:
    """The valid records of the log at ``path`` whose timestamp is one of ``timestamps``, in log order (none
    when the log does not exist). Only lines that hold one of the timestamps are parsed, so finding a few
    records in a long log costs a scan of its bytes, not a check of every line."""
    stamps = {str(t) for t in timestamps if t}
    if not stamps or not Path(path).exists():
        return []
    needles = [t.encode("utf-8") for t in stamps]
    out = []
    with open_regular(path, "rb") as f:
        for raw in _lines(f):
            if not any(n in raw for n in needles):
                continue
            try:
                record = Record.from_line(raw)
            except InvalidRecordError:
                continue  # a bad line: every reader skips it
            if record.timestamp in stamps:
                out.append(record)
    return out


def _read_file(path: Path) -> Iterator[Record]:
    skipped = SkippedLines(path)
    yield from read_log(path, skipped)
    skipped.warn(stacklevel=4)


def _is_glob(p: str) -> bool:
    return any(c in p for c in "*?[")


def _named_file(p: str) -> Path:
    """A log named without a glob: it must exist and be a regular file."""
    try:
        what = _special(os.stat(p).st_mode)
    except FileNotFoundError:
        raise TunerError(f"tuning log {p}: no such file") from None
    except OSError as e:
        raise TunerError(f"tuning log {p} cannot be read ({e.strerror or e})") from None
    if what:
        raise _not_a_log(p, what)
    return Path(p)


def expand_paths(paths) -> list[Path]:
    """One path, a list of paths, or glob patterns -> existing regular files, in order, each once. A glob may
    match nothing (a fresh logs/ directory) and skips what is not a regular file; a named file must exist and
    be one (a FIFO, a device or a directory is a TunerError, never a read that blocks)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out, seen = [], set()
    for p in paths:
        p = os.fspath(p)
        if _is_glob(p):
            found = [Path(m) for m in sorted(glob.glob(p, recursive=True))
                     if not m.endswith(".lock") and os.path.isfile(m)]
        else:
            found = [_named_file(p)]
        for f in found:
            key = f.resolve()
            if key not in seen:
                seen.add(key)
                out.append(f)
    return out


def iter_records(paths) -> Iterator[Record]:
    """Records of every file in ``paths`` (see ``expand_paths``), read lazily; per file, one warning per kind
    of bad line. Paths are checked now, so a missing file fails here rather than at the first ``next``."""
    files = expand_paths(paths)
    return (record for path in files for record in _read_file(path))


def load_records(paths) -> list[Record]:
    return list(iter_records(paths))


# ------------------------------------------------------------------------------------------------ merging

@dataclass
class MergeResult:
    log: Path
    sources: list  # the files read
    added: int = 0  # records appended to the log
    present: int = 0  # records the log (or an earlier source) already held
    skipped: int = 0  # bad lines of the sources, each warned about by kind
    itself: bool = False  # a source was the log itself (left out)


def _identity(record: Record) -> bytes:
    """A record as a whole (its measurement, timestamp and costs included): two runs that measured one config
    are two records; one record read from the log and from a rescued file is one."""
    return hashlib.blake2b(record.to_json().encode("utf-8"), digest_size=16).digest()


def _check_is_log(log: Path) -> None:
    """A merge appends only to a tuning log: a new or empty file, or one whose first line is a record. An ONNX
    model, a CSV or any other file named by mistake as ``-o`` is refused untouched."""
    if not log.exists() or log.stat().st_size == 0:
        return
    with open(log, "rb") as f:
        first = f.readline(1 << 20)
    try:
        rec = json.loads(first)
        ok = isinstance(rec, dict) and "template" in rec and "config" in rec
    except (ValueError, RecursionError):
        ok = False
    if not ok:
        raise TunerError(f"{log} is not a tuning log (its first line is not a record): nothing was merged; "
                         f"give the log the side files came from as -o")


def merge_records(sources, log) -> MergeResult:
    """Append to ``log`` the valid records of ``sources`` (paths or globs, e.g. the side files of
    ``append_records``) that it does not hold yet, under the log's lock. The log's torn last line, if any, is
    ended first, so it stays one bad line and every merged record is whole; running the merge again adds
    nothing. Bad source lines are skipped with one warning per kind."""
    log = Path(log)
    _check_regular(log)
    _check_is_log(log)
    named = expand_paths(sources)
    files = [f for f in named if not (log.exists() and os.path.samefile(f, log))]
    result = MergeResult(log, files, itself=len(files) < len(named))
    if not files:
        return result  # a glob that matches nothing: the log is not touched
    incoming = []
    for path in files:
        skipped = SkippedLines(path)
        got = list(read_log(path, skipped))
        skipped.warn(stacklevel=3)
        if not got and skipped.count:  # an ONNX model, a CSV...: refused, so it is never called merged
            raise TunerError(f"{path} holds no tuning record ({skipped.count} bad line"
                             f"{'s' * (skipped.count != 1)}): it is not a tuning log; nothing was merged")
        incoming += got
        result.skipped += skipped.count
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        with _lock(log):
            have = {_identity(r) for r in _read_file(log)} if log.exists() else set()
            new = []
            for r in incoming:
                key = _identity(r)
                if key in have:
                    result.present += 1
                else:
                    have.add(key)
                    new.append(r)
            if new:
                _write(log, "".join(r.to_json() + "\n" for r in new).encode("utf-8"))
            result.added = len(new)
    except Timeout:
        raise _locked(log) from None
    except OSError as e:
        raise TunerError(f"cannot merge into {log} ({e.strerror or e}); nothing was added, the sources are "
                         "unchanged") from None
    return result
