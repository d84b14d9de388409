"""`tuner worker`: tune this machine's device for tasks shared through an Optuna storage (a PostgreSQL
server, or a journal file on one machine). ``register(sub)`` adds the subcommand to the main parser."""
from __future__ import annotations

import argparse
import json
import sys

from tuner.errors import TunerError


def register(sub) -> None:
    from tuner.cli.args import add_device_arg, add_measure_args, add_seed_arg, add_transfer_arg, positive_int
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
    p.add_argument("--trials", type=positive_int, default=200, help="with --model: measurements for the whole model, shared "
                   "by weight (default 200)")
    p.add_argument("--tasks", metavar="JSON", help="register these tasks under the prefix (default prefix: tuner) "
                   "and tune them: a JSON list of {template, workload, scopes, fixed, trials, weight}")
    p.add_argument("--max-trials", type=positive_int, metavar="N", help="stop after this worker measured N configs "
                   "(default: when every task's budget is spent by all workers)")
    p.add_argument("--log", metavar="PATH", help="local JSONL log (default logs/<device fingerprint>.jsonl)")
    p.add_argument("--sampler", choices=("xgb", "tpe", "random"), default="xgb")
    add_seed_arg(p, default=None, help="sampler seed, 0 to 2**32-1 (default random; give workers different ones)")
    add_measure_args(p, parallel_help="build processes, and configs per batch (default 2)")
    p.add_argument("--heartbeat", type=positive_int, default=10, metavar="S",
                   help="seconds between heartbeats (default 10)")
    p.add_argument("--grace", type=positive_int, default=60, metavar="S", help="seconds without a heartbeat after which "
                   "another worker finishes a trial (its worker died; default 60)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_transfer_arg(p, "seed each task's study on this worker (its first trials and the cost model's transfer)")
    add_device_arg(p)
    p.set_defaults(func=cmd_worker)


def load_tasks(path: str) -> list:
    from tuner.files import read_regular_file
    from tuner.task import TuningTask
    hint = "give a JSON file of a list of tasks"
    try:
        data = json.loads(read_regular_file(path, "--tasks file", hint).decode("utf-8", errors="replace"))
    except (json.JSONDecodeError, RecursionError) as e:
        raise TunerError(f"--tasks {path}: not valid JSON ({e})") from None
    if not isinstance(data, list) or not data:
        raise TunerError(f"--tasks {path}: a non-empty JSON list of tasks, e.g. [{{\"template\": \"conv2d\", "
                         "\"workload\": {...}, \"trials\": 32}]")
    return [TuningTask.from_dict(d, f"--tasks {path}: task {i}") for i, d in enumerate(data)]


def cmd_worker(args: argparse.Namespace) -> int:
    from tuner.cli.args import measure_options
    from tuner.scheduler.model import model_worker_tasks
    from tuner.search.worker import run_worker
    if args.grace <= args.heartbeat:
        raise TunerError(f"--grace {args.grace} must be longer than --heartbeat {args.heartbeat}: a worker is taken "
                         "for dead after --grace seconds without a heartbeat (e.g. --heartbeat 10 --grace 60)")
    tasks = load_tasks(args.tasks) if args.tasks else None
    if args.model:
        if args.tasks:
            raise TunerError("give --model or --tasks, not both")
        tasks, prefix = model_worker_tasks(args.model, args.device, args.trials)
        args.study_prefix = args.study_prefix or prefix
    options = measure_options(args)
    try:
        s = run_worker(args.storage, device=args.device, study_prefix=args.study_prefix, tasks=tasks,
                       max_trials=args.max_trials, log=args.log, sampler=args.sampler, seed=args.seed,
                       options=options, progress=not args.no_progress, heartbeat=args.heartbeat, grace=args.grace,
                       transfer_from=args.transfer_from)
    except KeyboardInterrupt:  # the trials it held are finished already (run_worker lets go of them)
        print("worker interrupted; what it measured is in the study and its log", file=sys.stderr)
        return 130
    print(f"worker {s.worker} on {s.device}: measured {s.measured}, yielded {s.yielded} claims, finished "
          f"{s.reaped} trials of dead workers (log {s.log})")
    for name, st in s.studies.items():
        best = f"best {st['best'].gflops:.3g} GFLOP/s" if st["best"] else "no success yet"
        print(f"  {name}  {st['done']}/{st['budget']} trials  {best}")
    return 0
