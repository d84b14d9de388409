"""The ``tuner logs``, ``tuner compare`` and ``tuner report`` commands; ``register(sub)`` adds them to the
``tuner`` parser (``tuner/cli/__init__.py``)."""
from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

from tuner.console import ELLIPSIS, format_table, terminal_width
from tuner.errors import TunerError

FORMATS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".json": "json", ".jsonl": "json"}


def _width(args) -> int | None:
    """Tables printed to stdout fit the terminal (100 columns when it is not one); a file (-o) gets every
    character, as do the csv/parquet/json exports."""
    return None if getattr(args, "output", None) else terminal_width()


def _missing(x) -> bool:
    """None, NaN or pandas' NA (pandas itself is imported only by the commands that use it)."""
    return x is None or (isinstance(x, float) and math.isnan(x)) or type(x).__name__ == "NAType"


def _num(x, spec: str) -> str:
    return "-" if _missing(x) else format(x, spec)


def _ms(seconds) -> str:
    return _num(seconds * 1e3 if seconds is not None else None, ".4g")


def _load(paths: list):
    from tuner.analysis.frame import load_logs
    df = load_logs(paths)
    if df.empty:
        raise TunerError(f"no records in {' '.join(paths)}: a tuning log is written by `tuner tune-op ... "
                         f"--log FILE` (default logs/<device>.jsonl)")
    return df


def _output_ok(path: str) -> None:
    """Check an output file before any work: its folder is created if missing, and must be writable."""
    from tuner.cli.args import writable_file
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TunerError(f"cannot create the folder of -o {path!r}: {e.strerror or e}; choose another path") from None
    writable_file(path, "-o")


def _output(args, text: str) -> None:
    if args.output:
        from tuner.files import write_file
        try:
            Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TunerError(f"cannot write -o {args.output!r}: {e.strerror or e}; choose another path") from None
        write_file(args.output, lambda f: f.write(text.encode()), "-o")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)


def _export(args, df, fmt: str) -> None:
    from tuner.analysis.frame import _to_text, export_frame
    if args.output:
        _output_ok(args.output)
        try:
            export_frame(df, args.output, fmt)
        except OSError as e:
            raise TunerError(f"cannot write -o {args.output!r}: {e.strerror or e}; choose another path") from None
        print(f"wrote {len(df)} rows to {args.output}", file=sys.stderr)
    elif fmt == "parquet":
        raise TunerError("--format parquet writes a binary file: give -o FILE.parquet")
    elif fmt == "csv":
        _to_text(df).to_csv(sys.stdout, index=False)
    else:
        _to_text(df).to_json(sys.stdout, orient="records", lines=True, date_format="iso", date_unit="us")


def _format(args, allowed=("table", "csv", "parquet", "json")) -> str:
    fmt = args.format or (FORMATS.get(Path(args.output).suffix.lower()) if args.output else None) or "table"
    if fmt not in allowed:
        raise TunerError(f"--format {fmt} is not available here; choose from {', '.join(allowed)}")
    return fmt


# ------------------------------------------------------------------------------------------------ logs

NARROW = "(cut to fit {width} columns: the full data with --format csv|json, or -o FILE)"


def _fitted(text: str, width: int | None, full_header: list) -> str:
    """``text`` plus a note when fitting it to ``width`` cut a cell or left a column out."""
    header = text.split("\n", 1)[0].split()
    if width is not None and (ELLIPSIS in text or len(header) < len(" ".join(full_header).split())):
        text += "\n" + NARROW.format(width=width)
    return text


def summary_table(summary, width: int | None = None) -> str:
    """One line per task; with ``width``: the config cut first, then ``best at`` and the config left out,
    then the failures and the task label cut."""
    from tuner.analysis.summary import knobs_text
    fails = [c for c in summary.columns if c.startswith("failed.")]
    several = summary["device"].nunique() > 1
    rows = []
    for _, r in summary.iterrows():
        failures = ", ".join(f"{c[7:]} {r[c]}" for c in fails if r[c]) or "-"
        rows.append(([r["device"]] if several else []) + [
            r["task"], r["trials"], r["ok"], failures, _num(r["best_gflops"], ".4g"), _ms(r["best_median_s"]),
            _num(r["best_at"], "d"),
            "-" if _missing(r["best_config"]) else knobs_text(r["best_config"])])
    head = (["device"] if several else []) + ["task", "trials", "ok", "failures", "GFLOP/s", "best ms",
                                              "best at", "best config"]
    k = int(several)
    fit = [("shrink", k + 7, 24), ("drop", k + 6), ("shrink", k + 3, 12), ("drop", k + 7),
           ("shrink", k, 40, "label")]
    return _fitted(format_table(head, rows, right={k + 1, k + 2, k + 4, k + 5, k + 6}, width=width, fit=fit),
                   width, head)


def best_table(best, width: int | None = None) -> str:
    """The best record of each task (``--best``); with ``width``: the config cut first, then the task label."""
    from tuner.analysis.summary import config_of, knobs_text
    several = best["device"].nunique() > 1
    head = (["device"] if several else []) + ["task", "GFLOP/s", "ms", "trial", "config"]
    rows = [([r["device"]] if several else []) + [r["task"], _num(r["gflops"], ".4g"), _ms(r["median_s"]),
                                                  _num(r["trial"], "d"), knobs_text(config_of(r))]
            for _, r in best.iterrows()]
    k = int(several)
    fit = [("shrink", k + 4, 24), ("shrink", k + 4, 12), ("shrink", k, 40, "label"), ("shrink", 0, 12)]
    return _fitted(format_table(head, rows, right={k + 1, k + 2, k + 3}, width=width, fit=fit), width, head)


def cmd_merge(args: argparse.Namespace) -> int:
    """``tuner logs --merge SOURCE... -o LOG``: append the valid records of the sources (the side files a full
    disk left, ``LOG.rescued-*.jsonl``) that LOG does not hold yet, under LOG's lock; LOG's torn last line is
    ended first, so no merged record is glued onto it. Safe to run twice: the second run adds nothing."""
    from tuner.logs.io import merge_records
    if not args.output:
        raise TunerError("--merge appends to a log: name it with -o, e.g. tuner logs --merge 'L.jsonl.rescued-*.jsonl' "
                         "-o L.jsonl")
    extra = [flag for flag, on in (("--best", args.best), ("--format", args.format), ("--storage", args.storage),
                                   ("--study", args.study), ("--device", args.device)) if on]
    if extra:
        raise TunerError(f"--merge takes source logs and -o LOG only, not {', '.join(extra)}")
    res = merge_records(args.paths, args.output)
    if not res.sources:
        why = f"is the log -o {args.output} itself" if res.itself else "matches no log"
        print(f"nothing to merge: {' '.join(args.paths)} {why}", file=sys.stderr)
        return 0
    bad = f"; {res.skipped} bad line{'s' * (res.skipped != 1)} skipped (see the warnings)" if res.skipped else ""
    after = ("the merged files can be deleted" if not res.skipped else
             "the merged files still hold the bad lines: read them before deleting the files")
    print(f"merged {res.added} record{'s' * (res.added != 1)} from {len(res.sources)} file"
          f"{'s' * (len(res.sources) != 1)} into {res.log} ({res.present} already there{bad}); {after}",
          file=sys.stderr)
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from tuner.analysis.compare import select_device
    from tuner.analysis.summary import best_rows, summarize
    if args.merge:
        return cmd_merge(args)
    if args.storage or args.study:  # shared studies (tuner worker) -> a normal JSONL log, then as usual
        from tuner.search.worker import export_study_records
        if not (args.storage and args.study and len(args.paths) == 1):
            raise TunerError("export shared studies with: tuner logs LOG --storage URL --study PREFIX (one LOG to "
                             "append to)")
        n = export_study_records(args.storage, args.study, args.paths[0])
        print(f"{n} records of {args.study} appended to {args.paths[0]}", file=sys.stderr)
    df = select_device(_load(args.paths), args.device)
    fmt = _format(args)
    if fmt != "table":
        _export(args, best_rows(df) if args.best else df, fmt)
        return 0
    if args.best:
        text = best_table(best_rows(df), _width(args))
    else:
        s = summarize(df)
        text = summary_table(s, _width(args))
        devices = df[["device", "device_name"]].drop_duplicates("device")
        text += (f"\n\n{len(df)} records, {len(s)} tasks, {int(df['ok'].sum())} successful; device"
                 f"{'s' if len(devices) > 1 else ''}: "
                 + ", ".join(f"{d} ({n})" for d, n in devices.itertuples(index=False)))
    _output(args, text + "\n")
    return 0


# --------------------------------------------------------------------------------------------- compare

def _side(r, side: str, detail: int) -> str:
    """One side's best: ``0.05 ms, 4.5e+03 GFLOP/s (16 ok)`` at detail 2, without GFLOP/s at 1, ms only at 0."""
    if r[f"{side}_ok"] == 0:
        return "not tuned" if r[f"{side}_trials"] == 0 else f"all {r[f'{side}_trials']} failed"
    gflops = f", {_num(r[f'{side}_gflops'], '.3g')} GFLOP/s" if detail > 1 else ""
    return f"{_ms(r[f'{side}_median_s'])} ms{gflops}" + (f" ({r[f'{side}_ok']} ok)" if detail else "")


def _labels_keep_their_shape(head: list, rows: list, k: int, width: int, fit: list) -> bool:
    """Whether the fitted table's workload column shows every label's template, channels, kernel size and
    stride (the words before the padding, ``@HxW`` and the epilogue), whole."""
    from tuner.console import fit_widths, truncate_label
    cells = [head] + [[str(c) for c in r] for r in rows]
    widths, _ = fit_widths([max(len(r[i]) for r in cells) for i in range(len(head))], width, fit)
    for r in rows:
        label = str(r[k])
        shown = truncate_label(label, widths[k]).replace(ELLIPSIS, " \0").split(" ")  # a cut word is no word
        words = label.split(" ")
        essential = words[:1]
        if len(words) > 2 and re.fullmatch(r"\d+x\d+", words[2]):  # a convolution: ... kernel, stride too
            for w in words:
                if w.startswith(("@", "+", "[")) or (w[:1] == "p" and w[1:2].isdigit()) or w.startswith("p("):
                    break
                essential.append(w)
        if not all(w in shown for w in essential):
            return False
    return True


def _wrapped(head: list, rows: list, k: int, width: int) -> str:
    """The compare table with each workload's label on a line of its own (cut only past ``width``, by
    ``truncate_label``) and its numbers indented below: on a narrow terminal a label keeps its kernel size and
    stride instead of being cut to a column."""
    from tuner.console import truncate_label
    rest = [c for i, c in enumerate(head) if i != k]
    numbers = format_table(rest, [[c for i, c in enumerate(r) if i != k] for r in rows], right={len(rest) - 2},
                           width=width - 2, fit=[("shrink", 0, 12)] if k else []).splitlines()
    out = [head[k], *("  " + line for line in numbers[:2])]
    for r, line in zip(rows, numbers[2:]):
        out += [truncate_label(str(r[k]), width), "  " + line]
    return "\n".join(out)


def compare_table(cmp, totals, width: int | None = None) -> str:
    """Best texture against best buffer per workload. With ``width``: the most detail that fits without cutting
    a workload label, then the labels cut (the exports and the report have every number)."""
    from tuner.analysis.compare import loss_summary
    several = cmp["device"].nunique() > 1
    head = (["device"] if several else []) + ["workload", "best texture", "best buffer", "texture speedup",
                                              "--scope auto"]
    k = int(several)
    fit = [("shrink", k, 40, "label"), ("shrink", 0, 12)]
    for detail in (2, 1, 0):
        rows = [([r["device"]] if several else []) + [
            r["workload"], _side(r, "texture", detail), _side(r, "buffer", detail),
            _num(r["texture_speedup"], ".2f") + ("" if _missing(r["pick"]) else "x"),
            "too few trials" if _missing(r["pick"]) else r["pick"]] for _, r in cmp.iterrows()]
        table = format_table(head, rows, right={len(head) - 2}, width=width, fit=fit)
        if width is None or ELLIPSIS not in table:
            break
    if width is not None and ELLIPSIS in table and not _labels_keep_their_shape(head, rows, k, width, fit):
        table = _wrapped(head, rows, k, width)  # too narrow for the labels: each on a line of its own
        lines = [table + ("\n" + NARROW.format(width=width) if ELLIPSIS in table else "")]
    else:
        lines = [_fitted(table, width, head)]
    notes = [f"  {r['workload']}: {r['note']}" for _, r in cmp.iterrows() if r["note"]]
    if notes:
        lines += ["", "not compared:"] + notes
    for _, t in totals.iterrows():
        if t["compared"] == 0:
            lines.append(f"\n{t['device']}: no workload has enough successful trials on both sides")
            continue
        lines.append(
            f"\ntotal over {t['compared']} compared workload{'s' if t['compared'] > 1 else ''} of {t['device']} "
            f"(each unique workload once): texture {_ms(t['texture_s'])} ms, buffer {_ms(t['buffer_s'])} ms, "
            f"auto {_ms(t['auto_s'])} ms ({t['auto_vs_texture']:.2f}x over all-texture, "
            f"{t['auto_vs_buffer']:.2f}x over all-buffer; textures picked for {t['texture_picks']})")
    lines += [f"\n{line}" for line in loss_summary(cmp)]
    return "\n".join(lines)


def cmd_compare(args: argparse.Namespace) -> int:
    from tuner.analysis.compare import compare, compare_totals
    df = _load(args.paths)
    cmp = compare(df, device=args.device, min_trials=args.min_trials)
    fmt = _format(args)
    if fmt != "table":
        _export(args, cmp, fmt)
        return 0
    if cmp.empty:
        raise TunerError("the log has no all-texture or all-buffer tasks to compare; tune both with "
                         "`tuner tune-op ... --scope texture` and `--scope buffer`")
    _output(args, compare_table(cmp, compare_totals(cmp), _width(args)) + "\n")
    return 0


# ---------------------------------------------------------------------------------------------- report

def cmd_report(args: argparse.Namespace) -> int:
    from tuner.analysis.compare import select_device
    from tuner.analysis.report import artifact_profile, write_report
    _output_ok(args.output)
    df = select_device(_load(args.paths), args.device)
    profile = None
    if args.artifact is not None:  # the profile `tuner run DIR --profile` kept, else measured now if it can be
        profile, where = artifact_profile(args.artifact)
        print(where, file=sys.stderr)
    path = write_report(df, args.output, min_trials=args.min_trials, title=args.title, sources=args.paths,
                        profile=profile)
    print(f"wrote {path}")
    return 0


# -------------------------------------------------------------------------------------------- register

def _min_trials(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return n


def register(sub) -> None:
    """Add ``logs``, ``compare`` and ``report`` to the ``tuner`` command's subparsers."""
    from tuner.cli.args import MIN_TRIALS  # one default for tune, compare and report (the scheduler's)
    paths_help = "JSONL tuning logs, directories of them, or globs (e.g. logs/ or 'logs/*.jsonl')"
    device_help = "only this device of the log: a fingerprint or a substring of it or of the device name"

    p = sub.add_parser("logs", help="summarize tuning logs per task, or export them (CSV, Parquet, JSON)")
    p.add_argument("paths", nargs="+", metavar="PATH", help=paths_help)
    p.add_argument("--best", action="store_true", help="only the best record of each task")
    p.add_argument("--storage", metavar="URL", help="first export the shared studies of --study from this storage "
                   "into PATH (a JSONL log)")
    p.add_argument("--study", metavar="NAME_OR_PREFIX", help="the study (or study prefix) to export")
    p.add_argument("--format", choices=("table", "csv", "parquet", "json"),
                   help="table (default), or an export of every record (with --best: the best ones); "
                        "default from -o's suffix")
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout (with --merge: the log to "
                   "append to)")
    p.add_argument("--device", "-d", metavar="SPEC", help=device_help)
    p.add_argument("--merge", action="store_true", help="append the valid records of PATH... (e.g. the side files "
                   "'LOG.rescued-*.jsonl' a full disk left) that the log -o LOG does not hold yet, under its lock")
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("compare", help="best texture config against best buffer config per workload")
    p.add_argument("paths", nargs="+", metavar="PATH", help=paths_help)
    p.add_argument("--device", "-d", metavar="SPEC", help=device_help)
    p.add_argument("--min-trials", type=_min_trials, default=MIN_TRIALS, metavar="N",
                   help=f"successful trials each side needs to be compared (default {MIN_TRIALS}, as `tune`)")
    p.add_argument("--format", choices=("table", "csv", "json"), help="table (default) or an export")
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("report", help="one self-contained HTML report with figures")
    p.add_argument("paths", nargs="+", metavar="PATH", help=paths_help)
    p.add_argument("--artifact", metavar="DIR", help="a compiled model's directory: its per-layer latency, from "
                   "the profile `tuner run DIR --profile` kept, else profiled now when the device it was compiled "
                   "for is attached")
    p.add_argument("-o", "--output", metavar="FILE", default="report.html", help="default report.html")
    p.add_argument("--device", "-d", metavar="SPEC", help=device_help)
    p.add_argument("--min-trials", type=_min_trials, default=MIN_TRIALS, metavar="N",
                   help=f"successful trials each scope needs in the texture/buffer comparison (default {MIN_TRIALS}, "
                        "as `tune`)")
    p.add_argument("--title", default="Tuning report")
    p.set_defaults(func=cmd_report)
