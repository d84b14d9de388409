"""Tuning-efficiency benchmark: how many measured trials each sampler (xgb, tpe, random) needs to find a
config within 95% of the best one ever seen for a workload it was never developed on.

    python bench/tuning.py [--trials N] [--seeds K] [--workloads REGEX] [--out bench/results] [--device D]
                           [--samplers xgb,tpe,random,xgb-cold] [--corpus-trials M] [--retimes R]
    python bench/tuning.py --summarize bench/results/tuning_<fingerprint>.csv   # redo the tables from a CSV
    python bench/tuning.py --proposal-cost [--workloads REGEX]   # what each sampler costs the host, no device work
    python bench/tuning.py --replay CACHE.jsonl[.gz] RETIME.jsonl ...   # a device-free proxy over measured tables

Held out: the samplers were developed on the ``DEVELOPMENT`` workloads only; the table is measured on the
``HELD_OUT`` ones, which were never tuned while the search was developed (``HELD_OUT_2``: a second set, first
run after a change that reading ``HELD_OUT``'s measurements had suggested). What the held-out runs may learn
from is what a user's device log holds before a new layer comes: the development workloads, each tuned with
``M`` random configs on this device (the transfer corpus, measured once, ``<out>/tuning_corpus_<fp>.jsonl``).
Every run starts from a fresh JSONL log holding that corpus and a fresh SQLite study, and calls
``tuner.search.tune`` with the defaults a user gets (``transfer=True``: xgb learns from the corpus; tpe and
random cannot) and the same ``MeasureOptions(repeats=3, min_seconds=0.005, n_parallel=2)``. ``xgb-cold`` is
xgb with ``transfer=False``, to show what transfer adds; TPE and random run as such (``STOCK``: no fallback or
device region measured first), the other ``VARIANTS`` are the xgb sampler's alternatives (issue 37).
``REPORT`` (2026-11-27) is the set issue 37's search was first reported on; it was developed on ``HELD_OUT`` and
``HELD_OUT_2``. ``REPORT_2`` (2026-11-28) is the set its proposals far from the incumbents are reported on; they
were developed on ``REPORT``. ``REPORT_3`` (2026-11-28) is the set a CPU convolution's two-mode region
(``tuner.search.regions``; ``xgb-modes`` in development) is reported on; it was developed on ``REPORT`` and
``REPORT_2``. ``REPORT_4`` (2026-11-28) is the set each region mode searched in turn (``xgb-turns`` in development)
and the GPU's regions in modes are reported on; they were developed on ``REPORT`` and ``REPORT_3``. ``REPORT_5``
(2026-11-28) is the set the transfer hedged by a model without the corpus is reported on; it was developed by
replaying the measured tables of ``REPORT`` to ``REPORT_4`` (``--replay``, as the H200 with ``--profile``).

``--deadline S`` stops starting work (a corpus chunk, a run, a re-timing round) after S seconds and exits with
status 3 while work is left; the same command with the same ``--out`` goes on from the files there (the
corpus, the runs' CSV, the measurement caches, the re-timings), so a benchmark longer than one call of a lent
GPU machine runs in several (``bench/gpu.sh tuning``).

Measurements are memoized per (workload, config) across runs (``<out>/tuning_cache_<fp>.jsonl``), as Kernel
Tuner's cache files are for comparing strategies: a config is built and timed the first time any run
proposes it and every later proposal of it gets that measurement. Every sampler thus sees the same timing for
the same config, and the benchmark costs the distinct configs, not the runs. Runs go one after another (with ``--jobs K``, K
workloads at once, each in its own process with its own cache).

From each run's records (measurement order; a failed measurement counts as a trial with no GFLOP/s) it
takes the best-so-far GFLOP/s curve. ``best_ever`` of a workload is the highest GFLOP/s of any config
measured on it. ``trials_to_95pct`` of a run is the first trial whose best-so-far reaches
0.95 * best_ever; a run that never gets there is censored and scored N+1 (shown as ``>N``). The summary
gives, per workload and sampler, the median over seeds, and the geometric means over workloads of the
ratios xgb/random and xgb/tpe (per-workload medians; censored medians enter as N+1, which makes a ratio
whose denominator is censored an upper bound and one whose numerator is censored a lower bound). Where random's
runs are censored, its median trials come from its hit rate instead (``random_by_hit_rate``); more random draws
narrow it: ``--samplers random --seeds 10`` with the same ``--out`` adds random's seeds 3 to 9 to a benchmark of
3 seeds (as ``REPORT_5`` was, 2026-11-28, seventh).

Noise decides "95% of the best" on a loaded CPU (one timing there can be twice another of the same config),
so after the runs the contenders are re-timed (``--retimes R``, default 5; ``retime``): every config within
10% of its workload's best estimate is timed R more times, all of a workload's contenders in the same rounds
(a showdown), and judged by its best timing there (``retimed_estimate``; before 2026-11-28: the median of its
ratios to a reference config timed in the same round, which a burst that slowed only one of the two threw
off), until a workload's configs within 10% of its best estimate were all timed in its last showdown
(``<out>/tuning_retime_<fp>.jsonl``). ``best_ever`` is then the best estimate and each trial counts at its
config's estimate (the CSV's ``curve_retimed``); each trial's config id is the CSV's ``keys``.
``--retimes 0`` judges by the runs' one timing, as before 2026-11-26.

Writes ``<out>/tuning_<device fingerprint>.csv`` (one row per run, rewritten after every run so a killed
benchmark keeps what it measured; a re-run skips the runs it has) and ``<out>/tuning_<device fingerprint>.md``
(also printed).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

STOCK = {"fallback_first": False, "device_region": False}  # the baselines: Optuna's TPE and random search as such
# name -> (tune()'s sampler, transfer, more tune() arguments). xgb: tune()'s defaults (the fallback and the device
# class's region measured first, a model-free TPE share, the transfer weighed by its rank correlation here);
# xgb-cold: the same without transfer; xgb-none / xgb-bonus: no model-free share / an ensemble's uncertainty
# bonus instead; xgb-old: the xgb of 2026-11-26 (model only, transfer at full weight, no fallback or region);
# xgb-nofar: neither proposals far from the incumbents nor the corpus's decay (the xgb of the first report);
# xgb-far15: far proposals at a fixed share, no decay; xgb-nodecay: far proposals once stale, no decay;
# xgb-farrandom: the far proposal a random one of the far configs, not the model's best of them; xgb-far50: half
# the proposals far once stale; xgb-pairs: every two-knob neighbour of the best config among the candidates;
# xgb-modes: a CPU convolution's region in two modes (tuner.search.regions; since 2026-11-28 xgb's own);
# xgb-onemode: the region of one mode before it (regions.ONE_MODE); xgb-turns: each mode of the region searched
# in turn (XGBSampler's modes, 2026-11-28, fifth); xgb-noturns: the region's modes measured first, not searched;
# xgb-gpuone: the GPU regions before their modes (regions.BEFORE_GPU_MODES), each searched in turn where it has two;
# xgb-nosplit: the CPU convolution's narrow mode with split_k 1 or 2 (NARROW_ANY_SPLIT, development).
VARIANTS = {
    "xgb": ("xgb", True, {}),
    "tpe": ("tpe", False, STOCK),
    "random": ("random", False, STOCK),
    "xgb-cold": ("xgb", False, {}),
    "xgb-none": ("xgb", True, {"sampler_options": {"explore": "none"}}),
    "xgb-bonus": ("xgb", True, {"sampler_options": {"explore": "bonus"}}),
    "xgb-old": ("xgb", True, {"sampler_options": {"explore": "none", "weigh_transfer": False, "far": (0.0, 0.0),
                                                  "prior_decay": None}, **STOCK}),
    "xgb-nofar": ("xgb", True, {"sampler_options": {"far": (0.0, 0.0), "prior_decay": None}}),
    "xgb-far15": ("xgb", True, {"sampler_options": {"far": (0.15, 0.15), "prior_decay": None}}),
    "xgb-nodecay": ("xgb", True, {"sampler_options": {"prior_decay": None}}),
    "xgb-farrandom": ("xgb", True, {"sampler_options": {"far_pick": "random"}}),
    "xgb-far50": ("xgb", True, {"sampler_options": {"far": (0.0, 0.5)}}),
    "xgb-pairs": ("xgb", True, {"sampler_options": {"pair_moves": 1}}),
    "xgb-fast10": ("xgb", True, {"reading": "fast10"}),  # the search reads a measurement's fastest tenth
    "xgb-modes": ("xgb", True, {}),  # the CPU convolution region's two modes, before they became xgb's default
    "xgb-onemode": ("xgb", True, {"device_region": "ONE_MODE"}),  # the region before its second mode
    "xgb-turns": ("xgb", True, {}),  # each mode searched in turn, before it became xgb's default
    "xgb-noturns": ("xgb", True, {"sampler_options": {"modes": []}}),  # the modes measured first only
    "xgb-gpuone": ("xgb", True, {"device_region": "BEFORE_GPU_MODES"}),  # the GPU regions before their modes
    "xgb-nosplit": ("xgb", True, {"device_region": "NARROW_ANY_SPLIT"}),  # the CPU's narrow mode, split_k 1 too
    "xgb-pd4": ("xgb", True, {"sampler_options": {"prior_decay": 4}}),  # the corpus weighed down four times as fast
    "xgb-nohedge": ("xgb", True, {"sampler_options": {"hedge": None}}),  # every model proposal from the corpus's
    # model: xgb before the cold model's turns became its default
}
SAMPLERS = tuple(VARIANTS)  # in the tables' column order
THRESHOLD = 0.95

# (name, template, workload arguments): small layers, about 1 s per measured config on PoCL
DEVELOPMENT = [  # the transfer corpus; the search was developed on these
    ("conv3x3.16-32@28", "conv2d", dict(data=(1, 16, 28, 28), kernel=(32, 16, 3, 3), padding=1)),
    ("conv1x1.32-32@14", "conv2d", dict(data=(1, 32, 14, 14), kernel=(32, 32, 1, 1))),
    ("conv3x3s2.16-32@28", "conv2d", dict(data=(1, 16, 28, 28), kernel=(32, 16, 3, 3), stride=2, padding=1)),
    ("group3x3.g2.16-16@28", "conv2d", dict(data=(1, 16, 28, 28), kernel=(16, 8, 3, 3), padding=1, groups=2)),
    ("dw3x3.32@28", "depthwise_conv2d", dict(data=(1, 32, 28, 28), kernel=(32, 1, 3, 3), padding=1)),
    ("dw3x3s2.24@28", "depthwise_conv2d", dict(data=(1, 24, 28, 28), kernel=(24, 1, 3, 3), stride=2, padding=1)),
    ("dense.512-64", "dense", dict(data=(1, 512), weight=(64, 512))),
    ("dense.128-256", "dense", dict(data=(4, 128), weight=(256, 128))),
]
HELD_OUT = [  # the table's workloads: never tuned while the search was developed
    ("conv3x3.24-48@20", "conv2d", dict(data=(1, 24, 20, 20), kernel=(48, 24, 3, 3), padding=1)),
    ("conv1x1.48-24@20", "conv2d", dict(data=(1, 48, 20, 20), kernel=(24, 48, 1, 1))),
    ("conv3x3s2.24-48@24", "conv2d", dict(data=(1, 24, 24, 24), kernel=(48, 24, 3, 3), stride=2, padding=1)),
    ("group3x3.g4.32-32@14", "conv2d", dict(data=(1, 32, 14, 14), kernel=(32, 8, 3, 3), padding=1, groups=4)),
    ("dw5x5.40@20", "depthwise_conv2d", dict(data=(1, 40, 20, 20), kernel=(40, 1, 5, 5), padding=2)),
    ("dense.256-128", "dense", dict(data=(1, 256), weight=(128, 256))),
]
REPORT = [  # 2026-11-27 (issue 37): the set reported for the search of issue 37, which was developed on HELD_OUT and
    # HELD_OUT_2 (their measurements and caches); defined before any of it was measured
    ("conv3x3.40-40@12", "conv2d", dict(data=(1, 40, 12, 12), kernel=(40, 40, 3, 3), padding=1)),
    ("conv1x1.64-32@14", "conv2d", dict(data=(1, 64, 14, 14), kernel=(32, 64, 1, 1))),
    ("conv3x3s2.32-64@16", "conv2d", dict(data=(1, 32, 16, 16), kernel=(64, 32, 3, 3), stride=2, padding=1)),
    ("dw3x3s2.64@20", "depthwise_conv2d", dict(data=(1, 64, 20, 20), kernel=(64, 1, 3, 3), stride=2, padding=1)),
    ("dense.192-160", "dense", dict(data=(1, 192), weight=(160, 192))),
]
HELD_OUT_2 = [  # a second held-out set, first measured 2026-11-26 to check a change made after reading HELD_OUT's
    # measurements (the cost model's launch_waste feature): no run had seen these before
    ("conv3x3.32-32@16", "conv2d", dict(data=(1, 32, 16, 16), kernel=(32, 32, 3, 3), padding=1)),
    ("conv1x1.24-64@18", "conv2d", dict(data=(1, 24, 18, 18), kernel=(64, 24, 1, 1))),
    ("dw3x3.48@18", "depthwise_conv2d", dict(data=(1, 48, 18, 18), kernel=(48, 1, 3, 3), padding=1)),
    ("dense.384-96", "dense", dict(data=(1, 384), weight=(96, 384))),
]
REPORT_2 = [  # 2026-11-28 (issue 37): the set reported for the far proposals, which were developed on REPORT (its
    # measurements and caches, read after its report); defined before any of it was measured
    ("conv3x3.48-32@10", "conv2d", dict(data=(1, 48, 10, 10), kernel=(32, 48, 3, 3), padding=1)),
    ("conv1x1.96-48@12", "conv2d", dict(data=(1, 96, 12, 12), kernel=(48, 96, 1, 1))),
    ("conv3x3s2.24-56@20", "conv2d", dict(data=(1, 24, 20, 20), kernel=(56, 24, 3, 3), stride=2, padding=1)),
    ("dw5x5s2.48@24", "depthwise_conv2d", dict(data=(1, 48, 24, 24), kernel=(48, 1, 5, 5), stride=2, padding=2)),
    ("dense.320-128", "dense", dict(data=(1, 320), weight=(128, 320))),
]
REPORT_3 = [  # 2026-11-28 (issue 37): the set reported for a CPU convolution region of two modes, which was
    # developed on REPORT and REPORT_2 (their measurements and caches, read after their reports); defined before any
    # of it was measured
    ("conv3x3.32-48@14", "conv2d", dict(data=(1, 32, 14, 14), kernel=(48, 32, 3, 3), padding=1)),
    ("conv1x1.40-80@16", "conv2d", dict(data=(1, 40, 16, 16), kernel=(80, 40, 1, 1))),
    ("conv3x3s2.40-40@18", "conv2d", dict(data=(1, 40, 18, 18), kernel=(40, 40, 3, 3), stride=2, padding=1)),
    ("dw3x3.56@16", "depthwise_conv2d", dict(data=(1, 56, 16, 16), kernel=(56, 1, 3, 3), padding=1)),
    ("dense.256-192", "dense", dict(data=(1, 256), weight=(192, 256))),
]
REPORT_4 = [  # 2026-11-28 (issue 37): the set reported for each region mode searched in turn and the GPU regions in
    # modes, which were developed on REPORT and REPORT_3 (the CPU) and on the committed logs and REPORT_2's and
    # REPORT_3's H200 results (the GPU); defined before any of it was measured
    ("conv3x3.56-40@10", "conv2d", dict(data=(1, 56, 10, 10), kernel=(40, 56, 3, 3), padding=1)),
    ("conv1x1.72-56@14", "conv2d", dict(data=(1, 72, 14, 14), kernel=(56, 72, 1, 1))),
    ("conv3x3s2.32-72@22", "conv2d", dict(data=(1, 32, 22, 22), kernel=(72, 32, 3, 3), stride=2, padding=1)),
    ("dw5x5.64@14", "depthwise_conv2d", dict(data=(1, 64, 14, 14), kernel=(64, 1, 5, 5), padding=2)),
    ("dense.448-96", "dense", dict(data=(1, 448), weight=(96, 448))),
]
REPORT_5 = [  # 2026-11-28 (issue 37): the set reported for the transfer hedged by a model without the corpus (xgb's
    # hedge), which was developed by replaying the H200's REPORT_2 to REPORT_4 tables and the CPU's REPORT to REPORT_4
    # tables (--replay); defined before any of it was measured, and before the hedge was chosen
    ("conv3x3.40-64@12", "conv2d", dict(data=(1, 40, 12, 12), kernel=(64, 40, 3, 3), padding=1)),
    ("conv1x1.48-88@16", "conv2d", dict(data=(1, 48, 16, 16), kernel=(88, 48, 1, 1))),
    ("conv3x3s2.48-48@20", "conv2d", dict(data=(1, 48, 20, 20), kernel=(48, 48, 3, 3), stride=2, padding=1)),
    ("dw3x3s2.80@18", "depthwise_conv2d", dict(data=(1, 80, 18, 18), kernel=(80, 1, 3, 3), stride=2, padding=1)),
    ("dense.288-224", "dense", dict(data=(1, 288), weight=(224, 288))),
]
WORKLOADS = HELD_OUT + HELD_OUT_2 + REPORT + REPORT_2 + REPORT_3 + REPORT_4 + REPORT_5
SCOPES = {"input": "buffer", "weight": "buffer", "output": "buffer"}

CSV_FIELDS = ["workload", "template", "workload_args", "scope", "sampler", "seed", "trials", "trials_to_95pct",
              "reached", "best_gflops_run", "best_ever", "failed", "wall_s", "s_per_trial", "best_config", "curve",
              "gflops", "keys", "curve_retimed", "device", "search"]


PARALLEL = 2  # build processes (--parallel)


def options():
    from tuner.measure import MeasureOptions
    return MeasureOptions(repeats=3, min_seconds=0.005, n_parallel=PARALLEL, run_timeout=5, build_timeout=30)


def json_lines(path: Path):
    """The JSON objects of a JSON-lines file this script appends to (none if there is no file); a line that does
    not parse (the torn last line of a killed run) is skipped."""
    if not path.exists():
        return
    for line in path.read_text().splitlines():
        try:
            yield json.loads(line)
        except ValueError:
            continue


class CachedMeasurer:
    """A Measurer that measures each (template, workload, config) once: later proposals of it, by any run,
    get the first measurement (kept in a JSONL file, so a killed benchmark keeps them)."""

    def __init__(self, measurer, path: Path):
        from tuner.logs.record import canonical_json
        self.measurer, self.path, self.key = measurer, path, canonical_json
        self.cache = {}
        for d in json_lines(path):
            self.cache[d["key"]] = d["result"]
        self.hits = self.misses = 0

    def _key(self, inp) -> str:
        return cache_key(inp.template, inp.workload, inp.config)

    def measure(self, inputs: list) -> list:
        import dataclasses

        from tuner.errors import ErrorCode
        from tuner.measure import MeasureResult
        keys = [self._key(i) for i in inputs]
        todo = [(k, i) for k, i in zip(keys, inputs) if k not in self.cache]
        self.misses += len(todo)
        self.hits += len(inputs) - len(todo)
        if todo:
            fresh = self.measurer.measure([i for _, i in todo])
            with open(self.path, "a") as f:
                for (k, _), res in zip(todo, fresh):
                    d = dataclasses.asdict(res)
                    d["error_code"] = int(res.error_code)
                    self.cache[k] = d
                    f.write(json.dumps({"key": k, "result": d}) + "\n")
        out = []
        for k in keys:
            d = dict(self.cache[k])
            out.append(MeasureResult(**{**d, "error_code": ErrorCode(d["error_code"])}))
        return out


class FastestTenth:
    """What the search reads of a measurement (variant ``xgb-fast10``): only the fastest tenth of its timings
    (at least one), so the record's median is about their 5th percentile. Load on a shared host only ever
    slows a kernel, and a measurement's own timings spread (on the CPU report's caches the median stands 5%
    above the fastest in half of them, 13% in a quarter); on the H200 a 5 µs kernel's timings fall into two
    modes, and the median lands in either. The runs' CSV keeps the measurement's median (``raw``)."""

    def __init__(self, measurer):
        self.measurer = measurer

    def measure(self, inputs: list) -> list:
        import dataclasses
        out = []
        for res in self.measurer.measure(inputs):
            c = sorted(res.costs or ())
            out.append(dataclasses.replace(res, costs=c[:max(1, math.ceil(len(c) / 10))]) if c else res)
        return out


def cache_key(template, workload, config) -> str:
    """The measurement cache's key of a (template, workload, config): canonical JSON."""
    from tuner.logs.record import canonical_json
    from tuner.templates import get_template
    t = get_template(template)
    return canonical_json([t.name, workload.key(), t.config_values(workload, config)])


def short_key(key: str) -> str:
    """A config's cache key, short (the CSV's per-trial ``keys``; the re-timing file's ``id``)."""
    import hashlib
    return hashlib.sha1(key.encode()).hexdigest()[:16]


def corpus(info, out: Path, trials: int, measurer, late=lambda: False) -> Path | None:
    """The transfer corpus: ``trials`` random configs of each development workload on this device, measured
    once (a re-run tops it up), in chunks of ``CORPUS_CHUNK``; None when ``late()`` stopped it first."""
    from collections import Counter

    from tuner.errors import ErrorCode
    from tuner.logs import load_records
    from tuner.logs.record import canonical_json
    from tuner.search import tune
    from tuner.templates import get_template
    path = out / f"tuning_corpus_{info.fingerprint}.jsonl"
    have = Counter(r.workload_key for r in (load_records(str(path)) if path.exists() else ())
                   if r.error_code != ErrorCode.INSTANTIATION)  # measured configs per workload
    with tempfile.TemporaryDirectory(prefix="tuning-corpus-") as d:
        for name, tname, kw in DEVELOPMENT:
            wl = get_template(tname).workload(**kw)
            n = have[(tname, canonical_json(wl.key()))]
            while n < trials:
                if late():
                    return None
                res = tune(tname, wl, device=info, trials=min(CORPUS_CHUNK, trials - n), sampler="random",
                           seed=1234, log=str(path), storage=f"sqlite:///{os.path.join(d, 'study.db')}",
                           transfer=False, progress=False, scopes=SCOPES, options=options(), measurer=measurer,
                           **STOCK)
                n += res.measured
                print(f"corpus {name}: {res.measured} new ({n} of {trials}), best "
                      f"{res.best.gflops if res.best else 0:.2f} GFLOP/s", flush=True)
                if not res.measured:
                    break  # the space has no more valid configs
    return path


CORPUS_CHUNK = 8  # corpus configs measured between two looks at the deadline


def best_so_far(gflops: list) -> list:
    out, best = [], 0.0
    for g in gflops:
        best = max(best, g or 0.0)
        out.append(round(best, 4))
    return out


def trials_to(curve: list, target: float, n: int) -> int:
    """1-based index of the first trial whose best-so-far reaches ``target``; ``n + 1`` if none (censored)."""
    for i, v in enumerate(curve, start=1):
        if v >= target:
            return i
    return n + 1


def _narrow_any_split() -> dict:
    from tuner.search.regions import GPU_REGIONS, REGIONS
    wide, narrow = REGIONS["CPU"]["conv2d"]
    return {"CPU": {"conv2d": [wide, {**narrow, "split_k": [1, 2]}]}, "GPU": GPU_REGIONS}


NARROW_ANY_SPLIT = _narrow_any_split()  # REPORT_4's 10x10 conv3x3 is fastest with no split (2026-11-28, fifth)


def tune_options(more: dict) -> dict:
    """A variant's ``tune()`` arguments: its options less the benchmark's own (``reading``), a regions table
    named in this module or ``tuner.search.regions`` (``"NARROW_ANY_SPLIT"``, ``"ONE_MODE"``, ...) replaced by the
    table."""
    more = {k: v for k, v in more.items() if k != "reading"}
    if isinstance(more.get("device_region"), str):
        from tuner.search import regions
        name = more["device_region"]
        more["device_region"] = globals()[name] if name in globals() else getattr(regions, name)
    return more


def run_one(template: str, wl, sampler: str, seed: int, trials: int, device, corpus_log: Path,
            measurer) -> dict:
    import optuna

    from tuner.search import tune
    from tuner.templates import get_template
    name, transfer, variant = VARIANTS[sampler]
    more = tune_options(variant)
    raw = measurer
    if variant.get("reading") == "fast10":
        measurer = FastestTenth(measurer)
    with tempfile.TemporaryDirectory(prefix="tuning-bench-") as d:
        log = os.path.join(d, "log.jsonl")
        shutil.copyfile(corpus_log, log)  # what the device's log holds before this layer
        start = time.perf_counter()
        storage = f"sqlite:///{os.path.join(d, 'study.db')}"
        res = tune(template, wl, device=device, trials=trials, sampler=name, seed=seed, log=log, storage=storage,
                   transfer=transfer, progress=False, scopes=SCOPES, options=options(), measurer=measurer, **more)
        wall = time.perf_counter() - start
        notes = {tr.number: tr.user_attrs.get("search") or {"by": tr.user_attrs.get("start") or
                                                            ("enqueued" if tr.system_attrs.get("fixed_params") else "")}
                 for tr in optuna.load_study(study_name=res.study_name, storage=storage).trials}
    t = get_template(template)
    full = [cache_key(template, wl, t.config(**r.config)) for r in res.records]
    keys = [short_key(k) for k in full]
    gflops = [r.gflops if r.ok and r.gflops else None for r in res.records]
    if raw is not measurer:  # the measurement's median, as every other variant's CSV holds
        flops = wl.flops
        gflops = [flops / statistics.median(raw.cache[k]["costs"]) / 1e9 if g and raw.cache[k].get("costs")
                  else g for k, g in zip(full, gflops)]
    best = max((r for r in res.records if r.ok and r.gflops), key=lambda r: r.gflops, default=None)
    cfg = {k: v for k, v in best.config.items() if not k.endswith("_scope")} if best else None
    by = [notes.get(r.trial, {}).get("by") or "random" for r in res.records]  # who proposed each measured trial
    last = next((notes[r.trial] for r in reversed(res.records) if "transfer_weight" in notes.get(r.trial, {})), {})
    search = {"by": by, "transfer_weight": last.get("transfer_weight"), "share": last.get("share")}
    return {"gflops": gflops, "best_config": cfg, "curve": best_so_far(gflops), "wall_s": wall, "trials": len(res.records),
            "keys": keys, "failed": sum(g is None for g in gflops), "search": search}


RETIMES = 5  # independent re-timings of each contender for the best (--retimes)
RETIME_WINDOW = 0.9  # contenders: configs whose estimate is within 10% of the workload's best estimate


def retimed_estimate(lines: list) -> float:
    """A re-timed config's GFLOP/s: its best timing in the last showdown it was timed in (``retime``; lines of
    a file written before 2026-11-28 have no showdown and count together). Load on a shared host only ever
    slows a kernel, so a config's best of several timings is its speed on the free host (timeit's reading);
    a showdown times every contender of a workload in the same rounds, so a pass taken under another load
    (a core given back between passes halves every kernel's time) scales them all alike. Failed timings are
    left out; none left: 0."""
    return max(showdown_timings(lines), default=0.0)


def showdown_timings(lines: list) -> list:
    """A re-timed config's successful timings (GFLOP/s) in the last showdown it was timed in."""
    last = max((d.get("pass", -1) for d in lines), default=-1)
    return [d["gflops"] for d in lines if d.get("gflops") and d.get("pass", -1) == last]


def estimates(rows: list, retimed: dict) -> dict:
    """``{workload: {config id: GFLOP/s}}`` of every config the runs measured: its re-timed estimate where it
    has re-timings (``retimed[id]``: the re-timing file's lines; ``retimed_estimate``), else the runs' one
    measurement."""
    out: dict = {}
    for r in rows:
        est = out.setdefault(r["workload"], {})
        for k, g in zip(r.get("keys") or (), r["gflops"]):
            est[k] = retimed_estimate(retimed[k]) if k in retimed else (g or 0.0)
    return out


def timed_in(retimed: dict, k: str, p) -> int:
    """How many times config ``k`` was timed in showdown ``p``."""
    return sum(d.get("pass") == p for d in retimed.get(k, ()))


def contenders(est: dict, retimed: dict, times: int, window: float = RETIME_WINDOW) -> list:
    """The next showdown's members: ``[]`` when every config within ``window`` of the best estimate has its
    ``times`` timings in the workload's last showdown, else every one of them and the last showdown's best,
    which carries that showdown's level into the next (a pass under another load moves both alike)."""
    best = max(est.values(), default=0.0)
    within = [k for k, g in est.items() if best > 0 and g >= window * best]
    passes = [d.get("pass") for k in est for d in retimed.get(k, ()) if d.get("pass") is not None]
    last = max(passes, default=None)
    members = [k for k in est if last is not None and timed_in(retimed, k, last)]
    done = {k for k in within if timed_in(retimed, k, last) >= times}
    if last is not None and done == set(within):
        return []
    carried = max(members, key=lambda k: est[k], default=None)
    return within + ([carried] if carried is not None and carried not in within else [])


def load_retimes(path: Path) -> dict:
    """The re-timing file: ``{config id: [line, ...]}``, a line ``{"id", "gflops", "pass", "round"}``
    (before 2026-11-28 ``{"id", "gflops", "ref", "ref_gflops", "round"}``, or ``gflops`` alone)."""
    out: dict = {}
    for d in json_lines(path):
        out.setdefault(d["id"], []).append(d)
    return out


def retime(rows: list, cache: dict, path: Path, measurer, times: int = RETIMES,
           window: float = RETIME_WINDOW, late=lambda: False) -> dict | None:
    """Noise decides "95% of the best" on a loaded CPU, so the contenders are timed again, in showdowns: every
    config within ``window`` of its workload's best estimate is measured ``times`` more times, in rounds, each
    round one batch holding every contender of every workload once, in a shuffled order; a config's estimate
    becomes its best timing in the showdown (``retimed_estimate``). The first measurement, which made it a
    contender, is left out (the winner's curse); a burst that slows one timing costs nothing while another
    timing of the config ran free; and a workload's contenders, timed in the same rounds, share whatever
    load a pass ran under. Repeats until a workload's configs within ``window`` of the (new) best were all
    timed together in its last showdown. ``cache``: the measurement cache's ``{full key: result}`` (to
    rebuild the configs); ``path``: the re-timing file (appended, so a re-run continues the showdown it was
    in). None when ``late()`` said stop before the last round."""
    import random as _random

    from tuner.measure import MeasureInput
    from tuner.task import workload_of
    from tuner.templates import get_template
    inputs = {}
    for full in cache:
        tname, wkey, values = json.loads(full)
        inputs[short_key(full)] = (tname, wkey, values)
    retimed = load_retimes(path)
    lines = [d for ls in retimed.values() for d in ls]
    next_pass = 1 + max((d.get("pass", 0) for d in lines), default=0)
    next_round = 1 + max((d.get("round", 0) for d in lines), default=0)
    # a showdown a killed run left unfinished: its members, by workload, go on from where they were
    workload_of_id = {k: r["workload"] for r in rows for k in (r.get("keys") or ())}
    open_pass: dict = {}  # workload -> (its last showdown, that showdown's members)
    for d in lines:
        if d.get("pass") is None or d["id"] not in workload_of_id:
            continue
        w = workload_of_id[d["id"]]
        p, members = open_pass.get(w, (-1, set()))
        if d["pass"] > p:
            open_pass[w] = (d["pass"], {d["id"]})
        elif d["pass"] == p:
            members.add(d["id"])
    rng = _random.Random(next_round)

    def make_input(k):
        tname, wkey, values = inputs[k]
        t = get_template(tname)
        return MeasureInput(tname, workload_of(t, wkey), t.make_config(values))

    while True:
        showdowns = {}  # workload -> (pass, members)
        for w, (p, members) in open_pass.items():
            if any(timed_in(retimed, k, p) < times for k in members):
                showdowns[w] = (p, sorted(members))
        est = estimates(rows, retimed)
        for w, e in est.items():
            if w in showdowns:
                continue
            todo = contenders({k: g for k, g in e.items() if k in inputs}, retimed, times, window)
            if todo:
                showdowns[w] = (next_pass, todo)
                next_pass += 1
        if not showdowns:
            return retimed
        need = max(times - timed_in(retimed, k, p) for p, ms in showdowns.values() for k in ms)
        print(f"re-timing {sum(len(ms) for _, ms in showdowns.values())} contenders of {len(showdowns)} "
              f"workloads together, {need} rounds", flush=True)
        for _ in range(need):
            if late():
                return None
            batch = [(k, p) for p, ms in showdowns.values() for k in ms if timed_in(retimed, k, p) < times]
            rng.shuffle(batch)
            res = measurer.measure([make_input(k) for k, _ in batch])
            with open(path, "a") as f:
                for (k, p), r in zip(batch, res):
                    flops = workload_of(get_template(inputs[k][0]), inputs[k][1]).flops
                    g = flops / statistics.median(r.costs) / 1e9 if r.ok and r.costs else None
                    d = {"id": k, "gflops": g, "pass": p, "round": next_round}
                    retimed.setdefault(k, []).append(d)
                    f.write(json.dumps(d) + "\n")
            next_round += 1
        open_pass = {w: (p, set(ms)) for w, (p, ms) in showdowns.items()}


def finish_rows(rows: list, n: int, retimed: dict | None = None) -> None:
    """Fill best_ever / trials_to_95pct / reached once all runs of a workload are in. With ``retimed``
    (config id -> its re-timings) each trial counts at its config's estimate (``estimates``): the
    ``curve_retimed`` column, which the metric then uses, as does ``best_ever`` (the best estimate)."""
    est = estimates(rows, retimed or {})
    best = {}
    for r in rows:
        best[r["workload"]] = max(best.get(r["workload"], 0.0), float(r["best_gflops_run"] or 0.0))
    for r in rows:
        if retimed and r.get("keys"):
            r["values"] = [est[r["workload"]][k] for k in r["keys"]]  # not in the CSV: rebuilt from it
            r["curve_retimed"] = best_so_far(r["values"])
            be = max(est[r["workload"]].values())
        else:
            r["curve_retimed"] = None
            r.pop("values", None)
            be = best[r["workload"]]
        r["best_ever"] = round(be, 4)
        k = trials_to(eval_curve(r), THRESHOLD * be, n) if be > 0 else n + 1
        r["trials_to_95pct"] = k
        r["reached"] = k <= n


def eval_curve(r: dict) -> list:
    """The best-so-far curve the metric reads: the re-timed one where there is one."""
    return r.get("curve_retimed") or r["curve"]


def fraction_at(r: dict, at: int) -> float:
    """A run's best after ``at`` trials (its last trial if it has fewer), a fraction of its workload's best ever."""
    return eval_curve(r)[min(at, len(r["curve"])) - 1] / float(r["best_ever"])


def write_csv(path: Path, rows: list) -> None:
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for r in rows:
            out = {k: r.get(k) for k in CSV_FIELDS}
            for k in ("curve", "gflops", "workload_args", "best_config", "keys", "curve_retimed", "search"):
                if not isinstance(out.get(k), str):
                    out[k] = json.dumps(out.get(k))
            w.writerow(out)
    os.replace(tmp, path)


def read_csv(path: Path) -> list:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["curve"] = json.loads(r["curve"])
        r["gflops"] = json.loads(r["gflops"])
        r["keys"] = json.loads(r.get("keys") or "null")  # None in a CSV written before the column
        r["curve_retimed"] = json.loads(r.get("curve_retimed") or "null")
        r["search"] = json.loads(r.get("search") or "null")
        for k in ("seed", "trials", "failed"):
            r[k] = int(r[k])
        for k in ("best_gflops_run", "wall_s", "s_per_trial"):
            r[k] = float(r[k])
    return rows


def geomean(values) -> float:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def fmt_trials(v: float, n: int) -> str:
    return f">{n}" if v > n else (f"{v:.0f}" if v == int(v) else f"{v:.1f}")


def seeds_line(rows: list, samplers: list, workloads: list) -> str:
    """The seeds the runs used: one list where every workload and sampler has the same seeds, else each sampler's
    runs per workload (random runs more seeds where its median is censored, to read its hit rate)."""
    runs = {(s, w): sorted(r["seed"] for r in rows if r["sampler"] == s and r["workload"] == w)
            for s in samplers for w in workloads}
    if len({tuple(v) for v in runs.values()}) == 1:
        seeds = next(iter(runs.values()))
        return f"seeds {', '.join(map(str, seeds))} ({len(seeds)} per workload and sampler)"

    def counts(s):
        ks = sorted({len(runs[s, w]) for w in workloads})
        return f"{s} {ks[0]}" if len(ks) == 1 else f"{s} {ks[0]} to {ks[-1]}"
    return "seeds 0 to K-1, K per workload: " + ", ".join(counts(s) for s in samplers)


def summarize(rows: list, n: int, meta: dict) -> str:
    samplers = [s for s in SAMPLERS if any(r["sampler"] == s for r in rows)]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    med, cens = {}, {}
    for w in workloads:
        for s in samplers:
            ks = [int(r["trials_to_95pct"]) for r in rows if r["workload"] == w and r["sampler"] == s]
            if ks:
                med[w, s] = statistics.median(ks)
                cens[w, s] = (sum(k > n for k in ks), len(ks))
    lines = [f"# Tuning efficiency: {meta['device_name']}", ""]
    lines += [f"- device: `{meta['device_name']}`, fingerprint `{meta['fingerprint']}`",
              f"- {meta['date']}; N = {n} measured trials per run, {seeds_line(rows, samplers, workloads)}, "
              f"{len(rows)} runs in all"
              + (", run one after another" if meta.get("jobs", 1) == 1 else ""),
              f"- held-out workloads (never tuned while the search was developed); every run starts from a fresh log "
              f"holding the transfer corpus ({meta.get('corpus', '?')}) and a fresh SQLite study; `tune()` with "
              f"its defaults (xgb transfers from the corpus; `xgb-cold`, where it was run, is xgb with `transfer=False`), "
              f"{meta['scope']} scopes, MeasureOptions(repeats=3, min_seconds=0.005, n_parallel=2, run_timeout=5, "
              f"build_timeout=30) for every "
              f"sampler; each (workload, config) measured once and its measurement shared by every run that "
              f"proposes it ({meta.get('distinct', '?')} distinct configs measured)",
              *([f"- the held-out workloads ran in {meta['jobs']} processes at once, each workload's runs one after "
                 f"another in its process (measurements of concurrent processes share the device)"]
                if meta.get("jobs", 1) > 1 else []),
              *([f"- noise: every config within {1 - RETIME_WINDOW:.0%} of its workload's best estimate was timed "
                 f"{meta['retimes']:g} more times after the runs, every contender of a workload in the same rounds (a "
                 f"showdown), each round one batch timing every contender once in a shuffled order; a contender's "
                 f"estimate is its best timing in the showdown (its first measurement left out), again until a "
                 f"workload's configs within {1 - RETIME_WINDOW:.0%} of its best estimate were all in its last "
                 f"showdown ({meta['retimed']} configs "
                 f"re-timed); `best ever` is the best estimate and every trial counts at its config's estimate; "
                 f"`best once` is the best single measurement"] if meta.get("retimed") else []),
              f"- metric: trials until the run's best-so-far GFLOP/s reaches {THRESHOLD:.0%} of the workload's best "
              f"ever (the max over all its runs, of all samplers); a run that "
              f"never reaches it is censored at N+1 and shown as `>{n}`; cells are the median over seeds, "
              f"(c/k) = c of k runs censored"]
    if meta.get("wall_s"):
        trials = sum(r["trials"] for r in rows)
        lines.append(f"- wall time {meta['wall_s'] / 60:.1f} min for {trials} measured trials: "
                     f"{meta['wall_s'] / trials:.2f} s per trial in all (tune() calls only: "
                     f"{sum(r['wall_s'] for r in rows) / trials:.2f} s)")
    once = bool(meta.get("retimed"))
    lines += ["", "| workload | best ever GFLOP/s | " + ("best once | " if once else "") + " | ".join(samplers)
              + " | xgb/random | xgb/tpe |",
              "| --- | ---: | " + ("---: | " if once else "") + " | ".join("---:" for _ in samplers) + " | ---: | ---: |"]
    ratios = {"random": [], "tpe": []}
    for w in workloads:
        be = max(float(r["best_ever"]) for r in rows if r["workload"] == w)
        cells = []
        for s in samplers:
            if (w, s) not in med:
                cells.append("")
                continue
            c, k = cens[w, s]
            cells.append(fmt_trials(med[w, s], n) + (f" ({c}/{k})" if c else ""))
        rs = []
        for other in ("random", "tpe"):
            if (w, "xgb") in med and (w, other) in med:
                ratio = med[w, "xgb"] / med[w, other]
                ratios[other].append(ratio)
                bound = "<=" if med[w, other] > n and med[w, "xgb"] <= n else \
                    ">=" if med[w, "xgb"] > n and med[w, other] <= n else "~" if med[w, other] > n else ""
                rs.append(f"{bound}{ratio:.2f}")
            else:
                rs.append("")
        be_once = max(float(r["best_gflops_run"]) for r in rows if r["workload"] == w)
        lines.append(f"| {w} | {be:.2f} | " + (f"{be_once:.2f} | " if once else "") + " | ".join(cells) + " | "
                     + " | ".join(rs) + " |")
    gm = {s: geomean([med[w, s] for w in workloads if (w, s) in med]) for s in samplers}
    lines += ["", f"**geometric mean over {len(workloads)} workloads of the median trials to {THRESHOLD:.0%}: "
              + ", ".join(f"{s} {gm[s]:.1f}" for s in samplers)
              + f"; ratio xgb/random {geomean(ratios['random']):.2f}, xgb/tpe {geomean(ratios['tpe']):.2f}** "
              f"(geometric means of the per-workload ratios; censored medians count as N+1 = {n + 1}). "
              f"Goal: xgb/random <= {meta.get('goal', 0.33)} and xgb/tpe < 1."]
    lines += random_by_hit_rate(rows, workloads, med, n)
    reached = {s: (sum(int(r["trials_to_95pct"]) <= n for r in rows if r["sampler"] == s),
                   sum(r["sampler"] == s for r in rows)) for s in samplers}
    lines += ["", f"Runs that reached {THRESHOLD:.0%} of best ever within N = {n} trials: "
              + ", ".join(f"{s} {a}/{b}" for s, (a, b) in reached.items()) + "."]
    # the same metric at lower thresholds (less censored; secondary)
    lines += ["", "Secondary: the same metric at lower thresholds (geometric mean over workloads of the median "
              "trials over seeds; censored = N+1):", "",
              "| threshold | " + " | ".join(samplers) + " | xgb/random | xgb/tpe | censored runs "
              + "/".join(samplers) + " |", "| ---: | " + " | ".join("---:" for _ in samplers) + " | ---: | ---: | ---: |"]
    for th in (0.7, 0.8, 0.9, THRESHOLD):
        meds, cen = {}, {}
        for s in samplers:
            ms = []
            for w in workloads:
                rs = [r for r in rows if r["workload"] == w and r["sampler"] == s]
                ks = [trials_to(eval_curve(r), th * float(r["best_ever"]), n) for r in rs]
                cen[s] = cen.get(s, 0) + sum(k > n for k in ks)
                if ks:
                    ms.append(statistics.median(ks))
            meds[s] = geomean(ms)
        ratio = [f"{meds['xgb'] / meds[o]:.2f}" if "xgb" in meds and o in meds else "" for o in ("random", "tpe")]
        lines.append(f"| {th:.0%} | " + " | ".join(f"{meds[s]:.1f}" for s in samplers) + " | "
                     + " | ".join(ratio) + " | " + "/".join(str(cen[s]) for s in samplers) + " |")
    # how good each sampler's result is after N trials, and after N/2 (same runs)
    lines += ["", f"Best found as a fraction of best ever, mean over seeds, after N/2 = {n // 2} and N = {n} trials:",
              "", "| workload | " + " | ".join(f"{s} @{n // 2} | {s} @{n}" for s in samplers) + " |",
              "| --- | " + " | ".join("---: | ---:" for _ in samplers) + " |"]
    for w in workloads:
        cells = []
        for s in samplers:
            rs = [r for r in rows if r["workload"] == w and r["sampler"] == s]
            for at in (n // 2, n):
                fr = [fraction_at(r, at) for r in rs if r["curve"]]
                cells.append(f"{statistics.mean(fr):.2f}" if fr else "")
        lines.append(f"| {w} | " + " | ".join(cells) + " |")
    lines += done_when(rows, workloads, samplers, n, meta.get("noise"))
    failed = sum(r["failed"] for r in rows)
    lines += ["", f"{failed} of {sum(r['trials'] for r in rows)} measured trials failed (build, run or check)."]
    return "\n".join(lines) + "\n"


def done_when(rows: list, workloads: list, samplers: list, n: int, noise: dict | None = None) -> list:
    """Issue 37's per-workload checks: xgb's median best after N trials (a fraction of best ever, each trial at
    its config's estimate) at least TPE's, and at least xgb-cold's (transfer never worse than none). With
    ``noise`` (``{workload: the relative standard error of one re-timed estimate}``, ``retime_noise``) each
    check is also read within the noise: xgb is behind only where the gap exceeds two standard errors of the
    difference of two estimates (2 * sqrt(2) * noise)."""
    others = [s for s in ("tpe", "xgb-cold") if s in samplers]
    if "xgb" not in samplers or not others:
        return []
    noise = noise or {}
    out = ["", f"Median over seeds of the best after N = {n} trials, a fraction of best ever (issue 37: xgb's at "
           f"least TPE's and at least xgb-cold's on every workload); `noise`: one standard error of a re-timed "
           f"estimate, and `within noise` reads a gap under 2 * sqrt(2) of it (two standard errors of a "
           f"difference) as no gap:", "",
           "| workload | " + " | ".join(["xgb", *others]) + " | " + " | ".join(f"xgb >= {o}" for o in others)
           + " | noise | " + " | ".join(f"within noise: xgb >= {o}" for o in others) + " |",
           "| --- | " + " | ".join("---:" for _ in range(2 + 3 * len(others))) + " |"]
    held = {o: 0 for o in others}
    held_noise = {o: 0 for o in others}
    for w in workloads:
        med = {}
        for s in ["xgb", *others]:
            fr = [fraction_at(r, n) for r in rows if r["workload"] == w and r["sampler"] == s and r["curve"]]
            med[s] = statistics.median(fr) if fr else float("nan")
        ok = {o: med["xgb"] >= med[o] for o in others}
        slack = 2 * math.sqrt(2) * noise.get(w, 0.0)
        ok_noise = {o: med["xgb"] >= med[o] - slack for o in others}
        for o in others:
            held[o] += ok[o]
            held_noise[o] += ok_noise[o]
        out.append(f"| {w} | " + " | ".join(f"{med[s]:.3f}" for s in ["xgb", *others]) + " | "
                   + " | ".join("yes" if ok[o] else "**no**" for o in others)
                   + (f" | {noise[w]:.3f} | " if w in noise else " | | ")
                   + " | ".join(("yes" if ok_noise[o] else "**no**") if w in noise else "" for o in others) + " |")
    out += ["", "Held on " + ", ".join(f"{held[o]} of {len(workloads)} workloads against {o}" for o in others)
            + ("; within the noise on " + ", ".join(f"{held_noise[o]} of {len(workloads)} against {o}" for o in others)
               if noise else "") + "."]
    return out


def retime_noise(rows: list, retimed: dict) -> dict:
    """``{workload: the relative standard error of one re-timed estimate}``: for every re-timed config of the
    workload, the spread of its timings in its last showdown (1.4826 * median absolute deviation, over the
    median) times the standard error of a median of R of them (1.2533 / sqrt(R)); the median over the
    configs. The estimate is the best of the R, which the one-sided noise of a shared host moves less: an
    upper bound on its error."""
    by_workload: dict = {}
    for r in rows:
        for k in r.get("keys") or ():
            if k in retimed:
                by_workload.setdefault(r["workload"], set()).add(k)
    out = {}
    for w, ks in by_workload.items():
        errs = []
        for k in ks:
            timings = showdown_timings(retimed[k])
            if len(timings) >= 3:
                m = statistics.median(timings)
                mad = statistics.median(abs(x - m) for x in timings)
                errs.append(1.4826 * mad / m * 1.2533 / math.sqrt(len(timings)))
        if errs:
            out[w] = statistics.median(errs)
    return out


def hit_rate_median(hits: int, draws: int) -> tuple:
    """Random search's median trials to its first hit when a draw hits with probability p = hits / draws (the
    geometric distribution: the least k with 1 - (1 - p)^k >= 1/2), with the same median at the ends of p's
    exact 95% interval (Clopper-Pearson): ``(estimate, low, high)``; no hit: ``(inf, low, inf)``."""
    from scipy.stats import binomtest

    def median(p: float) -> float:
        return math.inf if p <= 0 else 1.0 if p >= 1 else float(math.ceil(math.log(0.5) / math.log1p(-p)))

    ci = binomtest(hits, draws).proportion_ci(confidence_level=0.95, method="exact")
    return median(hits / draws), median(ci.high), median(ci.low)


def random_by_hit_rate(rows: list, workloads: list, med: dict, n: int) -> list:
    """Random search's median trials to 95% from its hit rate instead of its runs, which N censors: a random
    run's draws do not depend on its measurements, so every draw of every random run (seeds pooled) is one
    trial of the same chance p of landing at or above 95% of the best ever (each trial counted at its
    config's estimate, as the curves count it); the median trials to the first hit follow (``hit_rate_median``).
    The ratio puts xgb's median (the runs above) over it."""
    if not any(r["sampler"] == "random" for r in rows) or not any(r["sampler"] == "xgb" for r in rows):
        return []
    out = ["", f"Random search from its hit rate (uncensored by N): every trial of every random run pooled, a hit "
           f"is a trial at or above {THRESHOLD:.0%} of best ever; random's median trials to {THRESHOLD:.0%} is "
           f"the geometric distribution's median at the hit rate (95% interval from the rate's exact interval); "
           f"xgb is its median above (`>N`: censored, the ratio then a lower bound):", "",
           "| workload | random draws | hits | random's median trials (95% interval) | xgb | xgb/random |",
           "| --- | ---: | ---: | ---: | ---: | ---: |"]
    known, undecided, bounded = [], [], False  # ratios exact or bounded above; workloads where it is not known
    worst = []  # each ratio at the end of random's 95% interval least favourable to xgb (its low median)
    for w in workloads:
        if (w, "xgb") not in med:
            continue
        rs = [r for r in rows if r["workload"] == w and r["sampler"] == "random"]
        be = max(float(r["best_ever"]) for r in rows if r["workload"] == w)
        vals = [v for r in rs for v in trial_values(r)]
        if not vals:
            continue
        hits = sum(v >= THRESHOLD * be for v in vals)
        m, lo, hi = hit_rate_median(hits, len(vals))
        x = med[w, "xgb"]
        if x > n:  # xgb censored: its median is above N, the ratio unknown above
            txt = f">={x / m:.2f}" if hits else "?"
            undecided.append(w)
        elif hits:
            known.append(x / m)
            worst.append(x / lo)
            txt = f"{x / m:.2f}"
        else:  # random's median is above lo (95%)
            bounded = True
            known.append(x / lo)
            worst.append(x / lo)
            txt = f"<={x / lo:.2f}"
        cell = f"{m:.0f} ({lo:.0f} to {hi:.0f})" if hits else f">{lo:.0f}"
        out.append(f"| {w} | {len(vals)} | {hits} | {cell} | {fmt_trials(x, n)} | {txt} |")
    out += ["", f"**xgb/random from the hit rate: {'<=' if bounded else ''}{geomean(known):.2f}** (geometric mean "
            f"over the {len(known)} workloads where the ratio is known or bounded above; random draws unseen configs, "
            f"without replacement, so in a small space its real median is somewhat below the geometric one"
            + (f"; not known where xgb's median is censored: {', '.join(undecided)}" if undecided else "") + ")."]
    if worst:
        out += ["", f"With each of those {len(worst)} workloads' random median at the low end of its 95% interval "
                    f"(the end least favourable to xgb): xgb/random <= {geomean(worst):.2f}."]
    return out


def trial_values(r: dict) -> list:
    """Each trial's GFLOP/s as the metric counts it: its config's estimate where ``finish_rows`` re-timed
    (``r["values"]``), else its one measurement."""
    return r.get("values") or [g or 0.0 for g in r["gflops"]]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=64, help="measured trials per run (N)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per workload and sampler: 0 .. K-1")
    p.add_argument("--workloads", default=".", help="regex over the held-out workload names: " +
                   ", ".join(w[0] for w in WORKLOADS))
    p.add_argument("--samplers", default=",".join(SAMPLERS))
    p.add_argument("--corpus-trials", type=int, default=24, metavar="M",
                   help="random configs measured per development workload for the transfer corpus (default 24)")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--device", default=None, help="default: the default device")
    p.add_argument("--summarize", metavar="CSV", help="only rebuild the markdown from an existing CSV")
    p.add_argument("--parallel", type=int, default=2, help="build processes per measurer (default 2)")
    p.add_argument("--jobs", type=int, default=1, help="run the held-out workloads in this many processes at "
                   "once (each its own measurement cache; for a GPU host with many cores), then merge")
    p.add_argument("--deadline", type=float, help="seconds after which no corpus chunk, run or re-timing round "
                   "starts (with --jobs: the workload processes are stopped then, and a run cut short is lost); "
                   f"work left makes the exit status {UNFINISHED}, and the same command with the same --out goes on "
                   "from there")
    p.add_argument("--retimes", type=int, default=RETIMES, metavar="R",
                   help=f"after the runs, time every contender for a workload's best (within "
                   f"{1 - RETIME_WINDOW:.0%}% of it) R more times and judge by the medians (default {RETIMES}; "
                   f"0: the runs' one measurement decides)")
    p.add_argument("--proposal-cost", action="store_true", help="only time what each sampler costs the host: "
                   "tune() over a device that measures nothing (proposals per second; the corpus is measured first "
                   "if --out lacks it)")
    p.add_argument("--replay", nargs="+", metavar="FILE", help="no device: search the measured tables of these "
                   "measurement caches and re-timing files (tuning_cache_*.jsonl[.gz], tuning_retime_*.jsonl) instead, "
                   "a proxy for developing the search; --out's corpus is the transfer")
    p.add_argument("--replay-rows", nargs="+", metavar="JSON", help="only summarize the rows of earlier replays "
                   "(replay_*.json) together, one table over all their variants")
    p.add_argument("--profile", metavar="PROFILE.json", help="with --replay: replay as this device (a profile written "
                   "by `tuner devices --json`, e.g. bench/results/behaviour/profile_h200.json) instead of a local one")
    p.add_argument("--part", help=argparse.SUPPRESS)  # a --jobs child: file-name suffix
    a = p.parse_args(argv)
    begun = time.perf_counter()

    def late() -> bool:
        return a.deadline is not None and time.perf_counter() - begun > a.deadline
    global PARALLEL
    PARALLEL = a.parallel

    from tuner.measure import Measurer
    from tuner.runtime.opencl.device import choose_device
    from tuner.templates import get_template
    if a.summarize:
        src = Path(a.summarize)
        rows = read_csv(src)
        n = max(r["trials"] for r in rows)
        fp = src.stem.split("_", 1)[-1].split(".")[0]
        finish_rows(rows, n, load_retimes(src.parent / f"tuning_retime_{fp}.jsonl") if a.retimes else None)
        md = summarize(rows, n, meta_of(rows, src, sum(r["wall_s"] for r in rows)))
        src.with_suffix(".md").write_text(md)
        print(md)
        print(f"wrote {src.with_suffix('.md')} (wall time = the sum of the runs' tune() calls)")
        return 0

    if a.replay_rows:
        rows = [r for f in a.replay_rows for r in json.loads(Path(f).read_text())]
        print(replay_summary(rows, a.trials))
        return 0
    if a.profile and not a.replay:
        print("error: --profile replays as another device; give --replay too", file=sys.stderr)
        return 2
    if a.profile:
        from tuner.errors import TunerError
        from tuner.target import load_profile
        try:
            info = load_profile(a.profile)
        except TunerError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    else:
        info = choose_device(a.device)
    samplers = [s.strip() for s in a.samplers.split(",") if s.strip()]
    workloads = [w for w in WORKLOADS if re.search(a.workloads, w[0])]
    if not workloads or not samplers or any(s not in SAMPLERS for s in samplers):
        print(f"error: no workload selected, or a sampler not in {', '.join(SAMPLERS)}", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = f".{a.part}" if a.part else ""
    csv_path, md_path = out / f"tuning_{info.fingerprint}{suffix}.csv", out / f"tuning_{info.fingerprint}.md"
    if a.replay:
        caches = [f for f in a.replay if "tuning_cache_" in Path(f).name]
        retimes = [f for f in a.replay if "tuning_retime_" in Path(f).name]
        tables = replay_tables(caches, retimes, info, workloads)
        rows = replay(info, tables, out / f"tuning_corpus_{info.fingerprint}.jsonl", samplers, a.seeds, a.trials)
        md = replay_summary(rows, a.trials)
        (out / f"replay_{info.fingerprint}.md").write_text(md)
        (out / f"replay_{info.fingerprint}.json").write_text(json.dumps(rows))
        print(md)
        return 0
    if a.proposal_cost:
        with Measurer(info, options()) as real:
            corpus_log = corpus(info, out, a.corpus_trials,
                                CachedMeasurer(real, out / f"tuning_cache_{info.fingerprint}.jsonl"), late)
        if corpus_log is None:
            return unfinished("the transfer corpus")
        print(proposal_cost(info, corpus_log, workloads, samplers, a.trials, out))
        return 0
    if a.jobs > 1:
        return run_jobs(a, info, workloads, samplers, out, csv_path, md_path, late)
    rows = read_csv(csv_path) if csv_path.exists() else []
    have = {(r["workload"], r["sampler"], r["seed"]) for r in rows}
    total = len(workloads) * a.seeds * len(samplers)
    print(f"device {info.name} ({info.fingerprint}); {len(workloads)} held-out workloads x {a.seeds} seeds x "
          f"{len(samplers)} samplers = {total} runs of {a.trials} trials ({len(have)} in {csv_path} already)",
          flush=True)
    start, done = time.perf_counter(), 0
    with Measurer(info, options()) as real:
        measurer = CachedMeasurer(real, out / f"tuning_cache_{info.fingerprint}{suffix}.jsonl")
        corpus_log = out / f"tuning_corpus_{info.fingerprint}.jsonl" if a.part else \
            corpus(info, out, a.corpus_trials, measurer, late)  # a --jobs child: its parent measured it
        if corpus_log is None:
            return unfinished("the transfer corpus")
        for seed in range(a.seeds):  # seed-major: a benchmark cut short still has every workload
            for name, tname, kw in workloads:
                wl = get_template(tname).workload(**kw)
                for s in samplers:
                    done += 1
                    if (name, s, seed) in have:
                        continue
                    if late():
                        return unfinished(f"{total - len(rows)} runs")
                    r = run_one(tname, wl, s, seed, a.trials, info, corpus_log, measurer)
                    curve = r["curve"]
                    best = curve[-1] if curve else 0.0
                    first_best = next((i for i, v in enumerate(curve, 1) if v >= best), 0) if best else 0
                    rows.append({"workload": name, "template": tname, "workload_args": kw, "scope": "buffer",
                                 "sampler": s, "seed": seed, "trials": r["trials"], "trials_to_95pct": "",
                                 "reached": "", "best_gflops_run": round(best, 4), "best_ever": "",
                                 "failed": r["failed"], "wall_s": round(r["wall_s"], 2),
                                 "s_per_trial": round(r["wall_s"] / max(r["trials"], 1), 3),
                                 "best_config": r["best_config"], "curve": curve,
                                 "gflops": [round(g, 4) if g else None for g in r["gflops"]], "keys": r["keys"],
                                 "device": info.name, "search": r["search"]})
                    write_csv(csv_path, rows)
                    el = time.perf_counter() - start
                    print(f"[{done:3d}/{total}] {name:20s} {s:8s} seed {seed}: {r['trials']} trials "
                          f"({r['failed']} failed), best {best:6.2f} GFLOP/s at trial {first_best:2d}, "
                          f"{r['wall_s']:5.1f} s; cache {measurer.hits} hits / {measurer.misses} measured; "
                          f"elapsed {el / 60:5.1f} min", flush=True)
        retimed = None
        if a.retimes and not a.part:
            retimed = retime(rows, measurer.cache, out / f"tuning_retime_{info.fingerprint}.jsonl", real, a.retimes,
                             late=late)
            if retimed is None:
                return unfinished("the re-timing of the contenders")
    if a.part:
        return 0  # the parent merges
    finish_rows(rows, a.trials, retimed)
    write_csv(csv_path, rows)
    md = summarize(rows, a.trials, meta_of(rows, csv_path, time.perf_counter() - start))
    md_path.write_text(md)
    print()
    print(md)
    print(f"wrote {csv_path} and {md_path}")
    return 0


CHILD_GRACE_S = 30  # how long past the deadline a --jobs child may finish the run it is in before it is stopped
UNFINISHED = 3  # the exit status of a benchmark stopped by --deadline with work left


def unfinished(what: str) -> int:
    print(f"deadline: not finished ({what} left); run the same command again, with the same --out, to go on",
          flush=True)
    return UNFINISHED


def run_jobs(a, info, workloads, samplers, out: Path, csv_path: Path, md_path: Path, late) -> int:
    """The corpus here, then one child process per held-out workload, ``a.jobs`` at a time; then the merge."""
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    from tuner.measure import Measurer
    start = time.perf_counter()
    with Measurer(info, options()) as real:
        if corpus(info, out, a.corpus_trials, CachedMeasurer(real, out / f"tuning_cache_{info.fingerprint}.jsonl"),
                  late) is None:
            return unfinished("the transfer corpus")

    def child(w) -> int:
        part = re.sub(r"[^A-Za-z0-9]+", "_", w[0])
        cmd = [sys.executable, *([] if sys.flags.safe_path is False else ["-P"]), str(Path(__file__).resolve()),
               "--trials", str(a.trials), "--seeds", str(a.seeds), "--samplers", ",".join(samplers),
               "--corpus-trials", str(a.corpus_trials), "--out", str(out), "--device", a.device or info.fingerprint,
               "--parallel", str(a.parallel), "--workloads", f"^{re.escape(w[0])}$", "--part", part]
        left = None if a.deadline is None else a.deadline - (time.perf_counter() - start)
        if left is not None and left < 1:
            return UNFINISHED
        if left is not None:  # the child starts no run after its deadline; a run it is in is stopped here
            cmd += ["--deadline", str(left)]
        try:
            return subprocess.run(cmd, timeout=None if left is None else left + CHILD_GRACE_S).returncode
        except subprocess.TimeoutExpired:
            print(f"deadline: stopped {w[0]} (its finished runs are kept)", flush=True)
            return UNFINISHED

    with ThreadPoolExecutor(a.jobs) as pool:
        codes = list(pool.map(child, workloads))
    if UNFINISHED in codes:
        return unfinished(f"the runs of {sum(c == UNFINISHED for c in codes)} workloads")
    rows = []
    for part in sorted(out.glob(f"tuning_{info.fingerprint}.*.csv")):
        rows += read_csv(part)
    retimed = None
    if a.retimes:
        cache = {}
        for path in out.glob(f"tuning_cache_{info.fingerprint}*.jsonl"):
            cache.update(CachedMeasurer(None, path).cache)
        with Measurer(info, options()) as real:
            retimed = retime(rows, cache, out / f"tuning_retime_{info.fingerprint}.jsonl", real, a.retimes,
                             late=late)
        if retimed is None:
            return unfinished("the re-timing of the contenders")
    finish_rows(rows, a.trials, retimed)
    write_csv(csv_path, rows)
    md = summarize(rows, a.trials, meta_of(rows, csv_path, time.perf_counter() - start, jobs=a.jobs))
    md_path.write_text(md)
    print(md)
    print(f"wrote {csv_path} and {md_path}; child exit codes {codes}")
    return 0 if not any(codes) else 1


def proposal_cost(info, corpus_log: Path, workloads: list, samplers: list, trials: int, out: Path) -> str:
    """What a sampler costs the host: ``tune()`` with each sampler over a device that measures nothing (each
    config's time made up from a hash of it, so every proposal is new work for the sampler), from a log holding
    the transfer corpus, as each benchmark run does; proposals per second of ``tune()``'s whole loop (Optuna's
    storage, the log, the sampler), seed 0, one workload after another. Writes ``<out>/tuning_cost_<fp>.md``."""
    import hashlib

    from tuner.measure import MeasureResult
    from tuner.measure.runner import Runner
    from tuner.search import tune
    from tuner.templates import get_template

    class HashDevice(Runner):
        def __init__(self):
            self.info = info

        def measure(self, inputs):
            out = []
            for i in inputs:
                h = int(hashlib.sha1(cache_key(i.template, i.workload, i.config).encode()).hexdigest()[:8], 16)
                out.append(MeasureResult(costs=[i.workload.flops / ((1 + h % 1000) * 1e8)] * 2))
            return out

    lines = [f"# What the samplers cost the host: {info.name}", "",
             f"`tune()` over a device that measures nothing, {trials} proposals per run from a log holding the "
             f"transfer corpus ({corpus_log.name}), batches of {PARALLEL}, seed 0; proposals per second "
             f"(host: {os.cpu_count()} logical CPUs, {datetime.datetime.now():%Y-%m-%d %H:%M}).", "",
             "| workload | " + " | ".join(samplers) + " |", "| --- | " + " | ".join("---:" for _ in samplers) + " |"]
    rates: dict = {s: [] for s in samplers}
    for name, tname, kw in workloads:
        wl = get_template(tname).workload(**kw)
        cells = []
        for s in samplers:
            sampler, transfer, more = VARIANTS[s]
            with tempfile.TemporaryDirectory(prefix="tuning-cost-") as d:
                log = os.path.join(d, "log.jsonl")
                shutil.copyfile(corpus_log, log)
                t0 = time.perf_counter()
                res = tune(tname, wl, device=info, trials=trials, sampler=sampler, seed=0, log=log,
                           storage=f"sqlite:///{os.path.join(d, 'study.db')}", transfer=transfer, progress=False,
                           scopes=SCOPES, options=options(), measurer=HashDevice(), **tune_options(more))
                rate = res.measured / (time.perf_counter() - t0)
            rates[s].append(rate)
            cells.append(f"{rate:.1f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Geometric mean: " + ", ".join(f"{s} {geomean(r):.1f}" for s, r in rates.items())
              + " proposals per second."]
    md = "\n".join(lines) + "\n"
    (out / f"tuning_cost_{info.fingerprint}.md").write_text(md)
    return md


class TableSpace:
    """A bound space cut down to the configs a measurement cache holds (``replay``): it samples them uniformly
    and refuses every other config, so that a sampler searches the measured table as it would the space."""

    def __init__(self, bound, table: dict):
        self.bound, self.space, self.choices = bound, bound.space, bound.choices
        self.names = list(bound.choices)
        self.keys = list(table)

    def key(self, values: dict) -> tuple:
        return tuple(values[n] for n in self.names)

    def sample(self, rng) -> dict:
        return dict(zip(self.names, self.keys[int(rng.integers(len(self.keys)))]))

    def violations(self, values: dict) -> list:
        return [] if self.key(values) in self._set else ["not in the measured table"]

    @property
    def _set(self) -> set:
        if not hasattr(self, "_keys"):
            self._keys = set(self.keys)
        return self._keys

    def size(self) -> int:
        return len(self.keys)


def replay_tables(caches: list, retimes: list, info, workloads: list) -> dict:
    """``{workload name: (bound space, {config key: GFLOP/s})}`` from measurement caches (JSONL, gzipped or
    not) and re-timing files: each config at its re-timed estimate where it has one, else its one
    measurement; a failed one at 0."""
    import gzip

    from tuner.logs.record import canonical_json, scope_knobs
    from tuner.templates import get_template
    retimed: dict = {}
    for path in retimes:
        for k, lines in load_retimes(Path(path)).items():
            retimed.setdefault(k, []).extend(lines)
    wanted = {}
    for name, tname, kw in workloads:
        t = get_template(tname)
        wl = t.workload(**kw)
        wanted[canonical_json([t.name, wl.key()])] = (name, t, wl)
    tables: dict = {}
    for path in caches:
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(path, "rt") as f:
            for line in f:
                try:
                    d = json.loads(line)
                except ValueError:
                    continue
                tname, wkey, values = json.loads(d["key"])
                hit = wanted.get(canonical_json([tname, wkey]))
                if hit is None:
                    continue
                name, t, wl = hit
                if name not in tables:
                    tables[name] = (t.space(wl, info, **scope_knobs(SCOPES)), {})
                bound, table = tables[name]
                res = d["result"]
                k = short_key(d["key"])
                if k in retimed:
                    g = retimed_estimate(retimed[k])
                elif res.get("error_code") == 0 and res.get("costs"):
                    g = wl.flops / statistics.median(res["costs"]) / 1e9
                else:
                    g = 0.0
                try:
                    table[tuple(values[n] for n in bound.choices)] = g
                except KeyError:
                    continue
    return tables


def replay(info, tables: dict, corpus_log: Path, variants: list, seeds: int, trials: int) -> list:
    """A proxy for the benchmark without a device: each variant searches each workload's measured table
    (``TableSpace``) with the sampler and the start ``tune()`` gives it (the fallback and the device's region
    first where the table holds them), one proposal at a time, from the corpus as transfer. Rows as the runs'
    (``gflops`` per trial), the table's value of each config standing for its measurement."""
    import dataclasses as dc

    import optuna
    from optuna.distributions import CategoricalDistribution

    from tuner.logs import load_records
    from tuner.search.regions import REGION_SEEDS, region_configs, region_of
    from tuner.search.samplers import make_sampler
    from tuner.task import workload_of
    from tuner.templates import get_template
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    records = load_records(str(corpus_log))
    rows = []
    for name, tname, kw in [w for w in WORKLOADS if w[0] in tables]:
        t = get_template(tname)
        wl = t.workload(**kw)
        bound, table = tables[name]
        space = TableSpace(bound, table)
        defaults = {f.name: f.default for f in dc.fields(t.config) if f.default is not dc.MISSING}
        corpus_rows = [(t.space_vars(workload_of(t, r.workload)), {**defaults, "dtype": r.workload.get("dtype"),
                                                                     **r.config}, r.gflops)
                       for r in records if r.template == tname and r.ok and r.gflops]
        fallback = t.config_values(wl, t.fallback_with(wl, info, **{f"{k}_scope": v for k, v in SCOPES.items()}))
        for v in variants:
            sampler, transfer, more = VARIANTS[v]
            regions = tune_options(more).get("device_region", True)
            modes = region_of(info.type, tname, regions)
            for seed in range(seeds):
                smp = make_sampler(sampler, space, t, t.space_vars(wl), seed=seed,
                                   transfer=corpus_rows if transfer else [], options=more.get("sampler_options"),
                                   modes=modes)  # as open_session hands them over
                study = optuna.create_study(direction="maximize", sampler=smp)
                start = []
                if more.get("fallback_first", True):
                    start.append({n: fallback[n] for n in space.names})
                if regions:
                    start += region_configs(bound, modes, REGION_SEEDS, seed)
                for params in start:
                    if space.key(params) in table:
                        study.enqueue_trial(params)
                dists = {n: CategoricalDistribution(c) for n, c in space.choices.items()}
                got, asked = [], 0
                while len(got) < trials and asked < 20 * trials:
                    asked += 1
                    tr = study.ask(dists)
                    k = space.key(tr.params)
                    measured = {space.key(x.params) for x in study.trials[:-1]  # a trial without params holds no config
                                if x.params and x.state != optuna.trial.TrialState.RUNNING}
                    if k not in table or k in measured:
                        study.tell(tr, state=optuna.trial.TrialState.FAIL)
                        continue
                    g = table[k]
                    study.tell(tr, g) if g > 0 else study.tell(tr, state=optuna.trial.TrialState.FAIL)
                    got.append(g)
                rows.append({"workload": name, "sampler": v, "seed": seed, "gflops": got,
                             "best_ever": max(table.values()), "search": getattr(smp, "trace", [])[-1:]})
    return rows


def replay_summary(rows: list, n: int) -> str:
    """Per workload and variant: median trials to 95% of the table's best (censored at N+1) and the median
    best after N as a fraction of it; geometric means and each variant's ratio to random and TPE."""
    variants = list(dict.fromkeys(r["sampler"] for r in rows))
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    med, best = {}, {}
    for w in workloads:
        for v in variants:
            rs = [r for r in rows if r["workload"] == w and r["sampler"] == v]
            if rs:
                be = rs[0]["best_ever"]
                med[w, v] = statistics.median(trials_to(best_so_far(r["gflops"]), THRESHOLD * be, n) for r in rs)
                best[w, v] = statistics.median(max(r["gflops"][:n], default=0.0) / be for r in rs)
    lines = ["| workload | " + " | ".join(f"{v} trials / best@N" for v in variants) + " |",
             "| --- | " + " | ".join("---:" for _ in variants) + " |"]
    for w in workloads:
        lines.append(f"| {w} | " + " | ".join(f"{fmt_trials(med[w, v], n)} / {best[w, v]:.2f}" for v in variants) + " |")
    gm = {v: geomean([med[w, v] for w in workloads]) for v in variants}
    lines += ["", "geometric mean of median trials to 95%: " + ", ".join(f"{v} {gm[v]:.1f}" for v in variants)]
    for o in ("random", "tpe"):
        if o in variants:
            lines.append(f"ratio to {o}: " + ", ".join(f"{v} {geomean([med[w, v] / med[w, o] for w in workloads]):.2f}"
                                                      for v in variants if v != o))
    if "tpe" in variants:
        lines.append("workloads where the median best@N is below TPE's: " + ", ".join(
            f"{v} {sum(best[w, v] < best[w, 'tpe'] for w in workloads)}" for v in variants if v != "tpe"))
    return "\n".join(lines) + "\n"


def meta_of(rows: list, csv_path: Path, wall: float, jobs: int = 1) -> dict:
    from tuner.errors import ErrorCode
    fp = csv_path.stem.split("_", 1)[-1].split(".")[0]
    distinct = 0  # configs built and timed (a config the space rejects costs no device work); corpus included
    for cache in csv_path.parent.glob(f"tuning_cache_{fp}*.jsonl"):
        lines = [json.loads(x) for x in cache.read_text().splitlines() if x.strip().endswith("}")]
        distinct += sum(d["result"]["error_code"] != int(ErrorCode.INSTANTIATION) for d in lines)
    corpus_n = len(DEVELOPMENT)
    retimes = load_retimes(csv_path.parent / f"tuning_retime_{fp}.jsonl")
    wanted = {k for r in rows for k in (r.get("keys") or ())}
    retimed = sum(k in wanted for k in retimes) if any(r.get("curve_retimed") for r in rows) else 0
    counts = [len(v) for k, v in retimes.items() if k in wanted]
    date = datetime.datetime.fromtimestamp(csv_path.stat().st_mtime).strftime("%Y-%m-%d %H:%M")
    return {"device_name": rows[0]["device"], "fingerprint": fp, "date": date,
            "scope": "buffer", "wall_s": wall, "distinct": distinct, "jobs": jobs, "retimed": retimed,
            "retimes": statistics.median(counts) if counts else 0,
            "noise": retime_noise(rows, retimes) if retimed else {},
            "goal": 0.33,  # issue 37, on the CPU device and the GPU (issue 26 had asked 0.5 on a CPU)
            "corpus": f"{corpus_n} development workloads: " + ", ".join(w[0] for w in DEVELOPMENT)}


if __name__ == "__main__":
    sys.exit(main())
