"""User-facing errors. The CLI prints these as `error: <message>` and exits 2."""


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
