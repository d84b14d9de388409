"""Optuna storages for studies: a relational database by URL (``postgresql://user:pw@host/db``,
``sqlite:///file.db``; a fresh SQLite file is created under a file lock, since two processes creating one race
on its schema), or a journal file (``journal:PATH``, Optuna's embedded default for several processes on one
machine, its appends under ``JournalFlock``). Every error names the storage (its password redacted) and what to
do."""
from __future__ import annotations

import contextlib
import re
import tempfile
import warnings
from pathlib import Path

import optuna
from filelock import FileLock, Timeout

from tuner.errors import TunerError


def redact(url: str) -> str:
    """A storage URL without its password, for messages and logs."""
    return re.sub(r"://([^:/@]+):[^@/]*@", r"://\1:***@", str(url))


def journal_path(url: str) -> str | None:
    """The file of a journal storage URL (``journal:PATH``, or a path ending in .journal or .log)."""
    if url.startswith("journal:"):
        return url[len("journal:"):].removeprefix("//")
    return url if "://" not in url and url.endswith((".journal", ".log")) else None


class JournalFlock:
    """The journal's append lock (what ``JournalFileBackend`` calls as its ``lock_obj``: acquire, release): an
    advisory lock (``flock``, through filelock) on ``PATH.flock``.

    Optuna's default lock is a symbolic link that a killed process leaves behind; the others wait out a grace of
    30 s, and two of them can each "forcibly release" it, the second removing the first one's fresh lock, which
    then fails with "did not possess lock" (a worker killed mid-append, under load). The kernel drops an advisory
    lock with its holder's process, so there is nothing to clean up and nothing to break. A stopped holder keeps
    it: after ``timeout`` seconds the waiter stops with a TunerError naming the file. For processes on one machine
    (a journal's use here): on NFS, ``flock`` holds across clients only where the mount maps it to NFS locks."""

    def __init__(self, path: str, timeout: float = 600):
        self.path, self.timeout = str(path) + ".flock", timeout
        self._lock = FileLock(self.path, timeout=timeout)

    def acquire(self) -> bool:
        try:
            self._lock.acquire()
        except Timeout:
            raise TunerError(f"storage journal: its lock {self.path} has been held by another process for "
                             f"{self.timeout:g} s; a stopped worker holds it (resume or end it)") from None
        except OSError as e:
            raise TunerError(f"storage journal: its lock file {self.path} cannot be opened ({e.strerror or e}); "
                             "make its directory writable") from None
        return True

    def release(self) -> None:
        self._lock.release()

    def __getstate__(self) -> dict:  # a storage handed to another process (as Optuna's own lock pickles): the
        # lock's path and timeout, never its holding
        return {"path": self.path[:-len(".flock")], "timeout": self.timeout}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"], state["timeout"])


def open_storage(url: str, heartbeat: int | None = 10, grace: int | None = 60):
    """An Optuna storage for ``url``; ``heartbeat`` seconds between a relational storage's trial heartbeats
    (None: no heartbeat, e.g. to export), ``grace`` seconds of silence before a trial counts as stale."""
    if not isinstance(url, str):
        return url  # already a storage
    path = journal_path(url)
    if path is not None:
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend
        if not path:
            raise TunerError("storage journal: needs a file, e.g. journal:logs/studies.journal")
        if Path(path).is_dir():
            raise TunerError(f"storage journal:{path} is a directory; give a file, e.g. journal:{path}/studies.journal")
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            with open(path, "ab"):
                pass
            return JournalStorage(JournalFileBackend(path, lock_obj=JournalFlock(path)))
        except OSError as e:
            raise TunerError(f"storage journal:{path} cannot be written ({e.strerror or e})") from None
    if "://" not in url:
        raise TunerError(f"storage {url!r}: give a database URL (postgresql://user:password@host/db, "
                         "sqlite:///file.db) or a journal file (journal:PATH)")
    import sqlalchemy.exc
    url = with_driver(url)
    kwargs = {"heartbeat_interval": int(heartbeat), "grace_period": int(grace)} if heartbeat else {}
    engine = {"pool_pre_ping": True}
    lock = contextlib.nullcontext()
    if url.startswith("sqlite:///"):
        _fast_sqlite()
        db = Path(url[len("sqlite:///"):])
        check_sqlite_directory(url, db)
        engine["connect_args"] = {"timeout": 60}  # several tuners on one file wait for each other's writes
        # two processes creating a fresh database race on its schema (alembic_version): one at a time
        lock = FileLock(str(db) + ".lock", timeout=120)
    try:
        with lock, warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(url, engine_kwargs=engine, **kwargs)
    except ImportError as e:  # e.g. no PostgreSQL driver
        raise TunerError(f"storage {redact(url)}: {e.__cause__ or e}; for PostgreSQL `pip install "
                         "psycopg2-binary` (or the pure-Python pg8000)") from None
    except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError, ValueError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TunerError(f"cannot open storage {redact(url)}: {first}") from None
    except Timeout:
        raise TunerError(f"storage {url}: its creation lock {url[len('sqlite:///'):]}.lock is held by another "
                         "process; if none is running, delete it") from None


_PRAGMAS: list = []


def _fast_sqlite() -> None:
    """Every SQLite connection of this process in WAL mode with ``synchronous=NORMAL``: a commit no longer waits
    for the disk (an ask wrote each parameter in a commit of its own, 10-20 ms each: 0.45 s a trial on a loaded
    2-core host, issue 53), and a killed tuner loses nothing committed (only a power loss can take the last
    commits, which the log, written first, still holds). Readers and one writer no longer block each other."""
    if _PRAGMAS:
        return
    import sqlite3

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    @event.listens_for(Engine, "connect")
    def _pragmas(conn, _record):
        if isinstance(conn, sqlite3.Connection):
            cur = conn.cursor()
            try:
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=NORMAL")
            except sqlite3.DatabaseError:  # a read-only database, or a file system without shared memory
                pass
            finally:
                cur.close()
    _PRAGMAS.append(_pragmas)


def check_sqlite_directory(url: str, db: Path) -> None:
    """Create the directory of SQLite database ``db`` and check that a file can be written in it, at once:
    SQLite writes its journal there and ``open_storage`` its creation lock, whose acquire would otherwise
    retry for two minutes on a directory it cannot write in (``/proc``, a read-only mount) and then blame
    the lock. TunerError naming the directory and the fix."""
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=db.parent, prefix=f".{db.name}.probe-"):
            pass
    except OSError as e:
        raise TunerError(f"storage {url}: cannot write in {db.parent} ({e.strerror or e}); give a database in "
                         "a writable directory, e.g. --storage sqlite:///logs/studies.db") from None


def with_driver(url: str) -> str:
    """``postgresql://`` with the PostgreSQL driver that is installed (SQLAlchemy assumes psycopg 3; a phone
    may have only the pure-Python pg8000)."""
    import importlib.util
    scheme, sep, rest = url.partition("://")
    if scheme in ("postgresql", "postgres"):
        for module in ("psycopg", "psycopg2", "pg8000"):
            if importlib.util.find_spec(module):
                return f"postgresql+{module}://{rest}"
    return url
