"""Measurement workers die with the tuner that started them: a `kill -9` of `tuner tune-op` leaves no
`tuner.measure.serve` process behind for more than about a second."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _serve_processes(parent: int) -> list:
    """The measurement workers started by ``parent`` (only its own: under pytest-xdist another test's tuner may
    be measuring at the same time, and its workers must not count here)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "tuner.measure.serve" in cmd and _parent(int(d.name)) == parent:
                out.append(int(d.name))
    return out


def test_workers_exit_within_a_second_of_a_killed_tuner(tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "tuner", "tune-op", "conv2d", "--data", "1,16,24,24", "--kernel",
                          "16,16,3,3", "--padding", "1", "--trials", "200", "--log", str(tmp_path / "l.jsonl"),
                          "--storage", f"sqlite:///{tmp_path / 's.db'}", "--no-progress", "--repeats", "50"],
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    workers = []
    while time.time() < deadline and not workers:
        time.sleep(0.5)
        workers = _serve_processes(p.pid)
    assert workers, "no measurement worker started"
    time.sleep(1.0)  # let them get busy
    p.send_signal(signal.SIGKILL)
    p.wait()
    t0 = time.time()
    while time.time() - t0 < 5 and any(Path(f"/proc/{w}").exists() and "Z" not in _state(w) for w in workers):
        time.sleep(0.05)
    alive = [w for w in workers if Path(f"/proc/{w}").exists() and "Z" not in _state(w)]
    assert not alive and time.time() - t0 < 2.0, (alive, time.time() - t0)


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return "Z"
