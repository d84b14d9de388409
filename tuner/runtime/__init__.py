"""Runtime: a compiled model running on a device.

``base``: the device seam, the ``Runtime`` interface an executor asks of a device. ``module``: the executor
(``Module``, ``load_module``), which runs an artifact on any Runtime. ``choice``: which device a spec names, and
the default, over a list of profiles. None of them imports OpenCL. The local OpenCL backend, through pyopencl, is
the package ``tuner.runtime.opencl``; a device agent's runtime is ``tuner.agent``. Both depend on this package's
interface; it depends on neither, except that ``Module`` opens a local OpenCL device when given no Runtime.

The names below load on first use (PEP 562): the package alone, and its ``DeviceInfo`` (from ``tuner.target``),
import no pyopencl.
"""

_LAZY = {
    "DeviceInfo": "tuner.target",  # plain data: no pyopencl
    "Runtime": "tuner.runtime.base",
    "Module": "tuner.runtime.module", "load_module": "tuner.runtime.module",
}


def lazy_attributes(module: str, table: dict):
    """A package's module-level ``__getattr__``: ``table`` maps each name to the module that defines it, imported
    on the name's first use (so importing the package imports none of them)."""
    def __getattr__(name):
        if name in table:
            import importlib
            return getattr(importlib.import_module(table[name]), name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    return __getattr__


__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = list(_LAZY)
