"""Argument helpers shared by the command-line modules (``tuner.cli``, ``tuner.graph.cli``, ``tuner.search.cli``,
``tuner.analysis.cli``). It imports no command-line module, so each of them can import it."""
from __future__ import annotations

import argparse

from tuner.runtime.device import DEVICE_ENV


def add_device_arg(parser: argparse.ArgumentParser, help: str = "device index or name substring") -> None:
    """The shared --device option; resolve it with choose_device(args.device)."""
    parser.add_argument("--device", "-d", metavar="SPEC", default=None,
                        help=f"{help} (e.g. 0, pocl, intel, nvidia, cpu; default: ${DEVICE_ENV}, else the first "
                        "GPU that can build programs, else a CPU device that can: see `tuner devices`)")


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1 (``--repeats 0`` would time nothing, ``--parallel 0`` hang)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


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
    if p.is_dir():
        raise TunerError(f"{flag} {path!r} is a directory; give a file path")
    existed = p.exists()
    try:
        with open(p, "ab"):
            pass
    except OSError as e:
        raise TunerError(f"{flag} {path!r} cannot be written ({e.strerror or e}); choose another path") from None
    if not existed:
        try:
            os.unlink(p)
        except OSError:
            pass
    return p


def writable_dir(path: str, flag: str = "-o"):
    """An output folder checked before any work: created if missing, and a file can be written in it."""
    import os
    import tempfile
    from pathlib import Path

    from tuner.errors import TunerError
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise TunerError(f"{flag} {path!r} exists and is not a folder")
    try:
        p.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=p, prefix=".write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise TunerError(f"{flag} {path!r} cannot be created or written ({e.strerror or e}); "
                         "choose another path") from None
    return p
