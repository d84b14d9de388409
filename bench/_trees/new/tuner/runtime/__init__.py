"""Runtime: OpenCL devices, memory allocation by scope, program builds.

The names below load on first use (PEP 562): importing one submodule, ``tuner.runtime.icd`` say, or the
package for ``tuner.runtime.device``'s sake, does not import all of them; the package alone, and its
``DeviceInfo`` (from ``tuner.target``), import no pyopencl.
"""

_LAZY = {
    "DeviceInfo": "tuner.target",  # plain data: no pyopencl
    "Device": "tuner.runtime.device", "choose_device": "tuner.runtime.device",
    "list_devices": "tuner.runtime.device", "open_device": "tuner.runtime.device",
    "BufferPool": "tuner.runtime.memory", "DeviceArray": "tuner.runtime.memory", "PoolStats": "tuner.runtime.memory",
    "TexturePool": "tuner.runtime.memory", "alloc": "tuner.runtime.memory", "download": "tuner.runtime.memory",
    "upload": "tuner.runtime.memory",
    "build_program": "tuner.runtime.program", "clear_program_cache": "tuner.runtime.program",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_LAZY)
