"""JSON-lines tuning logs: append from many processes, load what survived.

Tuning runs get killed (OOM, Ctrl-C, a hung driver), so a log may end in half a line; the loader skips
such lines with a warning instead of losing the whole run, and the writer never glues a new record onto
a torn one.
"""
from __future__ import annotations

import glob
import json
import os
import warnings
from pathlib import Path
from typing import Iterable, Iterator

from filelock import FileLock

from tuner.errors import TunerError
from tuner.logs.record import Record


class TuningLogWarning(UserWarning):
    """Lines of a tuning log were skipped (torn, corrupted or from a newer tuner)."""


def append_records(path, records: Iterable[Record] | Record) -> None:
    """Append one JSON line per record, durably (fsync), under an inter-process file lock: several
    measuring processes may share one log."""
    if isinstance(records, Record):
        records = [records]
    data = "".join(r.to_json() + "\n" for r in records).encode("utf-8")
    if not data:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
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
