"""Hostile or clumsy input to `tuner op` / `tune-op`: a clean `error:` (exit 2), never a traceback, a hang or a
silently wrong result."""

import pytest

from tuner.cli import main

CONV = ["conv2d", "--data", "1,4,6,6", "--kernel", "4,4,3,3"]


@pytest.mark.parametrize("extra, message", [
    (["--stride", "0"], "stride must be at least 1"),
    (["--padding", "-1"], "padding must be non-negative"),
    (["--dilation", "0"], "dilation must be at least 1"),  # ran and "checked ok" before
    (["--config", '{"tile_ow": 4.0}'], "tile_ow: 4.0 not in"),
    (["--config", '{"tile_ow": true}'], "tile_ow: True not in"),  # was taken as 1
])
def test_op_rejects_bad_workloads_and_knob_types(capsys, extra, message):
    assert main(["op", *CONV, *extra, "--check"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


@pytest.mark.parametrize("argv", [
    ["op", "conv2d", "--data", "0,4,6,6", "--kernel", "4,4,3,3"],
    ["op", "conv2d", "--data", "1,-4,6,6", "--kernel", "4,-4,3,3"],
    ["op", "depthwise_conv2d", "--data", "1,-4,6,6", "--kernel=-4,1,3,3"],
    ["op", "dense", "--data", "1,0", "--weight", "4,0"],
])
def test_op_rejects_empty_or_negative_shapes(capsys, argv):
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("error: ")


@pytest.mark.parametrize("argv", [
    ["op", *CONV, "--time", "--repeats", "0"],
    ["tune-op", *CONV, "--parallel", "0"],  # hung before
    ["tune-op", *CONV, "--trials", "-1"],
    ["tune-op", *CONV, "--early-stopping", "0"],
])
def test_counts_must_be_positive(capsys, argv):
    assert main(argv) == 2
    assert "must be at least 1" in capsys.readouterr().err
