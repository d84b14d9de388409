"""Terminal output: one-line warnings, and plain-text tables that fit the terminal.

``setup_warnings()`` is called once by the ``tuner`` command; ``format_table`` is what ``tuner logs`` and
``tuner compare`` print with.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import warnings

ELLIPSIS = "…"
DEFAULT_WIDTH = 100  # when stdout is not a terminal (a pipe, a file, a test's capture)
MIN_WIDTH = 40
GAP = "  "

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def printable(text: str) -> str:
    """``text`` with every control character (C0, DEL, C1) and lone surrogate escaped as ``\\x1b`` /
    ``\\ud800``: a name an artifact (or any untrusted file) gives is printed as text, never as a terminal
    escape sequence (``ESC ] 0 ; ... BEL`` sets the title, ``ESC [ 2 J`` clears the screen). tuner-run escapes
    the same characters."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text)


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
    in the middle (``conv2d 64->64 3x3 p1 @…+relu [texture]``; a task label is better cut by ``truncate_label``,
    which keeps its shape, kernel and stride)."""
    if len(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    if not middle:
        return text[:width - 1] + ELLIPSIS
    tail = (width - 1) // 2
    return text[:width - 1 - tail] + ELLIPSIS + text[len(text) - tail:]


_PADDING = re.compile(r"p(\d+|\([\d,]+\))")  # a label's padding word: p1, p(1,0)


def truncate_label(text: str, width: int) -> str:
    """A task or workload label (``templates.common.workload_label``: ``depthwise_conv2d 672 5x5 s2 p2 @14x14
    +bias+hardswish [texture]``) cut to ``width`` by what matters least: first the fused epilogue (``+bias``
    left out, then ``+bias+relu`` becomes ``+…``), then the padding, then mixed scopes shortened (``[t/b/b]``),
    then the end of what is left, at a word where one fits; the ``[scopes]`` tail stays. So the channels, kernel
    size and stride, which tell layers apart, are kept longest (never ``@…`` in the middle, hiding ``s2``)."""
    if len(text) <= width:
        return text
    words = text.split(" ")
    tail = [words.pop()] if len(words) > 1 and words[-1].startswith("[") else []
    plain = [w for w in words if not w.startswith("+")]
    fused = [p for w in words if w.startswith("+") for p in w[1:].split("+") if p]
    candidates = []
    if "bias" in fused and len(fused) > 1:  # nearly every convolution has one: the activation tells more
        candidates.append(plain + ["+" + "+".join(p for p in fused if p != "bias")])
    shortened = plain + (["+" + ELLIPSIS] if fused else [])
    candidates += [shortened, [w for w in shortened if not _PADDING.fullmatch(w)]]
    for candidate in candidates:
        line = " ".join(candidate + tail)
        if len(line) <= width:
            return line
    if tail and "/" in tail[0]:  # mixed scopes: [texture/buffer/buffer] -> [t/b/b]
        tail = ["[" + "/".join(s[:1] for s in tail[0].strip("[]").split("/")) + "]"]
        line = " ".join(candidate + tail)
        if len(line) <= width:
            return line
    keep = " ".join(tail)
    room = width - len(keep) - (1 if keep else 0)
    if room < 8:  # not even the template's name and a shape: cut the whole line at its end
        return truncate(text, width)
    head = ""
    for w in candidate:  # whole words while they fit with an ellipsis after them
        nxt = (head + " " + w) if head else w
        if len(nxt) + 1 > room:
            break
        head = nxt
    if not head:
        head = candidate[0][:room - 1]
    return f"{head}{ELLIPSIS}" + (f" {keep}" if keep else "")


def fit_widths(widths: list, width: int | None, steps=()) -> tuple[list, set]:
    """Column widths and the columns to leave out so that a line fits ``width`` characters (two-space gaps).
    ``steps`` are tried in order until it fits: ``("shrink", i, least)`` cuts column ``i`` down to at most
    ``least`` characters (``("shrink", i, least, "middle")``: in the middle; ``"label"``: a task label, by
    ``truncate_label``), ``("drop", i)`` leaves it out.
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
    labels = {step[1] for step in fit if step[-1] == "label"}

    def fmt(r):
        cut = [truncate_label(c, w) if i in labels else truncate(c, w, i in middle)
               for i, (c, w) in enumerate(zip(r, widths))]
        return GAP.join(c.rjust(w) if i in right else c.ljust(w)
                        for i, (c, w) in enumerate(zip(cut, widths)) if i not in dropped).rstrip()
    return "\n".join([fmt(cells[0]), fmt(["-" * w for w in widths])] + [fmt(r) for r in cells[1:]])
