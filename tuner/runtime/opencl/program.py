"""Building OpenCL programs, with an in-memory cache and an optional on-disk binary cache.

The cache key is (source, options, device fingerprint). Programs belong to a context, so the
cache is kept per opened Device: two Devices on the same hardware never share a Program.
pyopencl's own on-disk binary cache still applies underneath.

``build_program(..., cache_dir=DIR)`` also keeps the built binary (CL_PROGRAM_BINARIES) in
``DIR/<device fingerprint>/<hash of source and options>.bin`` (the user's cache, ``tuner.artifact.cache``), so a later
process builds from it instead of compiling the source; a binary the driver rejects, or a file that does
not check out (header, length, hash, the program and device it names), is rebuilt from source and rewritten.
Folders are made 0700 and files written as new files of our own (O_EXCL, O_NOFOLLOW, 0600); nothing is read
from a folder or file that someone else can write, or through a link.

``build_together(device, sources)`` builds several one-kernel sources as one program, each kernel renamed
(``SharedProgram``): a compiler pays its fixed cost once a program (PoCL's front end parses the OpenCL C header
each time: 0.1 s of the 0.24 s a kernel of a small model takes). Only sources of the one form the code generator
writes are taken (the sampler constant, then one kernel, its name nowhere else); any other, or a batch the driver
refuses, is built alone when asked for, its own error naming its own source. A shared program has no binary of
its own: ``build_program`` and the binary caches still build and keep each source alone.

pyopencl's CompilerWarning ("Non-empty compiler output encountered") is suppressed around builds: the
build log of a failed build is in the CompileError.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import warnings
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyopencl as cl

from tuner.codegen.opencl import SAMPLER
from tuner.artifact.cache import (is_private_folder, native_device_key, private_folder, write_native_binary,
                                  write_private)
from tuner.errors import CompileError, TunerError
from tuner.runtime.opencl.device import Device

_CACHE: weakref.WeakKeyDictionary[Device, dict[tuple, cl.Program]] = weakref.WeakKeyDictionary()
_SHARED: weakref.WeakKeyDictionary[Device, dict[tuple, "SharedProgram"]] = weakref.WeakKeyDictionary()
_NAMES: weakref.WeakKeyDictionary[Device, dict[str, bool]] = weakref.WeakKeyDictionary()  # name -> a probe built it
SOURCE_LINES_IN_ERRORS = 30


def _options(options: str | Iterable[str]) -> tuple[str, ...]:
    return tuple(options.split()) if isinstance(options, str) else tuple(str(o) for o in options)


def _numbered(source: str, limit: int) -> str:
    lines = source.splitlines()
    text = "\n".join(f"{i + 1:4d}| {line}" for i, line in enumerate(lines[:limit]))
    return text + (f"\n     ... ({len(lines) - limit} more lines)" if len(lines) > limit else "")


BINARY_MAGIC = b"tuner-clbin 1\n"


def source_hash(source: str, options: str | Iterable[str] = ()) -> str:
    """The binary cache's key for a program: sha256 of its source and build options."""
    return hashlib.sha256("\0".join((source, *_options(options))).encode()).hexdigest()[:32]


def binary_path(cache_dir, fingerprint: str, source: str, options: str | Iterable[str] = ()) -> Path:
    return Path(cache_dir) / fingerprint / f"{source_hash(source, options)}.bin"


def _read_binary(path: Path, fingerprint: str, key: str) -> bytes | None:
    """The payload of a cache file, or None when it is missing, does not check out, or lies where someone else
    can write (its folder, the folder above, or the file itself: then it proves nothing)."""
    if not (is_private_folder(path.parent) and is_private_folder(path.parent.parent)):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read()
    except OSError:
        return None
    finally:
        os.close(fd)
    if not data.startswith(BINARY_MAGIC):
        return None
    header, sep, payload = data[len(BINARY_MAGIC):].partition(b"\n")
    try:
        h = json.loads(header)
    except ValueError:
        return None
    ok = (sep and isinstance(h, dict) and h.get("fingerprint") == fingerprint and h.get("source") == key
          and h.get("length") == len(payload) and h.get("sha256") == hashlib.sha256(payload).hexdigest())
    return payload if ok else None


def _write_binary(path: Path, fingerprint: str, key: str, payload: bytes) -> bool:
    """The binary under its header, written as the user's cache writes every file (``write_private``: a new file
    of our own, renamed into place; no fsync, the header's length and SHA-256 refuse a torn one); False, and no
    cache, when the folder or the one above it is not this user's alone, or nothing can be written there."""
    header = json.dumps({"fingerprint": fingerprint, "source": key, "length": len(payload),
                         "sha256": hashlib.sha256(payload).hexdigest()}).encode()
    try:
        private_folder(path.parent)
        if not is_private_folder(path.parent.parent):
            return False  # a folder someone else can change: no cache
        write_private(path, BINARY_MAGIC + header + b"\n" + payload, sync=False)
        return True
    except OSError:  # a read-only folder, or the name taken: run without the cache
        return False


def _save_binary(program: cl.Program, path: Path, fingerprint: str) -> None:
    try:
        payload = program.binaries[0]
    except cl.Error:  # a driver that does not hand out binaries: no cache, every start builds
        return
    if payload:
        _write_binary(path, fingerprint, path.stem, payload)


def _build(program: cl.Program, device: Device, opts: tuple) -> cl.Program:
    """``program`` built for ``device`` with ``opts``, the compiler's warnings unsaid (a failed build raises
    ``cl.Error``; its log is the program's)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cl.CompilerWarning)
        program.build(options=list(opts), devices=[device.cl_device])
    return program


def _from_binary(device: Device, payload: bytes, opts: tuple) -> cl.Program | None:
    try:
        return _build(cl.Program(device.context, [device.cl_device], [payload]), device, opts)
    except cl.Error:  # rejected (another driver build, a corrupt file): build from source instead
        return None


def load_binary(device: Device, source: str, payload: bytes, options: str | Iterable[str] = ()) -> cl.Program | None:
    """The program of ``source`` built from ``payload``, a binary of it that this device's driver made (another
    process's build), kept in the in-memory cache as a build of ``source`` would be; None when the driver rejects
    it. Only for binaries this process trusts as its own (a measuring worker's builder), never read from disk."""
    opts = _options(options)
    key = (source, opts, device.fingerprint)
    per_device = _CACHE.setdefault(device, {})
    if key in per_device:
        return per_device[key]
    program = _from_binary(device, payload, opts)
    if program is not None:
        per_device[key] = program
    return program


def build_program(device: Device, source: str, options: str | Iterable[str] = (), cache_dir=None,
                  stats: dict | None = None) -> cl.Program:
    """Build `source` for `device` (or return the cached build). Build failures raise CompileError.

    ``cache_dir``: keep and reuse the program binary there (see the module docstring). ``stats``: counts
    ``binary`` (built from a cached binary), ``source`` (compiled) and ``memory`` (in-memory hits)."""
    opts = _options(options)
    key = (source, opts, device.fingerprint)
    per_device = _CACHE.setdefault(device, {})
    count = (lambda k: stats.__setitem__(k, stats.get(k, 0) + 1)) if stats is not None else (lambda k: None)
    path = binary_path(cache_dir, device.fingerprint, source, opts) if cache_dir is not None else None
    if key in per_device:
        count("memory")
        if path is not None and not path.exists():
            _save_binary(per_device[key], path, device.fingerprint)
        return per_device[key]
    if path is not None:
        payload = _read_binary(path, device.fingerprint, path.stem)
        program = _from_binary(device, payload, opts) if payload is not None else None
        if program is not None:
            count("binary")
            per_device[key] = program
            return program
    program = cl.Program(device.context, source)
    try:
        _build(program, device, opts)
    except cl.Error as e:
        try:
            log = program.get_build_info(device.cl_device, cl.program_build_info.LOG).strip()
        except cl.Error:
            log = ""
        log = log or str(e)  # pyopencl's message embeds the log when it could not be queried
        raise CompileError(
            f"OpenCL build failed on {device.info.label} ({device.info.name}), options {list(opts)}:\n"
            f"{log}\n--- source ---\n{_numbered(source, SOURCE_LINES_IN_ERRORS)}",
            log=log, source=source, options=opts) from None
    count("source")
    if path is not None:
        _save_binary(program, path, device.fingerprint)
    per_device[key] = program
    return program


def clear_program_cache(device: Device | None = None) -> None:
    """Forget cached programs for `device`, or for all devices."""
    if device is None:
        _CACHE.clear()
        _SHARED.clear()
        _NAMES.clear()
    else:
        _CACHE.pop(device, None)
        _SHARED.pop(device, None)
        _NAMES.pop(device, None)


# -- several sources, one program ----------------------------------------------------------------------------
_KERNEL_HEAD = re.compile(r"__kernel\b[^{};#/]*?\bvoid\s+([A-Za-z_]\w*)\s*\([^{};#/]*\)\s*\{")


@dataclass(eq=False)
class SharedProgram:
    """One source's kernel inside a program built with others (``build_together``): ``program`` and the name the
    kernel has there (``name``: its own). ``handed_out``: a build has returned it already (``shared_program``)."""
    program: cl.Program
    name: str
    renamed: str
    handed_out: bool = False

    def kernel_name(self, name: str) -> str:
        return self.renamed if name == self.name else name


def one_kernel(source: str) -> tuple[str, str] | None:
    """``(kernel name, the source without its sampler line)`` where ``source`` is of the form the code generator
    writes -- the sampler constant (or no mention of ``sampler``), then one kernel that ends the source, its name
    nowhere else, nothing the preprocessor reads (directives, digraphs, trigraphs, line splices, ``_Pragma``) and no
    comment -- else None: such a source is safe to put in a program with others under another name
    (``build_together`` also checks that the name itself would build: a macro's name would not)."""
    if any(t in source for t in ("#", "%:", "??", "\\\n", "_Pragma", "/*", "//")):
        return None
    if source.startswith(SAMPLER):
        body = source[len(SAMPLER):].lstrip()
    elif re.search(r"\bsampler\b", source) is None:
        body = source.lstrip()
    else:
        return None  # a sampler of its own
    m = _KERNEL_HEAD.match(body)
    if m is None:
        return None
    name, rest = m.group(1), body[m.end():]
    depth = 1
    for i, ch in enumerate(rest):
        if ch in "{}":
            depth += 1 if ch == "{" else -1
            if depth == 0:
                if rest[i + 1:].strip():
                    return None  # something after the kernel
                break
    else:
        return None
    if len(re.findall(rf"\b{name}\b", body)) != 1:
        return None
    return name, body


def _names_build(device: Device, names, opts: tuple) -> set[str]:
    """Which of ``names`` build as kernel names after the sampler constant (probed once a process and device, in
    one program): a name the preprocessor or the program already owns (``CLK_ADDRESS_CLAMP``, ``sampler``) fails
    alone, and renamed it would not, hiding that source's error."""
    probed = _NAMES.setdefault(device, {})
    new = sorted(set(names) - set(probed))
    if new:
        probe = "\n".join([SAMPLER] + [f"__kernel void {n}(__global int* p) {{ }}" for n in new])
        try:
            _build(cl.Program(device.context, probe), device, opts)
            good = True
        except cl.Error:
            good = False  # one of them does not build: none of the new ones is put in a batch, now or later
        probed.update(dict.fromkeys(new, good))
    return {n for n in names if probed[n]}


def build_together(device: Device, sources, options: str | Iterable[str] = ()) -> int:
    """Build the ``sources`` that this process has not built for ``device`` as one program, each kernel renamed
    ``<name>_<i>``; ``shared_program`` then hands each out. Returns how many were built so. Sources not of the
    generator's one-kernel form (``one_kernel``), fewer than two, or a program the driver refuses: nothing is
    built here, and each is built alone when asked for (its error, if any, names its own source)."""
    opts = _options(options)
    built, shared = _CACHE.setdefault(device, {}), _SHARED.setdefault(device, {})
    todo = []
    for source in dict.fromkeys(sources):
        key = (source, opts, device.fingerprint)
        if key in built or key in shared:
            continue
        form = one_kernel(source)
        if form is not None:
            todo.append((key, *form))
    if len(todo) < 2:
        return 0
    names = _names_build(device, {name for _, name, _ in todo}, opts)
    todo = [t for t in todo if t[1] in names]
    if len(todo) < 2:
        return 0
    text = [SAMPLER] + [re.sub(rf"\b{name}\b", f"{name}_{i}", body, count=1)
                        for i, (_, name, body) in enumerate(todo)]
    try:
        program = _build(cl.Program(device.context, "\n".join(text)), device, opts)
    except cl.Error:
        return 0
    for i, (key, name, _) in enumerate(todo):
        shared[key] = SharedProgram(program, name, f"{name}_{i}")
    return len(todo)


def shared_program(device: Device, source: str, options: str | Iterable[str] = ()) -> SharedProgram | None:
    """The program ``build_together`` built ``source`` in, or None."""
    return _SHARED.get(device, {}).get((source, _options(options), device.fingerprint))


def keep_programs(device: Device, sources, binaries_dir) -> int:
    """The programs of ``sources`` on ``device``, kept in the user's binary cache ``binaries_dir`` for both
    runtimes (``tuner.artifact.cache``): this module's file and tuner-run's (``write_native_binary``), so the first
    run of an artifact builds nothing. Returns how many programs were kept. Never fails a compile: a program that
    cannot be built or a cache that cannot be written is skipped (the first run builds it)."""
    bins = Path(binaries_dir)
    info = device.info
    native = bins / native_device_key(info.platform, info.name, info.driver_version)
    kept = 0
    for source in dict.fromkeys(sources):
        try:
            program = build_program(device, source, cache_dir=bins)  # built already: kept in the Python format
            if not (native / f"{hashlib.sha256(source.encode()).hexdigest()}.bin").exists():  # else tuner-run's own
                payload = program.binaries[0]
                if not payload:
                    continue
                write_native_binary(native, source, payload)
            kept += 1
        except (OSError, cl.Error, TunerError):
            continue  # no cache for this one: the first run builds it
    return kept
