import numpy as np
import pytest

from tuner.runtime import open_device


@pytest.fixture(scope="session")
def device():
    """PoCL's CPU device (the embedded default); every kernel test runs real OpenCL on it."""
    return open_device("pocl")


@pytest.fixture
def rng():
    return np.random.default_rng(0)
