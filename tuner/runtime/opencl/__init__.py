"""The local OpenCL backend, through pyopencl: the one package under ``tuner/`` (with the measuring workers of
``tuner.measure``) that imports it (tests/test_imports.py).

``runtime``: ``OpenCLRuntime``, the ``tuner.runtime.base.Runtime`` of a device of this machine. ``device``: listing,
probing and opening devices (``Device``); which one a spec names is ``tuner.runtime.choice``'s rule. ``memory``:
buffers and images by scope, and recycling pools. ``program``: builds, cached in memory and as binaries on disk.
``launch``: a lowered kernel or program compiled and run (``build``, ``Executable``: the tuner's measurements).
``stream``: kernels timed back to back. ``icd`` and ``cache_folders``: the loader's and the drivers' setup,
done before the first OpenCL call; they import no pyopencl (``tuner.native`` uses ``icd`` for tuner-run).

The names below load on first use (PEP 562): importing the package, or ``icd`` alone, imports no pyopencl.
"""
from tuner.runtime import lazy_attributes

_LAZY = {
    "OpenCLRuntime": "tuner.runtime.opencl.runtime",
    "Device": "tuner.runtime.opencl.device", "choose_device": "tuner.runtime.opencl.device",
    "list_devices": "tuner.runtime.opencl.device", "open_device": "tuner.runtime.opencl.device",
    "probe_device": "tuner.runtime.opencl.device",
    "BufferPool": "tuner.runtime.opencl.memory", "DeviceArray": "tuner.runtime.opencl.memory",
    "PoolStats": "tuner.runtime.opencl.memory", "TexturePool": "tuner.runtime.opencl.memory",
    "alloc": "tuner.runtime.opencl.memory", "download": "tuner.runtime.opencl.memory",
    "upload": "tuner.runtime.opencl.memory",
    "build_program": "tuner.runtime.opencl.program", "clear_program_cache": "tuner.runtime.opencl.program",
    "Executable": "tuner.runtime.opencl.launch", "build": "tuner.runtime.opencl.launch",
}


__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = list(_LAZY)
