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


class FileProblem(Exception):
    """What is wrong with a file ``read_capped`` refused, in words ("it is a FIFO (named pipe), not a regular
    file", "it holds 3221225472 bytes, more than the 1048576 it may"); ``link``: it is a symbolic link."""

    def __init__(self, problem: str, link: bool = False, missing: bool = False, size: int | None = None):
        super().__init__(problem)
        self.problem, self.link, self.missing, self.size = problem, link, missing, size


def read_capped(path, max_bytes: int, *, dir_fd: int | None = None, follow: bool = True,
                size: int | None = None) -> bytes:
    """The bytes of the regular file ``path`` (relative to the open folder ``dir_fd`` when given), at most
    ``max_bytes`` of them. The file is opened once, non-blocking (a FIFO with no writer never hangs), and checked
    on that descriptor before a byte is read: a regular file (``fstat``; a FIFO, a device, a folder are refused)
    of at most ``max_bytes`` (a 3 GiB sparse file is refused, never read). ``follow=False``: a symbolic link is
    refused too (O_NOFOLLOW). ``size``: the bytes it must hold (else FileProblem with ``.size``, nothing read).
    The bytes returned are the bytes of that one open: a caller checks and uses them, never the path again.
    FileProblem says what is wrong."""
    import errno
    import os
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise FileProblem("no such file", missing=True) from None
    except OSError as e:
        if not follow and e.errno in (errno.ELOOP, errno.EMLINK):
            raise FileProblem("it is a symbolic link", link=True) from None
        if e.errno == errno.ENOTDIR:
            raise FileProblem("a folder on its path is not a folder", missing=True) from None
        raise FileProblem(e.strerror or str(e)) from None
    try:
        st = os.fstat(fd)
        problem = _file_problem(st.st_mode)
        if problem:
            raise FileProblem(problem)
        if size is not None and st.st_size != size:
            raise FileProblem(f"it holds {st.st_size} bytes, not {size}", size=st.st_size)
        if st.st_size > max_bytes:
            raise FileProblem(f"it holds {st.st_size} bytes, more than the {max_bytes} it may", size=st.st_size)
        chunks, got = [], 0
        while got <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > max_bytes:
            raise FileProblem(f"it grew past {max_bytes} bytes while it was read")
        return b"".join(chunks)
    except OSError as e:
        raise FileProblem(e.strerror or str(e)) from None
    finally:
        os.close(fd)


def read_regular_file(path, what: str, hint: str = "", shown: str | None = None, max_bytes: int = 1 << 62) -> bytes:
    """The bytes of the regular file ``path`` (``read_capped``: opened non-blocking, checked on the open
    descriptor), so a FIFO with no writer, ``/dev/zero``, a directory or a file of more than ``max_bytes`` is a
    TunerError naming ``what`` and the path (worded as in ``regular_file``), never a hang or a MemoryError."""
    from tuner.errors import TunerError
    try:
        return read_capped(path, max_bytes)
    except FileProblem as e:
        raise TunerError(_cannot_read(path, what, e.problem, hint, shown)) from None


def _os_problem(e: OSError) -> str:
    return "no such file" if isinstance(e, FileNotFoundError) else (e.strerror or str(e))


def _cannot_read(path, what: str, problem: str, hint: str, shown: str | None) -> str:
    return f"cannot read {what} {shown if shown is not None else str(path)!r}: {problem}" + (f"; {hint}" if hint else "")


def _sync_folder(folder) -> None:
    """fsync a folder, so a rename in it is on the disk (where the system allows it; best effort)."""
    import os
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_file(path, write, what: str):
    """Write a file a user names through ``write(binary file object)``, never replacing what is not ours to
    replace: a regular file (or a new path) is written to a new temporary file beside it (O_EXCL, O_NOFOLLOW)
    and renamed over it once complete and on the disk (fsync), so a failure, a full disk or a crash leaves the
    old file whole; a device, FIFO or socket (``/dev/null``, a pipe) is written through, in place -- renaming
    over it would break it for every other process; a symbolic link is refused (name its target). A TunerError
    names ``what`` and the path. Returns the path as a Path. tuner-run writes its outputs by the same rules."""
    import io
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
        buf = io.BytesIO()  # written whole first: a writer may seek (a pipe cannot), and one that writes through a
        write(buf)  # descriptor of its own (numpy's tofile) may not see a short write or a full disk
        data = memoryview(buf.getvalue())
        if mode is not None and not stat.S_ISREG(mode):  # a device, FIFO or socket: through, never replaced
            with open(path, "wb") as fh:
                fh.write(data)
            return path
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
            try:
                while data:  # every byte written, or an OSError (a full disk: ENOSPC, a size limit: EFBIG)
                    data = data[os.write(fd, data):]
                os.fsync(fd)  # on the disk before it replaces the old file: a crash leaves one or the other
            finally:
                os.close(fd)
            os.replace(tmp, path)
            _sync_folder(path.parent)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as e:
        raise TunerError(f"cannot write {what} {str(path)!r}: {e.strerror or e}; the file there is left as it "
                         f"was") from None
    return path


NPY_HEADER_BYTES = 1 << 20  # what a .npy file may hold beside its data (numpy writes a header of 64 bytes or so)


def _npy_header_keys(data: bytes) -> list | None:
    """The keys of a .npy header's dictionary, in order (repeats kept), or None where it is not one to read."""
    import ast
    if len(data) < 10 or data[:6] != b"\x93NUMPY":
        return None
    major = data[6]
    size, start = (int.from_bytes(data[8:10], "little"), 10) if major == 1 else (int.from_bytes(data[8:12], "little"), 12)
    try:
        text = data[start:start + size].decode("utf-8" if major == 3 else "latin-1")
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(tree, ast.Dict):
        return None
    return [k.value if isinstance(k, ast.Constant) else None for k in tree.keys]


def read_npy(path, what: str, shape=None, shown: str | None = None):
    """The array of the .npy file ``path`` (``what``: the option that named it, ``shown``: the path as messages
    show it). Read once (``read_regular_file``: a FIFO, a device or a file larger than an array of ``shape`` of
    any numeric type can be is refused before it is read), then checked before any allocation: a header that
    names a key twice (numpy keeps the last, tuner-run would read another: the file is refused), a shape the
    bytes do not hold, an .npz archive, bytes after the array. A TunerError says what and how to fix it."""
    import io
    import math
    import warnings

    import numpy as np

    from tuner.errors import TunerError
    shown = shown if shown is not None else str(path)
    cap = NPY_HEADER_BYTES + math.prod(shape) * 16 if shape is not None else 1 << 62
    data = read_regular_file(path, what, "give a .npy file written by numpy.save", shown, max_bytes=cap)
    f = io.BytesIO(data)
    if data[:6] == b"\x93NUMPY":  # the header's shape against the bytes the file holds, before any allocation
        keys = _npy_header_keys(data)
        twice = sorted({k for k in keys if keys.count(k) > 1}, key=str) if keys else []
        if twice:
            raise TunerError(f"{what} {shown!r}: its .npy header gives {', '.join(map(repr, twice))} twice (numpy "
                             f"reads the last, tuner-run the first: the file is not one array); save the input again "
                             f"with numpy.save")
        try:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape_, _, dtype = read(f)
        except (OSError, ValueError, EOFError) as e:
            raise TunerError(f"cannot read {what} {shown!r} as a .npy array: {e}") from None
        need = int(np.prod(shape_, dtype=object)) * dtype.itemsize
        if need > len(data) - f.tell():
            raise TunerError(f"{what} {shown!r}: its header says shape {tuple(shape_)} of {dtype} ({need} bytes), but "
                             f"the file holds {len(data) - f.tell()} bytes after the header; a damaged or truncated "
                             f"file: save the input again with numpy.save")
        f.seek(0)
    try:
        x = np.load(f, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise TunerError(f"cannot read {what} {shown!r} as a .npy array: {e}") from None
    if not isinstance(x, np.ndarray):  # a .npz archive loads as an NpzFile of several arrays
        names = ", ".join(getattr(x, "files", [])) or "none"
        raise TunerError(f"{what} {shown!r} is a .npz archive (arrays: {names}), not one .npy array; save the "
                         f"input with numpy.save (e.g. numpy.save('x.npy', numpy.load({str(path)!r})"
                         f"['{names.split(', ')[0]}']))")
    if f.tell() != len(data):  # np.load reads one array and ignores the rest: two arrays saved into one file
        raise TunerError(f"{what} {shown!r} holds {len(data) - f.tell()} bytes after its array (two arrays saved "
                         f"into one file, or a damaged one); save only the input array with numpy.save")
    if x.dtype.kind == "f" and not np.all(np.isfinite(x)):  # checked once, where the file enters; never per run
        warnings.warn(f"{what} {shown!r} holds NaN or infinite values", RuntimeWarning, stacklevel=3)
    return x
