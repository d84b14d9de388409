"""Device memory by scope, with physical shapes.

Scope "global" is a plain buffer of prod(physical_shape) elements. Scopes starting with
"texture" ("texture", "texture:weight", "texture:nhwc", ...) are RGBA image2d objects whose
physical shape is (height, width, 4): one row per image row, 4 channels per pixel.
"local" and "private" memory lives inside kernels and cannot be allocated from the host.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field

import numpy as np
import pyopencl as cl

from tuner.errors import TunerError
from tuner.runtime.opencl.device import Device

# pyopencl >= 2024 deprecates calling Image() directly; older releases lack create_image.
_create_image = getattr(cl, "create_image", cl.Image)
_TEXTURE_CHANNEL = {np.dtype(np.float32): cl.channel_type.FLOAT, np.dtype(np.float16): cl.channel_type.HALF_FLOAT}


def is_texture_scope(scope: str) -> bool:
    return scope.startswith("texture")


@dataclass(eq=False)
class DeviceArray:
    """A device allocation seen through its physical shape.

    For textures from a pool, `mem` may be larger than the physical shape: `alloc_shape` is
    the (height, width, 4) actually allocated. Kernels must bound their reads by the physical
    shape; CLK_ADDRESS_CLAMP borders apply at the allocated edge, not the physical one.
    """

    scope: str
    physical_shape: tuple[int, ...]
    dtype: np.dtype
    mem: cl.MemoryObject
    alloc_shape: tuple[int, ...] = field(default=())

    def __post_init__(self):
        if not self.alloc_shape:
            self.alloc_shape = self.physical_shape

    @property
    def is_texture(self) -> bool:
        return is_texture_scope(self.scope)

    @property
    def nbytes(self) -> int:
        """Bytes of the physical shape (not of the possibly larger allocation)."""
        return math.prod(self.physical_shape) * self.dtype.itemsize

    @property
    def alloc_nbytes(self) -> int:
        return math.prod(self.alloc_shape) * self.dtype.itemsize

    def __repr__(self) -> str:
        extra = f", alloc_shape={self.alloc_shape}" if self.alloc_shape != self.physical_shape else ""
        return f"DeviceArray({self.scope!r}, {self.physical_shape}, {self.dtype}{extra})"


def _shape(physical_shape) -> tuple[int, ...]:
    shape = tuple(int(s) for s in physical_shape)
    if not shape or any(s <= 0 for s in shape):
        raise TunerError(f"physical shape {shape} must be non-empty with positive extents")
    return shape


def _check_texture(device: Device, shape: tuple[int, ...], dtype: np.dtype) -> tuple[int, int]:
    """Validate a texture request against the device; returns (width, height)."""
    info = device.info
    if len(shape) != 3 or shape[2] != 4:
        raise TunerError(f"texture physical shape must be (height, width, 4) RGBA, got {shape}")
    if dtype not in _TEXTURE_CHANNEL:
        raise TunerError(f"textures hold float32 or float16, not {dtype}")
    height, width = shape[0], shape[1]
    if not info.image_support:
        raise TunerError(f"this device ({info.label}: {info.name}) has no image support: use a buffer scope")
    if dtype == np.float16 and not info.half_images:
        raise TunerError(f"this device ({info.label}) has no RGBA HALF_FLOAT image2d format: use float32")
    if width > info.image2d_max_width:
        raise TunerError(f"texture of {width} x {height} pixels exceeds this device's image2d max width "
                         f"{info.image2d_max_width} ({info.label}): use a buffer scope or a layout that "
                         f"folds more axes into rows")
    if height > info.image2d_max_height:
        raise TunerError(f"texture of {width} x {height} pixels exceeds this device's image2d max height "
                         f"{info.image2d_max_height} ({info.label}): use a buffer scope or a layout that "
                         f"folds more axes into columns")
    return width, height


def alloc(device: Device, scope: str, physical_shape, dtype) -> DeviceArray:
    """Allocate `physical_shape` of `dtype` in `scope` ("global" or "texture*")."""
    shape, dtype = _shape(physical_shape), np.dtype(dtype)
    if is_texture_scope(scope):
        width, height = _check_texture(device, shape, dtype)
        fmt = cl.ImageFormat(cl.channel_order.RGBA, _TEXTURE_CHANNEL[dtype])
        try:
            mem = _create_image(device.context, cl.mem_flags.READ_WRITE, fmt, shape=(width, height))
        except cl.Error as e:
            raise TunerError(f"cannot allocate texture of {width} x {height} {dtype} pixels: {e}") from None
    elif scope == "global":
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > device.info.max_mem_alloc_bytes:
            raise TunerError(f"buffer of {nbytes} bytes exceeds this device's max allocation "
                             f"{device.info.max_mem_alloc_bytes} bytes ({device.info.label})")
        mem = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, nbytes)
    elif scope in ("local", "private"):
        raise TunerError(f"scope {scope!r} lives inside kernels and cannot be allocated from the host")
    else:
        raise TunerError(f"unknown memory scope {scope!r}: expected 'global' or 'texture[:...]'")
    return DeviceArray(scope, shape, dtype, mem)


def _region(array: DeviceArray) -> dict:
    h, w = array.physical_shape[0], array.physical_shape[1]
    return {"origin": (0, 0), "region": (w, h)}


def upload(device: Device, array: DeviceArray, host: np.ndarray) -> None:
    """Copy `host` (exactly the physical shape; cast to the storage dtype) to the device. Blocking."""
    host = np.asarray(host)
    if tuple(host.shape) != array.physical_shape:
        raise TunerError(f"upload of shape {tuple(host.shape)} into {array!r}: shapes differ")
    data = np.ascontiguousarray(host, dtype=array.dtype)
    extra = _region(array) if array.is_texture else {}
    cl.enqueue_copy(device.queue, array.mem, data, is_blocking=True, **extra)


def download(device: Device, array: DeviceArray) -> np.ndarray:
    """Return the physical-shaped contents of `array` as a host array. Blocking."""
    out = np.empty(array.physical_shape, dtype=array.dtype)
    extra = _region(array) if array.is_texture else {}
    cl.enqueue_copy(device.queue, out, array.mem, is_blocking=True, **extra)
    return out


@dataclass
class PoolStats:
    allocations: int = 0  # new device objects created
    reuses: int = 0  # requests served from released objects
    releases: int = 0
    bytes_held: int = 0  # all device memory owned by the pool, in use or free
    bytes_free: int = 0  # of which currently released and reusable


class _Pool(abc.ABC):
    """Free-list recycling: release() keeps the object, request() reuses the smallest that fits."""

    scope = "global"

    def __init__(self, device: Device, scope: str | None = None):
        self.device = device
        self.scope = scope or self.scope
        self.stats = PoolStats()
        self._free: list[DeviceArray] = []  # released allocations (alloc_shape == physical_shape)
        self._in_use: dict[int, DeviceArray] = {}  # id(handed-out array) -> backing allocation

    @abc.abstractmethod
    def _fits(self, backing: DeviceArray, shape: tuple[int, ...], dtype: np.dtype) -> bool:
        """Can the released `backing` serve a request of `shape` and `dtype`?"""

    def _validate(self, shape: tuple[int, ...], dtype: np.dtype) -> None:
        """Raise TunerError early for requests `alloc` would reject."""

    def request(self, physical_shape, dtype) -> DeviceArray:
        shape, dtype = _shape(physical_shape), np.dtype(dtype)
        self._validate(shape, dtype)
        fits = [b for b in self._free if self._fits(b, shape, dtype)]
        if fits:
            backing = min(fits, key=lambda b: b.alloc_nbytes)
            self._free.remove(backing)
            self.stats.reuses += 1
            self.stats.bytes_free -= backing.alloc_nbytes
        else:
            backing = alloc(self.device, self.scope, shape, dtype)
            self.stats.allocations += 1
            self.stats.bytes_held += backing.alloc_nbytes
        array = DeviceArray(self.scope, shape, dtype, backing.mem, backing.alloc_shape)
        self._in_use[id(array)] = backing
        return array

    def release(self, array: DeviceArray) -> None:
        backing = self._in_use.pop(id(array), None)
        if backing is None:
            raise TunerError(f"{array!r} was not requested from this pool or was already released")
        self._free.append(backing)
        self.stats.releases += 1
        self.stats.bytes_free += backing.alloc_nbytes

    def clear(self) -> None:
        """Free all released device objects (arrays still in use are kept)."""
        for b in self._free:
            self.stats.bytes_held -= b.alloc_nbytes
            b.mem.release()
        self._free.clear()
        self.stats.bytes_free = 0

    @property
    def in_use(self) -> int:
        return len(self._in_use)


class TexturePool(_Pool):
    """Texture workspace with recycling (texture RFC T2).

    A released image serves a later request of the same dtype when both its width and height
    fit; of those, the one with the fewest bytes. The returned array has the requested physical
    shape and the reused image's `alloc_shape`.
    """

    scope = "texture"

    def __init__(self, device: Device, scope: str = "texture"):
        if not is_texture_scope(scope):
            raise TunerError(f"TexturePool needs a texture scope, not {scope!r}")
        super().__init__(device, scope)

    def _validate(self, shape, dtype):
        _check_texture(self.device, shape, dtype)

    def _fits(self, b, shape, dtype):
        return b.dtype == dtype and b.alloc_shape[0] >= shape[0] and b.alloc_shape[1] >= shape[1]


class BufferPool(_Pool):
    """1-D buffer recycling in the style of TexturePool: reuse the smallest released buffer of
    the same dtype with at least prod(physical_shape) elements."""

    scope = "global"

    def __init__(self, device: Device):
        super().__init__(device, "global")

    def _fits(self, b, shape, dtype):
        return b.dtype == dtype and math.prod(b.alloc_shape) >= math.prod(shape)
