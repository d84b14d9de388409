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
from tuner.errors import ErrorCode

SCHEMA_VERSION = 1

SCOPE_OPERANDS = ("input", "weight", "output")

# Fields a line must have to be a record at all; the rest default, so adding an optional field later
# does not turn old logs into garbage.
REQUIRED = ("version", "template", "workload", "scopes", "config", "device", "error_code")


def canonical_json(obj) -> str:
    """Key order and tuples vs lists must not split one task into two: sorted keys, compact, lists."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def scopes_of(config) -> dict:
    """``{"input": ..., "weight": ..., "output": ...}`` from a config object or its dict (``*_scope`` knobs)."""
    values = config if isinstance(config, dict) else dataclasses.asdict(config)
    return {op: values[f"{op}_scope"] for op in SCOPE_OPERANDS if f"{op}_scope" in values}


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
        """Parse a loaded line. Unknown keys are ignored (a newer writer may add fields); a missing required
        field raises KeyError, a wrong type TypeError, an unreadable version ValueError."""
        if not isinstance(d, dict):
            raise TypeError(f"a record is a JSON object, not {type(d).__name__}")
        for k in REQUIRED:
            if k not in d:
                raise KeyError(f"record without {k!r}")
        for k, types in (("version", int), ("error_code", int), ("template", str), ("device", str),
                         ("workload", dict), ("scopes", dict), ("config", dict)):
            if not isinstance(d[k], types) or isinstance(d[k], bool):
                raise TypeError(f"record field {k!r} is {type(d[k]).__name__}, not {types.__name__}")
        if d["version"] < 1 or d["version"] > SCHEMA_VERSION:
            raise ValueError(f"record schema version {d['version']}; this tuner reads 1..{SCHEMA_VERSION}")
        for k in ("median_s", "gflops", "max_rel_error"):
            if d.get(k) is not None and (not isinstance(d[k], (int, float)) or isinstance(d[k], bool)):
                raise TypeError(f"record field {k!r} is {type(d[k]).__name__}, not a number or null")
        if "costs" in d and not isinstance(d["costs"], list):
            raise TypeError(f"record field 'costs' is {type(d['costs']).__name__}, not a list")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @property
    def ok(self) -> bool:
        return self.error_code == ErrorCode.NO_ERROR and self.median_s is not None

    @property
    def task_key(self) -> tuple:
        """What one tuning task is: the same workload with other scopes or on another device is another task."""
        return self.device, self.template, canonical_json(self.workload), canonical_json(self.scopes)

    @property
    def workload_key(self) -> tuple:
        return self.template, canonical_json(self.workload)


def now_iso() -> str:
    """ISO 8601 UTC, e.g. ``2024-05-01T12:00:00.123456+00:00``."""
    return datetime.now(timezone.utc).isoformat()
