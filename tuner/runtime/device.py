"""OpenCL device discovery and selection.

Devices are listed over all pyopencl platforms in a fixed order (platform, then
device), and that order gives the indices used by `choose_device(spec)`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from dataclasses import dataclass

import pyopencl as cl

from tuner.errors import TunerError

POCL_PLATFORM = "Portable Computing Language"

_TYPE_NAMES = (
    (cl.device_type.GPU, "GPU"),
    (cl.device_type.CPU, "CPU"),
    (cl.device_type.ACCELERATOR, "ACCELERATOR"),
    (cl.device_type.CUSTOM, "CUSTOM"),
)


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


def _type_name(t: int) -> str:
    return next((name for bit, name in _TYPE_NAMES if t & bit), "OTHER")


def _get(dev: cl.Device, attr: str, default):
    # Some drivers raise for attributes they don't implement (e.g. image limits without images).
    try:
        return getattr(dev, attr)
    except (cl.Error, AttributeError):
        return default


def _half_images(dev: cl.Device) -> bool:
    try:
        ctx = cl.Context([dev])
        ok = all(
            any(f.channel_order == cl.channel_order.RGBA and f.channel_data_type == cl.channel_type.HALF_FLOAT
                for f in cl.get_supported_image_formats(ctx, flags, cl.mem_object_type.IMAGE2D))
            for flags in (cl.mem_flags.READ_ONLY, cl.mem_flags.WRITE_ONLY))
    except cl.Error:
        return False
    return ok


def _describe(index: int, dev: cl.Device) -> DeviceInfo:
    images = bool(_get(dev, "image_support", False))
    return DeviceInfo(
        index=index,
        platform=dev.platform.name.strip(),
        name=dev.name.strip(),
        type=_type_name(dev.type),
        driver_version=dev.driver_version.strip(),
        opencl_version=dev.version.strip(),
        image_support=images,
        image2d_max_width=int(_get(dev, "image2d_max_width", 0)) if images else 0,
        image2d_max_height=int(_get(dev, "image2d_max_height", 0)) if images else 0,
        max_work_group_size=int(dev.max_work_group_size),
        max_work_item_sizes=tuple(int(s) for s in dev.max_work_item_sizes),
        local_mem_bytes=int(dev.local_mem_size),
        global_mem_bytes=int(dev.global_mem_size),
        max_mem_alloc_bytes=int(dev.max_mem_alloc_size),
        compute_units=int(dev.max_compute_units),
        fp16="cl_khr_fp16" in dev.extensions.split(),
        half_images=images and _half_images(dev),
    )


@functools.cache
def _enumerate() -> tuple[tuple[DeviceInfo, cl.Device], ...]:
    # Cached: platform enumeration and the per-device probe context are slow, and the
    # set of devices does not change within a process.
    try:
        platforms = cl.get_platforms()
    except cl.Error as e:  # no ICD loader / no platforms at all
        raise TunerError(f"no OpenCL platform found ({e}); `pip install pocl-binary-distribution` "
                         "provides a CPU device") from None
    devs = []
    for p in platforms:
        try:
            devs.extend(p.get_devices())
        except cl.Error:  # a platform with no devices raises DEVICE_NOT_FOUND
            continue
    return tuple((_describe(i, d), d) for i, d in enumerate(devs))


def list_devices() -> list[DeviceInfo]:
    """All OpenCL devices over all platforms; `DeviceInfo.index` is the position in this list."""
    return [info for info, _ in _enumerate()]


def _device_table(infos: list[DeviceInfo]) -> str:
    return "\n".join(f"  [{d.index}] {d.platform} / {d.name} ({d.type})" for d in infos) or "  (none)"


def choose_device(spec: int | str | None = None) -> DeviceInfo:
    """Pick a device.

    spec None: the first GPU (not a simulator such as Oclgrind, which reports itself as a GPU), else PoCL's
    CPU device, else the first device.
    spec int or digit string: index into list_devices().
    spec other string: first device whose platform/name/type contains it (case-insensitive),
    e.g. "nvidia", "pocl", "cpu".
    """
    infos = list_devices()
    if not infos:
        raise TunerError("no OpenCL devices found; `pip install pocl-binary-distribution` provides a CPU device")
    if spec is None:
        return (next((d for d in infos if d.type == "GPU" and not d.is_simulator), None)
                or next((d for d in infos if d.platform_tag == "pocl" and d.type == "CPU"), None)
                or infos[0])
    if isinstance(spec, int) or (isinstance(spec, str) and spec.strip().isdigit()):
        i = int(spec)
        if 0 <= i < len(infos):
            return infos[i]
        raise TunerError(f"no OpenCL device with index {i}; available devices:\n{_device_table(infos)}")
    text = str(spec).strip()
    found = next((d for d in infos if text and d.matches(text)), None)
    if found is None:
        raise TunerError(f"no OpenCL device matches {spec!r}; available devices:\n{_device_table(infos)}")
    return found


class Device:
    """An opened device: pyopencl context, a profiling-enabled in-order queue, and its DeviceInfo."""

    def __init__(self, info: DeviceInfo):
        self.info = info
        self.cl_device: cl.Device = _enumerate()[info.index][1]
        self.context = cl.Context([self.cl_device])
        self.queue = cl.CommandQueue(self.context, properties=cl.command_queue_properties.PROFILING_ENABLE)

    @property
    def fingerprint(self) -> str:
        return self.info.fingerprint

    def finish(self) -> None:
        self.queue.finish()

    def __repr__(self) -> str:
        return f"Device([{self.info.index}] {self.info.platform} / {self.info.name}, {self.info.fingerprint})"


def open_device(spec: int | str | DeviceInfo | None = None) -> Device:
    """choose_device(spec) and open it; a DeviceInfo is opened as is."""
    return Device(spec if isinstance(spec, DeviceInfo) else choose_device(spec))
