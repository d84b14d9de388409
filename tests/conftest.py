import ast
import functools
import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

from tuner.runtime.opencl import open_device


# TUNER_TEST_DEVICE (a --device spec, e.g. ``nvidia`` on a GPU machine, ``intel`` for Intel's CPU runtime)
# picks the device of every test: the fixture below, and through $TUNER_DEVICE the API's and the CLI's default
# (subprocesses included). Unset, the tests run on the default device, which `tuner devices` stars.
if os.environ.get("TUNER_TEST_DEVICE"):
    os.environ["TUNER_DEVICE"] = os.environ["TUNER_TEST_DEVICE"]

# PoCL builds each kernel's work-group function at its first launch, by default once per local size, global
# offset and grid size it specializes on; barrier-heavy kernels (a norm's statistics in a convolution's epilogue, a
# gate in a depthwise convolution's last work-group) take seconds each. The suite asks for one generic function a
# local size (subprocesses and tuner-run included): the same kernels, checked the same, built about 2.5x faster
# (test_norms_are_computed_by_the_convolutions_that_write_them[groups2-buffer]: 48 -> 18 s from a cold cache).
os.environ.setdefault("POCL_WORK_GROUP_SPECIALIZATION", "0")
# PoCL's LLVM optimizes each kernel before it builds the work-group function. The suite's PoCL builds skip that
# (-cl-opt-disable): the same sources, checked the same, built in about half the time (tests/test_reductions.py from a
# cold cache on 2 cores: 30 -> 16 s; the whole suite 23.6-25.7 -> 19.2 min). Optimized builds are still checked:
# ``check_random_configs``'s child (below) and the native programs (``cl_env``) build with PoCL's optimizer on.
os.environ.setdefault("POCL_EXTRA_BUILD_FLAGS", "-cl-opt-disable")
# The templates' kernels with barriers inside loops (se_gate's pool, squeeze and excite; a depthwise convolution
# that computes its gate) are the opposite: their generic function takes PoCL about 3 s, one specialized to the
# local size about 0.3 s. ``check_random_configs`` builds and checks those in a child process of its own that
# specializes.
_SPECIALIZED_CHILD = """
import ast, sys
sys.path.insert(0, sys.argv[1])
from test_templates import check_random_configs_here
from tuner.runtime.opencl import open_device
dev = open_device(sys.argv[2])  # the parent's device, by its fingerprint
if dev.info.fingerprint != sys.argv[2]:
    sys.exit(f"opened {dev.info.fingerprint}, not the parent's {sys.argv[2]}")
check_random_configs_here(dev, ast.literal_eval(sys.stdin.read()))
"""


def check_random_configs(device, checks) -> None:
    """``test_templates.check_random_configs_here(device, checks)``: ``check_random_config`` for each ``(name,
    fields, dtype, seed, fixed)`` of ``checks`` (literals only). On PoCL they run in one child process whose PoCL
    optimizes and builds work-group functions specialized to the local size (the same kernels, checked the same;
    see above); a failure fails the test with the child's output. Elsewhere they run here."""
    import subprocess
    import sys
    checks = list(checks)
    if device.info.platform_tag != "pocl":
        from test_templates import check_random_configs_here
        check_random_configs_here(device, checks)
        return
    payload = repr(checks)
    assert ast.literal_eval(payload) == checks, "check_random_configs takes literals only (they cross to a child)"
    env = {**os.environ, "POCL_WORK_GROUP_SPECIALIZATION": "1", "POCL_EXTRA_BUILD_FLAGS": ""}
    r = subprocess.run([sys.executable, "-c", _SPECIALIZED_CHILD, str(Path(__file__).parent),
                        device.info.fingerprint], input=payload, capture_output=True, text=True, env=env, timeout=1800)
    assert r.returncode == 0, f"child exit {r.returncode}\n" + r.stdout[-4000:] + r.stderr[-8000:]


# Program binaries, profiles and plan timings go to the user's cache (tuner.artifact.cache): the tests keep theirs
# in a folder of this process's own ($TUNER_CACHE_DIR, subprocesses included), so a run neither fills
# ~/.cache/tuner nor finds a previous run's binaries. A test that counts builds sets a cache of its own.
os.environ["TUNER_CACHE_DIR"] = _TEST_CACHE = __import__("tempfile").mkdtemp(prefix="tuner-test-cache-")
__import__("atexit").register(__import__("shutil").rmtree, _TEST_CACHE, True)


@pytest.fixture(scope="session")
def device():
    """The device under test (see above); every kernel test runs real OpenCL on it."""
    return open_device(os.environ.get("TUNER_TEST_DEVICE") or None)


@pytest.fixture(scope="session")
def fp16_device():
    """A device with cl_khr_fp16 for half arithmetic ($TUNER_TEST_FP16_DEVICE, default Intel's CPU runtime);
    the test is skipped, with the reason, where there is none."""
    want = os.environ.get("TUNER_TEST_FP16_DEVICE", "intel")
    try:
        dev = open_device(want)
    except Exception as e:  # noqa: BLE001 - any failure to open means: no such device here
        pytest.skip(f"no cl_khr_fp16 device: cannot open {want!r} ({e})")
    if not dev.info.fp16:
        pytest.skip(f"{dev.info.name} does not report cl_khr_fp16: half arithmetic is not testable")
    return dev


def profile(**changes):
    """A checked device profile (``tuner.target.load_profile``) for tests that plan, pick configs or tune without a
    device: a large GPU by default (132 compute units, images, 48 KiB of local memory), ``changes`` over it."""
    from tuner.target import load_profile
    base = {"index": 0, "platform": "P", "name": "GPU", "type": "GPU", "driver_version": "1",
            "opencl_version": "OpenCL 3.0", "image_support": True, "image2d_max_width": 65536,
            "image2d_max_height": 65536, "max_work_group_size": 1024, "max_work_item_sizes": [1024, 1024, 64],
            "local_mem_bytes": 49152, "global_mem_bytes": 80 << 30, "max_mem_alloc_bytes": 20 << 30,
            "compute_units": 132, "fp16": True, "half_images": True}
    return load_profile({**base, **changes})


@functools.cache
def building_cpu(*prefer: str) -> str:
    """The first device spec of ``prefer`` (default: PoCL, then Intel's CPU runtime) that builds OpenCL programs
    here. PoCL 3.0's LLVM 14 does not know every CPU (on AMD Zen 5 it cannot build: `tuner devices` says why),
    so a test that wants a second CPU runtime beside the default device names it through this."""
    from tuner.runtime.opencl.device import choose_device, probe_device
    for spec in prefer or ("pocl", "intel"):
        try:
            if probe_device(choose_device(spec, check=False)) is None:
                return spec
        except Exception:  # noqa: BLE001 - not installed here: try the next
            continue
    names = ", ".join(prefer or ("pocl", "intel"))
    # also asked at a test module's import (test_native_runtime.CPU): a skip of the module there
    pytest.skip(f"none of {names} builds OpenCL programs here (`tuner devices` says why)", allow_module_level=True)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture(scope="session")
def native():
    """The native programs (native/: tuner-run, tuner-agent and their ASan builds), built once per session.
    Under pytest-xdist every worker asks; a file lock keeps two `make`s out of build/native at once."""
    from filelock import FileLock

    from tuner.native import BUILD, build
    BUILD.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(BUILD.parent / "native-build.lock")):
        return build()


@pytest.fixture(scope="session")
def cl_env():
    """The environment a native program needs to find OpenCL here; the device is chosen by the test."""
    from tuner.native import opencl_env
    env = opencl_env()
    env.pop("TUNER_DEVICE", None)
    # optimized builds (see the top): and PoCL 3.0 leaks the options string it appends extra flags to, which
    # LeakSanitizer reports in the ASan builds
    env.pop("POCL_EXTRA_BUILD_FLAGS", None)
    return env


# ------------------------------------------------------------------------------------------ running in parallel
# `make test` runs the suite with pytest-xdist (`-n auto --dist loadgroup`, see the Makefile): each test goes to
# whichever worker process is free, except tests of one xdist_group, which run one after another in one worker.
# A test must therefore not depend on another test's state, nor on being alone on the machine: files in
# tmp_path, free ports (port 0), processes found by their parent (not by name), caches in ~/.cache that are
# safe to share (PoCL's, pyopencl's and tuner's own write atomically).
#
# A file whose module-scoped fixtures are expensive (compiled artifacts, a tuning run, a browser) groups its
# tests, ``pytestmark = pytest.mark.xdist_group("name")``, so that one worker builds them instead of every one.


def pytest_collection_modifyitems(config, items):
    """The slow end-to-end tests first: with tests handed to workers in collection order, a minute-long test
    that starts last leaves the other worker idle at the end (the list is stable otherwise)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@functools.cache
def _xdist_groups(path: Path) -> dict:
    """``{"": module's group, "test_x" or "TestX": its group}`` from the xdist_group marks written in a test
    file: a module-level ``pytestmark`` (a mark or a list of them) and decorators of its tests and classes."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return {}

    def group(node) -> str | None:
        for call in ast.walk(node):
            if isinstance(call, ast.Call) and getattr(call.func, "attr", None) == "xdist_group":
                args = [*call.args, *(k.value for k in call.keywords if k.arg == "name")]
                return str(args[0].value) if args and isinstance(args[0], ast.Constant) else "default"
        return None

    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            out[""] = group(node.value)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = next(filter(None, map(group, node.decorator_list)), None)
    return {k: v for k, v in out.items() if v}


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` that honours xdist_group marks under pytest 9: pytest-xdist 3.8 tags a marked test
    by rewriting ``item._nodeid``, which pytest 9 no longer reads, so every marked test went its own way. The
    controller has only node ids, so the marks are read from the test files' source instead."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class FileMarkedGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)  # a group xdist itself put in the node id (older pytest)
            if scope != nodeid:
                return scope
            path, _, rest = nodeid.partition("::")
            groups = _xdist_groups(config.rootpath / path)
            name = rest.split("::")[0].split("[")[0]
            found = groups.get(name) or groups.get("")
            return f"xdist_group:{found}" if found else nodeid

    return FileMarkedGroups(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist's controller, before it starts a worker: the worker inherits the C environment, where
    readline (which pytest imports) has set COLUMNS and LINES to 80x24; hand it what the user set instead."""
    node.workerinput["tuner_terminal_env"] = {k: os.environ.get(k) for k in ("COLUMNS", "LINES")}


def pytest_configure(config):
    wanted = getattr(config, "workerinput", {}).get("tuner_terminal_env")
    if wanted is not None:  # an xdist worker: tables are as wide as the user's terminal says, not readline's 80
        for k, v in wanted.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def conv3x3_onnx(tmp_path):
    """``make(size) -> path``: an ONNX model of one 3x3 convolution, 8 -> 8 channels with seeded weights, on a
    (1, 8, size, size) input (the tests of config transfer compile it against logs of several devices)."""
    def make(size: int) -> str:
        return save_conv_model(tmp_path / f"conv{size}.onnx", size)
    return make


def with_reference(model, path, seed: int = 0) -> tuple:
    """Save ``model`` (one input ``input``) to ``path`` and return ``(x, want)``: a random-normal input of its shape
    (``seed``) and onnxruntime's first output for it."""
    import onnx
    import onnxruntime as ort
    onnx.save(model, str(path))
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return x, ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]


def save_conv_model(path, size: int = 8, relu: bool = False, residual: bool = False) -> str:
    """Save an ONNX model of one 3x3 convolution, 8 -> 8 channels with seeded weights (node ``conv``), on a
    (1, 8, size, size) input ``x``, to ``path``: then a residual add of ``x`` (node ``res``: ``x`` read twice)
    and a ReLU (node ``relu``) where asked; the output is ``y``."""
    import onnx
    from onnx import TensorProto, helper
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 8, 3, 3],
                           np.random.default_rng(0).standard_normal(576).astype(np.float32))
    nodes, last = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1] * 4)], "c"
    if residual:
        nodes.append(helper.make_node("Add", [last, "x"], ["a"], name="res"))
        last = "a"
    if relu:
        nodes.append(helper.make_node("Relu", [last], ["r"], name="relu"))
        last = "r"
    nodes[-1].output[0] = "y"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, size, size])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, size, size])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


@pytest.fixture(scope="module")
def tuning():
    """bench/tuning.py as a module (a script, not a package module), once per test module."""
    spec = importlib.util.spec_from_file_location("bench_tuning", Path(__file__).resolve().parents[1] / "bench"
                                                  / "tuning.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fake_measurer(monkeypatch, measure) -> None:
    """``Measurer`` measures with ``measure(self, inputs) -> [MeasureResult]`` instead of a device: both its
    blocking ``measure`` and ``start`` (what a model's scheduler calls: a batch finished at once)."""
    from tuner.measure import Batch, Measurer
    monkeypatch.setattr(Measurer, "measure", lambda self, inputs: measure(self, inputs))
    monkeypatch.setattr(Measurer, "start", lambda self, inputs: Batch.completed(measure(self, inputs)))
