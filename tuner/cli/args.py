"""Argument helpers shared by the command-line modules (``tuner.cli``, ``tuner.cli.model``, ``tuner.cli.search``,
``tuner.cli.analysis``). It imports no command-line module, so each of them can import it."""
from __future__ import annotations

import argparse

from tuner.runtime.choice import DEVICE_ENV


def add_device_arg(parser: argparse.ArgumentParser, help: str = "device index or name substring") -> None:
    """The shared --device option; resolve it with choose_device(args.device)."""
    parser.add_argument("--device", "-d", metavar="SPEC", default=None,
                        help=f"{help} (e.g. 0, pocl, intel, nvidia, cpu; default: ${DEVICE_ENV}, else the first "
                        "GPU that can build programs, else a CPU device that can: see `tuner devices`)")


def device_info(device):
    """The DeviceInfo of ``args.device``: an opened Runtime's (a device agent), or the local device a spec
    names."""
    from tuner.runtime.base import Runtime
    if isinstance(device, Runtime):
        return device.info
    from tuner.runtime.opencl.device import choose_device
    return choose_device(device)


# tuner.scheduler.model.MIN_TRIALS, the default --min-trials of tune, compare and report; a copy, not imported:
# that module imports the compiler, onnx and optuna, seconds of start-up for every command (tests/test_startup.py
# checks that the two agree)
MIN_TRIALS = 5
MAX_SEED = 2**32 - 1  # numpy's and Optuna's samplers take seeds below 2**32
MAX_SECONDS = 7 * 24 * 3600.0  # a timeout of more than a week is a typo (and overflows select() far above)


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def int_at_least(least: int, why: str = ""):
    """argparse type factory: an integer of at least ``least``; ``why`` says what a smaller one would do."""
    def parse(text: str) -> int:
        v = _integer(text)
        if v < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {v}{why}")
        return v
    parse.__name__ = f"integer >= {least}"  # argparse names the type in its 'invalid ... value' message
    return parse


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1 (trials, repeats, build processes, ...: ``--repeats 0`` would
    time nothing, ``--parallel 0`` measure nothing)."""
    return int_at_least(1)(text)


def non_negative_int(text: str) -> int:
    """argparse type: an integer of at least 0."""
    return int_at_least(0)(text)


def seed(text: str) -> int:
    """argparse type: a sampler seed, 0 to 2**32 - 1 (what numpy's and Optuna's random generators take)."""
    v = _integer(text)
    if not 0 <= v <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be an integer from 0 to {MAX_SEED}, got {v}")
    return v


def seconds(text: str) -> float:
    """argparse type: a timeout in seconds, above 0 and at most a week (``inf`` and ``nan`` are refused)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (e.g. 60 or 2.5)") from None
    if not v > 0 or v > MAX_SECONDS:  # `not v > 0` also catches nan
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0 and at most {MAX_SECONDS:.0f} "
                                         f"(a week), got {text}")
    return v


def add_seed_arg(parser: argparse.ArgumentParser, default: int | None = 0, help: str | None = None) -> None:
    """The shared --seed option (0 to 2**32 - 1)."""
    parser.add_argument("--seed", type=seed, default=default, metavar="N",
                        help=help or f"sampler seed, 0 to {MAX_SEED} (default {default})")


def fraction(text: str) -> float:
    """argparse type: a number between 0 and 1 (exclusive of 0)."""
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a fraction between 0 and 1, e.g. 0.08")
    return v


def default_parallel() -> int:
    """Build processes by default: one per CPU, 2 at least and 12 at most (the runner times one config at a time
    while they build the next; compiling is what a measurement mostly waits for)."""
    import os
    return min(12, max(2, os.cpu_count() or 2))


def duration(text: str) -> float:
    """argparse type: a duration, ``90``, ``90s``, ``10m``, ``1.5h`` or ``1h30m`` -> seconds (positive)."""
    import re
    t = text.strip().lower()
    parts = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?", t)
    if not t or parts is None or not any(parts.groups()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: write seconds (90, 90s), minutes (10m), "
                                         f"hours (1h) or a mix (1h30m)")
    h, m, sec = (float(x) if x else 0.0 for x in parts.groups())
    value = h * 3600 + m * 60 + sec
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration must be positive")
    return value


def add_measure_args(parser: argparse.ArgumentParser, parallel_help: str | None = None) -> None:
    """The shared measurement options of `tune`, `tune-op` and `worker`: --parallel, --repeats, --build-timeout
    and --run-timeout, each validated where it enters; ``measure_options(args)`` makes the MeasureOptions."""
    parser.add_argument("--parallel", type=positive_int, default=default_parallel(), metavar="N",
                        help=parallel_help or f"build processes (default: one per CPU, 2 to 12; here {default_parallel()})")
    parser.add_argument("--repeats", type=positive_int, default=5, metavar="N",
                        help="timed runs per config (default 5)")
    parser.add_argument("--build-timeout", type=seconds, default=60.0, metavar="S",
                        help="seconds to build one config before it counts as failed (default 60)")
    parser.add_argument("--run-timeout", type=seconds, default=30.0, metavar="S",
                        help="seconds to run and time one config before it counts as failed (default 30)")


def measure_options(args: argparse.Namespace):
    """The MeasureOptions of the options ``add_measure_args`` added."""
    from tuner.measure import MeasureOptions
    return MeasureOptions(n_parallel=args.parallel, repeats=args.repeats, build_timeout=args.build_timeout,
                          run_timeout=args.run_timeout)


def activation(text: str) -> str:
    """argparse type: a fused activation spec (``relu6``, ``leaky_relu(0.1)``, ...) in its canonical form."""
    from tuner.ir.activations import canonical
    try:
        return canonical(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def writable_file(path: str, flag: str = "-o"):
    """An output file checked before any work is done, by creating it (and removing it again if it did not
    exist): not a folder, its folder exists, and the file can be written. Raises TunerError naming the flag."""
    import os
    from pathlib import Path

    from tuner.errors import TunerError
    p = Path(path)
    try:
        if p.is_dir():
            raise TunerError(f"{flag} {path!r} is a directory; give a file path")
        existed = p.exists()
        with open(p, "ab"):
            pass
    except OSError as e:  # a name too long, a folder that is not one, no permission
        raise TunerError(f"{flag} {path!r} cannot be written ({e.strerror or e}); choose another path") from None
    if not existed:
        try:
            os.unlink(p)
        except OSError:
            pass
    return p


def writable_dir(path: str, flag: str = "-o", create: bool = True):
    """An output folder checked before any work: created if missing, and a file can be written in it. With
    ``create=False`` nothing is left behind: a missing folder is only checked to be creatable (its nearest
    existing parent is a folder this process may write), for a command that makes it once its work succeeded."""
    import os
    import tempfile
    from pathlib import Path

    from tuner.errors import TunerError
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise TunerError(f"{flag} {path!r} exists and is not a folder")
    if not create and not p.is_dir():
        parent = p.absolute().parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir():
            raise TunerError(f"{flag} {path!r} cannot be created or written ({str(parent)!r} is not a folder); "
                             "choose another path")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise TunerError(f"{flag} {path!r} cannot be created or written ({str(parent)!r} is not writable); "
                             "choose another path")
        return p
    try:
        p.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=p, prefix=".write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise TunerError(f"{flag} {path!r} cannot be created or written ({e.strerror or e}); "
                         "choose another path") from None
    return p


# reading a user's file safely lives in tuner.files (search spaces and the frontend read files too)
from tuner.files import file_kind, read_regular_file, regular_file  # noqa: E402,F401


def transfer_from(text: str) -> list:
    """argparse type: ``--transfer-from FINGERPRINT[,FINGERPRINT...]`` or ``auto`` (``tuner.logs.best``'s
    ``parse_transfer_from``: each a device fingerprint, as `tuner devices` and `tuner logs` show them)."""
    from tuner.errors import TunerError
    from tuner.logs.best import parse_transfer_from
    try:
        found = parse_transfer_from(text)
    except TunerError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--transfer-from ")) from None
    if not found:
        raise argparse.ArgumentTypeError("needs a device fingerprint (e.g. nvidia-gpu-fcae3850) or 'auto'")
    return found


def add_transfer_arg(parser: argparse.ArgumentParser, what: str) -> None:
    """The shared --transfer-from option of `compile`, `tune`, `tune-op` and `worker` (``what``: what the records do)."""
    parser.add_argument("--transfer-from", type=transfer_from, metavar="FINGERPRINT[,...]", default=None,
                        help=f"sibling devices (fingerprints, or 'auto': every device of this one's family in "
                        f"the logs) whose tuned records {what}, ranked below this device's own and another "
                        f"driver's, each config checked against this device's limits; read from the logs, else "
                        f"from FINGERPRINT.jsonl beside them or in logs/ (default: none; a sibling in the logs "
                        f"is only pointed out)")
