"""A convolution applying a LayerNorm as read (in_layer_norm) under split_k 1, 4 and 16 on the CPU device: kernel
time from profiling events, median of 5 (run from the repository root; ln_split_cpu.txt holds one run's output)."""
import dataclasses
import warnings

import numpy as np

from tuner.runtime.opencl.device import open_device
from tuner.runtime.opencl.launch import build
from tuner.templates import get_template

warnings.simplefilter("ignore")
dev = open_device("cpu")
t = get_template("conv2d")
wl = t.workload(data=(1, 320, 14, 14), kernel=(512, 320, 3, 3), stride=(2, 2), padding=(1, 1, 1, 1), bias=True,
                in_layer_norm=1e-6, dtype="float32")
base = t.fallback(wl, dev.info)
inputs = t.random_inputs(wl, np.random.default_rng(0))
for sk in (1, 4, 16):
    cfg = dataclasses.replace(base, split_k=sk, tile_ow=1, tile_oc=1, wg_w=7, wg_h=1, input_scope="buffer",
                              weight_scope="buffer", output_scope="buffer")
    exe = build(t.build(wl, cfg), dev)
    err = t.check(wl, exe(**inputs), inputs)
    ts = exe.time(exe.upload_inputs(**inputs), repeats=5)
    print(sk, f"err {err:.1e}", f"{np.median(ts) * 1e3:.2f} ms")
