"""Building OpenCL programs, with an in-memory cache.

The cache key is (source, options, device fingerprint). Programs belong to a context, so the
cache is kept per opened Device: two Devices on the same hardware never share a Program.
pyopencl's own on-disk binary cache still applies underneath.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import pyopencl as cl

from tuner.errors import CompileError
from tuner.runtime.device import Device

_CACHE: weakref.WeakKeyDictionary[Device, dict[tuple, cl.Program]] = weakref.WeakKeyDictionary()
SOURCE_LINES_IN_ERRORS = 30


def _options(options: str | Iterable[str]) -> tuple[str, ...]:
    return tuple(options.split()) if isinstance(options, str) else tuple(str(o) for o in options)


def _numbered(source: str, limit: int) -> str:
    lines = source.splitlines()
    text = "\n".join(f"{i + 1:4d}| {line}" for i, line in enumerate(lines[:limit]))
    return text + (f"\n     ... ({len(lines) - limit} more lines)" if len(lines) > limit else "")


def build_program(device: Device, source: str, options: str | Iterable[str] = ()) -> cl.Program:
    """Build `source` for `device` (or return the cached build). Build failures raise CompileError."""
    opts = _options(options)
    key = (source, opts, device.fingerprint)
    per_device = _CACHE.setdefault(device, {})
    if key in per_device:
        return per_device[key]
    program = cl.Program(device.context, source)
    try:
        program.build(options=list(opts), devices=[device.cl_device])
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
    per_device[key] = program
    return program


def clear_program_cache(device: Device | None = None) -> None:
    """Forget cached programs for `device`, or for all devices."""
    if device is None:
        _CACHE.clear()
    else:
        _CACHE.pop(device, None)
