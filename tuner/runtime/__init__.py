"""Runtime: OpenCL devices, memory allocation by scope, program builds."""

from tuner.runtime.device import Device, DeviceInfo, choose_device, list_devices, open_device
from tuner.runtime.memory import BufferPool, DeviceArray, PoolStats, TexturePool, alloc, download, upload
from tuner.runtime.program import build_program, clear_program_cache

__all__ = [
    "Device", "DeviceInfo", "choose_device", "list_devices", "open_device",
    "BufferPool", "DeviceArray", "PoolStats", "TexturePool", "alloc", "download", "upload",
    "build_program", "clear_program_cache",
]
