"""One tuning measurement as a self-describing JSON line.

A record carries everything needed to reuse it later without the process that made it: the canonical
workload key, every knob of the config, the device fingerprint (indices change, fingerprints don't) and
the error code of a failure, since failures are as informative to a cost model as timings.
"""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timezone

import tuner
from tuner.errors import ErrorCode, TunerError

SCHEMA_VERSION = 1

SCOPE_OPERANDS = ("input", "weight", "output")

# Fields a line must have to be a record at all; the rest default, so adding an optional field later
# does not turn old logs into garbage.
REQUIRED = ("version", "template", "workload", "scopes", "config", "device", "error_code")


SCOPES = ("texture", "buffer")
FIX = "; the line is skipped: re-measure the config, or delete or correct the line"


class InvalidRecordError(TunerError, ValueError):
    """A JSON line that is not a valid record: names the field, what it holds and what it should hold."""


class MissingFieldError(InvalidRecordError, KeyError):
    __str__ = Exception.__str__  # not KeyError's repr of the message


class FieldTypeError(InvalidRecordError, TypeError):
    pass


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
    text = json.dumps(v) if not isinstance(v, float) or math.isfinite(v) else str(v)
    return text if len(text) <= 40 else text[:39] + "…"


def _check_numbers(d: dict) -> None:
    for k in ("median_s", "gflops", "max_rel_error"):
        if d.get(k) is not None and not _time(d[k]):
            _typed(d, k, (int, float), "a number or null")
            raise InvalidRecordError(f"record field {k!r} is {_show(d[k])}: it must be a finite number >= 0 or "
                                     f"null{FIX}")
    if "duration_s" in d and not _time(d["duration_s"]):
        _typed(d, "duration_s", (int, float), "a number")
        raise InvalidRecordError(f"record field 'duration_s' is {_show(d['duration_s'])}: it must be a finite "
                                 f"number >= 0{FIX}")
    if "costs" in d:
        _typed(d, "costs", (list,), "a list of seconds")
        bad = next((c for c in d["costs"] if not _time(c)), "ok")
        if bad != "ok":
            raise InvalidRecordError(f"record field 'costs' holds {_show(bad)}: every cost must be a finite "
                                     f"number of seconds >= 0{FIX}")
    if d.get("trial") is not None:
        _typed(d, "trial", (int,), "an integer or null")
        if d["trial"] < 0:
            raise InvalidRecordError(f"record field 'trial' is {d['trial']}: it must be >= 0 or null{FIX}")


def _check_error(d: dict) -> None:
    codes = {int(c): c.name for c in ErrorCode}
    code = d["error_code"]
    if code not in codes:
        raise InvalidRecordError(f"record field 'error_code' is {code}, not a known error code "
                                 f"({', '.join(f'{c} {n}' for c, n in codes.items())}){FIX}")
    if "error_name" in d and d["error_name"] != codes[code]:
        raise InvalidRecordError(f"record field 'error_name' is {_show(d['error_name'])} but error_code {code} is "
                                 f"{codes[code]}{FIX}")


def _check_config(d: dict) -> None:
    for k, v in d["config"].items():
        if not k or not isinstance(v, (int, float, str, bool)) or (isinstance(v, float) and not math.isfinite(v)):
            raise InvalidRecordError(f"record config knob {k!r} is {_show(v)}: a knob value is an integer, a "
                                     f"finite number, a string or a boolean{FIX}")
    for k, v in d["workload"].items():
        if isinstance(v, list) and all(_number(x) or isinstance(x, bool) for x in v):
            v = None
        if v is not None and not isinstance(v, (int, float, str, bool)):
            raise InvalidRecordError(f"record workload field {k!r} is {_show(v)}: a workload field is a number, "
                                     f"a string, a boolean, null or a list of numbers{FIX}")
    for k, v in d["scopes"].items():
        if k not in SCOPE_OPERANDS or v not in SCOPES:
            raise InvalidRecordError(f"record scopes {_show(d['scopes'])}: each of {', '.join(SCOPE_OPERANDS)} is "
                                     f"{' or '.join(SCOPES)}{FIX}")


def validate_record(d: dict) -> None:
    """Check one loaded line before it becomes a Record: an object with every required field; versions,
    types; finite non-negative times, costs and GFLOP/s; a known ``error_code`` that agrees with
    ``error_name``; a flat config of str -> int/float/str/bool. Raises ``MissingFieldError`` (a KeyError),
    ``FieldTypeError`` (a TypeError) or ``InvalidRecordError`` (a ValueError), all ``TunerError``s that name
    the field. Whether the knobs belong to the template's search space is checked where configs are compiled."""
    if not isinstance(d, dict):
        raise FieldTypeError(f"a record is a JSON object, not {type(d).__name__}{FIX}")
    for k in REQUIRED:
        if k not in d:
            raise MissingFieldError(f"record without {k!r}{FIX}")
    for k, types, what in (("version", (int,), "an integer"), ("error_code", (int,), "an integer"),
                           ("template", (str,), "a string"), ("device", (str,), "a string"),
                           ("workload", (dict,), "an object"), ("scopes", (dict,), "an object"),
                           ("config", (dict,), "an object")):
        _typed(d, k, types, what)
    if d["version"] < 1 or d["version"] > SCHEMA_VERSION:
        raise InvalidRecordError(f"record schema version {d['version']}; this tuner reads 1..{SCHEMA_VERSION} "
                                 f"(a newer tuner wrote it: upgrade tuner to read it)")
    for k in ("template", "device"):
        if not d[k].strip():
            raise InvalidRecordError(f"record field {k!r} is empty{FIX}")
    for k in ("device_name", "platform", "driver", "error_name", "error_msg", "timestamp", "tuner_version"):
        if k in d:
            _typed(d, k, (str,), "a string")
    for k in ("sampler", "study"):
        _typed(d, k, (str,), "a string or null", optional=True)
    _check_numbers(d)
    _check_error(d)
    _check_config(d)


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

    @classmethod
    def new(cls, template: str, workload, config, device, *, costs=(), error_code: int = ErrorCode.NO_ERROR,
            error_msg: str = "", max_rel_error: float | None = None, timestamp: str | None = None,
            duration_s: float = 0.0, trial: int | None = None, sampler: str | None = None,
            study: str | None = None) -> "Record":
        """A record from live objects, so that every producer fills the derived fields the same way.

        ``workload``: a template workload (its ``.flops`` gives gflops) or its key dict; ``config``: a config
        object or dict; ``device``: a Device or DeviceInfo; ``timestamp`` defaults to now (UTC)."""
        info = getattr(device, "info", device)
        key = workload if isinstance(workload, dict) else workload.key()
        cfg = config if isinstance(config, dict) else dataclasses.asdict(config)
        costs = [float(c) for c in costs]
        median = statistics.median(costs) if costs and error_code == ErrorCode.NO_ERROR else None
        flops = getattr(workload, "flops", None)
        gflops = flops / median / 1e9 if flops and median else None
        return cls(version=SCHEMA_VERSION, template=template, workload=key, scopes=scopes_of(cfg), config=cfg,
                   device=info.fingerprint, device_name=info.name, platform=info.platform,
                   driver=info.driver_version, costs=costs, median_s=median, gflops=gflops,
                   error_code=int(error_code), error_name=ErrorCode(error_code).name, error_msg=error_msg,
                   max_rel_error=max_rel_error, timestamp=timestamp or now_iso(), duration_s=duration_s,
                   trial=trial, sampler=sampler, study=study)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["error_code"] = int(self.error_code)
        for k in ("median_s", "gflops", "max_rel_error", "duration_s"):
            d[k] = _finite(d[k])
        d["costs"] = [_finite(c) for c in d["costs"]]
        return d

    def to_json(self) -> str:
        """One line: a JSON-lines log must never contain a record split over two lines."""
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_dict(cls, d: dict) -> "Record":
        """Parse a loaded line, checked by ``validate_record``. Unknown keys are ignored (a newer writer may add
        fields); a missing required field raises a KeyError, a wrong type a TypeError, a bad value (a negative
        time, an unknown error code, a newer schema) a ValueError, each also a ``TunerError``. A line without
        ``error_name`` takes its error code's name."""
        validate_record(d)
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in d.items() if k in names}
        values.setdefault("error_name", ErrorCode(d["error_code"]).name)
        return cls(**values)

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
