"""Reading a file a user names (a model, a config, a search space, a task list, an input array): only regular
files, opened without blocking and checked on the open descriptor, so a FIFO with no writer, ``/dev/zero`` or
a directory is a TunerError that says what the path is, never a hang. The one owner of that rule, below every
layer that reads user files."""
from __future__ import annotations

_FILE_KINDS = (("S_ISDIR", "a directory"), ("S_ISFIFO", "a FIFO (named pipe)"), ("S_ISCHR", "a character device"),
               ("S_ISBLK", "a block device"), ("S_ISSOCK", "a socket"))


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words: "a directory", "a FIFO (named pipe)", "a character device", ..."""
    import stat
    return next((what for test, what in _FILE_KINDS if getattr(stat, test)(mode)), "a special file")


def _file_problem(mode: int) -> str | None:
    import stat
    return None if stat.S_ISREG(mode) else f"it is {file_kind(mode)}, not a regular file"


def regular_file(path, what: str, hint: str = "", shown: str | None = None):
    """``path`` as a Path if it names a regular file (symbolic links followed); else a TunerError, ``cannot read
    WHAT 'PATH': no such file`` or ``...: it is a FIFO (named pipe), not a regular file`` (a FIFO or a device
    would block or never end when read), then ``; HINT``. ``shown``: the path as the message shows it."""
    import os
    from pathlib import Path

    from tuner.errors import TunerError
    try:
        problem = _file_problem(os.stat(path).st_mode)
    except OSError as e:
        problem = _os_problem(e)
    if problem:
        raise TunerError(_cannot_read(path, what, problem, hint, shown))
    return Path(path)


def read_regular_file(path, what: str, hint: str = "", shown: str | None = None) -> bytes:
    """The bytes of the regular file ``path``. Opened non-blocking and checked on the open descriptor, so a FIFO
    with no writer, ``/dev/zero`` or a directory is a TunerError naming ``what`` and the path (worded as in
    ``regular_file``), never a hang."""
    import os

    from tuner.errors import TunerError
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise TunerError(_cannot_read(path, what, _os_problem(e), hint, shown)) from None
    try:
        problem = _file_problem(os.fstat(fd).st_mode)
        if problem:
            raise TunerError(_cannot_read(path, what, problem, hint, shown))
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as e:
        raise TunerError(_cannot_read(path, what, _os_problem(e), hint, shown)) from None
    finally:
        os.close(fd)


def _os_problem(e: OSError) -> str:
    return "no such file" if isinstance(e, FileNotFoundError) else (e.strerror or str(e))


def _cannot_read(path, what: str, problem: str, hint: str, shown: str | None) -> str:
    return f"cannot read {what} {shown if shown is not None else str(path)!r}: {problem}" + (f"; {hint}" if hint else "")


def write_file(path, write, what: str):
    """Write a file a user names through ``write(binary file object)``, never replacing what is not ours to
    replace: a regular file (or a new path) is written to a temporary file beside it and renamed over it once
    complete, so a failure leaves no partial file; a device, FIFO or socket (``/dev/null``, a pipe) is written
    through, in place -- renaming over it would break it for every other process; a symbolic link is refused
    (name its target). A TunerError names ``what`` and the path. Returns the path as a Path."""
    import os
    import stat
    from pathlib import Path

    from tuner.errors import TunerError
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise TunerError(f"cannot write {what} {str(path)!r}: {e.strerror or e}") from None
    if mode is not None and stat.S_ISLNK(mode):
        raise TunerError(f"cannot write {what} {str(path)!r}: it is a symbolic link (to {os.readlink(path)!r}); "
                         f"give the path of the file itself")
    if mode is not None and stat.S_ISDIR(mode):
        raise TunerError(f"cannot write {what} {str(path)!r}: it is a directory; give a file path")
    try:
        if mode is not None and not stat.S_ISREG(mode):  # a device, FIFO or socket: through, never replaced
            import io
            buf = io.BytesIO()  # written whole first: a writer may seek, which a pipe cannot
            write(buf)
            with open(path, "wb") as fh:
                fh.write(buf.getvalue())
            return path
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
            with os.fdopen(fd, "wb") as fh:
                write(fh)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as e:
        raise TunerError(f"cannot write {what} {str(path)!r}: {e.strerror or e}") from None
    return path
