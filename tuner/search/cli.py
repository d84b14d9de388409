"""`tuner worker`: tune this machine's device for tasks shared through an Optuna storage (a PostgreSQL
server, or a journal file on one machine). ``register(sub)`` adds the subcommand to the main parser."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tuner.errors import TunerError


def register(sub) -> None:
    from tuner.cli_args import add_device_arg
    p = sub.add_parser("worker", help="tune this device for tasks shared through a database (many machines)",
                       description="Tune, on this machine's device, the tasks registered under a study prefix in "
                       "a shared Optuna storage. Workers whose devices share a fingerprint cooperate on one study "
                       "per task and never measure a config twice; other devices get their own studies.")
    p.add_argument("--storage", required=True, metavar="URL", help="postgresql://user:password@host:5432/db, "
                   "sqlite:///file.db, or journal:PATH (a journal file for processes on one machine)")
    p.add_argument("--study-prefix", metavar="P", help="the prefix the tasks were registered under (by `tuner tune "
                   "MODEL --storage URL --workers 0`, or --tasks)")
    p.add_argument("--model", metavar="ONNX", help="tune this model's tasks (registered under the model's prefix "
                   "if the host has not done it): the tasks planned for this worker's device")
    p.add_argument("--trials", type=int, default=200, help="with --model: measurements for the whole model, shared "
                   "by weight (default 200)")
    p.add_argument("--tasks", metavar="JSON", help="register these tasks under the prefix (default prefix: tuner) "
                   "and tune them: a JSON list of {template, workload, scopes, fixed, trials, weight}")
    p.add_argument("--max-trials", type=int, metavar="N", help="stop after this worker measured N configs "
                   "(default: when every task's budget is spent by all workers)")
    p.add_argument("--log", metavar="PATH", help="local JSONL log (default logs/<device fingerprint>.jsonl)")
    p.add_argument("--sampler", choices=("xgb", "tpe", "random"), default="xgb")
    p.add_argument("--seed", type=int, default=None, help="sampler seed (default random; give workers different ones)")
    p.add_argument("--parallel", type=int, default=2, help="build processes, and configs per batch (default 2)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per config (default 5)")
    p.add_argument("--build-timeout", type=float, default=60.0, metavar="S")
    p.add_argument("--run-timeout", type=float, default=30.0, metavar="S")
    p.add_argument("--heartbeat", type=int, default=10, metavar="S", help="seconds between heartbeats (default 10)")
    p.add_argument("--grace", type=int, default=60, metavar="S", help="seconds without a heartbeat after which "
                   "another worker finishes a trial (its worker died; default 60)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_device_arg(p)
    p.set_defaults(func=cmd_worker)


def load_tasks(path: str) -> list:
    from tuner.search.task import TuningTask
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise TunerError(f"--tasks {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise TunerError(f"--tasks {path}: not valid JSON ({e})") from None
    if not isinstance(data, list) or not data:
        raise TunerError(f"--tasks {path}: a non-empty JSON list of tasks, e.g. [{{\"template\": \"conv2d\", "
                         "\"workload\": {...}, \"trials\": 32}]")
    return [TuningTask.from_dict(d, f"--tasks {path}: task {i}") for i, d in enumerate(data)]


def cmd_worker(args: argparse.Namespace) -> int:
    from tuner.graph.tuning import model_worker_tasks
    from tuner.measure import MeasureOptions
    from tuner.search.worker import run_worker
    for flag, value in (("--parallel", args.parallel), ("--repeats", args.repeats)):
        if value < 1:
            raise TunerError(f"{flag} must be at least 1")
    tasks = load_tasks(args.tasks) if args.tasks else None
    if args.model:
        if args.tasks:
            raise TunerError("give --model or --tasks, not both")
        tasks, prefix = model_worker_tasks(args.model, args.device, args.trials)
        args.study_prefix = args.study_prefix or prefix
    options = MeasureOptions(n_parallel=args.parallel, repeats=args.repeats, build_timeout=args.build_timeout,
                             run_timeout=args.run_timeout)
    try:
        s = run_worker(args.storage, device=args.device, study_prefix=args.study_prefix, tasks=tasks,
                       max_trials=args.max_trials, log=args.log, sampler=args.sampler, seed=args.seed,
                       options=options, progress=not args.no_progress, heartbeat=args.heartbeat, grace=args.grace)
    except KeyboardInterrupt:  # the trials it held are finished already (run_worker lets go of them)
        print("worker interrupted; what it measured is in the study and its log", file=sys.stderr)
        return 130
    print(f"worker {s.worker} on {s.device}: measured {s.measured}, yielded {s.yielded} claims, finished "
          f"{s.reaped} trials of dead workers (log {s.log})")
    for name, st in s.studies.items():
        best = f"best {st['best'].gflops:.3g} GFLOP/s" if st["best"] else "no success yet"
        print(f"  {name}  {st['done']}/{st['budget']} trials  {best}")
    return 0
