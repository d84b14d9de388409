"""local_input and compute on a few ResNet-18 / MobileNetV2 layers: median of repeats (profiling events)."""
import dataclasses, statistics, sys, json
import numpy as np
from tuner.templates import get_template
from tuner.runtime.opencl import open_device
from tuner.runtime.opencl.launch import build
dev = open_device(sys.argv[1])
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 15
LAYERS = [
    ("resnet18 conv3x3 64->64 56x56", "conv2d", dict(data=(1, 64, 56, 56), kernel=(64, 64, 3, 3), padding=1, bias=True, activation="relu")),
    ("resnet18 conv3x3 128->128 28x28", "conv2d", dict(data=(1, 128, 28, 28), kernel=(128, 128, 3, 3), padding=1, bias=True, activation="relu")),
    ("mbv2 pw 32->96 56x56", "conv2d", dict(data=(1, 32, 56, 56), kernel=(96, 32, 1, 1), bias=True, activation="relu6")),
    ("mbv2 dw3x3 96 s2 112->56", "depthwise_conv2d", dict(data=(1, 96, 112, 112), kernel=(96, 1, 3, 3), stride=2, padding=1, bias=True, activation="relu6")),
    ("mbv2 dw3x3 144 56x56", "depthwise_conv2d", dict(data=(1, 144, 56, 56), kernel=(144, 1, 3, 3), padding=1, bias=True, activation="relu6")),
]
rows = []
for label, name, fields in LAYERS:
    t = get_template(name)
    for dtype in ("float32", "float16"):
        wl = t.workload(**fields, dtype=dtype)
        base = dataclasses.replace(t.fallback(wl, dev.info), input_scope="buffer", weight_scope="buffer", output_scope="buffer")
        # a work-group big enough to share a tile: 8x4 work-items
        base = dataclasses.replace(base, wg_w=8, wg_h=4)
        variants = [("fallback(wg 8x4)", {}), ("local_input", {"local_input": True})]
        if dtype == "float16" and dev.info.fp16:
            variants += [("half", {"compute": "half"}), ("half_acc", {"compute": "half_acc"}),
                         ("local+half", {"local_input": True, "compute": "half"})]
        space = t.space(wl, dev, input_scope="buffer", weight_scope="buffer", output_scope="buffer")
        for vname, knobs in variants:
            cfg = dataclasses.replace(base, **knobs)
            bad = space.violations(t.config_values(wl, cfg))
            if bad:
                print(f"{label:34s} {dtype:8s} {vname:18s} outside the space: {[getattr(c, 'name', c) for c in bad]}", flush=True)
                continue
            exe = build(t.build(wl, cfg), dev)
            inputs = t.random_inputs(wl, np.random.default_rng(0))
            err = t.check(wl, exe(**inputs), inputs)
            arrays = exe.upload_inputs(**inputs)
            costs = exe.time(arrays, warmup=2, repeats=repeats)
            med = statistics.median(costs)
            print(f"{label:34s} {dtype:8s} {vname:18s} {med*1e3:8.3f} ms  {wl.flops/med/1e9:7.2f} GFLOP/s  err {err:.1e}", flush=True)
            rows.append(dict(layer=label, dtype=dtype, variant=vname, median_ms=med*1e3, err=err))
json.dump(rows, open(f"/tmp/bench_lh_{sys.argv[1]}.json", "w"), indent=1)
