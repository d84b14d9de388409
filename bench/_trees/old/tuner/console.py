"""Terminal output: one-line warnings, and plain-text tables that fit the terminal.

``setup_warnings()`` is called once by the ``tuner`` command; ``format_table`` is what ``tuner logs`` and
``tuner compare`` print with.
"""
from __future__ import annotations

import os
import shutil
import sys
import warnings

ELLIPSIS = "…"
DEFAULT_WIDTH = 100  # when stdout is not a terminal (a pipe, a file, a test's capture)
MIN_WIDTH = 40
GAP = "  "

# ----------------------------------------------------------------------------------------------- warnings

_shown: set = set()  # (category, message) already printed by this process


def _one_line(message) -> str:
    return " ".join(str(message).split())


def format_warning(message, category, filename=None, lineno=None, line=None) -> str:
    """``warning: <message> (<Category>)``: one line, no source file or line."""
    return f"warning: {_one_line(message)} ({category.__name__})\n"


def show_warning(message, category, filename=None, lineno=None, file=None, line=None) -> None:
    """Print a warning as ``format_warning`` words it, each distinct message once per process."""
    key = (category, _one_line(message))
    if key in _shown:
        return
    _shown.add(key)
    stream = file if file is not None else sys.stderr
    if stream is None:  # pythonw: no stderr
        return
    try:
        stream.write(format_warning(message, category))
    except OSError:  # a closed pipe must not turn a warning into a crash
        pass


def setup_warnings() -> None:
    """Every Python warning on one line, ``warning: <message> (<Category>)``, each distinct message once per
    process (whatever the filters' per-location registries would repeat). Idempotent."""
    warnings.formatwarning = format_warning
    warnings.showwarning = show_warning


# ------------------------------------------------------------------------------------------------- tables

def terminal_width(default: int = DEFAULT_WIDTH) -> int:
    """Columns of the terminal stdout writes to; ``default`` when stdout is not a terminal (``COLUMNS``
    overrides both)."""
    isatty = getattr(sys.stdout, "isatty", None)
    if "COLUMNS" not in os.environ and not (isatty and isatty()):
        return default
    return max(MIN_WIDTH, shutil.get_terminal_size((default, 24)).columns)


def truncate(text: str, width: int, middle: bool = False) -> str:
    """``text`` cut to ``width`` characters with an ellipsis where it was cut: at the end, or with ``middle``
    in the middle, which keeps a label's tail (``conv2d 64->64 3x3 p1 @…+relu [texture]``)."""
    if len(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    if not middle:
        return text[:width - 1] + ELLIPSIS
    tail = (width - 1) // 2
    return text[:width - 1 - tail] + ELLIPSIS + text[len(text) - tail:]


def fit_widths(widths: list, width: int | None, steps=()) -> tuple[list, set]:
    """Column widths and the columns to leave out so that a line fits ``width`` characters (two-space gaps).
    ``steps`` are tried in order until it fits: ``("shrink", i, least)`` cuts column ``i`` down to at most
    ``least`` characters (``("shrink", i, least, "middle")``: in the middle), ``("drop", i)`` leaves it out.
    Columns no step names are never cut; None: no limit."""
    widths, dropped = list(widths), set()
    for step in steps if width is not None else ():
        kept = [w for i, w in enumerate(widths) if i not in dropped]
        over = sum(kept) + len(GAP) * (len(kept) - 1) - width
        if over <= 0:
            break
        kind, i = step[0], step[1]
        if kind == "drop":
            dropped.add(i)
        elif kind == "shrink":
            widths[i] = max(min(step[2], widths[i]), widths[i] - over)
        else:
            raise ValueError(f"table fitting step {step!r}: expected ('shrink', column, width) or ('drop', column)")
    return widths, dropped


def format_table(headers: list, rows: list, right=frozenset(), width: int | None = None, fit=()) -> str:
    """Plain text columns; ``right``: indices of right-aligned (numeric) columns. With ``width``, the steps of
    ``fit`` (see ``fit_widths``) cut long text columns with an ellipsis, or leave columns out, until a line
    fits; the data itself is never changed (exports keep every character)."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in r] for r in rows]
    widths, dropped = fit_widths([max(len(r[i]) for r in cells) for i in range(len(headers))], width, fit)
    middle = {step[1] for step in fit if step[-1] == "middle"}

    def fmt(r):
        cut = [truncate(c, w, i in middle) for i, (c, w) in enumerate(zip(r, widths))]
        return GAP.join(c.rjust(w) if i in right else c.ljust(w)
                        for i, (c, w) in enumerate(zip(cut, widths)) if i not in dropped).rstrip()
    return "\n".join([fmt(cells[0]), fmt(["-" * w for w in widths])] + [fmt(r) for r in cells[1:]])
