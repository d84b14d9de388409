"""What a new user reads (issue 57, items 7 and 8): task labels with kernel size and stride wherever a task is
listed, tables that cut a label where it matters least (not in the middle of its shape, hiding `s2`), the demo's
closing line saying what a CPU run stands for, and `make demo` installing no test extras."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import profile
from tuner.cli import main
from tuner.console import truncate_label
from tuner.task import TuningTask
from tuner.templates import get_template

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "logs" / "nvidia-gpu-d4a6eca0.jsonl"
LABEL = "depthwise_conv2d 672 5x5 s2 p2 @14x14 +bias+hardswish [texture]"


@pytest.mark.parametrize("width, expected", [
    (80, LABEL),
    (58, "depthwise_conv2d 672 5x5 s2 p2 @14x14 +hardswish [texture]"),  # +bias first
    (50, "depthwise_conv2d 672 5x5 s2 p2 @14x14 +… [texture]"),  # then the epilogue
    (47, "depthwise_conv2d 672 5x5 s2 @14x14 +… [texture]"),  # then the padding
    (40, "depthwise_conv2d 672 5x5 s2… [texture]"),  # then words from the end: the stride stays
])
def test_a_label_is_cut_where_it_matters_least(width, expected):
    assert truncate_label(LABEL, width) == expected and len(expected) <= width


@pytest.mark.parametrize("label", [LABEL, "conv2d 3->32 3x3 s2 p1 @224x224 +bias+silu [texture/buffer/buffer]",
                                   "conv2d 3->32 3x3 s2 p1 @224x224 +bias+silu", "dense 1280->1000 +bias",
                                   "group_norm 32 groups 1x64x112x112 +relu [texture]"])
def test_a_cut_label_fits_and_keeps_its_start(label):
    head = label.split(" ")[0]
    for width in range(4, len(label) + 2):
        cut = truncate_label(label, width)
        assert len(cut) <= width, (width, cut)
        first = cut.split(" ")[0].rstrip("…")
        assert first and head.startswith(first), (width, cut)  # the template's name, or its start
        words = [w for w in cut.replace("…", " ").split() if w != "+" and not w.startswith("[")]
        assert all(w in label for w in words), (width, cut)  # nothing made up, only words left out or cut


def test_compare_keeps_kernel_and_stride_on_a_narrow_terminal(monkeypatch, capsys):
    """`tuner compare` on 80 columns: the rows of stride-2 layers still say s2 (they were cut as
    `depthwise_con…+bias+silu`)."""
    if not SHIPPED.exists():
        pytest.skip("the shipped log is not in this tree")
    from tuner.analysis import compare, load_logs
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["compare", str(SHIPPED)]) == 0
    table = capsys.readouterr().out.split("\n\n")[0].splitlines()
    assert max(map(len, table)) <= 80
    workloads = list(compare(load_logs(SHIPPED))["workload"])
    # too narrow for a column of labels: each label on its own line, whole, its numbers below it
    labels = [line for line in table[3:] if not line.startswith("  ")]
    assert labels == workloads and any(" s2 " in w for w in workloads)
    # at 100 columns the labels fit a column: cut only in their epilogue or padding, never the kernel or stride
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["compare", str(SHIPPED)]) == 0
    rows = [r for r in capsys.readouterr().out.split("\n\n")[0].splitlines()[2:] if not r.startswith("(cut to")]
    assert len(rows) == len(workloads) and max(map(len, rows)) <= 100
    for w, row in zip(workloads, rows):
        shape = re.match(r"\S+ \S+ \d+x\d+( s\S+)?", w)  # a convolution's template, channels, kernel, stride
        assert row.startswith(shape.group(0) if shape else w.split(" ")[0]), (w, row)


def test_tune_lists_tasks_by_their_label_with_kernel_and_stride():
    """`tuner tune`'s summary named a task `conv2d 1x64x56x56 texture/texture/texture`: no kernel, no stride."""
    from tuner.scheduler.model import describe
    conv = get_template("conv2d")
    wl = conv.workload(data=(1, 64, 56, 56), kernel=(128, 64, 3, 3), stride=2, padding=1)
    task = TuningTask("conv2d", wl, {"input": "texture", "weight": "texture", "output": "buffer"})
    assert describe(task) == task.label == "conv2d 64->128 3x3 s2 p1 @56x56 [texture/texture/buffer]"


def test_the_demo_closes_with_what_a_cpu_run_stands_for():
    from tuner.cli.model import demo_closing
    cpu = demo_closing(profile(type="CPU", name="AMD EPYC"))
    assert "pipeline end to end" in cpu and "Speed belongs to GPUs" in cpu and "AMD EPYC" in cpu
    gpu = demo_closing(profile())
    assert "pipeline end to end" not in gpu and "this device's" in gpu


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_demo_installs_no_test_extras(tmp_path):
    """`make demo` installs the package with its CPU runtime only; `make test` the test extras too."""
    env = {**os.environ, "MAKEFLAGS": ""}
    venv = str(tmp_path / "venv")  # a venv that does not exist: make lists every step it would take
    demo = subprocess.run(["make", "-n", "demo", f"VENV={venv}"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert demo.returncode == 0, demo.stderr
    installs = [line for line in demo.stdout.splitlines() if "pip install" in line]
    assert installs == [f"{venv}/bin/python -m pip install -e '.[cpu]'"], demo.stdout
    test = subprocess.run(["make", "-n", "test", f"VENV={venv}"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert f"{venv}/bin/python -m pip install -e '.[test,cpu]'" in test.stdout, test.stdout
