"""Half arithmetic against float arithmetic, per template (issue 56, item 1): the ``compute`` knob's three values
on float16 storage -- ``float32`` (float arithmetic), ``half`` (half products, float sums) and ``half_acc`` (half
throughout) -- and float32 storage beside them, on a few layers of ResNet-18, MobileNetV2 and a ViT block.

Each variant is the template's fallback config for the device with only ``compute`` changed (the same tiles and
work-groups: the arithmetic is the only difference), built, checked against the NumPy reference with the
config's tolerance (``Template.tolerance``), and timed: the median of ``--repeats`` profiled runs, in
``--rounds`` rounds alternating the variants (the median of the rounds' medians). A variant the space rejects
(``half_acc`` past its reduction limit, or a device without cl_khr_fp16) is a row that says which constraint.

    .venv/bin/python bench/half_compute.py [--device intel] [--repeats 15] [--rounds 3] [--quick]

Writes ``bench/results/half/half_compute_<fingerprint>.csv`` and ``.md``.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from tuner.runtime.opencl import open_device
from tuner.runtime.opencl.launch import build
from tuner.templates import get_template

LAYERS = [  # (label, template, workload fields)
    ("resnet18 3x3 64->64 @56", "conv2d", dict(data=(1, 64, 56, 56), kernel=(64, 64, 3, 3), padding=1, bias=True,
                                               activation="relu")),
    ("resnet18 3x3 256->256 @14", "conv2d", dict(data=(1, 256, 14, 14), kernel=(256, 256, 3, 3), padding=1,
                                                 bias=True, activation="relu")),
    ("mbv2 1x1 32->192 @56", "conv2d", dict(data=(1, 32, 56, 56), kernel=(192, 32, 1, 1), bias=True,
                                            activation="relu6")),
    ("mbv2 1x1 96->576 @14", "conv2d", dict(data=(1, 96, 14, 14), kernel=(576, 96, 1, 1), bias=True,
                                            activation="relu6")),
    ("mbv2 dw3x3 144 @56", "depthwise_conv2d", dict(data=(1, 144, 56, 56), kernel=(144, 1, 3, 3), padding=1,
                                                    bias=True, activation="relu6")),
    ("mbv2 dw3x3 960 @7", "depthwise_conv2d", dict(data=(1, 960, 7, 7), kernel=(960, 1, 3, 3), padding=1,
                                                   bias=True, activation="relu6")),
    ("winograd2 3x3 64->64 @56", "winograd2", dict(data=(1, 64, 56, 56), kernel=(64, 64, 3, 3), padding=1,
                                                   bias=True, activation="relu")),
    ("winograd2 3x3 128->128 @28", "winograd2", dict(data=(1, 128, 28, 28), kernel=(128, 128, 3, 3), padding=1,
                                                     bias=True, activation="relu")),
    ("dense 512->1000 (resnet18 fc)", "dense", dict(data=(1, 512), weight=(1000, 512), bias=True)),
    ("dense 1280->1000 (mbv2 fc)", "dense", dict(data=(1, 1280), weight=(1000, 1280), bias=True)),
    ("matmul vit QK^T 197x64x197 x3", "matmul", dict(a=(3, 197, 64), b=(3, 197, 64), trans_b=True, alpha=0.125)),
    ("matmul vit PV 197x197x64 x3", "matmul", dict(a=(3, 197, 197), b=(3, 197, 64))),
]
QUICK = {"resnet18 3x3 64->64 @56", "mbv2 dw3x3 144 @56", "winograd2 3x3 64->64 @56", "dense 512->1000 (resnet18 fc)",
         "matmul vit QK^T 197x64x197 x3"}
VARIANTS = [("float32 storage", "float32", "float32"), ("float", "float16", "float32"),
            ("half_acc_float", "float16", "half"), ("half", "float16", "half_acc")]
# (column, storage dtype, the compute knob's value): the names -- float, half multiplies with float
# accumulation, half throughout -- for the knob's float32, half and half_acc


def variant_rows(dev, label, name, fields, repeats, rounds):
    t = get_template(name)
    prepared, rows = [], []
    for column, dtype, compute in VARIANTS:
        wl = t.workload(**fields, dtype=dtype)
        base = t.fallback_with(wl, dev)
        cfg = dataclasses.replace(base, compute=compute)
        row = dict(layer=label, template=name, variant=column, dtype=dtype, compute=compute,
                   reduction=t.reduction(wl), gflop=wl.flops / 1e9, median_ms=None, gflops=None,
                   max_rel_error=None, tolerance=t.tolerance(wl, cfg), note="")
        bad = t.space(wl, dev).violations(t.config_values(wl, cfg))
        if bad:
            row["note"] = "outside the space: " + ", ".join(getattr(c, "name", str(c)).split(":")[0] for c in bad)
            rows.append(row)
            continue
        exe = build(t.build(wl, cfg), dev)
        inputs = t.random_inputs(wl, np.random.default_rng(0))
        err = t.check(wl, exe(**inputs), inputs)
        row["max_rel_error"] = err
        if not err <= row["tolerance"]:
            row["note"] = f"WRONG: error {err:.3g} > tolerance {row['tolerance']:.3g}"
        prepared.append((row, exe, exe.upload_inputs(**inputs)))
        rows.append(row)
    samples = {id(r): [] for r, _, _ in prepared}
    for k in range(rounds):  # alternating rounds: a slow spell of the host hits every variant alike
        for row, exe, arrays in (prepared if k % 2 == 0 else prepared[::-1]):
            samples[id(row)].append(statistics.median(exe.time(arrays, warmup=2, repeats=repeats)))
    for row, _, _ in prepared:
        row["median_ms"] = statistics.median(samples[id(row)]) * 1e3
        row["gflops"] = row["gflop"] / (row["median_ms"] / 1e3)
    return rows


def markdown(rows, info, args) -> str:
    by_layer: dict = {}
    for r in rows:
        by_layer.setdefault((r["layer"], r["template"]), {})[r["variant"]] = r
    cols = [v[0] for v in VARIANTS]
    out = [f"# Half arithmetic vs float arithmetic: {info.name} ({info.fingerprint})", "",
           f"Device: {info.name}, {info.platform} (driver {info.driver_version}), cl_khr_fp16: {info.fp16}. "
           f"Each cell: median ms of {args.rounds} alternating rounds of {args.repeats} profiled runs; the "
           f"template's fallback config with only `compute` changed. `float`, `half_acc_float` and `half` are "
           f"float16 storage with the `compute` knob at `float32`, `half` (half products, float sums) and "
           f"`half_acc` (half sums too); `float32 storage` is the float32 model's kernel. Error: max relative "
           f"error against NumPy's float64 (its tolerance in brackets). Written by `bench/half_compute.py` "
           f"on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", "",
           "| layer | template | terms | " + " | ".join(f"{c} ms" for c in cols)
           + " | half_acc_float / float | half / float | errors: " + " / ".join(cols[1:]) + " |",
           "|" + " --- |" * 3 + " ---: |" * (len(cols) + 2) + " --- |"]
    for (layer, tmpl), v in by_layer.items():
        def ms(c):
            r = v.get(c)
            if r is None or r["median_ms"] is None:
                return "-" if r is None else r["note"]
            return f"{r['median_ms']:.3f}"

        def ratio(c):
            a, b = v.get(c), v.get("float")
            if not a or not b or a["median_ms"] is None or b["median_ms"] is None:
                return "-"
            return f"{a['median_ms'] / b['median_ms']:.2f}x"
        errs = " / ".join("-" if v.get(c) is None or v[c]["max_rel_error"] is None else
                          f"{v[c]['max_rel_error']:.1e} ({v[c]['tolerance']:.1e})" for c in cols[1:])
        terms = next(iter(v.values()))["reduction"]
        out.append(f"| {layer} | {tmpl} | {terms} | " + " | ".join(ms(c) for c in cols)
                   + f" | {ratio('half_acc_float')} | {ratio('half')} | {errs} |")
    ratios = {c: [v[c]["median_ms"] / v["float"]["median_ms"] for v in by_layer.values()
                  if v.get(c) and v.get("float") and v[c]["median_ms"] and v["float"]["median_ms"]]
              for c in ("half_acc_float", "half", "float32 storage")}
    out += ["", "Geometric mean of the time against float arithmetic on float16 storage: " + ", ".join(
        f"{c} {float(np.exp(np.mean(np.log(r)))):.2f}x over {len(r)} layers" for c, r in ratios.items() if r) + "."]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="intel", help="device spec (default: intel, Intel's CPU runtime)")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="one layer per template")
    p.add_argument("--out", default="bench/results/half")
    args = p.parse_args(argv)
    dev = open_device(args.device)
    if not dev.info.fp16:
        print(f"note: {dev.info.name} has no cl_khr_fp16: the half variants are rows outside the space")
    rows = []
    for label, name, fields in LAYERS:
        if args.quick and label not in QUICK:
            continue
        for r in variant_rows(dev, label, name, fields, args.repeats, args.rounds):
            rows.append(r)
            shown = f"{r['median_ms']:.3f} ms" if r["median_ms"] is not None else r["note"]
            err = f"err {r['max_rel_error']:.1e}" if r["max_rel_error"] is not None else ""
            print(f"{label:32s} {r['variant']:16s} {shown:>12s} {err} {r['note'] if r['median_ms'] else ''}",
                  flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"half_compute_{dev.info.fingerprint}"
    with open(f"{stem}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    Path(f"{stem}.md").write_text(markdown(rows, dev.info, args))
    print(f"wrote {stem}.csv and {stem}.md")
    return 0 if not any(r["note"].startswith("WRONG") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
