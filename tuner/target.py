"""Device profiles: what the tuner knows about one OpenCL device, as plain data.

A profile is what ``tuner devices --json --device D`` prints on a device; ``compile_model(m, target=...)``
plans and generates kernels for that device on a machine where it is not attached. So this module imports no
OpenCL: no pyopencl, no ICD registration (``tuner.runtime.opencl.device`` does both, and re-exports
:class:`DeviceInfo` from here).

A profile is input from a file: every limit is checked against the range real devices report
(:data:`LIMITS`), because the planner divides by them, indexes them and sizes allocations by them; a profile
out of range would otherwise fail with a ZeroDivisionError, or be planned into an artifact that fails on the
device. Files are read only when regular and at most :data:`PROFILE_MAX_BYTES` long, so a FIFO or
``/dev/zero`` is refused instead of read forever.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass

from tuner.errors import TunerError

POCL_PLATFORM = "Portable Computing Language"
PROFILE_HINT = "write the profile on the device with `tuner devices --json --device D > PROFILE.json`"
# A profile is a few hundred bytes; a cap keeps a wrong path (a log, an image) from being read whole.
PROFILE_MAX_BYTES = 1 << 20
DEVICE_TYPES = ("GPU", "CPU", "ACCELERATOR", "CUSTOM", "OTHER")

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40

# field -> (lowest, highest, why). The ranges are wide around what OpenCL devices report, so that every real
# device's profile passes, and narrow enough that a typo, a zero or a hostile value does not: a zero is a
# division by zero in launch planning, a huge image limit plans textures no device allocates, a tiny
# allocation limit plans buffers that fail at load time.
_IMAGE_WHY = ("OpenCL asks 2048 (embedded profile) to 16384 (2.0 full profile) of a device with images, "
              "8192-32768 is typical; 0 only with image_support false")
LIMITS = {
    "index": (0, 65535, "the device's position in `tuner devices` where the profile was written"),
    "image2d_max_width": (1, 65536, _IMAGE_WHY),
    "image2d_max_height": (1, 65536, _IMAGE_WHY),
    "max_work_group_size": (1, 65536, "work-items per work-group: 256-1024 on GPUs, up to 8192 on CPUs"),
    "max_work_item_sizes": (1, 1 << 31, "work-items per work-group along one dimension"),
    "local_mem_bytes": (KiB, GiB, "OpenCL's minimum is 32 KiB, 1 KiB for embedded devices, 0 for CUSTOM "
                                  "ones; 16 KiB-1 MiB is typical"),
    "global_mem_bytes": (MiB, 1024 * TiB, "the device's memory: a few GiB, far more than 1 MiB"),
    "max_mem_alloc_bytes": (MiB, 1024 * TiB, "the largest single buffer: OpenCL asks a quarter of global memory "
                                             "or more; it cannot exceed global_mem_bytes"),
    "compute_units": (1, 65536, "a GPU's compute units or a CPU's cores"),
}
WORK_ITEM_DIMENSIONS = 3  # OpenCL's minimum for non-custom devices; templates launch up to 3-D and index [0..2]
# str field -> (shortest, longest); the strings go into messages, file names (the fingerprint) and logs.
STRING_LIMITS = {"platform": (1, 256), "name": (1, 256), "driver_version": (0, 256), "opencl_version": (1, 256)}


@dataclass(frozen=True)
class DeviceInfo:
    """What the tuner needs to know about one OpenCL device."""

    index: int
    platform: str
    name: str
    type: str  # "GPU", "CPU", "ACCELERATOR", "CUSTOM" or "OTHER"
    driver_version: str
    opencl_version: str
    image_support: bool
    image2d_max_width: int
    image2d_max_height: int
    max_work_group_size: int
    max_work_item_sizes: tuple[int, ...]
    local_mem_bytes: int
    global_mem_bytes: int
    max_mem_alloc_bytes: int
    compute_units: int
    fp16: bool  # cl_khr_fp16: `half` arithmetic in kernels
    half_images: bool  # RGBA/HALF_FLOAT image2d readable and writable (read_imagef works without fp16)

    @property
    def platform_tag(self) -> str:
        """Short lowercase platform name: "pocl", "nvidia", "intel", ..."""
        if POCL_PLATFORM.lower() in self.platform.lower():
            return "pocl"
        words = re.findall(r"[a-z0-9]+", self.platform.lower())
        return words[0] if words else "cl"

    @property
    def is_simulator(self) -> bool:
        """Oclgrind: a checking simulator, never a default device."""
        return "oclgrind" in f"{self.platform} {self.name}".lower()

    @property
    def label(self) -> str:
        """Human label for messages, e.g. "pocl cpu"."""
        return f"{self.platform_tag} {self.type.lower()}"

    def fingerprint_fields(self) -> dict[str, str]:
        """The fields the fingerprint hashes; tuning logs store these next to it."""
        return {"platform": self.platform, "device": self.name, "driver_version": self.driver_version}

    @property
    def fingerprint(self) -> str:
        """Stable id of (platform, device, driver), e.g. "pocl-cpu-1a2b3c4d".

        Not the index: indices change when drivers are added, the fingerprint doesn't.
        """
        f = self.fingerprint_fields()
        digest = hashlib.sha1("\0".join(f[k] for k in sorted(f)).encode()).hexdigest()[:8]
        return re.sub(r"[^a-z0-9-]+", "-", f"{self.platform_tag}-{self.type.lower()}-{digest}")

    def matches(self, text: str) -> bool:
        """Case-insensitive substring match against platform, device name, type and fingerprint."""
        hay = " ".join((self.platform, self.name, self.type, self.platform_tag, self.fingerprint)).lower()
        return text.lower() in hay

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["max_work_item_sizes"] = list(self.max_work_item_sizes)
        d["fingerprint"] = self.fingerprint
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "DeviceInfo":
        """The inverse of to_dict (a device profile written by `tuner devices --json`); extra keys are
        ignored, a missing, mistyped or implausible field raises TunerError naming it (:func:`check_profile`),
        and so does a ``fingerprint`` that its fields do not give (an edited file)."""
        if not isinstance(d, dict):
            raise TunerError(f"a device profile is a JSON object, got {type(d).__name__}; {PROFILE_HINT}")
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.name not in d:
                raise TunerError(f"device profile lacks {f.name!r}; {PROFILE_HINT}")
            kwargs[f.name] = _typed(f.name, str(f.type), d[f.name])
        info = cls(**kwargs)
        check_profile(info)
        if "fingerprint" in d and d["fingerprint"] != info.fingerprint:
            raise TunerError(f"device profile fingerprint {_show(d['fingerprint'])} does not match its fields "
                             f"({info.fingerprint}); was the file edited? {PROFILE_HINT}")
        return info


def _show(value) -> str:
    """A value as it goes into a message: its repr, cut short (a hostile profile may hold megabytes)."""
    try:
        text = repr(value)
    except ValueError:  # an int of more than sys.get_int_max_str_digits() digits
        return "a number too long to print" if isinstance(value, int) else "a value too long to print"
    return text if len(text) <= 80 else text[:77] + "..."


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # JSON true is not the integer 1


def _typed(name: str, kind: str, v):
    """``v`` as field ``name`` of declared type ``kind`` holds it, or TunerError naming both."""
    if name == "max_work_item_sizes":
        if not isinstance(v, list) or not all(_is_int(x) for x in v):
            raise TunerError(f"device profile field 'max_work_item_sizes' must be a list of integers, got {_show(v)}; "
                             f"{PROFILE_HINT}")
        return tuple(v)
    want = {"int": int, "str": str, "bool": bool}.get(kind)
    if want is not None and (not isinstance(v, want) or (want is int and isinstance(v, bool))):
        raise TunerError(f"device profile field {name!r} must be {want.__name__}, got {_show(v)}; {PROFILE_HINT}")
    return v


def _out_of_range(name: str, value, low: int, high: int, why: str, shown=None) -> TunerError:
    return TunerError(f"device profile field {name!r} is {shown or _show(value)}; it must be {low:,}..{high:,} "
                      f"({why}); {PROFILE_HINT}")


def _check_limit(name: str, value: int, low: int | None = None) -> None:
    lo, hi, why = LIMITS[name]
    lo = lo if low is None else low
    if not lo <= value <= hi:
        raise _out_of_range(name, value, lo, hi, why)


def _check_strings(info: DeviceInfo) -> None:
    for name, (lo, hi) in STRING_LIMITS.items():
        v = getattr(info, name)
        if not lo <= len(v) <= hi or not v.isprintable():
            raise TunerError(f"device profile field {name!r} is {_show(v)}: it must be {lo}..{hi} printable "
                             f"characters; {PROFILE_HINT}")
    if info.type not in DEVICE_TYPES:
        raise TunerError(f"device profile field 'type' is {_show(info.type)}: it must be one of "
                         f"{', '.join(DEVICE_TYPES)}; {PROFILE_HINT}")


def _check_work_items(info: DeviceInfo) -> None:
    sizes = info.max_work_item_sizes
    if len(sizes) != WORK_ITEM_DIMENSIONS:
        raise TunerError(f"device profile field 'max_work_item_sizes' is {_show(list(sizes))}: it must list "
                         f"{WORK_ITEM_DIMENSIONS} sizes, one per dimension (OpenCL devices have at least 3); "
                         f"{PROFILE_HINT}")
    lo, hi, why = LIMITS["max_work_item_sizes"]
    for i, s in enumerate(sizes):
        if not lo <= s <= hi:
            raise _out_of_range("max_work_item_sizes", s, lo, hi, why, shown=f"{_show(list(sizes))} ([{i}] = {_show(s)})")


def check_profile(info: DeviceInfo) -> None:
    """TunerError naming the first field of ``info`` outside :data:`LIMITS` (or an inconsistent pair: images
    limits without images, an allocation larger than the memory), its value and how to get a right one.

    Checked for profiles (files, dicts, DeviceInfo targets), not for the devices ``tuner.runtime.opencl.device``
    lists: what the driver reports there is what the device is."""
    _check_strings(info)
    _check_limit("index", info.index)
    for name in ("image2d_max_width", "image2d_max_height"):
        _check_limit(name, getattr(info, name), low=None if info.image_support else 0)
    if info.half_images and not info.image_support:
        raise TunerError(f"device profile field 'half_images' is true but 'image_support' is false; {PROFILE_HINT}")
    _check_limit("max_work_group_size", info.max_work_group_size)
    _check_work_items(info)
    _check_limit("local_mem_bytes", info.local_mem_bytes, low=0 if info.type == "CUSTOM" else None)
    _check_limit("global_mem_bytes", info.global_mem_bytes)
    _check_limit("max_mem_alloc_bytes", info.max_mem_alloc_bytes)
    if info.max_mem_alloc_bytes > info.global_mem_bytes:
        raise TunerError(f"device profile field 'max_mem_alloc_bytes' is {info.max_mem_alloc_bytes:,}, more than "
                         f"'global_mem_bytes' ({info.global_mem_bytes:,}): one buffer cannot exceed the device's "
                         f"memory; {PROFILE_HINT}")
    _check_limit("compute_units", info.compute_units)


_FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((what for test, what in _FILE_KINDS if test(mode)), "a special file")


def read_profile_file(path) -> object:
    """The JSON value of the profile file ``path``: a regular file of at most PROFILE_MAX_BYTES.

    Opened non-blocking and checked on the open descriptor (not by name first, which a swap could race), so
    a FIFO with no writer, ``/dev/zero`` or a directory is a TunerError naming the path, never a hang."""
    where = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise TunerError(f"cannot read the target profile {where!r}: {e.strerror or e}; {PROFILE_HINT}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise TunerError(f"target profile {where!r} is {_kind(mode)}, not a regular file; {PROFILE_HINT}")
        data = _read_at_most(fd, PROFILE_MAX_BYTES + 1)
    except OSError as e:
        raise TunerError(f"cannot read the target profile {where!r}: {e.strerror or e}; {PROFILE_HINT}") from None
    finally:
        os.close(fd)
    if len(data) > PROFILE_MAX_BYTES:
        raise TunerError(f"target profile {where!r} is larger than {PROFILE_MAX_BYTES // MiB} MiB; a device profile "
                         f"is a few hundred bytes: is it the right file? {PROFILE_HINT}")
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError; deep nesting recurses
        raise TunerError(f"target profile {where!r} is not JSON ({_first_line(e)}); {PROFILE_HINT}") from None


def _read_at_most(fd: int, n: int) -> bytes:
    """Up to ``n`` bytes of ``fd``, fewer only at its end."""
    chunks, left = [], n
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:200]


def load_profile(target) -> DeviceInfo:
    """A device profile -> DeviceInfo: a DeviceInfo, a dict (``DeviceInfo.to_dict()``), or the path of the
    JSON file ``tuner devices --json --device D`` writes on that device. Each is checked (:func:`check_profile`);
    an error from a file names the file."""
    if isinstance(target, DeviceInfo):
        check_profile(target)
        return target
    if isinstance(target, (str, os.PathLike)):
        d = read_profile_file(target)
        if isinstance(d, list):
            raise TunerError(f"target profile {str(target)!r} lists {len(d)} devices; write one with "
                             f"`tuner devices --json --device D`")
        try:
            return DeviceInfo.from_dict(d)
        except TunerError as e:
            raise TunerError(f"target profile {str(target)!r}: {e}") from None
    if isinstance(target, dict):
        return DeviceInfo.from_dict(target)
    raise TunerError(f"target: a DeviceInfo, a profile dict or a profile JSON path, got {type(target).__name__}")
