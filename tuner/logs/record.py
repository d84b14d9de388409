"""One tuning measurement as a self-describing JSON line, and the one check every reader applies to it.

A record carries everything needed to reuse it later without the process that made it: the canonical
workload key, every knob of the config, the device fingerprint (indices change, fingerprints don't) and
the error code of a failure, since failures are as informative to a cost model as timings.

A log is a file users share, edit and concatenate, so every reader (``tuner logs`` and the analysis frame,
``apply_history_best`` when compiling, the tuner resuming from its log, transfer from sibling logs, ``tuner
logs --merge``) reads a line with ``parse_line`` and ``Record.from_dict``, which check it with
``validate_record``: one set of rules, so a line one reader skips is never deployed or plotted by another.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import statistics
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from itertools import accumulate

import tuner
from tuner.errors import ErrorCode, TunerError

SCHEMA_VERSION = 1

SCOPE_OPERANDS = ("input", "weight", "output")

# Fields a line must have to be a record at all; the rest default, so adding an optional field later
# does not turn old logs into garbage.
REQUIRED = ("version", "template", "workload", "scopes", "config", "device", "error_code")


SCOPES = ("texture", "buffer")
FIX = "; the line is skipped: re-measure the config, or delete or correct the line"

# Sizes and ranges a real record stays far inside; past them a line is corrupted or hostile, and is refused
# before it can cost memory, recursion or a wrong plot.
MAX_LINE_BYTES = 1 << 20  # a record is a few KiB (672 costs, the 99th percentile of a real log: 15 KiB)
MAX_DEPTH = 32  # a record nests 3 levels; json.loads recurses once per level (RecursionError near 1,000)
MAX_INT = 2 ** 53  # exact in a float64, so every JSON reader (pyarrow, pandas, a browser) reads the same value
MAX_TRIAL = 2 ** 31 - 1
MIN_SECONDS, MAX_SECONDS = 1e-9, 86400.0  # no kernel runs in under a nanosecond or for more than a day
# the costs a new record keeps: a fast GPU times a small kernel thousands of times per measurement (on the H200 a
# 5-minute tune of MobileNetV3-Large logged a median 1,687 costs a record, 26 KB, a 51 MB log); past this, the
# record keeps this many order statistics of them (the smallest, the largest and evenly spaced ranks between),
# so the median, the spread and the extremes stay, and a record stays a few KiB
MAX_COSTS = 128
MAX_NAME = 256  # characters of a name (template, device, knob value, study, ...)
MAX_MESSAGE = 1 << 16  # characters of an error message (the tuner keeps 4,000)
# The device's state when it was measured (tuner.measure.sensors reads them, with the same bounds)
CLOCK_MAX_HZ = 10 ** 11  # gpu_clock_hz: 1 Hz to 100 GHz
TEMP_MIN_C, TEMP_MAX_C = -60.0, 200.0  # temp_c, degrees C
MAX_REPLACES = 64  # timestamps a redone measurement names (``replaces``: the records it supersedes)

# Knobs added to a template after logs were first written. A record without one ran the kernel the knob's
# default still builds (the config dataclass's default), so it is read with that default; any other missing
# knob means a damaged or hand-made record, which must not be deployed with a default it was never measured
# with.
LATE_KNOBS = {"conv2d": ("local_input", "compute", "split_k", "keep_norm_factors"),
              "depthwise_conv2d": ("local_input", "compute"),
              "dense": ("compute", "pool_stage"), "winograd2": ("split_k",), "winograd4": ("split_k",),
              "se_gate": ("excite_split", "unroll", "partial_squeeze", "last_group")}

# Characters that have no place in a log's text and can disguise it on a terminal or in a report: C0 and C1
# controls, bidi overrides, embeddings and isolates (U+202E turns "conv2d" into "d2vnoc"), zero-width and
# invisible format characters, line and paragraph separators, lone surrogates. Error messages (compiler
# output) keep tabs and newlines.
_INVISIBLE = ("\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb\ud800-\udfff")
_UNSAFE_NAME = re.compile(f"[\x00-\x1f\x7f-\x9f{_INVISIBLE}]")
_UNSAFE_MESSAGE = re.compile(f"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f{_INVISIBLE}]")


class InvalidRecordError(TunerError, ValueError):
    """A JSON line that is not a valid record: names the field, what it holds and what it should hold.
    ``kind`` is the kind of problem, in a few words: readers count skipped lines per kind."""
    kind = "an invalid value"

    def __init__(self, message: str, kind: str | None = None):
        super().__init__(message)
        if kind:
            self.kind = kind


class MissingFieldError(InvalidRecordError, KeyError):
    kind = "a missing field"
    __str__ = Exception.__str__  # not KeyError's repr of the message


class FieldTypeError(InvalidRecordError, TypeError):
    kind = "a field of the wrong type"


# kinds of InvalidRecordError besides the classes' own
NOT_JSON = "torn or not JSON"
TOO_LONG = f"longer than {MAX_LINE_BYTES >> 20} MiB"
TOO_DEEP = f"nested deeper than {MAX_DEPTH} levels"
NEWER = "from a newer tuner"
UNSAFE_TEXT = "text with control or bidi characters, or too long"
UNKNOWN_TEMPLATE = "an unknown template"
BAD_WORKLOAD = "a workload its template rejects"
BAD_CONFIG = "a config its template rejects (missing, unknown or mistyped knobs)"


# ----------------------------------------------------------------------------------------------- a line

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)  # a JSON string, or the rest of a torn one
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
_NOT_BRACKET = bytes(c for c in range(256) if c not in _STEP)


def too_deep(raw: bytes) -> bool:
    """Whether a JSON text nests deeper than ``MAX_DEPTH``, found without parsing it: json.loads recurses once
    per level, so a line of 100,000 ``[`` raises RecursionError (or worse) inside it. Fewer brackets than the
    limit cannot nest past it (every real record: one count, no scan); otherwise strings, which may hold
    brackets, are dropped and the depth is the running sum of the brackets left, all in linear time."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return False
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKET)
    return max(accumulate(_STEP[c] for c in brackets), default=0) > MAX_DEPTH


def parse_line(raw: bytes):
    """One log line (bytes, its newline optional) -> its JSON value. A line longer than ``MAX_LINE_BYTES`` or
    nested deeper than ``MAX_DEPTH`` is refused before json.loads spends memory or recursion on it; anything
    json.loads rejects (a torn line, bad UTF-8, a 5,000-digit number) is an ``InvalidRecordError`` too, so a
    reader catches one exception type and counts the line by its ``kind``."""
    if len(raw) > MAX_LINE_BYTES:
        raise InvalidRecordError(f"a line of more than {MAX_LINE_BYTES:,} bytes (a record takes a few KiB){FIX}",
                                 TOO_LONG)
    if too_deep(raw):
        raise InvalidRecordError(f"a line nested deeper than {MAX_DEPTH} levels (a record nests 3){FIX}", TOO_DEEP)
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise InvalidRecordError(f"not a line of JSON ({_cut(str(e))}): torn by a killed writer or corrupted{FIX}",
                                 NOT_JSON) from None


def check_line(raw: bytes) -> dict:
    """A log line as a checked record dict, as ``Record.from_dict`` reads it: ``gflops`` recomputed from the
    workload's flops and the median (a line's own is never trusted) and ``error_name`` filled from the code.
    ``InvalidRecordError`` (with its ``kind``) when the line is not a valid record."""
    d = parse_line(raw)
    gflops = _check(d)
    return {**d, "gflops": gflops, "error_name": d.get("error_name", ErrorCode(d["error_code"]).name)}


# -------------------------------------------------------------------------------------------- the checks

def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _time(x) -> bool:
    """A finite, non-negative number of seconds (or GFLOP/s, or relative error)."""
    return _number(x) and math.isfinite(x) and x >= 0


def _typed(d: dict, k: str, types: tuple, what: str, optional: bool = False) -> None:
    v = d.get(k)
    if (v is None and optional) or (isinstance(v, types) and (bool in types or not isinstance(v, bool))):
        return
    raise FieldTypeError(f"record field {k!r} is {type(v).__name__} {_show(v)}, not {what}{FIX}")


def _show(v) -> str:
    """A value in an error message: JSON with non-ASCII escaped (a bidi override in a log must not reach the
    terminal through the warning about it), cut to 40 characters."""
    text = json.dumps(v) if not isinstance(v, float) or math.isfinite(v) else str(v)
    return _cut(text, 40)


def _cut(text: str, n: int = 200) -> str:
    return text if len(text) <= n else text[:n - 1] + "…"


# field -> the types it holds (NoneType: it may be null) and what a message says it should hold
_TYPES = {**{k: ((int,), "an integer") for k in ("version", "error_code")},
          **{k: ((dict,), "an object") for k in ("workload", "scopes", "config")},
          **{k: ((str,), "a string") for k in ("template", "device", "device_name", "platform", "driver",
                                               "error_name", "error_msg", "timestamp", "tuner_version")},
          **{k: ((str, type(None)), "a string or null") for k in ("sampler", "study")}}
_NAMES = ("template", "device", "device_name", "platform", "driver", "error_name", "timestamp", "tuner_version",
          "sampler", "study")


def _check_text(where: str, text: str, message: bool = False) -> None:
    """A string of a record: bounded, and free of characters that make it read as something else."""
    limit, unsafe = (MAX_MESSAGE, _UNSAFE_MESSAGE) if message else (MAX_NAME, _UNSAFE_NAME)
    if len(text) > limit:
        raise InvalidRecordError(f"{where} is {len(text):,} characters long; at most {limit:,}{FIX}", UNSAFE_TEXT)
    bad = unsafe.search(text)
    if bad:
        raise InvalidRecordError(f"{where} holds the invisible or control character U+{ord(bad.group()):04X} at "
                                 f"character {bad.start()}: text in a log must read as what it is{FIX}", UNSAFE_TEXT)


def _check_texts(d: dict) -> None:
    """The record's names and its config's string knobs, in one scan when they are clean (every real record:
    this runs once per line of a log), field by field to name the culprit when they are not."""
    names = {k: d[k] for k in _NAMES if isinstance(d.get(k), str)}
    knobs = {k: v for k, v in d["config"].items() if isinstance(v, str)}
    texts = [*names.values(), *knobs.values()]
    if max(map(len, texts), default=0) > MAX_NAME or _UNSAFE_NAME.search("".join(texts)):
        for k, text in names.items():
            _check_text(f"record field {k!r}", text)
        for k, text in knobs.items():
            _check_text(f"record config knob {k!r}", text)
    if isinstance(d.get("error_msg"), str):
        _check_text("record field 'error_msg'", d["error_msg"], message=True)


def _check_times(d: dict) -> None:
    for k in ("median_s", "gflops", "max_rel_error"):
        if d.get(k) is not None and not _time(d[k]):
            _typed(d, k, (int, float), "a number or null")
            raise InvalidRecordError(f"record field {k!r} is {_show(d[k])}: it must be a finite number >= 0 or "
                                     f"null{FIX}")
    if "duration_s" in d and not (_time(d["duration_s"]) and d["duration_s"] <= MAX_SECONDS):
        _typed(d, "duration_s", (int, float), "a number")
        raise InvalidRecordError(f"record field 'duration_s' is {_show(d['duration_s'])}: it must be a finite "
                                 f"number of seconds from 0 to {MAX_SECONDS:g}{FIX}")
    if "costs" in d:
        _typed(d, "costs", (list,), "a list of seconds")
        if not _costs_ok(d["costs"]):
            bad = next(c for c in d["costs"] if not (_time(c) and c <= MAX_SECONDS))
            error = InvalidRecordError if _number(bad) else FieldTypeError
            raise error(f"record field 'costs' holds {_show(bad)}: every cost must be a finite number of seconds "
                        f"from 0 to {MAX_SECONDS:g}{FIX}")


def order_statistics(costs: list, most: int) -> list:
    """``costs`` as is when it holds at most ``most`` values, else ``most`` of its order statistics: ranks evenly
    spaced from the smallest to the largest, ascending (the median of the whole lies between two of them)."""
    if len(costs) <= most:
        return list(costs)
    ranked = sorted(costs)
    last = len(ranked) - 1
    return [ranked[round(i * last / (most - 1))] for i in range(most)]


def _costs_ok(costs: list) -> bool:
    """Every cost a finite number of seconds from 0 to ``MAX_SECONDS``, in a few C-level passes (a log holds
    millions of costs): a NaN or an infinity makes the sum non-finite."""
    if not costs:
        return True
    if not set(map(type, costs)) <= {float, int}:
        return False
    return math.isfinite(sum(costs)) and min(costs) >= 0 and max(costs) <= MAX_SECONDS


def _check_success(d: dict) -> None:
    """A success's timing is what its best is chosen by: a median a kernel can take (not 0, which made a
    0 ms, 0 GFLOP/s best), positive costs, and the median among them."""
    median, costs = d.get("median_s"), d.get("costs") or []
    if d["error_code"] != ErrorCode.NO_ERROR:
        return
    if median is None:  # listed among the failures as "NO_ERROR" before: a success is a measured time
        raise InvalidRecordError(f"record field 'median_s' is null in a success (error_code 0): a success has a "
                                 f"measured time{FIX}")
    if not MIN_SECONDS <= median <= MAX_SECONDS:
        raise InvalidRecordError(f"record field 'median_s' is {_show(median)} in a success: a measured time is "
                                 f"from {MIN_SECONDS:g} to {MAX_SECONDS:g} s{FIX}")
    if costs and (min(costs) <= 0 or not min(costs) <= median <= max(costs)):
        raise InvalidRecordError(f"record field 'median_s' is {_show(median)} but its costs range from "
                                 f"{_show(min(costs))} to {_show(max(costs))}: a median lies among positive costs"
                                 f"{FIX}")


def _check_device_state(d: dict) -> None:
    """``gpu_clock_hz`` (an integer number of Hz) and ``temp_c`` (degrees C), each null where the device did not
    expose it; ``replaces`` (a redone measurement's: the timestamps of the records of the same config it
    supersedes, ``tuner.logs.index.current``) a short list of clean strings."""
    hz, temp = d.get("gpu_clock_hz"), d.get("temp_c")
    if hz is not None:
        _typed(d, "gpu_clock_hz", (int,), "an integer number of Hz or null")
        if not 1 <= hz <= CLOCK_MAX_HZ:
            raise InvalidRecordError(f"record field 'gpu_clock_hz' is {_show(hz)}: a GPU clock is from 1 Hz to "
                                     f"{CLOCK_MAX_HZ:g} Hz, or null where the device does not expose it{FIX}")
    if temp is not None:
        _typed(d, "temp_c", (int, float), "a number of degrees C or null")
        if not (math.isfinite(temp) and TEMP_MIN_C <= temp <= TEMP_MAX_C):
            raise InvalidRecordError(f"record field 'temp_c' is {_show(temp)}: a temperature is from "
                                     f"{TEMP_MIN_C:g} to {TEMP_MAX_C:g} degrees C, or null where the device does "
                                     f"not expose it{FIX}")
    replaces = d.get("replaces")
    if replaces is not None:
        _typed(d, "replaces", (list,), "a list of timestamps")
        if len(replaces) > MAX_REPLACES:
            raise InvalidRecordError(f"record field 'replaces' names {len(replaces)} records; at most "
                                     f"{MAX_REPLACES}{FIX}")
        for ts in replaces:
            if not isinstance(ts, str) or not ts.strip():
                raise FieldTypeError(f"record field 'replaces' holds {_show(ts)}: each entry is the timestamp of "
                                     f"a record this one supersedes{FIX}")
            _check_text("record field 'replaces'", ts)


def _check_trial(d: dict) -> None:
    if d.get("trial") is not None:
        _typed(d, "trial", (int,), "an integer or null")
        if not 0 <= d["trial"] <= MAX_TRIAL:
            raise InvalidRecordError(f"record field 'trial' is {_show(d['trial'])}: it must be from 0 to "
                                     f"{MAX_TRIAL} or null{FIX}")


_CODES = {int(c): c.name for c in ErrorCode}


def _check_error(d: dict) -> None:
    codes, code = _CODES, d["error_code"]
    if code not in codes:
        raise InvalidRecordError(f"record field 'error_code' is {_show(code)}, not a known error code "
                                 f"({', '.join(f'{c} {n}' for c, n in codes.items())}){FIX}")
    if "error_name" in d and d["error_name"] != codes[code]:
        raise InvalidRecordError(f"record field 'error_name' is {_show(d['error_name'])} but error_code {code} is "
                                 f"{codes[code]}{FIX}")


def _check_scalar(where: str, v, lists: bool = False) -> None:
    """A workload field or knob value: a bounded integer, a finite number, a clean string, a boolean, null or
    (``lists``) a flat list of numbers."""
    if lists and isinstance(v, list) and all(_number(x) or isinstance(x, bool) for x in v):
        for x in v:
            _check_scalar(where, x)
        return
    if isinstance(v, str):
        _check_text(where, v)
    elif isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_INT:
        raise InvalidRecordError(f"{where} is {_show(v)}: integers in a log are at most 2**53{FIX}")
    elif isinstance(v, float) and not math.isfinite(v):
        raise InvalidRecordError(f"{where} is {_show(v)}: it must be finite{FIX}")
    elif not (v is None or isinstance(v, (int, float, bool, str))):
        what = "a number, a string, a boolean, null or a list of numbers" if lists else \
            "an integer, a finite number, a string or a boolean"
        raise FieldTypeError(f"{where} is {_show(v)}: it must be {what}{FIX}")


def _check_scopes(d: dict) -> None:
    scopes = d["scopes"]
    for k, v in scopes.items():
        if k not in SCOPE_OPERANDS or v not in SCOPES:
            raise InvalidRecordError(f"record scopes {_show(scopes)}: each of {', '.join(SCOPE_OPERANDS)} is "
                                     f"{' or '.join(SCOPES)}{FIX}")
    if scopes_of(d["config"]) != scopes:
        raise InvalidRecordError(f"record scopes {_show(scopes)} disagree with its config's *_scope knobs "
                                 f"{_show(scopes_of(d['config']))}: the record would be filed under another task"
                                 f"{FIX}", BAD_CONFIG)


# ----------------------------------------------------------------------------------- against the template

_KNOBS: dict = {}  # template name -> (template, {knob: value types}, knobs that may be missing)
_WORKLOADS: dict = {}  # (template name, canonical workload) -> (template, flops, why not a workload)
_CACHE_SIZE = 4096  # distinct workloads remembered (a hostile log may hold a million)


def _template(name: str):
    """The template a record names: a registered one (``tuner.templates.templates()``), or one defined
    elsewhere whose module this process has already imported (a worker tuning it). Reading a log never
    imports code: a line naming ``"os:system"`` is just an unknown template."""
    from tuner.templates import Template, templates
    t = templates().get(name)
    if t is None and ":" in name:
        module, _, attr = name.partition(":")
        t = getattr(sys.modules.get(module), attr, None)
        t = t if isinstance(t, Template) and t.name == name else None
    if t is None:
        raise InvalidRecordError(f"record template {_show(name)} is not a registered template "
                                 f"({', '.join(templates())}); a template defined elsewhere is read once "
                                 f"register_template has registered it{FIX}", UNKNOWN_TEMPLATE)
    return t


def _knobs(t) -> tuple[dict, set]:
    """``t``'s knobs -> the types their values have (those of the search space's choices, else the default's:
    a bool knob takes no 1, an int knob no "4" and no 4.0), and the knobs a record may lack (``LATE_KNOBS``
    with a default). Cached per template."""
    hit = _KNOBS.get(t.name)
    if hit is not None and hit[0] is t:
        return hit[1], hit[2]
    try:
        choices = t.space().all_knobs
    except Exception:  # noqa: BLE001 - a template without a readable space: the defaults' types still tell
        choices = {}
    types, late = {}, set()
    for f in dataclasses.fields(t.config):
        has_default = f.default is not dataclasses.MISSING
        seen = {type(c) for c in choices.get(f.name, ())} or ({type(f.default)} if has_default else set())
        types[f.name] = tuple(seen | ({int} if float in seen else set())) or (int, float, str, bool)
        if has_default and f.name in LATE_KNOBS.get(t.name, ()):
            late.add(f.name)
    _KNOBS[t.name] = (t, types, late)
    return types, late


def _check_config(t, d: dict) -> None:
    """Every knob of the template, each of its type: a record is deployed as it was measured, never with a
    default filling a knob it lost (only ``LATE_KNOBS``, which older records predate, may be missing).
    Whether a value is one of the space's choices for the workload is ``best.invalid_config``'s to check
    when compiling: spaces change, and an old measurement stays a measurement."""
    types, late = _knobs(t)
    config = d["config"]
    for k, v in config.items():
        if k not in types:
            raise InvalidRecordError(f"record config knob {_show(k)} is not a knob of {t.name} (its knobs: "
                                     f"{', '.join(types)}){FIX}", BAD_CONFIG)
        if type(v) not in types[k]:
            raise FieldTypeError(f"record config knob {k!r} is {type(v).__name__} {_show(v)}, not "
                                 f"{' or '.join(sorted(x.__name__ for x in types[k]))} as in {t.name}'s search "
                                 f"space{FIX}", BAD_CONFIG)
        if (type(v) is int and abs(v) > MAX_INT) or (type(v) is float and not math.isfinite(v)):
            _check_scalar(f"record config knob {k!r}", v)  # raises; strings are _check_texts' to check
    missing = [k for k in types if k not in config and k not in late]
    if missing:
        raise InvalidRecordError(f"record config lacks {t.name} knob{'s' if len(missing) > 1 else ''} "
                                 f"{', '.join(missing)}: a record names every knob it was measured with (only "
                                 f"knobs added since, {', '.join(sorted(late)) or 'none'}, may be missing), so "
                                 f"none is deployed with a default{FIX}", BAD_CONFIG)


def _check_workload(t, d: dict):
    """The record's workload is the canonical key of a workload the template builds; returns its flops (None
    when the template does not count them). Built once per distinct workload."""
    wl = d["workload"]
    key = (t.name, repr(wl))  # as distinct as canonical_json (1, 1.0 and true differ), and faster
    hit = _WORKLOADS.get(key)
    if hit is None or hit[0] is not t:
        for k, v in wl.items():
            _check_scalar(f"record workload field {_show(k)}", v, lists=True)
        if len(_WORKLOADS) >= _CACHE_SIZE:
            _WORKLOADS.clear()
        hit = _WORKLOADS[key] = (t, *_build_workload(t, wl))
    if hit[2]:
        raise InvalidRecordError(hit[2], BAD_WORKLOAD)
    return hit[1]


def _build_workload(t, wl: dict) -> tuple:
    """``(flops, None)`` for a workload key the template builds and writes back the same, else ``(None, why)``.
    Whatever the template's constructor raises is its refusal: a hostile key reaches code written for sane
    ones (``{"data": "abc"}``)."""
    try:
        obj = t.workload(**{k: v for k, v in wl.items() if k != "op"})
        canon = obj.key()
    except Exception as e:  # noqa: BLE001
        return None, f"record workload {_show(wl)} is not a {t.name} workload ({_cut(f'{type(e).__name__}: {e}')}){FIX}"
    for k, v in wl.items():
        if canonical_json(v) != canonical_json(canon.get(k)):
            return None, (f"record workload field {_show(k)} is {_show(v)} where {t.name} writes "
                          f"{_show(canon.get(k))}: not the key of a {t.name} workload{FIX}")
    flops = getattr(obj, "flops", None)
    return (flops if _number(flops) and flops > 0 else None), None


def _check(d) -> float | None:
    """``validate_record``'s checks; returns the record's GFLOP/s recomputed from its workload's flops and its
    median (a forged ``gflops`` of 1e9 is not trusted, and an honest one is the same number)."""
    if not isinstance(d, dict):
        raise FieldTypeError(f"a record is a JSON object, not {type(d).__name__}{FIX}")
    for k in REQUIRED:
        if k not in d:
            raise MissingFieldError(f"record without {k!r}{FIX}")
    for k, (types, what) in _TYPES.items():
        if k in d and type(d[k]) not in types:  # exact types first: the check of every line of a log
            _typed(d, k, tuple(t for t in types if t is not type(None)), what, optional=type(None) in types)
    version = d["version"]
    if not 1 <= version <= SCHEMA_VERSION:
        raise InvalidRecordError(f"record schema version {_show(version)}; this tuner reads 1..{SCHEMA_VERSION} (a "
                                 f"newer tuner wrote it: upgrade tuner to read it)",
                                 NEWER if version > SCHEMA_VERSION else None)
    for k in ("template", "device"):
        if not d[k].strip():
            raise InvalidRecordError(f"record field {k!r} is empty{FIX}")
    _check_texts(d)
    _check_error(d)
    _check_times(d)
    _check_success(d)
    _check_trial(d)
    if "gpu_clock_hz" in d or "temp_c" in d or "replaces" in d:
        _check_device_state(d)
    _check_scopes(d)
    t = _template(d["template"])
    _check_config(t, d)
    flops = _check_workload(t, d)
    return flops / d["median_s"] / 1e9 if flops and d.get("median_s") else None


def validate_record(d: dict) -> None:
    """The one check of a record, whoever reads it (see the module docstring). A record is an object with
    every required field, each of its type; a known schema version; bounded names free of control and bidi
    characters; finite times and costs within sane bounds (a success's median from 1 ns to a day, among its
    costs); a trial number from 0 to 2**31-1; a known ``error_code`` that agrees with ``error_name``; scopes
    that agree with the config's ``*_scope`` knobs; a registered template; every knob of that template (only
    ``LATE_KNOBS`` may be missing) of its search space's type; a workload key the template builds as is; and,
    where present, a GPU clock from 1 Hz to 100 GHz, a temperature from -60 to 200 C and a short ``replaces``.
    Raises ``MissingFieldError`` (a KeyError), ``FieldTypeError`` (a TypeError) or ``InvalidRecordError`` (a
    ValueError), all ``TunerError``s that name the field, with a ``kind`` to count them by. A line's size and
    nesting are ``parse_line``'s to check, before it is loaded."""
    _check(d)


def canonical_json(obj) -> str:
    """Key order and tuples vs lists must not split one task into two: sorted keys, compact, lists."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def scopes_of(config) -> dict:
    """``{"input": ..., "weight": ..., "output": ...}`` from a config object or its dict (``*_scope`` knobs);
    ``scope_knobs`` is the other way."""
    values = config if isinstance(config, dict) else dataclasses.asdict(config)
    return {op: values[f"{op}_scope"] for op in SCOPE_OPERANDS if f"{op}_scope" in values}


def scope_knobs(scopes: dict | None) -> dict:
    """The ``*_scope`` knobs of a scopes dict (``{"input": "texture"}`` -> ``{"input_scope": "texture"}``)."""
    return {f"{op}_scope": s for op, s in (scopes or {}).items()}


def task_key(device: str, template: str, workload, scopes: dict) -> tuple:
    """What one tuning task is in a log (``Record.task_key``): device, template, canonical workload key and
    scopes. ``workload``: a key dict or a template workload."""
    key = workload if isinstance(workload, dict) else workload.key()
    return device, template, canonical_json(key), canonical_json(scopes)


def _finite(x):
    # Strict JSON has no NaN/Infinity; a non-finite timing or error is stored as null (error_code tells why).
    return x if x is None or math.isfinite(x) else None


@dataclass
class Record:
    """One measurement of one config of one task on one device, success or failure."""
    version: int
    template: str
    workload: dict
    scopes: dict
    config: dict
    device: str
    device_name: str = ""
    platform: str = ""
    driver: str = ""
    costs: list = field(default_factory=list)
    median_s: float | None = None
    gflops: float | None = None
    error_code: int = 0
    error_name: str = "NO_ERROR"
    error_msg: str = ""
    max_rel_error: float | None = None
    timestamp: str = ""
    duration_s: float = 0.0
    tuner_version: str = tuner.__version__
    trial: int | None = None
    sampler: str | None = None
    study: str | None = None
    gpu_clock_hz: int | None = None  # the device's GPU clock when measured (null: not exposed)
    temp_c: float | None = None  # its temperature, degrees C (null: not exposed)
    replaces: list = field(default_factory=list)  # a redone measurement: timestamps of the records it supersedes

    @classmethod
    def new(cls, template: str, workload, config, device, *, costs=(), error_code: int = ErrorCode.NO_ERROR,
            error_msg: str = "", max_rel_error: float | None = None, timestamp: str | None = None,
            duration_s: float = 0.0, trial: int | None = None, sampler: str | None = None,
            study: str | None = None, gpu_clock_hz: int | None = None, temp_c: float | None = None,
            replaces=()) -> "Record":
        """A record from live objects, so that every producer fills the derived fields the same way.

        ``workload``: a template workload (its ``.flops`` gives gflops) or its key dict; ``config``: a config
        object or dict; ``device``: a Device or DeviceInfo; ``timestamp`` defaults to now (UTC).
        ``gpu_clock_hz``, ``temp_c``: the device's state when measured (``MeasureResult``'s); ``replaces``: the
        timestamps of this config's earlier records that this measurement redoes (``tuner.measure.drift``)."""
        info = getattr(device, "info", device)
        key = workload if isinstance(workload, dict) else workload.key()
        cfg = config if isinstance(config, dict) else dataclasses.asdict(config)
        costs = [float(c) for c in costs]
        median = statistics.median(costs) if costs and error_code == ErrorCode.NO_ERROR else None
        costs = order_statistics(costs, MAX_COSTS)
        flops = getattr(workload, "flops", None)
        gflops = flops / median / 1e9 if flops and median else None
        return cls(version=SCHEMA_VERSION, template=template, workload=key, scopes=scopes_of(cfg), config=cfg,
                   device=info.fingerprint, device_name=info.name, platform=info.platform,
                   driver=info.driver_version, costs=costs, median_s=median, gflops=gflops,
                   error_code=int(error_code), error_name=ErrorCode(error_code).name, error_msg=error_msg,
                   max_rel_error=max_rel_error, timestamp=timestamp or now_iso(), duration_s=duration_s,
                   trial=trial, sampler=sampler, study=study,
                   gpu_clock_hz=None if gpu_clock_hz is None else int(gpu_clock_hz),
                   temp_c=None if temp_c is None else float(temp_c), replaces=[str(t) for t in replaces])

    def to_dict(self) -> dict:
        """The record as its JSON line holds it: ``replaces`` only when it names something (most records
        redo nothing)."""
        d = dataclasses.asdict(self)
        d["error_code"] = int(self.error_code)
        for k in ("median_s", "gflops", "max_rel_error", "duration_s", "temp_c"):
            d[k] = _finite(d[k])
        d["costs"] = [_finite(c) for c in d["costs"]]
        if not d["replaces"]:
            del d["replaces"]
        return d

    def to_json(self) -> str:
        """One line: a JSON-lines log must never contain a record split over two lines."""
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_dict(cls, d: dict) -> "Record":
        """Parse a loaded line, checked by ``validate_record``. Unknown keys are ignored (a newer writer may add
        fields); a missing required field raises a KeyError, a wrong type a TypeError, a bad value (a negative
        time, an unknown error code, a newer schema) a ValueError, each also a ``TunerError``. A line without
        ``error_name`` takes its error code's name; ``gflops`` is recomputed from the workload's flops and the
        median, never taken from the line."""
        gflops = _check(d)
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in d.items() if k in names}
        values.setdefault("error_name", ErrorCode(d["error_code"]).name)
        values["gflops"] = gflops
        if values.get("replaces") is None:
            values.pop("replaces", None)
        else:
            values["replaces"] = list(values["replaces"])
        if values.get("temp_c") is not None:
            values["temp_c"] = float(values["temp_c"])
        return cls(**values)

    @classmethod
    def from_line(cls, raw: bytes) -> "Record":
        """A record from one log line (``parse_line``: size and nesting checked before it is loaded)."""
        return cls.from_dict(parse_line(raw))

    def validate(self) -> None:
        """Check this record as ``from_dict`` checks a loaded line (``validate_record``)."""
        validate_record(self.to_dict())

    @property
    def ok(self) -> bool:
        return self.error_code == ErrorCode.NO_ERROR and self.median_s is not None

    @property
    def task_key(self) -> tuple:
        """What one tuning task is: the same workload with other scopes or on another device is another task."""
        return task_key(self.device, self.template, self.workload, self.scopes)

    @property
    def workload_key(self) -> tuple:
        return self.template, canonical_json(self.workload)


def now_iso() -> str:
    """ISO 8601 UTC, e.g. ``2024-05-01T12:00:00.123456+00:00``."""
    return datetime.now(timezone.utc).isoformat()
