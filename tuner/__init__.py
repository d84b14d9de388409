"""tuner: an autotuner for OpenCL convolution kernels on 2-D RGBA textures.

    import tuner
    result = tuner.tune("conv2d", wl, device="pocl", trials=64)      # an Optuna study per task
    with tuner.apply_history_best("logs/pocl-cpu-....jsonl") as h:  # the best logged config per workload
        cfg = h.pick(tuner.get_template("conv2d"), wl, device)
    tuner.tune_model("model.onnx", log="logs/dev.jsonl", trials=300)  # every kernel of a model
    module = tuner.compile_model("model.onnx", log="logs/dev.jsonl")  # -> Module; module.run([x])
"""

__version__ = "0.1.0"


def _checkout_subpackages() -> None:
    """``tuner.templates`` and ``tuner.search_space`` live in the top-level folders templates/ and
    search_space/ (pyproject's package-dir). Python run from a source checkout imports the checkout's
    tuner/ (not an installed copy), which has neither: then the checkout's root joins ``__path__``, so that
    they are found in their folders. Only when both folders are there and the subpackages are not otherwise
    importable (an editable install maps them itself)."""
    import importlib.util
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    names = ("templates", "search_space")
    if root in __path__ or not all(os.path.isfile(os.path.join(root, n, "__init__.py")) for n in names):
        return
    if all(importlib.util.find_spec(f"{__name__}.{n}") is not None for n in names):
        return
    __path__.append(root)


_checkout_subpackages()

from tuner.errors import TunerError  # noqa: E402

# Loaded on first use: the heavier layers (optuna, xgboost), and OpenCL. `import tuner` imports no pyopencl
# and registers no runtime (tuner.runtime.opencl.device does both on import), so a compile for a target profile, or
# a tool that only reads logs, runs where OpenCL is absent or broken (tests/test_imports.py).
_LAZY = {"tune": "tuner.search", "apply_history_best": "tuner.logs", "load_records": "tuner.logs",
         "get_template": "tuner.templates", "run_op": "tuner.op", "open_device": "tuner.runtime.opencl.device",
         "choose_device": "tuner.runtime.opencl.device", "list_devices": "tuner.runtime.opencl.device",
         "DeviceInfo": "tuner.target", "load_profile": "tuner.target",
         "build": "tuner.runtime.opencl.launch", "load_logs": "tuner.analysis",
         "compile_model": "tuner.compile.compiler", "load_module": "tuner.runtime.module",
         "tune_model": "tuner.scheduler.model", "run_worker": "tuner.search.worker"}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")


__all__ = ["__version__", "TunerError", *_LAZY]
