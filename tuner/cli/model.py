"""Model commands: ``tuner zoo``, ``tuner compile``, ``tuner run``, ``tuner tune`` and ``tuner demo``."""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.cli.args import (MIN_TRIALS, add_device_arg, add_measure_args, add_seed_arg, add_transfer_arg, duration, fraction, int_at_least,
                            measure_options, non_negative_int, positive_int, regular_file,
                            writable_dir, writable_file)
from tuner.errors import TunerError
from tuner.console import printable
from tuner.files import check_writable, write_file

if TYPE_CHECKING:
    import numpy as np  # imported by the commands that use it: start-up time


def _model_path(path: str) -> str:
    if not os.path.lexists(path):
        raise TunerError(f"no model file {path!r} (write one with `tuner zoo mobilenet_v2 -o {path}`)")
    regular_file(path, "model", "give an ONNX file")
    return path


def _input_shapes(specs) -> dict | None:
    """``--input-shape name=1,3,224,224`` (repeatable) -> {name: shape}."""
    if not specs:
        return None
    out = {}
    for s in specs:
        name, sep, dims = s.partition("=")
        try:
            if not sep:
                raise ValueError
            out[name] = tuple(int(d) for d in dims.split(","))
        except ValueError:
            raise TunerError(f"--input-shape {s!r}: write NAME=N,C,H,W, e.g. input=1,3,224,224") from None
    return out


def _add_model_args(p, scope_help: str) -> None:
    p.add_argument("--scope", choices=("auto", "texture", "buffer"), default="auto", help=scope_help)
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32",
                   help="storage dtype; a float16 layer starts from float32's tuned config (and the reverse), and "
                        "on a device with cl_khr_fp16 its compute knob tunes half arithmetic")
    p.add_argument("--input-shape", action="append", metavar="NAME=SHAPE", help="override an input's shape")
    add_device_arg(p)


def cmd_zoo(args) -> int:
    from tuner.zoo.models import write_model
    writable_file(args.output, "-o")
    kwargs = {"input_size": args.input_size} if args.input_size is not None else {}
    path = write_model(args.name, args.output, **kwargs)
    print(f"wrote {args.name} to {path}")
    return 0


def cmd_compile(args) -> int:
    from tuner.compile.compiler import compile_model
    if args.target and args.device:
        raise TunerError("--device or --target: compile for an attached device or for a device profile, not both")
    from tuner.artifact.store import check_output_dir
    check_output_dir(args.output)  # before any work: an artifact folder, new or replaced whole
    writable_dir(args.output, "-o", create=False)  # made by save() only once the compile succeeded
    from tuner.artifact.signing import read_key, sign
    key = read_key(args.sign, "--sign") if args.sign else None
    try:
        mod = compile_model(_model_path(args.model), log=args.log, device=args.device, scope=args.scope,
                            dtype=args.dtype, input_shapes=_input_shapes(args.input_shape),
                            progress=not args.no_progress, target=args.target, transfer_from=args.transfer_from,
                            plan_timer=args.plan_timer, precision=args.precision, calibration=args.calibration,
                            keep=True)
    except TunerError as e:
        if args.device and "no OpenCL device matches" in str(e):
            raise TunerError(f"{e}\nto compile for a device that is not attached, pass its profile: --target "
                             f"PROFILE.json, written on that device by `tuner devices --json --device D`") from None
        raise
    try:
        mod.save(args.output)
        if key is not None:
            sign(args.output, key)
    except OSError as e:
        raise TunerError(f"cannot write the artifact to -o {args.output!r}: {e.strerror or e}") from None
    _keep_plan_choice(mod, args.output)
    from tuner.compile.compiler import source_counts, source_kind
    tuned = sum(n.tuned for n in mod.spec.nodes)
    total = sum(n.template is not None for n in mod.spec.nodes)
    where = mod.spec.device
    counts = source_counts(mod.spec.nodes)
    moved = [n for n in mod.spec.nodes if source_kind(n.config_source) in ("transferred", "predicted")]
    siblings = sorted({n.config_source.split(" ", 1)[1] for n in mod.spec.nodes
                       if source_kind(n.config_source) == "sibling"})
    dtypes = sorted({n.config_source.split(" in ", 1)[1].split(" ")[0] for n in mod.spec.nodes
                     if source_kind(n.config_source) == "dtype"})
    words = {"sibling": f"from the records of sibling {', '.join(siblings)}",
             "dtype": f"with the config tuned in {', '.join(dtypes)}", "transferred": "with the config of a nearby tuned "
             "workload", "predicted": "with a logged config the cost model ranks first", "fallback": "fallback"}
    rest = "".join(f", {counts[k]} {w}" for k, w in words.items() if counts.get(k))
    print(f"compiled {args.model} for {where['name']} ({where['fingerprint']}): {len(mod.spec.nodes)} kernels, "
          f"{tuned} of {total} tuned layers from the log" + rest + f" -> {args.output}"
          + (" (signed)" if key is not None else ""))
    for n in moved:
        print(f"  {n.name}: {n.config_source}")
    if mod.device is None:
        print("nothing built here: the kernels build on the first load on that device (`tuner run DIR`)")
    _print_plan_choice(mod)
    _print_precision(mod)
    print(mod.memory_summary())
    return 0


def _print_precision(mod) -> None:
    """The precision guard's finding (a float16 compile): the nodes kept in float32 and why."""
    guard = getattr(mod, "precision", None)
    if guard is None:
        return
    print(guard.summary())
    for name, why in guard.kept.items():
        print(f"  {name}: {why}")
    if str(getattr(mod, "plan_kept", "")).endswith("+all-float32"):
        print("kept the all-float32 plan: it ran faster than the float16 plan (see the plan choice above), so every "
              "tensor is stored in float32")


def _keep_plan_choice(mod, artifact) -> None:
    """The plan choice's steps (times and spreads of each step's rounds) in the user's cache beside the artifact's
    profile (``tuner.artifact.cache.plans_path``), for a report; the artifact itself is not written."""
    steps = getattr(mod, "plan_steps", None)
    if not steps:
        return
    from tuner.artifact.cache import write_plans
    from tuner.compile.compiler import PLAN_ROUNDS
    try:
        write_plans(artifact, {"kept": mod.plan_kept, "timer": mod.plan_timer, "rounds": PLAN_ROUNDS,
                               "steps": [st.to_json() for st in steps]})
    except TunerError as e:
        print(f"warning: {e}", file=sys.stderr)


def _print_plan_choice(mod) -> None:
    """Each step of the plan choice (``fastest_plan``'s ``plan_steps``) with the times it was made on, from one set
    of alternating rounds, and their spread; a step whose spread is larger than its margin says so, one that kept
    its incumbent against a challenger faster by the median (not in every round) says that, and timings above
    ``tuner.timing.SPREAD_WARN`` warn that the device is busy."""
    steps = getattr(mod, "plan_steps", None)
    if not getattr(mod, "plan_kept", None) or not steps:
        return
    from tuner.compile.compiler import EXTRA_ROUNDS, PLAN_ROUNDS
    from tuner.timing import unreliable
    by = " by tuner-run" if mod.plan_timer == "native" else ""
    print(f"--scope auto: whole plans timed on the device{by}, {PLAN_ROUNDS} alternating rounds per step, "
          f"{PLAN_ROUNDS + EXTRA_ROUNDS} on a close call (median, spread = IQR/median):")
    width = max(len(st.name) for st in steps) + 1
    for st in steps:
        times = ", ".join(f"{m} = {st.same[m]}" if m in st.same else
                          f"{m} {st.times[m] * 1e3:.3f} ms \u00b1{st.spreads[m]:.1%}" for m in st.times)
        line = f"  {st.name + ':':<{width}} {times} -> {st.kept}"
        if st.margin() < 0:
            other = st.runner_up()
            lost = f"lost {st.lost(other)} of {len(st.rounds.get(other, ()))} rounds"
            line += (f" (kept: {other} ran {-st.margin():.1%} faster by the median, but {lost})"
                     if st.kept == st.incumbent else
                     f" ({other} ran {-st.margin():.1%} faster than {st.kept} by the median, but {lost} to "
                     f"{st.incumbent})")
        elif st.close():
            line += (f" (only {st.margin():.1%} faster than {st.runner_up()}, within the spread of {st.noise():.1%}: "
                     f"as good as a tie)")
        print(line)
    print(f"kept the {mod.plan_kept} plan")
    worst = max(max(st.spreads.values()) for st in steps)
    if unreliable(worst):
        print(f"warning: {unreliable(worst, 'the plan timings')}", file=sys.stderr)


def config_source_of(node) -> str | None:
    """Where a tuned layer's config came from, as the artifact records it (``config_source``: tuned, sibling
    <fingerprint>, transferred from <workload>, predicted: config of <workload>, fallback); None for glue."""
    if not node.template:
        return None
    return node.config_source or ("tuned" if node.tuned else "fallback")


def print_profile(prof: dict, file=None) -> None:
    """The per-layer table, every column as wide as its widest cell (text left, numbers right); last, where each
    tuned layer's config came from (a row's ``config_source``, as ``tuner-run --profile`` prints it)."""
    file = file if file is not None else sys.stdout  # looked up now: sys.stdout may have been replaced
    head = ("node", "op", "storage", "scopes", "ms", "GFLOP/s", "config")
    rows = [(printable(r["node"]), printable(r["op"]), printable(r.get("storage", "")), printable(r["scopes"]),
             f"{r['median_s'] * 1e3:.3f}", f"{r['gflops']:.3g}" if r["gflops"] else "-",
             printable(r.get("config_source") or (("tuned" if r["tuned"] else "fallback") if r["template"] else "")))
            for r in prof["rows"]]  # an artifact's names, control characters escaped: never terminal escapes
    widths = [max(len(str(x[i])) for x in (head, *rows)) for i in range(len(head))]
    right = {4, 5}
    for x in (head, *rows):
        print("  ".join(f"{str(c):>{w}}" if i in right else f"{str(c):<{w}}" for i, (c, w) in
                        enumerate(zip(x, widths))).rstrip(), file=file)
    print(f"kernels {prof['kernel_total_s'] * 1e3:.3f} ms, end to end {prof['total_s'] * 1e3:.3f} ms", file=file)


def _run_inputs(specs, names: list) -> dict:
    """``--input``: ``X.npy`` for a one-input model, else ``NAME=X.npy`` once per model input -> {name: path}."""
    per_input = f"give one --input NAME=X.npy per model input ({', '.join(names)})"
    given: dict = {}
    for s in specs:
        name, sep, path = s.partition("=")
        if sep and name in names:
            pass
        elif sep and not os.path.lexists(s):
            raise TunerError(f"--input {s!r}: the model has no input {name!r}; {per_input}")
        elif len(names) == 1 and len(specs) == 1:
            name, path = names[0], s
        elif len(names) == 1:
            raise TunerError(f"--input is given {len(specs)} times; the model takes one input ({names[0]!r}): give "
                             "one --input X.npy")
        else:
            raise TunerError(f"--input {s!r} does not say which input it is: the model takes {len(names)} inputs; "
                             f"{per_input}")
        if name in given:
            raise TunerError(f"--input {name}=... is given twice; {per_input}")
        given[name] = path
    missing = [n for n in names if n not in given]
    if missing:
        raise TunerError(f"no --input for {', '.join(map(repr, missing))}; {per_input}")
    return given


OUTPUT_NAME_BYTES = 200  # a file name's bytes taken from an output's name (file systems allow 255)


def output_file_name(name: str) -> str:
    """The file ``--outputs DIR`` writes a model output to, as ``tuner-run --outputs`` names it: the name's first
    200 UTF-8 bytes, each byte other than an ASCII letter, digit, ``.``, ``_`` or ``-`` made ``_`` (a name holds no
    folder, and no leading dot), then ``.npy``."""
    raw = name.encode("utf-8", "surrogateescape")[:OUTPUT_NAME_BYTES]
    safe = "".join(chr(b) if chr(b).isascii() and (chr(b).isalnum() or chr(b) in "._-") and (b != 0x2E or i) else "_"
                   for i, b in enumerate(raw))
    return (safe or "_") + ".npy"


def _run_outputs(specs, outputs_dir, names: list) -> dict:
    """``--output Y.npy`` (the first output), ``--output NAME=Y.npy`` (that output; repeatable) and ``--outputs
    DIR`` (every output, DIR/NAME.npy) -> {output name: Path}, each checked writable before anything runs."""
    from tuner.cli.args import writable_dir
    given: dict = {}
    for s in specs or []:
        name, sep, path = s.partition("=")
        if not (sep and name in names):
            if sep:
                raise TunerError(f"--output {s!r}: the model has no output {name!r}; its outputs are "
                                 f"{', '.join(names)} (a path with '=' in it: give it as NAME=PATH)")
            if len(specs) > 1:
                raise TunerError(f"--output {s!r} does not say which output it is; with several --output give "
                                 f"NAME=Y.npy for each (outputs: {', '.join(names)}), or --outputs DIR for all")
            name, path = names[0], s
        if name in given:
            raise TunerError(f"--output {name}=... is given twice")
        given[name] = check_writable(path, "--output")
    if outputs_dir is not None:
        if os.path.islink(outputs_dir.rstrip("/") or "/"):  # before anything is made or probed in it
            raise TunerError(f"--outputs {outputs_dir!r} is a symbolic link (to "
                             f"{os.readlink(outputs_dir.rstrip('/'))!r}); give the folder itself")
        folder = writable_dir(outputs_dir, "--outputs")
        files = {n: folder / output_file_name(n) for n in names}
        if len(set(files.values())) < len(files):
            raise TunerError(f"--outputs {outputs_dir!r}: output names {names} map to the same file name; save them "
                             "one by one with --output NAME=Y.npy")
        for n, f in files.items():
            given.setdefault(n, check_writable(str(f), "--outputs"))
    return given


def _load_npy(path: str, shown: str | None = None, shape=None) -> np.ndarray:
    """An --input array (``tuner.files.read_npy``); ``shown``: the option's value as the messages show it
    (``NAME=X.npy``); ``shape``: the model input's, which bounds what is read."""
    from tuner.files import read_npy
    return read_npy(path, "--input", shape, shown if shown is not None else path)


def _save_npy(path: Path, array: np.ndarray, flag: str) -> None:
    """``array`` to exactly ``path`` (np.save(path) would append ".npy") by ``files.write_file``: atomically
    for a regular file, through a device or FIFO (``/dev/null``), never over a symbolic link."""
    import numpy as np
    write_file(path, lambda fh: np.save(fh, array), flag)


def cmd_run(args) -> int:
    from tuner.runtime.module import load_module
    if args.output and len(args.output) == 1 and "=" not in args.output[0]:  # checked before anything is read
        check_writable(args.output[0], "--output")
    key = None
    if args.verify:  # checked against the manifest that is then run, in the same reading (tuner-run's own)
        from tuner.artifact.signing import read_key
        key = read_key(args.verify, "--verify")
    if args.runtime == "native":
        return _run_native(args)
    mod = load_module(args.artifact, device=args.device, key=key)
    if (args.output or args.outputs) and not mod.spec.outputs:
        raise TunerError(f"{args.artifact} computes no outputs (its graph lists none): nothing to write to "
                         f"--output; recompile a model that has outputs, or leave out --output")
    writes = _run_outputs(args.output, args.outputs, list(mod.spec.outputs))
    names = list(mod.spec.inputs)
    sources = _run_inputs(args.input, names) if args.input else {}  # checked before anything is built
    st = mod.load_stats
    print(f"loaded {args.artifact} on {mod.device.info.name} ({mod.device.fingerprint}) in {st['seconds']:.3f} s: "
          f"{st['programs']} programs, {st['binary']} from cached binaries, {st['source']} built from source")
    if sources:
        xs = {n: _load_npy(p, None if len(names) == 1 else f"{n}={p}", mod.spec.entries[n].shape)
              for n, p in sources.items()}
    else:  # a fixed random input, so repeated runs compare
        import numpy as np
        rng = np.random.default_rng(0)
        xs = {n: rng.standard_normal(mod.spec.entries[n].shape).astype(np.float32) for n in names}
    outs = dict(zip(mod.spec.outputs, mod.run(xs)))
    for name, path in writes.items():  # each output in the model's own shape
        _save_npy(path, outs[name], "--output")
        which = f" (output {name!r}, {list(outs).index(name) + 1} of {len(outs)})" if len(outs) > 1 else ""
        print(f"wrote {path} {list(outs[name].shape)}{which}")
    costs = mod.time(args.repeat)
    from tuner.timing import spread, unreliable
    print(f"{mod.device.info.name}: median latency {statistics.median(costs) * 1e3:.3f} ms over {args.repeat} runs, "
          f"spread {spread(costs):.1%} (IQR/median)")
    if unreliable(spread(costs)):
        print(f"warning: {unreliable(spread(costs), f'the {args.repeat} runs')}", file=sys.stderr)
    if args.profile:
        prof = mod.profile(args.repeat)
        nodes = {n.name: n for n in mod.spec.nodes}
        for row in prof["rows"]:  # in the table and profile.json: where each tuned layer's config came from
            row.setdefault("config_source", config_source_of(nodes[row["node"]]))
        print_profile(prof)
        from tuner.artifact.cache import write_profile
        try:  # into the user's cache, keyed by the manifest's hash: the artifact itself is never written
            print(f"profile written to {write_profile(args.artifact, prof)}")
        except TunerError as e:
            print(f"warning: {e}", file=sys.stderr)
    return 0


def _run_native(args) -> int:
    """``tuner run --runtime native``: the artifact run by ``tuner-run`` (native/, no Python in the loop), built
    first if needed, with this host's OpenCL environment; its output and exit status are the command's."""
    import subprocess

    from tuner import native
    from tuner.runtime.base import Runtime
    if isinstance(args.device, Runtime):
        raise TunerError(f"--runtime native runs tuner-run on this host; on the phone run it there: adb push the "
                         f"artifact and build/native/tuner-run for Android, then `tuner-run DIR --bench N` "
                         f"(--device {args.device_spec} runs the Python executor through the agent)")
    tool = native.build()["tuner_run"]
    cmd = [str(tool), str(args.artifact), "--bench", str(args.repeat)]
    for item in args.input or []:
        cmd += ["--input", item]
    for item in args.output or []:
        cmd += ["--output", item]
    if args.outputs is not None:
        cmd += ["--outputs", args.outputs]
    if args.profile:
        cmd.append("--profile")
    if args.verify:
        cmd += ["--verify", str(args.verify)]
    if args.device is not None:
        cmd += ["--device", str(args.device)]
    return subprocess.run(cmd, env=native.opencl_env()).returncode


def _tune_shared(args) -> int:
    """``--workers N`` with ``--storage``: register the model's tasks in the shared storage; with N > 0 also run
    N workers here and export the studies into the log."""
    import subprocess

    from tuner.search.worker import export_study_records, register_tasks

    from tuner.scheduler.model import model_worker_tasks
    if not args.storage:
        raise TunerError("--workers needs --storage URL (a PostgreSQL URL, or journal:PATH on one machine)")
    if args.time_budget is not None:
        raise TunerError("--time-budget is not passed to `tuner worker`s: give --trials with --workers")
    tasks, prefix = model_worker_tasks(_model_path(args.model), args.device, args.trials or 200, args.scope,
                                       args.min_trials)
    register_tasks(args.storage, tasks, prefix)
    print(f"registered {len(tasks)} tasks of {args.model} under study prefix {prefix}")
    if args.workers == 0:
        print(f"on each device: tuner worker --storage URL --study-prefix {prefix}")
        return 0
    cmd = [sys.executable, "-m", "tuner", "worker", "--storage", args.storage, "--study-prefix", prefix,
           "--no-progress", "--parallel", str(args.parallel), "--repeats", str(args.repeats),
           "--build-timeout", str(args.build_timeout), "--run-timeout", str(args.run_timeout)]
    if args.device_spec:
        cmd += ["--device", args.device_spec]
    procs = [subprocess.Popen(cmd + ["--seed", str((args.seed + i) % 2**32), "--log", f"{args.log or 'logs/worker'}.{i}.jsonl"])
             for i in range(args.workers)]
    codes = [p.wait() for p in procs]
    from tuner.cli.args import device_info
    from tuner.search.tune import default_log
    log = args.log or default_log(device_info(args.device).fingerprint)
    n = export_study_records(args.storage, prefix, log)
    print(f"{args.workers} workers done (exit codes {codes}); {n} records exported to {log}")
    return 0 if all(c == 0 for c in codes) else 1


def cmd_tune(args) -> int:
    if args.workers is not None:
        if args.transfer_from:
            raise TunerError("--transfer-from is not passed to `tuner worker`s yet: tune without --workers, or "
                             "leave --transfer-from out")
        return _tune_shared(args)

    from tuner.scheduler.model import tune_model
    res = tune_model(_model_path(args.model), log=args.log, trials=args.trials, time_budget=args.time_budget,
                     device=args.device,
                     scope=args.scope, storage=args.storage, sampler=args.sampler, seed=args.seed, dtype=args.dtype,
                     input_shapes=_input_shapes(args.input_shape), min_trials=args.min_trials,
                     options=measure_options(args),
                     progress=not args.no_progress, early_stopping=args.early_stopping,
                     say=lambda line: print(line, flush=True), transfer_from=args.transfer_from,
                     drift_every=_drift_every(args), drift_threshold=args.drift_threshold)
    _print_tune_summary(res)
    return 1 if res.failed else 0


def _drift_every(args) -> int | None:
    """``--drift-check N``: every N measurements (0: never); by default 16 on a device behind the agent (a phone,
    whose clocks and heat drift during a tune), never on a local one."""
    if args.drift_check is not None:
        return args.drift_check or None
    from tuner.agent.transport import is_agent_spec
    return DRIFT_EVERY if is_agent_spec(args.device_spec) else None


DRIFT_EVERY = 16


def _print_tune_summary(res) -> None:
    """Per task its budget, new measurements and best; then the tasks without a valid measurement (they make
    `tuner tune` exit 1) and the model's estimated latency, tuned against fallback configs."""
    from tuner.scheduler.model import describe
    print(f"{len(res.tasks)} tasks, {res.measured} measured now in {res.elapsed_s:.0f} s (planned {res.planned}), "
          f"log {res.log}")
    shown = [tr for tr in res.tasks if tr.records]
    width = max((len(describe(tr.task)) for tr in shown), default=0)  # labels in one column, whole
    for tr in shown:
        b = f"{tr.best.gflops:8.3g} GFLOP/s" if tr.best is not None else f"  {tr.failure_text()}"
        early = "  (stopped early)" if tr.stopped_early else ""
        print(f"  x{tr.task.count} {describe(tr.task):<{width}}  budget {tr.budget:>3}  new {tr.measured:>3}  "
              f"{b}{early}")
    if res.unmeasured:
        print(f"{len(res.unmeasured)} of {len(res.tasks)} tasks not measured (the budget went where the latency was; "
              f"they compile with their fallback or a transferred config):")
        for tr in res.unmeasured:
            print(f"  x{tr.task.count} {describe(tr.task)}")
    if res.failed:
        logged = os.path.isfile(res.log) and os.path.getsize(res.log) > 0
        where = (f"see `tuner logs {res.log}` for the error messages" if logged else
                 f"nothing was measured, so {res.log} holds no error messages")
        print(f"{len(res.failed)} of {len(res.tasks)} tasks have no valid measurement (exit status 1); {where}:")
        for tr in res.failed:
            print(f"  {describe(tr.task)}: {tr.failure_text()}")
    if res.drift is not None:
        g = res.drift
        print(f"drift check: {g.checks} checks, {g.drifts} drifts, waited {g.waited_s:.0f} s, {g.redone} measurements "
              f"redone")
    if res.estimate is not None:
        print(res.estimate.text())


def cmd_demo(args) -> int:
    """The whole flow, briefly: zoo model -> tune a few trials per task -> compile -> run -> onnxruntime."""
    import numpy as np
    import onnxruntime as ort

    from tuner.measure import MeasureOptions
    from tuner.runtime.opencl import open_device
    from tuner.runtime.base import Runtime

    from tuner.compile.compiler import compile_model
    from tuner.runtime.module import load_module
    from tuner.scheduler.model import tune_model
    from tuner.zoo.models import write_model
    dev = args.device if isinstance(args.device, Runtime) else open_device(args.device)
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    model = write_model(args.model, str(out / f"{args.model}.onnx"), input_size=args.input_size)
    print(f"device {dev.info.name} ({dev.fingerprint}); model {model} at {args.input_size}x{args.input_size}")
    log = str(out / "tuning.jsonl")
    t0 = time.perf_counter()
    res = tune_model(model, log=log, trials=args.trials, device=dev, scope=args.scope, min_trials=1,
                     storage=f"sqlite:///{out / 'studies.db'}", options=MeasureOptions(repeats=3), progress=True,
                     compare_scopes=False)
    print(f"tuned {len(res.tasks)} tasks, {res.measured} measurements in {time.perf_counter() - t0:.0f} s -> {log}")
    print(res.estimate.text())
    mod = compile_model(model, log=log, device=dev, scope=args.scope, progress=True, keep=True)
    _print_plan_choice(mod)
    mod.save(out / "artifact")
    mod = load_module(out / "artifact", device=dev)
    x = np.random.default_rng(0).standard_normal(mod.spec.entries[mod.spec.inputs[0]].shape).astype(np.float32)
    y, = mod.run([x])
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    ref, = sess.run(None, {sess.get_inputs()[0].name: x})
    err = float(np.abs(y - ref).max() / max(np.abs(ref).max(), 1e-30))
    lat = statistics.median(mod.time(DEMO_RUNS))
    counts = {}
    for e in mod.spec.entries.values():
        counts[e.storage_scope] = counts.get(e.storage_scope, 0) + 1
    print(f"plan: {', '.join(f'{v} tensors in {k}' for k, v in sorted(counts.items()))}")
    print(mod.memory_summary())
    tuned = sum(n.tuned for n in mod.spec.nodes)
    print(f"{tuned} of {sum(n.template is not None for n in mod.spec.nodes)} layers use tuned configs")
    print(f"latency {lat * 1e3:.3f} ms (median of {DEMO_RUNS}); max relative error vs onnxruntime {err:.2g}")
    print(onnxruntime_comparison(sess, {sess.get_inputs()[0].name: x}, lat, DEMO_RUNS))
    print(demo_closing(dev.info))
    return 0 if err <= 1e-4 else 1


def demo_closing(info) -> str:
    """The demo's last line: what its run stands for on this kind of device (``info``: a DeviceInfo)."""
    if info.type == "CPU":
        return (f"a CPU run ({info.name}) shows the pipeline end to end (tuned, compiled, run, checked against "
                "onnxruntime), not speed: a CPU emulates the textures this tuner plans for. Speed belongs to GPUs: "
                "tune on the one you deploy to (`--device adb://SERIAL`).")
    return (f"on {info.name} ({info.type}) the latency above is this device's, after a brief tune (--trials "
            "raises it); onnxruntime ran on the host CPU, a reference for the outputs more than for speed.")


DEMO_RUNS = 10  # timed runs of the demo's model, ours and onnxruntime's alike


def onnxruntime_comparison(sess, feed: dict, ours_s: float, runs: int) -> str:
    """onnxruntime's latency on the same input (``sess``, an InferenceSession: the median of ``runs`` runs after
    one untimed) and ours (``ours_s`` seconds) against it, as one line: the speed ratio is onnxruntime's latency
    over ours, above 1 where ours is faster."""
    sess.run(None, feed)
    costs = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(None, feed)
        costs.append(time.perf_counter() - t0)
    ref = statistics.median(costs)
    ratio = ref / ours_s if ours_s > 0 else float("inf")
    provider = (sess.get_providers() or ["CPUExecutionProvider"])[0].removesuffix("ExecutionProvider")
    return (f"onnxruntime ({provider}) latency {ref * 1e3:.3f} ms (median of {runs}, same input); ours vs "
            f"onnxruntime: {ratio:.2f}x its speed (ours {'faster' if ratio >= 1 else 'slower'})")


ZOO_SIZE = int_at_least(32, " (the zoo's networks downsample by 32)")
ZOO_NAMES = ("mobilenet_v2, mobilenet_v3_small, pose, resnet18, segmentation, sr_conv_transpose, sr_pixel_shuffle, "
             "ssdlite, style_transfer, unet or yolo")  # tuner.zoo.models.ZOO's (not imported: start-up time)


def register(sub) -> None:
    p = sub.add_parser("zoo", help="write a zoo model (real architecture, random weights) as ONNX")
    p.add_argument("name", help=ZOO_NAMES)
    p.add_argument("-o", "--output", required=True, metavar="FILE")
    p.add_argument("--input-size", type=ZOO_SIZE, default=None, help="input height and width, at least 32 "
                   "(default 224)")
    p.set_defaults(func=cmd_zoo)

    p = sub.add_parser("compile", help="compile an ONNX model with tuned configs into an artifact directory")
    p.add_argument("model", help="ONNX file")
    p.add_argument("--log", metavar="PATH", help="tuning log(s): a file or glob (default: none, fallback configs)")
    p.add_argument("-o", "--output", required=True, metavar="DIR")
    p.add_argument("--target", metavar="PROFILE.json", help="compile for a device that need not be attached: its "
                   "profile from `tuner devices --json --device D` on it (kernels build on its first load there)")
    p.add_argument("--no-progress", action="store_true")
    add_transfer_arg(p, "fill the layers this device has no record of")
    p.add_argument("--plan-timer", choices=("python", "native"), default="python", help="with --scope auto, what "
                   "times the candidate plans: python, this executor (default), or native, tuner-run (the C runtime, "
                   "built from native/ on first use): time them with the runtime that will run the artifact")
    p.add_argument("--sign", metavar="KEYFILE", help="sign the artifact: an HMAC-SHA256 of its manifest under "
                   "the key file's bytes (at least 16), checked by `tuner run --verify` and `tuner-run --verify`")
    p.add_argument("--precision", choices=("mixed", "strict", "off"), default="mixed", help="with --dtype float16: "
                   "mixed (default) runs the model in float32 and float16 on calibration inputs and keeps in float32 the "
                   "nodes whose float16 output overflows, flushes to zero or drifts; strict refuses such a model "
                   "(exit 2) instead; off stores every tensor in float16 unchecked")
    p.add_argument("--calibration", metavar="DIR", help="with --dtype float16: a folder of .npy inputs the precision "
                   "guard runs the model on (default: random normal inputs of the model's input shapes)")
    _add_model_args(p, "texture, buffer, or auto: per layer the scope the log measured faster (default)")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("run", help="run a compiled artifact: latency, outputs, per-layer profile")
    p.add_argument("artifact", metavar="DIR")
    p.add_argument("--input", action="append", metavar="[NAME=]X.npy", help="input array: X.npy for a model of "
                   "one input, else NAME=X.npy once per input (default: fixed random ones)")
    p.add_argument("--output", action="append", metavar="[NAME=]Y.npy", help="save an output, in the model's "
                   "shape: Y.npy the first, NAME=Y.npy that one (repeat for several)")
    p.add_argument("--outputs", metavar="DIR", help="save every output as DIR/NAME.npy")
    p.add_argument("--repeat", "--bench", type=positive_int, default=20, help="timed runs (default 20)")
    p.add_argument("--profile", action="store_true", help="per-layer table; also kept in the user's cache, where "
                   "`tuner report --artifact DIR` reads it (the artifact is never written)")
    p.add_argument("--runtime", choices=("python", "native"), default="python", help="python: this executor "
                   "(default); native: tuner-run, the C runtime (built from native/ on first use)")
    p.add_argument("--verify", metavar="KEYFILE", help="refuse an artifact that is not signed with this key "
                   "(`tuner compile --sign KEYFILE`)")
    add_device_arg(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("tune", help="tune the kernels of an ONNX model, the budget spent where the latency is")
    p.add_argument("model", help="ONNX file")
    p.add_argument("--log", metavar="PATH", help="JSONL log (default logs/<device fingerprint>.jsonl)")
    p.add_argument("--time-budget", type=duration, metavar="DURATION", help="stop after this long (90s, 10m, 1h): "
                   "every task's fallback first, then the tasks with the largest expected cut of the model's latency; "
                   "the log compiles whenever it stops")
    p.add_argument("--trials", type=positive_int, default=None, help="measurements for the whole model (default 200 "
                   "without --time-budget, no limit with it)")
    p.add_argument("--min-trials", type=positive_int, default=MIN_TRIALS, metavar="N",
                   help=f"with --trials, at least this many per task (default {MIN_TRIALS}, what `compare` needs per "
                        "side); with --time-budget alone each task's fallback is measured first")
    p.add_argument("--early-stopping", type=positive_int, metavar="N", help="each task stops after N measurements "
                   "without improvement (its unspent budget goes to other tasks)")
    p.add_argument("--drift-check", type=non_negative_int, metavar="N", help="re-time a reference config every N "
                   "measurements and read the GPU clock with each; on a drift wait for the device and measure again "
                   "what was measured since the last good check (default 16 through the agent, off on a local "
                   "device; 0: off)")
    p.add_argument("--drift-threshold", type=fraction, default=0.08, metavar="F",
                   help="relative change of the reference's time or of the clock that counts as a drift (default 0.08)")
    p.add_argument("--storage", metavar="URL", help="Optuna storage for the tasks' studies (default: in memory, "
                   "rebuilt from the log on each run; required with --workers)")
    p.add_argument("--sampler", choices=("xgb", "tpe", "random"), default="xgb")
    add_seed_arg(p, help="sampler seed, 0 to 2**32-1 (default 0; with --workers, worker i gets seed + i)")
    p.add_argument("--workers", type=non_negative_int, metavar="N", help="with --storage: register the tasks for "
                   "`tuner worker`s (0: register and return; N: also run N workers here, then export their records "
                   "to the log)")
    add_measure_args(p)
    p.add_argument("--no-progress", action="store_true")
    add_transfer_arg(p, "seed each task's study (its first trials and the cost model's transfer)")
    _add_model_args(p, "texture, buffer, or auto: tune both and the boundaries between them (default)")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("demo", help="zoo model -> tune briefly -> compile -> run -> compare with onnxruntime")
    p.add_argument("--model", default="resnet18", choices=("mobilenet_v2", "resnet18"))
    p.add_argument("--input-size", type=ZOO_SIZE, default=64, help="input height and width, at least 32 (default 64)")
    p.add_argument("--trials", type=positive_int, default=48, help="measurements for the whole model (default 48)")
    p.add_argument("--scope", choices=("auto", "texture", "buffer"), default="auto")
    p.add_argument("--dir", default="build/demo", help="where the model, log and artifact go")
    add_device_arg(p)
    p.set_defaults(func=cmd_demo)
