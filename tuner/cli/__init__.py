"""Command line: `tuner <command> ...`. A thin layer over the library.

Each subcommand is a function `cmd_<name>(args) -> int` registered in `build_parser()` with
`set_defaults(func=...)`. TunerError from any command becomes `error: <message>`, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from tuner import __version__
from tuner.errors import TunerError
from tuner.cli.args import (activation, add_device_arg, device_info, add_measure_args, add_seed_arg,  # noqa: F401
                            add_transfer_arg,
                            measure_options, positive_int, read_regular_file)  # (importers use the names)
from tuner.cli.parser import Parser
from tuner.runtime.choice import DEVICE_ENV
from tuner.target import DeviceInfo

# Start-up time: this module and the parser (build_parser, the register() of cli/model.py, cli/search.py and
# cli/analysis.py) import no pyopencl, numpy, onnx, onnxruntime, optuna, xgboost, pandas or matplotlib at
# module level; each command imports what it needs when it runs (`tuner --help` in well under a second:
# tests/test_startup.py bounds what it imports).


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _yes(b: bool) -> str:
    return "yes" if b else "no"


def _status(d: DeviceInfo) -> str:
    from tuner.runtime.opencl.device import probe_device
    if d.is_simulator:
        return "simulator"
    return "ok" if probe_device(d) is None else "no build"


def format_device_table(infos: list[DeviceInfo], default_index: int | None) -> str:
    head = ("", "#", "platform", "device", "type", "status", "image2d max", "max wg", "local mem",
            "fp16", "half img", "fingerprint")
    rows = [("*" if d.index == default_index else "", str(d.index), d.platform_tag, d.name[:24], d.type,
             _status(d), f"{d.image2d_max_width}x{d.image2d_max_height}" if d.image_support else "none",
             str(d.max_work_group_size), _bytes(d.local_mem_bytes), _yes(d.fp16), _yes(d.half_images),
             d.fingerprint) for d in infos]
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*r).rstrip() for r in (head, *rows))


def _default_or_reason() -> tuple[DeviceInfo | None, str | None]:
    from tuner.runtime.opencl.device import choose_device
    try:
        return choose_device(None), None
    except TunerError as e:
        return None, str(e)


def cmd_devices(args: argparse.Namespace) -> int:
    from tuner.runtime.opencl.device import choose_device, list_devices, probe_device
    infos = list_devices()
    default, why_none = _default_or_reason() if infos else (None, None)
    from tuner.runtime.base import Runtime
    if isinstance(args.device, Runtime):  # a device agent: the profile its HELLO gave
        info = args.device.info
        if args.json:
            print(json.dumps({**info.to_dict(), "usable": True, "unusable_reason": None,
                              "agent": args.device_spec}, indent=1))
            return 0
        print(format_device_table([info], info.index).replace(" ok ", " agent"))
        print(f"\n* reached through the device agent at {args.device_spec}")
        return 0
    if args.device is not None:  # the device profile of what a --device SPEC resolves to
        info = choose_device(args.device, check=False)
        profile = {**info.to_dict(), "usable": probe_device(info) is None, "unusable_reason": probe_device(info)}
        if args.json:
            print(json.dumps(profile, indent=2))
            return 0
        infos = [info]
    if args.json:
        print(json.dumps([{**d.to_dict(), "default": default is not None and d.index == default.index,
                           "usable": probe_device(d) is None, "unusable_reason": probe_device(d)}
                          for d in infos], indent=2))
        return 0
    if not infos:
        raise TunerError("no OpenCL devices found; `pip install pocl-binary-distribution` provides a CPU device")
    print(format_device_table(infos, default.index if default else None))
    print("\n* default device (used when --device is not given; set $" + DEVICE_ENV + " to change it)")
    for d in infos:
        reason = None if d.is_simulator else probe_device(d)
        if reason:
            print(f"[{d.index}] {d.platform} / {d.name} is never the default: it {reason}")
    if why_none:
        print(f"no default device: {why_none}", file=sys.stderr)
    return 0


def run_example(name: str, device=None, show_passes: bool = False, show_source: bool = False) -> float:
    """Build one of the seeds' examples, run it on random data and return the max abs error."""
    import numpy as np

    from tuner.ir.examples import EXAMPLES
    from tuner.runtime.opencl.launch import build
    if name not in EXAMPLES:
        raise TunerError(f"unknown example {name!r}; examples: {', '.join(EXAMPLES)}")
    factory, reference = EXAMPLES[name]
    trace: list = []
    exe = build(factory(), device, trace=trace)
    if show_passes:
        for pass_name, kernel in trace:
            print(f"===== {kernel.name}: {pass_name} =====\n{kernel}\n")
    if show_source or show_passes:
        print(f"===== OpenCL =====\n{exe.source}")
    rng = np.random.default_rng(0)
    written = {b.name for b in exe.outputs}
    inputs = {b.name: rng.standard_normal(b.declared.shape).astype(b.dtype.numpy)
              for b in exe.program.params if b.name not in written}
    outputs, expected = exe(**inputs), reference(inputs)
    return max(float(np.abs(outputs[k].astype(np.float64) - expected[k]).max()) for k in expected)


def cmd_example(args: argparse.Namespace) -> int:
    from tuner.runtime.opencl import open_device
    _local_only(args, "tuner example")
    dev = open_device(args.device)
    err = run_example(args.name, dev, args.show_passes, args.show_source)
    print(f"{args.name} on {dev.info.label}: max abs error {err:.3g}")
    return 0 if err <= 1e-5 else 1


def cmd_native(args: argparse.Namespace) -> int:
    from tuner.cli.programs import native_main
    return native_main(args.rest or ["-h"])


def _local_only(args: argparse.Namespace, what: str) -> None:
    from tuner.runtime.base import Runtime
    if isinstance(args.device, Runtime):
        raise TunerError(f"{what} runs on a local OpenCL device, not through a device agent ({args.device_spec}); "
                         f"`tuner op --check --time` and `tuner tune-op` measure through one")


def _workload_args() -> dict:
    """Every registered template's workload options: flag -> [(template name, WorkloadArg)]."""
    from tuner.templates import templates
    out: dict = {}
    for t in templates().values():
        for a in t.workload_args:
            out.setdefault(a.flag, []).append((t.name, a))
    return out


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """The template and its workload's fields, as each template declares them (``Template.workload_args``)."""
    from tuner.templates import templates
    p.add_argument("template", choices=tuple(templates()), help="operator template")
    for flag, uses in _workload_args().items():
        a = uses[0][1]
        if a.kind == "flag":
            p.add_argument(flag, action="store_true", help=a.help)
            continue
        kinds = {"activation": dict(type=activation), "dtype": dict(choices=("float32", "float16"))}
        metavars = {}
        for name, use in uses:  # e.g. --data: conv2d N,C,H,W; dense N,K
            metavars.setdefault(use.metavar, []).append(name)
        shapes = "; ".join(f"{', '.join(names)} {m}" for m, names in metavars.items() if m)
        text = a.help + (f": {shapes}" if a.kind == "shape" else "")
        p.add_argument(flag, metavar=a.metavar if len(metavars) == 1 else "SHAPE", help=text or None,
                       **kinds.get(a.kind, dict(choices=a.choices) if a.choices else {}))
    p.add_argument("--scope", choices=("texture", "buffer"), help="scope of every operand (default: the "
                   "fallback's choice for the device)")


def workload_from_args(args):
    """The template and workload the options describe: the template's fields, each parsed by its kind."""
    from tuner.op import make_workload
    from tuner.templates import get_template
    t = get_template(args.template)
    mine = {a.flag: a for a in t.workload_args}
    fields = {}
    for flag, uses in _workload_args().items():
        value = getattr(args, uses[0][1].name)
        if flag not in mine:
            if value not in (None, False):
                raise TunerError(f"{t.name} takes no {flag}; its workload options: "
                                 + ", ".join(f"{f} {a.metavar}".strip() for f, a in mine.items()))
        elif value is None:
            if mine[flag].required:
                raise TunerError(f"{t.name} needs {flag} {mine[flag].metavar}")
        else:
            fields[mine[flag].name] = mine[flag].parse(value)
    return t, make_workload(t, **fields)


def _scopes(args) -> dict:
    return {f"{k}_scope": args.scope for k in ("input", "weight", "output")} if args.scope else {}


def cmd_space(args: argparse.Namespace) -> int:
    from tuner.search_space import load_space
    from tuner.templates import get_template
    t = get_template(args.template)
    if args.file:
        import dataclasses
        space = load_space(args.file, {f.name for f in dataclasses.fields(t.config)}, set(t.variables),
                           template={t.name, t.space().template}, is_path=True)
    else:
        space = t.space()
    print(f"search space {space.template}: {space.path}")
    for title, table in (("task knobs (fixed per tuning task)", space.task), ("knobs", space.knobs)):
        print(f"{title}:")
        for name, choices in table.items():
            print(f"  {name:<14} {', '.join(json.dumps(c) for c in choices)}")
    print("constraints:")
    for c in space.constraints:
        print(f"  {c.name:<20} {c.text}")
    print(f"unconstrained size: {space.total:,}")
    if any(getattr(args, a.name) not in (None, False) for a in t.workload_args):  # a workload given: count
        t, wl = workload_from_args(args)
        info = device_info(args.device)
        bound = space.bind(t.space_vars(wl), info, {"dtype": wl.dtype, **_scopes(args)})
        print(f"valid configs for {json.dumps(wl.key())} on {info.label} ({info.fingerprint}): "
              f"{bound.size():,}")
    return 0


def _config_overrides(text: str | None) -> dict:
    """``--config``: a JSON object of knob values, or the path of a file holding one."""
    if text is None:
        return {}
    import os
    example = "e.g. --config '{\"tile_ow\": 4}'"
    source, where = text, "--config"
    if not text.lstrip().startswith(("{", "[")):  # a path, unless it is some other JSON value
        if os.path.lexists(text) or not _is_json(text):
            hint = f"give a JSON object of knob values ({example}) or the path of a file holding one"
            if not os.path.lexists(text):
                raise TunerError(f"cannot read --config file {text!r}: no such file; {hint}")
            where = f"--config file {text!r}"
            source = read_regular_file(text, "--config file", hint).decode("utf-8", errors="replace")
    try:
        values = json.loads(source)
    except (json.JSONDecodeError, RecursionError) as e:
        raise TunerError(f"{where} is not valid JSON ({e}); {example}") from None
    if not isinstance(values, dict):
        raise TunerError(f"{where} must be a JSON object of knob values, {example}")
    return values


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def cmd_op(args: argparse.Namespace) -> int:
    import dataclasses

    from tuner.op import make_config, run_op
    from tuner.runtime.opencl import open_device
    from tuner.runtime.base import Runtime
    t, wl = workload_from_args(args)
    dev = args.device if isinstance(args.device, Runtime) else open_device(args.device)
    cfg = make_config(t, wl, dev, _config_overrides(args.config), **_scopes(args))
    res = run_op(t, wl, cfg, dev, check=args.check, time=args.time, repeats=args.repeats)
    if args.show_source:
        print(res.source)
    if args.json:
        print(json.dumps(res.to_dict()))
        return 0 if res.ok else 1
    print(f"{t.name} {json.dumps(wl.key())}")
    print(f"config {json.dumps(dataclasses.asdict(cfg))}")
    print(f"device {dev.info.label} ({dev.info.name}), {dev.fingerprint}; {wl.flops / 1e9:.4g} GFLOP")
    if args.check:
        verdict = "ok" if res.ok else "FAILED"
        print(f"check: max relative error {res.max_rel_error:.3g} (tolerance {res.tolerance:g}) {verdict}")
    if args.time:
        print(f"time: median {res.median * 1e3:.4g} ms over {len(res.costs)} runs, {res.gflops:.3g} GFLOP/s")
    return 0 if res.ok else 1


def cmd_tune_op(args: argparse.Namespace) -> int:
    import dataclasses

    from tuner.runtime.opencl.device import choose_device
    from tuner.search import tune
    from tuner.runtime.base import Runtime
    t, wl = workload_from_args(args)
    info = args.device if isinstance(args.device, Runtime) else choose_device(args.device)
    scopes = {k: args.scope for k in ("input", "weight", "output")} if args.scope else None
    options = measure_options(args)
    res = tune(t.name, wl, info, trials=args.trials, log=args.log, storage=args.storage, sampler=args.sampler,
               scopes=scopes, seed=args.seed, early_stopping=args.early_stopping, options=options,
               progress=not args.no_progress, transfer_from=args.transfer_from)
    print(f"study {res.study_name}: {res.measured} measured, {res.reused} answered from the log ({res.log})")
    failures: dict = {}
    for r in res.records:
        if not r.ok:
            failures[r.error_name] = failures.get(r.error_name, 0) + 1
    if failures:
        print("failures: " + ", ".join(f"{k} {v}" for k, v in sorted(failures.items())))
    if res.best is None:
        print("no config succeeded")
        return 1
    b = res.best
    print(f"best: {b.median_s * 1e3:.4g} ms, {b.gflops:.3g} GFLOP/s (max relative error {b.max_rel_error:.2g})")
    print(f"config {json.dumps(b.config)}")
    fallback = dataclasses.asdict(t.fallback(wl, getattr(info, "info", info)))
    if fallback == b.config:
        print("(the fallback config)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="tuner", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"tuner {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("devices", help="list OpenCL devices and their texture limits")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    add_device_arg(p, help="show only the device this spec selects")
    p.set_defaults(func=cmd_devices)

    p = sub.add_parser("example", help="lower and run one of the source documents' examples")
    p.add_argument("name", help="addone (texture RFC A0) or nhwc_to_nchwc (RFC 0039)")
    p.add_argument("--show-passes", action="store_true", help="print the IR after every lowering pass")
    p.add_argument("--show-source", action="store_true", help="print the generated OpenCL")
    add_device_arg(p)
    p.set_defaults(func=cmd_example)

    p = sub.add_parser("space", help="show a template's search space and count its valid configs")
    add_workload_args(p)
    p.add_argument("--file", metavar="TOML", help="validate this search-space file instead of the shipped one")
    add_device_arg(p)
    p.set_defaults(func=cmd_space)

    p = sub.add_parser("op", help="build, check and time one operator")
    add_workload_args(p)
    p.add_argument("--config", metavar="JSON", help="knob values over the fallback config (JSON or a file)")
    p.add_argument("--check", action="store_true", help="compare with the NumPy reference; exit 1 above tolerance")
    p.add_argument("--time", action="store_true", help="print the median kernel time and GFLOP/s")
    p.add_argument("--repeats", type=positive_int, default=10, help="timed runs for --time (default 10)")
    p.add_argument("--show-source", action="store_true", help="print the generated OpenCL")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    add_device_arg(p)
    p.set_defaults(func=cmd_op)

    p = sub.add_parser("tune-op", help="tune one operator: an Optuna study with an XGBoost cost model")
    add_workload_args(p)
    p.add_argument("--trials", type=positive_int, default=32, help="configs to measure (default 32)")
    p.add_argument("--sampler", choices=("xgb", "tpe", "random"), default="xgb")
    p.add_argument("--log", metavar="PATH", help="JSONL log (default logs/<device fingerprint>.jsonl)")
    p.add_argument("--storage", metavar="URL", help="Optuna storage (default sqlite:///logs/studies.db beside "
                   "the log); a re-run resumes its study")
    add_seed_arg(p)
    p.add_argument("--early-stopping", type=positive_int, metavar="N",
                   help="stop after N measurements without improvement")
    add_measure_args(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_transfer_arg(p, "seed the study (their best configs of this workload first, their records in the cost "
                     "model's transfer)")
    add_device_arg(p)
    p.set_defaults(func=cmd_tune_op)

    p = sub.add_parser("native", add_help=False, help="build the native programs from native/ with the system C "
                       "compiler: `tuner native build` prints `runtime PATH` and `agent PATH` lines")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_native)

    from tuner.cli.model import register as register_model_commands
    register_model_commands(sub)  # zoo, compile, run, tune, demo
    from tuner.cli.search import register as register_worker
    register_worker(sub)  # worker
    from tuner.cli.analysis import register as register_analysis
    register_analysis(sub)  # logs, compare, report
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 2 usage or TunerError)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["native"]:  # its own parser: `tuner native -h`, `tuner native build --target ...`
        try:
            return cmd_native(argparse.Namespace(rest=argv[1:]))
        except SystemExit as e:  # its argparse: --help (0) or a usage error (2)
            return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits for --help/--version (0) and usage errors (2)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    agent = None
    try:
        agent = _open_agent(args)
        return args.func(args)
    except TunerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: what was measured is in the log already; a re-run resumes
        print("interrupted; what was measured is saved, run the command again to resume", file=sys.stderr)
        return 130
    finally:
        if agent is not None:
            agent.close()


def _open_agent(args: argparse.Namespace):
    """``--device exec://...``, ``tcp://...`` or ``adb://...``: connect to the device agent once, before the
    command runs, and hand the command its Runtime as ``args.device`` (the spec stays in ``args.device_spec``
    for workers the command starts). Every command then reaches the device through the same seam as a local
    one. None for a local device."""
    from tuner.agent.transport import is_agent_spec
    spec = getattr(args, "device", None)
    args.device_spec = spec
    if not is_agent_spec(spec):
        return None
    from tuner.agent import open_agent
    kwargs = {}
    if getattr(args, "build_timeout", None):
        kwargs["build_timeout"] = args.build_timeout
    if getattr(args, "run_timeout", None):
        kwargs["run_timeout"] = args.run_timeout
    args.device = open_agent(spec, **kwargs)
    return args.device




def run() -> None:
    """The console entry point (`tuner`, `python -m tuner`): warnings on one line each, once; then main() (cache
    folders are checked where OpenCL is first loaded: tuner.runtime.opencl.cache_folders)."""
    from tuner.console import setup_warnings
    setup_warnings()
    try:
        code = main()
        import signal
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # done: a Ctrl-C now has nothing left to interrupt
        sys.stdout.flush()
    except KeyboardInterrupt:  # between the command's end and here
        code = 130
    except BrokenPipeError:  # `tuner ... | head`: the reader left; say nothing more (no traceback)
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 141
    sys.exit(code)


if __name__ == "__main__":
    run()
