"""What the whole-model benchmarks share (``bench/runtimes_gpu.py``, ``bench/peers.py``): a job with a deadline,
a log file and a shell that keeps the compiler noise out of it; medians that skip missing values; relative
errors; JSON state and CSV tables written atomically, markdown tables; builds timed in alternating rounds (also
``bench/se_gate_ab.py``, ``bench/stats_epilogue.py``, ``bench/norm_readers.py``)."""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np

NOISE = re.compile(r"CompilerWarning|lambda: self\._prg|_create_built|prg\.build|warn\(text, CompilerWarning\)")


def add_round_args(p, rounds: int = 3, repeats: int = 30) -> None:
    """``--rounds``, ``--repeats`` and ``--out`` of a script timing builds in alternating rounds
    (``alternating_medians``)."""
    p.add_argument("--rounds", type=int, default=rounds, help="alternating rounds")
    p.add_argument("--repeats", type=int, default=repeats, help="profiled runs a round")
    p.add_argument("--out", default=".", help="the folder to write the CSV and markdown tables to")


def conv2d_bench(p, args, presets: dict) -> tuple:
    """``(device, the conv2d template, the logs' ApplyHistoryBest or None, the workloads' fields)`` of a script
    timing convolutions per config (``--device``, ``--log``, ``--preset`` names of ``presets``, ``--workload``
    JSON); ``p.error`` (exit 2) where no workload is given."""
    from tuner.logs.best import ApplyHistoryBest
    from tuner.runtime.opencl.device import open_device
    from tuner.templates import get_template
    fields = [f for name in args.preset for f in presets[name]] + [json.loads(w) for w in args.workload]
    if not fields:
        p.error("give --preset or --workload")
    return (open_device(args.device), get_template("conv2d"),
            ApplyHistoryBest(args.log.split(",")) if args.log else None, fields)


def write_round_tables(stem: Path, rows: list, dev, args, what: str) -> None:
    """``<stem>.csv`` and ``<stem>.md`` of ``rows`` timed by ``alternating_medians``, the markdown headed by the
    device, the rounds and repeats (``args``) and ``what`` was timed."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    write_csv(Path(f"{stem}.csv"), rows)
    Path(f"{stem}.md").write_text(f"{dev.info.name}: {args.rounds} alternating rounds, median of {args.repeats} "
                                  f"profiled runs each, {what}\n\n" + "\n".join(md_table(rows, list(rows[0]))) + "\n")


def alternating_medians(timers: dict, rounds: int, repeats: int) -> dict:
    """key -> seconds: each of ``timers`` (``key -> time(repeats)``, a build's profiled runs:
    ``tuner.op.prepared_op``) timed in ``rounds`` rounds, the order reversed every other round (the same
    conditions for each), ``repeats`` runs a round; a key's time is the median of its rounds' medians."""
    order, times = list(timers), {k: [] for k in timers}
    for rnd in range(rounds):
        for key in (order if rnd % 2 == 0 else order[::-1]):
            times[key].append(statistics.median(timers[key](repeats)))
    return {k: statistics.median(v) for k, v in times.items()}


def median(xs):
    """The median of the numbers of ``xs`` (None, NaN and anything else left out), or None."""
    xs = [x for x in xs if isinstance(x, (int, float)) and x == x]
    return statistics.median(xs) if xs else None


def rel_err(y, ref) -> float:
    y, ref = np.asarray(y, np.float64).reshape(-1), np.asarray(ref, np.float64).reshape(-1)
    return float(np.abs(y - ref).max() / max(np.abs(ref).max(), 1e-30))


def wall(fn, repeats: int, warmup: int, sync=None) -> float:
    """Median wall seconds of ``fn(); sync()`` over ``repeats`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    if sync:
        sync()
    costs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        costs.append(time.perf_counter() - t0)
    return statistics.median(costs)


def latency_s(text: str) -> float | None:
    """Seconds from the "median latency X ms" line that ``tuner-run --bench`` and ``tuner run --bench`` print."""
    m = re.search(r"median latency ([0-9.]+) ms", text)
    return float(m.group(1)) * 1e-3 if m else None


def ms(s) -> str:
    """Seconds as milliseconds for a table, "–" when there is no number."""
    return f"{s * 1e3:.3f}" if isinstance(s, (int, float)) and s == s else "–"


def sci(v) -> str:
    """A relative error for a table (``1.2e-06``), "–" when there is none."""
    return f"{v:.1e}" if isinstance(v, float) else "–"


def save_json(path: Path, obj) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str) + "\n")
    os.replace(tmp, path)


def write_csv(path: Path, rows: list) -> None:
    """``rows`` (dicts with the keys of the first) as a CSV file, written atomically."""
    import csv
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)


def md_table(rows: list, cols: list) -> list:
    """The lines of a markdown table of ``rows``' ``cols``, as they print."""
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)] + \
        ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]


def load_json(path: Path, default):
    return json.loads(path.read_text()) if path.exists() else default


class Job:
    """``args.out`` and ``args.work`` made, ``args.deadline`` seconds from now, a log ``out/LOG``. Subclasses
    set how much of a command's output the log keeps (``LOG_TAIL`` lines, None: all) and the console shows
    (``SHOW`` lines of at most ``WIDTH`` characters), and whether a line says the time of day (``CLOCK``)."""
    LOG = "job.log"
    LOG_TAIL: int | None = None
    SHOW, WIDTH = 40, 400
    CLOCK = False

    def __init__(self, args):
        self.args, self.t0 = args, time.time()
        self.out, self.work = Path(args.out), Path(args.work)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        self.logf = open(self.out / self.LOG, "a")

    def left(self) -> float:
        return self.args.deadline - (time.time() - self.t0)

    def say(self, text: str) -> None:
        clock = f"{time.strftime('%H:%M:%S', time.gmtime())} " if self.CLOCK else ""
        line = f"[{clock}{time.time() - self.t0:6.1f}s] {text}"
        print(line, flush=True)
        self.logf.write(line + "\n")
        self.logf.flush()

    def device_info(self, tuner: list, env=None) -> dict:
        """``tuner devices --json --device D`` (``tuner``: the command that runs the tuner) as a dict, or
        ``{"error": ...}`` naming the command when it printed no device."""
        rc, text = self.sh([*tuner, "devices", "--json", "--device", self.args.device], env=env, quiet=True)
        try:
            return json.loads(text[text.index("{"):text.rindex("}") + 1])
        except ValueError:
            return {"error": f"`tuner devices --json --device {self.args.device}` gave no device: {text[-400:]}"}

    def sh(self, cmd, env=None, timeout=None, quiet=False) -> tuple:
        """Run ``cmd`` within the deadline; its output goes to the log (and the console unless quiet);
        ``(rc, output)``: 124 when it ran out of time, 127 when there is no such program."""
        timeout = max(5.0, min(timeout or self.left(), self.left()))
        self.say("$ " + " ".join(map(str, cmd)))
        try:
            p = subprocess.run(list(map(str, cmd)), env=env, capture_output=True, text=True, timeout=timeout)
            rc, text = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as e:
            rc = 124
            text = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
                           for x in (e.stdout, e.stderr)) + f"\n(timed out after {timeout:.0f} s)"
        except OSError as e:  # a program that is not there
            rc, text = 127, f"{type(e).__name__}: {e}"
        lines = [ln for ln in text.splitlines() if ln.strip() and not NOISE.search(ln)]
        kept = lines if self.LOG_TAIL is None else lines[-self.LOG_TAIL:]
        self.logf.write("\n".join(kept) + "\n")
        self.logf.flush()
        if not quiet:
            for ln in lines[-self.SHOW:]:
                print("   " + ln[:self.WIDTH], flush=True)
        if rc:
            self.say(f"exit status {rc}")
        return rc, text
