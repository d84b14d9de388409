"""tuner: an autotuner for OpenCL convolution kernels on 2-D RGBA textures."""

__version__ = "0.1.0"

from tuner.errors import TunerError  # noqa: E402
from tuner.runtime.device import choose_device, list_devices  # noqa: E402

__all__ = ["__version__", "TunerError", "choose_device", "list_devices"]
