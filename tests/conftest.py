import os

import numpy as np
import pytest

from tuner.runtime import open_device


# TUNER_TEST_DEVICE (a --device spec, e.g. ``nvidia`` on a GPU machine, ``intel`` for Intel's CPU runtime)
# picks the device of every test: the fixture below, and through $TUNER_DEVICE the API's and the CLI's default
# (subprocesses included). Unset, the tests run on the default device, which `tuner devices` stars.
if os.environ.get("TUNER_TEST_DEVICE"):
    os.environ["TUNER_DEVICE"] = os.environ["TUNER_TEST_DEVICE"]


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


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture(scope="session")
def native():
    """The native programs (native/: tuner-run, tuner-agent and their ASan builds), built once per session."""
    from tuner.native import build
    return build()


@pytest.fixture(scope="session")
def cl_env():
    """The environment a native program needs to find OpenCL here; the device is chosen by the test."""
    from tuner.native import opencl_env
    env = opencl_env()
    env.pop("TUNER_DEVICE", None)
    return env
