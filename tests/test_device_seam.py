"""A device plugs in behind the seam with no edit to tuner/: a Runtime and a Runner defined here (recording
wrappers around the local OpenCL runtime) tune a layer, compile a model and run it whole."""
import numpy as np
import pytest

import tuner
from tuner.zoo.models import write_model
from tuner.logs import load_records
from tuner.errors import ErrorCode
from tuner.measure import MeasureInput, Runner
from tuner.measure.runtime_runner import RuntimeRunner
from tuner.runtime.base import Runtime
from tuner.runtime.opencl import OpenCLRuntime


class RecordingRuntime(Runtime):
    """Every call is counted by name and passed to the local OpenCL runtime."""

    def __init__(self, device):
        self.inner = OpenCLRuntime(device)
        self.info = self.inner.info
        self.calls: dict = {}

    def _do(self, name, *args, **kwargs):
        self.calls[name] = self.calls.get(name, 0) + 1
        return getattr(self.inner, name)(*args, **kwargs)

    def build(self, source, cache_dir=None, stats=None):
        return self._do("build", source, cache_dir=cache_dir, stats=stats)

    def alloc(self, scope, physical_shape, dtype):
        return self._do("alloc", scope, physical_shape, dtype)

    def view(self, pool, scope, physical_shape, dtype):
        return self._do("view", pool, scope, physical_shape, dtype)

    def upload(self, mem, host, staged=False):
        return self._do("upload", mem, host, staged=staged)

    def download(self, mem, staged=False):
        return self._do("download", mem, staged=staged)

    def prepare(self, program, kernel, args, global_size, local_size):
        return self._do("prepare", program, kernel, args, global_size, local_size)

    def submit(self, launches):
        return self._do("submit", launches)

    def finish(self):
        return self._do("finish")

    def profile(self, launches):
        return self._do("profile", launches)


class RecordingRunner(Runner):
    """A Runner of its own: the configs it was asked for, measured through the recording runtime."""

    def __init__(self, runtime):
        self.inner = RuntimeRunner(runtime)
        self.info = runtime.info
        self.asked: list = []

    def measure(self, inputs):
        self.asked.extend(inputs)
        return self.inner.measure(inputs)


@pytest.fixture(scope="module")
def runtime(device):
    return RecordingRuntime(device)


def test_tune_through_a_runner_of_the_tests(runtime, tmp_path):
    runner = RecordingRunner(runtime)
    wl = tuner.get_template("conv2d").workload((1, 8, 10, 10), (8, 8, 3, 3), padding=1)
    log = tmp_path / "seam.jsonl"
    result = tuner.tune("conv2d", wl, device=runner, trials=3, log=str(log), progress=False, sampler="random")
    recs = load_records(str(log))
    assert len(runner.asked) == result.measured == len(recs) == 3
    assert all(r.device == runtime.info.fingerprint for r in recs)
    assert any(r.ok and r.max_rel_error is not None for r in recs)  # checked against NumPy on the host
    assert runtime.calls["build"] >= 1 and runtime.calls["profile"] >= 1


@pytest.mark.parametrize("template, code", [("tests.faulty_templates:WRONG_ANSWER", ErrorCode.WRONG_ANSWER),
                                            ("tests.faulty_templates:COMPILE_ERROR", ErrorCode.COMPILE)])
def test_failures_through_the_seam_are_classified_as_locally(runtime, template, code):
    wl = tuner.get_template("conv2d").workload((1, 4, 6, 6), (4, 4, 3, 3), padding=1)
    res = RuntimeRunner(runtime).measure([MeasureInput(template, wl, tuner.get_template("conv2d").fallback(
        wl, runtime.info))])[0]
    assert res.error_code == code and not res.ok, res.error_msg


def test_compile_and_run_a_model_through_a_runtime_of_the_tests(runtime, tmp_path):
    import onnxruntime as ort
    model = write_model("mobilenet_v2", tmp_path / "m.onnx", input_size=32, num_classes=10, width=0.25)
    before = dict(runtime.calls)
    mod = tuner.compile_model(model, device=runtime, scope="texture")
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    y, = mod.run([x])
    want = ort.InferenceSession(model).run(None, {"input": x})[0]
    assert np.abs(y - want).max() <= 1e-4 * max(1.0, np.abs(want).max())
    assert runtime.calls["prepare"] - before.get("prepare", 0) >= len(mod.spec.nodes)
    assert runtime.calls["submit"] > before.get("submit", 0)
    reloaded = tuner.load_module(mod.save(tmp_path / "a"), device=runtime)
    np.testing.assert_array_equal(reloaded.run([x])[0], y)
    assert mod.profile(repeats=2)["rows"]
