"""The GPU clock and the temperature of a device, read from sysfs (Linux, Android).

A phone's clock and heat move during a long tune: a GPU that throttles runs every kernel slower, and a tuner
that does not notice ranks configs by when they were measured. Each measurement therefore carries a
``Reading`` of both, where the device exposes them (``MeasureResult.gpu_clock_hz`` and ``temp_c``, then the
log's records), and ``tuner.measure.drift.DriftGuard`` watches them.

Nodes read, under a root folder (``/`` by default; ``$TUNER_SYSFS_ROOT`` or the ``root`` argument point it at a
copy, as the tests do), the first that gives a value:

- the GPU clock in Hz: Adreno's ``sys/class/kgsl/kgsl-3d0/gpuclk``, then ``sys/class/kgsl/kgsl-3d0/devfreq/
  cur_freq``; Mali's ``sys/class/misc/mali0/device/devfreq/*/cur_freq``; any devfreq device named like a GPU,
  ``sys/class/devfreq/*gpu*/cur_freq`` (names compared without case);
- the temperature in degrees C: the highest of ``sys/class/thermal/thermal_zone*/temp`` (millidegrees), over
  the zones whose ``type`` names a GPU when any of those reads, else over every zone.

The device agent (native/src/agent.c, ``--sysfs-root DIR``) reads the same nodes in the same order on the
device and reports them with ``SENSORS`` (docs/agent-protocol.md). Every read is bounded: a file is opened
non-blocking, must be a regular file (a FIFO planted in a copied tree never blocks the tuner), and at most
``MAX_READ`` bytes are read. A node that is absent, unreadable, or holds anything but a number in range is
None, never an exception: ``read()`` is called once per measurement and must not stop a tune.
"""
from __future__ import annotations

import errno
import math
import os
import stat
from dataclasses import dataclass

MAX_READ = 256  # bytes read from one node (they hold a number and a newline)
MAX_ENTRIES = 256  # entries of a folder looked at (thermal zones, devfreq devices)
CLOCK_MAX_HZ = 10 ** 11  # a clock above 100 GHz is garbage, not a GPU
TEMP_MIN_C, TEMP_MAX_C = -60.0, 200.0  # a zone outside this range is broken (some report -273 or 6553.5)
ENV = "TUNER_SYSFS_ROOT"

KGSL = ("sys/class/kgsl/kgsl-3d0/gpuclk", "sys/class/kgsl/kgsl-3d0/devfreq/cur_freq")
MALI_DEVFREQ = "sys/class/misc/mali0/device/devfreq"
DEVFREQ = "sys/class/devfreq"
THERMAL = "sys/class/thermal"


@dataclass(frozen=True)
class Reading:
    """The device's GPU clock (Hz) and temperature (degrees C) at one moment; None where the device does not
    expose one or it could not be read. ``source``: the nodes the values came from (for messages)."""
    gpu_clock_hz: int | None = None
    temp_c: float | None = None
    source: str = ""

    @property
    def empty(self) -> bool:
        return self.gpu_clock_hz is None and self.temp_c is None

    def describe(self) -> str:
        """``"clock 585 MHz, 41.2 C"``; ``"no sensors"`` when both are None."""
        parts = []
        if self.gpu_clock_hz is not None:
            parts.append(f"clock {self.gpu_clock_hz / 1e6:.0f} MHz")
        if self.temp_c is not None:
            parts.append(f"{self.temp_c:.1f} C")
        return ", ".join(parts) or "no sensors"


def root_dir(root=None) -> str:
    """The sysfs root: ``root`` when given, else ``$TUNER_SYSFS_ROOT``, else ``/``."""
    if root is not None:
        return os.fspath(root)
    return os.environ.get(ENV) or "/"


def read_node(path: str) -> bytes | None:
    """At most ``MAX_READ`` bytes of the regular file ``path``; None when it is absent, not a regular file,
    unreadable, longer than that (a node holds a number) or holding a NUL byte (the agent reads nodes as C
    strings). Never blocks: opened with ``O_NONBLOCK`` and checked on the descriptor."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except (OSError, ValueError):  # ValueError: a NUL in the path
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = b""
        while len(data) <= MAX_READ:
            try:
                chunk = os.read(fd, MAX_READ + 1 - len(data))
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                return None  # EAGAIN, EIO, EINVAL: a zone that is off, a driver that refuses
            if not chunk:
                break
            data += chunk
        return data if len(data) <= MAX_READ and b"\0" not in data else None
    finally:
        os.close(fd)


def _integer(data: bytes | None) -> int | None:
    """A decimal integer (an optional sign, 1 to 18 digits, ASCII whitespace around), else None."""
    if data is None:
        return None
    text = data.strip()
    body = text[1:] if text[:1] in (b"-", b"+") else text
    if not body or len(body) > 18 or not body.isdigit():
        return None
    return int(text)


def parse_clock(data: bytes | None) -> int | None:
    """A node's clock in Hz: a positive integer up to ``CLOCK_MAX_HZ``, else None."""
    v = _integer(data)
    return v if v is not None and 0 < v <= CLOCK_MAX_HZ else None


def parse_temp(data: bytes | None) -> float | None:
    """A thermal zone's ``temp`` (millidegrees C) in degrees C, within ``TEMP_MIN_C``..``TEMP_MAX_C``, else None."""
    v = _integer(data)
    if v is None:
        return None
    c = v / 1000.0
    return c if math.isfinite(c) and TEMP_MIN_C <= c <= TEMP_MAX_C else None


def _entries(folder: str, match=None) -> list:
    """Names in ``folder`` for which ``match(name)`` holds, sorted by their bytes (as the agent sorts them), the
    first ``MAX_ENTRIES``."""
    try:
        with os.scandir(folder) as it:
            names, seen = [], 0
            for e in it:  # the first 4 x MAX_ENTRIES names, hidden ones aside (the agent stops there too)
                if e.name.startswith("."):
                    continue
                if seen >= MAX_ENTRIES * 4:
                    break
                seen += 1
                if match is None or match(e.name):
                    names.append(e.name)
    except (OSError, ValueError):
        return []
    return sorted(names, key=os.fsencode)[:MAX_ENTRIES]


def read_clock(root=None) -> tuple:
    """``(Hz or None, the node's path relative to the root or "")``."""
    base = root_dir(root)
    candidates = list(KGSL)
    mali = os.path.join(base, MALI_DEVFREQ)
    candidates += [f"{MALI_DEVFREQ}/{n}/cur_freq" for n in _entries(mali)]
    candidates += [f"{DEVFREQ}/{n}/cur_freq" for n in _entries(os.path.join(base, DEVFREQ),
                                                                  lambda n: b"gpu" in os.fsencode(n).lower())]
    for rel in candidates:
        v = parse_clock(read_node(os.path.join(base, rel)))
        if v is not None:
            return v, rel
    return None, ""


def read_temp(root=None) -> tuple:
    """``(degrees C or None, which zones)``: the highest GPU zone, else the highest zone."""
    base = root_dir(root)
    folder = os.path.join(base, THERMAL)
    gpu, other = [], []
    for name in _entries(folder, lambda n: n.startswith("thermal_zone") and n[12:].isascii() and n[12:].isdigit()):
        t = parse_temp(read_node(os.path.join(folder, name, "temp")))
        if t is None:
            continue
        kind = read_node(os.path.join(folder, name, "type")) or b""
        (gpu if b"gpu" in kind.lower() else other).append((t, name))
    zones = gpu or other
    if not zones:
        return None, ""
    t, name = max(zones)
    return t, f"{THERMAL}/{name}/temp" + (" (gpu)" if gpu else "")


def read(root=None) -> Reading:
    """The device's ``Reading`` from the sysfs under ``root`` (``root_dir``). Never raises."""
    try:
        clock, where_clock = read_clock(root)
        temp, where_temp = read_temp(root)
    except Exception:  # noqa: BLE001 - a reading is best effort; a tune never stops on it
        return Reading()
    return Reading(clock, temp, "; ".join(w for w in (where_clock, where_temp) if w))
