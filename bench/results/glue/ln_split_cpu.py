import sys, time, dataclasses, numpy as np, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, "tests")
from tuner.templates import get_template
from tuner.runtime.opencl.device import open_device
from test_templates import build
dev = open_device("cpu")
t = get_template("conv2d")
wl = t.workload(data=(1, 320, 14, 14), kernel=(512, 320, 3, 3), stride=(2, 2), padding=(1, 1, 1, 1), bias=True,
                in_layer_norm=1e-6, dtype="float32")
base = t.fallback(wl, dev.info)
rng = np.random.default_rng(0)
inputs = t.random_inputs(wl, rng)
for sk in (1, 4, 16):
    cfg = dataclasses.replace(base, split_k=sk, tile_ow=1, tile_oc=1, wg_w=7, wg_h=1, input_scope="buffer",
                              weight_scope="buffer", output_scope="buffer")
    exe = build(t.build(wl, cfg), dev)
    out = exe(**inputs); err = t.check(wl, out, inputs)
    arrays = exe.upload_inputs(**inputs)
    ts = exe.time(arrays, repeats=5)
    print(sk, f"err {err:.1e}", f"{np.median(ts)*1e3:.2f} ms")
