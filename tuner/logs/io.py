"""JSON-lines tuning logs: append from many processes, load what survived.

Tuning runs get killed (OOM, Ctrl-C, a hung driver), so a log may end in half a line; the loader skips
such lines with a warning instead of losing the whole run, and the writer never glues a new record onto
a torn one.
"""
from __future__ import annotations

import glob
import json
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Iterable, Iterator

from filelock import FileLock, Timeout

from tuner.errors import TunerError
from tuner.logs.record import Record


class TuningLogWarning(UserWarning):
    """Lines of a tuning log were skipped (torn, corrupted or from a newer tuner)."""


LOCK_TIMEOUT_S = 60.0  # a lock held longer than this is a stuck or dead process, not a busy one
WRITE_RETRIES = 3


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
    """Check before any measurement that the log (and its lock) can be written; TunerError if not."""
    path = Path(path)
    if path.is_dir():
        raise TunerError(f"tuning log {path} is a directory; give --log a file path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # under the log's lock: tuners started together on a fresh log must not unlink each other's probe
        with _lock(path):
            existed = path.exists()
            with open(path, "ab"):
                pass
            if not existed and path.stat().st_size == 0:
                path.unlink(missing_ok=True)  # checked, not created: a run that fails early leaves no empty log
    except Timeout:
        raise _locked(path) from None
    except OSError as e:
        raise TunerError(f"tuning log {path} cannot be written ({e.strerror or e}); give --log a writable "
                         "path") from None
    return path


def _write(path: Path, data: bytes) -> None:
    with open(path, "a+b") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":  # a writer died mid-line: end its torn line, keep ours whole
                data = b"\n" + data
            f.seek(0, os.SEEK_END)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def side_files(path: Path) -> list:
    """Where records go when their log cannot take them: beside it, else in the temp folder."""
    name = f"{path.name}.rescued-{os.getpid()}.jsonl"
    return [path.parent / name, Path(tempfile.gettempdir()) / name]


def append_records(path, records: Iterable[Record] | Record) -> Path:
    """Append one JSON line per record, durably (fsync), under an inter-process file lock (with a timeout that
    names the lock): several measuring processes may share one log. A write that keeps failing (a full disk,
    the log replaced by a folder) is retried, then the records go to a side file named in one warning, so a
    measurement is never lost; returns the file written."""
    if isinstance(records, Record):
        records = [records]
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
    for rescue in side_files(path):
        try:
            _write(rescue, data)
            break
        except OSError as e:
            last = e
    else:
        raise TunerError(f"cannot write tuning records to {path} ({error}) nor to {rescue} "
                         f"({last.strerror or last})") from None
    warnings.warn(f"cannot write {path} ({getattr(error, 'strerror', None) or error}); {len(records)} records "
                  f"saved in {rescue} instead (merge it: `cat {rescue} >> {path}`)", TuningLogWarning, stacklevel=2)
    return rescue


def _is_glob(p: str) -> bool:
    return any(c in p for c in "*?[")


def expand_paths(paths) -> list[Path]:
    """One path, a list of paths, or glob patterns -> existing files, in order, each once. A glob may match
    nothing (a fresh logs/ directory); a named file must exist."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out, seen = [], set()
    for p in paths:
        p = os.fspath(p)
        if _is_glob(p):
            found = [Path(m) for m in sorted(glob.glob(p, recursive=True))
                     if not m.endswith(".lock") and os.path.isfile(m)]
        else:
            if not os.path.isfile(p):
                raise TunerError(f"tuning log {p}: " + ("is a directory" if os.path.isdir(p) else "no such file"))
            found = [Path(p)]
        for f in found:
            key = f.resolve()
            if key not in seen:
                seen.add(key)
                out.append(f)
    return out


def _read_file(path: Path) -> Iterator[Record]:
    bad, first_bad, reason = 0, None, ""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                record = Record.from_dict(json.loads(raw.decode("utf-8")))
            except (ValueError, KeyError, TypeError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                bad += 1
                if first_bad is None:
                    first_bad, reason = lineno, f"{type(e).__name__}: {e}"
                continue
            yield record
    if bad:
        warnings.warn(f"tuning log {path}: skipped {bad} bad line{'s' if bad > 1 else ''} "
                      f"(torn, corrupted, invalid values or newer schema), first at line {first_bad} ({reason})",
                      TuningLogWarning, stacklevel=2)


def iter_records(paths) -> Iterator[Record]:
    """Records of every file in ``paths`` (see ``expand_paths``), read lazily; one warning per file with bad
    lines. Paths are checked now, so a missing file fails here rather than at the first ``next``."""
    files = expand_paths(paths)
    return (record for path in files for record in _read_file(path))


def load_records(paths) -> list[Record]:
    return list(iter_records(paths))
