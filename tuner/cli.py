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
from tuner.runtime.device import DeviceInfo, choose_device, list_devices


def add_device_arg(parser: argparse.ArgumentParser, help: str = "device index or name substring") -> None:
    """The shared --device option; resolve it with choose_device(args.device)."""
    parser.add_argument("--device", "-d", metavar="SPEC", default=None,
                        help=f"{help} (e.g. 0, pocl, nvidia, cpu; default: first GPU, else PoCL CPU)")


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _yes(b: bool) -> str:
    return "yes" if b else "no"


def format_device_table(infos: list[DeviceInfo], default_index: int | None) -> str:
    head = ("", "#", "platform", "device", "type", "images", "image2d max", "max wg", "local mem",
            "fp16", "half img", "fingerprint")
    rows = [("*" if d.index == default_index else "", str(d.index), d.platform, d.name, d.type,
             _yes(d.image_support), f"{d.image2d_max_width}x{d.image2d_max_height}" if d.image_support else "-",
             str(d.max_work_group_size), _bytes(d.local_mem_bytes), _yes(d.fp16), _yes(d.half_images),
             d.fingerprint) for d in infos]
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*r).rstrip() for r in (head, *rows))


def cmd_devices(args: argparse.Namespace) -> int:
    infos = list_devices()
    default = choose_device(None) if infos else None
    if args.device is not None:  # show what a --device SPEC resolves to
        infos = [choose_device(args.device)]
    if args.json:
        print(json.dumps([{**d.to_dict(), "default": default is not None and d.index == default.index}
                          for d in infos], indent=2))
    elif not infos:
        raise TunerError("no OpenCL devices found; `pip install pocl-binary-distribution` provides a CPU device")
    else:
        print(format_device_table(infos, default.index if default else None))
        print("\n* default device (used when --device is not given)")
    return 0


def run_example(name: str, device=None, show_passes: bool = False, show_source: bool = False) -> float:
    """Build one of the seeds' examples, run it on random data and return the max abs error."""
    import numpy as np

    from tuner.ir.examples import EXAMPLES
    from tuner.runtime.launch import build
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
    from tuner.runtime import open_device
    dev = open_device(args.device)
    err = run_example(args.name, dev, args.show_passes, args.show_source)
    print(f"{args.name} on {dev.info.label}: max abs error {err:.3g}")
    return 0 if err <= 1e-5 else 1


def cmd_demo(args: argparse.Namespace) -> int:
    from tuner.ir.examples import EXAMPLES
    from tuner.runtime import open_device
    dev = open_device(args.device)
    print(f"device: {dev.info.label} ({dev.info.name}), image2d max "
          f"{dev.info.image2d_max_width}x{dev.info.image2d_max_height}, fingerprint {dev.fingerprint}")
    worst = 0.0
    for name in EXAMPLES:
        err = run_example(name, dev)
        worst = max(worst, err)
        print(f"  {name:<16} IR -> passes -> OpenCL -> run: max abs error {err:.3g}")
    print("see each pass: tuner example addone --show-passes")
    return 0 if worst <= 1e-5 else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tuner", description=__doc__.splitlines()[0])
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

    p = sub.add_parser("demo", help="run the examples end to end on the default device")
    add_device_arg(p)
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 2 usage or TunerError)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits for --help/--version (0) and usage errors (2)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    try:
        return args.func(args)
    except TunerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
