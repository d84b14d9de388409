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


def _cannot_write(what: str, path, problem: str) -> str:
    return f"cannot write {what} {str(path)!r}: {problem}"


def _split_destination(path, say) -> tuple:
    """``(folder, name)`` of an output path: its folder without a trailing '/' (O_NOFOLLOW applies to its own
    name), "." when it names none; a path that names no file (``DIR/``) is a TunerError."""
    import os

    from tuner.errors import TunerError
    text = os.fspath(path)
    folder, name = os.path.split(text)
    if not name or name in (".", ".."):
        raise TunerError(say("it is a directory; give a file path"))
    return (folder or "."), name


def _open_folder(folder: str, say) -> int:
    """The destination's folder opened with O_DIRECTORY|O_NOFOLLOW: a symbolic link at the folder's own name
    (another user's, planted in a shared folder) is refused, naming it; everything is then created, renamed and
    checked relative to that descriptor, so a link swapped in later never redirects the write either. Links above
    the folder are the user's own path (``/tmp`` -> ``/private/tmp``) and followed."""
    import errno
    import os
    import stat

    from tuner.errors import TunerError
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(folder, flags)
    except OSError as e:
        try:
            link = stat.S_ISLNK(os.lstat(folder).st_mode)
        except OSError:
            link = False
        if link:
            problem = (f"its folder {folder!r} is a symbolic link (to {os.readlink(folder)!r}); give the folder "
                       f"itself")
        elif e.errno == errno.ENOENT:
            problem = f"its folder {folder!r} does not exist"
        elif e.errno == errno.ENOTDIR:
            problem = f"{folder!r} is not a folder"
        else:
            problem = f"cannot open its folder {folder!r} ({e.strerror or e})"
        raise TunerError(say(problem)) from None


def _destination(dfd: int, name: str, say):
    """The lstat of ``name`` in the open folder ``dfd`` (None: no such file); a symbolic link or a directory
    there is a TunerError."""
    import os
    import stat

    from tuner.errors import TunerError
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise TunerError(say(e.strerror or str(e))) from None
    if stat.S_ISLNK(st.st_mode):
        raise TunerError(say(f"it is a symbolic link (to {os.readlink(name, dir_fd=dfd)!r}); "
                                                   f"give the path of the file itself"))
    if stat.S_ISDIR(st.st_mode):
        raise TunerError(say("it is a directory; give a file path"))
    return st


def _open_through(dfd: int, name: str, say) -> int:
    """An existing device or FIFO at ``name``, opened for writing through: non-blocking (a FIFO that no process
    reads is refused, never waited on) and without following a link, checked on the descriptor (one of another
    user than this one or root is refused: planted in a shared folder it would take the output, or stall the
    run), then made blocking for the write. Returns the descriptor."""
    import errno
    import fcntl
    import os
    import stat

    from tuner.errors import TunerError
    flags = os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dfd)
    except OSError as e:
        if e.errno == errno.ENXIO:
            raise TunerError(say("it is a FIFO (named pipe) that no process reads; start its "
                                                       "reader first, or give a file path")) from None
        raise TunerError(say(e.strerror or str(e))) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
            raise TunerError(say("it changed while it was opened; write again"))
        if st.st_uid not in (os.geteuid(), 0):
            raise TunerError(say(f"it is {file_kind(st.st_mode)} of another user (uid "
                                                       f"{st.st_uid}), not written through; give a file path"))
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_writable(path, what: str):
    """``path`` checked, before any work, to be one ``write_file`` can write, by its rules, touching nothing: its
    folder is a folder and not a symbolic link, the name is not a link or a directory, a device or FIFO there
    is this user's (or root's) and has a reader, and a new file can be created in the folder (tried, and removed
    again). A TunerError names ``what`` and the path. Returns the path as a Path."""
    import os
    import secrets
    import stat
    from pathlib import Path

    from tuner.errors import TunerError
    def say(problem: str) -> str:  # worded as tuner.cli.args.writable_file words it
        return f"{what} {str(path)!r} cannot be written ({problem}); choose another path"
    folder, name = _split_destination(path, say)
    dfd = _open_folder(folder, say)
    try:
        st = _destination(dfd, name, say)
        if st is not None and not stat.S_ISREG(st.st_mode):
            os.close(_open_through(dfd, name, say))
        else:
            probe = f".{name[:200]}.{os.getpid()}.{secrets.token_hex(4)}.check"
            try:
                os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                                 dir_fd=dfd))
                os.unlink(probe, dir_fd=dfd)
            except OSError as e:
                raise TunerError(say(e.strerror or str(e))) from None
    finally:
        os.close(dfd)
    return Path(path)


def write_file(path, write, what: str):
    """Write a file a user names through ``write(binary file object)``, never replacing what is not ours to
    replace. Its folder is opened without following a link at the folder's own name (O_DIRECTORY|O_NOFOLLOW: a
    folder that is a symbolic link is refused), and everything below happens relative to that descriptor: a
    regular file (or a new path) is written to a new temporary file beside it (O_EXCL, O_NOFOLLOW) and renamed
    over it once complete and on the disk (fsync), so a failure, a full disk or a crash leaves the old file
    whole; a device or FIFO of this user or root (``/dev/null``, a pipe) is written through, in place --
    renaming over it would break it for every other process -- opened non-blocking (a FIFO no process reads is
    refused, never waited on); a symbolic link is refused (name its target). A TunerError names ``what`` and
    the path. Returns the path as a Path. tuner-run writes its outputs by the same rules."""
    import io
    import os
    import secrets
    import stat
    from pathlib import Path

    from tuner.errors import TunerError
    def say(problem: str) -> str:
        return _cannot_write(what, path, problem)
    folder, name = _split_destination(path, say)
    buf = io.BytesIO()  # written whole first: a writer may seek (a pipe cannot), and one that writes through a
    try:  # descriptor of its own (numpy's tofile) may not see a short write or a full disk
        write(buf)
    except OSError as e:
        raise TunerError(_cannot_write(what, path, f"{e.strerror or e}; the file there is left as it was")) from None
    data = memoryview(buf.getvalue())
    dfd = _open_folder(folder, say)
    try:
        st = _destination(dfd, name, say)
        if st is not None and not stat.S_ISREG(st.st_mode):  # a device, FIFO or socket: through, never replaced
            fd = _open_through(dfd, name, say)
            try:
                while data:
                    data = data[os.write(fd, data):]
            except OSError as e:
                raise TunerError(_cannot_write(what, path, e.strerror or str(e))) from None
            finally:
                os.close(fd)
            return Path(path)
        tmp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dfd)
            try:
                while data:  # every byte written, or an OSError (a full disk: ENOSPC, a size limit: EFBIG)
                    data = data[os.write(fd, data):]
                os.fsync(fd)  # on the disk before it replaces the old file: a crash leaves one or the other
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            try:
                os.fsync(dfd)  # the rename on the disk too (best effort)
            except OSError:
                pass
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
    except OSError as e:
        raise TunerError(_cannot_write(what, path, f"{e.strerror or e}; the file there is left as it was")) from None
    finally:
        os.close(dfd)
    return Path(path)


NPY_HEADER_BYTES = 1 << 20  # what a .npy file may hold beside its data (numpy writes a header of 64 bytes or so)


_NPY_KEYS = ("descr", "fortran_order", "shape")


def _npy_header_problem(data: bytes) -> str | None:
    """What is wrong with a .npy file's header by the grammar tuner-run reads (native/src/npy.c), or None: the
    dictionary numpy writes, ``{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }``, with each of the
    three keys once and nothing else -- keys and descr plain '...' or "..." strings (no escapes, prefixes or
    concatenation), fortran_order False or True, shape a tuple of plain decimal integers (no sign, no leading
    zero, at most 18 digits; one dimension written ``(N,)``), ',' between entries and at most one after the last,
    whitespace, and nothing after the '}' (no comment). numpy's own reader (``ast.literal_eval``) takes more
    (``'<' 'f4'``, ``0x8``, ``+8``, ``True`` as a dimension, ``# ...``): a file tuner-run refuses is refused here
    too, so both runtimes read every file the same way or refuse it. (What the values mean differs where the
    docs say so: tuner run reads any numeric descr and Fortran order, tuner-run float32/float16 in C order.)"""
    if len(data) < 10 or data[:6] != b"\x93NUMPY":
        return "not a .npy header"
    major = data[6]
    if major == 1:
        size, start = int.from_bytes(data[8:10], "little"), 10
    elif major in (2, 3) and len(data) >= 12:
        size, start = int.from_bytes(data[8:12], "little"), 12
    else:
        return None  # numpy names the version it cannot read
    h = data[start:start + size]
    if len(h) < size:
        return "a truncated header"
    end, p = len(h), 0

    def ws(q):
        while q < end and h[q] in b" \t\n\r":
            q += 1
        return q

    def string(q):  # -> (text, next) of a plain quoted string, or None
        if q >= end or h[q] not in b"'\"":
            return None
        close = h.find(h[q:q + 1], q + 1)
        if close < 0:
            return None
        body = h[q + 1:close]
        if b"\\" in body or any(c < 0x20 or c == 0x7F for c in body):
            return None
        return body, close + 1

    seen = {}
    p = ws(p)
    if p >= end or h[p] != ord("{"):
        return "not a dictionary"
    p = ws(p + 1)
    while p < end and h[p] != ord("}"):
        got = string(p)
        if got is None:
            return "a key that is not a string"
        key, p = got
        name = key.decode("latin-1")
        if name not in _NPY_KEYS:
            return "a key other than 'descr', 'fortran_order' and 'shape'"
        if name in seen:
            return f"'{name}' twice"
        seen[name] = True
        p = ws(p)
        if p >= end or h[p] != ord(":"):
            return "a key without ':'"
        p = ws(p + 1)
        if name == "descr":
            got = string(p)
            if got is None:
                return "a descr that is not a plain string"
            p = got[1]
        elif name == "fortran_order":
            if h.startswith(b"False", p):
                p += 5
            elif h.startswith(b"True", p):
                p += 4
            else:
                return "a fortran_order that is not False"
        else:
            if p >= end or h[p] != ord("("):
                return "a shape that is not a tuple"
            p += 1
            dims = 0
            while True:
                p = ws(p)
                if p < end and h[p] == ord(")"):
                    break
                if dims == 8:
                    return "more than 8 dimensions"
                d0 = p
                while p < end and 0x30 <= h[p] <= 0x39 and p - d0 < 18:
                    p += 1
                digits = p - d0
                if not digits or (p < end and 0x30 <= h[p] <= 0x39) or (digits > 1 and h[d0] == 0x30):
                    return "a shape of other than integers"
                dims += 1
                p = ws(p)
                if p < end and h[p] == ord(","):
                    p += 1
                elif not (p < end and h[p] == ord(")")):
                    return "a shape of other than integers"
                elif dims == 1:
                    return "a shape '(N)' that is not a tuple (one dimension is written '(N,)')"
            p += 1
        p = ws(p)
        if p < end and h[p] == ord(","):
            p = ws(p + 1)
        elif not (p < end and h[p] == ord("}")):
            return "entries not separated by ','"
    if p >= end:
        return "an unterminated dictionary"
    if ws(p + 1) != end:
        return "bytes after the dictionary"
    if len(seen) != 3:
        return "not the keys 'descr', 'fortran_order' and 'shape'"
    return None


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
        problem = _npy_header_problem(data)  # tuner-run's grammar, before numpy's literal_eval reads more
        if problem:
            raise TunerError(f"{what} {shown!r}: its .npy header holds {problem}; save the input again with "
                             f"numpy.save")
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
