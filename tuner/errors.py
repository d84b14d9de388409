"""User-facing errors. The CLI prints these as `error: <message>` and exits 2."""

from enum import IntEnum


class TunerError(Exception):
    """An error the user can act on (bad device spec, limit exceeded, ...)."""


class CompileError(TunerError):
    """An OpenCL program failed to build; carries the build log and the source."""

    def __init__(self, message: str, log: str = "", source: str = "", options: tuple[str, ...] = ()):
        super().__init__(message)
        self.log, self.source, self.options = log, source, options


class LoweringError(TunerError):
    """A kernel cannot be lowered as written: a texture layout without a 4-lane innermost axis, an image
    both read and written by one kernel, ..."""


class DeviceError(TunerError):
    """The device refused or failed a request: an allocation, a copy, a build, a launch, a wait. ``launch``: the
    launch handle (``Runtime.prepare``'s) it concerns, where the runtime can tell; an executor that knows what the
    launch runs names it (``tuner.runtime.module``: the node, its kernel file, the global and local sizes)."""

    def __init__(self, message: str, launch=None):
        super().__init__(message)
        self.launch = launch


class ErrorCode(IntEnum):
    """Why a measurement failed (0: it did not). Stored in every record as ``error_code`` and ``error_name``."""
    NO_ERROR = 0
    INSTANTIATION = 1  # the config is not valid for the workload or the device (search-space constraint, template)
    COMPILE = 2  # lowering or the OpenCL compiler rejected the kernel
    RUNTIME = 3  # the OpenCL runtime failed to launch or run it (e.g. work-group size, resources)
    WRONG_ANSWER = 4  # output differs from the NumPy reference beyond tolerance
    BUILD_TIMEOUT = 5
    RUN_TIMEOUT = 6
    UNKNOWN = 7  # anything else, e.g. the measuring process died


class DeviceCrashed(TunerError):
    """The process that ran a request on the device died (a crash in a kernel or the driver); a runtime that
    isolates its device (the device agent) restarted it."""
