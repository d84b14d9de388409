"""How far a set of timings can be trusted: their spread, the interquartile range over the median (IQR/median).

On a quiet device repeated runs of one model agree within a few percent; on a host where other jobs share the
CPU, or a GPU whose clock is still ramping or throttling, they scatter (a 2-core host with 6 busy processes timed
a model at 10.8 and 14.0 ms against 0.7-1.3 ms quiet). ``tuner run --repeat``, the plan timer of ``tuner compile``
and ``tuner-run --bench`` (``SPREAD_WARN`` in native/src/tuner_run.c, the same value) print the spread and warn above
``SPREAD_WARN`` (``$TUNER_SPREAD_WARN``, a fraction, overrides it in both runtimes: for a device whose timings
always scatter, or to see the warning). The quartiles are numpy's default (linear interpolation), as in C.

Imports nothing heavy: the CLI prints these."""
from __future__ import annotations

SPREAD_WARN = 0.10  # IQR/median above which timings are reported as unreliable (the device busy or its clock moving)


def quantile(sorted_values: list, q: float) -> float:
    """The ``q`` quantile of already sorted values, linearly interpolated (numpy's default method)."""
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def spread(samples) -> float:
    """IQR / median of ``samples``; 0.0 for fewer than two samples or a median of 0."""
    v = sorted(float(x) for x in samples)
    if len(v) < 2:
        return 0.0
    median = quantile(v, 0.5)
    return (quantile(v, 0.75) - quantile(v, 0.25)) / median if median > 0 else 0.0


def spread_warn() -> float:
    """The threshold: ``$TUNER_SPREAD_WARN`` where it is a number of at least 0, else ``SPREAD_WARN``."""
    import os
    try:
        value = float(os.environ.get("TUNER_SPREAD_WARN", ""))
    except ValueError:
        return SPREAD_WARN
    return value if value >= 0 else SPREAD_WARN


def unreliable(value: float, what: str = "the timings") -> str | None:
    """A warning, when ``value`` (a spread) is above the threshold (``spread_warn``), that ``what`` cannot be
    trusted; else None."""
    limit = spread_warn()
    if value <= limit:
        return None
    return (f"{what} vary by {value:.0%} (IQR/median, above {limit:.0%}): the device is busy or its clock is "
            f"changing; stop other work on it (or wait for its clock to settle) and time again")
