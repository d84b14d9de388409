import os

import numpy as np
import pytest

from tuner.runtime import open_device


@pytest.fixture(scope="session")
def device():
    """PoCL's CPU device (the embedded default), or TUNER_TEST_DEVICE (e.g. ``nvidia`` on a GPU machine);
    every kernel test runs real OpenCL on it."""
    return open_device(os.environ.get("TUNER_TEST_DEVICE", "pocl"))


@pytest.fixture
def rng():
    return np.random.default_rng(0)
