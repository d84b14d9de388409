"""Tuning logs as a pandas DataFrame: one row per record, one typed column per field, knob and workload field.

Columns (in this order):

- ``task``: a short readable label of the task, ``<workload> [<scopes>]``, e.g.
  ``conv2d 64->64 3x3 p1 @56x56 +bias+relu [texture]``; ``workload``: the same without the scopes;
  ``workload_key``: the canonical JSON of the workload (what identifies it; labels are for reading).
- ``template``, ``device`` (fingerprint), ``device_name``, ``platform``, ``driver``.
- ``wl.<field>``: every field of the workload key except ``op``. Shapes and pairs (``wl.data``,
  ``wl.kernel``, ``wl.weight``, ``wl.stride``, ``wl.padding``, ``wl.dilation``) are tuples, not one
  column per dimension: the number of dimensions differs between templates (conv2d data N,C,H,W; dense
  N,K), and a tuple compares and groups as one value (``df[df["wl.kernel"] == (64, 64, 3, 3)]``).
  Scalars (``wl.dtype``, ``wl.bias``, ...) keep their type. A field another template lacks is missing (NA).
- ``scope.input``, ``scope.weight``, ``scope.output`` and ``scopes``: ``texture`` or ``buffer`` when all
  three agree, else ``input/weight/output`` such as ``buffer/texture/buffer``.
- ``cfg.<knob>``: every knob of the config (ints stay ints, flags booleans; NA where a template has no
  such knob).
- ``ok`` (success with a timing), ``median_s``, ``costs`` (list of seconds), ``gflops``, ``error_code``,
  ``error_name``, ``error_msg``, ``max_rel_error``, ``timestamp`` (UTC datetime), ``duration_s``, ``trial``,
  ``sampler``, ``study``, ``tuner_version``, ``log`` (the file the record came from).

Integer columns with gaps are pandas' nullable ``Int64``, flag columns with gaps ``boolean``.
"""
from __future__ import annotations

import dataclasses
import io
import json
import os
from pathlib import Path
from typing import Iterable

import pandas as pd
import pyarrow as pa
import pyarrow.compute  # noqa: F401 -- pa.compute
import pyarrow.json as pa_json

from tuner.errors import TunerError
from tuner.logs.io import SkippedLines, expand_paths, open_regular
from tuner.logs.record import SCOPE_OPERANDS, InvalidRecordError, Record, canonical_json, check_line

# The columns every frame has, in order; wl.* and cfg.* columns are inserted after the SCOPE block.
HEAD = ["task", "workload", "workload_key", "template", "device", "device_name", "platform", "driver"]
SCOPE = ["scope.input", "scope.weight", "scope.output", "scopes"]
TAIL = ["ok", "median_s", "costs", "gflops", "error_code", "error_name", "error_msg", "max_rel_error",
        "timestamp", "duration_s", "trial", "sampler", "study", "tuner_version", "log"]

# dtypes of the fixed columns (wl.* and cfg.* follow their values, see _column)
FIXED_DTYPES = {**{c: "str" for c in HEAD + SCOPE}, "ok": "bool", "median_s": "float64", "costs": "object",
                "gflops": "float64", "error_code": "int64", "error_name": "str", "error_msg": "str",
                "max_rel_error": "float64", "timestamp": "datetime64[us, UTC]", "duration_s": "float64",
                "trial": "Int64", "sampler": "str", "study": "str", "tuner_version": "str", "log": "str"}


# ----------------------------------------------------------------------------------------------- labels

def workload_label(template: str, wl: dict) -> str:
    """A logged workload in a few words, named by its template: ``conv2d 64->128 3x3 s2 p1 @56x56``. The label
    is the template's (``Template.key_label``); a template not registered here gets the generic label of the
    key's fields."""
    from tuner.templates import templates
    from tuner.templates import workload_label as generic
    t = templates().get(template)
    return f"{template} {t.key_label(wl)}" if t is not None else generic(template, wl)


def scopes_label(scopes: dict) -> str:
    """``texture`` / ``buffer`` when every operand agrees, else ``input/weight/output``."""
    values = [scopes.get(op, "?") for op in SCOPE_OPERANDS]
    return values[0] if len(set(values)) == 1 else "/".join(values)


# ------------------------------------------------------------------------------------- arrow tables
#
# Both ways in -- checked lines read by pyarrow's multi-threaded JSON reader, or Records where pyarrow reads
# the lines otherwise than json.loads -- meet in one arrow table with the record's scalar fields and one column per
# workload/config/scopes field (``workload.data``, ``config.tile_oc``, ...), which ``_frame`` turns into
# the DataFrame. One conversion keeps both ways' dtypes identical.

_STRUCTS = ("workload", "config", "scopes")
_STR = ["template", "device", "device_name", "platform", "driver", "error_name", "error_msg", "timestamp",
        "sampler", "study", "tuner_version"]
_NUM = ["median_s", "gflops", "max_rel_error", "duration_s", "trial", "error_code"]
# what a line may leave out, and its default (Record's)
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Record) if f.default is not dataclasses.MISSING}

_is_str = lambda t: pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t)  # noqa: E731
_is_num = lambda t: pa.types.is_floating(t) or pa.types.is_integer(t) or pa.types.is_null(t)  # noqa: E731


def _clean_table(raw: bytes) -> pa.Table | None:
    """JSON lines already checked by ``validate_record`` (``_file_table``) read by pyarrow and flattened, or
    None when pyarrow reads them otherwise than json.loads did (a field of two types, a key given twice):
    then the caller builds the table from Records. The type checks here are about pyarrow's inference, not
    about the records, which are valid."""
    try:  # one block: a field whose type changes between pyarrow's blocks (a dense layer's ``weight`` shape, a
        # weighted reduction's ``weight`` name) then raises here, where across blocks pyarrow 26 crashed the process
        table = pa_json.read_json(io.BytesIO(raw), read_options=pa_json.ReadOptions(block_size=max(len(raw) + 1,
                                                                                                   1 << 20)))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    schema, names = table.schema, set(table.column_names)
    required = {"version": pa.types.is_integer, "error_code": pa.types.is_integer, "template": pa.types.is_string,
                "device": pa.types.is_string, **{c: pa.types.is_struct for c in _STRUCTS}}
    if not all(c in names and ok(schema.field(c).type) and table[c].null_count == 0 for c, ok in required.items()):
        return None
    if not (all(_is_str(schema.field(c).type) for c in _STR if c in names)
            and all(_is_num(schema.field(c).type) for c in _NUM if c in names)
            and all(_is_str(f.type) for f in schema.field("scopes").type)):
        return None
    if "costs" in names:
        t = schema.field("costs").type
        if not (pa.types.is_list(t) and _is_num(t.value_type)) or table["costs"].null_count:
            return None
    n = table.num_rows
    cols = {c: table[c] for c in _STR + _NUM if c in names}
    cols.update({c: pa.nulls(n) if _DEFAULTS[c] is None else pa.array([_DEFAULTS[c]] * n)
                 for c in _STR + _NUM if c not in names})
    cols["costs"] = table["costs"] if "costs" in names else pa.array([[]] * n, pa.list_(pa.float64()))
    for struct in _STRUCTS:
        column = table[struct].combine_chunks()
        for i, f in enumerate(column.type):
            cols[f"{struct}.{f.name}"] = column.field(i)
    table = pa.table(cols)
    codes, distinct = _codes(table, "workload.")
    keys = [canonical_json(d) for d in distinct]
    return table.append_column("workload_key", pa.array([keys[c] for c in codes], pa.string()))


def _records_table(records: list) -> pa.Table:
    # Record.from_dict checks only some fields' types: the others are coerced to their column's type here
    cols = {c: pa.array([None if (v := getattr(r, c)) is None else str(v) for r in records], pa.string())
            for c in _STR}
    cols.update({c: pa.array([v if isinstance(v := getattr(r, c), (int, float)) and not isinstance(v, bool)
                              else None for r in records]) for c in _NUM})
    cols["costs"] = pa.array([list(r.costs) for r in records], pa.list_(pa.float64()))
    for struct in _STRUCTS:
        dicts = [getattr(r, struct) for r in records]
        for k in dict.fromkeys(k for d in dicts for k in d):  # every key, in first-seen order
            _put(cols, f"{struct}.{k}", [d.get(k) for d in dicts])
    # the key is taken from the records themselves: a field of two types is JSON text in its column
    cols["workload_key"] = pa.array([canonical_json(r.workload) for r in records], pa.string())
    return pa.table(cols)


JSON = "#json"  # suffix of a column whose values are JSON text because they have more than one type


def _put(cols: dict, name: str, values: list) -> None:
    """``cols[name]``: the values as an arrow array; when they mix types (an int here, a list there), as
    JSON text under ``name + JSON``, so that merging tables can decode them again."""
    try:
        cols[name] = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        cols[name + JSON] = pa.array([None if v is None else json.dumps(v) for v in values], pa.string())


def _with_log(table: pa.Table, log: str) -> pa.Table:
    return table.append_column("log", pa.array([log] * table.num_rows, pa.string()))


# ----------------------------------------------------------------------------------------------- frames

def _column(arr) -> pd.Series:
    """A DataFrame column from an arrow column: int64/float64/bool/str when complete, Int64/boolean/str with
    NA when some values are missing, tuples for lists, None-filled object for an all-missing field."""
    t = arr.type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pd.Series([tuple(v) if v is not None else None for v in arr.to_pylist()], dtype=object)
    if pa.types.is_boolean(t):
        return pd.Series(arr.to_pandas(), dtype="boolean" if arr.null_count else bool)
    if pa.types.is_integer(t):
        return pd.Series(arr.to_pandas(), dtype="Int64" if arr.null_count else "int64")
    if pa.types.is_floating(t):
        return pd.Series(arr.to_pandas(), dtype="float64")
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return arr.to_pandas().astype("str")
    return pd.Series(arr.to_pylist(), dtype=object)


def _freeze(v):
    if isinstance(v, list):
        return tuple(map(_freeze, v))
    if isinstance(v, dict):
        return json.dumps(v, sort_keys=True)
    return v


def _codes(table: pa.Table, prefix: str) -> tuple[list, list]:
    """Per row, the index of its distinct value of the ``prefix``-ed fields, and those distinct values as
    dicts (absent fields left out): keys and labels are then computed once per distinct workload."""
    names = [c for c in table.column_names if c.startswith(prefix)]
    if not names:
        return [0] * table.num_rows, [{}]
    values = [table[c].to_pylist() for c in names]
    index: dict = {}  # distinct row -> its code
    firsts, codes = [], []  # code -> the first record with it; record -> its code
    for i, row in enumerate(zip(*([_freeze(v) for v in col] for col in values))):
        code = index.get(row)
        if code is None:
            code = index[row] = len(firsts)
            firsts.append(i)
        codes.append(code)
    fields = [c[len(prefix):] for c in names]
    distinct = [{f: col[i] for f, col in zip(fields, values) if col[i] is not None} for i in firsts]
    return codes, distinct


def _frame(table: pa.Table) -> pd.DataFrame:
    if table.num_rows == 0:  # no records, no wl./cfg. columns: still the fixed columns with their dtypes
        return pd.DataFrame({c: pd.Series([], dtype=t) for c, t in FIXED_DTYPES.items()})[HEAD + SCOPE + TAIL]
    templates = table["template"].to_pylist()
    wkeys = table["workload_key"].to_pylist()
    labels: dict = {}  # one label per distinct (template, workload)
    for t, k in zip(templates, wkeys):
        if (t, k) not in labels:
            labels[(t, k)] = workload_label(t, json.loads(k))
    wlabels = [labels[tk] for tk in zip(templates, wkeys)]
    scodes, sdistinct = _codes(table, "scopes.")
    slabel = [scopes_label(d) for d in sdistinct]
    slabels = [slabel[c] for c in scodes]

    out: dict = {
        "task": pd.Series([f"{w} [{s}]" for w, s in zip(wlabels, slabels)], dtype="str"),
        "workload": pd.Series(wlabels, dtype="str"),
        "workload_key": pd.Series(wkeys, dtype="str"),
        **{c: _column(table[c]).astype("str") for c in ("template", "device", "device_name", "platform", "driver")},
    }
    out.update({"wl." + c[9:].removesuffix(JSON): _column(table[c]) for c in table.column_names
                if c.startswith("workload.") and c != "workload.op"})
    for op in SCOPE_OPERANDS:
        out[f"scope.{op}"] = pd.Series([sdistinct[c].get(op) for c in scodes], dtype="str")
    out["scopes"] = pd.Series(slabels, dtype="str")
    out.update({"cfg." + c[7:].removesuffix(JSON): _column(table[c]) for c in table.column_names
                if c.startswith("config.")})
    median = _column(table["median_s"]).astype("float64")
    code = _column(table["error_code"]).astype("int64")
    out.update({
        "ok": (code == 0) & median.notna(),  # Record.ok
        "median_s": median,
        "costs": pd.Series(table["costs"].to_pylist(), dtype=object),
        "gflops": _column(table["gflops"]).astype("float64"),
        "error_code": code,
        "error_name": _column(table["error_name"]).astype("str"),
        "error_msg": _column(table["error_msg"]).astype("str"),
        "max_rel_error": _column(table["max_rel_error"]).astype("float64"),
        "timestamp": _timestamps(_column(table["timestamp"])),
        "duration_s": _column(table["duration_s"]).astype("float64"),
        "trial": _column(table["trial"]).astype("Int64"),
        **{c: _column(table[c]).astype("str") for c in ("sampler", "study", "tuner_version", "log")},
    })
    return pd.DataFrame(out, copy=False)


def _timestamps(values) -> pd.Series:
    # records write ISO 8601 with an offset; an empty or garbled one becomes NaT rather than failing the load
    ts = pd.to_datetime(pd.Series(values, dtype="str"), utc=True, format="ISO8601", errors="coerce")
    return ts.astype("datetime64[us, UTC]")


def records_frame(records: Iterable[Record]) -> pd.DataFrame:
    """The DataFrame of in-memory records (columns: see the module docstring; ``log`` is empty)."""
    return _frame(_with_log(_records_table(list(records)), ""))


CHUNK_LINES = 2000  # lines per pyarrow read when the whole file is not one table for pyarrow


def _file_table(path: Path) -> pa.Table:
    """One log file as a flattened table. Every line is checked as every reader checks it
    (``tuner.logs.record.check_line``: size and nesting before json.loads, then ``validate_record``), bad
    lines are skipped with one ``TuningLogWarning`` per kind of problem, worded as ``tuner.load_records``
    words them; the valid lines are then read by pyarrow's multi-threaded JSON reader, and ``gflops`` and
    ``error_name`` are the checked ones (recomputed, filled), not the lines' own."""
    with open_regular(path, "rb") as f:
        raw = f.read()
    skipped = SkippedLines(path)
    good, gflops, names = [], [], []
    for lineno, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            d = check_line(line)
        except InvalidRecordError as e:
            skipped.add(lineno, e)
            continue
        good.append(line)
        gflops.append(d["gflops"])
        names.append(d["error_name"])
    skipped.warn(stacklevel=4)
    table = _lines_table(good)
    for name, values, kind in (("gflops", gflops, pa.float64()), ("error_name", names, pa.string())):
        table = table.set_column(table.column_names.index(name), name, pa.array(values, kind))
    return table


def _lines_table(lines: list) -> pa.Table:
    """Valid lines as one table: in one pyarrow read; failing that, chunk by chunk, a chunk pyarrow cannot
    read as its lines' values built from their Records instead."""
    if not lines:
        return _records_table([])
    table = _clean_table(b"\n".join(lines))
    if table is not None and table.num_rows == len(lines):
        return table
    tables = []
    for start in range(0, len(lines), CHUNK_LINES):
        chunk = lines[start:start + CHUNK_LINES]
        table = _clean_table(b"\n".join(chunk))
        ok = table is not None and table.num_rows == len(chunk)
        tables.append(table if ok else _records_table([Record.from_line(x) for x in chunk]))
    return _concat_tables(tables)


def _concat_tables(tables: list) -> pa.Table:
    if len(tables) == 1:
        return tables[0]
    names = list(dict.fromkeys(n for t in tables for n in t.column_names))
    bases = list(dict.fromkeys(n.removesuffix(JSON) for n in names))
    if len(bases) == len(names):  # no field is JSON text in one table and typed in another
        try:
            return pa.concat_tables(tables, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            pass
    # a field with two types across files or chunks: merge its Python values and type them once
    cols: dict = {}
    for base in bases:
        values = []
        for t in tables:
            if base in t.column_names:
                values += t[base].to_pylist()
            elif base + JSON in t.column_names:
                values += [None if v is None else json.loads(v) for v in t[base + JSON].to_pylist()]
            else:
                values += [None] * t.num_rows
        if base == "costs":
            cols[base] = pa.array(values, pa.list_(pa.float64()))
        else:
            _put(cols, base, values)
    return pa.table(cols)


def load_logs(path_or_paths) -> pd.DataFrame:
    """Every record of one or more JSONL tuning logs as a DataFrame, one row per record.

    ``path_or_paths``: a path, a directory (its ``*.jsonl``), a glob (``"logs/*.jsonl"``), or a list of
    them; a named file must exist (and be a regular file), a glob may match nothing. Every line is checked as
    every reader checks it (``tuner.logs.record.validate_record``); bad lines are skipped with one
    ``TuningLogWarning`` per kind of problem and file, as ``tuner.load_records`` does. Columns: see
    ``tuner.analysis.frame``'s docstring.

    The checked lines are then parsed by pyarrow's multi-threaded JSON reader."""
    items = [path_or_paths] if isinstance(path_or_paths, (str, os.PathLike)) else list(path_or_paths)
    items = [os.path.join(p, "*.jsonl") if os.path.isdir(p) else p for p in items]  # a directory: its logs
    tables = [_with_log(_file_table(path), str(path)) for path in expand_paths(items)]
    if not tables:
        return _frame(_with_log(_records_table([]), ""))
    return _frame(_concat_tables(tables))


def as_frame(df_or_records) -> pd.DataFrame:
    """A DataFrame from a DataFrame (as is), Records, or log paths/globs."""
    if isinstance(df_or_records, pd.DataFrame):
        return df_or_records
    if isinstance(df_or_records, (str, os.PathLike)):
        return load_logs(df_or_records)
    items = list(df_or_records)
    if all(isinstance(r, Record) for r in items):
        return records_frame(items)
    if all(isinstance(p, (str, os.PathLike)) for p in items):
        return load_logs(items)
    raise TunerError("expected a DataFrame from load_logs, a list of Records, or log paths")


# ----------------------------------------------------------------------------------------------- export

LIST_COLUMNS = ("costs",)  # lists of floats; wl.* shape columns are tuples


def _tuple_columns(df: pd.DataFrame) -> list[str]:
    return [c for c in df.columns if c.startswith(("wl.", "cfg.")) and df[c].dtype == object
            and df[c].map(lambda v: isinstance(v, tuple)).any()]


def export_frame(df: pd.DataFrame, path, fmt: str | None = None) -> Path:
    """Write ``df`` (from ``load_logs``) as CSV, Parquet or JSON lines (``fmt``, else the file suffix).
    Tuples and lists are JSON arrays in CSV and JSON, native lists in Parquet; ``read_export`` restores the
    frame exactly."""
    path = Path(path)
    fmt = fmt or {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".json": "json",
                  ".jsonl": "json"}.get(path.suffix.lower())
    if fmt not in ("csv", "parquet", "json"):
        raise TunerError(f"cannot tell the export format of {path}: use --format csv|parquet|json or a "
                         f".csv/.parquet/.json file name")
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        out = df.copy()
        for c in _tuple_columns(df):  # pyarrow stores tuples as lists; read_export turns them back
            out[c] = out[c].map(lambda v: list(v) if isinstance(v, tuple) else v)
        out.to_parquet(path, index=False)
    elif fmt == "csv":
        _to_text(df).to_csv(path, index=False)
    else:
        _to_text(df).to_json(path, orient="records", lines=True, date_format="iso", date_unit="us")
    return path


def _to_text(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    for c in [*_tuple_columns(df), *[c for c in LIST_COLUMNS if c in df]]:
        out[c] = out[c].map(lambda v: json.dumps(list(v)) if isinstance(v, (tuple, list)) else v)
    return out


def read_export(path) -> pd.DataFrame:
    """Read a CSV, Parquet or JSON-lines export of ``export_frame`` back into the same typed frame."""
    path = Path(path)
    if not path.is_file():
        raise TunerError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        df = pd.read_parquet(path)
    elif suffix == ".csv":
        df = pd.read_csv(path, dtype={c: "str" for c, kind in FIXED_DTYPES.items() if kind == "str"})
    else:
        df = pd.read_json(path, orient="records", lines=True, dtype=False)
    for c in df.columns:
        if c == "costs":
            df[c] = pd.Series([_costs(v) for v in df[c].tolist()], dtype=object, index=df.index)
        elif c in FIXED_DTYPES:
            df[c] = _restore_fixed(df[c], FIXED_DTYPES[c])
        elif c.startswith(("wl.", "cfg.")):
            typed: dict = {}
            _put(typed, c, [_value(v) for v in df[c].tolist()])
            df[c] = _column(typed.popitem()[1]).set_axis(df.index)
    return df


# text fields a record always has; CSV cannot tell an empty string from a missing one
_TEXT = ("error_msg", "device_name", "platform", "driver", "tuner_version", "log")


def _restore_fixed(s: pd.Series, kind: str) -> pd.Series:
    if kind.startswith("datetime"):
        if not isinstance(s.dtype, pd.DatetimeTZDtype):
            s = pd.to_datetime(s.astype("str"), utc=True, format="ISO8601", errors="coerce")
        return s.astype(kind)
    if kind == "str":
        s = s.astype("str")
        return s.fillna("") if s.name in _TEXT else s
    return s.astype(kind)


def _costs(v) -> list:
    if isinstance(v, str):
        return json.loads(v)
    return list(v.tolist() if hasattr(v, "tolist") else v) if v is not None else []


def _value(v):
    """A cell read back: numpy scalars and arrays to Python, NaN to None, JSON arrays (CSV, JSON) to lists;
    integral floats to ints, since a reader turns an integer column with gaps into floats and knobs and
    workload fields are never fractional."""
    if hasattr(v, "tolist"):
        v = v.tolist()
    if v is None or v is pd.NA or (isinstance(v, float) and v != v):
        return None
    if isinstance(v, str) and v.startswith("["):
        return json.loads(v)
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v
