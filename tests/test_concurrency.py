"""Four tuners at once on one log and one (fresh) default storage: all finish without an error, and no config is
measured twice (a duplicate is answered from the log or from the study, never re-measured)."""
import collections
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.logs import load_records
from tuner.logs.record import canonical_json

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_four_concurrent_tuners_on_a_fresh_directory(tmp_path):
    argv = [sys.executable, "-m", "tuner", "tune-op", "conv2d", "--data", "1,8,8,8", "--kernel", "8,8,3,3",
            "--padding", "1", "--scope", "buffer", "--trials", "10", "--repeats", "2", "--parallel", "1",
            "--log", "logs/shared.jsonl", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([*argv, "--seed", str(i)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(4)]
    results = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err[-2000:]
        assert "Traceback" not in err
    recs = [r for r in load_records(tmp_path / "logs" / "shared.jsonl") if r.error_name != "INSTANTIATION"]
    counts = collections.Counter(canonical_json(r.config) for r in recs)
    assert recs and max(counts.values()) == 1, [c for c, n in counts.items() if n > 1]
