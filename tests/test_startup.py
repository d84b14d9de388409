"""Start-up: what a command imports before it does anything (issue 57, item 1). `tuner --help` used to import
onnx (about 7 s of a 10 s start on a loaded 2-core host), pyopencl, optuna and xgboost; each command now imports
what it needs when it runs. The modules are read from ``sys.modules`` of a fresh interpreter after the command
ran, so an import that sneaks back in anywhere on the path (a CLI module, a module it imports at the top, the
parser's registration) fails here and names the command. bench/startup.py times the same commands (on a
2-core AMD EPYC shared with other jobs, `tuner --help` went from 1.7 s to 0.3 s)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT / "logs" / "nvidia-gpu-d4a6eca0.jsonl"

# Heavy libraries no command imports unless it uses them. numpy is not here: the templates' registry (the
# workload options of `op`, `space` and `tune-op`) imports it, about 0.1 s.
HEAVY = {"onnx", "onnxruntime", "pyopencl", "pandas", "matplotlib", "optuna", "xgboost", "sklearn", "scipy",
         "pyarrow", "psycopg2", "torch"}

RUN = textwrap.dedent("""
    import json, sys
    from tuner.cli import main
    argv = json.loads(sys.argv[1])
    import contextlib, io
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main(argv)
    print(json.dumps({"code": code, "modules": sorted({m.split(".")[0] for m in sys.modules})}))
""")


def _imported(argv: list, tmp_path) -> tuple[int, set]:
    """The exit status of ``tuner ARGV`` in a fresh interpreter and the top-level packages it imported."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", RUN, json.dumps(argv)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return out["code"], set(out["modules"])


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["tune", "--help"], ["compile", "--help"],
                                  ["report", "--help"], ["op", "--help"], ["worker", "--help"]])
def test_help_and_version_import_no_heavy_library(argv, tmp_path):
    code, modules = _imported(argv, tmp_path)
    assert code == 0
    assert not HEAVY & modules, f"`tuner {' '.join(argv)}` imported {sorted(HEAVY & modules)}: import them " \
                                f"inside the command that needs them"


def test_devices_imports_opencl_only(tmp_path):
    """`tuner devices` needs pyopencl (and its numpy), nothing of the model or tuning layers."""
    _, modules = _imported(["devices", "--json"], tmp_path)
    assert "pyopencl" in modules  # the test sees what the command imports
    assert not (HEAVY - {"pyopencl"}) & modules, sorted((HEAVY - {"pyopencl"}) & modules)


@pytest.mark.skipif(not LOG.exists(), reason="the shipped log is not in this tree")
def test_logs_imports_pandas_only(tmp_path):
    """`tuner logs` needs pandas (the log as a DataFrame): not onnx, OpenCL, the samplers or matplotlib."""
    code, modules = _imported(["logs", str(LOG)], tmp_path)
    assert code == 0 and "pandas" in modules
    needed = {"pandas", "pyarrow"}  # pandas imports pyarrow itself where it is installed
    assert not (HEAVY - needed) & modules, sorted((HEAVY - needed) & modules)


@pytest.mark.skipif(not LOG.exists(), reason="the shipped log is not in this tree")
def test_report_imports_pandas_and_matplotlib_only(tmp_path):
    """`tuner report LOG` (no --artifact): pandas and matplotlib, not onnx, OpenCL or the samplers."""
    code, modules = _imported(["report", str(LOG), "-o", str(tmp_path / "r.html")], tmp_path)
    assert code == 0 and {"pandas", "matplotlib"} <= modules
    needed = {"pandas", "pyarrow", "matplotlib"}
    assert not (HEAVY - needed) & modules, sorted((HEAVY - needed) & modules)


def test_the_clis_min_trials_is_the_schedulers():
    """The CLI's default --min-trials is a copy (importing tuner.scheduler.model costs seconds of start-up)."""
    from tuner.cli.args import MIN_TRIALS
    from tuner.scheduler.model import MIN_TRIALS as SCHEDULER
    assert MIN_TRIALS == SCHEDULER
