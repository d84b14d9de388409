"""ConvTranspose as phases against zero insertion (issue 38), with the same tuning budget.

Each layer (a real network's transposed convolution, batch 1) is one ONNX model, compiled two ways:

- ``phases`` (the compiler's default, ``graph/passes_conv_transpose.py``): one stacked stride-1 conv2d of
  ceil(k/s)^2 taps and a ``depth_to_space`` that interleaves and crops;
- ``zeros`` (the lowering before it, forced here): ``upsample_zeros`` then a stride-1 conv2d of k^2 taps;
- ``phases_d2s``: ``phases`` with the interleave run as its own ``depth_to_space`` kernel, as before the
  convolution wrote it itself (``plan/views.py``; forced here, with the ``phases`` log: the same tasks and configs).

``phases`` and ``zeros`` are tuned with the same number of measurements (``--trials``, each into its own log; the
fallback config is measured first), then compiled with that log and profiled: the layer's time is the sum of its
kernels' median times (every kernel but the model-boundary relayouts), over ``--repeats`` runs, the variants
alternating ``--rounds`` times. Also the fallback configs' time (no log). Writes
``conv_transpose_<device>[_small]<suffix>.csv`` and ``.md`` under ``--out``::

    python bench/conv_transpose.py --device pocl --trials 24 --out bench/results/conv_transpose
    python bench/conv_transpose.py --device intel --small --trials 12 --repeats 10 --suffix _fused

``--launches`` instead counts the kernel launches of the tasks zoo's models with a ConvTranspose or a PixelShuffle
(code generation only, no device run), with the interleaves written by their convolutions and as kernels.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

# name, (cin, cout, kernel, stride, pad, output_padding, in_hw), where it comes from
LAYERS = {
    "pose_deconv1": ((512, 256, 4, 2, 1, 0, (8, 6)), "SimpleBaseline's first head deconv (ResNet backbone, /32)"),
    "pose_deconv3": ((256, 256, 4, 2, 1, 0, (32, 24)), "SimpleBaseline's third head deconv"),
    "unet_up": ((128, 64, 2, 2, 0, 0, (28, 28)), "U-Net's 2x2 stride-2 up-convolution"),
    "fsrcnn_x2": ((56, 1, 9, 2, 4, 1, (64, 64)), "FSRCNN's 9x9 stride-2 deconvolution (x2 upscaling)"),
    "dcgan": ((256, 128, 4, 2, 1, 0, (16, 16)), "DCGAN generator's 4x4 stride-2 layer"),
}
SMALL = {"pose_deconv1": ((128, 64, 4, 2, 1, 0, (8, 6)), ""), "unet_up": ((32, 16, 2, 2, 0, 0, (14, 14)), ""),
         "fsrcnn_x2": ((16, 1, 9, 2, 4, 1, (16, 16)), ""), "dcgan": ((64, 32, 4, 2, 1, 0, (8, 8)), "")}


def layer_model(cin, cout, k, s, p, op, hw, seed=0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((cin, cout, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)
    b = rng.normal(0, 0.1, cout).astype(np.float32)
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, cin, *hw])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node("ConvTranspose", ["input", "w", "b"], ["ct"], name="ct", kernel_shape=[k, k],
                            strides=[s, s], pads=[p, p, p, p], output_padding=[op, op])
    relu = helper.make_node("Relu", ["ct"], ["y"], name="relu")
    g = helper.make_graph([node, relu], "ct", [x], [y], [numpy_helper.from_array(w, "w"),
                                                          numpy_helper.from_array(b, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@contextlib.contextmanager
def lowering(kind: str):
    """``phases`` as the compiler does it, or ``zeros``: the phase rewrite switched off."""
    import tuner.graph.passes_conv_transpose as P
    saved = P._phases
    if kind == "zeros":
        P._phases = lambda *a, **k: False
    try:
        yield
    finally:
        P._phases = saved


@contextlib.contextmanager
def interleave(kind: str):
    """``phases_d2s``: no convolution writes a ``depth_to_space`` (it runs as its own kernel); else as compiled."""
    import tuner.plan.views as V
    saved = V.SHUFFLE_WRITERS
    if kind == "phases_d2s":
        V.SHUFFLE_WRITERS = ()
    try:
        yield
    finally:
        V.SHUFFLE_WRITERS = saved


def layer_time(mod, repeats: int) -> tuple:
    """(the layer's kernel time in seconds: every node but the boundary relayouts, kernels, their ops)."""
    prof = mod.profile(repeats)
    rows = [r for r in prof["rows"] if not r["node"].endswith((".pack", ".unpack"))]
    return sum(r["median_s"] for r in rows), len(rows), "+".join(r["op"] for r in rows)


def write_tables(rows, names, out, label, dev_name, args) -> str:
    """The CSV and the markdown table of the layers measured so far (written after each layer)."""
    with open(out / f"conv_transpose_{label}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [f"# ConvTranspose: phases vs zero insertion on {dev_name}", "",
             f"Median of {args.rounds} alternating profiles x {args.repeats} runs of the layer's kernels (bias + ReLU "
             f"fused); each lowering tuned with {args.trials} measurements (`bench/conv_transpose.py`); `phases+d2s`: "
             f"the phases' interleave as its own kernel, with the phases' log.", "",
             "| layer | shape | zeros tuned (ms) | phases+d2s tuned (ms) | phases tuned (ms) | speedup tuned | "
             "d2s written (tuned) | zeros fallback | phases fallback | speedup fallback | kernels (phases) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    by = {(r["layer"], r["lowering"], r["configs"]): r for r in rows}
    for name in names:
        z, p, d = by[name, "zeros", "tuned"], by[name, "phases", "tuned"], by[name, "phases_d2s", "tuned"]
        zf, pf = by[name, "zeros", "fallback"], by[name, "phases", "fallback"]
        lines.append(f"| {name} | {z['shape']} | {z['ms']:.4f} | {d['ms']:.4f} | {p['ms']:.4f} | "
                     f"**{z['ms'] / p['ms']:.2f}** | {d['ms'] / p['ms']:.2f} | {zf['ms']:.4f} | {pf['ms']:.4f} | "
                     f"{zf['ms'] / pf['ms']:.2f} | {p['kernels']} |")
    geo = lambda xs: float(np.exp(np.mean(np.log(xs))))  # noqa: E731
    ratios = [by[n, "zeros", "tuned"]["ms"] / by[n, "phases", "tuned"]["ms"] for n in names]
    fused = [by[n, "phases_d2s", "tuned"]["ms"] / by[n, "phases", "tuned"]["ms"] for n in names]
    lines += ["", f"Geometric mean speedup (tuned) over zero insertion: {geo(ratios):.2f}x; of writing the interleave "
              f"over its kernel: {geo(fused):.2f}x; max relative error against zero insertion "
              f"{max(r['max_rel_err'] for r in rows):.1e}."]
    (out / f"conv_transpose_{label}.md").write_text("\n".join(lines) + "\n")
    return "\n".join(lines)


LAUNCH_MODELS = ("sr_pixel_shuffle", "sr_conv_transpose", "pose", "unet")  # the tasks zoo's with a depth_to_space


def count_launches(dev, args) -> str:
    """A markdown table: kernel launches per inference of the tasks zoo's models with an interleave, at their full
    sizes (``--launch-size`` to change), with the interleaves written by their convolutions and as kernels (the
    artifact's calls; auto scope, no log: fallback configs); with ``--rounds`` > 0 also their kernel time and
    latency (medians of ``--rounds`` alternating profiles x ``--repeats`` runs)."""
    from tuner.compile.compiler import compile_model
    from tuner.zoo import tasks
    timed = args.rounds > 0
    head = "| model | launches, interleave kernels | launches, written | depth_to_space kernels left |"
    rule = "| --- | ---: | ---: | ---: |"
    if timed:
        head += " kernels (ms), d2s / written | latency (ms), d2s / written |"
        rule += " ---: | ---: |"
    lines = [head, rule]
    for name in LAUNCH_MODELS:
        model = tasks.ZOO[name](**({"input_size": args.launch_size} if args.launch_size else {}))
        mods = {}
        for kind in ("phases_d2s", "phases"):
            with interleave(kind), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mods[kind] = compile_model(model, device=dev, scope="auto")
        launches = {k: sum(len(n.calls) for n in m.spec.nodes) for k, m in mods.items()}
        left = [n.op for n in mods["phases"].spec.nodes].count("depth_to_space")
        line = f"| {name} | {launches['phases_d2s']} | {launches['phases']} | {left} |"
        if timed:
            got = {k: ([], []) for k in mods}
            for _ in range(args.rounds):  # alternate, so that drift hits both alike
                for k, m in mods.items():
                    prof = m.profile(args.repeats)
                    got[k][0].append(prof["kernel_total_s"] * 1e3)
                    got[k][1].append(prof["total_s"] * 1e3)
            med = {k: [statistics.median(v) for v in got[k]] for k in mods}
            line += " {:.2f} / {:.2f} | {:.2f} / {:.2f} |".format(med["phases_d2s"][0], med["phases"][0],
                                                                 med["phases_d2s"][1], med["phases"][1])
        lines.append(line)
        print(line, flush=True)
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None)
    ap.add_argument("--trials", type=int, default=24, help="measurements per lowering and layer (default 24)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3, help="profiles per compiled layer, alternating (median)")
    ap.add_argument("--layers", default=None, help="comma-separated names (default: all)")
    ap.add_argument("--small", action="store_true", help="smaller layers, for a CPU device")
    ap.add_argument("--out", default="bench/results/conv_transpose")
    ap.add_argument("--suffix", default="", help="appended to the output files' names (e.g. _fused)")
    ap.add_argument("--launches", action="store_true", help="count the tasks zoo models' launches instead (and time "
                    "them, --rounds 0 not to)")
    ap.add_argument("--launch-size", type=int, default=None, help="--launches: the models' input size (default: "
                    "each model's full size)")
    args = ap.parse_args(argv)

    from tuner.compile.compiler import compile_model
    from tuner.scheduler.model import tune_model
    from tuner.runtime.opencl import open_device

    dev = open_device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.launches:
        text = count_launches(dev, args)
        head = (f"# Launches of the tasks zoo's models with an interleave on {dev.info.name}\n\nAuto scope, no log; "
                f"median of {args.rounds} alternating profiles x {args.repeats} runs (`bench/conv_transpose.py "
                f"--launches`).\n\n")
        (out / f"task_launches_{dev.info.name.replace(' ', '_')}{args.suffix}.md").write_text(head + text + "\n")
        print(text)
        return 0
    table = SMALL if args.small else LAYERS
    names = args.layers.split(",") if args.layers else list(table)
    label = f"{dev.info.name.replace(' ', '_')}{'_small' if args.small else ''}{args.suffix}"
    rows = []
    work = Path(tempfile.mkdtemp(prefix="conv_transpose_"))
    for name in names:
        (cin, cout, k, s, p, op, hw), where = table[name]
        model = layer_model(cin, cout, k, s, p, op, hw)
        feeds = {"input": np.random.default_rng(1).standard_normal((1, cin, *hw)).astype(np.float32)}
        mods = {}
        for kind in ("phases", "zeros"):
            log = work / f"{name}_{kind}.jsonl"
            with lowering(kind), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t0 = time.perf_counter()
                tune_model(model, log=str(log), trials=args.trials, device=dev, scope="auto", compare_scopes=False,
                           progress=False)
                tuned_s = time.perf_counter() - t0
                mods[kind, "tuned"] = compile_model(model, device=dev, scope="auto", log=str(log))
                mods[kind, "fallback"] = compile_model(model, device=dev, scope="auto")
            print(f"{name} {kind}: tuned {args.trials} trials in {tuned_s:.0f} s", flush=True)
        with interleave("phases_d2s"), warnings.catch_warnings():  # the same tasks: the phases' log
            warnings.simplefilter("ignore")
            mods["phases_d2s", "tuned"] = compile_model(model, device=dev, scope="auto",
                                                        log=str(work / f"{name}_phases.jsonl"))
        ref = mods["zeros", "fallback"].run(feeds)[0]
        times = {key: [] for key in mods}
        for _ in range(args.rounds):  # alternate, so that drift hits every variant alike
            for key, mod in mods.items():
                t, launches, ops = layer_time(mod, args.repeats)
                times[key].append(t)
                mods[key].launches, mods[key].ops = launches, ops
        for (kind, configs), mod in mods.items():
            err = float(np.abs(mod.run(feeds)[0] - ref).max() / max(np.abs(ref).max(), 1e-30))
            rows.append({"layer": name, "shape": f"{cin}->{cout} k{k} s{s} p{p} op{op} {hw[0]}x{hw[1]}",
                         "lowering": kind, "configs": configs, "trials": args.trials if configs == "tuned" else 0,
                         "ms": statistics.median(times[kind, configs]) * 1e3, "launches": mod.launches,
                         "kernels": mod.ops, "max_rel_err": err})
        print("  " + "  ".join(f"{r['lowering']}/{r['configs']} {r['ms']:.4f} ms" for r in rows[-len(mods):]),
              flush=True)
        text = write_tables(rows, names[:names.index(name) + 1], out, label, dev.info.name, args)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
